#include "models/vae/vae_parts.h"

#include <ATen/ATen.h>
#include <torch/version.h>

#include <algorithm>
#include <stdexcept>

#include "cpu_conv.h"
#include "models/vae/vae_config.h"
#include "models/weights_io.h"
#include "safetensors.h"

namespace videotrain::vae {

TensorMap load_tensor_table(const std::string &st_path, const std::string &cfg_path, const TensorTable &table,
                            c10::Device device, c10::ScalarType dtype, const std::string &missing_hint) {
  std::string err;
  auto file = SafetensorsFile::open(st_path, &err);
  if (!file) throw std::runtime_error(err);
  TensorMap w;
  for (const auto &[name, shape] : table) {
    const SafetensorsEntry *e = file->find(name);
    if (!e)
      throw std::runtime_error("tensor '" + name + "' (expected shape " + shape_str(shape) + ") is missing from " +
                               st_path + missing_hint);
    if (e->shape != shape)
      throw std::runtime_error("tensor '" + name + "' has shape " + shape_str(e->shape) + " in " + st_path +
                               ", but " + cfg_path + " implies " + shape_str(shape));
    if (e->dtype != "F32" && e->dtype != "F16" && e->dtype != "BF16" && e->dtype != "F64")
      throw std::runtime_error("tensor '" + name + "' in " + st_path + " has dtype " + e->dtype +
                               "; the loader reads F32, F16, BF16 and F64");
    w[name] = models::tensor_of(*e).to(device, dtype);
  }
  return w;
}

at::Tensor Conv::operator()(const at::Tensor &x, at::IntArrayRef stride, at::IntArrayRef padding) const {
  if (packed.defined() && x.is_cpu() && x.scalar_type() == at::kFloat && !cpu_autocast_on())
    return at::mkldnn_convolution(x.contiguous(), packed, b, padding, stride, {1, 1, 1}, 1);
  return conv3d_fast(x, w, b, stride, padding);
}

// LibTorch 2.x is left on the plain path (its oneDNN convolution caches the reorder itself).
void Conv::pack(at::IntArrayRef stride, at::IntArrayRef padding) {
#if TORCH_VERSION_MAJOR < 2
  if (!w.is_cpu() || w.scalar_type() != at::kFloat || !at::hasMKLDNN()) return;
  packed = at::mkldnn_reorder_conv3d_weight(w.contiguous().to_mkldnn(), padding, stride, {1, 1, 1}, 1);
#else
  (void)stride;
  (void)padding;
#endif
}

std::vector<int64_t> Conv::same_padding() const { return {0, (w.size(3) - 1) / 2, (w.size(4) - 1) / 2}; }

Conv conv_of(const TensorMap &w, const std::string &prefix) {
  return Conv{w.at(prefix + ".weight"), w.at(prefix + ".bias"), at::Tensor()};
}

at::Tensor causal_buffer(const at::Tensor &x, int64_t head) {
  std::vector<int64_t> sizes = x.sizes().vec();
  sizes[2] += head;
  return at::empty(sizes, x.options());
}

at::Tensor causal_conv_padded(const Conv &c, const at::Tensor &buf, at::Tensor &slot, bool repeat_first) {
  const int64_t head = c.head();
  if (head > 0) {
    at::Tensor pad = buf.narrow(2, 0, head);
    if (slot.defined())
      pad.copy_(slot);
    else if (repeat_first)
      pad.copy_(buf.narrow(2, head, 1).expand_as(pad));
    else
      pad.zero_();
    slot = buf.narrow(2, buf.size(2) - head, head).clone();
  }
  return c(buf, {1, 1, 1}, c.same_padding());
}

at::Tensor causal_conv3d(const Conv &c, const at::Tensor &x, at::Tensor &slot, bool repeat_first) {
  const int64_t head = c.head();
  if (head == 0) return causal_conv_padded(c, x, slot, repeat_first);
  at::Tensor buf = causal_buffer(x, head);
  buf.narrow(2, head, x.size(2)).copy_(x);
  return causal_conv_padded(c, buf, slot, repeat_first);
}

std::array<int64_t, 4> TilePlan::bounds(size_t t, int64_t H, int64_t W) const {
  if (!tiled) return {0, H, 0, W};
  const int64_t y = ys[t / xs.size()], x = xs[t % xs.size()];
  return {y, std::min(y + tile_h, H), x, std::min(x + tile_w, W)};
}

at::Tensor TilePlan::region(const at::Tensor &x, size_t t) const {
  if (!tiled) return x;
  const auto b = bounds(t, x.size(3), x.size(4));
  return x.slice(3, b[0], b[1]).slice(4, b[2], b[3]);
}

std::string TilePlan::describe() const {
  return tiled ? std::to_string(tile_w) + "x" + std::to_string(tile_h) + " tiles" : std::string("no tiles");
}

int64_t downsampled_extent(int64_t n, int levels) {
  for (int i = 0; i < levels; i++) {
    if (n < 2) return -1;
    n /= 2;
  }
  return n;
}

int log2_levels(int64_t factor) {
  int levels = 0;
  while ((int64_t(1) << levels) < factor) levels++;
  return levels;
}

std::vector<int64_t> tile_origins(int64_t extent, int64_t stride, int64_t unit) {
  std::vector<int64_t> out;
  for (int64_t i = 0; i < extent; i += stride) out.push_back(i * unit);
  return out;
}

at::Tensor join_tiles(const TilePlan &p, std::vector<at::Tensor> tiles) {
  const size_t nc = p.xs.size();
  std::vector<at::Tensor> out_rows;
  for (size_t i = 0; i < p.ys.size(); i++) {
    std::vector<at::Tensor> out_row;
    for (size_t j = 0; j < nc; j++) {
      at::Tensor &tile = tiles[i * nc + j];
      if (i > 0) {
        const at::Tensor &a = tiles[(i - 1) * nc + j];
        const int64_t n = std::min({a.size(3), tile.size(3), p.blend_h});
        for (int64_t y = 0; y < n; y++) {
          const double f = static_cast<double>(y) / static_cast<double>(n);
          tile.select(3, y).copy_(a.select(3, a.size(3) - n + y) * (1 - f) + tile.select(3, y) * f);
        }
      }
      if (j > 0) {
        const at::Tensor &a = tiles[i * nc + j - 1];
        const int64_t n = std::min({a.size(4), tile.size(4), p.blend_w});
        for (int64_t x = 0; x < n; x++) {
          const double f = static_cast<double>(x) / static_cast<double>(n);
          tile.select(4, x).copy_(a.select(4, a.size(4) - n + x) * (1 - f) + tile.select(4, x) * f);
        }
      }
      out_row.push_back(tile.narrow(3, 0, std::min(p.keep_h, tile.size(3))).narrow(4, 0, std::min(p.keep_w, tile.size(4))));
    }
    out_rows.push_back(at::cat(out_row, 4));
  }
  at::Tensor all = at::cat(out_rows, 3);
  return all.narrow(3, 0, std::min(all.size(3), p.out_h)).narrow(4, 0, std::min(all.size(4), p.out_w));
}

}  // namespace videotrain::vae
