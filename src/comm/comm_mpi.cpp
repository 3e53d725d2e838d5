// MPI communicator on host buffers (CPU backend): gradients summed with MPI_Allreduce, or, for the
// overlapped gradient reduction, with MPI_Iallreduce (MPI_Ireduce_scatter with train.zero = 1) run
// by a background thread; ZeRO-1's reduce-scatter and all-gather run on that thread too (for
// comm.timeout_s).
//
// Why a thread: Open MPI progresses a non-blocking collective only inside MPI calls. MPI_Test between
// blocks' backward would move a few fragments per call and leave most of the work to the final wait.
// The thread starts each bucket's MPI_Iallreduce and polls it with MPI_Test (sleeping briefly between
// polls so that it does not spin a core the compute needs), so the sum progresses during the compute.
// With MPI_THREAD_SERIALIZED only one thread may be inside MPI at a time: every other call of this
// class first waits until the thread has no work (the trainer calls nothing else in the meantime).
// Without thread support the sums are started on the caller's thread and progressed by progress().
#include <mpi.h>

#include "comm/comm.h"
#include "core/error.h"

#include <algorithm>
#include <cstdio>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <functional>
#include <limits>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

namespace nlp {
namespace {

void check(int rc, const char* what) {
  if (rc != MPI_SUCCESS) {
    char msg[MPI_MAX_ERROR_STRING];
    int len = 0;
    MPI_Error_string(rc, msg, &len);
    throw Error(cat("MPI error in ", what, ": ", std::string(msg, len)));
  }
}

using Clock = std::chrono::steady_clock;
constexpr size_t kMaxCount = size_t(1) << 30;  // MPI counts are int

class MpiComm final : public Comm {
 public:
  MpiComm(double timeout_s, bool thread) : timeout_s_(timeout_s) {
    MPI_Comm_rank(MPI_COMM_WORLD, &rank_);
    MPI_Comm_size(MPI_COMM_WORLD, &size_);
    MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, rank_, MPI_INFO_NULL, &node_);
    MPI_Comm_rank(node_, &local_rank_);
    MPI_Comm_size(node_, &local_size_);
    int provided = MPI_THREAD_SINGLE;
    MPI_Query_thread(&provided);
    threaded_ = thread && provided >= MPI_THREAD_SERIALIZED;
  }
  ~MpiComm() override {
    if (worker_.joinable()) {
      {
        std::lock_guard<std::mutex> lk(m_);
        stop_ = true;
      }
      cv_.notify_all();
      worker_.join();
    }
    MPI_Comm_free(&node_);
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  int local_rank() const override { return local_rank_; }
  int local_size() const override { return local_size_; }

  void allreduce_sum(float* buf, size_t n) override {
    if (size_ == 1) return;
    idle();
    for (size_t off = 0; off < n; off += kMaxCount) {
      int cnt = static_cast<int>(std::min(kMaxCount, n - off));
      check(MPI_Allreduce(MPI_IN_PLACE, buf + off, cnt, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD),
            "MPI_Allreduce(float)");
    }
  }
  void allreduce_sum_host(double* buf, size_t n) override {
    if (size_ == 1) return;
    idle();
    check(MPI_Allreduce(MPI_IN_PLACE, buf, static_cast<int>(n), MPI_DOUBLE, MPI_SUM,
                        MPI_COMM_WORLD),
          "MPI_Allreduce(double)");
  }
  void broadcast_host(void* buf, size_t bytes, int root) override {
    if (size_ == 1) return;
    idle();
    check(MPI_Bcast(buf, static_cast<int>(bytes), MPI_BYTE, root, MPI_COMM_WORLD), "MPI_Bcast");
  }
  void barrier() override {
    idle();
    MPI_Barrier(MPI_COMM_WORLD);
  }
  [[noreturn]] void abort(int code) override {
    MPI_Abort(MPI_COMM_WORLD, code);
    std::_Exit(code);
  }

  void allreduce_sum_start(float* buf, size_t n) override {
    if (size_ == 1 || n == 0) return;
    stall_if_asked();
    if (!threaded_) {
      for (size_t off = 0; off < n; off += kMaxCount) {
        inline_.emplace_back();
        check(MPI_Iallreduce(MPI_IN_PLACE, buf + off, static_cast<int>(std::min(kMaxCount, n - off)),
                             MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD, &inline_.back()),
              "MPI_Iallreduce");
      }
      if (inline_t0_ == Clock::time_point()) inline_t0_ = Clock::now();
      return;
    }
    for (size_t off = 0; off < n; off += kMaxCount) {
      float* p = buf + off;
      const int cnt = static_cast<int>(std::min(kMaxCount, n - off));
      submit({[p, cnt](MPI_Request* r) {
                return MPI_Iallreduce(MPI_IN_PLACE, p, cnt, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD, r);
              },
              nullptr, "gradient allreduce", size_t(cnt)});
    }
  }

  // ZeRO-1's reduce-scatter of the whole arena: the arena as one bucket (below), waited for.
  void reduce_scatter_sum(float* buf, const ShardLayout& sh) override {
    if (size_ == 1) return;
    reduce_scatter_sum_start(buf, 0, sh.total, sh);
    allreduce_wait();
  }

  // One bucket of ZeRO-1's reduce-scatter: MPI_Ireduce_scatter in place over the bucket, with each
  // rank's count its part of the bucket (zero for most ranks); MPI leaves this rank's sum at the start
  // of the bucket, moved to its place when complete. Runs like the allreduce buckets (the worker
  // thread, with comm.timeout_s, where threads are supported). (Not one MPI_Ireduce per owner: Open
  // MPI's libnbc runs a large MPI_Ireduce as a chain of small segments, 520 ms for 25 MB between two
  // ranks on one host against 33 ms for this:
  // bench/results/overlap-zero-20261123-epyc-zen3-5d8d630/overlap-zero-20261123.md.)
  void reduce_scatter_sum_start(float* bucket, size_t lo, size_t n, const ShardLayout& sh) override {
    if (size_ == 1 || n == 0) return;
    NLP_ASSERT(sh.ranks() == size_ && lo + n <= sh.total);
    stall_if_asked();
    for (size_t off = 0; off < n; off += kMaxCount) {
      const size_t a = lo + off, b = lo + std::min(n, off + kMaxCount);  // this call's part of the arena
      std::vector<size_t> parts;
      for (int r = 0; r < size_; ++r) {
        const auto [first, last] = sh.part(r, a, b);
        parts.push_back(last - first);
      }
      auto counts = std::make_shared<std::vector<int>>(ints(parts, "reduce-scatter bucket count"));
      float* p = bucket + off;
      const auto [mine_lo, mine_hi] = sh.part(rank_, a, b);
      const size_t shift = mine_lo - a, mine = mine_hi - mine_lo;
      auto move_home = [p, shift, mine] {
        if (mine > 0 && shift > 0) std::memmove(p + shift, p, mine * sizeof(float));
      };
      auto start = [p, counts](MPI_Request* r) {
        return MPI_Ireduce_scatter(MPI_IN_PLACE, p, counts->data(), MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD, r);
      };
      if (threaded_) {
        submit({start, move_home, "gradient reduce-scatter (train.zero = 1)", b - a});
      } else {
        inline_.emplace_back();
        check(start(&inline_.back()), "MPI_Ireduce_scatter");
        // the counts array stays alive until the wait: MPI may read it until the request completes
        inline_done_.push_back([move_home, counts] { move_home(); });
        if (inline_t0_ == Clock::time_point()) inline_t0_ = Clock::now();
      }
    }
  }

  // ZeRO-1's all-gather: MPI_Allgatherv in place takes each rank's contribution from its own range.
  void all_gather(float* buf, const ShardLayout& sh) override {
    if (size_ == 1) return;
    NLP_ASSERT(sh.ranks() == size_);
    auto c = std::make_shared<std::vector<int>>(ints(sh.count, "all-gather count"));
    auto d = std::make_shared<std::vector<int>>(ints(sh.offset, "all-gather offset"));
    if (!threaded_) {
      check(MPI_Allgatherv(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, buf, c->data(), d->data(), MPI_FLOAT,
                           MPI_COMM_WORLD),
            "MPI_Allgatherv");
      return;
    }
    submit({[buf, c, d](MPI_Request* r) {
              return MPI_Iallgatherv(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, buf, c->data(), d->data(),
                                     MPI_FLOAT, MPI_COMM_WORLD, r);
            },
            nullptr, "parameter all-gather (train.zero = 1)", sh.total});
    idle();
  }

  // The same as a started collective: on the worker thread (or, without one, an MPI_Iallgatherv on the
  // caller's thread, its count arrays kept until the wait), complete after allreduce_wait().
  void all_gather_start(float* buf, const ShardLayout& sh) override {
    if (size_ == 1) return;
    NLP_ASSERT(sh.ranks() == size_);
    auto c = std::make_shared<std::vector<int>>(ints(sh.count, "all-gather count"));
    auto d = std::make_shared<std::vector<int>>(ints(sh.offset, "all-gather offset"));
    auto start = [buf, c, d](MPI_Request* r) {
      return MPI_Iallgatherv(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, buf, c->data(), d->data(), MPI_FLOAT,
                             MPI_COMM_WORLD, r);
    };
    if (threaded_) {
      submit({start, nullptr, "parameter all-gather (train.zero = 3)", sh.total});
      return;
    }
    inline_.emplace_back();
    check(start(&inline_.back()), "MPI_Iallgatherv");
    inline_keep_.push_back(c);
    inline_keep_.push_back(d);
    if (inline_t0_ == Clock::time_point()) inline_t0_ = Clock::now();
  }

  void gather_host(const float* mine, float* all, const ShardLayout& sh, int root) override {
    NLP_ASSERT(sh.ranks() == size_);
    if (size_ == 1) {
      if (all != mine) std::memcpy(all, mine, sh.count[0] * sizeof(float));
      return;
    }
    idle();
    const std::vector<int> c = ints(sh.count, "gather count"), d = ints(sh.offset, "gather offset");
    check(MPI_Gatherv(mine, c[rank_], MPI_FLOAT, all, c.data(), d.data(), MPI_FLOAT, root, MPI_COMM_WORLD),
          "MPI_Gatherv");
  }

  void progress() override {
    if (inline_.empty()) return;
    int done = 0;
    check(MPI_Testall(static_cast<int>(inline_.size()), inline_.data(), &done, MPI_STATUSES_IGNORE),
          "MPI_Testall");
  }

  void allreduce_wait() override {
    if (!threaded_) {
      // Poll so that the timeout can end the run instead of hanging in MPI_Waitall.
      while (!inline_.empty()) {
        int done = 0;
        check(MPI_Testall(static_cast<int>(inline_.size()), inline_.data(), &done,
                          MPI_STATUSES_IGNORE),
              "MPI_Testall");
        if (done) {
          inline_.clear();
          for (auto& f : inline_done_) f();
          inline_done_.clear();
          inline_keep_.clear();
          inline_t0_ = Clock::time_point();
          break;
        }
        if (timeout_s_ > 0 &&
            std::chrono::duration<double>(Clock::now() - inline_t0_).count() > timeout_s_)
          throw Error(cat("gradient allreduce not complete after comm.timeout_s = ", timeout_s_,
                          " s (a rank is stuck or dead)"));
      }
      return;
    }
    idle();
  }

 private:
  // One non-blocking collective for the worker: `start` begins it, `done` runs after it completed.
  struct Job {
    std::function<int(MPI_Request*)> start;
    std::function<void()> done;
    const char* what;
    size_t n;  // floats (for messages and the trace)
  };

  // Fault injection for the test that a stuck rank ends the run (tests/python/test_comm.py):
  // NLPTRAIN_TEST_STALL_RANK=r makes rank r stop at its first gradient bucket (as a hung rank would).
  void stall_if_asked() const {
    static const char* stall = std::getenv("NLPTRAIN_TEST_STALL_RANK");
    if (stall && std::atoi(stall) == rank_)
      for (;;) std::this_thread::sleep_for(std::chrono::seconds(1));
  }

  void submit(Job job) {
    {
      std::lock_guard<std::mutex> lk(m_);
      if (!worker_.joinable()) worker_ = std::thread([this] { work(); });
      queue_.push_back(std::move(job));
      ++pending_;
    }
    cv_.notify_all();
  }

  // MPI counts and displacements are int: a shard of 2^31 floats or more cannot be expressed.
  std::vector<int> ints(const std::vector<size_t>& v, const char* what) const {
    std::vector<int> out;
    for (size_t x : v) {
      if (x > size_t(std::numeric_limits<int>::max()))
        throw Error(cat("train.zero = 1: the MPI ", what, " ", x, " exceeds the int range of MPI "
                        "counts; use more ranks or train.zero = 0"));
      out.push_back(static_cast<int>(x));
    }
    return out;
  }

  // Wait until the worker has no job; rethrow its error.
  void idle() {
    if (!worker_.joinable()) return;
    std::unique_lock<std::mutex> lk(m_);
    cv_.wait(lk, [this] { return pending_ == 0 || !error_.empty(); });
    if (!error_.empty()) throw Error(error_);
  }

  void work() {
    for (;;) {
      Job job;
      {
        std::unique_lock<std::mutex> lk(m_);
        cv_.wait(lk, [this] { return stop_ || !queue_.empty(); });
        if (stop_ && queue_.empty()) return;
        job = std::move(queue_.front());
        queue_.pop_front();
      }
      std::string err = run(job);
      {
        std::lock_guard<std::mutex> lk(m_);
        --pending_;
        if (!err.empty() && error_.empty()) error_ = err;
      }
      cv_.notify_all();
      if (!err.empty()) return;  // the caller throws and aborts every rank
    }
  }

  // One bucket: MPI_Iallreduce, then MPI_Test until complete. Returns an error message or "".
  std::string run(const Job& job) {
    const auto t0 = Clock::now();
    int polls = 0;
    std::string err = run_polls(job, polls);
    // NLPTRAIN_COMM_TRACE=1: each bucket's time from its start to its completion (bench/overlap.sh)
    static const bool trace = std::getenv("NLPTRAIN_COMM_TRACE") != nullptr;
    if (trace)
      std::fprintf(stderr, "[trace rank %d] bucket of %zu floats: %.1f ms, %d polls, done at %.3f s\n",
                   rank_, job.n, std::chrono::duration<double>(Clock::now() - t0).count() * 1e3, polls,
                   std::chrono::duration<double>(Clock::now().time_since_epoch()).count());
    return err;
  }

  std::string run_polls(const Job& job, int& polls) {
    const auto t0 = Clock::now();
    MPI_Request req;
    int rc = job.start(&req);
    if (rc != MPI_SUCCESS) return cat("MPI error in ", job.what, " (code ", rc, ")");
    for (;; ++polls) {
      int done = 0;
      rc = MPI_Test(&req, &done, MPI_STATUS_IGNORE);
      if (rc != MPI_SUCCESS) return cat("MPI error in MPI_Test of ", job.what, " (code ", rc, ")");
      if (done) break;
      if (timeout_s_ > 0 && std::chrono::duration<double>(Clock::now() - t0).count() > timeout_s_)
        return cat(job.what, " of ", job.n, " floats not complete after comm.timeout_s = ", timeout_s_,
                   " s (a rank is stuck or dead)");
      // A burst of polls moves the data while it flows; then sleep so as not to spin a core
      // the compute needs while the other ranks have not yet joined.
      if (polls % 64 == 63) std::this_thread::sleep_for(std::chrono::microseconds(100));
    }
    if (job.done) job.done();
    return {};
  }

  int rank_ = 0, size_ = 1, local_rank_ = 0, local_size_ = 1;
  MPI_Comm node_ = MPI_COMM_NULL;
  double timeout_s_ = 0;
  bool threaded_ = false;
  // threaded: the worker and its queue
  std::thread worker_;
  std::mutex m_;
  std::condition_variable cv_;
  std::deque<Job> queue_;
  size_t pending_ = 0;
  bool stop_ = false;
  std::string error_;
  // not threaded: requests started on the caller's thread
  std::vector<MPI_Request> inline_;
  std::vector<std::function<void()>> inline_done_;  // run in order once they are complete
  std::vector<std::shared_ptr<std::vector<int>>> inline_keep_;  // count arrays of started all-gathers
  Clock::time_point inline_t0_{};
};

}  // namespace

std::unique_ptr<Comm> make_mpi_comm(double timeout_s, bool thread) {
  return std::make_unique<MpiComm>(timeout_s, thread);
}

}  // namespace nlp
