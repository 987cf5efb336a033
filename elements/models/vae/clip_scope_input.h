/* What an encoder's whole-clip normalisation pass (vaeencoder norm-scope=clip) takes: the clip as
 * chunks of tiles, and where activations wait between its passes. Torch TUs only. */
#pragma once

#include <ATen/core/Tensor.h>

#include <array>
#include <cstdint>
#include <functional>

namespace videotrain::vae {

// Where forward_clip_scope keeps each level of activations between its passes: as computed (on
// the device), in host memory, or in an unlinked temporary file (resident memory stays bounded
// by the chunk; the page cache holds what fits).
enum class SpillTo { Device, Host, File };

// A clip for forward_clip_scope: `tiles` spatial regions (1 untiled), each cut into the same
// `chunks` temporal chunks that forward() would get.
struct ClipScopeInput {
  size_t tiles = 1, chunks = 0;
  // Tile t's chunk c, [1, 3, n, h, w]. Called once per (tile, chunk), in the first pass only, so
  // a caller can convert its frames one chunk at a time.
  std::function<at::Tensor(size_t tile, size_t chunk)> chunk;
  // The rows [0, 1) and columns [2, 3) (half-open) of tile t's activations of size h x w at
  // downscale d (1, 2, 4, ...) that count towards the statistics, so that overlapping tiles
  // count each position of the frame once. Unset: every position.
  std::function<std::array<int64_t, 4>(size_t tile, int64_t d, int64_t h, int64_t w)> owned;
};

}  // namespace videotrain::vae
