// CRC-32, per-tensor checksums in weights and checkpoint files (damage is an error naming the file
// and the reason), the metrics.jsonl filter used on resume, and the output-folder run lock.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "comm/comm.h"
#include "core/error.h"
#include "io/checkpoint.h"
#include "io/crc32.h"
#include "io/h5.h"
#include "io/tensor_checksum.h"
#include "io/weights.h"
#include "train/log.h"
#include "train/run_lock.h"

namespace fs = std::filesystem;
using nlp::Error;
using nlp::NamedTensor;
using nlp::h5::File;

namespace {

class Reliability : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string tmpl = (fs::temp_directory_path() / "nlptrain_test_reliab_XXXXXX").string();
    ASSERT_NE(::mkdtemp(tmpl.data()), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override {
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }
  std::string p(const std::string& name) const { return (fs::path(dir_) / name).string(); }
  std::string dir_;
};

std::string error_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.what();
  }
  ADD_FAILURE() << "no nlp::Error thrown";
  return "";
}

#define EXPECT_CONTAINS(text, part) \
  EXPECT_NE(std::string(text).find(part), std::string::npos) << "'" << (part) << "' not in: " << (text)

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}
void write_file(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;
}

// Flips one bit of the first occurrence of `floats`' bytes in the file (HDF5 stores small
// contiguous datasets verbatim), the way a bad disk block would.
void flip_bit_in_data(const std::string& path, const std::vector<float>& floats) {
  std::string bytes = read_file(path);
  const std::string needle(reinterpret_cast<const char*>(floats.data()), floats.size() * sizeof(float));
  const size_t at = bytes.find(needle);
  ASSERT_NE(at, std::string::npos) << "tensor bytes not found in " << path;
  ASSERT_EQ(bytes.find(needle, at + 1), std::string::npos) << "tensor bytes found twice";
  bytes[at + 5] ^= 0x10;
  write_file(path, bytes);
}

struct Tensors {
  std::vector<float> w, b, mw, mb, vw, vb;
  explicit Tensors(float base) : w(12), b(3), mw(12), mb(3), vw(12), vb(3) {
    for (size_t i = 0; i < 12; ++i) {
      w[i] = base + 0.37f * i;
      mw[i] = base * 0.1f - 0.11f * i;
      vw[i] = base * 0.01f + 0.013f * i;
    }
    for (size_t i = 0; i < 3; ++i) {
      b[i] = -base - 0.5f * i;
      mb[i] = -base * 0.3f - i;
      vb[i] = base * 0.002f + i;
    }
  }
  std::vector<NamedTensor> params() { return {{"h.0.w", {4, 3}, w.data()}, {"h.0.b", {3}, b.data()}}; }
  std::vector<NamedTensor> m() { return {{"h.0.w", {4, 3}, mw.data()}, {"h.0.b", {3}, mb.data()}}; }
  std::vector<NamedTensor> v() { return {{"h.0.w", {4, 3}, vw.data()}, {"h.0.b", {3}, vb.data()}}; }
};

nlp::TrainState state_at(int64_t step) {
  nlp::TrainState st;
  st.step = step;
  st.next_batch = 2 * step;
  st.seed = 42;
  st.world_size = 2;
  st.best_metric = 1.5;
  st.optimizer_steps = step;
  return st;
}

// A single-process communicator: enough for RunLock::acquire (rank 0, broadcasts are no-ops).
class SoloComm : public nlp::Comm {
 public:
  int rank() const override { return 0; }
  int size() const override { return 1; }
  int local_rank() const override { return 0; }
  int local_size() const override { return 1; }
  void allreduce_sum(float*, size_t) override {}
  void allreduce_sum_host(double*, size_t) override {}
  void broadcast_host(void*, size_t, int) override {}
  void allreduce_sum_start(float*, size_t) override {}
  void allreduce_wait() override {}
  void reduce_scatter_sum(float*, const nlp::ShardLayout&) override {}
  void reduce_scatter_sum_start(float*, size_t, size_t, const nlp::ShardLayout&) override {}
  void all_gather(float*, const nlp::ShardLayout&) override {}
  void gather_host(const float* mine, float* all, const nlp::ShardLayout& sh, int) override {
    std::copy(mine, mine + sh.total, all);
  }
  void barrier() override {}
  [[noreturn]] void abort(int code) override { std::_Exit(code); }
};

}  // namespace

// ---- CRC-32 ---------------------------------------------------------------------------------------

TEST(Crc32, KnownValues) {
  // The standard check value of CRC-32 (zlib, PNG, Ethernet).
  EXPECT_EQ(nlp::crc32("123456789", 9), 0xCBF43926u);
  EXPECT_EQ(nlp::crc32("", 0), 0u);
  EXPECT_EQ(nlp::crc32("a", 1), 0xE8B7BE43u);
  const std::string fox = "The quick brown fox jumps over the lazy dog";
  EXPECT_EQ(nlp::crc32(fox.data(), fox.size()), 0x414FA339u);
}

TEST(Crc32, SlicedEqualsBytewiseAndChains) {
  // Every length and alignment around the 8-byte fast path against a plain bitwise CRC.
  std::vector<unsigned char> buf(301);
  for (size_t i = 0; i < buf.size(); ++i) buf[i] = static_cast<unsigned char>(i * 131 + 7);
  auto slow = [](const unsigned char* p, size_t n) {
    uint32_t c = 0xFFFFFFFFu;
    for (size_t i = 0; i < n; ++i) {
      c ^= p[i];
      for (int k = 0; k < 8; ++k) c = (c & 1u) ? (c >> 1) ^ 0xEDB88320u : c >> 1;
    }
    return ~c;
  };
  for (size_t off = 0; off < 8; ++off)
    for (size_t n = 0; n + off <= buf.size(); n += 7)
      ASSERT_EQ(nlp::crc32(buf.data() + off, n), slow(buf.data() + off, n)) << off << " " << n;
  for (size_t k : {0, 1, 8, 13, 300, 301}) {
    const uint32_t head = nlp::crc32(buf.data(), k);
    EXPECT_EQ(nlp::crc32(buf.data() + k, buf.size() - k, head), nlp::crc32(buf.data(), buf.size())) << k;
  }
}

TEST(Crc32, DetectsEverySingleBitFlip) {
  std::vector<float> v = {1.f, -2.5f, 3.25f, 1e-20f, 7.f};
  const uint32_t good = nlp::crc32(v.data(), v.size() * sizeof(float));
  auto* bytes = reinterpret_cast<unsigned char*>(v.data());
  for (size_t bit = 0; bit < v.size() * sizeof(float) * 8; ++bit) {
    bytes[bit / 8] ^= static_cast<unsigned char>(1u << (bit % 8));
    EXPECT_NE(nlp::crc32(v.data(), v.size() * sizeof(float)), good) << bit;
    bytes[bit / 8] ^= static_cast<unsigned char>(1u << (bit % 8));
  }
}

// ---- checksummed weights --------------------------------------------------------------------------

TEST_F(Reliability, WeightsCarryChecksumsAndVerify) {
  Tensors src(1.25f);
  const std::string path = p("w.h5");
  nlp::save_weights(path, src.params(), nullptr);
  {
    File f = File::open_read(path);
    EXPECT_TRUE(nlp::has_checksums(f));
    EXPECT_EQ(f.attr_int(nlp::kChecksumCountAttr), 2);
    EXPECT_EQ(f.attr_int(nlp::kTensorCrcAttr, "h.0.w"),
              static_cast<int64_t>(nlp::crc32(src.w.data(), src.w.size() * sizeof(float))));
    Tensors dst(0.f);
    EXPECT_TRUE(nlp::load_tensors(f, dst.params()).empty());
    EXPECT_EQ(dst.w, src.w);
    EXPECT_NO_THROW(nlp::verify_checksum_count(f));
  }
  flip_bit_in_data(path, src.w);
  File f = File::open_read(path);
  Tensors dst(0.f);
  const std::string msg = error_of([&] { nlp::load_tensors(f, dst.params()); });
  EXPECT_CONTAINS(msg, path);
  EXPECT_CONTAINS(msg, "h.0.w");
  EXPECT_CONTAINS(msg, "checksum");
}

TEST_F(Reliability, FileWithoutChecksumsLoadsUnverified) {
  // As tools/hf_import.py and older nlptrain versions write them.
  Tensors src(2.f);
  const std::string path = p("plain.h5");
  {
    File f = File::create(path);
    f.write_f32("h.0.w", {4, 3}, src.w.data());
    f.write_f32("h.0.b", {3}, src.b.data());
  }
  File f = File::open_read(path);
  EXPECT_FALSE(nlp::has_checksums(f));
  Tensors dst(0.f);
  EXPECT_NO_THROW(nlp::load_tensors(f, dst.params()));
  EXPECT_NO_THROW(nlp::verify_checksum_count(f));
  EXPECT_EQ(dst.b, src.b);
}

TEST_F(Reliability, ChecksumCountDetectsAMissingDataset) {
  Tensors src(3.f);
  const std::string path = p("count.h5");
  {
    File f = File::create(path);
    nlp::write_checksummed_f32(f, "h.0.w", {4, 3}, src.w.data());
    nlp::record_checksum_count(f, 2);  // claims a second dataset that is not there
  }
  File f = File::open_read(path);
  const std::string msg = error_of([&] { nlp::verify_checksum_count(f); });
  EXPECT_CONTAINS(msg, path);
  EXPECT_CONTAINS(msg, "2 checksummed tensors were written but 1 are present");
}

// ---- checkpoints ----------------------------------------------------------------------------------

TEST_F(Reliability, CheckpointRecordsStateAndRoundTrips) {
  Tensors src(1.5f);
  nlp::TrainState st = state_at(6);
  st.optimizer_steps = 4;
  st.nonfinite_skipped = 2;
  st.nonfinite_streak = 1;
  st.packed_rows = 1;
  const std::string out = p("run");
  const std::string path = nlp::save_checkpoint(out, st, src.params(), src.m(), src.v(), nullptr, 5);
  Tensors dst(0.f);
  const nlp::TrainState got = nlp::load_checkpoint(path, dst.params(), dst.m(), dst.v());
  EXPECT_EQ(got.step, 6);
  EXPECT_EQ(got.optimizer_steps, 4);
  EXPECT_EQ(got.nonfinite_skipped, 2);
  EXPECT_EQ(got.nonfinite_streak, 1);
  EXPECT_EQ(got.packed_rows, 1);
  EXPECT_EQ(dst.vb, src.vb);
  File f = File::open_read(path);
  EXPECT_EQ(f.attr_int(nlp::kChecksumCountAttr), 6);  // params and both moments
  // a run without packed steps writes no such attribute (the files older nlptrain reads and writes)
  const std::string plain = nlp::save_checkpoint(p("plain"), state_at(6), src.params(), src.m(), src.v(), nullptr, 5);
  EXPECT_FALSE(File::open_read(plain).has_attr("nlptrain_packed_rows"));
  EXPECT_EQ(nlp::load_checkpoint(plain, dst.params(), dst.m(), dst.v()).packed_rows, 0);
}

TEST_F(Reliability, DamagedCheckpointsAreErrorsNamingFileAndReason) {
  Tensors src(1.5f);
  const std::string out = p("run");
  for (int64_t step : {2, 4, 6, 8})
    nlp::save_checkpoint(out, state_at(step), src.params(), src.m(), src.v(), nullptr, 10);
  const auto files = nlp::checkpoint_files(out);
  ASSERT_EQ(files.size(), 4u);
  EXPECT_CONTAINS(files[0], "step_00000008.h5");  // newest first
  EXPECT_CONTAINS(files[3], "step_00000002.h5");
  Tensors dst(0.f);
  auto load = [&](const std::string& path) { nlp::load_checkpoint(path, dst.params(), dst.m(), dst.v()); };

  // Truncated (a write cut off, a full disk): cannot be opened.
  fs::resize_file(files[0], fs::file_size(files[0]) / 2);
  std::string msg = error_of([&] { load(files[0]); });
  EXPECT_CONTAINS(msg, files[0]);

  // One flipped bit in an optimizer moment's data.
  flip_bit_in_data(files[1], src.vw);
  msg = error_of([&] { load(files[1]); });
  EXPECT_CONTAINS(msg, files[1]);
  EXPECT_CONTAINS(msg, "optimizer/exp_avg_sq/h.0.w");
  EXPECT_CONTAINS(msg, "fails its checksum");

  // A file renamed to another step: the name and the state disagree.
  fs::copy_file(files[3], p("run/checkpoints/step_00000005.h5"));
  msg = error_of([&] { load(p("run/checkpoints/step_00000005.h5")); });
  EXPECT_CONTAINS(msg, "holds step 2");
  EXPECT_CONTAINS(msg, "says step 5");
  fs::remove(p("run/checkpoints/step_00000005.h5"));

  // The intact ones still load, bit for bit.
  EXPECT_NO_THROW(load(files[2]));
  EXPECT_EQ(dst.w, src.w);
  EXPECT_EQ(dst.mw, src.mw);
}

TEST_F(Reliability, EditedStateAttributeFailsTheStateChecksum) {
  // The state attributes (step, data position, seed...) are covered by their own CRC: rewrite a
  // checkpoint with one attribute changed but the old state CRC.
  Tensors src(1.f);
  const std::string out = p("run");
  const std::string path = nlp::save_checkpoint(out, state_at(3), src.params(), src.m(), src.v(), nullptr, 3);
  const std::string edited = p("edited/checkpoints/step_00000003.h5");
  fs::create_directories(fs::path(edited).parent_path());
  {
    File in = File::open_read(path);
    File f = File::create(edited);
    for (const auto& name : in.list()) {
      std::vector<float> buf(name.find(".w") != std::string::npos ? 12 : 3);
      const std::vector<int64_t> shape = in.shape(name);
      in.read_f32(name, shape, buf.data());
      f.write_f32(name, shape, buf.data());
      f.set_attr(nlp::kTensorCrcAttr, in.attr_int(nlp::kTensorCrcAttr, name), name);
    }
    for (const char* key : {"nlptrain_step", "nlptrain_seed", "nlptrain_world_size", "nlptrain_optimizer_steps",
                            "nlptrain_nonfinite_skipped", "nlptrain_nonfinite_streak", "nlptrain_state_crc32",
                            nlp::kChecksumCountAttr})
      f.set_attr(key, in.attr_int(key));
    f.set_attr("nlptrain_best_metric", in.attr_double("nlptrain_best_metric"));
    f.set_attr("nlptrain_next_batch", in.attr_int("nlptrain_next_batch") + 1);  // the edit
  }
  Tensors dst(0.f);
  const std::string msg = error_of([&] { nlp::load_checkpoint(edited, dst.params(), dst.m(), dst.v()); });
  EXPECT_CONTAINS(msg, edited);
  EXPECT_CONTAINS(msg, "nlptrain_state_crc32");
}

// ---- metrics.jsonl on resume ----------------------------------------------------------------------

TEST(MetricsFilter, KeepsRecordsUpToTheStepAndDropsCutLines) {
  const std::string text =
      "{\"step\":1,\"loss\":3}\n"
      "{\"step\":2,\"loss\":2.5}\n"
      "{\"split\":\"eval\",\"step\":2,\"loss\":2.4}\n"
      "{\"step\":3,\"loss\":2}\n"
      "{\"split\":\"eval\",\"loss\":2.2,\"tokens\":96}\n"  // run.mode = eval: no step, kept
      "{\"step\":10,\"loss\":1}\n"
      "{\"step\":4,\"lo";  // cut off by a kill
  int64_t dropped = -1;
  const std::string kept = nlp::filter_metrics_after(text, 2, &dropped);
  EXPECT_EQ(kept,
            "{\"step\":1,\"loss\":3}\n{\"step\":2,\"loss\":2.5}\n{\"split\":\"eval\",\"step\":2,\"loss\":2.4}\n"
            "{\"split\":\"eval\",\"loss\":2.2,\"tokens\":96}\n");
  EXPECT_EQ(dropped, 3);
  EXPECT_EQ(nlp::filter_metrics_after("", 5, &dropped), "");
  EXPECT_EQ(dropped, 0);
}

// ---- run lock -------------------------------------------------------------------------------------

TEST_F(Reliability, RunLockRefusesASecondHolderNamingHostAndPid) {
  SoloComm comm;
  const std::string out = p("out");
  nlp::RunLock first = nlp::RunLock::acquire(comm, out);  // creates the folder
  const std::string text = read_file(out + "/" + nlp::RunLock::kFileName);
  EXPECT_CONTAINS(text, "pid=" + std::to_string(::getpid()) + "\n");
  EXPECT_CONTAINS(text, "host=");
  // flock locks belong to the open file description: a second acquire in this process conflicts
  // exactly as another process's would.
  const std::string msg = error_of([&] { nlp::RunLock::acquire(comm, out); });
  EXPECT_CONTAINS(msg, out);
  EXPECT_CONTAINS(msg, "in use by another nlptrain run");
  EXPECT_CONTAINS(msg, "pid " + std::to_string(::getpid()));
  char host[256] = {};
  ::gethostname(host, sizeof host - 1);
  EXPECT_CONTAINS(msg, std::string("host ") + host);
  {
    nlp::RunLock moved = std::move(first);  // the lock goes with the object
    EXPECT_THROW(nlp::RunLock::acquire(comm, out), Error);
  }
  EXPECT_NO_THROW(nlp::RunLock::acquire(comm, out));  // released with `moved`
}

TEST_F(Reliability, RunLockLeavesAFreshFolderAsItWasFound) {
  namespace fs = std::filesystem;
  SoloComm comm;
  // Created by the run (two levels): removed, parents included, down to what existed.
  const std::string created = p("a/b");
  nlp::RunLock::acquire(comm, created).leave_as_found();
  EXPECT_FALSE(fs::exists(p("a")));
  // An empty folder that existed: stays, empty.
  fs::create_directories(p("empty"));
  nlp::RunLock::acquire(comm, p("empty")).leave_as_found();
  EXPECT_TRUE(fs::is_directory(p("empty")));
  EXPECT_TRUE(fs::is_empty(p("empty")));
  // A folder the run wrote into (log.txt): kept with the lock file; so is a lock file from before.
  {
    nlp::RunLock lock = nlp::RunLock::acquire(comm, p("written/run"));
    std::ofstream(p("written/run/log.txt")) << "x\n";
    lock.leave_as_found();
  }
  EXPECT_TRUE(fs::exists(p("written/run/log.txt")));
  EXPECT_TRUE(fs::exists(p("written/run/") + nlp::RunLock::kFileName));
  fs::remove(p("written/run/log.txt"));
  nlp::RunLock::acquire(comm, p("written/run")).leave_as_found();  // the lock file was there already
  EXPECT_TRUE(fs::exists(p("written/run/") + nlp::RunLock::kFileName));
  // Released: the folder can be locked again.
  EXPECT_NO_THROW(nlp::RunLock::acquire(comm, p("written/run")));
}

TEST_F(Reliability, RunLockOfADeadProcessIsNoObstacle) {
  SoloComm comm;
  const std::string out = p("out");
  fs::create_directories(out);
  const std::string lock = out + "/" + nlp::RunLock::kFileName;
  // A child takes the lock the way a run does, then is killed with SIGKILL while holding it.
  int ready[2];
  ASSERT_EQ(::pipe(ready), 0);
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    SoloComm c;
    try {
      nlp::RunLock held = nlp::RunLock::acquire(c, out);
      (void)!::write(ready[1], "x", 1);
      for (;;) ::pause();
    } catch (...) {
      std::_Exit(3);
    }
  }
  char byte = 0;
  ASSERT_EQ(::read(ready[0], &byte, 1), 1);
  ::close(ready[0]);
  ::close(ready[1]);
  const std::string busy = error_of([&] { nlp::RunLock::acquire(comm, out); });
  EXPECT_CONTAINS(busy, "pid " + std::to_string(child));
  ASSERT_EQ(::kill(child, SIGKILL), 0);
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  // The stale file still names the dead process; the lock died with it.
  EXPECT_CONTAINS(read_file(lock), "pid=" + std::to_string(child));
  nlp::RunLock mine = nlp::RunLock::acquire(comm, out);
  EXPECT_CONTAINS(read_file(lock), "pid=" + std::to_string(::getpid()) + "\n");
}

TEST_F(Reliability, RunLockFileLeftByAnotherToolIsNoObstacle) {
  SoloComm comm;
  const std::string out = p("out");
  fs::create_directories(out);
  write_file(out + "/" + nlp::RunLock::kFileName, "host=elsewhere\npid=999999\nstarted=yesterday\nmore junk\n");
  nlp::RunLock mine = nlp::RunLock::acquire(comm, out);
  const std::string text = read_file(out + "/" + nlp::RunLock::kFileName);
  EXPECT_EQ(text.find("elsewhere"), std::string::npos) << text;  // rewritten, not appended
}
