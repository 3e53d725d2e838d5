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

int pad_multiple(const std::string& v, const std::string& backend) {
  if (v == "auto") return pad_auto(backend);
  if (v == "off") return 0;
  if (v == "128") return 128;
  throw Error(cat("model.pad_vocab: unknown value '", v, "' (expected auto, off or 128)"));
}
bool fused(const std::string& v, const std::string& backend) {
  if (v == "auto") return fused_auto(backend);
  if (v == "on") return true;
  if (v == "off") return false;
  throw Error(cat("model.fused_head: unknown value '", v, "' (expected auto, on or off)"));
}

// Chunks of at most about 1 GiB of fp32 logits, the rows split evenly in multiples of 128: GPT-2 at
// B=16, T=1024 runs 4 chunks of 4096 rows (824 MB instead of the 6.6 GB of logits and dlogits).
// Fewer, larger chunks convert wte to bf16 fewer times (once per chunk and pass, 0.23 GB each).
constexpr size_t kChunkFloats = size_t(256) << 20;
}  // namespace

void resolve_lm_head(ModelConfig& mc, const std::string& backend, const std::string& mode) {
  const bool reads_logits = mode != "train" && mode != "eval";
  mc.fused_head = fused(mc.fused_head, backend) && !reads_logits ? "on" : "off";
  mc.pad_vocab = pad_multiple(mc.pad_vocab, backend) ? "128" : "off";
}

LmHeadPlan lm_head_plan(const ModelConfig& mc, const std::string& backend, int V, int rows) {
  LmHeadPlan p;
  p.fused = fused(mc.fused_head, backend);
  p.Vp = padded_vocab(V, pad_multiple(mc.pad_vocab, backend));
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
