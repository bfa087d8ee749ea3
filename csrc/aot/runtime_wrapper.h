#ifndef TORCH_AOT_RT_RUNTIME_WRAPPER_H
#define TORCH_AOT_RT_RUNTIME_WRAPPER_H

#include "state.h"

/* Creates the RuntimeWrapper heap type for `module` (exec slot). */
PyTypeObject *rt_runtime_wrapper_type_new(PyObject *module);

/* prologue_range.c */
/* record_runtime_wrapper_prologue_enter(): *range is set to the entered
 * range object, or NULL when the profiler or the config is off. */
int rt_prologue_range_enter(rt_state *st, PyObject **range);
/* record_runtime_wrapper_prologue_exit(): clears *range; keeps a pending
 * exception. */
int rt_prologue_range_exit(rt_state *st, PyObject **range);

#endif
