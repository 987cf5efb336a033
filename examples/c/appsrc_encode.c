/* An app that feeds vaeencoder its own frames: appsrc ! vaeencoder ! appsink.
 *
 * Each RGB frame carries a clip meta (gst_buffer_add_videotrain_clip_meta) saying which clip it
 * belongs to and where in it; vaeencoder sends one latent per clip, whose shape the app reads
 * from the tensor meta (gst_buffer_get_videotrain_tensor_meta). Built only against the
 * installed library:
 *
 *     cc appsrc_encode.c -o appsrc_encode $(pkg-config --cflags --libs gstreamer-videotrain-1.0 gstreamer-app-1.0)
 *     GST_PLUGIN_PATH=build/plugins/videotrain ./appsrc_encode VAE_DIR [FRAMES [SIZE [CLIPS]]]
 *
 * or from a build tree, uninstalled (meson's uninstalled pkg-config files; docs/sdk.md, Examples):
 *
 *     cc examples/c/appsrc_encode.c -o appsrc_encode \
 *         $(PKG_CONFIG_PATH=$PWD/build/meson-uninstalled pkg-config --cflags --libs gstreamer-videotrain-1.0 gstreamer-app-1.0)
 *     LD_LIBRARY_PATH=$PWD/build/gst-libs/gst/videotrain GST_PLUGIN_PATH=$PWD/build/plugins/videotrain \
 *         ./appsrc_encode VAE_DIR
 *
 * Prints one line per latent: "latent sample=S dims=[C, t, h, w] dtype=float32 ... sum=X caption=...".
 * Exits 1 on a pipeline error (its message is printed), 2 on bad arguments. */
#include <gst/app/gstappsink.h>
#include <gst/app/gstappsrc.h>
#include <gst/gst.h>
#include <gst/videotrain/videotrain.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* A frame the app makes itself: a colour ramp that moves with the frame number. */
static GstBuffer *make_frame(guint size, guint clip, guint frame, guint num_frames, GstClockTime pts) {
  const gsize bytes = (gsize)size * size * 3;
  GstBuffer *buf = gst_buffer_new_allocate(NULL, bytes, NULL);
  GstMapInfo map;
  gst_buffer_map(buf, &map, GST_MAP_WRITE);
  for (guint y = 0; y < size; y++)
    for (guint x = 0; x < size; x++) {
      guint8 *p = map.data + ((gsize)y * size + x) * 3;
      p[0] = (guint8)(x * 4 + frame * 8);
      p[1] = (guint8)(y * 4 + clip * 50);
      p[2] = (guint8)((x + y) * 2);
    }
  gst_buffer_unmap(buf, &map);
  GST_BUFFER_PTS(buf) = pts;
  GST_BUFFER_DURATION(buf) = GST_SECOND / 8;

  gchar *caption = g_strdup_printf("a colour ramp, clip %u", clip);
  GstVideoTrainClipMeta *meta = gst_buffer_add_videotrain_clip_meta(buf, caption, "appsrc", "train");
  g_free(caption);
  meta->sample_id = clip;
  meta->clip_index = clip;
  meta->frame_index = frame;
  meta->num_frames = num_frames;
  meta->source_frame = frame;
  return buf;
}

/* An error on the bus ends the app (else a failed pipeline would leave it waiting). */
static gboolean check_bus(GstElement *pipeline) {
  GstBus *bus = gst_element_get_bus(pipeline);
  GstMessage *msg = gst_bus_pop_filtered(bus, GST_MESSAGE_ERROR);
  gst_object_unref(bus);
  if (!msg) return TRUE;
  GError *err = NULL;
  gchar *debug = NULL;
  gst_message_parse_error(msg, &err, &debug);
  fprintf(stderr, "error from %s: %s\n%s\n", GST_OBJECT_NAME(msg->src), err->message, debug ? debug : "");
  g_error_free(err);
  g_free(debug);
  gst_message_unref(msg);
  return FALSE;
}

static void print_latent(GstSample *sample) {
  GstBuffer *buf = gst_sample_get_buffer(sample);
  GstVideoTrainTensorMeta *t = gst_buffer_get_videotrain_tensor_meta(buf);
  GstVideoTrainSampleMeta *s = gst_buffer_get_videotrain_sample_meta(buf);
  if (!t) {
    printf("latent without a tensor meta\n");
    return;
  }
  printf("latent sample=%" G_GUINT64_FORMAT " dims=[", s ? s->sample_id : (guint64)-1);
  for (guint i = 0; i < t->ndim; i++) printf("%s%" G_GINT64_FORMAT, i ? ", " : "", t->dims[i]);
  /* A float32 latent's sum, to compare with another reader of the same buffer. */
  const gsize nbytes = gst_videotrain_tensor_meta_get_nbytes(t);
  double sum = 0;
  GstMapInfo map;
  if (!strcmp(t->dtype, "float32") && gst_buffer_map(buf, &map, GST_MAP_READ)) {
    if (t->offset + nbytes <= map.size)
      for (gsize i = 0; i < nbytes / sizeof(float); i++) {
        float v;
        memcpy(&v, map.data + t->offset + i * sizeof(float), sizeof v);
        sum += v;
      }
    gst_buffer_unmap(buf, &map);
  }
  printf("] dtype=%s device=%s bytes=%" G_GSIZE_FORMAT " buffer=%" G_GSIZE_FORMAT " sum=%.6f caption=%s\n", t->dtype,
         t->device, nbytes, gst_buffer_get_size(buf), sum, s && s->caption ? s->caption : "");
}

int main(int argc, char **argv) {
  gst_init(&argc, &argv);
  if (argc < 2) {
    fprintf(stderr, "usage: %s VAE_DIR [FRAMES [SIZE [CLIPS]]]\n", argv[0]);
    return 2;
  }
  const guint frames = argc > 2 ? (guint)atoi(argv[2]) : 9;
  const guint size = argc > 3 ? (guint)atoi(argv[3]) : 64;
  const guint clips = argc > 4 ? (guint)atoi(argv[4]) : 2;
  if (frames == 0 || size == 0 || clips == 0) {
    fprintf(stderr, "FRAMES, SIZE and CLIPS must be positive\n");
    return 2;
  }

  gchar *desc = g_strdup_printf(
      "appsrc name=src format=time caps=video/x-raw,format=RGB,width=%u,height=%u,framerate=8/1 "
      "! vaeencoder model=\"%s\" latent=mode ! appsink name=sink sync=false",
      size, size, argv[1]);
  GError *err = NULL;
  GstElement *pipeline = gst_parse_launch(desc, &err);
  g_free(desc);
  if (!pipeline) {
    fprintf(stderr, "cannot build the pipeline: %s (is GST_PLUGIN_PATH set to the plugin's folder?)\n",
            err ? err->message : "?");
    return 1;
  }
  GstElement *src = gst_bin_get_by_name(GST_BIN(pipeline), "src");
  GstElement *sink = gst_bin_get_by_name(GST_BIN(pipeline), "sink");
  gst_element_set_state(pipeline, GST_STATE_PLAYING);

  GstClockTime pts = 0;
  for (guint c = 0; c < clips; c++)
    for (guint f = 0; f < frames; f++, pts += GST_SECOND / 8)
      gst_app_src_push_buffer(GST_APP_SRC(src), make_frame(size, c, f, frames, pts));
  gst_app_src_end_of_stream(GST_APP_SRC(src));

  int rc = 0;
  for (;;) {
    GstSample *sample = gst_app_sink_try_pull_sample(GST_APP_SINK(sink), GST_SECOND / 10);
    if (sample) {
      print_latent(sample);
      gst_sample_unref(sample);
      continue;
    }
    if (!check_bus(pipeline)) {
      rc = 1;
      break;
    }
    if (gst_app_sink_is_eos(GST_APP_SINK(sink))) break;
  }
  gst_element_set_state(pipeline, GST_STATE_NULL);
  gst_object_unref(src);
  gst_object_unref(sink);
  gst_object_unref(pipeline);
  return rc;
}
