#include "vae_engine.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <c10/core/InferenceMode.h>
#include <sys/mman.h>
#include <sys/stat.h>

#include <algorithm>
#include <array>
#include <cstdlib>
#include <stdexcept>

#include "cpu_heap.h"
#include "device_dtype.h"
#include "encode_checks.h"
#include "encoder_cache_entry.h"
#include "first_line.h"
#include "models/image_condition.h"
#include "models/vae/vae_encoder.h"
#include "out_of_memory.h"
#include "script_encoder.h"
#include "seeded_hash.h"
#include "tensor_buffer.h"
#include "vae_engine_tensors.h"

#ifdef VIDEOTRAIN_HAVE_CUDA
#include <c10/cuda/CUDACachingAllocator.h>
#endif

namespace videotrain::vae {

const char *latent_kind_name(LatentKind k) {
  switch (k) {
    case LatentKind::Sample: return "sample";
    case LatentKind::Mode: return "mode";
    case LatentKind::Moments: return "moments";
  }
  return "?";
}

namespace {

// Out of memory with no smaller tiles left: the element stops rather than drop every clip.
struct OutOfMemoryFatal : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// The positions of tile t that count towards norm-scope=clip statistics at downscale d (rows
// [0, 1), columns [2, 3) of its h x w activations): from the middle of its overlap with the
// previous tile to the middle of its overlap with the next, so that the tiles' shares
// partition the frame as a single untiled pass sees it.
std::array<int64_t, 4> owned_share(const TilePlan &p, int H, int W, size_t t, int64_t d, int64_t h, int64_t w) {
  auto share = [d](const std::vector<int64_t> &o, size_t k, int64_t tile, int64_t total, int64_t extent) {
    auto bound = [&](size_t m) -> int64_t {
      if (m == 0) return 0;
      if (m >= o.size()) return total;
      return (o[m] + std::min(o[m - 1] + tile, total)) / 2;
    };
    const int64_t origin = o[k] / d;
    const int64_t a = std::clamp<int64_t>(bound(k) / d - origin, 0, extent);
    return std::pair<int64_t, int64_t>{a, std::clamp<int64_t>(bound(k + 1) / d - origin, a, extent)};
  };
  auto rows = share(p.ys, t / p.xs.size(), p.tile_h, H, h), cols = share(p.xs, t % p.xs.size(), p.tile_w, W, w);
  return {rows.first, rows.second, cols.first, cols.second};
}

}  // namespace

// ---------------------------------------------------------------- engine state

struct Clip {
  bool active = false;
  uint64_t sample_id = 0;
  uint32_t epoch = 0;
  int T = 0, H = 0, W = 0;
  std::vector<std::pair<int, int>> chunks;
  size_t next_chunk = 0;
  int received = 0;
  int held = 0;
  std::vector<at::Tensor> frames;  // uint8 [H, W, 3] each; undefined once released
  at::Tensor video;                // whole-clip float input (tensor API)
  // A condition video (image-to-video): its given frames as float [1, 3, 1, H, W] on the device,
  // zeros elsewhere, made chunk by chunk (no frames vector).
  at::Tensor cond_first, cond_last;
  bool condition_video() const { return cond_first.defined(); }
  at::Tensor first_u8, last_u8;    // the clip's first and last frames, kept for its condition
  TilePlan plan;
  std::vector<StreamCache> caches;             // one per tile
  std::vector<std::vector<at::Tensor>> outs;  // per tile, per chunk

  void reset_tiles() {
    caches.assign(plan.count(), StreamCache{});
    outs.assign(plan.count(), {});
    next_chunk = 0;
  }
};

struct VaeEngine::Impl {
  EngineOptions opts;
  c10::Device device{c10::kCPU};
  c10::ScalarType dtype = at::kFloat;
  std::unique_ptr<VaeEncoder> enc;
  CachedClip last;        // the last finished clip's moments (and condition), for the latent cache
  std::string cache_key;  // the encoder's part of latent cache keys, once computed
  bool retain = false;
  std::function<void(const std::string &)> warn;
  int64_t chunks_encoded = 0, oom_retries = 0, peak_frames = 0;
  bool fatal = false;             // the last failure was out of memory at the smallest tiles
  bool settings_failure = false;  // the last failure would recur on every clip
  int64_t clips_done = 0;
  Clip clip;

  // A failure to encode: before any clip succeeded it comes from the model or the settings
  // (a TorchScript model that throws on the first clip throws on all), not from the clip.
  std::string encode_failure(const std::string &what, const std::exception &e) {
    std::string why = what + " failed: " + error_message(e.what());
    if (clips_done > 0) return why;
    settings_failure = true;
    why = "the encoder failed on the first clip, so it would fail on every clip: " + why;
    if (!enc->native() && !opts.per_frame)
      why += " (the TorchScript encode method gets the clip as [1, 3, T, H, W]; an image encoder taking "
             "[N, 3, H, W] needs per-frame=true)";
    return why;
  }

  std::string clip_name(const Clip &c) const {
    return "clip sample-id " + std::to_string(c.sample_id) + " (" + std::to_string(c.T) + " frames of " +
           std::to_string(c.W) + "x" + std::to_string(c.H) + ")";
  }

  // Frames [s, e) of a condition video: the given frames where they fall, zeros elsewhere.
  at::Tensor condition_chunk(const Clip &c, int s, int e) const {
    at::Tensor x = at::zeros({1, 3, e - s, c.H, c.W}, c.cond_first.options());
    if (s == 0) x.narrow(2, 0, 1).copy_(c.cond_first);
    if (c.cond_last.defined() && e == c.T) x.narrow(2, e - s - 1, 1).copy_(c.cond_last);
    return x;
  }

  at::Tensor chunk_input(Clip &c, int s, int e) {
    at::Tensor x;
    if (c.condition_video()) {
      x = condition_chunk(c, s, e);
    } else if (c.video.defined()) {
      x = c.video.narrow(2, s, e - s);
    } else {
      std::vector<at::Tensor> fr(c.frames.begin() + s, c.frames.begin() + e);
      x = dequantize_frames(at::stack(fr).to(device));
    }
    return x.to(device, dtype);
  }

  at::Tensor run_tile(Clip &c, const at::Tensor &x, size_t t) {
    at::Tensor region = c.plan.region(x, t);
    fake_oom_check(region);
    return enc->forward(region, c.caches[t]);
  }

  void fake_oom_check(const at::Tensor &region) const {
    if (opts.fake_oom_pixels > 0 && region.size(3) * region.size(4) > opts.fake_oom_pixels)
      // (SourceLocation, msg): the one constructor that LibTorch 1.13 and every 2.x share.
      throw c10::OutOfMemoryError({__func__, __FILE__, static_cast<uint32_t>(__LINE__)},
                                  "CUDA out of memory (test hook: a " + std::to_string(region.size(4)) + "x" +
                                      std::to_string(region.size(3)) + " tile is over the fake limit of " +
                                      std::to_string(opts.fake_oom_pixels) + " pixels)");
  }

  // ------------------------------------------------ norm-scope=clip

  bool clip_scope() const { return opts.norm_scope == NormScope::Clip; }

  SpillTo spill_to() const {
    if (opts.clip_spill == ClipSpill::File || (opts.clip_spill == ClipSpill::Auto && device.is_cpu()))
      return SpillTo::File;
    return SpillTo::Host;  // never the device: device memory would grow with the clip
  }

  // Tile t of frames [s, e) as [1, 3, n, h, w] on the device in the compute dtype; only the
  // tile's region of the uint8 frames is converted, one chunk at a time.
  at::Tensor tile_input(Clip &c, int s, int e, size_t t) {
    const auto b = c.plan.bounds(t, c.H, c.W);
    at::Tensor x;
    if (c.condition_video()) {
      x = condition_chunk(c, s, e).slice(3, b[0], b[1]).slice(4, b[2], b[3]);
    } else if (c.video.defined()) {
      x = c.video.narrow(2, s, e - s).slice(3, b[0], b[1]).slice(4, b[2], b[3]);
    } else {
      std::vector<at::Tensor> fr;
      for (int f = s; f < e; f++) fr.push_back(c.frames[f].slice(0, b[0], b[1]).slice(1, b[2], b[3]));
      x = dequantize_frames(at::stack(fr).to(device));
    }
    fake_oom_check(x);
    return x.to(device, dtype);
  }

  // The whole clip (all its frames in) through forward_clip_scope, filling c.outs with each
  // tile's moments as advance() would. Held meanwhile: the uint8 frames, one chunk of one
  // tile as float, the encoder's working set for that chunk, and the levels where spill_to()
  // puts them. Out of memory: smaller tiles, the clip again from its frames.
  void encode_clip_scope(Clip &c) {
    for (;;) {
      ClipScopeInput in;
      in.tiles = c.outs.size();
      in.chunks = c.chunks.size();
      in.chunk = [&](size_t t, size_t k) { return tile_input(c, c.chunks[k].first, c.chunks[k].second, t); };
      if (c.plan.tiled)
        in.owned = [p = c.plan, H = c.H, W = c.W](size_t t, int64_t d, int64_t h, int64_t w) {
          return owned_share(p, H, W, t, d, h, w);
        };
      try {
        std::vector<at::Tensor> tiles = enc->forward_clip_scope(in, spill_to());
        for (size_t t = 0; t < tiles.size(); t++) c.outs[t] = {tiles[t]};
      } catch (const c10::Error &err) {
        if (!is_out_of_memory(err)) throw;
        handle_oom(c, err);
        continue;
      }
      chunks_encoded += static_cast<int64_t>(c.chunks.size());
      c.next_chunk = c.chunks.size();
      return;
    }
  }

  // Smaller tiles after running out of memory, or OutOfMemoryFatal when there are none.
  void handle_oom(Clip &c, const c10::Error &e) {
#ifdef VIDEOTRAIN_HAVE_CUDA
    if (device.is_cuda()) c10::cuda::CUDACachingAllocator::emptyCache();
#endif
    bool frames_there = c.video.defined() || c.condition_video();
    if (!frames_there) {
      frames_there = true;
      for (int f = 0; f < c.received; f++) frames_there = frames_there && c.frames[f].defined();
    }
    std::string what = e.msg().substr(0, e.msg().find('\n'));
    if (!enc->native())
      throw OutOfMemoryFatal("out of memory encoding " + clip_name(c) + " (tiles apply to VAE folders only): " + what);
    if (!frames_there)
      throw OutOfMemoryFatal("out of memory encoding " + clip_name(c) + " with " + c.plan.describe() +
                             " after its first frames were released (retain-frames is off): " + what);
    TilePlan next;
    if (!enc->smaller_tiles(c.plan, c.H, c.W, &next))
      throw OutOfMemoryFatal("out of memory encoding " + clip_name(c) + " even with the smallest tiles (" +
                             c.plan.describe() + "): " + what);
    oom_retries++;
    if (warn)
      warn("out of memory encoding " + clip_name(c) + " with " + c.plan.describe() + "; retrying with " +
           next.describe());
    c.plan = next;
    c.reset_tiles();
  }

  // tune-malloc keeps every freed CPU block in the heap (cpu_heap.h). What outlives a chunk (the
  // causal conv caches, the chunk's moments) is allocated among the chunk's activations; left
  // there, it splits the free space so that the next chunk's activations no longer fit below it
  // and the heap's touched part grew with every chunk: +50-60 MiB from 17 to 97 frames at 256x256
  // with the tiny VAE (bench/vae_memory_bench.cpp), up to +200 MiB in the runs. Moved
  // to pages of their own after each chunk, they leave the heap empty between chunks, and every
  // chunk reuses the same blocks.
  bool keep_off_heap() const { return device.is_cpu() && opts.tune_malloc; }
  static void off_heap(at::Tensor &t) {
    if (!t.defined() || !t.device().is_cpu() || t.numel() == 0) return;
    const size_t bytes = size_t(t.numel()) * t.element_size();
    void *p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) return;  // stays where it is: more memory, not an error
    at::Tensor moved = at::from_blob(p, t.sizes(), [bytes](void *q) { munmap(q, bytes); }, t.options());
    moved.copy_(t);
    t = moved;
  }
  void chunk_state_off_heap(Clip &c, size_t t) {
    if (!keep_off_heap()) return;
    off_heap(c.outs[t].back());
    for (at::Tensor &e : c.caches[t].entries) off_heap(e);
  }

  // Encodes every chunk whose frames are all in (norm-scope=clip: nothing before the clip's end).
  void advance(Clip &c, int available) {
    if (clip_scope()) return;
    while (c.next_chunk < c.chunks.size()) {
      auto [s, e] = c.chunks[c.next_chunk];
      if (available < e) return;
      try {
        at::Tensor x = chunk_input(c, s, e);
        for (size_t t = 0; t < c.outs.size(); t++) {
          c.outs[t].push_back(run_tile(c, x, t));
          chunk_state_off_heap(c, t);
        }
      } catch (const c10::Error &err) {
        if (!is_out_of_memory(err)) throw;
        handle_oom(c, err);
        continue;
      }
      chunks_encoded++;
      if (!retain && !c.video.defined() && !c.condition_video())
        for (int f = s; f < e; f++)
          if (c.frames[f].defined()) {
            c.frames[f] = at::Tensor();
            c.held--;
          }
      c.next_chunk++;
    }
  }

  at::Tensor assemble(Clip &c) {
    std::vector<at::Tensor> tiles;
    for (auto &o : c.outs) tiles.push_back(o.size() == 1 ? o[0] : at::cat(o, 2));
    return c.plan.tiled ? join_tiles(c.plan, std::move(tiles)) : tiles[0];
  }

  void start(Clip &c, uint64_t sample_id, int T, int H, int W, int chunk_frames) {
    c = Clip();
    c.active = true;
    c.sample_id = sample_id;
    c.T = T, c.H = H, c.W = W;
    c.chunks = enc->chunks(T, chunk_frames);
    c.plan = enc->plan_tiles(H, W, tile_request(opts));
    c.reset_tiles();
  }

  // The condition of clip c (all its frames in): the frames of its condition video that the family
  // encodes, through the same chunks, tiles and out-of-memory retry as the clip, made into the
  // family's condition (VaeEncoder::condition: e.g. [tc + C, t, h, w], the mask then the mode
  // normalised), float32 on the device.
  at::Tensor condition_of(const Clip &c) {
    const int frames = enc->condition_frames(c.T);
    Clip v;
    start(v, c.sample_id, frames, c.H, c.W, opts.chunk_frames);
    v.plan = c.plan;  // the tiles the clip ended with (after any retry)
    v.reset_tiles();
    v.cond_first = dequantize_frames(c.first_u8.unsqueeze(0)).to(device, dtype);
    if (opts.condition == Condition::FirstLast) v.cond_last = dequantize_frames(c.last_u8.unsqueeze(0)).to(device, dtype);
    advance(v, frames);
    if (clip_scope()) encode_clip_scope(v);
    return enc->condition(assemble(v).to(at::kFloat), c.T, static_cast<models::ConditionFrames>(opts.condition))
        .select(0, 0);
  }

  // The frames a condition is made from, uint8 [n, H, W, 3] as decoded (n = 1 first-frame,
  // 2 first-last-frame): imageencoder's input, so that it needs no pixels of its own.
  at::Tensor condition_frames_of(const Clip &c) const {
    return opts.condition == Condition::FirstLast ? at::stack({c.first_u8, c.last_u8}) : c.first_u8.unsqueeze(0).clone();
  }

  // The posterior noise of a clip: drawn on the CPU from the seed, the sample id and the epoch
  // (epoch 0 draws what the sample id alone drew before epochs counted), so a clip gets the same
  // latent on any device, in any run and from the latent cache, and a new draw each epoch.
  static uint64_t noise_id(uint64_t sample_id, uint32_t epoch) {
    return epoch == 0 ? sample_id : sample_id ^ mix64(0x65706f6368ull + epoch);
  }
  at::Tensor posterior_noise(at::IntArrayRef sizes, uint64_t sample_id) const {
    auto gen = at::make_generator<at::CPUGeneratorImpl>(mix64(opts.seed ^ mix64(sample_id)));
    return at::randn(sizes, gen, at::TensorOptions().dtype(at::kFloat));
  }

  // The emitted latent [C, t, h, w] of the raw output: the encoder's own output (not native), the
  // moments, or the model's latent from the posterior's mode or a sample.
  at::Tensor latent(const at::Tensor &raw_in, uint64_t sample_id, const at::Tensor &noise_in) {
    at::Tensor raw = raw_in.to(at::kFloat);
    if (!enc->native()) return raw.select(0, 0);
    if (opts.latent == LatentKind::Moments) return enc->moments_out(raw).select(0, 0);
    at::Tensor noise;
    if (opts.latent == LatentKind::Sample)
      noise = noise_in.defined() ? noise_in : posterior_noise(raw.narrow(1, 0, raw.size(1) / 2).sizes(), sample_id);
    return enc->latent(raw, noise).select(0, 0);
  }
};

// ---------------------------------------------------------------- tensor API

at::Tensor dequantize_frames(const at::Tensor &u8) {
  return u8.permute({3, 0, 1, 2}).unsqueeze(0).to(at::kFloat).div(127.5).sub(1.0);
}

at::Tensor encode_raw(VaeEngine &engine, const at::Tensor &video, int chunk_frames) {
  auto *im = engine.impl();
  c10::InferenceMode guard;
  Clip c;
  int T = static_cast<int>(video.size(2));
  im->start(c, 0, T, static_cast<int>(video.size(3)), static_cast<int>(video.size(4)),
            chunk_frames > 0 ? chunk_frames : im->opts.chunk_frames);
  c.video = video;
  for (int t = 1; t <= T; t++) im->advance(c, t);  // as the frames would arrive
  if (im->clip_scope()) im->encode_clip_scope(c);
  return im->assemble(c).to(at::kCPU, at::kFloat);
}

at::Tensor latent_from_raw(VaeEngine &engine, const at::Tensor &raw, uint64_t sample_id, const at::Tensor &noise) {
  at::NoGradGuard ng;
  return engine.impl()->latent(raw, sample_id, noise).to(at::kCPU, at::kFloat);
}

// ---------------------------------------------------------------- VaeEngine

VaeEngine::VaeEngine() : impl_(std::make_unique<Impl>()) {}
VaeEngine::~VaeEngine() = default;

std::unique_ptr<VaeEngine> VaeEngine::create(const EngineOptions &opts, std::string *error) {
  auto fail = [&](const std::string &why) -> std::unique_ptr<VaeEngine> {
    if (error) *error = why;
    return nullptr;
  };
  std::unique_ptr<VaeEngine> eng(new VaeEngine());
  Impl &im = *eng->impl_;
  im.opts = opts;
  // Test hook for element tests, which cannot reach the options: tiles over N pixels fail as if
  // out of memory (exercises the retry on CPU). Read once per engine, here rather than in the face.
  // (g_ascii_strtoll: atoll is undefined out of range.)
  if (im.opts.fake_oom_pixels == 0)
    if (const char *fake = std::getenv("VIDEOTRAIN_VAEENCODER_FAKE_OOM_PIXELS"))
      im.opts.fake_oom_pixels = g_ascii_strtoll(fake, nullptr, 10);
  if (std::string bad = check_options(opts); !bad.empty()) return fail(bad);

  DeviceDtype target;
  std::string target_error;
  if (!resolve_device_dtype(opts.device, opts.dtype, &target, &target_error)) return fail(target_error);
  im.device = target.device;
  im.dtype = target.dtype;
  // Best effort (not glibc: no tuning). Large blocks too: full-resolution activations.
  if (im.device.is_cpu() && opts.tune_malloc) retain_large_cpu_blocks();
  im.retain = opts.retain_frames > 0 ||
              (opts.retain_frames < 0 && (im.device.is_cuda() || im.opts.fake_oom_pixels > 0));

  struct stat st;
  if (stat(opts.model.c_str(), &st) != 0) return fail("model '" + opts.model + "' does not exist");
  const bool folder = S_ISDIR(st.st_mode);
  if (std::string bad = check_model_kind(opts, folder); !bad.empty()) return fail(bad);
  try {
    c10::InferenceMode guard;
    im.enc = folder ? VaeEncoder::load(opts.model, im.device, im.dtype)
                    : load_script_encoder(opts.model, im.device, im.dtype, opts.per_frame, opts.micro_batch_size);
  } catch (const std::exception &e) {
    return fail(e.what());
  }
  if (std::string bad = check_encoder(opts, *im.enc); !bad.empty()) return fail(bad);
  return eng;
}

const EngineOptions &VaeEngine::options() const { return impl_->opts; }
std::string VaeEngine::dtype_name() const { return videotrain::dtype_name(impl_->dtype); }
std::string VaeEngine::device_name() const { return videotrain::device_name(impl_->device); }
bool VaeEngine::native() const { return impl_->enc->native(); }
int VaeEngine::temporal_compression() const { return impl_->enc->temporal_compression(); }
int VaeEngine::spatial_compression() const { return impl_->enc->spatial_compression(); }
void VaeEngine::set_warning_callback(std::function<void(const std::string &)> cb) { impl_->warn = std::move(cb); }
int64_t VaeEngine::chunks_encoded() const { return impl_->chunks_encoded; }
int64_t VaeEngine::oom_retries() const { return impl_->oom_retries; }
int64_t VaeEngine::peak_frames_held() const { return impl_->peak_frames; }
bool VaeEngine::failure_is_fatal() const { return impl_->fatal; }
bool VaeEngine::failure_is_settings() const { return impl_->settings_failure; }
bool VaeEngine::in_clip() const { return impl_->clip.active; }
int VaeEngine::frames_received() const { return impl_->clip.received; }
int VaeEngine::frames_expected() const { return impl_->clip.T; }
bool VaeEngine::clip_complete() const { return impl_->clip.active && impl_->clip.received == impl_->clip.T; }

std::string VaeEngine::check_clip(int T, int W, int H) const {
  return check_clip_size(impl_->opts, *impl_->enc, T, W, H);
}

bool VaeEngine::begin_clip(uint64_t sample_id, int T, int W, int H, std::string *why, uint32_t epoch) {
  Impl &im = *impl_;
  abort_clip();
  im.last = CachedClip();
  std::string bad = check_clip(T, W, H);
  // Here, not in check_clip: the face checks a frame size with a 1-frame clip when caps arrive.
  if (bad.empty() && im.opts.condition == Condition::FirstLast && T < 2)
    bad = "condition=first-last-frame needs clips of at least 2 frames (a first and a last); num-frames is 1";
  im.settings_failure = !bad.empty();  // the clip's geometry comes from the source's settings
  if (!bad.empty()) {
    if (why) *why = bad;
    return false;
  }
  im.start(im.clip, sample_id, T, H, W, im.opts.chunk_frames);
  im.clip.epoch = epoch;
  im.clip.frames.resize(T);
  im.fatal = false;
  im.peak_frames = 0;
  return true;
}

bool VaeEngine::push_frame(const uint8_t *rgb, size_t stride, std::string *why) {
  Impl &im = *impl_;
  im.settings_failure = false;
  Clip &c = im.clip;
  if (!c.active) {
    if (why) *why = "frame outside a clip";
    return false;
  }
  if (c.received >= c.T) {
    if (why) *why = "more frames than the clip's " + std::to_string(c.T);
    abort_clip();
    return false;
  }
  try {
    c10::InferenceMode guard;
    // Copy out of the caller's (mapped) buffer; rows may be padded.
    at::Tensor view = at::from_blob(const_cast<uint8_t *>(rgb), {c.H, c.W, 3},
                                    {static_cast<int64_t>(stride), 3, 1}, at::TensorOptions().dtype(at::kByte));
    c.frames[c.received++] = view.clone(at::MemoryFormat::Contiguous);
    if (im.opts.condition != Condition::None) {
      if (c.received == 1) c.first_u8 = c.frames[0];
      if (c.received == c.T) c.last_u8 = c.frames[c.T - 1];
    }
    c.held++;
    im.peak_frames = std::max<int64_t>(im.peak_frames, c.held);
    im.advance(c, c.received);
  } catch (const OutOfMemoryFatal &e) {
    im.fatal = true;
    if (why) *why = e.what();
    abort_clip();
    return false;
  } catch (const std::exception &e) {
    if (why) *why = im.encode_failure("encoding " + im.clip_name(c), e);
    abort_clip();
    return false;
  }
  return true;
}

GstBuffer *VaeEngine::finish_clip(std::string *why) {
  Impl &im = *impl_;
  im.settings_failure = false;
  Clip &c = im.clip;
  if (!c.active || c.received != c.T || (!im.clip_scope() && c.next_chunk != c.chunks.size())) {
    if (why) *why = "clip is incomplete (" + std::to_string(c.received) + " of " + std::to_string(c.T) + " frames)";
    abort_clip();
    return nullptr;
  }
  GstBuffer *buf = nullptr;
  try {
    at::Tensor raw, cond, cond_frames;
    {
      c10::InferenceMode guard;
      if (im.clip_scope()) im.encode_clip_scope(c);
      raw = im.assemble(c);
      if (im.opts.condition != Condition::None) {
        cond = im.condition_of(c);
        cond_frames = im.condition_frames_of(c);
      }
    }
    // Outside inference mode so that downstream autograd may use the latent as an input.
    at::NoGradGuard ng;
    at::Tensor lat = im.latent(raw, Impl::noise_id(c.sample_id, c.epoch), at::Tensor()).to(im.dtype).contiguous();
    buf = buffer_from_tensor(lat);
    if (cond.defined()) {
      im.last.condition = cond.to(at::kCPU, at::kFloat).clone();
      buffer_append_tensor(buf, "condition", cond.to(im.dtype).contiguous().clone());
      im.last.condition_frames = cond_frames;
      buffer_append_tensor(buf, "condition_frames", cond_frames);
    }
    im.last.moments = raw;
    im.clips_done++;
  } catch (const OutOfMemoryFatal &e) {
    im.fatal = true;
    if (why) *why = e.what();
  } catch (const std::exception &e) {
    if (why) *why = im.encode_failure("finishing " + im.clip_name(c), e);
  }
  abort_clip();
  return buf;
}

void VaeEngine::abort_clip() { impl_->clip = Clip(); }

std::string VaeEngine::cache_key(std::string *why) {
  Impl &im = *impl_;
  if (im.cache_key.empty())
    im.cache_key = encoder_cache_key(im.opts, *im.enc, videotrain::dtype_name(im.dtype), im.device.is_cuda(), why);
  return im.cache_key;
}

TensorSpec VaeEngine::moments_spec(int T, int W, int H) const {
  return vae::moments_spec(*impl_->enc, T, W, H);
}

bool VaeEngine::last_moments(CacheEntry *out) const {
  if (!impl_->last.moments.defined()) return false;
  *out = cache_entry_of(impl_->last);
  return true;
}

GstBuffer *VaeEngine::latent_from_moments(const CacheEntry &entry, uint64_t sample_id, uint32_t epoch,
                                          std::string *why) {
  Impl &im = *impl_;
  CachedClip clip;
  if (!cached_clip_of(entry, im.opts.condition, &clip, why)) return nullptr;
  try {
    at::NoGradGuard ng;
    // On the device the encoder would have left them on, so that the latent is bit for bit the same.
    at::Tensor lat =
        im.latent(clip.moments.to(im.device), Impl::noise_id(sample_id, epoch), at::Tensor()).to(im.dtype).contiguous();
    GstBuffer *buf = buffer_from_tensor(lat);
    if (clip.condition.defined()) {
      buffer_append_tensor(buf, "condition", clip.condition.to(im.device, im.dtype).contiguous().clone());
      buffer_append_tensor(buf, "condition_frames", clip.condition_frames);
    }
    return buf;
  } catch (const std::exception &e) {
    *why = first_line(e.what());
    return nullptr;
  }
}

}  // namespace videotrain::vae
