// compiled_node_compiled_autograd.cpp: CompiledFunction's C++ node under
// compiled autograd (torch._dynamo.compiled_autograd).
//
// Compiled autograd never runs a node's apply. On every backward it asks
// each node of the graph for its state (Node::compiled_args: what
// specializes the cache key, what is lifted into graph inputs); on a cache
// miss each node then traces itself into compiled autograd's FX graph
// (Node::apply_with_saved, with the lifted tensors and sizes swapped for
// proxies). Upstream's node for a CompiledFunction is a PyNode
// (torch/csrc/autograd/python_function.cpp), whose two methods read its ctx
// (a THPFunction) and call back into Python: the key from
// ctx._compiled_autograd_key(), the trace through the compiler's
// proxy_call_backward(...), which inlines AOTAutograd's backward graph. This
// file does the same with the node's CompiledFunctionState in place of the
// THPFunction's fields, collected and swapped in the same order, so the
// cache key, the lifted inputs and the traced graph are upstream's. The
// releases 2.11 to 2.15 run the same code here (the same compiled_autograd.h
// API and proxy_call_backward signature); where the node's ownership
// differs (node_ptr.h) only face_ref does.
#include "compiled_node_impl.h"

#include <torch/csrc/Device.h>
#include <torch/csrc/DynamicTypes.h>
#include <torch/csrc/PyInterpreter.h>
#include <torch/csrc/Size.h>
#include <torch/csrc/dynamo/compiled_autograd.h>
#include <torch/csrc/utils/pybind.h>

using namespace rt_node;
using torch::dynamo::autograd::CompiledNodeArgs;
using torch::dynamo::autograd::SizeInput;
using torch::dynamo::autograd::SwapSavedVariables;

namespace {

// python_function.cpp's to_py_size: a torch.Size of the sizes, a symbolic
// one (compiled autograd swaps in proxies) as its Python SymInt.
PyObject* to_py_size(const std::vector<c10::SymInt>& size) {
  THPObjectPtr ret(THPSizeType.tp_alloc(&THPSizeType, static_cast<Py_ssize_t>(size.size())));
  if (!ret) {
    throw_python_error();
  }
  for (size_t i = 0; i < size.size(); i++) {
    PyObject* item = nullptr;
    if (auto maybe_int = size[i].maybe_as_int(); maybe_int.has_value()) {
      item = PyLong_FromLongLong(*maybe_int);
    } else {
      item = py::cast(size[i]).release().ptr();
    }
    if (item == nullptr) {
      throw_python_error();
    }
    PyTuple_SET_ITEM(ret.get(), static_cast<Py_ssize_t>(i), item);
  }
  return ret.release();
}

// What collect(std::vector<bool>) collects, for the node's SmallVector.
void collect_bools(CompiledNodeArgs& args, c10::ArrayRef<bool> bits) {
  args.collect_size(bits.size());
  for (bool b : bits) {
    args.collect(b);
  }
}

}  // namespace

namespace rt_node {

// PyNode::compiled_args
void CompiledFunctionNode::compiled_args(CompiledNodeArgs& args) const {
  GilAcquire gil;
  const CompiledFunctionState& st = state();
  THPObjectPtr face(face_ref());
  if (!face) {
    throw_python_error();
  }
  THPObjectPtr pykey(PyObject_CallMethodNoArgs(
      face.get(), str_compiled_autograd_key));
  if (!pykey) {
    throw_python_error();
  }
  TORCH_CHECK(PyTuple_CheckExact(pykey.get()),
              "_compiled_autograd_key should return tuple of ints");
  const Py_ssize_t size = PyTuple_GET_SIZE(pykey.get());
  TORCH_INTERNAL_ASSERT(size > 0);
  // the first value is the unique id managed by AUTOGRAD_FUNCTION_COUNTER
  const Py_ssize_t key = PyLong_AsSsize_t(PyTuple_GET_ITEM(pykey.get(), 0));
  if (C10_UNLIKELY(key < 0)) {
    TORCH_CHECK(PyErr_Occurred(), "key must be positive");
    throw_python_error();
  }
  args.collect_size(static_cast<size_t>(key));
  args.collect_size(static_cast<size_t>(size));

  st.compiled_autograd_symints.clear();
  st.compiled_autograd_symints.reserve(static_cast<size_t>(size - 1));
  for (Py_ssize_t i = 1; i < size; i++) {
    const Py_ssize_t val = PyLong_AsSsize_t(PyTuple_GET_ITEM(pykey.get(), i));
    if (C10_UNLIKELY(val == -1 && PyErr_Occurred())) {
      throw_python_error();
    }
    st.compiled_autograd_symints.emplace_back(val);
  }
  // AOTAutograd's symints are all dynamic
  const auto prior = args.set_default_dyn_type(SizeInput::DYNAMIC);
  args.collect(st.compiled_autograd_symints);
  args.set_default_dyn_type(prior);

  args.collect(st.saved_variables, true);  // always unpacked as output in eager
  args.collect(true);                      // materialize_grads: never switched off
  collect_bools(args, st.is_variable_input);
  args.collect(true);  // needs_input_grad: the tuple is set by every forward
  args.collect(st.materialize_non_diff_grads);
  args.collect(st.output_info);
  args.collect(st.input_info());

  c10::SafePyObject backward_obj(face.release(), getPyInterpreter());
  std::optional<c10::SafePyObject> backward_state_obj;
  PyObject* bw_state = st.compiled_autograd_backward_state;
  if (args.cond(bw_state != nullptr)) {
    backward_state_obj = c10::SafePyObject(Py_NewRef(bw_state), getPyInterpreter());
  }
  // ctx.opaque_objects, read by name as PyNode reads it (any error cleared:
  // none then)
  std::vector<c10::SafePyObject> opaque_objs;
  if (THPObjectPtr opaque{PyObject_GetAttr(backward_obj.ptr(getPyInterpreter()),
                                           str_opaque_objects)}) {
    const Py_ssize_t n = PySequence_Size(opaque.get());
    if (n > 0) {
      opaque_objs.reserve(static_cast<size_t>(n));
      for (Py_ssize_t i = 0; i < n; i++) {
        PyObject* item = PySequence_GetItem(opaque.get(), i);
        if (item == nullptr) {
          throw_python_error();
        }
        opaque_objs.emplace_back(item, getPyInterpreter());
      }
    } else if (n < 0) {
      PyErr_Clear();
    }
  } else {
    PyErr_Clear();
  }
  args.collect_pynode_objs(this, std::move(backward_obj), std::move(backward_state_obj),
                           std::move(opaque_objs));
}

// Compiled autograd's capture calls py_compiler.set_node_origin(name, i,
// ctx) before each node's hooks and apply_with_saved, with the ctx only for
// a PyNode (a dynamic_cast, to a type libtorch_python does not export), None
// for this node. With the ctx it raises for a CompiledFunction whose
// backward AOTAutogradCache saved without its lazy-backward info; that check
// is made here, before the trace, by the same method with the face. (With
// None it labels the traced nodes' stack traces without the AOT id:
// docs/compatibility.md.)
static void check_node_origin(PyObject* py_compiler, PyObject* forward_cls, PyObject* face) {
  if (PyObject_HasAttr(forward_cls, str_aot_id) != 1) {
    return;
  }
  THPObjectPtr lazy(PyObject_GetAttr(forward_cls, str_lazy_backward_info));
  if (!lazy) {
    throw_python_error();
  }
  if (!Py_IsNone(lazy.get())) {
    return;
  }
  THPObjectPtr name(PyUnicode_FromString(kNodeName));
  if (!name) {
    throw_python_error();
  }
  THPObjectPtr index(PyLong_FromLong(0));
  if (!index) {
    throw_python_error();
  }
  PyObject* argv[] = {py_compiler, name.get(), index.get(), face};
  THPObjectPtr r(PyObject_VectorcallMethod(str_set_node_origin, argv, 4, nullptr));
  if (!r) {
    throw_python_error();
  }
}

// PyNode::apply_with_saved: the collected state swapped for the trace's
// proxies around the trace, in compiled_args' order.
variable_list CompiledFunctionNode::apply_with_saved(const variable_list& inputs,
                                                     SwapSavedVariables& saved) {
  CompiledFunctionState& st = state();
  {
    GilAcquire gil;
    THPObjectPtr face(face_ref());
    if (!face) {
      throw_python_error();
    }
    check_node_origin(saved.get_py_compiler(), st.forward_cls, face.get());
  }
  saved.before(st.compiled_autograd_symints);
  saved.before(st.saved_variables);
  saved.before(st.materialize_non_diff_grads);
  saved.before(st.output_info);
  saved.before(st.input_info());
  variable_list result = apply_with_saved_impl(inputs, saved);
  saved.after(st.compiled_autograd_symints);
  saved.after(st.saved_variables);
  saved.after(st.materialize_non_diff_grads);
  saved.after(st.output_info);
  saved.after(st.input_info());
  return result;
}

// PyNode::apply_with_saved_impl
variable_list CompiledFunctionNode::apply_with_saved_impl(const variable_list& inputs,
                                                          const SwapSavedVariables& saved) {
  GilAcquire gil;
  at::OptionalDeviceGuard device_guard;
  CompiledFunctionState& st = state();
  THPObjectPtr face(face_ref());
  if (!face) {
    throw_python_error();
  }
  // PyNode::to_py_args: the grads as a tuple, an undefined one materialized
  // as apply does
  const size_t num_inputs = inputs.size();
  THPObjectPtr py_inputs(PyTuple_New(static_cast<Py_ssize_t>(num_inputs)));
  if (!py_inputs) {
    throw_python_error();
  }
  for (size_t i = 0; i < num_inputs; i++) {
    PyObject* grad = nullptr;
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
    PyTuple_SET_ITEM(py_inputs.get(), static_cast<Py_ssize_t>(i), grad);
  }

  // The gradients the backward returns match the forward's inputs and
  // their metadata: (layout, device, dtype, size) per tensor input, None
  // for the others.
  const auto& is_variable_input = st.is_variable_input;
  const auto& input_info = st.input_info();
  TORCH_INTERNAL_ASSERT(is_variable_input.size() >= input_info.size());
  THPObjectPtr fwd_input_metadatas(PyTuple_New(static_cast<Py_ssize_t>(is_variable_input.size())));
  if (!fwd_input_metadatas) {
    throw_python_error();
  }
  size_t offset = 0;
  for (size_t i = 0; i < is_variable_input.size(); i++) {
    if (!is_variable_input[i]) {
      PyTuple_SET_ITEM(fwd_input_metadatas.get(), static_cast<Py_ssize_t>(i), Py_NewRef(Py_None));
      offset++;
      continue;
    }
    const VariableInfo& info = input_info[i - offset];
    THPObjectPtr device(THPDevice_New(info.device));
    if (!device) {
      throw_python_error();
    }
    THPObjectPtr size(to_py_size(info.size));
    PyObject* meta = PyTuple_Pack(4, reinterpret_cast<PyObject*>(torch::getTHPLayout(info.layout)),
                                  device.get(),
                                  reinterpret_cast<PyObject*>(torch::getTHPDtype(info.scalar_type)),
                                  size.get());
    if (meta == nullptr) {
      throw_python_error();
    }
    PyTuple_SET_ITEM(fwd_input_metadatas.get(), static_cast<Py_ssize_t>(i), meta);
  }

  // unpack_saved_variables, with the proxies swapped in
  TORCH_CHECK(!st.has_freed_buffers, torch::autograd::ERR_BACKWARD_TWICE);
  THPObjectPtr saved_tensors(PyTuple_New(static_cast<Py_ssize_t>(st.saved_variables.size())));
  if (!saved_tensors) {
    throw_python_error();
  }
  for (size_t i = 0; i < st.saved_variables.size(); i++) {
    Variable var = st.saved_variables[i].unpack(getptr());
    PyObject* value = var.defined() ? THPVariable_Wrap(var) : Py_NewRef(Py_None);
    if (value == nullptr) {
      throw_python_error();
    }
    PyTuple_SET_ITEM(saved_tensors.get(), static_cast<Py_ssize_t>(i), value);
  }

  auto [bwd_idx, maybe_bwd_state_idx, opaque_obj_indices] = saved.retrieve_pynode_objs(this);
  THPObjectPtr backward_state_idx;
  if (maybe_bwd_state_idx.has_value()) {
    backward_state_idx = PyLong_FromUnsignedLongLong(maybe_bwd_state_idx.value());
    if (!backward_state_idx) {
      throw_python_error();
    }
    Py_CLEAR(st.compiled_autograd_backward_state);
  } else {
    backward_state_idx = Py_NewRef(Py_None);
  }
  THPObjectPtr opaque_indices(PyList_New(static_cast<Py_ssize_t>(opaque_obj_indices.size())));
  if (!opaque_indices) {
    throw_python_error();
  }
  for (size_t i = 0; i < opaque_obj_indices.size(); i++) {
    PyObject* idx = PyLong_FromUnsignedLongLong(opaque_obj_indices[i]);
    if (idx == nullptr) {
      throw_python_error();
    }
    PyList_SET_ITEM(opaque_indices.get(), static_cast<Py_ssize_t>(i), idx);
  }
  THPObjectPtr py_bwd_idx(PyLong_FromLong(static_cast<long>(bwd_idx)));
  if (!py_bwd_idx) {
    throw_python_error();
  }
  PyObject* argv[] = {saved.get_py_compiler(), py_inputs.get(),    fwd_input_metadatas.get(),
                      saved_tensors.get(),     py_bwd_idx.get(),   face.get(),
                      backward_state_idx.get(), opaque_indices.get()};
  THPObjectPtr r(PyObject_VectorcallMethod(
      str_proxy_call_backward, argv, 8, nullptr));
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
  return to_variable_list(r.get());
}

}  // namespace rt_node
