// run.profile's account: labels, costs and times of every op call (op_account_backend.h).
#include "backend/op_account_backend.h"

#include <type_traits>

#include "core/error.h"

namespace nlp {

using account::Cost;
using AD = account::DType;
namespace ac = account;

namespace {
double ms_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}
constexpr const char* kElem = "elementwise";
// The cost of an op over activations stored as v's dtype: the account's element costs count fp32
// arrays, so a bf16 op moves half the bytes (its fp32 statistics and weights, a small part of a
// layer norm's or an embedding's traffic, are counted at half too).
Cost at(Cost c, CAct v) {
  if (v.dt == nlp::DType::BF16) c.read *= 0.5, c.written *= 0.5;
  return c;
}
AD ad(CAct v) { return v.dt == nlp::DType::BF16 ? AD::BF16 : AD::F32; }
}  // namespace

AccountBackend::AccountBackend(Backend& inner, int vocab, Precision precision)
    : in_(inner), vocab_(vocab), bf16_(precision == Precision::Bf16) {}

void AccountBackend::set_profiling(bool on) {
  if (on && !on_) {
    // a copy and a GEMM large enough to run at the device's rates: 1 GiB and 8192^3 on a GPU
    // (about 0.5 ms and 1.1 ms on an H200); on the CPU 64 MiB and 768^3
    const bool gpu = in_.name() == "cuda";
    start(gpu ? size_t(1) << 30 : size_t(64) << 20, gpu ? 8192 : 768);
  } else if (!on) {
    on_ = false;
    in_.set_profiling(false);
  }
}

void AccountBackend::start(size_t copy_bytes, int gemm_n) {
  rates_ = ac::measure_rates(in_, copy_bytes, gemm_n, bf16_);
  in_.set_profiling(true);
  host_timed_ = in_.name() != "cuda";  // the CUDA backend times its ops with events (profile_times)
  acct_.clear();
  has_paths_ = in_.path_counts(&paths0_);  // after the rate measurement's GEMM and copy
  on_ = true;
}

std::string AccountBackend::report(long steps, double step_ms, std::string* json) {
  if (!on_) return {};
  // The CUDA backend's events time every label; the CPU backend times only the GEMMs' operand casts
  // ("cast: <gemm label>"), which the host clock counted inside their GEMM's call: taken out of it.
  for (const ProfileTime& t : in_.profile_times()) {
    acct_.time(t.label, t.ms, t.calls);
    if (host_timed_ && t.label.rfind("cast: ", 0) == 0) acct_.time(t.label.substr(6), -t.ms, 0);
  }
  on_ = false;  // the times are taken once
  // What ran (core/path_counts.h) over the accounted steps: one line under the table and
  // "gpu_paths" in the object, as in the log's "done:" block and summary.json.
  PathCounts now;
  const bool paths = has_paths_ && in_.path_counts(&now);
  if (json) {
    *json = acct_.json(rates_, steps, step_ms);
    if (paths && !json->empty() && json->back() == '}') {
      json->pop_back();
      *json += cat(", \"gpu_paths\": ", path_counts_json(now - paths0_), "}");
    }
  }
  std::string table = acct_.table(rates_, steps, step_ms);
  if (paths) {
    if (!table.empty() && table.back() != '\n') table += '\n';
    table += path_counts_line(now - paths0_, cat("over these ", steps, " steps"));
  }
  return table;
}

template <class F>
auto AccountBackend::op(const char* label, const char* family, const Cost& c, F&& f) -> decltype(f()) {
  if (!on_) return f();
  acct_.add(label, family, c);
  in_.profile_label(label);
  struct Unlabel {
    Backend& b;
    ~Unlabel() { b.profile_label(nullptr); }
  } unlabel{in_};
  const auto t0 = std::chrono::steady_clock::now();
  if constexpr (std::is_void_v<decltype(f())>) {
    f();
    if (host_timed_) acct_.time(label, ms_since(t0), 1);
  } else {
    auto r = f();
    if (host_timed_) acct_.time(label, ms_since(t0), 1);
    return r;
  }
}

void AccountBackend::register_weights(const float* arena, size_t n) {
  in_.register_weights(arena, n);
  if (n == 0 && arena != arena_) return;
  arena_ = n ? arena : nullptr;
  arena_n_ = n;
}

bool AccountBackend::has_copy(const float* w, size_t n) const {
  return in_.bf16_weights() && arena_ && w >= arena_ && w + n <= arena_ + arena_n_;
}

// The cost of the bf16 operand casts a GEMM makes, under "cast: <its label>" (the label the CUDA
// backend times them under).
void AccountBackend::cast_cost(const char* gemm_label, int64_t n) {
  if (!on_ || n <= 0) return;
  static const char* const names[] = {"cast: gemm lm head (forward)", "cast: gemm lm head (backward)",
                                      "cast: gemm blocks (forward)", "cast: gemm blocks (backward)"};
  const std::string want = std::string("cast: ") + gemm_label;
  for (const char* nm : names)
    if (want == nm) acct_.add(nm, "cast (bf16 operands)", ac::cast(n, AD::F32, AD::BF16));
}

// ---- memory ----
void AccountBackend::zero(void* p, size_t bytes) {
  op("memset", "memset", ac::memset(int64_t(bytes)), [&] { in_.zero(p, bytes); });
}
void AccountBackend::to_device(void* dst, const void* src, size_t bytes) {
  op("host to device", "host transfer", Cost{}, [&] { in_.to_device(dst, src, bytes); });
}
void AccountBackend::to_host(void* dst, const void* src, size_t bytes) {
  op("device to host", "host transfer", Cost{}, [&] { in_.to_host(dst, src, bytes); });
}
void AccountBackend::copy(void* dst, const void* src, size_t bytes) {
  Cost c;
  c.read = c.written = double(bytes);
  op("copy", "copy", c, [&] { in_.copy(dst, src, bytes); });
}

// ---- embeddings ----
void AccountBackend::embedding_forward(Act out, const int32_t* ids, const int32_t* type_ids,
                                       const float* wte, const float* wpe, const float* wtt, int B, int T,
                                       int C, int pos_offset, const int32_t* pos_ids) {
  wte_ = wte;
  op("embedding_forward", "embedding", ac::embedding_forward(int64_t(B) * T, C),
     [&] { in_.embedding_forward(out, ids, type_ids, wte, wpe, wtt, B, T, C, pos_offset, pos_ids); });
}
void AccountBackend::embedding_backward(float* dwte, float* dwpe, float* dwtt, CAct dout,
                                        const int32_t* ids, const int32_t* type_ids, int B, int T, int C,
                                        int pos_offset, const int32_t* pos_ids) {
  Cost c = ac::embedding_forward(int64_t(B) * T, C);  // the same rows, read-modify-written
  c.read += c.written;
  op("embedding_backward", "embedding", c, [&] {
    in_.embedding_backward(dwte, dwpe, dwtt, dout, ids, type_ids, B, T, C, pos_offset, pos_ids);
  });
}

// ---- dense layer: operands at the GEMM's precision; in bf16 the casts apart ----
const char* AccountBackend::gemm_label(const float* w, int N, bool backward) const {
  if (head(w, N)) return backward ? "gemm lm head (backward)" : "gemm lm head (forward)";
  return backward ? "gemm blocks (backward)" : "gemm blocks (forward)";
}
Cost AccountBackend::gemm_forward_cost(const char* label, CAct out, CAct inp, const float* w,
                                       const float* bias, int M, int K, int N) {
  const AD t = bf16_ ? AD::BF16 : AD::F32;
  if (bf16_ && on_) {  // the casts: an fp32 activation and a weight without its persistent copy
    const bool copy = has_copy(w, size_t(K) * N);
    cast_cost(label, (inp.f32() ? int64_t(M) * K : 0) + (copy ? 0 : int64_t(K) * N));
  }
  return ac::gemm(M, N, K, inp.f32() ? t : AD::BF16, t, ad(out), false, bias != nullptr);
}
Cost AccountBackend::gemm_backward_cost(const char* label, CAct dinp, bool dinp_write,
                                        const float* dw, const float* dbias, CAct dout, CAct inp,
                                        const float* w, int M, int K, int N) {
  const AD t = bf16_ ? AD::BF16 : AD::F32;
  Cost c;
  const AD td = dout.f32() ? t : AD::BF16, ti = inp.f32() ? t : AD::BF16;
  if (dinp) c += ac::gemm(M, K, N, td, t, ad(dinp), !dinp_write);  // dinp[M,K] += dout[M,N] W^T
  if (dw) c += ac::gemm(K, N, M, ti, td, AD::F32, true);           // dW[K,N] += inp^T dout
  if (dbias) {  // dbias[N] += colsum(dout)
    c += at(ac::elementwise(int64_t(M) * N, 1, 0, 1), dout);
    c += ac::elementwise(N, 1, 1, 0);
  }
  if (bf16_ && on_ && (dinp || dw)) {
    const bool copy = has_copy(w, size_t(K) * N);
    cast_cost(label, (dout.f32() ? int64_t(M) * N : 0) + (dw && inp.f32() ? int64_t(M) * K : 0) +
                         (dinp && !copy ? int64_t(K) * N : 0));
  }
  return c;
}

void AccountBackend::matmul_forward(Act out, CAct inp, const float* w, const float* bias,
                                    int M, int K, int N, WLayout layout) {
  const char* label = gemm_label(w, N, false);
  op(label, head(w, N) ? "gemm (lm head)" : "gemm (blocks)",
     gemm_forward_cost(label, out, inp, w, bias, M, K, N),
     [&] { in_.matmul_forward(out, inp, w, bias, M, K, N, layout); });
}
void AccountBackend::matmul_backward(Act dinp, float* dw, float* dbias, CAct dout,
                                     CAct inp, const float* w, int M, int K, int N,
                                     WLayout layout) {
  const char* label = gemm_label(w, N, true);
  op(label, head(w, N) ? "gemm (lm head)" : "gemm (blocks)",
     gemm_backward_cost(label, dinp, dinp.write, dw, dbias, dout, inp, w, M, K, N),
     [&] { in_.matmul_backward(dinp, dw, dbias, dout, inp, w, M, K, N, layout); });
}
void AccountBackend::matmul_gelu_forward(Act out, Act pre, CAct inp, const float* w,
                                         const float* bias, int M, int K, int N, WLayout layout,
                                         Gelu form) {
  const char* label = gemm_label(w, N, false);
  Cost c = gemm_forward_cost(label, pre, inp, w, bias, M, K, N);  // pre = inp @ W + bias
  c += at(ac::elementwise(int64_t(M) * N, 0, 1, 10), out);       // out = gelu(pre), from registers
  op(label, head(w, N) ? "gemm (lm head)" : "gemm (blocks)", c,
     [&] { in_.matmul_gelu_forward(out, pre, inp, w, bias, M, K, N, layout, form); });
}
void AccountBackend::matmul_dgelu_backward(Act dpre, float* dw, float* dbias, CAct dout, CAct h,
                                           CAct pre, const float* w, int M, int K, int N,
                                           WLayout layout, Gelu form, Act scratch) {
  const char* label = gemm_label(w, N, true);
  Cost c = gemm_backward_cost(label, dpre, dpre.write, dw, dbias, dout, h, w, M, K, N);
  if (dpre) c += at(ac::elementwise(int64_t(M) * K, 1, 0, 15), pre);  // gelu'(pre) times the product
  op(label, head(w, N) ? "gemm (lm head)" : "gemm (blocks)", c, [&] {
    in_.matmul_dgelu_backward(dpre, dw, dbias, dout, h, pre, w, M, K, N, layout, form, scratch);
  });
}

// ---- layer norm ----
void AccountBackend::layernorm_forward(Act out, float* mean, float* rstd, CAct inp,
                                       const float* w, const float* b, int N, int C, float eps) {
  op("layernorm_forward", "layernorm", at(ac::layernorm_forward(N, C), out),
     [&] { in_.layernorm_forward(out, mean, rstd, inp, w, b, N, C, eps); });
}
void AccountBackend::layernorm_backward(Act dinp, float* dw, float* db, CAct dout,
                                        CAct inp, const float* w, const float* mean,
                                        const float* rstd, int N, int C) {
  op("layernorm_backward", "layernorm", at(ac::layernorm_backward(N, C), dinp),
     [&] { in_.layernorm_backward(dinp, dw, db, dout, inp, w, mean, rstd, N, C); });
}
void AccountBackend::residual_layernorm_forward(Act res, Act out, float* mean, float* rstd,
                                                CAct x, CAct delta, const float* w,
                                                const float* b, int N, int C, float eps, float p,
                                                uint64_t seed, DropRows rows) {
  Cost c = ac::layernorm_forward(N, C);
  c += ac::elementwise(int64_t(N) * C, 2, 0, 2);  // x and delta read; res written by the LN's read
  c.written += 4.0 * double(N) * C;              // res
  c.read -= 4.0 * double(N) * C;                 // the LN reads res from registers, not memory
  op("residual_layernorm_forward", "layernorm", at(c, res), [&] {
    in_.residual_layernorm_forward(res, out, mean, rstd, x, delta, w, b, N, C, eps, p, seed, rows);
  });
}
void AccountBackend::layernorm_dropout_backward(Act dinp, Act ddelta, Act scratch, float* dw,
                                                float* db, CAct dout, CAct inp,
                                                const float* w, const float* mean, const float* rstd,
                                                int N, int C, float p, uint64_t seed, DropRows rows) {
  Cost c = ac::layernorm_backward(N, C);
  c.written += 4.0 * double(N) * C;  // ddelta
  op("layernorm_dropout_backward", "layernorm", at(c, dinp), [&] {
    in_.layernorm_dropout_backward(dinp, ddelta, scratch, dw, db, dout, inp, w, mean, rstd, N, C, p, seed,
                                   rows);
  });
}

// ---- elementwise ----
void AccountBackend::gelu_forward(Act out, CAct inp, size_t N, Gelu form) {
  op("gelu_forward", kElem, at(ac::elementwise(int64_t(N), 1, 1, 10), out), [&] { in_.gelu_forward(out, inp, N, form); });
}
void AccountBackend::gelu_backward(Act dinp, CAct inp, CAct dout, size_t N, Gelu form) {
  op("gelu_backward", kElem, at(ac::elementwise(int64_t(N), 3, 1, 15), dinp),
     [&] { in_.gelu_backward(dinp, inp, dout, N, form); });
}
void AccountBackend::add(Act out, CAct a, CAct b, size_t N) {
  op("add", kElem, at(ac::elementwise(int64_t(N), 2, 1), out), [&] { in_.add(out, a, b, N); });
}
void AccountBackend::accumulate(Act dst, CAct src, size_t N) {
  op("accumulate", kElem, at(ac::elementwise(int64_t(N), 2, 1), dst), [&] { in_.accumulate(dst, src, N); });
}
void AccountBackend::copy_view(Act dst, CAct src, size_t N) {
  Cost c;
  c.read = double(N) * double(dtype_bytes(src.dt));
  c.written = double(N) * double(dtype_bytes(dst.dt));
  op(dst.dt == src.dt ? "copy" : "convert", dst.dt == src.dt ? "copy" : "cast (activations)", c,
     [&] { in_.copy_view(dst, src, N); });
}
void AccountBackend::scale(Act x, float s, size_t N) {
  op("scale", kElem, at(ac::elementwise(int64_t(N), 1, 1), x), [&] { in_.scale(x, s, N); });
}
void AccountBackend::tanh_forward(Act out, CAct inp, size_t N) {
  op("tanh_forward", kElem, at(ac::elementwise(int64_t(N), 1, 1, 5), out), [&] { in_.tanh_forward(out, inp, N); });
}
void AccountBackend::tanh_backward(Act dinp, CAct out, CAct dout, size_t N) {
  op("tanh_backward", kElem, at(ac::elementwise(int64_t(N), 3, 1, 3), dinp),
     [&] { in_.tanh_backward(dinp, out, dout, N); });
}
void AccountBackend::rows_gather(Act out, CAct inp, int n, int C, size_t stride,
                                 const int32_t* idx) {
  op("rows_gather", kElem, at(ac::elementwise(int64_t(n) * C, 1, 1, 0), out),
     [&] { in_.rows_gather(out, inp, n, C, stride, idx); });
}
void AccountBackend::rows_scatter_add(Act dinp, CAct dout, int n, int C, size_t stride,
                                      const int32_t* idx) {
  op("rows_scatter_add", kElem, at(ac::elementwise(int64_t(n) * C, 2, 1), dinp),
     [&] { in_.rows_scatter_add(dinp, dout, n, C, stride, idx); });
}
void AccountBackend::dropout_forward(Act out, CAct inp, size_t N, float p, uint64_t seed,
                                     DropRows rows) {
  op("dropout_forward", kElem, at(ac::elementwise(int64_t(N), 1, 1, 2), out),
     [&] { in_.dropout_forward(out, inp, N, p, seed, rows); });
}
void AccountBackend::dropout_backward(Act dinp, CAct dout, size_t N, float p, uint64_t seed,
                                      DropRows rows) {
  op("dropout_backward", kElem, at(ac::elementwise(int64_t(N), 2, 1, 2), dinp),
     [&] { in_.dropout_backward(dinp, dout, N, p, seed, rows); });
}

// ---- attention ----
void AccountBackend::attention_forward(Act out, float* att, CAct qkv, const int32_t* attn_mask,
                                       bool causal, float dropout_p, uint64_t seed, int B, int T, int NH,
                                       int HS, int T_key, const int32_t* token_key, int examples) {
  op("attention_forward", "attention", at(ac::attention_forward(B, T, NH, HS, causal), out), [&] {
    in_.attention_forward(out, att, qkv, attn_mask, causal, dropout_p, seed, B, T, NH, HS, T_key, token_key,
                          examples);
  });
}
void AccountBackend::attention_backward(Act dqkv, float* scratch, CAct dout, CAct out, CAct qkv,
                                        const float* att, const int32_t* attn_mask, bool causal,
                                        float dropout_p, uint64_t seed, int B, int T, int NH, int HS,
                                        int T_key, const int32_t* token_key, int examples) {
  op("attention_backward", "attention", at(ac::attention_backward(B, T, NH, HS, causal), dqkv), [&] {
    in_.attention_backward(dqkv, scratch, dout, out, qkv, att, attn_mask, causal, dropout_p, seed, B, T, NH, HS,
                           T_key, token_key, examples);
  });
}
void AccountBackend::attention_decode(float* out, const float* qkv_new, float* kcache, float* vcache, int B,
                                      int pos, int Tmax, int NH, int HS) {
  op("attention_decode", "attention", ac::attention_forward(B, pos + 1, NH, HS, false),
     [&] { in_.attention_decode(out, qkv_new, kcache, vcache, B, pos, Tmax, NH, HS); });
}

// ---- losses ----
void AccountBackend::crossentropy_forward(float* losses, const float* logits, const int32_t* targets,
                                          int M, int V) {
  op("crossentropy_forward", "cross-entropy", ac::crossentropy_forward(M, V),
     [&] { in_.crossentropy_forward(losses, logits, targets, M, V); });
}
void AccountBackend::crossentropy_backward(float* dlogits, const float* logits, const int32_t* targets,
                                           float dloss, int M, int V) {
  op("crossentropy_backward", "cross-entropy", ac::crossentropy_backward(M, V),
     [&] { in_.crossentropy_backward(dlogits, logits, targets, dloss, M, V); });
}
void AccountBackend::segment_crossentropy_forward(float* losses, const float* x, const int32_t* first,
                                                  const int32_t* len, const int32_t* targets, int E) {
  op("segment_crossentropy_forward", "cross-entropy", Cost{},
     [&] { in_.segment_crossentropy_forward(losses, x, first, len, targets, E); });
}
void AccountBackend::segment_crossentropy_backward(float* dx, const float* x, const int32_t* first,
                                                   const int32_t* len, const int32_t* targets, float dloss,
                                                   int E) {
  op("segment_crossentropy_backward", "cross-entropy", Cost{},
     [&] { in_.segment_crossentropy_backward(dx, x, first, len, targets, dloss, E); });
}

void AccountBackend::lm_head_crossentropy(float* losses, Act dx, float* dw, CAct x,
                                          const float* w, const int32_t* targets, float dloss, int M,
                                          int C, int V, int Vp, int chunk, float* scratch) {
  const AD t = bf16_ ? AD::BF16 : AD::F32;
  Cost c = ac::gemm(M, V, C, t, t, AD::F32, false);  // logits[M,V] = x[M,C] wte^T
  c += ac::crossentropy_forward(M, V);
  if (bool(dx) || dw) {
    c += ac::crossentropy_backward(M, V);
    if (dx) c += ac::gemm(M, C, V, t, t, AD::F32, true);  // dx[M,C] += dlogits[M,V] wte
    if (dw) c += ac::gemm(V, C, M, t, t, AD::F32, true);  // dwte[V,C] += dlogits^T x
  }
  op("lm_head_crossentropy", "gemm (lm head)", c,
     [&] { in_.lm_head_crossentropy(losses, dx, dw, x, w, targets, dloss, M, C, V, Vp, chunk, scratch); });
}

// ---- reductions, optimizer ----
double AccountBackend::sum(const float* x, size_t N) {
  return op("sum", "reduction", ac::elementwise(int64_t(N), 1, 0), [&] { return in_.sum(x, N); });
}
double AccountBackend::sumsq(const float* x, size_t N) {
  return op("sumsq", "reduction", ac::elementwise(int64_t(N), 1, 0, 2), [&] { return in_.sumsq(x, N); });
}
void AccountBackend::sum_into(double* acc, const float* x, size_t N, double scale) {
  op("sum_into", "reduction", ac::elementwise(int64_t(N), 1, 0), [&] { in_.sum_into(acc, x, N, scale); });
}
void AccountBackend::adamw_update(float* param, const float* grad, float* m, float* v, size_t N, float lr,
                                  float beta1, float beta2, float eps, float weight_decay, float grad_scale,
                                  int t) {
  op("adamw", "optimizer", ac::adamw(int64_t(N), has_copy(param, N)), [&] {
    in_.adamw_update(param, grad, m, v, N, lr, beta1, beta2, eps, weight_decay, grad_scale, t);
  });
}
void AccountBackend::adamw_update_spans(float* param, float* grad, float* m, float* v,
                                        const std::vector<AdamWSpan>& spans, float lr, float beta1,
                                        float beta2, float eps, float grad_scale, int t, bool zero_grad) {
  size_t n = 0;
  for (const AdamWSpan& sp : spans) n += sp.numel;
  Cost c = ac::adamw(int64_t(n), has_copy(param, n));
  if (zero_grad) c.written += 4.0 * double(n);
  op("adamw", "optimizer", c, [&] {
    in_.adamw_update_spans(param, grad, m, v, spans, lr, beta1, beta2, eps, grad_scale, t, zero_grad);
  });
}

}  // namespace nlp
