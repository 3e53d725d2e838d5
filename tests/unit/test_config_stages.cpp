// Tests of parse_config's stages (config/config_stages.h) one at a time: the argv tokenising, the
// command line's flags, files and overrides, its errors, and the precedence of where a key's value
// comes from (command line > INI file > model.preset > default), stage by stage and end to end.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <set>
#include <string>
#include <vector>

#include "config/config.h"
#include "config/config_schema.h"
#include "config/config_stages.h"
#include "core/backend.h"
#include "core/error.h"
#include "io/dataset.h"

namespace fs = std::filesystem;
using nlp::cfg::CommandLine;

namespace {

std::vector<std::string> tokens(std::vector<std::string> args) {
  args.insert(args.begin(), "nlptrain");
  std::vector<const char*> argv;
  for (const auto& a : args) argv.push_back(a.c_str());
  return nlp::cfg::tokenise_argv(static_cast<int>(argv.size()), argv.data());
}

std::string error_of(void (*f)(const CommandLine&), const CommandLine& cl) {
  try {
    f(cl);
  } catch (const nlp::Error& e) {
    return e.what();
  }
  ADD_FAILURE() << "no error";
  return "";
}

// A file in the temporary folder, removed at the end of the test.
struct TempIni {
  fs::path path;
  explicit TempIni(const std::string& text)
      : path(fs::temp_directory_path() / ("nlptrain_stages_" + std::to_string(::getpid()) + "_" +
                                          ::testing::UnitTest::GetInstance()->current_test_info()->name() +
                                          ".ini")) {
    std::ofstream(path) << text;
  }
  ~TempIni() { fs::remove(path); }
};

}  // namespace

TEST(ConfigStages, TokeniseSkipsTheProgramAndSplitsAnEmptyValue) {
  EXPECT_EQ(tokens({}), std::vector<std::string>{});
  EXPECT_EQ(tokens({"a.ini", "--train.lr=0.1", "--train.steps", "5"}),
            (std::vector<std::string>{"a.ini", "--train.lr=0.1", "--train.steps", "5"}));
  // "--key=" becomes "--key" and an empty token (Boost rejects the empty adjacent value)
  EXPECT_EQ(tokens({"--data.eval=", "x.ini"}), (std::vector<std::string>{"--data.eval", "", "x.ini"}));
  // only a trailing '=' after a name splits; "--=" is too short to be a key and is kept
  EXPECT_EQ(tokens({"--="}), (std::vector<std::string>{"--="}));
  EXPECT_EQ(tokens({"--generate.prompt=a=b"}), (std::vector<std::string>{"--generate.prompt=a=b"}));
  EXPECT_EQ(tokens({"x="}), (std::vector<std::string>{"x="}));
}

TEST(ConfigStages, CommandLineFlagsFilesAndOverridesInOrder) {
  const CommandLine cl = nlp::cfg::parse_command_line(
      {"--check", "a.ini", "--train.lr=0.5", "--train.steps", "7", "--train.lr", "0.25", "--data.eval", "",
       "--nosuch.key=1"});
  EXPECT_TRUE(cl.check);
  EXPECT_FALSE(cl.help);
  EXPECT_FALSE(cl.version);
  EXPECT_EQ(cl.inis, std::vector<std::string>{"a.ini"});
  ASSERT_EQ(cl.overrides.size(), 5u);
  const std::vector<std::pair<std::string, std::string>> expected = {
      {"train.lr", "0.5"}, {"train.steps", "7"}, {"train.lr", "0.25"}, {"data.eval", ""}, {"nosuch.key", "1"}};
  for (size_t i = 0; i < expected.size(); ++i) {
    EXPECT_EQ(cl.overrides[i].name, expected[i].first) << i;
    EXPECT_EQ(cl.overrides[i].value, expected[i].second) << i;
    EXPECT_EQ(cl.overrides[i].known, i < 4) << i;
  }
  EXPECT_EQ(cl.overrides[4].token, "--nosuch.key=1");
  const CommandLine h = nlp::cfg::parse_command_line({"-h", "--version"});
  EXPECT_TRUE(h.help);
  EXPECT_TRUE(h.version);
}

TEST(ConfigStages, CommandLineErrors) {
  const std::string unknown =
      error_of(nlp::cfg::check_command_line, nlp::cfg::parse_command_line({"--train.lrr=1"}));
  EXPECT_NE(unknown.find("command line: unknown key 'train.lrr'; did you mean train.lr?"), std::string::npos)
      << unknown;
  const std::string two = error_of(nlp::cfg::check_command_line, nlp::cfg::parse_command_line({"a.ini", "b.ini"}));
  EXPECT_NE(two.find("more than one INI file given ('a.ini', 'b.ini')"), std::string::npos) << two;
  EXPECT_NO_THROW(nlp::cfg::check_command_line(nlp::cfg::parse_command_line({"a.ini", "--train.lr=1"})));
  EXPECT_THROW(nlp::cfg::parse_command_line({"--train.lr"}), nlp::Error);  // a key without its value
}

// Stage by stage: the INI sets n_layer and n_head, the command line n_head and lr; the preset
// (gpt2: 12 layers, 12 heads, width 768) fills only n_embd and the keys nobody set.
TEST(ConfigStages, PrecedenceCommandLineOverIniOverPresetOverDefault) {
  TempIni ini("[model]\npreset = gpt2\nn_layer = 3\nn_head = 4\n");
  nlp::Config c;
  nlp::cfg::Origins origins;
  c.source = ini.path.string();
  nlp::cfg::read_ini(c.source, c, origins);
  EXPECT_EQ(c.model.n_layer, 3);
  EXPECT_EQ(c.model.n_head, 4);
  EXPECT_EQ(origins.at("model.n_layer").where, "config file '" + c.source + "', line 3");

  const CommandLine cl = nlp::cfg::parse_command_line({"--model.n_head=6", "--train.lr=0.125"});
  nlp::cfg::apply_overrides(cl.overrides, c, origins);
  EXPECT_EQ(c.model.n_head, 6);
  EXPECT_EQ(c.train.lr, 0.125f);
  EXPECT_EQ(origins.at("model.n_head").where, "command line");

  nlp::cfg::apply_preset(c, origins);
  EXPECT_EQ(c.model.n_layer, 3);   // INI over preset
  EXPECT_EQ(c.model.n_head, 6);    // command line over INI and preset
  EXPECT_EQ(c.model.n_embd, 768);  // preset over default (128)
  EXPECT_EQ(origins.at("model.n_embd").where, "model.preset = gpt2");
  EXPECT_EQ(c.train.beta1, nlp::TrainConfig{}.beta1);  // default
  EXPECT_EQ(origins.count("train.beta1"), 0u);

  EXPECT_EQ(c.where("model.n_layer"), "config file '" + c.source + "'");
  EXPECT_EQ(c.where("model.n_head"), "command line");
  EXPECT_EQ(c.where("model.n_embd"), "model.preset = gpt2");
  EXPECT_EQ(c.where("train.beta1"), "default");
}

// The same through parse_config, and the last command-line occurrence of a key wins.
TEST(ConfigStages, PrecedenceEndToEnd) {
  TempIni ini("[run]\nmode = generate\n[model]\npreset = gpt2-medium\nn_layer = 2\nn_head = 8\n");
  const std::string path = ini.path.string();
  std::vector<const char*> argv = {"nlptrain", path.c_str(), "--model.n_head=2", "--model.n_head=4"};
  const nlp::Config c = nlp::parse_config(static_cast<int>(argv.size()), argv.data()).config;
  EXPECT_EQ(c.model.n_layer, 2);      // INI
  EXPECT_EQ(c.model.n_head, 4);       // the last command-line value
  EXPECT_EQ(c.model.n_embd, 1024);    // gpt2-medium
  EXPECT_EQ(c.model.vocab_size, 50257);
  EXPECT_EQ(c.train.lr, nlp::TrainConfig{}.lr);
}

// A range error found by validate_keys names where the value came from.
TEST(ConfigStages, ValidateNamesTheOrigin) {
  nlp::Config c;
  nlp::cfg::Origins origins;
  nlp::cfg::apply_overrides(nlp::cfg::parse_command_line({"--train.lr=-1"}).overrides, c, origins);
  try {
    nlp::cfg::validate_keys(c, origins);
    ADD_FAILURE() << "no error";
  } catch (const nlp::Error& e) {
    EXPECT_EQ(std::string(e.what()), "command line: train.lr = '-1': must be > 0");
  }
  c.train.lr = 0.5f;
  EXPECT_NO_THROW(nlp::cfg::validate_keys(c, origins));
}

namespace {

// Each of the schema's choices of `key`, written to `field`, reads back through `get` as the enum
// value at the same place in `expected`; a value outside them is an error naming the key.
template <typename E, typename Get>
void expect_choices(const char* key, nlp::Config& c, std::string& field, Get get, const std::vector<E>& expected) {
  const std::vector<std::string>& names = *nlp::cfg::find_entry(key)->check.choices;
  ASSERT_EQ(names.size(), expected.size()) << key;
  for (size_t i = 0; i < names.size(); ++i) {
    field = names[i];
    EXPECT_TRUE(get(c) == expected[i]) << key << " = " << names[i];
  }
  field = "nonsense";
  try {
    get(c);
    ADD_FAILURE() << key << ": no error";
  } catch (const nlp::Error& e) {
    EXPECT_EQ(std::string(e.what()), std::string(key) + ": unknown value 'nonsense'");
  }
  field = names.front();
}

}  // namespace

TEST(ConfigStages, EnumsFollowTheSchemasChoices) {
  using namespace nlp;
  Config c;
  expect_choices<RunMode>("run.mode", c, c.run.mode, [](const Config& k) { return k.mode(); },
                          {RunMode::Train, RunMode::Eval, RunMode::Predict, RunMode::Generate, RunMode::Gradients});
  expect_choices<ComputeBackend>("run.backend", c, c.run.backend, [](const Config& k) { return k.backend(); },
                                 {ComputeBackend::Cpu, ComputeBackend::Cuda});
  expect_choices<Recompute>("train.recompute", c, c.train.recompute, [](const Config& k) { return k.recompute(); },
                            {Recompute::None, Recompute::Block});
  expect_choices<Offload>("train.offload", c, c.train.offload, [](const Config& k) { return k.offload(); },
                          {Offload::None, Offload::Optimizer});
  expect_choices<Padding>("data.padding", c, c.data.padding, [](const Config& k) { return k.padding(); },
                          {Padding::Longest, Padding::MaxLength});
  expect_choices<PromptTokenizer>("generate.tokenizer", c, c.generate.tokenizer,
                                  [](const Config& k) { return k.tokenizer(); },
                                  {PromptTokenizer::Byte, PromptTokenizer::Gpt2, PromptTokenizer::Ids});
  expect_choices<Nonfinite>("train.nonfinite", c, c.train.nonfinite, [](const Config& k) { return k.nonfinite(); },
                            {Nonfinite::Stop, Nonfinite::Skip});
  expect_choices<PackBatch>("data.pack_batch", c, c.data.pack_batch, [](const Config& k) { return k.pack_batch(); },
                            {PackBatch::Rows, PackBatch::Examples});
  expect_choices<AttentionImpl>("model.attention", c, c.model.attention, [](const Config& k) { return k.attention(); },
                                {AttentionImpl::Auto, AttentionImpl::Cudnn, AttentionImpl::Native});
  expect_choices<CommGpu>("comm.gpu", c, c.comm.gpu, [](const Config& k) { return k.comm_gpu(); },
                          {CommGpu::Auto, CommGpu::Nccl, CommGpu::Staged});
  expect_choices<CpuGemm>("run.cpu_gemm", c, c.run.cpu_gemm, [](const Config& k) { return k.cpu_gemm(); },
                          {CpuGemm::Auto, CpuGemm::OpenBlas, CpuGemm::OneDnn});
  expect_choices<CpuBf16>("run.cpu_bf16", c, c.run.cpu_bf16, [](const Config& k) { return k.cpu_bf16(); },
                          {CpuBf16::Auto, CpuBf16::Emulate, CpuBf16::Native});
  expect_choices<Task>("run.task", c, c.run.task, [](const Config& k) { return k.task(); },
                       {Task::Clm, Task::Mlm, Task::DocCls, Task::PairCls, Task::Ner, Task::Qa});
  expect_choices<Schedule>("train.schedule", c, c.train.schedule, [](const Config& k) { return k.schedule(); },
                           {Schedule::Linear, Schedule::Cosine, Schedule::Constant});
  expect_choices<GroupOrder>("data.group_order", c, c.data.group_order,
                             [](const Config& k) { return k.group_order(); },
                             {GroupOrder::LongestFirst, GroupOrder::Shuffled});
  expect_choices<ModelType>("model.type", c, c.model.type, [](const Config& k) { return k.model.model_type(); },
                            {ModelType::Gpt2, ModelType::Bert, ModelType::Roberta, ModelType::Electra});
  expect_choices<FusedHead>("model.fused_head", c, c.model.fused_head,
                            [](const Config& k) { return k.model.fused_head_mode(); },
                            {FusedHead::Auto, FusedHead::On, FusedHead::Off});
  expect_choices<PadVocab>("model.pad_vocab", c, c.model.pad_vocab,
                           [](const Config& k) { return k.model.pad_vocab_mode(); },
                           {PadVocab::Auto, PadVocab::Off, PadVocab::Pad128});
  // the free functions for text held without its Config read the same lists
  EXPECT_EQ(parse_task("pair_cls"), Task::PairCls);
  EXPECT_EQ(parse_model_type("electra"), ModelType::Electra);
  EXPECT_EQ(parse_schedule("constant"), Schedule::Constant);
  EXPECT_THROW(parse_schedule("step"), Error);
}

// train.precision: auto is bf16 on cuda and fp32 on cpu; the others are what they say on both.
TEST(ConfigStages, PrecisionResolvedFromAutoByBackend) {
  using nlp::Precision;
  nlp::Config c;
  EXPECT_EQ(c.precision(), Precision::Fp32);  // the defaults: auto on cpu
  const std::vector<std::pair<std::string, std::pair<Precision, Precision>>> cases = {
      {"auto", {Precision::Fp32, Precision::Bf16}},
      {"fp32", {Precision::Fp32, Precision::Fp32}},
      {"tf32", {Precision::Tf32, Precision::Tf32}},
      {"bf16", {Precision::Bf16, Precision::Bf16}}};
  ASSERT_EQ(nlp::cfg::find_entry("train.precision")->check.choices->size(), cases.size());
  for (const auto& [text, want] : cases) {
    c.train.precision = text;
    c.run.backend = "cpu";
    EXPECT_EQ(c.precision(), want.first) << text;
    EXPECT_FALSE(c.on_cuda());
    c.run.backend = "cuda";
    EXPECT_EQ(c.precision(), want.second) << text;
    EXPECT_TRUE(c.on_cuda());
  }
  // the strings stay the INI text
  EXPECT_NE(c.to_ini().find("precision = bf16\n"), std::string::npos);
  EXPECT_NE(c.to_ini().find("backend = cuda\n"), std::string::npos);
}

// The model type each key belongs to and the keys that name files, read from the keys' rows
// (config_keys.def's .only() and .path()), against the lists written out here.
TEST(ConfigStages, KeyOwnersAndPathKeysFromTheRows) {
  const std::set<std::string> gpt2 = {
      "model.n_layer", "model.n_head", "model.n_embd", "model.n_positions", "model.embd_pdrop",
      "model.attn_pdrop", "model.resid_pdrop", "model.layer_norm_epsilon", "train.sample_interval",
      "model.fused_head", "model.head_chunk", "model.pad_vocab"};
  const std::set<std::string> bert = {
      "model.hidden_size", "model.num_hidden_layers", "model.num_attention_heads",
      "model.intermediate_size", "model.max_position_embeddings", "model.type_vocab_size",
      "model.layer_norm_eps", "model.hidden_dropout_prob", "model.attention_probs_dropout_prob",
      "model.num_labels", "model.pad_token_id", "model.reinit_mismatched"};
  const std::set<std::string> paths = {"model.weights", "data.train", "data.eval", "output.dir",
                                       "generate.prompts_file", "generate.vocab_dir"};
  size_t owned = 0;
  for (const auto& e : nlp::cfg::schema()) {
    const std::string want = gpt2.count(e.name) || e.section() == "generate" ? "gpt2"
                             : bert.count(e.name)                           ? "bert"
                             : e.name == "model.embedding_size"             ? "electra"
                                                                            : "";
    EXPECT_EQ(nlp::key_model_type(e.name), want) << e.name;
    EXPECT_EQ(nlp::is_path_key(e.name), paths.count(e.name) > 0) << e.name;
    owned += !want.empty();
  }
  EXPECT_EQ(owned, gpt2.size() + bert.size() + 1 + 10);  // + embedding_size + the 10 generate.* keys
  EXPECT_EQ(nlp::key_model_type("model.no_such_key"), "");
  EXPECT_FALSE(nlp::is_path_key("model.no_such_key"));
}
