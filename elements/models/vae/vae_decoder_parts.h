/* What vae_decoder.cpp shares with the family decoders (cogvideox_decoder.cpp, wan_decoder.cpp). */
#pragma once

#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "models/vae/vae_decoder.h"

namespace videotrain::vae {

using TensorTable = std::vector<std::pair<std::string, std::vector<int64_t>>>;

// Every tensor of `table` from st_path, strictly (missing tensors and shape mismatches are
// errors naming the tensor, st_path and cfg_path, which implies the shapes), as `dtype` on `device`.
std::map<std::string, at::Tensor> load_tensor_table(const std::string &st_path, const std::string &cfg_path,
                                                    const TensorTable &table, c10::Device device,
                                                    c10::ScalarType dtype);

// The causal convolution both families use (kernel kt in time, "same" padding in space): the
// cache slot holds the last kt - 1 input frames of the previous chunk; before the first chunk
// CogVideoX repeats the first frame, Wan pads zeros.
at::Tensor causal_conv3d(const at::Tensor &x, const at::Tensor &w, const at::Tensor &b, at::Tensor &slot,
                         bool repeat_first);

std::unique_ptr<VaeDecoder> load_cogvideox_decoder(const std::string &dir, c10::Device device, c10::ScalarType dtype);
std::unique_ptr<VaeDecoder> load_wan_decoder(const std::string &dir, c10::Device device, c10::ScalarType dtype);

}  // namespace videotrain::vae
