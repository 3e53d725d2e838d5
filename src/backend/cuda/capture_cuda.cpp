// CudaBackend (cuda_backend_impl.h): replayed micro-batches (core/backend.h). The ops between
// capture_begin and capture_end are recorded into a CUDA graph (stream capture) instead of running;
// a replay copies the per-launch values (seeds, dloss) into the recording's device table, which the
// recorded kernels read.
#include "backend/cuda/cuda_backend_impl.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstring>
#include <memory>
#include <string>

namespace nlp::cuda {

CudaRecording::~CudaRecording() {
  // the last table copy and launch must be done before the memory goes
  if (launched) {
    cudaEventSynchronize(copied);
    cudaEventSynchronize(done);
  }
  if (exec) cudaGraphExecDestroy(exec);
  if (copied) cudaEventDestroy(copied);
  if (done) cudaEventDestroy(done);
  if (table) cudaFree(table);
  if (staging) cudaFreeHost(staging);
  cudaGetLastError();  // a destructor reports nothing
}

// A recording is a CUDA graph captured from stream_ (cudaStreamCaptureModeThreadLocal). The
// recorded kernels hold the device pointers of the moment: every grow-only buffer they use (the
// workspace, the cross-entropy statistics, the GEMM's bf16 scratch, cuDNN's workspace) must stay
// where it is, so none grows while recording (the op throws instead) and a replay after one grew
// throws (memory_generation()). The cross-entropy target check works across replays as across
// eager ops: the recorded ops raise the flag, copy it to pinned memory, and leave ce_ pointing at
// their targets; replay() arms the flag (outside the graph) when no check is pending.
bool CudaBackend::can_capture(std::string* why) const {
  std::string r;
  if (prof_)
    r = "run.profile is on (its per-op timing reads events at every synchronisation)";
  else if (sync_check_)
    r = "run.sync_check is on (it synchronises after every op)";
  else if (segment_ce_rows_)
    r = "NLPTRAIN_CUDA_SEGMENT_CE=rows (segment cross-entropy copies its offsets to the host at "
        "every call)";
  if (why) *why = r;
  return r.empty();
}

void CudaBackend::capture_begin(size_t slots) {
  if (cap_) throw Error("cuda backend: capture_begin: a recording is already in progress");
  std::string why;
  if (!can_capture(&why)) throw Error(cat("cuda backend: capture_begin: cannot record: ", why));
  auto rec = std::make_shared<CudaRecording>(this, slots);
  const size_t words = std::max<size_t>(slots, 1);
  void *table = nullptr, *staging = nullptr;
  ck(cudaMalloc(&table, words * sizeof(uint64_t)), "capture_begin (value table)");
  rec->table = static_cast<uint64_t*>(table);
  ck(cudaMallocHost(&staging, words * sizeof(uint64_t)), "capture_begin (staging)");
  rec->staging = static_cast<uint64_t*>(staging);
  std::memset(rec->staging, 0, words * sizeof(uint64_t));
  ck(cudaMemsetAsync(rec->table, 0, words * sizeof(uint64_t), stream_), "capture_begin (value table)");
  ck(cudaEventCreateWithFlags(&rec->copied, cudaEventDisableTiming), "capture_begin (event)");
  ck(cudaEventCreateWithFlags(&rec->done, cudaEventDisableTiming), "capture_begin (event)");
  auto c = std::make_unique<Capture>();
  c->rec = std::move(rec);
  c->generation = memory_generation();
  c->builds = cudnn_builds();
  c->ce = ce_;
  c->stats = ce_stats_;
  ck(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal), "capture_begin");
  cap_ = std::move(c);
}

void CudaBackend::bind_slot(int k) {
  if (k < 0) {
    slot_ = nullptr;
    return;
  }
  if (!cap_) throw Error(cat("cuda backend: bind_slot(", k, ") outside a recording"));
  if (size_t(k) >= cap_->rec->slots) {
    slot_ = nullptr;
    const std::string m = cat("cuda backend: bind_slot(", k, "): the recording has ",
                              cap_->rec->slots, " slot(s)");
    if (cap_->failure.empty()) cap_->failure = m;
    throw Error(m);
  }
  slot_ = cap_->rec->table + k;
}

std::shared_ptr<Backend::Recording> CudaBackend::capture_end(std::string* why) {
  slot_ = nullptr;
  if (!cap_) {
    if (why) *why = "capture_end without capture_begin";
    return nullptr;
  }
  std::unique_ptr<Capture> c = std::move(cap_);
  cudaGraph_t graph = nullptr;
  const cudaError_t end = cudaStreamEndCapture(stream_, &graph);
  cudaGetLastError();  // an invalidated capture's error is reported below, not by the next op
  CudaRecording& r = *c->rec;
  r.has_ce = c->has_ce;
  r.ce_flag = ce_;
  r.stats_set = c->stats_set;
  r.stats_end = ce_stats_;
  r.written = std::move(c->written);
  std::sort(r.written.begin(), r.written.end());
  r.written.erase(std::unique(r.written.begin(), r.written.end()), r.written.end());
  // the recorded ops have not run: the host-side state is as at capture_begin
  ce_ = c->ce;
  ce_stats_ = c->stats;
  std::string reason;
  if (!c->failure.empty()) {
    reason = cat("an op failed while recording: ", c->failure);
  } else if (end != cudaSuccess || !graph) {
    reason = cat("the stream capture failed (", cudaGetErrorName(end), ": ",
                 cudaGetErrorString(end),
                 "): an op synchronised, read back or called what a capture forbids");
  } else if (memory_generation() != c->generation || cudnn_builds() != c->builds) {
    reason = "a scratch buffer grew or a cuDNN graph was built while recording";
  } else {
    const cudaError_t e = cudaGraphInstantiate(&r.exec, graph, 0);
    if (e != cudaSuccess) {
      cudaGetLastError();
      r.exec = nullptr;
      reason = cat("cudaGraphInstantiate: ", cudaGetErrorName(e), " (", cudaGetErrorString(e), ")");
    }
  }
  if (graph) cudaGraphDestroy(graph);
  if (!reason.empty()) {
    if (why) *why = reason;
    return nullptr;  // c->rec frees the table
  }
  r.generation = c->generation;
  if (why) why->clear();
  return std::move(c->rec);
}

void CudaBackend::replay(Recording& recording, const uint64_t* values, size_t n) {
  auto* r = dynamic_cast<CudaRecording*>(&recording);
  if (!r || r->owner != this || !r->exec)
    throw Error("cuda backend: replay: not a recording of this backend");
  if (cap_) throw Error("cuda backend: replay while recording");
  if (n != r->slots)
    throw Error(cat("cuda backend: replay: ", n, " value(s) for a recording of ", r->slots,
                    " slot(s)"));
  if (memory_generation() != r->generation)
    throw Error("cuda backend: replay: a scratch buffer was reallocated since the recording was "
                "made (the recorded kernels would use freed memory): record it again");
  // the previous replay's copy must have read the staging buffer before it is overwritten
  if (r->launched) ck(cudaEventSynchronize(r->copied), "replay (staging)");
  if (n) std::memcpy(r->staging, values, n * sizeof(uint64_t));
  if (r->has_ce && !ce_.armed)
    ck(cudaMemsetAsync(static_cast<char*>(small_) + 64, 0x7f, sizeof(int), stream_),
       "replay (crossentropy flag)");
  if (n)
    ck(cudaMemcpyAsync(r->table, r->staging, n * sizeof(uint64_t), cudaMemcpyHostToDevice,
                       stream_),
       "replay (values)");
  ck(cudaEventRecord(r->copied, stream_), "replay (event)");
  r->launched = true;
  const cudaError_t e = cudaGraphLaunch(r->exec, stream_);
  const cudaError_t d = cudaEventRecord(r->done, stream_);
  op(e, "replay");
  ck(d, "replay (event)");
  // the host-side state the recorded ops leave, applied to the present one
  if (r->has_ce) ce_ = r->ce_flag;
  if (r->stats_set) {
    ce_stats_.logits = r->stats_end.logits;
    ce_stats_.M = r->stats_end.M;
    ce_stats_.V = r->stats_end.V;
  } else if (ce_stats_.logits &&
             std::binary_search(r->written.begin(), r->written.end(), ce_stats_.logits)) {
    ce_stats_.logits = nullptr;
  }
}

// Reallocations of every grow-only buffer a recorded kernel may point into.
size_t CudaBackend::memory_generation() const {
  return grows_ + ws_.grows() + gemm_->grows() + (fused_ ? size_t(fused_->grows()) : 0);
}

// Throws (noting the failure for capture_end) when recording: `what` would synchronise,
// allocate, read back or grow a buffer the recording points into.
void CudaBackend::no_capture(const char* what) {
  if (!cap_) return;
  std::string m = cat("cuda backend: ", what, " while recording a CUDA graph (ops between "
                      "capture_begin and capture_end must not synchronise, allocate, read back "
                      "or need more scratch than an eager pass before)");
  if (cap_->failure.empty()) cap_->failure = m;
  throw Error(m);
}

}  // namespace nlp::cuda
