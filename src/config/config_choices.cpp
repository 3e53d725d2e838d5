// The validated one-of keys as enums (config.h: Config::mode() and the like): the one place their
// text is read, and train.precision's auto resolved (through core's parse_precision). Each enum's
// values are the schema's choice list of its key, in that list's order (config_schema.cpp;
// test_config_stages checks every pair).
#include <cstddef>
#include <string>
#include <vector>

#include "config/config.h"
#include "config/config_schema.h"
#include "core/backend.h"
#include "core/error.h"
#include "io/dataset.h"

namespace nlp {
namespace {

// The choices of `key` in the schema.
const std::vector<std::string>& choices_of(const char* key) { return *cfg::find_entry(key)->check.choices; }

// names[i] -> E(i); a value no check let through (a Config built by hand) is an error naming the key.
template <typename E>
E choice(const std::vector<std::string>& names, const char* key, const std::string& value) {
  for (size_t i = 0; i < names.size(); ++i)
    if (value == names[i]) return static_cast<E>(i);
  throw Error(cat(key, ": unknown value '", value, "'"));
}

}  // namespace

Task parse_task(const std::string& text) {
  static const auto& names = choices_of("run.task");
  return choice<Task>(names, "run.task", text);
}
ModelType parse_model_type(const std::string& text) {
  static const auto& names = choices_of("model.type");
  return choice<ModelType>(names, "model.type", text);
}
Schedule parse_schedule(const std::string& text) {
  static const auto& names = choices_of("train.schedule");
  return choice<Schedule>(names, "train.schedule", text);
}

ModelType ModelConfig::model_type() const { return parse_model_type(type); }
FusedHead ModelConfig::fused_head_mode() const {
  static const auto& names = choices_of("model.fused_head");
  return choice<FusedHead>(names, "model.fused_head", fused_head);
}
PadVocab ModelConfig::pad_vocab_mode() const {
  static const auto& names = choices_of("model.pad_vocab");
  return choice<PadVocab>(names, "model.pad_vocab", pad_vocab);
}

RunMode Config::mode() const {
  static const auto& names = choices_of("run.mode");
  return choice<RunMode>(names, "run.mode", run.mode);
}
ComputeBackend Config::backend() const {
  static const auto& names = choices_of("run.backend");
  return choice<ComputeBackend>(names, "run.backend", run.backend);
}
Precision Config::precision() const { return parse_precision(train.precision, run.backend); }
Recompute Config::recompute() const {
  static const auto& names = choices_of("train.recompute");
  return choice<Recompute>(names, "train.recompute", train.recompute);
}
Offload Config::offload() const {
  static const auto& names = choices_of("train.offload");
  return choice<Offload>(names, "train.offload", train.offload);
}
Padding Config::padding() const {
  static const auto& names = choices_of("data.padding");
  return choice<Padding>(names, "data.padding", data.padding);
}
PromptTokenizer Config::tokenizer() const {
  static const auto& names = choices_of("generate.tokenizer");
  return choice<PromptTokenizer>(names, "generate.tokenizer", generate.tokenizer);
}
Nonfinite Config::nonfinite() const {
  static const auto& names = choices_of("train.nonfinite");
  return choice<Nonfinite>(names, "train.nonfinite", train.nonfinite);
}
PackBatch Config::pack_batch() const {
  static const auto& names = choices_of("data.pack_batch");
  return choice<PackBatch>(names, "data.pack_batch", data.pack_batch);
}
AttentionImpl Config::attention() const {
  static const auto& names = choices_of("model.attention");
  return choice<AttentionImpl>(names, "model.attention", model.attention);
}
CommGpu Config::comm_gpu() const {
  static const auto& names = choices_of("comm.gpu");
  return choice<CommGpu>(names, "comm.gpu", comm.gpu);
}
CpuGemm Config::cpu_gemm() const {
  static const auto& names = choices_of("run.cpu_gemm");
  return choice<CpuGemm>(names, "run.cpu_gemm", run.cpu_gemm);
}
CpuBf16 Config::cpu_bf16() const {
  static const auto& names = choices_of("run.cpu_bf16");
  return choice<CpuBf16>(names, "run.cpu_bf16", run.cpu_bf16);
}
Task Config::task() const { return parse_task(run.task); }
Schedule Config::schedule() const { return parse_schedule(train.schedule); }
GroupOrder Config::group_order() const {
  static const auto& names = choices_of("data.group_order");
  return choice<GroupOrder>(names, "data.group_order", data.group_order);
}

}  // namespace nlp
