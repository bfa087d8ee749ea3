// tensor_kinds.h: the tensors the C++ part leaves to torch's Python-facing
// code, by dispatch key: Python dispatch (subclasses, modes' snapshots),
// functorch wrappers and functionalization. Their autograd.Function calls
// and their size/stride/view queries may run Python or differ from what
// the plain C++ accessors return.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/DispatchKeySet.h>

namespace rt_tensor_kinds {

inline constexpr c10::DispatchKeySet kPythonFacing({
    c10::DispatchKey::Python,
    c10::DispatchKey::PythonTLSSnapshot,
    c10::DispatchKey::FuncTorchGradWrapper,
    c10::DispatchKey::FuncTorchBatched,
    c10::DispatchKey::Functionalize,
});

// Where sizes(), strides() and is_view() are what the Python methods
// return and the tensor's operations run no Python of their own (no Python
// dispatch, no functorch wrapper, no symbolic sizes, dense strided):
// otherwise the C++ part leaves the call to the Python method.
inline bool plain_strided(const at::Tensor& t) {
  return !t.key_set().has_any(kPythonFacing) && !t.is_nested() && t.layout() == c10::kStrided &&
         !t.unsafeGetTensorImpl()->has_symbolic_sizes_strides();
}

}  // namespace rt_tensor_kinds
