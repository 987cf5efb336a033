/* The bucketed gradient reducer: see bucket_reducer.h. */
#include "bucket_reducer.h"

#include <torch/torch.h>

#include <algorithm>
#include <mutex>

#include "dist_group.h"

namespace videotrain {

struct BucketReducer::Impl {
  struct Bucket {
    std::vector<size_t> params;   // indices into params
    std::vector<int64_t> offsets; // element offset of each param in flat
    at::Tensor flat;
    size_t bytes = 0;
    size_t pending = 0;           // params not yet ready in this sync step
    c10::intrusive_ptr<c10d::Work> work;
  };
  std::vector<at::Tensor> params;
  std::vector<std::pair<size_t, size_t>> where;  // param -> (bucket, slot)
  std::vector<Bucket> buckets;
  double cap0 = 0, cap = 0;  // bytes
  std::vector<char> ready;
  size_t pending_total = 0;
  std::vector<size_t> arrival;  // params in the order their gradients came (this sync step)
  bool rebuilt = false;
  DistGroup *group = nullptr;
  bool active = false;
  uint64_t step = 0;
  size_t next_launch = 0;
  std::vector<size_t> launch_order, pending_at_launch;
  mutable std::mutex mu;  // hooks may run on autograd device threads

  // Buckets over `order` (every parameter once): a new bucket at the cap, or where the
  // dtype or device changes (a flat tensor has one of each).
  void build(const std::vector<size_t> &order) {
    std::vector<std::vector<size_t>> groups;
    double bytes = 0;
    for (size_t k : order) {
      const auto &p = params[k];
      const double pb = static_cast<double>(p.numel()) * p.element_size();
      const double limit = groups.size() == 1 ? cap0 : cap;
      const bool fresh = groups.empty() || p.scalar_type() != params[groups.back().front()].scalar_type() ||
                         p.device() != params[groups.back().front()].device() || (bytes > 0 && bytes + pb > limit);
      if (fresh) {
        groups.emplace_back();
        bytes = 0;
      }
      groups.back().push_back(k);
      bytes += pb;
    }
    buckets.clear();
    for (auto &g : groups) {
      Bucket b;
      int64_t n = 0;
      for (size_t slot = 0; slot < g.size(); slot++) {
        b.params.push_back(g[slot]);
        b.offsets.push_back(n);
        where[g[slot]] = {buckets.size(), slot};
        n += params[g[slot]].numel();
      }
      const auto &p0 = params[g.front()];
      b.flat = at::zeros({n}, p0.options().requires_grad(false));
      b.bytes = static_cast<size_t>(n) * p0.element_size();
      buckets.push_back(std::move(b));
    }
  }

  // Rank 0's arrival order to every rank, then the buckets in that order. Rank 0 with
  // no gradients (it joined a step with no data of its own) leaves it to the next step.
  void rebuild(const std::string &at_step) {
    std::vector<int64_t> order{static_cast<int64_t>(arrival.size())};
    std::vector<char> seen(params.size(), 0);
    for (size_t p : arrival) {
      order.push_back(static_cast<int64_t>(p));
      seen[p] = 1;
    }
    for (auto &b : buckets)  // no gradient this step (unused, frozen): last
      for (size_t p : b.params)
        if (!seen[p]) order.push_back(static_cast<int64_t>(p));
    std::vector<at::Tensor> t{at::tensor(order, at::kLong).to(buckets.front().flat.device())};
    const std::string what = "bucket order broadcast" + at_step;
    c10::intrusive_ptr<c10d::Work> w;
    try {
      w = group->broadcast_async(t, 0);
    } catch (const std::exception &e) {
      throw DistError(what + " could not be started: " + group->describe_peers() + " (" + e.what() + ")");
    }
    group->wait(w, what);
    auto got = t[0].to(at::kCPU);
    const int64_t *v = got.data_ptr<int64_t>();
    if (v[0] == 0) return;
    build(std::vector<size_t>(v + 1, v + 1 + params.size()));
    rebuilt = true;
  }

  at::Tensor view(size_t p) {
    auto [b, slot] = where[p];
    auto &bk = buckets[b];
    return bk.flat.narrow(0, bk.offsets[slot], params[p].numel()).view(params[p].sizes());
  }

  void launch_ready() {
    while (next_launch < buckets.size() && buckets[next_launch].pending == 0) {
      auto &bk = buckets[next_launch];
      std::vector<at::Tensor> t{bk.flat};
      bk.work = group->allreduce_async(t);
      launch_order.push_back(next_launch);
      pending_at_launch.push_back(pending_total);
      next_launch++;
    }
  }

  void mark_ready(size_t p) {
    ready[p] = 1;
    buckets[where[p].first].pending--;
    pending_total--;
  }

  void on_grad(size_t p, const at::Tensor &grad) {
    std::lock_guard<std::mutex> lock(mu);
    if (!active || ready[p]) return;
    // The hook sees the gradient before it is accumulated into .grad: the bucket gets
    // what .grad will hold after accumulation.
    at::NoGradGuard ng;
    auto v = view(p);
    v.copy_(grad);
    const auto &g = params[p].grad();
    if (g.defined()) v.add_(g);
    arrival.push_back(p);
    mark_ready(p);
    try {
      launch_ready();
    } catch (const std::exception &) {
      // Left for finish(), which reports it with context.
    }
  }
};

BucketReducer::BucketReducer(std::vector<at::Tensor> params, DistGroup *group, double bucket_cap_mb,
                             double first_bucket_mb)
    : impl_(std::make_shared<Impl>()) {
  auto &im = *impl_;
  im.params = std::move(params);
  im.group = group;
  im.where.resize(im.params.size());
  im.ready.assign(im.params.size(), 0);
  im.cap0 = std::max(first_bucket_mb, 0.0) * 1024 * 1024;
  im.cap = std::max(bucket_cap_mb, 0.0) * 1024 * 1024;
  // Until the first step shows the real order: the last parameters are usually the
  // last layers, whose gradients come first.
  std::vector<size_t> order(im.params.size());
  for (size_t k = 0; k < order.size(); k++) order[k] = order.size() - 1 - k;
  im.build(order);
  // The parameters may outlive the reducer: hooks hold it weakly.
  std::weak_ptr<Impl> weak = impl_;
  for (size_t k = 0; k < im.params.size(); k++) {
    if (!im.params[k].requires_grad()) continue;
    im.params[k].register_hook([weak, k](const at::Tensor &grad) {
      if (auto im = weak.lock()) im->on_grad(k, grad);
    });
  }
}

BucketReducer::~BucketReducer() = default;

void BucketReducer::prepare(bool sync, uint64_t step) {
  auto &im = *impl_;
  std::lock_guard<std::mutex> lock(im.mu);
  im.active = sync;
  im.step = step;
  if (!sync) return;
  std::fill(im.ready.begin(), im.ready.end(), 0);
  for (auto &b : im.buckets) {
    b.pending = b.params.size();
    b.work.reset();
  }
  im.pending_total = im.params.size();
  im.arrival.clear();
  im.next_launch = 0;
  im.launch_order.clear();
  im.pending_at_launch.clear();
}

void BucketReducer::finish() {
  auto &im = *impl_;
  std::unique_lock<std::mutex> lock(im.mu);
  if (!im.active) return;
  im.active = false;
  at::NoGradGuard ng;
  // Parameters that got no gradient in this backward (unused, frozen): their current
  // gradient (or zeros) so that every rank reduces the same buckets.
  for (size_t p = 0; p < im.params.size(); p++) {
    if (im.ready[p]) continue;
    auto v = im.view(p);
    const auto &g = im.params[p].grad();
    if (g.defined())
      v.copy_(g);
    else
      v.zero_();
    im.mark_ready(p);
  }
  const std::string at_step = " at step " + std::to_string(im.step + 1);
  try {
    im.launch_ready();
  } catch (const std::exception &e) {
    throw DistError("gradient all-reduce" + at_step + " could not be started: " + im.group->describe_peers() +
                    " (" + e.what() + ")");
  }
  const double inv = 1.0 / im.group->world_size();
  for (size_t b = 0; b < im.buckets.size(); b++) {
    auto &bk = im.buckets[b];
    im.group->wait(bk.work, "gradient all-reduce (bucket " + std::to_string(b) + " of " +
                                std::to_string(im.buckets.size()) + ")" + at_step);
    bk.work.reset();
    bk.flat.mul_(inv);
  }
  for (size_t p = 0; p < im.params.size(); p++) {
    auto &param = im.params[p];
    if (!param.requires_grad()) continue;
    auto v = im.view(p);
    if (param.grad().defined())
      param.mutable_grad().copy_(v);
    else
      param.mutable_grad() = v.clone();
  }
  // Every rank is here at the same sync step (the first), so the broadcast pairs up.
  if (!im.rebuilt) im.rebuild(at_step);
}

std::vector<std::vector<size_t>> BucketReducer::bucket_layout() const {
  std::lock_guard<std::mutex> lock(impl_->mu);
  std::vector<std::vector<size_t>> out;
  for (auto &b : impl_->buckets) out.push_back(b.params);
  return out;
}

std::vector<size_t> BucketReducer::bucket_bytes() const {
  std::lock_guard<std::mutex> lock(impl_->mu);
  std::vector<size_t> out;
  for (auto &b : impl_->buckets) out.push_back(b.bytes);
  return out;
}

bool BucketReducer::rebuilt() const {
  std::lock_guard<std::mutex> lock(impl_->mu);
  return impl_->rebuilt;
}

std::vector<size_t> BucketReducer::last_launch_order() const {
  std::lock_guard<std::mutex> lock(impl_->mu);
  return impl_->launch_order;
}

std::vector<size_t> BucketReducer::last_pending_at_launch() const {
  std::lock_guard<std::mutex> lock(impl_->mu);
  return impl_->pending_at_launch;
}

}  // namespace videotrain
