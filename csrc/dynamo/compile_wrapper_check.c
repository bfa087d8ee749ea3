/* compile_wrapper_check.c: whether a call of a compile_wrapper function may
 * run in C: the enter hooks it takes (torch.compile's own, config patchers)
 * and the state check before anything happens (see compile_wrapper.c). */
#include "dynamo/compile_wrapper_call.h"

/* h is call_on_enter over OptimizeContext's on_enter
 * (install_generation_tagging_init): what run_body does in C */
int
rt_cw_is_on_enter_hook(rt_cw_state *cw, PyObject *h)
{
    PyObject *closure = PyFunction_Check(h) ? PyFunction_GET_CLOSURE(h) : NULL;
    if (closure == NULL || PyFunction_GET_CODE(h) != cw->call_on_enter_code ||
        PyTuple_GET_SIZE(closure) != 1) {
        return 0;
    }
    PyObject *on_enter = PyCell_GET(PyTuple_GET_ITEM(closure, 0));
    return on_enter != NULL && PyFunction_Check(on_enter) &&
           PyFunction_GET_CODE(on_enter) == cw->on_enter_code &&
           PyFunction_GET_GLOBALS(on_enter) == cw->globals;
}

/* h is ConfigModule._make_closure_patcher's `change` (make_set_enable_dynamic,
 * dynamic_shapes=) with its closure (changes, config, self) filled, changes
 * a dict: it sets config overrides (ContextVars) and marks the config
 * dirty, nothing the C path checked; run by config_patch.c */
int
rt_cw_is_config_patcher(rt_cw_state *cw, PyObject *h)
{
    if (!PyFunction_Check(h) || PyFunction_GET_CODE(h) != cw->patcher_code) {
        return 0;
    }
    PyObject *closure = PyFunction_GET_CLOSURE(h);
    if (closure == NULL || PyTuple_GET_SIZE(closure) != 3) {
        return 0;
    }
    for (int i = 0; i < 3; i++) {
        if (PyCell_GET(PyTuple_GET_ITEM(closure, i)) == NULL) {
            return 0;
        }
    }
    return PyDict_CheckExact(PyCell_GET(PyTuple_GET_ITEM(closure, 0)));
}

/* config patchers run in C: the config reader, whose names they use, is
 * bound */
int
rt_cw_patcher_bound(rt_state *st)
{
    return st->config_reader.config_module != NULL;
}

/* hooks (self.enter_exit_hooks) are the ones a call in C runs: a list of at
 * most CW_MAX_HOOKS, torch.compile's own once (after its first run), config
 * patchers otherwise */
static int
hooks_handled(rt_cw_state *cw, PyObject *hooks, int patcher_bound)
{
    if (!PyList_CheckExact(hooks) || PyList_GET_SIZE(hooks) > CW_MAX_HOOKS) {
        return 0;
    }
    int own = 0;
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(hooks); i++) {
        PyObject *h = PyList_GET_ITEM(hooks, i);
        if (rt_cw_is_on_enter_hook(cw, h)) {
            own++;
        }
        else if (!patcher_bound || !rt_cw_is_config_patcher(cw, h)) {
            return 0;
        }
    }
    return own == 1;
}

/* ---- the state check ------------------------------------------------------ */

/* obj.name truthy: 1/0, -1 with an exception */
int
rt_cw_attr_truthy(PyObject *obj, PyObject *name)
{
    PyObject *v = PyObject_GetAttr(obj, name);
    if (v == NULL) {
        return -1;
    }
    int r = PyObject_IsTrue(v);
    Py_DECREF(v);
    return r;
}

/* getattr(obj, name, None) is not None: 1/0, -1 */
static int
attr_present(PyObject *obj, PyObject *name)
{
    PyObject *v = PyObject_GetAttr(obj, name);
    if (v == NULL) {
        if (!PyErr_ExceptionMatches(PyExc_AttributeError)) {
            return -1;
        }
        PyErr_Clear();
        return 0;
    }
    Py_DECREF(v);
    return v != Py_None;
}

/* getattr(local, name, False) truthy, local a threading.local: 1/0, -1 */
static int
tls_truthy_or_false(rt_state *st, int slot, PyObject *local, PyObject *name)
{
    PyObject *v;
    int found = rt_tls_get(&st->thread_locals, slot, local, name, &v);
    if (found <= 0) {
        return found;
    }
    int r = PyObject_IsTrue(v);
    Py_DECREF(v);
    return r;
}

/* globals[name] truthy: 1/0, -1 (absent: the error upstream's read gives) */
static int
global_truthy(PyObject *globals, PyObject *name)
{
    PyObject *v = PyDict_GetItemWithError(globals, name);
    if (v == NULL) {
        if (!PyErr_Occurred()) {
            PyErr_Format(PyExc_NameError, "name '%U' is not defined", name);
        }
        return -1;
    }
    return PyObject_IsTrue(v);
}

/* stance.stance == "default" (the stance's name, an exact str): 1/0, -1
 * with the read's exception */
int
rt_cw_stance_is_default(rt_cw_state *cw, PyObject *stance)
{
    PyObject *name = PyObject_GetAttr(stance, cw->str_stance);
    if (name == NULL) {
        return -1;
    }
    int is_default = PyUnicode_CheckExact(name) && PyUnicode_Compare(name, cw->str_default) == 0;
    Py_DECREF(name);
    return is_default;
}

/* The context's attributes a call reads, through self's memo (attr_memo.h),
 * by index: */

/* self.<CTX_*> of the context ctx: a new reference, or NULL with the
 * exception the read raises */
PyObject *
rt_cw_ctx_attr(cw_self *self, rt_cw_state *cw, PyObject *ctx, int i)
{
    PyObject *names[CTX_N] = {cw->str_export, cw->str_fullgraph, cw->str_error_on_graph_break,
                              cw->str_enter_exit_hooks, cw->str_isolate_id};
    /* _isolate_recompiles_id: only the releases that read it (2.13 on) */
    int memo = rt_attr_memo_read(self->ctx, ctx, names, cw->isolate_recompiles ? CTX_N : CTX_N - 1);
    if (memo < 0) {
        return NULL;
    }
    PyObject *v = memo ? self->ctx->values[i] : NULL;
    return v != NULL ? Py_NewRef(v) : PyObject_GetAttr(ctx, names[i]); /* absent: its error */
}

/* bool(self.<CTX_*>): 1/0, -1 */
static int
ctx_truthy(cw_self *self, rt_cw_state *cw, PyObject *ctx, int i)
{
    PyObject *v = rt_cw_ctx_attr(self, cw, ctx, i);
    if (v == NULL) {
        return -1;
    }
    int r = PyObject_IsTrue(v);
    Py_DECREF(v);
    return r;
}

/* RT_CW_CALL_C, or the reason upstream's runs; -1 with an exception. Fills
 * *c (the caller clears it). Reads only. */
int
rt_cw_steady_state(cw_self *self, rt_cw_state *cw, cw_call *c)
{
    for (int i = 0; i < 5; i++) {
        if (PyCell_GET(self->cells[i]) == NULL) {
            return RT_CW_STATE;
        }
    }
    if (PyCell_GET(self->cells[CELL_FX]) != cw->is_fx_symbolic_tracing ||
        PyCell_GET(self->cells[CELL_JIT]) != cw->is_jit_tracing) {
        return RT_CW_REPLACED;
    }
    if (!rt_dict_unchanged(cw->globals, cw->globals_verified)) {
        for (int g = 0; g < RT_CWG_N; g++) {
            if (cw->names[g] == NULL) {
                continue; /* not read by this release's compile_wrapper */
            }
            PyObject *v = PyDict_GetItemWithError(cw->globals, cw->names[g]);
            if (v != cw->expected[g]) {
                return v == NULL && PyErr_Occurred() ? -1 : RT_CW_REPLACED;
            }
        }
        cw->globals_verified = rt_dict_version(cw->globals);
    }
    /* _callback_from_stance(callback) is callback: the default stance, no
     * backend forced */
    PyObject *stance = PyDict_GetItemWithError(cw->globals, cw->str_stance_global);
    if (stance == NULL) {
        return PyErr_Occurred() ? -1 : RT_CW_REPLACED;
    }
    if (!Py_IS_TYPE(stance, (PyTypeObject *)cw->stance)) {
        return RT_CW_STATE;
    }
    int is_default = rt_cw_stance_is_default(cw, stance);
    if (is_default <= 0) {
        return is_default < 0 ? -1 : RT_CW_STATE;
    }
    int v = attr_present(stance, cw->str_backend);
    if (v != 0) {
        return v < 0 ? -1 : RT_CW_STATE;
    }
    /* 2.14 on: _is_eager_on_nested_compile(): depth > 0 */
    if (cw->eager_nested != NULL) {
        PyObject *depth;
        int found = rt_tls_get(&self->st->thread_locals, RT_TLS_EAGER_NESTED, cw->eager_nested,
                               cw->str_depth, &depth);
        if (found < 0) {
            return -1;
        }
        if (found) {
            PyObject *zero = PyLong_FromLong(0);
            int positive = zero ? PyObject_RichCompareBool(depth, zero, Py_GT) : -1;
            Py_XDECREF(zero);
            Py_DECREF(depth);
            if (positive != 0) {
                return positive < 0 ? -1 : RT_CW_STATE;
            }
        }
    }
    c->fn = Py_NewRef(PyCell_GET(self->cells[CELL_FN]));
    c->ctx = Py_NewRef(PyCell_GET(self->cells[CELL_SELF]));
    c->callback = Py_NewRef(PyCell_GET(self->cells[CELL_CALLBACK]));
    /* self.export */
    if ((v = ctx_truthy(self, cw, c->ctx, CTX_EXPORT)) != 0) {
        return v < 0 ? -1 : RT_CW_STATE;
    }
    if ((c->fullgraph = ctx_truthy(self, cw, c->ctx, CTX_FULLGRAPH)) < 0) {
        return -1;
    }
    if ((c->eog = rt_cw_ctx_attr(self, cw, c->ctx, CTX_EOG)) == NULL) {
        return -1;
    }
    /* TracingContext.try_get(): getattr(_TLS, "tracing_context", None) */
    PyObject *tls = PyDict_GetItemWithError(cw->guards_globals, cw->str_tls);
    if (tls == NULL) {
        return PyErr_Occurred() ? -1 : RT_CW_REPLACED;
    }
    PyObject *tc;
    if ((v = rt_tls_get(&self->st->thread_locals, RT_TLS_GUARDS, tls, cw->str_tracing_context,
                        &tc)) != 0) {
        if (v < 0) {
            return -1;
        }
        Py_DECREF(tc);
        if (tc != Py_None) {
            return RT_CW_STATE;
        }
    }
    /* torch.compiler.is_exporting(); is_fx_symbolic_tracing()'s flag (2.13:
     * the module global _is_fx_tracing_flag; 2.14 on: _get_is_fx_tracing(),
     * getattr(_is_fx_tracing_tls, "flag", False)); torch.jit tracing */
    if ((v = global_truthy(cw->compiler_globals, cw->str_exporting_flag)) != 0 ||
        (v = cw->fx_flag_tls != NULL ? tls_truthy_or_false(self->st, RT_TLS_FX_FLAG,
                                                           cw->fx_flag_tls, cw->str_flag)
                                     : global_truthy(cw->fx_globals, cw->str_fx_flag)) != 0) {
        return v < 0 ? -1 : RT_CW_STATE;
    }
    if ((v = rt_jit_tracing(self->st, cw->is_jit_tracing)) != 0) {
        return v < 0 ? -1 : RT_CW_STATE;
    }
    /* self.enter_exit_hooks: torch.compile's own enter hook and config
     * patchers (hooks_handled) */
    if ((c->hooks = rt_cw_ctx_attr(self, cw, c->ctx, CTX_HOOKS)) == NULL) {
        return -1;
    }
    if (!hooks_handled(cw, c->hooks, rt_cw_patcher_bound(self->st))) {
        return RT_CW_STATE;
    }
    /* install_generation_tagging_init has patched Module: through 2.14
     * getattr(Module, "___needs_generation_tag_patch", True) is falsy; 2.15
     * on, Module.___has_generation_tag_patch is there (any value) */
    PyObject *patch = PyObject_GetAttr(cw->module_cls, cw->str_tag_patch);
    if (patch == NULL) {
        if (!PyErr_ExceptionMatches(PyExc_AttributeError)) {
            return -1;
        }
        PyErr_Clear();
        return RT_CW_STATE;
    }
    v = cw->tag_patch_present ? 0 : PyObject_IsTrue(patch);
    Py_DECREF(patch);
    if (v != 0) {
        return v < 0 ? -1 : RT_CW_STATE;
    }
    return RT_CW_CALL_C;
}
