#include "videotrain-tensor-meta.h"

#include <string.h>

static const gchar *no_tags[] = {NULL};

static gboolean tensor_meta_init(GstMeta *meta, gpointer params, GstBuffer *buffer) {
  GstVideoTrainTensorMeta *m = (GstVideoTrainTensorMeta *)meta;
  (void)params;
  (void)buffer;
  /* Never NULL, so that readers may test name[0] and compare dtype directly. */
  m->dtype = g_strdup("");
  m->device = g_strdup("");
  m->name = g_strdup("");
  m->ndim = 0;
  memset(m->dims, 0, sizeof m->dims);
  m->offset = 0;
  return TRUE;
}

static void tensor_meta_free(GstMeta *meta, GstBuffer *buffer) {
  GstVideoTrainTensorMeta *m = (GstVideoTrainTensorMeta *)meta;
  (void)buffer;
  g_free(m->dtype);
  g_free(m->device);
  g_free(m->name);
}

static gboolean tensor_meta_transform(GstBuffer *dest, GstMeta *meta, GstBuffer *buffer, GQuark type, gpointer data) {
  GstVideoTrainTensorMeta *s = (GstVideoTrainTensorMeta *)meta;
  (void)buffer;
  (void)data;
  /* Only a whole copy keeps the shape meaningful. */
  if (!GST_META_TRANSFORM_IS_COPY(type)) return FALSE;
  if (gst_buffer_get_videotrain_tensor_meta_by_name(dest, s->name)) return TRUE;
  return gst_buffer_add_videotrain_tensor_meta(dest, s->dtype, s->device, s->ndim, s->dims, s->name, s->offset) != NULL;
}

GType gst_videotrain_tensor_meta_api_get_type(void) {
  static GType type = 0;
  if (g_once_init_enter(&type))
    g_once_init_leave(&type, gst_meta_api_type_register("GstVideoTrainTensorMetaAPI", no_tags));
  return type;
}

/**
 * gst_videotrain_tensor_meta_get_info:
 *
 * Returns: (transfer none): the tensor meta's implementation
 */
const GstMetaInfo *gst_videotrain_tensor_meta_get_info(void) {
  static gsize info = 0;
  if (g_once_init_enter(&info))
    g_once_init_leave(&info, (gsize)gst_meta_register(GST_VIDEOTRAIN_TENSOR_META_API_TYPE, "GstVideoTrainTensorMeta",
                                                      sizeof(GstVideoTrainTensorMeta), tensor_meta_init,
                                                      tensor_meta_free, tensor_meta_transform));
  return (const GstMetaInfo *)info;
}

/**
 * gst_buffer_add_videotrain_tensor_meta:
 * @buffer: a writable #GstBuffer
 * @dtype: element type (float32, bfloat16, float16, int64)
 * @device: (nullable): cpu or cuda:N (%NULL: cpu)
 * @ndim: number of dimensions, at most %GST_VIDEOTRAIN_TENSOR_MAX_DIMS
 * @dims: (array length=ndim): the sizes, outermost first
 * @name: (nullable): "" or %NULL for the main tensor, else the named tensor's name
 * @offset: the tensor's first byte in @buffer
 *
 * Returns: (transfer none) (nullable): the new meta; %NULL when @ndim is too large
 */
GstVideoTrainTensorMeta *gst_buffer_add_videotrain_tensor_meta(GstBuffer *buffer, const gchar *dtype,
                                                               const gchar *device, guint ndim, const gint64 *dims,
                                                               const gchar *name, guint64 offset) {
  GstVideoTrainTensorMeta *m;
  if (ndim > GST_VIDEOTRAIN_TENSOR_MAX_DIMS || (ndim && !dims)) return NULL;
  m = (GstVideoTrainTensorMeta *)gst_buffer_add_meta(buffer, gst_videotrain_tensor_meta_get_info(), NULL);
  if (!m) return NULL;
  g_free(m->dtype);
  g_free(m->device);
  g_free(m->name);
  m->dtype = g_strdup(dtype ? dtype : "");
  m->device = g_strdup(device ? device : "cpu");
  m->name = g_strdup(name ? name : "");
  m->ndim = ndim;
  if (ndim) memcpy(m->dims, dims, ndim * sizeof(gint64));
  m->offset = offset;
  return m;
}

/**
 * gst_buffer_get_videotrain_tensor_meta_by_name:
 * @buffer: a #GstBuffer
 * @name: "" for the main tensor, else a named tensor's name
 *
 * Returns: (transfer none) (nullable): the meta of the tensor called @name, or %NULL
 */
GstVideoTrainTensorMeta *gst_buffer_get_videotrain_tensor_meta_by_name(GstBuffer *buffer, const gchar *name) {
  gpointer state = NULL;
  GstMeta *m;
  while ((m = gst_buffer_iterate_meta_filtered(buffer, &state, GST_VIDEOTRAIN_TENSOR_META_API_TYPE))) {
    GstVideoTrainTensorMeta *t = (GstVideoTrainTensorMeta *)m;
    if (g_strcmp0(t->name, name) == 0) return t;
  }
  return NULL;
}

/**
 * gst_buffer_get_videotrain_tensor_meta:
 * @buffer: a #GstBuffer
 *
 * Returns: (transfer none) (nullable): the meta of the buffer's main tensor (name ""), or %NULL
 */
GstVideoTrainTensorMeta *gst_buffer_get_videotrain_tensor_meta(GstBuffer *buffer) {
  return gst_buffer_get_videotrain_tensor_meta_by_name(buffer, "");
}

static gint by_offset(gconstpointer a, gconstpointer b) {
  const GstVideoTrainTensorMeta *x = *(GstVideoTrainTensorMeta *const *)a, *y = *(GstVideoTrainTensorMeta *const *)b;
  return x->offset < y->offset ? -1 : x->offset > y->offset;
}

/**
 * gst_buffer_get_videotrain_tensor_names:
 * @buffer: a #GstBuffer
 *
 * Returns: (transfer full) (array zero-terminated=1): the names of the named tensors after the
 * main one, in buffer order (empty when there are none); free with g_strfreev()
 */
gchar **gst_buffer_get_videotrain_tensor_names(GstBuffer *buffer) {
  GPtrArray *metas = g_ptr_array_new();
  GPtrArray *names;
  gpointer state = NULL;
  GstMeta *m;
  guint i;
  while ((m = gst_buffer_iterate_meta_filtered(buffer, &state, GST_VIDEOTRAIN_TENSOR_META_API_TYPE)))
    if (((GstVideoTrainTensorMeta *)m)->name[0]) g_ptr_array_add(metas, m);
  g_ptr_array_sort(metas, by_offset);
  names = g_ptr_array_new();
  for (i = 0; i < metas->len; i++)
    g_ptr_array_add(names, g_strdup(((GstVideoTrainTensorMeta *)g_ptr_array_index(metas, i))->name));
  g_ptr_array_add(names, NULL);
  g_ptr_array_unref(metas);
  return (gchar **)g_ptr_array_free(names, FALSE);
}

/**
 * gst_videotrain_tensor_meta_get_nbytes:
 * @meta: a tensor meta
 *
 * Returns: the tensor's size in bytes (elements times the dtype's size); 0 for an unknown dtype
 */
gsize gst_videotrain_tensor_meta_get_nbytes(const GstVideoTrainTensorMeta *meta) {
  gsize n = 1, elem = 0;
  guint i;
  if (!g_strcmp0(meta->dtype, "float32")) elem = 4;
  else if (!g_strcmp0(meta->dtype, "bfloat16") || !g_strcmp0(meta->dtype, "float16")) elem = 2;
  else if (!g_strcmp0(meta->dtype, "int64")) elem = 8;
  else if (!g_strcmp0(meta->dtype, "uint8")) elem = 1;
  for (i = 0; i < meta->ndim && i < GST_VIDEOTRAIN_TENSOR_MAX_DIMS; i++) n *= (gsize)MAX(meta->dims[i], 0);
  return n * elem;
}
