// compiled_node_face_owned.cpp: the grad_fn of CompiledFunction's C++ node
// on torch 2.11/2.12 (std::shared_ptr<Node> headers, node_ptr.h).
//
// There a THPCppFunction owns its node and lives only while referenced, a
// new one made whenever the last died; upstream's grad_fn is the ctx (a
// THPFunction, BackwardCFunction) that its PyNode owns. So this face has
// THPFunction's shape instead (python_function.h/.cpp):
//
// - the node owns it (CompiledFunctionNode::face, PyNode::obj) and it is
//   the node's pyobj(), so functionToPyObject gives the same object for the
//   node's whole life, and a tensor's traverse reports it to the GC when the
//   tensor owns the node alone (THPVariable_subclass_traverse visits
//   grad_fn->pyobj());
// - it points back weakly (THPFunction::cdata): once the node is gone, what
//   needs the node raises upstream's errors (check_legacy_fn_attr_access,
//   THPFunction_metadata's), and the ctx state it holds stays readable;
// - it holds the ctx state (CompiledFunctionState, the THPFunction fields
//   and what forward stores in ctx.__dict__), which its traverse reports and
//   its clear drops whatever the node's other owners, as THPFunction_traverse
//   / THPFunction_clear and subtype_traverse / subtype_clear do for the
//   ctx's fields and __dict__; the saved variables and the node's hooks are
//   not visited there, nor here;
// - it takes weak references and has a __dict__ (the ctx is an instance
//   of a Python class); it is not callable (a THPFunction is not);
// - it starts with THPCppFunction's layout, its cdata a view of the node,
//   and its type is registered as a C++ node's: torch's C++ that accepts a
//   grad_fn (_will_engine_execute_node, a GradientEdge given to
//   autograd.grad/backward) reads it as it reads a THPFunction's.
#include "compiled_node_impl.h"

#if !RT_NODE_INTRUSIVE

#include <torch/csrc/autograd/python_anomaly_mode.h>

#include <cstddef>
#include <memory>
#include <new>

using namespace rt_node;

namespace {

// check_legacy_fn_attr_access (python_function.cpp), word for word ("new‑style"
// with U+2011, as torch's source has it).
NodePtr<Node> node_or_raise(PyObject* self, const char* attr) {
  NodePtr<Node> node = node_ref_of_face(self);
  TORCH_CHECK(node, "Attribute '", attr,
              "' is invalid for this instance of _C._FunctionBase. "
              "Accessing this attribute directly on an instance of autograd.Function "
              "is a legacy access pattern that is no longer supported. For examples "
              "on how to use new\u2011style autograd functions, see "
              "https://pytorch.org/docs/stable/autograd.html#torch.autograd.Function ");
  return node;
}

// THPFunction_name
PyObject* face_name(PyObject* self, PyObject* /*noargs*/) {
  HANDLE_TH_ERRORS
  NodePtr<Node> node = node_or_raise(self, "name");
  const std::string name = node->name();
  return PyUnicode_FromStringAndSize(name.data(), static_cast<Py_ssize_t>(name.size()));
  END_HANDLE_TH_ERRORS
}

// THPFunction_sequence_nr
PyObject* face_sequence_nr(PyObject* self, PyObject* /*noargs*/) {
  HANDLE_TH_ERRORS
  NodePtr<Node> node = node_or_raise(self, "_sequence_nr");
  return PyLong_FromUnsignedLongLong(node->sequence_nr());
  END_HANDLE_TH_ERRORS
}

// THPFunction_set_sequence_nr
PyObject* face_set_sequence_nr(PyObject* self, PyObject* sequence_nr) {
  HANDLE_TH_ERRORS
  NodePtr<Node> node = node_or_raise(self, "_set_sequence_nr");
  uint64_t nr = PyLong_AsUnsignedLongLong(sequence_nr);
  if (nr == static_cast<uint64_t>(-1) && PyErr_Occurred()) {
    return nullptr;
  }
  node->set_sequence_nr(nr);
  Py_RETURN_NONE;
  END_HANDLE_TH_ERRORS
}

// THPFunction_register_hook / register_prehook
PyObject* face_register_hook(PyObject* self, PyObject* hook) {
  HANDLE_TH_ERRORS
  NodePtr<Node> node = node_or_raise(self, "register_hook");
  return torch::autograd::registerFunctionHook(*node, hook);
  END_HANDLE_TH_ERRORS
}

PyObject* face_register_prehook(PyObject* self, PyObject* hook) {
  HANDLE_TH_ERRORS
  NodePtr<Node> node = node_or_raise(self, "register_prehook");
  return torch::autograd::registerFunctionPreHook(*node, hook);
  END_HANDLE_TH_ERRORS
}

// THPFunction_register_hook_dict (a tensor's register_hook on an output).
// Upstream dereferences the expired node (a crash); here the legacy error.
// torch exports the hook's constructor only through THPCppFunction's method,
// which reads nothing of its self but cdata: it gets a view of the node
// (never a Python object: not allocated, not referenced, not freed).
PyObject* face_register_hook_dict(PyObject* self, PyObject* var) {
  HANDLE_TH_ERRORS
  NodePtr<Node> node = node_or_raise(self, "_register_hook_dict");
  THPCppFunction view{};
  view.cdata = std::move(node);
  return torch::autograd::THPCppFunction_register_hook_dict(
      reinterpret_cast<PyObject*>(&view), var);
  END_HANDLE_TH_ERRORS
}

// THPFunction_next_functions
PyObject* face_next_functions(PyObject* self, void* /*closure*/) {
  HANDLE_TH_ERRORS
  NodePtr<Node> node = node_or_raise(self, "next_functions");
  const auto n = static_cast<Py_ssize_t>(node->num_outputs());
  THPObjectPtr result(PyTuple_New(n));
  if (!result) {
    return nullptr;
  }
  for (Py_ssize_t i = 0; i < n; i++) {
    const auto& edge = node->next_edge(static_cast<size_t>(i));
    THPObjectPtr fn(torch::autograd::functionToPyObject(edge.function));
    if (!fn) {
      return nullptr;
    }
    THPObjectPtr nr(PyLong_FromUnsignedLong(edge.input_nr));
    if (!nr) {
      return nullptr;
    }
    PyObject* pair = PyTuple_Pack(2, fn.get(), nr.get());
    if (!pair) {
      return nullptr;
    }
    PyTuple_SET_ITEM(result.get(), i, pair);
  }
  return result.release();
  END_HANDLE_TH_ERRORS
}

// THPFunction_metadata
PyObject* face_metadata(PyObject* self, void* /*closure*/) {
  HANDLE_TH_ERRORS
  NodePtr<Node> node = node_ref_of_face(self);
  TORCH_CHECK(node,
              "You attempted to access the anomaly metadata of a custom autograd function "
              "but the underlying PyNode has already been deallocated.  The most likely "
              "reason this occurred is because you assigned x.grad_fn to a local variable "
              "and then let the original variable get deallocated.  Don't do that!  If "
              "you really have no way of restructuring your code so this is the case, "
              "please file an issue reporting that you are affected by this.");
  PyObject* dict =
      static_cast<torch::autograd::PyAnomalyMetadata*>(node->metadata())->dict();
  return Py_NewRef(dict);
  END_HANDLE_TH_ERRORS
}

// THPFunction_input_metadata: the node's, as THPCppFunction's getter reads
// it (through a view of the node, as _register_hook_dict above)
PyObject* face_input_metadata(PyObject* self, void* /*closure*/) {
  HANDLE_TH_ERRORS
  NodePtr<Node> node = node_or_raise(self, "_input_metadata");
  THPCppFunction view{};
  view.cdata = std::move(node);
  return torch::autograd::THPCppFunction_input_metadata(reinterpret_cast<PyObject*>(&view),
                                                        nullptr);
  END_HANDLE_TH_ERRORS
}

// THPFunction's requires_grad: always True
PyObject* face_requires_grad(PyObject* /*self*/, void* /*closure*/) {
  Py_RETURN_TRUE;
}

PyGetSetDef face_properties[] = {
    {(char*)"next_functions", face_next_functions, nullptr, nullptr, nullptr},
    {(char*)"requires_grad", face_requires_grad, nullptr, nullptr, nullptr},
    {(char*)"metadata", face_metadata, nullptr, nullptr, nullptr},
    {(char*)"_input_metadata", face_input_metadata, nullptr, nullptr, nullptr},
    {nullptr, nullptr, nullptr, nullptr, nullptr},
};

PyMethodDef face_methods[] = {
    {(char*)"_register_hook_dict", face_register_hook_dict, METH_O, nullptr},
    {(char*)"register_hook", face_register_hook, METH_O, nullptr},
    {(char*)"register_prehook", face_register_prehook, METH_O, nullptr},
    {(char*)"name", face_name, METH_NOARGS, nullptr},
    {(char*)"_sequence_nr", face_sequence_nr, METH_NOARGS, nullptr},
    {(char*)"_set_sequence_nr", face_set_sequence_nr, METH_O, nullptr},
    {nullptr, nullptr, 0, nullptr},
};

// THPFunction_traverse + subtype_traverse (the ctx's type, its __dict__):
// the ctx state's Python objects, whatever the node's other owners.
int face_traverse(PyObject* self, visitproc visit, void* arg) {
  Py_VISIT(face_slots(self).dict);
  return state_of_face(self).traverse(visit, arg);
}

// THPFunction_clear + subtype_clear's __dict__. forward_cls is kept (a
// class, as the ctx keeps its type until it is freed).
int face_clear(PyObject* self) {
  Py_CLEAR(face_slots(self).dict);
  CompiledFunctionState& st = state_of_face(self);
  st.clear_ctx_objects();
  st.saved_variables.clear();
  return 0;
}

// subtype_dealloc + THPFunction_dealloc: only once the node is gone (it
// owns this object).
void face_dealloc(PyObject* self) {
  PyObject_GC_UnTrack(self);
  face_slots_dealloc(self);
  auto* face = reinterpret_cast<OwnedFace*>(self);
  face->state.clear();
  std::destroy_at(&face->state);
  std::destroy_at(&face->cdata);
  std::destroy_at(&face->cpp.cdata);
  Py_TYPE(self)->tp_free(self);
}

}  // namespace

void rt_node::face_node_died(PyObject* face) {
  reinterpret_cast<OwnedFace*>(face)->cpp.cdata.reset();
}

// THPFunction_apply: the ctx, then its PyNode owning it; the ctx's cdata.
NodePtr<CompiledFunctionNode> rt_node::new_compiled_node() {
  NodePtr<CompiledFunctionNode> node = make_node<CompiledFunctionNode>();
  PyObject* obj = node_type.tp_alloc(&node_type, 0);
  if (obj == nullptr) {
    return nullptr;
  }
  auto* face = reinterpret_cast<OwnedFace*>(obj);
  new (&face->cpp.cdata) NodePtr<Node>(node_view(node.get()));
  new (&face->state) CompiledFunctionState();
  new (&face->cdata) WeakNodePtr<CompiledFunctionNode>(node);
  node->face = obj;  // the reference tp_alloc gave (slots zeroed by it)
  node->set_pyobj(obj);
  return node;
}

int rt_node::face_type_init() {
  static std::vector<PyGetSetDef> properties = joined(face_properties, ctx_properties);
  static std::vector<PyMethodDef> methods = joined(face_methods, ctx_methods);
  // upstream's is the class FunctionMeta makes in torch.autograd.function
  node_type.tp_name = "torch.autograd.function.CompiledFunctionBackward";
  node_type.tp_basicsize = sizeof(OwnedFace);
  node_type.tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC;
  node_type.tp_dealloc = face_dealloc;
  node_type.tp_traverse = face_traverse;
  node_type.tp_clear = face_clear;
  node_type.tp_weaklistoffset = kFaceWeaklistOffset;
  node_type.tp_dictoffset = kFaceDictOffset;
  node_type.tp_getset = properties.data();
  node_type.tp_methods = methods.data();
  if (PyType_Ready(&node_type) < 0) {
    return -1;
  }
  // A grad_fn for torch's C++ (THPCppFunction_Check: the registered types;
  // upstream's ctx passes THPFunction_Check there instead, read through its
  // own cdata.lock()). functionToPyObject never makes a face from this
  // registration: it finds the node's pyobj(), set for the node's whole life.
  torch::autograd::registerCppFunction(typeid(CompiledFunctionNode), &node_type);
  return 0;
}

#endif  // !RT_NODE_INTRUSIVE
