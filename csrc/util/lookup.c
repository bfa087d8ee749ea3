/* lookup.c: see lookup.h. */
#include "util/lookup.h"

#include <string.h>

PyObject *
rt_lookup(const char *module, const char *path)
{
    PyObject *obj = PyImport_ImportModule(module);
    while (obj != NULL && path != NULL) {
        const char *dot = strchr(path, '.');
        PyObject *attr = dot ? PyUnicode_FromStringAndSize(path, dot - path)
                             : PyUnicode_FromString(path);
        Py_SETREF(obj, attr ? PyObject_GetAttr(obj, attr) : NULL);
        Py_XDECREF(attr);
        path = dot ? dot + 1 : NULL;
    }
    return obj;
}

int
rt_lookup_fields(void *base, const rt_lookup_field *fields, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        PyObject *obj = rt_lookup(fields[i].module, fields[i].path);
        if (obj == NULL) {
            return -1;
        }
        Py_XSETREF(*(PyObject **)((char *)base + fields[i].offset), obj);
    }
    return 0;
}
