/* The native VAE decoders (CogVideoX, Wan 2.1, Wan 2.2) against diffusers' own decode
 * (decode_cases.safetensors beside each VAE in tests/reference): the pipeline's latents denormalised per family,
 * decoded untiled and tiled, frames handed on chunk by chunk; bad input named. */
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "models/vae/vae_config.h"
#include "models/vae/vae_decoder.h"
#include "safetensors.h"
#include "test_util.h"

using namespace videotrain;
using namespace videotrain::vae;

namespace {

struct Cases {
  std::unique_ptr<SafetensorsFile> file;
  explicit Cases(const std::string &dir) {
    std::string err;
    file = SafetensorsFile::open(dir + "/decode_cases.safetensors", &err);
    if (!file) ADD_FAILURE() << err;
  }
  at::Tensor get(const std::string &key) const {
    const auto *e = file->find(key);
    if (!e) {
      ADD_FAILURE() << "no " << key;
      return at::zeros({1});
    }
    at::Tensor t = at::empty(e->shape, at::kFloat);
    std::memcpy(t.data_ptr(), e->data, e->nbytes);
    return t;
  }
  std::vector<std::string> names() const {  // "T1", "T2_h4w6", ...
    std::vector<std::string> out;
    for (const auto &[k, e] : file->entries())
      if (k.rfind("decoded.", 0) == 0) out.push_back(k.substr(8));
    return out;
  }
  nlohmann::json meta(const std::string &key) const { return nlohmann::json::parse(file->metadata().at(key)); }
};

double rel_l2(const at::Tensor &a, const at::Tensor &ref) {
  return (a.to(at::kDouble) - ref.to(at::kDouble)).norm().item<double>() / ref.to(at::kDouble).norm().item<double>();
}

struct Vae {
  const char *dir;
  VaeDecoder::Family family;
};

class DecoderFamily : public ::testing::TestWithParam<Vae> {};

std::string ref(const std::string &rel) { return vttest::reference_dir() + "/" + rel; }

}  // namespace

TEST_P(DecoderFamily, MatchesDiffusersUntiledAndTiled) {
  const std::string dir = ref(GetParam().dir);
  Cases cases(dir);
  ASSERT_TRUE(cases.file);
  auto dec = VaeDecoder::load(dir, c10::Device(c10::kCPU), at::kFloat);
  EXPECT_EQ(dec->family(), GetParam().family);
  const bool cog = dec->family() == VaeDecoder::Family::CogVideoX;
  DecodeTiles tiles;
  auto t = cases.meta("tile");
  tiles.tile_h = t[0].get<int>();
  tiles.tile_w = t[1].get<int>();
  // CogVideoX's enable_tiling takes overlap factors: stride = tile - int(tile * factor).
  tiles.stride_h = cog ? tiles.tile_h - static_cast<int>(tiles.tile_h * t[2].get<double>()) : t[2].get<int>();
  tiles.stride_w = cog ? tiles.tile_w - static_cast<int>(tiles.tile_w * t[3].get<double>()) : t[3].get<int>();
  int tiled_cases = 0;
  ASSERT_FALSE(cases.names().empty());
  for (const std::string &name : cases.names()) {
    SCOPED_TRACE(std::string(GetParam().dir) + " " + name);
    at::Tensor lat = cases.get("pipeline_latents." + name);
    if (cog) lat = lat.permute({0, 2, 1, 3, 4});  // the pipeline holds [B, F, C, H, W]
    at::Tensor input = cases.get("vae_input." + name);
    EXPECT_LT(rel_l2(dec->denormalize(lat), input), 1e-6);
    at::Tensor want = cases.get("decoded." + name);
    EXPECT_EQ(dec->frames_for(lat.size(2)), want.size(2));
    at::Tensor got = dec->decode_all(dec->denormalize(lat));
    ASSERT_EQ(got.sizes(), want.sizes());
    EXPECT_LT(rel_l2(got, want), 1e-5);
    if (cases.file->find("tiled." + name)) {
      tiled_cases++;
      at::Tensor tiled = dec->decode_all(input, tiles);
      at::Tensor tiled_want = cases.get("tiled." + name);
      ASSERT_EQ(tiled.sizes(), tiled_want.sizes());
      EXPECT_LT(rel_l2(tiled, tiled_want), 1e-5);
      EXPECT_GT(rel_l2(tiled_want, want), 0.05) << "the tiled case must differ from the untiled one to test tiles";
    }
  }
  EXPECT_EQ(tiled_cases, 1);
}

// Frames come out chunk by chunk (CogVideoX: 2 latent frames, the odd one in the first; Wan: one),
// the first as soon as it is decoded.
TEST_P(DecoderFamily, HandsOnEachChunk) {
  const std::string dir = ref(GetParam().dir);
  auto dec = VaeDecoder::load(dir, c10::Device(c10::kCPU), at::kFloat);
  const bool cog = dec->family() == VaeDecoder::Family::CogVideoX;
  at::Tensor z = at::randn({1, dec->latent_channels(), 5, 2, 3}, at::TensorOptions().dtype(at::kFloat));
  std::vector<int64_t> counts;
  for (bool tiled : {false, true}) {
    counts.clear();
    DecodeTiles tiles;
    if (tiled) tiles = {dec->spatial_compression() * 2, dec->spatial_compression() * 2, dec->spatial_compression(),
                        dec->spatial_compression()};
    dec->decode(z, tiles, [&](const at::Tensor &f) {
      EXPECT_EQ(f.size(1), 3);
      EXPECT_EQ(f.size(3), 2 * dec->spatial_compression());
      EXPECT_EQ(f.size(4), 3 * dec->spatial_compression());
      counts.push_back(f.size(2));
    });
    if (cog)
      EXPECT_EQ(counts, (std::vector<int64_t>{9, 8}));
    else
      EXPECT_EQ(counts, (std::vector<int64_t>{1, 4, 4, 4, 4}));
  }
}

TEST_P(DecoderFamily, BadInputIsNamed) {
  const std::string dir = ref(GetParam().dir);
  auto dec = VaeDecoder::load(dir, c10::Device(c10::kCPU), at::kFloat);
  const int c = dec->latent_channels();
  try {
    dec->decode_all(at::zeros({1, c + 1, 1, 2, 3}));
    ADD_FAILURE() << "no error for a wrong channel count";
  } catch (const std::exception &e) {
    EXPECT_NE(std::string(e.what()).find(std::to_string(c)), std::string::npos) << e.what();
  }
  DecodeTiles bad{dec->spatial_compression() + 1, dec->spatial_compression() * 2, dec->spatial_compression(),
                  dec->spatial_compression()};
  try {
    dec->decode_all(at::zeros({1, c, 1, 4, 6}), bad);
    ADD_FAILURE() << "no error for a tile size off the compression grid";
  } catch (const std::exception &e) {
    EXPECT_NE(std::string(e.what()).find("tile-height"), std::string::npos) << e.what();
  }
}

INSTANTIATE_TEST_SUITE_P(Vaes, DecoderFamily,
                         ::testing::Values(Vae{"cogvideox_vae/tiny_a", VaeDecoder::Family::CogVideoX},
                                           Vae{"wan_vae/tiny_wan21", VaeDecoder::Family::Wan21},
                                           Vae{"wan_vae/tiny_wan22", VaeDecoder::Family::Wan22}));

// A VAE folder whose file lacks the decoder (an encoder-only folder) is named.
TEST(VaeDecoder, MissingDecoderTensorIsNamed) {
  vttest::TempDir tmp;
  const std::string dir = tmp.path();
  VaeConfig cfg = tiny_config();
  std::string err;
  ASSERT_TRUE(make_random_vae(dir, cfg, 1, "F32", &err)) << err;
  // make_random_vae writes both; keep the encoder's tensors only.
  ASSERT_TRUE(write_random_weights(dir + "/diffusion_pytorch_model.safetensors", encoder_tensor_table(cfg), 1, "F32",
                                   &err))
      << err;
  try {
    VaeDecoder::load(dir, c10::Device(c10::kCPU), at::kFloat);
    ADD_FAILURE() << "an encoder-only folder loaded";
  } catch (const std::exception &e) {
    EXPECT_NE(std::string(e.what()).find("decoder.conv_in.conv.weight"), std::string::npos) << e.what();
  }
}

// The decoder tensor table of the CogVideoX-2b layout is the published checkpoint's.
TEST(VaeDecoder, CogVideoX2bLayoutTable) {
  std::ifstream f(ref("cogvideox_vae/cogvideox_2b_vae_layout.json"));
  ASSERT_TRUE(f.good());
  nlohmann::json j = nlohmann::json::parse(f);
  std::map<std::string, std::vector<int64_t>> want;
  for (const auto &[name, shape] : j.at("tensors").items())
    if (name.rfind("decoder.", 0) == 0 || name.rfind("post_quant_conv", 0) == 0)
      want[name] = shape.get<std::vector<int64_t>>();
  std::map<std::string, std::vector<int64_t>> got;
  for (const auto &[name, shape] : decoder_tensor_table(cogvideox_2b_config())) got[name] = shape;
  ASSERT_FALSE(want.empty());
  EXPECT_EQ(got, want);
}
