// The CUDA backend (cuda_backend_impl.h: the class, and which file defines which of its members):
// construction and the environment switches it reads, details(), profiling and path counts, the
// check every launch goes through (op), and the factory (cuda_backend.h).
#include "backend/cuda/cuda_backend_impl.h"

#include <cuda_runtime_api.h>

#include <climits>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "backend/cuda/device.h"

namespace nlp::cuda {

void ck(cudaError_t e, const char* what) {
  if (e != cudaSuccess) {
    cudaGetLastError();  // clear a non-sticky error so that later calls report their own
    throw Error(cat("cuda backend: ", what, ": ", cudaGetErrorName(e), " (", cudaGetErrorString(e),
                    ")"));
  }
}

namespace {

// An environment switch of two values: true when `name` is unset or `first`, false when `second`;
// any other value is refused, naming the variable and both values.
bool env_first(const char* name, const char* first, const char* second) {
  const char* v = std::getenv(name);
  if (!v || std::string(v) == first) return true;
  if (std::string(v) == second) return false;
  throw Error(cat(name, " = '", v, "': expected ", first, " or ", second));
}

}  // namespace

// NLPTRAIN_CUDA_FUSED_LN: unset or 1 = the fused residual/layer-norm kernels, 0 = Backend's
// default sequence of separate ops (the path every earlier GPU run verified).
bool fused_layernorm_from_env() {
  const char* v = std::getenv("NLPTRAIN_CUDA_FUSED_LN");
  if (!v || std::string(v) == "1") return true;
  if (std::string(v) == "0") return false;
  throw Error(cat("NLPTRAIN_CUDA_FUSED_LN = '", v, "': expected 0 or 1"));
}

// NLPTRAIN_CUDA_BF16_CAST (cuda::Bf16Operands): unset or "vector" = the bf16 GEMM operands rounded 8
// elements a thread with 16-byte accesses; "scalar" = one element a thread (the kernel every earlier
// GPU run verified; it reached about 0.5 TB/s, and its casts were 39% of a packed BERT-base step's
// GPU time on an H200); both round each element the same way.
Bf16Operands bf16_operands_from_env() {
  return env_first("NLPTRAIN_CUDA_BF16_CAST", "vector", "scalar") ? Bf16Operands::Vector
                                                                 : Bf16Operands::Scalar;
}

// NLPTRAIN_CUDA_SEGMENT_CE: unset or "kernel" = segment cross-entropy in one launch over every
// segment; "rows" = the row op once per segment (the packed qa path every earlier GPU run verified),
// its offsets and lengths first copied to the host (a synchronisation per call).
bool segment_ce_rows_from_env() {
  return !env_first("NLPTRAIN_CUDA_SEGMENT_CE", "kernel", "rows");
}

// NLPTRAIN_CUDA_BF16_ACTS: unset or "native" = bf16 activation views go to the ops' native bf16
// kernels where they have them; "staged" = always through the fp32 ops, the views widened and
// rounded around them (CudaBackend::Stage). Neither has run on a GPU yet.
bool native_bf16_acts_from_env() {
  return env_first("NLPTRAIN_CUDA_BF16_ACTS", "native", "staged");
}

namespace {

// NLPTRAIN_CUDA_HEAD_DLOGITS (the fused LM head in bf16 precision): unset or "bf16" = the loss kernel
// writes the dlogits as bf16 (kern::lm_head_crossentropy_bf16) and the backward GEMMs read them as
// their operand; "fp32" = the dlogits written in fp32 over the logits, then cast to bf16 by the GEMM
// (the path built first). Both give the GEMMs the same bf16 operand; neither has run on a GPU yet.
// fp32 and tf32 precision always keep fp32 dlogits.
bool head_dlogits_bf16_from_env() {
  return env_first("NLPTRAIN_CUDA_HEAD_DLOGITS", "bf16", "fp32");
}

// NLPTRAIN_CUDA_HEAD_SOFTMAX (the fused LM head's loss kernel): unset or "online" = each row's max
// and sum of exp in one pass (kern::lm_head_crossentropy's online form); "twopass" = the max, then
// the sum (the kernel built first). Neither has run on a GPU yet.
bool head_softmax_online_from_env() {
  return env_first("NLPTRAIN_CUDA_HEAD_SOFTMAX", "online", "twopass");
}

// NLPTRAIN_CUDA_HEAD_WTE (the fused LM head in bf16 precision): unset or "bf16" = the head's GEMMs
// read wte as bf16: with the padded vocabulary one padded bf16 copy in a buffer of its own, made
// from the persistent bf16 copy (run.bf16_weights) once each time wte is written (so once per
// optimizer step, whatever train.grad_accum) or, without that copy, rounded from wte at every call;
// unpadded, the persistent copy itself; "fp32" = the fp32 padded copy, rounded by every GEMM that reads it (the path built
// first). fp32 and tf32 precision always read the fp32 weights.
bool head_wte_bf16_from_env() {
  return env_first("NLPTRAIN_CUDA_HEAD_WTE", "bf16", "fp32");
}

const char* bf16_operands_name(cuda::Bf16Operands o) {
  switch (o) {
    case cuda::Bf16Operands::Vector: return "vector";
    case cuda::Bf16Operands::Scalar: return "scalar (NLPTRAIN_CUDA_BF16_CAST)";
  }
  return "?";
}

}  // namespace

CudaBackend::CudaBackend(int device, const BackendOptions& options)
    : device_(device), sync_check_(options.sync_check),
      wcopy_on_(options.bf16_weights && options.precision == Precision::Bf16),
      bf16_prec_(options.precision == Precision::Bf16),
      head_dl16_(head_dlogits_bf16_from_env() && bf16_prec_),
      head_w16_(head_wte_bf16_from_env() && bf16_prec_),
      head_online_(head_softmax_online_from_env()) {
  ck(cudaSetDevice(device_), "cudaSetDevice");
  ck(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "cudaStreamCreate");
  // Keep freed pool memory cached in the pool instead of returning it to the driver at syncs.
  cudaMemPool_t pool = nullptr;
  ck(cudaDeviceGetDefaultMemPool(&pool, device_), "cudaDeviceGetDefaultMemPool");
  uint64_t threshold = UINT64_MAX;
  ck(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &threshold),
     "cudaMemPoolSetAttribute");
  gemm_ = std::make_unique<cuda::Gemm>(stream_, options.precision, bf16_operands_);
  gemm_->set_after_cast([this] {
    if (prof_) prof_->mark(cast_label_);
  });
  if (options.fused_attention) fused_ = std::make_unique<cuda::CudnnAttention>(stream_);
  ck(cudaMalloc(&small_, 256), "cudaMalloc(small)");
  ck(cudaMallocHost(&host_small_, 256), "cudaMallocHost");
}

CudaBackend::~CudaBackend() {
  if (cap_) {  // a recording abandoned without capture_end
    cudaGraph_t g = nullptr;
    cudaStreamEndCapture(stream_, &g);
    if (g) cudaGraphDestroy(g);
    cap_.reset();
    cudaGetLastError();
  }
  cudaStreamSynchronize(stream_);
  fused_.reset();
  gemm_.reset();
  if (wcopy_) cudaFreeAsync(wcopy_, stream_);
  if (hw_.p) cudaFreeAsync(hw_.p, stream_);
  ws_.free_async(stream_);
  if (span_start_) cudaFreeAsync(span_start_, stream_);
  if (ce_stats_.se) cudaFreeAsync(ce_stats_.se, stream_);
  for (auto& b : stage_)
    if (b.first) cudaFreeAsync(b.first, stream_);
  cudaStreamSynchronize(stream_);
  if (small_) cudaFree(small_);
  if (host_small_) cudaFreeHost(host_small_);
  cudaStreamDestroy(stream_);
}

std::string CudaBackend::details() const {
  return cat("GPU ", device_, " | residual + layer norm: ",
             fused_ln_ ? "fused kernels" : "separate ops (NLPTRAIN_CUDA_FUSED_LN=0)",
             " | bf16 operand casts: ", bf16_operands_name(bf16_operands_),
             " | bf16 activations: ", native_bf16_acts_ ? "native kernels where an op has them"
                                                         : "staged (NLPTRAIN_CUDA_BF16_ACTS)",
             wcopy_on_ ? " | weights: persistent bf16 copy (run.bf16_weights)" : "",
             " | fused head dlogits: ",
             head_dl16_ ? "bf16" : (bf16_prec_ ? "fp32 (NLPTRAIN_CUDA_HEAD_DLOGITS)" : "fp32"),
             ", wte: ", head_w16_ ? "bf16" : (bf16_prec_ ? "fp32 (NLPTRAIN_CUDA_HEAD_WTE)" : "fp32"),
             ", softmax: ", head_online_ ? "online" : "two passes (NLPTRAIN_CUDA_HEAD_SOFTMAX)",
             head_w16_ ? cat(", padded bf16 wte copies made: ", head_wte_builds_) : std::string());
}

// What ran (core/path_counts.h): the GEMM's epilogue counts and conversions plus this backend's
// staged ops and conversions (staging, copy_view, the persistent copy, the fused head's wte).
bool CudaBackend::path_counts(PathCounts* out) const {
  if (!out) return true;
  PathCounts c;
  c.gemm_fused = gemm_->fused_by_kind();
  c.gemm_fallback = gemm_->fallback_by_kind();
  c.staged_ops = staged_ops_;
  c.fp32_to_bf16 = to16_ + gemm_->casts_to_bf16();
  c.bf16_to_fp32 = to32_ + gemm_->casts_to_fp32();
  *out = c;
  return true;
}

void CudaBackend::synchronize() {
  no_capture("synchronize");
  ck(cudaStreamSynchronize(stream_), "synchronize");
  ck(cudaGetLastError(), "synchronize (last error)");
  after_sync();
}

void CudaBackend::set_profiling(bool on) {
  no_capture("set_profiling");
  if (on && !prof_) {
    synchronize();
    prof_ = std::make_unique<cuda::OpProfile>(stream_);
    prof_->mark("(start)");
  } else if (!on) {
    prof_.reset();
  }
}

// run.profile's account (backend/op_account.h): ops are marked under the label, the GEMMs' bf16
// operand casts under "cast: <label>" (labels interned: the profile keeps their pointers; looked up
// by the caller's pointer first, so that a label costs the host no string work after its first op).
void CudaBackend::profile_label(const char* label) {
  if (!label) {
    label_ = nullptr;
    cast_label_ = "cast: bf16 operands";
    return;
  }
  auto it = label_ptrs_.find(label);
  if (it == label_ptrs_.end() || std::strcmp(it->second.first, label) != 0) {
    const char* l = labels_.insert(label).first->c_str();
    const char* c = labels_.insert(cat("cast: ", label)).first->c_str();
    it = label_ptrs_.insert_or_assign(label, std::make_pair(l, c)).first;
  }
  label_ = it->second.first;
  cast_label_ = it->second.second;
}

std::vector<Backend::ProfileTime> CudaBackend::profile_times() {
  std::vector<ProfileTime> v;
  if (prof_)
    for (const auto& [k, t] : prof_->times()) v.push_back(ProfileTime{k, t.first, t.second});
  return v;
}

// Checks an op's launch; with run.sync_check also waits for it, so an asynchronous fault (an
// illegal address, a misaligned access) is reported under the op that caused it.
// With run.profile, also marks the op's end for the per-op timing.
void CudaBackend::op(cudaError_t e, const char* what) {
  if (e != cudaSuccess && cap_ && cap_->failure.empty())
    cap_->failure = cat(what, ": ", cudaGetErrorName(e));
  ck(e, what);
  if (prof_) prof_->mark(label_ ? label_ : what);
  if (sync_check_) {
    ck(cudaStreamSynchronize(stream_), what);
    ck(cudaGetLastError(), what);
  }
}

void CudaBackend::gemm(const char* what, float* Y, const float* X, bool trans_x, const float* Z,
                       bool trans_z, int M, int P, int Q, float beta, const float* bias,
                       const void* z16) {
  noted([&] { gemm_->run(Y, X, trans_x, Z, trans_z, M, P, Q, beta, bias, z16); });
  op(cudaSuccess, what);
}

}  // namespace nlp::cuda

namespace nlp {

std::unique_ptr<Backend> make_cuda_backend(int local_rank, const BackendOptions& options) {
  std::string why;
  const int n = cuda_device_count(&why);
  if (n == 0) throw Error(cat("run.backend=cuda: no usable CUDA device: ", why));
  if (local_rank < 0 || local_rank >= n)
    throw Error(cat("run.backend=cuda: local rank ", local_rank, " has no GPU (", n,
                    " device(s) on this node); use at most one rank per GPU"));
  std::string no_cudnn;
  if (options.fused_attention && !cuda::cudnn_attention_compiled(&no_cudnn))
    throw Error(cat("model.attention = cudnn: nlptrain was built without the cuDNN frontend (",
                    no_cudnn, "); use model.attention = native, or pip install "
                    "nvidia-cudnn-frontend and rebuild"));
  return std::make_unique<cuda::CudaBackend>(local_rank, options);
}

bool cuda_fused_attention_available(std::string* why) { return cuda::cudnn_attention_compiled(why); }

CudnnPackedCalls cuda_cudnn_packed_calls() {
  CudnnPackedCalls c;
  cuda::cudnn_packed_calls(&c.ragged, &c.bias);
  return c;
}

void* cuda_backend_stream(Backend& be) {
  auto* c = dynamic_cast<cuda::CudaBackend*>(&be);
  return c ? static_cast<void*>(c->stream()) : nullptr;
}

}  // namespace nlp
