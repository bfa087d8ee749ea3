// node_ptr.h: how torch owns a torch::autograd::Node, the one place of the
// C++ part that knows (a compile-time difference of the release's headers).
//
// torch 2.13 moved Node from std::shared_ptr (Node :
// std::enable_shared_from_this<Node>, made with deleteNode as its deleter) to
// c10::intrusive_ptr; every API the C++ part calls with a node follows
// (_wrap_outputs, functionToPyObject, THPCppFunction::cdata,
// SavedVariable::unpack, Node::getptr). The rest of csrc/cpp/ is written
// against NodePtr / make_node / face_owns_node and never tests a version.
#pragma once

#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/python_cpp_function.h>
#include <torch/headeronly/version.h>

#include <memory>

#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 13)
#define RT_NODE_INTRUSIVE 1  // torch >= 2.13: c10::intrusive_ptr<Node>
#else
#define RT_NODE_INTRUSIVE 0  // torch 2.11, 2.12: std::shared_ptr<Node>
#endif

namespace rt_node {

#if RT_NODE_INTRUSIVE
template <class T>
using NodePtr = c10::intrusive_ptr<T>;

// As THPFunction_apply makes its PyNode (c10::make_intrusive).
template <class T>
NodePtr<T> make_node() {
  return c10::make_intrusive<T>();
}
#else
template <class T>
using NodePtr = std::shared_ptr<T>;

// As THPFunction_apply makes its PyNode in 2.11/2.12: deleteNode as the
// deleter, which frees a long chain of nodes without deep recursion.
template <class T>
NodePtr<T> make_node() {
  return NodePtr<T>(new T(), torch::autograd::deleteNode);
}
#endif

// Whether a grad_fn face may report the Python objects its node holds to
// the GC as its own (NOTE [ PyObject Traversal ]: only what it owns alone).
// With intrusive_ptr, torch keeps the face alive as long as the node has
// other owners (kHasPyObject), so the face is the node's Python half: always.
// With shared_ptr, the face is one owner among others and dies whenever its
// last Python reference does (node->pyobj() is a non-owning back pointer):
// only while it is the node's sole owner, as THPCppFunction_traverse decides.
inline bool face_owns_node(const torch::autograd::THPCppFunction* face) {
#if RT_NODE_INTRUSIVE
  return static_cast<bool>(face->cdata);
#else
  return face->cdata.use_count() == 1;
#endif
}

}  // namespace rt_node
