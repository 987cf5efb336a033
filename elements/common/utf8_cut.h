/* Where a text longer than a byte limit may be cut so that it stays valid UTF-8 (captions,
 * prompts). No torch, no GStreamer. */
#pragma once

#include <cstddef>
#include <string>

namespace videotrain {

// The longest prefix of s of at most max bytes that ends where a character starts.
inline size_t utf8_cut(const std::string &s, size_t max) {
  if (s.size() <= max) return s.size();
  size_t cut = max;
  while (cut > 0 && (static_cast<unsigned char>(s[cut]) & 0xC0) == 0x80) cut--;
  return cut;
}

}  // namespace videotrain
