// The CPU backend's GEMM libraries (backend/cpu/gemm.h) and its native bf16 path:
//  - every library's fp32 gemm, in all four transpose cases, beta 0 and 1, strided leading dimensions
//    and odd shapes, against a float64 product (tolerance: fp32 accumulation, a few ulps of sum |a b|);
//  - the native bf16 gemm against a float64 product of the operands rounded to bf16 (the same bound),
//    and shown to fail that bound for operands not rounded, or truncated instead of rounded: a kernel
//    that skipped or mis-rounded the conversion, or accumulated in bf16, would not pass;
//  - the backend with run.cpu_bf16 = native against the emulation (the reference the GPU is compared
//    with): the same rounded operands, so the same products up to fp32 summation order; dbias exact;
//  - the mixed library (oneDNN, weight gradients by OpenBLAS): each product bitwise the one library's
//    it names, and the rule by which run.cpu_gemm = auto picks it;
//  - run.cpu_gemm / run.cpu_bf16 values and errors.
// Native bf16 tests skip, saying why, on a CPU without AMX-BF16 / AVX512-BF16 or a build without oneDNN.
// No expected value is taken from the code under test.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/gemm.h"
#include "backend/cpu/round.h"
#include "core/backend.h"
#include "core/error.h"
#include "core/rng.h"

namespace {

using nlp::CpuBf16;
using nlp::CpuGemm;
using nlp::Precision;
using nlp::WLayout;
using nlp::cpu::bf16;
using nlp::cpu::GemmLib;
using VF = std::vector<float>;

VF randn(size_t n, uint64_t seed, float sd = 1.0f) {
  nlp::Rng r(seed);
  VF v(n);
  for (auto& x : v) x = sd * r.normal();
  return v;
}

float bf16_value(bf16 b) { return std::bit_cast<float>(uint32_t(b.bits) << 16); }
float truncate_bf16(float x) { return std::bit_cast<float>(std::bit_cast<uint32_t>(x) & 0xffff0000u); }

// A stored operand: `rows` x `cols` logical, kept transposed or not, with a padded leading dimension.
struct Stored {
  VF v;
  int ld;
};
Stored store(const VF& logical, int rows, int cols, bool trans, int pad) {
  Stored s;
  s.ld = (trans ? rows : cols) + pad;
  s.v.assign((size_t)(trans ? cols : rows) * s.ld, NAN);  // padding is never read: NaN would show
  for (int i = 0; i < rows; ++i)
    for (int j = 0; j < cols; ++j)
      s.v[trans ? (size_t)j * s.ld + i : (size_t)i * s.ld + j] = logical[(size_t)i * cols + j];
  return s;
}

struct Ref {
  std::vector<double> c, mag;  // beta*C0 + A B in float64, and sum |a b| + |beta*C0| per element
};
Ref reference(const VF& A, const VF& B, const VF& C0, float beta, int M, int N, int K) {
  Ref r;
  r.c.assign((size_t)M * N, 0.0);
  r.mag.assign((size_t)M * N, 0.0);
  for (int m = 0; m < M; ++m)
    for (int n = 0; n < N; ++n) {
      double s = beta * (double)C0[(size_t)m * N + n], a = std::fabs(s);
      for (int k = 0; k < K; ++k) {
        const double p = (double)A[(size_t)m * K + k] * B[(size_t)k * N + n];
        s += p;
        a += std::fabs(p);
      }
      r.c[(size_t)m * N + n] = s;
      r.mag[(size_t)m * N + n] = a;
    }
  return r;
}

// Largest |C - ref| / (sum |a b|) over the elements: fp32 accumulation of K products gives at most
// about K * 2^-24, in practice sqrt(K) * 2^-24 (~1e-6 at K = 300).
double worst(const VF& C, const Ref& r) {
  double w = 0;
  for (size_t i = 0; i < C.size(); ++i) w = std::max(w, std::fabs(C[i] - r.c[i]) / (r.mag[i] + 1e-30));
  return w;
}
constexpr double kFp32Tol = 2e-6;

std::vector<GemmLib> libraries() {
  std::vector<GemmLib> v{GemmLib::OpenBlas};
  if (nlp::cpu::onednn_available()) v.push_back(GemmLib::OneDnn), v.push_back(GemmLib::OneDnnOpenBlasTA);
  return v;
}

struct Shape {
  int M, N, K;
};
const Shape kShapes[] = {{37, 29, 301}, {64, 80, 96}, {5, 200, 7}, {128, 3, 64}};

TEST(CpuGemm, Fp32EveryLibraryTransposeBetaAndStrideAgainstFloat64) {
  std::string why;
  if (!nlp::cpu::onednn_available(&why)) std::printf("[ note ] only OpenBLAS is tested: %s\n", why.c_str());
  for (GemmLib lib : libraries())
    for (const Shape& s : kShapes)
      for (int t = 0; t < 4; ++t)
        for (float beta : {0.0f, 1.0f}) {
          const bool ta = t & 1, tb = t & 2;
          const VF A = randn((size_t)s.M * s.K, 1 + t), B = randn((size_t)s.K * s.N, 5 + t);
          const VF C0 = randn((size_t)s.M * s.N, 9);
          const Stored a = store(A, s.M, s.K, ta, 3), b = store(B, s.K, s.N, tb, 1);
          const int ldc = s.N + 2;
          VF cs((size_t)s.M * ldc, NAN);
          for (int m = 0; m < s.M; ++m)
            for (int n = 0; n < s.N; ++n) cs[(size_t)m * ldc + n] = beta != 0 ? C0[(size_t)m * s.N + n] : NAN;
          nlp::cpu::gemm(lib, ta, tb, s.M, s.N, s.K, a.v.data(), a.ld, b.v.data(), b.ld, beta, cs.data(), ldc);
          VF c((size_t)s.M * s.N);
          for (int m = 0; m < s.M; ++m)
            for (int n = 0; n < s.N; ++n) {
              c[(size_t)m * s.N + n] = cs[(size_t)m * ldc + n];
              ASSERT_TRUE(std::isnan(cs[(size_t)m * ldc + s.N]));  // C's padding untouched
            }
          const double e = worst(c, reference(A, B, C0, beta, s.M, s.N, s.K));
          EXPECT_LT(e, kFp32Tol) << nlp::cpu::gemm_lib_description(lib) << " " << s.M << "x" << s.N
                                 << "x" << s.K << " ta " << ta << " tb " << tb << " beta " << beta;
        }
}

// The bf16 copy the native GEMM reads holds round_bf16's value (round_bf16 is checked against a float64
// reference in test_precision and against torch in tests/python/test_precision.py): every bf16 pattern
// with the dropped half at zero, one, just below / at / just above the tie, all ones and a random value.
TEST(CpuGemm, Bf16CopyEqualsRoundBf16OnEveryPattern) {
  nlp::Rng r(7);
  for (uint32_t hi = 0; hi < (1u << 16); ++hi)
    for (uint32_t lo : {0u, 1u, 0x7fffu, 0x8000u, 0x8001u, 0xffffu, uint32_t(r.next_u64() & 0xffffu)}) {
      const uint32_t u = hi << 16 | lo;
      const float x = std::bit_cast<float>(u);
      const float want = nlp::cpu::round_bf16(x);
      const bf16 got{nlp::cpu::to_bf16_bits(x)};
      if (std::isnan(x)) {
        ASSERT_TRUE(std::isnan(bf16_value(got))) << std::hex << u;
        ASSERT_EQ(got.bits & 0x8000u, (u >> 16) & 0x8000u) << std::hex << u;  // sign kept
      } else {
        ASSERT_EQ(uint32_t(got.bits) << 16, std::bit_cast<uint32_t>(want)) << std::hex << u;
      }
    }
}

bool native_or_skip() {
  std::string what;
  if (nlp::cpu::native_bf16_available(&what)) return true;
  std::printf("[ SKIPPED ] native bf16: %s\n", what.c_str());
  return false;
}

TEST(CpuGemm, NativeBf16AgainstFloat64ProductOfRoundedOperands) {
  if (!native_or_skip()) GTEST_SKIP() << "no native bf16 on this CPU / build";
  for (const Shape& s : kShapes)
    for (int t = 0; t < 4; ++t)
      for (float beta : {0.0f, 1.0f}) {
        const bool ta = t & 1, tb = t & 2;
        const VF A = randn((size_t)s.M * s.K, 21 + t), B = randn((size_t)s.K * s.N, 25 + t, 0.1f);
        const VF C0 = randn((size_t)s.M * s.N, 29);
        // bf16 copies in the stored layout, and the rounded / truncated values in the logical one
        const Stored a = store(A, s.M, s.K, ta, 2), b = store(B, s.K, s.N, tb, 0);
        std::vector<bf16> ab(a.v.size()), bb(b.v.size());
        for (size_t i = 0; i < ab.size(); ++i) ab[i].bits = nlp::cpu::to_bf16_bits(a.v[i]);
        for (size_t i = 0; i < bb.size(); ++i) bb[i].bits = nlp::cpu::to_bf16_bits(b.v[i]);
        VF rA(A.size()), rB(B.size()), tA(A.size()), tB(B.size());
        for (size_t i = 0; i < A.size(); ++i) {
          rA[i] = nlp::cpu::round_bf16(A[i]);
          tA[i] = truncate_bf16(A[i]);
        }
        for (size_t i = 0; i < B.size(); ++i) {
          rB[i] = nlp::cpu::round_bf16(B[i]);
          tB[i] = truncate_bf16(B[i]);
        }
        // the bf16 copy holds exactly the rounded value (to_bf16_bits agrees with round_bf16)
        for (int m = 0; m < s.M; ++m)
          for (int k = 0; k < s.K; ++k)
            ASSERT_EQ(bf16_value(ab[ta ? (size_t)k * a.ld + m : (size_t)m * a.ld + k]), rA[(size_t)m * s.K + k]);
        VF c = beta != 0 ? C0 : VF(C0.size(), NAN);
        nlp::cpu::gemm(GemmLib::OneDnn, ta, tb, s.M, s.N, s.K, ab.data(), a.ld, bb.data(), b.ld, beta,
                       c.data(), s.N);
        const std::string where = std::to_string(s.M) + "x" + std::to_string(s.N) + "x" +
                                  std::to_string(s.K) + " ta " + std::to_string(ta) + " tb " +
                                  std::to_string(tb) + " beta " + std::to_string(beta);
        EXPECT_LT(worst(c, reference(rA, rB, C0, beta, s.M, s.N, s.K)), kFp32Tol) << where;
        // The bound is tight enough to tell: the unrounded and the truncated operands miss it.
        if (s.K >= 64) {
          EXPECT_GT(worst(c, reference(A, B, C0, beta, s.M, s.N, s.K)), 10 * kFp32Tol) << where;
          EXPECT_GT(worst(c, reference(tA, tB, C0, beta, s.M, s.N, s.K)), 10 * kFp32Tol) << where;
        }
      }
}

// The bias added in the GEMM's output pass (the dense layer's forward) is the product rounded once
// with the bias: the value of C starting as the broadcast bias with beta 1, and of the float64
// reference with the bias as C0.
TEST(CpuGemm, NativeBf16BiasInTheOutputPass) {
  if (!native_or_skip()) GTEST_SKIP() << "no native bf16 on this CPU / build";
  for (const Shape& s : kShapes)
    for (bool tb : {false, true}) {
      const VF A = randn((size_t)s.M * s.K, 61), B = randn((size_t)s.K * s.N, 62, 0.1f), bias = randn(s.N, 63);
      const Stored b = store(B, s.K, s.N, tb, 0);
      std::vector<bf16> ab(A.size()), bb(b.v.size());
      VF rA(A.size()), rB(B.size()), C0((size_t)s.M * s.N);
      for (size_t i = 0; i < A.size(); ++i) ab[i].bits = nlp::cpu::to_bf16_bits(A[i]), rA[i] = nlp::cpu::round_bf16(A[i]);
      for (size_t i = 0; i < bb.size(); ++i) bb[i].bits = nlp::cpu::to_bf16_bits(b.v[i]);
      for (size_t i = 0; i < B.size(); ++i) rB[i] = nlp::cpu::round_bf16(B[i]);
      for (int m = 0; m < s.M; ++m)
        for (int n = 0; n < s.N; ++n) C0[(size_t)m * s.N + n] = bias[n];
      VF fused(C0.size(), NAN), summed = C0;
      nlp::cpu::gemm(GemmLib::OneDnn, false, tb, s.M, s.N, s.K, ab.data(), s.K, bb.data(), b.ld, 0.0f,
                     fused.data(), s.N, bias.data());
      nlp::cpu::gemm(GemmLib::OneDnn, false, tb, s.M, s.N, s.K, ab.data(), s.K, bb.data(), b.ld, 1.0f,
                     summed.data(), s.N);
      const std::string where = std::to_string(s.M) + "x" + std::to_string(s.N) + "x" + std::to_string(s.K) +
                                " tb " + std::to_string(tb);
      EXPECT_LT(worst(fused, reference(rA, rB, C0, 1.0f, s.M, s.N, s.K)), kFp32Tol) << where;
      EXPECT_GT(worst(fused, reference(rA, rB, C0, 0.0f, s.M, s.N, s.K)), 10 * kFp32Tol) << where;  // bias there
      EXPECT_EQ(0, std::memcmp(fused.data(), summed.data(), fused.size() * sizeof(float))) << where;
    }
}

double max_rel(const VF& a, const VF& b) {
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    num = std::max(num, std::fabs((double)a[i] - b[i]));
    den = std::max(den, std::fabs((double)b[i]));
  }
  return num / den;
}

class NativeBf16Backend : public ::testing::TestWithParam<WLayout> {};

TEST_P(NativeBf16Backend, MatchesTheEmulationForwardAndBackward) {
  if (!native_or_skip()) GTEST_SKIP() << "no native bf16 on this CPU / build";
  const WLayout layout = GetParam();
  auto emu = nlp::make_cpu_backend(2, Precision::Bf16, CpuGemm::Auto, CpuBf16::Emulate);
  auto nat = nlp::make_cpu_backend(2, Precision::Bf16, CpuGemm::Auto, CpuBf16::Native);
  auto f32 = nlp::make_cpu_backend(2, Precision::Fp32);
  EXPECT_NE(nat->details().find("bf16: native"), std::string::npos) << nat->details();
  EXPECT_NE(emu->details().find("bf16: emulated"), std::string::npos) << emu->details();
  const int M = 96, K = 256, N = 160;
  const VF inp = randn((size_t)M * K, 41), w = randn((size_t)K * N, 42, 0.05f), bias = randn(N, 43);
  VF o_emu((size_t)M * N), o_nat((size_t)M * N), o_f32((size_t)M * N);
  emu->matmul_forward(o_emu.data(), inp.data(), w.data(), bias.data(), M, K, N, layout);
  nat->matmul_forward(o_nat.data(), inp.data(), w.data(), bias.data(), M, K, N, layout);
  f32->matmul_forward(o_f32.data(), inp.data(), w.data(), bias.data(), M, K, N, layout);
  // Same rounded operands, fp32 accumulation on both: only the summation order differs (~1e-6) ...
  EXPECT_LT(max_rel(o_nat, o_emu), 1e-5);
  // ... while bf16 against fp32 differs by operand rounding (~1e-3): the check can tell.
  EXPECT_GT(max_rel(o_nat, o_f32), 1e-4);

  const VF dout = randn((size_t)M * N, 44);
  const VF dinp0 = randn(inp.size(), 45), dw0 = randn(w.size(), 46), db0 = randn(N, 47);
  VF di_e = dinp0, dw_e = dw0, db_e = db0, di_n = dinp0, dw_n = dw0, db_n = db0;
  emu->matmul_backward(di_e.data(), dw_e.data(), db_e.data(), dout.data(), inp.data(), w.data(), M, K, N, layout);
  nat->matmul_backward(di_n.data(), dw_n.data(), db_n.data(), dout.data(), inp.data(), w.data(), M, K, N, layout);
  auto part = [](const VF& after, const VF& before) {
    VF d(after.size());
    for (size_t i = 0; i < d.size(); ++i) d[i] = after[i] - before[i];
    return d;
  };
  EXPECT_LT(max_rel(part(di_n, dinp0), part(di_e, dinp0)), 1e-5);
  EXPECT_LT(max_rel(part(dw_n, dw0), part(dw_e, dw0)), 1e-5);
  EXPECT_EQ(0, std::memcmp(db_n.data(), db_e.data(), N * sizeof(float)));  // dbias: unrounded dout, same code
  // inputs untouched (master weights are never rounded in place)
  EXPECT_EQ(inp, randn(inp.size(), 41));
  EXPECT_EQ(w, randn(w.size(), 42, 0.05f));
}

INSTANTIATE_TEST_SUITE_P(Layouts, NativeBf16Backend, ::testing::Values(WLayout::InOut, WLayout::OutIn),
                         [](const auto& info) { return info.param == WLayout::InOut ? "InOut" : "OutIn"; });

// The mixed library sends a product with A transposed (a weight gradient) to OpenBLAS and every other
// one to oneDNN: each result bitwise equal to that library's own, and (at a shape where their summation
// orders differ) not to the other's, so a dispatch to the wrong library fails.
TEST(CpuGemm, MixedLibrarySendsTransposedAToOpenBlas) {
  std::string why;
  if (!nlp::cpu::onednn_available(&why)) GTEST_SKIP() << why;
  const int M = 96, N = 80, K = 700;
  for (int t = 0; t < 4; ++t) {
    const bool ta = t & 1, tb = t & 2;
    const VF A = randn((size_t)M * K, 31 + t), B = randn((size_t)K * N, 35 + t);
    const Stored a = store(A, M, K, ta, 0), b = store(B, K, N, tb, 0);
    auto run = [&](GemmLib lib) {
      VF c((size_t)M * N);
      nlp::cpu::gemm(lib, ta, tb, M, N, K, a.v.data(), a.ld, b.v.data(), b.ld, 0.0f, c.data(), N);
      return c;
    };
    const VF mixed = run(GemmLib::OneDnnOpenBlasTA), blas = run(GemmLib::OpenBlas), dnnl = run(GemmLib::OneDnn);
    const VF& want = ta ? blas : dnnl;
    const VF& other = ta ? dnnl : blas;
    EXPECT_EQ(std::memcmp(mixed.data(), want.data(), sizeof(float) * want.size()), 0) << "ta " << ta << " tb " << tb;
    if (std::memcmp(blas.data(), dnnl.data(), sizeof(float) * blas.size()) != 0)
      EXPECT_NE(std::memcmp(mixed.data(), other.data(), sizeof(float) * other.size()), 0);
    else
      std::printf("[ note ] ta %d tb %d: OpenBLAS and oneDNN gave bitwise the same product here\n", ta, tb);
  }
}

// run.cpu_gemm = auto: OpenBLAS without oneDNN; oneDNN on AVX-512 CPUs or where OpenBLAS lacks AVX2
// kernels for the core; else oneDNN with OpenBLAS's weight gradients (docs/performance.md,
// "CPU GEMM libraries")
TEST(CpuGemm, AutoLibraryRule) {
  using nlp::cpu::auto_gemm_lib;
  EXPECT_EQ(auto_gemm_lib(false, false, "Zen"), GemmLib::OpenBlas);
  EXPECT_EQ(auto_gemm_lib(false, true, "SkylakeX"), GemmLib::OpenBlas);
  EXPECT_EQ(auto_gemm_lib(true, true, "SkylakeX"), GemmLib::OneDnn);
  EXPECT_EQ(auto_gemm_lib(true, true, "Prescott"), GemmLib::OneDnn);
  EXPECT_EQ(auto_gemm_lib(true, false, "Prescott"), GemmLib::OneDnn);
  EXPECT_EQ(auto_gemm_lib(true, false, "Zen"), GemmLib::OneDnnOpenBlasTA);
  EXPECT_EQ(auto_gemm_lib(true, false, "HASWELL"), GemmLib::OneDnnOpenBlasTA);
  // this machine: the backend's log line names what the rule picked
  const GemmLib here = auto_gemm_lib();
  const std::string d = nlp::make_cpu_backend(1, Precision::Fp32, CpuGemm::Auto)->details();
  EXPECT_EQ(d.find("weight gradients OpenBLAS") != std::string::npos, here == GemmLib::OneDnnOpenBlasTA) << d;
  std::printf("[ note ] run.cpu_gemm = auto here: %s\n", d.c_str());
}

// (a value outside a key's choices is the configuration's error: test_config's
// ConfigRanges.OutOfRangeValuesAreRejected)
TEST(CpuGemmOptions, ValuesAndErrors) {
  auto expect_error = [](CpuGemm gemm, CpuBf16 bf, const std::string& needle) {
    try {
      nlp::make_cpu_backend(1, Precision::Bf16, gemm, bf);
      ADD_FAILURE() << "no error for " << needle;
    } catch (const nlp::Error& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  EXPECT_NE(nlp::make_cpu_backend(1, Precision::Fp32, CpuGemm::OpenBlas)->details().find("OpenBLAS"),
            std::string::npos);
  // emulate is always available, and fp32 never takes the bf16 path whatever run.cpu_bf16 says
  EXPECT_NE(
      nlp::make_cpu_backend(1, Precision::Bf16, CpuGemm::Auto, CpuBf16::Emulate)->details().find("emulated"),
      std::string::npos);
  // (the GEMM library's ISA name may itself say bf16, e.g. oneDNN's avx512_core_bf16 on a Zen 4)
  EXPECT_EQ(nlp::make_cpu_backend(1, Precision::Fp32, CpuGemm::Auto, CpuBf16::Native)->details().find("| bf16"),
            std::string::npos);
  std::string why;
  if (nlp::cpu::onednn_available(&why)) {
    EXPECT_NE(nlp::make_cpu_backend(1, Precision::Fp32, CpuGemm::OneDnn)->details().find("oneDNN"),
              std::string::npos);
    EXPECT_NE(nlp::make_cpu_backend(1, Precision::Fp32, CpuGemm::Auto)->details().find("oneDNN"),
              std::string::npos);
  } else {
    expect_error(CpuGemm::OneDnn, CpuBf16::Emulate, "libdnnl-dev");
  }
  std::string what;
  const bool native = nlp::cpu::native_bf16_available(&what);
  // auto on this machine: what the rule below picks for its instruction set, and the log line says why
  std::string auto_why;
  const bool auto_native = nlp::cpu::auto_native_bf16(nlp::cpu::bf16_isa(), &auto_why);
  const std::string d = nlp::make_cpu_backend(1, Precision::Bf16, CpuGemm::Auto, CpuBf16::Auto)->details();
  EXPECT_NE(d.find(auto_native ? "bf16: native" : "bf16: emulated"), std::string::npos) << d;
  EXPECT_NE(d.find(nlp::cat("(run.cpu_bf16 = auto, ", auto_why, ")")), std::string::npos) << d;
  EXPECT_TRUE(!auto_native || native);  // auto never picks what native would refuse
  if (!native) expect_error(CpuGemm::Auto, CpuBf16::Native, "run.cpu_bf16 = native");
  if (native) {  // an explicit native runs natively whatever auto would pick, and says nothing about auto
    const std::string n =
        nlp::make_cpu_backend(1, Precision::Bf16, CpuGemm::Auto, CpuBf16::Native)->details();
    EXPECT_NE(n.find("bf16: native"), std::string::npos) << n;
    EXPECT_EQ(n.find("run.cpu_bf16 = auto"), std::string::npos) << n;
  }
  std::printf("[ note ] run.cpu_bf16 = auto here: %s\n", d.c_str());
}

// run.cpu_bf16 = auto as a function of the CPU's bf16 arithmetic: native only with AMX-BF16 (measured
// faster than fp32 on the xeon-amx), emulate with AVX512-BF16 alone (native measured 2.1x slower than
// fp32 on the xeon without AMX) and without either; the reason names the instruction set.
TEST(CpuGemmOptions, AutoBf16Rule) {
  using nlp::cpu::auto_native_bf16;
  using nlp::cpu::Bf16Isa;
  std::string why;
  EXPECT_TRUE(auto_native_bf16(Bf16Isa{true, true, "avx512_core_amx (AMX-BF16)"}, &why));
  EXPECT_EQ(why.rfind("native: ", 0), 0u) << why;
  EXPECT_NE(why.find("AMX-BF16"), std::string::npos) << why;
  EXPECT_NE(why.find("avx512_core_amx"), std::string::npos) << why;

  EXPECT_FALSE(auto_native_bf16(Bf16Isa{true, false, "avx512_core_bf16"}, &why));
  EXPECT_EQ(why.rfind("emulated: ", 0), 0u) << why;
  EXPECT_NE(why.find("avx512_core_bf16"), std::string::npos) << why;
  EXPECT_NE(why.find("not AMX-BF16"), std::string::npos) << why;
  EXPECT_NE(why.find("run.cpu_bf16 = native"), std::string::npos) << why;  // how to ask for it anyway

  EXPECT_FALSE(auto_native_bf16(Bf16Isa{false, false, "avx2"}, &why));
  EXPECT_EQ(why.rfind("emulated: ", 0), 0u) << why;
  EXPECT_NE(why.find("avx2"), std::string::npos) << why;
  EXPECT_FALSE(auto_native_bf16(Bf16Isa{false, false, "avx512_core"}));  // why is optional

  // the flags read from this machine agree with what native accepts
  const Bf16Isa here = nlp::cpu::bf16_isa();
  EXPECT_EQ(here.avx512_bf16, nlp::cpu::native_bf16_available());
  EXPECT_TRUE(!here.amx_bf16 || here.avx512_bf16);
  std::printf("[ note ] bf16 here: avx512_bf16 %d, amx_bf16 %d (%s)\n", here.avx512_bf16, here.amx_bf16,
              here.isa.c_str());
}

}  // namespace
