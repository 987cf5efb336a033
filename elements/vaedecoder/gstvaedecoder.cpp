/* vaedecoder: the GObject face of DecodeEngine.
 *
 * Each latent buffer (application/x-videotrain-tensor, content=latents: [C, t, h, w] as
 * vaeencoder emits it, or a sampler's latents) is decoded chunk by chunk and its frames pushed
 * as soon as each chunk is decoded, as video/x-raw RGB at the `framerate` property, timestamps
 * continuous across clips. Each frame carries a clip meta made from the latent's sample meta
 * (sample id, epoch, caption, path; frame index and frames in the clip), so that frames of
 * different clips can be told apart downstream. The frame size follows each latent (caps are
 * renegotiated when it changes). A latent the VAE cannot decode (wrong channel count: another
 * VAE's latents) is an element error naming what to change. */
#include "one_error.h"
#include "gstvaedecoder.h"

#include <gst/video/video.h>

#include <memory>
#include <string>

#include "cpu_heap.h"
#include "decode_engine.h"
#include "first_line.h"
#include "metas.h"
#include "prompt_record.h"
#include "string_property.h"
#include "tensor_caps.h"

GST_DEBUG_CATEGORY_STATIC(vaedecoder_debug);
#define GST_CAT_DEFAULT vaedecoder_debug

using namespace videotrain;
using videotrain::vae::DecodeEngine;

struct _GstVaeDecoder {
  GstElement parent;
  GstPad *sinkpad, *srcpad;
  vae::DecodeOptions *settings;  // the properties (object lock)
  // Streaming state (stream lock).
  std::unique_ptr<DecodeEngine> *engine;
  int out_width, out_height;  // caps sent downstream (0: none yet)
  guint64 frames_out, clips_decoded;
  gboolean segment_sent;
};

G_DEFINE_TYPE(GstVaeDecoder, gst_vae_decoder, GST_TYPE_ELEMENT);
GST_ELEMENT_REGISTER_DEFINE_WITH_CODE(vaedecoder, "vaedecoder", GST_RANK_NONE, GST_TYPE_VAE_DECODER,
                                      GST_DEBUG_CATEGORY_INIT(vaedecoder_debug, "vaedecoder", 0,
                                                              "Causal 3D VAE decoder"));

enum {
  PROP_0,
  PROP_MODEL,
  PROP_TILE_HEIGHT,
  PROP_TILE_WIDTH,
  PROP_TILE_STRIDE_HEIGHT,
  PROP_TILE_STRIDE_WIDTH,
  PROP_FRAMERATE,
  PROP_DEVICE,
  PROP_DTYPE,
  PROP_MOMENTS,
  PROP_TUNE_MALLOC,
  PROP_CLIPS_DECODED,
};

static GstStaticPadTemplate src_template =
    GST_STATIC_PAD_TEMPLATE("src", GST_PAD_SRC, GST_PAD_ALWAYS, GST_STATIC_CAPS(GST_VIDEO_CAPS_MAKE("RGB")));

static gboolean load_engine(GstVaeDecoder *self) {
  GST_OBJECT_LOCK(self);
  const vae::DecodeOptions o = *self->settings;
  GST_OBJECT_UNLOCK(self);
  std::string error;
  std::unique_ptr<DecodeEngine> eng;
  try {  // nothing may unwind into GStreamer
    eng = DecodeEngine::create(o, &error);
  } catch (const std::exception &e) {
    error = first_line(e.what());
  } catch (...) {
    error = "unknown exception";
  }
  if (!eng) {
    GST_ELEMENT_ERROR(self, RESOURCE, SETTINGS, ("Could not set up the VAE decoder: %s", error.c_str()),
                      ("property model: a diffusers VAE folder (config.json and weights)"));
    return FALSE;
  }
  GST_INFO_OBJECT(self, "%s VAE decoder on %s (%s), %d latent channels, %dx spatial", eng->family_name().c_str(),
                  eng->device_name().c_str(), eng->dtype_name().c_str(), eng->latent_channels(),
                  eng->spatial_compression());
  *self->engine = std::move(eng);
  return TRUE;
}

// Tells a sampler upstream, at start, which latents this VAE takes (prompt_record.h).
static gboolean gst_vae_decoder_sink_query(GstPad *pad, GstObject *parent, GstQuery *query) {
  auto *self = GST_VAE_DECODER(parent);
  if (GST_QUERY_TYPE(query) == GST_QUERY_CUSTOM) {
    GstStructure *s = gst_query_writable_structure(query);
    DecodeEngine *eng = self->engine->get();
    if (s && gst_structure_has_name(s, VIDEOTRAIN_LATENT_QUERY) && eng) {
      gst_structure_set(s, "channels", G_TYPE_INT, eng->latent_channels(), "spatial", G_TYPE_INT,
                        eng->spatial_compression(), "family", G_TYPE_STRING, eng->family_name().c_str(), nullptr);
      return TRUE;
    }
  }
  return gst_pad_query_default(pad, parent, query);
}

static gboolean send_caps(GstVaeDecoder *self, int width, int height) {
  if (width == self->out_width && height == self->out_height) return TRUE;
  GST_OBJECT_LOCK(self);
  const gint n = self->settings->fps_n, d = self->settings->fps_d;
  GST_OBJECT_UNLOCK(self);
  GstCaps *caps = gst_caps_new_simple("video/x-raw", "format", G_TYPE_STRING, "RGB", "width", G_TYPE_INT, width,
                                      "height", G_TYPE_INT, height, "framerate", GST_TYPE_FRACTION, n, d,
                                      "pixel-aspect-ratio", GST_TYPE_FRACTION, 1, 1, nullptr);
  GST_DEBUG_OBJECT(self, "frames are %dx%d", width, height);
  gboolean ok = gst_pad_push_event(self->srcpad, gst_event_new_caps(caps));
  gst_caps_unref(caps);
  if (ok) self->out_width = width, self->out_height = height;
  return ok;
}

static GstFlowReturn gst_vae_decoder_chain(GstPad *, GstObject *parent, GstBuffer *latent) {
  auto *self = GST_VAE_DECODER(parent);
  DecodeEngine *eng = self->engine->get();
  if (!eng) {
    gst_buffer_unref(latent);
    GST_ELEMENT_ERROR(self, CORE, NEGOTIATION, ("vaedecoder is not set up"), ("no engine"));
    return GST_FLOW_ERROR;
  }
  GstVideoTrainTensorMeta *tm = find_tensor_meta(latent, "");
  if (!tm) {
    gst_buffer_unref(latent);
    GST_ELEMENT_ERROR(self, STREAM, FORMAT, ("A latent buffer has no tensor meta"),
                      ("connect vaedecoder to an element that emits latents (vaeencoder, a sampler)"));
    return GST_FLOW_ERROR;
  }
  const std::vector<int64_t> shape = tensor_meta_shape(tm);
  const std::string bad = eng->check_latent(shape);
  if (!bad.empty()) {
    gst_buffer_unref(latent);
    GST_ELEMENT_ERROR(self, STREAM, FORMAT, ("Cannot decode these latents"), ("%s", bad.c_str()));
    return GST_FLOW_ERROR;
  }
  SampleInfo sample;
  const bool have_sample = read_sample_meta(latent, &sample);
  const int s = eng->spatial_compression();
  if (!send_caps(self, static_cast<int>(shape[3] * s), static_cast<int>(shape[2] * s))) {
    gst_buffer_unref(latent);
    return GST_FLOW_NOT_NEGOTIATED;
  }
  if (!self->segment_sent) {
    GstSegment seg;
    gst_segment_init(&seg, GST_FORMAT_TIME);
    self->segment_sent = gst_pad_push_event(self->srcpad, gst_event_new_segment(&seg));
  }
  GST_OBJECT_LOCK(self);
  const gint fps_n = self->settings->fps_n, fps_d = self->settings->fps_d;
  GST_OBJECT_UNLOCK(self);
  const guint num_frames = static_cast<guint>(eng->frames_for(shape[1]));
  guint frame_index = 0;
  GstFlowReturn flow = GST_FLOW_OK;
  std::string why, note;
  bool ok;
  try {
    ok = eng->decode(
        latent,
        [&](GstBuffer *frame, int, int) {
          GST_BUFFER_PTS(frame) = gst_util_uint64_scale(self->frames_out, GST_SECOND * fps_d, fps_n);
          GST_BUFFER_DURATION(frame) = gst_util_uint64_scale(self->frames_out + 1, GST_SECOND * fps_d, fps_n) -
                                       GST_BUFFER_PTS(frame);
          GST_BUFFER_OFFSET(frame) = self->frames_out++;
          if (have_sample) {
            GstVideoTrainClipMeta *cm = gst_buffer_add_videotrain_clip_meta(
                frame, sample.caption.c_str(), sample.path.empty() ? nullptr : sample.path.c_str(), nullptr);
            cm->sample_id = sample.sample_id;
            cm->epoch = sample.epoch;
            cm->clip_index = sample.clip_index;
            cm->frame_index = frame_index;
            cm->num_frames = num_frames;
            cm->padding = sample.padding;
            cm->group = sample.group;
            cm->group_size = sample.group_size;
          }
          frame_index++;
          flow = gst_pad_push(self->srcpad, frame);
          return flow == GST_FLOW_OK;
        },
        &why, &note);
  } catch (const std::exception &e) {
    ok = false;
    why = first_line(e.what());
  }
  if (!note.empty()) GST_ELEMENT_WARNING(self, RESOURCE, NO_SPACE_LEFT, ("vaedecoder ran out of memory"), ("%s", note.c_str()));
  gst_buffer_unref(latent);
  if (flow != GST_FLOW_OK) return flow;  // downstream stopped (flushing, EOS, not linked)
  if (!ok) {
    GST_ELEMENT_ERROR(self, STREAM, DECODE, ("Could not decode a latent"), ("%s", why.c_str()));
    return GST_FLOW_ERROR;
  }
  self->clips_decoded++;
  GST_LOG_OBJECT(self, "decoded a clip of %u frames", frame_index);
  return GST_FLOW_OK;
}

static gboolean gst_vae_decoder_sink_event(GstPad *pad, GstObject *parent, GstEvent *event) {
  auto *self = GST_VAE_DECODER(parent);
  switch (GST_EVENT_TYPE(event)) {
    case GST_EVENT_CAPS: {
      GstCaps *caps;
      gst_event_parse_caps(event, &caps);
      TensorCapsInfo info;
      std::string why;
      const bool ok = tensor_caps_parse(caps, &info, &why);
      if (!ok || info.content != "latents") {
        GST_ELEMENT_ERROR(self, CORE, NEGOTIATION, ("vaedecoder takes latents"),
                          ("%s", ok ? "caps say content=micro-batch: put vaedecoder before microbatcher"
                                    : why.c_str()));
        gst_event_unref(event);
        return FALSE;
      }
      gst_event_unref(event);  // the frame caps follow each latent's size
      return TRUE;
    }
    case GST_EVENT_SEGMENT:
      // Frames are timed by the framerate from 0, whatever the latents' times: a time segment of our
      // own follows the frame caps (push_segment).
      gst_event_unref(event);
      self->segment_sent = FALSE;
      return TRUE;
    default:
      return gst_pad_event_default(pad, parent, event);
  }
}

static GstStateChangeReturn gst_vae_decoder_change_state(GstElement *element, GstStateChange transition) {
  auto *self = GST_VAE_DECODER(element);
  switch (transition) {
    case GST_STATE_CHANGE_NULL_TO_READY:
      if (!load_engine(self)) return GST_STATE_CHANGE_FAILURE;
      break;
    case GST_STATE_CHANGE_READY_TO_PAUSED:
      self->out_width = self->out_height = 0;
      self->frames_out = 0;
      self->segment_sent = FALSE;
      break;
    default:
      break;
  }
  GstStateChangeReturn ret = GST_ELEMENT_CLASS(gst_vae_decoder_parent_class)->change_state(element, transition);
  if (transition == GST_STATE_CHANGE_READY_TO_NULL) self->engine->reset();
  return ret;
}

static void gst_vae_decoder_set_property(GObject *object, guint id, const GValue *value, GParamSpec *pspec) {
  auto *self = GST_VAE_DECODER(object);
  GST_OBJECT_LOCK(self);
  vae::DecodeOptions &c = *self->settings;
  // Tile sizes are at most 16384 (the specs' range): they fit the engine's ints.
  auto pixels = [value]() { return static_cast<int>(g_value_get_uint(value)); };
  switch (id) {
    case PROP_MODEL: c.model = string_property(value); break;
    case PROP_TILE_HEIGHT: c.tile_height = pixels(); break;
    case PROP_TILE_WIDTH: c.tile_width = pixels(); break;
    case PROP_TILE_STRIDE_HEIGHT: c.tile_stride_height = pixels(); break;
    case PROP_TILE_STRIDE_WIDTH: c.tile_stride_width = pixels(); break;
    case PROP_FRAMERATE:
      c.fps_n = gst_value_get_fraction_numerator(value);
      c.fps_d = gst_value_get_fraction_denominator(value);
      break;
    case PROP_DEVICE: c.device = string_property(value); break;
    case PROP_DTYPE: c.dtype = string_property(value); break;
    case PROP_MOMENTS: c.moments = g_value_get_boolean(value); break;
    case PROP_TUNE_MALLOC: c.tune_malloc = g_value_get_boolean(value); break;
    default: G_OBJECT_WARN_INVALID_PROPERTY_ID(object, id, pspec); break;
  }
  GST_OBJECT_UNLOCK(self);
}

static void gst_vae_decoder_get_property(GObject *object, guint id, GValue *value, GParamSpec *pspec) {
  auto *self = GST_VAE_DECODER(object);
  GST_OBJECT_LOCK(self);
  const vae::DecodeOptions &c = *self->settings;
  switch (id) {
    case PROP_MODEL: set_string_property(value, c.model); break;
    case PROP_TILE_HEIGHT: g_value_set_uint(value, guint(c.tile_height)); break;
    case PROP_TILE_WIDTH: g_value_set_uint(value, guint(c.tile_width)); break;
    case PROP_TILE_STRIDE_HEIGHT: g_value_set_uint(value, guint(c.tile_stride_height)); break;
    case PROP_TILE_STRIDE_WIDTH: g_value_set_uint(value, guint(c.tile_stride_width)); break;
    case PROP_FRAMERATE: gst_value_set_fraction(value, c.fps_n, c.fps_d); break;
    case PROP_DEVICE: set_string_property(value, c.device); break;
    case PROP_DTYPE: set_string_property(value, c.dtype); break;
    case PROP_MOMENTS: g_value_set_boolean(value, c.moments); break;
    case PROP_TUNE_MALLOC: g_value_set_boolean(value, c.tune_malloc); break;
    case PROP_CLIPS_DECODED: g_value_set_uint64(value, self->clips_decoded); break;
    default: G_OBJECT_WARN_INVALID_PROPERTY_ID(object, id, pspec); break;
  }
  GST_OBJECT_UNLOCK(self);
}

static void gst_vae_decoder_finalize(GObject *object) {
  auto *self = GST_VAE_DECODER(object);
  delete self->engine;
  delete self->settings;
  G_OBJECT_CLASS(gst_vae_decoder_parent_class)->finalize(object);
}

static void gst_vae_decoder_class_init(GstVaeDecoderClass *klass) {
  auto *gobject_class = G_OBJECT_CLASS(klass);
  auto *element_class = GST_ELEMENT_CLASS(klass);
  videotrain_one_error_install(element_class);  // one error per failure (one_error.h)
  gobject_class->set_property = gst_vae_decoder_set_property;
  gobject_class->get_property = gst_vae_decoder_get_property;
  gobject_class->finalize = gst_vae_decoder_finalize;
  element_class->change_state = gst_vae_decoder_change_state;

  const vae::DecodeOptions d;  // the defaults
  const auto rw = GParamFlags(G_PARAM_READWRITE | G_PARAM_STATIC_STRINGS | GST_PARAM_MUTABLE_READY);
  const auto ro = GParamFlags(G_PARAM_READABLE | G_PARAM_STATIC_STRINGS);
  g_object_class_install_property(
      gobject_class, PROP_MODEL,
      g_param_spec_string("model", "Model",
                          "A diffusers VAE folder (config.json + diffusion_pytorch_model.safetensors with the "
                          "decoder tensors) of class AutoencoderKLCogVideoX or AutoencoderKLWan (Wan 2.1/2.2): the "
                          "VAE that encoded the latents",
                          nullptr, rw));
  g_object_class_install_property(
      gobject_class, PROP_TILE_HEIGHT,
      g_param_spec_uint("tile-height", "Tile height",
                        "Spatial tile height in output pixels (0: no tiles), a multiple of the VAE's spatial "
                        "compression; latents larger than a tile are decoded tile by tile (diffusers' "
                        "enable_tiling: tile_sample_min_height)",
                        0, 16384, guint(d.tile_height), rw));
  g_object_class_install_property(
      gobject_class, PROP_TILE_WIDTH,
      g_param_spec_uint("tile-width", "Tile width", "Spatial tile width in output pixels (0: no tiles)", 0, 16384,
                        guint(d.tile_width), rw));
  g_object_class_install_property(
      gobject_class, PROP_TILE_STRIDE_HEIGHT,
      g_param_spec_uint("tile-stride-height", "Tile stride height",
                        "Output pixels from one tile row to the next (0: 3/4 of tile-height); tiles blend "
                        "linearly over tile-height - stride rows (CogVideoX's overlap factor f: stride = tile - "
                        "int(tile * f))",
                        0, 16384, guint(d.tile_stride_height), rw));
  g_object_class_install_property(
      gobject_class, PROP_TILE_STRIDE_WIDTH,
      g_param_spec_uint("tile-stride-width", "Tile stride width",
                        "Output pixels from one tile column to the next (0: 3/4 of tile-width)", 0, 16384,
                        guint(d.tile_stride_width), rw));
  g_object_class_install_property(
      gobject_class, PROP_FRAMERATE,
      gst_param_spec_fraction("framerate", "Framerate", "Frame rate of the decoded video (latents carry none)", 1, 1,
                              1000, 1, d.fps_n, d.fps_d, rw));
  g_object_class_install_property(
      gobject_class, PROP_DEVICE,
      g_param_spec_string("device", "Device",
                          "auto (or empty), cpu, cuda or cuda:N; auto: cuda:(LOCAL_RANK mod visible GPUs) when CUDA "
                          "is available, else cpu",
                          nullptr, rw));
  g_object_class_install_property(
      gobject_class, PROP_DTYPE,
      g_param_spec_string("dtype", "Dtype",
                          "float32, bfloat16 or float16 (default: bfloat16 on CUDA, float32 on CPU)", nullptr, rw));
  g_object_class_install_property(
      gobject_class, PROP_MOMENTS,
      g_param_spec_boolean("moments", "Moments",
                           "The latents are vaeencoder's latent=moments (mean and log-variance, 2x the channels): the "
                           "mean is decoded as it is. Off: the latents are the model's (latent=mode or sample, a "
                           "sampler's output), whose normalisation is undone first",
                           d.moments, rw));
  g_object_class_install_property(gobject_class, PROP_TUNE_MALLOC,
                                  g_param_spec_boolean("tune-malloc", "Tune malloc", kTuneMallocBlurb, d.tune_malloc, rw));
  g_object_class_install_property(
      gobject_class, PROP_CLIPS_DECODED,
      g_param_spec_uint64("clips-decoded", "Clips decoded", "Latents decoded so far", 0, G_MAXUINT64, 0, ro));

  gst_element_class_set_static_metadata(
      element_class, "Causal 3D VAE decoder", "Filter/Decoder/Video",
      "Decodes latents (one tensor buffer per clip, as vaeencoder emits them) with a diffusers VAE folder's decoder "
      "(CogVideoX, Wan 2.1, Wan 2.2) as diffusers decodes: the family's latent normalisation undone, latent frames "
      "streamed through the causal cache (CogVideoX 2 at a time, Wan 1) and each chunk's RGB frames pushed as soon "
      "as they are decoded, so memory does not grow with the clip; optional spatial tiles",
      "gst-videotrain");
  GstCaps *sink_caps = tensor_caps_template("latents");
  gst_element_class_add_pad_template(element_class,
                                     gst_pad_template_new("sink", GST_PAD_SINK, GST_PAD_ALWAYS, sink_caps));
  gst_caps_unref(sink_caps);
  gst_element_class_add_static_pad_template(element_class, &src_template);
}

static void gst_vae_decoder_init(GstVaeDecoder *self) {
  self->sinkpad =
      gst_pad_new_from_template(gst_element_class_get_pad_template(GST_ELEMENT_GET_CLASS(self), "sink"), "sink");
  gst_pad_set_chain_function(self->sinkpad, gst_vae_decoder_chain);
  gst_pad_set_event_function(self->sinkpad, gst_vae_decoder_sink_event);
  gst_pad_set_query_function(self->sinkpad, gst_vae_decoder_sink_query);
  gst_element_add_pad(GST_ELEMENT(self), self->sinkpad);
  self->srcpad = gst_pad_new_from_static_template(&src_template, "src");
  gst_pad_use_fixed_caps(self->srcpad);
  gst_element_add_pad(GST_ELEMENT(self), self->srcpad);
  self->settings = new vae::DecodeOptions();
  self->engine = new std::unique_ptr<DecodeEngine>();
}
