/* The Wan 2.1 and 2.2 VAE encoders against diffusers' AutoencoderKLWan
 * (tests/reference/wan_vae: moments, tiled moments, normalised mode and sample latents). */
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>

#include "safetensors.h"
#include "test_util.h"
#include "models/vae/wan_config.h"
#include "models/vae/wan_encoder.h"

using namespace videotrain;
using namespace videotrain::vae;

namespace {

std::string wan_dir(const std::string &name) { return vttest::reference_dir() + "/wan_vae/" + name; }

struct WanCases {
  std::unique_ptr<SafetensorsFile> file;
  explicit WanCases(const std::string &name) {
    std::string err;
    file = SafetensorsFile::open(wan_dir(name) + "/cases.safetensors", &err);
    if (!file) ADD_FAILURE() << err;
  }
  at::Tensor get(const std::string &key) const {
    const auto *e = file->find(key);
    if (!e) {
      ADD_FAILURE() << "no " << key;
      return at::Tensor();
    }
    at::Tensor t = at::empty(e->shape, at::kFloat);
    std::memcpy(t.data_ptr(), e->data, e->nbytes);
    return t;
  }
  std::vector<int> ints(const std::string &key) const {
    return nlohmann::json::parse(file->metadata().at(key)).get<std::vector<int>>();
  }
};

double rel_l2(const at::Tensor &a, const at::Tensor &ref) {
  return (a.to(at::kDouble) - ref.to(at::kDouble)).norm().item<double>() / ref.to(at::kDouble).norm().item<double>();
}

class WanFamily : public ::testing::TestWithParam<const char *> {};

}  // namespace

TEST_P(WanFamily, MomentsTilesAndLatentsMatchDiffusers) {
  const std::string name = GetParam();
  WanCases cases(name);
  ASSERT_TRUE(cases.file);
  auto enc = WanEncoder::load(wan_dir(name), c10::Device(c10::kCPU), at::kFloat);
  const auto tile = cases.ints("tile");
  for (int T : cases.ints("frames")) {
    const std::string t = ".T" + std::to_string(T);
    at::Tensor x = cases.get("input" + t);
    at::Tensor moments = enc->encode(x);
    EXPECT_LT(rel_l2(moments, cases.get("moments" + t)), 1e-5) << name << t;
    const auto plan = enc->tile_plan(int(x.size(3)), int(x.size(4)), tile[0], tile[1], tile[2], tile[3]);
    EXPECT_LT(rel_l2(enc->encode(x, plan), cases.get("tiled_moments" + t)), 1e-5) << name << t << " tiled";
    EXPECT_LT(rel_l2(enc->latent(moments), cases.get("latent_mode" + t)), 1e-5) << name << t << " mode";
    EXPECT_LT(rel_l2(enc->latent(moments, cases.get("noise" + t)), cases.get("latent_sample" + t)), 1e-5)
        << name << t << " sample";
  }
}

TEST_P(WanFamily, StreamingChunkByChunkEqualsTheWholeClip) {
  // The cache carries everything: chunks fed one by one give the clip's moments, and a second
  // clip on a fresh cache is not affected by the first.
  const std::string name = GetParam();
  WanCases cases(name);
  ASSERT_TRUE(cases.file);
  auto enc = WanEncoder::load(wan_dir(name), c10::Device(c10::kCPU), at::kFloat);
  at::Tensor x = cases.get("input.T13");
  StreamCache cache;
  std::vector<at::Tensor> parts{enc->forward(x.narrow(2, 0, 1), cache)};
  for (int t = 1; t < 13; t += 4) parts.push_back(enc->forward(x.narrow(2, t, 4), cache));
  EXPECT_LT(rel_l2(at::cat(parts, 2), cases.get("moments.T13")), 1e-5);
  EXPECT_LT(rel_l2(enc->encode(cases.get("input.T5")), cases.get("moments.T5")), 1e-5);
}

INSTANTIATE_TEST_SUITE_P(Wan, WanFamily, ::testing::Values("tiny_wan21", "tiny_wan22"));

TEST(WanConfig, BadConfigsNameTheKey) {
  std::ifstream in(wan_dir("tiny_wan22") + "/config.json");
  nlohmann::json good = nlohmann::json::parse(in);
  WanConfig c;
  std::string err;
  ASSERT_TRUE(parse_wan_config(good.dump(), &c, &err)) << err;
  EXPECT_EQ(c.spatial_compression(), 16);
  EXPECT_EQ(c.temporal_compression(), 4);
  EXPECT_EQ(c.patch_size, 2);
  EXPECT_TRUE(c.is_residual);
  EXPECT_EQ(config_class_name(good.dump()), "AutoencoderKLWan");
  auto error_of = [&](const std::function<void(nlohmann::json &)> &edit) {
    nlohmann::json j = good;
    edit(j);
    WanConfig out;
    std::string e;
    EXPECT_FALSE(parse_wan_config(j.dump(), &out, &e));
    return e;
  };
  EXPECT_NE(error_of([](auto &j) { j.erase("z_dim"); }).find("'z_dim'"), std::string::npos);
  EXPECT_NE(error_of([](auto &j) { j["dim_mult"] = {1, 1e30}; }).find("'dim_mult'"), std::string::npos);
  // Products that overflow int64 (UBSan at the check before the fix) and uint64 wrapping negative.
  EXPECT_NE(error_of([](auto &j) { j["dim_mult"] = {1, int64_t(1) << 62, 2, 2}; }).find("'dim_mult'"), std::string::npos);
  EXPECT_NE(error_of([](auto &j) { j["dim_mult"] = {1, UINT64_MAX, 2, 2}; }).find("'dim_mult'"), std::string::npos);
  EXPECT_NE(error_of([](auto &j) { j["dim_mult"] = {1, 4097, 2, 2}; }).find("from 1 to 4096"), std::string::npos);
  EXPECT_NE(error_of([](auto &j) { j["latents_std"] = {1, 2}; }).find("'latents_std'"), std::string::npos);
  EXPECT_NE(error_of([](auto &j) { j["in_channels"] = 3; }).find("'in_channels'"), std::string::npos);
  EXPECT_NE(error_of([](auto &j) { j["attn_scales"] = {0.5}; }).find("'attn_scales'"), std::string::npos);
  EXPECT_NE(error_of([](auto &j) { j["is_residual"] = "yes"; }).find("'is_residual'"), std::string::npos);
  EXPECT_NE(error_of([](auto &j) { j["temperal_downsample"] = {true}; }).find("'temperal_downsample'"),
            std::string::npos);
}

TEST(WanEncoder, AWeightOfTheWrongShapeIsAnErrorNamingIt) {
  vttest::TempDir d;
  std::ifstream cfg(wan_dir("tiny_wan21") + "/config.json");
  nlohmann::json j = nlohmann::json::parse(cfg);
  j["base_dim"] = 8;  // the weights are for 16
  vttest::write_file(d.file("config.json"), j.dump());
  vttest::write_file(d.file("diffusion_pytorch_model.safetensors"),
                     vttest::read_file(wan_dir("tiny_wan21") + "/diffusion_pytorch_model.safetensors"));
  try {
    WanEncoder::load(d.path(), c10::Device(c10::kCPU), at::kFloat);
    FAIL() << "loaded weights of another shape";
  } catch (const std::runtime_error &e) {
    EXPECT_NE(std::string(e.what()).find("encoder.conv_in.weight"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("implies"), std::string::npos) << e.what();
  }
}
