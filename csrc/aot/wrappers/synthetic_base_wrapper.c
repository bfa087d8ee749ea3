/* synthetic_base_wrapper.c: SyntheticBaseWrapper, the function
 * AOTSyntheticBaseWrapper.post_compile returns (runtime_wrappers.py), in C.
 *
 * When inputs alias each other and one is mutated, the graph was compiled
 * with one synthetic base per group of aliased inputs in their place.
 * Upstream generates, from base_groups (base index -> input positions),
 * other_arg_indices and aliased_arg_idx_with_metadata_mutations:
 *
 *     def _synthetic_base_wrapper(args):
 *         _bases = [None] * num_bases
 *         # per base, in base order; a group of one input f:
 *         if args[f]._base is not None:
 *             _bases[k] = args[f]._base
 *         # a group of several (g = [i, j, ...]):
 *         if any(args[_i]._base is not None for _i in g):
 *             _bases[k] = next(args[_i]._base for _i in g if args[_i]._base is not None)
 *         # either way, otherwise (f = g[0]):
 *         else:
 *             _b = torch.empty((0,), dtype=args[f].dtype, device=args[f].device)
 *             _b.set_(args[f].untyped_storage())
 *             _bases[k] = _b
 *         _new_args = _bases + [args[o] for o in other_arg_indices]
 *         _meta_mut = [args[i] for i in aliased_arg_idx_with_metadata_mutations]
 *         args.clear()
 *         _outs = _compiled_fn_(_new_args)
 *         # with metadata mutations (m of them):
 *         _mut_inps = _outs[-m:]
 *         _user_outs = _outs[:-m]
 *         for _inp, _mi in zip(_meta_mut, _mut_inps):
 *             _inp.as_strided_(_mi.size(), _mi.stride(), _mi.storage_offset())
 *         return _user_outs
 *         # without: return _outs
 *
 * The C call evaluates the same expressions in the same order (each `_base`
 * read as often as there, `torch.empty` read from the module per call, the
 * method looked up before its arguments are evaluated), for one exact list
 * argument long enough for every position it reads; any other call runs
 * the generated function itself.
 * ====================================================================== */
#include "fn_object.h"
#include "aot/wrappers/wrappers.h"

#include <string.h>

typedef struct {
    RT_FN_HEAD
    PyObject *upstream;    /* _synthetic_base_wrapper */
    PyObject *compiled_fn; /* its _compiled_fn_ */
    PyObject *torch;       /* its torch */
    PyObject *mut_slice;   /* slice(-m, None) */
    PyObject *user_slice;  /* slice(None, -m) */
    Py_ssize_t n_bases;
    Py_ssize_t *group_start; /* n_bases + 1 offsets into group_idx */
    Py_ssize_t *group_idx;
    Py_ssize_t n_other;
    Py_ssize_t *other;
    Py_ssize_t n_meta;
    Py_ssize_t *meta;
    Py_ssize_t need;       /* 1 + the largest position read */
} SyntheticBaseWrapper;

/* args[i]._base: a new reference */
static PyObject *
arg_base(SyntheticBaseWrapper *self, PyObject *args, Py_ssize_t i)
{
    PyObject *a = rt_list_item(args, i);
    return a == NULL ? NULL : PyObject_GetAttr(a, self->st->aot.wrappers.str_base);
}

/* The base of group k: a new reference, or NULL with an exception set. */
static PyObject *
group_base(SyntheticBaseWrapper *self, PyObject *args, Py_ssize_t k)
{
    rt_wrappers_state *ws = &self->st->aot.wrappers;
    const Py_ssize_t *g = self->group_idx + self->group_start[k];
    Py_ssize_t len = self->group_start[k + 1] - self->group_start[k];
    bool found = false;
    /* `args[f]._base is not None` / any(...): the first non-None ends it */
    for (Py_ssize_t j = 0; j < len && !found; j++) {
        PyObject *b = arg_base(self, args, g[j]);
        if (b == NULL) {
            return NULL;
        }
        found = b != Py_None;
        Py_DECREF(b);
    }
    if (found) {
        if (len == 1) {
            return arg_base(self, args, g[0]); /* read again, None or not */
        }
        /* next(args[_i]._base for _i in g if args[_i]._base is not None):
         * the condition reads _base, then the element reads it again */
        for (Py_ssize_t j = 0; j < len; j++) {
            PyObject *b = arg_base(self, args, g[j]);
            if (b == NULL) {
                return NULL;
            }
            int hit = b != Py_None;
            Py_DECREF(b);
            if (hit) {
                return arg_base(self, args, g[j]);
            }
        }
        PyErr_SetNone(PyExc_StopIteration); /* next() of an exhausted generator */
        return NULL;
    }
    /* _b = torch.empty((0,), dtype=args[f].dtype, device=args[f].device) */
    PyObject *empty = NULL, *call[3] = {ws->zero_shape, NULL, NULL}, *b = NULL, *set_ = NULL,
             *storage = NULL, *r = NULL, *a;
    if ((empty = PyObject_GetAttr(self->torch, ws->str_empty)) == NULL ||
        (a = rt_list_item(args, g[0])) == NULL ||
        (call[1] = PyObject_GetAttr(a, self->st->aot.obj.str_dtype)) == NULL ||
        (a = rt_list_item(args, g[0])) == NULL ||
        (call[2] = PyObject_GetAttr(a, self->st->aot.obj.str_device)) == NULL ||
        (b = PyObject_Vectorcall(empty, call, 1, ws->kwnames_dtype_device)) == NULL) {
        goto done;
    }
    /* _b.set_(args[f].untyped_storage()) */
    if ((set_ = PyObject_GetAttr(b, self->st->torch.obj.method_names[RT_SET_])) == NULL ||
        (a = rt_list_item(args, g[0])) == NULL ||
        (storage = PyObject_VectorcallMethod(ws->str_untyped_storage, &a,
                                             1 | PY_VECTORCALL_ARGUMENTS_OFFSET, NULL)) == NULL ||
        (r = PyObject_Vectorcall(set_, &storage, 1, NULL)) == NULL) {
        Py_CLEAR(b);
    }
done:
    Py_XDECREF(empty);
    Py_XDECREF(call[1]);
    Py_XDECREF(call[2]);
    Py_XDECREF(set_);
    Py_XDECREF(storage);
    Py_XDECREF(r);
    return b;
}

/* _inp.as_strided_(_mi.size(), _mi.stride(), _mi.storage_offset()) */
static int
restride(rt_state *st, PyObject *inp, PyObject *mi)
{
    PyObject *method = PyObject_GetAttr(inp, st->torch.obj.method_names[RT_AS_STRIDED_]);
    if (method == NULL) {
        return -1;
    }
    PyObject *margs[3] = {NULL, NULL, NULL}, *r = NULL;
    PyObject *names[3] = {st->torch.obj.method_names[RT_SIZE], st->torch.obj.method_names[RT_STRIDE],
                          st->torch.obj.method_names[RT_STORAGE_OFFSET]};
    int k;
    for (k = 0; k < 3; k++) {
        margs[k] = PyObject_VectorcallMethod(names[k], &mi, 1 | PY_VECTORCALL_ARGUMENTS_OFFSET,
                                             NULL);
        if (margs[k] == NULL) {
            break;
        }
    }
    if (k == 3) {
        r = PyObject_Vectorcall(method, margs, 3, NULL);
    }
    for (k = 0; k < 3; k++) {
        Py_XDECREF(margs[k]);
    }
    Py_DECREF(method);
    if (r == NULL) {
        return -1;
    }
    Py_DECREF(r);
    return 0;
}

static PyObject *
SyntheticBaseWrapper_vectorcall(PyObject *op, PyObject *const *argv, size_t nargsf,
                                PyObject *kwnames)
{
    SyntheticBaseWrapper *self = (SyntheticBaseWrapper *)op;
    if (!rt_plain_list_call(argv, nargsf, kwnames) || PyList_GET_SIZE(argv[0]) < self->need) {
        return PyObject_Vectorcall(self->upstream, argv, nargsf, kwnames);
    }
    PyObject *args = argv[0];
    PyObject *new_args = NULL, *meta_mut = NULL, *outs = NULL, *mut = NULL, *user = NULL,
             *it = NULL;
    if ((new_args = PyList_New(self->n_bases + self->n_other)) == NULL) {
        return NULL;
    }
    for (Py_ssize_t k = 0; k < self->n_bases; k++) {
        PyObject *b = group_base(self, args, k);
        if (b == NULL) {
            goto error;
        }
        PyList_SET_ITEM(new_args, k, b);
    }
    for (Py_ssize_t j = 0; j < self->n_other; j++) {
        PyObject *a = rt_list_item(args, self->other[j]);
        if (a == NULL) {
            goto error;
        }
        PyList_SET_ITEM(new_args, self->n_bases + j, Py_NewRef(a));
    }
    if (self->n_meta > 0) {
        if ((meta_mut = PyList_New(self->n_meta)) == NULL) {
            goto error;
        }
        for (Py_ssize_t j = 0; j < self->n_meta; j++) {
            PyObject *a = rt_list_item(args, self->meta[j]);
            if (a == NULL) {
                goto error;
            }
            PyList_SET_ITEM(meta_mut, j, Py_NewRef(a));
        }
    }
    if (PyList_SetSlice(args, 0, PyList_GET_SIZE(args), NULL) < 0) { /* args.clear() */
        goto error;
    }
    outs = PyObject_Vectorcall(self->compiled_fn, &new_args, 1, NULL);
    Py_CLEAR(new_args);
    if (outs == NULL || self->n_meta == 0) {
        return outs;
    }
    if ((mut = PyObject_GetItem(outs, self->mut_slice)) == NULL ||
        (user = PyObject_GetItem(outs, self->user_slice)) == NULL ||
        (it = PyObject_GetIter(mut)) == NULL) {
        goto error;
    }
    /* zip(_meta_mut, _mut_inps): _meta_mut's end stops it first */
    for (Py_ssize_t j = 0; j < PyList_GET_SIZE(meta_mut); j++) {
        PyObject *inp = Py_NewRef(PyList_GET_ITEM(meta_mut, j));
        PyObject *mi = PyIter_Next(it);
        if (mi == NULL) {
            Py_DECREF(inp);
            if (PyErr_Occurred()) {
                goto error;
            }
            break;
        }
        int rc = restride(self->st, inp, mi);
        Py_DECREF(inp);
        Py_DECREF(mi);
        if (rc < 0) {
            goto error;
        }
    }
    Py_DECREF(it);
    Py_DECREF(mut);
    Py_DECREF(outs);
    Py_DECREF(meta_mut);
    return user;
error:
    Py_XDECREF(new_args);
    Py_XDECREF(meta_mut);
    Py_XDECREF(outs);
    Py_XDECREF(mut);
    Py_XDECREF(user);
    Py_XDECREF(it);
    return NULL;
}

static int
track_need(SyntheticBaseWrapper *self, const Py_ssize_t *idx, Py_ssize_t n)
{
    for (Py_ssize_t i = 0; i < n; i++) {
        if (idx[i] + 1 > self->need) {
            self->need = idx[i] + 1;
        }
    }
    return 0;
}

static PyObject *
SyntheticBaseWrapper_new(PyTypeObject *type, PyObject *args, PyObject *kwargs)
{
    static char *keywords[] = {"upstream", "compiled_fn", "torch", "groups", "other",
                               "meta_mut", NULL};
    PyObject *upstream, *compiled_fn, *torch, *groups, *other, *meta;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OOOO!O!O!:SyntheticBaseWrapper", keywords,
                                     &upstream, &compiled_fn, &torch, &PyTuple_Type, &groups,
                                     &PyTuple_Type, &other, &PyTuple_Type, &meta)) {
        return NULL;
    }
    if (!PyCallable_Check(upstream) || !PyCallable_Check(compiled_fn)) {
        PyErr_SetString(PyExc_TypeError,
                        "SyntheticBaseWrapper: upstream and compiled_fn must be callable");
        return NULL;
    }
    SyntheticBaseWrapper *self =
        (SyntheticBaseWrapper *)rt_fn_alloc(type, SyntheticBaseWrapper_vectorcall);
    if (self == NULL) {
        return NULL;
    }
    self->upstream = Py_NewRef(upstream);
    self->compiled_fn = Py_NewRef(compiled_fn);
    self->torch = Py_NewRef(torch);
    self->n_bases = PyTuple_GET_SIZE(groups);
    Py_ssize_t total = 0;
    for (Py_ssize_t k = 0; k < self->n_bases; k++) {
        PyObject *g = PyTuple_GET_ITEM(groups, k);
        if (!PyTuple_Check(g) || PyTuple_GET_SIZE(g) == 0) {
            PyErr_SetString(PyExc_ValueError,
                            "SyntheticBaseWrapper: groups must be non-empty tuples of ints");
            goto error;
        }
        total += PyTuple_GET_SIZE(g);
    }
    self->group_start = PyMem_Malloc(((size_t)self->n_bases + 1) * sizeof(Py_ssize_t));
    self->group_idx = PyMem_Malloc(((size_t)total + 1) * sizeof(Py_ssize_t));
    if (self->group_start == NULL || self->group_idx == NULL) {
        PyErr_NoMemory();
        goto error;
    }
    Py_ssize_t at = 0;
    for (Py_ssize_t k = 0; k < self->n_bases; k++) {
        Py_ssize_t len;
        Py_ssize_t *g = rt_index_tuple(PyTuple_GET_ITEM(groups, k),
                                       "SyntheticBaseWrapper: a group", &len);
        if (g == NULL) {
            goto error;
        }
        self->group_start[k] = at;
        memcpy(self->group_idx + at, g, (size_t)len * sizeof(Py_ssize_t));
        PyMem_Free(g);
        at += len;
    }
    self->group_start[self->n_bases] = at;
    if ((self->other = rt_index_tuple(other, "SyntheticBaseWrapper: other", &self->n_other)) ==
            NULL ||
        (self->meta = rt_index_tuple(meta, "SyntheticBaseWrapper: meta_mut", &self->n_meta)) ==
            NULL) {
        goto error;
    }
    track_need(self, self->group_idx, total);
    track_need(self, self->other, self->n_other);
    track_need(self, self->meta, self->n_meta);
    if (self->n_meta > 0) {
        PyObject *m = PyLong_FromSsize_t(-self->n_meta);
        if (m == NULL) {
            goto error;
        }
        self->mut_slice = PySlice_New(m, Py_None, Py_None);
        self->user_slice = PySlice_New(Py_None, m, Py_None);
        Py_DECREF(m);
        if (self->mut_slice == NULL || self->user_slice == NULL) {
            goto error;
        }
    }
    return (PyObject *)self;
error:
    Py_DECREF(self);
    return NULL;
}

static int
SyntheticBaseWrapper_traverse(SyntheticBaseWrapper *self, visitproc visit, void *arg)
{
    Py_VISIT(Py_TYPE(self));
    Py_VISIT(self->module);
    Py_VISIT(self->dict);
    Py_VISIT(self->upstream);
    Py_VISIT(self->compiled_fn);
    Py_VISIT(self->torch);
    return 0;
}

static int
SyntheticBaseWrapper_clear(SyntheticBaseWrapper *self)
{
    Py_CLEAR(self->dict);
    Py_CLEAR(self->upstream);
    Py_CLEAR(self->compiled_fn);
    Py_CLEAR(self->torch);
    Py_CLEAR(self->mut_slice);
    Py_CLEAR(self->user_slice);
    return 0;
}

DEFINE_DEALLOC(SyntheticBaseWrapper, {
    PyMem_Free(self->group_start);
    PyMem_Free(self->group_idx);
    PyMem_Free(self->other);
    PyMem_Free(self->meta);
})
FN_MEMBERS(SyntheticBaseWrapper)
FN_SPEC(SyntheticBaseWrapper,
        "SyntheticBaseWrapper(upstream, compiled_fn, torch, groups, other, meta_mut): "
        "AOTSyntheticBaseWrapper.post_compile's _synthetic_base_wrapper (synthetic bases "
        "per call, metadata mutations of aliased inputs replayed) in C.")
