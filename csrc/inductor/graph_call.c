/* graph_call.c: GraphCall, inductor's CompiledFxGraph.__call__ in C.
 *
 * Every call of a graph inductor compiled runs CompiledFxGraph.__call__
 * (torch/_inductor/output_code.py) around the graph's generated `call`:
 *
 *     assert self.current_callable is not None      # 2.14: raise AssertionError(msg)
 *     if debug.RECORD_GRAPH_EXECUTION and debug.GRAPH_EXECUTION_ORDER is not None:
 *         ... append the compile id ...
 *     # 2.13 on: the autotune-cache bundler of the graph's compile context
 *     ctx = self._compile_context
 *     active = AutotuneCacheBundler.has_active_compile(ctx)    # False when ctx is None
 *     try:
 *         with (compile_context(ctx) if active else nullcontext()):
 *             try:
 *                 if torch.autograd.profiler._is_profiler_enabled:
 *                     with _RecordFunctionFast(f"## Call CompiledFxGraph {key} ##", ...):
 *                         return self.current_callable(inputs)
 *                 else:
 *                     return self.current_callable(inputs)
 *             finally:
 *                 get_runtime_metrics_context().finish()
 *                 if active: AutotuneCacheBundler.end_compile()
 *     finally:
 *         if active and not has_active_compile(ctx): self._compile_context = None
 *
 * (2.12: no compile context; its finally calls get_runtime_metrics_context()
 * .finish() and AutotuneCacheBundler.end_compile(), which does something
 * only while the class's _bundler is set.)
 *
 * A GraphCall replaces the class's __call__ (a method descriptor: called
 * with the graph as its first argument). Graphs compiled with the C runtime
 * off keep upstream's __call__: _graph_call.py marks the others when their
 * post_compile runs (rt_graph_call_mark, a registry of weak references by
 * id). For a marked graph it reads what upstream reads on each call, in the
 * same order, and in the steady state (a current callable, no
 * graph-execution recording, no compile context, the profiler off) calls
 * current_callable(inputs) itself, then does the
 * `finally` in C: the thread's RuntimeMetricsContext (made by upstream's
 * get_runtime_metrics_context where the thread has none yet) is finished
 * only when it holds metrics (finish() does nothing otherwise), and on 2.12
 * end_compile() runs only when the class's _bundler is set. Any other state
 * calls upstream's __call__ before anything happened. The plan bits
 * (compile_context, assert_message) are the release's, given at install.
 * ====================================================================== */
#include "fn_object.h"
#include "inductor/inductor.h"
#include "util/intern_names.h"
#include "util/objects.h"
#include "util/py_compat.h"

typedef struct {
    RT_FN_HEAD
    PyObject *upstream;        /* CompiledFxGraph.__call__, upstream's */
    PyObject *debug_globals;   /* torch._inductor.debug.__dict__ */
    PyObject *utils_globals;   /* torch._dynamo.utils.__dict__ */
    PyObject *metrics_cls;     /* RuntimeMetricsContext */
    PyObject *bundler_cls;     /* AutotuneCacheBundler (2.12: its _bundler per call) */
    PyObject *assert_message;  /* 2.14 on: the AssertionError's message; NULL: a bare assert */
    bool compile_context;      /* 2.13 on: self._compile_context */
} GraphCall;

/* ---- the graphs compiled with the C runtime on ------------------------------ */

/* registry key: the graph's address (CompiledFxGraph, a dataclass, is not
 * hashable); the value a weak reference to it, so an address reused by
 * another object after the graph died does not count */
static int
graph_marked(rt_state *st, PyObject *graph)
{
    /* the weak reference found last (a model's calls run the same graphs) */
    if (st->inductor.obj.graph_call_last != NULL && rt_weakref_is(st->inductor.obj.graph_call_last, graph)) {
        return 1;
    }
    PyObject *key = PyLong_FromVoidPtr(graph);
    if (key == NULL) {
        return -1;
    }
    PyObject *ref = PyDict_GetItemWithError(st->inductor.obj.graph_call_graphs, key);
    Py_DECREF(key);
    if (ref == NULL) {
        return PyErr_Occurred() ? -1 : 0;
    }
    if (!rt_weakref_is(ref, graph)) {
        return 0;
    }
    Py_XSETREF(st->inductor.obj.graph_call_last, Py_NewRef(ref));
    return 1;
}

PyObject *
rt_graph_call_mark(PyObject *module, PyObject *graph)
{
    rt_state *st = PyModule_GetState(module);
    PyObject *key = PyLong_FromVoidPtr(graph);
    PyObject *ref = key != NULL ? PyWeakref_NewRef(graph, NULL) : NULL;
    int rc = ref != NULL ? PyDict_SetItem(st->inductor.obj.graph_call_graphs, key, ref) : -1;
    Py_XDECREF(key);
    Py_XDECREF(ref);
    if (rc < 0) {
        return NULL;
    }
    Py_RETURN_NONE;
}

/* ---- per call ------------------------------------------------------------ */

/* globals[name], truthy: 1 / 0, or -1 with an exception (an absent global
 * is the NameError... upstream reads module attributes: AttributeError). */
static int
global_truthy(PyObject *globals, PyObject *name, const char *module)
{
    PyObject *v = PyDict_GetItemWithError(globals, name);
    if (v == NULL) {
        if (!PyErr_Occurred()) {
            PyErr_Format(PyExc_AttributeError, "module '%s' has no attribute '%U'", module, name);
        }
        return -1;
    }
    return PyObject_IsTrue(v);
}

/* RT_GRAPH_CALL_C when the call can run in C, else why upstream's runs;
 * -1 with an exception (nothing observable happened: these are reads). */
static int
fast_path(GraphCall *self, PyObject *graph)
{
    rt_state *st = self->st;
    rt_inductor_names *n = &st->inductor.names;
    /* RECORD_GRAPH_EXECUTION and GRAPH_EXECUTION_ORDER is not None */
    int v = global_truthy(self->debug_globals, n->str_record_graph_execution, "torch._inductor.debug");
    if (v != 0) {
        if (v < 0) {
            return -1;
        }
        PyObject *order = PyDict_GetItemWithError(self->debug_globals, n->str_graph_execution_order);
        if (order == NULL && PyErr_Occurred()) {
            return -1;
        }
        if (order != Py_None) {
            return RT_GRAPH_CALL_RECORDING;
        }
    }
    if (self->compile_context) {
        PyObject *ctx = PyObject_GetAttr(graph, n->str_compile_context);
        if (ctx == NULL) {
            return -1;
        }
        Py_DECREF(ctx);
        if (ctx != Py_None) {
            return RT_GRAPH_CALL_COMPILE_CONTEXT;
        }
    }
    v = global_truthy(st->torch.obj.profiler_globals, st->torch.obj.str_is_profiler_enabled, "torch.autograd.profiler");
    if (v != 0) {
        return v < 0 ? -1 : RT_GRAPH_CALL_PROFILER;
    }
    return RT_GRAPH_CALL_C;
}

/* get_runtime_metrics_context().finish(), and on 2.12
 * AutotuneCacheBundler.end_compile(): 0, or -1 with an exception. */
static int
finally_steps(GraphCall *self)
{
    rt_inductor_names *n = &self->st->inductor.names;
    PyObject *tls = PyDict_GetItemWithError(self->utils_globals, n->str_metrics_tls);
    if (tls == NULL) {
        if (!PyErr_Occurred()) {
            PyErr_SetString(PyExc_NameError, "name '_metrics_context_tls' is not defined");
        }
        return -1;
    }
    PyObject *ctx;
    int found = rt_tls_get(&self->st->thread_locals, RT_TLS_METRICS, tls,
                           n->str_runtime_metrics_context, &ctx);
    if (found < 0) {
        return -1;
    }
    if (!found) {
        /* the thread's first: upstream's getter makes it */
        PyObject *getter = PyDict_GetItemWithError(self->utils_globals, n->str_get_runtime_metrics);
        if (getter == NULL) {
            if (!PyErr_Occurred()) {
                PyErr_SetString(PyExc_NameError,
                                "name 'get_runtime_metrics_context' is not defined");
            }
            return -1;
        }
        ctx = PyObject_CallNoArgs(getter);
        if (ctx == NULL) {
            return -1;
        }
    }
    int rc = 0;
    int idle = 0;
    if (Py_IS_TYPE(ctx, (PyTypeObject *)self->metrics_cls)) {
        /* RuntimeMetricsContext.finish: `if self._metrics:` */
        PyObject *metrics = PyObject_GetAttr(ctx, n->str_metrics);
        if (metrics == NULL) {
            rc = -1;
        }
        else {
            int truthy = PyObject_IsTrue(metrics);
            Py_DECREF(metrics);
            if (truthy < 0) {
                rc = -1;
            }
            idle = truthy == 0;
        }
    }
    if (rc == 0 && !idle) {
        PyObject *r = PyObject_CallMethodNoArgs(ctx, n->str_finish);
        if (r == NULL) {
            rc = -1;
        }
        Py_XDECREF(r);
    }
    Py_DECREF(ctx);
    if (rc < 0 || self->compile_context) {
        return rc;
    }
    /* 2.12: AutotuneCacheBundler.end_compile(): `if bundler := cls._bundler:` */
    PyObject *bundler = PyObject_GetAttr(self->bundler_cls, n->str_bundler);
    if (bundler == NULL) {
        return -1;
    }
    int active = PyObject_IsTrue(bundler);
    Py_DECREF(bundler);
    if (active <= 0) {
        return active;
    }
    PyObject *r = PyObject_CallMethodNoArgs(self->bundler_cls, n->str_end_compile);
    if (r == NULL) {
        return -1;
    }
    Py_DECREF(r);
    return 0;
}

static PyObject *
GraphCall_vectorcall(PyObject *op, PyObject *const *argv, size_t nargsf, PyObject *kwnames)
{
    GraphCall *self = (GraphCall *)op;
    rt_state *st = self->st;
    rt_inductor_names *n = &st->inductor.names;
    int marked = PyVectorcall_NARGS(nargsf) == 2 && kwnames == NULL
                     ? graph_marked(st, argv[0])
                     : 0;
    if (marked <= 0) {
        if (marked < 0) {
            return NULL;
        }
        st->inductor.graph_call_counts[RT_GRAPH_CALL_UPSTREAM]++;
        return PyObject_Vectorcall(self->upstream, argv, nargsf, kwnames);
    }
    PyObject *graph = argv[0];
    /* assert self.current_callable is not None */
    PyObject *current = PyObject_GetAttr(graph, n->str_current_callable);
    if (current == NULL) {
        return NULL;
    }
    if (current == Py_None) {
        Py_DECREF(current);
        if (self->assert_message != NULL) {
            PyErr_SetObject(PyExc_AssertionError, self->assert_message);
        }
        else {
            PyErr_SetNone(PyExc_AssertionError);
        }
        return NULL;
    }
    int path = fast_path(self, graph);
    if (path != RT_GRAPH_CALL_C) {
        Py_DECREF(current);
        if (path < 0) {
            return NULL;
        }
        st->inductor.graph_call_counts[path]++;
        return PyObject_Vectorcall(self->upstream, argv, nargsf, kwnames);
    }
    st->inductor.graph_call_counts[RT_GRAPH_CALL_C]++;
    PyObject *result = PyObject_Vectorcall(current, argv + 1, 1, NULL);
    Py_DECREF(current);
    /* finally: */
    rt_pending_error saved;
    rt_finally_begin(&saved);
    int ok = finally_steps(self) == 0;
    if (rt_finally_end(&saved, ok) < 0) {
        Py_CLEAR(result);
    }
    return result;
}

/* ---- construction --------------------------------------------------------- */

static PyObject *
GraphCall_new(PyTypeObject *type, PyObject *args, PyObject *kwargs)
{
    static char *keywords[] = {"upstream", "debug", "utils", "metrics_cls", "bundler_cls",
                               "compile_context", "assert_message", NULL};
    PyObject *upstream, *debug, *utils, *metrics_cls, *bundler_cls;
    PyObject *message = Py_None;
    int compile_context;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "$OO!O!O!O!pO:GraphCall", keywords,
                                     &upstream, &PyModule_Type, &debug, &PyModule_Type, &utils,
                                     &PyType_Type, &metrics_cls, &PyType_Type, &bundler_cls,
                                     &compile_context, &message)) {
        return NULL;
    }
    if (!PyCallable_Check(upstream) || (message != Py_None && !PyUnicode_Check(message))) {
        PyErr_SetString(PyExc_ValueError,
                        "GraphCall: upstream must be callable, assert_message a str or None");
        return NULL;
    }
    GraphCall *self = (GraphCall *)rt_fn_alloc(type, GraphCall_vectorcall);
    if (self == NULL) {
        return NULL;
    }
    self->upstream = Py_NewRef(upstream);
    self->debug_globals = Py_NewRef(PyModule_GetDict(debug));
    self->utils_globals = Py_NewRef(PyModule_GetDict(utils));
    self->metrics_cls = Py_NewRef(metrics_cls);
    self->bundler_cls = Py_NewRef(bundler_cls);
    self->assert_message = message == Py_None ? NULL : Py_NewRef(message);
    self->compile_context = compile_context != 0;
    return (PyObject *)self;
}

static int
GraphCall_traverse(GraphCall *self, visitproc visit, void *arg)
{
    Py_VISIT(Py_TYPE(self));
    Py_VISIT(self->module);
    Py_VISIT(self->dict);
    Py_VISIT(self->upstream);
    Py_VISIT(self->debug_globals);
    Py_VISIT(self->utils_globals);
    Py_VISIT(self->metrics_cls);
    Py_VISIT(self->bundler_cls);
    Py_VISIT(self->assert_message);
    return 0;
}

static int
GraphCall_clear(GraphCall *self)
{
    Py_CLEAR(self->dict);
    Py_CLEAR(self->upstream);
    Py_CLEAR(self->debug_globals);
    Py_CLEAR(self->utils_globals);
    Py_CLEAR(self->metrics_cls);
    Py_CLEAR(self->bundler_cls);
    Py_CLEAR(self->assert_message);
    return 0;
}

DEFINE_DEALLOC(GraphCall, (void)0)
FN_MEMBERS(GraphCall)
FN_SPEC(GraphCall,
        "GraphCall(*, upstream, debug, utils, metrics_cls, bundler_cls, compile_context, "
        "assert_message): what inductor's CompiledFxGraph.__call__, `upstream`, does, in C "
        "for graphs marked by _graph_call_mark in the steady state (no recording, no "
        "compile context, the profiler off); upstream's otherwise.")

/* ---- registration and counts ---------------------------------------------- */

int
rt_inductor_types_init(PyObject *module, rt_state *st)
{
    st->inductor.types.GraphCallType = (PyTypeObject *)PyType_FromModuleAndSpec(module, &GraphCall_spec, NULL);
    if (st->inductor.types.GraphCallType == NULL || PyModule_AddType(module, st->inductor.types.GraphCallType) < 0) {
        return -1;
    }
    st->inductor.obj.graph_call_graphs = PyDict_New();
    return st->inductor.obj.graph_call_graphs != NULL ? 0 : -1;
}

static const char *const count_names[RT_GRAPH_CALL_N] = {
    [RT_GRAPH_CALL_C] = "calls in C",
    [RT_GRAPH_CALL_UPSTREAM] = "upstream calls: compiled with the C runtime off, or other arguments",
    [RT_GRAPH_CALL_RECORDING] = "upstream calls: graph execution recorded",
    [RT_GRAPH_CALL_COMPILE_CONTEXT] = "upstream calls: an autotune-cache compile context",
    [RT_GRAPH_CALL_PROFILER] = "upstream calls: profiler on",
};

PyObject *
rt_graph_call_stats(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    rt_state *st = PyModule_GetState(module);
    return rt_counts_dict("_graph_call_stats", args, nargs, count_names, st->inductor.graph_call_counts,
                          RT_GRAPH_CALL_N);
}

/* ---- inductor's part of the module state ------------------------------------- */

#define NAME(field) offsetof(rt_inductor_names, field)

int
rt_inductor_init(rt_state *st)
{
    static const rt_name_field names[] = {
        {NAME(str_current_callable), "current_callable"},
        {NAME(str_compile_context), "_compile_context"},
        {NAME(str_record_graph_execution), "RECORD_GRAPH_EXECUTION"},
        {NAME(str_graph_execution_order), "GRAPH_EXECUTION_ORDER"},
        {NAME(str_metrics_tls), "_metrics_context_tls"},
        {NAME(str_runtime_metrics_context), "runtime_metrics_context"},
        {NAME(str_get_runtime_metrics), "get_runtime_metrics_context"},
        {NAME(str_metrics), "_metrics"},
        {NAME(str_finish), "finish"},
        {NAME(str_bundler), "_bundler"},
        {NAME(str_end_compile), "end_compile"},
    };
    return rt_intern_names(&st->inductor.names, names, sizeof(names) / sizeof(names[0]));
}
#undef NAME

int
rt_inductor_traverse(rt_state *st, visitproc visit, void *arg)
{
    rt_inductor_state *in = &st->inductor;
    int rc;
    if ((rc = RT_OBJECTS_TRAVERSE(in->obj, visit, arg)) != 0 ||
        (rc = RT_OBJECTS_TRAVERSE(in->names, visit, arg)) != 0) {
        return rc;
    }
    return RT_TYPES_TRAVERSE(in->types, visit, arg);
}

void
rt_inductor_clear(rt_state *st)
{
    rt_inductor_state *in = &st->inductor;
    RT_OBJECTS_CLEAR(in->obj);
    RT_OBJECTS_CLEAR(in->names);
    RT_TYPES_CLEAR(in->types);
}
