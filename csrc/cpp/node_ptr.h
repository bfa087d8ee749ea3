// node_ptr.h: how torch owns a torch::autograd::Node, the one place of the
// C++ part that knows (a compile-time difference of the release's headers).
//
// torch 2.13 moved Node from std::shared_ptr (Node :
// std::enable_shared_from_this<Node>, made with deleteNode as its deleter) to
// c10::intrusive_ptr; every API the C++ part calls with a node follows
// (_wrap_outputs, functionToPyObject, THPCppFunction::cdata,
// SavedVariable::unpack, Node::getptr). The rest of csrc/cpp/ is written
// against NodePtr / WeakNodePtr / make_node / face_owns_node and never tests
// a version: where the ownership makes it a different program (who owns the
// grad_fn, where the ctx state lives, how the backward is called), it
// branches on the two facts it reads here, RT_NODE_INTRUSIVE (from
// torch_headers.h) and RT_NODE_BOXED_BACKWARD.
#pragma once

#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/python_cpp_function.h>

#include <memory>

#include "torch_headers.h"  // RT_NODE_INTRUSIVE: torch >= 2.13 (intrusive_ptr<Node>)

// How PyNode calls the backward, which changed with the same release:
// 2.13 on, ctx.apply_boxed(grads) for a Function with boxed_grads_call
// (CompiledFunction has it): backward(ctx, grads_list); 2.11/2.12 have
// neither, PyNode calls ctx.apply(*grads): backward(ctx, *grads). The
// module says which (node_backward_boxed) and _autograd_plan._node_allowed
// gives the node only a CompiledFunction whose release calls it so.
#define RT_NODE_BOXED_BACKWARD RT_NODE_INTRUSIVE

namespace rt_node {

#if RT_NODE_INTRUSIVE
template <class T>
using NodePtr = c10::intrusive_ptr<T>;
template <class T>
using WeakNodePtr = c10::weak_intrusive_ptr<T>;

// As THPFunction_apply makes its PyNode (c10::make_intrusive).
template <class T>
NodePtr<T> make_node() {
  return c10::make_intrusive<T>();
}
#else
template <class T>
using NodePtr = std::shared_ptr<T>;
// what THPFunction::cdata is (python_function.h: std::weak_ptr<PyNode>)
template <class T>
using WeakNodePtr = std::weak_ptr<T>;

// As THPFunction_apply makes its PyNode in 2.11/2.12: deleteNode as the
// deleter, which frees a long chain of nodes without deep recursion.
template <class T>
NodePtr<T> make_node() {
  return NodePtr<T>(new T(), torch::autograd::deleteNode);
}

// A pointer to a node that owns nothing (the aliasing constructor, no
// owner): the THPCppFunction::cdata of a face its node owns
// (compiled_node_face_owned.cpp), reset before the node dies.
inline NodePtr<torch::autograd::Node> node_view(torch::autograd::Node* node) {
  return NodePtr<torch::autograd::Node>(NodePtr<torch::autograd::Node>(), node);
}
#endif

// Who owns whom between the node and its Python face (grad_fn), and where
// the ctx state lives (compiled_node_impl.h), follow the same headers:
//
// - intrusive_ptr (2.13 on): the face is a THPCppFunction that owns the
//   node; torch keeps it alive as long as the node has other owners
//   (kHasPyObject), so it is the node's Python half for the node's whole
//   life, as upstream's ctx is for its PyNode (compiled_node_face.cpp).
// - shared_ptr (2.11, 2.12): a THPCppFunction lives only while referenced
//   (node->pyobj() is a non-owning back pointer), so the face is a type of
//   our own with THPFunction's shape: the node owns it (PyNode::obj), it
//   points back weakly, keeps the ctx state, and outlives the node while
//   referenced (compiled_node_face_owned.cpp).
//
// Whether the 2.13-on face may report the Python objects its node holds to
// the GC as its own (NOTE [ PyObject Traversal ]): with intrusive_ptr it is
// the node's Python half: always.
inline bool face_owns_node(const torch::autograd::THPCppFunction* face) {
  return static_cast<bool>(face->cdata);
}

}  // namespace rt_node
