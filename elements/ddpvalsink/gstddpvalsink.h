#pragma once

#include <gst/base/gstbasesink.h>
#include <gst/gst.h>

G_BEGIN_DECLS

#define GST_TYPE_DDP_VAL_SINK (gst_ddp_val_sink_get_type())
G_DECLARE_FINAL_TYPE(GstDdpValSink, gst_ddp_val_sink, GST, DDP_VAL_SINK, GstBaseSink)

GST_ELEMENT_REGISTER_DECLARE(ddpvalsink);

G_END_DECLS
