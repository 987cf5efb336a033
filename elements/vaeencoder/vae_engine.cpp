#include "out_of_memory.h"
#include "vae_engine.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <c10/core/InferenceMode.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <torch/cuda.h>
#include <torch/script.h>

#include <algorithm>
#include <array>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <stdexcept>

#include "cpu_heap.h"
#include "cuda_devices.h"
#include "device_rule.h"
#include "dist_env.h"
#include "first_line.h"
#include "jit_load.h"
#include "latent_store.h"
#include "metas.h"
#include "models/vae/cogvideox_encoder.h"
#include "models/vae/wan_config.h"
#include "models/vae/wan_encoder.h"
#include "regular_file.h"
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

// ---------------------------------------------------------------- backends

struct Backend {
  virtual ~Backend() = default;
  // x: [1, 3, n, h, w] on the device in the compute dtype; returns [1, C, t, h', w'].
  virtual at::Tensor encode_chunk(const at::Tensor &x, ConvCache &cache) = 0;
};

struct NativeBackend : Backend {
  std::unique_ptr<CogVideoXEncoder> enc;
  at::Tensor encode_chunk(const at::Tensor &x, ConvCache &cache) override { return enc->forward(x, cache); }
};

// A TorchScript module with an `encode` method: a video encoder called once per temporal
// chunk, or an image encoder fed the chunk's frames in micro-batches.
struct ScriptBackend : Backend {
  torch::jit::Module module;
  bool per_frame = false;
  int micro_batch = 8;

  at::Tensor call(const at::Tensor &x, int64_t want_dim) {
    c10::IValue out = module.get_method("encode")({x});
    if (out.isTuple()) out = out.toTupleRef().elements().at(0);
    if (!out.isTensor()) throw std::runtime_error("the TorchScript encode method did not return a tensor");
    at::Tensor t = out.toTensor();
    if (t.dim() != want_dim || t.size(0) != x.size(0))
      throw std::runtime_error("the TorchScript encode method returned shape " + shape_str(t.sizes().vec()) +
                               " for input " + shape_str(x.sizes().vec()) + "; expected " + std::to_string(want_dim) +
                               " dimensions with the same batch");
    return t;
  }

  at::Tensor encode_chunk(const at::Tensor &x, ConvCache &) override {
    if (!per_frame) return call(x, 5);
    at::Tensor frames = x.select(0, 0).transpose(0, 1);  // [n, 3, H, W]
    std::vector<at::Tensor> outs;
    for (int64_t s = 0; s < frames.size(0); s += micro_batch)
      outs.push_back(call(frames.narrow(0, s, std::min<int64_t>(micro_batch, frames.size(0) - s)).contiguous(), 4));
    return at::cat(outs, 0).transpose(0, 1).unsqueeze(0);  // [1, C, n, h, w]
  }
};

// ---------------------------------------------------------------- tiles and chunks

// diffusers' tiled encode: tile origins every int(tile * (1 - overlap)) pixels; latent tiles
// blend over int(latent_tile * overlap) rows/columns and keep latent_tile - blend of each.
struct TilePlan {
  bool tiled = false;
  int th = 0, tw = 0;
  std::vector<int> ys{0}, xs{0};  // tile origins (one tile at 0,0 when untiled)
  int blend_h = 0, blend_w = 0, keep_h = 0, keep_w = 0;
  std::string describe() const {
    return tiled ? std::to_string(tw) + "x" + std::to_string(th) + " tiles" : std::string("no tiles");
  }
};

TilePlan plan_tiles(int H, int W, int th, int tw, double fh, double fw, int s) {
  TilePlan p;
  if (th <= 0 && tw <= 0) return p;
  if (th <= 0) th = H, fh = 0;  // a tile spans the frame in a dimension left at 0
  if (tw <= 0) tw = W, fw = 0;
  if (!(W > tw || H > th)) return p;  // the frame fits one tile: diffusers does not tile
  p.tiled = true;
  p.th = th, p.tw = tw;
  p.ys.clear();
  p.xs.clear();
  int step_h = std::max(1, static_cast<int>(th * (1 - fh)));
  int step_w = std::max(1, static_cast<int>(tw * (1 - fw)));
  for (int y = 0; y < H; y += step_h) p.ys.push_back(y);
  for (int x = 0; x < W; x += step_w) p.xs.push_back(x);
  int lh = static_cast<int>(th / static_cast<double>(s)), lw = static_cast<int>(tw / static_cast<double>(s));
  p.blend_h = static_cast<int>(lh * fh);
  p.blend_w = static_cast<int>(lw * fw);
  p.keep_h = lh - p.blend_h;
  p.keep_w = lw - p.blend_w;
  return p;
}

// Tiles chosen by the engine itself (out-of-memory retry): sizes and overlaps in whole
// latent pixels, so that the tiles stride by exactly what each keeps and the result has
// the untiled shape.
TilePlan plan_tiles_exact(int H, int W, int th, int tw, int s) {
  TilePlan p;
  th = std::min(th, H), tw = std::min(tw, W);
  if (th >= H && tw >= W) return p;
  p.tiled = true;
  p.th = th, p.tw = tw;
  p.ys.clear();
  p.xs.clear();
  int lh = th / s, lw = tw / s;
  p.blend_h = th < H ? lh / 4 : 0;
  p.blend_w = tw < W ? lw / 4 : 0;
  p.keep_h = lh - p.blend_h;
  p.keep_w = lw - p.blend_w;
  for (int y = 0; y < H; y += p.keep_h * s) p.ys.push_back(y);
  for (int x = 0; x < W; x += p.keep_w * s) p.xs.push_back(x);
  return p;
}

// Latent size of `n` pixels after `levels` stride-2 downsamplers (pad 1 at the end, 3x3
// kernel): floor(n / 2) each, failing below 2. -1 when the encoder cannot run it.
int latent_extent(int n, int levels) {
  for (int i = 0; i < levels; i++) {
    if (n < 2) return -1;
    n /= 2;
  }
  return n;
}

// The latent height (or width) a tile plan assembles: each tile row keeps at most keep rows.
int assembled_extent(const std::vector<int> &origins, int tile, int keep, int total, int levels) {
  int sum = 0;
  for (int o : origins) {
    int l = latent_extent(std::min(o + tile, total) - o, levels);
    if (l < 0) return -1;
    sum += std::min(keep, l);
  }
  return sum;
}

std::vector<std::pair<int, int>> chunk_schedule(int T, int k) {
  std::vector<std::pair<int, int>> out;
  int nb = std::max(T / k, 1), r = T % k;
  for (int i = 0; i < nb; i++) out.emplace_back(i == 0 ? 0 : k * i + r, std::min(k * (i + 1) + r, T));
  return out;
}

// b's first rows/columns fade from a's last ones (in place, as diffusers does it).
void blend_v(const at::Tensor &a, at::Tensor &b, int extent) {
  extent = std::min<int>({static_cast<int>(a.size(3)), static_cast<int>(b.size(3)), extent});
  for (int y = 0; y < extent; y++)
    b.select(3, y).copy_(a.select(3, a.size(3) - extent + y) * (1 - static_cast<double>(y) / extent) +
                         b.select(3, y) * (static_cast<double>(y) / extent));
}
void blend_h(const at::Tensor &a, at::Tensor &b, int extent) {
  extent = std::min<int>({static_cast<int>(a.size(4)), static_cast<int>(b.size(4)), extent});
  for (int x = 0; x < extent; x++)
    b.select(4, x).copy_(a.select(4, a.size(4) - extent + x) * (1 - static_cast<double>(x) / extent) +
                         b.select(4, x) * (static_cast<double>(x) / extent));
}

// ---------------------------------------------------------------- Wan

// Wan's chunks as diffusers makes them: frame 0 alone, then 4 frames at a time (frames after
// the last whole group are not encoded, as in diffusers).
std::vector<std::pair<int, int>> wan_chunk_schedule(int T) {
  std::vector<std::pair<int, int>> out{{0, 1}};
  for (int s = 1; s + 4 <= T; s += 4) out.emplace_back(s, s + 4);
  return out;
}

// Wan's tiles in diffusers' numbers: tile sizes and strides in pixels of the encoder's input
// (tile_sample_min_* and tile_sample_stride_*), which for Wan 2.2 is the 2x2-patch frame.
struct WanTiles {
  int tile_h = 0, tile_w = 0, stride_h = 0, stride_w = 0;
};

// Out of memory with no smaller tiles left: the element stops rather than drop every clip.
struct OutOfMemoryFatal : std::runtime_error {
  using std::runtime_error::runtime_error;
};

bool is_oom(const c10::Error &e) { return is_out_of_memory(e); }

// "" when norm-scope=clip can run on this model, else why not (naming the property).
std::string clip_scope_unsupported(const std::string &model, bool dir) {
  if (!dir)
    return "norm-scope=clip sets the statistics of a CogVideoX VAE's GroupNorms, but model '" + model +
           "' is a TorchScript file whose normalisation the encoder cannot reach: use norm-scope=chunk";
  std::string text, why;
  if (read_small_file(model + "/config.json", kMaxConfigBytes, &text, &why) &&
      config_class_name(text) == "AutoencoderKLWan")
    return "norm-scope=clip applies to CogVideoX VAEs (GroupNorm); model '" + model +
           "' is a Wan VAE (AutoencoderKLWan), whose RMS norms use no statistics across frames, so its chunked "
           "encode already equals a single pass: use norm-scope=chunk";
  return "";
}

// The positions of tile t that count towards norm-scope=clip statistics at downscale d (rows
// [0, 1), columns [2, 3) of its h x w activations): from the middle of its overlap with the
// previous tile to the middle of its overlap with the next, so that the tiles' shares
// partition the frame as a single untiled pass sees it.
std::array<int64_t, 4> owned_share(const TilePlan &p, int H, int W, size_t t, int64_t d, int64_t h, int64_t w) {
  auto share = [d](const std::vector<int> &o, size_t k, int tile, int total, int64_t extent) {
    auto bound = [&](size_t m) -> int64_t {
      if (m == 0) return 0;
      if (m >= o.size()) return total;
      return (o[m] + std::min(o[m - 1] + tile, total)) / 2;
    };
    const int64_t origin = o[k] / d;
    const int64_t a = std::clamp<int64_t>(bound(k) / d - origin, 0, extent);
    return std::pair<int64_t, int64_t>{a, std::clamp<int64_t>(bound(k + 1) / d - origin, a, extent)};
  };
  auto rows = share(p.ys, t / p.xs.size(), p.th, H, h), cols = share(p.xs, t % p.xs.size(), p.tw, W, w);
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
  TilePlan plan;
  WanTiles wan_tiles;  // diffusers' tile numbers behind `plan` (Wan VAE)
  std::vector<ConvCache> caches;                 // one per tile
  std::vector<WanCache> wan_caches;              // one per tile (Wan VAE)
  std::vector<std::vector<at::Tensor>> outs;     // per tile, per chunk

  void reset_tiles() {
    size_t n = plan.ys.size() * plan.xs.size();
    caches.assign(n, ConvCache{});
    wan_caches.assign(n, WanCache{});
    outs.assign(n, {});
    next_chunk = 0;
  }
};

struct VaeEngine::Impl {
  EngineOptions opts;
  c10::Device device{c10::kCPU};
  c10::ScalarType dtype = at::kFloat;
  std::unique_ptr<Backend> backend;
  std::unique_ptr<WanEncoder> wan;  // set for a Wan folder (backend then unset)
  at::Tensor last_raw;              // moments of the last finished clip (latent cache)
  std::string cache_key;            // the encoder's part of latent cache keys, once computed
  bool native = false;
  int tcomp = 1, scomp = 1;
  int moment_channels = -1;  // mean and log-variance channels (native VAEs)
  double scaling = 1.0;
  bool retain = false;
  std::function<void(const std::string &)> warn;
  int64_t chunks_encoded = 0, oom_retries = 0, peak_frames = 0;
  bool fatal = false;  // the last failure was out of memory at the smallest tiles
  bool settings_failure = false;  // the last failure would recur on every clip
  int64_t clips_done = 0;

  // A failure to encode: before any clip succeeded it comes from the model or the settings
  // (a TorchScript model that throws on the first clip throws on all), not from the clip.
  std::string encode_failure(const std::string &what, const std::exception &e) {
    std::string why = what + " failed: " + error_message(e.what());
    if (clips_done > 0) return why;
    settings_failure = true;
    why = "the encoder failed on the first clip, so it would fail on every clip: " + why;
    if (!native && !opts.per_frame)
      why += " (the TorchScript encode method gets the clip as [1, 3, T, H, W]; an image encoder taking "
             "[N, 3, H, W] needs per-frame=true)";
    return why;
  }
  Clip clip;

  std::string clip_name(const Clip &c) const {
    return "clip sample-id " + std::to_string(c.sample_id) + " (" + std::to_string(c.T) + " frames of " +
           std::to_string(c.W) + "x" + std::to_string(c.H) + ")";
  }

  at::Tensor chunk_input(Clip &c, int s, int e) {
    at::Tensor x;
    if (c.video.defined()) {
      x = c.video.narrow(2, s, e - s);
    } else {
      std::vector<at::Tensor> fr(c.frames.begin() + s, c.frames.begin() + e);
      x = dequantize_frames(at::stack(fr).to(device));
    }
    return x.to(device, dtype);
  }

  at::Tensor run_tile(Clip &c, const at::Tensor &x, size_t t) {
    const TilePlan &p = c.plan;
    size_t i = t / p.xs.size(), j = t % p.xs.size();
    at::Tensor region = x;
    if (p.tiled) {
      int y = p.ys[i], x0 = p.xs[j];
      region = x.slice(3, y, std::min(y + p.th, c.H)).slice(4, x0, std::min(x0 + p.tw, c.W));
    }
    fake_oom_check(region);
    return wan ? wan->forward(region, c.wan_caches[t]) : backend->encode_chunk(region, c.caches[t]);
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
    const TilePlan &p = c.plan;
    int y0 = 0, y1 = c.H, x0 = 0, x1 = c.W;
    if (p.tiled) {
      y0 = p.ys[t / p.xs.size()], x0 = p.xs[t % p.xs.size()];
      y1 = std::min(y0 + p.th, c.H), x1 = std::min(x0 + p.tw, c.W);
    }
    at::Tensor x;
    if (c.video.defined()) {
      x = c.video.narrow(2, s, e - s).slice(3, y0, y1).slice(4, x0, x1);
    } else {
      std::vector<at::Tensor> fr;
      for (int f = s; f < e; f++) fr.push_back(c.frames[f].slice(0, y0, y1).slice(1, x0, x1));
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
    auto *nb = dynamic_cast<NativeBackend *>(backend.get());
    if (!nb) throw std::runtime_error("norm-scope=clip needs a CogVideoX VAE folder");
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
        std::vector<at::Tensor> tiles = nb->enc->forward_clip_scope(in, spill_to());
        for (size_t t = 0; t < tiles.size(); t++) c.outs[t] = {tiles[t]};
      } catch (const c10::Error &err) {
        if (!is_oom(err)) throw;
        handle_oom(c, err);
        continue;
      }
      chunks_encoded += static_cast<int64_t>(c.chunks.size());
      c.next_chunk = c.chunks.size();
      return;
    }
  }

  // A smaller tile plan after an out-of-memory failure; false when tiles cannot shrink further.
  bool shrink_tiles(const Clip &c, TilePlan *next) const {
    int cur_h = c.plan.tiled ? c.plan.th : c.H, cur_w = c.plan.tiled ? c.plan.tw : c.W;
    int s = std::max(scomp, 1), min_tile = 4 * s;
    auto half = [&](int v) { return std::max(min_tile, v / 2 / s * s); };
    int nh = std::min(half(cur_h), cur_h), nw = std::min(half(cur_w), cur_w);
    if (nh >= cur_h && nw >= cur_w) return false;
    *next = plan_tiles_exact(c.H, c.W, nh, nw, s);
    return next->tiled;
  }

  void handle_oom(Clip &c, const c10::Error &e) {
#ifdef VIDEOTRAIN_HAVE_CUDA
    if (device.is_cuda()) c10::cuda::CUDACachingAllocator::emptyCache();
#endif
    bool frames_there = c.video.defined();
    if (!frames_there) {
      frames_there = true;
      for (int f = 0; f < c.received; f++) frames_there = frames_there && c.frames[f].defined();
    }
    std::string what = e.msg().substr(0, e.msg().find('\n'));
    TilePlan next;
    if (!native)
      throw OutOfMemoryFatal("out of memory encoding " + clip_name(c) +
                               " (tiles apply to CogVideoX VAE folders only): " + what);
    if (!frames_there)
      throw OutOfMemoryFatal("out of memory encoding " + clip_name(c) + " with " + c.plan.describe() +
                               " after its first frames were released (retain-frames is off): " + what);
    WanTiles next_wan;
    if (wan ? !shrink_wan_tiles(c, &next, &next_wan) : !shrink_tiles(c, &next))
      throw OutOfMemoryFatal("out of memory encoding " + clip_name(c) + " even with the smallest tiles (" +
                               c.plan.describe() + "): " + what);
    oom_retries++;
    if (warn)
      warn("out of memory encoding " + clip_name(c) + " with " + c.plan.describe() + "; retrying with " +
           next.describe());
    c.plan = next;
    c.wan_tiles = next_wan;
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
    if (t < c.caches.size())
      for (at::Tensor &e : c.caches[t].entries) off_heap(e);
    if (t < c.wan_caches.size())
      for (at::Tensor &e : c.wan_caches[t].entries) off_heap(e);
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
        if (!is_oom(err)) throw;
        handle_oom(c, err);
        continue;
      }
      chunks_encoded++;
      if (!retain && !c.video.defined())
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
    const TilePlan &p = c.plan;
    if (!p.tiled) return tiles[0];
    if (wan) return blend_wan_tiles(c, std::move(tiles));
    size_t nr = p.ys.size(), nc = p.xs.size();
    std::vector<at::Tensor> rows;
    for (size_t i = 0; i < nr; i++) {
      std::vector<at::Tensor> row;
      for (size_t j = 0; j < nc; j++) {
        at::Tensor &t = tiles[i * nc + j];
        if (i > 0) blend_v(tiles[(i - 1) * nc + j], t, p.blend_h);
        if (j > 0) blend_h(tiles[i * nc + j - 1], t, p.blend_w);
        row.push_back(t.slice(3, 0, p.keep_h).slice(4, 0, p.keep_w));
      }
      rows.push_back(at::cat(row, 4));
    }
    return at::cat(rows, 3);
  }

  void start(Clip &c, uint64_t sample_id, int T, int H, int W, int chunk_frames) {
    c = Clip();
    c.active = true;
    c.sample_id = sample_id;
    c.T = T, c.H = H, c.W = W;
    c.chunks = wan ? wan_chunk_schedule(T) : chunk_schedule(T, chunk_frames);
    c.plan = wan ? plan_tiles_wan(H, W, &c.wan_tiles)
                 : plan_tiles(H, W, opts.tile_height, opts.tile_width, opts.tile_overlap_height,
                              opts.tile_overlap_width, scomp);
    c.reset_tiles();
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

  // Wan: diffusers' tiles (see WanTiles). A dimension left at 0 spans the frame; the frame is
  // tiled when it is larger than the tile number, compared as diffusers compares them.
  TilePlan plan_tiles_wan(int H, int W, WanTiles *wt) const {
    *wt = WanTiles{};
    TilePlan p;
    if (opts.tile_height <= 0 && opts.tile_width <= 0) return p;
    const int patch = wan->config().patch_size;
    const bool th = opts.tile_height > 0, tw = opts.tile_width > 0;
    wt->tile_h = th ? opts.tile_height : H / patch;
    wt->tile_w = tw ? opts.tile_width : W / patch;
    // (+1e-6: an overlap of 1/3 on 48 pixels is a stride of 32, not 31.99...)
    auto stride = [](int tile, double overlap) { return std::max(1, static_cast<int>(tile * (1 - overlap) + 1e-6)); };
    wt->stride_h = th ? stride(wt->tile_h, opts.tile_overlap_height) : wt->tile_h;
    wt->stride_w = tw ? stride(wt->tile_w, opts.tile_overlap_width) : wt->tile_w;
    if (!((th && H > wt->tile_h) || (tw && W > wt->tile_w))) return p;
    p = wan_plan(H, W, *wt);
    p.tiled = true;  // one tile still crops and blends as diffusers does
    return p;
  }

  // Wan's tile plan for given diffusers numbers (tiled whenever a tile is smaller than the frame).
  TilePlan wan_plan(int H, int W, const WanTiles &wt) const {
    WanEncoder::TileGrid g = wan->tile_grid(H, W, wt.tile_h, wt.tile_w, wt.stride_h, wt.stride_w);
    TilePlan p;
    p.tiled = g.ys.size() * g.xs.size() > 1;
    p.th = static_cast<int>(g.tile_h), p.tw = static_cast<int>(g.tile_w);
    p.ys.assign(g.ys.begin(), g.ys.end());
    p.xs.assign(g.xs.begin(), g.xs.end());
    return p;
  }

  // Wan after running out of memory: tiles of half the size, in whole latent pixels and at
  // least 4 of them, overlapping by a quarter, so that their strides keep the untiled shape.
  bool shrink_wan_tiles(const Clip &c, TilePlan *next, WanTiles *wt) const {
    const int patch = wan->config().patch_size, per = scomp / patch, Hp = c.H / patch, Wp = c.W / patch;
    const int cur_h = c.plan.tiled ? c.wan_tiles.tile_h : Hp, cur_w = c.plan.tiled ? c.wan_tiles.tile_w : Wp;
    auto half = [&](int v) { return std::min(v, std::max(4 * per, v / 2 / per * per)); };
    const int nh = std::min(half(cur_h), Hp), nw = std::min(half(cur_w), Wp);
    if (nh >= cur_h && nw >= cur_w) return false;
    *wt = WanTiles{nh, nw, nh < Hp ? nh - nh / 4 / per * per : nh, nw < Wp ? nw - nw / 4 / per * per : nw};
    *next = wan_plan(c.H, c.W, *wt);
    return next->tiled;
  }

  at::Tensor blend_wan_tiles(const Clip &c, std::vector<at::Tensor> tiles) const {
    const WanTiles &wt = c.wan_tiles;
    std::vector<std::vector<at::Tensor>> rows(c.plan.ys.size());
    for (size_t t = 0; t < tiles.size(); t++) rows[t / c.plan.xs.size()].push_back(std::move(tiles[t]));
    return wan->blend_tiles(std::move(rows), c.H, c.W, wt.tile_h, wt.tile_w, wt.stride_h, wt.stride_w);
  }

  // Wan: the raw moments, or (z - latents_mean) / latents_std with z the mode or a sample.
  at::Tensor latent_wan(const at::Tensor &raw, uint64_t sample_id, const at::Tensor &noise_in) const {
    at::Tensor out;
    switch (opts.latent) {
      case LatentKind::Moments: out = raw; break;
      case LatentKind::Mode: out = wan->normalized_latent(raw); break;
      case LatentKind::Sample: {
        const int64_t z = wan->config().z_dim;
        at::Tensor noise = noise_in.defined() ? noise_in : posterior_noise(raw.narrow(1, 0, z).sizes(), sample_id);
        out = wan->normalized_latent(raw, noise);
        break;
      }
    }
    return out.select(0, 0);
  }

  at::Tensor latent(const at::Tensor &raw_in, uint64_t sample_id, const at::Tensor &noise_in) {
    at::Tensor raw = raw_in.to(at::kFloat);
    if (!native) return raw.select(0, 0);
    if (wan) return latent_wan(raw, sample_id, noise_in);
    int64_t C = raw.size(1) / 2;
    at::Tensor mean = raw.narrow(1, 0, C);
    at::Tensor logvar = raw.narrow(1, C, C).clamp(-30.0, 20.0);
    at::Tensor out;
    switch (opts.latent) {
      case LatentKind::Moments: out = at::cat({mean, logvar}, 1); break;
      case LatentKind::Mode: out = mean * scaling; break;
      case LatentKind::Sample: {
        at::Tensor noise = noise_in;
        if (!noise.defined()) noise = posterior_noise(mean.sizes(), sample_id);
        out = (mean + at::exp(0.5 * logvar) * noise.to(mean.device(), at::kFloat)) * scaling;
        break;
      }
    }
    return out.select(0, 0);
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

// ---------------------------------------------------------------- families

namespace {

enum class Family { CogVideoX, Wan, Other };

// A diffusers folder's VAE family, from config.json's _class_name; a config without one is
// read as CogVideoX (as before the Wan family came), and an unreadable one is left to the
// CogVideoX loader, which names the file.
Family folder_family(const std::string &dir, std::string *class_name) {
  std::string text, why;
  if (!read_small_file(dir + "/config.json", kMaxConfigBytes, &text, &why)) return Family::CogVideoX;
  *class_name = config_class_name(text);
  if (class_name->empty() || *class_name == "AutoencoderKLCogVideoX") return Family::CogVideoX;
  if (*class_name == "AutoencoderKLWan") return Family::Wan;
  return Family::Other;
}

}  // namespace

// Loads a Wan 2.1/2.2 folder into the engine: "" or why not (the file, key or tensor).
static std::string load_wan(VaeEngine::Impl &im) {
  try {
    im.wan = WanEncoder::load(im.opts.model, im.device, im.dtype);
  } catch (const std::exception &e) {
    return e.what();
  }
  const WanConfig &cfg = im.wan->config();
  im.native = true;
  im.tcomp = cfg.temporal_compression();
  im.scomp = cfg.spatial_compression();
  im.moment_channels = 2 * cfg.z_dim;
  const int per_pixel = im.scomp / cfg.patch_size;  // compression of the encoder's input pixels
  for (auto [t, name] : {std::pair{im.opts.tile_height, "tile-height"}, std::pair{im.opts.tile_width, "tile-width"}})
    if (t > 0 && t < per_pixel)
      return std::string(name) + "=" + std::to_string(t) + " is smaller than " + std::to_string(per_pixel) +
             ", what the Wan VAE compresses into one latent pixel (Wan tiles count pixels of the encoder's input, "
             "as diffusers' tile_sample_min_height/width do)";
  return "";
}

// check_clip() for the Wan family.
static std::string check_clip_wan(const VaeEngine::Impl &im, int T, int W, int H) {
  if (!im.opts.allow_any_length && (T - 1) % 4 != 0) {
    const int below = T - (T - 1) % 4;
    return "num-frames=" + std::to_string(T) + " gives clips of " + std::to_string(T) +
           " frames; the Wan VAE (frame 0, then groups of 4 frames) needs 1 + 4n frames: use " +
           std::to_string(below) + " or " + std::to_string(below + 4);
  }
  if (W % im.scomp != 0 || H % im.scomp != 0)
    return "frames are " + std::to_string(W) + "x" + std::to_string(H) + "; the Wan VAE needs width and height " +
           "divisible by its spatial compression " + std::to_string(im.scomp) + " (set the source's width and height)";
  WanTiles wt;
  TilePlan p = im.plan_tiles_wan(H, W, &wt);
  if (!p.tiled) return "";
  // Every tile must reach a latent pixel, and what the tiles keep (stride / compression each)
  // must cover the latent, else the result would not have the untiled shape.
  const int patch = im.wan->config().patch_size, per_pixel = im.scomp / patch;
  int levels = 0;
  while ((1 << levels) < per_pixel) levels++;
  auto covers = [&](const std::vector<int> &origins, int tile, int total, int stride) {
    int sum = 0;
    for (int o : origins) {
      int l = latent_extent((std::min(o + tile, total) - o) / patch, levels);
      if (l < 1) return false;
      sum += std::min(stride / per_pixel, l);
    }
    return sum >= total / im.scomp;
  };
  if (covers(p.ys, p.th, H, wt.stride_h) && covers(p.xs, p.tw, W, wt.stride_w)) return "";
  return "tile-height=" + std::to_string(im.opts.tile_height) + ", tile-width=" + std::to_string(im.opts.tile_width) +
         " with overlaps " + std::to_string(im.opts.tile_overlap_height) + ", " +
         std::to_string(im.opts.tile_overlap_width) + " do not tile " + std::to_string(W) + "x" + std::to_string(H) +
         " frames into a " + std::to_string(W / im.scomp) + "x" + std::to_string(H / im.scomp) +
         " latent with the Wan VAE (tiles and their strides tile * (1 - overlap) count pixels of the encoder's "
         "input; use multiples of " + std::to_string(per_pixel) + ")";
}

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
  if (opts.model.empty()) return fail("property 'model' is not set (a CogVideoX or Wan VAE folder or a TorchScript file)");
  if (opts.chunk_frames < 1) return fail("chunk-frames must be at least 1");
  if (opts.micro_batch_size < 1) return fail("micro-batch-size must be at least 1");
  if (opts.tile_height < 0 || opts.tile_width < 0) return fail("tile-height and tile-width must not be negative");
  if (!(opts.tile_overlap_height >= 0 && opts.tile_overlap_height < 1) ||
      !(opts.tile_overlap_width >= 0 && opts.tile_overlap_width < 1))
    return fail("tile-overlap-height and tile-overlap-width must be in [0, 1)");

  // Device and dtype.
  {
    std::string device_error;
    const std::string dev = resolve_device(opts.device, dist_env_from_environment().local_rank,
                                           visible_cuda_devices(), &device_error);
    if (dev.empty()) return fail(device_error);
    im.device = c10::Device(dev);
  }
  // Best effort (not glibc: no tuning). Large blocks too: full-resolution activations.
  if (im.device.is_cpu() && opts.tune_malloc) retain_large_cpu_blocks();
  if (opts.dtype.empty()) {
    im.dtype = im.device.is_cuda() ? at::kBFloat16 : at::kFloat;
  } else {
    auto d = dtype_from_name(opts.dtype);
    if (!d) return fail("dtype '" + opts.dtype + "' is not float32, bfloat16 or float16");
    im.dtype = *d;
  }
  im.retain = opts.retain_frames > 0 ||
              (opts.retain_frames < 0 && (im.device.is_cuda() || im.opts.fake_oom_pixels > 0));

  struct stat st;
  if (stat(opts.model.c_str(), &st) != 0) return fail("model '" + opts.model + "' does not exist");
  if (opts.norm_scope == NormScope::Clip) {
    std::string bad = clip_scope_unsupported(opts.model, S_ISDIR(st.st_mode));
    if (!bad.empty()) return fail(bad);
  }
  c10::InferenceMode guard;
  if (S_ISDIR(st.st_mode)) {
    if (opts.per_frame) return fail("per-frame=true needs a TorchScript image encoder, but model '" + opts.model +
                                    "' is a VAE folder");
    std::string cls;
    switch (folder_family(opts.model, &cls)) {
      case Family::Other:
        return fail("model '" + opts.model + "': config.json names the class '" + cls +
                    "'; vaeencoder reads AutoencoderKLCogVideoX and AutoencoderKLWan folders");
      case Family::Wan: {
        std::string why = load_wan(im);
        if (!why.empty()) return fail(why);
        return eng;
      }
      case Family::CogVideoX: break;
    }
    auto nb = std::make_unique<NativeBackend>();
    try {
      nb->enc = CogVideoXEncoder::load(opts.model, im.device, im.dtype);
    } catch (const std::exception &e) {
      return fail(e.what());
    }
    const VaeConfig &cfg = nb->enc->config();
    im.native = true;
    im.tcomp = cfg.temporal_compression_ratio;
    im.scomp = cfg.spatial_compression();
    im.moment_channels = 2 * cfg.latent_channels;
    im.scaling = cfg.scaling_factor;
    im.backend = std::move(nb);
    if (opts.chunk_frames % im.tcomp != 0)
      return fail("chunk-frames=" + std::to_string(opts.chunk_frames) + " is not a multiple of the VAE's temporal " +
                  "compression " + std::to_string(im.tcomp) + " (" + opts.model + "/config.json)");
    for (auto [t, name] : {std::pair{opts.tile_height, "tile-height"}, std::pair{opts.tile_width, "tile-width"}})
      if (t > 0 && t < im.scomp)
        return fail(std::string(name) + "=" + std::to_string(t) + " is smaller than the VAE's spatial compression " +
                    std::to_string(im.scomp));
  } else {
    if (opts.tile_height > 0 || opts.tile_width > 0)
      return fail("tile-height/tile-width apply to a CogVideoX VAE folder; model '" + opts.model +
                  "' is a TorchScript file");
    auto sb = std::make_unique<ScriptBackend>();
    try {
      sb->module = jit_load(opts.model, im.device);
      sb->module.eval();
      sb->module.to(im.dtype);
    } catch (const std::exception &e) {
      std::string w = e.what();
      return fail("model '" + opts.model + "' is neither a VAE folder nor a loadable TorchScript file: " +
                  w.substr(0, w.find('\n')));
    }
    if (!sb->module.find_method("encode"))
      return fail("TorchScript model '" + opts.model + "' has no 'encode' method");
    sb->per_frame = opts.per_frame;
    sb->micro_batch = opts.micro_batch_size;
    im.backend = std::move(sb);
  }
  return eng;
}

const EngineOptions &VaeEngine::options() const { return impl_->opts; }
std::string VaeEngine::dtype_name() const { return videotrain::dtype_name(impl_->dtype); }
std::string VaeEngine::device_name() const { return videotrain::device_name(impl_->device); }
bool VaeEngine::native() const { return impl_->native; }
int VaeEngine::temporal_compression() const { return impl_->tcomp; }
int VaeEngine::spatial_compression() const { return impl_->scomp; }
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
  const Impl &im = *impl_;
  if (T < 1) return "clip has no frames";
  if (T > GST_VIDEOTRAIN_MAX_CLIP_FRAMES)
    return "clips of " + std::to_string(T) + " frames are longer than the " +
           std::to_string(GST_VIDEOTRAIN_MAX_CLIP_FRAMES) + " the encoder takes";
  if (W < 1 || H < 1) return "frames are empty";
  if (im.wan) return check_clip_wan(im, T, W, H);
  if (im.native) {
    if (!im.opts.allow_any_length && (T - 1) % im.tcomp != 0) {
      const int tc = im.tcomp, below = T - (T - 1) % tc;
      return "num-frames=" + std::to_string(T) + " gives clips of " + std::to_string(T) +
             " frames; the CogVideoX VAE (temporal compression " + std::to_string(tc) + ") needs 1 + " +
             std::to_string(tc) + "n frames: use " + std::to_string(below) + " or " + std::to_string(below + tc);
    }
    if (W % im.scomp != 0 || H % im.scomp != 0)
      return "frames are " + std::to_string(W) + "x" + std::to_string(H) + "; the VAE needs width and height " +
             "divisible by its spatial compression " + std::to_string(im.scomp) + " (set the source's width and height)";
    // Tiles that do not stride by what they keep would give another shape than the untiled encode.
    TilePlan p = plan_tiles(H, W, im.opts.tile_height, im.opts.tile_width, im.opts.tile_overlap_height,
                            im.opts.tile_overlap_width, im.scomp);
    if (p.tiled) {
      int levels = 0;
      while ((1 << levels) < im.scomp) levels++;
      int gh = assembled_extent(p.ys, p.th, p.keep_h, H, levels), gw = assembled_extent(p.xs, p.tw, p.keep_w, W, levels);
      if (gh != H / im.scomp || gw != W / im.scomp)
        return "tile-height=" + std::to_string(im.opts.tile_height) + ", tile-width=" +
               std::to_string(im.opts.tile_width) + " with overlaps " + std::to_string(im.opts.tile_overlap_height) +
               ", " + std::to_string(im.opts.tile_overlap_width) + " do not tile " + std::to_string(W) + "x" +
               std::to_string(H) + " frames into a " + std::to_string(W / im.scomp) + "x" +
               std::to_string(H / im.scomp) + " latent (use tile sizes and overlaps in multiples of " +
               std::to_string(im.scomp) + " pixels)";
    }
  }
  return "";
}

bool VaeEngine::begin_clip(uint64_t sample_id, int T, int W, int H, std::string *why, uint32_t epoch) {
  Impl &im = *impl_;
  abort_clip();
  im.last_raw = at::Tensor();
  std::string bad = check_clip(T, W, H);
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
    at::Tensor raw;
    {
      c10::InferenceMode guard;
      if (im.clip_scope()) im.encode_clip_scope(c);
      raw = im.assemble(c);
    }
    // Outside inference mode so that downstream autograd may use the latent as an input.
    at::NoGradGuard ng;
    at::Tensor lat = im.latent(raw, Impl::noise_id(c.sample_id, c.epoch), at::Tensor()).to(im.dtype).contiguous();
    buf = buffer_from_tensor(lat);
    im.last_raw = raw;
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
  if (!im.cache_key.empty()) return im.cache_key;
  // The model's content: every file of a VAE folder that describes or holds weights, by digest.
  std::string content;
  std::vector<std::string> files;
  struct stat st {};
  if (::stat(im.opts.model.c_str(), &st) == 0 && S_ISDIR(st.st_mode)) {
    for (const auto &e : std::filesystem::directory_iterator(im.opts.model)) {
      const std::string name = e.path().filename().string();
      if (name == "config.json" || (name.size() > 12 && name.compare(name.size() - 12, 12, ".safetensors") == 0))
        files.push_back(e.path().string());
    }
    std::sort(files.begin(), files.end());
  } else {
    files.push_back(im.opts.model);
  }
  for (const auto &f : files) {
    std::string digest;
    if (!sha256_file(f, &digest, why)) return "";
    content += std::filesystem::path(f).filename().string() + " " + digest + "\n";
  }
  const EngineOptions &o = im.opts;
  std::ostringstream k;
  // Bump the version when the encoder's arithmetic changes what it computes.
  k << "vaeencoder encode-1\nfamily " << (im.wan ? "wan" : im.native ? "cogvideox" : "torchscript") << "\n"
    << content << "dtype " << videotrain::dtype_name(im.dtype) << " device " << (im.device.is_cuda() ? "cuda" : "cpu")
    << "\nchunk-frames " << (im.native && !im.wan ? o.chunk_frames : 0) << " per-frame " << o.per_frame
    << "\ntiles " << o.tile_height << "x" << o.tile_width << " overlap " << o.tile_overlap_height << " "
    << o.tile_overlap_width << "\nnorm-scope " << (o.norm_scope == NormScope::Clip ? "clip" : "chunk") << "\n";
  im.cache_key = k.str();
  return im.cache_key;
}

TensorSpec VaeEngine::moments_spec(int T, int W, int H) const {
  const Impl &im = *impl_;
  TensorSpec s{"moments", "float32", {1, -1, -1, -1, -1}};
  if (!im.native) return s;
  s.shape[1] = im.moment_channels;
  if (T >= 1 && (T - 1) % im.tcomp == 0) s.shape[2] = (T - 1) / im.tcomp + 1;
  if (H > 0 && H % im.scomp == 0) s.shape[3] = H / im.scomp;
  if (W > 0 && W % im.scomp == 0) s.shape[4] = W / im.scomp;
  return s;
}

bool VaeEngine::last_moments(CacheEntry *out) const {
  const Impl &im = *impl_;
  if (!im.last_raw.defined()) return false;
  out->tensors = {cached_tensor_of("moments", im.last_raw.to(at::kCPU, at::kFloat))};
  return true;
}

GstBuffer *VaeEngine::latent_from_moments(const CacheEntry &entry, uint64_t sample_id, uint32_t epoch,
                                          std::string *why) {
  Impl &im = *impl_;
  const CachedTensor *m = entry.find("moments");
  if (!m) {
    *why = "the entry holds no moments";
    return nullptr;
  }
  std::optional<at::Tensor> raw = tensor_of_cached(*m, why);
  if (!raw) return nullptr;
  if (raw->dim() != 5 || raw->size(0) != 1 || raw->scalar_type() != at::kFloat) {
    *why = "the entry's moments are not a float32 [1, C, t, h, w] tensor";
    return nullptr;
  }
  try {
    at::NoGradGuard ng;
    // On the device the encoder would have left them on, so that the latent is bit for bit the same.
    at::Tensor lat =
        im.latent(raw->to(im.device), Impl::noise_id(sample_id, epoch), at::Tensor()).to(im.dtype).contiguous();
    return buffer_from_tensor(lat);
  } catch (const std::exception &e) {
    *why = first_line(e.what());
    return nullptr;
  }
}

}  // namespace videotrain::vae
