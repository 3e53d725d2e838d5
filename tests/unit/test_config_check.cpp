// Tests of `nlptrain --check`: the command line flag that parses and validates a configuration
// (INI file and overrides) without running anything. parse_config does every check it does for a
// run and reports the flag; app/main.cpp then prints Config::to_ini() and exits 0.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "config/config.h"
#include "core/error.h"

namespace fs = std::filesystem;

namespace {

nlp::ParseResult parse(std::vector<std::string> args) {
  args.insert(args.begin(), "nlptrain");
  std::vector<const char*> argv;
  for (const auto& a : args) argv.push_back(a.c_str());
  return nlp::parse_config(static_cast<int>(argv.size()), argv.data());
}

std::string write_ini(const std::string& name, const std::string& text) {
  const fs::path p = fs::temp_directory_path() / ("nlptrain_check_" + name + ".ini");
  std::ofstream(p) << text;
  return p.string();
}

}  // namespace

TEST(ConfigCheck, FlagParsesAndValidatesTheWholeConfiguration) {
  const std::string ini = write_ini("ok", "[run]\ntask = doc_cls\n[model]\ntype = bert\n[data]\ntrain = absent.h5\n");
  const nlp::ParseResult r = parse({ini, "--check", "--train.lr=3e-4"});
  EXPECT_TRUE(r.check);
  EXPECT_FALSE(r.help);
  EXPECT_EQ(r.config.run.task, "doc_cls");
  EXPECT_FLOAT_EQ(r.config.train.lr, 3e-4f);
  // the files the keys name are not opened: data.train does not exist
  EXPECT_EQ(r.config.data.train, "absent.h5");
  // what --check prints: the effective configuration, which parses again to the same (after the
  // first line, which names the file it was read from)
  auto body = [](const std::string& t) { return t.substr(t.find('\n')); };
  const std::string again = write_ini("again", r.config.to_ini());
  EXPECT_EQ(body(parse({again}).config.to_ini()), body(r.config.to_ini()));
  EXPECT_FALSE(parse({ini}).check);
}

TEST(ConfigCheck, BadValuesAndCombinationsAreStillErrors) {
  const std::string bad_type = write_ini("type", "[train]\nsteps = many\n");
  try {
    parse({bad_type, "--check"});
    FAIL() << "a bad value passed --check";
  } catch (const nlp::Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("line 2"), std::string::npos) << m;
    EXPECT_NE(m.find("train.steps"), std::string::npos) << m;
  }
  // a cross-key check (n_embd not divisible by n_head) runs under --check too
  EXPECT_THROW(parse({"--check", "--model.n_embd=32", "--model.n_head=3"}), nlp::Error);
}

TEST(ConfigCheck, HelpListsTheFlag) {
  EXPECT_NE(nlp::config_help().find("--check"), std::string::npos);
}
