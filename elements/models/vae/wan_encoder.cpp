#include "models/vae/wan_encoder.h"

#include <torch/torch.h>

#include <cstring>
#include <fstream>
#include <sstream>
#include <stdexcept>

#include "models/vae/vae_config.h"
#include "regular_file.h"
#include "safetensors.h"

namespace videotrain::vae {

namespace F = torch::nn::functional;

struct WanEncoder::Run {
  WanCache &cache;
  size_t idx = 0;
  // The cache entry of the next stateful layer (undefined the first time).
  at::Tensor &next() {
    if (cache.entries.size() <= idx) cache.entries.resize(idx + 1);
    return cache.entries[idx++];
  }
};

std::unique_ptr<WanEncoder> WanEncoder::load(const std::string &dir, c10::Device device, c10::ScalarType dtype) {
  const std::string cfg_path = dir + "/config.json", st_path = dir + "/diffusion_pytorch_model.safetensors";
  std::string text, err;
  if (!read_small_file(cfg_path, kMaxConfigBytes, &text, &err)) throw std::runtime_error("cannot read " + err);
  std::unique_ptr<WanEncoder> enc(new WanEncoder());
  if (!parse_wan_config(text, &enc->cfg_, &err)) throw std::runtime_error(cfg_path + ": " + err);
  auto file = SafetensorsFile::open(st_path, &err);
  if (!file) throw std::runtime_error(err);
  for (const auto &[name, shape] : wan_encoder_tensor_table(enc->cfg_)) {
    const SafetensorsEntry *e = file->find(name);
    if (!e)
      throw std::runtime_error("tensor '" + name + "' (expected shape " + shape_str(shape) + ") is missing from " +
                               st_path);
    if (e->shape != shape)
      throw std::runtime_error("tensor '" + name + "' has shape " + shape_str(e->shape) + " in " + st_path + ", but " +
                               cfg_path + " implies " + shape_str(shape));
    c10::ScalarType src;
    if (e->dtype == "F32") src = c10::kFloat;
    else if (e->dtype == "F16") src = c10::kHalf;
    else if (e->dtype == "BF16") src = c10::kBFloat16;
    else if (e->dtype == "F64") src = c10::kDouble;
    else
      throw std::runtime_error("tensor '" + name + "' in " + st_path + " has dtype " + e->dtype +
                               "; the loader reads F32, F16, BF16 and F64");
    at::Tensor t = at::empty(shape, at::TensorOptions().dtype(src));
    if (e->nbytes) std::memcpy(t.data_ptr(), e->data, e->nbytes);
    enc->w_[name] = t.to(device, dtype);
  }
  enc->device_ = device;
  enc->dtype_ = dtype;
  return enc;
}

at::Tensor WanEncoder::conv(const std::string &p, const at::Tensor &x) const {
  const at::Tensor &w = w_.at(p + ".weight");
  return w.dim() == 5 ? at::conv3d(x, w, w_.at(p + ".bias")) : at::conv2d(x, w, w_.at(p + ".bias"));
}

// Kernel 3 in time, padded by 2 frames in front: the previous chunk's last 2 input frames
// stand in for as many of them as it kept.
at::Tensor WanEncoder::causal_conv(const std::string &p, const at::Tensor &x, Run &run) const {
  at::Tensor &prev = run.next();
  at::Tensor keep = x.narrow(2, std::max<int64_t>(0, x.size(2) - 2), std::min<int64_t>(2, x.size(2)));
  if (keep.size(2) < 2 && prev.defined()) keep = at::cat({prev.narrow(2, prev.size(2) - 1, 1), keep}, 2);
  at::Tensor in = x;
  int64_t front = 2;
  if (prev.defined()) {
    in = at::cat({prev, x}, 2);
    front -= prev.size(2);
  }
  in = at::constant_pad_nd(in, {1, 1, 1, 1, front, 0}, 0);
  prev = keep.clone();
  return conv(p, in);
}

at::Tensor WanEncoder::rms(const std::string &p, const at::Tensor &x) const {
  // F.normalize over channels times sqrt(channels) times gamma.
  at::Tensor n = x / x.norm(2, {1}, true).clamp_min(1e-12);
  return n * std::sqrt(static_cast<double>(x.size(1))) * w_.at(p + ".gamma");
}

at::Tensor WanEncoder::resnet(const std::string &p, const at::Tensor &x, Run &run) const {
  at::Tensor h = w_.count(p + ".conv_shortcut.weight") ? conv(p + ".conv_shortcut", x) : x;
  at::Tensor y = causal_conv(p + ".conv1", at::silu(rms(p + ".norm1", x)), run);
  y = causal_conv(p + ".conv2", at::silu(rms(p + ".norm2", y)), run);
  return y + h;
}

// 2x spatial downsampling per frame (zero pad right and bottom, 3x3 stride 2); with `time`,
// 2x in time too: the first chunk is kept as it is, later ones are convolved with the last
// frame before them (kernel 3, stride 2).
at::Tensor WanEncoder::resample(const std::string &p, const at::Tensor &x, bool time, Run &run) const {
  const int64_t b = x.size(0), c = x.size(1), t = x.size(2);
  at::Tensor y = x.permute({0, 2, 1, 3, 4}).reshape({b * t, c, x.size(3), x.size(4)});
  y = at::conv2d(at::constant_pad_nd(y, {0, 1, 0, 1}, 0), w_.at(p + ".resample.1.weight"),
                 w_.at(p + ".resample.1.bias"), {2, 2});
  y = y.view({b, t, y.size(1), y.size(2), y.size(3)}).permute({0, 2, 1, 3, 4});
  if (!time) return y;
  at::Tensor &prev = run.next();
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

at::Tensor WanEncoder::forward(const at::Tensor &frames, WanCache &cache) const {
  torch::NoGradGuard no_grad;
  Run run{cache};
  at::Tensor x = patchify(frames.to(device_, dtype_));
  x = causal_conv("encoder.conv_in", x, run);
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
                 x, run);
    if (down)
      x = resample(cfg_.is_residual ? level + ".downsampler" : "encoder.down_blocks." + std::to_string(flat++), x,
                   time, run);
    if (cfg_.is_residual) x = x + avg_down(shortcut, d[i + 1], time ? 2 : 1, down ? 2 : 1);
  }
  x = resnet("encoder.mid_block.resnets.0", x, run);
  x = attention("encoder.mid_block.attentions.0", x);
  x = resnet("encoder.mid_block.resnets.1", x, run);
  x = causal_conv("encoder.conv_out", at::silu(rms("encoder.norm_out", x)), run);
  return conv("quant_conv", x);
}

at::Tensor WanEncoder::encode(const at::Tensor &video) const {
  WanCache cache;
  std::vector<at::Tensor> out;
  const int64_t T = video.size(2);
  out.push_back(forward(video.narrow(2, 0, 1), cache));
  for (int64_t t = 1; t + 4 <= T; t += 4) out.push_back(forward(video.narrow(2, t, 4), cache));
  return at::cat(out, 2);
}

WanEncoder::TileGrid WanEncoder::tile_grid(int64_t height, int64_t width, int tile_h, int tile_w, int stride_h,
                                           int stride_w) const {
  const int64_t p = cfg_.patch_size;
  TileGrid g;
  g.tile_h = tile_h * p;
  g.tile_w = tile_w * p;
  for (int64_t i = 0; i < height / p; i += stride_h) g.ys.push_back(i * p);
  for (int64_t j = 0; j < width / p; j += stride_w) g.xs.push_back(j * p);
  return g;
}

at::Tensor blend_tile_rows(std::vector<std::vector<at::Tensor>> &rows, int64_t bh, int64_t bw, int64_t sh, int64_t sw) {
  std::vector<at::Tensor> out_rows;
  for (size_t i = 0; i < rows.size(); i++) {
    std::vector<at::Tensor> out_row;
    for (size_t j = 0; j < rows[i].size(); j++) {
      at::Tensor &tile = rows[i][j];
      if (i > 0) {
        const at::Tensor &a = rows[i - 1][j];
        const int64_t n = std::min({a.size(3), tile.size(3), bh});
        for (int64_t y = 0; y < n; y++) {
          const double f = static_cast<double>(y) / static_cast<double>(n);
          tile.select(3, y).copy_(a.select(3, a.size(3) - n + y) * (1 - f) + tile.select(3, y) * f);
        }
      }
      if (j > 0) {
        const at::Tensor &a = rows[i][j - 1];
        const int64_t n = std::min({a.size(4), tile.size(4), bw});
        for (int64_t x = 0; x < n; x++) {
          const double f = static_cast<double>(x) / static_cast<double>(n);
          tile.select(4, x).copy_(a.select(4, a.size(4) - n + x) * (1 - f) + tile.select(4, x) * f);
        }
      }
      out_row.push_back(tile.narrow(3, 0, std::min(sh, tile.size(3))).narrow(4, 0, std::min(sw, tile.size(4))));
    }
    out_rows.push_back(at::cat(out_row, 4));
  }
  return at::cat(out_rows, 3);
}

at::Tensor WanEncoder::blend_tiles(std::vector<std::vector<at::Tensor>> rows, int64_t height, int64_t width,
                                   int tile_h, int tile_w, int stride_h, int stride_w) const {
  const int64_t s = cfg_.spatial_compression() / cfg_.patch_size;  // per patchified pixel
  const int64_t bh = tile_h / s - stride_h / s, bw = tile_w / s - stride_w / s;
  const int64_t sh = stride_h / s, sw = stride_w / s;
  const int64_t c = cfg_.spatial_compression();
  at::Tensor all = blend_tile_rows(rows, bh, bw, sh, sw);
  return all.narrow(3, 0, std::min(all.size(3), height / c)).narrow(4, 0, std::min(all.size(4), width / c));
}

at::Tensor WanEncoder::encode_tiled(const at::Tensor &video, int tile_h, int tile_w, int stride_h,
                                    int stride_w) const {
  const int64_t H = video.size(3), W = video.size(4);
  TileGrid g = tile_grid(H, W, tile_h, tile_w, stride_h, stride_w);
  std::vector<std::vector<at::Tensor>> rows;
  for (int64_t y : g.ys) {
    std::vector<at::Tensor> row;
    for (int64_t x : g.xs)
      row.push_back(encode(video.narrow(3, y, std::min(g.tile_h, H - y)).narrow(4, x, std::min(g.tile_w, W - x))));
    rows.push_back(std::move(row));
  }
  return blend_tiles(std::move(rows), H, W, tile_h, tile_w, stride_h, stride_w);
}

at::Tensor WanEncoder::normalized_latent(const at::Tensor &moments, const at::Tensor &noise) const {
  const int64_t z = cfg_.z_dim;
  at::Tensor mean = moments.narrow(1, 0, z).to(at::kFloat);
  if (noise.defined()) {
    at::Tensor logvar = moments.narrow(1, z, z).to(at::kFloat).clamp(-30.0, 20.0);
    mean = mean + at::exp(0.5 * logvar) * noise.to(mean.device(), at::kFloat);
  }
  std::vector<int64_t> shape(static_cast<size_t>(moments.dim()), 1);
  shape[1] = z;
  auto opts = at::TensorOptions().dtype(at::kDouble);
  at::Tensor m = at::tensor(cfg_.latents_mean, opts).to(at::kFloat).view(shape).to(mean.device());
  at::Tensor s = at::tensor(cfg_.latents_std, opts).to(at::kFloat).view(shape).to(mean.device());
  return (mean - m) / s;
}

}  // namespace videotrain::vae
