#ifndef TORCH_AOT_RT_RUNTIME_WRAPPER_H
#define TORCH_AOT_RT_RUNTIME_WRAPPER_H

#include "torch_api.h"

/* Creates the RuntimeWrapper heap type for `module` (exec slot). */
PyTypeObject *rt_runtime_wrapper_type_new(PyObject *module);

#endif
