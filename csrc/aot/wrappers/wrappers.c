/* wrappers.c: what the compiler-wrapper types share (see wrappers.h). */
#include "aot/wrappers/wrappers.h"

#include "fn_object.h"
#include "util/intern_names.h"

int
rt_wrappers_state_init(rt_wrappers_state *ws, PyObject *str_dtype, PyObject *str_device)
{
    static const rt_name_field names[] = {
        {offsetof(rt_wrappers_state, str_base), "_base"},
        {offsetof(rt_wrappers_state, str_untyped_storage), "untyped_storage"},
        {offsetof(rt_wrappers_state, str_empty), "empty"},
    };
    if (rt_intern_names(ws, names, sizeof(names) / sizeof(names[0])) < 0 ||
        (ws->zero_shape = Py_BuildValue("(i)", 0)) == NULL ||
        (ws->kwnames_dtype_device = PyTuple_Pack(2, str_dtype, str_device)) == NULL) {
        return -1;
    }
    return 0;
}

int
rt_wrapper_types_init(PyObject *module)
{
    PyType_Spec *specs[] = {
        &DedupeWrapper_spec,
        &EffectTokensWrapper_spec,
        &SyntheticBaseWrapper_spec,
        &RngWrapper_spec,
        &FakifiedOutWrapper_spec,
        &DebugAssertWrapper_spec,
        &ForwardingWrapper_spec,
    };
    for (size_t i = 0; i < sizeof(specs) / sizeof(specs[0]); i++) {
        /* the module's dict keeps the type; instances hold their own
         * reference to it (heap types) */
        PyObject *type = PyType_FromModuleAndSpec(module, specs[i], NULL);
        if (type == NULL) {
            return -1;
        }
        int rc = PyModule_AddType(module, (PyTypeObject *)type);
        Py_DECREF(type);
        if (rc < 0) {
            return -1;
        }
    }
    return 0;
}

PyObject *
rt_list_item(PyObject *list, Py_ssize_t i)
{
    /* PyList_GetItem raises IndexError("list index out of range"), as
     * BINARY_SUBSCR on a list does for a non-negative index */
    return PyList_GetItem(list, i);
}

int
rt_plain_list_call(PyObject *const *argv, size_t nargsf, PyObject *kwnames)
{
    return PyVectorcall_NARGS(nargsf) == 1 &&
           (kwnames == NULL || PyTuple_GET_SIZE(kwnames) == 0) && PyList_CheckExact(argv[0]);
}

Py_ssize_t *
rt_index_tuple(PyObject *v, const char *what, Py_ssize_t *n)
{
    if (!PyTuple_Check(v)) {
        PyErr_Format(PyExc_ValueError, "%s must be a tuple of ints", what);
        return NULL;
    }
    *n = PyTuple_GET_SIZE(v);
    Py_ssize_t *out = PyMem_Malloc(((size_t)*n + 1) * sizeof(Py_ssize_t));
    if (out == NULL) {
        PyErr_NoMemory();
        return NULL;
    }
    for (Py_ssize_t i = 0; i < *n; i++) {
        PyObject *item = PyTuple_GET_ITEM(v, i);
        out[i] = PyLong_Check(item) ? PyLong_AsSsize_t(item) : -1;
        if (out[i] < 0) {
            PyErr_Clear();
            PyErr_Format(PyExc_ValueError, "%s must be a tuple of non-negative ints", what);
            PyMem_Free(out);
            return NULL;
        }
    }
    return out;
}
