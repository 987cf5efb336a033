/* Checkpoint folders of ddptrainsink (no torch here): step-NNNNNNNN folders under
 * checkpoint-dir, each sealed by a manifest.json written last that holds every file's
 * size and CRC-32. A folder counts as a checkpoint only when its manifest is there and
 * every file matches it, so a killed write, a half-finished deletion, a truncated file
 * or bytes changed after the write are found before anything is loaded.
 *
 * Writing: begin() gives a temporary folder; the trainer saves its files into it;
 * commit() writes trainer.json and the manifest, fsyncs files and folder, renames the
 * folder into place, fsyncs checkpoint-dir and checks the result's sizes. Deleting (prune,
 * replacing a folder of the same step): renamed to a .trash- name first, then removed,
 * so an interrupted deletion never leaves a step- folder behind.
 *
 * Checkpoints written before manifests existed (legacy: no manifest.json, and a
 * trainer.json that does not say a manifest seals the folder) cannot be verified; they
 * are still usable when the files that version wrote are there (trainer.json readable,
 * the weights and optimizer files present and not empty). */
#pragma once

#include <nlohmann/json.hpp>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "crc32.h"

namespace videotrain {

std::string step_dir_name(uint64_t step);

struct FoundCheckpoint {
  std::string dir;
  uint64_t step = 0;
  nlohmann::json state;  // trainer.json
  bool legacy = false;   // no manifest: written before checksums existed, not verified
};

class CheckpointStore {
 public:
  explicit CheckpointStore(std::string root) : root_(std::move(root)) {}
  ~CheckpointStore();
  CheckpointStore(const CheckpointStore &) = delete;
  CheckpointStore &operator=(const CheckpointStore &) = delete;
  const std::string &root() const { return root_; }

  // Takes the folder's lock (.lock, an flock held until unlock(), with the holder's host, PID and
  // start time in it), so that two runs never mix their checkpoints: false with an error naming
  // the holder while another process holds it. A lock file left by a process that died (the
  // kernel dropped its flock, the file stayed) is taken over, with *warning naming who left it.
  bool lock(std::string *error, std::string *warning);
  // Releases the lock (and removes its file); the destructor does too.
  void unlock();

  // Creates the folder (and parents) and checks that a file can be created, written and
  // synced there. False with a reason naming the folder and the system's error text.
  bool prepare(std::string *error) const;
  // Removes what killed runs leave behind: .tmp-step-* and .trash-* folders.
  void remove_stale() const;
  // A fresh temporary folder for the files of `step`. Throws.
  std::string begin(uint64_t step) const;
  // Seals `tmp` (see above) as step-NNNNNNNN with `state` as trainer.json; returns the
  // final folder, verified. Throws, leaving every existing checkpoint as it was.
  std::string commit(const std::string &tmp, uint64_t step, const nlohmann::json &state) const;
  // "" when `dir` is a complete checkpoint whose files match its manifest (then *out
  // holds it), else why not. Without `checksums` only the files' sizes are compared.
  static std::string verify(const std::string &dir, FoundCheckpoint *out, bool checksums = true);
  // "" when `dir` verifies (as verify()) or is a complete legacy checkpoint (then
  // out->legacy is set), else why not. A folder whose trainer.json says a manifest seals
  // it but has none is damaged, not legacy.
  static std::string usable(const std::string &dir, FoundCheckpoint *out);
  // The newest checkpoint that is usable() and that `load` accepts ("" from it: loaded;
  // else why it cannot be used, e.g. non-finite weights; it may throw to stop the
  // search). Each newer step- folder passed over goes to `skipped` (folder, why). False
  // when there is none.
  bool newest_usable(FoundCheckpoint *out, const std::function<std::string(const FoundCheckpoint &)> &load,
                     const std::function<void(const std::string &dir, const std::string &why)> &skipped) const;
  // After `newest` was committed: keeps it and the keep - 1 newest step- folders below it,
  // deletes the older ones. Folders of later steps (another run's, or ones that failed to
  // verify at resume and will be replaced when training reaches them) are left alone.
  void prune(unsigned keep, uint64_t newest) const;
  // step- folders (complete or not) with their steps, newest first.
  std::vector<std::pair<uint64_t, std::string>> step_folders() const;

 private:
  void discard(const std::string &dir) const;  // rename to .trash-, then remove
  std::string root_;
  int lock_fd_ = -1;
};

// This run, as resume compares it with a checkpoint's trainer.json.
struct ResumeRun {
  int world = 1, rank = 0;
  std::string model, lr_schedule;
  uint64_t max_steps = 0, warmup_steps = 0;
};

// resume=true: the newest usable checkpoint that `load` loads and accepts (see
// newest_usable; the trainer checks there that weights and optimizer state are finite)
// into *out, with this rank's data position (epoch, next clip) into *epoch / *clip. Warns
// of each newer folder skipped, of a legacy checkpoint (no checksums), of another model
// and of a changed schedule. False (warned) when there is no checkpoint; throws when
// folders exist but none is usable.
// A checkpoint of another world size resumes at the global position: *world_then gets its world
// size and *clips_then each old rank's next clip in *epoch (warned); else *world_then is 0.
// Positions that no run of this step could have written (negative, an epoch past the step count,
// more clips than steps could hold) make the checkpoint unusable, like a bad checksum.
bool find_resume(const CheckpointStore &store, const ResumeRun &run, FoundCheckpoint *out, unsigned *epoch,
                 uint64_t *clip, int *world_then, std::vector<uint64_t> *clips_then,
                 const std::function<void(const std::string &)> &warn,
                 const std::function<std::string(const FoundCheckpoint &)> &load);
// Why trainer.json's data positions cannot be a run's (see find_resume), "" when they can.
std::string check_positions(const nlohmann::json &state, uint64_t step);

}  // namespace videotrain
