#include "models/vae/vae_encoder.h"

#include <ATen/ATen.h>
#include <c10/core/InferenceMode.h>

#include <algorithm>
#include <stdexcept>

#include "models/vae/cogvideox_encoder.h"
#include "models/vae/wan_config.h"
#include "models/vae/wan_encoder.h"
#include "regular_file.h"

namespace videotrain::vae {

std::unique_ptr<VaeEncoder> VaeEncoder::load(const std::string &dir, c10::Device device, c10::ScalarType dtype) {
  // An unreadable config.json is left to the CogVideoX loader, which names the file.
  const std::string cfg_path = dir + "/config.json";
  std::string text, why;
  const std::string cls = read_small_file(cfg_path, kMaxConfigBytes, &text, &why) ? config_class_name(text) : "";
  if (cls == "AutoencoderKLWan") return WanEncoder::load(dir, device, dtype);
  if (cls.empty() || cls == "AutoencoderKLCogVideoX") return CogVideoXEncoder::load(dir, device, dtype);
  throw std::runtime_error("model '" + dir + "': config.json names the class '" + cls +
                           "'; the encoder runs AutoencoderKLCogVideoX and AutoencoderKLWan folders");
}

std::vector<std::pair<int, int>> VaeEncoder::chunks(int T, int k) const {
  std::vector<std::pair<int, int>> out;
  const int nb = std::max(T / k, 1), r = T % k;
  for (int i = 0; i < nb; i++) out.emplace_back(i == 0 ? 0 : k * i + r, std::min(k * (i + 1) + r, T));
  return out;
}

TilePlan VaeEncoder::plan_tiles(int, int, const TileRequest &) const { return TilePlan{}; }
bool VaeEncoder::plan_fits(const TilePlan &, int, int) const { return true; }
bool VaeEncoder::smaller_tiles(const TilePlan &, int, int, TilePlan *) const { return false; }

at::Tensor VaeEncoder::encode(const at::Tensor &video, const TilePlan &tiles, int chunk_frames) const {
  c10::InferenceMode guard;
  const auto ranges = chunks(static_cast<int>(video.size(2)), chunk_frames);
  std::vector<at::Tensor> outs;
  for (size_t t = 0; t < tiles.count(); t++) {
    StreamCache cache;
    std::vector<at::Tensor> parts;
    for (const auto &[s, e] : ranges) parts.push_back(forward(tiles.region(video.narrow(2, s, e - s), t), cache));
    outs.push_back(parts.size() == 1 ? parts[0] : at::cat(parts, 2));
  }
  return tiles.tiled ? join_tiles(tiles, std::move(outs)) : outs[0];
}

at::Tensor VaeEncoder::latent(const at::Tensor &moments, const at::Tensor &noise) const {
  const int64_t C = moments.size(1) / 2;
  at::Tensor z = moments.narrow(1, 0, C).to(at::kFloat);
  if (noise.defined()) {
    at::Tensor logvar = moments.narrow(1, C, C).to(at::kFloat).clamp(-30.0, 20.0);
    z = z + at::exp(0.5 * logvar) * noise.to(z.device(), at::kFloat);
  }
  return normalize(z);
}

std::string VaeEncoder::condition_unsupported(models::ConditionFrames) const { return ""; }

at::Tensor VaeEncoder::condition(const at::Tensor &moments, int T, models::ConditionFrames which) const {
  const at::Tensor z = latent(moments);
  const at::Tensor mask =
      models::condition_mask(z.size(0), T, temporal_compression(), z.size(3), z.size(4), which, z.device());
  return at::cat({mask, z}, 1);
}

std::string VaeEncoder::clip_scope_unsupported() const {
  return "the " + name_ + " encoder has no normalisation statistics the element can reach";
}

std::vector<at::Tensor> VaeEncoder::forward_clip_scope(const ClipScopeInput &, SpillTo) const {
  throw std::runtime_error("whole-clip statistics: " + clip_scope_unsupported());
}

}  // namespace videotrain::vae
