// What a GPU backend ran, as counts (Backend::path_counts): which GEMM epilogues fused and which took
// their fallback, how many ops were staged through fp32 (NLPTRAIN_CUDA_BF16_ACTS = staged, or an op
// without a bf16 kernel), and how many fp32 <-> bf16 conversions ran. The trainer reports the counts
// of the timed steps (the log's "paths:" line, summary.json's "gpu_paths"); run.profile's account
// reports the same. Header only: plain counters and their two printed forms.
#pragma once
#include <cstdint>
#include <string>

namespace nlp {

struct PathCounts {
  // One count per cuBLASLt epilogue kind the typed GEMM may ask for (cuda/gemm.h GemmEpilogues):
  // BIAS, GELU_AUX(_BIAS), DGELU, BGRADA/BGRADB.
  struct Epilogues {
    int64_t bias = 0, gelu_aux = 0, dgelu = 0, bgrad = 0;
    Epilogues operator-(const Epilogues& o) const {
      return Epilogues{bias - o.bias, gelu_aux - o.gelu_aux, dgelu - o.dgelu, bgrad - o.bgrad};
    }
    Epilogues& operator+=(const Epilogues& o) {
      bias += o.bias, gelu_aux += o.gelu_aux, dgelu += o.dgelu, bgrad += o.bgrad;
      return *this;
    }
    bool operator==(const Epilogues&) const = default;
  };
  Epilogues gemm_fused;     // GEMMs that asked for the epilogue and ran it inside cuBLASLt
  Epilogues gemm_fallback;  // ... that asked for it and ran the plain product plus separate kernels
  int64_t staged_ops = 0;   // ops on bf16 views run as fp32 ops on widened copies
  int64_t fp32_to_bf16 = 0, bf16_to_fp32 = 0;  // conversions (one per array converted)

  PathCounts operator-(const PathCounts& o) const {
    PathCounts d;
    d.gemm_fused = gemm_fused - o.gemm_fused;
    d.gemm_fallback = gemm_fallback - o.gemm_fallback;
    d.staged_ops = staged_ops - o.staged_ops;
    d.fp32_to_bf16 = fp32_to_bf16 - o.fp32_to_bf16;
    d.bf16_to_fp32 = bf16_to_fp32 - o.bf16_to_fp32;
    return d;
  }
  PathCounts& operator+=(const PathCounts& o) {
    gemm_fused += o.gemm_fused;
    gemm_fallback += o.gemm_fallback;
    staged_ops += o.staged_ops;
    fp32_to_bf16 += o.fp32_to_bf16;
    bf16_to_fp32 += o.bf16_to_fp32;
    return *this;
  }
  bool operator==(const PathCounts&) const = default;
};

namespace path_counts_detail {
inline std::string kinds_json(const PathCounts::Epilogues& e) {
  return "{\"bias\": " + std::to_string(e.bias) + ", \"gelu_aux\": " + std::to_string(e.gelu_aux) +
         ", \"dgelu\": " + std::to_string(e.dgelu) + ", \"bgrad\": " + std::to_string(e.bgrad) + "}";
}
inline std::string kinds_text(const PathCounts::Epilogues& e) {
  return "bias " + std::to_string(e.bias) + ", gelu_aux " + std::to_string(e.gelu_aux) + ", dgelu " +
         std::to_string(e.dgelu) + ", bgrad " + std::to_string(e.bgrad);
}
}  // namespace path_counts_detail

// summary.json's "gpu_paths" object:
// {"gemm_fused": {"bias": N, "gelu_aux": N, "dgelu": N, "bgrad": N}, "gemm_fallback": {...},
//  "staged_ops": N, "casts": {"fp32_to_bf16": N, "bf16_to_fp32": N}}
inline std::string path_counts_json(const PathCounts& c) {
  using namespace path_counts_detail;
  return "{\"gemm_fused\": " + kinds_json(c.gemm_fused) + ", \"gemm_fallback\": " +
         kinds_json(c.gemm_fallback) + ", \"staged_ops\": " + std::to_string(c.staged_ops) +
         ", \"casts\": {\"fp32_to_bf16\": " + std::to_string(c.fp32_to_bf16) +
         ", \"bf16_to_fp32\": " + std::to_string(c.bf16_to_fp32) + "}}";
}

// The log's one line: "paths: <what>, gemm fused (bias N, ...); gemm fallback (...); staged ops N;
// casts fp32->bf16 N, bf16->fp32 N" (`what`, e.g. "over the last 9 steps", and its comma only when
// given).
inline std::string path_counts_line(const PathCounts& c, const std::string& what = "") {
  using namespace path_counts_detail;
  return "paths: " + (what.empty() ? std::string() : what + ", ") + "gemm fused (" +
         kinds_text(c.gemm_fused) + "); gemm fallback (" +
         kinds_text(c.gemm_fallback) + "); staged ops " + std::to_string(c.staged_ops) +
         "; casts fp32->bf16 " + std::to_string(c.fp32_to_bf16) + ", bf16->fp32 " +
         std::to_string(c.bf16_to_fp32);
}

}  // namespace nlp
