/* dynamo: Dynamo's per-call layers in C (the disable wrapper, the
 * functions the transformed bytecode calls, the saved-tensor-hooks guard);
 * their types. */
#ifndef TORCH_AOT_RT_DYNAMO_H
#define TORCH_AOT_RT_DYNAMO_H

#include "dynamo/compile_wrapper.h"
#include "dynamo/disable.h"
#include "torch_api.h"

/* Dynamo's part of the module state (dynamo_state.c). */
typedef struct {
    /* owned references only, visited and cleared as an array (objects.h) */
    struct {
        PyObject *null_context;           /* NullContext's one instance */
        PyObject *str_dynamo_disable;     /* __dynamo_disable */
        PyObject *str_pregraph_range;     /* "Pregraph bytecode" */
        PyObject *top_saved_hooks;        /* torch._C._autograd._top_saved_tensors_default_hooks */
        PyObject *GraphModule;            /* torch.fx.GraphModule */
    } obj;
    struct {
        PyTypeObject *SavedHooksGuardType; /* saved_hooks_guard.c */
        PyTypeObject *DisabledCallType;   /* disable.c */
        PyTypeObject *BytecodeHelperType; /* bytecode_helper.c, with NullContext */
        PyTypeObject *NullContextType;
        PyTypeObject *CompileWrapperType; /* compile_wrapper.c */
        PyTypeObject *ModuleCallType;     /* optimized_module.c */
    } types;
    Py_ssize_t helper_counts[RT_HELPER_N];
    rt_cw_state cw;                       /* compile_wrapper's, bound by its shim */
    rt_disable_state disable;             /* torch._dynamo.disable's wrapper's */
} rt_dynamo_state;

/* f(arg). eval_frame's setters (set_eval_frame, the fullgraph, skip-guard
 * and isolate-id setters) are METH_O builtins, called several times per
 * compiled call: their C function is called directly, without the
 * vectorcall dispatch around it. */
static inline PyObject *
rt_call_one(PyObject *f, PyObject *arg)
{
    if (PyCFunction_CheckExact(f) && PyCFunction_GET_FLAGS(f) == METH_O) {
        return PyCFunction_GET_FUNCTION(f)(PyCFunction_GET_SELF(f), arg);
    }
    return PyObject_Vectorcall(f, &arg, 1, NULL);
}

extern PyType_Spec SavedHooksGuard_spec;
extern PyType_Spec DisabledCall_spec;
extern PyType_Spec BytecodeHelper_spec;
extern PyType_Spec NullContext_spec;
extern PyType_Spec CompileWrapper_spec;
extern PyType_Spec ModuleCall_spec;

/* _C._helper_stats(reset=False) */
PyObject *rt_helper_stats(PyObject *module, PyObject *const *args, Py_ssize_t nargs);

/* Its life, driven by state.c's table: interned names at module exec, the
 * look-ups once torch imports, GC support; its types, added to the module. */
int rt_dynamo_init(rt_state *st);
int rt_dynamo_bind(rt_state *st);
int rt_dynamo_traverse(rt_state *st, visitproc visit, void *arg);
void rt_dynamo_clear(rt_state *st);
int rt_dynamo_types_init(PyObject *module, rt_state *st);

#endif
