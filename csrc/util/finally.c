/* finally.c: see finally.h. */
#include "util/finally.h"

void
rt_finally_begin(rt_pending_error *saved)
{
    PyErr_Fetch(&saved->type, &saved->value, &saved->tb);
}

int
rt_finally_end(rt_pending_error *saved, int cleanup_ok)
{
    if (saved->type == NULL) {
        return cleanup_ok ? 0 : -1;
    }
    if (cleanup_ok) {
        PyErr_Restore(saved->type, saved->value, saved->tb);
        return -1;
    }
    /* The cleanup raised: its exception wins, with ours as __context__. */
    PyErr_NormalizeException(&saved->type, &saved->value, &saved->tb);
    if (saved->tb != NULL) {
        PyException_SetTraceback(saved->value, saved->tb);
    }
    PyObject *type, *value, *tb;
    PyErr_Fetch(&type, &value, &tb);
    PyErr_NormalizeException(&type, &value, &tb);
    PyException_SetContext(value, saved->value); /* steals */
    Py_DECREF(saved->type);
    Py_XDECREF(saved->tb);
    PyErr_Restore(type, value, tb);
    return -1;
}
