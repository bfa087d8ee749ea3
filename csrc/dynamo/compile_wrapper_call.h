/* compile_wrapper_call.h: what compile_wrapper's files share, private to
 * dynamo/: the CompileWrapper object, one call's view of the function and of
 * its context, and the steps the call file takes from the others. */
#ifndef TORCH_AOT_RT_COMPILE_WRAPPER_CALL_H
#define TORCH_AOT_RT_COMPILE_WRAPPER_CALL_H

#include "config/config_patch.h"
#include "dynamo/compile_wrapper.h"
#include "dynamo/dynamo.h"
#include "fn_object.h"
#include "util/attr_memo.h"
#include "util/dict_version.h"
#include "util/frame_stub.h"
#include "util/py_compat.h"

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

/* The context's attributes a call reads (rt_cw_ctx_attr) */
enum { CTX_EXPORT, CTX_FULLGRAPH, CTX_EOG, CTX_HOOKS, CTX_ISOLATE_ID, CTX_N };

/* The state the functions made ours call with (set by the first; a
 * function's vectorcall has no room for it), and a plain Python function's
 * own vectorcall, for calls that are not ours. */
extern rt_state *rt_cw_bound_state;
extern vectorcallfunc rt_cw_plain_call;

/* rt_call_one whose result is dropped: 0, or -1 with an exception */
static inline int
do1(PyObject *f, PyObject *arg)
{
    PyObject *r = rt_call_one(f, arg);
    Py_XDECREF(r);
    return r != NULL ? 0 : -1;
}

/* f() whose result is dropped: 0, or -1 with an exception */
static inline int
do0(PyObject *f)
{
    PyObject *r = PyObject_CallNoArgs(f);
    Py_XDECREF(r);
    return r != NULL ? 0 : -1;
}

/* compile_wrapper.c: the CompileWrapper's vectorcall (3.11: the trampoline
 * calls it), the vectorcall of a function made ours */
PyObject *rt_cw_vectorcall(PyObject *op, PyObject *const *argv, size_t nargsf, PyObject *kwnames);
PyObject *rt_cw_exit(PyObject *op, PyObject *arg);
PyObject *rt_cw_function_call(PyObject *fn, PyObject *const *argv, size_t nargsf, PyObject *kwnames);

/* compile_wrapper_check.c: the enter hooks a call in C takes, the context's
 * attributes, and the state check (RT_CW_CALL_C, or why not) */
int rt_cw_is_on_enter_hook(rt_cw_state *cw, PyObject *h);
int rt_cw_is_config_patcher(rt_cw_state *cw, PyObject *h);
int rt_cw_patcher_bound(rt_state *st);
int rt_cw_attr_truthy(PyObject *obj, PyObject *name);
int rt_cw_stance_is_default(rt_cw_state *cw, PyObject *stance);
PyObject *rt_cw_ctx_attr(cw_self *self, rt_cw_state *cw, PyObject *ctx, int i);
int rt_cw_steady_state(cw_self *self, rt_cw_state *cw, cw_call *c);

/* compile_wrapper_errors.c: the except clauses (the exit the exception
 * leaves from, or -1), error_on_graph_break's set-up, fullgraph's check */
int rt_cw_transform_exception(rt_cw_state *cw, const rt_frame_call *call);
int rt_cw_enter_error_on_graph_break(rt_cw_state *cw, PyObject *eog, PyObject **prior);
int rt_cw_fullgraph_exit_check(rt_cw_state *cw, PyObject *count);

#endif
