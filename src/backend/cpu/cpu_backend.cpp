// The CPU backend class: host memory (64-byte aligned, zeroed) and dispatch of every op to cpu_ops.h.
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

#include "backend/cpu/cpu_ops.h"
#include "backend/cpu/round.h"
#include "backend/cpu/staged.h"
#include "core/error.h"

extern "C" void openblas_set_num_threads(int);

namespace nlp {
namespace {

constexpr size_t kAlign = 64;

class CpuBackend final : public Backend {
 public:
  CpuBackend(int threads, Precision precision, const std::string& gemm, const std::string& bf16,
             bool bf16_weights)
      : precision_(precision), wcopy_on_(bf16_weights && precision == Precision::Bf16) {
    if (threads > 0) {
      omp_set_num_threads(threads);
      openblas_set_num_threads(threads);
    }
    std::string why;
    if (gemm == "onednn") {
      if (!cpu::onednn_available(&why)) throw Error(cat("run.cpu_gemm = onednn: ", why));
      lib_ = cpu::GemmLib::OneDnn;
    } else if (gemm == "auto") {
      lib_ = cpu::auto_gemm_lib();
    } else if (gemm != "openblas") {
      throw Error(cat("run.cpu_gemm: unknown value '", gemm, "' (expected auto, openblas or onednn)"));
    }
    if (bf16 != "auto" && bf16 != "emulate" && bf16 != "native")
      throw Error(cat("run.cpu_bf16: unknown value '", bf16, "' (expected auto, emulate or native)"));
    if (precision == Precision::Bf16 && bf16 == "native") {
      if (!cpu::native_bf16_available(&bf16_isa_))
        throw Error(cat("run.cpu_bf16 = native: ", bf16_isa_, "; use run.cpu_bf16 = emulate or auto"));
      native_bf16_ = true;
    } else if (precision == Precision::Bf16 && bf16 == "auto") {
      const cpu::Bf16Isa hw = cpu::bf16_isa();
      native_bf16_ = cpu::auto_native_bf16(hw, &bf16_auto_);
      bf16_isa_ = hw.isa;
    }
  }

  std::string name() const override { return "cpu"; }
  std::string details() const override {
    std::string d = cat("GEMMs: ", cpu::gemm_lib_description(lib_));
    if (precision_ == Precision::Bf16)
      d += cat(native_bf16_ ? cat(" | bf16: native (oneDNN, ", bf16_isa_, ")")
                            : std::string(" | bf16: emulated (operands rounded, fp32 GEMMs)"),
               bf16_auto_.empty() ? "" : cat(" (run.cpu_bf16 = auto, ", bf16_auto_, ")"));
    if (wcopy_on_) d += " | weights: persistent bf16 copy (run.bf16_weights)";
    return d;
  }

  // ---- memory ----
  void* alloc(size_t bytes) override {
    size_t rounded = (bytes + kAlign - 1) / kAlign * kAlign;
    if (rounded == 0) rounded = kAlign;
    void* p = std::aligned_alloc(kAlign, rounded);
    if (!p) throw Error(cat("cpu backend: out of host memory allocating ", bytes, " bytes"));
    std::memset(p, 0, rounded);
    return p;
  }
  void release(void* p) override { std::free(p); }
  void zero(void* p, size_t bytes) override {
    forget_ce_stats(p);
    zero_bytes(p, bytes);
    weights_written(static_cast<const float*>(p), bytes / sizeof(float));
  }
  // (zero's memset, in parallel pieces)
  void zero_bytes(void* p, size_t bytes) {
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
  void to_device(void* dst, const void* host_src, size_t bytes) override {
    forget_ce_stats(dst);
    if (bytes && dst != host_src) std::memmove(dst, host_src, bytes);
    weights_written(static_cast<const float*>(dst), bytes / sizeof(float));
  }
  void to_host(void* host_dst, const void* src, size_t bytes) override {
    if (bytes && host_dst != src) std::memmove(host_dst, src, bytes);
  }
  void copy(void* dst, const void* src, size_t bytes) override {
    forget_ce_stats(dst);
    if (bytes && dst != src) std::memmove(dst, src, bytes);
    weights_written(static_cast<const float*>(dst), bytes / sizeof(float));
  }

  // ---- run.profile's account (backend/op_account_backend.h): the GEMMs' operand casts timed apart ----
  void profile_label(const char* label) override {
    cast_label_ = label ? cat("cast: ", label) : std::string();
  }
  std::vector<ProfileTime> profile_times() override { return cast_times_; }

  // ---- the persistent bf16 copy of the weights (core/backend.h) ----
  void register_weights(const float* arena, size_t n) override {
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
  void weights_written(const float* p, size_t n) override {
    if (!warena_ || !n || p + n <= warena_ || p >= warena_ + wn_) return;
    const size_t lo = p > warena_ ? size_t(p - warena_) : 0;
    const size_t hi = std::min(wn_, size_t(p + n - warena_));
    const float* src = warena_;
    cpu::bf16* dst = wcopy_.data();
#pragma omp parallel for schedule(static) if (hi - lo >= 16384)
    for (size_t i = lo; i < hi; ++i) dst[i].bits = cpu::to_bf16_bits(src[i]);
  }
  const uint16_t* bf16_weights() const override {
    return warena_ ? reinterpret_cast<const uint16_t*>(wcopy_.data()) : nullptr;
  }

  // ---- embeddings ----
  // Every op below hands its kernel fp32 stand-ins of its views (cpu/staged.h): fp32 views are
  // their own memory; bf16 ones are widened on entry and rounded where the op stores them.
  void embedding_forward(Act out, const int32_t* ids, const int32_t* type_ids, const float* wte,
                         const float* wpe, const float* wtt, int B, int T, int C, int pos_offset,
                         const int32_t* pos_ids) override {
    cpu::Out o(out, size_t(B) * T * C);
    cpu::embedding_forward(o, ids, type_ids, wte, wpe, wtt, B, T, C, pos_offset, pos_ids);
  }
  void embedding_backward(float* dwte, float* dwpe, float* dwtt, CAct dout, const int32_t* ids,
                          const int32_t* type_ids, int B, int T, int C, int pos_offset,
                          const int32_t* pos_ids) override {
    cpu::In d(dout, size_t(B) * T * C);
    cpu::embedding_backward(dwte, dwpe, dwtt, d, ids, type_ids, B, T, C, pos_offset, pos_ids);
  }

  // ---- dense ----
  // Tf32/Bf16: the operands are rounded as the GPU's tensor cores read them (cpu/round.h); the bias,
  // the accumulation and the outputs stay fp32, and dbias sums the unrounded dout as the GPU does.
  // Native bf16 rounds the same way into bf16 copies that the GEMM library multiplies in hardware.
  void matmul_forward(Act out_v, CAct inp_v, const float* w, const float* bias, int M, int K, int N,
                      WLayout layout) override {
    forget_ce_stats(out_v.p);
    cpu::Out out_s(out_v, size_t(M) * N);
    cpu::In inp_s(inp_v, size_t(M) * K);
    float* out = out_s.get();
    const float* inp = inp_s.get();
    const cpu::bf16* w16 = persistent(w, size_t(K) * N);
    if (native_bf16_) {
      cpu::matmul_forward(lib_, out, to_bf16(0, inp, size_t(M) * K),
                          w16 ? w16 : to_bf16(1, w, size_t(K) * N), bias, M, K, N, layout);
    } else if (precision_ == Precision::Fp32) {
      cpu::matmul_forward(lib_, out, inp, w, bias, M, K, N, layout);
    } else {
      cpu::matmul_forward(lib_, out, rounded(0, inp, size_t(M) * K),
                          w16 ? widened(1, w16, size_t(K) * N) : rounded(1, w, size_t(K) * N), bias,
                          M, K, N, layout);
    }
  }
  void matmul_backward(Act dinp_v, float* dw, float* dbias, CAct dout_v, CAct inp_v, const float* w,
                       int M, int K, int N, WLayout layout) override {
    cpu::Acc dinp_s(dinp_v, size_t(M) * K);
    cpu::In dout_s(dout_v, size_t(M) * N);
    cpu::In inp_s(dw ? inp_v : CAct(), size_t(M) * K);
    float* dinp = dinp_s.get();
    const float* dout = dout_s.get();
    const float* inp = inp_s.get();
    if (native_bf16_) {
      const cpu::bf16* bd = to_bf16(0, dout, size_t(M) * N);
      const cpu::bf16* bi = dw ? to_bf16(1, inp, size_t(M) * K) : nullptr;
      const cpu::bf16* w16 = dinp ? persistent(w, size_t(K) * N) : nullptr;
      const cpu::bf16* bw = w16 ? w16 : dinp ? to_bf16(2, w, size_t(K) * N) : nullptr;
      cpu::matmul_backward(lib_, dinp, dw, bd, bi, bw, M, K, N, layout);
    } else if (precision_ == Precision::Fp32) {
      cpu::matmul_backward(lib_, dinp, dw, dout, inp, w, M, K, N, layout);
    } else {
      const float* rd = rounded(0, dout, size_t(M) * N);
      const float* ri = dw ? rounded(1, inp, size_t(M) * K) : nullptr;
      const cpu::bf16* w16 = dinp ? persistent(w, size_t(K) * N) : nullptr;
      const float* rw = w16 ? widened(2, w16, size_t(K) * N) : dinp ? rounded(2, w, size_t(K) * N) : nullptr;
      cpu::matmul_backward(lib_, dinp, dw, rd, ri, rw, M, K, N, layout);
    }
    if (dbias) cpu::matmul_dbias(dbias, dout, M, N);
  }

  // ---- layer norm ----
  void layernorm_forward(Act out, float* mean, float* rstd, CAct inp, const float* w,
                         const float* b, int N, int C, float eps) override {
    const size_t n = size_t(N) * C;
    cpu::In i(inp, n);
    cpu::Out o(out, n);
    cpu::layernorm_forward(o, mean, rstd, i, w, b, N, C, eps);
  }
  void layernorm_backward(Act dinp, float* dw, float* db, CAct dout, CAct inp, const float* w,
                          const float* mean, const float* rstd, int N, int C) override {
    const size_t n = size_t(N) * C;
    cpu::In d(dout, n), i(inp, n);
    cpu::Acc g(dinp, n);
    cpu::layernorm_backward(g, dw, db, d, i, w, mean, rstd, N, C);
  }
  // A bf16 res is stored rounded, and the layer norm reads the rounded value, as the GPU's
  // bf16 kernel does: the statistics belong to the residual stream the backward reads.
  void residual_layernorm_forward(Act res, Act out, float* mean, float* rstd, CAct x, CAct delta,
                                  const float* w, const float* b, int N, int C, float eps, float p,
                                  uint64_t seed, DropRows rows) override {
    NLP_ASSERT(!rows.token_key || rows.width == size_t(C));
    const size_t n = size_t(N) * C;
    if (!res.f32()) {  // res = x + dropout(delta) in fp32, rounded once; the norm of the rounded res
      std::vector<float> r(n);
      {
        cpu::In xi(x, n), di(delta, n);
        cpu::dropout_forward(r.data(), di, n, p, seed, rows.row, rows.row_key, rows.token_key,
                             rows.width);
        cpu::add(r.data(), r.data(), xi, n);
      }
      {
        cpu::Out ro(res, n);
        std::memcpy(ro.get(), r.data(), n * sizeof(float));
      }
      cpu::widen_bf16(r.data(), res.bf(), n);
      cpu::Out o(out, n);
      cpu::layernorm_forward(o, mean, rstd, r.data(), w, b, N, C, eps);
      return;
    }
    cpu::In xi(x, n), di(delta, n);
    cpu::Out o(out, n);
    cpu::residual_layernorm_forward(res.fp(), o, mean, rstd, xi, di, w, b, N, C, eps, p, seed,
                                    rows.row, rows.row_key, rows.token_key);
  }
  void layernorm_dropout_backward(Act dinp, Act ddelta, Act scratch, float* dw, float* db, CAct dout,
                                  CAct inp, const float* w, const float* mean, const float* rstd, int N,
                                  int C, float p, uint64_t seed, DropRows rows) override {
    (void)scratch;
    NLP_ASSERT(!rows.token_key || rows.width == size_t(C));
    const size_t n = size_t(N) * C;
    if (!dinp.f32() || !ddelta.f32()) {  // the bf16 GPU path's stores: the gradient, then each output
      std::vector<float> g(n, 0.0f);
      {
        cpu::In d(dout, n), i(inp, n);
        cpu::layernorm_backward(g.data(), dw, db, d, i, w, mean, rstd, N, C);
      }
      {
        cpu::Acc di(dinp, n);
        cpu::accumulate(di, g.data(), n);
      }
      cpu::Out dd(ddelta, n);
      std::memset(dd.get(), 0, n * sizeof(float));
      cpu::dropout_backward(dd, g.data(), n, p, seed, rows.row, rows.row_key, rows.token_key, rows.width);
      return;
    }
    cpu::In d(dout, n), i(inp, n);
    cpu::Acc di(dinp, n);
    cpu::layernorm_dropout_backward(di, ddelta.fp(), dw, db, d, i, w, mean, rstd, N, C, p, seed,
                                    rows.row, rows.row_key, rows.token_key);
  }

  // ---- elementwise ----
  void tanh_forward(Act out, CAct inp, size_t N) override {
    cpu::In i(inp, N);
    cpu::Out o(out, N);
    cpu::tanh_forward(o, i, N);
  }
  void tanh_backward(Act dinp, CAct out, CAct dout, size_t N) override {
    cpu::In o(out, N), d(dout, N);
    cpu::Acc g(dinp, N);
    cpu::tanh_backward(g, o, d, N);
  }
  // The strided tensor a row op reads or writes spans strided_extent elements (a bf16 one is
  // staged whole).
  void rows_gather(Act out, CAct inp, int n, int C, size_t stride, const int32_t* idx) override {
    cpu::In i(inp, strided_extent(n, C, stride, idx));
    cpu::Out o(out, size_t(n) * C);
    cpu::rows_gather(o, i, n, C, stride, idx);
  }
  void rows_scatter_add(Act dinp, CAct dout, int n, int C, size_t stride,
                        const int32_t* idx) override {
    NLP_ASSERT(!dinp.write);  // only its rows are written: never the tensor's only writer
    cpu::In d(dout, size_t(n) * C);
    cpu::Acc g(dinp, strided_extent(n, C, stride, idx));
    cpu::rows_scatter_add(g, d, n, C, stride, idx);
  }
  void gelu_forward(Act out, CAct inp, size_t N, Gelu form) override {
    cpu::In i(inp, N);
    cpu::Out o(out, N);
    cpu::gelu_forward(o, i, N, form);
  }
  void gelu_backward(Act dinp, CAct inp, CAct dout, size_t N, Gelu form) override {
    cpu::In i(inp, N), d(dout, N);
    cpu::Acc g(dinp, N);
    cpu::gelu_backward(g, i, d, N, form);
  }
  void add(Act out, CAct a, CAct b, size_t N) override {
    cpu::In ia(a, N), ib(b, N);
    cpu::Out o(out, N);
    cpu::add(o, ia, ib, N);
  }
  void accumulate(Act dst, CAct src, size_t N) override {
    cpu::In s(src, N);
    Act d = dst;
    d.write = false;  // accumulate is an accumulation whatever the flag
    cpu::Acc g(d, N);
    cpu::accumulate(g, s, N);
  }
  void scale(Act x, float s, size_t N) override {
    Act d = x;
    d.write = false;
    cpu::Acc g(d, N);
    cpu::scale(g, s, N);
  }
  void copy_view(Act dst, CAct src, size_t N) override {
    if (dst.dt == src.dt) {
      copy(dst.p, src.p, N * dtype_bytes(dst.dt));
      return;
    }
    cpu::In s(src, N);
    cpu::Out o(dst, N);
    std::memcpy(o.get(), s.get(), N * sizeof(float));
  }
  void dropout_forward(Act out, CAct inp, size_t N, float p, uint64_t seed, DropRows rows) override {
    cpu::In i(inp, N);
    cpu::Out o(out, N);
    cpu::dropout_forward(o, i, N, p, seed, rows.row, rows.row_key, rows.token_key, rows.width);
  }
  void dropout_backward(Act dinp, CAct dout, size_t N, float p, uint64_t seed,
                        DropRows rows) override {
    cpu::In d(dout, N);
    cpu::Acc g(dinp, N);
    cpu::dropout_backward(g, d, N, p, seed, rows.row, rows.row_key, rows.token_key, rows.width);
  }

  // ---- attention ----
  // The forward keeps two floats per query row; the backward recomputes the probabilities from them
  // and needs no scratch (attention.cpp)
  size_t attention_saved_floats(int B, int T, int NH, int HS, DType) override {
    (void)HS;
    return cpu::attention_stats_floats(B, T, NH);
  }
  size_t attention_scratch_floats(int B, int T, int NH, int HS, DType) override {
    (void)B, (void)T, (void)NH, (void)HS;
    return 0;
  }
  void attention_forward(Act out, float* att, CAct qkv, const int32_t* attn_mask, bool causal,
                         float dropout_p, uint64_t seed, int B, int T, int NH, int HS, int T_key,
                         const int32_t* token_key, int /*examples*/) override {
    const size_t n = size_t(B) * T * NH * HS;
    cpu::In q(qkv, 3 * n);
    cpu::Out o(out, n);
    cpu::attention_forward(o, att, q, attn_mask, causal, dropout_p, seed, B, T, NH, HS, T_key,
                           token_key);
  }
  void attention_backward(Act dqkv, float* scratch, CAct dout, CAct /*out*/, CAct qkv,
                          const float* att,
                          const int32_t* attn_mask, bool causal, float dropout_p, uint64_t seed,
                          int B, int T, int NH, int HS, int T_key, const int32_t* token_key,
                          int /*examples*/) override {
    const size_t n = size_t(B) * T * NH * HS;
    cpu::In d(dout, n), q(qkv, 3 * n);
    cpu::Acc g(dqkv, 3 * n);
    cpu::attention_backward(g, scratch, d, q, att, attn_mask, causal, dropout_p, seed, B, T, NH, HS,
                            T_key, token_key);
  }
  void attention_decode(float* out, const float* qkv_new, float* kcache, float* vcache, int B,
                        int pos, int Tmax, int NH, int HS) override {
    cpu::attention_decode(out, qkv_new, kcache, vcache, B, pos, Tmax, NH, HS);
  }

  // ---- losses ----
  // The forward keeps each row's max and sum of exp; a backward on the same logits (pointer, M, V,
  // unchanged since: the contract of core/backend.h; forgotten when this backend writes that buffer)
  // reuses them: one read of the [M,V] logits instead of three, bitwise the same gradient.
  void crossentropy_forward(float* losses, const float* logits, const int32_t* targets, int M,
                            int V) override {
    if (ce_mx_.size() < size_t(std::max(M, 0))) ce_mx_.resize(M), ce_se_.resize(M);
    cpu::crossentropy_forward(losses, logits, targets, M, V, ce_mx_.data(), ce_se_.data());
    ce_logits_ = logits, ce_M_ = M, ce_V_ = V;
  }
  void crossentropy_backward(float* dlogits, const float* logits, const int32_t* targets,
                             float dloss, int M, int V) override {
    const bool reuse = ce_logits_ == logits && ce_M_ == M && ce_V_ == V;
    cpu::crossentropy_backward(dlogits, logits, targets, dloss, M, V, reuse ? ce_mx_.data() : nullptr,
                               reuse ? ce_se_.data() : nullptr);
  }
  void segment_crossentropy_forward(float* losses, const float* x, const int32_t* first,
                                    const int32_t* len, const int32_t* targets, int E) override {
    cpu::segment_crossentropy_forward(losses, x, first, len, targets, E);
  }
  void segment_crossentropy_backward(float* dx, const float* x, const int32_t* first, const int32_t* len,
                                     const int32_t* targets, float dloss, int E) override {
    cpu::segment_crossentropy_backward(dx, x, first, len, targets, dloss, E);
  }

  // ---- the LM head fused with its loss ----
  // The chunk's logits live in scratch [chunk, Vp]; every GEMM runs over the V real columns with
  // leading dimension Vp, so the padding changes strides only: the same products, the same bits
  // as Vp = V. The operands are rounded (or converted to bf16) once per call, as matmul_* round them.
  size_t lm_head_scratch_floats(int chunk, int C, int V, int Vp) override {
    (void)C, (void)V;
    return size_t(chunk) * Vp;
  }
  void lm_head_crossentropy(float* losses, Act dx_v, float* dw, CAct x_v, const float* w,
                            const int32_t* targets, float dloss, int M, int C, int V, int Vp,
                            int chunk, float* scratch) override {
    NLP_ASSERT(Vp >= V && chunk > 0);
    if (M <= 0) return;
    forget_ce_stats(scratch);
    const bool bwd = bool(dx_v) || dw;
    const size_t nx = size_t(M) * C, nw = size_t(V) * C;
    cpu::In x(x_v, nx);
    cpu::Acc dxs(dx_v, nx);
    float* dx = dxs.get();
    const float *xf = x, *wf = w;
    const cpu::bf16 *xb = nullptr, *wb = nullptr;
    if (native_bf16_) {
      xb = to_bf16(1, x, nx);
      wb = to_bf16(2, w, nw);
    } else if (precision_ != Precision::Fp32) {
      xf = rounded(1, x, nx);
      wf = rounded(2, w, nw);
    }
    for (int r0 = 0; r0 < M; r0 += chunk) {
      const int rows = std::min(chunk, M - r0);
      const size_t xo = size_t(r0) * C;
      // logits[rows, V] (row stride Vp) = x[r0.., C] @ w[V, C]^T
      if (native_bf16_)
        cpu::gemm(lib_, false, true, rows, V, C, xb + xo, C, wb, C, 0.0f, scratch, Vp);
      else
        cpu::gemm(lib_, false, true, rows, V, C, xf + xo, C, wf, C, 0.0f, scratch, Vp);
      cpu::crossentropy_rows(losses + r0, scratch, Vp, targets + r0, dloss, rows, V, bwd);
      if (!bwd) continue;
      // dx[rows, C] += dlogits @ w;  dw[V, C] += dlogits^T @ x (matmul_backward's OutIn products)
      if (native_bf16_) {
        const cpu::bf16* db = to_bf16(0, scratch, size_t(rows) * Vp);
        if (dx) cpu::gemm(lib_, false, false, rows, C, V, db, Vp, wb, C, 1.0f, dx + xo, C);
        if (dw) cpu::gemm(lib_, true, false, V, C, rows, db, Vp, xb + xo, C, 1.0f, dw, C);
      } else {
        const float* d = precision_ == Precision::Fp32 ? scratch : rounded(0, scratch, size_t(rows) * Vp);
        if (dx) cpu::gemm(lib_, false, false, rows, C, V, d, Vp, wf, C, 1.0f, dx + xo, C);
        if (dw) cpu::gemm(lib_, true, false, V, C, rows, d, Vp, xf + xo, C, 1.0f, dw, C);
      }
    }
  }

  // ---- reductions, optimizer ----
  double sum(const float* x, size_t N) override { return cpu::sum(x, N); }
  double sumsq(const float* x, size_t N) override { return cpu::sumsq(x, N); }
  void sum_into(double* acc, const float* x, size_t N, double scale) override {
    *acc += scale * cpu::sum(x, N);
  }
  void adamw_update(float* param, const float* grad, float* m, float* v, size_t N, float lr,
                    float beta1, float beta2, float eps, float weight_decay, float grad_scale,
                    int t) override {
    cpu::adamw_update(param, grad, m, v, N, lr, beta1, beta2, eps, weight_decay, grad_scale, t,
                      nullptr, copy_of(param, N));
  }
  void adamw_update_spans(float* param, float* grad, float* m, float* v, const std::vector<AdamWSpan>& spans,
                          float lr, float beta1, float beta2, float eps, float grad_scale, int t,
                          bool zero_grad) override {
    for (const AdamWSpan& sp : spans)
      cpu::adamw_update(param + sp.offset, grad + sp.offset, m + sp.offset, v + sp.offset, sp.numel, lr, beta1,
                        beta2, eps, sp.weight_decay, grad_scale, t, zero_grad ? grad + sp.offset : nullptr,
                        copy_of(param + sp.offset, sp.numel));
  }

 private:
  // With a profile label set, an operand cast's host time is added to "cast: <label>".
  struct CastTimer {
    CpuBackend& b;
    std::chrono::steady_clock::time_point t0 = std::chrono::steady_clock::now();
    explicit CastTimer(CpuBackend& be) : b(be) {}
    ~CastTimer() {
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
  };

  // Elements of a [rows, stride] tensor that a row op over n rows of width C touches: up to row
  // r(i) = idx[i] (host memory on this backend), or i without idx.
  static size_t strided_extent(int n, int C, size_t stride, const int32_t* idx) {
    if (n <= 0) return 0;
    size_t rows = size_t(n);
    if (idx)
      for (int i = 0; i < n; ++i) rows = std::max(rows, size_t(idx[i]) + 1);
    return (rows - 1) * stride + size_t(C);
  }

  // The persistent copy of the weight w[n] when w lies inside the registered arena, else null.
  const cpu::bf16* persistent(const float* w, size_t n) const {
    if (!warena_ || w < warena_ || w + n > warena_ + wn_) return nullptr;
    return wcopy_.data() + (w - warena_);
  }
  uint16_t* copy_of(const float* p, size_t n) {
    return reinterpret_cast<uint16_t*>(const_cast<cpu::bf16*>(persistent(p, n)));
  }
  // x[n] (bf16) widened to fp32 (exact) in scratch slot `slot`: the values rounded() gives for the
  // fp32 weights x was rounded from (round_mantissa and to_bf16_bits round finite values alike).
  const float* widened(int slot, const cpu::bf16* x, size_t n) {
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
  const float* rounded(int slot, const float* x, size_t n) {
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
  const cpu::bf16* to_bf16(int slot, const float* x, size_t n) {
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
  static void stream_zero(char* dst, size_t n) {
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

  void forget_ce_stats(const void* p) {
    if (p == ce_logits_) ce_logits_ = nullptr;
  }

  Precision precision_;
  const void* ce_logits_ = nullptr;  // the logits of the last crossentropy_forward
  int ce_M_ = 0, ce_V_ = 0;
  std::vector<float> ce_mx_;
  std::vector<double> ce_se_;
  cpu::GemmLib lib_ = cpu::GemmLib::OpenBlas;
  bool native_bf16_ = false;
  std::string bf16_isa_;
  std::string bf16_auto_;  // run.cpu_bf16 = auto: what it picked and why (cpu::auto_native_bf16)
  std::vector<float> round_buf_[3];
  std::vector<cpu::bf16> bf16_buf_[3];
  bool wcopy_on_ = false;             // run.bf16_weights with Precision::Bf16
  const float* warena_ = nullptr;     // the registered weights (register_weights)
  size_t wn_ = 0;
  std::vector<cpu::bf16> wcopy_;      // their bf16 rounding
  std::string cast_label_;                  // run.profile: "cast: <label>" of the op running
  std::vector<ProfileTime> cast_times_;     // the casts' time per such label
};

}  // namespace

bool cpu_native_bf16(std::string* why) { return cpu::native_bf16_available(why); }
bool cpu_auto_native_bf16(std::string* why) { return cpu::auto_native_bf16(cpu::bf16_isa(), why); }

std::unique_ptr<Backend> make_cpu_backend(int threads, Precision precision,
                                          const std::string& gemm, const std::string& bf16,
                                          bool bf16_weights) {
  return std::make_unique<CpuBackend>(threads, precision, gemm, bf16, bf16_weights);
}

}  // namespace nlp
