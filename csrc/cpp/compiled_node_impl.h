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
// Names interned once, at rt_node_type_init.
extern PyObject* str_forward;
extern PyObject* str_backward;
extern PyObject* str_backward_cls;             // _backward_cls
extern PyObject* str_autograd_function_id;     // _autograd_function_id
extern PyObject* str_compiled_autograd_key;    // _compiled_autograd_key
extern PyObject* str_opaque_objects;           // opaque_objects
extern PyObject* str_lazy_backward_info;       // _lazy_backward_info
extern PyObject* str_aot_id;                   // _aot_id
extern PyObject* str_proxy_call_backward;      // proxy_call_backward
extern PyObject* str_set_node_origin;          // set_node_origin

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

// What THPFunction keeps for PyNode (python_function.h), minus what
// CompiledFunction never uses (dirty tensors, setup_context, jvp,
// materialize_grads=False, saved_for_forward). Where it lives is the
// node's ownership (node_ptr.h): in the node from 2.13 on (its face is a
// THPCppFunction the node keeps alive), in the face on 2.11/2.12 (as
// upstream's ctx, it outlives the node while referenced).
struct CompiledFunctionState {
  // inline for up to 8 forward arguments: no allocation per call.
  // needs_input_grad: each argument is a tensor that requires grad (the
  // tuple THPFunction_apply stores in ctx->needs_input_grad).
  c10::SmallVector<bool, 8> is_variable_input;
  c10::SmallVector<bool, 8> needs_input_grad;
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

  // What PyNode's compiled-autograd methods read from the THPFunction:
  // the forward's tensor inputs as VariableInfo (ctx->input_info, which
  // process_outputs records on every executable call; here recorded flat
  // and inline, with no allocation per call, and made VariableInfos by
  // input_info() the first time compiled autograd asks), the BackwardState
  // the forward stores (ctx._compiled_autograd_backward_state) and the
  // key's symints, which compiled_args (const, as PyNode's, which writes
  // its ctx's) refreshes on every backward that collects the node.
  struct InputMeta {
    at::Layout layout;
    at::Device device;
    at::ScalarType scalar_type;
    bool requires_grad;
    size_t ndim;
  };
  c10::SmallVector<InputMeta, 8> input_meta;
  c10::SmallVector<c10::SymInt, 16> input_sizes;  // every input's, in order
  PyObject* compiled_autograd_backward_state = nullptr;
  mutable std::vector<c10::SymInt> compiled_autograd_symints;

  // VariableInfo(var) of each tensor input, as recorded
  void record_inputs(const variable_list& vars) {
    input_meta.clear();
    input_sizes.clear();
    input_meta.reserve(vars.size());
    for (const auto& var : vars) {
      const auto sizes = var.sym_sizes();
      input_meta.push_back(
          {var.layout(), var.device(), var.scalar_type(), var.requires_grad(), sizes.size()});
      input_sizes.append(sizes.begin(), sizes.end());
    }
    input_info_.reset();
  }

  std::vector<VariableInfo>& input_info() const {
    if (!input_info_.has_value()) {
      std::vector<VariableInfo> infos;
      infos.reserve(input_meta.size());
      size_t at = 0;
      for (const InputMeta& m : input_meta) {
        VariableInfo& info = infos.emplace_back();
        info.layout = m.layout;
        info.device = m.device;
        info.scalar_type = m.scalar_type;
        info.size.assign(input_sizes.begin() + at, input_sizes.begin() + at + m.ndim);
        info.requires_grad = m.requires_grad;
        info.is_empty = false;
        at += m.ndim;
      }
      input_info_ = std::move(infos);
    }
    return *input_info_;
  }

 private:
  mutable std::optional<std::vector<VariableInfo>> input_info_;

 public:

  // The GIL is held. Saved-tensor hooks hold Python objects.
  void clear() {
    saved_variables.clear();
    Py_CLEAR(forward_cls);
    clear_ctx_objects();
  }

  // For the face's tp_traverse (THPFunction_traverse): every Python object.
  int traverse(visitproc visit, void* arg) const {
    Py_VISIT(forward_cls);
    Py_VISIT(to_save);
    Py_VISIT(non_differentiable);
    Py_VISIT(tensors_no_vc_check);
    Py_VISIT(symints);
    Py_VISIT(opaque_objects);
    Py_VISIT(external_objects);
    Py_VISIT(compiled_autograd_backward_state);
    return 0;
  }

  // For the face's tp_clear (THPFunction_clear): forward_cls is kept (a
  // class, as the ctx keeps its type); the node's apply reads it.
  void clear_ctx_objects() {
    Py_CLEAR(to_save);
    Py_CLEAR(non_differentiable);
    Py_CLEAR(tensors_no_vc_check);
    Py_CLEAR(symints);
    Py_CLEAR(opaque_objects);
    Py_CLEAR(external_objects);
    Py_CLEAR(compiled_autograd_backward_state);
  }
};

#if !RT_NODE_INTRUSIVE
// The owned face's view of its node ends (compiled_node_face_owned.cpp).
void face_node_died(PyObject* face);
#endif

struct CompiledFunctionNode final : Node {
#if RT_NODE_INTRUSIVE
  CompiledFunctionState state_;
  CompiledFunctionState& state() { return state_; }
  const CompiledFunctionState& state() const { return state_; }
#else
  // The face (compiled_node_face_owned.cpp), owned: PyNode's obj. Also the
  // node's pyobj(), through which torch finds it (functionToPyObject) and
  // reports it to the GC (a tensor's traverse).
  PyObject* face = nullptr;
  CompiledFunctionState& state();
  const CompiledFunctionState& state() const;
#endif

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
#if RT_NODE_INTRUSIVE
    state_.clear();
#else
    if (face != nullptr) {
      face_node_died(face);  // it may outlive this node
    }
    Py_CLEAR(face);  // ~PyNode: Py_DECREF(obj)
#endif
  }

  std::string name() const override { return kNodeName; }

  // PyNode::is_aot_backward: the CompiledFunction has an _aot_id.
  bool is_aot_backward() const override { return true; }

  // PyNode::release_variables (deleteNode calls it before the destructor)
  void release_variables() override {
    if (!Py_IsInitialized()) {
      return;
    }
#if !RT_NODE_INTRUSIVE
    if (face == nullptr) {  // its face could not be made (rt_node_apply)
      return;
    }
#endif
    GilAcquire gil;
    release_saved();
  }

  // The same, for a caller that holds the GIL (maybe_clear_saved_tensors):
  // PyGILState_Ensure/Release cost more than the rest of the call.
  void release_saved() {
    state().saved_variables.clear();
    state().has_freed_buffers = true;
  }

  // Compiled autograd (compiled_node_compiled_autograd.cpp): what PyNode
  // does for a CompiledFunction's ctx.
  void compiled_args(torch::dynamo::autograd::CompiledNodeArgs& args) const override;
  variable_list apply_with_saved(const variable_list& inputs,
                                 torch::dynamo::autograd::SwapSavedVariables& saved) override;

  variable_list apply(variable_list&& inputs) override;

  // The node's grad_fn, a new reference (functionToPyObject); null with a
  // Python error. The GIL is held.
  PyObject* face_ref() const;

 private:
  variable_list apply_with_saved_impl(const variable_list& inputs,
                                      const torch::dynamo::autograd::SwapSavedVariables& saved);
  variable_list to_variable_list(PyObject* grads) const;
};

// the grad_fn type (one per process; its layout is the face's, below)
extern PyTypeObject node_type;

// Both faces have THPCppFunction's layout first (PyObject_HEAD, cdata):
// torch's C++ reads `cdata` of any object whose type is registered with
// registerCppFunction (THPCppFunction_Check: _will_engine_execute_node,
// parseGradientEdge). After it come the slots of a Python object that
// upstream's ctx has and a C++ node's face lacks: weak references and a
// __dict__ (FaceSlots, at sizeof(THPCppFunction) on both faces).
struct FaceSlots {
  PyObject* weakreflist;
  PyObject* dict;
};
static_assert(sizeof(THPCppFunction) % alignof(FaceSlots) == 0,
              "FaceSlots follow THPCppFunction without padding");
inline constexpr Py_ssize_t kFaceSlotsOffset = sizeof(THPCppFunction);
inline FaceSlots& face_slots(PyObject* self) {
  return *reinterpret_cast<FaceSlots*>(reinterpret_cast<char*>(self) + kFaceSlotsOffset);
}
// The type slots for them (tp_weaklistoffset, tp_dictoffset) and the
// __dict__ getset (ctx_properties has it).
inline constexpr Py_ssize_t kFaceWeaklistOffset = kFaceSlotsOffset + offsetof(FaceSlots, weakreflist);
inline constexpr Py_ssize_t kFaceDictOffset = kFaceSlotsOffset + offsetof(FaceSlots, dict);
// What a face's dealloc does for them first (subtype_dealloc's order),
// and its traverse and clear.
inline void face_slots_dealloc(PyObject* self) {
  FaceSlots& slots = face_slots(self);
  if (slots.weakreflist != nullptr) {
    PyObject_ClearWeakRefs(self);
  }
  Py_CLEAR(slots.dict);
}

#if RT_NODE_INTRUSIVE
// the node behind a grad_fn of node_type: the face owns it
inline CompiledFunctionNode* node_of(PyObject* self) {
  return static_cast<CompiledFunctionNode*>(
      reinterpret_cast<torch::autograd::THPCppFunction*>(self)->cdata.get());
}
inline CompiledFunctionState& state_of_face(PyObject* self) {
  return node_of(self)->state();
}
// the node for saved_tensors' unpack (never null: the face owns it)
inline NodePtr<Node> node_ref_of_face(PyObject* self) {
  return node_of(self)->getptr();
}
#else
// THPFunction's ownership: the state, and a weak pointer to the node, which
// owns this object (python_function.h: cdata, "guaranteed that
// cdata.lock()->obj == this" while the node lives). Its THPCppFunction
// prefix holds a non-owning view of the node for torch's readers (reset
// when the node dies: they then see no node, as THPFunction's expired
// cdata.lock() gives them).
struct OwnedFace {
  THPCppFunction cpp;
  FaceSlots slots;
  CompiledFunctionState state;
  WeakNodePtr<CompiledFunctionNode> cdata;
};
inline CompiledFunctionState& state_of_face(PyObject* self) {
  return reinterpret_cast<OwnedFace*>(self)->state;
}
// null once the node is gone
inline NodePtr<Node> node_ref_of_face(PyObject* self) {
  return reinterpret_cast<OwnedFace*>(self)->cdata.lock();
}
inline CompiledFunctionState& CompiledFunctionNode::state() {
  return state_of_face(face);
}
inline const CompiledFunctionState& CompiledFunctionNode::state() const {
  return state_of_face(face);
}
#endif

// A node with its face where the face holds the state (2.11/2.12), as
// THPFunction_apply makes its ctx and PyNode together; null with a Python
// error when the face cannot be made.
NodePtr<CompiledFunctionNode> new_compiled_node();
// Readies node_type (once; the face's file): 0, or -1 with a Python error.
int face_type_init();

// The ctx attributes and methods both faces have (compiled_node_face.cpp),
// each table ended by a null entry.
extern PyGetSetDef ctx_properties[];
extern PyMethodDef ctx_methods[];

// Two null-terminated tables as one (a type's getsets or methods, made once).
inline const char* def_name(const PyGetSetDef& d) { return d.name; }
inline const char* def_name(const PyMethodDef& d) { return d.ml_name; }
template <class Def>
std::vector<Def> joined(const Def* first, const Def* second) {
  std::vector<Def> all;
  for (const Def* d = first; def_name(*d) != nullptr; d++) {
    all.push_back(*d);
  }
  for (const Def* d = second; def_name(*d) != nullptr; d++) {
    all.push_back(*d);
  }
  all.push_back(Def{});
  return all;
}

// How the node calls CompiledFunction.backward (node_ptr.h)
#if RT_NODE_BOXED_BACKWARD
inline constexpr bool kBackwardBoxed = true;
#else
inline constexpr bool kBackwardBoxed = false;
#endif

// BackwardCFunction.apply(self, *args) on 2.11/2.12, given its args tuple:
// `user_fn(self, *args)` (CompiledFunction's backward: no vjp), a call
// through the new tuple (self, *args), as CALL_FUNCTION_EX makes it. Each
// grad stays referenced by both tuples until the backward returns (the
// compiled backward can see how many references its args have). A new
// reference, or null with a Python error.
inline PyObject* call_unboxed(PyObject* backward, PyObject* ctx, PyObject* args) {
  const Py_ssize_t n = PyTuple_GET_SIZE(args);
  THPObjectPtr call(PyTuple_New(n + 1));
  if (!call) {
    return nullptr;
  }
  PyTuple_SET_ITEM(call.get(), 0, Py_NewRef(ctx));
  for (Py_ssize_t i = 0; i < n; i++) {
    PyTuple_SET_ITEM(call.get(), i + 1, Py_NewRef(PyTuple_GET_ITEM(args, i)));
  }
  return PyObject_Call(backward, call.get(), nullptr);
}

}  // namespace rt_node
