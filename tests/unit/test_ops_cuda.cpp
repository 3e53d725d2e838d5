// CUDA backend against the CPU backend (the reference), op by op and on whole models.
//  - Every op runs on both backends on the same fresh random inputs; GPU outputs are NaN-poisoned
//    before each run so that an element the kernel does not write fails the comparison; gradients
//    are pre-filled with the same random values on both backends (backward ops accumulate).
//  - Error measure: norm-wise relative error ||gpu - cpu|| / ||cpu|| (any non-finite GPU element
//    counts as infinite error). Tolerances, stated per check:
//      kExact  0      ops with the same float operations in the same order (dropout, copies,
//                     embedding forward, add/scale/accumulate, rows, AdamW on equal inputs)
//      kOp     1e-5   every other fp32 op (GEMMs, layer norm, GELU, tanh, cross-entropy, embedding
//                     backward, AdamW), i.e. only summation order and libm ulps differ
//      kAttn   2e-5   attention forward/backward/decode (exp and T-long sums on top of GEMMs)
//      kRed    1e-12  sum / sumsq (both accumulate in double)
//      models: loss and outputs 1e-5 (kModelOut); each parameter gradient 1e-4 of its own norm, or
//      of 1e-3 of the whole gradient's norm when larger (kModelGrad: two layers of fp32 reordering);
//      10 AdamW steps: every loss within 5e-4 relative (kTrain; Adam's normalised update amplifies
//      last-bit differences of tiny moments).
//  - cuDNN fused attention (CudaOpsCudnn, a second backend with BackendOptions::fused_attention and
//    bf16 precision) against the CPU backend's fp32 attention on the same bf16-rounded q, k, v and
//    upstream gradient: output 1e-2 (kFusedFwd: O and the probabilities pass through bf16), each of
//    dq, dk, dv 2e-2 (kFusedBwd: dO, dq, dk, dv are bf16). Whole models against the CPU backend in
//    bf16 precision (both round the GEMM operands alike; attention dropout off, since cuDNN draws its
//    own mask): loss 2e-2, outputs 3e-2, each parameter gradient 5e-2 of its norm or of 1e-2 of the
//    whole gradient's norm (kFusedModel*). Dropout: the same seed gives the same bits, the kept
//    fraction is 1-p within 0.01, and the backward uses the forward's mask.
//  - Without a usable GPU (or in a build without CUDA) every test is skipped with the reason from
//    cuda_device_count(); a GPU that is present but whose backend fails to start is a failure.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <iterator>
#include <limits>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/round.h"
#include "backend/op_account_backend.h"
#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/device.h"
#include "backend/factory.h"
#include "config/config.h"
#include "core/backend.h"
#include "core/error.h"
#include "core/rng.h"
#include "model/model.h"
#include "comm/shard.h"
#include "train/optimizer.h"

#if NLPTRAIN_HAVE_CUDA
#include <cuda_runtime_api.h>

#include "kernels.cuh"  // kernels/ (an include directory of CUDA builds)
#include "backend/cuda/device_workspace.h"
#endif

namespace {

using nlp::Backend;
using nlp::Gelu;
using nlp::WLayout;
using VF = std::vector<float>;
using VI = std::vector<int32_t>;

constexpr double kExact = 0.0;
constexpr double kOp = 1e-5;
constexpr double kAttn = 2e-5;
constexpr double kRed = 1e-12;
constexpr double kModelOut = 1e-5;
constexpr double kModelGrad = 1e-4;
constexpr double kTrain = 5e-4;
constexpr double kFusedFwd = 1e-2;
constexpr double kFusedBwd = 2e-2;
constexpr double kFusedModelLoss = 2e-2;
constexpr double kFusedModelOut = 3e-2;
constexpr double kFusedModelGrad = 5e-2;

// ---- the two backends ------------------------------------------------------------------------------

struct GpuState {
  std::unique_ptr<Backend> be;
  std::unique_ptr<Backend> fused;  // fused (cuDNN) attention, bf16 precision; made by CudaOpsCudnn
  std::string skip_reason;  // no device: skip
  std::string failure;      // device present but the backend failed: fail
};

GpuState& gpu_state() {
  static GpuState g = [] {
    GpuState s;
    std::string why;
    const int n = nlp::cuda_device_count(&why);
    if (n == 0) {
      s.skip_reason = why;
      return s;
    }
    try {
      s.be = nlp::make_cuda_backend(0);
    } catch (const std::exception& e) {
      s.failure = e.what();
    }
    return s;
  }();
  return g;
}

// Destroys the GPU backend after the last test, while the CUDA runtime is still up (not in static
// destruction at exit).
class GpuEnvironment : public ::testing::Environment {
 public:
  void TearDown() override {
    gpu_state().fused.reset();
    gpu_state().be.reset();
  }
};
const ::testing::Environment* const kGpuEnvironment =
    ::testing::AddGlobalTestEnvironment(new GpuEnvironment);

Backend& cpu() {
  static std::unique_ptr<Backend> b = nlp::make_cpu_backend(2);
  return *b;
}

// The CPU backend with bf16 GEMM operands (train.precision = bf16), the reference of whole models on
// the fused-attention backend.
Backend& cpu_bf16() {
  static std::unique_ptr<Backend> b = nlp::make_cpu_backend(2, nlp::Precision::Bf16);
  return *b;
}

// ---- data -------------------------------------------------------------------------------------------

VF randn(size_t n, uint64_t seed, float sd = 1.0f) {
  nlp::Rng r(seed);
  VF v(n);
  for (auto& x : v) x = sd * r.normal();
  return v;
}

VI randi(size_t n, uint64_t seed, int lo, int hi) {  // [lo, hi)
  nlp::Rng r(seed);
  VI v(n);
  for (auto& x : v) x = lo + static_cast<int32_t>(r.next_u64() % uint64_t(hi - lo));
  return v;
}

// ||a - ref|| / ||ref||; infinite when a holds a non-finite value or the sizes differ
double rel_err(const VF& a, const VF& ref) {
  if (a.size() != ref.size()) return std::numeric_limits<double>::infinity();
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    if (!std::isfinite(a[i])) return std::numeric_limits<double>::infinity();
    const double d = (double)a[i] - (double)ref[i];
    num += d * d;
    den += (double)ref[i] * ref[i];
  }
  return den > 0 ? std::sqrt(num / den) : std::sqrt(num);
}

double rel_err(double a, double ref) {
  if (!std::isfinite(a)) return std::numeric_limits<double>::infinity();
  return ref != 0 ? std::fabs(a - ref) / std::fabs(ref) : std::fabs(a);
}

VF round_bf16(VF v) {
  for (float& x : v) x = nlp::cpu::round_bf16(x);
  return v;
}

bool bitwise_equal(const VF& a, const VF& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// A copy of h in be's memory (the caller releases it), and n floats of be's memory on the host: for
// tests on a backend of their own rather than the fixture's.
float* upload(Backend& be, const VF& h) {
  float* p = static_cast<float*>(be.alloc(h.size() * sizeof(float)));
  be.to_device(p, h.data(), h.size() * sizeof(float));
  return p;
}
VF download(Backend& be, const float* p, size_t n) {
  VF h(n);
  be.to_host(h.data(), p, n * sizeof(float));
  return h;
}

#define EXPECT_CLOSE(gpu_vec, cpu_vec, tol) \
  EXPECT_LE(rel_err(gpu_vec, cpu_vec), (tol)) << #gpu_vec " vs " #cpu_vec

// The attention probabilities (before dropout) of qkv [B,T,3C] as float64 rounded to float, att[B,NH,T,T],
// under backend.h's mask rule (mask: segment ids or 0/1, nullable; query i sees key j iff mask[j] != 0
// and mask[i] is 0 or mask[j]; causal: j <= i); a row that sees no key is zero. The native CUDA kernels
// save these; the CPU backend keeps only two floats per row and recomputes them in its backward.
VF attention_probs(const VF& qkv, const int32_t* mask, bool causal, int B, int T, int NH, int HS) {
  const size_t C = size_t(NH) * HS;
  VF att(size_t(B) * NH * T * T, 0.0f);
  std::vector<double> s(T);
  for (int b = 0; b < B; ++b)
    for (int h = 0; h < NH; ++h)
      for (int i = 0; i < T; ++i) {
        const int si = mask ? mask[size_t(b) * T + i] : 1;
        double mx = -std::numeric_limits<double>::infinity();
        for (int j = 0; j < T; ++j) {
          const int sj = mask ? mask[size_t(b) * T + j] : 1;
          if (sj == 0 || (si != 0 && sj != si) || (causal && j > i)) {
            s[j] = -std::numeric_limits<double>::infinity();
            continue;
          }
          double d = 0;
          for (int x = 0; x < HS; ++x)
            d += double(qkv[(size_t(b) * T + i) * 3 * C + size_t(h) * HS + x]) *
                 qkv[(size_t(b) * T + j) * 3 * C + C + size_t(h) * HS + x];
          s[j] = d / std::sqrt(double(HS));
          mx = std::max(mx, s[j]);
        }
        if (mx == -std::numeric_limits<double>::infinity()) continue;
        double den = 0;
        for (int j = 0; j < T; ++j) den += std::exp(s[j] - mx);
        for (int j = 0; j < T; ++j)
          att[((size_t(b) * NH + h) * T + i) * T + j] = float(std::exp(s[j] - mx) / den);
      }
  return att;
}

// ---- fixture: skip without a GPU, device buffers released after each test ----------------------------

class CudaOps : public ::testing::Test {
 protected:
  void SetUp() override {
    GpuState& g = gpu_state();
    if (!g.failure.empty()) FAIL() << "a CUDA device is present but the CUDA backend failed: " << g.failure;
    if (!g.be) GTEST_SKIP() << "no CUDA device: " << g.skip_reason;
  }
  void TearDown() override {
    if (!gpu_state().be) return;
    for (void* p : allocs_) gpu().release(p);
    allocs_.clear();
    gpu().synchronize();
  }

  Backend& gpu() { return *gpu_state().be; }

  template <typename T>
  T* put(const std::vector<T>& h) {
    T* p = static_cast<T*>(gpu().alloc(h.size() * sizeof(T)));
    allocs_.push_back(p);
    gpu().to_device(p, h.data(), h.size() * sizeof(T));
    return p;
  }
  float* nan_buf(size_t n) { return put(VF(n, std::numeric_limits<float>::quiet_NaN())); }
  VF get(const float* p, size_t n) {
    VF h(n);
    gpu().to_host(h.data(), p, n * sizeof(float));
    return h;
  }
  void set(float* p, const VF& h) { gpu().to_device(p, h.data(), h.size() * sizeof(float)); }

  // Dropout forward and backward with the masks of `rows` (rows_cpu's token keys in host memory,
  // rows_gpu's on the device): the GPU's results equal the CPU's bit for bit.
  void expect_dropout_same_as_cpu(const VF& x, const VF& dout, const VF& dx0, float p, uint64_t seed,
                                  const nlp::DropRows& rows_cpu, const nlp::DropRows& rows_gpu) {
    const size_t n = x.size();
    VF y_c(n), dx_c = dx0;
    cpu().dropout_forward(y_c.data(), x.data(), n, p, seed, rows_cpu);
    cpu().dropout_backward(dx_c.data(), dout.data(), n, p, seed, rows_cpu);
    float* gy = nan_buf(n);
    gpu().dropout_forward(gy, put(x), n, p, seed, rows_gpu);
    EXPECT_CLOSE(get(gy, n), y_c, kExact);
    float* gdx = put(dx0);
    gpu().dropout_backward(gdx, put(dout), n, p, seed, rows_gpu);
    EXPECT_CLOSE(get(gdx, n), dx_c, kExact);
  }

  // Attention forward and backward with dropout, causal and not, against the CPU's: qkv [B,T,3C],
  // dout [B,T,C], dq0 the starting dqkv, mask [B,T] (0/1 or segment ids), token_key [B,T] or empty,
  // T_key the key layout's row length. check_probs compares the saved probabilities with float64 ones too.
  void expect_attention_same_as_cpu(const VF& qkv, const VF& dout, const VF& dq0, const VI& mask,
                                    const VI& token_key, float p, uint64_t seed, int B, int T, int NH, int HS,
                                    int Tk, bool check_probs) {
    const size_t n = size_t(B) * T * NH * HS, nqkv = 3 * n, natt = size_t(B) * NH * T * T;
    const int32_t* key_c = token_key.empty() ? nullptr : token_key.data();
    const int32_t* key_g = token_key.empty() ? nullptr : put(token_key);
    const int32_t* gm = put(mask);
    for (bool causal : {false, true}) {
      SCOPED_TRACE(testing::Message() << "causal=" << causal);
      VF ao_c(n), att_c(cpu().attention_saved_floats(B, T, NH, HS)), dq_c = dq0;
      VF scr_c(cpu().attention_scratch_floats(B, T, NH, HS));
      cpu().attention_forward(ao_c.data(), att_c.data(), qkv.data(), mask.data(), causal, p, seed, B, T, NH, HS,
                              Tk, key_c);
      cpu().attention_backward(dq_c.data(), scr_c.data(), dout.data(), ao_c.data(), qkv.data(), att_c.data(),
                               mask.data(), causal, p, seed, B, T, NH, HS, Tk, key_c);
      float *gq = put(qkv), *gao = nan_buf(n), *ga = nan_buf(natt);
      gpu().attention_forward(gao, ga, gq, gm, causal, p, seed, B, T, NH, HS, Tk, key_g);
      EXPECT_CLOSE(get(gao, n), ao_c, kAttn);
      if (check_probs) EXPECT_CLOSE(get(ga, natt), attention_probs(qkv, mask.data(), causal, B, T, NH, HS), kAttn);
      float* gdq = put(dq0);
      gpu().attention_backward(gdq, nan_buf(natt), put(dout), gao, gq, ga, gm, causal, p, seed, B, T, NH, HS,
                               Tk, key_g);
      EXPECT_CLOSE(get(gdq, nqkv), dq_c, kAttn);
    }
  }

  std::vector<void*> allocs_;
};

// ====================================================================================================
// memory
// ====================================================================================================

TEST_F(CudaOps, MemoryZeroedAllocCopiesAndZero) {
  Backend& g = gpu();
  EXPECT_EQ(g.name(), "cuda");
  for (size_t bytes : {size_t(0), size_t(1), size_t(3), size_t(1000), size_t(1 << 20)}) {
    void* p = g.alloc(bytes);
    ASSERT_NE(p, nullptr);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(p) % 16, 0u) << bytes;
    std::vector<unsigned char> h(bytes, 0xAB);
    g.to_host(h.data(), p, bytes);
    EXPECT_EQ(std::count(h.begin(), h.end(), 0), (long)bytes) << "alloc not zeroed, " << bytes;
    g.release(p);
  }
  const size_t n = 4097;
  VF src = randn(n, 1), back(n, -1.f);
  float* d1 = put(src);
  float* d2 = nan_buf(n);
  g.copy(d2, d1, n * sizeof(float));
  EXPECT_TRUE(bitwise_equal(get(d2, n), src));
  g.zero(d2, n * sizeof(float));
  for (float x : get(d2, n)) ASSERT_EQ(x, 0.f);
}

TEST_F(CudaOps, FactoryChecksLocalRank) {
  std::string why;
  const int n = nlp::cuda_device_count(&why);
  EXPECT_THROW(nlp::make_backend("cuda", 1, n), nlp::Error);
  auto b = nlp::make_backend("cuda", 1, 0);
  EXPECT_EQ(b->name(), "cuda");
}

// The default backend (every fp32 test here) keeps the native attention: probabilities [B,NH,T,T].
TEST_F(CudaOps, DefaultBackendUsesNativeAttention) {
  for (int T : {7, 64, 1024}) {
    EXPECT_EQ(gpu().attention_saved_floats(2, T, 12, 64), size_t(2) * 12 * T * T) << T;
    EXPECT_EQ(gpu().attention_scratch_floats(2, T, 12, 64), size_t(2) * 12 * T * T) << T;
  }
}

// ====================================================================================================
// matmul (cuBLASLt), both layouts, bias epilogue, accumulation, odd shapes and alignments
// ====================================================================================================

struct MM {
  int M, K, N;
};

TEST_F(CudaOps, MatmulForwardBackward) {
  const MM shapes[] = {{64, 128, 96}, {37, 29, 53}, {5, 7, 1}, {256, 64, 768}, {1, 16, 3}};
  uint64_t seed = 100;
  for (const MM& s : shapes)
    for (WLayout layout : {WLayout::InOut, WLayout::OutIn})
      for (int bias_mode : {0, 1, 2}) {  // none, aligned, misaligned (offset by one float)
        SCOPED_TRACE(testing::Message() << "M=" << s.M << " K=" << s.K << " N=" << s.N << " "
                                        << (layout == WLayout::InOut ? "InOut" : "OutIn")
                                        << " bias=" << bias_mode);
        const size_t MK = size_t(s.M) * s.K, KN = size_t(s.K) * s.N, MN = size_t(s.M) * s.N;
        VF inp = randn(MK, ++seed), w = randn(KN, ++seed, 0.2f), biasv = randn(s.N + 1, ++seed);
        const float* cb = bias_mode == 0 ? nullptr : biasv.data() + (bias_mode == 2 ? 1 : 0);
        VF out_c(MN);
        cpu().matmul_forward(out_c.data(), inp.data(), w.data(), cb, s.M, s.K, s.N, layout);
        float* di = put(inp);
        float* dw = put(w);
        float* db = put(biasv);
        const float* gb = bias_mode == 0 ? nullptr : db + (bias_mode == 2 ? 1 : 0);
        float* dout_g = nan_buf(MN);
        gpu().matmul_forward(dout_g, di, dw, gb, s.M, s.K, s.N, layout);
        EXPECT_CLOSE(get(dout_g, MN), out_c, kOp);

        // backward: gradients pre-filled (accumulate), one of each null in turn
        VF dout = randn(MN, ++seed);
        VF dinp0 = randn(MK, ++seed), dw0 = randn(KN, ++seed), db0 = randn(s.N, ++seed);
        for (int null_mask : {0, 1, 2, 4}) {
          SCOPED_TRACE(testing::Message() << "null mask " << null_mask);
          VF dinp_c = dinp0, dw_c = dw0, db_c = db0;
          cpu().matmul_backward(null_mask & 1 ? nullptr : dinp_c.data(),
                                null_mask & 2 ? nullptr : dw_c.data(),
                                (null_mask & 4) || !bias_mode ? nullptr : db_c.data(), dout.data(),
                                inp.data(), w.data(), s.M, s.K, s.N, layout);
          float* g_dinp = put(dinp0);
          float* g_dw = put(dw0);
          float* g_db = put(db0);
          float* g_dout = put(dout);
          gpu().matmul_backward(null_mask & 1 ? nullptr : g_dinp, null_mask & 2 ? nullptr : g_dw,
                                (null_mask & 4) || !bias_mode ? nullptr : g_db, g_dout, di, dw,
                                s.M, s.K, s.N, layout);
          EXPECT_CLOSE(get(g_dinp, MK), dinp_c, kOp);
          EXPECT_CLOSE(get(g_dw, KN), dw_c, kOp);
          EXPECT_CLOSE(get(g_db, s.N), db_c, kOp);
        }
      }
}

TEST_F(CudaOps, MatmulKZeroGivesBias) {
  VF bias = randn(9, 7), out_c(4 * 9);
  cpu().matmul_forward(out_c.data(), nullptr, nullptr, bias.data(), 4, 0, 9, WLayout::OutIn);
  float* o = nan_buf(36);
  gpu().matmul_forward(o, nullptr, nullptr, put(bias), 4, 0, 9, WLayout::OutIn);
  EXPECT_CLOSE(get(o, 36), out_c, kExact);
}

// The reduced-precision GEMM modes (opt-in; parameters and every other op stay fp32): TF32 within
// 2e-3 and bf16 operands within 1e-2 of the fp32 CPU result (10- and 8-bit mantissas), and a GPT-2
// loss in bf16 mode within 1e-2 of the CPU loss.
TEST_F(CudaOps, MatmulTf32AndBf16Modes) {
  const int M = 96, K = 256, N = 160;
  VF inp = randn(size_t(M) * K, 150), w = randn(size_t(N) * K, 151, 0.1f), bias = randn(N, 152);
  VF dout = randn(size_t(M) * N, 153);
  VF out_c(size_t(M) * N), dinp_c(size_t(M) * K), dw_c(w.size()), db_c(N);
  cpu().matmul_forward(out_c.data(), inp.data(), w.data(), bias.data(), M, K, N, WLayout::OutIn);
  cpu().matmul_backward(dinp_c.data(), dw_c.data(), db_c.data(), dout.data(), inp.data(), w.data(),
                        M, K, N, WLayout::OutIn);
  for (auto [mode, tol] : {std::pair{nlp::CudaMatmul::Tf32, 2e-3}, std::pair{nlp::CudaMatmul::Bf16, 1e-2}}) {
    SCOPED_TRACE(mode == nlp::CudaMatmul::Tf32 ? "tf32" : "bf16");
    auto be = nlp::make_cuda_backend(0, {mode});
    auto up = [&](const VF& h) { return upload(*be, h); };
    auto down = [&](const float* p, size_t n) { return download(*be, p, n); };
    float *gi = up(inp), *gw = up(w), *gb = up(bias), *gd = up(dout);
    float* go = up(VF(out_c.size(), std::numeric_limits<float>::quiet_NaN()));
    float *gdi = up(VF(dinp_c.size(), 0.f)), *gdw = up(VF(dw_c.size(), 0.f)), *gdb = up(VF(N, 0.f));
    be->matmul_forward(go, gi, gw, gb, M, K, N, WLayout::OutIn);
    be->matmul_backward(gdi, gdw, gdb, gd, gi, gw, M, K, N, WLayout::OutIn);
    EXPECT_LE(rel_err(down(go, out_c.size()), out_c), tol);
    EXPECT_LE(rel_err(down(gdi, dinp_c.size()), dinp_c), tol);
    EXPECT_LE(rel_err(down(gdw, dw_c.size()), dw_c), tol);
    EXPECT_LE(rel_err(down(gdb, N), db_c), kOp);  // the bias gradient is an fp32 reduction
    for (float* p : {gi, gw, gb, gd, go, gdi, gdw, gdb}) be->release(p);
    be->synchronize();
  }
}

// bf16 mode against the CPU's fp32 GEMMs on the bf16-rounded operands: the same function up to the
// fp32 summation order (1e-4, where one operand element converted wrongly, e.g. at the boundary of two
// arrays in the one conversion launch, gives ~1e-2), both layouts, even and odd shapes.
TEST_F(CudaOps, MatmulBf16EqualsFp32OnRoundedOperands) {
  constexpr double kBf16Gemm = 1e-4;
  auto be = nlp::make_cuda_backend(0, {nlp::CudaMatmul::Bf16});
  const int shapes[][3] = {{96, 256, 160}, {37, 51, 29}};
  uint64_t seed = 170;
  for (const auto& sh : shapes)
    for (WLayout layout : {WLayout::OutIn, WLayout::InOut}) {
      const int M = sh[0], K = sh[1], N = sh[2];
      SCOPED_TRACE(testing::Message() << M << "x" << K << "x" << N << (layout == WLayout::OutIn ? " OutIn" : " InOut"));
      const VF inp = randn(size_t(M) * K, ++seed), w = randn(size_t(N) * K, ++seed, 0.1f), bias = randn(N, ++seed);
      const VF dout = randn(size_t(M) * N, ++seed), dinp0 = randn(size_t(M) * K, ++seed), dw0 = randn(w.size(), ++seed);
      const VF ri = round_bf16(inp), rw = round_bf16(w), rd = round_bf16(dout);
      VF out_c(size_t(M) * N), dinp_c = dinp0, dw_c = dw0;
      cpu().matmul_forward(out_c.data(), ri.data(), rw.data(), bias.data(), M, K, N, layout);
      cpu().matmul_backward(dinp_c.data(), dw_c.data(), nullptr, rd.data(), ri.data(), rw.data(), M, K, N, layout);
      auto up = [&](const VF& h) { return upload(*be, h); };
      auto down = [&](const float* p, size_t n) { return download(*be, p, n); };
      float *gi = up(inp), *gw = up(w), *gb = up(bias), *gd = up(dout), *go = up(VF(out_c.size(), NAN));
      float *gdi = up(dinp0), *gdw = up(dw0);
      be->matmul_forward(go, gi, gw, gb, M, K, N, layout);
      be->matmul_backward(gdi, gdw, nullptr, gd, gi, gw, M, K, N, layout);
      EXPECT_LE(rel_err(down(go, out_c.size()), out_c), kBf16Gemm);
      EXPECT_LE(rel_err(down(gdi, dinp_c.size()), dinp_c), kBf16Gemm);
      EXPECT_LE(rel_err(down(gdw, dw_c.size()), dw_c), kBf16Gemm);
      // each product alone (the conversion launch then holds two arrays, not three)
      float *gdi2 = up(dinp0), *gdw2 = up(dw0);
      be->matmul_backward(gdi2, nullptr, nullptr, gd, gi, gw, M, K, N, layout);
      be->matmul_backward(nullptr, gdw2, nullptr, gd, gi, gw, M, K, N, layout);
      EXPECT_LE(rel_err(down(gdi2, dinp_c.size()), dinp_c), kBf16Gemm);
      EXPECT_LE(rel_err(down(gdw2, dw_c.size()), dw_c), kBf16Gemm);
      for (float* p : {gi, gw, gb, gd, go, gdi, gdw, gdi2, gdw2}) be->release(p);
      be->synchronize();
    }
}

// The bf16 GEMM's operands as a backend made with NLPTRAIN_CUDA_BF16_CAST = `cast` rounds them, carried
// out of the GEMM by an identity matrix (exact in bf16, one non-zero product per output): out = X @ I
// shows X's copy, I @ W shows W's, and the backward with inp = W = I shows dout's in dinp and
// (transposed for OutIn) in dW, with three arrays in the one conversion launch. `same(got, rounded,
// orig)` asks each to be bitwise equal: got from the GPU, rounded = the host's round_bf16 of orig (in
// got's layout).
// Data: ties (exactly halfway between two bf16 values: round to even), values just either side of a
// tie, large and negative values; sizes with and without a multiple of 8 elements, over one and many
// blocks; arrays at a 16-byte aligned address and one float past it (the per-element path).
static void check_bf16_operands(const char* cast) {
  auto same = [](const VF& got, const VF& rounded, const VF&) { return bitwise_equal(got, rounded); };
  auto data = [](size_t n, uint64_t seed) {
    VF v = randn(n, seed, 3.0f);
    for (size_t i = 0; i < n; ++i) {
      uint32_t u;
      std::memcpy(&u, &v[i], sizeof u);
      if (i % 4 == 1) u = (u & 0xffff0000u) | 0x8000u;                           // a tie
      if (i % 4 == 2) u = (u & 0xffff0000u) | (i % 8 == 2 ? 0x7fffu : 0x8001u);  // beside one
      std::memcpy(&v[i], &u, sizeof u);
      if (i % 16 == 3) v[i] *= 1e30f;
    }
    return v;
  };
  auto transpose = [](const VF& a, int S) {
    VF t(a.size());
    for (int r = 0; r < S; ++r)
      for (int c = 0; c < S; ++c) t[size_t(c) * S + r] = a[size_t(r) * S + c];
    return t;
  };
  ::setenv("NLPTRAIN_CUDA_BF16_CAST", cast, 1);
  auto be = nlp::make_cuda_backend(0, {nlp::CudaMatmul::Bf16});
  ::unsetenv("NLPTRAIN_CUDA_BF16_CAST");
  EXPECT_NE(be->details().find(std::string("casts: ") + cast), std::string::npos) << be->details();
  uint64_t seed = 2100;
  for (int S : {29, 200, 203})  // S*S elements: 841 (one block), 40000, 41209 (not a multiple of 8)
    for (int offset : {0, 1})
      for (WLayout layout : {WLayout::OutIn, WLayout::InOut}) {
        SCOPED_TRACE(testing::Message() << cast << " S=" << S << " offset=" << offset
                                        << (layout == WLayout::OutIn ? " OutIn" : " InOut"));
        const size_t n = size_t(S) * S;
        VF eye(n, 0.0f);
        for (int i = 0; i < S; ++i) eye[size_t(i) * S + i] = 1.0f;
        const VF x = data(n, ++seed), w = data(n, ++seed), d = data(n, ++seed);
        auto up_at = [&](const VF& h) {  // h at `offset` floats into a fresh allocation
          VF padded(offset, 0.0f);
          padded.insert(padded.end(), h.begin(), h.end());
          return upload(*be, padded);
        };
        float *bx = up_at(x), *bw = up_at(w), *bd = up_at(d), *gi = upload(*be, eye);
        float *gx = bx + offset, *gw = bw + offset, *gd = bd + offset;
        float *go = upload(*be, VF(n, NAN)), *gdi = upload(*be, VF(n, 0.0f)), *gdw = upload(*be, VF(n, 0.0f));
        const bool outin = layout == WLayout::OutIn;
        auto t = [&](const VF& v) { return outin ? transpose(v, S) : v; };
        be->matmul_forward(go, gx, gi, nullptr, S, S, S, layout);  // X @ I
        EXPECT_TRUE(same(download(*be, go, n), round_bf16(x), x)) << "inp operand";
        be->matmul_forward(go, gi, gw, nullptr, S, S, S, layout);  // I @ W (W^T for OutIn)
        EXPECT_TRUE(same(download(*be, go, n), t(round_bf16(w)), t(w))) << "weight operand";
        be->matmul_backward(gdi, gdw, nullptr, gd, gi, gi, S, S, S, layout);  // dout, inp, w in one launch
        EXPECT_TRUE(same(download(*be, gdi, n), round_bf16(d), d)) << "dout operand (dinp)";
        EXPECT_TRUE(same(download(*be, gdw, n), t(round_bf16(d)), t(d))) << "dout operand (dW)";
        for (float* p : {bx, bw, bd, gi, go, gdi, gdw}) be->release(p);
        be->synchronize();
      }
}

// Our cast kernels (kern::to_bf16_many: 8-wide by default, NLPTRAIN_CUDA_BF16_CAST=scalar for the
// kernel of the earlier GPU runs) give each element exactly the host's round_bf16; anything but
// vector/scalar is refused (also "library": cuBLAS's own conversion, removed after the H200 run).
// (bench/gpu/run.sh falls back to the scalar kernel if this fails.)
TEST_F(CudaOps, Bf16OperandCastsRoundAsTheHost) {
  for (const char* cast : {"vector", "scalar"})
    check_bf16_operands(cast);
  for (const char* bad : {"fast", "library"}) {
    ::setenv("NLPTRAIN_CUDA_BF16_CAST", bad, 1);
    EXPECT_THROW(nlp::make_cuda_backend(0, {nlp::CudaMatmul::Bf16}), nlp::Error) << bad;
  }
  ::unsetenv("NLPTRAIN_CUDA_BF16_CAST");
}

// ====================================================================================================
// layer norm
// ====================================================================================================

TEST_F(CudaOps, LayerNormForwardBackward) {
  const int shapes[][2] = {{67, 96}, {300, 768}, {5, 33}, {1, 1000}};
  uint64_t seed = 200;
  for (const auto& sh : shapes) {
    const int N = sh[0], C = sh[1];
    SCOPED_TRACE(testing::Message() << "N=" << N << " C=" << C);
    const size_t n = size_t(N) * C;
    VF x = randn(n, ++seed, 2.0f), w = randn(C, ++seed), b = randn(C, ++seed);
    for (size_t i = 0; i < n; ++i) x[i] += 3.0f;  // non-zero mean
    VF out_c(n), mean_c(N), rstd_c(N);
    cpu().layernorm_forward(out_c.data(), mean_c.data(), rstd_c.data(), x.data(), w.data(),
                            b.data(), N, C, 1e-5f);
    float *gx = put(x), *gw = put(w), *gb = put(b);
    float *go = nan_buf(n), *gm = nan_buf(N), *gr = nan_buf(N);
    gpu().layernorm_forward(go, gm, gr, gx, gw, gb, N, C, 1e-5f);
    EXPECT_CLOSE(get(go, n), out_c, kOp);
    EXPECT_CLOSE(get(gm, N), mean_c, kOp);
    EXPECT_CLOSE(get(gr, N), rstd_c, kOp);

    VF dout = randn(n, ++seed), dx0 = randn(n, ++seed), dw0 = randn(C, ++seed), db0 = randn(C, ++seed);
    VF dx_c = dx0, dw_c = dw0, db_c = db0;
    cpu().layernorm_backward(dx_c.data(), dw_c.data(), db_c.data(), dout.data(), x.data(), w.data(),
                             mean_c.data(), rstd_c.data(), N, C);
    float *gdx = put(dx0), *gdw = put(dw0), *gdb = put(db0);
    gpu().layernorm_backward(gdx, gdw, gdb, put(dout), gx, gw, gm, gr, N, C);
    EXPECT_CLOSE(get(gdx, n), dx_c, kOp);
    EXPECT_CLOSE(get(gdw, C), dw_c, kOp);
    EXPECT_CLOSE(get(gdb, C), db_c, kOp);
  }
}

// The fused residual + dropout + layer norm kernels (the CUDA backend's residual_layernorm_forward and
// layernorm_dropout_backward) against Backend's defaults on the same GPU, which run dropout, add and
// layer norm in turn (each compared with the CPU above): bitwise equal, forward and backward, p = 0
// and 0.3, flat, trimmed (row-keyed) and packed (token-keyed) masks, delta aliasing res as the blocks
// call it; and against the CPU backend's fused pass (the same mask; layer norm within kOp). Then
// NLPTRAIN_CUDA_FUSED_LN: 0 gives a backend on the defaults (the same bits), anything but 0/1 is refused.
TEST_F(CudaOps, FusedResidualLayerNormEqualsTheOpsInTurn) {
  const int B = 3, T = 45, Tk = 64, C = 200, N = B * T;  // C not a multiple of 32: partial lanes
  const size_t n = size_t(N) * C;
  const uint64_t seed = nlp::derive_seed(95, 2, 4);
  VI keys(N);
  for (int i = 0; i < N; ++i) keys[i] = (i * 7) % (B * Tk);  // distinct example * Tk + position keys
  const int32_t* gkeys = put(keys);
  const nlp::DropRows cpu_rows[] = {nlp::drop_rows(T, 0, C), nlp::drop_rows(T, Tk, C),
                                    nlp::drop_rows(T, Tk, C, keys.data())};
  const nlp::DropRows gpu_rows[] = {cpu_rows[0], cpu_rows[1], nlp::drop_rows(T, Tk, C, gkeys)};
  const char* names[] = {"flat", "trimmed", "packed"};
  VF x = randn(n, 640, 2.0f), delta = randn(n, 641), w = randn(C, 642), b = randn(C, 643);
  for (float& v : x) v += 1.5f;  // non-zero row means
  const VF dout = randn(n, 644), dinp0 = randn(n, 645), dw0 = randn(C, 646), db0 = randn(C, 647);
  float *gx = put(x), *gw = put(w), *gb = put(b), *gdout = put(dout);
  auto run = [&](Backend& be, bool fused_call, float p, const nlp::DropRows& rows) {
    std::vector<VF> r;  // res, out, mean, rstd, dinp, ddelta, dw, db
    float *res = put(delta), *out = nan_buf(n), *mean = nan_buf(N), *rstd = nan_buf(N);
    if (fused_call)
      be.residual_layernorm_forward(res, out, mean, rstd, gx, res, gw, gb, N, C, 1e-5f, p, seed, rows);
    else
      be.Backend::residual_layernorm_forward(res, out, mean, rstd, gx, res, gw, gb, N, C, 1e-5f, p, seed, rows);
    float *di = put(dinp0), *dd = nan_buf(n), *scratch = nan_buf(n), *dw = put(dw0), *db = put(db0);
    if (fused_call)
      be.layernorm_dropout_backward(di, dd, scratch, dw, db, gdout, res, gw, mean, rstd, N, C, p, seed, rows);
    else
      be.Backend::layernorm_dropout_backward(di, dd, scratch, dw, db, gdout, res, gw, mean, rstd, N, C, p,
                                             seed, rows);
    be.synchronize();  // `be` may be another backend (stream) than the one get() reads through
    for (auto [ptr, cnt] : {std::pair<float*, size_t>{res, n}, {out, n}, {mean, N}, {rstd, N}, {di, n},
                            {dd, n}, {dw, C}, {db, C}})
      r.push_back(get(ptr, cnt));
    return r;
  };
  const char* what[] = {"res", "out", "mean", "rstd", "dinp", "ddelta", "dw", "db"};
  for (float p : {0.0f, 0.3f})
    for (int v = 0; v < 3; ++v) {
      SCOPED_TRACE(testing::Message() << names[v] << " p=" << p);
      const auto fused = run(gpu(), true, p, gpu_rows[v]);
      const auto ops = run(gpu(), false, p, gpu_rows[v]);
      for (int k = 0; k < 8; ++k)
        EXPECT_TRUE(bitwise_equal(fused[k], ops[k])) << what[k] << ": " << rel_err(fused[k], ops[k]);
      // the CPU's fused pass: the same mask (res exactly), layer norm and its gradients within kOp
      VF res_c = delta, out_c(n), m_c(N), r_c(N);
      cpu().residual_layernorm_forward(res_c.data(), out_c.data(), m_c.data(), r_c.data(), x.data(), res_c.data(),
                                       w.data(), b.data(), N, C, 1e-5f, p, seed, cpu_rows[v]);
      VF di_c = dinp0, dd_c(n), dw_c = dw0, db_c = db0, scr(n);
      cpu().layernorm_dropout_backward(di_c.data(), dd_c.data(), scr.data(), dw_c.data(), db_c.data(), dout.data(),
                                       res_c.data(), w.data(), m_c.data(), r_c.data(), N, C, p, seed, cpu_rows[v]);
      EXPECT_CLOSE(fused[0], res_c, kExact);
      EXPECT_CLOSE(fused[1], out_c, kOp);
      EXPECT_CLOSE(fused[4], di_c, kOp);
      EXPECT_CLOSE(fused[5], dd_c, kOp);
      EXPECT_CLOSE(fused[6], dw_c, kOp);
      EXPECT_CLOSE(fused[7], db_c, kOp);
      if (p > 0) {  // the mask is applied: some of delta's elements did not reach res
        size_t dropped = 0;
        for (size_t i = 0; i < n; ++i) dropped += fused[0][i] == x[i];
        EXPECT_GT(dropped, n / 10);
      }
    }
  // NLPTRAIN_CUDA_FUSED_LN
  ::setenv("NLPTRAIN_CUDA_FUSED_LN", "2", 1);
  EXPECT_THROW(nlp::make_cuda_backend(0), nlp::Error);
  ::setenv("NLPTRAIN_CUDA_FUSED_LN", "0", 1);
  {
    auto plain = nlp::make_cuda_backend(0);
    EXPECT_NE(plain->details().find("separate ops"), std::string::npos) << plain->details();
    EXPECT_NE(gpu().details().find("fused kernels"), std::string::npos) << gpu().details();
    const auto a = run(*plain, true, 0.3f, gpu_rows[2]), c = run(gpu(), true, 0.3f, gpu_rows[2]);
    for (int k = 0; k < 8; ++k) EXPECT_TRUE(bitwise_equal(a[k], c[k])) << "NLPTRAIN_CUDA_FUSED_LN=0: " << what[k];
  }
  ::unsetenv("NLPTRAIN_CUDA_FUSED_LN");
}

// ====================================================================================================
// GELU, elementwise, rows, dropout
// ====================================================================================================

TEST_F(CudaOps, GeluBothForms) {
  const size_t n = 100003;
  VF x = randn(n, 300, 3.0f), dout = randn(n, 301), d0 = randn(n, 302);
  for (Gelu form : {Gelu::Tanh, Gelu::Erf}) {
    SCOPED_TRACE(form == Gelu::Tanh ? "tanh" : "erf");
    VF out_c(n), d_c = d0;
    cpu().gelu_forward(out_c.data(), x.data(), n, form);
    cpu().gelu_backward(d_c.data(), x.data(), dout.data(), n, form);
    float* gx = put(x);
    float* go = nan_buf(n);
    float* gd = put(d0);
    gpu().gelu_forward(go, gx, n, form);
    gpu().gelu_backward(gd, gx, put(dout), n, form);
    EXPECT_CLOSE(get(go, n), out_c, kOp);
    EXPECT_CLOSE(get(gd, n), d_c, kOp);
  }
}

TEST_F(CudaOps, AddAccumulateScaleTanh) {
  const size_t n = 70001;
  VF a = randn(n, 400), b = randn(n, 401), c = randn(n, 402);
  // add (fresh output and aliased output)
  VF add_c(n);
  cpu().add(add_c.data(), a.data(), b.data(), n);
  float *ga = put(a), *gb = put(b), *go = nan_buf(n);
  gpu().add(go, ga, gb, n);
  EXPECT_CLOSE(get(go, n), add_c, kExact);
  gpu().add(ga, ga, gb, n);
  EXPECT_CLOSE(get(ga, n), add_c, kExact);
  // accumulate, scale
  VF acc_c = c;
  cpu().accumulate(acc_c.data(), a.data(), n);
  cpu().scale(acc_c.data(), -0.37f, n);
  float* gc = put(c);
  gpu().accumulate(gc, put(a), n);
  gpu().scale(gc, -0.37f, n);
  EXPECT_CLOSE(get(gc, n), acc_c, kExact);
  // tanh
  VF t_c(n), dt_c = c;
  cpu().tanh_forward(t_c.data(), a.data(), n);
  cpu().tanh_backward(dt_c.data(), t_c.data(), b.data(), n);
  float* gt = nan_buf(n);
  gpu().tanh_forward(gt, put(a), n);
  EXPECT_CLOSE(get(gt, n), t_c, kOp);
  float* gdt = put(c);
  gpu().tanh_backward(gdt, put(t_c), put(b), n);
  EXPECT_CLOSE(get(gdt, n), dt_c, kOp);
}

TEST_F(CudaOps, RowsGatherScatterAdd) {
  const int B = 6, T = 11, C = 40;
  const size_t stride = size_t(T) * C;
  VF x = randn(size_t(B) * T * C, 500), d = randn(size_t(B) * C, 501), g0 = randn(x.size(), 502);
  VF out_c(size_t(B) * C), g_c = g0;
  cpu().rows_gather(out_c.data(), x.data(), B, C, stride);
  cpu().rows_scatter_add(g_c.data(), d.data(), B, C, stride);
  float* go = nan_buf(out_c.size());
  gpu().rows_gather(go, put(x), B, C, stride);
  EXPECT_CLOSE(get(go, out_c.size()), out_c, kExact);
  float* gg = put(g0);
  gpu().rows_scatter_add(gg, put(d), B, C, stride);
  EXPECT_CLOSE(get(gg, g0.size()), g_c, kExact);
  // by index (the MLM head's masked positions): distinct rows of [B*T, C], unordered
  const VI idx = {17, 3, 60, 41, 0, 65, 22, 9, 50, 31, 12, 47, 5};
  const int n = int(idx.size());
  VF oi_c(size_t(n) * C), gi_c = g0, di = randn(size_t(n) * C, 503);
  cpu().rows_gather(oi_c.data(), x.data(), n, C, C, idx.data());
  cpu().rows_scatter_add(gi_c.data(), di.data(), n, C, C, idx.data());
  int32_t* gidx = static_cast<int32_t*>(gpu().alloc(idx.size() * sizeof(int32_t)));
  gpu().to_device(gidx, idx.data(), idx.size() * sizeof(int32_t));
  float* goi = nan_buf(oi_c.size());
  gpu().rows_gather(goi, put(x), n, C, C, gidx);
  EXPECT_CLOSE(get(goi, oi_c.size()), oi_c, kExact);
  float* ggi = put(g0);
  gpu().rows_scatter_add(ggi, put(di), n, C, C, gidx);
  EXPECT_CLOSE(get(ggi, g0.size()), gi_c, kExact);
  gpu().release(gidx);
}

TEST_F(CudaOps, DropoutSameMaskAsCpu) {
  const size_t n = 123457;
  VF x = randn(n, 600), d = randn(n, 601), g0 = randn(n, 602);
  for (float p : {0.0f, 0.1f, 0.5f, 1.0f}) {
    SCOPED_TRACE(testing::Message() << "p=" << p);
    const uint64_t seed = nlp::derive_seed(77, 3, 1);
    VF out_c(n), g_c = g0;
    cpu().dropout_forward(out_c.data(), x.data(), n, p, seed);
    cpu().dropout_backward(g_c.data(), d.data(), n, p, seed);
    float* go = nan_buf(n);
    float* gx = put(x);
    gpu().dropout_forward(go, gx, n, p, seed);
    EXPECT_CLOSE(get(go, n), out_c, kExact);
    gpu().dropout_forward(gx, gx, n, p, seed);  // in place
    EXPECT_CLOSE(get(gx, n), out_c, kExact);
    float* gg = put(g0);
    gpu().dropout_backward(gg, put(d), n, p, seed);
    EXPECT_CLOSE(get(gg, n), g_c, kExact);
  }
}

// ====================================================================================================
// embeddings (deterministic sort-based backward)
// ====================================================================================================

TEST_F(CudaOps, EmbeddingForwardBackward) {
  const int B = 5, T = 61, C = 48, V = 37, P = 80, TT = 3, off = 7;
  const size_t BT = size_t(B) * T;
  VI ids = randi(BT, 700, 0, V), types = randi(BT, 701, 0, TT);
  for (size_t i = 40; i < 200; ++i) ids[i] = 5;  // a long run of one id (chunk boundaries)
  VF wte = randn(size_t(V) * C, 702), wpe = randn(size_t(P) * C, 703), wtt = randn(size_t(TT) * C, 704);
  for (bool use_types : {false, true}) {
    SCOPED_TRACE(use_types ? "with types" : "no types");
    VF out_c(BT * C);
    cpu().embedding_forward(out_c.data(), ids.data(), use_types ? types.data() : nullptr,
                            wte.data(), wpe.data(), use_types ? wtt.data() : nullptr, B, T, C, off);
    int32_t *gids = put(ids), *gtypes = put(types);
    float *gwte = put(wte), *gwpe = put(wpe), *gwtt = put(wtt);
    float* go = nan_buf(BT * C);
    gpu().embedding_forward(go, gids, use_types ? gtypes : nullptr, gwte, gwpe,
                            use_types ? gwtt : nullptr, B, T, C, off);
    EXPECT_CLOSE(get(go, BT * C), out_c, kExact);

    VF dout = randn(BT * C, 705);
    VF te0 = randn(wte.size(), 706), pe0 = randn(wpe.size(), 707), tt0 = randn(wtt.size(), 708);
    VF te_c = te0, pe_c = pe0, tt_c = tt0;
    cpu().embedding_backward(te_c.data(), pe_c.data(), use_types ? tt_c.data() : nullptr,
                             dout.data(), ids.data(), use_types ? types.data() : nullptr, B, T, C,
                             off);
    float *gte = put(te0), *gpe = put(pe0), *gtt = put(tt0), *gd = put(dout);
    gpu().embedding_backward(gte, gpe, use_types ? gtt : nullptr, gd, gids,
                             use_types ? gtypes : nullptr, B, T, C, off);
    EXPECT_CLOSE(get(gte, wte.size()), te_c, kOp);
    EXPECT_CLOSE(get(gpe, wpe.size()), pe_c, kOp);
    EXPECT_CLOSE(get(gtt, wtt.size()), tt_c, kOp);
    // deterministic: a second run from the same start gives the same bits
    float* gte2 = put(te0);
    gpu().embedding_backward(gte2, nullptr, nullptr, gd, gids, nullptr, B, T, C, off);
    VF r1 = get(gte2, wte.size());
    set(gte2, te0);
    gpu().embedding_backward(gte2, nullptr, nullptr, gd, gids, nullptr, B, T, C, off);
    EXPECT_TRUE(bitwise_equal(get(gte2, wte.size()), r1));
  }
}

// ====================================================================================================
// attention
// ====================================================================================================

struct AttnShape {
  int B, T, NH, HS;
};

VI attn_mask_for(int B, int T) {  // b0 right-padded, b1 keys 0 and 3 masked, b2 fully masked
  VI m(size_t(B) * T, 1);
  for (int t = T - 2; t < T; ++t) m[t] = 0;
  if (B > 1) m[size_t(T)] = m[size_t(T) + 3] = 0;
  if (B > 2)
    for (int t = 0; t < T; ++t) m[2 * size_t(T) + t] = 0;
  return m;
}

// Packed rows (data.padding's segment ids, backend.h): each row holds examples of 1..T/3 positions
// numbered 1, 2, ... and a padding tail.
VI segment_mask_for(int B, int T) {
  VI m(size_t(B) * T, 0);
  for (int b = 0; b < B; ++b) {
    int t = 0, id = 0, len = 1 + b;
    while (t + len <= T - 2) {
      ++id;
      for (int k = 0; k < len; ++k) m[size_t(b) * T + t + k] = id;
      t += len;
      len = 1 + (len * 7 + 3) % std::max(1, T / 3);
    }
  }
  return m;
}

TEST_F(CudaOps, AttentionForwardBackward) {
  const AttnShape shapes[] = {{3, 7, 3, 4}, {3, 77, 2, 64}, {2, 130, 4, 16}, {1, 64, 1, 64}};
  uint64_t seed = 800;
  for (const AttnShape& s : shapes)
    for (bool causal : {false, true})
      for (int masked : {0, 1, 2})  // none, key padding, packed segment ids
        for (float p : {0.0f, 0.2f}) {
          SCOPED_TRACE(testing::Message() << "B=" << s.B << " T=" << s.T << " NH=" << s.NH
                                          << " HS=" << s.HS << " causal=" << causal
                                          << " mask=" << masked << " p=" << p);
          const int C = s.NH * s.HS;
          const size_t nqkv = size_t(s.B) * s.T * 3 * C, nout = size_t(s.B) * s.T * C;
          const size_t natt = size_t(s.B) * s.NH * s.T * s.T;
          const uint64_t dseed = nlp::derive_seed(seed, 1, 2);
          VF qkv = randn(nqkv, ++seed, 1.5f);
          VI mask = masked == 2 ? segment_mask_for(s.B, s.T) : attn_mask_for(s.B, s.T);
          const int32_t* cm = masked ? mask.data() : nullptr;
          VF out_c(nout), att_c(cpu().attention_saved_floats(s.B, s.T, s.NH, s.HS));
          cpu().attention_forward(out_c.data(), att_c.data(), qkv.data(), cm, causal, p, dseed,
                                  s.B, s.T, s.NH, s.HS);
          float* gq = put(qkv);
          int32_t* gm = masked ? put(mask) : nullptr;
          float *go = nan_buf(nout), *ga = nan_buf(natt);
          gpu().attention_forward(go, ga, gq, gm, causal, p, dseed, s.B, s.T, s.NH, s.HS);
          EXPECT_CLOSE(get(go, nout), out_c, kAttn);
          EXPECT_CLOSE(get(ga, natt), attention_probs(qkv, cm, causal, s.B, s.T, s.NH, s.HS), kAttn);

          VF dout = randn(nout, ++seed), dq0 = randn(nqkv, ++seed);
          VF dq_c = dq0, scratch_c(cpu().attention_scratch_floats(s.B, s.T, s.NH, s.HS));
          cpu().attention_backward(dq_c.data(), scratch_c.data(), dout.data(), out_c.data(), qkv.data(),
                                   att_c.data(), cm, causal, p, dseed, s.B, s.T, s.NH, s.HS);
          float* gdq = put(dq0);
          float* gscratch = nan_buf(natt);  // contents undefined: must not leak into dqkv
          gpu().attention_backward(gdq, gscratch, put(dout), go, gq, ga, gm, causal, p, dseed, s.B,
                                   s.T, s.NH, s.HS);
          EXPECT_CLOSE(get(gdq, nqkv), dq_c, kAttn);
        }
}

// data.padding = longest: a batch trimmed to T' < T_key positions keys its masks by the untrimmed
// layout (DropRows, T_key). The CPU's keyed ops equal the padded batch's (test_padding.cpp); these
// equal the CPU's keyed ops, the same masks on both backends.
TEST_F(CudaOps, KeyedDropoutAndAttentionSameMasksAsCpu) {
  const int B = 3, Tn = 21, Tk = 48, NH = 2, HS = 16, C = NH * HS;
  const float p = 0.2f;
  const uint64_t seed = nlp::derive_seed(91, 4, 2);
  const size_t n = size_t(B) * Tn * C;
  const nlp::DropRows rows = nlp::drop_rows(Tn, Tk, C);
  expect_dropout_same_as_cpu(randn(n, 610), randn(n, 611), randn(n, 612), p, seed, rows, rows);

  const size_t nqkv = size_t(B) * Tn * 3 * C;
  expect_attention_same_as_cpu(randn(nqkv, 613, 1.5f), randn(n, 614), randn(nqkv, 615), attn_mask_for(B, Tn), {},
                               p, seed, B, Tn, NH, HS, Tk, /*check_probs=*/false);
}

// data.packing: position ids, per-token dropout keys (DropRows token_key) and packed attention with
// token keys (core/backend.h) against the CPU backend's, which test_padding.cpp checks against each
// example alone and the padded batch.
TEST_F(CudaOps, PackedRowsSameAsCpu) {
  const int B = 2, T = 40, Tk = 32, NH = 2, HS = 16, C = NH * HS, V = 50, P = 64;
  const float p = 0.2f;
  const uint64_t seed = nlp::derive_seed(93, 1, 7);
  VI seg = segment_mask_for(B, T), pos(size_t(B) * T, 0), key(size_t(B) * T, 0), ids(size_t(B) * T);
  int example = 0;
  for (int b = 0; b < B; ++b)
    for (int t = 0; t < T; ++t) {
      const size_t i = size_t(b) * T + t;
      ids[i] = int(i * 7 % V);
      if (seg[i] == 0) continue;
      const bool first = t == 0 || seg[i - 1] != seg[i];
      if (first && !(b == 0 && t == 0)) ++example;
      pos[i] = first ? 0 : pos[i - 1] + 1;
      key[i] = example * Tk + pos[i];
    }
  const size_t n = size_t(B) * T * C;
  // embeddings with position ids
  VF wte = randn(size_t(V) * C, 620), wpe = randn(size_t(P) * C, 621), out_c(n);
  cpu().embedding_forward(out_c.data(), ids.data(), nullptr, wte.data(), wpe.data(), nullptr, B, T, C, 0,
                          pos.data());
  int32_t *gids = put(ids), *gpos = put(pos), *gkey = put(key);
  float* go = nan_buf(n);
  gpu().embedding_forward(go, gids, nullptr, put(wte), put(wpe), nullptr, B, T, C, 0, gpos);
  EXPECT_CLOSE(get(go, n), out_c, kExact);
  VF dout = randn(n, 622), pe0 = randn(wpe.size(), 623), pe_c = pe0;
  cpu().embedding_backward(nullptr, pe_c.data(), nullptr, dout.data(), ids.data(), nullptr, B, T, C, 0,
                           pos.data());
  float* gpe = put(pe0);
  gpu().embedding_backward(nullptr, gpe, nullptr, put(dout), gids, nullptr, B, T, C, 0, gpos);
  EXPECT_CLOSE(get(gpe, wpe.size()), pe_c, kOp);
  // hidden-state dropout keyed per token
  expect_dropout_same_as_cpu(randn(n, 624), dout, randn(n, 625), p, seed, nlp::drop_rows(T, Tk, C, key.data()),
                             nlp::drop_rows(T, Tk, C, gkey));
  // packed attention with token keys (probabilities of other examples are 0: their keys do not matter)
  const size_t nqkv = size_t(B) * T * 3 * C;
  expect_attention_same_as_cpu(randn(nqkv, 626, 1.5f), dout, randn(nqkv, 627), seg, key, p, seed, B, T, NH, HS, Tk,
                               /*check_probs=*/true);
}

TEST_F(CudaOps, AttentionDecodeWithKvCache) {
  const int B = 3, NH = 4, HS = 32, Tmax = 70, C = NH * HS;
  const size_t ncache = size_t(B) * NH * Tmax * HS;
  VF kc0 = randn(ncache, 900), vc0 = randn(ncache, 901);
  for (int pos : {0, 1, 33, 69}) {
    SCOPED_TRACE(testing::Message() << "pos=" << pos);
    VF qkv = randn(size_t(B) * 3 * C, 902 + pos);
    VF kc_c = kc0, vc_c = vc0, out_c(size_t(B) * C);
    cpu().attention_decode(out_c.data(), qkv.data(), kc_c.data(), vc_c.data(), B, pos, Tmax, NH, HS);
    float *gk = put(kc0), *gv = put(vc0), *go = nan_buf(out_c.size());
    gpu().attention_decode(go, put(qkv), gk, gv, B, pos, Tmax, NH, HS);
    EXPECT_CLOSE(get(go, out_c.size()), out_c, kAttn);
    EXPECT_CLOSE(get(gk, ncache), kc_c, kExact);
    EXPECT_CLOSE(get(gv, ncache), vc_c, kExact);
  }
}

// ====================================================================================================
// cross-entropy
// ====================================================================================================

TEST_F(CudaOps, CrossEntropyForwardBackward) {
  const int shapes[][2] = {{50, 17}, {33, 1000}, {8, 50257}, {4, 2}};
  uint64_t seed = 1000;
  for (const auto& sh : shapes) {
    const int M = sh[0], V = sh[1];
    SCOPED_TRACE(testing::Message() << "M=" << M << " V=" << V);
    VF logits = randn(size_t(M) * V, ++seed, 3.0f);
    VI tg = randi(M, ++seed, 0, V);
    for (int m = 0; m < M; m += 3) tg[m] = nlp::kIgnoreIndex;
    VF loss_c(M);
    cpu().crossentropy_forward(loss_c.data(), logits.data(), tg.data(), M, V);
    float* gl = put(logits);
    int32_t* gt = put(tg);
    float* gloss = nan_buf(M);
    gpu().crossentropy_forward(gloss, gl, gt, M, V);
    EXPECT_CLOSE(get(gloss, M), loss_c, kOp);
    VF d0 = randn(size_t(M) * V, ++seed), d_c = d0;
    cpu().crossentropy_backward(d_c.data(), logits.data(), tg.data(), 0.37f, M, V);
    float* gd = put(d0);
    gpu().crossentropy_backward(gd, gl, gt, 0.37f, M, V);
    EXPECT_CLOSE(get(gd, d0.size()), d_c, kOp);
  }
  // a target outside the vocabulary is an error on both backends
  VF logits = randn(3 * 5, 1100);
  VI tg = {1, 7, 2};
  VF l(3);
  EXPECT_THROW(cpu().crossentropy_forward(l.data(), logits.data(), tg.data(), 3, 5), nlp::Error);
  // (the GPU reports it at the next synchronisation: no host round trip inside a step)
  float* l_g = nan_buf(3);
  float* lg_g = put(logits);
  int32_t* tg_g = put(tg);
  gpu().crossentropy_forward(l_g, lg_g, tg_g, 3, 5);
  try {
    gpu().synchronize();
    ADD_FAILURE() << "no error for target 7 outside [0, 5)";
  } catch (const nlp::Error& e) {
    EXPECT_NE(std::string(e.what()).find("target 7 at row 1"), std::string::npos) << e.what();
  }
  gpu().crossentropy_backward(lg_g, lg_g, tg_g, 1.f, 3, 5);
  EXPECT_THROW(gpu().to_host(l.data(), l_g, sizeof(float)), nlp::Error);
  gpu().synchronize();  // reported once: the backend is usable again
}

// Segments of one vector (packed qa): the cpu backend's op (itself checked against float64 and the
// row op), on segments of 1 to 300 positions in a [4 x 384] batch, some ignored; a target past its
// segment is reported at the next synchronisation.
// The LM head fused with its loss (lm_head_crossentropy; kernels/lm_head.cu): the GPU's losses, dx
// and dW against the CPU reference's, with the vocabulary padded (Vp > V: the GPU's GEMMs then run
// over a zero-padded copy of w) and not, chunks that divide the rows and that do not, ignored rows;
// the forward alone gives the same losses. fp32: kOp. bf16 operands (a second backend) against the
// CPU's bf16 emulation: 1e-3 (the same rounded operands; a dlogit whose fp32 value differs in the
// last bits between the backends may round to a neighbouring bf16).
TEST_F(CudaOps, LmHeadCrossEntropyMatchesCpu) {
  struct Shape { int M, C, V, chunk; };
  const Shape shapes[] = {{37, 24, 300, 16}, {64, 64, 50257, 24}, {5, 8, 7, 5}};
  uint64_t seed = 2000;
  auto bf = nlp::make_cuda_backend(0, {nlp::Precision::Bf16});
  for (const Shape& sh : shapes)
    for (int pad : {0, 128}) {
      const int M = sh.M, C = sh.C, V = sh.V, Vp = pad ? (V + pad - 1) / pad * pad : V;
      SCOPED_TRACE(testing::Message() << "M=" << M << " C=" << C << " V=" << V << " Vp=" << Vp);
      const VF x = randn(size_t(M) * C, ++seed), w = randn(size_t(V) * C, ++seed, 0.3f);
      const VF dx0 = randn(x.size(), ++seed, 0.1f), dw0 = randn(w.size(), ++seed, 0.1f);
      VI tg = randi(M, ++seed, 0, V);
      for (int m = 1; m < M; m += 4) tg[m] = nlp::kIgnoreIndex;
      for (int bf16 = 0; bf16 < 2; ++bf16) {
        SCOPED_TRACE(bf16 ? "bf16" : "fp32");
        Backend& c = bf16 ? cpu_bf16() : cpu();
        Backend& g = bf16 ? *bf : gpu();
        const double tol = bf16 ? 1e-3 : kOp;
        VF loss_c(M), dx_c = dx0, dw_c = dw0, scr_c(c.lm_head_scratch_floats(sh.chunk, C, V, Vp));
        c.lm_head_crossentropy(loss_c.data(), dx_c.data(), dw_c.data(), x.data(), w.data(), tg.data(),
                               0.37f, M, C, V, Vp, sh.chunk, scr_c.data());
        const size_t ns = g.lm_head_scratch_floats(sh.chunk, C, V, Vp);
        float *gx = upload(g, x), *gw = upload(g, w), *gdx = upload(g, dx0), *gdw = upload(g, dw0);
        float *gl = upload(g, VF(M, NAN)), *gs = upload(g, VF(ns, NAN));
        auto* gt = static_cast<int32_t*>(g.alloc(tg.size() * sizeof(int32_t)));
        g.to_device(gt, tg.data(), tg.size() * sizeof(int32_t));
        g.lm_head_crossentropy(gl, gdx, gdw, gx, gw, gt, 0.37f, M, C, V, Vp, sh.chunk, gs);
        EXPECT_LE(rel_err(download(g, gl, M), loss_c), tol);
        EXPECT_LE(rel_err(download(g, gdx, x.size()), dx_c), tol);
        EXPECT_LE(rel_err(download(g, gdw, w.size()), dw_c), tol);
        float* gl2 = upload(g, VF(M, NAN));
        g.lm_head_crossentropy(gl2, nullptr, nullptr, gx, gw, gt, 0.f, M, C, V, Vp, sh.chunk, gs);
        EXPECT_EQ(download(g, gl2, M), download(g, gl, M));
        for (float* p : {gx, gw, gdx, gdw, gl, gs, gl2}) g.release(p);
        g.release(gt);
        g.synchronize();
      }
    }
  // a target outside the vocabulary: reported at the next synchronisation with its row
  const VF x = randn(6 * 4, 2100), w = randn(10 * 4, 2101);
  const VI tg = {1, 2, 3, 4, 12, 5};
  float *gx = put(x), *gw = put(w), *gl = nan_buf(6), *gs = nan_buf(gpu().lm_head_scratch_floats(4, 4, 10, 128));
  int32_t* gt = put(tg);
  gpu().lm_head_crossentropy(gl, nullptr, nullptr, gx, gw, gt, 0.f, 6, 4, 10, 128, 4, gs);
  try {
    gpu().synchronize();
    ADD_FAILURE() << "no error for target 12 outside [0, 10)";
  } catch (const nlp::Error& e) {
    EXPECT_NE(std::string(e.what()).find("target 12 at row 4"), std::string::npos) << e.what();
  }
}

// Sets an environment variable for its scope; the earlier value (or its absence) comes back after.
struct ScopedEnv {
  std::string name, old;
  bool had = false;
  ScopedEnv(const char* n, const char* v) : name(n) {
    const char* o = std::getenv(n);
    had = o != nullptr;
    if (had) old = o;
    ::setenv(n, v, 1);
  }
  ~ScopedEnv() {
    if (had) ::setenv(name.c_str(), old.c_str(), 1);
    else ::unsetenv(name.c_str());
  }
};

// A bf16-precision CUDA backend with NLPTRAIN_CUDA_HEAD_DLOGITS = v (read when it is made).
std::unique_ptr<Backend> head_dlogits_backend(const char* v) {
  ScopedEnv e("NLPTRAIN_CUDA_HEAD_DLOGITS", v);
  return nlp::make_cuda_backend(0, {nlp::Precision::Bf16});
}

// The fused head's two dlogits paths in bf16 precision (NLPTRAIN_CUDA_HEAD_DLOGITS): bf16 (the loss
// kernel writes the bf16 dlogits, kern::lm_head_crossentropy_bf16, and the typed GEMM reads them) and
// fp32 (written over the logits in fp32, then cast by the GEMM) on the same inputs. Both compute the
// logits with the same GEMM and the loss with the same arithmetic: losses bitwise equal. The backward
// GEMMs read the same bf16 operands (dlogits, x, w) and may differ only in the cuBLASLt algorithm
// (fp32 summation order): dx and dW within 1e-6 relative. Both against the CPU backend's bf16
// emulation within LmHeadCrossEntropyMatchesCpu's 1e-3. V not a multiple of 8, Vp padded and not,
// chunks that divide the rows and that do not, ignored rows, dx and dW accumulated onto non-zero
// values, and dW alone (dx null). Any other value of the variable is refused, naming it.
TEST_F(CudaOps, LmHeadBf16DlogitsMatchFp32Dlogits) {
  auto b16 = head_dlogits_backend("bf16"), b32 = head_dlogits_backend("fp32");
  EXPECT_NE(b16->details().find("fused head dlogits: bf16"), std::string::npos) << b16->details();
  EXPECT_NE(b32->details().find("fused head dlogits: fp32 (NLPTRAIN_CUDA_HEAD_DLOGITS)"),
            std::string::npos) << b32->details();
  EXPECT_NE(gpu().details().find("fused head dlogits: fp32"), std::string::npos) << gpu().details();
  for (const char* bad : {"fp16", "BF16", ""}) {
    try {
      head_dlogits_backend(bad);
      ADD_FAILURE() << "no error for NLPTRAIN_CUDA_HEAD_DLOGITS='" << bad << "'";
    } catch (const nlp::Error& e) {
      EXPECT_NE(std::string(e.what()).find("NLPTRAIN_CUDA_HEAD_DLOGITS"), std::string::npos) << e.what();
    }
  }
  struct Shape { int M, C, V, chunk; };
  const Shape shapes[] = {{37, 24, 301, 16}, {96, 40, 1001, 32}, {64, 64, 50257, 24}, {5, 8, 7, 5}};
  struct Out { VF loss, dx, dw, dw_only; };
  uint64_t seed = 2400;
  for (const Shape& sh : shapes)
    for (int pad : {0, 128}) {
      const int M = sh.M, C = sh.C, V = sh.V, Vp = pad ? (V + pad - 1) / pad * pad : V;
      SCOPED_TRACE(testing::Message() << "M=" << M << " C=" << C << " V=" << V << " Vp=" << Vp
                                      << " chunk=" << sh.chunk);
      const VF x = randn(size_t(M) * C, ++seed), w = randn(size_t(V) * C, ++seed, 0.3f);
      const VF dx0 = randn(x.size(), ++seed, 0.1f), dw0 = randn(w.size(), ++seed, 0.1f);
      VI tg = randi(M, ++seed, 0, V);
      for (int m = 1; m < M; m += 4) tg[m] = nlp::kIgnoreIndex;
      tg[M - 1] = nlp::kIgnoreIndex;
      const size_t n16 = b16->lm_head_scratch_floats(sh.chunk, C, V, Vp);
      const size_t n32 = b32->lm_head_scratch_floats(sh.chunk, C, V, Vp);
      EXPECT_GE(n16, n32 + (size_t(sh.chunk) * Vp + 1) / 2);  // room for the bf16 dlogits
      auto run = [&](Backend& g) {
        const size_t ns = g.lm_head_scratch_floats(sh.chunk, C, V, Vp);
        float *gx = upload(g, x), *gw = upload(g, w), *gdx = upload(g, dx0), *gdw = upload(g, dw0);
        float *gdw2 = upload(g, dw0), *gl = upload(g, VF(M, NAN)), *gs = upload(g, VF(ns, NAN));
        auto* gt = static_cast<int32_t*>(g.alloc(tg.size() * sizeof(int32_t)));
        g.to_device(gt, tg.data(), tg.size() * sizeof(int32_t));
        g.lm_head_crossentropy(gl, gdx, gdw, gx, gw, gt, 0.37f, M, C, V, Vp, sh.chunk, gs);
        Out o{download(g, gl, M), download(g, gdx, x.size()), download(g, gdw, w.size()), {}};
        g.lm_head_crossentropy(gl, nullptr, gdw2, gx, gw, gt, 0.37f, M, C, V, Vp, sh.chunk, gs);
        o.dw_only = download(g, gdw2, w.size());
        for (float* p : {gx, gw, gdx, gdw, gdw2, gl, gs}) g.release(p);
        g.release(gt);
        g.synchronize();
        return o;
      };
      const Out r16 = run(*b16), r32 = run(*b32);
      EXPECT_TRUE(bitwise_equal(r16.loss, r32.loss)) << "losses";
      EXPECT_LE(rel_err(r16.dx, r32.dx), 1e-6) << "dx";
      EXPECT_LE(rel_err(r16.dw, r32.dw), 1e-6) << "dw";
      EXPECT_LE(rel_err(r16.dw_only, r32.dw_only), 1e-6) << "dw (dx null)";
      EXPECT_LE(rel_err(r16.dw_only, r16.dw), 1e-6) << "dw (dx null) against dw (with dx)";
      VF loss_c(M), dx_c = dx0, dw_c = dw0;
      VF scr_c(cpu_bf16().lm_head_scratch_floats(sh.chunk, C, V, Vp));
      cpu_bf16().lm_head_crossentropy(loss_c.data(), dx_c.data(), dw_c.data(), x.data(), w.data(),
                                      tg.data(), 0.37f, M, C, V, Vp, sh.chunk, scr_c.data());
      for (const Out* r : {&r16, &r32}) {
        SCOPED_TRACE(r == &r16 ? "bf16 dlogits against the CPU" : "fp32 dlogits against the CPU");
        EXPECT_LE(rel_err(r->loss, loss_c), 1e-3);
        EXPECT_LE(rel_err(r->dx, dx_c), 1e-3);
        EXPECT_LE(rel_err(r->dw, dw_c), 1e-3);
      }
    }
}

// A bf16-precision CUDA backend for the fused head: NLPTRAIN_CUDA_HEAD_WTE = wte,
// NLPTRAIN_CUDA_HEAD_SOFTMAX = softmax (read when it is made), with or without the persistent bf16
// weight copy.
std::unique_ptr<Backend> head_backend(const char* wte, const char* softmax, bool copy) {
  ScopedEnv e("NLPTRAIN_CUDA_HEAD_WTE", wte), f("NLPTRAIN_CUDA_HEAD_SOFTMAX", softmax);
  nlp::BackendOptions o;
  o.precision = nlp::Precision::Bf16;
  o.bf16_weights = copy;
  return nlp::make_cuda_backend(0, o);
}

// The fused head's bf16 wte (NLPTRAIN_CUDA_HEAD_WTE=bf16, the default: the GEMMs read one bf16 copy
// of wte, padded from the persistent copy (kept across calls: LmHeadPaddedBf16WteIsMadeOncePerWeightWrite)
// or rounded per call without it, or the persistent copy itself unpadded) and the
// one-pass softmax, against the path built first (fp32 padded wte cast by every GEMM, two-pass
// softmax) on the same inputs, in bf16 precision with bf16 dlogits: both round wte the same way
// (round to nearest even), so the GEMMs multiply the same operands: losses within 1e-6 relative,
// dx and dW within 1e-4 (a dlogit whose fp32 value moved in its last bits may round to the
// neighbouring bf16), and within 1e-3 of the CPU's bf16 emulation. The path counts say what ran: per
// chunk the new path casts x twice (the logits and the weight-gradient GEMMs) and wte never with the
// persistent copy; without it once per call when padded (the padded copy) and at every GEMM when not;
// the first path casts wte at every GEMM. Bad values of the two variables are refused, naming them.
TEST_F(CudaOps, LmHeadBf16WteAndOnlineSoftmaxMatchTheFirstPath) {
  for (const char* bad : {"fp16", ""}) {
    EXPECT_THROW(head_backend(bad, "online", false), nlp::Error);
    EXPECT_THROW(head_backend("bf16", bad, false), nlp::Error);
    try {
      head_backend("bf16", "onepass", false);
    } catch (const nlp::Error& e) {
      EXPECT_NE(std::string(e.what()).find("NLPTRAIN_CUDA_HEAD_SOFTMAX = 'onepass'"), std::string::npos) << e.what();
    }
  }
  auto first = head_backend("fp32", "twopass", false);
  EXPECT_NE(first->details().find("wte: fp32 (NLPTRAIN_CUDA_HEAD_WTE), softmax: two passes"), std::string::npos)
      << first->details();
  struct Shape { int M, C, V, chunk; };
  const Shape shapes[] = {{37, 24, 301, 16}, {64, 64, 50257, 24}};
  uint64_t seed = 2600;
  for (bool copy : {true, false}) {
    auto now = head_backend("bf16", "online", copy);
    EXPECT_NE(now->details().find("wte: bf16, softmax: online"), std::string::npos) << now->details();
    for (const Shape& sh : shapes)
      for (int pad : {0, 128}) {
        const int M = sh.M, C = sh.C, V = sh.V, Vp = pad ? (V + pad - 1) / pad * pad : V;
        SCOPED_TRACE(testing::Message() << "M=" << M << " C=" << C << " V=" << V << " Vp=" << Vp
                                        << (copy ? " persistent copy" : " no copy"));
        const int chunks = (M + sh.chunk - 1) / sh.chunk;
        const VF x = randn(size_t(M) * C, ++seed), w = randn(size_t(V) * C, ++seed, 0.3f);
        const VF dx0 = randn(x.size(), ++seed, 0.1f), dw0 = randn(w.size(), ++seed, 0.1f);
        VI tg = randi(M, ++seed, 0, V);
        for (int m = 1; m < M; m += 4) tg[m] = nlp::kIgnoreIndex;
        struct Out { VF loss, dx, dw; nlp::PathCounts paths; };
        auto run = [&](Backend& g, bool reg) {
          const size_t ns = g.lm_head_scratch_floats(sh.chunk, C, V, Vp);
          float *gx = upload(g, x), *gw = upload(g, w), *gdx = upload(g, dx0), *gdw = upload(g, dw0);
          float *gl = upload(g, VF(M, NAN)), *gs = upload(g, VF(ns, NAN));
          auto* gt = static_cast<int32_t*>(g.alloc(tg.size() * sizeof(int32_t)));
          g.to_device(gt, tg.data(), tg.size() * sizeof(int32_t));
          if (reg) g.register_weights(gw, w.size());  // wte as the arena: its bf16 copy
          nlp::PathCounts p0, p1;
          EXPECT_TRUE(g.path_counts(&p0));
          g.lm_head_crossentropy(gl, gdx, gdw, gx, gw, gt, 0.37f, M, C, V, Vp, sh.chunk, gs);
          g.path_counts(&p1);
          Out o{download(g, gl, M), download(g, gdx, x.size()), download(g, gdw, w.size()), p1 - p0};
          if (reg) g.register_weights(gw, 0);
          for (float* p : {gx, gw, gdx, gdw, gl, gs}) g.release(p);
          g.release(gt);
          g.synchronize();
          return o;
        };
        const Out a = run(*first, false), b = run(*now, copy);
        EXPECT_LE(rel_err(b.loss, a.loss), 1e-6) << "losses";
        EXPECT_LE(rel_err(b.dx, a.dx), 1e-4) << "dx";
        EXPECT_LE(rel_err(b.dw, a.dw), 1e-4) << "dw";
        EXPECT_EQ(a.paths.fp32_to_bf16, 4 * chunks) << "first path: x and wte at both GEMMs";
        const int64_t want = copy ? 2 * chunks : pad ? 2 * chunks + 1 : 4 * chunks;
        EXPECT_EQ(b.paths.fp32_to_bf16, want) << "casts of the bf16-wte path";
        EXPECT_EQ(b.paths.bf16_to_fp32, 0);
        EXPECT_EQ(b.paths.staged_ops, 0);
        VF loss_c(M), dx_c = dx0, dw_c = dw0;
        VF scr_c(cpu_bf16().lm_head_scratch_floats(sh.chunk, C, V, Vp));
        cpu_bf16().lm_head_crossentropy(loss_c.data(), dx_c.data(), dw_c.data(), x.data(), w.data(),
                                        tg.data(), 0.37f, M, C, V, Vp, sh.chunk, scr_c.data());
        EXPECT_LE(rel_err(b.loss, loss_c), 1e-3);
        EXPECT_LE(rel_err(b.dx, dx_c), 1e-3);
        EXPECT_LE(rel_err(b.dw, dw_c), 1e-3);
      }
  }
}


#if NLPTRAIN_HAVE_CUDA
// The padded bf16 copies of wte the fused head has made so far, from details() ("padded bf16 wte
// copies made: N"), or -1 when details() does not say.
long head_wte_copies(const Backend& be) {
  const std::string d = be.details(), key = "padded bf16 wte copies made: ";
  const size_t at = d.find(key);
  return at == std::string::npos ? -1 : std::atol(d.c_str() + at + key.size());
}

// The padded bf16 wte kept across calls (NLPTRAIN_CUDA_HEAD_WTE=bf16 with the persistent bf16 copy):
// made once, then reused while wte is unwritten, and made again after each kind of write to it: to_device
// into the arena, a write from outside the backend followed by weights_written (the ZeRO all-gather),
// adamw_update and adamw_update_spans; a write to the arena outside wte keeps it. Each call's losses, dx
// and dW against a backend without the persistent copy (the padded copy rounded from wte at every call,
// the path before this one) on the same wte: both GEMMs read the same bf16 operands, so equal (losses
// bitwise; dx and dW within 1e-6 relative, cuBLASLt's algorithm aside). A stale copy would fail this:
// each write changes wte by far more than 1e-6. Without the persistent copy the head makes one copy a
// call. A micro-batch recorded into a CUDA graph remakes the copy at every replay: a replay after wte
// was written equals an eager call on the new wte.
TEST_F(CudaOps, LmHeadPaddedBf16WteIsMadeOncePerWeightWrite) {
  auto kept = head_backend("bf16", "online", true), per_call = head_backend("bf16", "online", false);
  const int M = 37, C = 24, V = 301, Vp = 384, chunk = 16, E = 1000;  // E: weights before wte
  const size_t vc = size_t(V) * C;
  uint64_t seed = 2700;
  const VF x = randn(size_t(M) * C, ++seed), dx0 = randn(x.size(), ++seed, 0.1f);
  const VF dw0 = randn(vc, ++seed, 0.1f);
  VI tg = randi(M, ++seed, 0, V);
  for (int m = 1; m < M; m += 4) tg[m] = nlp::kIgnoreIndex;
  // One backend's buffers: the arena [E + V*C] (wte at E), x, targets, outputs, scratch, AdamW state.
  struct Bufs {
    Backend& g;
    float *arena, *x, *dx, *dw, *loss, *scr, *grad, *m, *v;
    int32_t* tg;
  };
  auto make = [&](Backend& g, bool reg) {
    Bufs b{g, upload(g, randn(E + vc, 2799, 0.3f)), upload(g, x), upload(g, dx0), upload(g, dw0),
           upload(g, VF(M, NAN)), upload(g, VF(g.lm_head_scratch_floats(chunk, C, V, Vp), NAN)),
           upload(g, randn(E + vc, 2798, 0.01f)), upload(g, VF(E + vc, 0.f)),
           upload(g, VF(E + vc, 0.f)), static_cast<int32_t*>(g.alloc(tg.size() * sizeof(int32_t)))};
    g.to_device(b.tg, tg.data(), tg.size() * sizeof(int32_t));
    if (reg) g.register_weights(b.arena, E + vc);
    return b;
  };
  Bufs k = make(*kept, true), p = make(*per_call, false);
  struct Out { VF loss, dx, dw; };
  auto call = [&](Bufs& b) {  // one head call, dx and dW accumulated onto dx0 and dw0
    b.g.to_device(b.dx, dx0.data(), dx0.size() * sizeof(float));
    b.g.to_device(b.dw, dw0.data(), dw0.size() * sizeof(float));
    b.g.lm_head_crossentropy(b.loss, b.dx, b.dw, b.x, b.arena + E, b.tg, 0.37f, M, C, V, Vp, chunk,
                             b.scr);
  };
  auto results = [&](Bufs& b) {
    return Out{download(b.g, b.loss, M), download(b.g, b.dx, x.size()), download(b.g, b.dw, vc)};
  };
  // the per-call path on kept's present wte
  auto reference = [&]() {
    const VF w = download(*kept, k.arena + E, vc);
    per_call->to_device(p.arena + E, w.data(), vc * sizeof(float));
    call(p);
    return results(p);
  };
  auto expect_equal = [&](const Out& a, const Out& r, const char* what) {
    EXPECT_TRUE(bitwise_equal(a.loss, r.loss)) << what << ": losses";
    EXPECT_LE(rel_err(a.dx, r.dx), 1e-6) << what << ": dx";
    EXPECT_LE(rel_err(a.dw, r.dw), 1e-6) << what << ": dW";
  };
  const long k0 = head_wte_copies(*kept), p0 = head_wte_copies(*per_call);
  ASSERT_GE(k0, 0) << kept->details();
  ASSERT_GE(p0, 0) << per_call->details();

  call(k);
  const Out first = results(k);
  EXPECT_EQ(head_wte_copies(*kept), k0 + 1) << "the first call makes the copy";
  expect_equal(first, reference(), "first call");
  EXPECT_EQ(head_wte_copies(*per_call), p0 + 1);
  call(k);
  EXPECT_EQ(head_wte_copies(*kept), k0 + 1) << "wte unwritten: the copy is reused";
  const Out second = results(k);
  EXPECT_TRUE(bitwise_equal(second.loss, first.loss) && bitwise_equal(second.dx, first.dx) &&
              bitwise_equal(second.dw, first.dw))
      << "the second call on the same weights";
  EXPECT_EQ(head_wte_copies(*per_call), p0 + 1);

  // a write to the arena outside wte (another tensor) keeps the copy
  const VF other = randn(E, ++seed, 0.3f);
  kept->to_device(k.arena, other.data(), E * sizeof(float));
  call(k);
  EXPECT_EQ(head_wte_copies(*kept), k0 + 1) << "a write outside wte";
  expect_equal(results(k), first, "after a write outside wte");

  long made = k0 + 1;
  // to_device into wte (a checkpoint load, an initialisation)
  {
    const VF w = randn(vc, ++seed, 0.3f);
    kept->to_device(k.arena + E, w.data(), vc * sizeof(float));
    call(k);
    EXPECT_EQ(head_wte_copies(*kept), ++made) << "after to_device into wte";
    const Out a = results(k);
    expect_equal(a, reference(), "after to_device into wte");
    EXPECT_GT(rel_err(a.loss, first.loss), 1e-3) << "the new wte changes the losses";
  }
  // a write from outside the backend (as the ZeRO all-gather's) followed by weights_written over it;
  // only the last rows of wte change
  {
    const size_t rows = 7, at = E + vc - rows * C;
    const VF w = randn(rows * C, ++seed, 3.0f);
    kept->synchronize();
    ASSERT_EQ(cudaMemcpy(k.arena + at, w.data(), w.size() * sizeof(float), cudaMemcpyHostToDevice),
              cudaSuccess);
    kept->weights_written(k.arena + at, w.size());
    call(k);
    EXPECT_EQ(head_wte_copies(*kept), ++made) << "after weights_written";
    expect_equal(results(k), reference(), "after weights_written");
  }
  // an optimizer step over the whole arena, then one over spans
  kept->adamw_update(k.arena, k.grad, k.m, k.v, E + vc, 1e-2f, 0.9f, 0.999f, 1e-8f, 0.1f, 1.0f, 1);
  call(k);
  EXPECT_EQ(head_wte_copies(*kept), ++made) << "after adamw_update";
  expect_equal(results(k), reference(), "after adamw_update");
  call(k);
  EXPECT_EQ(head_wte_copies(*kept), made) << "the next micro-batch of the step";
  const std::vector<Backend::AdamWSpan> spans = {{0, size_t(E), 0.1f}, {size_t(E), vc, 0.f}};
  kept->adamw_update_spans(k.arena, k.grad, k.m, k.v, spans, 1e-2f, 0.9f, 0.999f, 1e-8f, 1.0f, 2,
                           false);
  call(k);
  EXPECT_EQ(head_wte_copies(*kept), ++made) << "after adamw_update_spans";
  expect_equal(results(k), reference(), "after adamw_update_spans");

  // recorded: the copy is made inside the recording, so a replay after a write reads the new wte
  std::string why;
  ASSERT_TRUE(kept->can_capture(&why)) << why;
  kept->capture_begin(0);
  kept->lm_head_crossentropy(k.loss, k.dx, k.dw, k.x, k.arena + E, k.tg, 0.37f, M, C, V, Vp, chunk,
                             k.scr);
  std::shared_ptr<Backend::Recording> rec = kept->capture_end(&why);
  ASSERT_TRUE(rec) << "capture_end: " << why;
  EXPECT_EQ(head_wte_copies(*kept), ++made) << "the recording makes its copy";
  for (int r = 0; r < 2; ++r) {
    SCOPED_TRACE(testing::Message() << "replay " << r);
    const VF w = randn(vc, ++seed, 0.3f);
    kept->to_device(k.arena + E, w.data(), vc * sizeof(float));
    kept->to_device(k.dx, dx0.data(), dx0.size() * sizeof(float));
    kept->to_device(k.dw, dw0.data(), dw0.size() * sizeof(float));
    kept->replay(*rec, nullptr, 0);
    expect_equal(results(k), reference(), "a replay after wte was written");
  }
  call(k);  // eager after the recording: made again (the recording left it forgotten)
  EXPECT_EQ(head_wte_copies(*kept), ++made) << "eager after a recording";
  expect_equal(results(k), reference(), "eager after the replays");

  rec.reset();
  kept->register_weights(k.arena, 0);
  for (Bufs* b : {&k, &p}) {
    for (float* q : {b->arena, b->x, b->dx, b->dw, b->loss, b->scr, b->grad, b->m, b->v})
      b->g.release(q);
    b->g.release(b->tg);
    b->g.synchronize();
  }
}
#endif

#if NLPTRAIN_HAVE_CUDA
// The two loss kernels of kernels/lm_head.cu on the same logits [M, ld]: lm_head_crossentropy_bf16's
// losses and bad-row flag bitwise equal lm_head_crossentropy's (grad), each bf16 dlogit is exactly
// the host's round_bf16 of that kernel's fp32 dlogit (padding columns and ignored or bad rows 0), and
// the logits it reads are left unchanged; with and without the dloss slot.
TEST_F(CudaOps, LmHeadBf16KernelRoundsTheFp32Dlogits) {
  cudaStream_t st = static_cast<cudaStream_t>(nlp::cuda_backend_stream(gpu()));
  struct Shape { int M, V, ld; };
  const Shape shapes[] = {{37, 301, 301}, {37, 301, 384}, {6, 50257, 50304}, {5, 7, 7}, {3, 1000, 1000}};
  uint64_t seed = 2500;
  for (const Shape& sh : shapes)
    for (bool slot : {false, true}) {
      const int M = sh.M, V = sh.V, ld = sh.ld;
      SCOPED_TRACE(testing::Message() << "M=" << M << " V=" << V << " ld=" << ld << " slot=" << slot);
      const size_t n = size_t(M) * ld;
      const VF logits = randn(n, ++seed, 3.0f);
      VI tg = randi(M, ++seed, 0, V);
      tg[0] = V - 1;
      if (M > 2) tg[1] = nlp::kIgnoreIndex;
      if (M > 3) tg[3] = V;  // bad: NaN loss, zeros, flagged
      float *a = put(logits), *b = put(logits), *la = nan_buf(M), *lb = nan_buf(M);
      const uint32_t nan2 = 0x7fc07fc0u;  // two bf16 NaNs: what the kernel does not write stays NaN
      float poison;
      std::memcpy(&poison, &nan2, sizeof poison);
      float* dl = put(VF((n + 1) / 2, poison));
      float* ds = put(VF{0.61f});
      int32_t* gt = put(tg);
      int32_t *bad_a = put(VI{INT32_MAX}), *bad_b = put(VI{INT32_MAX});
      const float* dslot = slot ? ds : nullptr;
      gpu().synchronize();
      ASSERT_EQ(nlp::kern::lm_head_crossentropy(la, a, ld, gt, 0.37f, dslot, M, V, 100, bad_a, true, st),
                cudaSuccess);
      ASSERT_EQ(nlp::kern::lm_head_crossentropy_bf16(lb, b, dl, ld, gt, 0.37f, dslot, M, V, 100, bad_b,
                                                     st),
                cudaSuccess);
      ASSERT_EQ(cudaStreamSynchronize(st), cudaSuccess);
      const VF la_h = get(la, M), lb_h = get(lb, M), ga = get(a, n);
      EXPECT_TRUE(bitwise_equal(lb_h, la_h)) << "losses";
      EXPECT_TRUE(bitwise_equal(get(b, n), logits)) << "the logits are only read";
      VI bad_h(2);
      gpu().to_host(&bad_h[0], bad_a, sizeof(int32_t));
      gpu().to_host(&bad_h[1], bad_b, sizeof(int32_t));
      EXPECT_EQ(bad_h[1], bad_h[0]);
      EXPECT_EQ(bad_h[0], M > 3 ? 103 : INT32_MAX);
      std::vector<uint16_t> dl_h(n);
      gpu().to_host(dl_h.data(), dl, n * sizeof(uint16_t));
      size_t wrong = 0, first = n;
      for (size_t i = 0; i < n; ++i)
        if (dl_h[i] != nlp::cpu::to_bf16_bits(ga[i]) && wrong++ == 0) first = i;
      EXPECT_EQ(wrong, 0u) << "first at row " << first / ld << " column " << first % ld;
      for (int m = 0; m < M; ++m)  // padding, ignored and bad rows: +0
        for (int v = (tg[m] == nlp::kIgnoreIndex || tg[m] >= V) ? 0 : V; v < ld; ++v)
          if (dl_h[size_t(m) * ld + v] != 0) {
            ADD_FAILURE() << "dlogit (" << m << ", " << v << ") not zero";
            m = M;
            break;
          }
    }
}
#endif

#if NLPTRAIN_HAVE_CUDA
// The one-pass softmax statistics of the fused head's loss kernels (kern::lm_head_crossentropy and
// _bf16 with online = true, NLPTRAIN_CUDA_HEAD_SOFTMAX=online, the default) on the same logits [M, ld]
// as the two-pass kernels and a double reference on the host:
//  - against the reference (log-sum-exp and (softmax - onehot) * dloss in double): losses within
//    1e-5 relative, dlogits within 1e-5 |ref| + 1e-9 (expf's argument rounding at |x - max| <= 87,
//    where exp underflows), plus 1e-6 dloss at the target (p dloss - dloss cancels as p nears 1);
//  - against the two-pass kernel: losses within 1e-6 relative and dlogits within 1e-6 |ref| (+ the
//    same at the target; the two sums differ only in rounding); padding columns, ignored and bad rows
//    exactly 0, the bad-row flag equal;
//  - the bf16 online kernel: losses bitwise those of the fp32 online kernel and each bf16 dlogit the
//    host's rounding of its fp32 dlogit.
// Rows of scale 3 and 30, one row in ascending order (the running max grows at every element) and one
// descending; a -inf logit (adds nothing) and a row with a NaN logit (a NaN loss from both kernels).
TEST_F(CudaOps, LmHeadOnlineSoftmaxMatchesTwoPassAndReference) {
  cudaStream_t st = static_cast<cudaStream_t>(nlp::cuda_backend_stream(gpu()));
  struct Shape { int M, V, ld; float scale; };
  const Shape shapes[] = {{37, 301, 301, 3.0f}, {37, 301, 384, 30.0f}, {6, 50257, 50304, 3.0f},
                          {5, 7, 7, 3.0f}, {9, 1000, 1024, 30.0f}};
  uint64_t seed = 2700;
  const float dloss = 0.37f;
  for (const Shape& sh : shapes) {
    const int M = sh.M, V = sh.V, ld = sh.ld;
    SCOPED_TRACE(testing::Message() << "M=" << M << " V=" << V << " ld=" << ld << " scale=" << sh.scale);
    const size_t n = size_t(M) * ld;
    VF logits = randn(n, ++seed, sh.scale);
    for (int v = 0; v < V; ++v) {  // row 2 ascending, row 4 descending
      logits[2 * size_t(ld) + v] = sh.scale * (-1.0f + 2.0f * float(v) / float(V));
      if (M > 4) logits[4 * size_t(ld) + v] = sh.scale * (1.0f - 2.0f * float(v) / float(V));
    }
    VI tg = randi(M, ++seed, 0, V);
    tg[0] = V - 1;
    tg[2] = 0;
    if (M > 3) tg[1] = nlp::kIgnoreIndex, tg[3] = V;  // ignored; bad: NaN loss, zeros, flagged
    const int nan_row = M - 1;  // a live row (M >= 5) with one NaN logit
    logits[1] = -INFINITY;      // row 0, not its target
    logits[size_t(nan_row) * ld + V / 2] = NAN;
    float *a = put(logits), *b = put(logits), *c = put(logits);
    float *la = nan_buf(M), *lb = nan_buf(M), *lc = nan_buf(M);
    const uint32_t nan2 = 0x7fc07fc0u;  // two bf16 NaNs: what the kernel does not write stays NaN
    float poison;
    std::memcpy(&poison, &nan2, sizeof poison);
    float* dl = put(VF((n + 1) / 2, poison));
    int32_t* gt = put(tg);
    int32_t *bad_a = put(VI{INT32_MAX}), *bad_b = put(VI{INT32_MAX}), *bad_c = put(VI{INT32_MAX});
    gpu().synchronize();
    // a: two-pass fp32 (the first kernel), b: online fp32, c: online bf16 (logits only read)
    ASSERT_EQ(nlp::kern::lm_head_crossentropy(la, a, ld, gt, dloss, nullptr, M, V, 100, bad_a, true, st,
                                              false),
              cudaSuccess);
    ASSERT_EQ(nlp::kern::lm_head_crossentropy(lb, b, ld, gt, dloss, nullptr, M, V, 100, bad_b, true, st,
                                              true),
              cudaSuccess);
    ASSERT_EQ(nlp::kern::lm_head_crossentropy_bf16(lc, c, dl, ld, gt, dloss, nullptr, M, V, 100, bad_c,
                                                   st, true),
              cudaSuccess);
    ASSERT_EQ(cudaStreamSynchronize(st), cudaSuccess);
    const VF la_h = get(la, M), lb_h = get(lb, M), lc_h = get(lc, M), ga = get(a, n), gb = get(b, n);
    EXPECT_TRUE(bitwise_equal(get(c, n), logits)) << "the bf16 kernel only reads the logits";
    EXPECT_TRUE(std::isnan(la_h[nan_row]) && std::isnan(lb_h[nan_row]) && std::isnan(lc_h[nan_row]))
        << "a NaN logit: " << la_h[nan_row] << " " << lb_h[nan_row] << " " << lc_h[nan_row];
    VF la_f = la_h, lb_f = lb_h, lc_f = lc_h;  // without the NaN row
    la_f[nan_row] = lb_f[nan_row] = lc_f[nan_row] = 0.0f;
    EXPECT_TRUE(bitwise_equal(lc_f, lb_f)) << "bf16 online losses against fp32 online";
    VI bad_h(3);
    gpu().to_host(&bad_h[0], bad_a, sizeof(int32_t));
    gpu().to_host(&bad_h[1], bad_b, sizeof(int32_t));
    gpu().to_host(&bad_h[2], bad_c, sizeof(int32_t));
    EXPECT_EQ(bad_h[0], M > 3 ? 103 : INT32_MAX);
    EXPECT_EQ(bad_h[1], bad_h[0]);
    EXPECT_EQ(bad_h[2], bad_h[0]);
    std::vector<uint16_t> dl_h(n);
    gpu().to_host(dl_h.data(), dl, n * sizeof(uint16_t));
    size_t wrong16 = 0, first16 = n;
    for (size_t i = 0; i < n; ++i)
      if (int(i / ld) != nan_row && dl_h[i] != nlp::cpu::to_bf16_bits(gb[i]) && wrong16++ == 0) first16 = i;
    EXPECT_EQ(wrong16, 0u) << "bf16 dlogit not the rounding of the fp32 online one, first at row "
                           << first16 / ld << " column " << first16 % ld;
    size_t far_ref = 0, far_two = 0, nonzero = 0;
    for (int m = 0; m < M; ++m) {
      if (m == nan_row) continue;
      const float* x = logits.data() + size_t(m) * ld;
      const bool dead = tg[m] == nlp::kIgnoreIndex || tg[m] >= V;
      if (dead) {
        if (tg[m] >= V) {
          EXPECT_TRUE(std::isnan(lb_h[m])) << "bad row " << m;
        } else {
          EXPECT_EQ(lb_h[m], 0.0f) << "ignored row " << m;
        }
      } else {
        double mx = -INFINITY, se = 0;
        for (int v = 0; v < V; ++v) mx = std::max(mx, double(x[v]));
        for (int v = 0; v < V; ++v) se += std::exp(double(x[v]) - mx);
        const double loss = std::log(se) + mx - double(x[tg[m]]);
        EXPECT_LE(std::abs(lb_h[m] - loss), 1e-5 * std::max(1.0, std::abs(loss))) << "row " << m;
        EXPECT_LE(std::abs(lb_h[m] - la_h[m]), 1e-6 * std::max(1.0, std::abs(double(la_h[m])))) << "row " << m;
        for (int v = 0; v < V; ++v) {
          const double ref = std::exp(double(x[v]) - mx) / se * dloss - (v == tg[m] ? dloss : 0.0);
          const size_t i = size_t(m) * ld + v;
          // at the target p * dloss - dloss cancels where p is near 1 (a dominant target at scale
          // 30): the float product's rounding, ~1e-7 dloss, then stands alone
          const double at_t = v == tg[m] ? 1e-6 * dloss : 0.0;
          if (!(std::abs(gb[i] - ref) <= 1e-5 * std::abs(ref) + 1e-9 + at_t)) ++far_ref;
          if (!(std::abs(gb[i] - ga[i]) <= 1e-6 * std::abs(double(ga[i])) + 1e-12 + at_t)) ++far_two;
        }
      }
      for (int v = dead ? 0 : V; v < ld; ++v)
        if (gb[size_t(m) * ld + v] != 0.0f || dl_h[size_t(m) * ld + v] != 0) ++nonzero;
    }
    EXPECT_EQ(far_ref, 0u) << "dlogits outside the double reference's tolerance";
    EXPECT_EQ(far_two, 0u) << "dlogits outside the two-pass kernel's tolerance";
    EXPECT_EQ(nonzero, 0u) << "padding columns or ignored/bad rows not zero";
    // the forward alone (grad false) gives the same losses and leaves the logits as they were
    float* d = put(logits);
    float* ld2 = nan_buf(M);
    int32_t* bad_d = put(VI{INT32_MAX});
    gpu().synchronize();
    ASSERT_EQ(nlp::kern::lm_head_crossentropy(ld2, d, ld, gt, dloss, nullptr, M, V, 100, bad_d, false,
                                              st, true),
              cudaSuccess);
    ASSERT_EQ(cudaStreamSynchronize(st), cudaSuccess);
    VF l2 = get(ld2, M);
    EXPECT_TRUE(std::isnan(l2[nan_row]));
    l2[nan_row] = 0.0f;
    EXPECT_TRUE(bitwise_equal(l2, lb_f)) << "forward-only losses";
    EXPECT_TRUE(bitwise_equal(get(d, n), logits)) << "forward only: logits unchanged";
  }
}
#endif

TEST_F(CudaOps, SegmentCrossEntropyForwardBackward) {
  const int N = 4 * 384;
  VI first, len, tg;
  VI lens = {1, 37, 300, 2, 128, 45, 250, 9, 384, 64, 17, 100};
  int at = 0;
  for (size_t e = 0; e < lens.size() && at + lens[e] <= N; ++e) {
    first.push_back(at);
    len.push_back(lens[e]);
    tg.push_back(e % 4 == 3 ? nlp::kIgnoreIndex : int32_t((7 * e) % lens[e]));
    at += lens[e] + int(e % 3);  // gaps between some segments
  }
  const int E = static_cast<int>(first.size());
  VF x = randn(N, 1200, 3.0f);
  VF loss_c(E);
  cpu().segment_crossentropy_forward(loss_c.data(), x.data(), first.data(), len.data(), tg.data(), E);
  float* gx = put(x);
  int32_t *gf = put(first), *gn = put(len), *gt = put(tg);
  float* gloss = nan_buf(E);
  gpu().segment_crossentropy_forward(gloss, gx, gf, gn, gt, E);
  EXPECT_CLOSE(get(gloss, E), loss_c, kOp);
  VF d0 = randn(N, 1201), d_c = d0;
  cpu().segment_crossentropy_backward(d_c.data(), x.data(), first.data(), len.data(), tg.data(), 0.5f, E);
  float* gd = put(d0);
  gpu().segment_crossentropy_backward(gd, gx, gf, gn, gt, 0.5f, E);
  EXPECT_CLOSE(get(gd, N), d_c, kOp);
  VI bad = tg;
  bad[1] = len[1];  // one past its segment
  int32_t* gb = put(bad);
  gpu().segment_crossentropy_forward(gloss, gx, gf, gn, gb, E);
  try {
    gpu().synchronize();
    ADD_FAILURE() << "no error for a target outside its segment";
  } catch (const nlp::Error& e) {
    EXPECT_NE(std::string(e.what()).find("of segment 1"), std::string::npos) << e.what();
  }
  gpu().synchronize();
  // NLPTRAIN_CUDA_SEGMENT_CE=rows: the row op per segment (the path earlier GPU runs verified)
  ::setenv("NLPTRAIN_CUDA_SEGMENT_CE", "rows", 1);
  auto rows = nlp::make_cuda_backend(0);
  ::unsetenv("NLPTRAIN_CUDA_SEGMENT_CE");
  float* rloss = nan_buf(E);
  rows->segment_crossentropy_forward(rloss, gx, gf, gn, gt, E);
  rows->synchronize();  // its own stream: done before this fixture's backend reads the result
  EXPECT_CLOSE(get(rloss, E), loss_c, kOp);
  float* rd = put(d0);
  rows->segment_crossentropy_backward(rd, gx, gf, gn, gt, 0.5f, E);
  rows->synchronize();
  EXPECT_CLOSE(get(rd, N), d_c, kOp);
}

// ====================================================================================================
// reductions and AdamW
// ====================================================================================================

TEST_F(CudaOps, SumAndSumsqInDouble) {
  for (size_t n : {size_t(1), size_t(1000), size_t(1000003), size_t(5) << 20}) {
    SCOPED_TRACE(testing::Message() << "n=" << n);
    VF x = randn(n, 1200 + n);
    float* gx = put(x);
    EXPECT_LE(rel_err(gpu().sum(gx, n), cpu().sum(x.data(), n)), kRed);
    EXPECT_LE(rel_err(gpu().sumsq(gx, n), cpu().sumsq(x.data(), n)), kRed);
    EXPECT_EQ(gpu().sum(gx, n), gpu().sum(gx, n));  // deterministic
  }
  EXPECT_EQ(gpu().sum(nullptr, 0), 0.0);
}

// sum_into (the trainer's loss, added up on the device): acc + scale * sum(x) with the product and the
// sum each rounded as on the host, from the same device sum; twice in a row; N = 0 adds nothing.
// With scale 1/3 the product is inexact, and a fused multiply-add (what nvcc makes of
// `acc + scale * s` unless told not to) would differ from the host in the last bit for many sums.
TEST_F(CudaOps, SumIntoAddsWhatTheHostWould) {
  auto* acc = static_cast<double*>(gpu().alloc(sizeof(double)));
  for (size_t n : {size_t(1), size_t(1000), size_t(1000003)}) {
    for (double scale : {1.0, 0.5, 1.0 / 3.0}) {
      SCOPED_TRACE(testing::Message() << "n=" << n << " scale=" << scale);
      const double start = 3.0 + 1.0 / 7.0;
      gpu().to_device(acc, &start, sizeof start);
      VF x = randn(n, 1300 + n);
      float* gx = put(x);
      const double s = gpu().sum(gx, n);
      double want = start;
      want += scale * s;
      gpu().sum_into(acc, gx, n, scale);
      double got = 0;
      gpu().to_host(&got, acc, sizeof got);
      EXPECT_EQ(got, want);
      want += scale * s;
      gpu().sum_into(acc, gx, n, scale);
      gpu().sum_into(acc, gx, 0, scale);
      gpu().to_host(&got, acc, sizeof got);
      EXPECT_EQ(got, want);
    }
  }
  gpu().release(acc);
}

// One launch over many tensors (with alignment gaps between them, which stay untouched) gives
// bitwise what one adamw_update per tensor gives, on the GPU; and matches the CPU's spans to kOp.
TEST_F(CudaOps, AdamWSpansEqualPerTensorUpdates) {
  using Span = nlp::Backend::AdamWSpan;
  const std::vector<Span> spans = {{0, 1000, 0.1f},  {1000, 7, 0.f},   {1024, 50000, 0.1f},
                                   {51024, 1, 0.f},  {51040, 3000, 0.1f}, {54040, 129, 0.f}};
  const size_t n = 54200;  // the tail past the last span is not touched either
  VF p0 = randn(n, 1400), m0 = randn(n, 1401, 0.01f), v0(n);
  for (size_t i = 0; i < n; ++i) v0[i] = std::fabs(randn(1, 1402 + i % 7, 1e-4f)[0]) + 1e-6f;
  float *pa = put(p0), *ma = put(m0), *va = put(v0);  // per tensor
  float *pb = put(p0), *mb = put(m0), *vb = put(v0);  // spans
  VF pc = p0, mc = m0, vc = v0;                       // CPU spans
  for (int t = 1; t <= 3; ++t) {
    VF g = randn(n, 1410 + t, 0.1f);
    float* gg = put(g);
    const float lr = 1e-3f * t;
    for (const Span& sp : spans)
      gpu().adamw_update(pa + sp.offset, gg + sp.offset, ma + sp.offset, va + sp.offset, sp.numel,
                         lr, 0.9f, 0.999f, 1e-8f, sp.weight_decay, 0.7f, t);
    // the spans' gradients are zeroed by the update on both backends (zero_grad), the tail is not
    gpu().adamw_update_spans(pb, gg, mb, vb, spans, lr, 0.9f, 0.999f, 1e-8f, 0.7f, t, /*zero_grad=*/true);
    VF gc = g;
    cpu().adamw_update_spans(pc.data(), gc.data(), mc.data(), vc.data(), spans, lr, 0.9f, 0.999f,
                             1e-8f, 0.7f, t, /*zero_grad=*/true);
    const VF gz = get(gg, n);
    for (const Span& sp : spans)
      for (size_t i = sp.offset; i < sp.offset + sp.numel; ++i) {
        ASSERT_EQ(gz[i], 0.0f) << "cuda gradient " << i << " not zeroed at step " << t;
        ASSERT_EQ(gc[i], 0.0f) << "cpu gradient " << i << " not zeroed at step " << t;
      }
    for (size_t i = 54169; i < n; ++i) ASSERT_EQ(gz[i], g[i]) << "cuda gradient " << i << " past the spans";
  }
  EXPECT_CLOSE(get(pb, n), get(pa, n), kExact);
  EXPECT_CLOSE(get(mb, n), get(ma, n), kExact);
  EXPECT_CLOSE(get(vb, n), get(va, n), kExact);
  EXPECT_CLOSE(get(pb, n), pc, kOp);
  const VF pbh = get(pb, n);
  for (size_t i : {size_t(1007), size_t(1023), size_t(51030), size_t(54190)})
    EXPECT_EQ(pbh[i], p0[i]) << "element " << i << " outside every span changed";
}

// train.zero = 1 on the GPU: AdamW on each rank's shard (spans clipped to it and rebased, pointers
// offset into the arenas) makes bitwise the update of one AdamW over the whole arena.
TEST_F(CudaOps, AdamWShardsEqualTheWholeArena) {
  auto make = [&](nlp::ParamStore& ps) {
    ps.add("a.weight", {70, 50}, true);
    ps.add("a.bias", {50}, false);
    ps.add("b.weight", {333, 3}, true);
    ps.add("ln.weight", {17}, false);
    ps.allocate(gpu());
    std::vector<float> h = randn(ps.total(), 1500);
    ps.upload(h);
  };
  nlp::TrainConfig tc;
  tc.weight_decay = 0.1f;
  nlp::ParamStore whole, sharded;
  make(whole);
  make(sharded);
  const nlp::ShardLayout sh = nlp::ShardLayout::even(whole.total(), 3);
  nlp::AdamW full(whole, gpu(), tc, 0, whole.total());
  std::vector<std::unique_ptr<nlp::AdamW>> parts;
  for (int r = 0; r < 3; ++r) parts.push_back(std::make_unique<nlp::AdamW>(sharded, gpu(), tc, sh.lo(r), sh.hi(r)));
  for (int t = 1; t <= 3; ++t) {
    const VF g = randn(whole.total(), 1510 + t, 0.1f);
    gpu().to_device(whole.grad(), g.data(), g.size() * sizeof(float));
    gpu().to_device(sharded.grad(), g.data(), g.size() * sizeof(float));
    full.step(1e-3f, 0.7f, t, false);
    for (auto& p : parts) p->step(1e-3f, 0.7f, t, false);
  }
  std::vector<float> a, b;
  whole.download(a);
  sharded.download(b);
  EXPECT_CLOSE(b, a, kExact);
}

TEST_F(CudaOps, AdamWMatchesCpuOverThreeSteps) {
  const size_t n = 100001;
  VF p = randn(n, 1300), m(n, 0.f), v(n, 0.f);
  float *gp = put(p), *gm = put(m), *gv = put(v);
  for (int t = 1; t <= 3; ++t) {
    VF g = randn(n, 1300 + t, 0.1f);
    cpu().adamw_update(p.data(), g.data(), m.data(), v.data(), n, 1e-3f, 0.9f, 0.999f, 1e-8f, 0.01f,
                       0.5f, t);
    gpu().adamw_update(gp, put(g), gm, gv, n, 1e-3f, 0.9f, 0.999f, 1e-8f, 0.01f, 0.5f, t);
  }
  EXPECT_CLOSE(get(gp, n), p, kOp);
  EXPECT_CLOSE(get(gm, n), m, kOp);
  EXPECT_CLOSE(get(gv, n), v, kOp);
}

// run.bf16_weights: the AdamW kernel writes each updated weight's bf16 rounding beside it (spans and
// per-tensor kernels, a ZeRO-style shard), the refresh after an upload rounds the same way, and both
// equal the host's round-to-nearest-even of the GPU's fp32 weights bitwise; the fp32 weights match
// the CPU's AdamW to kOp. The GEMMs that read the copy give the bits of the per-call casts.
TEST_F(CudaOps, Bf16WeightCopyWrittenByAdamWAndRefreshes) {
  nlp::BackendOptions o;
  o.precision = nlp::Precision::Bf16;
  o.bf16_weights = true;
  auto be = nlp::make_cuda_backend(0, o);
  auto cpu_be =
      nlp::make_cpu_backend(1, nlp::Precision::Bf16, nlp::CpuGemm::Auto, nlp::CpuBf16::Emulate, true);
  auto add = [](nlp::ParamStore& ps) {
    ps.add("a.weight", {70, 50}, true);
    ps.add("a.bias", {50}, false);
    ps.add("b.weight", {333, 3}, true);
    ps.add("ln.weight", {17}, false);
  };
  nlp::ParamStore g, c;
  add(g);
  add(c);
  g.allocate(*be);
  c.allocate(*cpu_be);
  const VF w0 = randn(g.total(), 1600);
  g.upload(w0);
  c.upload(w0);
  auto check = [&](const char* when) {
    std::vector<float> w;
    g.download(w);
    std::vector<uint16_t> copy(g.total());
    ASSERT_NE(be->bf16_weights(), nullptr);
    be->to_host(copy.data(), be->bf16_weights(), copy.size() * sizeof(uint16_t));
    for (size_t i = 0; i < w.size(); ++i)
      ASSERT_EQ(copy[i], nlp::cpu::to_bf16_bits(w[i])) << when << ": element " << i;
    EXPECT_CLOSE(w, VF(c.data(), c.data() + c.total()), kOp) << when;
  };
  check("after upload");
  nlp::TrainConfig tc;
  tc.weight_decay = 0.1f;
  const nlp::ShardLayout sh = nlp::ShardLayout::even(g.total(), 2);
  nlp::AdamW whole(g, *be, tc, 0, g.total()), cw(c, *cpu_be, tc, 0, c.total());
  nlp::AdamW shard(g, *be, tc, sh.lo(1), sh.hi(1)), cs(c, *cpu_be, tc, sh.lo(1), sh.hi(1));
  for (int t = 1; t <= 3; ++t) {
    const VF grad = randn(g.total(), 1610 + t, 0.1f);
    be->to_device(g.grad(), grad.data(), grad.size() * sizeof(float));
    std::copy(grad.begin(), grad.end(), c.grad());
    whole.step(1e-2f, 0.7f, t, false);
    cw.step(1e-2f, 0.7f, t, false);
    check("after an AdamW step over the arena");
    shard.step(1e-2f, 0.7f, t, false);
    cs.step(1e-2f, 0.7f, t, false);
    check("after an AdamW step over a shard");
  }
  // per-tensor kernel
  const VF grad = randn(g.total(), 1620, 0.1f);
  be->to_device(g.grad(), grad.data(), grad.size() * sizeof(float));
  float* m = upload(*be, VF(g.total(), 0.f));
  float* v = upload(*be, VF(g.total(), 0.f));
  be->adamw_update(g.p(2), g.g(2), m, v, g.specs()[2].numel, 1e-2f, 0.9f, 0.999f, 1e-8f, 0.1f, 1.f, 1);
  std::copy(grad.begin(), grad.end(), c.grad());
  VF mc(g.total(), 0.f), vc(g.total(), 0.f);
  cpu_be->adamw_update(c.p(2), c.g(2), mc.data(), vc.data(), c.specs()[2].numel, 1e-2f, 0.9f, 0.999f,
                       1e-8f, 0.1f, 1.f, 1);
  check("after adamw_update on one tensor");
  be->release(m);
  be->release(v);
  // a GEMM that reads the copy gives the bits of the per-call cast on an equal fp32 weight: a.weight
  // at the copy's start (256-byte aligned, as the cast's scratch) and b.weight inside it (32-byte
  // aligned: cuBLASLt's plan is keyed by the operands' alignment and must compute the same bits)
  auto plain = nlp::make_cuda_backend(0, {nlp::Precision::Bf16});
  std::vector<float> w;
  g.download(w);
  for (int t : {0, 2}) {
    const int M = 29, K = int(g.specs()[t].shape[0]), N = int(g.specs()[t].shape[1]);
    const size_t off = g.specs()[t].offset;
    const VF x = randn(size_t(M) * K, 1630 + t);
    float* xg = upload(*be, x);
    float* yg = static_cast<float*>(be->alloc(size_t(M) * N * sizeof(float)));
    // (no bias: its alignment is part of the plan's key too)
    be->matmul_forward(yg, xg, g.p(t), nullptr, M, K, N, nlp::WLayout::InOut);
    float* xp = upload(*plain, x);
    float* wp = upload(*plain, VF(w.begin() + off, w.begin() + off + size_t(K) * N));
    float* yp = static_cast<float*>(plain->alloc(size_t(M) * N * sizeof(float)));
    plain->matmul_forward(yp, xp, wp, nullptr, M, K, N, nlp::WLayout::InOut);
    EXPECT_TRUE(bitwise_equal(download(*be, yg, size_t(M) * N), download(*plain, yp, size_t(M) * N)))
        << g.specs()[t].name;
    // and the backward's dinp (the copy as W), dW from the cast activations
    const VF dy = randn(size_t(M) * N, 1640 + t);
    float* dyg = upload(*be, dy);
    float* dxg = static_cast<float*>(be->alloc(size_t(M) * K * sizeof(float)));
    be->matmul_backward(dxg, nullptr, nullptr, dyg, xg, g.p(t), M, K, N, nlp::WLayout::InOut);
    float* dyp = upload(*plain, dy);
    float* dxp = static_cast<float*>(plain->alloc(size_t(M) * K * sizeof(float)));
    plain->matmul_backward(dxp, nullptr, nullptr, dyp, xp, wp, M, K, N, nlp::WLayout::InOut);
    EXPECT_TRUE(bitwise_equal(download(*be, dxg, size_t(M) * K), download(*plain, dxp, size_t(M) * K)))
        << g.specs()[t].name;
    for (float* p : {xg, yg, dyg, dxg}) be->release(p);
    for (float* p : {xp, wp, yp, dyp, dxp}) plain->release(p);
  }
}

// run.profile's account on the GPU: the rates measured by a copy and a GEMM are plausible for a data-
// centre GPU, and the CUDA events time each GEMM and its bf16 operand casts under their own labels.
// Backend::path_counts of ops on bf16 views: staged (NLPTRAIN_CUDA_BF16_ACTS=staged) a GELU is one
// staged op with one widening of its input and one rounding of its output; native it is none of
// these; copy_view between the two types is one conversion each way.
TEST_F(CudaOps, PathCountsCountStagedOpsAndCasts) {
  const size_t n = 1000;
  for (const char* acts : {"staged", "native"}) {
    SCOPED_TRACE(acts);
    std::unique_ptr<Backend> be;
    {
      ScopedEnv e("NLPTRAIN_CUDA_BF16_ACTS", acts);
      be = nlp::make_cuda_backend(0, {nlp::Precision::Bf16});
    }
    void* a = be->alloc(n * 2);
    void* b = be->alloc(n * 2);
    float* f = static_cast<float*>(be->alloc(n * 4));
    nlp::PathCounts p0, p1, p2;
    ASSERT_TRUE(be->path_counts(&p0));
    be->gelu_forward(nlp::Act(b, nlp::DType::BF16), nlp::CAct(a, nlp::DType::BF16), n, nlp::Gelu::Tanh);
    be->path_counts(&p1);
    const nlp::PathCounts d = p1 - p0;
    const bool staged = std::string(acts) == "staged";
    EXPECT_EQ(d.staged_ops, staged ? 1 : 0);
    EXPECT_EQ(d.bf16_to_fp32, staged ? 1 : 0);
    EXPECT_EQ(d.fp32_to_bf16, staged ? 1 : 0);
    be->copy_view(nlp::Act(f, nlp::DType::F32), nlp::CAct(a, nlp::DType::BF16), n);
    be->copy_view(nlp::Act(b, nlp::DType::BF16), nlp::CAct(f, nlp::DType::F32), n);
    be->path_counts(&p2);
    EXPECT_EQ((p2 - p1).bf16_to_fp32, 1);
    EXPECT_EQ((p2 - p1).fp32_to_bf16, 1);
    EXPECT_EQ((p2 - p1).staged_ops, 0);
    be->synchronize();
    for (void* p : {a, b, static_cast<void*>(f)}) be->release(p);
  }
}

TEST_F(CudaOps, AccountTimesGemmsAndCastsApart) {
  auto be = nlp::make_cuda_backend(0, {nlp::Precision::Bf16});
  nlp::AccountBackend acct(*be, 64, nlp::Precision::Bf16);
  nlp::ParamStore ps;
  ps.add("w", {256, 512}, true);
  ps.allocate(acct);
  acct.start(size_t(256) << 20, 4096);
  EXPECT_GT(acct.rates().bytes_per_s, 1e11) << acct.rates().how;  // > 100 GB/s
  EXPECT_GT(acct.rates().flops_per_s, 1e13) << acct.rates().how;  // > 10 TFLOP/s
  const int M = 1024, K = 256, N = 512;
  float* x = upload(*be, randn(size_t(M) * K, 1700));
  float* y = static_cast<float*>(be->alloc(size_t(M) * N * sizeof(float)));
  for (int k = 0; k < 3; ++k) acct.matmul_forward(y, x, ps.p(0), nullptr, M, K, N, nlp::WLayout::InOut);
  acct.zero(y, size_t(M) * N * sizeof(float));
  std::string js;
  const std::string table = acct.report(3, 0, &js);
  long gemm = 0, cast = 0, memset = 0;
  double gemm_ms = 0, cast_ms = 0;
  for (const nlp::account::Row& r : acct.account().rows()) {
    if (r.label == "gemm blocks (forward)") gemm = r.timed, gemm_ms = r.ms;
    if (r.label == "cast: gemm blocks (forward)") cast = r.timed, cast_ms = r.ms;
    if (r.label == "memset") memset = r.timed;
  }
  EXPECT_EQ(gemm, 3) << table;
  EXPECT_EQ(cast, 3) << table;
  EXPECT_EQ(memset, 1) << table;
  EXPECT_GT(gemm_ms, 0) << table;
  EXPECT_GT(cast_ms, 0) << table;
  // what ran (Backend::path_counts) since start(): 3 GEMMs without bias, each casting x and w
  EXPECT_NE(table.find("paths: over these 3 steps, gemm fused (bias 0, gelu_aux 0, dgelu 0, bgrad 0); "
                       "gemm fallback (bias 0, gelu_aux 0, dgelu 0, bgrad 0); staged ops 0; casts "
                       "fp32->bf16 6, bf16->fp32 0"),
            std::string::npos)
      << table;
  EXPECT_NE(js.find("\"gpu_paths\": {\"gemm_fused\": {\"bias\": 0,"), std::string::npos) << js;
  EXPECT_NE(js.find("\"casts\": {\"fp32_to_bf16\": 6, \"bf16_to_fp32\": 0}"), std::string::npos) << js;
  be->release(x);
  be->release(y);
}

// ====================================================================================================
// determinism of the backward ops that reduce across rows
// ====================================================================================================

TEST_F(CudaOps, BackwardOpsAreBitwiseDeterministic) {
  const int B = 2, T = 96, NH = 2, HS = 32, C = NH * HS, M = B * T;
  VF qkv = randn(size_t(M) * 3 * C, 1400), dout = randn(size_t(M) * C, 1401);
  float* gq = put(qkv);
  float* ga = nan_buf(size_t(B) * NH * T * T);
  float* go = nan_buf(size_t(M) * C);
  gpu().attention_forward(go, ga, gq, nullptr, true, 0.1f, 5, B, T, NH, HS);
  float* gd = put(dout);
  float* scratch = nan_buf(size_t(B) * NH * T * T);
  VF first;
  for (int rep = 0; rep < 3; ++rep) {
    float* dq = put(VF(qkv.size(), 0.f));
    gpu().attention_backward(dq, scratch, gd, go, gq, ga, nullptr, true, 0.1f, 5, B, T, NH, HS);
    float* dw = put(VF(size_t(C) * C, 0.f));
    float* db = put(VF(C, 0.f));
    gpu().matmul_backward(nullptr, dw, db, gd, go, nullptr, M, C, C, WLayout::OutIn);
    float* lw = put(VF(C, 0.f));
    float* lb = put(VF(C, 0.f));
    float* mean = nan_buf(M);
    float* rstd = nan_buf(M);
    float* ln = nan_buf(size_t(M) * C);
    gpu().layernorm_forward(ln, mean, rstd, go, put(VF(C, 1.f)), put(VF(C, 0.f)), M, C, 1e-5f);
    gpu().layernorm_backward(nullptr, lw, lb, gd, go, nullptr, mean, rstd, M, C);
    VF all = get(dq, qkv.size());
    for (const VF& part : {get(dw, size_t(C) * C), get(db, C), get(lw, C), get(lb, C)})
      all.insert(all.end(), part.begin(), part.end());
    if (rep == 0)
      first = all;
    else
      EXPECT_TRUE(bitwise_equal(all, first)) << "repetition " << rep;
  }
}

// ====================================================================================================
// whole models: the same weights and batch on both backends
// ====================================================================================================

nlp::ModelConfig gpt2_config() {
  nlp::ModelConfig mc;
  mc.type = "gpt2";
  mc.n_layer = 2;
  mc.n_head = 4;
  mc.n_embd = 64;
  mc.vocab_size = 101;
  mc.n_positions = 40;
  mc.initializer_range = 0.1f;
  return mc;  // dropouts 0.1 (on in training)
}

nlp::ModelConfig bert_config() {
  nlp::ModelConfig mc;
  mc.type = "bert";
  mc.hidden_size = 64;
  mc.num_hidden_layers = 2;
  mc.num_attention_heads = 4;
  mc.intermediate_size = 128;
  mc.max_position_embeddings = 40;
  mc.type_vocab_size = 2;
  mc.vocab_size = 101;
  mc.num_labels = 5;
  mc.initializer_range = 0.1f;
  mc.layer_norm_eps = 1e-12f;
  return mc;
}

// Host batch for a task; uploaded per backend by Batch.
struct HostBatch {
  int B = 0, T = 0;
  VI ids, mask, targets, type_ids, labels, start, end;
  VI rows, row_targets;  // mlm, ner: the positions with a target and their targets (make_batch's rows)
};

HostBatch make_host_batch(const std::string& task, int B, int T, int V, int NL, uint64_t seed) {
  HostBatch h;
  h.B = B;
  h.T = T;
  const size_t BT = size_t(B) * T;
  h.ids = randi(BT, seed, 1, V);
  if (task == "clm") {
    h.targets = randi(BT, seed + 1, 0, V);
    for (size_t i = 5; i < BT; i += 7) h.targets[i] = nlp::kIgnoreIndex;
    return h;
  }
  h.mask.assign(BT, 1);
  h.type_ids.assign(BT, 0);
  for (int b = 0; b < B; ++b) {
    const int len = T - 3 * b;  // sequence b has 3b padding positions
    for (int t = 0; t < T; ++t) {
      const size_t i = size_t(b) * T + t;
      if (t >= len) {
        h.mask[i] = 0;
        h.ids[i] = 0;
      }
      if (t >= len / 2 && t < len) h.type_ids[i] = 1;
    }
  }
  if (task == "ner") {
    h.targets = randi(BT, seed + 2, 0, NL);
    for (size_t i = 0; i < BT; ++i)
      if (!h.mask[i] || i % 5 == 0) {
        h.targets[i] = nlp::kIgnoreIndex;
      } else {
        h.rows.push_back(int32_t(i));  // the labelled positions, as make_batch lists them
        h.row_targets.push_back(h.targets[i]);
      }
  } else if (task == "mlm") {
    h.targets.assign(BT, nlp::kIgnoreIndex);
    nlp::Rng r(seed + 3);
    for (size_t i = 0; i < BT; ++i)
      if (h.mask[i] && r.uniform() < 0.25f) {
        h.targets[i] = 1 + int32_t(r.next_u64() % uint64_t(V - 1));
        h.rows.push_back(int32_t(i));  // the masked positions, as make_batch lists them
        h.row_targets.push_back(h.targets[i]);
      }
  } else if (task == "qa") {
    h.start = randi(B, seed + 4, 0, T / 2);
    h.end = randi(B, seed + 5, T / 2, T - 3 * (B - 1));
  } else {  // doc_cls, pair_cls
    h.labels = randi(B, seed + 6, 0, NL);
  }
  return h;
}

// A batch in one backend's memory.
class Batch {
 public:
  Batch(Backend& be, const HostBatch& h) : be_(be) {
    db.B = h.B;
    db.T = h.T;
    db.ids = put(h.ids);
    db.mask = put(h.mask);
    db.targets = put(h.targets);
    db.type_ids = put(h.type_ids);
    db.labels = put(h.labels);
    db.start = put(h.start);
    db.end = put(h.end);
    db.rows = put(h.rows);
    db.row_targets = put(h.row_targets);
    db.nrows = int(h.rows.size());
    // the rows' dropout keys (example * T_key + position with T_key = T: the flat position); with
    // them the model runs its last block at these rows only (mlm; ner in training), else at every row
    db.row_keys = put(h.rows);
  }
  ~Batch() {
    for (void* p : ptrs_) be_.release(p);
  }
  nlp::DeviceBatch db;

 private:
  const int32_t* put(const VI& v) {
    if (v.empty()) return nullptr;
    auto* p = static_cast<int32_t*>(be_.alloc(v.size() * sizeof(int32_t)));
    be_.to_device(p, v.data(), v.size() * sizeof(int32_t));
    ptrs_.push_back(p);
    return p;
  }
  Backend& be_;
  std::vector<void*> ptrs_;
};

// The rows BERT's last block computed in the last forward (block.h OutRows), on both backends: the
// [CLS] rows (doc_cls, pair_cls), the listed rows (mlm; ner in training), else every row (0).
void expect_last_block_rows(const nlp::Model& mc, const nlp::Model& mg, const std::string& task,
                            bool training, const HostBatch& hb) {
  const int want = task == "mlm" || (task == "ner" && training) ? int(hb.rows.size())
                   : task == "doc_cls" || task == "pair_cls"     ? hb.B
                                                                  : 0;
  EXPECT_EQ(mc.last_block_rows(), want) << "cpu";
  EXPECT_EQ(mg.last_block_rows(), want) << "gpu";
}

// Forward + backward on both backends from the same weights; compares loss, outputs, gradients.
void compare_model(Backend& g, const nlp::ModelConfig& mc, const std::string& task, int B, int T) {
  SCOPED_TRACE("task " + task);
  auto mcpu = nlp::make_model(mc, cpu(), task);
  auto mgpu = nlp::make_model(mc, g, task);
  mcpu->init_weights(42);
  std::vector<float> w;
  mcpu->params().download(w);
  mgpu->params().upload(w);
  const int V = mc.vocab_size;
  const HostBatch hb = make_host_batch(task, B, T, V, mc.num_labels, 4242);
  Batch bc(cpu(), hb), bg(g, hb);
  const uint64_t seed = nlp::derive_seed(7, 1, 0);
  for (bool training : {false, true}) {
    SCOPED_TRACE(training ? "training (dropout on)" : "eval");
    const size_t P = mcpu->params().total();
    cpu().zero(mcpu->params().grad(), P * sizeof(float));
    g.zero(mgpu->params().grad(), P * sizeof(float));
    const double lc = mcpu->forward(bc.db, training, seed);
    const double lg = mgpu->forward(bg.db, training, seed);
    EXPECT_LE(rel_err(lg, lc), kModelOut) << "loss gpu " << lg << " cpu " << lc;
    if (mc.type == "bert") expect_last_block_rows(*mcpu, *mgpu, task, training, hb);
    auto oc = mcpu->outputs(), og = mgpu->outputs();
    ASSERT_EQ(oc.size(), og.size());
    for (size_t i = 0; i < oc.size(); ++i) {
      size_t n = 1;
      for (auto d : oc[i].shape) n *= size_t(d);
      EXPECT_LE(rel_err(download(g, og[i].data, n), download(cpu(), oc[i].data, n)), kModelOut)
          << "output " << oc[i].name;
    }
    const float dloss = 1.0f / float(B * T);
    mcpu->backward(bc.db, dloss, training, seed);
    mgpu->backward(bg.db, dloss, training, seed);
    const VF gc = download(cpu(), mcpu->params().grad(), P);
    const VF gg = download(g, mgpu->params().grad(), P);
    double total = 0;
    for (float x : gc) total += double(x) * x;
    total = std::sqrt(total);
    ASSERT_GT(total, 0.0);
    for (const auto& s : mcpu->params().specs()) {
      VF a(gg.begin() + s.offset, gg.begin() + s.offset + s.numel);
      VF r(gc.begin() + s.offset, gc.begin() + s.offset + s.numel);
      double num = 0, den = 0;
      bool finite = true;
      for (size_t i = 0; i < a.size(); ++i) {
        finite = finite && std::isfinite(a[i]);
        num += (double(a[i]) - r[i]) * (double(a[i]) - r[i]);
        den += double(r[i]) * r[i];
      }
      // relative to the tensor's own norm, with a floor of 1e-3 of the whole gradient's norm: some
      // gradients are zero analytically and rounding noise numerically (the key bias: softmax is
      // invariant to a constant added to a row of scores), and noise is not comparable between
      // backends
      const double err = std::sqrt(num) / std::max(std::sqrt(den), 1e-3 * total);
      EXPECT_TRUE(finite) << "gradient " << s.name << " has non-finite values";
      EXPECT_LE(err, kModelGrad) << "gradient " << s.name;
      // BERT's [PAD] row (pad_token_id 0; the padded positions hold id 0) gets no gradient from the
      // embedding lookup (transformers' padding_idx); only the tied MLM decoder adds to it.
      if (s.name == "bert.embeddings.word_embeddings.weight" && task != "mlm" && mc.pad_token_id >= 0) {
        const size_t row = size_t(mc.pad_token_id) * size_t(s.shape[1]);
        for (size_t c = 0; c < size_t(s.shape[1]); ++c)
          ASSERT_EQ(a[row + c], 0.0f) << "gpu gradient of the [PAD] row, column " << c;
      }
    }
  }
}

TEST_F(CudaOps, Gpt2ForwardBackwardMatchesCpu) { compare_model(gpu(), gpt2_config(), "clm", 3, 33); }

TEST_F(CudaOps, BertHeadsForwardBackwardMatchCpu) {
  for (const char* task : {"doc_cls", "pair_cls", "ner", "qa", "mlm"})
    compare_model(gpu(), bert_config(), task, 3, 29);
}

TEST_F(CudaOps, Gpt2DecoderMatchesCpu) {
  const nlp::ModelConfig mc = gpt2_config();
  auto mcpu = nlp::make_model(mc, cpu(), "clm");
  auto mgpu = nlp::make_model(mc, gpu(), "clm");
  mcpu->init_weights(3);
  std::vector<float> w;
  mcpu->params().download(w);
  mgpu->params().upload(w);
  const int B = 2;
  auto dc = nlp::make_decoder(*mcpu, cpu(), B);
  auto dg = nlp::make_decoder(*mgpu, gpu(), B);
  for (int pos = 0; pos < 12; ++pos) {
    const std::vector<int32_t> tok = {int32_t(1 + (pos * 7) % 100), int32_t(1 + (pos * 13) % 100)};
    const VF lc = dc->step(tok, pos);
    const VF lg = dg->step(tok, pos);
    EXPECT_LE(rel_err(lg, lc), kModelOut) << "pos " << pos;
  }
}

TEST_F(CudaOps, Gpt2LossInBf16MatmulMode) {
  const nlp::ModelConfig mc = gpt2_config();
  auto be = nlp::make_cuda_backend(0, {nlp::Precision::Bf16});
  auto mcpu = nlp::make_model(mc, cpu(), "clm");
  auto mbf = nlp::make_model(mc, *be, "clm");
  mcpu->init_weights(5);
  std::vector<float> w;
  mcpu->params().download(w);
  mbf->params().upload(w);
  const HostBatch hb = make_host_batch("clm", 3, 33, mc.vocab_size, 0, 77);
  Batch bc(cpu(), hb), bb(*be, hb);
  const double lc = mcpu->forward(bc.db, false, 1);
  const double lb = mbf->forward(bb.db, false, 1);
  EXPECT_LE(rel_err(lb, lc), 1e-2) << "bf16 " << lb << " cpu " << lc;
}

// 10 AdamW steps (with clipping by the global norm, as the trainer does) on both backends.
void compare_training(Backend& g, const nlp::ModelConfig& mc, const std::string& task, int B, int T) {
  SCOPED_TRACE("task " + task);
  auto mcpu = nlp::make_model(mc, cpu(), task);
  auto mgpu = nlp::make_model(mc, g, task);
  mcpu->init_weights(11);
  std::vector<float> w;
  mcpu->params().download(w);
  mgpu->params().upload(w);
  nlp::TrainConfig tc;
  tc.lr = 3e-3f;
  tc.clip = 1.0f;
  const size_t P = mcpu->params().total();
  nlp::AdamW oc(mcpu->params(), cpu(), tc, 0, P), og(mgpu->params(), g, tc, 0, P);
  for (int step = 1; step <= 10; ++step) {
    const HostBatch hb = make_host_batch(task, B, T, mc.vocab_size, mc.num_labels, 5000 + step);
    Batch bc(cpu(), hb), bg(g, hb);
    const uint64_t seed = nlp::derive_seed(99, step);
    const float dloss = 1.0f / float(B * T);
    double losses[2];
    int k = 0;
    for (auto [be, m, b, opt] : {std::tuple{&cpu(), mcpu.get(), &bc, &oc}, std::tuple{&g, mgpu.get(), &bg, &og}}) {
      be->zero(m->params().grad(), P * sizeof(float));
      losses[k++] = m->forward(b->db, true, seed);
      m->backward(b->db, dloss, true, seed);
      const double norm = std::sqrt(be->sumsq(m->params().grad(), P));
      const float scale = norm > tc.clip ? float(tc.clip / (norm + 1e-6)) : 1.f;
      opt->step(tc.lr, scale, step, false);
      be->synchronize();
    }
    EXPECT_TRUE(std::isfinite(losses[1])) << "step " << step;
    EXPECT_LE(rel_err(losses[1], losses[0]), step == 1 ? kModelOut : kTrain)
        << "step " << step << ": gpu " << losses[1] << " cpu " << losses[0];
  }
}

TEST_F(CudaOps, Gpt2TenAdamWStepsMatchCpu) { compare_training(gpu(), gpt2_config(), "clm", 4, 32); }

// GPT-2 with the fused head (model.fused_head = on, the vocabulary 101 padded to 128, chunks of 40
// rows over 128) on both backends: the CPU's fused head equals its unfused head to ~1e-6
// (test_lm_head.cpp), so the same tolerances as the unfused run.
TEST_F(CudaOps, Gpt2FusedHeadTenAdamWStepsMatchCpu) {
  nlp::ModelConfig mc = gpt2_config();
  mc.fused_head = "on";
  mc.pad_vocab = "128";
  mc.head_chunk = 40;
  compare_training(gpu(), mc, "clm", 4, 32);
}

TEST_F(CudaOps, BertTenAdamWStepsMatchCpu) {
  compare_training(gpu(), bert_config(), "mlm", 4, 24);
  compare_training(gpu(), bert_config(), "doc_cls", 4, 24);
}

// ====================================================================================================
// cuDNN fused attention (BackendOptions::fused_attention): a second backend, bf16 precision
// ====================================================================================================

// Skips when nlptrain was built without the cuDNN frontend; buffers live on the fused backend (its own
// stream), released after each test.
class CudaOpsCudnn : public CudaOps {
 protected:
  void SetUp() override {
    CudaOps::SetUp();
    if (IsSkipped() || HasFatalFailure()) return;
    std::string why;
    if (!nlp::cuda_fused_attention_available(&why)) GTEST_SKIP() << "built without cuDNN: " << why;
    GpuState& g = gpu_state();
    if (!g.fused) {
      nlp::BackendOptions o;
      o.precision = nlp::Precision::Bf16;
      o.fused_attention = true;
      g.fused = nlp::make_cuda_backend(0, o);
    }
  }
  void TearDown() override {
    if (gpu_state().fused) {
      for (void* p : fallocs_) fused().release(p);
      fallocs_.clear();
      fused().synchronize();
    }
    CudaOps::TearDown();
  }

  Backend& fused() { return *gpu_state().fused; }

  template <typename T>
  T* fput(const std::vector<T>& h) {
    T* p = static_cast<T*>(fused().alloc(h.size() * sizeof(T)));
    fallocs_.push_back(p);
    fused().to_device(p, h.data(), h.size() * sizeof(T));
    return p;
  }
  float* fnan(size_t n) { return fput(VF(n, std::numeric_limits<float>::quiet_NaN())); }
  VF fget(const float* p, size_t n) {
    VF h(n);
    fused().to_host(h.data(), p, n * sizeof(float));
    return h;
  }

  // Forward and backward of the fused backend against the CPU backend's fp32 attention on the same
  // bf16-rounded q, k, v and dout (dropout 0): the output within kFusedFwd, each of dq, dk, dv (what
  // the backward ADDED to a random dqkv) within kFusedBwd. token_key (nullable) marks the call as
  // packed rows (mask: segment ids), with `examples` their count (0: not passed); with dropout 0 the
  // keys themselves do not matter. Packed rows through cuDNN's ragged layout give padding tokens no
  // output rule of backend.h's (they are in no sequence): for packed calls the outputs are compared
  // at real tokens, dout is 0 at padding tokens (as in a model, where nothing reads them), and
  // padding tokens must come out 0 or as on the CPU.
  void check_against_cpu(const AttnShape& s, bool causal, const VI* mask, uint64_t seed,
                         const VI* token_key = nullptr, int examples = 0) {
    SCOPED_TRACE(testing::Message() << "B=" << s.B << " T=" << s.T << " NH=" << s.NH << " HS="
                                    << s.HS << " causal=" << causal << " mask=" << (mask != nullptr));
    const int C = s.NH * s.HS;
    const size_t BT = size_t(s.B) * s.T, nqkv = BT * 3 * C, nout = BT * C;
    const size_t natt = size_t(s.B) * s.NH * s.T * s.T;
    ASSERT_NE(fused().attention_saved_floats(s.B, s.T, s.NH, s.HS), natt)
        << "cuDNN does not run this shape (see the warning above)";
    const bool packed = token_key != nullptr;
    const VF qkv = round_bf16(randn(nqkv, seed, 1.0f));
    VF dout = round_bf16(randn(nout, seed + 1));
    if (packed)
      for (size_t row = 0; row < BT; ++row)
        if ((*mask)[row] == 0) std::fill_n(dout.begin() + row * C, C, 0.f);
    const VF dq0 = randn(nqkv, seed + 2);
    const int32_t* cm = mask ? mask->data() : nullptr;
    VF out_c(nout), att_c(cpu().attention_saved_floats(s.B, s.T, s.NH, s.HS)), dq_c = dq0;
    VF scratch_c(cpu().attention_scratch_floats(s.B, s.T, s.NH, s.HS));
    cpu().attention_forward(out_c.data(), att_c.data(), qkv.data(), cm, causal, 0.f, 0, s.B, s.T,
                            s.NH, s.HS);
    cpu().attention_backward(dq_c.data(), scratch_c.data(), dout.data(), out_c.data(), qkv.data(),
                             att_c.data(), cm, causal, 0.f, 0, s.B, s.T, s.NH, s.HS);

    const int rows = std::max(s.B, examples);  // backend.h: packed calls size for max(B, examples)
    const size_t nsaved = fused().attention_saved_floats(rows, s.T, s.NH, s.HS);
    const size_t nscratch = fused().attention_scratch_floats(rows, s.T, s.NH, s.HS);
    float* gq = fput(qkv);
    int32_t* gm = mask ? fput(*mask) : nullptr;
    const int32_t* gkey = token_key ? fput(*token_key) : nullptr;
    float *gsaved = fnan(nsaved), *go = fnan(nout);
    fused().attention_forward(go, gsaved, gq, gm, causal, 0.f, 5, s.B, s.T, s.NH, s.HS, 0, gkey,
                              examples);
    const VF out_g = fget(go, nout);
    if (!packed) {
      EXPECT_LE(rel_err(out_g, out_c), kFusedFwd) << "output";
    } else {
      VF real_g, real_c;
      size_t odd = 0;  // padding tokens neither 0 nor the CPU's value
      for (size_t i = 0; i < nout; ++i) {
        if ((*mask)[i / C] != 0) {
          real_g.push_back(out_g[i]);
          real_c.push_back(out_c[i]);
        } else if (out_g[i] != 0.f && !(std::fabs(out_g[i] - out_c[i]) <= 0.02f * (1.f + std::fabs(out_c[i])))) {
          ++odd;
        }
      }
      EXPECT_LE(rel_err(real_g, real_c), kFusedFwd) << "output at real tokens";
      EXPECT_EQ(odd, 0u) << "padding tokens' output neither 0 nor the CPU's";
    }

    float* gdq = fput(dq0);
    float* gscratch = fnan(nscratch);  // contents undefined: must not leak into dqkv
    fused().attention_backward(gdq, gscratch, fput(dout), go, gq, gsaved, gm, causal, 0.f, 5, s.B,
                               s.T, s.NH, s.HS, 0, gkey, examples);
    const VF dq_g = fget(gdq, nqkv);
    const char* names[3] = {"dq", "dk", "dv"};
    for (int part = 0; part < 3; ++part) {  // the added gradient, per part of each row
      VF a, r;
      for (size_t row = 0; row < BT; ++row)
        for (int c = 0; c < C; ++c) {
          const size_t i = row * 3 * C + size_t(part) * C + c;
          a.push_back(dq_g[i] - dq0[i]);
          r.push_back(dq_c[i] - dq0[i]);
        }
      EXPECT_LE(rel_err(a, r), kFusedBwd) << names[part];
    }
  }

  std::vector<void*> fallocs_;
};

// Packed rows (data.packing with model.attention = cudnn): segment ids, token keys and the count of
// examples, in one layout forced by NLPTRAIN_CUDNN_PACKED (attention_cudnn.h): against the CPU's
// segment-masked attention. Row 0 of segment_mask_for holds one-token examples; the shapes include
// an unaligned T and more examples than rows. Never run yet on a GPU.
class PackedLayout {
 public:
  explicit PackedLayout(const char* layout) { setenv("NLPTRAIN_CUDNN_PACKED", layout, 1); }
  ~PackedLayout() { unsetenv("NLPTRAIN_CUDNN_PACKED"); }
};

int count_segments(const VI& seg, int T) {
  int n = 0;
  for (size_t i = 0; i < seg.size(); ++i)
    n += seg[i] != 0 && (i % size_t(T) == 0 || seg[i - 1] != seg[i]);
  return n;
}

const AttnShape kPackedShapes[] = {{3, 128, 4, 64}, {2, 77, 2, 64}, {4, 512, 12, 64}};

void check_packed(const std::function<void(const AttnShape&, bool, const VI*, uint64_t, const VI*, int)>& check,
                  bool pass_examples) {
  for (const AttnShape& s : kPackedShapes)
    for (bool causal : {false, true}) {
      const VI seg = segment_mask_for(s.B, s.T);
      VI key(seg.size());
      for (size_t i = 0; i < key.size(); ++i) key[i] = int32_t(i % size_t(s.T));
      const int E = count_segments(seg, s.T);
      ASSERT_GT(E, s.B) << "the shape should pack more examples than rows";
      check(s, causal, &seg, 3500 + s.T + causal, &key, pass_examples ? E : 0);
    }
}

// The packed calls (a forward and a backward per shape and causal flag) must have run in the layout
// named: a test that asks for one layout and silently gets the other checks nothing new.
void expect_packed_layout_ran(const nlp::CudnnPackedCalls& before, bool ragged) {
  const nlp::CudnnPackedCalls after = nlp::cuda_cudnn_packed_calls();
  const long calls = 2 * 2 * long(std::size(kPackedShapes));
  EXPECT_EQ(after.ragged - before.ragged, ragged ? calls : 0) << "packed calls in the ragged layout";
  EXPECT_EQ(after.bias - before.bias, ragged ? 0 : calls) << "packed calls in the bias layout";
}

TEST_F(CudaOpsCudnn, PackedRowsMatchCpuBias) {
  PackedLayout forced("bias");
  const nlp::CudnnPackedCalls before = nlp::cuda_cudnn_packed_calls();
  check_packed([&](auto&&... a) { check_against_cpu(a...); }, true);
  expect_packed_layout_ran(before, false);
}

TEST_F(CudaOpsCudnn, PackedRowsMatchCpuRagged) {
  const std::string dev = nlp::cuda_device_description(0);
  const size_t sm = dev.rfind("sm_");
  if (sm == std::string::npos || std::atoi(dev.c_str() + sm + 3) < 90)
    GTEST_SKIP() << "cuDNN's ragged (THD) attention needs Hopper or later; this device: " << dev;
  PackedLayout forced("ragged");
  const nlp::CudnnPackedCalls before = nlp::cuda_cudnn_packed_calls();
  check_packed([&](auto&&... a) { check_against_cpu(a...); }, true);
  expect_packed_layout_ran(before, true);
}

// Without the example count (a caller that does not pass it) packed rows take the bias layout,
// whatever NLPTRAIN_CUDNN_PACKED is unset to.
TEST_F(CudaOpsCudnn, PackedRowsWithoutCountMatchCpu) {
  const nlp::CudnnPackedCalls before = nlp::cuda_cudnn_packed_calls();
  check_packed([&](auto&&... a) { check_against_cpu(a...); }, false);
  expect_packed_layout_ran(before, false);
}

// GPT-2 shapes: causal, head size 64, 2 to 12 heads, up to T = 1024; and non-causal, unaligned T.
TEST_F(CudaOpsCudnn, CausalAndPlainAttentionMatchCpu) {
  check_against_cpu({2, 64, 2, 64}, true, nullptr, 3000);
  check_against_cpu({2, 128, 4, 64}, true, nullptr, 3010);
  check_against_cpu({1, 1024, 12, 64}, true, nullptr, 3020);
  check_against_cpu({3, 77, 3, 64}, false, nullptr, 3030);
  check_against_cpu({2, 100, 4, 32}, false, nullptr, 3040);
}

// BERT shapes with a key padding mask: right padding of different lengths, a mask with holes, and a
// sequence with every key masked (its rows give zeros and no gradient, as on the native path); and a
// causal mask combined with left padding (the first query rows see no key at all).
TEST_F(CudaOpsCudnn, PaddingMaskMatchesCpu) {
  {
    const int B = 5, T = 128;
    VI m(size_t(B) * T, 1);
    const int len[B] = {128, 100, 37, 1, 0};
    for (int b = 0; b < B; ++b)
      for (int t = len[b]; t < T; ++t) m[size_t(b) * T + t] = 0;
    for (int t = 3; t < 60; t += 4) m[size_t(2) * T + t] = 0;  // holes inside sequence 2
    check_against_cpu({B, T, 4, 64}, false, &m, 3100);
  }
  {
    const int B = 3, T = 96;
    VI m(size_t(B) * T, 1);
    for (int t = 0; t < 10; ++t) m[t] = 0;                  // sequence 0: left padding
    for (int t = 50; t < T; ++t) m[size_t(1) * T + t] = 0;  // sequence 1: right padding
    check_against_cpu({B, T, 2, 64}, true, &m, 3110);
  }
  {  // BERT-base-like: 12 heads, T = 512, lengths from 512 down
    const int B = 2, T = 512;
    VI m(size_t(B) * T, 1);
    for (int t = 300; t < T; ++t) m[size_t(1) * T + t] = 0;
    check_against_cpu({B, T, 12, 64}, false, &m, 3120);
  }
}

// Dropout through cuDNN's Philox generator. With q = k = 0 every row is uniform, and with HS == T and
// v[b,t,h,:] = e_t (one-hot) the output IS the dropped probability matrix:
// out[b,i,h*HS + j] = keep(b,h,i,j) / (T (1-p)). So: the same seed gives the same bits (forward and
// backward), another seed another mask, the kept fraction is 1-p, and the backward's dv equals
// P_drop^T dout with P_drop read from the forward output (the backward uses the forward's mask).
TEST_F(CudaOpsCudnn, DropoutIsSeededConsistentAndUnbiased) {
  const int B = 2, T = 64, NH = 4, HS = 64, C = NH * HS;
  const float p = 0.1f;
  const size_t BT = size_t(B) * T, nqkv = BT * 3 * C, nout = BT * C;
  VF qkv(nqkv, 0.f);
  for (int b = 0; b < B; ++b)
    for (int t = 0; t < T; ++t)
      for (int h = 0; h < NH; ++h) qkv[(size_t(b) * T + t) * 3 * C + 2 * C + h * HS + t] = 1.f;
  float* gq = fput(qkv);
  const size_t nsaved = fused().attention_saved_floats(B, T, NH, HS);
  ASSERT_NE(nsaved, size_t(B) * NH * T * T) << "cuDNN does not run this shape";
  float *s1 = fnan(nsaved), *s2 = fnan(nsaved), *s3 = fnan(nsaved);
  float *o1 = fnan(nout), *o2 = fnan(nout), *o3 = fnan(nout);
  fused().attention_forward(o1, s1, gq, nullptr, false, p, 11, B, T, NH, HS);
  fused().attention_forward(o2, s2, gq, nullptr, false, p, 11, B, T, NH, HS);
  fused().attention_forward(o3, s3, gq, nullptr, false, p, 12, B, T, NH, HS);
  const VF out1 = fget(o1, nout), out2 = fget(o2, nout), out3 = fget(o3, nout);
  EXPECT_TRUE(bitwise_equal(out1, out2)) << "same seed, different output";
  EXPECT_FALSE(bitwise_equal(out1, out3)) << "another seed, same output";

  const double kept_value = 1.0 / (T * (1.0 - p));
  size_t kept = 0, odd = 0;
  for (float x : out1) {
    if (x > 0.5 * kept_value) {
      ++kept;
      if (std::fabs(x - kept_value) > 0.01 * kept_value) ++odd;
    } else if (x != 0.f) {
      ++odd;
    }
  }
  EXPECT_EQ(odd, 0u) << "elements neither 0 nor 1/(T(1-p))";
  EXPECT_NEAR(double(kept) / double(nout), 1.0 - p, 0.01) << "kept fraction";

  // backward: twice with the same seed (bitwise equal), and dv = P_drop^T dout
  const VF dout = round_bf16(randn(nout, 3200));
  float* gd = fput(dout);
  const size_t nscratch = fused().attention_scratch_floats(B, T, NH, HS);
  VF grads[2];
  for (VF& g : grads) {
    float* gdq = fput(VF(nqkv, 0.f));
    fused().attention_backward(gdq, fnan(nscratch), gd, o1, gq, s1, nullptr, false, p, 11, B, T, NH,
                               HS);
    g = fget(gdq, nqkv);
  }
  EXPECT_TRUE(bitwise_equal(grads[0], grads[1])) << "same seed, different gradients";
  VF dv_g, dv_ref;
  for (int b = 0; b < B; ++b)
    for (int j = 0; j < T; ++j)
      for (int h = 0; h < NH; ++h)
        for (int d = 0; d < HS; ++d) {
          double acc = 0;  // sum_i P_drop[b,h,i,j] dout[b,i,h,d]
          for (int i = 0; i < T; ++i)
            acc += double(out1[(size_t(b) * T + i) * C + h * HS + j]) *
                   dout[(size_t(b) * T + i) * C + h * HS + d];
          dv_ref.push_back(float(acc));
          dv_g.push_back(grads[0][(size_t(b) * T + j) * 3 * C + 2 * C + h * HS + d]);
        }
  EXPECT_LE(rel_err(dv_g, dv_ref), kFusedBwd) << "dv: the backward's dropout mask is not the forward's";
}

// The saved state and the backward scratch do not grow with T^2: at T = 1024 they are ~8x smaller
// than the probabilities, and a GPT-2's activation memory shrinks accordingly.
TEST_F(CudaOpsCudnn, SavedStateIsFarSmallerThanProbabilities) {
  const int B = 4, T = 1024, NH = 12, HS = 64;
  const size_t natt = size_t(B) * NH * T * T;
  EXPECT_LT(fused().attention_saved_floats(B, T, NH, HS) * 4, natt);
  EXPECT_LT(fused().attention_scratch_floats(B, T, NH, HS) * 4, natt);
  nlp::ModelConfig mc = gpt2_config();
  mc.n_positions = 1024;
  auto m_native = nlp::make_model(mc, gpu(), "clm");
  auto m_fused = nlp::make_model(mc, fused(), "clm");
  EXPECT_LT(m_fused->activation_bytes(B, T) * 2, m_native->activation_bytes(B, T));
}

// A shape cuDNN rejects (head size 4) keeps the native fp32 kernels, in sizing and in dispatch.
TEST_F(CudaOpsCudnn, UnsupportedShapeFallsBackToNative) {
  const AttnShape s{3, 7, 3, 4};
  const int C = s.NH * s.HS;
  const size_t nqkv = size_t(s.B) * s.T * 3 * C, nout = size_t(s.B) * s.T * C;
  const size_t natt = size_t(s.B) * s.NH * s.T * s.T;
  ASSERT_EQ(fused().attention_saved_floats(s.B, s.T, s.NH, s.HS), natt);
  ASSERT_EQ(fused().attention_scratch_floats(s.B, s.T, s.NH, s.HS), natt);
  const VF qkv = randn(nqkv, 3300, 1.5f), dout = randn(nout, 3301), dq0 = randn(nqkv, 3302);
  VF out_c(nout), att_c(cpu().attention_saved_floats(s.B, s.T, s.NH, s.HS)), dq_c = dq0;
  VF scr(cpu().attention_scratch_floats(s.B, s.T, s.NH, s.HS));
  cpu().attention_forward(out_c.data(), att_c.data(), qkv.data(), nullptr, true, 0.2f, 9, s.B, s.T,
                          s.NH, s.HS);
  cpu().attention_backward(dq_c.data(), scr.data(), dout.data(), out_c.data(), qkv.data(), att_c.data(),
                           nullptr, true, 0.2f, 9, s.B, s.T, s.NH, s.HS);
  float *gq = fput(qkv), *ga = fnan(natt), *go = fnan(nout), *gdq = fput(dq0);
  fused().attention_forward(go, ga, gq, nullptr, true, 0.2f, 9, s.B, s.T, s.NH, s.HS);
  fused().attention_backward(gdq, fnan(natt), fput(dout), go, gq, ga, nullptr, true, 0.2f, 9, s.B,
                             s.T, s.NH, s.HS);
  EXPECT_CLOSE(fget(go, nout), out_c, kAttn);
  // the native path's probabilities (the dropout is the index hash's, checked through out and dq)
  EXPECT_CLOSE(fget(ga, natt), attention_probs(qkv, nullptr, true, s.B, s.T, s.NH, s.HS), kAttn);
  EXPECT_CLOSE(fget(gdq, nqkv), dq_c, kAttn);
}

// Whole models on the fused backend (cuDNN attention, bf16 GEMMs) against the CPU backend in bf16
// precision, forward and backward, eval and training (residual and embedding dropout on, with the
// same masks on both; attention dropout off).
void compare_model_fused(Backend& g, nlp::ModelConfig mc, const std::string& task, int B, int T) {
  SCOPED_TRACE("task " + task + " (fused attention)");
  mc.attn_pdrop = 0.f;
  mc.attention_probs_dropout_prob = 0.f;
  const bool bert = mc.type == "bert";
  const int NH = bert ? mc.num_attention_heads : mc.n_head;
  const int HS = (bert ? mc.hidden_size : mc.n_embd) / NH;
  ASSERT_NE(g.attention_saved_floats(B, T, NH, HS), size_t(B) * NH * T * T)
      << "cuDNN does not run this shape";
  auto mcpu = nlp::make_model(mc, cpu_bf16(), task);
  auto mgpu = nlp::make_model(mc, g, task);
  mcpu->init_weights(42);
  std::vector<float> w;
  mcpu->params().download(w);
  mgpu->params().upload(w);
  const HostBatch hb = make_host_batch(task, B, T, mc.vocab_size, mc.num_labels, 4343);
  Batch bc(cpu_bf16(), hb), bg(g, hb);
  const uint64_t seed = nlp::derive_seed(8, 1, 0);
  for (bool training : {false, true}) {
    SCOPED_TRACE(training ? "training" : "eval");
    const size_t P = mcpu->params().total();
    cpu_bf16().zero(mcpu->params().grad(), P * sizeof(float));
    g.zero(mgpu->params().grad(), P * sizeof(float));
    const double lc = mcpu->forward(bc.db, training, seed);
    const double lg = mgpu->forward(bg.db, training, seed);
    EXPECT_LE(rel_err(lg, lc), kFusedModelLoss) << "loss gpu " << lg << " cpu " << lc;
    if (bert) expect_last_block_rows(*mcpu, *mgpu, task, training, hb);
    auto oc = mcpu->outputs(), og = mgpu->outputs();
    ASSERT_EQ(oc.size(), og.size());
    for (size_t i = 0; i < oc.size(); ++i) {
      size_t n = 1;
      for (auto d : oc[i].shape) n *= size_t(d);
      EXPECT_LE(rel_err(download(g, og[i].data, n), download(cpu_bf16(), oc[i].data, n)),
                kFusedModelOut)
          << "output " << oc[i].name;
    }
    const float dloss = 1.0f / float(B * T);
    mcpu->backward(bc.db, dloss, training, seed);
    mgpu->backward(bg.db, dloss, training, seed);
    const VF gc = download(cpu_bf16(), mcpu->params().grad(), P);
    const VF gg = download(g, mgpu->params().grad(), P);
    double total = 0;
    for (float x : gc) total += double(x) * x;
    total = std::sqrt(total);
    ASSERT_GT(total, 0.0);
    for (const auto& sp : mcpu->params().specs()) {
      double num = 0, den = 0;
      bool finite = true;
      for (size_t i = sp.offset; i < sp.offset + sp.numel; ++i) {
        finite = finite && std::isfinite(gg[i]);
        num += (double(gg[i]) - gc[i]) * (double(gg[i]) - gc[i]);
        den += double(gc[i]) * gc[i];
      }
      EXPECT_TRUE(finite) << "gradient " << sp.name << " has non-finite values";
      EXPECT_LE(std::sqrt(num) / std::max(std::sqrt(den), 1e-2 * total), kFusedModelGrad)
          << "gradient " << sp.name;
    }
  }
}

TEST_F(CudaOpsCudnn, Gpt2ForwardBackwardMatchesCpuBf16) {
  compare_model_fused(fused(), gpt2_config(), "clm", 3, 33);
}

TEST_F(CudaOpsCudnn, BertHeadsForwardBackwardMatchCpuBf16) {
  for (const char* task : {"doc_cls", "pair_cls", "ner", "qa", "mlm"})
    compare_model_fused(fused(), bert_config(), task, 3, 29);
}

// ====================================================================================================
// replayed micro-batches: ops recorded into a CUDA graph (Backend::capture_begin .. capture_end) and
// replayed with per-launch seeds and dloss from the recording's value table
// ====================================================================================================

// A small micro-batch on one backend's own buffers: embedding dropout, qkv projection, attention with
// dropout, residual + dropout + layer norm, vocabulary projection, cross-entropy, and their backward.
class ReplayMicroBatch {
 public:
  static constexpr int B = 2, T = 32, NH = 4, HS = 64, C = NH * HS, V = 96, BT = B * T;
  static constexpr float kP = 0.1f;
  enum Slot { kEmbDrop, kResDrop, kAttnDrop, kDloss, kSlots };

  explicit ReplayMicroBatch(Backend& be) : be_(be) {
    const size_t n = size_t(BT) * C;
    x0_ = in(randn(n, 5100));
    wqkv_ = in(randn(size_t(C) * 3 * C, 5101, 0.05f));
    bqkv_ = in(randn(3 * C, 5102, 0.1f));
    lnw_ = in(randn(C, 5103, 0.1f));
    lnb_ = in(randn(C, 5104, 0.1f));
    wo_ = in(randn(size_t(C) * V, 5105, 0.05f));
    VI mask(BT, 1);
    for (int t = T - 5; t < T; ++t) mask[size_t(T) + t] = 0;  // row 1 ends in padding
    mask_ = static_cast<int32_t*>(upload_raw(mask.data(), mask.size() * 4));
    targets_host_ = randi(BT, 5106, 0, V);
    targets_host_[3] = nlp::kIgnoreIndex;
    targets_ = static_cast<int32_t*>(upload_raw(targets_host_.data(), targets_host_.size() * 4));
    const size_t natt = be.attention_saved_floats(B, T, NH, HS);
    const size_t nscr = be.attention_scratch_floats(B, T, NH, HS);
    // forward outputs (NaN before each run) and gradients (zero before each run)
    outputs_ = {{"h", buf(n)},        {"qkv", buf(3 * n)},     {"ao", buf(n)},
                {"att", buf(natt)},   {"res", buf(n)},         {"out", buf(n)},
                {"mean", buf(BT)},    {"rstd", buf(BT)},       {"logits", buf(size_t(BT) * V)},
                {"losses", buf(BT)},  {"ln_scratch", buf(n)},  {"att_scratch", buf(nscr)}};
    grads_ = {{"dlogits", buf(size_t(BT) * V)}, {"dout", buf(n)},
              {"dh", buf(n)},                   {"dao", buf(n)},
              {"dqkv", buf(3 * n)},             {"dwo", buf(size_t(C) * V)},
              {"dwqkv", buf(size_t(C) * 3 * C)}, {"dbqkv", buf(3 * C)},
              {"dlnw", buf(C)},                 {"dlnb", buf(C)},
              {"dx0", buf(n)}};
  }
  ~ReplayMicroBatch() {
    try {
      std::string why;
      be_.capture_end(&why);  // a recording a failed check left open (else nothing)
      for (void* p : allocs_) be_.release(p);
      be_.synchronize();
    } catch (const std::exception& e) {
      ADD_FAILURE() << "releasing the micro-batch's buffers: " << e.what();
    }
  }

  // Outputs NaN, gradients zero: the state every run starts from (outside any recording).
  void reset() {
    for (auto& [name, b] : outputs_) be_.to_device(b.p, VF(b.n, kNan).data(), b.n * sizeof(float));
    for (auto& [name, b] : grads_) be_.zero(b.p, b.n * sizeof(float));
  }

  // The ops with values[k] passed by value, or (record) each seeded/dloss op bound to its slot and
  // given a decoy value that the recording must not use.
  void ops(const uint64_t* values, bool record) {
    auto seed = [&](Slot k) {
      if (record) be_.bind_slot(k);
      return record ? uint64_t(0xdec0) + k : values[k];
    };
    auto unbind = [&] {
      if (record) be_.bind_slot(-1);
    };
    const size_t n = size_t(BT) * C;
    const nlp::DropRows rows = nlp::drop_rows(T, 0, C);
    be_.dropout_forward(o("h"), x0_, n, kP, seed(kEmbDrop), rows);
    unbind();
    be_.matmul_forward(o("qkv"), o("h"), wqkv_, bqkv_, BT, C, 3 * C, WLayout::InOut);
    be_.attention_forward(o("ao"), o("att"), o("qkv"), mask_, false, kP, seed(kAttnDrop), B, T, NH, HS);
    unbind();
    be_.residual_layernorm_forward(o("res"), o("out"), o("mean"), o("rstd"), o("h"), o("ao"), lnw_, lnb_,
                                   BT, C, 1e-5f, kP, seed(kResDrop), rows);
    unbind();
    be_.matmul_forward(o("logits"), o("out"), wo_, nullptr, BT, C, V, WLayout::InOut);
    be_.crossentropy_forward(o("losses"), o("logits"), targets_, BT, V);
    if (record) be_.bind_slot(kDloss);
    be_.crossentropy_backward(g("dlogits"), o("logits"), targets_,
                              record ? 1234.0f : nlp::slot_float(values[kDloss]), BT, V);
    unbind();
    be_.matmul_backward(g("dout"), g("dwo"), nullptr, g("dlogits"), o("out"), wo_, BT, C, V, WLayout::InOut);
    be_.layernorm_dropout_backward(g("dh"), g("dao"), o("ln_scratch"), g("dlnw"), g("dlnb"), g("dout"),
                                   o("res"), lnw_, o("mean"), o("rstd"), BT, C, kP, seed(kResDrop), rows);
    unbind();
    be_.attention_backward(g("dqkv"), o("att_scratch"), g("dao"), o("ao"), o("qkv"), o("att"), mask_, false,
                           kP, seed(kAttnDrop), B, T, NH, HS);
    unbind();
    be_.matmul_backward(g("dh"), g("dwqkv"), g("dbqkv"), g("dqkv"), o("h"), wqkv_, BT, C, 3 * C,
                        WLayout::InOut);
    be_.dropout_backward(g("dx0"), g("dh"), n, kP, seed(kEmbDrop), rows);
    unbind();
  }

  // The forward outputs come first in results(), then the gradients.
  size_t output_count() const { return outputs_.size(); }

  // Every output and gradient, by name (reads back: synchronises).
  std::vector<std::pair<std::string, VF>> results() {
    std::vector<std::pair<std::string, VF>> r;
    for (auto* set : {&outputs_, &grads_})
      for (auto& [name, b] : *set) r.emplace_back(name, download(be_, b.p, b.n));
    return r;
  }
  void set_target(int row, int32_t t) {
    be_.to_device(targets_ + row, &t, sizeof t);
  }
  int32_t target(int row) const { return targets_host_[size_t(row)]; }

 private:
  struct Buf {
    float* p;
    size_t n;
  };
  static constexpr float kNan = std::numeric_limits<float>::quiet_NaN();
  void* upload_raw(const void* h, size_t bytes) {
    void* p = be_.alloc(bytes);
    allocs_.push_back(p);
    be_.to_device(p, h, bytes);
    return p;
  }
  float* in(const VF& h) { return static_cast<float*>(upload_raw(h.data(), h.size() * sizeof(float))); }
  Buf buf(size_t n) {
    float* p = static_cast<float*>(be_.alloc(n * sizeof(float)));
    allocs_.push_back(p);
    return {p, n};
  }
  static float* find(std::vector<std::pair<std::string, Buf>>& v, const char* name) {
    for (auto& [k, b] : v)
      if (k == name) return b.p;
    ADD_FAILURE() << "no buffer " << name;
    return nullptr;
  }
  float* o(const char* name) { return find(outputs_, name); }
  float* g(const char* name) { return find(grads_, name); }

  Backend& be_;
  std::vector<void*> allocs_;
  float *x0_, *wqkv_, *bqkv_, *lnw_, *lnb_, *wo_;
  int32_t *mask_, *targets_;
  VI targets_host_;
  std::vector<std::pair<std::string, Buf>> outputs_, grads_;
};

void expect_same_results(const std::vector<std::pair<std::string, VF>>& got,
                         const std::vector<std::pair<std::string, VF>>& want, const char* what) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t k = 0; k < got.size(); ++k)
    EXPECT_TRUE(bitwise_equal(got[k].second, want[k].second))
        << what << ": " << got[k].first << " differs (relative error "
        << rel_err(got[k].second, want[k].second) << ")";
}

void check_capture_and_replay(Backend& be) {
  using MB = ReplayMicroBatch;
  std::string why;
  ASSERT_TRUE(be.can_capture(&why)) << why;
  MB mb(be);
  const uint64_t values[2][MB::kSlots] = {{101, 202, 303, nlp::slot_word(1.0f / MB::BT)},
                                          {111, 222, 333, nlp::slot_word(0.5f)}};
  // eager pass: every scratch buffer grows and every cuDNN / cuBLASLt plan is made here
  mb.reset();
  mb.ops(values[0], false);
  const auto eager0 = mb.results();

  EXPECT_THROW(be.bind_slot(0), nlp::Error) << "bind_slot outside a recording";
  be.capture_begin(MB::kSlots);
  mb.ops(nullptr, true);
  std::shared_ptr<Backend::Recording> rec = be.capture_end(&why);
  ASSERT_TRUE(rec) << "capture_end: " << why;

  std::vector<std::pair<std::string, VF>> replayed[2];
  for (int v = 0; v < 2; ++v) {
    SCOPED_TRACE(testing::Message() << "value set " << v);
    mb.reset();
    mb.ops(values[v], false);
    const auto eager = mb.results();
    if (v == 0) expect_same_results(eager, eager0, "eager runs");
    mb.reset();
    be.replay(*rec, values[v], MB::kSlots);
    replayed[v] = mb.results();
    expect_same_results(replayed[v], eager, "replay vs eager");
  }
  // the slots really feed the recording: other seeds, another dropout mask and dloss
  EXPECT_FALSE(bitwise_equal(replayed[0][0].second, replayed[1][0].second)) << "h: same mask";
  // two replays back to back, no synchronisation between them: the second's values are its own
  // (its forward outputs are the one-replay ones; the gradients hold both replays' sums)
  mb.reset();
  be.replay(*rec, values[1], MB::kSlots);
  be.replay(*rec, values[0], MB::kSlots);
  {
    auto got = mb.results(), want = replayed[0];
    got.resize(mb.output_count());
    want.resize(mb.output_count());
    expect_same_results(got, want, "second of two replays");
  }

  // the target check sees what a replay's cross-entropy flagged, at the next synchronisation
  const int32_t t5 = mb.target(5);
  mb.set_target(5, MB::V + 7);
  be.replay(*rec, values[0], MB::kSlots);
  EXPECT_THROW(be.synchronize(), nlp::Error) << "a bad target in a replay went unreported";
  mb.set_target(5, t5);
  EXPECT_THROW(be.replay(*rec, values[0], MB::kSlots - 1), nlp::Error) << "wrong number of values";

  // recordings that cannot be made: a buffer that would grow (cross-entropy statistics for 16x the
  // rows), a read-back; each ends with null and a reason, and the backend goes on as before
  const int bigM = 16 * MB::BT;
  float* big_logits = upload(be, randn(size_t(bigM) * MB::V, 5107));
  float* big_losses = upload(be, VF(bigM, 0.f));
  VI big_targets_h = randi(bigM, 5108, 0, MB::V);
  auto* big_targets = static_cast<int32_t*>(be.alloc(big_targets_h.size() * 4));
  be.to_device(big_targets, big_targets_h.data(), big_targets_h.size() * 4);
  be.capture_begin(1);
  EXPECT_THROW(be.crossentropy_forward(big_losses, big_logits, big_targets, bigM, MB::V), nlp::Error);
  why.clear();
  EXPECT_FALSE(be.capture_end(&why)) << "a recording whose statistics buffer grew";
  EXPECT_FALSE(why.empty());
  std::printf("  (refused as it should be: %s)\n", why.c_str());
  be.capture_begin(1);
  be.bind_slot(0);
  VF host(16);
  EXPECT_THROW(be.to_host(host.data(), big_logits, host.size() * sizeof(float)), nlp::Error);
  be.bind_slot(-1);
  why.clear();
  EXPECT_FALSE(be.capture_end(&why)) << "a recording that read back";
  EXPECT_FALSE(why.empty());
  EXPECT_FALSE(be.capture_end(&why)) << "capture_end without capture_begin";
  mb.reset();
  mb.ops(values[0], false);
  expect_same_results(mb.results(), eager0, "eager after refused recordings");
  mb.reset();
  be.replay(*rec, values[0], MB::kSlots);  // nothing grew: the recording is still good
  expect_same_results(mb.results(), replayed[0], "replay after refused recordings");

  // once a buffer has grown (eagerly), the recording points into freed memory: replay refuses
  be.crossentropy_forward(big_losses, big_logits, big_targets, bigM, MB::V);
  EXPECT_THROW(be.replay(*rec, values[0], MB::kSlots), nlp::Error) << "replay after a buffer grew";
  rec.reset();
  be.capture_begin(MB::kSlots);
  mb.ops(nullptr, true);
  rec = be.capture_end(&why);
  ASSERT_TRUE(rec) << "capture_end (recorded again): " << why;
  mb.reset();
  be.replay(*rec, values[1], MB::kSlots);
  expect_same_results(mb.results(), replayed[1], "replay recorded again");
  rec.reset();
  for (void* p : {static_cast<void*>(big_logits), static_cast<void*>(big_losses),
                  static_cast<void*>(big_targets)})
    be.release(p);
}

// Recorded micro-batches replay bit for bit as the same ops run eagerly with the same values: on the
// default backend, with NLPTRAIN_CUDA_FUSED_LN=0 (Backend's default sequence of separate ops), and
// on a bf16 backend with cuDNN's fused attention when built with it. Each backend is fresh, so that
// its scratch buffers start small.
TEST_F(CudaOps, CapturedOpsReplayWithTheirSlotValues) {
  {
    SCOPED_TRACE("default backend (native attention, fused layer norm)");
    auto be = nlp::make_cuda_backend(0);
    check_capture_and_replay(*be);
  }
  {
    SCOPED_TRACE("NLPTRAIN_CUDA_FUSED_LN=0");
    ::setenv("NLPTRAIN_CUDA_FUSED_LN", "0", 1);
    std::unique_ptr<Backend> be;
    try {
      be = nlp::make_cuda_backend(0);
    } catch (...) {
      ::unsetenv("NLPTRAIN_CUDA_FUSED_LN");
      throw;
    }
    ::unsetenv("NLPTRAIN_CUDA_FUSED_LN");
    check_capture_and_replay(*be);
  }
  std::string why;
  if (!nlp::cuda_fused_attention_available(&why)) {
    std::printf("  (no cuDNN fused-attention backend to check: %s)\n", why.c_str());
    return;
  }
  {
    SCOPED_TRACE("bf16 backend with cuDNN fused attention");
    nlp::BackendOptions o;
    o.precision = nlp::Precision::Bf16;
    o.fused_attention = true;
    auto be = nlp::make_cuda_backend(0, o);
    ASSERT_NE(be->attention_saved_floats(2, 32, 4, 64), size_t(2) * 4 * 32 * 32)
        << "cuDNN does not run this shape";
    check_capture_and_replay(*be);
  }
}

// An explicit model.attention = cudnn in a build without cuDNN is an error naming the key (the test
// binary of a build WITH cuDNN checks that the factory accepts it).
TEST_F(CudaOps, FusedAttentionFactory) {
  nlp::BackendOptions o;
  o.fused_attention = true;
  std::string why;
  if (nlp::cuda_fused_attention_available(&why)) {
    EXPECT_EQ(nlp::make_backend("cuda", 1, 0, o)->name(), "cuda");
  } else {
    try {
      nlp::make_backend("cuda", 1, 0, o);
      ADD_FAILURE() << "no error";
    } catch (const nlp::Error& e) {
      EXPECT_NE(std::string(e.what()).find("model.attention = cudnn"), std::string::npos) << e.what();
    }
  }
}

#if NLPTRAIN_HAVE_CUDA
// The grow-only buffer of the backend's workspace, the GEMM's bf16 scratch and cuDNN's workspace
// (backend/cuda/device_workspace.h): a request that fits returns the buffer held without asking;
// a larger one asks refuse(held, wanted) first, counts the growth and holds a new buffer of whole
// MiB; a refusal (refuse throws) leaves the buffer, its size and the count as they were.
TEST_F(CudaOps, DeviceWorkspaceGrowsOnlyForMoreAndAsksFirst) {
  cudaStream_t st = static_cast<cudaStream_t>(nlp::cuda_backend_stream(gpu()));
  const size_t mib = size_t(1) << 20;
  nlp::cuda::DeviceWorkspace ws("test workspace");
  std::vector<std::pair<size_t, size_t>> asked;
  auto ask = [&](size_t held, size_t want) { asked.emplace_back(held, want); };
  auto check = [](cudaError_t e, const char* what) {
    if (e != cudaSuccess) throw nlp::Error(nlp::cat(what, ": ", cudaGetErrorString(e)));
  };
  EXPECT_EQ(ws.data(), nullptr);
  EXPECT_EQ(ws.bytes(), 0u);
  void* a = ws.get(1, st, ask, check);
  ASSERT_NE(a, nullptr);
  EXPECT_EQ(ws.bytes(), mib);
  EXPECT_EQ(ws.grows(), 1u);
  ASSERT_EQ(asked.size(), 1u);
  EXPECT_EQ(asked[0], std::make_pair(size_t(0), size_t(1)));
  EXPECT_EQ(ws.get(mib, st, ask, check), a);  // fits: the same buffer, nothing asked
  EXPECT_EQ(ws.grows(), 1u);
  EXPECT_EQ(asked.size(), 1u);
  void* b = ws.get(mib + 1, st, ask, check);
  ASSERT_NE(b, nullptr);
  EXPECT_EQ(ws.bytes(), 2 * mib);
  EXPECT_EQ(ws.grows(), 2u);
  ASSERT_EQ(asked.size(), 2u);
  EXPECT_EQ(asked[1], std::make_pair(mib, mib + 1));
  ASSERT_EQ(cudaMemsetAsync(b, 0x5a, ws.bytes(), st), cudaSuccess);  // all of it is usable
  ASSERT_EQ(cudaStreamSynchronize(st), cudaSuccess);
  auto refuse = [](size_t, size_t) { throw nlp::Error("refused"); };
  EXPECT_THROW(ws.get(3 * mib, st, refuse, check), nlp::Error);
  EXPECT_EQ(ws.data(), b);
  EXPECT_EQ(ws.bytes(), 2 * mib);
  EXPECT_EQ(ws.grows(), 2u);
  EXPECT_EQ(ws.get(2 * mib, st, refuse, check), b);  // fits: refuse is not asked
  ws.free_async(st);
  EXPECT_EQ(ws.data(), nullptr);
  EXPECT_EQ(ws.bytes(), 0u);
  ASSERT_EQ(cudaStreamSynchronize(st), cudaSuccess);
}
#endif

}  // namespace
