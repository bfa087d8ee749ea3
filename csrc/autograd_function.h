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

int rt_autograd_types_init(PyObject *module, rt_state *st);

#endif
