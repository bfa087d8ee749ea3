/* frame_stub.c: see frame_stub.h. */
#include "util/frame_stub.h"

/* The exception a stub is about to raise again, per thread (a stub's frame
 * may let another thread run before it calls _reraise). */
static _Thread_local PyObject *kept;

PyObject *
rt_reraise(PyObject *Py_UNUSED(module), PyObject *Py_UNUSED(args), PyObject *Py_UNUSED(kwargs))
{
    PyObject *exc = kept;
    kept = NULL;
    if (exc == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "_reraise: no exception kept for a frame stub");
        return NULL;
    }
    rt_raise_as_is(exc);
    return NULL;
}

PyObject *
rt_frame_add(PyObject *stub, const rt_frame_call *call)
{
    if (stub == NULL) {
        return NULL;
    }
    PyObject *exc = rt_take_exception();
    if (exc == NULL) {
        return NULL;
    }
    PyObject *frame_fn = stub;
    if (call->closure != NULL) {
        frame_fn = PyFunction_New(PyFunction_GET_CODE(stub), PyFunction_GET_GLOBALS(stub));
        if (frame_fn == NULL || PyFunction_SetClosure(frame_fn, call->closure) < 0) {
            Py_XDECREF(frame_fn);
            PyErr_Clear(); /* no entry: the exception goes on as it was */
            rt_raise_as_is(exc);
            return NULL;
        }
    }
    else {
        Py_INCREF(frame_fn);
    }
    Py_XSETREF(kept, exc);
    PyObject *r = PyObject_Vectorcall(frame_fn, call->argv, call->nargsf, call->kwnames);
    Py_DECREF(frame_fn);
    if (r != NULL) { /* a stub returns only by raising: not one of ours */
        Py_DECREF(r);
        PyErr_SetString(PyExc_SystemError, "torch_aot_rt: a frame stub returned");
    }
    return NULL;
}

PyObject *
rt_raised_exception(void)
{
    PyObject *exc = rt_take_exception();
    if (exc == NULL) {
        return NULL;
    }
    rt_raise_as_is(exc); /* the same object, raised again */
    return exc;          /* borrowed: the thread state holds it */
}
