/* alias_state.h: the state of alias_from_base.c (gen_alias_from_base in
 * C); its functions are declared in torch_api.h with the epilogue's other
 * tensor operations. The state's life cycle is inline here so that
 * torch_api.c, which owns rt_state, needs nothing of alias_from_base.c (that
 * file calls into torch_api.c, never the other way). */
#ifndef TORCH_AOT_RT_ALIAS_STATE_H
#define TORCH_AOT_RT_ALIAS_STATE_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stddef.h>

#include "util/intern_names.h"

/* owned references only: traversed and cleared as an array (objects.h) */
typedef struct {
    PyObject *str_base;             /* _base */
    PyObject *str_view_func;        /* _view_func */
    PyObject *str_as_strided;
    PyObject *str_is_complex;
    PyObject *str_view;
    PyObject *str_untyped_storage;
    PyObject *str_cdata;            /* _cdata */
    PyObject *view_as_real;         /* torch.view_as_real, bound with torch */
    PyObject *view_as_complex;      /* torch.view_as_complex */
} rt_alias_state;

static inline int
rt_alias_state_init(rt_alias_state *as)
{
    static const rt_name_field names[] = {
        {offsetof(rt_alias_state, str_base), "_base"},
        {offsetof(rt_alias_state, str_view_func), "_view_func"},
        {offsetof(rt_alias_state, str_as_strided), "as_strided"},
        {offsetof(rt_alias_state, str_is_complex), "is_complex"},
        {offsetof(rt_alias_state, str_view), "view"},
        {offsetof(rt_alias_state, str_untyped_storage), "untyped_storage"},
        {offsetof(rt_alias_state, str_cdata), "_cdata"},
    };
    return rt_intern_names(as, names, sizeof(names) / sizeof(names[0]));
}

/* once torch is importable (rt_aot_bind) */
static inline int
rt_alias_state_bind(rt_alias_state *as)
{
    PyObject *torch = PyImport_ImportModule("torch");
    if (torch == NULL) {
        return -1;
    }
    Py_XSETREF(as->view_as_real, PyObject_GetAttrString(torch, "view_as_real"));
    Py_XSETREF(as->view_as_complex, PyObject_GetAttrString(torch, "view_as_complex"));
    Py_DECREF(torch);
    return as->view_as_real && as->view_as_complex ? 0 : -1;
}

#endif
