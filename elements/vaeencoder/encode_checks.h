/* What vaeencoder's engine refuses before it encodes, each as "" or an error that names the property,
 * the file and what to use: the options alone, what the model is (a VAE folder or a TorchScript file),
 * the loaded encoder's family limits, and a clip's length and size. No torch in this header. */
#pragma once

#include <string>

#include "vae_engine.h"

namespace videotrain::vae {

class VaeEncoder;
struct TileRequest;

// The tiles the options ask for (models/vae/vae_encoder.h).
TileRequest tile_request(const EngineOptions &o);

// Before the model is read: chunking, micro-batches, tile sizes and overlaps.
std::string check_options(const EngineOptions &o);
// The options that need a VAE folder (norm-scope=clip, condition=, tiles) or a TorchScript
// file (per-frame=true), for a model that is a folder or not.
std::string check_model_kind(const EngineOptions &o, bool folder);
// Against the loaded encoder: its family's conditions, norm-scope=clip, chunk-frames and tile unit.
std::string check_encoder(const EngineOptions &o, const VaeEncoder &enc);
// "" when a clip of T frames of W x H can be encoded with these options, else why not
// (VaeEngine::check_clip).
std::string check_clip_size(const EngineOptions &o, const VaeEncoder &enc, int T, int W, int H);

}  // namespace videotrain::vae
