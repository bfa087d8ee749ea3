/* dynamo_state.c: Dynamo's part of the module state (dynamo.h), and the
 * registration of its types: the function-like ones (fn_object.h's head),
 * saved_hooks_guard.c's SavedHooksGuard, disable.c's DisabledCall,
 * bytecode_helper.c's BytecodeHelper and NullContext with its one instance. */
#include "dynamo/dynamo.h"
#include "fn_object.h"
#include "util/intern_names.h"
#include "util/lookup.h"
#include "util/objects.h"

#define OBJ(field) offsetof(rt_dynamo_state, obj.field)

int
rt_dynamo_init(rt_state *st)
{
    static const rt_name_field names[] = {
        {OBJ(str_dynamo_disable), "__dynamo_disable"},
        {OBJ(str_pregraph_range), "Pregraph bytecode"},
    };
    return rt_intern_names(&st->dynamo, names, sizeof(names) / sizeof(names[0]));
}

int
rt_dynamo_bind(rt_state *st)
{
    static const rt_lookup_field fields[] = {
        {OBJ(top_saved_hooks), "torch._C._autograd", "_top_saved_tensors_default_hooks"},
        {OBJ(GraphModule), "torch.fx", "GraphModule"},
    };
    return rt_lookup_fields(&st->dynamo, fields, sizeof(fields) / sizeof(fields[0]));
}
#undef OBJ

int
rt_dynamo_traverse(rt_state *st, visitproc visit, void *arg)
{
    rt_dynamo_state *d = &st->dynamo;
    int rc;
    if ((rc = RT_OBJECTS_TRAVERSE(d->obj, visit, arg)) != 0 ||
        (rc = RT_TYPES_TRAVERSE(d->types, visit, arg)) != 0 ||
        (rc = rt_cw_traverse(&d->cw, visit, arg)) != 0) {
        return rc;
    }
    return rt_disable_traverse(&d->disable, visit, arg);
}

void
rt_dynamo_clear(rt_state *st)
{
    rt_dynamo_state *d = &st->dynamo;
    rt_disable_clear(&d->disable);
    rt_cw_clear(&d->cw);
    RT_OBJECTS_CLEAR(d->obj);
    RT_TYPES_CLEAR(d->types);
}

int
rt_dynamo_types_init(PyObject *module, rt_state *st)
{
    rt_dynamo_state *d = &st->dynamo;
    struct {
        PyType_Spec *spec;
        PyTypeObject **slot;
    } types[] = {
        {&SavedHooksGuard_spec, &d->types.SavedHooksGuardType},
        {&DisabledCall_spec, &d->types.DisabledCallType},
        {&BytecodeHelper_spec, &d->types.BytecodeHelperType},
        {&NullContext_spec, &d->types.NullContextType},
        {&CompileWrapper_spec, &d->types.CompileWrapperType},
        {&ModuleCall_spec, &d->types.ModuleCallType},
    };
    for (size_t i = 0; i < sizeof(types) / sizeof(types[0]); i++) {
        *types[i].slot = (PyTypeObject *)PyType_FromModuleAndSpec(module, types[i].spec, NULL);
        if (*types[i].slot == NULL || PyModule_AddType(module, *types[i].slot) < 0) {
            return -1;
        }
    }
    PyTypeObject *null_type = d->types.NullContextType;
    d->obj.null_context = null_type->tp_alloc(null_type, 0);
    return d->obj.null_context != NULL ? 0 : -1;
}
