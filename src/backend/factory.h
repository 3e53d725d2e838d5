// The backend factory: run.backend's name to an implementation (the CPU or the CUDA backend). It sits
// above both backends, so core/ (the interface) includes neither.
#pragma once
#include <memory>
#include <string>

#include "core/backend.h"

namespace nlp {

// "cpu" or "cuda". Throws nlp::Error naming the backend when it is unavailable.
// The CPU backend uses options.precision and the cpu_* options.
std::unique_ptr<Backend> make_backend(const std::string& name, int threads, int local_rank,
                                      const BackendOptions& options = {});

}  // namespace nlp
