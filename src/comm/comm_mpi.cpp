// MPI communicator on host buffers (CPU backend): gradients averaged with MPI_Allreduce.
#include <mpi.h>

#include "comm/comm.h"
#include "core/error.h"

#include <algorithm>
#include <cstdlib>

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

class MpiComm final : public Comm {
 public:
  MpiComm() {
    MPI_Comm_rank(MPI_COMM_WORLD, &rank_);
    MPI_Comm_size(MPI_COMM_WORLD, &size_);
    MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, rank_, MPI_INFO_NULL, &node_);
    MPI_Comm_rank(node_, &local_rank_);
    MPI_Comm_size(node_, &local_size_);
  }
  ~MpiComm() override { MPI_Comm_free(&node_); }

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  int local_rank() const override { return local_rank_; }
  int local_size() const override { return local_size_; }

  void allreduce_sum(float* buf, size_t n) override {
    if (size_ == 1) return;
    // MPI counts are int: reduce in chunks of at most 2^30 elements.
    const size_t chunk = size_t(1) << 30;
    for (size_t off = 0; off < n; off += chunk) {
      int cnt = static_cast<int>(std::min(chunk, n - off));
      check(MPI_Allreduce(MPI_IN_PLACE, buf + off, cnt, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD),
            "MPI_Allreduce(float)");
    }
  }
  void allreduce_sum_host(double* buf, size_t n) override {
    if (size_ == 1) return;
    check(MPI_Allreduce(MPI_IN_PLACE, buf, static_cast<int>(n), MPI_DOUBLE, MPI_SUM,
                        MPI_COMM_WORLD),
          "MPI_Allreduce(double)");
  }
  void broadcast_host(void* buf, size_t bytes, int root) override {
    if (size_ == 1) return;
    check(MPI_Bcast(buf, static_cast<int>(bytes), MPI_BYTE, root, MPI_COMM_WORLD), "MPI_Bcast");
  }
  void barrier() override { MPI_Barrier(MPI_COMM_WORLD); }
  [[noreturn]] void abort(int code) override {
    MPI_Abort(MPI_COMM_WORLD, code);
    std::_Exit(code);
  }

 private:
  int rank_ = 0, size_ = 1, local_rank_ = 0, local_size_ = 1;
  MPI_Comm node_ = MPI_COMM_NULL;
};

}  // namespace

std::unique_ptr<Comm> make_mpi_comm() { return std::make_unique<MpiComm>(); }

}  // namespace nlp
