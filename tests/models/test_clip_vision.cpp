/* The native CLIP vision encoder and image processor against transformers' CLIPVisionModel /
 * CLIPVisionModelWithProjection and CLIPImageProcessor (tests/reference/clip_vision, generate.py):
 * every hidden state, the pooled output and the projection; PIL's bicubic resize byte for byte and
 * pixel_values on non-square images (shrunk and grown); configs it refuses name the key; a folder
 * whose weights do not fit names the tensor. imageencoder's engine: image_embeds of condition frames
 * equal the encoder run on the processor's output (and transformers' hidden states), hidden-state
 * picks the entry, cache-dir gives the same bytes without loading the encoder, bad folders name the
 * property. */
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "imageencoder/image_encoder_engine.h"
#include "models/clip_image_processor.h"
#include "models/clip_vision.h"
#include "models/clip_vision_config.h"
#include "ref_cases.h"
#include "test_util.h"

using namespace videotrain::models;
using modeltest::RefFile;
using modeltest::rel_l2;
namespace fs = std::filesystem;

namespace {

std::string ref(const std::string &name) { return vttest::reference_dir() + "/clip_vision/" + name; }

std::string read_text(const std::string &path) {
  std::ifstream f(path);
  return std::string(std::istreambuf_iterator<char>(f), {});
}

}  // namespace

TEST(ClipVision, HiddenStatesMatchTransformers) {
  RefFile cases("clip_vision/cases.safetensors");
  ASSERT_TRUE(cases.ok());
  const auto pixels = cases.get("pixel_values");
  for (const std::string name : {"vit_tiny", "vit_tiny_proj"}) {
    auto enc = ClipVisionEncoder::open(ref(name), torch::kCPU, torch::kFloat);
    const auto &c = enc->config();
    EXPECT_EQ(c.with_projection, name == "vit_tiny_proj");
    EXPECT_EQ(c.hidden_act, name == "vit_tiny_proj" ? "quick_gelu" : "gelu");
    const auto hs = enc->hidden_states(pixels);
    ASSERT_EQ(hs.size(), size_t(c.num_hidden_layers + 1));
    double worst = 0;
    for (size_t i = 0; i < hs.size(); i++) {
      const double r = rel_l2(hs[i], cases.get("hidden_states." + name + "." + std::to_string(i)));
      EXPECT_LT(r, 1e-5) << name << " hidden_states[" << i << "]";
      worst = std::max(worst, r);
    }
    // Wan's hidden_states[-2] stops one block early and equals the full run's entry.
    EXPECT_TRUE(torch::equal(enc->penultimate_hidden_states(pixels), hs[hs.size() - 2]));
    const auto pooled = enc->pooled(hs.back());
    double head;
    if (c.with_projection) {
      head = rel_l2(enc->image_embeds(pooled), cases.get("image_embeds." + name));
    } else {
      head = rel_l2(pooled, cases.get("pooler_output." + name));
      EXPECT_THROW(enc->image_embeds(pooled), std::runtime_error);
    }
    EXPECT_LT(head, 1e-5);
    std::printf("%s: worst hidden state %.2g, %s %.2g\n", name.c_str(), worst,
                c.with_projection ? "image_embeds" : "pooler_output", head);
    // A perturbed input moves the output past the tolerance (the check can fail).
    EXPECT_GT(rel_l2(enc->hidden_states(pixels + 1e-2 * torch::randn(pixels.sizes())).back(), hs.back()), 1e-5);
    EXPECT_THROW(enc->hidden_states(pixels.slice(2, 0, 21)), std::runtime_error);  // not image_size
  }
}

TEST(ClipVision, Bf16WeightsComputeInBf16) {
  // The published image encoders are stored in fp32 or bf16; a bf16 encoder keeps its hidden states in
  // bf16 (LayerNorm and softmax as LibTorch computes them in that dtype, as transformers does).
  RefFile cases("clip_vision/cases.safetensors");
  auto enc = ClipVisionEncoder::open(ref("vit_tiny"), torch::kCPU, torch::kBFloat16);
  const auto h = enc->penultimate_hidden_states(cases.get("pixel_values"));
  EXPECT_EQ(h.scalar_type(), torch::kBFloat16);
  const double r = rel_l2(h.to(torch::kFloat), cases.get("hidden_states.vit_tiny.2"));
  std::printf("bf16: hidden_states[-2] rel L2 %.3g\n", r);
  EXPECT_LT(r, 3e-2);
  EXPECT_GT(r, 1e-5);  // the weights really went through bf16
}

TEST(ClipImageProcessor, ResizeEqualsPilByteForByte) {
  RefFile cases("clip_vision/cases.safetensors");
  const auto processor = ClipImageProcessor::open(ref("image_processor"));
  for (const std::string name : {"down", "up"}) {
    const auto img = cases.get("image." + name), want = cases.get("resized." + name);
    const auto [h, w] = processor.resized_size(img.size(0), img.size(1));
    ASSERT_EQ(std::vector<int64_t>({h, w, 3}), want.sizes().vec()) << name;
    const auto got = resize_like_pil(img, h, w, 3);
    const auto diff = (got.to(torch::kInt) - want.to(torch::kInt)).abs();
    std::printf("%s: %lldx%lld -> %lldx%lld, %lld of %lld bytes differ from PIL (max %d)\n", name.c_str(),
                (long long)img.size(1), (long long)img.size(0), (long long)w, (long long)h,
                (long long)(diff > 0).sum().item<int64_t>(), (long long)diff.numel(), diff.max().item<int>());
    EXPECT_EQ(diff.max().item<int>(), 0) << name;
  }
}

TEST(ClipImageProcessor, PixelValuesMatchTransformers) {
  RefFile cases("clip_vision/cases.safetensors");
  const auto processor = ClipImageProcessor::open(ref("image_processor"));
  const auto want = cases.get("pixel_values");
  int i = 0;
  for (const std::string name : {"down", "up"}) {
    const auto got = processor.process(cases.get("image." + name));
    ASSERT_EQ(got.sizes().vec(), std::vector<int64_t>({3, 28, 28}));
    const double d = (got - want[i++]).abs().max().item<double>();
    std::printf("%s: pixel_values max |diff| %.3g\n", name.c_str(), d);
    EXPECT_LT(d, 1e-6) << name;
  }
  // The image encoder on our own pixel_values: transformers' hidden states.
  auto enc = ClipVisionEncoder::open(ref("vit_tiny"), torch::kCPU, torch::kFloat);
  const auto ours = torch::stack({processor.process(cases.get("image.down")), processor.process(cases.get("image.up"))});
  EXPECT_LT(rel_l2(enc->penultimate_hidden_states(ours), cases.get("hidden_states.vit_tiny.2")), 1e-5);
  EXPECT_THROW(processor.process(cases.get("pixel_values")[0]), std::runtime_error);  // float, not uint8 [H, W, 3]
}

TEST(ClipImageProcessor, CropPadsAndSkipsAsConfigured) {
  ClipProcessorConfig c;
  c.shortest_edge = 8;
  c.crop_height = 10;  // taller than the resized image: zero rows above (1) and below (1)
  c.crop_width = 6;
  c.do_normalize = false;
  const auto img = torch::full({16, 20, 3}, 200, torch::kByte);
  const auto x = ClipImageProcessor(c).process(img);  // 16x20 -> 8x10, crop 10x6
  ASSERT_EQ(x.sizes().vec(), std::vector<int64_t>({3, 10, 6}));
  EXPECT_EQ(x[0][0].abs().max().item<float>(), 0.0f);
  EXPECT_EQ(x[0][9].abs().max().item<float>(), 0.0f);
  EXPECT_NEAR(x[0][5][3].item<float>(), 200.0f / 255.0f, 1e-6);
  c.do_resize = c.do_center_crop = c.do_rescale = false;
  EXPECT_EQ(ClipImageProcessor(c).process(img).sizes().vec(), std::vector<int64_t>({3, 16, 20}));
}

TEST(ClipVisionConfig, ReadsWansImageEncoderAndProcessor) {
  // Wan2.1-I2V-14B's image_encoder/config.json and image_processor/preprocessor_config.json values.
  ClipVisionConfig c;
  std::string err;
  ASSERT_TRUE(parse_clip_vision_config(R"({"architectures": ["CLIPVisionModel"], "model_type": "clip_vision_model",
      "hidden_act": "gelu", "hidden_size": 1280, "image_size": 224, "intermediate_size": 5120, "layer_norm_eps": 1e-05,
      "num_attention_heads": 16, "num_channels": 3, "num_hidden_layers": 32, "patch_size": 14, "projection_dim": 1024,
      "attention_dropout": 0.0, "dropout": 0.0, "initializer_factor": 1.0, "torch_dtype": "float32"})",
                                       &c, &err))
      << err;
  EXPECT_EQ(c.num_positions(), 257);
  EXPECT_FALSE(c.with_projection);
  ClipProcessorConfig p;
  ASSERT_TRUE(parse_clip_processor_config(read_text(ref("image_processor/preprocessor_config.json")), &p, &err)) << err;
  EXPECT_EQ(p.shortest_edge, 28);
  EXPECT_EQ(p.resample, 3);
  // The older int forms: size is the shortest edge, crop_size a square.
  ASSERT_TRUE(parse_clip_processor_config(R"({"size": 224, "crop_size": 224, "feature_extractor_type": "CLIPFeatureExtractor"})", &p, &err)) << err;
  EXPECT_EQ(p.shortest_edge, 224);
  EXPECT_EQ(p.crop_height, 224);
  EXPECT_EQ(p.crop_width, 224);
  EXPECT_EQ(ClipImageProcessor(p).resized_size(480, 832), std::make_pair(int64_t(224), int64_t(388)));
}

TEST(ClipVisionConfig, RefusesWhatItDoesNotImplementNamingTheKey) {
  const auto base = nlohmann::json::parse(read_text(ref("vit_tiny/config.json")));
  auto refused = [&](const char *key, nlohmann::json value) {
    auto j = base;
    j[key] = value;
    ClipVisionConfig c;
    std::string err;
    EXPECT_FALSE(parse_clip_vision_config(j.dump(), &c, &err)) << key;
    EXPECT_NE(err.find(key), std::string::npos) << err;
  };
  refused("model_type", "clip");  // a whole CLIP, not its vision tower
  refused("architectures", {"CLIPModel"});
  refused("hidden_act", "relu");
  refused("num_attention_heads", 5);  // 32 is not a multiple
  refused("patch_size", 5);           // 28 is not a multiple
  auto refused_p = [&](const char *key, nlohmann::json value) {
    nlohmann::json j = {{key, value}};
    ClipProcessorConfig p;
    std::string err;
    EXPECT_FALSE(parse_clip_processor_config(j.dump(), &p, &err)) << key;
    EXPECT_NE(err.find(key), std::string::npos) << err;
  };
  refused_p("resample", 1);  // Lanczos
  refused_p("size", {{"longest_edge", 3}});
  refused_p("image_std", {0.5, 0.0, 0.5});
  refused_p("image_processor_type", "SiglipImageProcessor");
}

TEST(ClipVision, BadFolderNamesTheTensor) {
  vttest::TempDir tmp;
  const std::string d = tmp.file("vit");
  fs::copy(ref("vit_tiny"), d, fs::copy_options::recursive);
  fs::permissions(d + "/config.json", fs::perms::owner_write, fs::perm_options::add);
  auto j = nlohmann::json::parse(read_text(d + "/config.json"));
  j["intermediate_size"] = 64;  // the weights are 48 wide
  std::ofstream(d + "/config.json") << j.dump();
  try {
    ClipVisionEncoder::open(d, torch::kCPU, torch::kFloat);
    ADD_FAILURE() << "loaded weights of another width";
  } catch (const std::exception &e) {
    std::printf("%s\n", e.what());
    EXPECT_NE(std::string(e.what()).find("encoder.layers.0.mlp.fc1."), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("model.safetensors"), std::string::npos) << e.what();
  }
}

namespace {

videotrain::image::ImageEncoderOptions image_options(const std::string &cache_dir = "") {
  videotrain::image::ImageEncoderOptions o;
  o.model = ref("vit_tiny");  // processor: the sibling image_processor/ folder
  o.device = "cpu";
  o.cache_dir = cache_dir;
  return o;
}

}  // namespace

TEST(ImageEncoderEngine, ImageEmbedsAreTheEncodersHiddenStateOfTheProcessedFrames) {
  using videotrain::image::ImageEncoderEngine;
  RefFile cases("clip_vision/cases.safetensors");
  std::string err;
  auto e = ImageEncoderEngine::create(image_options(), &err);
  ASSERT_TRUE(e) << err;
  EXPECT_TRUE(fs::equivalent(e->info().processor_dir, ref("image_processor"))) << e->info().processor_dir;
  EXPECT_EQ(e->info().layer, 2);  // -2 of 4 hidden states
  // One frame at a time against transformers (the processor's pixel_values and hidden_states[-2]).
  int i = 0;
  for (const std::string name : {"down", "up"}) {
    const auto frame = cases.get("image." + name).unsqueeze(0);
    EXPECT_LT((e->pixel_values(frame)[0] - cases.get("pixel_values")[i]).abs().max().item<double>(), 1e-6) << name;
    const auto y = e->encode(frame);
    ASSERT_EQ(y.sizes().vec(), std::vector<int64_t>({1, 17, 32}));
    EXPECT_LT(rel_l2(y[0], cases.get("hidden_states.vit_tiny.2")[i++]), 1e-5) << name;
  }
  // Two frames (first-last-frame): the encoder on the processor's two images, byte for byte.
  const auto img = cases.get("image.down");
  const auto two = torch::stack({img, img.flip(1)});
  const auto processor = ClipImageProcessor::open(ref("image_processor"));
  auto enc = ClipVisionEncoder::open(ref("vit_tiny"), torch::kCPU, torch::kFloat);
  const auto want = enc->hidden_states(torch::stack({processor.process(two[0]), processor.process(two[1].contiguous())}))[2];
  const auto got = e->encode(two);
  EXPECT_TRUE(torch::equal(got, want));
  EXPECT_GT(rel_l2(got[1], got[0]), 1e-3);  // the second frame is its own
  EXPECT_EQ(e->stats().encoded, 3u);
  // hidden-state picks the entry: -1 the last, 0 the embeddings; out of range is refused naming it.
  for (int k : {-1, 0, 3}) {
    auto o = image_options();
    o.hidden_state = k;
    auto ek = ImageEncoderEngine::create(o, &err);
    ASSERT_TRUE(ek) << err;
    const auto hk = ek->encode(img.unsqueeze(0));
    EXPECT_LT(rel_l2(hk[0], cases.get("hidden_states.vit_tiny." + std::to_string(k < 0 ? 3 : k))[0]), 1e-5) << k;
  }
  for (int k : {4, -5}) {
    auto o = image_options();
    o.hidden_state = k;
    EXPECT_FALSE(ImageEncoderEngine::create(o, &err));
    EXPECT_NE(err.find("hidden-state=" + std::to_string(k)), std::string::npos) << err;
  }
  EXPECT_THROW(e->encode(torch::zeros({1, 28, 28, 3})), std::runtime_error);  // float, not uint8 frames
  EXPECT_THROW(e->encode(torch::zeros({28, 28, 3}, torch::kByte)), std::runtime_error);  // no frame axis
}

TEST(ImageEncoderEngine, CacheDirGivesTheSameBytesWithoutLoadingTheEncoder) {
  using videotrain::image::ImageEncoderEngine;
  RefFile cases("clip_vision/cases.safetensors");
  vttest::TempDir tmp;
  const auto img = cases.get("image.up");
  const auto frames = torch::stack({img, img.flip(0)});
  std::string err;
  auto miss = ImageEncoderEngine::create(image_options(tmp.path()), &err);
  ASSERT_TRUE(miss) << err;
  EXPECT_FALSE(miss->stats().encoder_loaded);
  const auto first = miss->encode(frames);
  EXPECT_TRUE(miss->stats().encoder_loaded);
  EXPECT_EQ(miss->stats().cache_writes, 1u);
  auto hit = ImageEncoderEngine::create(image_options(tmp.path()), &err);
  ASSERT_TRUE(hit) << err;
  EXPECT_TRUE(torch::equal(hit->encode(frames), first));
  EXPECT_EQ(hit->stats().cache_reads, 1u);
  EXPECT_EQ(hit->stats().encoded, 0u);
  EXPECT_FALSE(hit->stats().encoder_loaded);
  EXPECT_EQ(hit->take_warning(), "");
  // Other frames, or another hidden state, are other entries.
  auto changed = frames.clone();
  changed[1][0][0][0] += 1;  // one byte of the second frame
  hit->encode(changed);
  EXPECT_EQ(hit->stats().encoded, 1u);
  auto o = image_options(tmp.path());
  o.hidden_state = -1;
  auto last = ImageEncoderEngine::create(o, &err);
  ASSERT_TRUE(last) << err;
  EXPECT_FALSE(torch::equal(last->encode(frames), first));
  EXPECT_EQ(last->stats().cache_reads, 0u);
}

TEST(ImageEncoderEngine, BadFoldersNameTheProperty) {
  using videotrain::image::ImageEncoderEngine;
  vttest::TempDir tmp;
  std::string err;
  auto o = image_options();
  o.model = tmp.file("missing");
  EXPECT_FALSE(ImageEncoderEngine::create(o, &err));
  EXPECT_NE(err.find(tmp.file("missing")), std::string::npos) << err;
  // A folder without an image_processor/ beside it, and no processor property.
  fs::copy(ref("vit_tiny"), tmp.file("enc"), fs::copy_options::recursive);
  o.model = tmp.file("enc");
  EXPECT_FALSE(ImageEncoderEngine::create(o, &err));
  EXPECT_NE(err.find("processor property"), std::string::npos) << err;
  o.processor = ref("image_processor");
  EXPECT_TRUE(ImageEncoderEngine::create(o, &err)) << err;
  // A processor cropping to another size than the encoder's image_size.
  fs::create_directory(tmp.file("proc"));
  vttest::write_file(tmp.file("proc/preprocessor_config.json"), R"({"size": {"shortest_edge": 32}, "crop_size": 32})");
  o.processor = tmp.file("proc");
  EXPECT_FALSE(ImageEncoderEngine::create(o, &err));
  EXPECT_NE(err.find("image_size 28"), std::string::npos) << err;
  o = image_options();
  o.model = ref("image_processor");  // a folder, but no config.json
  EXPECT_FALSE(ImageEncoderEngine::create(o, &err));
  EXPECT_NE(err.find("property model"), std::string::npos) << err;
}
