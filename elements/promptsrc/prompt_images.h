/* A prompt's image (promptsrc's image / last_image columns): a still (PNG, JPEG, anything decodebin
 * reads as one frame) decoded at its own size to 8-bit RGB through csvvideosrc's decoder, so its
 * colour conversion is the training frames'. No torch. */
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace videotrain {

struct PromptImage {
  int64_t width = 0, height = 0;
  std::vector<uint8_t> rgb;  // packed [height, width, 3]
};

// False with *why (the decoder's or the prober's reason) when the file cannot be read as an image.
bool decode_prompt_image(const std::string &path, PromptImage *out, std::string *why);

}  // namespace videotrain
