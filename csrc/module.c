/* module.c: torch_aot_rt._C, its module state and its one function.
 *
 * Multi-phase init (PEP 489): the exec slot interns names and creates the
 * RuntimeWrapper type into the module state. Torch is looked up later, once,
 * by _bind_torch(), which the Python shim calls after importing torch: the
 * extension itself neither links nor imports torch at import time.
 */
#include "autograd_function.h"
#include "runtime_wrapper.h"
#include "torch_api.h"

static PyObject *
bind_torch(PyObject *module, PyObject *args, PyObject *kwargs)
{
    static char *keywords[] = {"opaque_type_check", "opaque_base", "external_objects", "cpp",
                               NULL};
    rt_release_names names = {NULL, NULL, NULL};
    PyObject *cpp = Py_None;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "$sszO:_bind_torch", keywords,
                                     &names.opaque_type_check, &names.opaque_base,
                                     &names.external_objects, &cpp)) {
        return NULL;
    }
    if (rt_torch_bind(PyModule_GetState(module), &names, cpp) < 0) {
        return NULL;
    }
    Py_RETURN_NONE;
}

static PyMethodDef module_methods[] = {
    {"_bind_torch", (PyCFunction)(void (*)(void))bind_torch, METH_VARARGS | METH_KEYWORDS,
     PyDoc_STR("_bind_torch(*, opaque_type_check, opaque_base, external_objects, cpp)\n"
               "Look up the torch callables the C runtime uses (once per process), "
               "with the names the installed release gives what changed; cpp is the "
               "C++ part's rt_cpp_api capsule, or None for the C core alone.")},
    {NULL, NULL, 0, NULL},
};

static int
module_exec(PyObject *module)
{
    rt_state *st = PyModule_GetState(module);
    if (rt_state_init(st) < 0) {
        return -1;
    }
    st->RuntimeWrapperType = rt_runtime_wrapper_type_new(module);
    if (st->RuntimeWrapperType == NULL) {
        return -1;
    }
    if (PyModule_AddType(module, st->RuntimeWrapperType) < 0) {
        return -1;
    }
    return rt_autograd_types_init(module, st);
}

static int
module_traverse(PyObject *module, visitproc visit, void *arg)
{
    return rt_state_traverse(PyModule_GetState(module), visit, arg);
}

static int
module_clear(PyObject *module)
{
    rt_state_clear(PyModule_GetState(module));
    return 0;
}

static void
module_free(void *module)
{
    module_clear((PyObject *)module);
}

static PyModuleDef_Slot module_slots[] = {
    {Py_mod_exec, module_exec},
    {0, NULL},
};

static struct PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT,
    .m_name = "torch_aot_rt._C",
    .m_doc = "AOTAutograd's per-call runtime in C.",
    .m_size = sizeof(rt_state),
    .m_methods = module_methods,
    .m_slots = module_slots,
    .m_traverse = module_traverse,
    .m_clear = module_clear,
    .m_free = module_free,
};

PyMODINIT_FUNC
PyInit__C(void)
{
    return PyModuleDef_Init(&module_def);
}
