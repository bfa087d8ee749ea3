// compiled_node.h: what torch_cpp.cpp puts in the rt_cpp_api table from
// compiled_node.cpp (CompiledFunction's autograd node). See torch_cpp_api.h.
#pragma once

#include <Python.h>
#include <torch/headeronly/version.h>

// The node's grad_fn has _input_grad_buffers / input_grad_buffers (a ctx
// attribute since torch 2.15, over torch::autograd::
// get_current_input_grad_buffers, declared in graph_task.h from 2.15 on).
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 15)
#define RT_HAS_INPUT_GRAD_BUFFERS 1
#else
#define RT_HAS_INPUT_GRAD_BUFFERS 0
#endif

PyObject* rt_node_apply(PyObject* cls, PyObject* args, int* declined) noexcept;
int rt_node_check(PyObject* obj) noexcept;
int rt_node_maybe_clear_saved(PyObject* ctx) noexcept;
PyObject* rt_node_get(PyObject* node, int field) noexcept;
int rt_node_set(PyObject* node, int field, PyObject* value) noexcept;
// Readies and registers the node's Python type (once per process).
int rt_node_type_init(void) noexcept;
