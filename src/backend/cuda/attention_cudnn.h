// Fused scaled-dot-product attention (flash attention) forward and backward through the cuDNN
// frontend graph API: the CUDA backend's attention_forward/attention_backward when
// BackendOptions::fused_attention is on (model.attention = cudnn, or auto with bf16 precision).
// Private to src/backend/cuda/. Implemented in attention_cudnn.cpp when CMake found the cuDNN
// frontend headers and libcudnn (NLPTRAIN_HAVE_CUDNN), else by attention_cudnn_off.cpp.
//
// Arithmetic: q, k, v, the output and the gradients pass through bf16 (cuDNN's SDPA has no fp32
// I/O kernels); scores, softmax and accumulation are fp32 inside cuDNN. No [B,NH,T,T] tensor is ever
// stored: the backward recomputes the probabilities from the softmax statistics.
//
// Saved state, in the model's `att` buffer (sdpa_saved_floats; every part 256-byte aligned):
//   stats  fp32 [B,NH,T,1]  log-sum-exp of each score row (cuDNN's "Stats")
//   o      bf16 [B,T,C]     the forward output O (heads concatenated; the backward needs it)
//   qkv    bf16 [B,T,3C]    q | k | v, converted once in the forward, read again by the backward
// Backward scratch (sdpa_scratch_floats): dO bf16 [B,T,C] and dq | dk | dv bf16 [B,T,3C], which a
// kernel then ADDS to the fp32 dqkv (backward ops accumulate).
// Views: Q, K, V (and dQ, dK, dV) are [B,NH,T,HS] with strides [T*3C, HS, 3C, 1] at element offsets
// 0, C, 2C of the fused buffer; O and dO are [B,NH,T,HS] with strides [T*C, HS, C, 1].
//
// Packed rows (packed = true: attn_mask holds segment ids, backend.h) take one of two layouts:
//   ragged  cuDNN's THD layout: every example (a run of one segment id in a row) is its own cuDNN
//           sequence of at most T tokens, located by ragged offsets into the q|k|v and o buffers and
//           its length (kernels/sdpa_io.cu derives both from the segment ids), with cuDNN's padding
//           mask. No masked tile is computed, and the graph depends on (E, T), not on the row count
//           B, so a run whose rows have the file's length (data.padding = max_length) uses one graph.
//           Needs the example count `examples` (> 0) and a GPU cuDNN runs THD on (Hopper and later).
//           Padding tokens are in no sequence: their output is 0 (backend.h's rule would give them the
//           row's real keys; no model reads them) and no gradient flows from them.
//           The forward zeroes the saved stats and o first, and the q|k|v room past the B x T
//           tokens (the backward: dO's), so that tiles cuDNN may read past a sequence's end hold
//           zeros, not stale or NaN bytes.
//   bias    a materialised [B,1,T,T] block-diagonal bias from the segment rule: every tile computed.
// Ragged is tried first when `examples` > 0; if its graph does not build, bias (one stderr line).
// NLPTRAIN_CUDNN_PACKED=ragged|bias forces one (ragged then fails loudly where it does not build).
// The saved state and scratch of a packed call are laid out for max(B, examples) rows (the stats
// are [examples, NH, T]): the caller sizes them with attention_saved_floats(max(B, examples), ...).
// Neither layout has run on a GPU yet (see the CUDA README).
//
// Masks: causal = cuDNN's diagonal band (right bound 0, top-left aligned). The key padding mask
// attn_mask[B,T] (any 0/1 pattern) becomes an additive bf16 bias, 0 for a kept key and -1e9 for a
// masked one, one row of T per sequence built per call in the workspace (never kept): the forward
// reads it as [B,1,1,T] (broadcast over heads and queries), the backward as [B,1,T,T] with a zero
// query stride (cuDNN 9.19's backward accepted the [B,1,1,T] form and returned wrong gradients); a
// layout a cuDNN version rejects falls back to a materialised [B,1,T,T] bias. A query row whose keys
// are all masked would give cuDNN's uniform average over the masked keys; such rows (found from the
// first unmasked key of each sequence) get a zero output and no gradient, as on the native path.
//
// Dropout: cuDNN's own Philox generator with seed = the op's `seed` and offset 0, in the forward and
// again in the backward, so both see the same mask. It is NOT the native/CPU mask (core/rng.h index
// hash): comparisons against the CPU backend need attention dropout 0 or the native attention.
//
// Dropout seeds from device memory: forward/backward take `seed_slot` (nullable) after `seed`; when
// set, the Philox seed is copied from *seed_slot when the launches run (a replayed CUDA graph's value
// table, Backend::bind_slot) instead of taking `seed`.
// CUDA graph capture (the backend's capture_begin/capture_end): ops recorded while the backend's
// stream is capturing must not build a cuDNN graph or grow the workspace; either throws nlp::Error
// then instead (a recording would point into memory freed later). grows() and builds() count the
// workspace's reallocations and the graphs built, so the backend can tell whether the memory a
// recording points to is still current.
//
// Graphs (forward, backward) are built once per (B, T, NH, HS, causal, mask layout, dropout p) and
// cached with their workspace sizes; everything runs on the backend's stream. Which shapes cuDNN runs
// is decided once per (NH, HS), at the first B and T asked about, before the model sizes its buffers
// (supports()): the forward and backward graphs of the plain variant must build, else those heads
// keep the native kernels and one warning line goes to stderr. At exit one stderr line gives the
// number of graphs built and their host time (a run with changing batch lengths pays it in its steps).
#pragma once
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

namespace nlp::cuda {

// Whether attention_cudnn.cpp is compiled in; when not, *why (nullable) says what CMake lacked.
bool cudnn_attention_compiled(std::string* why);

// Packed-row calls (forward and backward each count one) run so far in this process in each layout:
// the tests check that a forced layout really ran. Zero in builds without cuDNN.
void cudnn_packed_calls(long* ragged, long* bias);

constexpr size_t kSdpaAlign = 256;  // bytes: alignment of every part of the saved state and scratch

inline size_t sdpa_align(size_t bytes) { return (bytes + kSdpaAlign - 1) / kSdpaAlign * kSdpaAlign; }

// Byte offsets of the saved state's parts from the 256-aligned base inside `att`; `total` includes
// the slack that aligning the base may consume.
struct SdpaSavedLayout {
  size_t stats = 0, o = 0, qkv = 0, total = 0;
};
inline SdpaSavedLayout sdpa_saved_layout(int B, int T, int NH, int HS) {
  const size_t BT = size_t(B) * T, C = size_t(NH) * HS;
  SdpaSavedLayout l;
  l.stats = 0;
  l.o = l.stats + sdpa_align(BT * NH * sizeof(float));  // stats [B,NH,T,1] fp32
  l.qkv = l.o + sdpa_align(BT * C * 2);                 // o [B,T,C] bf16
  l.total = l.qkv + sdpa_align(BT * 3 * C * 2)          // qkv [B,T,3C] bf16
            + kSdpaAlign;                               // base alignment slack
  return l;
}

// Byte offsets of the backward scratch's parts: dO bf16 [B,T,C], dqkv bf16 [B,T,3C].
struct SdpaScratchLayout {
  size_t dout = 0, dqkv = 0, total = 0;
};
inline SdpaScratchLayout sdpa_scratch_layout(int B, int T, int NH, int HS) {
  const size_t BT = size_t(B) * T, C = size_t(NH) * HS;
  SdpaScratchLayout l;
  l.dout = 0;
  l.dqkv = l.dout + sdpa_align(BT * C * 2);
  l.total = l.dqkv + sdpa_align(BT * 3 * C * 2) + kSdpaAlign;
  return l;
}

inline size_t sdpa_saved_floats(int B, int T, int NH, int HS) {
  return (sdpa_saved_layout(B, T, NH, HS).total + sizeof(float) - 1) / sizeof(float);
}
inline size_t sdpa_scratch_floats(int B, int T, int NH, int HS) {
  return (sdpa_scratch_layout(B, T, NH, HS).total + sizeof(float) - 1) / sizeof(float);
}

// ---- bf16 I/O (activations stored as bf16: forward_bf16 / backward_bf16) ----------------------------
// cuDNN reads q|k|v in place from the caller's qkv [B,T,3C] (the strides above), writes O straight into
// the caller's out [B,T,C], reads dO from dout [B,T,C] and writes dq|dk|dv into dqkv [B,T,3C], all
// bf16 with those same strides: no conversion, no copy of the activations in the saved state.
// What the backward needs to stay valid: the caller keeps qkv and out unchanged from the forward to
// the backward and hands both to it (Backend::attention_backward takes the forward's out; the model's
// activation arena keeps both: they are inputs of later ops' backwards).
// Rows that see no key (sdpa_io.cu) are zeroed in out after cuDNN wrote it; the backward then reads
// O = 0 on those rows, which changes nothing: their dO is zeroed too, so they contribute no gradient.
// Saved state: the stats only, fp32 [R,NH,T,1] with R = max(B, examples) (sdpa_saved_floats_bf16).
// Backward scratch: dO bf16 [R,T,C], used only when dout cannot be read in place:
//   - a key padding mask or packed rows in the bias layout: the dead rows of dO must be zeroed, and
//     which rows are dead is known on the device only, so dout is copied with them zeroed;
//   - packed rows in the ragged layout with examples > B (below).
//   Plain and causal calls without a mask read dout in place and leave the scratch unused.
// dqkv: write mode (accumulate = false: the op is dqkv's only writer) has cuDNN write dq|dk|dv into
// dqkv directly (rows of dead queries and masked keys get exact zeros, since their dO is 0 and their
// probabilities underflow to 0; ragged padding tokens, which cuDNN does not write, are zeroed after);
// accumulate = true has cuDNN write into a bf16 temporary in the workspace that a kernel then adds
// (fp32 sum, one rounding) to dqkv.
// Packed rows, ragged layout: with examples <= B the E sequences' extent (E x T tokens) lies inside
// the caller's B x T buffers and everything runs in place (padding tokens of out zeroed after the
// forward; those of dqkv zeroed in write mode, untouched when accumulating). With examples > B cuDNN's
// tiles may address up to E x T tokens, past the end of the caller's buffers: q|k|v, O, dO and
// dq|dk|dv are then staged through copies of max(B, examples) x T tokens whose room past the B x T
// tokens is zeroed (q|k|v, O and the dq|dk|dv staging in the workspace, dO in the scratch), as the
// fp32-I/O path does.
// Every bf16 pointer must be 16-byte aligned and C a multiple of 8 (cuDNN's operand alignment: k and
// v start 2C and 4C bytes after q in each row); a call that breaks this throws nlp::Error naming it.
// The graphs are those of the fp32-I/O path (cuDNN sees bf16 either way), cached under a key that
// also holds the I/O type; the two keys of a variant share one built graph.
inline size_t sdpa_saved_floats_bf16(int B, int T, int NH, int HS) {
  (void)HS;
  return (sdpa_align(size_t(B) * T * NH * sizeof(float)) + kSdpaAlign + sizeof(float) - 1) /
         sizeof(float);
}
inline size_t sdpa_scratch_floats_bf16(int B, int T, int NH, int HS) {
  const size_t C = size_t(NH) * HS;
  return (sdpa_align(size_t(B) * T * C * 2) + kSdpaAlign + sizeof(float) - 1) / sizeof(float);
}

// One per CUDA backend. Not thread-safe (neither is the backend).
class CudnnAttention {
 public:
  // Creates the cuDNN handle on the current device and binds it to `stream`. Throws nlp::Error.
  explicit CudnnAttention(cudaStream_t stream);
  ~CudnnAttention();
  CudnnAttention(const CudnnAttention&) = delete;
  CudnnAttention& operator=(const CudnnAttention&) = delete;

  // Whether cuDNN runs attention of this shape: decided on the first call for (NH, HS) by building
  // the forward and backward graphs of the plain variant at this B and T (no mask, no dropout; kept
  // in the cache), then cached for every B and T.
  // A "no" (cuDNN reports the configuration unsupported) prints one line to stderr; the caller then
  // uses its native kernels for this shape, in sizing and in dispatch alike.
  bool supports(int B, int T, int NH, int HS);

  // As Backend::attention_forward, for a shape with supports() true: `saved` holds
  // sdpa_saved_floats(B, T, NH, HS) floats (any 4-byte alignment); out[B,T,C] fp32.
  // packed: attn_mask holds segment ids; examples: their number of runs (0 = not counted).
  void forward(float* out, float* saved, const float* qkv, const int32_t* attn_mask, bool packed,
               int examples, bool causal, float dropout_p, uint64_t seed, const uint64_t* seed_slot,
               int B, int T, int NH, int HS);
  // As Backend::attention_backward: dqkv[B,T,3C] += ...; `saved` as written by forward() with the
  // same arguments; `scratch` holds sdpa_scratch_floats(B, T, NH, HS) floats.
  void backward(float* dqkv, float* scratch, const float* dout, const float* saved,
                const int32_t* attn_mask, bool packed, int examples, bool causal, float dropout_p,
                uint64_t seed, const uint64_t* seed_slot, int B, int T, int NH, int HS);

  // bf16 I/O (see above): qkv [B,T,3C] and out [B,T,C] are __nv_bfloat16 device memory; `saved` holds
  // sdpa_saved_floats_bf16(max(B, examples), T, NH, HS) floats (any 4-byte alignment). Other
  // arguments as forward().
  void forward_bf16(void* out, float* saved, const void* qkv, const int32_t* attn_mask, bool packed,
                    int examples, bool causal, float dropout_p, uint64_t seed,
                    const uint64_t* seed_slot, int B, int T, int NH, int HS);
  // dqkv[B,T,3C] (bf16) = (accumulate: +=) d attention / d qkv. qkv and out: the forward's, unchanged
  // since (the backend's attention_backward is handed both); saved: as written by forward_bf16 with
  // the same arguments; dout [B,T,C] bf16; scratch holds sdpa_scratch_floats_bf16(max(B, examples),
  // T, NH, HS) floats.
  void backward_bf16(void* dqkv, bool accumulate, float* scratch, const void* dout, const void* qkv,
                     const void* out, const float* saved, const int32_t* attn_mask, bool packed,
                     int examples, bool causal, float dropout_p, uint64_t seed,
                     const uint64_t* seed_slot, int B, int T, int NH, int HS);
  // Reallocations of the grow-only workspace so far (a recording made before the last one points
  // into freed memory), and cuDNN graphs built or declined so far.
  long grows() const;
  long builds() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace nlp::cuda
