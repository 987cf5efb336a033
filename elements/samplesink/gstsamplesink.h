#pragma once

#include <gst/base/gstbasesink.h>

G_BEGIN_DECLS
#define GST_TYPE_SAMPLE_SINK (gst_sample_sink_get_type())
G_DECLARE_FINAL_TYPE(GstSampleSink, gst_sample_sink, GST, SAMPLE_SINK, GstBaseSink)
GST_ELEMENT_REGISTER_DECLARE(samplesink);
G_END_DECLS
