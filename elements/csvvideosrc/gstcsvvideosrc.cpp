/* csvvideosrc: the GObject face of SourceEngine.
 *
 * A GstPushSrc that emits RGB frames, one buffer per frame, each with a clip meta;
 * timestamps run on continuously across clips at `framerate`. */
#include "one_error.h"
#include "gstcsvvideosrc.h"
#include "bus_messages_doc.h"

#include <gst/video/video.h>

#include <algorithm>
#include <climits>
#include <memory>
#include <thread>

#include "dist_env.h"
#include "gst_enum.h"
#include "metas.h"
#include "resume_query.h"
#include "row_facts.h"
#include "row_facts_query.h"
#include "shapes_query.h"
#include "csvvideosrc_settings.h"
#include "source_engine.h"
#include "string_property.h"

GST_DEBUG_CATEGORY_STATIC(csvvideosrc_debug);
#define GST_CAT_DEFAULT csvvideosrc_debug

using namespace videotrain;

struct _GstCsvVideoSrc {
  GstPushSrc parent;
  CsvVideoSrcSettings *settings;  // the properties (object lock)
  // Streaming state.
  std::unique_ptr<SourceEngine> *engine;
  guint64 frames_out;
  ClipShape caps_shape;  // of the caps last set (buckets change them at clip boundaries)
  // csvvideosrc-epoch, pushed downstream before the frame after an epoch's last one (or
  // EOS): elements that must know where an epoch ends (microbatcher, ddpvalsink) see it
  // in order with the frames. Streaming thread only.
  GstEvent *epoch_event;
};

G_DEFINE_TYPE(GstCsvVideoSrc, gst_csv_video_src, GST_TYPE_PUSH_SRC);
GST_ELEMENT_REGISTER_DEFINE_WITH_CODE(csvvideosrc, "csvvideosrc", GST_RANK_NONE, GST_TYPE_CSV_VIDEO_SRC,
                                      GST_DEBUG_CATEGORY_INIT(csvvideosrc_debug, "csvvideosrc", 0,
                                                              "CSV-driven training video source"));

enum {
  PROP_0,
  PROP_LOCATION,
  PROP_ROOT,
  PROP_PATH_COLUMN,
  PROP_CAPTION_COLUMN,
  PROP_SPLIT,
  PROP_NUM_FRAMES,
  PROP_FRAME_STRIDE,
  PROP_FPS,
  PROP_VIDEO_STREAM,
  PROP_CLIP_START,
  PROP_CLIP_WINDOWS,
  PROP_WIDTH,
  PROP_HEIGHT,
  PROP_BUCKETS,
  PROP_FRAME_BUCKETS,
  PROP_RESIZE_MODE,
  PROP_SHORT_CLIPS,
  PROP_ON_ERROR,
  PROP_RANK,
  PROP_WORLD_SIZE,
  PROP_SHUFFLE,
  PROP_SEED,
  PROP_NUM_EPOCHS,
  PROP_START_EPOCH,
  PROP_START_CLIP,
  PROP_PREFETCH,
  PROP_DECODE_THREADS,
  PROP_DECODE_TIMEOUT,
  PROP_MAX_CAPTION_BYTES,
  PROP_FRAMERATE,
  PROP_REPLACED,
  PROP_CLIPS_PER_EPOCH,
  PROP_STEPS_PER_EPOCH,
};

static GstStaticPadTemplate src_template = GST_STATIC_PAD_TEMPLATE(
    "src", GST_PAD_SRC, GST_PAD_ALWAYS,
    GST_STATIC_CAPS("video/x-raw, format=(string)RGB, width=(int)[1, 16384], height=(int)[1, 16384], "
                    "framerate=(fraction)[0/1, 1000/1], pixel-aspect-ratio=(fraction)1/1"));

VIDEOTRAIN_DEFINE_ENUM(clip_start_get_type, "GstCsvVideoSrcClipStart",
                       {(gint)ClipStart::Random, "Random start, seeded by seed, epoch and sample id", "random"},
                       {(gint)ClipStart::Start, "First frames of the video", "start"},
                       {(gint)ClipStart::Center, "Centred in the video", "center"})
VIDEOTRAIN_DEFINE_ENUM(resize_mode_get_type, "GstCsvVideoSrcResizeMode",
                       {(gint)ResizeMode::Crop, "Keep aspect, fill and centre-crop", "crop"},
                       {(gint)ResizeMode::Pad, "Keep aspect, fit and pad with black borders", "pad"},
                       {(gint)ResizeMode::Stretch, "Scale to the size, ignoring aspect", "stretch"})
VIDEOTRAIN_DEFINE_ENUM(short_clips_get_type, "GstCsvVideoSrcShortClips",
                       {(gint)ShortClips::Replace, "Warn and use another sample of the shard", "replace"},
                       {(gint)ShortClips::Pad, "Repeat the last frame", "pad"},
                       {(gint)ShortClips::Fail, "Post an element error", "fail"})
VIDEOTRAIN_DEFINE_ENUM(on_error_get_type, "GstCsvVideoSrcOnError",
                       {(gint)OnError::Replace, "Warn and use another sample of the shard", "replace"},
                       {(gint)OnError::Fail, "Post an element error", "fail"})

static SourceEngine *engine_of(GstCsvVideoSrc *self) { return self->engine ? self->engine->get() : nullptr; }

static GstClockTime frame_duration(GstCsvVideoSrc *self) {
  const CsvVideoSrcSettings &s = *self->settings;
  return s.fps_n > 0 ? gst_util_uint64_scale(GST_SECOND, s.fps_d, s.fps_n) : GST_CLOCK_TIME_NONE;
}

static void gst_csv_video_src_set_property(GObject *object, guint id, const GValue *v, GParamSpec *pspec) {
  auto *self = GST_CSV_VIDEO_SRC(object);
  GST_OBJECT_LOCK(self);
  CsvVideoSrcSettings &s = *self->settings;
  SourceConfig &c = s.source;
  switch (id) {
    case PROP_LOCATION: c.manifest.location = string_property(v); break;
    case PROP_ROOT: c.manifest.root = string_property(v); break;
    case PROP_PATH_COLUMN: c.manifest.path_column = string_property(v); break;
    case PROP_CAPTION_COLUMN: c.manifest.caption_column = string_property(v); break;
    case PROP_SPLIT: c.manifest.split = string_property(v); break;
    case PROP_NUM_FRAMES: c.num_frames = g_value_get_int(v); break;
    case PROP_FRAME_STRIDE: c.frame_stride = g_value_get_int(v); break;
    case PROP_FPS: c.fps = g_value_get_double(v); break;
    case PROP_VIDEO_STREAM: c.video_stream = g_value_get_int(v); break;
    case PROP_CLIP_START: c.clip_start = (ClipStart)g_value_get_enum(v); break;
    case PROP_CLIP_WINDOWS: c.clip_windows = g_value_get_int(v); break;
    case PROP_WIDTH: c.width = g_value_get_int(v); break;
    case PROP_HEIGHT: c.height = g_value_get_int(v); break;
    case PROP_BUCKETS: c.buckets = string_property(v); break;
    case PROP_FRAME_BUCKETS: c.frame_buckets = string_property(v); break;
    case PROP_RESIZE_MODE: c.resize = (ResizeMode)g_value_get_enum(v); break;
    case PROP_SHORT_CLIPS: c.short_clips = (ShortClips)g_value_get_enum(v); break;
    case PROP_ON_ERROR: c.on_error = (OnError)g_value_get_enum(v); break;
    case PROP_RANK: s.rank = g_value_get_int(v); break;
    case PROP_WORLD_SIZE: s.world_size = g_value_get_int(v); break;
    case PROP_SHUFFLE: c.shuffle = g_value_get_boolean(v); break;
    case PROP_SEED: c.seed = g_value_get_uint64(v); break;
    case PROP_NUM_EPOCHS: c.num_epochs = g_value_get_uint(v); break;
    case PROP_START_EPOCH: c.start_epoch = g_value_get_uint(v); break;
    case PROP_START_CLIP: c.start_clip = g_value_get_uint64(v); break;
    case PROP_PREFETCH: c.prefetch = g_value_get_int(v); break;
    case PROP_DECODE_THREADS: c.decode_threads = g_value_get_int(v); break;
    case PROP_DECODE_TIMEOUT: c.decode_timeout_s = g_value_get_double(v); break;
    case PROP_MAX_CAPTION_BYTES: c.manifest.max_caption_bytes = g_value_get_uint(v); break;
    case PROP_FRAMERATE:
      s.fps_n = gst_value_get_fraction_numerator(v);
      s.fps_d = gst_value_get_fraction_denominator(v);
      break;
    default: G_OBJECT_WARN_INVALID_PROPERTY_ID(object, id, pspec); break;
  }
  GST_OBJECT_UNLOCK(self);
}

static void gst_csv_video_src_get_property(GObject *object, guint id, GValue *v, GParamSpec *pspec) {
  auto *self = GST_CSV_VIDEO_SRC(object);
  GST_OBJECT_LOCK(self);
  const CsvVideoSrcSettings &s = *self->settings;
  const SourceConfig &c = s.source;
  switch (id) {
    case PROP_LOCATION: set_string_property(v, c.manifest.location); break;
    case PROP_ROOT: set_string_property(v, c.manifest.root); break;
    case PROP_PATH_COLUMN: set_string_property(v, c.manifest.path_column); break;
    case PROP_CAPTION_COLUMN: set_string_property(v, c.manifest.caption_column); break;
    case PROP_SPLIT: set_string_property(v, c.manifest.split); break;
    case PROP_NUM_FRAMES: g_value_set_int(v, c.num_frames); break;
    case PROP_FRAME_STRIDE: g_value_set_int(v, c.frame_stride); break;
    case PROP_FPS: g_value_set_double(v, c.fps); break;
    case PROP_VIDEO_STREAM: g_value_set_int(v, c.video_stream); break;
    case PROP_CLIP_START: g_value_set_enum(v, (gint)c.clip_start); break;
    case PROP_CLIP_WINDOWS: g_value_set_int(v, c.clip_windows); break;
    case PROP_WIDTH: g_value_set_int(v, c.width); break;
    case PROP_HEIGHT: g_value_set_int(v, c.height); break;
    case PROP_BUCKETS: set_string_property(v, c.buckets); break;
    case PROP_FRAME_BUCKETS: set_string_property(v, c.frame_buckets); break;
    case PROP_RESIZE_MODE: g_value_set_enum(v, (gint)c.resize); break;
    case PROP_SHORT_CLIPS: g_value_set_enum(v, (gint)c.short_clips); break;
    case PROP_ON_ERROR: g_value_set_enum(v, (gint)c.on_error); break;
    case PROP_RANK: g_value_set_int(v, s.rank); break;
    case PROP_WORLD_SIZE: g_value_set_int(v, s.world_size); break;
    case PROP_SHUFFLE: g_value_set_boolean(v, c.shuffle); break;
    case PROP_SEED: g_value_set_uint64(v, c.seed); break;
    case PROP_NUM_EPOCHS: g_value_set_uint(v, c.num_epochs); break;
    case PROP_START_EPOCH: g_value_set_uint(v, c.start_epoch); break;
    case PROP_START_CLIP: g_value_set_uint64(v, c.start_clip); break;
    case PROP_PREFETCH: g_value_set_int(v, c.prefetch); break;
    case PROP_DECODE_THREADS: g_value_set_int(v, c.decode_threads); break;
    case PROP_DECODE_TIMEOUT: g_value_set_double(v, c.decode_timeout_s); break;
    case PROP_MAX_CAPTION_BYTES: g_value_set_uint(v, guint(c.manifest.max_caption_bytes)); break;
    case PROP_FRAMERATE: gst_value_set_fraction(v, s.fps_n, s.fps_d); break;
    case PROP_REPLACED: {
      SourceEngine *e = engine_of(self);
      g_value_set_uint64(v, e ? e->stats().replaced : 0);
      break;
    }
    case PROP_CLIPS_PER_EPOCH: {
      SourceEngine *e = engine_of(self);
      g_value_set_uint64(v, e ? e->clips_per_epoch() : 0);
      break;
    }
    case PROP_STEPS_PER_EPOCH: {
      SourceEngine *e = engine_of(self);
      g_value_set_uint64(v, e ? e->steps_per_epoch() : 0);
      break;
    }
    default: G_OBJECT_WARN_INVALID_PROPERTY_ID(object, id, pspec); break;
  }
  GST_OBJECT_UNLOCK(self);
}

// Configuration from the properties, with rank/world from the environment when unset.
static SourceConfig config_from_properties(GstCsvVideoSrc *self) {
  DistEnv env = dist_env_from_environment();
  GST_OBJECT_LOCK(self);
  const CsvVideoSrcSettings s = *self->settings;
  GST_OBJECT_UNLOCK(self);
  SourceConfig c = s.source;
  c.probe_threads = int(std::min(8u, std::max(1u, std::thread::hardware_concurrency())));
  c.world_size = s.world_size > 0 ? s.world_size : env.world_size;
  c.rank = s.rank >= 0 ? s.rank : (s.world_size > 0 ? 0 : env.rank);
  return c;
}

static gboolean gst_csv_video_src_start(GstBaseSrc *src) {
  auto *self = GST_CSV_VIDEO_SRC(src);
  SourceConfig cfg = config_from_properties(self);
  if (cfg.manifest.location.empty()) {
    GST_ELEMENT_ERROR(self, RESOURCE, NOT_FOUND, ("No manifest: set the 'location' property"),
                      ("location is empty; give a CSV file or a folder with videos.txt and prompts.txt"));
    return FALSE;
  }
  SourceCallbacks cb;
  cb.replaced = [self](const ReplacedEvent &e) {
    GST_WARNING_OBJECT(self, "replacing row %" G_GUINT64_FORMAT " (%s): %s", e.row, e.path.c_str(),
                       e.reason.c_str());
    GstStructure *s = gst_structure_new("csvvideosrc-replaced", "row", G_TYPE_UINT64, e.row, "path", G_TYPE_STRING,
                                        e.path.c_str(), "reason", G_TYPE_STRING, e.reason.c_str(), "epoch",
                                        G_TYPE_UINT, e.epoch, "clip", G_TYPE_UINT64, e.clip, NULL);
    gchar *text = g_strdup_printf("Replaced manifest row %" G_GUINT64_FORMAT " (%s): %s", e.row, e.path.c_str(),
                                  e.reason.c_str());
    GError *err = g_error_new_literal(GST_STREAM_ERROR, GST_STREAM_ERROR_DECODE, text);
    gst_element_post_message(GST_ELEMENT(self),
                             gst_message_new_warning_with_details(GST_OBJECT(self), err, text, s));
    g_error_free(err);
    g_free(text);
  };
  cb.row_warning = [self](uint64_t row, const std::string &path, const std::string &w) {
    GST_ELEMENT_WARNING(self, RESOURCE, READ, ("Manifest row %" G_GUINT64_FORMAT " changed: %s", row, w.c_str()),
                        ("%s", path.c_str()));
  };
  // Which source an epoch line is of (training or validation): the manifest's file name and split.
  const std::string location = cfg.manifest.location;
  const std::string manifest_name = location.substr(location.find_last_of('/') + 1) +
                                    (cfg.manifest.split.empty() ? std::string() : " split " + cfg.manifest.split);
  cb.epoch_done = [self, manifest_name](uint32_t epoch, uint64_t clips, uint64_t replaced, uint64_t decoded,
                                        uint64_t cached) {
    GST_INFO_OBJECT(self,
                    "epoch %u done: %" G_GUINT64_FORMAT " clips (%" G_GUINT64_FORMAT " decoded, %" G_GUINT64_FORMAT
                    " from the latent cache), %" G_GUINT64_FORMAT " replaced",
                    epoch, clips, decoded, cached, replaced);
    GstStructure *s = gst_structure_new(GST_VIDEOTRAIN_EPOCH_EVENT, "epoch", G_TYPE_UINT, epoch, "clips", G_TYPE_UINT64,
                                        clips, "replaced", G_TYPE_UINT64, replaced, "decoded", G_TYPE_UINT64, decoded,
                                        "cached", G_TYPE_UINT64, cached, NULL);
    gst_mini_object_replace(reinterpret_cast<GstMiniObject **>(&self->epoch_event),
                            GST_MINI_OBJECT_CAST(gst_event_new_custom(GST_EVENT_CUSTOM_DOWNSTREAM,
                                                                      gst_structure_copy(s))));
    gst_structure_set(s, "manifest", G_TYPE_STRING, manifest_name.c_str(), NULL);  // the message only
    gst_element_post_message(GST_ELEMENT(self), gst_message_new_element(GST_OBJECT(self), s));
  };
  // With several ranks the ddptrainsink downstream relays each rank's row facts to the others
  // (through its run's c10d store) before an epoch is planned, so that every rank moves a row whose
  // manifest columns lied from the same epoch and all plan the same steps.
  GstQuery *facts_probe = row_facts_query_new(kRowFactsProbe, "");
  std::string probe_text;
  const bool can_agree = gst_pad_peer_query(GST_BASE_SRC_PAD(src), facts_probe) &&
                         row_facts_query_reply(facts_probe, &probe_text) == RowFactsReply::kAgreed;
  gst_query_unref(facts_probe);
  if (can_agree) cb.agree_rows = [self](uint32_t epoch, const std::vector<RowFact> &mine, std::vector<RowFact> *all,
                         std::string *why) {
    using A = SourceCallbacks::Agreement;
    GstQuery *q = row_facts_query_new(epoch, format_row_facts(mine));
    std::string text;
    const bool asked = gst_pad_peer_query(GST_BASE_SRC_PAD(self), q);
    const RowFactsReply reply = asked ? row_facts_query_reply(q, &text) : RowFactsReply::kNobody;
    gst_query_unref(q);
    if (reply == RowFactsReply::kNobody) {
      GST_INFO_OBJECT(self, "no trainer downstream answered the row-facts query for epoch %u", epoch);
      return A::kAlone;
    }
    if (reply == RowFactsReply::kFailed) {
      *why = text;
      return text.empty() ? A::kCancelled : A::kFailed;  // an empty reason: the trainer is stopping
    }
    if (!parse_row_facts(text, all, why)) return A::kFailed;
    GST_DEBUG_OBJECT(self, "epoch %u: %zu row facts agreed (%zu of this rank)", epoch, all->size(), mine.size());
    return A::kAgreed;
  };
  // The trainer keeps what the decodes found for its checkpoints, so that a resumed run moves the
  // same rows at the same epochs.
  if (can_agree)
    cb.fact_learned = [self](const RowFact &f) {
      GstQuery *q = row_facts_query_new(kRowFactsLearned, format_row_facts({f}));
      gst_pad_peer_query(GST_BASE_SRC_PAD(self), q);
      gst_query_unref(q);
    };
  cb.warning = [self](const std::string &w) { GST_ELEMENT_WARNING(self, RESOURCE, READ, ("%s", w.c_str()), (NULL)); };
  // A vaeencoder with a latent cache downstream answers, before each clip is decoded, whether it
  // holds the clip. Without one (asked once: downstream elements start before the source), no clip
  // is looked up and no video is read for its content digest.
  GstQuery *probe = cache_probe_query_new();
  if (gst_pad_peer_query(GST_BASE_SRC_PAD(src), probe) && cache_query_cached(probe))
    cb.cached = [self](const ClipIdentity &clip) {
      GstQuery *q = cache_query_new(clip);
      const bool held = gst_pad_peer_query(GST_BASE_SRC_PAD(self), q) && cache_query_cached(q);
      gst_query_unref(q);
      return held;
    };
  gst_query_unref(probe);
  // Buckets: every shape must suit the encoder, and the clips are grouped into the
  // microbatcher's steps (asked downstream once, before the first clip).
  if (!cfg.buckets.empty() || !cfg.frame_buckets.empty()) {
    std::vector<ClipShape> shapes;
    std::string why;
    if (!SourceEngine::shapes(cfg, &shapes, &why)) {
      GST_ELEMENT_ERROR(self, RESOURCE, SETTINGS, ("Bad bucket setting: %s", why.c_str()),
                        ("buckets='%s' frame-buckets='%s'", cfg.buckets.c_str(), cfg.frame_buckets.c_str()));
      return FALSE;
    }
    GstQuery *sq = shapes_query_new(shapes);
    unsigned step_samples = 0;
    std::string problem;
    if (gst_pad_peer_query(GST_BASE_SRC_PAD(src), sq)) shapes_query_result(sq, &step_samples, &problem);
    gst_query_unref(sq);
    if (!problem.empty()) {
      GST_ELEMENT_ERROR(self, RESOURCE, SETTINGS, ("%s", problem.c_str()),
                        ("change buckets or frame-buckets: buckets='%s' frame-buckets='%s'", cfg.buckets.c_str(),
                         cfg.frame_buckets.c_str()));
      return FALSE;
    }
    if (step_samples == 0)
      GST_INFO_OBJECT(self, "no microbatcher downstream answered: bucket groups of 1 clip");
    cfg.step_samples = std::max(step_samples, 1u);
  }
  // A trainer downstream that resumes from a checkpoint says where this rank's data stopped.
  GstQuery *q = videotrain_resume_query_new();
  VideoTrainResumePosition pos;
  if (gst_pad_peer_query(GST_BASE_SRC_PAD(src), q) && videotrain_resume_query_parse(q, &pos)) {
    GST_INFO_OBJECT(self, "resuming at epoch %u, clip %" G_GUINT64_FORMAT " (from downstream checkpoint)", pos.epoch,
                    pos.clip);
    cfg.start_epoch = pos.epoch;
    cfg.start_clip = pos.clip;
    gint world_then = 0;
    const gchar *clips_then = nullptr;
    if (videotrain_resume_query_world_then(q, &world_then, &clips_then)) {
      cfg.resume_world = world_then;
      gchar **parts = g_strsplit(clips_then, ",", -1);
      for (gchar **i = parts; *i; i++)
        if (**i) cfg.resume_clips.push_back(g_ascii_strtoull(*i, nullptr, 10));
      g_strfreev(parts);
      GST_INFO_OBJECT(self, "the checkpoint was written by %d rank(s) (clips %s): resuming at the global position",
                      world_then, clips_then);
    }
    std::string why;
    const gchar *facts = videotrain_resume_query_row_facts(q);
    if (facts && !parse_row_facts(facts, &cfg.resumed_facts, &why))
      GST_ELEMENT_WARNING(self, RESOURCE, READ, ("The checkpoint's row facts are damaged: %s", why.c_str()),
                          ("rows whose manifest columns lie are found again as they are decoded"));
    else if (!cfg.resumed_facts.empty())
      GST_INFO_OBJECT(self, "%zu row facts from the checkpoint", cfg.resumed_facts.size());
  }
  gst_query_unref(q);
  auto engine = std::make_unique<SourceEngine>(cfg, cb);
  std::string err;
  if (!engine->start(&err)) {
    GST_ELEMENT_ERROR(self, RESOURCE, OPEN_READ, ("Cannot start csvvideosrc: %s", err.c_str()),
                      ("location=%s", cfg.manifest.location.c_str()));
    return FALSE;
  }
  GST_INFO_OBJECT(self, "manifest %s; rank %d of %d, %" G_GUINT64_FORMAT " clips per epoch",
                  engine->manifest_description().c_str(), cfg.rank, cfg.world_size, engine->clips_per_epoch());
  for (const std::string &w : engine->manifest_warnings())
    GST_ELEMENT_WARNING(self, RESOURCE, READ, ("%s", w.c_str()), ("location=%s", cfg.manifest.location.c_str()));
  if (engine->bucketed()) {
    GST_INFO_OBJECT(self, "buckets: %s", engine->bucket_summary().c_str());
    const std::string w = engine->bucket_warning();
    if (!w.empty()) GST_ELEMENT_WARNING(self, RESOURCE, READ, ("%s", w.c_str()), ("location=%s", cfg.manifest.location.c_str()));
  }
  GST_OBJECT_LOCK(self);
  self->engine = new std::unique_ptr<SourceEngine>(std::move(engine));
  self->frames_out = 0;
  self->caps_shape = ClipShape();
  GST_OBJECT_UNLOCK(self);
  return TRUE;
}

static gboolean gst_csv_video_src_stop(GstBaseSrc *src) {
  auto *self = GST_CSV_VIDEO_SRC(src);
  GST_OBJECT_LOCK(self);
  auto *holder = self->engine;
  self->engine = nullptr;
  GST_OBJECT_UNLOCK(self);
  delete holder;  // stops and joins the workers
  gst_event_replace(&self->epoch_event, nullptr);
  return TRUE;
}

static GstCaps *gst_csv_video_src_get_caps(GstBaseSrc *src, GstCaps *filter) {
  auto *self = GST_CSV_VIDEO_SRC(src);
  GST_OBJECT_LOCK(self);
  // With buckets, every bucket size (the first negotiated; each clip sets its own).
  std::vector<FrameSize> sizes;
  std::string why;
  const CsvVideoSrcSettings &s = *self->settings;
  if (!parse_size_buckets(s.source.buckets, &sizes, &why) || sizes.empty())
    sizes = {FrameSize{s.source.width, s.source.height}};
  GstCaps *caps = gst_caps_new_empty();
  for (const FrameSize &fs : sizes)
    gst_caps_append_structure(caps, gst_structure_new("video/x-raw", "format", G_TYPE_STRING, "RGB", "width",
                                                      G_TYPE_INT, fs.width, "height", G_TYPE_INT, fs.height,
                                                      "framerate", GST_TYPE_FRACTION, s.fps_n, s.fps_d,
                                                      "pixel-aspect-ratio", GST_TYPE_FRACTION, 1, 1, NULL));
  GST_OBJECT_UNLOCK(self);
  if (filter) {
    GstCaps *i = gst_caps_intersect_full(filter, caps, GST_CAPS_INTERSECT_FIRST);
    gst_caps_unref(caps);
    caps = i;
  }
  return caps;
}

static gboolean gst_csv_video_src_is_seekable(GstBaseSrc *) { return TRUE; }

// A seek in time goes to the start of the clip that holds that time.
static gboolean gst_csv_video_src_do_seek(GstBaseSrc *src, GstSegment *segment) {
  auto *self = GST_CSV_VIDEO_SRC(src);
  SourceEngine *e = engine_of(self);
  GstClockTime dur = frame_duration(self);
  if (!e || !GST_CLOCK_TIME_IS_VALID(dur) || segment->format != GST_FORMAT_TIME) return FALSE;
  if (e->bucketed()) {
    // Clips differ in length, so a time names no clip; the start segment is fine.
    if (segment->start / dur == self->frames_out) return TRUE;
    GST_WARNING_OBJECT(self, "cannot seek with buckets: clips differ in length, so a time names no clip");
    return FALSE;
  }
  guint64 frame = segment->start / dur;
  const guint64 clip_frames = (guint64)self->settings->source.num_frames;
  guint64 clip = frame / clip_frames;
  guint64 target = clip * clip_frames;
  if (target != self->frames_out) {
    GST_DEBUG_OBJECT(self, "seek to clip %" G_GUINT64_FORMAT, clip);
    e->restart_at(clip);
    gst_event_replace(&self->epoch_event, nullptr);
    self->frames_out = target;
  }
  segment->position = segment->time = segment->start = target * dur;
  return TRUE;
}

static gboolean gst_csv_video_src_query(GstBaseSrc *src, GstQuery *query) {
  auto *self = GST_CSV_VIDEO_SRC(src);
  if (GST_QUERY_TYPE(query) == GST_QUERY_DURATION) {
    GstFormat fmt;
    gst_query_parse_duration(query, &fmt, nullptr);
    SourceEngine *e = engine_of(self);
    if (e && e->total_clips() != G_MAXUINT64 && (fmt == GST_FORMAT_TIME || fmt == GST_FORMAT_DEFAULT)) {
      guint64 frames = e->total_clips() * (guint64)self->settings->source.num_frames;
      GstClockTime d = frame_duration(self);
      gst_query_set_duration(query, fmt, fmt == GST_FORMAT_TIME ? (gint64)(frames * d) : (gint64)frames);
      return TRUE;
    }
  }
  return GST_BASE_SRC_CLASS(gst_csv_video_src_parent_class)->query(src, query);
}

static gboolean gst_csv_video_src_unlock(GstBaseSrc *src) {
  if (SourceEngine *e = engine_of(GST_CSV_VIDEO_SRC(src))) e->set_flushing(true);
  return TRUE;
}

static gboolean gst_csv_video_src_unlock_stop(GstBaseSrc *src) {
  if (SourceEngine *e = engine_of(GST_CSV_VIDEO_SRC(src))) e->set_flushing(false);
  return TRUE;
}

static void push_epoch_event(GstCsvVideoSrc *self) {
  if (GstEvent *ev = self->epoch_event) {
    self->epoch_event = nullptr;
    gst_pad_push_event(GST_BASE_SRC_PAD(self), ev);
  }
}

static GstFlowReturn gst_csv_video_src_create(GstPushSrc *src, GstBuffer **buf) {
  auto *self = GST_CSV_VIDEO_SRC(src);
  SourceEngine *e = engine_of(self);
  if (!e) return GST_FLOW_FLUSHING;
  std::string err;
  GstBuffer *frame = nullptr;
  ClipIdentity cached;
  GstClockTime dur = frame_duration(self);
  // A clip that downstream holds goes as one event in place of its frames, with their span.
  SourceEngine::Pull pulled;
  while (push_epoch_event(self), (pulled = e->next(&frame, &cached, &err)) == SourceEngine::Pull::Cached) {
    if (GST_CLOCK_TIME_IS_VALID(dur)) {
      cached.pts = self->frames_out * dur;
      cached.duration = cached.num_frames * dur;
    }
    self->frames_out += cached.num_frames;
    // Refused: downstream's flow stopped (EOS at the trainer's max-steps, a flush), as a frame's
    // push would have said.
    if (!gst_pad_push_event(GST_BASE_SRC_PAD(self), cached_clip_event_new(cached))) {
      GST_DEBUG_OBJECT(self, "cached clip %" G_GUINT64_FORMAT " refused downstream", cached.clip_index);
      return GST_PAD_IS_FLUSHING(GST_BASE_SRC_PAD(self)) ? GST_FLOW_FLUSHING : GST_FLOW_EOS;
    }
  }
  switch (pulled) {
    case SourceEngine::Pull::Frame: break;
    case SourceEngine::Pull::Cached: break;  // not reached: the loop above takes them
    case SourceEngine::Pull::Eos:
      push_epoch_event(self);  // the last epoch ended with the frame before
      return GST_FLOW_EOS;
    case SourceEngine::Pull::Flushing: return GST_FLOW_FLUSHING;
    case SourceEngine::Pull::Error:
      GST_ELEMENT_ERROR(self, STREAM, DECODE, ("%s", err.c_str()),
                        ("set on-error=replace and short-clips=replace or pad to replace bad samples instead"));
      return GST_FLOW_ERROR;
  }
  frame = gst_buffer_make_writable(frame);  // sole owner: no copy
  if (gst_debug_category_get_threshold(GST_CAT_DEFAULT) >= GST_LEVEL_LOG) {
    const auto *m = gst_buffer_get_videotrain_clip_meta(frame);
    if (m && m->frame_index == 0)
      GST_LOG_OBJECT(self, "clip %" G_GUINT64_FORMAT " of epoch %u: row %" G_GUINT64_FORMAT " (%s)%s, %u frames from %" G_GUINT64_FORMAT ", %" G_GSIZE_FORMAT " bytes a frame, group %" G_GUINT64_FORMAT,
                     m->clip_index, m->epoch, m->sample_id, m->path, m->padding ? " padding" : "", m->num_frames,
                     m->source_frame, gst_buffer_get_size(frame), m->group);
  }
  if (e->bucketed()) {
    const ClipShape shape = e->frame_shape();
    if (shape.width != self->caps_shape.width || shape.height != self->caps_shape.height) {
      // A clip of another bucket: new caps, in order before its first frame.
      GST_OBJECT_LOCK(self);
      GstCaps *caps = gst_caps_new_simple("video/x-raw", "format", G_TYPE_STRING, "RGB", "width", G_TYPE_INT,
                                          shape.width, "height", G_TYPE_INT, shape.height, "framerate",
                                          GST_TYPE_FRACTION, self->settings->fps_n, self->settings->fps_d, "pixel-aspect-ratio",
                                          GST_TYPE_FRACTION, 1, 1, NULL);
      GST_OBJECT_UNLOCK(self);
      const gboolean ok = gst_base_src_set_caps(GST_BASE_SRC(self), caps);
      gst_caps_unref(caps);
      if (!ok) {
        gst_buffer_unref(frame);
        GST_ELEMENT_ERROR(self, CORE, NEGOTIATION, ("Downstream refused %dx%d frames (buckets)", shape.width, shape.height),
                          ("every bucket size must pass the elements between csvvideosrc and vaeencoder"));
        return GST_FLOW_NOT_NEGOTIATED;
      }
      self->caps_shape = shape;
    }
  }
  if (GST_CLOCK_TIME_IS_VALID(dur)) {
    GST_BUFFER_PTS(frame) = self->frames_out * dur;
    GST_BUFFER_DURATION(frame) = dur;
  }
  GST_BUFFER_OFFSET(frame) = self->frames_out;
  GST_BUFFER_OFFSET_END(frame) = self->frames_out + 1;
  self->frames_out++;
  *buf = frame;
  return GST_FLOW_OK;
}

static void gst_csv_video_src_finalize(GObject *object) {
  auto *self = GST_CSV_VIDEO_SRC(object);
  delete self->engine;
  delete self->settings;
  G_OBJECT_CLASS(gst_csv_video_src_parent_class)->finalize(object);
}

static void gst_csv_video_src_init(GstCsvVideoSrc *self) {
  self->settings = new CsvVideoSrcSettings();
  self->engine = nullptr;
  self->frames_out = 0;
  self->epoch_event = nullptr;
  gst_base_src_set_format(GST_BASE_SRC(self), GST_FORMAT_TIME);
  gst_base_src_set_live(GST_BASE_SRC(self), FALSE);
}

static void gst_csv_video_src_class_init(GstCsvVideoSrcClass *klass) {
  auto *oc = G_OBJECT_CLASS(klass);
  auto *ec = GST_ELEMENT_CLASS(klass);
  videotrain_one_error_install(ec);  // one error per failure (one_error.h)
  auto *bc = GST_BASE_SRC_CLASS(klass);
  oc->set_property = gst_csv_video_src_set_property;
  oc->get_property = gst_csv_video_src_get_property;
  oc->finalize = gst_csv_video_src_finalize;

  const CsvVideoSrcSettings ds;  // the defaults
  const SourceConfig &d = ds.source;
  const auto rw = GParamFlags(G_PARAM_READWRITE | G_PARAM_STATIC_STRINGS | GST_PARAM_MUTABLE_READY);
  const auto ro = GParamFlags(G_PARAM_READABLE | G_PARAM_STATIC_STRINGS);
  g_object_class_install_property(
      oc, PROP_LOCATION,
      g_param_spec_string("location", "Manifest",
                          "CSV manifest with a header row (path column: path, video, video_path, file or filename; "
                          "caption: text, caption or prompt), or a folder with videos.txt and prompts.txt",
                          nullptr, rw));
  g_object_class_install_property(
      oc, PROP_ROOT,
      g_param_spec_string("root", "Root", "Folder that relative video paths resolve against (default: the manifest's)",
                          nullptr, rw));
  g_object_class_install_property(
      oc, PROP_PATH_COLUMN,
      g_param_spec_string("path-column", "Path column", "Name of the video path column (default: auto-detect)",
                          nullptr, rw));
  g_object_class_install_property(
      oc, PROP_CAPTION_COLUMN,
      g_param_spec_string("caption-column", "Caption column", "Name of the caption column (default: auto-detect)",
                          nullptr, rw));
  g_object_class_install_property(
      oc, PROP_SPLIT,
      g_param_spec_string("split", "Split",
                          "Only rows whose 'split' column equals this (e.g. train, val); empty: all rows", nullptr,
                          rw));
  g_object_class_install_property(
      oc, PROP_NUM_FRAMES,
      g_param_spec_int("num-frames", "Frames per clip", "Frames in each emitted clip", 1, GST_VIDEOTRAIN_MAX_CLIP_FRAMES, d.num_frames, rw));
  g_object_class_install_property(
      oc, PROP_FRAME_STRIDE,
      g_param_spec_int("frame-stride", "Frame stride", "Take every n-th decoded frame (1: consecutive frames)", 1,
                       1000, d.frame_stride, rw));
  g_object_class_install_property(
      oc, PROP_FPS,
      g_param_spec_double("fps", "Sampling rate",
                          "Take clips at this many frames per second of source time, each the frame shown at its "
                          "time by the timestamps (safe for variable frame rate); 0: every frame-stride-th decoded "
                          "frame",
                          0.0, 1000.0, d.fps, rw));
  g_object_class_install_property(
      oc, PROP_VIDEO_STREAM,
      g_param_spec_int("video-stream", "Video stream",
                       "Which of a file's video streams to decode, counted from 0 in the file's order (ffmpeg "
                       "picks the largest by default; this picks the first)",
                       0, 255, d.video_stream, rw));
  g_object_class_install_property(
      oc, PROP_CLIP_START,
      g_param_spec_enum("clip-start", "Clip start", "Where in the video a clip starts", clip_start_get_type(),
                        (gint)d.clip_start, rw));
  g_object_class_install_property(
      oc, PROP_CLIP_WINDOWS,
      g_param_spec_int("clip-windows", "Clip windows",
                       "With clip-start=random: each video has this many clip windows, fixed by seed and row, and "
                       "each epoch uses one of them, so that vaeencoder's latent cache fills within about as many "
                       "epochs while windows still vary; 0: a fresh window every epoch",
                       0, 1000000, d.clip_windows, rw));
  g_object_class_install_property(
      oc, PROP_WIDTH, g_param_spec_int("width", "Width", "Output frame width in pixels", 1, 16384, d.width, rw));
  g_object_class_install_property(
      oc, PROP_HEIGHT, g_param_spec_int("height", "Height", "Output frame height in pixels", 1, 16384, d.height, rw));
  g_object_class_install_property(
      oc, PROP_BUCKETS,
      g_param_spec_string(
          "buckets", "Size buckets",
          "Frame sizes 'WxH,WxH,...': each video goes to the size whose aspect ratio is nearest its own (in log "
          "aspect ratio; a tie goes to the larger area) and is fitted to it by resize-mode. Clips are grouped so "
          "that each optimizer step holds one shape (steps of the downstream microbatcher's batch-size, full but "
          "for at most one per bucket per epoch, the same number on every rank). Sizes come from the manifest's "
          "width/height columns, else are probed at start. Empty: every clip is width x height",
          nullptr, rw));
  g_object_class_install_property(
      oc, PROP_FRAME_BUCKETS,
      g_param_spec_string(
          "frame-buckets", "Frame-count buckets",
          "Clip lengths '49,33,17': each clip takes the longest its video supplies at frame-stride (or fps), from "
          "the manifest's num_frames column, else probed at start. A video shorter than all follows short-clips "
          "(replace: left out, pad: the shortest, padded; fail: an error at start). Lengths the encoder cannot use "
          "are an error at start. Empty: every clip is num-frames long",
          nullptr, rw));
  g_object_class_install_property(
      oc, PROP_RESIZE_MODE,
      g_param_spec_enum("resize-mode", "Resize mode", "How frames of another aspect ratio are fitted",
                        resize_mode_get_type(), (gint)d.resize, rw));
  g_object_class_install_property(
      oc, PROP_SHORT_CLIPS,
      g_param_spec_enum("short-clips", "Short clips", "What to do with a video that has too few frames",
                        short_clips_get_type(), (gint)d.short_clips, rw));
  g_object_class_install_property(
      oc, PROP_ON_ERROR,
      g_param_spec_enum("on-error", "On error",
                        "What to do with a missing, unreadable, corrupt or too slow video (decode-timeout)",
                        on_error_get_type(), (gint)d.on_error, rw));
  g_object_class_install_property(
      oc, PROP_RANK,
      g_param_spec_int("rank", "Rank",
                       "This process's rank (-1: from RANK, SLURM_PROCID or OMPI_COMM_WORLD_RANK, else 0)", -1,
                       1 << 20, ds.rank, rw));
  g_object_class_install_property(
      oc, PROP_WORLD_SIZE,
      g_param_spec_int("world-size", "World size",
                       "Number of ranks sharing the manifest (0: from WORLD_SIZE, SLURM_NTASKS or "
                       "OMPI_COMM_WORLD_SIZE, else 1)",
                       0, 1 << 20, ds.world_size, rw));
  g_object_class_install_property(
      oc, PROP_SHUFFLE,
      g_param_spec_boolean("shuffle", "Shuffle", "Visit rows in a permutation that depends on seed and epoch",
                           d.shuffle, rw));
  g_object_class_install_property(
      oc, PROP_SEED,
      g_param_spec_uint64("seed", "Seed", "Seed of the permutations, random clip starts and replacements", 0,
                          G_MAXUINT64, d.seed, rw));
  g_object_class_install_property(
      oc, PROP_NUM_EPOCHS,
      g_param_spec_uint("num-epochs", "Epochs", "Epochs to emit (0: forever)", 0, G_MAXUINT, d.num_epochs, rw));
  g_object_class_install_property(
      oc, PROP_START_EPOCH,
      g_param_spec_uint("start-epoch", "Start epoch", "Epoch to resume at", 0, G_MAXUINT, d.start_epoch, rw));
  g_object_class_install_property(
      oc, PROP_START_CLIP,
      g_param_spec_uint64("start-clip", "Start clip", "Clip index within start-epoch to resume at", 0, G_MAXUINT64,
                          d.start_clip, rw));
  g_object_class_install_property(
      oc, PROP_PREFETCH,
      g_param_spec_int("prefetch", "Prefetch",
                       "Videos decoded at once on worker threads; also the most decoded clips held", 1, 256, d.prefetch, rw));
  g_object_class_install_property(
      oc, PROP_DECODE_THREADS,
      g_param_spec_int("decode-threads", "Decode threads", "Threads per decoder (0: decoder's automatic choice)", 0,
                       256, d.decode_threads, rw));
  g_object_class_install_property(
      oc, PROP_DECODE_TIMEOUT,
      g_param_spec_double("decode-timeout", "Decode timeout",
                          "Seconds one clip may take to decode before the video counts as bad", 0.1, 86400.0, d.decode_timeout_s,
                          rw));
  g_object_class_install_property(
      oc, PROP_MAX_CAPTION_BYTES,
      g_param_spec_uint("max-caption-bytes", "Max caption bytes",
                        "Longest caption kept, in bytes: a longer one is cut at a UTF-8 character boundary, with one "
                        "warning per row (a caption is copied into every clip's metadata)",
                        1, 1 << 30, guint(d.manifest.max_caption_bytes), rw));
  g_object_class_install_property(
      oc, PROP_FRAMERATE,
      gst_param_spec_fraction("framerate", "Frame rate", "Frame rate of the output timestamps and caps", 1, 1, 1000,
                              1, ds.fps_n, ds.fps_d, rw));
  g_object_class_install_property(
      oc, PROP_REPLACED,
      g_param_spec_uint64("replaced", "Replaced", "Samples replaced so far because they could not be used", 0,
                          G_MAXUINT64, 0, ro));
  g_object_class_install_property(
      oc, PROP_CLIPS_PER_EPOCH,
      g_param_spec_uint64("clips-per-epoch", "Clips per epoch",
                          "Clips this rank emits per epoch, ceil(rows / world-size) (known once started; with "
                          "buckets, of the first epoch: it varies by epoch and rank)",
                          0, G_MAXUINT64, 0, ro));
  g_object_class_install_property(
      oc, PROP_STEPS_PER_EPOCH,
      g_param_spec_uint64("steps-per-epoch", "Steps per epoch",
                          "With buckets: optimizer steps (clip groups) each rank gets per epoch, the same on every "
                          "rank (known once started); 0 without buckets",
                          0, G_MAXUINT64, 0, ro));

  gst_element_class_add_static_pad_template(ec, &src_template);
  gst_element_class_set_static_metadata(
      ec, "CSV video training source", "Source/Video",
      "Reads a CSV manifest of videos lazily, shards it over ranks, shuffles per epoch and decodes only the frames of "
      "each clip, several videos in parallel" VIDEOTRAIN_DOC_CSVVIDEOSRC_MESSAGES,
      "gst-videotrain developers");
  gst_type_mark_as_plugin_api(clip_start_get_type(), GstPluginAPIFlags(0));
  gst_type_mark_as_plugin_api(resize_mode_get_type(), GstPluginAPIFlags(0));
  gst_type_mark_as_plugin_api(short_clips_get_type(), GstPluginAPIFlags(0));
  gst_type_mark_as_plugin_api(on_error_get_type(), GstPluginAPIFlags(0));

  bc->start = gst_csv_video_src_start;
  bc->stop = gst_csv_video_src_stop;
  bc->get_caps = gst_csv_video_src_get_caps;
  bc->is_seekable = gst_csv_video_src_is_seekable;
  bc->do_seek = gst_csv_video_src_do_seek;
  bc->query = gst_csv_video_src_query;
  bc->unlock = gst_csv_video_src_unlock;
  bc->unlock_stop = gst_csv_video_src_unlock_stop;
  GST_PUSH_SRC_CLASS(klass)->create = gst_csv_video_src_create;
}
