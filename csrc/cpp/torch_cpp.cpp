// The C++ part of torch_aot_rt: what the C core gains by calling torch's C++
// API directly instead of its Python-visible callables.
//
// Built by setup.py against the torch installed at build time (its headers,
// linked to its c10/torch_cpu) as torch_aot_rt._torch_cpp_<version>; no
// pybind11, only the CPython C API. The module exports one capsule holding
// an rt_cpp_api (csrc/torch_cpp_api.h); the shim imports the module only when
// the running torch is the build's (torch_aot_rt/_cpp.py checks the build
// record first, so a mismatched libtorch ABI is never loaded).
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <ATen/PythonTorchFunctionTLS.h>
#include <ATen/ThreadLocalPythonObjects.h>
#include <c10/core/AutogradState.h>
#include <c10/core/GradMode.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <torch/csrc/PyInterpreter.h>
#include <torch/csrc/autograd/graph_task.h>
#include <torch/csrc/autograd/python_variable.h>
#include <torch/csrc/jit/frontend/tracer.h>

#include <string>

#include "../torch_cpp_api.h"
#include "compiled_node.h"
#include "node_ptr.h"
#include "epilogue_ops.h"
#include "tensor_kinds.h"

namespace {

// torch._C._set_grad_enabled and _set_view_replay_enabled hand the call to
// an active TorchFunctionMode (handle_torch_function) before touching the
// TLS; the C core asks this first and takes the Python route when it is set.
int torch_function_mode_enabled() noexcept {
  return at::impl::torch_function_mode_enabled() ? 1 : 0;
}

int grad_enabled() noexcept {
  return c10::GradMode::is_enabled() ? 1 : 0;
}

void set_grad_enabled(int enabled) noexcept {
  c10::GradMode::set_enabled(enabled != 0);
}

int view_replay_enabled() noexcept {
  return c10::AutogradState::get_tls_state().get_view_replay_enabled() ? 1 : 0;
}

void set_view_replay_enabled(int enabled) noexcept {
  c10::AutogradState::get_tls_state().set_view_replay_enabled(enabled != 0);
}

// torch._C._are_functorch_transforms_active (python_dispatch.cpp)
int functorch_transforms_active() noexcept {
  const auto included = c10::impl::tls_local_dispatch_key_set().included_;
  return included.has(c10::DispatchKey::FuncTorchDynamicLayerFrontMode) ||
                 included.has(c10::DispatchKey::FuncTorchDynamicLayerBackMode)
             ? 1
             : 0;
}

int graph_task_keep_graph() noexcept {
  return torch::autograd::get_current_graph_task_keep_graph() ? 1 : 0;
}

// _is_key_in_tls(key) and _get_obj_in_tls(key) (python_torch_functions /
// Module.cpp): the same map, read once each; the binding returns the
// stored object with a new reference.
PyObject* tls_object(PyObject* key) noexcept {
  Py_ssize_t n = 0;
  const char* data = PyUnicode_AsUTF8AndSize(key, &n);
  if (data == nullptr) {
    PyErr_Clear();  // the caller passes an interned str: never reached
    return nullptr;
  }
  const std::string k(data, static_cast<size_t>(n));
  if (!at::impl::ThreadLocalPythonObjects::contains(k)) {
    return nullptr;
  }
  const auto& obj = at::impl::ThreadLocalPythonObjects::get(k);
  return Py_NewRef(obj->ptr(getPyInterpreter()));
}

using rt_tensor_kinds::plain_strided;

// THPVariable__is_view, past its torch-function check
int tensor_is_view(PyObject* x) noexcept {
  const at::Tensor& t = THPVariable_Unpack(x);
  if (!plain_strided(t)) {
    return -1;
  }
  return t.is_view() ? 1 : 0;
}

// coerce_to_expected_memory_format's `x.shape == expected_size and
// x.stride() == expected_stride`, past the torch-function checks of
// Tensor.shape and Tensor.stride
int tensor_size_stride_equal(PyObject* x, Py_ssize_t ndim, const int64_t* sizes,
                             const int64_t* strides) noexcept {
  const at::Tensor& t = THPVariable_Unpack(x);
  if (!plain_strided(t)) {
    return -1;
  }
  if (t.dim() != ndim) {
    return 0;
  }
  const auto sz = t.sizes();
  const auto st = t.strides();
  for (Py_ssize_t i = 0; i < ndim; i++) {
    if (sz[static_cast<size_t>(i)] != sizes[i]) {
      return 0;
    }
  }
  for (Py_ssize_t i = 0; i < ndim; i++) {
    if (st[static_cast<size_t>(i)] != strides[i]) {
      return 0;
    }
  }
  return 1;
}

// torch._C._dispatch_tls_local_include_set / _exclude_set
// (python_dispatch.cpp): the two DispatchKeySets of the local TLS
void dispatch_tls_get(uint64_t keys[2]) noexcept {
  const c10::impl::LocalDispatchKeySet local = c10::impl::tls_local_dispatch_key_set();
  keys[0] = local.included_.raw_repr();
  keys[1] = local.excluded_.raw_repr();
}

// ~ForceDispatchKeyGuard: _force_tls_local_dispatch_key_set(saved)
void dispatch_tls_force(const uint64_t keys[2]) noexcept {
  c10::impl::PODLocalDispatchKeySet pod{};
  pod.set_included(c10::DispatchKeySet::from_raw_repr(keys[0]));
  pod.set_excluded(c10::DispatchKeySet::from_raw_repr(keys[1]));
  c10::impl::_force_tls_local_dispatch_key_set(c10::impl::LocalDispatchKeySet(pod));
}

// torch._C._is_tracing (jit/python/init.cpp)
int jit_tracing() noexcept {
  return torch::jit::tracer::isTracing() ? 1 : 0;
}

const rt_cpp_api api = {
    RT_CPP_API_VERSION,
    torch_function_mode_enabled,
    grad_enabled,
    set_grad_enabled,
    view_replay_enabled,
    set_view_replay_enabled,
    rt_node_apply,
    rt_node_check,
    rt_node_maybe_clear_saved,
    rt_node_get,
    rt_node_set,
    functorch_transforms_active,
    graph_task_keep_graph,
    tls_object,
    tensor_is_view,
    tensor_size_stride_equal,
    rt_epi_copy_,
    rt_epi_as_strided_like,
    rt_epi_set_,
    rt_epi_view_sequence,
    rt_epi_view_replay,
    dispatch_tls_get,
    dispatch_tls_force,
    jit_tracing,
    RT_HAS_INPUT_GRAD_BUFFERS,
};

int module_exec(PyObject* module) {
  if (rt_node_type_init() < 0) {
    return -1;
  }
  PyObject* capsule = PyCapsule_New(
      const_cast<rt_cpp_api*>(&api), RT_CPP_CAPSULE_NAME, nullptr);
  if (capsule == nullptr) {
    return -1;
  }
  int rc = PyModule_AddObjectRef(module, "api", capsule);
  Py_DECREF(capsule);
  if (rc < 0) {
    return -1;
  }
  // how its node calls CompiledFunction.backward (node_ptr.h), which
  // _autograd_plan._node_allowed matches against the release
  if (PyModule_AddIntConstant(module, "node_backward_boxed", RT_NODE_BOXED_BACKWARD) < 0) {
    return -1;
  }
  // whose grad_fn has THPFunction's ownership (node_ptr.h: the node owns
  // it) rather than THPCppFunction's (it owns the node)
  if (PyModule_AddIntConstant(module, "node_owns_face", !RT_NODE_INTRUSIVE) < 0) {
    return -1;
  }
  return PyModule_AddStringConstant(module, "built_torch_version", RT_BUILT_TORCH_VERSION);
}

PyModuleDef_Slot module_slots[] = {
    {Py_mod_exec, reinterpret_cast<void*>(module_exec)},
    {0, nullptr},
};

PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT,
    RT_CPP_MODULE_NAME,
    "torch_aot_rt's C++ part: torch's C++ API behind the rt_cpp_api capsule.",
    0,
    nullptr,
    module_slots,
    nullptr,
    nullptr,
    nullptr,
};

}  // namespace

#define RT_CONCAT_(a, b) a##b
#define RT_CONCAT(a, b) RT_CONCAT_(a, b)

extern "C" PyMODINIT_FUNC RT_CONCAT(PyInit_, RT_CPP_MODULE_ID)(void) {
  return PyModuleDef_Init(&module_def);
}
