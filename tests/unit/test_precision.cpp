// train.precision on the CPU backend:
//  - cpu::round_bf16 / round_tf32 against a reference written here in double arithmetic (quantum of
//    the binade, nearbyint = ties to even), exhaustively over every bf16 (tf32) pattern with the
//    dropped bits set to zero, one, just below / at / just above the half, all ones and a random
//    value, plus hand-built bit patterns for ties, specials and overflow near FLT_MAX;
//  - the Bf16/Tf32 backends' matmul_forward/backward equal, bitwise, the Fp32 backend's on operands
//    rounded beforehand (the same OpenBLAS calls), dbias sums the unrounded dout, the inputs are not
//    modified, and the result differs from fp32 by the error that operand rounding should give;
//  - parse_precision / precision_name.
// No expected value is taken from the code under test.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/round.h"
#include "core/backend.h"
#include "core/error.h"
#include "core/rng.h"

namespace {

using nlp::Backend;
using nlp::Precision;
using nlp::WLayout;
using VF = std::vector<float>;

float from_bits(uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}
uint32_t bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
}

// Reference: x rounded to a binary format with an 8-bit exponent (fp32's range, subnormals
// included) and `p` explicit mantissa bits, to nearest, ties to even; values that round past the
// largest finite one become infinite (IEEE overflow under round-to-nearest). Double arithmetic:
// x / q and r * q are exact because q is a power of two and x has at most 24 significant bits.
float ref_round(float x, int p) {
  if (std::isnan(x) || std::isinf(x) || x == 0.0f) return x;
  const double d = x;
  int e = 0;
  std::frexp(d, &e);                  // |d| in [2^(e-1), 2^e)
  const int lead = std::max(e - 1, -126);  // below the normal range the quantum stays 2^(-126-p)
  const double q = std::ldexp(1.0, lead - p);
  const double r = std::nearbyint(d / q) * q;  // default rounding mode: to nearest, ties to even
  if (std::fabs(r) >= std::ldexp(1.0, 128)) return std::copysign(INFINITY, x);
  return static_cast<float>(r);
}

// Same bits, or both NaN.
bool same(float a, float b) { return (std::isnan(a) && std::isnan(b)) || bits(a) == bits(b); }

// Every pattern of the kept (32 - drop) bits, with a set of low parts, against ref_round.
void exhaustive(int drop, float (*round)(float)) {
  const int p = 23 - drop;
  const uint32_t half = 1u << (drop - 1), all = (1u << drop) - 1u;
  nlp::Rng rng(42 + drop);
  int bad = 0;
  for (uint64_t hi = 0; hi < (uint64_t(1) << (32 - drop)); ++hi) {
    const uint32_t lows[] = {0u, 1u, half - 1u, half, half + 1u, all,
                             static_cast<uint32_t>(rng.next_u64()) & all};
    for (uint32_t lo : lows) {
      const float x = from_bits(static_cast<uint32_t>(hi << drop) | lo);
      const float got = round(x), want = ref_round(x, p);
      if (!same(got, want) && ++bad <= 10)
        ADD_FAILURE() << std::hex << "x=0x" << bits(x) << " got 0x" << bits(got) << " want 0x"
                      << bits(want);
    }
  }
  EXPECT_EQ(bad, 0);
}

TEST(RoundBf16, ExhaustiveAgainstDoubleReference) { exhaustive(16, nlp::cpu::round_bf16); }
TEST(RoundTf32, ExhaustiveAgainstDoubleReference) { exhaustive(13, nlp::cpu::round_tf32); }

TEST(RoundBf16, RepresentableValuesUnchanged) {
  const float vals[] = {1.0f, -2.0f, 0.5f, 3.0f, 1.0f + 0x1p-7f, -(1.0f + 0x7fp-7f), 0x1p-126f,
                        0x1p-133f /* smallest bf16 subnormal */, 0x1.fep127f /* largest bf16 */,
                        256.0f, 0.0f};
  for (float v : vals) EXPECT_EQ(bits(nlp::cpu::round_bf16(v)), bits(v)) << v;
  // tf32 keeps three more bits: 1 + 2^-10 is representable there but not in bf16.
  EXPECT_EQ(nlp::cpu::round_tf32(1.0f + 0x1p-10f), 1.0f + 0x1p-10f);
  EXPECT_EQ(nlp::cpu::round_bf16(1.0f + 0x1p-10f), 1.0f);
  EXPECT_EQ(nlp::cpu::round_tf32(0x1.ffcp127f), 0x1.ffcp127f);  // largest tf32
}

TEST(RoundBf16, TiesGoToEven) {
  // 1.0 = 0x3f800000; one bf16 ulp at 1 is bit 16, half an ulp is 0x8000.
  EXPECT_EQ(bits(nlp::cpu::round_bf16(from_bits(0x3f808000))), 0x3f800000u);  // tie, 1.0 is even
  EXPECT_EQ(bits(nlp::cpu::round_bf16(from_bits(0x3f818000))), 0x3f820000u);  // tie, 1+2^-7 is odd
  EXPECT_EQ(bits(nlp::cpu::round_bf16(from_bits(0x3f807fff))), 0x3f800000u);  // just below: down
  EXPECT_EQ(bits(nlp::cpu::round_bf16(from_bits(0x3f808001))), 0x3f810000u);  // just above: up
  EXPECT_EQ(bits(nlp::cpu::round_bf16(from_bits(0xbf808000))), 0xbf800000u);  // negative tie
  EXPECT_EQ(bits(nlp::cpu::round_bf16(from_bits(0xbf818000))), 0xbf820000u);
  // A tie whose round-up carries into the exponent: (2 - 2^-8) sits between 2 - 2^-7 (odd) and 2.
  EXPECT_EQ(nlp::cpu::round_bf16(2.0f - 0x1p-8f), 2.0f);
  // In numbers: 1 + 2^-8 -> 1; 1 + 3 * 2^-8 -> 1 + 2^-6.
  EXPECT_EQ(nlp::cpu::round_bf16(1.0f + 0x1p-8f), 1.0f);
  EXPECT_EQ(nlp::cpu::round_bf16(1.0f + 3 * 0x1p-8f), 1.0f + 0x1p-6f);
}

TEST(RoundTf32, TiesGoToEven) {
  // One tf32 ulp at 1 is bit 13 (2^-10), half an ulp is 0x1000.
  EXPECT_EQ(bits(nlp::cpu::round_tf32(from_bits(0x3f801000))), 0x3f800000u);
  EXPECT_EQ(bits(nlp::cpu::round_tf32(from_bits(0x3f803000))), 0x3f804000u);
  EXPECT_EQ(bits(nlp::cpu::round_tf32(from_bits(0x3f800fff))), 0x3f800000u);
  EXPECT_EQ(bits(nlp::cpu::round_tf32(from_bits(0x3f801001))), 0x3f802000u);
  EXPECT_EQ(nlp::cpu::round_tf32(1.0f + 0x1p-11f), 1.0f);
  EXPECT_EQ(nlp::cpu::round_tf32(1.0f + 3 * 0x1p-11f), 1.0f + 0x1p-9f);
}

// Random finite values over the whole exponent range: the dropped bits are zero, and for normal
// values the relative error is at most half an ulp, 2^-(p+1).
void low_bits_and_relative_error(int drop, float (*round)(float)) {
  const int p = 23 - drop;
  const double bound = std::ldexp(1.0, -(p + 1));
  nlp::Rng rng(7 + drop);
  double worst = 0;
  int normals = 0;
  for (int i = 0; i < 2000000; ++i) {
    const float x = from_bits(static_cast<uint32_t>(rng.next_u64()));
    if (!std::isfinite(x)) continue;
    const float r = round(x);
    if (std::isinf(r)) {  // only possible within half an ulp of FLT_MAX
      EXPECT_GE(std::fabs((double)x), 0x1.ffp127 * (1.0 - 1e-6)) << x;
      continue;
    }
    ASSERT_EQ(bits(r) & ((1u << drop) - 1u), 0u) << std::hex << bits(x);
    ASSERT_EQ(std::signbit(r), std::signbit(x)) << x;
    if (std::fabs(x) >= FLT_MIN) {
      ++normals;
      worst = std::max(worst, std::fabs((double)r - x) / std::fabs((double)x));
    }
  }
  EXPECT_GT(normals, 1000000);
  EXPECT_LE(worst, bound);
  EXPECT_GT(worst, 0.9 * bound);  // the bound is reached: the rounding does drop the bits
}

TEST(RoundBf16, LowBitsZeroAndHalfUlpError) { low_bits_and_relative_error(16, nlp::cpu::round_bf16); }
TEST(RoundTf32, LowBitsZeroAndHalfUlpError) { low_bits_and_relative_error(13, nlp::cpu::round_tf32); }

TEST(RoundBoth, SpecialValues) {
  for (auto round : {nlp::cpu::round_bf16, nlp::cpu::round_tf32}) {
    EXPECT_TRUE(std::isnan(round(std::numeric_limits<float>::quiet_NaN())));
    EXPECT_TRUE(std::isnan(round(-std::numeric_limits<float>::quiet_NaN())));
    // NaNs whose payload is only in the dropped bits: truncation would turn them into infinities.
    EXPECT_TRUE(std::isnan(round(from_bits(0x7f800001))));
    EXPECT_TRUE(std::isnan(round(from_bits(0xff800fff))));
    EXPECT_TRUE(std::isnan(round(from_bits(0x7fffffff))));
    EXPECT_EQ(round(INFINITY), INFINITY);
    EXPECT_EQ(round(-INFINITY), -INFINITY);
    EXPECT_EQ(bits(round(0.0f)), 0x00000000u);
    EXPECT_EQ(bits(round(-0.0f)), 0x80000000u);
    // The smallest subnormals round to zero of their sign.
    EXPECT_EQ(bits(round(from_bits(0x00000001))), 0x00000000u);
    EXPECT_EQ(bits(round(from_bits(0x80000001))), 0x80000000u);
  }
}

// As __float2bfloat16_rn (and torch's .to(bfloat16)): values at or above the largest bf16 plus half
// an ulp round to infinity, not to the largest finite value.
TEST(RoundBf16, OverflowNearFltMaxGoesToInfinity) {
  using nlp::cpu::round_bf16;
  EXPECT_EQ(round_bf16(FLT_MAX), INFINITY);
  EXPECT_EQ(round_bf16(-FLT_MAX), -INFINITY);
  EXPECT_EQ(round_bf16(from_bits(0x7f7f8000)), INFINITY);   // tie above 0x1.fep127 (odd): up
  EXPECT_EQ(round_bf16(from_bits(0x7f7f7fff)), 0x1.fep127f);  // just below the tie: largest bf16
  EXPECT_EQ(round_bf16(from_bits(0x7f7e8000)), 0x1.fcp127f);  // tie below an even value: down
}

TEST(RoundTf32, OverflowNearFltMaxGoesToInfinity) {
  using nlp::cpu::round_tf32;
  EXPECT_EQ(round_tf32(FLT_MAX), INFINITY);
  EXPECT_EQ(round_tf32(-FLT_MAX), -INFINITY);
  EXPECT_EQ(round_tf32(from_bits(0x7f7ff000)), INFINITY);    // tie above the largest tf32 (odd)
  EXPECT_EQ(round_tf32(from_bits(0x7f7fefff)), 0x1.ffcp127f);
}

// ================================================================================================
// The CPU backend in Bf16 / Tf32 mode
// ================================================================================================

VF randn(size_t n, uint64_t seed, float sd = 1.0f) {
  nlp::Rng r(seed);
  VF v(n);
  for (auto& x : v) x = sd * r.normal();
  return v;
}

VF rounded(const VF& v, Precision p) {
  VF r(v.size());
  for (size_t i = 0; i < v.size(); ++i)
    r[i] = p == Precision::Bf16 ? nlp::cpu::round_bf16(v[i]) : nlp::cpu::round_tf32(v[i]);
  return r;
}

bool bitwise_equal(const VF& a, const VF& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

double rel_err(const VF& a, const VF& b) {
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    const double d = (double)a[i] - b[i];
    num += d * d;
    den += (double)b[i] * b[i];
  }
  return std::sqrt(num / den);
}

struct Case {
  Precision precision;
  WLayout layout;
};

class ReducedMatmul : public ::testing::TestWithParam<Case> {
 protected:
  // Same thread count for both, so the OpenBLAS calls partition the work identically.
  std::unique_ptr<Backend> fp32_ = nlp::make_cpu_backend(2, Precision::Fp32);
  std::unique_ptr<Backend> red_ = nlp::make_cpu_backend(2, GetParam().precision);
  // Relative error of the reduced GEMM against fp32 on generic inputs: operand rounding alone
  // gives about 2^-(p+1) per operand (p = 7 or 10 mantissa bits), well inside one decade either side.
  double lo() const { return GetParam().precision == Precision::Bf16 ? 1e-4 : 1e-5; }
  double hi() const { return GetParam().precision == Precision::Bf16 ? 1e-2 : 1e-3; }
};

TEST_P(ReducedMatmul, ForwardIsFp32OnRoundedOperands) {
  const auto [prec, layout] = GetParam();
  for (auto [M, K, N] : {std::array<int, 3>{64, 96, 80}, std::array<int, 3>{7, 13, 5},
                         std::array<int, 3>{33, 70, 129}}) {
    const VF inp = randn((size_t)M * K, 1), w = randn((size_t)K * N, 2, 0.1f), bias = randn(N, 3);
    const VF inp0 = inp, w0 = w;
    VF out((size_t)M * N, 7.0f), ref((size_t)M * N, -7.0f), full((size_t)M * N);
    red_->matmul_forward(out.data(), inp.data(), w.data(), bias.data(), M, K, N, layout);
    const VF ri = rounded(inp, prec), rw = rounded(w, prec);
    fp32_->matmul_forward(ref.data(), ri.data(), rw.data(), bias.data(), M, K, N, layout);
    EXPECT_TRUE(bitwise_equal(out, ref)) << M << "x" << K << "x" << N;
    // The operands themselves stay fp32 (master weights are never rounded in place).
    EXPECT_TRUE(bitwise_equal(inp, inp0));
    EXPECT_TRUE(bitwise_equal(w, w0));
    // ... and the result is not the fp32 one.
    fp32_->matmul_forward(full.data(), inp.data(), w.data(), bias.data(), M, K, N, layout);
    const double e = rel_err(out, full);
    EXPECT_GT(e, lo()) << M << "x" << K << "x" << N;
    EXPECT_LT(e, hi()) << M << "x" << K << "x" << N;
  }
}

TEST_P(ReducedMatmul, BackwardIsFp32OnRoundedOperandsAndDbiasUnrounded) {
  const auto [prec, layout] = GetParam();
  const int M = 64, K = 96, N = 80;
  const VF inp = randn((size_t)M * K, 11), w = randn((size_t)K * N, 12, 0.1f);
  const VF dout = randn((size_t)M * N, 13);
  // Pre-filled gradients: the op accumulates into them.
  const VF dinp0 = randn(inp.size(), 14), dw0 = randn(w.size(), 15), db0 = randn(N, 16);

  VF dinp = dinp0, dw = dw0, db = db0;
  red_->matmul_backward(dinp.data(), dw.data(), db.data(), dout.data(), inp.data(), w.data(), M, K,
                        N, layout);
  EXPECT_TRUE(bitwise_equal(inp, randn(inp.size(), 11)));  // inputs untouched
  EXPECT_TRUE(bitwise_equal(w, randn(w.size(), 12, 0.1f)));
  EXPECT_TRUE(bitwise_equal(dout, randn(dout.size(), 13)));

  // dinp, dW: the fp32 backend on rounded dout, inp, W.
  const VF rd = rounded(dout, prec), ri = rounded(inp, prec), rw = rounded(w, prec);
  VF ref_dinp = dinp0, ref_dw = dw0;
  fp32_->matmul_backward(ref_dinp.data(), ref_dw.data(), nullptr, rd.data(), ri.data(), rw.data(),
                         M, K, N, layout);
  EXPECT_TRUE(bitwise_equal(dinp, ref_dinp));
  EXPECT_TRUE(bitwise_equal(dw, ref_dw));
  // dbias: the fp32 backend's full backward on the unrounded operands gives the same dbias.
  VF f_dinp = dinp0, f_dw = dw0, f_db = db0;
  fp32_->matmul_backward(f_dinp.data(), f_dw.data(), f_db.data(), dout.data(), inp.data(),
                         w.data(), M, K, N, layout);
  EXPECT_TRUE(bitwise_equal(db, f_db));
  // With the rounded dout it would differ (else the line above proves nothing).
  VF r_db = db0;
  fp32_->matmul_backward(nullptr, nullptr, r_db.data(), rd.data(), ri.data(), rw.data(), M, K, N,
                         layout);
  EXPECT_FALSE(bitwise_equal(db, r_db));

  // Against fp32: the accumulated parts (gradient minus the pre-filled value) differ by rounding.
  auto part = [](const VF& after, const VF& before) {
    VF d(after.size());
    for (size_t i = 0; i < d.size(); ++i) d[i] = after[i] - before[i];
    return d;
  };
  for (auto [got, want, name] : {std::tuple{part(dinp, dinp0), part(f_dinp, dinp0), "dinp"},
                                 std::tuple{part(dw, dw0), part(f_dw, dw0), "dw"}}) {
    const double e = rel_err(got, want);
    EXPECT_GT(e, lo()) << name;
    EXPECT_LT(e, hi()) << name;
  }

  // Null gradients are skipped; each remaining one is as in the full call.
  VF only_w = dw0;
  red_->matmul_backward(nullptr, only_w.data(), nullptr, dout.data(), inp.data(), w.data(), M, K, N,
                        layout);
  EXPECT_TRUE(bitwise_equal(only_w, dw));
  VF only_inp = dinp0;
  red_->matmul_backward(only_inp.data(), nullptr, nullptr, dout.data(), inp.data(), w.data(), M, K,
                        N, layout);
  EXPECT_TRUE(bitwise_equal(only_inp, dinp));
  VF only_b = db0;
  red_->matmul_backward(nullptr, nullptr, only_b.data(), dout.data(), inp.data(), w.data(), M, K,
                        N, layout);
  EXPECT_TRUE(bitwise_equal(only_b, db));
}

// Scratch reuse: a large call then a small one then the large one again give the first results.
TEST_P(ReducedMatmul, ScratchReuseAcrossShapes) {
  const auto [prec, layout] = GetParam();
  (void)prec;
  const VF a = randn(128 * 256, 21), wa = randn(256 * 192, 22, 0.1f);
  const VF b = randn(5 * 3, 23), wb = randn(3 * 4, 24, 0.1f);
  VF out1(128 * 192), out2(128 * 192), small(5 * 4);
  red_->matmul_forward(out1.data(), a.data(), wa.data(), nullptr, 128, 256, 192, layout);
  red_->matmul_forward(small.data(), b.data(), wb.data(), nullptr, 5, 3, 4, layout);
  red_->matmul_forward(out2.data(), a.data(), wa.data(), nullptr, 128, 256, 192, layout);
  EXPECT_TRUE(bitwise_equal(out1, out2));
  VF ref(5 * 4);
  fp32_->matmul_forward(ref.data(), rounded(b, prec).data(), rounded(wb, prec).data(), nullptr, 5,
                        3, 4, layout);
  EXPECT_TRUE(bitwise_equal(small, ref));
}

// Only the dense GEMMs change: every other op is the fp32 one, bitwise (layer norm, GELU, attention).
TEST_P(ReducedMatmul, OtherOpsAreFp32) {
  const int B = 2, T = 8, NH = 2, HS = 8, C = NH * HS;
  const VF x = randn((size_t)B * T * C, 31), lw = randn(C, 32), lb = randn(C, 33);
  VF o1(x.size()), o2(x.size()), m1(B * T), m2(B * T), r1(B * T), r2(B * T);
  fp32_->layernorm_forward(o1.data(), m1.data(), r1.data(), x.data(), lw.data(), lb.data(), B * T,
                           C, 1e-5f);
  red_->layernorm_forward(o2.data(), m2.data(), r2.data(), x.data(), lw.data(), lb.data(), B * T,
                          C, 1e-5f);
  EXPECT_TRUE(bitwise_equal(o1, o2));
  fp32_->gelu_forward(o1.data(), x.data(), x.size(), nlp::Gelu::Tanh);
  red_->gelu_forward(o2.data(), x.data(), x.size(), nlp::Gelu::Tanh);
  EXPECT_TRUE(bitwise_equal(o1, o2));
  const VF qkv = randn((size_t)B * T * 3 * C, 34);
  VF a1(x.size()), a2(x.size()), att1(fp32_->attention_saved_floats(B, T, NH, HS)), att2(att1.size());
  fp32_->attention_forward(a1.data(), att1.data(), qkv.data(), nullptr, true, 0.0f, 1, B, T, NH, HS);
  red_->attention_forward(a2.data(), att2.data(), qkv.data(), nullptr, true, 0.0f, 1, B, T, NH, HS);
  EXPECT_TRUE(bitwise_equal(a1, a2));
  EXPECT_TRUE(bitwise_equal(att1, att2));
}

INSTANTIATE_TEST_SUITE_P(
    Modes, ReducedMatmul,
    ::testing::Values(Case{Precision::Bf16, WLayout::InOut}, Case{Precision::Bf16, WLayout::OutIn},
                      Case{Precision::Tf32, WLayout::InOut}, Case{Precision::Tf32, WLayout::OutIn}),
    [](const auto& info) {
      return std::string(nlp::precision_name(info.param.precision)) +
             (info.param.layout == WLayout::InOut ? "InOut" : "OutIn");
    });

// ================================================================================================
// parse_precision / precision_name
// ================================================================================================

TEST(ParsePrecision, ValuesAutoAndErrors) {
  EXPECT_EQ(nlp::parse_precision("fp32", "cuda"), Precision::Fp32);
  EXPECT_EQ(nlp::parse_precision("tf32", "cpu"), Precision::Tf32);
  EXPECT_EQ(nlp::parse_precision("bf16", "cpu"), Precision::Bf16);
  EXPECT_EQ(nlp::parse_precision("auto", "cuda"), Precision::Bf16);
  EXPECT_EQ(nlp::parse_precision("auto", "cpu"), Precision::Fp32);
  EXPECT_STREQ(nlp::precision_name(Precision::Fp32), "fp32");
  EXPECT_STREQ(nlp::precision_name(Precision::Tf32), "tf32");
  EXPECT_STREQ(nlp::precision_name(Precision::Bf16), "bf16");
  try {
    nlp::parse_precision("fp16", "cuda");
    ADD_FAILURE() << "no error for fp16";
  } catch (const nlp::Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("train.precision"), std::string::npos) << m;
    EXPECT_NE(m.find("fp16"), std::string::npos) << m;
  }
}

}  // namespace
