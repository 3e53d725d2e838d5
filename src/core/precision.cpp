// The run's arithmetic options as the configuration states them (core/backend.h): train.precision
// and model.attention resolved for a backend. Apart from the backend factory (backend.cpp) so that
// code that only validates a configuration links without the backends.
#include "core/backend.h"
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

}  // namespace nlp
