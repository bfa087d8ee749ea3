/* frame_stub.h: traceback entries for the upstream Python functions C
 * stands in for (as Cython adds them for its C functions).
 *
 * A frame stub is a Python function made by the shim (torch_aot_rt/
 * _frames.py) with the code of upstream's function's name, file, first
 * line, parameters and free variables, whose one call sits at the source
 * position (line, columns) of the upstream instruction an exception leaves
 * that function from, and calls _C._reraise: run on the way out with the
 * exception, it raises it again from that position, so the traceback gains
 * the entry upstream's frame gives it. The frame is made for the call, with
 * the arguments and the closure of the call it stands for, so that its
 * locals are that call's (upstream's frame has more: the ones its body
 * assigns). Only on the way out with an exception: a call that returns runs
 * no stub. */
#ifndef TORCH_AOT_RT_UTIL_FRAME_STUB_H
#define TORCH_AOT_RT_UTIL_FRAME_STUB_H

#include "util/py_compat.h"

/* The constant a stub's source holds where its callable goes
 * (_C.FRAME_PLACEHOLDER; torch_aot_rt/_frames.py) */
#define RT_FRAME_PLACEHOLDER "__torch_aot_rt_frame_constant__"

/* _C._reraise(*args, **kwargs): raises the exception rt_frame_add keeps
 * for this thread, as it is (its traceback goes on, no context is set):
 * what a frame stub calls. */
PyObject *rt_reraise(PyObject *module, PyObject *args, PyObject *kwargs);

/* The call a stub stands for: its arguments (vectorcall), and the closure
 * its frame gets (NULL: the stub's own). */
typedef struct {
    PyObject *const *argv;
    size_t nargsf;
    PyObject *kwnames;
    PyObject *closure;
} rt_frame_call;

/* With an exception raised: adds stub's entry to its traceback, a frame of
 * stub's code over the call's closure run with the call's arguments (stub
 * NULL: nothing). Returns NULL, the exception still raised. */
PyObject *rt_frame_add(PyObject *stub, const rt_frame_call *call);

/* The raised exception, borrowed, or NULL with none (it stays raised). */
PyObject *rt_raised_exception(void);

#endif
