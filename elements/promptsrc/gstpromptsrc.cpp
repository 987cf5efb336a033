/* promptsrc: a prompt file (one prompt a line, or a CSV with prompt, negative_prompt, seed,
 * num_frames, width, height, image, last_image) as a stream for sampling branches. Each prompt becomes
 * two buffers, the prompt and its negative prompt (empty when the file has none), each with a sample
 * meta whose caption is the text, so that textencoder embeds both; the main tensor (int64 [6], see
 * prompt_record.h) says which prompt and role it is and what the file asks for it. A prompt's images,
 * decoded at start, ride on its prompt buffer as the named tensors image and last_image (uint8
 * [H, W, 3], their own size: ddpsampler resizes them to the sample's). */
#include "one_error.h"
#include "gstpromptsrc.h"

#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "bus_messages_doc.h"
#include "metas.h"
#include "prompt_file.h"
#include "prompt_images.h"
#include "prompt_record.h"
#include "promptsrc_settings.h"
#include "string_property.h"
#include "tensor_caps.h"

GST_DEBUG_CATEGORY_STATIC(promptsrc_debug);
#define GST_CAT_DEFAULT promptsrc_debug

using namespace videotrain;

struct _GstPromptSrc {
  GstBaseSrc parent;
  PromptSrcSettings *settings;   // the properties (object lock)
  std::vector<Prompt> *prompts;  // read at start
  // Each prompt's decoded image and last image (null: none), read at start.
  std::vector<std::pair<std::shared_ptr<const PromptImage>, std::shared_ptr<const PromptImage>>> *images;
  size_t next;                   // buffers pushed (two per prompt)
};

G_DEFINE_TYPE(GstPromptSrc, gst_prompt_src, GST_TYPE_BASE_SRC);
GST_ELEMENT_REGISTER_DEFINE_WITH_CODE(promptsrc, "promptsrc", GST_RANK_NONE, GST_TYPE_PROMPT_SRC,
                                      GST_DEBUG_CATEGORY_INIT(promptsrc_debug, "promptsrc", 0,
                                                              "Prompts for sampling branches from a prompt file"));

enum { PROP_0, PROP_LOCATION, PROP_MAX_PROMPT_BYTES, PROP_NUM_PROMPTS };

static GstStaticPadTemplate src_template = GST_STATIC_PAD_TEMPLATE(
    "src", GST_PAD_SRC, GST_PAD_ALWAYS,
    GST_STATIC_CAPS(VIDEOTRAIN_TENSOR_MEDIA_TYPE ", content=(string)" VIDEOTRAIN_PROMPT_CONTENT
                                                 ", dtype=(string)int64, device=(string)cpu"));

static gboolean prompt_src_start(GstBaseSrc *src) {
  auto *self = GST_PROMPT_SRC(src);
  GST_OBJECT_LOCK(self);
  const std::string location = self->settings->location;
  const PromptFileLimits limits = self->settings->limits;
  GST_OBJECT_UNLOCK(self);
  if (location.empty()) {
    GST_ELEMENT_ERROR(self, RESOURCE, NOT_FOUND, ("No prompt file: set location=FILE"),
                      ("one prompt a line, or a CSV with a prompt column"));
    return FALSE;
  }
  std::vector<Prompt> prompts;
  std::vector<std::string> warnings;
  std::string error;
  if (!read_prompt_file(location, limits, &prompts, &warnings, &error)) {
    GST_ELEMENT_ERROR(self, RESOURCE, OPEN_READ, ("Cannot use the prompt file: %s", error.c_str()),
                      ("location=%s", location.c_str()));
    return FALSE;
  }
  for (const auto &w : warnings)
    GST_ELEMENT_WARNING(self, STREAM, FORMAT, ("%s: %s", location.c_str(), w.c_str()), (nullptr));
  // The images, each file once. One that cannot be read is an error: sampling that prompt without its
  // image would make a video of something else, and an I2V model cannot sample it at all.
  std::map<std::string, std::shared_ptr<const PromptImage>> decoded;
  std::vector<std::pair<std::shared_ptr<const PromptImage>, std::shared_ptr<const PromptImage>>> images(prompts.size());
  for (size_t i = 0; i < prompts.size(); i++) {
    const Prompt &p = prompts[i];
    for (const auto &[path, slot] : {std::make_pair(&p.image, &images[i].first), std::make_pair(&p.last_image, &images[i].second)}) {
      if (path->empty()) continue;
      auto &img = decoded[*path];
      if (!img) {
        auto out = std::make_shared<PromptImage>();
        std::string why;
        if (!decode_prompt_image(*path, out.get(), &why)) {
          GST_ELEMENT_ERROR(self, RESOURCE, READ,
                            ("Cannot read the image of prompt %u (line %zu of %s): %s: %s", p.index, p.line,
                             location.c_str(), path->c_str(), why.c_str()),
                            ("image paths are relative to the prompt file; PNG, JPEG or anything decodebin reads"));
          return FALSE;
        }
        img = std::move(out);
      }
      *slot = img;
    }
  }
  if (!decoded.empty()) GST_INFO_OBJECT(self, "%zu images decoded", decoded.size());
  GST_INFO_OBJECT(self, "%zu prompts from %s", prompts.size(), location.c_str());
  GST_OBJECT_LOCK(self);
  *self->prompts = std::move(prompts);
  *self->images = std::move(images);
  self->next = 0;
  GST_OBJECT_UNLOCK(self);
  g_object_notify(G_OBJECT(self), "num-prompts");
  return TRUE;
}

static gboolean prompt_src_stop(GstBaseSrc *src) {
  auto *self = GST_PROMPT_SRC(src);
  GST_OBJECT_LOCK(self);
  self->prompts->clear();
  self->images->clear();
  self->next = 0;
  GST_OBJECT_UNLOCK(self);
  return TRUE;
}

static GstFlowReturn prompt_src_create(GstBaseSrc *src, guint64, guint, GstBuffer **out) {
  auto *self = GST_PROMPT_SRC(src);
  GST_OBJECT_LOCK(self);
  if (self->next >= 2 * self->prompts->size()) {
    GST_OBJECT_UNLOCK(self);
    return GST_FLOW_EOS;
  }
  const Prompt p = (*self->prompts)[self->next / 2];
  const auto images = (*self->images)[self->next / 2];
  const bool negative = self->next % 2 == 1;
  self->next++;
  GST_OBJECT_UNLOCK(self);

  const int64_t record[kPromptFields] = {int64_t(p.index), negative ? kRoleNegative : kRolePrompt, p.seed, p.frames,
                                         p.width, p.height};
  GstBuffer *buf = gst_buffer_new_allocate(nullptr, sizeof(record), nullptr);
  gst_buffer_fill(buf, 0, record, sizeof(record));
  add_tensor_meta(buf, "int64", "cpu", {kPromptFields});
  if (!negative) {  // the images once per prompt, on its prompt buffer
    for (const auto &[name, img] : {std::make_pair("image", images.first), std::make_pair("last_image", images.second)}) {
      if (!img) continue;
      const gsize offset = gst_buffer_get_size(buf);
      gst_buffer_append_memory(buf, gst_memory_new_wrapped(GST_MEMORY_FLAG_READONLY, const_cast<uint8_t *>(img->rgb.data()),
                                                           img->rgb.size(), 0, img->rgb.size(),
                                                           new std::shared_ptr<const PromptImage>(img), [](gpointer d) {
                                                             delete static_cast<std::shared_ptr<const PromptImage> *>(d);
                                                           }));
      add_tensor_meta(buf, "uint8", "cpu", {img->height, img->width, 3}, name, offset);
    }
  }
  const std::string &text = negative ? p.negative : p.text;
  auto *meta = gst_buffer_add_videotrain_sample_meta(buf, text.c_str(), "");
  meta->sample_id = p.index;
  GST_BUFFER_OFFSET(buf) = p.index;
  *out = buf;
  return GST_FLOW_OK;
}

static void prompt_src_set_property(GObject *object, guint id, const GValue *value, GParamSpec *pspec) {
  auto *self = GST_PROMPT_SRC(object);
  GST_OBJECT_LOCK(self);
  switch (id) {
    case PROP_LOCATION: self->settings->location = string_property(value); break;
    case PROP_MAX_PROMPT_BYTES: self->settings->limits.max_prompt_bytes = g_value_get_uint(value); break;
    default: G_OBJECT_WARN_INVALID_PROPERTY_ID(object, id, pspec);
  }
  GST_OBJECT_UNLOCK(self);
}

static void prompt_src_get_property(GObject *object, guint id, GValue *value, GParamSpec *pspec) {
  auto *self = GST_PROMPT_SRC(object);
  GST_OBJECT_LOCK(self);
  switch (id) {
    case PROP_LOCATION: set_string_property(value, self->settings->location); break;
    // At most 1 << 24 (the spec's range): it fits a guint.
    case PROP_MAX_PROMPT_BYTES: g_value_set_uint(value, guint(self->settings->limits.max_prompt_bytes)); break;
    case PROP_NUM_PROMPTS: g_value_set_uint(value, guint(self->prompts->size())); break;
    default: G_OBJECT_WARN_INVALID_PROPERTY_ID(object, id, pspec);
  }
  GST_OBJECT_UNLOCK(self);
}

static void prompt_src_finalize(GObject *object) {
  auto *self = GST_PROMPT_SRC(object);
  delete self->settings;
  delete self->prompts;
  delete self->images;
  G_OBJECT_CLASS(gst_prompt_src_parent_class)->finalize(object);
}

static void gst_prompt_src_init(GstPromptSrc *self) {
  self->settings = new PromptSrcSettings();
  self->prompts = new std::vector<Prompt>();
  self->images = new std::remove_pointer_t<decltype(self->images)>();
  self->next = 0;
  gst_base_src_set_format(GST_BASE_SRC(self), GST_FORMAT_BYTES);
}

static void gst_prompt_src_class_init(GstPromptSrcClass *klass) {
  auto *gobject_class = G_OBJECT_CLASS(klass);
  auto *element_class = GST_ELEMENT_CLASS(klass);
  videotrain_one_error_install(element_class);  // one error per failure (one_error.h)
  auto *base_class = GST_BASE_SRC_CLASS(klass);
  gobject_class->set_property = prompt_src_set_property;
  gobject_class->get_property = prompt_src_get_property;
  gobject_class->finalize = prompt_src_finalize;
  const PromptSrcSettings d;  // the defaults
  const auto rw = GParamFlags(G_PARAM_READWRITE | G_PARAM_STATIC_STRINGS | GST_PARAM_MUTABLE_READY);
  g_object_class_install_property(
      gobject_class, PROP_LOCATION,
      g_param_spec_string("location", "Location",
                          "Prompt file: one prompt a line (blank lines and lines starting with # are skipped), or a "
                          "CSV whose header names its columns: prompt (required), negative_prompt, seed, num_frames, "
                          "width, height (empty cells take ddpsampler's properties), image and last_image (image files "
                          "relative to the prompt file, for image-to-video models; one that cannot be read is an error)",
                          nullptr, rw));
  g_object_class_install_property(
      gobject_class, PROP_MAX_PROMPT_BYTES,
      g_param_spec_uint("max-prompt-bytes", "Max prompt bytes",
                        "Longer prompts are cut at a UTF-8 character boundary, with a warning", 16, 1u << 24,
                        guint(d.limits.max_prompt_bytes), rw));
  g_object_class_install_property(
      gobject_class, PROP_NUM_PROMPTS,
      g_param_spec_uint("num-prompts", "Number of prompts", "Prompts read from the file (after start)", 0, G_MAXUINT,
                        0, GParamFlags(G_PARAM_READABLE | G_PARAM_STATIC_STRINGS)));
  gst_element_class_add_static_pad_template(element_class, &src_template);
  gst_element_class_set_static_metadata(
      element_class, "Prompt source", "Source",
      "Reads a prompt file for sampling branches: two buffers per prompt (the prompt, then its negative prompt), "
      "each with a sample meta whose caption textencoder embeds" VIDEOTRAIN_DOC_PROMPTSRC_MESSAGES,
      "gst-videotrain");
  base_class->start = prompt_src_start;
  base_class->stop = prompt_src_stop;
  base_class->create = prompt_src_create;
}
