// The CPU backend: the reference implementation of every op (OpenBLAS GEMMs, OpenMP threads).
#pragma once
#include <memory>

#include "core/backend.h"

namespace nlp {

// threads: OpenMP threads for this rank's ops (and OpenBLAS); <= 0 leaves the runtime default.
// precision: Tf32/Bf16 round the dense-layer GEMM operands as the GPU's tensor cores read them.
std::unique_ptr<Backend> make_cpu_backend(int threads, Precision precision = Precision::Fp32);

}  // namespace nlp
