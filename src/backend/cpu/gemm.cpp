// GEMM dispatch of the CPU backend: OpenBLAS's cblas_sgemm or oneDNN (dnnl_sgemm for fp32 operands,
// a cached matmul primitive for bf16 operands with fp32 accumulation). See gemm.h for the convention.
#include "backend/cpu/gemm.h"

#include <cblas.h>

#include <strings.h>

#include <map>
#include <mutex>
#include <tuple>
#include <unordered_map>

#include "core/error.h"

#ifdef NLPTRAIN_HAVE_ONEDNN
#include <oneapi/dnnl/dnnl.hpp>
#endif

extern "C" char* openblas_get_corename(void);

namespace nlp::cpu {

#ifdef NLPTRAIN_HAVE_ONEDNN
namespace {

const char* isa_name(dnnl::cpu_isa isa) {
  switch (isa) {
    case dnnl::cpu_isa::avx512_core_amx: return "avx512_core_amx (AMX-BF16)";
    case dnnl::cpu_isa::avx512_core_bf16: return "avx512_core_bf16";
    case dnnl::cpu_isa::avx512_core_vnni: return "avx512_core_vnni";
    case dnnl::cpu_isa::avx512_core: return "avx512_core";
    case dnnl::cpu_isa::avx2_vnni: return "avx2_vnni";
    case dnnl::cpu_isa::avx2: return "avx2";
    default: return "older than avx2";
  }
}

// One bf16 matmul primitive per (shape, strides, beta): creating one costs far more than a
// small GEMM. The number of distinct shapes is bounded by the batch lengths (data.pad_multiple) times the
// layers' few (K, N) pairs. Called from the backend's (single) host thread; the mutex keeps it safe anyway.
struct Matmuls {
  dnnl::engine eng{dnnl::engine::kind::cpu, 0};
  dnnl::stream strm{eng};
  using Key = std::tuple<bool, bool, int, int, int, int, int, int, bool, bool>;
  std::map<Key, dnnl::matmul> cache;
  std::mutex mu;

  // a [rows, cols] operand stored row-major (or transposed) with leading dimension ld
  static dnnl::memory::desc operand(bool is_bf16, int rows, int cols, bool trans, int ld) {
    using dims = dnnl::memory::dims;
    const auto type = is_bf16 ? dnnl::memory::data_type::bf16 : dnnl::memory::data_type::f32;
    return {{rows, cols}, type, trans ? dims{1, ld} : dims{ld, 1}};
  }

  // the bias [N], broadcast over the rows
  static dnnl::memory::desc bias_desc(int N) {
    return {{1, N}, dnnl::memory::data_type::f32, dnnl::memory::dims{N, 1}};
  }

  dnnl::matmul& get(const Key& key) {
    auto it = cache.find(key);
    if (it != cache.end()) return it->second;
    const auto [ta, tb, M, N, K, lda, ldb, ldc, accumulate, has_bias] = key;
    const dnnl::memory::desc a = operand(true, M, K, ta, lda), b = operand(true, K, N, tb, ldb);
    const dnnl::memory::desc c = operand(false, M, N, false, ldc);
    dnnl::primitive_attr attr;
    if (accumulate) {
      dnnl::post_ops po;
      po.append_sum(1.0f);  // C += A B
      attr.set_post_ops(po);
    }
#if DNNL_VERSION_MAJOR >= 3
    const dnnl::matmul::primitive_desc pd =
        has_bias ? dnnl::matmul::primitive_desc(eng, a, b, bias_desc(N), c, attr)
                 : dnnl::matmul::primitive_desc(eng, a, b, c, attr);
#else
    const dnnl::matmul::primitive_desc pd(
        has_bias ? dnnl::matmul::desc(a, b, bias_desc(N), c) : dnnl::matmul::desc(a, b, c), attr, eng);
#endif
    return cache.emplace(key, dnnl::matmul(pd)).first->second;
  }

  void run(bool ta, bool tb, int M, int N, int K, const bf16* A, int lda, const bf16* B, int ldb,
           float beta, float* C, int ldc, const float* bias) {
    std::lock_guard<std::mutex> lock(mu);
    dnnl::matmul& mm = get({ta, tb, M, N, K, lda, ldb, ldc, beta != 0.0f, bias != nullptr});
    dnnl::memory am(operand(true, M, K, ta, lda), eng, const_cast<bf16*>(A));
    dnnl::memory bm(operand(true, K, N, tb, ldb), eng, const_cast<bf16*>(B));
    dnnl::memory cm(operand(false, M, N, false, ldc), eng, C);
    std::unordered_map<int, dnnl::memory> args{{DNNL_ARG_SRC, am}, {DNNL_ARG_WEIGHTS, bm}, {DNNL_ARG_DST, cm}};
    if (bias) args.emplace(DNNL_ARG_BIAS, dnnl::memory(bias_desc(N), eng, const_cast<float*>(bias)));
    mm.execute(strm, args);
    strm.wait();
  }
};

Matmuls& matmuls() {
  static Matmuls m;
  return m;
}

void onednn_bf16_matmul(bool ta, bool tb, int M, int N, int K, const bf16* A, int lda,
                        const bf16* B, int ldb, float beta, float* C, int ldc, const float* bias) {
  try {
    matmuls().run(ta, tb, M, N, K, A, lda, B, ldb, beta, C, ldc, bias);
  } catch (const dnnl::error& e) {
    throw Error(cat("oneDNN bf16 matmul failed at ", M, "x", N, "x", K, ": ", e.what()));
  }
}

}  // namespace
#endif

bool onednn_available(std::string* why) {
#ifdef NLPTRAIN_HAVE_ONEDNN
  (void)why;
  return true;
#else
  if (why) *why = "nlptrain was built without oneDNN (apt-get install libdnnl-dev, then re-run cmake)";
  return false;
#endif
}

bool native_bf16_available(std::string* what) {
  const Bf16Isa hw = bf16_isa();
#ifdef NLPTRAIN_HAVE_ONEDNN
  if (what)
    *what = hw.avx512_bf16 ? hw.isa
                           : cat("this CPU has no bf16 arithmetic that oneDNN can use (its instruction set: ",
                                 hw.isa, "; needs avx512_bf16 or amx_bf16)");
#else
  if (what) *what = hw.isa;  // why there is no oneDNN
#endif
  return hw.avx512_bf16;
}

Bf16Isa bf16_isa() {
  Bf16Isa hw;
#ifdef NLPTRAIN_HAVE_ONEDNN
  const dnnl::cpu_isa isa = dnnl::get_effective_cpu_isa();
  hw.amx_bf16 = isa == dnnl::cpu_isa::avx512_core_amx;
  hw.avx512_bf16 = hw.amx_bf16 || isa == dnnl::cpu_isa::avx512_core_bf16;
  hw.isa = isa_name(isa);
#else
  onednn_available(&hw.isa);
#endif
  return hw;
}

bool auto_native_bf16(const Bf16Isa& hw, std::string* why) {
  if (why) {
    if (hw.amx_bf16)
      *why = cat("native: the CPU has AMX-BF16 (oneDNN isa ", hw.isa,
                 "), where oneDNN's bf16 GEMMs measured 2-4x its fp32 ones");
    else if (hw.avx512_bf16)
      *why = cat("emulated: the CPU has AVX512-BF16 but not AMX-BF16 (oneDNN isa ", hw.isa,
                 "), where native bf16 training measured 2.1x slower than fp32 (run.cpu_bf16 = native "
                 "asks for it anyway)");
    else
      *why = cat("emulated: no bf16 arithmetic that oneDNN can use here (", hw.isa,
                 "; native needs avx512_bf16 or amx_bf16)");
  }
  return hw.amx_bf16;
}

GemmLib auto_gemm_lib(bool have_onednn, bool cpu_has_avx512, const std::string& openblas_core) {
  if (!have_onednn) return GemmLib::OpenBlas;
  if (cpu_has_avx512) return GemmLib::OneDnn;
  // OpenBLAS's cores with AVX2 (FMA) sgemm kernels; others (Prescott, Nehalem, ...) run SSE kernels
  static const char* const kAvx2Cores[] = {"Haswell", "Zen", "SkylakeX", "Cooperlake", "SapphireRapids"};
  for (const char* c : kAvx2Cores)
    if (strcasecmp(openblas_core.c_str(), c) == 0) return GemmLib::OneDnnOpenBlasTA;
  return GemmLib::OneDnn;
}

GemmLib auto_gemm_lib() {
  // AVX-512 as the CPU reports it (and the OS enables it), whatever instruction set oneDNN names
  return auto_gemm_lib(onednn_available(), __builtin_cpu_supports("avx512f"), openblas_get_corename());
}

std::string gemm_lib_description(GemmLib lib) {
  if (lib == GemmLib::OneDnnOpenBlasTA)
    return cat(gemm_lib_description(GemmLib::OneDnn), ", weight gradients ",
               gemm_lib_description(GemmLib::OpenBlas));
  if (lib == GemmLib::OneDnn) {
#ifdef NLPTRAIN_HAVE_ONEDNN
    const dnnl_version_t* v = dnnl_version();
    return cat("oneDNN ", v->major, ".", v->minor, ".", v->patch, " (isa ",
               isa_name(dnnl::get_effective_cpu_isa()), ")");
#else
    return "oneDNN (not built)";
#endif
  }
  return cat("OpenBLAS (core ", openblas_get_corename(), ")");
}

void gemm(GemmLib lib, bool ta, bool tb, int M, int N, int K, const float* A, int lda,
          const float* B, int ldb, float beta, float* C, int ldc) {
  if (M <= 0 || N <= 0 || K <= 0) return;
  if (lib == GemmLib::OneDnnOpenBlasTA) lib = ta ? GemmLib::OpenBlas : GemmLib::OneDnn;
#ifdef NLPTRAIN_HAVE_ONEDNN
  if (lib == GemmLib::OneDnn) {
    // dnnl_sgemm, not the matmul primitive: the same rate at these shapes (measured), and no
    // primitive to create for every new batch length
    const dnnl_status_t st = dnnl_sgemm(ta ? 'T' : 'N', tb ? 'T' : 'N', M, N, K, 1.0f, A, lda, B,
                                        ldb, beta, C, ldc);
    if (st != dnnl_success)
      throw Error(cat("oneDNN sgemm failed (status ", int(st), ") at ", M, "x", N, "x", K));
    return;
  }
#endif
  if (lib == GemmLib::OneDnn) throw Error("cpu gemm: oneDNN requested in a build without it");
  cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, M, N,
              K, 1.0f, A, lda, B, ldb, beta, C, ldc);
}

void gemm(GemmLib lib, bool ta, bool tb, int M, int N, int K, const bf16* A, int lda,
          const bf16* B, int ldb, float beta, float* C, int ldc, const float* bias) {
  (void)lib;
  if (M <= 0 || N <= 0 || K <= 0) return;
#ifdef NLPTRAIN_HAVE_ONEDNN
  onednn_bf16_matmul(ta, tb, M, N, K, A, lda, B, ldb, beta, C, ldc, bias);
#else
  (void)ta, (void)tb, (void)A, (void)lda, (void)B, (void)ldb, (void)beta, (void)C, (void)ldc, (void)bias;
  throw Error("cpu gemm: bf16 operands need oneDNN, and this build has none");
#endif
}

}  // namespace nlp::cpu
