#include "models/vae/cogvideox_encoder.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <stdexcept>

#include "models/image_condition.h"

namespace videotrain::vae {

std::string CogVideoXEncoder::condition_unsupported(models::ConditionFrames which) const {
  if (which != models::ConditionFrames::first_last) return "";
  return "condition=first-last-frame is Wan FLF2V's; CogVideoX I2V takes the first frame only: use "
         "condition=first-frame";
}

at::Tensor CogVideoXEncoder::condition(const at::Tensor &moments, int T, models::ConditionFrames) const {
  return models::cogvideox_image_latents(moments.narrow(1, 0, moments.size(1) / 2), (T - 1) / temporal_ + 1,
                                         image_latent_scale());
}

std::unique_ptr<CogVideoXEncoder> CogVideoXEncoder::load(const std::string &dir, c10::Device device,
                                                         c10::ScalarType dtype) {
  std::string cfg_path = dir + "/config.json";
  std::string st_path = dir + "/diffusion_pytorch_model.safetensors";
  std::string err;
  VaeConfig cfg;
  if (!load_vae_config(cfg_path, &cfg, &err)) throw std::runtime_error(err);
  std::string bad = check_supported(cfg);
  if (!bad.empty()) throw std::runtime_error(cfg_path + ": unsupported config: " + bad);
  const TensorMap w = load_tensor_table(st_path, cfg_path, encoder_tensor_table(cfg), device, dtype);

  std::unique_ptr<CogVideoXEncoder> enc(new CogVideoXEncoder());
  enc->name_ = "CogVideoX";
  enc->cache_name_ = "cogvideox";
  enc->latent_channels_ = cfg.latent_channels;
  enc->temporal_ = cfg.temporal_compression_ratio;
  enc->spatial_ = enc->tile_unit_ = cfg.spatial_compression();
  enc->cfg_ = cfg;
  enc->device_ = device;
  enc->dtype_ = dtype;
  auto conv = [&](const std::string &p) { return conv_of(w, p); };
  auto norm = [&](const std::string &p) { return Norm{w.at(p + ".weight"), w.at(p + ".bias")}; };
  auto resnet = [&](const std::string &p) {
    Resnet r;
    r.norm1 = norm(p + ".norm1");
    r.norm2 = norm(p + ".norm2");
    r.conv1 = conv(p + ".conv1.conv");
    r.conv2 = conv(p + ".conv2.conv");
    if (w.count(p + ".conv_shortcut.weight")) r.shortcut = conv(p + ".conv_shortcut");
    return r;
  };
  enc->conv_in_ = conv("encoder.conv_in.conv");
  for (int i = 0; i < cfg.num_blocks(); i++) {
    std::string p = "encoder.down_blocks." + std::to_string(i);
    Block b;
    for (int l = 0; l < cfg.layers_per_block; l++) b.resnets.push_back(resnet(p + ".resnets." + std::to_string(l)));
    b.downsample = i != cfg.num_blocks() - 1;
    b.compress_time = i < cfg.temporal_levels();
    if (b.downsample) {
      b.down = conv(p + ".downsamplers.0.conv");
      b.down.w = b.down.w.unsqueeze(2);  // a per-frame 2D conv as a 1x3x3 3D conv
    }
    enc->blocks_.push_back(std::move(b));
  }
  for (int l = 0; l < 2; l++) enc->mid_.push_back(resnet("encoder.mid_block.resnets." + std::to_string(l)));
  enc->norm_out_ = norm("encoder.norm_out");
  enc->conv_out_ = conv("encoder.conv_out.conv");
  if (cfg.use_quant_conv) enc->quant_conv_ = conv("quant_conv");
  enc->pack_weights();
  return enc;
}

void CogVideoXEncoder::pack_weights() {
  auto resnet = [&](Resnet &r) {
    r.conv1.pack_same();
    r.conv2.pack_same();
    if (r.shortcut.w.defined()) r.shortcut.pack({1, 1, 1}, {0, 0, 0});
  };
  conv_in_.pack_same();
  for (auto &b : blocks_) {
    for (auto &r : b.resnets) resnet(r);
    if (b.downsample) b.down.pack({1, 2, 2}, {0, 0, 0});
  }
  for (auto &r : mid_) resnet(r);
  conv_out_.pack_same();
  if (quant_conv_.w.defined()) quant_conv_.pack({1, 1, 1}, {0, 0, 0});
}

// GroupNorm then SiLU, written into frames [head, head + T) of a new [B, C, head + T, H, W]
// buffer for the causal conv that follows (one pass and one allocation less than silu + cat).
// (A per-group fused CPU kernel built from ATen calls measured no faster here: the oneDNN
// convolutions and their layout reorders dominate.)
at::Tensor CogVideoXEncoder::norm_silu(const Norm &n, const at::Tensor &x, double eps, int64_t head) const {
  at::Tensor buf = causal_buffer(x, head);
  at::Tensor out = buf.narrow(2, head, x.size(2));
  at::silu_out(out, at::group_norm(x, cfg_.norm_num_groups, n.w, n.b, eps));
  return buf;
}

at::Tensor CogVideoXEncoder::resnet(const Resnet &r, const at::Tensor &x, StreamCache &cache) const {
  const double eps = cfg_.norm_eps;
  at::Tensor h = causal_conv_padded(r.conv1, norm_silu(r.norm1, x, eps, r.conv1.head()), cache.next(), true);
  h = causal_conv_padded(r.conv2, norm_silu(r.norm2, h, eps, r.conv2.head()), cache.next(), true);
  if (r.shortcut.w.defined()) return h.add_(r.shortcut.pointwise(x));
  return h.add_(x);
}

// Temporal compression keeps a lone first frame (odd length) and averages the following
// pairs; then a stride-2 3x3 conv per frame after padding one zero row and column at the end.
at::Tensor CogVideoXEncoder::downsample(const Block &b, const at::Tensor &x) const {
  at::Tensor h = x;
  if (b.compress_time) {
    int64_t t = h.size(2);
    auto pair_mean = [](const at::Tensor &y) {
      int64_t n = y.size(2) / 2 * 2;
      return (y.slice(2, 0, n, 2) + y.slice(2, 1, n, 2)) / 2;
    };
    if (t % 2 == 1) {
      at::Tensor first = h.narrow(2, 0, 1);
      if (t > 1)
        h = at::cat({first, pair_mean(h.narrow(2, 1, t - 1))}, 2);
      else
        h = first;
    } else {
      h = pair_mean(h);
    }
  }
  h = at::constant_pad_nd(h, {0, 1, 0, 1}, 0);
  return b.down(h, {1, 2, 2}, {0, 0, 0});
}

at::Tensor CogVideoXEncoder::forward(const at::Tensor &x_in, StreamCache &cache) const {
  cache.idx = 0;
  at::Tensor x = x_in.to(device_, dtype_);
  at::Tensor h = causal_conv3d(conv_in_, x, cache.next(), true);
  for (const auto &b : blocks_) {
    for (const auto &r : b.resnets) h = resnet(r, h, cache);
    if (b.downsample) h = downsample(b, h);
  }
  for (const auto &r : mid_) h = resnet(r, h, cache);
  h = causal_conv_padded(conv_out_, norm_silu(norm_out_, h, 1e-6, conv_out_.head()), cache.next(), true);
  if (quant_conv_.w.defined()) h = quant_conv_.pointwise(h);
  return h;
}

at::Tensor CogVideoXEncoder::moments_out(const at::Tensor &m) const {
  const int64_t C = m.size(1) / 2;
  return at::cat({m.narrow(1, 0, C), m.narrow(1, C, C).clamp(-30.0, 20.0)}, 1);
}

// ---------------------------------------------------------------- tiles

TilePlan CogVideoXEncoder::plan_tiles(int H, int W, const TileRequest &r) const {
  TilePlan p;
  int th = r.height, tw = r.width;
  double fh = r.overlap_height, fw = r.overlap_width;
  if (th <= 0 && tw <= 0) return p;
  if (th <= 0) th = H, fh = 0;  // a tile spans the frame in a dimension left at 0
  if (tw <= 0) tw = W, fw = 0;
  if (!(W > tw || H > th)) return p;  // the frame fits one tile: diffusers does not tile
  const int s = spatial_;
  p.tiled = true;
  p.tile_h = th, p.tile_w = tw;
  p.ys = tile_origins(H, std::max(1, static_cast<int>(th * (1 - fh))));
  p.xs = tile_origins(W, std::max(1, static_cast<int>(tw * (1 - fw))));
  const int lh = static_cast<int>(th / static_cast<double>(s)), lw = static_cast<int>(tw / static_cast<double>(s));
  p.blend_h = static_cast<int>(lh * fh);
  p.blend_w = static_cast<int>(lw * fw);
  p.keep_h = lh - p.blend_h;
  p.keep_w = lw - p.blend_w;
  return p;
}

namespace {

// The latent height (or width) a tile plan assembles: each tile row keeps at most keep rows.
int64_t assembled_extent(const std::vector<int64_t> &origins, int64_t tile, int64_t keep, int64_t total,
                         int levels) {
  int64_t sum = 0;
  for (int64_t o : origins) {
    const int64_t l = downsampled_extent(std::min(o + tile, total) - o, levels);
    if (l < 0) return -1;
    sum += std::min(keep, l);
  }
  return sum;
}

}  // namespace

// Tiles that do not stride by what they keep would give another shape than the untiled encode.
bool CogVideoXEncoder::plan_fits(const TilePlan &p, int H, int W) const {
  if (!p.tiled) return true;
  const int levels = log2_levels(spatial_);
  return assembled_extent(p.ys, p.tile_h, p.keep_h, H, levels) == H / spatial_ &&
         assembled_extent(p.xs, p.tile_w, p.keep_w, W, levels) == W / spatial_;
}

std::string CogVideoXEncoder::tile_advice() const {
  return "use tile sizes and overlaps in multiples of " + std::to_string(spatial_) + " pixels";
}

// Tiles of half the size (at least 4 latent pixels), in whole latent pixels overlapping by a
// quarter, so that the tiles stride by exactly what each keeps and the result has the untiled shape.
bool CogVideoXEncoder::smaller_tiles(const TilePlan &cur, int H, int W, TilePlan *next) const {
  const int64_t cur_h = cur.tiled ? cur.tile_h : H, cur_w = cur.tiled ? cur.tile_w : W;
  const int64_t s = std::max(spatial_, 1), min_tile = 4 * s;
  auto half = [&](int64_t v) { return std::max(min_tile, v / 2 / s * s); };
  const int64_t nh = std::min(half(cur_h), cur_h), nw = std::min(half(cur_w), cur_w);
  if (nh >= cur_h && nw >= cur_w) return false;
  const int64_t th = std::min<int64_t>(nh, H), tw = std::min<int64_t>(nw, W);
  if (th >= H && tw >= W) return false;
  TilePlan p;
  p.tiled = true;
  p.tile_h = th, p.tile_w = tw;
  const int64_t lh = th / s, lw = tw / s;
  p.blend_h = th < H ? lh / 4 : 0;
  p.blend_w = tw < W ? lw / 4 : 0;
  p.keep_h = lh - p.blend_h;
  p.keep_w = lw - p.blend_w;
  p.ys = tile_origins(H, p.keep_h * s);
  p.xs = tile_origins(W, p.keep_w * s);
  *next = p;
  return true;
}

}  // namespace videotrain::vae
