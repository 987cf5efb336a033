/* vaeencoder: the GObject face of VaeEngine.
 *
 * Frames (video/x-raw RGB, one buffer per frame, each with a clip meta) go to the engine
 * as they arrive; the engine encodes each temporal chunk as soon as its frames are in and
 * releases them. When a clip's last frame is in, one latent buffer goes out, with the
 * clip's sample meta, the first frame's PTS and a duration spanning the clip.
 * A clip that cannot be encoded is dropped with a warning and a `vaeencoder-dropped`
 * element message (sample-id, reason); the stream goes on. A failure that every clip would
 * meet (a clip length the VAE cannot use, an encoder that fails on the first clip) is an
 * element error instead: dropping every clip would loop forever with num-epochs=0. */
#include "one_error.h"
#include "gstvaeencoder.h"
#include "bus_messages_doc.h"

#include <gst/video/video.h>

#include <memory>
#include <string>

#include "cpu_heap.h"
#include "first_line.h"
#include "gst_enum.h"
#include "metas.h"
#include "tensor_caps.h"
#include "cache_protocol.h"
#include "shapes_query.h"
#include "latent_cache.h"
#include "string_property.h"
#include "vae_engine.h"
#include "vaeencoder_settings.h"

GST_DEBUG_CATEGORY_STATIC(vaeencoder_debug);
#define GST_CAT_DEFAULT vaeencoder_debug

using namespace videotrain;
using videotrain::vae::CacheMode;
using videotrain::vae::Condition;
using videotrain::vae::DroppedClip;
using videotrain::vae::FrameInfo;
using videotrain::vae::FrameOutcome;
using videotrain::vae::LatentCache;
using videotrain::vae::LatentKind;
using videotrain::vae::NormScope;
using videotrain::vae::VaeEncoderSettings;
using videotrain::vae::VaeEngine;

struct _GstVaeEncoder {
  GstElement parent;
  GstPad *sinkpad, *srcpad;
  VaeEncoderSettings *settings;  // the properties (object lock)
  // Streaming state (stream lock).
  std::unique_ptr<VaeEngine> *engine;
  std::unique_ptr<LatentCache> *cache;  // set from READY with cache-dir; its own lock
  GstVideoInfo vinfo;
  gboolean have_info;
  GstClockTime last_clip_duration;
  guint64 clips_encoded, clips_dropped;
};

G_DEFINE_TYPE(GstVaeEncoder, gst_vae_encoder, GST_TYPE_ELEMENT);
GST_ELEMENT_REGISTER_DEFINE_WITH_CODE(vaeencoder, "vaeencoder", GST_RANK_NONE, GST_TYPE_VAE_ENCODER,
                                      GST_DEBUG_CATEGORY_INIT(vaeencoder_debug, "vaeencoder", 0,
                                                              "Chunked causal 3D VAE encoder"));

enum {
  PROP_0,
  PROP_MODEL,
  PROP_PER_FRAME,
  PROP_MICRO_BATCH_SIZE,
  PROP_CHUNK_FRAMES,
  PROP_TILE_HEIGHT,
  PROP_TILE_WIDTH,
  PROP_TILE_OVERLAP_HEIGHT,
  PROP_TILE_OVERLAP_WIDTH,
  PROP_LATENT,
  PROP_SEED,
  PROP_DEVICE,
  PROP_DTYPE,
  PROP_TUNE_MALLOC,
  PROP_CLIPS_ENCODED,
  PROP_CLIPS_DROPPED,
  PROP_NORM_SCOPE,
  PROP_CACHE_DIR,
  PROP_CACHE_MODE,
  PROP_CACHE_HITS,
  PROP_CACHE_MISSES,
  PROP_CONDITION,
};

static GstStaticPadTemplate sink_template = GST_STATIC_PAD_TEMPLATE(
    "sink", GST_PAD_SINK, GST_PAD_ALWAYS,
    GST_STATIC_CAPS("video/x-raw, format=(string)RGB, width=(int)[1, 16384], height=(int)[1, 16384], "
                    "framerate=(fraction)[0/1, 1000/1]"));

VIDEOTRAIN_DEFINE_ENUM(gst_vae_encoder_latent_get_type, "GstVaeEncoderLatent",
                       {(gint)LatentKind::Sample,
                        "Posterior sample (mean + std * noise drawn from seed, sample id and epoch) times "
                        "scaling_factor",
                        "sample"},
                       {(gint)LatentKind::Mode, "Posterior mean times scaling_factor", "mode"},
                       {(gint)LatentKind::Moments, "Mean and log-variance concatenated on channels (unscaled)",
                        "moments"})
VIDEOTRAIN_DEFINE_ENUM(gst_vae_encoder_norm_scope_get_type, "GstVaeEncoderNormScope",
                       {(gint)NormScope::Chunk,
                        "GroupNorm statistics per temporal chunk, as diffusers' chunked encode", "chunk"},
                       {(gint)NormScope::Clip,
                        "GroupNorm statistics over the whole clip (and frame), as a single pass", "clip"})
VIDEOTRAIN_DEFINE_ENUM(gst_vae_encoder_condition_get_type, "GstVaeEncoderCondition",
                       {(gint)Condition::None, "No image condition (text-to-video)", "none"},
                       {(gint)Condition::First, "The clip's first frame, then zeros (Wan I2V)", "first-frame"},
                       {(gint)Condition::FirstLast, "The clip's first and last frames, zeros between (Wan FLF2V)",
                        "first-last-frame"})
VIDEOTRAIN_DEFINE_ENUM(gst_vae_encoder_cache_mode_get_type, "GstVaeEncoderCacheMode",
                       {(gint)CacheMode::ReadWrite, "Use cached clips and store the ones encoded", "readwrite"},
                       {(gint)CacheMode::Read, "Use cached clips, store nothing (a read-only cache)", "read"},
                       {(gint)CacheMode::Write, "Encode every clip and store it (refill)", "write"})

static VaeEngine *engine_of(GstVaeEncoder *self) { return self->engine ? self->engine->get() : nullptr; }
static LatentCache *cache_of(GstVaeEncoder *self) { return self->cache ? self->cache->get() : nullptr; }

static void clear_clip(GstVaeEncoder *self) {
  if (VaeEngine *e = engine_of(self)) e->reset_framing();
}

// Warning + element message for one clip that will not come out.
static void drop_clip(GstVaeEncoder *self, const DroppedClip &d) {
  GST_WARNING_OBJECT(self, "dropping clip of sample %" G_GUINT64_FORMAT ": %s", d.sample_id, d.reason.c_str());
  GST_ELEMENT_WARNING(self, STREAM, DECODE, ("Dropped the clip of sample %" G_GUINT64_FORMAT, d.sample_id),
                      ("%s", d.reason.c_str()));
  GstStructure *s = gst_structure_new("vaeencoder-dropped", "sample-id", G_TYPE_UINT64, d.sample_id, "reason",
                                      G_TYPE_STRING, d.reason.c_str(), "epoch", G_TYPE_UINT, d.epoch, "clip-index",
                                      G_TYPE_UINT64, d.clip_index, "num-frames", G_TYPE_UINT, d.num_frames, nullptr);
  gst_element_post_message(GST_ELEMENT(self), gst_message_new_element(GST_OBJECT(self), s));
  GST_OBJECT_LOCK(self);
  self->clips_dropped++;
  GST_OBJECT_UNLOCK(self);
}

// A failure from the settings or the model, not the clip: an element error, the stream stops.
static GstFlowReturn settings_error(GstVaeEncoder *self, const std::string &why) {
  GST_ELEMENT_ERROR(self, RESOURCE, SETTINGS, ("Cannot encode clips with these settings: %s", why.c_str()),
                    ("model %s", engine_of(self)->options().model.c_str()));
  clear_clip(self);
  return GST_FLOW_ERROR;
}

// Out of memory even with the smallest tiles: later clips would fail the same way.
static GstFlowReturn out_of_memory_error(GstVaeEncoder *self, const std::string &why) {
  GST_ELEMENT_ERROR(self, RESOURCE, NO_SPACE_LEFT, ("VAE encoder ran out of memory"),
                    ("%s; lower chunk-frames, set smaller tile-height/tile-width or use smaller frames", why.c_str()));
  clear_clip(self);
  return GST_FLOW_ERROR;
}

static void add_sample_meta(GstBuffer *out, const FrameInfo &clip) {
  GstVideoTrainSampleMeta *m = gst_buffer_add_videotrain_sample_meta(out, clip.caption.c_str(), clip.path.c_str());
  m->sample_id = clip.sample_id;
  m->epoch = clip.epoch;
  m->clip_index = clip.clip_index;
  m->padding = clip.padding;
  m->group = clip.group;
  m->group_size = clip.group_size;
}

// A finished clip's latent: its sample meta, into the cache, downstream.
static GstFlowReturn push_latent(GstVaeEncoder *self, FrameOutcome &r) {
  GstBuffer *out = r.latent;
  const FrameInfo &clip = r.clip;
  add_sample_meta(out, clip);
  if (LatentCache *cache = cache_of(self)) {
    CacheEntry entry;
    std::string err;
    if (engine_of(self)->last_moments(&entry) &&
        !cache->store(clip.sample_id, clip.epoch, clip.clip_index, entry, &err))
      GST_ELEMENT_WARNING(self, RESOURCE, WRITE, ("Cannot write to the latent cache"), ("%s (property cache-dir)", err.c_str()));
  }
  GST_BUFFER_PTS(out) = r.pts;
  GST_BUFFER_DTS(out) = GST_CLOCK_TIME_NONE;
  if (GST_CLOCK_TIME_IS_VALID(r.duration)) {
    GST_BUFFER_DURATION(out) = r.duration;
    self->last_clip_duration = r.duration;
  }
  GST_OBJECT_LOCK(self);
  self->clips_encoded++;
  GST_OBJECT_UNLOCK(self);
  return gst_pad_push(self->srcpad, out);
}

// The values of a frame's buffer and clip meta that the engine frames clips with.
static FrameInfo frame_info(GstVaeEncoder *self, GstBuffer *buf, const GstVideoTrainClipMeta *meta) {
  FrameInfo f;
  f.sample_id = meta->sample_id;
  f.epoch = meta->epoch;
  f.clip_index = meta->clip_index;
  f.frame_index = meta->frame_index;
  f.num_frames = meta->num_frames;
  f.width = GST_VIDEO_INFO_WIDTH(&self->vinfo);
  f.height = GST_VIDEO_INFO_HEIGHT(&self->vinfo);
  f.pts = GST_BUFFER_PTS(buf);
  f.duration = GST_BUFFER_DURATION(buf);
  if (meta->frame_index == 0) {
    f.padding = meta->padding;
    f.group = meta->group;
    f.group_size = meta->group_size;
    f.caption = meta->caption ? meta->caption : "";
    f.path = meta->path ? meta->path : "";
  }
  return f;
}

static GstFlowReturn chain(GstVaeEncoder *self, GstBuffer *buf) {
  VaeEngine *eng = engine_of(self);
  if (!eng || !self->have_info) {
    gst_buffer_unref(buf);
    GST_ELEMENT_ERROR(self, CORE, NEGOTIATION, ("Frames arrived before caps or before the model was loaded"),
                      (nullptr));
    return GST_FLOW_NOT_NEGOTIATED;
  }
  const GstVideoTrainClipMeta *meta = gst_buffer_get_videotrain_clip_meta(buf);
  if (!meta) {
    gst_buffer_unref(buf);
    GST_ELEMENT_ERROR(self, STREAM, FORMAT, ("Frames carry no clip meta"),
                      ("vaeencoder needs to know where clips start and how many frames they hold: feed it from "
                       "csvvideosrc (or attach a GstVideoTrainClipMeta to every frame)"));
    return GST_FLOW_ERROR;
  }
  const FrameInfo info = frame_info(self, buf, meta);
  GstVideoFrame frame;
  const bool mapped = gst_video_frame_map(&frame, &self->vinfo, buf, GST_MAP_READ);
  // An unmappable (too small) buffer goes in as null: the engine drops its clip.
  const auto *rgb = mapped ? static_cast<const uint8_t *>(GST_VIDEO_FRAME_PLANE_DATA(&frame, 0)) : nullptr;
  FrameOutcome r = eng->push(info, rgb, mapped ? GST_VIDEO_FRAME_PLANE_STRIDE(&frame, 0) : 0, gst_buffer_get_size(buf));
  if (mapped) gst_video_frame_unmap(&frame);
  gst_buffer_unref(buf);
  for (const DroppedClip &d : r.dropped) drop_clip(self, d);
  switch (r.kind) {
    case FrameOutcome::Kind::kSettingsError:
      return settings_error(self, r.error);
    case FrameOutcome::Kind::kOutOfMemory:
      return out_of_memory_error(self, r.error);
    case FrameOutcome::Kind::kLatent:
      return push_latent(self, r);
    case FrameOutcome::Kind::kAccepted:
      break;
  }
  return GST_FLOW_OK;
}

// Nothing may unwind into GStreamer's C frames (std::terminate): an exception the engine did
// not turn into a reason (bad_alloc outside an encode, say) is an element error.
static GstFlowReturn gst_vae_encoder_chain(GstPad *, GstObject *parent, GstBuffer *buf) {
  auto *self = GST_VAE_ENCODER(parent);
  std::string what;
  try {
    return chain(self, buf);
  } catch (const std::exception &e) {
    what = first_line(e.what());
  } catch (...) {
    what = "unknown exception";
  }
  GST_ELEMENT_ERROR(self, STREAM, FAILED, ("VAE encoder failed: %s", what.c_str()), (nullptr));
  clear_clip(self);
  return GST_FLOW_ERROR;
}

static gboolean set_sink_caps(GstVaeEncoder *self, GstCaps *caps) {
  GstVideoInfo info;
  if (!gst_video_info_from_caps(&info, caps) || GST_VIDEO_INFO_FORMAT(&info) != GST_VIDEO_FORMAT_RGB) {
    GST_ELEMENT_ERROR(self, STREAM, FORMAT, ("vaeencoder takes RGB frames"), ("caps: %" GST_PTR_FORMAT, caps));
    return FALSE;
  }
  VaeEngine *eng = engine_of(self);
  if (!eng) return FALSE;
  std::string bad = eng->check_clip(1, GST_VIDEO_INFO_WIDTH(&info), GST_VIDEO_INFO_HEIGHT(&info));
  if (!bad.empty()) {
    GST_ELEMENT_ERROR(self, STREAM, FORMAT, ("Frames of this size cannot be encoded"),
                      ("%s (model %s); resize the frames upstream", bad.c_str(), eng->options().model.c_str()));
    return FALSE;
  }
  // A new size takes effect at the next clip (csvvideosrc's buckets change it between clips);
  // only a size change inside a clip loses that clip. Re-sent caps of the same size (a new
  // framerate, say) keep the clip going.
  const bool resized = !self->have_info || GST_VIDEO_INFO_WIDTH(&info) != GST_VIDEO_INFO_WIDTH(&self->vinfo) ||
                       GST_VIDEO_INFO_HEIGHT(&info) != GST_VIDEO_INFO_HEIGHT(&self->vinfo);
  if (resized) {
    if (auto d = eng->frame_size_changed(GST_VIDEO_INFO_WIDTH(&info), GST_VIDEO_INFO_HEIGHT(&info)))
      drop_clip(self, *d);
  }
  self->vinfo = info;
  self->have_info = TRUE;
  // The latent caps do not depend on the frame size (each buffer carries its shape): sent once.
  GstCaps *out = tensor_caps_new({"latents", eng->dtype_name(), eng->device_name(),
                                  eng->options().condition != Condition::None ? "condition,condition_frames" : ""});
  GstCaps *cur = gst_pad_get_current_caps(self->srcpad);
  gboolean ok = TRUE;
  if (!cur || !gst_caps_is_equal(cur, out)) ok = gst_pad_push_event(self->srcpad, gst_event_new_caps(out));
  if (cur) gst_caps_unref(cur);
  gst_caps_unref(out);
  return ok;
}

// A clip that the cache holds, in its place in the stream: its latent from the cached moments.
// FALSE when downstream refused it (EOS after max-steps, flushing): the source stops there.
static gboolean push_cached_clip(GstVaeEncoder *self, const ClipIdentity &clip) {
  VaeEngine *eng = engine_of(self);
  LatentCache *cache = cache_of(self);
  CacheEntry entry;
  std::string why = "its cache entry was dropped (a flush between lookup and playback)";
  GstBuffer *out = nullptr;
  if (eng && cache && cache->take(clip, &entry)) out = eng->latent_from_moments(entry, clip.sample_id, clip.epoch, &why);
  if (!out) {
    GST_ELEMENT_WARNING(self, STREAM, DECODE, ("Dropped the cached clip of sample %" G_GUINT64_FORMAT, clip.sample_id),
                        ("%s", why.c_str()));
    return TRUE;
  }
  FrameInfo info;
  info.sample_id = clip.sample_id;
  info.epoch = clip.epoch;
  info.clip_index = clip.clip_index;
  info.padding = clip.padding;
  info.group = clip.group;
  info.group_size = clip.group_size;
  info.caption = clip.caption;
  info.path = clip.path;
  add_sample_meta(out, info);
  GST_BUFFER_PTS(out) = clip.pts;
  GST_BUFFER_DURATION(out) = clip.duration;
  // GstBaseSrc sends its segment with its first buffer; a stream that starts with cached clips
  // has had none yet: the time segment from 0 that it will send.
  if (GstEvent *seg = gst_pad_get_sticky_event(self->srcpad, GST_EVENT_SEGMENT, 0)) {
    gst_event_unref(seg);
  } else {
    GstSegment segment;
    gst_segment_init(&segment, GST_FORMAT_TIME);
    gst_pad_push_event(self->srcpad, gst_event_new_segment(&segment));
  }
  if (GST_CLOCK_TIME_IS_VALID(clip.duration)) self->last_clip_duration = clip.duration;
  const GstFlowReturn r = gst_pad_push(self->srcpad, out);
  if (r != GST_FLOW_OK) GST_DEBUG_OBJECT(self, "cached clip pushed: %s", gst_flow_get_name(r));
  return r == GST_FLOW_OK;
}

static gboolean gst_vae_encoder_sink_event(GstPad *pad, GstObject *parent, GstEvent *event) {
  auto *self = GST_VAE_ENCODER(parent);
  ClipIdentity cached;
  if (parse_cached_clip_event(event, &cached)) {
    gst_event_unref(event);
    return push_cached_clip(self, cached);
  }
  switch (GST_EVENT_TYPE(event)) {
    case GST_EVENT_CAPS: {
      GstCaps *caps;
      gst_event_parse_caps(event, &caps);
      gboolean ok = set_sink_caps(self, caps);
      gst_event_unref(event);
      return ok;
    }
    case GST_EVENT_FLUSH_STOP:
      clear_clip(self);
      if (LatentCache *c = cache_of(self)) c->clear();
      break;
    case GST_EVENT_EOS:
      if (VaeEngine *eng = engine_of(self))
        if (auto d = eng->end_of_stream()) drop_clip(self, *d);
      break;
    default:
      break;
  }
  return gst_pad_event_default(pad, parent, event);
}

static gboolean gst_vae_encoder_sink_query(GstPad *pad, GstObject *parent, GstQuery *query) {
  auto *self = GST_VAE_ENCODER(parent);
  if (is_cache_probe_query(query)) {
    if (!cache_of(self)) return FALSE;
    answer_cache_query(query, true);
    return TRUE;
  }
  ClipIdentity clip;
  if (parse_cache_query(query, &clip)) {
    // csvvideosrc, before decoding a clip (one of its decoding threads).
    LatentCache *cache = cache_of(self);
    VaeEngine *eng = engine_of(self);
    if (!cache || !eng) return FALSE;  // nobody holds clips: decode
    std::string warning;
    const std::string chain = upstream_chain_fingerprint(self->sinkpad, "csvvideosrc");
    // The source's frame size is the encoder's when nothing between them transforms the frames.
    const bool direct = chain.empty();
    const std::vector<TensorSpec> expect = {
        eng->moments_spec(static_cast<int>(clip.num_frames), direct ? clip.width : 0, direct ? clip.height : 0)};
    const bool held = cache->lookup(clip, chain, expect, &warning);
    if (!warning.empty())
      GST_ELEMENT_WARNING(self, RESOURCE, READ, ("Latent cache entry unusable"), ("%s", warning.c_str()));
    answer_cache_query(query, held);
    return TRUE;
  }
  std::vector<ClipShape> shapes;
  if (parse_shapes_query(query, &shapes)) {
    // csvvideosrc with buckets, at start: every shape it may send must be one this VAE encodes.
    if (VaeEngine *eng = engine_of(self))
      for (const ClipShape &c : shapes) {
        const std::string bad = eng->check_clip(c.frames, c.width, c.height);
        if (bad.empty()) continue;
        shapes_query_set_problem(query, "vaeencoder " + std::string(GST_OBJECT_NAME(self)) + " cannot encode " +
                                            std::to_string(c.width) + "x" + std::to_string(c.height) + " clips of " +
                                            std::to_string(c.frames) + " frames: " + bad);
        break;
      }
    gst_pad_peer_query(self->srcpad, query);  // on to the microbatcher
    return TRUE;
  }
  switch (GST_QUERY_TYPE(query)) {
    case GST_QUERY_ALLOCATION:
      return FALSE;  // downstream holds tensors, not frames: upstream picks its own allocator
    case GST_QUERY_CAPS: {
      GstCaps *filter, *tmpl = gst_pad_get_pad_template_caps(pad);
      gst_query_parse_caps(query, &filter);
      GstCaps *res = filter ? gst_caps_intersect_full(filter, tmpl, GST_CAPS_INTERSECT_FIRST) : gst_caps_ref(tmpl);
      gst_query_set_caps_result(query, res);
      gst_caps_unref(res);
      gst_caps_unref(tmpl);
      return TRUE;
    }
    default:
      return gst_pad_query_default(pad, parent, query);
  }
}

static gboolean gst_vae_encoder_src_query(GstPad *pad, GstObject *parent, GstQuery *query) {
  auto *self = GST_VAE_ENCODER(parent);
  switch (GST_QUERY_TYPE(query)) {
    case GST_QUERY_CAPS: {
      GstCaps *caps;
      VaeEngine *eng = engine_of(self);
      if (eng)
        caps = tensor_caps_new({"latents", eng->dtype_name(), eng->device_name(), ""});
      else
        caps = gst_pad_get_pad_template_caps(pad);
      GstCaps *filter;
      gst_query_parse_caps(query, &filter);
      if (filter) {
        GstCaps *i = gst_caps_intersect_full(filter, caps, GST_CAPS_INTERSECT_FIRST);
        gst_caps_unref(caps);
        caps = i;
      }
      gst_query_set_caps_result(query, caps);
      gst_caps_unref(caps);
      return TRUE;
    }
    case GST_QUERY_LATENCY: {
      // A clip's latent leaves when its last frame is in: add one clip's duration.
      if (!gst_pad_peer_query(self->sinkpad, query)) return FALSE;
      gboolean live;
      GstClockTime min, max;
      gst_query_parse_latency(query, &live, &min, &max);
      GstClockTime own = GST_CLOCK_TIME_IS_VALID(self->last_clip_duration) ? self->last_clip_duration : 0;
      min += own;
      if (GST_CLOCK_TIME_IS_VALID(max)) max += own;
      gst_query_set_latency(query, live, min, max);
      return TRUE;
    }
    default:
      return gst_pad_query_default(pad, parent, query);
  }
}

static gboolean load_engine(GstVaeEncoder *self) {
  GST_OBJECT_LOCK(self);
  const VaeEncoderSettings settings = *self->settings;
  GST_OBJECT_UNLOCK(self);
  const vae::EngineOptions &o = settings.engine;
  std::string error;
  std::unique_ptr<VaeEngine> eng;
  try {  // create() reports its own failures; nothing may unwind into GStreamer
    eng = VaeEngine::create(o, &error);
  } catch (const std::exception &e) {
    error = first_line(e.what());
  } catch (...) {
    error = "unknown exception";
  }
  if (!eng) {
    GST_ELEMENT_ERROR(self, RESOURCE, SETTINGS, ("Could not set up the VAE encoder: %s", error.c_str()),
                      ("property model: a diffusers VAE folder (config.json and weights) or a TorchScript file"));
    return FALSE;
  }
  eng->set_warning_callback([self](const std::string &w) {
    GST_ELEMENT_WARNING(self, RESOURCE, NO_SPACE_LEFT, ("VAE encoder ran out of memory"), ("%s", w.c_str()));
  });
  GST_INFO_OBJECT(self, "model %s on %s as %s", o.model.c_str(), eng->device_name().c_str(),
                  eng->dtype_name().c_str());
  const std::string &cache_dir = settings.cache_dir;
  const CacheMode mode = settings.cache_mode;
  if (!cache_dir.empty()) {
    // The encoder's part of the keys reads the weights once (SHA-256), here rather than per clip.
    std::string key = eng->cache_key(&error);
    std::unique_ptr<LatentCache> cache = key.empty() ? nullptr : LatentCache::open(cache_dir, mode, key, &error);
    if (!cache) {
      GST_ELEMENT_ERROR(self, RESOURCE, SETTINGS, ("Could not open the latent cache"),
                        ("%s (property cache-dir)", error.c_str()));
      return FALSE;
    }
    GST_INFO_OBJECT(self, "latent cache %s", cache_dir.c_str());
    *self->cache = std::move(cache);
  }
  *self->engine = std::move(eng);
  return TRUE;
}

static GstStateChangeReturn gst_vae_encoder_change_state(GstElement *element, GstStateChange transition) {
  auto *self = GST_VAE_ENCODER(element);
  switch (transition) {
    case GST_STATE_CHANGE_NULL_TO_READY:
      if (!load_engine(self)) return GST_STATE_CHANGE_FAILURE;
      break;
    case GST_STATE_CHANGE_READY_TO_PAUSED:
      self->have_info = FALSE;
      clear_clip(self);
      self->last_clip_duration = GST_CLOCK_TIME_NONE;
      break;
    default:
      break;
  }
  GstStateChangeReturn ret = GST_ELEMENT_CLASS(gst_vae_encoder_parent_class)->change_state(element, transition);
  switch (transition) {
    case GST_STATE_CHANGE_PAUSED_TO_READY:
      GST_PAD_STREAM_LOCK(self->sinkpad);
      clear_clip(self);
      self->have_info = FALSE;
      if (LatentCache *c = cache_of(self)) c->clear();
      GST_PAD_STREAM_UNLOCK(self->sinkpad);
      break;
    case GST_STATE_CHANGE_READY_TO_NULL:
      self->cache->reset();
      self->engine->reset();
      break;
    default:
      break;
  }
  return ret;
}

static void gst_vae_encoder_set_property(GObject *object, guint id, const GValue *value, GParamSpec *pspec) {
  auto *self = GST_VAE_ENCODER(object);
  GST_OBJECT_LOCK(self);
  VaeEncoderSettings &c = *self->settings;
  vae::EngineOptions &e = c.engine;
  // Sizes are at most 16384 and counts 4096 (the specs' ranges): they fit the engine's ints.
  auto count = [value]() { return static_cast<int>(g_value_get_uint(value)); };
  switch (id) {
    case PROP_MODEL: e.model = string_property(value); break;
    case PROP_PER_FRAME: e.per_frame = g_value_get_boolean(value); break;
    case PROP_MICRO_BATCH_SIZE: e.micro_batch_size = count(); break;
    case PROP_CHUNK_FRAMES: e.chunk_frames = count(); break;
    case PROP_TILE_HEIGHT: e.tile_height = count(); break;
    case PROP_TILE_WIDTH: e.tile_width = count(); break;
    case PROP_TILE_OVERLAP_HEIGHT: e.tile_overlap_height = g_value_get_double(value); break;
    case PROP_TILE_OVERLAP_WIDTH: e.tile_overlap_width = g_value_get_double(value); break;
    case PROP_LATENT: e.latent = static_cast<LatentKind>(g_value_get_enum(value)); break;
    case PROP_NORM_SCOPE: e.norm_scope = static_cast<NormScope>(g_value_get_enum(value)); break;
    case PROP_CONDITION: e.condition = static_cast<Condition>(g_value_get_enum(value)); break;
    case PROP_SEED: e.seed = g_value_get_uint64(value); break;
    case PROP_DEVICE: e.device = string_property(value); break;
    case PROP_DTYPE: e.dtype = string_property(value); break;
    case PROP_TUNE_MALLOC: e.tune_malloc = g_value_get_boolean(value); break;
    case PROP_CACHE_DIR: c.cache_dir = string_property(value); break;
    case PROP_CACHE_MODE: c.cache_mode = static_cast<CacheMode>(g_value_get_enum(value)); break;
    default: G_OBJECT_WARN_INVALID_PROPERTY_ID(object, id, pspec); break;
  }
  GST_OBJECT_UNLOCK(self);
}

static void gst_vae_encoder_get_property(GObject *object, guint id, GValue *value, GParamSpec *pspec) {
  auto *self = GST_VAE_ENCODER(object);
  GST_OBJECT_LOCK(self);
  const VaeEncoderSettings &c = *self->settings;
  const vae::EngineOptions &e = c.engine;
  switch (id) {
    case PROP_MODEL: set_string_property(value, e.model); break;
    case PROP_PER_FRAME: g_value_set_boolean(value, e.per_frame); break;
    case PROP_MICRO_BATCH_SIZE: g_value_set_uint(value, guint(e.micro_batch_size)); break;
    case PROP_CHUNK_FRAMES: g_value_set_uint(value, guint(e.chunk_frames)); break;
    case PROP_TILE_HEIGHT: g_value_set_uint(value, guint(e.tile_height)); break;
    case PROP_TILE_WIDTH: g_value_set_uint(value, guint(e.tile_width)); break;
    case PROP_TILE_OVERLAP_HEIGHT: g_value_set_double(value, e.tile_overlap_height); break;
    case PROP_TILE_OVERLAP_WIDTH: g_value_set_double(value, e.tile_overlap_width); break;
    case PROP_LATENT: g_value_set_enum(value, gint(e.latent)); break;
    case PROP_NORM_SCOPE: g_value_set_enum(value, gint(e.norm_scope)); break;
    case PROP_CONDITION: g_value_set_enum(value, gint(e.condition)); break;
    case PROP_SEED: g_value_set_uint64(value, e.seed); break;
    case PROP_DEVICE: set_string_property(value, e.device); break;
    case PROP_DTYPE: set_string_property(value, e.dtype); break;
    case PROP_TUNE_MALLOC: g_value_set_boolean(value, e.tune_malloc); break;
    case PROP_CLIPS_ENCODED: g_value_set_uint64(value, self->clips_encoded); break;
    case PROP_CLIPS_DROPPED: g_value_set_uint64(value, self->clips_dropped); break;
    case PROP_CACHE_DIR: set_string_property(value, c.cache_dir); break;
    case PROP_CACHE_MODE: g_value_set_enum(value, gint(c.cache_mode)); break;
    case PROP_CACHE_HITS:
    case PROP_CACHE_MISSES: {
      LatentCache *cache = cache_of(self);
      g_value_set_uint64(value, !cache ? 0 : id == PROP_CACHE_HITS ? cache->hits() : cache->misses());
      break;
    }
    default: G_OBJECT_WARN_INVALID_PROPERTY_ID(object, id, pspec); break;
  }
  GST_OBJECT_UNLOCK(self);
}

static void gst_vae_encoder_finalize(GObject *object) {
  auto *self = GST_VAE_ENCODER(object);
  delete self->engine;
  delete self->cache;
  delete self->settings;
  G_OBJECT_CLASS(gst_vae_encoder_parent_class)->finalize(object);
}

static void gst_vae_encoder_class_init(GstVaeEncoderClass *klass) {
  auto *gobject_class = G_OBJECT_CLASS(klass);
  auto *element_class = GST_ELEMENT_CLASS(klass);
  videotrain_one_error_install(element_class);  // one error per failure (one_error.h)
  gobject_class->set_property = gst_vae_encoder_set_property;
  gobject_class->get_property = gst_vae_encoder_get_property;
  gobject_class->finalize = gst_vae_encoder_finalize;
  element_class->change_state = gst_vae_encoder_change_state;

  const VaeEncoderSettings ds;  // the defaults
  const vae::EngineOptions &d = ds.engine;
  const auto rw = GParamFlags(G_PARAM_READWRITE | G_PARAM_STATIC_STRINGS | GST_PARAM_MUTABLE_READY);
  const auto ro = GParamFlags(G_PARAM_READABLE | G_PARAM_STATIC_STRINGS);
  g_object_class_install_property(
      gobject_class, PROP_MODEL,
      g_param_spec_string("model", "Model",
                          "A diffusers VAE folder (config.json + diffusion_pytorch_model.safetensors) of class "
                          "AutoencoderKLCogVideoX or AutoencoderKLWan (Wan 2.1/2.2), or a TorchScript file whose "
                          "module has an encode method",
                          nullptr, rw));
  g_object_class_install_property(
      gobject_class, PROP_PER_FRAME,
      g_param_spec_boolean("per-frame", "Per frame",
                           "The TorchScript model is an image encoder ([N,3,H,W] -> [N,C,h,w]); the clip's frames "
                           "are folded into the batch and the results stacked along time",
                           d.per_frame, rw));
  g_object_class_install_property(
      gobject_class, PROP_MICRO_BATCH_SIZE,
      g_param_spec_uint("micro-batch-size", "Micro-batch size", "Frames per call of a per-frame image encoder", 1,
                        4096, guint(d.micro_batch_size), rw));
  g_object_class_install_property(
      gobject_class, PROP_CHUNK_FRAMES,
      g_param_spec_uint("chunk-frames", "Chunk frames",
                        "Frames per temporal chunk (k; chunk 0 also takes the T mod k extra frames); memory is set "
                        "by the chunk. Must be a multiple of the VAE's temporal compression. The Wan VAE always takes frame 0, "
                        "then 4 frames at a time",
                        1, 4096, guint(d.chunk_frames), rw));
  g_object_class_install_property(
      gobject_class, PROP_TILE_HEIGHT,
      g_param_spec_uint("tile-height", "Tile height",
                        "Spatial tile height in pixels (0: no tiles); for Wan, pixels of the encoder's input as in "
                        "diffusers (Wan 2.2: 2x2-pixel patches)",
                        0, 16384, guint(d.tile_height), rw));
  g_object_class_install_property(
      gobject_class, PROP_TILE_WIDTH,
      g_param_spec_uint("tile-width", "Tile width",
                        "Spatial tile width in pixels (0: no tiles); for Wan as tile-height", 0, 16384,
                        guint(d.tile_width), rw));
  g_object_class_install_property(
      gobject_class, PROP_TILE_OVERLAP_HEIGHT,
      g_param_spec_double("tile-overlap-height", "Tile overlap height",
                          "Fraction of a tile's height shared with the tile above (linear blend)", 0.0, 0.95,
                          d.tile_overlap_height, rw));
  g_object_class_install_property(
      gobject_class, PROP_TILE_OVERLAP_WIDTH,
      g_param_spec_double("tile-overlap-width", "Tile overlap width",
                          "Fraction of a tile's width shared with the tile to the left (linear blend)", 0.0, 0.95,
                          d.tile_overlap_width, rw));
  g_object_class_install_property(
      gobject_class, PROP_LATENT,
      g_param_spec_enum("latent", "Latent", "What goes out per clip (TorchScript encoders: their output as is)",
                        gst_vae_encoder_latent_get_type(), gint(d.latent), rw));
  g_object_class_install_property(
      gobject_class, PROP_NORM_SCOPE,
      g_param_spec_enum(
          "norm-scope", "Norm scope",
          "Statistics of the encoder's GroupNorms: chunk = per temporal chunk (diffusers' chunked encode); clip = "
          "over the whole clip and frame, as a single pass or SAT's context-parallel encoder computes them (the "
          "latents CogVideoX was trained on). clip keeps the clip's uint8 frames until its last frame is in, "
          "then streams the clip once per GroupNorm with the activations in an unlinked temporary file on CPU "
          "(host memory on CUDA): memory stays bounded by the chunk (plus the frames), time 1.0-1.5x the chunked "
          "encode on CPU. CogVideoX VAE folders only",
          gst_vae_encoder_norm_scope_get_type(), gint(d.norm_scope), rw));
  g_object_class_install_property(
      gobject_class, PROP_CONDITION,
      g_param_spec_enum(
          "condition", "Condition",
          "Image-to-video condition beside each latent, the named tensor condition [tc + C, t, h, w]: the VAE's "
          "temporal compression tc mask channels (1 for a given frame), then the posterior's mode (normalised) of "
          "the clip's given frame(s) followed by zeros, as diffusers' WanImageToVideoPipeline builds it; encoded "
          "through the clip's chunks and tiles and cached with it. The given frame(s) go along as the named "
          "tensor condition_frames, uint8 [n, H, W, 3] RGB (n = 1 or 2; imageencoder's input, cached too). VAE "
          "folders only",
          gst_vae_encoder_condition_get_type(), gint(d.condition), rw));
  g_object_class_install_property(
      gobject_class, PROP_SEED,
      g_param_spec_uint64("seed", "Seed", "Seed of the posterior noise (mixed with each clip's sample id and epoch)", 0,
                          G_MAXUINT64, d.seed, rw));
  g_object_class_install_property(
      gobject_class, PROP_DEVICE,
      g_param_spec_string("device", "Device",
                          "auto (or empty), cpu, cuda or cuda:N; auto: cuda:(LOCAL_RANK mod visible GPUs) when CUDA "
                          "is available, else cpu", nullptr,
                          rw));
  g_object_class_install_property(
      gobject_class, PROP_DTYPE,
      g_param_spec_string("dtype", "Dtype",
                          "float32, bfloat16 or float16 (default: bfloat16 on CUDA, float32 on CPU)", nullptr, rw));
  g_object_class_install_property(gobject_class, PROP_TUNE_MALLOC,
                                  g_param_spec_boolean("tune-malloc", "Tune malloc", kTuneMallocBlurb, d.tune_malloc, rw));
  g_object_class_install_property(
      gobject_class, PROP_CLIPS_ENCODED,
      g_param_spec_uint64("clips-encoded", "Clips encoded", "Clips encoded so far", 0, G_MAXUINT64, 0, ro));
  g_object_class_install_property(
      gobject_class, PROP_CACHE_DIR,
      g_param_spec_string("cache-dir", "Cache folder",
                          "Latent cache: each clip's posterior moments are kept here under a key of everything that "
                          "changes them (video content, frames, size and fit, the elements between csvvideosrc and "
                          "this one with their settings, the VAE's weights and config, dtype, chunking, tiles, "
                          "norm-scope), and a clip the cache holds is neither decoded by csvvideosrc nor encoded; "
                          "shared by the ranks of a machine and across nodes (see docs/latent-cache.md). NULL: no cache",
                          nullptr, rw));
  g_object_class_install_property(
      gobject_class, PROP_CACHE_MODE,
      g_param_spec_enum("cache-mode", "Cache mode", "How cache-dir is used", gst_vae_encoder_cache_mode_get_type(),
                        gint(ds.cache_mode), rw));
  g_object_class_install_property(
      gobject_class, PROP_CACHE_HITS,
      g_param_spec_uint64("cache-hits", "Cache hits", "Clips taken from the latent cache (not decoded, not encoded)",
                          0, G_MAXUINT64, 0, ro));
  g_object_class_install_property(
      gobject_class, PROP_CACHE_MISSES,
      g_param_spec_uint64("cache-misses", "Cache misses", "Clips csvvideosrc asked about that the cache did not hold",
                          0, G_MAXUINT64, 0, ro));
  g_object_class_install_property(
      gobject_class, PROP_CLIPS_DROPPED,
      g_param_spec_uint64("clips-dropped", "Clips dropped", "Clips dropped so far (see vaeencoder-dropped messages)",
                          0, G_MAXUINT64, 0, ro));

  gst_element_class_set_static_metadata(
      element_class, "VAE encoder", "Filter/Encoder/Video",
      "Encodes each clip of RGB frames into one latent tensor with a CogVideoX or Wan 2.1/2.2 causal 3D VAE "
      "(temporal chunks with a causal-convolution cache, optional spatial tiles) or a TorchScript encoder. With "
      "these VAEs clips need 1 + 4n frames (temporal compression 4) and frame sizes divisible by the spatial "
      "compression (8; 16 for Wan 2.2), else the element errors "
      "naming the setting; a clip that cannot be encoded for its own reasons is dropped with a vaeencoder-dropped "
      "message" VIDEOTRAIN_DOC_VAEENCODER_MESSAGES,
      "gst-videotrain");
  gst_element_class_add_static_pad_template(element_class, &sink_template);
  GstCaps *src_caps = tensor_caps_template("latents");
  gst_element_class_add_pad_template(element_class, gst_pad_template_new("src", GST_PAD_SRC, GST_PAD_ALWAYS, src_caps));
  gst_caps_unref(src_caps);
  gst_type_mark_as_plugin_api(gst_vae_encoder_latent_get_type(), GstPluginAPIFlags(0));
  gst_type_mark_as_plugin_api(gst_vae_encoder_norm_scope_get_type(), GstPluginAPIFlags(0));
  gst_type_mark_as_plugin_api(gst_vae_encoder_condition_get_type(), GstPluginAPIFlags(0));
  gst_type_mark_as_plugin_api(gst_vae_encoder_cache_mode_get_type(), GstPluginAPIFlags(0));
}

static void gst_vae_encoder_init(GstVaeEncoder *self) {
  self->sinkpad = gst_pad_new_from_static_template(&sink_template, "sink");
  gst_pad_set_chain_function(self->sinkpad, gst_vae_encoder_chain);
  gst_pad_set_event_function(self->sinkpad, gst_vae_encoder_sink_event);
  gst_pad_set_query_function(self->sinkpad, gst_vae_encoder_sink_query);
  gst_element_add_pad(GST_ELEMENT(self), self->sinkpad);
  self->srcpad = gst_pad_new_from_template(
      gst_element_class_get_pad_template(GST_ELEMENT_GET_CLASS(self), "src"), "src");
  gst_pad_set_query_function(self->srcpad, gst_vae_encoder_src_query);
  gst_pad_use_fixed_caps(self->srcpad);
  gst_element_add_pad(GST_ELEMENT(self), self->srcpad);

  self->settings = new VaeEncoderSettings();
  self->engine = new std::unique_ptr<VaeEngine>();
  self->cache = new std::unique_ptr<LatentCache>();
  self->last_clip_duration = GST_CLOCK_TIME_NONE;
}
