#pragma once

#include <gst/base/gstbasesink.h>
#include <gst/gst.h>

G_BEGIN_DECLS

#define GST_TYPE_DDP_TRAIN_SINK (gst_ddp_train_sink_get_type())
G_DECLARE_FINAL_TYPE(GstDdpTrainSink, gst_ddp_train_sink, GST, DDP_TRAIN_SINK, GstBaseSink)

GST_ELEMENT_REGISTER_DECLARE(ddptrainsink);

G_END_DECLS
