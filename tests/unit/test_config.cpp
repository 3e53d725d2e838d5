// Tests of the configuration layer: defaults, INI parsing of every type, command-line overrides,
// error messages (unknown keys and sections, wrong types, ranges, choices, cross-key checks,
// duplicates, missing files), to_ini round trips, --help and explicitly_set.
#include <gtest/gtest.h>
#include <stdlib.h>

#include <filesystem>
#include <fstream>
#include <initializer_list>
#include <string>
#include <vector>

#include "config/config.h"
#include "core/backend.h"
#include "core/error.h"

namespace fs = std::filesystem;
using nlp::Config;
using nlp::ParseResult;

namespace {

// Every key of config.h, written by hand (section order as in config.h).
const std::vector<std::string> kAllKeys = {
    "run.mode", "run.task", "run.backend", "run.threads", "run.log_interval", "run.peak_tflops",
    "run.sync_check", "run.profile", "run.cuda_graph", "run.memory_limit_gb", "run.cpu_gemm", "run.cpu_bf16",
    "run.verbose",
    "run.bf16_weights", "run.bf16_activations",
    "model.type", "model.weights", "model.preset", "model.reinit_mismatched", "model.n_layer", "model.n_head", "model.n_embd",
    "model.vocab_size", "model.n_positions", "model.embd_pdrop", "model.attn_pdrop",
    "model.resid_pdrop", "model.layer_norm_epsilon", "model.initializer_range",
    "model.hidden_size", "model.num_hidden_layers", "model.num_attention_heads",
    "model.intermediate_size", "model.max_position_embeddings", "model.type_vocab_size",
    "model.layer_norm_eps", "model.hidden_dropout_prob", "model.attention_probs_dropout_prob",
    "model.num_labels", "model.pad_token_id", "model.attention", "model.fused_head", "model.head_chunk",
    "model.pad_vocab",
    "data.train", "data.eval", "data.seq_len", "data.shuffle", "data.padding", "data.pad_multiple",
    "data.group_by_length", "data.group_order", "data.packing", "data.pack_batch", "data.pack_max_per_row",
    "data.pack_fixed_examples", "data.cache_mb",
    "train.steps", "train.epochs", "train.batch_size", "train.grad_accum", "train.lr", "train.min_lr_ratio",
    "train.warmup_steps", "train.schedule_steps", "train.schedule", "train.weight_decay", "train.beta1", "train.beta2",
    "train.adam_eps", "train.clip", "train.seed", "train.resume", "train.sample_interval",
    "train.precision", "train.nonfinite", "train.nonfinite_max", "train.recompute", "train.zero", "train.zero_prefetch", "train.offload",
    "eval.interval", "eval.batches", "eval.sort_by_length",
    "checkpoint.interval", "checkpoint.keep",
    "comm.gpu", "comm.bucket_mb", "comm.overlap", "comm.timeout_s",
    "output.dir", "output.overwrite",
    "generate.prompt", "generate.max_new_tokens", "generate.temperature", "generate.top_k",
    "generate.top_p", "generate.seed", "generate.num_samples", "generate.tokenizer",
    "generate.vocab_dir", "generate.prompts_file",
    "debug.inject_nonfinite_step", "debug.kill_at_step", "debug.kill_in_checkpoint", "debug.startup_sleep_ms",
    "debug.step_sleep_ms"};

ParseResult parse(std::vector<std::string> args) {
  args.insert(args.begin(), "nlptrain");
  std::vector<const char*> argv;
  for (const auto& a : args) argv.push_back(a.c_str());
  return nlp::parse_config(static_cast<int>(argv.size()), argv.data());
}

// The message of the nlp::Error that parsing `args` throws ("" and a test failure when none).
std::string error_of(const std::vector<std::string>& args) {
  try {
    parse(args);
  } catch (const nlp::Error& e) {
    return e.what();
  } catch (const std::exception& e) {
    ADD_FAILURE() << "not an nlp::Error: " << e.what();
    return e.what();
  }
  ADD_FAILURE() << "no error";
  return "";
}

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

#define EXPECT_CONTAINS(s, part) EXPECT_TRUE(contains(s, part)) << "'" << (s) << "' lacks '" << (part) << "'"

void expect_equal(const Config& a, const Config& b) {
  EXPECT_EQ(a.run.mode, b.run.mode);
  EXPECT_EQ(a.run.task, b.run.task);
  EXPECT_EQ(a.run.backend, b.run.backend);
  EXPECT_EQ(a.run.threads, b.run.threads);
  EXPECT_EQ(a.run.log_interval, b.run.log_interval);
  EXPECT_EQ(a.run.peak_tflops, b.run.peak_tflops);
  EXPECT_EQ(a.run.memory_limit_gb, b.run.memory_limit_gb);
  EXPECT_EQ(a.run.sync_check, b.run.sync_check);
  EXPECT_EQ(a.run.profile, b.run.profile);
  EXPECT_EQ(a.run.cpu_gemm, b.run.cpu_gemm);
  EXPECT_EQ(a.run.cpu_bf16, b.run.cpu_bf16);
  EXPECT_EQ(a.model.type, b.model.type);
  EXPECT_EQ(a.model.weights, b.model.weights);
  EXPECT_EQ(a.model.preset, b.model.preset);
  EXPECT_EQ(a.model.reinit_mismatched, b.model.reinit_mismatched);
  EXPECT_EQ(a.train.epochs, b.train.epochs);
  EXPECT_EQ(a.model.n_layer, b.model.n_layer);
  EXPECT_EQ(a.model.n_head, b.model.n_head);
  EXPECT_EQ(a.model.n_embd, b.model.n_embd);
  EXPECT_EQ(a.model.vocab_size, b.model.vocab_size);
  EXPECT_EQ(a.model.n_positions, b.model.n_positions);
  EXPECT_EQ(a.model.embd_pdrop, b.model.embd_pdrop);
  EXPECT_EQ(a.model.attn_pdrop, b.model.attn_pdrop);
  EXPECT_EQ(a.model.resid_pdrop, b.model.resid_pdrop);
  EXPECT_EQ(a.model.layer_norm_epsilon, b.model.layer_norm_epsilon);
  EXPECT_EQ(a.model.initializer_range, b.model.initializer_range);
  EXPECT_EQ(a.model.attention, b.model.attention);
  EXPECT_EQ(a.model.pad_token_id, b.model.pad_token_id);
  EXPECT_EQ(a.data.train, b.data.train);
  EXPECT_EQ(a.data.eval, b.data.eval);
  EXPECT_EQ(a.data.seq_len, b.data.seq_len);
  EXPECT_EQ(a.data.shuffle, b.data.shuffle);
  EXPECT_EQ(a.data.padding, b.data.padding);
  EXPECT_EQ(a.data.pad_multiple, b.data.pad_multiple);
  EXPECT_EQ(a.data.group_by_length, b.data.group_by_length);
  EXPECT_EQ(a.data.group_order, b.data.group_order);
  EXPECT_EQ(a.data.packing, b.data.packing);
  EXPECT_EQ(a.data.pack_batch, b.data.pack_batch);
  EXPECT_EQ(a.data.pack_max_per_row, b.data.pack_max_per_row);
  EXPECT_EQ(a.data.pack_fixed_examples, b.data.pack_fixed_examples);
  EXPECT_EQ(a.run.cuda_graph, b.run.cuda_graph);
  EXPECT_EQ(a.train.steps, b.train.steps);
  EXPECT_EQ(a.train.batch_size, b.train.batch_size);
  EXPECT_EQ(a.train.grad_accum, b.train.grad_accum);
  EXPECT_EQ(a.train.lr, b.train.lr);
  EXPECT_EQ(a.train.min_lr_ratio, b.train.min_lr_ratio);
  EXPECT_EQ(a.train.warmup_steps, b.train.warmup_steps);
  EXPECT_EQ(a.train.schedule, b.train.schedule);
  EXPECT_EQ(a.train.weight_decay, b.train.weight_decay);
  EXPECT_EQ(a.train.beta1, b.train.beta1);
  EXPECT_EQ(a.train.beta2, b.train.beta2);
  EXPECT_EQ(a.train.adam_eps, b.train.adam_eps);
  EXPECT_EQ(a.train.clip, b.train.clip);
  EXPECT_EQ(a.train.seed, b.train.seed);
  EXPECT_EQ(a.train.resume, b.train.resume);
  EXPECT_EQ(a.train.sample_interval, b.train.sample_interval);
  EXPECT_EQ(a.train.precision, b.train.precision);
  EXPECT_EQ(a.train.nonfinite, b.train.nonfinite);
  EXPECT_EQ(a.train.nonfinite_max, b.train.nonfinite_max);
  EXPECT_EQ(a.train.recompute, b.train.recompute);
  EXPECT_EQ(a.train.zero, b.train.zero);
  EXPECT_EQ(a.eval.interval, b.eval.interval);
  EXPECT_EQ(a.eval.batches, b.eval.batches);
  EXPECT_EQ(a.eval.sort_by_length, b.eval.sort_by_length);
  EXPECT_EQ(a.checkpoint.interval, b.checkpoint.interval);
  EXPECT_EQ(a.checkpoint.keep, b.checkpoint.keep);
  EXPECT_EQ(a.comm.gpu, b.comm.gpu);
  EXPECT_EQ(a.comm.bucket_mb, b.comm.bucket_mb);
  EXPECT_EQ(a.comm.overlap, b.comm.overlap);
  EXPECT_EQ(a.comm.timeout_s, b.comm.timeout_s);
  EXPECT_EQ(a.output.dir, b.output.dir);
  EXPECT_EQ(a.generate.prompt, b.generate.prompt);
  EXPECT_EQ(a.generate.max_new_tokens, b.generate.max_new_tokens);
  EXPECT_EQ(a.generate.temperature, b.generate.temperature);
  EXPECT_EQ(a.generate.top_k, b.generate.top_k);
  EXPECT_EQ(a.generate.top_p, b.generate.top_p);
  EXPECT_EQ(a.generate.seed, b.generate.seed);
  EXPECT_EQ(a.generate.num_samples, b.generate.num_samples);
  EXPECT_EQ(a.generate.tokenizer, b.generate.tokenizer);
  EXPECT_EQ(a.generate.vocab_dir, b.generate.vocab_dir);
  EXPECT_EQ(a.generate.prompts_file, b.generate.prompts_file);
  EXPECT_EQ(a.debug.inject_nonfinite_step, b.debug.inject_nonfinite_step);
  EXPECT_EQ(a.debug.kill_at_step, b.debug.kill_at_step);
  EXPECT_EQ(a.debug.kill_in_checkpoint, b.debug.kill_in_checkpoint);
}

class ConfigTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string tmpl = (fs::temp_directory_path() / "nlptrain_test_config_XXXXXX").string();
    ASSERT_NE(mkdtemp(tmpl.data()), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override {
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }
  std::string write(const std::string& name, const std::string& text) {
    const std::string path = (dir_ / name).string();
    std::ofstream(path) << text;
    return path;
  }
  fs::path dir_;
};

// ---- defaults -------------------------------------------------------------------------------------

TEST(ConfigDefaults, StructDefaults) {
  const Config c;
  EXPECT_EQ(c.run.mode, "train");
  EXPECT_EQ(c.run.task, "clm");
  EXPECT_EQ(c.run.backend, "cpu");
  EXPECT_EQ(c.model.type, "gpt2");
  EXPECT_EQ(c.model.n_embd % c.model.n_head, 0);
  EXPECT_EQ(c.train.schedule, "cosine");
  EXPECT_EQ(c.generate.prompt, "\n");
  EXPECT_EQ(c.generate.tokenizer, "byte");
  EXPECT_EQ(c.output.dir, "out");
  EXPECT_EQ(c.train.precision, "auto");  // bf16 on cuda, fp32 on cpu (core/backend.h)
  EXPECT_FALSE(c.run.sync_check);
  EXPECT_FALSE(c.run.profile);
  EXPECT_EQ(c.model.attention, "auto");
  EXPECT_TRUE(c.source.empty());
  EXPECT_TRUE(c.explicitly_set.empty());
}

TEST(ConfigDefaults, NoIniGivesDefaultsPlusOverrides) {
  ParseResult r = parse({"--data.train=tokens.h5"});
  EXPECT_FALSE(r.help);
  EXPECT_FALSE(r.version);
  Config expected;
  expected.data.train = "tokens.h5";
  expect_equal(r.config, expected);
  EXPECT_EQ(r.config.source, "");
  EXPECT_EQ(r.config.explicitly_set, std::set<std::string>{"data.train"});
  EXPECT_TRUE(r.config.is_set("data.train"));
  EXPECT_FALSE(r.config.is_set("train.lr"));
}

TEST(ConfigDefaults, GenerateNeedsNoData) {
  ParseResult r = parse({"--run.mode=generate"});
  EXPECT_EQ(r.config.run.mode, "generate");
  EXPECT_EQ(r.config.generate.prompt, "\n");
}

// ---- INI parsing ------------------------------------------------------------------------------------

TEST_F(ConfigTest, IniEveryType) {
  const std::string path = write("run.ini",
                                 "# a comment\n"
                                 "; another comment\n"
                                 "\n"
                                 "[run]\n"
                                 "mode = train\n"
                                 "  backend   =   cuda   \n"
                                 "threads=3\n"
                                 "\n"
                                 "[ model ]\n"
                                 "n_layer = 2   # inline comment\n"
                                 "n_embd = 64 ; inline comment\n"
                                 "n_head = 8\n"
                                 "attn_pdrop = 0.25\n"
                                 "layer_norm_epsilon = 1e-6\n"
                                 "weights = /data/gpt2.h5\n"
                                 "[data]\n"
                                 "train = /data/train.h5\n"
                                 "shuffle = off\n"
                                 "seq_len = +256\n"
                                 "[train]\n"
                                 "lr = 3e-4\n"
                                 "seed = 18446744073709551615\n"
                                 "resume = YES\n"
                                 "schedule = linear\n"
                                 "[generate]\n"
                                 "prompt = \"Hello\\n\\tworld # not a comment; nor this\"\n"
                                 "temperature = .5\n"
                                 "vocab_dir = \"/path with spaces/\"\n");
  ParseResult r = parse({path});
  const Config& c = r.config;
  EXPECT_EQ(c.source, path);
  EXPECT_EQ(c.run.mode, "train");
  EXPECT_EQ(c.run.backend, "cuda");
  EXPECT_EQ(c.run.threads, 3);
  EXPECT_EQ(c.model.n_layer, 2);
  EXPECT_EQ(c.model.n_embd, 64);
  EXPECT_EQ(c.model.n_head, 8);
  EXPECT_EQ(c.model.attn_pdrop, 0.25f);
  EXPECT_EQ(c.model.layer_norm_epsilon, 1e-6f);
  EXPECT_EQ(c.model.weights, "/data/gpt2.h5");
  EXPECT_EQ(c.data.train, "/data/train.h5");
  EXPECT_FALSE(c.data.shuffle);
  EXPECT_EQ(c.data.seq_len, 256);
  EXPECT_EQ(c.train.lr, 3e-4f);
  EXPECT_EQ(c.train.seed, 18446744073709551615ull);
  EXPECT_TRUE(c.train.resume);
  EXPECT_EQ(c.train.schedule, "linear");
  EXPECT_EQ(c.generate.prompt, "Hello\n\tworld # not a comment; nor this");
  EXPECT_EQ(c.generate.temperature, 0.5f);
  EXPECT_EQ(c.generate.vocab_dir, "/path with spaces/");
  // Untouched keys keep their defaults.
  EXPECT_EQ(c.train.steps, Config{}.train.steps);
  EXPECT_EQ(c.model.resid_pdrop, Config{}.model.resid_pdrop);
}

TEST_F(ConfigTest, UnquotedValuesKeepHashAndEscapes) {
  const std::string path = write("a.ini",
                                 "[data]\ntrain = x.h5\n"
                                 "[generate]\nprompt = C# and F#;x\\n\n"
                                 "[model]\nweights = dir\\name.h5\n");
  const Config c = parse({path}).config;
  EXPECT_EQ(c.generate.prompt, "C# and F#;x\n");  // prompt escapes are understood, quoted or not
  EXPECT_EQ(c.model.weights, "dir\\name.h5");     // other strings are taken literally
}

TEST_F(ConfigTest, BoolSpellings) {
  const std::vector<std::pair<std::string, bool>> cases = {
      {"true", true}, {"false", false}, {"1", true},   {"0", false},  {"yes", true},
      {"no", false},  {"on", true},     {"off", false}, {"True", true}, {"OFF", false}};
  for (const auto& [text, value] : cases) {
    const std::string path = write("b.ini", "[data]\ntrain = x.h5\nshuffle = " + text + "\n");
    EXPECT_EQ(parse({path}).config.data.shuffle, value) << text;
    EXPECT_EQ(parse({"--data.train=x", "--train.resume", text}).config.train.resume, value) << text;
  }
}

TEST_F(ConfigTest, CrlfLineEndingsAndByteOrderMark) {
  const std::string path = write("crlf.ini", "\xEF\xBB\xBF[data]\r\ntrain = x.h5\r\n[train]\r\nsteps = 7\r\n");
  const Config c = parse({path}).config;
  EXPECT_EQ(c.data.train, "x.h5");
  EXPECT_EQ(c.train.steps, 7);
}

// ---- command line -------------------------------------------------------------------------------------

TEST_F(ConfigTest, CommandLineOverridesIni) {
  const std::string path = write("o.ini",
                                 "[data]\ntrain = a.h5\n"
                                 "[train]\nlr = 0.001\nsteps = 10\n");
  ParseResult r = parse({path, "--train.lr=0.5", "--train.steps", "20", "--generate.prompt=hi\\tthere",
                         "--model.weights="});
  EXPECT_EQ(r.config.train.lr, 0.5f);
  EXPECT_EQ(r.config.train.steps, 20);
  EXPECT_EQ(r.config.data.train, "a.h5");
  EXPECT_EQ(r.config.generate.prompt, "hi\tthere");
  EXPECT_EQ(r.config.model.weights, "");
  // Overrides may also come before the INI file; the last occurrence on the command line wins.
  r = parse({"--train.steps=5", path, "--train.steps=6"});
  EXPECT_EQ(r.config.train.steps, 6);
  EXPECT_EQ(r.config.source, path);
}

TEST_F(ConfigTest, EveryKeyCanBeOverridden) {
  for (const auto& key : kAllKeys) {
    // A valid value per type: take it from the defaults written as INI text (of the model type that
    // uses the key: the other type's keys are errors, and comments in to_ini()).
    const bool bert = nlp::key_model_type(key) == "bert";
    Config d;
    if (bert) d.model.type = "bert";
    const std::string ini = d.to_ini();
    std::string value;
    std::string section;
    std::istringstream in(ini);
    for (std::string line; std::getline(in, line);) {
      if (!line.empty() && line[0] == '[') section = line.substr(1, line.size() - 2);
      if (section + "." + line.substr(0, line.find(" = ")) == key) value = line.substr(line.find(" = ") + 3);
    }
    std::vector<std::string> args = {"--" + key + "=" + value, "--data.train=x.h5"};
    if (bert && key != "model.type") args.insert(args.end(), {"--model.type=bert", "--run.task=doc_cls"});
    ParseResult r = parse(args);
    EXPECT_TRUE(r.config.is_set(key)) << key;
  }
}

TEST(ConfigCli, HelpAndVersion) {
  ParseResult r = parse({"--help"});
  EXPECT_TRUE(r.help);
  EXPECT_FALSE(r.help_text.empty());
  EXPECT_EQ(r.help_text, nlp::config_help());
  // --help wins over an otherwise incomplete or wrong configuration.
  EXPECT_TRUE(parse({"--train.steps=0", "--help"}).help);
  EXPECT_TRUE(parse({"-h"}).help);
  r = parse({"--version"});
  EXPECT_TRUE(r.version);
  EXPECT_FALSE(r.help);
}

TEST(ConfigCli, Errors) {
  std::string m = error_of({"--data.train=x", "--train.lr"});
  EXPECT_CONTAINS(m, "command line");
  EXPECT_CONTAINS(m, "train.lr");
  m = error_of({"a.ini", "b.ini"});
  EXPECT_CONTAINS(m, "a.ini");
  EXPECT_CONTAINS(m, "b.ini");
  m = error_of({"-x"});
  EXPECT_CONTAINS(m, "-x");
  m = error_of({"--data.train=x", "--train.steps="});
  EXPECT_CONTAINS(m, "train.steps");
  EXPECT_CONTAINS(m, "integer");
}

TEST(ConfigCli, UnknownKeyOnCommandLine) {
  std::string m = error_of({"--data.train=x", "--train.lrr=0.1"});
  EXPECT_CONTAINS(m, "command line");
  EXPECT_CONTAINS(m, "train.lrr");
  EXPECT_CONTAINS(m, "did you mean train.lr?");
  m = error_of({"--data.train=x", "--trian.steps", "3"});
  EXPECT_CONTAINS(m, "trian");
  EXPECT_CONTAINS(m, "did you mean train.steps?");
  m = error_of({"--data.train=x", "--model.lr=3"});  // a key of another section
  EXPECT_CONTAINS(m, "did you mean train.lr?");
  m = error_of({"--data.train=x", "--train.stpes=3"});
  EXPECT_CONTAINS(m, "did you mean train.steps?");
  m = error_of({"--data.train=x", "--train.learning_rate=3"});
  EXPECT_CONTAINS(m, "train.learning_rate");
  EXPECT_CONTAINS(m, "lr");  // lists the keys of [train]
}

// ---- errors in the INI --------------------------------------------------------------------------------

TEST_F(ConfigTest, UnknownKeyNamesFileKeyAndSuggestion) {
  const std::string path = write("u.ini", "[data]\ntrain = x.h5\n[train]\nsteps = 3\nlrr = 0.1\n");
  const std::string m = error_of({path});
  EXPECT_CONTAINS(m, path);
  EXPECT_CONTAINS(m, "line 5");
  EXPECT_CONTAINS(m, "train.lrr");
  EXPECT_CONTAINS(m, "0.1");
  EXPECT_CONTAINS(m, "did you mean train.lr?");
}

TEST_F(ConfigTest, UnknownSection) {
  std::string path = write("s.ini", "[data]\ntrain = x.h5\n[trian]\nlr = 0.1\n");
  std::string m = error_of({path});
  EXPECT_CONTAINS(m, path);
  EXPECT_CONTAINS(m, "line 3");
  EXPECT_CONTAINS(m, "unknown section");
  EXPECT_CONTAINS(m, "trian");
  EXPECT_CONTAINS(m, "did you mean [train]?");
  // An empty unknown section is an error too.
  path = write("s2.ini", "[data]\ntrain = x.h5\n[bogus]\n");
  m = error_of({path});
  EXPECT_CONTAINS(m, "bogus");
  // A key before any section.
  path = write("s3.ini", "lr = 0.1\n[data]\ntrain = x.h5\n");
  m = error_of({path});
  EXPECT_CONTAINS(m, "line 1");
  EXPECT_CONTAINS(m, "did you mean train.lr?");
}

TEST_F(ConfigTest, SyntaxError) {
  const std::string path = write("x.ini", "[data]\ntrain = x.h5\n[train]\nsteps 3\n");
  const std::string m = error_of({path});
  EXPECT_CONTAINS(m, path);
  EXPECT_CONTAINS(m, "line 4");
  EXPECT_CONTAINS(m, "steps 3");
}

TEST_F(ConfigTest, WrongTypes) {
  struct Case {
    std::string section, key, value;
  };
  const std::vector<Case> cases = {
      {"train", "steps", "ten"},       {"train", "steps", "10.5"},   {"train", "steps", "1e3"},
      {"train", "steps", "99999999999"}, {"train", "lr", "abc"},     {"train", "lr", "1.0x"},
      {"train", "lr", "1e99"},         {"train", "lr", "nan"},       {"data", "shuffle", "maybe"},
      {"train", "seed", "-1"},         {"generate", "seed", "x"},    {"train", "resume", "2"},
      {"model", "n_head", ""},           {"train", "steps", "1-2"},    {"train", "seed", "1.5"}};
  for (const auto& c : cases) {
    const std::string path =
        write("t.ini", "[data]\ntrain = x.h5\n[" + c.section + "]\n" + c.key + " = " + c.value + "\n");
    std::string m = error_of({path});
    EXPECT_CONTAINS(m, path);
    EXPECT_CONTAINS(m, c.section + "." + c.key);
    EXPECT_CONTAINS(m, "'" + c.value + "'");
    m = error_of({"--data.train=x", "--" + c.section + "." + c.key + "=" + c.value});
    EXPECT_CONTAINS(m, "command line");
    EXPECT_CONTAINS(m, c.section + "." + c.key);
  }
}

TEST(ConfigTypes, MessagesSayWhatWasExpected) {
  EXPECT_CONTAINS(error_of({"--train.steps=ten"}), "expected an integer");
  EXPECT_CONTAINS(error_of({"--train.steps=1-2"}), "expected an integer");
  EXPECT_CONTAINS(error_of({"--train.steps=99999999999"}), "out of range");
  EXPECT_CONTAINS(error_of({"--train.seed=99999999999999999999999"}), "out of range");
  EXPECT_CONTAINS(error_of({"--train.lr=abc"}), "expected a number");
  EXPECT_CONTAINS(error_of({"--train.lr=inf"}), "finite");
  EXPECT_CONTAINS(error_of({"--data.shuffle=maybe"}), "expected a bool");
}

TEST(ConfigRanges, OutOfRangeValuesAreRejected) {
  const std::vector<std::pair<std::string, std::string>> bad = {
      {"train.steps", "0"},           {"train.batch_size", "0"},     {"train.grad_accum", "0"},
      {"train.lr", "0"},              {"train.lr", "-1"},            {"model.embd_pdrop", "1"},
      {"model.attn_pdrop", "-0.1"},   {"model.resid_pdrop", "1.5"},  {"model.layer_norm_epsilon", "0"},
      {"model.n_layer", "0"},         {"model.n_head", "0"},         {"model.n_embd", "0"},
      {"model.vocab_size", "0"},      {"model.n_positions", "0"},    {"train.warmup_steps", "-1"}, {"train.schedule_steps", "-1"},
      {"train.weight_decay", "-0.1"}, {"train.beta1", "1"},          {"train.beta2", "-0.5"},
      {"train.adam_eps", "0"},        {"train.clip", "-1"},          {"train.min_lr_ratio", "1.5"},
      {"train.min_lr_ratio", "-0.1"}, {"checkpoint.keep", "0"},      {"checkpoint.interval", "-1"},
      {"eval.interval", "-1"},        {"eval.batches", "-1"},        {"generate.temperature", "0"},
      {"generate.top_k", "-1"},       {"generate.top_p", "0"},       {"generate.top_p", "1.01"},
      {"generate.max_new_tokens", "-1"}, {"generate.num_samples", "0"}, {"data.seq_len", "-1"},
      {"run.threads", "-1"},          {"run.log_interval", "0"},     {"train.sample_interval", "-1"},
      {"model.initializer_range", "0"}, {"output.dir", ""},          {"comm.gpu", "mpi"},
      {"comm.bucket_mb", "0"},        {"comm.bucket_mb", "5000"},    {"comm.timeout_s", "-1"},
      {"run.cpu_gemm", "mkl"},        {"run.cpu_bf16", "fast"},      {"data.pack_batch", "tokens"},
      {"data.pack_max_per_row", "0"}};
  for (const auto& [key, value] : bad) {
    const std::string m = error_of({"--data.train=x", "--" + key + "=" + value});
    EXPECT_CONTAINS(m, key);
    EXPECT_CONTAINS(m, "'" + value + "'");
    EXPECT_CONTAINS(m, "command line");
  }
  // Also with the space-separated form and negative numbers.
  EXPECT_CONTAINS(error_of({"--data.train=x", "--train.warmup_steps", "-5"}), "must be >= 0");
}

TEST(ConfigRanges, BoundaryValuesAreAccepted) {
  const Config c = parse({"--data.train=x", "--train.steps=1", "--train.min_lr_ratio=0", "--train.clip=0",
                          "--model.embd_pdrop=0", "--train.beta1=0", "--generate.top_p=1",
                          "--train.warmup_steps=0", "--generate.top_k=0", "--generate.max_new_tokens=0",
                          "--data.seq_len=0", "--run.threads=0", "--checkpoint.keep=1",
                          "--train.weight_decay=0"})
                       .config;
  EXPECT_EQ(c.train.steps, 1);
  EXPECT_EQ(c.generate.top_p, 1.0f);
  EXPECT_EQ(parse({"--data.train=x", "--train.min_lr_ratio=1"}).config.train.min_lr_ratio, 1.0f);
  EXPECT_EQ(parse({"--data.train=x", "--model.attn_pdrop=0.999"}).config.model.attn_pdrop, 0.999f);
}

TEST_F(ConfigTest, RangeErrorInIniNamesFileAndLine) {
  const std::string path = write("r.ini", "[data]\ntrain = x.h5\n[train]\n\nbatch_size = 0\n");
  const std::string m = error_of({path});
  EXPECT_CONTAINS(m, path);
  EXPECT_CONTAINS(m, "line 5");
  EXPECT_CONTAINS(m, "train.batch_size");
  EXPECT_CONTAINS(m, ">= 1");
  // A bad INI value overridden on the command line is fine: checks run on the final values.
  EXPECT_EQ(parse({path, "--train.batch_size=2"}).config.train.batch_size, 2);
}

TEST(ConfigChoices, AllowedAndRejected) {
  EXPECT_EQ(parse({"--data.train=x", "--run.mode=gradients"}).config.run.mode, "gradients");
  EXPECT_EQ(parse({"--data.eval=e", "--run.mode=eval"}).config.run.mode, "eval");
  EXPECT_EQ(parse({"--data.train=x", "--run.backend=cuda"}).config.run.backend, "cuda");
  for (const char* s : {"linear", "cosine", "constant"})
    EXPECT_EQ(parse({"--data.train=x", std::string("--train.schedule=") + s}).config.train.schedule, s);

  std::string m = error_of({"--data.train=x", "--run.mode=fit"});
  EXPECT_CONTAINS(m, "run.mode");
  EXPECT_CONTAINS(m, "'fit'");
  EXPECT_CONTAINS(m, "train, eval, predict, generate, gradients");
  m = error_of({"--data.train=x", "--run.task=summarize"});
  EXPECT_CONTAINS(m, "run.task");
  EXPECT_CONTAINS(m, "clm");
  EXPECT_CONTAINS(error_of({"--data.train=x", "--run.backend=tpu"}), "run.backend");
  EXPECT_CONTAINS(error_of({"--data.train=x", "--model.type=t5"}), "model.type");
  // Task and model must fit together.
  m = error_of({"--data.train=x", "--run.task=mlm"});
  EXPECT_CONTAINS(m, "run.task = mlm");
  EXPECT_CONTAINS(m, "model.type = bert");
  m = error_of({"--data.train=x", "--model.type=bert"});
  EXPECT_CONTAINS(m, "run.task = clm");
  EXPECT_EQ(parse({"--data.train=x", "--model.type=bert", "--run.task=qa"}).config.run.task, "qa");
  // data.pack_fixed_examples: packed rows planned by data.pack_batch = rows only
  EXPECT_TRUE(parse({"--data.train=x", "--model.type=bert", "--run.task=doc_cls", "--data.packing=true",
                     "--data.pack_fixed_examples=true"}).config.data.pack_fixed_examples);
  m = error_of({"--data.train=x", "--model.type=bert", "--run.task=doc_cls", "--data.pack_fixed_examples=true"});
  EXPECT_CONTAINS(m, "data.pack_fixed_examples = true (command line)");
  EXPECT_CONTAINS(m, "data.packing = true (now false");
  m = error_of({"--data.train=x", "--model.type=bert", "--run.task=doc_cls", "--data.packing=true",
                "--data.pack_batch=examples", "--data.pack_fixed_examples=true"});
  EXPECT_CONTAINS(m, "data.pack_batch = rows (now examples, command line)");
  // run.cuda_graph: the cuda backend (the cpu only emulates it, for tests), without per-op profiling
  ::unsetenv("NLPTRAIN_STEP_GRAPH_EMULATE");
  EXPECT_TRUE(parse({"--data.train=x", "--run.backend=cuda", "--run.cuda_graph=true"}).config.run.cuda_graph);
  m = error_of({"--data.train=x", "--run.cuda_graph=true"});
  EXPECT_CONTAINS(m, "run.cuda_graph = true (command line) needs run.backend = cuda (now cpu, default)");
  ::setenv("NLPTRAIN_STEP_GRAPH_EMULATE", "1", 1);
  EXPECT_TRUE(parse({"--data.train=x", "--run.cuda_graph=true"}).config.run.cuda_graph);
  ::unsetenv("NLPTRAIN_STEP_GRAPH_EMULATE");
  for (const char* key : {"run.profile", "run.sync_check"}) {
    m = error_of({"--data.train=x", "--run.backend=cuda", "--run.cuda_graph=true", nlp::cat("--", key, "=true")});
    EXPECT_CONTAINS(m, nlp::cat("run.cuda_graph = true (command line) cannot be combined with ", key,
                           " = true (command line)"));
  }
  // data.packing: bert tasks only
  EXPECT_TRUE(parse({"--data.train=x", "--model.type=bert", "--run.task=qa", "--data.packing=true"}).config.data.packing);
  m = error_of({"--data.train=x", "--data.packing=true"});
  EXPECT_CONTAINS(m, "data.packing = true (command line)");
  EXPECT_CONTAINS(m, "rows are full windows, with nothing to pack");
  // with cuDNN's attention, packed rows take its block-diagonal mask bias (selected explicitly)
  EXPECT_TRUE(parse({"--data.train=x", "--model.type=bert", "--run.task=ner", "--data.packing=true",
                     "--run.backend=cuda", "--model.attention=cudnn"}).config.data.packing);
  EXPECT_TRUE(parse({"--data.train=x", "--model.type=bert", "--run.task=ner", "--data.packing=true",
                     "--run.backend=cuda"}).config.data.packing);
  EXPECT_CONTAINS(error_of({"--data.train=x", "--model.type=bert", "--run.task=ner",
                            "--model.hidden_size=30", "--model.num_attention_heads=4"}),
                  "model.hidden_size = 30");
  EXPECT_CONTAINS(error_of({"--data.train=x", "--train.schedule=step"}), "train.schedule");
  EXPECT_CONTAINS(error_of({"--data.train=x", "--generate.tokenizer=spm"}), "generate.tokenizer");
  EXPECT_CONTAINS(error_of({"--data.train=x", "--run.mode=Train"}), "run.mode");  // case matters
}

TEST_F(ConfigTest, PrecisionChoices) {
  for (const char* p : {"auto", "fp32", "tf32", "bf16"}) {
    EXPECT_EQ(parse({"--data.train=x", std::string("--train.precision=") + p}).config.train.precision, p);
    const std::string path = write("p.ini", std::string("[data]\ntrain = x.h5\n[train]\nprecision = ") + p + "\n");
    EXPECT_EQ(parse({path}).config.train.precision, p);
  }
  // fp16 is not offered; spellings are exact (case matters), and empty is not "auto".
  for (const char* bad : {"fp16", "BF16", "bfloat16", "float32", "", "bf16 fp32"}) {
    const std::string m = error_of({"--data.train=x", std::string("--train.precision=") + bad});
    EXPECT_CONTAINS(m, "train.precision");
    EXPECT_CONTAINS(m, std::string("'") + bad + "'");
    EXPECT_CONTAINS(m, "command line");
    EXPECT_CONTAINS(m, "auto, fp32, tf32, bf16");
  }
  const std::string path = write("bad.ini", "[data]\ntrain = x.h5\n[train]\n\nprecision = half\n");
  const std::string m = error_of({path});
  EXPECT_CONTAINS(m, path);
  EXPECT_CONTAINS(m, "line 5");
  EXPECT_CONTAINS(m, "train.precision");
  EXPECT_CONTAINS(m, "'half'");
}

TEST_F(ConfigTest, SyncCheckIsABool) {
  EXPECT_FALSE(parse({"--data.train=x"}).config.run.sync_check);
  EXPECT_TRUE(parse({"--data.train=x", "--run.sync_check=true"}).config.run.sync_check);
  EXPECT_TRUE(parse({"--data.train=x", "--run.sync_check", "on"}).config.run.sync_check);
  EXPECT_FALSE(parse({"--data.train=x", "--run.sync_check=0"}).config.run.sync_check);
  const std::string path = write("s.ini", "[data]\ntrain = x.h5\n[run]\nsync_check = yes\n");
  EXPECT_TRUE(parse({path}).config.run.sync_check);
  std::string m = error_of({"--data.train=x", "--run.sync_check=sometimes"});
  EXPECT_CONTAINS(m, "run.sync_check");
  EXPECT_CONTAINS(m, "'sometimes'");
  EXPECT_CONTAINS(m, "expected a bool");
  // A key of [run], not of [train].
  m = error_of({"--data.train=x", "--train.sync_check=true"});
  EXPECT_CONTAINS(m, "did you mean run.sync_check?");
}

// model.attention: the key's choices, and how core/backend.h resolves them per backend and precision
TEST(ConfigChoices, ModelAttention) {
  for (const char* a : {"auto", "cudnn", "native"})
    EXPECT_EQ(parse({"--data.train=x", std::string("--model.attention=") + a}).config.model.attention, a);
  const std::string m = error_of({"--data.train=x", "--model.attention=flash"});
  EXPECT_CONTAINS(m, "model.attention");
  EXPECT_CONTAINS(m, "'flash'");
  EXPECT_CONTAINS(m, "auto, cudnn, native");

  using nlp::Precision;
  using nlp::parse_fused_attention;
  EXPECT_TRUE(parse_fused_attention("auto", "cuda", Precision::Bf16));
  EXPECT_FALSE(parse_fused_attention("auto", "cuda", Precision::Fp32));
  EXPECT_FALSE(parse_fused_attention("auto", "cuda", Precision::Tf32));
  EXPECT_TRUE(parse_fused_attention("cudnn", "cuda", Precision::Fp32));  // asked for: bf16 attention
  EXPECT_FALSE(parse_fused_attention("native", "cuda", Precision::Bf16));
  for (const char* a : {"auto", "cudnn", "native"})  // the cpu backend has only its own attention
    EXPECT_FALSE(parse_fused_attention(a, "cpu", Precision::Bf16)) << a;
  EXPECT_THROW(parse_fused_attention("flash", "cuda", Precision::Bf16), nlp::Error);
}

// ---- cross-key checks -----------------------------------------------------------------------------------

TEST_F(ConfigTest, NEmbdDivisibleByNHead) {
  const std::string path = write("d.ini", "[data]\ntrain = x.h5\n[model]\nn_embd = 100\n");
  const std::string m = error_of({path, "--model.n_head=3"});
  EXPECT_CONTAINS(m, "model.n_embd");
  EXPECT_CONTAINS(m, "100");
  EXPECT_CONTAINS(m, "model.n_head");
  EXPECT_CONTAINS(m, "3");
  EXPECT_CONTAINS(m, path);
  EXPECT_CONTAINS(m, "command line");
  EXPECT_EQ(parse({path, "--model.n_head=5"}).config.model.n_head, 5);
}

TEST(ConfigCross, TokenizerAndData) {
  std::string m = error_of({"--run.mode=generate", "--generate.tokenizer=gpt2"});
  EXPECT_CONTAINS(m, "generate.vocab_dir");
  EXPECT_EQ(parse({"--run.mode=generate", "--generate.tokenizer=gpt2", "--generate.vocab_dir=v"})
                .config.generate.tokenizer,
            "gpt2");
  m = error_of({});
  EXPECT_CONTAINS(m, "data.train");
  m = error_of({"--run.mode=gradients"});
  EXPECT_CONTAINS(m, "data.train");
  m = error_of({"--run.mode=eval", "--data.train=x"});
  EXPECT_CONTAINS(m, "data.eval");
}

TEST_F(ConfigTest, Gpt2VocabularyBesideTheWeights) {
  // No generate.vocab_dir: the folder of model.weights must hold the vocabulary and the merges.
  const std::string w = (dir_ / "w.h5").string();
  const std::vector<std::string> gen = {"--run.mode=generate", "--generate.tokenizer=gpt2",
                                        "--model.weights=" + w};
  std::string m = error_of(gen);
  EXPECT_CONTAINS(m, dir_.string());
  EXPECT_CONTAINS(m, "vocab.json");
  EXPECT_CONTAINS(m, "generate.vocab_dir");
  write("vocab.json", "{}");
  m = error_of(gen);
  EXPECT_CONTAINS(m, "merges.txt");
  EXPECT_CONTAINS(m, dir_.string());
  write("merges.txt", "");
  Config c = parse(gen).config;
  EXPECT_EQ(c.generate.vocab_dir, "");
  EXPECT_EQ(nlp::gpt2_vocab_dir(c), dir_.string());
  // An explicit generate.vocab_dir wins (and is not checked against the weights' folder).
  c = parse({"--run.mode=generate", "--generate.tokenizer=gpt2", "--model.weights=/nowhere/w.h5",
             "--generate.vocab_dir=/v"}).config;
  EXPECT_EQ(nlp::gpt2_vocab_dir(c), "/v");
}

TEST_F(ConfigTest, PromptsFile) {
  const std::string p = (dir_ / "prompts.jsonl").string();
  std::string m = error_of({"--run.mode=generate", "--generate.prompts_file=" + p});
  EXPECT_CONTAINS(m, "generate.prompts_file");
  EXPECT_CONTAINS(m, p);
  EXPECT_CONTAINS(m, "not found");
  write("prompts.jsonl", "{\"prompt\": \"a\"}\n");
  EXPECT_EQ(parse({"--run.mode=generate", "--generate.prompts_file=" + p}).config.generate.prompts_file, p);
  m = error_of({"--run.mode=generate", "--generate.prompts_file=" + p, "--generate.prompt=hi"});
  EXPECT_CONTAINS(m, "generate.prompt ");
  EXPECT_CONTAINS(m, "generate.prompts_file");
  EXPECT_CONTAINS(m, "both");
  // An empty --generate.prompt= clears an INI's prompt, so that a prompts file can be given
  const std::string with_prompt = write("prompt.ini", "[run]\nmode = generate\n[generate]\nprompt = \"Once\"\n");
  // A prompts file on the command line replaces the INI's prompt (the command line wins)
  const Config over = parse({with_prompt, "--generate.prompts_file=" + p}).config;
  EXPECT_EQ(over.generate.prompts_file, p);
  EXPECT_EQ(over.generate.prompt, nlp::GenerateConfig{}.prompt);
  ASSERT_EQ(over.notes.size(), 1u);
  EXPECT_CONTAINS(over.notes[0], "generate.prompts_file = " + p + " (command line) replaces generate.prompt = \"Once\"");
  // both in the INI: an error
  const std::string both = write("both.ini", "[run]\nmode = generate\n[generate]\nprompt = \"Once\"\nprompts_file = " + p + "\n");
  EXPECT_CONTAINS(error_of({both}), "both");
  EXPECT_EQ(parse({with_prompt, "--generate.prompt=", "--generate.prompts_file=" + p}).config.generate.prompt, "");
  // The config.ini a prompts_file run writes (every key, prompt at its default) parses again.
  Config c = parse({"--run.mode=generate", "--generate.prompts_file=" + p}).config;
  const std::string ini = write("written.ini", c.to_ini());
  EXPECT_EQ(parse({ini}).config.generate.prompts_file, p);
}

TEST_F(ConfigTest, DuplicateKey) {
  std::string path = write("dup.ini", "[data]\ntrain = x.h5\n[train]\nlr = 0.1\nsteps = 2\nlr = 0.2\n");
  std::string m = error_of({path});
  EXPECT_CONTAINS(m, path);
  EXPECT_CONTAINS(m, "duplicate");
  EXPECT_CONTAINS(m, "train.lr");
  EXPECT_CONTAINS(m, "line 6");
  EXPECT_CONTAINS(m, "line 4");
  // The same key in a repeated section is a duplicate too.
  path = write("dup2.ini", "[train]\nlr = 0.1\n[data]\ntrain = x.h5\n[train]\nlr = 0.2\n");
  m = error_of({path});
  EXPECT_CONTAINS(m, "duplicate");
  EXPECT_CONTAINS(m, "train.lr");
}

TEST_F(ConfigTest, MissingFile) {
  const std::string path = (dir_ / "does_not_exist.ini").string();
  std::string m = error_of({path, "--data.train=x"});
  EXPECT_CONTAINS(m, path);
  EXPECT_CONTAINS(m, "not found");
  m = error_of({dir_.string()});
  EXPECT_CONTAINS(m, dir_.string());
}

// ---- to_ini --------------------------------------------------------------------------------------------

TEST_F(ConfigTest, ToIniRoundTrip) {
  const std::string path = write("full.ini",
                                 "[run]\nmode = gradients\ntask = clm\nbackend = cuda\nthreads = 2\n"
                                 "log_interval = 5\npeak_tflops = 312.5\nsync_check = true\nmemory_limit_gb = 2.5\ncpu_gemm = openblas\ncpu_bf16 = emulate\n"
                                 "[model]\ntype = gpt2\nweights = w.h5\nn_layer = 3\nn_head = 6\n"
                                 "n_embd = 96\nvocab_size = 256\nn_positions = 128\nembd_pdrop = 0.3\n"
                                 "attn_pdrop = 0.123456789\nresid_pdrop = 0\nlayer_norm_epsilon = 3e-7\n"
                                 "initializer_range = 0.035\npreset = gpt2\n"
                                 "[data]\ntrain = \" lead space.h5\"\neval = e#1;x.h5\nseq_len = 64\n"
                                 "shuffle = false\npadding = max_length\npad_multiple = 64\ngroup_by_length = true\ngroup_order = shuffled\n"
                                 "[train]\nsteps = 77\nepochs = 0\nbatch_size = 3\ngrad_accum = 4\nlr = 1.7e-3\n"
                                 "min_lr_ratio = 0.1\nwarmup_steps = 9\nschedule = constant\n"
                                 "weight_decay = 0.2\nbeta1 = 0.85\nbeta2 = 0.95\nadam_eps = 1e-6\n"
                                 "clip = 0.5\nseed = 12345678901234567890\nresume = true\n"
                                 "sample_interval = 11\nprecision = tf32\nnonfinite = skip\nnonfinite_max = 3\nrecompute = block\nzero = 1\n"
                                 "[eval]\ninterval = 13\nbatches = 2\nsort_by_length = false\n"
                                 "[checkpoint]\ninterval = 50\nkeep = 3\n"
                                 "[output]\ndir = runs/a b\n"
                                 "[generate]\nprompt = \"Once \\\"upon\\\" a\\ttime\\\\n ; # end\\n\"\n"
                                 "max_new_tokens = 17\ntemperature = 0.7\ntop_k = 40\ntop_p = 0.9\n"
                                 "seed = 99\nnum_samples = 4\ntokenizer = gpt2\nvocab_dir = /v\n"
                                 "[debug]\ninject_nonfinite_step = 3, 7\nkill_at_step = 9\n");
  const Config a = parse({path}).config;
  EXPECT_EQ(a.generate.prompt, "Once \"upon\" a\ttime\\n ; # end\n");
  EXPECT_EQ(a.data.train, " lead space.h5");
  EXPECT_EQ(a.data.eval, "e#1;x.h5");
  EXPECT_EQ(a.model.attn_pdrop, 0.123456789f);
  EXPECT_TRUE(a.run.sync_check);
  EXPECT_EQ(a.train.precision, "tf32");
  EXPECT_EQ(a.run.cpu_gemm, "openblas");
  EXPECT_EQ(a.run.cpu_bf16, "emulate");
  EXPECT_FALSE(a.eval.sort_by_length);

  const std::string ini = a.to_ini();
  const std::string path2 = write("written.ini", ini);
  const Config b = parse({path2}).config;
  expect_equal(a, b);
  EXPECT_EQ(b.to_ini().substr(b.to_ini().find('\n')), ini.substr(ini.find('\n')));
  // to_ini writes every key; BERT's as comments for a GPT-2 model
  size_t gpt2_keys = 0;
  for (const auto& k : kAllKeys) gpt2_keys += nlp::key_model_type(k) != "bert";
  EXPECT_EQ(b.explicitly_set.size(), gpt2_keys);
  EXPECT_CONTAINS(ini, "# num_hidden_layers = 4   (bert only: unused with model.type = gpt2)");
}

TEST_F(ConfigTest, ToIniRoundTripBert) {
  const std::string path = write("bert.ini",
                                 "[run]\ntask = ner\n[model]\ntype = bert\nhidden_size = 96\nnum_hidden_layers = 3\n"
                                 "num_attention_heads = 6\nintermediate_size = 200\npad_token_id = -1\n"
                                 "num_labels = 13\nreinit_mismatched = true\nweights = w.h5\n"
                                 "[data]\ntrain = t.h5\n[train]\nepochs = 2.5\n");
  const Config a = parse({path}).config;
  EXPECT_TRUE(a.model.reinit_mismatched);
  EXPECT_EQ(a.train.epochs, 2.5f);
  const std::string ini = a.to_ini();
  EXPECT_CONTAINS(ini, "# n_layer = 4   (gpt2 only: unused with model.type = bert)");
  EXPECT_CONTAINS(ini, "# prompt = ");
  const Config b = parse({write("written.ini", ini)}).config;
  expect_equal(a, b);
  size_t bert_keys = 0;
  for (const auto& k : kAllKeys) bert_keys += nlp::key_model_type(k) != "gpt2";
  EXPECT_EQ(b.explicitly_set.size(), bert_keys - 1);  // train.steps is not written set: epochs is
}

TEST_F(ConfigTest, ToIniRoundTripOfDefaults) {
  Config d;
  d.data.train = "x.h5";
  const std::string path = write("defaults.ini", d.to_ini());
  expect_equal(parse({path}).config, d);
}

TEST(ConfigToIni, EveryKeyInItsSection) {
  const std::string ini = Config{}.to_ini();
  for (const auto& key : kAllKeys) {
    const std::string section = "[" + key.substr(0, key.find('.')) + "]";
    const bool other = nlp::key_model_type(key) == "bert";  // a comment for the default gpt2 model
    const std::string line = std::string(other ? "\n# " : "\n") + key.substr(key.find('.') + 1) + " = ";
    const auto s = ini.find(section);
    ASSERT_NE(s, std::string::npos) << section;
    const auto k = ini.find(line, s);
    ASSERT_NE(k, std::string::npos) << key;
    const auto next = ini.find("\n[", s + 1);
    EXPECT_TRUE(next == std::string::npos || k < next) << key << " not in " << section;
  }
  EXPECT_CONTAINS(ini, "prompt = \"\\n\"");
  EXPECT_CONTAINS(ini, "shuffle = true");
  EXPECT_CONTAINS(ini, "lr = 6e-04");
}

// ---- help ----------------------------------------------------------------------------------------------

TEST(ConfigHelp, ListsEveryKeyWithTypeAndDefault) {
  const std::string help = nlp::config_help();
  EXPECT_CONTAINS(help, "usage: nlptrain");
  EXPECT_CONTAINS(help, "--help");
  EXPECT_CONTAINS(help, "--version");
  EXPECT_CONTAINS(help, "--section.key=value");
  for (const auto& key : kAllKeys) {
    const auto pos = help.find("  " + key + " ");
    ASSERT_NE(pos, std::string::npos) << key;
    const std::string line = help.substr(pos, help.find('\n', pos) - pos);
    EXPECT_TRUE(contains(line, " int ") || contains(line, " float ") || contains(line, " bool ") ||
                contains(line, " string ") || contains(line, " uint64 "))
        << line;
  }
  for (const char* section : {"[run]", "[model]", "[data]", "[train]", "[eval]", "[checkpoint]",
                              "[comm]", "[output]", "[generate]"})
    EXPECT_CONTAINS(help, section);
  EXPECT_CONTAINS(help, "train|eval|predict|generate|gradients");
  EXPECT_CONTAINS(help, "50257");
}

// ---- explicitly_set ------------------------------------------------------------------------------------

TEST_F(ConfigTest, ExplicitlySet) {
  const std::string path = write("e.ini", "[data]\ntrain = x.h5\n[train]\nlr = 0.1\n[model]\nn_layer = 2\n");
  const Config c = parse({path, "--train.steps=5", "--train.lr=0.2"}).config;
  EXPECT_EQ(c.explicitly_set,
            (std::set<std::string>{"data.train", "train.lr", "model.n_layer", "train.steps"}));
  EXPECT_TRUE(c.is_set("train.steps"));
  EXPECT_FALSE(c.is_set("train.batch_size"));
  // A key set to its default value still counts as set.
  EXPECT_TRUE(parse({"--data.train=x", "--train.steps=1000"}).config.is_set("train.steps"));
}

}  // namespace

TEST(ConfigPadTokenId, RangeChecked) {
  // default 0 (BertConfig's pad_token_id); -1 = none; below -1 or at/above the vocabulary: an error
  EXPECT_EQ(parse({"--data.train=x.h5"}).config.model.pad_token_id, 0);
  EXPECT_EQ(parse({"--data.train=x.h5", "--model.type=bert", "--run.task=mlm", "--model.pad_token_id=-1"})
                .config.model.pad_token_id, -1);
  std::string m = error_of({"--data.train=x.h5", "--model.pad_token_id=-2"});
  EXPECT_NE(m.find("model.pad_token_id"), std::string::npos) << m;
  EXPECT_NE(m.find("-2"), std::string::npos) << m;
  m = error_of({"--data.train=x.h5", "--model.type=bert", "--run.task=mlm", "--model.vocab_size=30",
                "--model.pad_token_id=30"});
  EXPECT_NE(m.find("model.pad_token_id = 30"), std::string::npos) << m;
  EXPECT_NE(m.find("model.vocab_size = 30"), std::string::npos) << m;
}

// ---- model.preset, keys of the other model type, where a value came from -------------------------

TEST_F(ConfigTest, PresetSetsShapeAndExplicitKeysOverride) {
  Config c = parse({"--data.train=x.h5", "--model.preset=gpt2-medium", "--model.n_layer=6"}).config;
  EXPECT_EQ(c.model.type, "gpt2");
  EXPECT_EQ(c.model.n_layer, 6);  // the override (HF --config_overrides)
  EXPECT_EQ(c.model.n_head, 16);
  EXPECT_EQ(c.model.n_embd, 1024);
  EXPECT_EQ(c.model.vocab_size, 50257);
  EXPECT_EQ(c.where("model.n_embd"), "model.preset = gpt2-medium");
  EXPECT_EQ(c.where("model.n_layer"), "command line");
  EXPECT_FALSE(c.is_set("model.n_embd"));
  c = parse({"--data.train=x.h5", "--model.preset=bert-base", "--run.task=doc_cls"}).config;
  EXPECT_EQ(c.model.type, "bert");
  EXPECT_EQ(c.model.hidden_size, 768);
  EXPECT_EQ(c.model.intermediate_size, 3072);
  EXPECT_EQ(c.model.num_hidden_layers, 12);
  // a preset of the other architecture than an explicit model.type
  const std::string m = error_of({"--data.train=x.h5", "--model.preset=gpt2", "--model.type=bert", "--run.task=mlm"});
  EXPECT_CONTAINS(m, "model.preset = gpt2");
  EXPECT_CONTAINS(m, "model.type = bert");
  EXPECT_CONTAINS(error_of({"--data.train=x.h5", "--model.preset=gpt3"}), "model.preset");
}

TEST_F(ConfigTest, KeyOfTheOtherModelTypeIsAnError) {
  std::string m = error_of({"--data.train=x.h5", "--model.type=bert", "--run.task=doc_cls", "--model.n_layer=3"});
  EXPECT_CONTAINS(m, "model.n_layer = 3 (command line) applies only to model.type = gpt2");
  EXPECT_CONTAINS(m, "model.num_hidden_layers");
  const std::string ini = write("g.ini", "[model]\ntype = gpt2\nnum_labels = 3\n[data]\ntrain = x.h5\n");
  m = error_of({ini});
  EXPECT_CONTAINS(m, "model.num_labels = 3 (config file '" + ini + "') applies only to model.type = bert");
  // shared keys stay
  EXPECT_EQ(parse({"--data.train=x.h5", "--model.type=bert", "--run.task=mlm", "--model.vocab_size=99"})
                .config.model.vocab_size, 99);
}

TEST_F(ConfigTest, WhereNamesTheSourceOfEachKey) {
  const std::string ini = write("w.ini", "[model]\ntype = bert\nnum_labels = 3\n[run]\ntask = doc_cls\n");
  const Config c = parse({ini, "--model.num_labels=5", "--data.train=x.h5"}).config;
  EXPECT_EQ(c.where("model.num_labels"), "command line");  // overridden there, not the INI's
  EXPECT_EQ(c.where("model.type"), "config file '" + ini + "'");
  EXPECT_EQ(c.where("train.lr"), "default");
}

TEST_F(ConfigTest, EpochsAndStepsConflictAndIdsNeedAPromptsFile) {
  std::string m = error_of({"--data.train=x.h5", "--train.epochs=2", "--train.steps=10"});
  EXPECT_CONTAINS(m, "train.epochs = 2");
  EXPECT_CONTAINS(m, "train.steps = 10");
  EXPECT_EQ(parse({"--data.train=x.h5", "--train.epochs=1.5"}).config.train.epochs, 1.5f);
  m = error_of({"--run.mode=generate", "--generate.tokenizer=ids"});
  EXPECT_CONTAINS(m, "generate.prompts_file");
  EXPECT_CONTAINS(m, "tools/encode_prompts.py");
}

// Precedence: command line > INI file > model.preset > default. A key on the command line replaces
// its alternative from the INI file; both in one source are an error.
TEST_F(ConfigTest, CommandLineReplacesAlternativeFromIni) {
  const std::string ini = write("job.ini", "[data]\ntrain = x.h5\n[train]\nwarmup_steps = 4\nepochs = 3\n");
  Config c = parse({ini, "--train.steps=10"}).config;
  EXPECT_EQ(c.train.steps, 10);
  EXPECT_EQ(c.train.epochs, 0.f);
  EXPECT_FALSE(c.is_set("train.epochs"));
  EXPECT_EQ(c.where("train.epochs"), "default");
  ASSERT_EQ(c.notes.size(), 1u);
  EXPECT_EQ(c.notes[0], "train.steps = 10 (command line) replaces train.epochs = 3 (config file '" + ini +
                            "', line 5): the command line wins over the INI file");
  // the written configuration reads back to the same run (steps, no epochs)
  const Config back = parse({write("back.ini", c.to_ini())}).config;
  EXPECT_EQ(back.train.steps, 10);
  EXPECT_EQ(back.train.epochs, 0.f);
  EXPECT_TRUE(back.notes.empty());
  // and the other way round: epochs on the command line replaces the INI's steps
  const std::string ini2 = write("steps.ini", "[data]\ntrain = x.h5\n[train]\nsteps = 500\n");
  c = parse({ini2, "--train.epochs=2"}).config;
  EXPECT_EQ(c.train.epochs, 2.f);
  EXPECT_FALSE(c.is_set("train.steps"));
  EXPECT_EQ(c.train.steps, nlp::TrainConfig{}.steps);
  ASSERT_EQ(c.notes.size(), 1u);
  EXPECT_CONTAINS(c.notes[0], "train.epochs = 2 (command line) replaces train.steps = 500 (config file '" + ini2 + "', line 4)");
  // no conflict, no note
  EXPECT_TRUE(parse({ini2, "--train.steps=7"}).config.notes.empty());
  // both in the INI, or both on the command line: an error naming both
  const std::string both = write("both.ini", "[data]\ntrain = x.h5\n[train]\nsteps = 5\nepochs = 3\n");
  std::string m = error_of({both});
  EXPECT_CONTAINS(m, "train.epochs = 3 (config file '" + both + "', line 5) and train.steps = 5 (config file '" + both + "', line 4) are both set");
  m = error_of({ini, "--train.steps=10", "--train.epochs=1"});
  EXPECT_CONTAINS(m, "train.epochs = 1 (command line) and train.steps = 10 (command line) are both set");
}

TEST_F(ConfigTest, ModelTypeOnTheCommandLineReplacesPresetOfTheIni) {
  // the INI's preset is a gpt2; --model.type=bert replaces it (its shape keys are not applied)
  const std::string ini = write("p.ini", "[model]\npreset = gpt2\n[data]\ntrain = x.h5\n");
  Config c = parse({ini, "--model.type=bert", "--run.task=mlm"}).config;
  EXPECT_EQ(c.model.type, "bert");
  EXPECT_EQ(c.model.preset, "");
  EXPECT_EQ(c.model.hidden_size, nlp::ModelConfig{}.hidden_size);
  ASSERT_EQ(c.notes.size(), 1u);
  EXPECT_CONTAINS(c.notes[0], "model.type = bert (command line) replaces model.preset = gpt2 (config file '" + ini + "', line 2)");
  // a preset on the command line replaces the INI's model.type of the other architecture
  const std::string ini2 = write("t.ini", "[model]\ntype = gpt2\n[run]\ntask = mlm\n[data]\ntrain = x.h5\n");
  c = parse({ini2, "--model.preset=bert-base"}).config;
  EXPECT_EQ(c.model.type, "bert");
  EXPECT_EQ(c.model.hidden_size, 768);
  EXPECT_EQ(c.where("model.type"), "model.preset = bert-base");
  ASSERT_EQ(c.notes.size(), 1u);
  EXPECT_CONTAINS(c.notes[0], "model.preset = bert-base (command line) replaces model.type = gpt2");
  // the same architecture: no conflict; both in one source: the error stays
  EXPECT_TRUE(parse({ini, "--model.type=gpt2"}).config.notes.empty());
  EXPECT_CONTAINS(error_of({"--data.train=x.h5", "--model.preset=gpt2", "--model.type=bert", "--run.task=mlm"}),
                  "is a gpt2 architecture but model.type = bert");
}

// ---- reliability keys -----------------------------------------------------------------------------

TEST(ConfigStepList, Parses) {
  EXPECT_TRUE(nlp::parse_step_list("").empty());
  EXPECT_TRUE(nlp::parse_step_list("  ").empty());
  EXPECT_EQ(nlp::parse_step_list("3"), (std::vector<int64_t>{3}));
  EXPECT_EQ(nlp::parse_step_list(" 3, 7,12 "), (std::vector<int64_t>{3, 7, 12}));
  EXPECT_THROW(nlp::parse_step_list("3,,7"), nlp::Error);
  EXPECT_THROW(nlp::parse_step_list("0"), nlp::Error);
  EXPECT_THROW(nlp::parse_step_list("-2"), nlp::Error);
  EXPECT_THROW(nlp::parse_step_list("x"), nlp::Error);
  EXPECT_THROW(nlp::parse_step_list("3,"), nlp::Error);
}

TEST(ConfigReliability, DefaultsAndValidation) {
  Config d;
  EXPECT_EQ(d.train.nonfinite, "stop");
  EXPECT_EQ(d.train.nonfinite_max, 5);
  EXPECT_EQ(d.debug.inject_nonfinite_step, "");
  EXPECT_EQ(d.debug.kill_at_step, 0);
  EXPECT_EQ(d.debug.kill_in_checkpoint, 0);
  const ParseResult ok = parse({"--data.train=x.h5", "--train.nonfinite=skip", "--train.nonfinite_max=2",
                                "--debug.inject_nonfinite_step=2,4"});
  EXPECT_EQ(ok.config.train.nonfinite, "skip");
  EXPECT_EQ(ok.config.train.nonfinite_max, 2);
  EXPECT_EQ(nlp::parse_step_list(ok.config.debug.inject_nonfinite_step), (std::vector<int64_t>{2, 4}));
  for (const std::string bad : {"--train.nonfinite=ignore", "--train.nonfinite_max=0",
                                "--debug.inject_nonfinite_step=2,x", "--debug.kill_at_step=-1",
                                "--debug.kill_in_checkpoint=-1"}) {
    try {
      parse({"--data.train=x.h5", bad});
      ADD_FAILURE() << bad << " was accepted";
    } catch (const nlp::Error& e) {
      const std::string key = bad.substr(2, bad.find('=') - 2);
      EXPECT_NE(std::string(e.what()).find(key), std::string::npos) << e.what();
    }
  }
}

// Found by tests/fuzz/fuzz_cli: a 0x1F byte in a value (the stand-in that protects '#' from Boost's
// comment stripping) came back from an INI file as '#', so `--data.train=a<0x1F>` was written to
// config.ini and read back as "a#". Control characters other than a tab are now rejected, from the
// command line and from a file; a line break is still fine in the prompt, where to_ini() escapes it.
TEST_F(ConfigTest, ControlCharactersInValuesAreRejected) {
  for (const std::string bad : {std::string("a\x1f"), std::string("a\nb"), std::string("\x01x")}) {
    const std::string m = error_of({"--data.train=" + bad});
    EXPECT_CONTAINS(m, "data.train");
    EXPECT_CONTAINS(m, "control character");
  }
  const std::string path = write("c.ini", "[data]\ntrain = a\x1f.h5\n");
  const std::string m = error_of({path});
  EXPECT_CONTAINS(m, path);
  EXPECT_CONTAINS(m, "line 2");
  EXPECT_CONTAINS(m, "control character 0x1F");
  // A tab is kept, and a prompt's line breaks round-trip through to_ini().
  const Config a = parse({"--data.train=a\tb.h5", "--generate.prompt=x\ny\r\tz"}).config;
  EXPECT_EQ(a.data.train, "a\tb.h5");
  EXPECT_EQ(a.generate.prompt, "x\ny\r\tz");
  const Config b = parse({write("again.ini", a.to_ini())}).config;
  expect_equal(a, b);
  // Any control byte in a prompt (a byte-level model's tokens 0..31): kept, written as \xHH, read back.
  const std::string ctl = "\x07\x0e\x15\x1f#";
  const Config p = parse({"--data.train=x.h5", "--generate.prompt=" + ctl}).config;
  EXPECT_EQ(p.generate.prompt, ctl);
  EXPECT_CONTAINS(p.to_ini(), "\\x07\\x0E\\x15\\x1F#");
  expect_equal(p, parse({write("prompt.ini", p.to_ini())}).config);
  // Bytes that are not UTF-8 (found by fuzz_cli: config.ini must stay text): an error in a path, \xHH
  // in a prompt; valid multi-byte characters stay as they are.
  EXPECT_CONTAINS(error_of({"--data.train=a\xbd.h5"}), "byte 0xBD at offset 1 is not UTF-8 text");
  const Config u = parse({"--data.train=\xc3\xa9.h5", "--generate.prompt=\xbd\xc3\xa9"}).config;
  EXPECT_CONTAINS(u.to_ini(), "prompt = \"\\xBD\xc3\xa9\"");
  expect_equal(u, parse({write("utf8.ini", u.to_ini())}).config);
  EXPECT_EQ(parse({write("hex.ini", "[data]\ntrain = x.h5\n[generate]\nprompt = \"a\\x7Fb\\x0\\xZZ\"\n")})
                .config.generate.prompt,
            "a\x7f" "b\\x0\\xZZ");
}

// ---- the encoders on BERT's block (bert, roberta, electra) ------------------------------------------

TEST(ConfigEncoders, BertKeysServeEveryEncoderAndTheTypeMayComeFromTheWeights) {
  // BERT's keys apply to roberta and electra; model.embedding_size to electra only
  Config c = parse({"--model.type=roberta", "--run.task=doc_cls", "--model.hidden_size=64",
                    "--model.type_vocab_size=1", "--data.train=x.h5"}).config;
  EXPECT_TRUE(c.model.is_encoder());
  EXPECT_EQ(c.model.hidden_size, 64);
  c = parse({"--model.type=electra", "--run.task=ner", "--model.embedding_size=16", "--data.train=x.h5"}).config;
  EXPECT_EQ(c.model.embedding_size, 16);
  EXPECT_CONTAINS(error_of({"--model.type=bert", "--run.task=doc_cls", "--model.embedding_size=16", "--data.train=x.h5"}),
                  "model.embedding_size = 16 (command line) applies only to model.type = electra");
  EXPECT_CONTAINS(error_of({"--model.type=electra", "--run.task=mlm", "--data.train=x.h5"}),
                  "is not an objective of model.type = electra");
  EXPECT_CONTAINS(error_of({"--model.type=roberta", "--run.task=clm", "--data.train=x.h5"}),
                  "run.task = clm (command line) needs model.type = gpt2; with model.type = roberta");
  // model.type not given, model.weights given: the type-dependent checks wait for the weights
  c = parse({"--model.weights=w.h5", "--run.task=qa", "--model.hidden_dropout_prob=0", "--data.train=x.h5"}).config;
  EXPECT_TRUE(nlp::model_type_from_weights(c));
  EXPECT_CONTAINS(error_of({"--model.type=gpt2", "--model.weights=w.h5", "--run.task=qa", "--data.train=x.h5"}),
                  "needs model.type = bert, roberta or electra");
  // RoBERTa's positions start after its pad id
  nlp::ModelConfig mc;
  mc.type = "roberta";
  mc.max_position_embeddings = 514;
  mc.pad_token_id = 1;
  EXPECT_EQ(mc.max_sequence_length(), 512);
  mc.type = "electra";
  EXPECT_EQ(mc.max_sequence_length(), 514);
}
