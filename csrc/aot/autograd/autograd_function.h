/* autograd_function: CompiledFunction (AOTAutograd's autograd.Function) in C.
 *
 * Upstream builds a Python autograd.Function class per compiled graph
 * (_AOTDispatchAutogradFunctionFactory.build). torch_aot_rt keeps that class,
 * with every attribute compiled autograd and the cache read, and replaces the
 * per-call parts:
 *   FunctionApply    the boxed `CompiledFunction.apply` the runtime wrapper calls
 *   CompiledForward  CompiledFunction.forward
 *   CompiledBackward CompiledFunction.backward (and _backward_impl's work)
 *   BackwardThunk    the `impl_fn` closure, for the double-backward and TLS
 *                    `context` paths that need a Python callable
 */
#ifndef TORCH_AOT_RT_AUTOGRAD_FUNCTION_H
#define TORCH_AOT_RT_AUTOGRAD_FUNCTION_H

#include "torch_api.h"

extern PyType_Spec FunctionApply_spec;
extern PyType_Spec CompiledForward_spec;
extern PyType_Spec CompiledBackward_spec;
extern PyType_Spec BackwardThunk_spec;
extern PyType_Spec ApplyBoxed_spec;
extern PyType_Spec SerializableCall_spec;
extern PyType_Spec ParamsPrepend_spec;
extern PyType_Spec SubclassWrapper_spec;
/* Adds the subclass program's instruction and tail kinds (_C.SC_*). */
int rt_subclass_constants_add(PyObject *module);

/* Creates AOTAutograd's function-like types into the module state. */
int rt_autograd_types_init(PyObject *module, rt_state *st);

#endif
