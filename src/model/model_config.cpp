// The model configuration: from the INI, or from the root attributes of model.weights.
// With a weights file the architecture comes from the file; an architecture key set explicitly in
// the INI (or on the command line) that disagrees with the file is an error naming both values.
// Dropout probabilities may be overridden (they are training choices, not architecture).
#include <algorithm>
#include <cmath>
#include <filesystem>
#include <limits>

#include "core/error.h"
#include "io/h5.h"
#include "model/lm_head.h"
#include "model/model.h"
#include "text/json_min.h"

namespace nlp {
namespace {

void take_int(const Config& cfg, const h5::File& f, const std::string& key, int& field) {
  if (!f.has_attr(key))
    throw Error(cat("weights file '", f.path(), "': missing root attribute '", key, "'"));
  const int64_t v = f.attr_int(key);
  if (cfg.is_set("model." + key) && v != field)
    throw Error(cat("model.", key, " = ", field, " (", cfg.where("model." + key), ") disagrees with ", key, " = ", v, " in weights file '", f.path(), "'"));
  if (v < 1) throw Error(cat("weights file '", f.path(), "': attribute ", key, " = ", v, " must be >= 1"));
  // Sizes are int in the model: a larger value must not wrap around (2^32 + 8 would become 8).
  if (v > std::numeric_limits<int>::max())
    throw Error(cat("weights file '", f.path(), "': attribute ", key, " = ", v, " is too large (max ",
                    std::numeric_limits<int>::max(), ")"));
  field = static_cast<int>(v);
}

// The ranges the INI schema enforces for the same keys (config/config_schema.cpp): probabilities in [0, 1),
// everything else (epsilons, initializer_range) > 0; and the value must be a finite float.
enum class FloatRange { Probability, Positive };

void take_float(const Config& cfg, const h5::File& f, const std::string& key, float& field,
                bool overridable, FloatRange range) {
  if (!f.has_attr(key)) return;  // optional: keep the INI value
  const double d = f.attr_double(key);
  if (overridable && cfg.is_set("model." + key)) return;  // the INI's value wins; the file's is unused
  bool ok = std::isfinite(d) && std::fabs(d) <= std::numeric_limits<float>::max();
  const float v = ok ? static_cast<float>(d) : 0.f;  // converted only when it fits
  ok = ok && (range == FloatRange::Probability ? v >= 0.f && v < 1.f : v > 0.f);
  if (!ok)
    throw Error(cat("weights file '", f.path(), "': attribute ", key, " = ", d, " is out of range (",
                    range == FloatRange::Probability ? "must be in [0, 1)" : "must be a float > 0", ")"));
  if (cfg.is_set("model." + key)) {
    if (overridable) return;
    if (std::fabs(v - field) > 1e-6f * std::fabs(v))
      throw Error(cat("model.", key, " = ", field, " disagrees with ", key, " = ", v,
                      " in weights file '", f.path(), "'"));
  }
  field = v;
}

// The weights file's width must split evenly over its heads.
void check_heads(const ModelConfig& mc, const char* width_key, int width, const char* heads_key, int heads) {
  if (width % heads != 0)
    throw Error(cat("weights file '", mc.weights, "': ", width_key, " = ", width, " is not divisible by ", heads_key,
                    " = ", heads));
}

// The dataset whose num_labels / id2label describe the task: data.train when the run trains (train,
// gradients), else data.eval (eval, predict: data.train may name a file of another machine), each
// falling back to the other when empty.
const std::string& labelled_dataset(const Config& cfg) {
  const std::string& first = cfg.reads_train() ? cfg.data.train : cfg.data.eval;
  return first.empty() ? (cfg.reads_train() ? cfg.data.eval : cfg.data.train) : first;
}

}  // namespace

// num_labels of a classifier task, as from_pretrained decides it: a weights file that carries a
// classifier fixes it (the rows of classifier.weight; its num_labels / id2label attributes must agree);
// model.num_labels, when set, must then agree (0 = the dataset's num_labels, which must agree too).
// Without a classifier in the file: model.num_labels, or the dataset's when it is 0.
NumLabels resolve_num_labels(const Config& cfg, const ModelConfig& mc) {
  const std::string where = cfg.where("model.num_labels");
  const std::string& data = labelled_dataset(cfg);
  auto dataset_num_labels = [&](bool required) -> int64_t {
    if (data.empty()) {
      if (required) throw Error("model.num_labels = 0 needs data.train or data.eval (their num_labels attribute)");
      return 0;
    }
    h5::File d = h5::File::open_read(data);
    if (!d.has_attr("num_labels")) {
      if (required)
        throw Error(cat("model.num_labels = 0 and dataset '", data,
                        "' has no num_labels attribute: set model.num_labels"));
      return 0;
    }
    return d.attr_int("num_labels");
  };
  NumLabels r;
  if (!mc.weights.empty()) {
    h5::File f = h5::File::open_read(mc.weights);
    // RoBERTa's and ELECTRA's sequence classifier is classifier.out_proj (after classifier.dense)
    const std::string name = f.has("classifier.out_proj.weight") ? "classifier.out_proj.weight" : "classifier.weight";
    if (f.has(name)) {
      const std::vector<int64_t> shape = f.shape(name);
      if (shape.size() != 2)
        throw Error(cat("weights file '", f.path(), "': tensor '", name, "' has shape ", h5::shape_str(shape),
                        ", expected [num_labels, hidden_size]"));
      const int64_t n = shape[0];
      if (f.has_attr("num_labels") && f.attr_int("num_labels") != n)
        throw Error(cat("weights file '", f.path(), "': attribute num_labels = ", f.attr_int("num_labels"),
                        " disagrees with '", name, "' of shape ", h5::shape_str(shape)));
      if (f.has_attr("id2label")) {
        const auto names = text::parse_string_array(f.attr_string("id2label"), f.path() + ":id2label");
        if (int64_t(names.size()) != n)
          throw Error(cat("weights file '", f.path(), "': attribute id2label has ", names.size(),
                          " labels but '", name, "' has shape ", h5::shape_str(shape)));
      }
      if (n < 2)
        throw Error(cat("weights file '", f.path(), "': '", name, "' of shape ", h5::shape_str(shape),
                        " has ", n, " label(s); doc_cls, pair_cls and ner need at least 2"));
      const char* hint = "; model.reinit_mismatched = true initialises a new head of the task's size";
      // The size the task asks for: model.num_labels when set (not 0), else the dataset's.
      const bool explicit_n = cfg.is_set("model.num_labels") && mc.num_labels != 0;
      const int64_t want = explicit_n ? mc.num_labels : dataset_num_labels(false);
      if (want != 0 && want != n && mc.reinit_mismatched) {
        r.n = static_cast<int>(want);
        r.reinit = true;
        r.source = cat(explicit_n ? cat("model.num_labels (", where, ")")
                                  : cat("the num_labels attribute of dataset '", data, "'"),
                       "; model.reinit_mismatched: the ", n, "-label classifier of weights file '", f.path(),
                       "' is replaced by a new one");
        return r;
      }
      if (explicit_n && mc.num_labels != n)
        throw Error(cat("model.num_labels = ", mc.num_labels, " (", where, ") disagrees with num_labels = ", n,
                        " of weights file '", f.path(), "' ('", name, "' has shape ", h5::shape_str(shape), ")",
                        hint));
      if (!explicit_n && want != 0 && want != n)
        throw Error(cat("dataset '", data, "' has num_labels = ", want, " but weights file '", f.path(),
                        "' has num_labels = ", n, " ('", name, "' has shape ", h5::shape_str(shape), ")", hint));
      r.n = static_cast<int>(n);
      r.source = cat("from '", name, "' of shape ", h5::shape_str(shape), " in weights file '", f.path(), "'");
      return r;
    }
  }
  if (mc.num_labels == 0) {
    r.n = static_cast<int>(dataset_num_labels(true));
    r.source = cat("from the num_labels attribute of dataset '", data, "'");
  } else {
    r.n = mc.num_labels;
    r.source = cfg.is_set("model.num_labels") ? "model.num_labels" : "the default of model.num_labels";
  }
  return r;
}

std::vector<std::string> resolve_label_names(const Config& cfg, const ModelConfig& mc, std::string* source) {
  const std::string& data = labelled_dataset(cfg);
  if (!data.empty()) {
    h5::File d = h5::File::open_read(data);
    if (d.has_attr("id2label")) {
      if (source) *source = cat("dataset '", data, "'");
      return text::parse_string_array(d.attr_string("id2label"), data + ":id2label");
    }
  }
  if (!mc.weights.empty()) {
    h5::File f = h5::File::open_read(mc.weights);
    if (f.has_attr("id2label")) {
      auto names = text::parse_string_array(f.attr_string("id2label"), mc.weights + ":id2label");
      if (int(names.size()) == mc.num_labels) {
        if (source) *source = cat("weights file '", mc.weights, "'");
        return names;
      }
    }
  }
  return {};
}

namespace {

// A Hugging Face model folder, or one of its weight files, given as model.weights: name the one
// command that converts it (the folder holds config.json beside the weights).
void check_not_hub_layout(const Config& cfg) {
  namespace fs = std::filesystem;
  const std::string& w = cfg.model.weights;
  std::error_code ec;
  const fs::path p(w);
  if (!fs::exists(p, ec))
    throw Error(cat("model.weights = '", w, "' (", cfg.where("model.weights"), "): file not found (an HDF5 "
                    "weights file: a checkpoint or best.h5 of an earlier run, or a Hugging Face model folder "
                    "converted with tools/hf_import.py; empty = initialise from scratch)"));
  const bool folder = fs::is_directory(p, ec);
  const std::string ext = p.extension().string();
  if (!folder && ext != ".safetensors" && ext != ".bin" && p.filename() != "config.json") return;
  const fs::path dir = folder ? p : p.parent_path().empty() ? fs::path(".") : p.parent_path();
  const bool hub = fs::exists(dir / "config.json", ec);
  fs::path out = dir.filename().empty() ? dir.parent_path() : dir;
  const std::string h5 = (out.empty() || out == "." ? std::string("model") : out.string()) + ".h5";
  throw Error(cat("model.weights = '", w, "' (", cfg.where("model.weights"), ") is ",
                  folder ? "a folder" : "a " + (ext.empty() ? p.filename().string() : ext) + " file",
                  ", not nlptrain's HDF5 weights", hub ? " (a Hugging Face model folder)" : "",
                  ": convert it once with\n  python3 tools/hf_import.py ", dir.string(), " ", h5,
                  "\nand set model.weights = ", h5, hub ? "" : " (the folder needs the model's config.json)"));
}

}  // namespace

ModelConfig resolve_model_config(const Config& cfg) {
  ModelConfig mc = cfg.model;
  resolve_lm_head(mc, cfg.run.backend, cfg.mode());
  if (cfg.run.bf16_activations && cfg.precision() != Precision::Bf16)
    throw Error(cat("run.bf16_activations = true (", cfg.where("run.bf16_activations"),
                    ") needs train.precision = bf16, not '", cfg.train.precision, "' (",
                    cfg.where("train.precision"), "): fp32 and tf32 runs keep fp32 activations"));
  mc.bf16_activations = cfg.run.bf16_activations;
  if (mc.weights.empty()) return mc;
  check_not_hub_layout(cfg);
  h5::File f = h5::File::open_read(mc.weights);
  if (!f.has_attr("model_type"))
    throw Error(cat("weights file '", mc.weights,
                    "': missing root attribute 'model_type' (expected \"gpt2\", \"bert\", \"roberta\" or "
                    "\"electra\")"));
  const std::string type = f.attr_string("model_type");
  if (model_type_from_weights(cfg)) {
    // model.type not given: the weights' model_type, then the checks parse_config left for it
    if (type != "gpt2" && type != "bert" && type != "roberta" && type != "electra")
      throw Error(cat("weights file '", mc.weights, "' has model_type = \"", type,
                      "\": nlptrain runs gpt2, bert, roberta and electra"));
    Config typed = cfg;
    typed.model.type = type;
    check_model_type(typed, cat("the model_type of weights file '", mc.weights, "'"));
    mc.type = type;
  }
  // An encoder's weights given on the command line to an INI written for another encoder (job 1's
  // INI, model.type = bert, with --model.weights=roberta.h5): the command line wins over the INI,
  // as everywhere; the model line of the log names the type that runs.
  const auto encoder = [](const std::string& t) { return t == "bert" || t == "roberta" || t == "electra"; };
  if (type != mc.type && encoder(type) && encoder(mc.type) && cfg.set_on_command_line.count("model.weights") &&
      !cfg.set_on_command_line.count("model.type")) {
    Config typed = cfg;
    typed.model.type = type;
    check_model_type(typed, cat("the model_type of weights file '", mc.weights, "' (--model.weights)"));
    mc.type = type;
  }
  if (type != mc.type)
    throw Error(cat("weights file '", mc.weights, "' has model_type = \"", type,
                    "\" but model.type = ", mc.type, " (", cfg.where("model.type"),
                    "; leave model.type out to take it from the weights)"));
  take_int(cfg, f, "vocab_size", mc.vocab_size);
  take_float(cfg, f, "initializer_range", mc.initializer_range, true, FloatRange::Positive);
  if (mc.is_encoder()) {
    // ELECTRA's generator (ElectraForMaskedLM) has the discriminator's names under electra. but
    // another objective and shape: refused, rather than fine-tuned as if it were the discriminator
    if (mc.model_type() == ModelType::Electra)
      for (const char* gen : {"generator_lm_head.weight", "generator_predictions.dense.weight"})
        if (f.has(gen))
          throw Error(cat("weights file '", mc.weights, "' holds '", gen, "': an ELECTRA generator "
                          "(ElectraForMaskedLM); nlptrain fine-tunes the discriminator (ElectraModel, "
                          "ElectraForPreTraining, e.g. the Hub's *-discriminator folders)"));
    take_int(cfg, f, "hidden_size", mc.hidden_size);
    take_int(cfg, f, "num_hidden_layers", mc.num_hidden_layers);
    take_int(cfg, f, "num_attention_heads", mc.num_attention_heads);
    take_int(cfg, f, "intermediate_size", mc.intermediate_size);
    take_int(cfg, f, "max_position_embeddings", mc.max_position_embeddings);
    take_int(cfg, f, "type_vocab_size", mc.type_vocab_size);
    if (mc.model_type() == ModelType::Electra) {
      if (f.has_attr("embedding_size")) take_int(cfg, f, "embedding_size", mc.embedding_size);
      else mc.embedding_size = mc.hidden_size;
    }
    check_heads(mc, "hidden_size", mc.hidden_size, "num_attention_heads", mc.num_attention_heads);
    take_float(cfg, f, "layer_norm_eps", mc.layer_norm_eps, false, FloatRange::Positive);
    take_float(cfg, f, "hidden_dropout_prob", mc.hidden_dropout_prob, true, FloatRange::Probability);
    take_float(cfg, f, "attention_probs_dropout_prob", mc.attention_probs_dropout_prob, true, FloatRange::Probability);
    // pad_token_id: transformers' padding_idx of the word embeddings (-1 = null in config.json,
    // as tools/hf_import.py writes it); a file without it keeps the INI value (default 0, as BertConfig).
    if (f.has_attr("pad_token_id")) {
      const int64_t v = f.attr_int("pad_token_id");
      if (cfg.is_set("model.pad_token_id") && v != mc.pad_token_id)
        throw Error(cat("model.pad_token_id = ", mc.pad_token_id, " (",
                        cfg.where("model.pad_token_id"), ") disagrees with pad_token_id = ",
                        v, " in weights file '", f.path(), "'"));
      if (v < -1 || v >= mc.vocab_size)
        throw Error(cat("weights file '", f.path(), "': attribute pad_token_id = ", v,
                        " is outside [-1, vocab_size = ", mc.vocab_size, ")"));
      mc.pad_token_id = static_cast<int>(v);
    }
    if (mc.model_type() == ModelType::Roberta && mc.max_sequence_length() < 1)
      throw Error(cat("weights file '", f.path(), "': max_position_embeddings = ", mc.max_position_embeddings,
                      " leaves no position after pad_token_id = ", mc.pad_token_id,
                      " (roberta's positions start at pad_token_id + 1)"));
    return mc;
  }
  take_int(cfg, f, "n_layer", mc.n_layer);
  take_int(cfg, f, "n_head", mc.n_head);
  take_int(cfg, f, "n_embd", mc.n_embd);
  take_int(cfg, f, "n_positions", mc.n_positions);
  check_heads(mc, "n_embd", mc.n_embd, "n_head", mc.n_head);
  take_float(cfg, f, "layer_norm_epsilon", mc.layer_norm_epsilon, false, FloatRange::Positive);
  take_float(cfg, f, "embd_pdrop", mc.embd_pdrop, true, FloatRange::Probability);
  take_float(cfg, f, "attn_pdrop", mc.attn_pdrop, true, FloatRange::Probability);
  take_float(cfg, f, "resid_pdrop", mc.resid_pdrop, true, FloatRange::Probability);
  return mc;
}

namespace {

struct VocabAttrs {
  std::string what;  // what names the file in messages ("data.train 'x.h5'")
  std::string vocab_sha256, tokenizer_sha256, tokenizer_files;
  int64_t vocab_size = 0;  // a dataset's vocab_size attribute; 0 = not recorded (or a weights file)
};

VocabAttrs read_vocab_attrs(const std::string& path, const std::string& key) {
  VocabAttrs v;
  v.what = cat(key, " '", path, "'");
  if (path.empty()) return v;
  h5::File f = h5::File::open_read(path);
  auto str = [&](const char* k) { return f.has_attr(k) ? f.attr_string(k) : std::string(); };
  v.vocab_sha256 = str("vocab_sha256");
  v.tokenizer_sha256 = str("tokenizer_sha256");
  v.tokenizer_files = str("tokenizer_files");
  // a weights file's vocab_size is the model's own, not its tokenizer's
  if (key != "model.weights" && f.has_attr("vocab_size")) v.vocab_size = f.attr_int("vocab_size");
  return v;
}

std::string describe(const VocabAttrs& v) {
  std::string files = v.tokenizer_files;
  std::replace(files.begin(), files.end(), '\n', ' ');
  return cat(v.what, " (vocab_sha256 ", v.vocab_sha256.substr(0, 12), "...",
             files.empty() ? std::string() : cat(", tokenizer ", files), ")");
}

}  // namespace

std::vector<std::string> resolve_tokenizer(const Config& cfg, ModelConfig& mc) {
  std::vector<std::string> warnings;
  // the datasets this mode reads (predict and eval never open data.train)
  const VocabAttrs train = read_vocab_attrs(cfg.reads_train() ? cfg.data.train : std::string(), "data.train");
  const VocabAttrs eval = read_vocab_attrs(cfg.reads_eval() ? cfg.data.eval : std::string(), "data.eval");
  const VocabAttrs weights = read_vocab_attrs(mc.weights, "model.weights");
  const VocabAttrs* sides[] = {&train, &eval, &weights};
  const VocabAttrs* first = nullptr;
  for (const VocabAttrs* v : sides) {
    if (v->vocab_sha256.empty()) continue;
    if (!first) {
      first = v;
      continue;
    }
    if (v->vocab_sha256 != first->vocab_sha256)
      throw Error(cat(describe(*first), " and ", describe(*v),
                      " were tokenised with different vocabularies: prepare the data with the model's "
                      "tokenizer (tools/make_dataset.py --tokenizer PATH, or the prep tools' --tokenizer)"));
  }
  for (const VocabAttrs* v : {&train, &eval}) {
    if (v->vocab_size <= 0) continue;
    if (v->vocab_size > mc.vocab_size)
      throw Error(cat(v->what, " has vocab_size = ", v->vocab_size, " (its root attribute) but the model has "
                      "vocab_size = ", mc.vocab_size, " (", mc.weights.empty() ? cfg.where("model.vocab_size")
                                                                               : "model.weights",
                      "): ids would fall outside the embedding; set model.vocab_size = ", v->vocab_size,
                      " or use the model's tokenizer"));
    if (v->vocab_size < mc.vocab_size)
      warnings.push_back(cat("warning: ", v->what, " has vocab_size = ", v->vocab_size,
                             " (its root attribute), smaller than the model's vocab_size = ", mc.vocab_size,
                             " (", mc.weights.empty() ? cfg.where("model.vocab_size") : "model.weights",
                             "): ", mc.vocab_size - v->vocab_size, " embedding rows are never used",
                             mc.weights.empty() ? cat("; set model.vocab_size = ", v->vocab_size) : std::string()));
  }
  if (first) {
    mc.vocab_sha256 = first->vocab_sha256;
    mc.tokenizer_sha256 = first->tokenizer_sha256;
    mc.tokenizer_files = first->tokenizer_files;
  }
  return warnings;
}

void write_tokenizer_attrs(h5::File& f, const ModelConfig& mc) {
  if (mc.vocab_sha256.empty()) return;
  f.set_attr("vocab_sha256", mc.vocab_sha256);
  if (!mc.tokenizer_sha256.empty()) f.set_attr("tokenizer_sha256", mc.tokenizer_sha256);
  if (!mc.tokenizer_files.empty()) f.set_attr("tokenizer_files", mc.tokenizer_files);
}

}  // namespace nlp
