/* See run_log.h. */
#include "run_log.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>

namespace fs = std::filesystem;

namespace videotrain {

std::string RunLog::open(int rank, const std::string &metrics_file) {
  std::lock_guard<std::mutex> lock(mu_);
  writer_ = rank == 0;
  metrics_file_ = metrics_file;
  if (!writer_ || metrics_file.empty()) return "";
  const fs::path parent = fs::path(metrics_file).parent_path();
  std::error_code ec;
  if (!parent.empty()) fs::create_directories(parent, ec);
  return ec ? "cannot create the folder of metrics-file '" + metrics_file + "': " + ec.message() : "";
}

std::string RunLog::open_tensorboard(const std::string &dir) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!writer_ || dir.empty()) return "";
  std::string err;
  tb_open_ = tb_.open(dir, "", &err);
  return tb_open_ ? "" : err;
}

bool RunLog::append_line(const std::string &line) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!writer_ || metrics_file_.empty()) return true;
  std::ofstream out(metrics_file_, std::ios::app);
  out << line << "\n";
  return static_cast<bool>(out.flush());
}

void RunLog::add_scalars(uint64_t step, const std::vector<std::pair<std::string, float>> &scalars) {
  std::lock_guard<std::mutex> lock(mu_);
  if (tb_open_ && !scalars.empty()) tb_.add_scalars(static_cast<int64_t>(step), scalars);
}

bool RunLog::append(const std::string &line, uint64_t step, const std::vector<std::pair<std::string, float>> &scalars) {
  add_scalars(step, scalars);
  return append_line(line);
}

void RunLog::close() {
  std::lock_guard<std::mutex> lock(mu_);
  tb_.close();
  tb_open_ = false;
}

double scheduled_lr(double base, const std::string &schedule, uint64_t warmup_steps, uint64_t max_steps,
                    uint64_t done) {
  if (warmup_steps > 0 && done < warmup_steps)
    return base * static_cast<double>(done + 1) / static_cast<double>(warmup_steps);
  if (schedule == "constant" || max_steps == 0 || max_steps <= warmup_steps) return base;
  double p = static_cast<double>(done - warmup_steps) / static_cast<double>(max_steps - warmup_steps);
  p = std::min(std::max(p, 0.0), 1.0);
  if (schedule == "cosine") return base * 0.5 * (1.0 + std::cos(M_PI * p));
  return base * (1.0 - p);
}

}  // namespace videotrain
