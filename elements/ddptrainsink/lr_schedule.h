/* The learning-rate schedule of ddptrainsink: linear warmup over warmup_steps, then
 * constant, or cosine / linear decay to 0 at max_steps (constant when max_steps is 0).
 * No torch. */
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>

namespace videotrain {

enum class LrSchedule { kConstant, kCosine, kLinear };

// The property's nick ("constant", "cosine", "linear"); false for any other.
inline bool parse_lr_schedule(const std::string &nick, LrSchedule *out) {
  if (nick == "constant") *out = LrSchedule::kConstant;
  else if (nick == "cosine") *out = LrSchedule::kCosine;
  else if (nick == "linear") *out = LrSchedule::kLinear;
  else return false;
  return true;
}

struct LrScheduleParams {
  double base = 1e-4;
  LrSchedule schedule = LrSchedule::kConstant;
  uint64_t warmup_steps = 0;
  uint64_t max_steps = 0;
};

// The learning rate of the step after `done` optimizer steps.
inline double lr_at(const LrScheduleParams &p, uint64_t done) {
  if (p.warmup_steps > 0 && done < p.warmup_steps)
    return p.base * static_cast<double>(done + 1) / static_cast<double>(p.warmup_steps);
  if (p.schedule == LrSchedule::kConstant || p.max_steps == 0 || p.max_steps <= p.warmup_steps) return p.base;
  double f = static_cast<double>(done - p.warmup_steps) / static_cast<double>(p.max_steps - p.warmup_steps);
  f = std::min(std::max(f, 0.0), 1.0);
  if (p.schedule == LrSchedule::kCosine) return p.base * 0.5 * (1.0 + std::cos(M_PI * f));
  return p.base * (1.0 - f);
}

}  // namespace videotrain
