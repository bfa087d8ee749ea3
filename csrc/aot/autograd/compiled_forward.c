/* compiled_forward.c: CompiledForward, i.e. CompiledFunction.forward.
 * Mirrors _codegen_compiled_forward, _AutogradSavedState.save_from_forward and
 * the generated _AutogradForwardEpilogue.finalize (runtime_wrappers.py). */
#include "fn_object.h"

/* ======================================================================
 * CompiledForward: CompiledFunction.forward(ctx, *args)
 * ====================================================================== */

typedef struct {
    RT_FN_HEAD
    PyObject *upstream;           /* upstream's forward: calls we don't take */
    PyObject *compiled_fw;
    PyObject *rng_add;            /* rng_state.add_forward_args, or NULL */
    Py_ssize_t backward_state_index; /* -1: none */
    bool disable_amp;
    Py_ssize_t num_forward_returns;
    Py_ssize_t saved_vc[2], saved_no_vc[2], saved_symints[2], saved_opaque[2];
    /* saved_tensor_is_graph_input (releases that keep saved graph inputs
     * undetached), or NULL: every saved view is detached. */
    bool *saved_is_graph_input;
    Py_ssize_t n_saved_is_graph_input;
    bool snapshot_external_objects;
    bool external_objects_list;   /* the registry is a list (2.15), not a dict */
    Py_ssize_t n_dynamic;
    Py_ssize_t *dynamic_idx;
    PyObject **dynamic_dims;
    /* the attribute they are stamped on, interned: 2.13's
     * mark_dynamo_propagated_dynamic_indices, or 2.11/2.12's
     * maybe_mark_dynamic_helper (_dynamo_weak_dynamic_indices) */
    PyObject *dynamic_attr;
    index_array metadata_wraps;   /* mutated inputs with metadata-only mutations */
    index_array unsafe_views;
    index_array aliased_outs;
    index_array non_diff;
    /* config.debug_assert's checks in _codegen_finalize, where the graph has
     * any (mutated inputs or aliased outputs): -1 none; else the number of
     * mutated runtime inputs, outputs and mutated input infos, and whether
     * outputs alias. */
    Py_ssize_t debug_num_mutated;
    Py_ssize_t debug_num_outputs;
    Py_ssize_t debug_num_mut_infos;
    bool debug_outputs_aliased;
} CompiledForward;

/* "expected all <what> to be <kind>, got types: [<types>]" */
static void
raise_types(const char *what, const char *kind, PyObject *items)
{
    PyObject *types = PyList_New(PyList_GET_SIZE(items));
    if (types == NULL) {
        return;
    }
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(items); i++) {
        PyList_SET_ITEM(types, i, Py_NewRef((PyObject *)Py_TYPE(PyList_GET_ITEM(items, i))));
    }
    PyErr_Format(PyExc_AssertionError, "expected all %s to be %s, got types: %R",
                 what, kind, types);
    Py_DECREF(types);
}

/* See Note [Detaching saved tensors in AOTAutograd] upstream
 * (_AutogradSavedState.save_from_forward). Without a graph-input mask:
 *     [x.detach() if x._is_view() else x for x in tensors]
 * with one (2.14), where `offset` places `tensors` among all saved tensors:
 *     [x if is_graph_input[offset + i] or not x._is_view() else x.detach()
 *      for i, x in enumerate(tensors)]
 * which raises IndexError when the graph saved more tensors than the
 * metadata lists (a compiled forward returning too many outputs). */
static PyObject *
detach_saved_views(CompiledForward *self, PyObject *tensors, Py_ssize_t offset)
{
    rt_state *st = self->st;
    Py_ssize_t n = PyList_GET_SIZE(tensors);
    PyObject *out = PyList_New(n);
    if (out == NULL) {
        return NULL;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *x = PyList_GET_ITEM(tensors, i);
        if (self->saved_is_graph_input != NULL) {
            if (offset + i >= self->n_saved_is_graph_input) {
                PyErr_SetString(PyExc_IndexError, "list index out of range");
                Py_DECREF(out);
                return NULL;
            }
            if (self->saved_is_graph_input[offset + i]) {
                PyList_SET_ITEM(out, i, Py_NewRef(x));
                continue;
            }
        }
        int v = rt_tensor_is_view(st, x);
        PyObject *saved = v < 0 ? NULL : v ? rt_tensor_call(st, RT_DETACH, x, NULL, 0)
                                           : Py_NewRef(x);
        if (saved == NULL) {
            Py_DECREF(out);
            return NULL;
        }
        PyList_SET_ITEM(out, i, saved);
    }
    return out;
}

/* list[start:stop], Python's slice semantics */
static PyObject *
span_of(PyObject *list, const Py_ssize_t span[2])
{
    Py_ssize_t start = span[0], stop = span[1];
    PySlice_AdjustIndices(PyList_GET_SIZE(list), &start, &stop, 1);
    return PyList_GetSlice(list, start, stop);
}

static int
save_from_forward(CompiledForward *self, PyObject *ctx, PyObject *fw_outs)
{
    rt_state *st = self->st;
    int rc = -1;
    PyObject *vc = NULL, *no_vc = NULL, *to_save = NULL, *no_vc_saved = NULL;
    PyObject *symints = NULL, *opaque = NULL;
    if ((vc = span_of(fw_outs, self->saved_vc)) == NULL ||
        (no_vc = span_of(fw_outs, self->saved_no_vc)) == NULL) {
        goto done;
    }
    /* both type checks come before any detach, as upstream */
    for (int pass = 0; pass < 2; pass++) {
        PyObject *items = pass ? no_vc : vc;
        for (Py_ssize_t i = 0; i < PyList_GET_SIZE(items); i++) {
            int ok = rt_is_tensor(st, PyList_GET_ITEM(items, i));
            if (ok <= 0) {
                if (ok == 0) {
                    raise_types(pass ? "tensors_saved_no_vc_check" : "tensors_saved_with_vc_check",
                                "Tensors", items);
                }
                goto done;
            }
        }
    }
    if ((to_save = detach_saved_views(self, vc, 0)) == NULL ||
        (no_vc_saved = detach_saved_views(self, no_vc, PyList_GET_SIZE(vc))) == NULL) {
        goto done;
    }
    Py_ssize_t num_vc = PyList_GET_SIZE(to_save);
    for (Py_ssize_t k = 0; k < self->n_dynamic; k++) {
        Py_ssize_t idx = self->dynamic_idx[k];
        PyObject *target = idx < num_vc ? to_save : no_vc_saved;
        Py_ssize_t at = idx < num_vc ? idx : idx - num_vc;
        if (at >= PyList_GET_SIZE(target)) {
            PyErr_SetString(PyExc_IndexError, "list index out of range");
            goto done;
        }
        if (rt_mark_dynamic_indices(st, PyList_GET_ITEM(target, at), self->dynamic_dims[k],
                                    self->dynamic_attr) < 0) {
            goto done;
        }
    }
    /* ctx.save_for_backward(*tensors_to_save) is `ctx.to_save = tensors` */
    if (rt_ctx_set_steal(st, ctx, RT_CTX_TO_SAVE, PyList_AsTuple(to_save)) < 0 ||
        rt_ctx_set(st, ctx, RT_CTX_TENSORS_NO_VC_CHECK, no_vc_saved) < 0) {
        goto done;
    }
    if ((symints = span_of(fw_outs, self->saved_symints)) == NULL) {
        goto done;
    }
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(symints); i++) {
        PyObject *x = PyList_GET_ITEM(symints, i);
        int ok = PyLong_Check(x) || PyFloat_Check(x);
        if (!ok && (ok = PyObject_IsInstance(x, st->aot.obj.SymInt)) == 0) {
            ok = PyObject_IsInstance(x, st->aot.obj.SymFloat);
        }
        if (ok <= 0) {
            if (ok == 0) {
                raise_types("symint_outs", "int/float/SymInt/SymFloat", symints);
            }
            goto done;
        }
    }
    if (rt_ctx_set(st, ctx, RT_CTX_SYMINTS, symints) < 0 ||
        (opaque = span_of(fw_outs, self->saved_opaque)) == NULL) {
        goto done;
    }
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(opaque); i++) {
        PyObject *x = PyList_GET_ITEM(opaque, i);
        /* is_opaque_type(type(obj)) or isinstance(obj, OpaqueBase), under
         * the release's names (2.11: the first alone, no OpaqueBase bound) */
        PyObject *tp = (PyObject *)Py_TYPE(x);
        PyObject *r = PyObject_Vectorcall(st->aot.obj.is_opaque_type, &tp, 1, NULL);
        int ok = r ? PyObject_IsTrue(r) : -1;
        Py_XDECREF(r);
        if (ok == 0 && st->aot.obj.OpaqueBase != NULL) {
            ok = PyObject_IsInstance(x, st->aot.obj.OpaqueBase);
        }
        if (ok <= 0) {
            if (ok == 0) {
                raise_types("opaque_object_outs", "opaque types", opaque);
            }
            goto done;
        }
    }
    if (rt_ctx_set(st, ctx, RT_CTX_OPAQUE_OBJECTS, opaque) < 0) {
        goto done;
    }
    rc = 0;
done:
    Py_XDECREF(vc);
    Py_XDECREF(no_vc);
    Py_XDECREF(to_save);
    Py_XDECREF(no_vc_saved);
    Py_XDECREF(symints);
    Py_XDECREF(opaque);
    return rc;
}

/* raw_returns[i] = f(raw_returns[i]) for each i; IndexError as upstream */
static int
rewrite_returns(rt_state *st, PyObject *raw, const index_array *where, int unsafe_view)
{
    for (Py_ssize_t k = 0; k < where->n; k++) {
        Py_ssize_t i = where->idx[k];
        if (i >= PyList_GET_SIZE(raw)) {
            PyErr_SetString(PyExc_IndexError, "list index out of range");
            return -1;
        }
        PyObject *o = PyList_GET_ITEM(raw, i);
        PyObject *v;
        if (unsafe_view) {
            /* torch.ops.aten._unsafe_view(o, o.shape) */
            PyObject *shape = PyObject_GetAttr(o, st->aot.obj.str_shape);
            if (shape == NULL) {
                return -1;
            }
            PyObject *argv[2] = {o, shape};
            v = PyObject_Vectorcall(st->aot.obj.unsafe_view, argv, 2, NULL);
            Py_DECREF(shape);
        }
        else {
            v = PyObject_CallOneArg(st->torch.obj.TensorAlias, o);
        }
        if (v == NULL || PyList_SetItem(raw, i, v) < 0) {
            return -1;
        }
    }
    return 0;
}

/* _snapshot_external_objects(ctx), 2.15: the registry is the list
 * runtime_wrappers imported (stale once Dynamo rebinds its own global):
 *     ctx._external_objects = {k: ref() for k, ref in
 *                              enumerate(index_to_external_object_weakref)
 *                              if ref() is not None}
 * A list iterator re-reads the length at each step and never raises for a
 * change of size; ref() is called twice for a live entry, once for a dead
 * one. Fills `snapshot`: 0, or -1 with an exception set. */
static int
snapshot_list(PyObject *registry, PyObject *snapshot)
{
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(registry); i++) {
        PyObject *ref = Py_NewRef(PyList_GET_ITEM(registry, i));
        PyObject *obj = PyObject_CallNoArgs(ref);
        int ok = obj != NULL;
        if (obj != NULL && obj != Py_None) {
            Py_SETREF(obj, PyObject_CallNoArgs(ref));
            PyObject *key = obj != NULL ? PyLong_FromSsize_t(i) : NULL;
            ok = key != NULL && PyDict_SetItem(snapshot, key, obj) == 0;
            Py_XDECREF(key);
        }
        Py_XDECREF(obj);
        Py_DECREF(ref);
        if (!ok) {
            return -1;
        }
    }
    return 0;
}

/* _snapshot_external_objects(ctx) (2.14):
 *     ctx._external_objects = {k: ref() for k, ref in
 *                              index_to_external_object_weakref.items()
 *                              if ref() is not None}
 * ref() is called twice, as there; the registry is usually empty. 2.15
 * (is_list): the same over enumerate(registry), snapshot_list. */
static int
snapshot_external_objects(rt_state *st, PyObject *ctx, bool is_list)
{
    PyObject *registry = st->aot.obj.external_objects;
    PyObject *snapshot = PyDict_New();
    if (snapshot == NULL) {
        return -1;
    }
    if (is_list) {
        if (snapshot_list(registry, snapshot) < 0) {
            Py_DECREF(snapshot);
            return -1;
        }
        return rt_ctx_set_steal(st, ctx, RT_CTX_EXTERNAL_OBJECTS, snapshot);
    }
    Py_ssize_t pos = 0, size = PyDict_GET_SIZE(registry);
    PyObject *key, *ref;
    while (PyDict_Next(registry, &pos, &key, &ref)) {
        Py_INCREF(key);
        Py_INCREF(ref);
        PyObject *obj = PyObject_CallNoArgs(ref);
        int ok = obj != NULL;
        if (obj != NULL && obj != Py_None) {
            Py_SETREF(obj, PyObject_CallNoArgs(ref));
            ok = obj != NULL && PyDict_SetItem(snapshot, key, obj) == 0;
        }
        Py_XDECREF(obj);
        Py_DECREF(key);
        Py_DECREF(ref);
        if (ok && PyDict_GET_SIZE(registry) != size) {
            PyErr_SetString(PyExc_RuntimeError, "dictionary changed size during iteration");
            ok = 0;
        }
        if (!ok) {
            Py_DECREF(snapshot);
            return -1;
        }
    }
    return rt_ctx_set_steal(st, ctx, RT_CTX_EXTERNAL_OBJECTS, snapshot);
}

/* _codegen_finalize's `if config.debug_assert:` block, read per call as
 * upstream reads it (only for graphs where it checks anything):
 *     user_mutated_inputs_raw = raw_returns[0:num_mutated_runtime_inps]
 *     len(user_mutated_inputs_raw) == len(mut_inp_infos), else AssertionError
 *     no TensorAlias in raw_returns[num_mutated_runtime_inps + num_outputs:] */
static int
debug_assert_checks(CompiledForward *self, PyObject *raw)
{
    rt_state *st = self->st;
    PyObject *flag = rt_config_read(st, st->aot.obj.functorch_config, st->aot.obj.str_debug_assert);
    int on = flag ? PyObject_IsTrue(flag) : -1;
    Py_XDECREF(flag);
    if (on <= 0) {
        return on;
    }
    Py_ssize_t n = PyList_GET_SIZE(raw);
    if (self->debug_num_mutated > 0) {
        Py_ssize_t got = self->debug_num_mutated < n ? self->debug_num_mutated : n;
        if (got != self->debug_num_mut_infos) {
            PyErr_Format(PyExc_AssertionError,
                         "expected len(user_mutated_inputs_raw) == len(mut_inp_infos), "
                         "got %zd != %zd", got, self->debug_num_mut_infos);
            return -1;
        }
    }
    if (self->debug_outputs_aliased) {
        for (Py_ssize_t i = self->debug_num_mutated + self->debug_num_outputs; i < n; i++) {
            int alias = PyObject_IsInstance(PyList_GET_ITEM(raw, i), st->torch.obj.TensorAlias);
            if (alias < 0) {
                return -1;
            }
            if (alias) {
                PyErr_SetString(PyExc_AssertionError,
                                "expected no TensorAlias in intermediates_raw");
                return -1;
            }
        }
    }
    return 0;
}

/* The generated _AutogradForwardEpilogue.finalize. */
static PyObject *
finalize_forward(CompiledForward *self, PyObject *ctx, PyObject *fw_outs)
{
    rt_state *st = self->st;
    PyObject *raw = PyList_GetSlice(fw_outs, 0, self->num_forward_returns);
    if (raw == NULL) {
        return NULL;
    }
    if (rewrite_returns(st, raw, &self->metadata_wraps, 0) < 0 ||
        rewrite_returns(st, raw, &self->unsafe_views, 1) < 0 ||
        rewrite_returns(st, raw, &self->aliased_outs, 0) < 0) {
        goto fail;
    }
    /* non_diff = [raw[i] for i in non_diff_indices if isinstance(raw[i], Tensor)] */
    PyObject *non_diff = PyTuple_New(self->non_diff.n);
    if (non_diff == NULL) {
        goto fail;
    }
    Py_ssize_t m = 0;
    for (Py_ssize_t k = 0; k < self->non_diff.n; k++) {
        Py_ssize_t i = self->non_diff.idx[k];
        if (i >= PyList_GET_SIZE(raw)) {
            PyErr_SetString(PyExc_IndexError, "list index out of range");
            Py_DECREF(non_diff);
            goto fail;
        }
        PyObject *x = PyList_GET_ITEM(raw, i);
        int is_tensor = rt_is_tensor(st, x);
        if (is_tensor < 0) {
            Py_DECREF(non_diff);
            goto fail;
        }
        if (is_tensor) {
            PyTuple_SET_ITEM(non_diff, m++, Py_NewRef(x));
        }
    }
    if (m != self->non_diff.n && _PyTuple_Resize(&non_diff, m) < 0) {
        goto fail;
    }
    if (self->debug_num_mutated >= 0 && debug_assert_checks(self, raw) < 0) {
        Py_DECREF(non_diff);
        goto fail;
    }
    /* ctx.mark_non_differentiable(*non_diff) is `ctx.non_differentiable = args` */
    if (rt_ctx_set_steal(st, ctx, RT_CTX_NON_DIFFERENTIABLE, non_diff) < 0 ||
        rt_ctx_set(st, ctx, RT_CTX_MATERIALIZE_NON_DIFF_GRADS, Py_False) < 0 ||
        (self->snapshot_external_objects &&
         snapshot_external_objects(st, ctx, self->external_objects_list) < 0)) {
        goto fail;
    }
    PyObject *result = PyList_AsTuple(raw);
    Py_DECREF(raw);
    return result;
fail:
    Py_DECREF(raw);
    return NULL;
}

static PyObject *
CompiledForward_vectorcall(PyObject *op, PyObject *const *argv, size_t nargsf,
                           PyObject *kwnames)
{
    CompiledForward *self = (CompiledForward *)op;
    rt_state *st = self->st;
    Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
    if (nargs < 1 || kwnames != NULL) {
        /* Not how autograd calls it: upstream's forward binds (or rejects)
         * the arguments with its own messages. */
        return PyObject_Vectorcall(self->upstream, argv, nargsf, kwnames);
    }
    PyObject *ctx = argv[0];
    PyObject *const *args = argv + 1;
    Py_ssize_t n = nargs - 1;
    if (self->backward_state_index >= 0) {
        if (self->backward_state_index >= n) {
            PyErr_SetString(PyExc_IndexError, "tuple index out of range");
            return NULL;
        }
        PyObject *bw_state = args[self->backward_state_index];
        int ok = PyObject_IsInstance(bw_state, st->aot.obj.BackwardState);
        if (ok <= 0) {
            if (ok == 0) {
                PyErr_Format(PyExc_AssertionError, "expected BackwardState, got %S",
                             (PyObject *)Py_TYPE(bw_state));
            }
            return NULL;
        }
        if (PyObject_SetAttr(ctx, st->aot.obj.str_backward_state, bw_state) < 0) {
            return NULL;
        }
    }
    PyObject *list;
    if (self->rng_add != NULL) {
        /* args = rng_state.add_forward_args(ctx, args): upstream's tracker */
        PyObject *tuple = PyTuple_New(n);
        if (tuple == NULL) {
            return NULL;
        }
        for (Py_ssize_t i = 0; i < n; i++) {
            PyTuple_SET_ITEM(tuple, i, Py_NewRef(args[i]));
        }
        PyObject *cargs[2] = {ctx, tuple};
        PyObject *extended = PyObject_Vectorcall(self->rng_add, cargs, 2, NULL);
        Py_DECREF(tuple);
        if (extended == NULL) {
            return NULL;
        }
        list = PySequence_List(extended);
        Py_DECREF(extended);
    }
    else {
        list = PyList_New(n);
        if (list != NULL) {
            for (Py_ssize_t i = 0; i < n; i++) {
                PyList_SET_ITEM(list, i, Py_NewRef(args[i]));
            }
        }
    }
    if (list == NULL) {
        return NULL;
    }
    PyObject *fw_outs = rt_call_boxed(st, self->compiled_fw, list, self->disable_amp);
    Py_DECREF(list);
    if (fw_outs == NULL) {
        return NULL;
    }
    PyObject *result = NULL;
    if (save_from_forward(self, ctx, fw_outs) == 0) {
        result = finalize_forward(self, ctx, fw_outs);
    }
    Py_DECREF(fw_outs);
    return result;
}

static int
parse_index_array(PyObject *kwargs, const char *key, index_array *out)
{
    return rt_plan_indices(kwargs, key, &out->n, &out->idx);
}

static PyObject *
CompiledForward_new(PyTypeObject *type, PyObject *args, PyObject *kwargs)
{
    if (PyTuple_GET_SIZE(args) != 0) {
        PyErr_SetString(PyExc_TypeError, "CompiledForward takes keyword arguments only");
        return NULL;
    }
    CompiledForward *self = (CompiledForward *)rt_fn_alloc(type, CompiledForward_vectorcall);
    if (self == NULL) {
        return NULL;
    }
    int err = 0;
    PyObject *v;
    bool disable_amp;
    if ((self->upstream = rt_callable_or_null(kwargs, "upstream", &err)) == NULL) {
        if (!err) {
            PyErr_SetString(PyExc_ValueError, "plan: upstream must be callable");
        }
        goto fail;
    }
    if ((v = rt_plan_required(kwargs, "compiled_fw")) == NULL) {
        goto fail;
    }
    if (!PyCallable_Check(v)) {
        PyErr_SetString(PyExc_ValueError, "plan: compiled_fw must be callable");
        goto fail;
    }
    self->compiled_fw = Py_NewRef(v);
    if ((v = rt_plan_required(kwargs, "dynamic_dims_attr")) == NULL) {
        goto fail;
    }
    if (!PyUnicode_CheckExact(v)) {
        PyErr_SetString(PyExc_ValueError, "plan: dynamic_dims_attr must be a str");
        goto fail;
    }
    self->dynamic_attr = Py_NewRef(v);
    PyUnicode_InternInPlace(&self->dynamic_attr);
    self->rng_add = rt_callable_or_null(kwargs, "rng_add_forward_args", &err);
    if (err || (v = rt_plan_required(kwargs, "backward_state_index")) == NULL ||
        rt_index_or_none(v, "backward_state_index", &self->backward_state_index) < 0 ||
        rt_plan_bool(kwargs, "disable_amp", &disable_amp) < 0 ||
        (v = rt_plan_required(kwargs, "num_forward_returns")) == NULL ||
        rt_index_or_none(v, "num_forward_returns", &self->num_forward_returns) < 0 ||
        rt_parse_span(kwargs, "saved_vc", self->saved_vc) < 0 ||
        rt_parse_span(kwargs, "saved_no_vc", self->saved_no_vc) < 0 ||
        rt_parse_span(kwargs, "saved_symints", self->saved_symints) < 0 ||
        rt_parse_span(kwargs, "saved_opaque", self->saved_opaque) < 0 ||
        parse_index_array(kwargs, "metadata_mutation_wraps", &self->metadata_wraps) < 0 ||
        parse_index_array(kwargs, "unsafe_view_outputs", &self->unsafe_views) < 0 ||
        parse_index_array(kwargs, "aliased_outputs", &self->aliased_outs) < 0 ||
        parse_index_array(kwargs, "non_differentiable", &self->non_diff) < 0) {
        goto fail;
    }
    self->disable_amp = disable_amp;
    /* debug_assert=(num_mutated, num_outputs, num_mutated_input_infos, outputs_aliased) or None */
    self->debug_num_mutated = -1;
    if ((v = rt_plan_required(kwargs, "debug_assert")) == NULL) {
        goto fail;
    }
    if (v != Py_None) {
        int aliased = 0;
        if (!PyArg_ParseTuple(v, "nnnp:debug_assert plan", &self->debug_num_mutated,
                              &self->debug_num_outputs, &self->debug_num_mut_infos, &aliased)) {
            goto fail;
        }
        if (self->debug_num_mutated < 0 || self->debug_num_outputs < 0 ||
            self->debug_num_mut_infos < 0) {
            PyErr_SetString(PyExc_ValueError, "plan: debug_assert counts must be >= 0");
            goto fail;
        }
        self->debug_outputs_aliased = aliased;
    }
    bool snapshot, is_list;
    if (rt_plan_bool(kwargs, "snapshot_external_objects", &snapshot) < 0 ||
        rt_plan_bool(kwargs, "external_objects_list", &is_list) < 0) {
        goto fail;
    }
    if (snapshot && self->st->aot.obj.external_objects == NULL) {
        PyErr_SetString(PyExc_ValueError,
                        "plan: snapshot_external_objects on a torch bound without the registry");
        goto fail;
    }
    if (snapshot && is_list != self->st->aot.external_objects_is_list) {
        PyErr_Format(PyExc_ValueError,
                     "plan: external_objects_list is %s, the registry bound is a %s",
                     is_list ? "True" : "False",
                     self->st->aot.external_objects_is_list ? "list" : "dict");
        goto fail;
    }
    self->snapshot_external_objects = snapshot;
    self->external_objects_list = is_list;
    if (rt_plan_bool_mask(kwargs, "saved_is_graph_input", &self->n_saved_is_graph_input,
                          &self->saved_is_graph_input) < 0) {
        goto fail;
    }
    if (self->num_forward_returns < 0) {
        PyErr_SetString(PyExc_ValueError, "plan: num_forward_returns must be an int");
        goto fail;
    }
    if ((v = rt_plan_required(kwargs, "dynamic_saved")) == NULL) {
        goto fail;
    }
    if (!PyTuple_Check(v)) {
        PyErr_SetString(PyExc_ValueError, "plan: dynamic_saved must be a tuple of (index, set)");
        goto fail;
    }
    Py_ssize_t nd = PyTuple_GET_SIZE(v);
    self->dynamic_idx = PyMem_Calloc(nd ? nd : 1, sizeof(Py_ssize_t));
    self->dynamic_dims = PyMem_Calloc(nd ? nd : 1, sizeof(PyObject *));
    if (!self->dynamic_idx || !self->dynamic_dims) {
        PyErr_NoMemory();
        goto fail;
    }
    for (Py_ssize_t k = 0; k < nd; k++) {
        PyObject *rec = PyTuple_GET_ITEM(v, k);
        if (!PyTuple_Check(rec) || PyTuple_GET_SIZE(rec) != 2 ||
            !PyAnySet_Check(PyTuple_GET_ITEM(rec, 1)) ||
            rt_index_or_none(PyTuple_GET_ITEM(rec, 0), "dynamic_saved index",
                          &self->dynamic_idx[k]) < 0 ||
            self->dynamic_idx[k] < 0) {
            if (!PyErr_Occurred()) {
                PyErr_SetString(PyExc_ValueError,
                                "plan: dynamic_saved must be a tuple of (index, set)");
            }
            goto fail;
        }
        self->dynamic_dims[k] = Py_NewRef(PyTuple_GET_ITEM(rec, 1));
        self->n_dynamic = k + 1;
    }
    return (PyObject *)self;
fail:
    Py_DECREF(self);
    return NULL;
}

static int
CompiledForward_traverse(CompiledForward *self, visitproc visit, void *arg)
{
    Py_VISIT(Py_TYPE(self));
    Py_VISIT(self->module);
    Py_VISIT(self->dict);
    Py_VISIT(self->upstream);
    Py_VISIT(self->compiled_fw);
    Py_VISIT(self->rng_add);
    for (Py_ssize_t k = 0; k < self->n_dynamic; k++) {
        Py_VISIT(self->dynamic_dims[k]);
    }
    return 0;
}

static int
CompiledForward_clear(CompiledForward *self)
{
    Py_CLEAR(self->dict);
    Py_CLEAR(self->upstream);
    Py_CLEAR(self->compiled_fw);
    Py_CLEAR(self->rng_add);
    Py_CLEAR(self->dynamic_attr);
    for (Py_ssize_t k = 0; k < self->n_dynamic; k++) {
        Py_CLEAR(self->dynamic_dims[k]);
    }
    return 0;
}

static void
CompiledForward_free_arrays(CompiledForward *self)
{
    PyMem_Free(self->saved_is_graph_input);
    PyMem_Free(self->dynamic_idx);
    PyMem_Free(self->dynamic_dims);
    PyMem_Free(self->metadata_wraps.idx);
    PyMem_Free(self->unsafe_views.idx);
    PyMem_Free(self->aliased_outs.idx);
    PyMem_Free(self->non_diff.idx);
}

DEFINE_DEALLOC(CompiledForward, CompiledForward_free_arrays(self))
FN_MEMBERS(CompiledForward)
FN_SPEC(CompiledForward, "CompiledFunction.forward(ctx, *args) in C (keyword plan).")
