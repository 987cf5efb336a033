/* microbatcher: the GObject face of MicroBatcherEngine.
 *
 * Latent buffers ([C, t, h, w], one per clip, with a sample meta) in; micro-batch
 * buffers ([m, C, t, h, w] with a batch meta) out. It holds at most one optimizer
 * step of samples and pushes a step's micro-batches from the streaming thread as
 * soon as the step is complete, so a blocking sink just blocks upstream. */
#include "one_error.h"
#include "gstmicrobatcher.h"
#include "bus_messages_doc.h"

#include <atomic>
#include <memory>
#include <string>
#include <vector>

#include "metas.h"
#include "microbatch_tensors.h"
#include "microbatcher_engine.h"
#include "resume_query.h"
#include "shapes_query.h"
#include "tensor_caps.h"

GST_DEBUG_CATEGORY_STATIC(microbatcher_debug);
#define GST_CAT_DEFAULT microbatcher_debug

using namespace videotrain;

namespace {

// What the engine holds per sample: the tensor and the timing of its buffer.
struct Pending {
  HeldTensor *tensor;
  GstClockTime pts;
  GstClockTime duration;
};

void release_pending(void *p) {
  auto *s = static_cast<Pending *>(p);
  release_tensor(s->tensor);
  delete s;
}

// Streaming state: touched by chain() and serialized events (stream lock) and by
// state changes once the pads are deactivated.
struct State {
  std::unique_ptr<MicroBatcherEngine> engine;
  TensorCapsInfo caps;
  bool have_caps = false;
  guint64 arrivals = 0;
  // Last valid input buffer duration, read by latency queries from any thread.
  std::atomic<gint64> sample_duration{0};
  // What downstream answered a step pushed from an event (epoch end, caps change): returned to
  // upstream with the next buffer. Without it a trainer done at max-steps (EOS) was never told
  // upstream when every step closed at an epoch end, and the source decoded on for ever.
  GstFlowReturn event_flow = GST_FLOW_OK;
};

}  // namespace

struct _GstMicroBatcher {
  GstElement parent;
  GstPad *sinkpad, *srcpad;
  MicroBatcherConfig *settings;  // the properties (object lock)
  State *state;
};

G_DEFINE_TYPE(GstMicroBatcher, gst_micro_batcher, GST_TYPE_ELEMENT);
GST_ELEMENT_REGISTER_DEFINE_WITH_CODE(microbatcher, "microbatcher", GST_RANK_NONE, GST_TYPE_MICRO_BATCHER,
                                      GST_DEBUG_CATEGORY_INIT(microbatcher_debug, "microbatcher", 0,
                                                              "Groups latents into optimizer steps and micro-batches"));

enum {
  PROP_0,
  PROP_BATCH_SIZE,
  PROP_MICRO_BATCH_SIZE,
  PROP_BUCKET,
  PROP_DROP_LAST,
  PROP_EPOCH_BOUNDARY,
  PROP_START_STEP,
};

static GstStaticPadTemplate *sink_template() {
  static GstStaticPadTemplate t = GST_STATIC_PAD_TEMPLATE(
      "sink", GST_PAD_SINK, GST_PAD_ALWAYS,
      GST_STATIC_CAPS(VIDEOTRAIN_TENSOR_MEDIA_TYPE ", content=(string)latents, "
                                                   "dtype=(string){ float32, bfloat16, float16 }"));
  return &t;
}

static GstStaticPadTemplate *src_template() {
  static GstStaticPadTemplate t = GST_STATIC_PAD_TEMPLATE(
      "src", GST_PAD_SRC, GST_PAD_ALWAYS,
      GST_STATIC_CAPS(VIDEOTRAIN_TENSOR_MEDIA_TYPE ", content=(string)micro-batch, "
                                                   "dtype=(string){ float32, bfloat16, float16 }"));
  return &t;
}

/* ---- caps ---- */

// Copy of caps with every tensor structure's content set to `content` (latents on one
// side, micro-batch on the other; dtype and device carry over unchanged).
static GstCaps *retag_caps(GstCaps *caps, const char *content) {
  GstCaps *out = gst_caps_copy(caps);
  if (gst_caps_is_any(out)) return out;
  for (guint i = 0; i < gst_caps_get_size(out); i++) {
    GstStructure *s = gst_caps_get_structure(out, i);
    if (gst_structure_has_name(s, VIDEOTRAIN_TENSOR_MEDIA_TYPE))
      gst_structure_set(s, "content", G_TYPE_STRING, content, NULL);
  }
  return out;
}

// Caps this pad can take: what the peer of the other pad takes, translated, within
// this pad's template.
static GstCaps *query_pad_caps(GstMicroBatcher *self, GstPad *pad, GstCaps *filter) {
  const bool sink = (pad == self->sinkpad);
  GstPad *other = sink ? self->srcpad : self->sinkpad;
  const char *mine = sink ? "latents" : "micro-batch";
  const char *theirs = sink ? "micro-batch" : "latents";
  GstCaps *tmpl = gst_pad_get_pad_template_caps(pad);
  GstCaps *peer_filter = filter ? retag_caps(filter, theirs) : nullptr;
  GstCaps *peer = gst_pad_peer_query_caps(other, peer_filter);
  if (peer_filter) gst_caps_unref(peer_filter);
  GstCaps *mapped = retag_caps(peer, mine);
  gst_caps_unref(peer);
  GstCaps *res = gst_caps_intersect_full(mapped, tmpl, GST_CAPS_INTERSECT_FIRST);
  gst_caps_unref(mapped);
  gst_caps_unref(tmpl);
  if (filter) {
    GstCaps *f = gst_caps_intersect_full(filter, res, GST_CAPS_INTERSECT_FIRST);
    gst_caps_unref(res);
    res = f;
  }
  return res;
}

static void close_step(GstMicroBatcher *self, const char *why);

static gboolean set_sink_caps(GstMicroBatcher *self, GstCaps *caps) {
  TensorCapsInfo info;
  std::string why;
  if (!tensor_caps_parse(caps, &info, &why) || info.content != "latents") {
    if (why.empty()) why = "content is '" + info.content + "', expected latents";
    GST_WARNING_OBJECT(self, "refusing caps %" GST_PTR_FORMAT ": %s", caps, why.c_str());
    return FALSE;
  }
  State *st = self->state;
  // Held samples were checked against the old dtype/device: emit them under the old caps.
  if (st->have_caps && (st->caps.dtype != info.dtype || st->caps.device != info.device))
    close_step(self, "caps change");
  TensorCapsInfo out = info;
  out.content = "micro-batch";
  GstCaps *src_caps = tensor_caps_new(out);
  gboolean ok = gst_pad_set_caps(self->srcpad, src_caps);
  gst_caps_unref(src_caps);
  if (!ok) {
    GST_WARNING_OBJECT(self, "downstream refused micro-batch caps for dtype=%s device=%s", info.dtype.c_str(),
                       info.device.c_str());
    return FALSE;
  }
  st->caps = info;
  st->have_caps = true;
  return TRUE;
}

/* ---- output ---- */

// Stacks and pushes micro-batches in order; stops at the first failure, releasing
// the samples of the rest.
static GstFlowReturn push_batches(GstMicroBatcher *self, std::vector<MicroBatch> &batches) {
  GstFlowReturn ret = GST_FLOW_OK;
  for (auto &mb : batches) {
    if (ret == GST_FLOW_OK) {
      std::vector<const HeldTensor *> tensors;
      GstClockTime duration = 0;
      for (const auto &s : mb.samples) {
        auto *p = static_cast<const Pending *>(s.handle);
        tensors.push_back(p->tensor);
        duration = (GST_CLOCK_TIME_IS_VALID(duration) && GST_CLOCK_TIME_IS_VALID(p->duration))
                       ? duration + p->duration
                       : GST_CLOCK_TIME_NONE;
      }
      std::string why;
      GstBuffer *out = stack_tensors(tensors, &why);
      if (!out) {
        GST_ELEMENT_ERROR(self, STREAM, FAILED,
                          ("Cannot stack micro-batch %u of step %" G_GUINT64_FORMAT " (samples %" G_GUINT64_FORMAT
                           "...): %s",
                           mb.micro_index, mb.step, mb.samples.front().sample_id, why.c_str()),
                          (nullptr));
        ret = GST_FLOW_ERROR;
      } else {
        GST_BUFFER_PTS(out) = static_cast<const Pending *>(mb.samples.front().handle)->pts;
        GST_BUFFER_DURATION(out) = duration;
        GstVideoTrainBatchMeta *meta = gst_buffer_add_videotrain_batch_meta(out);
        meta->step = mb.step;
        meta->micro_index = mb.micro_index;
        meta->micro_count = mb.micro_count;
        meta->step_samples = mb.step_samples;
        meta->sync = mb.sync;
        meta->epoch = mb.epoch;
        meta->next_clip = mb.next_clip;
        for (const auto &s : mb.samples)
          gst_videotrain_batch_meta_append(meta, s.sample_id, s.epoch, s.clip_index, s.caption.c_str(), s.padding);
        GST_LOG_OBJECT(self, "step %" G_GUINT64_FORMAT " micro-batch %u/%u: %zu samples %s%s", mb.step,
                       mb.micro_index + 1, mb.micro_count, mb.samples.size(),
                       shape_string(mb.samples.front().shape).c_str(), mb.sync ? " (sync)" : "");
        // Our references go before the push: downstream may hold the buffer long.
        for (auto &s : mb.samples) release_pending(s.handle);
        mb.samples.clear();
        ret = gst_pad_push(self->srcpad, out);
        if (ret != GST_FLOW_OK) GST_DEBUG_OBJECT(self, "push returned %s", gst_flow_get_name(ret));
      }
    }
    for (auto &s : mb.samples) release_pending(s.handle);
    mb.samples.clear();
  }
  batches.clear();
  return ret;
}

/* ---- streaming ---- */

static GstFlowReturn gst_micro_batcher_chain(GstPad *, GstObject *parent, GstBuffer *buf) {
  auto *self = GST_MICRO_BATCHER(parent);
  State *st = self->state;
  if (st->event_flow != GST_FLOW_OK) {  // downstream is done (EOS) or failed: upstream hears it now
    gst_buffer_unref(buf);
    return st->event_flow;
  }
  const guint64 n = st->arrivals++;
  if (!st->have_caps || !st->engine) {
    gst_buffer_unref(buf);
    GST_ELEMENT_ERROR(self, CORE, NEGOTIATION, ("Latent buffer %" G_GUINT64_FORMAT " arrived before caps", n),
                      (nullptr));
    return GST_FLOW_NOT_NEGOTIATED;
  }
  const GstVideoTrainSampleMeta *sm = gst_buffer_get_videotrain_sample_meta(buf);
  if (!sm) {
    GST_ELEMENT_ERROR(self, STREAM, FORMAT,
                      ("Latent buffer %" G_GUINT64_FORMAT " (pts %" GST_TIME_FORMAT ") has no sample meta", n,
                       GST_TIME_ARGS(GST_BUFFER_PTS(buf))),
                      ("microbatcher needs the GstVideoTrainSampleMeta (sample id, epoch, clip, caption) that "
                       "vaeencoder attaches to each latent buffer"));
    gst_buffer_unref(buf);
    return GST_FLOW_ERROR;
  }
  std::string why;
  HeldTensor *t = hold_tensor(buf, st->caps, &why);
  if (!t) {
    GST_ELEMENT_ERROR(self, STREAM, FORMAT,
                      ("Cannot batch sample %" G_GUINT64_FORMAT " (epoch %u, clip %" G_GUINT64_FORMAT ", %s): %s",
                       sm->sample_id, sm->epoch, sm->clip_index, sm->path ? sm->path : "no path", why.c_str()),
                      ("latent buffer %" G_GUINT64_FORMAT, n));
    gst_buffer_unref(buf);
    return GST_FLOW_ERROR;
  }
  if (GST_BUFFER_DURATION_IS_VALID(buf))
    st->sample_duration = (gint64)GST_BUFFER_DURATION(buf);

  MicroBatcherSample s;
  s.handle = new Pending{t, GST_BUFFER_PTS(buf), GST_BUFFER_DURATION(buf)};
  s.shape = held_shape(t);
  s.sample_id = sm->sample_id;
  s.epoch = sm->epoch;
  s.clip_index = sm->clip_index;
  s.padding = sm->padding;
  s.group = sm->group;
  s.group_size = sm->group_size;
  s.caption = sm->caption ? sm->caption : "";
  gst_buffer_unref(buf);

  std::vector<MicroBatch> out;
  if (!st->engine->push(std::move(s), &out, &why)) {
    GST_ELEMENT_ERROR(self, STREAM, FORMAT, ("Cannot batch: %s", why.c_str()), ("latent buffer %" G_GUINT64_FORMAT, n));
    push_batches(self, out);
    return GST_FLOW_ERROR;
  }
  return push_batches(self, out);
}

// Closes the step in progress (epoch end, EOS) and pushes it.
static void close_step(GstMicroBatcher *self, const char *why) {
  State *st = self->state;
  if (!st->engine || st->engine->held() == 0) return;
  GST_DEBUG_OBJECT(self, "%s: closing a partial step of %zu samples", why, st->engine->held());
  std::vector<MicroBatch> out;
  st->engine->finish(&out);
  const GstFlowReturn ret = push_batches(self, out);
  if (ret != GST_FLOW_OK) {
    GST_DEBUG_OBJECT(self, "%s: downstream answered %s", why, gst_flow_get_name(ret));
    st->event_flow = ret;
  }
}

static gboolean gst_micro_batcher_sink_event(GstPad *pad, GstObject *parent, GstEvent *event) {
  auto *self = GST_MICRO_BATCHER(parent);
  switch (GST_EVENT_TYPE(event)) {
    case GST_EVENT_CAPS: {
      GstCaps *caps;
      gst_event_parse_caps(event, &caps);
      gboolean ok = set_sink_caps(self, caps);
      gst_event_unref(event);
      return ok;
    }
    case GST_EVENT_EOS:
      close_step(self, "EOS");
      break;
    case GST_EVENT_FLUSH_STOP:
      self->state->event_flow = GST_FLOW_OK;
      if (self->state->engine) {
        GST_DEBUG_OBJECT(self, "flush: dropping %zu held samples", self->state->engine->held());
        self->state->engine->flush();
      }
      break;
    case GST_EVENT_CUSTOM_DOWNSTREAM: {
      const GstStructure *s = gst_event_get_structure(event);
      GST_OBJECT_LOCK(self);
      const bool boundary = self->settings->epoch_boundary;
      GST_OBJECT_UNLOCK(self);
      if (boundary && s && gst_structure_has_name(s, GST_VIDEOTRAIN_EPOCH_EVENT))
        close_step(self, "epoch end event");
      break;
    }
    default:
      break;
  }
  return gst_pad_event_default(pad, parent, event);
}

// Both pads: the peer's caps with the content field translated (see query_pad_caps).
static gboolean answer_caps_query(GstMicroBatcher *self, GstPad *pad, GstQuery *query) {
  GstCaps *filter;
  gst_query_parse_caps(query, &filter);
  GstCaps *caps = query_pad_caps(self, pad, filter);
  gst_query_set_caps_result(query, caps);
  gst_caps_unref(caps);
  return TRUE;
}

static gboolean gst_micro_batcher_sink_query(GstPad *pad, GstObject *parent, GstQuery *query) {
  auto *self = GST_MICRO_BATCHER(parent);
  if (videotrain_is_resume_query(query)) {
    // The trainer's answer also says which step comes next: number the steps from it.
    gboolean ok = gst_pad_query_default(pad, parent, query);
    VideoTrainResumePosition pos;
    if (ok && videotrain_resume_query_parse(query, &pos) && self->state->engine) {
      GST_INFO_OBJECT(self, "resuming: next step %" G_GUINT64_FORMAT, pos.step);
      self->state->engine->restart_steps_at(pos.step);
    }
    return ok;
  }
  std::vector<ClipShape> shapes;
  if (parse_shapes_query(query, &shapes)) {
    // csvvideosrc with buckets groups its clips into steps of this many samples.
    GST_OBJECT_LOCK(self);
    const guint batch = self->settings->batch_size;
    GST_OBJECT_UNLOCK(self);
    shapes_query_set_step_samples(query, batch);
    return TRUE;
  }
  switch (GST_QUERY_TYPE(query)) {
    case GST_QUERY_CAPS:
      return answer_caps_query(self, pad, query);
    case GST_QUERY_ALLOCATION:
      return FALSE;  // output buffers are new tensors, never upstream's
    default:
      return gst_pad_query_default(pad, parent, query);
  }
}

/* Latency: a sample can wait for batch-size - 1 later ones. With a known per-sample
 * duration (from the input buffers) that is added to min and max; without one the
 * wait has no bound in time, so min is left as it is and max becomes unlimited. */
static gboolean gst_micro_batcher_src_query(GstPad *pad, GstObject *parent, GstQuery *query) {
  auto *self = GST_MICRO_BATCHER(parent);
  switch (GST_QUERY_TYPE(query)) {
    case GST_QUERY_CAPS:
      return answer_caps_query(self, pad, query);
    case GST_QUERY_LATENCY: {
      if (!gst_pad_peer_query(self->sinkpad, query)) return FALSE;
      gboolean live;
      GstClockTime min, max;
      gst_query_parse_latency(query, &live, &min, &max);
      GST_OBJECT_LOCK(self);
      const guint held = self->settings->batch_size > 0 ? self->settings->batch_size - 1 : 0;
      GST_OBJECT_UNLOCK(self);
      const gint64 dur = self->state->sample_duration.load();
      if (dur > 0) {
        const GstClockTime extra = (GstClockTime)dur * held;
        min += extra;
        if (GST_CLOCK_TIME_IS_VALID(max)) max += extra;
      } else if (held > 0) {
        max = GST_CLOCK_TIME_NONE;
      }
      GST_DEBUG_OBJECT(self, "latency: live %d min %" GST_TIME_FORMAT " max %" GST_TIME_FORMAT, live,
                       GST_TIME_ARGS(min), GST_TIME_ARGS(max));
      gst_query_set_latency(query, live, min, max);
      return TRUE;
    }
    default:
      return gst_pad_query_default(pad, parent, query);
  }
}

/* ---- state ---- */

static GstStateChangeReturn gst_micro_batcher_change_state(GstElement *element, GstStateChange transition) {
  auto *self = GST_MICRO_BATCHER(element);
  if (transition == GST_STATE_CHANGE_READY_TO_PAUSED) {
    GST_OBJECT_LOCK(self);
    const MicroBatcherConfig cfg = *self->settings;
    GST_OBJECT_UNLOCK(self);
    std::string why;
    if (!MicroBatcherEngine::validate(cfg, &why)) {
      GST_ELEMENT_ERROR(self, LIBRARY, SETTINGS, ("Invalid microbatcher settings: %s", why.c_str()),
                        ("batch-size=%u micro-batch-size=%u", cfg.batch_size, cfg.micro_batch_size));
      return GST_STATE_CHANGE_FAILURE;
    }
    self->state->engine = std::make_unique<MicroBatcherEngine>(cfg, release_pending);
    self->state->have_caps = false;
    self->state->arrivals = 0;
    self->state->sample_duration = 0;
    GST_INFO_OBJECT(self, "batch-size %u, micro-batch-size %u, bucket %d, drop-last %d, start-step %" G_GUINT64_FORMAT,
                    cfg.batch_size, cfg.effective_micro_batch_size(), cfg.bucket, cfg.drop_last, cfg.start_step);
  }
  GstStateChangeReturn ret = GST_ELEMENT_CLASS(gst_micro_batcher_parent_class)->change_state(element, transition);
  if (transition == GST_STATE_CHANGE_PAUSED_TO_READY) {
    // Pads are deactivated: no streaming thread touches the state any more.
    self->state->engine.reset();
    self->state->have_caps = false;
  }
  return ret;
}

/* ---- properties ---- */

static void gst_micro_batcher_set_property(GObject *object, guint id, const GValue *v, GParamSpec *pspec) {
  auto *self = GST_MICRO_BATCHER(object);
  GST_OBJECT_LOCK(self);
  MicroBatcherConfig &c = *self->settings;
  switch (id) {
    case PROP_BATCH_SIZE: c.batch_size = g_value_get_uint(v); break;
    case PROP_MICRO_BATCH_SIZE: c.micro_batch_size = g_value_get_uint(v); break;
    case PROP_BUCKET: c.bucket = g_value_get_boolean(v); break;
    case PROP_DROP_LAST: c.drop_last = g_value_get_boolean(v); break;
    case PROP_EPOCH_BOUNDARY: c.epoch_boundary = g_value_get_boolean(v); break;
    case PROP_START_STEP: c.start_step = g_value_get_uint64(v); break;
    default: G_OBJECT_WARN_INVALID_PROPERTY_ID(object, id, pspec); break;
  }
  GST_OBJECT_UNLOCK(self);
}

static void gst_micro_batcher_get_property(GObject *object, guint id, GValue *v, GParamSpec *pspec) {
  auto *self = GST_MICRO_BATCHER(object);
  GST_OBJECT_LOCK(self);
  const MicroBatcherConfig &c = *self->settings;
  switch (id) {
    case PROP_BATCH_SIZE: g_value_set_uint(v, c.batch_size); break;
    case PROP_MICRO_BATCH_SIZE: g_value_set_uint(v, c.micro_batch_size); break;
    case PROP_BUCKET: g_value_set_boolean(v, c.bucket); break;
    case PROP_DROP_LAST: g_value_set_boolean(v, c.drop_last); break;
    case PROP_EPOCH_BOUNDARY: g_value_set_boolean(v, c.epoch_boundary); break;
    case PROP_START_STEP: g_value_set_uint64(v, c.start_step); break;
    default: G_OBJECT_WARN_INVALID_PROPERTY_ID(object, id, pspec); break;
  }
  GST_OBJECT_UNLOCK(self);
}

static void gst_micro_batcher_finalize(GObject *object) {
  auto *self = GST_MICRO_BATCHER(object);
  delete self->state;
  self->state = nullptr;
  delete self->settings;
  G_OBJECT_CLASS(gst_micro_batcher_parent_class)->finalize(object);
}

static void gst_micro_batcher_init(GstMicroBatcher *self) {
  self->settings = new MicroBatcherConfig();
  self->state = new State();

  self->sinkpad = gst_pad_new_from_static_template(sink_template(), "sink");
  gst_pad_set_chain_function(self->sinkpad, GST_DEBUG_FUNCPTR(gst_micro_batcher_chain));
  gst_pad_set_event_function(self->sinkpad, GST_DEBUG_FUNCPTR(gst_micro_batcher_sink_event));
  gst_pad_set_query_function(self->sinkpad, GST_DEBUG_FUNCPTR(gst_micro_batcher_sink_query));
  GST_PAD_SET_ACCEPT_TEMPLATE(self->sinkpad);  // unknown content is refused at accept-caps
  gst_element_add_pad(GST_ELEMENT(self), self->sinkpad);

  self->srcpad = gst_pad_new_from_static_template(src_template(), "src");
  gst_pad_set_query_function(self->srcpad, GST_DEBUG_FUNCPTR(gst_micro_batcher_src_query));
  gst_element_add_pad(GST_ELEMENT(self), self->srcpad);
}

static void gst_micro_batcher_class_init(GstMicroBatcherClass *klass) {
  auto *oc = G_OBJECT_CLASS(klass);
  auto *ec = GST_ELEMENT_CLASS(klass);
  videotrain_one_error_install(ec);  // one error per failure (one_error.h)
  oc->set_property = gst_micro_batcher_set_property;
  oc->get_property = gst_micro_batcher_get_property;
  oc->finalize = gst_micro_batcher_finalize;
  ec->change_state = GST_DEBUG_FUNCPTR(gst_micro_batcher_change_state);

  const MicroBatcherConfig d;  // the defaults
  const auto rw = GParamFlags(G_PARAM_READWRITE | G_PARAM_STATIC_STRINGS | GST_PARAM_MUTABLE_READY);
  g_object_class_install_property(
      oc, PROP_BATCH_SIZE,
      g_param_spec_uint("batch-size", "Batch size", "Samples per rank per optimizer step", 1, G_MAXINT,
                        d.batch_size, rw));
  g_object_class_install_property(
      oc, PROP_MICRO_BATCH_SIZE,
      g_param_spec_uint("micro-batch-size", "Micro-batch size",
                        "Samples per forward/backward pass (gradients accumulate over a step's micro-batches); "
                        "must divide batch-size; 0: equal to batch-size",
                        0, G_MAXINT, d.micro_batch_size, rw));
  g_object_class_install_property(
      oc, PROP_BUCKET,
      g_param_spec_boolean("bucket", "Bucket by shape",
                           "Group a step's samples by latent shape so that a micro-batch never mixes shapes; "
                           "when false, samples stay in arrival order and a shape mismatch in a micro-batch is an "
                           "error",
                           d.bucket, rw));
  g_object_class_install_property(
      oc, PROP_DROP_LAST,
      g_param_spec_boolean("drop-last", "Drop last",
                           "Drop a partial step at an epoch end or EOS instead of emitting it (never a csvvideosrc "
                           "bucket group: every rank runs each of its groups as a step)",
                           d.drop_last, rw));
  g_object_class_install_property(
      oc, PROP_EPOCH_BOUNDARY,
      g_param_spec_boolean("epoch-boundary", "Epoch boundary",
                           "End the step in progress at csvvideosrc's epoch-end event (csvvideosrc-epoch), so that steps never span two epochs",
                           d.epoch_boundary, rw));
  g_object_class_install_property(
      oc, PROP_START_STEP,
      g_param_spec_uint64("start-step", "Start step", "Number of the first optimizer step (to resume a run)", 0,
                          G_MAXUINT64, d.start_step, rw));

  gst_element_class_add_static_pad_template(ec, sink_template());
  gst_element_class_add_static_pad_template(ec, src_template());
  gst_element_class_set_static_metadata(
      ec, "Micro-batcher", "Filter/Tensor",
      "Groups same-shape latents into optimizer steps of batch-size samples, split into micro-batches of "
      "micro-batch-size, and marks the last micro-batch of each step for gradient synchronisation" VIDEOTRAIN_DOC_MICROBATCHER_MESSAGES,
      "gst-videotrain");
}
