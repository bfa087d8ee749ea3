// compiled_node.cpp: CompiledFunction's autograd node, in C++.
//
// Upstream runs every CompiledFunction call through `Function.apply`
// (THPFunction_apply in torch/csrc/autograd/python_function.cpp): it builds a
// Python ctx (a BackwardCFunction, whose PyNode is the graph node), calls
// forward(ctx, *args), then wraps the outputs; in backward PyNode::apply calls
// ctx.apply_boxed(grads) -> CompiledFunction.backward(ctx, grads). Here the
// node is a torch::autograd::Node of our own, created directly: the same
// steps, in the same order, with no Python ctx and no autograd.Function
// machinery. Its Python face (grad_fn) is a THPCppFunction of the type
// registered below, named "CompiledFunctionBackward" like upstream's.
//
// The C core's CompiledForward / CompiledBackward plans run unchanged: they
// speak to a ctx through the attributes upstream's ctx has (to_save,
// non_differentiable, symints, ...), which this type provides as getsets on
// the node. Where the node cannot be exactly upstream's, node_apply declines
// before anything observable happened and the C core takes upstream's
// Function.apply (see csrc/torch_cpp_api.h for the reasons).
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

namespace {

using torch::autograd::Node;
using torch::autograd::SavedVariable;
using torch::autograd::THPCppFunction;
using torch::autograd::THPCppFunction_input_metadata;
using torch::autograd::THPCppFunction_metadata;
using torch::autograd::THPCppFunction_name;
using torch::autograd::THPCppFunction_next_functions;
using torch::autograd::THPCppFunction_register_hook;
using torch::autograd::THPCppFunction_register_hook_dict;
using torch::autograd::THPCppFunction_register_prehook;
using torch::autograd::THPCppFunction_requires_grad;
using torch::autograd::THPCppFunction_sequence_nr;
using torch::autograd::Variable;
using torch::autograd::VariableInfo;
using torch::autograd::variable_list;

const char kNodeName[] = "CompiledFunctionBackward";
// forward's arguments go on the C stack up to this many (more: a heap vector)
constexpr Py_ssize_t kStackArgs = 16;
PyObject* str_forward = nullptr;   // interned at rt_node_type_init
PyObject* str_backward = nullptr;

// See Note [Persisting PyErr state across autograd engine threads]: an error
// raised in backward crosses the engine's threads as a python_error.
[[noreturn]] void throw_python_error() {
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

// PyNode::apply: grads to Python (PyNode::to_py_args), then
// cls.backward(ctx, grads) as apply_boxed does for a boxed_grads_call
// Function (looked up per call, as there), then the result checked and
// converted back (PyNode::to_variable_list).
variable_list CompiledFunctionNode::apply(variable_list&& inputs) {
  GilAcquire gil;
  at::OptionalDeviceGuard device_guard;
  THPObjectPtr self(torch::autograd::functionToPyObject(getptr()));
  if (!self) {
    throw_python_error();
  }
  const size_t num_inputs = inputs.size();
  THPObjectPtr grads(PyList_New(static_cast<Py_ssize_t>(num_inputs)));
  if (!grads) {
    throw_python_error();
  }
  for (size_t i = 0; i < num_inputs; i++) {
    PyObject* grad = nullptr;
    // materialize_grads is never switched off for CompiledFunction
    if (inputs[i].defined() ||
        (input_metadata(i).was_default_constructed() && !materialize_non_diff_grads)) {
      grad = THPVariable_Wrap(inputs[i]);
    } else {
      Variable zeros;
      {
        GilRelease nogil;
        zeros = output_info[i].zeros(device_guard);
      }
      grad = THPVariable_Wrap(zeros);
    }
    if (!grad) {
      throw_python_error();
    }
    PyList_SET_ITEM(grads.get(), static_cast<Py_ssize_t>(i), grad);
  }
  inputs.clear();

  THPObjectPtr backward(PyObject_GetAttr(forward_cls, str_backward));
  if (!backward) {
    throw_python_error();
  }
  PyObject* argv[2] = {self.get(), grads.get()};
  THPObjectPtr r(PyObject_Vectorcall(backward.get(), argv, 2, nullptr));
  grads = nullptr;
  if (!r) {
    throw_python_error();
  }
  if (!PyTuple_Check(r.get())) {  // ensure_tuple
    PyObject* tuple = PyTuple_Pack(1, r.get());
    if (!tuple) {
      throw_python_error();
    }
    r = tuple;
  }
  auto num_outputs = PyTuple_GET_SIZE(r.get());
  const auto num_forward_inputs = static_cast<Py_ssize_t>(is_variable_input.size());
  // Returning too many results is ok, but only as long as they're all None.
  if (num_outputs > num_forward_inputs) {
    bool all_none = true;
    for (Py_ssize_t i = num_forward_inputs; i < num_outputs; i++) {
      all_none &= Py_IsNone(PyTuple_GET_ITEM(r.get(), i));
    }
    if (all_none) {
      num_outputs = num_forward_inputs;
      r = PyTuple_GetSlice(r.get(), 0, num_forward_inputs);
      if (!r) {
        throw_python_error();
      }
    }
  }
  TORCH_CHECK(num_outputs == num_forward_inputs, "function ", name(),
              " returned an incorrect number of gradients (expected ",
              num_forward_inputs, ", got ", num_outputs, ")");
  return to_variable_list(r.get());
}

variable_list CompiledFunctionNode::to_variable_list(PyObject* grads) const {
  const auto n = PyTuple_GET_SIZE(grads);
  variable_list results;
  results.reserve(static_cast<size_t>(n));
  for (Py_ssize_t i = 0; i < n; i++) {
    PyObject* grad = PyTuple_GET_ITEM(grads, i);
    if (!is_variable_input[static_cast<size_t>(i)]) {
      TORCH_CHECK(Py_IsNone(grad), "function ", name(),
                  " returned a gradient different than None at position ", i + 1,
                  ", but the corresponding forward input was not a Variable");
      continue;
    }
    if (Py_IsNone(grad)) {
      results.emplace_back();
    } else {
      TORCH_CHECK(THPVariable_Check(grad), "expected Variable or None (got ",
                  Py_TYPE(grad)->tp_name, ")");
      results.emplace_back(THPVariable_Unpack(grad));
    }
  }
  return results;
}

// ---- the Python face: grad_fn -------------------------------------------

PyTypeObject node_type;

CompiledFunctionNode* node_of(PyObject* self) {
  return static_cast<CompiledFunctionNode*>(
      reinterpret_cast<THPCppFunction*>(self)->cdata.get());
}

// THPFunction_saved_tensors / unpack_saved_variables
PyObject* get_saved_tensors(PyObject* self, void* /*closure*/) {
  HANDLE_TH_ERRORS
  CompiledFunctionNode* node = node_of(self);
  TORCH_CHECK(!node->has_freed_buffers, torch::autograd::ERR_BACKWARD_TWICE);
  const auto& saved = node->saved_variables;
  THPObjectPtr result(PyTuple_New(static_cast<Py_ssize_t>(saved.size())));
  if (!result) {
    return nullptr;
  }
  auto saved_for = node->getptr();
  for (size_t i = 0; i < saved.size(); i++) {
    Variable var = saved[i].unpack(saved_for);
    PyObject* value = var.defined() ? THPVariable_Wrap(var) : Py_NewRef(Py_None);
    if (!value) {
      return nullptr;
    }
    PyTuple_SET_ITEM(result.get(), static_cast<Py_ssize_t>(i), value);
  }
  return result.release();
  END_HANDLE_TH_ERRORS
}

// Attributes upstream's forward puts in ctx.__dict__: AttributeError until set.
template <PyObject* CompiledFunctionNode::*field>
PyObject* get_dict_attr(PyObject* self, void* closure) {
  PyObject* value = node_of(self)->*field;
  if (value == nullptr) {
    PyErr_Format(PyExc_AttributeError, "'%s' object has no attribute '%s'", kNodeName,
                 static_cast<const char*>(closure));
    return nullptr;
  }
  return Py_NewRef(value);
}

// to_save / non_differentiable: THPFunction's getObject (None when unset).
template <PyObject* CompiledFunctionNode::*field>
PyObject* get_slot_attr(PyObject* self, void* /*closure*/) {
  PyObject* value = node_of(self)->*field;
  return Py_NewRef(value ? value : Py_None);
}

template <PyObject* CompiledFunctionNode::*field>
int set_attr(PyObject* self, PyObject* value, void* closure) {
  if (value == nullptr) {
    PyErr_Format(PyExc_AttributeError, "cannot delete attribute '%s'",
                 static_cast<const char*>(closure));
    return -1;
  }
  Py_XSETREF(node_of(self)->*field, Py_NewRef(value));
  return 0;
}

PyObject* get_materialize_non_diff_grads(PyObject* self, void* /*closure*/) {
  return PyBool_FromLong(node_of(self)->materialize_non_diff_grads);
}

int set_materialize_non_diff_grads(PyObject* self, PyObject* value, void* /*closure*/) {
  if (value == nullptr || !PyBool_Check(value)) {
    PyErr_SetString(PyExc_TypeError, "_materialize_non_diff_grads must be a bool");
    return -1;
  }
  node_of(self)->materialize_non_diff_grads = Py_IsTrue(value);
  return 0;
}

#define RT_DICT_ATTR(name, field)                                                   \
  {(char*)name, get_dict_attr<&CompiledFunctionNode::field>,                        \
   set_attr<&CompiledFunctionNode::field>, nullptr, (void*)name}
#define RT_SLOT_ATTR(name, field)                                                   \
  {(char*)name, get_slot_attr<&CompiledFunctionNode::field>,                        \
   set_attr<&CompiledFunctionNode::field>, nullptr, (void*)name}

PyGetSetDef node_properties[] = {
    THP_FUNCTION_DEFAULT_PROPERTIES,
    {(char*)"saved_tensors", get_saved_tensors, nullptr, nullptr, nullptr},
    {(char*)"_forward_cls", get_slot_attr<&CompiledFunctionNode::forward_cls>, nullptr, nullptr,
     nullptr},
    RT_SLOT_ATTR("to_save", to_save),
    RT_SLOT_ATTR("non_differentiable", non_differentiable),
    RT_DICT_ATTR("_tensors_no_vc_check", tensors_no_vc_check),
    RT_DICT_ATTR("symints", symints),
    RT_DICT_ATTR("opaque_objects", opaque_objects),
    RT_DICT_ATTR("_external_objects", external_objects),
    {(char*)"_materialize_non_diff_grads", get_materialize_non_diff_grads,
     set_materialize_non_diff_grads, nullptr, nullptr},
    {nullptr, nullptr, nullptr, nullptr, nullptr},
};

// THPFunction_maybe_clear_saved_tensors
PyObject* maybe_clear_saved_tensors(PyObject* self, PyObject* /*noargs*/) {
  HANDLE_TH_ERRORS
  if (!torch::autograd::get_current_graph_task_keep_graph()) {
    node_of(self)->release_saved();  // a method call: the GIL is held
  }
  Py_RETURN_NONE;
  END_HANDLE_TH_ERRORS
}

// BackwardCFunction.apply(*grads) and apply_boxed(grads): the backward
// called by hand, as `_forward_cls.backward(ctx, [*grads])` and
// `_forward_cls.backward(ctx, grads)` (CompiledFunction has
// boxed_grads_call, and no vjp).
PyObject* call_backward(PyObject* self, PyObject* grads) {
  THPObjectPtr backward(PyObject_GetAttr(node_of(self)->forward_cls, str_backward));
  if (!backward) {
    return nullptr;
  }
  PyObject* argv[2] = {self, grads};
  return PyObject_Vectorcall(backward.get(), argv, 2, nullptr);
}

PyObject* apply_grads(PyObject* self, PyObject* args) {
  THPObjectPtr grads(PySequence_List(args));
  return grads ? call_backward(self, grads.get()) : nullptr;
}

PyObject* apply_boxed(PyObject* self, PyObject* grads) {
  return call_backward(self, grads);
}

// THPCppFunction_set_sequence_nr (not exported by torch)
PyObject* set_sequence_nr(PyObject* self, PyObject* sequence_nr) {
  HANDLE_TH_ERRORS
  uint64_t nr = PyLong_AsUnsignedLongLong(sequence_nr);
  if (nr == static_cast<uint64_t>(-1) && PyErr_Occurred()) {
    return nullptr;
  }
  node_of(self)->set_sequence_nr(nr);
  Py_RETURN_NONE;
  END_HANDLE_TH_ERRORS
}

PyMethodDef node_methods[] = {
    {(char*)"_register_hook_dict", THPCppFunction_register_hook_dict, METH_O, nullptr},
    {(char*)"register_hook", THPCppFunction_register_hook, METH_O, nullptr},
    {(char*)"register_prehook", THPCppFunction_register_prehook, METH_O, nullptr},
    {(char*)"name", THPCppFunction_name, METH_NOARGS, nullptr},
    {(char*)"_sequence_nr", THPCppFunction_sequence_nr, METH_NOARGS, nullptr},
    {(char*)"_set_sequence_nr", set_sequence_nr, METH_O, nullptr},
    {(char*)"maybe_clear_saved_tensors", maybe_clear_saved_tensors, METH_NOARGS, nullptr},
    {(char*)"apply", apply_grads, METH_VARARGS, nullptr},
    {(char*)"apply_boxed", apply_boxed, METH_O, nullptr},
    {nullptr, nullptr, 0, nullptr},
};

// ---- forward: THPFunction_apply + process_outputs ------------------------

// Why a call cannot be exactly upstream's with this node (checked before
// anything observable happens), or RT_NODE_TAKEN.
int decline_reason(PyObject* args, variable_list& input_vars,
                   c10::SmallVector<bool, 8>& is_variable_input, bool& any_requires_grad) {
  if (torch::jit::tracer::isTracing()) {
    return RT_NODE_JIT_TRACING;  // _trace_pre_record/_trace_post_record
  }
  if (at::hasCallbacks()) {
    return RT_NODE_RECORD_FUNCTION;  // RECORD_FUNCTION with upstream's inputs
  }
  // Tensors whose autograd.Function runs through Python dispatch, functorch,
  // functionalization or nested-tensor zeros: upstream's path handles them.
  constexpr c10::DispatchKeySet special({
      c10::DispatchKey::Python,
      c10::DispatchKey::PythonTLSSnapshot,
      c10::DispatchKey::FuncTorchGradWrapper,
      c10::DispatchKey::FuncTorchBatched,
      c10::DispatchKey::Functionalize,
  });
  const Py_ssize_t n = PyTuple_GET_SIZE(args);
  input_vars.reserve(static_cast<size_t>(n));
  is_variable_input.reserve(static_cast<size_t>(n));
  for (Py_ssize_t i = 0; i < n; i++) {
    PyObject* arg = PyTuple_GET_ITEM(args, i);
    if (!THPVariable_Check(arg)) {
      is_variable_input.push_back(false);
      continue;
    }
    if (!THPVariable_CheckExact(arg)) {
      return RT_NODE_TENSOR_KIND;
    }
    const at::Tensor& t = THPVariable_Unpack(arg);
    if (t.key_set().has_any(special) || t.is_nested()) {
      return RT_NODE_TENSOR_KIND;
    }
    // Forward AD would call the (unimplemented) jvp through Python.
    auto* meta = torch::autograd::impl::get_autograd_meta(t);
    if (meta != nullptr && meta->fw_grad_ && !meta->fw_grad_->empty()) {
      return RT_NODE_FORWARD_AD;
    }
    is_variable_input.push_back(true);
    any_requires_grad |= t.requires_grad();
    input_vars.push_back(t);
  }
  return RT_NODE_TAKEN;
}

// _get_tensors_to_save (no setup_context)
std::vector<std::optional<at::Tensor>> tensors_to_save(CompiledFunctionNode& node,
                                                      bool is_executable) {
  std::vector<std::optional<at::Tensor>> result;
  if (node.to_save == nullptr) {
    return result;
  }
  TORCH_CHECK(PyTuple_Check(node.to_save),
              "autograd internal error: to_save attribute is expected to be a tuple but is ",
              Py_TYPE(node.to_save)->tp_name);
  const Py_ssize_t n = PyTuple_GET_SIZE(node.to_save);
  for (Py_ssize_t i = 0; i < n; i++) {
    PyObject* obj = PyTuple_GET_ITEM(node.to_save, i);
    if (Py_IsNone(obj)) {
      result.emplace_back(std::nullopt);
    } else if (THPVariable_Check(obj)) {
      if (is_executable) {
        result.emplace_back(THPVariable_Unpack(obj));
      }
    } else if (is_executable) {
      TORCH_CHECK_TYPE(false, "save_for_backward can only save variables, but argument ", i,
                       " is of type ", Py_TYPE(obj)->tp_name);
    }
  }
  Py_CLEAR(node.to_save);
  return result;
}

// _parse_non_differentiable
std::unordered_set<at::TensorImpl*> parse_non_differentiable(CompiledFunctionNode& node) {
  std::unordered_set<at::TensorImpl*> set;
  if (node.non_differentiable == nullptr) {
    return set;
  }
  TORCH_CHECK(PyTuple_Check(node.non_differentiable),
              "autograd internal error: non_differentiable attribute is expected to be a "
              "tuple but is ",
              Py_TYPE(node.non_differentiable)->tp_name);
  const Py_ssize_t n = PyTuple_GET_SIZE(node.non_differentiable);
  set.reserve(static_cast<size_t>(n));
  for (Py_ssize_t i = 0; i < n; i++) {
    PyObject* t = PyTuple_GET_ITEM(node.non_differentiable, i);
    TORCH_CHECK(THPVariable_Check(t),
                "mark_non_differentiable only accepts variable arguments, but got ",
                Py_TYPE(t)->tp_name);
    set.insert(THPVariable_Unpack(t).unsafeGetTensorImpl());
  }
  Py_CLEAR(node.non_differentiable);
  return set;
}

// THPFunction's view_as_self_fn: through Python, as upstream.
at::Tensor view_as_self(const at::Tensor& x) {
  GilAcquire gil;
  THPObjectPtr py_x(THPVariable_Wrap(x));
  if (!py_x) {
    throw python_error();
  }
  THPObjectPtr result(PyObject_CallMethod(py_x.get(), "view_as", "O", py_x.get()));
  if (!result) {
    throw python_error();
  }
  return THPVariable_Unpack(result.get());
}

// process_outputs + _wrap_outputs + _save_variables
PyObject* process_outputs(const c10::intrusive_ptr<CompiledFunctionNode>& node,
                          const variable_list& input_vars, THPObjectPtr raw_output,
                          bool is_executable) {
  bool unpack_output = false;
  if (!PyTuple_Check(raw_output.get())) {  // ensure_tuple
    PyObject* tuple = PyTuple_Pack(1, raw_output.get());
    if (!tuple) {
      throw python_error();
    }
    raw_output = tuple;
    unpack_output = true;
  }
  const Py_ssize_t num_outputs = PyTuple_GET_SIZE(raw_output.get());
  THPObjectPtr outputs(PyTuple_New(num_outputs));
  if (!outputs) {
    throw python_error();
  }
  node->clear_input_metadata();
  auto to_save = tensors_to_save(*node, is_executable);

  auto non_differentiable = parse_non_differentiable(*node);
  std::vector<std::optional<Variable>> raw_output_vars;
  raw_output_vars.reserve(static_cast<size_t>(num_outputs));
  for (Py_ssize_t i = 0; i < num_outputs; i++) {
    PyObject* obj = PyTuple_GET_ITEM(raw_output.get(), i);
    if (THPVariable_Check(obj)) {
      raw_output_vars.emplace_back(THPVariable_Unpack(obj));
    } else {
      raw_output_vars.emplace_back();
    }
  }
  // Inputs carrying forward grads are declined, so _wrap_outputs never asks
  // for a jvp.
  torch::autograd::_jvp_fn_t jvp_fn = [](const variable_list&, const variable_list&) {
    TORCH_INTERNAL_ASSERT(false, "torch_aot_rt: jvp requested from CompiledFunctionBackward");
    return variable_list();
  };
  c10::intrusive_ptr<Node> cdata;
  if (is_executable) {
    cdata = node;
  }
#if TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 14
  c10::intrusive_ptr<Node> attached_node;
  auto wrapped = torch::autograd::_wrap_outputs(input_vars, non_differentiable, {},
                                                raw_output_vars, cdata, jvp_fn, {},
                                                view_as_self, false, attached_node);
#else
  auto wrapped = torch::autograd::_wrap_outputs(input_vars, non_differentiable, {},
                                                raw_output_vars, cdata, jvp_fn, {},
                                                view_as_self, false);
#endif
  if (is_executable) {
    node->output_info.reserve(static_cast<size_t>(num_outputs));
  }
  for (Py_ssize_t i = 0; i < num_outputs; i++) {
    PyObject* obj = PyTuple_GET_ITEM(raw_output.get(), i);
    auto& out = wrapped[static_cast<size_t>(i)];
    if (!THPVariable_Check(obj) || !out.has_value()) {
      if (is_executable) {
        node->output_info.emplace_back();
      }
      PyTuple_SET_ITEM(outputs.get(), i, Py_NewRef(obj));
      continue;
    }
    if (is_executable) {
      // zeros_like for nested outputs, as upstream (never reached: nested
      // inputs are declined, and a graph of dense inputs returns dense)
      bool is_differentiable = non_differentiable.count(out->unsafeGetTensorImpl()) == 0 &&
                               torch::autograd::isDifferentiableType(out->scalar_type());
      bool use_zeros_like = is_differentiable && num_outputs > 1 && out->is_nested();
      node->output_info.emplace_back(out.value(), use_zeros_like);
    }
    PyObject* wrapped_obj = THPVariable_Wrap(std::move(out.value()));
    if (!wrapped_obj) {
      throw python_error();
    }
    PyTuple_SET_ITEM(outputs.get(), i, wrapped_obj);
  }
  // SavedVariables after the outputs got their grad_fn
  if (is_executable && !to_save.empty()) {
    // is_output: the saved tensor is one of the outputs (_save_variables);
    // a scan of the outputs, which are few
    c10::SmallVector<at::TensorImpl*, 8> output_impls;
    for (Py_ssize_t i = 0; i < num_outputs; i++) {
      PyObject* obj = PyTuple_GET_ITEM(outputs.get(), i);
      if (THPVariable_Check(obj)) {
        output_impls.push_back(THPVariable_Unpack(obj).unsafeGetTensorImpl());
      }
    }
    node->saved_variables.clear();
    node->saved_variables.reserve(to_save.size());
    for (const auto& t : to_save) {
      if (!t.has_value()) {
        node->saved_variables.emplace_back();
      } else {
        const at::TensorImpl* impl = t->unsafeGetTensorImpl();
        bool is_output = std::find(output_impls.begin(), output_impls.end(), impl) !=
                         output_impls.end();
        node->saved_variables.emplace_back(*t, is_output);
      }
    }
  }
#if TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 14
  // torch.autograd.graph node-creation hooks, once the node is complete
  if (is_executable && attached_node) {
    torch::autograd::fire_node_creation_hooks(attached_node);
  }
#endif
  if (!is_executable) {
    Py_CLEAR(node->to_save);
    Py_CLEAR(node->non_differentiable);
  }
  if (unpack_output) {
    return Py_NewRef(PyTuple_GET_ITEM(outputs.get(), 0));
  }
  return outputs.release();
}

}  // namespace

PyObject* rt_node_apply(PyObject* cls, PyObject* args, int* declined) noexcept {
  HANDLE_TH_ERRORS
  variable_list input_vars;
  c10::SmallVector<bool, 8> is_variable_input;
  bool any_requires_grad = false;
  *declined = decline_reason(args, input_vars, is_variable_input, any_requires_grad);
  if (*declined != RT_NODE_TAKEN) {
    return nullptr;
  }
  // The C core asked _are_functorch_transforms_active() first; as
  // THPFunction_apply, a functorch TLS with no transform active must allow
  // a single-level function.
  if (const auto& functorch_tls = at::functorch::functorchTLSAccessor()) {
    functorch_tls->checkSupportsSingleLevelAutogradFunction();
  }
  const bool is_executable = c10::GradMode::is_enabled() && any_requires_grad;
  // Node() takes the next sequence number, as PyNode's construction does.
  auto node = c10::make_intrusive<CompiledFunctionNode>();
  if (is_executable) {
    node->set_next_edges(torch::autograd::collect_next_edges(input_vars));
  }
  node->is_variable_input = std::move(is_variable_input);
  node->forward_cls = Py_NewRef(cls);

  THPObjectPtr ctx(torch::autograd::functionToPyObject(node));
  if (!ctx) {
    return nullptr;
  }
  const Py_ssize_t n = PyTuple_GET_SIZE(args);
  THPObjectPtr output;
  {
    THPObjectPtr forward(PyObject_GetAttr(cls, str_forward));
    if (!forward) {
      return nullptr;
    }
    c10::AutoGradMode grad_mode(false);
    at::AutoFwGradMode fw_grad_mode(false);
    PyObject* small[kStackArgs + 1];
    std::vector<PyObject*> large;
    PyObject** stack = small;
    if (n > kStackArgs) {
      large.resize(static_cast<size_t>(n) + 1);
      stack = large.data();
    }
    stack[0] = ctx.get();
    for (Py_ssize_t i = 0; i < n; i++) {
      stack[i + 1] = PyTuple_GET_ITEM(args, i);
    }
    output = PyObject_Vectorcall(forward.get(), stack, static_cast<size_t>(n) + 1, nullptr);
  }
  if (!output) {
    return nullptr;
  }
  return process_outputs(node, input_vars, std::move(output), is_executable);
  END_HANDLE_TH_ERRORS
}

int rt_node_check(PyObject* obj) noexcept {
  return Py_IS_TYPE(obj, &node_type) ? 1 : 0;
}

// The getsets above, by field (attribute access without the look-up)
PyObject* rt_node_get(PyObject* node, int field) noexcept {
  switch (field) {
    case RT_CTX_TO_SAVE:
      return get_slot_attr<&CompiledFunctionNode::to_save>(node, nullptr);
    case RT_CTX_NON_DIFFERENTIABLE:
      return get_slot_attr<&CompiledFunctionNode::non_differentiable>(node, nullptr);
    case RT_CTX_MATERIALIZE_NON_DIFF_GRADS:
      return get_materialize_non_diff_grads(node, nullptr);
    case RT_CTX_TENSORS_NO_VC_CHECK:
      return get_dict_attr<&CompiledFunctionNode::tensors_no_vc_check>(
          node, const_cast<char*>("_tensors_no_vc_check"));
    case RT_CTX_SYMINTS:
      return get_dict_attr<&CompiledFunctionNode::symints>(node, const_cast<char*>("symints"));
    case RT_CTX_OPAQUE_OBJECTS:
      return get_dict_attr<&CompiledFunctionNode::opaque_objects>(
          node, const_cast<char*>("opaque_objects"));
    case RT_CTX_EXTERNAL_OBJECTS:
      return get_dict_attr<&CompiledFunctionNode::external_objects>(
          node, const_cast<char*>("_external_objects"));
    case RT_CTX_SAVED_TENSORS:
      return get_saved_tensors(node, nullptr);
    default:
      PyErr_SetString(PyExc_SystemError, "torch_aot_rt: unknown ctx field");
      return nullptr;
  }
}

int rt_node_set(PyObject* node, int field, PyObject* value) noexcept {
  switch (field) {
    case RT_CTX_TO_SAVE:
      return set_attr<&CompiledFunctionNode::to_save>(node, value, const_cast<char*>("to_save"));
    case RT_CTX_NON_DIFFERENTIABLE:
      return set_attr<&CompiledFunctionNode::non_differentiable>(
          node, value, const_cast<char*>("non_differentiable"));
    case RT_CTX_MATERIALIZE_NON_DIFF_GRADS:
      return set_materialize_non_diff_grads(node, value, nullptr);
    case RT_CTX_TENSORS_NO_VC_CHECK:
      return set_attr<&CompiledFunctionNode::tensors_no_vc_check>(
          node, value, const_cast<char*>("_tensors_no_vc_check"));
    case RT_CTX_SYMINTS:
      return set_attr<&CompiledFunctionNode::symints>(node, value, const_cast<char*>("symints"));
    case RT_CTX_OPAQUE_OBJECTS:
      return set_attr<&CompiledFunctionNode::opaque_objects>(
          node, value, const_cast<char*>("opaque_objects"));
    case RT_CTX_EXTERNAL_OBJECTS:
      return set_attr<&CompiledFunctionNode::external_objects>(
          node, value, const_cast<char*>("_external_objects"));
    default:  // saved_tensors has no setter: what setattr raises
      PyErr_SetString(PyExc_AttributeError, "torch_aot_rt: ctx field is read-only");
      return -1;
  }
}

int rt_node_maybe_clear_saved(PyObject* ctx) noexcept {
  PyObject* r = maybe_clear_saved_tensors(ctx, nullptr);
  if (r == nullptr) {
    return -1;
  }
  Py_DECREF(r);
  return 0;
}

int rt_node_type_init(void) noexcept {
  HANDLE_TH_ERRORS
  // Once per process: torch keeps the type in its typeid map.
  if (node_type.tp_name != nullptr) {
    return 0;
  }
  str_forward = PyUnicode_InternFromString("forward");
  str_backward = PyUnicode_InternFromString("backward");
  if (!str_forward || !str_backward) {
    return -1;
  }
  torch::autograd::_initFunctionPyTypeObject(node_type, kNodeName, node_properties,
                                             node_methods);
  torch::autograd::registerCppFunction(typeid(CompiledFunctionNode), &node_type);
  // torch.autograd.graph.Node's __subclasshook__ recognises C++ nodes by
  // their type being torch._C._functions.<name>.
  THPObjectPtr torch_c(PyImport_ImportModule("torch._C"));
  THPObjectPtr functions(torch_c ? PyObject_GetAttrString(torch_c.get(), "_functions") : nullptr);
  if (!functions ||
      PyObject_SetAttrString(functions.get(), kNodeName, (PyObject*)&node_type) < 0) {
    return -1;
  }
  return 0;
  END_HANDLE_TH_ERRORS_RET(-1)
}
