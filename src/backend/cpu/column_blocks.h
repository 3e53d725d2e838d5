// Column sums over the rows of a [rows, C] matrix (bias and LayerNorm parameter gradients), parallel
// and reproducible: the columns in blocks of kColumnBlock, one block per OpenMP iteration, each
// summing its rows in order, so every column gets the same sum at any thread count.
#pragma once

namespace nlp::cpu {

constexpr int kColumnBlock = 64;

// f(c0, c1) for the blocks [c0, c1) of columns [0, C): at most kColumnBlock each, in parallel.
template <class F>
inline void for_column_blocks(int C, F f) {
  const int nblocks = (C + kColumnBlock - 1) / kColumnBlock;
#pragma omp parallel for schedule(static)
  for (int blk = 0; blk < nblocks; ++blk) {
    const int c0 = blk * kColumnBlock;
    f(c0, c0 + kColumnBlock < C ? c0 + kColumnBlock : C);
  }
}

}  // namespace nlp::cpu
