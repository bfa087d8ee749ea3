/* compile_wrapper: Dynamo's compile_wrapper (what torch.compile returns for
 * a function, and OptimizedModule's forward) in C (see compile_wrapper.c).
 * The state it reads, bound once by _C._bind_compile_wrapper after the shim
 * verified what it mirrors (torch_aot_rt/_compile_wrapper.py), kept in
 * rt_state (compile_wrapper_bind.c). */
#ifndef TORCH_AOT_RT_DYNAMO_COMPILE_WRAPPER_H
#define TORCH_AOT_RT_DYNAMO_COMPILE_WRAPPER_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdbool.h>

#include "util/ptr_map.h"

/* How each call of a CompileWrapper ran. */
enum rt_cw_count {
    RT_CW_BUILT,        /* a compile_wrapper made a CompileWrapper */
    RT_CW_CALL_C,       /* a call ran in C */
    RT_CW_STATE,        /* upstream's: a stance, a tracing context, exporting, FX or jit
                         * tracing, a nested eager region, export, other hooks */
    RT_CW_REPLACED,     /* upstream's: a helper of eval_frame it reads was replaced */
    RT_CW_MODULE_C,     /* an OptimizedModule call in C (optimized_module.c) */
    RT_CW_MODULE_UPSTREAM, /* upstream's: forward not a C CompileWrapper, a global hook,
                            * a helper replaced */
    RT_CW_N
};

/* The module globals of torch/_dynamo/eval_frame.py compile_wrapper reads
 * by name per call, where C does what they do: each must still be the
 * object bound (else the call is upstream's). Those a release's
 * compile_wrapper does not read (2.12: the isolate-recompiles id, the skip
 * reasons; 2.11 those and the fullgraph flag and count, where it has the
 * eval-frame override) are not bound (names[g] NULL). */

/* What fullgraph=True does around the call (_versions.Release.
 * compile_wrapper_fullgraph). */
typedef enum {
    RT_CW_FG_RAISE,    /* 2.13 on: nested flag, frame count, skip reasons, RuntimeError */
    RT_CW_FG_WARN,     /* 2.12: nested flag, frame count, warn_once */
    RT_CW_FG_OVERRIDE, /* 2.11: set_eval_frame_override(_get_eval_frame_override()) */
} rt_cw_fullgraph;
enum rt_cw_global {
    RT_CWG_SET_EVAL_FRAME,
    RT_CWG_MAYBE_SET_EVAL_FRAME,
    RT_CWG_CALLBACK_FROM_STANCE,
    RT_CWG_SKIP_GUARD_STANCE,      /* _is_skip_guard_eval_unsafe_stance */
    RT_CWG_SET_SKIP_GUARD,         /* set_skip_guard_eval_unsafe */
    RT_CWG_SET_ISOLATE_ID,         /* set_eval_frame_isolate_recompiles_id */
    RT_CWG_SET_FG_NESTED,          /* set_fullgraph_error_on_nested_compile */
    RT_CWG_SET_FG_COUNT,           /* set_fullgraph_compiled_frame_count */
    RT_CWG_RESET_SKIP_REASONS,
    RT_CWG_GET_SKIP_REASONS,
    RT_CWG_INSTALL_TAGGING,        /* install_generation_tagging_init (on_enter's) */
    RT_CWG_TORCH,
    RT_CWG_CONFIG,
    RT_CWG_DYNAMO_TLS,
    RT_CWG_SET_EF_OVERRIDE,        /* 2.11: set_eval_frame_override */
    RT_CWG_GET_EF_OVERRIDE,        /* 2.11: _get_eval_frame_override */
    RT_CWG_EF_OVERRIDE,            /* 2.11: _EvalFrameOverride */
    RT_CWG_N
};

/* Where an exception leaves compile_wrapper's frame, for the traceback
 * entry its frame stub adds (util/frame_stub.h): the call of fn, the
 * re-raise of a compiler error, of a ShortenTraceback, and fullgraph's
 * no-compiled-frames error. */
enum rt_cw_frame {
    RT_CW_FRAME_CALL,
    RT_CW_FRAME_COMPILER_ERROR,
    RT_CW_FRAME_SHORTEN,
    RT_CW_FRAME_FULLGRAPH,
    RT_CW_FRAME_N
};

typedef struct {
    PyObject *code;               /* compile_wrapper's code */
    Py_ssize_t cell[5];           /* callback, fn, is_fx_symbolic_tracing, is_jit_tracing, self */
    PyObject *call_on_enter_code; /* _TorchDynamoContext.__init__'s call_on_enter */
    PyObject *on_enter_code;      /* OptimizeContext.__init__'s on_enter */
    PyObject *patcher_code;       /* ConfigModule._make_closure_patcher's change */
    PyObject *globals;            /* torch._dynamo.eval_frame.__dict__ */
    PyObject *names[RT_CWG_N];    /* interned global names */
    PyObject *expected[RT_CWG_N]; /* the objects bound under them */
    uint64_t globals_verified;    /* globals' version where they all were (dict_version.h) */
    PyObject *stance;             /* the DynamoStance class: _stance's type */
    PyObject *guards_globals;     /* torch._guards.__dict__ (its _TLS) */
    PyObject *compiler_globals;   /* torch.compiler.__dict__ (_is_exporting_flag) */
    PyObject *fx_globals;         /* torch.fx._symbolic_trace.__dict__ (_is_fx_tracing_flag) */
    int tag_patch_present;        /* str_tag_patch's presence marks Module patched (2.15 on),
                                   * else its falsy value */
    PyObject *fx_flag_tls;        /* 2.14 on: its _is_fx_tracing_tls (the flag's home), or NULL */
    PyObject *is_fx_symbolic_tracing, *is_jit_tracing;
    PyObject *module_cls;         /* torch.nn.Module: ___needs_generation_tag_patch */
    PyObject *generation_tracker; /* mutation_guard.GenerationTracker: generation += 1 */
    PyObject *get_depth, *pop_depth; /* torch._C._functorch dynamic layer stack */
    /* 2.13: include/exclude sets and _ForceDispatchKeyGuard; 2.14 on: the
     * C++ save/restore of the local dispatch key set (save_keys != NULL);
     * 2.12: neither (all NULL) */
    PyObject *include_set, *exclude_set, *force_guard;
    PyObject *save_keys, *restore_keys;
    PyObject *eager_nested;       /* 2.14 on: _force_eager_nested_compile (threading.local) */
    /* what the release's compile_wrapper does (_versions.Release.compile_wrapper_*) */
    int isolate_recompiles;       /* sets and restores the isolate-recompiles id (2.13 on) */
    int eog_where_differs;        /* sets error_on_graph_break only where it differs (2.13 on) */
    int patcher_form;             /* the config patchers' rt_patch_form (config_patch.h) */
    rt_cw_fullgraph fullgraph;
    PyObject *fullgraph_warn;     /* RT_CW_FG_WARN: compile_wrapper's warn_once line, a
                                   * function of eval_frame.py; else NULL */
    PyObject *exc_compiler_error; /* (Unsupported, UncapturedHigherOrderOpError, UserError) */
    PyObject *exc_shorten;        /* ShortenTraceback */
    PyObject *frames[RT_CW_FRAME_N]; /* frame stubs, NULL where none */
    /* CPython 3.11: the code a compile_wrapper function made ours runs (a
     * frame stub at the call of fn whose constant is its CompileWrapper) */
    PyObject *trampoline;
    PyObject *str_replace, *str_consts;
    /* interned attribute names */
    PyObject *str_fullgraph, *str_export, *str_error_on_graph_break, *str_isolate_id;
    PyObject *str_enter_exit_hooks, *str_tracing_context, *str_tls, *str_exporting_flag;
    PyObject *str_fx_flag, *str_flag, *str_tag_patch, *str_generation, *str_stance, *str_default;
    PyObject *str_backend, *str_skip_guard, *str_stance_global, *str_nested_error_config;
    PyObject *str_verbose, *str_skip_reasons, *str_depth, *str_with_traceback;
    PyObject *str_remove_dynamo_frames, *str_get_eog, *str_set_eog, *str_error, *str_skip;
    Py_ssize_t counts[RT_CW_N];
    /* the compile_wrapper functions whose calls C runs: function -> its
     * CompileWrapper (compile_wrapper.c; the table owns a reference) */
    rt_ptr_map fns;
} rt_cw_state;

struct rt_state;
extern PyType_Spec CompileWrapper_spec;
/* _C._bind_compile_wrapper(**what rt_cw_state holds) */
PyObject *rt_bind_compile_wrapper(PyObject *module, PyObject *args, PyObject *kwargs);
/* _C._compile_wrapper_for(wrapper): wrapper, its calls run in C from now on
 * where it is the verified compile_wrapper (counted) */
PyObject *rt_compile_wrapper_for(PyObject *module, PyObject *wrapper);
/* obj is a compile_wrapper function whose calls C runs */
int rt_is_c_compile_wrapper(PyObject *obj);
/* _C._is_c_compile_wrapper(obj) */
PyObject *rt_is_c_compile_wrapper_py(PyObject *module, PyObject *obj);
/* the table of such functions: GC support, and the module's clear */
int rt_cw_fns_traverse(rt_cw_state *cw, visitproc visit, void *arg);
void rt_cw_forget_all(rt_cw_state *cw);
/* _C._compile_wrapper_stats(reset=False) */
PyObject *rt_cw_stats(PyObject *module, PyObject *const *args, Py_ssize_t nargs);
int rt_cw_traverse(rt_cw_state *cw, visitproc visit, void *arg);
void rt_cw_clear(rt_cw_state *cw);

#endif
