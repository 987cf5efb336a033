/* Keeps freed tensor memory in the C heap instead of giving it back to the OS.
 *
 * glibc serves allocations above its mmap threshold (128 KiB at first) with fresh
 * mmap()s and trims the heap top as soon as it is free, so every step of a CPU
 * training loop page-faults (and the kernel zeroes) its activations again: ~30% of
 * a small 3D-conv step here. One process-wide mallopt() fixes that; it is opt-out
 * through the elements' tune-malloc property because it touches the whole process. */
#pragma once

#include <cstddef>
#include <string>

namespace videotrain {

// Allocations up to mmap_threshold come from the heap, which keeps up to
// trim_threshold free bytes at its top. Idempotent; returns false (with *why) where
// the C library cannot be tuned (not glibc, or mallopt refused).
bool retain_cpu_heap(std::string *why = nullptr, std::size_t mmap_threshold = std::size_t(32) << 20,
                     std::size_t trim_threshold = std::size_t(128) << 20);

// Also serves blocks above the mmap threshold from the heap (no mmap at all), so that freed
// ones are reused too: the VAE encoder's full-resolution activations are 40-100 MB each and
// otherwise page-fault (and are zeroed by the kernel) afresh on every allocation, about 15% of
// a CPU encode. Idempotent, process-wide; false (with *why) where it cannot be set.
bool retain_large_cpu_blocks(std::string *why = nullptr);

// The blurb of the elements' tune-malloc property.
constexpr const char *kTuneMallocBlurb =
    "On CPU, keep freed tensor memory (allocations up to 32 MiB, 128 MiB free at the heap top) in the C heap "
    "instead of returning it to the OS, so that each step or clip does not page-fault its tensors afresh (about "
    "30% faster small CPU steps, and steadier encode times). Process-wide (glibc mallopt); false leaves the "
    "process's malloc settings alone";

}  // namespace videotrain
