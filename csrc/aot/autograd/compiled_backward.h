/* compiled_backward.h: what CompiledBackward's files share, private to
 * aot/: compiled_backward.c (CompiledFunction.backward and its impl_fn),
 * backward_tangents.c (the grad outputs' processing, process_runtime_tangent
 * and the tangent plans it runs), apply_boxed.c (the node's apply_boxed). */
#ifndef TORCH_AOT_RT_COMPILED_BACKWARD_H
#define TORCH_AOT_RT_COMPILED_BACKWARD_H

#include "util/py_compat.h"
#include "fn_object.h"
/* ======================================================================
 * CompiledBackward: CompiledFunction.backward(ctx, grads)
 * ====================================================================== */

enum tangent_kind {
    TANGENT_STRIDES = 0,       /* plain tensor meta: expected size and stride */
    TANGENT_MEMORY_FORMAT = 1, /* plain tensor meta: expected memory format */
    TANGENT_PYTHON = 2,        /* anything else: upstream's process_runtime_tangent */
};

typedef struct {
    int kind;
    PyObject *meta;            /* PlainTensorMeta / SubclassCreationMeta */
    PyObject *size, *stride, *memory_format;
    PyObject *desc, *stack_trace, *index;
    /* TANGENT_STRIDES with size and stride tuples of ndim plain ints: them
     * as C arrays (for the C++ part's compare); else ndim = -1 */
    Py_ssize_t ndim;
    int64_t *sizes, *strides;
    /* A SubclassCreationMeta whose process_runtime_tangent runs in C (see
     * subclass_tangent_leaves), or NULL */
    struct subclass_tangent *sub;
} tangent_plan;

/* process_runtime_tangent for a subclass tangent, decided at build: the
 * expected type (not a FakeTensor or FunctionalTensor class, with
 * __tensor_flatten__/__tensor_unflatten__), its flatten metadata, the
 * memory format of its MemoryFormatMeta, and one plain tangent plan per inner
 * attribute (PlainTensorMeta, processed with no index/desc/stack). */
typedef struct subclass_tangent {
    PyObject *type;
    PyObject *flat_meta;
    PyObject *memory_format;
    PyObject *is_fake;         /* torch._C._is_fake_tensor (2.14 on), or NULL */
    Py_ssize_t n_attrs;
    PyObject **names;
    tangent_plan *attrs;
} subclass_tangent;

typedef struct {
    RT_FN_HEAD
    PyObject *upstream;        /* upstream's backward: calls we don't take */
    PyObject *cls;             /* CompiledFunction */
    PyObject *double_backward; /* CompiledFunction._double_backward */
    PyObject *backward_compiler; /* upstream's _AutogradBackwardCompiler, or None (2.11) */
    /* 2.11: CompiledFunction._backward_impl, which compiles the backward
     * lazily itself; run for a call that finds cls.compiled_bw None. NULL
     * where backward_compiler compiles it (2.12 on). */
    PyObject *lazy_backward_impl;
    PyObject *fw_metadata;
    PyObject *rng_add;         /* rng_state.add_backward_args, or NULL */
    PyObject *compile_id;
    PyObject *compiled_bw;     /* NULL until the first backward compiles it */
    /* the compiled backward compiled_bw was made from, what cls.compiled_bw
     * holds (borrowed, for identity tests and to put it back: compiled_bw
     * holds it or its DisabledCall, which holds it) */
    PyObject *compiled_bw_seen;
    bool compiled_bw_boxed;
    bool disable_amp;
    bool has_backward_state;
    bool check_deterministic;
    bool has_mutations_in_bw;
    bool inputs_require_grad;
    bool has_no_vc_check;
    bool restore_external_objects; /* 2.14: ctx._external_objects -> registry */
    bool restore_by_setter;        /* 2.15: through set_external_object_by_index */
    bool copy_context;             /* 2.14: impl_fn runs in context.copy() */
    /* impl_fn runs in the engine's TLS `context` (2.12 on; 2.11 has no hook) */
    bool tls_context;
    /* process_runtime_tangent(x, meta, idx, desc, compile_id_str, stack_trace)
     * (2.12 on), or 2.11's process_runtime_tangent(x, meta) */
    bool tangent_context_args;
    /* backward(ctx, grads_list) (boxed_grads_call, 2.13 on), or 2.11/2.12's
     * backward(ctx, *flat_args) */
    bool boxed_grads;
    Py_ssize_t expected_grad_outs;
    Py_ssize_t num_backward_tokens;
    Py_ssize_t n_surviving;
    Py_ssize_t *surviving;
    tangent_plan *tangents;    /* n_surviving entries */
    /* maybe_subclass_meta is set: the prologue's chained tangent leaves
     * (process_runtime_tangent(...)[1]) and the epilogue's wrap_fn, a
     * wrap-only _C.SubclassWrapper over grad_input_metas */
    bool subclass_tangents;
    PyObject *grads_wrapper;
} CompiledBackward;

typedef struct {
    PyObject_HEAD
    vectorcallfunc vectorcall;
    PyObject *backward;        /* the CompiledBackward */
    PyObject *ctx;
    PyObject *all_args;
} BackwardThunk;

/* list.extend(seq) for a borrowed sequence */
static inline int
rt_list_extend(PyObject *list, PyObject *seq)
{
    return PyList_SetSlice(list, PY_SSIZE_T_MAX, PY_SSIZE_T_MAX, seq);
}

/* backward_tangents.c: the prologue's work on one grad output: x processed
 * as process_runtime_tangent does (a new reference, or NULL), or, with a
 * subclass graph, its chained leaves appended to fpt */
PyObject *rt_tangent_process(CompiledBackward *self, const tangent_plan *t, PyObject *x);
int rt_tangent_append_leaves(CompiledBackward *self, const tangent_plan *t, PyObject *x,
                             PyObject *fpt);
/* ... and the plans, from CompiledBackward's keyword plan */
int rt_tangents_parse(CompiledBackward *self, PyObject *kwargs);
int rt_tangent_subclass_nodes_parse(CompiledBackward *self, PyObject *kwargs);
void rt_tangent_plan_clear(tangent_plan *t);
int rt_tangent_plan_traverse(tangent_plan *t, visitproc visit, void *arg);

#endif
