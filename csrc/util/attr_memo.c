/* attr_memo.c: see attr_memo.h. */
#include "util/attr_memo.h"

#include "util/dict_version.h"
#include "util/py_compat.h"

void
rt_attr_memo_clear(rt_attr_memo *m)
{
    Py_CLEAR(m->obj);
    Py_CLEAR(m->dict);
    for (int i = 0; i < m->n; i++) {
        Py_CLEAR(m->values[i]);
    }
    m->n = 0;
    m->dict_version = 0;
    m->type_tag = 0;
}

int
rt_attr_memo_traverse(rt_attr_memo *m, visitproc visit, void *arg)
{
    Py_VISIT(m->obj);
    Py_VISIT(m->dict);
    for (int i = 0; i < m->n; i++) {
        Py_VISIT(m->values[i]);
    }
    return 0;
}

/* 1 where the memo's results are obj's at its current versions */
static int
still_valid(rt_attr_memo *m, PyObject *obj, int n)
{
    return m->obj == obj && m->n == n && m->dict != NULL &&
           rt_type_unchanged(Py_TYPE(obj), m->type_tag) &&
           rt_dict_unchanged(m->dict, m->dict_version);
}

/* 1 where each name's read is the instance dict's entry or a plain class
 * attribute (see attr_memo.h), with *dict obj's dict (a new reference) */
static int
memoizable(PyObject *obj, PyObject *const *names, int n, PyObject **dict)
{
    PyTypeObject *tp = Py_TYPE(obj);
    *dict = NULL;
    if (tp->tp_getattro != PyObject_GenericGetAttr || !rt_type_tag_valid(tp) ||
        tp->tp_dictoffset == 0 || !rt_instance_writes_reach_dict(tp)) {
        return 0;
    }
    for (int i = 0; i < n; i++) {
        PyObject *a = _PyType_Lookup(tp, names[i]);
        if (a != NULL && (Py_TYPE(a)->tp_descr_get != NULL || Py_TYPE(a)->tp_descr_set != NULL)) {
            return 0;
        }
    }
    PyObject *d = PyObject_GenericGetDict(obj, NULL);
    if (d == NULL) {
        PyErr_Clear(); /* no dict to watch: read each time */
        return 0;
    }
    if (!PyDict_CheckExact(d) || rt_dict_version(d) == 0) {
        Py_DECREF(d);
        return 0;
    }
    *dict = d;
    return 1;
}

int
rt_attr_memo_read(rt_attr_memo *m, PyObject *obj, PyObject *const *names, int n)
{
    if (still_valid(m, obj, n)) {
        return 1;
    }
    PyObject *dict;
    if (!memoizable(obj, names, n, &dict)) {
        return 0;
    }
    /* reads that run no code (memoizable) */
    PyObject *values[RT_ATTR_MEMO_MAX] = {NULL};
    for (int i = 0; i < n; i++) {
        values[i] = PyObject_GetAttr(obj, names[i]);
        if (values[i] == NULL) {
            if (!PyErr_ExceptionMatches(PyExc_AttributeError)) {
                for (int j = 0; j < i; j++) {
                    Py_XDECREF(values[j]);
                }
                Py_DECREF(dict);
                rt_attr_memo_clear(m);
                return -1;
            }
            PyErr_Clear();
        }
    }
    /* the old results are released last: releasing may run code */
    rt_attr_memo old = *m;
    m->obj = Py_NewRef(obj);
    m->dict = dict;
    m->dict_version = rt_dict_version(dict);
    m->type_tag = Py_TYPE(obj)->tp_version_tag;
    m->n = n;
    for (int i = 0; i < n; i++) {
        m->values[i] = values[i];
    }
    rt_attr_memo_clear(&old);
    return 1;
}
