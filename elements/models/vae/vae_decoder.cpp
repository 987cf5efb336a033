#include "models/vae/vae_decoder.h"

#include <ATen/ATen.h>
#include <c10/core/InferenceMode.h>

#include <algorithm>
#include <stdexcept>

#include "cpu_conv.h"
#include "models/vae/vae_config.h"
#include "models/vae/vae_decoder_parts.h"
#include "models/vae/wan_config.h"
#include "models/vae/wan_encoder.h"
#include "models/weights_io.h"
#include "regular_file.h"
#include "safetensors.h"

namespace videotrain::vae {

std::string DecodeTiles::check(int s) const {
  if (!on()) return "";
  const std::pair<const char *, int> sizes[] = {
      {"tile-height", tile_h},
      {"tile-width", tile_w},
      {"tile-stride-height", stride_h},
      {"tile-stride-width", stride_w}};
  for (const auto &[name, v] : sizes)
    if (v < s || v % s != 0)
      return std::string(name) + " is " + std::to_string(v) + "; it must be a positive multiple of the VAE's spatial " +
             "compression (" + std::to_string(s) + " pixels)";
  if (stride_h > tile_h || stride_w > tile_w)
    return "a tile stride (" + std::to_string(stride_h) + "x" + std::to_string(stride_w) +
           ") is larger than the tile (" + std::to_string(tile_h) + "x" + std::to_string(tile_w) +
           "): tiles would leave gaps";
  return "";
}

const char *VaeDecoder::family_name(Family f) {
  switch (f) {
    case Family::CogVideoX: return "CogVideoX";
    case Family::Wan21: return "Wan 2.1";
    case Family::Wan22: return "Wan 2.2";
  }
  return "?";
}

std::unique_ptr<VaeDecoder> VaeDecoder::load(const std::string &dir, c10::Device device, c10::ScalarType dtype) {
  const std::string cfg_path = dir + "/config.json";
  std::string text, err;
  if (!read_small_file(cfg_path, kMaxConfigBytes, &text, &err)) throw std::runtime_error("cannot read " + err);
  const std::string cls = config_class_name(text);
  if (cls == "AutoencoderKLWan") return load_wan_decoder(dir, device, dtype);
  if (cls == "AutoencoderKLCogVideoX") return load_cogvideox_decoder(dir, device, dtype);
  throw std::runtime_error(cfg_path + " names _class_name '" + cls +
                           "'; the decoder runs AutoencoderKLCogVideoX and AutoencoderKLWan folders");
}

std::map<std::string, at::Tensor> load_tensor_table(const std::string &st_path, const std::string &cfg_path,
                                                    const TensorTable &table, c10::Device device,
                                                    c10::ScalarType dtype) {
  std::string err;
  auto file = SafetensorsFile::open(st_path, &err);
  if (!file) throw std::runtime_error(err);
  std::map<std::string, at::Tensor> w;
  for (const auto &[name, shape] : table) {
    const SafetensorsEntry *e = file->find(name);
    if (!e)
      throw std::runtime_error("tensor '" + name + "' (expected shape " + shape_str(shape) + ") is missing from " +
                               st_path + " (a VAE folder saved without its decoder?)");
    if (e->shape != shape)
      throw std::runtime_error("tensor '" + name + "' has shape " + shape_str(e->shape) + " in " + st_path +
                               ", but " + cfg_path + " implies " + shape_str(shape));
    w[name] = models::tensor_of(*e).to(device, dtype);
  }
  return w;
}

at::Tensor causal_conv3d(const at::Tensor &x, const at::Tensor &w, const at::Tensor &b, at::Tensor &slot,
                         bool repeat_first) {
  const int64_t head = w.size(2) - 1;
  at::Tensor in = x;
  if (head > 0) {
    at::Tensor prev = slot;
    if (!prev.defined()) {
      std::vector<int64_t> sizes = x.sizes().vec();
      sizes[2] = head;
      prev = repeat_first ? x.narrow(2, 0, 1).expand(sizes) : at::zeros(sizes, x.options());
    }
    in = at::cat({prev, x}, 2);
    slot = in.narrow(2, in.size(2) - head, head).clone();
  }
  return conv3d_fast(in, w, b, {1, 1, 1}, {0, (w.size(3) - 1) / 2, (w.size(4) - 1) / 2});
}

at::Tensor VaeDecoder::finish(const at::Tensor &x) const {
  at::Tensor y = x;
  if (patch_ > 1) {  // [B, C p p, F, H, W] -> [B, C, F, H p, W p] (diffusers' unpatchify)
    const int64_t p = patch_, B = x.size(0), C = x.size(1) / (p * p), F = x.size(2), H = x.size(3), W = x.size(4);
    y = x.view({B, C, p, p, F, H, W}).permute({0, 1, 4, 5, 3, 6, 2}).reshape({B, C, F, H * p, W * p});
  }
  if (clamp_) y = y.clamp(-1.0, 1.0);
  return y.to(at::kFloat);
}

void VaeDecoder::decode(const at::Tensor &z, const DecodeTiles &tiles, const FramesFn &on_frames) const {
  c10::InferenceMode guard;
  if (z.dim() != 5 || z.size(0) != 1 || z.size(1) != latent_channels_)
    throw std::runtime_error("the decoder takes latents [1, " + std::to_string(latent_channels_) +
                             ", T, h, w], not " + shape_str(z.sizes().vec()));
  const std::string bad = tiles.check(spatial_);
  if (!bad.empty()) throw std::runtime_error(bad);
  const int64_t h = z.size(3), w = z.size(4), s = spatial_, p = patch_;
  const auto ranges = chunks(z.size(2));
  const bool tiled = tiles.on() && (w > tiles.tile_w / s || h > tiles.tile_h / s);
  if (!tiled) {
    Cache cache;
    for (size_t k = 0; k < ranges.size(); k++) {
      cache.idx = 0;
      on_frames(finish(forward(z.narrow(2, ranges[k].first, ranges[k].second - ranges[k].first), cache, k == 0)));
    }
    return;
  }
  const int64_t th = tiles.tile_h / s, tw = tiles.tile_w / s, sh = tiles.stride_h / s, sw = tiles.stride_w / s;
  std::vector<int64_t> ys, xs;
  for (int64_t y = 0; y < h; y += sh) ys.push_back(y);
  for (int64_t x = 0; x < w; x += sw) xs.push_back(x);
  std::vector<Cache> caches(ys.size() * xs.size());  // one temporal stream per tile
  for (size_t k = 0; k < ranges.size(); k++) {
    at::Tensor zk = z.narrow(2, ranges[k].first, ranges[k].second - ranges[k].first);
    std::vector<std::vector<at::Tensor>> rows;
    for (size_t i = 0; i < ys.size(); i++) {
      std::vector<at::Tensor> row;
      for (size_t j = 0; j < xs.size(); j++) {
        Cache &c = caches[i * xs.size() + j];
        c.idx = 0;
        at::Tensor zt = zk.narrow(3, ys[i], std::min(th, h - ys[i])).narrow(4, xs[j], std::min(tw, w - xs[j]));
        row.push_back(forward(zt, c, k == 0));
      }
      rows.push_back(std::move(row));
    }
    at::Tensor out = blend_tile_rows(rows, (tiles.tile_h - tiles.stride_h) / p, (tiles.tile_w - tiles.stride_w) / p,
                                 tiles.stride_h / p, tiles.stride_w / p);
    out = out.narrow(3, 0, std::min(out.size(3), h * s / p)).narrow(4, 0, std::min(out.size(4), w * s / p));
    on_frames(finish(out));
  }
}

at::Tensor VaeDecoder::decode_all(const at::Tensor &z, const DecodeTiles &tiles) const {
  std::vector<at::Tensor> parts;
  decode(z, tiles, [&](const at::Tensor &f) { parts.push_back(f); });
  return at::cat(parts, 2);
}

}  // namespace videotrain::vae
