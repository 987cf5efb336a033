/* libgstvideotrain: registers every element of gst-videotrain. */
#include <gst/gst.h>

#include "elements.h"

static gboolean plugin_init(GstPlugin *plugin) {
  gboolean ok = TRUE;
  ok &= GST_ELEMENT_REGISTER(csvvideosrc, plugin);
  ok &= GST_ELEMENT_REGISTER(vaeencoder, plugin);
  ok &= GST_ELEMENT_REGISTER(vaedecoder, plugin);
  ok &= GST_ELEMENT_REGISTER(textencoder, plugin);
  ok &= GST_ELEMENT_REGISTER(imageencoder, plugin);
  ok &= GST_ELEMENT_REGISTER(microbatcher, plugin);
  ok &= GST_ELEMENT_REGISTER(ddptrainsink, plugin);
  ok &= GST_ELEMENT_REGISTER(ddpvalsink, plugin);
  ok &= GST_ELEMENT_REGISTER(promptsrc, plugin);
  ok &= GST_ELEMENT_REGISTER(ddpsampler, plugin);
  ok &= GST_ELEMENT_REGISTER(samplesink, plugin);
  return ok;
}

#ifndef PACKAGE
#define PACKAGE "gst-videotrain"
#endif

GST_PLUGIN_DEFINE(GST_VERSION_MAJOR, GST_VERSION_MINOR, videotrain,
                  "Train video generation models from a pipeline: CSV video source, chunked VAE encoder and decoder, "
                  "micro-batcher, distributed trainer and validation sinks",
                  plugin_init, VIDEOTRAIN_VERSION, "LGPL", "gst-videotrain", "https://example.invalid/gst-videotrain")
