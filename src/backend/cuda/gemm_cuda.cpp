// Row-major GEMMs on cuBLASLt (see gemm.h). A row-major R[a,b] is the column-major R^T with leading
// dimension b, so Y[M,P] = X[M,Q] @ Z[Q,P] is computed as the column-major Y^T[P,M] = Z^T[P,Q] X^T[Q,M]:
// cuBLASLt A = Z, B = X, m = P, n = M, k = Q; a stored transpose becomes op = T on that operand.
// Plans (descriptors + the heuristic's first algorithm) are cached per shape, transposes, epilogue
// and pointer alignments; the same plan gives the same bits every call.
#include "backend/cuda/gemm.h"

#include "core/error.h"
#include "../../../kernels/kernels.cuh"  // the repository root is not an include directory

namespace nlp::cuda {
namespace {

constexpr size_t kWorkspaceBytes = size_t(32) << 20;  // cuBLASLt workspace (Hopper: 32 MiB)

void ck_lt(cublasStatus_t st, const char* what) {
  if (st != CUBLAS_STATUS_SUCCESS)
    throw Error(cat("cuda backend: ", what, " failed: ", cublasGetStatusName(st), " (",
                    cublasGetStatusString(st), ")"));
}

void ck_rt(cudaError_t e, const char* what) {
  if (e != cudaSuccess)
    throw Error(cat("cuda backend: ", what, " failed: ", cudaGetErrorString(e)));
}

// Largest power of two (<= 256) dividing the address.
uint32_t alignment(const void* p) {
  const uintptr_t a = reinterpret_cast<uintptr_t>(p);
  uint32_t al = 256;
  while (al > 1 && (a % al) != 0) al >>= 1;
  return al;
}

}  // namespace

Gemm::Gemm(cudaStream_t s, GemmMode mode, Bf16Operands operands)
    : stream_(s), mode_(mode), operands_(operands) {
  ck_lt(cublasLtCreate(&lt_), "cublasLtCreate");
  ck_lt(cublasCreate(&blas_), "cublasCreate");
  ck_lt(cublasSetStream(blas_, stream_), "cublasSetStream");
  ck_lt(cublasSetMathMode(blas_, CUBLAS_PEDANTIC_MATH), "cublasSetMathMode");  // no TF32
  ck_rt(cudaMalloc(&workspace_, kWorkspaceBytes), "cudaMalloc(cuBLASLt workspace)");
  workspace_bytes_ = kWorkspaceBytes;
  // The cublasGemmEx fallback shares cuBLASLt's workspace (one stream: the two never overlap).
  // Without it cuBLAS takes workspace from its own pool, which may allocate on first use, and an
  // allocation while a CUDA graph is being recorded (run.cuda_graph) would end up inside the graph.
  // Set after cublasSetStream, which resets a handle's workspace to the pool.
  ck_lt(cublasSetWorkspace(blas_, workspace_, workspace_bytes_), "cublasSetWorkspace");
}

Gemm::~Gemm() {
  for (auto& [k, p] : plans_) {
    if (p.a) cublasLtMatrixLayoutDestroy(p.a);
    if (p.b) cublasLtMatrixLayoutDestroy(p.b);
    if (p.c) cublasLtMatrixLayoutDestroy(p.c);
    if (p.desc) cublasLtMatmulDescDestroy(p.desc);
  }
  cudaStreamSynchronize(stream_);
  if (bf16_) cudaFreeAsync(bf16_, stream_);
  cudaStreamSynchronize(stream_);
  if (blas_) cublasDestroy(blas_);  // before the workspace it was given
  if (lt_) cublasLtDestroy(lt_);
  if (workspace_) cudaFree(workspace_);
}

Gemm::Plan& Gemm::plan(const Key& key, const float* bias) {
  auto it = plans_.find(key);
  if (it != plans_.end()) return it->second;
  const auto [opa, opb, m, n, k, use_bias, ala, alb, alc, albias] = key;
  (void)albias;
  Plan p;
  const cublasOperation_t ta = opa ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cublasOperation_t tb = opb ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cublasComputeType_t compute = compute_type();
  const cudaDataType_t ab = operand_type();
  ck_lt(cublasLtMatmulDescCreate(&p.desc, compute, CUDA_R_32F), "cublasLtMatmulDescCreate");
  ck_lt(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta), "set TRANSA");
  ck_lt(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb), "set TRANSB");
  if (use_bias) {
    const cublasLtEpilogue_t epi = CUBLASLT_EPILOGUE_BIAS;
    const cudaDataType_t bt = CUDA_R_32F;
    ck_lt(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof epi), "set EPILOGUE");
    ck_lt(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bt, sizeof bt), "set BIAS_DATA_TYPE");
    // the heuristic reads the bias pointer's alignment
    ck_lt(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof bias), "set BIAS_POINTER");
  }
  // stored shapes (column-major): A is m x k (op N) or k x m (op T); B is k x n or n x k; C is m x n
  ck_lt(cublasLtMatrixLayoutCreate(&p.a, ab, opa ? k : m, opa ? m : k, opa ? k : m), "layout A");
  ck_lt(cublasLtMatrixLayoutCreate(&p.b, ab, opb ? n : k, opb ? k : n, opb ? n : k), "layout B");
  ck_lt(cublasLtMatrixLayoutCreate(&p.c, CUDA_R_32F, m, n, m), "layout C");

  cublasLtMatmulPreference_t pref = nullptr;
  ck_lt(cublasLtMatmulPreferenceCreate(&pref), "cublasLtMatmulPreferenceCreate");
  const uint64_t ws = workspace_bytes_;
  cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws);
  cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &ala, sizeof ala);
  cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &alb, sizeof alb);
  cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &alc, sizeof alc);
  cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &alc, sizeof alc);
  cublasLtMatmulHeuristicResult_t res{};
  int returned = 0;
  const cublasStatus_t st =
      cublasLtMatmulAlgoGetHeuristic(lt_, p.desc, p.a, p.b, p.c, p.c, pref, 1, &res, &returned);
  cublasLtMatmulPreferenceDestroy(pref);
  if (st == CUBLAS_STATUS_SUCCESS && returned > 0 && res.state == CUBLAS_STATUS_SUCCESS) {
    p.algo = res.algo;
    p.ok = true;
  }
  return plans_.emplace(key, p).first->second;
}

void Gemm::run(float* Y, const float* X, bool trans_x, const float* Z, bool trans_z, int M, int P,
               int Q, float beta, const float* bias, const void* z16) {
  if (M <= 0 || P <= 0 || Q <= 0) return;
  if (!copies()) {
    run_typed(Y, X, trans_x, Z, trans_z, M, P, Q, beta, bias);
    return;
  }
  const size_t nz = z16 ? 0 : size_t(P) * Q, nx = size_t(M) * Q;
  const size_t off = (nz * 2 + 255) / 256 * 256;
  char* buf = static_cast<char*>(bf16_scratch(off + nx * 2));
  kern::Bf16Copies c;  // both operands in one launch
  if (!z16) c.add(buf, Z, nz);
  c.add(buf + off, X, nx);
  ck_rt(kern::to_bf16_many(c, stream_, operands_), "to_bf16");
  if (after_cast_) after_cast_();
  run_typed(Y, buf + off, trans_x, z16 ? z16 : buf, trans_z, M, P, Q, beta, bias);
}

void Gemm::backward(float* dinp, float* dw, const float* dout, const float* inp, const float* w,
                    int M, int K, int N, bool inout, const void* w16) {
  if (M <= 0 || N <= 0 || K <= 0 || (!dinp && !dw)) return;
  const void *d = dout, *x = inp, *z = w;
  if (copies()) {
    auto al = [](size_t elems) { return (elems * 2 + 255) / 256 * 256; };
    const size_t nd = size_t(M) * N, nx = dw ? size_t(M) * K : 0;
    const size_t nw = dinp && !w16 ? size_t(K) * N : 0;
    char* buf = static_cast<char*>(bf16_scratch(al(nd) + al(nx) + al(nw)));
    kern::Bf16Copies c;  // the operands the two products read, in one launch
    c.add(buf, dout, nd);
    d = buf;
    if (dw) {
      c.add(buf + al(nd), inp, nx);
      x = buf + al(nd);
    }
    if (dinp && w16) {
      z = w16;
    } else if (dinp) {
      c.add(buf + al(nd) + al(nx), w, nw);
      z = buf + al(nd) + al(nx);
    }
    ck_rt(kern::to_bf16_many(c, stream_, operands_), "to_bf16");
    if (after_cast_) after_cast_();
  }
  // dinp[M,K] += dout[M,N] @ W^T  (InOut: W stored [K,N], so op T; OutIn: W stored [N,K])
  if (dinp) run_typed(dinp, d, false, z, inout, M, K, N, 1.0f, nullptr);
  if (dw) {
    if (inout)  // dW[K,N] += inp[M,K]^T @ dout[M,N]
      run_typed(dw, x, true, d, false, K, N, M, 1.0f, nullptr);
    else  // dW[N,K] += dout[M,N]^T @ inp[M,K]
      run_typed(dw, d, true, x, false, N, K, M, 1.0f, nullptr);
  }
}

void Gemm::run_typed(float* Y, const void* X, bool trans_x, const void* Z, bool trans_z, int M,
                     int P, int Q, float beta, const float* bias) {
  if (M <= 0 || P <= 0 || Q <= 0) return;
  NLP_ASSERT(!bias || beta == 0.0f);
  const int m = P, n = M, k = Q;
  const float alpha = 1.0f;
  const void* A = Z;  // the operands as cuBLASLt reads them
  const void* B = X;
  // The heuristic's alignment preferences cover A, B, C and D but not the bias: an epilogue kernel
  // may read the bias in 16-byte vectors, so a less aligned bias (e.g. qa_b + 1) never reaches it.
  const bool epilogue = bias && alignment(bias) >= 16;
  if (bias && !epilogue) {
    ck_rt(kern::broadcast_rows(Y, bias, M, P, stream_), "broadcast_rows");
    run_typed(Y, X, trans_x, Z, trans_z, M, P, Q, 1.0f, nullptr);
    return;
  }
  const Key key{trans_z ? 1 : 0, trans_x ? 1 : 0, m, n, k, epilogue, alignment(A),
                alignment(B), alignment(Y), epilogue ? alignment(bias) : 0u};
  Plan& p = plan(key, bias);
  if (p.ok) {
    if (epilogue)
      ck_lt(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias,
                                           sizeof bias),
            "set BIAS_POINTER");
    const cublasStatus_t st = cublasLtMatmul(lt_, p.desc, &alpha, A, p.a, B, p.b, &beta, Y, p.c,
                                             Y, p.c, &p.algo, workspace_, workspace_bytes_, stream_);
    if (st == CUBLAS_STATUS_SUCCESS) return;
    if (st != CUBLAS_STATUS_NOT_SUPPORTED) ck_lt(st, "cublasLtMatmul");
    p.ok = false;  // not supported after all: this shape takes the fallbacks below from now on
  }
  if (bias) {
    // no epilogue algorithm for this shape: the plain product onto bias-filled rows
    ck_rt(kern::broadcast_rows(Y, bias, M, P, stream_), "broadcast_rows");
    run_typed(Y, X, trans_x, Z, trans_z, M, P, Q, 1.0f, nullptr);
    return;
  }
  // cuBLAS fallback on the same operands (fp32 or bf16), fp32 accumulation and output; pedantic
  // math (no TF32) except where the compute type says otherwise
  const cublasOperation_t ta = trans_z ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cublasOperation_t tb = trans_x ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cudaDataType_t ab = operand_type();
  const cublasComputeType_t compute = compute_type();
  ck_lt(cublasGemmEx(blas_, ta, tb, m, n, k, &alpha, A, ab, trans_z ? k : m, B, ab, trans_x ? n : k,
                     &beta, Y, CUDA_R_32F, m, compute, CUBLAS_GEMM_DEFAULT),
        "cublasGemmEx");
}

cublasComputeType_t Gemm::compute_type() const {
  if (mode_ == GemmMode::Tf32) return CUBLAS_COMPUTE_32F_FAST_TF32;
  return CUBLAS_COMPUTE_32F;
}

// Grow-only scratch for the bf16 operand copies (stream order makes reuse safe).
void* Gemm::bf16_scratch(size_t bytes) {
  if (bytes <= bf16_bytes_) return bf16_;
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  ck_rt(cudaStreamIsCapturing(stream_, &capture), "cudaStreamIsCapturing");
  if (capture != cudaStreamCaptureStatusNone)
    throw Error(cat("cuda backend: the bf16 GEMM operand scratch would grow from ", bf16_bytes_,
                    " to ", bytes, " bytes while recording a CUDA graph"));
  ++bf16_grows_;
  if (bf16_) ck_rt(cudaFreeAsync(bf16_, stream_), "cudaFreeAsync(bf16 scratch)");
  bf16_ = nullptr;
  bf16_bytes_ = 0;
  const size_t n = (bytes + (size_t(1) << 20) - 1) / (size_t(1) << 20) * (size_t(1) << 20);
  ck_rt(cudaMallocAsync(&bf16_, n, stream_), "cudaMallocAsync(bf16 scratch)");
  bf16_bytes_ = n;
  return bf16_;
}

}  // namespace nlp::cuda
