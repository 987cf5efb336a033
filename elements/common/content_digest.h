/* A 64-bit digest of bytes (FNV-1a) for cache keys: the same bytes give the same key on every
 * machine and build, unlike std::hash. Not a cryptographic hash. */
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace videotrain {

inline uint64_t content_digest(const void *data, size_t n, uint64_t h = 14695981039346656037ull) {
  const auto *p = static_cast<const unsigned char *>(data);
  for (size_t i = 0; i < n; i++) {
    h ^= p[i];
    h *= 1099511628211ull;
  }
  return h;
}

inline uint64_t content_digest(const std::string &bytes, uint64_t h = 14695981039346656037ull) {
  return content_digest(bytes.data(), bytes.size(), h);
}

}  // namespace videotrain
