#include "comm/agree.h"

#include <cstdio>
#include <vector>

namespace nlp {

void agree_on_error(Comm& comm, const std::string& error) {
  const int world = comm.size(), rank = comm.rank();
  std::vector<double> failed(size_t(world), 0.0);  // rank r's slot: 1 when it has an error
  failed[size_t(rank)] = error.empty() ? 0.0 : 1.0;
  comm.allreduce_sum_host(failed.data(), failed.size());
  int first = -1, count = 0;
  for (int r = 0; r < world; ++r)
    if (failed[size_t(r)] > 0) {
      if (first < 0) first = r;
      ++count;
    }
  if (first < 0) return;
  if (rank == first) {
    if (world == 1 || count == world)
      std::fprintf(stderr, "nlptrain: error: %s\n", error.c_str());
    else
      std::fprintf(stderr, "nlptrain: error [rank %d of %d]: %s\n", rank, world, error.c_str());
    std::fflush(stderr);
  }
  throw ReportedError(error.empty() ? cat("reported by rank ", first) : error);
}

}  // namespace nlp
