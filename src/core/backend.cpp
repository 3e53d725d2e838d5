// Backend factory: maps run.backend to an implementation and explains why one is unavailable.
#include "core/backend.h"

#include "backend/cpu/cpu_backend.h"
#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/device.h"
#include "core/error.h"

namespace nlp {

Precision parse_precision(const std::string& value, const std::string& backend) {
  if (value == "fp32") return Precision::Fp32;
  if (value == "tf32") return Precision::Tf32;
  if (value == "bf16") return Precision::Bf16;
  if (value == "auto") return backend == "cuda" ? Precision::Bf16 : Precision::Fp32;
  throw Error(cat("train.precision: unknown value '", value, "' (expected auto, fp32, tf32 or bf16)"));
}

const char* precision_name(Precision p) {
  switch (p) {
    case Precision::Fp32: return "fp32";
    case Precision::Tf32: return "tf32";
    case Precision::Bf16: return "bf16";
  }
  return "?";
}

bool parse_fused_attention(const std::string& value, const std::string& backend,
                           Precision precision) {
  if (value != "auto" && value != "cudnn" && value != "native")
    throw Error(cat("model.attention: unknown value '", value, "' (expected auto, cudnn or native)"));
  if (backend != "cuda" || value == "native") return false;
  return value == "cudnn" || precision == Precision::Bf16;
}

std::unique_ptr<Backend> make_backend(const std::string& name, int threads, int local_rank,
                                      const BackendOptions& options) {
  if (name == "cpu")
    return make_cpu_backend(threads, options.precision, options.cpu_gemm, options.cpu_bf16,
                            options.bf16_weights);
  if (name == "cuda") {
    std::string why;
    int n = cuda_device_count(&why);
    if (n == 0) throw Error(cat("run.backend=cuda: no usable CUDA device: ", why));
    if (local_rank >= n)
      throw Error(cat("run.backend=cuda: local rank ", local_rank, " has no GPU (", n,
                      " device(s) on this node); use at most one rank per GPU"));
    return make_cuda_backend(local_rank, options);
  }
  throw Error(cat("run.backend: unknown backend '", name, "' (expected cpu or cuda)"));
}

}  // namespace nlp
