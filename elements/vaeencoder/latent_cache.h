/* vaeencoder's latent cache (cache-dir, cache-mode), between its face and the store: answers
 * csvvideosrc's lookups (any thread), keeps a hit's entry until the clip's turn comes, and writes
 * what the encoder computed for the clips it was asked about. A clip's key is the SHA-256 of the
 * source's part (video content, frames, size and fit), the fingerprint of the elements between
 * source and encoder, and the encoder's part (model content, dtype, chunking, tiles, norm-scope).
 * No torch, no GObject. */
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "cache_protocol.h"
#include "latent_store.h"

namespace videotrain::vae {

enum class CacheMode { ReadWrite, Read, Write };

class LatentCache {
 public:
  // Null with a reason naming the folder.
  static std::unique_ptr<LatentCache> open(const std::string &dir, CacheMode mode, const std::string &encoder_key,
                                           std::string *why);

  // A lookup for a clip not yet decoded: true when the cache holds it under its key, with the
  // tensors `expect` describes (the entry is kept for take()). A miss is remembered so that
  // store() writes the clip once encoded, recording `expect`. *warning: an unusable entry (another
  // key's, another shape or dtype, damaged, non-finite, not a file): it is encoded again and
  // rewritten.
  bool lookup(const ClipIdentity &clip, const std::string &chain, const std::vector<TensorSpec> &expect,
              std::string *warning);
  // The entry kept for a held clip; false when there is none (a flush dropped it).
  bool take(const ClipIdentity &clip, CacheEntry *out);
  // After a clip was encoded: writes its moments when a lookup asked for it (false with *why on
  // a failed write; true when there was nothing to write).
  bool store(uint64_t sample_id, uint32_t epoch, uint64_t clip_index, const CacheEntry &entry, std::string *why);
  void clear();  // a flush or stop: forget held entries and pending writes

  uint64_t hits() const;
  uint64_t misses() const;

 private:
  using ClipKey = std::tuple<uint64_t, uint32_t, uint64_t>;  // sample id, epoch, clip index
  std::unique_ptr<LatentStore> store_;
  CacheMode mode_ = CacheMode::ReadWrite;
  std::string encoder_key_;
  mutable std::mutex lock_;
  std::map<ClipKey, CacheEntry> held_;
  std::map<ClipKey, std::pair<std::string, std::vector<TensorSpec>>> to_write_;  // key, expectation
  uint64_t hits_ = 0, misses_ = 0;
};

}  // namespace videotrain::vae
