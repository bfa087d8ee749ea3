/* dedupe_wrapper.c: DedupeWrapper, the function AOTDedupeWrapper.post_compile
 * returns (runtime_wrappers.py), in C.
 *
 * Upstream, when the graph was compiled for arguments with duplicates
 * (keep_arg_mask, add_dupe_map), post_compile generates
 *
 *     def inner_fn(args):
 *         deduped_args = [args[k0], args[k1], ...]   # the kept positions
 *         args.clear()
 *         return compiled_fn(deduped_args)
 *
 * and returns, around it, debugged_compiled_fn(args), which runs on every
 * call: new_args = add_dupe_args(remove_dupe_args(args)), then for each
 * position i, seen[args[i]] = None and `new_args[i] is not args[i]` raises an
 * AssertionError (format_guard_bug_msg: "... would be a duplicate of ...");
 * then inner_fn(args).
 *
 * new_args[i] is args[src[i]] with src[i] = kept[add_dupe_map[i]] (decided
 * when built), so the check is `args[i] is args[src[i]]` where the two
 * differ. The C call takes the plain case: one exact list of the compiled
 * length whose items are exact tensors or parameters (hashed by id,
 * Tensor.__hash__, which runs nothing else: the shim checks it is
 * upstream's) or None, bool, int, float (hashing runs nothing either). Then
 * nothing of `seen` is observable and it is skipped. Everything else (other
 * argument objects, another length, keywords) and a failed check (whose
 * AssertionError upstream formats from the aot_config) run upstream's
 * debugged_compiled_fn, before anything observable happened.
 *
 * Differs on purpose: upstream's dict would compare (Tensor.__eq__) a
 * tensor argument with a number argument whose hash equals the tensor's id;
 * C does not build the dict.
 * ====================================================================== */
#include "fn_object.h"
#include "aot/wrappers/wrappers.h"

typedef struct {
    RT_FN_HEAD
    PyObject *upstream;    /* debugged_compiled_fn */
    PyObject *compiled_fn; /* what inner_fn calls */
    Py_ssize_t n;          /* len(keep_arg_mask) */
    Py_ssize_t n_kept;
    Py_ssize_t *kept;      /* kept positions, in order */
    Py_ssize_t n_checks;
    Py_ssize_t *check_i;   /* positions i with src[i] != i ... */
    Py_ssize_t *check_src; /* ... and src[i] */
} DedupeWrapper;

/* an argument hashing and comparing can run no code for (see above) */
static inline int
inert_arg(rt_state *st, PyObject *a)
{
    PyTypeObject *t = Py_TYPE(a);
    return t == st->torch.types.Tensor || t == st->torch.types.Parameter || a == Py_None || t == &PyLong_Type ||
           t == &PyBool_Type || t == &PyFloat_Type;
}

static PyObject *
DedupeWrapper_vectorcall(PyObject *op, PyObject *const *argv, size_t nargsf,
                         PyObject *kwnames)
{
    DedupeWrapper *self = (DedupeWrapper *)op;
    if (!rt_plain_list_call(argv, nargsf, kwnames) || PyList_GET_SIZE(argv[0]) != self->n) {
        return PyObject_Vectorcall(self->upstream, argv, nargsf, kwnames);
    }
    PyObject *args = argv[0];
    PyObject **items = ((PyListObject *)args)->ob_item;
    for (Py_ssize_t i = 0; i < self->n; i++) {
        if (!inert_arg(self->st, items[i])) {
            return PyObject_Vectorcall(self->upstream, argv, nargsf, kwnames);
        }
    }
    for (Py_ssize_t c = 0; c < self->n_checks; c++) {
        if (items[self->check_i[c]] != items[self->check_src[c]]) {
            /* upstream's guard-bug AssertionError, formatted by upstream */
            return PyObject_Vectorcall(self->upstream, argv, nargsf, kwnames);
        }
    }
    PyObject *deduped = PyList_New(self->n_kept);
    if (deduped == NULL) {
        return NULL;
    }
    /* the allocation may have run a collection, and finalizers with it */
    if (PyList_GET_SIZE(args) != self->n) {
        Py_DECREF(deduped);
        return PyObject_Vectorcall(self->upstream, argv, nargsf, kwnames);
    }
    items = ((PyListObject *)args)->ob_item;
    for (Py_ssize_t k = 0; k < self->n_kept; k++) {
        PyList_SET_ITEM(deduped, k, Py_NewRef(items[self->kept[k]]));
    }
    if (PyList_SetSlice(args, 0, PyList_GET_SIZE(args), NULL) < 0) { /* args.clear() */
        Py_DECREF(deduped);
        return NULL;
    }
    PyObject *result = PyObject_Vectorcall(self->compiled_fn, &deduped, 1, NULL);
    Py_DECREF(deduped);
    return result;
}

static PyObject *
DedupeWrapper_new(PyTypeObject *type, PyObject *args, PyObject *kwargs)
{
    static char *keywords[] = {"upstream", "compiled_fn", "kept", "src", NULL};
    PyObject *upstream, *compiled_fn, *kept, *src;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OOO!O!:DedupeWrapper", keywords,
                                     &upstream, &compiled_fn, &PyTuple_Type, &kept,
                                     &PyTuple_Type, &src)) {
        return NULL;
    }
    if (!PyCallable_Check(upstream) || !PyCallable_Check(compiled_fn)) {
        PyErr_SetString(PyExc_TypeError, "DedupeWrapper: upstream and compiled_fn must be callable");
        return NULL;
    }
    DedupeWrapper *self = (DedupeWrapper *)rt_fn_alloc(type, DedupeWrapper_vectorcall);
    if (self == NULL) {
        return NULL;
    }
    self->upstream = Py_NewRef(upstream);
    self->compiled_fn = Py_NewRef(compiled_fn);
    Py_ssize_t *srcs = NULL;
    if ((self->kept = rt_index_tuple(kept, "DedupeWrapper: kept", &self->n_kept)) == NULL ||
        (srcs = rt_index_tuple(src, "DedupeWrapper: src", &self->n)) == NULL) {
        goto error;
    }
    self->check_i = PyMem_Malloc(((size_t)self->n + 1) * sizeof(Py_ssize_t));
    self->check_src = PyMem_Malloc(((size_t)self->n + 1) * sizeof(Py_ssize_t));
    if (self->check_i == NULL || self->check_src == NULL) {
        PyErr_NoMemory();
        goto error;
    }
    for (Py_ssize_t k = 0; k < self->n_kept; k++) {
        if (self->kept[k] >= self->n) {
            PyErr_SetString(PyExc_ValueError, "DedupeWrapper: a kept position is out of range");
            goto error;
        }
    }
    for (Py_ssize_t i = 0; i < self->n; i++) {
        if (srcs[i] >= self->n) {
            PyErr_SetString(PyExc_ValueError, "DedupeWrapper: a source position is out of range");
            goto error;
        }
        if (srcs[i] != i) {
            self->check_i[self->n_checks] = i;
            self->check_src[self->n_checks] = srcs[i];
            self->n_checks++;
        }
    }
    PyMem_Free(srcs);
    return (PyObject *)self;
error:
    PyMem_Free(srcs);
    Py_DECREF(self);
    return NULL;
}

static int
DedupeWrapper_traverse(DedupeWrapper *self, visitproc visit, void *arg)
{
    Py_VISIT(Py_TYPE(self));
    Py_VISIT(self->module);
    Py_VISIT(self->dict);
    Py_VISIT(self->upstream);
    Py_VISIT(self->compiled_fn);
    return 0;
}

static int
DedupeWrapper_clear(DedupeWrapper *self)
{
    Py_CLEAR(self->dict);
    Py_CLEAR(self->upstream);
    Py_CLEAR(self->compiled_fn);
    return 0;
}

DEFINE_DEALLOC(DedupeWrapper, {
    PyMem_Free(self->kept);
    PyMem_Free(self->check_i);
    PyMem_Free(self->check_src);
})
FN_MEMBERS(DedupeWrapper)
FN_SPEC(DedupeWrapper,
        "DedupeWrapper(upstream, compiled_fn, kept, src): AOTDedupeWrapper.post_compile's "
        "debugged_compiled_fn (duplicate check, then compiled_fn on the kept arguments) in C.")
