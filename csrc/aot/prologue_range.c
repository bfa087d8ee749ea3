/* prologue_range.c: the profiler range upstream's runtime wrapper enters
 * around its prologue (record_runtime_wrapper_prologue_enter / _exit in
 * runtime_wrappers.py), where the profiler is on and
 * torch._dynamo.config.record_runtime_overhead says so. */
#include "aot/runtime_wrapper.h"

#include "config/config_read.h"
#include "state.h"

int
rt_prologue_range_enter(rt_state *st, PyObject **range)
{
    *range = NULL;
    PyObject *on = PyDict_GetItemWithError(st->torch.obj.profiler_globals,
                                           st->torch.obj.str_is_profiler_enabled);
    if (on == NULL) {
        if (PyErr_Occurred()) {
            return -1;
        }
        PyErr_SetString(PyExc_AttributeError,
                        "module 'torch.autograd.profiler' has no attribute "
                        "'_is_profiler_enabled'");
        return -1;
    }
    int v = PyObject_IsTrue(on);
    if (v <= 0) {
        return v;
    }
    PyObject *flag = rt_config_read(st, st->aot.obj.dynamo_config, st->aot.obj.str_record_runtime_overhead);
    if (flag == NULL) {
        return -1;
    }
    v = PyObject_IsTrue(flag);
    Py_DECREF(flag);
    if (v <= 0) {
        return v;
    }
    PyObject *cm = PyObject_CallOneArg(st->torch.obj.RecordFunctionFast, st->aot.obj.prologue_range_name);
    if (cm == NULL) {
        return -1;
    }
    if (rt_context_enter(st, cm) < 0) {
        Py_DECREF(cm);
        return -1;
    }
    *range = cm;
    return 0;
}

int
rt_prologue_range_exit(rt_state *st, PyObject **range)
{
    PyObject *cm = *range;
    if (cm == NULL) {
        return 0;
    }
    *range = NULL;
    /* upstream: cm.__exit__(None, None, None), whatever is pending */
    rt_pending_error saved;
    rt_finally_begin(&saved);
    int ok = rt_context_exit(st, cm, 0) == 0;
    Py_DECREF(cm);
    return rt_finally_end(&saved, ok);
}

