/* The optimizer state of a checkpoint, written so that a failed write (a full disk) is an
 * exception naming the file and the free space, never an abort. */
#pragma once

#include <string>

namespace torch::optim {
class Optimizer;
}

namespace videotrain {

// Writes `opt`'s state to `path` (torch::load reads it), synced. Throws std::runtime_error.
void save_optimizer(torch::optim::Optimizer &opt, const std::string &path);

}  // namespace videotrain
