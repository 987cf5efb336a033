/* The project's own bucketed gradient reducer (not c10d::Reducer / DDP).
 *
 * Parameters are grouped into flat buckets in reverse registration order (backward
 * produces the last layers' gradients first): the first bucket holds up to 1 MB so
 * that communication starts early, the others up to bucket-cap-mb. A hook on every
 * parameter copies its accumulated gradient into its bucket during backward of a sync
 * micro-batch; a full bucket is all-reduced asynchronously as soon as every bucket
 * before it has been launched, so the launch order is the same on every rank.
 * finish() launches what is left (parameters that got no gradient contribute their
 * current gradient or zeros), waits for all, averages and writes the gradients back.
 * Torch TUs only. */
#pragma once

#include <ATen/core/Tensor.h>

#include <memory>
#include <string>
#include <vector>

namespace videotrain {

class DistGroup;

class BucketReducer {
 public:
  BucketReducer(std::vector<at::Tensor> params, DistGroup *group, double bucket_cap_mb,
                double first_bucket_mb = 1.0);
  ~BucketReducer();

  // Call before backward: sync=true arms the hooks for this backward pass.
  void prepare(bool sync, uint64_t step);
  // After backward of a sync micro-batch: all-reduces what is left, waits, averages.
  // Throws DistError on a failed collective.
  void finish();

  size_t num_buckets() const;
  // Bucket index -> parameter indices (tests).
  std::vector<std::vector<size_t>> bucket_layout() const;
  // Bucket indices in the order they were launched during the last sync step.
  std::vector<size_t> last_launch_order() const;

  struct Impl;

 private:
  std::shared_ptr<Impl> impl_;
};

}  // namespace videotrain
