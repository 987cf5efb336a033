/* textencoder: the GObject face of TextEncoderEngine (through TextBuffers).
 *
 * Latent buffers (one per clip, with a sample meta) in; the same buffers out with the
 * caption's embedding and mask added as the named tensors text_embeds [L, D] and text_mask [L].
 * Up to batch-size buffers are held so that their captions are encoded in one call; a
 * serialized event (the epoch event, EOS, a segment) sends the held ones first. */
#include "one_error.h"
#include "gsttextencoder.h"
#include "bus_messages_doc.h"

#include <memory>
#include <string>
#include <vector>

#include "models/model_family.h"
#include "string_property.h"
#include "tensor_caps.h"
#include "text_buffers.h"

GST_DEBUG_CATEGORY_STATIC(textencoder_debug);
#define GST_CAT_DEFAULT textencoder_debug

using namespace videotrain;
using namespace videotrain::text;

namespace {

const TextEncoderOptions kDefaults;

// Streaming state (stream lock), and after the pads are deactivated, state changes.
struct State {
  std::unique_ptr<TextBuffers> encoder;
  std::vector<GstBuffer *> held;
  size_t warned_without_meta = 0;
  GstClockTime sample_duration = GST_CLOCK_TIME_NONE;
  // Downstream's last answer (EOS after ddptrainsink's max-steps, flushing, not-linked): held
  // buffers pushed by an event get it too, and every later buffer returns it upstream, so
  // that the source stops even when no batch ever fills between two epoch events.
  GstFlowReturn downstream = GST_FLOW_OK;

  void drop_held() {
    for (GstBuffer *b : held) gst_buffer_unref(b);
    held.clear();
  }
};

}  // namespace

struct _GstTextEncoder {
  GstElement parent;
  GstPad *sinkpad, *srcpad;
  TextEncoderOptions *settings;  // object lock
  State *state;
};

G_DEFINE_TYPE(GstTextEncoder, gst_text_encoder, GST_TYPE_ELEMENT);
GST_ELEMENT_REGISTER_DEFINE_WITH_CODE(textencoder, "textencoder", GST_RANK_NONE, GST_TYPE_TEXT_ENCODER,
                                      GST_DEBUG_CATEGORY_INIT(textencoder_debug, "textencoder", 0,
                                                              "Caption embeddings from a T5 / umT5 or TorchScript text encoder"));

enum {
  PROP_0,
  PROP_TOKENIZER,
  PROP_MODEL,
  PROP_MAX_LENGTH,
  PROP_DEVICE,
  PROP_DTYPE,
  PROP_BATCH_SIZE,
  PROP_CAPTION_DROPOUT,
  PROP_SEED,
  PROP_CACHE_ENTRIES,
  PROP_CACHE_DIR,
  PROP_EMBEDDING_CONVENTION,
  PROP_CLEAN_PROMPTS,
  PROP_CAPTIONS_ENCODED,
};

static GstStaticPadTemplate sink_template = GST_STATIC_PAD_TEMPLATE(
    "sink", GST_PAD_SINK, GST_PAD_ALWAYS,
    GST_STATIC_CAPS(VIDEOTRAIN_TENSOR_MEDIA_TYPE ", content=(string){ latents, prompts }"));
static GstStaticPadTemplate src_template = GST_STATIC_PAD_TEMPLATE(
    "src", GST_PAD_SRC, GST_PAD_ALWAYS,
    GST_STATIC_CAPS(VIDEOTRAIN_TENSOR_MEDIA_TYPE ", content=(string){ latents, prompts }"));  // tensors: upstream's, then text_embeds,text_mask

// Encodes and pushes the held buffers.
static GstFlowReturn push_held(GstTextEncoder *self) {
  State &st = *self->state;
  if (st.held.empty()) return GST_FLOW_OK;
  if (!st.encoder) {
    st.drop_held();
    return GST_FLOW_FLUSHING;
  }
  size_t without_meta = 0;
  std::string err;
  const bool attached = st.encoder->attach(st.held, &without_meta, &err);
  if (std::string w = st.encoder->take_warning(); !w.empty())
    GST_ELEMENT_WARNING(self, RESOURCE, WRITE, ("%s", w.c_str()), ("property cache-dir"));
  if (!attached) {
    st.drop_held();
    GST_ELEMENT_ERROR(self, STREAM, FAILED, ("Text encoding failed: %s", err.c_str()),
                      ("check property model: a T5 / umT5 folder (with cache-dir loaded at the first uncached "
                       "caption) or a TorchScript encoder taking input_ids and attention_mask"));
    return GST_FLOW_ERROR;
  }
  if (without_meta > 0 && st.warned_without_meta == 0)
    GST_ELEMENT_WARNING(self, STREAM, FORMAT, ("Latents without a sample meta: encoding the empty caption for them"),
                        ("put textencoder after vaeencoder (its output carries each clip's caption)"));
  st.warned_without_meta += without_meta;
  GstFlowReturn ret = GST_FLOW_OK;
  std::vector<GstBuffer *> out;
  out.swap(st.held);
  for (size_t i = 0; i < out.size(); i++) {
    if (ret != GST_FLOW_OK) {
      gst_buffer_unref(out[i]);
      continue;
    }
    ret = gst_pad_push(self->srcpad, out[i]);
  }
  st.downstream = ret;
  return ret;
}

// At EOS: what the stream cost, and whether the encoder was loaded at all (with cache-dir a folder
// encoder is loaded only for a caption the cache lacks).
static void post_summary(GstTextEncoder *self) {
  if (!self->state->encoder) return;
  const TextEncoderStats s = self->state->encoder->stats();
  const bool loaded = self->state->encoder->encoder_loaded();
  if (!loaded)
    GST_INFO_OBJECT(self, "every caption came from cache-dir: the text encoder was not loaded");
  GstStructure *m = gst_structure_new("textencoder-summary", "captions", G_TYPE_UINT64, s.captions, "encoded",
                                      G_TYPE_UINT64, s.encoded, "cache-reads", G_TYPE_UINT64, s.cache_reads,
                                      "dropped", G_TYPE_UINT64, s.dropped, "encoder-loaded", G_TYPE_BOOLEAN, loaded,
                                      nullptr);
  gst_element_post_message(GST_ELEMENT(self), gst_message_new_element(GST_OBJECT(self), m));
}

static GstFlowReturn gst_text_encoder_chain(GstPad *, GstObject *parent, GstBuffer *buf) {
  auto *self = GST_TEXT_ENCODER(parent);
  State &st = *self->state;
  if (st.downstream != GST_FLOW_OK) {
    gst_buffer_unref(buf);
    return st.downstream;
  }
  if (GST_BUFFER_DURATION_IS_VALID(buf)) st.sample_duration = GST_BUFFER_DURATION(buf);
  st.held.push_back(buf);
  GST_OBJECT_LOCK(self);
  const size_t batch = static_cast<size_t>(self->settings->batch_size);
  GST_OBJECT_UNLOCK(self);
  return st.held.size() >= batch ? push_held(self) : GST_FLOW_OK;
}

static gboolean gst_text_encoder_sink_event(GstPad *pad, GstObject *parent, GstEvent *event) {
  auto *self = GST_TEXT_ENCODER(parent);
  switch (GST_EVENT_TYPE(event)) {
    case GST_EVENT_CAPS: {
      GstCaps *caps;
      gst_event_parse_caps(event, &caps);
      GstCaps *out = gst_caps_copy(caps);
      // After the tensors the buffers already carry (vaeencoder's condition), in buffer order.
      const char *up = gst_structure_get_string(gst_caps_get_structure(out, 0), "tensors");
      const std::string tensors = std::string(up && *up ? std::string(up) + "," : "") + "text_embeds,text_mask";
      gst_caps_set_simple(out, "tensors", G_TYPE_STRING, tensors.c_str(), nullptr);
      gst_event_unref(event);
      gboolean ok = gst_pad_push_event(self->srcpad, gst_event_new_caps(out));
      gst_caps_unref(out);
      return ok;
    }
    case GST_EVENT_FLUSH_STOP:
      self->state->drop_held();
      self->state->downstream = GST_FLOW_OK;
      break;
    case GST_EVENT_STREAM_START:
    case GST_EVENT_SEGMENT:  // a new stream or segment may flow again (as queue does)
      if (push_held(self) == GST_FLOW_ERROR) {
        gst_event_unref(event);
        return FALSE;
      }
      self->state->downstream = GST_FLOW_OK;
      break;
    case GST_EVENT_EOS:
      if (push_held(self) == GST_FLOW_ERROR) {
        gst_event_unref(event);
        return FALSE;
      }
      post_summary(self);
      break;
    default:
      if (GST_EVENT_IS_SERIALIZED(event) && push_held(self) == GST_FLOW_ERROR) {
        gst_event_unref(event);
        return FALSE;
      }
      break;
  }
  return gst_pad_event_default(pad, parent, event);
}

static gboolean gst_text_encoder_src_query(GstPad *pad, GstObject *parent, GstQuery *query) {
  auto *self = GST_TEXT_ENCODER(parent);
  if (GST_QUERY_TYPE(query) == GST_QUERY_LATENCY) {
    // A buffer can wait for batch-size - 1 later ones.
    if (!gst_pad_peer_query(self->sinkpad, query)) return FALSE;
    gboolean live;
    GstClockTime min, max;
    gst_query_parse_latency(query, &live, &min, &max);
    GST_OBJECT_LOCK(self);
    const guint held = static_cast<guint>(self->settings->batch_size - 1);
    GST_OBJECT_UNLOCK(self);
    const GstClockTime dur = self->state->sample_duration;
    if (GST_CLOCK_TIME_IS_VALID(dur)) {
      min += dur * held;
      if (GST_CLOCK_TIME_IS_VALID(max)) max += dur * held;
    } else if (held > 0) {
      max = GST_CLOCK_TIME_NONE;
    }
    gst_query_set_latency(query, live, min, max);
    return TRUE;
  }
  return gst_pad_query_default(pad, parent, query);
}

static GstStateChangeReturn gst_text_encoder_change_state(GstElement *element, GstStateChange transition) {
  auto *self = GST_TEXT_ENCODER(element);
  if (transition == GST_STATE_CHANGE_READY_TO_PAUSED) {
    GST_OBJECT_LOCK(self);
    TextEncoderOptions opts = *self->settings;
    GST_OBJECT_UNLOCK(self);
    std::string err;
    auto enc = TextBuffers::create(opts, &err);
    if (!enc) {
      GST_ELEMENT_ERROR(self, RESOURCE, SETTINGS, ("Cannot start the text encoder: %s", err.c_str()),
                        ("tokenizer=%s model=%s", opts.tokenizer.c_str(), opts.model.c_str()));
      return GST_STATE_CHANGE_FAILURE;
    }
    GST_INFO_OBJECT(self, "text encoder on %s, %s, embeddings [%d, %" G_GINT64_FORMAT "]", enc->device_name().c_str(),
                    enc->dtype_name().c_str(), opts.max_length, enc->embed_dim());
    self->state->encoder = std::move(enc);
  }
  GstStateChangeReturn ret = GST_ELEMENT_CLASS(gst_text_encoder_parent_class)->change_state(element, transition);
  if (transition == GST_STATE_CHANGE_PAUSED_TO_READY) {
    self->state->drop_held();
    self->state->downstream = GST_FLOW_OK;
    if (self->state->encoder) {
      TextEncoderStats s = self->state->encoder->stats();
      GST_INFO_OBJECT(self, "%" G_GUINT64_FORMAT " captions, %" G_GUINT64_FORMAT " encoded in %" G_GUINT64_FORMAT
                      " calls, %" G_GUINT64_FORMAT " dropped", s.captions, s.encoded, s.forward_calls, s.dropped);
    }
    self->state->encoder.reset();
  }
  return ret;
}

static void gst_text_encoder_set_property(GObject *object, guint id, const GValue *value, GParamSpec *pspec) {
  auto *self = GST_TEXT_ENCODER(object);
  GST_OBJECT_LOCK(self);
  TextEncoderOptions &s = *self->settings;
  switch (id) {
    case PROP_TOKENIZER: s.tokenizer = string_property(value); break;
    case PROP_MODEL: s.model = string_property(value); break;
    case PROP_MAX_LENGTH: s.max_length = static_cast<int>(g_value_get_uint(value)); break;
    case PROP_DEVICE: s.device = string_property(value); break;
    case PROP_DTYPE: s.dtype = string_property(value); break;
    case PROP_BATCH_SIZE: s.batch_size = static_cast<int>(g_value_get_uint(value)); break;
    case PROP_CAPTION_DROPOUT: s.caption_dropout = g_value_get_double(value); break;
    case PROP_SEED: s.seed = g_value_get_uint64(value); break;
    case PROP_CACHE_ENTRIES: s.cache_entries = g_value_get_uint(value); break;
    case PROP_CACHE_DIR: s.cache_dir = string_property(value); break;
    case PROP_EMBEDDING_CONVENTION:
      s.embedding_convention = g_value_get_string(value) ? string_property(value) : "auto";
      break;
    case PROP_CLEAN_PROMPTS: s.clean_prompts = g_value_get_boolean(value); break;
    default: G_OBJECT_WARN_INVALID_PROPERTY_ID(object, id, pspec); break;
  }
  GST_OBJECT_UNLOCK(self);
}

static void gst_text_encoder_get_property(GObject *object, guint id, GValue *value, GParamSpec *pspec) {
  auto *self = GST_TEXT_ENCODER(object);
  if (id == PROP_CAPTIONS_ENCODED) {
    // Streaming thread owns the encoder; stats() is a copy of counters (a racy read is harmless).
    g_value_set_uint64(value, self->state->encoder ? self->state->encoder->stats().encoded : 0);
    return;
  }
  GST_OBJECT_LOCK(self);
  const TextEncoderOptions &s = *self->settings;
  switch (id) {
    case PROP_TOKENIZER: g_value_set_string(value, s.tokenizer.c_str()); break;
    case PROP_MODEL: g_value_set_string(value, s.model.c_str()); break;
    case PROP_MAX_LENGTH: g_value_set_uint(value, static_cast<guint>(s.max_length)); break;
    case PROP_DEVICE: g_value_set_string(value, s.device.c_str()); break;
    case PROP_DTYPE: g_value_set_string(value, s.dtype.c_str()); break;
    case PROP_BATCH_SIZE: g_value_set_uint(value, static_cast<guint>(s.batch_size)); break;
    case PROP_CAPTION_DROPOUT: g_value_set_double(value, s.caption_dropout); break;
    case PROP_SEED: g_value_set_uint64(value, s.seed); break;
    case PROP_CACHE_ENTRIES: g_value_set_uint(value, static_cast<guint>(s.cache_entries)); break;
    case PROP_CACHE_DIR: g_value_set_string(value, s.cache_dir.c_str()); break;
    case PROP_EMBEDDING_CONVENTION: g_value_set_string(value, s.embedding_convention.c_str()); break;
    case PROP_CLEAN_PROMPTS: g_value_set_boolean(value, s.clean_prompts); break;
    default: G_OBJECT_WARN_INVALID_PROPERTY_ID(object, id, pspec); break;
  }
  GST_OBJECT_UNLOCK(self);
}

static void gst_text_encoder_init(GstTextEncoder *self) {
  self->settings = new TextEncoderOptions(kDefaults);
  self->state = new State();
  self->sinkpad = gst_pad_new_from_static_template(&sink_template, "sink");
  gst_pad_set_chain_function(self->sinkpad, gst_text_encoder_chain);
  gst_pad_set_event_function(self->sinkpad, gst_text_encoder_sink_event);
  GST_PAD_SET_PROXY_CAPS(self->sinkpad);
  GST_PAD_SET_PROXY_ALLOCATION(self->sinkpad);
  gst_element_add_pad(GST_ELEMENT(self), self->sinkpad);
  self->srcpad = gst_pad_new_from_static_template(&src_template, "src");
  gst_pad_set_query_function(self->srcpad, gst_text_encoder_src_query);
  gst_element_add_pad(GST_ELEMENT(self), self->srcpad);
}

static void gst_text_encoder_finalize(GObject *object) {
  auto *self = GST_TEXT_ENCODER(object);
  self->state->drop_held();
  delete self->state;
  delete self->settings;
  G_OBJECT_CLASS(gst_text_encoder_parent_class)->finalize(object);
}

static void gst_text_encoder_class_init(GstTextEncoderClass *klass) {
  auto *oc = G_OBJECT_CLASS(klass);
  auto *ec = GST_ELEMENT_CLASS(klass);
  videotrain_one_error_install(ec);  // one error per failure (one_error.h)
  oc->set_property = gst_text_encoder_set_property;
  oc->get_property = gst_text_encoder_get_property;
  oc->finalize = gst_text_encoder_finalize;
  ec->change_state = gst_text_encoder_change_state;
  const auto rw = static_cast<GParamFlags>(G_PARAM_READWRITE | G_PARAM_STATIC_STRINGS | GST_PARAM_MUTABLE_READY);
  const auto ro = static_cast<GParamFlags>(G_PARAM_READABLE | G_PARAM_STATIC_STRINGS);
  // What each family's pipelines do, from models/model_family.h's table (static: the specs keep the pointers).
  using models::ModelFamily;
  using models::per_family;
  static const std::string model_blurb =
      "The text encoder: a transformers folder (config.json with T5EncoderModel or UMT5EncoderModel, "
      "model.safetensors or shards with model.safetensors.index.json: the text_encoder/ of a " +
      models::family_titles(" or ") +
      " model), run natively; or a TorchScript file: forward(input_ids: Tensor[B, L] int64, attention_mask: "
      "Tensor[B, L] int64) -> Tensor[B, L, D] (or a tuple starting with it, as a traced transformers "
      "T5EncoderModel returns)";
  static const std::string length_blurb =
      "Tokens per caption, EOS included (the pipelines': " +
      per_family([](const ModelFamily &f) { return std::string(f.title) + " " + std::to_string(f.text_length); }) + ")";
  static const std::string convention_blurb =
      "What text_embeds holds, as the diffusers pipelines pass it: " +
      per_family([](const ModelFamily &f) {
        return std::string(f.name) + " = " + models::text_convention_text(f.text) + " (pipeline_" + f.name + ")";
      }, "; ") +
      "; auto = " + per_family([](const ModelFamily &f) {
        return std::string(f.name) + " for a " + f.text_encoder_class + " folder";
      }) + ", a TorchScript model's output as returned. text_mask is sent in every case";
  static const std::string clean_blurb =
      "Under the " + per_family([](const ModelFamily &f) { return f.cleans_prompts ? f.name : ""; }, " or ") +
      " convention, clean captions as its pipelines do before tokenizing (HTML entities unescaped twice, "
      "whitespace runs made one space, ends stripped); false: captions as given";
  g_object_class_install_property(
      oc, PROP_TOKENIZER,
      g_param_spec_string("tokenizer", "Tokenizer",
                          "The text encoder's tokenizer: a T5 / umT5 tokenizer/ folder (spiece.model, with the special "
                          "tokens of tokenizer_config.json and special_tokens_map.json) or a SentencePiece spiece.model. "
                          "Captions become pieces, then EOS, truncated so that EOS stays last within max-length, "
                          "padded with the pad id",
                          "", rw));
  g_object_class_install_property(
      oc, PROP_MODEL,
      g_param_spec_string("model", "Model", model_blurb.c_str(), "", rw));
  g_object_class_install_property(
      oc, PROP_MAX_LENGTH,
      g_param_spec_uint("max-length", "Max length", length_blurb.c_str(), 1, 4096, kDefaults.max_length, rw));
  g_object_class_install_property(
      oc, PROP_DEVICE,
      g_param_spec_string("device", "Device",
                          "Device of the text encoder: auto (or empty), cpu, cuda or cuda:N; auto: "
                          "cuda:(LOCAL_RANK mod visible GPUs) when CUDA is available, else cpu",
                          "", rw));
  g_object_class_install_property(
      oc, PROP_DTYPE,
      g_param_spec_string("dtype", "Dtype",
                          "dtype of the embeddings: float32, bfloat16 or float16; empty: bfloat16 on CUDA, float32 on "
                          "CPU",
                          "", rw));
  g_object_class_install_property(
      oc, PROP_BATCH_SIZE,
      g_param_spec_uint("batch-size", "Batch size",
                        "Latent buffers held so that their captions are encoded in one call (distinct uncached "
                        "captions only); 1: each buffer goes out at once",
                        1, 1024, kDefaults.batch_size, rw));
  g_object_class_install_property(
      oc, PROP_CAPTION_DROPOUT,
      g_param_spec_double("caption-dropout", "Caption dropout",
                          "Probability that a sample gets the empty caption instead of its own (classifier-free "
                          "guidance training), drawn from seed, sample id and epoch, so a resumed run draws the same",
                          0.0, 1.0, kDefaults.caption_dropout, rw));
  g_object_class_install_property(
      oc, PROP_SEED,
      g_param_spec_uint64("seed", "Seed", "Seed of the caption dropout draws", 0, G_MAXUINT64, kDefaults.seed, rw));
  g_object_class_install_property(
      oc, PROP_CACHE_ENTRIES,
      g_param_spec_uint("cache-entries", "Cache entries",
                        "Distinct captions whose embeddings are kept in memory (each is encoded once while it stays); "
                        "0: no cache",
                        0, 10000000, static_cast<guint>(kDefaults.cache_entries), rw));
  g_object_class_install_property(
      oc, PROP_CACHE_DIR,
      g_param_spec_string("cache-dir", "Cache folder",
                          "Latent cache folder (the same as vaeencoder's cache-dir may be used) where embeddings are kept "
                          "across runs, keyed by caption, tokenizer and model content, max-length, dtype and device "
                          "type; \"\": memory only",
                          "", rw));
  g_object_class_install_property(
      oc, PROP_EMBEDDING_CONVENTION,
      g_param_spec_string("embedding-convention", "Embedding convention", convention_blurb.c_str(), "auto", rw));
  g_object_class_install_property(
      oc, PROP_CLEAN_PROMPTS,
      g_param_spec_boolean("clean-prompts", "Clean prompts", clean_blurb.c_str(), kDefaults.clean_prompts, rw));
  g_object_class_install_property(
      oc, PROP_CAPTIONS_ENCODED,
      g_param_spec_uint64("captions-encoded", "Captions encoded",
                          "Captions run through the text encoder so far (cache misses)", 0, G_MAXUINT64, 0, ro));
  gst_element_class_set_static_metadata(
      ec, "Text encoder", "Filter/Encoder/Text",
      "Adds to each latent buffer its caption's embedding [L, D] and mask [L] (the named tensors text_embeds and "
      "text_mask), from a SentencePiece tokenizer (T5 rules) and a T5 / umT5 encoder folder (native) or a TorchScript "
      "text encoder, once per distinct caption "
      "(cached)" VIDEOTRAIN_DOC_TEXTENCODER_MESSAGES,
      "gst-videotrain");
  gst_element_class_add_static_pad_template(ec, &sink_template);
  gst_element_class_add_static_pad_template(ec, &src_template);
}
