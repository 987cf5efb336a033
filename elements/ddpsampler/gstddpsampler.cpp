/* ddpsampler: the GObject face of SamplerEngine.
 *
 * Sink: promptsrc's buffers after textencoder (a prompt and its negative prompt, embedded). Src:
 * one latent buffer per sample ([C, t, h, w], float32, CPU, sample meta: caption = prompt,
 * sample-id = prompt index, clip-index = step), each after a serialized custom event
 * "ddpsampler-sample" (step, prompt, seed, num-frames, width, height, sampler) that tells
 * samplesink where one sample ends and the next begins. The trainer (property trainer: the
 * name of a ddptrainsink) is found through the run context as ddpvalsink finds it. Sampling
 * runs on the src pad's task once the prompt stream has ended; the src pad ends (EOS) when the
 * trainer has finished and its last snapshot is sampled. */
#include "one_error.h"
#include "gstddpsampler.h"

#include <memory>
#include <string>

#include "bus_message_gst.h"
#include "gst_enum.h"
#include "models/attention_backend.h"
#include "models/model_family.h"
#include "bus_messages_doc.h"
#include "prompt_record.h"
#include "sampler_engine.h"
#include "tensor_caps.h"
#include "trainer_follower.h"

GST_DEBUG_CATEGORY_STATIC(ddpsampler_debug);
#define GST_CAT_DEFAULT ddpsampler_debug

using namespace videotrain;

struct _GstDdpSampler {
  GstElement parent;
  GstPad *sinkpad, *srcpad;
  SamplerConfig *config;               // object lock
  TrainerFollower *follower;           // object lock: trainer property and its run, from set_context
  SamplerEngine *engine;               // between READY and PAUSED
  gboolean src_started;                // stream-start, caps and segment pushed
  guint64 samples_done;                // object lock
};

G_DEFINE_TYPE(GstDdpSampler, gst_ddp_sampler, GST_TYPE_ELEMENT);
GST_ELEMENT_REGISTER_DEFINE_WITH_CODE(ddpsampler, "ddpsampler", GST_RANK_NONE, GST_TYPE_DDP_SAMPLER,
                                      GST_DEBUG_CATEGORY_INIT(ddpsampler_debug, "ddpsampler", 0,
                                                              "Sample videos from prompts with the trainer's weights"));

enum {
  PROP_0,
  PROP_FOLLOWER,  // trainer, every, at-start, skip-if-busy, weights (trainer_follower.h)
  PROP_AT_END = PROP_FOLLOWER + kFollowerProperties,
  PROP_ATTENTION_BACKEND,
  PROP_SAMPLER,
  PROP_STEPS,
  PROP_GUIDANCE,
  PROP_GUIDANCE_2,
  PROP_FLOW_SHIFT,
  PROP_SNR_SHIFT_SCALE,
  PROP_NUM_FRAMES,
  PROP_WIDTH,
  PROP_HEIGHT,
  PROP_SEED,
  PROP_MAX_TOKENS,
  PROP_TEMPORAL_COMPRESSION,
  PROP_SPATIAL_COMPRESSION,
  PROP_DEVICE,
  PROP_VAE,
  PROP_IMAGE_ENCODER,
  PROP_IMAGE_PROCESSOR,
  PROP_SAMPLES_DONE,
};

VIDEOTRAIN_DEFINE_ENUM(weights_type, "GstDdpSamplerWeights", VIDEOTRAIN_FOLLOWER_WEIGHTS_ENUM_VALUES)
VIDEOTRAIN_DEFINE_ENUM(attention_backend_type, "GstDdpSamplerAttentionBackend", VIDEOTRAIN_ATTENTION_BACKEND_ENUM_VALUES)

static GstStaticPadTemplate sink_template = GST_STATIC_PAD_TEMPLATE(
    "sink", GST_PAD_SINK, GST_PAD_ALWAYS,
    GST_STATIC_CAPS(VIDEOTRAIN_TENSOR_MEDIA_TYPE ", content=(string)" VIDEOTRAIN_PROMPT_CONTENT));
static GstStaticPadTemplate src_template = GST_STATIC_PAD_TEMPLATE(
    "src", GST_PAD_SRC, GST_PAD_ALWAYS,
    GST_STATIC_CAPS(VIDEOTRAIN_TENSOR_MEDIA_TYPE ", content=(string)latents, dtype=(string)float32, device=(string)cpu"));

static void post_messages(GstDdpSampler *self) {
  if (!self->engine) return;
  for (const auto &m : self->engine->take_messages()) post_bus_message(GST_ELEMENT(self), m);
}

// Attaches the engine to the trainer's run (asked of the bins unless held). FALSE: error posted.
static gboolean ensure_attached(GstDdpSampler *self) {
  if (self->engine->attached()) return TRUE;
  std::string why;
  auto run = follower_run(GST_ELEMENT(self), *self->follower, &why);
  if (!run) {
    GST_ELEMENT_ERROR(self, RESOURCE, NOT_FOUND, ("%s", why.c_str()), (nullptr));
    return FALSE;
  }
  if (!self->engine->attach(run)) {
    GST_ELEMENT_ERROR(self, RESOURCE, SETTINGS, ("Cannot start sampling: %s", self->engine->error().c_str()), (nullptr));
    return FALSE;
  }
  GST_INFO_OBJECT(self, "sampling for '%s' on rank %d of %d", follower_trainer(GST_ELEMENT(self), *self->follower).c_str(),
                  run->rank(), run->world_size());
  // A vaedecoder downstream (started before us: state changes go from the sinks up) says which
  // latents it takes, so that a VAE of another model is an error now, not at the first sample.
  GstQuery *q = gst_query_new_custom(GST_QUERY_CUSTOM, gst_structure_new_empty(VIDEOTRAIN_LATENT_QUERY));
  if (gst_pad_peer_query(self->srcpad, q)) {
    const GstStructure *s = gst_query_get_structure(q);
    gint channels = 0, spatial = 0;
    const gchar *family = gst_structure_get_string(s, "family");
    if (gst_structure_get_int(s, "channels", &channels) && gst_structure_get_int(s, "spatial", &spatial) &&
        !self->engine->check_vae(channels, spatial, family ? family : "?")) {
      gst_query_unref(q);
      GST_ELEMENT_ERROR(self, RESOURCE, SETTINGS, ("%s", self->engine->error().c_str()), (nullptr));
      return FALSE;
    }
  }
  gst_query_unref(q);
  return TRUE;
}

static gboolean push_sample(GstDdpSampler *self, SampleOut &s) {
  if (!self->src_started) {
    gchar *id = gst_pad_create_stream_id(self->srcpad, GST_ELEMENT(self), "samples");
    gst_pad_push_event(self->srcpad, gst_event_new_stream_start(id));
    g_free(id);
    GstCaps *caps = gst_pad_get_pad_template_caps(self->srcpad);
    gst_pad_push_event(self->srcpad, gst_event_new_caps(caps));
    gst_caps_unref(caps);
    GstSegment seg;
    gst_segment_init(&seg, GST_FORMAT_TIME);
    gst_pad_push_event(self->srcpad, gst_event_new_segment(&seg));
    self->src_started = TRUE;
  }
  GstStructure *st = gst_structure_new("ddpsampler-sample", "step", G_TYPE_UINT64, s.step, "prompt", G_TYPE_UINT,
                                       s.prompt_index, "seed", G_TYPE_INT64, s.seed, "num-frames", G_TYPE_INT,
                                       int(s.frames), "width", G_TYPE_INT, int(s.width), "height", G_TYPE_INT,
                                       int(s.height), "sampler", G_TYPE_STRING, s.sampler.c_str(), nullptr);
  gst_pad_push_event(self->srcpad, gst_event_new_custom(GST_EVENT_CUSTOM_DOWNSTREAM, gst_structure_copy(st)));
  const GstFlowReturn ret = gst_pad_push(self->srcpad, s.latents);
  s.latents = nullptr;
  gst_structure_set(st, "seconds", G_TYPE_DOUBLE, s.seconds, "prompt-text", G_TYPE_STRING, s.prompt.c_str(), nullptr);
  gst_element_post_message(GST_ELEMENT(self), gst_message_new_element(GST_OBJECT(self), st));
  GST_OBJECT_LOCK(self);
  self->samples_done++;
  GST_OBJECT_UNLOCK(self);
  if (ret != GST_FLOW_OK) GST_INFO_OBJECT(self, "downstream returned %s", gst_flow_get_name(ret));
  return ret == GST_FLOW_OK;
}

static void src_loop(GstPad *pad) {
  auto *self = GST_DDP_SAMPLER(gst_pad_get_parent_element(pad));
  const auto next = self->engine->run_next([self](SampleOut &s) {
    post_messages(self);
    return push_sample(self, s) == TRUE;
  });
  post_messages(self);
  switch (next) {
    case SamplerEngine::Next::kSampled: break;
    case SamplerEngine::Next::kFinished:
      GST_INFO_OBJECT(self, "trainer finished: %" G_GUINT64_FORMAT " samples", self->engine->samples_done());
      gst_pad_push_event(self->srcpad, gst_event_new_eos());
      gst_pad_pause_task(pad);
      break;
    case SamplerEngine::Next::kFlushing: gst_pad_pause_task(pad); break;
    case SamplerEngine::Next::kError:
      GST_ELEMENT_ERROR(self, STREAM, FAILED, ("%s", self->engine->error().c_str()), (nullptr));
      gst_pad_push_event(self->srcpad, gst_event_new_eos());
      gst_pad_pause_task(pad);
      break;
  }
  gst_object_unref(self);
}

static GstFlowReturn sink_chain(GstPad *, GstObject *parent, GstBuffer *buf) {
  auto *self = GST_DDP_SAMPLER(parent);
  const bool ok = self->engine && self->engine->add_prompt(buf);
  gst_buffer_unref(buf);
  if (!ok) {
    GST_ELEMENT_ERROR(self, STREAM, FORMAT, ("%s", self->engine ? self->engine->error().c_str() : "not started"),
                      (nullptr));
    return GST_FLOW_ERROR;
  }
  return GST_FLOW_OK;
}

static gboolean sink_event(GstPad *pad, GstObject *parent, GstEvent *event) {
  auto *self = GST_DDP_SAMPLER(parent);
  switch (GST_EVENT_TYPE(event)) {
    case GST_EVENT_EOS: {
      gst_event_unref(event);
      if (!self->engine) return FALSE;
      if (!self->engine->prompts_done()) {
        post_messages(self);
        GST_ELEMENT_ERROR(self, STREAM, FORMAT, ("%s", self->engine->error().c_str()), (nullptr));
        return FALSE;
      }
      post_messages(self);
      GST_INFO_OBJECT(self, "%zu prompts for this rank", self->engine->prompts_kept());
      return gst_pad_start_task(self->srcpad, (GstTaskFunction)src_loop, self->srcpad, nullptr);
    }
    case GST_EVENT_CAPS:
    case GST_EVENT_STREAM_START:
    case GST_EVENT_SEGMENT:
      gst_event_unref(event);  // the src pad has its own stream
      return TRUE;
    default: return gst_pad_event_default(pad, parent, event);
  }
}

static gboolean src_activate_mode(GstPad *pad, GstObject *parent, GstPadMode mode, gboolean active) {
  auto *self = GST_DDP_SAMPLER(parent);
  if (mode != GST_PAD_MODE_PUSH) return FALSE;
  if (!active) {
    if (self->engine) self->engine->set_flushing(true);
    return gst_pad_stop_task(pad);
  }
  return TRUE;
}

static GstStateChangeReturn change_state(GstElement *element, GstStateChange transition) {
  auto *self = GST_DDP_SAMPLER(element);
  if (transition == GST_STATE_CHANGE_READY_TO_PAUSED) {
    GST_OBJECT_LOCK(self);
    const SamplerConfig cfg = *self->config;
    GST_OBJECT_UNLOCK(self);
    if (follower_trainer(element, *self->follower).empty()) {
      GST_ELEMENT_ERROR(self, RESOURCE, SETTINGS, ("No trainer: set the trainer property to the name of a ddptrainsink"),
                        (nullptr));
      return GST_STATE_CHANGE_FAILURE;
    }
    self->engine = new SamplerEngine(cfg);
    self->src_started = FALSE;
    // The trainer starts in the same state change, maybe after us: ask again if it has not yet.
    std::string why;
    if (follower_run(element, *self->follower, &why) && !ensure_attached(self)) return GST_STATE_CHANGE_FAILURE;
    if (!self->engine->attached()) {
      why = follower_start_problem(element, *self->follower);
      if (!why.empty()) {
        GST_ELEMENT_ERROR(self, RESOURCE, NOT_FOUND, ("%s", why.c_str()), (nullptr));
        return GST_STATE_CHANGE_FAILURE;
      }
    }
  }
  if (transition == GST_STATE_CHANGE_PAUSED_TO_PLAYING && self->engine && !ensure_attached(self))
    return GST_STATE_CHANGE_FAILURE;
  auto ret = GST_ELEMENT_CLASS(gst_ddp_sampler_parent_class)->change_state(element, transition);
  // Like a live source: samples come when the trainer gets there, not at preroll, so the sinks
  // after us must not hold the pipeline out of PLAYING (where the trainer trains) waiting for one.
  if ((transition == GST_STATE_CHANGE_READY_TO_PAUSED || transition == GST_STATE_CHANGE_PLAYING_TO_PAUSED) &&
      ret == GST_STATE_CHANGE_SUCCESS)
    ret = GST_STATE_CHANGE_NO_PREROLL;
  if (transition == GST_STATE_CHANGE_PAUSED_TO_READY) {
    delete self->engine;  // after the pads' deactivation stopped the task
    self->engine = nullptr;
    GST_OBJECT_LOCK(self);
    self->follower->run.reset();
    GST_OBJECT_UNLOCK(self);
  }
  return ret;
}

static void set_context(GstElement *element, GstContext *context) {
  follower_set_context(element, *GST_DDP_SAMPLER(element)->follower, context);
  GST_ELEMENT_CLASS(gst_ddp_sampler_parent_class)->set_context(element, context);
}

static void set_property(GObject *object, guint id, const GValue *value, GParamSpec *pspec) {
  auto *self = GST_DDP_SAMPLER(object);
  GST_OBJECT_LOCK(self);
  SamplerConfig &c = *self->config;
  if (follower_set_property(*self->follower, c, PROP_FOLLOWER, id, value)) id = PROP_0;  // done
  switch (id) {
    case PROP_0: break;
    case PROP_AT_END: c.at_end = g_value_get_boolean(value); break;
    case PROP_ATTENTION_BACKEND: c.attention_backend = static_cast<AttentionBackend>(g_value_get_enum(value)); break;
    case PROP_SAMPLER: c.sampler = g_value_get_string(value) ? g_value_get_string(value) : "auto"; break;
    case PROP_STEPS: c.steps = g_value_get_int(value); break;
    case PROP_GUIDANCE: c.guidance = g_value_get_double(value); break;
    case PROP_GUIDANCE_2: c.guidance_2 = g_value_get_double(value); break;
    case PROP_FLOW_SHIFT: c.flow_shift = g_value_get_double(value); break;
    case PROP_SNR_SHIFT_SCALE: c.snr_shift_scale = g_value_get_double(value); break;
    case PROP_NUM_FRAMES: c.num_frames = g_value_get_int(value); break;
    case PROP_WIDTH: c.width = g_value_get_int(value); break;
    case PROP_HEIGHT: c.height = g_value_get_int(value); break;
    case PROP_SEED: c.seed = g_value_get_int64(value); break;
    case PROP_MAX_TOKENS: c.max_tokens = g_value_get_int64(value); break;
    case PROP_TEMPORAL_COMPRESSION: c.temporal_compression = g_value_get_uint(value); break;
    case PROP_SPATIAL_COMPRESSION: c.spatial_compression = g_value_get_uint(value); break;
    case PROP_DEVICE: c.device = g_value_get_string(value) ? g_value_get_string(value) : ""; break;
    case PROP_VAE: c.vae = g_value_get_string(value) ? g_value_get_string(value) : ""; break;
    case PROP_IMAGE_ENCODER: c.image_encoder = g_value_get_string(value) ? g_value_get_string(value) : ""; break;
    case PROP_IMAGE_PROCESSOR: c.image_processor = g_value_get_string(value) ? g_value_get_string(value) : ""; break;
    default: G_OBJECT_WARN_INVALID_PROPERTY_ID(object, id, pspec);
  }
  GST_OBJECT_UNLOCK(self);
}

static void get_property(GObject *object, guint id, GValue *value, GParamSpec *pspec) {
  auto *self = GST_DDP_SAMPLER(object);
  GST_OBJECT_LOCK(self);
  const SamplerConfig &c = *self->config;
  if (follower_get_property(*self->follower, c, PROP_FOLLOWER, id, value)) id = PROP_0;  // done
  switch (id) {
    case PROP_0: break;
    case PROP_AT_END: g_value_set_boolean(value, c.at_end); break;
    case PROP_ATTENTION_BACKEND: g_value_set_enum(value, static_cast<gint>(c.attention_backend)); break;
    case PROP_SAMPLER: g_value_set_string(value, c.sampler.c_str()); break;
    case PROP_STEPS: g_value_set_int(value, c.steps); break;
    case PROP_GUIDANCE: g_value_set_double(value, c.guidance); break;
    case PROP_GUIDANCE_2: g_value_set_double(value, c.guidance_2); break;
    case PROP_FLOW_SHIFT: g_value_set_double(value, c.flow_shift); break;
    case PROP_SNR_SHIFT_SCALE: g_value_set_double(value, c.snr_shift_scale); break;
    case PROP_NUM_FRAMES: g_value_set_int(value, int(c.num_frames)); break;
    case PROP_WIDTH: g_value_set_int(value, int(c.width)); break;
    case PROP_HEIGHT: g_value_set_int(value, int(c.height)); break;
    case PROP_SEED: g_value_set_int64(value, c.seed); break;
    case PROP_MAX_TOKENS: g_value_set_int64(value, c.max_tokens); break;
    case PROP_TEMPORAL_COMPRESSION: g_value_set_uint(value, c.temporal_compression); break;
    case PROP_SPATIAL_COMPRESSION: g_value_set_uint(value, c.spatial_compression); break;
    case PROP_DEVICE: g_value_set_string(value, c.device.c_str()); break;
    case PROP_VAE: g_value_set_string(value, c.vae.c_str()); break;
    case PROP_IMAGE_ENCODER: g_value_set_string(value, c.image_encoder.c_str()); break;
    case PROP_IMAGE_PROCESSOR: g_value_set_string(value, c.image_processor.c_str()); break;
    case PROP_SAMPLES_DONE: g_value_set_uint64(value, self->samples_done); break;
    default: G_OBJECT_WARN_INVALID_PROPERTY_ID(object, id, pspec);
  }
  GST_OBJECT_UNLOCK(self);
}

static void finalize(GObject *object) {
  auto *self = GST_DDP_SAMPLER(object);
  delete self->engine;
  delete self->config;
  delete self->follower;
  G_OBJECT_CLASS(gst_ddp_sampler_parent_class)->finalize(object);
}

static void gst_ddp_sampler_init(GstDdpSampler *self) {
  self->sinkpad = gst_pad_new_from_static_template(&sink_template, "sink");
  gst_pad_set_chain_function(self->sinkpad, sink_chain);
  gst_pad_set_event_function(self->sinkpad, sink_event);
  gst_element_add_pad(GST_ELEMENT(self), self->sinkpad);
  self->srcpad = gst_pad_new_from_static_template(&src_template, "src");
  gst_pad_set_activatemode_function(self->srcpad, src_activate_mode);
  gst_pad_use_fixed_caps(self->srcpad);
  gst_element_add_pad(GST_ELEMENT(self), self->srcpad);
  self->config = new SamplerConfig();
  self->follower = new TrainerFollower();
  self->engine = nullptr;
  self->src_started = FALSE;
  self->samples_done = 0;
}

static void gst_ddp_sampler_class_init(GstDdpSamplerClass *klass) {
  auto *gobject_class = G_OBJECT_CLASS(klass);
  auto *element_class = GST_ELEMENT_CLASS(klass);
  videotrain_one_error_install(element_class);  // one error per failure (one_error.h)
  gobject_class->set_property = set_property;
  gobject_class->get_property = get_property;
  gobject_class->finalize = finalize;
  element_class->change_state = change_state;
  element_class->set_context = set_context;
  const SamplerConfig d;
  const auto rw = GParamFlags(G_PARAM_READWRITE | G_PARAM_STATIC_STRINGS | GST_PARAM_MUTABLE_READY);
  follower_install_properties(
      gobject_class, PROP_FOLLOWER,
      {"Name of the ddptrainsink whose weights are sampled", "Sample every N optimizer steps (0: only at-start / at-end)",
       "Also sample the weights before the first step",
       "When a sampling is due while the previous snapshot is still waiting for the sampler, skip it (a "
       "ddpsampler-skipped message) instead of holding the trainer at that step",
       "Which weights sample: the trainer's, or the EMA it keeps (ddptrainsink ema-decay; an error without one)"},
      weights_type());
  g_object_class_install_property(gobject_class, PROP_AT_END,
      g_param_spec_boolean("at-end", "At end", "Also sample the final weights when the trainer has finished",
                           d.at_end, rw));
  g_object_class_install_property(gobject_class, PROP_ATTENTION_BACKEND,
      g_param_spec_enum("attention-backend", "Attention backend",
                            VIDEOTRAIN_ATTENTION_BACKEND_FOLLOWER_BLURB,
                            attention_backend_type(), 0, rw));
  // The families' defaults in these blurbs come from models/model_family.h's table (static: the specs
  // keep the pointers).
  using models::ModelFamily;
  using models::per_family;
  auto say = [](int64_t v) { return std::to_string(v); };
  static const std::string sampler_blurb =
      "auto (" + per_family([](const ModelFamily &f) { return std::string(f.title) + ": " + f.default_sampler; }) +
      "), " + per_family([](const ModelFamily &f) {
        return std::string(f.samplers) + " (" + models::objective_name(f.objective) + ", " + f.title + ")";
      }) + ": diffusers' schedulers, stepped as the pipelines step them";
  static const std::string frames_blurb =
      "Frames per sample when the prompt file gives none (0: " +
      per_family([&](const ModelFamily &f) { return std::string(f.title) + " " + say(f.frames); }) +
      "); rounded to 4k+1 as the pipelines do";
  static const std::string width_blurb =
      "Width when the prompt file gives none (0: " +
      per_family([&](const ModelFamily &f) { return std::string(f.title) + " " + say(f.width); }) + ")";
  static const std::string height_blurb =
      "Height when the prompt file gives none (0: " +
      per_family([&](const ModelFamily &f) { return std::string(f.title) + " " + say(f.height); }) + ")";
  static const std::string tokens_blurb =
      "A prompt whose size gives more video tokens (latent frames x latent pixels / 4) is not sampled, with a "
      "warning, before anything is allocated; 0: 4x the model's default size (" +
      per_family([&](const ModelFamily &f) {
        return std::string(f.title) + " " + say(f.frames) + "x" + say(f.width) + "x" + say(f.height) + ": " +
               say(4 * ((f.frames - 1) / 4 + 1) * (f.height / 16) * (f.width / 16));
      }) + "; at 4 frames and 8x8 pixels a latent)";
  g_object_class_install_property(gobject_class, PROP_SAMPLER,
      g_param_spec_string("sampler", "Sampler", sampler_blurb.c_str(), d.sampler.c_str(), rw));
  g_object_class_install_property(gobject_class, PROP_STEPS,
      g_param_spec_int("steps", "Steps", "Inference steps per sample", 1, 1000, d.steps, rw));
  g_object_class_install_property(gobject_class, PROP_GUIDANCE,
      g_param_spec_double("guidance", "Guidance", "Classifier-free guidance scale (<= 1: no negative pass)", 0.0,
                          100.0, d.guidance, rw));
  g_object_class_install_property(gobject_class, PROP_GUIDANCE_2,
      g_param_spec_double("guidance-2", "Guidance (low-noise expert)",
                          "Wan 2.2 A14B (the trainer's model-2): the guidance scale of the steps below the boundary, "
                          "run by the low-noise expert (WanPipeline's guidance_scale_2); -1: = guidance",
                          -1.0, 100.0, d.guidance_2, rw));
  g_object_class_install_property(gobject_class, PROP_FLOW_SHIFT,
      g_param_spec_double("flow-shift", "Flow shift", "Wan's sigma shift (3.0 at 480p, 5.0 at 720p)", 0.01, 100.0,
                          d.flow_shift, rw));
  g_object_class_install_property(gobject_class, PROP_SNR_SHIFT_SCALE,
      g_param_spec_double("snr-shift-scale", "SNR shift scale",
                          "CogVideoX's scheduler snr_shift_scale (2b: 3.0, 5b: 1.0); 0: 3.0", 0.0, 100.0,
                          d.snr_shift_scale, rw));
  g_object_class_install_property(gobject_class, PROP_NUM_FRAMES,
      g_param_spec_int("num-frames", "Frames", frames_blurb.c_str(), 0, 100000, 0, rw));
  g_object_class_install_property(gobject_class, PROP_WIDTH,
      g_param_spec_int("width", "Width", width_blurb.c_str(), 0, 16384, 0, rw));
  g_object_class_install_property(gobject_class, PROP_HEIGHT,
      g_param_spec_int("height", "Height", height_blurb.c_str(), 0, 16384, 0, rw));
  g_object_class_install_property(gobject_class, PROP_SEED,
      g_param_spec_int64("seed", "Seed",
                         "Seed of prompts whose file gives none: the initial noise is torch.randn from a CPU "
                         "generator seeded with it, as diffusers' pipelines draw it",
                         0, G_MAXINT64, d.seed, rw));
  g_object_class_install_property(gobject_class, PROP_MAX_TOKENS,
      g_param_spec_int64("max-tokens", "Max tokens", tokens_blurb.c_str(), 0, G_MAXINT64, d.max_tokens, rw));
  g_object_class_install_property(gobject_class, PROP_TEMPORAL_COMPRESSION,
      g_param_spec_uint("temporal-compression", "Temporal compression", "The VAE's frames per latent frame", 1, 16,
                        d.temporal_compression, rw));
  g_object_class_install_property(gobject_class, PROP_SPATIAL_COMPRESSION,
      g_param_spec_uint("spatial-compression", "Spatial compression",
                        "The VAE's pixels per latent (0: 16 for Wan 2.2's 48 latent channels, else 8)", 0, 64,
                        d.spatial_compression, rw));
  g_object_class_install_property(gobject_class, PROP_DEVICE,
      g_param_spec_string("device", "Device", "Where the sampler's copy of the model runs (\"\": the trainer's)", "",
                          rw));
  g_object_class_install_property(gobject_class, PROP_VAE,
      g_param_spec_string("vae", "VAE",
                          "Image-to-video trainers (Wan 2.1 / 2.2 I2V, FLF2V, CogVideoX I2V; Wan 2.2 TI2V for prompts "
                          "with an image): the diffusers VAE folder that encodes each prompt's image (promptsrc's image "
                          "column) into the condition latents, as WanImageToVideoPipeline and "
                          "CogVideoXImageToVideoPipeline do (the VAE the model was trained with)",
                          "", rw));
  g_object_class_install_property(gobject_class, PROP_IMAGE_ENCODER,
      g_param_spec_string("image-encoder", "Image encoder",
                          "Image-to-video trainers with image embeddings (Wan 2.1 I2V / FLF2V, image_dim): the CLIP "
                          "image_encoder/ folder whose hidden_states[-2] the model takes",
                          "", rw));
  g_object_class_install_property(gobject_class, PROP_IMAGE_PROCESSOR,
      g_param_spec_string("image-processor", "Image processor",
                          "The image encoder's preprocessor folder (\"\": the image_processor/ beside image-encoder)",
                          "", rw));
  g_object_class_install_property(gobject_class, PROP_SAMPLES_DONE,
      g_param_spec_uint64("samples-done", "Samples done", "Samples this rank has generated", 0, G_MAXUINT64, 0,
                          GParamFlags(G_PARAM_READABLE | G_PARAM_STATIC_STRINGS)));
  gst_element_class_add_static_pad_template(element_class, &sink_template);
  gst_element_class_add_static_pad_template(element_class, &src_template);
  gst_element_class_set_static_metadata(
      element_class, "DDP sampler", "Filter/Tensor",
      "Every `every` steps of its trainer, generates latents for this rank's share of the prompts (prompt i on rank "
      "i mod world size) from the trainer's current weights, with the family's sampler and classifier-free "
      "guidance" VIDEOTRAIN_DOC_DDPSAMPLER_MESSAGES,
      "gst-videotrain");
}
