// Model weights: one float32 dataset per tensor (HF state_dict names), config as root attributes.
#include "io/weights.h"

#include <algorithm>
#include <cmath>
#include <set>

#include "core/error.h"
#include "io/tensor_checksum.h"

namespace nlp {

namespace {

using h5::shape_str;

}  // namespace

void check_finite(const std::string& path, const std::string& name, const std::vector<int64_t>& shape,
                  const float* data) {
  int64_t n = 1;
  for (auto d : shape) n *= d;
  for (int64_t i = 0; i < n; ++i) {
    if (std::isfinite(data[i])) continue;
    std::vector<int64_t> at(shape.size());
    int64_t rest = i;
    for (size_t k = shape.size(); k-- > 0;) {
      at[k] = shape[k] > 0 ? rest % shape[k] : 0;
      rest = shape[k] > 0 ? rest / shape[k] : 0;
    }
    const char* v = std::isnan(data[i]) ? "nan" : data[i] > 0 ? "inf" : "-inf";
    throw Error(cat("file '", path, "': tensor '", name, "' holds a non-finite value ", v, " at ",
                    shape_str(at), ": the weights are unusable (a diverged run, or a damaged file)"));
  }
}

void save_weights(const std::string& path, const std::vector<NamedTensor>& tensors,
                  const std::function<void(h5::File&)>& write_attrs) {
  std::set<std::string> seen;
  for (const auto& t : tensors) {
    if (t.name.empty()) throw Error(cat("save_weights '", path, "': a tensor has an empty name"));
    if (!seen.insert(t.name).second)
      throw Error(cat("save_weights '", path, "': tensor '", t.name, "' is listed twice"));
    if (t.numel() > 0 && t.data == nullptr)
      throw Error(cat("save_weights '", path, "': tensor '", t.name, "' has no data"));
  }
  h5::write_atomically(path, [&](h5::File& f) {
    for (const auto& t : tensors) write_checksummed_f32(f, t.name, t.shape, t.data);
    record_checksum_count(f, static_cast<int64_t>(tensors.size()));
    if (write_attrs) write_attrs(f);
  });
}

std::vector<std::string> load_tensors(const h5::File& f, const std::vector<NamedTensor>& tensors,
                                      const std::string& prefix) {
  std::set<std::string> requested;
  for (const auto& t : tensors) {
    const std::string name = prefix + t.name;
    requested.insert(name);
    if (!f.has(name))
      throw Error(cat("file '", f.path(), "': tensor '", name, "' not found (expected float32 ",
                      shape_str(t.shape), ")"));
    const h5::DType dt = f.dtype(name);
    // A type outside the DType set: the HDF5 layer's message describes it precisely.
    if (dt == h5::DType::Other) f.read_f32(name, f.shape(name), nullptr);
    if (dt != h5::DType::F32)
      throw Error(cat("file '", f.path(), "': tensor '", name, "' has dtype ", h5::dtype_name(dt),
                      ", expected float32"));
    const std::vector<int64_t> shape = f.shape(name);
    if (shape != t.shape)
      throw Error(cat("file '", f.path(), "': tensor '", name, "' has shape ", shape_str(shape),
                      ", expected ", shape_str(t.shape)));
    if (t.numel() > 0 && t.data == nullptr)
      throw Error(cat("load_tensors: tensor '", name, "' has no destination buffer"));
    f.read_f32(name, t.shape, t.data);
    verify_checksum(f, name, t.data, t.numel());
    check_finite(f.path(), name, t.shape, t.data);
  }

  // Datasets in prefix's group whose names start with prefix and were not requested (full names;
  // for prefix "" this includes a checkpoint's optimizer/ datasets, which callers may filter).
  const size_t slash = prefix.rfind('/');
  const std::string group = slash == std::string::npos ? std::string() : prefix.substr(0, slash);
  std::vector<std::string> unused;
  for (const auto& name : f.list(group)) {
    if (name.compare(0, prefix.size(), prefix) != 0) continue;
    if (!requested.count(name)) unused.push_back(name);
  }
  return unused;
}

}  // namespace nlp
