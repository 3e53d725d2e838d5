// Builds without NCCL (no CUDA, or nccl.h/libnccl not found): make_nccl_comm is an error that says
// what was missing; comm.gpu = auto then picks the staged communicator.
#include "comm/comm.h"
#include "core/error.h"

#ifndef NLPTRAIN_NCCL_MISSING
#define NLPTRAIN_NCCL_MISSING "built without CUDA"
#endif

namespace nlp {

bool nccl_available(std::string* why) {
  if (why) *why = NLPTRAIN_NCCL_MISSING;
  return false;
}

std::unique_ptr<Comm> make_nccl_comm(Comm&, Backend&, double) {
  throw Error(cat("the NCCL communicator is not available: ", NLPTRAIN_NCCL_MISSING));
}

}  // namespace nlp
