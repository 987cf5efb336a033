/* imageencoder: the GObject face of ImageEncoderEngine (through ImageBuffers).
 *
 * Latent buffers with vaeencoder's condition_frames (uint8 [n, H, W, 3], condition=first-frame or
 * first-last-frame) in; the same buffers out with image_embeds [n, tokens, dim] (the CLIP vision
 * encoder's hidden_states[hidden-state]) in place of condition_frames, every other tensor and meta
 * kept, so it sits before or after textencoder. One buffer at a time: a clip's frames are one call. */
#include "one_error.h"
#include "gstimageencoder.h"
#include "bus_messages_doc.h"

#include <memory>
#include <sstream>
#include <string>

#include "image_buffers.h"
#include "models/model_family.h"
#include "string_property.h"
#include "tensor_caps.h"

GST_DEBUG_CATEGORY_STATIC(imageencoder_debug);
#define GST_CAT_DEFAULT imageencoder_debug

using namespace videotrain;
using namespace videotrain::image;

namespace {

const ImageEncoderOptions kDefaults;

// The caps' tensors field after this element: condition_frames gone, image_embeds last.
std::string tensors_after(const char *up) {
  std::string out;
  std::stringstream in(up ? up : "");
  for (std::string name; std::getline(in, name, ',');)
    if (!name.empty() && name != "condition_frames" && name != "image_embeds") out += name + ",";
  return out + "image_embeds";
}

}  // namespace

struct _GstImageEncoder {
  GstElement parent;
  GstPad *sinkpad, *srcpad;
  ImageEncoderOptions *settings;        // object lock
  std::unique_ptr<ImageBuffers> *encoder;  // streaming thread; set and reset in state changes
};

G_DEFINE_TYPE(GstImageEncoder, gst_image_encoder, GST_TYPE_ELEMENT);
GST_ELEMENT_REGISTER_DEFINE_WITH_CODE(imageencoder, "imageencoder", GST_RANK_NONE, GST_TYPE_IMAGE_ENCODER,
                                      GST_DEBUG_CATEGORY_INIT(imageencoder_debug, "imageencoder", 0,
                                                              "Image embeddings of the condition frames from a CLIP "
                                                              "vision encoder"));

enum {
  PROP_0,
  PROP_MODEL,
  PROP_PROCESSOR,
  PROP_HIDDEN_STATE,
  PROP_DEVICE,
  PROP_DTYPE,
  PROP_CACHE_DIR,
  PROP_CLIPS_ENCODED,
};

static GstStaticPadTemplate sink_template = GST_STATIC_PAD_TEMPLATE(
    "sink", GST_PAD_SINK, GST_PAD_ALWAYS,
    GST_STATIC_CAPS(VIDEOTRAIN_TENSOR_MEDIA_TYPE ", content=(string){ latents, prompts }"));
static GstStaticPadTemplate src_template = GST_STATIC_PAD_TEMPLATE(
    "src", GST_PAD_SRC, GST_PAD_ALWAYS,
    GST_STATIC_CAPS(VIDEOTRAIN_TENSOR_MEDIA_TYPE ", content=(string){ latents, prompts }"));  // tensors: upstream's less condition_frames, then image_embeds

// At EOS: what the stream cost, and whether the encoder was loaded at all (with cache-dir it is
// loaded only for frames the cache lacks).
static void post_summary(GstImageEncoder *self) {
  if (!*self->encoder) return;
  const ImageEncoderStats s = (*self->encoder)->stats();
  const bool loaded = s.encoder_loaded;
  if (!loaded) GST_INFO_OBJECT(self, "every clip came from cache-dir: the image encoder was not loaded");
  GstStructure *m = gst_structure_new("imageencoder-summary", "clips", G_TYPE_UINT64, s.clips, "encoded",
                                      G_TYPE_UINT64, s.encoded, "cache-reads", G_TYPE_UINT64, s.cache_reads,
                                      "encoder-loaded", G_TYPE_BOOLEAN, loaded, nullptr);
  gst_element_post_message(GST_ELEMENT(self), gst_message_new_element(GST_OBJECT(self), m));
}

static GstFlowReturn gst_image_encoder_chain(GstPad *, GstObject *parent, GstBuffer *buf) {
  auto *self = GST_IMAGE_ENCODER(parent);
  if (!*self->encoder) {
    gst_buffer_unref(buf);
    return GST_FLOW_FLUSHING;
  }
  std::string err, w;
  const ImageBuffers::Result r = (*self->encoder)->attach(&buf, &err, &w);
  if (!w.empty())
    GST_ELEMENT_WARNING(self, RESOURCE, WRITE, ("%s", w.c_str()), ("property cache-dir"));
  if (r == ImageBuffers::Result::kNoFrames) {
    gst_buffer_unref(buf);
    // Each layout that takes image_embeds, with the condition that gives it its frames.
    const std::string conditions = models::per_image_layout(
        [](const models::ModelFamily &, const models::ImageLayout &l) {
          if (!l.image_embeddings) return std::string();
          return std::string(l.images == 2 ? "condition=first-last-frame" : "condition=first-frame") + " (" + l.name +
                 ")";
        },
        " or ");
    GST_ELEMENT_ERROR(self, STREAM, FORMAT,
                      ("A latent buffer without condition_frames: imageencoder encodes the clip's first (and last) "
                       "frame that vaeencoder sends with condition=first-frame or condition=first-last-frame"),
                      ("set vaeencoder %s upstream", conditions.c_str()));
    return GST_FLOW_ERROR;
  }
  if (r == ImageBuffers::Result::kError) {
    gst_buffer_unref(buf);
    GST_ELEMENT_ERROR(self, STREAM, FAILED, ("Image encoding failed: %s", err.c_str()),
                      ("check properties model and processor (with cache-dir the encoder is loaded at the first "
                       "uncached clip)"));
    return GST_FLOW_ERROR;
  }
  return gst_pad_push(self->srcpad, buf);
}

static gboolean gst_image_encoder_sink_event(GstPad *pad, GstObject *parent, GstEvent *event) {
  auto *self = GST_IMAGE_ENCODER(parent);
  switch (GST_EVENT_TYPE(event)) {
    case GST_EVENT_CAPS: {
      GstCaps *caps;
      gst_event_parse_caps(event, &caps);
      GstCaps *out = gst_caps_copy(caps);
      const std::string tensors = tensors_after(gst_structure_get_string(gst_caps_get_structure(out, 0), "tensors"));
      gst_caps_set_simple(out, "tensors", G_TYPE_STRING, tensors.c_str(), nullptr);
      gst_event_unref(event);
      gboolean ok = gst_pad_push_event(self->srcpad, gst_event_new_caps(out));
      gst_caps_unref(out);
      return ok;
    }
    case GST_EVENT_EOS:
      post_summary(self);
      break;
    default:
      break;
  }
  return gst_pad_event_default(pad, parent, event);
}

static GstStateChangeReturn gst_image_encoder_change_state(GstElement *element, GstStateChange transition) {
  auto *self = GST_IMAGE_ENCODER(element);
  if (transition == GST_STATE_CHANGE_READY_TO_PAUSED) {
    GST_OBJECT_LOCK(self);
    ImageEncoderOptions opts = *self->settings;
    GST_OBJECT_UNLOCK(self);
    std::string err;
    auto enc = ImageBuffers::create(opts, &err);
    if (!enc) {
      GST_ELEMENT_ERROR(self, RESOURCE, SETTINGS, ("Cannot start the image encoder: %s", err.c_str()),
                        ("model=%s processor=%s", opts.model.c_str(), opts.processor.c_str()));
      return GST_STATE_CHANGE_FAILURE;
    }
    const ImageEncoderInfo &i = enc->info();
    GST_INFO_OBJECT(self, "image encoder on %s, %s, hidden_states[%d] of [n, %" G_GINT64_FORMAT ", %" G_GINT64_FORMAT
                    "], processor %s", i.device.c_str(), i.dtype.c_str(), i.layer, i.tokens, i.embed_dim,
                    i.processor_dir.c_str());
    *self->encoder = std::move(enc);
  }
  GstStateChangeReturn ret = GST_ELEMENT_CLASS(gst_image_encoder_parent_class)->change_state(element, transition);
  if (transition == GST_STATE_CHANGE_PAUSED_TO_READY) {
    if (*self->encoder) {
      const ImageEncoderStats s = (*self->encoder)->stats();
      GST_INFO_OBJECT(self, "%" G_GUINT64_FORMAT " clips, %" G_GUINT64_FORMAT " encoded, %" G_GUINT64_FORMAT
                      " from cache-dir", s.clips, s.encoded, s.cache_reads);
    }
    self->encoder->reset();
  }
  return ret;
}

static void gst_image_encoder_set_property(GObject *object, guint id, const GValue *value, GParamSpec *pspec) {
  auto *self = GST_IMAGE_ENCODER(object);
  GST_OBJECT_LOCK(self);
  ImageEncoderOptions &s = *self->settings;
  switch (id) {
    case PROP_MODEL: s.model = string_property(value); break;
    case PROP_PROCESSOR: s.processor = string_property(value); break;
    case PROP_HIDDEN_STATE: s.hidden_state = g_value_get_int(value); break;
    case PROP_DEVICE: s.device = string_property(value); break;
    case PROP_DTYPE: s.dtype = string_property(value); break;
    case PROP_CACHE_DIR: s.cache_dir = string_property(value); break;
    default: G_OBJECT_WARN_INVALID_PROPERTY_ID(object, id, pspec); break;
  }
  GST_OBJECT_UNLOCK(self);
}

static void gst_image_encoder_get_property(GObject *object, guint id, GValue *value, GParamSpec *pspec) {
  auto *self = GST_IMAGE_ENCODER(object);
  if (id == PROP_CLIPS_ENCODED) {
    // The streaming thread owns the encoder; stats() copies counters (a racy read is harmless).
    g_value_set_uint64(value, *self->encoder ? (*self->encoder)->stats().encoded : 0);
    return;
  }
  GST_OBJECT_LOCK(self);
  const ImageEncoderOptions &s = *self->settings;
  switch (id) {
    case PROP_MODEL: g_value_set_string(value, s.model.c_str()); break;
    case PROP_PROCESSOR: g_value_set_string(value, s.processor.c_str()); break;
    case PROP_HIDDEN_STATE: g_value_set_int(value, s.hidden_state); break;
    case PROP_DEVICE: g_value_set_string(value, s.device.c_str()); break;
    case PROP_DTYPE: g_value_set_string(value, s.dtype.c_str()); break;
    case PROP_CACHE_DIR: g_value_set_string(value, s.cache_dir.c_str()); break;
    default: G_OBJECT_WARN_INVALID_PROPERTY_ID(object, id, pspec); break;
  }
  GST_OBJECT_UNLOCK(self);
}

static void gst_image_encoder_init(GstImageEncoder *self) {
  self->settings = new ImageEncoderOptions(kDefaults);
  self->encoder = new std::unique_ptr<ImageBuffers>();
  self->sinkpad = gst_pad_new_from_static_template(&sink_template, "sink");
  gst_pad_set_chain_function(self->sinkpad, gst_image_encoder_chain);
  gst_pad_set_event_function(self->sinkpad, gst_image_encoder_sink_event);
  GST_PAD_SET_PROXY_ALLOCATION(self->sinkpad);
  gst_element_add_pad(GST_ELEMENT(self), self->sinkpad);
  self->srcpad = gst_pad_new_from_static_template(&src_template, "src");
  gst_element_add_pad(GST_ELEMENT(self), self->srcpad);
}

static void gst_image_encoder_finalize(GObject *object) {
  auto *self = GST_IMAGE_ENCODER(object);
  delete self->encoder;
  delete self->settings;
  G_OBJECT_CLASS(gst_image_encoder_parent_class)->finalize(object);
}

static void gst_image_encoder_class_init(GstImageEncoderClass *klass) {
  auto *oc = G_OBJECT_CLASS(klass);
  auto *ec = GST_ELEMENT_CLASS(klass);
  videotrain_one_error_install(ec);  // one error per failure (one_error.h)
  oc->set_property = gst_image_encoder_set_property;
  oc->get_property = gst_image_encoder_get_property;
  oc->finalize = gst_image_encoder_finalize;
  ec->change_state = gst_image_encoder_change_state;
  const auto rw = static_cast<GParamFlags>(G_PARAM_READWRITE | G_PARAM_STATIC_STRINGS | GST_PARAM_MUTABLE_READY);
  const auto ro = static_cast<GParamFlags>(G_PARAM_READABLE | G_PARAM_STATIC_STRINGS);
  g_object_class_install_property(
      oc, PROP_MODEL,
      g_param_spec_string("model", "Model",
                          "The image encoder: a transformers folder (config.json with CLIPVisionModel or "
                          "CLIPVisionModelWithProjection, model.safetensors or shards; F32/F16/BF16): the "
                          "image_encoder/ of a Wan 2.1 I2V / FLF2V model, run natively",
                          "", rw));
  g_object_class_install_property(
      oc, PROP_PROCESSOR,
      g_param_spec_string("processor", "Processor",
                          "The image processor: an image_processor/ folder (preprocessor_config.json of a "
                          "CLIPImageProcessor: resize, center crop, rescale, normalise as transformers does); empty: "
                          "the image_processor/ folder beside model (model/../image_processor)",
                          "", rw));
  g_object_class_install_property(
      oc, PROP_HIDDEN_STATE,
      g_param_spec_int("hidden-state", "Hidden state",
                       "Which of transformers' hidden_states becomes image_embeds: 0 the embeddings, i block i's "
                       "output, negative from the end (-1 the last block's output); -2, the penultimate, is what "
                       "Wan 2.1 I2V / FLF2V take",
                       -256, 256, kDefaults.hidden_state, rw));
  g_object_class_install_property(
      oc, PROP_DEVICE,
      g_param_spec_string("device", "Device",
                          "Device of the image encoder: auto (or empty), cpu, cuda or cuda:N; auto: "
                          "cuda:(LOCAL_RANK mod visible GPUs) when CUDA is available, else cpu",
                          "", rw));
  g_object_class_install_property(
      oc, PROP_DTYPE,
      g_param_spec_string("dtype", "Dtype",
                          "dtype of the encoder and of image_embeds: float32, bfloat16 or float16; empty: bfloat16 on "
                          "CUDA, float32 on CPU",
                          "", rw));
  g_object_class_install_property(
      oc, PROP_CACHE_DIR,
      g_param_spec_string("cache-dir", "Cache folder",
                          "Latent cache folder (vaeencoder's cache-dir may be used) where image_embeds are kept across "
                          "runs, keyed by the frames' bytes, the encoder folder (config and weights files), the "
                          "processor config, hidden-state, dtype and device type; the encoder is then loaded only for "
                          "a clip the cache lacks. \"\": no cache",
                          "", rw));
  g_object_class_install_property(
      oc, PROP_CLIPS_ENCODED,
      g_param_spec_uint64("clips-encoded", "Clips encoded",
                          "Clips whose frames went through the image encoder so far (cache misses)", 0, G_MAXUINT64, 0,
                          ro));
  gst_element_class_set_static_metadata(
      ec, "Image encoder", "Filter/Encoder/Image",
      "Image-to-video: replaces each latent buffer's condition_frames (vaeencoder condition=first-frame or "
      "first-last-frame) by the named tensor image_embeds [n, tokens, dim], the CLIP vision encoder's "
      "hidden_states[hidden-state] of the processed frame(s), as WanImageToVideoPipeline.encode_image gives "
      "them" VIDEOTRAIN_DOC_IMAGEENCODER_MESSAGES,
      "gst-videotrain");
  gst_element_class_add_static_pad_template(ec, &sink_template);
  gst_element_class_add_static_pad_template(ec, &src_template);
}
