// compiled_node_face.cpp: the Python face of CompiledFunction's C++ node
// (compiled_node.cpp): grad_fn, of a type registered as
// torch._C._functions.CompiledFunctionBackward, with the ctx attributes
// upstream's BackwardCFunction has and the C forward/backward plans use
// (ctx_properties, ctx_methods: both faces). From 2.13 on the face is a
// THPCppFunction (this file, below); on 2.11/2.12 it has THPFunction's
// ownership (compiled_node_face_owned.cpp). See node_ptr.h.
#include "compiled_node_impl.h"

#include <torch/csrc/utils/pybind.h>

#include <cstring>

using namespace rt_node;
using torch::autograd::THPCppFunction_input_metadata;
using torch::autograd::THPCppFunction_metadata;
using torch::autograd::THPCppFunction_name;
using torch::autograd::THPCppFunction_next_functions;
using torch::autograd::THPCppFunction_register_hook;
using torch::autograd::THPCppFunction_register_hook_dict;
using torch::autograd::THPCppFunction_register_prehook;
using torch::autograd::THPCppFunction_requires_grad;
using torch::autograd::THPCppFunction_sequence_nr;

namespace rt_node {
PyTypeObject node_type;
PyObject* str_forward = nullptr;
PyObject* str_backward = nullptr;
PyObject* str_backward_cls = nullptr;
PyObject* str_autograd_function_id = nullptr;
PyObject* str_compiled_autograd_key = nullptr;
PyObject* str_opaque_objects = nullptr;
PyObject* str_lazy_backward_info = nullptr;
PyObject* str_aot_id = nullptr;
PyObject* str_proxy_call_backward = nullptr;
PyObject* str_set_node_origin = nullptr;
}  // namespace rt_node

namespace {

// ---------------------------------------------------------------------------
// What both faces share: the ctx state (CompiledFunctionState, wherever it
// lives: state_of_face) and the backward called by hand.

// THPFunction_saved_tensors / unpack_saved_variables
PyObject* get_saved_tensors(PyObject* self, void* /*closure*/) {
  HANDLE_TH_ERRORS
  const CompiledFunctionState& st = state_of_face(self);
  TORCH_CHECK(!st.has_freed_buffers, torch::autograd::ERR_BACKWARD_TWICE);
  const auto& saved = st.saved_variables;
  THPObjectPtr result(PyTuple_New(static_cast<Py_ssize_t>(saved.size())));
  if (!result) {
    return nullptr;
  }
  if (saved.empty()) {
    return result.release();
  }
  // buffers are freed when the node dies (deleteNode: release_variables),
  // so it is alive here (unpack_saved_variables' assert)
  auto saved_for = node_ref_of_face(self);
  TORCH_INTERNAL_ASSERT(saved_for);
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
template <PyObject* CompiledFunctionState::*field>
PyObject* get_dict_attr(PyObject* self, void* closure) {
  PyObject* value = state_of_face(self).*field;
  if (value == nullptr) {
    PyErr_Format(PyExc_AttributeError, "'%s' object has no attribute '%s'", kNodeName,
                 static_cast<const char*>(closure));
    return nullptr;
  }
  return Py_NewRef(value);
}

// to_save / non_differentiable: THPFunction's getObject (None when unset).
template <PyObject* CompiledFunctionState::*field>
PyObject* get_slot_attr(PyObject* self, void* /*closure*/) {
  PyObject* value = state_of_face(self).*field;
  return Py_NewRef(value ? value : Py_None);
}

template <PyObject* CompiledFunctionState::*field>
int set_attr(PyObject* self, PyObject* value, void* closure) {
  if (value == nullptr) {
    PyErr_Format(PyExc_AttributeError, "cannot delete attribute '%s'",
                 static_cast<const char*>(closure));
    return -1;
  }
  Py_XSETREF(state_of_face(self).*field, Py_NewRef(value));
  return 0;
}

PyObject* get_materialize_non_diff_grads(PyObject* self, void* /*closure*/) {
  return PyBool_FromLong(state_of_face(self).materialize_non_diff_grads);
}

int set_materialize_non_diff_grads(PyObject* self, PyObject* value, void* /*closure*/) {
  if (value == nullptr || !PyBool_Check(value)) {
    PyErr_SetString(PyExc_TypeError, "_materialize_non_diff_grads must be a bool");
    return -1;
  }
  state_of_face(self).materialize_non_diff_grads = Py_IsTrue(value);
  return 0;
}

// THPFunction_maybe_clear_saved_tensors: the node's release_variables when
// not keeping the graph (a method call: the GIL is held).
PyObject* maybe_clear_saved_tensors(PyObject* self, PyObject* /*noargs*/) {
  HANDLE_TH_ERRORS
  if (!torch::autograd::get_current_graph_task_keep_graph()) {
    CompiledFunctionState& st = state_of_face(self);
    st.saved_variables.clear();
    st.has_freed_buffers = true;
  }
  Py_RETURN_NONE;
  END_HANDLE_TH_ERRORS
}

#if RT_NODE_BOXED_BACKWARD
// BackwardCFunction.apply(*grads) and apply_boxed(grads): the backward
// called by hand, as `_forward_cls.backward(ctx, [*grads])` and
// `_forward_cls.backward(ctx, grads)` (CompiledFunction has
// boxed_grads_call, and no vjp).
PyObject* call_backward(PyObject* self, PyObject* grads) {
  THPObjectPtr backward(PyObject_GetAttr(state_of_face(self).forward_cls, str_backward));
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
#else
// BackwardCFunction.apply(self, *args) on 2.11/2.12: `user_fn(self, *args)`,
// the backward of _forward_cls (CompiledFunction has no vjp), its grads held
// by the args tuple until it returns. There is no apply_boxed.
PyObject* apply_grads(PyObject* self, PyObject* args) {
  THPObjectPtr backward(PyObject_GetAttr(state_of_face(self).forward_cls, str_backward));
  if (!backward) {
    return nullptr;
  }
  return call_unboxed(backward.get(), self, args);
}
#endif

// THPFunction's needs_input_grad: per forward argument, whether it is a
// tensor that requires grad (a tuple of bools, made on each read here; the
// ctx keeps the one THPFunction_apply made).
PyObject* get_needs_input_grad(PyObject* self, void* /*closure*/) {
  const auto& bits = state_of_face(self).needs_input_grad;
  PyObject* result = PyTuple_New(static_cast<Py_ssize_t>(bits.size()));
  if (result == nullptr) {
    return nullptr;
  }
  for (size_t i = 0; i < bits.size(); i++) {
    PyTuple_SET_ITEM(result, static_cast<Py_ssize_t>(i), PyBool_FromLong(bits[i]));
  }
  return result;
}

// THPFunction_get/set_compiled_autograd_backward_state: None while unset;
// set once (the forward's BackwardState).
PyObject* get_backward_state(PyObject* self, void* /*closure*/) {
  PyObject* value = state_of_face(self).compiled_autograd_backward_state;
  return Py_NewRef(value ? value : Py_None);
}

int set_backward_state(PyObject* self, PyObject* value, void* /*closure*/) {
  HANDLE_TH_ERRORS
  PyObject*& field = state_of_face(self).compiled_autograd_backward_state;
  TORCH_INTERNAL_ASSERT(field == nullptr);
  if (value == nullptr) {  // upstream's setter would take a reference to NULL
    PyErr_SetString(PyExc_AttributeError,
                    "cannot delete attribute '_compiled_autograd_backward_state'");
    return -1;
  }
  field = Py_NewRef(value);
  return 0;
  END_HANDLE_TH_ERRORS_RET(-1)
}

// dirty_tensors: CompiledFunction's forward marks nothing dirty
PyObject* get_none(PyObject* /*self*/, void* /*closure*/) {
  Py_RETURN_NONE;
}

// THPFunction__raw_saved_tensors: the saved variables themselves, as
// torch._C._autograd.SavedTensor (their register_hooks), referencing them.
PyObject* get_raw_saved_tensors(PyObject* self, void* /*closure*/) {
  HANDLE_TH_ERRORS
  const CompiledFunctionState& st = state_of_face(self);
  TORCH_CHECK(!st.has_freed_buffers, torch::autograd::ERR_BACKWARD_TWICE);
  const auto& saved = st.saved_variables;
  THPObjectPtr result(PyTuple_New(static_cast<Py_ssize_t>(saved.size())));
  if (!result) {
    return nullptr;
  }
  for (size_t i = 0; i < saved.size(); i++) {
    py::object obj = py::cast(saved[i], py::return_value_policy::reference);
    PyTuple_SET_ITEM(result.get(), static_cast<Py_ssize_t>(i), obj.release().ptr());
  }
  return result.release();
  END_HANDLE_TH_ERRORS
}

// The ctx's _autograd_function_id, a class attribute of the ctx's type
// (FunctionMeta gives each backward class its own): here the type is not
// the class, so read from it, CompiledFunction._backward_cls.
PyObject* get_autograd_function_id(PyObject* self, void* /*closure*/) {
  THPObjectPtr backward_cls(PyObject_GetAttr(state_of_face(self).forward_cls, str_backward_cls));
  if (!backward_cls) {
    return nullptr;
  }
  return PyObject_GetAttr(backward_cls.get(), str_autograd_function_id);
}

// BackwardCFunction._compiled_autograd_key (torch/autograd/function.py):
// self._forward_cls._compiled_autograd_key(self), which PyNode's (and this
// node's) compiled_args calls.
PyObject* compiled_autograd_key(PyObject* self, PyObject* /*noargs*/) {
  return PyObject_CallMethodOneArg(state_of_face(self).forward_cls, str_compiled_autograd_key,
                                   self);
}

// THPFunction_get_compiled_autograd_symints: the symints compiled_args read
// from the key (while compiled autograd traces, the proxies it swapped in,
// as Python SymInts).
PyObject* get_compiled_autograd_symints(PyObject* self, PyObject* /*noargs*/) {
  HANDLE_TH_ERRORS
  const auto& symints = state_of_face(self).compiled_autograd_symints;
  THPObjectPtr result(PyTuple_New(static_cast<Py_ssize_t>(symints.size())));
  if (!result) {
    return nullptr;
  }
  for (size_t i = 0; i < symints.size(); i++) {
    PyTuple_SET_ITEM(result.get(), static_cast<Py_ssize_t>(i),
                     py::cast(symints[i]).release().ptr());
  }
  return result.release();
  END_HANDLE_TH_ERRORS
}

#define RT_DICT_ATTR(name, field)                                                   \
  {(char*)name, get_dict_attr<&CompiledFunctionState::field>,                       \
   set_attr<&CompiledFunctionState::field>, nullptr, (void*)name}
#define RT_SLOT_ATTR(name, field)                                                   \
  {(char*)name, get_slot_attr<&CompiledFunctionState::field>,                       \
   set_attr<&CompiledFunctionState::field>, nullptr, (void*)name}

}  // namespace

namespace rt_node {

PyGetSetDef ctx_properties[] = {
    {(char*)"saved_tensors", get_saved_tensors, nullptr, nullptr, nullptr},
    {(char*)"_forward_cls", get_slot_attr<&CompiledFunctionState::forward_cls>, nullptr, nullptr,
     nullptr},
    RT_SLOT_ATTR("to_save", to_save),
    RT_SLOT_ATTR("non_differentiable", non_differentiable),
    RT_DICT_ATTR("_tensors_no_vc_check", tensors_no_vc_check),
    RT_DICT_ATTR("symints", symints),
    RT_DICT_ATTR("opaque_objects", opaque_objects),
    RT_DICT_ATTR("_external_objects", external_objects),
    {(char*)"_materialize_non_diff_grads", get_materialize_non_diff_grads,
     set_materialize_non_diff_grads, nullptr, nullptr},
    {(char*)"needs_input_grad", get_needs_input_grad, nullptr, nullptr, nullptr},
    {(char*)"_compiled_autograd_backward_state", get_backward_state, set_backward_state, nullptr,
     nullptr},
    {(char*)"_autograd_function_id", get_autograd_function_id, nullptr, nullptr, nullptr},
    {(char*)"_raw_saved_tensors", get_raw_saved_tensors, nullptr, nullptr, nullptr},
    {(char*)"dirty_tensors", get_none, nullptr, nullptr, nullptr},
    {(char*)"__dict__", PyObject_GenericGetDict, PyObject_GenericSetDict, nullptr, nullptr},
    {nullptr, nullptr, nullptr, nullptr, nullptr},
};

PyMethodDef ctx_methods[] = {
    {(char*)"maybe_clear_saved_tensors", maybe_clear_saved_tensors, METH_NOARGS, nullptr},
    {(char*)"_compiled_autograd_key", compiled_autograd_key, METH_NOARGS, nullptr},
    {(char*)"_get_compiled_autograd_symints", get_compiled_autograd_symints, METH_NOARGS,
     nullptr},
    {(char*)"apply", apply_grads, METH_VARARGS, nullptr},
#if RT_NODE_BOXED_BACKWARD
    {(char*)"apply_boxed", apply_boxed, METH_O, nullptr},
#endif
    {nullptr, nullptr, 0, nullptr},
};

}  // namespace rt_node

int rt_node_check(PyObject* obj) noexcept {
  return Py_IS_TYPE(obj, &node_type) ? 1 : 0;
}

namespace {

// The getsets of ctx_properties by rt_ctx_field (torch_cpp_api.h's order),
// resolved by name at rt_node_type_init: the C core's attribute access
// without the look-up, through the very getset setattr/getattr would find.
constexpr const char* kCtxFieldNames[] = {
    "to_save",        "non_differentiable", "_materialize_non_diff_grads",
    "_tensors_no_vc_check", "symints",      "opaque_objects",
    "_external_objects", "saved_tensors",
};
static_assert(sizeof(kCtxFieldNames) / sizeof(kCtxFieldNames[0]) == RT_CTX_N_FIELDS,
              "one name per rt_ctx_field");
const PyGetSetDef* ctx_field_defs[RT_CTX_N_FIELDS];

int resolve_ctx_fields() {
  for (int f = 0; f < RT_CTX_N_FIELDS; f++) {
    for (const PyGetSetDef* d = ctx_properties; d->name != nullptr; d++) {
      if (std::strcmp(d->name, kCtxFieldNames[f]) == 0) {
        ctx_field_defs[f] = d;
      }
    }
    if (ctx_field_defs[f] == nullptr) {
      PyErr_Format(PyExc_SystemError, "torch_aot_rt: node has no attribute '%s'",
                   kCtxFieldNames[f]);
      return -1;
    }
  }
  return 0;
}

const PyGetSetDef* ctx_field_def(int field) {
  if (field < 0 || field >= RT_CTX_N_FIELDS) {
    PyErr_SetString(PyExc_SystemError, "torch_aot_rt: unknown ctx field");
    return nullptr;
  }
  return ctx_field_defs[field];
}

}  // namespace

PyObject* rt_node_get(PyObject* node, int field) noexcept {
  const PyGetSetDef* d = ctx_field_def(field);
  return d != nullptr ? d->get(node, d->closure) : nullptr;
}

int rt_node_set(PyObject* node, int field, PyObject* value) noexcept {
  const PyGetSetDef* d = ctx_field_def(field);
  if (d == nullptr) {
    return -1;
  }
  if (d->set == nullptr) {  // what setattr raises for a getset without a setter
    PyErr_Format(PyExc_AttributeError, "attribute '%s' of '%s' objects is not writable",
                 d->name, kNodeName);
    return -1;
  }
  return d->set(node, value, d->closure);
}

int rt_node_maybe_clear_saved(PyObject* ctx) noexcept {
  PyObject* r = maybe_clear_saved_tensors(ctx, nullptr);
  if (r == nullptr) {
    return -1;
  }
  Py_DECREF(r);
  return 0;
}

#if RT_NODE_INTRUSIVE
// ---------------------------------------------------------------------------
// The 2.13-on face: a THPCppFunction that owns the node.

namespace {

#if RT_HAS_INPUT_GRAD_BUFFERS
// _FunctionBase._input_grad_buffers (FunctionCtx.input_grad_buffers returns
// it): the engine's current gradient buffers of the forward's inputs, one
// entry per forward argument, None for an argument that is not a tensor and
// for an undefined buffer. As THPFunction's getter: refused with a post-hook
// on the node; then torch's get_current_input_grad_buffers (with the GIL
// released) raises for every state it does not serve (not in backward, not
// this node's backward, create_graph, anomaly mode, post-processing, ...).
PyObject* get_input_grad_buffers(PyObject* self, void* /*closure*/) {
  HANDLE_TH_ERRORS
  CompiledFunctionNode* node = node_of(self);
  TORCH_CHECK(node->post_hooks().empty(),
              "input_grad_buffers does not support post-hooks on the producing autograd "
              "node because directly accumulated gradients are returned as None and cannot "
              "be observed or replaced by those hooks");
  variable_list buffers;
  {
    GilRelease no_gil;
    buffers = torch::autograd::get_current_input_grad_buffers(node);
  }
  const size_t n = node->state().is_variable_input.size();
  THPObjectPtr result(PyTuple_New(static_cast<Py_ssize_t>(n)));
  if (!result) {
    return nullptr;
  }
  size_t variable_idx = 0;
  for (size_t i = 0; i < n; i++) {
    PyObject* value = nullptr;
    if (node->state().is_variable_input[i]) {
      TORCH_INTERNAL_ASSERT(variable_idx < buffers.size());
      const Variable& buffer = buffers[variable_idx++];
      value = buffer.defined() ? THPVariable_Wrap(buffer) : Py_NewRef(Py_None);
      if (value == nullptr) {
        return nullptr;
      }
    } else {
      value = Py_NewRef(Py_None);
    }
    PyTuple_SET_ITEM(result.get(), static_cast<Py_ssize_t>(i), value);
  }
  TORCH_INTERNAL_ASSERT(variable_idx == buffers.size());
  return result.release();
  END_HANDLE_TH_ERRORS
}
#endif

}  // namespace

// Its face is made on demand by functionToPyObject (registerCppFunction).
NodePtr<CompiledFunctionNode> rt_node::new_compiled_node() {
  return make_node<CompiledFunctionNode>();
}

namespace {

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

PyGetSetDef node_properties[] = {
    THP_FUNCTION_DEFAULT_PROPERTIES,
#if RT_HAS_INPUT_GRAD_BUFFERS
    {(char*)"_input_grad_buffers", get_input_grad_buffers, nullptr, nullptr, nullptr},
    {(char*)"input_grad_buffers", get_input_grad_buffers, nullptr, nullptr, nullptr},
#endif
    {nullptr, nullptr, nullptr, nullptr, nullptr},
};

PyMethodDef node_methods[] = {
    {(char*)"_register_hook_dict", THPCppFunction_register_hook_dict, METH_O, nullptr},
    {(char*)"register_hook", THPCppFunction_register_hook, METH_O, nullptr},
    {(char*)"register_prehook", THPCppFunction_register_prehook, METH_O, nullptr},
    {(char*)"name", THPCppFunction_name, METH_NOARGS, nullptr},
    {(char*)"_sequence_nr", THPCppFunction_sequence_nr, METH_NOARGS, nullptr},
    {(char*)"_set_sequence_nr", set_sequence_nr, METH_O, nullptr},
    {nullptr, nullptr, 0, nullptr},
};

// Garbage collection. Upstream's ctx (a BackwardCFunction, a THPFunction)
// keeps what CompiledFunction.forward stores on it in its own fields and its
// __dict__, and THPFunction_traverse / subtype_traverse visit them whatever
// the node's other owners; its PyNode is reached from a tensor's traverse
// (THPVariable_traverse visits grad_fn->pyobj() when the tensor is the
// grad_fn's only owner besides that object). Here the same objects live in
// the C++ node, whose Python face (this type) plays the ctx's part: torch
// keeps the face alive as long as the node has other owners (the
// kHasPyObject preservation of intrusive_ptr<Node>), and the face owns the
// node. So the face reports the node's Python objects as its own, as the
// ctx reports its __dict__, and clears them as subtype_clear clears that
// dict: a cycle through an object saved for backward (an opaque object
// that refers back to an output or to its grad_fn) is collected exactly
// when upstream's is. torch's own traverse (THPCppFunction_traverse: the
// node's hook dicts, only while the face is the node's sole owner) runs
// first; its type has no tp_clear. Both ask node_ptr.h's face_owns_node,
// which is where this ownership is spelled. (On shared_ptr headers, 2.11
// and 2.12, the node owns its face instead: compiled_node_face_owned.cpp.)
traverseproc torch_traverse = nullptr;
destructor torch_dealloc = nullptr;

int face_traverse(PyObject* self, visitproc visit, void* arg) {
  if (torch_traverse != nullptr) {
    int rc = torch_traverse(self, visit, arg);
    if (rc != 0) {
      return rc;
    }
  }
  Py_VISIT(face_slots(self).dict);
  auto* face = reinterpret_cast<THPCppFunction*>(self);
  if (!face_owns_node(face)) {
    return 0;
  }
  return node_of(self)->state().traverse(visit, arg);
}

// THPFunction_clear + the __dict__ clear. forward_cls is kept (a class, as
// the ctx keeps its type): the node's apply and the face's apply read it.
int face_clear(PyObject* self) {
  Py_CLEAR(face_slots(self).dict);
  auto* face = reinterpret_cast<THPCppFunction*>(self);
  if (!face_owns_node(face)) {
    return 0;
  }
  node_of(self)->state().clear_ctx_objects();
  return 0;
}

// subtype_dealloc's order: weak references and __dict__, then the base's
// (THPCppFunction's, which untracks, releases the node and frees).
void face_dealloc(PyObject* self) {
  PyObject_GC_UnTrack(self);
  face_slots_dealloc(self);
  torch_dealloc(self);
}

}  // namespace

int rt_node::face_type_init() {
  // the THPCppFunction's getsets and methods, then the ctx's
  static std::vector<PyGetSetDef> properties = joined(node_properties, ctx_properties);
  static std::vector<PyMethodDef> methods = joined(node_methods, ctx_methods);
  torch::autograd::_initFunctionPyTypeObject(node_type, kNodeName, properties.data(),
                                             methods.data());
  // Our traverse around torch's, and a clear (see face_traverse). The type
  // is static, ready and has no subtypes (not a base type): the GC reads
  // these slots from it on every collection.
  torch_traverse = node_type.tp_traverse;
  node_type.tp_traverse = face_traverse;
  node_type.tp_clear = face_clear;
  // FaceSlots after torch's layout: no face exists yet (functionToPyObject
  // allocates each with tp_alloc, which reads tp_basicsize and zeroes the
  // slots); CPython reads both offsets from the type at each use.
  node_type.tp_basicsize = kFaceSlotsOffset + static_cast<Py_ssize_t>(sizeof(FaceSlots));
  node_type.tp_weaklistoffset = kFaceWeaklistOffset;
  node_type.tp_dictoffset = kFaceDictOffset;
  torch_dealloc = node_type.tp_dealloc;
  node_type.tp_dealloc = face_dealloc;
  PyType_Modified(&node_type);
  torch::autograd::registerCppFunction(typeid(CompiledFunctionNode), &node_type);
  return 0;
}

#endif  // RT_NODE_INTRUSIVE

int rt_node_type_init(void) noexcept {
  HANDLE_TH_ERRORS
  // Once per process: torch keeps the type in its typeid map.
  if (node_type.tp_name != nullptr) {
    return 0;
  }
  const std::pair<PyObject**, const char*> names[] = {
      {&str_forward, "forward"},
      {&str_backward, "backward"},
      {&str_backward_cls, "_backward_cls"},
      {&str_autograd_function_id, "_autograd_function_id"},
      {&str_compiled_autograd_key, "_compiled_autograd_key"},
      {&str_opaque_objects, "opaque_objects"},
      {&str_lazy_backward_info, "_lazy_backward_info"},
      {&str_aot_id, "_aot_id"},
      {&str_proxy_call_backward, "proxy_call_backward"},
      {&str_set_node_origin, "set_node_origin"},
  };
  for (const auto& [slot, name] : names) {
    if ((*slot = PyUnicode_InternFromString(name)) == nullptr) {
      return -1;
    }
  }
  if (resolve_ctx_fields() < 0) {
    return -1;
  }
  if (face_type_init() < 0) {
    return -1;
  }
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
