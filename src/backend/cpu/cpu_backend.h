// The CPU backend: the reference implementation of every op (OpenBLAS GEMMs, OpenMP threads).
#pragma once
#include <memory>
#include <string>

#include "core/backend.h"

namespace nlp {

// threads: OpenMP threads for this rank's ops (and its GEMM library); <= 0 leaves the runtime default.
// precision: Tf32/Bf16 round the dense-layer GEMM operands as the GPU's tensor cores read them.
// gemm: Auto (the library cpu::auto_gemm_lib picks for this CPU and build), OpenBlas or OneDnn
//   (run.cpu_gemm).
// bf16: with Precision::Bf16, Emulate (round to bf16, multiply in fp32: the reference), Native
//   (bf16 operands multiplied by oneDNN with AMX / AVX512-BF16, fp32 accumulation) or Auto (native
//   where the CPU has AMX-BF16, else emulate: cpu::auto_native_bf16) (run.cpu_bf16). An unavailable
//   explicit choice throws nlp::Error naming the key.
// bf16_weights: with Precision::Bf16, the persistent bf16 copy of the weights (Backend::register_weights,
//   run.bf16_weights), which the GEMMs read instead of rounding a weight per call: the same bits.
// Whether this CPU multiplies bf16 natively (what run.cpu_bf16 = native needs); if not, why (its
// instruction set and what native bf16 needs).
bool cpu_native_bf16(std::string* why = nullptr);
// Whether run.cpu_bf16 = auto picks native bf16 here (only with AMX-BF16); why: which and why.
bool cpu_auto_native_bf16(std::string* why = nullptr);

std::unique_ptr<Backend> make_cpu_backend(int threads, Precision precision = Precision::Fp32,
                                          CpuGemm gemm = CpuGemm::Auto,
                                          CpuBf16 bf16 = CpuBf16::Emulate,
                                          bool bf16_weights = false);

}  // namespace nlp
