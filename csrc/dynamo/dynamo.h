/* dynamo: Dynamo's per-call layers in C (the disable wrapper, the
 * saved-tensor-hooks guard); their function-like types. */
#ifndef TORCH_AOT_RT_DYNAMO_H
#define TORCH_AOT_RT_DYNAMO_H

#include "torch_api.h"

extern PyType_Spec SavedHooksGuard_spec;
extern PyType_Spec DisabledCall_spec;

/* Creates Dynamo's function-like types into the module state. */
int rt_dynamo_types_init(PyObject *module, rt_state *st);

#endif
