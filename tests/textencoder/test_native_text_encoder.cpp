/* textencoder's native path against transformers and the diffusers pipelines (tests/reference/
 * text_encoder: t5_v11_tiny as CogVideoX's T5, umt5_tiny as Wan's umT5, six captions): ids and masks
 * exactly, Wan's prompt cleaning, both embedding conventions to 1e-5, and folders that do not fit
 * failing with the file named, through the engine and through the element. */
#include <gst/check/gstharness.h>
#include <gst/gst.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <sys/stat.h>

#include <filesystem>
#include <nlohmann/json.hpp>

#include "../models/ref_cases.h"
#include "metas.h"
#include "tensor_buffer.h"
#include "test_util.h"
#include "textencoder/prompt_clean.h"
#include "textencoder/t5_tokenizer.h"
#include "textencoder/text_encoder_engine.h"

using namespace videotrain;
using namespace videotrain::text;
using modeltest::RefFile;
using modeltest::rel_l2;
namespace fs = std::filesystem;

namespace {

std::string te_dir(const std::string &name) { return vttest::reference_dir() + "/text_encoder/" + name; }

std::vector<std::string> captions() {
  return nlohmann::json::parse(vttest::read_file(te_dir("captions.json"))).get<std::vector<std::string>>();
}

TextEncoderOptions options(const std::string &folder, int max_length) {
  TextEncoderOptions o;
  o.tokenizer = o.model = folder;
  o.max_length = max_length;
  o.device = "cpu";
  o.dtype = "float32";
  return o;
}

struct Encoded {
  at::Tensor embeds, mask;
};

Encoded encode_all(const TextEncoderOptions &o, const std::vector<std::string> &caps) {
  std::string err;
  auto e = TextEncoderEngine::create(o, &err);
  EXPECT_TRUE(e) << err;
  if (!e) return {};
  std::vector<TextRequest> reqs;
  for (size_t i = 0; i < caps.size(); i++) reqs.push_back({caps[i], i, 0});
  auto out = e->encode(reqs);
  std::vector<at::Tensor> em, ma;
  for (auto &t : out) em.push_back(t.embeds), ma.push_back(t.mask);
  return {torch::stack(em), torch::stack(ma)};
}

std::vector<int64_t> row(const at::Tensor &t, int64_t i) {
  auto r = t[i].contiguous();
  return std::vector<int64_t>(r.data_ptr<int64_t>(), r.data_ptr<int64_t>() + r.numel());
}

// A writable copy of a reference folder.
std::string copy_folder(const std::string &name, const vttest::TempDir &tmp) {
  const std::string out = tmp.file(name);
  fs::copy(te_dir(name), out, fs::copy_options::recursive);
  for (const auto &e : fs::directory_iterator(out))
    fs::permissions(e.path(), fs::perms::owner_write, fs::perm_options::add);
  return out;
}

void edit_json(const std::string &path, const std::function<void(nlohmann::json &)> &f) {
  auto j = nlohmann::json::parse(vttest::read_file(path));
  f(j);
  vttest::write_file(path, j.dump(2));
}

}  // namespace

TEST(NativeTextEncoder, TokenizerFolderGivesTheReferenceIdsAndMasks) {
  const auto caps = captions();
  ASSERT_EQ(caps.size(), 6u);
  RefFile t5("text_encoder/t5_v11_tiny/cases.safetensors"), wan("text_encoder/umt5_tiny/cases.safetensors");
  T5Tokenizer tok(te_dir("t5_v11_tiny"));  // the folder: spiece.model and the JSON files
  EXPECT_EQ(tok.vocab_size(), 400);         // 300 pieces and 100 sentinels
  EXPECT_EQ(tok.eos_id(), 1);
  EXPECT_EQ(tok.pad_id(), 0);
  const auto cleaned = nlohmann::json::parse(wan.meta("cleaned_captions")).get<std::vector<std::string>>();
  for (int64_t i = 0; i < 6; i++) {
    SCOPED_TRACE("caption " + std::to_string(i));
    auto c = tok.encode(caps[i], 226);
    EXPECT_EQ(c.ids, row(t5.get("input_ids.cogvideox"), i));
    EXPECT_EQ(c.mask, row(t5.get("attention_mask.cogvideox"), i));
    EXPECT_EQ(prompt_clean(caps[i]), cleaned[i]);
    auto w = tok.encode(prompt_clean(caps[i]), 32);
    EXPECT_EQ(w.ids, row(wan.get("input_ids.wan"), i));
    EXPECT_EQ(w.mask, row(wan.get("attention_mask.wan"), i));
  }
  EXPECT_EQ(prompt_clean("  Two   people &amp; a horse\n walking on the  beach  "),
            "Two people & a horse walking on the beach");
  // Twice unescaped, as pipeline_wan's basic_clean; Unicode spaces collapse too.
  EXPECT_EQ(prompt_clean("a &amp;lt;b&amp;gt;\xC2\xA0\xE3\x80\x80 c&#32;&#x41;&nbsp;"), "a <b> c A");
}

// Python's html.unescape on numeric references (values from Python 3.11) and its legacy names.
TEST(NativeTextEncoder, HtmlUnescapeFollowsPython) {
  EXPECT_EQ(html_unescape("&#129;|&#150;|&#0;|&#x1F600;|&#1;|&#13;|&#xFFFF;|&#99999999;"),
            "\xC2\x81|\xE2\x80\x93|\xEF\xBF\xBD|\xF0\x9F\x98\x80||\r||\xEF\xBF\xBD");
  EXPECT_EQ(html_unescape("&amp &lt;&unknown; &#; &#x; & x"), "& <&unknown; &#; &#x; & x");
  EXPECT_EQ(whitespace_clean("\t a\xE2\x80\x83" "b \n"), "a b");  // U+2003 em space
}

TEST(NativeTextEncoder, CogVideoXConventionIsTheUnmaskedOutput) {
  RefFile ref("text_encoder/t5_v11_tiny/cases.safetensors");
  auto o = options(te_dir("t5_v11_tiny"), 226);
  o.batch_size = 4;  // two forward calls
  const auto e = encode_all(o, captions());
  ASSERT_TRUE(e.embeds.defined());
  const double err = rel_l2(e.embeds, ref.get("last_hidden_state.cogvideox.nomask"));
  std::printf("cogvideox convention: %.2g\n", err);
  EXPECT_LT(err, 1e-5);
  EXPECT_TRUE(torch::equal(e.mask, ref.get("attention_mask.cogvideox")));
  // Padding rows are the encoder's output there, not zeros (the pipeline passes them on).
  EXPECT_GT(e.embeds[0].slice(0, 100).abs().sum().item<double>(), 0.0);
}

TEST(NativeTextEncoder, WanConventionIsTheMaskedOutputTrimmedAndZeroPadded) {
  RefFile ref("text_encoder/umt5_tiny/cases.safetensors");
  const auto e = encode_all(options(te_dir("umt5_tiny"), 32), captions());
  ASSERT_TRUE(e.embeds.defined());
  const double err = rel_l2(e.embeds, ref.get("prompt_embeds.wan"));
  std::printf("wan convention: %.2g\n", err);
  EXPECT_LT(err, 1e-5);
  EXPECT_TRUE(torch::equal(e.mask, ref.get("attention_mask.wan")));
  EXPECT_EQ(e.embeds[3].slice(0, 1).abs().sum().item<double>(), 0.0) << "empty caption: one row, then zeros";
  EXPECT_GT(e.embeds[3][0].abs().sum().item<double>(), 0.0);
}

TEST(NativeTextEncoder, ConventionAndCleaningCanBeOverridden) {
  RefFile ref("text_encoder/umt5_tiny/cases.safetensors");
  const auto caps = captions();
  auto o = options(te_dir("umt5_tiny"), 32);
  o.embedding_convention = "cogvideox";  // umT5 weights, CogVideoX's way: no mask, no cleaning
  auto e = encode_all(o, caps);
  ASSERT_TRUE(e.embeds.defined());
  EXPECT_LT(rel_l2(e.embeds.slice(0, 0, 5), ref.get("last_hidden_state.wan.nomask").slice(0, 0, 5)), 1e-5);
  o.embedding_convention = "wan";
  o.clean_prompts = false;
  e = encode_all(o, caps);
  ASSERT_TRUE(e.embeds.defined());
  EXPECT_LT(rel_l2(e.embeds.slice(0, 0, 5), ref.get("prompt_embeds.wan").slice(0, 0, 5)), 1e-5);
  EXPECT_FALSE(torch::equal(e.mask[5], ref.get("attention_mask.wan")[5])) << "the HTML caption was not cleaned";
  o.embedding_convention = "sd3";
  std::string err;
  EXPECT_FALSE(TextEncoderEngine::create(o, &err));
  EXPECT_NE(err.find("embedding-convention"), std::string::npos) << err;
}

TEST(NativeTextEncoder, FoldersThatDoNotFitNameTheFile) {
  vttest::TempDir tmp;
  std::string err;
  {  // wrong class
    const std::string d = copy_folder("t5_v11_tiny", tmp);
    edit_json(d + "/config.json", [](nlohmann::json &j) { j["architectures"] = {"T5ForConditionalGeneration"}; });
    EXPECT_FALSE(TextEncoderEngine::create(options(d, 16), &err));
    EXPECT_NE(err.find(d + "/config.json"), std::string::npos) << err;
    EXPECT_NE(err.find("architectures"), std::string::npos) << err;
    EXPECT_NE(err.find("property model"), std::string::npos) << err;
    fs::remove_all(d);
  }
  {  // a tensor missing
    const std::string d = copy_folder("umt5_tiny", tmp);
    auto o = options(d, 16);
    edit_json(d + "/config.json", [](nlohmann::json &j) { j["num_layers"] = 3; });
    EXPECT_FALSE(TextEncoderEngine::create(o, &err));
    EXPECT_NE(err.find("model.safetensors"), std::string::npos) << err;
    EXPECT_NE(err.find("encoder.block.2."), std::string::npos) << err;
    // With cache-dir the weights load at the first uncached caption: the same error then.
    o.cache_dir = tmp.file("cache");
    auto e = TextEncoderEngine::create(o, &err);
    ASSERT_TRUE(e) << err;
    try {
      e->encode({{"a caption", 0, 0}});
      ADD_FAILURE() << "encoded with a folder that lacks block 2";
    } catch (const std::runtime_error &ex) {
      EXPECT_NE(std::string(ex.what()).find("encoder.block.2."), std::string::npos) << ex.what();
      EXPECT_NE(std::string(ex.what()).find("property model"), std::string::npos) << ex.what();
    }
    fs::remove_all(d);
  }
  {  // a tokenizer with more ids than the encoder's vocabulary
    const std::string d = copy_folder("umt5_tiny", tmp);
    edit_json(d + "/tokenizer_config.json", [](nlohmann::json &j) {
      j.erase("added_tokens_decoder");
      j["extra_ids"] = 200;
    });
    fs::remove(d + "/added_tokens.json");
    EXPECT_FALSE(TextEncoderEngine::create(options(d, 16), &err));
    EXPECT_NE(err.find(d + "/tokenizer_config.json"), std::string::npos) << err;
    EXPECT_NE(err.find(d + "/config.json"), std::string::npos) << err;
    EXPECT_NE(err.find("vocab_size 448"), std::string::npos) << err;
    fs::remove_all(d);
  }
  {  // a special token the vocabulary lacks
    const std::string d = copy_folder("umt5_tiny", tmp);
    edit_json(d + "/special_tokens_map.json", [](nlohmann::json &j) { j["eos_token"] = "<eos>"; });
    EXPECT_FALSE(TextEncoderEngine::create(options(d, 16), &err));
    EXPECT_NE(err.find(d + "/special_tokens_map.json"), std::string::npos) << err;
    EXPECT_NE(err.find("<eos>"), std::string::npos) << err;
  }
  // Hostile files in the tokenizer folder: refused at once, not read forever (issue 28).
  for (const char *name : {"spiece.model", "tokenizer_config.json"}) {
    SCOPED_TRACE(name);
    fs::remove_all(tmp.file("umt5_tiny"));
    const std::string d = copy_folder("umt5_tiny", tmp);
    fs::remove(d + "/" + name);
    ASSERT_EQ(mkfifo((d + "/" + name).c_str(), 0600), 0);
    EXPECT_FALSE(TextEncoderEngine::create(options(d, 16), &err));
    EXPECT_NE(err.find(d + "/" + name), std::string::npos) << err;
    EXPECT_NE(err.find("not a regular file"), std::string::npos) << err;
    fs::remove_all(d);
  }
}

// The element posts the engine's message as its error at start.
TEST(NativeTextEncoder, TheElementFailsAtStartNamingTheFile) {
  vttest::TempDir tmp;
  const std::string d = copy_folder("umt5_tiny", tmp);
  edit_json(d + "/config.json", [](nlohmann::json &j) { j["feed_forward_proj"] = "relu"; });
  GstElement *e = gst_element_factory_make("textencoder", nullptr);
  ASSERT_NE(e, nullptr) << "textencoder not found (GST_PLUGIN_PATH?)";
  g_object_set(e, "tokenizer", d.c_str(), "model", d.c_str(), "max-length", 16u, "device", "cpu", nullptr);
  GstBus *bus = gst_bus_new();
  gst_element_set_bus(e, bus);
  EXPECT_EQ(gst_element_set_state(e, GST_STATE_PAUSED), GST_STATE_CHANGE_FAILURE);
  GstMessage *m = gst_bus_pop_filtered(bus, GST_MESSAGE_ERROR);
  ASSERT_NE(m, nullptr);
  GError *err = nullptr;
  gchar *debug = nullptr;
  gst_message_parse_error(m, &err, &debug);
  const std::string text = std::string(err->message) + " " + (debug ? debug : "");
  EXPECT_NE(text.find(d + "/config.json"), std::string::npos) << text;
  EXPECT_NE(text.find("feed_forward_proj"), std::string::npos) << text;
  g_error_free(err);
  g_free(debug);
  gst_message_unref(m);
  gst_element_set_state(e, GST_STATE_NULL);
  gst_element_set_bus(e, nullptr);
  gst_object_unref(bus);
  gst_object_unref(e);
  gchar *conv = nullptr;
  GstElement *f = gst_element_factory_make("textencoder", nullptr);
  gboolean clean = FALSE;
  g_object_get(f, "embedding-convention", &conv, "clean-prompts", &clean, nullptr);
  EXPECT_STREQ(conv, "auto");
  EXPECT_TRUE(clean);
  g_free(conv);
  gst_object_unref(f);
}

// With cache-dir, a run whose captions are all cached never loads the encoder, and says so.
TEST(NativeTextEncoder, CachedCaptionsNeedNoEncoder) {
  vttest::TempDir tmp;
  const auto caps = captions();
  auto o = options(te_dir("umt5_tiny"), 32);
  o.cache_dir = tmp.file("cache");
  std::string err;
  std::vector<TextRequest> reqs;
  for (size_t i = 0; i < caps.size(); i++) reqs.push_back({caps[i], i, 0});
  at::Tensor first;
  {
    auto e = TextEncoderEngine::create(o, &err);
    ASSERT_TRUE(e) << err;
    auto out = e->encode(reqs);
    EXPECT_TRUE(e->encoder_loaded());
    EXPECT_EQ(e->stats().cache_writes, 6u);
    first = out[5].embeds;
  }
  auto e = TextEncoderEngine::create(o, &err);
  ASSERT_TRUE(e) << err;
  EXPECT_FALSE(e->encoder_loaded());
  EXPECT_EQ(e->embed_dim(), 32);
  auto out = e->encode(reqs);
  EXPECT_FALSE(e->encoder_loaded()) << "every caption was in cache-dir";
  EXPECT_EQ(e->stats().cache_reads, 6u);
  EXPECT_EQ(e->stats().encoded, 0u);
  EXPECT_TRUE(torch::equal(out[5].embeds, first));
  RefFile ref("text_encoder/umt5_tiny/cases.safetensors");
  EXPECT_LT(rel_l2(out[2].embeds, ref.get("prompt_embeds.wan")[2]), 1e-5);
  e->encode({{"a caption no run has seen", 9, 0}});
  EXPECT_TRUE(e->encoder_loaded());
  EXPECT_EQ(e->stats().encoded, 1u);

  // The element: its summary at EOS says the encoder was not loaded.
  GstElement *el = gst_element_factory_make("textencoder", nullptr);
  ASSERT_NE(el, nullptr);
  const std::string dir = te_dir("umt5_tiny");
  g_object_set(el, "tokenizer", dir.c_str(), "model", dir.c_str(), "max-length", 32u, "device", "cpu", "dtype",
               "float32", "cache-dir", o.cache_dir.c_str(), nullptr);
  GstHarness *h = gst_harness_new_with_element(el, "sink", "src");
  gst_object_unref(el);
  GstBus *bus = gst_bus_new();
  gst_element_set_bus(h->element, bus);
  gst_harness_set_src_caps_str(h, "application/x-videotrain-tensor, content=(string)latents, dtype=(string)float32, "
                                  "device=(string)cpu");
  for (size_t i = 0; i < caps.size(); i++) {
    GstBuffer *buf = buffer_from_tensor(at::zeros({4, 1, 2, 2}));
    auto *m = gst_buffer_add_videotrain_sample_meta(buf, caps[i].c_str(), "v.mp4");
    m->sample_id = i;
    ASSERT_EQ(gst_harness_push(h, buf), GST_FLOW_OK);
  }
  ASSERT_TRUE(gst_harness_push_event(h, gst_event_new_eos()));
  EXPECT_EQ(gst_harness_buffers_received(h), caps.size());
  GstMessage *msg = nullptr;
  while ((msg = gst_bus_pop_filtered(bus, GST_MESSAGE_ELEMENT))) {
    const GstStructure *s = gst_message_get_structure(msg);
    if (gst_structure_has_name(s, "textencoder-summary")) break;
    gst_message_unref(msg);
  }
  ASSERT_NE(msg, nullptr) << "no textencoder-summary";
  const GstStructure *s = gst_message_get_structure(msg);
  gboolean loaded = TRUE;
  guint64 reads = 0, encoded = 9;
  EXPECT_TRUE(gst_structure_get_boolean(s, "encoder-loaded", &loaded));
  EXPECT_TRUE(gst_structure_get_uint64(s, "cache-reads", &reads));
  EXPECT_TRUE(gst_structure_get_uint64(s, "encoded", &encoded));
  EXPECT_FALSE(loaded);
  EXPECT_EQ(reads, 6u);
  EXPECT_EQ(encoded, 0u);
  gst_message_unref(msg);
  gst_element_set_bus(h->element, nullptr);
  gst_object_unref(bus);
  gst_harness_teardown(h);
}
