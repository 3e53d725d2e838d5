// The communicator interface: the trainer never calls MPI or NCCL directly.
// MpiComm (comm_mpi.cpp) works on host buffers for the CPU backend; an NCCL implementation on
// device buffers, bootstrapped over MPI, implements the same interface for the CUDA backend.
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "comm/shard.h"

namespace nlp {

class Comm {
 public:
  virtual ~Comm() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual int local_rank() const = 0;  // rank among the ranks on this node
  virtual int local_size() const = 0;
  // In-place sum over all ranks of a buffer in backend memory.
  virtual void allreduce_sum(float* buf, size_t n) = 0;
  // In-place sum over all ranks of host doubles (losses, counts, norms).
  virtual void allreduce_sum_host(double* buf, size_t n) = 0;
  virtual void broadcast_host(void* buf, size_t bytes, int root) = 0;
  // Non-blocking in-place sum of a range of a buffer in backend memory (a gradient bucket): it runs
  // while the caller goes on computing, and is complete only after allreduce_wait(). Every rank must
  // start the same ranges in the same order. No other call may touch the range until the wait.
  // GPU communicators order the sum after the work already queued on the backend's stream.
  virtual void allreduce_sum_start(float* buf, size_t n) = 0;
  // Drive outstanding sums forward (where the implementation needs the caller's thread for that).
  virtual void progress() {}
  // Block until every started sum (allreduce or reduce-scatter) is complete (for GPU communicators:
  // the backend's stream is ordered after them). Throws nlp::Error when a sum failed or exceeded the
  // timeout.
  virtual void allreduce_wait() = 0;
  // ZeRO-1 (comm/shard.h): in place over a flat arena of sh.total floats in backend memory.
  // reduce_scatter_sum: on return this rank's range [sh.lo(rank), sh.hi(rank)) holds the sum over
  // ranks of that range; the rest of buf is left unspecified (it is overwritten by the next all-gather).
  virtual void reduce_scatter_sum(float* buf, const ShardLayout& sh) = 0;
  // The overlapped form of reduce_scatter_sum, for one gradient bucket: `bucket` holds arena[lo, lo + n)
  // of an arena laid out by sh. Non-blocking, with the ordering rules of allreduce_sum_start, and
  // complete after allreduce_wait(): then this rank's part of the bucket (sh.part(rank, lo, lo + n))
  // holds the sum over ranks; the rest of the bucket is unspecified. Each part goes to its owner only,
  // so a bucket moves about half the bytes of its allreduce.
  virtual void reduce_scatter_sum_start(float* bucket, size_t lo, size_t n, const ShardLayout& sh) = 0;
  // all_gather: every rank's range of buf is copied into that range on every other rank.
  virtual void all_gather(float* buf, const ShardLayout& sh) = 0;
  // The non-blocking form of all_gather (train.zero = 3's prefetch of the next blocks): started now,
  // with the ordering rules of allreduce_sum_start, complete after allreduce_wait(). By default it runs
  // at once, blocking (the staged communicator keeps this default; MPI runs it on its communication
  // thread, NCCL on its communication stream after the work queued so far on the backend's stream).
  virtual void all_gather_start(float* buf, const ShardLayout& sh) { all_gather(buf, sh); }
  // Host floats to one rank (checkpoints of the sharded AdamW state): rank r sends sh.count[r] floats
  // from `mine`; `root` receives them at sh.offset[r] of `all` (sh.total floats; unused elsewhere).
  virtual void gather_host(const float* mine, float* all, const ShardLayout& sh, int root) = 0;
  virtual void barrier() = 0;
  // Every rank exits with `code`: used on any error so that no rank hangs.
  [[noreturn]] virtual void abort(int code) = 0;
};

class Backend;

// MPI must already be initialised (see app/main.cpp), with MPI_THREAD_SERIALIZED or more for the
// background thread that runs the started sums (else they run, more slowly, on progress() calls).
// timeout_s: a started sum that is not complete after this many seconds is an error (0 = never).
// thread = false: no background thread even where MPI supports one (for the tests of that path).
std::unique_ptr<Comm> make_mpi_comm(double timeout_s = 0, bool thread = true);

// The staged communicator: gradient sums go backend memory -> host buffer -> `inner` (MPI) -> back,
// in chunks; everything else forwards to `inner` (not owned: it and `be` must outlive the result). For GPU ranks without NCCL or sharing a GPU;
// on the CPU backend the copies are plain copies (which is how it is tested).
std::unique_ptr<Comm> make_staged_comm(Comm& inner, Backend& be,
                                       size_t chunk_floats = size_t(1) << 22);

// NCCL on device buffers, bootstrapped over `mpi` (rank 0 creates the unique id, MPI broadcasts it);
// sums run in the order of the CUDA backend's stream; host-side calls forward to `mpi`. Throws
// nlp::Error when NCCL is not compiled in (nccl_available() says why) or initialisation fails.
std::unique_ptr<Comm> make_nccl_comm(Comm& mpi, Backend& be, double timeout_s);
bool nccl_available(std::string* why);

}  // namespace nlp
