// The dense layer fused with its GELU (Backend::matmul_gelu_forward / matmul_dgelu_backward,
// core/backend.h) on the CPU backend, whose defaults must compute exactly the two ops the model
// called before (matmul_forward then gelu_forward; matmul_backward into the scratch then
// gelu_backward), so that every CPU result stays what it was:
//  - forward: out and pre bitwise those of the two ops, for fp32 and bf16 views, both GELU forms,
//    both weight layouts, with and without a bias, in fp32 and bf16 GEMM precision;
//  - backward: dpre, dW and dbias bitwise those of the two ops, with dpre accumulated onto a prior
//    value and marked overwrite() over NaN, the scratch NaN before (its contents must not leak);
//  - through the run.profile account (AccountBackend) and the replayed micro-batch proxy
//    (StepGraph), which forward both ops to the backend they wrap: the same bits again.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/round.h"
#include "backend/op_account_backend.h"
#include "backend/step_graph.h"
#include "core/backend.h"
#include "core/rng.h"

namespace {

using nlp::Act;
using nlp::Backend;
using nlp::CAct;
using nlp::DType;
using nlp::Gelu;
using nlp::WLayout;
using VF = std::vector<float>;

VF randn(size_t n, uint64_t seed, float sd = 1.0f) {
  VF v(n);
  nlp::Rng(seed).fill_normal(v.data(), n, sd);
  return v;
}

// An activation tensor in host memory, stored as fp32 or bf16 (raw bytes, compared bitwise).
struct Buf {
  DType dt = DType::F32;
  std::vector<uint8_t> bytes;
  Buf(const VF& v, DType d) : dt(d), bytes(v.size() * nlp::dtype_bytes(d)) {
    for (size_t i = 0; i < v.size(); ++i) {
      if (d == DType::F32) {
        std::memcpy(bytes.data() + 4 * i, &v[i], 4);
      } else {
        const uint16_t b = nlp::cpu::to_bf16_bits(v[i]);
        std::memcpy(bytes.data() + 2 * i, &b, 2);
      }
    }
  }
  static Buf nan(size_t n, DType d) { return Buf(VF(n, std::numeric_limits<float>::quiet_NaN()), d); }
  Act view() { return Act(bytes.data(), dt); }
  CAct cview() const { return CAct(bytes.data(), dt); }
};

// Bitwise equal; names the first differing byte.
::testing::AssertionResult same(const std::vector<uint8_t>& got, const std::vector<uint8_t>& want,
                                const std::string& what) {
  if (got.size() != want.size()) return ::testing::AssertionFailure() << what << ": sizes differ";
  for (size_t i = 0; i < got.size(); ++i)
    if (got[i] != want[i]) return ::testing::AssertionFailure() << what << ": byte " << i << " differs";
  return ::testing::AssertionSuccess();
}
::testing::AssertionResult same(const VF& got, const VF& want, const std::string& what) {
  std::vector<uint8_t> a(got.size() * 4), b(want.size() * 4);
  std::memcpy(a.data(), got.data(), a.size());
  std::memcpy(b.data(), want.data(), b.size());
  return same(a, b, what);
}

constexpr int M = 7, K = 24, N = 40;  // the first layer's [M,K] -> [M,N]; the next reads [M,N]

struct Case {
  DType act;
  Gelu form;
  WLayout layout;
  bool bias;
  std::string name() const {
    return std::string(nlp::dtype_name(act)) + (form == Gelu::Tanh ? " tanh" : " erf") +
           (layout == WLayout::InOut ? " InOut" : " OutIn") + (bias ? " bias" : " no bias");
  }
};

std::vector<Case> cases() {
  std::vector<Case> v;
  for (DType act : {DType::F32, DType::BF16})
    for (Gelu form : {Gelu::Tanh, Gelu::Erf})
      for (WLayout layout : {WLayout::InOut, WLayout::OutIn})
        for (bool bias : {true, false}) v.push_back(Case{act, form, layout, bias});
  return v;
}

// The forward and backward of the fused ops on `fused` against the separate ops on `ref`.
void check_case(Backend& fused, Backend& ref, const Case& c, uint64_t seed) {
  SCOPED_TRACE(c.name());
  const DType dt = c.act;
  const Buf inp(randn(size_t(M) * K, seed), dt);
  const VF w = randn(size_t(K) * N, seed + 1, 0.3f), b = randn(N, seed + 2);
  const float* bias = c.bias ? b.data() : nullptr;

  // forward: pre = inp @ W + b, out = gelu(pre); the fused op's outputs NaN before
  Buf out = Buf::nan(size_t(M) * N, dt), pre = Buf::nan(size_t(M) * N, dt);
  fused.matmul_gelu_forward(out.view(), pre.view(), inp.cview(), w.data(), bias, M, K, N, c.layout,
                            c.form);
  Buf out_r = Buf::nan(size_t(M) * N, dt), pre_r = Buf::nan(size_t(M) * N, dt);
  ref.matmul_forward(pre_r.view(), inp.cview(), w.data(), bias, M, K, N, c.layout);
  ref.gelu_forward(out_r.view(), pre_r.cview(), size_t(M) * N, c.form);
  EXPECT_TRUE(same(pre.bytes, pre_r.bytes, "pre"));
  EXPECT_TRUE(same(out.bytes, out_r.bytes, "out"));

  // backward of the next layer y = out @ W2 + b2 ([M,N] -> [M,K]): dpre = (dy @ W2^T) * gelu'(pre)
  const VF w2 = randn(size_t(N) * K, seed + 3, 0.3f);
  const Buf dy(randn(size_t(M) * K, seed + 4), dt);
  const VF prior = randn(size_t(M) * N, seed + 5);
  const VF dw0 = randn(w2.size(), seed + 6), db0 = randn(K, seed + 7);
  for (bool write : {false, true}) {
    SCOPED_TRACE(write ? "dpre overwritten" : "dpre accumulated");
    Buf dpre = write ? Buf::nan(size_t(M) * N, dt) : Buf(prior, dt);
    Buf scratch = Buf::nan(size_t(M) * N, dt);
    VF dw = dw0, db = db0;
    fused.matmul_dgelu_backward(write ? nlp::overwrite(dpre.view()) : dpre.view(), dw.data(),
                                c.bias ? db.data() : nullptr, dy.cview(), out.cview(), pre.cview(),
                                w2.data(), M, N, K, c.layout, c.form, scratch.view());
    Buf dpre_r = write ? Buf::nan(size_t(M) * N, dt) : Buf(prior, dt);
    Buf tmp = Buf::nan(size_t(M) * N, dt);
    VF dw_r = dw0, db_r = db0;
    ref.matmul_backward(nlp::overwrite(tmp.view()), dw_r.data(), c.bias ? db_r.data() : nullptr,
                        dy.cview(), out.cview(), w2.data(), M, N, K, c.layout);
    ref.gelu_backward(write ? nlp::overwrite(dpre_r.view()) : dpre_r.view(), pre.cview(), tmp.cview(),
                      size_t(M) * N, c.form);
    EXPECT_TRUE(same(dpre.bytes, dpre_r.bytes, "dpre"));
    EXPECT_TRUE(same(dw, dw_r, "dW"));
    EXPECT_TRUE(same(db, db_r, "dbias"));
  }
}

TEST(MatmulGeluCpu, DefaultsAreTheTwoOpsBitwise) {
  for (nlp::Precision p : {nlp::Precision::Fp32, nlp::Precision::Bf16}) {
    SCOPED_TRACE(nlp::precision_name(p));
    std::unique_ptr<Backend> be = nlp::make_cpu_backend(2, p);
    uint64_t seed = 10;
    for (const Case& c : cases()) check_case(*be, *be, c, seed += 10);
  }
}

TEST(MatmulGeluCpu, AccountAndStepGraphForwardBothOps) {
  std::unique_ptr<Backend> be = nlp::make_cpu_backend(2, nlp::Precision::Bf16);
  nlp::AccountBackend account(*be, 0, nlp::Precision::Bf16);
  nlp::StepGraph graph(*be, /*emulate=*/true);
  uint64_t seed = 500;
  for (const Case& c : cases()) {
    check_case(account, *be, c, seed += 10);
    check_case(graph, *be, c, seed += 10);
  }
}

}  // namespace
