/* The work behind csvvideosrc, without GObject: schedules the clips of a rank's
 * epochs, decodes `prefetch` of them at once on worker threads, replaces bad
 * samples, and hands frames out in a deterministic order. */
#pragma once

#include <gst/gst.h>

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "bucket_rows.h"
#include "cache_protocol.h"
#include "clip_decoder.h"
#include "manifest.h"
#include "row_facts.h"
#include "schedule.h"
#include "shapes_query.h"

namespace videotrain {

enum class ShortClips { Replace, Pad, Fail };
enum class OnError { Replace, Fail };

struct SourceConfig {
  ManifestOptions manifest;
  int num_frames = 49;
  int frame_stride = 1;
  // > 0: each video has this many clip windows, fixed by seed and row, and each epoch uses one
  // of them (clip-start=random), so that a latent cache fills within about K epochs; 0: a fresh
  // window every epoch.
  int clip_windows = 0;
  double fps = 0;        // > 0: sample clips at this rate of source time
  int video_stream = 0;  // index among a file's video streams
  ClipStart clip_start = ClipStart::Random;
  int width = 720, height = 480;
  // Shape buckets: "WxH,..." and "49,33,17" (empty: width x height, num_frames). Either set
  // makes the schedule a BucketSchedule of groups of `step_samples` clips.
  std::string buckets, frame_buckets;
  uint32_t step_samples = 1;  // the microbatcher's batch-size (one optimizer step on a rank)
  int probe_threads = 4;      // for rows whose sizes the manifest leaves empty
  ResizeMode resize = ResizeMode::Crop;
  ShortClips short_clips = ShortClips::Replace;
  OnError on_error = OnError::Replace;
  int rank = 0, world_size = 1;
  bool shuffle = true;
  uint64_t seed = 0;
  uint32_t num_epochs = 1;  // 0 = forever
  uint32_t start_epoch = 0;
  uint64_t start_clip = 0;
  // A checkpoint written by another number of ranks (0: this one): its world size and every old
  // rank's next clip in start_epoch. start_clip is then this rank's share of the samples (plain
  // schedule) or steps (buckets) all of them had seen: the global position, not each rank's.
  int resume_world = 0;
  std::vector<uint64_t> resume_clips;
  int prefetch = 4;
  int decode_threads = 1;
  double decode_timeout_s = 60.0;
  int max_replacements = 32;  // candidates tried for one clip before giving up
  // Row facts a resumed checkpoint holds (every rank's): applied as if found in their epochs.
  std::vector<RowFact> resumed_facts;
};

struct ReplacedEvent {
  uint32_t epoch;
  uint64_t clip;
  uint64_t row;
  std::string path;
  std::string reason;
};

struct SourceCallbacks {
  // Both may be called from worker threads or the streaming thread.
  std::function<void(const ReplacedEvent &)> replaced;
  // decoded + cached = clips: how many were decoded, and how many a latent cache downstream held.
  std::function<void(uint32_t epoch, uint64_t clips, uint64_t replaced, uint64_t decoded, uint64_t cached)>
      epoch_done;
  // Set when downstream may hold clips (a latent cache): asked, on a worker thread, before a clip
  // is decoded; true: the clip is not decoded and next() hands out its identity instead.
  std::function<bool(const ClipIdentity &)> cached;
  // A row used with a change (a caption cut to max-caption-bytes): once per row and run.
  std::function<void(uint64_t row, const std::string &path, const std::string &warning)> row_warning;
  // With several ranks and buckets, before each epoch after the first is planned (on a worker
  // thread, no lock held): this rank's row facts in, every rank's out, so that every rank moves
  // the same rows from the same epoch. kAlone: nothing downstream to agree through; rows then
  // stay in their buckets. Unset (nothing downstream answered the element's probe at start): the
  // same, said when each such row is found.
  enum class Agreement { kAlone, kAgreed, kFailed, kCancelled };
  std::function<Agreement(uint32_t epoch, const std::vector<RowFact> &mine, std::vector<RowFact> *all,
                          std::string *why)>
      agree_rows;
  // A row fact just learned (a worker thread, no lock held), for the trainer's checkpoints.
  std::function<void(const RowFact &)> fact_learned;
  // A warning about the run rather than a row.
  std::function<void(const std::string &warning)> warning;
};

struct SourceStats {
  uint64_t clips = 0;           // clips handed out completely
  uint64_t frames = 0;          // frames handed out
  uint64_t replaced = 0;        // failed samples replaced
  uint64_t frames_decoded = 0;  // frames that left the decoders
};

class SourceEngine {
 public:
  enum class Pull { Frame, Cached, Eos, Flushing, Error };

  SourceEngine(SourceConfig config, SourceCallbacks callbacks);
  ~SourceEngine();
  SourceEngine(const SourceEngine &) = delete;
  SourceEngine &operator=(const SourceEngine &) = delete;

  // Opens and indexes the manifest, checks the configuration, starts the workers.
  bool start(std::string *error);
  // Every clip shape the configuration can produce (buckets x frame-buckets; one without).
  static bool shapes(const SourceConfig &config, std::vector<ClipShape> *out, std::string *error);
  bool bucketed() const { return bool(buckets_); }
  // With buckets: what start() found (rows per bucket, rows left out), for the log and warnings.
  std::string bucket_summary() const;
  std::string bucket_warning() const;  // "" when no row was left out or probed
  uint64_t steps_per_epoch() const;    // with buckets; 0 without
  void stop();

  // Next frame in order (a new ref, with its clip meta). Blocks until one is decoded.
  Pull next(GstBuffer **frame, std::string *error);
  // The same, where a clip that downstream holds comes out whole as Cached with its identity.
  Pull next(GstBuffer **frame, ClipIdentity *cached, std::string *error);

  // Width, height and length of the clip the last frame next() gave belongs to (they change at
  // clip boundaries with buckets). Streaming thread only.
  ClipShape frame_shape() const { return frame_shape_; }

  // Unblocks next() (returns Flushing) and cancels decoding while set.
  void set_flushing(bool flushing);
  // Restart at the `seq`-th clip after the start position (a seek); drops what is prefetched.
  void restart_at(uint64_t seq);

  uint64_t clips_per_epoch() const;  // with buckets: of the first epoch (it varies by epoch and rank)
  uint64_t total_clips() const;  // UINT64_MAX when num-epochs is 0 or with buckets
  std::string manifest_description() const;
  std::vector<std::string> manifest_warnings() const;  // Manifest::warnings()
  SourceStats stats() const;
  // Decoded clips held (in flight + ready); never above prefetch.
  size_t clips_held() const;

 private:
  struct Result {
    DecodedClip clip;
    std::string fatal;  // non-empty: stop the stream with this error
    bool cached = false;  // downstream holds the clip: `identity` instead of frames
    ClipIdentity identity;
    ClipShape shape;      // width, height and frames of the clip
  };
  struct Position {
    uint32_t epoch;
    uint64_t clip;
  };

  // What the schedule gives for a clip, buckets or not.
  struct Slot {
    uint64_t index = 0;
    bool padding = false;
    ClipShape shape;
    uint64_t group = 0;
    uint32_t group_size = 0;
  };
  Position position(uint64_t seq) const;
  bool past_end(uint64_t seq) const;
  uint64_t clips_in_epoch(uint32_t epoch) const;
  Slot slot(const Position &pos, uint64_t k) const;  // k > 0: the k-th replacement
  uint64_t replacement_pool() const;  // rows a replacement can come from
  bool start_buckets(std::string *error);
  void worker_loop();
  Result produce(uint64_t seq, const std::atomic<bool> *cancel);
  enum class Claim { Try, KnownBad, Cancelled };
  // Waits while another worker tries the row; Try: this worker tries it, then release()s it.
  struct BadRow {
    std::string reason;
    uint32_t epoch = 0;  // when it was found
  };
  Claim claim(uint64_t index, const std::atomic<bool> *cancel, BadRow *known);
  void release(uint64_t index, const std::string &bad_reason, uint32_t epoch);  // reason empty: not bad
  void report_bad(const Position &pos, uint64_t index, const ManifestRow &row, const std::string &reason);
  // A decode (of a clip of `epoch`) found the row's video stream shorter than the manifest says:
  // remembered (and the manifest's length fixed) for the run, said once, and kept as a row fact.
  // A row that cannot fill its frame bucket moves to one it can (or out) from epoch + 1.
  void learn_length(uint64_t index, const ManifestRow &row, int64_t frames, uint32_t epoch);
  // The first decode of a row whose manifest size is off by more than a factor of 2: the size is
  // fixed for the run and the row moves to the size bucket of its real aspect from epoch + 1.
  void learn_size(uint64_t index, const ManifestRow &row, int width, int height, uint32_t epoch);
  // Where a row of bucket `b` belongs with `frames` real frames / a real size (b when it stays).
  uint32_t bucket_for_length(uint32_t b, int64_t frames, float fps) const;
  uint32_t bucket_for_size(uint32_t b, uint32_t width, uint32_t height) const;
  // Buckets: before the first clip of `epoch` is dispatched (lock_ held, planning_ set). Waits
  // until no clip is in flight, so that the facts of every clip before are known, agrees on them
  // with the other ranks (unlocked) and moves their rows from `epoch`. False on a stop or error.
  bool plan_epoch(std::unique_lock<std::mutex> &lk, uint32_t epoch);
  void apply_facts(uint32_t epoch, const std::vector<RowFact> &facts);  // lock_ held
  // The row's real frame count where a decode found it, else -1.
  int64_t known_frames(uint64_t index);
  // Whether `frames` source frames give a clip of `clip_frames` (frame-stride / fps).
  bool holds(int64_t frames, int clip_frames, float source_fps) const;
  void attach_metas(DecodedClip &clip, const ManifestRow &row, const Position &pos, const Slot &slot, bool padding);
  uint64_t random_key(uint32_t epoch, uint64_t row) const;
  // The source's part of a clip's cache key: the video's content and everything that picks and
  // shapes its frames. "" when the video cannot be read (it is decoded, and fails, as usual).
  std::string source_key(const ManifestRow &row, uint64_t random_key, const ClipShape &shape);
  // lock_ held: the clip at next_consume_ was handed out completely.
  void clip_done(std::unique_lock<std::mutex> &lk, bool cached);
  void halt_workers();
  void drop_prefetched();  // lock_ held: forget prefetched clips, start a new generation
  void start_workers();

  SourceConfig cfg_;
  SourceCallbacks cb_;
  std::unique_ptr<Manifest> manifest_;
  std::unique_ptr<Schedule> schedule_;
  std::unique_ptr<BucketSchedule> buckets_;  // instead of schedule_ with buckets
  BucketSpec spec_;
  BucketAssignment assignment_;
  // With buckets, epochs differ in length: clip offset (from start_epoch's start) of each epoch's start.
  mutable std::mutex epochs_lock_;
  mutable std::vector<uint64_t> epoch_starts_;
  uint64_t total_ = 0;

  mutable std::mutex lock_;
  std::condition_variable work_cv_, out_cv_;
  std::vector<std::thread> workers_;
  bool quit_ = false;
  bool flushing_ = false;
  uint64_t generation_ = 0;
  std::shared_ptr<std::atomic<bool>> cancel_;
  uint64_t next_dispatch_ = 0, next_consume_ = 0;
  uint64_t in_flight_ = 0;  // clips being produced
  // Buckets: the newest epoch planned (position() does not plan past it), and whether a worker
  // is planning the next.
  std::atomic<uint32_t> planned_through_{0};
  bool planning_ = false;
  bool alone_ = false;  // several ranks with nothing to agree through: rows stay
  std::map<uint64_t, Result> ready_;
  Result current_;
  size_t current_pos_ = 0;
  ClipShape frame_shape_;
  bool have_current_ = false;
  std::string fatal_;

  // Rows found bad are remembered for the run, and reported once per epoch.
  std::mutex bad_lock_;
  std::condition_variable bad_cv_;
  std::unordered_map<uint64_t, BadRow> bad_;        // by manifest index
  std::unordered_map<uint64_t, int64_t> real_frames_;  // by manifest index: lengths decodes found
  std::unordered_set<uint64_t> sizes_checked_;         // by manifest index: sizes compared once
  std::vector<RowFact> facts_;                         // what this rank's decodes found
  std::set<std::pair<uint64_t, int>> applied_;          // (index, 0 length / 1 size) facts moved on (lock_)
  std::set<uint64_t> trying_;                      // manifest indices being decoded now
  std::map<uint32_t, std::set<uint64_t>> reported_;  // epoch -> manifest indices reported (its replaced count)

  std::atomic<uint64_t> stat_clips_{0}, stat_frames_{0}, stat_replaced_{0}, stat_decoded_{0};
  uint64_t epoch_cached_ = 0, epoch_clips_ = 0;  // lock_: clips of the current epoch handed out, and cached
  // Content digests by (path, size, mtime, inode): each video is read once per run for its key.
  std::mutex warned_lock_;
  std::unordered_set<uint64_t> warned_rows_;
  std::mutex digest_lock_;
  std::unordered_map<std::string, std::string> digests_;
};

}  // namespace videotrain
