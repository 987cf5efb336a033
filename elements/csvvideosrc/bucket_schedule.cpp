#include "bucket_schedule.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>

namespace videotrain {

namespace {

std::vector<std::string> split_list(const std::string &text) {
  std::vector<std::string> out;
  std::string cur;
  for (char c : text + ",") {
    if (c == ',') {
      size_t a = cur.find_first_not_of(" \t"), b = cur.find_last_not_of(" \t");
      out.push_back(a == std::string::npos ? "" : cur.substr(a, b - a + 1));
      cur.clear();
    } else {
      cur += c;
    }
  }
  return out;
}

bool parse_int(const std::string &s, long lo, long hi, long *out) {
  if (s.empty() || s.size() > 9 || s.find_first_not_of("0123456789") != std::string::npos) return false;
  *out = std::strtol(s.c_str(), nullptr, 10);
  return *out >= lo && *out <= hi;
}

}  // namespace

bool parse_size_buckets(const std::string &text, std::vector<FrameSize> *out, std::string *why) {
  out->clear();
  if (text.find_first_not_of(" \t") == std::string::npos) return true;
  for (const std::string &e : split_list(text)) {
    const size_t x = e.find_first_of("xX");
    long w = 0, h = 0;
    if (x == std::string::npos || !parse_int(e.substr(0, x), 2, 16384, &w) || !parse_int(e.substr(x + 1), 2, 16384, &h)) {
      *why = "buckets entry '" + e + "' is not WIDTHxHEIGHT with sides of 2 to 16384 (example: 720x480,480x720,640x640)";
      return false;
    }
    for (const FrameSize &s : *out)
      if (s.width == w && s.height == h) {
        *why = "buckets lists " + e + " twice";
        return false;
      }
    out->push_back({int(w), int(h)});
  }
  return true;
}

bool parse_frame_buckets(const std::string &text, std::vector<int> *out, std::string *why) {
  out->clear();
  if (text.find_first_not_of(" \t") == std::string::npos) return true;
  for (const std::string &e : split_list(text)) {
    long n = 0;
    if (!parse_int(e, 1, 100000, &n)) {
      *why = "frame-buckets entry '" + e + "' is not a frame count of 1 to 100000 (example: 49,33,17)";
      return false;
    }
    if (std::find(out->begin(), out->end(), int(n)) != out->end()) {
      *why = "frame-buckets lists " + e + " twice";
      return false;
    }
    out->push_back(int(n));
  }
  std::sort(out->rbegin(), out->rend());
  return true;
}

int nearest_size_bucket(const std::vector<FrameSize> &buckets, uint32_t width, uint32_t height) {
  if (buckets.empty() || width == 0 || height == 0) return -1;
  const double ar = std::log(double(width) / double(height));
  int best = -1;
  double best_d = 0, best_area = 0;
  for (size_t i = 0; i < buckets.size(); i++) {
    const double d = std::fabs(std::log(double(buckets[i].width) / buckets[i].height) - ar);
    const double area = double(buckets[i].width) * buckets[i].height;
    // Equal distances computed from different ratios can differ in the last bits.
    const bool tie = best >= 0 && std::fabs(d - best_d) <= 1e-12;
    if (best < 0 || (!tie && d < best_d) || (tie && area > best_area)) {
      best = int(i);
      best_d = d;
      best_area = area;
    }
  }
  return best;
}

int longest_frame_bucket(const std::vector<int> &counts, uint64_t video_frames, int stride, double fps,
                         double source_fps) {
  if (video_frames == 0) return -1;
  for (size_t i = 0; i < counts.size(); i++) {
    const double span = double(counts[i] - 1);  // frame steps the clip covers
    bool fits;
    if (fps > 0) {
      const double rate = source_fps > 0 ? source_fps : fps;
      fits = span * rate / fps <= double(video_frames - 1) + 1e-9;
    } else {
      fits = span * std::max(stride, 1) <= double(video_frames - 1);
    }
    if (fits) return int(i);
  }
  return -1;
}

namespace {

void count_groups(std::vector<uint64_t> *population, uint64_t *groups, const std::vector<uint32_t> &row_bucket,
                  uint32_t group_size) {
  std::fill(population->begin(), population->end(), 0);
  for (uint32_t b : row_bucket)
    if (b < population->size()) (*population)[b]++;
  *groups = 0;
  for (uint64_t n : *population) *groups += (n + group_size - 1) / group_size;
}

}  // namespace

BucketSchedule::BucketSchedule(std::vector<uint32_t> row_bucket, uint32_t buckets, int rank, int world_size,
                               bool shuffle, uint64_t seed, uint32_t group_size)
    : rank_(rank),
      world_(world_size < 1 ? 1 : world_size),
      group_size_(group_size < 1 ? 1 : group_size),
      buckets_(buckets),
      order_(row_bucket.size(), 0, 1, shuffle, seed) {
  auto l = std::make_shared<Layout>();
  l->row_bucket = std::move(row_bucket);
  l->population.assign(buckets, 0);
  count_groups(&l->population, &l->groups, l->row_bucket, group_size_);
  layouts_.emplace_back(0, std::move(l));
}

uint64_t BucketSchedule::usable_rows() const {
  uint64_t n = 0;
  for (uint64_t p : layouts_.front().second->population) n += p;
  return n;
}

uint64_t BucketSchedule::steps_per_epoch() const { return steps_of(groups_per_epoch()); }

std::shared_ptr<const BucketSchedule::Layout> BucketSchedule::layout(uint32_t epoch) const {
  auto it = std::upper_bound(layouts_.begin(), layouts_.end(), epoch,
                             [](uint32_t e, const auto &l) { return e < l.first; });
  return std::prev(it)->second;
}

uint32_t BucketSchedule::bucket_of(uint64_t index, uint32_t epoch) const {
  std::lock_guard<std::mutex> g(lock_);
  const auto l = layout(epoch);
  return index < l->row_bucket.size() ? l->row_bucket[index] : kNoBucket;
}

void BucketSchedule::move_row(uint64_t index, uint32_t bucket, uint32_t from_epoch) {
  std::lock_guard<std::mutex> g(lock_);
  auto l = std::make_shared<Layout>(*layouts_.back().second);
  if (index >= l->row_bucket.size()) return;
  l->row_bucket[index] = bucket < buckets_ ? bucket : kNoBucket;
  count_groups(&l->population, &l->groups, l->row_bucket, group_size_);
  from_epoch = std::max(from_epoch, layouts_.back().first);
  if (layouts_.back().first == from_epoch && layouts_.size() > 1) layouts_.pop_back();
  layouts_.emplace_back(from_epoch, std::move(l));
  plans_.erase(plans_.lower_bound(from_epoch), plans_.end());
}

std::shared_ptr<const BucketSchedule::Plan> BucketSchedule::plan(uint32_t epoch) const {
  auto p = std::make_shared<Plan>();
  {
    std::lock_guard<std::mutex> g(lock_);
    auto it = plans_.find(epoch);
    if (it != plans_.end()) return it->second;
    p->layout = layout(epoch);
  }
  const std::vector<uint32_t> &row_bucket = p->layout->row_bucket;
  const uint64_t groups = p->layout->groups;
  const size_t nb = p->layout->population.size();
  std::vector<std::vector<uint32_t>> open(nb);
  std::vector<uint64_t> first_pos(nb, 0);
  auto close = [&](uint32_t b) {
    p->groups.push_back(Group{p->rows.size(), uint32_t(open[b].size()), b, 0});
    p->rows.insert(p->rows.end(), open[b].begin(), open[b].end());
    open[b].clear();
  };
  p->rows.reserve(row_bucket.size());
  for (uint64_t pos = 0; pos < row_bucket.size(); pos++) {
    const uint32_t row = uint32_t(order_.permuted(epoch, pos));
    const uint32_t b = row_bucket[row];
    if (b >= nb) continue;
    if (open[b].empty()) first_pos[b] = pos;
    open[b].push_back(row);
    if (open[b].size() == group_size_) close(b);
  }
  std::vector<uint32_t> partial;
  for (uint32_t b = 0; b < nb; b++)
    if (!open[b].empty()) partial.push_back(b);
  std::sort(partial.begin(), partial.end(), [&](uint32_t a, uint32_t b) { return first_pos[a] < first_pos[b]; });
  for (uint32_t b : partial) close(b);
  // Each group's successor in its bucket, for replacements.
  std::vector<int64_t> last(nb, -1), first(nb, -1);
  for (size_t g = 0; g < p->groups.size(); g++) {
    const uint32_t b = p->groups[g].bucket;
    if (last[b] >= 0) p->groups[size_t(last[b])].next_same = uint32_t(g);
    if (first[b] < 0) first[b] = int64_t(g);
    last[b] = int64_t(g);
  }
  for (uint32_t b = 0; b < nb; b++)
    if (last[b] >= 0) p->groups[size_t(last[b])].next_same = uint32_t(first[b]);
  uint64_t clips = 0;
  for (uint64_t j = 0; groups > 0 && j < steps_of(groups); j++) {
    p->rank_starts.push_back(clips);
    bool wrapped;
    clips += p->groups[rank_group(j, groups, &wrapped)].size;
  }
  p->rank_starts.push_back(clips);
  std::lock_guard<std::mutex> g(lock_);
  // Prefetch may straddle an epoch end, and a lookup may trail it: keep three.
  while (plans_.size() >= 3) plans_.erase(plans_.begin());
  return plans_.emplace(epoch, std::move(p)).first->second;
}

uint64_t BucketSchedule::rank_group(uint64_t j, uint64_t groups, bool *wrapped) const {
  const uint64_t g = uint64_t(rank_) + j * uint64_t(world_);
  *wrapped = g >= groups;
  return groups == 0 ? 0 : g % groups;
}

uint64_t BucketSchedule::clips_in_epoch(uint32_t epoch) const { return plan(epoch)->rank_starts.back(); }

uint64_t BucketSchedule::resume_clip(uint32_t epoch, int world_then, const std::vector<uint64_t> &clips_then,
                                     uint64_t *repeated) const {
  auto p = plan(epoch);
  const uint64_t groups = p->layout->groups;
  *repeated = 0;
  if (groups == 0 || world_then < 1) return 0;
  // Old rank r's j-th group is list group r + j * W; it finished those whose clips it passed.
  uint64_t prefix = groups;
  for (int r = 0; r < world_then && r < int(clips_then.size()); r++) {
    uint64_t clips = 0, j = 0;
    for (; uint64_t(r) + j * uint64_t(world_then) < groups; j++) {
      clips += p->groups[uint64_t(r) + j * uint64_t(world_then)].size;
      if (clips > clips_then[size_t(r)]) break;
    }
    prefix = std::min(prefix, uint64_t(r) + j * uint64_t(world_then));
  }
  if (int(clips_then.size()) < world_then) prefix = 0;
  if (prefix >= groups) return clips_in_epoch(epoch);
  const uint64_t steps = prefix / uint64_t(world_);
  *repeated = prefix - steps * uint64_t(world_);
  return p->rank_starts[size_t(std::min<uint64_t>(steps, p->rank_starts.size() - 1))];
}

uint64_t BucketSchedule::locate(const Plan &p, uint64_t clip, uint32_t *offset, bool *wrapped) const {
  // The last group start at or before `clip`.
  auto it = std::upper_bound(p.rank_starts.begin(), p.rank_starts.end() - 1, clip);
  const uint64_t j = uint64_t(it - p.rank_starts.begin()) - 1;
  *offset = uint32_t(clip - p.rank_starts[j]);
  return rank_group(j, p.layout->groups, wrapped);
}

BucketSlot BucketSchedule::slot_of(const Plan &p, uint64_t g, uint32_t k, bool padding) const {
  const Group &gr = p.groups[g];
  BucketSlot s;
  s.index = p.rows[gr.first + k];
  s.padding = padding;
  s.bucket = gr.bucket;
  s.group = g;
  s.group_size = gr.size;
  return s;
}

BucketSlot BucketSchedule::at(uint32_t epoch, uint64_t clip) const {
  auto p = plan(epoch);
  if (p->layout->groups == 0) return BucketSlot();
  uint32_t k;
  bool wrapped;
  const uint64_t g = locate(*p, clip % p->rank_starts.back(), &k, &wrapped);
  return slot_of(*p, g, k, wrapped);
}

BucketSlot BucketSchedule::replacement(uint32_t epoch, uint64_t clip, uint64_t k) const {
  auto p = plan(epoch);
  if (p->layout->groups == 0) return BucketSlot();
  uint32_t off;
  bool wrapped;
  const uint64_t g0 = locate(*p, clip % p->rank_starts.back(), &off, &wrapped);
  const Group &failed = p->groups[g0];
  const uint64_t pop = p->layout->population[failed.bucket];
  if (k >= pop) {
    // The bucket has no other row left to try: any usable row, decoded at this bucket's shape.
    const uint64_t n = p->rows.size();
    BucketSlot s;
    s.index = p->rows[(failed.first + off + (k - pop + 1)) % n];
    s.padding = true;
    s.bucket = failed.bucket;
    s.group = g0;
    s.group_size = failed.size;
    return s;
  }
  // Walk the bucket's rows forward from the failed one, group by group.
  uint64_t g = g0;
  uint64_t at = uint64_t(off) + k;
  while (at >= p->groups[g].size) {
    at -= p->groups[g].size;
    g = p->groups[g].next_same;
  }
  BucketSlot s = slot_of(*p, g, uint32_t(at), true);
  s.bucket = failed.bucket;
  // The stand-in takes the failed clip's place in its group.
  s.group = g0;
  s.group_size = p->groups[g0].size;
  return s;
}

}  // namespace videotrain
