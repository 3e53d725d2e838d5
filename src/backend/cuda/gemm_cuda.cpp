// Row-major GEMMs on cuBLASLt (see gemm.h). A row-major R[a,b] is the column-major R^T with leading
// dimension b, so Y[M,P] = X[M,Q] @ Z[Q,P] is computed as the column-major Y^T[P,M] = Z^T[P,Q] X^T[Q,M]:
// cuBLASLt A = Z, B = X, m = P, n = M, k = Q; a stored transpose becomes op = T on that operand.
// Plans (descriptors + the heuristic's first algorithm) are cached per shape, transposes, epilogue
// and pointer alignments; the same plan gives the same bits every call.
#include "backend/cuda/gemm.h"

#include <cstdlib>
#include <string>

#include "core/error.h"
#include "kernels.cuh"  // kernels/ (an include directory of CUDA builds)

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

bool is_bf16(cudaDataType_t t) { return t == CUDA_R_16BF; }
size_t elem_bytes(cudaDataType_t t) { return is_bf16(t) ? 2 : 4; }

void check_type(cudaDataType_t t, const char* what) {
  if (t != CUDA_R_32F && t != CUDA_R_16BF)
    throw Error(cat("cuda backend: GEMM ", what, ": storage type ", int(t),
                    " is neither fp32 (CUDA_R_32F) nor bf16 (CUDA_R_16BF)"));
}

// Consecutive pieces of one scratch buffer, each starting on a 256-byte boundary.
struct Carve {
  size_t bytes = 0;
  size_t take(size_t b) {
    const size_t at = bytes;
    bytes += (b + 255) / 256 * 256;
    return at;
  }
};

// The operand conversions of one typed call, launched together: fp32 -> bf16 in one to_bf16_many
// launch, bf16 -> fp32 one from_bf16 each.
struct Conversions {
  kern::Bf16Copies down;
  struct Up {
    float* dst;
    const void* src;
    size_t n;
  } up[kern::Bf16Copies::kMax];
  int nup = 0;
  // dst (type `to`) = src (the other type)
  void add(void* dst, cudaDataType_t to, const void* src, size_t n) {
    if (is_bf16(to))
      down.add(dst, static_cast<const float*>(src), n);
    else
      up[nup++] = Up{static_cast<float*>(dst), src, n};
  }
  bool any() const { return down.count > 0 || nup > 0; }
};

void convert(const Conversions& c, cudaStream_t s, kern::Bf16Cast cast,
             const std::function<void()>& after_cast) {
  if (c.down.count) ck_rt(kern::to_bf16_many(c.down, s, cast), "to_bf16");
  for (int i = 0; i < c.nup; ++i)
    ck_rt(kern::from_bf16(c.up[i].dst, c.up[i].src, c.up[i].n, s), "from_bf16");
  if (c.any() && after_cast) after_cast();
}

// Stands for an operand that will lie in scratch (256-byte aligned) when a plan is looked up
// before the scratch is allocated: only its address's alignment is read.
alignas(256) char kScratchLike[256];

}  // namespace

GemmEpilogues parse_gemm_epilogues(const char* v) {
  GemmEpilogues e;
  const std::string s = v ? v : "bias";
  if (s == "all") return e;
  e.bias = e.gelu_aux = e.dgelu = e.bgrad = false;
  if (s == "none") return e;
  // "bias" or a comma list of kinds
  auto bad = [&](const std::string& why) {
    return Error(cat("NLPTRAIN_CUDA_GEMM_EPILOGUES = '", s, "': ", why,
                     "; expected all, none, or a comma list of bias, gelu_aux, dgelu, bgrad (the "
                     "default: bias)"));
  };
  size_t at = 0;
  while (true) {
    const size_t comma = s.find(',', at);
    const std::string k = s.substr(at, comma == std::string::npos ? std::string::npos : comma - at);
    bool* slot = k == "bias"       ? &e.bias
                 : k == "gelu_aux" ? &e.gelu_aux
                 : k == "dgelu"    ? &e.dgelu
                 : k == "bgrad"    ? &e.bgrad
                                   : nullptr;
    if (!slot) throw bad(k.empty() ? std::string("an empty kind") : cat("unknown kind '", k, "'"));
    if (*slot) throw bad(cat("'", k, "' given twice"));
    *slot = true;
    if (comma == std::string::npos) break;
    at = comma + 1;
  }
  return e;
}

GemmEpilogues gemm_epilogues_from_env() {
  return parse_gemm_epilogues(std::getenv("NLPTRAIN_CUDA_GEMM_EPILOGUES"));
}

Gemm::Gemm(cudaStream_t s, GemmMode mode, Bf16Operands operands)
    : stream_(s), mode_(mode), operands_(operands), epilogues_(gemm_epilogues_from_env()) {
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
  for (auto& [k, p] : tplans_) {
    if (p.a) cublasLtMatrixLayoutDestroy(p.a);
    if (p.b) cublasLtMatrixLayoutDestroy(p.b);
    if (p.c) cublasLtMatrixLayoutDestroy(p.c);
    if (p.desc) cublasLtMatmulDescDestroy(p.desc);
  }
  cudaStreamSynchronize(stream_);
  bf16_.free_async(stream_);
  cudaStreamSynchronize(stream_);
  if (blas_) cublasDestroy(blas_);  // before the workspace it was given
  if (lt_) cublasLtDestroy(lt_);
  if (workspace_) cudaFree(workspace_);
}

// A plan's descriptor (fp32 scale) with its transposes; the epilogue's attributes come after it.
void Gemm::begin_plan(Plan& p, int opa, int opb, cublasComputeType_t compute) const {
  const cublasOperation_t ta = opa ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cublasOperation_t tb = opb ? CUBLAS_OP_T : CUBLAS_OP_N;
  ck_lt(cublasLtMatmulDescCreate(&p.desc, compute, CUDA_R_32F), "cublasLtMatmulDescCreate");
  ck_lt(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta), "set TRANSA");
  ck_lt(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb), "set TRANSB");
}

// The plan's layouts (A and B in ab, C = D in c) and the heuristic's first algorithm for the
// operands' alignments within the cuBLASLt workspace (p.ok: one was found).
void Gemm::end_plan(Plan& p, int opa, int opb, int m, int n, int k, cudaDataType_t ab,
                    cudaDataType_t c, uint32_t ala, uint32_t alb, uint32_t alc) const {
  // stored shapes (column-major): A is m x k (op N) or k x m (op T); B is k x n or n x k; C is m x n
  ck_lt(cublasLtMatrixLayoutCreate(&p.a, ab, opa ? k : m, opa ? m : k, opa ? k : m), "layout A");
  ck_lt(cublasLtMatrixLayoutCreate(&p.b, ab, opb ? n : k, opb ? k : n, opb ? n : k), "layout B");
  ck_lt(cublasLtMatrixLayoutCreate(&p.c, c, m, n, m), "layout C");

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
}

Gemm::Plan& Gemm::plan(const Key& key, const float* bias) {
  auto it = plans_.find(key);
  if (it != plans_.end()) return it->second;
  const auto [opa, opb, m, n, k, use_bias, ala, alb, alc, albias] = key;
  (void)albias;
  Plan p;
  const cudaDataType_t ab = operand_type();
  begin_plan(p, opa, opb, compute_type());
  if (use_bias) {
    const cublasLtEpilogue_t epi = CUBLASLT_EPILOGUE_BIAS;
    const cudaDataType_t bt = CUDA_R_32F;
    ck_lt(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof epi), "set EPILOGUE");
    ck_lt(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bt, sizeof bt), "set BIAS_DATA_TYPE");
    // the heuristic reads the bias pointer's alignment
    ck_lt(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof bias), "set BIAS_POINTER");
  }
  end_plan(p, opa, opb, m, n, k, ab, CUDA_R_32F, ala, alb, alc);
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
  to16_ += c.count;
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
    to16_ += c.count;
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
    ++fallback_.bias;
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
    if (st == CUBLAS_STATUS_SUCCESS) {
      if (epilogue) ++fused_.bias;
      return;
    }
    if (st != CUBLAS_STATUS_NOT_SUPPORTED) ck_lt(st, "cublasLtMatmul");
    p.ok = false;  // not supported after all: this shape takes the fallbacks below from now on
  }
  if (bias) {
    // no epilogue algorithm for this shape: the plain product onto bias-filled rows
    ++fallback_.bias;
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

// ---- typed operands ----

Gemm::Plan& Gemm::typed_plan(const TKey& key, const void* bias, const void* aux) {
  auto it = tplans_.find(key);
  if (it != tplans_.end()) return it->second;
  const auto [opa, opb, m, n, k, abt, ct, epi_i, ala, alb, alc, albias, alaux] = key;
  (void)albias;
  (void)alaux;
  const Epi epi = static_cast<Epi>(epi_i);
  const cudaDataType_t ab = static_cast<cudaDataType_t>(abt), c = static_cast<cudaDataType_t>(ct);
  Plan p;
  begin_plan(p, opa, opb, compute_type());
  if (epi != Epi::None) {
    cublasLtEpilogue_t e = CUBLASLT_EPILOGUE_DEFAULT;
    switch (epi) {
      case Epi::Bias: e = CUBLASLT_EPILOGUE_BIAS; break;
      case Epi::GeluAux: e = CUBLASLT_EPILOGUE_GELU_AUX; break;
      case Epi::GeluAuxBias: e = CUBLASLT_EPILOGUE_GELU_AUX_BIAS; break;
      case Epi::DGelu: e = CUBLASLT_EPILOGUE_DGELU; break;
      case Epi::BGradA: e = CUBLASLT_EPILOGUE_BGRADA; break;
      case Epi::BGradB: e = CUBLASLT_EPILOGUE_BGRADB; break;
      case Epi::None: break;
    }
    ck_lt(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &e, sizeof e), "set EPILOGUE");
  }
  if (bias) {
    // The bias (BIAS, GELU_AUX_BIAS) and the bias gradient (BGRADA/B) in D's type: cuBLASLt's rule
    // outside IMMA and FP8 kernels (a bf16 D takes a bf16 bias; BGRAD writes into the fp32 dW's
    // type). The heuristic reads the pointer's alignment.
    const cudaDataType_t bt = c;
    ck_lt(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bt, sizeof bt), "set BIAS_DATA_TYPE");
    ck_lt(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof bias), "set BIAS_POINTER");
  }
  if (aux) {
    // GELU's pre-activation in D's type and layout: column-major m x n with leading dimension m
    // (the row-major [n, m] matrix); cuBLASLt wants the leading dimension divisible by 8
    const int64_t ld = m;
    ck_lt(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &ld, sizeof ld), "set EPILOGUE_AUX_LD");
    ck_lt(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &aux, sizeof aux), "set EPILOGUE_AUX_POINTER");
  }
  end_plan(p, opa, opb, m, n, k, ab, c, ala, alb, alc);
  return tplans_.emplace(key, p).first->second;
}

bool Gemm::lt(void* Y, cudaDataType_t yt, const void* X, bool trans_x, const void* Z, bool trans_z,
              int M, int P, int Q, float beta, Epi epi, const void* bias, const void* aux,
              bool probe_only) {
  const int m = P, n = M, k = Q;  // row-major Y = X Z as column-major Y^T = Z^T X^T (top of file)
  const cudaDataType_t ab = operand_type();
  const TKey key{trans_z ? 1 : 0, trans_x ? 1 : 0, m, n, k, int(ab), int(yt), int(epi),
                 alignment(Z), alignment(X), alignment(Y), bias ? alignment(bias) : 0u,
                 aux ? alignment(aux) : 0u};
  Plan& p = typed_plan(key, bias, aux);
  if (!p.ok) return false;
  if (probe_only) return true;
  if (bias)
    ck_lt(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof bias),
          "set BIAS_POINTER");
  if (aux)
    ck_lt(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &aux,
                                         sizeof aux),
          "set EPILOGUE_AUX_POINTER");
  const float alpha = 1.0f;
  const cublasStatus_t st = cublasLtMatmul(lt_, p.desc, &alpha, Z, p.a, X, p.b, &beta, Y, p.c, Y,
                                           p.c, &p.algo, workspace_, workspace_bytes_, stream_);
  if (st == CUBLAS_STATUS_SUCCESS) return true;
  // Not supported after all (an epilogue combination of types the heuristic offered but the
  // kernel refuses reads as an invalid value): this key takes the fallbacks from now on.
  if (st != CUBLAS_STATUS_NOT_SUPPORTED && !(epi != Epi::None && st == CUBLAS_STATUS_INVALID_VALUE))
    ck_lt(st, "cublasLtMatmul");
  p.ok = false;
  return false;
}

void Gemm::plain(void* Y, cudaDataType_t yt, const void* X, bool trans_x, const void* Z,
                 bool trans_z, int M, int P, int Q, float beta) {
  const cudaDataType_t ab = operand_type();
  NLP_ASSERT(is_bf16(ab) || !is_bf16(yt));  // fp32 operands write fp32 only
  if (lt(Y, yt, X, trans_x, Z, trans_z, M, P, Q, beta, Epi::None, nullptr, nullptr)) return;
  const int m = P, n = M, k = Q;
  const float alpha = 1.0f;
  const cublasOperation_t ta = trans_z ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cublasOperation_t tb = trans_x ? CUBLAS_OP_T : CUBLAS_OP_N;
  ck_lt(cublasGemmEx(blas_, ta, tb, m, n, k, &alpha, Z, ab, trans_z ? k : m, X, ab, trans_x ? n : k,
                     &beta, Y, yt, m, compute_type(), CUBLAS_GEMM_DEFAULT),
        "cublasGemmEx");
}

void Gemm::forward(GemmOut Y, GemmIn X, bool trans_x, const float* Z, bool trans_z, int M, int P,
                   int Q, float beta, const float* bias, const void* z16, void* gelu_aux,
                   const void* bias16) {
  forward_impl(Y, X, trans_x, Z, trans_z, M, P, Q, beta, bias, z16, gelu_aux, bias16, true);
}

void Gemm::forward_impl(GemmOut Y, GemmIn X, bool trans_x, const float* Z, bool trans_z, int M,
                        int P, int Q, float beta, const float* bias, const void* z16,
                        void* gelu_aux, const void* bias16, bool allow_epilogue) {
  if (M <= 0 || P <= 0 || Q <= 0) return;
  check_type(Y.t, "output");
  check_type(X.t, "input");
  NLP_ASSERT(!bias || beta == 0.0f);
  NLP_ASSERT(!gelu_aux || beta == 0.0f);
  const cudaDataType_t ot = operand_type();
  const bool bf = is_bf16(ot);
  const size_t nx = size_t(M) * Q, nz = size_t(P) * Q, ny = size_t(M) * P;
  const bool cx = X.t != ot, cz = bf && !z16;
  const bool direct = bf || !is_bf16(Y.t);  // cuBLAS writes Y's type from these operands
  const bool asked = bias || gelu_aux;
  // The epilogue's bias in D's type: the fp32 bias for an fp32 Y; for a bf16 Y its bf16 rounding,
  // bias16 where given, else rounded into scratch (cb16).
  const bool b16 = bias && is_bf16(Y.t);
  const bool cb16 = b16 && !bias16;
  const void* bias_probe = !bias ? nullptr : !b16 ? static_cast<const void*>(bias)
                                   : bias16   ? bias16
                                              : static_cast<const void*>(kScratchLike);

  // The epilogue where one is asked for, switched on, and its pointers aligned as cuBLASLt needs
  // (bias and aux 16 bytes; aux leading dimension P divisible by 8); then whether an algorithm
  // takes it. Operands converted into scratch lie on 256-byte boundaries.
  Epi epi = Epi::None;
  if (allow_epilogue && direct && (!bias || alignment(bias_probe) >= 16)) {
    if (gelu_aux && epilogues_.gelu_aux && P % 8 == 0 && alignment(gelu_aux) >= 16)
      epi = bias ? Epi::GeluAuxBias : Epi::GeluAux;
    else if (!gelu_aux && bias && epilogues_.bias)
      epi = Epi::Bias;
  }
  const void* zsrc = bf ? (z16 ? z16 : nullptr) : Z;
  bool fused = false;
  if (epi != Epi::None)
    fused = lt(Y.p, Y.t, cx ? kScratchLike : X.p, trans_x, zsrc ? zsrc : kScratchLike, trans_z, M, P,
               Q, beta, epi, bias_probe, gelu_aux, /*probe_only=*/true);

  // scratch: converted operands (and the bf16 bias), then the fp32 result where the output is not
  // written directly
  const bool need_r = !fused && (gelu_aux || !direct || (bias && is_bf16(Y.t)));
  const bool cb = fused && cb16;
  Carve c;
  const size_t ox = cx ? c.take(nx * elem_bytes(ot)) : 0;
  const size_t oz = cz ? c.take(nz * 2) : 0;
  const size_t ob = cb ? c.take(size_t(P) * 2) : 0;
  const size_t orr = need_r ? c.take(ny * sizeof(float)) : 0;
  char* buf = c.bytes ? static_cast<char*>(bf16_scratch(c.bytes)) : nullptr;
  Conversions conv;
  if (cx) conv.add(buf + ox, ot, X.p, nx);
  if (cz) conv.add(buf + oz, ot, Z, nz);
  if (cb) conv.add(buf + ob, CUDA_R_16BF, bias, size_t(P));
  convert(conv, stream_, operands_, after_cast_);
  to16_ += conv.down.count;
  to32_ += conv.nup;
  const void* x = cx ? buf + ox : X.p;
  const void* z = cz ? buf + oz : (bf ? z16 : Z);
  const void* bias_epi = !b16 ? static_cast<const void*>(bias) : cb ? buf + ob : bias16;

  if (fused) {
    if (lt(Y.p, Y.t, x, trans_x, z, trans_z, M, P, Q, beta, epi, bias_epi, gelu_aux)) {
      ++(gelu_aux ? fused_.gelu_aux : fused_.bias);
      return;
    }
    // refused at run time (nothing computed): again without the epilogue
    forward_impl(Y, X, trans_x, Z, trans_z, M, P, Q, beta, bias, z16, gelu_aux, bias16, false);
    return;
  }
  if (asked) ++(gelu_aux ? fallback_.gelu_aux : fallback_.bias);
  float* r = need_r ? reinterpret_cast<float*>(buf + orr) : nullptr;
  if (gelu_aux) {  // r = X Z + bias; Y = gelu(r), aux = r
    if (bias) ck_rt(kern::broadcast_rows(r, bias, M, P, stream_), "broadcast_rows");
    plain(r, CUDA_R_32F, x, trans_x, z, trans_z, M, P, Q, bias ? 1.0f : 0.0f);
    ck_rt(kern::gemm_gelu_aux_bf16(Y.p, gelu_aux, r, ny, is_bf16(Y.t), stream_), "gemm_gelu_aux_bf16");
    if (is_bf16(Y.t)) to16_ += 2;  // Y and aux rounded from the fp32 r
  } else if (bias && !is_bf16(Y.t)) {  // the product onto bias-filled rows
    ck_rt(kern::broadcast_rows(static_cast<float*>(Y.p), bias, M, P, stream_), "broadcast_rows");
    plain(Y.p, Y.t, x, trans_x, z, trans_z, M, P, Q, 1.0f);
  } else if (bias) {  // the same in fp32 scratch, then one rounding to bf16
    ck_rt(kern::broadcast_rows(r, bias, M, P, stream_), "broadcast_rows");
    plain(r, CUDA_R_32F, x, trans_x, z, trans_z, M, P, Q, 1.0f);
    ck_rt(kern::gemm_store_bf16(Y.p, r, ny, false, stream_), "gemm_store_bf16");
    ++to16_;
  } else if (direct) {
    plain(Y.p, Y.t, x, trans_x, z, trans_z, M, P, Q, beta);
  } else {  // fp32 operands, bf16 Y: the fp32 product, then Y = bf16(r) or bf16(Y + r)
    plain(r, CUDA_R_32F, x, trans_x, z, trans_z, M, P, Q, 0.0f);
    ck_rt(kern::gemm_store_bf16(Y.p, r, ny, beta != 0.0f, stream_), "gemm_store_bf16");
    ++to16_;
  }
}

void Gemm::backward(GemmOut dinp, float dinp_beta, float* dw, float* dbias, GemmIn dout,
                    GemmIn inp, const float* w, int M, int K, int N, bool inout, const void* w16,
                    const void* gelu_aux) {
  backward_impl(dinp, dinp_beta, dw, dbias, dout, inp, w, M, K, N, inout, w16, gelu_aux, true);
}

void Gemm::backward_impl(GemmOut dinp, float dinp_beta, float* dw, float* dbias, GemmIn dout,
                         GemmIn inp, const float* w, int M, int K, int N, bool inout,
                         const void* w16, const void* gelu_aux, bool allow_epilogue) {
  if (M <= 0 || N <= 0) return;
  const bool want_in = dinp.p && K > 0, want_w = dw && K > 0;
  if (!want_in && !want_w && !dbias) return;
  check_type(dout.t, "output gradient");
  if (want_in) check_type(dinp.t, "input gradient");
  if (want_w) check_type(inp.t, "input");
  NLP_ASSERT(!gelu_aux || dinp_beta == 0.0f);
  const cudaDataType_t ot = operand_type();
  const bool bf = is_bf16(ot);
  const size_t nd = size_t(M) * N, nx = size_t(M) * K, nw = size_t(K) * N;
  const bool cd = (want_in || want_w) && dout.t != ot;
  const bool cx = want_w && inp.t != ot;
  const bool cw = want_in && bf && !w16;
  const bool direct_in = bf || !is_bf16(dinp.t);
  const void* dprobe = cd ? kScratchLike : dout.p;
  const void* xprobe = cx ? kScratchLike : inp.p;
  const void* wprobe = cw ? kScratchLike : (bf ? w16 : w);

  // dinp's epilogue: DGELU (aux leading dimension K divisible by 8, aux 16-byte aligned)
  bool dgelu = false;
  if (want_in && gelu_aux && allow_epilogue && epilogues_.dgelu && direct_in && K % 8 == 0 &&
      alignment(gelu_aux) >= 16)
    dgelu = lt(dinp.p, dinp.t, dprobe, false, wprobe, inout, M, K, N, 0.0f, Epi::DGelu, nullptr,
               gelu_aux, true);
  // dW's epilogue: the bias gradient of dout, reduced over the product's k = M. InOut: A = dout
  // (dW[K,N] = inp^T dout, column-major D is N x K): BGRADA; OutIn: B = dout (dW[N,K] = dout^T inp,
  // D is K x N): BGRADB. It writes the sums (scratch bg), which are then added to dbias. Only where
  // the product reads dout as stored (not a bf16 rounding of an fp32 dout), so that the bias
  // gradient is the column sum of dout either way.
  const Epi bgrad = inout ? Epi::BGradA : Epi::BGradB;
  bool fused_bias = false;
  if (want_w && dbias && !cd && allow_epilogue && epilogues_.bgrad) {
    fused_bias = inout ? lt(dw, CUDA_R_32F, xprobe, true, dprobe, false, K, N, M, 1.0f, bgrad,
                            kScratchLike, nullptr, true)
                       : lt(dw, CUDA_R_32F, dprobe, true, xprobe, false, N, K, M, 1.0f, bgrad,
                            kScratchLike, nullptr, true);
  }

  const bool need_r = want_in && (!direct_in || (gelu_aux && !dgelu));
  Carve c;
  const size_t od = cd ? c.take(nd * elem_bytes(ot)) : 0;
  const size_t ox = cx ? c.take(nx * elem_bytes(ot)) : 0;
  const size_t ow = cw ? c.take(nw * 2) : 0;
  const size_t orr = need_r ? c.take(nx * sizeof(float)) : 0;
  const size_t obg = fused_bias ? c.take(size_t(N) * sizeof(float)) : 0;
  const size_t ows = dbias ? c.take(kern::colsum_ws_bytes(M, N)) : 0;  // the colsum fallback's
  char* buf = c.bytes ? static_cast<char*>(bf16_scratch(c.bytes)) : nullptr;
  Conversions conv;
  if (cd) conv.add(buf + od, ot, dout.p, nd);
  if (cx) conv.add(buf + ox, ot, inp.p, nx);
  if (cw) conv.add(buf + ow, ot, w, nw);
  convert(conv, stream_, operands_, after_cast_);
  to16_ += conv.down.count;
  to32_ += conv.nup;
  const void* d = cd ? buf + od : dout.p;
  const void* x = cx ? buf + ox : inp.p;
  const void* z = cw ? buf + ow : (bf ? w16 : w);

  // dinp[M,K] = dout[M,N] @ W^T (+ dinp_beta dinp)  (InOut: W stored [K,N], so op T)
  if (want_in) {
    if (dgelu) {
      if (lt(dinp.p, dinp.t, d, false, z, inout, M, K, N, 0.0f, Epi::DGelu, nullptr, gelu_aux)) {
        ++fused_.dgelu;
      } else {  // refused at run time, before anything was written: again without epilogues
        backward_impl(dinp, dinp_beta, dw, dbias, dout, inp, w, M, K, N, inout, w16, gelu_aux, false);
        return;
      }
    } else {
      if (gelu_aux) ++fallback_.dgelu;
      float* r = need_r ? reinterpret_cast<float*>(buf + orr) : nullptr;
      if (gelu_aux) {  // r = dout W^T; dinp = r * gelu'(aux)
        plain(r, CUDA_R_32F, d, false, z, inout, M, K, N, 0.0f);
        ck_rt(kern::gemm_dgelu_aux_bf16(dinp.p, r, gelu_aux, nx, is_bf16(dinp.t), stream_),
              "gemm_dgelu_aux_bf16");
        if (is_bf16(dinp.t)) ++to16_;
      } else if (direct_in) {
        plain(dinp.p, dinp.t, d, false, z, inout, M, K, N, dinp_beta);
      } else {
        plain(r, CUDA_R_32F, d, false, z, inout, M, K, N, 0.0f);
        ck_rt(kern::gemm_store_bf16(dinp.p, r, nx, dinp_beta != 0.0f, stream_), "gemm_store_bf16");
        ++to16_;
      }
    }
  }
  // dW += inp^T @ dout in W's layout, with dout's column sums from the epilogue where it runs
  bool bias_done = false;
  if (want_w) {
    if (fused_bias) {
      float* bg = reinterpret_cast<float*>(buf + obg);
      bias_done = inout ? lt(dw, CUDA_R_32F, x, true, d, false, K, N, M, 1.0f, bgrad, bg, nullptr)
                        : lt(dw, CUDA_R_32F, d, true, x, false, N, K, M, 1.0f, bgrad, bg, nullptr);
      if (bias_done) {
        ++fused_.bgrad;
        ck_rt(kern::accumulate(dbias, bg, size_t(N), stream_), "accumulate (bias gradient)");
      }
    }
    if (!bias_done) {
      if (inout)  // dW[K,N] += inp[M,K]^T @ dout[M,N]
        plain(dw, CUDA_R_32F, x, true, d, false, K, N, M, 1.0f);
      else  // dW[N,K] += dout[M,N]^T @ inp[M,K]
        plain(dw, CUDA_R_32F, d, true, x, false, N, K, M, 1.0f);
    }
  }
  if (dbias && !bias_done) {  // dbias[N] += colsum(dout): a separate deterministic reduction
    if (want_w) ++fallback_.bgrad;
    void* ws = buf + ows;
    if (!is_bf16(dout.t))
      ck_rt(kern::colsum_accumulate(dbias, static_cast<const float*>(dout.p), M, N, ws, stream_),
            "colsum_accumulate");
    else
      ck_rt(kern::gemm_colsum_bf16(dbias, dout.p, M, N, ws, stream_), "gemm_colsum_bf16");
  }
}

cublasComputeType_t Gemm::compute_type() const {
  if (mode_ == GemmMode::Tf32) return CUBLAS_COMPUTE_32F_FAST_TF32;
  return CUBLAS_COMPUTE_32F;
}

// Grow-only scratch for the bf16 operand copies (stream order makes reuse safe).
void* Gemm::bf16_scratch(size_t bytes) {
  return bf16_.get(
      bytes, stream_,
      [this](size_t held, size_t want) {
        cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
        ck_rt(cudaStreamIsCapturing(stream_, &capture), "cudaStreamIsCapturing");
        if (capture != cudaStreamCaptureStatusNone)
          throw Error(cat("cuda backend: the bf16 GEMM operand scratch would grow from ", held,
                          " to ", want, " bytes while recording a CUDA graph"));
      },
      ck_rt);
}

}  // namespace nlp::cuda
