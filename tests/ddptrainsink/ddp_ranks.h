/* Helpers of the two-process TrainerEngine tests (test_ddp_*.cpp): synthetic
 * micro-batches of builtin:linear-test, parameter files that a rank writes for the
 * parent test to compare, and starting one rank (tests/common/multirank.h). */
#pragma once

#include <ATen/core/Tensor.h>
#include <sys/types.h>

#include <map>
#include <string>
#include <utility>
#include <vector>

#include "ddptrainsink/trainer_engine.h"

namespace ddptest {

constexpr int64_t kC = 80;  // caption table 4096 x 80 floats > 1 MB: the first bucket holds it alone

using Params = std::map<std::string, std::vector<float>>;

// Sample k (of 8) of `step`, [kC, 2, 4, 4], and its caption.
at::Tensor sample(int step, int k);
std::string caption(int k);

// Micro-batch idx of count of `step` (step_samples samples a rank): the last one syncs.
videotrain::BatchInfo micro_info(int step, unsigned idx, unsigned count, unsigned step_samples);
// Micro-batch of samples [first, first + m) of `step`; `nan` puts a NaN in its first sample.
videotrain::ProcessResult feed_result(videotrain::TrainerEngine &e, int step, int first, int m, unsigned idx,
                                      unsigned count, unsigned step_samples, bool nan = false);
// Same, failing the test unless it trains.
void feed(videotrain::TrainerEngine &e, int step, int first, int m, unsigned idx, unsigned count,
          unsigned step_samples);

// builtin:linear-test on the CPU over Gloo, several buckets.
videotrain::TrainerConfig config();

void write_params(const std::string &path, const Params &p);
Params read_params(const std::string &path);
// Every parameter tensor within `rel` relative error, ||a - b|| / ||b||.
void expect_params_near(Params got, const Params &want, const std::string &who, double rel = 1e-5);

// Starts this binary as rank `rank` of 2 running `worker` (e.g. "DdpWorker.Rank") in
// `mode` (VT_DDP_MODE), writing its results to `out` (VT_DDP_OUT).
pid_t spawn_worker(const std::string &worker, const std::string &mode, int rank, int port, const std::string &out,
            std::vector<std::pair<std::string, std::string>> env = {});

}  // namespace ddptest
