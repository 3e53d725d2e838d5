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
    : ForwardingBackend(inner), vocab_(vocab), bf16_(precision == Precision::Bf16) {}

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

// ---- embeddings ----
void AccountBackend::embedding_forward(Act out, const int32_t* ids, const int32_t* type_ids,
                                       const float* wte, const float* wpe, const float* wtt, int B, int T,
                                       int C, int pos_offset, const int32_t* pos_ids) {
  wte_ = wte;
  op("embedding_forward", "embedding", ac::embedding_forward(int64_t(B) * T, C),
     [&] { in_.embedding_forward(out, ids, type_ids, wte, wpe, wtt, B, T, C, pos_offset, pos_ids); });
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

// ---- the costs the list's entries name --------------------------------------------------------------
Cost AccountBackend::lm_head_cost(int M, int C, int V, bool dx, bool dw) const {
  const AD t = bf16_ ? AD::BF16 : AD::F32;
  Cost c = ac::gemm(M, V, C, t, t, AD::F32, false);  // logits[M,V] = x[M,C] wte^T
  c += ac::crossentropy_forward(M, V);
  if (dx || dw) {
    c += ac::crossentropy_backward(M, V);
    if (dx) c += ac::gemm(M, C, V, t, t, AD::F32, true);  // dx[M,C] += dlogits[M,V] wte
    if (dw) c += ac::gemm(V, C, M, t, t, AD::F32, true);  // dwte[V,C] += dlogits^T x
  }
  return c;
}
Cost AccountBackend::adamw_spans_cost(const float* param, const std::vector<AdamWSpan>& spans,
                                      bool zero_grad) const {
  size_t n = 0;
  for (const AdamWSpan& sp : spans) n += sp.numel;
  Cost c = ac::adamw(int64_t(n), has_copy(param, n));
  if (zero_grad) c.written += 4.0 * double(n);
  return c;
}

// ---- every COUNT entry of core/backend_ops.def: the call passed on under its label, with its cost ----
#define NLP_ARG_DEFAULT(value)
#define NLP_OP(name, ret, params, args, impl, graph, account, cost) \
  NLP_ACCOUNT_##account(name, ret, params, args, cost)
#define NLP_ACCOUNT_LABEL_FAMILY_COST(label, family, cost) label, family, cost
#define NLP_ACCOUNT_COUNT(name, ret, params, args, cost)                                        \
  ret AccountBackend::name params {                                                             \
    return op(NLP_ACCOUNT_LABEL_FAMILY_COST cost, [&]() -> ret { return in_.name args; });      \
  }
#define NLP_ACCOUNT_UNCOUNTED(name, ret, params, args, cost)
#define NLP_ACCOUNT_OWN(name, ret, params, args, cost)
#include "core/backend_ops.def"
#undef NLP_ACCOUNT_LABEL_FAMILY_COST
#undef NLP_ACCOUNT_COUNT
#undef NLP_ACCOUNT_UNCOUNTED
#undef NLP_ACCOUNT_OWN

}  // namespace nlp
