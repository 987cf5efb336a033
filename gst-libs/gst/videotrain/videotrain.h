/* gst-videotrain's public library (libgstvideotrain-1.0, pkg-config gstreamer-videotrain-1.0):
 * the metas its elements exchange, so that an application can make the buffers they read
 * (appsrc ! vaeencoder) and read the ones they write (an appsink after vaeencoder or
 * microbatcher). Plain C; the plugin itself links to this library. */
#pragma once

#include <gst/videotrain/videotrain-metas.h>
#include <gst/videotrain/videotrain-tensor-meta.h>
