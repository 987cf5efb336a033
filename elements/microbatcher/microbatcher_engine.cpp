#include "microbatcher_engine.h"

#include <utility>

namespace videotrain {

std::string shape_string(const std::vector<int64_t> &shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); i++) {
    if (i) s += ", ";
    s += std::to_string(shape[i]);
  }
  return s + "]";
}

bool MicroBatcherEngine::validate(const MicroBatcherConfig &cfg, std::string *why) {
  if (cfg.batch_size == 0) {
    if (why) *why = "batch-size must be at least 1";
    return false;
  }
  const uint32_t m = cfg.effective_micro_batch_size();
  if (cfg.batch_size % m != 0) {
    if (why)
      *why = "micro-batch-size=" + std::to_string(m) + " does not divide batch-size=" +
             std::to_string(cfg.batch_size);
    return false;
  }
  return true;
}

MicroBatcherEngine::MicroBatcherEngine(const MicroBatcherConfig &cfg, Release release)
    : cfg_(cfg), micro_(cfg.effective_micro_batch_size()), release_(std::move(release)),
      next_step_(cfg.start_step) {
  if (micro_ == 0) micro_ = 1;  // guarded by validate(); never divide by zero anyway
  pending_.reserve(cfg.batch_size);
}

MicroBatcherEngine::~MicroBatcherEngine() { release_pending(); }

void MicroBatcherEngine::release_pending() {
  for (auto &s : pending_)
    if (release_ && s.handle) release_(s.handle);
  pending_.clear();
}

bool MicroBatcherEngine::push(MicroBatcherSample sample, std::vector<MicroBatch> *out, std::string *why) {
  sample.arrival = arrivals_++;
  if (!pending_.empty() && (sample.group_size > 0 || pending_.back().group_size > 0)) {
    const MicroBatcherSample &prev = pending_.back();
    if (prev.epoch != sample.epoch || prev.group != sample.group || prev.group_size != sample.group_size)
      close_step(out, false);
  }

  if (!cfg_.bucket) {
    // Micro-batches are consecutive runs of micro_ samples in arrival order.
    const size_t pos = pending_.size();
    const size_t first = pos - pos % micro_;
    if (pos != first && pending_[first].shape != sample.shape) {
      if (why)
        *why = "bucket=false and micro-batch " + std::to_string(pos / micro_) + " of step " +
               std::to_string(next_step_) + " mixes shapes: sample " + std::to_string(pending_[first].sample_id) +
               " has " + shape_string(pending_[first].shape) + ", sample " + std::to_string(sample.sample_id) +
               " has " + shape_string(sample.shape) + " (set bucket=true to group samples by shape)";
      if (release_ && sample.handle) release_(sample.handle);
      return false;
    }
  }
  pending_.push_back(std::move(sample));
  const uint32_t group_size = pending_.back().group_size;
  // A group is a step on every rank, full or not: drop-last must not drop it on some ranks only.
  if (pending_.size() >= cfg_.batch_size || (group_size > 0 && pending_.size() >= group_size)) close_step(out, false);
  return true;
}

void MicroBatcherEngine::finish(std::vector<MicroBatch> *out) {
  close_step(out, pending_.empty() || pending_.back().group_size == 0);  // a group is never dropped
}

void MicroBatcherEngine::flush() { release_pending(); }

void MicroBatcherEngine::close_step(std::vector<MicroBatch> *out, bool droppable) {
  if (pending_.empty()) return;
  if (droppable && pending_.size() < cfg_.batch_size && cfg_.drop_last) {
    dropped_ += pending_.size();
    release_pending();
    return;
  }
  const MicroBatcherSample &last = pending_.back();
  const uint32_t epoch = last.epoch;
  const uint64_t next_clip = last.clip_index + 1;
  const uint32_t step_samples = static_cast<uint32_t>(pending_.size());

  // Groups of equal shape, in order of first appearance (deterministic across runs);
  // without bucketing, one group in arrival order (shapes were checked on push).
  std::vector<std::vector<size_t>> groups;
  if (cfg_.bucket) {
    for (size_t i = 0; i < pending_.size(); i++) {
      bool placed = false;
      for (auto &g : groups) {
        if (pending_[g.front()].shape == pending_[i].shape) {
          g.push_back(i);
          placed = true;
          break;
        }
      }
      if (!placed) groups.push_back({i});
    }
  } else {
    groups.emplace_back();
    for (size_t i = 0; i < pending_.size(); i++) groups.back().push_back(i);
  }

  std::vector<MicroBatch> batches;
  for (const auto &g : groups) {
    for (size_t start = 0; start < g.size(); start += micro_) {
      MicroBatch mb;
      mb.step = next_step_;
      mb.step_samples = step_samples;
      mb.epoch = epoch;
      mb.next_clip = next_clip;
      for (size_t k = start; k < g.size() && k < start + micro_; k++) mb.samples.push_back(std::move(pending_[g[k]]));
      batches.push_back(std::move(mb));
    }
  }
  const uint32_t count = static_cast<uint32_t>(batches.size());
  for (uint32_t i = 0; i < count; i++) {
    batches[i].micro_index = i;
    batches[i].micro_count = count;
    batches[i].sync = (i + 1 == count);
    out->push_back(std::move(batches[i]));
  }
  pending_.clear();
  next_step_++;
}

void MicroBatcherEngine::restart_steps_at(uint64_t step) {
  flush();
  next_step_ = step;
}

}  // namespace videotrain
