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
#include "tensor_caps.h"
#include "trainer_follower.h"
#include "val_buffers.h"
#include "validation_engine.h"

GST_DEBUG_CATEGORY_STATIC(ddpvalsink_debug);
#define GST_CAT_DEFAULT ddpvalsink_debug

using namespace videotrain;

struct _GstDdpValSink {
  GstBaseSink parent;
  ValidationConfig *config;            // properties (object lock)
  TrainerFollower *follower;           // trainer property and its run (object lock)
  ValidationEngine *engine;            // streaming thread; created in start()
  gdouble loss;                        // read-only mirrors (object lock)
  guint64 step;
};

G_DEFINE_TYPE(GstDdpValSink, gst_ddp_val_sink, GST_TYPE_BASE_SINK);
GST_ELEMENT_REGISTER_DEFINE_WITH_CODE(ddpvalsink, "ddpvalsink", GST_RANK_NONE, GST_TYPE_DDP_VAL_SINK,
                                      GST_DEBUG_CATEGORY_INIT(ddpvalsink_debug, "ddpvalsink", 0,
                                                              "Distributed validation sink"));

enum {
  PROP_0,
  PROP_FOLLOWER,  // trainer, every, at-start, skip-if-busy, weights (trainer_follower.h)
  PROP_ATTENTION_BACKEND = PROP_FOLLOWER + kFollowerProperties,
  PROP_SHARD_INDEX,
  PROP_NUM_SHARDS,
  PROP_BATCH_SIZE,
  PROP_DEVICE,
  PROP_LAST_LOSS,
  PROP_LAST_STEP,
};

VIDEOTRAIN_DEFINE_ENUM(weights_type, "GstDdpValSinkWeights", VIDEOTRAIN_FOLLOWER_WEIGHTS_ENUM_VALUES)
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

// Attaches the engine to the trainer's run (asked of the bins unless held) once it exists.
// FALSE: error posted.
static gboolean ensure_attached(GstDdpValSink *self) {
  if (self->engine->attached()) return TRUE;
  std::string why;
  auto run = follower_run(GST_ELEMENT(self), *self->follower, &why);
  if (!run) {
    GST_ELEMENT_ERROR(self, RESOURCE, NOT_FOUND, ("%s", why.c_str()), (nullptr));
    return FALSE;
  }
  if (!self->engine->attach(run)) {
    GST_ELEMENT_ERROR(self, RESOURCE, SETTINGS, ("Cannot start validation: %s", self->engine->error().c_str()),
                      (nullptr));
    return FALSE;
  }
  GST_INFO_OBJECT(self, "validating for '%s': shard %u of %u, rank %d of %d",
                  follower_trainer(GST_ELEMENT(self), *self->follower).c_str(),
                  self->config->shard_index, self->config->num_shards, self->engine->rank(),
                  self->engine->world_size());
  return TRUE;
}

static void gst_ddp_val_sink_set_context(GstElement *element, GstContext *context) {
  follower_set_context(element, *GST_DDP_VAL_SINK(element)->follower, context);  // null run: the trainer stopped
  GST_ELEMENT_CLASS(gst_ddp_val_sink_parent_class)->set_context(element, context);
}

static gboolean gst_ddp_val_sink_start(GstBaseSink *sink) {
  auto *self = GST_DDP_VAL_SINK(sink);
  GST_OBJECT_LOCK(self);
  ValidationConfig cfg = *self->config;
  GST_OBJECT_UNLOCK(self);
  if (follower_trainer(GST_ELEMENT(self), *self->follower).empty()) {
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
  std::string why;
  if (follower_run(GST_ELEMENT(self), *self->follower, &why)) return ensure_attached(self);
  why = follower_start_problem(GST_ELEMENT(self), *self->follower);
  if (!why.empty()) GST_ELEMENT_ERROR(self, RESOURCE, NOT_FOUND, ("%s", why.c_str()), (nullptr));
  return why.empty();
}

static gboolean gst_ddp_val_sink_stop(GstBaseSink *sink) {
  auto *self = GST_DDP_VAL_SINK(sink);
  delete self->engine;  // detaches from the hub
  self->engine = nullptr;
  GST_OBJECT_LOCK(self);
  self->follower->run.reset();  // a restart asks again (the trainer may have restarted too)
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
  if (follower_set_property(*self->follower, c, PROP_FOLLOWER, id, v)) id = PROP_0;  // done
  switch (id) {
    case PROP_0: break;
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
  if (follower_get_property(*self->follower, c, PROP_FOLLOWER, id, v)) id = PROP_0;  // done
  switch (id) {
    case PROP_0: break;
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
  delete self->follower;
  G_OBJECT_CLASS(gst_ddp_val_sink_parent_class)->finalize(object);
}

static void gst_ddp_val_sink_init(GstDdpValSink *self) {
  self->config = new ValidationConfig();
  self->follower = new TrainerFollower();
  self->engine = nullptr;
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
  follower_install_properties(
      oc, PROP_FOLLOWER,
      {"Name of the ddptrainsink in the same pipeline whose weights are validated",
       "Validate after every this many optimizer steps of the trainer (0: only at-start and at the trainer's EOS)",
       "Also validate the weights before training (step 0)",
       "Skip a validation (ddpvalsink-skipped message) when the previous one is still running, instead of letting "
       "the newer snapshot wait",
       "Which weights are validated: the trainer's, or the EMA it keeps (ddptrainsink ema-decay; an error without "
       "one)"},
      weights_type());
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
