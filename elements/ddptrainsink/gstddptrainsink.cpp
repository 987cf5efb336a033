/* ddptrainsink: the GObject face of TrainerEngine (no torch here).
 *
 * Micro-batches in (application/x-videotrain-tensor, content=micro-batch); render()
 * runs forward/backward of each one, and on the last micro-batch of a step the
 * gradient all-reduce and the optimizer step. Progress goes to the bus as
 * ddptrainsink-step / ddptrainsink-checkpoint element messages. With resume=true the
 * checkpoint is loaded in READY->PAUSED, and the videotrain-resume query (sent
 * upstream by csvvideosrc) is answered from it. The started engine is the run's
 * RunContext: published to the pipeline as the GstContext "videotrain-run/<name>"
 * (run_context_gst.h), where ddpvalsink finds it. */
#include "one_error.h"
#include "gstddptrainsink.h"
#include "bus_messages_doc.h"

#include <chrono>
#include <limits>
#include <memory>
#include <mutex>
#include <string>

#include "bus_message_gst.h"
#include "cpu_heap.h"
#include "gst_enum.h"
#include "models/attention_backend.h"
#include "resume_query.h"
#include "row_facts_query.h"
#include "run_context_gst.h"
#include "tensor_caps.h"
#include "trainer_buffers.h"
#include "trainer_engine.h"

GST_DEBUG_CATEGORY_STATIC(ddptrainsink_debug);
#define GST_CAT_DEFAULT ddptrainsink_debug

using namespace videotrain;

struct _GstDdpTrainSink {
  GstBaseSink parent;
  TrainerConfig *config;  // properties (object lock)
  std::shared_ptr<TrainerEngine> *engine;  // object lock to swap; streaming thread uses it
  guint64 steps;          // read-only mirrors (object lock)
  gdouble loss;
  bool done;              // max-steps reached
  std::chrono::steady_clock::time_point *last_return;  // when render() last returned
};

G_DEFINE_TYPE(GstDdpTrainSink, gst_ddp_train_sink, GST_TYPE_BASE_SINK);
GST_ELEMENT_REGISTER_DEFINE_WITH_CODE(ddptrainsink, "ddptrainsink", GST_RANK_NONE, GST_TYPE_DDP_TRAIN_SINK,
                                      GST_DEBUG_CATEGORY_INIT(ddptrainsink_debug, "ddptrainsink", 0,
                                                              "Distributed data-parallel trainer sink"));

enum {
  PROP_0,
  PROP_MODEL,
  PROP_LATENT_CHANNELS,
  PROP_LR,
  PROP_WEIGHT_DECAY,
  PROP_BETA1,
  PROP_BETA2,
  PROP_EPS,
  PROP_OPTIMIZER,
  PROP_BETA3,
  PROP_EPS2,
  PROP_MOMENTUM,
  PROP_NESTEROV,
  PROP_CLIP_THRESHOLD,
  PROP_BETA2_DECAY,
  PROP_D0,
  PROP_D_COEF,
  PROP_SAFEGUARD_WARMUP,
  PROP_USE_BIAS_CORRECTION,
  PROP_LR_SCHEDULE,
  PROP_WARMUP_STEPS,
  PROP_MAX_STEPS,
  PROP_GRAD_CLIP,
  PROP_DEVICE,
  PROP_PRECISION,
  PROP_TUNE_MALLOC,
  PROP_SEED,
  PROP_RANK,
  PROP_WORLD_SIZE,
  PROP_MASTER_ADDR,
  PROP_MASTER_PORT,
  PROP_BACKEND,
  PROP_TIMEOUT,
  PROP_BUCKET_CAP_MB,
  PROP_SHARDING,
  PROP_GATHER_DTYPE,
  PROP_GATHER_PREFETCH,
  PROP_CHECKPOINT_DIR,
  PROP_CHECKPOINT_EVERY,
  PROP_CHECKPOINT_INTERVAL,
  PROP_KEEP_CHECKPOINTS,
  PROP_RESUME,
  PROP_NAN_POLICY,
  PROP_MAX_SKIPPED_STEPS,
  PROP_LOG_EVERY,
  PROP_METRICS_FILE,
  PROP_TENSORBOARD_DIR,
  PROP_GRADIENT_CHECKPOINTING,
  PROP_ATTENTION_BACKEND,
  PROP_TIMESTEP_SAMPLING,
  PROP_LOGIT_MEAN,
  PROP_LOGIT_STD,
  PROP_MODE_SCALE,
  PROP_FLOW_SHIFT,
  PROP_LOSS_WEIGHTING,
  PROP_SNR_SHIFT_SCALE,
  PROP_TIMESTEP_RANGE,
  PROP_MODEL_2,
  PROP_BOUNDARY_RATIO,
  PROP_VAL_SIGMAS,
  PROP_SAVE_DTYPE,
  PROP_EXPORT_DIR,
  PROP_LORA_RANK,
  PROP_LORA_ALPHA,
  PROP_LORA_TARGETS,
  PROP_LORA_DROPOUT,
  PROP_LORA_INIT,
  PROP_LORA_FORMAT,
  PROP_BASE_DTYPE,
  PROP_TRAINABLE,
  PROP_EMA_DECAY,
  PROP_EMA_START_STEP,
  PROP_EMA_EVERY,
  PROP_EXPORT_EMA,
  PROP_STEPS,
  PROP_LOSS,
};

/* ---- enum property types (string values in the engine config) ---- */

VIDEOTRAIN_DEFINE_ENUM(lr_schedule_type, "GstDdpTrainSinkLrSchedule", {0, "Constant after warmup", "constant"},
                       {1, "Cosine decay to 0 at max-steps", "cosine"}, {2, "Linear decay to 0 at max-steps", "linear"})
VIDEOTRAIN_DEFINE_ENUM(optimizer_type, "GstDdpTrainSinkOptimizer",
                       {0, "AdamW (LibTorch's; 8 bytes of state per parameter)", "adamw"},
                       {1, "AdamW with 8-bit blockwise moments (bitsandbytes' scheme; ~2 bytes per parameter)",
                        "adamw8bit"},
                       {2, "Adafactor (torch.optim's; factored second moment, no first)", "adafactor"},
                       {3, "Prodigy (learns the step size: set lr=1)", "prodigy"},
                       {4, "CAME (confidence-guided Adafactor with a first moment)", "came"},
                       {5, "SGD with optional (Nesterov) momentum", "sgd"})
VIDEOTRAIN_DEFINE_ENUM(precision_type, "GstDdpTrainSinkPrecision", {0, "bf16 autocast on CUDA, fp32 on CPU", "auto"},
                       {1, "float32", "fp32"}, {2, "bfloat16 autocast (CUDA or CPU)", "bf16"})
VIDEOTRAIN_DEFINE_ENUM(backend_type, "GstDdpTrainSinkBackend",
                       {0, "NCCL for CUDA tensors when available, else Gloo", "auto"}, {1, "NCCL", "nccl"},
                       {2, "Gloo", "gloo"})
VIDEOTRAIN_DEFINE_ENUM(timestep_sampling_type, "GstDdpTrainSinkTimestepSampling",
                       {0, "u = sigmoid(N(logit-mean, logit-std)), shifted by flow-shift", "logit-normal"},
                       {1, "u uniform in [0, 1), shifted by flow-shift", "uniform"},
                       {2, "u = 1 - r - mode-scale (cos^2(pi r / 2) - 1 + r), r uniform, shifted by flow-shift", "mode"},
                       {3, "u as logit-normal, shifted by the sample's resolution (flow-shift unused)", "shifted"},
                       {4, "Wan: logit-normal; CogVideoX: uniform integer timesteps", "auto"})
VIDEOTRAIN_DEFINE_ENUM(loss_weighting_type, "GstDdpTrainSinkLossWeighting", {0, "Every sample weighs 1", "none"},
                       {1, "sigma^-2 (sigma at least 1/1000)", "sigma-sqrt"},
                       {2, "2 / (pi (1 - 2 sigma + 2 sigma^2))", "cosmap"})
VIDEOTRAIN_DEFINE_ENUM(save_dtype_type, "GstDdpTrainSinkSaveDtype", {0, "bfloat16", "bf16"}, {1, "float16", "fp16"},
                       {2, "float32", "fp32"})
VIDEOTRAIN_DEFINE_ENUM(lora_format_type, "GstDdpTrainSinkLoraFormat",
                       {0, "diffusers/PEFT keys (pytorch_lora_weights.safetensors)", "diffusers"},
                       {1, "original Wan naming ComfyUI loads (lora_comfyui.safetensors)", "comfyui"},
                       {2, "kohya/musubi naming (lora_kohya.safetensors)", "kohya"}, {3, "all three", "all"})
VIDEOTRAIN_DEFINE_ENUM(base_dtype_type, "GstDdpTrainSinkBaseDtype",
                       {0, "the base's weights as loaded (bf16 under autocast)", "bf16"},
                       {1, "float8 e4m3 with a scale per output row, cast per use (LibTorch >= 2.1)", "fp8"})
// Values 0 and 1 are false and true, so that gradient-checkpointing=true/false (and a boolean set from C) keep working.
VIDEOTRAIN_DEFINE_ENUM(checkpointing_type, "GstDdpTrainSinkGradientCheckpointing",
                       {0, "Keep every activation", "false"},
                       {1, "Recompute each transformer block in backward (keeps its input)", "true"},
                       {2, "Keep each block's attention (q, k, v, output), recompute the rest", "selective"})
VIDEOTRAIN_DEFINE_ENUM(attention_backend_type, "GstDdpTrainSinkAttentionBackend", VIDEOTRAIN_ATTENTION_BACKEND_ENUM_VALUES)
VIDEOTRAIN_DEFINE_ENUM(sharding_type, "GstDdpTrainSinkSharding",
                       {0, "DDP: every rank holds the whole weights, gradients and optimizer state", "none"},
                       {1, "ZeRO-2: optimizer state and gradients sharded over the ranks", "optimizer"},
                       {2, "FSDP / ZeRO-3: weights sharded too, gathered one block at a time", "full"})
VIDEOTRAIN_DEFINE_ENUM(gather_dtype_type, "GstDdpTrainSinkGatherDtype",
                       {0, "The blocks' compute dtype: bf16 under bf16 autocast, else float32", "auto"},
                       {1, "float32 (exact)", "fp32"}, {2, "bfloat16 (half the traffic)", "bf16"})
VIDEOTRAIN_DEFINE_ENUM(gather_prefetch_type, "GstDdpTrainSinkGatherPrefetch",
                       {0, "true on CUDA (the gather overlaps compute on NCCL's stream), false on CPU", "auto"},
                       {1, "Issue the next block's gather while a block computes (two blocks in memory)", "true"},
                       {2, "Gather each block when it is used (one block in memory)", "false"})
VIDEOTRAIN_DEFINE_ENUM(nan_policy_type, "GstDdpTrainSinkNanPolicy",
                       {0, "Warn and skip the optimizer step on every rank", "skip"}, {1, "Stop with an error", "fail"})

static GstStaticPadTemplate *sink_template() {
  static GstStaticPadTemplate t = GST_STATIC_PAD_TEMPLATE(
      "sink", GST_PAD_SINK, GST_PAD_ALWAYS,
      GST_STATIC_CAPS(VIDEOTRAIN_TENSOR_MEDIA_TYPE ", content=(string)micro-batch, "
                                                   "dtype=(string){ float32, bfloat16, float16 }"));
  return &t;
}

static std::shared_ptr<TrainerEngine> get_engine(GstDdpTrainSink *self) {
  GST_OBJECT_LOCK(self);
  auto e = *self->engine;
  GST_OBJECT_UNLOCK(self);
  return e;
}

// Posts what the engine queued: element messages, warnings.
static void post_messages(GstDdpTrainSink *self, TrainerEngine &engine) {
  for (auto &m : engine.take_messages()) post_bus_message(GST_ELEMENT(self), m);
  GST_OBJECT_LOCK(self);
  self->steps = engine.steps_done();
  self->loss = engine.last_loss();
  GST_OBJECT_UNLOCK(self);
}

static gboolean gst_ddp_train_sink_start(GstBaseSink *sink) {
  auto *self = GST_DDP_TRAIN_SINK(sink);
  GST_OBJECT_LOCK(self);
  TrainerConfig cfg = *self->config;
  GST_OBJECT_UNLOCK(self);
  auto engine = std::make_shared<TrainerEngine>(cfg);
  // The rendezvous may wait minutes for the other ranks: what it says goes out as it waits.
  engine->set_message_hook([self, e = engine.get()] { post_messages(self, *e); });
  bool ok = engine->start();
  post_messages(self, *engine);
  if (!ok) {
    GST_ELEMENT_ERROR(self, RESOURCE, SETTINGS, ("Cannot start training: %s", engine->error().c_str()),
                      ("model=%s checkpoint-dir=%s", cfg.model.c_str(), cfg.checkpoint_dir.c_str()));
    return FALSE;
  }
  GST_INFO_OBJECT(self, "rank %d of %d on %s%s", engine->rank(), engine->world_size(), engine->device_name().c_str(),
                  engine->resumed() ? " (resumed)" : "");
  GST_OBJECT_LOCK(self);
  *self->engine = engine;
  self->done = false;
  *self->last_return = std::chrono::steady_clock::now();
  GST_OBJECT_UNLOCK(self);
  // The bins keep it and hand it to a ddpvalsink that asks for this trainer's run.
  run_context_publish(GST_ELEMENT(self), engine);
  return TRUE;
}

static gboolean gst_ddp_train_sink_stop(GstBaseSink *sink) {
  auto *self = GST_DDP_TRAIN_SINK(sink);
  GST_OBJECT_LOCK(self);
  auto engine = std::move(*self->engine);
  self->engine->reset();
  GST_OBJECT_UNLOCK(self);
  // The bins replace the run with an empty context: validators that start later see no
  // stopped engine.
  if (engine) run_context_publish(GST_ELEMENT(self), nullptr);
  if (engine) {
    engine->stop();
    post_messages(self, *engine);  // what a stop without end of stream did not save
  }
  return TRUE;
}

/* unlock: a render (or the EOS event) waiting in a collective for a stalled peer returns at
 * once when the pipeline stops or flushes, instead of after `timeout`. The run cannot go on
 * after that (see TrainerEngine::interrupt); unlock_stop lets later collectives wait again,
 * so that a flush that came between two collectives costs nothing. */
static gboolean gst_ddp_train_sink_unlock(GstBaseSink *sink) {
  if (auto engine = get_engine(GST_DDP_TRAIN_SINK(sink))) engine->interrupt(true);
  return TRUE;
}

static gboolean gst_ddp_train_sink_unlock_stop(GstBaseSink *sink) {
  if (auto engine = get_engine(GST_DDP_TRAIN_SINK(sink))) engine->interrupt(false);
  return TRUE;
}

static gboolean gst_ddp_train_sink_set_caps(GstBaseSink *sink, GstCaps *caps) {
  TensorCapsInfo info;
  std::string why;
  if (!tensor_caps_parse(caps, &info, &why) || info.content != "micro-batch") {
    if (why.empty()) why = "content is '" + info.content + "', expected micro-batch (put a microbatcher before)";
    GST_ELEMENT_ERROR(sink, STREAM, WRONG_TYPE, ("Cannot train on %s", why.c_str()), ("caps %" GST_PTR_FORMAT, caps));
    return FALSE;
  }
  // A model that takes the other conditioning (captions vs a textencoder's embeddings) is an
  // error here, before the first micro-batch.
  auto engine = get_engine(GST_DDP_TRAIN_SINK(sink));
  if (engine && !engine->set_stream_text(info.tensors.find("text_embeds") != std::string::npos)) {
    GST_ELEMENT_ERROR(sink, LIBRARY, SETTINGS, ("%s", engine->error().c_str()), ("caps %" GST_PTR_FORMAT, caps));
    return FALSE;
  }
  return TRUE;
}

static GstFlowReturn gst_ddp_train_sink_render(GstBaseSink *sink, GstBuffer *buf) {
  auto *self = GST_DDP_TRAIN_SINK(sink);
  auto engine = get_engine(self);
  if (!engine) return GST_FLOW_FLUSHING;
  if (self->done) return GST_FLOW_EOS;
  const auto arrived = std::chrono::steady_clock::now();
  engine->add_wait_time(std::chrono::duration<double>(arrived - *self->last_return).count());
  std::string error;
  ProcessResult r = train_on_buffer(*engine, buf, &error);
  post_messages(self, *engine);
  *self->last_return = std::chrono::steady_clock::now();
  switch (r) {
    case ProcessResult::kOk:
      return GST_FLOW_OK;
    case ProcessResult::kInterrupted:
      GST_INFO_OBJECT(self, "interrupted in step %" G_GUINT64_FORMAT " (stopping or flushing)",
                      engine->steps_done() + 1);
      return GST_FLOW_FLUSHING;
    case ProcessResult::kDone:
      GST_INFO_OBJECT(self, "training done at step %" G_GUINT64_FORMAT " (max-steps, or a peer stopped)", engine->steps_done());
      self->done = true;
      return GST_FLOW_EOS;
    case ProcessResult::kError:
    default:
      GST_ELEMENT_ERROR(self, STREAM, FAILED, ("Training failed: %s", error.c_str()),
                        ("rank %d of %d, after %" G_GUINT64_FORMAT " optimizer steps", engine->rank(),
                         engine->world_size(), engine->steps_done()));
      // The reason is posted: FLUSHING stops the elements upstream without each posting its own
      // "Internal data stream error" for the same failure (one error per failure).
      return GST_FLOW_FLUSHING;
  }
}

static gboolean gst_ddp_train_sink_event(GstBaseSink *sink, GstEvent *event) {
  auto *self = GST_DDP_TRAIN_SINK(sink);
  if (GST_EVENT_TYPE(event) == GST_EVENT_EOS) {
    if (auto engine = get_engine(self)) {
      bool ok = engine->finish();
      post_messages(self, *engine);
      if (!ok && engine->interrupted())
        GST_INFO_OBJECT(self, "end of stream interrupted: %s", engine->error().c_str());
      else if (!ok)
        GST_ELEMENT_ERROR(self, STREAM, FAILED,
                          ("Cannot finish training at end of stream: %s", engine->error().c_str()),
                          ("rank %d of %d, after %" G_GUINT64_FORMAT " optimizer steps (the other ranks' ends are "
                           "awaited, and the final checkpoint written, here)",
                           engine->rank(), engine->world_size(), engine->steps_done()));
    }
  }
  return GST_BASE_SINK_CLASS(gst_ddp_train_sink_parent_class)->event(sink, event);
}

// A GST_QUERY_CONTEXT for this trainer's run, while it is started.
static gboolean answer_context_query(GstElement *element, GstQuery *query) {
  if (GST_QUERY_TYPE(query) != GST_QUERY_CONTEXT) return FALSE;
  auto engine = get_engine(GST_DDP_TRAIN_SINK(element));
  gchar *name = gst_object_get_name(GST_OBJECT(element));
  const bool ok = run_context_answer_query(query, name ? name : "", engine);
  g_free(name);
  return ok;
}

static gboolean gst_ddp_train_sink_query(GstBaseSink *sink, GstQuery *query) {
  auto *self = GST_DDP_TRAIN_SINK(sink);
  if (videotrain_is_resume_query(query)) {
    auto engine = get_engine(self);
    if (!engine || !engine->resumed()) return FALSE;  // nothing to resume: the source starts at the beginning
    ResumePoint rp = engine->resume_point();
    VideoTrainResumePosition pos{rp.epoch, rp.clip, rp.step};
    videotrain_resume_query_answer(query, &pos);
    videotrain_resume_query_set_row_facts(query, rp.row_facts.c_str());
    if (rp.world_then > 0) videotrain_resume_query_set_world_then(query, rp.world_then, rp.clips_then.c_str());
    GST_INFO_OBJECT(self, "resume: epoch %u clip %" G_GUINT64_FORMAT " step %" G_GUINT64_FORMAT, pos.epoch, pos.clip,
                    pos.step);
    return TRUE;
  }
  if (is_row_facts_query(query)) {
    // csvvideosrc's worker, before it plans an epoch: relayed between the ranks (may wait for them).
    auto engine = get_engine(self);
    uint32_t epoch = 0;
    std::string mine, all;
    if (!engine || !row_facts_query_request(query, &epoch, &mine)) return FALSE;
    if (epoch == kRowFactsProbe) {
      row_facts_query_answer(query, true, "");
      return TRUE;
    }
    if (epoch == kRowFactsLearned) {
      engine->note_row_facts(mine);
      row_facts_query_answer(query, true, "");
      return TRUE;
    }
    const bool ok = engine->agree_row_facts(epoch, mine, &all);
    if (ok) GST_DEBUG_OBJECT(self, "row facts of epoch %u agreed", epoch);
    else if (!all.empty()) GST_WARNING_OBJECT(self, "row facts of epoch %u: %s", epoch, all.c_str());
    row_facts_query_answer(query, ok, all);
    return TRUE;
  }
  if (answer_context_query(GST_ELEMENT(self), query)) return TRUE;
  return GST_BASE_SINK_CLASS(gst_ddp_train_sink_parent_class)->query(sink, query);
}

// Element queries (an app's gst_element_query) for the run's context.
static gboolean gst_ddp_train_sink_element_query(GstElement *element, GstQuery *query) {
  if (answer_context_query(element, query)) return TRUE;
  return GST_ELEMENT_CLASS(gst_ddp_train_sink_parent_class)->query(element, query);
}

/* ---- properties ---- */

static void gst_ddp_train_sink_set_property(GObject *object, guint id, const GValue *v, GParamSpec *pspec) {
  auto *self = GST_DDP_TRAIN_SINK(object);
  GST_OBJECT_LOCK(self);
  TrainerConfig &c = *self->config;
  auto str = [v]() { const char *s = g_value_get_string(v); return std::string(s ? s : ""); };
  switch (id) {
    case PROP_MODEL: c.model = str(); break;
    case PROP_LATENT_CHANNELS: c.latent_channels = static_cast<int>(g_value_get_uint(v)); break;
    case PROP_LR: c.lr = g_value_get_double(v); break;
    case PROP_WEIGHT_DECAY: c.weight_decay = g_value_get_double(v); break;
    case PROP_BETA1: c.beta1 = g_value_get_double(v); break;
    case PROP_BETA2: c.beta2 = g_value_get_double(v); break;
    case PROP_EPS: c.eps = g_value_get_double(v); break;
    case PROP_OPTIMIZER: c.optimizer = enum_nick(optimizer_type(), g_value_get_enum(v)); break;
    case PROP_BETA3: c.optim.beta3 = g_value_get_double(v); break;
    case PROP_EPS2: c.optim.eps2 = g_value_get_double(v); break;
    case PROP_MOMENTUM: c.optim.momentum = g_value_get_double(v); break;
    case PROP_NESTEROV: c.optim.nesterov = g_value_get_boolean(v); break;
    case PROP_CLIP_THRESHOLD: c.optim.clip_threshold = g_value_get_double(v); break;
    case PROP_BETA2_DECAY: c.optim.beta2_decay = g_value_get_double(v); break;
    case PROP_D0: c.optim.d0 = g_value_get_double(v); break;
    case PROP_D_COEF: c.optim.d_coef = g_value_get_double(v); break;
    case PROP_SAFEGUARD_WARMUP: c.optim.safeguard_warmup = g_value_get_boolean(v); break;
    case PROP_USE_BIAS_CORRECTION: c.optim.use_bias_correction = g_value_get_boolean(v); break;
    case PROP_LR_SCHEDULE: c.lr_schedule = enum_nick(lr_schedule_type(), g_value_get_enum(v)); break;
    case PROP_WARMUP_STEPS: c.warmup_steps = g_value_get_uint64(v); break;
    case PROP_MAX_STEPS: c.max_steps = g_value_get_uint64(v); break;
    case PROP_GRAD_CLIP: c.grad_clip = g_value_get_double(v); break;
    case PROP_DEVICE: c.device = str(); break;
    case PROP_PRECISION: c.precision = enum_nick(precision_type(), g_value_get_enum(v)); break;
    case PROP_TUNE_MALLOC: c.tune_malloc = g_value_get_boolean(v); break;
    case PROP_SEED: c.seed = g_value_get_uint64(v); break;
    case PROP_RANK: c.rank = g_value_get_int(v); break;
    case PROP_WORLD_SIZE: c.world_size = static_cast<int>(g_value_get_uint(v)); break;
    case PROP_MASTER_ADDR: c.master_addr = str(); break;
    case PROP_MASTER_PORT: c.master_port = static_cast<int>(g_value_get_uint(v)); break;
    case PROP_BACKEND: c.backend = enum_nick(backend_type(), g_value_get_enum(v)); break;
    case PROP_TIMEOUT: c.timeout_s = g_value_get_double(v); break;
    case PROP_BUCKET_CAP_MB: c.bucket_cap_mb = g_value_get_double(v); break;
    case PROP_SHARDING: c.sharding = static_cast<Sharding>(g_value_get_enum(v)); break;
    case PROP_GATHER_DTYPE: c.gather_dtype = enum_nick(gather_dtype_type(), g_value_get_enum(v)); break;
    case PROP_GATHER_PREFETCH: c.gather_prefetch = enum_nick(gather_prefetch_type(), g_value_get_enum(v)); break;
    case PROP_CHECKPOINT_DIR: c.checkpoint_dir = str(); break;
    case PROP_CHECKPOINT_EVERY: c.checkpoint_every = g_value_get_uint64(v); break;
    case PROP_CHECKPOINT_INTERVAL: c.checkpoint_interval_s = g_value_get_uint(v); break;
    case PROP_KEEP_CHECKPOINTS: c.keep_checkpoints = g_value_get_uint(v); break;
    case PROP_RESUME: c.resume = g_value_get_boolean(v); break;
    case PROP_NAN_POLICY: c.nan_policy = enum_nick(nan_policy_type(), g_value_get_enum(v)); break;
    case PROP_MAX_SKIPPED_STEPS: c.max_skipped_steps = g_value_get_uint(v); break;
    case PROP_LOG_EVERY: c.log_every = g_value_get_uint(v); break;
    case PROP_METRICS_FILE: c.metrics_file = str(); break;
    case PROP_TENSORBOARD_DIR: c.tensorboard_dir = str(); break;
    case PROP_GRADIENT_CHECKPOINTING: c.native.gradient_checkpointing = static_cast<Checkpointing>(g_value_get_enum(v)); break;
    case PROP_ATTENTION_BACKEND: c.native.attention_backend = static_cast<AttentionBackend>(g_value_get_enum(v)); break;
    case PROP_TIMESTEP_SAMPLING: c.native.timestep_sampling = enum_nick(timestep_sampling_type(), g_value_get_enum(v)); break;
    case PROP_LOGIT_MEAN: c.native.logit_mean = g_value_get_double(v); break;
    case PROP_LOGIT_STD: c.native.logit_std = g_value_get_double(v); break;
    case PROP_MODE_SCALE: c.native.mode_scale = g_value_get_double(v); break;
    case PROP_FLOW_SHIFT: c.native.flow_shift = g_value_get_double(v); break;
    case PROP_LOSS_WEIGHTING: c.native.loss_weighting = enum_nick(loss_weighting_type(), g_value_get_enum(v)); break;
    case PROP_SNR_SHIFT_SCALE: c.native.snr_shift_scale = g_value_get_double(v); break;
    case PROP_TIMESTEP_RANGE: c.timestep_range = str(); break;
    case PROP_MODEL_2: c.native.model_2 = str(); break;
    case PROP_BOUNDARY_RATIO: c.native.boundary_ratio = g_value_get_double(v); break;
    case PROP_VAL_SIGMAS: c.val_sigmas = str(); break;
    case PROP_SAVE_DTYPE: c.save_dtype = enum_nick(save_dtype_type(), g_value_get_enum(v)); break;
    case PROP_EXPORT_DIR: c.export_dir = str(); break;
    case PROP_LORA_RANK: c.native.lora_rank = g_value_get_uint(v); break;
    case PROP_LORA_ALPHA: c.native.lora_alpha = g_value_get_double(v); break;
    case PROP_LORA_TARGETS: c.native.lora_targets = str(); break;
    case PROP_LORA_DROPOUT: c.native.lora_dropout = g_value_get_double(v); break;
    case PROP_LORA_INIT: c.native.lora_init = str(); break;
    case PROP_LORA_FORMAT: c.native.lora_format = enum_nick(lora_format_type(), g_value_get_enum(v)); break;
    case PROP_BASE_DTYPE: c.native.base_dtype = enum_nick(base_dtype_type(), g_value_get_enum(v)); break;
    case PROP_TRAINABLE: c.native.trainable = str(); break;
    case PROP_EMA_DECAY: c.ema_decay = g_value_get_double(v); break;
    case PROP_EMA_START_STEP: c.ema_start_step = g_value_get_uint64(v); break;
    case PROP_EMA_EVERY: c.ema_every = g_value_get_uint64(v); break;
    case PROP_EXPORT_EMA: c.export_ema = g_value_get_boolean(v); break;
    default: G_OBJECT_WARN_INVALID_PROPERTY_ID(object, id, pspec); break;
  }
  GST_OBJECT_UNLOCK(self);
}

static void gst_ddp_train_sink_get_property(GObject *object, guint id, GValue *v, GParamSpec *pspec) {
  auto *self = GST_DDP_TRAIN_SINK(object);
  GST_OBJECT_LOCK(self);
  const TrainerConfig &c = *self->config;
  switch (id) {
    case PROP_MODEL: g_value_set_string(v, c.model.c_str()); break;
    case PROP_LATENT_CHANNELS: g_value_set_uint(v, static_cast<guint>(c.latent_channels)); break;
    case PROP_LR: g_value_set_double(v, c.lr); break;
    case PROP_WEIGHT_DECAY: g_value_set_double(v, c.weight_decay); break;
    case PROP_BETA1: g_value_set_double(v, c.beta1); break;
    case PROP_BETA2: g_value_set_double(v, c.beta2); break;
    case PROP_EPS: g_value_set_double(v, c.eps); break;
    case PROP_OPTIMIZER: g_value_set_enum(v, enum_value(optimizer_type(), c.optimizer)); break;
    case PROP_BETA3: g_value_set_double(v, c.optim.beta3); break;
    case PROP_EPS2: g_value_set_double(v, c.optim.eps2); break;
    case PROP_MOMENTUM: g_value_set_double(v, c.optim.momentum); break;
    case PROP_NESTEROV: g_value_set_boolean(v, c.optim.nesterov); break;
    case PROP_CLIP_THRESHOLD: g_value_set_double(v, c.optim.clip_threshold); break;
    case PROP_BETA2_DECAY: g_value_set_double(v, c.optim.beta2_decay); break;
    case PROP_D0: g_value_set_double(v, c.optim.d0); break;
    case PROP_D_COEF: g_value_set_double(v, c.optim.d_coef); break;
    case PROP_SAFEGUARD_WARMUP: g_value_set_boolean(v, c.optim.safeguard_warmup); break;
    case PROP_USE_BIAS_CORRECTION: g_value_set_boolean(v, c.optim.use_bias_correction); break;
    case PROP_LR_SCHEDULE: g_value_set_enum(v, enum_value(lr_schedule_type(), c.lr_schedule)); break;
    case PROP_WARMUP_STEPS: g_value_set_uint64(v, c.warmup_steps); break;
    case PROP_MAX_STEPS: g_value_set_uint64(v, c.max_steps); break;
    case PROP_GRAD_CLIP: g_value_set_double(v, c.grad_clip); break;
    case PROP_DEVICE: g_value_set_string(v, c.device.c_str()); break;
    case PROP_PRECISION: g_value_set_enum(v, enum_value(precision_type(), c.precision)); break;
    case PROP_TUNE_MALLOC: g_value_set_boolean(v, c.tune_malloc); break;
    case PROP_SEED: g_value_set_uint64(v, c.seed); break;
    case PROP_RANK: g_value_set_int(v, c.rank); break;
    case PROP_WORLD_SIZE: g_value_set_uint(v, static_cast<guint>(c.world_size)); break;
    case PROP_MASTER_ADDR: g_value_set_string(v, c.master_addr.c_str()); break;
    case PROP_MASTER_PORT: g_value_set_uint(v, static_cast<guint>(c.master_port)); break;
    case PROP_BACKEND: g_value_set_enum(v, enum_value(backend_type(), c.backend)); break;
    case PROP_TIMEOUT: g_value_set_double(v, c.timeout_s); break;
    case PROP_BUCKET_CAP_MB: g_value_set_double(v, c.bucket_cap_mb); break;
    case PROP_SHARDING: g_value_set_enum(v, static_cast<gint>(c.sharding)); break;
    case PROP_GATHER_DTYPE: g_value_set_enum(v, enum_value(gather_dtype_type(), c.gather_dtype)); break;
    case PROP_GATHER_PREFETCH: g_value_set_enum(v, enum_value(gather_prefetch_type(), c.gather_prefetch)); break;
    case PROP_CHECKPOINT_DIR: g_value_set_string(v, c.checkpoint_dir.c_str()); break;
    case PROP_CHECKPOINT_EVERY: g_value_set_uint64(v, c.checkpoint_every); break;
    case PROP_CHECKPOINT_INTERVAL: g_value_set_uint(v, static_cast<guint>(c.checkpoint_interval_s)); break;
    case PROP_KEEP_CHECKPOINTS: g_value_set_uint(v, c.keep_checkpoints); break;
    case PROP_RESUME: g_value_set_boolean(v, c.resume); break;
    case PROP_NAN_POLICY: g_value_set_enum(v, enum_value(nan_policy_type(), c.nan_policy)); break;
    case PROP_MAX_SKIPPED_STEPS: g_value_set_uint(v, c.max_skipped_steps); break;
    case PROP_LOG_EVERY: g_value_set_uint(v, c.log_every); break;
    case PROP_METRICS_FILE: g_value_set_string(v, c.metrics_file.c_str()); break;
    case PROP_TENSORBOARD_DIR: g_value_set_string(v, c.tensorboard_dir.c_str()); break;
    case PROP_GRADIENT_CHECKPOINTING: g_value_set_enum(v, static_cast<gint>(c.native.gradient_checkpointing)); break;
    case PROP_ATTENTION_BACKEND: g_value_set_enum(v, static_cast<gint>(c.native.attention_backend)); break;
    case PROP_TIMESTEP_SAMPLING: g_value_set_enum(v, enum_value(timestep_sampling_type(), c.native.timestep_sampling)); break;
    case PROP_LOGIT_MEAN: g_value_set_double(v, c.native.logit_mean); break;
    case PROP_LOGIT_STD: g_value_set_double(v, c.native.logit_std); break;
    case PROP_MODE_SCALE: g_value_set_double(v, c.native.mode_scale); break;
    case PROP_FLOW_SHIFT: g_value_set_double(v, c.native.flow_shift); break;
    case PROP_LOSS_WEIGHTING: g_value_set_enum(v, enum_value(loss_weighting_type(), c.native.loss_weighting)); break;
    case PROP_SNR_SHIFT_SCALE: g_value_set_double(v, c.native.snr_shift_scale); break;
    case PROP_TIMESTEP_RANGE: g_value_set_string(v, c.timestep_range.c_str()); break;
    case PROP_MODEL_2: g_value_set_string(v, c.native.model_2.c_str()); break;
    case PROP_BOUNDARY_RATIO: g_value_set_double(v, c.native.boundary_ratio); break;
    case PROP_VAL_SIGMAS: g_value_set_string(v, c.val_sigmas.c_str()); break;
    case PROP_SAVE_DTYPE: g_value_set_enum(v, enum_value(save_dtype_type(), c.save_dtype)); break;
    case PROP_EXPORT_DIR: g_value_set_string(v, c.export_dir.c_str()); break;
    case PROP_LORA_RANK: g_value_set_uint(v, c.native.lora_rank); break;
    case PROP_LORA_ALPHA: g_value_set_double(v, c.native.lora_alpha); break;
    case PROP_LORA_TARGETS: g_value_set_string(v, c.native.lora_targets.c_str()); break;
    case PROP_LORA_DROPOUT: g_value_set_double(v, c.native.lora_dropout); break;
    case PROP_LORA_INIT: g_value_set_string(v, c.native.lora_init.c_str()); break;
    case PROP_LORA_FORMAT: g_value_set_enum(v, enum_value(lora_format_type(), c.native.lora_format)); break;
    case PROP_BASE_DTYPE: g_value_set_enum(v, enum_value(base_dtype_type(), c.native.base_dtype)); break;
    case PROP_TRAINABLE: g_value_set_string(v, c.native.trainable.c_str()); break;
    case PROP_EMA_DECAY: g_value_set_double(v, c.ema_decay); break;
    case PROP_EMA_START_STEP: g_value_set_uint64(v, c.ema_start_step); break;
    case PROP_EMA_EVERY: g_value_set_uint64(v, c.ema_every); break;
    case PROP_EXPORT_EMA: g_value_set_boolean(v, c.export_ema); break;
    case PROP_STEPS: g_value_set_uint64(v, self->steps); break;
    case PROP_LOSS: g_value_set_double(v, self->loss); break;
    default: G_OBJECT_WARN_INVALID_PROPERTY_ID(object, id, pspec); break;
  }
  GST_OBJECT_UNLOCK(self);
}

static void gst_ddp_train_sink_finalize(GObject *object) {
  auto *self = GST_DDP_TRAIN_SINK(object);
  delete self->engine;
  delete self->config;
  delete self->last_return;
  G_OBJECT_CLASS(gst_ddp_train_sink_parent_class)->finalize(object);
}

static void gst_ddp_train_sink_init(GstDdpTrainSink *self) {
  self->config = new TrainerConfig();
  self->engine = new std::shared_ptr<TrainerEngine>();
  self->last_return = new std::chrono::steady_clock::time_point(std::chrono::steady_clock::now());
  self->steps = 0;
  self->loss = std::numeric_limits<double>::quiet_NaN();
  self->done = false;
  // A trainer consumes as fast as it can: no clock sync, no QoS.
  gst_base_sink_set_sync(GST_BASE_SINK(self), FALSE);
  gst_base_sink_set_qos_enabled(GST_BASE_SINK(self), FALSE);
  // No preroll: microbatcher holds batch-size latents before the first micro-batch, and a
  // prerolled tee tap (vaeencoder ! tee ! queue ! fakesink) fills its default queue with
  // one clip-long latent, so waiting for our own preroll buffer would stall in PAUSED.
  gst_base_sink_set_async_enabled(GST_BASE_SINK(self), FALSE);
  // The last sample would keep a micro-batch (maybe GPU memory) alive between steps.
  gst_base_sink_set_last_sample_enabled(GST_BASE_SINK(self), FALSE);
}

static void gst_ddp_train_sink_class_init(GstDdpTrainSinkClass *klass) {
  auto *oc = G_OBJECT_CLASS(klass);
  auto *ec = GST_ELEMENT_CLASS(klass);
  videotrain_one_error_install(ec);  // one error per failure (one_error.h)
  auto *bc = GST_BASE_SINK_CLASS(klass);
  oc->set_property = gst_ddp_train_sink_set_property;
  oc->get_property = gst_ddp_train_sink_get_property;
  oc->finalize = gst_ddp_train_sink_finalize;
  bc->start = GST_DEBUG_FUNCPTR(gst_ddp_train_sink_start);
  bc->stop = GST_DEBUG_FUNCPTR(gst_ddp_train_sink_stop);
  bc->set_caps = GST_DEBUG_FUNCPTR(gst_ddp_train_sink_set_caps);
  bc->render = GST_DEBUG_FUNCPTR(gst_ddp_train_sink_render);
  bc->unlock = GST_DEBUG_FUNCPTR(gst_ddp_train_sink_unlock);
  bc->unlock_stop = GST_DEBUG_FUNCPTR(gst_ddp_train_sink_unlock_stop);
  bc->event = GST_DEBUG_FUNCPTR(gst_ddp_train_sink_event);
  bc->query = GST_DEBUG_FUNCPTR(gst_ddp_train_sink_query);
  ec->query = GST_DEBUG_FUNCPTR(gst_ddp_train_sink_element_query);

  const TrainerConfig d;
  const auto rw = GParamFlags(G_PARAM_READWRITE | G_PARAM_STATIC_STRINGS | GST_PARAM_MUTABLE_READY);
  const auto ro = GParamFlags(G_PARAM_READABLE | G_PARAM_STATIC_STRINGS);
  auto install = [oc](guint id, GParamSpec *p) { g_object_class_install_property(oc, id, p); };
  install(PROP_MODEL, g_param_spec_string("model", "Model",
                                          "TorchScript file whose module has training_step(latents: Tensor, "
                                          "captions: List[str]) -> Tensor (scalar loss), or, for streams with a "
                                          "textencoder, training_step(latents: Tensor, text_embeds: Tensor, "
                                          "text_mask: Tensor) -> Tensor; or a diffusers transformer folder "
                                          "(config.json with _class_name WanTransformer3DModel or CogVideoXTransformer3DModel, weights single or "
                                          "sharded, F32/F16/BF16), trained natively with its family's objective; or "
                                          "builtin:tiny-unet3d (captions) / builtin:tiny-t2v (text embeddings)",
                                          "", rw));
  install(PROP_LATENT_CHANNELS,
          g_param_spec_uint("latent-channels", "Latent channels",
                            "Input channels of a built-in model; 0: from the first micro-batch", 0, 4096, 0, rw));
  install(PROP_OPTIMIZER, g_param_spec_enum("optimizer", "Optimizer",
                                             "The optimizer; its state is checkpointed and resumed (a checkpoint "
                                             "resumes with the optimizer that wrote it)",
                                             optimizer_type(), 0, rw));
  install(PROP_LR, g_param_spec_double("lr", "Learning rate",
                                       "Peak learning rate (the schedule's); prodigy: a multiplier of its learned "
                                       "step size, usually 1",
                                       0, 10, d.lr, rw));
  install(PROP_WEIGHT_DECAY, g_param_spec_double("weight-decay", "Weight decay",
                                                 "Decoupled weight decay (weights *= 1 - lr * weight-decay); sgd: "
                                                 "L2, added to the gradient as torch.optim.SGD does",
                                                 0, 10, d.weight_decay, rw));
  install(PROP_BETA1, g_param_spec_double("beta1", "Beta 1",
                                          "First moment decay (adamw, adamw8bit, prodigy, came)", 0, 1, d.beta1, rw));
  install(PROP_BETA2, g_param_spec_double("beta2", "Beta 2",
                                          "Second moment decay (adamw, adamw8bit, prodigy, came)", 0, 1, d.beta2, rw));
  install(PROP_BETA3, g_param_spec_double("beta3", "Beta 3",
                                          "prodigy: decay of its step-size numerator and sum (-1: sqrt(beta2)); came: "
                                          "decay of the instability moment (-1: 0.9999)",
                                          -1, 1, d.optim.beta3, rw));
  install(PROP_EPS, g_param_spec_double("eps", "Epsilon",
                                        "Denominator epsilon; -1: the optimizer's own (1e-8 adamw, adamw8bit, "
                                        "prodigy; float32 epsilon adafactor (its eps1); 1e-30 came (added to g^2))",
                                        -1, 1, d.eps, rw));
  install(PROP_EPS2, g_param_spec_double("eps2", "Epsilon 2",
                                         "adafactor: floor of the weights' RMS that scales the step (-1: 1e-3); came: "
                                         "added to the instability (-1: 1e-16)",
                                         -1, 1, d.optim.eps2, rw));
  install(PROP_MOMENTUM,
          g_param_spec_double("momentum", "Momentum", "sgd: momentum factor; 0: plain SGD", 0, 1, d.optim.momentum, rw));
  install(PROP_NESTEROV, g_param_spec_boolean("nesterov", "Nesterov", "sgd: Nesterov momentum (needs momentum > 0)",
                                              d.optim.nesterov, rw));
  install(PROP_CLIP_THRESHOLD, g_param_spec_double("clip-threshold", "Clip threshold",
                                                   "adafactor, came: an update's RMS is clipped to this",
                                                   0, G_MAXDOUBLE, d.optim.clip_threshold, rw));
  install(PROP_BETA2_DECAY, g_param_spec_double("beta2-decay", "Beta2 decay",
                                                "adafactor: 1 - beta2 at step t is t^beta2-decay", -1, 0,
                                                d.optim.beta2_decay, rw));
  install(PROP_D0, g_param_spec_double("d0", "D0", "prodigy: initial step-size estimate", 1e-12, 1, d.optim.d0, rw));
  install(PROP_D_COEF, g_param_spec_double("d-coef", "D coefficient",
                                           "prodigy: multiplier of its step-size estimate", 1e-6, 1000,
                                           d.optim.d_coef, rw));
  install(PROP_SAFEGUARD_WARMUP, g_param_spec_boolean("safeguard-warmup", "Safeguard warmup",
                                                      "prodigy: leave lr out of the estimate's denominator (for "
                                                      "lr warmup)",
                                                      d.optim.safeguard_warmup, rw));
  install(PROP_USE_BIAS_CORRECTION,
          g_param_spec_boolean("use-bias-correction", "Use bias correction",
                               "prodigy: Adam's bias correction on its step", d.optim.use_bias_correction, rw));
  install(PROP_LR_SCHEDULE, g_param_spec_enum("lr-schedule", "LR schedule",
                                               "Learning-rate schedule after warmup-steps of linear warmup "
                                               "(cosine/linear decay over max-steps; constant when max-steps=0)",
                                               lr_schedule_type(), 0, rw));
  install(PROP_WARMUP_STEPS, g_param_spec_uint64("warmup-steps", "Warmup steps",
                                                 "Optimizer steps of linear LR warmup", 0, G_MAXUINT64, 0, rw));
  install(PROP_MAX_STEPS,
          g_param_spec_uint64("max-steps", "Max steps",
                              "Stop after this many optimizer steps (final checkpoint, then EOS); 0: until EOS", 0,
                              G_MAXUINT64, 0, rw));
  install(PROP_GRAD_CLIP, g_param_spec_double("grad-clip", "Gradient clip",
                                              "Clip gradients to this global L2 norm; 0: off", 0, G_MAXDOUBLE, 0, rw));
  install(PROP_DEVICE, g_param_spec_string("device", "Device",
                                           "Training device: auto (or empty), cpu, cuda or cuda:N; auto: "
                                           "cuda:(LOCAL_RANK mod visible GPUs) when CUDA is available, else cpu",
                                           "", rw));
  install(PROP_PRECISION, g_param_spec_enum("precision", "Precision", "Compute precision of forward/backward",
                                            precision_type(), 0, rw));
  install(PROP_TUNE_MALLOC,
          g_param_spec_boolean("tune-malloc", "Tune malloc", kTuneMallocBlurb, TRUE, rw));
  install(PROP_SEED, g_param_spec_uint64("seed", "Seed",
                                         "Seed of the initial weights and (with rank and step) of the noise the model "
                                         "draws",
                                         0, G_MAXUINT64, 0, rw));
  install(PROP_RANK, g_param_spec_int("rank", "Rank", "This process's rank; -1: from the environment (RANK, "
                                                      "SLURM_PROCID, OMPI_COMM_WORLD_RANK)",
                                      -1, G_MAXINT, -1, rw));
  install(PROP_WORLD_SIZE, g_param_spec_uint("world-size", "World size",
                                             "Number of ranks; 0: from the environment (WORLD_SIZE...)", 0, G_MAXINT,
                                             0, rw));
  install(PROP_MASTER_ADDR, g_param_spec_string("master-addr", "Master address",
                                                "Host of the c10d store (rank 0); empty: MASTER_ADDR or 127.0.0.1",
                                                "", rw));
  install(PROP_MASTER_PORT, g_param_spec_uint("master-port", "Master port",
                                              "Port of the c10d store; 0: MASTER_PORT or 29500", 0, 65535, 0, rw));
  install(PROP_BACKEND, g_param_spec_enum("backend", "Backend", "c10d backend of the gradient all-reduce",
                                          backend_type(), 0, rw));
  install(PROP_TIMEOUT, g_param_spec_double("timeout", "Timeout",
                                            "Seconds the store and every collective may take before a missing peer "
                                            "is an error",
                                            0.1, 86400, d.timeout_s, rw));
  install(PROP_BUCKET_CAP_MB, g_param_spec_double("bucket-cap-mb", "Bucket cap (MB)",
                                                  "Size of gradient all-reduce buckets (the first one holds 1 MB)",
                                                  0.001, 4096, d.bucket_cap_mb, rw));
  install(PROP_CHECKPOINT_DIR,
          g_param_spec_string("checkpoint-dir", "Checkpoint folder",
                              "Where checkpoints go (step-NNNNNNNN folders, each with a manifest.json of its files' "
                              "CRC-32); created at start, where it must be writable; empty: none",
                              "", rw));
  install(PROP_CHECKPOINT_EVERY,
          g_param_spec_uint64("checkpoint-every", "Checkpoint every",
                              "Write a checkpoint every this many steps (and always at the end); 0: only at the end",
                              0, G_MAXUINT64, 0, rw));
  install(PROP_CHECKPOINT_INTERVAL,
          g_param_spec_uint("checkpoint-interval", "Checkpoint interval",
                            "Also write a checkpoint at the first step this many seconds after the last one (or "
                            "the start), timed by rank 0 so that every rank writes at the same step; bounds what a "
                            "kill or a crash loses. 0: off. Needs checkpoint-dir",
                            0, G_MAXUINT, static_cast<guint>(d.checkpoint_interval_s), rw));
  install(PROP_KEEP_CHECKPOINTS, g_param_spec_uint("keep-checkpoints", "Keep checkpoints",
                                                   "Newest checkpoints kept; 0: keep all", 0, G_MAXUINT,
                                                   d.keep_checkpoints, rw));
  install(PROP_RESUME, g_param_spec_boolean("resume", "Resume",
                                            "Load the newest checkpoint of checkpoint-dir whose files verify (or "
                                            "one from before checksums, warned about) and whose weights are finite "
                                            "(newer ones passed over are warned about) at start and answer the "
                                            "resume query with this rank's data position",
                                            FALSE, rw));
  install(PROP_SHARDING,
          g_param_spec_enum("sharding", "Sharding",
                            "Over the run's c10d group: none is DDP (every rank holds the whole weights, gradients "
                            "and optimizer state); optimizer shards the optimizer state and the reduced gradients "
                            "(ZeRO-2: each rank updates its 1/world slice of every block and all-gathers the "
                            "weights after the step); full shards the weights too (FSDP / ZeRO-3: each block's "
                            "weights are gathered before its forward and its recompute and freed after, so blocks "
                            "are checkpointed). Trainable tensors only (a LoRA's frozen base stays whole); needs "
                            "optimizer=adamw or sgd; checkpoints hold a shard per rank and resume on any number "
                            "of ranks or sharding",
                            sharding_type(), 0, rw));
  install(PROP_GATHER_DTYPE,
          g_param_spec_enum("gather-dtype", "Gather dtype",
                            "sharding=full: the dtype each block's weights are all-gathered in. bf16 rounds each "
                            "rank's float32 slice before the gather (half the traffic and memory; the optimizer "
                            "keeps the float32 slices) and uses the block in bf16 under bf16 autocast, as float32 "
                            "otherwise",
                            gather_dtype_type(), 0, rw));
  install(PROP_GATHER_PREFETCH,
          g_param_spec_enum("gather-prefetch", "Gather prefetch",
                            "sharding=full: whether the next block's all-gather is issued while a block computes "
                            "(the forward's next block, the recompute's previous one; two gathered blocks in "
                            "memory) or each block is gathered when it is used (one). The same weights either way",
                            gather_prefetch_type(), 0, rw));
  install(PROP_GRADIENT_CHECKPOINTING,
          g_param_spec_enum("gradient-checkpointing", "Gradient checkpointing",
                            "Native models: true recomputes each transformer block in backward instead of keeping "
                            "its activations (memory of one block's activations, about a third more compute); "
                            "selective keeps each block's attention inputs and output and recomputes the rest "
                            "(norms, projections, FFN: 4 x tokens x dim more per block than true, and backward "
                            "never runs attention's forward again)",
                            checkpointing_type(), 0, rw));
  install(PROP_ATTENTION_BACKEND,
          g_param_spec_enum("attention-backend", "Attention backend",
                            "Native models: the attention kernel. auto leaves it to LibTorch (2.x: flash, then "
                            "memory-efficient on CUDA; its fused CPU kernel from 2.2), flash/cudnn/efficient force "
                            "one (an error at start where this LibTorch or device has none), math is our own "
                            "kernel (exact, memory-bounded; the only other choice on LibTorch 1.13)",
                            attention_backend_type(), 0, rw));
  install(PROP_TIMESTEP_SAMPLING,
          g_param_spec_enum("timestep-sampling", "Timestep sampling",
                            "Native models: how each sample's timestep is drawn, from its own generator (seed, "
                            "sample id, epoch). Wan (rectified flow): u from diffusers' densities "
                            "(compute_density_for_timestep_sampling), then shifted; CogVideoX takes auto or uniform",
                            timestep_sampling_type(), enum_value(timestep_sampling_type(), d.native.timestep_sampling),
                            rw));
  install(PROP_LOGIT_MEAN, g_param_spec_double("logit-mean", "Logit mean",
                                               "Mean of the normal draw of timestep-sampling=logit-normal|shifted",
                                               -10, 10, d.native.logit_mean, rw));
  install(PROP_LOGIT_STD, g_param_spec_double("logit-std", "Logit std",
                                              "Standard deviation of the normal draw of "
                                              "timestep-sampling=logit-normal|shifted (musubi-tuner's sigmoid_scale)",
                                              0.001, 10, d.native.logit_std, rw));
  install(PROP_MODE_SCALE, g_param_spec_double("mode-scale", "Mode scale",
                                               "Scale of timestep-sampling=mode (SD3's s; 0: uniform; above 0 favours "
                                               "the middle sigmas); in [-1, 2/(pi-2)]",
                                               -1, 1.75, d.native.mode_scale, rw));
  install(PROP_LOSS_WEIGHTING,
          g_param_spec_enum("loss-weighting", "Loss weighting",
                            "Native Wan models: each sample's flow-matching MSE weighted by its sigma, as diffusers' "
                            "compute_loss_weighting_for_sd3 (CogVideoX: none only; it has its own 1/(1-alphas_cumprod))",
                            loss_weighting_type(), 0, rw));
  install(PROP_FLOW_SHIFT, g_param_spec_double("flow-shift", "Flow shift",
                                               "Native Wan models: sigma' = s*sigma / (1 + (s-1)*sigma); 1: no shift "
                                               "(3.0 is the Wan 480p recipe, 5.0 for 720p); timestep-sampling="
                                               "shifted takes its shift from the sample's resolution instead",
                                               0.01, 100, d.native.flow_shift, rw));
  install(PROP_SNR_SHIFT_SCALE,
          g_param_spec_double("snr-shift-scale", "SNR shift scale",
                              "Native CogVideoX models (v-prediction on its DDPM schedule): the schedule's "
                              "snr_shift_scale; 0: the folder's ../scheduler/scheduler_config.json, else 3.0 for the "
                              "CogVideoX-2b layout and 1.0 for 5b and 1.5, as the published schedulers",
                              0, 100, d.native.snr_shift_scale, rw));
  install(PROP_TIMESTEP_RANGE,
          g_param_spec_string("timestep-range", "Timestep range",
                              "Native Wan models: LO,HI in [0, 1000]: shifted sigmas are rescaled into [LO, HI]/1000 "
                              "(Wan 2.2 A14B: 875,1000 for the high-noise expert, 0,875 for the low-noise one); "
                              "CogVideoX: integer timesteps drawn uniformly in [LO, HI)",
                              d.timestep_range.c_str(), rw));
  install(PROP_MODEL_2,
          g_param_spec_string("model-2", "Second expert",
                              "Wan 2.2 A14B in one job: the low-noise expert's folder (transformer_2) beside model= "
                              "(transformer, the high-noise expert); each sample trains the expert WanPipeline uses "
                              "at its timestep; both in one optimizer, checkpoint and export (transformer_2/, lora_2/)",
                              "", rw));
  install(PROP_BOUNDARY_RATIO,
          g_param_spec_double("boundary-ratio", "Expert boundary",
                              "With model-2: timesteps >= boundary-ratio * 1000 go to model (high noise), the rest to "
                              "model-2; 0: the pipeline's model_index.json next to the folders (0.875 for "
                              "Wan2.2-T2V-A14B, 0.9 for I2V)",
                              0, 0.999, 0, rw));
  install(PROP_VAL_SIGMAS, g_param_spec_string("val-sigmas", "Validation sigmas",
                                               "Native models: the fixed sigmas (comma list in (0, 1]) at which "
                                               "validation evaluates every sample; its loss is their mean",
                                               d.val_sigmas.c_str(), rw));
  install(PROP_SAVE_DTYPE, g_param_spec_enum("save-dtype", "Save dtype",
                                             "Native models: weights dtype of the diffusers folder a finished run "
                                             "exports (checkpoints stay float32 for exact resume)",
                                             save_dtype_type(), 0, rw));
  install(PROP_EXPORT_DIR,
          g_param_spec_string("export-dir", "Export folder",
                              "Native models: where a finished run writes its diffusers transformer folder (config.json "
                              "+ sharded safetensors + index; from_pretrained and model= load it); empty: "
                              "<checkpoint-dir>/transformer, none without checkpoint-dir",
                              "", rw));
  install(PROP_LORA_RANK, g_param_spec_uint("lora-rank", "LoRA rank",
                                            "Native models: train a LoRA of this rank over the frozen base (only "
                                            "its tensors are in the optimizer, the all-reduce and checkpoints); 0: off",
                                            0, 4096, 0, rw));
  install(PROP_LORA_ALPHA, g_param_spec_double("lora-alpha", "LoRA alpha",
                                               "LoRA scale alpha/rank; 0: alpha = rank (scale 1)", 0, 1e6, 0, rw));
  install(PROP_LORA_TARGETS,
          g_param_spec_string("lora-targets", "LoRA targets",
                              "Linear modules that get a LoRA, by diffusers name: a comma list of suffixes (default: "
                              "the attention projections of every block) or a regular expression; "
                              "videotrain-model info lists the candidates",
                              d.native.lora_targets.c_str(), rw));
  install(PROP_LORA_DROPOUT, g_param_spec_double("lora-dropout", "LoRA dropout",
                                                 "Dropout on the LoRA branch's input while training", 0, 0.99, 0, rw));
  install(PROP_LORA_INIT, g_param_spec_string("lora-init", "LoRA init",
                                              "Continue from this LoRA file (diffusers/PEFT, ComfyUI/original Wan or "
                                              "kohya/musubi naming); its rank and alphas are kept",
                                              "", rw));
  install(PROP_LORA_FORMAT, g_param_spec_enum("lora-format", "LoRA format",
                                              "Naming of the LoRA file(s) a finished LoRA run writes to export-dir "
                                              "(default <checkpoint-dir>/lora)",
                                              lora_format_type(), 0, rw));
  install(PROP_BASE_DTYPE, g_param_spec_enum("base-dtype", "Base dtype",
                                             "Storage of a LoRA run's frozen Linear weights: bf16 (as loaded) or fp8 "
                                             "(e4m3, per-row scale, dequantised per layer per use; half of bf16's bytes)",
                                             base_dtype_type(), 0, rw));
  install(PROP_TRAINABLE,
          g_param_spec_string("trainable", "Trainable",
                              "Native models: a regular expression on parameter names; only the matching parameters "
                              "train (partial fine-tune), the rest stay frozen; empty: all",
                              "", rw));
  install(PROP_EMA_DECAY,
          g_param_spec_double("ema-decay", "EMA decay",
                              "Keep an exponential moving average of the trainable parameters (LoRA: the adapter), "
                              "float32 on the training device (4 bytes per trainable parameter per rank): "
                              "ema = decay * ema + (1 - decay) * weights at each update; checkpointed, exported with "
                              "export-ema, validated/sampled with weights=ema. 0: no EMA",
                              0, 0.999999999, 0, rw));
  install(PROP_EMA_START_STEP,
          g_param_spec_uint64("ema-start-step", "EMA start step",
                              "Up to this optimizer step the EMA is a copy of the weights; averaging starts after it",
                              0, G_MAXUINT64, 0, rw));
  install(PROP_EMA_EVERY, g_param_spec_uint64("ema-every", "EMA every",
                                              "Update the EMA at every this many optimizer steps after ema-start-step "
                                              "(each update applies ema-decay once)",
                                              1, G_MAXUINT64, 1, rw));
  install(PROP_EXPORT_EMA,
          g_param_spec_boolean("export-ema", "Export EMA",
                               "A finished run also exports the EMA weights beside the raw ones: export-dir + \"_ema\" "
                               "(<checkpoint-dir>/transformer_ema or lora_ema). Needs ema-decay",
                               FALSE, rw));
  install(PROP_NAN_POLICY, g_param_spec_enum("nan-policy", "NaN policy", "What a non-finite loss or gradient does",
                                             nan_policy_type(), 0, rw));
  install(PROP_MAX_SKIPPED_STEPS,
          g_param_spec_uint("max-skipped-steps", "Max skipped steps",
                            "With nan-policy=skip: this many optimizer steps in a row with a non-finite loss or "
                            "gradient are an error (a run that skipped every step is one at its end anyway); 0: no bound",
                            0, G_MAXUINT, d.max_skipped_steps, rw));
  install(PROP_LOG_EVERY, g_param_spec_uint("log-every", "Log every",
                                            "Post a ddptrainsink-step message every this many steps; 0: never", 0,
                                            G_MAXUINT, d.log_every, rw));
  install(PROP_METRICS_FILE, g_param_spec_string("metrics-file", "Metrics file",
                                                 "Append step and checkpoint records as JSON lines (rank 0; its "
                                                 "folder is created)",
                                                 "", rw));
  install(PROP_TENSORBOARD_DIR, g_param_spec_string("tensorboard-dir", "TensorBoard folder",
                                                    "Write TensorBoard event files of the step scalars (rank 0); samplesink's frames of other "
                                                    "ranks go to its subfolders samples-rankR", "",
                                                    rw));
  install(PROP_STEPS, g_param_spec_uint64("steps", "Steps", "Optimizer steps done", 0, G_MAXUINT64, 0, ro));
  install(PROP_LOSS, g_param_spec_double("loss", "Loss", "Loss of the last step, averaged over ranks", -G_MAXDOUBLE,
                                         G_MAXDOUBLE, 0, ro));

  gst_element_class_add_static_pad_template(ec, sink_template());
  gst_element_class_set_static_metadata(
      ec, "Distributed trainer sink", "Sink/Tensor",
      "Trains a TorchScript or built-in model on micro-batches with AdamW (or optimizer=), gradient accumulation and a bucketed "
      "all-reduce over c10d (one process per GPU); writes checkpoints and posts progress" VIDEOTRAIN_DOC_DDPTRAINSINK_MESSAGES,
      "gst-videotrain");
}
