/* One readable line for each of the project's bus messages (videotrain-run's log). */
#pragma once

#include <gst/gst.h>

#include <string>

namespace videotrain {

// "step 5 | epoch 0 | loss 0.1234 | ..." for the messages docs/bus-messages.md lists; other structures
// as "name: field value, field value" (strings unquoted, no GType annotations).
std::string bus_text(const GstStructure *s);

}  // namespace videotrain
