// libFuzzer harness: the HDF5 weights reader, on structured inputs (see fuzz_dataset.cpp for why the
// bytes are not the HDF5 file itself). Two parts, each on a file built by the project's writer:
//  1. nlp::resolve_model_config: the model architecture from the root attributes (model_type, the
//     HF config names as int64, float64 or string attributes with any values), against an INI
//     that may set some keys explicitly.
//     Properties: returns or throws nlp::Error; an accepted architecture has every size >= 1 and equal
//     to the file's value (no silent narrowing), heads dividing the hidden size, and probabilities and
//     epsilons in the ranges the INI schema enforces.
//  2. nlp::load_tensors: tensors with fuzzed names, dtypes and shapes, requested with fuzzed names,
//     shapes and a prefix. Properties: accepted tensors hold exactly the values written; the unused
//     list is exactly the datasets under the prefix that were not requested.
#include <fuzzer/FuzzedDataProvider.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "config/config.h"
#include "core/error.h"
#include "fuzz_util.h"
#include "io/h5.h"
#include "io/weights.h"
#include "model/model.h"

namespace {

void check(bool ok, const std::string& what) {
  if (!ok) nlp_fuzz::fail(what);
}

struct IntKey {
  const char* name;
  int nlp::ModelConfig::*field;
};
const IntKey kGpt2Ints[] = {{"vocab_size", &nlp::ModelConfig::vocab_size},
                            {"n_layer", &nlp::ModelConfig::n_layer},
                            {"n_head", &nlp::ModelConfig::n_head},
                            {"n_embd", &nlp::ModelConfig::n_embd},
                            {"n_positions", &nlp::ModelConfig::n_positions}};
const IntKey kBertInts[] = {{"vocab_size", &nlp::ModelConfig::vocab_size},
                            {"hidden_size", &nlp::ModelConfig::hidden_size},
                            {"num_hidden_layers", &nlp::ModelConfig::num_hidden_layers},
                            {"num_attention_heads", &nlp::ModelConfig::num_attention_heads},
                            {"intermediate_size", &nlp::ModelConfig::intermediate_size},
                            {"max_position_embeddings", &nlp::ModelConfig::max_position_embeddings},
                            {"type_vocab_size", &nlp::ModelConfig::type_vocab_size}};
struct FloatKey {
  const char* name;
  float nlp::ModelConfig::*field;
  bool probability;  // in [0, 1); else > 0
};
const FloatKey kFloats[] = {{"initializer_range", &nlp::ModelConfig::initializer_range, false},
                            {"layer_norm_epsilon", &nlp::ModelConfig::layer_norm_epsilon, false},
                            {"embd_pdrop", &nlp::ModelConfig::embd_pdrop, true},
                            {"attn_pdrop", &nlp::ModelConfig::attn_pdrop, true},
                            {"resid_pdrop", &nlp::ModelConfig::resid_pdrop, true},
                            {"layer_norm_eps", &nlp::ModelConfig::layer_norm_eps, false},
                            {"hidden_dropout_prob", &nlp::ModelConfig::hidden_dropout_prob, true},
                            {"attention_probs_dropout_prob", &nlp::ModelConfig::attention_probs_dropout_prob, true}};

std::vector<IntKey> int_keys(bool bert) {
  return bert ? std::vector<IntKey>(std::begin(kBertInts), std::end(kBertInts))
              : std::vector<IntKey>(std::begin(kGpt2Ints), std::end(kGpt2Ints));
}

void fuzz_model_config(FuzzedDataProvider& in, const std::string& path) {
  const bool bert = in.ConsumeBool();
  std::map<std::string, int64_t> ints_written;
  try {
    nlp::h5::File f = nlp::h5::File::create(path);
    switch (in.ConsumeIntegralInRange<int>(0, 5)) {
      case 0: break;  // no model_type
      case 1: f.set_attr("model_type", int64_t{2}); break;
      case 2: f.set_attr("model_type", in.ConsumeRandomLengthString(12)); break;
      default: f.set_attr("model_type", std::string(bert ? "bert" : "gpt2"));
    }
    for (const auto& k : int_keys(bert)) {
      switch (in.ConsumeIntegralInRange<int>(0, 9)) {
        case 0: break;  // missing
        case 1: f.set_attr(k.name, in.ConsumeIntegral<int64_t>()); break;
        case 2: f.set_attr(k.name, in.ConsumeFloatingPoint<double>()); break;
        case 3: f.set_attr(k.name, std::string("12")); break;
        case 4: {
          const int64_t v = (int64_t{1} << in.ConsumeIntegralInRange<int>(0, 62)) + in.ConsumeIntegralInRange<int>(-2, 2);
          f.set_attr(k.name, v);
          ints_written[k.name] = v;
          break;
        }
        default: {
          const int64_t v = in.ConsumeIntegralInRange<int64_t>(-1, 64);
          f.set_attr(k.name, v);
          ints_written[k.name] = v;
        }
      }
    }
    for (const auto& k : kFloats) {
      switch (in.ConsumeIntegralInRange<int>(0, 6)) {
        case 0: break;
        case 1: f.set_attr(k.name, in.ConsumeFloatingPoint<double>()); break;
        case 2: f.set_attr(k.name, in.ConsumeIntegralInRange<int64_t>(-1, 2)); break;
        case 3: {
          const double special[] = {NAN, INFINITY, -INFINITY, 1e300, -0.0, 1.0, 1e-45, 3.5e38};
          f.set_attr(k.name, special[in.ConsumeIntegralInRange<int>(0, 7)]);
          break;
        }
        default: f.set_attr(k.name, in.ConsumeFloatingPointInRange<double>(-0.5, 1.5));
      }
    }
    f.close();
  } catch (const nlp::Error&) {
    return;
  }

  nlp::Config cfg;
  cfg.model.type = bert ? "bert" : "gpt2";
  cfg.model.weights = path;
  // Some keys set explicitly in the "INI" (valid values, as the schema would have checked them).
  const int n_explicit = in.ConsumeIntegralInRange<int>(0, 3);
  for (int i = 0; i < n_explicit; ++i) {
    const auto keys = int_keys(bert);
    const auto& k = keys[in.ConsumeIntegralInRange<size_t>(0, keys.size() - 1)];
    cfg.model.*k.field = in.ConsumeIntegralInRange<int>(1, 64);
    cfg.explicitly_set.insert(std::string("model.") + k.name);
  }
  if (in.ConsumeBool()) {
    const auto& k = kFloats[in.ConsumeIntegralInRange<int>(0, 7)];
    cfg.model.*k.field = k.probability ? 0.25f : 1e-5f;
    cfg.explicitly_set.insert(std::string("model.") + k.name);
  }
  nlp::ModelConfig mc;
  try {
    mc = nlp::resolve_model_config(cfg);
  } catch (const nlp::Error&) {
    return;
  }
  for (const auto& k : int_keys(bert)) {
    const int v = mc.*k.field;
    check(v >= 1, std::string("accepted ") + k.name + " = " + std::to_string(v));
    auto it = ints_written.find(k.name);
    check(it != ints_written.end(), std::string("accepted a non-integer or missing ") + k.name);
    check(it->second == v, std::string("attribute ") + k.name + " = " + std::to_string(it->second) +
                               " became " + std::to_string(v));
  }
  if (bert) check(mc.hidden_size % mc.num_attention_heads == 0, "heads do not divide hidden_size");
  else check(mc.n_embd % mc.n_head == 0, "heads do not divide n_embd");
  for (const auto& k : kFloats) {
    const float v = mc.*k.field;
    if (k.probability) check(v >= 0.f && v < 1.f, std::string("accepted ") + k.name + " = " + std::to_string(v));
    else check(std::isfinite(v) && v > 0.f, std::string("accepted ") + k.name + " = " + std::to_string(v));
  }
}

void fuzz_load_tensors(FuzzedDataProvider& in, const std::string& path) {
  const char* names[] = {"a", "b.weight", "g/c", "optimizer/exp_avg/a", "optimizer/exp_avg/b.weight",
                         "optimizer/exp_avg_sq/a"};
  std::map<std::string, std::pair<std::vector<int64_t>, std::vector<float>>> written;
  std::map<std::string, bool> is_f32;
  try {
    nlp::h5::File f = nlp::h5::File::create(path);
    for (const char* name : names) {
      if (!in.ConsumeBool()) continue;
      std::vector<int64_t> shape;
      const int rank = in.ConsumeIntegralInRange<int>(0, 3);
      for (int r = 0; r < rank; ++r) shape.push_back(in.ConsumeIntegralInRange<int64_t>(1, 4));
      int64_t n = 1;
      for (auto d : shape) n *= d;
      std::vector<float> v(static_cast<size_t>(n));
      for (auto& x : v) x = in.ConsumeFloatingPoint<float>();
      const bool f32 = in.ConsumeIntegralInRange<int>(0, 4) != 0;
      if (f32) {
        f.write_f32(name, shape, v.data());
      } else {
        std::vector<double> d(v.begin(), v.end());
        f.write_f64(name, shape, d.data());
      }
      written[name] = {shape, v};
      is_f32[name] = f32;
    }
    f.close();
  } catch (const nlp::Error&) {
    return;
  }
  const std::string prefix = in.ConsumeBool() ? "" : "optimizer/exp_avg/";
  std::vector<nlp::NamedTensor> req;
  std::vector<std::vector<float>> bufs;
  std::set<std::string> requested;
  const char* req_names[] = {"a", "b.weight", "g/c", "zz"};
  for (const char* name : req_names) {
    if (!in.ConsumeBool()) continue;
    if (!requested.insert(name).second) continue;
    nlp::NamedTensor t;
    t.name = name;
    auto it = written.find(prefix + name);
    if (it != written.end() && in.ConsumeIntegralInRange<int>(0, 3) != 0) {
      t.shape = it->second.first;
    } else {
      const int rank = in.ConsumeIntegralInRange<int>(0, 3);
      for (int r = 0; r < rank; ++r) t.shape.push_back(in.ConsumeIntegralInRange<int64_t>(1, 4));
    }
    req.push_back(t);
  }
  bufs.resize(req.size());
  for (size_t i = 0; i < req.size(); ++i) {
    bufs[i].assign(static_cast<size_t>(req[i].numel()), -7.f);
    req[i].data = bufs[i].data();
  }
  std::vector<std::string> unused;
  try {
    nlp::h5::File f = nlp::h5::File::open_read(path);
    unused = nlp::load_tensors(f, req, prefix);
  } catch (const nlp::Error&) {
    return;
  }
  for (size_t i = 0; i < req.size(); ++i) {
    auto it = written.find(prefix + req[i].name);
    check(it != written.end(), "loaded a tensor that does not exist: " + req[i].name);
    check(is_f32[prefix + req[i].name], "loaded a float64 tensor as float32");
    check(it->second.first == req[i].shape, "loaded a tensor of another shape");
    for (size_t j = 0; j < bufs[i].size(); ++j) {
      const float a = bufs[i][j], b = it->second.second[j];
      check(a == b || (std::isnan(a) && std::isnan(b)), "tensor values differ from the file");
    }
  }
  std::vector<std::string> expect_unused;
  const size_t slash = prefix.rfind('/');
  const std::string group = slash == std::string::npos ? "" : prefix.substr(0, slash + 1);
  for (const auto& [name, v] : written)
    if (name.compare(0, prefix.size(), prefix) == 0 && !requested.count(name.substr(prefix.size())))
      expect_unused.push_back(name);
  std::sort(unused.begin(), unused.end());
  check(unused == expect_unused, "unused tensor list is wrong");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const std::string path = nlp_fuzz::scratch_path("weights.h5");
  FuzzedDataProvider in(data, size);
  if (in.ConsumeBool()) fuzz_model_config(in, path);
  else fuzz_load_tensors(in, path);
  return 0;
}
