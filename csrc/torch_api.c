/* torch_api.c: the one door to torch. See torch_api.h. */
#include "torch_api.h"

#include <string.h>

#include "util/intern_names.h"
#include "util/lookup.h"
#include "util/objects.h"

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

/* Upstream's message, verbatim (runtime_wrappers.py). */
static const char SAVED_HOOKS_ERROR_MESSAGE[] =
    "Saved tensors hooks were specialized as GraphModules."
    "In this case aot_autograd inlines them in forward and backward graph "
    "and disables them during runtime of aot_autograd compiled region."
    "If you see this error, that means that there is some unexpected push or pop manipulation "
    "during aot_autograd compiled region runtime."
    "Compilation with different hooks must result in recompilation.";

#define OBJ(field) offsetof(rt_torch_state, obj.field)

int
rt_torch_init(rt_state *st)
{
    rt_torch_state *t = rt_door(st);
    static const rt_name_field names[] = {
        {OBJ(str_to_save), "to_save"},
        {OBJ(str_non_differentiable), "non_differentiable"},
        {OBJ(str_materialize_non_diff_grads), "_materialize_non_diff_grads"},
        {OBJ(str_tensors_no_vc_check), "_tensors_no_vc_check"},
        {OBJ(str_symints), "symints"},
        {OBJ(str_opaque_objects), "opaque_objects"},
        {OBJ(str_saved_tensors), "saved_tensors"},
        {OBJ(str_external_objects), "_external_objects"},
        {OBJ(str_alias), "alias"},
        {OBJ(str_enter), "__enter__"},
        {OBJ(str_exit), "__exit__"},
        {OBJ(str_is_profiler_enabled), "_is_profiler_enabled"},
        {OBJ(str_requires_grad), "requires_grad"},
    };
    if (rt_intern_names(t, names, sizeof(names) / sizeof(names[0])) < 0) {
        return -1;
    }
    for (int m = 0; m < RT_N_TENSOR_METHODS; m++) {
        if ((t->obj.method_names[m] = PyUnicode_InternFromString(TENSOR_METHOD_NAMES[m])) == NULL) {
            return -1;
        }
    }
    if ((t->obj.args_true = PyTuple_Pack(1, Py_True)) == NULL ||
        (t->obj.args_false = PyTuple_Pack(1, Py_False)) == NULL) {
        return -1;
    }
    t->obj.saved_hooks_error_message = PyUnicode_FromString(SAVED_HOOKS_ERROR_MESSAGE);
    return t->obj.saved_hooks_error_message != NULL ? 0 : -1;
}

static int
bind_type(PyTypeObject **field, const char *module, const char *name)
{
    PyObject *obj = rt_lookup(module, name);
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
bind_cpp(rt_torch_state *t, PyObject *capsule, int input_grad_buffers)
{
    Py_CLEAR(t->obj.cpp_capsule);
    t->cpp = t->cpp_loaded = NULL;
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
    t->obj.cpp_capsule = Py_NewRef(capsule);
    t->cpp = t->cpp_loaded = api;
    return 0;
}

/* Tensor's and Parameter's methods, and whether Parameter's are Tensor's. */
static int
bind_tensor_methods(rt_torch_state *t)
{
    if (bind_type(&t->types.Tensor, "torch", "Tensor") < 0 ||
        bind_type(&t->types.Parameter, "torch.nn", "Parameter") < 0) {
        return -1;
    }
    for (int m = 0; m < RT_N_TENSOR_METHODS; m++) {
        Py_XSETREF(t->obj.tensor_methods[m],
                   PyObject_GetAttr((PyObject *)t->types.Tensor, t->obj.method_names[m]));
        Py_XSETREF(t->obj.parameter_methods[m],
                   PyObject_GetAttr((PyObject *)t->types.Parameter, t->obj.method_names[m]));
        if (!t->obj.tensor_methods[m] || !t->obj.parameter_methods[m]) {
            return -1;
        }
    }
    /* nn.Parameter overrides none of the epilogue's methods (the same
     * descriptors as torch.Tensor's), and its __torch_function__ is the
     * disabled one the bindings ignore: the C++ part may stand in for its
     * methods as for torch.Tensor's. */
    t->parameter_plain = 1;
    for (int m = 0; m < RT_N_TENSOR_METHODS; m++) {
        t->parameter_plain &= t->obj.parameter_methods[m] == t->obj.tensor_methods[m];
    }
    Py_XSETREF(t->obj.requires_grad_descr,
               PyObject_GetAttr((PyObject *)t->types.Tensor, t->obj.str_requires_grad));
    if (t->obj.requires_grad_descr == NULL) {
        return -1;
    }
    if (Py_TYPE(t->obj.requires_grad_descr)->tp_descr_get == NULL) {
        PyErr_SetString(PyExc_TypeError, "torch.Tensor.requires_grad is not a descriptor");
        return -1;
    }
    return 0;
}

int
rt_torch_bind(rt_state *st, PyObject *cpp_capsule, int input_grad_buffers)
{
    rt_torch_state *t = rt_door(st);
    static const rt_lookup_field fields[] = {
        {OBJ(is_grad_enabled), "torch._C", "is_grad_enabled"},
        {OBJ(set_grad_enabled), "torch._C", "_set_grad_enabled"},
        {OBJ(is_view_replay_enabled), "torch._C", "_is_view_replay_enabled"},
        {OBJ(set_view_replay_enabled), "torch._C", "_set_view_replay_enabled"},
        {OBJ(DisableAutocast), "torch._C", "_DisableAutocast"},
        {OBJ(increment_version), "torch._C", "_increment_version"},
        {OBJ(TensorAlias), "torch._functorch._aot_autograd.schemas", "TensorAlias"},
        {OBJ(RecordFunctionFast), "torch._C._profiler", "_RecordFunctionFast"},
        {OBJ(saved_hooks_get_disabled_message), "torch._C._autograd",
         "_saved_tensors_hooks_get_disabled_error_message"},
        {OBJ(saved_hooks_disable), "torch._C._autograd", "_saved_tensors_hooks_disable"},
        {OBJ(saved_hooks_enable), "torch._C._autograd", "_saved_tensors_hooks_enable"},
        {OBJ(functorch_transforms_active), "torch._C", "_are_functorch_transforms_active"},
        {OBJ(peek_interpreter_stack), "torch._C._functorch", "peek_interpreter_stack"},
        {OBJ(is_key_in_tls), "torch._C", "_is_key_in_tls"},
        {OBJ(get_obj_in_tls), "torch._C", "_get_obj_in_tls"},
        {OBJ(keep_graph), "torch._C._autograd", "_get_current_graph_task_keep_graph"},
    };
    if (rt_lookup_fields(t, fields, sizeof(fields) / sizeof(fields[0])) < 0) {
        return -1;
    }
    direct_setter(t->obj.set_grad_enabled, &t->set_grad_enabled_c, &t->set_grad_enabled_self);
    direct_setter(t->obj.set_view_replay_enabled, &t->set_view_replay_enabled_c,
                  &t->set_view_replay_enabled_self);
    Py_XSETREF(t->obj.DisableAutocast_enter,
               PyObject_GetAttr(t->obj.DisableAutocast, t->obj.str_enter));
    Py_XSETREF(t->obj.DisableAutocast_exit,
               PyObject_GetAttr(t->obj.DisableAutocast, t->obj.str_exit));
    if (!t->obj.DisableAutocast_enter || !t->obj.DisableAutocast_exit ||
        bind_tensor_methods(t) < 0) {
        return -1;
    }
    /* Upstream reads the module global `_is_profiler_enabled` on every call;
     * we read the same dict entry, with an interned key. */
    PyObject *profiler = rt_lookup("torch.autograd.profiler", NULL);
    if (profiler == NULL) {
        return -1;
    }
    Py_XSETREF(t->obj.profiler_globals, Py_XNewRef(PyModule_GetDict(profiler)));
    Py_DECREF(profiler);
    if (t->obj.profiler_globals == NULL) {
        return -1;
    }
    /* last: the table is in use only once every layer is bound (state.c) */
    return bind_cpp(t, cpp_capsule, input_grad_buffers);
}
#undef OBJ

int
rt_torch_traverse(rt_state *st, visitproc visit, void *arg)
{
    rt_torch_state *t = rt_door(st);
    int rc = RT_OBJECTS_TRAVERSE(t->obj, visit, arg);
    return rc != 0 ? rc : RT_TYPES_TRAVERSE(t->types, visit, arg);
}

void
rt_torch_clear(rt_state *st)
{
    rt_torch_state *t = rt_door(st);
    RT_OBJECTS_CLEAR(t->obj);
    RT_TYPES_CLEAR(t->types);
    t->cpp = t->cpp_loaded = NULL; /* its capsule was cleared above */
    t->set_grad_enabled_c = t->set_view_replay_enabled_c = NULL;
    t->set_grad_enabled_self = t->set_view_replay_enabled_self = NULL;
    t->bound = 0;
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
    rt_torch_state *t = rt_door(st);
    if (t->cpp != NULL) {
        return t->cpp->grad_enabled();
    }
    return rt_call_predicate(t->obj.is_grad_enabled);
}

/* fn(value) through its C entry point when we have it (see torch_api.h). */
static int
call_setter(rt_state *st, PyObject *fn, PyCFunctionWithKeywords c, PyObject *self, int value)
{
    rt_torch_state *t = rt_door(st);
    if (c == NULL) {
        return call_with_bool(fn, value);
    }
    PyObject *r = c(self, value ? t->obj.args_true : t->obj.args_false, NULL);
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
    rt_torch_state *t = rt_door(st);
    if (t->cpp != NULL && !t->cpp->torch_function_mode_enabled()) {
        t->cpp->set_grad_enabled(enabled);
        return 0;
    }
    return call_setter(st, t->obj.set_grad_enabled, t->set_grad_enabled_c,
                       t->set_grad_enabled_self, enabled);
}

/* ---- autograd and functorch state ------------------------------------- */

int
rt_functorch_transforms_active(rt_state *st)
{
    rt_torch_state *t = rt_door(st);
    if (t->cpp != NULL) {
        return t->cpp->functorch_transforms_active();
    }
    return rt_call_predicate(t->obj.functorch_transforms_active);
}

/* Python only: the dynamic layer stack's C++ header needs one torch does not
 * ship (nlohmann/json) */
int
rt_functorch_interpreter_active(rt_state *st)
{
    PyObject *top = PyObject_CallNoArgs(rt_door(st)->obj.peek_interpreter_stack);
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
    rt_torch_state *t = rt_door(st);
    if (t->cpp != NULL) {
        return t->cpp->graph_task_keep_graph();
    }
    return rt_call_predicate(t->obj.keep_graph);
}

int
rt_tls_object(rt_state *st, PyObject *key, PyObject **out)
{
    rt_torch_state *t = rt_door(st);
    *out = NULL;
    if (t->cpp != NULL) {
        *out = t->cpp->tls_object(key);
        return 0;
    }
    PyObject *r = PyObject_Vectorcall(t->obj.is_key_in_tls, &key, 1, NULL);
    int has_key = r ? PyObject_IsTrue(r) : -1;
    Py_XDECREF(r);
    if (has_key <= 0) {
        return has_key;
    }
    *out = PyObject_Vectorcall(t->obj.get_obj_in_tls, &key, 1, NULL);
    return *out == NULL ? -1 : 0;
}

/* torch._C._is_view_replay_enabled() */
int
rt_view_replay_enabled(rt_state *st)
{
    rt_torch_state *t = rt_door(st);
    if (t->cpp != NULL) {
        return t->cpp->view_replay_enabled();
    }
    return rt_call_predicate(t->obj.is_view_replay_enabled);
}

/* torch._C._set_view_replay_enabled(enabled), as rt_set_grad_enabled */
int
rt_set_view_replay_enabled(rt_state *st, int enabled)
{
    rt_torch_state *t = rt_door(st);
    if (t->cpp != NULL && !t->cpp->torch_function_mode_enabled()) {
        t->cpp->set_view_replay_enabled(enabled);
        return 0;
    }
    return call_setter(st, t->obj.set_view_replay_enabled, t->set_view_replay_enabled_c,
                       t->set_view_replay_enabled_self, enabled);
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
    rt_torch_state *t = rt_door(st);
    PyObject *guard = PyObject_CallNoArgs(t->obj.DisableAutocast);
    if (guard == NULL) {
        return NULL;
    }
    PyObject *r = PyObject_Vectorcall(t->obj.DisableAutocast_enter, &guard, 1, NULL);
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
    int rc = call_exit(rt_door(st)->obj.DisableAutocast_exit, guard, failed);
    Py_DECREF(guard);
    return rc;
}

int
rt_context_enter(rt_state *st, PyObject *cm)
{
    PyObject *r = PyObject_CallMethodNoArgs(cm, rt_door(st)->obj.str_enter);
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
    PyObject *exit_fn = PyObject_GetAttr(cm, rt_door(st)->obj.str_exit);
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
    k->cpp = rt_door(st)->cpp;
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
    rt_torch_state *t = rt_door(st);
    if (t->cpp != NULL) {
        return t->cpp->jit_tracing();
    }
    PyObject *r = PyObject_CallNoArgs(is_tracing);
    if (r == NULL) {
        return -1;
    }
    int tracing = r != Py_False; /* the binding returns a bool */
    Py_DECREF(r);
    return tracing;
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
    rt_torch_state *t = rt_door(st);
    if (Py_IS_TYPE(obj, t->types.Tensor) || Py_IS_TYPE(obj, t->types.Parameter)) {
        return 1;
    }
    return PyObject_IsInstance(obj, (PyObject *)t->types.Tensor);
}

PyObject *
rt_tensor_call(rt_state *st, enum rt_tensor_method m, PyObject *self,
               PyObject *const *args, Py_ssize_t nargs)
{
    rt_torch_state *t = rt_door(st);
    PyObject *stack[4];
    assert(nargs <= 3);
    stack[0] = self;
    for (Py_ssize_t i = 0; i < nargs; i++) {
        stack[i + 1] = args[i];
    }
    /* Exact torch.Tensor / Parameter: the method found on the class once.
     * Anything else (a subclass may override the method in Python): an
     * ordinary method call, as upstream's Python does. */
    if (Py_IS_TYPE(self, t->types.Tensor)) {
        return PyObject_Vectorcall(t->obj.tensor_methods[m], stack, nargs + 1, NULL);
    }
    if (Py_IS_TYPE(self, t->types.Parameter)) {
        return PyObject_Vectorcall(t->obj.parameter_methods[m], stack, nargs + 1, NULL);
    }
    return PyObject_VectorcallMethod(t->obj.method_names[m], stack,
                                     (size_t)(nargs + 1), NULL);
}

/* ---- ctx attributes ----------------------------------------------------- */

static PyObject *
ctx_field_name(rt_state *st, enum rt_ctx_field field)
{
    rt_torch_state *t = rt_door(st);
    switch (field) {
    case RT_CTX_TO_SAVE:
        return t->obj.str_to_save;
    case RT_CTX_NON_DIFFERENTIABLE:
        return t->obj.str_non_differentiable;
    case RT_CTX_MATERIALIZE_NON_DIFF_GRADS:
        return t->obj.str_materialize_non_diff_grads;
    case RT_CTX_TENSORS_NO_VC_CHECK:
        return t->obj.str_tensors_no_vc_check;
    case RT_CTX_SYMINTS:
        return t->obj.str_symints;
    case RT_CTX_OPAQUE_OBJECTS:
        return t->obj.str_opaque_objects;
    case RT_CTX_EXTERNAL_OBJECTS:
        return t->obj.str_external_objects;
    case RT_CTX_SAVED_TENSORS:
    default:
        return t->obj.str_saved_tensors;
    }
}

/* cpp_loaded, not cpp: nodes made before the routes were switched off are
 * still nodes. */
int
rt_is_cpp_node(rt_state *st, PyObject *ctx)
{
    rt_torch_state *t = rt_door(st);
    return t->cpp_loaded != NULL && t->cpp_loaded->node_check(ctx);
}

/* The node type is a static type: its getsets cannot be replaced, so the
 * direct call is what the attribute look-up ends in. */
PyObject *
rt_ctx_get(rt_state *st, PyObject *ctx, enum rt_ctx_field field)
{
    if (rt_is_cpp_node(st, ctx)) {
        return rt_door(st)->cpp_loaded->node_get(ctx, (int)field);
    }
    return PyObject_GetAttr(ctx, ctx_field_name(st, field));
}

int
rt_ctx_set(rt_state *st, PyObject *ctx, enum rt_ctx_field field, PyObject *value)
{
    if (rt_is_cpp_node(st, ctx)) {
        return rt_door(st)->cpp_loaded->node_set(ctx, (int)field, value);
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
    rt_torch_state *t = rt_door(st);
    return t->cpp != NULL && Py_IS_TYPE(x, t->types.Tensor) &&
           !t->cpp->torch_function_mode_enabled();
}

int
rt_tensor_is_view(rt_state *st, PyObject *x)
{
    if (cpp_tensor_query_ok(st, x)) {
        int v = rt_door(st)->cpp->tensor_is_view(x);
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
        int v = rt_door(st)->cpp->tensor_size_stride_equal(x, ndim, sizes, strides);
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
    rt_torch_state *t = rt_door(st);
    PyObject *r;
    if (Py_IS_TYPE(self, t->types.Tensor) || Py_IS_TYPE(self, t->types.Parameter)) {
        r = Py_TYPE(t->obj.requires_grad_descr)->tp_descr_get(
            t->obj.requires_grad_descr, self, (PyObject *)Py_TYPE(self));
    }
    else {
        r = PyObject_GetAttr(self, t->obj.str_requires_grad);
    }
    if (r == NULL) {
        return -1;
    }
    int v = PyObject_IsTrue(r);
    Py_DECREF(r);
    return v;
}

/* ---- saved-tensor hooks ----------------------------------------------- */

PyObject *
rt_saved_hooks_disable(rt_state *st)
{
    rt_torch_state *t = rt_door(st);
    PyObject *previous = PyObject_CallNoArgs(t->obj.saved_hooks_get_disabled_message);
    if (previous == NULL) {
        return NULL;
    }
    PyObject *argv[2] = {t->obj.saved_hooks_error_message, Py_False};
    PyObject *r = PyObject_Vectorcall(t->obj.saved_hooks_disable, argv, 2, NULL);
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
    rt_torch_state *t = rt_door(st);
    PyObject *r;
    if (previous == Py_None) {
        r = PyObject_CallNoArgs(t->obj.saved_hooks_enable);
    }
    else {
        PyObject *argv[2] = {previous, Py_False};
        r = PyObject_Vectorcall(t->obj.saved_hooks_disable, argv, 2, NULL);
    }
    Py_DECREF(previous);
    if (r == NULL) {
        return -1;
    }
    Py_DECREF(r);
    return 0;
}
