// Frame sizes that change between clips (csvvideosrc buckets): appsrc sends new caps before
// the first frame of a clip of another size, through one vaeencoder and on to microbatcher and
// ddptrainsink (and textencoder). Every latent must equal the one the same clip gets in a stream of its own size,
// nothing is dropped, every micro-batch holds one shape, and every step trains.
#include <ATen/ATen.h>
#include <gst/app/gstappsrc.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <map>
#include <mutex>
#include <set>

#include "metas.h"
#include "tensor_buffer.h"
#include "tensor_caps.h"
#include "test_util.h"

using namespace videotrain;

namespace {

constexpr GstClockTime kFrame = GST_SECOND / 8;
constexpr int kFrames = 5;

struct Clip {
  uint64_t sample = 0;
  int width = 32, height = 32;
  at::Tensor u8;  // [T, H, W, 3]
  int resize_after = -1;  // send caps of another size after this many frames (a broken upstream)
};

struct Latent {
  uint64_t sample = 0;
  at::Tensor tensor;
};

struct MicroBatchSeen {
  std::vector<int64_t> shape;
  uint64_t step = 0;
  std::vector<uint64_t> samples;
};

struct Recorded {
  std::mutex lock;
  std::vector<Latent> latents;
  std::vector<MicroBatchSeen> batches;
  std::vector<std::string> dropped, errors;
  std::vector<double> losses;
  guint64 steps = 0, clips_dropped = 0;
};

Clip make_clip(uint64_t sample, int w, int h) {
  Clip c;
  c.sample = sample;
  c.width = w;
  c.height = h;
  auto g = at::detail::createCPUGenerator(1000 + sample);
  c.u8 = at::randint(0, 256, {kFrames, h, w, 3}, g, at::kByte);
  return c;
}

GstCaps *frame_caps(int w, int h, int fps) {
  return gst_caps_new_simple("video/x-raw", "format", G_TYPE_STRING, "RGB", "width", G_TYPE_INT, w, "height",
                             G_TYPE_INT, h, "framerate", GST_TYPE_FRACTION, fps, 1, nullptr);
}

GstPadProbeReturn on_latent(GstPad *, GstPadProbeInfo *info, gpointer data) {
  auto *run = static_cast<Recorded *>(data);
  GstBuffer *b = GST_PAD_PROBE_INFO_BUFFER(info);
  std::string why;
  auto t = tensor_from_buffer(b, &why);
  auto *m = gst_buffer_get_videotrain_sample_meta(b);
  std::lock_guard<std::mutex> g(run->lock);
  if (!t || !m) {
    run->errors.push_back("latent without tensor or sample meta: " + why);
    return GST_PAD_PROBE_OK;
  }
  run->latents.push_back({m->sample_id, t->to(at::kFloat).clone()});
  return GST_PAD_PROBE_OK;
}

GstPadProbeReturn on_micro_batch(GstPad *, GstPadProbeInfo *info, gpointer data) {
  auto *run = static_cast<Recorded *>(data);
  GstBuffer *b = GST_PAD_PROBE_INFO_BUFFER(info);
  auto *bm = gst_buffer_get_videotrain_batch_meta(b);
  auto *tm = gst_buffer_get_videotrain_tensor_meta(b);
  std::lock_guard<std::mutex> g(run->lock);
  if (!bm || !tm) {
    run->errors.push_back("micro-batch without batch or tensor meta");
    return GST_PAD_PROBE_OK;
  }
  MicroBatchSeen s;
  s.shape = tensor_meta_shape(tm);
  s.step = bm->step;
  for (guint i = 0; i < bm->sample_ids->len; i++) s.samples.push_back(g_array_index(bm->sample_ids, guint64, i));
  run->batches.push_back(s);
  return GST_PAD_PROBE_OK;
}

void add_probe(GstElement *pipe, const char *name, GstPadProbeCallback cb, Recorded *run) {
  GstElement *e = gst_bin_get_by_name(GST_BIN(pipe), name);
  if (!e) return;
  GstPad *pad = gst_element_get_static_pad(e, "src");
  gst_pad_add_probe(pad, GST_PAD_PROBE_TYPE_BUFFER, cb, run, nullptr);
  gst_object_unref(pad);
  gst_object_unref(e);
}

// appsrc ! vaeencoder name=enc latent=mode ! TAIL, the clips in order; a clip whose size
// differs from the one before gets new caps before its first frame.
void run_clips(const std::string &vae, const std::vector<Clip> &clips, const std::string &tail, Recorded *run,
               int mid_clip_recaps = -1) {
  std::string desc = "appsrc name=src format=time ! vaeencoder name=enc model=" + vae + " latent=mode ! " + tail;
  GError *err = nullptr;
  GstElement *pipe = gst_parse_launch(desc.c_str(), &err);
  ASSERT_NE(pipe, nullptr) << (err ? err->message : "parse failed");
  add_probe(pipe, "enc", on_latent, run);
  add_probe(pipe, "mb", on_micro_batch, run);
  GstElement *src = gst_bin_get_by_name(GST_BIN(pipe), "src");
  ASSERT_NE(gst_element_set_state(pipe, GST_STATE_PLAYING), GST_STATE_CHANGE_FAILURE);
  GstClockTime pts = 0;
  int w = 0, h = 0;
  for (size_t k = 0; k < clips.size(); k++) {
    const Clip &c = clips[k];
    if (c.width != w || c.height != h) {
      GstCaps *caps = frame_caps(c.width, c.height, 8);
      gst_app_src_set_caps(GST_APP_SRC(src), caps);
      gst_caps_unref(caps);
      w = c.width;
      h = c.height;
    }
    for (int t = 0; t < kFrames; t++) {
      if (static_cast<int>(k) == mid_clip_recaps && t == 2) {
        // Same size, another framerate: caps re-sent in the middle of a clip.
        GstCaps *caps = frame_caps(w, h, 16);
        gst_app_src_set_caps(GST_APP_SRC(src), caps);
        gst_caps_unref(caps);
      }
      if (t == c.resize_after) {
        w = c.width + 16;
        GstCaps *caps = frame_caps(w, h, 8);
        gst_app_src_set_caps(GST_APP_SRC(src), caps);
        gst_caps_unref(caps);
      }
      at::Tensor f = c.u8[t];
      if (w != c.width) f = at::zeros({h, w, 3}, at::kByte);  // the broken upstream's frames of the new size
      f = f.contiguous();
      GstBuffer *b = gst_buffer_new_allocate(nullptr, f.numel(), nullptr);
      gst_buffer_fill(b, 0, f.data_ptr(), f.numel());
      GST_BUFFER_PTS(b) = pts;
      GST_BUFFER_DURATION(b) = kFrame;
      pts += kFrame;
      auto *m = gst_buffer_add_videotrain_clip_meta(b, "a red ball bouncing on black", "/videos/x.mp4", "train");
      m->sample_id = c.sample;
      m->clip_index = k;
      m->frame_index = t;
      m->num_frames = kFrames;
      ASSERT_EQ(gst_app_src_push_buffer(GST_APP_SRC(src), b), GST_FLOW_OK);
    }
  }
  gst_app_src_end_of_stream(GST_APP_SRC(src));
  GstBus *bus = gst_element_get_bus(pipe);
  for (bool done = false; !done;) {
    GstMessage *msg = gst_bus_timed_pop(bus, 300 * GST_SECOND);
    if (!msg) {
      run->errors.push_back("timeout");
      break;
    }
    const GstStructure *s = gst_message_get_structure(msg);
    if (GST_MESSAGE_TYPE(msg) == GST_MESSAGE_EOS) {
      done = true;
    } else if (GST_MESSAGE_TYPE(msg) == GST_MESSAGE_ERROR) {
      GError *e = nullptr;
      gchar *dbg = nullptr;
      gst_message_parse_error(msg, &e, &dbg);
      run->errors.push_back(std::string(e->message) + " | " + (dbg ? dbg : ""));
      g_clear_error(&e);
      g_free(dbg);
      done = true;
    } else if (GST_MESSAGE_TYPE(msg) == GST_MESSAGE_ELEMENT && gst_structure_has_name(s, "vaeencoder-dropped")) {
      run->dropped.push_back(gst_structure_get_string(s, "reason"));
    } else if (GST_MESSAGE_TYPE(msg) == GST_MESSAGE_ELEMENT && gst_structure_has_name(s, "ddptrainsink-step")) {
      double loss = NAN;
      gst_structure_get_double(s, "loss", &loss);
      run->losses.push_back(loss);
    }
    gst_message_unref(msg);
  }
  if (GstElement *t = gst_bin_get_by_name(GST_BIN(pipe), "t")) {
    g_object_get(t, "steps", &run->steps, nullptr);
    gst_object_unref(t);
  }
  GstElement *enc = gst_bin_get_by_name(GST_BIN(pipe), "enc");
  g_object_get(enc, "clips-dropped", &run->clips_dropped, nullptr);
  gst_object_unref(enc);
  gst_element_set_state(pipe, GST_STATE_NULL);
  gst_object_unref(bus);
  gst_object_unref(src);
  gst_object_unref(pipe);
}

std::string make_vae(const vttest::TempDir &dir) {
  std::string tool = vttest::env_or("VIDEOTRAIN_BUILD_DIR", "build") + "/tools/videotrain-make-vae";
  if (std::system((tool + " " + dir.file("vae") + " --tiny --seed 5 >/dev/null").c_str()) != 0) {
    ADD_FAILURE() << "videotrain-make-vae failed";
    return "";
  }
  return dir.file("vae");
}

// 32x32 and 48x32 clips, alternating with runs of two.
std::vector<Clip> mixed_clips() {
  const int widths[] = {32, 48, 32, 48, 48, 32, 32, 48};
  std::vector<Clip> clips;
  for (int k = 0; k < 8; k++) clips.push_back(make_clip(k, widths[k], 32));
  return clips;
}

// Each clip's latent from a stream of that clip alone (one size, one caps event).
std::map<uint64_t, at::Tensor> latents_alone(const std::string &vae, const std::vector<Clip> &clips) {
  std::map<uint64_t, at::Tensor> out;
  for (const Clip &c : clips) {
    Recorded r;
    run_clips(vae, {c}, "fakesink sync=false", &r);
    EXPECT_TRUE(r.errors.empty()) << r.errors.front();
    if (r.latents.size() == 1) out[c.sample] = r.latents[0].tensor;
    else ADD_FAILURE() << "clip " << c.sample << " alone gave " << r.latents.size() << " latents";
  }
  return out;
}

// A tokenizer and a seeded TorchScript text encoder (scripts/make_text_encoder.py) in DIR/text.
std::string make_text_encoder(const vttest::TempDir &dir) {
  std::string csv = "path,text\n";
  for (const char *c : {"a red ball bouncing on black", "colour bars with a moving noise strip", "television static",
                        "a zone plate of rings moving outwards", "concentric circles", "a turning pinwheel",
                        "spokes of a wheel", "a vertical grey gradient", "vertical colour stripes"})
    csv += std::string("x.mp4,") + c + "\n";
  vttest::write_file(dir.file("captions.csv"), csv);
  const std::string py = vttest::env_or("PYTHON", "/usr/bin/python3");
  const std::string script = vttest::env_or("VIDEOTRAIN_SOURCE_DIR", ".") + "/scripts/make_text_encoder.py";
  if (std::system((py + " " + script + " " + dir.file("text") + " --captions " + dir.file("captions.csv") +
                   " >/dev/null 2>&1").c_str()) != 0) {
    ADD_FAILURE() << "make_text_encoder.py failed";
    return "";
  }
  return "textencoder tokenizer=" + dir.file("text/spiece.model") + " model=" + dir.file("text/text_encoder.pt") +
         " max-length=16 ! ";
}

// clips ! vaeencoder ! [textencoder !] microbatcher ! ddptrainsink model=builtin:MODEL
void check_training_run(uint32_t batch, uint32_t micro, bool text = false) {
  vttest::TempDir dir;
  const std::string vae = make_vae(dir);
  ASSERT_FALSE(vae.empty());
  const std::string textencoder = text ? make_text_encoder(dir) : "";
  if (text) {
    ASSERT_FALSE(textencoder.empty());
  }
  const auto clips = mixed_clips();
  const auto reference = latents_alone(vae, clips);
  Recorded r;
  run_clips(vae, clips,
            textencoder + "microbatcher name=mb batch-size=" + std::to_string(batch) +
                " micro-batch-size=" + std::to_string(micro) + " ! ddptrainsink name=t model=builtin:" +
                (text ? "tiny-t2v" : "tiny-unet3d") + " device=cpu log-every=1 rank=0 world-size=1",
            &r, /*mid_clip_recaps=*/2);
  ASSERT_TRUE(r.errors.empty()) << r.errors.front();
  EXPECT_TRUE(r.dropped.empty()) << r.dropped.front();
  EXPECT_EQ(r.clips_dropped, 0u);

  // Latents: one per clip, in order, [C, (T-1)/4+1, H/8, W/8], equal to the clip encoded alone.
  ASSERT_EQ(r.latents.size(), clips.size());
  std::map<uint64_t, std::vector<int64_t>> shape_of;
  for (size_t k = 0; k < clips.size(); k++) {
    const Latent &l = r.latents[k];
    EXPECT_EQ(l.sample, clips[k].sample);
    const std::vector<int64_t> want{4, 2, clips[k].height / 8, clips[k].width / 8};
    EXPECT_EQ(l.tensor.sizes().vec(), want) << "clip " << k;
    shape_of[l.sample] = l.tensor.sizes().vec();
    auto ref = reference.find(l.sample);
    ASSERT_NE(ref, reference.end());
    ASSERT_EQ(ref->second.sizes(), l.tensor.sizes());
    EXPECT_TRUE(at::allclose(l.tensor, ref->second, 1e-5, 1e-5))
        << "clip " << k << " differs from the same clip in a stream of one size by "
        << (l.tensor - ref->second).abs().max().item<float>();
  }

  // Micro-batches: one shape each (their samples' shape), every sample exactly once, full steps.
  std::multiset<uint64_t> seen;
  std::map<uint64_t, size_t> per_step;
  for (const auto &mb : r.batches) {
    ASSERT_EQ(mb.shape.size(), 5u);
    ASSERT_FALSE(mb.samples.empty());
    EXPECT_EQ(mb.shape[0], static_cast<int64_t>(mb.samples.size()));
    EXPECT_LE(mb.samples.size(), micro);
    for (uint64_t s : mb.samples) {
      seen.insert(s);
      EXPECT_EQ(std::vector<int64_t>(mb.shape.begin() + 1, mb.shape.end()), shape_of[s])
          << "sample " << s << " in a micro-batch of another shape (step " << mb.step << ")";
    }
    per_step[mb.step] += mb.samples.size();
  }
  EXPECT_EQ(seen.size(), clips.size());
  for (const Clip &c : clips) EXPECT_EQ(seen.count(c.sample), 1u) << "sample " << c.sample;
  EXPECT_EQ(per_step.size(), clips.size() / batch);
  for (const auto &[step, n] : per_step) EXPECT_EQ(n, batch) << "step " << step;

  // Training: every step ran, with a finite loss.
  EXPECT_EQ(r.steps, clips.size() / batch);
  ASSERT_EQ(r.losses.size(), clips.size() / batch);
  for (double loss : r.losses) EXPECT_TRUE(std::isfinite(loss));
}

}  // namespace

TEST(VaeEncoderSizeChange, AlternatingSizesTrainWithMicroBatchesOfOne) { check_training_run(2, 1); }

// Steps of two samples of two shapes: each becomes two single-shape micro-batches.
TEST(VaeEncoderSizeChange, AlternatingSizesTrainWithMicroBatchesOfTwo) { check_training_run(2, 2); }

// textencoder between them: the text embeddings travel with latents of either size.
TEST(VaeEncoderSizeChange, AlternatingSizesThroughTextEncoder) { check_training_run(2, 1, true); }

// A size change inside a clip (an upstream bug) loses that clip only, with a message naming it.
TEST(VaeEncoderSizeChange, ChangeInsideAClipDropsOnlyThatClip) {
  vttest::TempDir dir;
  const std::string vae = make_vae(dir);
  ASSERT_FALSE(vae.empty());
  std::vector<Clip> clips{make_clip(0, 32, 32), make_clip(1, 32, 32), make_clip(2, 48, 32)};
  clips[1].resize_after = 3;
  Recorded r;
  run_clips(vae, clips, "fakesink sync=false", &r);
  ASSERT_TRUE(r.errors.empty()) << r.errors.front();
  ASSERT_EQ(r.dropped.size(), 1u);
  EXPECT_NE(r.dropped[0].find("frame size changed to 48x32 in the middle of the clip"), std::string::npos)
      << r.dropped[0];
  EXPECT_EQ(r.clips_dropped, 1u);
  ASSERT_EQ(r.latents.size(), 2u);
  EXPECT_EQ(r.latents[0].sample, 0u);
  EXPECT_EQ(r.latents[1].sample, 2u);
  EXPECT_EQ(r.latents[1].tensor.sizes().vec(), (std::vector<int64_t>{4, 2, 4, 6}));
}
