/* inductor: inductor's per-call layer in C: CompiledFxGraph.__call__
 * (graph_call.c). Its part of the module state is declared here. */
#ifndef TORCH_AOT_RT_INDUCTOR_H
#define TORCH_AOT_RT_INDUCTOR_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>

/* How each call of a GraphCall ran. */
enum rt_graph_call_count {
    RT_GRAPH_CALL_C,               /* in C */
    RT_GRAPH_CALL_UPSTREAM,        /* upstream's: compiled with the C runtime off, other arguments */
    RT_GRAPH_CALL_RECORDING,       /* upstream's: debug.RECORD_GRAPH_EXECUTION */
    RT_GRAPH_CALL_COMPILE_CONTEXT, /* upstream's: the graph keeps a compile context (its first calls) */
    RT_GRAPH_CALL_PROFILER,        /* upstream's: the profiler is on (its range) */
    RT_GRAPH_CALL_N
};

/* interned once, at module init (rt_inductor_init); owned references only,
 * traversed and cleared as an array (objects.h) */
typedef struct {
    PyObject *str_current_callable, *str_compile_context;
    PyObject *str_record_graph_execution, *str_graph_execution_order;
    PyObject *str_metrics_tls, *str_runtime_metrics_context, *str_get_runtime_metrics;
    PyObject *str_metrics, *str_finish, *str_bundler, *str_end_compile;
} rt_inductor_names;

/* inductor's part of the module state */
typedef struct {
    /* owned references only, visited and cleared as an array (objects.h) */
    struct {
        PyObject *graph_call_graphs;      /* {id(graph): weakref}: compiled with C on */
        PyObject *graph_call_last;        /* the weakref of it graph_marked found last */
    } obj;
    rt_inductor_names names;
    struct {
        PyTypeObject *GraphCallType;
    } types;
    Py_ssize_t graph_call_counts[RT_GRAPH_CALL_N];
} rt_inductor_state;

struct rt_state;
/* Its life, driven by state.c's table: interned names at module exec, GC
 * support. */
int rt_inductor_init(struct rt_state *st);
int rt_inductor_traverse(struct rt_state *st, visitproc visit, void *arg);
void rt_inductor_clear(struct rt_state *st);
extern PyType_Spec GraphCall_spec;
/* Creates the GraphCall type into the module state. */
int rt_inductor_types_init(PyObject *module, struct rt_state *st);
/* _C._graph_call_mark(graph): graph's calls may run in C (it was compiled
 * with the C runtime on) */
PyObject *rt_graph_call_mark(PyObject *module, PyObject *graph);
/* _C._graph_call_stats(reset=False) */
PyObject *rt_graph_call_stats(PyObject *module, PyObject *const *args, Py_ssize_t nargs);

#endif
