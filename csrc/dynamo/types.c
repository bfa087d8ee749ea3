/* types.c: the registration of Dynamo's types: the function-like ones
 * (fn_object.h's head), saved_hooks_guard.c's SavedHooksGuard, disable.c's
 * DisabledCall, bytecode_helper.c's BytecodeHelper, and bytecode_helper.c's NullContext
 * with its one instance. */
#include "dynamo/dynamo.h"
#include "fn_object.h"

int
rt_dynamo_types_init(PyObject *module, rt_state *st)
{
    struct {
        PyType_Spec *spec;
        PyTypeObject **slot;
    } types[] = {
        {&SavedHooksGuard_spec, &st->SavedHooksGuardType},
        {&DisabledCall_spec, &st->DisabledCallType},
        {&BytecodeHelper_spec, &st->BytecodeHelperType},
        {&NullContext_spec, &st->NullContextType},
        {&CompileWrapper_spec, &st->CompileWrapperType},
        {&ModuleCall_spec, &st->ModuleCallType},
    };
    for (size_t i = 0; i < sizeof(types) / sizeof(types[0]); i++) {
        *types[i].slot = (PyTypeObject *)PyType_FromModuleAndSpec(module, types[i].spec, NULL);
        if (*types[i].slot == NULL || PyModule_AddType(module, *types[i].slot) < 0) {
            return -1;
        }
    }
    st->null_context = st->NullContextType->tp_alloc(st->NullContextType, 0);
    return st->null_context != NULL ? 0 : -1;
}
