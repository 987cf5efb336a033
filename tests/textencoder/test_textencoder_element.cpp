/* textencoder as an element (GstHarness): the named tensors it adds equal the reference
 * embeddings of each buffer's caption, buffers keep their order and metas through batching,
 * serialized events send held buffers first, and bad settings or input give clear messages. */
#include <ATen/ATen.h>
#include <gst/check/gstharness.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "metas.h"
#include "safetensors.h"
#include "tensor_buffer.h"
#include "tensor_caps.h"
#include "test_util.h"

using namespace videotrain;

namespace {

const char *kLatentCaps = "application/x-videotrain-tensor, content=(string)latents, dtype=(string)float32, "
                          "device=(string)cpu";

struct Refs {
  vttest::TempDir dir;
  std::vector<std::string> captions;
  std::unique_ptr<SafetensorsFile> file;
  Refs() {
    const std::string py = vttest::env_or("PYTHON", "/usr/bin/python3");
    const std::string script = vttest::env_or("VIDEOTRAIN_SOURCE_DIR", ".") + "/tests/textencoder/make_text_refs.py";
    if (std::system((py + " " + script + " " + dir.path() + " >/dev/null").c_str()) != 0) return;
    std::string err;
    file = SafetensorsFile::open(dir.file("refs.safetensors"), &err);
    if (file) captions = nlohmann::json::parse(file->metadata().at("captions")).get<std::vector<std::string>>();
  }
  at::Tensor embeds(size_t i) const {
    const SafetensorsEntry *e = file->find("embeds." + std::to_string(i));
    return at::from_blob(const_cast<uint8_t *>(e->data), e->shape, at::kFloat).clone();
  }
};

const Refs &refs() {
  static Refs r;
  return r;
}

GstBuffer *latent(uint64_t id, const std::string &caption, uint32_t epoch = 0) {
  GstBuffer *buf = buffer_from_tensor(at::full({4, 2, 4, 4}, static_cast<double>(id), at::kFloat));
  auto *m = gst_buffer_add_videotrain_sample_meta(buf, caption.c_str(), "v.mp4");
  m->sample_id = id;
  m->epoch = epoch;
  GST_BUFFER_PTS(buf) = id * GST_SECOND;
  GST_BUFFER_DURATION(buf) = GST_SECOND;
  return buf;
}

GstHarness *harness(guint batch, const std::string &model = "text_encoder.pt", double caption_dropout = 0,
                    guint64 seed = 0) {
  const Refs &r = refs();
  GstElement *e = gst_element_factory_make("textencoder", nullptr);
  EXPECT_NE(e, nullptr) << "textencoder not found (GST_PLUGIN_PATH?)";
  g_object_set(e, "tokenizer", r.dir.file("spiece.model").c_str(), "model", r.dir.file(model).c_str(),
               "max-length", 24u, "batch-size", batch, "device", "cpu", "caption-dropout", caption_dropout, "seed",
               seed, nullptr);
  GstHarness *h = gst_harness_new_with_element(e, "sink", "src");
  gst_object_unref(e);
  gst_harness_set_src_caps_str(h, kLatentCaps);
  return h;
}

}  // namespace

TEST(TextEncoderElement, AddsEachCaptionsEmbeddingAndMaskInOrder) {
  const Refs &r = refs();
  ASSERT_TRUE(r.file) << "make_text_refs.py failed";
  GstHarness *h = harness(3);
  const size_t n = r.captions.size();  // 8: two full batches of 3 and 2 held until EOS
  for (size_t i = 0; i < n; i++) ASSERT_EQ(gst_harness_push(h, latent(i, r.captions[i])), GST_FLOW_OK);
  EXPECT_EQ(gst_harness_buffers_received(h), 6u) << "batches of 3 go out when full";
  ASSERT_TRUE(gst_harness_push_event(h, gst_event_new_eos()));
  ASSERT_EQ(gst_harness_buffers_received(h), n);
  GstCaps *caps = gst_pad_get_current_caps(h->sinkpad);
  ASSERT_NE(caps, nullptr);
  EXPECT_STREQ(gst_structure_get_string(gst_caps_get_structure(caps, 0), "tensors"), "text_embeds,text_mask");
  gst_caps_unref(caps);
  for (size_t i = 0; i < n; i++) {
    GstBuffer *b = gst_harness_pull(h);
    SampleInfo info;
    ASSERT_TRUE(read_sample_meta(b, &info));
    EXPECT_EQ(info.sample_id, i);
    EXPECT_EQ(GST_BUFFER_PTS(b), i * GST_SECOND);
    std::string why;
    auto lat = tensor_from_buffer(b, &why);
    ASSERT_TRUE(lat) << why;
    EXPECT_EQ(lat->sizes(), (std::vector<int64_t>{4, 2, 4, 4}));
    EXPECT_EQ((*lat)[0][0][0][0].item<float>(), static_cast<float>(i)) << "the latent itself is unchanged";
    auto emb = named_tensor_from_buffer(b, "text_embeds", &why);
    ASSERT_TRUE(emb) << why;
    EXPECT_TRUE(at::allclose(*emb, r.embeds(i), 1e-5, 1e-6)) << "caption " << i;
    auto mask = named_tensor_from_buffer(b, "text_mask", &why);
    ASSERT_TRUE(mask) << why;
    EXPECT_EQ(mask->scalar_type(), at::kLong);
    EXPECT_EQ(tensor_names(b), (std::vector<std::string>{"text_embeds", "text_mask"}));
    // A copy (plain system memory after a map) still yields the same tensors through the metas.
    GstBuffer *copy = gst_buffer_new();
    GstMapInfo map;
    ASSERT_TRUE(gst_buffer_map(b, &map, GST_MAP_READ));
    gst_buffer_append_memory(copy, gst_memory_new_wrapped(GST_MEMORY_FLAG_READONLY, g_memdup2(map.data, map.size),
                                                          map.size, 0, map.size, nullptr, nullptr));
    gst_buffer_unmap(b, &map);
    gst_buffer_copy_into(copy, b, GST_BUFFER_COPY_META, 0, -1);
    auto emb2 = named_tensor_from_buffer(copy, "text_embeds", &why);
    ASSERT_TRUE(emb2) << why;
    EXPECT_TRUE(at::equal(*emb2, *emb));
    auto lat2 = tensor_from_buffer(copy, &why);
    ASSERT_TRUE(lat2) << why;
    EXPECT_TRUE(at::equal(*lat2, *lat));
    gst_buffer_unref(copy);
    gst_buffer_unref(b);
  }
  gst_harness_teardown(h);
}

TEST(TextEncoderElement, TheEpochEventSendsHeldBuffersFirst) {
  const Refs &r = refs();
  ASSERT_TRUE(r.file);
  GstHarness *h = harness(8);
  ASSERT_EQ(gst_harness_push(h, latent(0, r.captions[0])), GST_FLOW_OK);
  ASSERT_EQ(gst_harness_push(h, latent(1, r.captions[1])), GST_FLOW_OK);
  EXPECT_EQ(gst_harness_buffers_received(h), 0u);
  GstStructure *s = gst_structure_new(GST_VIDEOTRAIN_EPOCH_EVENT, "epoch", G_TYPE_UINT, 0u, nullptr);
  ASSERT_TRUE(gst_harness_push_event(h, gst_event_new_custom(GST_EVENT_CUSTOM_DOWNSTREAM, s)));
  EXPECT_EQ(gst_harness_buffers_received(h), 2u);
  // The event comes after the buffers (harness: events and buffers are separate queues, so
  // check that the buffers were there when the event arrived by pulling events now).
  bool saw_epoch = false;
  while (GstEvent *e = gst_harness_try_pull_event(h)) {
    const GstStructure *st = gst_event_get_structure(e);
    saw_epoch |= st && gst_structure_has_name(st, GST_VIDEOTRAIN_EPOCH_EVENT);
    gst_event_unref(e);
  }
  EXPECT_TRUE(saw_epoch);
  gst_harness_teardown(h);
}

TEST(TextEncoderElement, LatentsWithoutSampleMetaGetTheEmptyCaptionAndAWarning) {
  const Refs &r = refs();
  ASSERT_TRUE(r.file);
  GstHarness *h = harness(1);
  GstBus *bus = gst_bus_new();
  gst_element_set_bus(h->element, bus);
  GstBuffer *bare = buffer_from_tensor(at::zeros({4, 2, 4, 4}));
  ASSERT_EQ(gst_harness_push(h, bare), GST_FLOW_OK);
  GstBuffer *out = gst_harness_pull(h);
  std::string why;
  auto emb = named_tensor_from_buffer(out, "text_embeds", &why);
  ASSERT_TRUE(emb) << why;
  EXPECT_TRUE(at::allclose(*emb, r.embeds(1), 1e-5, 1e-6)) << "caption 1 of the references is the empty one";
  gst_buffer_unref(out);
  GstMessage *m = gst_bus_pop_filtered(bus, GST_MESSAGE_WARNING);
  ASSERT_NE(m, nullptr);
  GError *err = nullptr;
  gst_message_parse_warning(m, &err, nullptr);
  EXPECT_NE(std::string(err->message).find("sample meta"), std::string::npos) << err->message;
  g_error_free(err);
  gst_message_unref(m);
  gst_element_set_bus(h->element, nullptr);
  gst_object_unref(bus);
  gst_harness_teardown(h);
}

TEST(TextEncoderElement, AModelThatDoesNotFitFailsAtStartNamingIt) {
  const Refs &r = refs();
  ASSERT_TRUE(r.file);
  GstElement *e = gst_element_factory_make("textencoder", nullptr);
  ASSERT_NE(e, nullptr);
  g_object_set(e, "tokenizer", r.dir.file("spiece.model").c_str(), "model", r.dir.file("bad_shape_encoder.pt").c_str(),
               "max-length", 24u, nullptr);
  GstBus *bus = gst_bus_new();
  gst_element_set_bus(e, bus);
  EXPECT_EQ(gst_element_set_state(e, GST_STATE_PAUSED), GST_STATE_CHANGE_FAILURE);
  GstMessage *m = gst_bus_pop_filtered(bus, GST_MESSAGE_ERROR);
  ASSERT_NE(m, nullptr);
  GError *err = nullptr;
  gst_message_parse_error(m, &err, nullptr);
  EXPECT_NE(std::string(err->message).find("expected [B, L, D]"), std::string::npos) << err->message;
  g_error_free(err);
  gst_message_unref(m);
  gst_element_set_state(e, GST_STATE_NULL);
  gst_element_set_bus(e, nullptr);
  gst_object_unref(bus);
  gst_object_unref(e);
}

// caption-dropout through the element: a dropped sample's embedding is the empty caption's (reference
// caption 1), any other its own caption's; which samples drop depends on (seed, sample id, epoch)
// alone (a rerun or a resume draws the same, another epoch differently); textencoder-summary counts them.
namespace {
struct DropoutRun {
  std::vector<bool> dropped;
  guint64 posted = G_MAXUINT64;
  guint64 encoded = 0;
};

DropoutRun run_dropout(double p, guint64 seed, uint32_t epoch, size_t n) {
  const Refs &r = refs();
  DropoutRun run;
  GstHarness *h = harness(4, "text_encoder.pt", p, seed);
  GstBus *bus = gst_bus_new();
  gst_element_set_bus(h->element, bus);
  const size_t cap = 2;  // a non-empty reference caption
  for (size_t i = 0; i < n; i++) EXPECT_EQ(gst_harness_push(h, latent(100 + i, r.captions[cap], epoch)), GST_FLOW_OK);
  EXPECT_TRUE(gst_harness_push_event(h, gst_event_new_eos()));
  for (size_t i = 0; i < n; i++) {
    GstBuffer *b = gst_harness_pull(h);
    std::string why;
    auto emb = named_tensor_from_buffer(b, "text_embeds", &why);
    EXPECT_TRUE(emb) << why;
    const bool empty = emb && at::allclose(*emb, r.embeds(1), 1e-5, 1e-6);
    EXPECT_TRUE(empty || (emb && at::allclose(*emb, r.embeds(cap), 1e-5, 1e-6))) << "sample " << i;
    run.dropped.push_back(empty);
    gst_buffer_unref(b);
  }
  while (GstMessage *m = gst_bus_pop_filtered(bus, GST_MESSAGE_ELEMENT)) {
    const GstStructure *st = gst_message_get_structure(m);
    if (gst_structure_has_name(st, "textencoder-summary")) {
      gst_structure_get_uint64(st, "dropped", &run.posted);
      gst_structure_get_uint64(st, "encoded", &run.encoded);
    }
    gst_message_unref(m);
  }
  gst_element_set_bus(h->element, nullptr);
  gst_object_unref(bus);
  gst_harness_teardown(h);
  return run;
}

size_t count(const std::vector<bool> &v) { return static_cast<size_t>(std::count(v.begin(), v.end(), true)); }
}  // namespace

TEST(TextEncoderElement, CaptionDropoutGivesTheEmptyCaptionPerSampleAndEpoch) {
  ASSERT_TRUE(refs().file);
  const size_t n = 64;
  const DropoutRun all = run_dropout(1.0, 5, 1, n);
  EXPECT_EQ(count(all.dropped), n) << "caption-dropout=1: every embedding is the empty caption's";
  EXPECT_EQ(all.posted, n);
  const DropoutRun none = run_dropout(0.0, 5, 1, n);
  EXPECT_EQ(count(none.dropped), 0u);
  EXPECT_EQ(none.posted, 0u);
  const DropoutRun a = run_dropout(0.5, 5, 1, n), again = run_dropout(0.5, 5, 1, n), next = run_dropout(0.5, 5, 2, n);
  EXPECT_EQ(a.dropped, again.dropped) << "the same seed, ids and epoch drop the same samples";
  EXPECT_NE(a.dropped, next.dropped) << "another epoch drops others";
  EXPECT_EQ(a.posted, count(a.dropped));
  EXPECT_GT(count(a.dropped), n / 4);  // 64 draws of p = 0.5: outside [16, 48] has probability < 1e-4
  EXPECT_LT(count(a.dropped), 3 * n / 4);
  // The empty caption is encoded once at start, the caption once: dropping costs no encoder call.
  EXPECT_EQ(a.encoded, 1u);
}
