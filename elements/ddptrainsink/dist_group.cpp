/* c10d process group set-up and the bucketed gradient reducer (one TU: both are the
 * distributed side of the trainer). */
#include "dist_group.h"

#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>
#include <torch/version.h>
#ifdef USE_C10D_NCCL
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>
#endif
#include <torch/torch.h>

#include <algorithm>
#include <cstdlib>
#include <mutex>
#include <optional>
#include <sstream>

#include "bucket_reducer.h"
#include "c10d_setup.h"
#include "dist_env.h"
#include "first_line.h"

namespace videotrain {

// LibTorch 2.x split ProcessGroup into a dispatching front and per-backend Backends;
// the Gloo/NCCL classes derive from Backend there, from ProcessGroup before.
#if TORCH_VERSION_MAJOR >= 2
using PgBase = c10d::Backend;
#else
using PgBase = c10d::ProcessGroup;
#endif

bool nccl_available() {
#ifdef USE_C10D_NCCL
  return true;
#else
  return false;
#endif
}

struct DistGroup::Impl {
  c10::intrusive_ptr<c10d::Store> tcp;     // the TCPStore
  c10::intrusive_ptr<c10d::Store> prefixed;
  c10::intrusive_ptr<PgBase> pg;
};

namespace {

std::string key_progress(int r) { return "progress/" + std::to_string(r); }
std::string key_begin(int r) { return "begin/" + std::to_string(r); }
std::string key_end(int r) { return "end/" + std::to_string(r); }
std::string key_exit(int r) { return "exit/" + std::to_string(r); }

}  // namespace

DistGroup::DistGroup(const DistOptions &opts) : opts_(opts), impl_(std::make_unique<Impl>()) {
  const StoreScope scope = store_scope_from_environment();
  c10d::TCPStoreOptions so;
  so.port = static_cast<std::uint16_t>(opts.master_port);
  so.isServer = opts.rank == 0 && !scope.agent_store;
  so.numWorkers = static_cast<std::size_t>(opts.world_size);
  so.waitWorkers = true;
  so.timeout = opts.timeout;
  const std::string where = opts.master_addr + ":" + std::to_string(opts.master_port);
  try {
    impl_->tcp = make_tcp_store(opts.master_addr, so);
  } catch (const std::exception &e) {
    throw DistError("rendezvous failed: rank " + std::to_string(opts.rank) + " of " +
                    std::to_string(opts.world_size) + (so.isServer ? " could not serve" : " could not reach") +
                    " the c10d store at " + where + " within " + std::to_string(opts.timeout.count() / 1000) +
                    " s (check master-addr/master-port or MASTER_ADDR/MASTER_PORT, and that every rank started): " +
                    e.what());
  }
  impl_->prefixed = c10::make_intrusive<c10d::PrefixStore>(scope.prefix + opts.prefix, impl_->tcp);
  auto pg_store = c10::make_intrusive<c10d::PrefixStore>("pg", impl_->prefixed);
  try {
    if (opts.backend == "nccl") {
#ifdef USE_C10D_NCCL
      auto o = c10d::ProcessGroupNCCL::Options::create();
      // Our wait() names the late peer at `timeout`; NCCL's watchdog (which aborts the
      // process) only a little later.
      o->timeout = opts.timeout + std::chrono::milliseconds(5000);
      impl_->pg = c10::make_intrusive<c10d::ProcessGroupNCCL>(pg_store, opts.rank, opts.world_size, o);
#else
      throw DistError("backend=nccl: this LibTorch was built without NCCL (use backend=gloo)");
#endif
    } else {
      auto o = c10d::ProcessGroupGloo::Options::create(opts.timeout);
      o->devices.push_back(gloo_device(opts.master_addr));
      o->threads = 2;
      impl_->pg = c10::make_intrusive<c10d::ProcessGroupGloo>(pg_store, opts.rank, opts.world_size, o);
    }
  } catch (const DistError &) {
    throw;
  } catch (const std::exception &e) {
    throw DistError("creating the " + opts.backend + " process group (rank " + std::to_string(opts.rank) + " of " +
                    std::to_string(opts.world_size) + ", store " + where + ") failed: " + e.what());
  }
}

DistGroup::~DistGroup() {
  // The group first (it may still talk to the store), then the store. LibTorch >= 2.3
  // wants NCCL groups shut down explicitly rather than left to the destructor.
#if defined(USE_C10D_NCCL) && (TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 3))
  if (opts_.backend == "nccl" && impl_->pg) {
    try {
      static_cast<c10d::ProcessGroupNCCL *>(impl_->pg.get())->shutdown();
    } catch (const std::exception &) {
      // a failed peer: the destructor still frees what is left
    }
  }
#endif
  impl_->pg.reset();
  impl_->prefixed.reset();
  impl_->tcp.reset();
}

c10::intrusive_ptr<c10d::Store> DistGroup::store() const { return impl_->prefixed; }

c10::intrusive_ptr<c10d::Work> DistGroup::allreduce_async(std::vector<at::Tensor> &tensors) {
  c10d::AllreduceOptions o;
  o.timeout = opts_.timeout;
  return impl_->pg->allreduce(tensors, o);
}

c10::intrusive_ptr<c10d::Work> DistGroup::broadcast_async(std::vector<at::Tensor> &tensors, int root) {
  c10d::BroadcastOptions o;
  o.rootRank = root;
  o.timeout = opts_.timeout;
  return impl_->pg->broadcast(tensors, o);
}

void DistGroup::wait(const c10::intrusive_ptr<c10d::Work> &work, const std::string &what) {
  try {
    if (!work->wait(opts_.timeout))
      throw std::runtime_error("timed out after " + std::to_string(opts_.timeout.count() / 1000) + " s");
  } catch (const std::exception &e) {
    const std::string msg = first_line(e.what());
    throw DistError(opts_.backend + " " + what + " failed on rank " + std::to_string(opts_.rank) + " of " +
                    std::to_string(opts_.world_size) + ": " + describe_peers() + " (" + msg + ")");
  }
}

void DistGroup::allreduce(std::vector<at::Tensor> &tensors, const std::string &what) {
  c10::intrusive_ptr<c10d::Work> w;
  try {
    w = allreduce_async(tensors);
  } catch (const std::exception &e) {
    throw DistError(opts_.backend + " " + what + " could not be started on rank " + std::to_string(opts_.rank) +
                    ": " + describe_peers() + " (" + e.what() + ")");
  }
  wait(w, what);
}

void DistGroup::mark_progress(uint64_t step) {
  try {
    std::string s = std::to_string(step);
    impl_->prefixed->set(key_progress(opts_.rank), std::vector<uint8_t>(s.begin(), s.end()));
  } catch (const std::exception &) {
    // Reported by the next collective.
  }
}

void DistGroup::mark_exit() {
  try {
    impl_->prefixed->set(key_exit(opts_.rank), std::vector<uint8_t>{'1'});
  } catch (const std::exception &) {
  }
}

namespace {

void set_u64(c10d::Store &store, const std::string &key, uint64_t v) {
  const std::string s = std::to_string(v);
  store.set(key, std::vector<uint8_t>(s.begin(), s.end()));
}

// The value of `key`, or nullopt while nobody has set it (never blocks).
std::optional<uint64_t> peek_u64(c10d::Store &store, const std::string &key) {
  if (!store.check({key})) return std::nullopt;
  auto v = store.get(key);
  return std::strtoull(std::string(v.begin(), v.end()).c_str(), nullptr, 10);
}

}  // namespace

DistError DistGroup::store_gone(const std::string &when, const std::exception &e) {
  return DistError(when + ": the c10d store is gone: " + describe_peers() + " (" + first_line(e.what()) + ")");
}

void DistGroup::mark_begin(uint64_t step) {
  try {
    set_u64(*impl_->prefixed, key_begin(opts_.rank), step);
  } catch (const std::exception &e) {
    throw store_gone("starting step " + std::to_string(step) + " on rank " + std::to_string(opts_.rank), e);
  }
}

void DistGroup::mark_end(uint64_t steps_done) {
  try {
    set_u64(*impl_->prefixed, key_end(opts_.rank), steps_done);
  } catch (const std::exception &e) {
    throw store_gone("end of stream on rank " + std::to_string(opts_.rank), e);
  }
}

uint64_t DistGroup::max_peer_begin() {
  uint64_t m = 0;
  try {
    for (int r = 0; r < opts_.world_size; r++)
      if (r != opts_.rank) m = std::max(m, peek_u64(*impl_->prefixed, key_begin(r)).value_or(0));
  } catch (const std::exception &e) {
    throw store_gone("end of stream on rank " + std::to_string(opts_.rank), e);
  }
  return m;
}

bool DistGroup::all_ended_at(uint64_t steps_done) {
  try {
    for (int r = 0; r < opts_.world_size; r++)
      if (peek_u64(*impl_->prefixed, key_end(r)) != std::optional<uint64_t>(steps_done)) return false;
  } catch (const std::exception &e) {
    throw store_gone("end of stream on rank " + std::to_string(opts_.rank), e);
  }
  return true;
}

int DistGroup::peer_gone_before(uint64_t steps_done) {
  try {
    for (int r = 0; r < opts_.world_size; r++)
      if (r != opts_.rank && impl_->prefixed->check({key_exit(r)}) &&
          peek_u64(*impl_->prefixed, key_end(r)) != std::optional<uint64_t>(steps_done))
        return r;
  } catch (const std::exception &e) {
    throw store_gone("end of stream on rank " + std::to_string(opts_.rank), e);
  }
  return -1;
}

std::string DistGroup::describe_peers() {
  // Looks at the store with check() (non-blocking) so that diagnosing never hangs.
  std::ostringstream out;
  try {
    long long mine = -1;
    std::vector<std::pair<int, long long>> peers;
    for (int r = 0; r < opts_.world_size; r++) {
      long long step = -1;
      if (impl_->prefixed->check({key_progress(r)})) {
        auto v = impl_->prefixed->get(key_progress(r));
        step = std::atoll(std::string(v.begin(), v.end()).c_str());
      }
      if (r == opts_.rank)
        mine = step;
      else
        peers.emplace_back(r, step);
    }
    std::vector<std::string> suspects;
    for (auto &[r, step] : peers) {
      bool exited = impl_->prefixed->check({key_exit(r)});
      if (exited || step < mine) {
        std::ostringstream s;
        s << "rank " << r << (exited ? " finished and left" : " stopped responding") << " (last finished step "
          << (step < 0 ? std::string("none") : std::to_string(step)) << ")";
        suspects.push_back(s.str());
      }
    }
    if (suspects.empty() && peers.size() == 1) {
      out << "rank " << peers[0].first << " failed or exited (last finished step "
          << (peers[0].second < 0 ? std::string("none") : std::to_string(peers[0].second)) << ")";
    } else if (suspects.empty()) {
      out << "a peer rank failed or exited";
      if (!peers.empty()) {
        out << " (peers: ";
        for (size_t i = 0; i < peers.size(); i++) out << (i ? ", " : "") << "rank " << peers[i].first;
        out << ")";
      }
    } else {
      for (size_t i = 0; i < suspects.size(); i++) out << (i ? "; " : "") << suspects[i];
    }
  } catch (const std::exception &) {
    out << "rank 0 (the c10d store at " << opts_.master_addr << ":" << opts_.master_port
        << ") is unreachable: it exited or failed";
  }
  return out.str();
}

/* ---------------- BucketReducer ---------------- */

struct BucketReducer::Impl {
  struct Bucket {
    std::vector<size_t> params;   // indices into params
    std::vector<int64_t> offsets; // element offset of each param in flat
    at::Tensor flat;
    size_t pending = 0;           // params not yet ready in this sync step
    bool launched = false;
    c10::intrusive_ptr<c10d::Work> work;
  };
  std::vector<at::Tensor> params;
  std::vector<std::pair<size_t, size_t>> where;  // param -> (bucket, slot)
  std::vector<Bucket> buckets;
  std::vector<char> ready;
  DistGroup *group = nullptr;
  bool active = false;
  uint64_t step = 0;
  size_t next_launch = 0;
  std::vector<size_t> launch_order;
  std::mutex mu;  // hooks may run on autograd device threads

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
      bk.launched = true;
      launch_order.push_back(next_launch);
      next_launch++;
    }
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
    ready[p] = 1;
    auto &bk = buckets[where[p].first];
    bk.pending--;
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
  const double cap0 = std::max(first_bucket_mb, 0.0) * 1024 * 1024;
  const double cap = std::max(bucket_cap_mb, 0.0) * 1024 * 1024;
  // Reverse order: the gradients of the last parameters are produced first.
  std::vector<std::vector<size_t>> groups;
  double bytes = 0;
  at::ScalarType dt = at::kFloat;
  c10::Device dev(c10::kCPU);
  for (size_t k = im.params.size(); k-- > 0;) {
    const auto &p = im.params[k];
    const double pb = static_cast<double>(p.numel()) * p.element_size();
    const double limit = groups.size() == 1 ? cap0 : cap;
    bool fresh = groups.empty() || p.scalar_type() != dt || p.device() != dev || (bytes > 0 && bytes + pb > limit);
    if (fresh) {
      groups.emplace_back();
      bytes = 0;
      dt = p.scalar_type();
      dev = p.device();
    }
    groups.back().push_back(k);
    bytes += pb;
  }
  for (auto &g : groups) {
    Impl::Bucket b;
    int64_t n = 0;
    for (size_t slot = 0; slot < g.size(); slot++) {
      b.params.push_back(g[slot]);
      b.offsets.push_back(n);
      im.where[g[slot]] = {im.buckets.size(), slot};
      n += im.params[g[slot]].numel();
    }
    const auto &p0 = im.params[g.front()];
    b.flat = at::zeros({n}, p0.options().requires_grad(false));
    im.buckets.push_back(std::move(b));
  }
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
    b.launched = false;
    b.work.reset();
  }
  im.next_launch = 0;
  im.launch_order.clear();
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
    im.ready[p] = 1;
    im.buckets[im.where[p].first].pending--;
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
}

size_t BucketReducer::num_buckets() const { return impl_->buckets.size(); }

std::vector<std::vector<size_t>> BucketReducer::bucket_layout() const {
  std::vector<std::vector<size_t>> out;
  for (auto &b : impl_->buckets) out.push_back(b.params);
  return out;
}

std::vector<size_t> BucketReducer::last_launch_order() const {
  std::lock_guard<std::mutex> lock(impl_->mu);
  return impl_->launch_order;
}

}  // namespace videotrain
