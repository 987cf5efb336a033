/* Decides optimizer steps and micro-batches from a stream of samples.
 *
 * Plain C++ (no GStreamer, no torch): samples are opaque handles plus the fields
 * that grouping needs (shape, ids, data position). The caller stacks the tensors
 * of each micro-batch it gets back. */
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace videotrain {

struct MicroBatcherConfig {
  uint32_t batch_size = 1;        // samples per rank per optimizer step
  uint32_t micro_batch_size = 0;  // samples per forward/backward; 0: = batch_size
  bool bucket = true;             // group a step's samples by shape
  bool drop_last = false;         // drop a partial step at epoch end / EOS instead of emitting it
  uint64_t start_step = 0;        // number of the first step (resumed runs)
  // The element's (epoch-boundary): its face calls finish() at csvvideosrc's epoch-end event.
  bool epoch_boundary = true;

  uint32_t effective_micro_batch_size() const { return micro_batch_size ? micro_batch_size : batch_size; }
};

struct MicroBatcherSample {
  void *handle = nullptr;     // owned by the engine until returned in a MicroBatch
  std::vector<int64_t> shape;
  uint64_t sample_id = 0;
  uint32_t epoch = 0;
  uint64_t clip_index = 0;
  bool padding = false;
  uint64_t group = 0;         // csvvideosrc buckets: the step group in the epoch ...
  uint32_t group_size = 0;    // ... and its size; 0: no groups
  std::string caption;
  uint64_t arrival = 0;       // arrival number, set by the engine (for messages)
};

struct MicroBatch {
  uint64_t step = 0;
  uint32_t micro_index = 0;
  uint32_t micro_count = 0;
  uint32_t step_samples = 0;
  bool sync = false;          // last micro-batch of the step
  uint32_t epoch = 0;         // data position after the step: epoch ...
  uint64_t next_clip = 0;     // ... and clip_index + 1 of the step's last sample in arrival order
  std::vector<MicroBatcherSample> samples;  // handles now owned by the caller
};

class MicroBatcherEngine {
 public:
  // Called for every handle the engine drops (flush, drop-last, destruction).
  using Release = std::function<void(void *)>;

  // Checks a configuration; false with a reason naming the properties.
  static bool validate(const MicroBatcherConfig &cfg, std::string *why);

  MicroBatcherEngine(const MicroBatcherConfig &cfg, Release release);
  ~MicroBatcherEngine();
  MicroBatcherEngine(const MicroBatcherEngine &) = delete;
  MicroBatcherEngine &operator=(const MicroBatcherEngine &) = delete;

  // Takes a sample; appends the micro-batches of every step it completes to *out. A sample
  // with a group (csvvideosrc buckets) closes the step of another group first, and a group
  // that is complete closes its step: a step is then one group, of one shape.
  // (epoch ends come from the face, through finish()). On error (bucket=false and a
  // micro-batch would mix shapes) returns false with a reason; the sample's handle is
  // then released and nothing else changes.
  bool push(MicroBatcherSample sample, std::vector<MicroBatch> *out, std::string *why);

  // Epoch end (custom event) or EOS: closes the partial step in progress, emitting it
  // (drop_last=false) or releasing it (drop_last=true).
  void finish(std::vector<MicroBatch> *out);

  // Flush: releases what is held; step numbering goes on.
  void flush();

  // Resumed runs: the next step gets this number (held samples are released first).
  void restart_steps_at(uint64_t step);

  size_t held() const { return pending_.size(); }
  uint64_t next_step() const { return next_step_; }
  uint64_t dropped_samples() const { return dropped_; }

 private:
  // droppable: an epoch end or EOS, where drop-last drops a partial step.
  void close_step(std::vector<MicroBatch> *out, bool droppable);
  void release_pending();

  MicroBatcherConfig cfg_;
  uint32_t micro_;
  Release release_;
  std::vector<MicroBatcherSample> pending_;  // current step, arrival order
  uint64_t next_step_;
  uint64_t arrivals_ = 0;
  uint64_t dropped_ = 0;
};

std::string shape_string(const std::vector<int64_t> &shape);

}  // namespace videotrain
