/* Counts the dispatcher ops a stretch of code runs (forward and backward alike), through LibTorch's
 * RecordFunction callbacks: what wan-bench/cogvideox-bench --count-ops print per block and what the
 * transformer tests bound. Diagnostics only (the callbacks slow every op while a counter lives).
 *
 * `ops` counts every op call, nested ones included; `kernels` the leaf calls (ops that call no other
 * op) less those that only allocate or make a view, a stand-in for the kernels a GPU would launch;
 * `weight_casts` the dtype casts (aten::_to_copy) whose source is one of the tensors given, e.g. a
 * model's parameters. Torch TUs only; one counter at a time per process. */
#pragma once

#include <ATen/record_function.h>
#include <torch/torch.h>

#include <cstring>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <vector>

namespace videotrain::models {

struct OpCounts {
  int64_t ops = 0, kernels = 0, weight_casts = 0;
  std::map<std::string, int64_t> kernels_by_name;
  OpCounts operator-(const OpCounts &o) const {
    OpCounts d{ops - o.ops, kernels - o.kernels, weight_casts - o.weight_casts, kernels_by_name};
    for (const auto &[n, c] : o.kernels_by_name) d.kernels_by_name[n] -= c;
    return d;
  }
};

class OpCounter {
 public:
  // `watched`: the tensors whose casts count as weight_casts (by identity).
  explicit OpCounter(const std::vector<at::Tensor> &watched = {}) {
    auto &s = state();
    std::lock_guard<std::mutex> lock(s.mutex);
    s.counts = OpCounts();
    s.watched.clear();
    for (const auto &t : watched) s.watched.insert(t.unsafeGetTensorImpl());
    handle_ = at::addGlobalCallback(
        at::RecordFunctionCallback(&on_start, &on_end).needsInputs(true).scopes({at::RecordScope::FUNCTION}));
  }
  ~OpCounter() { at::removeCallback(handle_); }
  OpCounter(const OpCounter &) = delete;
  OpCounter &operator=(const OpCounter &) = delete;
  // The counts since the counter was made.
  OpCounts counts() const {
    std::lock_guard<std::mutex> lock(state().mutex);
    return state().counts;
  }

 private:
  struct State {
    std::mutex mutex;
    OpCounts counts;
    std::set<const c10::TensorImpl *> watched;
  };
  static State &state() {
    static State s;
    return s;
  }
  // Per thread: whether each open op has called another (leaf detection).
  static std::vector<bool> &open_ops() {
    thread_local std::vector<bool> v;
    return v;
  }
  static bool no_kernel(const char *name) {
    static const std::set<std::string> names = {
        "aten::empty", "aten::empty_strided", "aten::empty_like", "aten::view", "aten::_unsafe_view",
        "aten::reshape", "aten::_reshape_alias", "aten::as_strided", "aten::transpose", "aten::t",
        "aten::permute", "aten::unsqueeze", "aten::squeeze", "aten::expand", "aten::expand_as", "aten::slice",
        "aten::select", "aten::narrow", "aten::unbind", "aten::split", "aten::chunk", "aten::split_with_sizes",
        "aten::unflatten", "aten::flatten", "aten::detach", "aten::alias", "aten::view_as_real",
        "aten::view_as_complex", "aten::_conj", "aten::conj", "aten::resolve_conj", "aten::resolve_neg",
        "aten::lift_fresh", "aten::contiguous", "aten::to", "aten::type_as", "aten::set_", "aten::resize_",
        "aten::result_type", "aten::size", "aten::stride", "aten::numel", "aten::dim", "aten::is_nonzero",
        "aten::item", "aten::_local_scalar_dense", "aten::broadcast_tensors", "aten::detach_", "aten::requires_grad_",
        "aten::unsafe_split", "aten::unsafe_chunk", "aten::movedim", "aten::_has_compatible_shallow_copy_type"};
    return names.count(name) > 0;
  }
  static std::unique_ptr<at::ObserverContext> on_start(const at::RecordFunction &fn) {
    auto &open = open_ops();
    if (!open.empty()) open.back() = true;
    open.push_back(false);
    auto &s = state();
    std::lock_guard<std::mutex> lock(s.mutex);
    s.counts.ops++;
    if (std::strcmp(fn.name(), "aten::_to_copy") == 0 && !s.watched.empty()) {
      const auto in = fn.inputs();
      if (!in.empty() && in[0].isTensor() && s.watched.count(in[0].toTensor().unsafeGetTensorImpl()))
        s.counts.weight_casts++;
    }
    return nullptr;
  }
  static void on_end(const at::RecordFunction &fn, at::ObserverContext *) {
    auto &open = open_ops();
    if (open.empty()) return;  // began before the counter
    const bool called_others = open.back();
    open.pop_back();
    if (called_others || no_kernel(fn.name())) return;
    auto &s = state();
    std::lock_guard<std::mutex> lock(s.mutex);
    s.counts.kernels++;
    s.counts.kernels_by_name[fn.name()]++;
  }
  at::CallbackHandle handle_;
};

}  // namespace videotrain::models
