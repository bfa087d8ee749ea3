/* lookup.h: what a state binds once a module imports: an attribute path
 * ("ops.aten._unsafe_view") on an imported module, one at a time or as a
 * table of a struct's fields. No dependency but Python.h. */
#ifndef TORCH_AOT_RT_LOOKUP_H
#define TORCH_AOT_RT_LOOKUP_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stddef.h>

/* import_module(module), then the attribute path `path` ("a.b.c") on it, or
 * the module itself when path is NULL: a new reference, or NULL with the
 * exception set. */
PyObject *rt_lookup(const char *module, const char *path);

/* One field: its offset in the struct (offsetof), the module and the path. */
typedef struct {
    size_t offset;
    const char *module;
    const char *path;
} rt_lookup_field;

/* Binds each field of base (a PyObject * it owns, replacing what it held):
 * 0, or -1 with an exception, the fields bound so far left bound (the
 * state's clear releases them). */
int rt_lookup_fields(void *base, const rt_lookup_field *fields, size_t n);

#endif
