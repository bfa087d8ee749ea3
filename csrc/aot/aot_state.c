/* aot_state.c: AOTAutograd's part of the module state (see aot_state.h). */
#include "aot/aot_state.h"

#include <string.h>

#include "state.h"
#include "util/intern_names.h"
#include "util/lookup.h"
#include "util/objects.h"

/* Upstream's message, verbatim (runtime_wrappers.py). */
static const char STREAM_ERROR_MESSAGE[] =
    "Mutations on inputs with user-specified streams are not yet supported. "
    "See: https://github.com/pytorch/pytorch/issues/172522";

#define OBJ(field) offsetof(rt_aot_state, obj.field)

int
rt_aot_init(rt_state *st)
{
    rt_aot_state *a = &st->aot;
    static const rt_name_field names[] = {
        {OBJ(str_tensor_unflatten), "__tensor_unflatten__"},
        {OBJ(str_clear), "clear"},
        {OBJ(str_backward_state), "_compiled_autograd_backward_state"},
        {OBJ(str_shape), "shape"},
        {OBJ(str_dtype), "dtype"},
        {OBJ(str_device), "device"},
        {OBJ(str_layout), "layout"},
        {OBJ(str_boxed_call), "_boxed_call"},
        {OBJ(str_context), "context"},
        {OBJ(str_run), "run"},
        {OBJ(str_backward), "backward"},
        {OBJ(str_vjp), "vjp"},
        {OBJ(str_get_or_compile), "get_or_compile"},
        {OBJ(str_compiled_bw), "compiled_bw"},
        {OBJ(str_bw_donated_idxs), "bw_donated_idxs"},
        {OBJ(str_donated_buffer), "donated_buffer"},
        {OBJ(str_copy), "copy"},
        {OBJ(str_debug_assert), "debug_assert"},
        {OBJ(str_compiled_fn), "compiled_fn"},
        {OBJ(str_is_first), "_is_first"},
        {OBJ(str_record_runtime_overhead), "record_runtime_overhead"},
        {OBJ(wrapper_qualname), "_create_runtime_wrapper.<locals>.runtime_wrapper"},
    };
    if (rt_intern_names(a, names, sizeof(names) / sizeof(names[0])) < 0) {
        return -1;
    }
    if ((a->obj.kwnames_use_once = Py_BuildValue("(s)", "saved_tensors_use_once")) == NULL ||
        (a->obj.kwnames_memory_format = Py_BuildValue("(s)", "memory_format")) == NULL ||
        (a->obj.kwnames_empty_strided = Py_BuildValue("(ssssss)", "size", "stride", "dtype",
                                                      "device", "layout", "requires_grad")) == NULL ||
        (a->obj.kwnames_steal_disable_amp = Py_BuildValue("(ss)", "steal_args", "disable_amp")) == NULL ||
        (a->obj.stream_error_message = PyUnicode_FromString(STREAM_ERROR_MESSAGE)) == NULL ||
        (a->obj.prologue_range_name =
             PyUnicode_FromString("AOTDispatcher Runtime Wrapper Prologue")) == NULL) {
        return -1;
    }
    if (rt_alias_state_init(&a->alias) < 0) {
        return -1;
    }
    return rt_wrappers_state_init(&a->wrappers, a->obj.str_dtype, a->obj.str_device);
}

/* The release's names: the opaque-object check, Dynamo's external-object
 * registry and its setter (rt_release_names). */
static int
bind_release_names(rt_aot_state *a, const rt_release_names *names)
{
    const char *RW = "torch._functorch._aot_autograd.runtime_wrappers";
    /* Required on every verified release: a missing name is a torch we were
     * not verified against, never "no opaque objects". */
    Py_XSETREF(a->obj.is_opaque_type, rt_lookup(RW, names->opaque_type_check));
    if (a->obj.is_opaque_type == NULL) {
        return -1;
    }
    Py_CLEAR(a->obj.OpaqueBase); /* 2.11: is_opaque_type(type(obj)) alone */
    if (names->opaque_base != NULL &&
        (a->obj.OpaqueBase = rt_lookup(RW, names->opaque_base)) == NULL) {
        return -1;
    }
    Py_CLEAR(a->obj.external_objects);
    Py_CLEAR(a->obj.set_external_object);
    a->external_objects_is_list = false;
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
        if ((a->obj.external_objects = rt_lookup(RW, names->external_objects)) == NULL) {
            return -1;
        }
        if (is_list ? !PyList_CheckExact(a->obj.external_objects)
                    : !PyDict_CheckExact(a->obj.external_objects)) {
            PyErr_Format(PyExc_TypeError, "%s.%s is not a %s", RW, names->external_objects,
                         type);
            Py_CLEAR(a->obj.external_objects);
            return -1;
        }
        a->external_objects_is_list = is_list;
    }
    if (names->external_objects_setter != NULL &&
        (a->obj.set_external_object = rt_lookup(RW, names->external_objects_setter)) == NULL) {
        return -1;
    }
    return 0;
}

int
rt_aot_bind(rt_state *st, const rt_release_names *names)
{
    rt_aot_state *a = &st->aot;
#define RW "torch._functorch._aot_autograd.runtime_wrappers"
    static const rt_lookup_field fields[] = {
        {OBJ(FunctionBase), "torch._C", "_FunctionBase"},
        {OBJ(maybe_clear_saved_tensors), "torch._C", "_FunctionBase.maybe_clear_saved_tensors"},
        {OBJ(unwrap_if_dead), "torch._C._functorch", "unwrap_if_dead"},
        {OBJ(deterministic_enabled), "torch._C", "_get_deterministic_algorithms"},
        {OBJ(BackwardState), RW, "BackwardState"},
        {OBJ(SymInt), "torch", "SymInt"},
        {OBJ(SymFloat), "torch", "SymFloat"},
        /* torch.ops.aten is an attribute namespace, not an importable module */
        {OBJ(unsafe_view), "torch", "ops.aten._unsafe_view"},
        {OBJ(partial), "functools", "partial"},
        {OBJ(functorch_config), "torch._functorch.config", NULL},
        {OBJ(process_runtime_tangent), RW, "AOTDispatchAutograd.process_runtime_tangent"},
        {OBJ(empty_strided), "torch", "empty_strided"},
        {OBJ(call_func_at_runtime), RW, "call_func_at_runtime_with_args"},
        {OBJ(weakref_ref), "weakref", "ref"},
        {OBJ(apply_view_meta_sequence), "torch._C._functionalization", "apply_view_meta_sequence"},
        {OBJ(dynamo_config), "torch._dynamo.config", NULL},
    };
#undef RW
    if (rt_lookup_fields(a, fields, sizeof(fields) / sizeof(fields[0])) < 0) {
        return -1;
    }
    /* The classmethod itself, not `_FunctionBase.apply` (already bound). */
    PyObject *d = PyObject_GetAttrString(a->obj.FunctionBase, "__dict__");
    if (d == NULL) {
        return -1;
    }
    Py_XSETREF(a->obj.function_base_apply, PyMapping_GetItemString(d, "apply"));
    Py_DECREF(d);
    if (a->obj.function_base_apply == NULL || bind_release_names(a, names) < 0) {
        return -1;
    }
    return rt_alias_state_bind(&a->alias);
}
#undef OBJ

int
rt_aot_traverse(rt_state *st, visitproc visit, void *arg)
{
    rt_aot_state *a = &st->aot;
    int rc;
    if ((rc = RT_OBJECTS_TRAVERSE(a->obj, visit, arg)) != 0 ||
        (rc = RT_TYPES_TRAVERSE(a->types, visit, arg)) != 0 ||
        (rc = RT_OBJECTS_TRAVERSE(a->alias, visit, arg)) != 0) {
        return rc;
    }
    return RT_OBJECTS_TRAVERSE(a->wrappers, visit, arg);
}

void
rt_aot_clear(rt_state *st)
{
    rt_aot_state *a = &st->aot;
    RT_OBJECTS_CLEAR(a->obj);
    RT_TYPES_CLEAR(a->types);
    RT_OBJECTS_CLEAR(a->alias);
    RT_OBJECTS_CLEAR(a->wrappers);
    a->external_objects_is_list = false;
}
