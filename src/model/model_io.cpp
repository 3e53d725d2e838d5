// Model factory and weight loading (shared by GPT-2 and BERT).
#include "core/error.h"
#include "io/h5.h"
#include "io/tensor_checksum.h"
#include "model/model.h"

namespace nlp {

std::unique_ptr<Model> make_gpt2(const ModelConfig& mc, Backend& be);
std::unique_ptr<Model> make_bert(const ModelConfig& mc, Backend& be, const std::string& task);

std::unique_ptr<Model> make_model(const ModelConfig& mc, Backend& be, const std::string& task) {
  if (mc.type == "gpt2") return make_gpt2(mc, be);
  if (mc.type == "bert") return make_bert(mc, be, task);
  throw Error(cat("model.type: unsupported model type '", mc.type, "'"));
}

namespace {

// Datasets a weights file may hold that the model intentionally does not read.
bool expected_extra(const std::string& n) {
  auto ends = [&n](const std::string& s) {
    return n.size() >= s.size() && n.compare(n.size() - s.size(), s.size(), s) == 0;
  };
  return n == "lm_head.weight" || n.rfind("optimizer/", 0) == 0 || ends(".attn.bias") ||
         ends(".attn.masked_bias") || n == "cls.predictions.decoder.weight" ||
         n == "cls.predictions.decoder.bias" || ends("embeddings.position_ids");
}

}  // namespace

void load_model_weights(Model& m, const std::string& path, std::vector<std::string>* unused,
                        std::vector<std::string>* fresh) {
  h5::File f = h5::File::open_read(path);
  std::vector<float> host;
  m.params().download(host);  // keeps the fresh initialisation of parameters absent from the file
  auto views = m.params().host_views(host);
  std::vector<std::string> used;
  for (auto& t : views) {
    if (!f.has(t.name)) {
      if (!m.may_be_new(t.name))
        throw Error(cat("weights file '", path, "': missing tensor '", t.name, "' of shape ",
                        h5::shape_str(t.shape)));
      if (fresh) fresh->push_back(t.name);
      continue;
    }
    f.read_f32(t.name, t.shape, t.data);
    verify_checksum(f, t.name, t.data, t.numel());  // files written by nlptrain (best.h5, checkpoints)
    used.push_back(t.name);
  }
  verify_checksum_count(f);
  if (unused) {
    for (const auto& n : f.list()) {
      if (expected_extra(n)) continue;
      bool found = false;
      for (const auto& u : used) found = found || u == n;
      if (!found) unused->push_back(n);
    }
  }
  m.params().upload(host);
}

}  // namespace nlp
