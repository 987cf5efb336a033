/* Sharded data parallel over the run's c10d group (ddptrainsink sharding=optimizer|full).
 *
 * The trainable parameters fall into units: one per transformer block, and one for the rest (the
 * root: embeddings, head). A unit's parameters are one flat vector, padded to a multiple of the
 * world size; rank r owns the r-th equal slice of it (its shard). The optimizer steps the shards
 * only, so every rank holds 1/world of the optimizer state (ZeRO-2).
 *
 * optimizer: every rank keeps the whole weights, as views of each unit's flat vector; after backward
 *   each unit's gradients are summed over the ranks and this rank keeps its shard of them (the full
 *   gradients are freed unit by unit: at the end of each block's backward when the model
 *   checkpoints its blocks, else after the whole backward); after the update the shards are
 *   all-gathered back into the flat vectors.
 * full: block units keep only their shard between uses (ZeRO-3 / FSDP): the model's BlockHooks
 *   gather a block's weights before its forward and before its recompute in backward and free them
 *   after; the block's gradients are reduced and freed as soon as its backward is done (so blocks
 *   are checkpointed: gradient-checkpointing=false is raised to true). The root unit is kept whole,
 *   as with optimizer. The next block's gather is issued when a block's gather is waited for (the
 *   forward's block i + 1, the backward's i - 1), so it travels while the block computes: at most
 *   two blocks are gathered at a time. Gathers may travel in bf16 (set_gather: half the traffic;
 *   the float32 shards stay the optimizer's), used as such under bf16 autocast, else as float32.
 *
 * Reductions are all-reduces of the unit's flat gradients (reduce-scatters on NCCL), in one order on
 * every rank (blocks from the last to the first, then the root), so a rank with no samples in a step
 * (its data ended) joins them with zeros. Every rank issues its gathers and reductions in one order
 * too: they follow the hooks' calls, which a joining rank makes as its peers' model does. Torch TUs
 * only. */
#pragma once

#include <torch/torch.h>

#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "models/block_hooks.h"
#include "models/train_model.h"
#include "sharding.h"

namespace videotrain {

class DistGroup;
class TrainOptimizer;


// One parameter's whole state as a checkpoint of any layout holds it: weight, optimizer state
// tensors by name (the parameter's shape) and the optimizer's step count.
struct ParamState {
  at::Tensor weight;
  std::map<std::string, at::Tensor> state;
  int64_t step = 0;
};

class ParamShards : public models::BlockHooks {
 public:
  // params/names: the trainable parameters (whole on every rank, the same values); block_of[i] the
  // block of parameter i, -1 for the root unit. group null: a world of one.
  ParamShards(Sharding mode, std::vector<at::Tensor> params, std::vector<std::string> names,
              const std::vector<int> &block_of, DistGroup *group, int rank, int world);
  ~ParamShards() override;

  Sharding mode() const { return mode_; }
  // sharding=full's block gathers: in `dtype` (float32 or bf16; a bf16 block is used as such when
  // `bf16_compute`, the run's autocast, else cast to float32), the next block's issued ahead of use
  // when `prefetch`. Set before the first forward; every rank the same.
  void set_gather(at::ScalarType dtype, bool bf16_compute, bool prefetch);
  at::ScalarType gather_dtype() const { return gather_dtype_; }
  // Block gathers so far, and how many of them were issued ahead of their use (prefetched).
  std::pair<int64_t, int64_t> gather_counts() const { return {gathers_, gathers_ahead_}; }
  // The tensors the optimizer updates: this rank's shard of each unit, and their names.
  const std::vector<at::Tensor> &shards() const { return shards_; }
  std::vector<std::string> shard_names() const;

  // Whether this micro-batch's backward ends the step (optimizer mode reduces only then).
  void begin_micro_batch(bool sync);
  // A rank with no samples in a step its peers train (its data ended): the collectives one of their
  // micro-batches makes (sharding=full: each block's gathers and reduction), with zero gradients.
  void join_micro_batch();
  // The step's gradients complete: reduces what the backward has not (in the one order), and sets
  // each shard's grad to its part of the mean over ranks. Collective.
  void finish_gradients();
  // Drops every gradient (parameters', shards', the step's accumulators): a step starts.
  void drop_gradients();
  // The global L2 norm of the shards' gradients and the number of non-finite entries over every
  // rank. Collective.
  std::pair<double, int64_t> gradient_norm();
  // After the optimizer updated the shards: whole units all-gather them back. Collective.
  void after_update();
  // sharding=full: every block's weights gathered and kept on rank `root` (the run's export; its
  // shards() become views of them: take them again), one block at a time on the others. Collective.
  void materialize_on(int root);
  bool materialized() const { return materialized_; }
  // Whole tensors by the model's parameter names from one slice per unit shaped like shards() (the
  // weights themselves, or an EMA kept of them): all-gathered unit by unit, every rank gets them
  // (followers' snapshots, the EMA's checkpoint and export). Collective.
  NamedTensors gather_whole(const std::vector<at::Tensor> &slices);
  // This rank's slice of each unit from whole tensors by parameter name (an EMA read whole);
  // a parameter missing there takes its slice of the weights.
  std::vector<at::Tensor> cut_named(const std::map<std::string, at::Tensor> &whole) const;

  // models::BlockHooks (block indices as the model counts them).
  void acquire(int block, models::BlockUse use) override;
  void forward_done(int block) override;
  void backward_done(int block) override;

  // Checkpoints. This rank's file: its shard of every unit's weights and of the optimizer's state
  // (`opt` steps shards(); elementwise()). The layout (for trainer.json) says which parameters
  // each unit holds, their shapes, the mode and the world size, which is all a reader of another
  // world size or sharding needs.
  void save(torch::serialize::OutputArchive &a, TrainOptimizer &opt) const;
  nlohmann::json layout(const std::string &optimizer_kind) const;
  // Sets the weights and the shard optimizer's state from whole per-parameter states (any
  // parameter missing there keeps its weights and starts its state fresh).
  void load(const std::map<std::string, ParamState> &whole, TrainOptimizer &opt);

 private:
  struct Unit;
  // This rank's shard of unit k cut from whole per-parameter tensors (undefined ones: base's values,
  // or zeros without one).
  at::Tensor cut(size_t k, const std::vector<at::Tensor> &whole, const at::Tensor &base = at::Tensor()) const;
  void reduce(size_t k);  // unit k's parameters' gradients into its shard's accumulator
  void gather(size_t k, at::ScalarType dtype);  // start_gather, then finish_gather
  // Issues unit k's all-gather in `dtype` unless its weights are here or on their way.
  void start_gather(size_t k, at::ScalarType dtype, bool ahead);
  // Waits for unit k's gather in flight and makes its parameters views of the gathered block.
  void finish_gather(size_t k);
  void release(size_t k);
  Sharding mode_;
  std::vector<at::Tensor> params_;
  std::vector<std::string> names_;
  std::vector<std::vector<int64_t>> shapes_;
  std::vector<Unit> units_;
  std::map<int, size_t> unit_of_block_;
  std::vector<at::Tensor> shards_;
  DistGroup *group_;
  int rank_, world_;
  bool sync_ = true;
  bool materialized_ = false;
  at::ScalarType gather_dtype_ = at::kFloat;
  bool bf16_compute_ = false, prefetch_ = true;
  int64_t gathers_ = 0, gathers_ahead_ = 0;
};

// Every parameter's whole state from a checkpoint written by ParamShards::save on each rank of its
// run (files shard-RRRRR.pt in `dir`, `layout` from its trainer.json), read one file at a time.
// Throws naming the file or the parameter that does not fit.
std::map<std::string, ParamState> read_sharded_checkpoint(const std::string &dir, const nlohmann::json &layout);
std::string shard_file_name(int rank);

}  // namespace videotrain
