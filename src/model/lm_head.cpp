#include "model/lm_head.h"

#include <algorithm>

#include "core/error.h"

namespace nlp {

namespace {
// fused_head = auto is off on every backend until the fused path has run on a GPU; the CPU then
// stays the exact reference of the CUDA backend's default (unfused) path.
bool fused_auto(const std::string& /*backend*/) { return false; }
// pad_vocab = auto: 128 on the CPU, where padding changes only the chunk's row stride (the same
// products, bitwise the same results); off on cuda until a GPU has run it.
int pad_auto(const std::string& backend) { return backend == "cpu" ? 128 : 0; }

int pad_multiple(const ModelConfig& mc, const std::string& backend) {
  switch (mc.pad_vocab_mode()) {
    case PadVocab::Auto: return pad_auto(backend);
    case PadVocab::Off: return 0;
    case PadVocab::Pad128: return 128;
  }
  return 0;
}
bool fused(const ModelConfig& mc, const std::string& backend) {
  switch (mc.fused_head_mode()) {
    case FusedHead::Auto: return fused_auto(backend);
    case FusedHead::On: return true;
    case FusedHead::Off: return false;
  }
  return false;
}

// Chunks of at most about 1 GiB of fp32 logits, the rows split evenly in multiples of 128: GPT-2 at
// B=16, T=1024 runs 4 chunks of 4096 rows (824 MB instead of the 6.6 GB of logits and dlogits).
// Fewer, larger chunks convert wte to bf16 fewer times (once per chunk and pass, 0.23 GB each).
constexpr size_t kChunkFloats = size_t(256) << 20;
}  // namespace

void resolve_lm_head(ModelConfig& mc, const std::string& backend, RunMode mode) {
  const bool reads_logits = mode != RunMode::Train && mode != RunMode::Eval;
  const bool on = fused(mc, backend) && !reads_logits;
  const bool pad = pad_multiple(mc, backend) != 0;
  mc.fused_head = on ? "on" : "off";
  mc.pad_vocab = pad ? "128" : "off";
}

LmHeadPlan lm_head_plan(const ModelConfig& mc, const std::string& backend, int V, int rows) {
  LmHeadPlan p;
  p.fused = fused(mc, backend);
  p.Vp = padded_vocab(V, pad_multiple(mc, backend));
  if (mc.head_chunk > 0) {
    p.chunk = mc.head_chunk;
  } else {
    const size_t floats = size_t(std::max(rows, 1)) * size_t(p.Vp);
    const size_t chunks = (floats + kChunkFloats - 1) / kChunkFloats;
    const size_t per = (size_t(std::max(rows, 1)) + chunks - 1) / chunks;
    p.chunk = int((per + 127) / 128 * 128);
  }
  p.chunk = std::max(1, std::min(p.chunk, rows));
  return p;
}

}  // namespace nlp
