// tensor_kinds.h: the tensors the C++ part leaves to torch's Python-facing
// code, by dispatch key: Python dispatch (subclasses, modes' snapshots),
// functorch wrappers and functionalization. Their autograd.Function calls
// and their size/stride/view queries may run Python or differ from what
// the plain C++ accessors return.
#pragma once

#include <c10/core/DispatchKeySet.h>

namespace rt_tensor_kinds {

inline constexpr c10::DispatchKeySet kPythonFacing({
    c10::DispatchKey::Python,
    c10::DispatchKey::PythonTLSSnapshot,
    c10::DispatchKey::FuncTorchGradWrapper,
    c10::DispatchKey::FuncTorchBatched,
    c10::DispatchKey::Functionalize,
});

}  // namespace rt_tensor_kinds
