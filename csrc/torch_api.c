/* torch_api.c: the one door to torch. See torch_api.h. */
#include "torch_api.h"

#include <string.h>

static const char *const TENSOR_METHOD_NAMES[RT_N_TENSOR_METHODS] = {
    [RT_DETACH] = "detach",
    [RT_COPY_] = "copy_",
    [RT_AS_STRIDED_] = "as_strided_",
    [RT_SET_] = "set_",
    [RT_SIZE] = "size",
    [RT_STRIDE] = "stride",
    [RT_STORAGE_OFFSET] = "storage_offset",
    [RT_IS_VIEW] = "_is_view",
    [RT_IS_CONTIGUOUS] = "is_contiguous",
    [RT_REQUIRES_GRAD_] = "requires_grad_",
    [RT_CONTIGUOUS] = "contiguous",
};

/* Upstream's messages, verbatim (runtime_wrappers.py). */
static const char SAVED_HOOKS_ERROR_MESSAGE[] =
    "Saved tensors hooks were specialized as GraphModules."
    "In this case aot_autograd inlines them in forward and backward graph "
    "and disables them during runtime of aot_autograd compiled region."
    "If you see this error, that means that there is some unexpected push or pop manipulation "
    "during aot_autograd compiled region runtime."
    "Compilation with different hooks must result in recompilation.";
static const char STREAM_ERROR_MESSAGE[] =
    "Mutations on inputs with user-specified streams are not yet supported. "
    "See: https://github.com/pytorch/pytorch/issues/172522";

#define INTERN(field, text)                                  \
    do {                                                     \
        if ((st->field = PyUnicode_InternFromString(text)) == NULL) \
            return -1;                                       \
    } while (0)

int
rt_state_init(rt_state *st)
{
    INTERN(str_alias, "alias");
    INTERN(str_dynamic_indices, "_dynamo_propagated_dynamic_indices");
    INTERN(str_is_first, "_is_first");
    INTERN(str_enter, "__enter__");
    INTERN(str_exit, "__exit__");
    INTERN(str_is_profiler_enabled, "_is_profiler_enabled");
    INTERN(str_dynamo_disable, "__dynamo_disable");
    INTERN(str_pregraph_range, "Pregraph bytecode");
    INTERN(str_record_runtime_overhead, "record_runtime_overhead");
    INTERN(str_requires_grad, "requires_grad");
    INTERN(wrapper_qualname, "_create_runtime_wrapper.<locals>.runtime_wrapper");
    INTERN(str_to_save, "to_save");
    INTERN(str_non_differentiable, "non_differentiable");
    INTERN(str_materialize_non_diff_grads, "_materialize_non_diff_grads");
    INTERN(str_tensors_no_vc_check, "_tensors_no_vc_check");
    INTERN(str_symints, "symints");
    INTERN(str_opaque_objects, "opaque_objects");
    INTERN(str_saved_tensors, "saved_tensors");
    INTERN(str_backward_state, "_compiled_autograd_backward_state");
    INTERN(str_shape, "shape");
    INTERN(str_dtype, "dtype");
    INTERN(str_device, "device");
    INTERN(str_layout, "layout");
    INTERN(str_boxed_call, "_boxed_call");
    INTERN(str_context, "context");
    INTERN(str_run, "run");
    INTERN(str_backward, "backward");
    INTERN(str_vjp, "vjp");
    INTERN(str_get_or_compile, "get_or_compile");
    INTERN(str_compiled_bw, "compiled_bw");
    INTERN(str_bw_donated_idxs, "bw_donated_idxs");
    INTERN(str_donated_buffer, "donated_buffer");
    INTERN(str_external_objects, "_external_objects");
    INTERN(str_copy, "copy");
    INTERN(str_debug_assert, "debug_assert");
    INTERN(str_compiled_fn, "compiled_fn");
    INTERN(str_tensor_unflatten, "__tensor_unflatten__");
    INTERN(str_clear, "clear");
    if ((st->kwnames_use_once = Py_BuildValue("(s)", "saved_tensors_use_once")) == NULL ||
        (st->kwnames_memory_format = Py_BuildValue("(s)", "memory_format")) == NULL ||
        (st->kwnames_empty_strided = Py_BuildValue("(ssssss)", "size", "stride", "dtype",
                                                   "device", "layout", "requires_grad")) == NULL ||
        (st->kwnames_steal_disable_amp = Py_BuildValue("(ss)", "steal_args", "disable_amp")) == NULL) {
        return -1;
    }
    for (int m = 0; m < RT_N_TENSOR_METHODS; m++) {
        INTERN(method_names[m], TENSOR_METHOD_NAMES[m]);
    }
    if ((st->args_true = PyTuple_Pack(1, Py_True)) == NULL ||
        (st->args_false = PyTuple_Pack(1, Py_False)) == NULL) {
        return -1;
    }
    st->stream_error_message = PyUnicode_FromString(STREAM_ERROR_MESSAGE);
    st->saved_hooks_error_message = PyUnicode_FromString(SAVED_HOOKS_ERROR_MESSAGE);
    st->prologue_range_name =
        PyUnicode_FromString("AOTDispatcher Runtime Wrapper Prologue");
    if (!st->stream_error_message || !st->saved_hooks_error_message ||
        !st->prologue_range_name) {
        return -1;
    }
    if (rt_alias_state_init(&st->alias) < 0) {
        return -1;
    }
    return rt_wrappers_state_init(&st->wrappers, st->str_dtype, st->str_device);
}
#undef INTERN

/* import_module(module), then the attribute path `name` ("a.b.c") on it,
 * or the module itself when name is NULL; NULL with the exception set. */
static PyObject *
lookup(const char *module, const char *name)
{
    PyObject *obj = PyImport_ImportModule(module);
    while (obj != NULL && name != NULL) {
        const char *dot = strchr(name, '.');
        PyObject *attr = dot ? PyUnicode_FromStringAndSize(name, dot - name)
                             : PyUnicode_FromString(name);
        Py_SETREF(obj, attr ? PyObject_GetAttr(obj, attr) : NULL);
        Py_XDECREF(attr);
        name = dot ? dot + 1 : NULL;
    }
    return obj;
}

#define BIND(field, module, name)                              \
    do {                                                       \
        Py_XSETREF(st->field, lookup(module, name));            \
        if (st->field == NULL)                                 \
            return -1;                                         \
    } while (0)

static int
bind_type(PyTypeObject **field, const char *module, const char *name)
{
    PyObject *obj = lookup(module, name);
    if (obj == NULL) {
        return -1;
    }
    if (!PyType_Check(obj)) {
        PyErr_Format(PyExc_TypeError, "%s.%s is not a type", module, name);
        Py_DECREF(obj);
        return -1;
    }
    Py_XSETREF(*field, (PyTypeObject *)obj);
    return 0;
}

/* The callables CompiledFunction's forward and backward use. */
static int
bind_autograd(rt_state *st, const rt_release_names *names)
{
    const char *RW = "torch._functorch._aot_autograd.runtime_wrappers";
    BIND(FunctionBase, "torch._C", "_FunctionBase");
    /* The classmethod itself, not `_FunctionBase.apply` (already bound). */
    {
        PyObject *d = PyObject_GetAttrString(st->FunctionBase, "__dict__");
        if (d == NULL) {
            return -1;
        }
        Py_XSETREF(st->function_base_apply, PyMapping_GetItemString(d, "apply"));
        Py_DECREF(d);
        if (st->function_base_apply == NULL) {
            return -1;
        }
    }
    BIND(maybe_clear_saved_tensors, "torch._C", "_FunctionBase.maybe_clear_saved_tensors");
    BIND(functorch_transforms_active, "torch._C", "_are_functorch_transforms_active");
    BIND(unwrap_if_dead, "torch._C._functorch", "unwrap_if_dead");
    BIND(peek_interpreter_stack, "torch._C._functorch", "peek_interpreter_stack");
    BIND(deterministic_enabled, "torch._C", "_get_deterministic_algorithms");
    BIND(is_key_in_tls, "torch._C", "_is_key_in_tls");
    BIND(get_obj_in_tls, "torch._C", "_get_obj_in_tls");
    BIND(keep_graph, "torch._C._autograd", "_get_current_graph_task_keep_graph");
    BIND(BackwardState, RW, "BackwardState");
    BIND(SymInt, "torch", "SymInt");
    BIND(SymFloat, "torch", "SymFloat");
    /* torch.ops.aten is an attribute namespace, not an importable module */
    BIND(unsafe_view, "torch", "ops.aten._unsafe_view");
    BIND(partial, "functools", "partial");
    BIND(functorch_config, "torch._functorch.config", NULL);
    BIND(process_runtime_tangent, RW, "AOTDispatchAutograd.process_runtime_tangent");
    BIND(empty_strided, "torch", "empty_strided");
    BIND(call_func_at_runtime, RW, "call_func_at_runtime_with_args");
    /* Required on every verified release: a missing name is a torch we
     * were not verified against, never "no opaque objects". */
    BIND(is_opaque_type, RW, names->opaque_type_check);
    if (names->opaque_base != NULL) {
        BIND(OpaqueBase, RW, names->opaque_base);
    }
    else {
        Py_CLEAR(st->OpaqueBase); /* 2.11: is_opaque_type(type(obj)) alone */
    }
    BIND(weakref_ref, "weakref", "ref");
    BIND(top_saved_hooks, "torch._C._autograd", "_top_saved_tensors_default_hooks");
    BIND(GraphModule, "torch.fx", "GraphModule");
    Py_CLEAR(st->external_objects);
    Py_CLEAR(st->set_external_object);
    st->external_objects_is_list = false;
    if (names->external_objects != NULL) {
        /* The object runtime_wrappers imported, bound once: runtime_wrappers
         * never rebinds it (in 2.15 Dynamo rebinds only its own module's). */
        const char *type = names->external_objects_type;
        bool is_list = type != NULL && strcmp(type, "list") == 0;
        if (!is_list && (type == NULL || strcmp(type, "dict") != 0)) {
            PyErr_SetString(PyExc_ValueError,
                            "_bind_torch: external_objects_type must be 'dict' or 'list'");
            return -1;
        }
        BIND(external_objects, RW, names->external_objects);
        if (is_list ? !PyList_CheckExact(st->external_objects)
                    : !PyDict_CheckExact(st->external_objects)) {
            PyErr_Format(PyExc_TypeError, "%s.%s is not a %s", RW, names->external_objects,
                         type);
            Py_CLEAR(st->external_objects);
            return -1;
        }
        st->external_objects_is_list = is_list;
    }
    if (names->external_objects_setter != NULL) {
        BIND(set_external_object, RW, names->external_objects_setter);
    }
    return 0;
}

/* If `fn` is a builtin taking (self, args, kwargs), its C entry point and
 * self (borrowed from fn, which the state keeps alive). */
static void
direct_setter(PyObject *fn, PyCFunctionWithKeywords *c, PyObject **self)
{
    *c = NULL;
    *self = NULL;
    if (PyCFunction_Check(fn) &&
        (PyCFunction_GET_FLAGS(fn) & ~METH_COEXIST) == (METH_VARARGS | METH_KEYWORDS)) {
        *c = (PyCFunctionWithKeywords)(void (*)(void))PyCFunction_GET_FUNCTION(fn);
        *self = PyCFunction_GET_SELF(fn);
    }
}

/* The C++ part's table, checked: a capsule of our name and API version,
 * built for a torch whose ctx has input_grad_buffers exactly when the
 * release says so (its node's grad_fn answers it then). */
static int
bind_cpp(rt_state *st, PyObject *capsule, int input_grad_buffers)
{
    Py_CLEAR(st->cpp_capsule);
    st->cpp = st->cpp_loaded = NULL;
    if (capsule == Py_None) {
        return 0;
    }
    const rt_cpp_api *api = PyCapsule_GetPointer(capsule, RT_CPP_CAPSULE_NAME);
    if (api == NULL) {
        return -1;
    }
    if (api->api_version != RT_CPP_API_VERSION) {
        PyErr_Format(PyExc_ValueError, "C++ part has API version %d, the C core %d",
                     api->api_version, RT_CPP_API_VERSION);
        return -1;
    }
    if (!api->node_input_grad_buffers != !input_grad_buffers) {
        PyErr_Format(PyExc_ValueError,
                     "C++ part built %s ctx.input_grad_buffers, for a release %s it",
                     api->node_input_grad_buffers ? "with" : "without",
                     input_grad_buffers ? "with" : "without");
        return -1;
    }
    st->cpp_capsule = Py_NewRef(capsule);
    st->cpp = st->cpp_loaded = api;
    return 0;
}

int
rt_torch_bind(rt_state *st, const rt_release_names *names, PyObject *cpp_capsule)
{
    if (st->bound) {
        return 0;
    }
    BIND(is_grad_enabled, "torch._C", "is_grad_enabled");
    BIND(set_grad_enabled, "torch._C", "_set_grad_enabled");
    BIND(is_view_replay_enabled, "torch._C", "_is_view_replay_enabled");
    BIND(set_view_replay_enabled, "torch._C", "_set_view_replay_enabled");
    direct_setter(st->set_grad_enabled, &st->set_grad_enabled_c, &st->set_grad_enabled_self);
    direct_setter(st->set_view_replay_enabled, &st->set_view_replay_enabled_c,
                  &st->set_view_replay_enabled_self);
    BIND(DisableAutocast, "torch._C", "_DisableAutocast");
    Py_XSETREF(st->DisableAutocast_enter,
               PyObject_GetAttr(st->DisableAutocast, st->str_enter));
    Py_XSETREF(st->DisableAutocast_exit,
               PyObject_GetAttr(st->DisableAutocast, st->str_exit));
    if (!st->DisableAutocast_enter || !st->DisableAutocast_exit) {
        return -1;
    }
    if (bind_type(&st->Tensor, "torch", "Tensor") < 0 ||
        bind_type(&st->Parameter, "torch.nn", "Parameter") < 0) {
        return -1;
    }
    for (int m = 0; m < RT_N_TENSOR_METHODS; m++) {
        Py_XSETREF(st->tensor_methods[m],
                   PyObject_GetAttr((PyObject *)st->Tensor, st->method_names[m]));
        Py_XSETREF(st->parameter_methods[m],
                   PyObject_GetAttr((PyObject *)st->Parameter, st->method_names[m]));
        if (!st->tensor_methods[m] || !st->parameter_methods[m]) {
            return -1;
        }
    }
    /* nn.Parameter overrides none of the epilogue's methods (the same
     * descriptors as torch.Tensor's), and its __torch_function__ is the
     * disabled one the bindings ignore: the C++ part may stand in for its
     * methods as for torch.Tensor's. */
    st->parameter_plain = 1;
    for (int m = 0; m < RT_N_TENSOR_METHODS; m++) {
        st->parameter_plain &= st->parameter_methods[m] == st->tensor_methods[m];
    }
    Py_XSETREF(st->requires_grad_descr,
               PyObject_GetAttr((PyObject *)st->Tensor, st->str_requires_grad));
    if (st->requires_grad_descr == NULL) {
        return -1;
    }
    if (Py_TYPE(st->requires_grad_descr)->tp_descr_get == NULL) {
        PyErr_SetString(PyExc_TypeError, "torch.Tensor.requires_grad is not a descriptor");
        return -1;
    }
    BIND(increment_version, "torch._C", "_increment_version");
    BIND(TensorAlias, "torch._functorch._aot_autograd.schemas", "TensorAlias");
    if (rt_alias_state_bind(&st->alias) < 0) {
        return -1;
    }
    BIND(apply_view_meta_sequence, "torch._C._functionalization", "apply_view_meta_sequence");
    {
        PyObject *profiler = lookup("torch.autograd.profiler", NULL);
        if (profiler == NULL) {
            return -1;
        }
        /* Upstream reads the module global `_is_profiler_enabled` on every
         * call; we read the same dict entry, with an interned key. */
        PyObject *globals = PyModule_GetDict(profiler); /* borrowed */
        Py_XSETREF(st->profiler_globals, Py_XNewRef(globals));
        Py_DECREF(profiler);
        if (st->profiler_globals == NULL) {
            return -1;
        }
    }
    BIND(dynamo_config, "torch._dynamo.config", NULL);
    BIND(RecordFunctionFast, "torch._C._profiler", "_RecordFunctionFast");
    BIND(saved_hooks_get_disabled_message, "torch._C._autograd",
         "_saved_tensors_hooks_get_disabled_error_message");
    BIND(saved_hooks_disable, "torch._C._autograd", "_saved_tensors_hooks_disable");
    BIND(saved_hooks_enable, "torch._C._autograd", "_saved_tensors_hooks_enable");
    if (bind_autograd(st, names) < 0 ||
        bind_cpp(st, cpp_capsule, names->input_grad_buffers) < 0) { /* last: the table is in use only once bound */
        return -1;
    }
    st->bound = 1;
    return 0;
}
#undef BIND

#define STATE_FIELDS(X)                                                   \
    X(RuntimeWrapperType) X(cpp_capsule) X(is_grad_enabled) X(set_grad_enabled) X(args_true) X(args_false)          \
    X(is_view_replay_enabled) X(set_view_replay_enabled) X(DisableAutocast) \
    X(DisableAutocast_enter) X(DisableAutocast_exit) X(Tensor) X(Parameter) \
    X(requires_grad_descr) X(increment_version) X(TensorAlias)            \
    X(apply_view_meta_sequence) X(profiler_globals) X(dynamo_config)           \
    X(RecordFunctionFast) X(prologue_range_name)                          \
    X(saved_hooks_get_disabled_message) X(saved_hooks_disable)            \
    X(saved_hooks_enable) X(saved_hooks_error_message) X(str_alias)       \
    X(str_dynamic_indices) X(str_is_first) X(str_enter) X(str_exit)       \
    X(str_is_profiler_enabled) X(str_record_runtime_overhead)             \
    X(str_requires_grad) X(stream_error_message)  \
    X(wrapper_qualname) X(FunctionApplyType) X(CompiledForwardType)            \
    X(CompiledBackwardType) X(BackwardThunkType) X(ApplyBoxedType) X(FunctionBase)          \
    X(function_base_apply) X(maybe_clear_saved_tensors)                   \
    X(functorch_transforms_active) X(unwrap_if_dead)                      \
    X(peek_interpreter_stack) X(deterministic_enabled) X(is_key_in_tls)   \
    X(get_obj_in_tls) X(keep_graph) X(BackwardState) X(SymInt) X(SymFloat) \
    X(unsafe_view) X(partial) X(functorch_config)                         \
    X(process_runtime_tangent) X(empty_strided)                    \
    X(call_func_at_runtime) X(is_opaque_type) X(OpaqueBase) X(external_objects) X(set_external_object) X(weakref_ref) \
    X(SavedHooksGuardType) X(SerializableCallType) X(ParamsPrependType) X(DisabledCallType) X(top_saved_hooks) X(GraphModule) \
    X(str_external_objects) X(str_copy) X(str_debug_assert) X(str_compiled_fn) X(str_to_save) \
    X(str_non_differentiable) X(str_materialize_non_diff_grads)           \
    X(str_tensors_no_vc_check) X(str_symints) X(str_opaque_objects)       \
    X(str_saved_tensors) X(str_backward_state) X(str_shape) X(str_dtype) X(str_device) X(str_layout)               \
    X(str_boxed_call) X(str_context) X(str_run) X(str_backward) X(str_vjp) X(str_get_or_compile)     \
    X(str_compiled_bw) X(str_bw_donated_idxs) X(str_donated_buffer)       \
    X(kwnames_use_once) X(kwnames_memory_format) X(kwnames_empty_strided)                          \
    X(kwnames_steal_disable_amp)                                          \
    X(SubclassWrapperType) X(str_tensor_unflatten) X(str_clear)                 \
    X(BytecodeHelperType) X(NullContextType) X(null_context) X(str_dynamo_disable) \
    X(str_pregraph_range) X(GraphCallType) X(graph_call_graphs) X(graph_call_last) X(CompileWrapperType) X(ModuleCallType)

int
rt_state_traverse(rt_state *st, visitproc visit, void *arg)
{
#define VISIT(f) Py_VISIT(st->f);
    STATE_FIELDS(VISIT)
#undef VISIT
    for (int m = 0; m < RT_N_TENSOR_METHODS; m++) {
        Py_VISIT(st->tensor_methods[m]);
        Py_VISIT(st->parameter_methods[m]);
        Py_VISIT(st->method_names[m]);
    }
    return 0;
}

void
rt_state_clear(rt_state *st)
{
#define CLEAR(f) Py_CLEAR(st->f);
    STATE_FIELDS(CLEAR)
#undef CLEAR
    for (int m = 0; m < RT_N_TENSOR_METHODS; m++) {
        Py_CLEAR(st->tensor_methods[m]);
        Py_CLEAR(st->parameter_methods[m]);
        Py_CLEAR(st->method_names[m]);
    }
    st->cpp = st->cpp_loaded = NULL; /* its capsule was cleared above */
    st->bound = 0;
}

/* ---- grad mode and view replay ------------------------------------- */

int
rt_call_predicate(PyObject *fn)
{
    PyObject *r = PyObject_CallNoArgs(fn);
    if (r == NULL) {
        return -1;
    }
    int v = PyObject_IsTrue(r);
    Py_DECREF(r);
    return v;
}

static int
call_with_bool(PyObject *fn, int value)
{
    PyObject *arg = value ? Py_True : Py_False;
    PyObject *r = PyObject_Vectorcall(fn, &arg, 1, NULL);
    if (r == NULL) {
        return -1;
    }
    Py_DECREF(r);
    return 0;
}

/* torch._C.is_grad_enabled() */
int
rt_grad_enabled(rt_state *st)
{
    if (st->cpp != NULL) {
        return st->cpp->grad_enabled();
    }
    return rt_call_predicate(st->is_grad_enabled);
}

/* fn(value) through its C entry point when we have it (see torch_api.h). */
static int
call_setter(rt_state *st, PyObject *fn, PyCFunctionWithKeywords c, PyObject *self, int value)
{
    if (c == NULL) {
        return call_with_bool(fn, value);
    }
    PyObject *r = c(self, value ? st->args_true : st->args_false, NULL);
    /* what CPython's call path checks after a builtin returns */
    if (r == NULL) {
        if (!PyErr_Occurred()) {
            PyErr_SetString(PyExc_SystemError, "grad-mode setter failed without an exception");
        }
        return -1;
    }
    if (PyErr_Occurred()) {
        Py_DECREF(r);
        return -1;
    }
    Py_DECREF(r);
    return 0;
}

/* torch._C._set_grad_enabled(enabled): with the C++ part and no torch
 * function mode to hand the call to, the TLS write it ends in. */
int
rt_set_grad_enabled(rt_state *st, int enabled)
{
    if (st->cpp != NULL && !st->cpp->torch_function_mode_enabled()) {
        st->cpp->set_grad_enabled(enabled);
        return 0;
    }
    return call_setter(st, st->set_grad_enabled, st->set_grad_enabled_c,
                       st->set_grad_enabled_self, enabled);
}

/* ---- autograd and functorch state ------------------------------------- */

int
rt_functorch_transforms_active(rt_state *st)
{
    if (st->cpp != NULL) {
        return st->cpp->functorch_transforms_active();
    }
    return rt_call_predicate(st->functorch_transforms_active);
}

/* Python only: the dynamic layer stack's C++ header needs one torch does not
 * ship (nlohmann/json) */
int
rt_functorch_interpreter_active(rt_state *st)
{
    PyObject *top = PyObject_CallNoArgs(st->peek_interpreter_stack);
    if (top == NULL) {
        return -1;
    }
    int active = top != Py_None;
    Py_DECREF(top);
    return active;
}

int
rt_graph_task_keep_graph(rt_state *st)
{
    if (st->cpp != NULL) {
        return st->cpp->graph_task_keep_graph();
    }
    return rt_call_predicate(st->keep_graph);
}

int
rt_tls_object(rt_state *st, PyObject *key, PyObject **out)
{
    *out = NULL;
    if (st->cpp != NULL) {
        *out = st->cpp->tls_object(key);
        return 0;
    }
    PyObject *r = PyObject_Vectorcall(st->is_key_in_tls, &key, 1, NULL);
    int has_key = r ? PyObject_IsTrue(r) : -1;
    Py_XDECREF(r);
    if (has_key <= 0) {
        return has_key;
    }
    *out = PyObject_Vectorcall(st->get_obj_in_tls, &key, 1, NULL);
    return *out == NULL ? -1 : 0;
}

/* torch._C._is_view_replay_enabled() */
int
rt_view_replay_enabled(rt_state *st)
{
    if (st->cpp != NULL) {
        return st->cpp->view_replay_enabled();
    }
    return rt_call_predicate(st->is_view_replay_enabled);
}

/* torch._C._set_view_replay_enabled(enabled), as rt_set_grad_enabled */
int
rt_set_view_replay_enabled(rt_state *st, int enabled)
{
    if (st->cpp != NULL && !st->cpp->torch_function_mode_enabled()) {
        st->cpp->set_view_replay_enabled(enabled);
        return 0;
    }
    return call_setter(st, st->set_view_replay_enabled, st->set_view_replay_enabled_c,
                       st->set_view_replay_enabled_self, enabled);
}

/* ---- context managers ------------------------------------------------ */

/* cm.__exit__ (looked up with `method` if given) called with the pending
 * exception as (type, value, tb), or (None, None, None). A truthy result does
 * not swallow the exception: no guard upstream enters does that. */
static int
call_exit(PyObject *exit_fn, PyObject *self, int failed)
{
    rt_pending_error saved = {NULL, NULL, NULL};
    PyObject *r;
    if (failed) {
        PyErr_Fetch(&saved.type, &saved.value, &saved.tb);
        PyErr_NormalizeException(&saved.type, &saved.value, &saved.tb);
        if (saved.tb != NULL && saved.value != NULL) {
            PyException_SetTraceback(saved.value, saved.tb);
        }
        PyObject *argv[4] = {self, saved.type ? saved.type : Py_None,
                             saved.value ? saved.value : Py_None,
                             saved.tb ? saved.tb : Py_None};
        r = self ? PyObject_Vectorcall(exit_fn, argv, 4, NULL)
                 : PyObject_Vectorcall(exit_fn, argv + 1, 3, NULL);
    }
    else {
        PyObject *argv[4] = {self, Py_None, Py_None, Py_None};
        r = self ? PyObject_Vectorcall(exit_fn, argv, 4, NULL)
                 : PyObject_Vectorcall(exit_fn, argv + 1, 3, NULL);
    }
    int ok = r != NULL;
    Py_XDECREF(r);
    if (!failed) {
        return ok ? 0 : -1;
    }
    return rt_finally_end(&saved, ok);
}

PyObject *
rt_disable_autocast_enter(rt_state *st)
{
    PyObject *guard = PyObject_CallNoArgs(st->DisableAutocast);
    if (guard == NULL) {
        return NULL;
    }
    PyObject *r = PyObject_Vectorcall(st->DisableAutocast_enter, &guard, 1, NULL);
    if (r == NULL) {
        Py_DECREF(guard);
        return NULL;
    }
    Py_DECREF(r);
    return guard;
}

int
rt_disable_autocast_exit(rt_state *st, PyObject *guard, int failed)
{
    int rc = call_exit(st->DisableAutocast_exit, guard, failed);
    Py_DECREF(guard);
    return rc;
}

int
rt_context_enter(rt_state *st, PyObject *cm)
{
    PyObject *r = PyObject_CallMethodNoArgs(cm, st->str_enter);
    if (r == NULL) {
        return -1;
    }
    Py_DECREF(r);
    return 0;
}

int
rt_context_exit(rt_state *st, PyObject *cm, int failed)
{
    rt_pending_error saved = {NULL, NULL, NULL};
    if (failed) {
        PyErr_Fetch(&saved.type, &saved.value, &saved.tb);
    }
    PyObject *exit_fn = PyObject_GetAttr(cm, st->str_exit);
    if (failed) {
        PyErr_Restore(saved.type, saved.value, saved.tb);
    }
    if (exit_fn == NULL) {
        return -1;
    }
    int rc = call_exit(exit_fn, NULL, failed);
    Py_DECREF(exit_fn);
    return rc;
}

/* ---- compile_wrapper's dispatch keys and jit tracing ------------------- */

int
rt_dispatch_keys_read(rt_state *st, PyObject *include_set, PyObject *exclude_set,
                      rt_dispatch_keys *k)
{
    k->cpp = st->cpp;
    k->include = k->exclude = k->guard = NULL;
    if (k->cpp != NULL) {
        k->cpp->dispatch_tls_get(k->keys);
        return 0;
    }
    k->include = PyObject_CallNoArgs(include_set);
    k->exclude = k->include != NULL ? PyObject_CallNoArgs(exclude_set) : NULL;
    return k->exclude != NULL ? 0 : -1;
}

int
rt_dispatch_keys_enter(rt_state *st, PyObject *force_guard, rt_dispatch_keys *k)
{
    if (k->cpp != NULL) {
        return 0; /* forcing the sets read above changes nothing */
    }
    PyObject *args[2] = {k->include, k->exclude};
    k->guard = PyObject_Vectorcall(force_guard, args, 2, NULL);
    if (k->guard == NULL) {
        return -1;
    }
    if (rt_context_enter(st, k->guard) < 0) {
        Py_CLEAR(k->guard);
        return -1;
    }
    return 0;
}

int
rt_dispatch_keys_exit(rt_state *st, rt_dispatch_keys *k, int failed)
{
    if (k->cpp != NULL) {
        k->cpp->dispatch_tls_force(k->keys);
        return 0;
    }
    return rt_context_exit(st, k->guard, failed);
}

void
rt_dispatch_keys_clear(rt_dispatch_keys *k)
{
    Py_CLEAR(k->include);
    Py_CLEAR(k->exclude);
    Py_CLEAR(k->guard);
}

int
rt_jit_tracing(rt_state *st, PyObject *is_tracing)
{
    if (st->cpp != NULL) {
        return st->cpp->jit_tracing();
    }
    PyObject *r = PyObject_CallNoArgs(is_tracing);
    if (r == NULL) {
        return -1;
    }
    int tracing = r != Py_False; /* the binding returns a bool */
    Py_DECREF(r);
    return tracing;
}

void
rt_finally_begin(rt_pending_error *saved)
{
    PyErr_Fetch(&saved->type, &saved->value, &saved->tb);
}

int
rt_finally_end(rt_pending_error *saved, int cleanup_ok)
{
    if (saved->type == NULL) {
        return cleanup_ok ? 0 : -1;
    }
    if (cleanup_ok) {
        PyErr_Restore(saved->type, saved->value, saved->tb);
        return -1;
    }
    /* The cleanup raised: its exception wins, with ours as __context__. */
    PyErr_NormalizeException(&saved->type, &saved->value, &saved->tb);
    if (saved->tb != NULL) {
        PyException_SetTraceback(saved->value, saved->tb);
    }
    PyObject *type, *value, *tb;
    PyErr_Fetch(&type, &value, &tb);
    PyErr_NormalizeException(&type, &value, &tb);
    PyException_SetContext(value, saved->value); /* steals */
    Py_DECREF(saved->type);
    Py_XDECREF(saved->tb);
    PyErr_Restore(type, value, tb);
    return -1;
}

/* ---- calling compiled functions ---------------------------------------- */

/* list(x) normalisation of a compiled function's result
 * (_codegen_normalize_as_list / normalize_as_list). Steals `out`. */
PyObject *
rt_as_list(PyObject *out)
{
    if (out == NULL || PyList_Check(out)) {
        return out;
    }
    if (PyTuple_Check(out)) {
        Py_SETREF(out, PySequence_List(out));
        return out;
    }
    PyObject *list = PyList_New(1);
    if (list == NULL) {
        Py_DECREF(out);
        return NULL;
    }
    PyList_SET_ITEM(list, 0, out);
    return list;
}

/* [with _DisableAutocast():] fn(list) -> list */
PyObject *
rt_call_boxed(rt_state *st, PyObject *fn, PyObject *list, bool disable_amp)
{
    PyObject *guard = NULL;
    if (disable_amp && (guard = rt_disable_autocast_enter(st)) == NULL) {
        return NULL;
    }
    PyObject *out = rt_as_list(PyObject_Vectorcall(fn, &list, 1, NULL));
    if (guard != NULL && rt_disable_autocast_exit(st, guard, out == NULL) < 0) {
        Py_CLEAR(out);
    }
    return out;
}

/* ---- tensors ---------------------------------------------------------- */

int
rt_is_tensor(rt_state *st, PyObject *obj)
{
    if (Py_IS_TYPE(obj, st->Tensor) || Py_IS_TYPE(obj, st->Parameter)) {
        return 1;
    }
    return PyObject_IsInstance(obj, (PyObject *)st->Tensor);
}

PyObject *
rt_tensor_call(rt_state *st, enum rt_tensor_method m, PyObject *self,
               PyObject *const *args, Py_ssize_t nargs)
{
    PyObject *stack[4];
    assert(nargs <= 3);
    stack[0] = self;
    for (Py_ssize_t i = 0; i < nargs; i++) {
        stack[i + 1] = args[i];
    }
    /* Exact torch.Tensor / Parameter: the method found on the class once.
     * Anything else (a subclass may override the method in Python): an
     * ordinary method call, as upstream's Python does. */
    if (Py_IS_TYPE(self, st->Tensor)) {
        return PyObject_Vectorcall(st->tensor_methods[m], stack, nargs + 1, NULL);
    }
    if (Py_IS_TYPE(self, st->Parameter)) {
        return PyObject_Vectorcall(st->parameter_methods[m], stack, nargs + 1, NULL);
    }
    return PyObject_VectorcallMethod(st->method_names[m], stack,
                                     (size_t)(nargs + 1), NULL);
}

/* ---- ctx attributes ----------------------------------------------------- */

static PyObject *
ctx_field_name(rt_state *st, enum rt_ctx_field field)
{
    switch (field) {
    case RT_CTX_TO_SAVE:
        return st->str_to_save;
    case RT_CTX_NON_DIFFERENTIABLE:
        return st->str_non_differentiable;
    case RT_CTX_MATERIALIZE_NON_DIFF_GRADS:
        return st->str_materialize_non_diff_grads;
    case RT_CTX_TENSORS_NO_VC_CHECK:
        return st->str_tensors_no_vc_check;
    case RT_CTX_SYMINTS:
        return st->str_symints;
    case RT_CTX_OPAQUE_OBJECTS:
        return st->str_opaque_objects;
    case RT_CTX_EXTERNAL_OBJECTS:
        return st->str_external_objects;
    case RT_CTX_SAVED_TENSORS:
    default:
        return st->str_saved_tensors;
    }
}

/* cpp_loaded, not cpp: nodes made before the routes were switched off are
 * still nodes. */
int
rt_is_cpp_node(rt_state *st, PyObject *ctx)
{
    return st->cpp_loaded != NULL && st->cpp_loaded->node_check(ctx);
}

/* The node type is a static type: its getsets cannot be replaced, so the
 * direct call is what the attribute look-up ends in. */
PyObject *
rt_ctx_get(rt_state *st, PyObject *ctx, enum rt_ctx_field field)
{
    if (rt_is_cpp_node(st, ctx)) {
        return st->cpp_loaded->node_get(ctx, (int)field);
    }
    return PyObject_GetAttr(ctx, ctx_field_name(st, field));
}

int
rt_ctx_set(rt_state *st, PyObject *ctx, enum rt_ctx_field field, PyObject *value)
{
    if (rt_is_cpp_node(st, ctx)) {
        return st->cpp_loaded->node_set(ctx, (int)field, value);
    }
    return PyObject_SetAttr(ctx, ctx_field_name(st, field), value);
}

int
rt_ctx_set_steal(rt_state *st, PyObject *ctx, enum rt_ctx_field field, PyObject *value)
{
    int rc = value ? rt_ctx_set(st, ctx, field, value) : -1;
    Py_XDECREF(value);
    return rc;
}

/* Where the C++ part may answer for a tensor method: an exact torch.Tensor
 * and no TorchFunctionMode to hand the call to. It returns -1 for tensors
 * it cannot answer for; then the method is called. */
static int
cpp_tensor_query_ok(rt_state *st, PyObject *x)
{
    return st->cpp != NULL && Py_IS_TYPE(x, st->Tensor) &&
           !st->cpp->torch_function_mode_enabled();
}

int
rt_tensor_is_view(rt_state *st, PyObject *x)
{
    if (cpp_tensor_query_ok(st, x)) {
        int v = st->cpp->tensor_is_view(x);
        if (v >= 0) {
            return v;
        }
    }
    PyObject *r = rt_tensor_call(st, RT_IS_VIEW, x, NULL, 0);
    int v = r ? PyObject_IsTrue(r) : -1;
    Py_XDECREF(r);
    return v;
}

int
rt_tensor_size_stride_equal(rt_state *st, PyObject *x, Py_ssize_t ndim,
                            const int64_t *sizes, const int64_t *strides,
                            PyObject *size_obj, PyObject *stride_obj)
{
    if (ndim >= 0 && cpp_tensor_query_ok(st, x)) {
        int v = st->cpp->tensor_size_stride_equal(x, ndim, sizes, strides);
        if (v >= 0) {
            return v;
        }
    }
    PyObject *shape = rt_tensor_call(st, RT_SIZE, x, NULL, 0);
    int same = shape ? PyObject_RichCompareBool(shape, size_obj, Py_EQ) : -1;
    Py_XDECREF(shape);
    if (same > 0) {
        PyObject *stride = rt_tensor_call(st, RT_STRIDE, x, NULL, 0);
        same = stride ? PyObject_RichCompareBool(stride, stride_obj, Py_EQ) : -1;
        Py_XDECREF(stride);
    }
    return same;
}

int
rt_tensor_requires_grad(rt_state *st, PyObject *self)
{
    PyObject *r;
    if (Py_IS_TYPE(self, st->Tensor) || Py_IS_TYPE(self, st->Parameter)) {
        r = Py_TYPE(st->requires_grad_descr)->tp_descr_get(
            st->requires_grad_descr, self, (PyObject *)Py_TYPE(self));
    }
    else {
        r = PyObject_GetAttr(self, st->str_requires_grad);
    }
    if (r == NULL) {
        return -1;
    }
    int v = PyObject_IsTrue(r);
    Py_DECREF(r);
    return v;
}

/* ---- the epilogue's tensor operations ----------------------------------- */

/* x's methods are torch.Tensor's and no __torch_function__ override of
 * x's would take the call (what the C++ part may stand in for) */
static int
plain_tensor_type(rt_state *st, PyObject *x)
{
    return Py_IS_TYPE(x, st->Tensor) || (st->parameter_plain && Py_IS_TYPE(x, st->Parameter));
}

/* The C++ part may run the method of a and b (torch_cpp_api.h epi_*):
 * plain tensor types and no TorchFunctionMode to hand the call to. */
int
rt_cpp_tensor_op_ok(rt_state *st, PyObject *a, PyObject *b)
{
    if (st->cpp == NULL) {
        return 0;
    }
    if (plain_tensor_type(st, a) && plain_tensor_type(st, b) &&
        !st->cpp->torch_function_mode_enabled()) {
        return 1;
    }
    st->epi_counts[RT_EPI_NOT_OFFERED]++;
    return 0;
}

/* An epi_* result, counted: whether the C++ part answered (else the caller
 * takes the Python route). */
int
rt_cpp_answered(rt_state *st, int rc)
{
    if (rc == RT_CPP_DECLINED) {
        st->epi_counts[RT_EPI_DECLINED]++;
        return 0;
    }
    st->epi_counts[RT_EPI_TAKEN]++;
    return 1;
}

static int
call_discard(rt_state *st, enum rt_tensor_method m, PyObject *self, PyObject *arg)
{
    PyObject *r = rt_tensor_call(st, m, self, &arg, 1);
    if (r == NULL) {
        return -1;
    }
    Py_DECREF(r);
    return 0;
}

int
rt_tensor_copy_(rt_state *st, PyObject *orig, PyObject *src, int detach)
{
    if (rt_cpp_tensor_op_ok(st, orig, src)) {
        int rc = st->cpp->epi_copy_(orig, src, detach);
        if (rt_cpp_answered(st, rc)) {
            return rc;
        }
    }
    if (!detach) {
        return call_discard(st, RT_COPY_, orig, src);
    }
    PyObject *detached = rt_tensor_call(st, RT_DETACH, orig, NULL, 0);
    if (detached == NULL) {
        return -1;
    }
    int rc = call_discard(st, RT_COPY_, detached, src);
    Py_DECREF(detached);
    return rc;
}

int
rt_tensor_as_strided_like(rt_state *st, PyObject *orig, PyObject *like)
{
    if (rt_cpp_tensor_op_ok(st, orig, like)) {
        int rc = st->cpp->epi_as_strided_like(orig, like);
        if (rt_cpp_answered(st, rc)) {
            return rc;
        }
    }
    PyObject *geometry[3] = {NULL, NULL, NULL};
    int rc = -1;
    if ((geometry[0] = rt_tensor_call(st, RT_SIZE, like, NULL, 0)) == NULL ||
        (geometry[1] = rt_tensor_call(st, RT_STRIDE, like, NULL, 0)) == NULL ||
        (geometry[2] = rt_tensor_call(st, RT_STORAGE_OFFSET, like, NULL, 0)) == NULL) {
        goto done;
    }
    PyObject *r = rt_tensor_call(st, RT_AS_STRIDED_, orig, geometry, 3);
    if (r != NULL) {
        Py_DECREF(r);
        rc = 0;
    }
done:
    Py_XDECREF(geometry[0]);
    Py_XDECREF(geometry[1]);
    Py_XDECREF(geometry[2]);
    return rc;
}

int
rt_tensor_set_(rt_state *st, PyObject *orig, PyObject *src)
{
    if (rt_cpp_tensor_op_ok(st, orig, src)) {
        int rc = st->cpp->epi_set_(orig, src);
        if (rt_cpp_answered(st, rc)) {
            return rc;
        }
    }
    return call_discard(st, RT_SET_, orig, src);
}

int
rt_view_sequence_prepare(rt_state *st, PyObject *sequence, PyObject **out)
{
    *out = NULL;
    if (st->cpp == NULL) {
        return 0;
    }
    *out = st->cpp->epi_view_sequence(sequence);
    return *out == NULL && PyErr_Occurred() ? -1 : 0;
}

int
rt_increment_version(rt_state *st, PyObject *tensors)
{
    PyObject *r = PyObject_Vectorcall(st->increment_version, &tensors, 1, NULL);
    if (r == NULL) {
        return -1;
    }
    Py_DECREF(r);
    return 0;
}

PyObject *
rt_unwrap_tensoralias(rt_state *st, PyObject *x)
{
    int ok = PyObject_IsInstance(x, st->TensorAlias);
    if (ok < 0) {
        return NULL;
    }
    if (!ok) {
        /* upstream: AssertionError(f"expected TensorAlias, got {type(x)}") */
        PyErr_Format(PyExc_AssertionError, "expected TensorAlias, got %S",
                     (PyObject *)Py_TYPE(x));
        return NULL;
    }
    return PyObject_GetAttr(x, st->str_alias);
}

PyObject *
rt_unwrap_updated_input(rt_state *st, PyObject *x)
{
    int ok = PyObject_IsInstance(x, st->TensorAlias);
    if (ok < 0) {
        return NULL;
    }
    if (!ok) {
        /* 2.11/2.12 _RuntimeForwardEpilogue._apply_input_mutations: AssertionError(
         * f"expected TensorAlias for updated_inpt, got {type(updated_inpt)}") */
        PyErr_Format(PyExc_AssertionError, "expected TensorAlias for updated_inpt, got %S",
                     (PyObject *)Py_TYPE(x));
        return NULL;
    }
    return PyObject_GetAttr(x, st->str_alias);
}

int
rt_mark_dynamic_indices(rt_state *st, PyObject *t, PyObject *dims, PyObject *name)
{
    /* if hasattr(t, name): t.name |= dims  else: t.name = dims.copy() */
    (void)st;
    PyObject *current = PyObject_GetAttr(t, name);
    if (current == NULL) {
        if (!PyErr_ExceptionMatches(PyExc_AttributeError)) {
            return -1;
        }
        PyErr_Clear(); /* hasattr() is False */
    }
    PyObject *updated;
    if (current != NULL) {
        updated = PyNumber_InPlaceOr(current, dims);
        Py_DECREF(current);
    }
    else {
        updated = PyObject_CallMethod(dims, "copy", NULL);
    }
    if (updated == NULL) {
        return -1;
    }
    int rc = PyObject_SetAttr(t, name, updated);
    Py_DECREF(updated);
    return rc;
}

/* ---- profiler range --------------------------------------------------- */

int
rt_prologue_range_enter(rt_state *st, PyObject **range)
{
    *range = NULL;
    PyObject *on = PyDict_GetItemWithError(st->profiler_globals,
                                           st->str_is_profiler_enabled);
    if (on == NULL) {
        if (PyErr_Occurred()) {
            return -1;
        }
        PyErr_SetString(PyExc_AttributeError,
                        "module 'torch.autograd.profiler' has no attribute "
                        "'_is_profiler_enabled'");
        return -1;
    }
    int v = PyObject_IsTrue(on);
    if (v <= 0) {
        return v;
    }
    PyObject *flag = rt_config_read(st, st->dynamo_config, st->str_record_runtime_overhead);
    if (flag == NULL) {
        return -1;
    }
    v = PyObject_IsTrue(flag);
    Py_DECREF(flag);
    if (v <= 0) {
        return v;
    }
    PyObject *cm = PyObject_CallOneArg(st->RecordFunctionFast, st->prologue_range_name);
    if (cm == NULL) {
        return -1;
    }
    if (rt_context_enter(st, cm) < 0) {
        Py_DECREF(cm);
        return -1;
    }
    *range = cm;
    return 0;
}

int
rt_prologue_range_exit(rt_state *st, PyObject **range)
{
    PyObject *cm = *range;
    if (cm == NULL) {
        return 0;
    }
    *range = NULL;
    /* upstream: cm.__exit__(None, None, None), whatever is pending */
    rt_pending_error saved;
    rt_finally_begin(&saved);
    int ok = rt_context_exit(st, cm, 0) == 0;
    Py_DECREF(cm);
    return rt_finally_end(&saved, ok);
}

/* ---- saved-tensor hooks ----------------------------------------------- */

PyObject *
rt_saved_hooks_disable(rt_state *st)
{
    PyObject *previous = PyObject_CallNoArgs(st->saved_hooks_get_disabled_message);
    if (previous == NULL) {
        return NULL;
    }
    PyObject *argv[2] = {st->saved_hooks_error_message, Py_False};
    PyObject *r = PyObject_Vectorcall(st->saved_hooks_disable, argv, 2, NULL);
    if (r == NULL) {
        /* upstream's finally still runs: restore what was there */
        rt_pending_error saved;
        rt_finally_begin(&saved);
        int ok = rt_saved_hooks_restore(st, previous) == 0;
        rt_finally_end(&saved, ok);
        return NULL;
    }
    Py_DECREF(r);
    return previous;
}

int
rt_saved_hooks_restore(rt_state *st, PyObject *previous)
{
    PyObject *r;
    if (previous == Py_None) {
        r = PyObject_CallNoArgs(st->saved_hooks_enable);
    }
    else {
        PyObject *argv[2] = {previous, Py_False};
        r = PyObject_Vectorcall(st->saved_hooks_disable, argv, 2, NULL);
    }
    Py_DECREF(previous);
    if (r == NULL) {
        return -1;
    }
    Py_DECREF(r);
    return 0;
}
