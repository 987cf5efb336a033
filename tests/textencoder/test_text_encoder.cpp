// textencoder's tokenizer and engine against independent references (tests/textencoder/
// make_text_refs.py): python3-sentencepiece's ids with T5's rules, and the same TorchScript
// encoder run from PyTorch.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <nlohmann/json.hpp>

#include <cstdlib>
#include <cstring>
#include <set>

#include "latent_store.h"
#include "safetensors.h"
#include "test_util.h"
#include "textencoder/t5_tokenizer.h"
#include "textencoder/text_encoder_engine.h"

using namespace videotrain;
using namespace videotrain::text;

namespace {

struct Refs {
  vttest::TempDir dir;
  std::vector<std::string> captions;
  size_t max_length = 0;
  std::unique_ptr<SafetensorsFile> file;

  Refs() {
    const std::string py = vttest::env_or("PYTHON", "/usr/bin/python3");
    const std::string script = vttest::env_or("VIDEOTRAIN_SOURCE_DIR", ".") + "/tests/textencoder/make_text_refs.py";
    if (std::system((py + " " + script + " " + dir.path() + " >/dev/null").c_str()) != 0) return;
    std::string err;
    file = SafetensorsFile::open(dir.file("refs.safetensors"), &err);
    if (!file) return;
    captions = nlohmann::json::parse(file->metadata().at("captions")).get<std::vector<std::string>>();
    max_length = std::stoul(file->metadata().at("max_length"));
  }
  at::Tensor tensor(const std::string &name) const {
    const SafetensorsEntry *e = file->find(name);
    auto type = e->dtype == "I64" ? torch::kLong : torch::kFloat;
    return torch::from_blob(const_cast<uint8_t *>(e->data), e->shape, type).clone();
  }
  std::vector<int64_t> ids(size_t i, const char *what) const {
    at::Tensor t = tensor(std::string(what) + "." + std::to_string(i));
    return std::vector<int64_t>(t.data_ptr<int64_t>(), t.data_ptr<int64_t>() + t.numel());
  }
  TextEncoderOptions options(const std::string &model = "text_encoder.pt") const {
    TextEncoderOptions o;
    o.tokenizer = dir.file("spiece.model");
    o.model = dir.file(model);
    o.max_length = static_cast<int>(max_length);
    o.device = "cpu";
    return o;
  }
};

const Refs &refs() {
  static Refs r;
  return r;
}

std::vector<TextRequest> requests(const std::vector<std::string> &captions) {
  std::vector<TextRequest> out;
  for (size_t i = 0; i < captions.size(); i++) out.push_back({captions[i], i, 0});
  return out;
}

}  // namespace

TEST(T5Tokenizer, IdsAndMasksEqualSentencePiecesWithT5Rules) {
  const Refs &r = refs();
  ASSERT_TRUE(r.file) << "make_text_refs.py failed";
  ASSERT_GE(r.captions.size(), 8u);
  T5Tokenizer tok(r.dir.file("spiece.model"));
  EXPECT_EQ(tok.eos_id(), 1);
  EXPECT_EQ(tok.pad_id(), 0);
  for (size_t i = 0; i < r.captions.size(); i++) {
    TokenizedCaption t = tok.encode(r.captions[i], r.max_length);
    EXPECT_EQ(t.ids, r.ids(i, "ids")) << "caption " << i << ": '" << r.captions[i] << "'";
    EXPECT_EQ(t.mask, r.ids(i, "mask")) << "caption " << i;
  }
  // The long caption fills max_length with EOS last; the empty one is EOS alone.
  TokenizedCaption longest = tok.encode(r.captions.back(), r.max_length);
  EXPECT_EQ(longest.ids.back(), tok.eos_id());
  EXPECT_EQ(longest.mask, std::vector<int64_t>(r.max_length, 1));
  TokenizedCaption empty = tok.encode("", r.max_length);
  EXPECT_EQ(empty.ids[0], tok.eos_id());
  EXPECT_EQ(empty.mask[0], 1);
  EXPECT_EQ(empty.mask[1], 0);
  EXPECT_NE(tok.digest(), 0u);
}

TEST(T5Tokenizer, AFileThatIsNotAModelIsAnErrorNamingIt) {
  vttest::TempDir d;
  vttest::write_file(d.file("spiece.model"), "not a sentencepiece model");
  try {
    T5Tokenizer tok(d.file("spiece.model"));
    FAIL() << "loaded garbage";
  } catch (const std::runtime_error &e) {
    EXPECT_NE(std::string(e.what()).find(d.file("spiece.model")), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("tokenizer"), std::string::npos) << e.what();
  }
  EXPECT_THROW(T5Tokenizer(d.file("missing.model")), std::runtime_error);
}

TEST(TextEncoderEngine, EmbeddingsEqualTheModulesOutputFromPython) {
  const Refs &r = refs();
  ASSERT_TRUE(r.file);
  for (const char *model : {"text_encoder.pt", "tuple_encoder.pt"}) {
    std::string err;
    auto e = TextEncoderEngine::create(r.options(model), &err);
    ASSERT_TRUE(e) << err;
    EXPECT_EQ(e->embed_dim(), 12);
    EXPECT_EQ(e->dtype_name(), "float32");
    auto out = e->encode(requests(r.captions));
    ASSERT_EQ(out.size(), r.captions.size());
    for (size_t i = 0; i < out.size(); i++) {
      at::Tensor want = r.tensor("embeds." + std::to_string(i));
      ASSERT_EQ(out[i].embeds.sizes(), want.sizes()) << model << " caption " << i;
      EXPECT_TRUE(torch::allclose(out[i].embeds, want, 1e-5, 1e-6))
          << model << " caption " << i << ": max diff " << (out[i].embeds - want).abs().max().item<float>();
      at::Tensor mask = r.tensor("mask." + std::to_string(i));
      EXPECT_TRUE(torch::equal(out[i].mask, mask)) << model << " caption " << i;
      EXPECT_FALSE(out[i].dropped);
    }
  }
}

TEST(TextEncoderEngine, EachDistinctCaptionIsEncodedOnceInBatches) {
  const Refs &r = refs();
  ASSERT_TRUE(r.file);
  TextEncoderOptions o = r.options();
  o.batch_size = 3;
  std::string err;
  auto e = TextEncoderEngine::create(o, &err);
  ASSERT_TRUE(e) << err;
  // 7 distinct non-empty captions (the empty one is cached at start), each twice.
  std::vector<std::string> caps(r.captions.begin(), r.captions.end());
  caps.erase(caps.begin() + 1);  // ""
  caps.resize(7);
  std::vector<std::string> twice = caps;
  twice.insert(twice.end(), caps.begin(), caps.end());
  auto first = e->encode(requests(twice));
  EXPECT_EQ(e->stats().encoded, 7u);
  EXPECT_EQ(e->stats().forward_calls, 3u);  // 3 + 3 + 1
  for (size_t i = 0; i < caps.size(); i++) EXPECT_TRUE(torch::equal(first[i].embeds, first[i + 7].embeds));
  e->encode(requests(caps));
  EXPECT_EQ(e->stats().encoded, 7u) << "cached captions were encoded again";
  EXPECT_EQ(e->stats().captions, 21u);

  // A cache of 2 entries: captions come back (recomputed), equal to the first answers.
  o.cache_entries = 2;
  auto small = TextEncoderEngine::create(o, &err);
  ASSERT_TRUE(small) << err;
  auto a = small->encode(requests(caps));
  auto b = small->encode(requests(caps));
  EXPECT_GT(small->stats().encoded, 7u);
  for (size_t i = 0; i < caps.size(); i++) EXPECT_TRUE(torch::equal(a[i].embeds, b[i].embeds)) << i;
}

// cache-dir: a second run reads every caption from the folder (no forward call) and gets the
// same bytes; another max-length misses; a damaged entry is a warning and is encoded again.
TEST(TextEncoderEngine, CacheDirKeepsEmbeddingsAcrossRuns) {
  const Refs &r = refs();
  ASSERT_TRUE(r.file);
  vttest::TempDir cache;
  TextEncoderOptions o = r.options();
  o.cache_dir = cache.file("c");
  std::vector<std::string> caps(r.captions.begin(), r.captions.begin() + 5);
  std::string err;
  auto first = TextEncoderEngine::create(o, &err);
  ASSERT_TRUE(first) << err;
  auto a = first->encode(requests(caps));
  const uint64_t written = first->stats().cache_writes;
  EXPECT_GE(written, 4u);  // the distinct captions encoded (the empty one may come from start-up)
  auto second = TextEncoderEngine::create(o, &err);
  ASSERT_TRUE(second) << err;
  auto b = second->encode(requests(caps));
  EXPECT_EQ(second->stats().encoded, 0u) << "cached captions were encoded again";
  EXPECT_EQ(second->stats().cache_reads, written);
  for (size_t i = 0; i < caps.size(); i++) {
    EXPECT_TRUE(torch::equal(a[i].embeds, b[i].embeds)) << i;
    EXPECT_TRUE(torch::equal(a[i].mask, b[i].mask)) << i;
  }
  TextEncoderOptions shorter = o;
  shorter.max_length = o.max_length - 1;
  auto other = TextEncoderEngine::create(shorter, &err);
  ASSERT_TRUE(other) << err;
  other->encode(requests(caps));
  EXPECT_EQ(other->stats().cache_reads, 0u);
  EXPECT_GE(other->stats().encoded, 4u);
  // Damage every entry: read as unusable, with one warning, and encoded again to the same values.
  for (const auto &f : LatentStore::open(o.cache_dir, false, &err)->list()) vttest::write_file(f.path, "damaged");
  auto third = TextEncoderEngine::create(o, &err);
  ASSERT_TRUE(third) << err;
  auto c = third->encode(requests(caps));
  EXPECT_EQ(third->stats().cache_reads, 0u);
  EXPECT_NE(third->take_warning().find("unusable text cache entry"), std::string::npos);
  for (size_t i = 0; i < caps.size(); i++) EXPECT_TRUE(torch::equal(a[i].embeds, c[i].embeds)) << i;
}

TEST(TextEncoderEngine, CaptionDropoutIsSeededBySampleAndEpoch) {
  const Refs &r = refs();
  ASSERT_TRUE(r.file);
  TextEncoderOptions o = r.options();
  std::string err;
  auto plain = TextEncoderEngine::create(o, &err);
  ASSERT_TRUE(plain) << err;
  at::Tensor empty = plain->encode({{"", 0, 0}})[0].embeds;
  o.caption_dropout = 1.0;
  auto all = TextEncoderEngine::create(o, &err);
  ASSERT_TRUE(all) << err;
  for (auto &x : all->encode(requests({r.captions[0], r.captions[2]}))) {
    EXPECT_TRUE(x.dropped);
    EXPECT_TRUE(torch::equal(x.embeds, empty));
  }
  for (double p : {0.5, 0.25}) {
    o.caption_dropout = p;
    auto a = TextEncoderEngine::create(o, &err), b = TextEncoderEngine::create(o, &err);
    ASSERT_TRUE(a && b) << err;
    int dropped = 0, differs_by_epoch = 0;
    for (uint64_t s = 0; s < 2000; s++) {
      EXPECT_EQ(a->drops(s, 3), b->drops(s, 3)) << "sample " << s;  // same run settings: same draws (resume)
      dropped += a->drops(s, 3);
      differs_by_epoch += a->drops(s, 3) != a->drops(s, 4);
    }
    EXPECT_NEAR(dropped / 2000.0, p, 0.04) << p;  // 4 standard deviations at p = 0.5
    EXPECT_GT(differs_by_epoch, 2000 * 2 * p * (1 - p) - 150) << p;  // two independent draws differ 2p(1-p)
  }
  auto a = TextEncoderEngine::create(o, &err);
  ASSERT_TRUE(a) << err;
  o.seed = 1;
  auto other = TextEncoderEngine::create(o, &err);
  int differs_by_seed = 0;
  for (uint64_t s = 0; s < 2000; s++) differs_by_seed += other->drops(s, 3) != a->drops(s, 3);
  EXPECT_GT(differs_by_seed, 300);
  auto out = a->encode({{r.captions[0], 7, 3}});
  EXPECT_EQ(out[0].dropped, a->drops(7, 3));
}

TEST(TextEncoderEngine, BadSettingsAndModelsAreErrorsNamingWhatToChange) {
  const Refs &r = refs();
  ASSERT_TRUE(r.file);
  auto error_of = [](const TextEncoderOptions &o) {
    std::string err;
    auto e = TextEncoderEngine::create(o, &err);
    EXPECT_FALSE(e);
    return err;
  };
  EXPECT_NE(error_of(r.options("bad_shape_encoder.pt")).find("expected [B, L, D]"), std::string::npos);
  EXPECT_NE(error_of(r.options("missing.pt")).find("property model"), std::string::npos);
  TextEncoderOptions o = r.options();
  o.tokenizer = r.dir.file("text_encoder.pt");
  EXPECT_NE(error_of(o).find("property tokenizer"), std::string::npos);
  o = r.options();
  o.model.clear();
  EXPECT_NE(error_of(o).find("set the model property"), std::string::npos);
  o = r.options();
  o.caption_dropout = 1.5;
  EXPECT_NE(error_of(o).find("caption-dropout"), std::string::npos);
  o = r.options();
  o.dtype = "int8";
  EXPECT_NE(error_of(o).find("dtype"), std::string::npos);
}

TEST(TextEncoderEngine, Bfloat16OutputIsTheFloatOutputRounded) {
  const Refs &r = refs();
  ASSERT_TRUE(r.file);
  TextEncoderOptions o = r.options();
  o.dtype = "bfloat16";
  std::string err;
  auto e = TextEncoderEngine::create(o, &err);
  ASSERT_TRUE(e) << err;
  auto out = e->encode(requests({r.captions[0]}));
  EXPECT_EQ(out[0].embeds.scalar_type(), torch::kBFloat16);
  EXPECT_TRUE(torch::equal(out[0].embeds, r.tensor("embeds.0").to(torch::kBFloat16)));
}
