/* compile_wrapper.c: CompileWrapper, Dynamo's compile_wrapper in C.
 *
 * torch.compile(fn) returns _TorchDynamoContext.__call__'s compile_wrapper
 * (torch/_dynamo/eval_frame.py; OptimizedModule's forward is one too). On
 * every call it runs, in this order (2.13; what 2.14 on changes in [ ];
 * what 2.12 does not do in { }; 2.11's fullgraph set-up is
 * set_eval_frame_override(_get_eval_frame_override()), restored where the
 * nested flag is, and nothing else of fullgraph's):
 *
 *     prior = set_eval_frame(None)
 *     [if _is_eager_on_nested_compile() and ...: return fn(*args, **kwargs)]
 *     if self.fullgraph:
 *         prior_nested = set_fullgraph_error_on_nested_compile(config.error_on_...)
 *         if not self.export:
 *             fg_count = set_fullgraph_compiled_frame_count(0) < 0
 *             {if fg_count: reset_skip_reasons()}
 *     try:
 *         (a tracing context in a kernel invocation, exporting, FX symbolic
 *          tracing: run fn eagerly; torch.jit tracing: an error)
 *         cleanups = [enter() for enter in self.enter_exit_hooks]
 *         prior_skip = set_skip_guard_eval_unsafe(_is_skip_guard_eval_unsafe_stance())
 *         {prior_id = set_eval_frame_isolate_recompiles_id(self._isolate_recompiles_id)}
 *         (error_on_graph_break: set {where it differs}, restored after)
 *         depth = torch._C._functorch.get_dynamic_layer_stack_depth()
 *         {include, exclude = the local dispatch key sets}   [C++ save instead]
 *         _maybe_set_eval_frame(_callback_from_stance(callback))
 *         {with torch._C._ForceDispatchKeyGuard(include, exclude):}   [try:]
 *             try:
 *                 result = fn(*args, **kwargs)
 *             except (Unsupported, ...): re-raised, tracebacks of causes stripped
 *             except ShortenTraceback as e: raise e.remove_dynamo_frames() from None
 *             finally:
 *                 set_eval_frame(None)
 *                 (fullgraph: no compiled frame -> RuntimeError; 2.12: warn_once)
 *                 (error_on_graph_break, the nested-compile flag restored)
 *                 torch._C._functorch.pop_dynamic_layer_stack_and_undo_to_depth(depth)
 *                 set_skip_guard_eval_unsafe(prior_skip)
 *                 {set_eval_frame_isolate_recompiles_id(prior_id)}
 *                 for cleanup in cleanups: cleanup()
 *                                                   [finally: C++ restore]
 *         return result
 *     finally:
 *         if fg_count: set_fullgraph_compiled_frame_count(-1); {dynamo_tls.skip_reasons = None}
 *         _maybe_set_eval_frame(prior)
 *
 * The helpers are Python functions of eval_frame (and the enter hook of
 * torch.compile's context, which bumps the generation count that nn.Module
 * construction is tagged with); the rest calls into torch's C. With the
 * C++ part loaded, 2.13's dispatch key sets and their guard and
 * torch._C._is_tracing() are torch's C++ called directly
 * (torch_api.h), and so are 2.14's save and restore of the key sets:
 * torch._C._dynamo_save_local_dispatch_key_set() pushes the two sets on a
 * C++ thread-local stack, _dynamo_restore_local_dispatch_key_set() pops and
 * forces them; here the sets are kept in the call's frame and forced back
 * at the same point. Only an unbalanced restore called from inside the
 * compiled function (one more pop than pushes) could tell the two apart:
 * upstream's own restore would then find the stack empty and raise.
 *
 * A CompileWrapper replaces a compile_wrapper (made when the function or
 * module is compiled with the C runtime on; _compile_wrapper.py). Per call
 * it checks, before anything happens, that the state is the one it handles
 * (the default stance with no backend override, no tracing context, not
 * exporting, no FX or jit tracing, not in a nested eager region, no export,
 * torch.compile's own enter hook and config patchers (dynamic=,
 * dynamic_shapes=; called as upstream calls them), the nn.Module patch installed, and every
 * eval_frame global it stands in for the one bound); then it makes the same
 * calls into torch's C, in the same order, with the Python helpers done in
 * C, on every exit path as the try/finally blocks above; in any other state
 * the call is upstream's compile_wrapper, counted. Tracebacks have no frame
 * for the wrapper (the compiler errors it re-raises included).
 * ====================================================================== */
#include "dynamo/compile_wrapper.h"
#include "util/attr_memo.h"
#include "config/config_patch.h"
#include "util/dict_version.h"
#include "dynamo/dynamo.h"
#include "fn_object.h"
#include "util/frame_stub.h"
#include "util/py_compat.h"

#include <string.h>

enum { CELL_CALLBACK, CELL_FN, CELL_FX, CELL_JIT, CELL_SELF };

/* What the C side keeps of one compile_wrapper function (made with the C
 * runtime on), which stays upstream's function object. Its calls reach C
 * through the function's vectorcall, which finds this object in
 * rt_cw_state.fns (forgotten when the function goes: the object is the
 * callback of its weak reference to the function); on CPython 3.11, whose
 * interpreter runs a Python function's frame without its vectorcall,
 * through the function's code, a trampoline that calls this object (a
 * constant of that code). It holds nothing that could lead back to the
 * function (not its cells: a compiled function in a reference cycle with
 * the function it compiles is collected as without us). */
typedef struct {
    PyObject_HEAD
    vectorcallfunc vectorcall; /* CPython 3.11: called by the function's code */
    PyObject *module;     /* _C, whose state holds fns */
    PyObject *weakref;    /* to the function (with this object as its callback where
                           * fns holds it) */
    const void *fn;       /* the function's address: the key in fns */
    rt_attr_memo ctx;     /* the context's attributes (ctx_attr) */
} CompileWrapper;

/* One call's view of the compile_wrapper function it runs. */
typedef struct {
    rt_state *st;
    PyObject *fn;         /* the compile_wrapper function (borrowed: the callee) */
    PyObject *cells[5];   /* its closure's cells (enum above), borrowed from fn */
    rt_attr_memo *ctx;    /* its CompileWrapper's memo */
} cw_self;

/* The most enter hooks a call in C takes: torch.compile's own and config
 * patchers (dynamic=, dynamic_shapes=); more is upstream's. */
#define CW_MAX_HOOKS 4

/* What one call read of the context (new references). */
typedef struct {
    PyObject *fn, *ctx, *callback;
    int fullgraph;
    PyObject *eog;        /* self.error_on_graph_break */
    PyObject *hooks;      /* self.enter_exit_hooks, a list checked by hooks_handled */
    /* CPython 3.11: the exit (rt_cw_frame) the exception exc raised there
     * leaves from, for the trampoline to raise it at (exit_at) */
    int exit;
    PyObject *exit_exc;
} cw_call;

static void
cw_call_clear(cw_call *c)
{
    Py_CLEAR(c->fn);
    Py_CLEAR(c->ctx);
    Py_CLEAR(c->callback);
    Py_CLEAR(c->eog);
    Py_CLEAR(c->hooks);
    Py_CLEAR(c->exit_exc);
}

/* h is call_on_enter over OptimizeContext's on_enter
 * (install_generation_tagging_init): what run_body does in C */
static int
is_on_enter_hook(rt_cw_state *cw, PyObject *h)
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
static int
is_config_patcher(rt_cw_state *cw, PyObject *h)
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
static int
patcher_bound(rt_state *st)
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
        if (is_on_enter_hook(cw, h)) {
            own++;
        }
        else if (!patcher_bound || !is_config_patcher(cw, h)) {
            return 0;
        }
    }
    return own == 1;
}

/* ---- the state check ------------------------------------------------------ */

/* obj.name truthy: 1/0, -1 with an exception */
static int
attr_truthy(PyObject *obj, PyObject *name)
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
static int
stance_is_default(rt_cw_state *cw, PyObject *stance)
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
enum { CTX_EXPORT, CTX_FULLGRAPH, CTX_EOG, CTX_HOOKS, CTX_ISOLATE_ID, CTX_N };

/* self.<CTX_*> of the context ctx: a new reference, or NULL with the
 * exception the read raises */
static PyObject *
ctx_attr(cw_self *self, rt_cw_state *cw, PyObject *ctx, int i)
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
    PyObject *v = ctx_attr(self, cw, ctx, i);
    if (v == NULL) {
        return -1;
    }
    int r = PyObject_IsTrue(v);
    Py_DECREF(v);
    return r;
}

/* RT_CW_CALL_C, or the reason upstream's runs; -1 with an exception. Fills
 * *c (the caller clears it). Reads only. */
static int
steady_state(cw_self *self, rt_cw_state *cw, cw_call *c)
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
    int is_default = stance_is_default(cw, stance);
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
    if ((c->eog = ctx_attr(self, cw, c->ctx, CTX_EOG)) == NULL) {
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
    if ((c->hooks = ctx_attr(self, cw, c->ctx, CTX_HOOKS)) == NULL) {
        return -1;
    }
    if (!hooks_handled(cw, c->hooks, patcher_bound(self->st))) {
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

/* ---- the call ------------------------------------------------------------- */

/* rt_call_one whose result is dropped: 0, or -1 with an exception */
static int
do1(PyObject *f, PyObject *arg)
{
    PyObject *r = rt_call_one(f, arg);
    Py_XDECREF(r);
    return r != NULL ? 0 : -1;
}

/* f() whose result is dropped: 0, or -1 with an exception */
static int
do0(PyObject *f)
{
    PyObject *r = PyObject_CallNoArgs(f);
    Py_XDECREF(r);
    return r != NULL ? 0 : -1;
}

/* What one enter hook left for the exit: a config patcher's revert state,
 * or what a hook called as Python returned (call); neither for
 * torch.compile's own (its cleanup `nothing` does nothing). */
typedef struct {
    rt_config_patch patch;
    PyObject *call;
} cw_cleanup;

static int
cw_cleanup_run(rt_state *st, cw_cleanup *cl)
{
    if (cl->patch.prior != NULL) {
        return rt_config_patch_exit(st, &cl->patch);
    }
    return cl->call != NULL ? do0(cl->call) : 0;
}

/* What `cleanups = [enter() for enter in self.enter_exit_hooks]` left: each
 * entered hook's cleanup, in order; past CW_MAX_HOOKS a list. */
typedef struct {
    cw_cleanup first[CW_MAX_HOOKS];
    PyObject *more;       /* the cleanups past CW_MAX_HOOKS (a list), or NULL */
    Py_ssize_t n;         /* hooks entered */
} cw_entered;

static void
cw_entered_clear(cw_entered *e)
{
    for (Py_ssize_t i = 0; i < CW_MAX_HOOKS; i++) {
        rt_config_patch_clear(&e->first[i].patch);
        Py_CLEAR(e->first[i].call);
    }
    Py_CLEAR(e->more);
}

/* cleanups = [enter() for enter in self.enter_exit_hooks]: the live list,
 * as the comprehension iterates it (an enter's Python may change it); each
 * hook is classified when reached, and one C does not run (or past
 * CW_MAX_HOOKS) is called as upstream does. 0, or -1 with an exception
 * (e->n the hooks entered before it). */
static int
enter_hooks(rt_state *st, rt_cw_state *cw, PyObject *hooks, cw_entered *e)
{
    int patchers = patcher_bound(st);
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(hooks); i++) {
        PyObject *h = Py_NewRef(PyList_GET_ITEM(hooks, i));
        cw_cleanup *cl = i < CW_MAX_HOOKS ? &e->first[i] : NULL;
        int rc;
        if (cl != NULL && is_on_enter_hook(cw, h)) {
            /* on_enter -> install_generation_tagging_init():
             * GenerationTracker.generation += 1; its cleanup `nothing` */
            PyObject *gen = PyObject_GetAttr(cw->generation_tracker, cw->str_generation);
            PyObject *one = gen ? PyLong_FromLong(1) : NULL;
            PyObject *next = one ? PyNumber_InPlaceAdd(gen, one) : NULL;
            rc = next ? PyObject_SetAttr(cw->generation_tracker, cw->str_generation, next) : -1;
            Py_XDECREF(gen);
            Py_XDECREF(one);
            Py_XDECREF(next);
        }
        else if (cl != NULL && patchers && is_config_patcher(cw, h)) {
            /* a config patcher's change(); its cleanup revert() */
            rc = rt_config_patch_enter(st, PyFunction_GET_CLOSURE(h),
                                       (rt_patch_form)cw->patcher_form, &cl->patch);
        }
        else {
            PyObject *r = PyObject_CallNoArgs(h);
            rc = r == NULL ? -1 : 0;
            if (cl != NULL) {
                cl->call = r;
            }
            else if (r != NULL) {
                if (e->more == NULL && (e->more = PyList_New(0)) == NULL) {
                    rc = -1;
                }
                rc = rc < 0 ? -1 : PyList_Append(e->more, r);
                Py_DECREF(r);
            }
        }
        Py_DECREF(h);
        if (rc < 0) {
            return -1;
        }
        e->n++;
    }
    return 0;
}

/* for cleanup in cleanups: cleanup() (torch.compile's: `nothing`): 0, or
 * -1 with the exception of the one that raised (the rest do not run) */
static int
exit_hooks(rt_state *st, cw_entered *e)
{
    for (Py_ssize_t i = 0; i < e->n && i < CW_MAX_HOOKS; i++) {
        if (cw_cleanup_run(st, &e->first[i]) < 0) {
            return -1;
        }
    }
    for (Py_ssize_t i = 0; e->more != NULL && i < PyList_GET_SIZE(e->more); i++) {
        if (do0(PyList_GET_ITEM(e->more, i)) < 0) {
            return -1;
        }
    }
    return 0;
}

/* The raised exception leaves compile_wrapper from exit (a raise of its own,
 * not fn's call): its traceback gains the entry of that exit's frame stub;
 * on CPython 3.11 the trampoline, whose frame is the function's, raises it
 * there itself (recorded here, handed over in run). */
static void
exit_at(rt_cw_state *cw, cw_call *c, const rt_frame_call *call, int exit)
{
    if (cw->trampoline == NULL) {
        rt_frame_add(cw->frames[exit], call);
        return;
    }
    c->exit = exit;
    Py_XSETREF(c->exit_exc, Py_XNewRef(rt_raised_exception()));
}

/* The except clauses around fn's call, on the pending exception: the exit
 * its traceback entry is at (enum rt_cw_frame), or -1 where handling it
 * raised another. The entry of the call itself is added first, as
 * upstream's frame has it when its except clauses run. */
static int
transform_exception(rt_cw_state *cw, const rt_frame_call *call)
{
    rt_frame_add(cw->frames[RT_CW_FRAME_CALL], call);
    PyObject *type, *value, *tb;
    PyErr_Fetch(&type, &value, &tb);
    PyErr_NormalizeException(&type, &value, &tb);
    if (tb != NULL) {
        PyException_SetTraceback(value, tb);
    }
    int compiler_error = PyObject_IsInstance(value, cw->exc_compiler_error);
    int shorten = compiler_error == 0 ? PyObject_IsInstance(value, cw->exc_shorten) : 0;
    if (compiler_error < 0 || shorten < 0) {
        goto raised; /* the isinstance error, with the exception as context */
    }
    if (compiler_error) {
        PyObject *config = cw->expected[RT_CWG_CONFIG];
        int verbose = attr_truthy(config, cw->str_verbose);
        if (verbose != 0) {
            if (verbose < 0) {
                goto raised;
            }
            PyErr_Restore(type, value, tb); /* bare `raise` */
            return RT_CW_FRAME_CALL;
        }
        /* strip internal tracebacks from causes */
        PyObject *cur = Py_NewRef(value);
        for (;;) {
            PyObject *cause = PyException_GetCause(cur);
            if (cause == NULL) {
                break;
            }
            PyObject *r = PyObject_CallMethodOneArg(cause, cw->str_with_traceback, Py_None);
            Py_XDECREF(r);
            Py_SETREF(cur, cause);
            if (r == NULL) {
                Py_DECREF(cur);
                goto raised;
            }
        }
        Py_DECREF(cur);
        /* raise e.with_traceback(None) from e.__cause__ (raising the
         * exception being handled sets no context) */
        PyObject *same = PyObject_CallMethodOneArg(value, cw->str_with_traceback, Py_None);
        if (same == NULL) {
            goto raised;
        }
        PyObject *cause = PyException_GetCause(same);
        PyException_SetCause(same, cause); /* steals; sets __suppress_context__ */
        Py_DECREF(type);
        Py_DECREF(value);
        Py_XDECREF(tb);
        /* restored as it is: PyErr_SetObject would make the caller's
         * handled exception its context */
        PyErr_Restore(Py_NewRef((PyObject *)Py_TYPE(same)), same, PyException_GetTraceback(same));
        return RT_CW_FRAME_COMPILER_ERROR;
    }
    if (shorten) {
        /* raise e.remove_dynamo_frames() from None */
        PyObject *e2 = PyObject_CallMethodNoArgs(value, cw->str_remove_dynamo_frames);
        if (e2 == NULL) {
            goto raised;
        }
        if (!PyExceptionInstance_Check(e2)) {
            Py_DECREF(e2);
            PyErr_SetString(PyExc_TypeError, "exceptions must derive from BaseException");
            goto raised;
        }
        PyException_SetCause(e2, NULL);
        if (e2 != value) {
            PyException_SetContext(e2, Py_NewRef(value));
        }
        Py_DECREF(type);
        Py_DECREF(value);
        Py_XDECREF(tb);
        /* raising an exception keeps its __traceback__ and goes on from it */
        PyErr_Restore(Py_NewRef((PyObject *)Py_TYPE(e2)), e2, PyException_GetTraceback(e2));
        return RT_CW_FRAME_SHORTEN;
    }
    PyErr_Restore(type, value, tb);
    return RT_CW_FRAME_CALL;
raised:
    {
        /* an error while handling: it wins, the exception as its context */
        PyObject *t2, *v2, *tb2;
        PyErr_Fetch(&t2, &v2, &tb2);
        PyErr_NormalizeException(&t2, &v2, &tb2);
        if (v2 != value) {
            PyException_SetContext(v2, value); /* steals */
        }
        else {
            Py_DECREF(value);
        }
        Py_DECREF(type);
        Py_XDECREF(tb);
        PyErr_Restore(t2, v2, tb2);
    }
    return -1;
}

/* The fullgraph check in the inner finally: no compiled frame ran. */
static int
no_compiled_frames_error(rt_cw_state *cw)
{
    PyObject *tls = cw->expected[RT_CWG_DYNAMO_TLS];
    PyObject *reasons = PyObject_GetAttr(tls, cw->str_skip_reasons);
    if (reasons == NULL) {
        return -1;
    }
    /* get_skip_reasons(): dynamo_tls.skip_reasons or [] */
    int any = PyObject_IsTrue(reasons);
    PyObject *msg = NULL;
    if (any > 0) {
        PyObject *lines = PyList_New(0);
        PyObject *it = lines ? PyObject_GetIter(reasons) : NULL;
        PyObject *r;
        while (it != NULL && (r = PyIter_Next(it)) != NULL) {
            PyObject *line = PyUnicode_FromFormat("  - %S", r);
            Py_DECREF(r);
            if (line == NULL || PyList_Append(lines, line) < 0) {
                Py_XDECREF(line);
                Py_CLEAR(it);
                break;
            }
            Py_DECREF(line);
        }
        if (it != NULL && !PyErr_Occurred()) {
            PyObject *sep = PyUnicode_FromString("\n");
            PyObject *joined = sep ? PyUnicode_Join(sep, lines) : NULL;
            if (joined != NULL) {
                msg = PyUnicode_FromFormat(
                    "torch.compile with fullgraph=True found no compiled frames. "
                    "Skipped frames:\n%U", joined);
            }
            Py_XDECREF(joined);
            Py_XDECREF(sep);
        }
        Py_XDECREF(it);
        Py_XDECREF(lines);
    }
    else if (any == 0) {
        msg = PyUnicode_FromString(
            "torch.compile with fullgraph=True found no compiled frames. Compilation was "
            "not attempted and no cached compiled code was found.");
    }
    Py_DECREF(reasons);
    if (msg != NULL) {
        PyErr_SetObject(PyExc_RuntimeError, msg);
        Py_DECREF(msg);
    }
    return -1;
}

/* if not self.fullgraph and self.error_on_graph_break is not None: the
 * setting set for the call where it differs (2.12: whatever it is), *prior
 * the value to restore after (NULL: none; a current None is not restored).
 * 0, or -1 with an exception. */
static int
enter_error_on_graph_break(rt_cw_state *cw, PyObject *eog, PyObject **prior)
{
    PyObject *get_eog = PyDict_GetItemWithError(cw->globals, cw->str_get_eog);
    PyObject *set_eog = get_eog ? PyDict_GetItemWithError(cw->globals, cw->str_set_eog) : NULL;
    if (set_eog == NULL) {
        if (!PyErr_Occurred()) {
            PyErr_SetString(PyExc_NameError, "name '_get_error_on_graph_break' is not defined");
        }
        return -1;
    }
    PyObject *current = PyObject_CallNoArgs(get_eog);
    if (current == NULL) {
        return -1;
    }
    int differs = cw->eog_where_differs ? PyObject_RichCompareBool(current, eog, Py_NE) : 1;
    if (differs > 0 && do1(set_eog, eog) == 0) {
        /* restored after unless None (`if prior_error_on_graph_break is not
         * None`) */
        if (current != Py_None) {
            *prior = current;
            return 0;
        }
        Py_DECREF(current);
        return 0;
    }
    Py_DECREF(current);
    return differs != 0 ? -1 : 0;
}

/* The fullgraph check of the inner finally: set_fullgraph_compiled_frame_
 * count(-1) returned n; no compiled frame ran where it is 0. 0, or -1 with
 * an exception (the RuntimeError, 2.12's warning as an error). */
static int
fullgraph_exit_check(rt_cw_state *cw, PyObject *count)
{
    long n = PyLong_AsLong(count);
    if (n == -1 && PyErr_Occurred()) {
        return -1;
    }
    if (n != 0) {
        return 0;
    }
    if (cw->fullgraph == RT_CW_FG_WARN) {
        /* 2.12: torch._dynamo.utils.warn_once(...), whatever the stance */
        return do0(cw->fullgraph_warn);
    }
    /* `if count == 0 and _stance.stance == "default"` */
    PyObject *st_obj = PyDict_GetItemWithError(cw->globals, cw->str_stance_global);
    int is_default = st_obj != NULL ? stance_is_default(cw, st_obj) : -1;
    if (is_default < 0 || (is_default && no_compiled_frames_error(cw) < 0)) {
        if (!PyErr_Occurred()) {
            PyErr_SetString(PyExc_NameError, "name '_stance' is not defined");
        }
        return -1;
    }
    return 0;
}

/* The outer try's body (after the fullgraph set-up): the result, or NULL
 * with an exception. */
static PyObject *
run_body(cw_self *self, rt_cw_state *cw, cw_call *c, PyObject *const *argv, size_t nargsf,
         PyObject *kwnames, PyObject *prior_nested, int fg_count)
{
    PyObject *const *g = cw->expected;
    PyObject *prior_skip = NULL, *prior_id = NULL, *prior_eog = NULL, *depth = NULL;
    PyObject *result = NULL;
    rt_dispatch_keys keys = {NULL, NULL, NULL, NULL, {0, 0}};
    int keys_entered = 0;
    cw_entered entered = {{{{NULL, NULL, NULL, 0}, NULL}}, NULL, 0};

    if (enter_hooks(self->st, cw, c->hooks, &entered) < 0) {
        goto done;
    }
    /* set_skip_guard_eval_unsafe(_is_skip_guard_eval_unsafe_stance()) */
    PyObject *stance = PyDict_GetItemWithError(cw->globals, cw->str_stance_global);
    PyObject *skip = stance ? PyObject_GetAttr(stance, cw->str_skip_guard) : NULL;
    if (skip == NULL) {
        if (stance == NULL && !PyErr_Occurred()) {
            PyErr_SetString(PyExc_NameError, "name '_stance' is not defined");
        }
        goto done;
    }
    prior_skip = rt_call_one(g[RT_CWG_SET_SKIP_GUARD], skip);
    Py_DECREF(skip);
    if (prior_skip == NULL) {
        goto done;
    }
    if (cw->isolate_recompiles) {
        PyObject *isolate = ctx_attr(self, cw, c->ctx, CTX_ISOLATE_ID);
        prior_id = isolate ? rt_call_one(g[RT_CWG_SET_ISOLATE_ID], isolate) : NULL;
        Py_XDECREF(isolate);
        if (prior_id == NULL) {
            goto done;
        }
    }
    if (!c->fullgraph && c->eog != Py_None && enter_error_on_graph_break(cw, c->eog, &prior_eog) < 0) {
        goto done;
    }
    depth = PyObject_CallNoArgs(cw->get_depth);
    if (depth == NULL) {
        goto done;
    }
    if (cw->include_set != NULL && /* 2.13 */
        rt_dispatch_keys_read(self->st, cw->include_set, cw->exclude_set, &keys) < 0) {
        goto done;
    }
    /* _maybe_set_eval_frame(_callback_from_stance(callback)) */
    if (do1(g[RT_CWG_MAYBE_SET_EVAL_FRAME], c->callback) < 0) {
        goto done;
    }
    if (cw->include_set != NULL) {
        if (rt_dispatch_keys_enter(self->st, cw->force_guard, &keys) < 0) {
            goto done;
        }
        keys_entered = 1;
    }
    else if (cw->save_keys != NULL) {
        /* torch._C._dynamo_save_local_dispatch_key_set() (2.14 on) */
        if (self->st->cpp != NULL) {
            keys.cpp = self->st->cpp;
            keys.cpp->dispatch_tls_get(keys.keys);
        }
        else if (do0(cw->save_keys) < 0) {
            goto done;
        }
    }

    /* the call the frame stubs stand for: this one, with the function's closure */
    rt_frame_call frame_call = {argv, nargsf, kwnames, PyFunction_GET_CLOSURE(self->fn)};
    /* try: result = fn(*args, **kwargs) */
    result = PyObject_Vectorcall(c->fn, argv, nargsf, kwnames);
    int succeeded = result != NULL;
    if (!succeeded) {
        int exit = transform_exception(cw, &frame_call);
        if (exit > RT_CW_FRAME_CALL) {
            exit_at(cw, c, &frame_call, exit);
        }
    }
    /* finally: (a step that raises ends the block, as in Python) */
    {
        rt_pending_error saved;
        rt_finally_begin(&saved);
        int ok = do1(g[RT_CWG_SET_EVAL_FRAME], Py_None) == 0;
        if (ok && fg_count && succeeded) {
            PyObject *minus = PyLong_FromLong(-1);
            PyObject *count = minus ? rt_call_one(g[RT_CWG_SET_FG_COUNT], minus) : NULL;
            Py_XDECREF(minus);
            ok = count != NULL && fullgraph_exit_check(cw, count) == 0;
            if (!ok && count != NULL) {
                exit_at(cw, c, &frame_call, RT_CW_FRAME_FULLGRAPH);
            }
            Py_XDECREF(count);
        }
        if (ok && prior_eog != NULL) {
            PyObject *set_eog = PyDict_GetItemWithError(cw->globals, cw->str_set_eog);
            ok = set_eog != NULL && do1(set_eog, prior_eog) == 0;
        }
        if (ok && prior_nested != NULL) {
            /* 2.11: set_eval_frame_override(prior_eval_frame_override) */
            ok = do1(g[cw->fullgraph == RT_CW_FG_OVERRIDE ? RT_CWG_SET_EF_OVERRIDE
                                                          : RT_CWG_SET_FG_NESTED],
                     prior_nested) == 0;
        }
        ok = ok && do1(cw->pop_depth, depth) == 0;
        ok = ok && do1(g[RT_CWG_SET_SKIP_GUARD], prior_skip) == 0;
        ok = ok && (prior_id == NULL || do1(g[RT_CWG_SET_ISOLATE_ID], prior_id) == 0);
        ok = ok && exit_hooks(self->st, &entered) == 0;
        if (rt_finally_end(&saved, ok) < 0) {
            Py_CLEAR(result);
        }
    }
    if (keys_entered) {
        /* the with statement's exit, with the exception leaving its body */
        if (rt_dispatch_keys_exit(self->st, &keys, result == NULL) < 0) {
            Py_CLEAR(result);
        }
    }
    else if (keys.cpp != NULL) {
        /* finally: torch._C._dynamo_restore_local_dispatch_key_set() */
        keys.cpp->dispatch_tls_force(keys.keys);
    }
    else if (cw->restore_keys != NULL) {
        /* finally: torch._C._dynamo_restore_local_dispatch_key_set() */
        rt_pending_error saved;
        rt_finally_begin(&saved);
        if (rt_finally_end(&saved, do0(cw->restore_keys) == 0) < 0) {
            Py_CLEAR(result);
        }
    }
done:
    Py_XDECREF(prior_skip);
    Py_XDECREF(prior_id);
    Py_XDECREF(prior_eog);
    Py_XDECREF(depth);
    rt_dispatch_keys_clear(&keys);
    cw_entered_clear(&entered);
    return result;
}

/* The module state the compile_wrapper functions made ours run with, and
 * the vectorcall of a Python function, which runs their own code (what a
 * call is when the C side does not take it). Set by the binding; a
 * function called after the module's state is cleared runs its code. */
static rt_state *bound_state;
static vectorcallfunc function_call;

/* fn(*args, **kwargs) as upstream's compile_wrapper: its own code; on
 * CPython 3.11, where fn's code is the trampoline, a function of
 * upstream's code over fn's closure, made for the call. */
static PyObject *
call_upstream(rt_cw_state *cw, PyObject *fn, PyObject *const *argv, size_t nargsf,
              PyObject *kwnames)
{
    if (cw->trampoline == NULL || PyFunction_GET_CODE(fn) == cw->code) {
        return function_call(fn, argv, nargsf, kwnames);
    }
    PyObject *twin = PyFunction_NewWithQualName(cw->code, PyFunction_GET_GLOBALS(fn),
                                                ((PyFunctionObject *)fn)->func_qualname);
    if (twin == NULL || PyFunction_SetClosure(twin, PyFunction_GET_CLOSURE(fn)) < 0) {
        Py_XDECREF(twin);
        return NULL;
    }
    PyObject *result = PyObject_Vectorcall(twin, argv, nargsf, kwnames);
    Py_DECREF(twin);
    return result;
}

static PyObject *run(rt_state *st, PyObject *fn, CompileWrapper *state, PyObject *const *argv,
                     size_t nargsf, PyObject *kwnames);

/* CPython 3.11: the exception a call leaves by a raise of compile_wrapper's
 * own, kept for its trampoline to raise at that raise's position, right
 * after the call returns the CompileWrapper itself: the calling thread's
 * (another thread may run between the two). */
static _Thread_local struct {
    PyObject *exc;
    int exit;
} pending_exit;

/* CompileWrapper._exit(k): raises the kept exception where it leaves from
 * exit k (any, for -1); None where it leaves from another. */
static PyObject *
CompileWrapper_exit(PyObject *Py_UNUSED(op), PyObject *arg)
{
    long k = PyLong_AsLong(arg);
    if (k == -1 && PyErr_Occurred()) {
        return NULL;
    }
    if (pending_exit.exc == NULL) {
        if (k != -1) {
            Py_RETURN_NONE;
        }
        PyErr_SetString(PyExc_RuntimeError, "torch_aot_rt: no exception kept for the trampoline");
        return NULL;
    }
    if (k != -1 && k != pending_exit.exit) {
        Py_RETURN_NONE;
    }
    PyObject *exc = pending_exit.exc;
    pending_exit.exc = NULL;
    rt_raise_as_is(exc);
    return NULL;
}

/* The vectorcall of a compile_wrapper function made ours. */
static PyObject *
compile_wrapper_call(PyObject *fn, PyObject *const *argv, size_t nargsf, PyObject *kwnames)
{
    rt_state *st = bound_state;
    rt_ptr_entry *e = st != NULL ? rt_ptr_map_find(&st->cw.fns, fn) : NULL;
    if (e == NULL || PyFunction_GET_CODE(fn) != st->cw.code) {
        return function_call(fn, argv, nargsf, kwnames); /* its __code__ replaced */
    }
    return run(st, fn, (CompileWrapper *)(uintptr_t)e->value, argv, nargsf, kwnames);
}

/* CPython 3.11: the trampoline (the function's code) calls its
 * CompileWrapper with the function's (args, kwargs), the tuple and dict its
 * frame received: passed on as the call's arguments without building them
 * again. */
static PyObject *
CompileWrapper_vectorcall(PyObject *op, PyObject *const *argv, size_t nargsf, PyObject *kwnames)
{
    CompileWrapper *state = (CompileWrapper *)op;
    if (kwnames != NULL || PyVectorcall_NARGS(nargsf) != 2 || !PyTuple_CheckExact(argv[0]) ||
        !PyDict_CheckExact(argv[1])) {
        PyErr_SetString(PyExc_TypeError, "CompileWrapper(args, kwargs): a tuple and a dict");
        return NULL;
    }
    rt_state *st = PyModule_GetState(state->module);
    PyObject *fn = state->weakref != NULL ? rt_weakref_get(state->weakref) : NULL;
    if (fn == NULL || !PyFunction_Check(fn)) {
        Py_XDECREF(fn);
        PyErr_SetString(PyExc_RuntimeError,
                        "torch_aot_rt: a compile_wrapper's code called without its function");
        return NULL;
    }
    PyObject *args = argv[0], *kwargs = argv[1], *result;
    Py_ssize_t n = PyTuple_GET_SIZE(args), m = PyDict_GET_SIZE(kwargs);
    if (m == 0) {
        result = run(st, fn, state, ((PyTupleObject *)args)->ob_item, (size_t)n, NULL);
    }
    else {
        PyObject **stack = PyMem_Malloc((size_t)(n + m) * sizeof(PyObject *));
        PyObject *names = stack != NULL ? PyTuple_New(m) : NULL;
        result = NULL;
        if (names != NULL) {
            Py_ssize_t pos = 0, i = 0;
            PyObject *key, *value;
            for (Py_ssize_t k = 0; k < n; k++) {
                stack[k] = PyTuple_GET_ITEM(args, k);
            }
            while (PyDict_Next(kwargs, &pos, &key, &value)) {
                PyTuple_SET_ITEM(names, i, Py_NewRef(key));
                stack[n + i++] = value; /* borrowed: the dict holds them for the call */
            }
            result = run(st, fn, state, stack, (size_t)n, names);
        }
        else if (stack == NULL) {
            PyErr_NoMemory();
        }
        Py_XDECREF(names);
        PyMem_Free(stack);
    }
    Py_DECREF(fn);
    return result;
}

/* A call of fn, a compile_wrapper function made ours, whose state is
 * state. */
static PyObject *
run(rt_state *st, PyObject *fn, CompileWrapper *state, PyObject *const *argv, size_t nargsf,
    PyObject *kwnames)
{
    PyObject *closure = PyFunction_GET_CLOSURE(fn);
    rt_cw_state *cw = &st->cw;
    cw_self view = {st, fn, {NULL}, &state->ctx};
    cw_self *self = &view;
    for (int i = 0; i < 5; i++) {
        self->cells[i] = PyTuple_GET_ITEM(closure, cw->cell[i]);
    }
    cw_call c = {NULL, NULL, NULL, 0, NULL, NULL, -1, NULL};
    int path = steady_state(self, cw, &c);
    if (path != RT_CW_CALL_C) {
        cw_call_clear(&c);
        if (path < 0) {
            return NULL;
        }
        cw->counts[path]++;
        return call_upstream(cw, fn, argv, nargsf, kwnames);
    }
    cw->counts[RT_CW_CALL_C]++;
    PyObject *const *g = cw->expected;
    PyObject *result = NULL;
    PyObject *prior_nested = NULL;
    int fg_count = 0;
    PyObject *prior = rt_call_one(g[RT_CWG_SET_EVAL_FRAME], Py_None);
    if (prior == NULL) {
        goto done;
    }
    if (c.fullgraph && cw->fullgraph == RT_CW_FG_OVERRIDE) {
        /* 2.11, before the try: set_eval_frame_override(_get_eval_frame_override()),
         * whose body is `ERROR if torch._dynamo.config.error_on_... else SKIP` */
        PyObject *flag = rt_config_read(self->st, g[RT_CWG_CONFIG], cw->str_nested_error_config);
        int on = flag ? PyObject_IsTrue(flag) : -1;
        Py_XDECREF(flag);
        PyObject *override = NULL;
        if (on >= 0) {
            PyObject *members = PyDict_GetItemWithError(cw->globals, cw->names[RT_CWG_EF_OVERRIDE]);
            if (members == NULL && !PyErr_Occurred()) {
                PyErr_SetString(PyExc_NameError, "name '_EvalFrameOverride' is not defined");
            }
            override = members ? PyObject_GetAttr(members, on ? cw->str_error : cw->str_skip)
                               : NULL;
        }
        prior_nested = override ? rt_call_one(g[RT_CWG_SET_EF_OVERRIDE], override) : NULL;
        Py_XDECREF(override);
        if (prior_nested == NULL) {
            goto done;
        }
    }
    else if (c.fullgraph) {
        /* before the try: an error here leaves `prior` unrestored, as upstream */
        PyObject *flag = rt_config_read(self->st, g[RT_CWG_CONFIG], cw->str_nested_error_config);
        prior_nested = flag ? rt_call_one(g[RT_CWG_SET_FG_NESTED], flag) : NULL;
        Py_XDECREF(flag);
        if (prior_nested == NULL) {
            goto done;
        }
        PyObject *zero = PyLong_FromLong(0);
        PyObject *count = zero ? rt_call_one(g[RT_CWG_SET_FG_COUNT], zero) : NULL;
        Py_XDECREF(zero);
        if (count == NULL) {
            goto done;
        }
        PyObject *zero2 = PyLong_FromLong(0);
        fg_count = zero2 ? PyObject_RichCompareBool(count, zero2, Py_LT) : -1;
        Py_XDECREF(zero2);
        Py_DECREF(count);
        if (fg_count < 0) {
            goto done;
        }
        if (fg_count && cw->fullgraph == RT_CW_FG_RAISE) {
            /* reset_skip_reasons(): dynamo_tls.skip_reasons = [] */
            PyObject *empty = PyList_New(0);
            int rc = empty ? rt_tls_set(&self->st->thread_locals, RT_TLS_DYNAMO,
                                        g[RT_CWG_DYNAMO_TLS], cw->str_skip_reasons, empty)
                           : -1;
            Py_XDECREF(empty);
            if (rc < 0) {
                goto done;
            }
        }
    }
    result = run_body(self, cw, &c, argv, nargsf, kwnames, prior_nested, fg_count);
    /* finally: */
    {
        rt_pending_error saved;
        rt_finally_begin(&saved);
        int ok = 1;
        if (fg_count) {
            PyObject *minus = PyLong_FromLong(-1);
            ok = minus != NULL && do1(g[RT_CWG_SET_FG_COUNT], minus) == 0;
            Py_XDECREF(minus);
            ok = ok && (cw->fullgraph != RT_CW_FG_RAISE ||
                        rt_tls_set(&self->st->thread_locals, RT_TLS_DYNAMO, g[RT_CWG_DYNAMO_TLS],
                                   cw->str_skip_reasons, Py_None) == 0);
        }
        ok = ok && do1(g[RT_CWG_MAYBE_SET_EVAL_FRAME], prior) == 0;
        if (rt_finally_end(&saved, ok) < 0) {
            Py_CLEAR(result);
        }
    }
done:
    Py_XDECREF(prior);
    Py_XDECREF(prior_nested);
    if (result == NULL && c.exit_exc != NULL && rt_raised_exception() == c.exit_exc) {
        /* 3.11: the trampoline raises it at its exit (CompileWrapper._exit) */
        Py_XSETREF(pending_exit.exc, rt_take_exception());
        pending_exit.exit = c.exit;
        result = Py_NewRef((PyObject *)state);
    }
    cw_call_clear(&c);
    return result;
}

/* ---- making a compile_wrapper function ours ------------------------------- */

int
rt_is_c_compile_wrapper(PyObject *obj)
{
    if (!PyFunction_Check(obj)) {
        return 0;
    }
    if (rt_function_vectorcall(obj) == compile_wrapper_call) {
        return 1;
    }
    /* 3.11: its code is a trampoline, whose constants hold its CompileWrapper */
    rt_state *st = bound_state;
    PyObject *code = PyFunction_GET_CODE(obj);
    if (st == NULL || st->cw.trampoline == NULL || code == st->cw.code ||
        ((PyCodeObject *)code)->co_filename != ((PyCodeObject *)st->cw.trampoline)->co_filename) {
        return 0;
    }
    PyObject *consts = ((PyCodeObject *)code)->co_consts;
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(consts); i++) {
        if (Py_IS_TYPE(PyTuple_GET_ITEM(consts, i), st->CompileWrapperType)) {
            return 1;
        }
    }
    return 0;
}

PyObject *
rt_is_c_compile_wrapper_py(PyObject *Py_UNUSED(module), PyObject *obj)
{
    return PyBool_FromLong(rt_is_c_compile_wrapper(obj));
}

/* CPython 3.11: fn's code becomes the trampoline with self as its
 * constant (the trampoline's placeholder replaced); 0, or -1 with an
 * exception. */
static int
set_trampoline(rt_cw_state *cw, PyObject *fn, CompileWrapper *self)
{
    PyObject *consts = PyObject_GetAttr(cw->trampoline, cw->str_consts);
    PyObject *mine = consts != NULL ? PySequence_List(consts) : NULL;
    Py_XDECREF(consts);
    if (mine == NULL) {
        return -1;
    }
    int placed = 0;
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(mine); i++) {
        PyObject *item = PyList_GET_ITEM(mine, i);
        if (PyUnicode_Check(item) && PyUnicode_CompareWithASCIIString(item, RT_FRAME_PLACEHOLDER) == 0) {
            PyList_SetItem(mine, i, Py_NewRef((PyObject *)self)); /* steals */
            placed = 1;
        }
    }
    PyObject *tuple = placed ? PyList_AsTuple(mine) : NULL;
    Py_DECREF(mine);
    if (tuple == NULL) {
        if (!PyErr_Occurred()) {
            PyErr_SetString(PyExc_ValueError, "_bind_compile_wrapper: the trampoline has no "
                                              "placeholder constant");
        }
        return -1;
    }
    PyObject *argv[2] = {cw->trampoline, tuple};
    PyObject *kwnames = PyTuple_Pack(1, cw->str_consts);
    PyObject *code = kwnames != NULL ? PyObject_VectorcallMethod(
                                           cw->str_replace, argv,
                                           1 | PY_VECTORCALL_ARGUMENTS_OFFSET, kwnames)
                                     : NULL;
    Py_XDECREF(kwnames);
    Py_DECREF(tuple);
    if (code == NULL) {
        return -1;
    }
    int rc = PyObject_SetAttrString(fn, "__code__", code); /* checks its free variables */
    Py_DECREF(code);
    return rc;
}

PyObject *
rt_compile_wrapper_for(PyObject *module, PyObject *wrapper)
{
    rt_state *st = PyModule_GetState(module);
    rt_cw_state *cw = &st->cw;
    if (cw->code == NULL || !PyFunction_Check(wrapper) || PyFunction_GET_CODE(wrapper) != cw->code ||
        rt_is_c_compile_wrapper(wrapper)) {
        return Py_NewRef(wrapper);
    }
    PyObject *closure = PyFunction_GET_CLOSURE(wrapper);
    if (closure == NULL || !PyTuple_Check(closure)) {
        return Py_NewRef(wrapper);
    }
    for (int i = 0; i < 5; i++) {
        if (cw->cell[i] >= PyTuple_GET_SIZE(closure)) {
            return Py_NewRef(wrapper);
        }
    }
    CompileWrapper *self = PyObject_GC_New(CompileWrapper, st->CompileWrapperType);
    if (self == NULL) {
        return NULL;
    }
    /* 3.11: called by the trampoline; else called only as the weak reference's
     * callback (tp_call) */
    self->vectorcall = cw->trampoline != NULL ? CompileWrapper_vectorcall : NULL;
    self->module = Py_NewRef(module);
    self->fn = wrapper;
    memset(&self->ctx, 0, sizeof(self->ctx));
    if (function_call == NULL) {
        function_call = rt_function_vectorcall(wrapper); /* a fresh function's */
    }
    bound_state = st;
    if (cw->trampoline != NULL) {
        /* 3.11: owned by the function's code; a plain weak reference */
        self->weakref = PyWeakref_NewRef(wrapper, NULL);
        PyObject_GC_Track(self);
        int rc = self->weakref != NULL ? set_trampoline(cw, wrapper, self) : -1;
        Py_DECREF(self);
        if (rc < 0) {
            return NULL;
        }
    }
    else {
        /* owned by fns until the function goes */
        self->weakref = PyWeakref_NewRef(wrapper, (PyObject *)self);
        PyObject_GC_Track(self);
        if (self->weakref == NULL) {
            Py_DECREF(self);
            return NULL;
        }
        if (rt_ptr_map_add(&cw->fns, wrapper, (uint64_t)(uintptr_t)self) == NULL) {
            Py_CLEAR(self->weakref);
            Py_DECREF(self);
            return PyErr_NoMemory();
        }
        rt_function_set_vectorcall(wrapper, compile_wrapper_call);
    }
    cw->counts[RT_CW_BUILT]++;
    return Py_NewRef(wrapper);
}

/* Removes self's entry (the function's end, or the module's clear). */
static void
forget(CompileWrapper *self)
{
    PyObject *module = self->module;
    rt_state *st = module != NULL ? PyModule_GetState(module) : NULL;
    rt_ptr_entry *e = st != NULL ? rt_ptr_map_find(&st->cw.fns, self->fn) : NULL;
    if (e != NULL && e->value == (uint64_t)(uintptr_t)self) {
        rt_ptr_map_remove(&st->cw.fns, e);
        Py_DECREF(self); /* the table's reference */
    }
}

/* The weak reference's callback: the function is going. */
static PyObject *
CompileWrapper_call(PyObject *op, PyObject *Py_UNUSED(args), PyObject *Py_UNUSED(kwargs))
{
    CompileWrapper *self = (CompileWrapper *)Py_NewRef(op);
    Py_CLEAR(self->weakref); /* the cycle with its callback */
    forget(self);
    Py_DECREF(self);
    Py_RETURN_NONE;
}

void
rt_cw_forget_all(rt_cw_state *cw)
{
    while (cw->fns.used > 0) {
        for (size_t i = 0; i < cw->fns.capacity; i++) {
            if (cw->fns.slots[i].key != NULL) {
                CompileWrapper *self = (CompileWrapper *)(uintptr_t)cw->fns.slots[i].value;
                rt_ptr_map_remove(&cw->fns, &cw->fns.slots[i]);
                Py_CLEAR(self->weakref);
                Py_DECREF(self);
                break; /* the removal moved entries: start over */
            }
        }
    }
    rt_ptr_map_free(&cw->fns);
    if (bound_state != NULL && &bound_state->cw == cw) {
        bound_state = NULL;
    }
}

int
rt_cw_fns_traverse(rt_cw_state *cw, visitproc visit, void *arg)
{
    for (size_t i = 0; i < cw->fns.capacity; i++) {
        if (cw->fns.slots[i].key != NULL) {
            Py_VISIT((PyObject *)(uintptr_t)cw->fns.slots[i].value);
        }
    }
    return 0;
}

static int
CompileWrapper_traverse(CompileWrapper *self, visitproc visit, void *arg)
{
    Py_VISIT(Py_TYPE(self));
    Py_VISIT(self->module);
    Py_VISIT(self->weakref);
    return rt_attr_memo_traverse(&self->ctx, visit, arg);
}

static int
CompileWrapper_clear(CompileWrapper *self)
{
    Py_CLEAR(self->weakref);
    rt_attr_memo_clear(&self->ctx);
    return 0;
}

static void
CompileWrapper_dealloc(CompileWrapper *self)
{
    PyTypeObject *tp = Py_TYPE(self);
    PyObject_GC_UnTrack(self);
    CompileWrapper_clear(self);
    Py_CLEAR(self->module);
    tp->tp_free(self);
    Py_DECREF(tp);
}

static PyMethodDef CompileWrapper_methods[] = {
    {"_exit", CompileWrapper_exit, METH_O, NULL},
    {NULL, NULL, 0, NULL},
};

static PyMemberDef CompileWrapper_members[] = {
    {"__vectorcalloffset__", T_PYSSIZET, offsetof(CompileWrapper, vectorcall), READONLY, NULL},
    {NULL, 0, 0, 0, NULL},
};

static PyType_Slot CompileWrapper_slots[] = {
    {Py_tp_members, CompileWrapper_members},
    {Py_tp_methods, CompileWrapper_methods},
    {Py_tp_dealloc, CompileWrapper_dealloc},
    {Py_tp_traverse, CompileWrapper_traverse},
    {Py_tp_clear, CompileWrapper_clear},
    {Py_tp_call, CompileWrapper_call},
    {Py_tp_doc, (void *)"What the C side keeps of one compiled function whose calls it runs "
                        "(torch.compile's compile_wrapper, which stays upstream's function "
                        "object); the callback of its weak reference to the function."},
    {0, NULL},
};

PyType_Spec CompileWrapper_spec = {
    .name = "torch_aot_rt._C.CompileWrapper",
    .basicsize = sizeof(CompileWrapper),
    .flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL |
             Py_TPFLAGS_IMMUTABLETYPE | Py_TPFLAGS_DISALLOW_INSTANTIATION,
    .slots = CompileWrapper_slots,
};
