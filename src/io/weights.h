// Model weights in HDF5, Hugging Face layout: one float32 dataset per tensor, named and shaped like the
// transformers state_dict keys (e.g. "transformer.h.0.attn.c_attn.weight" [n_embd, 3*n_embd]), with the
// model config as attributes on the root (model_type plus HF config names). Any checkpoint is a valid
// weights file because checkpoints use the same layout plus an "optimizer/" group.
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "io/h5.h"

namespace nlp {

// A named tensor in host memory (the caller owns the storage).
struct NamedTensor {
  std::string name;
  std::vector<int64_t> shape;
  float* data = nullptr;
  int64_t numel() const {
    int64_t n = 1;
    for (auto d : shape) n *= d;
    return n;
  }
};

// Write every tensor (float32) under its name with its checksum (io/tensor_checksum.h), plus root
// attributes via write_attrs, atomically.
void save_weights(const std::string& path, const std::vector<NamedTensor>& tensors,
                  const std::function<void(h5::File&)>& write_attrs);

// Read every tensor from f (each must exist, be float32 and have exactly the expected shape, else an
// error naming the file, the tensor, and expected vs found), in a file with checksums must match its
// checksum (else an error naming the file and the tensor), and must be finite (NaN or infinite values
// are errors). `prefix` is prepended to dataset names
// ("" for weights, "optimizer/exp_avg/" for optimizer state). Returns the names of datasets under
// `prefix`'s group in the file that were not requested (callers report them as unused).
// Throws naming the file, the tensor, the first non-finite value (nan, inf, -inf) and its index
// when data (of the given shape) holds a NaN or an infinity.
void check_finite(const std::string& path, const std::string& name, const std::vector<int64_t>& shape,
                  const float* data);

std::vector<std::string> load_tensors(const h5::File& f, const std::vector<NamedTensor>& tensors,
                                      const std::string& prefix = "");

}  // namespace nlp
