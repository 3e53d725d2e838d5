// The arithmetic of run.profile's account (op_account.h).
#include "backend/op_account.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>

#include "core/backend.h"
#include "core/error.h"
#include "text/json_min.h"

namespace nlp::account {

int dtype_bytes(DType t) {
  switch (t) {
    case DType::F32: return 4;
    case DType::BF16: return 2;
    case DType::I32: return 4;
  }
  return 4;
}

Cost gemm(int64_t M, int64_t N, int64_t K, DType a, DType b, DType out, bool accumulate, bool bias) {
  const double mn = double(M) * N, so = dtype_bytes(out);
  Cost c;
  c.flops = 2.0 * mn * K + (bias ? mn : 0.0);
  c.read = double(M) * K * dtype_bytes(a) + double(K) * N * dtype_bytes(b) + (accumulate ? mn * so : 0.0) +
           (bias ? 4.0 * N : 0.0);
  c.written = mn * so;
  return c;
}

Cost cast(int64_t n, DType from, DType to) {
  Cost c;
  c.read = double(n) * dtype_bytes(from);
  c.written = double(n) * dtype_bytes(to);
  return c;
}

Cost memset(int64_t bytes) {
  Cost c;
  c.written = double(bytes);
  return c;
}

Cost copy(int64_t bytes) {
  Cost c;
  c.read = c.written = double(bytes);
  return c;
}

Cost elementwise(int64_t n, int inputs, int outputs, double flops) {
  Cost c;
  c.read = 4.0 * double(n) * inputs;
  c.written = 4.0 * double(n) * outputs;
  c.flops = flops * double(n);
  return c;
}

Cost layernorm_forward(int64_t N, int64_t C) {
  const double nc = double(N) * C;
  Cost c;
  c.read = 4.0 * nc + 4.0 * 2 * C;       // inp; w, b
  c.written = 4.0 * nc + 4.0 * 2 * N;    // out; mean, rstd
  c.flops = 8.0 * nc;
  return c;
}

Cost layernorm_backward(int64_t N, int64_t C) {
  const double nc = double(N) * C;
  Cost c;
  c.read = 4.0 * 3 * nc + 4.0 * 2 * N + 4.0 * 3 * C;  // dout, inp, dinp; mean, rstd; w, dw, db
  c.written = 4.0 * nc + 4.0 * 2 * C;                  // dinp; dw, db
  c.flops = 10.0 * nc;
  return c;
}

Cost residual_layernorm_forward(int64_t N, int64_t C) {
  Cost c = layernorm_forward(N, C);
  c += elementwise(N * C, 2, 0, 2);  // x and delta read; res written by the LN's read
  c.written += 4.0 * double(N) * C;  // res
  c.read -= 4.0 * double(N) * C;     // the LN reads res from registers, not memory
  return c;
}

Cost layernorm_dropout_backward(int64_t N, int64_t C) {
  Cost c = layernorm_backward(N, C);
  c.written += 4.0 * double(N) * C;  // ddelta
  return c;
}

Cost crossentropy_forward(int64_t M, int64_t V) {
  const double mv = double(M) * V;
  Cost c;
  c.read = 4.0 * mv + 4.0 * M;  // logits, targets
  c.written = 4.0 * M;          // losses
  c.flops = 4.0 * mv;
  return c;
}

Cost crossentropy_backward(int64_t M, int64_t V) {
  const double mv = double(M) * V;
  Cost c;
  c.read = 4.0 * 2 * mv + 4.0 * M;  // logits, dlogits (accumulated); targets
  c.written = 4.0 * mv;             // dlogits
  c.flops = 4.0 * mv;
  return c;
}

Cost attention_forward(int64_t B, int64_t T, int64_t NH, int64_t HS, bool causal) {
  const double C = double(NH) * HS, bt = double(B) * T;
  Cost c;
  c.flops = 4.0 * double(B) * NH * double(T) * T * HS * (causal ? 0.5 : 1.0);
  c.read = 4.0 * bt * 3 * C;
  c.written = 4.0 * bt * C;
  return c;
}

Cost attention_backward(int64_t B, int64_t T, int64_t NH, int64_t HS, bool causal) {
  const double C = double(NH) * HS, bt = double(B) * T;
  Cost c;
  c.flops = 2.0 * attention_forward(B, T, NH, HS, causal).flops;
  c.read = 4.0 * bt * 3 * C + 4.0 * bt * C + 4.0 * bt * 3 * C;  // qkv, dout, dqkv
  c.written = 4.0 * bt * 3 * C;
  return c;
}

Cost embedding_forward(int64_t tokens, int64_t C) {
  Cost c;
  c.read = 4.0 * tokens + 4.0 * 2 * double(tokens) * C;  // ids; a wte row and a wpe row a token
  c.written = 4.0 * double(tokens) * C;
  c.flops = double(tokens) * C;
  return c;
}

Cost embedding_backward(int64_t tokens, int64_t C) {
  Cost c = embedding_forward(tokens, C);  // the same rows, read-modify-written
  c.read += c.written;
  return c;
}

Cost adamw(int64_t n, bool copy) {
  Cost c;
  c.read = 16.0 * n;
  c.written = 12.0 * n + (copy ? 2.0 * n : 0.0);
  c.flops = 15.0 * n;
  return c;
}

double floor_ms(const Cost& c, const Rates& r) {
  if (r.bytes_per_s <= 0 || r.flops_per_s <= 0) return 0.0;
  return 1e3 * std::max(c.bytes() / r.bytes_per_s, c.flops / r.flops_per_s);
}

Rates measure_rates(Backend& be, size_t copy_bytes, int n, bool bf16, int reps) {
  using Clock = std::chrono::steady_clock;
  auto best_of = [&](auto&& op) {
    op();  // warm-up (plans, first touch)
    be.synchronize();
    double best = 1e30;
    for (int k = 0; k < std::max(reps, 1); ++k) {
      const auto t0 = Clock::now();
      op();
      be.synchronize();
      best = std::min(best, std::chrono::duration<double>(Clock::now() - t0).count());
    }
    return best;
  };
  Rates r;
  void* src = be.alloc(copy_bytes);
  void* dst = be.alloc(copy_bytes);
  const double tc = best_of([&] { be.copy(dst, src, copy_bytes); });
  be.release(src);
  be.release(dst);
  r.bytes_per_s = 2.0 * double(copy_bytes) / tc;

  const size_t nn = size_t(n) * n;
  float* a = static_cast<float*>(be.alloc(nn * sizeof(float)));
  float* b = static_cast<float*>(be.alloc(nn * sizeof(float)));
  float* c = static_cast<float*>(be.alloc(nn * sizeof(float)));
  double tg = best_of([&] { be.matmul_forward(c, a, b, nullptr, n, n, n, WLayout::InOut); });
  be.release(a);
  be.release(b);
  be.release(c);
  const Cost casts = cast(int64_t(2 * nn), DType::F32, DType::BF16);
  const double tcast = bf16 ? casts.bytes() / r.bytes_per_s : 0.0;
  const double flops = 2.0 * double(n) * n * n;
  if (tg - tcast > 0.5 * tg) tg -= tcast;
  r.flops_per_s = flops / tg;
  char buf[320];
  std::snprintf(buf, sizeof buf,
                "copy of %.0f MiB device to device: %.1f GB/s (read + written); %dx%dx%d %s GEMM: %.1f "
                "TFLOP/s%s; best of %d",
                double(copy_bytes) / (1 << 20), r.bytes_per_s / 1e9, n, n, n, bf16 ? "bf16" : "fp32",
                r.flops_per_s / 1e12,
                bf16 ? " (its two operand casts' floor at that bandwidth subtracted)" : "", std::max(reps, 1));
  r.how = buf;
  return r;
}

Row& Account::row(const std::string& label, const std::string& family) {
  for (Row& r : rows_)
    if (r.label == label) return r;
  rows_.push_back(Row{label, family, {}, 0, 0.0, 0});
  return rows_.back();
}

void Account::add(const std::string& label, const std::string& family, const Cost& c) {
  Row& r = row(label, family);
  r.cost += c;
  r.calls += 1;
}

void Account::time(const std::string& label, double ms, long calls) {
  Row& r = row(label, "other");
  r.ms += ms;
  r.timed += calls;
}

std::vector<Row> Account::families() const {
  std::vector<Row> f;
  for (const Row& r : rows_) {
    auto it = std::find_if(f.begin(), f.end(), [&](const Row& x) { return x.family == r.family; });
    if (it == f.end()) {
      f.push_back(Row{r.family, r.family, {}, 0, 0.0, 0});
      it = f.end() - 1;
    }
    it->cost += r.cost;
    it->calls += r.calls;
    it->ms += r.ms;
    it->timed += r.timed;
  }
  return f;
}

namespace {

std::string ratio_text(double ms, double fl) {
  if (fl <= 0) return "-";
  char b[32];
  std::snprintf(b, sizeof b, "%.2f", ms / fl);
  return b;
}

double ratio_value(double ms, double fl) { return fl > 0 ? ms / fl : 0.0; }

std::string num(double v) {
  if (!std::isfinite(v)) return "null";
  char b[40];
  std::snprintf(b, sizeof b, "%.6g", v);
  return b;
}

}  // namespace

std::string Account::table(const Rates& r, long steps, double step_ms) const {
  const double s = double(std::max(steps, 1L));
  std::string out = cat("profile account (run.profile), per step over ", steps, " step(s); rates: ", r.how, "\n");
  char line[256];
  auto section = [&](const std::vector<Row>& rows, const char* head) {
    std::snprintf(line, sizeof line, "  %-44s %8s %9s %9s %9s %7s %8s\n", head, "GB", "GFLOP", "floor ms",
                  "ms", "ratio", "calls");
    out += line;
    for (const Row& x : rows) {
      const double fl = floor_ms(x.cost, r) / s, ms = x.ms / s;
      char mstext[32] = "-";  // untimed: its time is inside another op's (the CPU's casts)
      if (x.timed > 0) std::snprintf(mstext, sizeof mstext, "%.3f", ms);
      std::snprintf(line, sizeof line, "  %-44s %8.3f %9.1f %9.3f %9s %7s %8.1f\n", x.label.c_str(),
                    x.cost.bytes() / 1e9 / s, x.cost.flops / 1e9 / s, fl, mstext,
                    x.timed > 0 ? ratio_text(ms, fl).c_str() : "-", double(x.calls) / s);
      out += line;
    }
  };
  const std::vector<Row> fam = families();
  section(fam, "family");
  section(rows_, "op");
  double floor_sum = 0, ms_sum = 0;
  for (const Row& x : fam) floor_sum += floor_ms(x.cost, r) / s, ms_sum += x.ms / s;
  std::snprintf(line, sizeof line,
                "  predicted step (sum of floors) %.3f ms | measured: ops %.3f ms (ratio %s), step %s ms",
                floor_sum, ms_sum, ratio_text(ms_sum, floor_sum).c_str(),
                step_ms > 0 ? num(step_ms).c_str() : "?");
  out += line;
  return out;
}

std::string Account::json(const Rates& r, long steps, double step_ms) const {
  const double s = double(std::max(steps, 1L));
  auto obj = [&](const Row& x, bool label) {
    const double fl = floor_ms(x.cost, r) / s, ms = x.ms / s;
    std::string o = "{";
    if (label) o += cat("\"label\": ", text::json_quote(x.label), ", ");
    o += cat("\"family\": ", text::json_quote(x.family), ", \"bytes\": ", num(x.cost.bytes() / s),
             ", \"flops\": ", num(x.cost.flops / s), ", \"floor_ms\": ", num(fl),
             ", \"ms\": ", x.timed > 0 ? num(ms) : std::string("null"),
             ", \"ratio\": ", x.timed > 0 && fl > 0 ? num(ratio_value(ms, fl)) : std::string("null"),
             ", \"calls\": ", num(double(x.calls) / s), "}");
    return o;
  };
  double floor_sum = 0, ms_sum = 0;
  std::string fams, ops;
  for (const Row& x : families()) {
    floor_sum += floor_ms(x.cost, r) / s;
    ms_sum += x.ms / s;
    fams += cat(fams.empty() ? "" : ", ", obj(x, false));
  }
  for (const Row& x : rows_) ops += cat(ops.empty() ? "" : ", ", obj(x, true));
  return cat("{\"steps\": ", steps, ", \"bandwidth_bytes_per_s\": ", num(r.bytes_per_s),
             ", \"gemm_flops_per_s\": ", num(r.flops_per_s), ", \"rates\": ", text::json_quote(r.how),
             ", \"predicted_step_ms\": ", num(floor_sum), ", \"measured_ops_ms\": ", num(ms_sum),
             ", \"measured_step_ms\": ", step_ms > 0 ? num(step_ms) : std::string("null"),
             ", \"families\": [", fams, "], \"ops\": [", ops, "]}");
}

}  // namespace nlp::account
