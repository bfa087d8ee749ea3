/* frame_stub.c: see frame_stub.h. */
#include "util/frame_stub.h"

PyObject *
rt_reraise(PyObject *Py_UNUSED(module), PyObject *exc)
{
    if (!PyExceptionInstance_Check(exc)) {
        PyErr_SetString(PyExc_TypeError, "_reraise(exc): exc is not an exception");
        return NULL;
    }
    rt_raise_as_is(Py_NewRef(exc));
    return NULL;
}

PyObject *
rt_frame_add(PyObject *stub)
{
    if (stub == NULL) {
        return NULL;
    }
    PyObject *exc = rt_take_exception();
    if (exc == NULL) {
        return NULL;
    }
    PyObject *r = PyObject_CallOneArg(stub, exc);
    if (r != NULL) { /* a stub returns only by raising: not one of ours */
        Py_DECREF(r);
        rt_raise_as_is(exc);
        return NULL;
    }
    Py_DECREF(exc);
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
