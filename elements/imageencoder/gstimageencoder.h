#pragma once

#include <gst/gst.h>

G_BEGIN_DECLS

#define GST_TYPE_IMAGE_ENCODER (gst_image_encoder_get_type())
G_DECLARE_FINAL_TYPE(GstImageEncoder, gst_image_encoder, GST, IMAGE_ENCODER, GstElement)

GST_ELEMENT_REGISTER_DECLARE(imageencoder);

G_END_DECLS
