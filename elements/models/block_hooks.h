/* Hooks around each transformer block's use of its weights, for sharded training (ddptrainsink
 * sharding=full gathers a block's weights before it runs and frees them after; sharding=optimizer
 * reduces a block's gradients as soon as its backward is done). No torch here.
 *
 * The block loops open a BlockScope per block; a checkpointed segment made inside it remembers the
 * hooks and the block, so that its backward re-acquires the weights before recomputing and, for
 * the block's first segment (the last one backward reaches), says the block's backward is done. */
#pragma once

namespace videotrain::models {

// Which pass uses a block's weights: the forward (blocks in ascending order) or a recompute in
// backward (descending), so that hooks can fetch the block that comes next ahead of time.
enum class BlockUse { forward, recompute };

class BlockHooks {
 public:
  virtual ~BlockHooks() = default;
  // Before the block's weights are used: its forward, and each recompute in backward.
  virtual void acquire(int block, BlockUse use) = 0;
  // After the block's forward (with checkpointing no autograd graph holds its weights then).
  virtual void forward_done(int block) = 0;
  // After the backward through the whole block: its weights' gradients are complete.
  virtual void backward_done(int block) = 0;
};

// The block whose forward runs on this thread (set by BlockScope): checkpointed segments made while
// it is open take it. `segments` counts the segments made in it (the first is the block's last in
// backward).
struct BlockContext {
  BlockHooks *hooks = nullptr;
  int block = -1;
  int segments = 0;
};
BlockContext *current_block();  // null outside a BlockScope (layers.cpp)

class BlockScope {
 public:
  BlockScope(BlockHooks *hooks, int block);
  ~BlockScope();
  BlockScope(const BlockScope &) = delete;
  BlockScope &operator=(const BlockScope &) = delete;

 private:
  BlockContext ctx_;
  BlockContext *prev_;
};

}  // namespace videotrain::models
