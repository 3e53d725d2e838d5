// The NCCL communicator (comm.gpu = nccl): gradient sums on device buffers, bootstrapped over MPI.
//
// Set-up: rank 0 creates the unique id, MPI broadcasts it, every rank joins with a non-blocking
// ncclCommInitRankConfig after the backend has bound its GPU; ncclCommGetAsyncError is polled until
// the communicator is ready, for at most comm.timeout_s. Blocking sums run on the backend's stream
// (stream order: no extra synchronisation). Overlapped buckets run on a communication stream that
// waits on an event recorded on the backend's stream after the kernels that produced the bucket;
// allreduce_wait makes the backend's stream wait on the last bucket and polls its completion
// (with train.zero = 1 the buckets are ncclReduce calls to each part's owner instead). train.zero = 3's
// prefetched block gathers (all_gather_start) run on the communication stream the same way.
// Every wait polls ncclCommGetAsyncError and a deadline: on an NCCL error or a collective that is
// stuck past comm.timeout_s, ncclCommAbort frees the GPU side and an nlp::Error goes to main, which
// MPI_Aborts every rank with the message (no rank hangs in a collective).
#include <cuda_runtime.h>
#include <nccl.h>

#include <chrono>
#include <cstdlib>
#include <exception>
#include <thread>

#include "backend/cuda/cuda_backend.h"
#include "comm/comm.h"
#include "comm/host_forwarding_comm.h"
#include "core/error.h"

namespace nlp {
namespace {

using Clock = std::chrono::steady_clock;

class NcclComm final : public HostForwardingComm {
 public:
  NcclComm(Comm& mpi, Backend& be, double timeout_s) : HostForwardingComm(mpi), timeout_s_(timeout_s) {
    stream_ = static_cast<cudaStream_t>(cuda_backend_stream(be));
    if (!stream_) throw Error("comm.gpu = nccl needs the cuda backend");
    ncclUniqueId id{};
    if (host_.rank() == 0) nccl(ncclGetUniqueId(&id), "ncclGetUniqueId");
    host_.broadcast_host(&id, sizeof id, 0);
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;  // returns at once; completion polled below, with the timeout
    ncclResult_t rc = ncclCommInitRankConfig(&comm_, host_.size(), id, host_.rank(), &config);
    if (rc != ncclSuccess && rc != ncclInProgress) fail(rc, "ncclCommInitRankConfig");
    settle("ncclCommInitRankConfig");
    cuda(cudaStreamCreateWithFlags(&comm_stream_, cudaStreamNonBlocking), "cudaStreamCreate");
    cuda(cudaEventCreateWithFlags(&produced_, cudaEventDisableTiming), "cudaEventCreate");
    cuda(cudaEventCreateWithFlags(&reduced_, cudaEventDisableTiming), "cudaEventCreate");
  }
  ~NcclComm() override {
    if (comm_ && std::uncaught_exceptions() > 0) {
      // Unwinding after an error: sums may be queued that wait for ranks which will never join;
      // waiting for them (or finalising, which syncs with the peers) could hang, so abort.
      ncclCommAbort(comm_);
    } else if (comm_) {
      cudaStreamSynchronize(comm_stream_);
      // Non-blocking communicator: finalise (flushes its work), wait until done, then destroy.
      ncclResult_t rc = ncclCommFinalize(comm_);
      const auto t0 = Clock::now();
      ncclResult_t st = rc;
      while (rc == ncclSuccess || rc == ncclInProgress) {
        if (ncclCommGetAsyncError(comm_, &st) != ncclSuccess || st != ncclInProgress) break;
        if (timeout_s_ > 0 && std::chrono::duration<double>(Clock::now() - t0).count() > timeout_s_) break;
        std::this_thread::yield();
      }
      if (st == ncclSuccess) ncclCommDestroy(comm_);
      else ncclCommAbort(comm_);
    }
    if (produced_) cudaEventDestroy(produced_);
    if (reduced_) cudaEventDestroy(reduced_);
    if (comm_stream_) cudaStreamDestroy(comm_stream_);
  }

  [[noreturn]] void abort(int code) override {
    if (comm_) ncclCommAbort(comm_);
    comm_ = nullptr;
    host_.abort(code);
    std::_Exit(code);  // not reached
  }

  void allreduce_sum(float* buf, size_t n) override {
    if (size() == 1 || n == 0) return;
    enqueue(buf, n, stream_);
    cuda(cudaEventRecord(reduced_, stream_), "cudaEventRecord");
    wait_event(reduced_, "ncclAllReduce");
  }

  void allreduce_sum_start(float* buf, size_t n) override {
    if (size() == 1 || n == 0) return;
    cuda(cudaEventRecord(produced_, stream_), "cudaEventRecord");
    cuda(cudaStreamWaitEvent(comm_stream_, produced_, 0), "cudaStreamWaitEvent");
    enqueue(buf, n, comm_stream_);
    started_ = true;
  }

  // One ZeRO-1 bucket on the communication stream, like allreduce_sum_start: each rank's part of it
  // reduced to that rank (in place there), one ncclReduce per part in one group.
  void reduce_scatter_sum_start(float* bucket, size_t lo, size_t n, const ShardLayout& sh) override {
    if (size() == 1 || n == 0) return;
    cuda(cudaEventRecord(produced_, stream_), "cudaEventRecord");
    cuda(cudaStreamWaitEvent(comm_stream_, produced_, 0), "cudaStreamWaitEvent");
    nccl(ncclGroupStart(), "ncclGroupStart");
    for (int r = 0; r < size(); ++r) {
      const auto [a, b] = sh.part(r, lo, lo + n);
      if (b > a)
        check_grouped(ncclReduce(bucket + (a - lo), bucket + (a - lo), b - a, ncclFloat, ncclSum, r, comm_,
                                 comm_stream_),
                      "ncclReduce (bucket)");
    }
    check_enqueue(ncclGroupEnd(), "ncclGroupEnd");
    started_ = true;
  }

  // ZeRO-1 on the backend's stream. Equal ranges: NCCL's in-place reduce-scatter (recvbuff = sendbuff
  // + rank * count) and all-gather. Otherwise (the last range shorter) one ncclReduce / ncclBroadcast
  // per range, rooted at its owner, in one group: the variable-size forms NCCL has no call for.
  void reduce_scatter_sum(float* buf, const ShardLayout& sh) override {
    if (size() == 1) return;
    if (sh.equal_counts()) {
      const size_t c = sh.count[0];
      check_enqueue(ncclReduceScatter(buf, buf + size_t(rank()) * c, c, ncclFloat, ncclSum, comm_, stream_),
                    "ncclReduceScatter");
    } else {
      nccl(ncclGroupStart(), "ncclGroupStart");
      for (int r = 0; r < size(); ++r)
        if (sh.count[r] > 0)
          check_grouped(ncclReduce(buf + sh.lo(r), buf + sh.lo(r), sh.count[r], ncclFloat, ncclSum, r, comm_,
                                   stream_),
                        "ncclReduce");
      check_enqueue(ncclGroupEnd(), "ncclGroupEnd");
    }
    cuda(cudaEventRecord(reduced_, stream_), "cudaEventRecord");
    wait_event(reduced_, "gradient reduce-scatter (train.zero = 1)");
  }

  void all_gather(float* buf, const ShardLayout& sh) override {
    if (size() == 1) return;
    enqueue_gather(buf, sh, stream_);
    cuda(cudaEventRecord(reduced_, stream_), "cudaEventRecord");
    wait_event(reduced_, "parameter all-gather (train.zero = 1)");
  }

  // train.zero = 3's prefetch of a block: on the communication stream, like the buckets. It waits on
  // an event recorded now on the backend's stream, so it runs after the kernels queued so far: those
  // that wrote this rank's part into buf, and those that still read the block buffer's previous
  // block. allreduce_wait then orders the backend's stream after it, before the block is read.
  void all_gather_start(float* buf, const ShardLayout& sh) override {
    if (size() == 1) return;
    cuda(cudaEventRecord(produced_, stream_), "cudaEventRecord");
    cuda(cudaStreamWaitEvent(comm_stream_, produced_, 0), "cudaStreamWaitEvent");
    enqueue_gather(buf, sh, comm_stream_);
    started_ = true;
  }

  void allreduce_wait() override {
    if (!started_) return;
    started_ = false;
    cuda(cudaEventRecord(reduced_, comm_stream_), "cudaEventRecord");
    cuda(cudaStreamWaitEvent(stream_, reduced_, 0), "cudaStreamWaitEvent");
    wait_event(reduced_, "gradient bucket sum");
  }

 private:
  void enqueue(float* buf, size_t n, cudaStream_t s) {
    check_enqueue(ncclAllReduce(buf, buf, n, ncclFloat, ncclSum, comm_, s), "ncclAllReduce");
  }
  // Every rank's range of buf to every rank, in place on stream s. Equal ranges packed from 0:
  // ncclAllGather (sendbuff = recvbuff + rank * count); otherwise one ncclBroadcast per range from
  // its owner, in one group.
  void enqueue_gather(float* buf, const ShardLayout& sh, cudaStream_t s) {
    bool packed = sh.equal_counts();  // and each range at rank * count (a block's split, train.zero = 3)
    for (int r = 0; packed && r < size(); ++r) packed = sh.lo(r) == size_t(r) * sh.count[0];
    if (packed) {
      const size_t c = sh.count[0];
      check_enqueue(ncclAllGather(buf + size_t(rank()) * c, buf, c, ncclFloat, comm_, s), "ncclAllGather");
      return;
    }
    nccl(ncclGroupStart(), "ncclGroupStart");
    for (int r = 0; r < size(); ++r)
      if (sh.count[r] > 0)
        check_grouped(ncclBroadcast(buf + sh.lo(r), buf + sh.lo(r), sh.count[r], ncclFloat, r, comm_, s),
                      "ncclBroadcast");
    check_enqueue(ncclGroupEnd(), "ncclGroupEnd");
  }

  // Inside ncclGroupStart/End a call is only recorded: its state is settled by ncclGroupEnd's.
  void check_grouped(ncclResult_t rc, const char* what) {
    if (rc != ncclSuccess && rc != ncclInProgress) fail(rc, what);
  }
  // A non-blocking communicator may answer ncclInProgress: poll until the call is enqueued.
  void check_enqueue(ncclResult_t rc, const char* what) {
    if (rc != ncclSuccess && rc != ncclInProgress) fail(rc, what);
    settle(what);
  }

  // Poll the communicator's asynchronous state until it is no longer in progress.
  void settle(const char* what) {
    const auto t0 = Clock::now();
    for (;;) {
      ncclResult_t st = ncclSuccess;
      ncclResult_t rc = ncclCommGetAsyncError(comm_, &st);
      if (rc != ncclSuccess) fail(rc, what);
      if (st == ncclSuccess) return;
      if (st != ncclInProgress) fail(st, what);
      check_deadline(t0, what);
      std::this_thread::yield();
    }
  }

  // Wait for an event on the GPU while watching NCCL's asynchronous errors and the deadline.
  void wait_event(cudaEvent_t ev, const char* what) {
    const auto t0 = Clock::now();
    for (;;) {
      cudaError_t e = cudaEventQuery(ev);
      if (e == cudaSuccess) return;
      if (e != cudaErrorNotReady) cuda(e, what);
      ncclResult_t st = ncclSuccess;
      ncclCommGetAsyncError(comm_, &st);
      if (st != ncclSuccess && st != ncclInProgress) fail(st, what);
      check_deadline(t0, what);
      std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
  }

  void check_deadline(Clock::time_point t0, const char* what) {
    if (timeout_s_ > 0 && std::chrono::duration<double>(Clock::now() - t0).count() > timeout_s_) {
      if (comm_) ncclCommAbort(comm_);
      comm_ = nullptr;
      throw Error(cat("NCCL: ", what, " not complete after comm.timeout_s = ", timeout_s_,
                      " s (a rank is stuck or dead); communicator aborted"));
    }
  }

  [[noreturn]] void fail(ncclResult_t rc, const char* what) {
    std::string msg = cat("NCCL error in ", what, ": ", ncclGetErrorString(rc));
    if (comm_) {
      const char* last = ncclGetLastError(comm_);
      if (last && *last) msg += cat(" (", last, ")");
      ncclCommAbort(comm_);
      comm_ = nullptr;
    }
    throw Error(msg + "; communicator aborted");
  }

  void cuda(cudaError_t e, const char* what) {
    if (e != cudaSuccess) {
      if (comm_) ncclCommAbort(comm_);
      comm_ = nullptr;
      throw Error(cat("NCCL communicator: ", what, ": ", cudaGetErrorString(e)));
    }
  }
  void nccl(ncclResult_t rc, const char* what) {
    if (rc != ncclSuccess) fail(rc, what);
  }

  double timeout_s_;
  ncclComm_t comm_ = nullptr;
  cudaStream_t stream_ = nullptr, comm_stream_ = nullptr;
  cudaEvent_t produced_ = nullptr, reduced_ = nullptr;
  bool started_ = false;
};

}  // namespace

bool nccl_available(std::string* why) {
  if (why) why->clear();
  return true;
}

std::unique_ptr<Comm> make_nccl_comm(Comm& mpi, Backend& be, double timeout_s) {
  return std::make_unique<NcclComm>(mpi, be, timeout_s);
}

}  // namespace nlp
