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
// compiled_node_face.cpp registers, named "CompiledFunctionBackward" like
// upstream's.
//
// The C core's CompiledForward / CompiledBackward plans run unchanged: they
// speak to a ctx through the attributes upstream's ctx has (to_save,
// non_differentiable, symints, ...), which this type provides as getsets on
// the node. Where the node cannot be exactly upstream's, node_apply declines
// before anything observable happened and the C core takes upstream's
// Function.apply (see csrc/torch_cpp_api.h for the reasons).
#include "compiled_node_impl.h"
#include "tensor_kinds.h"

using namespace rt_node;

namespace rt_node {

// PyNode::apply: grads to Python (PyNode::to_py_args), then
// cls.backward(ctx, grads) as apply_boxed does for a boxed_grads_call
// Function (looked up per call, as there), then the result checked and
// converted back (PyNode::to_variable_list).
variable_list CompiledFunctionNode::apply(variable_list&& inputs) {
  GilAcquire gil;
  at::OptionalDeviceGuard device_guard;
  CompiledFunctionState& st = state();
  THPObjectPtr self(face_ref());
  if (!self) {
    throw_python_error();
  }
  const size_t num_inputs = inputs.size();
  // PyNode::to_py_args. 2.13 on, a list (what apply_boxed gets: the
  // backward can drop each grad); 2.11/2.12, the tuple PyNode passes to
  // ctx.apply(*grads).
  THPObjectPtr grads(kBackwardBoxed ? PyList_New(static_cast<Py_ssize_t>(num_inputs))
                                    : PyTuple_New(static_cast<Py_ssize_t>(num_inputs)));
  if (!grads) {
    throw_python_error();
  }
  for (size_t i = 0; i < num_inputs; i++) {
    PyObject* grad = nullptr;
    // materialize_grads is never switched off for CompiledFunction
    if (inputs[i].defined() ||
        (input_metadata(i).was_default_constructed() && !st.materialize_non_diff_grads)) {
      grad = THPVariable_Wrap(inputs[i]);
    } else {
      Variable zeros;
      {
        GilRelease nogil;
        zeros = st.output_info[i].zeros(device_guard);
      }
      grad = THPVariable_Wrap(zeros);
    }
    if (!grad) {
      throw_python_error();
    }
    if constexpr (kBackwardBoxed) {
      PyList_SET_ITEM(grads.get(), static_cast<Py_ssize_t>(i), grad);
    } else {
      PyTuple_SET_ITEM(grads.get(), static_cast<Py_ssize_t>(i), grad);
    }
  }
  // 2.13 on, PyNode::apply drops the engine's references to the grads here
  // (the list is then their only holder); 2.11/2.12's keeps them until the
  // engine's call_function returns (a grad's C++ owner the backward can see:
  // a tensor whose impl has another owner keeps its PyObject referenced).
  if constexpr (kBackwardBoxed) {
    inputs.clear();
  }

  THPObjectPtr backward(PyObject_GetAttr(st.forward_cls, str_backward));
  if (!backward) {
    throw_python_error();
  }
  THPObjectPtr r;
  if constexpr (kBackwardBoxed) {
    // cls.backward(ctx, grads), as apply_boxed for a boxed_grads_call
    // Function (looked up per call, as there)
    PyObject* argv[2] = {self.get(), grads.get()};
    r = PyObject_Vectorcall(backward.get(), argv, 2, nullptr);
    grads = nullptr;
  } else {
    // 2.11/2.12: PyObject_CallObject(ctx.apply, grads), i.e.
    // BackwardCFunction.apply(ctx, *grads): its args a tuple of their own;
    // this tuple too held until it returns, as PyNode::apply's
    // (a new tuple: PyTuple_GetSlice would give this one back)
    THPObjectPtr args(PyTuple_New(static_cast<Py_ssize_t>(num_inputs)));
    if (!args) {
      throw_python_error();
    }
    for (size_t i = 0; i < num_inputs; i++) {
      PyTuple_SET_ITEM(args.get(), static_cast<Py_ssize_t>(i),
                       Py_NewRef(PyTuple_GET_ITEM(grads.get(), static_cast<Py_ssize_t>(i))));
    }
    r = call_unboxed(backward.get(), self.get(), args.get());
    args = nullptr;
    grads = nullptr;
  }
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
  const auto num_forward_inputs = static_cast<Py_ssize_t>(st.is_variable_input.size());
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

PyObject* CompiledFunctionNode::face_ref() const {
#if RT_NODE_INTRUSIVE
  return torch::autograd::functionToPyObject(const_cast<CompiledFunctionNode*>(this)->getptr());
#else
  return Py_NewRef(face);
#endif
}

variable_list CompiledFunctionNode::to_variable_list(PyObject* grads) const {
  const auto n = PyTuple_GET_SIZE(grads);
  variable_list results;
  results.reserve(static_cast<size_t>(n));
  for (Py_ssize_t i = 0; i < n; i++) {
    PyObject* grad = PyTuple_GET_ITEM(grads, i);
    if (!state().is_variable_input[static_cast<size_t>(i)]) {
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

}  // namespace rt_node

namespace {

// forward's arguments go on the C stack up to this many (more: a heap vector)
constexpr Py_ssize_t kStackArgs = 16;

// Why a call cannot be exactly upstream's with this node (checked before
// anything observable happens), or RT_NODE_TAKEN.
int decline_reason(PyObject* args, variable_list& input_vars,
                   c10::SmallVector<bool, 8>& is_variable_input,
                   c10::SmallVector<bool, 8>& needs_input_grad, bool& any_requires_grad) {
  if (torch::jit::tracer::isTracing()) {
    return RT_NODE_JIT_TRACING;  // _trace_pre_record/_trace_post_record
  }
  if (at::hasCallbacks()) {
    return RT_NODE_RECORD_FUNCTION;  // RECORD_FUNCTION with upstream's inputs
  }
  // Tensors whose autograd.Function runs through Python dispatch, functorch,
  // functionalization or nested-tensor zeros: upstream's path handles them.
  const Py_ssize_t n = PyTuple_GET_SIZE(args);
  input_vars.reserve(static_cast<size_t>(n));
  is_variable_input.reserve(static_cast<size_t>(n));
  needs_input_grad.reserve(static_cast<size_t>(n));
  for (Py_ssize_t i = 0; i < n; i++) {
    PyObject* arg = PyTuple_GET_ITEM(args, i);
    if (!THPVariable_Check(arg)) {
      is_variable_input.push_back(false);
      needs_input_grad.push_back(false);
      continue;
    }
    if (!THPVariable_CheckExact(arg)) {
      return RT_NODE_TENSOR_KIND;
    }
    const at::Tensor& t = THPVariable_Unpack(arg);
    if (t.key_set().has_any(rt_tensor_kinds::kPythonFacing) || t.is_nested()) {
      return RT_NODE_TENSOR_KIND;
    }
    // Forward AD would call the (unimplemented) jvp through Python.
    auto* meta = torch::autograd::impl::get_autograd_meta(t);
    if (meta != nullptr && meta->fw_grad_ && !meta->fw_grad_->empty()) {
      return RT_NODE_FORWARD_AD;
    }
    is_variable_input.push_back(true);
    needs_input_grad.push_back(t.requires_grad());
    any_requires_grad |= t.requires_grad();
    input_vars.push_back(t);
  }
  return RT_NODE_TAKEN;
}

// _get_tensors_to_save (no setup_context)
std::vector<std::optional<at::Tensor>> tensors_to_save(CompiledFunctionState& node,
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
std::unordered_set<at::TensorImpl*> parse_non_differentiable(CompiledFunctionState& node) {
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
PyObject* process_outputs(const NodePtr<CompiledFunctionNode>& node,
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
  CompiledFunctionState& st = node->state();
  // type, device and size of the tensor inputs, for compiled autograd
  if (is_executable) {
    st.record_inputs(input_vars);
  }
  auto to_save = tensors_to_save(st, is_executable);

  auto non_differentiable = parse_non_differentiable(st);
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
  NodePtr<Node> cdata;
  if (is_executable) {
    cdata = node;
  }
#if RT_WRAP_OUTPUTS_ATTACHES_NODE
  NodePtr<Node> attached_node;
  auto wrapped = torch::autograd::_wrap_outputs(input_vars, non_differentiable, {},
                                                raw_output_vars, cdata, jvp_fn, {},
                                                view_as_self, false, attached_node);
#else
  auto wrapped = torch::autograd::_wrap_outputs(input_vars, non_differentiable, {},
                                                raw_output_vars, cdata, jvp_fn, {},
                                                view_as_self, false);
#endif
  if (is_executable) {
    st.output_info.reserve(static_cast<size_t>(num_outputs));
  }
  for (Py_ssize_t i = 0; i < num_outputs; i++) {
    PyObject* obj = PyTuple_GET_ITEM(raw_output.get(), i);
    auto& out = wrapped[static_cast<size_t>(i)];
    if (!THPVariable_Check(obj) || !out.has_value()) {
      if (is_executable) {
        st.output_info.emplace_back();
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
      st.output_info.emplace_back(out.value(), use_zeros_like);
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
    st.saved_variables.clear();
    st.saved_variables.reserve(to_save.size());
    for (const auto& t : to_save) {
      if (!t.has_value()) {
        st.saved_variables.emplace_back();
      } else {
        const at::TensorImpl* impl = t->unsafeGetTensorImpl();
        bool is_output = std::find(output_impls.begin(), output_impls.end(), impl) !=
                         output_impls.end();
        st.saved_variables.emplace_back(*t, is_output);
      }
    }
  }
#if RT_WRAP_OUTPUTS_ATTACHES_NODE
  // torch.autograd.graph node-creation hooks, once the node is complete
  if (is_executable && attached_node) {
    torch::autograd::fire_node_creation_hooks(attached_node);
  }
#endif
  if (!is_executable) {
    Py_CLEAR(st.to_save);
    Py_CLEAR(st.non_differentiable);
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
  c10::SmallVector<bool, 8> needs_input_grad;
  bool any_requires_grad = false;
  *declined = decline_reason(args, input_vars, is_variable_input, needs_input_grad,
                             any_requires_grad);
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
  auto node = new_compiled_node();
  if (!node) {
    return nullptr;
  }
  if (is_executable) {
    node->set_next_edges(torch::autograd::collect_next_edges(input_vars));
  }
  node->state().is_variable_input = std::move(is_variable_input);
  node->state().needs_input_grad = std::move(needs_input_grad);
  node->state().forward_cls = Py_NewRef(cls);

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
