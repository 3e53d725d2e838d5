// The CUDA backend: every op of core/backend.h in fp32 on one GPU (cuBLASLt GEMMs, the hand-written
// kernels of kernels/*.cu). Implemented by cuda_backend_impl.h and its *_cuda.cpp files when built
// with CUDA; the stub (cuda_backend_stub.cpp) throws nlp::Error in builds without CUDA.
#pragma once
#include <memory>
#include <string>

#include "core/backend.h"

namespace nlp {

// Arithmetic of the dense-layer GEMMs (matmul_forward/backward); every other op is fp32, and the
// parameters, gradients, optimizer state and activations stay fp32 in every mode:
//   Fp32: strict fp32 (CUBLAS_COMPUTE_32F), the mode the tests hold to 1e-5 of the CPU backend;
//   Tf32: fp32 storage, TF32 tensor cores (CUBLAS_COMPUTE_32F_FAST_TF32), ~1e-3 relative;
//   Bf16: operands rounded to bf16 on the fly (fp32 master weights), fp32 accumulation and output.
using CudaMatmul = Precision;  // Fp32 | Tf32 | Bf16 (core/backend.h)

// Binds GPU `local_rank` (cudaSetDevice) and creates the backend's stream and library handles.
// Throws nlp::Error when CUDA is not compiled in, no device is usable, or local_rank has no GPU.
// options.precision: the GEMM arithmetic (CudaMatmul above);
// options.sync_check: synchronise the stream and check for errors after every op (names the op);
// options.fused_attention: attention_forward/backward through cuDNN's fused SDPA where cuDNN
//   supports the shape (attention_cudnn.h); an error when nlptrain was built without cuDNN.
std::unique_ptr<Backend> make_cuda_backend(int local_rank, const BackendOptions& options = {});

// Whether this build has cuDNN's fused attention (BackendOptions::fused_attention); when not, *why
// (nullable) says what was missing at build time.
bool cuda_fused_attention_available(std::string* why);

// Packed-row attention calls that cuDNN ran in each layout (ragged THD sequences, block-diagonal
// bias) in this process, forward and backward each counting one (attention_cudnn.h): for tests that
// force a layout and must know it ran. Zero without CUDA or cuDNN.
struct CudnnPackedCalls {
  long ragged = 0, bias = 0;
};
CudnnPackedCalls cuda_cudnn_packed_calls();

// The cudaStream_t (as void*) on which a CUDA backend enqueues every op, e.g. for an NCCL
// communicator to reduce gradients in stream order; nullptr for any other backend.
void* cuda_backend_stream(Backend& be);

}  // namespace nlp
