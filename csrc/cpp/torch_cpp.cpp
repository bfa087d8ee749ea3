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
#include <c10/core/AutogradState.h>
#include <c10/core/GradMode.h>

#include "../torch_cpp_api.h"
#include "compiled_node.h"

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
