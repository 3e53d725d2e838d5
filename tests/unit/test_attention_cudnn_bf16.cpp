// cuDNN fused attention with bf16 I/O (attention_cudnn.h forward_bf16 / backward_bf16, and the
// sdpa_io.cu kernels they use: sdpa_rows_bf16, sdpa_tokens_bf16), on the GPU:
//  - against the fp32-I/O entry points (the path verified on GPUs) on the same bf16-rounded q|k|v and
//    upstream gradient: the forward output bitwise equal (cuDNN runs the same graph on the same bf16
//    operands; the fp32 path's output is the exact fp32 value of its bf16 O), each element of dq|dk|dv
//    within 1 bf16 ulp of the fp32 path's (bitwise when cuDNN has a deterministic backward for the
//    variant; the count of differing elements is printed);
//  - against a CPU reference in double from the same bf16-rounded inputs, with backend.h's masks:
//    norm-wise relative error ||gpu - ref|| / ||ref||, output 1e-2 and each of dq, dk, dv 2e-2 (the
//    tolerances of the fp32-I/O path's tests in test_ops_cuda.cpp: cuDNN rounds the probabilities to
//    bf16 before P.V, and O, dO and the gradients are stored in bf16);
//  - write mode (accumulate = false) ignores the prior contents of dqkv (NaN-filled here); accumulate
//    mode gives bf16(prior + gradient) within 1 bf16 ulp of that sum formed on the host from the write
//    mode's gradient;
//  - the kernels bitwise against their CPU definitions (copies, zeros, and one fp32 add of two bf16
//    values, which is exact, rounded once).
// The CUDA backend's overrides on bf16 views take this path (BackendBf16ViewsTakeTheNativePath).
// Cases: causal GPT-2-like heads; a key padding mask with a fully masked sequence (not causal) and
// left padding (causal), both with query rows that see no key; packed rows in the ragged layout with
// examples <= B (in place) and examples > B (staged), and in the bias layout; dropout with the Philox
// seed read from device memory (seed slot), against the fp32-I/O path given the same seed directly.
// Without a usable GPU, or in a build without CUDA or cuDNN, the GPU tests are skipped with the reason;
// StatsOnlySavedStateAndDoScratch (size arithmetic) runs on the CPU in every CUDA build.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <limits>
#include <memory>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "backend/cpu/round.h"
#include "backend/cuda/device.h"

#if defined(NLPTRAIN_HAVE_CUDA)
#include <cuda_runtime_api.h>

#include "kernels.cuh"  // kernels/ (an include directory of CUDA builds)
#include "backend/cuda/attention_cudnn.h"
#include "backend/cuda/cuda_backend.h"
#include "core/backend.h"
#include "core/tensor.h"

namespace {

using VF = std::vector<float>;
using VI = std::vector<int32_t>;
using VB = std::vector<uint16_t>;  // bf16 bit patterns
using nlp::cuda::CudnnAttention;

constexpr double kFwd = 1e-2;  // output against the double reference (norm-wise)
constexpr double kBwd = 2e-2;  // each of dq, dk, dv against the double reference (norm-wise)

// ---- host bf16 ------------------------------------------------------------------------------------

uint16_t bits(float x) { return nlp::cpu::to_bf16_bits(x); }
float value(uint16_t b) {
  const uint32_t u = uint32_t(b) << 16;
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}
VB to_bits(const VF& v) {
  VB r(v.size());
  for (size_t i = 0; i < v.size(); ++i) r[i] = bits(v[i]);
  return r;
}
VF to_values(const VB& v) {
  VF r(v.size());
  for (size_t i = 0; i < v.size(); ++i) r[i] = value(v[i]);
  return r;
}
// One bf16 ulp at |x| (the spacing of bf16 values in x's binade; the smallest normal's below it)
double ulp(double x) {
  const double a = std::max(std::fabs(x), 1.1754943508222875e-38);
  return std::ldexp(1.0, std::ilogb(a) - 7);
}

VF randn_bf16(size_t n, uint64_t seed) {  // normal values, rounded to bf16
  std::mt19937_64 g(seed);
  std::normal_distribution<float> d(0.f, 1.f);
  VF v(n);
  for (float& x : v) x = nlp::cpu::round_bf16(d(g));
  return v;
}

double rel_err(const std::vector<double>& a, const std::vector<double>& ref) {
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    if (!std::isfinite(a[i])) return INFINITY;
    num += (a[i] - ref[i]) * (a[i] - ref[i]);
    den += ref[i] * ref[i];
  }
  return std::sqrt(num / std::max(den, 1e-300));
}

// ---- the CPU reference, in double -------------------------------------------------------------------

// visible(b, i, j): query i of sequence b sees key j. A query that sees no key is dead: output 0 and
// no gradient (the rule of the native kernels and the cuDNN path alike).
using Visible = std::function<bool(int, int, int)>;

struct Shape {
  int B, T, NH, HS;
  int C() const { return NH * HS; }
  size_t BT() const { return size_t(B) * T; }
};

// out[B,T,C] and dqkv[B,T,3C] (d loss / d qkv for loss = sum(out * dout)), dropout 0
void reference(const Shape& s, const VF& qkv, const VF& dout, const Visible& visible,
               std::vector<double>& out, std::vector<double>& dqkv) {
  const int C = s.C(), T = s.T, HS = s.HS;
  const double scale = 1.0 / std::sqrt(double(HS));
  out.assign(s.BT() * C, 0.0);
  dqkv.assign(s.BT() * 3 * C, 0.0);
  auto at = [&](int b, int t, int part, int h) { return (size_t(b) * T + t) * 3 * C + size_t(part) * C + size_t(h) * HS; };
  std::vector<double> p(T), dp(T);
  for (int b = 0; b < s.B; ++b)
    for (int h = 0; h < s.NH; ++h)
      for (int i = 0; i < T; ++i) {
        const size_t qi = at(b, i, 0, h), oi = (size_t(b) * T + i) * C + size_t(h) * HS;
        double mx = -INFINITY;
        for (int j = 0; j < T; ++j) {
          p[j] = -INFINITY;
          if (!visible(b, i, j)) continue;
          double d = 0;
          for (int c = 0; c < HS; ++c) d += double(qkv[qi + c]) * qkv[at(b, j, 1, h) + c];
          p[j] = d * scale;
          mx = std::max(mx, p[j]);
        }
        if (mx == -INFINITY) continue;  // dead row
        double sum = 0;
        for (int j = 0; j < T; ++j) sum += p[j] = p[j] == -INFINITY ? 0.0 : std::exp(p[j] - mx);
        for (int j = 0; j < T; ++j) p[j] /= sum;
        for (int j = 0; j < T; ++j)
          if (p[j] != 0)
            for (int c = 0; c < HS; ++c) out[oi + c] += p[j] * qkv[at(b, j, 2, h) + c];
        double D = 0;
        for (int j = 0; j < T; ++j) {
          dp[j] = 0;
          if (p[j] == 0) continue;
          for (int c = 0; c < HS; ++c) dp[j] += double(dout[oi + c]) * qkv[at(b, j, 2, h) + c];
          D += p[j] * dp[j];
        }
        for (int j = 0; j < T; ++j) {
          if (p[j] == 0) continue;
          const double ds = p[j] * (dp[j] - D) * scale;
          for (int c = 0; c < HS; ++c) {
            dqkv[at(b, j, 2, h) + c] += p[j] * dout[oi + c];
            dqkv[qi + c] += ds * qkv[at(b, j, 1, h) + c];
            dqkv[at(b, j, 1, h) + c] += ds * qkv[qi + c];
          }
        }
      }
}

// ---- the device -------------------------------------------------------------------------------------

struct Gpu {
  cudaStream_t stream = nullptr;
  std::unique_ptr<CudnnAttention> att;
  std::string skip_reason;  // no device, or no cuDNN: skip
  std::string failure;      // a device, but the attention failed to start: fail
};

bool gpu_started = false;  // gpu() has run: the teardown below has a stream and cuDNN to release

Gpu& gpu() {
  gpu_started = true;
  static Gpu g = [] {
    Gpu s;
    std::string why;
    if (nlp::cuda_device_count(&why) == 0) {
      s.skip_reason = "no CUDA device: " + why;
      return s;
    }
    if (!nlp::cuda_fused_attention_available(&why)) {
      s.skip_reason = "built without cuDNN: " + why;
      return s;
    }
    try {
      if (cudaSetDevice(0) != cudaSuccess || cudaStreamCreate(&s.stream) != cudaSuccess)
        throw std::runtime_error("cudaSetDevice/cudaStreamCreate failed");
      s.att = std::make_unique<CudnnAttention>(s.stream);
    } catch (const std::exception& e) {
      s.failure = e.what();
    }
    return s;
  }();
  return g;
}

// Releases cuDNN and the stream after the last test, while the CUDA runtime is still up; starts
// nothing when no test of this file ran (test_cuda_bf16 holds other files' tests too)
class GpuEnvironment : public ::testing::Environment {
 public:
  void TearDown() override {
    if (!gpu_started) return;
    Gpu& g = gpu();
    g.att.reset();
    if (g.stream) cudaStreamDestroy(g.stream);
    g.stream = nullptr;
  }
};
const ::testing::Environment* const kGpuEnvironment =
    ::testing::AddGlobalTestEnvironment(new GpuEnvironment);

// NLPTRAIN_CUDNN_PACKED forced for one scope (attention_cudnn.h)
class PackedLayout {
 public:
  explicit PackedLayout(const char* layout) { setenv("NLPTRAIN_CUDNN_PACKED", layout, 1); }
  ~PackedLayout() { unsetenv("NLPTRAIN_CUDNN_PACKED"); }
};

class CudnnBf16 : public ::testing::Test {
 protected:
  void SetUp() override {
    Gpu& g = gpu();
    if (!g.skip_reason.empty()) GTEST_SKIP() << g.skip_reason;
    ASSERT_TRUE(g.failure.empty()) << "a CUDA device is present but cuDNN attention failed: " << g.failure;
  }
  void TearDown() override {
    if (gpu().stream) EXPECT_EQ(cudaStreamSynchronize(gpu().stream), cudaSuccess);
    for (void* p : allocs_) cudaFree(p);
    allocs_.clear();
  }

  CudnnAttention& att() { return *gpu().att; }
  cudaStream_t stream() { return gpu().stream; }

  template <typename T>
  T* put(const std::vector<T>& h) {
    void* p = nullptr;
    EXPECT_EQ(cudaMalloc(&p, std::max<size_t>(h.size(), 1) * sizeof(T)), cudaSuccess);
    allocs_.push_back(p);
    EXPECT_EQ(cudaMemcpy(p, h.data(), h.size() * sizeof(T), cudaMemcpyHostToDevice), cudaSuccess);
    return static_cast<T*>(p);
  }
  template <typename T>
  std::vector<T> get(const T* p, size_t n) {
    EXPECT_EQ(cudaStreamSynchronize(stream()), cudaSuccess);
    std::vector<T> h(n);
    EXPECT_EQ(cudaMemcpy(h.data(), p, n * sizeof(T), cudaMemcpyDeviceToHost), cudaSuccess);
    return h;
  }
  float* nanf(size_t n) { return put(VF(n, std::numeric_limits<float>::quiet_NaN())); }
  uint16_t* nanb(size_t n) { return put(VB(n, uint16_t(0x7fc0))); }  // bf16 NaN

  // One call shape: mask (nullable) is a 0/1 key padding mask, or segment ids when packed.
  struct Case {
    Shape s;
    bool causal = false;
    const VI* mask = nullptr;
    bool packed = false;
    int examples = 0;
    float dropout = 0.f;
    bool ragged_rule = false;  // the reference's rule for packed rows: ragged (padding rows dead)
    uint64_t seed = 1;
  };

  // backend.h's visibility for the case (causal band, key padding, segment rule)
  static Visible visibility(const Case& c) {
    const int T = c.s.T;
    const VI* m = c.mask;
    return [=](int b, int i, int j) {
      if (c.causal && j > i) return false;
      if (!m) return true;
      const int32_t si = (*m)[size_t(b) * T + i], sj = (*m)[size_t(b) * T + j];
      if (!c.packed) return sj != 0;
      if (c.ragged_rule) return si != 0 && si == sj;
      return sj != 0 && (si == 0 || si == sj);
    };
  }

  // Runs the fp32-I/O and bf16-I/O forward and backward (write mode, then accumulate mode) on the
  // same inputs and checks everything listed at the top of this file. reference_check: against the
  // double reference too (dropout 0 only).
  void check(const Case& c, bool reference_check = true, const std::string& what = "") {
    const Shape& s = c.s;
    SCOPED_TRACE(testing::Message() << what << " B=" << s.B << " T=" << s.T << " NH=" << s.NH
                                    << " HS=" << s.HS << " causal=" << c.causal
                                    << " mask=" << (c.mask != nullptr) << " packed=" << c.packed
                                    << " examples=" << c.examples << " dropout=" << c.dropout);
    ASSERT_TRUE(att().supports(s.B, s.T, s.NH, s.HS)) << "cuDNN does not run this shape";
    const int C = s.C();
    const size_t BT = s.BT(), nqkv = BT * 3 * C, nout = BT * C;
    const int R = std::max(s.B, c.examples);
    const VF qkv = randn_bf16(nqkv, c.seed);
    const VF dout = randn_bf16(nout, c.seed + 1);
    const int32_t* gm = c.mask ? put(*c.mask) : nullptr;
    uint64_t* slot = put(std::vector<uint64_t>{c.seed + 77});
    const uint64_t seed = c.seed + 77;  // the fp32 path takes it directly, the bf16 path from `slot`

    // fp32 I/O (the verified path): dqkv starts at 0, so it holds exactly float(cuDNN's bf16 dq|dk|dv)
    float* q32 = put(qkv);
    float* saved32 = nanf(nlp::cuda::sdpa_saved_floats(R, s.T, s.NH, s.HS));
    float* out32 = nanf(nout);
    att().forward(out32, saved32, q32, gm, c.packed, c.examples, c.causal, c.dropout, seed, nullptr,
                  s.B, s.T, s.NH, s.HS);
    float* dq32 = put(VF(nqkv, 0.f));
    att().backward(dq32, nanf(nlp::cuda::sdpa_scratch_floats(R, s.T, s.NH, s.HS)), put(dout),
                   saved32, gm, c.packed, c.examples, c.causal, c.dropout, seed, nullptr, s.B, s.T,
                   s.NH, s.HS);
    const VF out_f = get(out32, nout), dq_f = get(dq32, nqkv);

    // bf16 I/O: outputs NaN-filled (write mode must overwrite every element), saved and scratch too
    uint16_t* q16 = put(to_bits(qkv));
    float* saved16 = nanf(nlp::cuda::sdpa_saved_floats_bf16(R, s.T, s.NH, s.HS));
    uint16_t* out16 = nanb(nout);
    att().forward_bf16(out16, saved16, q16, gm, c.packed, c.examples, c.causal, c.dropout, 0, slot,
                       s.B, s.T, s.NH, s.HS);
    uint16_t* dout16 = put(to_bits(dout));
    uint16_t* dq16 = nanb(nqkv);
    float* scratch16 = nanf(nlp::cuda::sdpa_scratch_floats_bf16(R, s.T, s.NH, s.HS));
    att().backward_bf16(dq16, false, scratch16, dout16, q16, out16, saved16, gm, c.packed,
                        c.examples, c.causal, c.dropout, 0, slot, s.B, s.T, s.NH, s.HS);
    const VF out_b = to_values(get(out16, nout)), dq_b = to_values(get(dq16, nqkv));
    // the inputs are unchanged (read in place)
    EXPECT_EQ(get(q16, nqkv), to_bits(qkv)) << "qkv was modified";
    EXPECT_EQ(get(dout16, nout), to_bits(dout)) << "dout was modified";

    size_t out_diff = 0;
    for (size_t i = 0; i < nout; ++i) out_diff += !(out_b[i] == out_f[i]);  // NaN counts
    EXPECT_EQ(out_diff, 0u) << "forward elements not bitwise equal to the fp32-I/O path's";
    size_t grad_bits = 0, grad_far = 0;
    for (size_t i = 0; i < nqkv; ++i) {
      grad_bits += !(dq_b[i] == dq_f[i]);
      grad_far += !(std::fabs(double(dq_b[i]) - dq_f[i]) <=
                    ulp(std::max(std::fabs(double(dq_b[i])), std::fabs(double(dq_f[i])))));
    }
    EXPECT_EQ(grad_far, 0u) << "dq|dk|dv elements more than 1 bf16 ulp from the fp32-I/O path's";
    std::printf("[ bf16 I/O ] %s: dq|dk|dv elements not bitwise equal to the fp32-I/O path's: %zu of %zu\n",
                what.c_str(), grad_bits, nqkv);

    // accumulate mode: prior + gradient, one rounding
    const VF prior = randn_bf16(nqkv, c.seed + 2);
    uint16_t* acc16 = put(to_bits(prior));
    att().backward_bf16(acc16, true, nanf(nlp::cuda::sdpa_scratch_floats_bf16(R, s.T, s.NH, s.HS)),
                        dout16, q16, out16, saved16, gm, c.packed, c.examples, c.causal, c.dropout,
                        0, slot, s.B, s.T, s.NH, s.HS);
    const VF acc_b = to_values(get(acc16, nqkv));
    size_t acc_far = 0;
    for (size_t i = 0; i < nqkv; ++i) {
      const double want = nlp::cpu::round_bf16(float(double(prior[i]) + dq_b[i]));
      acc_far += !(std::fabs(acc_b[i] - want) <= ulp(want));
    }
    EXPECT_EQ(acc_far, 0u) << "accumulate mode: elements more than 1 bf16 ulp from prior + gradient";

    if (!reference_check) return;
    std::vector<double> out_r, dq_r;
    reference(s, qkv, dout, visibility(c), out_r, dq_r);
    EXPECT_LE(rel_err(std::vector<double>(out_b.begin(), out_b.end()), out_r), kFwd) << "output";
    size_t dead_nonzero = 0;  // rows the reference leaves at 0 must be exactly 0
    for (size_t i = 0; i < nout; ++i) dead_nonzero += out_r[i] == 0.0 && out_b[i] != 0.f;
    const char* names[3] = {"dq", "dk", "dv"};
    for (int part = 0; part < 3; ++part) {
      std::vector<double> a, r;
      for (size_t row = 0; row < BT; ++row)
        for (int k = 0; k < C; ++k) {
          const size_t i = row * 3 * C + size_t(part) * C + k;
          a.push_back(dq_b[i]);
          r.push_back(dq_r[i]);
        }
      EXPECT_LE(rel_err(a, r), kBwd) << names[part];
    }
    EXPECT_EQ(dead_nonzero, 0u) << "output elements of rows that see no key are not 0";
  }

  std::vector<void*> allocs_;
};

// ---- the kernels --------------------------------------------------------------------------------------

// sdpa_rows_bf16: dst = live ? src : 0 by each sequence's first unmasked key, into a copy and in place
TEST_F(CudnnBf16, RowsKernelMatchesCpu) {
  const int B = 3, T = 37, C = 24;
  const size_t n = size_t(B) * T * C;
  const VI first = {0, 5, T};  // sequence 2: every key masked
  const VB src = to_bits(randn_bf16(n, 11));
  for (bool causal : {false, true}) {
    VB want(n);
    for (size_t i = 0; i < n; ++i) {
      const int b = int(i / (size_t(T) * C)), t = int((i / C) % T);
      const bool live = first[b] <= (causal ? t : T - 1);
      want[i] = live ? src[i] : bits(0.f);
    }
    const int32_t* gf = put(first);
    uint16_t* gs = put(src);
    uint16_t* gd = nanb(n);
    ASSERT_EQ(nlp::kern::sdpa_rows_bf16(gd, gs, gf, causal, B, T, C, stream()), cudaSuccess);
    EXPECT_EQ(get(gd, n), want) << "copy, causal=" << causal;
    ASSERT_EQ(nlp::kern::sdpa_rows_bf16(gs, gs, gf, causal, B, T, C, stream()), cudaSuccess);
    EXPECT_EQ(get(gs, n), want) << "in place, causal=" << causal;
    ASSERT_EQ(nlp::kern::sdpa_rows_bf16(gd, put(src), nullptr, causal, B, T, C, stream()), cudaSuccess);
    EXPECT_EQ(get(gd, n), src) << "no mask: a copy";
  }
}

// sdpa_tokens_bf16: write (live ? src : 0) and accumulate (bf16(dst + src) where live), with a
// segment mask and without
TEST_F(CudnnBf16, TokensKernelMatchesCpu) {
  const size_t tokens = 301;
  const int W = 40;
  const size_t n = tokens * W;
  VI mask(tokens);
  for (size_t t = 0; t < tokens; ++t) mask[t] = t % 7 == 3 ? 0 : int32_t(1 + t / 50);
  const VF a = randn_bf16(n, 21), b = randn_bf16(n, 22);
  const VB ab = to_bits(a), bb = to_bits(b);
  for (bool masked : {true, false}) {
    VB write(n), acc(n);
    for (size_t i = 0; i < n; ++i) {
      const bool live = !masked || mask[i / W] != 0;
      write[i] = live ? bb[i] : bits(0.f);
      acc[i] = live ? bits(float(double(a[i]) + b[i])) : ab[i];
    }
    const int32_t* gm = masked ? put(mask) : nullptr;
    uint16_t* gd = nanb(n);
    ASSERT_EQ(nlp::kern::sdpa_tokens_bf16(gd, put(bb), gm, tokens, W, false, stream()), cudaSuccess);
    EXPECT_EQ(get(gd, n), write) << "write, masked=" << masked;
    uint16_t* gi = put(bb);
    ASSERT_EQ(nlp::kern::sdpa_tokens_bf16(gi, gi, gm, tokens, W, false, stream()), cudaSuccess);
    EXPECT_EQ(get(gi, n), write) << "write in place, masked=" << masked;
    uint16_t* ga = put(ab);
    ASSERT_EQ(nlp::kern::sdpa_tokens_bf16(ga, put(bb), gm, tokens, W, true, stream()), cudaSuccess);
    EXPECT_EQ(get(ga, n), acc) << "accumulate, masked=" << masked;
  }
}

// ---- attention ----------------------------------------------------------------------------------------

TEST_F(CudnnBf16, CausalGpt2LikeHeads) {
  Case c;
  c.s = {2, 256, 4, 64};
  c.causal = true;
  check(c, true, "causal");
  c.s = {3, 77, 2, 64};  // T not a multiple of the tile
  c.causal = false;
  c.seed = 5;
  check(c, true, "plain");
}

TEST_F(CudnnBf16, KeyPaddingMask) {
  Case c;
  c.s = {3, 96, 2, 64};
  VI mask(c.s.BT(), 1);
  for (int t = 50; t < 96; ++t) mask[96 + t] = 0;     // sequence 1: right padding
  for (int t = 0; t < 96; ++t) mask[2 * 96 + t] = 0;  // sequence 2: every key masked
  c.mask = &mask;
  check(c, true, "key mask");
  Case l;  // causal with left padding: the first query rows of sequence 1 see no key
  l.s = {2, 64, 2, 64};
  l.causal = true;
  VI left(l.s.BT(), 1);
  for (int t = 0; t < 10; ++t) left[64 + t] = 0;
  l.mask = &left;
  l.seed = 9;
  check(l, true, "left padding, causal");
}

// Segment ids: row 0 holds one example and padding, row 1 one full example (examples == B: in place)
TEST_F(CudnnBf16, PackedRowsRaggedInPlace) {
  PackedLayout forced("ragged");
  Case c;
  c.s = {2, 128, 4, 64};
  VI seg(c.s.BT(), 0);
  for (int t = 0; t < 100; ++t) seg[t] = 1;
  for (int t = 0; t < 128; ++t) seg[128 + t] = 2;
  c.mask = &seg;
  c.packed = true;
  c.examples = 2;
  c.ragged_rule = true;
  long r0, b0, r1, b1;
  nlp::cuda::cudnn_packed_calls(&r0, &b0);
  for (bool causal : {false, true}) {
    c.causal = causal;
    check(c, true, "ragged in place");
  }
  nlp::cuda::cudnn_packed_calls(&r1, &b1);
  // per check: the fp32-I/O forward and backward, the bf16-I/O forward and two backwards
  EXPECT_EQ(r1 - r0, 2 * 5) << "packed calls in the ragged layout";
  EXPECT_EQ(b1 - b0, 0) << "packed calls in the bias layout";
}

// More examples than rows: the ragged layout's staged copies; and the same rows in the bias layout
TEST_F(CudnnBf16, PackedRowsMoreExamplesThanRows) {
  Case c;
  c.s = {2, 128, 2, 64};
  VI seg(c.s.BT(), 0);
  for (int t = 0; t < 40; ++t) seg[t] = 1;
  for (int t = 40; t < 90; ++t) seg[t] = 2;  // row 0: two examples, then padding
  for (int t = 0; t < 7; ++t) seg[128 + t] = 3;
  for (int t = 7; t < 128; ++t) seg[128 + t] = 4;  // row 1: two examples, no padding
  c.mask = &seg;
  c.packed = true;
  c.examples = 4;
  for (bool causal : {false, true}) {
    c.causal = causal;
    {
      PackedLayout forced("ragged");
      c.ragged_rule = true;
      check(c, true, "ragged staged");
    }
    {
      PackedLayout forced("bias");
      c.ragged_rule = false;
      check(c, true, "bias layout");
    }
  }
}

// Dropout with the seed in device memory: the same mask as the fp32-I/O path given that seed directly
// (bitwise forward), and a mask really applied (the output differs from dropout 0's)
TEST_F(CudnnBf16, DropoutFromSeedSlotMatchesFp32Io) {
  Case c;
  c.s = {2, 128, 4, 64};
  c.causal = true;
  c.dropout = 0.1f;
  c.seed = 31;
  check(c, false, "dropout");
  const size_t nout = c.s.BT() * c.s.C(), nqkv = 3 * nout;
  const int R = c.s.B;
  uint16_t* q16 = put(to_bits(randn_bf16(nqkv, c.seed)));
  uint16_t* with = nanb(nout);
  uint16_t* without = nanb(nout);
  uint64_t* slot = put(std::vector<uint64_t>{c.seed + 77});
  att().forward_bf16(with, nanf(nlp::cuda::sdpa_saved_floats_bf16(R, c.s.T, c.s.NH, c.s.HS)), q16,
                     nullptr, false, 0, true, 0.1f, 0, slot, c.s.B, c.s.T, c.s.NH, c.s.HS);
  att().forward_bf16(without, nanf(nlp::cuda::sdpa_saved_floats_bf16(R, c.s.T, c.s.NH, c.s.HS)),
                     q16, nullptr, false, 0, true, 0.f, 0, nullptr, c.s.B, c.s.T, c.s.NH, c.s.HS);
  EXPECT_NE(get(with, nout), get(without, nout)) << "dropout 0.1 left the output unchanged";
}

// The CUDA backend's attention ops on bf16 views (NLPTRAIN_CUDA_BF16_ACTS native, the default) with
// fused attention: sized with act = BF16 as the bf16-I/O entry points; the output bitwise equal to
// the fp32 views' (whose cuDNN O is bf16 too); dqkv marked overwrite (NaN before) within 1 bf16 ulp of
// the gradient the fp32 views add to zeros; dqkv not marked: prior + that gradient within 1 ulp.
TEST_F(CudnnBf16, BackendBf16ViewsTakeTheNativePath) {
  const char* env = std::getenv("NLPTRAIN_CUDA_BF16_ACTS");
  if (env && std::string(env) == "staged") GTEST_SKIP() << "NLPTRAIN_CUDA_BF16_ACTS=staged";
  nlp::BackendOptions o;
  o.precision = nlp::Precision::Bf16;
  o.fused_attention = true;
  std::unique_ptr<nlp::Backend> be = nlp::make_cuda_backend(0, o);
  const Shape s{2, 128, 4, 64};
  const int B = s.B, T = s.T, NH = s.NH, HS = s.HS;
  const size_t nout = s.BT() * s.C(), nqkv = 3 * nout;
  const auto BF16 = nlp::DType::BF16;
  EXPECT_EQ(be->attention_saved_floats(B, T, NH, HS, BF16), nlp::cuda::sdpa_saved_floats_bf16(B, T, NH, HS));
  EXPECT_EQ(be->attention_scratch_floats(B, T, NH, HS, BF16),
            nlp::cuda::sdpa_scratch_floats_bf16(B, T, NH, HS));
  std::vector<void*> mem;
  auto dev = [&](const void* h, size_t bytes) {
    void* p = be->alloc(bytes);
    mem.push_back(p);
    be->to_device(p, h, bytes);
    return p;
  };
  auto host = [&](const void* p, size_t bytes) {
    std::vector<char> h(bytes);
    be->to_host(h.data(), p, bytes);
    return h;
  };
  const VF qkv = randn_bf16(nqkv, 41), dout = randn_bf16(nout, 42), prior = randn_bf16(nqkv, 43);
  const VF nan32(std::max(nqkv, be->attention_saved_floats(B, T, NH, HS, nlp::DType::F32)),
                 std::numeric_limits<float>::quiet_NaN());
  const VB nan16(nqkv, uint16_t(0x7fc0));
  const VF zeros(nqkv, 0.f);

  // fp32 views
  float* q32 = static_cast<float*>(dev(qkv.data(), nqkv * 4));
  float* out32 = static_cast<float*>(dev(nan32.data(), nout * 4));
  float* att32 = static_cast<float*>(dev(nan32.data(), be->attention_saved_floats(B, T, NH, HS) * 4));
  float* scr32 = static_cast<float*>(be->alloc(be->attention_scratch_floats(B, T, NH, HS) * 4));
  mem.push_back(scr32);
  float* dq32 = static_cast<float*>(dev(zeros.data(), nqkv * 4));
  be->attention_forward(out32, att32, q32, nullptr, true, 0.f, 0, B, T, NH, HS);
  be->attention_backward(dq32, scr32, static_cast<float*>(dev(dout.data(), nout * 4)), out32, q32,
                         att32, nullptr, true, 0.f, 0, B, T, NH, HS);
  VF out_f(nout), dq_f(nqkv);
  be->to_host(out_f.data(), out32, nout * 4);
  be->to_host(dq_f.data(), dq32, nqkv * 4);

  // bf16 views
  const VB qb = to_bits(qkv), db = to_bits(dout), pb = to_bits(prior);
  void* q16 = dev(qb.data(), nqkv * 2);
  void* out16 = dev(nan16.data(), nout * 2);
  float* att16 = static_cast<float*>(dev(nan32.data(), be->attention_saved_floats(B, T, NH, HS, BF16) * 4));
  float* scr16 = static_cast<float*>(be->alloc(be->attention_scratch_floats(B, T, NH, HS, BF16) * 4));
  mem.push_back(scr16);
  void* d16 = dev(db.data(), nout * 2);
  void* dq16 = dev(nan16.data(), nqkv * 2);
  void* acc16 = dev(pb.data(), nqkv * 2);
  be->attention_forward(nlp::Act(out16, BF16), att16, nlp::CAct(q16, BF16), nullptr, true, 0.f, 0, B,
                        T, NH, HS);
  be->attention_backward(nlp::overwrite(nlp::Act(dq16, BF16)), scr16, nlp::CAct(d16, BF16),
                         nlp::CAct(out16, BF16), nlp::CAct(q16, BF16), att16, nullptr, true, 0.f, 0, B,
                         T, NH, HS);
  be->attention_backward(nlp::Act(acc16, BF16), scr16, nlp::CAct(d16, BF16), nlp::CAct(out16, BF16),
                         nlp::CAct(q16, BF16), att16, nullptr, true, 0.f, 0, B, T, NH, HS);
  VB out_h(nout), dq_h(nqkv), acc_h(nqkv);
  std::memcpy(out_h.data(), host(out16, nout * 2).data(), nout * 2);
  std::memcpy(dq_h.data(), host(dq16, nqkv * 2).data(), nqkv * 2);
  std::memcpy(acc_h.data(), host(acc16, nqkv * 2).data(), nqkv * 2);
  const VF out_b = to_values(out_h), dq_b = to_values(dq_h), acc_b = to_values(acc_h);

  size_t out_diff = 0, dq_far = 0, acc_far = 0;
  for (size_t i = 0; i < nout; ++i) out_diff += !(out_b[i] == out_f[i]);
  for (size_t i = 0; i < nqkv; ++i) {
    dq_far += !(std::fabs(double(dq_b[i]) - dq_f[i]) <=
                ulp(std::max(std::fabs(double(dq_b[i])), std::fabs(double(dq_f[i])))));
    const double want = nlp::cpu::round_bf16(float(double(prior[i]) + dq_f[i]));
    acc_far += !(std::fabs(acc_b[i] - want) <= ulp(want));
  }
  EXPECT_EQ(out_diff, 0u) << "output elements not bitwise equal to the fp32 views'";
  EXPECT_EQ(dq_far, 0u) << "overwritten dqkv: elements more than 1 bf16 ulp from the fp32 views'";
  EXPECT_EQ(acc_far, 0u) << "accumulated dqkv: elements more than 1 bf16 ulp from prior + gradient";
  // the backward reads O from the `out` it is handed: without it, or with an fp32 one, it refuses
  // (the stats-only state cannot go to the fp32 path)
  EXPECT_THROW(be->attention_backward(nlp::Act(acc16, BF16), scr16, nlp::CAct(d16, BF16), nullptr,
                                      nlp::CAct(q16, BF16), att16, nullptr, true, 0.f, 0, B, T, NH, HS),
               nlp::Error);
  EXPECT_THROW(be->attention_backward(nlp::Act(acc16, BF16), scr16, nlp::CAct(d16, BF16), out32,
                                      nlp::CAct(q16, BF16), att16, nullptr, true, 0.f, 0, B, T, NH, HS),
               nlp::Error);
  for (void* p : mem) be->release(p);
  be->synchronize();
}

}  // namespace

#else

TEST(CudnnBf16, Skipped) { GTEST_SKIP() << "built without CUDA: no cuDNN attention to test"; }

#endif  // NLPTRAIN_HAVE_CUDA

// The saved state of a bf16-I/O call is the stats alone and its scratch one bf16 dO: at GPT-2 124M's
// B=16, T=1024, NH=12, HS=64 (a CPU check of attention_cudnn.h's arithmetic; needs a CUDA build)
TEST(CudnnBf16Sizes, StatsOnlySavedStateAndDoScratch) {
#if defined(NLPTRAIN_HAVE_CUDA)
  const int B = 16, T = 1024, NH = 12, HS = 64;
  // stats: B*NH*T fp32 = 196608 floats, + 256 bytes of base alignment slack = 64 floats
  EXPECT_EQ(nlp::cuda::sdpa_saved_floats_bf16(B, T, NH, HS), 196608u + 64u);
  // dO: B*T*C bf16 = 12582912 bytes = 6291456 floats, + 64 floats of slack
  EXPECT_EQ(nlp::cuda::sdpa_scratch_floats_bf16(B, T, NH, HS), 6291456u + 64u);
  // the fp32-I/O path keeps stats, O and q|k|v (bf16 copies) and needs dO and dq|dk|dv as scratch
  EXPECT_EQ(nlp::cuda::sdpa_saved_floats(B, T, NH, HS), 196608u + 6291456u + 18874368u + 64u);
  EXPECT_EQ(nlp::cuda::sdpa_scratch_floats(B, T, NH, HS), 6291456u + 18874368u + 64u);
#else
  GTEST_SKIP() << "built without CUDA: attention_cudnn.h is not compiled";
#endif
}
