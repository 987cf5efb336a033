// The VAE engine with Wan 2.1/2.2 folders: the family from config.json's _class_name, the
// reference inputs streamed as they arrive against diffusers' AutoencoderKLWan, uint8 frames
// pushed one by one, clip checks, errors and the out-of-memory retry.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <sys/stat.h>

#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>

#include "models/image_condition.h"
#include "tensor_buffer.h"
#include "tensor_caps.h"
#include "vae_test_util.h"

using namespace videotrain;
using namespace videotrain::vae;
using vaetest::rel_l2;
using vaetest::wan_dir;

namespace {

constexpr double kTol = 1e-5;

EngineOptions wan_options(const std::string &name, LatentKind kind) {
  EngineOptions o;
  o.model = wan_dir(name);
  o.device = "cpu";
  o.dtype = "float32";
  o.latent = kind;
  return o;
}

// The reference's tiles [min_height, min_width, stride_height, stride_width] as the engine's
// tile size and overlap properties.
EngineOptions tiled(EngineOptions o, const std::vector<int> &tile) {
  o.tile_height = tile[0];
  o.tile_width = tile[1];
  o.tile_overlap_height = 1 - static_cast<double>(tile[2]) / tile[0];
  o.tile_overlap_width = 1 - static_cast<double>(tile[3]) / tile[1];
  return o;
}

// Streams uint8 frames [T, H, W, 3] through push_frame; the latent it emits.
at::Tensor stream(VaeEngine &e, const at::Tensor &u8, uint64_t sample_id) {
  std::string w;
  const int T = u8.size(0), H = u8.size(1), W = u8.size(2);
  EXPECT_TRUE(e.begin_clip(sample_id, T, W, H, &w)) << w;
  for (int t = 0; t < T; t++) {
    at::Tensor f = u8[t].contiguous();
    EXPECT_TRUE(e.push_frame(f.data_ptr<uint8_t>(), W * 3, &w)) << w;
  }
  GstBuffer *buf = e.finish_clip(&w);
  EXPECT_NE(buf, nullptr) << w;
  if (!buf) return at::Tensor();
  auto t = tensor_from_buffer(buf, &w);
  gst_buffer_unref(buf);
  return t ? t->clone() : at::Tensor();
}

class WanEngine : public ::testing::TestWithParam<const char *> {};

}  // namespace

TEST_P(WanEngine, ReferenceInputsStreamedAsTheyArriveMatchDiffusers) {
  const std::string name = GetParam();
  vaetest::WanCases cases(name);
  ASSERT_TRUE(cases.ok());
  auto moments = vaetest::make_engine(wan_options(name, LatentKind::Moments));
  auto mode = vaetest::make_engine(wan_options(name, LatentKind::Mode));
  auto sample = vaetest::make_engine(wan_options(name, LatentKind::Sample));
  auto tiles = vaetest::make_engine(tiled(wan_options(name, LatentKind::Moments), cases.ints("tile")));
  ASSERT_TRUE(moments && mode && sample && tiles);
  EXPECT_EQ(moments->temporal_compression(), 4);
  EXPECT_EQ(moments->spatial_compression(), name == "tiny_wan21" ? 8 : 16);
  EXPECT_TRUE(moments->native());
  for (int T : cases.ints("frames")) {
    const std::string t = ".T" + std::to_string(T);
    at::Tensor x = cases.get("input" + t);
    const int64_t before = moments->chunks_encoded();
    at::Tensor raw = encode_raw(*moments, x);
    EXPECT_EQ(moments->chunks_encoded() - before, 1 + (T - 1) / 4) << "frame 0, then groups of 4";
    EXPECT_LT(rel_l2(raw, cases.get("moments" + t)), kTol) << name << t;
    EXPECT_LT(rel_l2(latent_from_raw(*moments, raw, 0), cases.get("moments" + t)[0]), kTol) << name << t;
    EXPECT_LT(rel_l2(latent_from_raw(*mode, raw, 0), cases.get("latent_mode" + t)[0]), kTol) << name << t << " mode";
    EXPECT_LT(rel_l2(latent_from_raw(*sample, raw, 0, cases.get("noise" + t)), cases.get("latent_sample" + t)[0]),
              kTol)
        << name << t << " sample";
    EXPECT_LT(rel_l2(encode_raw(*tiles, x), cases.get("tiled_moments" + t)), kTol) << name << t << " tiled";
  }
}

TEST_P(WanEngine, FramesPushedOneByOneGiveTheWholeClipResultWithinOneGroupOfFrames) {
  const std::string name = GetParam();
  vaetest::WanCases cases(name);
  ASSERT_TRUE(cases.ok());
  at::Tensor u8 = vaetest::quantize(cases.get("input.T13"));
  at::Tensor video = dequantize_frames(u8);
  for (LatentKind kind : {LatentKind::Moments, LatentKind::Mode, LatentKind::Sample}) {
    for (bool tile : {false, true}) {
      EngineOptions o = wan_options(name, kind);
      if (tile) o = tiled(o, cases.ints("tile"));
      auto e = vaetest::make_engine(o);
      ASSERT_TRUE(e);
      at::Tensor streamed = stream(*e, u8, 7);
      at::Tensor whole = latent_from_raw(*e, encode_raw(*e, video), 7);
      ASSERT_TRUE(streamed.defined());
      EXPECT_LT(rel_l2(streamed, whole), 1e-6) << latent_kind_name(kind) << (tile ? " tiled" : "");
      EXPECT_LE(e->peak_frames_held(), 4) << "frames are released group by group";
    }
  }
}

TEST_P(WanEngine, SamplesAreTheModePlusSeededGaussianNoise) {
  const std::string name = GetParam();
  vaetest::WanCases cases(name);
  ASSERT_TRUE(cases.ok());
  auto eng = vaetest::make_engine(wan_options(name, LatentKind::Sample));
  auto mode = vaetest::make_engine(wan_options(name, LatentKind::Mode));
  auto moments = vaetest::make_engine(wan_options(name, LatentKind::Moments));
  ASSERT_TRUE(eng && mode && moments);
  at::Tensor raw = encode_raw(*eng, cases.get("input.T13"));
  at::Tensor m = latent_from_raw(*moments, raw, 0);
  const int64_t z = m.size(0) / 2;
  std::ifstream in(wan_dir(name) + "/config.json");
  auto std_list = nlohmann::json::parse(in)["latents_std"].get<std::vector<double>>();
  at::Tensor latents_std = at::tensor(std_list, at::kDouble).to(at::kFloat).view({z, 1, 1, 1});
  at::Tensor a = latent_from_raw(*eng, raw, 1), b = latent_from_raw(*eng, raw, 2);
  EXPECT_TRUE(at::equal(a, latent_from_raw(*eng, raw, 1))) << "the same sample id gives the same noise";
  EXPECT_GT(rel_l2(a, b), 1e-3) << "another sample id, other noise";
  // (sample - mode) * latents_std / std of the posterior is the noise: standard normal.
  at::Tensor sd = at::exp(0.5 * m.narrow(0, z, z).clamp(-30, 20));
  at::Tensor eps = (a - latent_from_raw(*mode, raw, 1)) * latents_std / sd;
  EXPECT_LT(eps.mean().abs().item<double>(), 0.15);
  EXPECT_NEAR(eps.std().item<double>(), 1.0, 0.15);
}

INSTANTIATE_TEST_SUITE_P(Wan, WanEngine, ::testing::Values("tiny_wan21", "tiny_wan22"));

TEST(WanEngineClips, LengthsAndSizesTheVaeCannotUseAreSettingsFailures) {
  auto e21 = vaetest::make_engine(wan_options("tiny_wan21", LatentKind::Mode));
  auto e22 = vaetest::make_engine(wan_options("tiny_wan22", LatentKind::Mode));
  ASSERT_TRUE(e21 && e22);
  EXPECT_EQ(e21->check_clip(9, 88, 64), "");
  std::string bad = e21->check_clip(8, 96, 64);
  EXPECT_NE(bad.find("1 + 4n"), std::string::npos) << bad;
  EXPECT_NE(bad.find("use 5 or 9"), std::string::npos) << bad;
  bad = e22->check_clip(9, 88, 64);
  EXPECT_NE(bad.find("spatial compression 16"), std::string::npos) << bad;
  std::string why;
  EXPECT_FALSE(e22->begin_clip(0, 6, 96, 64, &why));
  EXPECT_TRUE(e22->failure_is_settings());
  EXPECT_NE(why.find("1 + 4n"), std::string::npos) << why;
  // Tiles whose strides keep fewer latent rows than the frame has cannot give its latent.
  EngineOptions o = wan_options("tiny_wan21", LatentKind::Mode);
  o.tile_height = 20;
  o.tile_overlap_height = 0.7;  // stride 6 keeps nothing of the 8x compression
  auto t = vaetest::make_engine(o);
  ASSERT_TRUE(t);
  bad = t->check_clip(5, 96, 64);
  EXPECT_NE(bad.find("tile-height=20"), std::string::npos) << bad;
}

TEST(WanEngineClips, TheFamilyComesFromTheConfigsClassName) {
  vttest::TempDir d;
  auto folder = [&](const std::string &sub, const std::string &from, const std::function<void(nlohmann::json &)> &edit) {
    std::ifstream in(from + "/config.json");
    nlohmann::json j = nlohmann::json::parse(in);
    edit(j);
    std::string dir = d.file(sub);
    mkdir(dir.c_str(), 0755);
    vttest::write_file(dir + "/config.json", j.dump());
    vttest::write_file(dir + "/diffusion_pytorch_model.safetensors",
                       vttest::read_file(from + "/diffusion_pytorch_model.safetensors"));
    return dir;
  };
  auto error_of = [](const std::string &dir) {
    EngineOptions o;
    o.model = dir;
    o.device = "cpu";
    std::string err;
    auto e = VaeEngine::create(o, &err);
    EXPECT_FALSE(e) << dir << " loaded";
    return err;
  };
  std::string err = error_of(folder("foreign", wan_dir("tiny_wan21"), [](auto &j) { j["_class_name"] = "AutoencoderKLHunyuanVideo"; }));
  EXPECT_NE(err.find("'AutoencoderKLHunyuanVideo'"), std::string::npos) << err;
  err = error_of(folder("no-z", wan_dir("tiny_wan22"), [](auto &j) { j.erase("z_dim"); }));
  EXPECT_NE(err.find("'z_dim'"), std::string::npos) << err;
  // Without a class name, CogVideoX's keys keep working (folders written before the class mattered).
  EngineOptions o;
  o.model = folder("unnamed", vaetest::tiny_a_dir(), [](auto &j) { j.erase("_class_name"); });
  o.device = "cpu";
  auto cog = vaetest::make_engine(o);
  ASSERT_TRUE(cog);
  EXPECT_EQ(cog->spatial_compression(), 8);
  // A Wan folder says so: the CogVideoX loader does not see it.
  EXPECT_TRUE(vaetest::make_engine(wan_options("tiny_wan22", LatentKind::Mode)));
}

TEST(WanEngineClips, OutOfMemoryRetriesWithSmallerTilesThenGivesUp) {
  for (const char *name : {"tiny_wan21", "tiny_wan22"}) {
    vaetest::WanCases cases(name);
    ASSERT_TRUE(cases.ok());
    at::Tensor u8 = vaetest::quantize(cases.get("input.T5"));
    EngineOptions o = wan_options(name, LatentKind::Moments);
    auto whole = vaetest::make_engine(o);
    ASSERT_TRUE(whole);
    at::Tensor untiled = stream(*whole, u8, 0);
    o.fake_oom_pixels = 64 * 96 - 1;  // the whole frame "does not fit"; smaller tiles do
    auto e = vaetest::make_engine(o);
    ASSERT_TRUE(e);
    std::vector<std::string> warnings;
    e->set_warning_callback([&](const std::string &w) { warnings.push_back(w); });
    at::Tensor retried = stream(*e, u8, 0);
    ASSERT_TRUE(retried.defined()) << name;
    EXPECT_GE(e->oom_retries(), 1) << name;
    ASSERT_FALSE(warnings.empty());
    EXPECT_NE(warnings[0].find("retrying with"), std::string::npos) << warnings[0];
    EXPECT_EQ(retried.sizes(), untiled.sizes()) << name << ": smaller tiles keep the latent's shape";
    EXPECT_TRUE(at::isfinite(retried).all().item<bool>());
    // Smaller than the smallest tile: the failure is fatal, not a dropped clip.
    o.fake_oom_pixels = 16;
    auto tiny = vaetest::make_engine(o);
    ASSERT_TRUE(tiny);
    std::string why;
    ASSERT_TRUE(tiny->begin_clip(0, 5, 96, 64, &why)) << why;
    at::Tensor f = u8[0].contiguous();
    EXPECT_FALSE(tiny->push_frame(f.data_ptr<uint8_t>(), 96 * 3, &why));
    EXPECT_TRUE(tiny->failure_is_fatal()) << why;
    EXPECT_NE(why.find("smallest tiles"), std::string::npos) << why;
  }
}

// condition=first-frame|first-last-frame: the engine's condition (its condition video made chunk by
// chunk through the clip's tiles) equals models::image_condition on the same frames with the same
// VAE (the whole condition video encoded at once), and the cache entry gives it back unchanged.
TEST(WanEngineCondition, EqualsImageConditionOfTheFramesAndComesBackFromTheCacheEntry) {
  for (const char *name : {"tiny_wan21", "tiny_wan22"}) {
    vaetest::WanCases cases(name);
    ASSERT_TRUE(cases.ok());
    const at::Tensor u8 = vaetest::quantize(cases.get("input.T5"));
    const int T = u8.size(0), H = u8.size(1), W = u8.size(2);
    for (Condition which : {Condition::First, Condition::FirstLast}) {
      // Untiled, and in the smaller tiles of the out-of-memory retry (a whole frame "does not fit"),
      // the reference encoding the whole condition video with the same retry.
      for (int tile : {0, 1}) {
        SCOPED_TRACE(std::string(name) + " condition " + std::to_string(int(which)) + " tile " + std::to_string(tile));
        EngineOptions o = wan_options(name, LatentKind::Sample);
        o.condition = which;
        if (tile) o.fake_oom_pixels = 64 * 96 - 1;
        EngineOptions ro = o;
        ro.latent = LatentKind::Mode;
        ro.condition = Condition::None;
        auto ref = vaetest::make_engine(ro);
        ASSERT_TRUE(ref);
        const models::LatentEncode encode = [&](const at::Tensor &video) {
          return latent_from_raw(*ref, encode_raw(*ref, video), 0).unsqueeze(0);
        };
        auto e = vaetest::make_engine(o);
        ASSERT_TRUE(e);
        std::string w;
        ASSERT_TRUE(e->begin_clip(7, T, W, H, &w, 1)) << w;
        for (int t = 0; t < T; t++) {
          at::Tensor f = u8[t].contiguous();
          ASSERT_TRUE(e->push_frame(f.data_ptr<uint8_t>(), W * 3, &w)) << w;
        }
        GstBuffer *buf = e->finish_clip(&w);
        ASSERT_NE(buf, nullptr) << w;
        auto cond = named_tensor_from_buffer(buf, "condition", &w);
        auto lat = tensor_from_buffer(buf, &w);
        auto frames = named_tensor_from_buffer(buf, "condition_frames", &w);
        ASSERT_TRUE(cond && lat && frames) << w;
        const at::Tensor got = cond->clone(), latent = lat->clone(), got_frames = frames->clone();
        // imageencoder's input: the given frames as decoded, uint8 [n, H, W, 3].
        EXPECT_EQ(tensor_names(buf), (std::vector<std::string>{"condition", "condition_frames"}));
        EXPECT_TRUE(at::equal(got_frames, which == Condition::First ? u8.narrow(0, 0, 1)
                                                                    : at::stack({u8[0], u8[T - 1]})));
        gst_buffer_unref(buf);
        {
          const at::Tensor want = models::image_condition(dequantize_frames(u8), static_cast<models::ConditionFrames>(which),
                                                          e->temporal_compression(), encode)
                                      .select(0, 0);
          ASSERT_EQ(got.sizes(), want.sizes());
          EXPECT_EQ(got.size(0), e->temporal_compression() + latent.size(0));
          EXPECT_LT(rel_l2(got, want), kTol);
          // The mask marks the given frames; the condition latents are not the clip's own.
          EXPECT_EQ(got.select(0, 0).select(0, 0).min().item<float>(), 1.0f);
          EXPECT_GT(rel_l2(got.narrow(0, e->temporal_compression(), latent.size(0)), latent), 1e-2);
          EXPECT_EQ(e->oom_retries(), tile ? ref->oom_retries() : 0);
          if (tile) {
            EXPECT_GE(e->oom_retries(), 1);
          }
        }
        // The cache entry: moments and condition; a second epoch from it gives the same condition.
        CacheEntry entry;
        ASSERT_TRUE(e->last_moments(&entry));
        ASSERT_NE(entry.find("condition"), nullptr);
        ASSERT_NE(entry.find("condition_frames"), nullptr);
        GstBuffer *again = e->latent_from_moments(entry, 7, 1, &w);
        ASSERT_NE(again, nullptr) << w;
        auto cached = named_tensor_from_buffer(again, "condition", &w);
        auto cached_lat = tensor_from_buffer(again, &w);
        auto cached_frames = named_tensor_from_buffer(again, "condition_frames", &w);
        ASSERT_TRUE(cached && cached_lat && cached_frames) << w;
        EXPECT_TRUE(at::equal(*cached, got));
        EXPECT_TRUE(at::equal(*cached_lat, latent));
        EXPECT_TRUE(at::equal(*cached_frames, got_frames));
        gst_buffer_unref(again);
        // An entry of a condition without its frames (written before they were cached) is refused.
        entry.tensors.resize(2);
        EXPECT_EQ(e->latent_from_moments(entry, 7, 1, &w), nullptr);
        EXPECT_NE(w.find("condition_frames"), std::string::npos) << w;
        // An entry written without a condition does not serve a condition engine.
        entry.tensors.resize(1);
        EXPECT_EQ(e->latent_from_moments(entry, 7, 1, &w), nullptr);
        EXPECT_NE(w.find("no condition"), std::string::npos) << w;
      }
    }
  }
}

TEST(WanEngineCondition, FirstLastNeedsTwoFramesAndTheKeyNamesTheMode) {
  EngineOptions o = wan_options("tiny_wan21", LatentKind::Mode);
  auto none = vaetest::make_engine(o);
  o.condition = Condition::FirstLast;
  auto flf = vaetest::make_engine(o);
  ASSERT_TRUE(none && flf);
  std::string why;
  EXPECT_FALSE(flf->begin_clip(0, 1, 96, 64, &why));
  EXPECT_TRUE(flf->failure_is_settings());
  EXPECT_NE(why.find("first-last-frame"), std::string::npos) << why;
  const std::string k0 = none->cache_key(&why), k2 = flf->cache_key(&why);
  EXPECT_EQ(k0.find("condition"), std::string::npos);
  EXPECT_NE(k2.find("condition first-last-frame encode-2"), std::string::npos) << k2;  // with condition_frames
}
