// VAE config parsing, the encoder tensor table, safetensors reading/writing, make-vae.
#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>

#include "safetensors.h"
#include "test_util.h"
#include "models/vae/vae_config.h"

using namespace videotrain;
using namespace videotrain::vae;

namespace {
std::string cogvideox_dir() { return vttest::reference_dir() + "/cogvideox_vae"; }
}  // namespace

// The table built from the real CogVideoX-2b config equals the checkpoint's encoder tensors.
TEST(VaeConfig, TableMatchesCogVideoX2bLayout) {
  auto layout = nlohmann::json::parse(vttest::read_file(cogvideox_dir() + "/cogvideox_2b_vae_layout.json"));
  VaeConfig cfg;
  std::string err;
  ASSERT_TRUE(parse_vae_config(layout.at("config").dump(), &cfg, &err)) << err;
  EXPECT_EQ(check_supported(cfg), "");
  std::map<std::string, std::vector<int64_t>> expected, found;
  for (const auto &[name, shape] : encoder_tensor_table(cfg)) expected[name] = shape;
  for (auto it = layout.at("tensors").begin(); it != layout.at("tensors").end(); ++it) {
    const std::string &name = it.key();
    if (name.rfind("encoder.", 0) == 0 || name.rfind("quant_conv.", 0) == 0)
      found[name] = it->get<std::vector<int64_t>>();
  }
  EXPECT_EQ(expected.size(), found.size());
  EXPECT_EQ(expected, found);
  EXPECT_EQ(cfg.spatial_compression(), 8);
  EXPECT_EQ(cfg.temporal_levels(), 2);
}

// The tiny reference checkpoint holds every table tensor with the table's shape.
TEST(VaeConfig, TinyReferenceCheckpointMatchesTable) {
  VaeConfig cfg;
  std::string err;
  ASSERT_TRUE(load_vae_config(cogvideox_dir() + "/tiny_a/config.json", &cfg, &err)) << err;
  auto f = SafetensorsFile::open(cogvideox_dir() + "/tiny_a/diffusion_pytorch_model.safetensors", &err);
  ASSERT_TRUE(f) << err;
  size_t n = 0;
  for (const auto &[name, shape] : encoder_tensor_table(cfg)) {
    const SafetensorsEntry *e = f->find(name);
    ASSERT_NE(e, nullptr) << name;
    EXPECT_EQ(e->shape, shape) << name;
    EXPECT_EQ(e->dtype, "F32");
    n++;
  }
  size_t enc = 0;
  for (const auto &[name, e] : f->entries()) enc += name.rfind("encoder.", 0) == 0;
  EXPECT_EQ(n, enc) << "the table names every encoder tensor of the file";
}

TEST(VaeConfig, UnsupportedConfigsAreNamed) {
  VaeConfig c = tiny_config();
  EXPECT_EQ(check_supported(c), "");
  c.down_block_types[2] = "CogVideoXAttnDownBlock3D";
  EXPECT_NE(check_supported(c).find("down_block_types[2]"), std::string::npos) << check_supported(c);
  c = tiny_config();
  c.block_out_channels[1] = 30;
  EXPECT_NE(check_supported(c).find("norm_num_groups"), std::string::npos) << check_supported(c);
  c = tiny_config();
  c.temporal_compression_ratio = 3;
  EXPECT_NE(check_supported(c).find("power of two"), std::string::npos);
  c = tiny_config();
  c.temporal_compression_ratio = 16;  // needs 4 downsampling blocks, the config has 3
  EXPECT_NE(check_supported(c).find("downsampling"), std::string::npos);
  c = tiny_config();
  c.class_name = "AutoencoderKL";
  EXPECT_NE(check_supported(c).find("AutoencoderKLCogVideoX"), std::string::npos);
  VaeConfig p;
  std::string err;
  EXPECT_FALSE(parse_vae_config("{not json", &p, &err));
  EXPECT_FALSE(parse_vae_config("{\"latent_channels\": 4}", &p, &err));
  EXPECT_NE(err.find("block_out_channels"), std::string::npos);
}

// Numbers out of range are refused with the key named, never cast (undefined behaviour)
// or let through to grow the tensor table without bound.
TEST(VaeConfig, NumbersOutOfRangeAreRefused) {
  std::string tiny = vae_config_to_json(tiny_config());
  auto with = [&](const std::string &from, const std::string &to) {
    std::string t = tiny;
    size_t at = t.find(from);
    EXPECT_NE(at, std::string::npos) << from;
    return at == std::string::npos ? t : t.replace(at, from.size(), to);
  };
  VaeConfig c;
  std::string err;
  EXPECT_FALSE(parse_vae_config(with("\"layers_per_block\": 1", "\"layers_per_block\": 1e30"), &c, &err));
  EXPECT_NE(err.find("'layers_per_block' must be an integer"), std::string::npos) << err;
  EXPECT_FALSE(parse_vae_config(with("\"in_channels\": 3", "\"in_channels\": 4294967299"), &c, &err));
  EXPECT_NE(err.find("'in_channels'"), std::string::npos) << err;
  EXPECT_FALSE(parse_vae_config(with("32,\n    32\n", "32,\n    -1e30\n"), &c, &err)) << err;
  EXPECT_NE(err.find("'block_out_channels'"), std::string::npos) << err;
  ASSERT_TRUE(parse_vae_config(with("\"layers_per_block\": 1", "\"layers_per_block\": 1e9"), &c, &err)) << err;
  EXPECT_NE(check_supported(c).find("layers_per_block = 1000000000 is not in [1, 64]"), std::string::npos)
      << check_supported(c);
  ASSERT_TRUE(parse_vae_config(with("\"layers_per_block\": 1", "\"layers_per_block\": 2.0"), &c, &err)) << err;
  EXPECT_EQ(c.layers_per_block, 2);
  c = tiny_config();
  c.block_out_channels.assign(40, 4);
  c.down_block_types.assign(40, "CogVideoXDownBlock3D");
  EXPECT_NE(check_supported(c).find("at most 16"), std::string::npos) << check_supported(c);
}

// A shape whose byte count wraps around 2^64 does not pass for the 0 bytes it holds; shape
// entries and offsets that are not non-negative integers are refused.
TEST(Safetensors, ShapesAndOffsetsAreCheckedForRangeAndOverflow) {
  vttest::TempDir dir;
  auto file = [&](const std::string &header) {
    std::string len(8, '\0');
    for (int i = 0; i < 8; i++) len[i] = static_cast<char>((header.size() >> (8 * i)) & 0xff);
    vttest::write_file(dir.file("x"), len + header + std::string(4, '\0'));
    std::string err;
    EXPECT_FALSE(SafetensorsFile::open(dir.file("x"), &err)) << header;
    return err;
  };
  std::string err = file(R"({"w":{"dtype":"F32","shape":[4294967296,4294967296],"data_offsets":[0,0]}})");
  EXPECT_NE(err.find("needs more than 2^64"), std::string::npos) << err;
  err = file(R"({"w":{"dtype":"F32","shape":[4611686018427387904],"data_offsets":[0,0]}})");
  EXPECT_NE(err.find("needs more than 2^64"), std::string::npos) << err;
  err = file(R"({"w":{"dtype":"U8","shape":[1e30],"data_offsets":[0,4]}})");
  EXPECT_NE(err.find("shape entry"), std::string::npos) << err;
  err = file(R"({"w":{"dtype":"U8","shape":[4],"data_offsets":[0,1e30]}})");
  EXPECT_NE(err.find("data_offsets"), std::string::npos) << err;
  err = file(R"({"w":{"dtype":"U8","shape":[4],"data_offsets":[-1,3]}})");
  EXPECT_NE(err.find("data_offsets"), std::string::npos) << err;
  err = file(R"({"__metadata__":{"k":[[[]]]}})");
  EXPECT_NE(err.find("not a string"), std::string::npos) << err;
  std::string e2;
  EXPECT_FALSE(write_safetensors(dir.file("y"), {{"w", "F32", {int64_t(1) << 32, int64_t(1) << 32}, {}}}, {}, &e2));
  EXPECT_FALSE(write_safetensors(dir.file("y"), {{"w", "U8", {1}, {0}}, {"w", "U8", {1}, {1}}}, {}, &e2));
  EXPECT_NE(e2.find("'w' is given twice"), std::string::npos) << e2;
}

// As the reference reader: the tensors tile the data section (no overlap, no gap, nothing
// after the last), a name appears once, and a field the format does not know is ignored.
TEST(Safetensors, DataOffsetsMustTileTheDataSection) {
  vttest::TempDir dir;
  auto open = [&](const std::string &header, size_t data, std::string *err) {
    std::string len(8, '\0');
    for (int i = 0; i < 8; i++) len[i] = static_cast<char>((header.size() >> (8 * i)) & 0xff);
    vttest::write_file(dir.file("x"), len + header + std::string(data, '\0'));
    return SafetensorsFile::open(dir.file("x"), err) != nullptr;
  };
  std::string err;
  EXPECT_FALSE(open(R"({"a":{"dtype":"F32","shape":[4],"data_offsets":[0,16]},)"
                    R"("b":{"dtype":"F32","shape":[4],"data_offsets":[8,24]}})", 24, &err));
  EXPECT_NE(err.find("'a' and 'b' overlap"), std::string::npos) << err;
  EXPECT_FALSE(open(R"({"a":{"dtype":"U8","shape":[4],"data_offsets":[0,4]},)"
                    R"("b":{"dtype":"U8","shape":[4],"data_offsets":[0,4]}})", 4, &err));
  EXPECT_NE(err.find("overlap"), std::string::npos) << err;
  EXPECT_FALSE(open(R"({"a":{"dtype":"U8","shape":[4],"data_offsets":[4,8]}})", 8, &err));
  EXPECT_NE(err.find("data bytes 0 to 4 belong to no tensor"), std::string::npos) << err;
  EXPECT_FALSE(open(R"({"a":{"dtype":"U8","shape":[4],"data_offsets":[0,4]}})", 8, &err));
  EXPECT_NE(err.find("data bytes 4 to 8 belong to no tensor"), std::string::npos) << err;
  EXPECT_FALSE(open(R"({"a":{"dtype":"U8","shape":[4],"data_offsets":[0,4]},)"
                    R"("a":{"dtype":"U8","shape":[4],"data_offsets":[4,8]}})", 8, &err));
  EXPECT_NE(err.find("'a' appears twice"), std::string::npos) << err;
  EXPECT_FALSE(open(R"({"a":{"dtype":"U8","shape":[[4]],"data_offsets":[0,4]}})", 4, &err));
  EXPECT_NE(err.find("shape entry"), std::string::npos) << err;
  EXPECT_FALSE(open(R"([1, 2])", 0, &err));
  EXPECT_NE(err.find("not a JSON object"), std::string::npos) << err;
  EXPECT_FALSE(open(R"({"a":{"dtype":"U8","shape":[4],"data_offsets":[0,4]})", 4, &err));
  EXPECT_NE(err.find("not valid JSON"), std::string::npos) << err;
  // Zero-size tensors sit anywhere between others; unknown fields and metadata of any scalar pass.
  ASSERT_TRUE(open(R"({"__metadata__":{"s":"v","n":1e308,"b":true},)"
                   R"("z":{"dtype":"F32","shape":[0],"data_offsets":[4,4],"extra":{"x":[1,[2]]}},)"
                   R"("a":{"dtype":"U8","shape":[4],"data_offsets":[0,4]},)"
                   R"("c":{"dtype":"U8","shape":[2],"data_offsets":[4,6]}})", 6, &err)) << err;
  auto f = SafetensorsFile::open(dir.file("x"), &err);
  ASSERT_TRUE(f) << err;
  EXPECT_EQ(f->metadata().at("s"), "v");
  EXPECT_EQ(f->metadata().at("n"), "1e308");
  EXPECT_EQ(f->metadata().at("b"), "true");
  EXPECT_EQ(f->find("c")->nbytes, 2u);
}

// A header near the 100 MB limit is read into the entry table without a JSON tree: the peak
// memory stays a small multiple of the header (a tree of it took 1.4-1.9 GB).
TEST(Safetensors, AHugeHeaderCostsLittleMemory) {
  vttest::TempDir dir;
  std::string h = "{";
  const int n = 1'000'000;  // ~94 MB of entries of one byte each
  h.reserve(96'000'000);
  for (int i = 0; i < n; i++) {
    char buf[128];
    snprintf(buf, sizeof buf, "%s\"tensor.with.a.long.name.%09d\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[%d,%d]}",
             i ? "," : "", i, i, i + 1);
    h += buf;
  }
  h += "}";
  std::string len(8, '\0');
  for (int i = 0; i < 8; i++) len[i] = static_cast<char>((h.size() >> (8 * i)) & 0xff);
  {
    std::ofstream out(dir.file("big"), std::ios::binary);
    out << len << h << std::string(n, '\0');
  }
  const size_t header_bytes = h.size();
  std::string().swap(h);
  vttest::reset_peak_rss();
  const long before = vttest::rss_kb();
  std::string err;
  auto f = SafetensorsFile::open(dir.file("big"), &err);
  ASSERT_TRUE(f) << err;
  EXPECT_EQ(f->entries().size(), static_cast<size_t>(n));
  const long grew_mb = (vttest::peak_rss_kb() - before) / 1024;
  RecordProperty("header_mb", static_cast<int>(header_bytes >> 20));
  RecordProperty("peak_growth_mb", static_cast<int>(grew_mb));
  EXPECT_LT(grew_mb, 560) << "reading a " << (header_bytes >> 20) << " MB header grew the peak by " << grew_mb << " MB";
}

TEST(Safetensors, WriteReadRoundTripWithMetadata) {
  vttest::TempDir dir;
  std::vector<SafetensorsOutTensor> ts(3);
  ts[0] = {"a", "F32", {2, 3}, std::vector<uint8_t>(24)};
  for (int i = 0; i < 6; i++) {
    float v = i * 0.5f;
    memcpy(ts[0].bytes.data() + 4 * i, &v, 4);
  }
  ts[1] = {"b.half", "F16", {2}, {0x00, 0x3c, 0x00, 0xc0}};  // 1.0, -2.0
  ts[2] = {"c", "BF16", {1}, {0x80, 0x3f}};                  // 1.0
  std::string err;
  ASSERT_TRUE(write_safetensors(dir.file("x.safetensors"), ts, {{"k", "v"}}, &err)) << err;
  auto f = SafetensorsFile::open(dir.file("x.safetensors"), &err);
  ASSERT_TRUE(f) << err;
  EXPECT_EQ(f->metadata().at("k"), "v");
  ASSERT_EQ(f->entries().size(), 3u);
  const auto *a = f->find("a");
  ASSERT_NE(a, nullptr);
  EXPECT_EQ(a->shape, (std::vector<int64_t>{2, 3}));
  float v5;
  memcpy(&v5, a->data + 20, 4);
  EXPECT_EQ(v5, 2.5f);
  EXPECT_EQ(f->find("b.half")->dtype, "F16");
  EXPECT_EQ(f->find("c")->nbytes, 2u);
  EXPECT_EQ(float_to_half(1.0f), 0x3c00);
  EXPECT_EQ(float_to_half(-2.0f), 0xc000);
  EXPECT_EQ(float_to_half(65504.0f), 0x7bff);
  EXPECT_EQ(float_to_half(1e-7f), 0x0002);  // subnormal: 1e-7 / 2^-24 = 1.68 -> 2
  EXPECT_EQ(float_to_bfloat16(1.0f), 0x3f80);
  EXPECT_EQ(float_to_bfloat16(-3.0f), 0xc040);
}

TEST(Safetensors, BadFilesAreRefusedWithTheirPath) {
  vttest::TempDir dir;
  std::string err;
  EXPECT_FALSE(SafetensorsFile::open(dir.file("missing.safetensors"), &err));
  EXPECT_NE(err.find("missing.safetensors"), std::string::npos);
  vttest::write_file(dir.file("short"), "abc");
  EXPECT_FALSE(SafetensorsFile::open(dir.file("short"), &err));
  std::string h = "{\"t\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16]}}";
  std::string len(8, '\0');
  len[0] = static_cast<char>(h.size());
  vttest::write_file(dir.file("trunc"), len + h + std::string(8, '\0'));  // 8 of 16 data bytes
  EXPECT_FALSE(SafetensorsFile::open(dir.file("trunc"), &err));
  EXPECT_NE(err.find("'t'"), std::string::npos) << err;
  std::string h2 = "{\"t\":{\"dtype\":\"F32\",\"shape\":[3],\"data_offsets\":[0,16]}}";
  len[0] = static_cast<char>(h2.size());
  vttest::write_file(dir.file("size"), len + h2 + std::string(16, '\0'));
  EXPECT_FALSE(SafetensorsFile::open(dir.file("size"), &err));
  EXPECT_NE(err.find("needs 12"), std::string::npos) << err;
  len[0] = 100;
  vttest::write_file(dir.file("hdr"), len + "{}");
  EXPECT_FALSE(SafetensorsFile::open(dir.file("hdr"), &err));
}

TEST(MakeVae, WritesALoadableSeededFolder) {
  vttest::TempDir dir;
  std::string err;
  for (const char *dt : {"F32", "BF16"}) {
    std::string out = dir.file(std::string("vae_") + dt);
    ASSERT_TRUE(make_random_vae(out, tiny_config(), 3, dt, &err)) << err;
    VaeConfig cfg;
    ASSERT_TRUE(load_vae_config(out + "/config.json", &cfg, &err)) << err;
    EXPECT_EQ(cfg.block_out_channels, tiny_config().block_out_channels);
    auto f = SafetensorsFile::open(out + "/diffusion_pytorch_model.safetensors", &err);
    ASSERT_TRUE(f) << err;
    // Encoder and decoder: vaeencoder and vaedecoder both take the folder.
    EXPECT_EQ(f->entries().size(), encoder_tensor_table(cfg).size() + decoder_tensor_table(cfg).size());
    EXPECT_EQ(f->find("encoder.conv_in.conv.weight")->dtype, dt);
    EXPECT_NE(f->find("decoder.conv_out.conv.weight"), nullptr);
  }
  // Same seed, same bytes; another seed, other bytes.
  ASSERT_TRUE(make_random_vae(dir.file("s3b"), tiny_config(), 3, "F32", &err));
  ASSERT_TRUE(make_random_vae(dir.file("s4"), tiny_config(), 4, "F32", &err));
  std::string a = vttest::read_file(dir.file("vae_F32/diffusion_pytorch_model.safetensors"));
  EXPECT_EQ(a, vttest::read_file(dir.file("s3b/diffusion_pytorch_model.safetensors")));
  EXPECT_NE(a, vttest::read_file(dir.file("s4/diffusion_pytorch_model.safetensors")));
  // The command-line tool.
  std::string tool = vttest::env_or("VIDEOTRAIN_BUILD_DIR", "build") + "/tools/videotrain-make-vae";
  std::string cmd = "'" + tool + "' '" + dir.file("cli") + "' --seed 3 --tiny > /dev/null";
  ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
  EXPECT_EQ(a, vttest::read_file(dir.file("cli/diffusion_pytorch_model.safetensors")));
  EXPECT_NE(std::system(("'" + tool + "' > /dev/null 2>&1").c_str()), 0) << "no OUTDIR is a usage error";
}
