/* ddptrainsink's sharding property (param_shards.h does the work). No torch here. */
#pragma once

namespace videotrain {

enum class Sharding { none = 0, optimizer = 1, full = 2 };
inline const char *sharding_name(Sharding s) {
  return s == Sharding::full ? "full" : s == Sharding::optimizer ? "optimizer" : "none";
}

}  // namespace videotrain
