/* aot_state.h: AOTAutograd's part of the module state: its types, what its
 * layers look up of torch (bound once torch imports, rt_aot_bind), their
 * interned names, the per-call counts, and the states of alias_from_base.c
 * and the compiler wrappers. */
#ifndef TORCH_AOT_RT_AOT_STATE_H
#define TORCH_AOT_RT_AOT_STATE_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdbool.h>

#include "aot/alias_state.h"
#include "aot/wrappers/wrappers.h"
#include "torch_api.h"
#include "torch_cpp_api.h"

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

typedef struct {
    /* owned references only, visited and cleared as an array (objects.h) */
    struct {
        /* CompiledFunction's forward and backward */
        PyObject *FunctionBase;           /* torch._C._FunctionBase */
        PyObject *function_base_apply;    /* its `apply` classmethod descriptor */
        PyObject *maybe_clear_saved_tensors; /* _FunctionBase.maybe_clear_saved_tensors */
        PyObject *unwrap_if_dead;         /* torch._C._functorch.unwrap_if_dead */
        PyObject *deterministic_enabled;  /* torch._C._get_deterministic_algorithms */
        PyObject *BackwardState;
        PyObject *SymInt;
        PyObject *SymFloat;
        PyObject *unsafe_view;            /* torch.ops.aten._unsafe_view */
        PyObject *partial;                /* functools.partial */
        PyObject *functorch_config;       /* torch._functorch.config */
        PyObject *process_runtime_tangent; /* AOTDispatchAutograd.process_runtime_tangent */
        PyObject *empty_strided;          /* torch.empty_strided */
        PyObject *call_func_at_runtime;   /* call_func_at_runtime_with_args */
        PyObject *weakref_ref;            /* weakref.ref */
        PyObject *apply_view_meta_sequence; /* torch._C._functionalization.<same> */
        /* the runtime wrapper's prologue range (prologue_range.c) */
        PyObject *dynamo_config;          /* torch._dynamo.config */
        PyObject *str_record_runtime_overhead;
        PyObject *prologue_range_name;
        /* The release's saved opaque-object check (runtime_wrappers globals
         * named by the release table: is_opaque_type/OpaqueBase in 2.13,
         * is_custom_class/CustomClassBase in 2.14); OpaqueBase NULL in 2.11. */
        PyObject *is_opaque_type;
        PyObject *OpaqueBase;
        /* Dynamo's external-object registry (graph_bytecode_inputs
         * .index_to_external_object_weakref, as runtime_wrappers imports it:
         * in 2.15, a list Dynamo no longer rebinds there once its module
         * global is replaced, which is what upstream's snapshot reads); NULL
         * on releases that do not snapshot it. An exact dict (2.14) or list
         * (2.15). */
        PyObject *external_objects;
        /* The runtime_wrappers global the backward restores the snapshot
         * with (set_external_object_by_index, 2.15), or NULL: weakref.ref
         * stored in the registry above (2.14). */
        PyObject *set_external_object;
        /* interned names and prebuilt constants */
        PyObject *str_tensor_unflatten;   /* __tensor_unflatten__ */
        PyObject *str_clear;
        PyObject *str_backward_state;     /* _compiled_autograd_backward_state */
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
        PyObject *str_copy;
        PyObject *str_debug_assert;
        PyObject *str_compiled_fn;
        PyObject *str_is_first;
        PyObject *kwnames_use_once;       /* ("saved_tensors_use_once",) */
        PyObject *kwnames_memory_format;  /* ("memory_format",) */
        PyObject *kwnames_empty_strided;  /* ("size", "stride", "dtype", "device", "layout", "requires_grad") */
        PyObject *kwnames_steal_disable_amp; /* ("steal_args", "disable_amp") */
        PyObject *stream_error_message;
        PyObject *wrapper_qualname;
    } obj;
    struct {
        PyTypeObject *RuntimeWrapperType;  /* runtime_wrapper.c */
        PyTypeObject *FunctionApplyType;   /* function_apply.c */
        PyTypeObject *CompiledForwardType; /* compiled_forward.c */
        PyTypeObject *CompiledBackwardType; /* compiled_backward.c, with the next two */
        PyTypeObject *BackwardThunkType;
        PyTypeObject *ApplyBoxedType;
        PyTypeObject *SerializableCallType; /* serializable_call.c */
        PyTypeObject *ParamsPrependType;   /* params_prepend.c */
        PyTypeObject *SubclassWrapperType; /* subclass_wrapper.c */
    } types;
    bool external_objects_is_list;
    /* CompiledFunction calls by the C++ node's decision (torch_cpp_api.h
     * node_apply: RT_NODE_TAKEN or why not) */
    Py_ssize_t node_counts[RT_NODE_N_DECLINED];
    rt_alias_state alias;                 /* gen_alias_from_base's other branches */
    rt_wrappers_state wrappers;           /* the other compiler wrappers */
} rt_aot_state;

/* Its life, driven by state.c's table: interned names at module exec, the
 * look-ups (with the release's names) once torch imports, GC support. */
int rt_aot_init(rt_state *st);
int rt_aot_bind(rt_state *st, const rt_release_names *names);
int rt_aot_traverse(rt_state *st, visitproc visit, void *arg);
void rt_aot_clear(rt_state *st);

#endif
