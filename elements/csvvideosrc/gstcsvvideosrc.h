#pragma once

#include <gst/base/gstpushsrc.h>
#include <gst/gst.h>

G_BEGIN_DECLS

#define GST_TYPE_CSV_VIDEO_SRC (gst_csv_video_src_get_type())
G_DECLARE_FINAL_TYPE(GstCsvVideoSrc, gst_csv_video_src, GST, CSV_VIDEO_SRC, GstPushSrc)

GST_ELEMENT_REGISTER_DECLARE(csvvideosrc);

G_END_DECLS
