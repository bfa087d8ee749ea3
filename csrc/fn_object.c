/* fn_object.c: the plumbing every function-like type of ours shares
 * (fn_object.h): allocation bound to the module state, plan-parsing helpers,
 * descriptor binding, per-path counts as stats() dicts. */
#include "fn_object.h"

#include <string.h>

static rt_state *
rt_bound_state(PyTypeObject *type, PyObject **module)
{
    *module = PyType_GetModule(type);
    if (*module == NULL) {
        return NULL;
    }
    rt_state *st = PyModule_GetState(*module);
    if (!st->torch.bound) {
        PyErr_SetString(PyExc_RuntimeError,
                        "torch_aot_rt._C: _bind_torch() must be called first");
        return NULL;
    }
    return st;
}

PyObject *
rt_fn_alloc(PyTypeObject *type, vectorcallfunc call)
{
    PyObject *module;
    rt_state *st = rt_bound_state(type, &module);
    if (st == NULL) {
        return NULL;
    }
    FnObject *self = (FnObject *)type->tp_alloc(type, 0);
    if (self == NULL) {
        return NULL;
    }
    self->vectorcall = call;
    self->st = st;
    self->module = Py_NewRef(module);
    return (PyObject *)self;
}

int
rt_index_or_none(PyObject *v, const char *what, Py_ssize_t *out)
{
    if (v == Py_None) {
        *out = -1;
        return 0;
    }
    if (!PyLong_Check(v) || (*out = PyLong_AsSsize_t(v)) < 0) {
        if (!PyErr_Occurred() || PyErr_ExceptionMatches(PyExc_OverflowError)) {
            PyErr_Clear();
            PyErr_Format(PyExc_ValueError, "plan: %s must be a non-negative int or None", what);
        }
        return -1;
    }
    return 0;
}

/* (start, stop) of a Python slice with step 1; None is kept as the
 * "open" bound and negative bounds count from the end, at call time. */
int
rt_parse_span(PyObject *kwargs, const char *key, Py_ssize_t span[2])
{
    PyObject *v = rt_plan_required(kwargs, key);
    if (v == NULL) {
        return -1;
    }
    if (!PyTuple_Check(v) || PyTuple_GET_SIZE(v) != 2) {
        PyErr_Format(PyExc_ValueError, "plan: %s must be a (start, stop) tuple", key);
        return -1;
    }
    for (int k = 0; k < 2; k++) {
        PyObject *b = PyTuple_GET_ITEM(v, k);
        if (b == Py_None) {
            span[k] = k == 0 ? 0 : PY_SSIZE_T_MAX;
            continue;
        }
        if (!PyLong_Check(b)) {
            PyErr_Format(PyExc_ValueError, "plan: %s bounds must be ints or None", key);
            return -1;
        }
        span[k] = PyLong_AsSsize_t(b);
        if (span[k] == -1 && PyErr_Occurred()) {
            return -1;
        }
    }
    return 0;
}

PyObject *
rt_callable_or_null(PyObject *kwargs, const char *key, int *err)
{
    PyObject *v = rt_plan_required(kwargs, key);
    if (v == NULL) {
        *err = 1;
        return NULL;
    }
    if (v == Py_None) {
        return NULL;
    }
    if (!PyCallable_Check(v)) {
        PyErr_Format(PyExc_ValueError, "plan: %s must be callable or None", key);
        *err = 1;
        return NULL;
    }
    return Py_NewRef(v);
}

PyObject *
rt_fn_descr_get(PyObject *self, PyObject *obj, PyObject *Py_UNUSED(type))
{
    if (obj == NULL || obj == Py_None) {
        return Py_NewRef(self);
    }
    return PyMethod_New(self, obj);
}

PyObject *
rt_counts_dict(const char *fname, PyObject *const *args, Py_ssize_t nargs,
               const char *const *names, Py_ssize_t *counts, int n)
{
    int reset = 0;
    if (nargs > 1 || (nargs == 1 && (reset = PyObject_IsTrue(args[0])) < 0)) {
        if (!PyErr_Occurred()) {
            PyErr_Format(PyExc_TypeError, "%s(reset=False)", fname);
        }
        return NULL;
    }
    PyObject *out = PyDict_New();
    for (int i = 0; out != NULL && i < n; i++) {
        PyObject *v = PyLong_FromSsize_t(counts[i]);
        if (v == NULL || PyDict_SetItemString(out, names[i], v) < 0) {
            Py_CLEAR(out);
        }
        Py_XDECREF(v);
    }
    if (out != NULL && reset) {
        memset(counts, 0, (size_t)n * sizeof(counts[0]));
    }
    return out;
}

PyGetSetDef rt_fn_getset[] = {
    {"__dict__", PyObject_GenericGetDict, PyObject_GenericSetDict, NULL, NULL},
    {NULL, NULL, NULL, NULL, NULL},
};
