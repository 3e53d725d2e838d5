// CudaBackend (cuda_backend_impl.h): the losses: cross-entropy over rows and segments
// (kernels/crossentropy.cu) with its row statistics and its target check, and the LM head fused
// with its loss (kernels/lm_head.cu) with the head's padded bf16 wte.
#include "backend/cuda/cuda_backend_impl.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdint>
#include <utility>
#include <vector>

namespace nlp::cuda {

void CudaBackend::lm_head_crossentropy(float* losses, Act dx, float* dw, CAct x, const float* w,
                                       const int32_t* targets, float dloss, int M, int C, int V,
                                       int Vp, int chunk, float* scratch) {
  const size_t n = size_t(std::max(M, 0)) * C;
  if (dx.f32() && x.f32()) {
    return lm_head_crossentropy_f32(losses, acc_f32(dx, n), dw, x.fp(), w, targets, dloss, M, C, V, Vp,
                                    chunk, scratch);
  }
  Stage st(*this, "lm_head_crossentropy (staged)");
  const float* xi = st.in(x, n);
  lm_head_crossentropy_f32(losses, st.acc(dx, n), dw, xi, w, targets, dloss, M, C, V, Vp, chunk,
                           scratch);
  st.finish();
}

// The LM head fused with its loss (core/backend.h). Padding (Vp > V) lives in scratch only: a copy
// of w with rows V..Vp zero, so that the head's GEMMs run Vp wide (a multiple of 128: whole tiles,
// 16-byte aligned rows), and with dw a padded [Vp, C] gradient whose first V rows are added to dw
// at the end (the padded rows' gradient is dropped). The parameters, their gradients, the optimizer,
// checkpoints and exports keep V rows. Not yet run on a GPU: model.fused_head and model.pad_vocab
// are off by default on this backend.
// Scratch: the chunk's fp32 logits [chunk, Vp]; with Vp > V the padded dw [Vp, C] and, unless the
// padded w is bf16 (head_w16_, in a buffer of its own), the padded fp32 w [Vp, C]; in bf16 precision with NLPTRAIN_CUDA_HEAD_DLOGITS=bf16 (head_dl16_) also the chunk's bf16 dlogits
// [chunk, Vp] on a 256-byte boundary (head_dlogits16), which the backward GEMMs read as their
// operand; otherwise the dlogits overwrite the logits in fp32 and the GEMM casts them.
// The padded w: in bf16 precision with NLPTRAIN_CUDA_HEAD_WTE=bf16 (head_w16_) a bf16 [Vp, C] in
// its own buffer (hw_, head_wte), which every GEMM of the call reads as its weight operand
// (z16/w16): copied from the persistent bf16 copy and kept while wte is unwritten (remade on the
// first call after a write, so once per optimizer step), or rounded from w at every call where
// there is no persistent copy; else fp32 in the scratch, which each GEMM rounds again in bf16
// precision.
size_t CudaBackend::padded_floats(int C, int V, int Vp) const {  // the scratch's padded w and dw
  return Vp > V ? (head_w16_ ? 1 : 2) * size_t(Vp) * C : 0;
}

size_t CudaBackend::lm_head_scratch_floats(int chunk, int C, int V, int Vp) {
  const size_t dl16 = head_dl16_ ? kAlignFloats + (size_t(chunk) * Vp + 1) / 2 : 0;
  return size_t(chunk) * Vp + padded_floats(C, V, Vp) + dl16;
}

// The bf16 dlogits' place in the scratch: past the logits and the padded copies, rounded up to
// 256 bytes (within the kAlignFloats floats lm_head_scratch_floats adds for it).
void* CudaBackend::head_dlogits16(float* scratch, int chunk, int C, int V, int Vp) const {
  const float* end = scratch + size_t(chunk) * Vp + padded_floats(C, V, Vp);
  const uintptr_t a = reinterpret_cast<uintptr_t>(end);
  return reinterpret_cast<void*>((a + 4 * kAlignFloats - 1) / (4 * kAlignFloats) * (4 * kAlignFloats));
}

void CudaBackend::lm_head_crossentropy_f32(float* losses, float* dx, float* dw, const float* x,
                                           const float* w, const int32_t* targets, float dloss,
                                           int M, int C, int V, int Vp, int chunk, float* scratch) {
  NLP_ASSERT(Vp >= V && chunk > 0);
  if (M <= 0) return;
  const bool bwd = dx || dw;
  const int N = Vp;  // the GEMMs' width and the logits' row stride
  float* logits = scratch;
  const float* wg = w;
  float* dwg = dw;
  const void* w16 = nullptr;  // the GEMMs' bf16 weight operand [N, C] (head_w16_), else null
  const size_t vc = size_t(V) * C, pc = size_t(Vp - V) * C;
  if (Vp > V) {
    float* wp = scratch + size_t(chunk) * Vp;  // the padded fp32 w (not head_w16_), then dw
    if (head_w16_) {
      w16 = head_wte(w, C, V, Vp);  // the fp32 w is not read by the GEMMs
      wg = nullptr;
    } else {
      copy(wp, w, vc * sizeof(float));
      zero(wp + vc, pc * sizeof(float));
      wg = wp;
    }
    if (dw) {
      dwg = wp + (head_w16_ ? 0 : size_t(Vp) * C);
      zero(dwg, size_t(Vp) * C * sizeof(float));
    }
  } else if (head_w16_) {
    w16 = persistent(w, vc);  // null without run.bf16_weights: each GEMM rounds w, as before
  }
  int* bad = bad_row(targets, M, V);
  // bf16 dlogits (head_dl16_): written by the loss kernel, read by the typed GEMM as stored
  void* dl16 = bwd && head_dl16_ ? head_dlogits16(scratch, chunk, C, V, Vp) : nullptr;
  for (int r0 = 0; r0 < M; r0 += chunk) {
    const int rows = std::min(chunk, M - r0);
    const float* xr = x + size_t(r0) * C;
    gemm("lm_head_crossentropy (logits)", logits, xr, false, wg, true, rows, N, C, 0.0f, nullptr,
         w16);
    if (dl16) {
      // logits [rows, N] fp32 (read) -> losses [rows], dl16 [rows, N] bf16; then
      // dx[rows, C] += dl16 @ wg[N, C] and dwg[N, C] += dl16^T @ xr (xr rounded to bf16 as the
      // fp32-dlogits path rounds it; wg from w16 where set, else rounded as there)
      op(kern::lm_head_crossentropy_bf16(losses + r0, logits, dl16, N, targets + r0, dloss,
                                         dloss_slot(), rows, V, r0, bad, stream_, head_online_),
         "lm_head_crossentropy (bf16 dlogits)");
      noted([&] {
        gemm_->backward(cuda::GemmOut{dx ? dx + size_t(r0) * C : nullptr, CUDA_R_32F}, 1.0f, dwg,
                        nullptr, cuda::GemmIn{dl16, CUDA_R_16BF}, cuda::GemmIn{xr, CUDA_R_32F},
                        wg, rows, C, N, false, w16);
      });
      op(cudaSuccess, "lm_head_crossentropy (dx, dW)");
      continue;
    }
    op(kern::lm_head_crossentropy(losses + r0, logits, N, targets + r0, dloss,
                                  bwd ? dloss_slot() : nullptr, rows, V, r0, bad, bwd, stream_,
                                  head_online_),
       "lm_head_crossentropy");
    if (!bwd) continue;
    noted([&] {
      gemm_->backward(dx ? dx + size_t(r0) * C : nullptr, dwg, logits, xr, wg, rows, C, N, false, w16);
    });
    op(cudaSuccess, "lm_head_crossentropy (dx, dW)");
  }
  if (dw && dwg != dw) accumulate(dw, dwg, size_t(V) * C);
  copy_bad_row();
}

// The fused head's padded bf16 wte [Vp, C] (head_w16_, Vp > V): rows 0..V the bf16 of w, rows
// V..Vp zero, in hw_'s buffer. Made from the persistent copy (a copy, no rounding) and then kept
// (hw_.w = w) until a write to wte forgets it (forget_head_wte: weights_written, adamw_update(_spans),
// register_weights), so one copy per optimizer step however many micro-batches read it; rounded
// from w (kern::to_bf16) at every call where w has no persistent copy. While recording a CUDA graph
// the copy is made inside the recording (each replay remakes it from the persistent copy as it is
// then: a replay never reads a copy older than the weights) and hw_ is left forgotten, since the
// recorded ops have not run. The buffer grows like the workspace (never while recording).
const uint16_t* CudaBackend::head_wte(const float* w, int C, int V, int Vp) {
  const size_t vc = size_t(V) * C, pc = size_t(Vp - V) * C, n = vc + pc;
  const uint16_t* pw = persistent(w, vc);
  if (pw && !cap_ && hw_.w == w && hw_.C == C && hw_.V == V && hw_.Vp == Vp) return hw_.p;
  if (n > hw_.cap) {
    no_capture("the fused head's padded wte would grow");
    ++grows_;
    if (hw_.p) ck(cudaFreeAsync(hw_.p, stream_), "cudaFreeAsync(padded wte)");
    hw_.p = nullptr;
    hw_.cap = 0;
    hw_.p = static_cast<uint16_t*>(alloc(n * sizeof(uint16_t)));
    hw_.cap = n;
  }
  hw_.w = nullptr;
  if (pw) {
    op(cudaMemcpyAsync(hw_.p, pw, vc * sizeof(uint16_t), cudaMemcpyDeviceToDevice, stream_),
       "lm_head_crossentropy (padded bf16 wte)");
  } else {
    op(kern::to_bf16(hw_.p, w, vc, stream_), "lm_head_crossentropy (padded bf16 wte)");
    ++to16_;
  }
  op(cudaMemsetAsync(hw_.p + vc, 0, pc * sizeof(uint16_t), stream_),
     "lm_head_crossentropy (padded bf16 wte)");
  ++head_wte_builds_;
  if (pw && !cap_) {
    hw_.w = w;
    hw_.C = C;
    hw_.V = V;
    hw_.Vp = Vp;
  }
  return hw_.p;
}

// A write to [p, p + n) of the weights: the head's padded copy is remade if it covers any of it.
void CudaBackend::forget_head_wte(const float* p, size_t n) {
  if (hw_.w && n && p < hw_.w + size_t(hw_.V) * hw_.C && p + n > hw_.w) hw_.w = nullptr;
}

// ---- cross-entropy over rows and segments ----
void CudaBackend::crossentropy_forward(float* losses, const float* logits, const int32_t* targets,
                                       int M, int V) {
  if (M <= 0) return;
  ce_stats_capacity(M);
  op(kern::crossentropy_forward(losses, logits, targets, M, V, bad_row(targets, M, V),
                                ce_stats_.mx, ce_stats_.se, stream_),
     "crossentropy_forward");
  ce_stats_.logits = logits;
  ce_stats_.M = M;
  ce_stats_.V = V;
  if (cap_) cap_->stats_set = true;
  copy_bad_row();
}

void CudaBackend::crossentropy_backward(float* dlogits, const float* logits, const int32_t* targets,
                                        float dloss, int M, int V) {
  if (M <= 0) return;
  const bool reuse = ce_stats_.logits == logits && ce_stats_.M == M && ce_stats_.V == V;
  op(kern::crossentropy_backward(dlogits, logits, targets, dloss, dloss_slot(), M, V,
                                 bad_row(targets, M, V), reuse ? ce_stats_.mx : nullptr,
                                 reuse ? ce_stats_.se : nullptr, stream_),
     "crossentropy_backward");
  copy_bad_row();
}

// Segments (packed qa): the flag's V = 0 marks them for check_targets' message.
std::pair<std::vector<int32_t>, std::vector<int32_t>> CudaBackend::segments_on_host(
    const int32_t* first, const int32_t* len, int E) {
  std::vector<int32_t> f(static_cast<size_t>(E)), n(static_cast<size_t>(E));
  to_host(f.data(), first, f.size() * sizeof(int32_t));
  to_host(n.data(), len, n.size() * sizeof(int32_t));
  return {std::move(f), std::move(n)};
}

void CudaBackend::segment_crossentropy_forward(float* losses, const float* x, const int32_t* first,
                                               const int32_t* len, const int32_t* targets, int E) {
  if (E <= 0) return;
  if (segment_ce_rows_) {
    const auto [f, n] = segments_on_host(first, len, E);
    for (int e = 0; e < E; ++e) crossentropy_forward(losses + e, x + f[e], targets + e, 1, n[e]);
    return;
  }
  op(kern::segment_crossentropy_forward(losses, x, first, len, targets, E,
                                        bad_row(targets, E, 0), stream_),
     "crossentropy_forward");
  copy_bad_row();
}

void CudaBackend::segment_crossentropy_backward(float* dx, const float* x, const int32_t* first,
                                                const int32_t* len, const int32_t* targets,
                                                float dloss, int E) {
  if (E <= 0) return;
  if (segment_ce_rows_) {
    const auto [f, n] = segments_on_host(first, len, E);
    for (int e = 0; e < E; ++e) crossentropy_backward(dx + f[e], x + f[e], targets + e, dloss, 1, n[e]);
    return;
  }
  op(kern::segment_crossentropy_backward(dx, x, first, len, targets, dloss, dloss_slot(), E,
                                         bad_row(targets, E, 0), stream_),
     "crossentropy_backward");
  copy_bad_row();
}

void CudaBackend::forget_ce_stats(const void* written) {
  if (cap_ && !cap_->stats_set) cap_->written.push_back(written);
  if (written == ce_stats_.logits) ce_stats_.logits = nullptr;
}

void CudaBackend::ce_stats_capacity(int M) {
  if (M <= ce_stats_.cap) return;
  no_capture("the cross-entropy row statistics would grow");
  ++grows_;
  if (ce_stats_.se) release(ce_stats_.se);
  ce_stats_.se = static_cast<double*>(alloc(size_t(M) * 12 + 64));  // se [M] double | mx [M] float
  ce_stats_.mx = reinterpret_cast<float*>(ce_stats_.se + M);
  ce_stats_.cap = M;
  ce_stats_.logits = nullptr;
}

// Cross-entropy target check without a synchronisation inside the step: the kernels atomicMin the
// first bad row into a device flag, whose copy to pinned memory is enqueued after the op; the flag
// is read at the next synchronisation (synchronize, to_host, sum), which every step has, and a bad
// target is reported there with the CPU backend's message.
int* CudaBackend::bad_row(const int32_t* targets, int M, int V) {
  int* bad = reinterpret_cast<int*>(static_cast<char*>(small_) + 64);
  if (cap_) {  // recorded: replay() arms the flag before a launch when it is not armed then
    cap_->has_ce = true;
    ce_.armed = true;
  } else if (!ce_.armed) {
    ck(cudaMemsetAsync(bad, 0x7f, sizeof(int), stream_), "crossentropy (flag)");  // 0x7f7f7f7f
    ce_.armed = true;
  }
  ce_.targets = targets;
  ce_.M = M;
  ce_.V = V;
  return bad;
}

// After the op: enqueue the flag's copy (read by check_targets once the stream is synchronised).
void CudaBackend::copy_bad_row() {
  int* bad = reinterpret_cast<int*>(static_cast<char*>(small_) + 64);
  int* hb = reinterpret_cast<int*>(static_cast<char*>(host_small_) + 64);
  ck(cudaMemcpyAsync(hb, bad, sizeof(int), cudaMemcpyDeviceToHost, stream_), "crossentropy (flag)");
}

// Called with the stream synchronised.
void CudaBackend::check_targets() {
  if (!ce_.armed) return;
  ce_.armed = false;
  const int row = *reinterpret_cast<int*>(static_cast<char*>(host_small_) + 64);
  if (row >= 0 && row < ce_.M) {
    int32_t t = 0;
    ck(cudaMemcpy(&t, ce_.targets + row, sizeof t, cudaMemcpyDeviceToHost), "crossentropy (target)");
    if (ce_.V == 0)  // segments
      throw Error(cat("crossentropy: target ", t, " of segment ", row,
                      " is outside its positions and is not the ignore index ", kIgnoreIndex));
    throw Error(cat("crossentropy: target ", t, " at row ", row, " is outside the vocabulary [0, ",
                    ce_.V, ") and is not the ignore index ", kIgnoreIndex));
  }
}

}  // namespace nlp::cuda
