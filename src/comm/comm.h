// The communicator interface: the trainer never calls MPI or NCCL directly.
// MpiComm (comm_mpi.cpp) works on host buffers for the CPU backend; an NCCL implementation on
// device buffers, bootstrapped over MPI, implements the same interface for the CUDA backend.
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

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
  virtual void barrier() = 0;
  // Every rank exits with `code`: used on any error so that no rank hangs.
  [[noreturn]] virtual void abort(int code) = 0;
};

// MPI must already be initialised (see app/main.cpp).
std::unique_ptr<Comm> make_mpi_comm();

}  // namespace nlp
