/* compiled_backward.c: CompiledBackward (CompiledFunction.backward) and
 * BackwardThunk (its impl_fn). Mirrors _codegen_compiled_backward,
 * _codegen_backward_prologue, CompiledFunction._backward_impl and
 * _codegen_backward_epilogue (runtime_wrappers.py); the grad outputs'
 * processing is in backward_tangents.c, the node's apply_boxed in
 * apply_boxed.c. */
#include "aot/autograd/compiled_backward.h"

static int
raise_runtime(const char *msg)
{
    PyErr_SetString(PyExc_RuntimeError, msg);
    return -1;
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
        int on = rt_call_predicate(st->aot.obj.deterministic_enabled);
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
            int rc = rt_tangent_append_leaves(self, &self->tangents[j], x, fpt);
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
        PyObject *processed = rt_tangent_process(self, &self->tangents[j], x);
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
            PyObject *r = PyObject_Vectorcall(st->aot.obj.set_external_object,
                                              PySequence_Fast_ITEMS(pair), 2, NULL);
            rc = r != NULL ? 0 : -1;
            Py_XDECREF(r);
        }
        else {
            PyObject *ref = PyObject_CallOneArg(st->aot.obj.weakref_ref,
                                                PySequence_Fast_GET_ITEM(pair, 1));
            rc = ref ? PyObject_SetItem(st->aot.obj.external_objects,
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
    PyObject *boxed = PyObject_GetAttr(compiled, st->aot.obj.str_boxed_call);
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
        PyObject *current = PyObject_GetAttr(self->cls, st->aot.obj.str_compiled_bw);
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
        if (st->torch.cpp_loaded->node_maybe_clear_saved(ctx) < 0) {
            return NULL;
        }
    }
    else {
        PyObject *r = PyObject_Vectorcall(st->aot.obj.maybe_clear_saved_tensors, &ctx, 1, NULL);
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
        PyObject *compiled = PyObject_VectorcallMethod(st->aot.obj.str_get_or_compile, argv,
                                                       1,
                                                       st->aot.obj.kwnames_use_once);
        if (compiled == NULL) {
            return NULL;
        }
        if (PyObject_SetAttr(self->cls, st->aot.obj.str_compiled_bw, compiled) < 0) {
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
        PyObject *current = PyObject_GetAttr(self->cls, st->aot.obj.str_compiled_bw);
        if (current == NULL) {
            return NULL;
        }
        int same = current == self->compiled_bw_seen;
        Py_DECREF(current);
        if (!same &&
            PyObject_SetAttr(self->cls, st->aot.obj.str_compiled_bw, self->compiled_bw_seen) < 0) {
            return NULL;
        }
    }
    if (keep_graph) {
        /* donated buffers need saved tensors used once */
        PyObject *donated = rt_config_read(st, st->aot.obj.functorch_config, st->aot.obj.str_donated_buffer);
        int on = donated ? PyObject_IsTrue(donated) : -1;
        Py_XDECREF(donated);
        if (on > 0) {
            PyObject *idxs = PyObject_GetAttr(self->fw_metadata, st->aot.obj.str_bw_donated_idxs);
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
        out = rt_as_list(PyObject_Vectorcall(st->aot.obj.call_func_at_runtime, argv, 2,
                                          st->aot.obj.kwnames_steal_disable_amp));
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
        if (both == NULL || rt_list_extend(both, no_vc) < 0) {
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
    if (self->tls_context && rt_tls_object(st, st->aot.obj.str_context, &cc) < 0) {
        goto done;
    }
    if (cc == Py_None) {
        Py_CLEAR(cc);
    }
    else if (cc != NULL && self->copy_context) {
        /* functools.partial(_cc.copy().run, impl_fn) */
        Py_SETREF(cc, PyObject_CallMethodNoArgs(cc, st->aot.obj.str_copy));
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
        result = PyObject_VectorcallMethod(st->aot.obj.str_run, cargs, 2, NULL);
        goto done;
    }
    if (cc != NULL) {
        /* impl_fn = functools.partial(cc.run, impl_fn) */
        PyObject *run = PyObject_GetAttr(cc, st->aot.obj.str_run);
        if (run == NULL) {
            goto done;
        }
        PyObject *pargs[2] = {run, impl_fn};
        PyObject *wrapped = PyObject_Vectorcall(st->aot.obj.partial, pargs, 2, NULL);
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
    if (self->restore_external_objects && self->st->aot.obj.external_objects == NULL) {
        PyErr_SetString(PyExc_ValueError,
                        "plan: restore_external_objects on a torch bound without the registry");
        goto fail;
    }
    if (self->restore_external_objects &&
        self->restore_by_setter != (self->st->aot.obj.set_external_object != NULL)) {
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
    if (rt_tangents_parse(self, kwargs) < 0) {
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
    if (rt_tangent_subclass_nodes_parse(self, kwargs) < 0) {
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
            int rc = rt_tangent_plan_traverse(&self->tangents[j], visit, arg);
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
            rt_tangent_plan_clear(&self->tangents[j]);
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
    PyTypeObject *type = backward->st->aot.types.BackwardThunkType;
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
