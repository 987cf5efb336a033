/* CRC-32 of zlib/gzip (Python's zlib.crc32): checkpoint manifests and latent cache entries. */
#pragma once

#include <cstddef>
#include <cstdint>

namespace videotrain {

// Continues from `crc` (0 to start).
uint32_t crc32_update(uint32_t crc, const void *data, size_t n);

}  // namespace videotrain
