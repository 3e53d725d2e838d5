// Model factory and weight loading (shared by GPT-2 and BERT).
#include <set>

#include "core/error.h"
#include "io/h5.h"
#include "io/tensor_checksum.h"
#include "io/weights.h"
#include "model/model.h"

namespace nlp {

std::unique_ptr<Model> make_gpt2(const ModelConfig& mc, Backend& be, bool allocate);
std::unique_ptr<Model> make_bert(const ModelConfig& mc, Backend& be, const std::string& task,
                                 bool allocate);

std::unique_ptr<Model> make_model(const ModelConfig& mc, Backend& be, const std::string& task,
                                  bool allocate) {
  if (mc.model_type() == ModelType::Gpt2) return make_gpt2(mc, be, allocate);
  return make_bert(mc, be, task, allocate);  // bert, roberta, electra
}

namespace {

// Datasets a weights file may hold that the model intentionally does not read.
bool expected_extra(const std::string& n) {
  auto ends = [&n](const std::string& s) {
    return n.size() >= s.size() && n.compare(n.size() - s.size(), s.size(), s) == 0;
  };
  return n == "lm_head.weight" || n.rfind("optimizer/", 0) == 0 || ends(".attn.bias") ||
         ends(".attn.masked_bias") || n == "cls.predictions.decoder.weight" ||
         n == "cls.predictions.decoder.bias" || n == "lm_head.decoder.weight" ||
         n == "lm_head.decoder.bias" || ends("embeddings.position_ids");
}

}  // namespace

// transformers saves a base model (BertModel, GPT2Model) without its base_model_prefix ('bert.',
// 'transformer.'): "embeddings.word_embeddings.weight" instead of "bert.embeddings.word_embeddings.weight".
// As from_pretrained does, a file in which no tensor name starts with the prefix is read as such a
// checkpoint: parameter "<prefix>X" comes from dataset "X"; head parameters (no prefix) keep their names.
void load_model_weights(Model& m, const std::string& path, std::vector<std::string>* unused,
                        std::vector<std::string>* fresh, std::string* note,
                        std::vector<std::string>* reinit) {
  h5::File f = h5::File::open_read(path);
  const std::vector<std::string> names = f.list();
  const std::string prefix = m.base_prefix();
  bool has_prefix = prefix.empty();
  for (const auto& n : names) has_prefix = has_prefix || n.rfind(prefix, 0) == 0;
  auto file_name = [&](const std::string& param) {
    if (has_prefix || param.rfind(prefix, 0) != 0) return param;
    return param.substr(prefix.size());
  };
  if (!has_prefix && note)
    *note = cat("no tensor name in the file starts with '", prefix,
                "': read as a base-model checkpoint (names without the prefix, as transformers saves ",
                m.config().model_type() == ModelType::Bert      ? "BertModel"
                : m.config().model_type() == ModelType::Roberta ? "RobertaModel"
                : m.config().model_type() == ModelType::Electra ? "ElectraModel"
                                                                : "GPT2Model",
                ")");
  std::vector<float> host;
  m.params().download(host);  // keeps the fresh initialisation of parameters absent from the file
  auto views = m.params().host_views(host);
  std::set<std::string> used;
  for (auto& t : views) {
    const std::string name = file_name(t.name);
    if (!f.has(name)) {
      if (!m.may_be_new(t.name))
        throw Error(cat("weights file '", path, "': missing tensor '", t.name, "' of shape ",
                        h5::shape_str(t.shape),
                        has_prefix ? std::string()
                                   : cat(" (looked for '", name, "': the file has no '", prefix,
                                         "' names)")));
      if (fresh) fresh->push_back(t.name);
      continue;
    }
    if (reinit && m.may_be_new(t.name) && f.shape(name) != t.shape) {
      reinit->push_back(cat(t.name, " (", h5::shape_str(f.shape(name)), " in the file, ",
                            h5::shape_str(t.shape), " for this task)"));
      used.insert(name);
      continue;
    }
    f.read_f32(name, t.shape, t.data);
    verify_checksum(f, name, t.data, t.numel());  // files written by nlptrain (best.h5, checkpoints)
    check_finite(path, name, t.shape, t.data);
    used.insert(name);
  }
  verify_checksum_count(f);
  if (unused) {
    for (const auto& n : names) {
      if (expected_extra(n) || used.count(n)) continue;
      unused->push_back(n);
    }
  }
  m.params().upload(host);
}

}  // namespace nlp
