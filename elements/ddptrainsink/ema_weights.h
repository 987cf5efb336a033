/* The exponential moving average of the trainable parameters (ddptrainsink ema-decay): a float32
 * copy on the training device, kept apart from the optimizer (any optimizer's steps feed it) and
 * from GObject, so that it is tested alone. Torch TUs only. */
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "models/train_model.h"

namespace videotrain {

// When the average changes, by optimizer step (1-based: the steps done, this one included).
struct EmaSchedule {
  double decay = 0;         // 0: no EMA
  uint64_t start_step = 0;  // up to this step the average is a copy of the weights
  uint64_t every = 1;       // then ema = decay * ema + (1 - decay) * w at every `every`-th step after it
  bool on() const { return decay > 0; }
  enum class Action { kNone, kCopy, kAverage };
  Action action(uint64_t step) const;
  // "" when the settings are usable, else what is wrong, naming the property.
  std::string check() const;
};

class EmaWeights {
 public:
  // Starts as float32 copies of `params` (the trainable tensors with their names).
  EmaWeights(const EmaSchedule &schedule, const NamedTensors &params);
  // Copies `params` (in the constructor's order) into the average.
  void reset(const std::vector<at::Tensor> &params);
  // After optimizer step `step`: copies or averages `params` as the schedule says. No grad.
  void update(uint64_t step, const std::vector<at::Tensor> &params);
  const NamedTensors &tensors() const { return ema_; }
  const EmaSchedule &schedule() const { return schedule_; }
  // The average as `path` (safetensors, F32 by parameter name; decay, start and every in the
  // metadata). Throws std::runtime_error naming the file.
  void save(const std::string &path, uint64_t step) const;
  // Reads a file save() wrote into the average: a tensor it lacks, has in another shape, or one
  // it holds that this run does not train is an error naming it (another model or LoRA). Throws.
  void load(const std::string &path);

  // While it lives, `params` hold the average (their own data is kept and put back at the end):
  // exporting the EMA weights through the model's own writer.
  class Applied {
   public:
    Applied(const EmaWeights &ema, const std::vector<at::Tensor> &params);
    ~Applied();
    Applied(const Applied &) = delete;
    Applied &operator=(const Applied &) = delete;

   private:
    std::vector<at::Tensor> params_, kept_;
  };

 private:
  EmaSchedule schedule_;
  NamedTensors ema_;
};

// The tensors of an EMA file (EmaWeights::save) by name, float32 on the CPU. Throws naming the file.
std::map<std::string, at::Tensor> read_ema_file(const std::string &path);

// The file name of the EMA in a checkpoint's step folder.
inline constexpr const char *kEmaFile = "ema.safetensors";

}  // namespace videotrain
