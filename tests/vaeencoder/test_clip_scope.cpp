/* norm-scope=clip: CogVideoXEncoder::forward_clip_scope and the engine's norm-scope=clip path
 * against diffusers' single pass over the whole clip (single_pass.T{T} in the tiny_a reference
 * cases), chunk-frames 8 and 4, levels kept in memory and spilled to a file, with tiles, with
 * streamed uint8 frames, latent=sample|mode|moments and the out-of-memory retry. */
#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <cstring>
#include <filesystem>

#include "vae_test_util.h"
#include "models/vae/vae_config.h"
#include "models/vae/cogvideox_encoder.h"

using namespace videotrain::vae;
using vaetest::rel_l2;

namespace {

// diffusers' chunks: [0, k + r), then [k*i + r, k*(i+1) + r), r = T mod k.
std::vector<at::Tensor> chunks_of(const at::Tensor &video, int k) {
  const int64_t T = video.size(2), r = T % k;
  std::vector<at::Tensor> out;
  int64_t start = 0, end = std::min<int64_t>(T, k + r);
  while (start < T) {
    out.push_back(video.narrow(2, start, end - start));
    start = end;
    end = std::min<int64_t>(T, end + k);
  }
  return out;
}

EngineOptions clip_options(LatentKind latent = LatentKind::Moments, int chunk_frames = 8) {
  EngineOptions o;
  o.model = vaetest::tiny_a_dir();
  o.device = "cpu";
  o.dtype = "float32";
  o.latent = latent;
  o.chunk_frames = chunk_frames;
  o.norm_scope = NormScope::Clip;
  return o;
}

// A CogVideoX VAE whose convolutions see one pixel spatially (every 3x3 kernel keeps only its
// centre; time kernels stay): tile borders change nothing, so a tiled encode departs from the
// untiled one only through its normalisation statistics.
std::string pointwise_vae(const vttest::TempDir &dir) {
  std::string err;
  EXPECT_TRUE(make_random_vae(dir.file("random"), tiny_config(), 21, "F32", &err)) << err;
  auto src = videotrain::SafetensorsFile::open(dir.file("random/diffusion_pytorch_model.safetensors"), &err);
  EXPECT_TRUE(src) << err;
  std::vector<videotrain::SafetensorsOutTensor> out;
  for (const auto &[name, e] : src->entries()) {
    at::Tensor t = at::empty(e.shape, at::kFloat);
    memcpy(t.data_ptr(), e.data, e.nbytes);
    const int64_t d = t.dim();
    if (d >= 4 && t.size(d - 1) == 3 && t.size(d - 2) == 3) {
      at::Tensor centre = t.select(d - 1, 1).select(d - 2, 1).clone() * 3;
      t.zero_();
      t.select(d - 1, 1).select(d - 2, 1).copy_(centre);
    }
    videotrain::SafetensorsOutTensor o{name, "F32", e.shape, std::vector<uint8_t>(e.nbytes)};
    memcpy(o.bytes.data(), t.data_ptr(), e.nbytes);
    out.push_back(std::move(o));
  }
  std::filesystem::create_directories(dir.file("vae"));
  vttest::write_file(dir.file("vae/config.json"), vttest::read_file(dir.file("random/config.json")));
  EXPECT_TRUE(write_safetensors(dir.file("vae/diffusion_pytorch_model.safetensors"), out, {}, &err)) << err;
  return dir.file("vae");
}

}  // namespace

TEST(ClipScope, WholeClipStatisticsEqualDiffusersSinglePass) {
  vaetest::Cases cases;
  ASSERT_TRUE(cases.ok());
  auto enc = CogVideoXEncoder::load(vaetest::tiny_a_dir(), c10::Device(c10::kCPU), at::kFloat);
  for (int T : {1, 9, 25}) {
    const std::string t = ".T" + std::to_string(T);
    at::Tensor video = cases.get("input" + t), single = cases.get("single_pass" + t), chunked = cases.get("chunked" + t);
    for (int k : {8, 4})
      for (SpillTo spill : {SpillTo::Device, SpillTo::File}) {
        at::Tensor got = enc->forward_clip_scope(chunks_of(video, k), spill);
        EXPECT_LT(vaetest::rel_l2(got, single), 1e-5) << "T=" << T << " k=" << k << " spill=" << int(spill);
        if (T > 9) {
          EXPECT_GT(vaetest::rel_l2(got, chunked), 1e-2) << "chunk statistics, not the clip's";
        }
      }
  }
}

// The engine's whole-clip call (the float path) with norm-scope=clip, both spill places.
TEST(ClipScopeEngine, EncodeEqualsDiffusersSinglePass) {
  vaetest::Cases cases;
  ASSERT_TRUE(cases.ok());
  for (int k : {8, 4})
    for (ClipSpill spill : {ClipSpill::Auto, ClipSpill::Memory}) {
      EngineOptions o = clip_options(LatentKind::Moments, k);
      o.clip_spill = spill;
      auto eng = vaetest::make_engine(o);
      ASSERT_TRUE(eng);
      for (int T : {1, 9, 25}) {
        const std::string t = ".T" + std::to_string(T);
        at::Tensor raw = encode_raw(*eng, cases.get("input" + t));
        EXPECT_LT(rel_l2(raw, cases.get("single_pass" + t)), 1e-5) << "T=" << T << " k=" << k;
      }
    }
}

// uint8 frames streamed through the engine give what forward_clip_scope gives on the same frames,
// through the chunk path's latent derivation: moments, mode = scaling_factor * mean, sample.
TEST(ClipScopeEngine, StreamedFramesGiveTheClipScopeLatents) {
  vaetest::Cases cases;
  ASSERT_TRUE(cases.ok());
  auto enc = CogVideoXEncoder::load(vaetest::tiny_a_dir(), c10::Device(c10::kCPU), at::kFloat);
  const double scaling = enc->config().scaling_factor;
  for (int T : {9, 25}) {
    const std::string t = ".T" + std::to_string(T);
    at::Tensor u8 = vaetest::quantize(cases.get("input" + t));
    at::Tensor raw = enc->forward_clip_scope(chunks_of(dequantize_frames(u8), 8), SpillTo::Device);
    const int64_t C = raw.size(1) / 2;

    auto moments = vaetest::make_engine(clip_options(LatentKind::Moments));
    ASSERT_TRUE(moments);
    at::Tensor got = vaetest::stream(*moments, u8, 7);
    ASSERT_TRUE(got.defined());
    at::Tensor want = at::cat({raw.narrow(1, 0, C), raw.narrow(1, C, C).clamp(-30, 20)}, 1)[0];
    EXPECT_LT(rel_l2(got, want), 1e-6) << t;
    EXPECT_LT(rel_l2(got, cases.get("single_pass" + t)[0]), 0.05) << "8-bit input stays close" << t;
    EXPECT_EQ(moments->peak_frames_held(), T) << "the clip's frames are kept until its end";
    EXPECT_EQ(moments->chunks_encoded(), T / 8);

    auto mode = vaetest::make_engine(clip_options(LatentKind::Mode));
    at::Tensor m = vaetest::stream(*mode, u8, 7);
    ASSERT_TRUE(m.defined());
    EXPECT_LT(rel_l2(m, raw.narrow(1, 0, C)[0] * scaling), 1e-6) << t;
    if (T > 9) {
      EXPECT_GT(rel_l2(m, cases.get("latent_mode" + t)[0]), 0.05) << "not the chunk-scope latent" << t;
    }

    EngineOptions so = clip_options(LatentKind::Sample);
    so.seed = 3;
    auto sample = vaetest::make_engine(so);
    at::Tensor z = vaetest::stream(*sample, u8, 7);
    ASSERT_TRUE(z.defined());
    EXPECT_LT(rel_l2(z, latent_from_raw(*sample, raw, 7)), 1e-6) << t;
    EXPECT_GT(rel_l2(z, m), 1e-3) << "sample is not the mode";
  }
}

// Tiles with norm-scope=clip: every GroupNorm takes the statistics of the whole frame, each
// tile counting the positions it owns. With convolutions that ignore tile borders (a pointwise
// VAE, tile origins on multiples of 8 pixels) the tiled encode is then the untiled single pass
// (the engine's, held against diffusers above); with chunk scope (per tile and chunk) it is not.
TEST(ClipScopeEngine, TilesUseWholeFrameStatistics) {
  vttest::TempDir dir;
  at::manual_seed(5);
  const int T = 17, H = 128, W = 192;
  at::Tensor coarse = at::rand({3 * T, 1, 8, 8}) * 2 - 1;
  at::Tensor video = at::upsample_bilinear2d(coarse, {H, W}, false).view({1, 3, T, H, W});
  EngineOptions o = clip_options();
  o.model = pointwise_vae(dir);
  o.norm_scope = NormScope::Chunk;
  auto untiled_chunks = vaetest::make_engine(o);
  o.tile_height = o.tile_width = 64;  // origins every 48 pixels
  o.tile_overlap_height = o.tile_overlap_width = 0.25;
  auto tiled_chunks = vaetest::make_engine(o);
  o.norm_scope = NormScope::Clip;
  auto tiled = vaetest::make_engine(o);
  ASSERT_TRUE(untiled_chunks && tiled_chunks && tiled);
  at::Tensor single = encode_raw(*untiled_chunks, video, T);  // one chunk: the single pass
  at::Tensor ours = encode_raw(*tiled, video);
  ASSERT_EQ(ours.sizes(), single.sizes());
  EXPECT_LT(rel_l2(ours, single), 1e-5);
  EXPECT_GT(rel_l2(encode_raw(*tiled_chunks, video), single), 1e-2) << "per-tile statistics differ";
  EXPECT_GT(rel_l2(encode_raw(*tiled_chunks, video, T), single), 1e-2) << "even in one chunk";
  // Streaming uint8 frames gives the tensor path's result on the same frames.
  at::Tensor u8 = vaetest::quantize(video);
  at::Tensor got = vaetest::stream(*tiled, u8, 1);
  ASSERT_TRUE(got.defined());
  EXPECT_LT(rel_l2(got, latent_from_raw(*tiled, encode_raw(*tiled, dequantize_frames(u8)), 1)), 1e-6);
}

// The reference VAE (3x3 kernels) with the reference tiles: tile borders now change the
// convolutions, but the tiled clip-scope encode stays nearer the single pass than diffusers'
// tiled chunked encode is to it.
TEST(ClipScopeEngine, ReferenceTilesNearerTheSinglePass) {
  vaetest::Cases cases;
  ASSERT_TRUE(cases.ok());
  EngineOptions o = clip_options();
  cases.use_reference_tiles(&o);
  auto eng = vaetest::make_engine(o);
  ASSERT_TRUE(eng);
  for (int T : {9, 25}) {
    const std::string t = ".T" + std::to_string(T);
    at::Tensor single = cases.get("single_pass" + t);
    const double ours = rel_l2(encode_raw(*eng, cases.get("input" + t)), single);
    EXPECT_LT(ours, rel_l2(cases.get("tiled" + t), single)) << t;
  }
}

// Out of memory: the clip is encoded again from its kept frames with smaller tiles, still with
// whole-frame statistics.
TEST(ClipScopeEngine, OutOfMemoryRetriesWithSmallerTiles) {
  vaetest::Cases cases;
  ASSERT_TRUE(cases.ok());
  EngineOptions o = clip_options();
  o.fake_oom_pixels = 48 * 64;
  std::vector<std::string> warnings;
  auto eng = vaetest::make_engine(o);
  ASSERT_TRUE(eng);
  eng->set_warning_callback([&](const std::string &w) { warnings.push_back(w); });
  at::Tensor u8 = vaetest::quantize(cases.get("input.T25"));
  std::string why;
  at::Tensor got = vaetest::stream(*eng, u8, 4, &why);
  ASSERT_TRUE(got.defined()) << why;
  EXPECT_GE(eng->oom_retries(), 1);
  ASSERT_FALSE(warnings.empty());
  EXPECT_NE(warnings[0].find("retrying with"), std::string::npos) << warnings[0];
  // The retry's tiles: the tensor path on the same frames meets the same limit and retries alike.
  EXPECT_LT(rel_l2(got, latent_from_raw(*eng, encode_raw(*eng, dequantize_frames(u8)), 4)), 1e-6);
  EngineOptions co = o;
  co.norm_scope = NormScope::Chunk;
  auto chunks = vaetest::make_engine(co);
  EXPECT_GT(rel_l2(got, vaetest::stream(*chunks, u8, 4)), 0.05) << "whole-clip statistics after the retry";
  // Nothing fits: the failure is fatal and says so.
  o.fake_oom_pixels = 1;
  auto none = vaetest::make_engine(o);
  EXPECT_FALSE(vaetest::stream(*none, u8, 4, &why).defined());
  EXPECT_TRUE(none->failure_is_fatal());
  EXPECT_NE(why.find("smallest tiles"), std::string::npos) << why;
}

TEST(ClipScopeEngine, TorchScriptAndWanModelsAreRefusedNamingTheProperty) {
  vttest::TempDir d;
  vttest::write_file(d.file("encoder.pt"), "not looked at");
  EngineOptions o = clip_options();
  o.model = d.file("encoder.pt");
  std::string err;
  EXPECT_FALSE(VaeEngine::create(o, &err));
  EXPECT_NE(err.find("norm-scope=clip"), std::string::npos) << err;
  EXPECT_NE(err.find("TorchScript"), std::string::npos) << err;
  o.model = vttest::reference_dir() + "/wan_vae/tiny_wan21";
  EXPECT_FALSE(VaeEngine::create(o, &err));
  EXPECT_NE(err.find("norm-scope=clip"), std::string::npos) << err;
  EXPECT_NE(err.find("Wan"), std::string::npos) << err;
  EXPECT_NE(err.find("norm-scope=chunk"), std::string::npos) << err;
}
