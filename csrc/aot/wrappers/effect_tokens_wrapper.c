/* effect_tokens_wrapper.c: EffectTokensWrapper, the function
 * EffectTokensWrapper.post_compile returns (runtime_wrappers.py), in C.
 *
 * For a graph with effect tokens (len(runtime_metadata.tokens) == n > 0),
 * upstream generates
 *
 *     def _effect_tokens_wrapper(args):
 *         new_args = [None, ..., None, *args]    # n Nones: the tokens
 *         args.clear()
 *         outs = _compiled_fn_(new_args)
 *         if outs is None:
 *             return None
 *         return outs[n:]                        # the output tokens dropped
 *
 * The C call does that for one exact list argument; any other call runs the
 * generated function itself. `outs[n:]` is a list slice for a list and
 * outs.__getitem__(slice(n, None)) otherwise, as in Python.
 * ====================================================================== */
#include "fn_object.h"
#include "aot/wrappers/wrappers.h"

typedef struct {
    RT_FN_HEAD
    PyObject *upstream;    /* _effect_tokens_wrapper */
    PyObject *compiled_fn; /* its _compiled_fn_ */
    PyObject *tail;        /* slice(n, None) */
    Py_ssize_t n;
} EffectTokensWrapper;

static PyObject *
EffectTokensWrapper_vectorcall(PyObject *op, PyObject *const *argv, size_t nargsf,
                               PyObject *kwnames)
{
    EffectTokensWrapper *self = (EffectTokensWrapper *)op;
    if (!rt_plain_list_call(argv, nargsf, kwnames)) {
        return PyObject_Vectorcall(self->upstream, argv, nargsf, kwnames);
    }
    PyObject *args = argv[0];
    Py_ssize_t m = PyList_GET_SIZE(args);
    PyObject *new_args = PyList_New(self->n + m);
    if (new_args == NULL) {
        return NULL;
    }
    /* the allocation may have run a collection, and finalizers with it */
    if (PyList_GET_SIZE(args) != m) {
        Py_DECREF(new_args);
        return PyObject_Vectorcall(self->upstream, argv, nargsf, kwnames);
    }
    for (Py_ssize_t k = 0; k < self->n; k++) {
        PyList_SET_ITEM(new_args, k, Py_NewRef(Py_None));
    }
    for (Py_ssize_t k = 0; k < m; k++) {
        PyList_SET_ITEM(new_args, self->n + k, Py_NewRef(PyList_GET_ITEM(args, k)));
    }
    if (PyList_SetSlice(args, 0, m, NULL) < 0) { /* args.clear() */
        Py_DECREF(new_args);
        return NULL;
    }
    PyObject *outs = PyObject_Vectorcall(self->compiled_fn, &new_args, 1, NULL);
    Py_DECREF(new_args);
    if (outs == NULL || outs == Py_None) {
        return outs;
    }
    PyObject *result = PyList_CheckExact(outs)
                           ? PyList_GetSlice(outs, self->n, PY_SSIZE_T_MAX)
                           : PyObject_GetItem(outs, self->tail);
    Py_DECREF(outs);
    return result;
}

static PyObject *
EffectTokensWrapper_new(PyTypeObject *type, PyObject *args, PyObject *kwargs)
{
    static char *keywords[] = {"upstream", "compiled_fn", "num_tokens", NULL};
    PyObject *upstream, *compiled_fn;
    Py_ssize_t n;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OOn:EffectTokensWrapper", keywords,
                                     &upstream, &compiled_fn, &n)) {
        return NULL;
    }
    if (!PyCallable_Check(upstream) || !PyCallable_Check(compiled_fn)) {
        PyErr_SetString(PyExc_TypeError,
                        "EffectTokensWrapper: upstream and compiled_fn must be callable");
        return NULL;
    }
    if (n <= 0) {
        PyErr_SetString(PyExc_ValueError, "EffectTokensWrapper: num_tokens must be positive");
        return NULL;
    }
    EffectTokensWrapper *self =
        (EffectTokensWrapper *)rt_fn_alloc(type, EffectTokensWrapper_vectorcall);
    if (self == NULL) {
        return NULL;
    }
    self->upstream = Py_NewRef(upstream);
    self->compiled_fn = Py_NewRef(compiled_fn);
    self->n = n;
    PyObject *start = PyLong_FromSsize_t(n);
    if (start == NULL || (self->tail = PySlice_New(start, Py_None, Py_None)) == NULL) {
        Py_XDECREF(start);
        Py_DECREF(self);
        return NULL;
    }
    Py_DECREF(start);
    return (PyObject *)self;
}

static int
EffectTokensWrapper_traverse(EffectTokensWrapper *self, visitproc visit, void *arg)
{
    Py_VISIT(Py_TYPE(self));
    Py_VISIT(self->module);
    Py_VISIT(self->dict);
    Py_VISIT(self->upstream);
    Py_VISIT(self->compiled_fn);
    return 0;
}

static int
EffectTokensWrapper_clear(EffectTokensWrapper *self)
{
    Py_CLEAR(self->dict);
    Py_CLEAR(self->upstream);
    Py_CLEAR(self->compiled_fn);
    Py_CLEAR(self->tail);
    return 0;
}

DEFINE_DEALLOC(EffectTokensWrapper, (void)0)
FN_MEMBERS(EffectTokensWrapper)
FN_SPEC(EffectTokensWrapper,
        "EffectTokensWrapper(upstream, compiled_fn, num_tokens): EffectTokensWrapper."
        "post_compile's _effect_tokens_wrapper (None tokens in, output tokens dropped) in C.")
