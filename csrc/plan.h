/* plan: what a runtime wrapper does on every call, decided once.
 *
 * torch_aot_rt/_plan.py derives it from ViewAndMutationMeta and the wrapper
 * config (the build-time half of upstream's _create_runtime_wrapper);
 * rt_plan_parse() validates it and lays it out as C arrays, so that the call
 * path only walks them.
 */
#ifndef TORCH_AOT_RT_PLAN_H
#define TORCH_AOT_RT_PLAN_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdbool.h>
#include <stdint.h>

/* Exported to Python as _C.MUT_* and _C.OUT_* (rt_plan_constants_add), which
 * torch_aot_rt/_kinds.py hands on to the plan builders. */
enum rt_mutation_kind {       /* the branches of _apply_input_mutations */
    RT_MUT_SKIP = 0,          /* neither data nor metadata mutated */
    RT_MUT_SET = 1,           /* mutates_storage_metadata: set_ under no_grad */
    RT_MUT_METADATA = 2,      /* metadata only: as_strided_ */
    RT_MUT_DATA = 3,          /* data (maybe + metadata): copy_ */
};
enum rt_mutation_flags {
    RT_MUT_AS_STRIDED_FIRST = 1, /* data and metadata: as_strided_ then copy */
    RT_MUT_LEAF = 2,             /* leaf: detach().copy_ if it requires grad */
    RT_MUT_STREAM_ERROR = 4,     /* input on a user stream: upstream raises */
    /* with RT_MUT_LEAF: a leaf on a user stream that does not require grad
     * raises too (2.11/2.12's _apply_input_mutations tests
     * `meta.is_leaf and original_inpt.requires_grad` before the stream) */
    RT_MUT_LEAF_STREAM_ERROR = 8,
};
enum rt_output_kind {         /* the handlers of _replay_output_aliases */
    RT_OUT_PASS = 0,          /* non_alias, unsafe_view_alias, custom_function_view */
    RT_OUT_IS_INPUT = 1,
    RT_OUT_ALIAS_OF_INPUT = 2,
    RT_OUT_ALIAS_OF_INTERMEDIATE = 3, /* all three alias_of_intermediate kinds */
};

typedef struct {
    Py_ssize_t slot;          /* index into the captured inputs */
    uint8_t kind;             /* enum rt_mutation_kind */
    uint8_t flags;            /* enum rt_mutation_flags */
} rt_mutation;

typedef struct {
    uint8_t kind;             /* enum rt_output_kind */
    bool unwrap_base;         /* base is a user output wrapped in TensorAlias */
    Py_ssize_t index;         /* captured-input slot, or index into fw_outs */
    PyObject *requires_grad;  /* Py_True / Py_False (immortal enough: owned) */
    /* view_meta_sequence.sequence when gen_alias_from_base would replay it
     * (replay_views, no symbolic inputs: decided at build), else NULL */
    PyObject *replay_sequence;
    /* the C++ part's form of replay_sequence (rt_view_sequence_prepare),
     * made once when the wrapper is built, or NULL */
    PyObject *replay_cpp;
} rt_output;

typedef struct {
    Py_ssize_t out_index;
    PyObject *dims;           /* the set upstream stamps on the output */
} rt_dynamic_dims;

typedef struct {
    PyObject *compiled_fn;    /* boxed: takes the args list, may clear it */
    bool trace_joint;
    bool disable_amp;
    bool disable_saved_hooks;
    int grad_enabled_mutation; /* -1: none; else the grad mode to set at the end */
    bool alias_translates_storage_offset; /* Release field of that name */

    Py_ssize_t n_capture;     /* inputs kept past the call: epilogue_args_idx, */
    Py_ssize_t *capture;      /* deduplicated: one slot per input */
    Py_ssize_t n_capture_order; /* epilogue_args_idx as upstream reads it */
    Py_ssize_t *capture_order;
    Py_ssize_t n_bump;        /* mutated_graph_handled_indices_seen_by_autograd */
    Py_ssize_t *bump;
    Py_ssize_t n_detach;      /* indices_of_inps_to_detach (training only) */
    Py_ssize_t *detach;

    Py_ssize_t num_mutated;   /* leading outputs that are updated inputs */
    Py_ssize_t expected_outs;
    rt_mutation *mutations;   /* num_mutated entries */

    Py_ssize_t n_outputs;     /* 0 when no output is an alias: pass through */
    rt_output *outputs;

    Py_ssize_t n_dynamic;
    rt_dynamic_dims *dynamic;
    /* the attribute the dynamic dims are stamped on, an interned str:
     * _dynamo_propagated_dynamic_indices (2.13 on), _dynamo_weak_dynamic_indices
     * (2.11/2.12's maybe_mark_dynamic_helper) */
    PyObject *dynamic_attr;
    /* training: view replay through torch.autograd._force_original_view_tracking(True)
     * (2.11/2.12: set in __init__ and again in __enter__, restored unconditionally
     * in __exit__) instead of the generated read/set-if-off/restore-if-changed */
    bool view_replay_forced;
    /* with view_replay_forced: the context's __enter__ sets the mode again
     * (2.12); 2.11's __enter__ does nothing (only __init__ sets it) */
    bool view_replay_set_on_enter;
    /* call_func_at_runtime_with_args's `isinstance(args, list)` check before the
     * compiled function is called (2.11/2.12's reference invoker) */
    bool args_list_check;
    /* set_/metadata-only updated inputs in training: the reference's inline
     * TensorAlias check ("expected TensorAlias for updated_inpt, got ...",
     * 2.11/2.12) instead of _unwrap_tensoralias's message */
    bool updated_alias_inline_check;
    /* the prologue profiler range is exited when the call fails before the
     * compiled function (2.12 on: try/finally); else the entered range is
     * dropped without __exit__, as 2.11's frame drops it */
    bool prologue_range_exited_on_error;
    /* the version bump reads args lazily, bumping each tensor as it is read,
     * and a failed read comes out of _increment_version as SystemError from
     * it (2.11/2.12's increment_version(generator)) */
    bool bump_from_generator;
} rt_plan;

/* Fills *plan from the keyword arguments of RuntimeWrapper(...).
 * Raises ValueError/TypeError naming what is malformed. */
int rt_plan_parse(rt_plan *plan, PyObject *compiled_fn, PyObject *kwargs);
/* Helpers shared with the autograd plans: a required keyword (borrowed),
 * a bool, a sequence of non-negative ints as a PyMem array, None or a
 * sequence of bools as a PyMem array (NULL for None). */
PyObject *rt_plan_required(PyObject *kwargs, const char *key);
int rt_plan_bool(PyObject *kwargs, const char *key, bool *out);
int rt_plan_indices(PyObject *kwargs, const char *key, Py_ssize_t *n, Py_ssize_t **out);
int rt_plan_bool_mask(PyObject *kwargs, const char *key, Py_ssize_t *n, bool **out);

int rt_plan_traverse(rt_plan *plan, visitproc visit, void *arg);
void rt_plan_clear(rt_plan *plan);

/* Adds the enums above to the module, by name without the RT_ prefix. */
int rt_plan_constants_add(PyObject *module);

#endif
