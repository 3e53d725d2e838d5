// Stopping a run (train/signals.h, train/log.h): Open MPI's kill delay as the ranks read it, the stop
// file, and Log::note (the signal thread's lines, in log.txt only). The signals themselves, sent to
// real runs, are tested in tests/python/test_first_hour_stop.py.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "train/log.h"
#include "train/signals.h"

namespace fs = std::filesystem;
using namespace nlp;

namespace {

class Stop : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string tmpl = (fs::temp_directory_path() / "nlptrain_test_stop_XXXXXX").string();
    ASSERT_NE(::mkdtemp(tmpl.data()), nullptr);
    dir_ = tmpl;
    const char* h = std::getenv("HOME");
    home_ = h ? h : "";
    const char* v = std::getenv("OMPI_MCA_odls_base_sigkill_timeout");
    had_env_ = v != nullptr;
    env_ = v ? v : "";
    ::setenv("HOME", dir_.c_str(), 1);
    ::unsetenv("OMPI_MCA_odls_base_sigkill_timeout");
  }
  void TearDown() override {
    ::setenv("HOME", home_.c_str(), 1);
    if (had_env_) ::setenv("OMPI_MCA_odls_base_sigkill_timeout", env_.c_str(), 1);
    else ::unsetenv("OMPI_MCA_odls_base_sigkill_timeout");
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }
  static std::string read(const fs::path& p) {
    std::ifstream in(p);
    std::stringstream ss;
    ss << in.rdbuf();
    return ss.str();
  }
  // The installation's parameter file sets the delay on this machine: the default cannot be seen.
  static bool system_file_sets_it() {
    for (const char* f : {"/etc/openmpi/openmpi-mca-params.conf", "/usr/local/etc/openmpi-mca-params.conf"})
      if (read(f).find("odls_base_sigkill_timeout") != std::string::npos) return true;
    return false;
  }
  std::string dir_, home_, env_;
  bool had_env_ = false;
};

TEST_F(Stop, KillDelayComesFromTheEnvironmentThenTheUsersFileThenTheDefault) {
  if (system_file_sets_it()) GTEST_SKIP() << "this machine's openmpi-mca-params.conf sets odls_base_sigkill_timeout";
  EXPECT_EQ(ompi_sigkill_timeout(), 1);  // Open MPI's default
  fs::create_directories(fs::path(dir_) / ".openmpi");
  {
    std::ofstream f(fs::path(dir_) / ".openmpi" / "mca-params.conf");
    f << "# a comment: odls_base_sigkill_timeout = 9\n"
         "odls_base_sigkill_timeout_other = 8\n"
         "  odls_base_sigkill_timeout = 4\n";
  }
  EXPECT_EQ(ompi_sigkill_timeout(), 4);
  ::setenv("OMPI_MCA_odls_base_sigkill_timeout", "7", 1);  // mpirun's export wins
  EXPECT_EQ(ompi_sigkill_timeout(), 7);
  ::setenv("OMPI_MCA_odls_base_sigkill_timeout", "7s", 1);  // not a number: the file's
  EXPECT_EQ(ompi_sigkill_timeout(), 4);
  ::setenv("OMPI_MCA_odls_base_sigkill_timeout", "0", 1);
  EXPECT_EQ(ompi_sigkill_timeout(), 0);
}

TEST_F(Stop, TheStopFileIsSeenAndRemoved) {
  EXPECT_FALSE(stop_file_exists(dir_));
  remove_stop_file(dir_);  // absent: no error
  std::ofstream(fs::path(dir_) / kStopFileName).put('\n');
  EXPECT_TRUE(stop_file_exists(dir_));
  EXPECT_FALSE(stop_file_exists(dir_ + "/elsewhere"));
  remove_stop_file(dir_);
  EXPECT_FALSE(stop_file_exists(dir_));
  EXPECT_FALSE(fs::exists(fs::path(dir_) / "STOP"));
}

TEST_F(Stop, LogNoteGoesToLogTxtOnlyAndInOrderAfterStart) {
  Log log(0);
  log.open(dir_, false);
  testing::internal::CaptureStdout();
  log.info("one");
  log.note("signal: before start");  // kept until start()
  log.start();
  log.note("signal: after start");
  log.info("two");
  const std::string out = testing::internal::GetCapturedStdout();
  EXPECT_EQ(out, "one\ntwo\n");
  EXPECT_EQ(read(fs::path(dir_) / "log.txt"), "one\nsignal: before start\nsignal: after start\ntwo\n");
  Log other(1);  // other ranks write nothing
  other.note("x");
}

}  // namespace
