/* pregraph.c: PregraphHook, the two functions Dynamo's transformed bytecode
 * calls around the code that prepares a graph's arguments, in C.
 *
 * With torch._dynamo.config.record_runtime_overhead (the default), the
 * bytecode of every compiled frame calls, on every call,
 *
 *     cm = torch._dynamo.utils.record_pregraph_bytecode_enter()
 *     ... the graph's arguments ...
 *     torch._dynamo.utils.record_pregraph_bytecode_exit(cm)
 *
 * (loaded as attributes of the module at each call: codegen.py's
 * load_import_from). Both are decorated with torch._disable_dynamo, so
 * each call runs _disable_dynamo's `inner` (torch/_compile.py):
 *
 *     disable_fn = getattr(fn, "__dynamo_disable", None)
 *     if disable_fn is None:          # the first call only
 *         disable_fn = torch._dynamo.disable(fn, recursive, wrapping=False)
 *         fn.__dynamo_disable = disable_fn
 *     return disable_fn(*args, **kwargs)
 *
 * then DisableContext's `_fn` around it (dynamo/disable.c), then the body
 * (torch/_dynamo/utils.py):
 *
 *     enter: cm = (torch._C._profiler._RecordFunctionFast("Pregraph bytecode")
 *                  if torch.autograd.profiler._is_profiler_enabled
 *                  else contextlib.nullcontext())
 *            cm.__enter__(); return cm
 *     exit:  cm.__exit__(None, None, None)
 *
 * A PregraphHook replaces the module attribute. Per call it makes the same
 * checks in the same order and, in the state the C path handles (the C
 * runtime switched on, `fn.__dynamo_disable` the wrapper found at install,
 * the arguments the body takes, and rt_disable_fast_path's state: the
 * default stance, not exporting), the same eval-frame calls around a C
 * body; anything else calls upstream's `inner` (or, past `inner`'s look-up,
 * its `_fn`), counted. Where the C version differs on purpose: with the
 * profiler off, the context manager the enter returns (and the exit gets
 * back) is a shared _C.NullContext, whose __enter__ and __exit__ do what
 * nullcontext's do (nothing, None), not a new contextlib.nullcontext:
 * nothing but the frame's bytecode ever holds it.
 * ====================================================================== */
#include "dynamo/dynamo.h"
#include "fn_object.h"

typedef struct {
    RT_FN_HEAD
    int exit;             /* record_pregraph_bytecode_exit, else _enter */
    PyObject *upstream;   /* the module attribute replaced: inner */
    PyObject *fn;         /* inner's fn, whose __dict__ holds __dynamo_disable */
    PyObject *wrapper;    /* the __dynamo_disable found there: DisableContext's _fn */
    PyObject *fn_cell;    /* its `fn` and `self` cells */
    PyObject *ctx_cell;
    PyObject *switch_;    /* torch_aot_rt._state._enabled, [bool] */
} PregraphHook;

/* _C.NullContext: contextlib.nullcontext() as the enter's body uses it */
typedef struct {
    PyObject_HEAD
} NullContext;

static PyObject *
NullContext_enter(PyObject *Py_UNUSED(self), PyObject *Py_UNUSED(ignored))
{
    Py_RETURN_NONE;
}

static PyObject *
NullContext_exit(PyObject *Py_UNUSED(self), PyObject *const *Py_UNUSED(args),
                 Py_ssize_t Py_UNUSED(nargs))
{
    Py_RETURN_NONE;
}

static PyMethodDef NullContext_methods[] = {
    {"__enter__", NullContext_enter, METH_NOARGS, NULL},
    {"__exit__", (PyCFunction)(void (*)(void))NullContext_exit, METH_FASTCALL, NULL},
    {NULL, NULL, 0, NULL},
};

static PyType_Slot NullContext_slots[] = {
    {Py_tp_methods, NullContext_methods},
    {Py_tp_doc, (void *)"What contextlib.nullcontext() does as a context manager; "
                        "PregraphHook's enter returns the one instance."},
    {0, NULL},
};

PyType_Spec NullContext_spec = {
    .name = "torch_aot_rt._C.NullContext",
    .basicsize = sizeof(NullContext),
    .flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_IMMUTABLETYPE | Py_TPFLAGS_DISALLOW_INSTANTIATION,
    .slots = NullContext_slots,
};

/* ---- the bodies --------------------------------------------------------- */

/* record_pregraph_bytecode_enter's body */
static PyObject *
enter_body(PyObject *op, PyObject *const *Py_UNUSED(argv), size_t Py_UNUSED(nargsf),
           PyObject *Py_UNUSED(kwnames))
{
    rt_state *st = ((PregraphHook *)op)->st;
    PyObject *on = PyDict_GetItemWithError(st->profiler_globals, st->str_is_profiler_enabled);
    if (on == NULL) {
        if (!PyErr_Occurred()) {
            PyErr_SetString(PyExc_AttributeError,
                            "module 'torch.autograd.profiler' has no attribute "
                            "'_is_profiler_enabled'");
        }
        return NULL;
    }
    int v = PyObject_IsTrue(on);
    if (v < 0) {
        return NULL;
    }
    PyObject *cm = v ? PyObject_CallOneArg(st->RecordFunctionFast, st->str_pregraph_range)
                     : Py_NewRef(st->null_context);
    if (cm != NULL && rt_context_enter(st, cm) < 0) {
        Py_CLEAR(cm);
    }
    return cm;
}

/* record_pregraph_bytecode_exit's body: cm.__exit__(None, None, None) */
static PyObject *
exit_body(PyObject *op, PyObject *const *argv, size_t Py_UNUSED(nargsf),
          PyObject *Py_UNUSED(kwnames))
{
    if (rt_context_exit(((PregraphHook *)op)->st, argv[0], 0) < 0) {
        return NULL;
    }
    Py_RETURN_NONE;
}

/* ---- the call ----------------------------------------------------------- */

static PyObject *
PregraphHook_vectorcall(PyObject *op, PyObject *const *argv, size_t nargsf, PyObject *kwnames)
{
    PregraphHook *self = (PregraphHook *)op;
    rt_state *st = self->st;
    Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
    /* the C runtime off, or arguments the body does not take (its error
     * is upstream's, raised inside _fn): upstream's inner */
    if (PyList_GET_ITEM(self->switch_, 0) != Py_True || kwnames != NULL ||
        nargs != (self->exit ? 1 : 0)) {
        st->pregraph_counts[RT_PREGRAPH_UPSTREAM]++;
        return PyObject_Vectorcall(self->upstream, argv, nargsf, kwnames);
    }
    /* inner: getattr(fn, "__dynamo_disable", None) */
    PyObject *wrapper = PyObject_GetAttr(self->fn, st->str_dynamo_disable);
    if (wrapper == NULL) {
        if (!PyErr_ExceptionMatches(PyExc_AttributeError)) {
            return NULL;
        }
        PyErr_Clear();
    }
    Py_XDECREF(wrapper); /* compared by identity only; fn keeps it */
    if (wrapper != self->wrapper) {
        st->pregraph_counts[RT_PREGRAPH_UPSTREAM]++;
        return PyObject_Vectorcall(self->upstream, argv, nargsf, kwnames);
    }
    /* _fn */
    rt_disable_state *ds = &st->disable;
    PyObject *fn = PyCell_GET(self->fn_cell);
    int path = fn != self->fn ? RT_DISABLE_CALL_REPLACED
                              : rt_disable_fast_path(ds, self->ctx_cell, fn);
    if (path < 0) {
        return NULL;
    }
    if (path != RT_DISABLE_CALL_C) {
        st->pregraph_counts[RT_PREGRAPH_WRAPPER]++;
        return PyObject_Vectorcall(self->wrapper, argv, nargsf, kwnames);
    }
    st->pregraph_counts[RT_PREGRAPH_C]++;
    return rt_disable_run(ds, self->exit ? exit_body : enter_body, op, argv, nargsf, kwnames);
}

/* ---- construction ------------------------------------------------------- */

static PyObject *
PregraphHook_new(PyTypeObject *type, PyObject *args, PyObject *kwargs)
{
    static char *keywords[] = {"upstream", "fn", "wrapper", "switch", "exit", NULL};
    PyObject *upstream, *fn, *wrapper, *switch_;
    int exit = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OOOO!$p:PregraphHook", keywords, &upstream,
                                     &fn, &wrapper, &PyList_Type, &switch_, &exit)) {
        return NULL;
    }
    if (PyList_GET_SIZE(switch_) != 1 || !PyCallable_Check(upstream)) {
        PyErr_SetString(PyExc_ValueError,
                        "PregraphHook: upstream must be callable, switch a one-item list");
        return NULL;
    }
    PregraphHook *self = (PregraphHook *)rt_fn_alloc(type, PregraphHook_vectorcall);
    if (self == NULL) {
        return NULL;
    }
    rt_disable_state *ds = &self->st->disable;
    PyObject *closure = NULL;
    if (ds->fn_code != NULL && PyFunction_Check(wrapper) &&
        PyFunction_GET_CODE(wrapper) == ds->fn_code) {
        closure = PyFunction_GET_CLOSURE(wrapper);
    }
    if (closure == NULL || !PyTuple_Check(closure) ||
        PyTuple_GET_SIZE(closure) <= Py_MAX(ds->fn_cell, ds->ctx_cell) ||
        PyCell_GET(PyTuple_GET_ITEM(closure, ds->fn_cell)) != fn) {
        PyErr_SetString(PyExc_TypeError,
                        "PregraphHook: wrapper must be the torch._dynamo.disable wrapper "
                        "of fn (and _bind_disable() called)");
        Py_DECREF(self);
        return NULL;
    }
    self->exit = exit;
    self->upstream = Py_NewRef(upstream);
    self->fn = Py_NewRef(fn);
    self->wrapper = Py_NewRef(wrapper);
    self->fn_cell = Py_NewRef(PyTuple_GET_ITEM(closure, ds->fn_cell));
    self->ctx_cell = Py_NewRef(PyTuple_GET_ITEM(closure, ds->ctx_cell));
    self->switch_ = Py_NewRef(switch_);
    return (PyObject *)self;
}

static int
PregraphHook_traverse(PregraphHook *self, visitproc visit, void *arg)
{
    Py_VISIT(Py_TYPE(self));
    Py_VISIT(self->module);
    Py_VISIT(self->dict);
    Py_VISIT(self->upstream);
    Py_VISIT(self->fn);
    Py_VISIT(self->wrapper);
    Py_VISIT(self->fn_cell);
    Py_VISIT(self->ctx_cell);
    Py_VISIT(self->switch_);
    return 0;
}

static int
PregraphHook_clear(PregraphHook *self)
{
    Py_CLEAR(self->dict);
    Py_CLEAR(self->upstream);
    Py_CLEAR(self->fn);
    Py_CLEAR(self->wrapper);
    Py_CLEAR(self->fn_cell);
    Py_CLEAR(self->ctx_cell);
    Py_CLEAR(self->switch_);
    return 0;
}

DEFINE_DEALLOC(PregraphHook, (void)0)
FN_MEMBERS(PregraphHook)
FN_SPEC(PregraphHook,
        "PregraphHook(upstream, fn, wrapper, switch, *, exit=False): what "
        "torch._dynamo.utils.record_pregraph_bytecode_enter (exit: _exit), `upstream`, "
        "does when called: in C where the C runtime is on and the disable wrapper's "
        "state allows it; upstream's otherwise.")

/* ---- counts ------------------------------------------------------------- */

static const char *const count_names[RT_PREGRAPH_N] = {
    [RT_PREGRAPH_C] = "calls in C",
    [RT_PREGRAPH_WRAPPER] = "upstream calls: the disable wrapper's state",
    [RT_PREGRAPH_UPSTREAM] = "upstream calls: switched off, another wrapper or other arguments",
};

PyObject *
rt_pregraph_stats(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    rt_state *st = PyModule_GetState(module);
    return rt_counts_dict("_pregraph_stats", args, nargs, count_names, st->pregraph_counts,
                          RT_PREGRAPH_N);
}
