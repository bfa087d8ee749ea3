/* objects.h: a layer's owned references kept in a struct of PyObject *
 * members only (its type objects in one of PyTypeObject * members), visited
 * and cleared as an array: a new field needs no second list to be traversed
 * and released. No dependency but Python.h. */
#ifndef TORCH_AOT_RT_OBJECTS_H
#define TORCH_AOT_RT_OBJECTS_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>

static inline int
rt_objects_traverse(PyObject **objects, size_t n, visitproc visit, void *arg)
{
    for (size_t i = 0; i < n; i++) {
        Py_VISIT(objects[i]);
    }
    return 0;
}

static inline void
rt_objects_clear(PyObject **objects, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        Py_CLEAR(objects[i]);
    }
}

static inline int
rt_types_traverse(PyTypeObject **types, size_t n, visitproc visit, void *arg)
{
    for (size_t i = 0; i < n; i++) {
        Py_VISIT(types[i]);
    }
    return 0;
}

static inline void
rt_types_clear(PyTypeObject **types, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        Py_CLEAR(types[i]);
    }
}

/* s: a struct of PyObject * (or of PyTypeObject *) members only. */
#define RT_OBJECTS_TRAVERSE(s, visit, arg)                                        \
    rt_objects_traverse((PyObject **)&(s), sizeof(s) / sizeof(PyObject *), visit, arg)
#define RT_OBJECTS_CLEAR(s) rt_objects_clear((PyObject **)&(s), sizeof(s) / sizeof(PyObject *))
#define RT_TYPES_TRAVERSE(s, visit, arg)                                          \
    rt_types_traverse((PyTypeObject **)&(s), sizeof(s) / sizeof(PyTypeObject *), visit, arg)
#define RT_TYPES_CLEAR(s) rt_types_clear((PyTypeObject **)&(s), sizeof(s) / sizeof(PyTypeObject *))

#endif
