/* The native T5 v1.1 / umT5 encoders against transformers' T5EncoderModel / UMT5EncoderModel
 * (tests/reference/text_encoder: t5_v11_tiny, umt5_tiny): hidden states with and without the mask;
 * a sharded bf16 folder written here equals the fp32 one to bf16 tolerance; folders that must not
 * load say which file and what. */
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "models/t5_config.h"
#include "models/t5_encoder.h"
#include "ref_cases.h"
#include "test_util.h"

using namespace videotrain::models;
using modeltest::RefFile;
using modeltest::rel_l2;
namespace fs = std::filesystem;

namespace {

std::string te_dir(const std::string &name) { return vttest::reference_dir() + "/text_encoder/" + name; }

std::string read_text(const std::string &path) {
  std::ifstream f(path);
  return std::string(std::istreambuf_iterator<char>(f), {});
}

// A copy of a reference folder that a test may spoil.
std::string copy_folder(const std::string &name, const vttest::TempDir &tmp) {
  const std::string out = tmp.file(name);
  fs::copy(te_dir(name), out, fs::copy_options::recursive);
  for (const auto &e : fs::directory_iterator(out))
    fs::permissions(e.path(), fs::perms::owner_write, fs::perm_options::add);
  return out;
}

void check_cases(const std::string &name, const std::string &conv) {
  auto enc = T5Encoder::open(te_dir(name), torch::kCPU, torch::kFloat);
  RefFile cases("text_encoder/" + name + "/cases.safetensors");
  ASSERT_TRUE(cases.ok());
  const auto ids = cases.get("input_ids." + conv), mask = cases.get("attention_mask." + conv);
  const double masked = rel_l2(enc->forward(ids, mask), cases.get("last_hidden_state." + conv + ".masked"));
  const double nomask = rel_l2(enc->forward(ids), cases.get("last_hidden_state." + conv + ".nomask"));
  std::printf("%s: masked %.2g, unmasked %.2g\n", name.c_str(), masked, nomask);
  EXPECT_LT(masked, 1e-5);
  EXPECT_LT(nomask, 1e-5);
  // One caption at a time gives the batch's rows (no state leaks between rows).
  auto one = enc->forward(ids.slice(0, 4, 5), mask.slice(0, 4, 5));
  EXPECT_LT(rel_l2(one[0], cases.get("last_hidden_state." + conv + ".masked")[4]), 1e-5);
}

}  // namespace

TEST(T5Config, ReadsBothFamilies) {
  T5Config c;
  std::string err;
  ASSERT_TRUE(parse_t5_config(read_text(te_dir("t5_v11_tiny/config.json")), &c, &err)) << err;
  EXPECT_FALSE(c.umt5);
  EXPECT_EQ(c.class_name, "T5EncoderModel");
  EXPECT_EQ(c.d_model, 32);
  EXPECT_EQ(c.vocab_size, 448);
  EXPECT_EQ(c.relative_attention_num_buckets, 32);
  ASSERT_TRUE(parse_t5_config(read_text(te_dir("umt5_tiny/config.json")), &c, &err)) << err;
  EXPECT_TRUE(c.umt5);
  EXPECT_EQ(c.class_name, "UMT5EncoderModel");
  // model_type alone names the family.
  ASSERT_TRUE(parse_t5_config(R"({"model_type": "umt5", "feed_forward_proj": "gated-gelu"})", &c, &err)) << err;
  EXPECT_TRUE(c.umt5);
}

TEST(T5Config, RefusesWhatItDoesNotImplementNamingTheKey) {
  const auto base = nlohmann::json::parse(read_text(te_dir("t5_v11_tiny/config.json")));
  auto refused = [&](const char *key, nlohmann::json value) {
    auto j = base;
    if (value.is_null())
      j.erase(key);
    else
      j[key] = value;
    T5Config c;
    std::string err;
    EXPECT_FALSE(parse_t5_config(j.dump(), &c, &err)) << key;
    EXPECT_NE(err.find(key), std::string::npos) << err;
  };
  refused("architectures", {"T5ForConditionalGeneration"});
  refused("architectures", {"BertModel"});
  refused("feed_forward_proj", "relu");
  refused("feed_forward_proj", nullptr);  // transformers' default is relu
  refused("dense_act_fn", "relu");
  refused("is_decoder", true);
  refused("num_heads", 0);
  refused("relative_attention_num_buckets", 30);
  refused("model_type", "bert");
  refused("model_type", "umt5");  // does not match T5EncoderModel
  // Keys that do not change the encoder are ignored.
  auto j = base;
  j["some_future_key"] = 3;
  j["dropout_rate"] = 0.5;
  T5Config c;
  std::string err;
  EXPECT_TRUE(parse_t5_config(j.dump(), &c, &err)) << err;
}

TEST(T5Encoder, MatchesTransformersT5v11) { check_cases("t5_v11_tiny", "cogvideox"); }
TEST(T5Encoder, MatchesTransformersUmT5) { check_cases("umt5_tiny", "wan"); }

TEST(T5Encoder, ShardedBf16FolderEqualsFp32ToBf16Tolerance) {
  vttest::TempDir tmp;
  for (const std::string name : {"t5_v11_tiny", "umt5_tiny"}) {
    auto fp32 = T5Encoder::open(te_dir(name), torch::kCPU, torch::kFloat);
    const std::string out = tmp.file(name + "_bf16");
    fp32->save(out, torch::kBFloat16, 20000);  // ~14 shards
    ASSERT_TRUE(fs::exists(out + "/model.safetensors.index.json"));
    ASSERT_FALSE(fs::exists(out + "/model.safetensors"));
    auto bf16_as_f32 = T5Encoder::open(out, torch::kCPU, torch::kFloat);
    auto bf16 = T5Encoder::open(out, torch::kCPU, torch::kBFloat16);
    RefFile cases("text_encoder/" + name + "/cases.safetensors");
    const std::string conv = name == "umt5_tiny" ? "wan" : "cogvideox";
    const auto ids = cases.get("input_ids." + conv), mask = cases.get("attention_mask." + conv);
    const auto ref = cases.get("last_hidden_state." + conv + ".masked");
    const auto y32 = bf16_as_f32->forward(ids, mask), y16 = bf16->forward(ids, mask);
    EXPECT_EQ(y16.scalar_type(), torch::kBFloat16);
    std::printf("%s: bf16 weights in fp32 %.3g, bf16 compute %.3g\n", name.c_str(), rel_l2(y32, ref), rel_l2(y16, ref));
    EXPECT_LT(rel_l2(y32, ref), 2e-2);
    EXPECT_GT(rel_l2(y32, ref), 0.0);  // the weights really went through bf16
    EXPECT_LT(rel_l2(y16, ref), 4e-2);
  }
}

TEST(T5Encoder, EmbedTokensMayBeAbsentOrPresent) {
  vttest::TempDir tmp;
  auto fp32 = T5Encoder::open(te_dir("umt5_tiny"), torch::kCPU, torch::kFloat);
  const std::string out = tmp.file("with_embed_tokens");
  fp32->save(out, torch::kFloat, uint64_t(1) << 40);  // writes encoder.embed_tokens.weight too
  auto again = T5Encoder::open(out, torch::kCPU, torch::kFloat);
  RefFile cases("text_encoder/umt5_tiny/cases.safetensors");
  const auto ids = cases.get("input_ids.wan");
  EXPECT_LT(rel_l2(again->forward(ids), cases.get("last_hidden_state.wan.nomask")), 1e-6);
}

TEST(T5Encoder, BadFoldersNameTheFile) {
  vttest::TempDir tmp;
  auto expect_error = [](const std::string &dir, const std::vector<std::string> &parts) {
    try {
      T5Encoder::open(dir, torch::kCPU, torch::kFloat);
      ADD_FAILURE() << dir << " loaded";
    } catch (const std::exception &e) {
      for (const auto &p : parts) EXPECT_NE(std::string(e.what()).find(p), std::string::npos) << e.what();
    }
  };
  {  // wrong class
    const std::string d = copy_folder("t5_v11_tiny", tmp);
    auto j = nlohmann::json::parse(read_text(d + "/config.json"));
    j["architectures"] = {"T5ForConditionalGeneration"};
    std::ofstream(d + "/config.json") << j.dump();
    expect_error(d, {d + "/config.json", "architectures"});
    fs::remove_all(d);
  }
  {  // umT5 config over T5 weights: blocks 1.. lack their relative_attention_bias
    const std::string d = copy_folder("t5_v11_tiny", tmp);
    auto j = nlohmann::json::parse(read_text(d + "/config.json"));
    j["architectures"] = {"UMT5EncoderModel"};
    j["model_type"] = "umt5";
    std::ofstream(d + "/config.json") << j.dump();
    expect_error(d, {"model.safetensors", "encoder.block.1.layer.0.SelfAttention.relative_attention_bias.weight"});
    fs::remove_all(d);
  }
  {  // a missing tensor (the folder written without it)
    auto enc = T5Encoder::open(te_dir("umt5_tiny"), torch::kCPU, torch::kFloat);
    const std::string d = tmp.file("missing");
    enc->save(d, torch::kFloat, 20000);
    const std::string index = d + "/model.safetensors.index.json";
    auto j = nlohmann::json::parse(read_text(index));
    j["weight_map"].erase("encoder.final_layer_norm.weight");
    std::ofstream(index) << j.dump();
    // The shard still holds it: the folder reader refuses a tensor the index does not name, or the
    // loader reports it; either way the message names the index or shard and the tensor.
    try {
      T5Encoder::open(d, torch::kCPU, torch::kFloat);
      ADD_FAILURE() << "loaded without encoder.final_layer_norm.weight in the index";
    } catch (const std::exception &e) {
      EXPECT_NE(std::string(e.what()).find("encoder.final_layer_norm.weight"), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("model"), std::string::npos) << e.what();
    }
  }
  {  // no config.json
    const std::string d = copy_folder("umt5_tiny", tmp);
    fs::remove(d + "/config.json");
    expect_error(d, {"config.json"});
  }
}
