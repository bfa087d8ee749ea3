/* compile_wrapper_bind.c: what CompileWrapper reads, bound once
 * (_C._bind_compile_wrapper, after torch_aot_rt/_compile_wrapper.py checked
 * what it mirrors on this release), its GC support, and the counts of how
 * calls ran (_C._compile_wrapper_stats). The call itself is in
 * compile_wrapper.c. */
#include "dynamo/compile_wrapper.h"
#include "config/config_patch.h"
#include "dynamo/dynamo.h"
#include "fn_object.h" /* rt_counts_dict */
#include "util/intern_names.h"
#include "util/py_compat.h"

#include <string.h>

#define CW_OBJECTS(X)                                                          \
    X(code) X(call_on_enter_code) X(on_enter_code) X(patcher_code) X(globals)   \
    X(stance)                                                                  \
    X(guards_globals) X(compiler_globals) X(fx_globals)                        \
    X(is_fx_symbolic_tracing) X(is_jit_tracing) X(module_cls)                  \
    X(generation_tracker) X(get_depth) X(pop_depth) X(include_set)             \
    X(exclude_set) X(force_guard) X(save_keys) X(restore_keys) X(eager_nested) \
    X(fx_flag_tls) X(exc_compiler_error) X(exc_shorten) X(str_fullgraph)       \
    X(str_export) X(str_error_on_graph_break) X(str_isolate_id)                \
    X(str_enter_exit_hooks) X(str_tracing_context) X(str_tls)                  \
    X(str_exporting_flag) X(str_fx_flag) X(str_flag) X(str_tag_patch)          \
    X(str_generation) X(str_stance) X(str_default) X(str_backend)              \
    X(str_skip_guard) X(str_stance_global) X(str_nested_error_config)          \
    X(str_verbose) X(str_skip_reasons) X(str_depth) X(str_with_traceback)      \
    X(str_remove_dynamo_frames) X(str_get_eog) X(str_set_eog) X(fullgraph_warn)  \
    X(str_error) X(str_skip) X(trampoline) X(str_replace) X(str_consts)

int
rt_cw_traverse(rt_cw_state *cw, visitproc visit, void *arg)
{
#define VISIT(f) Py_VISIT(cw->f);
    CW_OBJECTS(VISIT)
#undef VISIT
    for (int g = 0; g < RT_CWG_N; g++) {
        Py_VISIT(cw->names[g]);
        Py_VISIT(cw->expected[g]);
    }
    for (int i = 0; i < RT_CW_FRAME_N; i++) {
        Py_VISIT(cw->frames[i]);
    }
    return rt_cw_fns_traverse(cw, visit, arg);
}

void
rt_cw_clear(rt_cw_state *cw)
{
    rt_cw_forget_all(cw);
#define CLEAR(f) Py_CLEAR(cw->f);
    CW_OBJECTS(CLEAR)
#undef CLEAR
    for (int g = 0; g < RT_CWG_N; g++) {
        Py_CLEAR(cw->names[g]);
        Py_CLEAR(cw->expected[g]);
    }
    for (int i = 0; i < RT_CW_FRAME_N; i++) {
        Py_CLEAR(cw->frames[i]);
    }
    cw->globals_verified = 0;
}

/* the eval_frame globals, by rt_cw_global */
static const char *const global_names[RT_CWG_N] = {
    [RT_CWG_SET_EVAL_FRAME] = "set_eval_frame",
    [RT_CWG_MAYBE_SET_EVAL_FRAME] = "_maybe_set_eval_frame",
    [RT_CWG_CALLBACK_FROM_STANCE] = "_callback_from_stance",
    [RT_CWG_SKIP_GUARD_STANCE] = "_is_skip_guard_eval_unsafe_stance",
    [RT_CWG_SET_SKIP_GUARD] = "set_skip_guard_eval_unsafe",
    [RT_CWG_SET_ISOLATE_ID] = "set_eval_frame_isolate_recompiles_id",
    [RT_CWG_SET_FG_NESTED] = "set_fullgraph_error_on_nested_compile",
    [RT_CWG_SET_FG_COUNT] = "set_fullgraph_compiled_frame_count",
    [RT_CWG_RESET_SKIP_REASONS] = "reset_skip_reasons",
    [RT_CWG_GET_SKIP_REASONS] = "get_skip_reasons",
    [RT_CWG_INSTALL_TAGGING] = "install_generation_tagging_init",
    [RT_CWG_TORCH] = "torch",
    [RT_CWG_CONFIG] = "config",
    [RT_CWG_DYNAMO_TLS] = "dynamo_tls",
    [RT_CWG_SET_EF_OVERRIDE] = "set_eval_frame_override",
    [RT_CWG_GET_EF_OVERRIDE] = "_get_eval_frame_override",
    [RT_CWG_EF_OVERRIDE] = "_EvalFrameOverride",
};

/* global g is read by a compile_wrapper of this fullgraph form, isolate */
static int
global_read(int g, rt_cw_fullgraph fullgraph, int isolate)
{
    switch (g) {
    case RT_CWG_SET_ISOLATE_ID:
        return isolate;
    case RT_CWG_RESET_SKIP_REASONS:
    case RT_CWG_GET_SKIP_REASONS:
    case RT_CWG_DYNAMO_TLS:
        return fullgraph == RT_CW_FG_RAISE;
    case RT_CWG_SET_FG_NESTED:
    case RT_CWG_SET_FG_COUNT:
        return fullgraph != RT_CW_FG_OVERRIDE;
    case RT_CWG_SET_EF_OVERRIDE:
    case RT_CWG_GET_EF_OVERRIDE:
    case RT_CWG_EF_OVERRIDE:
        return fullgraph == RT_CW_FG_OVERRIDE;
    default:
        return 1;
    }
}

PyObject *
rt_bind_compile_wrapper(PyObject *module, PyObject *args, PyObject *kwargs)
{
    static char *keywords[] = {
        "code", "cells", "call_on_enter_code", "on_enter_code", "patcher_code", "eval_frame",
        "stance_cls",
        "guards", "compiler", "fx", "is_jit_tracing", "module_cls", "generation_tracker",
        "get_depth",
        "pop_depth", "include_set", "exclude_set", "force_guard", "save_keys",
        "restore_keys", "eager_nested", "fx_flag_tls", "tag_patch_attr", "tag_patch_present",
        "compiler_errors", "shorten_traceback", "isolate_recompiles", "eog_where_differs",
        "patcher", "fullgraph", "fullgraph_warn", "frames", "trampoline", NULL};
    PyObject *code, *cells, *coe, *oe, *patcher, *eval_frame, *stance, *guards, *compiler, *fx;
    PyObject *jit;
    PyObject *module_cls, *tracker, *get_depth, *pop_depth, *include_set, *exclude_set;
    PyObject *force_guard, *save_keys, *restore_keys, *eager_nested, *fx_flag_tls, *errors;
    PyObject *shorten, *tag_patch, *fullgraph_warn, *frames, *trampoline;
    const char *patcher_name, *fullgraph_name;
    int tag_patch_present, isolate_recompiles, eog_where_differs;
    if (!PyArg_ParseTupleAndKeywords(
            args, kwargs, "$O!O!O!O!O!O!O!O!O!O!OO!OOOOOOOOOOUpO!OppssOO!O:_bind_compile_wrapper",
            keywords,
            &PyCode_Type, &code, &PyTuple_Type, &cells, &PyCode_Type, &coe, &PyCode_Type, &oe,
            &PyCode_Type, &patcher,
            &PyModule_Type, &eval_frame, &PyType_Type, &stance, &PyModule_Type, &guards,
            &PyModule_Type, &compiler, &PyModule_Type, &fx, &jit, &PyType_Type, &module_cls,
            &tracker, &get_depth, &pop_depth, &include_set, &exclude_set, &force_guard,
            &save_keys, &restore_keys, &eager_nested, &fx_flag_tls, &tag_patch,
            &tag_patch_present, &PyTuple_Type, &errors, &shorten, &isolate_recompiles,
            &eog_where_differs, &patcher_name, &fullgraph_name, &fullgraph_warn,
            &PyTuple_Type, &frames, &trampoline)) {
        return NULL;
    }
    static const char *const fullgraph_forms[] = {
        [RT_CW_FG_RAISE] = "raise", [RT_CW_FG_WARN] = "warn", [RT_CW_FG_OVERRIDE] = "override"};
    static const char *const patcher_forms[] = {
        [RT_PATCH_VAR_MARKED] = "var_marked", [RT_PATCH_VAR] = "var",
        [RT_PATCH_ATTRIBUTE] = "attribute"};
    int fg_form = -1, patcher_form = -1;
    for (int i = 0; i < 3; i++) {
        if (strcmp(fullgraph_name, fullgraph_forms[i]) == 0) {
            fg_form = i;
        }
        if (strcmp(patcher_name, patcher_forms[i]) == 0) {
            patcher_form = i;
        }
    }
    if (fg_form < 0 || patcher_form < 0 ||
        (fg_form == RT_CW_FG_WARN) != (fullgraph_warn != Py_None)) {
        PyErr_SetString(PyExc_ValueError,
                        "_bind_compile_wrapper: fullgraph 'raise', 'warn' (with fullgraph_warn) "
                        "or 'override'; patcher 'var_marked', 'var' or 'attribute'");
        return NULL;
    }
    int keys_cpp = save_keys != Py_None;
    int keys_guard = force_guard != Py_None;
    if (PyTuple_GET_SIZE(cells) != 5 || keys_cpp != (restore_keys != Py_None) ||
        keys_guard != (include_set != Py_None) || keys_guard != (exclude_set != Py_None) ||
        (keys_cpp && keys_guard) || (fullgraph_warn != Py_None && !PyCallable_Check(fullgraph_warn))) {
        PyErr_SetString(PyExc_ValueError,
                        "_bind_compile_wrapper: five cell indices; the dispatch keys saved "
                        "by save_keys/restore_keys, by include_set/exclude_set/force_guard, "
                        "or not at all; fullgraph_warn None or callable");
        return NULL;
    }
    if (PyTuple_GET_SIZE(frames) != RT_CW_FRAME_N ||
        (trampoline != Py_None && !PyCode_Check(trampoline)) ||
        RT_PY_INLINES_FUNCTION_CALLS != (trampoline != Py_None)) {
        PyErr_SetString(PyExc_ValueError,
                        "_bind_compile_wrapper: frames, one stub or None per exit; trampoline, "
                        "a code object where _C.FUNCTION_CALLS_INLINED (CPython 3.11), "
                        "else None");
        return NULL;
    }
    rt_state *st = PyModule_GetState(module);
    rt_cw_state *cw = &st->dynamo.cw;
    rt_cw_clear(cw);
    for (int i = 0; i < RT_CW_FRAME_N; i++) {
        PyObject *stub = PyTuple_GET_ITEM(frames, i);
        cw->frames[i] = stub != Py_None ? Py_NewRef(stub) : NULL;
    }
    cw->trampoline = trampoline != Py_None ? Py_NewRef(trampoline) : NULL;
    for (int i = 0; i < 5; i++) {
        cw->cell[i] = PyLong_AsSsize_t(PyTuple_GET_ITEM(cells, i));
        if (cw->cell[i] < 0) {
            if (!PyErr_Occurred()) {
                PyErr_SetString(PyExc_ValueError, "_bind_compile_wrapper: cell indices >= 0");
            }
            return NULL;
        }
    }
    PyObject *globals = PyModule_GetDict(eval_frame);
    for (int g = 0; g < RT_CWG_N; g++) {
        if (!global_read(g, (rt_cw_fullgraph)fg_form, isolate_recompiles)) {
            continue;
        }
        PyObject *name = PyUnicode_InternFromString(global_names[g]);
        if (name == NULL) {
            rt_cw_clear(cw);
            return NULL;
        }
        cw->names[g] = name;
        PyObject *v = PyDict_GetItemWithError(globals, name);
        if (v == NULL) {
            if (!PyErr_Occurred()) {
                PyErr_Format(PyExc_ValueError, "_bind_compile_wrapper: eval_frame has no '%U'", name);
            }
            rt_cw_clear(cw);
            return NULL;
        }
        cw->expected[g] = Py_NewRef(v);
    }
    static const rt_name_field names[] = {
        {offsetof(rt_cw_state, str_fullgraph), "fullgraph"},
        {offsetof(rt_cw_state, str_export), "export"},
        {offsetof(rt_cw_state, str_error_on_graph_break), "error_on_graph_break"},
        {offsetof(rt_cw_state, str_isolate_id), "_isolate_recompiles_id"},
        {offsetof(rt_cw_state, str_enter_exit_hooks), "enter_exit_hooks"},
        {offsetof(rt_cw_state, str_tracing_context), "tracing_context"},
        {offsetof(rt_cw_state, str_tls), "_TLS"},
        {offsetof(rt_cw_state, str_exporting_flag), "_is_exporting_flag"},
        {offsetof(rt_cw_state, str_fx_flag), "_is_fx_tracing_flag"},
        {offsetof(rt_cw_state, str_flag), "flag"},
        {offsetof(rt_cw_state, str_generation), "generation"},
        {offsetof(rt_cw_state, str_stance), "stance"},
        {offsetof(rt_cw_state, str_default), "default"},
        {offsetof(rt_cw_state, str_backend), "backend"},
        {offsetof(rt_cw_state, str_skip_guard), "skip_guard_eval_unsafe"},
        {offsetof(rt_cw_state, str_stance_global), "_stance"},
        {offsetof(rt_cw_state, str_nested_error_config),
         "error_on_dynamo_callback_in_fullgraph_compiled_code"},
        {offsetof(rt_cw_state, str_verbose), "verbose"},
        {offsetof(rt_cw_state, str_skip_reasons), "skip_reasons"},
        {offsetof(rt_cw_state, str_depth), "depth"},
        {offsetof(rt_cw_state, str_with_traceback), "with_traceback"},
        {offsetof(rt_cw_state, str_remove_dynamo_frames), "remove_dynamo_frames"},
        {offsetof(rt_cw_state, str_get_eog), "_get_error_on_graph_break"},
        {offsetof(rt_cw_state, str_set_eog), "_set_error_on_graph_break"},
        {offsetof(rt_cw_state, str_error), "ERROR"},
        {offsetof(rt_cw_state, str_skip), "SKIP"},
        {offsetof(rt_cw_state, str_replace), "replace"},
        {offsetof(rt_cw_state, str_consts), "co_consts"},
    };
    if (rt_intern_names(cw, names, sizeof(names) / sizeof(names[0])) < 0) {
        rt_cw_clear(cw);
        return NULL;
    }
    cw->call_on_enter_code = Py_NewRef(coe);
    cw->on_enter_code = Py_NewRef(oe);
    cw->patcher_code = Py_NewRef(patcher);
    cw->globals = Py_NewRef(globals);
    cw->stance = Py_NewRef(stance);
    cw->guards_globals = Py_NewRef(PyModule_GetDict(guards));
    cw->compiler_globals = Py_NewRef(PyModule_GetDict(compiler));
    cw->fx_globals = Py_NewRef(PyModule_GetDict(fx));
    cw->is_fx_symbolic_tracing = Py_XNewRef(
        PyDict_GetItemString(cw->fx_globals, "is_fx_symbolic_tracing"));
    if (cw->is_fx_symbolic_tracing == NULL) {
        PyErr_SetString(PyExc_ValueError,
                        "_bind_compile_wrapper: fx has no is_fx_symbolic_tracing");
        rt_cw_clear(cw);
        return NULL;
    }
    cw->is_jit_tracing = Py_NewRef(jit);
    cw->module_cls = Py_NewRef(module_cls);
    cw->generation_tracker = Py_NewRef(tracker);
    cw->get_depth = Py_NewRef(get_depth);
    cw->pop_depth = Py_NewRef(pop_depth);
    if (keys_cpp) {
        cw->save_keys = Py_NewRef(save_keys);
        cw->restore_keys = Py_NewRef(restore_keys);
    }
    else if (keys_guard) {
        cw->include_set = Py_NewRef(include_set);
        cw->exclude_set = Py_NewRef(exclude_set);
        cw->force_guard = Py_NewRef(force_guard);
    }
    cw->eager_nested = eager_nested == Py_None ? NULL : Py_NewRef(eager_nested);
    cw->fx_flag_tls = fx_flag_tls == Py_None ? NULL : Py_NewRef(fx_flag_tls);
    Py_INCREF(tag_patch);
    PyUnicode_InternInPlace(&tag_patch);
    cw->str_tag_patch = tag_patch;
    cw->tag_patch_present = tag_patch_present;
    cw->isolate_recompiles = isolate_recompiles;
    cw->eog_where_differs = eog_where_differs;
    cw->patcher_form = patcher_form;
    cw->fullgraph = (rt_cw_fullgraph)fg_form;
    cw->fullgraph_warn = fullgraph_warn == Py_None ? NULL : Py_NewRef(fullgraph_warn);
    cw->exc_compiler_error = Py_NewRef(errors);
    cw->exc_shorten = Py_NewRef(shorten);
    cw->code = Py_NewRef(code); /* last: it marks the state bound */
    Py_RETURN_NONE;
}

static const char *const count_names[RT_CW_N] = {
    [RT_CW_BUILT] = "built",
    [RT_CW_CALL_C] = "calls in C",
    [RT_CW_STATE] = "upstream calls: a stance, tracing, exporting or other hooks",
    [RT_CW_REPLACED] = "upstream calls: eval_frame helpers replaced",
    [RT_CW_MODULE_C] = "OptimizedModule calls in C",
    [RT_CW_MODULE_UPSTREAM] = "OptimizedModule upstream calls: compiled with the C runtime off, "
                              "a global module hook or a helper replaced",
};

PyObject *
rt_cw_stats(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    rt_cw_state *cw = &((rt_state *)PyModule_GetState(module))->dynamo.cw;
    return rt_counts_dict("_compile_wrapper_stats", args, nargs, count_names, cw->counts, RT_CW_N);
}
