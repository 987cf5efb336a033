/* transformers' T5EncoderModel (T5 v1.1: CogVideoX's t5-v1_1-xxl) and UMT5EncoderModel (Wan's
 * umt5-xxl) in LibTorch, loaded from the published text_encoder/ folder by transformers' tensor
 * names: relative position buckets (bidirectional), one relative-attention bias in block 0 shared by
 * every layer (T5) or one per block (umT5), RMS norms and softmax in float32, gated tanh-GELU FFN, no
 * biases, no 1/sqrt(d) scaling (folded into T5's init). Inference only. */
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include <memory>
#include <string>

#include "t5_config.h"

namespace videotrain::models {

class T5Encoder {
 public:
  // Opens `dir` (config.json + model.safetensors, or shards named by model.safetensors.index.json;
  // F32/F16/BF16), with the parameters created on `device` in `dtype` and filled one tensor at a time
  // from the mapped shards. `encoder.embed_tokens.weight` may be absent (tied to `shared.weight`).
  // Throws std::runtime_error naming the file (and the key or tensor) when anything does not fit.
  static std::unique_ptr<T5Encoder> open(const std::string &dir, c10::Device device, c10::ScalarType dtype);
  // `dir`/config.json alone (no weights touched): what a caller checks before deciding to load. Throws
  // std::runtime_error naming the file.
  static T5Config read_config(const std::string &dir);
  ~T5Encoder();

  // last_hidden_state [B, L, d_model] in the parameters' dtype for input_ids [B, L] (int64);
  // attention_mask [B, L] (1 = token) masks keys when defined, as T5EncoderModel(input_ids, attention_mask).
  at::Tensor forward(const at::Tensor &input_ids, const at::Tensor &attention_mask = at::Tensor()) const;
  const T5Config &config() const;
  // Writes the loaded weights as a transformers folder (config.json as read), in `dtype`, sharded above
  // max_shard_bytes: tests and conversions.
  void save(const std::string &dir, c10::ScalarType dtype, uint64_t max_shard_bytes) const;

 private:
  T5Encoder();
  struct Impl;
  std::unique_ptr<Impl> im_;
};

}  // namespace videotrain::models
