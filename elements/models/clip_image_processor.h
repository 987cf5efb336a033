/* transformers' CLIPImageProcessor (the image_processor/ folder of Wan 2.1 I2V / FLF2V) on 8-bit RGB
 * frames: resize with PIL's filter in PIL's 8-bit fixed point (so that a frame gives the pixels
 * transformers' PIL path gives), center crop (zero padding when the image is smaller), rescale and
 * normalise in float32 as its NumPy code does. Torch TUs only. */
#pragma once

#include <ATen/core/Tensor.h>

#include <string>
#include <utility>

#include "clip_vision_config.h"

namespace videotrain::models {

class ClipImageProcessor {
 public:
  explicit ClipImageProcessor(const ClipProcessorConfig &config) : config_(config) {}
  // `dir`/preprocessor_config.json. Throws std::runtime_error naming the file and the key.
  static ClipImageProcessor open(const std::string &dir);

  // One image, uint8 [H, W, 3] (a frame as csvvideosrc sends it), to pixel_values [3, h, w] float32
  // (h x w the crop, or the resize without a crop). Throws on another dtype or layout.
  at::Tensor process(const at::Tensor &rgb) const;
  // The size the resize gives an H x W image: (height, width).
  std::pair<int64_t, int64_t> resized_size(int64_t height, int64_t width) const;
  const ClipProcessorConfig &config() const { return config_; }

 private:
  ClipProcessorConfig config_;
};

// PIL's Image.resize((width, height), resample) of an 8-bit image [H, W, C] (C <= 4): separable,
// the horizontal pass then the vertical one, each with PIL's coefficients (the filter widened by the
// downscale factor, so it antialiases) in 22-bit fixed point and rounded to 8 bits. resample: 2
// bilinear, 3 bicubic (a = -0.5).
at::Tensor resize_like_pil(const at::Tensor &image, int64_t height, int64_t width, int resample);

}  // namespace videotrain::models
