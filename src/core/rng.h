// Counter-based random numbers: value = f(seed, index), no state to carry.
// Dropout masks are regenerated in backward from the same (seed, index), identically on every backend,
// and a resumed run reproduces the exact stream from the step number alone.
#pragma once
#include <cstdint>

#if defined(__CUDACC__)
#define NLP_HD __host__ __device__ __forceinline__
#else
#define NLP_HD inline
#endif

namespace nlp {

// SplitMix64 finaliser: a bijective 64-bit mix with good avalanche.
NLP_HD uint64_t mix64(uint64_t z) {
  z += 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

// The 64 random bits of element `index` of stream `seed` (every draw below is made of these).
NLP_HD uint64_t draw64(uint64_t seed, uint64_t index) { return mix64(seed ^ mix64(index)); }

// Uniform float in [0, 1) for element `index` of stream `seed` (24 random bits).
NLP_HD float uniform01(uint64_t seed, uint64_t index) {
  const uint64_t r = draw64(seed, index);
  // the top 24 bits, converted through int32 (the same value: < 2^24), which vectorises on CPUs
  // without a 64-bit-integer-to-float instruction (AVX2)
  return static_cast<float>(static_cast<int32_t>(r >> 40)) * (1.0f / 16777216.0f);
}

// The row length dropout masks are keyed by: T_key, or T itself when T_key is 0 (not trimmed).
NLP_HD int key_length(int T, int T_key) { return T_key > 0 ? T_key : T; }

// The mask index of element i of a tensor of rows of `row` elements keyed as rows of `row_key`
// elements (Backend's DropRows: one example trimmed from T_key to T positions): the index of the
// same (example, offset) in the untrimmed layout. row == 0 or row == row_key: i itself.
NLP_HD uint64_t keyed_index(uint64_t i, uint64_t row, uint64_t row_key) {
  return (row == 0 || row == row_key) ? i : (i / row) * row_key + i % row;
}

// Derive a sub-stream seed, e.g. derive_seed(run_seed, step, layer, site).
NLP_HD uint64_t derive_seed(uint64_t seed, uint64_t a, uint64_t b = 0, uint64_t c = 0) {
  return mix64(mix64(mix64(seed ^ mix64(a + 1)) ^ (b + 0x1234567ull)) ^ (c + 0x89ABCDEFull));
}

// Host-side sequential generator (initialisation, sampling), same mixer.
struct Rng {
  uint64_t seed;
  uint64_t counter = 0;
  explicit Rng(uint64_t s) : seed(s) {}
  uint64_t next_u64() { return draw64(seed, counter++); }
  float uniform() { return static_cast<float>(next_u64() >> 40) * (1.0f / 16777216.0f); }
  double uniform_double() { return uniform_double_at(seed, counter++); }
  // uniform_double()'s value at counter k (53 random bits), without a generator
  static double uniform_double_at(uint64_t seed, uint64_t k) {
    return static_cast<double>(draw64(seed, k) >> 11) * (1.0 / 9007199254740992.0);
  }
  // Standard normal by Box-Muller (one value per call; deterministic).
  float normal();
  // out[i] = scale * normal() for i = 0..n-1, the values and final counter of n calls in turn, computed
  // in parallel (OpenMP): each value depends only on its two counters, so no thread order shows.
  // Initialising BERT-base or GPT-2 124M draws over 100M of them (a log and a cos each).
  void fill_normal(float* out, int64_t n, float scale);
};

}  // namespace nlp
