/* ddptrainsink's unlock: rank 0 runs ddptrainsink (GstHarness, rank=0 world-size=2,
 * timeout=300 s), rank 1 is this binary again (UnlockWorker.Rank) driving a TrainerEngine
 * that trains step 1 with rank 0 and then stalls before step 2. Rank 0's render of step 2
 * waits in the gradient all-reduce; the pipeline going to NULL, or a flush, must end that
 * wait at once (not after the 300 s timeout), leave the rescue checkpoint of step 1, and
 * refuse to train on after a flush with an error that says why. */
#include <ATen/ATen.h>
#include <gst/check/gstharness.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <future>
#include <iostream>
#include <string>
#include <thread>
#include <vector>

#include "ddptrainsink/trainer_engine.h"
#include "metas.h"
#include "multirank.h"
#include "tensor_buffer.h"
#include "test_util.h"

using namespace videotrain;
namespace fs = std::filesystem;

namespace {

constexpr double kTimeoutS = 300;
const char *kCaps = "application/x-videotrain-tensor, content=(string)micro-batch, dtype=(string)float32, "
                    "device=(string)cpu";

at::Tensor latents(uint64_t step, int rank) {
  auto g = at::detail::createCPUGenerator(step * 10 + rank + 1);
  return at::randn({2, 4, 2, 8, 8}, g);
}

BatchInfo info_for(uint64_t step) {
  BatchInfo i;
  i.step = step;
  i.step_samples = 2;
  i.next_clip = (step + 1) * 2;
  i.captions = {"a caption", "a caption"};
  return i;
}

GstBuffer *micro_batch(uint64_t step) {
  GstBuffer *buf = buffer_from_tensor(latents(step, 0));
  auto *meta = gst_buffer_add_videotrain_batch_meta(buf);
  meta->step = step;
  meta->micro_index = 0;
  meta->micro_count = 1;
  meta->step_samples = 2;
  meta->sync = TRUE;
  meta->next_clip = (step + 1) * 2;
  for (unsigned k = 0; k < 2; k++) gst_videotrain_batch_meta_append(meta, step * 100 + k, 0, step * 2 + k, "a caption", FALSE);
  return buf;
}

TrainerConfig rank_config(int rank, int port) {
  TrainerConfig c;
  c.model = "builtin:tiny-unet3d";
  c.device = "cpu";
  c.rank = rank;
  c.world_size = 2;
  c.master_addr = "127.0.0.1";
  c.master_port = port;
  c.timeout_s = kTimeoutS;
  return c;
}

// Rank 0 in this process, rank 1 spawned; stops the spawned rank when it goes.
struct TwoRanks {
  int port = vttest::free_port();
  pid_t peer = -1;
  GstHarness *h = nullptr;
  GstBus *bus = gst_bus_new();
  TwoRanks(const std::string &ckpt) {
    peer = vttest::spawn_rank("UnlockWorker.Rank", 1, 2, port, {});
    GstElement *sink = gst_element_factory_make("ddptrainsink", nullptr);
    EXPECT_NE(sink, nullptr) << "ddptrainsink not found (GST_PLUGIN_PATH?)";
    g_object_set(sink, "model", "builtin:tiny-unet3d", "device", "cpu", "rank", 0, "world-size", 2u, "master-addr",
                 "127.0.0.1", "master-port", static_cast<guint>(port), "timeout", kTimeoutS, "checkpoint-dir",
                 ckpt.c_str(), "log-every", 1u, nullptr);
    h = gst_harness_new_with_element(sink, "sink", nullptr);  // READY->PAUSED: the rendezvous with rank 1
    gst_object_unref(sink);
    gst_element_set_bus(h->element, bus);
    gst_harness_set_src_caps_str(h, kCaps);
  }
  ~TwoRanks() {
    gst_harness_teardown(h);
    gst_object_unref(bus);
    kill(peer, SIGKILL);
    std::vector<int> status;
    vttest::wait_all({peer}, &status, 30);
  }
  guint64 steps() {
    guint64 s = 0;
    g_object_get(h->element, "steps", &s, nullptr);
    return s;
  }
  // Trains step 1 with the peer, then pushes step 2 from a thread: its render waits in
  // the all-reduce for the stalled peer (given a moment to get there).
  std::future<GstFlowReturn> stall_in_step_two() {
    EXPECT_EQ(gst_harness_push(h, micro_batch(0)), GST_FLOW_OK);
    EXPECT_EQ(steps(), 1u);
    auto f = std::async(std::launch::async, [this] { return gst_harness_push(h, micro_batch(1)); });
    EXPECT_EQ(f.wait_for(std::chrono::seconds(2)), std::future_status::timeout) << "step 2 did not wait for rank 1";
    return f;
  }
  std::vector<std::string> errors() {
    std::vector<std::string> out;
    while (GstMessage *m = gst_bus_pop_filtered(bus, GST_MESSAGE_ERROR)) {
      GError *err = nullptr;
      gst_message_parse_error(m, &err, nullptr);
      out.push_back(err->message);
      g_error_free(err);
      gst_message_unref(m);
    }
    return out;
  }
};

}  // namespace

TEST(UnlockWorker, Rank) {
  prctl(PR_SET_PDEATHSIG, SIGKILL);  // never outlives a test that failed before killing it
  const int port = std::atoi(vttest::env_or("MASTER_PORT", "0").c_str());
  TrainerEngine e(rank_config(1, port));
  ASSERT_TRUE(e.start()) << e.error();
  ASSERT_EQ(e.process_tensor(latents(0, 1), info_for(0)), ProcessResult::kOk) << e.error();
  // Stalls before step 2's collective until the test kills it.
  std::this_thread::sleep_for(std::chrono::seconds(static_cast<int>(kTimeoutS)));
}

TEST(DdpTrainSinkUnlock, StoppingEndsARenderWaitingForAStalledPeerAndKeepsTheLastStep) {
  vttest::TempDir dir;
  TwoRanks ranks(dir.file("ckpt"));
  auto pushed = ranks.stall_in_step_two();
  const auto t0 = std::chrono::steady_clock::now();
  gst_element_set_state(ranks.h->element, GST_STATE_NULL);
  const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  // A hang check (the collective's timeout is 300 s), not a measure of speed.
  EXPECT_LT(took, 60.0) << "set_state(NULL) waited for the stalled peer";
  std::cerr << "set_state(NULL) with rank 0 waiting for its stalled peer returned after " << took << " s\n";
  ASSERT_EQ(pushed.wait_for(std::chrono::seconds(5)), std::future_status::ready);
  EXPECT_EQ(pushed.get(), GST_FLOW_FLUSHING);
  const auto errors = ranks.errors();
  EXPECT_TRUE(errors.empty()) << "a stop is no error: " << errors.front();
  // Step 1 was complete on both ranks: rank 0 alone writes it, step 2 is nowhere.
  EXPECT_TRUE(fs::exists(dir.file("ckpt/step-00000001/manifest.json")));
  EXPECT_FALSE(fs::exists(dir.file("ckpt/step-00000002")));
}

TEST(DdpTrainSinkUnlock, AFlushEndsTheWaitAndTheRunRefusesToTrainOn) {
  vttest::TempDir dir;
  TwoRanks ranks(dir.file("ckpt"));
  auto pushed = ranks.stall_in_step_two();
  ASSERT_TRUE(gst_harness_push_event(ranks.h, gst_event_new_flush_start()));
  ASSERT_EQ(pushed.wait_for(std::chrono::seconds(60)), std::future_status::ready) << "the flush did not end the wait";
  EXPECT_EQ(pushed.get(), GST_FLOW_FLUSHING);
  ASSERT_TRUE(gst_harness_push_event(ranks.h, gst_event_new_flush_stop(TRUE)));
  gst_harness_set_src_caps_str(ranks.h, kCaps);
  EXPECT_EQ(gst_harness_push(ranks.h, micro_batch(1)), GST_FLOW_FLUSHING);  // the error is posted once
  const auto errors = ranks.errors();
  ASSERT_EQ(errors.size(), 1u);
  EXPECT_NE(errors[0].find("step 2 cannot be trained: a collective of this run was interrupted"), std::string::npos)
      << errors[0];
  EXPECT_EQ(ranks.steps(), 1u);
  EXPECT_TRUE(fs::exists(dir.file("ckpt/step-00000001/manifest.json")));
  EXPECT_FALSE(fs::exists(dir.file("ckpt/step-00000002")));
}
