/* See run_log.h. */
#include "run_log.h"

#include <nlohmann/json.hpp>

#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>

namespace fs = std::filesystem;

namespace videotrain {

std::string RunLog::open(int rank, const std::string &metrics_file) {
  std::lock_guard<std::mutex> lock(mu_);
  writer_ = rank == 0;
  rank_ = rank;
  metrics_file_ = metrics_file;
  if (!writer_ || metrics_file.empty()) return "";
  const fs::path parent = fs::path(metrics_file).parent_path();
  std::error_code ec;
  if (!parent.empty()) fs::create_directories(parent, ec);
  if (ec) return "cannot create the folder of metrics-file '" + metrics_file + "': " + ec.message();
  // Now, not at the first record after the first log-every steps.
  std::ofstream probe(metrics_file, std::ios::app);
  if (!probe) return "cannot write metrics-file '" + metrics_file + "': " + std::strerror(errno);
  return "";
}

std::string RunLog::open_tensorboard(const std::string &dir) {
  std::lock_guard<std::mutex> lock(mu_);
  if (dir.empty()) return "";
  if (!writer_) {
    tb_dir_ = dir + "/samples-rank" + std::to_string(rank_);
    return "";
  }
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
  if (writer_ && tb_open_ && !scalars.empty()) tb_.add_scalars(static_cast<int64_t>(step), scalars);
}

bool RunLog::add_image(uint64_t step, const std::string &tag, const std::string &png, int width, int height) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!tb_open_ && !tb_dir_.empty()) {  // another rank's first image
    std::string err;
    tb_open_ = tb_.open(tb_dir_, "", &err);  // err: the images are left out, training goes on
    tb_dir_.clear();                          // one try, not one per frame
  }
  if (!tb_open_) return false;
  tb_.add_image(static_cast<int64_t>(step), tag, png, width, height, 3);
  return true;
}

bool RunLog::append(const std::string &line, uint64_t step, const std::vector<std::pair<std::string, float>> &scalars) {
  add_scalars(step, scalars);
  return append_line(line);
}

bool RunLog::log_step(const StepReport &r) {
  using json = nlohmann::json;
  auto num = [](double v) { return std::isfinite(v) ? json(v) : json(nullptr); };
  const json j = {{"type", "step"},
                  {"step", r.step},
                  {"epoch", r.epoch},
                  {"loss", num(r.loss)},
                  {"lr", r.lr},
                  {"grad_norm", num(r.grad_norm)},
                  {"samples_per_second", r.samples_per_s},
                  {"data_wait", r.data_wait},
                  {"skipped", r.skipped},
                  {"time", std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count()}};

  const bool ok = append_line(j.dump());
  std::vector<std::pair<std::string, float>> s{{"train/loss", static_cast<float>(r.loss)},
                                              {"train/lr", static_cast<float>(r.lr)},
                                              {"train/samples_per_second", static_cast<float>(r.samples_per_s)},
                                              {"train/data_wait", static_cast<float>(r.data_wait)}};
  if (std::isfinite(r.grad_norm)) s.emplace_back("train/grad_norm", static_cast<float>(r.grad_norm));
  add_scalars(r.step, s);
  return ok;
}

void RunLog::close() {
  std::lock_guard<std::mutex> lock(mu_);
  tb_.close();
  tb_open_ = false;
  tb_dir_.clear();
}

}  // namespace videotrain
