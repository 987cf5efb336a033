/* The latent cache's store: see latent_store.h. */
#include "latent_store.h"

#include <fcntl.h>
#include <glib.h>
#include <sys/stat.h>
#include <unistd.h>
#include <utime.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>

#include "crc32.h"
#include "regular_file.h"

namespace fs = std::filesystem;
using json = nlohmann::json;

namespace videotrain {

namespace {

constexpr char kMagic[8] = {'V', 'T', 'C', 'A', 'C', 'H', 'E', '2'};
constexpr size_t kFixed = 24;  // magic, header length, crc, payload length
constexpr uint64_t kMaxHeader = 1 << 20;  // a header lists a few tensors: far less than this
constexpr size_t kChunk = 1 << 20;        // payload bytes read at a time (a multiple of 8)
constexpr const char *kVersionDir = "v2";
constexpr const char *kTempPrefix = ".tmp-";

void put_le(std::string &s, uint64_t v, int bytes) {
  for (int i = 0; i < bytes; i++) s.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}
uint64_t get_le(const char *s, int bytes) {
  uint64_t v = 0;
  for (int i = 0; i < bytes; i++) v |= static_cast<uint64_t>(static_cast<unsigned char>(s[i])) << (8 * i);
  return v;
}

bool valid_key(const std::string &key) {
  return key.size() >= 8 && std::all_of(key.begin(), key.end(), [](char c) {
           return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f');
         });
}

// Bytes per element of the dtypes entries hold; 0 for any other name.
size_t element_size(const std::string &dtype) {
  if (dtype == "float32") return 4;
  if (dtype == "bfloat16" || dtype == "float16") return 2;
  if (dtype == "int64" || dtype == "float64") return 8;
  if (dtype == "uint8") return 1;  // vaeencoder's condition_frames
  return 0;
}

// Index of the first element of a float tensor's bytes that is NaN or infinite, or -1.
int64_t first_non_finite(const std::string &dtype, const char *p, size_t n) {
  auto scan = [&](auto word, uint64_t exp_mask) -> int64_t {
    using W = decltype(word);
    for (size_t i = 0; i + sizeof(W) <= n; i += sizeof(W)) {
      W w;
      std::memcpy(&w, p + i, sizeof w);
      if ((w & exp_mask) == exp_mask) return static_cast<int64_t>(i / sizeof(W));
    }
    return -1;
  };
  if (dtype == "float32") return scan(uint32_t(0), 0x7f800000u);
  if (dtype == "float16") return scan(uint16_t(0), 0x7c00u);
  if (dtype == "bfloat16") return scan(uint16_t(0), 0x7f80u);
  if (dtype == "float64") return scan(uint64_t(0), 0x7ff0000000000000ull);
  return -1;
}

// A JSON whole number in [lo, hi]; nlohmann's get<int64_t>() of 1e300 is undefined behaviour.
int64_t whole(const json &v, int64_t lo, const char *what) {
  if (v.is_number_unsigned() && v.get<uint64_t>() <= static_cast<uint64_t>(INT64_MAX)) return v.get<int64_t>();
  if (v.is_number_integer() && !v.is_number_unsigned() && v.get<int64_t>() >= lo) return v.get<int64_t>();
  throw std::runtime_error(std::string(what) + " is " + v.dump() + ", not a whole number from " + std::to_string(lo));
}

std::vector<int64_t> shape_of(const json &v) {
  if (!v.is_array() || v.size() > 16) throw std::runtime_error("shape " + v.dump().substr(0, 64) + " is not a list of up to 16 sizes");
  std::vector<int64_t> out;
  for (const auto &d : v) out.push_back(whole(d, -1, "a shape's size"));
  return out;
}

// An entry's fixed part and header, checked against the size of what holds it.
struct Layout {
  uint64_t hlen = 0, plen = 0;
  uint32_t crc = 0;
  std::vector<uint64_t> offsets;  // of each tensor in the payload
};

// The fixed part: lengths that add up to the file's size, a bounded header.
bool check_fixed(const char *fixed, uint64_t file_size, Layout *l, std::string *why) {
  if (file_size < kFixed || std::memcmp(fixed, kMagic, sizeof kMagic) != 0) {
    const bool old = file_size >= kFixed && std::memcmp(fixed, "VTCACHE1", 8) == 0;
    *why = old ? std::string("an entry of the older VTCACHE1 format")
               : "not a cache entry (" + std::to_string(file_size) + " bytes, no VTCACHE2 header)";
    return false;
  }
  l->hlen = get_le(fixed + 8, 4);
  l->crc = static_cast<uint32_t>(get_le(fixed + 12, 4));
  l->plen = get_le(fixed + 16, 8);
  if (l->hlen > kMaxHeader) {
    *why = "header of " + std::to_string(l->hlen) + " bytes (at most " + std::to_string(kMaxHeader) + ")";
    return false;
  }
  if (l->plen > file_size || kFixed + l->hlen + l->plen != file_size) {
    *why = "entry is " + std::to_string(file_size) + " bytes, its header announces " +
           (l->plen > file_size ? std::string("a payload of ") + std::to_string(l->plen)
                                : std::to_string(kFixed + l->hlen + l->plen)) +
           " (truncated or overwritten)";
    return false;
  }
  return true;
}

// The JSON header: tensors whose shapes give their byte counts and that tile the payload, the
// key it was written for, and what they must match (the reader's expectation, else the writer's).
// Leaves every tensor's bytes empty.
bool parse_header(const char *h, uint64_t hlen, Layout *l, const std::string &key,
                  const std::vector<TensorSpec> *expect, CacheEntry *e, std::string *why) {
  try {
    const json j = json::parse(h, h + hlen);
    if (!j.is_object()) throw std::runtime_error("not a JSON object");
    e->info = j.value("info", "");
    e->key = j.value("key", "");
    if (!key.empty() && e->key != key) {
      *why = "the entry was written for another key (" + (e->key.empty() ? std::string("none") : e->key.substr(0, 16)) +
             "...): moved or swapped between keys";
      return false;
    }
    uint64_t next = 0;
    for (const auto &t : j.at("tensors")) {
      CachedTensor c;
      c.name = t.at("name").get<std::string>();
      c.dtype = t.at("dtype").get<std::string>();
      c.shape = shape_of(t.at("shape"));
      const uint64_t off = static_cast<uint64_t>(whole(t.at("offset"), 0, "offset")),
                     size = static_cast<uint64_t>(whole(t.at("size"), 0, "size"));
      const size_t es = element_size(c.dtype);
      if (es == 0) throw std::runtime_error("tensor " + c.name + " has dtype '" + c.dtype + "'");
      uint64_t n = es;
      for (int64_t d : c.shape) {
        if (d < 0 || (d > 0 && n > UINT64_MAX / static_cast<uint64_t>(d)))
          throw std::runtime_error("tensor " + c.name + " has the shape " + describe_shape(c.shape));
        n *= static_cast<uint64_t>(d);
      }
      if (n != size)
        throw std::runtime_error("tensor " + c.name + " of shape " + describe_shape(c.shape) + " holds " +
                                 std::to_string(size) + " bytes, not " + std::to_string(n));
      if (off != next || size > l->plen - off)
        throw std::runtime_error("tensor " + c.name + " lies outside its place in the payload");
      next = off + size;
      l->offsets.push_back(off);
      e->tensors.push_back(std::move(c));
    }
    if (next != l->plen) throw std::runtime_error("the tensors do not fill the payload");
    if (j.contains("expect"))
      for (const auto &t : j.at("expect"))
        e->expect.push_back({t.at("name").get<std::string>(), t.at("dtype").get<std::string>(),
                             shape_of(t.at("shape"))});
  } catch (const std::exception &ex) {
    *why = std::string("bad entry header: ") + ex.what();
    return false;
  }
  for (const TensorSpec &s : expect ? *expect : e->expect) {
    const CachedTensor *t = e->find(s.name);
    const std::string bad = t ? spec_mismatch(s, *t) : "the entry holds no " + s.name;
    if (!bad.empty()) {
      *why = bad;
      return false;
    }
  }
  return true;
}

// Reads an entry through `read` (offset, buffer, bytes): the fixed part and header first, then
// the payload in bounded pieces (checksum, finite floats), into e's tensors when `keep`.
using ReadAt = std::function<bool(uint64_t, void *, size_t, std::string *)>;
bool read_entry(const ReadAt &read, uint64_t file_size, const std::string &key, const std::vector<TensorSpec> *expect,
                bool keep, CacheEntry *e, std::string *why) {
  char fixed[kFixed] = {0};
  Layout l;
  if (file_size >= kFixed && !read(0, fixed, kFixed, why)) return false;
  if (!check_fixed(fixed, file_size, &l, why)) return false;
  std::string header(static_cast<size_t>(l.hlen), '\0');
  if (!read(kFixed, header.data(), header.size(), why)) return false;
  if (!parse_header(header.data(), l.hlen, &l, key, expect, e, why)) return false;
  uint32_t crc = crc32_update(0, header.data(), header.size());
  auto end_of = [&](size_t k) { return k + 1 < l.offsets.size() ? l.offsets[k + 1] : l.plen; };
  if (keep)  // bounded: the sizes add up to the file's (and to what `expect` allows)
    for (size_t k = 0; k < e->tensors.size(); k++) e->tensors[k].bytes.reserve(static_cast<size_t>(end_of(k) - l.offsets[k]));
  std::vector<char> buf(static_cast<size_t>(std::min<uint64_t>(kChunk, l.plen)));
  size_t ti = 0;
  for (uint64_t pos = 0; pos < l.plen;) {
    const size_t n = static_cast<size_t>(std::min<uint64_t>(buf.size(), l.plen - pos));
    if (!read(kFixed + l.hlen + pos, buf.data(), n, why)) return false;
    crc = crc32_update(crc, buf.data(), n);
    // The tensors that this piece overlaps (they tile the payload in order).
    for (size_t k = ti; k < e->tensors.size(); k++) {
      CachedTensor &t = e->tensors[k];
      const uint64_t tb = l.offsets[k], te = end_of(k);
      if (tb >= pos + n) break;
      const uint64_t b = std::max(tb, pos), en = std::min(te, pos + n);
      if (en <= b) continue;
      const char *p = buf.data() + (b - pos);
      // Elements start at multiples of their size from the tensor's start; so do the pieces.
      const size_t es = element_size(t.dtype);
      if ((b - tb) % es == 0 && (en - b) % es == 0) {
        const int64_t bad = first_non_finite(t.dtype, p, static_cast<size_t>(en - b));
        if (bad >= 0) {
          *why = "tensor " + t.name + " holds a non-finite value (element " +
                 std::to_string((b - tb) / es + static_cast<uint64_t>(bad)) + ")";
          return false;
        }
      }
      if (keep) t.bytes.append(p, static_cast<size_t>(en - b));
      if (te <= pos + n) ti = k + 1;
    }
    pos += n;
  }
  if (crc != l.crc) {
    *why = "checksum mismatch (the entry's bytes changed after it was written)";
    return false;
  }
  return true;
}

}  // namespace

std::string describe_shape(const std::vector<int64_t> &shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); i++) s += (i ? ", " : "") + (shape[i] < 0 ? std::string("*") : std::to_string(shape[i]));
  return s + "]";
}

std::string spec_mismatch(const TensorSpec &spec, const CachedTensor &t) {
  bool same = t.dtype == spec.dtype && t.shape.size() == spec.shape.size();
  for (size_t i = 0; same && i < spec.shape.size(); i++) same = spec.shape[i] < 0 || spec.shape[i] == t.shape[i];
  if (same) return "";
  return "tensor " + t.name + " is " + t.dtype + " " + describe_shape(t.shape) + ", expected " + spec.dtype + " " +
         describe_shape(spec.shape);
}

const CachedTensor *CacheEntry::find(const std::string &name) const {
  for (const auto &t : tensors)
    if (t.name == name) return &t;
  return nullptr;
}

std::string encode_cache_entry(const CacheEntry &entry, const std::string &key) {
  json h;
  h["key"] = key;
  h["tensors"] = json::array();
  uint64_t offset = 0;
  for (const auto &t : entry.tensors) {
    h["tensors"].push_back({{"name", t.name}, {"dtype", t.dtype}, {"shape", t.shape}, {"offset", offset},
                            {"size", t.bytes.size()}});
    offset += t.bytes.size();
  }
  if (!entry.expect.empty()) {
    h["expect"] = json::array();
    for (const auto &s : entry.expect) h["expect"].push_back({{"name", s.name}, {"dtype", s.dtype}, {"shape", s.shape}});
  }
  h["info"] = entry.info;
  const std::string header = h.dump();
  uint32_t crc = crc32_update(0, header.data(), header.size());
  for (const auto &t : entry.tensors) crc = crc32_update(crc, t.bytes.data(), t.bytes.size());
  std::string out(kMagic, sizeof kMagic);
  put_le(out, header.size(), 4);
  put_le(out, crc, 4);
  put_le(out, offset, 8);
  out.reserve(out.size() + header.size() + offset);
  out += header;
  for (const auto &t : entry.tensors) out += t.bytes;
  return out;
}

bool decode_cache_entry(const std::string &b, CacheEntry *out, std::string *why, const std::string &key,
                        const std::vector<TensorSpec> *expect) {
  auto read = [&b](uint64_t off, void *dst, size_t n, std::string *err) {
    if (off > b.size() || n > b.size() - off) {
      *err = "short read";
      return false;
    }
    std::memcpy(dst, b.data() + off, n);
    return true;
  };
  CacheEntry e;
  if (!read_entry(read, b.size(), key, expect, true, &e, why)) return false;
  *out = std::move(e);
  return true;
}

std::unique_ptr<LatentStore> LatentStore::open(const std::string &dir, bool writable, std::string *why) {
  auto s = std::unique_ptr<LatentStore>(new LatentStore());
  s->dir_ = dir;
  s->writable_ = writable;
  std::error_code ec;
  const fs::path root = fs::path(dir) / kVersionDir;
  if (writable) {
    fs::create_directories(root, ec);
    if (ec || ::access(root.c_str(), W_OK) != 0) {
      *why = "cannot write to cache folder '" + dir + "': " + (ec ? ec.message() : std::strerror(errno)) +
             " (property cache-dir; cache-mode=read uses a read-only cache)";
      return nullptr;
    }
  } else if (!fs::is_directory(dir, ec)) {
    *why = "cache folder '" + dir + "' does not exist (property cache-dir; cache-mode=read only reads)";
    return nullptr;
  }
  return s;
}

std::string LatentStore::entry_path(const std::string &key) const {
  return dir_ + "/" + kVersionDir + "/" + key.substr(0, 2) + "/" + key.substr(2, 2) + "/" + key;
}

bool LatentStore::contains(const std::string &key) const {
  struct stat st {};
  return valid_key(key) && ::stat(entry_path(key).c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

LatentStore::Lookup LatentStore::get(const std::string &key, CacheEntry *out, std::string *why,
                                     const std::vector<TensorSpec> *expect) const {
  if (!valid_key(key)) {
    *why = "bad key '" + key + "'";
    return Lookup::kCorrupt;
  }
  const std::string path = entry_path(key);
  RegularFile f;
  bool missing = false;
  std::string err;
  if (!f.open(path, &err, &missing)) {
    if (missing) return Lookup::kMiss;
    *why = err;
    return Lookup::kCorrupt;
  }
  CacheEntry e;
  auto read = [&f](uint64_t off, void *dst, size_t n, std::string *w) { return f.read_at(off, dst, n, w); };
  if (!read_entry(read, f.size(), key, expect, true, &e, &err)) {
    *why = path + ": " + err;
    return Lookup::kCorrupt;
  }
  *out = std::move(e);
  // Marks the entry used for `videotrain-cache prune` (at most once a day, to keep reads cheap).
  struct stat st {};
  if (writable_ && ::fstat(f.fd(), &st) == 0 && std::time(nullptr) - st.st_mtime > 86400)
    ::utime(path.c_str(), nullptr);
  return Lookup::kHit;
}

bool LatentStore::put(const std::string &key, const CacheEntry &entry, std::string *why) {
  if (!writable_) {
    *why = "the cache is read-only (cache-mode=read)";
    return false;
  }
  if (!valid_key(key)) {
    *why = "bad key '" + key + "'";
    return false;
  }
  const std::string path = entry_path(key);
  const fs::path folder = fs::path(path).parent_path();
  std::error_code ec;
  fs::create_directories(folder, ec);
  // Unique per process and call: ranks and nodes never share a temporary file.
  static thread_local std::mt19937_64 rng{std::random_device{}() ^ static_cast<uint64_t>(::getpid())};
  char host[64] = {0};
  ::gethostname(host, sizeof host - 1);
  const std::string tmp = (folder / (std::string(kTempPrefix) + host + "-" + std::to_string(::getpid()) + "-" +
                                     std::to_string(rng()))).string();
  const std::string bytes = encode_cache_entry(entry, key);
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (fd < 0) {
    *why = "cannot create '" + tmp + "': " + std::strerror(errno);
    return false;
  }
  size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t w = ::write(fd, bytes.data() + done, bytes.size() - done);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) {
      *why = "cannot write '" + tmp + "': " + std::strerror(errno);
      ::close(fd);
      ::unlink(tmp.c_str());
      return false;
    }
    done += static_cast<size_t>(w);
  }
  if (::close(fd) != 0 || ::rename(tmp.c_str(), path.c_str()) != 0) {
    *why = "cannot store '" + path + "': " + std::strerror(errno);
    ::unlink(tmp.c_str());
    return false;
  }
  return true;
}

std::vector<LatentStore::File> LatentStore::list() const {
  std::vector<File> out;
  std::error_code ec;
  const fs::path root = fs::path(dir_) / kVersionDir;
  for (fs::recursive_directory_iterator it(root, ec), end; !ec && it != end; it.increment(ec)) {
    // Anything but a folder: a FIFO or a symlink where an entry belongs is listed, so that
    // verify reports it and prune removes it.
    struct stat st {};
    if (::lstat(it->path().c_str(), &st) != 0 || S_ISDIR(st.st_mode)) continue;
    File f;
    f.path = it->path().string();
    f.bytes = static_cast<uint64_t>(st.st_size);
    f.mtime = static_cast<int64_t>(st.st_mtime);
    f.temporary = it->path().filename().string().rfind(kTempPrefix, 0) == 0;
    out.push_back(std::move(f));
  }
  std::sort(out.begin(), out.end(), [](const File &a, const File &b) { return a.mtime < b.mtime; });
  return out;
}

std::string LatentStore::verify_file(const std::string &path) {
  RegularFile f;
  std::string why;
  if (!f.open(path, &why)) return why;
  const std::string name = fs::path(path).filename().string();
  CacheEntry e;
  auto read = [&f](uint64_t off, void *dst, size_t n, std::string *w) { return f.read_at(off, dst, n, w); };
  return read_entry(read, f.size(), name, nullptr, false, &e, &why) ? "" : why;
}

std::string sha256_hex(const std::string &bytes) {
  gchar *h = g_compute_checksum_for_data(G_CHECKSUM_SHA256, reinterpret_cast<const guchar *>(bytes.data()), bytes.size());
  std::string out(h);
  g_free(h);
  return out;
}

bool sha256_file(const std::string &path, std::string *hex, std::string *why) {
  RegularFile file;
  if (!file.open(path, why)) {
    *why = "cannot read " + *why;
    return false;
  }
  const int fd = file.fd();
  GChecksum *c = g_checksum_new(G_CHECKSUM_SHA256);
  std::vector<unsigned char> buf(1 << 20);
  bool ok = true;
  for (;;) {
    const ssize_t r = ::read(fd, buf.data(), buf.size());
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) {
      *why = "cannot read '" + path + "': " + std::strerror(errno);
      ok = false;
      break;
    }
    if (r == 0) break;
    g_checksum_update(c, buf.data(), r);
  }
  if (ok) *hex = g_checksum_get_string(c);
  g_checksum_free(c);
  return ok;
}

}  // namespace videotrain
