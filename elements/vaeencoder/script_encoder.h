/* vaeencoder's TorchScript encoders behind VaeEncoder (models/vae/vae_encoder.h). Torch TUs only. */
#pragma once

#include <memory>
#include <string>

#include "models/vae/vae_encoder.h"

namespace videotrain::vae {

// A TorchScript module with an `encode` method: a video encoder called once per temporal chunk
// ([1, 3, n, H, W] -> [1, C, t, h, w]), or with per_frame an image encoder fed the chunk's frames
// in micro-batches of micro_batch ([N, 3, H, W] -> [N, C, h, w], stacked along time). Its output is
// the latent itself (native() false: no moments, no tiles). Throws std::runtime_error naming the file.
std::unique_ptr<VaeEncoder> load_script_encoder(const std::string &path, c10::Device device, c10::ScalarType dtype,
                                                bool per_frame, int micro_batch);

}  // namespace videotrain::vae
