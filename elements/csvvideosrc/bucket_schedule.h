/* Which clip of which shape each rank decodes when the dataset mixes sizes and lengths.
 *
 * A shape bucket is a frame size (from `buckets`) and a clip length (from `frame-buckets`).
 * Epoch e walks the same permutation of all rows as the plain Schedule (seed, e); each row joins
 * the open group of its bucket, and a group that reaches `group_size` (the microbatcher's
 * batch-size: one optimizer step) is closed and appended to the epoch's group list. At the end
 * the partial groups follow, one at most per bucket, in the order their first row came. Rank r
 * takes groups r, r+W, r+2W, ...; the list does not depend on W, so the order of samples and
 * steps is the same on any number of ranks, and every rank gets ceil(groups / W) steps (groups
 * past the end wrap to the start of the list and are flagged as padding). The bucket
 * populations fix the number of groups, so it is the same every epoch (until a row found shorter
 * than the manifest said moves: move_row); only which rank holds the partial groups changes, so
 * clips per epoch differ by rank and epoch while steps do not.
 * Resuming needs no more state than (epoch, clip): the list is a function of the epoch. */
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "schedule.h"

namespace videotrain {

struct FrameSize {
  int width = 0, height = 0;
};

// "WxH,WxH,...": sizes (each side 2..16384); false with a reason naming the entry.
bool parse_size_buckets(const std::string &text, std::vector<FrameSize> *out, std::string *why);
// "49,33,17": distinct counts >= 1, returned longest first; false with a reason.
bool parse_frame_buckets(const std::string &text, std::vector<int> *out, std::string *why);
// The bucket whose aspect ratio is nearest the video's, by distance in log aspect ratio; a tie
// goes to the larger area, then to the first listed.
int nearest_size_bucket(const std::vector<FrameSize> &buckets, uint32_t width, uint32_t height);
// Index of the longest count in `counts` (longest first) that a video of `video_frames` frames
// supplies: every `stride`-th frame, or with fps > 0 frames at that rate of a `source_fps`
// video (0: taken as fps); -1 when even the shortest is too long.
int longest_frame_bucket(const std::vector<int> &counts, uint64_t video_frames, int stride, double fps,
                         double source_fps);

struct BucketSlot {
  uint64_t index = 0;       // manifest index
  bool padding = false;     // a repeat: a wrapped group, or a replacement
  uint32_t bucket = 0;      // shape bucket
  uint64_t group = 0;       // the clip's group (one optimizer step) in the epoch's list
  uint32_t group_size = 0;  // clips in that group
};

class BucketSchedule {
 public:
  static constexpr uint32_t kNoBucket = UINT32_MAX;
  // row_bucket: the bucket of each manifest index, kNoBucket for a row left out.
  BucketSchedule(std::vector<uint32_t> row_bucket, uint32_t buckets, int rank, int world_size, bool shuffle,
                 uint64_t seed, uint32_t group_size);

  // Of the buckets as made (a moved row changes them from the epoch it moves on).
  uint64_t groups_per_epoch() const { return layouts_.front().second->groups; }  // all ranks
  uint64_t steps_per_epoch() const;                      // this rank: ceil(groups / W)
  uint64_t rows_in_bucket(uint32_t bucket) const { return layouts_.front().second->population[bucket]; }
  uint64_t clips_in_epoch(uint32_t epoch) const;         // this rank
  BucketSlot at(uint32_t epoch, uint64_t clip) const;
  uint64_t usable_rows() const;  // rows in some bucket
  // The k-th (k >= 1) stand-in for a clip that failed, taking its place (bucket, group) in the
  // step so that the step keeps its shape: the rows of the same bucket that follow it in the
  // epoch's list, then, when the bucket has no other row, any row (fitted to the bucket's shape).
  // Flagged as padding.
  BucketSlot replacement(uint32_t epoch, uint64_t clip, uint64_t k) const;
  // Puts manifest index `index` in `bucket` (kNoBucket: leaves it out) from epoch `from_epoch` on:
  // a row found shorter than the manifest said. Epochs before keep their plans; `from_epoch`
  // must not be before an epoch already moved from, nor one whose clips are in use.
  void move_row(uint64_t index, uint32_t bucket, uint32_t from_epoch);
  uint32_t bucket_of(uint64_t index, uint32_t epoch) const;
  // Resuming on another number of ranks: the clip of `epoch` at which this rank starts when the
  // run before had `world_then` ranks, rank r at clip clips_then[r] of the epoch. The list of groups
  // does not depend on the world size, so the groups every old rank had finished (the longest
  // whole prefix of the list) are done; this rank skips its share of them, floor(prefix / W) steps,
  // so that every rank runs the same number (the < W groups past that are trained again). Sets
  // *repeated to those groups' count; returns clips_in_epoch(epoch) when the prefix is the list.
  uint64_t resume_clip(uint32_t epoch, int world_then, const std::vector<uint64_t> &clips_then,
                       uint64_t *repeated) const;

 private:
  struct Layout {
    std::vector<uint32_t> row_bucket;  // per manifest index
    std::vector<uint64_t> population;  // rows per bucket
    uint64_t groups = 0;
  };
  struct Group {
    uint64_t first;  // into Plan::rows
    uint32_t size, bucket;
    uint32_t next_same;  // the bucket's next group in the list (cyclic)
  };
  struct Plan {
    std::shared_ptr<const Layout> layout;
    std::vector<uint32_t> rows;          // grouped, groups in list order
    std::vector<Group> groups;
    std::vector<uint64_t> rank_starts;   // clip number at which each of this rank's groups starts
  };
  std::shared_ptr<const Plan> plan(uint32_t epoch) const;
  std::shared_ptr<const Layout> layout(uint32_t epoch) const;  // lock_ held
  uint64_t steps_of(uint64_t groups) const { return (groups + world_ - 1) / world_; }
  // This rank's j-th group of `groups`, and its (list) index.
  uint64_t rank_group(uint64_t j, uint64_t groups, bool *wrapped) const;
  BucketSlot slot_of(const Plan &p, uint64_t g, uint32_t k, bool padding) const;
  uint64_t locate(const Plan &p, uint64_t clip, uint32_t *offset, bool *wrapped) const;

  int rank_, world_;
  uint32_t group_size_;
  uint32_t buckets_;
  // (first epoch, layout), by epoch: the buckets as made, then after each move.
  std::vector<std::pair<uint32_t, std::shared_ptr<const Layout>>> layouts_;
  Schedule order_;  // the permutation of all rows per epoch (one rank of one)
  mutable std::mutex lock_;
  mutable std::map<uint32_t, std::shared_ptr<const Plan>> plans_;  // the (at most three) epochs in use
};

}  // namespace videotrain
