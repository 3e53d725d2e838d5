// The bf16-storage CUDA kernels (kernels/kernels.cuh, "bf16 storage": kernels/bf16_*.cu) against a
// CPU reference in double computed from the same bf16 inputs, launcher by launcher.
//  - Inputs are random bf16 values (fp32 normals rounded to nearest even); fp32 weights and tables are
//    plain fp32 normals. The reference of each output element is its exact value in double and a
//    magnitude: the sum of the absolute values of the terms that fp32 arithmetic adds up for it.
//  - Tolerance of each element: |got - ref| <= rel * |ref| + arel * magnitude, stated per check:
//      kStoreRel  2^-8 * 1.01   a bf16 store: rounding to nearest even is within half an ulp, which is
//                               at most 2^-8 of the value; the 1% covers the fp32 result's own error
//      kArith     1e-5          fp32 arithmetic before the store (a few ulps of 2^-24 of each term,
//                               and sums of up to ~40 terms in sequence), over the magnitude
//      kStat      1e-6          layer norm's mean and rstd (double sums, one fp32 rounding each)
//    A kernel that loses a term (no accumulation, no bias, wrong mask, wrong row) misses these by
//    orders of magnitude; one that skips an element leaves the NaN the output was filled with.
//  - Exact checks where the result is one correctly rounded fp32 operation then a bf16 rounding, or
//    a copy: gather / scatter rows, the fp32 -> bf16 store, the residual sum; the embedding backward
//    equals the fp32 launcher on the same (widened) values bit for bit, and so do dropout masks.
//  - Every case runs twice: 16-byte aligned arrays with n not a multiple of 8 (the 8-wide vector path
//    and its scalar tail), and arrays offset by one element (the scalar path).
//  - Outputs with accumulate = false start filled with NaN: the kernel must not read them.
//  - Through the CUDA backend (CudaBf16Backend): the ops on all-bf16 views with the native kernels
//    (NLPTRAIN_CUDA_BF16_ACTS=native) against the staged fp32 ops (=staged), which round at the same
//    points: bit for bit where both are the same correctly rounded fp32 operations then one bf16
//    rounding (add, accumulate, scale, dropout, rows, embeddings, the residual sum); elsewhere (GELU,
//    layer norm) within one bf16 ulp of each element, 2^-7 of it, plus 1e-4 of the output's RMS
//    (fp32 sums in another order); layer norm's fp32 statistics within 1e-6 and dw, db within 1e-5.
//  - Without a CUDA device (or in a build without CUDA) every test is skipped with the reason.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <cstdlib>
#include <limits>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "backend/cpu/round.h"
#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/device.h"
#include "core/backend.h"
#include "core/rng.h"
#include "core/tensor.h"

#if NLPTRAIN_HAVE_CUDA
#include <cuda_runtime_api.h>

#include "kernels.cuh"  // kernels/ (an include directory of CUDA builds)

namespace {

namespace kern = nlp::kern;
using VB = std::vector<uint16_t>;  // bf16 bit patterns
using VF = std::vector<float>;
using VD = std::vector<double>;
using VI = std::vector<int32_t>;

constexpr double kStoreRel = 1.01 / 256.0;
constexpr double kArith = 1e-5;
constexpr double kStat = 1e-6;
constexpr uint16_t kNanBits = 0x7fc0;
constexpr double kPi = 3.14159265358979323846;

float bf(uint16_t b) {
  const uint32_t u = uint32_t(b) << 16;
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}
uint16_t to_bits(float f) { return nlp::cpu::to_bf16_bits(f); }

VB rand_bf(size_t n, uint64_t seed, float sd = 1.0f, float shift = 0.0f) {
  nlp::Rng r(seed);
  VB v(n);
  for (auto& x : v) {
    do x = to_bits(shift + sd * r.normal());
    while (bf(x) == 0.0f);  // non-zero: dropout's zeros are then its mask
  }
  return v;
}
VF randn(size_t n, uint64_t seed, float sd = 1.0f) {
  nlp::Rng r(seed);
  VF v(n);
  for (auto& x : v) x = sd * r.normal();
  return v;
}
VI randi(size_t n, uint64_t seed, int lo, int hi) {  // [lo, hi)
  nlp::Rng r(seed);
  VI v(n);
  for (auto& x : v) x = lo + int32_t(r.next_u64() % uint64_t(hi - lo));
  return v;
}

// The reference of an output: exact values and the magnitude of the terms behind each.
struct Ref {
  VD v, mag;
  explicit Ref(size_t n = 0) : v(n, 0.0), mag(n, 0.0) {}
};

// Every element within rel * |ref| + arel * mag; the first failures are named.
template <typename Get>
::testing::AssertionResult within(size_t n, Get got, const Ref& ref, double rel, double arel) {
  if (ref.v.size() != n) return ::testing::AssertionFailure() << "size " << n << " vs " << ref.v.size();
  size_t bad = 0;
  std::string first;
  for (size_t i = 0; i < n; ++i) {
    const double g = got(i), tol = rel * std::fabs(ref.v[i]) + arel * ref.mag[i];
    if (std::isfinite(g) && std::fabs(g - ref.v[i]) <= tol) continue;
    if (bad++ < 5)
      first += " [" + std::to_string(i) + "] got " + std::to_string(g) + " want " +
               std::to_string(ref.v[i]) + " tol " + std::to_string(tol) + ";";
  }
  if (!bad) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << bad << " of " << n << " elements off:" << first;
}
::testing::AssertionResult within(const VB& got, const Ref& ref, double rel, double arel) {
  return within(got.size(), [&](size_t i) { return double(bf(got[i])); }, ref, rel, arel);
}
::testing::AssertionResult within(const VF& got, const Ref& ref, double rel, double arel) {
  return within(got.size(), [&](size_t i) { return double(got[i]); }, ref, rel, arel);
}

template <typename T>
::testing::AssertionResult bits_equal(const std::vector<T>& got, const std::vector<T>& want) {
  if (got.size() != want.size()) return ::testing::AssertionFailure() << "sizes differ";
  for (size_t i = 0; i < got.size(); ++i)
    if (std::memcmp(&got[i], &want[i], sizeof(T)) != 0)
      return ::testing::AssertionFailure() << "first difference at " << i;
  return ::testing::AssertionSuccess();
}

// The dropout mask key of element i (kernels/common.cuh drop_key) and its keep decision.
struct Mask {
  float p = 0.0f;
  uint64_t seed = 0;
  size_t row = 0, row_key = 0;
  const int32_t* token_key_host = nullptr;  // the host copy of the token keys (packed rows)
  size_t width = 0;
  bool keep(size_t i) const {
    const uint64_t key = token_key_host ? uint64_t(token_key_host[i / width]) * width + i % width
                                        : nlp::keyed_index(i, row, row_key);
    return nlp::uniform01(seed, key) >= p;
  }
  double scale() const { return p < 1.0f ? double(1.0f / (1.0f - p)) : 0.0; }
};

// The two layouts every elementwise case runs in: offset 0 (aligned: vector path and a tail) or 1
// element (scalar path).
constexpr size_t kOffsets[] = {0, 1};
constexpr size_t kN = 8 * 517 + 5;

class CudaBf16Kernels : public ::testing::Test {
 protected:
  void SetUp() override {
    static std::string why;
    static const int n = nlp::cuda_device_count(&why);
    if (n == 0) GTEST_SKIP() << "no usable CUDA device: " << why;
  }
  void TearDown() override {
    for (void* p : bufs_) cudaFree(p);
    bufs_.clear();
  }

  // Device copies of host arrays, `off` elements past a 256-byte aligned allocation.
  template <typename T>
  T* put(const std::vector<T>& h, size_t off = 0) {
    void* p = nullptr;
    EXPECT_EQ(cudaMalloc(&p, (h.size() + off + 8) * sizeof(T)), cudaSuccess);
    bufs_.push_back(p);
    T* d = static_cast<T*>(p) + off;
    EXPECT_EQ(cudaMemcpy(d, h.data(), h.size() * sizeof(T), cudaMemcpyHostToDevice), cudaSuccess);
    return d;
  }
  template <typename T>
  std::vector<T> get(const T* d, size_t n) {
    EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    std::vector<T> h(n);
    EXPECT_EQ(cudaMemcpy(h.data(), d, n * sizeof(T), cudaMemcpyDeviceToHost), cudaSuccess);
    return h;
  }
  VB get_bf(const void* d, size_t n) { return get(static_cast<const uint16_t*>(d), n); }
  uint16_t* nan_bf(size_t n, size_t off = 0) { return put(VB(n, kNanBits), off); }
  float* nan_f(size_t n) { return put(VF(n, std::numeric_limits<float>::quiet_NaN())); }

  std::vector<void*> bufs_;
};

#define LAUNCH(call) ASSERT_EQ((call), cudaSuccess) << #call

// ==================================================================================================
// GELU
// ==================================================================================================

double gelu_ref(double x, bool tanh_form) {
  if (tanh_form) {
    const double u = std::sqrt(2.0 / kPi) * (x + 0.044715 * x * x * x);
    return 0.5 * x * (1.0 + std::tanh(u));
  }
  return 0.5 * x * (1.0 + std::erf(x / std::sqrt(2.0)));
}
double gelu_grad_ref(double x, bool tanh_form) {
  if (tanh_form) {
    const double k = std::sqrt(2.0 / kPi), t = std::tanh(k * (x + 0.044715 * x * x * x));
    return 0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * k * (1.0 + 3.0 * 0.044715 * x * x);
  }
  return 0.5 * (1.0 + std::erf(x / std::sqrt(2.0))) + x * std::exp(-0.5 * x * x) / std::sqrt(2.0 * kPi);
}
// the magnitude of gelu'(x)'s terms (each bounded by the absolute values below)
double gelu_grad_mag(double x, bool tanh_form) {
  const double a = std::fabs(x);
  return tanh_form ? 1.0 + a * (1.0 + 0.134145 * a * a) : 1.0 + 0.4 * a;
}

TEST_F(CudaBf16Kernels, GeluForwardBackward) {
  uint64_t seed = 10;
  for (size_t off : kOffsets)
    for (bool tanh_form : {true, false})
      for (bool acc : {true, false}) {
        SCOPED_TRACE(testing::Message() << "offset " << off << (tanh_form ? " tanh" : " erf")
                                        << (acc ? " accumulate" : " write"));
        const size_t n = kN;
        const VB x = rand_bf(n, ++seed, 2.5f), dy = rand_bf(n, ++seed), d0 = rand_bf(n, ++seed);
        Ref fwd(n), bwd(n);
        for (size_t i = 0; i < n; ++i) {
          const double xv = bf(x[i]);
          fwd.v[i] = gelu_ref(xv, tanh_form);
          fwd.mag[i] = std::fabs(xv);
          bwd.v[i] = (acc ? bf(d0[i]) : 0.0) + gelu_grad_ref(xv, tanh_form) * bf(dy[i]);
          bwd.mag[i] = (acc ? std::fabs(bf(d0[i])) : 0.0) + gelu_grad_mag(xv, tanh_form) * std::fabs(bf(dy[i]));
        }
        uint16_t *gx = put(x, off), *gy = nan_bf(n, off);
        LAUNCH(kern::gelu_forward_bf16(gy, gx, n, tanh_form, 0));
        EXPECT_TRUE(within(get_bf(gy, n), fwd, kStoreRel, kArith)) << "forward";
        uint16_t* gd = acc ? put(d0, off) : nan_bf(n, off);
        LAUNCH(kern::gelu_backward_bf16(gd, acc, gx, put(dy, off), n, tanh_form, 0));
        EXPECT_TRUE(within(get_bf(gd, n), bwd, kStoreRel, kArith)) << "backward";
      }
}

// ==================================================================================================
// add, accumulate, scale, fp32 -> bf16 stores
// ==================================================================================================

TEST_F(CudaBf16Kernels, AddAccumulateScale) {
  uint64_t seed = 30;
  for (size_t off : kOffsets) {
    SCOPED_TRACE(testing::Message() << "offset " << off);
    const size_t n = kN;
    const VB a = rand_bf(n, ++seed), b = rand_bf(n, ++seed, 3.0f);
    Ref sum(n), scaled(n);
    const float f = 0.37f;
    for (size_t i = 0; i < n; ++i) {
      sum.v[i] = double(bf(a[i])) + bf(b[i]);
      sum.mag[i] = std::fabs(bf(a[i])) + std::fabs(bf(b[i]));
      scaled.v[i] = double(bf(a[i])) * f;
      scaled.mag[i] = std::fabs(scaled.v[i]);
    }
    uint16_t *ga = put(a, off), *gb = put(b, off), *go = nan_bf(n, off);
    LAUNCH(kern::add_bf16(go, ga, gb, n, 0));
    EXPECT_TRUE(within(get_bf(go, n), sum, kStoreRel, kArith)) << "add";
    // out aliasing either operand, as the blocks call it
    LAUNCH(kern::add_bf16(ga, ga, gb, n, 0));
    EXPECT_TRUE(within(get_bf(ga, n), sum, kStoreRel, kArith)) << "add, out = a";
    uint16_t* ga2 = put(a, off);
    LAUNCH(kern::add_bf16(gb, ga2, gb, n, 0));
    EXPECT_TRUE(within(get_bf(gb, n), sum, kStoreRel, kArith)) << "add, out = b";

    uint16_t *gd = put(a, off), *gs = put(b, off);
    LAUNCH(kern::accumulate_bf16_bf16(gd, gs, n, 0));
    EXPECT_TRUE(within(get_bf(gd, n), sum, kStoreRel, kArith)) << "accumulate";

    uint16_t* gx = put(a, off);
    LAUNCH(kern::scale_bf16(gx, f, n, 0));
    EXPECT_TRUE(within(get_bf(gx, n), scaled, kStoreRel, kArith)) << "scale";
  }
}

TEST_F(CudaBf16Kernels, Fp32ToBf16Stores) {
  uint64_t seed = 50;
  for (size_t off : kOffsets) {
    SCOPED_TRACE(testing::Message() << "offset " << off);
    const size_t n = kN;
    const VF src = randn(n, ++seed, 4.0f);
    const VB d0 = rand_bf(n, ++seed);
    // write: exactly the host's round to nearest even of each value
    VB want(n);
    for (size_t i = 0; i < n; ++i) want[i] = to_bits(src[i]);
    float* gs = put(src, off);
    uint16_t* gd = nan_bf(n, off);
    LAUNCH(kern::store_f32_bf16(gd, false, gs, n, 0));
    EXPECT_TRUE(bits_equal(get_bf(gd, n), want)) << "store";
    // accumulate: dst + src, rounded once
    Ref acc(n);
    for (size_t i = 0; i < n; ++i) {
      acc.v[i] = double(bf(d0[i])) + src[i];
      acc.mag[i] = std::fabs(bf(d0[i])) + std::fabs(src[i]);
    }
    uint16_t* ga = put(d0, off);
    LAUNCH(kern::store_f32_bf16(ga, true, gs, n, 0));
    EXPECT_TRUE(within(get_bf(ga, n), acc, kStoreRel, kArith)) << "store, accumulate";
    uint16_t* gb = put(d0, off);
    LAUNCH(kern::accumulate_f32_into_bf16(gb, gs, n, 0));
    EXPECT_TRUE(within(get_bf(gb, n), acc, kStoreRel, kArith)) << "accumulate_f32_into_bf16";
  }
}

// ==================================================================================================
// dropout
// ==================================================================================================

// Forward and backward with p > 0 for flat, trimmed (row-keyed) and packed (token-keyed) masks:
// values against the reference, and the mask (which elements are zero) equal to the fp32 kernels'
// on the same values widened to fp32. The seed read from a device slot gives the same mask.
TEST_F(CudaBf16Kernels, Dropout) {
  const int B = 3, T = 37, Tk = 48, C = 40;
  const size_t n = size_t(B) * T * C;
  VI tok(size_t(B) * T);
  for (size_t i = 0; i < tok.size(); ++i) tok[i] = int32_t((i * 7) % (B * Tk));
  const int32_t* gtok = put(tok);
  uint64_t seed = 70;
  for (size_t off : kOffsets)
    for (int layout = 0; layout < 3; ++layout)
      for (float p : {0.1f, 0.5f})
        for (bool acc : {true, false}) {
          SCOPED_TRACE(testing::Message() << "offset " << off << " layout " << layout << " p " << p
                                          << (acc ? " accumulate" : " write"));
          Mask m;
          m.p = p;
          m.seed = nlp::derive_seed(++seed, 3, 1);
          if (layout == 1) m.row = size_t(T) * C, m.row_key = size_t(Tk) * C;
          if (layout == 2) m.token_key_host = tok.data(), m.width = C;
          const int32_t* dtok = layout == 2 ? gtok : nullptr;
          const VB x = rand_bf(n, ++seed), dy = rand_bf(n, ++seed), d0 = rand_bf(n, ++seed);
          Ref fwd(n), bwd(n);
          for (size_t i = 0; i < n; ++i) {
            const bool k = m.keep(i);
            fwd.v[i] = k ? double(bf(x[i])) * m.scale() : 0.0;
            fwd.mag[i] = std::fabs(fwd.v[i]);
            const double g = k ? double(bf(dy[i])) * m.scale() : 0.0;
            bwd.v[i] = (acc ? bf(d0[i]) : 0.0) + g;
            bwd.mag[i] = (acc ? std::fabs(bf(d0[i])) : 0.0) + std::fabs(g);
          }
          uint16_t *gx = put(x, off), *gy = nan_bf(n, off);
          LAUNCH(kern::dropout_forward_bf16(gy, gx, n, p, m.seed, nullptr, m.row, m.row_key, dtok,
                                            m.width, 0));
          const VB y = get_bf(gy, n);
          EXPECT_TRUE(within(y, fwd, kStoreRel, kArith)) << "forward";
          // the fp32 kernel's mask on the same values
          VF xf(n), dyf(n);
          for (size_t i = 0; i < n; ++i) xf[i] = bf(x[i]), dyf[i] = bf(dy[i]);
          float* gy32 = nan_f(n);
          LAUNCH(kern::dropout_forward(gy32, put(xf), n, p, m.seed, nullptr, m.row, m.row_key, dtok,
                                       m.width, 0));
          const VF y32 = get(gy32, n);
          size_t differ = 0, dropped = 0;
          for (size_t i = 0; i < n; ++i) {
            differ += (bf(y[i]) == 0.0f) != (y32[i] == 0.0f);
            dropped += y32[i] == 0.0f;
          }
          EXPECT_EQ(differ, 0u) << "forward mask against the fp32 kernel's";
          EXPECT_NEAR(double(dropped) / n, p, 0.05) << "dropped fraction";
          // the seed from a device slot (the argument then ignored)
          uint64_t* slot = put(std::vector<uint64_t>{m.seed});
          uint16_t* gz = nan_bf(n, off);
          LAUNCH(kern::dropout_forward_bf16(gz, gx, n, p, m.seed + 1, slot, m.row, m.row_key, dtok,
                                            m.width, 0));
          EXPECT_TRUE(bits_equal(get_bf(gz, n), y)) << "seed slot";
          // out aliasing inp
          LAUNCH(kern::dropout_forward_bf16(gx, gx, n, p, m.seed, nullptr, m.row, m.row_key, dtok,
                                            m.width, 0));
          EXPECT_TRUE(bits_equal(get_bf(gx, n), y)) << "in place";

          uint16_t* gd = acc ? put(d0, off) : nan_bf(n, off);
          LAUNCH(kern::dropout_backward_bf16(gd, acc, put(dy, off), n, p, m.seed, nullptr, m.row,
                                             m.row_key, dtok, m.width, 0));
          const VB d = get_bf(gd, n);
          EXPECT_TRUE(within(d, bwd, kStoreRel, kArith)) << "backward";
          float* gd32 = put(VF(n, 0.0f));
          LAUNCH(kern::dropout_backward(gd32, put(dyf), n, p, m.seed, nullptr, m.row, m.row_key,
                                        dtok, m.width, 0));
          const VF d32 = get(gd32, n);
          if (!acc) {
            differ = 0;
            for (size_t i = 0; i < n; ++i) differ += (bf(d[i]) == 0.0f) != (d32[i] == 0.0f);
            EXPECT_EQ(differ, 0u) << "backward mask against the fp32 kernel's";
          }
          differ = 0;
          for (size_t i = 0; i < n; ++i) differ += (d32[i] == 0.0f) != (y32[i] == 0.0f);
          EXPECT_EQ(differ, 0u) << "the backward's mask is the forward's";
        }
}

// ==================================================================================================
// rows
// ==================================================================================================

// Gather is a copy (bit for bit); scatter adds each row into the distinct row it names (accumulate),
// or writes it over (write: the other rows keep their bits). C a multiple of 8 with aligned arrays:
// the vector path; C = 36 or offset 1: the scalar one. With and without an index.
TEST_F(CudaBf16Kernels, RowsGatherScatter) {
  const int R = 64;  // rows of the strided operand
  uint64_t seed = 90;
  for (int C : {48, 36})
    for (size_t off : kOffsets)
      for (bool with_idx : {true, false})
        for (bool acc : {true, false}) {
          SCOPED_TRACE(testing::Message() << "C " << C << " offset " << off
                                          << (with_idx ? " idx" : " no idx")
                                          << (acc ? " accumulate" : " write"));
          const size_t stride = size_t(C) + 16;
          const int rows = 23;
          VI idx(rows);
          for (int i = 0; i < rows; ++i) idx[i] = (i * 11 + 5) % R;  // distinct
          const VB big = rand_bf(size_t(R) * stride, ++seed), small = rand_bf(size_t(rows) * C, ++seed);
          const int32_t* gidx = with_idx ? put(idx) : nullptr;
          const auto r_of = [&](int i) { return with_idx ? idx[i] : i; };
          VB want(size_t(rows) * C);
          for (int i = 0; i < rows; ++i)
            for (int c = 0; c < C; ++c) want[size_t(i) * C + c] = big[size_t(r_of(i)) * stride + c];
          uint16_t *gbig = put(big, off), *gout = nan_bf(want.size(), off);
          LAUNCH(kern::rows_gather_bf16(gout, gbig, rows, C, stride, gidx, 0));
          EXPECT_TRUE(bits_equal(get_bf(gout, want.size()), want)) << "gather";

          LAUNCH(kern::rows_scatter_add_bf16(gbig, acc, put(small, off), rows, C, stride, gidx, 0));
          const VB got = get_bf(gbig, big.size());
          Ref ref(big.size());
          VB untouched = big;  // the elements no row writes keep their bits
          for (size_t i = 0; i < big.size(); ++i) ref.v[i] = bf(big[i]), ref.mag[i] = std::fabs(ref.v[i]);
          for (int i = 0; i < rows; ++i)
            for (int c = 0; c < C; ++c) {
              const size_t j = size_t(r_of(i)) * stride + c;
              const double s = bf(small[size_t(i) * C + c]);
              ref.v[j] = (acc ? bf(big[j]) : 0.0) + s;
              ref.mag[j] = (acc ? std::fabs(bf(big[j])) : 0.0) + std::fabs(s);
              untouched[j] = got[j];
            }
          EXPECT_TRUE(within(got, ref, kStoreRel, kArith)) << "scatter";
          EXPECT_TRUE(bits_equal(got, untouched)) << "scatter wrote outside its rows";
          if (!acc) {
            size_t differ = 0;
            for (int i = 0; i < rows; ++i)
              for (int c = 0; c < C; ++c)
                differ += got[size_t(r_of(i)) * stride + c] != small[size_t(i) * C + c];
            EXPECT_EQ(differ, 0u) << "scatter (write) is a copy";
          }
        }
}

// ==================================================================================================
// layer norm
// ==================================================================================================

struct LnRef {
  VD mean, rstd;
};

LnRef ln_stats(const VB& x, int N, int C, double eps) {
  LnRef s{VD(N), VD(N)};
  for (int r = 0; r < N; ++r) {
    double m = 0, v = 0;
    for (int c = 0; c < C; ++c) m += bf(x[size_t(r) * C + c]);
    m /= C;
    for (int c = 0; c < C; ++c) {
      const double d = bf(x[size_t(r) * C + c]) - m;
      v += d * d;
    }
    s.mean[r] = m;
    s.rstd[r] = 1.0 / std::sqrt(v / C + eps);
  }
  return s;
}

// out = (x - mean) * rstd * w + b; its magnitude |xhat * w| + |b|
Ref ln_forward_ref(const VB& x, const LnRef& s, const VF& w, const VF& b, int N, int C) {
  Ref out(size_t(N) * C);
  for (int r = 0; r < N; ++r)
    for (int c = 0; c < C; ++c) {
      const size_t i = size_t(r) * C + c;
      const double xh = (bf(x[i]) - s.mean[r]) * s.rstd[r];
      out.v[i] = xh * w[c] + b[c];
      out.mag[i] = std::fabs(xh * w[c]) + std::fabs(b[c]);
    }
  return out;
}

Ref stats_ref(const VD& v) {
  Ref r(v.size());
  for (size_t i = 0; i < v.size(); ++i) r.v[i] = v[i], r.mag[i] = std::fabs(v[i]);
  return r;
}

// (The shapes: C = 96 with aligned arrays runs the 8-wide path; C = 33, or offset 1, the scalar one.)
TEST_F(CudaBf16Kernels, LayerNormForwardBackward) {
  const int shapes[][2] = {{67, 96}, {300, 768}, {5, 33}, {1, 1000}};
  const float eps = 1e-5f;
  uint64_t seed = 110;
  for (const auto& sh : shapes)
    for (size_t off : kOffsets)
      for (bool acc : {true, false}) {
        const int N = sh[0], C = sh[1];
        SCOPED_TRACE(testing::Message() << "N " << N << " C " << C << " offset " << off
                                        << (acc ? " accumulate" : " write"));
        const size_t n = size_t(N) * C;
        const VB x = rand_bf(n, ++seed, 2.0f, 3.0f);  // non-zero mean
        const VF w = randn(C, ++seed), b = randn(C, ++seed);
        const LnRef s = ln_stats(x, N, C, eps);
        uint16_t *gx = put(x, off), *go = nan_bf(n, off);
        float *gw = put(w), *gb = put(b), *gm = nan_f(N), *gr = nan_f(N);
        LAUNCH(kern::layernorm_forward_bf16(go, gm, gr, gx, gw, gb, N, C, eps, 0));
        EXPECT_TRUE(within(get_bf(go, n), ln_forward_ref(x, s, w, b, N, C), kStoreRel, kArith))
            << "out";
        EXPECT_TRUE(within(get(gm, N), stats_ref(s.mean), kStat, 0.0)) << "mean";
        EXPECT_TRUE(within(get(gr, N), stats_ref(s.rstd), kStat, 0.0)) << "rstd";

        // backward, from the reference statistics rounded to fp32 (its inputs), in double
        VF mean(N), rstd(N);
        for (int r = 0; r < N; ++r) mean[r] = float(s.mean[r]), rstd[r] = float(s.rstd[r]);
        const VB dy = rand_bf(n, ++seed), dx0 = rand_bf(n, ++seed);
        const VF dw0 = randn(C, ++seed), db0 = randn(C, ++seed);
        Ref dx(n), dw(C), db(C);
        for (int c = 0; c < C; ++c) dw.v[c] = dw.mag[c] = 0, db.v[c] = db.mag[c] = 0;
        for (int r = 0; r < N; ++r) {
          const double mu = mean[r], rs = rstd[r];
          double sg = 0, sgx = 0, ag = 0, agx = 0;
          for (int c = 0; c < C; ++c) {
            const size_t i = size_t(r) * C + c;
            const double g = double(bf(dy[i])) * w[c], xh = (bf(x[i]) - mu) * rs;
            sg += g, sgx += g * xh, ag += std::fabs(g), agx += std::fabs(g * xh);
          }
          sg /= C, sgx /= C, ag /= C, agx /= C;
          for (int c = 0; c < C; ++c) {
            const size_t i = size_t(r) * C + c;
            const double g = double(bf(dy[i])) * w[c], xh = (bf(x[i]) - mu) * rs;
            dx.v[i] = (acc ? bf(dx0[i]) : 0.0) + rs * (g - sg - xh * sgx);
            dx.mag[i] = (acc ? std::fabs(bf(dx0[i])) : 0.0) + rs * (std::fabs(g) + ag + std::fabs(xh) * agx);
            dw.v[c] += double(bf(dy[i])) * xh;
            dw.mag[c] += std::fabs(bf(dy[i])) * (std::fabs(xh) + 1.0);
            db.v[c] += bf(dy[i]);
            db.mag[c] += std::fabs(bf(dy[i]));
          }
        }
        for (int c = 0; c < C; ++c) {
          dw.v[c] += dw0[c], dw.mag[c] += std::fabs(dw0[c]);
          db.v[c] += db0[c], db.mag[c] += std::fabs(db0[c]);
        }
        std::vector<char> ws_host(kern::layernorm_backward_bf16_ws_bytes(N, C));
        void* ws = put(ws_host);
        uint16_t* gdx = acc ? put(dx0, off) : nan_bf(n, off);
        float *gdw = put(dw0), *gdb = put(db0);
        uint16_t* gdy = put(dy, off);
        gm = put(mean), gr = put(rstd);
        LAUNCH(kern::layernorm_backward_bf16(gdx, acc, gdw, gdb, gdy, gx, gw, gm, gr, N, C, ws, 0));
        EXPECT_TRUE(within(get_bf(gdx, n), dx, kStoreRel, kArith)) << "dinp";
        EXPECT_TRUE(within(get(gdw, C), dw, 0.0, kArith)) << "dw";
        EXPECT_TRUE(within(get(gdb, C), db, 0.0, kArith)) << "db";
        // the same again: the same bits (no atomics); and dinp alone (dw, db null)
        const VF dw1 = get(gdw, C);
        float *gdw2 = put(dw0), *gdb2 = put(db0);
        LAUNCH(kern::layernorm_backward_bf16(nullptr, acc, gdw2, gdb2, gdy, gx, gw, gm, gr, N, C, ws, 0));
        EXPECT_TRUE(bits_equal(get(gdw2, C), dw1)) << "dw run to run";
        uint16_t* gdx2 = acc ? put(dx0, off) : nan_bf(n, off);
        LAUNCH(kern::layernorm_backward_bf16(gdx2, acc, nullptr, nullptr, gdy, gx, gw, gm, gr, N, C,
                                             ws, 0));
        EXPECT_TRUE(bits_equal(get_bf(gdx2, n), get_bf(gdx, n))) << "dinp without dw, db";
      }
}

// res = x + dropout(delta) stored in bf16, exactly the host's fp32 product and sum rounded to
// nearest even; out, mean and rstd the layer norm of that stored res (not of the unrounded sum, which
// moves the mean by far more than kStat). p = 0 and 0.3; flat and packed masks; delta aliasing res.
TEST_F(CudaBf16Kernels, ResidualLayerNormForward) {
  const int shapes[][2] = {{45, 96}, {30, 100}};
  const float eps = 1e-5f;
  uint64_t seed = 130;
  for (const auto& sh : shapes)
    for (size_t off : kOffsets)
      for (float p : {0.0f, 0.3f})
        for (bool packed : {false, true})
          for (bool alias : {false, true}) {
            const int N = sh[0], C = sh[1];
            SCOPED_TRACE(testing::Message() << "N " << N << " C " << C << " offset " << off << " p "
                                            << p << (packed ? " packed" : " flat")
                                            << (alias ? " delta = res" : ""));
            const size_t n = size_t(N) * C;
            VI tok(N);
            for (int i = 0; i < N; ++i) tok[i] = (i * 5 + 2) % (2 * N);
            Mask m;
            m.p = p;
            m.seed = nlp::derive_seed(++seed, 1, 2);
            if (packed) m.token_key_host = tok.data(), m.width = C;
            const VB x = rand_bf(n, ++seed, 1.0f, 2.0f), delta = rand_bf(n, ++seed, 0.5f);
            const VF w = randn(C, ++seed), b = randn(C, ++seed);
            VB want_res(n);
            const float sc = p > 0 ? 1.0f / (1.0f - p) : 1.0f;
            for (size_t i = 0; i < n; ++i) {
              float d = bf(delta[i]);
              if (p > 0) d = m.keep(i) ? float(double(d) * double(sc)) : 0.0f;  // one fp32 rounding
              want_res[i] = to_bits(float(double(d) + double(bf(x[i]))));     // another, then bf16
            }
            uint16_t* gx = put(x, off);
            uint16_t* gres = alias ? put(delta, off) : nan_bf(n, off);
            const uint16_t* gdelta = alias ? gres : put(delta, off);
            uint16_t* go = nan_bf(n, off);
            float *gw = put(w), *gb = put(b), *gm = nan_f(N), *gr = nan_f(N);
            const int32_t* gtok = packed ? put(tok) : nullptr;
            LAUNCH(kern::residual_layernorm_forward_bf16(gres, go, gm, gr, gx, gdelta, gw, gb, N, C,
                                                         eps, p, m.seed, nullptr, 0, 0, gtok,
                                                         m.width, 0));
            EXPECT_TRUE(bits_equal(get_bf(gres, n), want_res)) << "res";
            const LnRef s = ln_stats(want_res, N, C, eps);
            EXPECT_TRUE(within(get_bf(go, n), ln_forward_ref(want_res, s, w, b, N, C), kStoreRel,
                               kArith))
                << "out";
            EXPECT_TRUE(within(get(gm, N), stats_ref(s.mean), kStat, 0.0)) << "mean";
            EXPECT_TRUE(within(get(gr, N), stats_ref(s.rstd), kStat, 0.0)) << "rstd";
            if (p > 0 && !alias) {  // the seed from a device slot: the same bits
              uint64_t* slot = put(std::vector<uint64_t>{m.seed});
              uint16_t *gres2 = nan_bf(n, off), *go2 = nan_bf(n, off);
              LAUNCH(kern::residual_layernorm_forward_bf16(gres2, go2, nullptr, nullptr, gx, gdelta,
                                                           gw, gb, N, C, eps, p, m.seed ^ 1, slot, 0,
                                                           0, gtok, m.width, 0));
              EXPECT_TRUE(bits_equal(get_bf(gres2, n), want_res)) << "res, seed slot";
              EXPECT_TRUE(bits_equal(get_bf(go2, n), get_bf(go, n))) << "out, seed slot";
            }
          }
}

// ==================================================================================================
// embeddings
// ==================================================================================================

// Forward: the fp32 sum of the rows, rounded once. Backward: the table gradients against the double
// sums, and bit for bit the fp32 launcher's on dout widened to fp32 (the same sums in the same order);
// ids with long runs (padding) and few distinct values, positions by offset or by pos_ids, token types.
TEST_F(CudaBf16Kernels, Embedding) {
  const int V = 50, P = 40, TT = 2;
  uint64_t seed = 150;
  for (int C : {64, 20})
    for (size_t off : kOffsets)
      for (bool packed : {false, true}) {
        const int B = 3, T = 29, pos_offset = packed ? 0 : 5;
        SCOPED_TRACE(testing::Message() << "C " << C << " offset " << off
                                        << (packed ? " pos_ids" : " pos_offset"));
        const size_t BT = size_t(B) * T, n = BT * C;
        VI ids = randi(BT, ++seed, 0, V), types = randi(BT, ++seed, 0, TT), pos(BT);
        for (size_t i = 0; i < BT; i += 3) ids[i] = 0;  // a long run of one id
        for (size_t i = 0; i < BT; ++i) pos[i] = int32_t((i * 13) % 17);
        const VF wte = randn(size_t(V) * C, ++seed), wpe = randn(size_t(P) * C, ++seed),
                 wtt = randn(size_t(TT) * C, ++seed);
        const auto p_of = [&](size_t bt) { return packed ? pos[bt] : pos_offset + int(bt % T); };
        Ref fwd(n);
        for (size_t bt = 0; bt < BT; ++bt)
          for (int c = 0; c < C; ++c) {
            const double a = wte[size_t(ids[bt]) * C + c], e = wpe[size_t(p_of(bt)) * C + c],
                         t = wtt[size_t(types[bt]) * C + c];
            fwd.v[bt * C + c] = a + e + t;
            fwd.mag[bt * C + c] = std::fabs(a) + std::fabs(e) + std::fabs(t);
          }
        const int32_t *gids = put(ids), *gtypes = put(types), *gpos = packed ? put(pos) : nullptr;
        float *gwte = put(wte), *gwpe = put(wpe), *gwtt = put(wtt);
        uint16_t* go = nan_bf(n, off);
        LAUNCH(kern::embedding_forward_bf16(go, gids, gtypes, gwte, gwpe, gwtt, B, T, C, pos_offset,
                                            gpos, 0));
        EXPECT_TRUE(within(get_bf(go, n), fwd, kStoreRel, kArith)) << "forward";

        const VB dy = rand_bf(n, ++seed);
        VF dyf(n);
        for (size_t i = 0; i < n; ++i) dyf[i] = bf(dy[i]);
        const VF dte0 = randn(wte.size(), ++seed), dpe0 = randn(wpe.size(), ++seed),
                 dtt0 = randn(wtt.size(), ++seed);
        Ref dte(dte0.size()), dpe(dpe0.size()), dtt(dtt0.size());
        for (size_t i = 0; i < dte0.size(); ++i) dte.v[i] = dte0[i], dte.mag[i] = std::fabs(dte0[i]);
        for (size_t i = 0; i < dpe0.size(); ++i) dpe.v[i] = dpe0[i], dpe.mag[i] = std::fabs(dpe0[i]);
        for (size_t i = 0; i < dtt0.size(); ++i) dtt.v[i] = dtt0[i], dtt.mag[i] = std::fabs(dtt0[i]);
        for (size_t bt = 0; bt < BT; ++bt)
          for (int c = 0; c < C; ++c) {
            const double g = dyf[bt * C + c];
            const std::pair<Ref*, size_t> rows3[] = {
                {&dte, size_t(ids[bt])}, {&dpe, size_t(p_of(bt))}, {&dtt, size_t(types[bt])}};
            for (auto [r, row] : rows3) {
              r->v[row * C + c] += g;
              r->mag[row * C + c] += std::fabs(g);
            }
          }
        const size_t ws_bytes = kern::embedding_backward_bf16_ws_bytes(int(BT), C);
        void* ws = put(std::vector<char>(ws_bytes));
        float *gdte = put(dte0), *gdpe = put(dpe0), *gdtt = put(dtt0);
        LAUNCH(kern::embedding_backward_bf16(gdte, gdpe, gdtt, put(dy, off), gids, gtypes, B, T, C,
                                             pos_offset, gpos, ws, ws_bytes, 0));
        const VF got_te = get(gdte, dte0.size()), got_pe = get(gdpe, dpe0.size()),
                 got_tt = get(gdtt, dtt0.size());
        EXPECT_TRUE(within(got_te, dte, 0.0, kArith)) << "dwte";
        EXPECT_TRUE(within(got_pe, dpe, 0.0, kArith)) << "dwpe";
        EXPECT_TRUE(within(got_tt, dtt, 0.0, kArith)) << "dwtt";
        const size_t ws32_bytes = kern::embedding_backward_ws_bytes(int(BT), C);
        void* ws32 = put(std::vector<char>(ws32_bytes));
        float *fte = put(dte0), *fpe = put(dpe0), *ftt = put(dtt0);
        LAUNCH(kern::embedding_backward(fte, fpe, ftt, put(dyf), gids, gtypes, B, T, C, pos_offset,
                                        gpos, ws32, ws32_bytes, 0));
        EXPECT_TRUE(bits_equal(got_te, get(fte, dte0.size()))) << "dwte against the fp32 launcher";
        EXPECT_TRUE(bits_equal(got_pe, get(fpe, dpe0.size()))) << "dwpe against the fp32 launcher";
        EXPECT_TRUE(bits_equal(got_tt, get(ftt, dtt0.size()))) << "dwtt against the fp32 launcher";
      }
}


// ==================================================================================================
// through the CUDA backend: native kernels against the staged fp32 ops
// ==================================================================================================

// One backend and the buffers a case put there; `out` keeps each named output, widened to fp32.
struct Side {
  nlp::Backend& be;
  std::vector<void*> bufs;
  std::map<std::string, VF> out;
  explicit Side(nlp::Backend& b) : be(b) {}
  ~Side() {
    for (void* p : bufs) be.release(p);
  }
  template <typename T>
  T* put(const std::vector<T>& h) {
    void* p = be.alloc(h.size() * sizeof(T) + 16);
    bufs.push_back(p);
    be.to_device(p, h.data(), h.size() * sizeof(T));
    return static_cast<T*>(p);
  }
  nlp::Act view(const VB& h) { return nlp::Act(put(h), nlp::DType::BF16); }
  void keep(const std::string& k, nlp::CAct v, size_t n) {
    VF f(n);
    if (v.f32()) {
      be.to_host(f.data(), v.p, n * sizeof(float));
    } else {
      VB h(n);
      be.to_host(h.data(), v.p, n * sizeof(uint16_t));
      for (size_t i = 0; i < n; ++i) f[i] = bf(h[i]);
    }
    out[k] = f;
  }
};

// every element of a within 2^-7 of max(|a|, |b|) plus arms * RMS(b) of b; exact when both are 0
::testing::AssertionResult near_ulp(const VF& a, const VF& b, double arms) {
  if (a.size() != b.size()) return ::testing::AssertionFailure() << "sizes differ";
  double ss = 0;
  for (float x : b) ss += double(x) * x;
  const double floor = arms * std::sqrt(ss / std::max<size_t>(b.size(), 1));
  for (size_t i = 0; i < a.size(); ++i) {
    const double d = std::fabs(double(a[i]) - b[i]);
    const double tol = std::ldexp(std::max(std::fabs(a[i]), std::fabs(b[i])), -7) + floor;
    if (!std::isfinite(a[i]) || !(d <= tol))
      return ::testing::AssertionFailure() << "[" << i << "] " << a[i] << " vs " << b[i];
  }
  return ::testing::AssertionSuccess();
}
::testing::AssertionResult rel_norm(const VF& a, const VF& b, double tol) {
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    if (!std::isfinite(a[i])) return ::testing::AssertionFailure() << "[" << i << "] " << a[i];
    num += (double(a[i]) - b[i]) * (double(a[i]) - b[i]);
    den += double(b[i]) * b[i];
  }
  const double e = std::sqrt(num / std::max(den, 1e-300));
  if (a.size() == b.size() && e <= tol) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "relative error " << e << " > " << tol;
}

TEST(CudaBf16Backend, NativeKernelsMatchTheStagedOps) {
  std::string why;
  if (nlp::cuda_device_count(&why) == 0) GTEST_SKIP() << "no usable CUDA device: " << why;
  const char* prev = std::getenv("NLPTRAIN_CUDA_BF16_ACTS");
  const std::string saved = prev ? prev : "";
  ::setenv("NLPTRAIN_CUDA_BF16_ACTS", "staged", 1);
  std::unique_ptr<nlp::Backend> staged = nlp::make_cuda_backend(0);
  ::setenv("NLPTRAIN_CUDA_BF16_ACTS", "native", 1);
  std::unique_ptr<nlp::Backend> native = nlp::make_cuda_backend(0);
  if (prev)
    ::setenv("NLPTRAIN_CUDA_BF16_ACTS", saved.c_str(), 1);
  else
    ::unsetenv("NLPTRAIN_CUDA_BF16_ACTS");

  using nlp::Act;
  using nlp::CAct;
  using nlp::overwrite;
  const int B = 2, T = 37, Tk = 48, C = 96, N = B * T, V = 30, P = 64;
  const size_t n = size_t(N) * C, n_odd = n - 3;  // n_odd: a vector tail
  uint64_t seed = 500;
  const VB x = rand_bf(n, ++seed, 2.0f, 1.0f), y = rand_bf(n, ++seed), z = rand_bf(n, ++seed);
  const VB nan_n(n, kNanBits);
  const VF w = randn(C, ++seed), bias = randn(C, ++seed), f32 = randn(n, ++seed);
  const VF dw0 = randn(C, ++seed), db0 = randn(C, ++seed);
  const VI ids = randi(N, ++seed, 0, V), types = randi(N, ++seed, 0, 2), rows_idx = [&] {
    VI r(11);
    for (int i = 0; i < 11; ++i) r[i] = (i * 7 + 3) % N;  // distinct rows
    return r;
  }();
  const VF wte = randn(size_t(V) * C, ++seed), wpe = randn(size_t(P) * C, ++seed),
           wtt = randn(2 * size_t(C), ++seed);
  const nlp::DropRows trimmed{size_t(T) * C, size_t(Tk) * C};
  const uint64_t dseed = nlp::derive_seed(seed, 7, 1);

  const auto run = [&](Side& s) {
    nlp::Backend& be = s.be;
    // GELU, both forms; backward accumulating and overwriting (a NaN-filled dinp)
    for (nlp::Gelu form : {nlp::Gelu::Tanh, nlp::Gelu::Erf}) {
      const std::string f = form == nlp::Gelu::Tanh ? " tanh" : " erf";
      Act o = s.view(nan_n), gx = s.view(x), gy = s.view(y);
      be.gelu_forward(o, gx, n_odd, form);
      s.keep("gelu_forward" + f, o, n_odd);
      Act d = s.view(z), dw = s.view(nan_n);
      be.gelu_backward(d, gx, gy, n_odd, form);
      be.gelu_backward(overwrite(dw), gx, gy, n_odd, form);
      s.keep("gelu_backward" + f, d, n_odd);
      s.keep("gelu_backward (overwrite)" + f, dw, n_odd);
    }
    {  // add (out = a), accumulate in each mix of dtypes, scale
      Act a = s.view(x), b = s.view(y), o = s.view(nan_n);
      be.add(o, a, b, n_odd);
      be.add(a, a, b, n_odd);
      s.keep("add", o, n_odd);
      s.keep("add (out = a)", a, n_odd);
      Act d = s.view(z);
      be.accumulate(d, s.view(x), n_odd);
      s.keep("accumulate bf16 += bf16", d, n_odd);
      Act e = s.view(z);
      be.accumulate(e, s.put(f32), n_odd);
      s.keep("accumulate bf16 += fp32", e, n_odd);
      float* g = s.put(f32);
      be.accumulate(g, s.view(x), n_odd);
      s.keep("accumulate fp32 += bf16", g, n_odd);
      Act h = s.view(x);
      be.scale(h, 0.3f, n_odd);
      s.keep("scale", h, n_odd);
    }
    {  // dropout: p > 0 flat and trimmed, p = 0; backward accumulating and overwriting
      Act gx = s.view(x), gy = s.view(y);
      int k = 0;
      for (float p : {0.2f, 0.0f})
        for (nlp::DropRows r : {nlp::DropRows{}, trimmed}) {
          const std::string tag = " #" + std::to_string(k++);
          Act o = s.view(nan_n), d = s.view(z), dw = s.view(nan_n);
          be.dropout_forward(o, gx, n, p, dseed, r);
          be.dropout_backward(d, gy, n, p, dseed, r);
          be.dropout_backward(overwrite(dw), gy, n, p, dseed, r);
          s.keep("dropout_forward" + tag, o, n);
          s.keep("dropout_backward" + tag, d, n);
          s.keep("dropout_backward (overwrite)" + tag, dw, n);
        }
    }
    {  // rows: the [CLS]-like rows (stride T*C) and indexed rows (stride C)
      Act src = s.view(x), o1 = s.view(nan_n), o2 = s.view(nan_n);
      be.rows_gather(o1, src, B, C, size_t(T) * C);
      const int32_t* gidx = s.put(rows_idx);
      be.rows_gather(o2, src, int(rows_idx.size()), C, C, gidx);
      s.keep("rows_gather", o1, size_t(B) * C);
      s.keep("rows_gather (idx)", o2, rows_idx.size() * C);
      Act d = s.view(z);
      be.rows_scatter_add(d, s.view(y), B, C, size_t(T) * C);
      be.rows_scatter_add(d, s.view(x), int(rows_idx.size()), C, C, gidx);
      s.keep("rows_scatter_add", d, n);
    }
    {  // layer norm forward and backward; its residual form with delta aliasing res
      Act o = s.view(nan_n), gx = s.view(x);
      float *gw = s.put(w), *gb = s.put(bias), *m = s.put(VF(N)), *r = s.put(VF(N));
      be.layernorm_forward(o, m, r, gx, gw, gb, N, C, 1e-5f);
      s.keep("layernorm_forward", o, n);
      s.keep("layernorm_forward mean", m, N);
      s.keep("layernorm_forward rstd", r, N);
      Act d = s.view(z), dw_view = s.view(nan_n);
      float *dw = s.put(dw0), *db = s.put(db0);
      be.layernorm_backward(d, dw, db, s.view(y), gx, gw, m, r, N, C);
      be.layernorm_backward(overwrite(dw_view), nullptr, nullptr, s.view(y), gx, gw, m, r, N, C);
      s.keep("layernorm_backward dinp", d, n);
      s.keep("layernorm_backward dinp (overwrite)", dw_view, n);
      s.keep("layernorm_backward dw", dw, C);
      s.keep("layernorm_backward db", db, C);
      Act res = s.view(y), out = s.view(nan_n);
      float *m2 = s.put(VF(N)), *r2 = s.put(VF(N));
      be.residual_layernorm_forward(res, out, m2, r2, gx, res, gw, gb, N, C, 1e-5f, 0.1f, dseed,
                                    trimmed);
      s.keep("residual res", res, n);
      s.keep("residual out", out, n);
      s.keep("residual mean", m2, N);
      s.keep("residual rstd", r2, N);
    }
    {  // embeddings: token + position + type
      Act o = s.view(nan_n);
      const int32_t *gids = s.put(ids), *gtypes = s.put(types);
      float *te = s.put(wte), *pe = s.put(wpe), *tt = s.put(wtt);
      be.embedding_forward(o, gids, gtypes, te, pe, tt, B, T, C, 3);
      s.keep("embedding_forward", o, n);
      float *dte = s.put(VF(wte.size())), *dpe = s.put(VF(wpe.size())), *dtt = s.put(VF(wtt.size()));
      be.embedding_backward(dte, dpe, dtt, s.view(y), gids, gtypes, B, T, C, 3);
      s.keep("embedding_backward dwte", dte, wte.size());
      s.keep("embedding_backward dwpe", dpe, wpe.size());
      s.keep("embedding_backward dwtt", dtt, wtt.size());
    }
    be.synchronize();
  };
  Side st(*staged), nv(*native);
  run(st);
  run(nv);
  ASSERT_EQ(st.out.size(), nv.out.size());
  for (const auto& [name, want] : st.out) {
    SCOPED_TRACE(name);
    const VF& got = nv.out.at(name);
    const bool approx = name.rfind("gelu", 0) == 0 || name.rfind("layernorm", 0) == 0 ||
                        name == "residual out" || name == "residual mean" || name == "residual rstd";
    if (!approx) {
      EXPECT_TRUE(bits_equal(got, want));
    } else if (name.find("mean") != std::string::npos || name.find("rstd") != std::string::npos) {
      EXPECT_TRUE(rel_norm(got, want, kStat));
    } else if (name.find(" dw") != std::string::npos || name.find(" db") != std::string::npos) {
      EXPECT_TRUE(rel_norm(got, want, kArith));
    } else {
      EXPECT_TRUE(near_ulp(got, want, 1e-4));
    }
  }
}

}  // namespace

#else  // a build without CUDA

TEST(CudaBf16Kernels, Skipped) { GTEST_SKIP() << "built without CUDA (NLPTRAIN_CUDA=OFF or no nvcc)"; }
TEST(CudaBf16Backend, Skipped) { GTEST_SKIP() << "built without CUDA (NLPTRAIN_CUDA=OFF or no nvcc)"; }

#endif
