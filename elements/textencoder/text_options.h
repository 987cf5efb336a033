/* textencoder's settings, without torch: the GObject face fills them. */
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace videotrain::text {

struct TextEncoderOptions {
  std::string tokenizer;         // a tokenizer folder (spiece.model inside) or spiece.model
  std::string model;             // a transformers T5 / umT5 encoder folder, or a TorchScript file
  int max_length = 226;          // tokens, EOS included (families' lengths: ModelFamily::text_length)
  std::string device;            // "" = auto: resolve_device() (device_rule.h)
  std::string dtype;             // "" = bfloat16 on CUDA, float32 on CPU; float32|bfloat16|float16
  int batch_size = 8;            // captions per forward call
  double caption_dropout = 0.0;  // probability of the empty caption, drawn from seed, sample id, epoch
  uint64_t seed = 0;
  size_t cache_entries = 4096;   // distinct captions kept in memory
  std::string cache_dir;         // "" = none; else embeddings also kept in this latent cache folder
  // What the model gets (see text_encoder_engine.h): "auto" (from the folder's class) or a family's
  // name (models/model_family.h), whose TextConvention applies.
  std::string embedding_convention = "auto";
  bool clean_prompts = true;     // the family's prompt cleaning where its pipelines clean (cleans_prompts)
};

struct TextEncoderStats {
  uint64_t captions = 0;       // requests answered
  uint64_t encoded = 0;        // captions run through the model
  uint64_t forward_calls = 0;  // model calls (batches)
  uint64_t dropped = 0;        // requests given the empty caption by caption dropout
  uint64_t cache_reads = 0;    // captions read from cache-dir instead of encoded
  uint64_t cache_writes = 0;   // captions written to cache-dir
};

}  // namespace videotrain::text
