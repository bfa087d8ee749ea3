/* fakified_out_wrapper.c: FakifiedOutWrapperCall, the function
 * FakifiedOutWrapper.post_compile returns (runtime_wrappers.py), in C.
 *
 * Under TracingContext.fakify_first_call, upstream returns the closure
 *
 *     @wraps(compiled_fn)
 *     def wrapper(runtime_args):
 *         nonlocal fakified_out
 *         if fakified_out is not None:
 *             out = fakified_out
 *             fakified_out = None
 *             return out
 *         return compiled_fn(runtime_args)
 *
 * The C object reads and writes the closure's own cells, so that it and the
 * closure (which runs any call that is not one positional argument) share
 * the first-call state.
 * ====================================================================== */
#include "fn_object.h"
#include "aot/wrappers/wrappers.h"

typedef struct {
    RT_FN_HEAD
    PyObject *upstream;    /* wrapper */
    PyObject *compiled_fn; /* its cells */
    PyObject *fakified_out;
} FakifiedOutWrapper;

static PyObject *
FakifiedOutWrapper_vectorcall(PyObject *op, PyObject *const *argv, size_t nargsf,
                              PyObject *kwnames)
{
    FakifiedOutWrapper *self = (FakifiedOutWrapper *)op;
    PyObject *out = PyCell_GET(self->fakified_out);
    PyObject *fn = PyCell_GET(self->compiled_fn);
    if (PyVectorcall_NARGS(nargsf) != 1 || (kwnames != NULL && PyTuple_GET_SIZE(kwnames)) ||
        out == NULL || fn == NULL) {
        return PyObject_Vectorcall(self->upstream, argv, nargsf, kwnames);
    }
    if (out != Py_None) {
        Py_INCREF(out);
        if (PyCell_Set(self->fakified_out, Py_None) < 0) {
            Py_DECREF(out);
            return NULL;
        }
        return out;
    }
    Py_INCREF(fn);
    PyObject *result = PyObject_Vectorcall(fn, argv, 1, NULL);
    Py_DECREF(fn);
    return result;
}

static PyObject *
FakifiedOutWrapper_new(PyTypeObject *type, PyObject *args, PyObject *kwargs)
{
    static char *keywords[] = {"upstream", "compiled_fn_cell", "fakified_out_cell", NULL};
    PyObject *upstream, *compiled_fn, *fakified_out;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OO!O!:FakifiedOutWrapper", keywords,
                                     &upstream, &PyCell_Type, &compiled_fn, &PyCell_Type,
                                     &fakified_out)) {
        return NULL;
    }
    if (!PyCallable_Check(upstream)) {
        PyErr_SetString(PyExc_TypeError, "FakifiedOutWrapper: upstream must be callable");
        return NULL;
    }
    FakifiedOutWrapper *self =
        (FakifiedOutWrapper *)rt_fn_alloc(type, FakifiedOutWrapper_vectorcall);
    if (self == NULL) {
        return NULL;
    }
    self->upstream = Py_NewRef(upstream);
    self->compiled_fn = Py_NewRef(compiled_fn);
    self->fakified_out = Py_NewRef(fakified_out);
    return (PyObject *)self;
}

static int
FakifiedOutWrapper_traverse(FakifiedOutWrapper *self, visitproc visit, void *arg)
{
    Py_VISIT(Py_TYPE(self));
    Py_VISIT(self->module);
    Py_VISIT(self->dict);
    Py_VISIT(self->upstream);
    Py_VISIT(self->compiled_fn);
    Py_VISIT(self->fakified_out);
    return 0;
}

static int
FakifiedOutWrapper_clear(FakifiedOutWrapper *self)
{
    Py_CLEAR(self->dict);
    Py_CLEAR(self->upstream);
    Py_CLEAR(self->compiled_fn);
    Py_CLEAR(self->fakified_out);
    return 0;
}

DEFINE_DEALLOC(FakifiedOutWrapper, (void)0)
FN_MEMBERS(FakifiedOutWrapper)
FN_SPEC(FakifiedOutWrapper,
        "FakifiedOutWrapper(upstream, compiled_fn_cell, fakified_out_cell): "
        "FakifiedOutWrapper.post_compile's wrapper (the fakified outputs once, then "
        "compiled_fn) in C.")
