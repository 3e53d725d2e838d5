#include "core/error.h"
#include "io/weights.h"
#include "model/model.h"

namespace nlp {

std::vector<std::string> load_model_weights(Model& m, const std::string& path) {
  h5::File f = h5::File::open_read(path);
  std::vector<float> host;
  auto views = m.params().host_views(host);
  std::vector<std::string> unused = load_tensors(f, views);
  std::vector<std::string> report;
  for (auto& n : unused) {
    const bool expected = n == "lm_head.weight" || n.rfind("optimizer/", 0) == 0 ||
                          (n.size() > 10 && (n.compare(n.size() - 10, 10, ".attn.bias") == 0)) ||
                          n.find(".attn.masked_bias") != std::string::npos;
    if (!expected) report.push_back(n);
  }
  m.params().upload(host);
  return report;
}

}  // namespace nlp
