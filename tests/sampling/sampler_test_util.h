/* What the SamplerEngine tests feed it: seeded tensors and promptsrc buffers for the tiny Wan
 * (tests/reference/dit/wan_t2v_tiny: text_dim 32). */
#pragma once

#include <ATen/ATen.h>
#include <gst/gst.h>

#include <string>
#include <vector>

#include "metas.h"
#include "prompt_record.h"
#include "tensor_buffer.h"

namespace samplertest {

constexpr int64_t kTextLen = 5, kTextDim = 32;  // wan_t2v_tiny's text_dim

inline at::Tensor seeded(std::vector<int64_t> shape, uint64_t seed) {
  auto g = at::detail::createCPUGenerator(seed);
  return at::randn(shape, g);
}

// A promptsrc buffer as textencoder leaves it: the int64 [6] record, the caption in the sample
// meta, and the named tensors text_embeds [L, D] and text_mask [L].
inline GstBuffer *prompt_buffer(int64_t index, int64_t role, int64_t frames = 5) {
  using namespace videotrain;
  const std::vector<int64_t> rec{index, role, 100 + index, frames, 32, 32};  // seed, frames, width, height
  GstBuffer *b = buffer_from_tensor(at::tensor(rec, at::kLong));
  const std::string text = role == kRolePrompt ? "prompt " + std::to_string(index) : "";
  gst_buffer_add_videotrain_sample_meta(b, text.c_str(), "");
  buffer_append_tensor(b, "text_embeds", seeded({kTextLen, kTextDim}, 50 + 2 * index + role));
  buffer_append_tensor(b, "text_mask", at::ones({kTextLen}, at::kLong));
  return b;
}

}  // namespace samplertest
