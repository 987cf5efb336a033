/* Every seeded draw of the project: shuffles, clip windows, noise seeds, caption dropout and the
 * weights of test VAEs. All are plain 64-bit arithmetic, so a seed gives the same numbers on every
 * machine, library and build (std::hash and std distributions do not). Changing any formula here
 * changes which rows, windows and noise an existing run draws, and a resumed run would then differ
 * from an uninterrupted one: keep them bit-for-bit. Header-only, no torch, no GStreamer. */
#pragma once

#include <cstdint>

namespace videotrain {

inline constexpr uint64_t kGolden64 = 0x9e3779b97f4a7c15ULL;  // 2^64 / golden ratio: splitmix's step

// splitmix64's output function (Stafford's variant 13), without the step.
inline constexpr uint64_t splitmix_finalize(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

// One splitmix64 step from state x: the mixing used for every seeded choice.
inline constexpr uint64_t mix64(uint64_t x) { return splitmix_finalize(x + kGolden64); }

// Order-dependent combination of two keys (hash_combine(seed, epoch) != hash_combine(epoch, seed)).
inline constexpr uint64_t hash_combine(uint64_t a, uint64_t b) {
  return mix64(a ^ mix64(b + 0x632be59bd9b4e019ULL));
}

// A splitmix64 stream: a small seeded generator, the same numbers everywhere.
struct SplitMix64 {
  uint64_t state;
  uint64_t next() {
    const uint64_t out = mix64(state);
    state += kGolden64;
    return out;
  }
  double uniform() { return (next() >> 11) * (1.0 / 9007199254740992.0); }  // [0, 1), 53 bits
};

// A shorter xor-shift/multiply finaliser (two rounds); the trainer's step seeds and the caption
// dropout draws were defined with it before splitmix was shared, and must keep drawing the same.
inline constexpr uint64_t short_finalize(uint64_t x, uint64_t multiplier) {
  x ^= x >> 31;
  x *= multiplier;
  return x ^ (x >> 29);
}

// Seed of the trainer's generator for a step: the same on reruns and resumes, different per rank.
// Non-negative, as torch's manual_seed wants an int64.
inline constexpr uint64_t step_seed(uint64_t seed, int rank, uint64_t step) {
  const uint64_t x = seed * kGolden64 ^ (static_cast<uint64_t>(rank) + 1) * 0xC2B2AE3D27D4EB4Full ^
                     (step + 1) * 0x165667B19E3779F9ull;
  return short_finalize(x, 0xbf58476d1ce4e5b9ULL) & 0x7fffffffffffffffull;
}

// Seed of a native model's per-sample CPU generator (its timestep, then its noise): the same sample
// draws the same in any batch, on any rank and after a resume. Non-negative for manual_seed.
inline constexpr uint64_t sample_noise_seed(uint64_t seed, uint64_t sample_id, uint64_t epoch) {
  return hash_combine(hash_combine(seed, sample_id), epoch) & 0x7fffffffffffffffull;
}

// Seed handed to validation_step for a sample: depends on the sample alone, so every
// validation pass (and every rank) sees the same noise for it.
inline constexpr int64_t validation_seed(uint64_t sample_id) {
  return static_cast<int64_t>(splitmix_finalize(sample_id * kGolden64 + 0x5EED5EED5EEDull) & 0x7fffffffffffffffull);
}

}  // namespace videotrain
