// vaedecoder in pipelines: csvvideosrc ! vaeencoder ! vaedecoder gives the clip's frame count and
// size as RGB frames with clip metas, equal to the engine's decode of vaeencoder's latent; latents of
// another VAE are an element error naming the channel counts; the element is registered.
#include <gst/app/gstappsink.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>

#include "metas.h"
#include "test_util.h"
#include "vaedecoder/decode_engine.h"

using namespace videotrain;

namespace {

struct Pulled {
  std::vector<GstBuffer *> buffers;
  GstCaps *caps = nullptr;
  std::string error;
  ~Pulled() {
    for (GstBuffer *b : buffers) gst_buffer_unref(b);
    if (caps) gst_caps_unref(caps);
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
      if (!out->caps && gst_sample_get_caps(s)) out->caps = gst_caps_copy(gst_sample_get_caps(s));
      gst_sample_unref(s);
      continue;
    }
    // An error upstream ends the stream with EOS too: look at the bus before ending on EOS.
    const bool eos = gst_app_sink_is_eos(GST_APP_SINK(sink));
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
    if (eos) break;
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

std::string vae_dir(const std::string &rel) { return vttest::reference_dir() + "/" + rel; }

// A one-clip manifest of a 48x32 test video, and the source part of a pipeline reading 9 frames of it.
std::string source(const vttest::TempDir &d) {
  vttest::VideoSpec spec;
  spec.width = 48;
  spec.height = 32;
  spec.frames = 12;
  spec.pattern = "ball";
  EXPECT_TRUE(vttest::make_video(d.file("clip.mp4"), spec));
  vttest::write_file(d.file("m.csv"), "path,text\n" + d.file("clip.mp4") + ",a ball\n");
  return "csvvideosrc location=" + d.file("m.csv") +
         " num-frames=9 clip-start=start width=48 height=32 num-epochs=1 shuffle=false ! ";
}

class DecoderElement : public ::testing::TestWithParam<const char *> {};

}  // namespace

TEST_P(DecoderElement, EncodeThenDecodeGivesTheClipsFramesAsTheEngineDecodesThem) {
  const std::string model = vae_dir(GetParam());
  vttest::TempDir d;
  const std::string src = source(d);
  const std::string enc = "vaeencoder model=" + model + " device=cpu dtype=float32 latent=mode ! ";
  Pulled latents;
  pull(src + enc + "appsink name=sink sync=false", &latents);
  ASSERT_EQ(latents.error, "");
  ASSERT_EQ(latents.buffers.size(), 1u);

  Pulled frames;
  pull(src + enc + "vaedecoder model=" + model +
           " framerate=8/1 device=cpu dtype=float32 ! appsink name=sink sync=false",
       &frames);
  ASSERT_EQ(frames.error, "");
  ASSERT_EQ(frames.buffers.size(), 9u);
  ASSERT_NE(frames.caps, nullptr);
  GstStructure *st = gst_caps_get_structure(frames.caps, 0);
  int w = 0, h = 0, n = 0, dd = 0;
  EXPECT_STREQ(gst_structure_get_string(st, "format"), "RGB");
  EXPECT_TRUE(gst_structure_get_int(st, "width", &w) && gst_structure_get_int(st, "height", &h));
  EXPECT_EQ(w, 48);
  EXPECT_EQ(h, 32);
  EXPECT_TRUE(gst_structure_get_fraction(st, "framerate", &n, &dd));
  EXPECT_EQ(n, 8);
  EXPECT_EQ(dd, 1);

  // The same frames the engine decodes from vaeencoder's latent, in order, with clip metas.
  vae::DecodeOptions o;
  o.model = model;
  o.device = "cpu";
  o.dtype = "float32";
  std::string why;
  auto eng = vae::DecodeEngine::create(o, &why);
  ASSERT_NE(eng, nullptr) << why;
  std::vector<GstBuffer *> want;
  ASSERT_TRUE(eng->decode(
      latents.buffers[0], [&](GstBuffer *b, int, int) { return want.push_back(b), true; }, &why))
      << why;
  ASSERT_EQ(want.size(), 9u);
  bool varied = false;
  for (size_t i = 0; i < want.size(); i++) {
    GstMapInfo a, b;
    ASSERT_TRUE(gst_buffer_map(frames.buffers[i], &a, GST_MAP_READ));
    ASSERT_TRUE(gst_buffer_map(want[i], &b, GST_MAP_READ));
    ASSERT_EQ(a.size, 48u * 32u * 3u);
    ASSERT_EQ(a.size, b.size);
    EXPECT_EQ(memcmp(a.data, b.data, a.size), 0) << "frame " << i;
    for (size_t k = 1; k < a.size; k++) varied |= a.data[k] != a.data[0];
    gst_buffer_unmap(frames.buffers[i], &a);
    gst_buffer_unmap(want[i], &b);
    gst_buffer_unref(want[i]);
    auto *cm = gst_buffer_get_videotrain_clip_meta(frames.buffers[i]);
    ASSERT_NE(cm, nullptr);
    EXPECT_EQ(cm->frame_index, i);
    EXPECT_EQ(cm->num_frames, 9u);
    EXPECT_STREQ(cm->caption, "a ball");
    EXPECT_EQ(GST_BUFFER_PTS(frames.buffers[i]), i * GST_SECOND / 8);
  }
  EXPECT_TRUE(varied) << "decoded frames are flat";

  // Out of memory after the first frame of a whole-frame decode: the engine goes on in 24x24 tiles
  // (half the 48-pixel frame) from the second frame, as a decode in those tiles gives it, and says so.
  auto frames_of = [&](const vae::DecodeOptions &opts, std::string *note) {
    std::vector<std::string> out;
    std::string w;
    auto e = vae::DecodeEngine::create(opts, &w);
    EXPECT_NE(e, nullptr) << w;
    if (!e) return out;
    const bool ok = e->decode(
        latents.buffers[0],
        [&](GstBuffer *b, int, int) {
          GstMapInfo m;
          gst_buffer_map(b, &m, GST_MAP_READ);
          out.emplace_back(reinterpret_cast<const char *>(m.data), m.size);
          gst_buffer_unmap(b, &m);
          gst_buffer_unref(b);
          return true;
        },
        &w, note);
    EXPECT_TRUE(ok) << w;
    if (!ok && note) *note = w;
    return out;
  };
  vae::DecodeOptions oom = o, tiled = o;
  oom.fake_oom_pixels = 48 * 32 - 1;
  std::string note;
  if (eng->spatial_compression() == 8) {
    tiled.tile_height = tiled.tile_width = 24;
    const auto whole = frames_of(o, nullptr), retried = frames_of(oom, &note), in_tiles = frames_of(tiled, nullptr);
    ASSERT_EQ(retried.size(), 9u) << note;
    ASSERT_EQ(in_tiles.size(), 9u);
    EXPECT_EQ(retried[0], whole[0]);
    for (size_t i = 1; i < 9; i++) EXPECT_EQ(retried[i], in_tiles[i]) << "frame " << i;
    EXPECT_NE(note.find("ran out of memory in whole frames after 1 frame(s); the rest decoded in 24x24 tiles"),
              std::string::npos)
        << note;
    oom.fake_oom_pixels = 1;
  }
  // Nothing smaller left (Wan 2.2's 16-pixel latent has no tile of two latent pixels under 48x32): one
  // line naming the sizes, no C++ backtrace, the frames given before kept.
  auto e = vae::DecodeEngine::create(oom, &why);
  ASSERT_NE(e, nullptr) << why;
  size_t given = 0;
  EXPECT_FALSE(e->decode(
      latents.buffers[0], [&](GstBuffer *b, int, int) { return gst_buffer_unref(b), ++given, true; }, &why));
  const bool s8 = eng->spatial_compression() == 8;
  EXPECT_NE(why.find(s8 ? "decoding a 48x32 clip ran out of memory in whole frames after 1 frame(s), in 24x24 tiles "
                          "after 2 frame(s)"
                        : "decoding a 48x32 clip ran out of memory in whole frames after 1 frame(s) ("),
            std::string::npos)
      << why;
  EXPECT_EQ(why.find('\n'), std::string::npos) << why;
  EXPECT_EQ(given, s8 ? 2u : 1u);

  // vaeencoder's moments with moments=true: the posterior mean decoded as it is, the same frames as the
  // normalised mode latent (rounding of the normalisation aside).
  Pulled from_moments;
  pull(src + "vaeencoder model=" + model + " device=cpu dtype=float32 latent=moments ! vaedecoder model=" + model +
           " moments=true device=cpu dtype=float32 ! appsink name=sink sync=false",
       &from_moments);
  ASSERT_EQ(from_moments.error, "");
  ASSERT_EQ(from_moments.buffers.size(), 9u);
  int worst = 0;
  for (size_t i = 0; i < 9; i++) {
    GstMapInfo a, b;
    ASSERT_TRUE(gst_buffer_map(frames.buffers[i], &a, GST_MAP_READ));
    ASSERT_TRUE(gst_buffer_map(from_moments.buffers[i], &b, GST_MAP_READ));
    for (size_t k = 0; k < a.size && k < b.size; k++)
      worst = std::max(worst, std::abs(int(a.data[k]) - int(b.data[k])));
    gst_buffer_unmap(frames.buffers[i], &a);
    gst_buffer_unmap(from_moments.buffers[i], &b);
  }
  EXPECT_LE(worst, 1);
}

INSTANTIATE_TEST_SUITE_P(Vaes, DecoderElement,
                         ::testing::Values("cogvideox_vae/tiny_a", "wan_vae/tiny_wan21", "wan_vae/tiny_wan22"));

TEST(DecoderElementErrors, AnotherVaesLatentsNameTheChannels) {
  vttest::TempDir d;
  Pulled frames;
  pull(source(d) + "vaeencoder model=" + vae_dir("cogvideox_vae/tiny_a") +
           " device=cpu latent=mode ! vaedecoder model=" + vae_dir("wan_vae/tiny_wan22") +
           " device=cpu ! appsink name=sink sync=false",
       &frames);
  EXPECT_NE(frames.error.find("have 4 channels"), std::string::npos) << frames.error;
  EXPECT_NE(frames.error.find("Wan 2.2 VAE"), std::string::npos) << frames.error;
  EXPECT_NE(frames.error.find("takes 8"), std::string::npos) << frames.error;
  EXPECT_TRUE(frames.buffers.empty());
}

TEST(DecoderElementErrors, BadSettingsFailAtStartNamingThem) {
  for (const std::string &props :
       {std::string("model=/nonexistent"), "model=" + vae_dir("wan_vae/tiny_wan21") + " tile-height=20 tile-width=24",
        "model=" + vae_dir("wan_vae/tiny_wan21") + " device=cuda:99"}) {
    GstElement *e = gst_parse_launch(("vaedecoder name=d " + props + " ! fakesink").c_str(), nullptr);
    ASSERT_NE(e, nullptr);
    EXPECT_EQ(gst_element_set_state(e, GST_STATE_READY), GST_STATE_CHANGE_FAILURE) << props;
    gst_element_set_state(e, GST_STATE_NULL);
    gst_object_unref(e);
  }
}

// device and dtype through common/device_dtype.h: "" picks the device's dtype, a bad name is refused naming it.
TEST(DecoderElementErrors, DeviceAndDtypeResolveOnce) {
  vae::DecodeOptions o;
  o.model = vae_dir("wan_vae/tiny_wan21");
  std::string why;
  auto eng = vae::DecodeEngine::create(o, &why);
  ASSERT_NE(eng, nullptr) << why;
  const bool cuda = eng->device_name().rfind("cuda", 0) == 0;
  EXPECT_EQ(eng->dtype_name(), cuda ? "bfloat16" : "float32") << eng->device_name();
  o.device = "cpu";
  o.dtype = "float16";
  eng = vae::DecodeEngine::create(o, &why);
  ASSERT_NE(eng, nullptr) << why;
  EXPECT_EQ(eng->device_name(), "cpu");
  EXPECT_EQ(eng->dtype_name(), "float16");
  o.dtype = "float64";
  EXPECT_EQ(vae::DecodeEngine::create(o, &why), nullptr);
  EXPECT_NE(why.find("dtype 'float64' is not float32, bfloat16 or float16"), std::string::npos) << why;
  o.dtype = "";
  o.device = "tpu";
  EXPECT_EQ(vae::DecodeEngine::create(o, &why), nullptr);
  EXPECT_NE(why.find("device 'tpu' is not a device name"), std::string::npos) << why;
}

TEST(DecoderElementErrors, Registered) {
  GstElementFactory *f = gst_element_factory_find("vaedecoder");
  ASSERT_NE(f, nullptr);
  EXPECT_STREQ(gst_element_factory_get_klass(f), "Filter/Decoder/Video");
  GstElement *e = gst_element_factory_create(f, nullptr);
  for (const char *p : {"model", "moments", "tune-malloc", "framerate", "tile-height", "tile-width",
                        "tile-stride-height", "tile-stride-width", "device", "dtype", "clips-decoded"})
    EXPECT_NE(g_object_class_find_property(G_OBJECT_GET_CLASS(e), p), nullptr) << p;
  gst_object_unref(e);
  gst_object_unref(f);
}
