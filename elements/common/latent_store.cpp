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
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>

#include "crc32.h"

namespace fs = std::filesystem;
using json = nlohmann::json;

namespace videotrain {

namespace {

constexpr char kMagic[8] = {'V', 'T', 'C', 'A', 'C', 'H', 'E', '1'};
constexpr size_t kFixed = 24;  // magic, header length, crc, payload length
constexpr const char *kVersionDir = "v1";
constexpr const char *kTempPrefix = ".tmp-";

void put_le(std::string &s, uint64_t v, int bytes) {
  for (int i = 0; i < bytes; i++) s.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}
uint64_t get_le(const std::string &s, size_t at, int bytes) {
  uint64_t v = 0;
  for (int i = 0; i < bytes; i++) v |= static_cast<uint64_t>(static_cast<unsigned char>(s[at + i])) << (8 * i);
  return v;
}

bool valid_key(const std::string &key) {
  return key.size() >= 8 && std::all_of(key.begin(), key.end(), [](char c) {
           return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f');
         });
}

bool read_whole(const std::string &path, std::string *out, std::string *why) {
  std::ifstream f(path, std::ios::binary);
  if (!f) {
    *why = std::strerror(errno);
    return false;
  }
  std::ostringstream s;
  s << f.rdbuf();
  *out = s.str();
  return true;
}

}  // namespace

const CachedTensor *CacheEntry::find(const std::string &name) const {
  for (const auto &t : tensors)
    if (t.name == name) return &t;
  return nullptr;
}

std::string encode_cache_entry(const CacheEntry &entry) {
  json h;
  h["tensors"] = json::array();
  uint64_t offset = 0;
  for (const auto &t : entry.tensors) {
    h["tensors"].push_back({{"name", t.name}, {"dtype", t.dtype}, {"shape", t.shape}, {"offset", offset},
                            {"size", t.bytes.size()}});
    offset += t.bytes.size();
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

bool decode_cache_entry(const std::string &b, CacheEntry *out, std::string *why) {
  if (b.size() < kFixed || std::memcmp(b.data(), kMagic, sizeof kMagic) != 0) {
    *why = "not a cache entry (" + std::to_string(b.size()) + " bytes, no VTCACHE1 header)";
    return false;
  }
  const uint64_t hlen = get_le(b, 8, 4), crc = get_le(b, 12, 4), plen = get_le(b, 16, 8);
  if (hlen > b.size() || plen > b.size() || kFixed + hlen + plen != b.size()) {
    *why = "entry is " + std::to_string(b.size()) + " bytes, its header announces " +
           std::to_string(kFixed + hlen + plen) + " (truncated or overwritten)";
    return false;
  }
  if (crc32_update(0, b.data() + kFixed, hlen + plen) != crc) {
    *why = "checksum mismatch (the entry's bytes changed after it was written)";
    return false;
  }
  CacheEntry e;
  try {
    const json h = json::parse(b.begin() + kFixed, b.begin() + static_cast<std::ptrdiff_t>(kFixed + hlen));
    e.info = h.value("info", "");
    for (const auto &t : h.at("tensors")) {
      CachedTensor c;
      c.name = t.at("name").get<std::string>();
      c.dtype = t.at("dtype").get<std::string>();
      c.shape = t.at("shape").get<std::vector<int64_t>>();
      const uint64_t off = t.at("offset").get<uint64_t>(), size = t.at("size").get<uint64_t>();
      if (off > plen || size > plen - off) throw std::runtime_error("tensor " + c.name + " lies outside the payload");
      c.bytes = b.substr(kFixed + hlen + off, size);
      e.tensors.push_back(std::move(c));
    }
  } catch (const std::exception &ex) {
    *why = std::string("bad entry header: ") + ex.what();
    return false;
  }
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

LatentStore::Lookup LatentStore::get(const std::string &key, CacheEntry *out, std::string *why) const {
  if (!valid_key(key)) {
    *why = "bad key '" + key + "'";
    return Lookup::kCorrupt;
  }
  const std::string path = entry_path(key);
  std::string bytes, err;
  if (!read_whole(path, &bytes, &err)) return Lookup::kMiss;
  if (!decode_cache_entry(bytes, out, &err)) {
    *why = path + ": " + err;
    return Lookup::kCorrupt;
  }
  // Marks the entry used for `videotrain-cache prune` (at most once a day, to keep reads cheap).
  struct stat st {};
  if (writable_ && ::stat(path.c_str(), &st) == 0 && std::time(nullptr) - st.st_mtime > 86400)
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
  const std::string bytes = encode_cache_entry(entry);
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
    if (!it->is_regular_file(ec)) continue;
    struct stat st {};
    if (::stat(it->path().c_str(), &st) != 0) continue;
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
  std::string bytes, why;
  if (!read_whole(path, &bytes, &why)) return why;
  CacheEntry e;
  return decode_cache_entry(bytes, &e, &why) ? "" : why;
}

std::string sha256_hex(const std::string &bytes) {
  gchar *h = g_compute_checksum_for_data(G_CHECKSUM_SHA256, reinterpret_cast<const guchar *>(bytes.data()), bytes.size());
  std::string out(h);
  g_free(h);
  return out;
}

bool sha256_file(const std::string &path, std::string *hex, std::string *why) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    *why = "cannot read '" + path + "': " + std::strerror(errno);
    return false;
  }
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
  ::close(fd);
  if (ok) *hex = g_checksum_get_string(c);
  g_checksum_free(c);
  return ok;
}

}  // namespace videotrain
