#include "models/vae/vae_decoder.h"

#include <ATen/ATen.h>
#include <c10/core/InferenceMode.h>

#include <algorithm>
#include <stdexcept>

#include "models/vae/vae_config.h"
#include "models/vae/wan_config.h"
#include "regular_file.h"

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

std::string VaeDecoder::family_names(const std::string &sep) {
  std::string out;
  for (Family f : {Family::CogVideoX, Family::Wan21, Family::Wan22}) out += (out.empty() ? "" : sep) + family_name(f);
  return out;
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
  TilePlan plan;  // on the latent grid; outputs in (patchified) output pixels
  plan.tiled = true;
  plan.tile_h = tiles.tile_h / s, plan.tile_w = tiles.tile_w / s;
  plan.ys = tile_origins(h, tiles.stride_h / s);
  plan.xs = tile_origins(w, tiles.stride_w / s);
  plan.blend_h = (tiles.tile_h - tiles.stride_h) / p, plan.blend_w = (tiles.tile_w - tiles.stride_w) / p;
  plan.keep_h = tiles.stride_h / p, plan.keep_w = tiles.stride_w / p;
  plan.out_h = h * s / p, plan.out_w = w * s / p;
  std::vector<Cache> caches(plan.count());  // one temporal stream per tile
  for (size_t k = 0; k < ranges.size(); k++) {
    at::Tensor zk = z.narrow(2, ranges[k].first, ranges[k].second - ranges[k].first);
    std::vector<at::Tensor> outs;
    for (size_t t = 0; t < plan.count(); t++) {
      caches[t].idx = 0;
      outs.push_back(forward(plan.region(zk, t), caches[t], k == 0));
    }
    on_frames(finish(join_tiles(plan, std::move(outs))));
  }
}

at::Tensor VaeDecoder::decode_all(const at::Tensor &z, const DecodeTiles &tiles) const {
  std::vector<at::Tensor> parts;
  decode(z, tiles, [&](const at::Tensor &f) { parts.push_back(f); });
  return at::cat(parts, 2);
}

}  // namespace videotrain::vae
