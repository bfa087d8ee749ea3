/* thread_local.c: see thread_local.h. */
#include "util/thread_local.h"

int
rt_thread_locals_init(rt_thread_locals *t)
{
    PyObject *mod = PyImport_ImportModule("_thread");
    if (mod == NULL) {
        return -1;
    }
    PyObject *type = PyObject_GetAttrString(mod, "_local");
    Py_DECREF(mod);
    if (type == NULL) {
        return -1;
    }
    if (!PyType_Check(type)) {
        Py_DECREF(type);
        PyErr_SetString(PyExc_TypeError, "_thread._local is not a type");
        return -1;
    }
    t->type = (PyTypeObject *)type;
    t->str_dict = PyUnicode_InternFromString("__dict__");
    return t->str_dict == NULL ? -1 : 0;
}

int
rt_thread_locals_traverse(rt_thread_locals *t, visitproc visit, void *arg)
{
    Py_VISIT(t->type);
    for (int i = 0; i < RT_TLS_N; i++) {
        Py_VISIT(t->slots[i].local);
        for (int k = 0; k < RT_TLS_THREADS; k++) {
            Py_VISIT(t->slots[i].threads[k].dict);
        }
    }
    return 0;
}

static void
forget_threads(rt_tls_slot *s)
{
    for (int k = 0; k < RT_TLS_THREADS; k++) {
        s->threads[k].thread_id = 0;
        Py_CLEAR(s->threads[k].dict);
    }
}

void
rt_thread_locals_clear(rt_thread_locals *t)
{
    Py_CLEAR(t->type);
    Py_CLEAR(t->str_dict);
    for (int i = 0; i < RT_TLS_N; i++) {
        Py_CLEAR(t->slots[i].local);
        forget_threads(&t->slots[i]);
    }
}

/* whether the thread with this id is alive in the current interpreter */
static int
thread_alive(uint64_t id)
{
    PyInterpreterState *interp = PyThreadState_GetInterpreter(PyThreadState_Get());
    for (PyThreadState *ts = PyInterpreterState_ThreadHead(interp); ts != NULL;
         ts = PyThreadState_Next(ts)) {
        if (PyThreadState_GetID(ts) == id) {
            return 1;
        }
    }
    return 0;
}

/* The entry a thread not remembered takes: a free one, else one of a thread
 * that ended, else the next in turn. */
static rt_tls_thread *
entry_for_new_thread(rt_tls_slot *s)
{
    for (int k = 0; k < RT_TLS_THREADS; k++) {
        if (s->threads[k].thread_id == 0) {
            return &s->threads[k];
        }
    }
    for (int k = 0; k < RT_TLS_THREADS; k++) {
        if (!thread_alive(s->threads[k].thread_id)) {
            return &s->threads[k];
        }
    }
    rt_tls_thread *e = &s->threads[s->next];
    s->next = (s->next + 1) % RT_TLS_THREADS;
    return e;
}

/* The current thread's dict of local (borrowed; owned by the slot), NULL
 * with no exception where local is not a _thread._local (or a subclass
 * keeping its attribute access), NULL with one on an error. */
static PyObject *
thread_dict(rt_thread_locals *t, rt_tls_slot *s, PyObject *local)
{
    uint64_t id = PyThreadState_GetID(PyThreadState_Get());
    if (s->local == local) {
        for (int k = 0; k < RT_TLS_THREADS; k++) {
            if (s->threads[k].thread_id == id) {
                return s->threads[k].dict;
            }
        }
    }
    PyTypeObject *tp = Py_TYPE(local);
    if (t->type == NULL || !PyType_IsSubtype(tp, t->type) ||
        tp->tp_getattro != t->type->tp_getattro || tp->tp_setattro != t->type->tp_setattro) {
        return NULL;
    }
    PyObject *d = PyObject_GetAttr(local, t->str_dict);
    if (d == NULL) {
        return NULL;
    }
    if (!PyDict_CheckExact(d)) {
        Py_DECREF(d);
        return NULL;
    }
    if (s->local != local) { /* another local in this slot: its threads' dicts go */
        forget_threads(s);
        Py_XSETREF(s->local, Py_NewRef(local));
    }
    rt_tls_thread *e = entry_for_new_thread(s);
    e->thread_id = id;
    Py_XSETREF(e->dict, d);
    return d;
}

/* The class attribute the generic look-up finds for name (borrowed), or
 * NULL; *generic 1 where it is a descriptor (Python's look-up decides). */
static PyObject *
class_attr(PyObject *local, PyObject *name, int setting, int *generic)
{
    PyObject *a = _PyType_Lookup(Py_TYPE(local), name);
    *generic = a != NULL && (Py_TYPE(a)->tp_descr_set != NULL ||
                             (!setting && Py_TYPE(a)->tp_descr_get != NULL));
    return a;
}

int
rt_tls_get(rt_thread_locals *t, int slot, PyObject *local, PyObject *name, PyObject **out)
{
    *out = NULL;
    PyObject *d = thread_dict(t, &t->slots[slot], local);
    int generic = 1;
    if (d != NULL) {
        PyObject *a = class_attr(local, name, 0, &generic);
        if (!generic) {
            PyObject *v = PyDict_GetItemWithError(d, name);
            if (v == NULL && PyErr_Occurred()) {
                return -1;
            }
            *out = Py_XNewRef(v != NULL ? v : a);
            return *out != NULL;
        }
    }
    else if (PyErr_Occurred()) {
        return -1;
    }
    *out = PyObject_GetAttr(local, name);
    if (*out != NULL) {
        return 1;
    }
    if (!PyErr_ExceptionMatches(PyExc_AttributeError)) {
        return -1;
    }
    PyErr_Clear();
    return 0;
}

int
rt_tls_set(rt_thread_locals *t, int slot, PyObject *local, PyObject *name, PyObject *value)
{
    PyObject *d = thread_dict(t, &t->slots[slot], local);
    if (d != NULL) {
        int generic;
        class_attr(local, name, 1, &generic);
        if (!generic) {
            return PyDict_SetItem(d, name, value);
        }
    }
    else if (PyErr_Occurred()) {
        return -1;
    }
    return PyObject_SetAttr(local, name, value);
}
