#include "sampler_engine.h"

#include <torch/torch.h>

#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <map>
#include <set>
#include <mutex>

#include <nlohmann/json.hpp>

#include "default_rng.h"
#include "regular_file.h"
#include "metas.h"
#include "models/native_model.h"
#include "models/clip_image_processor.h"
#include "models/clip_vision.h"
#include "models/i2v_inputs.h"
#include "models/layers.h"
#include "models/model_family.h"
#include "models/param_snapshot.h"
#include "models/samplers.h"
#include "models/vae/vae_encoder.h"
#include "run_context.h"
#include "tensor_buffer.h"
#include "prompt_record.h"

namespace videotrain {

namespace {

using Clock = std::chrono::steady_clock;

struct Embedded {
  std::string text;
  at::Tensor embeds, mask;  // [L, D], [L] (mask may be undefined)
};

struct PromptEntry {
  int64_t seed = -1, frames = 0, width = 0, height = 0;
  Embedded prompt, negative;
  bool has_prompt = false, has_negative = false;
  at::Tensor image, last_image;  // uint8 [H, W, 3] from promptsrc's image columns (undefined: none)
};

// What an image-to-video folder's config.json asks of the sampler.
struct FolderLayout {
  int64_t in_channels = 0, out_channels = 0;
  bool image_embeds = false;  // image_dim: the CLIP image encoder's states
  bool expand_timesteps = false;  // the pipeline's expand_timesteps: an image, when given, is the first frame
  bool condition() const { return out_channels > 0 && in_channels != out_channels; }
  bool image_to_video() const { return condition() || image_embeds; }
};

// The family of a diffusers transformer folder from its config.json (null with *why when it is not one).
const models::ModelFamily *folder_family(const std::string &spec, FolderLayout *layout, std::string *why) {
  if (!is_model_folder(spec)) {
    *why = "ddpsampler samples native transformers (ddptrainsink model=DIR, a diffusers folder); the trainer's "
           "model '" + spec + "' is not one";
    return nullptr;
  }
  std::string text;
  if (!read_small_file(spec + "/config.json", kMaxConfigBytes, &text, why)) return nullptr;
  const auto j = nlohmann::json::parse(text, nullptr, false);
  const std::string cls = j.is_object() && j.contains("_class_name") && j["_class_name"].is_string()
                              ? j["_class_name"].get<std::string>()
                              : "";
  if (j.is_object()) {
    if (j.contains("in_channels") && j["in_channels"].is_number_integer()) layout->in_channels = j["in_channels"].get<int64_t>();
    if (j.contains("out_channels") && j["out_channels"].is_number_integer())
      layout->out_channels = j["out_channels"].get<int64_t>();
    layout->image_embeds = j.contains("image_dim") && j["image_dim"].is_number_integer();
  }
  layout->expand_timesteps = models::pipeline_expand_timesteps(spec);
  if (const auto *f = models::family_of_class(cls)) return f;
  *why = "the trainer's model " + spec + " is a " + (cls.empty() ? "folder without _class_name" : cls) +
         ", which ddpsampler has no sampler for (" + models::family_titles(", ") + ")";
  return nullptr;
}

}  // namespace

struct SamplerEngine::Impl {
  SamplerConfig cfg;
  std::shared_ptr<RunContext> run;
  int callback = -1;
  int rank = 0, world = 1;

  mutable std::mutex mu;
  std::condition_variable cv;
  std::map<uint32_t, PromptEntry> prompts;  // this rank's share
  std::set<uint32_t> too_large;              // prompts refused for their size (said once)
  bool prompts_complete = false;
  std::shared_ptr<const ParamSnapshot> pending;
  bool finished = false, flushing = false;
  uint64_t last_offered = UINT64_MAX;
  std::vector<BusMessage> messages;
  std::string error;
  uint64_t samples = 0;
  int64_t model_channels = 0;  // the latent channels of the trainer's model (0: unknown)
  FolderLayout layout;         // of the trainer's model (read at attach)
  bool warned_wait = false;
  int64_t vae_spatial = 0;     // the vaedecoder downstream's pixels per latent (0: none answered)

  // Sampling thread only.
  std::unique_ptr<TrainModel> model;
  std::string model_spec;
  bool expand_timesteps = false;  // the model's pipeline says expand_timesteps (an image: its first frame)
  std::unique_ptr<vae::VaeEncoder> vae_encoder;  // image-to-video: loaded at the first sample
  std::unique_ptr<models::ClipVisionEncoder> image_encoder;
  std::unique_ptr<models::ClipImageProcessor> image_processor;

  // The image inputs of one prompt (models::image_inputs, as its family's pipeline builds them), with
  // ddpsampler's encoders (loaded at the first prompt that needs them) and words.
  models::ImageInputs image_inputs(const models::DitModel &dit, const models::ImagePrompt &in, const std::string &where,
                                   at::Generator &gen, const c10::Device &dev) {
    models::ImageEncoders enc;
    enc.vae = [&](const std::string &why) -> const vae::VaeEncoder & {
      if (cfg.vae.empty()) throw std::runtime_error(why + ": set ddpsampler's vae to its VAE folder");
      if (!vae_encoder) vae_encoder = vae::VaeEncoder::load(cfg.vae, dev, at::kFloat);
      return *vae_encoder;
    };
    enc.clip = [&](const std::string &why) {
      if (cfg.image_encoder.empty())
        throw std::runtime_error(why + ": set ddpsampler's image-encoder to its CLIP image_encoder/ folder");
      if (!image_encoder) {
        const std::string proc = cfg.image_processor.empty() ? models::sibling_image_processor(cfg.image_encoder)
                                                             : cfg.image_processor;
        if (proc.empty())
          throw std::runtime_error("no image_processor/ beside " + cfg.image_encoder + ": set image-processor");
        image_processor = std::make_unique<models::ClipImageProcessor>(models::ClipImageProcessor::open(proc));
        image_encoder = models::ClipVisionEncoder::open(cfg.image_encoder, dev, at::kFloat);
      }
      return std::pair<const models::ClipVisionEncoder *, const models::ClipImageProcessor *>(image_encoder.get(),
                                                                                              image_processor.get());
    };
    models::ImageWords words;
    words.where = where;
    words.model = "the trainer's model";
    words.vae = cfg.vae;
    words.set_vae = "set vae to";
    words.set_sizes = "set spatial-compression and temporal-compression to the VAE's";
    words.give_image = "give the prompt file an image column";
    return models::image_inputs(dit, expand_timesteps, in, enc, words, gen, dev);
  }

  void note(const std::string &name, uint64_t step, const std::string &text) {
    BusMessage m(name == "warning" ? BusMessage::kWarning : name);
    if (name != "warning") m.ints["step"] = int64_t(step);
    m.strings["text"] = text;
    messages.push_back(std::move(m));
  }

  // Hands the trainer's current weights to the sampling thread (trainer's thread).
  void offer(uint64_t step, bool final) {
    std::unique_lock<std::mutex> lock(mu);
    if (flushing || finished) return;
    if (last_offered == step) return;  // sampled at this step already (at-start seen twice, at-end of a due step)
    if (pending) {
      if (cfg.skip_if_busy && !final) {
        note("ddpsampler-skipped", step,
             "sampling at step " + std::to_string(step) + " skipped: the previous one has not started (skip-if-busy)");
        return;
      }
      // The trainer holds here until the sampler takes the previous snapshot (bounded memory).
      if (!warned_wait) {
        warned_wait = true;
        note("warning", step,
             "training waits at step " + std::to_string(step) + " for the sampler to take the previous snapshot: "
             "sampling is slower than every=" + std::to_string(cfg.every) +
                 " steps (raise every, lower steps, or set skip-if-busy=true)");
      }
      const auto patience = std::chrono::milliseconds(int64_t(std::max(1.0, run->timeout_s()) * 1000));
      if (!cv.wait_for(lock, patience, [&] { return !pending || flushing; })) {
        note("warning", step,
             "sampling at step " + std::to_string(step) + " skipped: the sampler took no snapshot for " +
                 std::to_string(int(run->timeout_s())) + " s (is its prompt branch running?)");
        return;
      }
      if (flushing) return;
    }
    lock.unlock();
    auto snap = cfg.ema ? run->snapshot_ema() : run->snapshot_state();
    lock.lock();
    if (!snap || flushing) return;
    pending = std::move(snap);
    last_offered = step;
    cv.notify_all();
  }

  void on_step(const StepReport &r) {
    if (r.finished) {
      // at-end; else the last step when the schedule has it due and nothing was offered yet (a
      // sampler that joined a run which had already finished: it samples once, then ends).
      const uint64_t step = run->steps_done();
      bool due = (cfg.every > 0 && step > 0 && step % cfg.every == 0) || (cfg.at_start && step == 0);
      {
        std::lock_guard<std::mutex> lock(mu);
        due = due && last_offered == UINT64_MAX;
      }
      if (!r.failed && (cfg.at_end || due)) offer(step, true);
      std::lock_guard<std::mutex> lock(mu);
      // A failed run: nothing more to sample; run_next() returns once the pending snapshot is done.
      if (r.failed && !finished)
        note("warning", r.step, "the trainer failed after step " + std::to_string(r.step) +
                                    ": no more samples (the trainer's error says why)");
      finished = true;
      cv.notify_all();
      return;
    }
    if (r.model_built) {
      if (cfg.at_start && run->steps_done() == 0) offer(0, false);
      return;
    }
    if (cfg.every > 0 && r.step % cfg.every == 0) offer(r.step, false);
  }

  c10::Device device() const {
    const std::string d = cfg.device.empty() || cfg.device == "auto" ? run->device_name() : cfg.device;
    return c10::Device(d);
  }

  models::DitModel &dit_for(const ParamSnapshot &snap) {
    const auto dev = device();
    if (!model || model_spec != snap.model) {
      BorrowedDefaultRng rng(dev);  // building draws initial weights from the default generator
      ModelOptions o = snap.options;
      o.attention_backend = models::follower_attention_backend(cfg.attention_backend, dev, "ddpsampler");
      model = make_model(snap.model, snap.dims, dev, o);
      model_spec = snap.model;
      expand_timesteps = is_model_folder(snap.model) && models::pipeline_expand_timesteps(snap.model);
    }
    load_snapshot(*model, snap);
    models::DitModel *dit = model->dit();
    if (!dit)
      throw std::runtime_error("ddpsampler samples native transformers (ddptrainsink model=DIR, a diffusers folder); "
                               "the trainer's model '" + snap.model + "' is not one");
    return *dit;
  }

  models::SamplerKind kind_for(const models::ModelFamily &f) const {
    const std::string name = cfg.sampler == "auto" ? f.default_sampler : cfg.sampler;
    const auto kind = models::parse_sampler(name);
    if (f.name != std::string(models::sampler_family(kind))) {
      const auto *of = models::family_named(models::sampler_family(kind));
      throw std::runtime_error("sampler=" + name + " is " + (of ? of->title : "another family") +
                               "'s but the trainer's model is " + f.name + " (use " + f.samplers + ")");
    }
    return kind;
  }

  at::Tensor text_of(const Embedded &e, const models::ModelFamily &f, const c10::Device &dev) const {
    at::Tensor t = e.embeds.to(dev, at::kFloat).unsqueeze(0);
    // The family's pipelines pass the encoder's output trimmed to the tokens and zero-padded, or all of it.
    if (f.text == models::TextConvention::kZeroPadded && e.mask.defined())
      t = models::zero_text_padding(t, e.mask.to(dev).unsqueeze(0));
    return t;
  }

  bool sample_all(const ParamSnapshot &snap, const std::function<bool(SampleOut &)> &emit) {
    auto &dit = dit_for(snap);
    const models::ModelFamily &def = dit.descriptor();
    const auto kind = kind_for(def);
    const auto dev = device();
    const bool frames_first = def.layout == models::LatentLayout::kFramesFirst;
    // An image-to-video model's input holds its condition channels after the latents.
    const int64_t channels = dit.latent_channels() - dit.condition_channels();
    const int64_t spatial = cfg.spatial_compression ? cfg.spatial_compression
                            : vae_spatial           ? vae_spatial
                                                    : (channels == 48 ? 16 : 8);
    const int64_t temporal = cfg.temporal_compression;
    const int64_t patch_t = def.temporal_padding == models::TemporalPadding::kNone ? 1 : dit.temporal_patch();
    std::map<uint32_t, PromptEntry> mine;
    {
      std::lock_guard<std::mutex> lock(mu);
      mine = prompts;
    }
    for (const auto &[index, p] : mine) {
      const auto t0 = Clock::now();
      int64_t frames = p.frames ? p.frames : cfg.num_frames ? cfg.num_frames : def.frames;
      const int64_t width = p.width ? p.width : cfg.width ? cfg.width : def.width;
      const int64_t height = p.height ? p.height : cfg.height ? cfg.height : def.height;
      const int64_t seed = p.seed >= 0 ? p.seed : cfg.seed;
      const std::string where = "prompt " + std::to_string(index);
      if ((frames - 1) % temporal != 0) {  // as the pipelines round it
        const int64_t fixed = frames / temporal * temporal + 1;
        std::lock_guard<std::mutex> lock(mu);
        note("warning", snap.step, where + ": num_frames " + std::to_string(frames) + " is not " +
                                       std::to_string(temporal) + "k+1, rounded to " + std::to_string(fixed));
        frames = fixed;
      }
      if (width % (spatial * 2) != 0 || height % (spatial * 2) != 0) {
        std::lock_guard<std::mutex> lock(mu);
        note("warning", snap.step, where + ": " + std::to_string(width) + "x" + std::to_string(height) +
                                       " is not a multiple of " + std::to_string(spatial * 2) + ": not sampled");
        continue;
      }
      const int64_t t = (frames - 1) / temporal + 1, h = height / spatial, w = width / spatial;
      // Before anything is allocated: a size a prompt file asks for can need terabytes.
      const int64_t limit = cfg.max_tokens > 0 ? cfg.max_tokens
                                               : 4 * ((def.frames - 1) / temporal + 1) * (def.height / spatial / 2) *
                                                     (def.width / spatial / 2);
      if (const double tokens = double(t) * double(h / 2) * double(w / 2); tokens > double(limit)) {
        std::lock_guard<std::mutex> lock(mu);
        if (too_large.insert(index).second) {
          char text[64];
          std::snprintf(text, sizeof text, "%.0f", tokens);
          note("warning", snap.step, where + ": " + std::to_string(frames) + " frames of " + std::to_string(width) + "x" +
                                         std::to_string(height) + " are " + text + " video tokens, over max-tokens=" +
                                         std::to_string(limit) + (cfg.max_tokens > 0 ? "" : " (4x the model's default size)") +
                                         ": not sampled (lower the prompt's size or raise max-tokens)");
        }
        continue;
      }
      // Temporal patch padding (patch_size_t > 1): the pipeline pads the latent frames up to a multiple of
      // patch_size_t in front, and drops those frames after sampling.
      const int64_t extra = patch_t > 1 && t % patch_t ? patch_t - t % patch_t : 0;
      const std::vector<int64_t> shape = frames_first ? std::vector<int64_t>{1, t + extra, channels, h, w}
                                                      : std::vector<int64_t>{1, channels, t, h, w};
      const at::Tensor pe = text_of(p.prompt, def, dev), ne = text_of(p.negative, def, dev);
      if (pe.size(-1) != dit.text_dim())
        throw std::runtime_error("the prompt embeddings are " + std::to_string(pe.size(-1)) + " wide, the model takes " +
                                 std::to_string(dit.text_dim()) + " (is textencoder's model the one this transformer "
                                 "was trained with?)");
      models::SamplerOptions so;
      so.kind = kind;
      so.steps = cfg.steps;
      so.flow_shift = cfg.flow_shift;
      so.snr_shift_scale = cfg.snr_shift_scale > 0 ? cfg.snr_shift_scale : def.default_shift;
      auto sampler = models::Sampler::make(so);
      // The pipelines' noise: torch.randn(shape) from a CPU generator seeded with the seed.
      at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(static_cast<uint64_t>(seed));
      // Built before the noise: an image-latents condition draws its posterior from the generator first.
      models::ImagePrompt ip;
      ip.image = p.image, ip.last_image = p.last_image;
      ip.frames = frames, ip.height = height, ip.width = width, ip.latent_frames = t, ip.noise_shape = shape;
      const models::ImageInputs image = image_inputs(dit, ip, where, gen, dev);
      const at::Tensor noise = at::randn(shape, gen, at::TensorOptions(at::kFloat)).to(dev);
      // Two experts (the trainer's model-2): each step's expert as the two-expert pipeline picks it (boundary_ratio).
      at::Tensor lat = model->dit_2() ? models::sample_latents_2(dit, *model->dit_2(), model->boundary_ratio(), *sampler,
                                                                 noise, pe, ne, cfg.guidance,
                                                                 cfg.guidance_2 < 0 ? cfg.guidance : cfg.guidance_2, gen,
                                                                 {}, image)[0]
                                      : models::sample_latents(dit, *sampler, noise, pe, ne, cfg.guidance, gen, {}, image)[0];
      if (frames_first) lat = lat.slice(0, extra).permute({1, 0, 2, 3});
      lat = lat.to(at::kCPU, at::kFloat).contiguous();

      SampleOut out;
      out.step = snap.step;
      out.prompt_index = index;
      out.seed = seed;
      out.frames = frames;
      out.width = width;
      out.height = height;
      out.prompt = p.prompt.text;
      out.sampler = models::sampler_name(kind);
      out.latents = buffer_from_tensor(lat);
      auto *meta = gst_buffer_add_videotrain_sample_meta(out.latents, p.prompt.text.c_str(), "");
      meta->sample_id = index;
      meta->clip_index = snap.step;
      out.seconds = std::chrono::duration<double>(Clock::now() - t0).count();
      {
        std::lock_guard<std::mutex> lock(mu);
        samples++;
      }
      if (!emit(out)) return false;
    }
    return true;
  }
};

SamplerEngine::SamplerEngine(const SamplerConfig &config) : impl_(std::make_unique<Impl>()) { impl_->cfg = config; }

SamplerEngine::~SamplerEngine() { detach(); }

bool SamplerEngine::attach(std::shared_ptr<RunContext> run) {
  auto &d = *impl_;
  try {
    models::parse_sampler(d.cfg.sampler == "auto" ? "unipc" : d.cfg.sampler);
    models::SamplerOptions o;
    o.steps = d.cfg.steps;
    o.flow_shift = d.cfg.flow_shift;
    models::Sampler::make(o);
  } catch (const std::exception &e) {
    d.error = e.what();
    return false;
  }
  if (d.cfg.ema && !run->has_ema()) {
    d.error = "weights=ema, but the trainer keeps no EMA: set ema-decay on its ddptrainsink (or weights=raw)";
    return false;
  }
  // The sampler must fit the trainer's model: said at start, not at the first sample.
  if (const std::string spec = run->model_spec(); !spec.empty()) {
    std::string why;
    const models::ModelFamily *family = folder_family(spec, &d.layout, &why);
    if (!family) {
      d.error = why;
      return false;
    }
    d.model_channels = d.layout.out_channels > 0 ? d.layout.out_channels : d.layout.in_channels;
    // What an image-to-video model needs, said at start rather than at the first sample.
    if (d.layout.condition() && d.cfg.vae.empty()) {
      d.error = "the trainer's model " + spec + " is image-to-video (" + std::to_string(d.layout.in_channels) +
                " input channels: the noisy latents and the image's condition): set ddpsampler's vae to the VAE "
                "folder that encodes the prompts' images (and give promptsrc's prompt file an image column)";
      return false;
    }
    if (d.layout.image_embeds && d.cfg.image_encoder.empty()) {
      d.error = "the trainer's model " + spec + " takes image embeddings (image_dim): set ddpsampler's image-encoder "
                "to its CLIP image_encoder/ folder";
      return false;
    }
    try {
      d.kind_for(*family);
    } catch (const std::exception &e) {
      d.error = e.what();
      return false;
    }
  }
  d.run = std::move(run);
  d.rank = d.run->rank();
  d.world = d.run->world_size();
  Impl *p = impl_.get();
  // A run that has already finished calls back at once (on_step: its last snapshot, then the end).
  d.callback = d.run->follow_steps([p](const StepReport &r) { p->on_step(r); }, d.cfg.every, d.cfg.at_start, d.cfg.ema);
  // Subscribed after the model was built: at-start takes step 0 now.
  if (d.cfg.at_start && d.run->has_model() && d.run->steps_done() == 0) d.offer(0, false);
  return true;
}

bool SamplerEngine::attached() const { return impl_->run != nullptr; }

bool SamplerEngine::check_vae(int channels, int spatial, const std::string &family) {
  auto &d = *impl_;
  if (d.model_channels > 0 && channels != d.model_channels) {
    d.error = "the vaedecoder after ddpsampler (a " + family + " VAE) takes " + std::to_string(channels) +
              " latent channels but the trainer's model makes " + std::to_string(d.model_channels) +
              ": give vaedecoder the VAE the model was trained with";
    return false;
  }
  d.vae_spatial = spatial;
  return true;
}

void SamplerEngine::detach() {
  auto &d = *impl_;
  set_flushing(true);
  if (d.run && d.callback >= 0) d.run->remove_step_callback(d.callback);
  d.callback = -1;
  d.run.reset();
}

bool SamplerEngine::add_prompt(GstBuffer *buffer) {
  auto &d = *impl_;
  std::string why;
  auto record = tensor_from_buffer(buffer, &why);
  if (!record || record->scalar_type() != at::kLong || record->numel() != kPromptFields) {
    d.error = "a buffer that is not a promptsrc prompt (int64 [6] record): " + (why.empty() ? "wrong tensor" : why) +
              " (link promptsrc ! textencoder ! ddpsampler)";
    return false;
  }
  at::Tensor embeds, mask;
  if (!text_tensors_from_buffer(buffer, &embeds, &mask, &why) || !embeds.defined()) {
    d.error = "a prompt without text embeddings" + (why.empty() ? std::string() : ": " + why) +
              " (put a textencoder between promptsrc and ddpsampler)";
    return false;
  }
  SampleInfo info;
  read_sample_meta(buffer, &info);
  const auto r = record->contiguous();
  const int64_t *v = r.data_ptr<int64_t>();
  const auto index = static_cast<uint32_t>(v[kPromptIndex]);
  if (d.world > 1 && index % uint32_t(d.world) != uint32_t(d.rank)) return true;  // another rank's
  std::lock_guard<std::mutex> lock(d.mu);
  auto &e = d.prompts[index];
  e.seed = v[kPromptSeed];
  e.frames = v[kPromptFrames];
  e.width = v[kPromptWidth];
  e.height = v[kPromptHeight];
  if (v[kPromptRole] == kRolePrompt) {
    for (const auto &[name, slot] : {std::pair<const char *, at::Tensor *>{"image", &e.image}, {"last_image", &e.last_image}}) {
      auto img = named_tensor_from_buffer(buffer, name, nullptr);
      if (!img) continue;
      if (img->scalar_type() != at::kByte || img->dim() != 3 || img->size(2) != 3) {
        d.error = std::string("prompt ") + std::to_string(index) + "'s " + name + " is not an 8-bit RGB image [H, W, 3]";
        return false;
      }
      *slot = img->to(at::kCPU).clone();
    }
  }
  Embedded &slot = v[kPromptRole] == kRoleNegative ? e.negative : e.prompt;
  (v[kPromptRole] == kRoleNegative ? e.has_negative : e.has_prompt) = true;
  slot.text = info.caption;
  slot.embeds = embeds.to(at::kCPU);
  slot.mask = mask.defined() ? mask.to(at::kCPU) : mask;
  return true;
}

bool SamplerEngine::prompts_done() {
  auto &d = *impl_;
  std::lock_guard<std::mutex> lock(d.mu);
  for (auto it = d.prompts.begin(); it != d.prompts.end();) {
    if (!it->second.has_prompt || !it->second.has_negative) {
      d.note("warning", 0, "prompt " + std::to_string(it->first) + " came without its " +
                               (it->second.has_prompt ? "negative prompt" : "prompt") + ": not sampled");
      it = d.prompts.erase(it);
    } else {
      ++it;
    }
  }
  // An image-to-video model samples each prompt from its image: a prompt without one is an error.
  if (!d.layout.image_to_video() && d.layout.in_channels > 0 && !d.layout.expand_timesteps) {
    for (const auto &[index, e] : d.prompts) {
      if (!e.image.defined()) continue;
      d.note("warning", 0, "prompt " + std::to_string(index) + " has an image, but the trainer's model is "
                           "text-to-video: sampled from its text alone");
      break;
    }
  } else if (d.layout.image_to_video()) {
    for (const auto &[index, e] : d.prompts) {
      if (!e.image.defined()) {
        d.error = "prompt " + std::to_string(index) + " has no image, but the trainer's model is image-to-video: give "
                  "promptsrc's prompt file an image column (a path to each prompt's first frame)";
        return false;
      }
    }
  }
  d.prompts_complete = true;
  d.cv.notify_all();
  return true;
}

SamplerEngine::Next SamplerEngine::run_next(const std::function<bool(SampleOut &)> &emit) {
  auto &d = *impl_;
  std::shared_ptr<const ParamSnapshot> snap;
  {
    std::unique_lock<std::mutex> lock(d.mu);
    d.cv.wait(lock, [&] { return d.flushing || (d.pending && d.prompts_complete) || (d.finished && !d.pending); });
    if (d.flushing) return Next::kFlushing;
    if (!d.pending) return Next::kFinished;
    snap = std::move(d.pending);
    d.pending.reset();
    d.cv.notify_all();  // a trainer waiting to hand the next one goes on
  }
  try {
    torch::NoGradGuard no_grad;
    if (!d.sample_all(*snap, emit)) return Next::kFlushing;
  } catch (const std::exception &e) {
    d.error = std::string("sampling at step ") + std::to_string(snap->step) + " failed: " + e.what();
    return Next::kError;
  }
  return Next::kSampled;
}

void SamplerEngine::set_flushing(bool flushing) {
  std::lock_guard<std::mutex> lock(impl_->mu);
  impl_->flushing = flushing;
  impl_->cv.notify_all();
}

std::vector<BusMessage> SamplerEngine::take_messages() {
  std::lock_guard<std::mutex> lock(impl_->mu);
  return std::move(impl_->messages);
}

const std::string &SamplerEngine::error() const { return impl_->error; }

size_t SamplerEngine::prompts_kept() const {
  std::lock_guard<std::mutex> lock(impl_->mu);
  return impl_->prompts.size();
}

uint64_t SamplerEngine::samples_done() const {
  std::lock_guard<std::mutex> lock(impl_->mu);
  return impl_->samples;
}

}  // namespace videotrain
