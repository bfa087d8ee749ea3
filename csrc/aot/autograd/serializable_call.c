/* serializable_call.c: SerializableCall, `SerializableCompiledFunction.__call__`
 * in C.
 *
 * AOTAutograd wraps what it compiles in a SerializableCompiledFunction
 * (runtime_wrappers.py) whose __call__ is the pass-through
 *
 *     def __call__(self, *args, **kwargs):
 *         return self.compiled_fn(*args, **kwargs)
 *
 * run on every call of a compiled function. SerializableCall is that method
 * (bound like a function through rt_fn_descr_get): the same attribute read on
 * the instance and the same call, without the Python frame. torch_aot_rt's
 * subclass of SerializableCompiledFunction has it as __call__
 * (torch_aot_rt/_serializable_call.py).
 * ====================================================================== */
#include "fn_object.h"

typedef struct {
    RT_FN_HEAD
} SerializableCall;

static PyObject *
SerializableCall_vectorcall(PyObject *op, PyObject *const *argv, size_t nargsf,
                            PyObject *kwnames)
{
    SerializableCall *self = (SerializableCall *)op;
    Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
    if (nargs < 1) {
        PyErr_SetString(PyExc_TypeError,
                        "__call__() missing 1 required positional argument: 'self'");
        return NULL;
    }
    PyObject *fn = PyObject_GetAttr(argv[0], self->st->aot.obj.str_compiled_fn);
    if (fn == NULL) {
        return NULL;
    }
    /* self's slot is the caller's: no PY_VECTORCALL_ARGUMENTS_OFFSET */
    PyObject *result = PyObject_Vectorcall(fn, argv + 1, nargs - 1, kwnames);
    Py_DECREF(fn);
    return result;
}

static PyObject *
SerializableCall_new(PyTypeObject *type, PyObject *args, PyObject *kwargs)
{
    if (PyTuple_GET_SIZE(args) != 0 || (kwargs != NULL && PyDict_GET_SIZE(kwargs) != 0)) {
        PyErr_SetString(PyExc_TypeError, "SerializableCall() takes no arguments");
        return NULL;
    }
    return rt_fn_alloc(type, SerializableCall_vectorcall);
}

static int
SerializableCall_traverse(SerializableCall *self, visitproc visit, void *arg)
{
    Py_VISIT(Py_TYPE(self));
    Py_VISIT(self->module);
    Py_VISIT(self->dict);
    return 0;
}

static int
SerializableCall_clear(SerializableCall *self)
{
    Py_CLEAR(self->dict);
    return 0;
}

DEFINE_DEALLOC(SerializableCall, (void)0)
FN_MEMBERS(SerializableCall)
FN_SPEC(SerializableCall,
        "SerializableCall(): SerializableCompiledFunction.__call__ "
        "(self.compiled_fn(*args, **kwargs)) in C.")
