// The typed GEMM of the CUDA backend (src/backend/cuda/gemm.h: Gemm::forward / Gemm::backward on
// fp32 or bf16 activations, with the cuBLASLt epilogues BIAS, GELU_AUX(_BIAS), DGELU, BGRADA/B and
// their plain fallbacks) against a CPU reference in double.
//  - The reference computes from the values the GPU multiplies: bf16 storage as stored, fp32
//    activations and the weights rounded to bf16 in Bf16 mode (round_bf16, as the operand casts),
//    fp32 in Fp32 mode. Outputs written with beta 0 are NaN-poisoned first, so an element the GPU
//    does not write fails; accumulated outputs start from random values.
//  - Tolerance per element, with S = sum over the K products of |a b| plus |bias| and |prior value|:
//      acc = (K + 2) * 2^-24 * S                 fp32 accumulation in any order (and fp32 products)
//      fp32 output:  acc + 2^-24 * (|ref| + acc)
//      bf16 output:  acc + 2^-8 * (|ref| + acc)   one rounding to nearest of the fp32 result
//                    (with a bias, acc also holds 2^-8 |bias|: the epilogue's bias has D's type,
//                    so a bf16 output's epilogue adds the bias rounded to bf16)
//      GELU output:  1.13 acc + 2^-10 |pre| + 2^-8 (|ref| + 1.13 acc)   (|gelu'| <= 1.13; 2^-10 |pre|
//                    allows the epilogue's own tanh evaluation: an approximate tanh with relative
//                    error 2^-11 moves 0.5 x tanh by at most 2^-12 |x|)
//      DGELU output: 1.13 acc + 2^-7 |dh| + 2^-8 (|ref| + 1.13 acc + 2^-7 |dh|)   (dh = dout W^T;
//                    with |aux| <= 3, gelu' moves by up to 4.8 times the tanh's absolute error)
//    A transposed operand, a missing bias or GELU, a wrong accumulate/overwrite or a wrong bias
//    gradient reduction misses these by orders of magnitude (values are O(1), K <= 64).
//  - GemmBf16Plain runs every case with the epilogues off (the plain product and
//    kernels/gemm_epilogue.cu); GemmBf16EpilogueBias, ...GeluAux, ...Dgelu and ...Bgrad run the cases
//    of one epilogue kind with only that kind on (cuBLASLt where an algorithm takes it), so that a
//    failure names one path (bench/gpu/run.sh switches that kind off). Shapes with leading
//    dimensions not divisible by 8 (like GPT-2's vocabulary of 50257) and a bias 4 bytes off
//    alignment take the fallbacks.
//  - CudaBackendBf16Views: the backend's matmul ops on bf16 views (native and staged) against the CPU
//    backend; tolerances stated there.
//  - GemmBf16Reference checks the references and tolerances themselves on the host: an emulated
//    correct kernel passes, results with a transposed weight, a missing bias, GELU or bias gradient,
//    or an overwrite for an accumulation fail.
//  - Without a usable GPU (or in a build without CUDA) every test is skipped with the reason, except
//    the host-only GemmBf16Reference and GemmEpiloguesEnv (CUDA builds).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/round.h"
#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/device.h"
#include "core/backend.h"
#include "core/error.h"
#include "model/model.h"
#include "train/batches.h"
#include "small_models.h"

#if NLPTRAIN_HAVE_CUDA
#include <cuda_runtime_api.h>

#include "backend/cuda/gemm.h"
#endif

namespace {

#if NLPTRAIN_HAVE_CUDA

using nlp::PathCounts;
using nlp::Precision;
using nlp::cuda::Gemm;
using nlp::cuda::GemmEpilogues;
using nlp::cuda::GemmIn;
using nlp::cuda::GemmOut;
using VD = std::vector<double>;

// Sets an environment variable for its scope; the earlier value (or its absence) comes back after.
struct ScopedEnvForTest {
  std::string name, old;
  bool had = false;
  ScopedEnvForTest(const char* n, const char* v) : name(n) {
    const char* o = std::getenv(n);
    had = o != nullptr;
    if (had) old = o;
    setenv(n, v, 1);
  }
  ~ScopedEnvForTest() {
    if (had)
      setenv(name.c_str(), old.c_str(), 1);
    else
      unsetenv(name.c_str());
  }
};

constexpr double kU32 = 0x1p-24;       // fp32 unit roundoff
constexpr double kU16 = 0x1p-8;        // bf16 unit roundoff (round to nearest)
constexpr double kGeluApprox = 0x1p-10;  // the epilogue's tanh in gelu, relative to |pre|
constexpr double kDgeluApprox = 0x1p-7;  // the epilogue's tanh in gelu', relative to |dh|
constexpr double kGeluSlope = 1.13;    // max |gelu_tanh'|
constexpr cudaDataType_t F32 = CUDA_R_32F;
constexpr cudaDataType_t BF16 = CUDA_R_16BF;

const char* tname(cudaDataType_t t) { return t == BF16 ? "bf16" : "fp32"; }
bool bf16(cudaDataType_t t) { return t == BF16; }
double rb(double v) { return nlp::cpu::round_bf16(float(v)); }

double gelu(double x) {
  return 0.5 * x * (1.0 + std::tanh(0.7978845608028654 * (x + 0.044715 * x * x * x)));
}
double dgelu(double x) {
  const double t = std::tanh(0.7978845608028654 * (x + 0.044715 * x * x * x));
  return 0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * 0.7978845608028654 * (1.0 + 3 * 0.044715 * x * x);
}

void ck(cudaError_t e, const char* what) {
  ASSERT_EQ(e, cudaSuccess) << what << ": " << cudaGetErrorString(e);
}

// A device matrix with its values as stored (exactly representable in its type).
struct Dev {
  void* p = nullptr;
  cudaDataType_t t = F32;
  size_t n = 0;
  VD v;  // host copy of the stored values
};

class GemmBf16 : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string why;
    if (nlp::cuda_device_count(&why) == 0) GTEST_SKIP() << "no CUDA device: " << why;
    ck(cudaStreamCreate(&s_), "cudaStreamCreate");
  }
  void TearDown() override {
    if (s_) cudaStreamSynchronize(s_);
    for (void* p : allocs_) cudaFree(p);
    if (s_) cudaStreamDestroy(s_);
  }

  void* alloc(size_t bytes) {
    void* p = nullptr;
    EXPECT_EQ(cudaMalloc(&p, bytes + 256), cudaSuccess);
    allocs_.push_back(p);
    return p;
  }
  // random values in [-a, a], stored in t; poisoned: the device copy NaN (every byte 0xff)
  Dev make(size_t n, cudaDataType_t t, double a, bool poisoned = false) {
    Dev d;
    d.t = t;
    d.n = n;
    d.p = alloc(n * 4);
    d.v.resize(n);
    std::uniform_real_distribution<float> u(-float(a), float(a));
    for (auto& x : d.v) x = bf16(t) ? rb(u(rng_)) : double(u(rng_));
    if (poisoned) {
      EXPECT_EQ(cudaMemset(d.p, 0xff, n * (bf16(t) ? 2 : 4)), cudaSuccess);
    } else {
      upload(d);
    }
    return d;
  }
  void upload(const Dev& d) {
    if (bf16(d.t)) {
      std::vector<uint16_t> b(d.n);
      for (size_t i = 0; i < d.n; ++i) b[i] = nlp::cpu::to_bf16_bits(float(d.v[i]));
      EXPECT_EQ(cudaMemcpy(d.p, b.data(), d.n * 2, cudaMemcpyHostToDevice), cudaSuccess);
    } else {
      std::vector<float> f(d.v.begin(), d.v.end());
      EXPECT_EQ(cudaMemcpy(d.p, f.data(), d.n * 4, cudaMemcpyHostToDevice), cudaSuccess);
    }
  }
  // the device values (synchronises)
  VD get(const void* p, cudaDataType_t t, size_t n) {
    EXPECT_EQ(cudaStreamSynchronize(s_), cudaSuccess);
    VD out(n);
    if (bf16(t)) {
      std::vector<uint16_t> b(n);
      EXPECT_EQ(cudaMemcpy(b.data(), p, n * 2, cudaMemcpyDeviceToHost), cudaSuccess);
      for (size_t i = 0; i < n; ++i) {
        const uint32_t u = uint32_t(b[i]) << 16;
        float f;
        std::memcpy(&f, &u, 4);
        out[i] = f;
      }
    } else {
      std::vector<float> f(n);
      EXPECT_EQ(cudaMemcpy(f.data(), p, n * 4, cudaMemcpyDeviceToHost), cudaSuccess);
      out.assign(f.begin(), f.end());
    }
    return out;
  }
  VD get(const Dev& d) { return get(d.p, d.t, d.n); }
  std::vector<uint8_t> bytes(const void* p, size_t n) {
    EXPECT_EQ(cudaStreamSynchronize(s_), cudaSuccess);
    std::vector<uint8_t> b(n);
    EXPECT_EQ(cudaMemcpy(b.data(), p, n, cudaMemcpyDeviceToHost), cudaSuccess);
    return b;
  }

  cudaStream_t s_ = nullptr;
  std::mt19937 rng_{1234};
  std::vector<void*> allocs_;
};

// The operand value the GEMM multiplies: bf16-rounded in Bf16 mode.
double op(double v, Precision mode) { return mode == Precision::Bf16 ? rb(v) : double(float(v)); }

// Elements of got outside ref +- tol (a non-finite got is outside); *first = the first of them.
size_t outside(const VD& got, const VD& ref, const VD& tol, size_t* first = nullptr) {
  if (got.size() != ref.size()) return std::max<size_t>(got.size(), 1);
  size_t bad = 0;
  for (size_t i = 0; i < got.size(); ++i)
    if (!std::isfinite(got[i]) || std::abs(got[i] - ref[i]) > tol[i]) {
      if (!bad && first) *first = i;
      ++bad;
    }
  return bad;
}

// got within tol of ref, element by element
void expect_close(const VD& got, const VD& ref, const VD& tol, const std::string& what) {
  ASSERT_EQ(got.size(), ref.size()) << what;
  size_t first = 0;
  const size_t bad = outside(got, ref, tol, &first);
  EXPECT_EQ(bad, 0u) << what << ": " << bad << " of " << got.size() << " outside; first [" << first
                     << "] got " << got[first] << " ref " << ref[first] << " tol " << tol[first];
}

double out_tol(double ref, double acc, cudaDataType_t t) {
  return acc + (bf16(t) ? kU16 : kU32) * (std::abs(ref) + acc);
}

// Row-major product reference: R[M,P] = X[M,Q] @ opZ, Z stored [Q,P] (trans_z false) or [P,Q];
// S[M,P] = sum of |products|. Operands as the GEMM multiplies them in `mode`.
void product(const VD& X, const VD& Z, bool trans_z, int M, int P, int Q, Precision mode, VD& R,
             VD& S) {
  R.assign(size_t(M) * P, 0.0);
  S.assign(size_t(M) * P, 0.0);
  for (int i = 0; i < M; ++i)
    for (int j = 0; j < P; ++j) {
      double r = 0, s = 0;
      for (int k = 0; k < Q; ++k) {
        const double a = op(X[size_t(i) * Q + k], mode);
        const double b = op(trans_z ? Z[size_t(j) * Q + k] : Z[size_t(k) * P + j], mode);
        r += a * b;
        s += std::abs(a * b);
      }
      R[size_t(i) * P + j] = r;
      S[size_t(i) * P + j] = s;
    }
}

struct Shape {
  int M, K, N;
};
// (K, N) = (64, 48): every leading dimension divisible by 8; (50, 61): none (the fallbacks)
const Shape kShapes[] = {{37, 64, 48}, {33, 50, 61}};

// Forward reference of Y[M,N] = X[M,K] @ W (+ bias[N]) (+ Y0), W stored [K,N] (outin false) or
// [N,K]; with gelu, pre = that sum and y = gelu_tanh(pre). Values and per-element tolerances.
struct FwdRef {
  VD y, ty, pre, tpre;
};
FwdRef forward_ref(const VD& X, const VD& W, bool outin, const double* bias, const VD* y0, bool gelu_,
                   int M, int N, int K, Precision mode, cudaDataType_t yt) {
  VD R, S;
  product(X, W, outin, M, N, K, mode, R, S);
  FwdRef f;
  f.y.resize(R.size());
  f.ty.resize(R.size());
  if (gelu_) f.pre = f.tpre = VD(R.size());
  for (int i = 0; i < M; ++i)
    for (int j = 0; j < N; ++j) {
      const size_t ij = size_t(i) * N + j;
      double r = R[ij], sabs = S[ij];
      if (bias) r += bias[j], sabs += std::abs(bias[j]);
      if (y0) r += (*y0)[ij], sabs += std::abs((*y0)[ij]);
      // a bf16 output's epilogue adds the bias rounded to bf16 (cuBLASLt's bias has D's type): up
      // to 2^-8 |bias| more
      const double acc = (K + 2) * kU32 * sabs + (bias && bf16(yt) ? kU16 * std::abs(bias[j]) : 0.0);
      if (!gelu_) {
        f.y[ij] = r;
        f.ty[ij] = out_tol(r, acc, yt);
        continue;
      }
      f.pre[ij] = r;
      f.tpre[ij] = out_tol(r, acc, yt);
      f.y[ij] = gelu(r);
      const double gacc = kGeluSlope * acc + kGeluApprox * std::abs(r);
      f.ty[ij] = gacc + (bf16(yt) ? kU16 : kU32) * (std::abs(f.y[ij]) + gacc);
    }
  return f;
}

// Backward reference: dinp[M,K] = dout @ W^T (+ beta dinp0), or with aux (DGELU)
// (dout @ W^T) * gelu_tanh'(aux); dW = dW0 (+ inp^T dout in W's layout); dbias = db0 (+ colsum dout).
struct BwdRef {
  VD di, tdi, dw, tdw, db, tdb;
};
BwdRef backward_ref(const VD& D, const VD& X, const VD& W, const VD& di0, const VD* aux,
                    const VD& dw0, const VD& db0, float beta, bool with_dw, bool with_dbias,
                    bool outin, int M, int K, int N, Precision mode, cudaDataType_t it) {
  BwdRef b;
  b.di.resize(size_t(M) * K);
  b.tdi.resize(b.di.size());
  for (int i = 0; i < M; ++i)  // W(k,n) = InOut W[k*N+n], OutIn W[n*K+k]
    for (int k = 0; k < K; ++k) {
      double r = 0, sabs = 0;
      for (int n = 0; n < N; ++n) {
        const double a = op(D[size_t(i) * N + n], mode);
        const double w = op(outin ? W[size_t(n) * K + k] : W[size_t(k) * N + n], mode);
        r += a * w;
        sabs += std::abs(a * w);
      }
      const size_t ik = size_t(i) * K + k;
      double acc = (N + 2) * kU32 * sabs;
      if (aux) {
        const double dacc = kGeluSlope * acc + kDgeluApprox * std::abs(r);
        b.di[ik] = r * dgelu((*aux)[ik]);
        b.tdi[ik] = dacc + (bf16(it) ? kU16 : kU32) * (std::abs(b.di[ik]) + dacc);
      } else {
        if (beta != 0.0f) r += di0[ik], acc += (N + 2) * kU32 * std::abs(di0[ik]);
        b.di[ik] = r;
        b.tdi[ik] = out_tol(r, acc, it);
      }
    }
  b.dw.resize(dw0.size());
  b.tdw.resize(dw0.size());
  for (int k = 0; k < K; ++k)
    for (int n = 0; n < N; ++n) {
      double r = 0, sabs = 0;
      if (with_dw)
        for (int i = 0; i < M; ++i) {
          const double a = op(X[size_t(i) * K + k], mode);
          const double d = op(D[size_t(i) * N + n], mode);
          r += a * d;
          sabs += std::abs(a * d);
        }
      const size_t at = outin ? size_t(n) * K + k : size_t(k) * N + n;
      r += dw0[at];
      sabs += std::abs(dw0[at]);
      b.dw[at] = r;
      b.tdw[at] = out_tol(r, (M + 2) * kU32 * sabs, F32);
    }
  b.db.resize(db0.size());
  b.tdb.resize(db0.size());
  for (int n = 0; n < N; ++n) {  // column sums of dout as stored
    double r = 0, sabs = 0;
    if (with_dbias)
      for (int i = 0; i < M; ++i) {
        r += D[size_t(i) * N + n];
        sabs += std::abs(D[size_t(i) * N + n]);
      }
    r += db0[n];
    sabs += std::abs(db0[n]);
    b.db[n] = r;
    b.tdb[n] = out_tol(r, (M + 2) * kU32 * sabs, F32);
  }
  return b;
}

// ---- the references and tolerances themselves (host only: runs without a GPU) ----------------------
// A correct kernel, emulated on the host (fp32 products summed in fp32 in reverse order, one
// rounding to the output type), lies within the tolerances; results with a transposed weight, a
// missing bias or GELU, an overwrite for an accumulation, or a missing bias gradient do not.

double store(float v, cudaDataType_t t) { return bf16(t) ? rb(v) : double(v); }
float gelu_f(float x) { return 0.5f * x * (1.0f + std::tanh(0.7978845608f * (x + 0.044715f * x * x * x))); }

// Y (gelu_part 0), gelu(Y) (1) or the pre-activation Y (2) as a correct kernel stores it
VD emulate_forward(const VD& X, const VD& W, bool outin, const double* bias, const VD* y0,
                   int gelu_part, int M, int N, int K, Precision mode, cudaDataType_t yt) {
  VD y(size_t(M) * N);
  for (int i = 0; i < M; ++i)
    for (int j = 0; j < N; ++j) {
      float acc = 0.f;
      for (int k = K - 1; k >= 0; --k)
        acc += float(op(X[size_t(i) * K + k], mode)) *
               float(op(outin ? W[size_t(j) * K + k] : W[size_t(k) * N + j], mode));
      if (bias) acc += float(bias[j]);
      if (y0) acc += float((*y0)[size_t(i) * N + j]);
      y[size_t(i) * N + j] = store(gelu_part == 1 ? gelu_f(acc) : acc, yt);
    }
  return y;
}

// dinp (with beta; with aux: times gelu'(aux), written), dW (+= in W's layout), dbias (+= colsum)
void emulate_backward(const VD& D, const VD& X, const VD& W, const VD& di0, const VD* aux,
                      const VD& dw0, const VD& db0, float beta, bool outin, int M, int K, int N,
                      Precision mode, cudaDataType_t it, VD& di, VD& dw, VD& db) {
  di.assign(size_t(M) * K, 0.0);
  for (int i = 0; i < M; ++i)
    for (int k = 0; k < K; ++k) {
      float acc = 0.f;
      for (int n = N - 1; n >= 0; --n)
        acc += float(op(D[size_t(i) * N + n], mode)) *
               float(op(outin ? W[size_t(n) * K + k] : W[size_t(k) * N + n], mode));
      const size_t ik = size_t(i) * K + k;
      if (aux) {
        const float x = float((*aux)[ik]);
        const float t = std::tanh(0.7978845608f * (x + 0.044715f * x * x * x));
        acc *= 0.5f * (1.f + t) + 0.5f * x * (1.f - t * t) * 0.7978845608f * (1.f + 3 * 0.044715f * x * x);
      } else if (beta != 0.0f) {
        acc += float(di0[ik]);
      }
      di[ik] = store(acc, it);
    }
  dw = dw0;
  for (int k = 0; k < K; ++k)
    for (int n = 0; n < N; ++n) {
      float acc = 0.f;
      for (int i = M - 1; i >= 0; --i)
        acc += float(op(X[size_t(i) * K + k], mode)) * float(op(D[size_t(i) * N + n], mode));
      const size_t at = outin ? size_t(n) * K + k : size_t(k) * N + n;
      dw[at] = double(float(dw0[at]) + acc);
    }
  db = db0;
  for (int n = 0; n < N; ++n) {
    float acc = 0.f;
    for (int i = M - 1; i >= 0; --i) acc += float(D[size_t(i) * N + n]);
    db[n] = double(float(db0[n]) + acc);
  }
}

TEST(GemmBf16Reference, CorrectResultsPassWrongOnesFail) {
  std::mt19937 rng(5);
  std::uniform_real_distribution<float> u(-1.f, 1.f);
  auto rnd = [&](size_t n, double a, bool round) {
    VD v(n);
    for (auto& x : v) x = round ? rb(a * u(rng)) : double(float(a * u(rng)));
    return v;
  };
  for (Precision mode : {Precision::Bf16, Precision::Fp32})
    for (const Shape& sh : kShapes)
      for (cudaDataType_t t : {F32, BF16})
        for (bool outin : {false, true}) {
          const int M = sh.M, K = sh.K, N = sh.N;
          SCOPED_TRACE(std::string(mode == Precision::Bf16 ? "bf16" : "fp32") + " M" +
                       std::to_string(M) + " K" + std::to_string(K) + " N" + std::to_string(N) +
                       " out " + tname(t) + (outin ? " OutIn" : " InOut"));
          const VD X = rnd(size_t(M) * K, 1.0, true), W = rnd(size_t(K) * N, 0.5, false);
          const VD B = rnd(N, 1.0, false), Y0 = rnd(size_t(M) * N, 2.0, bf16(t));
          const double* b = B.data();
          auto fwd = [&](bool o, const double* bias, const VD* y0, int part) {
            return emulate_forward(X, W, o, bias, y0, part, M, N, K, mode, t);
          };
          const FwdRef f = forward_ref(X, W, outin, b, nullptr, false, M, N, K, mode, t);
          EXPECT_EQ(outside(fwd(outin, b, nullptr, 0), f.y, f.ty), 0u) << "Y with bias";
          EXPECT_GT(outside(fwd(!outin, b, nullptr, 0), f.y, f.ty), 0u) << "transposed weights";
          EXPECT_GT(outside(fwd(outin, nullptr, nullptr, 0), f.y, f.ty), 0u) << "bias missing";
          const FwdRef f1 = forward_ref(X, W, outin, nullptr, &Y0, false, M, N, K, mode, t);
          EXPECT_EQ(outside(fwd(outin, nullptr, &Y0, 0), f1.y, f1.ty), 0u) << "Y, beta 1";
          EXPECT_GT(outside(fwd(outin, nullptr, nullptr, 0), f1.y, f1.ty), 0u) << "overwritten";
          const FwdRef g = forward_ref(X, W, outin, b, nullptr, true, M, N, K, mode, t);
          EXPECT_EQ(outside(fwd(outin, b, nullptr, 1), g.y, g.ty), 0u) << "gelu";
          EXPECT_EQ(outside(fwd(outin, b, nullptr, 2), g.pre, g.tpre), 0u) << "pre-activation";
          EXPECT_GT(outside(fwd(outin, b, nullptr, 2), g.y, g.ty), 0u) << "gelu missing";
          if (bf16(t)) {  // a bf16 output's epilogue adds the bias rounded to bf16: within tolerance
            VD Bb(B.size());
            for (size_t i = 0; i < B.size(); ++i) Bb[i] = rb(B[i]);
            EXPECT_EQ(outside(fwd(outin, Bb.data(), nullptr, 0), f.y, f.ty), 0u) << "Y with a bf16 bias";
            EXPECT_EQ(outside(fwd(outin, Bb.data(), nullptr, 1), g.y, g.ty), 0u) << "gelu with a bf16 bias";
            EXPECT_EQ(outside(fwd(outin, Bb.data(), nullptr, 2), g.pre, g.tpre), 0u)
                << "pre-activation with a bf16 bias";
          }

          const VD D = rnd(size_t(M) * N, 1.0, true), DI0 = rnd(size_t(M) * K, 1.0, bf16(t));
          const VD DW0 = rnd(size_t(K) * N, 1.0, false), DB0 = rnd(N, 1.0, false);
          const VD AUX = rnd(size_t(M) * K, 3.0, bf16(t));
          VD di, dw, db;
          const BwdRef r =
              backward_ref(D, X, W, DI0, nullptr, DW0, DB0, 1.0f, true, true, outin, M, K, N, mode, t);
          emulate_backward(D, X, W, DI0, nullptr, DW0, DB0, 1.0f, outin, M, K, N, mode, t, di, dw, db);
          EXPECT_EQ(outside(di, r.di, r.tdi), 0u) << "dinp";
          EXPECT_EQ(outside(dw, r.dw, r.tdw), 0u) << "dW";
          EXPECT_EQ(outside(db, r.db, r.tdb), 0u) << "dbias";
          EXPECT_GT(outside(DB0, r.db, r.tdb), 0u) << "bias gradient missing";
          EXPECT_GT(outside(DW0, r.dw, r.tdw), 0u) << "weight gradient missing";
          emulate_backward(D, X, W, DI0, nullptr, DW0, DB0, 0.0f, !outin, M, K, N, mode, t, di, dw, db);
          EXPECT_GT(outside(di, r.di, r.tdi), 0u) << "dinp overwritten, transposed";
          EXPECT_GT(outside(dw, r.dw, r.tdw), 0u) << "dW in the other layout";
          const BwdRef r0 =
              backward_ref(D, X, W, DI0, nullptr, DW0, DB0, 0.0f, true, true, outin, M, K, N, mode, t);
          emulate_backward(D, X, W, DI0, nullptr, DW0, DB0, 1.0f, outin, M, K, N, mode, t, di, dw, db);
          EXPECT_GT(outside(di, r0.di, r0.tdi), 0u) << "dinp accumulated where overwritten";
          const BwdRef rg =
              backward_ref(D, X, W, DI0, &AUX, DW0, DB0, 0.0f, true, true, outin, M, K, N, mode, t);
          emulate_backward(D, X, W, DI0, &AUX, DW0, DB0, 0.0f, outin, M, K, N, mode, t, di, dw, db);
          EXPECT_EQ(outside(di, rg.di, rg.tdi), 0u) << "DGELU";
          emulate_backward(D, X, W, DI0, nullptr, DW0, DB0, 0.0f, outin, M, K, N, mode, t, di, dw, db);
          EXPECT_GT(outside(di, rg.di, rg.tdi), 0u) << "gelu' missing";
        }
}

// ---- the suites: the plain typed GEMM, and each epilogue kind on its own ------------------------
// GemmBf16Plain runs every case with the epilogues off (the plain product and gemm_epilogue.cu);
// GemmBf16Epilogue<Kind> runs the cases that ask for that kind with only it switched on (cuBLASLt
// where an algorithm takes it, its fallback elsewhere), so a failure names the path that failed.

GemmEpilogues epilogues(const char* value) { return nlp::cuda::parse_gemm_epilogues(value); }
bool any_on(const GemmEpilogues& e) { return e.bias || e.gelu_aux || e.dgelu || e.bgrad; }
std::string epi_name(const GemmEpilogues& e) {
  std::string n;
  for (auto [on, k] : {std::pair{e.bias, "bias"}, std::pair{e.gelu_aux, "gelu_aux"},
                       std::pair{e.dgelu, "dgelu"}, std::pair{e.bgrad, "bgrad"}})
    if (on) n += std::string(n.empty() ? "" : ",") + k;
  return n.empty() ? "none" : n;
}

// ---- forward: Y = X @ W (+ bias) (+ beta Y) ----------------------------------------------------------

class GemmBf16Forward : public GemmBf16 {
 protected:
  // Every mode, shape, type and layout with the given bias kinds (0 none, 1 16-byte aligned, 2 four
  // bytes off): with a bf16 Y and an aligned bias, half the cases pass the bias's bf16 rounding
  // (bias16, as the persistent weight copy does) and half leave the GEMM to round it.
  void forward_cases(const GemmEpilogues& e, std::initializer_list<int> bias_kinds) {
    for (Precision mode : {Precision::Bf16, Precision::Fp32}) {
      Gemm g(s_, mode);
      g.set_epilogues(e);
      for (const Shape& sh : kShapes)
        for (cudaDataType_t xt : {F32, BF16})
          for (cudaDataType_t yt : {F32, BF16})
            for (float beta : {0.0f, 1.0f})
              for (int bias_kind : bias_kinds)
                for (bool outin : {false, true}) {
                  if (bias_kind && beta != 0.0f) continue;
                  const bool use_z16 = mode == Precision::Bf16 && outin == any_on(e);
                  const bool use_b16 = bias_kind == 1 && bf16(yt) && outin;
                  const int M = sh.M, K = sh.K, N = sh.N;
                  const std::string what =
                      std::string("mode ") + (mode == Precision::Bf16 ? "bf16" : "fp32") + " M" +
                      std::to_string(M) + " K" + std::to_string(K) + " N" + std::to_string(N) +
                      " X " + tname(xt) + " Y " + tname(yt) + " beta " + std::to_string(int(beta)) +
                      " bias " + std::to_string(bias_kind) + (outin ? " OutIn" : " InOut") +
                      (use_z16 ? " z16" : "") + (use_b16 ? " bias16" : "") + " epilogues " +
                      epi_name(e);
                  SCOPED_TRACE(what);
                  Dev X = make(size_t(M) * K, xt, 1.0);
                  Dev W = make(size_t(K) * N, F32, 0.5);
                  Dev B = make(size_t(N) + 1, F32, 1.0);
                  Dev Y = make(size_t(M) * N, yt, 2.0, beta == 0.0f);
                  const float* bias = bias_kind == 0 ? nullptr
                                      : bias_kind == 1 ? static_cast<const float*>(B.p)
                                                       : static_cast<const float*>(B.p) + 1;
                  const double* bv = bias_kind == 2 ? B.v.data() + 1 : B.v.data();
                  void* z16 = nullptr;
                  if (use_z16) {
                    Dev Wb = make(size_t(K) * N, BF16, 0.5);
                    for (size_t i = 0; i < W.n; ++i) Wb.v[i] = rb(W.v[i]);
                    upload(Wb);
                    z16 = Wb.p;
                  }
                  void* b16 = nullptr;
                  if (use_b16) {
                    Dev Bb = make(size_t(N), BF16, 1.0);
                    for (size_t i = 0; i < Bb.n; ++i) Bb.v[i] = rb(B.v[i]);
                    upload(Bb);
                    b16 = Bb.p;
                  }
                  const size_t fused0 = g.fused();
                  g.forward(GemmOut{Y.p, yt}, GemmIn{X.p, xt}, false, static_cast<float*>(W.p),
                            outin, M, N, K, beta, bias, z16, nullptr, b16);
                  if (!e.bias) {
                    EXPECT_EQ(g.fused(), fused0) << "an epilogue ran while switched off";
                  }
                  const FwdRef f = forward_ref(X.v, W.v, outin, bias ? bv : nullptr,
                                               beta != 0.0f ? &Y.v : nullptr, false, M, N, K, mode, yt);
                  expect_close(get(Y), f.y, f.ty, "Y");
                }
      std::printf("%s precision, epilogues %s: BIAS fused %lld, fallback %lld\n",
                  mode == Precision::Bf16 ? "bf16" : "fp32", epi_name(e).c_str(),
                  (long long)g.fused_by_kind().bias, (long long)g.fallback_by_kind().bias);
    }
  }

  // ---- forward with the GELU: Y = gelu_tanh(X @ W + bias), aux = X @ W + bias ----
  void gelu_cases(const GemmEpilogues& e) {
    for (Precision mode : {Precision::Bf16, Precision::Fp32}) {
      Gemm g(s_, mode);
      g.set_epilogues(e);
      for (const Shape& sh : kShapes)
        for (cudaDataType_t xt : {F32, BF16})
          for (cudaDataType_t yt : {BF16, F32})
            for (int bias_kind : {0, 1, 2})
              for (bool outin : {false, true}) {
                const int M = sh.M, K = sh.K, N = sh.N;
                const std::string what =
                    std::string("mode ") + (mode == Precision::Bf16 ? "bf16" : "fp32") + " M" +
                    std::to_string(M) + " K" + std::to_string(K) + " N" + std::to_string(N) +
                    " X " + tname(xt) + " Y/aux " + tname(yt) + " bias " +
                    std::to_string(bias_kind) + (outin ? " OutIn" : " InOut") + " epilogues " +
                    epi_name(e);
                SCOPED_TRACE(what);
                Dev X = make(size_t(M) * K, xt, 1.0);
                Dev W = make(size_t(K) * N, F32, 0.5);
                Dev B = make(size_t(N) + 1, F32, 1.0);
                Dev Y = make(size_t(M) * N, yt, 1.0, true);
                Dev A = make(size_t(M) * N, yt, 1.0, true);
                const float* bias = bias_kind == 0 ? nullptr
                                    : bias_kind == 1 ? static_cast<const float*>(B.p)
                                                     : static_cast<const float*>(B.p) + 1;
                const double* bv = bias_kind == 2 ? B.v.data() + 1 : B.v.data();
                const size_t fused0 = g.fused();
                g.forward(GemmOut{Y.p, yt}, GemmIn{X.p, xt}, false, static_cast<float*>(W.p),
                          outin, M, N, K, 0.0f, bias, nullptr, A.p);
                if (!e.gelu_aux) {
                  EXPECT_EQ(g.fused(), fused0) << "an epilogue ran while switched off";
                }
                const FwdRef f = forward_ref(X.v, W.v, outin, bias ? bv : nullptr, nullptr, true, M,
                                             N, K, mode, yt);
                expect_close(get(A), f.pre, f.tpre, "aux (pre-activation)");
                expect_close(get(Y), f.y, f.ty, "Y = gelu(pre)");
              }
      std::printf("%s precision, epilogues %s: GELU_AUX fused %lld, fallback %lld\n",
                  mode == Precision::Bf16 ? "bf16" : "fp32", epi_name(e).c_str(),
                  (long long)g.fused_by_kind().gelu_aux, (long long)g.fallback_by_kind().gelu_aux);
    }
  }
};

// ---- backward: dinp = dout @ W^T (+ dinp), dW += inp^T @ dout, dbias += colsum(dout) ---------------

struct BackCase {
  Precision mode;
  Shape sh;
  cudaDataType_t dt, xt, it;  // dout, inp, dinp
  float beta;
  bool outin, with_dw, with_dbias, gelu;
  GemmEpilogues epi;
  bool w16;
};

std::string describe(const BackCase& c) {
  return std::string("mode ") + (c.mode == Precision::Bf16 ? "bf16" : "fp32") + " M" +
         std::to_string(c.sh.M) + " K" + std::to_string(c.sh.K) + " N" + std::to_string(c.sh.N) +
         " dout " + tname(c.dt) + " inp " + tname(c.xt) + " dinp " + tname(c.it) + " beta " +
         std::to_string(int(c.beta)) + (c.outin ? " OutIn" : " InOut") + (c.with_dw ? " dW" : "") +
         (c.with_dbias ? " dbias" : "") + (c.gelu ? " DGELU" : "") + (c.w16 ? " w16" : "") +
         " epilogues " + epi_name(c.epi);
}

class GemmBf16Backward : public GemmBf16Forward {
 protected:
  void run(Gemm& g, const BackCase& c) {
    SCOPED_TRACE(describe(c));
    const int M = c.sh.M, K = c.sh.K, N = c.sh.N;
    const Precision mode = c.mode;
    Dev D = make(size_t(M) * N, c.dt, 1.0);
    Dev X = make(size_t(M) * K, c.xt, 1.0);
    Dev W = make(size_t(K) * N, F32, 0.5);  // InOut [K,N], OutIn [N,K]
    Dev DI = make(size_t(M) * K, c.it, 1.0, c.beta == 0.0f);
    Dev AUX = make(size_t(M) * K, c.it, 3.0);  // the GELU's pre-activation, in dinp's type
    Dev DW = make(size_t(K) * N, F32, 1.0);
    Dev DB = make(size_t(N), F32, 1.0);
    void* w16 = nullptr;
    if (c.w16) {
      Dev Wb = make(size_t(K) * N, BF16, 0.5);
      for (size_t i = 0; i < W.n; ++i) Wb.v[i] = rb(W.v[i]);
      upload(Wb);
      w16 = Wb.p;
    }
    g.set_epilogues(c.epi);
    const size_t fused0 = g.fused();
    g.backward(GemmOut{DI.p, c.it}, c.beta, c.with_dw ? static_cast<float*>(DW.p) : nullptr,
               c.with_dbias ? static_cast<float*>(DB.p) : nullptr, GemmIn{D.p, c.dt},
               GemmIn{X.p, c.xt}, static_cast<float*>(W.p), M, K, N, !c.outin, w16,
               c.gelu ? AUX.p : nullptr);
    if (!c.epi.dgelu && !c.epi.bgrad) {
      EXPECT_EQ(g.fused(), fused0) << "an epilogue ran while switched off";
    }

    const BwdRef r = backward_ref(D.v, X.v, W.v, DI.v, c.gelu ? &AUX.v : nullptr, DW.v, DB.v, c.beta,
                                  c.with_dw, c.with_dbias, c.outin, M, K, N, mode, c.it);
    expect_close(get(DI), r.di, r.tdi, c.gelu ? "dinp (DGELU)" : "dinp");
    expect_close(get(DW), r.dw, r.tdw, c.with_dw ? "dW" : "dW (untouched)");
    expect_close(get(DB), r.db, r.tdb, c.with_dbias ? "dbias" : "dbias (untouched)");
  }
  void print_counts(const Gemm& g, Precision mode, const GemmEpilogues& e) {
    std::printf("%s precision, epilogues %s: DGELU fused %lld, fallback %lld; BGRAD fused %lld, "
                "fallback %lld\n",
                mode == Precision::Bf16 ? "bf16" : "fp32", epi_name(e).c_str(),
                (long long)g.fused_by_kind().dgelu, (long long)g.fallback_by_kind().dgelu,
                (long long)g.fused_by_kind().bgrad, (long long)g.fallback_by_kind().bgrad);
  }

  // dinp, dW and dbias over every type and layout, with the bias gradient (BGRAD's case), without
  // it, and the bias gradient without dW (the column sum)
  void products_cases(const GemmEpilogues& e) {
    for (Precision mode : {Precision::Bf16, Precision::Fp32}) {
      Gemm g(s_, mode);
      for (const Shape& sh : kShapes)
        for (cudaDataType_t dt : {BF16, F32})
          for (cudaDataType_t xt : {BF16, F32})
            for (cudaDataType_t it : {BF16, F32})
              for (float beta : {0.0f, 1.0f})
                for (bool outin : {false, true}) {
                  BackCase c{mode, sh, dt, xt, it, beta, outin, true, true, false, e,
                             mode == Precision::Bf16 && outin == any_on(e)};
                  run(g, c);
                  if (dt == xt && xt == it) {
                    c.with_dbias = false;
                    run(g, c);
                    c.with_dbias = true;
                    c.with_dw = false;
                    run(g, c);
                  }
                }
      print_counts(g, mode, e);
    }
  }

  // dinp through the GELU's derivative (DGELU's case), with dW and dbias
  void dgelu_cases(const GemmEpilogues& e) {
    for (Precision mode : {Precision::Bf16, Precision::Fp32}) {
      Gemm g(s_, mode);
      for (const Shape& sh : kShapes)
        for (cudaDataType_t dt : {BF16, F32})
          for (cudaDataType_t it : {BF16, F32})
            for (bool outin : {false, true}) {
              BackCase c{mode, sh, dt, dt, it, 0.0f, outin, true, true, true, e, false};
              run(g, c);
            }
      print_counts(g, mode, e);
    }
  }

  // The bias gradient (BGRADA/B or the column sum) and the other outputs: the same bits on a rerun
  // (with_aux: dinp through DGELU or its fallback).
  void deterministic_cases(const GemmEpilogues& e, bool with_aux) {
    Gemm g(s_, Precision::Bf16);
    g.set_epilogues(e);
    const int M = 300, K = 64, N = 48;  // M over one column-sum chunk (256 rows)
    for (bool inout : {true, false}) {
      SCOPED_TRACE(std::string(inout ? "InOut" : "OutIn") + " epilogues " + epi_name(e));
      Dev D = make(size_t(M) * N, BF16, 1.0);
      Dev X = make(size_t(M) * K, BF16, 1.0);
      Dev W = make(size_t(K) * N, F32, 0.5);
      Dev AUX = make(size_t(M) * K, BF16, 3.0);
      std::vector<uint8_t> first[3];
      for (int rep = 0; rep < 2; ++rep) {
        Dev DI = make(size_t(M) * K, BF16, 1.0, true);
        Dev DW = make(size_t(K) * N, F32, 0.0);
        Dev DB = make(size_t(N), F32, 0.0);
        ASSERT_EQ(cudaMemset(DW.p, 0, DW.n * 4), cudaSuccess);
        ASSERT_EQ(cudaMemset(DB.p, 0, DB.n * 4), cudaSuccess);
        g.backward(GemmOut{DI.p, BF16}, 0.0f, static_cast<float*>(DW.p), static_cast<float*>(DB.p),
                   GemmIn{D.p, BF16}, GemmIn{X.p, BF16}, static_cast<float*>(W.p), M, K, N, inout,
                   nullptr, with_aux ? AUX.p : nullptr);
        std::vector<uint8_t> now[3] = {bytes(DI.p, DI.n * 2), bytes(DW.p, DW.n * 4),
                                       bytes(DB.p, DB.n * 4)};
        for (int i = 0; i < 3; ++i) {
          if (rep == 0)
            first[i] = now[i];
          else
            EXPECT_TRUE(now[i] == first[i]) << "output " << i << " (dinp, dW, dbias) differs on a rerun";
        }
      }
    }
    print_counts(g, Precision::Bf16, e);
  }
};

class GemmBf16Plain : public GemmBf16Backward {};
class GemmBf16EpilogueBias : public GemmBf16Backward {};
class GemmBf16EpilogueGeluAux : public GemmBf16Backward {};
class GemmBf16EpilogueDgelu : public GemmBf16Backward {};
class GemmBf16EpilogueBgrad : public GemmBf16Backward {};

TEST_F(GemmBf16Plain, Forward) { forward_cases(epilogues("none"), {0, 1, 2}); }
TEST_F(GemmBf16Plain, ForwardGelu) { gelu_cases(epilogues("none")); }
TEST_F(GemmBf16Plain, BackwardProducts) { products_cases(epilogues("none")); }
TEST_F(GemmBf16Plain, BackwardGelu) { dgelu_cases(epilogues("none")); }
TEST_F(GemmBf16Plain, BackwardDeterministic) { deterministic_cases(epilogues("none"), true); }

TEST_F(GemmBf16EpilogueBias, Forward) { forward_cases(epilogues("bias"), {1, 2}); }
// A bf16 Y with a 16-byte aligned bf16 bias and aligned shapes: the case every bias GEMM of a bf16
// GPT-2 step is. It must take the BIAS epilogue (the bias in D's type, as cuBLASLt wants it outside
// IMMA and FP8 kernels), and give the reference's values.
TEST_F(GemmBf16EpilogueBias, Bf16OutputFusesWithBf16Bias) {
  Gemm g(s_, Precision::Bf16);
  g.set_epilogues(epilogues("bias"));
  const int M = 64, K = 64, N = 192;
  for (bool with_b16 : {true, false}) {
    SCOPED_TRACE(with_b16 ? "bias16 given" : "bias rounded by the GEMM");
    Dev X = make(size_t(M) * K, BF16, 1.0);
    Dev W = make(size_t(K) * N, F32, 0.5);
    Dev Wb = make(size_t(K) * N, BF16, 0.5);
    for (size_t i = 0; i < W.n; ++i) Wb.v[i] = rb(W.v[i]);
    upload(Wb);
    Dev B = make(size_t(N), F32, 1.0);
    Dev Bb = make(size_t(N), BF16, 1.0);
    for (size_t i = 0; i < B.n; ++i) Bb.v[i] = rb(B.v[i]);
    upload(Bb);
    Dev Y = make(size_t(M) * N, BF16, 1.0, true);
    const PathCounts::Epilogues f0 = g.fused_by_kind(), u0 = g.fallback_by_kind();
    g.forward(GemmOut{Y.p, BF16}, GemmIn{X.p, BF16}, false, static_cast<float*>(W.p), false, M, N, K,
              0.0f, static_cast<float*>(B.p), Wb.p, nullptr, with_b16 ? Bb.p : nullptr);
    EXPECT_EQ(g.fused_by_kind().bias - f0.bias, 1) << "the BIAS epilogue did not run";
    EXPECT_EQ(g.fallback_by_kind().bias - u0.bias, 0) << "the BIAS GEMM took its fallback";
    const FwdRef f = forward_ref(X.v, W.v, false, Bb.v.data(), nullptr, false, M, N, K,
                                 Precision::Bf16, BF16);
    expect_close(get(Y), f.y, f.ty, "Y");
  }
}

TEST_F(GemmBf16EpilogueGeluAux, Forward) { gelu_cases(epilogues("gelu_aux")); }

TEST_F(GemmBf16EpilogueDgelu, Backward) { dgelu_cases(epilogues("dgelu")); }
TEST_F(GemmBf16EpilogueDgelu, BackwardDeterministic) { deterministic_cases(epilogues("dgelu"), true); }

TEST_F(GemmBf16EpilogueBgrad, BackwardProducts) { products_cases(epilogues("bgrad")); }
TEST_F(GemmBf16EpilogueBgrad, BackwardDeterministic) { deterministic_cases(epilogues("bgrad"), false); }

// A bad storage type is refused with a message naming it, before anything runs.
TEST_F(GemmBf16Plain, RejectsOtherTypes) {
  Gemm g(s_, Precision::Bf16);
  Dev X = make(16, F32, 1.0), W = make(16, F32, 1.0), Y = make(16, F32, 1.0);
  EXPECT_THROW(g.forward(GemmOut{Y.p, CUDA_R_16F}, GemmIn{X.p, F32}, false,
                         static_cast<float*>(W.p), false, 4, 4, 4, 0.0f, nullptr),
               nlp::Error);
}

// ---- through the backend: matmul_forward / matmul_backward on bf16 views --------------------------
// The CUDA backend in bf16 precision, native (the typed GEMM, the default) and staged
// (NLPTRAIN_CUDA_BF16_ACTS=staged: widened, the fp32 op, rounded back), against the CPU backend in
// bf16 precision on the same views (staged: cpu/staged.h). Both multiply the same bf16 operands with
// fp32 accumulation; only the summation order differs, so a bf16-stored output may land on the
// neighbouring bf16 value: norm-wise relative error 2^-7 (one bf16 ulp) on bf16 outputs (out, dinp),
// 1e-5 on the fp32 ones (dW, dbias: fp32 reordering only).

constexpr double kViewBf16 = 0x1p-7;
constexpr double kViewF32 = 1e-5;

double rel(const VD& a, const VD& ref) {
  if (a.size() != ref.size()) return INFINITY;
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    if (!std::isfinite(a[i])) return INFINITY;
    num += (a[i] - ref[i]) * (a[i] - ref[i]);
    den += ref[i] * ref[i];
  }
  return den > 0 ? std::sqrt(num / den) : std::sqrt(num);
}

// Tensors of a backend test: uploaded as bf16 (rounded) or fp32, read back widened to double; every
// buffer released when it goes out of scope.
struct TestMem {
  nlp::Backend& be;
  std::vector<void*> mem;
  ~TestMem() {
    for (void* p : mem) be.release(p);
  }
  void* put16(const VD& v) {
    std::vector<uint16_t> b(v.size());
    for (size_t i = 0; i < v.size(); ++i) b[i] = nlp::cpu::to_bf16_bits(float(v[i]));
    void* p = be.alloc(b.size() * 2);
    be.to_device(p, b.data(), b.size() * 2);
    mem.push_back(p);
    return p;
  }
  float* put32(const VD& v) {
    std::vector<float> f(v.begin(), v.end());
    void* p = be.alloc(f.size() * 4);
    be.to_device(p, f.data(), f.size() * 4);
    mem.push_back(p);
    return static_cast<float*>(p);
  }
  VD get16(const void* p, size_t n) {
    std::vector<uint16_t> b(n);
    be.to_host(b.data(), p, n * 2);
    VD v(n);
    for (size_t i = 0; i < n; ++i) {
      const uint32_t u = uint32_t(b[i]) << 16;
      float f;
      std::memcpy(&f, &u, 4);
      v[i] = f;
    }
    return v;
  }
  VD get32(const float* p, size_t n) {
    std::vector<float> f(n);
    be.to_host(f.data(), p, n * 4);
    return VD(f.begin(), f.end());
  }
};

struct DenseResult {
  VD out, dinp_acc, dinp_write, dw, db;
};

// forward, then the backward twice: accumulating into dinp (and dW, dbias), and overwriting a
// NaN-filled dinp (overwrite view, no dW/dbias)
DenseResult dense_on(nlp::Backend& be, const VD& inp, const VD& w, const VD& bias, const VD& dout,
                     const VD& dinp0, const VD& dw0, const VD& db0, int M, int K, int N,
                     nlp::WLayout layout) {
  using nlp::Act;
  using nlp::CAct;
  using nlp::DType;
  TestMem m{be};
  auto put16 = [&](const VD& v) { return m.put16(v); };
  auto put32 = [&](const VD& v) { return m.put32(v); };
  auto get16 = [&](const void* p, size_t n) { return m.get16(p, n); };
  auto get32 = [&](const float* p, size_t n) { return m.get32(p, n); };
  void* x = put16(inp);
  float* wd = put32(w);
  float* bd = put32(bias);
  void* out = put16(VD(size_t(M) * N, NAN));
  void* d = put16(dout);
  void* di = put16(dinp0);
  void* di2 = put16(VD(size_t(M) * K, NAN));
  float* dwd = put32(dw0);
  float* dbd = put32(db0);
  be.matmul_forward(Act(out, DType::BF16), CAct(x, DType::BF16), wd, bd, M, K, N, layout);
  be.matmul_backward(Act(di, DType::BF16), dwd, dbd, CAct(d, DType::BF16), CAct(x, DType::BF16), wd,
                     M, K, N, layout);
  be.matmul_backward(nlp::overwrite(Act(di2, DType::BF16)), nullptr, nullptr, CAct(d, DType::BF16),
                     nullptr, wd, M, K, N, layout);
  DenseResult r{get16(out, size_t(M) * N), get16(di, size_t(M) * K), get16(di2, size_t(M) * K),
                get32(dwd, dw0.size()), get32(dbd, db0.size())};
  return r;
}

TEST(CudaBackendBf16Views, MatmulMatchesCpu) {
  std::string why;
  if (nlp::cuda_device_count(&why) == 0) GTEST_SKIP() << "no CUDA device: " << why;
  nlp::BackendOptions o;
  o.precision = Precision::Bf16;
  auto cpu = nlp::make_cpu_backend(2, Precision::Bf16);
  const char* old = std::getenv("NLPTRAIN_CUDA_BF16_ACTS");
  const std::string saved = old ? old : "";
  for (const char* acts : {"native", "staged"}) {
    setenv("NLPTRAIN_CUDA_BF16_ACTS", acts, 1);
    auto gpu = nlp::make_cuda_backend(0, o);
    std::mt19937 rng(7);
    std::uniform_real_distribution<float> u(-1.f, 1.f);
    auto rnd = [&](size_t n, double a, bool round) {
      VD v(n);
      for (auto& x : v) x = round ? rb(a * u(rng)) : double(float(a * u(rng)));
      return v;
    };
    for (const Shape& sh : kShapes)
      for (nlp::WLayout layout : {nlp::WLayout::InOut, nlp::WLayout::OutIn}) {
        const int M = sh.M, K = sh.K, N = sh.N;
        SCOPED_TRACE(std::string(acts) + " M" + std::to_string(M) + " K" + std::to_string(K) + " N" +
                     std::to_string(N) + (layout == nlp::WLayout::InOut ? " InOut" : " OutIn"));
        const VD inp = rnd(size_t(M) * K, 1.0, true), w = rnd(size_t(K) * N, 0.5, false);
        const VD bias = rnd(N, 1.0, false), dout = rnd(size_t(M) * N, 1.0, true);
        const VD dinp0 = rnd(size_t(M) * K, 1.0, true), dw0 = rnd(size_t(K) * N, 1.0, false);
        const VD db0 = rnd(N, 1.0, false);
        const DenseResult g = dense_on(*gpu, inp, w, bias, dout, dinp0, dw0, db0, M, K, N, layout);
        const DenseResult c = dense_on(*cpu, inp, w, bias, dout, dinp0, dw0, db0, M, K, N, layout);
        EXPECT_LE(rel(g.out, c.out), kViewBf16) << "out";
        EXPECT_LE(rel(g.dinp_acc, c.dinp_acc), kViewBf16) << "dinp (accumulated)";
        EXPECT_LE(rel(g.dinp_write, c.dinp_write), kViewBf16) << "dinp (overwritten)";
        EXPECT_LE(rel(g.dw, c.dw), kViewF32) << "dW";
        EXPECT_LE(rel(g.db, c.db), kViewF32) << "dbias";
      }
  }
  if (old)
    setenv("NLPTRAIN_CUDA_BF16_ACTS", saved.c_str(), 1);
  else
    unsetenv("NLPTRAIN_CUDA_BF16_ACTS");
}

// ---- through the backend: the dense layer with its GELU (matmul_gelu_forward, matmul_dgelu_backward)
// The CUDA backend in bf16 precision with native bf16 views and NLPTRAIN_CUDA_GEMM_EPILOGUES = all
// (GELU_AUX in the forward, DGELU in the backward) against the CPU backend's defaults (the GEMM, then
// the GELU op on the stored pre-activation). Where the CPU rounds the product to bf16 before the GELU
// (pre, then gelu of the stored pre; the backward's product, then times gelu'), the epilogue works
// from the fp32 product and rounds once, so outputs may differ by about one bf16 rounding of their
// input: the same norm-wise bounds as above, 2^-7 on bf16 outputs (out, pre, dpre), 1e-5 on the fp32
// ones (dW, dbias). The backward reads the CPU forward's h and pre on both backends. The profile
// shows that the fused calls ran (the backend's op labels of the epilogue path).

struct GeluDenseResult {
  VD out, pre, dpre, dw, db;
};

// forward out = gelu(pre), pre = inp[M,K] @ W + bias ([K,N] or [N,K]); then the backward of the
// next layer y = h[M,N] @ W2 + b2 ([M,K]) at h, pre: dpre overwritten (NaN before), dW2 and db2
// accumulated onto dw0, db0
GeluDenseResult gelu_dense_on(nlp::Backend& be, const VD& inp, const VD& w, const VD& bias,
                              const VD& h, const VD& pre, const VD& w2, const VD& dy, const VD& dw0,
                              const VD& db0, int M, int K, int N, nlp::WLayout layout) {
  using nlp::Act;
  using nlp::CAct;
  using nlp::DType;
  TestMem m{be};
  auto put16 = [&](const VD& v) { return m.put16(v); };
  auto put32 = [&](const VD& v) { return m.put32(v); };
  auto get16 = [&](const void* p, size_t n) { return m.get16(p, n); };
  auto get32 = [&](const float* p, size_t n) { return m.get32(p, n); };
  const size_t mn = size_t(M) * N;
  void* x = put16(inp);
  float* wd = put32(w);
  float* bd = put32(bias);
  void* out = put16(VD(mn, NAN));
  void* pr = put16(VD(mn, NAN));
  be.matmul_gelu_forward(Act(out, DType::BF16), Act(pr, DType::BF16), CAct(x, DType::BF16), wd, bd, M,
                         K, N, layout, nlp::Gelu::Tanh);
  void* hd = put16(h);
  void* pd = put16(pre);
  float* w2d = put32(w2);
  void* dyd = put16(dy);
  void* dp = put16(VD(mn, NAN));
  void* scratch = put16(VD(mn, NAN));
  float* dwd = put32(dw0);
  float* dbd = put32(db0);
  be.matmul_dgelu_backward(nlp::overwrite(Act(dp, DType::BF16)), dwd, dbd, CAct(dyd, DType::BF16),
                           CAct(hd, DType::BF16), CAct(pd, DType::BF16), w2d, M, N, K, layout,
                           nlp::Gelu::Tanh, Act(scratch, DType::BF16));
  GeluDenseResult r{get16(out, mn), get16(pr, mn), get16(dp, mn), get32(dwd, dw0.size()),
                    get32(dbd, db0.size())};
  return r;
}

TEST(CudaBackendBf16Views, MatmulGeluEpiloguesMatchCpu) {
  std::string why;
  if (nlp::cuda_device_count(&why) == 0) GTEST_SKIP() << "no CUDA device: " << why;
  struct Env {  // set for this test, restored after
    const char* name;
    std::string saved;
    bool had;
    Env(const char* n, const char* v) : name(n) {
      const char* old = std::getenv(n);
      had = old != nullptr;
      saved = old ? old : "";
      setenv(n, v, 1);
    }
    ~Env() {
      if (had)
        setenv(name, saved.c_str(), 1);
      else
        unsetenv(name);
    }
  } epilogues("NLPTRAIN_CUDA_GEMM_EPILOGUES", "all"), acts("NLPTRAIN_CUDA_BF16_ACTS", "native");
  nlp::BackendOptions o;
  o.precision = Precision::Bf16;
  auto gpu = nlp::make_cuda_backend(0, o);
  auto cpu = nlp::make_cpu_backend(2, Precision::Bf16);
  gpu->set_profiling(true);
  std::mt19937 rng(11);
  std::uniform_real_distribution<float> u(-1.f, 1.f);
  auto rnd = [&](size_t n, double a, bool round) {
    VD v(n);
    for (auto& x : v) x = round ? rb(a * u(rng)) : double(float(a * u(rng)));
    return v;
  };
  for (const Shape& sh : kShapes)
    for (nlp::WLayout layout : {nlp::WLayout::InOut, nlp::WLayout::OutIn}) {
      const int M = sh.M, K = sh.K, N = sh.N;
      SCOPED_TRACE("M" + std::to_string(M) + " K" + std::to_string(K) + " N" + std::to_string(N) +
                   (layout == nlp::WLayout::InOut ? " InOut" : " OutIn"));
      const VD inp = rnd(size_t(M) * K, 1.0, true), w = rnd(size_t(K) * N, 0.5, false);
      const VD bias = rnd(N, 1.0, false), w2 = rnd(size_t(N) * K, 0.5, false);
      const VD dy = rnd(size_t(M) * K, 1.0, true), dw0 = rnd(size_t(N) * K, 1.0, false);
      const VD db0 = rnd(K, 1.0, false);
      // the backward's h and pre: the CPU forward's (its out and pre as stored)
      const GeluDenseResult f = gelu_dense_on(*cpu, inp, w, bias, VD(size_t(M) * N, 0.0),
                                              VD(size_t(M) * N, 0.0), w2, dy, dw0, db0, M, K, N, layout);
      const GeluDenseResult c = gelu_dense_on(*cpu, inp, w, bias, f.out, f.pre, w2, dy, dw0, db0, M, K,
                                              N, layout);
      const GeluDenseResult g = gelu_dense_on(*gpu, inp, w, bias, f.out, f.pre, w2, dy, dw0, db0, M, K,
                                              N, layout);
      EXPECT_LE(rel(g.pre, c.pre), kViewBf16) << "pre";
      EXPECT_LE(rel(g.out, c.out), kViewBf16) << "out = gelu(pre)";
      EXPECT_LE(rel(g.dpre, c.dpre), kViewBf16) << "dpre (overwritten)";
      EXPECT_LE(rel(g.dw, c.dw), kViewF32) << "dW";
      EXPECT_LE(rel(g.db, c.db), kViewF32) << "dbias";
    }
  long fwd = 0, bwd = 0;
  for (const nlp::Backend::ProfileTime& t : gpu->profile_times()) {
    if (t.label == "matmul_gelu_forward (bf16, GELU_AUX)") fwd += t.calls;
    if (t.label == "matmul_dgelu_backward (bf16, DGELU)") bwd += t.calls;
  }
  EXPECT_EQ(fwd, 4) << "the forward did not take the epilogue path";
  EXPECT_EQ(bwd, 4) << "the backward did not take the epilogue path";
}

// ---- a GPT-2 block's GEMMs fused: the path counts of a bf16 forward (Backend::path_counts) ----------
// A 2-layer GPT-2 (width 64, 4 heads) with bf16 activations, bf16 GEMMs and the persistent bf16
// weight copy (run.bf16_weights: biases included), on the native bf16 kernels. Each block's qkv,
// proj, fc and fcp GEMMs carry a bias: with the epilogues at "bias" all four must run BIAS fused and
// none fall back; with "bias,gelu_aux" fc and its GELU must run as one GELU_AUX_BIAS GEMM
// (matmul_gelu_forward) and the other three as BIAS. The loss must be finite and near the fp32
// CPU model's (bf16 activations: 2e-2 relative). The backward's counts are printed.
PathCounts gpt2_forward_paths(const char* epilogues, double* rel_loss) {
  ScopedEnvForTest e("NLPTRAIN_CUDA_GEMM_EPILOGUES", epilogues), a("NLPTRAIN_CUDA_BF16_ACTS", "native");
  nlp::BackendOptions o;
  o.precision = Precision::Bf16;
  o.bf16_weights = true;
  auto gpu = nlp::make_cuda_backend(0, o);
  auto cpu = nlp::make_cpu_backend(1, Precision::Fp32);
  nlp::ModelConfig mc;
  mc.type = "gpt2";
  mc.n_layer = 2;
  mc.n_head = 4;
  mc.n_embd = 64;
  mc.vocab_size = 128;
  mc.n_positions = 32;
  mc.initializer_range = 0.1f;
  nlp::ModelConfig mg = mc;
  mg.bf16_activations = true;
  auto mcpu = nlp::make_model(mc, *cpu, "clm");
  auto mgpu = nlp::make_model(mg, *gpu, "clm");
  mcpu->init_weights(5);
  std::vector<float> w;
  mcpu->params().download(w);
  mgpu->params().upload(w);
  const nlp::HostBatch hb = nlp::test::clm_batch(2, 32, 9, mc.vocab_size);
  nlp::DeviceBatchBuffer bc(*cpu), bg(*gpu);
  const nlp::DeviceBatch dc = bc.upload(hb), dg = bg.upload(hb);
  PathCounts p0, p1, p2;
  EXPECT_TRUE(gpu->path_counts(&p0));
  const double lg = mgpu->forward(dg, false, 1);
  gpu->path_counts(&p1);
  const double lc = mcpu->forward(dc, false, 1);
  *rel_loss = std::isfinite(lg) ? std::abs(lg - lc) / std::abs(lc) : INFINITY;
  mgpu->backward(dg, 1.0f / 64, false, 1);
  gpu->synchronize();
  gpu->path_counts(&p2);
  std::printf("epilogues %s: forward %s\n  backward %s\n", epilogues,
              nlp::path_counts_line(p1 - p0).c_str(), nlp::path_counts_line(p2 - p1).c_str());
  return p1 - p0;
}

TEST_F(GemmBf16EpilogueBias, Gpt2BlockGemmsRunFused) {
  double rel = 0;
  const PathCounts f = gpt2_forward_paths("bias", &rel);
  EXPECT_LE(rel, 2e-2) << "loss against the fp32 CPU model";
  EXPECT_EQ(f.gemm_fused.bias, 4 * 2) << "qkv, proj, fc and fcp of 2 blocks";
  EXPECT_EQ(f.gemm_fallback.bias, 0);
  EXPECT_EQ(f.gemm_fused.gelu_aux + f.gemm_fallback.gelu_aux, 0) << "GELU_AUX switched off";
}

TEST_F(GemmBf16EpilogueGeluAux, Gpt2FcGemmRunsFused) {
  double rel = 0;
  const PathCounts f = gpt2_forward_paths("bias,gelu_aux", &rel);
  EXPECT_LE(rel, 2e-2) << "loss against the fp32 CPU model";
  EXPECT_EQ(f.gemm_fused.gelu_aux, 2) << "fc + GELU of 2 blocks";
  EXPECT_EQ(f.gemm_fallback.gelu_aux, 0);
  EXPECT_EQ(f.gemm_fused.bias, 3 * 2) << "qkv, proj and fcp of 2 blocks";
  EXPECT_EQ(f.gemm_fallback.bias, 0);
}

// NLPTRAIN_CUDA_GEMM_EPILOGUES (host only: runs without a GPU)
TEST(GemmEpiloguesEnv, Values) {
  const char* old = std::getenv("NLPTRAIN_CUDA_GEMM_EPILOGUES");
  const std::string saved = old ? old : "";
  auto with = [](const char* v) {
    if (v)
      setenv("NLPTRAIN_CUDA_GEMM_EPILOGUES", v, 1);
    else
      unsetenv("NLPTRAIN_CUDA_GEMM_EPILOGUES");
    return nlp::cuda::gemm_epilogues_from_env();
  };
  auto is = [](const GemmEpilogues& e, bool b, bool g, bool d, bool bg) {
    return e.bias == b && e.gelu_aux == g && e.dgelu == d && e.bgrad == bg;
  };
  for (const char* v : {static_cast<const char*>(nullptr), "bias"})
    EXPECT_TRUE(is(with(v), true, false, false, false)) << (v ? v : "(unset)");
  EXPECT_TRUE(is(with("all"), true, true, true, true));
  EXPECT_TRUE(is(with("none"), false, false, false, false));
  // comma lists: exactly the kinds named, in any order
  EXPECT_TRUE(is(with("gelu_aux"), false, true, false, false));
  EXPECT_TRUE(is(with("dgelu"), false, false, true, false));
  EXPECT_TRUE(is(with("bgrad"), false, false, false, true));
  EXPECT_TRUE(is(with("bias,bgrad"), true, false, false, true));
  EXPECT_TRUE(is(with("dgelu,bias,gelu_aux"), true, true, true, false));
  EXPECT_TRUE(is(with("bias,gelu_aux,dgelu,bgrad"), true, true, true, true));
  for (const char* bad : {"fused", "", "bias,", ",bias", "bias,,dgelu", "bias,bias", "Bias", "bias, dgelu",
                          "all,bias", "none,bias"}) {
    try {
      with(bad);
      ADD_FAILURE() << "no error for '" << bad << "'";
    } catch (const nlp::Error& err) {
      const std::string m = err.what();
      EXPECT_NE(m.find(std::string("NLPTRAIN_CUDA_GEMM_EPILOGUES = '") + bad + "'"), std::string::npos) << m;
      EXPECT_NE(m.find("bias, gelu_aux, dgelu, bgrad"), std::string::npos) << "allowed values missing: " << m;
    }
  }
  if (old)
    setenv("NLPTRAIN_CUDA_GEMM_EPILOGUES", saved.c_str(), 1);
  else
    unsetenv("NLPTRAIN_CUDA_GEMM_EPILOGUES");
}

#else  // built without CUDA

TEST(GemmBf16Plain, Skipped) { GTEST_SKIP() << "built without the CUDA backend"; }

#endif

}  // namespace
