#include "decode_engine.h"

#include <ATen/ATen.h>
#include <c10/core/InferenceMode.h>

#include <cstdlib>
#include <cstring>
#include <stdexcept>

#include "cpu_heap.h"
#include "device_dtype.h"
#include "out_of_memory.h"
#include "models/vae/vae_decoder.h"
#include "tensor_buffer.h"

namespace videotrain::vae {

struct DecodeEngine::Impl {
  DecodeOptions opts;
  std::unique_ptr<VaeDecoder> dec;
  DecodeTiles tiles;
  c10::Device device = c10::Device(c10::kCPU);
  c10::ScalarType dtype = at::kFloat;
};

namespace {

// A tile stride left at 0: 3/4 of the tile (diffusers' default 192 of 256), on the latent grid.
int default_stride(int tile, int s) { return std::max(s, tile * 3 / 4 / s * s); }

// Thrown from the frame callback to stop a clip whose frames are no longer wanted.
struct Stopped {};

// The tiles of the next try after running out of memory at `prev` (untiled: the frame): 256 pixels
// (diffusers' tile), then half the last, on the latent grid; off when none smaller is left.
DecodeTiles smaller_tiles(const DecodeTiles &prev, int height, int width, int s) {
  const int last = prev.on() ? std::max(prev.tile_h, prev.tile_w) : std::max(height, width);
  int side = prev.on() ? last / 2 : std::min(256, last / 2);
  side = side / s * s;
  DecodeTiles t;
  if (side < 2 * s || side >= last) return t;
  t.tile_h = t.tile_w = side;
  t.stride_h = t.stride_w = default_stride(side, s);
  return t;
}

std::string tiles_text(const DecodeTiles &t) {
  return t.on() ? std::to_string(t.tile_w) + "x" + std::to_string(t.tile_h) + " tiles" : std::string("whole frames");
}

}  // namespace

DecodeEngine::DecodeEngine() : impl_(std::make_unique<Impl>()) {}
DecodeEngine::~DecodeEngine() = default;

std::unique_ptr<DecodeEngine> DecodeEngine::create(const DecodeOptions &opts, std::string *error) {
  auto fail = [&](const std::string &why) -> std::unique_ptr<DecodeEngine> {
    if (error) *error = why;
    return nullptr;
  };
  if (opts.model.empty())
    return fail("no model: set model to a diffusers VAE folder (" + VaeDecoder::family_names(", ") + ")");
  std::unique_ptr<DecodeEngine> eng(new DecodeEngine());
  Impl &im = *eng->impl_;
  im.opts = opts;
  // Test hook for element tests, which cannot reach the options (see DecodeOptions).
  if (im.opts.fake_oom_pixels == 0)
    if (const char *fake = std::getenv("VIDEOTRAIN_VAEDECODER_FAKE_OOM_PIXELS"))
      im.opts.fake_oom_pixels = std::strtoll(fake, nullptr, 10);
  DeviceDtype target;
  std::string target_error;
  if (!resolve_device_dtype(opts.device, opts.dtype, &target, &target_error)) return fail(target_error);
  im.device = target.device;
  im.dtype = target.dtype;
  // Freed chunk activations stay in the heap for the next chunk: without it glibc's heap grows with
  // the clip (+24% peak from 17 to 97 frames in vae-decode-bench; +3% with it).
  if (im.device.is_cpu() && opts.tune_malloc) retain_large_cpu_blocks();
  try {
    c10::InferenceMode guard;
    im.dec = VaeDecoder::load(opts.model, im.device, im.dtype);
  } catch (const std::exception &e) {
    return fail("model '" + opts.model + "': " + e.what());
  }
  const int s = im.dec->spatial_compression();
  if ((opts.tile_height > 0) != (opts.tile_width > 0))
    return fail("set both tile-height and tile-width (or neither)");
  if (opts.tile_height > 0) {
    im.tiles.tile_h = opts.tile_height;
    im.tiles.tile_w = opts.tile_width;
    im.tiles.stride_h = opts.tile_stride_height > 0 ? opts.tile_stride_height : default_stride(opts.tile_height, s);
    im.tiles.stride_w = opts.tile_stride_width > 0 ? opts.tile_stride_width : default_stride(opts.tile_width, s);
    const std::string bad = im.tiles.check(s);
    if (!bad.empty())
      return fail(bad + " (" + VaeDecoder::family_name(im.dec->family()) + " VAE in '" + opts.model + "')");
  }
  return eng;
}

std::string DecodeEngine::family_name() const { return VaeDecoder::family_name(impl_->dec->family()); }
int DecodeEngine::latent_channels() const { return impl_->dec->latent_channels(); }
int DecodeEngine::spatial_compression() const { return impl_->dec->spatial_compression(); }
std::string DecodeEngine::device_name() const { return videotrain::device_name(impl_->device); }
std::string DecodeEngine::dtype_name() const { return videotrain::dtype_name(impl_->dtype); }
int64_t DecodeEngine::frames_for(int64_t latent_frames) const { return impl_->dec->frames_for(latent_frames); }

std::string DecodeEngine::check_latent(const std::vector<int64_t> &shape) const {
  const int c = latent_channels();
  const std::string vae = std::string("the ") + family_name() + " VAE in '" + impl_->opts.model + "'";
  if (shape.size() != 4) {
    std::string s = "[";
    for (size_t i = 0; i < shape.size(); i++) s += (i ? ", " : "") + std::to_string(shape[i]);
    return "a latent buffer holds a tensor of shape " + s + "], not [C, t, h, w]: connect vaedecoder to " +
           "vaeencoder's output (content=latents), not to micro-batches";
  }
  const int want = impl_->opts.moments ? 2 * c : c;
  if (shape[0] != want) {
    std::string what = "the latents have " + std::to_string(shape[0]) + " channels, but " + vae + " takes " +
                       std::to_string(want) + (impl_->opts.moments ? " (moments: mean and log-variance)" : "");
    if (!impl_->opts.moments && shape[0] == 2 * c)
      return what + ": for vaeencoder's latent=moments set moments=true, else set model to the VAE that encoded them";
    return what + ": set model to the VAE that encoded them (latents need the VAE of their own family and " +
           "version: " + VaeDecoder::family_names(", ") + ")";
  }
  if (shape[1] < 1 || shape[2] < 1 || shape[3] < 1) return "an empty latent (no frames or no pixels)";
  return "";
}

bool DecodeEngine::decode(GstBuffer *latent, const FrameFn &on_frame, std::string *why, std::string *note) {
  auto fail = [&](const std::string &w) {
    if (why) *why = w;
    return false;
  };
  std::string err;
  auto t = tensor_from_buffer(latent, &err);
  if (!t) return fail("cannot read the latent: " + err);
  const std::string bad = check_latent(t->sizes().vec());
  if (!bad.empty()) return fail(bad);
  Impl &im = *impl_;
  const int c = latent_channels(), s = spatial_compression();
  const int height = static_cast<int>(t->size(2)) * s, width = static_cast<int>(t->size(3)) * s;
  int64_t given = 0;  // frames on_frame has had: a retry goes on after them
  DecodeTiles tiles = im.tiles;
  std::string retries;
  for (;;) {
    int64_t index = 0;
    const int64_t area = tiles.on() ? int64_t(tiles.tile_h) * tiles.tile_w : int64_t(height) * width;
    try {
      c10::InferenceMode guard;
      at::Tensor lat = t->to(im.device, at::kFloat).unsqueeze(0);
      // latent=moments: the posterior mean, in the decoder's own scale already.
      at::Tensor z = im.opts.moments ? lat.narrow(1, 0, c) : im.dec->denormalize(lat);
      im.dec->decode(z, tiles, [&](const at::Tensor &frames) {
        // [1, 3, n, H, W] in [-1, 1] -> n packed RGB frames, as diffusers' video processor rounds them.
        at::Tensor rgb = ((frames[0] / 2 + 0.5).clamp(0, 1) * 255).round().to(at::kByte);
        rgb = rgb.permute({1, 2, 3, 0}).contiguous().to(at::kCPU);
        const int h = static_cast<int>(rgb.size(1)), w = static_cast<int>(rgb.size(2));
        const size_t bytes = static_cast<size_t>(h) * w * 3;
        for (int64_t i = 0; i < rgb.size(0); i++, index++) {
          if (index < given) continue;  // given before this try ran out of memory
          GstBuffer *buf = gst_buffer_new_allocate(nullptr, bytes, nullptr);
          gst_buffer_fill(buf, 0, rgb[i].data_ptr(), bytes);
          frames_decoded_++;
          given++;
          if (!on_frame(buf, w, h)) throw Stopped{};
          if (im.opts.fake_oom_pixels > 0 && area > im.opts.fake_oom_pixels)
            throw c10::OutOfMemoryError({__func__, __FILE__, static_cast<uint32_t>(__LINE__)},
                                        "out of memory (test hook: " + std::to_string(area) + " pixels a tile)");
        }
      });
      if (note && !retries.empty())
        *note = "decoding a " + std::to_string(width) + "x" + std::to_string(height) + " clip ran out of memory " +
                retries + "; the rest decoded in " + tiles_text(tiles);
      break;
    } catch (const Stopped &) {
      return fail("stopped");
    } catch (const std::exception &e) {
      if (!is_out_of_memory(e)) return fail("decoding failed: " + error_line(e));
      const DecodeTiles next = smaller_tiles(tiles, height, width, s);
      retries += (retries.empty() ? "in " : ", in ") + tiles_text(tiles) + " after " + std::to_string(given) +
                 " frame(s)";
      if (!next.on())
        return fail("decoding a " + std::to_string(width) + "x" + std::to_string(height) +
                    " clip ran out of memory " + retries + " (" + error_line(e) +
                    "): sample smaller sizes, or decode on a device with more memory (property device)");
      tiles = next;
    }
  }
  return true;
}

}  // namespace videotrain::vae
