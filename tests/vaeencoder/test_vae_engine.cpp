// The VAE engine against diffusers' reference outputs, streaming against whole-clip
// encodes, weight loading, bad input and the out-of-memory retry.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "models/image_condition.h"
#include "models/vae/vae_config.h"
#include "tensor_buffer.h"
#include "vae_test_util.h"

using namespace videotrain;
using namespace videotrain::vae;
using vaetest::rel_l2;

namespace {

constexpr double kTol = 1e-5;

EngineOptions tiny_a_options() {
  EngineOptions o;
  o.model = vaetest::tiny_a_dir();
  o.device = "cpu";
  o.dtype = "float32";
  return o;
}

using vaetest::stream;

// A small random CogVideoX VAE shared by the streaming tests.
class TinyVae : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new vttest::TempDir();
    VaeConfig c = tiny_config();
    c.block_out_channels = {8, 16, 16, 16};
    std::string err;
    ASSERT_TRUE(make_random_vae(dir_->file("vae"), c, 11, "F32", &err)) << err;
  }
  static void TearDownTestSuite() {
    delete dir_;
    dir_ = nullptr;
  }
  static EngineOptions options() {
    EngineOptions o;
    o.model = dir_->file("vae");
    o.device = "cpu";
    o.dtype = "float32";
    o.latent = LatentKind::Moments;
    o.allow_any_length = true;
    return o;
  }
  static vttest::TempDir *dir_;
};
vttest::TempDir *TinyVae::dir_ = nullptr;

}  // namespace

// ---------------------------------------------------------------- exactness against diffusers

TEST(VaeReference, ChunkedEncodeMatchesDiffusers) {
  vaetest::Cases cases;
  ASSERT_TRUE(cases.ok());
  auto eng = vaetest::make_engine(tiny_a_options());
  ASSERT_TRUE(eng);
  for (int T : {1, 9, 25}) {
    std::string s = ".T" + std::to_string(T);
    at::Tensor raw = encode_raw(*eng, cases.get("input" + s));
    at::Tensor ref = cases.get("chunked" + s);
    ASSERT_EQ(raw.sizes(), ref.sizes()) << s;
    EXPECT_LT(rel_l2(raw, ref), kTol) << s;
    // One pass over the whole clip is the other reference (GroupNorm over the whole clip).
    at::Tensor single = encode_raw(*eng, cases.get("input" + s), T);
    EXPECT_LT(rel_l2(single, cases.get("single_pass" + s)), kTol) << s;
    if (T > 9) {
      EXPECT_GT(rel_l2(raw, single), 0.05) << "chunking changes the result for T > 9";
    }
  }
}

TEST(VaeReference, LatentModeAndSampleMatchDiffusers) {
  vaetest::Cases cases;
  ASSERT_TRUE(cases.ok());
  auto o = tiny_a_options();
  o.latent = LatentKind::Mode;
  auto mode = vaetest::make_engine(o);
  o.latent = LatentKind::Sample;
  auto sample = vaetest::make_engine(o);
  ASSERT_TRUE(mode && sample);
  for (int T : {1, 9, 25}) {
    std::string s = ".T" + std::to_string(T);
    at::Tensor raw = encode_raw(*mode, cases.get("input" + s));
    at::Tensor m = latent_from_raw(*mode, raw, 0);
    EXPECT_LT(rel_l2(m, cases.get("latent_mode" + s)[0]), kTol) << s;
    at::Tensor z = latent_from_raw(*sample, raw, 0, cases.get("noise" + s)[0]);
    EXPECT_LT(rel_l2(z, cases.get("latent_sample" + s)[0]), kTol) << s;
  }
}

TEST(VaeReference, TiledEncodeMatchesDiffusers) {
  vaetest::Cases cases;
  ASSERT_TRUE(cases.ok());
  auto o = tiny_a_options();
  cases.use_reference_tiles(&o);
  auto eng = vaetest::make_engine(o);
  ASSERT_TRUE(eng);
  for (int T : {1, 9, 25}) {
    std::string s = ".T" + std::to_string(T);
    at::Tensor raw = encode_raw(*eng, cases.get("input" + s));
    at::Tensor ref = cases.get("tiled" + s);
    ASSERT_EQ(raw.sizes(), ref.sizes()) << s;
    EXPECT_LT(rel_l2(raw, ref), kTol) << s;
    EXPECT_GT(rel_l2(raw, cases.get("chunked" + s)), 1e-3) << "tiles differ from the untiled encode";
  }
}

// Streaming uint8 frames gives what the whole-clip call gives on the same quantized input,
// which in turn is close to the float reference.
TEST(VaeReference, StreamingQuantizedFramesMatchesEngine) {
  vaetest::Cases cases;
  ASSERT_TRUE(cases.ok());
  auto o = tiny_a_options();
  o.latent = LatentKind::Mode;
  auto eng = vaetest::make_engine(o);
  ASSERT_TRUE(eng);
  for (int T : {1, 9}) {  // longer clips: TinyVae.StreamingEqualsWholeClipForEveryLength
    std::string s = ".T" + std::to_string(T);
    at::Tensor u8 = vaetest::quantize(cases.get("input" + s));
    at::Tensor streamed = stream(*eng, u8, 3);
    ASSERT_TRUE(streamed.defined());
    at::Tensor whole = latent_from_raw(*eng, encode_raw(*eng, dequantize_frames(u8)), 3);
    EXPECT_LT(rel_l2(streamed, whole), 1e-6) << s;
    EXPECT_LT(rel_l2(streamed, cases.get("latent_mode" + s)[0]), 0.05) << "8-bit input stays close" << s;
    EXPECT_LE(eng->peak_frames_held(), T) << "frames are released chunk by chunk";
  }
}

// condition=first-frame with a CogVideoX VAE (CogVideoX I2V): the named tensor condition [C, t, h, w] is the
// first frame encoded alone (its mode) scaled and zero-padded, models::cogvideox_image_latents of the same
// VAE's encode (checked against diffusers' prepare_latents in test image-condition), beside the clip's own
// latent; first-last-frame (Wan FLF2V's) is refused.
TEST(VaeEngineCondition, CogVideoXFirstFrameIsTheImageLatents) {
  vaetest::Cases cases;
  ASSERT_TRUE(cases.ok());
  const at::Tensor u8 = vaetest::quantize(cases.get("input.T9"));
  auto o = tiny_a_options();
  o.latent = LatentKind::Mode;
  auto ref = vaetest::make_engine(o);
  o.condition = Condition::First;
  auto e = vaetest::make_engine(o);
  ASSERT_TRUE(e && ref);
  std::string w;
  ASSERT_TRUE(e->begin_clip(3, 9, 96, 64, &w)) << w;
  for (int t = 0; t < 9; t++) {
    at::Tensor f = u8[t].contiguous();
    ASSERT_TRUE(e->push_frame(f.data_ptr<uint8_t>(), 96 * 3, &w)) << w;
  }
  GstBuffer *buf = e->finish_clip(&w);
  ASSERT_NE(buf, nullptr) << w;
  auto cond = named_tensor_from_buffer(buf, "condition", &w);
  auto lat = tensor_from_buffer(buf, &w);
  ASSERT_TRUE(cond && lat) << w;
  const at::Tensor got = cond->clone(), latent = lat->clone();
  gst_buffer_unref(buf);
  const at::Tensor m = encode_raw(*ref, dequantize_frames(u8.narrow(0, 0, 1)));  // [1, 2C, 1, h, w]
  const at::Tensor want =
      models::cogvideox_image_latents(m.narrow(1, 0, m.size(1) / 2), latent.size(1), 1.15258426).select(0, 0);
  ASSERT_EQ(got.sizes(), latent.sizes());  // [C, t, h, w]: no mask channels
  EXPECT_LT(rel_l2(got, want), kTol);
  EXPECT_EQ(got.narrow(1, 1, got.size(1) - 1).abs().max().item<float>(), 0.0f);
  // Encoded alone, not the clip's first latent frame (GroupNorm statistics span the clip's chunk).
  EXPECT_GT(rel_l2(got.narrow(1, 0, 1), latent.narrow(1, 0, 1)), 1e-3);
  o.condition = Condition::FirstLast;
  std::string err;
  EXPECT_FALSE(VaeEngine::create(o, &err));
  EXPECT_NE(err.find("CogVideoX I2V takes the first frame only"), std::string::npos) << err;
}

// ---------------------------------------------------------------- weights

TEST(VaeWeights, HalfAndBfloat16CheckpointsLoad) {
  vttest::TempDir dir;
  std::string err;
  ASSERT_TRUE(make_random_vae(dir.file("f32"), tiny_config(), 5, "F32", &err)) << err;
  ASSERT_TRUE(make_random_vae(dir.file("f16"), tiny_config(), 5, "F16", &err)) << err;
  ASSERT_TRUE(make_random_vae(dir.file("bf16"), tiny_config(), 5, "BF16", &err)) << err;
  at::Tensor video = at::rand({1, 3, 9, 32, 32}, at::TensorOptions().dtype(at::kFloat)) * 2 - 1;
  EngineOptions o;
  o.device = "cpu";
  o.model = dir.file("f32");
  auto a = vaetest::make_engine(o);
  o.model = dir.file("f16");
  auto b = vaetest::make_engine(o);
  o.model = dir.file("bf16");
  auto c = vaetest::make_engine(o);
  ASSERT_TRUE(a && b && c);
  at::Tensor ra = encode_raw(*a, video);
  EXPECT_LT(rel_l2(encode_raw(*b, video), ra), 2e-2);
  EXPECT_LT(rel_l2(encode_raw(*c, video), ra), 5e-2);
}

TEST(VaeWeights, MissingOrMisshapenTensorsAreNamed) {
  vttest::TempDir dir;
  std::string err;
  ASSERT_TRUE(make_random_vae(dir.file("v"), tiny_config(), 5, "F32", &err)) << err;
  std::string st = dir.file("v/diffusion_pytorch_model.safetensors");
  auto f = SafetensorsFile::open(st, &err);
  ASSERT_TRUE(f);
  // Rewrite without one tensor, then with one wrong shape.
  std::vector<SafetensorsOutTensor> all;
  for (const auto &[n, e] : f->entries()) all.push_back({n, e.dtype, e.shape, std::vector<uint8_t>(e.data, e.data + e.nbytes)});
  f.reset();
  auto without = all;
  without.erase(std::remove_if(without.begin(), without.end(),
                               [](auto &t) { return t.name == "encoder.down_blocks.1.resnets.0.conv_shortcut.weight"; }),
                without.end());
  ASSERT_TRUE(write_safetensors(st, without, {}, &err));
  EngineOptions o;
  o.device = "cpu";
  o.model = dir.file("v");
  EXPECT_FALSE(VaeEngine::create(o, &err));
  EXPECT_NE(err.find("encoder.down_blocks.1.resnets.0.conv_shortcut.weight"), std::string::npos) << err;
  EXPECT_NE(err.find("[32, 16, 1, 1, 1]"), std::string::npos) << err;
  EXPECT_NE(err.find("diffusion_pytorch_model.safetensors"), std::string::npos) << err;

  auto wrong = all;
  for (auto &t : wrong)
    if (t.name == "encoder.conv_out.conv.bias") t.shape = {2, 4};
  ASSERT_TRUE(write_safetensors(st, wrong, {}, &err));
  EXPECT_FALSE(VaeEngine::create(o, &err));
  EXPECT_NE(err.find("encoder.conv_out.conv.bias"), std::string::npos) << err;
  EXPECT_NE(err.find("[2, 4]"), std::string::npos) << "found shape: " << err;
  EXPECT_NE(err.find("[8]"), std::string::npos) << "expected shape: " << err;

  // Extra (decoder) tensors are ignored.
  auto extra = all;
  extra.push_back({"decoder.extra_block.weight", "F32", {1}, std::vector<uint8_t>(4)});
  ASSERT_TRUE(write_safetensors(st, extra, {}, &err));
  EXPECT_TRUE(VaeEngine::create(o, &err)) << err;
}

TEST(VaeWeights, BadConfigsAndPropertiesAreErrors) {
  vttest::TempDir dir;
  std::string err;
  VaeConfig c = tiny_config();
  ASSERT_TRUE(make_random_vae(dir.file("v"), c, 5, "F32", &err));
  EngineOptions o;
  o.device = "cpu";
  o.model = dir.file("v");
  c.down_block_types[1] = "CogVideoXSomethingBlock3D";
  vttest::write_file(dir.file("v/config.json"), vae_config_to_json(c));
  EXPECT_FALSE(VaeEngine::create(o, &err));
  EXPECT_NE(err.find("down_block_types[1]"), std::string::npos) << err;
  EXPECT_NE(err.find("config.json"), std::string::npos) << err;
  c = tiny_config();
  c.norm_num_groups = 5;
  vttest::write_file(dir.file("v/config.json"), vae_config_to_json(c));
  EXPECT_FALSE(VaeEngine::create(o, &err));
  EXPECT_NE(err.find("norm_num_groups"), std::string::npos) << err;
  vttest::write_file(dir.file("v/config.json"), vae_config_to_json(tiny_config()));
  EXPECT_TRUE(VaeEngine::create(o, &err)) << err;

  auto expect_error = [&](EngineOptions bad, const std::string &needle) {
    std::string e;
    EXPECT_FALSE(VaeEngine::create(bad, &e)) << needle;
    EXPECT_NE(e.find(needle), std::string::npos) << e;
  };
  EngineOptions b = o;
  b.chunk_frames = 6;
  expect_error(b, "chunk-frames=6");
  b = o;
  b.model = dir.file("nothing");
  expect_error(b, "does not exist");
  b = o;
  b.device = "tpu:3";
  expect_error(b, "tpu:3");
  b = o;
  b.dtype = "int8";
  expect_error(b, "int8");
  b = o;
  b.model = "";
  expect_error(b, "'model'");
  b = o;
  b.tile_overlap_height = 1.0;
  expect_error(b, "tile-overlap");
  vttest::write_file(dir.file("garbage.pt"), "not a model");
  b = o;
  b.model = dir.file("garbage.pt");
  expect_error(b, "TorchScript");
}

// ---------------------------------------------------------------- streaming

// Every clip length 1..40 (also those the element refuses) streams to exactly what the
// whole-clip chunked call gives, holding at most one chunk's frames.
TEST_F(TinyVae, CpuEngineKeepsTensorMemoryInTheHeap) {
  // tune-malloc (default) on CPU: clip-sized tensors are not page-faulted afresh per clip.
  auto eng = vaetest::make_engine(options());
  ASSERT_TRUE(eng);
  EXPECT_EQ(vttest::heap_keeps_large_blocks(), "");
}

TEST_F(TinyVae, StreamingEqualsWholeClipForEveryLength) {
  auto eng = vaetest::make_engine(options());
  ASSERT_TRUE(eng);
  at::Tensor all = at::randint(0, 256, {40, 16, 16, 3}, at::TensorOptions().dtype(at::kByte));
  for (int T = 1; T <= 40; T++) {
    at::Tensor u8 = all.narrow(0, 0, T).contiguous();
    std::string why;
    at::Tensor s = stream(*eng, u8, T, &why);
    ASSERT_TRUE(s.defined()) << "T=" << T << ": " << why;
    at::Tensor w = latent_from_raw(*eng, encode_raw(*eng, dequantize_frames(u8)), T);
    ASSERT_EQ(s.sizes(), w.sizes()) << "T=" << T;
    EXPECT_LT(rel_l2(s, w), 1e-6) << "T=" << T;
    int k = 8, r = T % k, first = T < k ? T : k + r;
    EXPECT_LE(eng->peak_frames_held(), first) << "T=" << T << ": frames are released once encoded";
  }
}

TEST_F(TinyVae, StreamingWithTilesEqualsWholeClip) {
  auto o = options();
  o.tile_height = 32;  // the reference's tiles: 3x3 of them, blended
  o.tile_width = 48;
  o.tile_overlap_height = 0.25;
  o.tile_overlap_width = 1.0 / 3;
  auto eng = vaetest::make_engine(o);
  ASSERT_TRUE(eng);
  for (int T : {1, 5, 17, 21}) {
    at::Tensor u8 = at::randint(0, 256, {T, 64, 96, 3}, at::TensorOptions().dtype(at::kByte));
    at::Tensor s = stream(*eng, u8, 1);
    ASSERT_TRUE(s.defined());
    at::Tensor w = latent_from_raw(*eng, encode_raw(*eng, dequantize_frames(u8)), 1);
    EXPECT_EQ(s.sizes(), (c10::IntArrayRef{8, (T - 1) / 4 + 1, 8, 12}));
    EXPECT_LT(rel_l2(s, w), 1e-6) << "T=" << T;
  }
}

TEST_F(TinyVae, SampleNoiseIsSeededBySeedAndSampleId) {
  auto o = options();
  o.latent = LatentKind::Sample;
  o.seed = 42;
  auto a = vaetest::make_engine(o);
  auto b = vaetest::make_engine(o);
  o.seed = 43;
  auto c = vaetest::make_engine(o);
  at::Tensor u8 = at::randint(0, 256, {9, 16, 16, 3}, at::TensorOptions().dtype(at::kByte));
  at::Tensor a1 = stream(*a, u8, 1), b1 = stream(*b, u8, 1), a2 = stream(*a, u8, 2), c1 = stream(*c, u8, 1);
  EXPECT_TRUE(at::equal(a1, b1)) << "reproducible";
  EXPECT_FALSE(at::equal(a1, a2)) << "sample id changes the noise";
  EXPECT_FALSE(at::equal(a1, c1)) << "seed changes the noise";
}

// ---------------------------------------------------------------- bad clips

TEST_F(TinyVae, UnusableClipsAreRefusedAndTheEngineGoesOn) {
  auto o = options();
  o.allow_any_length = false;
  auto eng = vaetest::make_engine(o);
  ASSERT_TRUE(eng);
  std::string why;
  EXPECT_FALSE(eng->begin_clip(1, 10, 16, 16, &why));
  EXPECT_NE(why.find("10 frames"), std::string::npos) << why;
  EXPECT_NE(why.find("1 + 4n"), std::string::npos) << why;
  EXPECT_NE(why.find("use 9 or 13"), std::string::npos) << why;
  EXPECT_TRUE(eng->failure_is_settings()) << "the clip length comes from the source's num-frames";
  EXPECT_FALSE(eng->begin_clip(1, 0, 16, 16, &why));
  EXPECT_FALSE(eng->begin_clip(1, 2147483645, 16, 16, &why)) << "1 + 4n, but no slot per frame for 2^31 frames";
  EXPECT_NE(why.find("longer than"), std::string::npos) << why;
  EXPECT_FALSE(eng->begin_clip(1, 9, 20, 16, &why));
  EXPECT_NE(why.find("divisible"), std::string::npos) << why;
  // A clip abandoned midway leaves the engine ready for the next.
  at::Tensor u8 = at::randint(0, 256, {9, 16, 16, 3}, at::TensorOptions().dtype(at::kByte));
  ASSERT_TRUE(eng->begin_clip(1, 9, 16, 16, &why));
  at::Tensor f0 = u8[0].contiguous();
  ASSERT_TRUE(eng->push_frame(f0.data_ptr<uint8_t>(), 48, &why));
  EXPECT_EQ(eng->finish_clip(&why), nullptr);
  EXPECT_NE(why.find("incomplete"), std::string::npos);
  EXPECT_FALSE(eng->failure_is_settings()) << "a clip cut short is this clip's problem";
  EXPECT_FALSE(eng->in_clip());
  EXPECT_TRUE(stream(*eng, u8, 2).defined());
  EXPECT_FALSE(eng->push_frame(f0.data_ptr<uint8_t>(), 48, &why)) << "a frame outside a clip";
}

// ---------------------------------------------------------------- clip framing (push)

namespace {
// Frame i of a clip of T frames, 16x16, 40 ms each.
FrameInfo frame_of(uint64_t sample, uint64_t clip_index, uint32_t i, uint32_t T) {
  FrameInfo f;
  f.sample_id = sample;
  f.epoch = 2;
  f.clip_index = clip_index;
  f.frame_index = i;
  f.num_frames = T;
  f.width = f.height = 16;
  f.pts = (clip_index * 100 + i) * 40 * GST_MSECOND;
  f.duration = 40 * GST_MSECOND;
  if (i == 0) f.caption = "clip " + std::to_string(sample);
  return f;
}
}  // namespace

TEST_F(TinyVae, PushFramesClipsAndDropsBrokenOnes) {
  auto eng = vaetest::make_engine(options());
  ASSERT_TRUE(eng);
  at::Tensor u8 = at::randint(0, 256, {5, 16, 16, 3}, at::TensorOptions().dtype(at::kByte));
  auto push = [&](const FrameInfo &f) {
    return eng->push(f, u8[f.frame_index % 5].contiguous().data_ptr<uint8_t>(), 48, 768);
  };
  using Kind = FrameOutcome::Kind;

  // A whole clip: its latent at the last frame, equal to the plain streaming API's, with its times.
  for (uint32_t i = 0; i < 4; i++) {
    FrameOutcome r = push(frame_of(7, 0, i, 5));
    EXPECT_EQ(r.kind, Kind::kAccepted);
    EXPECT_TRUE(r.dropped.empty());
  }
  FrameOutcome r = push(frame_of(7, 0, 4, 5));
  ASSERT_EQ(r.kind, Kind::kLatent) << r.error;
  ASSERT_NE(r.latent, nullptr);
  auto latent = tensor_from_buffer(r.latent, nullptr);
  ASSERT_TRUE(latent);
  EXPECT_TRUE(at::equal(latent->clone(), stream(*eng, u8, 7)));
  gst_buffer_unref(r.latent);
  EXPECT_EQ(r.clip.sample_id, 7u);
  EXPECT_EQ(r.clip.caption, "clip 7");
  EXPECT_EQ(r.pts, 0u);
  EXPECT_EQ(r.duration, 5 * 40 * GST_MSECOND);

  // Joined mid-clip: one drop, the clip's later frames skipped quietly.
  r = push(frame_of(8, 1, 2, 5));
  ASSERT_EQ(r.dropped.size(), 1u);
  EXPECT_EQ(r.dropped[0].sample_id, 8u);
  EXPECT_EQ(r.dropped[0].epoch, 2u);
  EXPECT_EQ(r.dropped[0].clip_index, 1u);
  EXPECT_NE(r.dropped[0].reason.find("started at frame 2"), std::string::npos) << r.dropped[0].reason;
  EXPECT_TRUE(push(frame_of(8, 1, 3, 5)).dropped.empty());

  // The next clip starts before this one is complete: this one dropped, the next one taken.
  push(frame_of(9, 2, 0, 5));
  push(frame_of(9, 2, 1, 5));
  r = push(frame_of(10, 3, 0, 5));
  EXPECT_EQ(r.kind, Kind::kAccepted);
  ASSERT_EQ(r.dropped.size(), 1u);
  EXPECT_EQ(r.dropped[0].sample_id, 9u);
  EXPECT_NE(r.dropped[0].reason.find("after 2 of 5 frames"), std::string::npos) << r.dropped[0].reason;
  EXPECT_TRUE(eng->in_clip());

  // A frame out of place drops the clip; so does a buffer too small to map.
  r = push(frame_of(10, 3, 3, 5));
  ASSERT_EQ(r.dropped.size(), 1u);
  EXPECT_NE(r.dropped[0].reason.find("where frame 1"), std::string::npos) << r.dropped[0].reason;
  EXPECT_TRUE(push(frame_of(10, 3, 4, 5)).dropped.empty()) << "the rest of a dropped clip is skipped";
  push(frame_of(11, 4, 0, 5));
  r = eng->push(frame_of(11, 4, 1, 5), nullptr, 0, 100);
  ASSERT_EQ(r.dropped.size(), 1u);
  EXPECT_NE(r.dropped[0].reason.find("100 bytes, too few for 16x16 RGB"), std::string::npos) << r.dropped[0].reason;

  // End of stream and a size change give up the clip in progress, once.
  push(frame_of(12, 5, 0, 5));
  EXPECT_FALSE(eng->frame_size_changed(16, 16)) << "the clip's own size";
  auto d = eng->frame_size_changed(32, 16);
  ASSERT_TRUE(d);
  EXPECT_NE(d->reason.find("changed to 32x16"), std::string::npos) << d->reason;
  EXPECT_FALSE(eng->end_of_stream());
  push(frame_of(13, 6, 0, 5));
  d = eng->end_of_stream();
  ASSERT_TRUE(d);
  EXPECT_EQ(d->sample_id, 13u);
  EXPECT_NE(d->reason.find("after 1 of 5"), std::string::npos) << d->reason;

  // A clip length the VAE cannot use is the settings' fault: an error, not a drop.
  auto strict = options();
  strict.allow_any_length = false;
  auto e2 = vaetest::make_engine(strict);
  ASSERT_TRUE(e2);
  r = e2->push(frame_of(1, 0, 0, 4), u8[0].contiguous().data_ptr<uint8_t>(), 48, 768);
  EXPECT_EQ(r.kind, Kind::kSettingsError);
  EXPECT_NE(r.error.find("1 + 4n"), std::string::npos) << r.error;
  EXPECT_TRUE(r.dropped.empty());
  EXPECT_FALSE(e2->in_clip());
}

// ---------------------------------------------------------------- out of memory

TEST_F(TinyVae, OutOfMemoryRetriesWithSmallerTiles) {
  auto o = options();
  o.fake_oom_pixels = 32 * 32;  // 64x64 frames fail, 32x32 tiles pass
  auto eng = vaetest::make_engine(o);
  ASSERT_TRUE(eng);
  std::vector<std::string> warnings;
  eng->set_warning_callback([&](const std::string &w) { warnings.push_back(w); });
  at::Tensor u8 = at::randint(0, 256, {17, 64, 64, 3}, at::TensorOptions().dtype(at::kByte));
  std::string why;
  at::Tensor s = stream(*eng, u8, 77, &why);
  ASSERT_TRUE(s.defined()) << why;
  EXPECT_EQ(eng->oom_retries(), 1);
  ASSERT_EQ(warnings.size(), 1u);
  EXPECT_NE(warnings[0].find("sample-id 77"), std::string::npos) << warnings[0];
  EXPECT_NE(warnings[0].find("17 frames of 64x64"), std::string::npos) << warnings[0];
  EXPECT_NE(warnings[0].find("32x32 tiles"), std::string::npos) << warnings[0];
  // Same as asking for those tiles in the first place.
  auto t = options();
  t.tile_height = t.tile_width = 32;
  t.tile_overlap_height = t.tile_overlap_width = 0.25;  // the retry blends a quarter of a tile
  auto tiled = vaetest::make_engine(t);
  at::Tensor ref = latent_from_raw(*tiled, encode_raw(*tiled, dequantize_frames(u8)), 77);
  EXPECT_LT(rel_l2(s, ref), 1e-6);
  EXPECT_EQ(s.sizes(), (c10::IntArrayRef{8, 5, 8, 8}));

  // When even the smallest tiles fail: an error for this clip, and the engine goes on.
  o.fake_oom_pixels = 100;
  auto hopeless = vaetest::make_engine(o);
  EXPECT_FALSE(stream(*hopeless, u8, 78, &why).defined());
  EXPECT_NE(why.find("smallest tiles"), std::string::npos) << why;
  EXPECT_NE(why.find("sample-id 78"), std::string::npos) << why;
  EXPECT_FALSE(hopeless->in_clip());
  EXPECT_TRUE(hopeless->failure_is_fatal());
}

TEST_F(TinyVae, TilesThatWouldChangeTheShapeAreRefused) {
  auto o = options();
  o.tile_height = 16;
  o.tile_width = 24;
  o.tile_overlap_height = 0.25;
  o.tile_overlap_width = 1.0 / 3;
  auto eng = vaetest::make_engine(o);
  ASSERT_TRUE(eng);
  std::string why = eng->check_clip(9, 48, 32);
  EXPECT_NE(why.find("tile-height=16"), std::string::npos) << why;
  EXPECT_EQ(eng->check_clip(9, 24, 16), "") << "a frame that fits one tile is not tiled";
}

// ---------------------------------------------------------------- TorchScript encoders

namespace {
// Scripts two small modules with the system Python's torch: a video encoder (8x8 average
// pooling in space, 2x in time) and an image encoder (8x8 average pooling).
bool make_script_models(const vttest::TempDir &dir) {
  std::string py = dir.file("make.py");
  vttest::write_file(py, R"(import sys, torch
class Video(torch.nn.Module):
    @torch.jit.export
    def encode(self, x):
        return torch.nn.functional.avg_pool3d(x, (1, 8, 8))[:, :, ::2] * 2.0
    def forward(self, x):
        return self.encode(x)
class Image(torch.nn.Module):
    @torch.jit.export
    def encode(self, x):
        assert x.dim() == 4 and x.size(0) <= 3
        return torch.nn.functional.avg_pool2d(x, 8) - 1.0
    def forward(self, x):
        return self.encode(x)
torch.jit.script(Video()).save(sys.argv[1] + '/video.pt')
torch.jit.script(Image()).save(sys.argv[1] + '/image.pt')
)");
  std::string cmd = vttest::env_or("PYTHON", "/usr/bin/python3") + " '" + py + "' '" + dir.path() + "'";
  return std::system(cmd.c_str()) == 0;
}
}  // namespace

TEST(VaeTorchScript, VideoAndPerFrameEncoders) {
  vttest::TempDir dir;
  ASSERT_TRUE(make_script_models(dir));
  at::Tensor u8 = at::randint(0, 256, {11, 16, 24, 3}, at::TensorOptions().dtype(at::kByte));
  at::Tensor x = dequantize_frames(u8);
  EngineOptions o;
  o.device = "cpu";
  o.dtype = "float32";
  // Video encoder, called once per temporal chunk: chunks [0, 11) here (k = 8, r = 3).
  o.model = dir.file("video.pt");
  auto v = vaetest::make_engine(o);
  ASSERT_TRUE(v);
  EXPECT_FALSE(v->native());
  at::Tensor sv = stream(*v, u8, 1);
  ASSERT_TRUE(sv.defined());
  at::Tensor want = (at::avg_pool3d(x, {1, 8, 8}).slice(2, 0, 11, 2) * 2.0)[0];
  EXPECT_EQ(sv.sizes(), want.sizes());
  EXPECT_LT(rel_l2(sv, want), 1e-6);
  // Two chunks: [0, 8 + 1) and [9, 17): each subsampled on its own.
  at::Tensor u17 = at::randint(0, 256, {17, 16, 24, 3}, at::TensorOptions().dtype(at::kByte));
  at::Tensor x17 = dequantize_frames(u17);
  at::Tensor s17 = stream(*v, u17, 1);
  at::Tensor w17 = at::cat({at::avg_pool3d(x17.narrow(2, 0, 9), {1, 8, 8}).slice(2, 0, 9, 2),
                            at::avg_pool3d(x17.narrow(2, 9, 8), {1, 8, 8}).slice(2, 0, 8, 2)},
                           2)[0] * 2.0;
  EXPECT_LT(rel_l2(s17, w17), 1e-6);
  // Image encoder: frames folded into the batch, 3 per call, stacked along time.
  o.model = dir.file("image.pt");
  o.per_frame = true;
  o.micro_batch_size = 3;
  auto im = vaetest::make_engine(o);
  ASSERT_TRUE(im);
  at::Tensor si = stream(*im, u8, 1);
  ASSERT_TRUE(si.defined());
  at::Tensor wi = (at::avg_pool2d(x[0].transpose(0, 1), 8) - 1.0).transpose(0, 1);  // [3, T, 2, 3]
  EXPECT_EQ(si.sizes(), wi.sizes());
  EXPECT_LT(rel_l2(si, wi), 1e-6);
  // Tiles are for the native encoder; a module without encode is refused.
  o.tile_height = 8;
  std::string err;
  EXPECT_FALSE(VaeEngine::create(o, &err));
  EXPECT_NE(err.find("tile-height"), std::string::npos) << err;
}
