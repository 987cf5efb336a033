#include "source_engine.h"

#include <sys/stat.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <limits>

#include "latent_store.h"

#include "metas.h"

namespace videotrain {

SourceEngine::SourceEngine(SourceConfig config, SourceCallbacks callbacks)
    : cfg_(std::move(config)), cb_(std::move(callbacks)), cancel_(std::make_shared<std::atomic<bool>>(false)) {}

SourceEngine::~SourceEngine() { stop(); }

bool SourceEngine::start(std::string *error) {
  stop();
  if (cfg_.world_size < 1 || cfg_.rank < 0 || cfg_.rank >= cfg_.world_size) {
    *error = "rank " + std::to_string(cfg_.rank) + " is outside world-size " + std::to_string(cfg_.world_size);
    return false;
  }
  if (cfg_.num_epochs != 0 && cfg_.start_epoch >= cfg_.num_epochs) {
    *error = "start-epoch " + std::to_string(cfg_.start_epoch) + " is not below num-epochs " +
             std::to_string(cfg_.num_epochs);
    return false;
  }
  const bool bucketed = !cfg_.buckets.empty() || !cfg_.frame_buckets.empty();
  cfg_.manifest.sizes = bucketed;
  if (!manifest_) {
    manifest_ = Manifest::open(cfg_.manifest, error);
    if (!manifest_) return false;
  }
  if (manifest_->size() == 0) {
    *error = "manifest " + cfg_.manifest.location + " has no rows" +
             (cfg_.manifest.split.empty() ? std::string() : " with split '" + cfg_.manifest.split + "'");
    return false;
  }
  if (manifest_->size() > std::numeric_limits<uint32_t>::max()) {
    *error = "manifest " + cfg_.manifest.location + " has more than 2^32 rows";
    return false;
  }
  if (bucketed) {
    if (!start_buckets(error)) return false;
  } else {
    schedule_ = std::make_unique<Schedule>(manifest_->size(), cfg_.rank, cfg_.world_size, cfg_.shuffle, cfg_.seed);
    const uint64_t cpe = schedule_->clips_per_epoch();
    if (cfg_.resume_world > 0 && cfg_.resume_world != cfg_.world_size) {
      // Old rank r took positions r, r + W, ...: the first min(c) * W positions of the epoch's
      // permutation were seen by every rank; this rank takes its share of them.
      uint64_t least = cfg_.resume_clips.size() == size_t(cfg_.resume_world) ? UINT64_MAX : 0;
      for (uint64_t c : cfg_.resume_clips) least = std::min(least, c);
      const uint64_t seen = std::min<uint64_t>(least * uint64_t(cfg_.resume_world), manifest_->size());
      cfg_.start_clip = seen >= manifest_->size() ? cpe : seen / uint64_t(cfg_.world_size);
    }
    // A position at or past an epoch's end (clips consumed) continues in the next epoch; a
    // position further on is no checkpoint of this manifest (a forged or foreign trainer.json).
    if (cfg_.start_clip / cpe > 1) {
      *error = "start position (epoch " + std::to_string(cfg_.start_epoch) + ", clip " +
               std::to_string(cfg_.start_clip) + ") is past the end of the epoch (" + std::to_string(cpe) +
               " clips on this rank): a checkpoint of another manifest?";
      return false;
    }
    cfg_.start_epoch += uint32_t(cfg_.start_clip / cpe);
    cfg_.start_clip %= cpe;
  }
  if (cfg_.num_epochs != 0 && cfg_.start_epoch >= cfg_.num_epochs) {
    *error = "start position (epoch " + std::to_string(cfg_.start_epoch) + ", clip " +
             std::to_string(cfg_.start_clip) + ") is past the last of num-epochs " + std::to_string(cfg_.num_epochs) +
             (bucketed ? std::string()
                       : " (" + std::to_string(schedule_->clips_per_epoch()) + " clips per epoch on this rank)");
    return false;
  }
  total_ = cfg_.num_epochs == 0 || bucketed
               ? std::numeric_limits<uint64_t>::max()
               : (uint64_t(cfg_.num_epochs - cfg_.start_epoch) * clips_in_epoch(0) - cfg_.start_clip);
  {
    std::lock_guard<std::mutex> g(lock_);
    next_dispatch_ = next_consume_ = 0;
  }
  start_workers();
  return true;
}

void SourceEngine::start_workers() {
  std::lock_guard<std::mutex> g(lock_);
  quit_ = false;
  for (int i = 0; i < cfg_.prefetch; i++) workers_.emplace_back(&SourceEngine::worker_loop, this);
}

void SourceEngine::halt_workers() {
  {
    std::lock_guard<std::mutex> g(lock_);
    quit_ = true;
    cancel_->store(true);
  }
  work_cv_.notify_all();
  out_cv_.notify_all();
  for (auto &t : workers_) t.join();
  workers_.clear();
}

void SourceEngine::drop_prefetched() {
  ready_.clear();
  current_ = Result();
  have_current_ = false;
  generation_++;  // results of decodes still in flight are dropped
  cancel_ = std::make_shared<std::atomic<bool>>(false);
  fatal_.clear();
}

void SourceEngine::stop() {
  halt_workers();
  std::lock_guard<std::mutex> g(lock_);
  drop_prefetched();
}

void SourceEngine::restart_at(uint64_t seq) {
  halt_workers();
  {
    std::lock_guard<std::mutex> g(lock_);
    drop_prefetched();
    next_dispatch_ = next_consume_ = std::min(seq, total_);
  }
  {
    std::lock_guard<std::mutex> g(bad_lock_);  // counting starts over where playback does
    reported_.clear();
  }
  if (schedule_ || buckets_) start_workers();
}

void SourceEngine::set_flushing(bool flushing) {
  std::lock_guard<std::mutex> g(lock_);
  flushing_ = flushing;
  out_cv_.notify_all();
}

namespace {

// The shapes a configuration asks for, parsed from its properties.
bool bucket_spec(const SourceConfig &config, BucketSpec *spec, std::string *error) {
  if (!parse_size_buckets(config.buckets, &spec->sizes, error) ||
      !parse_frame_buckets(config.frame_buckets, &spec->frames, error))
    return false;
  spec->width = config.width;
  spec->height = config.height;
  spec->num_frames = config.num_frames;
  spec->frame_stride = config.frame_stride;
  spec->fps = config.fps;
  spec->pad_short = config.short_clips == ShortClips::Pad;
  return true;
}

}  // namespace

bool SourceEngine::shapes(const SourceConfig &config, std::vector<ClipShape> *out, std::string *error) {
  BucketSpec spec;
  if (!bucket_spec(config, &spec, error)) return false;
  out->clear();
  for (uint32_t b = 0; b < spec.count(); b++) {
    const FrameSize s = spec.size_of(b);
    out->push_back(ClipShape{s.width, s.height, spec.frames_of(b)});
  }
  return true;
}

bool SourceEngine::start_buckets(std::string *error) {
  if (!bucket_spec(cfg_, &spec_, error)) return false;
  std::atomic<bool> never{false};
  if (!assign_buckets(*manifest_, spec_, cfg_.probe_threads, &never, &assignment_, error))
    return false;
  if (cfg_.short_clips == ShortClips::Fail && assignment_.too_short > 0) {
    *error = std::to_string(assignment_.too_short) + " rows are shorter than every frame-buckets length (" +
             assignment_.examples + "); short-clips=fail";
    return false;
  }
  buckets_ = std::make_unique<BucketSchedule>(assignment_.row_bucket, spec_.count(), cfg_.rank, cfg_.world_size,
                                              cfg_.shuffle, cfg_.seed, std::max<uint32_t>(cfg_.step_samples, 1));
  if (buckets_->groups_per_epoch() == 0) {
    *error = "no row of manifest " + cfg_.manifest.location + " fits a bucket: " +
             std::to_string(assignment_.too_short) + " too short, " + std::to_string(assignment_.unreadable) +
             " of unknown size (" + assignment_.examples + ")";
    return false;
  }
  {
    std::lock_guard<std::mutex> g(epochs_lock_);
    epoch_starts_.assign(1, 0);
  }
  alone_ = cfg_.world_size > 1 && !cb_.agree_rows;
  // A resumed run knows what the run before found: the facts of epochs before the start move
  // their rows before the start is planned (each row then has the bucket it had there), the
  // rest move in their epochs; none is learned (or told) again.
  {
    std::lock_guard<std::mutex> g(bad_lock_);
    for (const RowFact &f : cfg_.resumed_facts) {
      if (f.index >= manifest_->size()) continue;
      if (f.frames >= 0) real_frames_.emplace(f.index, f.frames);
      if (f.width > 0) sizes_checked_.insert(f.index);
      facts_.push_back(f);
    }
  }
  auto apply_resumed = [&] {
    if (alone_ || cfg_.resumed_facts.empty()) return;
    std::lock_guard<std::mutex> g(lock_);
    apply_facts(cfg_.start_epoch, cfg_.resumed_facts);
  };
  apply_resumed();
  if (cfg_.resume_world > 0 && cfg_.resume_world != cfg_.world_size) {
    uint64_t repeated = 0;
    cfg_.start_clip = buckets_->resume_clip(cfg_.start_epoch, cfg_.resume_world, cfg_.resume_clips, &repeated);
    GST_INFO("resume from %d ranks on %d: epoch %u starts at clip %" G_GUINT64_FORMAT " (%" G_GUINT64_FORMAT
             " step groups trained again)", cfg_.resume_world, cfg_.world_size, cfg_.start_epoch, cfg_.start_clip,
             repeated);
  }
  // A position at or past an epoch's end continues in the next epoch; one further on is no
  // checkpoint of this manifest (a forged or foreign trainer.json), and would plan epoch after epoch.
  if (cfg_.start_clip / std::max<uint64_t>(1, buckets_->clips_in_epoch(cfg_.start_epoch)) > 1) {
    *error = "start position (epoch " + std::to_string(cfg_.start_epoch) + ", clip " + std::to_string(cfg_.start_clip) +
             ") is past the end of the epoch (" + std::to_string(buckets_->clips_in_epoch(cfg_.start_epoch)) +
             " clips on this rank): a checkpoint of another manifest?";
    return false;
  }
  for (uint64_t n; cfg_.start_clip >= (n = buckets_->clips_in_epoch(cfg_.start_epoch));) {
    cfg_.start_clip -= n;
    cfg_.start_epoch++;
    if (cfg_.num_epochs != 0 && cfg_.start_epoch >= cfg_.num_epochs) break;
    apply_resumed();
  }
  planned_through_ = cfg_.start_epoch;
  return true;
}

std::string SourceEngine::bucket_summary() const {
  if (!buckets_) return "";
  std::string s = std::to_string(buckets_->steps_per_epoch()) + " steps of " + std::to_string(cfg_.step_samples) +
                  " clips per epoch on each rank; rows per bucket:";
  for (uint32_t b = 0; b < spec_.count(); b++)
    s += " " + spec_.name(b) + "=" + std::to_string(buckets_->rows_in_bucket(b));
  return s;
}

std::string SourceEngine::bucket_warning() const {
  if (!buckets_) return "";
  std::string w;
  if (assignment_.too_short + assignment_.unreadable > 0)
    w = std::to_string(assignment_.too_short + assignment_.unreadable) + " manifest rows are left out of the buckets (" +
        std::to_string(assignment_.too_short) + " shorter than every frame-buckets length, " +
        std::to_string(assignment_.unreadable) + " whose size cannot be probed; " + assignment_.examples + ")";
  if (assignment_.probed > 0) {
    char secs[32];
    std::snprintf(secs, sizeof secs, "%.1f", assignment_.probe_seconds);
    w += std::string(w.empty() ? "" : ". ") + std::to_string(assignment_.probed) +
         " rows had no num_frames/height/width in the manifest and were probed at start (" + secs +
         " s): videotrain-probe writes them into the manifest once";
  }
  return w;
}

uint64_t SourceEngine::steps_per_epoch() const { return buckets_ ? buckets_->steps_per_epoch() : 0; }

uint64_t SourceEngine::clips_in_epoch(uint32_t epoch) const {
  if (buckets_) return buckets_->clips_in_epoch(epoch);
  return schedule_ ? schedule_->clips_per_epoch() : 0;
}

SourceEngine::Position SourceEngine::position(uint64_t seq) const {
  const uint64_t abs = cfg_.start_clip + seq;
  if (!buckets_) {
    const uint64_t cpe = schedule_->clips_per_epoch();
    return {uint32_t(cfg_.start_epoch + abs / cpe), abs % cpe};
  }
  // Epoch lengths vary: walk (and remember) epoch starts up to the one holding `abs`.
  std::lock_guard<std::mutex> g(epochs_lock_);
  while (abs >= epoch_starts_.back()) {
    const uint32_t last = cfg_.start_epoch + uint32_t(epoch_starts_.size() - 1);
    if (cfg_.num_epochs != 0 && last >= cfg_.num_epochs) break;  // past the end: no length to add
    if (last > planned_through_.load()) break;  // not planned yet: the position says only its epoch
    epoch_starts_.push_back(epoch_starts_.back() + buckets_->clips_in_epoch(last));
  }
  // The last start at or before `abs` (seq moves back only on a seek).
  auto it = std::upper_bound(epoch_starts_.begin(), epoch_starts_.end(), abs);
  const size_t e = size_t(it - epoch_starts_.begin()) - 1;
  return {cfg_.start_epoch + uint32_t(e), abs - epoch_starts_[e]};
}

bool SourceEngine::past_end(uint64_t seq) const {
  if (seq >= total_) return true;
  return buckets_ && cfg_.num_epochs != 0 && position(seq).epoch >= cfg_.num_epochs;
}

SourceEngine::Slot SourceEngine::slot(const Position &pos, uint64_t k) const {
  Slot s;
  if (buckets_) {
    const BucketSlot b = k == 0 ? buckets_->at(pos.epoch, pos.clip) : buckets_->replacement(pos.epoch, pos.clip, k);
    s.index = b.index;
    s.padding = b.padding;
    const FrameSize fs = spec_.size_of(b.bucket);
    s.shape = ClipShape{fs.width, fs.height, spec_.frames_of(b.bucket)};
    s.group = b.group;
    s.group_size = b.group_size;
    return s;
  }
  const ScheduleSlot p = k == 0 ? schedule_->at(pos.epoch, pos.clip) : schedule_->replacement(pos.epoch, pos.clip, k);
  s.index = p.index;
  s.padding = p.padding;
  s.shape = ClipShape{cfg_.width, cfg_.height, cfg_.num_frames};
  return s;
}

uint64_t SourceEngine::replacement_pool() const {
  return buckets_ ? buckets_->usable_rows() : schedule_->clips_per_epoch();
}

void SourceEngine::worker_loop() {
  std::unique_lock<std::mutex> lk(lock_);
  for (;;) {
    work_cv_.wait(lk, [&] {
      return quit_ || (fatal_.empty() && !planning_ && !past_end(next_dispatch_) &&
                       next_dispatch_ - next_consume_ < uint64_t(cfg_.prefetch));
    });
    if (quit_) return;
    if (buckets_) {
      const uint32_t epoch = position(next_dispatch_).epoch;
      if (epoch > planned_through_.load()) {  // the next clip opens an epoch: plan it first
        planning_ = true;
        if (plan_epoch(lk, epoch)) planned_through_ = epoch;
        planning_ = false;
        work_cv_.notify_all();
        continue;
      }
    }
    const uint64_t seq = next_dispatch_++;
    const uint64_t gen = generation_;
    std::shared_ptr<std::atomic<bool>> cancel = cancel_;
    in_flight_++;
    lk.unlock();
    Result r = produce(seq, cancel.get());
    lk.lock();
    if (--in_flight_ == 0) work_cv_.notify_all();  // a worker may be waiting to plan an epoch
    if (gen != generation_ || cancel->load()) continue;  // dropped by a seek or stop
    if (!r.fatal.empty() && fatal_.empty()) fatal_ = r.fatal;
    ready_.emplace(seq, std::move(r));
    out_cv_.notify_all();
  }
}

void SourceEngine::attach_metas(DecodedClip &clip, const ManifestRow &row, const Position &pos, const Slot &slot,
                                bool padding) {
  const guint n = guint(clip.frames.size());
  for (guint i = 0; i < n; i++) {
    // Padded frames repeat a buffer: make_writable gives each its own (shallow) copy.
    GstBuffer *b = gst_buffer_make_writable(clip.frames[i]);
    clip.frames[i] = b;
    GST_BUFFER_PTS(b) = GST_BUFFER_DTS(b) = GST_BUFFER_DURATION(b) = GST_CLOCK_TIME_NONE;
    GST_BUFFER_OFFSET(b) = GST_BUFFER_OFFSET_END(b) = GST_BUFFER_OFFSET_NONE;
    auto *m = gst_buffer_add_videotrain_clip_meta(b, row.caption.c_str(), row.path.c_str(), row.split.c_str());
    m->sample_id = row.row;
    m->epoch = pos.epoch;
    m->clip_index = pos.clip;
    m->frame_index = i;
    m->num_frames = n;
    m->source_frame = clip.source_frames[i];
    m->padding = padding;
    m->group = slot.group;
    m->group_size = slot.group_size;
  }
}

SourceEngine::Claim SourceEngine::claim(uint64_t index, const std::atomic<bool> *cancel, BadRow *known) {
  std::unique_lock<std::mutex> lk(bad_lock_);
  for (;;) {
    auto it = bad_.find(index);
    if (it != bad_.end()) {
      *known = it->second;
      return Claim::KnownBad;
    }
    if (cancel->load()) return Claim::Cancelled;
    if (trying_.insert(index).second) return Claim::Try;
    bad_cv_.wait_for(lk, std::chrono::milliseconds(50));  // another worker is trying this row
  }
}

void SourceEngine::release(uint64_t index, const std::string &bad_reason, uint32_t epoch) {
  {
    std::lock_guard<std::mutex> g(bad_lock_);
    trying_.erase(index);
    if (!bad_reason.empty()) bad_.emplace(index, BadRow{bad_reason, epoch});
  }
  bad_cv_.notify_all();
}

void SourceEngine::report_bad(const Position &pos, uint64_t index, const ManifestRow &row, const std::string &reason) {
  {
    std::lock_guard<std::mutex> g(bad_lock_);
    if (!reported_[pos.epoch].insert(index).second) return;  // once per row and epoch
  }
  stat_replaced_++;
  if (cb_.replaced) cb_.replaced(ReplacedEvent{pos.epoch, pos.clip, row.row, row.path, reason});
}

int64_t SourceEngine::known_frames(uint64_t index) {
  std::lock_guard<std::mutex> g(bad_lock_);
  auto it = real_frames_.find(index);
  return it == real_frames_.end() ? -1 : it->second;
}

bool SourceEngine::holds(int64_t frames, int clip_frames, float source_fps) const {
  return frames > 0 &&
         longest_frame_bucket({clip_frames}, uint64_t(frames), cfg_.frame_stride, cfg_.fps, source_fps) == 0;
}

uint32_t SourceEngine::bucket_for_length(uint32_t b, int64_t frames, float fps) const {
  if (b == BucketSchedule::kNoBucket || spec_.frames.empty() || holds(frames, spec_.frames_of(b), fps)) return b;
  const uint32_t nf = uint32_t(spec_.frames.size());
  const int fb = longest_frame_bucket(spec_.frames, uint64_t(frames), cfg_.frame_stride, cfg_.fps, fps);
  return fb >= 0 ? b / nf * nf + uint32_t(fb) : spec_.pad_short ? b / nf * nf + nf - 1 : BucketSchedule::kNoBucket;
}

uint32_t SourceEngine::bucket_for_size(uint32_t b, uint32_t width, uint32_t height) const {
  if (b == BucketSchedule::kNoBucket || spec_.sizes.size() < 2) return b;
  const uint32_t nf = uint32_t(std::max<size_t>(spec_.frames.size(), 1));
  const uint32_t s = uint32_t(nearest_size_bucket(spec_.sizes, width, height));
  return b / nf == s ? b : s * nf + b % nf;
}

namespace {

// "; <what> from epoch E" for a row that moves from bucket `from` to `to` (nothing when it stays).
std::string move_clause(const BucketSpec &spec, uint32_t from, uint32_t to, uint32_t epoch, bool alone,
                        const std::string &why) {
  if (from == to) return "";
  const std::string where = to == BucketSchedule::kNoBucket ? std::string("out of the buckets (too short for all)")
                                                            : "to bucket " + spec.name(to);
  if (alone)
    return "; " + why + spec.name(from) + ", but with several ranks and no ddptrainsink downstream to agree " +
           "through it stays there and is replaced (videotrain-probe the manifest to fix its columns)";
  return "; " + why + spec.name(from) + ", it moves " + where + " from epoch " + std::to_string(epoch);
}

}  // namespace

void SourceEngine::learn_length(uint64_t index, const ManifestRow &row, int64_t frames, uint32_t epoch) {
  if (const uint32_t said = manifest_->video_size(index).frames; said && int64_t(said) == frames) {
    // The manifest was right (a container that outlasts its video stream): no fact, no move, no warning.
    std::lock_guard<std::mutex> g(bad_lock_);
    real_frames_.emplace(index, frames);
    return;
  }
  RowFact f;
  f.index = index;
  f.epoch = epoch;
  f.frames = frames;
  {
    std::lock_guard<std::mutex> g(bad_lock_);
    if (!real_frames_.emplace(index, frames).second) return;
    facts_.push_back(f);
  }
  if (cb_.fact_learned) cb_.fact_learned(f);
  VideoSize v = manifest_->video_size(index);
  const uint32_t said = v.frames;
  v.frames = uint32_t(frames);
  manifest_->set_video_size(index, v);
  std::string w = (said ? "the manifest says " + std::to_string(said) + " frames but its" : std::string("its")) +
                  " video stream has " + std::to_string(frames) + ": clips are placed within those";
  if (buckets_) {
    std::lock_guard<std::mutex> g(lock_);
    const uint32_t b = buckets_->bucket_of(index, epoch);
    w += move_clause(spec_, b, bucket_for_length(b, frames, v.fps), epoch + 1, alone_, "too short for its bucket ");
  }
  if (cb_.row_warning) cb_.row_warning(row.row, row.path, w);
}

void SourceEngine::learn_size(uint64_t index, const ManifestRow &row, int width, int height, uint32_t epoch) {
  if (width <= 0 || height <= 0) return;
  {
    std::lock_guard<std::mutex> g(bad_lock_);
    if (!sizes_checked_.insert(index).second) return;
  }
  VideoSize v = manifest_->video_size(index);
  if (!v.known_shape()) return;
  const auto off = [](double said, double real) { return said > 2.0 * real || real > 2.0 * said; };
  if (!off(v.width, width) && !off(v.height, height)) return;
  RowFact f;
  f.index = index;
  f.epoch = epoch;
  f.width = uint32_t(width);
  f.height = uint32_t(height);
  {
    std::lock_guard<std::mutex> g(bad_lock_);
    facts_.push_back(f);
  }
  if (cb_.fact_learned) cb_.fact_learned(f);
  const uint32_t said_w = v.width, said_h = v.height;
  v.width = uint32_t(width);
  v.height = uint32_t(height);
  manifest_->set_video_size(index, v);
  std::string w = "the manifest says " + std::to_string(said_w) + "x" + std::to_string(said_h) + " but its video is " +
                  std::to_string(width) + "x" + std::to_string(height);
  if (buckets_) {
    std::lock_guard<std::mutex> g(lock_);
    const uint32_t b = buckets_->bucket_of(index, epoch);
    w += move_clause(spec_, b, bucket_for_size(b, uint32_t(width), uint32_t(height)), epoch + 1, alone_,
                     "its aspect does not belong in bucket ");
  }
  if (cb_.row_warning) cb_.row_warning(row.row, row.path, w);
}

bool SourceEngine::plan_epoch(std::unique_lock<std::mutex> &lk, uint32_t epoch) {
  // Every clip before this one produced: the facts of the epochs before are all known, so the
  // plan does not depend on decode timing or prefetch.
  work_cv_.wait(lk, [&] { return quit_ || in_flight_ == 0; });
  if (quit_) return false;
  std::vector<RowFact> all;
  {
    std::lock_guard<std::mutex> g(bad_lock_);
    all = facts_;
  }
  if (cfg_.world_size > 1 && alone_) return true;  // rows stay (said when each was found)
  if (cfg_.world_size > 1) {
    using A = SourceCallbacks::Agreement;
    const std::vector<RowFact> mine = std::move(all);
    all.clear();
    std::string why;
    lk.unlock();  // the others may take a while to get here; frames keep flowing meanwhile
    const A a = cb_.agree_rows ? cb_.agree_rows(epoch, mine, &all, &why) : A::kAlone;
    lk.lock();
    if (quit_ || a == A::kCancelled) return false;
    if (a == A::kFailed) {
      if (fatal_.empty())
        fatal_ = "the ranks could not agree on the rows that change buckets before epoch " + std::to_string(epoch) +
                 ": " + why;
      out_cv_.notify_all();
      return false;
    }
    if (a == A::kAlone) {  // asked at start, it answered; now nobody does (a changed pipeline)
      alone_ = true;
      if (!mine.empty() && cb_.warning)
        cb_.warning(std::to_string(mine.size()) + " rows whose manifest columns lie stay in their buckets: with " +
                    std::to_string(cfg_.world_size) + " ranks they move only through a ddptrainsink downstream");
      return true;
    }
  }
  apply_facts(epoch, all);
  return true;
}

void SourceEngine::apply_facts(uint32_t epoch, const std::vector<RowFact> &facts_in) {
  std::vector<RowFact> facts = facts_in;
  normalise_row_facts(&facts);  // the same order on every rank
  for (const RowFact &f : facts) {
    if (f.epoch >= epoch || f.index >= manifest_->size()) continue;
    if (f.frames >= 0 && applied_.insert({f.index, 0}).second) {
      {
        std::lock_guard<std::mutex> g(bad_lock_);
        real_frames_.emplace(f.index, f.frames);  // another rank's: decodes here place within
      }
      VideoSize v = manifest_->video_size(f.index);
      if (v.frames != uint32_t(f.frames)) {
        v.frames = uint32_t(f.frames);
        manifest_->set_video_size(f.index, v);
      }
      const uint32_t b = buckets_->bucket_of(f.index, epoch), to = bucket_for_length(b, f.frames, v.fps);
      if (to != b) buckets_->move_row(f.index, to, epoch);
    }
    if (f.width > 0 && applied_.insert({f.index, 1}).second) {
      {
        std::lock_guard<std::mutex> g(bad_lock_);
        sizes_checked_.insert(f.index);
      }
      VideoSize v = manifest_->video_size(f.index);
      if (v.width != f.width || v.height != f.height) {
        v.width = f.width;
        v.height = f.height;
        manifest_->set_video_size(f.index, v);
      }
      const uint32_t b = buckets_->bucket_of(f.index, epoch), to = bucket_for_size(b, f.width, f.height);
      if (to != b) buckets_->move_row(f.index, to, epoch);
    }
  }
}

uint64_t SourceEngine::random_key(uint32_t epoch, uint64_t row) const {
  const uint64_t fresh = hash_combine(hash_combine(cfg_.seed, epoch), row);
  if (cfg_.clip_windows <= 0) return fresh;
  // One of the row's K windows, the same K for every epoch.
  const uint64_t w = fresh % static_cast<uint64_t>(cfg_.clip_windows);
  return hash_combine(hash_combine(cfg_.seed ^ kGolden64, w), row);
}

std::string SourceEngine::source_key(const ManifestRow &row, uint64_t random_key, const ClipShape &shape) {
  struct stat st {};
  if (::stat(row.path.c_str(), &st) != 0 || !S_ISREG(st.st_mode)) return "";
  const std::string id = row.path + "|" + std::to_string(st.st_size) + "|" + std::to_string(st.st_mtim.tv_sec) + "." +
                         std::to_string(st.st_mtim.tv_nsec) + "|" + std::to_string(st.st_ino);
  std::string digest;
  {
    std::lock_guard<std::mutex> g(digest_lock_);
    auto it = digests_.find(id);
    if (it != digests_.end()) digest = it->second;
  }
  if (digest.empty()) {
    std::string why;
    if (!sha256_file(row.path, &digest, &why)) return "";
    std::lock_guard<std::mutex> g(digest_lock_);
    digests_[id] = digest;
  }
  // Everything that chooses and shapes the frames; the random window only when it is used.
  static const char *starts[] = {"random", "start", "center"};
  static const char *fits[] = {"crop", "pad", "stretch"};
  std::string k = "csvvideosrc " + std::string(kDecodeVersion) + "\ncontent " + digest + "\nframes " +
                  std::to_string(shape.frames) + " stride " + std::to_string(cfg_.frame_stride) + " fps " +
                  std::to_string(cfg_.fps) + " source-fps " + std::to_string(cfg_.fps > 0 ? row.fps : 0.0) +
                  " stream " + std::to_string(cfg_.video_stream) + " start " +
                  starts[static_cast<int>(cfg_.clip_start)];
  if (cfg_.clip_start == ClipStart::Random) k += " window " + std::to_string(random_key);
  k += "\nsize " + std::to_string(shape.width) + "x" + std::to_string(shape.height) + " " +
       fits[static_cast<int>(cfg_.resize)] + (cfg_.short_clips == ShortClips::Pad ? " pad-short" : "");
  return k;
}

// The clip's own row, else the first row in the schedule's walk that is good: rows known to
// be bad are passed over without decoding, which gives the choice decoding them would, so
// the order stays independent of timing, prefetch and what an earlier run found.
SourceEngine::Result SourceEngine::produce(uint64_t seq, const std::atomic<bool> *cancel) {
  Result r;
  const Position pos = position(seq);
  const Slot slot0 = slot(pos, 0);
  const uint64_t attempts =
      std::min<uint64_t>(uint64_t(cfg_.max_replacements) + 1, std::max<uint64_t>(replacement_pool(), 1));
  std::string last_reason;
  for (uint64_t k = 0; k < attempts; k++) {
    if (cancel->load()) return r;
    const Slot cand = k == 0 ? slot0 : slot(pos, k);
    std::string reason;
    BadRow known;
    const Claim c = claim(cand.index, cancel, &known);
    if (c == Claim::Cancelled) return r;
    ManifestRow row = manifest_->row(cand.index);
    if (!row.warning.empty() && cb_.row_warning) {
      bool first;
      {
        std::lock_guard<std::mutex> g(warned_lock_);
        first = warned_rows_.insert(row.row).second;
      }
      if (first) cb_.row_warning(row.row, row.path, row.warning);
    }
    if (c == Claim::KnownBad) {
      reason = known.reason;
      if (known.epoch < pos.epoch) reason += " (bad since epoch " + std::to_string(known.epoch) + ": not tried again)";
    } else if (!row.error.empty()) {
      reason = row.error;
      release(cand.index, reason, pos.epoch);
    } else if (const int64_t known = known_frames(cand.index);
               known >= 0 && cfg_.short_clips != ShortClips::Pad &&
               !holds(known, cand.shape.frames, manifest_->video_size(cand.index).fps)) {
      // Not bad: it may fit another clip length (a bucket it moved to, a stand-in elsewhere).
      reason = "too few frames: the video has " + std::to_string(known) + ", a " +
               std::to_string(cand.shape.frames) + "-frame clip needs more";
      release(cand.index, "", pos.epoch);
    } else {
      ClipRequest req;
      req.path = row.path;
      req.num_frames = cand.shape.frames;
      req.stride = cfg_.frame_stride;
      req.fps = cfg_.fps;
      req.video_stream = cfg_.video_stream;
      req.source_fps = row.fps;
      req.start = cfg_.clip_start;
      req.random_key = random_key(pos.epoch, row.row);
      req.width = cand.shape.width;
      req.height = cand.shape.height;
      req.resize = cfg_.resize;
      req.pad_short = cfg_.short_clips == ShortClips::Pad;
      req.decode_threads = cfg_.decode_threads;
      req.timeout_s = cfg_.decode_timeout_s;
      req.known_frames = known_frames(cand.index);
      req.manifest_frames = manifest_->video_size(cand.index).frames;
      if (cb_.cached) {
        ClipIdentity id;
        id.source_key = source_key(row, req.random_key, cand.shape);
        id.sample_id = row.row;
        id.epoch = pos.epoch;
        id.clip_index = pos.clip;
        id.num_frames = static_cast<unsigned>(cand.shape.frames);
        id.width = cand.shape.width;
        id.height = cand.shape.height;
        id.padding = slot0.padding || k > 0;
        id.group = cand.group;
        id.group_size = cand.group_size;
        id.caption = row.caption;
        id.path = row.path;
        id.split = row.split;
        if (!id.source_key.empty() && cb_.cached(id)) {
          release(cand.index, "", pos.epoch);
          r.cached = true;
          r.identity = std::move(id);
          return r;
        }
      }
      DecodeStatus st = decode_clip(req, cancel, &r.clip, &reason);
      stat_decoded_ += r.clip.frames_decoded;
      if (st == DecodeStatus::Cancelled) {
        release(cand.index, "", pos.epoch);
        return r;
      }
      if (r.clip.real_frames >= 0) {
        learn_length(cand.index, row, r.clip.real_frames, pos.epoch);
      } else if (st == DecodeStatus::Short && r.clip.total_frames >= 0) {
        if (r.clip.total_frames + 2 < int64_t(manifest_->video_size(cand.index).frames)) {
          // The container is shorter than the manifest says (a hand-edited or stale num_frames).
          learn_length(cand.index, row, r.clip.total_frames, pos.epoch);
        } else {
          // Not a lie (a stand-in asked for more than its bucket's length): later clips of this
          // length skip the decode, with the same outcome.
          std::lock_guard<std::mutex> g(bad_lock_);
          real_frames_.emplace(cand.index, r.clip.total_frames);
        }
      }
      if (st == DecodeStatus::Ok) learn_size(cand.index, row, r.clip.source_width, r.clip.source_height, pos.epoch);
      // Too short for this clip length is not bad for every length (a stand-in for a longer
      // bucket, a row that moves): never banned, so that what a run chooses does not depend on
      // which stand-ins an earlier epoch tried (a resumed run has not tried them).
      const bool bad = st != DecodeStatus::Ok && st != DecodeStatus::Short;
      release(cand.index, bad ? reason : "", pos.epoch);
      if (st == DecodeStatus::Ok) {
        // A replacement repeats a sample of the shard to keep the ranks even, like padding:
        // validation counts it out, so its mean stays over each sample once.
        attach_metas(r.clip, row, pos, cand, slot0.padding || k > 0);
        r.shape = cand.shape;
        return r;
      }
      if (st == DecodeStatus::Short && cfg_.short_clips == ShortClips::Fail) {
        r.fatal = "row " + std::to_string(row.row) + " (" + row.path + "): " + reason + "; short-clips=fail";
        return r;
      }
    }
    if (cfg_.on_error == OnError::Fail) {
      r.fatal = "row " + std::to_string(row.row) + " (" + row.path + "): " + reason + "; on-error=fail";
      return r;
    }
    last_reason = reason;
    report_bad(pos, cand.index, row, reason);
  }
  r.fatal = "no usable video for clip " + std::to_string(pos.clip) + " of epoch " + std::to_string(pos.epoch) +
            " on rank " + std::to_string(cfg_.rank) + ": " + std::to_string(attempts) +
            " samples of the shard failed (last: " + last_reason + ")";
  return r;
}

void SourceEngine::clip_done(std::unique_lock<std::mutex> &lk, bool cached) {
  const Position pos = position(next_consume_);
  have_current_ = false;
  current_ = Result();
  next_consume_++;
  stat_clips_++;
  epoch_clips_++;
  epoch_cached_ += cached ? 1 : 0;
  work_cv_.notify_all();
  const uint64_t epoch_clips = clips_in_epoch(pos.epoch);
  if (pos.clip + 1 != epoch_clips) return;
  const uint64_t clips = epoch_clips_, in_cache = epoch_cached_;
  epoch_clips_ = epoch_cached_ = 0;
  if (!cb_.epoch_done) return;
  uint64_t replaced;
  {
    std::lock_guard<std::mutex> g(bad_lock_);
    auto it = reported_.find(pos.epoch);
    replaced = it == reported_.end() ? 0 : it->second.size();
    reported_.erase(reported_.begin(), reported_.upper_bound(pos.epoch));
  }
  lk.unlock();
  cb_.epoch_done(pos.epoch, epoch_clips, replaced, clips - in_cache, in_cache);
}

SourceEngine::Pull SourceEngine::next(GstBuffer **frame, std::string *error) { return next(frame, nullptr, error); }

SourceEngine::Pull SourceEngine::next(GstBuffer **frame, ClipIdentity *cached, std::string *error) {
  std::unique_lock<std::mutex> lk(lock_);
  for (;;) {
    if (flushing_) return Pull::Flushing;
    if (have_current_) {
      if (current_.cached) {
        if (!cached) {
          *error = "internal: a cached clip where frames were expected";
          return Pull::Error;
        }
        *cached = current_.identity;
        clip_done(lk, true);
        return Pull::Cached;
      }
      auto &frames = current_.clip.frames;
      *frame = frames[current_pos_];  // ownership moves to the caller
      frame_shape_ = current_.shape;
      frames[current_pos_++] = nullptr;
      stat_frames_++;
      if (current_pos_ == frames.size()) clip_done(lk, false);
      return Pull::Frame;
    }
    if (past_end(next_consume_)) return Pull::Eos;
    auto it = ready_.find(next_consume_);
    if (it != ready_.end()) {
      if (!it->second.fatal.empty()) {
        *error = it->second.fatal;
        return Pull::Error;
      }
      current_ = std::move(it->second);
      ready_.erase(it);
      current_pos_ = 0;
      have_current_ = current_.cached || !current_.clip.frames.empty();
      if (!have_current_) {
        *error = "internal: empty clip at position " + std::to_string(next_consume_);
        return Pull::Error;
      }
      continue;
    }
    out_cv_.wait(lk);
  }
}

uint64_t SourceEngine::clips_per_epoch() const {
  return buckets_ || schedule_ ? clips_in_epoch(cfg_.start_epoch) : 0;
}

uint64_t SourceEngine::total_clips() const { return total_; }

std::string SourceEngine::manifest_description() const { return manifest_ ? manifest_->description() : ""; }
std::vector<std::string> SourceEngine::manifest_warnings() const {
  return manifest_ ? manifest_->warnings() : std::vector<std::string>();
}

SourceStats SourceEngine::stats() const {
  return SourceStats{stat_clips_.load(), stat_frames_.load(), stat_replaced_.load(), stat_decoded_.load()};
}

size_t SourceEngine::clips_held() const {
  std::lock_guard<std::mutex> g(lock_);
  return size_t(next_dispatch_ - next_consume_);
}

}  // namespace videotrain
