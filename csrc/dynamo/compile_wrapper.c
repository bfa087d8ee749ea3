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
#include "dynamo/compile_wrapper_call.h"

#include <string.h>
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

rt_state *rt_cw_bound_state;
vectorcallfunc rt_cw_plain_call;

/* ---- the call ------------------------------------------------------------- */

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
    int patchers = rt_cw_patcher_bound(st);
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(hooks); i++) {
        PyObject *h = Py_NewRef(PyList_GET_ITEM(hooks, i));
        cw_cleanup *cl = i < CW_MAX_HOOKS ? &e->first[i] : NULL;
        int rc;
        if (cl != NULL && rt_cw_is_on_enter_hook(cw, h)) {
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
        else if (cl != NULL && patchers && rt_cw_is_config_patcher(cw, h)) {
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
        PyObject *isolate = rt_cw_ctx_attr(self, cw, c->ctx, CTX_ISOLATE_ID);
        prior_id = isolate ? rt_call_one(g[RT_CWG_SET_ISOLATE_ID], isolate) : NULL;
        Py_XDECREF(isolate);
        if (prior_id == NULL) {
            goto done;
        }
    }
    if (!c->fullgraph && c->eog != Py_None && rt_cw_enter_error_on_graph_break(cw, c->eog, &prior_eog) < 0) {
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
        if (self->st->torch.cpp != NULL) {
            keys.cpp = self->st->torch.cpp;
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
        int exit = rt_cw_transform_exception(cw, &frame_call);
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
            ok = count != NULL && rt_cw_fullgraph_exit_check(cw, count) == 0;
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

/* fn(*args, **kwargs) as upstream's compile_wrapper: its own code; on
 * CPython 3.11, where fn's code is the trampoline, a function of
 * upstream's code over fn's closure, made for the call. */
static PyObject *
call_upstream(rt_cw_state *cw, PyObject *fn, PyObject *const *argv, size_t nargsf,
              PyObject *kwnames)
{
    if (cw->trampoline == NULL || PyFunction_GET_CODE(fn) == cw->code) {
        return rt_cw_plain_call(fn, argv, nargsf, kwnames);
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

/* CPython 3.11: the exception a call leaves by a raise of compile_wrapper's
 * own, kept for its trampoline to raise at that raise's position, right
 * after the call returns the CompileWrapper itself: the calling thread's
 * (another thread may run between the two). */
static _Thread_local struct {
    PyObject *exc;
    int exit;
} pending_exit;

static PyObject *rt_cw_run(rt_state *st, PyObject *fn, CompileWrapper *state, PyObject *const *argv,
                          size_t nargsf, PyObject *kwnames);

/* CompileWrapper._exit(k): raises the kept exception where it leaves from
 * exit k (any, for -1); None where it leaves from another. */
PyObject *
rt_cw_exit(PyObject *Py_UNUSED(op), PyObject *arg)
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
PyObject *
rt_cw_function_call(PyObject *fn, PyObject *const *argv, size_t nargsf, PyObject *kwnames)
{
    rt_state *st = rt_cw_bound_state;
    rt_ptr_entry *e = st != NULL ? rt_ptr_map_find(&st->dynamo.cw.fns, fn) : NULL;
    if (e == NULL || PyFunction_GET_CODE(fn) != st->dynamo.cw.code) {
        return rt_cw_plain_call(fn, argv, nargsf, kwnames); /* its __code__ replaced */
    }
    return rt_cw_run(st, fn, (CompileWrapper *)(uintptr_t)e->value, argv, nargsf, kwnames);
}

/* CPython 3.11: the trampoline (the function's code) calls its
 * CompileWrapper with the function's (args, kwargs), the tuple and dict its
 * frame received: passed on as the call's arguments without building them
 * again. */
PyObject *
rt_cw_vectorcall(PyObject *op, PyObject *const *argv, size_t nargsf, PyObject *kwnames)
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
        result = rt_cw_run(st, fn, state, ((PyTupleObject *)args)->ob_item, (size_t)n, NULL);
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
            result = rt_cw_run(st, fn, state, stack, (size_t)n, names);
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
rt_cw_run(rt_state *st, PyObject *fn, CompileWrapper *state, PyObject *const *argv, size_t nargsf,
    PyObject *kwnames)
{
    PyObject *closure = PyFunction_GET_CLOSURE(fn);
    rt_cw_state *cw = &st->dynamo.cw;
    cw_self view = {st, fn, {NULL}, &state->ctx};
    cw_self *self = &view;
    for (int i = 0; i < 5; i++) {
        self->cells[i] = PyTuple_GET_ITEM(closure, cw->cell[i]);
    }
    cw_call c = {NULL, NULL, NULL, 0, NULL, NULL, -1, NULL};
    int path = rt_cw_steady_state(self, cw, &c);
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
