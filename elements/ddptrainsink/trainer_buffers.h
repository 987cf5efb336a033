/* Between ddptrainsink's face (no torch) and its engine (no GStreamer): reads a
 * micro-batch buffer (its tensor, the named text tensors, the batch meta) into the plain
 * values TrainerEngine::process_inputs() takes. */
#pragma once

#include <gst/gst.h>

#include <string>

#include "trainer_engine.h"

namespace videotrain {

// Trains on one micro-batch buffer. On kError, *error says what is wrong (the buffer, or
// the engine's error()).
ProcessResult train_on_buffer(TrainerEngine &engine, GstBuffer *buf, std::string *error);

}  // namespace videotrain
