/* imageencoder's settings and counters, without torch: the GObject face fills them. */
#pragma once

#include <cstdint>
#include <string>

namespace videotrain::image {

struct ImageEncoderOptions {
  std::string model;      // a transformers image_encoder/ folder (CLIPVisionModel[WithProjection])
  std::string processor;  // an image_processor/ folder; "" = the model's sibling ../image_processor
  int hidden_state = -2;  // index into transformers' hidden_states (negative from the end); -2: the pipelines'
  std::string device;     // "" = auto: resolve_device() (device_rule.h)
  std::string dtype;      // "" = bfloat16 on CUDA, float32 on CPU; float32|bfloat16|float16
  std::string cache_dir;  // "" = none; else embeddings also kept in this latent cache folder
};

struct ImageEncoderStats {
  uint64_t clips = 0;         // buffers answered
  uint64_t encoded = 0;       // clips whose frames went through the encoder
  uint64_t cache_reads = 0;   // clips read from cache-dir instead
  uint64_t cache_writes = 0;  // clips written to cache-dir
  bool encoder_loaded = false;  // the weights are in memory (with cache-dir: from the first miss on)
};

// What the engine resolved at start, fixed for its life (the face logs it).
struct ImageEncoderInfo {
  int64_t tokens = 0, embed_dim = 0;  // image_embeds are [n, tokens, embed_dim]
  int layer = 0;                      // hidden_state resolved to 0..num_hidden_layers
  std::string dtype, device;          // "float32", "cpu", ... as resolved
  std::string processor_dir;          // the processor folder read (given or beside the model)
};

}  // namespace videotrain::image
