/* vaeencoder's properties in one struct, whose defaults the property specs read: the engine's
 * options as the properties set them, and the latent cache the face opens. No torch. */
#pragma once

#include <string>

#include "latent_cache.h"
#include "vae_engine.h"

namespace videotrain::vae {

struct VaeEncoderSettings {
  EngineOptions engine;   // every property the engine takes
  std::string cache_dir;  // "" = no latent cache
  CacheMode cache_mode = CacheMode::ReadWrite;
};

}  // namespace videotrain::vae
