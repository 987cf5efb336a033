#pragma once

#include <gst/gst.h>

G_BEGIN_DECLS

#define GST_TYPE_MICRO_BATCHER (gst_micro_batcher_get_type())
G_DECLARE_FINAL_TYPE(GstMicroBatcher, gst_micro_batcher, GST, MICRO_BATCHER, GstElement)

GST_ELEMENT_REGISTER_DECLARE(microbatcher);

G_END_DECLS
