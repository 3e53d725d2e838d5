// CudaBackend (cuda_backend_impl.h): the dense layers, through cuda::Gemm (gemm.h: cuBLASLt), and
// the dense layer with its GELU.
#include "backend/cuda/cuda_backend_impl.h"

namespace nlp::cuda {

void CudaBackend::matmul_forward(Act out, CAct inp, const float* w, const float* bias, int M, int K,
                                 int N, WLayout layout) {
  if (out.f32() && inp.f32()) return matmul_forward_f32(out.fp(), inp.fp(), w, bias, M, K, N, layout);
  if (native_bf16() && M > 0 && N > 0 && K > 0) {
    // native: the typed GEMM reads inp and writes out as stored (cuda::Gemm::forward)
    forget_ce_stats(out.p);
    noted([&] {
      gemm_->forward(cuda::gemm_out(out), cuda::gemm_in(inp), false, w, layout == WLayout::OutIn,
                     M, N, K, 0.0f, bias, persistent(w, size_t(K) * N), nullptr,
                     bias ? persistent(bias, size_t(N)) : nullptr);
    });
    return op(cudaSuccess, "matmul_forward (bf16)");
  }
  Stage st(*this, "matmul_forward (staged)");
  const float* i = st.in(inp, size_t(M) * K);
  matmul_forward_f32(st.out(out, size_t(M) * N), i, w, bias, M, K, N, layout);
  st.finish();
}

void CudaBackend::matmul_backward(Act dinp, float* dw, float* dbias, CAct dout, CAct inp,
                                  const float* w, int M, int K, int N, WLayout layout) {
  if (dinp.f32() && dout.f32() && inp.f32())
    return matmul_backward_f32(acc_f32(dinp, size_t(M) * K), dw, dbias, dout.fp(), inp.fp(), w, M, K,
                               N, layout);
  if (native_bf16() && M > 0 && N > 0 && K > 0) {
    // native: the typed GEMM reads dout and inp as stored, writes (overwrite) or accumulates
    // dinp in its type, and adds dout's column sums to dbias (cuda::Gemm::backward)
    const void* w16 = dinp ? persistent(w, size_t(K) * N) : nullptr;
    noted([&] {
      gemm_->backward(cuda::gemm_out(dinp), dinp.write ? 0.0f : 1.0f, dw, dbias,
                      cuda::gemm_in(dout), cuda::gemm_in(inp), w, M, K, N,
                      layout == WLayout::InOut, w16);
    });
    return op(cudaSuccess, "matmul_backward (bf16)");
  }
  Stage st(*this, "matmul_backward (staged)");
  const float* d = st.in(dout, size_t(M) * N);
  const float* i = dw ? st.in(inp, size_t(M) * K) : nullptr;
  matmul_backward_f32(st.acc(dinp, size_t(M) * K), dw, dbias, d, i, w, M, K, N, layout);
  st.finish();
}

// The dense layer with its GELU (core/backend.h). All views bf16 with the native kernels, the tanh
// form and the cuBLASLt epilogue switched on (NLPTRAIN_CUDA_GEMM_EPILOGUES = all): one typed GEMM
// writes pre and out = gelu(pre) (GELU_AUX; cuda::Gemm falls back to the plain product and
// kernels/gemm_epilogue.cu where no algorithm takes it). Anything else, the fp32 views included:
// Backend's default, matmul_forward then gelu_forward. Not yet run on a GPU.
void CudaBackend::matmul_gelu_forward(Act out, Act pre, CAct inp, const float* w, const float* bias,
                                      int M, int K, int N, WLayout layout, Gelu form) {
  if (form == Gelu::Tanh && gemm_->epilogues().gelu_aux && native_bf16_views({out, pre, inp}) &&
      out && pre && M > 0 && N > 0 && K > 0) {
    forget_ce_stats(out.p);
    forget_ce_stats(pre.p);
    noted([&] {
      gemm_->forward(cuda::gemm_out(out), cuda::gemm_in(inp), false, w, layout == WLayout::OutIn,
                     M, N, K, 0.0f, bias, persistent(w, size_t(K) * N), pre.p,
                     bias ? persistent(bias, size_t(N)) : nullptr);
    });
    return op(cudaSuccess, "matmul_gelu_forward (bf16, GELU_AUX)");
  }
  Backend::matmul_gelu_forward(out, pre, inp, w, bias, M, K, N, layout, form);
}

// Its backward for the following dense layer: with the same conditions (DGELU switched on) and dpre
// overwritten (the epilogue has no accumulating form), one typed backward GEMM writes
// dpre = (dout @ W^T) * gelu'(pre) and adds dW and dbias; scratch is not used. Else the default.
void CudaBackend::matmul_dgelu_backward(Act dpre, float* dw, float* dbias, CAct dout, CAct h,
                                        CAct pre, const float* w, int M, int K, int N,
                                        WLayout layout, Gelu form, Act scratch) {
  if (form == Gelu::Tanh && gemm_->epilogues().dgelu && dpre.write &&
      native_bf16_views({dpre, dout, h, pre}) && dpre && pre && M > 0 && N > 0 && K > 0) {
    forget_ce_stats(dpre.p);
    const void* w16 = persistent(w, size_t(K) * N);
    noted([&] {
      gemm_->backward(cuda::gemm_out(dpre), 0.0f, dw, dbias, cuda::gemm_in(dout),
                      cuda::gemm_in(h), w, M, K, N, layout == WLayout::InOut, w16, pre.p);
    });
    return op(cudaSuccess, "matmul_dgelu_backward (bf16, DGELU)");
  }
  Backend::matmul_dgelu_backward(dpre, dw, dbias, dout, h, pre, w, M, K, N, layout, form, scratch);
}

// ---- the fp32 ops (float* views) ----
// out[M,N] = inp[M,K] @ W + bias;  InOut: W [K,N];  OutIn: W [N,K]
void CudaBackend::matmul_forward_f32(float* out, const float* inp, const float* w,
                                     const float* bias, int M, int K, int N, WLayout layout) {
  if (M <= 0 || N <= 0) return;
  if (K <= 0) {
    if (bias)
      op(kern::broadcast_rows(out, bias, M, N, stream_), "matmul_forward (bias)");
    else
      zero(out, sizeof(float) * size_t(M) * N);
    return;
  }
  forget_ce_stats(out);
  gemm("matmul_forward", out, inp, false, w, layout == WLayout::OutIn, M, N, K, 0.0f, bias,
       persistent(w, size_t(K) * N));
}

// dinp[M,K] += dout @ W^T;  dW += inp^T @ dout (in W's layout);  dbias[N] += colsum(dout)
void CudaBackend::matmul_backward_f32(float* dinp, float* dw, float* dbias, const float* dout,
                                      const float* inp, const float* w, int M, int K, int N,
                                      WLayout layout) {
  if (M <= 0 || N <= 0) return;
  if (K > 0 && (dinp || dw)) {
    const void* w16 = dinp ? persistent(w, size_t(K) * N) : nullptr;
    noted([&] { gemm_->backward(dinp, dw, dout, inp, w, M, K, N, layout == WLayout::InOut, w16); });
    op(cudaSuccess, "matmul_backward (dinp, dW)");
  }
  if (dbias) {
    void* ws = workspace(kern::colsum_ws_bytes(M, N));
    op(kern::colsum_accumulate(dbias, dout, M, N, ws, stream_), "matmul_backward (dbias)");
  }
}

}  // namespace nlp::cuda
