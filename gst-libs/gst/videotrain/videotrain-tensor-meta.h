/* Shape, dtype and device of the tensors a buffer holds (latents from vaeencoder,
 * micro-batches from microbatcher), on caps application/x-videotrain-tensor. */
#pragma once

#include <gst/gst.h>

G_BEGIN_DECLS

#define GST_VIDEOTRAIN_TENSOR_MEDIA_TYPE "application/x-videotrain-tensor"
#define GST_VIDEOTRAIN_TENSOR_MAX_DIMS 8

typedef struct _GstVideoTrainTensorMeta GstVideoTrainTensorMeta;

/**
 * GstVideoTrainTensorMeta:
 * @meta: parent #GstMeta
 * @dtype: element type: float32, bfloat16, float16 (int64 for text masks, uint8 for condition frames)
 * @device: where the memory lives: cpu or cuda:N
 * @ndim: number of dimensions
 * @dims: the first @ndim entries are the tensor's sizes, outermost first (row-major, contiguous)
 * @name: "" for the buffer's main tensor, else the name of a tensor after it (text_embeds, text_mask)
 * @offset: the tensor's first byte, from the start of the buffer
 *
 * The shape survives elements that copy memory (the memory may then be plain system memory).
 * A buffer holds its main tensor first and may hold named ones after it: one memory and one
 * meta each.
 */
struct _GstVideoTrainTensorMeta {
  GstMeta meta;
  gchar *dtype;
  gchar *device;
  guint ndim;
  gint64 dims[GST_VIDEOTRAIN_TENSOR_MAX_DIMS];
  gchar *name;
  guint64 offset;
};

GType gst_videotrain_tensor_meta_api_get_type(void);
const GstMetaInfo *gst_videotrain_tensor_meta_get_info(void);
#define GST_VIDEOTRAIN_TENSOR_META_API_TYPE (gst_videotrain_tensor_meta_api_get_type())

GstVideoTrainTensorMeta *gst_buffer_add_videotrain_tensor_meta(GstBuffer *buffer, const gchar *dtype,
                                                               const gchar *device, guint ndim, const gint64 *dims,
                                                               const gchar *name, guint64 offset);
GstVideoTrainTensorMeta *gst_buffer_get_videotrain_tensor_meta(GstBuffer *buffer);
GstVideoTrainTensorMeta *gst_buffer_get_videotrain_tensor_meta_by_name(GstBuffer *buffer, const gchar *name);
gchar **gst_buffer_get_videotrain_tensor_names(GstBuffer *buffer);
gsize gst_videotrain_tensor_meta_get_nbytes(const GstVideoTrainTensorMeta *meta);

G_END_DECLS
