/* csvvideosrc's properties in one struct, whose defaults the property specs read: the engine's
 * configuration as the properties set it, and what the GObject face resolves or uses itself.
 * No torch. */
#pragma once

#include "source_engine.h"

namespace videotrain {

struct CsvVideoSrcSettings {
  // Every property the engine takes; rank and world_size are filled at start from the two below.
  SourceConfig source;
  int rank = -1;        // -1: from the environment (dist_env.h), else 0
  int world_size = 0;   // 0: from the environment, else 1
  int fps_n = 8, fps_d = 1;  // framerate: the output timestamps and caps
};

}  // namespace videotrain
