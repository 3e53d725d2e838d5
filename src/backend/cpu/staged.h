// fp32 stand-ins for the CPU backend's typed views (core/tensor.h): every CPU kernel computes in fp32
// on fp32 arrays, and these give it one for each view argument of an op.
//   In   an input:       an F32 view itself; a BF16 view widened (exactly) into a buffer.
//   Out  a written output: an F32 view itself; else a buffer rounded into the view when the op ends.
//   Acc  an accumulated gradient: an F32 view itself (zeroed first when the view says overwrite); a
//        BF16 view widened into a buffer (zeros when overwrite), added to, rounded back at the end.
// So a bf16 tensor is rounded exactly where the op stores it, as the GPU's kernels store bf16 (round
// to nearest even, cpu/round.h), and fp32 views run the kernels on their own memory as before.
// The stand-ins of one op are independent copies: an output that aliases an input (add, dropout,
// residual_layernorm_forward's delta) reads the input as it was when the op began, as the fp32
// kernels do. Out and Acc write back in their destructor (after the kernel; also when it threw).
// Each checks that its view holds the elements the op's shape needs (core/tensor.h, fits).
#pragma once
#include <cstring>
#include <vector>

#include "backend/cpu/round.h"
#include "core/tensor.h"

namespace nlp::cpu {

inline void widen_bf16(float* dst, const uint16_t* src, size_t n) {
#pragma omp parallel for schedule(static) if (n >= 65536)
  for (size_t i = 0; i < n; ++i) {
    const uint32_t u = uint32_t(src[i]) << 16;
    std::memcpy(&dst[i], &u, sizeof u);
  }
}
inline void narrow_bf16(uint16_t* dst, const float* src, size_t n) {
#pragma omp parallel for schedule(static) if (n >= 65536)
  for (size_t i = 0; i < n; ++i) dst[i] = to_bf16_bits(src[i]);
}

class In {
 public:
  In(CAct v, size_t n) {
    check_fits(v, n, "a cpu op's input");
    if (!v.p || v.f32()) {
      p_ = static_cast<const float*>(v.p);
      return;
    }
    buf_.resize(n);
    widen_bf16(buf_.data(), v.bf(), n);
    p_ = buf_.data();
  }
  operator const float*() const { return p_; }  // NOLINT: passed straight to the kernels
  const float* get() const { return p_; }

 private:
  const float* p_ = nullptr;
  std::vector<float> buf_;
};

class Out {
 public:
  // accumulate: the Acc semantics (read the view first unless it says overwrite)
  Out(Act v, size_t n, bool accumulate = false) : v_(v), n_(n) {
    check_fits(v, n, "a cpu op's output");
    if (!v.p) return;
    if (v.f32()) {
      p_ = v.fp();
      if (accumulate && v.write) std::memset(p_, 0, n * sizeof(float));
      return;
    }
    buf_.assign(n, 0.0f);
    if (accumulate && !v.write) widen_bf16(buf_.data(), v.bf(), n);
    p_ = buf_.data();
  }
  ~Out() {
    if (v_.p && !v_.f32()) narrow_bf16(v_.bf(), buf_.data(), n_);
  }
  Out(const Out&) = delete;
  Out& operator=(const Out&) = delete;
  operator float*() const { return p_; }  // NOLINT
  float* get() const { return p_; }

 private:
  Act v_;
  size_t n_;
  float* p_ = nullptr;
  std::vector<float> buf_;
};

class Acc : public Out {
 public:
  Acc(Act v, size_t n) : Out(v, n, true) {}
};

}  // namespace nlp::cpu
