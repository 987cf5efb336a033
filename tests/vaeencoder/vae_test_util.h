// Helpers shared by the vaeencoder tests (torch).
#pragma once

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "safetensors.h"
#include "tensor_buffer.h"
#include "test_util.h"
#include "vaeencoder/vae_engine.h"
#include "vaeencoder/vae_engine_tensors.h"

namespace vaetest {

inline std::string tiny_a_dir() { return vttest::reference_dir() + "/cogvideox_vae/tiny_a"; }

// Reference cases from diffusers' implementation.
class Cases {
 public:
  Cases() {
    std::string err;
    file_ = videotrain::SafetensorsFile::open(tiny_a_dir() + "/cases.safetensors", &err);
    if (!file_) ADD_FAILURE() << err;
  }
  bool ok() const { return file_ != nullptr; }
  at::Tensor get(const std::string &name) const {
    const auto *e = file_->find(name);
    if (!e || e->dtype != "F32") {
      ADD_FAILURE() << "no F32 tensor " << name << " in cases.safetensors";
      return at::Tensor();
    }
    at::Tensor t = at::empty(e->shape, at::kFloat);
    memcpy(t.data_ptr(), e->data, e->nbytes);
    return t;
  }
  std::string meta(const std::string &k) const { return file_->metadata().at(k); }
  // The reference's tiles (metadata "tile": height, width, overlap height, overlap width).
  void use_reference_tiles(videotrain::vae::EngineOptions *o) const {
    auto tile = nlohmann::json::parse(meta("tile"));
    o->tile_height = tile[0].get<int>();
    o->tile_width = tile[1].get<int>();
    o->tile_overlap_height = tile[2].get<double>();
    o->tile_overlap_width = tile[3].get<double>();
  }

 private:
  std::unique_ptr<videotrain::SafetensorsFile> file_;
};

inline std::string wan_dir(const std::string &name) { return vttest::reference_dir() + "/wan_vae/" + name; }

// diffusers' AutoencoderKLWan outputs (tests/reference/wan_vae/NAME/cases.safetensors).
class WanCases {
 public:
  explicit WanCases(const std::string &name) {
    std::string err;
    file_ = videotrain::SafetensorsFile::open(wan_dir(name) + "/cases.safetensors", &err);
    if (!file_) ADD_FAILURE() << err;
  }
  bool ok() const { return file_ != nullptr; }
  at::Tensor get(const std::string &key) const {
    const auto *e = file_->find(key);
    if (!e || e->dtype != "F32") {
      ADD_FAILURE() << "no F32 tensor " << key;
      return at::Tensor();
    }
    at::Tensor t = at::empty(e->shape, at::kFloat);
    memcpy(t.data_ptr(), e->data, e->nbytes);
    return t;
  }
  // A metadata list of whole numbers ("[1, 5, 13]").
  std::vector<int> ints(const std::string &key) const {
    std::vector<int> out;
    std::string v = file_->metadata().at(key);
    for (size_t i = 0; i < v.size();) {
      if (isdigit(static_cast<unsigned char>(v[i]))) {
        size_t used = 0;
        out.push_back(std::stoi(v.substr(i), &used));
        i += used;
      } else {
        i++;
      }
    }
    return out;
  }

 private:
  std::unique_ptr<videotrain::SafetensorsFile> file_;
};

inline double rel_l2(const at::Tensor &a, const at::Tensor &ref) {
  return (a.to(at::kDouble) - ref.to(at::kDouble)).norm().item<double>() / ref.to(at::kDouble).norm().item<double>();
}

// [-1, 1] float video [1, 3, T, H, W] -> uint8 frames [T, H, W, 3].
inline at::Tensor quantize(const at::Tensor &video) {
  return ((video[0] + 1) * 127.5).round().clamp(0, 255).to(at::kByte).permute({1, 2, 3, 0}).contiguous();
}

inline std::unique_ptr<videotrain::vae::VaeEngine> make_engine(const videotrain::vae::EngineOptions &o) {
  std::string err;
  auto e = videotrain::vae::VaeEngine::create(o, &err);
  EXPECT_TRUE(e) << err;
  return e;
}

// Streams uint8 frames [T, H, W, 3] through the engine; the latent it emits.
inline at::Tensor stream(videotrain::vae::VaeEngine &e, const at::Tensor &u8, uint64_t sample_id,
                         std::string *why = nullptr) {
  std::string w;
  int T = u8.size(0), H = u8.size(1), W = u8.size(2);
  if (!e.begin_clip(sample_id, T, W, H, &w)) {
    if (why) *why = w;
    return at::Tensor();
  }
  for (int t = 0; t < T; t++) {
    at::Tensor f = u8[t].contiguous();
    if (!e.push_frame(f.data_ptr<uint8_t>(), W * 3, &w)) {
      if (why) *why = w;
      return at::Tensor();
    }
  }
  EXPECT_TRUE(e.clip_complete());
  GstBuffer *buf = e.finish_clip(&w);
  if (!buf) {
    if (why) *why = w;
    return at::Tensor();
  }
  auto t = videotrain::tensor_from_buffer(buf, &w);
  gst_buffer_unref(buf);
  return t ? t->clone() : at::Tensor();
}

}  // namespace vaetest
