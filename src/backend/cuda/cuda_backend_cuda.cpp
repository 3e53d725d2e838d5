// The CUDA backend class: device memory (stream-ordered pool allocations, zeroed), one stream per
// backend on which every op is enqueued in call order, GEMMs through cuBLASLt (gemm.h) and the
// hand-written kernels of kernels/*.cu (kernels.cuh), attention optionally through cuDNN's fused SDPA
// (attention_cudnn.h). fp32 throughout but for that attention; no float atomics, so every op
// is deterministic run to run. Host <-> device copies synchronise the stream, so a host buffer may
// be reused as soon as to_device returns and is valid as soon as to_host returns.
// Replayed micro-batches (core/backend.h): the ops between capture_begin and capture_end are
// recorded into a CUDA graph (stream capture) instead of running; a replay copies the per-launch
// values (seeds, dloss) into the recording's device table, which the recorded kernels read.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "kernels.cuh"  // kernels/ (an include directory of CUDA builds)
#include "backend/cuda/attention_cudnn.h"
#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/device.h"
#include "backend/cuda/device_workspace.h"
#include "backend/cuda/gemm.h"
#include "backend/cuda/op_profile.h"
#include "core/error.h"

namespace nlp {
namespace {

void ck(cudaError_t e, const char* what) {
  if (e != cudaSuccess) {
    cudaGetLastError();  // clear a non-sticky error so that later calls report their own
    throw Error(cat("cuda backend: ", what, ": ", cudaGetErrorName(e), " (", cudaGetErrorString(e),
                    ")"));
  }
}

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
cuda::Bf16Operands bf16_operands_from_env() {
  const char* v = std::getenv("NLPTRAIN_CUDA_BF16_CAST");
  if (!v || std::string(v) == "vector") return cuda::Bf16Operands::Vector;
  if (std::string(v) == "scalar") return cuda::Bf16Operands::Scalar;
  throw Error(cat("NLPTRAIN_CUDA_BF16_CAST = '", v, "': expected vector or scalar"));
}

// NLPTRAIN_CUDA_SEGMENT_CE: unset or "kernel" = segment cross-entropy in one launch over every
// segment; "rows" = the row op once per segment (the packed qa path every earlier GPU run verified),
// its offsets and lengths first copied to the host (a synchronisation per call).
bool segment_ce_rows_from_env() {
  const char* v = std::getenv("NLPTRAIN_CUDA_SEGMENT_CE");
  if (!v || std::string(v) == "kernel") return false;
  if (std::string(v) == "rows") return true;
  throw Error(cat("NLPTRAIN_CUDA_SEGMENT_CE = '", v, "': expected kernel or rows"));
}

// NLPTRAIN_CUDA_BF16_ACTS: unset or "native" = bf16 activation views go to the ops' native bf16
// kernels where they have them; "staged" = always through the fp32 ops, the views widened and
// rounded around them (CudaBackend::Stage). Neither has run on a GPU yet.
bool native_bf16_acts_from_env() {
  const char* v = std::getenv("NLPTRAIN_CUDA_BF16_ACTS");
  if (!v || std::string(v) == "native") return true;
  if (std::string(v) == "staged") return false;
  throw Error(cat("NLPTRAIN_CUDA_BF16_ACTS = '", v, "': expected native or staged"));
}

// NLPTRAIN_CUDA_HEAD_DLOGITS (the fused LM head in bf16 precision): unset or "bf16" = the loss kernel
// writes the dlogits as bf16 (kern::lm_head_crossentropy_bf16) and the backward GEMMs read them as
// their operand; "fp32" = the dlogits written in fp32 over the logits, then cast to bf16 by the GEMM
// (the path built first). Both give the GEMMs the same bf16 operand; neither has run on a GPU yet.
// fp32 and tf32 precision always keep fp32 dlogits.
bool head_dlogits_bf16_from_env() {
  const char* v = std::getenv("NLPTRAIN_CUDA_HEAD_DLOGITS");
  if (!v || std::string(v) == "bf16") return true;
  if (std::string(v) == "fp32") return false;
  throw Error(cat("NLPTRAIN_CUDA_HEAD_DLOGITS = '", v, "': expected bf16 or fp32"));
}

// NLPTRAIN_CUDA_HEAD_SOFTMAX (the fused LM head's loss kernel): unset or "online" = each row's max
// and sum of exp in one pass (kern::lm_head_crossentropy's online form); "twopass" = the max, then
// the sum (the kernel built first). Neither has run on a GPU yet.
bool head_softmax_online_from_env() {
  const char* v = std::getenv("NLPTRAIN_CUDA_HEAD_SOFTMAX");
  if (!v || std::string(v) == "online") return true;
  if (std::string(v) == "twopass") return false;
  throw Error(cat("NLPTRAIN_CUDA_HEAD_SOFTMAX = '", v, "': expected online or twopass"));
}

// NLPTRAIN_CUDA_HEAD_WTE (the fused LM head in bf16 precision): unset or "bf16" = the head's GEMMs
// read wte as bf16: with the padded vocabulary one padded bf16 copy in a buffer of its own, made
// from the persistent bf16 copy (run.bf16_weights) once each time wte is written (so once per
// optimizer step, whatever train.grad_accum) or, without that copy, rounded from wte at every call;
// unpadded, the persistent copy itself; "fp32" = the fp32 padded copy, rounded by every GEMM that reads it (the path built
// first). fp32 and tf32 precision always read the fp32 weights.
bool head_wte_bf16_from_env() {
  const char* v = std::getenv("NLPTRAIN_CUDA_HEAD_WTE");
  if (!v || std::string(v) == "bf16") return true;
  if (std::string(v) == "fp32") return false;
  throw Error(cat("NLPTRAIN_CUDA_HEAD_WTE = '", v, "': expected bf16 or fp32"));
}

const char* bf16_operands_name(cuda::Bf16Operands o) {
  switch (o) {
    case cuda::Bf16Operands::Vector: return "vector";
    case cuda::Bf16Operands::Scalar: return "scalar (NLPTRAIN_CUDA_BF16_CAST)";
  }
  return "?";
}

// Row statistics of the last crossentropy_forward (CudaBackend::ce_stats_), and the pending
// cross-entropy target check (CudaBackend::ce_).
struct CeStats {
  const void* logits = nullptr;
  int M = 0, V = 0;
  float* mx = nullptr;
  double* se = nullptr;
  int cap = 0;
};
struct CeFlag {
  bool armed = false;  // a flag is pending (set since the last check)
  const int32_t* targets = nullptr;
  int M = 0, V = 0;
};

// A recorded micro-batch (Backend::Recording): the instantiated CUDA graph, its value table (device,
// `slots` words, read by the recorded kernels through their seed/dloss slots) and the pinned staging
// copy a replay fills, and what the recorded ops do to the backend's host-side state.
class CudaRecording final : public Backend::Recording {
 public:
  CudaRecording(const void* owner, size_t slots) : owner(owner), slots(slots) {}
  ~CudaRecording() override {
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
  CudaRecording(const CudaRecording&) = delete;
  CudaRecording& operator=(const CudaRecording&) = delete;

  const void* owner;  // the backend that recorded it (replayed only there)
  size_t slots;
  uint64_t* table = nullptr;    // device [max(slots, 1)]
  uint64_t* staging = nullptr;  // pinned host [max(slots, 1)]
  cudaEvent_t copied = nullptr;  // recorded after the last replay's table copy (staging reusable)
  cudaEvent_t done = nullptr;    // recorded after the last launch
  bool launched = false;
  cudaGraphExec_t exec = nullptr;
  size_t generation = 0;  // CudaBackend::memory_generation() when recorded
  // Cross-entropy state after the recorded ops: has_ce = they check targets (ce_flag: the last
  // op's); stats_set = they ran crossentropy_forward (stats_end: its identity after the rest),
  // else `written` lists the buffers they wrote (each forgets stats kept for it).
  bool has_ce = false;
  CeFlag ce_flag;
  bool stats_set = false;
  CeStats stats_end;
  std::vector<const void*> written;
};

class CudaBackend final : public Backend {
 public:
  CudaBackend(int device, const BackendOptions& options)
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

  ~CudaBackend() override {
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

  std::string name() const override { return "cuda"; }
  std::string details() const override {
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
  cudaStream_t stream() const { return stream_; }
  // bf16 activation views: the native bf16 kernels (true) or the staged fp32 ops (the ops on views)
  bool native_bf16() const { return native_bf16_acts_; }

  // ---- memory ----
  void* alloc(size_t bytes) override {
    no_capture("alloc");
    const size_t n = bytes ? bytes : 256;
    void* p = nullptr;
    cudaError_t e = cudaMallocAsync(&p, n, stream_);
    if (e != cudaSuccess) {
      cudaGetLastError();
      size_t free_b = 0, total_b = 0;
      cudaMemGetInfo(&free_b, &total_b);
      throw Error(cat("cuda backend: out of device memory allocating ", bytes, " bytes on GPU ",
                      device_, " (", free_b >> 20, " MiB free of ", total_b >> 20,
                      " MiB): lower train.batch_size or data.seq_len (", cudaGetErrorString(e), ")"));
    }
    ck(cudaMemsetAsync(p, 0, n, stream_), "cudaMemsetAsync(alloc)");
    return p;
  }
  void release(void* p) override {
    no_capture("release");
    if (p) ck(cudaFreeAsync(p, stream_), "cudaFreeAsync");
  }
  void zero(void* p, size_t bytes) override {
    forget_ce_stats(p);
    if (bytes) op(cudaMemsetAsync(p, 0, bytes, stream_), "zero");
    weights_written(static_cast<const float*>(p), bytes / sizeof(float));
  }
  void to_device(void* dst, const void* host_src, size_t bytes) override {
    no_capture("to_device");
    forget_ce_stats(dst);
    if (!bytes) return;
    op(cudaMemcpyAsync(dst, host_src, bytes, cudaMemcpyHostToDevice, stream_), "to_device");
    weights_written(static_cast<const float*>(dst), bytes / sizeof(float));
    ck(cudaStreamSynchronize(stream_), "to_device (synchronize)");
    after_sync();
  }
  void* host_alloc(size_t bytes) override {
    no_capture("host_alloc");
    void* p = nullptr;
    ck(cudaMallocHost(&p, bytes), "cudaMallocHost (staging buffer)");
    return p;
  }
  void host_release(void* p) override {
    no_capture("host_release");
    if (p) cudaFreeHost(p);
  }
  void to_host(void* host_dst, const void* src, size_t bytes) override {
    no_capture("to_host");
    if (!bytes) return;
    op(cudaMemcpyAsync(host_dst, src, bytes, cudaMemcpyDeviceToHost, stream_), "to_host");
    ck(cudaStreamSynchronize(stream_), "to_host (synchronize)");
    after_sync();
  }
  void copy(void* dst, const void* src, size_t bytes) override {
    forget_ce_stats(dst);
    if (bytes && dst != src)
      op(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, stream_), "copy");
    if (dst != src) weights_written(static_cast<const float*>(dst), bytes / sizeof(float));
  }

  // ---- the persistent bf16 copy of the weights (core/backend.h) ----
  void register_weights(const float* arena, size_t n) override {
    if (!wcopy_on_ || (n == 0 && arena != warena_)) return;
    no_capture("register_weights");
    if (wcopy_) release(wcopy_);
    wcopy_ = nullptr;
    warena_ = nullptr;
    wn_ = 0;
    hw_.w = nullptr;  // the head's padded copy was made from the old copy
    if (n == 0) return;
    wcopy_ = static_cast<uint16_t*>(alloc(std::max<size_t>(n, 1) * sizeof(uint16_t)));
    warena_ = arena;
    wn_ = n;
    weights_written(arena, n);
  }
  // Rounds the part of [p, p + n) inside the arena again (kern::to_bf16: round to nearest even, the
  // rounding of the GEMM's operand casts and of the AdamW kernel).
  void weights_written(const float* p, size_t n) override {
    if (!warena_ || !n || p + n <= warena_ || p >= warena_ + wn_) return;
    forget_head_wte(p, n);
    const size_t lo = p > warena_ ? size_t(p - warena_) : 0;
    const size_t hi = std::min(wn_, size_t(p + n - warena_));
    op(kern::to_bf16(wcopy_ + lo, warena_ + lo, hi - lo, stream_), "cast: weights (bf16 copy)");
    ++to16_;
  }
  const uint16_t* bf16_weights() const override { return warena_ ? wcopy_ : nullptr; }
  // What ran (core/path_counts.h): the GEMM's epilogue counts and conversions plus this backend's
  // staged ops and conversions (staging, copy_view, the persistent copy, the fused head's wte).
  bool path_counts(PathCounts* out) const override {
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
  void synchronize() override {
    no_capture("synchronize");
    ck(cudaStreamSynchronize(stream_), "synchronize");
    ck(cudaGetLastError(), "synchronize (last error)");
    after_sync();
  }
  void set_profiling(bool on) override {
    no_capture("set_profiling");
    if (on && !prof_) {
      synchronize();
      prof_ = std::make_unique<cuda::OpProfile>(stream_);
      prof_->mark("(start)");
    } else if (!on) {
      prof_.reset();
    }
  }
  std::string profile_report() override { return prof_ ? prof_->report() : std::string(); }
  // run.profile's account (backend/op_account.h): ops are marked under the label, the GEMMs' bf16
  // operand casts under "cast: <label>" (labels interned: the profile keeps their pointers; looked up
  // by the caller's pointer first, so that a label costs the host no string work after its first op).
  void profile_label(const char* label) override {
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
  std::vector<ProfileTime> profile_times() override {
    std::vector<ProfileTime> v;
    if (prof_)
      for (const auto& [k, t] : prof_->times()) v.push_back(ProfileTime{k, t.first, t.second});
    return v;
  }

  // ---- the ops on typed views (core/tensor.h) ----
  // fp32 views run the fp32 ops further down (the GPU-verified path) on their own memory; an fp32
  // gradient marked overwrite is zeroed first and then accumulated into. Any bf16 view: the native
  // bf16 kernels where an op has them and NLPTRAIN_CUDA_BF16_ACTS is native (the default), else
  // staged: each bf16 input widened into an fp32 staging buffer, the fp32 op run, and each bf16
  // output rounded back (kern::to_bf16, round to nearest even), so the tensor is stored in bf16 at
  // the points the CPU backend rounds (cpu/staged.h). Neither bf16 way has run on a GPU yet.
  // Native: kernels/bf16_*.cu (kernels.cuh, "bf16 storage"), used when every non-null view of the op
  // is bf16 (native_bf16_views); a gradient's overwrite flag becomes the launcher's accumulate = false.
  // An fp32 gradient view as the fp32 ops take it (they accumulate): zeroed first when the view
  // says overwrite.
  float* acc_f32(Act v, size_t n) {
    if (v.write && v.p) zero(v.p, n * sizeof(float));
    return v.fp();
  }
  bool native_bf16_views(std::initializer_list<CAct> views) const {
    if (!native_bf16()) return false;
    for (const CAct& v : views)
      if (v.p && v.dt != DType::BF16) return false;
    return true;
  }
  void embedding_forward(Act out, const int32_t* ids, const int32_t* type_ids, const float* wte,
                         const float* wpe, const float* wtt, int B, int T, int C, int pos_offset,
                         const int32_t* pos_ids) override {
    if (out.f32())
      return embedding_forward_f32(out.fp(), ids, type_ids, wte, wpe, wtt, B, T, C, pos_offset, pos_ids);
    if (native_bf16_views({out})) {
      forget_ce_stats(out.p);
      op(kern::embedding_forward_bf16(out.p, ids, type_ids, wte, wpe, wtt, B, T, C, pos_offset,
                                      pos_ids, stream_),
         "embedding_forward (bf16)");
      return;
    }
    Stage st(*this, "embedding_forward (staged)");
    embedding_forward_f32(st.out(out, size_t(B) * T * C), ids, type_ids, wte, wpe, wtt, B, T, C,
                          pos_offset, pos_ids);
    st.finish();
  }
  void embedding_backward(float* dwte, float* dwpe, float* dwtt, CAct dout, const int32_t* ids,
                          const int32_t* type_ids, int B, int T, int C, int pos_offset,
                          const int32_t* pos_ids) override {
    if (dout.f32())
      return embedding_backward_f32(dwte, dwpe, dwtt, dout.fp(), ids, type_ids, B, T, C, pos_offset,
                                    pos_ids);
    if (native_bf16_views({dout})) {
      const size_t need = kern::embedding_backward_bf16_ws_bytes(B * T, C);
      void* ws = workspace(need);
      op(kern::embedding_backward_bf16(dwte, dwpe, dwtt, dout.p, ids, type_ids, B, T, C, pos_offset,
                                       pos_ids, ws, need, stream_),
         "embedding_backward (bf16)");
      return;
    }
    Stage st(*this, "embedding_backward (staged)");
    embedding_backward_f32(dwte, dwpe, dwtt, st.in(dout, size_t(B) * T * C), ids, type_ids, B, T, C,
                           pos_offset, pos_ids);
  }
  void matmul_forward(Act out, CAct inp, const float* w, const float* bias, int M, int K, int N,
                      WLayout layout) override {
    if (out.f32() && inp.f32()) return matmul_forward_f32(out.fp(), inp.fp(), w, bias, M, K, N, layout);
    if (native_bf16() && M > 0 && N > 0 && K > 0) {
      // native: the typed GEMM reads inp and writes out as stored (cuda::Gemm::forward)
      forget_ce_stats(out.p);
      noted([&] {
        gemm_->forward(cuda::gemm_out(out), cuda::gemm_in(inp), false, w, layout == WLayout::OutIn,
                       M, N, K, 0.0f, bias, persistent(w, size_t(K) * N), nullptr,
                       bias ? persistent(bias, size_t(N)) : nullptr);
      });
      return op(cudaSuccess, "matmul_forward (bf16)");
    }
    Stage st(*this, "matmul_forward (staged)");
    const float* i = st.in(inp, size_t(M) * K);
    matmul_forward_f32(st.out(out, size_t(M) * N), i, w, bias, M, K, N, layout);
    st.finish();
  }
  void matmul_backward(Act dinp, float* dw, float* dbias, CAct dout, CAct inp, const float* w, int M,
                       int K, int N, WLayout layout) override {
    if (dinp.f32() && dout.f32() && inp.f32())
      return matmul_backward_f32(acc_f32(dinp, size_t(M) * K), dw, dbias, dout.fp(), inp.fp(), w, M, K,
                                 N, layout);
    if (native_bf16() && M > 0 && N > 0 && K > 0) {
      // native: the typed GEMM reads dout and inp as stored, writes (overwrite) or accumulates
      // dinp in its type, and adds dout's column sums to dbias (cuda::Gemm::backward)
      const void* w16 = dinp ? persistent(w, size_t(K) * N) : nullptr;
      noted([&] {
        gemm_->backward(cuda::gemm_out(dinp), dinp.write ? 0.0f : 1.0f, dw, dbias,
                        cuda::gemm_in(dout), cuda::gemm_in(inp), w, M, K, N,
                        layout == WLayout::InOut, w16);
      });
      return op(cudaSuccess, "matmul_backward (bf16)");
    }
    Stage st(*this, "matmul_backward (staged)");
    const float* d = st.in(dout, size_t(M) * N);
    const float* i = dw ? st.in(inp, size_t(M) * K) : nullptr;
    matmul_backward_f32(st.acc(dinp, size_t(M) * K), dw, dbias, d, i, w, M, K, N, layout);
    st.finish();
  }
  // The dense layer with its GELU (core/backend.h). All views bf16 with the native kernels, the tanh
  // form and the cuBLASLt epilogue switched on (NLPTRAIN_CUDA_GEMM_EPILOGUES = all): one typed GEMM
  // writes pre and out = gelu(pre) (GELU_AUX; cuda::Gemm falls back to the plain product and
  // kernels/gemm_epilogue.cu where no algorithm takes it). Anything else, the fp32 views included:
  // Backend's default, matmul_forward then gelu_forward. Not yet run on a GPU.
  void matmul_gelu_forward(Act out, Act pre, CAct inp, const float* w, const float* bias, int M,
                           int K, int N, WLayout layout, Gelu form) override {
    if (form == Gelu::Tanh && gemm_->epilogues().gelu_aux && native_bf16_views({out, pre, inp}) &&
        out && pre && M > 0 && N > 0 && K > 0) {
      forget_ce_stats(out.p);
      forget_ce_stats(pre.p);
      noted([&] {
        gemm_->forward(cuda::gemm_out(out), cuda::gemm_in(inp), false, w, layout == WLayout::OutIn,
                       M, N, K, 0.0f, bias, persistent(w, size_t(K) * N), pre.p,
                       bias ? persistent(bias, size_t(N)) : nullptr);
      });
      return op(cudaSuccess, "matmul_gelu_forward (bf16, GELU_AUX)");
    }
    Backend::matmul_gelu_forward(out, pre, inp, w, bias, M, K, N, layout, form);
  }
  // Its backward for the following dense layer: with the same conditions (DGELU switched on) and dpre
  // overwritten (the epilogue has no accumulating form), one typed backward GEMM writes
  // dpre = (dout @ W^T) * gelu'(pre) and adds dW and dbias; scratch is not used. Else the default.
  void matmul_dgelu_backward(Act dpre, float* dw, float* dbias, CAct dout, CAct h, CAct pre,
                             const float* w, int M, int K, int N, WLayout layout, Gelu form,
                             Act scratch) override {
    if (form == Gelu::Tanh && gemm_->epilogues().dgelu && dpre.write &&
        native_bf16_views({dpre, dout, h, pre}) && dpre && pre && M > 0 && N > 0 && K > 0) {
      forget_ce_stats(dpre.p);
      const void* w16 = persistent(w, size_t(K) * N);
      noted([&] {
        gemm_->backward(cuda::gemm_out(dpre), 0.0f, dw, dbias, cuda::gemm_in(dout),
                        cuda::gemm_in(h), w, M, K, N, layout == WLayout::InOut, w16, pre.p);
      });
      return op(cudaSuccess, "matmul_dgelu_backward (bf16, DGELU)");
    }
    Backend::matmul_dgelu_backward(dpre, dw, dbias, dout, h, pre, w, M, K, N, layout, form, scratch);
  }
  void layernorm_forward(Act out, float* mean, float* rstd, CAct inp, const float* w, const float* b,
                         int N, int C, float eps) override {
    if (out.f32() && inp.f32())
      return layernorm_forward_f32(out.fp(), mean, rstd, inp.fp(), w, b, N, C, eps);
    if (native_bf16_views({out, inp})) {
      forget_ce_stats(out.p);
      op(kern::layernorm_forward_bf16(out.p, mean, rstd, inp.p, w, b, N, C, eps, stream_),
         "layernorm_forward (bf16)");
      return;
    }
    Stage st(*this, "layernorm_forward (staged)");
    const float* i = st.in(inp, size_t(N) * C);
    layernorm_forward_f32(st.out(out, size_t(N) * C), mean, rstd, i, w, b, N, C, eps);
    st.finish();
  }
  void layernorm_backward(Act dinp, float* dw, float* db, CAct dout, CAct inp, const float* w,
                          const float* mean, const float* rstd, int N, int C) override {
    const size_t n = size_t(N) * C;
    if (dinp.f32() && dout.f32() && inp.f32()) {
      return layernorm_backward_f32(acc_f32(dinp, n), dw, db, dout.fp(), inp.fp(), w, mean, rstd, N, C);
    }
    if (native_bf16_views({dinp, dout, inp})) {
      void* ws = (dw || db) ? workspace(kern::layernorm_backward_bf16_ws_bytes(N, C)) : nullptr;
      op(kern::layernorm_backward_bf16(dinp.p, !dinp.write, dw, db, dout.p, inp.p, w, mean, rstd, N,
                                       C, ws, stream_),
         "layernorm_backward (bf16)");
      return;
    }
    Stage st(*this, "layernorm_backward (staged)");
    const float* d = st.in(dout, n);
    const float* i = st.in(inp, n);
    layernorm_backward_f32(st.acc(dinp, n), dw, db, d, i, w, mean, rstd, N, C);
    st.finish();
  }
  // bf16 res: res = x + dropout(delta) in fp32, stored rounded, and the norm of the stored (rounded)
  // value, as the CPU backend computes it: staged as the unfused fp32 dropout and add, the rounding
  // of res, then the layer norm of its bf16 view.
  void residual_layernorm_forward(Act res, Act out, float* mean, float* rstd, CAct x, CAct delta,
                                  const float* w, const float* b, int N, int C, float eps, float p,
                                  uint64_t seed, DropRows rows) override {
    const size_t n = size_t(N) * C;
    if (res.f32() && out.f32() && x.f32() && delta.f32())
      return residual_layernorm_forward_f32(res.fp(), out.fp(), mean, rstd, x.fp(), delta.fp(), w, b,
                                            N, C, eps, p, seed, rows);
    if (native_bf16_views({res, out, x, delta})) {  // one launch, the same rounding points
      forget_ce_stats(res.p);
      forget_ce_stats(out.p);
      op(kern::residual_layernorm_forward_bf16(res.p, out.p, mean, rstd, x.p, delta.p, w, b, N, C, eps,
                                               p, seed, slot_, rows.row, rows.row_key,
                                               rows.token_key, rows.width, stream_),
         "residual_layernorm_forward (bf16)");
      return;
    }
    {
      Stage st(*this, "residual_layernorm_forward (staged)");
      const float* xi = st.in(x, n);
      const float* di = st.in(delta, n);
      float* r = st.out(res, n);
      dropout_forward_f32(r, di, n, p, seed, rows);
      add_f32(r, r, xi, n);
      st.finish();
    }
    layernorm_forward(out, mean, rstd, res, w, b, N, C, eps);
  }
  void layernorm_dropout_backward(Act dinp, Act ddelta, Act scratch, float* dw, float* db, CAct dout,
                                  CAct inp, const float* w, const float* mean, const float* rstd, int N,
                                  int C, float p, uint64_t seed, DropRows rows) override {
    const size_t n = size_t(N) * C;
    if (dinp.f32() && ddelta.f32() && scratch.f32() && dout.f32() && inp.f32()) {
      return layernorm_dropout_backward_f32(acc_f32(dinp, n), ddelta.fp(), scratch.fp(), dw, db, dout.fp(),
                                            inp.fp(), w, mean, rstd, N, C, p, seed, rows);
    }
    // staged: the fp32 op keeps the layer norm's gradient in fp32 (as the CPU backend does); its
    // scratch is a staging buffer, the bf16 scratch view goes unused
    Stage st(*this, "layernorm_dropout_backward (staged)");
    const float* d = st.in(dout, n);
    const float* i = st.in(inp, n);
    float* g = st.acc(dinp, n);
    float* dd = st.out(ddelta, n);
    layernorm_dropout_backward_f32(g, dd, st.scratch(n), dw, db, d, i, w, mean, rstd, N, C, p, seed,
                                   rows);
    st.finish();
  }
  void gelu_forward(Act out, CAct inp, size_t N, Gelu form) override {
    if (out.f32() && inp.f32()) return gelu_forward_f32(out.fp(), inp.fp(), N, form);
    if (native_bf16_views({out, inp})) {
      forget_ce_stats(out.p);
      op(kern::gelu_forward_bf16(out.p, inp.p, N, form == Gelu::Tanh, stream_), "gelu_forward (bf16)");
      return;
    }
    Stage st(*this, "gelu_forward (staged)");
    const float* i = st.in(inp, N);
    gelu_forward_f32(st.out(out, N), i, N, form);
    st.finish();
  }
  void gelu_backward(Act dinp, CAct inp, CAct dout, size_t N, Gelu form) override {
    if (dinp.f32() && inp.f32() && dout.f32()) {
      return gelu_backward_f32(acc_f32(dinp, N), inp.fp(), dout.fp(), N, form);
    }
    if (native_bf16_views({dinp, inp, dout})) {
      forget_ce_stats(dinp.p);
      op(kern::gelu_backward_bf16(dinp.p, !dinp.write, inp.p, dout.p, N, form == Gelu::Tanh, stream_),
         "gelu_backward (bf16)");
      return;
    }
    Stage st(*this, "gelu_backward (staged)");
    const float* i = st.in(inp, N);
    const float* d = st.in(dout, N);
    gelu_backward_f32(st.acc(dinp, N), i, d, N, form);
    st.finish();
  }
  void add(Act out, CAct a, CAct b, size_t N) override {
    if (out.f32() && a.f32() && b.f32()) return add_f32(out.fp(), a.fp(), b.fp(), N);
    if (native_bf16_views({out, a, b})) {
      forget_ce_stats(out.p);
      op(kern::add_bf16(out.p, a.p, b.p, N, stream_), "add (bf16)");
      return;
    }
    Stage st(*this, "add (staged)");
    const float* ia = st.in(a, N);
    const float* ib = st.in(b, N);
    add_f32(st.out(out, N), ia, ib, N);
    st.finish();
  }
  void accumulate(Act dst, CAct src, size_t N) override {
    if (dst.f32() && src.f32()) return accumulate_f32(dst.fp(), src.fp(), N);
    if (native_bf16() && dst.p && src.p) {  // an accumulation whatever the flag, any mix of dtypes
      forget_ce_stats(dst.p);
      if (!dst.f32() && !src.f32())
        op(kern::accumulate_bf16_bf16(dst.p, src.p, N, stream_), "accumulate (bf16)");
      else if (!dst.f32())
        op(kern::accumulate_f32_into_bf16(dst.p, src.fp(), N, stream_), "accumulate (bf16 += fp32)");
      else
        op(kern::accumulate_bf16(dst.fp(), src.p, N, stream_), "accumulate (fp32 += bf16)");
      return;
    }
    Act d = dst;
    d.write = false;  // an accumulation whatever the flag
    Stage st(*this, "accumulate (staged)");
    const float* s = st.in(src, N);
    accumulate_f32(st.acc(d, N), s, N);
    st.finish();
  }
  void scale(Act x, float s, size_t N) override {
    if (x.f32()) return scale_f32(x.fp(), s, N);
    if (native_bf16_views({x})) {
      forget_ce_stats(x.p);
      op(kern::scale_bf16(x.p, s, N, stream_), "scale (bf16)");
      return;
    }
    Act d = x;
    d.write = false;
    Stage st(*this, "scale (staged)");
    scale_f32(st.acc(d, N), s, N);
    st.finish();
  }
  void copy_view(Act dst, CAct src, size_t N) override {
    if (dst.dt == src.dt) return copy(dst.p, src.p, N * dtype_bytes(dst.dt));
    forget_ce_stats(dst.p);
    if (dst.f32()) {
      op(kern::from_bf16(dst.fp(), src.p, N, stream_), "copy_view");
      ++to32_;
    } else {
      op(kern::to_bf16(dst.p, src.fp(), N, stream_), "copy_view");
      ++to16_;
    }
  }
  void tanh_forward(Act out, CAct inp, size_t N) override {
    if (out.f32() && inp.f32()) return tanh_forward_f32(out.fp(), inp.fp(), N);
    Stage st(*this, "tanh_forward (staged)");
    const float* i = st.in(inp, N);
    tanh_forward_f32(st.out(out, N), i, N);
    st.finish();
  }
  void tanh_backward(Act dinp, CAct out, CAct dout, size_t N) override {
    if (dinp.f32() && out.f32() && dout.f32()) {
      return tanh_backward_f32(acc_f32(dinp, N), out.fp(), dout.fp(), N);
    }
    Stage st(*this, "tanh_backward (staged)");
    const float* o = st.in(out, N);
    const float* d = st.in(dout, N);
    tanh_backward_f32(st.acc(dinp, N), o, d, N);
    st.finish();
  }
  // The staged row ops widen the strided tensor up to its last row read: (rows - 1) * stride + C
  // elements, where rows = n, or with idx the largest index + 1 (read back: a synchronisation).
  void rows_gather(Act out, CAct inp, int n, int C, size_t stride, const int32_t* idx) override {
    if (out.f32() && inp.f32()) return rows_gather_f32(out.fp(), inp.fp(), n, C, stride, idx);
    if (native_bf16_views({out, inp})) {  // no staging, so no read-back of idx
      forget_ce_stats(out.p);
      op(kern::rows_gather_bf16(out.p, inp.p, n, C, stride, idx, stream_), "rows_gather (bf16)");
      return;
    }
    Stage st(*this, "rows_gather (staged)");
    const float* i = st.in(inp, strided_extent(n, C, stride, idx));
    rows_gather_f32(st.out(out, size_t(n) * C), i, n, C, stride, idx);
    st.finish();
  }
  void rows_scatter_add(Act dinp, CAct dout, int n, int C, size_t stride,
                        const int32_t* idx) override {
    NLP_ASSERT(!dinp.write);  // only its rows are written: never the tensor's only writer
    if (dinp.f32() && dout.f32()) return rows_scatter_add_f32(dinp.fp(), dout.fp(), n, C, stride, idx);
    if (native_bf16_views({dinp, dout})) {
      forget_ce_stats(dinp.p);
      op(kern::rows_scatter_add_bf16(dinp.p, true, dout.p, n, C, stride, idx, stream_),
         "rows_scatter_add (bf16)");
      return;
    }
    Stage st(*this, "rows_scatter_add (staged)");
    const float* d = st.in(dout, size_t(n) * C);
    rows_scatter_add_f32(st.acc(dinp, strided_extent(n, C, stride, idx)), d, n, C, stride, idx);
    st.finish();
  }
  void dropout_forward(Act out, CAct inp, size_t N, float p, uint64_t seed, DropRows rows) override {
    if (out.f32() && inp.f32()) return dropout_forward_f32(out.fp(), inp.fp(), N, p, seed, rows);
    if (native_bf16_views({out, inp})) {
      if (p <= 0.0f) return copy(out.p, inp.p, N * dtype_bytes(DType::BF16));
      forget_ce_stats(out.p);
      op(kern::dropout_forward_bf16(out.p, inp.p, N, p, seed, slot_, rows.row, rows.row_key,
                                    rows.token_key, rows.width, stream_),
         "dropout_forward (bf16)");
      return;
    }
    Stage st(*this, "dropout_forward (staged)");
    const float* i = st.in(inp, N);
    dropout_forward_f32(st.out(out, N), i, N, p, seed, rows);
    st.finish();
  }
  void dropout_backward(Act dinp, CAct dout, size_t N, float p, uint64_t seed,
                        DropRows rows) override {
    if (dinp.f32() && dout.f32()) {
      return dropout_backward_f32(acc_f32(dinp, N), dout.fp(), N, p, seed, rows);
    }
    if (native_bf16_views({dinp, dout})) {
      if (p <= 0.0f) {
        if (dinp.write) return copy(dinp.p, dout.p, N * dtype_bytes(DType::BF16));
        return accumulate(dinp, dout, N);
      }
      forget_ce_stats(dinp.p);
      op(kern::dropout_backward_bf16(dinp.p, !dinp.write, dout.p, N, p, seed, slot_, rows.row,
                                     rows.row_key, rows.token_key, rows.width, stream_),
         "dropout_backward (bf16)");
      return;
    }
    Stage st(*this, "dropout_backward (staged)");
    const float* d = st.in(dout, N);
    dropout_backward_f32(st.acc(dinp, N), d, N, p, seed, rows);
    st.finish();
  }
  void attention_forward(Act out, float* att, CAct qkv, const int32_t* attn_mask, bool causal,
                         float dropout_p, uint64_t seed, int B, int T, int NH, int HS, int T_key,
                         const int32_t* token_key, int examples) override {
    if (out.f32() && qkv.f32())
      return attention_forward_f32(out.fp(), att, qkv.fp(), attn_mask, causal, dropout_p, seed, B, T,
                                   NH, HS, T_key, token_key, examples);
    // native: cuDNN reads q|k|v and writes O in bf16 in place (attention_cudnn.h, bf16 I/O); the
    // saved state is the stats alone (attention_saved_floats with act = BF16)
    if (native_bf16() && !out.f32() && !qkv.f32() && noted([&] { return fused(B, T, NH, HS); })) {
      noted([&] {
        fused_->forward_bf16(out.p, att, qkv.p, attn_mask, token_key != nullptr, examples, causal,
                             dropout_p, seed, slot_, B, T, NH, HS);
      });
      op(cudaGetLastError(), "attention_forward (cuDNN, bf16 I/O)");
      return;
    }
    const size_t n = size_t(std::max(B, examples)) * T * NH * HS;
    Stage st(*this, "attention_forward (staged)");
    const float* q = st.in(qkv, 3 * n);
    attention_forward_f32(st.out(out, n), att, q, attn_mask, causal, dropout_p, seed, B, T, NH, HS,
                          T_key, token_key, examples);
    st.finish();
  }
  void attention_backward(Act dqkv, float* scratch, CAct dout, CAct out, CAct qkv, const float* att,
                          const int32_t* attn_mask, bool causal, float dropout_p, uint64_t seed,
                          int B, int T, int NH, int HS, int T_key, const int32_t* token_key,
                          int examples) override {
    if (dqkv.f32() && dout.f32() && qkv.f32())
      return attention_backward_f32(acc_f32(dqkv, 3 * size_t(B) * T * NH * HS), scratch, dout.fp(),
                                    qkv.fp(), att, attn_mask, causal, dropout_p, seed, B, T, NH, HS,
                                    T_key, token_key, examples);
    // native: the forward's bf16-I/O state (stats only) with O read from `out`, the forward's bf16
    // output; dq|dk|dv written straight into dqkv (overwrite) or added to it. A saved state sized for
    // bf16 I/O cannot go to the staged fp32 path below (which would read it as the larger fp32 state).
    if (native_bf16() && !qkv.f32() && noted([&] { return fused(B, T, NH, HS); })) {
      if (!out || out.f32() || dqkv.f32() || dout.f32())
        throw Error(cat("attention_backward (cuDNN, bf16 I/O): the forward ran with bf16 I/O but "
                        "out is ", out ? dtype_name(out.dt) : "null", ", dqkv ", dtype_name(dqkv.dt),
                        " and dout ", dtype_name(dout.dt),
                        "; all three must be bf16 (or set NLPTRAIN_CUDA_BF16_ACTS=staged)"));
      noted([&] {
        fused_->backward_bf16(dqkv.p, !dqkv.write, scratch, dout.p, qkv.p, out.p, att, attn_mask,
                              token_key != nullptr, examples, causal, dropout_p, seed, slot_, B, T,
                              NH, HS);
      });
      op(cudaGetLastError(), "attention_backward (cuDNN, bf16 I/O)");
      return;
    }
    const size_t n = size_t(B) * T * NH * HS;
    Stage st(*this, "attention_backward (staged)");
    const float* d = st.in(dout, n);
    const float* q = st.in(qkv, 3 * n);
    attention_backward_f32(st.acc(dqkv, 3 * n), scratch, d, q, att, attn_mask, causal, dropout_p, seed,
                           B, T, NH, HS, T_key, token_key, examples);
    st.finish();
  }
  void lm_head_crossentropy(float* losses, Act dx, float* dw, CAct x, const float* w,
                            const int32_t* targets, float dloss, int M, int C, int V, int Vp, int chunk,
                            float* scratch) override {
    const size_t n = size_t(std::max(M, 0)) * C;
    if (dx.f32() && x.f32()) {
      return lm_head_crossentropy_f32(losses, acc_f32(dx, n), dw, x.fp(), w, targets, dloss, M, C, V, Vp,
                                      chunk, scratch);
    }
    Stage st(*this, "lm_head_crossentropy (staged)");
    const float* xi = st.in(x, n);
    lm_head_crossentropy_f32(losses, st.acc(dx, n), dw, xi, w, targets, dloss, M, C, V, Vp, chunk,
                             scratch);
    st.finish();
  }

  // ---- the fp32 ops (float* views) ----
  // ---- embeddings ----
  void embedding_forward_f32(float* out, const int32_t* ids, const int32_t* type_ids, const float* wte,
                         const float* wpe, const float* wtt, int B, int T, int C, int pos_offset,
                         const int32_t* pos_ids) {
    op(kern::embedding_forward(out, ids, type_ids, wte, wpe, wtt, B, T, C, pos_offset, pos_ids, stream_),
       "embedding_forward");
  }
  void embedding_backward_f32(float* dwte, float* dwpe, float* dwtt, const float* dout,
                          const int32_t* ids, const int32_t* type_ids, int B, int T, int C,
                          int pos_offset, const int32_t* pos_ids) {
    const size_t need = kern::embedding_backward_ws_bytes(B * T, C);
    void* w = workspace(need);
    op(kern::embedding_backward(dwte, dwpe, dwtt, dout, ids, type_ids, B, T, C, pos_offset, pos_ids,
                                w, need, stream_),
       "embedding_backward");
  }

  // ---- dense ----
  // out[M,N] = inp[M,K] @ W + bias;  InOut: W [K,N];  OutIn: W [N,K]
  void matmul_forward_f32(float* out, const float* inp, const float* w, const float* bias, int M,
                      int K, int N, WLayout layout) {
    if (M <= 0 || N <= 0) return;
    if (K <= 0) {
      if (bias)
        op(kern::broadcast_rows(out, bias, M, N, stream_), "matmul_forward (bias)");
      else
        zero(out, sizeof(float) * size_t(M) * N);
      return;
    }
    forget_ce_stats(out);
    gemm("matmul_forward", out, inp, false, w, layout == WLayout::OutIn, M, N, K, 0.0f, bias,
         persistent(w, size_t(K) * N));
  }
  // dinp[M,K] += dout @ W^T;  dW += inp^T @ dout (in W's layout);  dbias[N] += colsum(dout)
  void matmul_backward_f32(float* dinp, float* dw, float* dbias, const float* dout, const float* inp,
                       const float* w, int M, int K, int N, WLayout layout) {
    if (M <= 0 || N <= 0) return;
    if (K > 0 && (dinp || dw)) {
      const void* w16 = dinp ? persistent(w, size_t(K) * N) : nullptr;
      noted([&] { gemm_->backward(dinp, dw, dout, inp, w, M, K, N, layout == WLayout::InOut, w16); });
      op(cudaSuccess, "matmul_backward (dinp, dW)");
    }
    if (dbias) {
      void* ws = workspace(kern::colsum_ws_bytes(M, N));
      op(kern::colsum_accumulate(dbias, dout, M, N, ws, stream_), "matmul_backward (dbias)");
    }
  }

  // ---- layer norm ----
  void layernorm_forward_f32(float* out, float* mean, float* rstd, const float* inp, const float* w,
                         const float* b, int N, int C, float eps) {
    op(kern::layernorm_forward(out, mean, rstd, inp, w, b, N, C, eps, stream_),
       "layernorm_forward");
  }
  void layernorm_backward_f32(float* dinp, float* dw, float* db, const float* dout, const float* inp,
                          const float* w, const float* mean, const float* rstd, int N,
                          int C) {
    void* ws = (dw || db) ? workspace(kern::layernorm_backward_ws_bytes(N, C)) : nullptr;
    op(kern::layernorm_backward(dinp, dw, db, dout, inp, w, mean, rstd, N, C, ws, stream_),
       "layernorm_backward");
  }
  // A block's residual add + dropout + layer norm in one launch, and its backward in one row kernel
  // (plus the dw/db column sums): the bits of Backend's defaults (dropout, add and layer norm in
  // turn), which NLPTRAIN_CUDA_FUSED_LN=0 selects instead.
  void residual_layernorm_forward_f32(float* res, float* out, float* mean, float* rstd, const float* x,
                                  const float* delta, const float* w, const float* b, int N, int C,
                                  float eps, float p, uint64_t seed, DropRows rows) {
    if (!fused_ln_) {
      Backend::residual_layernorm_forward(res, out, mean, rstd, x, delta, w, b, N, C, eps, p, seed, rows);
      return;
    }
    forget_ce_stats(res);
    forget_ce_stats(out);
    op(kern::residual_layernorm_forward(res, out, mean, rstd, x, delta, w, b, N, C, eps, p, seed, slot_,
                                        rows.row, rows.row_key, rows.token_key, rows.width, stream_),
       "residual_layernorm_forward");
  }
  void layernorm_dropout_backward_f32(float* dinp, float* ddelta, float* scratch, float* dw, float* db,
                                  const float* dout, const float* inp, const float* w,
                                  const float* mean, const float* rstd, int N, int C, float p,
                                  uint64_t seed, DropRows rows) {
    if (!fused_ln_) {
      Backend::layernorm_dropout_backward(dinp, ddelta, scratch, dw, db, dout, inp, w, mean, rstd, N, C,
                                          p, seed, rows);
      return;
    }
    forget_ce_stats(ddelta);
    void* ws = (dw || db) ? workspace(kern::layernorm_backward_ws_bytes(N, C)) : nullptr;
    op(kern::layernorm_dropout_backward(dinp, ddelta, dw, db, dout, inp, w, mean, rstd, N, C, p, seed,
                                        slot_, rows.row, rows.row_key, rows.token_key, rows.width, ws,
                                        stream_),
       "layernorm_dropout_backward");
  }

  // ---- elementwise ----
  void gelu_forward_f32(float* out, const float* inp, size_t N, Gelu form) {
    op(kern::gelu_forward(out, inp, N, form == Gelu::Tanh, stream_), "gelu_forward");
  }
  void gelu_backward_f32(float* dinp, const float* inp, const float* dout, size_t N,
                     Gelu form) {
    op(kern::gelu_backward(dinp, inp, dout, N, form == Gelu::Tanh, stream_), "gelu_backward");
  }
  void add_f32(float* out, const float* a, const float* b, size_t N) {
    op(kern::add(out, a, b, N, stream_), "add");
  }
  void accumulate_f32(float* dst, const float* src, size_t N) {
    op(kern::accumulate(dst, src, N, stream_), "accumulate");
  }
  void scale_f32(float* x, float s, size_t N) { op(kern::scale(x, s, N, stream_), "scale"); }
  void tanh_forward_f32(float* out, const float* inp, size_t N) {
    op(kern::tanh_forward(out, inp, N, stream_), "tanh_forward");
  }
  void tanh_backward_f32(float* dinp, const float* out, const float* dout, size_t N) {
    op(kern::tanh_backward(dinp, out, dout, N, stream_), "tanh_backward");
  }
  void rows_gather_f32(float* out, const float* inp, int n, int C, size_t stride,
                   const int32_t* idx) {
    op(kern::rows_gather(out, inp, n, C, stride, idx, stream_), "rows_gather");
  }
  void rows_scatter_add_f32(float* dinp, const float* dout, int n, int C, size_t stride,
                        const int32_t* idx) {
    op(kern::rows_scatter_add(dinp, dout, n, C, stride, idx, stream_), "rows_scatter_add");
  }
  void dropout_forward_f32(float* out, const float* inp, size_t N, float p, uint64_t seed,
                       DropRows rows) {
    if (p <= 0.0f) {
      copy(out, inp, N * sizeof(float));
      return;
    }
    op(kern::dropout_forward(out, inp, N, p, seed, slot_, rows.row, rows.row_key, rows.token_key,
                             rows.width, stream_),
       "dropout_forward");
  }
  void dropout_backward_f32(float* dinp, const float* dout, size_t N, float p, uint64_t seed,
                        DropRows rows) {
    if (p <= 0.0f) {
      accumulate(dinp, dout, N);
      return;
    }
    op(kern::dropout_backward(dinp, dout, N, p, seed, slot_, rows.row, rows.row_key, rows.token_key,
                              rows.width, stream_),
       "dropout_backward");
  }

  // ---- attention ----
  // With fused attention, every shape cuDNN supports (decided once per (NH, HS), the same answer for
  // sizing and dispatch) runs through cuDNN's SDPA and saves/uses the small state of
  // attention_cudnn.h; any other shape, and every shape without it, runs the native kernels with
  // att[B,NH,T,T] probabilities.
  // (act: bf16 views with native_bf16() run cuDNN's bf16-I/O entry points, whose state is the stats
  // alone and whose scratch is one bf16 dO; staged bf16 views go through the fp32 path below, which
  // saves the same state as fp32. The fp32 sizes are the larger, so either path fits in them.)
  size_t attention_saved_floats(int B, int T, int NH, int HS, DType act) override {
    if (!fused(B, T, NH, HS)) return Backend::attention_saved_floats(B, T, NH, HS, act);
    return act == DType::BF16 && native_bf16() ? cuda::sdpa_saved_floats_bf16(B, T, NH, HS)
                                               : cuda::sdpa_saved_floats(B, T, NH, HS);
  }
  size_t attention_scratch_floats(int B, int T, int NH, int HS, DType act) override {
    if (!fused(B, T, NH, HS)) return Backend::attention_scratch_floats(B, T, NH, HS, act);
    return act == DType::BF16 && native_bf16() ? cuda::sdpa_scratch_floats_bf16(B, T, NH, HS)
                                               : cuda::sdpa_scratch_floats(B, T, NH, HS);
  }
  void attention_forward_f32(float* out, float* att, const float* qkv, const int32_t* attn_mask,
                         bool causal, float dropout_p, uint64_t seed, int B, int T, int NH,
                         int HS, int T_key, const int32_t* token_key, int examples) {
    // packed rows (they carry token_key, model.h) take cuDNN's ragged layout or its segment-mask
    // bias (attention_cudnn.h); cuDNN draws its own dropout mask (backend.h): T_key and token_key
    // do not apply to it
    if (noted([&] { return fused(B, T, NH, HS); })) {
      noted([&] {
        fused_->forward(out, att, qkv, attn_mask, token_key != nullptr, examples, causal, dropout_p,
                        seed, slot_, B, T, NH, HS);
      });
      op(cudaGetLastError(), "attention_forward (cuDNN)");
      return;
    }
    op(kern::attention_forward(out, att, qkv, attn_mask, causal, dropout_p, seed, slot_, B, T, NH,
                               HS, T_key, token_key, stream_),
       "attention_forward");
  }
  void attention_backward_f32(float* dqkv, float* scratch, const float* dout, const float* qkv,
                          const float* att, const int32_t* attn_mask, bool causal,
                          float dropout_p, uint64_t seed, int B, int T, int NH,
                          int HS, int T_key, const int32_t* token_key, int examples) {
    if (noted([&] { return fused(B, T, NH, HS); })) {  // q, k, v come from the bf16 copy in att
      noted([&] {
        fused_->backward(dqkv, scratch, dout, att, attn_mask, token_key != nullptr, examples, causal,
                         dropout_p, seed, slot_, B, T, NH, HS);
      });
      op(cudaGetLastError(), "attention_backward (cuDNN)");
      return;
    }
    op(kern::attention_backward(dqkv, scratch, dout, qkv, att, attn_mask, causal, dropout_p, seed,
                                slot_, B, T, NH, HS, T_key, token_key, stream_),
       "attention_backward");
  }
  void attention_decode(float* out, const float* qkv_new, float* kcache, float* vcache, int B,
                        int pos, int Tmax, int NH, int HS) override {
    NLP_ASSERT(pos >= 0 && pos < Tmax);
    void* ws = workspace(kern::attention_decode_ws_bytes(B, pos, NH));
    op(kern::attention_decode(out, qkv_new, kcache, vcache, B, pos, Tmax, NH, HS, ws, stream_),
       "attention_decode");
  }

  // ---- losses ----
  void crossentropy_forward(float* losses, const float* logits, const int32_t* targets, int M,
                            int V) override {
    if (M <= 0) return;
    ce_stats_capacity(M);
    op(kern::crossentropy_forward(losses, logits, targets, M, V, bad_row(targets, M, V),
                                  ce_stats_.mx, ce_stats_.se, stream_),
       "crossentropy_forward");
    ce_stats_.logits = logits;
    ce_stats_.M = M;
    ce_stats_.V = V;
    if (cap_) cap_->stats_set = true;
    copy_bad_row();
  }
  void crossentropy_backward(float* dlogits, const float* logits, const int32_t* targets,
                             float dloss, int M, int V) override {
    if (M <= 0) return;
    const bool reuse = ce_stats_.logits == logits && ce_stats_.M == M && ce_stats_.V == V;
    op(kern::crossentropy_backward(dlogits, logits, targets, dloss, dloss_slot(), M, V,
                                   bad_row(targets, M, V), reuse ? ce_stats_.mx : nullptr,
                                   reuse ? ce_stats_.se : nullptr, stream_),
       "crossentropy_backward");
    copy_bad_row();
  }
  // The LM head fused with its loss (core/backend.h). Padding (Vp > V) lives in scratch only: a copy
  // of w with rows V..Vp zero, so that the head's GEMMs run Vp wide (a multiple of 128: whole tiles,
  // 16-byte aligned rows), and with dw a padded [Vp, C] gradient whose first V rows are added to dw
  // at the end (the padded rows' gradient is dropped). The parameters, their gradients, the optimizer,
  // checkpoints and exports keep V rows. Not yet run on a GPU: model.fused_head and model.pad_vocab
  // are off by default on this backend.
  // Scratch: the chunk's fp32 logits [chunk, Vp]; with Vp > V the padded dw [Vp, C] and, unless the
  // padded w is bf16 (head_w16_, in a buffer of its own), the padded fp32 w [Vp, C]; in bf16 precision with NLPTRAIN_CUDA_HEAD_DLOGITS=bf16 (head_dl16_) also the chunk's bf16 dlogits
  // [chunk, Vp] on a 256-byte boundary (head_dlogits16), which the backward GEMMs read as their
  // operand; otherwise the dlogits overwrite the logits in fp32 and the GEMM casts them.
  // The padded w: in bf16 precision with NLPTRAIN_CUDA_HEAD_WTE=bf16 (head_w16_) a bf16 [Vp, C] in
  // its own buffer (hw_, head_wte), which every GEMM of the call reads as its weight operand
  // (z16/w16): copied from the persistent bf16 copy and kept while wte is unwritten (remade on the
  // first call after a write, so once per optimizer step), or rounded from w at every call where
  // there is no persistent copy; else fp32 in the scratch, which each GEMM rounds again in bf16
  // precision.
  size_t padded_floats(int C, int V, int Vp) const {  // the scratch's padded w and dw
    return Vp > V ? (head_w16_ ? 1 : 2) * size_t(Vp) * C : 0;
  }
  size_t lm_head_scratch_floats(int chunk, int C, int V, int Vp) override {
    const size_t dl16 = head_dl16_ ? kAlignFloats + (size_t(chunk) * Vp + 1) / 2 : 0;
    return size_t(chunk) * Vp + padded_floats(C, V, Vp) + dl16;
  }
  static constexpr size_t kAlignFloats = 64;  // 256 bytes
  // The bf16 dlogits' place in the scratch: past the logits and the padded copies, rounded up to
  // 256 bytes (within the kAlignFloats floats lm_head_scratch_floats adds for it).
  void* head_dlogits16(float* scratch, int chunk, int C, int V, int Vp) const {
    const float* end = scratch + size_t(chunk) * Vp + padded_floats(C, V, Vp);
    const uintptr_t a = reinterpret_cast<uintptr_t>(end);
    return reinterpret_cast<void*>((a + 4 * kAlignFloats - 1) / (4 * kAlignFloats) * (4 * kAlignFloats));
  }
  void lm_head_crossentropy_f32(float* losses, float* dx, float* dw, const float* x, const float* w,
                            const int32_t* targets, float dloss, int M, int C, int V, int Vp,
                            int chunk, float* scratch) {
    NLP_ASSERT(Vp >= V && chunk > 0);
    if (M <= 0) return;
    const bool bwd = dx || dw;
    const int N = Vp;  // the GEMMs' width and the logits' row stride
    float* logits = scratch;
    const float* wg = w;
    float* dwg = dw;
    const void* w16 = nullptr;  // the GEMMs' bf16 weight operand [N, C] (head_w16_), else null
    const size_t vc = size_t(V) * C, pc = size_t(Vp - V) * C;
    if (Vp > V) {
      float* wp = scratch + size_t(chunk) * Vp;  // the padded fp32 w (not head_w16_), then dw
      if (head_w16_) {
        w16 = head_wte(w, C, V, Vp);  // the fp32 w is not read by the GEMMs
        wg = nullptr;
      } else {
        copy(wp, w, vc * sizeof(float));
        zero(wp + vc, pc * sizeof(float));
        wg = wp;
      }
      if (dw) {
        dwg = wp + (head_w16_ ? 0 : size_t(Vp) * C);
        zero(dwg, size_t(Vp) * C * sizeof(float));
      }
    } else if (head_w16_) {
      w16 = persistent(w, vc);  // null without run.bf16_weights: each GEMM rounds w, as before
    }
    int* bad = bad_row(targets, M, V);
    // bf16 dlogits (head_dl16_): written by the loss kernel, read by the typed GEMM as stored
    void* dl16 = bwd && head_dl16_ ? head_dlogits16(scratch, chunk, C, V, Vp) : nullptr;
    for (int r0 = 0; r0 < M; r0 += chunk) {
      const int rows = std::min(chunk, M - r0);
      const float* xr = x + size_t(r0) * C;
      gemm("lm_head_crossentropy (logits)", logits, xr, false, wg, true, rows, N, C, 0.0f, nullptr,
           w16);
      if (dl16) {
        // logits [rows, N] fp32 (read) -> losses [rows], dl16 [rows, N] bf16; then
        // dx[rows, C] += dl16 @ wg[N, C] and dwg[N, C] += dl16^T @ xr (xr rounded to bf16 as the
        // fp32-dlogits path rounds it; wg from w16 where set, else rounded as there)
        op(kern::lm_head_crossentropy_bf16(losses + r0, logits, dl16, N, targets + r0, dloss,
                                           dloss_slot(), rows, V, r0, bad, stream_, head_online_),
           "lm_head_crossentropy (bf16 dlogits)");
        noted([&] {
          gemm_->backward(cuda::GemmOut{dx ? dx + size_t(r0) * C : nullptr, CUDA_R_32F}, 1.0f, dwg,
                          nullptr, cuda::GemmIn{dl16, CUDA_R_16BF}, cuda::GemmIn{xr, CUDA_R_32F},
                          wg, rows, C, N, false, w16);
        });
        op(cudaSuccess, "lm_head_crossentropy (dx, dW)");
        continue;
      }
      op(kern::lm_head_crossentropy(losses + r0, logits, N, targets + r0, dloss,
                                    bwd ? dloss_slot() : nullptr, rows, V, r0, bad, bwd, stream_,
                                    head_online_),
         "lm_head_crossentropy");
      if (!bwd) continue;
      noted([&] {
        gemm_->backward(dx ? dx + size_t(r0) * C : nullptr, dwg, logits, xr, wg, rows, C, N, false, w16);
      });
      op(cudaSuccess, "lm_head_crossentropy (dx, dW)");
    }
    if (dw && dwg != dw) accumulate(dw, dwg, size_t(V) * C);
    copy_bad_row();
  }

  // Segments (packed qa): the flag's V = 0 marks them for check_targets' message.
  std::pair<std::vector<int32_t>, std::vector<int32_t>> segments_on_host(const int32_t* first,
                                                                          const int32_t* len, int E) {
    std::vector<int32_t> f(static_cast<size_t>(E)), n(static_cast<size_t>(E));
    to_host(f.data(), first, f.size() * sizeof(int32_t));
    to_host(n.data(), len, n.size() * sizeof(int32_t));
    return {std::move(f), std::move(n)};
  }
  void segment_crossentropy_forward(float* losses, const float* x, const int32_t* first,
                                    const int32_t* len, const int32_t* targets, int E) override {
    if (E <= 0) return;
    if (segment_ce_rows_) {
      const auto [f, n] = segments_on_host(first, len, E);
      for (int e = 0; e < E; ++e) crossentropy_forward(losses + e, x + f[e], targets + e, 1, n[e]);
      return;
    }
    op(kern::segment_crossentropy_forward(losses, x, first, len, targets, E,
                                          bad_row(targets, E, 0), stream_),
       "crossentropy_forward");
    copy_bad_row();
  }
  void segment_crossentropy_backward(float* dx, const float* x, const int32_t* first, const int32_t* len,
                                     const int32_t* targets, float dloss, int E) override {
    if (E <= 0) return;
    if (segment_ce_rows_) {
      const auto [f, n] = segments_on_host(first, len, E);
      for (int e = 0; e < E; ++e) crossentropy_backward(dx + f[e], x + f[e], targets + e, dloss, 1, n[e]);
      return;
    }
    op(kern::segment_crossentropy_backward(dx, x, first, len, targets, dloss, dloss_slot(), E,
                                           bad_row(targets, E, 0), stream_),
       "crossentropy_backward");
    copy_bad_row();
  }

  // ---- reductions, optimizer ----
  double sum(const float* x, size_t N) override { return reduce(x, N, false); }
  double sumsq(const float* x, size_t N) override { return reduce(x, N, true); }
  void sum_into(double* acc, const float* x, size_t N, double scale) override {
    if (N == 0) return;  // the sum is 0: acc + scale * 0 is acc (never -0 here: a sum of losses)
    void* ws = workspace(kern::sum_ws_bytes(N));
    double* d = static_cast<double*>(small_);
    op(kern::sum_double(d, x, N, false, ws, stream_), "sum");
    op(kern::add_scaled_double(acc, d, scale, stream_), "sum_into");
  }

  void adamw_update(float* param, const float* grad, float* m, float* v, size_t N, float lr,
                    float beta1, float beta2, float eps, float weight_decay, float grad_scale,
                    int t) override {
    // bias corrections in double as torch (and the CPU backend) do
    const double bc1 = 1.0 - std::pow((double)beta1, t);
    const double bc2 = 1.0 - std::pow((double)beta2, t);
    const float step_size = static_cast<float>((double)lr / bc1);
    const float bc2_sqrt = static_cast<float>(std::sqrt(bc2));
    const float decay = 1.0f - lr * weight_decay;
    forget_head_wte(param, N);
    op(kern::adamw_update(param, grad, m, v, N, step_size, bc2_sqrt, decay, beta1, beta2, eps,
                          grad_scale, stream_, copy_of(param, N)),
       "adamw_update");
  }

  // Every tensor in one launch (a step of BERT-base has ~200 tensors: ~200 launches and their gaps
  // otherwise). The span table lives on the device, uploaded when the spans change.
  // zero_grad: one memset over the spans' whole range after the launch (the gaps between spans are
  // alignment padding that no kernel writes).
  void adamw_update_spans(float* param, float* grad, float* m, float* v,
                          const std::vector<AdamWSpan>& spans, float lr, float beta1, float beta2,
                          float eps, float grad_scale, int t, bool zero_grad) override {
    float wd = 0.f;  // the one non-zero weight decay (one launch handles two decay factors)
    bool one_wd = true;
    for (const AdamWSpan& sp : spans) {
      if (sp.weight_decay != 0.f && wd != 0.f && sp.weight_decay != wd) one_wd = false;
      if (sp.weight_decay != 0.f) wd = sp.weight_decay;
    }
    bool ascending = true;
    for (size_t k = 1; k < spans.size(); ++k)
      ascending = ascending && spans[k].offset >= spans[k - 1].offset + spans[k - 1].numel;
    if (spans.empty() || !one_wd || !ascending) {
      Backend::adamw_update_spans(param, grad, m, v, spans, lr, beta1, beta2, eps, grad_scale, t, zero_grad);
      return;
    }
    if (!same_spans(spans)) upload_spans(spans);
    const double bc1 = 1.0 - std::pow((double)beta1, t);
    const double bc2 = 1.0 - std::pow((double)beta2, t);
    const float step_size = static_cast<float>((double)lr / bc1);
    const float bc2_sqrt = static_cast<float>(std::sqrt(bc2));
    const float decay_on = 1.0f - lr * wd;
    const float decay_off = 1.0f - lr * 0.0f;
    const size_t n_total = spans.back().offset + spans.back().numel;
    forget_head_wte(param, n_total);
    op(kern::adamw_update_spans(param, grad, m, v, span_start_, span_end_, span_decay_,
                                int(spans.size()), n_total, step_size, bc2_sqrt, decay_on,
                                decay_off, beta1, beta2, eps, grad_scale, stream_,
                                copy_of(param, n_total)),
       "adamw_update");
    if (zero_grad)
      zero(grad + spans.front().offset, (n_total - spans.front().offset) * sizeof(float));
  }

  // ---- replayed micro-batches (core/backend.h) ----
  // A recording is a CUDA graph captured from stream_ (cudaStreamCaptureModeThreadLocal). The
  // recorded kernels hold the device pointers of the moment: every grow-only buffer they use (the
  // workspace, the cross-entropy statistics, the GEMM's bf16 scratch, cuDNN's workspace) must stay
  // where it is, so none grows while recording (the op throws instead) and a replay after one grew
  // throws (memory_generation()). The cross-entropy target check works across replays as across
  // eager ops: the recorded ops raise the flag, copy it to pinned memory, and leave ce_ pointing at
  // their targets; replay() arms the flag (outside the graph) when no check is pending.
  bool can_capture(std::string* why) const override {
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

  void capture_begin(size_t slots) override {
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

  void bind_slot(int k) override {
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

  std::shared_ptr<Recording> capture_end(std::string* why) override {
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

  void replay(Recording& recording, const uint64_t* values, size_t n) override {
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

 private:
  // The recording in progress (capture_begin .. capture_end) and what it must restore.
  struct Capture {
    std::shared_ptr<CudaRecording> rec;
    size_t generation = 0;
    long builds = 0;
    CeFlag ce;       // at capture_begin
    CeStats stats;   // at capture_begin
    bool has_ce = false;     // a recorded op checks cross-entropy targets
    bool stats_set = false;  // a recorded crossentropy_forward set ce_stats_
    std::vector<const void*> written;  // buffers written by recorded ops before stats_set
    std::string failure;     // the first op that failed or was refused while recording
  };
  std::unique_ptr<Capture> cap_;
  const uint64_t* slot_ = nullptr;  // bind_slot: the word of cap_'s table the next ops read
  size_t grows_ = 0;  // reallocations of ce_stats_, the staging buffers and the head's padded wte

  // Reallocations of every grow-only buffer a recorded kernel may point into.
  size_t memory_generation() const {
    return grows_ + ws_.grows() + gemm_->grows() + (fused_ ? size_t(fused_->grows()) : 0);
  }
  long cudnn_builds() const { return fused_ ? fused_->builds() : 0; }
  // dloss from the bound slot: the float in the word's low 32 bits (little-endian: its first 4 bytes)
  const float* dloss_slot() const { return reinterpret_cast<const float*>(slot_); }

  // Throws (noting the failure for capture_end) when recording: `what` would synchronise,
  // allocate, read back or grow a buffer the recording points into.
  void no_capture(const char* what) {
    if (!cap_) return;
    std::string m = cat("cuda backend: ", what, " while recording a CUDA graph (ops between "
                        "capture_begin and capture_end must not synchronise, allocate, read back "
                        "or need more scratch than an eager pass before)");
    if (cap_->failure.empty()) cap_->failure = m;
    throw Error(m);
  }
  // Runs f; while recording, an exception it throws is noted for capture_end first.
  template <typename F>
  auto noted(F&& f) -> decltype(f()) {
    if (!cap_) return f();
    try {
      return f();
    } catch (const std::exception& e) {
      if (cap_ && cap_->failure.empty()) cap_->failure = e.what();
      throw;
    }
  }

  bool same_spans(const std::vector<AdamWSpan>& spans) const {
    if (spans.size() != spans_.size()) return false;
    for (size_t k = 0; k < spans.size(); ++k)
      if (spans[k].offset != spans_[k].offset || spans[k].numel != spans_[k].numel ||
          (spans[k].weight_decay != 0.f) != (spans_[k].weight_decay != 0.f))
        return false;
    return true;
  }
  void upload_spans(const std::vector<AdamWSpan>& spans) {
    const size_t n = spans.size();
    std::vector<uint64_t> st(n), en(n);
    std::vector<uint8_t> dec(n);
    for (size_t k = 0; k < n; ++k) {
      st[k] = spans[k].offset;
      en[k] = spans[k].offset + spans[k].numel;
      dec[k] = spans[k].weight_decay != 0.f;
    }
    release(span_start_);
    span_start_ = static_cast<uint64_t*>(alloc(n * 17 + 16));  // start | end | decay
    span_end_ = span_start_ + n;
    span_decay_ = reinterpret_cast<uint8_t*>(span_end_ + n);
    to_device(span_start_, st.data(), n * 8);
    to_device(span_end_, en.data(), n * 8);
    to_device(span_decay_, dec.data(), n);
    spans_ = spans;
  }
  std::vector<AdamWSpan> spans_;  // the table on the device
  uint64_t* span_start_ = nullptr;
  uint64_t* span_end_ = nullptr;
  uint8_t* span_decay_ = nullptr;

  // ---- the staged bf16 path (the ops on typed views above) ----
  // path_counts(): ops staged, and conversions launched outside the GEMM (Stage, copy_view, the
  // persistent bf16 copy, the fused head's padded wte)
  int64_t staged_ops_ = 0, to16_ = 0, to32_ = 0;
  // Staging buffers: slot k of an op's stand-ins, grown as needed (between recordings only, like the
  // workspace) and reused by the next op (stream order makes that safe).
  std::vector<std::pair<float*, size_t>> stage_;  // pointer, floats
  float* stage_buf(size_t k, size_t n) {
    if (stage_.size() <= k) stage_.resize(k + 1, {nullptr, 0});
    auto& [p, cap] = stage_[k];
    if (n > cap) {
      no_capture("a bf16 staging buffer would grow");
      ++grows_;
      release(p);
      p = nullptr;
      cap = 0;
      p = static_cast<float*>(alloc(n * sizeof(float)));
      cap = n;
    }
    return p;
  }
  // fp32 stand-ins for one op's views: in() an input, out() a written output, acc() an accumulated
  // gradient (zeros when the view says overwrite), scratch() a plain buffer; finish() rounds every
  // out/acc stand-in of a bf16 view back into it. fp32 views are their own stand-ins.
  class Stage {
   public:
    Stage(CudaBackend& b, const char* what) : b_(b), what_(what) { ++b_.staged_ops_; }
    const float* in(CAct v, size_t n) {
      check_fits(v, n, what_);
      if (!v.p || v.f32()) return static_cast<const float*>(v.p);
      float* s = b_.stage_buf(k_++, n);
      b_.op(kern::from_bf16(s, v.p, n, b_.stream_), what_);
      ++b_.to32_;
      return s;
    }
    float* out(Act v, size_t n) { return stand_in(v, n, false); }
    float* acc(Act v, size_t n) { return stand_in(v, n, true); }
    float* scratch(size_t n) { return b_.stage_buf(k_++, n); }
    void finish() {
      for (const Back& o : back_) b_.op(kern::to_bf16(o.dst, o.src, o.n, b_.stream_), what_);
      b_.to16_ += int64_t(back_.size());
      back_.clear();
    }

   private:
    float* stand_in(Act v, size_t n, bool accumulate) {
      check_fits(v, n, what_);
      if (!v.p) return nullptr;
      if (v.f32()) return accumulate ? b_.acc_f32(v, n) : v.fp();
      float* s = b_.stage_buf(k_++, n);
      if (accumulate && !v.write) {
        b_.op(kern::from_bf16(s, v.p, n, b_.stream_), what_);
        ++b_.to32_;
      } else if (accumulate)
        b_.zero(s, n * sizeof(float));
      back_.push_back(Back{v.p, s, n});
      return s;
    }
    struct Back {
      void* dst;
      const float* src;
      size_t n;
    };
    CudaBackend& b_;
    const char* what_;
    size_t k_ = 0;
    std::vector<Back> back_;
  };
  // Elements of a [rows, stride] tensor that row ops over n rows of width C read (see rows_gather).
  size_t strided_extent(int n, int C, size_t stride, const int32_t* idx) {
    if (n <= 0) return 0;
    size_t rows = size_t(n);
    if (idx) {
      std::vector<int32_t> h(static_cast<size_t>(n));
      to_host(h.data(), idx, h.size() * sizeof(int32_t));
      for (int32_t r : h) rows = std::max(rows, size_t(r) + 1);
    }
    return (rows - 1) * stride + size_t(C);
  }

  // Checks an op's launch; with run.sync_check also waits for it, so an asynchronous fault (an
  // illegal address, a misaligned access) is reported under the op that caused it.
  // With run.profile, also marks the op's end for the per-op timing.
  void op(cudaError_t e, const char* what) {
    if (e != cudaSuccess && cap_ && cap_->failure.empty())
      cap_->failure = cat(what, ": ", cudaGetErrorName(e));
    ck(e, what);
    if (prof_) prof_->mark(label_ ? label_ : what);
    if (sync_check_) {
      ck(cudaStreamSynchronize(stream_), what);
      ck(cudaGetLastError(), what);
    }
  }
  void gemm(const char* what, float* Y, const float* X, bool trans_x, const float* Z, bool trans_z,
            int M, int P, int Q, float beta, const float* bias, const void* z16 = nullptr) {
    noted([&] { gemm_->run(Y, X, trans_x, Z, trans_z, M, P, Q, beta, bias, z16); });
    op(cudaSuccess, what);
  }

  // The persistent copy of w[n] (register_weights) when w lies inside the arena, else null.
  const uint16_t* persistent(const float* w, size_t n) const {
    if (!warena_ || w < warena_ || w + n > warena_ + wn_) return nullptr;
    return wcopy_ + (w - warena_);
  }
  void* copy_of(const float* p, size_t n) { return const_cast<uint16_t*>(persistent(p, n)); }

  // The fused head's padded bf16 wte [Vp, C] (head_w16_, Vp > V): rows 0..V the bf16 of w, rows
  // V..Vp zero, in hw_'s buffer. Made from the persistent copy (a copy, no rounding) and then kept
  // (hw_.w = w) until a write to wte forgets it (forget_head_wte: weights_written, adamw_update(_spans),
  // register_weights), so one copy per optimizer step however many micro-batches read it; rounded
  // from w (kern::to_bf16) at every call where w has no persistent copy. While recording a CUDA graph
  // the copy is made inside the recording (each replay remakes it from the persistent copy as it is
  // then: a replay never reads a copy older than the weights) and hw_ is left forgotten, since the
  // recorded ops have not run. The buffer grows like the workspace (never while recording).
  const uint16_t* head_wte(const float* w, int C, int V, int Vp) {
    const size_t vc = size_t(V) * C, pc = size_t(Vp - V) * C, n = vc + pc;
    const uint16_t* pw = persistent(w, vc);
    if (pw && !cap_ && hw_.w == w && hw_.C == C && hw_.V == V && hw_.Vp == Vp) return hw_.p;
    if (n > hw_.cap) {
      no_capture("the fused head's padded wte would grow");
      ++grows_;
      if (hw_.p) ck(cudaFreeAsync(hw_.p, stream_), "cudaFreeAsync(padded wte)");
      hw_.p = nullptr;
      hw_.cap = 0;
      hw_.p = static_cast<uint16_t*>(alloc(n * sizeof(uint16_t)));
      hw_.cap = n;
    }
    hw_.w = nullptr;
    if (pw) {
      op(cudaMemcpyAsync(hw_.p, pw, vc * sizeof(uint16_t), cudaMemcpyDeviceToDevice, stream_),
         "lm_head_crossentropy (padded bf16 wte)");
    } else {
      op(kern::to_bf16(hw_.p, w, vc, stream_), "lm_head_crossentropy (padded bf16 wte)");
      ++to16_;
    }
    op(cudaMemsetAsync(hw_.p + vc, 0, pc * sizeof(uint16_t), stream_),
       "lm_head_crossentropy (padded bf16 wte)");
    ++head_wte_builds_;
    if (pw && !cap_) {
      hw_.w = w;
      hw_.C = C;
      hw_.V = V;
      hw_.Vp = Vp;
    }
    return hw_.p;
  }
  // A write to [p, p + n) of the weights: the head's padded copy is remade if it covers any of it.
  void forget_head_wte(const float* p, size_t n) {
    if (hw_.w && n && p < hw_.w + size_t(hw_.V) * hw_.C && p + n > hw_.w) hw_.w = nullptr;
  }

  bool fused(int B, int T, int NH, int HS) { return fused_ && fused_->supports(B, T, NH, HS); }

  // Scratch that lives until the next call needing more (stream order makes reuse safe).
  void* workspace(size_t bytes) {
    return ws_.get(
        bytes, stream_, [this](size_t, size_t) { no_capture("the workspace would grow"); }, ck);
  }

  double reduce(const float* x, size_t N, bool square) {
    no_capture(square ? "sumsq (a read-back)" : "sum (a read-back)");
    if (N == 0) return 0.0;
    void* ws = workspace(kern::sum_ws_bytes(N));
    double* d = static_cast<double*>(small_);
    op(kern::sum_double(d, x, N, square, ws, stream_), square ? "sumsq" : "sum");
    ck(cudaMemcpyAsync(host_small_, d, sizeof(double), cudaMemcpyDeviceToHost, stream_),
       "sum (copy)");
    ck(cudaStreamSynchronize(stream_), "sum (synchronize)");
    after_sync();
    return *static_cast<double*>(host_small_);
  }

  // Row statistics of the last crossentropy_forward (max and sum of exp per row), reused by a
  // crossentropy_backward on the same logits (pointer, M, V): one read of the [M,V] logits instead of
  // three. Forgotten when an op writes that buffer (matmul_forward, copy, zero, to_device): the
  // backend contract (core/backend.h) is that the logits are unchanged in between.
  CeStats ce_stats_;
  void forget_ce_stats(const void* written) {
    if (cap_ && !cap_->stats_set) cap_->written.push_back(written);
    if (written == ce_stats_.logits) ce_stats_.logits = nullptr;
  }
  void ce_stats_capacity(int M) {
    if (M <= ce_stats_.cap) return;
    no_capture("the cross-entropy row statistics would grow");
    ++grows_;
    if (ce_stats_.se) release(ce_stats_.se);
    ce_stats_.se = static_cast<double*>(alloc(size_t(M) * 12 + 64));  // se [M] double | mx [M] float
    ce_stats_.mx = reinterpret_cast<float*>(ce_stats_.se + M);
    ce_stats_.cap = M;
    ce_stats_.logits = nullptr;
  }

  void after_sync() {
    if (prof_) prof_->collect();
    check_targets();
  }

  // Cross-entropy target check without a synchronisation inside the step: the kernels atomicMin the
  // first bad row into a device flag, whose copy to pinned memory is enqueued after the op; the flag
  // is read at the next synchronisation (synchronize, to_host, sum), which every step has, and a bad
  // target is reported there with the CPU backend's message.
  int* bad_row(const int32_t* targets, int M, int V) {
    int* bad = reinterpret_cast<int*>(static_cast<char*>(small_) + 64);
    if (cap_) {  // recorded: replay() arms the flag before a launch when it is not armed then
      cap_->has_ce = true;
      ce_.armed = true;
    } else if (!ce_.armed) {
      ck(cudaMemsetAsync(bad, 0x7f, sizeof(int), stream_), "crossentropy (flag)");  // 0x7f7f7f7f
      ce_.armed = true;
    }
    ce_.targets = targets;
    ce_.M = M;
    ce_.V = V;
    return bad;
  }
  // After the op: enqueue the flag's copy (read by check_targets once the stream is synchronised).
  void copy_bad_row() {
    int* bad = reinterpret_cast<int*>(static_cast<char*>(small_) + 64);
    int* hb = reinterpret_cast<int*>(static_cast<char*>(host_small_) + 64);
    ck(cudaMemcpyAsync(hb, bad, sizeof(int), cudaMemcpyDeviceToHost, stream_), "crossentropy (flag)");
  }
  // Called with the stream synchronised.
  void check_targets() {
    if (!ce_.armed) return;
    ce_.armed = false;
    const int row = *reinterpret_cast<int*>(static_cast<char*>(host_small_) + 64);
    if (row >= 0 && row < ce_.M) {
      int32_t t = 0;
      ck(cudaMemcpy(&t, ce_.targets + row, sizeof t, cudaMemcpyDeviceToHost), "crossentropy (target)");
      if (ce_.V == 0)  // segments
        throw Error(cat("crossentropy: target ", t, " of segment ", row,
                        " is outside its positions and is not the ignore index ", kIgnoreIndex));
      throw Error(cat("crossentropy: target ", t, " at row ", row, " is outside the vocabulary [0, ",
                      ce_.V, ") and is not the ignore index ", kIgnoreIndex));
    }
  }
  CeFlag ce_;

  int device_;
  bool sync_check_ = false;
  bool fused_ln_ = fused_layernorm_from_env();  // NLPTRAIN_CUDA_FUSED_LN (default 1)
  cuda::Bf16Operands bf16_operands_ = bf16_operands_from_env();  // NLPTRAIN_CUDA_BF16_CAST
  bool segment_ce_rows_ = segment_ce_rows_from_env();           // NLPTRAIN_CUDA_SEGMENT_CE
  bool native_bf16_acts_ = native_bf16_acts_from_env();         // NLPTRAIN_CUDA_BF16_ACTS
  std::unique_ptr<cuda::OpProfile> prof_;  // run.profile
  const char* label_ = nullptr;            // profile_label
  const char* cast_label_ = "cast: bf16 operands";
  std::set<std::string> labels_;
  std::map<const char*, std::pair<const char*, const char*>> label_ptrs_;  // caller's -> interned
  bool wcopy_on_ = false;          // run.bf16_weights with Precision::Bf16
  bool bf16_prec_ = false;         // Precision::Bf16
  bool head_dl16_ = false;         // NLPTRAIN_CUDA_HEAD_DLOGITS=bf16 (default) with Precision::Bf16
  bool head_w16_ = false;          // NLPTRAIN_CUDA_HEAD_WTE=bf16 (default) with Precision::Bf16
  bool head_online_ = true;        // NLPTRAIN_CUDA_HEAD_SOFTMAX=online (default)
  const float* warena_ = nullptr;  // the registered weights (register_weights)
  size_t wn_ = 0;
  uint16_t* wcopy_ = nullptr;      // their bf16 rounding (device)
  struct HeadWte {                 // the fused head's padded bf16 wte (head_wte)
    uint16_t* p = nullptr;         // device [cap]
    size_t cap = 0;
    const float* w = nullptr;      // the wte it holds, kept across calls; null: remade at the next
    int C = 0, V = 0, Vp = 0;
  } hw_;
  int64_t head_wte_builds_ = 0;    // padded copies made (recorded ones once, not per replay)
  cudaStream_t stream_ = nullptr;
  std::unique_ptr<cuda::Gemm> gemm_;
  std::unique_ptr<cuda::CudnnAttention> fused_;  // BackendOptions::fused_attention
  cuda::DeviceWorkspace ws_{"workspace"};
  void* small_ = nullptr;       // device: [0] double reduction result, [64] int bad row
  void* host_small_ = nullptr;  // pinned mirror
};

}  // namespace

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
  return std::make_unique<CudaBackend>(local_rank, options);
}

bool cuda_fused_attention_available(std::string* why) { return cuda::cudnn_attention_compiled(why); }

CudnnPackedCalls cuda_cudnn_packed_calls() {
  CudnnPackedCalls c;
  cuda::cudnn_packed_calls(&c.ragged, &c.bias);
  return c;
}

void* cuda_backend_stream(Backend& be) {
  auto* c = dynamic_cast<CudaBackend*>(&be);
  return c ? static_cast<void*>(c->stream()) : nullptr;
}

}  // namespace nlp
