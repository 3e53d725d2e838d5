// Typed views of activations in backend memory: where a tensor starts, how its elements are stored
// and, where the owner says, how many there are. The backend ops take their activation arguments (inputs, outputs and the gradients of
// both) as views; parameters, their gradients, the optimizer state, layer-norm statistics, losses and
// the attention op's saved state stay plain fp32 pointers. Shapes are the op's own arguments
// (core/backend.h), as before; a view's extent `n` (elements; 0 = not stated, as for a raw pointer)
// is what the tensor holds, and a backend refuses an op whose shape needs more of a view than that
// (fits(): an internal error naming both counts) rather than read or write past it. The arenas'
// views state it (model/carver.h); a tensor laid out for the largest batch holds more than a smaller
// batch's op uses, which is fine.
//
//   DType::F32   4-byte IEEE float (the reference, and every path verified on a GPU)
//   DType::BF16  the top half of an fp32 (8-bit exponent, 7-bit mantissa); a store rounds to
//                nearest even (cpu/round.h, __float2bfloat16_rn), a load is exact. Arithmetic is fp32.
//
// A float* converts to an F32 view implicitly, so fp32 callers read as they always have.
// Gradient outputs of backward ops accumulate (+=) by default; overwrite(view) marks the op as the
// tensor's only writer, which then overwrites it (its prior contents are ignored), so the caller's
// zeroing pass can go. Forward outputs are always overwritten; the flag means nothing there.
#pragma once
#include <cstddef>
#include <cstdint>

#include "core/error.h"

namespace nlp {

enum class DType : uint8_t { F32, BF16 };

constexpr size_t dtype_bytes(DType d) { return d == DType::F32 ? 4 : 2; }
inline const char* dtype_name(DType d) { return d == DType::F32 ? "fp32" : "bf16"; }

struct Act {
  void* p = nullptr;
  DType dt = DType::F32;
  bool write = false;  // gradient outputs: overwrite instead of accumulating (see the top)
  size_t n = 0;        // elements the tensor holds; 0 = not stated

  Act() = default;
  Act(std::nullptr_t) {}
  Act(float* f) : p(f) {}  // NOLINT: implicit on purpose (fp32 callers)
  Act(void* q, DType d, size_t elems = 0) : p(q), dt(d), n(elems) {}

  explicit operator bool() const { return p != nullptr; }
  bool f32() const { return dt == DType::F32; }
  // The elements `elems` on from this view's start (same dtype and flag; the extent what is left).
  Act at(size_t elems) const {
    Act r = *this;
    if (p) r.p = static_cast<char*>(p) + elems * dtype_bytes(dt);
    if (n) {
      NLP_ASSERT(elems <= n);
      r.n = n - elems;
    }
    return r;
  }
  // Whether an op may use k elements of it (always, when the extent is not stated).
  bool fits(size_t k) const { return n == 0 || k <= n; }
  // The fp32 pointer of an F32 view (asserts the dtype).
  float* fp() const {
    NLP_ASSERT(dt == DType::F32);
    return static_cast<float*>(p);
  }
  uint16_t* bf() const {
    NLP_ASSERT(dt == DType::BF16);
    return static_cast<uint16_t*>(p);
  }
};

struct CAct {
  const void* p = nullptr;
  DType dt = DType::F32;
  size_t n = 0;  // elements the tensor holds; 0 = not stated

  CAct() = default;
  CAct(std::nullptr_t) {}
  CAct(const float* f) : p(f) {}  // NOLINT: implicit on purpose
  CAct(const Act& a) : p(a.p), dt(a.dt), n(a.n) {}  // NOLINT
  CAct(const void* q, DType d, size_t elems = 0) : p(q), dt(d), n(elems) {}

  explicit operator bool() const { return p != nullptr; }
  bool f32() const { return dt == DType::F32; }
  CAct at(size_t elems) const {
    CAct r = *this;
    if (p) r.p = static_cast<const char*>(p) + elems * dtype_bytes(dt);
    if (n) {
      NLP_ASSERT(elems <= n);
      r.n = n - elems;
    }
    return r;
  }
  bool fits(size_t k) const { return n == 0 || k <= n; }
  const float* fp() const {
    NLP_ASSERT(dt == DType::F32);
    return static_cast<const float*>(p);
  }
  const uint16_t* bf() const {
    NLP_ASSERT(dt == DType::BF16);
    return static_cast<const uint16_t*>(p);
  }
};

// The op is this gradient's only writer: it overwrites instead of accumulating.
inline Act overwrite(Act a) {
  a.write = true;
  return a;
}

// An op needs k elements of view v (`what` names the op and argument): an internal error when v's
// stated extent is smaller.
inline void check_fits(const CAct& v, size_t k, const char* what) {
  if (!v.fits(k))
    throw Error(cat("internal error: ", what, " needs ", k, " elements of a view that holds ", v.n));
}

}  // namespace nlp
