/* torch_cpp_api: the plain C interface of the optional C++ part.
 *
 * csrc/cpp/ is built against the torch installed at build time (ATen, c10
 * headers, linked to its libraries) as the extension module
 * torch_aot_rt._torch_cpp_<torch version>. It exports one capsule holding an
 * rt_cpp_api; the shim (torch_aot_rt/_cpp.py) imports it only when the
 * running torch is the one it was built against, and hands it to
 * _C._bind_torch. torch_api.c then calls these pointers instead of the
 * Python-visible callables; with no capsule (not built, switched off with
 * TORCH_AOT_RT_CPP=0, another torch) the C core runs alone, unchanged.
 *
 * Each entry is exact only in the state it names; the caller checks that
 * state (for example: no torch function mode active) and otherwise goes
 * through the Python callable, as upstream does.
 */
#ifndef TORCH_AOT_RT_TORCH_CPP_API_H
#define TORCH_AOT_RT_TORCH_CPP_API_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define RT_CPP_API_VERSION 7
#define RT_CPP_CAPSULE_NAME "torch_aot_rt._torch_cpp.api"

typedef struct rt_cpp_api {
    int api_version; /* RT_CPP_API_VERSION */
    /* at::impl::torch_function_mode_enabled(): a TorchFunctionMode would
     * intercept torch._C._set_grad_enabled / _set_view_replay_enabled, so
     * the C++ setters below are only exact when this is 0. */
    int (*torch_function_mode_enabled)(void);
    /* c10::GradMode::is_enabled / set_enabled: what torch._C.is_grad_enabled()
     * and torch._C._set_grad_enabled(b) do once their arguments are parsed. */
    int (*grad_enabled)(void);
    void (*set_grad_enabled)(int enabled);
    /* c10::AutogradState view replay: torch._C._is_view_replay_enabled() and
     * torch._C._set_view_replay_enabled(b). */
    int (*view_replay_enabled)(void);
    void (*set_view_replay_enabled)(int enabled);

    /* CompiledFunction's autograd node (csrc/cpp/compiled_node.cpp): what
     * `cls.apply(*args)` does upstream for a CompiledFunction class
     * (THPFunction_apply), with a C++ node as the ctx: cls.forward(node,
     * *args) under no-grad, outputs wrapped by torch's _wrap_outputs, tensors
     * saved as SavedVariable; at backward the node calls
     * cls.backward(node, grads) (PyNode::apply + apply_boxed). The caller has
     * checked that no functorch transform is active. Returns the outputs (new reference); NULL with an
     * exception set; or NULL with no exception and *declined set to an
     * rt_node_declined reason, before anything observable happened (the
     * caller then runs upstream's Function.apply). */
    PyObject *(*node_apply)(PyObject *cls, PyObject *args, int *declined);
    /* obj is a node's Python object (a grad_fn of the type above): 1, else 0 */
    int (*node_check)(PyObject *obj);
    /* node.maybe_clear_saved_tensors(): release the saved tensors unless the
     * current graph task keeps the graph; 0, or -1 with an exception */
    int (*node_maybe_clear_saved)(PyObject *node);

    /* What getattr(node, name) / setattr(node, name, value) do for the
     * ctx attributes the C core reads and writes (enum rt_ctx_field), on a
     * node of the type above (node_check): new reference / 0, or NULL / -1
     * with an exception set. */
    PyObject *(*node_get)(PyObject *node, int field);
    int (*node_set)(PyObject *node, int field, PyObject *value);

    /* The backward's and forward's torch queries, each what its Python
     * binding does once its (absent or string) arguments are parsed; none
     * is intercepted by a TorchFunctionMode. */
    /* torch._C._are_functorch_transforms_active() */
    int (*functorch_transforms_active)(void);
    /* torch._C._get_current_graph_task_keep_graph() */
    int (*graph_task_keep_graph)(void);
    /* `torch._C._get_obj_in_tls(key) if torch._C._is_key_in_tls(key) else
     * NULL`: a new reference, or NULL when the key is absent (no exception
     * is ever set). key is a str object. */
    PyObject *(*tls_object)(PyObject *key);

    /* Tensor queries on an exact torch.Tensor, for the caller to use only
     * where no TorchFunctionMode is active (the methods' Python bindings
     * hand the call to one): 1 or 0, or -1 where the C++ answer might not
     * be the Python method's (a tensor with symbolic sizes, a Python or
     * functorch dispatch key, nested or not strided): then the caller calls
     * the method. */
    /* x._is_view() */
    int (*tensor_is_view)(PyObject *x);
    /* x.shape == sizes and x.stride() == strides, for expected sizes and
     * strides of ndim plain ints */
    int (*tensor_size_stride_equal)(PyObject *x, Py_ssize_t ndim, const int64_t *sizes,
                                    const int64_t *strides);

    /* The runtime wrapper's epilogue (csrc/aot/epilogue.c): the tensor methods
     * upstream's _apply_input_mutations and gen_alias_from_base call, each
     * what its Python binding does once its arguments are parsed, for the
     * caller to offer only exact torch.Tensor / nn.Parameter arguments with
     * no TorchFunctionMode active. Each returns 0, -1 with an exception
     * set (torch's errors translated as the bindings translate them), or
     * RT_CPP_DECLINED before anything happened (a tensor the C++ part
     * leaves to Python, as the queries above; or a TorchDispatchMode
     * active): then the caller calls the method. */
    /* orig.copy_(src), or orig.detach().copy_(src) when detach */
    int (*epi_copy_)(PyObject *orig, PyObject *src, int detach);
    /* orig.as_strided_(like.size(), like.stride(), like.storage_offset()) */
    int (*epi_as_strided_like)(PyObject *orig, PyObject *like);
    /* orig.set_(src) (the caller switches grad mode off around it) */
    int (*epi_set_)(PyObject *orig, PyObject *src);
    /* A ViewMeta sequence (the Python list gen_alias_from_base replays) as
     * the C++ objects behind it, in a capsule (new reference), built once
     * per plan; NULL with no exception where it cannot be (the Python route
     * stays), NULL with one on failure. */
    PyObject *(*epi_view_sequence)(PyObject *sequence);
    /* gen_alias_from_base's view-replay branch with that capsule:
     * apply_view_meta_sequence(base, sequence), the shape check against
     * target (a mismatch is RT_CPP_DECLINED: the caller's route raises
     * upstream's error) and patch_requires_grad; *out a new reference. */
    int (*epi_view_replay)(PyObject *sequence_capsule, PyObject *base, PyObject *target,
                           int requires_grad, PyObject **out);

    /* Dynamo's compile_wrapper (csrc/dynamo/compile_wrapper.c): what the
     * pybind11 bindings it calls on every call do, none of them handed to a
     * TorchFunctionMode. (The functorch layer depth stays the bindings':
     * the wheel's ATen/functorch headers need nlohmann/json, not shipped.) */
    /* torch._C._dispatch_tls_local_include_set() and _exclude_set(): the
     * local dispatch key sets, as raw key-set words {included, excluded} */
    void (*dispatch_tls_get)(uint64_t keys[2]);
    /* what leaving torch._C._ForceDispatchKeyGuard does (and 2.14's
     * _dynamo_restore_local_dispatch_key_set with the sets its save pushed):
     * the local sets forced back to keys (from dispatch_tls_get) */
    void (*dispatch_tls_force)(const uint64_t keys[2]);
    /* torch._C._is_tracing(): torch.jit tracing is on */
    int (*jit_tracing)(void);

    /* 1 when the node's grad_fn has _input_grad_buffers / input_grad_buffers
     * (built against torch headers with get_current_input_grad_buffers,
     * 2.15 on), else 0: _bind_torch checks it against the release entry. */
    int node_input_grad_buffers;
} rt_cpp_api;

/* What an epi_* entry returns when it leaves the call to the Python method. */
#define RT_CPP_DECLINED 1

/* The ctx attributes CompiledForward writes and CompiledBackward reads. */
enum rt_ctx_field {
    RT_CTX_TO_SAVE = 0,              /* to_save (save_for_backward) */
    RT_CTX_NON_DIFFERENTIABLE,       /* non_differentiable (mark_non_differentiable) */
    RT_CTX_MATERIALIZE_NON_DIFF_GRADS, /* _materialize_non_diff_grads */
    RT_CTX_TENSORS_NO_VC_CHECK,      /* _tensors_no_vc_check */
    RT_CTX_SYMINTS,                  /* symints */
    RT_CTX_OPAQUE_OBJECTS,           /* opaque_objects */
    RT_CTX_EXTERNAL_OBJECTS,         /* _external_objects (2.14) */
    RT_CTX_SAVED_TENSORS,            /* saved_tensors (read only) */
    RT_CTX_N_FIELDS
};

/* Why node_apply left a call to upstream's Function.apply. */
enum rt_node_declined {
    RT_NODE_TAKEN = 0,
    RT_NODE_JIT_TRACING,      /* torch.jit.trace records the Python op */
    RT_NODE_RECORD_FUNCTION,  /* profiler / RecordFunction callbacks: upstream's inputs */
    RT_NODE_TENSOR_KIND,      /* subclass, functorch, functional or nested tensor */
    RT_NODE_FORWARD_AD,       /* an input carries a forward-mode gradient */
    /* decided by the C core before node_apply */
    RT_NODE_FUNCTORCH,        /* a functorch transform is active */
    RT_NODE_N_DECLINED
};

#ifdef __cplusplus
}
#endif

#endif /* TORCH_AOT_RT_TORCH_CPP_API_H */
