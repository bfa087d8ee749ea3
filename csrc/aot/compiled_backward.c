/* compiled_backward.c: CompiledBackward (CompiledFunction.backward),
 * BackwardThunk (its impl_fn) and ApplyBoxed (the backward node's apply_boxed). Mirrors _codegen_compiled_backward,
 * _codegen_backward_prologue, CompiledFunction._backward_impl and
 * _codegen_backward_epilogue (runtime_wrappers.py). */
#include "util/py_compat.h"
#include "fn_object.h"

/* ======================================================================
 * CompiledBackward: CompiledFunction.backward(ctx, grads)
 * ====================================================================== */

enum tangent_kind {
    TANGENT_STRIDES = 0,       /* plain tensor meta: expected size and stride */
    TANGENT_MEMORY_FORMAT = 1, /* plain tensor meta: expected memory format */
    TANGENT_PYTHON = 2,        /* anything else: upstream's process_runtime_tangent */
};

typedef struct {
    int kind;
    PyObject *meta;            /* PlainTensorMeta / SubclassCreationMeta */
    PyObject *size, *stride, *memory_format;
    PyObject *desc, *stack_trace, *index;
    /* TANGENT_STRIDES with size and stride tuples of ndim plain ints: them
     * as C arrays (for the C++ part's compare); else ndim = -1 */
    Py_ssize_t ndim;
    int64_t *sizes, *strides;
    /* A SubclassCreationMeta whose process_runtime_tangent runs in C (see
     * subclass_tangent_leaves), or NULL */
    struct subclass_tangent *sub;
} tangent_plan;

/* process_runtime_tangent for a subclass tangent, decided at build: the
 * expected type (not a FakeTensor or FunctionalTensor class, with
 * __tensor_flatten__/__tensor_unflatten__), its flatten metadata, the
 * memory format of its MemoryFormatMeta, and one plain tangent plan per inner
 * attribute (PlainTensorMeta, processed with no index/desc/stack). */
typedef struct subclass_tangent {
    PyObject *type;
    PyObject *flat_meta;
    PyObject *memory_format;
    PyObject *is_fake;         /* torch._C._is_fake_tensor (2.14 on), or NULL */
    Py_ssize_t n_attrs;
    PyObject **names;
    tangent_plan *attrs;
} subclass_tangent;

typedef struct {
    RT_FN_HEAD
    PyObject *upstream;        /* upstream's backward: calls we don't take */
    PyObject *cls;             /* CompiledFunction */
    PyObject *double_backward; /* CompiledFunction._double_backward */
    PyObject *backward_compiler; /* upstream's _AutogradBackwardCompiler, or None (2.11) */
    /* 2.11: CompiledFunction._backward_impl, which compiles the backward
     * lazily itself; run for a call that finds cls.compiled_bw None. NULL
     * where backward_compiler compiles it (2.12 on). */
    PyObject *lazy_backward_impl;
    PyObject *fw_metadata;
    PyObject *rng_add;         /* rng_state.add_backward_args, or NULL */
    PyObject *compile_id;
    PyObject *compiled_bw;     /* NULL until the first backward compiles it */
    /* the compiled backward compiled_bw was made from, what cls.compiled_bw
     * holds (borrowed, for identity tests and to put it back: compiled_bw
     * holds it or its DisabledCall, which holds it) */
    PyObject *compiled_bw_seen;
    bool compiled_bw_boxed;
    bool disable_amp;
    bool has_backward_state;
    bool check_deterministic;
    bool has_mutations_in_bw;
    bool inputs_require_grad;
    bool has_no_vc_check;
    bool restore_external_objects; /* 2.14: ctx._external_objects -> registry */
    bool restore_by_setter;        /* 2.15: through set_external_object_by_index */
    bool copy_context;             /* 2.14: impl_fn runs in context.copy() */
    /* impl_fn runs in the engine's TLS `context` (2.12 on; 2.11 has no hook) */
    bool tls_context;
    /* process_runtime_tangent(x, meta, idx, desc, compile_id_str, stack_trace)
     * (2.12 on), or 2.11's process_runtime_tangent(x, meta) */
    bool tangent_context_args;
    /* backward(ctx, grads_list) (boxed_grads_call, 2.13 on), or 2.11/2.12's
     * backward(ctx, *flat_args) */
    bool boxed_grads;
    Py_ssize_t expected_grad_outs;
    Py_ssize_t num_backward_tokens;
    Py_ssize_t n_surviving;
    Py_ssize_t *surviving;
    tangent_plan *tangents;    /* n_surviving entries */
    /* maybe_subclass_meta is set: the prologue's chained tangent leaves
     * (process_runtime_tangent(...)[1]) and the epilogue's wrap_fn, a
     * wrap-only _C.SubclassWrapper over grad_input_metas */
    bool subclass_tangents;
    PyObject *grads_wrapper;
} CompiledBackward;

typedef struct {
    PyObject_HEAD
    vectorcallfunc vectorcall;
    PyObject *backward;        /* the CompiledBackward */
    PyObject *ctx;
    PyObject *all_args;
} BackwardThunk;

static int
raise_runtime(const char *msg)
{
    PyErr_SetString(PyExc_RuntimeError, msg);
    return -1;
}

/* coerce_to_expected_memory_format's restriding branch, for a plain tensor
 * whose size or stride differs from the expected ones (the usual case: the
 * stride-0 tangent that `out.sum().backward()` hands in):
 *     restrided = torch.empty_strided(size=..., stride=..., dtype=x.dtype,
 *         device=x.device, layout=x.layout, requires_grad=x.requires_grad)
 *     restrided.copy_(x)
 * Same callables and the same keywords as upstream, so that a torch function
 * mode active in the backward sees the same call. */
static PyObject *
restride_tangent(rt_state *st, const tangent_plan *t, PyObject *x)
{
    PyObject *argv[6] = {t->size, t->stride, NULL, NULL, NULL, NULL};
    PyObject *restrided = NULL, *copied;
    if ((argv[2] = PyObject_GetAttr(x, st->str_dtype)) == NULL ||
        (argv[3] = PyObject_GetAttr(x, st->str_device)) == NULL ||
        (argv[4] = PyObject_GetAttr(x, st->str_layout)) == NULL ||
        (argv[5] = PyObject_GetAttr(x, st->str_requires_grad)) == NULL) {
        goto done;
    }
    restrided = PyObject_Vectorcall(st->empty_strided, argv, 0, st->kwnames_empty_strided);
    if (restrided == NULL) {
        goto done;
    }
    copied = rt_tensor_call(st, RT_COPY_, restrided, &x, 1);
    if (copied == NULL) {
        Py_CLEAR(restrided);
        goto done;
    }
    Py_DECREF(copied);
done:
    for (int i = 2; i < 6; i++) {
        Py_XDECREF(argv[i]);
    }
    return restrided;
}

/* x.<method>(memory_format=mf): the method found on torch.Tensor once for an
 * exact tensor, else looked up on x, as upstream's Python does. */
static PyObject *
call_with_memory_format(rt_state *st, enum rt_tensor_method m, PyObject *x, PyObject *mf)
{
    PyObject *argv[2] = {x, mf};
    if (Py_IS_TYPE(x, st->Tensor)) {
        return PyObject_Vectorcall(st->tensor_methods[m], argv, 1, st->kwnames_memory_format);
    }
    return PyObject_VectorcallMethod(st->method_names[m], argv,
                                     1 | PY_VECTORCALL_ARGUMENTS_OFFSET,
                                     st->kwnames_memory_format);
}

/* coerce_to_expected_memory_format's memory-format branch (a new reference):
 *     if not x.is_contiguous(memory_format=mf):
 *         x = x.contiguous(memory_format=mf) */
static PyObject *
coerce_memory_format(rt_state *st, PyObject *x, PyObject *mf)
{
    PyObject *r = call_with_memory_format(st, RT_IS_CONTIGUOUS, x, mf);
    int contiguous = r ? PyObject_IsTrue(r) : -1;
    Py_XDECREF(r);
    if (contiguous < 0) {
        return NULL;
    }
    return contiguous ? Py_NewRef(x) : call_with_memory_format(st, RT_CONTIGUOUS, x, mf);
}

/* AOTDispatchAutograd.process_runtime_tangent(x, meta, j, ...)[0] with the
 * common case, a plain torch.Tensor, in C: coerce_to_expected_memory_format
 * (a no-op when strides, or the memory format, already match; else a
 * restrided copy, or x.contiguous(memory_format=...)). */
static PyObject *
process_tangent(CompiledBackward *self, const tangent_plan *t, PyObject *x)
{
    rt_state *st = self->st;
    if (Py_IS_TYPE(x, st->Tensor) && t->kind != TANGENT_PYTHON) {
        if (t->kind == TANGENT_MEMORY_FORMAT) {
            return coerce_memory_format(st, x, t->memory_format);
        }
        int same = rt_tensor_size_stride_equal(st, x, t->ndim, t->sizes, t->strides, t->size,
                                               t->stride);
        if (same < 0) {
            return NULL;
        }
        return same ? Py_NewRef(x) : restride_tangent(st, t, x);
    }
    if (!Py_IS_TYPE(x, st->Tensor)) {
        int is_tensor = rt_is_tensor(st, x);
        if (is_tensor <= 0) {
            return is_tensor < 0 ? NULL : Py_NewRef(x); /* not a tensor: as is */
        }
    }
    PyObject *argv[6] = {x, t->meta, t->index, t->desc, self->compile_id, t->stack_trace};
    PyObject *pair = PyObject_Vectorcall(st->process_runtime_tangent, argv,
                                         self->tangent_context_args ? 6 : 2, NULL);
    if (pair == NULL) {
        return NULL;
    }
    PyObject *first = PySequence_GetItem(pair, 0);
    Py_DECREF(pair);
    return first;
}

static PyObject *process_tangent(CompiledBackward *self, const tangent_plan *t, PyObject *x);

/* hasattr(x, name): 1, 0, -1 (an error other than AttributeError raised) */
static int
has_attr(PyObject *x, const char *name)
{
    PyObject *v = PyObject_GetAttrString(x, name);
    if (v != NULL) {
        Py_DECREF(v);
        return 1;
    }
    if (PyErr_ExceptionMatches(PyExc_AttributeError)) {
        PyErr_Clear();
        return 0;
    }
    return -1;
}

/* is_traceable_wrapper_subclass(x) for x a torch.Tensor: type(x) is not
 * torch.Tensor and hasattr(x, "__tensor_flatten__") and hasattr(x,
 * "__tensor_unflatten__") */
static int
traceable_subclass(rt_state *st, PyObject *x)
{
    if (Py_IS_TYPE(x, st->Tensor)) {
        return 0;
    }
    int h = has_attr(x, "__tensor_flatten__");
    return h <= 0 ? h : has_attr(x, "__tensor_unflatten__");
}

/* raise AOTDispatchAutograd._raise_tangent_metadata_error(...) (its message,
 * built by upstream, on this error path only) */
static int
raise_tangent_metadata_error(CompiledBackward *self, const tangent_plan *t, PyObject *runtime_type,
                             PyObject *runtime_meta, PyObject *orig_x, bool top)
{
    PyObject *fn = NULL, *exc = NULL;
    (void)self;
    PyObject *mod = PyImport_ImportModule("torch._functorch._aot_autograd.runtime_wrappers");
    if (mod != NULL) {
        PyObject *owner = PyObject_GetAttrString(mod, "AOTDispatchAutograd");
        if (owner != NULL) {
            fn = PyObject_GetAttrString(owner, "_raise_tangent_metadata_error");
            Py_DECREF(owner);
        }
        Py_DECREF(mod);
    }
    if (fn != NULL) {
        subclass_tangent *n = t->sub;
        PyObject *argv[9] = {n->type, n->flat_meta, runtime_type, runtime_meta, orig_x,
                             top ? t->index : Py_None, top ? t->desc : Py_None,
                             top ? self->compile_id : Py_None, top ? t->stack_trace : Py_None};
        exc = PyObject_Vectorcall(fn, argv, 9, NULL);
        Py_DECREF(fn);
    }
    if (exc != NULL) {
        PyErr_SetObject((PyObject *)Py_TYPE(exc), exc);
        Py_DECREF(exc);
    }
    return -1;
}

/* AOTDispatchAutograd.process_runtime_tangent(x, meta, idx, desc, ...) for a
 * tangent whose meta t->sub describes, in C, in upstream's order: the fake
 * check, flatten, type/metadata comparison (and __coerce_same_metadata_as_tangent__
 * where they differ), the memory format, then each inner tensor, set back on
 * the tangent when its coercion made a new one. Returns 1 with *leaves a new
 * list and *out the (possibly new) tangent, 0 when x is not of the expected
 * type or is fake (nothing of x was called yet: the caller runs upstream's
 * function), -1 on error. */
static int
subclass_tangent_leaves(CompiledBackward *self, const tangent_plan *t, PyObject *x,
                        PyObject **out, PyObject **leaves)
{
    rt_state *st = self->st;
    subclass_tangent *n = t->sub;
    if ((PyObject *)Py_TYPE(x) != n->type) {
        return 0;
    }
    if (n->is_fake != NULL) {  /* is_fake_tensor(x): torch._C._is_fake_tensor */
        PyObject *r = PyObject_Vectorcall(n->is_fake, &x, 1, NULL);
        int fake = r ? PyObject_IsTrue(r) : -1;
        Py_XDECREF(r);
        if (fake != 0) {
            return fake < 0 ? -1 : 0;
        }
    }
    PyObject *runtime_type = (PyObject *)Py_TYPE(x);
    PyObject *runtime_meta = Py_NewRef(Py_None), *keys = NULL, *cur = Py_NewRef(x);
    PyObject *list = NULL;
    int rc = -1;
    int traceable = traceable_subclass(st, x);
    if (traceable < 0) {
        goto done;
    }
    if (traceable) {
        /* runtime_subclass_keys, runtime_meta = x.__tensor_flatten__() */
        PyObject *flat = PyObject_CallMethod(x, "__tensor_flatten__", NULL);
        PyObject *seq = flat ? PySequence_Fast(flat, "cannot unpack non-iterable object") : NULL;
        Py_XDECREF(flat);
        if (seq == NULL) {
            goto done;
        }
        if (PySequence_Fast_GET_SIZE(seq) != 2) {
            Py_ssize_t k = PySequence_Fast_GET_SIZE(seq);
            if (k > 2) {
                PyErr_SetString(PyExc_ValueError, "too many values to unpack (expected 2)");
            }
            else {
                PyErr_Format(PyExc_ValueError, "not enough values to unpack (expected 2, got %zd)",
                             k);
            }
            Py_DECREF(seq);
            goto done;
        }
        keys = Py_NewRef(PySequence_Fast_GET_ITEM(seq, 0));
        Py_SETREF(runtime_meta, Py_NewRef(PySequence_Fast_GET_ITEM(seq, 1)));
        Py_DECREF(seq);
    }
    /* maybe_coerce */
    int same_type = PyObject_RichCompareBool(n->type, runtime_type, Py_EQ);
    PyObject *eq = same_type < 0 ? NULL : PyObject_RichCompare(n->flat_meta, runtime_meta, Py_EQ);
    if (eq == NULL) {
        goto done;
    }
    int same_meta = 1;
    if (same_type) {
        same_meta = PyObject_IsTrue(eq);
    }
    Py_DECREF(eq);
    if (same_meta < 0) {
        goto done;
    }
    if (!(same_type && same_meta)) {
        int has = has_attr(x, "__coerce_same_metadata_as_tangent__");
        if (has < 0) {
            goto done;
        }
        PyObject *coerced = NULL;
        if (has) {
            coerced = same_type
                ? PyObject_CallMethod(x, "__coerce_same_metadata_as_tangent__", "O", n->flat_meta)
                : PyObject_CallMethod(x, "__coerce_same_metadata_as_tangent__", "OO",
                                      n->flat_meta, n->type);
            if (coerced == NULL) {
                goto done;
            }
        }
        if (coerced == NULL || coerced == Py_None) {
            Py_XDECREF(coerced);
            raise_tangent_metadata_error(self, t, runtime_type, runtime_meta, x,
                                         t->index != NULL);
            goto done;
        }
        Py_SETREF(cur, coerced);
    }
    /* coerce_to_expected_memory_format(x, meta.memory_format): the memory
     * format branch (decided at build) */
    {
        PyObject *c = coerce_memory_format(st, cur, n->memory_format);
        if (c == NULL) {
            goto done;
        }
        Py_SETREF(cur, c);
    }
    traceable = traceable_subclass(st, cur);
    if (traceable <= 0) {
        if (traceable == 0) {  /* return x, [x] */
            list = PyList_New(1);
            if (list != NULL) {
                PyList_SET_ITEM(list, 0, Py_NewRef(cur));
                rc = 1;
            }
        }
        goto done;
    }
    if (cur != x) {  /* runtime_subclass_keys = x.__tensor_flatten__()[0] */
        PyObject *flat = PyObject_CallMethod(cur, "__tensor_flatten__", NULL);
        PyObject *k0 = flat ? PySequence_GetItem(flat, 0) : NULL;
        Py_XDECREF(flat);
        if (k0 == NULL) {
            goto done;
        }
        Py_XSETREF(keys, k0);
    }
    Py_ssize_t nk = keys ? PyObject_Size(keys) : 0;
    if (nk < 0) {
        goto done;
    }
    if (nk != n->n_attrs) {
        PyErr_Format(PyExc_AssertionError,
                     "expected len(meta.attrs) == len(runtime_subclass_keys), got %zd != %zd",
                     n->n_attrs, nk);
        goto done;
    }
    list = PyList_New(0);
    if (list == NULL) {
        goto done;
    }
    for (Py_ssize_t i = 0; i < n->n_attrs; i++) {
        PyObject *elem = PyObject_GetAttr(cur, n->names[i]);
        if (elem == NULL) {
            goto done;
        }
        /* process_runtime_tangent(elem, attr_meta): a plain inner tensor */
        PyObject *new_elem = NULL, *elem_leaves = NULL;
        const tangent_plan *a = &n->attrs[i];
        if (Py_IS_TYPE(elem, st->Tensor) && a->kind != TANGENT_PYTHON) {
            new_elem = process_tangent(self, a, elem);
        }
        else {
            PyObject *argv[2] = {elem, a->meta};
            PyObject *pair = PyObject_Vectorcall(st->process_runtime_tangent, argv, 2, NULL);
            if (pair != NULL) {
                new_elem = PySequence_GetItem(pair, 0);
                elem_leaves = new_elem ? PySequence_GetItem(pair, 1) : NULL;
                if (new_elem != NULL && elem_leaves == NULL) {
                    Py_CLEAR(new_elem);
                }
                Py_DECREF(pair);
            }
        }
        if (new_elem == NULL) {
            Py_DECREF(elem);
            goto done;
        }
        int err = 0;
        if (new_elem != elem) {  /* setattr(x, attr, new_elem) */
            err = PyObject_SetAttr(cur, n->names[i], new_elem);
        }
        if (!err) {
            if (elem_leaves == NULL) {
                err = PyList_Append(list, new_elem);
            }
            else {  /* leaves.extend(elem_leaves) */
                PyObject *l = PySequence_List(elem_leaves);
                Py_ssize_t m = PyList_GET_SIZE(list);
                err = l ? PyList_SetSlice(list, m, m, l) : -1;
                Py_XDECREF(l);
            }
        }
        Py_DECREF(elem);
        Py_DECREF(new_elem);
        Py_XDECREF(elem_leaves);
        if (err) {
            goto done;
        }
    }
    rc = 1;
done:
    if (rc == 1) {
        *out = cur;
        *leaves = list;
    }
    else {
        Py_DECREF(cur);
        Py_XDECREF(list);
    }
    Py_DECREF(runtime_meta);
    Py_XDECREF(keys);
    return rc;
}

/* With a subclass graph, the prologue's
 *     _fpt = list(chain(process_runtime_tangent(t, m, idx, ...)[1] for ...))
 * one tangent at a time: its leaves appended to fpt. A plain tensor (and a
 * non-tensor) is its own one leaf, coerced as in process_tangent; a subclass
 * tangent goes through upstream's process_runtime_tangent, whose leaves are
 * its (coerced) inner tensors. */
static int
append_tangent_leaves(CompiledBackward *self, const tangent_plan *t, PyObject *x,
                      PyObject *fpt)
{
    rt_state *st = self->st;
    if (Py_IS_TYPE(x, st->Tensor) && t->kind != TANGENT_PYTHON) {
        PyObject *leaf = process_tangent(self, t, x);
        if (leaf == NULL) {
            return -1;
        }
        int rc = PyList_Append(fpt, leaf);
        Py_DECREF(leaf);
        return rc;
    }
    if (!Py_IS_TYPE(x, st->Tensor)) {
        int is_tensor = rt_is_tensor(st, x);
        if (is_tensor < 0) {
            return -1;
        }
        if (!is_tensor) {
            return PyList_Append(fpt, x);  /* (x, [x]) */
        }
    }
    if (t->sub != NULL) {
        PyObject *out = NULL, *sub_leaves = NULL;
        int taken = subclass_tangent_leaves(self, t, x, &out, &sub_leaves);
        if (taken < 0) {
            return -1;
        }
        if (taken) {
            Py_DECREF(out);
            Py_ssize_t m = PyList_GET_SIZE(fpt);
            int rc = PyList_SetSlice(fpt, m, m, sub_leaves);
            Py_DECREF(sub_leaves);
            return rc;
        }
    }
    PyObject *argv[6] = {x, t->meta, t->index, t->desc, self->compile_id, t->stack_trace};
    PyObject *pair = PyObject_Vectorcall(st->process_runtime_tangent, argv,
                                         self->tangent_context_args ? 6 : 2, NULL);
    if (pair == NULL) {
        return -1;
    }
    PyObject *leaves = PySequence_GetItem(pair, 1);
    Py_DECREF(pair);
    if (leaves == NULL) {
        return -1;
    }
    /* chain.from_iterable then list(): any iterable of leaves */
    PyObject *list = PySequence_List(leaves);
    Py_DECREF(leaves);
    if (list == NULL) {
        return -1;
    }
    Py_ssize_t n = PyList_GET_SIZE(fpt);
    int rc = PyList_SetSlice(fpt, n, n, list);
    Py_DECREF(list);
    return rc;
}

/* list.extend(seq) for a borrowed sequence */
static int
extend(PyObject *list, PyObject *seq)
{
    return PyList_SetSlice(list, PY_SSIZE_T_MAX, PY_SSIZE_T_MAX, seq);
}

/* _codegen_backward_prologue's _backward_prologue: all_args for the
 * compiled backward, with the grads list cleared. */
static PyObject *
backward_prologue(CompiledBackward *self, PyObject *saved, PyObject *symints,
                  PyObject *opaque, PyObject *grads)
{
    rt_state *st = self->st;
    int in_transform = rt_functorch_interpreter_active(st);
    if (in_transform < 0) {
        return NULL;
    }
    if (in_transform) {
        raise_runtime("It looks like you're trying to call a compiled backward function "
                      "within vmap/grad/vjp, which isn't supported. Try wrapping vmap "
                      "inside torch.compile, or skip compiling the backward function.");
        return NULL;
    }
    if (self->check_deterministic) {
        int on = rt_call_predicate(st->deterministic_enabled);
        if (on != 0) {
            if (on > 0) {
                raise_runtime("This compiled backward function is being run with "
                              "torch.use_deterministic_algorithms(True), but it was "
                              "previously generated during the forward function while "
                              "torch.use_deterministic_algorithms(False) was set.");
            }
            return NULL;
        }
    }
    Py_ssize_t n_grads = PyList_GET_SIZE(grads);
    if (n_grads != self->expected_grad_outs) {
        PyErr_Format(PyExc_AssertionError, "expected %zd grad_outs, got %zd",
                     self->expected_grad_outs, n_grads);
        return NULL;
    }
    /* [*symints, *saved, *opaque, *surviving grads, *tokens], allocated
     * once; PySequence_Fast is what list.extend's slice assignment uses */
    PyObject *parts[3] = {NULL, NULL, NULL};
    PyObject *all_args = NULL;
    Py_ssize_t ts = 0;
    for (int p = 0; p < 3; p++) {
        parts[p] = PySequence_Fast(p == 0 ? symints : p == 1 ? saved : opaque,
                                   "can only assign an iterable");
        if (parts[p] == NULL) {
            goto fail;
        }
        ts += PySequence_Fast_GET_SIZE(parts[p]);
    }
    all_args = PyList_New(ts + self->n_surviving + self->num_backward_tokens);
    if (all_args == NULL) {
        goto fail;
    }
    Py_ssize_t at = 0;
    for (int p = 0; p < 3; p++) {
        PyObject **items = PySequence_Fast_ITEMS(parts[p]);
        for (Py_ssize_t i = 0; i < PySequence_Fast_GET_SIZE(parts[p]); i++) {
            PyList_SET_ITEM(all_args, at++, Py_NewRef(items[i]));
        }
        Py_CLEAR(parts[p]);
    }
    for (Py_ssize_t j = 0; j < self->n_surviving; j++) {
        PyList_SET_ITEM(all_args, at++, Py_NewRef(PyList_GET_ITEM(grads, self->surviving[j])));
    }
    for (Py_ssize_t k = 0; k < self->num_backward_tokens; k++) {
        PyList_SET_ITEM(all_args, at++, Py_NewRef(Py_None));
    }
    /* The grads are ours now: let dropped ones die mid-backward. */
    if (PyList_SetSlice(grads, 0, PyList_GET_SIZE(grads), NULL) < 0) {
        goto fail;
    }
    if (self->subclass_tangents) {
        /* all_args = list(all_args[:_ts]) + _fpt + list(all_args[_te:]); the
         * tangent count was checked against the metas at build */
        PyObject *fpt = PyList_New(0);
        if (fpt == NULL) {
            goto fail;
        }
        for (Py_ssize_t j = 0; j < self->n_surviving; j++) {
            PyObject *x = Py_NewRef(PyList_GET_ITEM(all_args, ts + j));
            int rc = append_tangent_leaves(self, &self->tangents[j], x, fpt);
            Py_DECREF(x);
            if (rc < 0) {
                Py_DECREF(fpt);
                goto fail;
            }
        }
        int rc = PyList_SetSlice(all_args, ts, ts + self->n_surviving, fpt);
        Py_DECREF(fpt);
        if (rc < 0) {
            goto fail;
        }
    }
    for (Py_ssize_t j = 0; !self->subclass_tangents && j < self->n_surviving; j++) {
        PyObject *x = PyList_GET_ITEM(all_args, ts + j);
        Py_INCREF(x);
        PyObject *processed = process_tangent(self, &self->tangents[j], x);
        Py_DECREF(x);
        if (processed == NULL || PyList_SetItem(all_args, ts + j, processed) < 0) {
            goto fail;
        }
    }
    if (self->has_mutations_in_bw) {
        int grad = rt_grad_enabled(st);
        if (grad != 0) {
            if (grad > 0) {
                raise_runtime("aot_autograd does not support input mutations with "
                              "requires_grad in backward for create_graph=True");
            }
            goto fail;
        }
    }
    return all_args;
fail:
    for (int p = 0; p < 3; p++) {
        Py_XDECREF(parts[p]);
    }
    Py_XDECREF(all_args);
    return NULL;
}

/* _backward_impl (2.14), just before the compiled backward runs:
 *     for idx, obj in getattr(ctx, "_external_objects", {}).items():
 *         index_to_external_object_weakref[idx] = weakref.ref(obj)
 * 2.15 (by_setter): the loop body is set_external_object_by_index(idx, obj),
 * the runtime_wrappers global: graph_bytecode_inputs' function, which keeps
 * a strong reference (keep_alive) and writes that module's current list
 * (AssertionError for an index past its end), whatever it raises passed on. */
static int
restore_external_objects(rt_state *st, PyObject *ctx, bool by_setter)
{
    PyObject *saved = rt_ctx_get(st, ctx, RT_CTX_EXTERNAL_OBJECTS);
    if (saved == NULL) {
        if (!PyErr_ExceptionMatches(PyExc_AttributeError)) {
            return -1;
        }
        PyErr_Clear(); /* the getattr default, {} */
        return 0;
    }
    if (PyDict_CheckExact(saved) && PyDict_GET_SIZE(saved) == 0) {
        Py_DECREF(saved);
        return 0;
    }
    PyObject *items = PyObject_CallMethod(saved, "items", NULL);
    Py_DECREF(saved);
    PyObject *it = items ? PyObject_GetIter(items) : NULL;
    Py_XDECREF(items);
    if (it == NULL) {
        return -1;
    }
    PyObject *item;
    int rc = 0;
    while (rc == 0 && (item = PyIter_Next(it)) != NULL) {
        PyObject *pair = PySequence_Fast(item, "cannot unpack non-iterable object");
        Py_DECREF(item);
        if (pair == NULL) {
            rc = -1;
            break;
        }
        if (PySequence_Fast_GET_SIZE(pair) != 2) {
            Py_ssize_t got = PySequence_Fast_GET_SIZE(pair);
            if (got < 2) {
                PyErr_Format(PyExc_ValueError,
                             "not enough values to unpack (expected 2, got %zd)", got);
            }
            else {
                PyErr_SetString(PyExc_ValueError, "too many values to unpack (expected 2)");
            }
            Py_DECREF(pair);
            rc = -1;
            break;
        }
        if (by_setter) {
            /* the pair (held) keeps idx and obj alive through the call */
            PyObject *r = PyObject_Vectorcall(st->set_external_object,
                                              PySequence_Fast_ITEMS(pair), 2, NULL);
            rc = r != NULL ? 0 : -1;
            Py_XDECREF(r);
        }
        else {
            PyObject *ref = PyObject_CallOneArg(st->weakref_ref,
                                                PySequence_Fast_GET_ITEM(pair, 1));
            rc = ref ? PyObject_SetItem(st->external_objects,
                                        PySequence_Fast_GET_ITEM(pair, 0), ref)
                     : -1;
            Py_XDECREF(ref);
        }
        Py_DECREF(pair);
    }
    Py_DECREF(it);
    return rc == 0 && PyErr_Occurred() ? -1 : rc;
}

/* compiled's _boxed_call, as getattr(compiled, "_boxed_call", False) */
static int
is_boxed_call(rt_state *st, PyObject *compiled)
{
    PyObject *boxed = PyObject_GetAttr(compiled, st->str_boxed_call);
    if (boxed == NULL) {
        if (!PyErr_ExceptionMatches(PyExc_AttributeError)) {
            return -1;
        }
        PyErr_Clear();
        return 0;
    }
    int is_boxed = PyObject_IsTrue(boxed);
    Py_DECREF(boxed);
    return is_boxed;
}

/* self->compiled_bw := compiled (a new reference, taken), its boxedness
 * read, wrapped in the C version of its torch._dynamo.disable wrapper where
 * it has one (cls.compiled_bw stays upstream's object) */
static int
set_compiled_bw(CompiledBackward *self, PyObject *compiled)
{
    int is_boxed = is_boxed_call(self->st, compiled);
    if (is_boxed < 0) {
        Py_DECREF(compiled);
        return -1;
    }
    self->compiled_bw_boxed = is_boxed;
    self->compiled_bw_seen = compiled;
    Py_SETREF(compiled, rt_disable_wrapper_for(self->st, compiled));
    if (compiled == NULL) {
        self->compiled_bw_seen = NULL;
        Py_CLEAR(self->compiled_bw);
        return -1;
    }
    Py_XSETREF(self->compiled_bw, compiled);
    return 0;
}

static PyObject *backward_call(CompiledBackward *self, PyObject *ctx, PyObject *all_args);

/* CompiledFunction._backward_impl + the generated _backward_epilogue
 * (_backward_epilogue_functional on 2.11/2.12). */
static PyObject *
backward_impl(CompiledBackward *self, PyObject *ctx, PyObject *all_args)
{
    PyObject *out = backward_call(self, ctx, all_args);
    if (out == NULL) {
        return NULL;
    }
    if (self->num_backward_tokens > 0) {
        Py_ssize_t keep = PyList_GET_SIZE(out) - self->num_backward_tokens;
        Py_SETREF(out, PyList_GetSlice(out, 0, keep < 0 ? 0 : keep));
        if (out == NULL) {
            return NULL;
        }
    }
    Py_SETREF(out, PyList_AsTuple(out));
    if (out != NULL && self->grads_wrapper != NULL) {
        /* _backward_epilogue: `return _wrap_(out)` (make_subclass_override is
         * None on this path) */
        Py_SETREF(out, PyObject_Vectorcall(self->grads_wrapper, &out, 1, NULL));
    }
    return out;
}

/* CompiledFunction._backward_impl: the compiled backward's outputs, a list. */
static PyObject *
backward_call(CompiledBackward *self, PyObject *ctx, PyObject *all_args)
{
    rt_state *st = self->st;
    if (self->has_backward_state) {
        PyErr_SetString(PyExc_AssertionError, "BackwardState requires CompiledAutograd");
        return NULL;
    }
    if (self->lazy_backward_impl != NULL) {
        /* 2.11: `if CompiledFunction.compiled_bw is None:` the lazy compile
         * inline in upstream's _backward_impl, reading the class attribute
         * on every call. A call that finds it None runs that function, which
         * does every step below itself (clears the saved tensors, compiles,
         * checks donated buffers, calls it): exactly upstream's. */
        PyObject *current = PyObject_GetAttr(self->cls, st->str_compiled_bw);
        if (current == NULL) {
            return NULL;
        }
        if (current == Py_None) {
            Py_DECREF(current);
            PyObject *argv[2] = {ctx, all_args};
            return rt_as_list(PyObject_Vectorcall(self->lazy_backward_impl, argv, 2, NULL));
        }
        if (current != self->compiled_bw_seen) {
            if (set_compiled_bw(self, current) < 0) {
                return NULL;
            }
        }
        else {
            Py_DECREF(current);
        }
    }
    /* ctx.maybe_clear_saved_tensors(): _FunctionBase's, or the C++ node's */
    if (rt_is_cpp_node(st, ctx)) {
        if (st->cpp_loaded->node_maybe_clear_saved(ctx) < 0) {
            return NULL;
        }
    }
    else {
        PyObject *r = PyObject_Vectorcall(st->maybe_clear_saved_tensors, &ctx, 1, NULL);
        if (r == NULL) {
            return NULL;
        }
        Py_DECREF(r);
    }
    int keep_graph = rt_graph_task_keep_graph(st);
    if (keep_graph < 0) {
        return NULL;
    }
    if (self->compiled_bw == NULL) {
        /* The lazy backward compile, exactly upstream's (DDP buckets and
         * donated buffers included): backward_compiler.get_or_compile. */
        PyObject *argv[2] = {self->backward_compiler, keep_graph ? Py_False : Py_True};
        PyObject *compiled = PyObject_VectorcallMethod(st->str_get_or_compile, argv,
                                                       1,
                                                       st->kwnames_use_once);
        if (compiled == NULL) {
            return NULL;
        }
        if (PyObject_SetAttr(self->cls, st->str_compiled_bw, compiled) < 0) {
            Py_DECREF(compiled);
            return NULL;
        }
        if (set_compiled_bw(self, compiled) < 0) {
            return NULL;
        }
    }
    else if (self->lazy_backward_impl == NULL) {
        /* `CompiledFunction.compiled_bw = compiled_bw` after every
         * get_or_compile (2.12 on): put it back where something replaced it
         * (setting the same object again is not observable) */
        PyObject *current = PyObject_GetAttr(self->cls, st->str_compiled_bw);
        if (current == NULL) {
            return NULL;
        }
        int same = current == self->compiled_bw_seen;
        Py_DECREF(current);
        if (!same &&
            PyObject_SetAttr(self->cls, st->str_compiled_bw, self->compiled_bw_seen) < 0) {
            return NULL;
        }
    }
    if (keep_graph) {
        /* donated buffers need saved tensors used once */
        PyObject *donated = rt_config_read(st, st->functorch_config, st->str_donated_buffer);
        int on = donated ? PyObject_IsTrue(donated) : -1;
        Py_XDECREF(donated);
        if (on > 0) {
            PyObject *idxs = PyObject_GetAttr(self->fw_metadata, st->str_bw_donated_idxs);
            PyObject *empty = idxs ? PyList_New(0) : NULL;
            on = empty ? PyObject_RichCompareBool(idxs, empty, Py_NE) : -1;
            Py_XDECREF(idxs);
            Py_XDECREF(empty);
            if (on > 0) {
                raise_runtime(
                    "This backward function was compiled with non-empty donated buffers "
                    "which requires create_graph=False and retain_graph=False. Please keep "
                    "backward(create_graph=False, retain_graph=False) across all backward() "
                    "function calls, or set torch._functorch.config.donated_buffer=False to "
                    "disable donated buffer.");
                return NULL;
            }
        }
        if (on < 0) {
            return NULL;
        }
    }
    if (self->restore_external_objects &&
        restore_external_objects(st, ctx, self->restore_by_setter) < 0) {
        return NULL;
    }
    PyObject *compiled_bw = Py_NewRef(self->compiled_bw);
    PyObject *out;
    if (self->compiled_bw_boxed) {
        out = rt_call_boxed(st, compiled_bw, all_args, self->disable_amp);
    }
    else {
        /* an unboxed compiler: upstream warns and unpacks; let it */
        PyObject *argv[4] = {compiled_bw, all_args, Py_True,
                             self->disable_amp ? Py_True : Py_False};
        out = rt_as_list(PyObject_Vectorcall(st->call_func_at_runtime, argv, 2,
                                          st->kwnames_steal_disable_amp));
    }
    Py_DECREF(compiled_bw);
    return out;
}

static PyObject *
thunk_new(CompiledBackward *self, PyObject *ctx, PyObject *all_args);

static PyObject *
CompiledBackward_vectorcall(PyObject *op, PyObject *const *argv, size_t nargsf,
                            PyObject *kwnames)
{
    CompiledBackward *self = (CompiledBackward *)op;
    rt_state *st = self->st;
    Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
    PyObject *ctx, *grads, *flat_args = NULL;
    if (self->boxed_grads) {
        if (nargs != 2 || kwnames != NULL || !PyList_Check(argv[1])) {
            /* Not the boxed call autograd makes: upstream's backward binds the
             * arguments and raises its own errors ("expects grads as a single
             * mutable list", missing ctx, ...). */
            return PyObject_Vectorcall(self->upstream, argv, nargsf, kwnames);
        }
        ctx = argv[0];
        grads = Py_NewRef(argv[1]);
    }
    else {
        /* 2.11/2.12: backward(ctx, *flat_args), as BackwardCFunction.apply
         * calls it; anything else is bound (and refused) by upstream's. The
         * grads stay referenced as upstream's frame references them until
         * the backward returns: up to 3.11 by the caller's argument tuple and
         * the callee's *flat_args, here argv's and the tuple flat_args; from
         * 3.12 by one tuple, here argv's (py_compat.h); the prologue reads
         * them from a list of our own, which it clears. */
        if (nargs < 1 || kwnames != NULL) {
            return PyObject_Vectorcall(self->upstream, argv, nargsf, kwnames);
        }
        ctx = argv[0];
        if (RT_PY_VARARGS_CALL_KEEPS_CALLER_TUPLE) {
            flat_args = PyTuple_New(nargs - 1);
            if (flat_args == NULL) {
                return NULL;
            }
            for (Py_ssize_t i = 1; i < nargs; i++) {
                PyTuple_SET_ITEM(flat_args, i - 1, Py_NewRef(argv[i]));
            }
        }
        grads = PyList_New(nargs - 1);
        if (grads == NULL) {
            Py_XDECREF(flat_args);
            return NULL;
        }
        for (Py_ssize_t i = 1; i < nargs; i++) {
            PyList_SET_ITEM(grads, i - 1, Py_NewRef(argv[i]));
        }
    }
    PyObject *saved = NULL, *symints = NULL, *opaque = NULL, *all_args = NULL;
    PyObject *result = NULL, *impl_fn = NULL, *cc = NULL;

    saved = rt_ctx_get(st, ctx, RT_CTX_SAVED_TENSORS);
    if (saved == NULL) {
        goto done;
    }
    if (self->has_no_vc_check) {
        PyObject *no_vc = rt_ctx_get(st, ctx, RT_CTX_TENSORS_NO_VC_CHECK);
        PyObject *both = no_vc ? PySequence_List(saved) : NULL;
        if (both == NULL || extend(both, no_vc) < 0) {
            Py_XDECREF(no_vc);
            Py_XDECREF(both);
            goto done;
        }
        Py_DECREF(no_vc);
        Py_SETREF(saved, both);
    }
    if ((symints = rt_ctx_get(st, ctx, RT_CTX_SYMINTS)) == NULL ||
        (opaque = rt_ctx_get(st, ctx, RT_CTX_OPAQUE_OBJECTS)) == NULL) {
        goto done;
    }
    all_args = backward_prologue(self, saved, symints, opaque, grads);
    Py_CLEAR(saved); /* del _saved */
    if (all_args == NULL) {
        goto done;
    }
    if (self->rng_add != NULL) {
        PyObject *cargs[2] = {ctx, all_args};
        PyObject *r = PyObject_Vectorcall(self->rng_add, cargs, 2, NULL);
        if (r == NULL) {
            goto done;
        }
        Py_DECREF(r);
    }
    /* The TLS `context` hook and the double-backward guard need impl_fn as
     * a Python callable. torch.autograd.backward/grad always stash a
     * `context` (_engine_run_backward), so an ordinary backward runs as
     * context.run(impl_fn); only a backward without one (grad_fn called by
     * hand) calls the implementation directly. */
    if (self->tls_context && rt_tls_object(st, st->str_context, &cc) < 0) {
        goto done;
    }
    if (cc == Py_None) {
        Py_CLEAR(cc);
    }
    else if (cc != NULL && self->copy_context) {
        /* functools.partial(_cc.copy().run, impl_fn) */
        Py_SETREF(cc, PyObject_CallMethodNoArgs(cc, st->str_copy));
        if (cc == NULL) {
            goto done;
        }
    }
    int grad = rt_grad_enabled(st);
    if (grad < 0) {
        goto done;
    }
    int need_double = grad;
    if (grad && !self->inputs_require_grad) {
        need_double = 0;
        for (Py_ssize_t i = 0; i < PyList_GET_SIZE(all_args) && !need_double; i++) {
            PyObject *t = PyList_GET_ITEM(all_args, i);
            int is_tensor = rt_is_tensor(st, t);
            if (is_tensor < 0) {
                goto done;
            }
            if (is_tensor) {
                Py_INCREF(t);
                need_double = rt_tensor_requires_grad(st, t);
                Py_DECREF(t);
                if (need_double < 0) {
                    goto done;
                }
            }
        }
    }
    if (cc == NULL && !need_double) {
        result = backward_impl(self, ctx, all_args);
        goto done;
    }
    impl_fn = thunk_new(self, ctx, all_args);
    if (impl_fn == NULL) {
        goto done;
    }
    if (cc != NULL && !need_double) {
        /* functools.partial(cc.run, impl_fn)() is cc.run(impl_fn) */
        PyObject *cargs[2] = {cc, impl_fn};
        result = PyObject_VectorcallMethod(st->str_run, cargs, 2, NULL);
        goto done;
    }
    if (cc != NULL) {
        /* impl_fn = functools.partial(cc.run, impl_fn) */
        PyObject *run = PyObject_GetAttr(cc, st->str_run);
        if (run == NULL) {
            goto done;
        }
        PyObject *pargs[2] = {run, impl_fn};
        PyObject *wrapped = PyObject_Vectorcall(st->partial, pargs, 2, NULL);
        Py_DECREF(run);
        if (wrapped == NULL) {
            goto done;
        }
        Py_SETREF(impl_fn, wrapped);
    }
    if (need_double) {
        PyObject *dargs[3] = {ctx, impl_fn, all_args};
        result = PyObject_Vectorcall(self->double_backward, dargs, 3, NULL);
    }
    else {
        result = PyObject_CallNoArgs(impl_fn);
    }
done:
    Py_DECREF(grads);
    Py_XDECREF(flat_args);
    Py_XDECREF(saved);
    Py_XDECREF(symints);
    Py_XDECREF(opaque);
    Py_XDECREF(all_args);
    Py_XDECREF(impl_fn);
    Py_XDECREF(cc);
    return result;
}

/* t->size and t->stride as C arrays, where they are tuples of one length
 * holding plain ints that fit an int64 (else t->ndim stays -1) */
static int
tangent_static_layout(tangent_plan *t)
{
    t->ndim = -1;
    if (!PyTuple_Check(t->size) || !PyTuple_Check(t->stride) ||
        PyTuple_GET_SIZE(t->size) != PyTuple_GET_SIZE(t->stride)) {
        return 0;
    }
    Py_ssize_t n = PyTuple_GET_SIZE(t->size);
    int64_t *a = PyMem_Malloc(sizeof(int64_t) * (size_t)(n > 0 ? 2 * n : 1));
    if (a == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    for (Py_ssize_t i = 0; i < 2 * n; i++) {
        PyObject *v = PyTuple_GET_ITEM(i < n ? t->size : t->stride, i < n ? i : i - n);
        int overflow = 0;
        if (!PyLong_CheckExact(v)) {
            PyMem_Free(a);
            return 0;
        }
        long long x = PyLong_AsLongLongAndOverflow(v, &overflow);
        if (overflow) {
            PyMem_Free(a);
            return 0;
        }
        a[i] = (int64_t)x;
    }
    t->sizes = a;
    t->strides = a + n;
    t->ndim = n;
    return 0;
}

/* One (kind, meta, size, stride, memory_format, desc, stack_trace) tangent
 * plan; j is its index among the tangents, or -1 for an inner tensor of a
 * subclass tangent (processed without index, desc or stack trace). */
static int
parse_one_tangent(PyObject *rec, tangent_plan *t, Py_ssize_t j)
{
    if (!PyTuple_Check(rec) || PyTuple_GET_SIZE(rec) != 7 ||
        !PyLong_Check(PyTuple_GET_ITEM(rec, 0))) {
        PyErr_Format(PyExc_ValueError, "plan: tangents[%zd] must be a 7-tuple", j);
        return -1;
    }
    t->kind = (int)PyLong_AsLong(PyTuple_GET_ITEM(rec, 0));
    if (t->kind < TANGENT_STRIDES || t->kind > TANGENT_PYTHON) {
        PyErr_Format(PyExc_ValueError, "plan: tangents[%zd] has unknown kind", j);
        return -1;
    }
    t->meta = Py_NewRef(PyTuple_GET_ITEM(rec, 1));
    t->size = Py_NewRef(PyTuple_GET_ITEM(rec, 2));
    t->stride = Py_NewRef(PyTuple_GET_ITEM(rec, 3));
    t->memory_format = Py_NewRef(PyTuple_GET_ITEM(rec, 4));
    t->desc = Py_NewRef(j < 0 ? Py_None : PyTuple_GET_ITEM(rec, 5));
    t->stack_trace = Py_NewRef(j < 0 ? Py_None : PyTuple_GET_ITEM(rec, 6));
    t->ndim = -1;
    if (t->kind == TANGENT_STRIDES && tangent_static_layout(t) < 0) {
        return -1;
    }
    t->index = j < 0 ? NULL : PyLong_FromSsize_t(j);
    return j < 0 || t->index != NULL ? 0 : -1;
}

static void tangent_plan_clear(tangent_plan *t);

static void
subclass_tangent_free(subclass_tangent *n)
{
    if (n == NULL) {
        return;
    }
    Py_CLEAR(n->type);
    Py_CLEAR(n->flat_meta);
    Py_CLEAR(n->memory_format);
    Py_CLEAR(n->is_fake);
    for (Py_ssize_t i = 0; i < n->n_attrs; i++) {
        if (n->names) {
            Py_CLEAR(n->names[i]);
        }
        if (n->attrs) {
            tangent_plan_clear(&n->attrs[i]);
            PyMem_Free(n->attrs[i].sizes);
        }
    }
    PyMem_Free(n->names);
    PyMem_Free(n->attrs);
    PyMem_Free(n);
}

static void
tangent_plan_clear(tangent_plan *t)
{
    Py_CLEAR(t->meta);
    Py_CLEAR(t->size);
    Py_CLEAR(t->stride);
    Py_CLEAR(t->memory_format);
    Py_CLEAR(t->desc);
    Py_CLEAR(t->stack_trace);
    Py_CLEAR(t->index);
    subclass_tangent_free(t->sub);
    t->sub = NULL;
}

static int
tangent_plan_traverse(tangent_plan *t, visitproc visit, void *arg)
{
    Py_VISIT(t->meta);
    Py_VISIT(t->size);
    Py_VISIT(t->stride);
    Py_VISIT(t->memory_format);
    Py_VISIT(t->desc);
    Py_VISIT(t->stack_trace);
    if (t->sub != NULL) {
        Py_VISIT(t->sub->type);
        Py_VISIT(t->sub->flat_meta);
        Py_VISIT(t->sub->memory_format);
        Py_VISIT(t->sub->is_fake);
        for (Py_ssize_t i = 0; i < t->sub->n_attrs; i++) {
            int rc = tangent_plan_traverse(&t->sub->attrs[i], visit, arg);
            if (rc) {
                return rc;
            }
        }
    }
    return 0;
}

/* subclass_tangent_nodes: per tangent None, or (type, flatten meta, memory
 * format, is_fake or None, ((attr name, inner plan), ...)) */
static int
parse_subclass_nodes(CompiledBackward *self, PyObject *kwargs)
{
    PyObject *v = rt_plan_required(kwargs, "subclass_tangent_nodes");
    if (v == NULL) {
        return -1;
    }
    if (!PyTuple_Check(v) || PyTuple_GET_SIZE(v) != self->n_surviving) {
        PyErr_SetString(PyExc_ValueError,
                        "plan: subclass_tangent_nodes must have one entry per tangent");
        return -1;
    }
    for (Py_ssize_t j = 0; j < self->n_surviving; j++) {
        PyObject *rec = PyTuple_GET_ITEM(v, j);
        if (rec == Py_None) {
            continue;
        }
        PyObject *attrs;
        if (!self->subclass_tangents || !PyTuple_Check(rec) || PyTuple_GET_SIZE(rec) != 5 ||
            !PyType_Check(PyTuple_GET_ITEM(rec, 0)) ||
            !PyTuple_Check(attrs = PyTuple_GET_ITEM(rec, 4))) {
            PyErr_Format(PyExc_ValueError, "plan: subclass_tangent_nodes[%zd] is malformed", j);
            return -1;
        }
        subclass_tangent *n = PyMem_Calloc(1, sizeof(subclass_tangent));
        if (n == NULL) {
            PyErr_NoMemory();
            return -1;
        }
        self->tangents[j].sub = n;
        n->type = Py_NewRef(PyTuple_GET_ITEM(rec, 0));
        n->flat_meta = Py_NewRef(PyTuple_GET_ITEM(rec, 1));
        n->memory_format = Py_NewRef(PyTuple_GET_ITEM(rec, 2));
        PyObject *fake = PyTuple_GET_ITEM(rec, 3);
        n->is_fake = fake == Py_None ? NULL : Py_NewRef(fake);
        Py_ssize_t m = PyTuple_GET_SIZE(attrs);
        n->names = PyMem_Calloc(m ? (size_t)m : 1, sizeof(PyObject *));
        n->attrs = PyMem_Calloc(m ? (size_t)m : 1, sizeof(tangent_plan));
        if (n->names == NULL || n->attrs == NULL) {
            PyErr_NoMemory();
            return -1;
        }
        n->n_attrs = m;
        for (Py_ssize_t i = 0; i < m; i++) {
            PyObject *pair = PyTuple_GET_ITEM(attrs, i);
            if (!PyTuple_Check(pair) || PyTuple_GET_SIZE(pair) != 2 ||
                !PyUnicode_Check(PyTuple_GET_ITEM(pair, 0))) {
                PyErr_Format(PyExc_ValueError, "plan: subclass_tangent_nodes[%zd] attr %zd", j,
                             i);
                return -1;
            }
            n->names[i] = Py_NewRef(PyTuple_GET_ITEM(pair, 0));
            if (parse_one_tangent(PyTuple_GET_ITEM(pair, 1), &n->attrs[i], -1) < 0) {
                return -1;
            }
            if (n->attrs[i].kind == TANGENT_PYTHON) {
                PyErr_SetString(PyExc_ValueError,
                                "plan: an inner tangent plan must be a plain one");
                return -1;
            }
        }
    }
    return 0;
}

static int
parse_tangents(CompiledBackward *self, PyObject *kwargs)
{
    PyObject *v = rt_plan_required(kwargs, "tangents");
    if (v == NULL) {
        return -1;
    }
    if (!PyTuple_Check(v) || PyTuple_GET_SIZE(v) != self->n_surviving) {
        PyErr_Format(PyExc_ValueError, "plan: tangents must be a tuple of %zd entries",
                     self->n_surviving);
        return -1;
    }
    self->tangents = PyMem_Calloc(self->n_surviving ? self->n_surviving : 1,
                                  sizeof(tangent_plan));
    if (self->tangents == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    for (Py_ssize_t j = 0; j < self->n_surviving; j++) {
        if (parse_one_tangent(PyTuple_GET_ITEM(v, j), &self->tangents[j], j) < 0) {
            return -1;
        }
    }
    return 0;
}

static PyObject *
CompiledBackward_new(PyTypeObject *type, PyObject *args, PyObject *kwargs)
{
    if (PyTuple_GET_SIZE(args) != 0) {
        PyErr_SetString(PyExc_TypeError, "CompiledBackward takes keyword arguments only");
        return NULL;
    }
    CompiledBackward *self = (CompiledBackward *)rt_fn_alloc(type, CompiledBackward_vectorcall);
    if (self == NULL) {
        return NULL;
    }
    int err = 0;
    PyObject *v;
    bool b[12];
    if ((self->upstream = rt_callable_or_null(kwargs, "upstream", &err)) == NULL) {
        if (!err) {
            PyErr_SetString(PyExc_ValueError, "plan: upstream must be callable");
        }
        goto fail;
    }
    if ((v = rt_plan_required(kwargs, "cls")) == NULL) {
        goto fail;
    }
    self->cls = Py_NewRef(v);
    if ((self->double_backward = PyObject_GetAttrString(v, "_double_backward")) == NULL) {
        goto fail;
    }
    if ((v = rt_plan_required(kwargs, "backward_compiler")) == NULL) {
        goto fail;
    }
    self->backward_compiler = Py_NewRef(v);
    self->lazy_backward_impl = rt_callable_or_null(kwargs, "lazy_backward_impl", &err);
    if (err) {
        goto fail;
    }
    if ((self->lazy_backward_impl != NULL) != (self->backward_compiler == Py_None)) {
        PyErr_SetString(PyExc_ValueError,
                        "plan: lazy_backward_impl goes with backward_compiler None");
        goto fail;
    }
    if ((v = rt_plan_required(kwargs, "fw_metadata")) == NULL) {
        goto fail;
    }
    self->fw_metadata = Py_NewRef(v);
    if ((v = rt_plan_required(kwargs, "compile_id")) == NULL) {
        goto fail;
    }
    self->compile_id = Py_NewRef(v);
    self->rng_add = rt_callable_or_null(kwargs, "rng_add_backward_args", &err);
    if (err || rt_plan_bool(kwargs, "disable_amp", &b[0]) < 0 ||
        rt_plan_bool(kwargs, "has_backward_state", &b[1]) < 0 ||
        rt_plan_bool(kwargs, "check_deterministic", &b[2]) < 0 ||
        rt_plan_bool(kwargs, "has_mutations_in_bw", &b[3]) < 0 ||
        rt_plan_bool(kwargs, "inputs_require_grad", &b[4]) < 0 ||
        rt_plan_bool(kwargs, "has_no_vc_check", &b[5]) < 0 ||
        rt_plan_bool(kwargs, "restore_external_objects", &b[6]) < 0 ||
        rt_plan_bool(kwargs, "copy_context", &b[7]) < 0 ||
        rt_plan_bool(kwargs, "restore_by_setter", &b[8]) < 0 ||
        rt_plan_bool(kwargs, "boxed_grads", &b[9]) < 0 ||
        rt_plan_bool(kwargs, "tls_context", &b[10]) < 0 ||
        rt_plan_bool(kwargs, "tangent_context_args", &b[11]) < 0 ||
        (v = rt_plan_required(kwargs, "expected_grad_outs")) == NULL ||
        rt_index_or_none(v, "expected_grad_outs", &self->expected_grad_outs) < 0 ||
        (v = rt_plan_required(kwargs, "num_backward_tokens")) == NULL ||
        rt_index_or_none(v, "num_backward_tokens", &self->num_backward_tokens) < 0 ||
        rt_plan_indices(kwargs, "surviving", &self->n_surviving, &self->surviving) < 0) {
        goto fail;
    }
    self->disable_amp = b[0];
    self->has_backward_state = b[1];
    self->check_deterministic = b[2];
    self->has_mutations_in_bw = b[3];
    self->inputs_require_grad = b[4];
    self->has_no_vc_check = b[5];
    self->restore_external_objects = b[6];
    self->copy_context = b[7];
    self->restore_by_setter = b[8];
    self->boxed_grads = b[9];
    self->tls_context = b[10];
    self->tangent_context_args = b[11];
    if (self->restore_external_objects && self->st->external_objects == NULL) {
        PyErr_SetString(PyExc_ValueError,
                        "plan: restore_external_objects on a torch bound without the registry");
        goto fail;
    }
    if (self->restore_external_objects &&
        self->restore_by_setter != (self->st->set_external_object != NULL)) {
        PyErr_SetString(PyExc_ValueError,
                        self->restore_by_setter
                            ? "plan: restore_by_setter on a torch bound without the setter"
                            : "plan: restore_by_setter is False, the torch was bound with "
                              "the setter");
        goto fail;
    }
    if (self->expected_grad_outs < 0 || self->num_backward_tokens < 0) {
        PyErr_SetString(PyExc_ValueError, "plan: grad counts must be ints");
        goto fail;
    }
    for (Py_ssize_t j = 0; j < self->n_surviving; j++) {
        if (self->surviving[j] >= self->expected_grad_outs) {
            PyErr_Format(PyExc_ValueError, "plan: surviving grad %zd is not in [0, %zd)",
                         self->surviving[j], self->expected_grad_outs);
            goto fail;
        }
    }
    if (parse_tangents(self, kwargs) < 0) {
        goto fail;
    }
    bool subclass_tangents;
    if (rt_plan_bool(kwargs, "subclass_tangents", &subclass_tangents) < 0) {
        goto fail;
    }
    self->subclass_tangents = subclass_tangents;
    self->grads_wrapper = rt_callable_or_null(kwargs, "grads_wrapper", &err);
    if (err) {
        goto fail;
    }
    if ((self->grads_wrapper != NULL) != self->subclass_tangents) {
        PyErr_SetString(PyExc_ValueError,
                        "plan: grads_wrapper goes with subclass_tangents");
        goto fail;
    }
    if (parse_subclass_nodes(self, kwargs) < 0) {
        goto fail;
    }
    return (PyObject *)self;
fail:
    Py_DECREF(self);
    return NULL;
}

static int
CompiledBackward_traverse(CompiledBackward *self, visitproc visit, void *arg)
{
    Py_VISIT(Py_TYPE(self));
    Py_VISIT(self->module);
    Py_VISIT(self->dict);
    Py_VISIT(self->upstream);
    Py_VISIT(self->cls);
    Py_VISIT(self->double_backward);
    Py_VISIT(self->backward_compiler);
    Py_VISIT(self->lazy_backward_impl);
    Py_VISIT(self->fw_metadata);
    Py_VISIT(self->rng_add);
    Py_VISIT(self->compile_id);
    Py_VISIT(self->compiled_bw);
    Py_VISIT(self->grads_wrapper);
    if (self->tangents) {
        for (Py_ssize_t j = 0; j < self->n_surviving; j++) {
            int rc = tangent_plan_traverse(&self->tangents[j], visit, arg);
            if (rc) {
                return rc;
            }
        }
    }
    return 0;
}

static int
CompiledBackward_clear(CompiledBackward *self)
{
    Py_CLEAR(self->dict);
    Py_CLEAR(self->upstream);
    Py_CLEAR(self->cls);
    Py_CLEAR(self->double_backward);
    Py_CLEAR(self->backward_compiler);
    Py_CLEAR(self->lazy_backward_impl);
    Py_CLEAR(self->fw_metadata);
    Py_CLEAR(self->rng_add);
    Py_CLEAR(self->compile_id);
    self->compiled_bw_seen = NULL;
    Py_CLEAR(self->compiled_bw);
    Py_CLEAR(self->grads_wrapper);
    if (self->tangents) {
        for (Py_ssize_t j = 0; j < self->n_surviving; j++) {
            tangent_plan_clear(&self->tangents[j]);
        }
    }
    return 0;
}

static void
CompiledBackward_free_arrays(CompiledBackward *self)
{
    PyMem_Free(self->surviving);
    if (self->tangents) {
        for (Py_ssize_t j = 0; j < self->n_surviving; j++) {
            PyMem_Free(self->tangents[j].sizes); /* strides share the block */
        }
    }
    PyMem_Free(self->tangents);
}

/* ---- BackwardThunk: impl_fn(double_ctx=None) ---------------------------- */

static PyObject *
BackwardThunk_vectorcall(PyObject *op, PyObject *const *argv, size_t nargsf,
                         PyObject *kwnames)
{
    BackwardThunk *self = (BackwardThunk *)op;
    (void)argv; /* double_ctx is accepted and unused, as upstream's impl_fn */
    Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
    Py_ssize_t nkw = kwnames ? PyTuple_GET_SIZE(kwnames) : 0;
    if (nargs + nkw > 1 ||
        (nkw == 1 && PyUnicode_CompareWithASCIIString(PyTuple_GET_ITEM(kwnames, 0),
                                                      "double_ctx") != 0)) {
        PyErr_SetString(PyExc_TypeError, "impl_fn() takes one optional argument, double_ctx");
        return NULL;
    }
    return backward_impl((CompiledBackward *)self->backward, self->ctx, self->all_args);
}

static PyObject *
thunk_new(CompiledBackward *backward, PyObject *ctx, PyObject *all_args)
{
    PyTypeObject *type = backward->st->BackwardThunkType;
    BackwardThunk *self = (BackwardThunk *)type->tp_alloc(type, 0);
    if (self == NULL) {
        return NULL;
    }
    self->vectorcall = BackwardThunk_vectorcall;
    self->backward = Py_NewRef((PyObject *)backward);
    self->ctx = Py_NewRef(ctx);
    self->all_args = Py_NewRef(all_args);
    return (PyObject *)self;
}

static int
BackwardThunk_traverse(BackwardThunk *self, visitproc visit, void *arg)
{
    Py_VISIT(Py_TYPE(self));
    Py_VISIT(self->backward);
    Py_VISIT(self->ctx);
    Py_VISIT(self->all_args);
    return 0;
}

static int
BackwardThunk_clear(BackwardThunk *self)
{
    Py_CLEAR(self->backward);
    Py_CLEAR(self->ctx);
    Py_CLEAR(self->all_args);
    return 0;
}

DEFINE_DEALLOC(CompiledBackward, CompiledBackward_free_arrays(self))
FN_MEMBERS(CompiledBackward)
FN_SPEC(CompiledBackward, "CompiledFunction.backward(ctx, grads) in C (keyword plan).")


static void
BackwardThunk_dealloc(BackwardThunk *self)
{
    PyTypeObject *tp = Py_TYPE(self);
    PyObject_GC_UnTrack(self);
    BackwardThunk_clear(self);
    tp->tp_free(self);
    Py_DECREF(tp);
}

static PyMemberDef BackwardThunk_members[] = {
    {"__vectorcalloffset__", T_PYSSIZET, offsetof(BackwardThunk, vectorcall), READONLY, NULL},
    {NULL, 0, 0, 0, NULL},
};

static PyType_Slot BackwardThunk_slots[] = {
    {Py_tp_dealloc, BackwardThunk_dealloc},
    {Py_tp_traverse, BackwardThunk_traverse},
    {Py_tp_clear, BackwardThunk_clear},
    {Py_tp_call, PyVectorcall_Call},
    {Py_tp_members, BackwardThunk_members},
    {Py_tp_doc, (void *)"impl_fn(double_ctx=None) of one CompiledFunction backward."},
    {0, NULL},
};

PyType_Spec BackwardThunk_spec = {
    .name = "torch_aot_rt._C.BackwardThunk",
    .basicsize = sizeof(BackwardThunk),
    .flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL |
             Py_TPFLAGS_IMMUTABLETYPE | Py_TPFLAGS_DISALLOW_INSTANTIATION,
    .slots = BackwardThunk_slots,
};

/* ======================================================================
 * ApplyBoxed: the backward class's apply_boxed(ctx, grads).
 *
 * The engine calls ctx.apply_boxed(grads) for a boxed_grads_call Function;
 * upstream's (BackwardCFunction.apply_boxed) is `self._get_user_fn()(self,
 * *args)`: the class's backward, unless vjp is overridden too (an error).
 * While the class's backward is still ours and vjp Function's, that is our
 * backward; otherwise upstream's apply_boxed runs, exactly.
 * ====================================================================== */

typedef struct {
    RT_FN_HEAD
    PyObject *backward;       /* the CompiledBackward installed on cls */
    PyObject *cls;            /* CompiledFunction */
    PyObject *default_vjp;    /* Function.vjp */
    PyObject *upstream;       /* BackwardCFunction.apply_boxed */
} ApplyBoxed;

static PyObject *
ApplyBoxed_vectorcall(PyObject *op, PyObject *const *argv, size_t nargsf,
                      PyObject *kwnames)
{
    ApplyBoxed *self = (ApplyBoxed *)op;
    rt_state *st = self->st;
    PyObject *backward = PyObject_GetAttr(self->cls, st->str_backward);
    if (backward == NULL) {
        return NULL;
    }
    PyObject *vjp = PyObject_GetAttr(self->cls, st->str_vjp);
    if (vjp == NULL) {
        Py_DECREF(backward);
        return NULL;
    }
    int ours = backward == self->backward && vjp == self->default_vjp;
    Py_DECREF(backward);
    Py_DECREF(vjp);
    return PyObject_Vectorcall(ours ? self->backward : self->upstream, argv, nargsf, kwnames);
}

static PyObject *
ApplyBoxed_new(PyTypeObject *type, PyObject *args, PyObject *kwargs)
{
    PyObject *backward, *cls, *default_vjp, *upstream;
    if (kwargs != NULL && PyDict_GET_SIZE(kwargs) != 0) {
        PyErr_SetString(PyExc_TypeError, "ApplyBoxed() takes no keyword arguments");
        return NULL;
    }
    if (!PyArg_ParseTuple(args, "OOOO:ApplyBoxed", &backward, &cls, &default_vjp, &upstream)) {
        return NULL;
    }
    ApplyBoxed *self = (ApplyBoxed *)rt_fn_alloc(type, ApplyBoxed_vectorcall);
    if (self == NULL) {
        return NULL;
    }
    if (!Py_IS_TYPE(backward, self->st->CompiledBackwardType) || !PyCallable_Check(upstream)) {
        PyErr_SetString(PyExc_ValueError,
                        "plan: ApplyBoxed(CompiledBackward, cls, Function.vjp, apply_boxed)");
        Py_DECREF(self);
        return NULL;
    }
    self->backward = Py_NewRef(backward);
    self->cls = Py_NewRef(cls);
    self->default_vjp = Py_NewRef(default_vjp);
    self->upstream = Py_NewRef(upstream);
    return (PyObject *)self;
}

static int
ApplyBoxed_traverse(ApplyBoxed *self, visitproc visit, void *arg)
{
    Py_VISIT(Py_TYPE(self));
    Py_VISIT(self->module);
    Py_VISIT(self->dict);
    Py_VISIT(self->backward);
    Py_VISIT(self->cls);
    Py_VISIT(self->default_vjp);
    Py_VISIT(self->upstream);
    return 0;
}

static int
ApplyBoxed_clear(ApplyBoxed *self)
{
    Py_CLEAR(self->dict);
    Py_CLEAR(self->backward);
    Py_CLEAR(self->cls);
    Py_CLEAR(self->default_vjp);
    Py_CLEAR(self->upstream);
    return 0;
}

DEFINE_DEALLOC(ApplyBoxed, (void)0)
FN_MEMBERS(ApplyBoxed)
FN_SPEC(ApplyBoxed, "ApplyBoxed(backward, cls, Function.vjp, BackwardCFunction.apply_boxed): "
                    "the backward node's apply_boxed in C.")
