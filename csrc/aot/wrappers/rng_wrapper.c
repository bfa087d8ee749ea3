/* rng_wrapper.c: RngWrapper, the function FunctionalizedRngRuntimeWrapper
 * .post_compile returns (runtime_wrappers.py), in C.
 *
 * With functionalized RNG ops (config.functionalize_rng_ops: the graph takes
 * the CUDA generator's seed and offset as two extra inputs and returns the
 * new offset after its forward outputs), upstream generates
 *
 *     def _functionalized_rng_wrapper(runtime_args):
 *         seed, offset = _get_rng_state_()   # CUDARngStateHelper.get_torch_state_as_tuple
 *         runtime_args.extend([seed, offset])
 *         outs = _compiled_fn_(runtime_args)
 *         _set_offset_(outs[k])              # CUDARngStateHelper.set_new_offset; k = num_forward_returns
 *         return outs[:k] + outs[k + 1:]     # return_new_outs (inference)
 *         return outs                        # otherwise (training: CompiledFunction slices)
 *
 * The C call does that for one exact list argument (any other call runs the
 * generated function), calling the two helpers the generated function
 * binds. A state that is not a tuple or list of two is unpacked by the
 * shim's `unpack2` (Python's own unpacking, for its exact errors).
 * ====================================================================== */
#include "fn_object.h"
#include "aot/wrappers/wrappers.h"

typedef struct {
    RT_FN_HEAD
    PyObject *upstream;    /* _functionalized_rng_wrapper */
    PyObject *compiled_fn; /* its _compiled_fn_ */
    PyObject *get_state;   /* its _get_rng_state_ */
    PyObject *set_offset;  /* its _set_offset_ */
    PyObject *unpack2;     /* lambda v: tuple of `a, b = v` */
    PyObject *index;       /* k */
    PyObject *head;        /* slice(None, k) */
    PyObject *rest;        /* slice(k + 1, None) */
    bool return_new_outs;
} RngWrapper;

static PyObject *
RngWrapper_vectorcall(PyObject *op, PyObject *const *argv, size_t nargsf, PyObject *kwnames)
{
    RngWrapper *self = (RngWrapper *)op;
    if (!rt_plain_list_call(argv, nargsf, kwnames)) {
        return PyObject_Vectorcall(self->upstream, argv, nargsf, kwnames);
    }
    PyObject *runtime_args = argv[0];
    PyObject *state = PyObject_CallNoArgs(self->get_state);
    if (state == NULL) {
        return NULL;
    }
    /* seed, offset = state */
    if (!((PyTuple_CheckExact(state) && PyTuple_GET_SIZE(state) == 2) ||
          (PyList_CheckExact(state) && PyList_GET_SIZE(state) == 2))) {
        Py_SETREF(state, PyObject_CallOneArg(self->unpack2, state));
        if (state == NULL) {
            return NULL;
        }
    }
    PyObject *seed = Py_NewRef(PySequence_Fast_GET_ITEM(state, 0));
    PyObject *offset = Py_NewRef(PySequence_Fast_GET_ITEM(state, 1));
    Py_DECREF(state);
    /* runtime_args.extend([seed, offset]) */
    int rc = PyList_Append(runtime_args, seed);
    if (rc == 0) {
        rc = PyList_Append(runtime_args, offset);
    }
    Py_DECREF(seed);
    Py_DECREF(offset);
    if (rc < 0) {
        return NULL;
    }
    PyObject *outs = PyObject_Vectorcall(self->compiled_fn, &runtime_args, 1, NULL);
    if (outs == NULL) {
        return NULL;
    }
    PyObject *new_offset = PyObject_GetItem(outs, self->index);
    PyObject *r = new_offset ? PyObject_CallOneArg(self->set_offset, new_offset) : NULL;
    Py_XDECREF(new_offset);
    if (r == NULL) {
        Py_DECREF(outs);
        return NULL;
    }
    Py_DECREF(r);
    if (!self->return_new_outs) {
        return outs;
    }
    PyObject *head = PyObject_GetItem(outs, self->head);
    PyObject *rest = head ? PyObject_GetItem(outs, self->rest) : NULL;
    PyObject *result = rest ? PyNumber_Add(head, rest) : NULL;
    Py_XDECREF(head);
    Py_XDECREF(rest);
    Py_DECREF(outs);
    return result;
}

static PyObject *
RngWrapper_new(PyTypeObject *type, PyObject *args, PyObject *kwargs)
{
    static char *keywords[] = {"upstream", "compiled_fn", "get_state", "set_offset",
                               "unpack2", "offset_index", "return_new_outs", NULL};
    PyObject *upstream, *compiled_fn, *get_state, *set_offset, *unpack2;
    Py_ssize_t k;
    int return_new_outs;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OOOOOnp:RngWrapper", keywords, &upstream,
                                     &compiled_fn, &get_state, &set_offset, &unpack2, &k,
                                     &return_new_outs)) {
        return NULL;
    }
    if (!PyCallable_Check(upstream) || !PyCallable_Check(compiled_fn) ||
        !PyCallable_Check(get_state) || !PyCallable_Check(set_offset) ||
        !PyCallable_Check(unpack2)) {
        PyErr_SetString(PyExc_TypeError, "RngWrapper: the functions must be callable");
        return NULL;
    }
    if (k < 0) {
        PyErr_SetString(PyExc_ValueError, "RngWrapper: offset_index must be non-negative");
        return NULL;
    }
    RngWrapper *self = (RngWrapper *)rt_fn_alloc(type, RngWrapper_vectorcall);
    if (self == NULL) {
        return NULL;
    }
    self->upstream = Py_NewRef(upstream);
    self->compiled_fn = Py_NewRef(compiled_fn);
    self->get_state = Py_NewRef(get_state);
    self->set_offset = Py_NewRef(set_offset);
    self->unpack2 = Py_NewRef(unpack2);
    self->return_new_outs = return_new_outs != 0;
    PyObject *next = PyLong_FromSsize_t(k + 1);
    if ((self->index = PyLong_FromSsize_t(k)) == NULL || next == NULL ||
        (self->head = PySlice_New(Py_None, self->index, Py_None)) == NULL ||
        (self->rest = PySlice_New(next, Py_None, Py_None)) == NULL) {
        Py_XDECREF(next);
        Py_DECREF(self);
        return NULL;
    }
    Py_DECREF(next);
    return (PyObject *)self;
}

static int
RngWrapper_traverse(RngWrapper *self, visitproc visit, void *arg)
{
    Py_VISIT(Py_TYPE(self));
    Py_VISIT(self->module);
    Py_VISIT(self->dict);
    Py_VISIT(self->upstream);
    Py_VISIT(self->compiled_fn);
    Py_VISIT(self->get_state);
    Py_VISIT(self->set_offset);
    Py_VISIT(self->unpack2);
    return 0;
}

static int
RngWrapper_clear(RngWrapper *self)
{
    Py_CLEAR(self->dict);
    Py_CLEAR(self->upstream);
    Py_CLEAR(self->compiled_fn);
    Py_CLEAR(self->get_state);
    Py_CLEAR(self->set_offset);
    Py_CLEAR(self->unpack2);
    Py_CLEAR(self->index);
    Py_CLEAR(self->head);
    Py_CLEAR(self->rest);
    return 0;
}

DEFINE_DEALLOC(RngWrapper, (void)0)
FN_MEMBERS(RngWrapper)
FN_SPEC(RngWrapper,
        "RngWrapper(upstream, compiled_fn, get_state, set_offset, unpack2, offset_index, "
        "return_new_outs): FunctionalizedRngRuntimeWrapper.post_compile's "
        "_functionalized_rng_wrapper in C.")
