/* torch_api: the one door to torch.
 *
 * Every torch callable, type and constant the C runtime needs is looked up
 * once per process, by rt_torch_bind(), and kept in the module state. The
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

#include "aot/alias_state.h"
#include "config/config_read.h"
#include "dynamo/compile_wrapper.h"
#include "dynamo/disable.h"
#include "inductor/inductor.h"
#include "util/thread_local.h"
#include "torch_cpp_api.h"
#include "aot/wrappers.h"

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

typedef struct rt_state {
    PyTypeObject *RuntimeWrapperType;
    int bound;                    /* rt_torch_bind() succeeded */

    /* The C++ part (torch_cpp_api.h), or NULL: the C core alone. The
     * capsule owns the pointer's lifetime. */
    const rt_cpp_api *cpp;
    PyObject *cpp_capsule;
    /* The same table while cpp is switched off for a same-run comparison
     * (_C._set_cpp_routes): nodes it made still need their own calls. */
    const rt_cpp_api *cpp_loaded;

    /* grad mode, view replay (torch._C) */
    PyObject *is_grad_enabled;
    PyObject *set_grad_enabled;
    PyObject *is_view_replay_enabled;
    PyObject *set_view_replay_enabled;
    /* The two setters are METH_VARARGS|METH_KEYWORDS builtins on the hot
     * path of every call: we call their C function with prebuilt (True,) /
     * (False,) tuples, skipping the per-call tuple CPython would build.
     * NULL when a torch version defines them otherwise. */
    PyCFunctionWithKeywords set_grad_enabled_c;
    PyObject *set_grad_enabled_self;
    PyCFunctionWithKeywords set_view_replay_enabled_c;
    PyObject *set_view_replay_enabled_self;
    PyObject *args_true;                  /* (True,) */
    PyObject *args_false;                 /* (False,) */
    /* torch._C._DisableAutocast and its unbound __enter__/__exit__ */
    PyObject *DisableAutocast;
    PyObject *DisableAutocast_enter;
    PyObject *DisableAutocast_exit;
    /* torch.Tensor, torch.nn.Parameter and their methods */
    PyTypeObject *Tensor;
    PyTypeObject *Parameter;
    PyObject *tensor_methods[RT_N_TENSOR_METHODS];
    PyObject *parameter_methods[RT_N_TENSOR_METHODS];
    int parameter_plain;                  /* Parameter's methods are Tensor's */
    PyObject *method_names[RT_N_TENSOR_METHODS];
    PyObject *requires_grad_descr;        /* torch.Tensor.requires_grad */
    PyObject *increment_version;          /* torch._C._increment_version */
    PyObject *TensorAlias;                /* aot_autograd schemas.TensorAlias */
    PyObject *apply_view_meta_sequence;   /* torch._C._functionalization.<same> */
    /* profiler range */
    PyObject *profiler_globals;           /* torch.autograd.profiler.__dict__ */
    PyObject *dynamo_config;              /* torch._dynamo.config */
    rt_config_reader config_reader;       /* config_read.c: their settings read */
    rt_thread_locals thread_locals;       /* thread_local.c: Dynamo's threading.locals */
    PyObject *RecordFunctionFast;         /* torch._C._profiler._RecordFunctionFast */
    PyObject *prologue_range_name;
    /* saved-tensor hooks (torch._C._autograd) */
    PyObject *saved_hooks_get_disabled_message;
    PyObject *saved_hooks_disable;
    PyObject *saved_hooks_enable;
    PyObject *saved_hooks_error_message;

    /* CompiledFunction (autograd_function.c) */
    PyTypeObject *FunctionApplyType;
    PyTypeObject *CompiledForwardType;
    PyTypeObject *CompiledBackwardType;
    PyTypeObject *BackwardThunkType;
    PyTypeObject *ApplyBoxedType;
    PyTypeObject *SavedHooksGuardType;    /* saved_hooks_guard.c */
    PyTypeObject *SerializableCallType;   /* serializable_call.c */
    PyTypeObject *ParamsPrependType;      /* params_prepend.c */
    PyTypeObject *DisabledCallType;       /* dynamo/disable.c */
    PyTypeObject *BytecodeHelperType;     /* dynamo/bytecode_helper.c */
    PyTypeObject *CompileWrapperType;     /* dynamo/compile_wrapper.c */
    PyTypeObject *ModuleCallType;         /* dynamo/optimized_module.c */
    rt_cw_state cw;
    PyTypeObject *NullContextType;
    PyObject *null_context;               /* its one instance */
    PyObject *str_dynamo_disable;         /* __dynamo_disable */
    PyObject *str_pregraph_range;         /* "Pregraph bytecode" */
    Py_ssize_t helper_counts[RT_HELPER_N];
    /* inductor (inductor/graph_call.c) */
    PyTypeObject *GraphCallType;
    PyObject *graph_call_graphs;          /* {id(graph): weakref}: compiled with C on */
    PyObject *graph_call_last;            /* the weakref of it graph_marked found last */
    rt_inductor_names inductor;
    Py_ssize_t graph_call_counts[RT_GRAPH_CALL_N];
    PyTypeObject *SubclassWrapperType;    /* subclass_wrapper.c */
    PyObject *str_tensor_unflatten;       /* __tensor_unflatten__ */
    PyObject *str_clear;                  /* clear */
    PyObject *FunctionBase;               /* torch._C._FunctionBase */
    PyObject *function_base_apply;        /* its `apply` classmethod descriptor */
    PyObject *maybe_clear_saved_tensors;  /* _FunctionBase.maybe_clear_saved_tensors */
    PyObject *functorch_transforms_active; /* torch._C._are_functorch_transforms_active */
    PyObject *unwrap_if_dead;             /* torch._C._functorch.unwrap_if_dead */
    PyObject *peek_interpreter_stack;     /* torch._C._functorch.peek_interpreter_stack */
    PyObject *deterministic_enabled;      /* torch._C._get_deterministic_algorithms */
    PyObject *is_key_in_tls;              /* torch._C._is_key_in_tls */
    PyObject *get_obj_in_tls;             /* torch._C._get_obj_in_tls */
    PyObject *keep_graph;                 /* _autograd._get_current_graph_task_keep_graph */
    PyObject *BackwardState;
    PyObject *SymInt;
    PyObject *SymFloat;
    PyObject *unsafe_view;                /* torch.ops.aten._unsafe_view */
    PyObject *partial;                    /* functools.partial */
    PyObject *functorch_config;           /* torch._functorch.config */
    PyObject *process_runtime_tangent;    /* AOTDispatchAutograd.process_runtime_tangent */
    PyObject *empty_strided;              /* torch.empty_strided */
    PyObject *call_func_at_runtime;       /* call_func_at_runtime_with_args */
    /* The release's saved opaque-object check (runtime_wrappers globals
     * named by the release table: is_opaque_type/OpaqueBase in 2.13,
     * is_custom_class/CustomClassBase in 2.14). */
    PyObject *is_opaque_type;
    PyObject *OpaqueBase;
    /* Dynamo's external-object registry (graph_bytecode_inputs
     * .index_to_external_object_weakref, as runtime_wrappers imports it: in
     * 2.15, a list Dynamo no longer rebinds there once its module global is
     * replaced, which is what upstream's snapshot reads); NULL on releases
     * that do not snapshot it. An exact dict (2.14) or list (2.15). */
    PyObject *external_objects;
    bool external_objects_is_list;
    /* The runtime_wrappers global the backward restores the snapshot with
     * (set_external_object_by_index, 2.15), or NULL: weakref.ref stored in
     * the registry above (2.14). */
    PyObject *set_external_object;
    PyObject *weakref_ref;                /* weakref.ref */
    /* Dynamo's saved-tensor-hooks guard (saved_hooks_guard.c) */
    PyObject *top_saved_hooks;            /* torch._C._autograd._top_saved_tensors_default_hooks */
    PyObject *GraphModule;                /* torch.fx.GraphModule */
    /* per-call counts of CompiledFunction calls by C++ node decision
     * (torch_cpp_api.h node_apply: RT_NODE_TAKEN or why not) */
    Py_ssize_t node_counts[RT_NODE_N_DECLINED];
    Py_ssize_t epi_counts[RT_EPI_N_ROUTES];
    /* torch._dynamo.disable's wrapper (dynamo/disable.c) */
    rt_disable_state disable;
    /* the other compiler wrappers (wrappers.h) */
    rt_wrappers_state wrappers;
    /* gen_alias_from_base's other branches (alias_from_base.c) */
    rt_alias_state alias;

    /* interned names and prebuilt constants */
    PyObject *str_to_save;
    PyObject *str_non_differentiable;
    PyObject *str_materialize_non_diff_grads;
    PyObject *str_tensors_no_vc_check;
    PyObject *str_symints;
    PyObject *str_opaque_objects;
    PyObject *str_saved_tensors;
    PyObject *str_backward_state;         /* _compiled_autograd_backward_state */
    PyObject *str_shape;
    PyObject *str_dtype, *str_device, *str_layout;
    PyObject *str_boxed_call;
    PyObject *str_context;
    PyObject *str_run;
    PyObject *str_backward;
    PyObject *str_vjp;
    PyObject *str_get_or_compile;
    PyObject *str_compiled_bw;
    PyObject *str_bw_donated_idxs;
    PyObject *str_donated_buffer;
    PyObject *str_external_objects;       /* _external_objects */
    PyObject *str_copy;
    PyObject *str_debug_assert;
    PyObject *str_compiled_fn;
    PyObject *kwnames_use_once;           /* ("saved_tensors_use_once",) */
    PyObject *kwnames_memory_format;      /* ("memory_format",) */
    PyObject *kwnames_empty_strided;      /* ("size", "stride", "dtype", "device", "layout", "requires_grad") */
    PyObject *kwnames_steal_disable_amp;  /* ("steal_args", "disable_amp") */
    PyObject *str_alias;
    PyObject *str_dynamic_indices;        /* _dynamo_propagated_dynamic_indices */
    PyObject *str_is_first;
    PyObject *str_enter;
    PyObject *str_exit;
    PyObject *str_is_profiler_enabled;
    PyObject *str_record_runtime_overhead;
    PyObject *str_requires_grad;
    PyObject *stream_error_message;
    PyObject *wrapper_qualname;
} rt_state;

int rt_state_init(rt_state *st);          /* interned names: at module exec */
/* The names a release gives what changed between releases (from the
 * shim's release table, torch_aot_rt/_versions.py). */
typedef struct {
    const char *opaque_type_check;        /* runtime_wrappers global */
    const char *opaque_base;              /* runtime_wrappers global, or NULL (2.11) */
    const char *external_objects;         /* runtime_wrappers global, or NULL */
    const char *external_objects_type;    /* its type: "dict" or "list" */
    const char *external_objects_setter;  /* runtime_wrappers global, or NULL */
    int input_grad_buffers;               /* the ctx has input_grad_buffers */
} rt_release_names;

/* torch look-ups: once, after torch imports */
int rt_torch_bind(rt_state *st, const rt_release_names *names, PyObject *cpp_capsule);
int rt_state_traverse(rt_state *st, visitproc visit, void *arg);
void rt_state_clear(rt_state *st);

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

/* record_runtime_wrapper_prologue_enter(): *range is set to the entered
 * range object, or NULL when the profiler or the config is off. */
int rt_prologue_range_enter(rt_state *st, PyObject **range);
/* record_runtime_wrapper_prologue_exit(): clears *range; keeps a pending
 * exception. */
int rt_prologue_range_exit(rt_state *st, PyObject **range);

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

/* Cleanup that runs while an exception may be pending (a `finally:`):
 * rt_finally_begin stashes it; rt_finally_end puts it back, or, when the
 * cleanup itself raised, keeps the new one with the old as __context__,
 * exactly as Python does. Returns -1 when an exception is set at the end. */
typedef struct { PyObject *type, *value, *tb; } rt_pending_error;
void rt_finally_begin(rt_pending_error *saved);
int rt_finally_end(rt_pending_error *saved, int cleanup_ok);

#endif
