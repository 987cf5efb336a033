/* CRC-32 (zlib's polynomial): see crc32.h. */
#include "crc32.h"

#include <array>
#include <cstring>

namespace videotrain {

namespace {

// Slice-by-8 tables of the reflected polynomial 0xEDB88320: about 2 GB/s, so that
// checksumming a checkpoint costs little beside writing it.
const std::array<std::array<uint32_t, 256>, 8> &crc_tables() {
  static const auto tables = [] {
    std::array<std::array<uint32_t, 256>, 8> t{};
    for (uint32_t i = 0; i < 256; i++) {
      uint32_t c = i;
      for (int k = 0; k < 8; k++) c = (c & 1) ? 0xEDB88320u ^ (c >> 1) : c >> 1;
      t[0][i] = c;
    }
    for (size_t s = 1; s < 8; s++)
      for (uint32_t i = 0; i < 256; i++) t[s][i] = (t[s - 1][i] >> 8) ^ t[0][t[s - 1][i] & 0xff];
    return t;
  }();
  return tables;
}

}  // namespace

uint32_t crc32_update(uint32_t crc, const void *data, size_t n) {
  const auto &t = crc_tables();
  const auto *p = static_cast<const uint8_t *>(data);
  crc = ~crc;
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
  while (n >= 8) {
    uint32_t a, b;
    std::memcpy(&a, p, 4);
    std::memcpy(&b, p + 4, 4);
    a ^= crc;
    crc = t[7][a & 0xff] ^ t[6][(a >> 8) & 0xff] ^ t[5][(a >> 16) & 0xff] ^ t[4][a >> 24] ^ t[3][b & 0xff] ^
          t[2][(b >> 8) & 0xff] ^ t[1][(b >> 16) & 0xff] ^ t[0][b >> 24];
    p += 8;
    n -= 8;
  }
#endif
  while (n--) crc = t[0][(crc ^ *p++) & 0xff] ^ (crc >> 8);
  return ~crc;
}

}  // namespace videotrain
