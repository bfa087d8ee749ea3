// torch_headers.h: every difference between the torch releases' C++ headers
// that the C++ part (built per release, against that release's headers)
// meets, in one place, each named with the release it starts at, as
// csrc/util/py_compat.h does for CPython. No other file of csrc/cpp/ tests
// TORCH_VERSION_*.
#pragma once

#include <torch/headeronly/version.h>

#define RT_TORCH_AT_LEAST(major, minor) \
  (TORCH_VERSION_MAJOR > (major) ||     \
   (TORCH_VERSION_MAJOR == (major) && TORCH_VERSION_MINOR >= (minor)))

// 2.13: torch::autograd::Node is owned by c10::intrusive_ptr (before, by
// std::shared_ptr); PyNode calls the backward boxed from then on
// (node_ptr.h).
#define RT_NODE_INTRUSIVE RT_TORCH_AT_LEAST(2, 13)

// 2.14: torch::autograd::_wrap_outputs hands back the node it attached to the
// outputs (an out-parameter), which torch.autograd.graph's node-creation
// hooks are fired with (fire_node_creation_hooks).
#define RT_WRAP_OUTPUTS_ATTACHES_NODE RT_TORCH_AT_LEAST(2, 14)

// 2.15: a Function's ctx has input_grad_buffers (over
// torch::autograd::get_current_input_grad_buffers, declared in graph_task.h).
#define RT_HAS_INPUT_GRAD_BUFFERS RT_TORCH_AT_LEAST(2, 15)
