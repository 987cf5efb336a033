/* What users write for sampling branches: prompt files (promptsrc) and samplesink's location
 * patterns. */
#include <gtest/gtest.h>

#include <gst/app/gstappsink.h>
#include <gst/gst.h>
#include <sys/stat.h>

#include <algorithm>

#include <string>
#include <vector>

#include "promptsrc/prompt_file.h"
#include "samplesink/sample_names.h"
#include "tensor_caps.h"
#include "test_util.h"

using namespace videotrain;

namespace {

struct Read {
  bool ok;
  std::vector<Prompt> prompts;
  std::vector<std::string> warnings;
  std::string error;
};

Read read_text(const std::string &text, PromptFileLimits limits = {}) {
  vttest::TempDir dir;
  const std::string path = dir.file("prompts.txt");
  vttest::write_file(path, text);
  Read r;
  r.ok = read_prompt_file(path, limits, &r.prompts, &r.warnings, &r.error);
  return r;
}

}  // namespace

TEST(PromptFile, OnePromptALine) {
  const auto r = read_text("# sample prompts\n\na red ball rolling\n  two people, walking  \r\n");
  ASSERT_TRUE(r.ok) << r.error;
  ASSERT_EQ(r.prompts.size(), 2u);
  EXPECT_EQ(r.prompts[0].text, "a red ball rolling");
  EXPECT_EQ(r.prompts[1].text, "two people, walking");  // commas are text in a plain file
  EXPECT_EQ(r.prompts[1].index, 1u);
  EXPECT_EQ(r.prompts[1].seed, -1);
  EXPECT_EQ(r.prompts[1].frames, 0);
}

TEST(PromptFile, CsvWithColumnsInAnyOrder) {
  const auto r = read_text(
      "Seed,Prompt,negative_prompt,num_frames,width,height\n"
      "7,\"a cat, walking\",blurry,17,64,48\n"
      "\n"
      ",\"said \"\"hi\"\"\nover two lines\",,,,\n");
  ASSERT_TRUE(r.ok) << r.error;
  ASSERT_EQ(r.prompts.size(), 2u);
  EXPECT_EQ(r.prompts[0].text, "a cat, walking");
  EXPECT_EQ(r.prompts[0].negative, "blurry");
  EXPECT_EQ(r.prompts[0].seed, 7);
  EXPECT_EQ(r.prompts[0].frames, 17);
  EXPECT_EQ(r.prompts[0].width, 64);
  EXPECT_EQ(r.prompts[0].height, 48);
  EXPECT_EQ(r.prompts[1].text, "said \"hi\"\nover two lines");
  EXPECT_EQ(r.prompts[1].seed, -1);
  EXPECT_EQ(r.prompts[1].width, 0);
}

TEST(PromptFile, BadValuesNameTheLineAndColumn) {
  auto r = read_text("prompt,seed\nfine,1\nbad,12x\n");
  EXPECT_FALSE(r.ok);
  EXPECT_NE(r.error.find("line 3"), std::string::npos) << r.error;
  EXPECT_NE(r.error.find("seed '12x'"), std::string::npos) << r.error;
  r = read_text("prompt,width\nx,4\n");
  EXPECT_FALSE(r.ok);
  EXPECT_NE(r.error.find("width"), std::string::npos) << r.error;
  r = read_text("prompt,seed\nx,99999999999999999999\n");
  EXPECT_FALSE(r.ok) << "an overflowing seed was taken";
  r = read_text("prompt\n\"never closed\n");
  EXPECT_FALSE(r.ok);
  EXPECT_NE(r.error.find("quote"), std::string::npos) << r.error;
}

TEST(PromptFile, EmptyMissingAndHostileFilesAreErrors) {
  for (const char *text : {"", "\n\n# only a comment\n", "prompt,seed\n"}) {
    const auto r = read_text(text);
    EXPECT_FALSE(r.ok) << "'" << text << "'";
    EXPECT_NE(r.error.find("no prompts"), std::string::npos) << r.error;
  }
  EXPECT_FALSE(read_text("\xff\xfe not text\n").ok);
  std::vector<Prompt> p;
  std::vector<std::string> w;
  std::string e;
  vttest::TempDir dir;
  EXPECT_FALSE(read_prompt_file(dir.file("missing.txt"), {}, &p, &w, &e));
  EXPECT_NE(e.find("missing.txt"), std::string::npos) << e;
  const std::string fifo = dir.file("fifo.txt");
  ASSERT_EQ(mkfifo(fifo.c_str(), 0600), 0);
  EXPECT_FALSE(read_prompt_file(fifo, {}, &p, &w, &e));  // refused, not blocked on
  EXPECT_NE(e.find("not a regular file"), std::string::npos) << e;
  EXPECT_FALSE(read_prompt_file("/dev/zero", {}, &p, &w, &e));
}

TEST(PromptFile, LongPromptsAreCutAtACharacterWithAWarning) {
  PromptFileLimits limits;
  limits.max_prompt_bytes = 5;
  const auto r = read_text("ab\xc3\xa9\xc3\xa9xyz\n", limits);  // a b é é x y z: byte 5 is inside the second é
  ASSERT_TRUE(r.ok) << r.error;
  EXPECT_EQ(r.prompts[0].text, "ab\xc3\xa9");
  ASSERT_EQ(r.warnings.size(), 1u);
  EXPECT_NE(r.warnings[0].find("line 1"), std::string::npos);
}

TEST(SampleNames, PatternTakesStepThenPrompt) {
  EXPECT_EQ(check_sample_pattern("samples/step-%08d/prompt-%02d.mp4"), "");
  EXPECT_EQ(sample_file_name("samples/step-%08d/prompt-%02d.mp4", 42, 3), "samples/step-00000042/prompt-03.mp4");
  EXPECT_EQ(sample_file_name("s%d_%d%%.webm", 7, 11), "s7_11%.webm");
  EXPECT_NE(check_sample_pattern("samples/%d.mp4"), "");
  EXPECT_NE(check_sample_pattern("%s-%d-%d.mp4"), "");  // no printf on user text
  EXPECT_NE(check_sample_pattern("%d-%d-%d.mp4"), "");
  EXPECT_NE(check_sample_pattern("%999d-%d.mp4"), "");
  EXPECT_NE(check_sample_pattern(""), "");
}

namespace {

struct BusResult {
  std::vector<std::string> warnings, errors;
};

// Runs a pipeline to EOS or error, keeping its warnings and errors.
BusResult run_collect(const std::string &desc) {
  BusResult r;
  GError *err = nullptr;
  GstElement *p = gst_parse_launch(desc.c_str(), &err);
  if (!p) {
    r.errors.push_back(err ? err->message : "parse failed");
    g_clear_error(&err);
    return r;
  }
  gst_element_set_state(p, GST_STATE_PLAYING);
  GstBus *bus = gst_element_get_bus(p);
  for (;;) {
    GstMessage *m = gst_bus_timed_pop_filtered(
        bus, 60 * GST_SECOND, GstMessageType(GST_MESSAGE_EOS | GST_MESSAGE_ERROR | GST_MESSAGE_WARNING));
    if (!m) {
      r.errors.push_back("timeout");
      break;
    }
    const GstMessageType t = GST_MESSAGE_TYPE(m);
    if (t == GST_MESSAGE_WARNING || t == GST_MESSAGE_ERROR) {
      GError *e = nullptr;
      if (t == GST_MESSAGE_WARNING) gst_message_parse_warning(m, &e, nullptr);
      else gst_message_parse_error(m, &e, nullptr);
      (t == GST_MESSAGE_WARNING ? r.warnings : r.errors).push_back(e ? e->message : "?");
      g_clear_error(&e);
    }
    gst_message_unref(m);
    if (t != GST_MESSAGE_WARNING) break;
  }
  gst_object_unref(bus);
  gst_element_set_state(p, GST_STATE_NULL);
  gst_object_unref(p);
  return r;
}

std::vector<std::string> names_under(const std::string &dir) {
  std::vector<std::string> out;
  GDir *d = g_dir_open(dir.c_str(), 0, nullptr);
  if (!d) return out;
  while (const gchar *n = g_dir_read_name(d)) out.push_back(n);
  g_dir_close(d);
  std::sort(out.begin(), out.end());
  return out;
}

}  // namespace

// Sampling faults (issue 38 item 15): a sample is written under a partial name and renamed when
// complete, so a killed run never leaves a broken file under a sample's name; a sample that cannot be
// written is a warning and training goes on, unless fail-on-error=true.
TEST(SampleSink, WritesUnderAPartialNameAndAFailedSampleIsAWarning) {
  vttest::TempDir dir;
  const std::string src = "videotestsrc num-buffers=5 ! video/x-raw,format=RGB,width=32,height=32,framerate=8/1 ! ";
  BusResult ok = run_collect(src + "samplesink location=" + dir.file("ok/step-%08d/prompt-%02d.mp4"));
  EXPECT_TRUE(ok.errors.empty()) << ok.errors.front();
  EXPECT_EQ(names_under(dir.file("ok/step-00000000")), (std::vector<std::string>{"prompt-00.mp4"}))
      << "only the complete file, no partial one";
  struct stat st{};
  ASSERT_EQ(stat(dir.file("ok/step-00000000/prompt-00.mp4").c_str(), &st), 0);
  EXPECT_GT(st.st_size, 0);
  // The sample's folder cannot be made (a file is in its place): a warning naming it, no error.
  ASSERT_EQ(g_mkdir_with_parents(dir.file("bad").c_str(), 0755), 0);
  vttest::write_file(dir.file("bad/step-00000000"), "in the way\n");
  BusResult warned = run_collect(src + "samplesink location=" + dir.file("bad/step-%08d/prompt-%02d.mp4"));
  EXPECT_TRUE(warned.errors.empty()) << warned.errors.front();
  ASSERT_EQ(warned.warnings.size(), 1u);
  EXPECT_NE(warned.warnings[0].find("training goes on"), std::string::npos) << warned.warnings[0];
  EXPECT_NE(warned.warnings[0].find("step-00000000"), std::string::npos) << warned.warnings[0];
  BusResult fatal = run_collect(src + "samplesink fail-on-error=true location=" + dir.file("bad/step-%08d/prompt-%02d.mp4"));
  ASSERT_EQ(fatal.errors.size(), 1u);
  EXPECT_NE(fatal.errors[0].find("step-00000000"), std::string::npos) << fatal.errors[0];
}

namespace {

// The frames a pipeline's appsink named s receives (pulled until EOS).
std::vector<GstBuffer *> pull_all(const std::string &desc) {
  std::vector<GstBuffer *> out;
  GstElement *p = gst_parse_launch(desc.c_str(), nullptr);
  if (!p) return out;
  GstElement *sink = gst_bin_get_by_name(GST_BIN(p), "s");
  gst_element_set_state(p, GST_STATE_PLAYING);
  while (GstSample *s = gst_app_sink_try_pull_sample(GST_APP_SINK(sink), 30 * GST_SECOND)) {
    out.push_back(gst_buffer_ref(gst_sample_get_buffer(s)));
    gst_sample_unref(s);
  }
  gst_element_set_state(p, GST_STATE_NULL);
  gst_object_unref(sink);
  gst_object_unref(p);
  return out;
}

// The named uint8 tensor's bytes and shape; empty when the buffer has none.
std::vector<uint8_t> named_bytes(GstBuffer *b, const std::string &name, std::vector<int64_t> *shape) {
  const GstVideoTrainTensorMeta *m = find_tensor_meta(b, name);
  if (!m) return {};
  *shape = tensor_meta_shape(m);
  std::vector<uint8_t> out(gst_videotrain_tensor_meta_get_nbytes(m));
  gst_buffer_extract(b, m->offset, out.data(), out.size());
  EXPECT_STREQ(m->dtype, "uint8");
  return out;
}

// videotestsrc's frame as packed RGB rows (GStreamer pads RGB rows to 4 bytes).
std::vector<uint8_t> test_frame(const std::string &pattern, int w, int h) {
  auto frames = pull_all("videotestsrc num-buffers=1 pattern=" + pattern + " ! video/x-raw,format=RGB,width=" +
                         std::to_string(w) + ",height=" + std::to_string(h) + " ! appsink name=s sync=false");
  std::vector<uint8_t> out;
  if (frames.size() != 1) return out;
  GstMapInfo m;
  gst_buffer_map(frames[0], &m, GST_MAP_READ);
  const size_t row = size_t(w) * 3, stride = m.size / size_t(h);
  for (int y = 0; y < h; y++) out.insert(out.end(), m.data + y * stride, m.data + y * stride + row);
  gst_buffer_unmap(frames[0], &m);
  gst_buffer_unref(frames[0]);
  return out;
}

}  // namespace

// Image-to-video prompts (issue 43 item 4): the image and last_image columns name image files relative to
// the prompt file; each is decoded at its own size (21x10: RGB rows padded in GStreamer) and rides on its
// prompt's buffer, not the negative's, as uint8 [H, W, 3] with every pixel of the lossless PNG. An image
// that cannot be read stops the element with an error naming the prompt's line and the file.
TEST(PromptSrc, ImageColumnsRideOnThePromptBufferAndAMissingImageIsAnError) {
  vttest::TempDir dir;
  for (const auto &[name, pattern] : {std::pair<std::string, std::string>{"first.png", "smpte"}, {"last.png", "checkers-2"}}) {
    const auto r = run_collect("videotestsrc num-buffers=1 pattern=" + pattern +
                               " ! video/x-raw,format=RGB,width=21,height=10 ! pngenc ! filesink location=" + dir.file(name));
    ASSERT_TRUE(r.errors.empty()) << r.errors[0];
  }
  vttest::write_file(dir.file("prompts.csv"), "prompt,image,last_image\na cat,first.png,last.png\na dog,,\n");
  auto bufs = pull_all("promptsrc location=" + dir.file("prompts.csv") + " ! appsink name=s sync=false");
  ASSERT_EQ(bufs.size(), 4u);
  std::vector<int64_t> shape;
  EXPECT_EQ(named_bytes(bufs[0], "image", &shape), test_frame("smpte", 21, 10));
  EXPECT_EQ(shape, (std::vector<int64_t>{10, 21, 3}));
  EXPECT_EQ(named_bytes(bufs[0], "last_image", &shape), test_frame("checkers-2", 21, 10));
  EXPECT_TRUE(named_bytes(bufs[1], "image", &shape).empty()) << "the negative prompt's buffer carries no image";
  EXPECT_TRUE(named_bytes(bufs[2], "image", &shape).empty()) << "a prompt with an empty image cell has none";
  for (GstBuffer *b : bufs) gst_buffer_unref(b);

  vttest::write_file(dir.file("missing.csv"), "prompt,image\na cat,first.png\n\"a dog\",nowhere.png\n");
  const auto r = run_collect("promptsrc location=" + dir.file("missing.csv") + " ! fakesink");
  ASSERT_EQ(r.errors.size(), 1u);
  EXPECT_NE(r.errors[0].find("line 3"), std::string::npos) << r.errors[0];
  EXPECT_NE(r.errors[0].find("nowhere.png"), std::string::npos) << r.errors[0];
  EXPECT_FALSE(read_text("prompt,last_image\na,b.png\n").ok) << "last_image without image";
}
