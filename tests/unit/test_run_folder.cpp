// One run per output folder (train/run_folder.h), checkpoint.keep retention (io/checkpoint.h) and
// the temporary files a second stop signal removes (io/atomic_file.h).
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <set>
#include <string>
#include <vector>

#include "core/error.h"
#include "io/atomic_file.h"
#include "io/checkpoint.h"
#include "train/run_folder.h"
#include "train/run_lock.h"

namespace fs = std::filesystem;

namespace {

struct TempDir {
  fs::path path;
  TempDir() {
    path = fs::temp_directory_path() / ("nlp_run_folder_" + std::to_string(::getpid()) + "_" +
                                        ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(path);
    fs::create_directories(path);
  }
  ~TempDir() { fs::remove_all(path); }
};

void touch(const fs::path& p, const std::string& text = "x") {
  fs::create_directories(p.parent_path());
  std::ofstream(p) << text;
}

std::set<std::string> names(const fs::path& dir) {
  std::set<std::string> out;
  for (const auto& e : fs::directory_iterator(dir)) out.insert(e.path().filename().string());
  return out;
}

}  // namespace

TEST(RunFolder, MissingOrEmptyFolderIsNotUsed) {
  TempDir t;
  EXPECT_FALSE(nlp::inspect_run_folder((t.path / "absent").string()).used());
  // What a run stopped in start-up leaves (no checkpoint, no metrics record) is no run to protect.
  touch(t.path / "log.txt");
  touch(t.path / "config.ini");
  touch(t.path / "metrics.jsonl", "\n\n");
  touch(t.path / "checkpoints" / "step_00000003.h5.tmp.123");
  const nlp::RunFolder f = nlp::inspect_run_folder(t.path.string());
  EXPECT_FALSE(f.used());
  EXPECT_EQ(f.metrics_records, 0);
}

TEST(RunFolder, CheckpointsAndMetricsMakeItUsedAndTheMessageNamesThemAndTheWaysOn) {
  TempDir t;
  touch(t.path / "checkpoints" / "step_00000010.h5");
  touch(t.path / "checkpoints" / "step_00000020.h5");
  touch(t.path / "metrics.jsonl",
        "{\"run_id\":\"A\",\"step\":1,\"loss\":2}\n{\"run_id\":\"A\",\"step\":20,\"loss\":1}\n{\"split\":\"eval\"}\n");
  touch(t.path / "run_id", "runA-1\n");
  const nlp::RunFolder f = nlp::inspect_run_folder(t.path.string());
  EXPECT_TRUE(f.used());
  EXPECT_EQ(f.run_id, "runA-1");
  EXPECT_EQ(f.checkpoints, (std::vector<std::string>{"step_00000020.h5", "step_00000010.h5"}));
  EXPECT_EQ(f.metrics_records, 3);
  EXPECT_EQ(f.last_metrics_step, 20);
  const std::string m = nlp::used_folder_message(t.path.string(), f);
  for (const std::string& part :
       {std::string("holds another training run (run runA-1)"), std::string("2 checkpoint(s)"),
        std::string("step_00000020.h5, step_00000010.h5"), std::string("metrics.jsonl with 3 record(s), the last of step 20"),
        std::string("--train.resume=true"), std::string("--output.overwrite=true"),
        (t.path / "previous" / "runA-1").string()})
    EXPECT_NE(m.find(part), std::string::npos) << part << " not in: " << m;
}

TEST(RunFolder, MetricsAloneMakeItUsed) {
  TempDir t;
  touch(t.path / "metrics.jsonl", "{\"step\":1,\"loss\":2}\n");
  EXPECT_TRUE(nlp::inspect_run_folder(t.path.string()).used());
}

TEST(RunFolder, RunIdsAreValidFolderNamesAndDiffer) {
  const std::string a = nlp::new_run_id(), b = nlp::new_run_id();
  EXPECT_EQ(nlp::parse_run_id(a + "\n"), a);
  EXPECT_NE(a, b);  // 24 random bits: a collision in one pair is 1 in 16.7 million
  EXPECT_EQ(a.size(), std::string("20261128T170512Z-3fa9c2").size());
  EXPECT_EQ(nlp::parse_run_id("  x_1.2-3 \n"), "x_1.2-3");
  EXPECT_EQ(nlp::parse_run_id("../etc"), "");  // never a path
  EXPECT_EQ(nlp::parse_run_id("a b"), "");
  EXPECT_EQ(nlp::parse_run_id(".."), "");
  EXPECT_EQ(nlp::parse_run_id(""), "");
}

TEST(RunFolder, MoveAsideKeepsTheLockAndEarlierRunsAndTakesEverythingElse) {
  TempDir t;
  touch(t.path / nlp::RunLock::kFileName, "pid=1\n");
  touch(t.path / "previous" / "older" / "metrics.jsonl");
  touch(t.path / "checkpoints" / "step_00000005.h5", "ckpt");
  touch(t.path / "metrics.jsonl", "{\"step\":5}\n");
  touch(t.path / "log.txt");
  touch(t.path / "run_id", "R1\n");
  const std::string dest = nlp::move_run_aside(t.path.string(), "R1");
  EXPECT_EQ(fs::path(dest), t.path / "previous" / "R1");
  EXPECT_EQ(names(t.path), (std::set<std::string>{nlp::RunLock::kFileName, "previous"}));
  EXPECT_EQ(names(dest), (std::set<std::string>{"checkpoints", "metrics.jsonl", "log.txt", "run_id"}));
  std::ifstream in(fs::path(dest) / "checkpoints" / "step_00000005.h5");
  std::string text;
  in >> text;
  EXPECT_EQ(text, "ckpt");
  // The same id again (a folder copied back and forth): a new name beside, nothing replaced.
  touch(t.path / "metrics.jsonl", "{\"step\":1}\n");
  EXPECT_EQ(fs::path(nlp::move_run_aside(t.path.string(), "R1")), t.path / "previous" / "R1-2");
  EXPECT_EQ(fs::path(nlp::move_run_aside(t.path.string(), "")), t.path / "previous" / "unnamed");
  EXPECT_TRUE(fs::exists(t.path / "previous" / "older" / "metrics.jsonl"));
}

TEST(CheckpointKeep, CountsEveryFileInTheFolder) {
  using V = std::vector<std::string>;
  // The usual case: the new file is the newest; the oldest go.
  EXPECT_EQ(nlp::checkpoints_to_remove({"c/s4", "c/s3", "c/s2", "c/s1"}, "c/s4", 2), (V{"c/s2", "c/s1"}));
  // Files of higher steps than the one just written (left by another run): they count, the new one
  // stays, and the folder holds `keep` files afterwards.
  EXPECT_EQ(nlp::checkpoints_to_remove({"c/s20", "c/s10", "c/s5"}, "c/s5", 2), (V{"c/s10"}));
  EXPECT_EQ(nlp::checkpoints_to_remove({"c/s20", "c/s10", "c/s5"}, "c/s5", 1), (V{"c/s20", "c/s10"}));
  EXPECT_EQ(nlp::checkpoints_to_remove({"c/s20", "c/s10", "c/s5"}, "c/s5", 3), V{});
  EXPECT_EQ(nlp::checkpoints_to_remove({"c/s2", "c/s1"}, "c/s2", 0), V{});  // 0: keep all
}

TEST(AtomicFile, PendingTemporariesAreRemovedAndTheFinalNameNeverHalfWritten) {
  TempDir t;
  const std::string final_path = (t.path / "checkpoints" / "step_00000007.h5").string();
  std::string tmp;
  nlp::atomic_begin(final_path, &tmp);
  touch(tmp, "half a checkpoint");
  nlp::remove_pending_temporaries();  // what a second stop signal does before exiting
  EXPECT_FALSE(fs::exists(tmp));
  EXPECT_FALSE(fs::exists(final_path));
  // A committed write is no longer pending: removing temporaries leaves it whole.
  nlp::write_text_atomically(final_path, "whole");
  nlp::remove_pending_temporaries();
  std::ifstream in(final_path);
  std::string text;
  in >> text;
  EXPECT_EQ(text, "whole");
}

TEST(RunFolder, StaleTemporariesOfAKilledWriteAreRemovedAndNothingElse) {
  TempDir t;
  touch(t.path / "checkpoints" / "step_00000014.h5.tmp.29408", "half");
  touch(t.path / "checkpoints" / "step_00000013.h5", "whole");
  touch(t.path / "summary.json.tmp.7", "half");
  touch(t.path / "notes.tmp.txt", "user file");
  touch(t.path / "previous" / "R" / "metrics.jsonl.tmp.5", "an earlier run's: left alone");
  const std::vector<std::string> removed = nlp::remove_stale_temporaries(t.path.string());
  EXPECT_EQ(std::set<std::string>(removed.begin(), removed.end()),
            (std::set<std::string>{(t.path / "checkpoints" / "step_00000014.h5.tmp.29408").string(),
                                   (t.path / "summary.json.tmp.7").string()}));
  EXPECT_TRUE(fs::exists(t.path / "checkpoints" / "step_00000013.h5"));
  EXPECT_TRUE(fs::exists(t.path / "notes.tmp.txt"));
  EXPECT_TRUE(fs::exists(t.path / "previous" / "R" / "metrics.jsonl.tmp.5"));
}
