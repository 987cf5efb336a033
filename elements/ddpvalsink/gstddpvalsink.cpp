/* ddpvalsink: the GObject face of ValidationEngine (no torch here).
 *
 * A validation branch beside the training branch of the same pipeline. It finds the run
 * of its ddptrainsink (property trainer: its name) through GstContext: the trainer posts
 * its RunContext as "videotrain-run/<name>" when it starts, the bins keep it, and our
 * NEED_CONTEXT (at start, and at the first buffer when the trainer started later) is
 * answered through set_context (run_context_gst.h). It takes snapshots of its
 * weights every `every` optimizer steps (and at-start, and at the trainer's EOS), and
 * evaluates each one on one epoch of the validation stream, on the samples of its
 * shard (clip index mod num-shards). Between passes render() blocks until the next
 * snapshot, so the validation source stays prefetched and idle. Rank 0 posts the mean
 * over every shard and rank as a ddpvalsink-result element message. */
#include "one_error.h"
#include "gstddpvalsink.h"
#include "bus_messages_doc.h"

#include <cmath>
#include <limits>
#include <memory>
#include <string>

#include "bus_message_gst.h"
#include "gst_enum.h"
#include "models/attention_backend.h"
#include "metas.h"
#include "run_context_gst.h"
#include "tensor_caps.h"
#include "val_buffers.h"
#include "validation_engine.h"

GST_DEBUG_CATEGORY_STATIC(ddpvalsink_debug);
#define GST_CAT_DEFAULT ddpvalsink_debug

using namespace videotrain;

struct _GstDdpValSink {
  GstBaseSink parent;
  ValidationConfig *config;            // properties (object lock)
  gchar *trainer_name;
  ValidationEngine *engine;            // streaming thread; created in start()
  std::shared_ptr<RunContext> *run;    // from set_context (object lock)
  gdouble loss;                        // read-only mirrors (object lock)
  guint64 step;
};

G_DEFINE_TYPE(GstDdpValSink, gst_ddp_val_sink, GST_TYPE_BASE_SINK);
GST_ELEMENT_REGISTER_DEFINE_WITH_CODE(ddpvalsink, "ddpvalsink", GST_RANK_NONE, GST_TYPE_DDP_VAL_SINK,
                                      GST_DEBUG_CATEGORY_INIT(ddpvalsink_debug, "ddpvalsink", 0,
                                                              "Distributed validation sink"));

enum {
  PROP_0,
  PROP_TRAINER,
  PROP_EVERY,
  PROP_AT_START,
  PROP_SKIP_IF_BUSY,
  PROP_WEIGHTS,
  PROP_ATTENTION_BACKEND,
  PROP_SHARD_INDEX,
  PROP_NUM_SHARDS,
  PROP_BATCH_SIZE,
  PROP_DEVICE,
  PROP_LAST_LOSS,
  PROP_LAST_STEP,
};

VIDEOTRAIN_DEFINE_ENUM(weights_type, "GstDdpValSinkWeights", {0, "The trainer's weights", "raw"},
                       {1, "The trainer's EMA of its trainable parameters (needs its ema-decay)", "ema"})
VIDEOTRAIN_DEFINE_ENUM(attention_backend_type, "GstDdpValSinkAttentionBackend", VIDEOTRAIN_ATTENTION_BACKEND_ENUM_VALUES)

static GstStaticPadTemplate sink_template =
    GST_STATIC_PAD_TEMPLATE("sink", GST_PAD_SINK, GST_PAD_ALWAYS,
                            GST_STATIC_CAPS(VIDEOTRAIN_TENSOR_MEDIA_TYPE ", content=(string){latents,micro-batch}"));

static void post_messages(GstDdpValSink *self) {
  if (!self->engine) return;
  for (auto &m : self->engine->take_messages()) {
    if (m.name == "ddpvalsink-result") {
      GST_INFO_OBJECT(self, "validation of step %" G_GINT64_FORMAT ": loss %g over %" G_GINT64_FORMAT " samples",
                      m.ints["step"], m.numbers["loss"], m.ints["samples"]);
    }
    post_bus_message(GST_ELEMENT(self), m);
  }
  GST_OBJECT_LOCK(self);
  self->loss = self->engine->last_loss();
  self->step = self->engine->last_step();
  GST_OBJECT_UNLOCK(self);
}

// The run of our trainer, asked of the bins (NEED_CONTEXT, answered through set_context)
// unless we hold it already.
static std::shared_ptr<RunContext> request_run(GstDdpValSink *self, const std::string &name) {
  return run_context_find(GST_ELEMENT(self), name, self->run);
}

// Without a run: FALSE (with an element error) when the trainer is not in the pipeline or not a
// ddptrainsink; TRUE when it is one that has not started yet.
static gboolean check_trainer(GstDdpValSink *self, const std::string &name) {
  const std::string why = trainer_problem(GST_ELEMENT(self), name);
  if (!why.empty()) GST_ELEMENT_ERROR(self, RESOURCE, NOT_FOUND, ("%s", why.c_str()), (nullptr));
  return why.empty();
}

// Attaches the engine to the trainer's run once it exists. FALSE: error posted.
static gboolean ensure_attached(GstDdpValSink *self) {
  if (self->engine->attached()) return TRUE;
  GST_OBJECT_LOCK(self);
  const std::string name = self->trainer_name ? self->trainer_name : "";
  GST_OBJECT_UNLOCK(self);
  auto run = request_run(self, name);
  if (!run) {
    if (!check_trainer(self, name)) return FALSE;
    GST_ELEMENT_ERROR(self, RESOURCE, SETTINGS,
                      ("ddptrainsink '%s' has not started (it must be in the same pipeline and not failed)",
                       name.c_str()),
                      (nullptr));
    return FALSE;
  }
  if (!self->engine->attach(run)) {
    GST_ELEMENT_ERROR(self, RESOURCE, SETTINGS, ("Cannot start validation: %s", self->engine->error().c_str()),
                      (nullptr));
    return FALSE;
  }
  GST_INFO_OBJECT(self, "validating for '%s': shard %u of %u, rank %d of %d", name.c_str(),
                  self->config->shard_index, self->config->num_shards, self->engine->rank(),
                  self->engine->world_size());
  return TRUE;
}

static void gst_ddp_val_sink_set_context(GstElement *element, GstContext *context) {
  auto *self = GST_DDP_VAL_SINK(element);
  GST_OBJECT_LOCK(self);
  const std::string name = self->trainer_name ? self->trainer_name : "";
  GST_OBJECT_UNLOCK(self);
  run_context_take(element, context, name, self->run);  // null: the trainer stopped
  GST_ELEMENT_CLASS(gst_ddp_val_sink_parent_class)->set_context(element, context);
}

static gboolean gst_ddp_val_sink_start(GstBaseSink *sink) {
  auto *self = GST_DDP_VAL_SINK(sink);
  GST_OBJECT_LOCK(self);
  ValidationConfig cfg = *self->config;
  const std::string name = self->trainer_name ? self->trainer_name : "";
  GST_OBJECT_UNLOCK(self);
  if (name.empty()) {
    GST_ELEMENT_ERROR(self, RESOURCE, SETTINGS, ("No trainer: set the trainer property to the name of a ddptrainsink"),
                      (nullptr));
    return FALSE;
  }
  if (cfg.shard_index >= cfg.num_shards) {
    GST_ELEMENT_ERROR(self, RESOURCE, SETTINGS,
                      ("shard-index %u is out of range for num-shards %u (0 .. num-shards - 1)", cfg.shard_index,
                       cfg.num_shards),
                      (nullptr));
    return FALSE;
  }
  // The store, timeout and run log come with the trainer's run.
  self->engine = new ValidationEngine(cfg);
  self->engine->set_message_hook([self] { post_messages(self); });
  // The trainer may start after us in this state change: then at the first buffer.
  if (request_run(self, name)) return ensure_attached(self);
  return check_trainer(self, name);
}

static gboolean gst_ddp_val_sink_stop(GstBaseSink *sink) {
  auto *self = GST_DDP_VAL_SINK(sink);
  delete self->engine;  // detaches from the hub
  self->engine = nullptr;
  GST_OBJECT_LOCK(self);
  self->run->reset();  // a restart asks again (the trainer may have restarted too)
  GST_OBJECT_UNLOCK(self);
  return TRUE;
}

static gboolean gst_ddp_val_sink_unlock(GstBaseSink *sink) {
  auto *self = GST_DDP_VAL_SINK(sink);
  if (self->engine) self->engine->set_flushing(true);
  return TRUE;
}

static gboolean gst_ddp_val_sink_unlock_stop(GstBaseSink *sink) {
  auto *self = GST_DDP_VAL_SINK(sink);
  if (self->engine) self->engine->set_flushing(false);
  return TRUE;
}

static GstFlowReturn flow_of(GstDdpValSink *self, ValidationEngine::Result r, const std::string &error = "") {
  post_messages(self);
  switch (r) {
    case ValidationEngine::Result::kOk:
      return GST_FLOW_OK;
    case ValidationEngine::Result::kFlushing:
      return GST_FLOW_FLUSHING;
    case ValidationEngine::Result::kEos:
      GST_INFO_OBJECT(self, "trainer finished and its last snapshot is validated");
      return GST_FLOW_EOS;
    case ValidationEngine::Result::kError:
    default:
      GST_ELEMENT_ERROR(self, STREAM, FAILED,
                        ("Validation failed: %s", (error.empty() ? self->engine->error() : error).c_str()),
                        ("shard %u of %u, rank %d of %d", self->config->shard_index, self->config->num_shards,
                         self->engine->rank(), self->engine->world_size()));
      return GST_FLOW_ERROR;
  }
}

static GstFlowReturn gst_ddp_val_sink_render(GstBaseSink *sink, GstBuffer *buf) {
  auto *self = GST_DDP_VAL_SINK(sink);
  if (!self->engine) return GST_FLOW_FLUSHING;
  if (!ensure_attached(self)) return GST_FLOW_ERROR;
  std::string error;
  ValidationEngine::Result r = validate_buffer(*self->engine, buf, &error);
  return flow_of(self, r, error);
}

static gboolean gst_ddp_val_sink_event(GstBaseSink *sink, GstEvent *event) {
  auto *self = GST_DDP_VAL_SINK(sink);
  const GstStructure *st = gst_event_get_structure(event);
  guint epoch = 0;
  if (GST_EVENT_TYPE(event) == GST_EVENT_CUSTOM_DOWNSTREAM && st && gst_structure_has_name(st, GST_VIDEOTRAIN_EPOCH_EVENT) &&
      gst_structure_get_uint(st, "epoch", &epoch) && self->engine && self->engine->attached()) {
    if (flow_of(self, self->engine->end_of_epoch(epoch)) == GST_FLOW_ERROR) {
      gst_event_unref(event);
      return FALSE;
    }
  }
  if (GST_EVENT_TYPE(event) == GST_EVENT_EOS && self->engine && self->engine->attached()) {
    // Blocks until the trainer is done; the pass it cuts short is dropped with a message.
    GstFlowReturn fr = flow_of(self, self->engine->end_of_stream());
    if (fr == GST_FLOW_ERROR) {
      gst_event_unref(event);
      return FALSE;
    }
  }
  return GST_BASE_SINK_CLASS(gst_ddp_val_sink_parent_class)->event(sink, event);
}

static gboolean gst_ddp_val_sink_set_caps(GstBaseSink *sink, GstCaps *caps) {
  TensorCapsInfo info;
  std::string why;
  if (!tensor_caps_parse(caps, &info, &why)) {
    GST_ELEMENT_ERROR(sink, STREAM, WRONG_TYPE, ("Cannot validate on these caps: %s", why.c_str()),
                      ("caps %" GST_PTR_FORMAT, caps));
    return FALSE;
  }
  return TRUE;
}

/* ---- properties ---- */

static void gst_ddp_val_sink_set_property(GObject *object, guint id, const GValue *v, GParamSpec *pspec) {
  auto *self = GST_DDP_VAL_SINK(object);
  GST_OBJECT_LOCK(self);
  auto &c = *self->config;
  switch (id) {
    case PROP_TRAINER:
      g_free(self->trainer_name);
      self->trainer_name = g_value_dup_string(v);
      break;
    case PROP_EVERY: c.every = g_value_get_uint64(v); break;
    case PROP_AT_START: c.at_start = g_value_get_boolean(v); break;
    case PROP_SKIP_IF_BUSY: c.skip_if_busy = g_value_get_boolean(v); break;
    case PROP_WEIGHTS: c.ema = g_value_get_enum(v) == 1; break;
    case PROP_ATTENTION_BACKEND: c.attention_backend = static_cast<AttentionBackend>(g_value_get_enum(v)); break;
    case PROP_SHARD_INDEX: c.shard_index = g_value_get_uint(v); break;
    case PROP_NUM_SHARDS: c.num_shards = g_value_get_uint(v); break;
    case PROP_BATCH_SIZE: c.batch_size = g_value_get_uint(v); break;
    case PROP_DEVICE: c.device = g_value_get_string(v) ? g_value_get_string(v) : ""; break;
    default: G_OBJECT_WARN_INVALID_PROPERTY_ID(object, id, pspec); break;
  }
  GST_OBJECT_UNLOCK(self);
}

static void gst_ddp_val_sink_get_property(GObject *object, guint id, GValue *v, GParamSpec *pspec) {
  auto *self = GST_DDP_VAL_SINK(object);
  GST_OBJECT_LOCK(self);
  const auto &c = *self->config;
  switch (id) {
    case PROP_TRAINER: g_value_set_string(v, self->trainer_name); break;
    case PROP_EVERY: g_value_set_uint64(v, c.every); break;
    case PROP_AT_START: g_value_set_boolean(v, c.at_start); break;
    case PROP_SKIP_IF_BUSY: g_value_set_boolean(v, c.skip_if_busy); break;
    case PROP_WEIGHTS: g_value_set_enum(v, c.ema ? 1 : 0); break;
    case PROP_ATTENTION_BACKEND: g_value_set_enum(v, static_cast<gint>(c.attention_backend)); break;
    case PROP_SHARD_INDEX: g_value_set_uint(v, c.shard_index); break;
    case PROP_NUM_SHARDS: g_value_set_uint(v, c.num_shards); break;
    case PROP_BATCH_SIZE: g_value_set_uint(v, c.batch_size); break;
    case PROP_DEVICE: g_value_set_string(v, c.device.c_str()); break;
    case PROP_LAST_LOSS: g_value_set_double(v, self->loss); break;
    case PROP_LAST_STEP: g_value_set_uint64(v, self->step); break;
    default: G_OBJECT_WARN_INVALID_PROPERTY_ID(object, id, pspec); break;
  }
  GST_OBJECT_UNLOCK(self);
}

static void gst_ddp_val_sink_finalize(GObject *object) {
  auto *self = GST_DDP_VAL_SINK(object);
  delete self->engine;
  delete self->config;
  g_free(self->trainer_name);
  delete self->run;
  G_OBJECT_CLASS(gst_ddp_val_sink_parent_class)->finalize(object);
}

static void gst_ddp_val_sink_init(GstDdpValSink *self) {
  self->config = new ValidationConfig();
  self->trainer_name = nullptr;
  self->engine = nullptr;
  self->run = new std::shared_ptr<RunContext>();
  self->loss = std::numeric_limits<double>::quiet_NaN();
  self->step = 0;
  gst_base_sink_set_sync(GST_BASE_SINK(self), FALSE);
  gst_base_sink_set_qos_enabled(GST_BASE_SINK(self), FALSE);
  // No preroll, as ddptrainsink: a tee branch that waits for us must not stall start-up.
  gst_base_sink_set_async_enabled(GST_BASE_SINK(self), FALSE);
}

static void gst_ddp_val_sink_class_init(GstDdpValSinkClass *klass) {
  auto *oc = G_OBJECT_CLASS(klass);
  auto *ec = GST_ELEMENT_CLASS(klass);
  videotrain_one_error_install(ec);  // one error per failure (one_error.h)
  auto *bc = GST_BASE_SINK_CLASS(klass);
  oc->set_property = gst_ddp_val_sink_set_property;
  oc->get_property = gst_ddp_val_sink_get_property;
  oc->finalize = gst_ddp_val_sink_finalize;
  ec->set_context = GST_DEBUG_FUNCPTR(gst_ddp_val_sink_set_context);
  bc->start = GST_DEBUG_FUNCPTR(gst_ddp_val_sink_start);
  bc->stop = GST_DEBUG_FUNCPTR(gst_ddp_val_sink_stop);
  bc->unlock = GST_DEBUG_FUNCPTR(gst_ddp_val_sink_unlock);
  bc->unlock_stop = GST_DEBUG_FUNCPTR(gst_ddp_val_sink_unlock_stop);
  bc->set_caps = GST_DEBUG_FUNCPTR(gst_ddp_val_sink_set_caps);
  bc->render = GST_DEBUG_FUNCPTR(gst_ddp_val_sink_render);
  bc->event = GST_DEBUG_FUNCPTR(gst_ddp_val_sink_event);

  const ValidationConfig d;
  const auto rw = GParamFlags(G_PARAM_READWRITE | G_PARAM_STATIC_STRINGS | GST_PARAM_MUTABLE_READY);
  const auto ro = GParamFlags(G_PARAM_READABLE | G_PARAM_STATIC_STRINGS);
  auto install = [oc](guint id, GParamSpec *p) { g_object_class_install_property(oc, id, p); };
  install(PROP_TRAINER, g_param_spec_string("trainer", "Trainer",
                                            "Name of the ddptrainsink in the same pipeline whose weights are validated",
                                            nullptr, rw));
  install(PROP_EVERY, g_param_spec_uint64("every", "Every",
                                          "Validate after every this many optimizer steps of the trainer (0: only "
                                          "at-start and at the trainer's EOS)",
                                          0, G_MAXUINT64, d.every, rw));
  install(PROP_AT_START, g_param_spec_boolean("at-start", "At start", "Also validate the weights before training (step 0)",
                                              d.at_start, rw));
  install(PROP_SKIP_IF_BUSY,
          g_param_spec_boolean("skip-if-busy", "Skip if busy",
                               "Skip a validation (ddpvalsink-skipped message) when the previous one is still running, "
                               "instead of letting the newer snapshot wait",
                               d.skip_if_busy, rw));
  install(PROP_WEIGHTS, g_param_spec_enum("weights", "Weights",
                                          "Which weights are validated: the trainer's, or the EMA it keeps "
                                          "(ddptrainsink ema-decay; an error without one)",
                                          weights_type(), 0, rw));
  install(PROP_ATTENTION_BACKEND, g_param_spec_enum("attention-backend", "Attention backend",
                            VIDEOTRAIN_ATTENTION_BACKEND_FOLLOWER_BLURB,
                            attention_backend_type(), 0, rw));
  install(PROP_SHARD_INDEX, g_param_spec_uint("shard-index", "Shard index",
                                              "This sink evaluates the clips whose index is shard-index mod num-shards",
                                              0, 1023, d.shard_index, rw));
  install(PROP_NUM_SHARDS, g_param_spec_uint("num-shards", "Shards",
                                             "ddpvalsinks of this trainer in this process (one per validation device)",
                                             1, 1024, d.num_shards, rw));
  install(PROP_BATCH_SIZE, g_param_spec_uint("batch-size", "Batch size",
                                             "Latent samples evaluated together (micro-batches keep their size)", 1,
                                             4096, d.batch_size, rw));
  install(PROP_DEVICE, g_param_spec_string("device", "Device",
                                           "Device of the validation model: auto (or empty), cpu, cuda or cuda:N; "
                                           "auto: the trainer's device",
                                           "", rw));
  install(PROP_LAST_LOSS, g_param_spec_double("last-loss", "Last loss",
                                              "Mean validation loss of the last completed validation (NaN: none yet)",
                                              -G_MAXDOUBLE, G_MAXDOUBLE, 0, ro));
  install(PROP_LAST_STEP, g_param_spec_uint64("last-step", "Last step",
                                              "Trainer step of the last completed validation", 0, G_MAXUINT64, 0, ro));

  gst_element_class_add_static_pad_template(ec, &sink_template);
  gst_element_class_set_static_metadata(
      ec, "DDP validation sink", "Sink/Tensor",
      "Validates snapshots of a ddptrainsink's weights beside training, split over ranks and devices; posts "
      "ddpvalsink-result (step, loss, samples, seconds)" VIDEOTRAIN_DOC_DDPVALSINK_MESSAGES,
      "gst-videotrain");
}
