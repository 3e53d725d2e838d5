// The CPU backend: the reference implementation of every op (OpenBLAS GEMMs, OpenMP threads).
#pragma once
#include <memory>

#include "core/backend.h"

namespace nlp {

// threads: OpenMP threads for this rank's ops (and OpenBLAS); <= 0 leaves the runtime default.
std::unique_ptr<Backend> make_cpu_backend(int threads);

}  // namespace nlp
