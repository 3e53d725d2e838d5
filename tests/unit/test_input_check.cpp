// Tests of the start-up check of the input files (train/input_check.h): each problem is named by its
// key, where the key was set, and the file.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "config/config.h"
#include "io/h5.h"
#include "train/input_check.h"

namespace fs = std::filesystem;

namespace {

class InputCheck : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("nlp_input_check_" + std::to_string(::getpid()));
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string path(const std::string& name) const { return (dir_ / name).string(); }
  nlp::Config parse(std::vector<std::string> args) const {
    args.insert(args.begin(), "nlptrain");
    std::vector<const char*> argv;
    for (const auto& a : args) argv.push_back(a.c_str());
    return nlp::parse_config(int(argv.size()), argv.data()).config;
  }
  fs::path dir_;
};

bool has(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

}  // namespace

TEST_F(InputCheck, NamesKeyOriginAndFile) {
  const std::string missing = path("nope.h5");
  std::string m = nlp::check_input_files(parse({"--data.train=" + missing}));
  EXPECT_EQ(m, "data.train = '" + missing + "' (command line): cannot open HDF5 file '" + missing + "': no such file");
  // not HDF5, set in an INI file
  const std::string text = path("text.h5");
  std::ofstream(text) << "input_ids\n1 2 3\n";
  const std::string ini = path("job.ini");
  std::ofstream(ini) << "[data]\ntrain = " << text << "\n";
  m = nlp::check_input_files(parse({ini}));
  EXPECT_TRUE(has(m, "data.train = '" + text + "' (config file '" + ini + "'): ")) << m;
  EXPECT_TRUE(has(m, "is not an HDF5 file")) << m;
  // a folder as data.eval of a predict run
  m = nlp::check_input_files(parse({"--run.mode=predict", "--model.type=bert", "--run.task=doc_cls",
                                    "--data.eval=" + dir_.string()}));
  EXPECT_TRUE(has(m, "data.eval = '" + dir_.string() + "' (command line): ")) << m;
  EXPECT_TRUE(has(m, "is a directory")) << m;
  // model.weights missing: named with its key (checked before the data)
  m = nlp::check_input_files(parse({"--data.train=" + missing, "--model.weights=" + path("w.h5")}));
  EXPECT_TRUE(has(m, "model.weights = '" + path("w.h5") + "' (command line): file not found")) << m;
  // a readable HDF5 file passes (its contents are checked later, with the data)
  const std::string good = path("good.h5");
  { nlp::h5::File::create(good); }
  EXPECT_EQ(nlp::check_input_files(parse({"--data.train=" + good})), "");
  // data.eval is not read by run.mode = generate
  EXPECT_EQ(nlp::check_input_files(parse({"--run.mode=generate", "--data.eval=" + missing})), "");
}
