/* vaeencoder's latent cache: see latent_cache.h. */
#include "latent_cache.h"

namespace videotrain::vae {

std::unique_ptr<LatentCache> LatentCache::open(const std::string &dir, CacheMode mode, const std::string &encoder_key,
                                               std::string *why) {
  auto store = LatentStore::open(dir, mode != CacheMode::Read, why);
  if (!store) return nullptr;
  auto c = std::unique_ptr<LatentCache>(new LatentCache());
  c->store_ = std::move(store);
  c->mode_ = mode;
  c->encoder_key_ = encoder_key;
  return c;
}

bool LatentCache::lookup(const ClipIdentity &clip, const std::string &chain, const std::vector<TensorSpec> &expect,
                         std::string *warning) {
  const std::string key = sha256_hex("videotrain latent 1\n" + clip.source_key + "\nchain " + chain + "\n" + encoder_key_);
  const ClipKey id{clip.sample_id, clip.epoch, clip.clip_index};
  CacheEntry e;
  std::string why;
  const auto r = mode_ == CacheMode::Write ? LatentStore::Lookup::kMiss : store_->get(key, &e, &why, &expect);
  std::lock_guard<std::mutex> g(lock_);
  if (r == LatentStore::Lookup::kHit) {
    hits_++;
    held_[id] = std::move(e);
    return true;
  }
  if (r == LatentStore::Lookup::kCorrupt) *warning = "unusable latent cache entry, encoding the clip again: " + why;
  misses_++;
  if (mode_ != CacheMode::Read) to_write_[id] = {key, expect};
  return false;
}

bool LatentCache::take(const ClipIdentity &clip, CacheEntry *out) {
  std::lock_guard<std::mutex> g(lock_);
  auto it = held_.find({clip.sample_id, clip.epoch, clip.clip_index});
  if (it == held_.end()) return false;
  *out = std::move(it->second);
  held_.erase(it);
  return true;
}

bool LatentCache::store(uint64_t sample_id, uint32_t epoch, uint64_t clip_index, const CacheEntry &entry,
                        std::string *why) {
  std::string key;
  CacheEntry bound = entry;
  {
    std::lock_guard<std::mutex> g(lock_);
    auto it = to_write_.find({sample_id, epoch, clip_index});
    if (it == to_write_.end()) return true;
    key = std::move(it->second.first);
    bound.expect = std::move(it->second.second);
    to_write_.erase(it);
  }
  // What the encoder computed must be what its lookups expect, else every later lookup misses.
  for (const TensorSpec &s : bound.expect) {
    const CachedTensor *t = bound.find(s.name);
    const std::string bad = t ? spec_mismatch(s, *t) : "no " + s.name;
    if (!bad.empty()) {
      *why = "not stored: " + bad;
      return false;
    }
  }
  return store_->put(key, bound, why);
}

void LatentCache::clear() {
  std::lock_guard<std::mutex> g(lock_);
  held_.clear();
  to_write_.clear();
}

uint64_t LatentCache::hits() const {
  std::lock_guard<std::mutex> g(lock_);
  return hits_;
}

uint64_t LatentCache::misses() const {
  std::lock_guard<std::mutex> g(lock_);
  return misses_;
}

}  // namespace videotrain::vae
