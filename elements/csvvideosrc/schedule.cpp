#include "schedule.h"

#include <numeric>

namespace videotrain {

Schedule::Schedule(uint64_t rows, int rank, int world_size, bool shuffle, uint64_t seed)
    : rows_(rows), rank_(rank), world_(world_size < 1 ? 1 : world_size), shuffle_(shuffle), seed_(seed) {
  clips_per_epoch_ = rows_ == 0 ? 0 : (rows_ + world_ - 1) / world_;
}

const std::vector<uint32_t> &Schedule::permutation(uint32_t epoch) const {
  auto it = cache_.find(epoch);
  if (it != cache_.end()) return it->second;
  while (cache_.size() >= 2) cache_.erase(cache_.begin());
  std::vector<uint32_t> p(rows_);
  std::iota(p.begin(), p.end(), 0u);
  // Fisher-Yates with our own generator: std distributions differ between libraries.
  uint64_t state = hash_combine(seed_, epoch);
  for (uint64_t i = rows_; i > 1; i--) {
    state = mix64(state);
    uint64_t j = static_cast<uint64_t>((static_cast<unsigned __int128>(state) * i) >> 64);
    std::swap(p[i - 1], p[j]);
  }
  return cache_.emplace(epoch, std::move(p)).first->second;
}

uint64_t Schedule::permuted(uint32_t epoch, uint64_t position) const {
  if (!shuffle_) return position;
  std::lock_guard<std::mutex> g(lock_);
  return permutation(epoch)[position];
}

ScheduleSlot Schedule::at(uint32_t epoch, uint64_t clip) const {
  ScheduleSlot s;
  if (rows_ == 0) return s;
  uint64_t pos = static_cast<uint64_t>(rank_) + clip * static_cast<uint64_t>(world_);
  s.padding = pos >= rows_;
  s.index = permuted(epoch, pos % rows_);
  return s;
}

ScheduleSlot Schedule::replacement(uint32_t epoch, uint64_t clip, uint64_t k) const {
  ScheduleSlot s = at(epoch, (clip + k) % clips_per_epoch_);
  s.padding = true;  // a repeat of another sample of the shard
  return s;
}

}  // namespace videotrain
