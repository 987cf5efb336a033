/* Posting an engine's BusMessage from its element (see bus_message.h). */
#pragma once

#include <gst/gst.h>

#include "bus_message.h"

namespace videotrain {

// A warning message becomes GST_ELEMENT_WARNING with its text; any other an element message
// whose structure holds the fields typed as the message says.
void post_bus_message(GstElement *element, const BusMessage &m);

}  // namespace videotrain
