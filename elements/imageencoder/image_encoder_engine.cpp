#include "image_encoder_engine.h"

#include <torch/torch.h>

#include <sys/stat.h>

#include <filesystem>
#include <optional>
#include <stdexcept>

#include "device_dtype.h"
#include "first_line.h"
#include "folder_identity.h"
#include "latent_store.h"
#include "models/clip_image_processor.h"
#include "models/clip_vision.h"
#include "models/model_family.h"
#include "tensor_buffer.h"

namespace videotrain::image {

namespace {

bool is_dir(const std::string &p) {
  struct stat st;
  return stat(p.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

std::string shape_text(const at::Tensor &t) {
  std::string s = "[";
  for (int64_t i = 0; i < t.dim(); i++) s += (i ? ", " : "") + std::to_string(t.size(i));
  return s + "]";
}

}  // namespace

struct ImageEncoderEngine::Impl {
  ImageEncoderOptions opts;
  ImageEncoderInfo info;
  std::optional<models::ClipImageProcessor> processor;
  models::ClipVisionConfig config;
  std::unique_ptr<models::ClipVisionEncoder> encoder;  // null until the first cache miss with cache_dir
  c10::Device device{c10::kCPU};
  c10::ScalarType dtype = c10::kFloat;
  ImageEncoderStats stats;
  std::unique_ptr<LatentStore> store;
  std::string key_prefix;
  std::string store_warning;

  void load() {
    try {
      encoder = models::ClipVisionEncoder::open(opts.model, device, dtype);
      stats.encoder_loaded = true;
    } catch (const std::exception &e) {
      throw std::runtime_error("cannot load image encoder folder '" + opts.model + "' (property model): " +
                               first_line(e.what()));
    }
  }

  std::string key_of(const at::Tensor &frames) const {
    const at::Tensor c = frames.to(at::kCPU).contiguous();
    return sha256_hex(key_prefix + shape_text(c) + "\n" +
                      std::string(static_cast<const char *>(c.data_ptr()), c.numel()));
  }

  std::optional<at::Tensor> load_stored(const std::string &key, int64_t n) {
    CacheEntry e;
    std::string why;
    const auto r = store->get(key, &e, &why);
    if (r == LatentStore::Lookup::kMiss) return std::nullopt;
    const CachedTensor *t = r == LatentStore::Lookup::kHit ? e.find("image_embeds") : nullptr;
    if (t) {
      auto x = tensor_of_cached(*t, &why);
      if (x && x->dim() == 3 && x->size(0) == n && x->size(1) == config.num_positions() &&
          x->size(2) == config.hidden_size) {
        stats.cache_reads++;
        return x->to(device, dtype);
      }
      if (x) why = "image_embeds " + shape_text(*x) + " do not fit this encoder";
    } else if (why.empty()) {
      why = "the entry holds no image_embeds";
    }
    if (store_warning.empty()) store_warning = "unusable image cache entry, encoding again: " + why;
    return std::nullopt;
  }

  void save_stored(const std::string &key, const at::Tensor &embeds) {
    if (!store->writable()) return;
    CacheEntry e;
    e.tensors = {cached_tensor_of("image_embeds", embeds)};
    e.info = "imageencoder frames";
    std::string why;
    if (store->put(key, e, &why))
      stats.cache_writes++;
    else if (store_warning.empty())
      store_warning = "cannot write to cache-dir: " + why;
  }
};

ImageEncoderEngine::ImageEncoderEngine() : im_(new Impl) {}
ImageEncoderEngine::~ImageEncoderEngine() = default;

// The image-to-video layouts whose transformer takes image_embeds, for messages: "A or B".
static std::string image_embedding_layouts() {
  return models::per_image_layout(
      [](const models::ModelFamily &, const models::ImageLayout &l) { return l.image_embeddings ? l.name : ""; },
      " or ");
}

std::unique_ptr<ImageEncoderEngine> ImageEncoderEngine::create(const ImageEncoderOptions &opts, std::string *error) {
  auto fail = [&](const std::string &why) -> std::unique_ptr<ImageEncoderEngine> {
    if (error) *error = why;
    return nullptr;
  };
  if (opts.model.empty())
    return fail("no image encoder: set the model property (the image_encoder/ folder of a " +
                image_embedding_layouts() + " model)");
  if (!is_dir(opts.model))
    return fail("model '" + opts.model + "' is not a folder (the image_encoder/ folder of a " +
                image_embedding_layouts() + " model)");
  std::unique_ptr<ImageEncoderEngine> e(new ImageEncoderEngine());
  Impl &im = *e->im_;
  im.opts = opts;
  im.info.processor_dir = opts.processor;
  if (im.info.processor_dir.empty()) {
    // The published layout: image_encoder/ and image_processor/ side by side.
    const std::string beside =
        ((std::filesystem::path(opts.model) / "..").lexically_normal() / "image_processor").string();
    im.info.processor_dir = beside;
    if (!is_dir(beside))
      return fail("no image processor: '" + beside + "' does not exist; set the processor property (an "
                  "image_processor/ folder with preprocessor_config.json)");
  }
  try {
    im.config = models::ClipVisionEncoder::read_config(opts.model);
  } catch (const std::exception &ex) {
    return fail("cannot load image encoder folder '" + opts.model + "' (property model): " + first_line(ex.what()));
  }
  try {
    im.processor = models::ClipImageProcessor::open(im.info.processor_dir);
  } catch (const std::exception &ex) {
    return fail("cannot read the image processor (property processor): " + first_line(ex.what()));
  }
  const auto &pc = im.processor->config();
  if (pc.do_center_crop && (pc.crop_height != im.config.image_size || pc.crop_width != im.config.image_size))
    return fail("the image processor '" + im.info.processor_dir + "' crops " + std::to_string(pc.crop_width) + "x" +
                std::to_string(pc.crop_height) + " but the encoder '" + opts.model + "' takes image_size " +
                std::to_string(im.config.image_size) + ": the image_processor/ and image_encoder/ of different models?");
  const int layers = static_cast<int>(im.config.num_hidden_layers);
  im.info.layer = opts.hidden_state < 0 ? layers + 1 + opts.hidden_state : opts.hidden_state;
  if (im.info.layer < 0 || im.info.layer > layers)
    return fail("hidden-state=" + std::to_string(opts.hidden_state) + " is outside the encoder's " +
                std::to_string(layers + 1) + " hidden states (" + std::to_string(-layers - 1) + " to " +
                std::to_string(layers) + "; -2: the penultimate, as " + image_embedding_layouts() + " take)");
  {
    DeviceDtype target;
    std::string target_error;
    if (!resolve_device_dtype(opts.device, opts.dtype, &target, &target_error)) return fail(target_error);
    im.device = target.device;
    im.dtype = target.dtype;
  }
  im.info.tokens = im.config.num_positions();
  im.info.embed_dim = im.config.hidden_size;
  im.info.dtype = videotrain::dtype_name(im.dtype);
  im.info.device = videotrain::device_name(im.device);
  if (opts.cache_dir.empty()) {
    try {
      im.load();
    } catch (const std::exception &ex) {
      return fail(ex.what());
    }
  } else {
    std::string why, model_id, processor_digest;
    im.store = LatentStore::open(opts.cache_dir, true, &why);
    if (!im.store) return fail(why);
    if (!folder_identity(opts.model, &model_id, &why) ||
        !sha256_file(im.info.processor_dir + "/preprocessor_config.json", &processor_digest, &why))
      return fail(why);
    // Everything that changes an embedding: encoder and processor content, layer, dtype, device type.
    im.key_prefix = "videotrain-image v1\nmodel " + model_id + "\nprocessor " + processor_digest + "\nhidden-state " +
                    std::to_string(im.info.layer) + "\ndtype " + videotrain::dtype_name(im.dtype) + "\ndevice " +
                    (im.device.is_cuda() ? "cuda" : "cpu") + "\nframes ";
  }
  return e;
}

at::Tensor ImageEncoderEngine::pixel_values(const at::Tensor &frames) const {
  if (frames.dim() != 4 || frames.size(0) < 1 || frames.size(3) != 3 || frames.scalar_type() != at::kByte)
    throw std::runtime_error("condition_frames must be uint8 [n, H, W, 3] (vaeencoder condition=), not " +
                             std::string(videotrain::dtype_name(frames.scalar_type())) + " " + shape_text(frames));
  const at::Tensor cpu = frames.to(at::kCPU);
  std::vector<at::Tensor> px;
  for (int64_t i = 0; i < cpu.size(0); i++) px.push_back(im_->processor->process(cpu[i].contiguous()));
  return at::stack(px);
}

at::Tensor ImageEncoderEngine::encode(const at::Tensor &frames) {
  Impl &im = *im_;
  const at::Tensor px = pixel_values(frames);  // checks the layout before any cache lookup
  im.stats.clips++;
  std::string key;
  if (im.store) {
    key = im.key_of(frames);
    if (auto hit = im.load_stored(key, frames.size(0))) return *hit;
  }
  if (!im.encoder) im.load();
  at::Tensor y;
  try {
    y = im.encoder->hidden_states(px.to(im.device), im.info.layer).back();
  } catch (const std::exception &e) {
    throw std::runtime_error("the image encoder '" + im.opts.model + "' failed: " + first_line(e.what()));
  }
  y = y.to(im.device, im.dtype).contiguous();
  im.stats.encoded++;
  if (im.store) im.save_stored(key, y);
  return y;
}

const ImageEncoderInfo &ImageEncoderEngine::info() const { return im_->info; }
ImageEncoderStats ImageEncoderEngine::stats() const { return im_->stats; }
std::string ImageEncoderEngine::take_warning() {
  std::string w;
  w.swap(im_->store_warning);
  return w;
}

}  // namespace videotrain::image
