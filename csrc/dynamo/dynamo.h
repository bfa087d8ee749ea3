/* dynamo: Dynamo's per-call layers in C (the disable wrapper, the
 * functions the transformed bytecode calls, the saved-tensor-hooks guard);
 * their types. */
#ifndef TORCH_AOT_RT_DYNAMO_H
#define TORCH_AOT_RT_DYNAMO_H

#include "torch_api.h"

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
