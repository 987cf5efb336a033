/* samplesink: writes each sample of a sampling branch (ddpsampler ! vaedecoder ! samplesink) as a file
 * of its own. The "ddpsampler-sample" event before a sample's frames names it (step, prompt); its
 * frames go through a private pipeline, appsrc ! ENCODER ! filesink, built from the `encoder`
 * description (default: H.264 in MP4 through GStreamer's own elements), which is finished (EOS) and
 * closed at the next sample's event or at EOS, so every file is complete on its own. */
#include "one_error.h"
#include "gstsamplesink.h"

#include <gst/app/gstappsrc.h>
#include <gst/video/video.h>
#include <glib/gstdio.h>
#include <unistd.h>

#include <cerrno>
#include <string>

#include <memory>

#include "bus_messages_doc.h"
#include "run_context_gst.h"
#include "sample_names.h"
#include "samplesink_settings.h"
#include "string_property.h"

GST_DEBUG_CATEGORY_STATIC(samplesink_debug);
#define GST_CAT_DEFAULT samplesink_debug

using namespace videotrain;

struct _GstSampleSink {
  GstBaseSink parent;
  SampleSinkSettings *settings;  // the properties (object lock)
  guint64 files_written;      // object lock
  std::shared_ptr<RunContext> *run;  // object lock: the trainer's run (TensorBoard images)
  guint sample_frames;        // the sampler's num-frames for the open sample (0: unknown)
  bool warned_no_run;
  // Streaming thread:
  GstCaps *caps;
  GstVideoInfo info;
  bool have_info;
  bool named;  // a ddpsampler-sample event gave the next file's step and prompt
  guint64 step;
  guint prompt;
  GstElement *pipe;  // the open file's pipeline
  GstElement *appsrc;
  std::string *path;      // the file's final name
  std::string *partial;   // what is written until the file is complete (renamed to path then)
  guint64 frames;
  bool skipping;          // the open sample failed: its remaining frames are dropped
};

G_DEFINE_TYPE(GstSampleSink, gst_sample_sink, GST_TYPE_BASE_SINK);
GST_ELEMENT_REGISTER_DEFINE_WITH_CODE(samplesink, "samplesink", GST_RANK_NONE, GST_TYPE_SAMPLE_SINK,
                                      GST_DEBUG_CATEGORY_INIT(samplesink_debug, "samplesink", 0,
                                                              "One video file per generated sample"));

enum { PROP_0, PROP_LOCATION, PROP_ENCODER, PROP_TRAINER, PROP_TENSORBOARD_FRAMES, PROP_FILES_WRITTEN, PROP_FAIL_ON_ERROR };

// Whether frame i of n is one of the k spread evenly from the first to the last.
static bool picked(guint64 i, guint n, guint k) {
  if (k == 0) return false;
  if (n == 0 || n <= k) return n == 0 ? i == 0 : true;
  if (k == 1) return i == 0;
  for (guint j = 0; j < k; j++)
    if (i == guint64(j) * (n - 1) / (k - 1)) return true;
  return false;
}

// A few frames per sample as PNG images in the trainer's TensorBoard events (where the trainer has
// tensorboard-dir: rank 0's events file, other ranks' <tensorboard-dir>/samples-rank<R>).
static void tensorboard_frame(GstSampleSink *self, GstBuffer *buf) {
  GST_OBJECT_LOCK(self);
  const std::string trainer = self->settings->trainer;
  const guint k = self->settings->tensorboard_frames;
  GST_OBJECT_UNLOCK(self);
  if (trainer.empty() || !self->have_info || !picked(self->frames, self->sample_frames, k)) return;
  auto run = run_context_find(GST_ELEMENT(self), trainer, self->run);
  if (!run) {
    if (!self->warned_no_run)
      GST_ELEMENT_WARNING(self, RESOURCE, NOT_FOUND,
                          ("No running ddptrainsink '%s' for TensorBoard images (property trainer)", trainer.c_str()),
                          (nullptr));
    self->warned_no_run = true;
    return;
  }
  GstSample *sample = gst_sample_new(buf, self->caps, nullptr, nullptr);
  GstCaps *png_caps = gst_caps_new_empty_simple("image/png");
  GError *err = nullptr;
  GstSample *png = gst_video_convert_sample(sample, png_caps, 10 * GST_SECOND, &err);
  gst_caps_unref(png_caps);
  gst_sample_unref(sample);
  if (!png) {
    GST_WARNING_OBJECT(self, "no PNG for TensorBoard: %s", err ? err->message : "?");
    if (err) g_error_free(err);
    return;
  }
  GstMapInfo map;
  GstBuffer *pb = gst_sample_get_buffer(png);
  if (gst_buffer_map(pb, &map, GST_MAP_READ)) {
    gchar *tag = g_strdup_printf("samples/prompt-%02u/frame-%03" G_GUINT64_FORMAT, self->prompt, self->frames);
    run->append_image(tag, self->step, std::string(reinterpret_cast<const char *>(map.data), map.size),
                      GST_VIDEO_INFO_WIDTH(&self->info), GST_VIDEO_INFO_HEIGHT(&self->info));
    g_free(tag);
    gst_buffer_unmap(pb, &map);
  }
  gst_sample_unref(png);
}

static GstStaticPadTemplate sink_template =
    GST_STATIC_PAD_TEMPLATE("sink", GST_PAD_SINK, GST_PAD_ALWAYS, GST_STATIC_CAPS("video/x-raw"));

// Closes the open file's pipeline (no EOS: what was written is dropped) and removes its partial file.
static void discard_file(GstSampleSink *self) {
  if (self->pipe) {
    gst_element_set_state(self->pipe, GST_STATE_NULL);
    gst_object_unref(self->pipe);
    gst_object_unref(self->appsrc);
    self->pipe = self->appsrc = nullptr;
  }
  if (!self->partial->empty()) g_unlink(self->partial->c_str());
  self->partial->clear();
}

// A sample that could not be written: by default a warning, and the next sample is tried (training
// goes on; a full disk in the samples folder must not stop it); with fail-on-error an error.
static GstFlowReturn sample_failed(GstSampleSink *self, const std::string &what, const std::string &detail) {
  discard_file(self);
  self->skipping = true;
  GST_OBJECT_LOCK(self);
  const bool fatal = self->settings->fail_on_error;
  GST_OBJECT_UNLOCK(self);
  if (fatal) {
    GST_ELEMENT_ERROR(self, RESOURCE, WRITE, ("%s", what.c_str()), ("%s", detail.c_str()));
    return GST_FLOW_ERROR;
  }
  GST_ELEMENT_WARNING(self, RESOURCE, WRITE, ("%s; the next sample is tried, training goes on", what.c_str()),
                      ("%s (fail-on-error=true makes this an error)", detail.c_str()));
  return GST_FLOW_OK;
}

// Ends the open file: EOS through its pipeline, then closed and renamed to its final name, so that
// a killed run never leaves a 0-byte or moov-less file under a sample's name. "" on success, else why.
static std::string finish_file(GstSampleSink *self) {
  if (!self->pipe) return "";
  gst_app_src_end_of_stream(GST_APP_SRC(self->appsrc));
  GstBus *bus = gst_element_get_bus(self->pipe);
  GstMessage *msg = gst_bus_timed_pop_filtered(bus, 120 * GST_SECOND, GstMessageType(GST_MESSAGE_EOS | GST_MESSAGE_ERROR));
  gst_object_unref(bus);
  std::string why;
  if (!msg || GST_MESSAGE_TYPE(msg) != GST_MESSAGE_EOS) {
    GError *err = nullptr;
    gchar *dbg = nullptr;
    if (msg) gst_message_parse_error(msg, &err, &dbg);
    why = "Could not write sample " + *self->path + ": " +
          (err ? std::string(err->message) : std::string("the encoder did not finish within 120 s")) +
          (dbg ? std::string(" (") + dbg + ")" : std::string());
    if (err) g_error_free(err);
    g_free(dbg);
  }
  if (msg) gst_message_unref(msg);
  gst_element_set_state(self->pipe, GST_STATE_NULL);
  gst_object_unref(self->pipe);
  gst_object_unref(self->appsrc);
  self->pipe = self->appsrc = nullptr;
  if (why.empty() && g_rename(self->partial->c_str(), self->path->c_str()) != 0)
    why = "Could not rename " + *self->partial + " to " + *self->path + ": " + g_strerror(errno);
  if (!why.empty()) {
    g_unlink(self->partial->c_str());
    self->partial->clear();
    self->named = false;
    return why;
  }
  self->partial->clear();
  GST_OBJECT_LOCK(self);
  self->files_written++;
  GST_OBJECT_UNLOCK(self);
  GST_INFO_OBJECT(self, "wrote %s (%" G_GUINT64_FORMAT " frames)", self->path->c_str(), self->frames);
  gst_element_post_message(GST_ELEMENT(self), gst_message_new_element(GST_OBJECT(self),
      gst_structure_new("samplesink-file", "path", G_TYPE_STRING, self->path->c_str(), "step", G_TYPE_UINT64,
                        self->step, "prompt", G_TYPE_UINT, self->prompt, "frames", G_TYPE_UINT64, self->frames,
                        nullptr)));
  self->named = false;
  return "";
}

// Opens the next file's pipeline, writing to a partial name beside the final one. FALSE: an error
// posted (a bad encoder description), or *why set (the file cannot be written).
static gboolean open_file(GstSampleSink *self, std::string *why) {
  GST_OBJECT_LOCK(self);
  const std::string location = self->settings->location, encoder = self->settings->encoder;
  GST_OBJECT_UNLOCK(self);
  *self->path = sample_file_name(location, self->step, self->prompt);
  gchar *dir = g_path_get_dirname(self->path->c_str());
  const int made = g_mkdir_with_parents(dir, 0755);
  g_free(dir);
  if (made != 0) {
    *why = "Cannot create the folder of " + *self->path + ": " + g_strerror(errno);
    return FALSE;
  }
  GError *err = nullptr;
  const std::string desc = "appsrc name=src format=time ! " + encoder + " ! filesink name=file";
  GstElement *pipe = gst_parse_launch(desc.c_str(), &err);
  if (!pipe || err) {
    GST_ELEMENT_ERROR(self, RESOURCE, SETTINGS,
                      ("Cannot build the encoder '%s': %s", encoder.c_str(), err ? err->message : "unknown"),
                      ("set encoder= to a gst-launch description from raw video to a muxed stream; the default needs "
                       "avenc_mpeg4 (gstreamer1.0-libav) and mp4mux (gstreamer1.0-plugins-good)"));
    if (err) g_error_free(err);
    if (pipe) gst_object_unref(pipe);
    return FALSE;
  }
  gchar *dir_of = g_path_get_dirname(self->path->c_str()), *base = g_path_get_basename(self->path->c_str());
  *self->partial = std::string(dir_of) + "/." + base + ".part-" + std::to_string(getpid());
  g_free(dir_of);
  g_free(base);
  GstElement *file = gst_bin_get_by_name(GST_BIN(pipe), "file");
  g_object_set(file, "location", self->partial->c_str(), nullptr);
  gst_object_unref(file);
  self->appsrc = gst_bin_get_by_name(GST_BIN(pipe), "src");
  g_object_set(self->appsrc, "caps", self->caps, "block", TRUE, "max-bytes", guint64(64) << 20, nullptr);
  self->pipe = pipe;
  self->frames = 0;
  if (gst_element_set_state(pipe, GST_STATE_PLAYING) == GST_STATE_CHANGE_FAILURE) {
    *why = "Cannot start writing " + *self->partial;
    return FALSE;
  }
  return TRUE;
}

static GstFlowReturn render(GstBaseSink *sink, GstBuffer *buf) {
  auto *self = GST_SAMPLE_SINK(sink);
  if (!self->pipe) {
    if (!self->named) {  // frames without a sampler's event: one file per stream, step 0, prompt 0
      self->named = true;
      self->step = 0;
      self->prompt = 0;
    }
    if (self->skipping) return GST_FLOW_OK;  // the rest of a sample that could not be written
    std::string why;
    if (!open_file(self, &why)) return why.empty() ? GST_FLOW_ERROR : sample_failed(self, why, "");
  }
  tensorboard_frame(self, buf);
  // Each file starts at 0 and runs at the caps' frame rate.
  GstBuffer *out = gst_buffer_copy(buf);
  if (self->have_info && self->info.fps_n > 0) {
    const GstClockTime d = gst_util_uint64_scale_int(GST_SECOND, self->info.fps_d, self->info.fps_n);
    GST_BUFFER_PTS(out) = self->frames * d;
    GST_BUFFER_DTS(out) = GST_CLOCK_TIME_NONE;
    GST_BUFFER_DURATION(out) = d;
  }
  self->frames++;
  const GstFlowReturn ret = gst_app_src_push_buffer(GST_APP_SRC(self->appsrc), out);
  if (ret == GST_FLOW_FLUSHING) {
    discard_file(self);
    return ret;
  }
  if (ret != GST_FLOW_OK) {
    // The encoder's pipeline stopped (a write that failed): its error says why.
    std::string why = finish_file(self);
    return sample_failed(self, why.empty() ? "Could not write sample " + *self->path : why, "");
  }
  return GST_FLOW_OK;
}

static gboolean sink_event(GstBaseSink *sink, GstEvent *event) {
  auto *self = GST_SAMPLE_SINK(sink);
  switch (GST_EVENT_TYPE(event)) {
    case GST_EVENT_CUSTOM_DOWNSTREAM: {
      const GstStructure *s = gst_event_get_structure(event);
      if (s && gst_structure_has_name(s, "ddpsampler-sample")) {
        if (const std::string why = finish_file(self); !why.empty() && sample_failed(self, why, "") != GST_FLOW_OK) {
          gst_event_unref(event);
          return FALSE;
        }
        self->skipping = false;  // a new sample: tried afresh
        guint64 step = 0;
        guint prompt = 0;
        gint frames = 0;
        gst_structure_get_uint64(s, "step", &step);
        gst_structure_get_uint(s, "prompt", &prompt);
        gst_structure_get_int(s, "num-frames", &frames);
        self->sample_frames = guint(MAX(frames, 0));
        self->step = step;
        self->prompt = prompt;
        self->named = true;
      }
      break;
    }
    case GST_EVENT_EOS:
      if (const std::string why = finish_file(self); !why.empty()) sample_failed(self, why, "");
      self->skipping = false;
      break;
    default: break;
  }
  return GST_BASE_SINK_CLASS(gst_sample_sink_parent_class)->event(sink, event);
}

static gboolean set_caps(GstBaseSink *sink, GstCaps *caps) {
  auto *self = GST_SAMPLE_SINK(sink);
  if (self->pipe && self->caps && !gst_caps_is_equal(self->caps, caps))
    if (const std::string why = finish_file(self); !why.empty()) sample_failed(self, why, "");
  gst_caps_replace(&self->caps, caps);
  self->have_info = gst_video_info_from_caps(&self->info, caps);
  return TRUE;
}

static gboolean start(GstBaseSink *sink) {
  auto *self = GST_SAMPLE_SINK(sink);
  GST_OBJECT_LOCK(self);
  const std::string location = self->settings->location;
  GST_OBJECT_UNLOCK(self);
  const std::string why = check_sample_pattern(location);
  if (!why.empty()) {
    GST_ELEMENT_ERROR(self, RESOURCE, SETTINGS, ("location '%s' %s", location.c_str(), why.c_str()),
                      ("e.g. location=samples/step-%%08d/prompt-%%02d.mp4"));
    return FALSE;
  }
  // The encoder description is built once here so that a missing element is an error before data flows.
  GST_OBJECT_LOCK(self);
  const std::string encoder = self->settings->encoder;
  GST_OBJECT_UNLOCK(self);
  GError *err = nullptr;
  GstElement *probe = gst_parse_bin_from_description(encoder.c_str(), TRUE, &err);
  if (!probe || err) {
    GST_ELEMENT_ERROR(self, CORE, MISSING_PLUGIN, ("Cannot build the encoder '%s': %s", encoder.c_str(),
                                                   err ? err->message : "unknown"),
                      ("set encoder= to a gst-launch description from raw video to a muxed stream; the default needs "
                       "avenc_mpeg4 (gstreamer1.0-libav) and mp4mux (gstreamer1.0-plugins-good)"));
    if (err) g_error_free(err);
    if (probe) gst_object_unref(probe);
    return FALSE;
  }
  gst_object_unref(probe);
  self->named = false;
  return TRUE;
}

static void set_context(GstElement *element, GstContext *context) {
  auto *self = GST_SAMPLE_SINK(element);
  GST_OBJECT_LOCK(self);
  const std::string name = self->settings->trainer;
  GST_OBJECT_UNLOCK(self);
  run_context_take(element, context, name, self->run);
  GST_ELEMENT_CLASS(gst_sample_sink_parent_class)->set_context(element, context);
}

static gboolean stop(GstBaseSink *sink) {
  auto *self = GST_SAMPLE_SINK(sink);
  GST_OBJECT_LOCK(self);
  self->run->reset();
  GST_OBJECT_UNLOCK(self);
  discard_file(self);  // a stop in the middle of a sample: its partial file goes, no sample name is taken
  self->skipping = false;
  gst_caps_replace(&self->caps, nullptr);
  return TRUE;
}

static void set_property(GObject *object, guint id, const GValue *value, GParamSpec *pspec) {
  auto *self = GST_SAMPLE_SINK(object);
  GST_OBJECT_LOCK(self);
  SampleSinkSettings &c = *self->settings;
  switch (id) {
    case PROP_LOCATION: c.location = string_property(value); break;
    case PROP_ENCODER: c.encoder = string_property(value); break;
    case PROP_TRAINER: c.trainer = string_property(value); break;
    case PROP_TENSORBOARD_FRAMES: c.tensorboard_frames = g_value_get_uint(value); break;
    case PROP_FAIL_ON_ERROR: c.fail_on_error = g_value_get_boolean(value); break;
    default: G_OBJECT_WARN_INVALID_PROPERTY_ID(object, id, pspec);
  }
  GST_OBJECT_UNLOCK(self);
}

static void get_property(GObject *object, guint id, GValue *value, GParamSpec *pspec) {
  auto *self = GST_SAMPLE_SINK(object);
  GST_OBJECT_LOCK(self);
  const SampleSinkSettings &c = *self->settings;
  switch (id) {
    case PROP_LOCATION: set_string_property(value, c.location); break;
    case PROP_ENCODER: set_string_property(value, c.encoder); break;
    case PROP_TRAINER: set_string_property(value, c.trainer); break;
    case PROP_TENSORBOARD_FRAMES: g_value_set_uint(value, c.tensorboard_frames); break;
    case PROP_FILES_WRITTEN: g_value_set_uint64(value, self->files_written); break;
    case PROP_FAIL_ON_ERROR: g_value_set_boolean(value, c.fail_on_error); break;
    default: G_OBJECT_WARN_INVALID_PROPERTY_ID(object, id, pspec);
  }
  GST_OBJECT_UNLOCK(self);
}

static void finalize(GObject *object) {
  auto *self = GST_SAMPLE_SINK(object);
  delete self->settings;
  delete self->run;
  delete self->path;
  delete self->partial;
  if (self->caps) gst_caps_unref(self->caps);
  G_OBJECT_CLASS(gst_sample_sink_parent_class)->finalize(object);
}

static void gst_sample_sink_init(GstSampleSink *self) {
  self->settings = new SampleSinkSettings();
  self->files_written = 0;
  self->run = new std::shared_ptr<RunContext>();
  self->sample_frames = 0;
  self->warned_no_run = false;
  self->caps = nullptr;
  self->have_info = false;
  self->named = false;
  self->pipe = self->appsrc = nullptr;
  self->path = new std::string();
  self->partial = new std::string();
  self->frames = 0;
  gst_base_sink_set_sync(GST_BASE_SINK(self), FALSE);
}

static void gst_sample_sink_class_init(GstSampleSinkClass *klass) {
  auto *gobject_class = G_OBJECT_CLASS(klass);
  auto *element_class = GST_ELEMENT_CLASS(klass);
  videotrain_one_error_install(element_class);  // one error per failure (one_error.h)
  auto *base = GST_BASE_SINK_CLASS(klass);
  gobject_class->set_property = set_property;
  gobject_class->get_property = get_property;
  gobject_class->finalize = finalize;
  const SampleSinkSettings d;  // the defaults
  const auto rw = GParamFlags(G_PARAM_READWRITE | G_PARAM_STATIC_STRINGS | GST_PARAM_MUTABLE_READY);
  g_object_class_install_property(gobject_class, PROP_LOCATION,
      g_param_spec_string("location", "Location",
                          "File name pattern: the first %d (e.g. %08d) is the step, the second the prompt index; "
                          "folders are created",
                          d.location.c_str(), rw));
  g_object_class_install_property(gobject_class, PROP_ENCODER,
      g_param_spec_string("encoder", "Encoder",
                          "gst-launch description from raw video to a muxed stream, e.g. \"videoconvert ! x264enc ! "
                          "mp4mux\" or \"videoconvert ! vp8enc ! webmmux\"",
                          d.encoder.c_str(), rw));
  g_object_class_install_property(gobject_class, PROP_TRAINER,
      g_param_spec_string("trainer", "Trainer",
                          "Name of the ddptrainsink whose TensorBoard events (its tensorboard-dir; ranks other than 0 "
                          "write to its subfolder samples-rankR) get a few frames of each sample as images; unset: none",
                          nullptr, rw));
  g_object_class_install_property(gobject_class, PROP_TENSORBOARD_FRAMES,
      g_param_spec_uint("tensorboard-frames", "TensorBoard frames",
                        "Frames per sample sent to TensorBoard, spread from the first to the last (with trainer)", 0, 64,
                        d.tensorboard_frames, rw));
  g_object_class_install_property(gobject_class, PROP_FAIL_ON_ERROR,
      g_param_spec_boolean("fail-on-error", "Fail on error",
                           "A sample that cannot be written (a full disk, a folder that cannot be made) stops the "
                           "branch with an error; by default it is a warning, its file is removed and the next "
                           "sample is tried, so that training goes on",
                           d.fail_on_error, rw));
  g_object_class_install_property(gobject_class, PROP_FILES_WRITTEN,
      g_param_spec_uint64("files-written", "Files written", "Sample files completed", 0, G_MAXUINT64, 0,
                          GParamFlags(G_PARAM_READABLE | G_PARAM_STATIC_STRINGS)));
  gst_element_class_add_static_pad_template(element_class, &sink_template);
  gst_element_class_set_static_metadata(
      element_class, "Sample sink", "Sink/Video",
      "Writes each generated sample as its own video file, named from its step and prompt" VIDEOTRAIN_DOC_SAMPLESINK_MESSAGES,
      "gst-videotrain");
  element_class->set_context = set_context;
  base->render = render;
  base->event = sink_event;
  base->set_caps = set_caps;
  base->start = start;
  base->stop = stop;
}
