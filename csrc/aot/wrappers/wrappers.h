/* wrappers: the per-call functions of runtime_wrappers.py's other compiler
 * wrappers, in C (one file each):
 *
 *   dedupe_wrapper.c          AOTDedupeWrapper.post_compile's debugged_compiled_fn
 *   effect_tokens_wrapper.c   EffectTokensWrapper.post_compile's _effect_tokens_wrapper
 *   synthetic_base_wrapper.c  AOTSyntheticBaseWrapper.post_compile's _synthetic_base_wrapper
 *   rng_wrapper.c             FunctionalizedRngRuntimeWrapper.post_compile's
 *                             _functionalized_rng_wrapper
 *   fakified_out_wrapper.c    FakifiedOutWrapper.post_compile's wrapper
 *   debug_assert_wrapper.c    DebugAssertWrapper.post_compile's inner_fn
 *   forwarding_wrapper.c      2.12's FunctionalizedRngRuntimeWrapper / EffectTokensWrapper
 *                             closures where they only pass the call on
 *
 * Each is built by torch_aot_rt/_wrappers.py from what upstream's own
 * post_compile returned (the generated function, kept as `upstream`) and the
 * objects that function reads (its globals or closure cells), so that the C
 * object calls exactly what upstream's would. Any call that is not the plain
 * one (keywords, a non-list argument, a length the plan was not built for)
 * runs upstream's function, for its exact behaviour and errors.
 */
#ifndef TORCH_AOT_RT_WRAPPERS_H
#define TORCH_AOT_RT_WRAPPERS_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>

/* Interned names the wrappers look up on per-call objects, as upstream's
 * generated code does (attribute and method look-ups by name), beyond those
 * the module state already has (dtype, device and the tensor method names).
 * Owned references only: traversed and cleared as an array (objects.h). */
typedef struct {
    PyObject *str_base;             /* _base */
    PyObject *str_untyped_storage;
    PyObject *str_empty;
    PyObject *zero_shape;           /* (0,) */
    PyObject *kwnames_dtype_device; /* ("dtype", "device") */
} rt_wrappers_state;

/* str_dtype, str_device: AOTAutograd's interned names, for the kwnames */
int rt_wrappers_state_init(rt_wrappers_state *ws, PyObject *str_dtype, PyObject *str_device);
/* the wrapper types, added to the module */
int rt_wrapper_types_init(PyObject *module);

/* runtime_args[i] as Python's `args[i]` on a list: a borrowed reference, or
 * NULL with IndexError("list index out of range") */
PyObject *rt_list_item(PyObject *list, Py_ssize_t i);
/* the plain call every wrapper takes: one positional exact list, no
 * keywords */
int rt_plain_list_call(PyObject *const *argv, size_t nargsf, PyObject *kwnames);
/* a tuple of non-negative ints -> a new C array (PyMem), its length in *n */
Py_ssize_t *rt_index_tuple(PyObject *v, const char *what, Py_ssize_t *n);

extern PyType_Spec DedupeWrapper_spec;
extern PyType_Spec EffectTokensWrapper_spec;
extern PyType_Spec SyntheticBaseWrapper_spec;
extern PyType_Spec RngWrapper_spec;
extern PyType_Spec FakifiedOutWrapper_spec;
extern PyType_Spec DebugAssertWrapper_spec;
extern PyType_Spec ForwardingWrapper_spec;

#endif
