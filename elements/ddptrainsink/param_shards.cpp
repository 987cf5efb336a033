/* Sharded data parallel: see param_shards.h. */
#include "param_shards.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <stdexcept>

#include "dist_group.h"
#include "optimizers/train_optimizer.h"

using json = nlohmann::json;

namespace videotrain {

std::string shard_file_name(int rank) {
  char b[32];
  std::snprintf(b, sizeof b, "shard-%05d.pt", rank);
  return b;
}

struct ParamShards::Unit {
  int block = -1;  // -1: the root unit
  std::vector<size_t> params;
  std::vector<int64_t> offsets;
  int64_t numel = 0, padded = 0, shard = 0;
  bool sharded_weights = false;  // sharding=full's blocks: only the shard between uses
  at::Tensor flat;               // the whole unit (kept, or gathered while in use)
  bool pending = false;          // its gather issued, not yet waited for
  at::Tensor landing;            // where that gather lands (the gather's dtype)
  DistGroup::Gather work;        // that gather (no work without a group)
  at::Tensor grad;               // this rank's shard of the summed gradients, this step
  bool reduced = false;          // in this micro-batch
};

ParamShards::ParamShards(Sharding mode, std::vector<at::Tensor> params, std::vector<std::string> names,
                         const std::vector<int> &block_of, DistGroup *group, int rank, int world)
    : mode_(mode), params_(std::move(params)), names_(std::move(names)), group_(group), rank_(rank), world_(world) {
  torch::NoGradGuard ng;
  for (const auto &p : params_) shapes_.push_back(p.sizes().vec());  // released parameters lose theirs
  // Units in reduction order: blocks from the last (backward reaches it first), then the root.
  std::map<int, std::vector<size_t>, std::greater<int>> by_block;
  for (size_t i = 0; i < params_.size(); i++) by_block[block_of.at(i)].push_back(i);
  for (auto &[block, members] : by_block) {
    Unit u;
    u.block = block;
    u.params = members;
    for (size_t i : members) {
      if (params_[i].scalar_type() != params_[members[0]].scalar_type() || params_[i].device() != params_[members[0]].device())
        throw std::runtime_error("sharding: the trainable parameters of one block differ in dtype or device (" +
                                 names_[i] + ")");
      u.offsets.push_back(u.numel);
      u.numel += params_[i].numel();
    }
    u.padded = (u.numel + world_ - 1) / world_ * world_;
    u.shard = u.padded / world_;
    u.sharded_weights = mode_ == Sharding::full && block >= 0;
    const auto &p0 = params_[members[0]];
    u.flat = at::zeros({u.padded}, p0.options().requires_grad(false));
    for (size_t j = 0; j < members.size(); j++) {
      auto &p = params_[members[j]];
      auto view = u.flat.narrow(0, u.offsets[j], p.numel());
      view.copy_(p.detach().reshape({-1}));
      p.set_data(view.view(p.sizes()));
    }
    auto mine = u.flat.narrow(0, rank_ * u.shard, u.shard);
    shards_.push_back(u.sharded_weights ? mine.clone() : mine);
    if (block >= 0) unit_of_block_[block] = units_.size();
    units_.push_back(std::move(u));
    if (units_.back().sharded_weights) release(units_.size() - 1);
  }
}

ParamShards::~ParamShards() = default;

std::vector<std::string> ParamShards::shard_names() const {
  std::vector<std::string> out;
  for (const auto &u : units_)
    out.push_back((u.block >= 0 ? "block " + std::to_string(u.block) : std::string("the root unit")) + " (shard " +
                  std::to_string(rank_) + " of " + std::to_string(world_) + ", from " + names_[u.params[0]] + ")");
  return out;
}

void ParamShards::set_gather(at::ScalarType dtype, bool bf16_compute, bool prefetch) {
  if (dtype != at::kFloat && dtype != at::kBFloat16)
    throw std::runtime_error(std::string("sharding: block gathers are float32 or bf16, not ") + c10::toString(dtype));
  gather_dtype_ = dtype;
  bf16_compute_ = bf16_compute;
  prefetch_ = prefetch;
}

void ParamShards::start_gather(size_t k, at::ScalarType dtype, bool ahead) {
  auto &u = units_[k];
  if (!u.sharded_weights || u.flat.defined() || u.pending) return;
  torch::NoGradGuard ng;
  const auto mine = shards_[k].detach().to(dtype);  // bf16: each rank rounds its own slice
  u.landing = at::empty({u.padded}, mine.options());
  if (group_) {
    // A gather only copies, so a bf16 block travels as its bytes: Gloo in LibTorch 1.13 has no
    // bf16 collectives, and the bytes are the same on every backend.
    auto bytes = [&](const at::Tensor &t) { return dtype == at::kFloat ? t : t.view(at::kByte); };
    std::vector<at::Tensor> outs;
    for (int r = 0; r < world_; r++) outs.push_back(bytes(u.landing.narrow(0, r * u.shard, u.shard)));
    u.work = group_->allgather_start(std::move(outs), bytes(mine), "weight all-gather of block " + std::to_string(u.block));
  } else {
    u.landing.copy_(mine);
  }
  u.pending = true;
  gathers_++;
  if (ahead) gathers_ahead_++;
}

void ParamShards::finish_gather(size_t k) {
  auto &u = units_[k];
  if (!u.pending) return;
  torch::NoGradGuard ng;
  u.pending = false;  // a failed wait leaves the group broken: no retry
  if (u.work.work) group_->allgather_finish(u.work);
  u.work = DistGroup::Gather();
  // A bf16 block outside bf16 autocast: the float32 compute takes it as float32.
  u.flat = u.landing.scalar_type() == at::kBFloat16 && !bf16_compute_ ? u.landing.to(at::kFloat) : u.landing;
  u.landing = at::Tensor();
  for (size_t j = 0; j < u.params.size(); j++) {
    const size_t i = u.params[j];
    const auto &shape = shapes_[i];
    params_[i].set_data(u.flat.narrow(0, u.offsets[j], c10::multiply_integers(shape)).view(shape));
  }
}

void ParamShards::gather(size_t k, at::ScalarType dtype) {
  start_gather(k, dtype, false);
  finish_gather(k);
}

void ParamShards::release(size_t k) {
  auto &u = units_[k];
  if (!u.sharded_weights || !u.flat.defined() || materialized_) return;
  // The parameters keep their shapes' information in nothing but the model's code: an empty tensor
  // holds their place until the next gather (their sizes are never read in between).
  for (size_t i : u.params) params_[i].set_data(at::empty({0}, params_[i].options()));
  u.flat = at::Tensor();
}

void ParamShards::acquire(int block, models::BlockUse use) {
  if (mode_ != Sharding::full) return;
  const auto it = unit_of_block_.find(block);
  if (it == unit_of_block_.end()) return;
  gather(it->second, gather_dtype_);  // waits for it when it was issued ahead
  if (!prefetch_) return;
  // The block this pass uses next travels while this one computes. Issued from the hooks' calls
  // alone, so every rank (a joining one too) issues the same gathers in the same order.
  const bool forward = use == models::BlockUse::forward;
  if (forward ? std::next(it) == unit_of_block_.end() : it == unit_of_block_.begin()) return;
  start_gather((forward ? std::next(it) : std::prev(it))->second, gather_dtype_, true);
}

void ParamShards::forward_done(int block) {
  if (mode_ != Sharding::full) return;
  const auto it = unit_of_block_.find(block);
  if (it != unit_of_block_.end()) release(it->second);
}

void ParamShards::backward_done(int block) {
  const auto it = unit_of_block_.find(block);
  if (it == unit_of_block_.end()) return;
  // sharding=full reduces every micro-batch (the weights and their gradients go now); optimizer
  // only at the step's last, letting the others accumulate in .grad.
  if (mode_ == Sharding::full || sync_) reduce(it->second);
  if (mode_ == Sharding::full) release(it->second);
}

void ParamShards::begin_micro_batch(bool sync) {
  sync_ = sync;
  for (auto &u : units_) u.reduced = false;
}

void ParamShards::reduce(size_t k) {
  auto &u = units_[k];
  torch::NoGradGuard ng;
  auto g = at::zeros({u.padded}, shards_[k].options());
  for (size_t j = 0; j < u.params.size(); j++) {
    auto &p = params_[u.params[j]];
    if (p.grad().defined()) g.narrow(0, u.offsets[j], p.grad().numel()).copy_(p.grad().reshape({-1}));
    p.mutable_grad() = at::Tensor();  // freed now: only the shard stays
  }
  const std::string what =
      "gradient reduction of " + (u.block >= 0 ? "block " + std::to_string(u.block) : std::string("the root unit"));
  at::Tensor part;
  if (group_ && group_->reduce_scatter_supported()) {  // NCCL: only this rank's slice comes back
    part = at::empty({u.shard}, g.options());
    group_->reduce_scatter(part, g, what);
  } else {
    if (group_) {
      std::vector<at::Tensor> t{g};
      group_->allreduce(t, what);
    }
    part = g.narrow(0, rank_ * u.shard, u.shard).clone();
  }
  u.grad = u.grad.defined() ? u.grad.add_(part) : part;
  u.reduced = true;
}

void ParamShards::join_micro_batch() {
  // A peer's micro-batch under sharding=full: the hooks' calls its model makes (every block
  // gathered for its forward, first to last, then for its recompute, reduced and freed, last to
  // first), so that the gathers issued ahead are the peers' too.
  begin_micro_batch(true);
  if (mode_ != Sharding::full) return;
  for (auto it = unit_of_block_.begin(); it != unit_of_block_.end(); ++it) {
    acquire(it->first, models::BlockUse::forward);
    forward_done(it->first);
  }
  for (auto it = unit_of_block_.rbegin(); it != unit_of_block_.rend(); ++it) {
    acquire(it->first, models::BlockUse::recompute);
    backward_done(it->first);
  }
}

void ParamShards::finish_gradients() {
  for (size_t k = 0; k < units_.size(); k++)
    if (!units_[k].reduced) reduce(k);
  torch::NoGradGuard ng;
  const double inv = 1.0 / world_;
  for (size_t k = 0; k < units_.size(); k++) {
    shards_[k].mutable_grad() = units_[k].grad.mul_(inv);
    units_[k].grad = at::Tensor();
  }
}

void ParamShards::drop_gradients() {
  for (auto &p : params_) p.mutable_grad() = at::Tensor();
  for (size_t k = 0; k < units_.size(); k++) {
    shards_[k].mutable_grad() = at::Tensor();
    units_[k].grad = at::Tensor();
    units_[k].reduced = false;
  }
}

std::pair<double, int64_t> ParamShards::gradient_norm() {
  torch::NoGradGuard ng;
  const auto dev = shards_.empty() ? c10::Device(c10::kCPU) : shards_[0].device();
  auto acc = at::zeros({2}, at::TensorOptions().dtype(at::kDouble).device(dev));
  for (const auto &s : shards_) {
    if (!s.grad().defined()) continue;
    const auto g = s.grad().to(at::kDouble);
    acc[0] += g.pow(2).sum();
    acc[1] += (~at::isfinite(g)).sum().to(at::kDouble);
  }
  if (group_) {
    std::vector<at::Tensor> t{acc};
    group_->allreduce(t, "gradient norm");
  }
  acc = acc.cpu();
  return {std::sqrt(acc[0].item<double>()), static_cast<int64_t>(acc[1].item<double>())};
}

void ParamShards::after_update() {
  if (!group_) return;
  torch::NoGradGuard ng;
  for (size_t k = 0; k < units_.size(); k++) {
    auto &u = units_[k];
    if (u.sharded_weights) continue;  // gathered at its next use
    std::vector<at::Tensor> outs;
    for (int r = 0; r < world_; r++) outs.push_back(u.flat.narrow(0, r * u.shard, u.shard));
    group_->allgather(outs, shards_[k].clone(), "weight all-gather after the update");
  }
}

void ParamShards::materialize_on(int root) {
  torch::NoGradGuard ng;
  for (size_t k = 0; k < units_.size(); k++) {
    auto &u = units_[k];
    if (!u.sharded_weights) continue;
    if (u.pending || (u.flat.defined() && u.flat.scalar_type() != at::kFloat)) {  // the float32 master weights
      finish_gather(k);
      release(k);
    }
    gather(k, at::kFloat);  // collective: every rank takes part, one block at a time
    if (rank_ == root)  // the gathered block holds this rank's shard too: the copy goes
      shards_[k] = u.flat.narrow(0, rank_ * u.shard, u.shard);
    else
      release(k);
  }
  materialized_ = rank_ == root;
}

NamedTensors ParamShards::gather_whole(const std::vector<at::Tensor> &slices) {
  torch::NoGradGuard ng;
  NamedTensors out;
  for (size_t k = 0; k < units_.size(); k++) {
    const auto &u = units_[k];
    const auto slice = slices.at(k).detach();
    auto flat = at::empty({u.padded}, slice.options());
    std::vector<at::Tensor> outs;
    for (int r = 0; r < world_; r++) outs.push_back(flat.narrow(0, r * u.shard, u.shard));
    if (group_)
      group_->allgather(outs, slice.contiguous(), "gathering the whole weights of unit " + std::to_string(k));
    else
      outs[0].copy_(slice);
    for (size_t j = 0; j < u.params.size(); j++) {
      const size_t i = u.params[j];
      out.emplace_back(names_[i], flat.narrow(0, u.offsets[j], c10::multiply_integers(shapes_[i])).view(shapes_[i]));
    }
  }
  return out;
}

std::vector<at::Tensor> ParamShards::cut_named(const std::map<std::string, at::Tensor> &whole) const {
  torch::NoGradGuard ng;
  std::vector<at::Tensor> out;
  for (size_t k = 0; k < units_.size(); k++) {
    const auto &u = units_[k];
    std::vector<at::Tensor> w(u.params.size());
    for (size_t j = 0; j < u.params.size(); j++) {
      const auto it = whole.find(names_[u.params[j]]);
      if (it != whole.end()) w[j] = it->second.to(shards_[k].device(), shards_[k].scalar_type());
    }
    out.push_back(cut(k, w, shards_[k]));
  }
  return out;
}

at::Tensor ParamShards::cut(size_t k, const std::vector<at::Tensor> &whole, const at::Tensor &base) const {
  const auto &u = units_[k];
  auto out = base.defined() ? base.detach().clone() : at::zeros({u.shard}, shards_[k].options());
  const int64_t lo = rank_ * u.shard, hi = lo + u.shard;
  for (size_t j = 0; j < u.params.size(); j++) {
    if (!whole[j].defined()) continue;
    const int64_t a = std::max(lo, u.offsets[j]), b = std::min(hi, u.offsets[j] + whole[j].numel());
    if (a >= b) continue;
    out.narrow(0, a - lo, b - a).copy_(whole[j].reshape({-1}).narrow(0, a - u.offsets[j], b - a));
  }
  return out;
}

void ParamShards::save(torch::serialize::OutputArchive &a, TrainOptimizer &opt) const {
  for (size_t k = 0; k < units_.size(); k++) {
    const std::string key = "u" + std::to_string(k) + ".";
    a.write(key + "weight", shards_[k].detach().to(at::kCPU));
    int64_t step = 0;
    for (const auto &[n, t] : opt.param_state(k, &step)) a.write(key + n, t.detach().to(at::kCPU));
    a.write(key + "step", at::tensor(step, at::kLong));
  }
}

json ParamShards::layout(const std::string &optimizer_kind) const {
  json units = json::array();
  for (const auto &u : units_) {
    json ps = json::array();
    for (size_t i : u.params) ps.push_back({{"name", names_[i]}, {"shape", shapes_[i]}});
    units.push_back({{"block", u.block}, {"params", ps}});
  }
  return {{"mode", sharding_name(mode_)}, {"world", world_}, {"optimizer", optimizer_kind}, {"units", units}};
}

void ParamShards::load(const std::map<std::string, ParamState> &whole, TrainOptimizer &opt) {
  torch::NoGradGuard ng;
  for (size_t k = 0; k < units_.size(); k++) {
    auto &u = units_[k];
    std::vector<at::Tensor> w(u.params.size());
    std::map<std::string, std::vector<at::Tensor>> st;  // state name -> per parameter of the unit
    int64_t step = 0;
    for (size_t j = 0; j < u.params.size(); j++) {
      const auto it = whole.find(names_[u.params[j]]);
      if (it == whole.end()) continue;
      w[j] = it->second.weight;
      for (const auto &[n, t] : it->second.state) {
        auto &v = st[n];
        v.resize(u.params.size());
        v[j] = t;
      }
      step = std::max(step, it->second.step);
    }
    // Weights (a missing parameter keeps its own): a sharded unit's slice, or a whole unit's
    // parameters, whose flat vector this rank's slice is a view of.
    if (u.sharded_weights) {
      shards_[k].copy_(cut(k, w, shards_[k]));
    } else {
      for (size_t j = 0; j < u.params.size(); j++)
        if (w[j].defined()) params_[u.params[j]].detach().copy_(w[j].reshape(params_[u.params[j]].sizes()));
    }
    if (st.empty()) continue;
    NamedTensors named;
    for (auto &[n, parts] : st) named.emplace_back(n, cut(k, parts));
    opt.set_param_state(k, named, step);
  }
}

std::map<std::string, ParamState> read_sharded_checkpoint(const std::string &dir, const json &layout) {
  const int world = layout.at("world").get<int>();
  const auto &units = layout.at("units");
  struct Place {
    std::string name;
    int64_t offset, numel;
  };
  std::vector<std::vector<Place>> places;
  std::vector<int64_t> shard_len;
  std::map<std::string, ParamState> out;
  for (const auto &u : units) {
    std::vector<Place> ps;
    int64_t n = 0;
    for (const auto &p : u.at("params")) {
      const auto shape = p.at("shape").get<std::vector<int64_t>>();
      int64_t numel = 1;
      for (int64_t d : shape) numel *= d;
      const std::string name = p.at("name").get<std::string>();
      ps.push_back({name, n, numel});
      out[name].weight = at::zeros(shape, at::kFloat);
      n += numel;
    }
    shard_len.push_back((n + world - 1) / world);
    places.push_back(std::move(ps));
  }
  for (int r = 0; r < world; r++) {
    const std::string file = dir + "/" + shard_file_name(r);
    torch::serialize::InputArchive a;
    try {
      a.load_from(file, c10::Device(c10::kCPU));
    } catch (const std::exception &e) {
      throw std::runtime_error("cannot read '" + file + "' (rank " + std::to_string(r) + "'s shard): " + e.what());
    }
    for (size_t k = 0; k < places.size(); k++) {
      const std::string key = "u" + std::to_string(k) + ".";
      const int64_t lo = r * shard_len[k], hi = lo + shard_len[k];
      auto piece = [&](const at::Tensor &src, const Place &p, at::Tensor &dst) {
        const int64_t a0 = std::max(lo, p.offset), b0 = std::min(hi, p.offset + p.numel);
        if (a0 >= b0) return;
        if (src.numel() != shard_len[k])
          throw std::runtime_error("'" + file + "' holds " + std::to_string(src.numel()) + " values of unit " +
                                   std::to_string(k) + ", its layout says " + std::to_string(shard_len[k]));
        dst.view({-1}).narrow(0, a0 - p.offset, b0 - a0).copy_(src.narrow(0, a0 - lo, b0 - a0));
      };
      at::Tensor w;
      a.read(key + "weight", w);
      at::Tensor step_t;
      a.read(key + "step", step_t);
      for (const char *st : {"exp_avg", "exp_avg_sq", "momentum_buffer"}) {
        at::Tensor t;
        if (!a.try_read(key + st, t)) continue;
        for (const auto &p : places[k]) {
          auto &ps = out[p.name];
          auto &dst = ps.state[st];
          if (!dst.defined()) dst = at::zeros_like(ps.weight);
          piece(t, p, dst);
        }
      }
      for (const auto &p : places[k]) {
        auto &ps = out[p.name];
        piece(w, p, ps.weight);
        ps.step = std::max<int64_t>(ps.step, step_t.item<int64_t>());
      }
    }
  }
  return out;
}

}  // namespace videotrain
