/* frame_stub.h: traceback entries for the upstream Python functions C
 * stands in for (as Cython adds them for its C functions).
 *
 * A frame stub is a Python function made by the shim (torch_aot_rt/
 * _frames.py) whose one call sits at the source position (file, line,
 * columns) of the upstream instruction an exception leaves that function
 * from, and calls _C._reraise: called with the exception, it raises it
 * again from that position, so the traceback gains the entry upstream's
 * frame gives it. Only on the way out with an exception: a call that
 * returns runs no stub. */
#ifndef TORCH_AOT_RT_UTIL_FRAME_STUB_H
#define TORCH_AOT_RT_UTIL_FRAME_STUB_H

#include "util/py_compat.h"

/* The constant a stub's source holds where its callable goes
 * (_C.FRAME_PLACEHOLDER; torch_aot_rt/_frames.py) */
#define RT_FRAME_PLACEHOLDER "__torch_aot_rt_frame_constant__"

/* _C._reraise(exc): raises exc as it is (its traceback goes on, no context
 * is set): the constant a frame stub calls. */
PyObject *rt_reraise(PyObject *module, PyObject *exc);

/* With an exception raised: adds stub's entry to its traceback (stub NULL:
 * nothing). Returns NULL, the exception still raised. */
PyObject *rt_frame_add(PyObject *stub);

/* The raised exception, borrowed, or NULL with none (it stays raised). */
PyObject *rt_raised_exception(void);

#endif
