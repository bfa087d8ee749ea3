/* alias_from_base.h: the state of alias_from_base.c (gen_alias_from_base's
 * view-function and as_strided branches); its functions are declared in
 * torch_api.h with the other alias-replay operations. */
#ifndef TORCH_AOT_RT_ALIAS_FROM_BASE_H
#define TORCH_AOT_RT_ALIAS_FROM_BASE_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>

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

int rt_alias_state_init(rt_alias_state *as);
int rt_alias_state_bind(rt_alias_state *as);
int rt_alias_state_traverse(rt_alias_state *as, visitproc visit, void *arg);
void rt_alias_state_clear(rt_alias_state *as);

#endif
