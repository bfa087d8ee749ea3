/* finally.h: a `finally:` block in C. No dependency but Python.h. */
#ifndef TORCH_AOT_RT_FINALLY_H
#define TORCH_AOT_RT_FINALLY_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>

/* Cleanup that runs while an exception may be pending (a `finally:`):
 * rt_finally_begin stashes it; rt_finally_end puts it back, or, when the
 * cleanup itself raised, keeps the new one with the old as __context__,
 * exactly as Python does. Returns -1 when an exception is set at the end. */
typedef struct { PyObject *type, *value, *tb; } rt_pending_error;
void rt_finally_begin(rt_pending_error *saved);
int rt_finally_end(rt_pending_error *saved, int cleanup_ok);

#endif
