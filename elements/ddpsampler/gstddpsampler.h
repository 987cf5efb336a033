#pragma once

#include <gst/gst.h>

G_BEGIN_DECLS
#define GST_TYPE_DDP_SAMPLER (gst_ddp_sampler_get_type())
G_DECLARE_FINAL_TYPE(GstDdpSampler, gst_ddp_sampler, GST, DDP_SAMPLER, GstElement)
GST_ELEMENT_REGISTER_DECLARE(ddpsampler);
G_END_DECLS
