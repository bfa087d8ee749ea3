/* torch_api: the one door to torch.
 *
 * Every torch callable, type and constant the C runtime needs is looked up
 * once per process, by rt_torch_bind() and the layers' binders (state.c),
 * and kept in the module state. The
 * functions below are the only way the rest of the extension touches torch;
 * each is a thin, exact equivalent of one Python expression upstream writes
 * (named in the comment next to it). The C core links no libtorch: it goes
 * through Python-visible callables, so one build runs on every supported
 * torch. Where the optional C++ part is loaded (torch_cpp_api.h, built for
 * the running torch), some of these functions call its C++ entry points
 * instead, in the states where that is exact; the rest of the extension
 * cannot tell which route ran.
 */
#ifndef TORCH_AOT_RT_TORCH_API_H
#define TORCH_AOT_RT_TORCH_API_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdbool.h>

#include "torch_cpp_api.h"
#include "util/finally.h"

/* Tensor methods the epilogue calls, looked up on the class once. */
enum rt_tensor_method {
    RT_DETACH,
    RT_COPY_,
    RT_AS_STRIDED_,
    RT_SET_,
    RT_SIZE,
    RT_STRIDE,
    RT_STORAGE_OFFSET,
    RT_IS_VIEW,
    RT_IS_CONTIGUOUS,
    RT_REQUIRES_GRAD_,
    RT_CONTIGUOUS,
    RT_N_TENSOR_METHODS
};

/* The epilogue's tensor operations at the torch door (rt_tensor_copy_,
 * rt_tensor_as_strided_like, rt_tensor_set_, rt_alias_by_view_replay),
 * counted by route while the C++ part is in use, for stats(). */
enum rt_epi_route {
    RT_EPI_TAKEN = 0,        /* the C++ part ran it */
    RT_EPI_DECLINED,         /* it declined: a tensor kind, a TorchDispatchMode, ... */
    RT_EPI_NOT_OFFERED,      /* a TorchFunctionMode, a subclass, a plan without it */
    RT_EPI_N_ROUTES
};

/* The door's part of the module state: what it looked up of torch, the
 * names it reads with, and the C++ part's table. It is the first member of
 * the module state (state.h), so the door reaches it from an rt_state *
 * without knowing the layers' parts (rt_door). */
typedef struct {
    /* owned references only, visited and cleared as an array (objects.h) */
    struct {
        PyObject *cpp_capsule;            /* the C++ part's, or NULL: the C core alone */
        /* grad mode, view replay (torch._C) */
        PyObject *is_grad_enabled;
        PyObject *set_grad_enabled;
        PyObject *is_view_replay_enabled;
        PyObject *set_view_replay_enabled;
        PyObject *args_true;              /* (True,) */
        PyObject *args_false;             /* (False,) */
        /* torch._C._DisableAutocast and its unbound __enter__/__exit__ */
        PyObject *DisableAutocast;
        PyObject *DisableAutocast_enter;
        PyObject *DisableAutocast_exit;
        /* torch.Tensor's and torch.nn.Parameter's methods, and their names */
        PyObject *tensor_methods[RT_N_TENSOR_METHODS];
        PyObject *parameter_methods[RT_N_TENSOR_METHODS];
        PyObject *method_names[RT_N_TENSOR_METHODS];
        PyObject *requires_grad_descr;    /* torch.Tensor.requires_grad */
        PyObject *increment_version;      /* torch._C._increment_version */
        PyObject *TensorAlias;            /* aot_autograd schemas.TensorAlias */
        /* the profiler's switch */
        PyObject *profiler_globals;       /* torch.autograd.profiler.__dict__ */
        PyObject *RecordFunctionFast;     /* torch._C._profiler._RecordFunctionFast */
        /* saved-tensor hooks (torch._C._autograd) */
        PyObject *saved_hooks_get_disabled_message;
        PyObject *saved_hooks_disable;
        PyObject *saved_hooks_enable;
        PyObject *saved_hooks_error_message;
        /* thread-local state */
        PyObject *functorch_transforms_active; /* torch._C._are_functorch_transforms_active */
        PyObject *peek_interpreter_stack; /* torch._C._functorch.peek_interpreter_stack */
        PyObject *is_key_in_tls;          /* torch._C._is_key_in_tls */
        PyObject *get_obj_in_tls;         /* torch._C._get_obj_in_tls */
        PyObject *keep_graph;             /* _autograd._get_current_graph_task_keep_graph */
        /* interned names: the autograd ctx's fields (rt_ctx_get/set) and others */
        PyObject *str_to_save;
        PyObject *str_non_differentiable;
        PyObject *str_materialize_non_diff_grads;
        PyObject *str_tensors_no_vc_check;
        PyObject *str_symints;
        PyObject *str_opaque_objects;
        PyObject *str_saved_tensors;
        PyObject *str_external_objects;   /* _external_objects */
        PyObject *str_alias;
        PyObject *str_enter;
        PyObject *str_exit;
        PyObject *str_is_profiler_enabled;
        PyObject *str_requires_grad;
    } obj;
    struct {
        PyTypeObject *Tensor;             /* torch.Tensor */
        PyTypeObject *Parameter;          /* torch.nn.Parameter */
    } types;
    int bound;                            /* every layer's bind succeeded (state.c) */
    /* The C++ part (torch_cpp_api.h), or NULL: the C core alone; the
     * capsule owns the pointer's lifetime. */
    const rt_cpp_api *cpp;
    /* The same table while cpp is switched off for a same-run comparison
     * (_C._set_cpp_routes): nodes it made still need their own calls. */
    const rt_cpp_api *cpp_loaded;
    /* The two setters are METH_VARARGS|METH_KEYWORDS builtins on the hot
     * path of every call: we call their C function with prebuilt (True,) /
     * (False,) tuples, skipping the per-call tuple CPython would build.
     * NULL when a torch version defines them otherwise; self borrowed from
     * the setter, which obj keeps alive. */
    PyCFunctionWithKeywords set_grad_enabled_c;
    PyObject *set_grad_enabled_self;
    PyCFunctionWithKeywords set_view_replay_enabled_c;
    PyObject *set_view_replay_enabled_self;
    int parameter_plain;                  /* Parameter's methods are Tensor's */
    Py_ssize_t epi_counts[RT_EPI_N_ROUTES];
} rt_torch_state;

/* The module state (state.h): the door's part first, then each layer's. */
typedef struct rt_state rt_state;

static inline rt_torch_state *
rt_door(rt_state *st)
{
    return (rt_torch_state *)st; /* its first member (state.h checks it) */
}

/* The door's life, driven by state.c's table with the layers': its
 * interned names at module exec; torch's look-ups and the C++ part's
 * table (a capsule, or None) once torch imports; GC support. */
int rt_torch_init(rt_state *st);
int rt_torch_bind(rt_state *st, PyObject *cpp_capsule, int input_grad_buffers);
int rt_torch_traverse(rt_state *st, visitproc visit, void *arg);
void rt_torch_clear(rt_state *st);

/* bool(fn()): 1, 0, or -1 with an exception set */
int rt_call_predicate(PyObject *fn);

/* Grad mode: torch.is_grad_enabled() / torch._C._set_grad_enabled(b).
 * rt_grad_enabled returns 1, 0, or -1 with an exception set. */
int rt_grad_enabled(rt_state *st);
int rt_set_grad_enabled(rt_state *st, int enabled);
/* torch._C._is_view_replay_enabled() / _set_view_replay_enabled(b) */
int rt_view_replay_enabled(rt_state *st);
int rt_set_view_replay_enabled(rt_state *st, int enabled);

/* The backward's and forward's queries of autograd and functorch state,
 * through the C++ part where it is loaded (torch_cpp_api.h), else the
 * Python callable: 1, 0, or -1 with an exception set. */
/* torch._C._are_functorch_transforms_active() */
int rt_functorch_transforms_active(rt_state *st);
/* torch._C._functorch.peek_interpreter_stack() is not None (always the
 * Python callable) */
int rt_functorch_interpreter_active(rt_state *st);
/* torch._C._autograd._get_current_graph_task_keep_graph() */
int rt_graph_task_keep_graph(rt_state *st);
/* torch._C._get_obj_in_tls(key) if torch._C._is_key_in_tls(key): 0 with
 * *out a new reference or NULL (absent), -1 with an exception set. */
int rt_tls_object(rt_state *st, PyObject *key, PyObject **out);

/* `with torch._C._DisableAutocast():` -> returns the guard object, or NULL. */
PyObject *rt_disable_autocast_enter(rt_state *st);
/* Leaves the guard; `failed` says whether an exception is pending (it is
 * handed to __exit__ as a with-statement would, and kept). */
int rt_disable_autocast_exit(rt_state *st, PyObject *guard, int failed);

/* A compiled function's result as a list: normalize_as_list (a tuple
 * becomes a list, anything else not a list is wrapped). Steals `out`, which
 * may be NULL (an error passed on). */
PyObject *rt_as_list(PyObject *out);
/* [with _DisableAutocast():] fn(list), normalised: how every compiled
 * graph (forward, backward, the runtime wrapper's callee) is called. */
PyObject *rt_call_boxed(rt_state *st, PyObject *fn, PyObject *list, bool disable_amp);

/* isinstance(obj, torch.Tensor): 1, 0, -1 */
int rt_is_tensor(rt_state *st, PyObject *obj);
/* self.<method>(*args): new reference. */
PyObject *rt_tensor_call(rt_state *st, enum rt_tensor_method m, PyObject *self,
                         PyObject *const *args, Py_ssize_t nargs);
/* ctx is a grad_fn of the C++ part's CompiledFunction node: 1, else 0 */
int rt_is_cpp_node(rt_state *st, PyObject *ctx);
/* getattr(ctx, name) / setattr(ctx, name, value) for the attributes of
 * enum rt_ctx_field: on the C++ node, its getset called directly */
PyObject *rt_ctx_get(rt_state *st, PyObject *ctx, enum rt_ctx_field field);
int rt_ctx_set(rt_state *st, PyObject *ctx, enum rt_ctx_field field, PyObject *value);
/* the same, stealing value, which may be NULL (an error passed on) */
int rt_ctx_set_steal(rt_state *st, PyObject *ctx, enum rt_ctx_field field, PyObject *value);

/* x._is_view(): 1, 0, -1 */
int rt_tensor_is_view(rt_state *st, PyObject *x);
/* x.shape == sizes and x.stride() == strides, the expected ones of ndim
 * plain ints also given as the tuples size_obj / stride_obj: 1, 0, -1 */
int rt_tensor_size_stride_equal(rt_state *st, PyObject *x, Py_ssize_t ndim,
                                const int64_t *sizes, const int64_t *strides,
                                PyObject *size_obj, PyObject *stride_obj);
/* self.requires_grad truth value: 1, 0, -1 */
int rt_tensor_requires_grad(rt_state *st, PyObject *self);
/* The mutation epilogue's tensor operations (upstream's
 * _apply_input_mutations), through the C++ part where it is exact
 * (torch_cpp_api.h epi_*), else the Python methods: 0, or -1 with an
 * exception set. */
/* orig.copy_(src), or orig.detach().copy_(src) when detach */
int rt_tensor_copy_(rt_state *st, PyObject *orig, PyObject *src, int detach);
/* orig.as_strided_(like.size(), like.stride(), like.storage_offset()) */
int rt_tensor_as_strided_like(rt_state *st, PyObject *orig, PyObject *like);
/* orig.set_(src) (the caller switches grad mode off around it) */
int rt_tensor_set_(rt_state *st, PyObject *orig, PyObject *src);
/* The C++ part's form of a ViewMeta sequence the plan replays (a new
 * reference in *out), or *out NULL where there is none (no C++ part, or a
 * sequence it cannot take): once per plan. 0, or -1 with an exception. */
int rt_view_sequence_prepare(rt_state *st, PyObject *sequence, PyObject **out);
/* torch.autograd.graph.increment_version(tuple) == torch._C._increment_version */
int rt_increment_version(rt_state *st, PyObject *tensors);

/* runtime_wrappers._unwrap_tensoralias(x): new reference to x.alias */
PyObject *rt_unwrap_tensoralias(rt_state *st, PyObject *x);
/* 2.11/2.12's inline form of the same check in _apply_input_mutations
 * (`updated_inpt.alias`, its own AssertionError message) */
PyObject *rt_unwrap_updated_input(rt_state *st, PyObject *x);
/* gen_alias_from_base(base, target, target_requires_grad) without a
 * ViewMeta sequence to replay (alias_from_base.c): target._view_func(base)
 * when target._base is not None and that gives the target's shape, else
 * as_strided on the target's geometry. translate_storage_offset: 2.14's
 * storage-offset translation when base and target have different storages.
 * A new reference, or NULL with an exception. */
PyObject *rt_alias_from_base(rt_state *st, PyObject *base, PyObject *target,
                             int target_requires_grad, int translate_storage_offset);
/* gen_alias_from_base's patch_requires_grad(out); steals out */
PyObject *rt_patch_requires_grad(rt_state *st, PyObject *base, PyObject *out,
                                 int target_requires_grad);
/* The C++ part may run an epilogue operation on a and b (plain tensor
 * types, no TorchFunctionMode), else counted as not offered: 1 or 0. */
int rt_cpp_tensor_op_ok(rt_state *st, PyObject *a, PyObject *b);
/* An epi_* result rc, counted: 1 when the C++ part answered, 0 when it
 * declined (the caller then takes the Python route). */
int rt_cpp_answered(rt_state *st, int rc);
/* gen_alias_from_base's view-replay branch, for a plan that established
 * replay_views and a sequence with no symbolic inputs: replay the sequence on
 * the base, check the shape (upstream's AssertionError), patch
 * requires_grad. Returns a new reference, or NULL with an exception.
 * sequence_cpp: rt_view_sequence_prepare's form of the sequence, or NULL;
 * with it the C++ part replays where it is exact. */
PyObject *rt_alias_by_view_replay(rt_state *st, PyObject *base, PyObject *target,
                                  int requires_grad, PyObject *sequence,
                                  PyObject *sequence_cpp);
/* runtime_wrappers.mark_dynamo_propagated_dynamic_indices(t, dims), or on
 * 2.11/2.12 maybe_mark_dynamic_helper(t, dims): the same body on the
 * attribute `name` (_dynamo_propagated_dynamic_indices /
 * _dynamo_weak_dynamic_indices) */
int rt_mark_dynamic_indices(rt_state *st, PyObject *t, PyObject *dims, PyObject *name);


/* _disable_saved_tensors_hooks(): enter returns the previous message (a new
 * reference, Py_None when hooks were enabled) or NULL; exit restores it. */
PyObject *rt_saved_hooks_disable(rt_state *st);
int rt_saved_hooks_restore(rt_state *st, PyObject *previous);

/* A `with cm:` block around a call: enter returns __enter__'s result
 * discarded; exit calls __exit__ with the pending exception, if any, as the
 * with statement does. */
int rt_context_enter(rt_state *st, PyObject *cm);
int rt_context_exit(rt_state *st, PyObject *cm, int failed);

/* Dynamo's compile_wrapper around its call of fn (csrc/dynamo/), each
 * through the C++ part when it is loaded, else the Python binding given. */

/* 2.13's local dispatch key sets: read before the eval-frame callback is
 * set (torch._C._dispatch_tls_local_include_set() / _exclude_set()), then
 * `with torch._C._ForceDispatchKeyGuard(include, exclude):` around the call.
 * The guard forces the sets just read (no change) and restores them at
 * exit; with the C++ part that is the read and a force at exit. */
typedef struct {
    const rt_cpp_api *cpp;
    PyObject *include, *exclude, *guard; /* Python's route */
    uint64_t keys[2];
} rt_dispatch_keys;
int rt_dispatch_keys_read(rt_state *st, PyObject *include_set, PyObject *exclude_set,
                          rt_dispatch_keys *k);
int rt_dispatch_keys_enter(rt_state *st, PyObject *force_guard, rt_dispatch_keys *k);
/* after a successful enter; keeps a pending exception (failed) */
int rt_dispatch_keys_exit(rt_state *st, rt_dispatch_keys *k, int failed);
void rt_dispatch_keys_clear(rt_dispatch_keys *k);

/* torch._C._is_tracing() (is_tracing, that binding): 1, 0, or -1 */
int rt_jit_tracing(rt_state *st, PyObject *is_tracing);


#endif
