// compiled_node_impl.h: CompiledFunction's C++ autograd node, shared by
// compiled_node.cpp (the node: forward and backward) and
// compiled_node_face.cpp (its Python face, grad_fn). Internal to csrc/cpp/.
#pragma once

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <ATen/FuncTorchTLS.h>
#include <ATen/record_function.h>
#include <c10/core/GradMode.h>
#include <c10/util/SmallVector.h>
#include <torch/csrc/Exceptions.h>
#include <torch/csrc/autograd/custom_function.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/graph_task.h>
#include <torch/csrc/autograd/python_cpp_function.h>
#include <torch/csrc/autograd/python_variable.h>
#include <torch/csrc/autograd/saved_variable.h>
#include <torch/csrc/autograd/variable_info.h>
#include <torch/csrc/jit/frontend/tracer.h>
#include <torch/headeronly/version.h>

#include <algorithm>
#include <optional>
#include <string>
#include <unordered_set>
#include <vector>

#include "../torch_cpp_api.h"
#include "compiled_node.h"
#include "node_ptr.h"

namespace rt_node {

using torch::autograd::Node;
using torch::autograd::SavedVariable;
using torch::autograd::THPCppFunction;
using torch::autograd::Variable;
using torch::autograd::VariableInfo;
using torch::autograd::variable_list;

inline constexpr char kNodeName[] = "CompiledFunctionBackward";
extern PyObject* str_forward;  // interned at rt_node_type_init
extern PyObject* str_backward;

// See Note [Persisting PyErr state across autograd engine threads]: an error
// raised in backward crosses the engine's threads as a python_error.
[[noreturn]] inline void throw_python_error() {
  python_error err;
  err.persist();
  throw std::move(err);
}

// The GIL for a scope, from any thread (the engine calls apply without it).
struct GilAcquire {
  PyGILState_STATE state = PyGILState_Ensure();
  GilAcquire() = default;
  GilAcquire(const GilAcquire&) = delete;
  GilAcquire& operator=(const GilAcquire&) = delete;
  ~GilAcquire() { PyGILState_Release(state); }
};

struct GilRelease {
  PyThreadState* state = PyEval_SaveThread();
  GilRelease() = default;
  GilRelease(const GilRelease&) = delete;
  GilRelease& operator=(const GilRelease&) = delete;
  ~GilRelease() { PyEval_RestoreThread(state); }
};

struct CompiledFunctionNode final : Node {
  // What THPFunction keeps for PyNode (python_function.h), minus what
  // CompiledFunction never uses (dirty tensors, setup_context, jvp,
  // materialize_grads=False, saved_for_forward).
  // inline for up to 8 forward arguments: no allocation per call
  c10::SmallVector<bool, 8> is_variable_input;
  std::vector<VariableInfo> output_info;
  std::vector<SavedVariable> saved_variables;
  bool has_freed_buffers = false;
  bool materialize_non_diff_grads = true;

  // Python objects, touched only with the GIL held. forward_cls is the
  // CompiledFunction class (grad_fn._forward_cls, as BackwardCFunction's);
  // to_save and non_differentiable live from forward's setattr until the
  // outputs are wrapped; the rest are what upstream's forward stores in
  // ctx.__dict__ and its backward reads back.
  PyObject* forward_cls = nullptr;
  PyObject* to_save = nullptr;
  PyObject* non_differentiable = nullptr;
  PyObject* tensors_no_vc_check = nullptr;
  PyObject* symints = nullptr;
  PyObject* opaque_objects = nullptr;
  PyObject* external_objects = nullptr;

  CompiledFunctionNode() = default;
  CompiledFunctionNode(const CompiledFunctionNode&) = delete;
  CompiledFunctionNode& operator=(const CompiledFunctionNode&) = delete;

  ~CompiledFunctionNode() override {
    // As PyNode: the node may outlive the interpreter (held from C++); then
    // its Python objects are leaked rather than touched.
    if (!Py_IsInitialized()) {
      return;
    }
    GilAcquire gil;
    saved_variables.clear();  // saved-tensor hooks hold Python objects
    Py_CLEAR(forward_cls);
    Py_CLEAR(to_save);
    Py_CLEAR(non_differentiable);
    Py_CLEAR(tensors_no_vc_check);
    Py_CLEAR(symints);
    Py_CLEAR(opaque_objects);
    Py_CLEAR(external_objects);
  }

  std::string name() const override { return kNodeName; }

  // PyNode::is_aot_backward: the CompiledFunction has an _aot_id.
  bool is_aot_backward() const override { return true; }

  // PyNode::release_variables
  void release_variables() override {
    if (!Py_IsInitialized()) {
      return;
    }
    GilAcquire gil;
    release_saved();
  }

  // The same, for a caller that holds the GIL (maybe_clear_saved_tensors):
  // PyGILState_Ensure/Release cost more than the rest of the call.
  void release_saved() {
    saved_variables.clear();
    has_freed_buffers = true;
  }

  // Compiled autograd asks every node for its state; this node keeps it in
  // C++ fields compiled autograd does not know. A CompiledFunction built
  // while compiled autograd is on gets upstream's node instead (see
  // node_apply); this error is for compiled autograd switched on between a
  // forward and its backward.
  void compiled_args(torch::dynamo::autograd::CompiledNodeArgs& /*args*/) const override {
    TORCH_CHECK_NOT_IMPLEMENTED(
        false,
        "torch_aot_rt: compiled autograd was enabled after the forward of a "
        "torch.compile'd function ran with torch_aot_rt's C++ autograd node "
        "(CompiledFunctionBackward); compiled autograd cannot trace that node. "
        "Enable compiled autograd before the forward, or set TORCH_AOT_RT_CPP=0.");
  }

  variable_list apply(variable_list&& inputs) override;

 private:
  variable_list to_variable_list(PyObject* grads) const;
};

// the node behind a grad_fn of node_type
extern PyTypeObject node_type;
inline CompiledFunctionNode* node_of(PyObject* self) {
  return static_cast<CompiledFunctionNode*>(
      reinterpret_cast<torch::autograd::THPCppFunction*>(self)->cdata.get());
}

}  // namespace rt_node
