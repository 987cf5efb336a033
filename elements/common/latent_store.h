/* The latent cache's store: one file per entry under DIR/v2/ab/cd/<key>, written to a temporary
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
 * Entry: "VTCACHE2", u32 header length, u32 CRC-32 of header and payload, u64 payload length
 * (little-endian), a JSON header (key: the key it was written for; tensors: name, dtype, shape,
 * offset, size; expect: the tensors the writer expected, when it said; info: free text), then the
 * payload. An entry is checked before anything is used: the lengths against the file's size, the
 * header (bounded) before the payload is read, the key it was written for, the tensors' byte counts
 * against their shapes and against what the reader expects, the checksum, and finite floats. A
 * failed check is corrupt: a miss with a reason (the caller encodes again and put() replaces it).
 * Entries of the older format (v1/, VTCACHE1) are not read: misses.
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

// A tensor a reader expects, or a writer expected: a shape dimension of -1 matches any size.
struct TensorSpec {
  std::string name, dtype;
  std::vector<int64_t> shape;
};
// "" when t is what spec describes, else why not.
std::string spec_mismatch(const TensorSpec &spec, const CachedTensor &t);
std::string describe_shape(const std::vector<int64_t> &shape);

struct CacheEntry {
  std::vector<CachedTensor> tensors;
  std::string info;  // what the key was made of, for `videotrain-cache` and debugging
  std::vector<TensorSpec> expect;  // what the writer expected (recorded, checked by verify)
  std::string key;  // the key it was written for (set by get() and decode; put() writes its own)
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
  // kCorrupt: the entry exists but cannot be used (*why says why: not a regular file, truncated,
  // written for another key, tensors other than `expect` describes, a checksum mismatch,
  // non-finite values); the caller encodes again and put() replaces it. Reads only what the
  // header declares, after checking it against the file's size and `expect`.
  Lookup get(const std::string &key, CacheEntry *out, std::string *why,
             const std::vector<TensorSpec> *expect = nullptr) const;
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
  // Checks one entry file as get() would (its key is its file name; what its writer expected
  // stands for the reader), reading it in bounded pieces; "" when it is usable.
  static std::string verify_file(const std::string &path);

 private:
  std::string dir_;
  bool writable_ = false;
};

// SHA-256 of bytes, and of a file's content (streamed), as 64 hex digits.
std::string sha256_hex(const std::string &bytes);
bool sha256_file(const std::string &path, std::string *hex, std::string *why);

// Serialises / parses an entry file's bytes (tests and the fuzz target use them too). encode
// records `key`; decode checks an entry as get() does (key "" accepts any, expect null: the
// entry's own).
std::string encode_cache_entry(const CacheEntry &entry, const std::string &key);
bool decode_cache_entry(const std::string &file_bytes, CacheEntry *out, std::string *why, const std::string &key = "",
                        const std::vector<TensorSpec> *expect = nullptr);

}  // namespace videotrain
