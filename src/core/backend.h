// The backend interface: memory plus a table of ops, each a forward/backward pair, every op declared
// once in core/backend_ops.def (its signature, shapes and defaults; how a recording and the profile's
// account treat it). The CPU backend (backend/cpu/) is the reference; the CUDA backend
// (backend/cuda/) implements the same table; backend/forwarding_backend.h passes it on.
//
// Conventions (every backend, every op):
//  - All pointers are backend memory (host for CPU, device for CUDA), float32 unless typed otherwise.
//    Activations and their gradients are typed views (core/tensor.h: Act, CAct), fp32 or bf16, each
//    argument its own dtype; a float* is an fp32 view. Parameters, their gradients, the optimizer
//    state, layer-norm statistics, losses, logits and the attention op's saved state are float*.
//    Every backend takes every dtype combination (the CPU as the reference: cpu/staged.h).
//  - Row-major. Shapes are given in the comment of each op (backend_ops.def); B batch, T sequence, C channels,
//    NH heads, HS head size (C = NH*HS), V vocabulary, M rows, K inner dim, N output dim.
//  - Backward ops ACCUMULATE (+=) into every gradient they write. The caller zeroes gradients, or
//    passes an activation gradient as overwrite(view) when the op is its only writer: the op then
//    overwrites it (where an op's entry says so; rows_scatter_add and the defaults' scratch do not).
//    A null gradient pointer means "not needed" and is skipped.
//  - Dropout masks come from core/rng.h: keep(i) = uniform01(seed, key(i)) >= p, scaled by 1/(1-p).
//    Backward regenerates the mask from the same seed, so nothing is stored. key(i) is the element's
//    index in the example's untrimmed layout (DropRows; attention's T_key), so a batch trimmed to its
//    longest row (data.padding = longest) draws exactly the masks of the padded batch.
#pragma once
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "core/path_counts.h"
#include "core/rng.h"
#include "core/tensor.h"

namespace nlp {

enum class Gelu { Tanh, Erf };  // Tanh: HF "gelu_new" (GPT-2); Erf: exact GELU (BERT)

// Weight layout of a dense layer computing out = inp @ W + b.
//   InOut: W is [K, N] (HF Conv1D, GPT-2).  OutIn: W is [N, K] (torch nn.Linear, BERT).
enum class WLayout { InOut, OutIn };

constexpr int32_t kIgnoreIndex = -100;

// A float as a value-table word (Backend::bind_slot): its bits in the low 32 bits; slot_float is
// the inverse.
inline uint64_t slot_word(float f) {
  uint32_t u;
  static_assert(sizeof u == sizeof f);
  std::memcpy(&u, &f, sizeof u);
  return u;
}
inline float slot_float(uint64_t word) {
  const uint32_t u = static_cast<uint32_t>(word);
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

// Where a dropout op over a [B, T, C] tensor draws element i's mask: rows of `row` = T*C elements
// (one example) are keyed as if they had `row_key` = T_key*C elements, i.e. at index
// (i / row) * row_key + i % row, the index of the same (example, position, channel) in the batch
// padded to T_key. row == 0 (the default) or row == row_key: the flat index i.
// Packed rows (several examples to a row) give each token its key instead: token_key[B*T] (backend
// memory) = example * T_key + position in the example, and element i of token r = i / width is keyed
// at token_key[r] * width + i % width: again the index of the same element in the padded batch.
struct DropRows {
  size_t row = 0, row_key = 0;
  const int32_t* token_key = nullptr;
  size_t width = 0;
};
// The DropRows of a [B, T, C] tensor whose examples are keyed at T_key positions (0 = T), or by
// token_key (packed rows; nullable).
inline DropRows drop_rows(int T, int T_key, int C, const int32_t* token_key = nullptr) {
  if (token_key) return DropRows{0, 0, token_key, size_t(C)};
  return DropRows{size_t(T) * C, size_t(key_length(T, T_key)) * C};
}

// Arithmetic of the dense-layer GEMMs (matmul_forward/backward), train.precision. Parameters,
// gradients, the optimizer state and every other op stay fp32; accumulation is fp32 in every mode.
//   Fp32: strict fp32.  Tf32: operands rounded to TF32 (10-bit mantissa), as the tensor cores read them.
//   Bf16: operands rounded to bf16 (7-bit mantissa). The CPU backend rounds the operands the same way
//   (round to nearest even) before an fp32 GEMM, so both backends compute the same function.
enum class Precision { Fp32, Tf32, Bf16 };
// "fp32" | "tf32" | "bf16" | "auto" (bf16 on cuda, fp32 on cpu) -> Precision; throws on anything else.
Precision parse_precision(const std::string& value, const std::string& backend);
const char* precision_name(Precision p);
// model.attention: "auto" | "cudnn" | "native" -> whether attention runs through cuDNN's fused SDPA
// (BackendOptions::fused_attention). auto: yes on the cuda backend when `precision` is bf16. The cpu
// backend has only its own attention, so it always gets false (a caller may log that "cudnn" is
// ignored there). Throws nlp::Error on any other value.
bool parse_fused_attention(const std::string& value, const std::string& backend, Precision precision);
// The CPU backend's GEMM library (run.cpu_gemm) and its bf16 arithmetic with Precision::Bf16
// (run.cpu_bf16), as given: the configuration reads the text (Config::cpu_gemm(), cpu_bf16()); the
// backend resolves auto, which depends on the CPU (cpu::auto_gemm_lib, cpu::auto_native_bf16).
// Their values are in the order of the keys' choice lists (config_choices.cpp maps one onto the other).
enum class CpuGemm { Auto, OpenBlas, OneDnn };
enum class CpuBf16 { Auto, Emulate, Native };

class Backend {
 public:
  virtual ~Backend() = default;
  virtual std::string name() const = 0;
  // What the log should know of how this backend computes (the cpu backend: its GEMM library and bf16
  // path); empty when there is nothing to say.
  virtual std::string details() const { return {}; }

  // ---- run.profile -------------------------------------------------------------------------------
  // Time every op (CUDA events; no extra synchronisation) and report a per-op table.
  virtual void set_profiling(bool /*on*/) {}
  virtual std::string profile_report() { return {}; }
  // run.profile's account (backend/op_account.h): ops enqueued from now on are timed under `label`
  // (null: under their own names); a backend that splits an op (the bf16 operand casts of a GEMM)
  // times the parts under "<label>" and "cast: <label>". profile_times: the time so far per label.
  virtual void profile_label(const char* /*label*/) {}
  struct ProfileTime {
    std::string label;
    double ms = 0;
    long calls = 0;
  };
  virtual std::vector<ProfileTime> profile_times() { return {}; }
  // What ran so far (core/path_counts.h: fused and fallback GEMM epilogues, staged ops, fp32<->bf16
  // conversions), counted since the backend was made; false (the default: the CPU backend) when the
  // backend keeps no such counts. Callers take differences over the steps they report.
  virtual bool path_counts(PathCounts* /*out*/) const { return false; }

  // ---- the persistent bf16 copy of the weights (BackendOptions::bf16_weights) -------------------
  // With the option on and Precision::Bf16, the dense-layer GEMMs read a weight that lies inside the
  // registered arena from a bf16 copy kept beside it (2 bytes an element) instead of rounding it at
  // every call. The copy is the round-to-nearest-even of the fp32 weights at every op: adamw_update
  // and adamw_update_spans write the weight and its rounding in one pass; to_device, copy and zero
  // into the arena round the part they wrote again; a write from outside the backend (a collective:
  // the ZeRO all-gather) must be followed by weights_written over what it wrote.
  // Off (the default, and any other precision): these do nothing and bf16_weights() is null.
  // Once, before any write; (arena, 0) forgets that arena (its owner frees it).
  virtual void register_weights(const float* /*arena*/, size_t /*n*/) {}
  virtual void weights_written(const float* /*p*/, size_t /*n*/) {}
  // The copy (backend memory, the bf16 bit patterns of the n arena elements), or null when off.
  virtual const uint16_t* bf16_weights() const { return nullptr; }

  // ---- the ops: memory, then compute, one entry each in core/backend_ops.def -------------------------
  // adamw_update_spans' spans: the elements [offset, offset + numel) of one tensor and its decay.
  struct AdamWSpan {
    size_t offset, numel;
    float weight_decay;
  };
#define NLP_OP(name, ret, params, args, impl, graph, account, cost) \
  NLP_BACKEND_OP_##impl(name, ret, params)
#define NLP_BACKEND_OP_PURE(name, ret, params) virtual ret name params = 0;
#define NLP_BACKEND_OP_DEFAULT(name, ret, params) virtual ret name params;  // core/backend.cpp
#include "core/backend_ops.def"
#undef NLP_BACKEND_OP_PURE
#undef NLP_BACKEND_OP_DEFAULT

  // The n elements of a view set to zero (zero() over their bytes).
  void zero_act(Act a, size_t n) { zero(a.p, n * dtype_bytes(a.dt)); }

  // ---- replayed micro-batches (run.cuda_graph; backend/step_graph.h drives these) ---------------
  // A backend that can record the ops enqueued between capture_begin() and capture_end() without
  // running them, and launch the recording later as often as asked (CUDA graphs), says so in
  // can_capture(); otherwise *why (nullable) says why not, and step_graph.h emulates a recording by
  // keeping the calls themselves (how the CPU tests check the recording's bookkeeping).
  // Values that differ between launches of one recording (dropout seeds, the loss scale dloss) come
  // from the recording's table of `slots` 64-bit words in backend memory: bind_slot(k), k < slots,
  // before an op that takes a seed (dropout_*, residual_layernorm_forward,
  // layernorm_dropout_backward, attention_forward/backward) or dloss (crossentropy_backward,
  // segment_crossentropy_backward) makes that op read it from word k when the recording runs (dloss:
  // the float's bits in the word's low 32 bits, `slot_word(dloss)`); bind_slot(-1) after the op.
  // Ops between capture_begin and capture_end must not synchronise, allocate or read back.
  class Recording {
   public:
    virtual ~Recording() = default;
  };
  virtual bool can_capture(std::string* why) const {
    if (why) *why = "backend '" + name() + "' records no graphs";
    return false;
  }
  virtual void capture_begin(size_t /*slots*/) {}
  virtual void bind_slot(int /*k*/) {}
  // Ends the recording, also after an op threw during it: the recording, or null with the reason in
  // *why (an op that synchronised, allocated, grew a scratch buffer or failed while recording); the
  // backend is then as it was at capture_begin.
  virtual std::shared_ptr<Recording> capture_end(std::string* why) {
    if (why) *why = "backend '" + name() + "' records no graphs";
    return nullptr;
  }
  // Runs a recording with its table set to values[0 .. n) (n = its slots), enqueued as the recorded
  // ops would be.
  virtual void replay(Recording& /*r*/, const uint64_t* /*values*/, size_t /*n*/) {}
};

// How a backend is built (backend/factory.h: make_backend); every field has the default of a plain
// fp32 backend.
struct BackendOptions {
  Precision precision = Precision::Fp32;  // train.precision: dense-layer GEMM arithmetic
  bool sync_check = false;  // cuda: synchronise and check for errors after every op (names the op)
  bool fused_attention = false;  // cuda: attention through cuDNN's fused SDPA (model.attention)
  CpuGemm cpu_gemm = CpuGemm::Auto;     // cpu: run.cpu_gemm
  CpuBf16 cpu_bf16 = CpuBf16::Emulate;  // cpu, train.precision = bf16: run.cpu_bf16
  bool bf16_weights = false;  // run.bf16_weights: the persistent bf16 copy of the weights (Bf16 only)
};

}  // namespace nlp
