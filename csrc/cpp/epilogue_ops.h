// epilogue_ops.h: what torch_cpp.cpp puts in the rt_cpp_api table from
// epilogue_ops.cpp (the runtime wrapper's epilogue). See torch_cpp_api.h.
#pragma once

#include <Python.h>

int rt_epi_copy_(PyObject* orig, PyObject* src, int detach) noexcept;
int rt_epi_as_strided_like(PyObject* orig, PyObject* like) noexcept;
int rt_epi_set_(PyObject* orig, PyObject* src) noexcept;
PyObject* rt_epi_view_sequence(PyObject* sequence) noexcept;
int rt_epi_view_replay(PyObject* capsule, PyObject* base, PyObject* target, int requires_grad,
                       PyObject** out) noexcept;
