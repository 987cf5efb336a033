/* One error per failure. GstBaseSrc and GstBaseSink post a fallback error of their own ("state change
 * failed and some element failed to post a proper error message", debug "Failed to start") after a
 * start() that returned FALSE, even when start() posted the real reason: users saw two errors for a
 * missing model folder, the second hiding the first. An element whose class installs this filter
 * drops that fallback when it has posted an error of its own since it last left NULL. */
#pragma once

#include <gst/gst.h>

G_BEGIN_DECLS

/* In class_init: klass->post_message = ...; chains to the parent class's post_message. */
void videotrain_one_error_install(GstElementClass *klass);

G_END_DECLS
