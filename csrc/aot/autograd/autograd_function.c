/* autograd_function.c: the registration of AOTAutograd's function-like
 * types (fn_object.h's head): CompiledFunction's, which live in
 * function_apply.c, compiled_forward.c and compiled_backward.c, and
 * serializable_call.c's SerializableCall, params_prepend.c's ParamsPrepend,
 * subclass_wrapper.c's SubclassWrapper.
 *
 * Together they mirror, in runtime_wrappers.py: Function.apply's Python layer for the
 * class; _codegen_compiled_forward with _AutogradSavedState.save_from_forward
 * and the generated _AutogradForwardEpilogue.finalize; _codegen_compiled_backward
 * with _codegen_backward_prologue, CompiledFunction._backward_impl and
 * _codegen_backward_epilogue. The class itself, its attributes and the parts
 * compiled autograd traces (_bw_prologue_fn, _bw_epilogue_fn, ...) stay
 * upstream's. Where the C version differs on purpose:
 * - CompiledFunction.compiled_fw is read when the class is built, and
 *   CompiledFunction.compiled_bw is assigned once, when the backward is first
 *   compiled, not on every backward (it never changes after);
 * - config.debug_assert is read per forward only where _codegen_finalize
 *   would check something with it (mutated inputs or aliased outputs).
 */
#include "aot/autograd/autograd_function.h"
#include "fn_object.h"

int
rt_autograd_types_init(PyObject *module, rt_state *st)
{
    struct {
        PyType_Spec *spec;
        PyTypeObject **slot;
    } types[] = {
        {&FunctionApply_spec, &st->aot.types.FunctionApplyType},
        {&CompiledForward_spec, &st->aot.types.CompiledForwardType},
        {&CompiledBackward_spec, &st->aot.types.CompiledBackwardType},
        {&BackwardThunk_spec, &st->aot.types.BackwardThunkType},
        {&ApplyBoxed_spec, &st->aot.types.ApplyBoxedType},
        {&SerializableCall_spec, &st->aot.types.SerializableCallType},
        {&ParamsPrepend_spec, &st->aot.types.ParamsPrependType},
        {&SubclassWrapper_spec, &st->aot.types.SubclassWrapperType},
    };
    for (size_t i = 0; i < sizeof(types) / sizeof(types[0]); i++) {
        *types[i].slot = (PyTypeObject *)PyType_FromModuleAndSpec(module, types[i].spec, NULL);
        if (*types[i].slot == NULL || PyModule_AddType(module, *types[i].slot) < 0) {
            return -1;
        }
    }
    return 0;
}

