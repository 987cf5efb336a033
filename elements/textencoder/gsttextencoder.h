#pragma once

#include <gst/gst.h>

G_BEGIN_DECLS

#define GST_TYPE_TEXT_ENCODER (gst_text_encoder_get_type())
G_DECLARE_FINAL_TYPE(GstTextEncoder, gst_text_encoder, GST, TEXT_ENCODER, GstElement)

GST_ELEMENT_REGISTER_DECLARE(textencoder);

G_END_DECLS
