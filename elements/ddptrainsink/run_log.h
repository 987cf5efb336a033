/* The run log: rank 0's metrics file (JSON lines) and TensorBoard events, written by the
 * training thread and by validators (RunContext::append_log) under one lock, so that each
 * stays one file. Other ranks write only sample images (RunContext::append_image), to an
 * events file of their own in <tensorboard-dir>/samples-rank<R>: TensorBoard reads a folder's
 * event files in name order, so a second writer beside rank 0's would hide it; a subfolder
 * is a run TensorBoard lists beside the main one. No torch. */
#pragma once

#include <cstdint>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "run_context.h"
#include "tfevents.h"

namespace videotrain {

class RunLog {
 public:
  // Only rank 0 writes; on other ranks every call does nothing and succeeds. Creates the
  // metrics file's folder: "" or a warning saying why it could not.
  std::string open(int rank, const std::string &metrics_file);
  // "" or why the events file could not be created (training goes on without it). Other
  // ranks only keep dir: their file is created at their first image.
  std::string open_tensorboard(const std::string &dir);
  // One JSON line; false when the metrics file cannot be written.
  bool append_line(const std::string &line);
  void add_scalars(uint64_t step, const std::vector<std::pair<std::string, float>> &scalars);
  // A step's record (type "step") and its train/ scalars; false when the metrics file
  // cannot be written.
  bool log_step(const StepReport &r);
  // A record with its scalars (validation results).
  bool append(const std::string &line, uint64_t step, const std::vector<std::pair<std::string, float>> &scalars);
  // An image (PNG) in the TensorBoard events (sample frames), on every rank; false without
  // tensorboard-dir or when this rank's events file cannot be created (tried once).
  bool add_image(uint64_t step, const std::string &tag, const std::string &png, int width, int height);
  void close();
  const std::string &metrics_file() const { return metrics_file_; }

 private:
  std::mutex mu_;
  bool writer_ = false;  // rank 0
  int rank_ = 0;
  std::string metrics_file_;
  TfEventsWriter tb_;  // rank 0: the run's events; other ranks: their sample images
  bool tb_open_ = false;
  std::string tb_dir_;  // other ranks: where their images go, until their first image or close()
};

}  // namespace videotrain
