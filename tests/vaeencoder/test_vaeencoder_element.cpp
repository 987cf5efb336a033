// vaeencoder in pipelines: appsrc pushing RGB frames with clip metas, appsink taking latents.
#include <ATen/ATen.h>
#include <gst/app/gstappsink.h>
#include <gst/app/gstappsrc.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <nlohmann/json.hpp>

#include "metas.h"
#include "tensor_buffer.h"
#include "tensor_caps.h"
#include "vae_test_util.h"
#include "models/vae/vae_config.h"

using namespace videotrain;
using namespace videotrain::vae;
using vaetest::rel_l2;

namespace {

constexpr GstClockTime kFrame = GST_SECOND / 8;

struct ClipIn {
  uint64_t sample = 0;
  at::Tensor u8;            // [T, H, W, 3]
  int declared = -1;        // num_frames in the metas (default: T)
  int send = -1;            // frames actually sent (default: all)
};

struct Output {
  at::Tensor latent;
  uint64_t sample = 0;
  GstClockTime pts = 0, duration = 0;
  std::string caps;
};

struct RunResult {
  std::vector<Output> out;
  std::vector<std::pair<uint64_t, std::string>> dropped;
  std::vector<std::string> warnings;
  std::string error;
};

RunResult run(const std::string &props, int W, int H, const std::vector<ClipIn> &clips, bool metas = true,
              const std::string &format = "RGB") {
  RunResult r;
  std::string desc = "appsrc name=src format=time caps=video/x-raw,format=" + format + ",width=" + std::to_string(W) +
                     ",height=" + std::to_string(H) + ",framerate=8/1 ! vaeencoder name=enc " + props +
                     " ! appsink name=sink sync=false wait-on-eos=false";
  GError *err = nullptr;
  GstElement *pipe = gst_parse_launch(desc.c_str(), &err);
  if (!pipe) {
    r.error = err ? err->message : "parse failed";
    g_clear_error(&err);
    return r;
  }
  GstElement *src = gst_bin_get_by_name(GST_BIN(pipe), "src");
  GstElement *sink = gst_bin_get_by_name(GST_BIN(pipe), "sink");
  gst_element_set_state(pipe, GST_STATE_PLAYING);
  GstClockTime pts = 0;
  uint64_t clip_index = 0;
  for (const auto &c : clips) {
    int T = c.u8.size(0);
    int declared = c.declared >= 0 ? c.declared : T;
    int send = c.send >= 0 ? c.send : T;
    for (int t = 0; t < send; t++) {
      at::Tensor f = c.u8[t].contiguous();
      gsize size = f.numel();
      if (format != "RGB") size = W * H * 3 / 2;  // I420
      GstBuffer *b = gst_buffer_new_allocate(nullptr, size, nullptr);
      gst_buffer_fill(b, 0, f.data_ptr(), std::min<gsize>(size, f.numel()));
      GST_BUFFER_PTS(b) = pts;
      GST_BUFFER_DURATION(b) = kFrame;
      pts += kFrame;
      if (metas) {
        auto *m = gst_buffer_add_videotrain_clip_meta(b, "a caption", "/videos/x.mp4", "train");
        m->sample_id = c.sample;
        m->clip_index = clip_index;
        m->frame_index = t;
        m->num_frames = declared;
      }
      if (gst_app_src_push_buffer(GST_APP_SRC(src), b) != GST_FLOW_OK) break;
    }
    clip_index++;
  }
  gst_app_src_end_of_stream(GST_APP_SRC(src));
  GstBus *bus = gst_element_get_bus(pipe);
  for (;;) {
    GstMessage *msg = gst_bus_timed_pop(bus, 120 * GST_SECOND);
    if (!msg) {
      r.error = "timeout";
      break;
    }
    bool done = false;
    switch (GST_MESSAGE_TYPE(msg)) {
      case GST_MESSAGE_EOS: done = true; break;
      case GST_MESSAGE_ERROR: {
        GError *e = nullptr;
        gchar *dbg = nullptr;
        gst_message_parse_error(msg, &e, &dbg);
        r.error = std::string(e->message) + " | " + (dbg ? dbg : "");
        g_clear_error(&e);
        g_free(dbg);
        done = true;
        break;
      }
      case GST_MESSAGE_WARNING: {
        GError *e = nullptr;
        gchar *dbg = nullptr;
        gst_message_parse_warning(msg, &e, &dbg);
        r.warnings.push_back(std::string(e->message) + " | " + (dbg ? dbg : ""));
        g_clear_error(&e);
        g_free(dbg);
        break;
      }
      case GST_MESSAGE_ELEMENT: {
        const GstStructure *s = gst_message_get_structure(msg);
        if (gst_structure_has_name(s, "vaeencoder-dropped")) {
          guint64 id = 0;
          gst_structure_get_uint64(s, "sample-id", &id);
          r.dropped.emplace_back(id, gst_structure_get_string(s, "reason"));
        }
        break;
      }
      default: break;
    }
    gst_message_unref(msg);
    if (done) break;
  }
  while (GstSample *smp = gst_app_sink_try_pull_sample(GST_APP_SINK(sink), 0)) {
    GstBuffer *b = gst_sample_get_buffer(smp);
    Output o;
    std::string why;
    auto t = tensor_from_buffer(b, &why);
    EXPECT_TRUE(t.has_value()) << why;
    if (t) o.latent = t->to(at::kFloat).clone();
    auto *sm = gst_buffer_get_videotrain_sample_meta(b);
    EXPECT_NE(sm, nullptr) << "latents carry the sample meta";
    if (sm) {
      o.sample = sm->sample_id;
      EXPECT_STREQ(sm->caption, "a caption");
      EXPECT_STREQ(sm->path, "/videos/x.mp4");
    }
    o.pts = GST_BUFFER_PTS(b);
    o.duration = GST_BUFFER_DURATION(b);
    gchar *cs = gst_caps_to_string(gst_sample_get_caps(smp));
    o.caps = cs;
    g_free(cs);
    r.out.push_back(std::move(o));
    gst_sample_unref(smp);
  }
  gst_object_unref(bus);
  gst_element_set_state(pipe, GST_STATE_NULL);
  gst_object_unref(src);
  gst_object_unref(sink);
  gst_object_unref(pipe);
  return r;
}

EngineOptions engine_options(const std::string &model, LatentKind kind) {
  EngineOptions o;
  o.model = model;
  o.device = "cpu";
  o.dtype = "float32";
  o.latent = kind;
  return o;
}

}  // namespace

// The element gives what the engine gives on the same 8-bit frames (whose float version
// the engine tests hold against diffusers), with the clip's sample meta and timing.
TEST(VaeEncoderElement, MatchesEngineOnReferenceCases) {
  vaetest::Cases cases;
  ASSERT_TRUE(cases.ok());
  std::vector<ClipIn> clips;
  for (int T : {9, 1, 25}) clips.push_back({static_cast<uint64_t>(100 + T), vaetest::quantize(cases.get("input.T" + std::to_string(T)))});
  std::string model = vaetest::tiny_a_dir();
  auto r = run("model=" + model + " latent=mode device=cpu", 96, 64, clips);
  ASSERT_EQ(r.error, "");
  ASSERT_EQ(r.out.size(), 3u);
  auto eng = vaetest::make_engine(engine_options(model, LatentKind::Mode));
  GstClockTime start = 0;
  for (size_t i = 0; i < clips.size(); i++) {
    int T = clips[i].u8.size(0);
    at::Tensor want = latent_from_raw(*eng, encode_raw(*eng, dequantize_frames(clips[i].u8)), clips[i].sample);
    ASSERT_EQ(r.out[i].latent.sizes(), want.sizes());
    EXPECT_LT(rel_l2(r.out[i].latent, want), 1e-5) << "T=" << T;
    EXPECT_LT(rel_l2(r.out[i].latent, cases.get("latent_mode.T" + std::to_string(T))[0]), 0.05);
    EXPECT_EQ(r.out[i].sample, clips[i].sample);
    EXPECT_EQ(r.out[i].pts, start) << "the first frame's PTS";
    EXPECT_EQ(r.out[i].duration, T * kFrame) << "spanning the clip";
    start += T * kFrame;
  }
  EXPECT_NE(r.out[0].caps.find("application/x-videotrain-tensor"), std::string::npos) << r.out[0].caps;
  EXPECT_NE(r.out[0].caps.find("content=(string)latents"), std::string::npos) << r.out[0].caps;
  EXPECT_NE(r.out[0].caps.find("dtype=(string)float32"), std::string::npos) << r.out[0].caps;
  EXPECT_NE(r.out[0].caps.find("device=(string)cpu"), std::string::npos) << r.out[0].caps;
  EXPECT_TRUE(r.dropped.empty());
}

TEST(VaeEncoderElement, SampleAndTiledMatchEngine) {
  vaetest::Cases cases;
  ASSERT_TRUE(cases.ok());
  auto tile = nlohmann::json::parse(cases.meta("tile"));
  std::string model = vaetest::tiny_a_dir();
  std::vector<ClipIn> clips{{5, vaetest::quantize(cases.get("input.T9"))}};
  // latent=sample: the noise comes from seed and sample id, so the engine reproduces it.
  auto r = run("model=" + model + " latent=sample seed=9", 96, 64, clips);
  ASSERT_EQ(r.error, "");
  ASSERT_EQ(r.out.size(), 1u);
  auto o = engine_options(model, LatentKind::Sample);
  o.seed = 9;
  auto eng = vaetest::make_engine(o);
  at::Tensor raw = encode_raw(*eng, dequantize_frames(clips[0].u8));
  EXPECT_LT(rel_l2(r.out[0].latent, latent_from_raw(*eng, raw, 5)), 1e-5);
  // Tiles as in the reference's tiled case.
  char props[256];
  snprintf(props, sizeof props, "tile-height=%d tile-width=%d tile-overlap-height=%.17g tile-overlap-width=%.17g",
           tile[0].get<int>(), tile[1].get<int>(), tile[2].get<double>(), tile[3].get<double>());
  r = run("model=" + model + " latent=moments " + props, 96, 64, clips);
  ASSERT_EQ(r.error, "");
  ASSERT_EQ(r.out.size(), 1u);
  o = engine_options(model, LatentKind::Moments);
  o.tile_height = tile[0].get<int>();
  o.tile_width = tile[1].get<int>();
  o.tile_overlap_height = tile[2].get<double>();
  o.tile_overlap_width = tile[3].get<double>();
  auto tiled = vaetest::make_engine(o);
  at::Tensor want = latent_from_raw(*tiled, encode_raw(*tiled, dequantize_frames(clips[0].u8)), 5);
  EXPECT_LT(rel_l2(r.out[0].latent, want), 1e-5);
  EXPECT_EQ(r.out[0].latent.sizes(), (c10::IntArrayRef{8, 3, 8, 12}));
}

// norm-scope=clip: the element gives the clip-scope engine's latents (whole-clip GroupNorm
// statistics), not the chunked ones; a TorchScript model is refused naming the property.
TEST(VaeEncoderElement, NormScopeClip) {
  vaetest::Cases cases;
  ASSERT_TRUE(cases.ok());
  std::string model = vaetest::tiny_a_dir();
  std::vector<ClipIn> clips{{11, vaetest::quantize(cases.get("input.T25"))}, {12, vaetest::quantize(cases.get("input.T9"))}};
  auto r = run("model=" + model + " latent=mode norm-scope=clip device=cpu", 96, 64, clips);
  ASSERT_EQ(r.error, "");
  ASSERT_EQ(r.out.size(), 2u);
  auto o = engine_options(model, LatentKind::Mode);
  o.norm_scope = NormScope::Clip;
  auto eng = vaetest::make_engine(o);
  ASSERT_TRUE(eng);
  for (size_t i = 0; i < clips.size(); i++) {
    const std::string t = ".T" + std::to_string(clips[i].u8.size(0));
    at::Tensor want = latent_from_raw(*eng, encode_raw(*eng, dequantize_frames(clips[i].u8)), clips[i].sample);
    EXPECT_LT(rel_l2(r.out[i].latent, want), 1e-5) << t;
    at::Tensor single = cases.get("single_pass" + t);
    at::Tensor single_mode = single.narrow(1, 0, single.size(1) / 2)[0] * std::stod(cases.meta("scaling_factor"));
    EXPECT_LT(rel_l2(r.out[i].latent, single_mode), 0.05) << "the single pass's mode, 8-bit input aside" << t;
    EXPECT_EQ(r.out[i].sample, clips[i].sample);
  }
  EXPECT_GT(rel_l2(r.out[0].latent, cases.get("latent_mode.T25")[0]), 0.05) << "not the chunked latent";

  vttest::TempDir d;
  vttest::write_file(d.file("encoder.pt"), "TorchScript or not, clip scope cannot reach its norms");
  r = run("model=" + d.file("encoder.pt") + " norm-scope=clip", 16, 16, {{1, at::zeros({1, 16, 16, 3}, at::kByte)}});
  EXPECT_NE(r.error.find("norm-scope=clip"), std::string::npos) << r.error;

  GstElement *e = gst_element_factory_make("vaeencoder", nullptr);
  ASSERT_NE(e, nullptr);
  gint scope = -1;
  g_object_get(e, "norm-scope", &scope, nullptr);
  EXPECT_EQ(scope, static_cast<gint>(NormScope::Chunk)) << "diffusers' chunked statistics by default";
  gst_object_unref(e);
}

// ---------------------------------------------------------------- bad input

class VaeEncoderBadInput : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new vttest::TempDir();
    VaeConfig c = tiny_config();
    c.block_out_channels = {8, 16, 16, 16};
    std::string err;
    ASSERT_TRUE(make_random_vae(dir_->file("vae"), c, 1, "F32", &err)) << err;
  }
  static void TearDownTestSuite() { delete dir_; }
  static std::string model() { return "model=" + dir_->file("vae") + " "; }
  static at::Tensor frames(int T, int H = 16, int W = 16) {
    return at::randint(0, 256, {T, H, W, 3}, at::TensorOptions().dtype(at::kByte));
  }
  static vttest::TempDir *dir_;
};
vttest::TempDir *VaeEncoderBadInput::dir_ = nullptr;

TEST_F(VaeEncoderBadInput, UnusableAndBrokenClipsAreDroppedAndTheStreamGoesOn) {
  std::vector<ClipIn> clips;
  clips.push_back({1, frames(9)});
  ClipIn cut{3, frames(9)};
  cut.send = 4;                                     // the next clip starts after 4 of 9 frames
  clips.push_back(cut);
  clips.push_back({4, frames(5)});
  ClipIn tail{5, frames(9)};
  tail.send = 6;                                    // the stream ends after 6 of 9
  clips.push_back(tail);
  auto r = run(model(), 16, 16, clips);
  ASSERT_EQ(r.error, "");
  ASSERT_EQ(r.out.size(), 2u);
  EXPECT_EQ(r.out[0].sample, 1u);
  EXPECT_EQ(r.out[1].sample, 4u);
  EXPECT_EQ(r.out[1].latent.sizes(), (c10::IntArrayRef{4, 2, 2, 2}));
  ASSERT_EQ(r.dropped.size(), 2u);
  EXPECT_EQ(r.dropped[0].first, 3u);
  EXPECT_NE(r.dropped[0].second.find("4 of 9"), std::string::npos) << r.dropped[0].second;
  EXPECT_EQ(r.dropped[1].first, 5u);
  EXPECT_NE(r.dropped[1].second.find("6 of 9"), std::string::npos) << r.dropped[1].second;
  EXPECT_EQ(r.warnings.size(), 2u);
}

// A clip length the VAE cannot use comes from the source's num-frames, so every clip has it:
// an element error at the first clip naming the setting, not a drop per clip.
TEST_F(VaeEncoderBadInput, ClipLengthTheVaeCannotUseIsAnErrorAtTheFirstClip) {
  auto r = run(model(), 16, 16, {{1, frames(10)}, {2, frames(10)}});
  EXPECT_NE(r.error.find("num-frames=10 gives clips of 10 frames"), std::string::npos) << r.error;
  EXPECT_NE(r.error.find("use 9 or 13"), std::string::npos) << r.error;
  EXPECT_EQ(r.out.size(), 0u);
  EXPECT_EQ(r.dropped.size(), 0u) << "an error, not a vaeencoder-dropped per clip";
}

// With num-epochs=0 a source whose every clip was dropped looped forever; the error ends it.
TEST_F(VaeEncoderBadInput, UnusableNumFramesEndsAnEndlessSource) {
  vttest::TempDir d;
  ASSERT_TRUE(vttest::make_video(d.file("a.mp4"), {15, 48, 32, 10, 5}));
  vttest::write_file(d.file("m.csv"), "path,text\na.mp4,a clip\n");
  std::string err = vttest::run_pipeline("csvvideosrc location=" + d.file("m.csv") +
                                             " num-epochs=0 num-frames=10 width=16 height=16 ! vaeencoder " +
                                             model() + "! fakesink",
                                         60);
  EXPECT_NE(err.find("num-frames=10 gives clips of 10 frames"), std::string::npos) << err;
}

// A 2D TorchScript encoder without per-frame=true fails on the first clip, so on every clip:
// an element error that shows the model's own message, not the interpreter's first line.
TEST_F(VaeEncoderBadInput, TorchScriptEncoderFailingOnTheFirstClipIsAnError) {
  vttest::TempDir d;
  std::string py = d.file("make.py");
  vttest::write_file(py, R"(import sys, torch
class Image(torch.nn.Module):
    @torch.jit.export
    def encode(self, x):
        if x.dim() != 4:
            raise RuntimeError("image encoder wants [N, 3, H, W], got " + str(x.dim()) + " dims")
        return torch.nn.functional.avg_pool2d(x, 8)
    def forward(self, x):
        return self.encode(x)
torch.jit.script(Image()).save(sys.argv[1])
)");
  std::string cmd = vttest::env_or("PYTHON", "/usr/bin/python3") + " '" + py + "' '" + d.file("image.pt") + "'";
  ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
  std::vector<ClipIn> clips = {{1, frames(9)}, {2, frames(9)}};
  auto r = run("model=" + d.file("image.pt") + " device=cpu dtype=float32", 16, 16, clips);
  EXPECT_NE(r.error.find("image encoder wants [N, 3, H, W], got 5 dims"), std::string::npos) << r.error;
  EXPECT_NE(r.error.find("per-frame=true"), std::string::npos) << r.error;
  EXPECT_EQ(r.error.find("The following operation failed"), std::string::npos) << r.error;
  EXPECT_EQ(r.dropped.size(), 0u);
  r = run("model=" + d.file("image.pt") + " device=cpu dtype=float32 per-frame=true", 16, 16, clips);
  EXPECT_EQ(r.error, "");
  EXPECT_EQ(r.out.size(), 2u) << "the same model runs with per-frame=true";
}

TEST_F(VaeEncoderBadInput, ClearErrors) {
  // Frames without clip metas.
  auto r = run(model(), 16, 16, {{1, frames(5)}}, false);
  EXPECT_NE(r.error.find("clip meta"), std::string::npos) << r.error;
  // Frames the VAE cannot take (not a multiple of 8).
  r = run(model(), 20, 16, {{1, frames(5, 16, 20)}});
  EXPECT_NE(r.error.find("divisible"), std::string::npos) << r.error;
  // Not RGB.
  r = run(model(), 16, 16, {{1, frames(5)}}, true, "I420");
  EXPECT_NE(r.error, "");
  // A model that does not exist, a chunk size the VAE cannot use, an unsupported config.
  r = run("model=/nonexistent/vae", 16, 16, {{1, frames(5)}});
  EXPECT_NE(r.error.find("/nonexistent/vae"), std::string::npos) << r.error;
  r = run(model() + "chunk-frames=6", 16, 16, {{1, frames(5)}});
  EXPECT_NE(r.error.find("chunk-frames=6"), std::string::npos) << r.error;
  vttest::TempDir d;
  VaeConfig c = tiny_config();
  std::string err;
  ASSERT_TRUE(make_random_vae(d.file("v"), c, 1, "F32", &err));
  c.block_out_channels[3] = 30;
  vttest::write_file(d.file("v/config.json"), vae_config_to_json(c));
  r = run("model=" + d.file("v"), 16, 16, {{1, frames(5)}});
  EXPECT_NE(r.error.find("norm_num_groups"), std::string::npos) << r.error;
}

// Out of memory on a clip: a warning naming the clip, a retry with smaller tiles, a latent.
TEST_F(VaeEncoderBadInput, OutOfMemoryRetriesWithSmallerTiles) {
  setenv("VIDEOTRAIN_VAEENCODER_FAKE_OOM_PIXELS", "1024", 1);
  auto r = run(model() + "latent=mode", 64, 64, {{42, frames(9, 64, 64)}});
  unsetenv("VIDEOTRAIN_VAEENCODER_FAKE_OOM_PIXELS");
  ASSERT_EQ(r.error, "");
  ASSERT_EQ(r.out.size(), 1u);
  EXPECT_EQ(r.out[0].latent.sizes(), (c10::IntArrayRef{4, 3, 8, 8}));
  ASSERT_EQ(r.warnings.size(), 1u);
  EXPECT_NE(r.warnings[0].find("sample-id 42"), std::string::npos) << r.warnings[0];
  EXPECT_NE(r.warnings[0].find("64x64"), std::string::npos) << r.warnings[0];
  setenv("VIDEOTRAIN_VAEENCODER_FAKE_OOM_PIXELS", "100", 1);
  r = run(model() + "latent=mode", 64, 64, {{43, frames(9, 64, 64)}, {44, frames(1, 64, 64)}});
  unsetenv("VIDEOTRAIN_VAEENCODER_FAKE_OOM_PIXELS");
  EXPECT_NE(r.error.find("smallest tiles"), std::string::npos) << "an error only when the smallest tiles fail: "
                                                               << r.error;
  EXPECT_NE(r.error.find("sample-id 43"), std::string::npos) << r.error;
  EXPECT_EQ(r.out.size(), 0u);
}

TEST(VaeEncoderElement, PropertiesHaveDefaults) {
  GstElement *e = gst_element_factory_make("vaeencoder", nullptr);
  ASSERT_NE(e, nullptr);
  guint chunk = 0, tile = 1;
  gdouble ovh = 0;
  gint latent = -1;
  g_object_get(e, "chunk-frames", &chunk, "tile-height", &tile, "tile-overlap-height", &ovh, "latent", &latent,
               nullptr);
  EXPECT_EQ(chunk, 8u);
  EXPECT_EQ(tile, 0u);
  EXPECT_DOUBLE_EQ(ovh, 1.0 / 6);
  EXPECT_EQ(latent, 0);  // sample
  EXPECT_EQ(gst_element_set_state(e, GST_STATE_READY), GST_STATE_CHANGE_FAILURE) << "no model set";
  gst_element_set_state(e, GST_STATE_NULL);
  gst_object_unref(e);
}
