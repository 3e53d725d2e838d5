// run.profile's account of a step: for every op label, the bytes it reads and writes and the FLOPs it
// computes (from its shapes and dtypes), its floor at the device's measured bandwidth and GEMM rate,
// the measured time, and the ratio measured / floor; aggregated into op families, whose floors sum to
// the predicted step. Plain arithmetic, independent of any backend (tests/unit/test_op_account.cpp
// checks it against values worked out by hand); the rates come from measure_rates (a large copy and a
// large GEMM on the backend the run uses).
//
// Conventions: a byte count is what the op must move to and from device memory at least (each input
// read once, each output written once; an accumulating output (+=) is read and written); FLOPs count a
// multiply-add as 2. The floor of an op is max(bytes / bandwidth, flops / gemm rate): the time it
// needs at the measured copy bandwidth or the measured GEMM rate, whichever binds.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace nlp {

class Backend;

namespace account {

enum class DType { F32, BF16, I32 };
int dtype_bytes(DType t);  // 4, 2, 4

struct Cost {
  double flops = 0, read = 0, written = 0;  // FLOPs, bytes read, bytes written
  double bytes() const { return read + written; }
  Cost& operator+=(const Cost& o) {
    flops += o.flops;
    read += o.read;
    written += o.written;
    return *this;
  }
};

// ---- the cost of one call, per op kind (shapes as core/backend.h gives them) ----------------------
// out[M,N] (+)= A[M,K] @ B[K,N] (+ bias[N], fp32): 2MNK FLOPs (+ MN for the bias); reads A and B at
// their dtypes (and out when accumulating, and the bias); writes out.
Cost gemm(int64_t M, int64_t N, int64_t K, DType a, DType b, DType out, bool accumulate,
          bool bias = false);
// n elements converted: reads n at `from`, writes n at `to`.
Cost cast(int64_t n, DType from, DType to);
// bytes set to zero: written only.
Cost memset(int64_t bytes);
// bytes copied device to device: read and written.
Cost copy(int64_t bytes);
// An elementwise op over n fp32 elements with `inputs` arrays read and `outputs` written
// (accumulating outputs count among both), `flops` per element.
Cost elementwise(int64_t n, int inputs, int outputs, double flops = 1);
// out[N,C] = layernorm(inp) * w + b, saves mean[N], rstd[N]: reads inp, w, b; writes out, mean,
// rstd; 8 FLOPs an element (mean, variance, normalise, scale and shift).
Cost layernorm_forward(int64_t N, int64_t C);
// dinp[N,C] += ..., dw[C] +=, db[C] +=: reads dout, inp, dinp, w, mean, rstd, dw, db; writes dinp,
// dw, db; 10 FLOPs an element.
Cost layernorm_backward(int64_t N, int64_t C);
// res[N,C] = x + dropout(delta), out = layernorm(res): the layer norm's, plus x and delta read
// (2 FLOPs an element) and res written, which the layer norm then reads from registers, not memory.
Cost residual_layernorm_forward(int64_t N, int64_t C);
// Its backward: the layer norm's, plus ddelta[N,C] written.
Cost layernorm_dropout_backward(int64_t N, int64_t C);
// losses[M] of logits[M,V] (fp32) and targets[M] (int32): reads logits and targets, writes losses;
// 4 FLOPs a logit (max, subtract, exp, sum).
Cost crossentropy_forward(int64_t M, int64_t V);
// dlogits[M,V] += softmax - onehot: reads logits, dlogits and targets, writes dlogits; 4 FLOPs a logit.
Cost crossentropy_backward(int64_t M, int64_t V);
// Attention over qkv[B,T,3C] (C = NH*HS) into out[B,T,C]: 4*B*NH*T*T*HS FLOPs (QK^T and PV; half
// when causal); reads qkv, writes out. The backward: twice the forward's FLOPs (four products with
// the recomputation counted), reads qkv, dout and dqkv, writes dqkv.
Cost attention_forward(int64_t B, int64_t T, int64_t NH, int64_t HS, bool causal);
Cost attention_backward(int64_t B, int64_t T, int64_t NH, int64_t HS, bool causal);
// out[B*T,C] = wte[ids] + wpe[pos]: reads ids, two rows a token; writes out.
Cost embedding_forward(int64_t tokens, int64_t C);
// dwte[ids] += dout, dwpe[pos] += dout: the forward's rows, read-modify-written.
Cost embedding_backward(int64_t tokens, int64_t C);
// AdamW over n fp32 weights: reads p, g, m, v; writes p, m, v (and the bf16 copy with `copy`);
// 15 FLOPs an element.
Cost adamw(int64_t n, bool copy);

// ---- floors ----------------------------------------------------------------------------------------
struct Rates {
  double bytes_per_s = 0;  // device-to-device copy: (read + written) bytes / s
  double flops_per_s = 0;  // a large GEMM at the run's precision
  std::string how;         // how they were measured (the log and summary.json say)
};
// ms at the rates: max(bytes / bandwidth, flops / rate); 0 when a rate is unknown (0).
double floor_ms(const Cost& c, const Rates& r);

// Times a copy of copy_bytes and a square GEMM of side n (bf16 operands when the backend computes in
// bf16), each the best of `reps` after one warm-up, with the backend synchronised around each; the
// GEMM's time includes the operand casts of a bf16 backend, so their floor at the measured bandwidth
// is subtracted (said in Rates::how).
Rates measure_rates(Backend& be, size_t copy_bytes, int n, bool bf16, int reps = 3);

// ---- the account -----------------------------------------------------------------------------------
struct Row {
  std::string label, family;
  Cost cost;         // summed over the calls
  long calls = 0;    // calls whose cost was added
  double ms = 0;     // measured time, summed
  long timed = 0;    // calls timed
};

class Account {
 public:
  // One call of `label` (in `family`) with this cost.
  void add(const std::string& label, const std::string& family, const Cost& c);
  // Measured time of `label` over `calls` calls (added to what it has).
  void time(const std::string& label, double ms, long calls);
  const std::vector<Row>& rows() const { return rows_; }
  // The rows summed per family, in order of first appearance.
  std::vector<Row> families() const;
  void clear() { rows_.clear(); }

  // The log table: per family and per label, per step (divided by `steps`): GB, GFLOP, floor ms,
  // measured ms, ratio; then the predicted step (sum of floors) beside the measured sum of the ops
  // and `step_ms` (the measured step wall time, 0 = unknown).
  std::string table(const Rates& r, long steps, double step_ms) const;
  // summary.json's "profile" object, the same numbers per step.
  std::string json(const Rates& r, long steps, double step_ms) const;

 private:
  Row& row(const std::string& label, const std::string& family);
  std::vector<Row> rows_;
};

}  // namespace account
}  // namespace nlp
