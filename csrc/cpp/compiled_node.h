// compiled_node.h: what torch_cpp.cpp puts in the rt_cpp_api table from
// compiled_node.cpp (CompiledFunction's autograd node). See torch_cpp_api.h.
#pragma once

#include <Python.h>

// RT_HAS_INPUT_GRAD_BUFFERS: the node's grad_fn has _input_grad_buffers /
// input_grad_buffers (torch 2.15 on)
#include "torch_headers.h"

PyObject* rt_node_apply(PyObject* cls, PyObject* args, int* declined) noexcept;
int rt_node_check(PyObject* obj) noexcept;
int rt_node_maybe_clear_saved(PyObject* ctx) noexcept;
PyObject* rt_node_get(PyObject* node, int field) noexcept;
int rt_node_set(PyObject* node, int field, PyObject* value) noexcept;
// Readies and registers the node's Python type (once per process).
int rt_node_type_init(void) noexcept;
