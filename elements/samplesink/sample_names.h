/* samplesink's file names: a location pattern whose first %d (with optional zero-padding width,
 * e.g. %08d) takes the step and whose second takes the prompt index; %% is a percent sign. No
 * printf on user text (a stray %s must be an error, not a crash). No torch, no GStreamer. */
#pragma once

#include <cstdint>
#include <string>

namespace videotrain {

// "" when the pattern has exactly two %d conversions and nothing else after a '%', else why not.
std::string check_sample_pattern(const std::string &pattern);
// The file name for (step, prompt); the pattern must have passed check_sample_pattern.
std::string sample_file_name(const std::string &pattern, uint64_t step, uint32_t prompt);

}  // namespace videotrain
