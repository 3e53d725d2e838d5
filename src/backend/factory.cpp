// The backend factory (factory.h): maps run.backend to an implementation and explains why one is
// unavailable.
#include "backend/factory.h"

#include "backend/cpu/cpu_backend.h"
#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/device.h"
#include "core/error.h"

namespace nlp {

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
