/* Between ddpvalsink's face (no torch) and its engine (no GStreamer): reads a validation
 * buffer (latents with a sample meta, or a micro-batch with a batch meta, and the named
 * text tensors) into the plain values ValidationEngine::push() takes. */
#pragma once

#include <gst/gst.h>

#include <string>

#include "validation_engine.h"

namespace videotrain {

// Validates one buffer. On kError, *error says what is wrong (the buffer, or the engine's
// error()).
ValidationEngine::Result validate_buffer(ValidationEngine &engine, GstBuffer *buf, std::string *error);

}  // namespace videotrain
