/* What the VAE encoders and decoders of every family share (cogvideox_*.cpp, wan_*.cpp,
 * vae_encoder.cpp, vae_decoder.cpp): the strict tensor-table loader, convolutions with their
 * causal-in-time form and the per-stream cache it keeps, and spatial tiles (grid and blend).
 * Torch TUs only. */
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>
#include <c10/core/ScalarType.h>

#include <array>
#include <cstdint>
#include <limits>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace videotrain::vae {

using TensorTable = std::vector<std::pair<std::string, std::vector<int64_t>>>;
using TensorMap = std::map<std::string, at::Tensor>;

// Every tensor of `table` from st_path, strictly (a missing tensor or another shape is an error
// naming the tensor, st_path and cfg_path, which implies the shapes; `missing_hint` is added to the
// first), stored F32, F16, BF16 or F64, as `dtype` on `device`.
TensorMap load_tensor_table(const std::string &st_path, const std::string &cfg_path, const TensorTable &table,
                            c10::Device device, c10::ScalarType dtype, const std::string &missing_hint = "");

// What one temporal stream (a clip, or a tile of it) keeps between chunks: the causal convolutions'
// last input frames and the temporal resamplers' state, one entry per stateful layer in the order a
// chunk's forward pass meets them (idx: the next; each forward starts at 0). Empty before the first chunk.
struct StreamCache {
  std::vector<at::Tensor> entries;
  size_t idx = 0;
  at::Tensor &next() {
    if (entries.size() <= idx) entries.resize(idx + 1);
    return entries[idx++];
  }
};

// A convolution's weight and bias (3D, or 2D viewed as [out, in, 1, kh, kw]); `packed` is the weight
// in oneDNN's blocked layout where pack() made one (CPU float32, LibTorch 1.x: its oneDNN convolution
// reorders a plain weight on every call, several percent of a CPU encode).
struct Conv {
  at::Tensor w, b, packed;
  // x convolved (oneDNN on CPU float32 whatever the batch, cpu_conv.h).
  at::Tensor operator()(const at::Tensor &x, at::IntArrayRef stride, at::IntArrayRef padding) const;
  at::Tensor pointwise(const at::Tensor &x) const { return (*this)(x, {1, 1, 1}, {0, 0, 0}); }
  // Packs w for these stride and padding where it helps (see above); a no-op elsewhere.
  void pack(at::IntArrayRef stride, at::IntArrayRef padding);
  void pack_same() { pack({1, 1, 1}, same_padding()); }
  std::vector<int64_t> same_padding() const;  // {0, (kh - 1) / 2, (kw - 1) / 2}
  int64_t head() const { return w.size(2) - 1; }  // frames a causal conv prepends
};
// The weight and bias under `prefix` (prefix.weight, prefix.bias).
Conv conv_of(const TensorMap &w, const std::string &prefix);

// A [B, C, head + T, H, W] buffer for x [B, C, T, H, W] whose frames from `head` on are left to the
// caller: a layer before a causal conv writes straight into it, and no concatenation copies activations.
at::Tensor causal_buffer(const at::Tensor &x, int64_t head);
// The causal convolution of every family: kernel kt in time, "same" zero padding in space. `buf`
// holds the input from frame head = kt - 1 on (causal_buffer); its first head frames are written
// here: the last head input frames of the stream's previous chunk (kept in `slot`), or before the
// first chunk the first frame repeated (CogVideoX) or zeros (Wan).
at::Tensor causal_conv_padded(const Conv &c, const at::Tensor &buf, at::Tensor &slot, bool repeat_first);
// The same for an input without the head frames.
at::Tensor causal_conv3d(const Conv &c, const at::Tensor &x, at::Tensor &slot, bool repeat_first);

// Spatial tiles as diffusers' tiled encode and decode make them: tiles of tile_h x tile_w input
// pixels at the origins ys x xs, each its own temporal stream; each tile's output blends linearly
// with the tile above and the one to the left (both as already blended) over blend_h rows and blend_w
// columns, keeps its first keep_h x keep_w, and the joined result is cropped to out_h x out_w.
struct TilePlan {
  bool tiled = false;
  int64_t tile_h = 0, tile_w = 0;
  std::vector<int64_t> ys{0}, xs{0};
  int64_t blend_h = 0, blend_w = 0, keep_h = 0, keep_w = 0;
  int64_t out_h = std::numeric_limits<int64_t>::max(), out_w = std::numeric_limits<int64_t>::max();

  size_t count() const { return ys.size() * xs.size(); }
  // Tile t's rows [y0, y1) and columns [x0, x1) of an H x W input.
  std::array<int64_t, 4> bounds(size_t t, int64_t H, int64_t W) const;
  // Tile t of x [B, C, T, H, W] (x itself when untiled).
  at::Tensor region(const at::Tensor &x, size_t t) const;
  std::string describe() const;  // "32x16 tiles" (width x height) or "no tiles"
};
// The latent extent of n pixels after `levels` stride-2 downsamplers (3x3, one zero row or column
// padded at the end): floor(n / 2) each; -1 when n falls below 2 on the way (the encoder cannot run it).
int64_t downsampled_extent(int64_t n, int levels);
// log2 of a power of two.
int log2_levels(int64_t factor);
// Tile origins 0, stride, 2 stride, ... below extent, times unit.
std::vector<int64_t> tile_origins(int64_t extent, int64_t stride, int64_t unit = 1);
// The tiles' outputs [B, C, T, h, w] (tile-major: row by row) joined as the plan says; blends in place.
at::Tensor join_tiles(const TilePlan &plan, std::vector<at::Tensor> tiles);

}  // namespace videotrain::vae
