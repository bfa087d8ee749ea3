/* dynamo: Dynamo's per-call layers in C (the disable wrapper, the
 * functions the transformed bytecode calls, the saved-tensor-hooks guard);
 * their types. */
#ifndef TORCH_AOT_RT_DYNAMO_H
#define TORCH_AOT_RT_DYNAMO_H

#include "torch_api.h"

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

/* Creates Dynamo's function-like types into the module state. */
int rt_dynamo_types_init(PyObject *module, rt_state *st);

#endif
