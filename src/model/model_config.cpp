// The model configuration: from the INI, or from the root attributes of model.weights.
// With a weights file the architecture comes from the file; an architecture key set explicitly in
// the INI (or on the command line) that disagrees with the file is an error naming both values.
// Dropout probabilities may be overridden (they are training choices, not architecture).
#include <cmath>
#include <limits>

#include "core/error.h"
#include "io/h5.h"
#include "model/model.h"

namespace nlp {
namespace {

void take_int(const Config& cfg, const h5::File& f, const std::string& key, int& field) {
  if (!f.has_attr(key))
    throw Error(cat("weights file '", f.path(), "': missing root attribute '", key, "'"));
  const int64_t v = f.attr_int(key);
  if (cfg.is_set("model." + key) && v != field)
    throw Error(cat("model.", key, " = ", field, " (", cfg.source.empty() ? "command line" : cfg.source,
                    ") disagrees with ", key, " = ", v, " in weights file '", f.path(), "'"));
  if (v < 1) throw Error(cat("weights file '", f.path(), "': attribute ", key, " = ", v, " must be >= 1"));
  // Sizes are int in the model: a larger value must not wrap around (2^32 + 8 would become 8).
  if (v > std::numeric_limits<int>::max())
    throw Error(cat("weights file '", f.path(), "': attribute ", key, " = ", v, " is too large (max ",
                    std::numeric_limits<int>::max(), ")"));
  field = static_cast<int>(v);
}

// The ranges the INI schema enforces for the same keys (config.cpp): probabilities in [0, 1),
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

}  // namespace

ModelConfig resolve_model_config(const Config& cfg) {
  ModelConfig mc = cfg.model;
  if (mc.weights.empty()) return mc;
  h5::File f = h5::File::open_read(mc.weights);
  if (!f.has_attr("model_type"))
    throw Error(cat("weights file '", mc.weights,
                    "': missing root attribute 'model_type' (expected \"gpt2\" or \"bert\")"));
  const std::string type = f.attr_string("model_type");
  if (type != mc.type)
    throw Error(cat("weights file '", mc.weights, "' has model_type = \"", type,
                    "\" but model.type = ", mc.type));
  take_int(cfg, f, "vocab_size", mc.vocab_size);
  take_float(cfg, f, "initializer_range", mc.initializer_range, true, FloatRange::Positive);
  if (type == "bert") {
    take_int(cfg, f, "hidden_size", mc.hidden_size);
    take_int(cfg, f, "num_hidden_layers", mc.num_hidden_layers);
    take_int(cfg, f, "num_attention_heads", mc.num_attention_heads);
    take_int(cfg, f, "intermediate_size", mc.intermediate_size);
    take_int(cfg, f, "max_position_embeddings", mc.max_position_embeddings);
    take_int(cfg, f, "type_vocab_size", mc.type_vocab_size);
    if (mc.hidden_size % mc.num_attention_heads != 0)
      throw Error(cat("weights file '", mc.weights, "': hidden_size = ", mc.hidden_size,
                      " is not divisible by num_attention_heads = ", mc.num_attention_heads));
    take_float(cfg, f, "layer_norm_eps", mc.layer_norm_eps, false, FloatRange::Positive);
    take_float(cfg, f, "hidden_dropout_prob", mc.hidden_dropout_prob, true, FloatRange::Probability);
    take_float(cfg, f, "attention_probs_dropout_prob", mc.attention_probs_dropout_prob, true, FloatRange::Probability);
    // num_labels is not taken from the file: fine-tuning an encoder may use a new head size.
    return mc;
  }
  take_int(cfg, f, "n_layer", mc.n_layer);
  take_int(cfg, f, "n_head", mc.n_head);
  take_int(cfg, f, "n_embd", mc.n_embd);
  take_int(cfg, f, "n_positions", mc.n_positions);
  if (mc.n_embd % mc.n_head != 0)
    throw Error(cat("weights file '", mc.weights, "': n_embd = ", mc.n_embd,
                    " is not divisible by n_head = ", mc.n_head));
  take_float(cfg, f, "layer_norm_epsilon", mc.layer_norm_epsilon, false, FloatRange::Positive);
  take_float(cfg, f, "embd_pdrop", mc.embd_pdrop, true, FloatRange::Probability);
  take_float(cfg, f, "attn_pdrop", mc.attn_pdrop, true, FloatRange::Probability);
  take_float(cfg, f, "resid_pdrop", mc.resid_pdrop, true, FloatRange::Probability);
  return mc;
}

}  // namespace nlp
