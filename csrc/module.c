/* module.c: torch_aot_rt._C, its module state and its one function.
 *
 * Multi-phase init (PEP 489): the exec slot interns names and creates the
 * RuntimeWrapper type into the module state. Torch is looked up later, once,
 * by _bind_torch(), which the Python shim calls after importing torch: the
 * extension itself neither links nor imports torch at import time.
 */

#include "fn_object.h"
#include "plan.h"
#include "aot/autograd/autograd_function.h"
#include "aot/runtime_wrapper.h"
#include "aot/wrappers/wrappers.h"
#include "config/config_read.h"
#include "dynamo/compile_wrapper.h"
#include "dynamo/disable.h"
#include "dynamo/dynamo.h"
#include "inductor/inductor.h"
#include "state.h"
#include "state.h"
#include "util/dict_version.h"
#include "util/frame_stub.h"
#include "util/py_compat.h"

static PyObject *
bind_torch(PyObject *module, PyObject *args, PyObject *kwargs)
{
    static char *keywords[] = {"opaque_type_check", "opaque_base", "external_objects",
                               "external_objects_type", "external_objects_setter",
                               "input_grad_buffers", "cpp", NULL};
    rt_release_names names = {NULL, NULL, NULL, NULL, NULL, 0};
    PyObject *cpp = Py_None;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "$szzzzpO:_bind_torch", keywords,
                                     &names.opaque_type_check, &names.opaque_base,
                                     &names.external_objects, &names.external_objects_type,
                                     &names.external_objects_setter,
                                     &names.input_grad_buffers, &cpp)) {
        return NULL;
    }
    if (rt_state_bind(PyModule_GetState(module), &names, cpp) < 0) {
        return NULL;
    }
    Py_RETURN_NONE;
}

/* Names of rt_node_declined, for stats() */
static const char *const node_reasons[RT_NODE_N_DECLINED] = {
    [RT_NODE_TAKEN] = "taken",
    [RT_NODE_JIT_TRACING] = "torch.jit tracing",
    [RT_NODE_RECORD_FUNCTION] = "profiler or RecordFunction callbacks active",
    [RT_NODE_TENSOR_KIND] = "tensor subclass, functorch, functional or nested input",
    [RT_NODE_FORWARD_AD] = "forward-mode AD input",
    [RT_NODE_FUNCTORCH] = "functorch transform active",
};

static PyObject *
node_stats(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    rt_state *st = PyModule_GetState(module);
    return rt_counts_dict("_node_stats", args, nargs, node_reasons, st->aot.node_counts,
                          RT_NODE_N_DECLINED);
}

/* Names of rt_epi_route, for stats() */
static const char *const epi_routes[RT_EPI_N_ROUTES] = {
    [RT_EPI_TAKEN] = "taken",
    [RT_EPI_DECLINED] = "declined by the C++ part (tensor kind, dispatch mode, patch)",
    [RT_EPI_NOT_OFFERED] = "not offered (torch function mode, subclass, no C++ sequence)",
};

static PyObject *
epilogue_stats(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    rt_state *st = PyModule_GetState(module);
    return rt_counts_dict("_epilogue_stats", args, nargs, epi_routes, st->torch.epi_counts,
                          RT_EPI_N_ROUTES);
}

/* Benchmarks only: route calls through the C++ part (True) or not (False),
 * keeping it loaded, so that one process measures both. */
static PyObject *
set_cpp_routes(PyObject *module, PyObject *flag)
{
    int on = PyObject_IsTrue(flag);
    if (on < 0) {
        return NULL;
    }
    rt_state *st = PyModule_GetState(module);
    st->torch.cpp = on ? st->torch.cpp_loaded : NULL;
    return PyBool_FromLong(st->torch.cpp_loaded != NULL);
}

static PyMethodDef module_methods[] = {
    {"_set_cpp_routes", set_cpp_routes, METH_O,
     PyDoc_STR("_set_cpp_routes($module, flag, /)\n--\n\nWhether the C++ part is loaded. Benchmarks only: "
               "the C core uses the C++ part (True) or runs alone (False).")},
    {"_node_stats", (PyCFunction)(void (*)(void))node_stats, METH_FASTCALL,
     PyDoc_STR("_node_stats($module, reset=False, /)\n--\n\nCompiledFunction calls by the C++ node's decision: "
               "'taken', or why upstream's Function.apply ran; reset zeroes the counts.")},
    {"_epilogue_stats", (PyCFunction)(void (*)(void))epilogue_stats, METH_FASTCALL,
     PyDoc_STR("_epilogue_stats($module, reset=False, /)\n--\n\nThe runtime wrapper epilogue's tensor "
               "operations by route while the C++ part is in use: 'taken' by it, or why "
               "the Python method ran; reset zeroes the counts.")},
    {"_bind_disable", (PyCFunction)(void (*)(void))rt_bind_disable,
     METH_VARARGS | METH_KEYWORDS,
     PyDoc_STR("_bind_disable($module, /, *, fn_code, fn_cell, ctx_cell, DisableContext, "
               "eval_frame, torch, compiler, set_eval_frame, callback_from_stance, "
               "is_exporting, skips_none_callback)\n--\n\nWhat DisabledCall reads, once the "
               "shim has verified "
               "torch._dynamo.disable's wrapper (torch_aot_rt/_disable.py).")},
    {"_disable_stats", (PyCFunction)(void (*)(void))rt_disable_stats, METH_FASTCALL,
     PyDoc_STR("_disable_stats($module, reset=False, /)\n--\n\nCompiled backwards given the C disable wrapper "
               "(or why not), and its calls by path; reset zeroes the counts.")},
    {"_disable_wrapper_for", rt_disable_wrapper_for_py, METH_O,
     PyDoc_STR("_disable_wrapper_for($module, obj, /)\n--\n\nobj, or a DisabledCall over it when it is a "
               "torch._dynamo.disable wrapper (once _bind_disable() verified them); counted "
               "in _disable_stats().")},
    {"_bind_compile_wrapper", (PyCFunction)(void (*)(void))rt_bind_compile_wrapper,
     METH_VARARGS | METH_KEYWORDS,
     PyDoc_STR("_bind_compile_wrapper($module, /, **kwargs)\n--\n\nBind the C "
               "compile_wrapper's state once the shim verified it.")},
    {"_compile_wrapper_for", rt_compile_wrapper_for, METH_O,
     PyDoc_STR("_compile_wrapper_for($module, wrapper, /)\n--\n\nwrapper, its calls run in C from now on "
               "where it is the verified compile_wrapper (counted).")},
    {"_is_c_compile_wrapper", rt_is_c_compile_wrapper_py, METH_O,
     PyDoc_STR("_is_c_compile_wrapper($module, obj, /)\n--\n\nWhether obj is a compile_wrapper function whose "
               "calls C runs.")},
    {"_reraise", (PyCFunction)(void (*)(void))rt_reraise, METH_VARARGS | METH_KEYWORDS,
     PyDoc_STR("_reraise($module, *args, **kwargs)\n--\n\nRaise the exception kept for this thread's frame "
               "stub as it is (its traceback goes on, no context is set): what a frame stub "
               "calls (torch_aot_rt/_frames.py).")},
    {"_bind_config_read", (PyCFunction)(void (*)(void))rt_bind_config_read,
     METH_VARARGS | METH_KEYWORDS,
     PyDoc_STR("_bind_config_read($module, config_module, /, *, attribute_overrides=False)\n--\n\nRead the "
               "config settings the layers read "
               "per call in C, as ConfigModule.__getattr__ returns them (once the shim "
               "checked the release mirrors it).")},
    {"_config_read", (PyCFunction)(void (*)(void))rt_config_read_py, METH_FASTCALL,
     PyDoc_STR("_config_read($module, config, name, /)\n--\n\nconfig.<name> as the layers read it per call.")},
    {"_config_read_stats", (PyCFunction)(void (*)(void))rt_config_read_stats, METH_FASTCALL,
     PyDoc_STR("_config_read_stats($module, reset=False, /)\n--\n\nConfig settings read per call, in C or by "
               "Python's attribute read; reset zeroes the counts.")},
    {"_compile_wrapper_stats", (PyCFunction)(void (*)(void))rt_cw_stats, METH_FASTCALL,
     PyDoc_STR("_compile_wrapper_stats($module, reset=False, /)\n--\n\nCompileWrappers built and their calls "
               "by path; reset zeroes the counts.")},
    {"_graph_call_mark", rt_graph_call_mark, METH_O,
     PyDoc_STR("_graph_call_mark($module, graph, /)\n--\n\nLet graph's calls run in C (compiled with the C "
               "runtime on).")},
    {"_graph_call_stats", (PyCFunction)(void (*)(void))rt_graph_call_stats, METH_FASTCALL,
     PyDoc_STR("_graph_call_stats($module, reset=False, /)\n--\n\nCalls of the C CompiledFxGraph.__call__ by "
               "path; reset zeroes the counts.")},
    {"_helper_stats", (PyCFunction)(void (*)(void))rt_helper_stats, METH_FASTCALL,
     PyDoc_STR("_helper_stats($module, reset=False, /)\n--\n\nCalls of the C torch._dynamo.utils helpers "
               "(record_pregraph_bytecode_enter/exit, call_size, call_stride, "
               "call_storage_offset) by path; reset zeroes the counts.")},
    {"_bind_torch", (PyCFunction)(void (*)(void))bind_torch, METH_VARARGS | METH_KEYWORDS,
     PyDoc_STR("_bind_torch($module, /, *, opaque_type_check, opaque_base, external_objects, "
               "external_objects_type, external_objects_setter, input_grad_buffers, cpp=None)"
               "\n--\n\n"
               "Look up the torch callables the C runtime uses (once per process), "
               "with the names the installed release gives what changed (external_objects "
               "an exact 'dict' or 'list'; the setter None where the backward stores "
               "weak references itself); cpp is the C++ part's rt_cpp_api capsule, or "
               "None for the C core alone, built with ctx.input_grad_buffers exactly when "
               "input_grad_buffers says the release has it.")},
    {NULL, NULL, 0, NULL},
};

static int
module_exec(PyObject *module)
{
    rt_state *st = PyModule_GetState(module);
    if (rt_dict_versions_init() < 0 || rt_state_init(st) < 0) {
        return -1;
    }
    st->aot.types.RuntimeWrapperType = rt_runtime_wrapper_type_new(module);
    if (st->aot.types.RuntimeWrapperType == NULL) {
        return -1;
    }
    if (rt_plan_constants_add(module) < 0 || rt_subclass_constants_add(module) < 0 ||
        PyModule_AddStringConstant(module, "FRAME_PLACEHOLDER", RT_FRAME_PLACEHOLDER) < 0 ||
        PyModule_AddIntConstant(module, "FUNCTION_CALLS_INLINED", RT_PY_INLINES_FUNCTION_CALLS) < 0 ||
        PyModule_AddType(module, st->aot.types.RuntimeWrapperType) < 0) {
        return -1;
    }
    if (rt_autograd_types_init(module, st) < 0 || rt_dynamo_types_init(module, st) < 0 ||
        rt_inductor_types_init(module, st) < 0) {
        return -1;
    }
    return rt_wrapper_types_init(module);
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
    RT_PY_MODULE_STANCE_SLOTS
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
