/* dynamo_disable: torch._dynamo.disable's wrapper in C, for the compiled
 * backward AOTAutograd's Dynamo backend wraps in it (see dynamo/disable.c). */
#ifndef TORCH_AOT_RT_DYNAMO_DISABLE_H
#define TORCH_AOT_RT_DYNAMO_DISABLE_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdbool.h>

/* How a compiled backward's disable wrapper was handled (once per lazily
 * compiled backward), then how each call of a C wrapper ran. */
enum rt_disable_count {
    RT_DISABLE_BUILT,          /* a compiled backward or graph got the C wrapper */
    RT_DISABLE_NOT_WRAPPER,    /* it is not a disable wrapper */
    RT_DISABLE_UNBOUND,        /* this torch's DisableContext is not the verified one */
    RT_DISABLE_CALL_C,         /* a call ran in C */
    RT_DISABLE_CALL_STANCE,    /* ran upstream's: a stance other than "default", or a callback */
    RT_DISABLE_CALL_EXPORTING, /* ran upstream's: torch.compiler.is_exporting() */
    RT_DISABLE_CALL_REPLACED,  /* ran upstream's: eval_frame's helpers replaced */
    RT_DISABLE_CALL_NAME,      /* ran upstream's: fn.__name__ might run code (2.13) */
    RT_DISABLE_N
};

/* How each call of a BytecodeHelper (dynamo/bytecode_helper.c) ran. */
enum rt_helper_count {
    RT_HELPER_C,        /* in C */
    RT_HELPER_WRAPPER,  /* upstream's disable wrapper (its state: rt_disable_count) */
    RT_HELPER_UPSTREAM, /* upstream's function: switched off, another wrapper, other arguments */
    RT_HELPER_N
};

/* What the wrapper reads, bound by _C._bind_disable once the shim has
 * verified DisableContext.__call__ (torch_aot_rt/_disable.py); all NULL
 * until then, and the compiled backward then keeps upstream's wrapper. */
typedef struct {
    PyObject *fn_code;          /* the code of DisableContext.__call__'s _fn */
    Py_ssize_t fn_cell;         /* index in _fn.__closure__ of `fn` */
    Py_ssize_t ctx_cell;        /* ... and of `self`, the DisableContext */
    PyObject *DisableContext;
    PyObject *eval_frame_globals;  /* torch._dynamo.eval_frame.__dict__ */
    PyObject *torch;               /* the torch module */
    PyObject *compiler;            /* torch.compiler */
    PyObject *compiler_globals;    /* torch.compiler.__dict__ */
    PyObject *set_eval_frame;      /* torch._C._dynamo.eval_frame.set_eval_frame */
    PyObject *callback_from_stance;
    PyObject *is_exporting;        /* torch.compiler.is_exporting */
    PyObject *boxed_code;          /* make_boxed_func's g, or None */
    /* 2.14: the stance's callback is installed, and the prior one restored,
     * only when not None; __name__ is looked up only when exporting. */
    bool skips_none_callback;
    /* interned names */
    PyObject *str_callback, *str_stance_global, *str_stance, *str_default;
    PyObject *str_set_eval_frame, *str_maybe_set_eval_frame, *str_callback_from_stance;
    PyObject *str_torch, *str_compiler, *str_is_exporting, *str_is_exporting_flag;
    PyObject *str_name;
    /* the versions (dict_version.h) of eval_frame's globals where its
     * helpers were the ones bound, and of torch.compiler's and torch's
     * where is_exporting was bound, False, and torch.compiler bound */
    uint64_t eval_frame_verified, compiler_verified, torch_verified;
    Py_ssize_t counts[RT_DISABLE_N];
} rt_disable_state;

struct rt_state;
/* _C._bind_disable(**what rt_disable_state holds) */
PyObject *rt_bind_disable(PyObject *module, PyObject *args, PyObject *kwargs);
/* _C._disable_stats(reset=False) */
PyObject *rt_disable_stats(PyObject *module, PyObject *const *args, Py_ssize_t nargs);
/* RT_DISABLE_CALL_C when a call of a DisableContext's _fn (ctx_cell: its
 * `self` cell; fn: its `fn`) can run in C, else the reason upstream's _fn
 * runs; -1 with an exception set. Nothing observable happens. */
int rt_disable_fast_path(rt_disable_state *ds, PyObject *ctx_cell, PyObject *fn);
/* _fn's work once rt_disable_fast_path said C: the eval-frame callback set
 * and restored around body(fn, argv, nargsf, kwnames), as _fn does around
 * fn(*args, **kwargs); a new reference, or NULL with an exception. */
typedef PyObject *(*rt_disable_body)(PyObject *fn, PyObject *const *argv, size_t nargsf,
                                     PyObject *kwnames);
PyObject *rt_disable_run(rt_disable_state *ds, rt_disable_body body, PyObject *fn,
                         PyObject *const *argv, size_t nargsf, PyObject *kwnames);
/* compiled, or a new C wrapper doing what compiled (a disable wrapper) does;
 * a new reference, counted. */
PyObject *rt_disable_wrapper_for(struct rt_state *st, PyObject *compiled);
/* _C._disable_wrapper_for(obj): the same, for the shim */
PyObject *rt_disable_wrapper_for_py(PyObject *module, PyObject *obj);
int rt_disable_traverse(rt_disable_state *ds, visitproc visit, void *arg);
void rt_disable_clear(rt_disable_state *ds);

#endif
