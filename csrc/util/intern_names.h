/* intern_names.h: a table of names interned into a struct's PyObject *
 * fields, for the states that keep the attribute and global names they read
 * interned (dynamo/disable.c, dynamo/compile_wrapper_bind.c,
 * aot/alias_state.h). No dependency but Python.h, so any header may use it. */
#ifndef TORCH_AOT_RT_INTERN_NAMES_H
#define TORCH_AOT_RT_INTERN_NAMES_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stddef.h>

/* One field: its offset in the struct (offsetof) and the name's text. */
typedef struct {
    size_t offset;
    const char *text;
} rt_name_field;

/* Interns each text into base's field at its offset (a new reference the
 * field owns): 0, or -1 with an exception, the fields set so far left set
 * (the state's clear releases them). */
static inline int
rt_intern_names(void *base, const rt_name_field *fields, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        PyObject *s = PyUnicode_InternFromString(fields[i].text);
        if (s == NULL) {
            return -1;
        }
        *(PyObject **)((char *)base + fields[i].offset) = s;
    }
    return 0;
}

#endif
