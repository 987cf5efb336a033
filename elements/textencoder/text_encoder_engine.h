/* textencoder's engine: captions in, [L, D] embeddings and [L] masks out, from a SentencePiece
 * tokenizer (T5 rules) and either a transformers T5EncoderModel / UMT5EncoderModel folder, run by the
 * native encoder (models/t5_encoder.h), or a TorchScript text encoder
 *   forward(input_ids: Tensor[B, L] int64, attention_mask: Tensor[B, L] int64) -> Tensor[B, L, D]
 * (or a tuple whose first element is that, as a traced transformers T5EncoderModel returns).
 * Embedding conventions, as each family's diffusers pipelines pass prompt_embeds to their
 * transformers (models/model_family.h: ModelFamily::text, a TextConvention, and cleans_prompts):
 * embedding_convention names a family, whose convention and prompt cleaning (HTML unescaped twice,
 * whitespace collapsed; unless clean_prompts is off) apply; "auto" takes the family whose
 * text_encoder_class the folder's config names; a TorchScript model gets the mask and its output is
 * kept as returned. The mask travels as text_mask in every case.
 * Each distinct caption is encoded once while it stays in the bounded in-memory cache (and, with
 * cache_dir, once for every run: embeddings are kept in the latent cache's store under a key of the
 * caption, the tokenizer's and model's content, max-length, dtype and device type); uncached
 * captions of one call are encoded batch_size at a time. No GStreamer here. */
#pragma once

#include <ATen/core/Tensor.h>

#include "text_options.h"

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace videotrain::text {


struct TextRequest {
  std::string caption;
  uint64_t sample_id = 0;
  uint32_t epoch = 0;
};

struct TextEmbedding {
  at::Tensor embeds;  // [L, D] in the engine's dtype, on its device
  at::Tensor mask;    // [L] int64, on its device
  bool dropped = false;  // caption dropout replaced the caption by ""
};


class TextEncoderEngine {
 public:
  // Loads tokenizer and model and checks the model on one caption (a folder model with cache_dir:
  // its config.json only, the weights at the first cache miss). Null with *error (naming the
  // property and the file) when anything does not fit.
  static std::unique_ptr<TextEncoderEngine> create(const TextEncoderOptions &opts, std::string *error);
  ~TextEncoderEngine();

  // One embedding per request, in order. Throws std::runtime_error when the model fails.
  std::vector<TextEmbedding> encode(const std::vector<TextRequest> &requests);

  // Whether caption dropout gives this sample the empty caption in this epoch.
  bool drops(uint64_t sample_id, uint32_t epoch) const;
  int64_t embed_dim() const;
  std::string dtype_name() const;
  std::string device_name() const;
  TextEncoderStats stats() const;
  // Whether the encoder's weights are loaded: with cache_dir a folder model is loaded at the first
  // caption cache-dir does not hold, so a run whose captions are all cached never loads it.
  bool encoder_loaded() const;
  // A cache-dir problem to report once (an unusable entry, a failed write); "" when none.
  std::string take_warning();

 private:
  TextEncoderEngine();
  struct Impl;
  std::unique_ptr<Impl> im_;
};

}  // namespace videotrain::text
