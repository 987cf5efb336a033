/* The optimizer state of a checkpoint, written so that a failed write (a full disk) is an
 * exception naming the file and the free space, never an abort. */
#pragma once

#include <string>

namespace torch::optim {
class Optimizer;
}
namespace c10 {
struct Device;
}

namespace videotrain {

class TrainOptimizer;

// Writes `opt`'s state to `path` (torch::load reads it), synced. Throws std::runtime_error.
void save_optimizer(torch::optim::Optimizer &opt, const std::string &path);
void save_optimizer(TrainOptimizer &opt, const std::string &path);
// Reads what save_optimizer() wrote into `opt`, on `device`. Throws naming what does not fit.
void load_optimizer(TrainOptimizer &opt, const std::string &path, const c10::Device &device);

}  // namespace videotrain
