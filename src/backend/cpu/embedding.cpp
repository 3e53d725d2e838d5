// Token (+ position, + token-type) embeddings.
#include "backend/cpu/cpu_backend_impl.h"
#include "backend/cpu/staged.h"

namespace nlp::cpu {

// out[B,T,C] = wte[ids[b,t]] + wpe[p] (+ wtt[type_ids[b,t]]), p = pos_ids[b,t] or pos_offset + t
// wte [V,C], wpe [P,C], wtt [TT,C]
void embedding_forward(float* out, const int32_t* ids, const int32_t* type_ids, const float* wte,
                       const float* wpe, const float* wtt, int B, int T, int C, int pos_offset,
                       const int32_t* pos_ids) {
  const bool types = type_ids && wtt;
  const int BT = B * T;
#pragma omp parallel for schedule(static)
  for (int bt = 0; bt < BT; ++bt) {
    const int t = bt % T;
    float* __restrict o = out + (size_t)bt * C;
    const float* __restrict e = wte + (size_t)ids[bt] * C;
    const float* __restrict p = wpe + (size_t)(pos_ids ? pos_ids[bt] : pos_offset + t) * C;
    if (types) {
      const float* __restrict y = wtt + (size_t)type_ids[bt] * C;
      for (int c = 0; c < C; ++c) o[c] = e[c] + p[c] + y[c];
    } else {
      for (int c = 0; c < C; ++c) o[c] = e[c] + p[c];
    }
  }
}

// dwte[V,C] += scatter of dout[B,T,C] by ids; dwpe[P,C] row pos_offset+t += sum_b dout[b,t], or
// with pos_ids a scatter by pos_ids; dwtt[TT,C] += scatter by type_ids (when both non-null).
// Deterministic: threads own channel blocks, and each block visits (b,t) in order.
void embedding_backward(float* dwte, float* dwpe, float* dwtt, const float* dout,
                        const int32_t* ids, const int32_t* type_ids, int B, int T, int C,
                        int pos_offset, const int32_t* pos_ids) {
  const int BT = B * T;
  const bool types = type_ids && dwtt;
  const bool scatter_pos = pos_ids && dwpe;
  constexpr int kBlock = 32;
  const int nblocks = (C + kBlock - 1) / kBlock;
  if (dwte || types || scatter_pos) {
#pragma omp parallel for schedule(static)
    for (int blk = 0; blk < nblocks; ++blk) {
      const int c0 = blk * kBlock;
      const int c1 = c0 + kBlock < C ? c0 + kBlock : C;
      for (int bt = 0; bt < BT; ++bt) {
        const float* __restrict d = dout + (size_t)bt * C;
        if (dwte) {
          float* __restrict g = dwte + (size_t)ids[bt] * C;
          for (int c = c0; c < c1; ++c) g[c] += d[c];
        }
        if (types) {
          float* __restrict g = dwtt + (size_t)type_ids[bt] * C;
          for (int c = c0; c < c1; ++c) g[c] += d[c];
        }
        if (scatter_pos) {
          float* __restrict g = dwpe + (size_t)pos_ids[bt] * C;
          for (int c = c0; c < c1; ++c) g[c] += d[c];
        }
      }
    }
  }
  if (dwpe && !scatter_pos) {
#pragma omp parallel for schedule(static)
    for (int t = 0; t < T; ++t) {
      float* __restrict g = dwpe + (size_t)(pos_offset + t) * C;
      for (int b = 0; b < B; ++b) {
        const float* __restrict d = dout + ((size_t)b * T + t) * C;
        for (int c = 0; c < C; ++c) g[c] += d[c];
      }
    }
  }
}

// ---- CpuBackend's ops (cpu_backend_impl.h): each view as an fp32 stand-in (cpu/staged.h) ----

void CpuBackend::embedding_forward(Act out, const int32_t* ids, const int32_t* type_ids,
                                   const float* wte, const float* wpe, const float* wtt, int B,
                                   int T, int C, int pos_offset, const int32_t* pos_ids) {
  cpu::Out o(out, size_t(B) * T * C);
  cpu::embedding_forward(o, ids, type_ids, wte, wpe, wtt, B, T, C, pos_offset, pos_ids);
}

void CpuBackend::embedding_backward(float* dwte, float* dwpe, float* dwtt, CAct dout,
                                    const int32_t* ids, const int32_t* type_ids, int B, int T,
                                    int C, int pos_offset, const int32_t* pos_ids) {
  cpu::In d(dout, size_t(B) * T * C);
  cpu::embedding_backward(dwte, dwpe, dwtt, d, ids, type_ids, B, T, C, pos_offset, pos_ids);
}

}  // namespace nlp::cpu
