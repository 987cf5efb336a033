/* The project's own bucketed gradient reducer (not c10d::Reducer / DDP).
 *
 * Parameters are grouped into flat buckets: the first holds up to 1 MB so that
 * communication starts early, the others up to bucket-cap-mb. A hook on every parameter
 * copies its accumulated gradient into its bucket during backward of a sync micro-batch;
 * a full bucket is all-reduced asynchronously as soon as every bucket before it has
 * been launched, so the launch order is the same on every rank. finish() launches what
 * is left (parameters that got no gradient contribute their current gradient or zeros),
 * waits for all, averages and writes the gradients back.
 *
 * Registration order says little about when backward produces a gradient (a caption
 * embedding registered last is used first in forward, so its gradient comes last), so
 * the first layout (reverse registration order) is only a guess: after the first sync
 * step the buckets are rebuilt in the order rank 0 saw the gradients arrive, broadcast
 * so that every rank builds the same buckets. Torch TUs only. */
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
  // After backward of a sync micro-batch: all-reduces what is left, waits, averages
  // (and after the first one, rebuilds the buckets). Throws DistError on a failed collective.
  void finish();

  // Bucket index (launch order) -> parameter indices, and each bucket's size in bytes.
  std::vector<std::vector<size_t>> bucket_layout() const;
  std::vector<size_t> bucket_bytes() const;
  bool rebuilt() const;  // buckets follow the gradients' arrival order
  // During the last sync step: the bucket indices in launch order, and how many
  // parameters' gradients were still to come at each launch (0 everywhere: no overlap).
  std::vector<size_t> last_launch_order() const;
  std::vector<size_t> last_pending_at_launch() const;

  struct Impl;

 private:
  std::shared_ptr<Impl> impl_;
};

}  // namespace videotrain
