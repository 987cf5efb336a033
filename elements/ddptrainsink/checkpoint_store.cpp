/* Checkpoint folders: see checkpoint_store.h. */
#include "checkpoint_store.h"
#include "regular_file.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <ctime>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <stdexcept>

namespace fs = std::filesystem;
using json = nlohmann::json;

namespace videotrain {

namespace {

constexpr const char *kManifest = "manifest.json";
constexpr const char *kTrainerJson = "trainer.json";
constexpr const char *kSealedBy = "sealed_by";  // trainer.json key, absent in legacy checkpoints

std::string errno_text(int e) { return std::strerror(e); }

// A checkpoint's JSON through the bounded open: false with *why empty when the file does not
// exist, else with what is wrong (not a regular file, too large, unreadable).
bool read_json_file(const std::string &path, std::string *text, std::string *why) {
  std::error_code ec;
  if (!fs::exists(path, ec) && !fs::is_symlink(path, ec)) {
    why->clear();
    return false;
  }
  return read_small_file(path, kMaxConfigBytes, text, why);
}

// fsync of a file or folder; false with errno set.
bool sync_path(const std::string &path, bool dir) {
  const int fd = ::open(path.c_str(), (dir ? O_RDONLY | O_DIRECTORY : O_RDONLY) | O_CLOEXEC);
  if (fd < 0) return false;
  const bool ok = ::fsync(fd) == 0;
  const int e = errno;
  ::close(fd);
  errno = e;
  return ok;
}

// Size and CRC-32 of a file read from disk. False with a reason.
bool checksum_file(const std::string &path, uint64_t *size, uint32_t *crc, std::string *why) {
  RegularFile file;  // a FIFO or device in a checkpoint is refused, not read forever
  if (!file.open(path, why)) return false;
  const int fd = file.fd();
  std::vector<char> buf(1 << 20);
  uint32_t c = 0;
  uint64_t n = 0;
  for (;;) {
    const ssize_t r = ::read(fd, buf.data(), buf.size());
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) {
      *why = errno_text(errno);
      return false;
    }
    if (r == 0) break;
    c = crc32_update(c, buf.data(), static_cast<size_t>(r));
    n += static_cast<uint64_t>(r);
  }
  *size = n;
  *crc = c;
  return true;
}

std::string hex32(uint32_t v) {
  char b[16];
  std::snprintf(b, sizeof(b), "%08x", v);
  return b;
}

void write_json(const std::string &path, const json &j) {
  std::ofstream out(path);
  out << j.dump(2) << "\n";
  out.flush();
  if (!out) throw std::runtime_error("cannot write '" + path + "' (checkpoint-dir): " + errno_text(errno));
}

// Step of a "step-NNNNNNNN" name; false for other names.
bool parse_step_name(const std::string &name, uint64_t *step) {
  if (name.size() <= 5 || name.compare(0, 5, "step-") != 0) return false;
  if (!std::all_of(name.begin() + 5, name.end(), [](char ch) { return ch >= '0' && ch <= '9'; })) return false;
  try {
    *step = std::stoull(name.substr(5));
  } catch (const std::exception &) {
    return false;
  }
  return true;
}

}  // namespace

std::string step_dir_name(uint64_t step) {
  char b[32];
  std::snprintf(b, sizeof(b), "step-%08llu", static_cast<unsigned long long>(step));
  return b;
}

bool CheckpointStore::prepare(std::string *error) const {
  std::error_code ec;
  fs::create_directories(root_, ec);
  if (ec) {
    *error = "cannot create checkpoint-dir '" + root_ + "': " + ec.message();
    return false;
  }
  // A probe file: a folder can exist and still refuse files (permissions, read-only mounts).
  const std::string probe = root_ + "/.write-test-" + std::to_string(getpid());
  const int fd = ::open(probe.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  bool ok = fd >= 0 && ::write(fd, "ok\n", 3) == 3 && ::fsync(fd) == 0;
  const int e = errno;
  if (fd >= 0) ::close(fd);
  ::unlink(probe.c_str());
  if (!ok) *error = "cannot write in checkpoint-dir '" + root_ + "': " + errno_text(e);
  return ok;
}

CheckpointStore::~CheckpointStore() { unlock(); }

void CheckpointStore::unlock() {
  if (lock_fd_ < 0) return;
  // Removed, then released: a lock file that is still there was left by a process that died.
  ::unlink((root_ + "/.lock").c_str());
  ::close(lock_fd_);
  lock_fd_ = -1;
}

bool CheckpointStore::lock(std::string *error, std::string *warning) {
  const std::string path = root_ + "/.lock";
  int fd = -1;
  auto holder = [&] {
    std::string text(512, '\0');
    const ssize_t n = ::pread(fd, text.data(), text.size(), 0);
    text.resize(n > 0 ? size_t(n) : 0);
    while (!text.empty() && (text.back() == '\n' || text.back() == '\0')) text.pop_back();
    return text;
  };
  for (int attempt = 0;; attempt++) {
    fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (fd < 0) {
      *error = "cannot open '" + path + "' (checkpoint-dir's lock): " + errno_text(errno);
      return false;
    }
    if (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
      const int e = errno;
      const std::string who = holder();
      *error = e == EWOULDBLOCK ? "checkpoint-dir '" + root_ + "' is in use by another run (" +
                                      (who.empty() ? std::string("a process starting up") : who) +
                                      "): two runs in one folder would mix their checkpoints; give this run its "
                                      "own checkpoint-dir, or stop the other"
                                : "cannot lock '" + path + "': " + errno_text(e);
      ::close(fd);
      return false;
    }
    // The holder before may have removed the file between our open and our lock: then we hold a
    // lock on a file nobody else sees, and go again.
    struct stat mine, now;
    if (::fstat(fd, &mine) == 0 && ::stat(path.c_str(), &now) == 0 && mine.st_ino == now.st_ino &&
        mine.st_dev == now.st_dev)
      break;
    ::close(fd);
    if (attempt == 10) {
      *error = "cannot take '" + path + "': it is replaced as fast as it is locked";
      return false;
    }
  }
  if (const std::string before = holder(); !before.empty())
    *warning = "checkpoint-dir '" + root_ + "' was locked by " + before +
               ", which is gone: its lock is taken over (its checkpoints are kept)";
  char host[256] = "?";
  ::gethostname(host, sizeof host - 1);
  const std::string me = "host " + std::string(host) + ", pid " + std::to_string(getpid()) + ", since " +
                         std::to_string(static_cast<long long>(::time(nullptr))) + " (unix time)\n";
  if (::ftruncate(fd, 0) != 0 || ::pwrite(fd, me.data(), me.size(), 0) != ssize_t(me.size())) {
    *error = "cannot write '" + path + "' (checkpoint-dir's lock): " + errno_text(errno);
    ::close(fd);
    return false;
  }
  lock_fd_ = fd;
  return true;
}

void CheckpointStore::remove_stale() const {
  std::error_code ec;
  if (!fs::is_directory(root_, ec)) return;
  std::vector<fs::path> stale;
  for (const auto &e : fs::directory_iterator(root_, ec)) {
    const std::string n = e.path().filename().string();
    if (n.rfind(".tmp-step-", 0) == 0 || n.rfind(".trash-", 0) == 0) stale.push_back(e.path());
  }
  for (const auto &p : stale) fs::remove_all(p, ec);
}

std::string CheckpointStore::begin(uint64_t step) const {
  const std::string tmp = root_ + "/.tmp-" + step_dir_name(step) + "-" + std::to_string(getpid());
  std::error_code ec;
  fs::create_directories(root_, ec);
  fs::remove_all(tmp, ec);
  if (!fs::create_directories(tmp, ec))
    throw std::runtime_error("cannot create checkpoint folder '" + tmp + "' (checkpoint-dir): " + ec.message());
  return tmp;
}

std::string CheckpointStore::commit(const std::string &tmp, uint64_t step, const json &state) const {
  // Says that a manifest seals this folder: without one it is damaged, not legacy.
  json sealed = state;
  sealed[kSealedBy] = kManifest;
  write_json(tmp + "/" + kTrainerJson, sealed);
  // Checksums of the files as they are on disk, each synced before the manifest names it.
  json files = json::object();
  std::error_code ec;
  // Recursive: a two-expert model keeps its second expert in a subfolder (named "transformer_2/...").
  for (const auto &e : fs::recursive_directory_iterator(tmp, ec)) {
    if (e.is_directory() && !sync_path(e.path().string(), true))
      throw std::runtime_error("cannot sync '" + e.path().string() + "' (checkpoint-dir): " + errno_text(errno));
    if (!e.is_regular_file()) continue;
    const std::string name = e.path().lexically_relative(tmp).generic_string();
    uint64_t size = 0;
    uint32_t crc = 0;
    std::string why;
    if (!checksum_file(e.path().string(), &size, &crc, &why) || !sync_path(e.path().string(), false))
      throw std::runtime_error("cannot read back '" + e.path().string() + "' (checkpoint-dir): " +
                               (why.empty() ? errno_text(errno) : why));
    files[name] = {{"size", size}, {"crc32", hex32(crc)}};
  }
  if (ec) throw std::runtime_error("cannot list '" + tmp + "' (checkpoint-dir): " + ec.message());
  write_json(tmp + "/" + kManifest, {{"format", 1}, {"step", step}, {"checksum", "crc32"}, {"files", files}});
  if (!sync_path(tmp + "/" + kManifest, false) || !sync_path(tmp, true))
    throw std::runtime_error("cannot sync '" + tmp + "' (checkpoint-dir): " + errno_text(errno));
  const std::string final_dir = root_ + "/" + step_dir_name(step);
  if (fs::exists(final_dir, ec)) discard(final_dir);  // e.g. one that failed to verify at resume
  fs::rename(tmp, final_dir, ec);
  if (ec) throw std::runtime_error("cannot rename '" + tmp + "' to '" + final_dir + "': " + ec.message());
  sync_path(root_, true);  // the rename itself; a failure here leaves a complete folder anyway
  // The checksums were taken from the synced files; reading gigabytes again would check
  // the page cache, not the disk. What the rename could lose shows in the sizes.
  FoundCheckpoint check;
  const std::string why = verify(final_dir, &check, /*checksums=*/false);
  if (!why.empty()) throw std::runtime_error("checkpoint '" + final_dir + "' does not verify after writing: " + why);
  return final_dir;
}

std::string CheckpointStore::verify(const std::string &dir, FoundCheckpoint *out, bool checksums) {
  json manifest;
  {
    std::string text, why;
    if (!read_json_file(dir + "/" + kManifest, &text, &why))
      return why.empty() ? "no manifest.json (a write or deletion that was interrupted, or a checkpoint without checksums)"
                         : why;
    try {
      manifest = json::parse(text);
    } catch (const std::exception &e) {
      return std::string("manifest.json is unreadable: ") + e.what();
    }
  }
  try {
    const uint64_t step = manifest.at("step").get<uint64_t>();
    const auto &files = manifest.at("files");
    if (!files.contains(kTrainerJson)) return "manifest.json lists no trainer.json";
    for (const auto &[name, want] : files.items()) {
      uint64_t size = 0;
      uint32_t crc = 0;
      std::string why;
      std::error_code ec;
      if (!checksums) {
        size = fs::file_size(dir + "/" + name, ec);
        if (ec) return name + ": " + ec.message();
      } else if (!checksum_file(dir + "/" + name, &size, &crc, &why)) {
        return name + ": " + why;
      }
      const uint64_t want_size = want.at("size").get<uint64_t>();
      if (size != want_size)
        return name + " has " + std::to_string(size) + " bytes, the manifest says " + std::to_string(want_size) +
               " (truncated or rewritten)";
      if (checksums && hex32(crc) != want.at("crc32").get<std::string>())
        return name + " has CRC-32 " + hex32(crc) + ", the manifest says " + want.at("crc32").get<std::string>() +
               " (its bytes changed after it was written)";
    }
    std::string text, why;
    if (!read_json_file(dir + "/" + kTrainerJson, &text, &why)) return why.empty() ? "no trainer.json" : why;
    FoundCheckpoint c;
    c.state = json::parse(text);
    c.step = c.state.at("step").get<uint64_t>();
    if (c.step != step)
      return "trainer.json says step " + std::to_string(c.step) + ", the manifest " + std::to_string(step);
    c.dir = dir;
    if (out) *out = std::move(c);
  } catch (const std::exception &e) {
    return std::string("manifest.json or trainer.json is malformed: ") + e.what();
  }
  return "";
}

std::vector<std::pair<uint64_t, std::string>> CheckpointStore::step_folders() const {
  std::vector<std::pair<uint64_t, std::string>> out;
  std::error_code ec;
  if (!fs::is_directory(root_, ec)) return out;
  for (const auto &e : fs::directory_iterator(root_, ec)) {
    uint64_t step = 0;
    if (e.is_directory() && parse_step_name(e.path().filename().string(), &step))
      out.emplace_back(step, e.path().string());
  }
  std::sort(out.begin(), out.end(), [](const auto &a, const auto &b) { return a.first > b.first; });
  return out;
}

std::string CheckpointStore::usable(const std::string &dir, FoundCheckpoint *out) {
  std::error_code ec;
  if (fs::exists(dir + "/" + kManifest, ec)) {
    const std::string why = verify(dir, out);
    if (why.empty() && out) out->legacy = false;
    return why;
  }
  FoundCheckpoint c;
  try {
    std::string text, why;
    if (!read_json_file(dir + "/" + kTrainerJson, &text, &why))
      return why.empty() ? "no manifest.json and no trainer.json (a write or deletion that was interrupted)" : why;
    c.state = json::parse(text);
    c.step = c.state.at("step").get<uint64_t>();
  } catch (const std::exception &e) {
    return std::string("no manifest.json, and trainer.json is unreadable: ") + e.what();
  }
  if (c.state.contains(kSealedBy))
    return "no manifest.json, though its trainer.json says one was written (a deletion that was interrupted, or "
           "the manifest was removed)";
  // What versions before manifests wrote: trainer.json, the weights, the optimizer state.
  for (const char *key : {"model_file", "optimizer_file"}) {
    const std::string name = c.state.value(key, std::string());
    if (name.empty()) return std::string("no manifest.json, and trainer.json names no ") + key;
    const uint64_t size = fs::file_size(dir + "/" + name, ec);
    if (ec) return "no manifest.json, and " + name + ": " + ec.message();
    if (size == 0) return "no manifest.json, and " + name + " is empty (a write that was cut short)";
  }
  c.dir = dir;
  c.legacy = true;
  if (out) *out = std::move(c);
  return "";
}

bool CheckpointStore::newest_usable(FoundCheckpoint *out,
                                    const std::function<std::string(const FoundCheckpoint &)> &load,
                                    const std::function<void(const std::string &, const std::string &)> &skipped) const {
  for (const auto &[step, dir] : step_folders()) {
    FoundCheckpoint c;
    std::string why = usable(dir, &c);
    if (why.empty() && load) why = load(c);
    if (why.empty()) {
      *out = std::move(c);
      return true;
    }
    if (skipped) skipped(dir, why);
  }
  return false;
}

void CheckpointStore::prune(unsigned keep, uint64_t newest) const {
  if (keep == 0) return;
  unsigned kept = 1;  // `newest`
  std::error_code ec;
  for (const auto &[step, dir] : step_folders()) {
    if (step >= newest) continue;
    // Folders without a manifest are no checkpoints of ours (a copy, an older version's): they
    // neither count nor go; except ours whose manifest was deleted (trainer.json says one sealed
    // it): damaged, never resumed from, so they go without counting.
    if (!fs::exists(dir + "/" + kManifest, ec)) {
      std::string text, why;
      bool damaged = false;
      if (read_json_file(dir + "/" + kTrainerJson, &text, &why)) {
        const json st = json::parse(text, nullptr, false);
        damaged = st.is_object() && st.contains(kSealedBy);
      }
      if (damaged) discard(dir);
      continue;
    }
    if (kept < keep)
      kept++;
    else
      discard(dir);
  }
}

void CheckpointStore::discard(const std::string &dir) const {
  const fs::path p(dir);
  const std::string trash = (p.parent_path() / (".trash-" + p.filename().string() + "-" + std::to_string(getpid()))).string();
  std::error_code ec;
  fs::remove_all(trash, ec);
  fs::rename(dir, trash, ec);
  if (ec) throw std::runtime_error("cannot move '" + dir + "' out of the way (checkpoint-dir): " + ec.message());
  fs::remove_all(trash, ec);  // a failure leaves a .trash- folder, removed at the next start
}

std::string check_positions(const json &st, uint64_t step) {
  // A rank's clips in an epoch are at most its steps' clips; no step holds 65536 clips per rank.
  constexpr uint64_t kMaxClipsPerStep = 65536;
  const auto w = st.find("world_size");
  if (w != st.end() && !(w->is_number_unsigned() && w->get<uint64_t>() >= 1 && w->get<uint64_t>() <= 65536))
    return "trainer.json's world_size " + w->dump() + " is not a number of ranks";
  const uint64_t world = w == st.end() ? 1 : w->get<uint64_t>();
  const auto pos = st.find("positions");
  if (pos == st.end() || !pos->is_array() || pos->size() != world)
    return "trainer.json's positions are not one per rank of its world_size " + std::to_string(world);
  std::vector<bool> seen(world, false);
  for (const auto &p : *pos) {
    if (!p.is_object()) return "trainer.json's positions hold " + p.dump() + ", not {rank, epoch, clip}";
    const auto r = p.find("rank"), e = p.find("epoch"), c = p.find("clip");
    if (r == p.end() || !r->is_number_unsigned() || r->get<uint64_t>() >= world || seen[r->get<uint64_t>()])
      return "trainer.json's position " + p.dump() + " names no rank of its world, or one twice";
    seen[r->get<uint64_t>()] = true;
    if (e == p.end() || !e->is_number_unsigned() || e->get<uint64_t>() > UINT32_MAX)
      return "trainer.json's position " + p.dump() + " has no epoch in 0..2^32-1";
    if (c == p.end() || !c->is_number_unsigned() || c->get<uint64_t>() > (step + 1) * kMaxClipsPerStep)
      return "trainer.json's position " + p.dump() + " has a clip that " + std::to_string(step) +
             " steps cannot have reached";
  }
  return "";
}

bool find_resume(const CheckpointStore &store, const ResumeRun &run, FoundCheckpoint *out, unsigned *epoch,
                 uint64_t *clip, int *world_then, std::vector<uint64_t> *clips_then,
                 const std::function<void(const std::string &)> &warn,
                 const std::function<std::string(const FoundCheckpoint &)> &load) {
  int skipped = 0;
  auto checked_load = [&](const FoundCheckpoint &c) -> std::string {
    // Positions no run could have written (a forged or damaged trainer.json whose checksum was
    // recomputed) would send the source planning epoch after epoch: like a bad checksum.
    if (std::string why = check_positions(c.state, c.step); !why.empty()) return why;
    return load ? load(c) : std::string();
  };
  const bool found = store.newest_usable(out, checked_load, [&](const std::string &dir, const std::string &why) {
    skipped++;
    warn("resume: skipping checkpoint '" + dir + "': " + why + "; trying an older one");
  });
  if (!found) {
    if (skipped > 0)
      throw std::runtime_error("resume=true but none of the " + std::to_string(skipped) +
                               " checkpoint folders in checkpoint-dir '" + store.root() +
                               "' verifies and loads (see the warnings): remove them or set resume=false");
    warn("resume=true but checkpoint-dir '" + store.root() + "' holds no complete checkpoint: training from scratch");
    return false;
  }
  if (out->legacy)
    warn("resume: checkpoint '" + out->dir +
         "' has no manifest.json (written before checkpoints had checksums): its files cannot be verified, only "
         "checked for finite values after loading; checkpoints written from now on are verified");
  const auto &st = out->state;
  if (st.value("model", std::string()) != run.model)
    warn("checkpoint '" + out->dir + "' was written for model '" + st.value("model", std::string()) +
         "', loading it into '" + run.model + "'");
  // The schedule is computed from these: changed values make the learning rate jump.
  std::string changed;
  auto check = [&](const char *prop, const char *key, const json &now) {
    if (st.contains(key) && st.at(key) != now)
      changed += std::string(changed.empty() ? "" : ", ") + prop + " " + st.at(key).dump() + " -> " + now.dump();
  };
  check("lr-schedule", "lr_schedule", run.lr_schedule);
  check("max-steps", "max_steps", run.max_steps);
  check("warmup-steps", "warmup_steps", run.warmup_steps);
  if (!changed.empty())
    warn("resuming from '" + out->dir + "' with a different schedule (" + changed +
         "): the learning rate follows the new values from step " + std::to_string(out->step + 1));
  *world_then = 0;
  clips_then->clear();
  const int written_by = st.value("world_size", 1);
  if (written_by == run.world) {
    for (const auto &p : st.at("positions"))
      if (p.at("rank").get<int>() == run.rank) {
        *epoch = p.at("epoch").get<unsigned>();
        *clip = p.at("clip").get<uint64_t>();
      }
    return true;
  }
  // The weights and optimizer state are every rank's alike: only the data position is per rank.
  // Every old rank ran the same steps, so they are in one epoch (the earliest, should one differ);
  // the source finds the global position from every old rank's clip there.
  std::vector<std::pair<unsigned, uint64_t>> by_rank(size_t(written_by), {0, 0});
  for (const auto &p : st.at("positions"))
    by_rank[p.at("rank").get<size_t>()] = {p.at("epoch").get<unsigned>(), p.at("clip").get<uint64_t>()};
  *epoch = by_rank[0].first;
  for (const auto &[e, c] : by_rank) *epoch = std::min(*epoch, e);
  std::string clips;
  for (const auto &[e, c] : by_rank) clips_then->push_back(e == *epoch ? c : UINT64_MAX);  // later: epoch done
  for (uint64_t c : *clips_then) clips += (clips.empty() ? "" : ", ") + (c == UINT64_MAX ? "all" : std::to_string(c));
  *world_then = written_by;
  *clip = 0;
  warn("resume: checkpoint '" + out->dir + "' was written by " + std::to_string(written_by) + " rank(s), this run has " +
       std::to_string(run.world) + ": the weights and optimizer state carry over; the data continues in epoch " +
       std::to_string(*epoch) + " from the samples every rank had seen (clips " + clips +
       " of each old rank), the global position, so a few samples may be trained again; each optimizer step now "
       "takes " + std::to_string(run.world) + " rank(s)' batches instead of " + std::to_string(written_by) +
       " (the learning rate is not rescaled)");
  return true;
}

}  // namespace videotrain
