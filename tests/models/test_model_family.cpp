/* models/model_family.h against what diffusers' pipelines say of each family
 * (tests/reference/model_families/families.json, written by its generate.py from diffusers' defaults and
 * the pipelines' own functions; VIDEOTRAIN_FAMILY_REFERENCE names a live file instead, as the interop
 * test diffusers-model-families does), and the transformers' descriptors against the reference folders. */
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <set>

#include "models/model_family.h"
#include "models/native_model.h"
#include "models/samplers.h"
#include "test_util.h"

using namespace videotrain;
using namespace videotrain::models;

namespace {

nlohmann::json reference() {
  const std::string path =
      vttest::env_or("VIDEOTRAIN_FAMILY_REFERENCE", vttest::reference_dir() + "/model_families/families.json");
  std::ifstream f(path);
  EXPECT_TRUE(f.good()) << path;
  return nlohmann::json::parse(f);
}

const char *text_name(TextConvention t) {
  return t == TextConvention::kZeroPadded ? "zero-padded" : t == TextConvention::kUnmasked ? "unmasked" : "as returned";
}

}  // namespace

TEST(ModelFamily, AgreesWithDiffusersPipelines) {
  const auto ref = reference()["families"];
  ASSERT_EQ(ref.size(), model_families().size()) << "a family in the table that generate.py does not describe";
  for (const auto &f : model_families()) {
    SCOPED_TRACE(f.name);
    ASSERT_TRUE(ref.contains(f.name));
    const auto &r = ref[f.name];
    EXPECT_EQ(r["class"], f.class_name);
    EXPECT_EQ(r["text_encoder_class"], f.text_encoder_class);
    EXPECT_EQ(r["frames"], f.frames);
    EXPECT_EQ(r["width"], f.width);
    EXPECT_EQ(r["height"], f.height);
    EXPECT_EQ(r["layout"], f.layout == LatentLayout::kChannelsFirst ? "channels-first" : "frames-first");
    EXPECT_EQ(r["temporal_padding"], f.temporal_padding != TemporalPadding::kNone);
    EXPECT_EQ(r["text"], text_name(f.text));
    EXPECT_EQ(r["text_length"], f.text_length);
    EXPECT_EQ(r["cleans_prompts"], f.cleans_prompts);
    EXPECT_EQ(r["schedule"], f.objective == Objective::kFlowMatching ? "flow" : "ddpm");
    EXPECT_EQ(r["default_shift"].get<double>(), f.default_shift);
    ASSERT_EQ(r["image_layouts"].size(), f.image_layouts.size());
    for (size_t i = 0; i < f.image_layouts.size(); i++) {
      const auto &l = f.image_layouts[i];
      const auto &rl = r["image_layouts"][i];
      EXPECT_EQ(rl["name"], l.name);
      EXPECT_EQ(rl["mask_channels"], l.mask_channels) << l.name;
      EXPECT_EQ(rl["condition_latents"], l.condition_latents) << l.name;
      EXPECT_EQ(rl["in_channels_z16"], l.in_channels(16)) << l.name;
      EXPECT_EQ(rl["image_embeddings"], l.image_embeddings) << l.name;
      EXPECT_EQ(rl["images"], l.images) << l.name;
    }
  }
}

// The default sampler belongs to the family's objective, and the samplers it names parse and belong too.
TEST(ModelFamily, SamplersFitTheObjective) {
  for (const auto &f : model_families()) {
    SCOPED_TRACE(f.name);
    EXPECT_STREQ(sampler_family(parse_sampler(f.default_sampler)), f.name);
    std::string s = f.samplers;
    for (size_t at; (at = s.find(" or ")) != std::string::npos;) s.replace(at, 4, ",");
    std::stringstream ss(s);
    int n = 0;
    for (std::string name; std::getline(ss, name, ','); n++) EXPECT_STREQ(sampler_family(parse_sampler(name)), f.name) << name;
    EXPECT_GE(n, 1);
  }
}

TEST(ModelFamily, Lookups) {
  std::set<std::string> names, classes, encoders;
  for (const auto &f : model_families()) {
    EXPECT_TRUE(names.insert(f.name).second) << f.name;
    EXPECT_TRUE(classes.insert(f.class_name).second) << f.class_name;
    EXPECT_TRUE(encoders.insert(f.text_encoder_class).second) << f.text_encoder_class;
    EXPECT_EQ(family_named(f.name), &f);
    EXPECT_EQ(family_of_class(f.class_name), &f);
    EXPECT_EQ(family_of_text_encoder(f.text_encoder_class), &f);
  }
  EXPECT_EQ(family_named(""), nullptr);
  EXPECT_EQ(family_named("auto"), nullptr);
  EXPECT_EQ(family_of_class("UNet2DConditionModel"), nullptr);
  EXPECT_EQ(family_of_text_encoder("CLIPTextModel"), nullptr);
  EXPECT_EQ(family_names(", "), "wan, cogvideox");
}

// Each reference transformer (written by diffusers) gets its class's descriptor; CogVideoX 1.5's temporal
// patch is its patch_size_t, the tiny Wan 2.1 I2V (4 latent channels, in_channels 12) is the table's layout.
TEST(ModelFamily, TransformersAnswerTheirDescriptor) {
  const std::string dir = vttest::reference_dir() + "/dit/";
  for (const char *name : {"wan_t2v_tiny", "wan22_ti2v_tiny", "wan21_i2v_tiny", "cogvideox_2b_tiny", "cogvideox15_tiny",
                           "cogvideox_5b_i2v_tiny", "cogvideox15_i2v_tiny"}) {
    SCOPED_TRACE(name);
    auto m = open_dit(dir + name, torch::kCPU);
    EXPECT_EQ(&m->descriptor(), family_of_class(m->class_name()));
    EXPECT_EQ(m->family(), m->descriptor().name);
    const auto cfg = nlohmann::json::parse(m->config_json());
    const int64_t patch_t = cfg.contains("patch_size_t") && cfg["patch_size_t"].is_number() ? cfg["patch_size_t"].get<int64_t>()
                                                                                              : 1;
    EXPECT_EQ(m->temporal_patch(), patch_t);
    const ImageLayout *l = image_layout(m->descriptor(), cfg["in_channels"], cfg["out_channels"], m->image_dim() > 0,
                                        cfg.contains("pos_embed_seq_len") && cfg["pos_embed_seq_len"].is_number());
    // What the sampler builds for it (models::image_inputs): WanImageToVideoPipeline's mask and latents,
    // CogVideoXImageToVideoPipeline's image latents.
    const ImageLayout *built = condition_layout(m->descriptor(), m->condition_channels());
    if (std::string(name) == "wan21_i2v_tiny") {
      ASSERT_NE(l, nullptr);
      EXPECT_STREQ(l->name, "Wan 2.1 I2V");
      ASSERT_NE(built, nullptr);
      EXPECT_EQ(built->build, ConditionBuild::kMaskAndLatents);
    } else if (std::string(name).find("_i2v_") != std::string::npos) {
      ASSERT_NE(l, nullptr);
      EXPECT_STREQ(l->name, "CogVideoX I2V");
      EXPECT_EQ(m->condition_channels(), 4);
      EXPECT_EQ(built, l);
      EXPECT_EQ(l->build, ConditionBuild::kImageLatents);
    } else {
      EXPECT_EQ(l, nullptr);  // text-to-video layouts take no image condition
      EXPECT_EQ(built, nullptr);
    }
  }
  EXPECT_EQ(open_dit(dir + "cogvideox15_tiny", torch::kCPU)->temporal_patch(), 2);
  // Wan 2.2 TI2V 5B's pipeline (expand_timesteps) takes the image as its clean first frame; CogVideoX has none.
  EXPECT_EQ(family_named("wan")->expand_timesteps_layout.build, ConditionBuild::kCleanFirstFrame);
  EXPECT_EQ(family_named("cogvideox")->expand_timesteps_layout.build, ConditionBuild::kNone);
}
