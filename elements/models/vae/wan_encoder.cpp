#include "models/vae/wan_encoder.h"

#include <ATen/ATen.h>
#include <c10/core/InferenceMode.h>

#include <algorithm>
#include <cmath>
#include <stdexcept>

#include "regular_file.h"

namespace videotrain::vae {

std::unique_ptr<WanEncoder> WanEncoder::load(const std::string &dir, c10::Device device, c10::ScalarType dtype) {
  const std::string cfg_path = dir + "/config.json", st_path = dir + "/diffusion_pytorch_model.safetensors";
  std::string text, err;
  if (!read_small_file(cfg_path, kMaxConfigBytes, &text, &err)) throw std::runtime_error("cannot read " + err);
  std::unique_ptr<WanEncoder> enc(new WanEncoder());
  if (!parse_wan_config(text, &enc->cfg_, &err)) throw std::runtime_error(cfg_path + ": " + err);
  enc->w_ = load_tensor_table(st_path, cfg_path, wan_encoder_tensor_table(enc->cfg_), device, dtype);
  const WanConfig &c = enc->cfg_;
  enc->name_ = c.patch_size > 1 ? "Wan 2.2" : "Wan 2.1";
  // wan-2: the causal convolutions on the shared path (oneDNN on CPU, padding inside the convolution)
  // since VaeEncoder; their results moved by float rounding (4e-7), so earlier cached moments are not reused.
  enc->cache_name_ = "wan-2";
  enc->latent_channels_ = c.z_dim;
  enc->temporal_ = c.temporal_compression();
  enc->spatial_ = c.spatial_compression();
  enc->tile_unit_ = c.spatial_compression() / c.patch_size;
  enc->tile_note_ = " (Wan tiles count pixels of the encoder's input, as diffusers' tile_sample_min_height/width do)";
  enc->device_ = device;
  enc->dtype_ = dtype;
  return enc;
}

at::Tensor WanEncoder::conv(const std::string &p, const at::Tensor &x) const {
  const at::Tensor &w = w_.at(p + ".weight");
  return w.dim() == 5 ? at::conv3d(x, w, w_.at(p + ".bias")) : at::conv2d(x, w, w_.at(p + ".bias"));
}

// Kernel 3 in time: the previous chunk's last 2 input frames in front (zeros before the first).
at::Tensor WanEncoder::causal_conv(const std::string &p, const at::Tensor &x, StreamCache &cache) const {
  return causal_conv3d(conv_of(w_, p), x, cache.next(), false);
}

at::Tensor WanEncoder::rms(const std::string &p, const at::Tensor &x) const {
  // F.normalize over channels times sqrt(channels) times gamma.
  at::Tensor n = x / x.norm(2, {1}, true).clamp_min(1e-12);
  return n * std::sqrt(static_cast<double>(x.size(1))) * w_.at(p + ".gamma");
}

at::Tensor WanEncoder::resnet(const std::string &p, const at::Tensor &x, StreamCache &cache) const {
  at::Tensor h = w_.count(p + ".conv_shortcut.weight") ? conv(p + ".conv_shortcut", x) : x;
  at::Tensor y = causal_conv(p + ".conv1", at::silu(rms(p + ".norm1", x)), cache);
  y = causal_conv(p + ".conv2", at::silu(rms(p + ".norm2", y)), cache);
  return y + h;
}

// 2x spatial downsampling per frame (zero pad right and bottom, 3x3 stride 2); with `time`,
// 2x in time too: the first chunk is kept as it is, later ones are convolved with the last
// frame before them (kernel 3, stride 2).
at::Tensor WanEncoder::resample(const std::string &p, const at::Tensor &x, bool time, StreamCache &cache) const {
  const int64_t b = x.size(0), c = x.size(1), t = x.size(2);
  at::Tensor y = x.permute({0, 2, 1, 3, 4}).reshape({b * t, c, x.size(3), x.size(4)});
  y = at::conv2d(at::constant_pad_nd(y, {0, 1, 0, 1}, 0), w_.at(p + ".resample.1.weight"),
                 w_.at(p + ".resample.1.bias"), {2, 2});
  y = y.view({b, t, y.size(1), y.size(2), y.size(3)}).permute({0, 2, 1, 3, 4});
  if (!time) return y;
  at::Tensor &prev = cache.next();
  if (!prev.defined()) {
    prev = y.clone();
    return y;
  }
  at::Tensor keep = y.narrow(2, y.size(2) - 1, 1).clone();
  y = at::conv3d(at::cat({prev.narrow(2, prev.size(2) - 1, 1), y}, 2), w_.at(p + ".time_conv.weight"),
                 w_.at(p + ".time_conv.bias"), {2, 1, 1});
  prev = keep;
  return y;
}

// Single-head self-attention over each frame's positions.
at::Tensor WanEncoder::attention(const std::string &p, const at::Tensor &x) const {
  const int64_t b = x.size(0), c = x.size(1), t = x.size(2), h = x.size(3), w = x.size(4);
  at::Tensor y = x.permute({0, 2, 1, 3, 4}).reshape({b * t, c, h, w});
  y = rms(p + ".norm", y);
  at::Tensor qkv = conv(p + ".to_qkv", y).reshape({b * t, 3 * c, h * w}).transpose(1, 2);  // [bt, hw, 3c]
  auto parts = qkv.chunk(3, -1);
  at::Tensor att = at::softmax(at::matmul(parts[0], parts[1].transpose(1, 2)) / std::sqrt(static_cast<double>(c)), -1);
  y = at::matmul(att, parts[2]).transpose(1, 2).reshape({b * t, c, h, w});
  y = conv(p + ".proj", y);
  return y.view({b, t, c, h, w}).permute({0, 2, 1, 3, 4}) + x;
}

// Wan 2.2's shortcut: fold ft x fs x fs neighbourhoods into channels (time padded in front to a
// multiple of ft), then average groups of channels down to out_channels.
at::Tensor WanEncoder::avg_down(const at::Tensor &x, int64_t out_channels, int ft, int fs) const {
  const int64_t pad_t = (ft - x.size(2) % ft) % ft;
  at::Tensor y = pad_t ? at::constant_pad_nd(x, {0, 0, 0, 0, pad_t, 0}, 0) : x;
  const int64_t B = y.size(0), C = y.size(1), T = y.size(2), H = y.size(3), W = y.size(4);
  const int64_t factor = static_cast<int64_t>(ft) * fs * fs;
  y = y.view({B, C, T / ft, ft, H / fs, fs, W / fs, fs}).permute({0, 1, 3, 5, 7, 2, 4, 6}).contiguous();
  y = y.view({B, out_channels, C * factor / out_channels, T / ft, H / fs, W / fs});
  return y.mean(2);
}

// [B, C, T, H, W] -> [B, C*p*p, T, H/p, W/p], channel c*p*p + dx*p + dy (diffusers' patchify).
at::Tensor WanEncoder::patchify(const at::Tensor &x) const {
  const int64_t p = cfg_.patch_size;
  if (p == 1) return x;
  const int64_t B = x.size(0), C = x.size(1), T = x.size(2), H = x.size(3), W = x.size(4);
  at::Tensor y = x.view({B, C, T, H / p, p, W / p, p}).permute({0, 1, 6, 4, 2, 3, 5}).contiguous();
  return y.view({B, C * p * p, T, H / p, W / p});
}

at::Tensor WanEncoder::forward(const at::Tensor &frames, StreamCache &cache) const {
  at::NoGradGuard no_grad;
  cache.idx = 0;
  at::Tensor x = patchify(frames.to(device_, dtype_));
  x = causal_conv("encoder.conv_in", x, cache);
  const auto d = cfg_.dims();
  int flat = 0;
  for (int i = 0; i < cfg_.levels(); i++) {
    const bool down = i != cfg_.levels() - 1;
    const bool time = down && cfg_.temperal_downsample[i];
    const std::string level = "encoder.down_blocks." + std::to_string(i);
    at::Tensor shortcut = cfg_.is_residual ? x : at::Tensor();
    for (int r = 0; r < cfg_.num_res_blocks; r++)
      x = resnet(cfg_.is_residual ? level + ".resnets." + std::to_string(r)
                                  : "encoder.down_blocks." + std::to_string(flat++),
                 x, cache);
    if (down)
      x = resample(cfg_.is_residual ? level + ".downsampler" : "encoder.down_blocks." + std::to_string(flat++), x,
                   time, cache);
    if (cfg_.is_residual) x = x + avg_down(shortcut, d[i + 1], time ? 2 : 1, down ? 2 : 1);
  }
  x = resnet("encoder.mid_block.resnets.0", x, cache);
  x = attention("encoder.mid_block.attentions.0", x);
  x = resnet("encoder.mid_block.resnets.1", x, cache);
  x = causal_conv("encoder.conv_out", at::silu(rms("encoder.norm_out", x)), cache);
  return conv("quant_conv", x);
}

std::vector<std::pair<int, int>> WanEncoder::chunks(int T, int) const {
  std::vector<std::pair<int, int>> out{{0, 1}};
  for (int s = 1; s + 4 <= T; s += 4) out.emplace_back(s, s + 4);
  return out;
}

TilePlan WanEncoder::tile_plan(int H, int W, int tile_h, int tile_w, int stride_h, int stride_w) const {
  const int64_t p = cfg_.patch_size, s = cfg_.spatial_compression() / p;  // per patchified pixel
  TilePlan t;
  t.tiled = true;  // one tile still crops and blends as diffusers does
  t.tile_h = tile_h * p, t.tile_w = tile_w * p;
  t.ys = tile_origins(H / p, stride_h, p);
  t.xs = tile_origins(W / p, stride_w, p);
  t.blend_h = tile_h / s - stride_h / s, t.blend_w = tile_w / s - stride_w / s;
  t.keep_h = stride_h / s, t.keep_w = stride_w / s;
  t.out_h = H / cfg_.spatial_compression(), t.out_w = W / cfg_.spatial_compression();
  return t;
}

TilePlan WanEncoder::plan_tiles(int H, int W, const TileRequest &r) const {
  if (!r.on()) return TilePlan{};
  const int patch = cfg_.patch_size;
  const bool th = r.height > 0, tw = r.width > 0;
  const int tile_h = th ? r.height : H / patch, tile_w = tw ? r.width : W / patch;
  // (+1e-6: an overlap of 1/3 on 48 pixels is a stride of 32, not 31.99...)
  auto stride = [](int tile, double overlap) { return std::max(1, static_cast<int>(tile * (1 - overlap) + 1e-6)); };
  const int stride_h = th ? stride(tile_h, r.overlap_height) : tile_h;
  const int stride_w = tw ? stride(tile_w, r.overlap_width) : tile_w;
  if (!((th && H > tile_h) || (tw && W > tile_w))) return TilePlan{};
  return tile_plan(H, W, tile_h, tile_w, stride_h, stride_w);
}

// Every tile must reach a latent pixel, and what the tiles keep must cover the latent, else the
// result would not have the untiled shape.
bool WanEncoder::plan_fits(const TilePlan &p, int H, int W) const {
  if (!p.tiled) return true;
  const int patch = cfg_.patch_size, levels = log2_levels(tile_unit_);
  auto covers = [&](const std::vector<int64_t> &origins, int64_t tile, int64_t total, int64_t keep) {
    int64_t sum = 0;
    for (int64_t o : origins) {
      const int64_t l = downsampled_extent((std::min(o + tile, total) - o) / patch, levels);
      if (l < 1) return false;
      sum += std::min(keep, l);
    }
    return sum >= total / spatial_;
  };
  return covers(p.ys, p.tile_h, H, p.keep_h) && covers(p.xs, p.tile_w, W, p.keep_w);
}

std::string WanEncoder::tile_advice() const {
  return "the Wan VAE's tiles and their strides tile * (1 - overlap) count pixels of the encoder's input: use "
         "multiples of " + std::to_string(tile_unit_);
}

// Tiles of half the size, in whole latent pixels and at least 4 of them, overlapping by a quarter,
// so that their strides keep the untiled shape.
bool WanEncoder::smaller_tiles(const TilePlan &cur, int H, int W, TilePlan *next) const {
  const int patch = cfg_.patch_size, per = tile_unit_, Hp = H / patch, Wp = W / patch;
  const int cur_h = cur.tiled ? static_cast<int>(cur.tile_h / patch) : Hp;
  const int cur_w = cur.tiled ? static_cast<int>(cur.tile_w / patch) : Wp;
  auto half = [&](int v) { return std::min(v, std::max(4 * per, v / 2 / per * per)); };
  const int nh = std::min(half(cur_h), Hp), nw = std::min(half(cur_w), Wp);
  if (nh >= cur_h && nw >= cur_w) return false;
  *next = tile_plan(H, W, nh, nw, nh < Hp ? nh - nh / 4 / per * per : nh, nw < Wp ? nw - nw / 4 / per * per : nw);
  return next->count() > 1;
}

std::string WanEncoder::clip_scope_unsupported() const {
  return "its RMS norms (AutoencoderKLWan) use no statistics across frames, so its chunked encode already equals "
         "a single pass";
}

at::Tensor WanEncoder::normalize(const at::Tensor &z) const {
  std::vector<int64_t> shape(static_cast<size_t>(z.dim()), 1);
  shape[1] = cfg_.z_dim;
  auto opts = at::TensorOptions().dtype(at::kDouble);
  at::Tensor m = at::tensor(cfg_.latents_mean, opts).to(at::kFloat).view(shape).to(z.device());
  at::Tensor s = at::tensor(cfg_.latents_std, opts).to(at::kFloat).view(shape).to(z.device());
  return (z - m) / s;
}

}  // namespace videotrain::vae
