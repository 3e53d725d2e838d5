// The host copier in builds without CUDA: none (callers copy synchronously through the backend).
#include "backend/cuda/host_copy.h"

namespace nlp {

std::unique_ptr<HostCopier> make_host_copier(Backend&) { return nullptr; }

}  // namespace nlp
