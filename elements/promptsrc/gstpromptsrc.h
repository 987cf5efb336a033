#pragma once

#include <gst/base/gstbasesrc.h>

G_BEGIN_DECLS
#define GST_TYPE_PROMPT_SRC (gst_prompt_src_get_type())
G_DECLARE_FINAL_TYPE(GstPromptSrc, gst_prompt_src, GST, PROMPT_SRC, GstBaseSrc)
GST_ELEMENT_REGISTER_DECLARE(promptsrc);
G_END_DECLS
