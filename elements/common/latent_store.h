/* The latent cache's store: one file per entry under DIR/v1/ab/cd/<key>, written to a temporary
 * name in the same folder and renamed, so that a reader sees a whole entry or none.
 *
 * Why files and not LMDB or segments: a rename is atomic on local filesystems and on NFS, so ranks
 * on one machine and nodes sharing a filesystem fill one cache at once without locks (two writers
 * of one key write the same bytes; the last rename wins); a kill -9 leaves at most a temporary file
 * (pruned later), never a torn entry; there is no index to rebuild or compact, and pruning is
 * deleting files. Every lookup opens, reads and closes one file, so open files stay bounded.
 * LMDB's locking is unsafe on network filesystems, and append-only segments need an index that
 * every process must rebuild or share.
 *
 * Entry: "VTCACHE1", u32 header length, u32 CRC-32 of header and payload, u64 payload length
 * (little-endian), a JSON header (tensors: name, dtype, shape, offset, size; info: free text),
 * then the payload. A short, long or mismatching file is corrupt: a miss with a reason.
 * No torch here. */
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace videotrain {

struct CachedTensor {
  std::string name;    // "moments", "text_embeds", ...
  std::string dtype;   // float32 | bfloat16 | float16 | int64
  std::vector<int64_t> shape;
  std::string bytes;   // contiguous, little-endian
};

struct CacheEntry {
  std::vector<CachedTensor> tensors;
  std::string info;  // what the key was made of, for `videotrain-cache` and debugging
  const CachedTensor *find(const std::string &name) const;
};

class LatentStore {
 public:
  // Opens DIR (created when writable). Null with a reason naming the folder.
  static std::unique_ptr<LatentStore> open(const std::string &dir, bool writable, std::string *why);

  const std::string &dir() const { return dir_; }
  bool writable() const { return writable_; }
  std::string entry_path(const std::string &key) const;

  enum class Lookup { kHit, kMiss, kCorrupt };
  // kCorrupt: the entry exists but cannot be used (*why says why); the caller encodes again and
  // put() replaces it.
  Lookup get(const std::string &key, CacheEntry *out, std::string *why) const;
  bool contains(const std::string &key) const;
  // False with a reason (disk full, read-only folder).
  bool put(const std::string &key, const CacheEntry &entry, std::string *why);

  // Every entry file and leftover temporary file (for the tool), oldest first.
  struct File {
    std::string path;
    uint64_t bytes = 0;
    int64_t mtime = 0;   // seconds since the epoch
    bool temporary = false;
  };
  std::vector<File> list() const;
  // Reads and checks one entry file; "" when it is whole.
  static std::string verify_file(const std::string &path);

 private:
  std::string dir_;
  bool writable_ = false;
};

// SHA-256 of bytes, and of a file's content (streamed), as 64 hex digits.
std::string sha256_hex(const std::string &bytes);
bool sha256_file(const std::string &path, std::string *hex, std::string *why);

// Serialises / parses an entry file's bytes (tests and the tool use them too).
std::string encode_cache_entry(const CacheEntry &entry);
bool decode_cache_entry(const std::string &file_bytes, CacheEntry *out, std::string *why);

}  // namespace videotrain
