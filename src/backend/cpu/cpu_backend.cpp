// CpuBackend (cpu_backend_impl.h) apart from its ops: construction, details, host memory (64-byte
// aligned, zeroed), run.profile's cast times, the persistent bf16 copy of the weights, the GEMM
// operands' casts, the factory. Each op is in its family's file, beside the function it calls.
#include "backend/cpu/cpu_backend.h"

#include <omp.h>

#if defined(__AVX__)
#include <immintrin.h>
#endif

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <new>
#include <vector>

#include "backend/cpu/cpu_backend_impl.h"
#include "core/error.h"

extern "C" void openblas_set_num_threads(int);

namespace nlp {
namespace cpu {

constexpr size_t kAlign = 64;

CpuBackend::CpuBackend(int threads, Precision precision, CpuGemm gemm, CpuBf16 bf16, bool bf16_weights)
    : precision_(precision), wcopy_on_(bf16_weights && precision == Precision::Bf16) {
  if (threads > 0) {
    omp_set_num_threads(threads);
    openblas_set_num_threads(threads);
  }
  std::string why;
  if (gemm == CpuGemm::OneDnn) {
    if (!cpu::onednn_available(&why)) throw Error(cat("run.cpu_gemm = onednn: ", why));
    lib_ = cpu::GemmLib::OneDnn;
  } else if (gemm == CpuGemm::Auto) {
    lib_ = cpu::auto_gemm_lib();
  }
  if (precision == Precision::Bf16 && bf16 == CpuBf16::Native) {
    if (!cpu::native_bf16_available(&bf16_isa_))
      throw Error(cat("run.cpu_bf16 = native: ", bf16_isa_, "; use run.cpu_bf16 = emulate or auto"));
    native_bf16_ = true;
  } else if (precision == Precision::Bf16 && bf16 == CpuBf16::Auto) {
    const cpu::Bf16Isa hw = cpu::bf16_isa();
    native_bf16_ = cpu::auto_native_bf16(hw, &bf16_auto_);
    bf16_isa_ = hw.isa;
  }
}

std::string CpuBackend::details() const {
  std::string d = cat("GEMMs: ", cpu::gemm_lib_description(lib_));
  if (precision_ == Precision::Bf16)
    d += cat(native_bf16_ ? cat(" | bf16: native (oneDNN, ", bf16_isa_, ")")
                          : std::string(" | bf16: emulated (operands rounded, fp32 GEMMs)"),
             bf16_auto_.empty() ? "" : cat(" (run.cpu_bf16 = auto, ", bf16_auto_, ")"));
  if (wcopy_on_) d += " | weights: persistent bf16 copy (run.bf16_weights)";
  return d;
}

// ---- memory ----
void* CpuBackend::alloc(size_t bytes) {
  size_t rounded = (bytes + kAlign - 1) / kAlign * kAlign;
  if (rounded == 0) rounded = kAlign;
  void* p = std::aligned_alloc(kAlign, rounded);
  if (!p) throw Error(cat("cpu backend: out of host memory allocating ", bytes, " bytes"));
  std::memset(p, 0, rounded);
  return p;
}

void CpuBackend::release(void* p) { std::free(p); }

void CpuBackend::zero(void* p, size_t bytes) {
  forget_ce_stats(p);
  zero_bytes(p, bytes);
  weights_written(static_cast<const float*>(p), bytes / sizeof(float));
}

// (zero's memset, in parallel pieces)
void CpuBackend::zero_bytes(void* p, size_t bytes) {
  // large buffers (the gradient arena, every step) in parallel chunks: one core cannot fill
  // the memory bandwidth of the node
  constexpr size_t kChunk = size_t(1) << 20;
  const size_t chunks = (bytes + kChunk - 1) / kChunk;
  char* c = static_cast<char*>(p);
  if (chunks < 4) {
    // the model's activation gradients (0.1-4 MiB, several per layer and step): plain stores, so the
    // lines stay cached for the op that accumulates into them next; split over the threads above
    // 64 KiB (a serial memset left the other cores waiting, 1-3% of a fine-tuning step)
    constexpr size_t kSerial = size_t(64) << 10;
    if (bytes < kSerial) {
      if (bytes) std::memset(p, 0, bytes);
      return;
    }
    const size_t pieces = std::min<size_t>(size_t(omp_get_max_threads()), bytes / (kSerial / 2));
    const size_t piece = (bytes / pieces + 63) / 64 * 64;
#pragma omp parallel for schedule(static)
    for (size_t k = 0; k < pieces; ++k)
      if (k * piece < bytes) std::memset(c + k * piece, 0, std::min(piece, bytes - k * piece));
    return;
  }
#pragma omp parallel for schedule(static)
  for (size_t k = 0; k < chunks; ++k)
    stream_zero(c + k * kChunk, std::min(kChunk, bytes - k * kChunk));
#if defined(__AVX__)
  _mm_sfence();  // the streaming stores are visible before anything reads them
#endif
}

void CpuBackend::to_device(void* dst, const void* host_src, size_t bytes) {
  forget_ce_stats(dst);
  if (bytes && dst != host_src) std::memmove(dst, host_src, bytes);
  weights_written(static_cast<const float*>(dst), bytes / sizeof(float));
}

void CpuBackend::to_host(void* host_dst, const void* src, size_t bytes) {
  if (bytes && host_dst != src) std::memmove(host_dst, src, bytes);
}

void CpuBackend::copy(void* dst, const void* src, size_t bytes) {
  forget_ce_stats(dst);
  if (bytes && dst != src) std::memmove(dst, src, bytes);
  weights_written(static_cast<const float*>(dst), bytes / sizeof(float));
}

// ---- run.profile's account: the GEMMs' operand casts timed apart ----
void CpuBackend::profile_label(const char* label) {
  cast_label_ = label ? cat("cast: ", label) : std::string();
}

// ---- the persistent bf16 copy of the weights ----
void CpuBackend::register_weights(const float* arena, size_t n) {
  if (!wcopy_on_) return;
  if (n == 0) {
    if (arena == warena_) warena_ = nullptr, wn_ = 0, wcopy_ = {};
    return;
  }
  warena_ = arena;
  wn_ = n;
  wcopy_.assign(n, cpu::bf16{});
  weights_written(arena, n);
}

void CpuBackend::weights_written(const float* p, size_t n) {
  if (!warena_ || !n || p + n <= warena_ || p >= warena_ + wn_) return;
  const size_t lo = p > warena_ ? size_t(p - warena_) : 0;
  const size_t hi = std::min(wn_, size_t(p + n - warena_));
  const float* src = warena_;
  cpu::bf16* dst = wcopy_.data();
#pragma omp parallel for schedule(static) if (hi - lo >= 16384)
  for (size_t i = lo; i < hi; ++i) dst[i].bits = cpu::to_bf16_bits(src[i]);
}

// ---- the GEMM operands' casts ----
CpuBackend::CastTimer::~CastTimer() {
  if (b.cast_label_.empty()) return;
  const double ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  for (ProfileTime& t : b.cast_times_)
    if (t.label == b.cast_label_) {
      t.ms += ms;
      t.calls += 1;
      return;
    }
  b.cast_times_.push_back(ProfileTime{b.cast_label_, ms, 1});
}

// x[n] (bf16) widened to fp32 (exact) in scratch slot `slot`: the values rounded() gives for the
// fp32 weights x was rounded from (round_mantissa and to_bf16_bits round finite values alike).
const float* CpuBackend::widened(int slot, const cpu::bf16* x, size_t n) {
  CastTimer timer(*this);
  std::vector<float>& buf = round_buf_[slot];
  if (buf.size() < n) buf.resize(n);
  float* r = buf.data();
#pragma omp parallel for schedule(static)
  for (size_t i = 0; i < n; ++i) {
    const uint32_t u = uint32_t(x[i].bits) << 16;
    std::memcpy(&r[i], &u, sizeof u);
  }
  return r;
}

// A copy of x[n] rounded to this backend's operand precision, in scratch slot `slot` (0..2).
const float* CpuBackend::rounded(int slot, const float* x, size_t n) {
  CastTimer timer(*this);
  std::vector<float>& buf = round_buf_[slot];
  if (buf.size() < n) buf.resize(n);
  float* r = buf.data();
  const int drop = precision_ == Precision::Bf16 ? 16 : 13;
#pragma omp parallel for schedule(static)
  for (size_t i = 0; i < n; ++i) r[i] = cpu::round_mantissa(x[i], drop);
  return r;
}

// A bf16 copy of x[n] (rounded to nearest even, as rounded()), in scratch slot `slot` (0..2).
const cpu::bf16* CpuBackend::to_bf16(int slot, const float* x, size_t n) {
  CastTimer timer(*this);
  std::vector<cpu::bf16>& buf = bf16_buf_[slot];
  if (buf.size() < n) buf.resize(n);
  cpu::bf16* r = buf.data();
#pragma omp parallel for schedule(static)
  for (size_t i = 0; i < n; ++i) r[i].bits = cpu::to_bf16_bits(x[i]);
  return r;
}

// dst[0, n) = 0 with streaming (non-temporal) stores where the CPU has them: a buffer far larger
// than the caches (the gradient arena) is written without reading every line into the cache
// first, half the memory traffic of memset. Unaligned ends by memset. Callers fence (_mm_sfence).
void CpuBackend::stream_zero(char* dst, size_t n) {
#if defined(__AVX__)
  char* a = reinterpret_cast<char*>((reinterpret_cast<uintptr_t>(dst) + 31) & ~uintptr_t(31));
  if (a > dst + n) a = dst + n;
  std::memset(dst, 0, size_t(a - dst));
  const size_t body = (n - size_t(a - dst)) / 32 * 32;
  const __m256i z = _mm256_setzero_si256();
  for (size_t i = 0; i < body; i += 32) _mm256_stream_si256(reinterpret_cast<__m256i*>(a + i), z);
  std::memset(a + body, 0, n - size_t(a - dst) - body);
#else
  std::memset(dst, 0, n);
#endif
}

}  // namespace cpu

bool cpu_native_bf16(std::string* why) { return cpu::native_bf16_available(why); }
bool cpu_auto_native_bf16(std::string* why) { return cpu::auto_native_bf16(cpu::bf16_isa(), why); }

std::unique_ptr<Backend> make_cpu_backend(int threads, Precision precision, CpuGemm gemm, CpuBf16 bf16,
                                          bool bf16_weights) {
  return std::make_unique<cpu::CpuBackend>(threads, precision, gemm, bf16, bf16_weights);
}

}  // namespace nlp
