// vaeencoder with Wan 2.1/2.2 folders in pipelines: csvvideosrc reading a lossless video made of
// the reference input frames (FFV1 in Matroska, written by ffmpeg) gives those exact frames, and
// vaeencoder's latents equal the engine's on them; a foreign VAE class and unusable clip lengths
// are element errors naming them. imageencoder after vaeencoder condition=: image_embeds of the
// clip's given frames in place of condition_frames, the same from both caches; its errors.
#include <ATen/ATen.h>
#include <gst/app/gstappsink.h>
#include <gtest/gtest.h>

#include <chrono>
#include <cstdlib>
#include <fstream>
#include <nlohmann/json.hpp>

#include "metas.h"
#include "models/clip_image_processor.h"
#include "models/clip_vision.h"
#include "tensor_buffer.h"
#include "tensor_caps.h"
#include "vae_test_util.h"

using namespace videotrain;
using namespace videotrain::vae;
using vaetest::rel_l2;
using vaetest::wan_dir;

namespace {

struct Pulled {
  std::vector<GstBuffer *> buffers;
  std::string error;
  std::string tensors;  // the last sample's caps field
  GstStructure *summary = nullptr;  // imageencoder-summary, when posted
  ~Pulled() {
    for (GstBuffer *b : buffers) gst_buffer_unref(b);
    if (summary) gst_structure_free(summary);
  }
};

// Every buffer the appsink named "sink" gets, to EOS (or the first error).
void pull(const std::string &desc, Pulled *out) {
  GError *err = nullptr;
  GstElement *pipe = gst_parse_launch(desc.c_str(), &err);
  if (!pipe) {
    out->error = err ? err->message : "parse failed";
    g_clear_error(&err);
    return;
  }
  GstElement *sink = gst_bin_get_by_name(GST_BIN(pipe), "sink");
  GstBus *bus = gst_element_get_bus(pipe);
  gst_element_set_state(pipe, GST_STATE_PLAYING);
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(120);
  for (;;) {
    if (GstSample *s = gst_app_sink_try_pull_sample(GST_APP_SINK(sink), GST_SECOND / 10)) {
      out->buffers.push_back(gst_buffer_ref(gst_sample_get_buffer(s)));
      const char *t = gst_structure_get_string(gst_caps_get_structure(gst_sample_get_caps(s), 0), "tensors");
      out->tensors = t ? t : "";
      gst_sample_unref(s);
      continue;
    }
    if (gst_app_sink_is_eos(GST_APP_SINK(sink))) {
      while (GstMessage *m = gst_bus_pop_filtered(bus, GST_MESSAGE_ELEMENT)) {
        const GstStructure *st = gst_message_get_structure(m);
        if (st && gst_structure_has_name(st, "imageencoder-summary")) out->summary = gst_structure_copy(st);
        gst_message_unref(m);
      }
      break;
    }
    if (GstMessage *m = gst_bus_pop_filtered(bus, GST_MESSAGE_ERROR)) {
      GError *e = nullptr;
      gchar *dbg = nullptr;
      gst_message_parse_error(m, &e, &dbg);
      out->error = std::string(e->message) + " (" + (dbg ? dbg : "") + ")";
      g_clear_error(&e);
      g_free(dbg);
      gst_message_unref(m);
      break;
    }
    if (std::chrono::steady_clock::now() > deadline) {
      out->error = "timeout";
      break;
    }
  }
  gst_element_set_state(pipe, GST_STATE_NULL);
  gst_object_unref(bus);
  gst_object_unref(sink);
  gst_object_unref(pipe);
}

// A lossless video of uint8 frames [T, H, W, 3] and a one-row manifest naming it.
std::string lossless_manifest(const vttest::TempDir &d, const at::Tensor &u8) {
  const int H = u8.size(1), W = u8.size(2);
  at::Tensor c = u8.contiguous();
  vttest::write_file(d.file("frames.rgb"), std::string(static_cast<const char *>(c.data_ptr()), c.numel()));
  std::string cmd = "ffmpeg -loglevel error -y -f rawvideo -pix_fmt rgb24 -s " + std::to_string(W) + "x" +
                    std::to_string(H) + " -r 8 -i " + d.file("frames.rgb") + " -c:v ffv1 -pix_fmt bgr0 " +
                    d.file("clip.mkv");
  EXPECT_EQ(std::system(cmd.c_str()), 0) << cmd;
  vttest::write_file(d.file("m.csv"), "path,text\n" + d.file("clip.mkv") + ",reference frames\n");
  return d.file("m.csv");
}

std::string source(const std::string &manifest, int T, int W, int H) {
  return "csvvideosrc location=" + manifest + " num-frames=" + std::to_string(T) + " clip-start=start width=" +
         std::to_string(W) + " height=" + std::to_string(H) + " num-epochs=1 shuffle=false ! ";
}

// The engine's latent for uint8 frames pushed one by one.
at::Tensor engine_latent(const EngineOptions &o, const at::Tensor &u8, uint64_t sample_id) {
  auto e = vaetest::make_engine(o);
  if (!e) return at::Tensor();
  std::string why;
  const int T = u8.size(0), H = u8.size(1), W = u8.size(2);
  EXPECT_TRUE(e->begin_clip(sample_id, T, W, H, &why)) << why;
  for (int t = 0; t < T; t++) {
    at::Tensor f = u8[t].contiguous();
    EXPECT_TRUE(e->push_frame(f.data_ptr<uint8_t>(), W * 3, &why)) << why;
  }
  GstBuffer *buf = e->finish_clip(&why);
  EXPECT_NE(buf, nullptr) << why;
  if (!buf) return at::Tensor();
  auto t = tensor_from_buffer(buf, &why);
  gst_buffer_unref(buf);
  return t ? t->clone() : at::Tensor();
}

class WanElement : public ::testing::TestWithParam<const char *> {};

}  // namespace

TEST_P(WanElement, CsvVideoSrcFromALosslessVideoMatchesTheEngine) {
  const std::string name = GetParam();
  vaetest::WanCases cases(name);
  ASSERT_TRUE(cases.ok());
  const std::vector<int> tile = cases.ints("tile");
  at::Tensor u8 = vaetest::quantize(cases.get("input.T13"));
  const int T = u8.size(0), H = u8.size(1), W = u8.size(2);
  vttest::TempDir d;
  const std::string manifest = lossless_manifest(d, u8);

  // The source gives back the exact frames.
  {
    Pulled frames;
    pull(source(manifest, T, W, H) + "appsink name=sink sync=false", &frames);
    ASSERT_EQ(frames.error, "");
    ASSERT_EQ(frames.buffers.size(), static_cast<size_t>(T));
    for (int t = 0; t < T; t++) {
      at::Tensor want = u8[t].contiguous();
      ASSERT_EQ(gst_buffer_get_size(frames.buffers[t]), static_cast<gsize>(want.numel()));
      std::vector<uint8_t> got(want.numel());
      gst_buffer_extract(frames.buffers[t], 0, got.data(), got.size());
      ASSERT_EQ(memcmp(got.data(), want.data_ptr(), got.size()), 0) << "frame " << t << " is not the one written";
    }
  }

  struct Case {
    LatentKind kind;
    bool tiled;
  };
  for (Case c : {Case{LatentKind::Moments, false}, Case{LatentKind::Moments, true}, Case{LatentKind::Mode, false},
                 Case{LatentKind::Sample, false}, Case{LatentKind::Sample, true}}) {
    EngineOptions o;
    o.model = wan_dir(name);
    o.device = "cpu";
    o.dtype = "float32";
    o.latent = c.kind;
    o.seed = 5;
    std::string props = std::string(" latent=") + latent_kind_name(c.kind) + " seed=5";
    if (c.tiled) {
      o.tile_height = tile[0];
      o.tile_width = tile[1];
      o.tile_overlap_height = 1 - static_cast<double>(tile[2]) / tile[0];
      o.tile_overlap_width = 1 - static_cast<double>(tile[3]) / tile[1];
      props += " tile-height=" + std::to_string(o.tile_height) + " tile-width=" + std::to_string(o.tile_width) +
               " tile-overlap-height=" + std::to_string(o.tile_overlap_height) +
               " tile-overlap-width=" + std::to_string(o.tile_overlap_width);
    }
    Pulled latents;
    pull(source(manifest, T, W, H) + "vaeencoder model=" + o.model + " device=cpu dtype=float32" + props +
             " ! appsink name=sink sync=false",
         &latents);
    ASSERT_EQ(latents.error, "") << props;
    ASSERT_EQ(latents.buffers.size(), 1u) << props;
    auto *sm = gst_buffer_get_videotrain_sample_meta(latents.buffers[0]);
    ASSERT_NE(sm, nullptr);
    std::string why;
    auto got = tensor_from_buffer(latents.buffers[0], &why);
    ASSERT_TRUE(got.has_value()) << why;
    at::Tensor want = engine_latent(o, u8, sm->sample_id);
    ASSERT_TRUE(want.defined());
    EXPECT_EQ(got->sizes(), want.sizes()) << props;
    EXPECT_LT(rel_l2(*got, want), 1e-6) << name << props;
    if (c.kind == LatentKind::Moments && !c.tiled) {  // and, quantisation aside, diffusers' moments
      EXPECT_LT(rel_l2(*got, cases.get("moments.T13")[0]), 2e-2) << name;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Wan, WanElement, ::testing::Values("tiny_wan21", "tiny_wan22"));

TEST(WanElement, AMadeTinyWan21VaeLoadsAndEncodesAClip) {
  // videotrain-make-vae --family wan21 --tiny: a Wan folder without downloads (demos, tests).
  vttest::TempDir d;
  const std::string tool = vttest::env_or("VIDEOTRAIN_BUILD_DIR", "build") + "/tools/videotrain-make-vae";
  ASSERT_EQ(std::system((tool + " " + d.file("wan") + " --family wan21 --tiny --seed 7 >/dev/null").c_str()), 0);
  std::ifstream in(d.file("wan") + "/config.json");
  const nlohmann::json j = nlohmann::json::parse(in);
  EXPECT_EQ(j.at("_class_name"), "AutoencoderKLWan");
  EXPECT_EQ(j.at("z_dim"), 4);
  at::Tensor u8 = at::randint(0, 256, {5, 32, 48, 3}, at::TensorOptions().dtype(at::kByte));
  const std::string manifest = lossless_manifest(d, u8);
  Pulled latents;
  pull(source(manifest, 5, 48, 32) + "vaeencoder model=" + d.file("wan") +
           " device=cpu dtype=float32 latent=mode ! appsink name=sink sync=false",
       &latents);
  ASSERT_EQ(latents.error, "");
  ASSERT_EQ(latents.buffers.size(), 1u);
  std::string why;
  auto got = tensor_from_buffer(latents.buffers[0], &why);
  ASSERT_TRUE(got.has_value()) << why;
  // 4 latent channels, (5 - 1) / 4 + 1 frames, 8x smaller.
  EXPECT_EQ(got->sizes(), (std::vector<int64_t>{4, 2, 4, 6}));
  EXPECT_TRUE(got->isfinite().all().item<bool>());
  EXPECT_GT(got->std().item<double>(), 0);
  // Seeded: the same seed makes the same weights.
  vttest::TempDir d2;
  ASSERT_EQ(std::system((tool + " " + d2.file("wan") + " --family wan21 --tiny --seed 7 >/dev/null").c_str()), 0);
  EXPECT_EQ(vttest::read_file(d.file("wan") + "/diffusion_pytorch_model.safetensors"),
            vttest::read_file(d2.file("wan") + "/diffusion_pytorch_model.safetensors"));
}

TEST(WanElementErrors, AForeignVaeClassIsAnElementErrorNamingIt) {
  vttest::TempDir d;
  std::ifstream in(wan_dir("tiny_wan21") + "/config.json");
  nlohmann::json j = nlohmann::json::parse(in);
  j["_class_name"] = "AutoencoderKLMochi";
  vttest::write_file(d.file("config.json"), j.dump());
  vttest::write_file(d.file("diffusion_pytorch_model.safetensors"),
                     vttest::read_file(wan_dir("tiny_wan21") + "/diffusion_pytorch_model.safetensors"));
  std::string err = vttest::run_pipeline(
      "videotestsrc num-buffers=1 ! video/x-raw,format=RGB,width=96,height=64 ! vaeencoder model=" + d.path() +
      " device=cpu ! fakesink");
  EXPECT_NE(err.find("'AutoencoderKLMochi'"), std::string::npos) << err;
  EXPECT_NE(err.find("AutoencoderKLWan"), std::string::npos) << err;
}

TEST(WanElementErrors, AClipLengthTheWanVaeCannotUseIsAnErrorNamingNumFrames) {
  vaetest::WanCases cases("tiny_wan22");
  ASSERT_TRUE(cases.ok());
  vttest::TempDir d;
  const std::string manifest = lossless_manifest(d, vaetest::quantize(cases.get("input.T13")));
  std::string err = vttest::run_pipeline(source(manifest, 6, 96, 64) + "vaeencoder model=" + wan_dir("tiny_wan22") +
                                         " device=cpu ! fakesink");
  EXPECT_NE(err.find("num-frames=6"), std::string::npos) << err;
  EXPECT_NE(err.find("1 + 4n"), std::string::npos) << err;
}

namespace {

at::Tensor named(GstBuffer *b, const char *name) {
  std::string why;
  auto t = named_tensor_from_buffer(b, name, &why);
  EXPECT_TRUE(t.has_value()) << name << ": " << why;
  return t ? t->clone() : at::Tensor();
}

guint64 summary_field(const Pulled &p, const char *field) {
  guint64 v = G_MAXUINT64;
  EXPECT_NE(p.summary, nullptr);
  if (p.summary) gst_structure_get_uint64(p.summary, field, &v);
  return v;
}

}  // namespace

TEST(WanElementImageEncoder, ImageEmbedsOfTheConditionFramesReplaceThemAndComeBackFromTheCaches) {
  at::manual_seed(3);
  const at::Tensor u8 = at::randint(0, 256, {5, 32, 48, 3}, at::TensorOptions().dtype(at::kByte));
  vttest::TempDir d;
  const std::string manifest = lossless_manifest(d, u8), cache = d.file("cache");
  const std::string clip = vttest::reference_dir() + "/clip_vision/vit_tiny";
  const std::string vae = source(manifest, 5, 48, 32) + "vaeencoder model=" + wan_dir("tiny_wan21") +
                          " device=cpu dtype=float32 latent=mode condition=first-last-frame cache-dir=" + cache + " ! ";
  // vaeencoder alone: the first and last frames as decoded, beside the condition.
  Pulled plain;
  pull(vae + "appsink name=sink sync=false", &plain);
  ASSERT_EQ(plain.error, "");
  ASSERT_EQ(plain.buffers.size(), 1u);
  EXPECT_EQ(plain.tensors, "condition,condition_frames");
  EXPECT_TRUE(at::equal(named(plain.buffers[0], "condition_frames"), at::stack({u8[0], u8[4]})));
  const at::Tensor condition = named(plain.buffers[0], "condition");
  // The encoder and processor run directly on those frames (hidden_states[-2]).
  const auto processor = videotrain::models::ClipImageProcessor::open(vttest::reference_dir() + "/clip_vision/image_processor");
  auto enc = videotrain::models::ClipVisionEncoder::open(clip, at::kCPU, at::kFloat);
  const at::Tensor want = enc->penultimate_hidden_states(at::stack({processor.process(u8[0]), processor.process(u8[4])}));
  // Then with imageencoder (vaeencoder now from its cache: the frames were cached too), twice: the
  // second run's embeddings come from imageencoder's cache-dir.
  for (int run = 0; run < 2; run++) {
    SCOPED_TRACE(run);
    Pulled p;
    pull(vae + "imageencoder model=" + clip + " device=cpu cache-dir=" + cache + " ! appsink name=sink sync=false", &p);
    ASSERT_EQ(p.error, "");
    ASSERT_EQ(p.buffers.size(), 1u);
    EXPECT_EQ(p.tensors, "condition,image_embeds");
    EXPECT_EQ(tensor_names(p.buffers[0]), (std::vector<std::string>{"condition", "image_embeds"}));
    const at::Tensor got = named(p.buffers[0], "image_embeds");
    ASSERT_EQ(got.sizes().vec(), (std::vector<int64_t>{2, 17, 32}));  // [n, tokens, dim] of vit_tiny
    EXPECT_TRUE(at::equal(got, want));
    EXPECT_TRUE(at::equal(named(p.buffers[0], "condition"), condition));
    EXPECT_NE(gst_buffer_get_videotrain_sample_meta(p.buffers[0]), nullptr);
    EXPECT_EQ(summary_field(p, "encoded"), run == 0 ? 1u : 0u);
    EXPECT_EQ(summary_field(p, "cache-reads"), run == 0 ? 0u : 1u);
  }
}

TEST(WanElementImageEncoder, NoConditionFramesOrABadFolderIsAnElementErrorNamingTheFix) {
  at::manual_seed(4);
  const at::Tensor u8 = at::randint(0, 256, {1, 32, 48, 3}, at::TensorOptions().dtype(at::kByte));
  vttest::TempDir d;
  const std::string manifest = lossless_manifest(d, u8);
  const std::string clip = vttest::reference_dir() + "/clip_vision/vit_tiny";
  const std::string vae = source(manifest, 1, 48, 32) + "vaeencoder model=" + wan_dir("tiny_wan21") + " device=cpu";
  std::string err = vttest::run_pipeline(vae + " ! imageencoder model=" + clip + " ! fakesink");
  EXPECT_NE(err.find("condition_frames"), std::string::npos) << err;
  EXPECT_NE(err.find("condition=first-frame"), std::string::npos) << err;
  err = vttest::run_pipeline(vae + " condition=first-frame ! imageencoder model=" + d.file("nowhere") + " ! fakesink");
  EXPECT_NE(err.find(d.file("nowhere")), std::string::npos) << err;
  EXPECT_NE(err.find("model"), std::string::npos) << err;
}

// imageencoder's removal of condition_frames (buffer_remove_tensor): the other tensors stay readable,
// whether each tensor has its memory (as the elements make them) or a copy merged them into one.
TEST(WanElementImageEncoder, RemovingATensorKeepsTheOthers) {
  const at::Tensor main = at::arange(24, at::kFloat).view({2, 3, 4}), a = at::arange(5, at::kFloat) + 100;
  const at::Tensor frames = at::randint(0, 256, {1, 2, 3, 3}, at::TensorOptions().dtype(at::kByte));
  const at::Tensor b = at::arange(6, at::kFloat).view({2, 3}) - 50;
  for (bool merged : {false, true}) {
    SCOPED_TRACE(merged);
    GstBuffer *buf = buffer_from_tensor(main);
    buffer_append_tensor(buf, "condition", a);
    buffer_append_tensor(buf, "condition_frames", frames);
    buffer_append_tensor(buf, "text_embeds", b);
    if (merged) {  // one system memory holding every tensor's bytes
      GstMapInfo m;
      ASSERT_TRUE(gst_buffer_map(buf, &m, GST_MAP_READ));
      GstMemory *one = gst_allocator_alloc(nullptr, m.size, nullptr);
      GstMapInfo w;
      ASSERT_TRUE(gst_memory_map(one, &w, GST_MAP_WRITE));
      memcpy(w.data, m.data, m.size);
      gst_memory_unmap(one, &w);
      gst_buffer_unmap(buf, &m);
      gst_buffer_replace_all_memory(buf, one);
    }
    EXPECT_TRUE(at::equal(named(buf, "condition_frames"), frames));
    EXPECT_TRUE(buffer_remove_tensor(buf, "condition_frames"));
    EXPECT_FALSE(buffer_remove_tensor(buf, "condition_frames"));
    EXPECT_FALSE(buffer_remove_tensor(buf, ""));
    EXPECT_EQ(tensor_names(buf), (std::vector<std::string>{"condition", "text_embeds"}));
    EXPECT_EQ(gst_buffer_get_size(buf), gsize((24 + 5 + 6) * 4));
    std::string why;
    auto got = tensor_from_buffer(buf, &why);
    ASSERT_TRUE(got) << why;
    EXPECT_TRUE(at::equal(*got, main));
    EXPECT_TRUE(at::equal(named(buf, "condition"), a));
    EXPECT_TRUE(at::equal(named(buf, "text_embeds"), b));
    gst_buffer_unref(buf);
  }
}
