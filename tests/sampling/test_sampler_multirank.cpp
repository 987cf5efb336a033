/* A rank that dies in the middle of a sampling pass, on two Gloo ranks (the binary starts itself
 * twice: tests/common/multirank.h). Sampling has no collective, so the surviving rank learns of
 * it as it would during validation: its trainer fails in the next gradient all-reduce, within
 * the run's timeout and naming the rank that is gone; its sampler returns instead of waiting for
 * snapshots that will never come, and the samples it made before came out.
 *
 * Each rank trains the tiny Wan transformer (tests/reference/dit/wan_t2v_tiny) and samples 4
 * prompts at start (prompts 0, 2 on rank 0; 1, 3 on rank 1). Rank 1 exits inside the emit of
 * its first sample (prompt 1), with prompt 3 still to sample, once both ranks have trained 2
 * steps while it sampled. Before the trainer reported a failed step, rank 0's sampler waited on. */
#include <gtest/gtest.h>
#include <unistd.h>

#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <fstream>
#include <mutex>
#include <sstream>
#include <thread>

#include "ddpsampler/sampler_engine.h"
#include "ddptrainsink/trainer_engine.h"
#include "metas.h"
#include "models/train_model.h"
#include "multirank.h"
#include "prompt_record.h"
#include "tensor_buffer.h"
#include "sampler_test_util.h"
#include "test_util.h"

using namespace videotrain;
using namespace samplertest;

namespace {

constexpr double kTimeout = 20;  // the run's timeout (s)
constexpr int kPrompts = 4;

double now_s() {  // steady_clock is CLOCK_MONOTONIC: comparable between the two processes
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}


}  // namespace

// One rank; writes its verdict to VT_SAMPLE_OUT: "error"/"ok", the seconds its failing training
// step took, the time it failed (now_s()), whether its sampler returned, its samples
// (step:prompt,...), then the trainer's error. Rank 1 writes "died <time> <steps trained>" just
// before it exits.
TEST(SamplerDeathWorker, Rank) {
  const std::string out = vttest::env_or("VT_SAMPLE_OUT", "");
  ASSERT_FALSE(out.empty()) << "run by SamplerMultiRank.ARankDyingMidSampleMakesTheOtherFailBeforeTheTimeout only";
  at::set_num_threads(1);
  TrainerConfig tc;
  tc.model = vttest::reference_dir() + "/dit/wan_t2v_tiny";
  tc.device = "cpu";
  tc.backend = "gloo";
  tc.seed = 5;
  tc.lr = 1e-3;
  tc.timeout_s = kTimeout;
  tc.log_every = 1;
  auto trainer = std::make_shared<TrainerEngine>(tc);
  ASSERT_TRUE(trainer->start()) << trainer->error();
  const int rank = trainer->rank();

  SamplerConfig sc;
  sc.every = 0;
  sc.at_start = true;
  sc.at_end = true;  // a failed run has no end to sample
  sc.steps = 2;
  sc.guidance = 3.0;
  sc.device = "cpu";
  SamplerEngine sampler(sc);
  ASSERT_TRUE(sampler.attach(trainer)) << sampler.error();
  for (int64_t i = 0; i < kPrompts; i++)
    for (int64_t role : {int64_t(kRolePrompt), int64_t(kRoleNegative)}) {
      GstBuffer *b = prompt_buffer(i, role);
      ASSERT_TRUE(sampler.add_prompt(b)) << sampler.error();
      gst_buffer_unref(b);
    }
  ASSERT_TRUE(sampler.prompts_done());
  ASSERT_EQ(sampler.prompts_kept(), 2u);

  std::atomic<int> trained{0};
  std::mutex mu;
  std::condition_variable cv;
  bool sampler_returned = false;
  std::string samples, last;
  std::thread sampling([&] {
    SamplerEngine::Next n;
    do {
      n = sampler.run_next([&](SampleOut &s) {
        if (rank == 1) {  // mid pass (prompt 3 is still to sample), once training has gone on
          for (int k = 0; k < 3000 && trained < 2; k++) std::this_thread::sleep_for(std::chrono::milliseconds(10));
          std::ofstream(out) << "died " << std::to_string(now_s()) << " " << trained << "\n";
          _exit(0);
        }
        std::lock_guard<std::mutex> lock(mu);
        samples += std::to_string(s.step) + ":" + std::to_string(s.prompt_index) + ",";
        gst_buffer_unref(s.latents);
        return true;
      });
    } while (n == SamplerEngine::Next::kSampled);
    std::lock_guard<std::mutex> lock(mu);
    last = n == SamplerEngine::Next::kFinished ? "finished" : n == SamplerEngine::Next::kError ? "error" : "flushing";
    sampler_returned = true;
    cv.notify_all();
  });

  // Train until a step fails (rank 0, once rank 1 is gone), for a minute at most.
  ModelInputs in;
  in.latents = seeded({1, 4, 2, 8, 8}, 7 + rank);
  in.text_embeds = seeded({1, kTextLen, kTextDim}, 9 + rank);
  in.text_mask = at::ones({1, kTextLen}, at::kLong);
  BatchInfo info;
  info.captions = {"x"};
  ProcessResult r = ProcessResult::kOk;
  double step_seconds = 0, failed_at = 0;
  const double t_end = now_s() + 60;
  while (r == ProcessResult::kOk && now_s() < t_end) {
    const double t0 = now_s();
    r = trainer->process_inputs(in, info);
    failed_at = now_s();
    if (r == ProcessResult::kOk) trained++;
    step_seconds = failed_at - t0;
  }
  // The sampler returns once the trainer has failed (no stop, no flush): a bounded wait.
  bool returned;
  {
    std::unique_lock<std::mutex> lock(mu);
    returned = cv.wait_for(lock, std::chrono::seconds(int(kTimeout)), [&] { return sampler_returned; });
  }
  std::ofstream f(out);
  f << (r == ProcessResult::kError ? "error" : "ok") << " " << std::to_string(step_seconds) << " "
    << std::to_string(failed_at) << " " << (returned ? last : std::string("hung")) << " "
    << (samples.empty() ? "none" : samples) << "\n"
    << trainer->error() << "\n";
  f.close();
  if (!returned) _exit(0);  // the sampling thread is stuck: no joining it
  sampling.join();
  trainer->stop();
  _exit(0);  // no static teardown racing Gloo threads
}

TEST(SamplerMultiRank, ARankDyingMidSampleMakesTheOtherFailBeforeTheTimeout) {
  vttest::TempDir dir;
  const int port = vttest::free_port();
  std::vector<pid_t> pids;
  for (int r = 0; r < 2; r++)
    pids.push_back(vttest::spawn_rank("SamplerDeathWorker.Rank", r, 2, port,
                                      {{"VT_SAMPLE_OUT", dir.file("r" + std::to_string(r))}}));
  std::vector<int> st;
  ASSERT_TRUE(vttest::wait_all(pids, &st, 4 * kTimeout + 60)) << "a rank hung after its peer died";
  std::istringstream died(vttest::read_file(dir.file("r1")));
  std::string word;
  double death = 0;
  int rank1_trained = 0;
  died >> word >> death >> rank1_trained;
  ASSERT_EQ(word, "died") << "rank 1 did not reach its first sample: " << died.str();
  EXPECT_GE(rank1_trained, 2) << "rank 1 died mid-sample while training went on";

  std::istringstream in(vttest::read_file(dir.file("r0")));
  std::string verdict, sampler, samples, error;
  double step_seconds = 0, failed_at = 0;
  in >> verdict >> step_seconds >> failed_at >> sampler >> samples;
  std::getline(in >> std::ws, error);
  EXPECT_EQ(verdict, "error") << "rank 0 trained on without its peer: " << in.str();
  EXPECT_LT(failed_at - death, kTimeout) << "rank 0 failed only after the timeout: " << error;
  EXPECT_LT(step_seconds, kTimeout) << "the all-reduce waited for the timeout instead of seeing the peer gone";
  // The step's gradient all-reduce, or its loss/position all-reduce where rank 1 died between the two.
  EXPECT_NE(error.find("all-reduce"), std::string::npos) << error;
  EXPECT_NE(error.find("failed on rank 0 of 2"), std::string::npos) << error;
  EXPECT_NE(error.find("rank 1 failed or exited"), std::string::npos) << error;
  EXPECT_EQ(sampler, "finished") << "rank 0's sampler did not return once its trainer had failed";
  EXPECT_EQ(samples, "0:0,0:2,") << "rank 0's own samples of step 0 (prompts 0 and 2), nothing at the failed end";
  std::cerr << "rank 0 failed " << failed_at - death << " s after rank 1 died (its step took " << step_seconds
            << " s): " << error << "\n";
}
