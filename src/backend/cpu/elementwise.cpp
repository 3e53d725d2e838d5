// Elementwise ops: add, accumulate, scale, and dropout (mask from core/rng.h, regenerated in backward).
#include <algorithm>
#include <cstring>

#include "backend/cpu/cpu_backend_impl.h"
#include "backend/cpu/cpu_ops.h"
#include "backend/cpu/staged.h"
#include "core/rng.h"

namespace nlp::cpu {
namespace {
constexpr size_t kParallelMin = 1 << 15;
}

// out[N] = a + b (out may alias a or b)
void add(float* out, const float* a, const float* b, size_t N) {
#pragma omp parallel for schedule(static) if (N >= kParallelMin)
  for (size_t i = 0; i < N; ++i) out[i] = a[i] + b[i];
}

// dst[N] += src
void accumulate(float* dst, const float* src, size_t N) {
#pragma omp parallel for schedule(static) if (N >= kParallelMin)
  for (size_t i = 0; i < N; ++i) dst[i] += src[i];
}

// x[N] *= s
void scale(float* x, float s, size_t N) {
#pragma omp parallel for schedule(static) if (N >= kParallelMin)
  for (size_t i = 0; i < N; ++i) x[i] *= s;
}

// Dropout over rows of `row` elements keyed as rows of `row_key` (Backend's DropRows): element i of
// row r draws its mask at r * row_key + (i - r * row). The row loops are plain (no division, no
// capture) so that the hash and the select vectorise.
namespace {

// out[k] = keep(key0 + k) ? inp[k] * s : 0 for k < n
void drop_fwd_row(float* __restrict out, const float* __restrict inp, size_t n, float p, float s,
                  uint64_t seed, uint64_t key0) {
  for (size_t k = 0; k < n; ++k) {
    const float v = inp[k] * s;
    out[k] = uniform01(seed, key0 + k) >= p ? v : 0.0f;
  }
}

// dinp[k] += keep(key0 + k) ? dout[k] * s : 0 for k < n
void drop_bwd_row(float* __restrict dinp, const float* __restrict dout, size_t n, float p, float s,
                  uint64_t seed, uint64_t key0) {
  for (size_t k = 0; k < n; ++k) {
    const float v = dinp[k] + dout[k] * s;
    dinp[k] = uniform01(seed, key0 + k) >= p ? v : dinp[k];
  }
}

// Calls row_fn(first element, count, first key) over [0, N) in rows keyed as above, in parallel; a
// single row (flat keys) is cut into chunks so that both threads work. With token_key: rows of
// `width` elements, row r keyed from token_key[r] * width (packed rows, DropRows).
template <class RowFn>
void for_keyed_rows(size_t N, size_t row, size_t row_key, const int32_t* token_key, size_t width,
                    RowFn row_fn) {
  if (token_key) {
    const size_t rows = (N + width - 1) / width;
#pragma omp parallel for schedule(static) if (N >= kParallelMin / 8)
    for (size_t r = 0; r < rows; ++r)
      row_fn(r * width, std::min(width, N - r * width), uint64_t(token_key[r]) * width);
    return;
  }
  if (row == 0 || row == row_key || row >= N) {  // flat keys
    constexpr size_t kChunk = 4096;
    const size_t chunks = (N + kChunk - 1) / kChunk;
#pragma omp parallel for schedule(static) if (N >= kParallelMin / 8)
    for (size_t c = 0; c < chunks; ++c) {
      const size_t i0 = c * kChunk;
      row_fn(i0, std::min(kChunk, N - i0), uint64_t(i0));
    }
    return;
  }
  const size_t rows = (N + row - 1) / row;
#pragma omp parallel for schedule(static) if (N >= kParallelMin / 8)
  for (size_t r = 0; r < rows; ++r) {
    const size_t i0 = r * row;
    row_fn(i0, std::min(row, N - i0), uint64_t(r) * row_key);
  }
}

}  // namespace

// out[N] = inp * keep(i) / (1-p), keep(i) = uniform01(seed, key(i)) >= p, key(i) = keyed_index(i,
// row, row_key) (Backend's DropRows); p == 0 copies (out may alias inp)
void dropout_forward(float* out, const float* inp, size_t N, float p, uint64_t seed, size_t row,
                     size_t row_key, const int32_t* token_key, size_t width) {
  if (p <= 0.0f) {
    if (out != inp) std::memmove(out, inp, N * sizeof(float));
    return;
  }
  const float s = dropout_scale(p);
  if (out == inp) {  // in place: the row function's restrict pointers need distinct buffers
    for_keyed_rows(N, row, row_key, token_key, width, [&](size_t i0, size_t n, uint64_t k0) {
      float tmp[4096];
      for (size_t j = 0; j < n; j += 4096) {
        const size_t m = std::min<size_t>(4096, n - j);
        std::memcpy(tmp, inp + i0 + j, m * sizeof(float));
        drop_fwd_row(out + i0 + j, tmp, m, p, s, seed, k0 + j);
      }
    });
    return;
  }
  for_keyed_rows(N, row, row_key, token_key, width, [&](size_t i0, size_t n, uint64_t k0) {
    drop_fwd_row(out + i0, inp + i0, n, p, s, seed, k0);
  });
}

// dinp[N] += dout * keep(i) / (1-p)
void dropout_backward(float* dinp, const float* dout, size_t N, float p, uint64_t seed, size_t row,
                      size_t row_key, const int32_t* token_key, size_t width) {
  if (p <= 0.0f) {
    accumulate(dinp, dout, N);
    return;
  }
  const float s = dropout_scale(p);
  for_keyed_rows(N, row, row_key, token_key, width, [&](size_t i0, size_t n, uint64_t k0) {
    drop_bwd_row(dinp + i0, dout + i0, n, p, s, seed, k0);
  });
}

// ---- CpuBackend's ops (cpu_backend_impl.h): each view as an fp32 stand-in (cpu/staged.h) ----

void CpuBackend::add(Act out, CAct a, CAct b, size_t N) {
  cpu::In ia(a, N), ib(b, N);
  cpu::Out o(out, N);
  cpu::add(o, ia, ib, N);
}

void CpuBackend::accumulate(Act dst, CAct src, size_t N) {
  cpu::In s(src, N);
  Act d = dst;
  d.write = false;  // accumulate is an accumulation whatever the flag
  cpu::Acc g(d, N);
  cpu::accumulate(g, s, N);
}

void CpuBackend::scale(Act x, float s, size_t N) {
  Act d = x;
  d.write = false;
  cpu::Acc g(d, N);
  cpu::scale(g, s, N);
}

void CpuBackend::copy_view(Act dst, CAct src, size_t N) {
  if (dst.dt == src.dt) {
    copy(dst.p, src.p, N * dtype_bytes(dst.dt));
    return;
  }
  cpu::In s(src, N);
  cpu::Out o(dst, N);
  std::memcpy(o.get(), s.get(), N * sizeof(float));
}

void CpuBackend::dropout_forward(Act out, CAct inp, size_t N, float p, uint64_t seed,
                                 DropRows rows) {
  cpu::In i(inp, N);
  cpu::Out o(out, N);
  cpu::dropout_forward(o, i, N, p, seed, rows.row, rows.row_key, rows.token_key, rows.width);
}

void CpuBackend::dropout_backward(Act dinp, CAct dout, size_t N, float p, uint64_t seed,
                                  DropRows rows) {
  cpu::In d(dout, N);
  cpu::Acc g(dinp, N);
  cpu::dropout_backward(g, d, N, p, seed, rows.row, rows.row_key, rows.token_key, rows.width);
}

}  // namespace nlp::cpu
