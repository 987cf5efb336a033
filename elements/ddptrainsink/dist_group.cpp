/* c10d process group set-up (the gradient reducer that uses it: bucket_reducer.cpp). */
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
#include <condition_variable>
#include <cstdlib>
#include <mutex>
#include <thread>
#include <optional>
#include <sstream>

#include "c10d_setup.h"
#include "roll_call.h"
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
  // describe_peers(); connection_lost: the collective failed because a peer's connection
  // closed, so a peer behind this rank is gone rather than slow.
  std::string describe(const DistOptions &opts, bool connection_lost);
};

namespace {

std::string key_progress(int r) { return "progress/" + std::to_string(r); }
std::string key_begin(int r) { return "begin/" + std::to_string(r); }
std::string key_end(int r) { return "end/" + std::to_string(r); }
std::string key_exit(int r) { return "exit/" + std::to_string(r); }

}  // namespace

DistGroup::DistGroup(const DistOptions &opts) : opts_(opts), impl_(std::make_unique<Impl>()) {
  const auto deadline = std::chrono::steady_clock::now() + opts.timeout;
  const StoreScope scope = store_scope_from_environment();
  c10d::TCPStoreOptions so;
  so.port = static_cast<std::uint16_t>(opts.master_port);
  so.isServer = opts.rank == 0 && !scope.agent_store;
  so.numWorkers = static_cast<std::size_t>(opts.world_size);
  so.waitWorkers = false;  // await_ranks below waits, and can name who is missing
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
    RollCallWatch watch;
    watch.waiting = opts.on_waiting;
    watch.cancelled = opts.cancelled;
    await_ranks(*impl_->prefixed, opts.rank, opts.world_size, deadline, opts.timeout, watch);
  } catch (const std::exception &e) {
    throw DistError(std::string("rendezvous failed: ") + e.what());
  }
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
  if (broken_) {
    // An interrupted collective may still be running in Gloo's threads, which the group's
    // destructor joins: let it end (peer back, peer gone, or timeout) on a thread of its own.
    std::thread([pg = std::move(impl_->pg), prefixed = std::move(impl_->prefixed),
                 tcp = std::move(impl_->tcp)]() mutable {
      pg.reset();
      prefixed.reset();
      tcp.reset();
    }).detach();
    return;
  }
  impl_->pg.reset();
  impl_->prefixed.reset();
  impl_->tcp.reset();
}

void DistGroup::check_usable(const std::string &what) {
  if (broken_)
    throw DistError(opts_.backend + " " + what + " on rank " + std::to_string(opts_.rank) +
                    ": the process group was interrupted in an earlier collective (the pipeline stopped or "
                    "flushed) and cannot be used again; restart the run (resume=true continues from a checkpoint)");
  if (cancel_) {
    broken_ = true;  // the peers may already be in this collective
    throw DistError(opts_.backend + " " + what + " on rank " + std::to_string(opts_.rank) +
                    " was interrupted (the pipeline stopped or flushed)");
  }
}

c10::intrusive_ptr<c10d::Store> DistGroup::store() const { return impl_->prefixed; }

c10::intrusive_ptr<c10d::Work> DistGroup::allreduce_async(std::vector<at::Tensor> &tensors) {
  check_usable("all-reduce");
  c10d::AllreduceOptions o;
  o.timeout = opts_.timeout;
  return impl_->pg->allreduce(tensors, o);
}

c10::intrusive_ptr<c10d::Work> DistGroup::broadcast_async(std::vector<at::Tensor> &tensors, int root) {
  check_usable("broadcast");
  c10d::BroadcastOptions o;
  o.rootRank = root;
  o.timeout = opts_.timeout;
  return impl_->pg->broadcast(tensors, o);
}

DistGroup::Gather DistGroup::allgather_start(std::vector<at::Tensor> outputs, const at::Tensor &input,
                                             const std::string &what) {
  check_usable(what);
  Gather g;
  g.out = {outputs};
  g.outputs = std::move(outputs);
  g.in = {input};
  g.what = what;
  c10d::AllgatherOptions o;
  o.timeout = opts_.timeout;
  try {
    g.work = impl_->pg->allgather(g.out, g.in, o);
  } catch (const std::exception &e) {
    throw DistError(opts_.backend + " " + what + " could not be started on rank " + std::to_string(opts_.rank) + ": " +
                    describe_peers() + " (" + e.what() + ")");
  }
  return g;
}

void DistGroup::allgather_finish(Gather &g) {
  wait(g.work, g.what);
  // Backends that gather into tensors of their own leave the results there.
  for (size_t r = 0; r < g.outputs.size(); r++)
    if (!g.out[0][r].is_same(g.outputs[r])) g.outputs[r].copy_(g.out[0][r]);
  g.work.reset();
  g.in.clear();
}

void DistGroup::allgather(std::vector<at::Tensor> &outputs, const at::Tensor &input, const std::string &what) {
  auto g = allgather_start(outputs, input, what);
  allgather_finish(g);
}

void DistGroup::reduce_scatter(at::Tensor &output, at::Tensor &input, const std::string &what) {
  check_usable(what);
  if (!reduce_scatter_supported())
    throw DistError(opts_.backend + " " + what + ": reduce-scatter is used on NCCL only (this group is " +
                    opts_.backend + ")");
  c10d::ReduceScatterOptions o;
  o.timeout = opts_.timeout;
  c10::intrusive_ptr<c10d::Work> w;
  try {
    w = impl_->pg->_reduce_scatter_base(output, input, o);  // flat input, world equal slices
  } catch (const std::exception &e) {
    throw DistError(opts_.backend + " " + what + " could not be started on rank " + std::to_string(opts_.rank) + ": " +
                    describe_peers() + " (" + e.what() + ")");
  }
  wait(w, what);
}

namespace {

// Waits for a Gloo work in short slices, so that `cancelled` is seen within milliseconds.
// True when it completed (its error, if any, comes from work->wait()), false when cancelled.
bool wait_sliced(const c10::intrusive_ptr<c10d::Work> &work, std::chrono::milliseconds timeout,
                 const std::atomic<bool> &cancelled) {
  struct Done {
    std::mutex mu;
    std::condition_variable cv;
    bool done = false;
  };
  auto done = std::make_shared<Done>();
  bool notified = false;
  try {
    // The work's future completes (or fails) with it; the callback runs at once when it has.
    work->getFuture()->addCallback([done](c10::ivalue::Future &) {
      std::lock_guard<std::mutex> lock(done->mu);
      done->done = true;
      done->cv.notify_all();
    });
    notified = true;
  } catch (const std::exception &) {
    // A work without a future: polled below.
  }
  const auto slice = std::chrono::milliseconds(notified ? 20 : 1);
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  for (;;) {
    if (work->isCompleted()) return true;
    if (cancelled.load()) return false;
    if (std::chrono::steady_clock::now() > deadline)
      throw std::runtime_error("timed out after " + std::to_string(timeout.count() / 1000) + " s");
    std::unique_lock<std::mutex> lock(done->mu);
    if (done->cv.wait_for(lock, slice, [&] { return done->done; })) return true;
  }
}

}  // namespace

void DistGroup::wait(const c10::intrusive_ptr<c10d::Work> &work, const std::string &what) {
  check_usable(what);
  try {
    if (opts_.backend != "nccl" && !wait_sliced(work, opts_.timeout, cancel_)) {
      broken_ = true;
      throw DistError(opts_.backend + " " + what + " on rank " + std::to_string(opts_.rank) + " of " +
                      std::to_string(opts_.world_size) + " was interrupted (the pipeline stopped or flushed)");
    }
    // Gloo: returns at once with the work's result (its error rethrown). NCCL: makes the
    // current stream wait for the collective.
    if (!work->wait(opts_.timeout))
      throw std::runtime_error("timed out after " + std::to_string(opts_.timeout.count() / 1000) + " s");
  } catch (const DistError &) {
    throw;
  } catch (const std::exception &e) {
    const std::string msg = first_line(e.what());
    // Gloo's words for a peer whose process is gone (its socket closed).
    const bool lost = msg.find("Connection closed by peer") != std::string::npos ||
                      msg.find("Connection reset by peer") != std::string::npos;
    throw DistError(opts_.backend + " " + what + " failed on rank " + std::to_string(opts_.rank) + " of " +
                    std::to_string(opts_.world_size) + ": " + impl_->describe(opts_, lost) + " (" + msg + ")");
  }
}

void DistGroup::allreduce(std::vector<at::Tensor> &tensors, const std::string &what) {
  c10::intrusive_ptr<c10d::Work> w;
  try {
    w = allreduce_async(tensors);
  } catch (const DistError &) {
    throw;
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

std::vector<std::string> DistGroup::exchange(const std::string &name, const std::string &mine,
                                             const std::function<bool()> &needless) {
  const std::string base = "exchange/" + name + "/", me = "rank " + std::to_string(opts_.rank);
  auto &store = *impl_->prefixed;
  std::vector<std::string> out(size_t(opts_.world_size));
  const auto until = std::chrono::steady_clock::now() + opts_.timeout;
  try {
    store.set(base + std::to_string(opts_.rank), std::vector<uint8_t>(mine.begin(), mine.end()));
    for (int r = 0; r < opts_.world_size; r++) {
      const std::string key = base + std::to_string(r);
      while (!store.check({key})) {
        if (cancelled()) throw DistError(name + " on " + me + ": interrupted");
        if (needless && needless()) return {};
        if (std::chrono::steady_clock::now() >= until)
          throw DistError(name + ": rank " + std::to_string(r) + " did not get there within the " +
                          std::to_string(opts_.timeout.count() / 1000) + " s timeout (" + describe_peers() + ")");
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
      }
      const auto v = store.get(key);
      out[size_t(r)].assign(v.begin(), v.end());
    }
  } catch (const DistError &) {
    throw;
  } catch (const std::exception &e) {
    throw store_gone(name + " on " + me, e);
  }
  return out;
}

void DistGroup::post(const std::string &name, const std::string &value) {
  try {
    impl_->prefixed->set("posted/" + name + "/" + std::to_string(opts_.rank),
                         std::vector<uint8_t>(value.begin(), value.end()));
  } catch (const std::exception &e) {
    throw store_gone(name + " on rank " + std::to_string(opts_.rank), e);
  }
}

std::vector<std::string> DistGroup::peek_all(const std::string &name) {
  std::vector<std::string> out(size_t(opts_.world_size));
  try {
    for (int r = 0; r < opts_.world_size; r++) {
      const std::string key = "posted/" + name + "/" + std::to_string(r);
      if (!impl_->prefixed->check({key})) continue;
      const auto v = impl_->prefixed->get(key);
      out[size_t(r)].assign(v.begin(), v.end());
    }
  } catch (const std::exception &e) {
    throw store_gone(name + " on rank " + std::to_string(opts_.rank), e);
  }
  return out;
}

std::string DistGroup::describe_peers() { return impl_->describe(opts_, false); }

std::string DistGroup::Impl::describe(const DistOptions &opts, bool connection_lost) {
  // Looks at the store with check() (non-blocking) so that diagnosing never hangs.
  std::ostringstream out;
  try {
    long long mine = -1;
    std::vector<std::pair<int, long long>> peers;
    for (int r = 0; r < opts.world_size; r++) {
      long long step = -1;
      if (prefixed->check({key_progress(r)})) {
        auto v = prefixed->get(key_progress(r));
        step = std::atoll(std::string(v.begin(), v.end()).c_str());
      }
      if (r == opts.rank)
        mine = step;
      else
        peers.emplace_back(r, step);
    }
    std::vector<std::string> suspects;
    for (auto &[r, step] : peers) {
      bool exited = prefixed->check({key_exit(r)});
      if (exited || step < mine) {
        std::ostringstream s;
        s << "rank " << r
          << (exited ? " finished and left" : connection_lost ? " failed or exited" : " stopped responding")
          << " (last finished step "
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
    out << "rank 0 (the c10d store at " << opts.master_addr << ":" << opts.master_port
        << ") is unreachable: it exited or failed";
  }
  return out.str();
}

}  // namespace videotrain
