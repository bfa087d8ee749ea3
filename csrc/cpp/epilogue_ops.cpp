// epilogue_ops.cpp: the runtime wrapper's epilogue (csrc/aot/epilogue.c) at the
// torch door: the tensor operations upstream's _apply_input_mutations and
// gen_alias_from_base call as Python methods, called here through torch's
// C++ API.
//
// Each function does what the Python method's binding does once it has
// parsed its arguments: the binding (python_variable_methods.cpp, generated)
// checks for __torch_function__ overrides, parses, releases the GIL and
// calls the same at::Tensor method through the dispatcher; errors become
// Python exceptions through the same HANDLE_TH_ERRORS translation. (The GIL
// is released here only where the operation may take a while: MaybeNoGil.) So the
// caller (torch_api.c) offers a call only for exact torch.Tensor /
// nn.Parameter arguments with no TorchFunctionMode active (the binding would
// hand the call to an override or a mode), and each function declines (1,
// before anything happened) unless every tensor is plain (tensor_kinds.h:
// no Python dispatch, functorch or functionalization key, dense, strided,
// no symbolic sizes) and no TorchDispatchMode is active; then the caller
// calls the Python method, as upstream. Returns 0, or -1 with an exception.
#include <ATen/FunctionalTensorWrapper.h>
#include <ATen/record_function.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <c10/core/impl/TorchDispatchModeTLS.h>
#include <torch/csrc/Exceptions.h>
#include <torch/csrc/autograd/python_variable.h>
#include <torch/csrc/autograd/variable.h>
#include <torch/csrc/jit/frontend/tracer.h>

#include <cstring>
#include <memory>
#include <vector>

#include "../torch_cpp_api.h"
#include "epilogue_ops.h"
#include "tensor_kinds.h"

using rt_tensor_kinds::plain_strided;

namespace {

constexpr int kDeclined = 1;

bool no_dispatch_mode() {
  return !c10::impl::TorchDispatchModeTLS::any_modes_set();
}

// The GIL released around an operation that may take a while, as the
// bindings' dispatch_* lambdas release it: other threads run meanwhile.
// Where the operation is short (metadata only, or a small copy between CPU
// tensors) it is kept: releasing it is not observable but costs more than
// the operation, since every tensor refcount change that crosses 1 <-> 2
// inside the dispatcher then takes the GIL back to (de)preserve the
// tensor's PyObject (c10::TensorImpl::incref_pyobject).
struct MaybeNoGil {
  PyThreadState* state = nullptr;
  explicit MaybeNoGil(bool release) {
    if (release) {
      state = PyEval_SaveThread();
    }
  }
  MaybeNoGil(const MaybeNoGil&) = delete;
  MaybeNoGil& operator=(const MaybeNoGil&) = delete;
  ~MaybeNoGil() {
    if (state != nullptr) {
      PyEval_RestoreThread(state);
    }
  }
};

// A copy that takes about as long as the GIL hand-over: both tensors on the
// CPU, at most this many bytes written.
constexpr int64_t kShortCopyBytes = 16 * 1024;

bool short_copy(const at::Tensor& self, const at::Tensor& src) {
  return self.device().is_cpu() && src.device().is_cpu() &&
         self.numel() * static_cast<int64_t>(self.element_size()) <= kShortCopyBytes;
}

bool has_forward_grad(const at::Tensor& t) {
  auto* meta = torch::autograd::impl::get_autograd_meta(t);
  return meta != nullptr && meta->fw_grad_ && !meta->fw_grad_->empty();
}

// What self.copy_(src) does through the dispatcher, done directly, for the
// one case a mutation epilogue almost always has: the updated value of a
// mutated input, a contiguous CPU tensor of the input's dtype and shape,
// neither requiring grad. For it, VariableType::copy_ records nothing (no
// grad, no forward grad), ADInplaceOrView::copy_ bumps self's version
// counter once, and the CPU kernel (copy_impl) copies the bytes through a
// TensorIterator. Anything else the dispatcher could do is ruled out first:
// no RecordFunction callbacks (profiler), no JIT tracing, the default TLS
// dispatch key sets (no inference mode, autocast, functorch or Python keys
// in TLS, no guard below autograd), no dispatch mode (checked by the
// caller), plain dense tensors (no conj/neg bit, quantization or
// zero tensor), no inference tensor, no overlap between the two. Else the
// dispatcher runs, which is always exact.
bool direct_copy(const at::Tensor& self, const at::Tensor& src) {
  if (!self.device().is_cpu() || !src.device().is_cpu() ||
      self.scalar_type() != src.scalar_type() || self.sizes() != src.sizes() ||
      !self.is_contiguous() || !src.is_contiguous() || self.requires_grad() ||
      src.requires_grad() || self.is_conj() || src.is_conj() || self.is_neg() ||
      src.is_neg() || self.is_quantized() ||
      self.is_inference() || src.is_inference() || self._is_zerotensor() ||
      src._is_zerotensor() || has_forward_grad(self) || has_forward_grad(src)) {
    return false;
  }
  if (at::hasCallbacks() || torch::jit::tracer::isTracing()) {
    return false;
  }
  const auto tls = c10::impl::tls_local_dispatch_key_set();
  if (tls.included_ != c10::default_included_set ||
      tls.excluded_ != c10::default_excluded_set) {
    return false;
  }
  const size_t nbytes = static_cast<size_t>(self.numel()) * self.element_size();
  if (nbytes != 0) {
    const char* to = static_cast<const char*>(self.const_data_ptr());
    const char* from = static_cast<const char*>(src.const_data_ptr());
    if (to < from + nbytes && from < to + nbytes) {
      return false;  // overlapping (copy_impl's overlap checks)
    }
    // mutable_data_ptr: materializes a copy-on-write storage, as the kernel's
    // TensorIterator does
    std::memcpy(self.mutable_data_ptr(), src.const_data_ptr(), nbytes);
  }
  torch::autograd::impl::bump_version(self);
  return true;
}

}  // namespace

// orig.copy_(src), and orig.detach().copy_(src) with detach set
// (_apply_input_mutations' data mutation, and its leaf that requires grad)
int rt_epi_copy_(PyObject* orig, PyObject* src, int detach) noexcept {
  HANDLE_TH_ERRORS
  const at::Tensor& self = THPVariable_Unpack(orig);
  const at::Tensor& other = THPVariable_Unpack(src);
  if (!plain_strided(self) || !plain_strided(other) || !no_dispatch_mode()) {
    return kDeclined;
  }
  const bool short_one = short_copy(self, other);
  if (detach) {
    MaybeNoGil no_gil(!short_one);
    self.detach().copy_(other, /*non_blocking=*/false);
  } else if (!(short_one && direct_copy(self, other))) {
    MaybeNoGil no_gil(!short_one);
    self.copy_(other, /*non_blocking=*/false);
  }
  return 0;
  END_HANDLE_TH_ERRORS_RET(-1)
}

// orig.as_strided_(u.size(), u.stride(), u.storage_offset()): the sizes,
// strides and offset the Python methods return, plain ints for a plain u.
int rt_epi_as_strided_like(PyObject* orig, PyObject* like) noexcept {
  HANDLE_TH_ERRORS
  const at::Tensor& self = THPVariable_Unpack(orig);
  const at::Tensor& u = THPVariable_Unpack(like);
  if (!plain_strided(self) || !plain_strided(u) || !no_dispatch_mode()) {
    return kDeclined;
  }
  self.as_strided_(u.sizes(), u.strides(), u.storage_offset());  // metadata only: the GIL kept
  return 0;
  END_HANDLE_TH_ERRORS_RET(-1)
}

// orig.set_(src) (the caller holds grad mode off around it, as upstream's
// `with torch.no_grad():`)
int rt_epi_set_(PyObject* orig, PyObject* src) noexcept {
  HANDLE_TH_ERRORS
  const at::Tensor& self = THPVariable_Unpack(orig);
  const at::Tensor& other = THPVariable_Unpack(src);
  if (!plain_strided(self) || !plain_strided(other) || !no_dispatch_mode()) {
    return kDeclined;
  }
  self.set_(other);  // metadata only: the GIL kept
  return 0;
  END_HANDLE_TH_ERRORS_RET(-1)
}

// ---------------------------------------------------------------------------
// Alias replay: gen_alias_from_base's view-replay branch
// (functional_utils.py), for a sequence the plan established it replays.

namespace {

using ViewMetaSequence = std::vector<std::shared_ptr<at::functionalization::ViewMeta>>;

constexpr char kSequenceCapsule[] = "torch_aot_rt._torch_cpp.view_meta_sequence";

void sequence_capsule_free(PyObject* capsule) {
  delete static_cast<ViewMetaSequence*>(PyCapsule_GetPointer(capsule, kSequenceCapsule));
}

}  // namespace

// The C++ ViewMetas behind the Python ones of `sequence` (a list or tuple of
// torch._C._functionalization ViewMeta objects, held by shared_ptr as
// torch's pybind11 bindings hold them), in a capsule; once per plan.
// NULL without an exception where an item is not one (the Python route
// stays), NULL with one on failure.
PyObject* rt_epi_view_sequence(PyObject* sequence) noexcept {
  HANDLE_TH_ERRORS
  if (!PyList_Check(sequence) && !PyTuple_Check(sequence)) {
    return nullptr;
  }
  auto converted = std::make_unique<ViewMetaSequence>();
  const Py_ssize_t n = PySequence_Fast_GET_SIZE(sequence);
  converted->reserve(static_cast<size_t>(n));
  for (Py_ssize_t i = 0; i < n; i++) {
    pybind11::handle item(PySequence_Fast_GET_ITEM(sequence, i));
    try {
      converted->push_back(item.cast<std::shared_ptr<at::functionalization::ViewMeta>>());
    } catch (const pybind11::cast_error&) {
      return nullptr;
    }
    if (!converted->back() || converted->back()->has_symbolic_inputs) {
      return nullptr;  // the plan excluded these; never reached
    }
  }
  PyObject* capsule = PyCapsule_New(converted.get(), kSequenceCapsule, sequence_capsule_free);
  if (capsule != nullptr) {
    converted.release();
  }
  return capsule;
  END_HANDLE_TH_ERRORS
}

// torch._C._functionalization.apply_view_meta_sequence(base, sequence) (the
// binding converts its arguments and calls the same function), then
// `out.shape != target.shape` (upstream raises: declined, for the caller's
// Python route to raise it) and patch_requires_grad's detach(). The other
// patch, requires_grad_(True), is the Python method's (its checks): declined.
int rt_epi_view_replay(PyObject* capsule, PyObject* base, PyObject* target, int requires_grad,
                       PyObject** out) noexcept {
  *out = nullptr;
  HANDLE_TH_ERRORS
  auto* sequence =
      static_cast<ViewMetaSequence*>(PyCapsule_GetPointer(capsule, kSequenceCapsule));
  if (sequence == nullptr) {
    return -1;
  }
  const at::Tensor& b = THPVariable_Unpack(base);
  const at::Tensor& t = THPVariable_Unpack(target);
  if (!plain_strided(b) || !plain_strided(t) || !no_dispatch_mode()) {
    return kDeclined;
  }
  const bool base_requires_grad = b.requires_grad();
  if (!base_requires_grad && requires_grad) {
    return kDeclined;
  }
  at::Tensor result = at::functionalization::impl::apply_view_meta_sequence(b, *sequence);
  if (result.sizes() != t.sizes()) {
    return kDeclined;
  }
  if (base_requires_grad && !requires_grad) {
    result = result.detach();  // metadata only: the GIL kept
  }
  *out = THPVariable_Wrap(std::move(result));
  return *out == nullptr ? -1 : 0;
  END_HANDLE_TH_ERRORS_RET(-1)
}
