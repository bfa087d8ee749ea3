/* fn_object: what every function-like type of ours shares, whatever layer
 * it mirrors (aot/, dynamo/): the object head (vectorcall, module state,
 * __dict__, weakrefs), plan-parsing helpers, and the type boilerplate
 * (fn_object.c). */
#ifndef TORCH_AOT_RT_FN_OBJECT_H
#define TORCH_AOT_RT_FN_OBJECT_H

#include "plan.h"
#include "state.h"

#include <stddef.h>
#include <structmember.h>

#define RT_STACK_ARGS 16

#define RT_FN_HEAD                                                           \
    PyObject_HEAD                                                            \
    vectorcallfunc vectorcall;                                               \
    rt_state *st;                                                            \
    PyObject *module;                                                        \
    PyObject *dict;                                                          \
    PyObject *weakreflist;

typedef struct {
    RT_FN_HEAD
} FnObject;

typedef struct {
    Py_ssize_t n;
    Py_ssize_t *idx;
} index_array;

/* A new object of `type` with its head filled in; NULL unless torch is bound. */
PyObject *rt_fn_alloc(PyTypeObject *type, vectorcallfunc call);
/* A non-negative int, or None as -1 */
int rt_index_or_none(PyObject *v, const char *what, Py_ssize_t *out);
/* (start, stop) of a step-1 slice; None kept open, negatives from the end */
int rt_parse_span(PyObject *kwargs, const char *key, Py_ssize_t span[2]);
/* kwargs[key]: a new reference to a callable, or NULL for None (*err set on error) */
PyObject *rt_callable_or_null(PyObject *kwargs, const char *key, int *err);

/* Bound like a Python function when found on a class through an instance
 * (CompiledBackward serves as the backward class's apply_boxed). */
PyObject *rt_fn_descr_get(PyObject *self, PyObject *obj, PyObject *type);

/* fname(reset=False) of a stats function: {names[i]: counts[i]}, zeroing
 * the counts when reset is true */
PyObject *rt_counts_dict(const char *fname, PyObject *const *args, Py_ssize_t nargs,
                         const char *const *names, Py_ssize_t *counts, int n);

extern PyGetSetDef rt_fn_getset[];

#define DEFINE_DEALLOC(Type, extra)                                          \
    static void Type##_dealloc(Type *self)                                   \
    {                                                                        \
        PyTypeObject *tp = Py_TYPE(self);                                    \
        PyObject_GC_UnTrack(self);                                           \
        if (self->weakreflist != NULL) {                                     \
            PyObject_ClearWeakRefs((PyObject *)self);                        \
        }                                                                    \
        Type##_clear(self);                                                  \
        extra;                                                               \
        Py_CLEAR(self->module);                                              \
        tp->tp_free(self);                                                   \
        Py_DECREF(tp);                                                       \
    }

#define FN_MEMBERS(Type)                                                     \
    static PyMemberDef Type##_members[] = {                                  \
        {"__vectorcalloffset__", T_PYSSIZET, offsetof(Type, vectorcall), READONLY, NULL}, \
        {"__dictoffset__", T_PYSSIZET, offsetof(Type, dict), READONLY, NULL}, \
        {"__weaklistoffset__", T_PYSSIZET, offsetof(Type, weakreflist), READONLY, NULL}, \
        {NULL, 0, 0, 0, NULL},                                               \
    };

#define FN_SPEC(Type, doc)                                      \
    static PyType_Slot Type##_slots[] = {                                    \
        {Py_tp_new, Type##_new},                                             \
        {Py_tp_dealloc, Type##_dealloc},                                     \
        {Py_tp_traverse, Type##_traverse},                                   \
        {Py_tp_clear, Type##_clear},                                         \
        {Py_tp_call, PyVectorcall_Call},                                     \
        {Py_tp_descr_get, rt_fn_descr_get},                                  \
        {Py_tp_members, Type##_members},                                     \
        {Py_tp_getset, rt_fn_getset},                                           \
        {Py_tp_doc, (void *)doc},                                            \
        {0, NULL},                                                           \
    };                                                                       \
    PyType_Spec Type##_spec = {                                       \
        .name = "torch_aot_rt._C." #Type,                                    \
        .basicsize = sizeof(Type),                                           \
        .flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC |                   \
                 Py_TPFLAGS_HAVE_VECTORCALL | Py_TPFLAGS_IMMUTABLETYPE |     \
                 Py_TPFLAGS_METHOD_DESCRIPTOR,                               \
        .slots = Type##_slots,                                               \
    };

#endif
