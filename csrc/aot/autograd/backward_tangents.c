/* backward_tangents.c: what CompiledBackward's prologue does to each grad
 * output: process_runtime_tangent (runtime_wrappers.py
 * AOTDispatchAutograd.process_runtime_tangent and
 * coerce_to_expected_memory_format) for plain tangents and, decided at build,
 * for subclass tangents (their chained leaves), and the tangent plans it
 * runs, parsed from the backward's keyword plan. */
#include "aot/autograd/compiled_backward.h"

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
    if ((argv[2] = PyObject_GetAttr(x, st->aot.obj.str_dtype)) == NULL ||
        (argv[3] = PyObject_GetAttr(x, st->aot.obj.str_device)) == NULL ||
        (argv[4] = PyObject_GetAttr(x, st->aot.obj.str_layout)) == NULL ||
        (argv[5] = PyObject_GetAttr(x, st->torch.obj.str_requires_grad)) == NULL) {
        goto done;
    }
    restrided = PyObject_Vectorcall(st->aot.obj.empty_strided, argv, 0, st->aot.obj.kwnames_empty_strided);
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
    if (Py_IS_TYPE(x, st->torch.types.Tensor)) {
        return PyObject_Vectorcall(st->torch.obj.tensor_methods[m], argv, 1, st->aot.obj.kwnames_memory_format);
    }
    return PyObject_VectorcallMethod(st->torch.obj.method_names[m], argv,
                                     1 | PY_VECTORCALL_ARGUMENTS_OFFSET,
                                     st->aot.obj.kwnames_memory_format);
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
PyObject *
rt_tangent_process(CompiledBackward *self, const tangent_plan *t, PyObject *x)
{
    rt_state *st = self->st;
    if (Py_IS_TYPE(x, st->torch.types.Tensor) && t->kind != TANGENT_PYTHON) {
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
    if (!Py_IS_TYPE(x, st->torch.types.Tensor)) {
        int is_tensor = rt_is_tensor(st, x);
        if (is_tensor <= 0) {
            return is_tensor < 0 ? NULL : Py_NewRef(x); /* not a tensor: as is */
        }
    }
    PyObject *argv[6] = {x, t->meta, t->index, t->desc, self->compile_id, t->stack_trace};
    PyObject *pair = PyObject_Vectorcall(st->aot.obj.process_runtime_tangent, argv,
                                         self->tangent_context_args ? 6 : 2, NULL);
    if (pair == NULL) {
        return NULL;
    }
    PyObject *first = PySequence_GetItem(pair, 0);
    Py_DECREF(pair);
    return first;
}

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
    if (Py_IS_TYPE(x, st->torch.types.Tensor)) {
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
        if (Py_IS_TYPE(elem, st->torch.types.Tensor) && a->kind != TANGENT_PYTHON) {
            new_elem = rt_tangent_process(self, a, elem);
        }
        else {
            PyObject *argv[2] = {elem, a->meta};
            PyObject *pair = PyObject_Vectorcall(st->aot.obj.process_runtime_tangent, argv, 2, NULL);
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
int
rt_tangent_append_leaves(CompiledBackward *self, const tangent_plan *t, PyObject *x,
                      PyObject *fpt)
{
    rt_state *st = self->st;
    if (Py_IS_TYPE(x, st->torch.types.Tensor) && t->kind != TANGENT_PYTHON) {
        PyObject *leaf = rt_tangent_process(self, t, x);
        if (leaf == NULL) {
            return -1;
        }
        int rc = PyList_Append(fpt, leaf);
        Py_DECREF(leaf);
        return rc;
    }
    if (!Py_IS_TYPE(x, st->torch.types.Tensor)) {
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
    PyObject *pair = PyObject_Vectorcall(st->aot.obj.process_runtime_tangent, argv,
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

/* ---- the tangent plans ----------------------------------------------- */

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
            rt_tangent_plan_clear(&n->attrs[i]);
            PyMem_Free(n->attrs[i].sizes);
        }
    }
    PyMem_Free(n->names);
    PyMem_Free(n->attrs);
    PyMem_Free(n);
}

void
rt_tangent_plan_clear(tangent_plan *t)
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

int
rt_tangent_plan_traverse(tangent_plan *t, visitproc visit, void *arg)
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
            int rc = rt_tangent_plan_traverse(&t->sub->attrs[i], visit, arg);
            if (rc) {
                return rc;
            }
        }
    }
    return 0;
}

/* subclass_tangent_nodes: per tangent None, or (type, flatten meta, memory
 * format, is_fake or None, ((attr name, inner plan), ...)) */
int
rt_tangent_subclass_nodes_parse(CompiledBackward *self, PyObject *kwargs)
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

int
rt_tangents_parse(CompiledBackward *self, PyObject *kwargs)
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
