/* textencoder's native path against transformers and the diffusers pipelines (tests/reference/
 * text_encoder: t5_v11_tiny as CogVideoX's T5, umt5_tiny as Wan's umT5, six captions): ids and masks
 * exactly, Wan's prompt cleaning, both embedding conventions to 1e-5, and folders that do not fit
 * failing with the file named, through the engine and through the element. */
#include <gst/gst.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <filesystem>
#include <nlohmann/json.hpp>

#include "../models/ref_cases.h"
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
    EXPECT_EQ(wan_prompt_clean(caps[i]), cleaned[i]);
    auto w = tok.encode(wan_prompt_clean(caps[i]), 32);
    EXPECT_EQ(w.ids, row(wan.get("input_ids.wan"), i));
    EXPECT_EQ(w.mask, row(wan.get("attention_mask.wan"), i));
  }
  EXPECT_EQ(wan_prompt_clean("  Two   people &amp; a horse\n walking on the  beach  "),
            "Two people & a horse walking on the beach");
  // Twice unescaped, as pipeline_wan's basic_clean; Unicode spaces collapse too.
  EXPECT_EQ(wan_prompt_clean("a &amp;lt;b&amp;gt;\xC2\xA0\xE3\x80\x80 c&#32;&#x41;&nbsp;"), "a <b> c A");
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
