#include "encode_checks.h"

#include "metas.h"
#include "models/vae/vae_encoder.h"

namespace videotrain::vae {

TileRequest tile_request(const EngineOptions &o) {
  return {o.tile_height, o.tile_width, o.tile_overlap_height, o.tile_overlap_width};
}

std::string check_options(const EngineOptions &o) {
  if (o.model.empty()) return "property 'model' is not set (a VAE folder or a TorchScript file)";
  if (o.chunk_frames < 1) return "chunk-frames must be at least 1";
  if (o.micro_batch_size < 1) return "micro-batch-size must be at least 1";
  if (o.tile_height < 0 || o.tile_width < 0) return "tile-height and tile-width must not be negative";
  if (!(o.tile_overlap_height >= 0 && o.tile_overlap_height < 1) ||
      !(o.tile_overlap_width >= 0 && o.tile_overlap_width < 1))
    return "tile-overlap-height and tile-overlap-width must be in [0, 1)";
  return "";
}

std::string check_model_kind(const EngineOptions &o, bool folder) {
  if (folder && o.per_frame)
    return "per-frame=true needs a TorchScript image encoder, but model '" + o.model + "' is a VAE folder";
  if (folder) return "";
  if (o.norm_scope == NormScope::Clip)
    return "norm-scope=clip sets the statistics of a VAE's GroupNorms, but model '" + o.model +
           "' is a TorchScript file whose normalisation the encoder cannot reach: use norm-scope=chunk";
  if (o.condition != Condition::None)
    return "condition= encodes the clip's first frame with a VAE's posterior, but model '" + o.model +
           "' is a TorchScript file: use a diffusers VAE folder, or condition=none";
  if (o.tile_height > 0 || o.tile_width > 0)
    return "tile-height/tile-width apply to a VAE folder; model '" + o.model + "' is a TorchScript file";
  return "";
}

std::string check_encoder(const EngineOptions &o, const VaeEncoder &enc) {
  if (std::string why = enc.condition_unsupported(static_cast<models::ConditionFrames>(o.condition)); !why.empty())
    return why;
  if (o.norm_scope == NormScope::Clip && !enc.clip_scope_unsupported().empty())
    return "norm-scope=clip sets whole-clip statistics of a VAE's normalisations, but model '" + o.model + "' is a " +
           enc.name() + " VAE: " + enc.clip_scope_unsupported() + ": use norm-scope=chunk";
  if (enc.uses_chunk_frames() && o.chunk_frames % enc.temporal_compression() != 0)
    return "chunk-frames=" + std::to_string(o.chunk_frames) + " is not a multiple of the VAE's temporal " +
           "compression " + std::to_string(enc.temporal_compression()) + " (" + o.model + "/config.json)";
  for (auto [t, name] : {std::pair{o.tile_height, "tile-height"}, std::pair{o.tile_width, "tile-width"}})
    if (t > 0 && t < enc.tile_unit())
      return std::string(name) + "=" + std::to_string(t) + " is smaller than " + std::to_string(enc.tile_unit()) +
             ", what the " + enc.name() + " VAE compresses into one latent pixel" + enc.tile_note();
  return "";
}

std::string check_clip_size(const EngineOptions &o, const VaeEncoder &enc, int T, int W, int H) {
  if (T < 1) return "clip has no frames";
  if (T > GST_VIDEOTRAIN_MAX_CLIP_FRAMES)
    return "clips of " + std::to_string(T) + " frames are longer than the " +
           std::to_string(GST_VIDEOTRAIN_MAX_CLIP_FRAMES) + " the encoder takes";
  if (W < 1 || H < 1) return "frames are empty";
  const int g = enc.frame_group(), sc = enc.spatial_compression();
  if (!o.allow_any_length && (T - 1) % g != 0) {
    const int below = T - (T - 1) % g;
    return "num-frames=" + std::to_string(T) + " gives clips of " + std::to_string(T) + " frames; the " + enc.name() +
           " VAE needs 1 + " + std::to_string(g) + "n frames: use " + std::to_string(below) + " or " +
           std::to_string(below + g);
  }
  if (W % sc != 0 || H % sc != 0)
    return "frames are " + std::to_string(W) + "x" + std::to_string(H) + "; the " + enc.name() + " VAE needs width " +
           "and height divisible by its spatial compression " + std::to_string(sc) + " (set the source's width and height)";
  // Tiles that do not join into the untiled latent's shape are refused.
  if (!enc.plan_fits(enc.plan_tiles(H, W, tile_request(o)), H, W))
    return "tile-height=" + std::to_string(o.tile_height) + ", tile-width=" + std::to_string(o.tile_width) +
           " with overlaps " + std::to_string(o.tile_overlap_height) + ", " + std::to_string(o.tile_overlap_width) +
           " do not tile " + std::to_string(W) + "x" + std::to_string(H) + " frames into a " + std::to_string(W / sc) +
           "x" + std::to_string(H / sc) + " latent (" + enc.tile_advice() + ")";
  return "";
}

}  // namespace videotrain::vae
