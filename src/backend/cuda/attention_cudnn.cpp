// cuDNN frontend implementation of attention_cudnn.h: graph construction and caching, the variant
// packs of the forward and backward SDPA graphs, and the conversions around them (kernels/sdpa_io.cu,
// kernels/convert.cu). Compiled only when CMake found the cuDNN frontend (NLPTRAIN_HAVE_CUDNN); the
// only file that includes cudnn_frontend.h (slow to compile: ~1 minute).
#include "backend/cuda/attention_cudnn.h"

#include <cudnn.h>
#include <cudnn_frontend.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <initializer_list>
#include <map>
#include <set>
#include <tuple>
#include <unordered_map>
#include <vector>

#include "kernels.cuh"  // kernels/ (an include directory of CUDA builds)
#include "backend/cuda/device_workspace.h"
#include "core/error.h"

namespace nlp::cuda {

bool cudnn_attention_compiled(std::string* why) {
  if (why) why->clear();
  return true;
}

namespace {
std::atomic<long> g_packed_ragged{0}, g_packed_bias{0};  // cudnn_packed_calls()

void count_packed(bool ragged) { (ragged ? g_packed_ragged : g_packed_bias).fetch_add(1); }
}  // namespace

void cudnn_packed_calls(long* ragged, long* bias) {
  *ragged = g_packed_ragged.load();
  *bias = g_packed_bias.load();
}

namespace {

namespace fe = cudnn_frontend;
using TA = fe::graph::Tensor_attributes;
using Shape4 = std::vector<int64_t>;

// Graph tensor uids: the variant pack maps them to device pointers.
enum Uid : int64_t {
  kQ = 1, kK, kV, kO, kStats, kBias, kSeed, kOffset, kDO, kDQ, kDK, kDV,
  kRagQ, kRagK, kRagV, kRagO, kSeqQ, kSeqKV  // ragged layout: offsets [E+1], lengths [E]
};

// How the mask reaches cuDNN: an additive bf16 bias (0 kept, -1e9 masked) as
//   Key       dims [B,1,1,T], strides [ld, ld, ld, 1]   one row per sequence, broadcast by cuDNN
//   KeyRows0  dims [B,1,T,T], strides [ld, ld, 0, 1]    the same [B,ld] rows; the query dim broadcast
//                                                       by a zero stride (as torch's expand() does)
//   Full      dims [B,1,T,T], strides [T*ld, T*ld, ld, 1], materialised per call
// The bias buffer holds [B, rows, ld] elements: rows = T for Full, else 1. Key padding takes the first
// of these that builds; packed rows (segment ids: a block-diagonal mask, which no broadcast row can
// express) take Ragged (no bias: each example is a cuDNN sequence, attention_cudnn.h) or Full, whose
// rows follow backend.h's segment rule (kernels/sdpa_io.cu).
enum class MaskKind { None = 0, Key = 1, KeyRows0 = 2, Full = 3, Ragged = 4 };

const char* mask_name(MaskKind m) {
  switch (m) {
    case MaskKind::None: return "none";
    case MaskKind::Key: return "key";
    case MaskKind::KeyRows0: return "key0";
    case MaskKind::Full: return "full";
    case MaskKind::Ragged: return "ragged";
  }
  return "?";
}

// What a cached graph computes. Ragged: E sequences of at most T tokens, B = 0 (the graph does not
// depend on the number of rows they are packed in). bf16_io: the graph of forward_bf16/backward_bf16,
// cached under its own key; its cuDNN tensors are today those of the fp32-I/O path (the calls bind
// the caller's bf16 buffers instead of converted copies), so plan() shares one built graph between
// the two keys of a variant.
struct Key {
  int B = 0, T = 0, NH = 0, HS = 0;
  bool causal = false;
  MaskKind mask = MaskKind::None;
  float p = 0.f;  // dropout probability; 0 = no dropout node
  int E = 0;      // Ragged: sequences (examples)
  bool bf16_io = false;
  auto tie() const { return std::tuple(B, T, NH, HS, causal, int(mask), p, E, bf16_io); }
  bool operator<(const Key& o) const { return tie() < o.tie(); }
};

std::string describe_shape(const Key& k);

std::string describe(const Key& k) { return describe_shape(k) + (k.bf16_io ? ", bf16 I/O" : ""); }

std::string describe_shape(const Key& k) {
  if (k.mask == MaskKind::Ragged)
    return cat("packed rows as ", k.E, " ragged (THD) sequences of at most T=", k.T, " NH=", k.NH,
               " HS=", k.HS, ", ", k.causal ? "causal" : "not causal", ", dropout ", k.p);
  const char* mask = k.mask == MaskKind::None       ? "no key mask"
                     : k.mask == MaskKind::Key      ? "key mask as a [B,1,1,T] bias"
                     : k.mask == MaskKind::KeyRows0 ? "key mask as a [B,1,T,T] bias of zero query stride"
                                                    : "mask as a materialised [B,1,T,T] bias";
  return cat("B=", k.B, " T=", k.T, " NH=", k.NH, " HS=", k.HS, ", ",
             k.causal ? "causal" : "not causal", ", ", mask, ", dropout ", k.p);
}

// Row stride of the bias in elements: rows of a multiple of 16 bytes (cuDNN's operand alignment).
int64_t bias_ld(int T) { return (int64_t(T) + 7) / 8 * 8; }

// A built graph (graph == nullptr: the build failed with `error`; failures are cached too).
struct Plan {
  std::shared_ptr<fe::graph::Graph> graph;
  int64_t workspace = 0;       // bytes
  bool deterministic = false;  // backward: cuDNN's deterministic algorithm
  std::string error;
};

fe::error_t build_graph(cudnnHandle_t handle, const Key& k, bool backward, bool deterministic,
                        Plan& out) {
  auto g = std::make_shared<fe::graph::Graph>();
  g->set_io_data_type(fe::DataType_t::BFLOAT16)
      .set_intermediate_data_type(fe::DataType_t::FLOAT)
      .set_compute_data_type(fe::DataType_t::FLOAT);
  const bool ragged = k.mask == MaskKind::Ragged;
  const int64_t B = ragged ? k.E : k.B, T = k.T, H = k.NH, D = k.HS, C = H * D;
  const Shape4 dims{B, H, T, D};
  const Shape4 qkv_stride{T * 3 * C, D, 3 * C, 1};  // heads of the fused [B,T,3C] buffer
  const Shape4 o_stride{T * C, D, C, 1};            // heads of a [B,T,C] buffer
  const Shape4 stats_dims{B, H, T, 1}, stats_stride{H * T, T, 1, 1};
  auto tensor = [&](const char* name, Uid uid, const Shape4& d, const Shape4& s, fe::DataType_t t) {
    return g->tensor(TA().set_name(name).set_uid(uid).set_dim(d).set_stride(s).set_data_type(t));
  };
  const auto bf16 = fe::DataType_t::BFLOAT16;
  auto Q = tensor("Q", kQ, dims, qkv_stride, bf16);
  auto K = tensor("K", kK, dims, qkv_stride, bf16);
  auto V = tensor("V", kV, dims, qkv_stride, bf16);
  // Ragged (THD): each of the E sequences starts at its offset (elements) into the token-major
  // buffer, so the batch stride above is not used; lengths [E] drive cuDNN's padding mask.
  std::shared_ptr<TA> rag_q, rag_k, rag_v, rag_o, seq_q, seq_kv;
  if (ragged) {
    auto offsets = [&](const char* name, Uid uid) {
      return tensor(name, uid, {B + 1, 1, 1, 1}, {1, 1, 1, 1}, fe::DataType_t::INT64);
    };
    rag_q = offsets("Q_ragged_offset", kRagQ);
    rag_k = offsets("K_ragged_offset", kRagK);
    rag_v = offsets("V_ragged_offset", kRagV);
    rag_o = offsets("O_ragged_offset", kRagO);
    Q->set_ragged_offset(rag_q);
    K->set_ragged_offset(rag_k);
    V->set_ragged_offset(rag_v);
    seq_q = tensor("seq_len_q", kSeqQ, {B, 1, 1, 1}, {1, 1, 1, 1}, fe::DataType_t::INT32);
    seq_kv = tensor("seq_len_kv", kSeqKV, {B, 1, 1, 1}, {1, 1, 1, 1}, fe::DataType_t::INT32);
  }
  std::shared_ptr<TA> bias, seed, offset;
  const int64_t ld = bias_ld(k.T);
  if (k.mask == MaskKind::Key) bias = tensor("bias", kBias, {B, 1, 1, T}, {ld, ld, ld, 1}, bf16);
  if (k.mask == MaskKind::KeyRows0) bias = tensor("bias", kBias, {B, 1, T, T}, {ld, ld, 0, 1}, bf16);
  if (k.mask == MaskKind::Full)
    bias = tensor("bias", kBias, {B, 1, T, T}, {T * ld, T * ld, ld, 1}, bf16);
  if (k.p > 0.f) {
    seed = tensor("philox_seed", kSeed, {1, 1, 1, 1}, {1, 1, 1, 1}, fe::DataType_t::INT64);
    offset = tensor("philox_offset", kOffset, {1, 1, 1, 1}, {1, 1, 1, 1}, fe::DataType_t::INT64);
  }
  const float scale = 1.0f / std::sqrt(float(k.HS));
  if (!backward) {
    auto opt = fe::graph::SDPA_attributes().set_name("sdpa_forward").set_generate_stats(true);
    opt.set_attn_scale(scale);
    if (k.causal)
      opt.set_diagonal_alignment(fe::DiagonalAlignment_t::TOP_LEFT).set_diagonal_band_right_bound(0);
    if (bias) opt.set_bias(bias);
    if (seed) opt.set_dropout(k.p, seed, offset);
    if (ragged) opt.set_padding_mask(true).set_seq_len_q(seq_q).set_seq_len_kv(seq_kv);
    auto [O, Stats] = g->sdpa(Q, K, V, opt);
    O->set_output(true).set_uid(kO).set_dim(dims).set_stride(o_stride).set_data_type(bf16);
    if (ragged) O->set_ragged_offset(rag_o);
    Stats->set_output(true)
        .set_uid(kStats)
        .set_dim(stats_dims)
        .set_stride(stats_stride)
        .set_data_type(fe::DataType_t::FLOAT);
  } else {
    auto O = tensor("O", kO, dims, o_stride, bf16);
    auto dO = tensor("dO", kDO, dims, o_stride, bf16);
    if (ragged) {
      O->set_ragged_offset(rag_o);
      dO->set_ragged_offset(rag_o);
    }
    auto Stats = tensor("Stats", kStats, stats_dims, stats_stride, fe::DataType_t::FLOAT);
    auto opt = fe::graph::SDPA_backward_attributes().set_name("sdpa_backward");
    opt.set_attn_scale(scale).set_deterministic_algorithm(deterministic);
    if (k.causal)
      opt.set_diagonal_alignment(fe::DiagonalAlignment_t::TOP_LEFT).set_diagonal_band_right_bound(0);
    if (bias) opt.set_bias(bias);
    if (seed) opt.set_dropout(k.p, seed, offset);
    if (ragged) opt.set_padding_mask(true).set_seq_len_q(seq_q).set_seq_len_kv(seq_kv);
    auto [dQ, dK, dV] = g->sdpa_backward(Q, K, V, O, dO, Stats, opt);
    dQ->set_output(true).set_uid(kDQ).set_dim(dims).set_stride(qkv_stride).set_data_type(bf16);
    dK->set_output(true).set_uid(kDK).set_dim(dims).set_stride(qkv_stride).set_data_type(bf16);
    dV->set_output(true).set_uid(kDV).set_dim(dims).set_stride(qkv_stride).set_data_type(bf16);
    if (ragged) {  // the gradients lie in the q|k|v layout of the inputs
      dQ->set_ragged_offset(rag_q);
      dK->set_ragged_offset(rag_k);
      dV->set_ragged_offset(rag_v);
    }
  }
  fe::error_t st = g->validate();
  if (st.is_good()) st = g->build_operation_graph(handle);
  if (st.is_good()) st = g->create_execution_plans({fe::HeurMode_t::A, fe::HeurMode_t::FALLBACK});
  if (st.is_good()) st = g->check_support(handle);
  if (st.is_good()) st = g->build_plans(handle, fe::BuildPlanPolicy_t::HEURISTICS_CHOICE);
  int64_t ws = 0;
  if (st.is_good()) st = g->get_workspace_size(ws);
  if (st.is_bad()) return st;
  out.graph = std::move(g);
  out.workspace = ws;
  out.deterministic = deterministic;
  return st;
}

// build_graph with the frontend's exceptions (it throws on a few paths) turned into an error
Plan try_build(cudnnHandle_t handle, const Key& k, bool backward, bool deterministic) {
  Plan p;
  try {
    fe::error_t st = build_graph(handle, k, backward, deterministic, p);
    if (st.is_bad()) {
      p.graph.reset();
      p.error = st.get_message().empty() ? "error code " + std::to_string(int(st.get_code()))
                                         : st.get_message();
    }
  } catch (const std::exception& e) {
    p.graph.reset();
    p.error = e.what();
  }
  return p;
}

void ck_cuda(cudaError_t e, const char* what) {
  if (e != cudaSuccess) {
    cudaGetLastError();
    throw Error(cat("cuDNN attention: ", what, ": ", cudaGetErrorName(e), " (", cudaGetErrorString(e),
                    ")"));
  }
}

void ck_cudnn(cudnnStatus_t s, const char* what) {
  if (s != CUDNN_STATUS_SUCCESS)
    throw Error(cat("cuDNN attention: ", what, " failed: ", cudnnGetErrorString(s)));
}

// p rounded up to the next multiple of kSdpaAlign
template <typename P>
char* align_up(P* p) {
  const uintptr_t a = reinterpret_cast<uintptr_t>(p);
  return reinterpret_cast<char*>((a + kSdpaAlign - 1) / kSdpaAlign * kSdpaAlign);
}

}  // namespace

struct CudnnAttention::Impl {
  cudaStream_t stream = nullptr;
  cudnnHandle_t handle = nullptr;
  std::map<Key, Plan> forward, backward;
  std::map<std::pair<int, int>, bool> support;  // (NH, HS) -> cuDNN runs it (supports())
  int graphs_built = 0, graphs_declined = 0;    // try_build calls, with and without a graph
  double build_seconds = 0;                     // host time in them (heuristics, plan building)
  // masked variant (key.mask ignored) -> the bias layout in use, per direction
  std::map<Key, MaskKind> mask_forward, mask_backward;
  std::set<Key> ragged_refused;  // ragged variants already reported as not building
  DeviceWorkspace ws{"workspace"};   // grow-only: cuDNN workspace | bias | first keys (grows())
  int64_t* philox = nullptr;  // device [2]: Philox seed, offset of the dropout

  // Whether the stream is being captured into a CUDA graph (the backend's capture_begin): building
  // a graph or growing ws then would leave the recording pointing into memory freed later (and
  // cuDNN's plan building may call what a capture forbids), so both refuse with an nlp::Error.
  bool capturing() const {
    cudaStreamCaptureStatus st = cudaStreamCaptureStatusNone;
    if (cudaStreamIsCapturing(stream, &st) != cudaSuccess) {
      cudaGetLastError();
      return false;
    }
    return st != cudaStreamCaptureStatusNone;
  }

  // The cached graph of `k`, built on first use; failures are cached (graph == nullptr).
  const Plan& plan(const Key& k, bool is_backward) {
    auto& cache = is_backward ? backward : forward;
    auto it = cache.find(k);
    if (it != cache.end()) return it->second;
    // the other I/O type's graph of the same variant is the same cuDNN graph (Key): shared, so that
    // a bf16 run builds neither the plain graphs supports() built nor a variant that already failed
    Key twin = k;
    twin.bf16_io = !k.bf16_io;
    auto t = cache.find(twin);
    if (t != cache.end()) return cache.emplace(k, t->second).first->second;
    if (capturing())
      throw Error(cat("cuDNN attention ", is_backward ? "backward" : "forward", " (", describe(k),
                      "): its cuDNN graph would be built while recording a CUDA graph; run the "
                      "op once before recording"));
    Plan p = timed_build(k, is_backward, /*deterministic=*/is_backward);
    if (is_backward && !p.graph) {  // no deterministic backward for this variant: the other one
      Plan q = timed_build(k, true, false);
      if (q.graph)
        std::fprintf(stderr,
                     "nlptrain: cuDNN attention backward (%s) has no deterministic algorithm (%s): "
                     "its gradients are not bitwise reproducible run to run\n",
                     describe(k).c_str(), p.error.c_str());
      p = std::move(q);
    }
    return cache.emplace(k, std::move(p)).first->second;
  }

  Plan timed_build(const Key& k, bool is_backward, bool deterministic) {
    const auto t0 = std::chrono::steady_clock::now();
    Plan p = try_build(handle, k, is_backward, deterministic);
    build_seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    ++(p.graph ? graphs_built : graphs_declined);
    return p;
  }

  // A bf16 buffer of `width` values per token laid out for max(B, examples) rows of T tokens (packed
  // calls): zeroes what lies past the B x T tokens a call writes
  void zero_room(char* buf, int B, int examples, int T, size_t width, const char* what) {
    const size_t used = size_t(B) * T * width * 2;
    const size_t room = sdpa_align(size_t(std::max(B, examples)) * T * width * 2);
    if (room > used) ck_cuda(cudaMemsetAsync(buf + used, 0, room - used, stream), what);
  }

  // The plan of `k` or an nlp::Error naming the variant
  const Plan& require(const Key& k, bool is_backward) {
    const Plan& p = plan(k, is_backward);
    if (!p.graph)
      throw Error(cat("cuDNN attention ", is_backward ? "backward" : "forward", " (", describe(k),
                      "): no cuDNN engine: ", p.error,
                      "; run with model.attention = native"));
    return p;
  }

  // The graph key of a call. A masked call takes the first bias layout of mask_layouts() whose
  // graph builds for that direction, decided once per variant; packed rows take packed_layout()
  // (require() then reports a variant that does not build).
  Key key_of(int B, int T, int NH, int HS, bool causal, bool masked, bool packed, int examples,
             float p, bool is_backward, bool bf16_io = false) {
    Key k{B, T, NH, HS, causal, MaskKind::None, p > 0.f ? p : 0.f};
    k.bf16_io = bf16_io;
    if (packed) return packed_key(k, examples);
    if (!masked) return k;
    auto& chosen = is_backward ? mask_backward : mask_forward;
    auto it = chosen.find(k);
    if (it != chosen.end()) {
      k.mask = it->second;
      return k;
    }
    const std::vector<MaskKind> layouts = mask_layouts(is_backward);
    std::string why;
    for (MaskKind m : layouts) {
      Key km = k;
      km.mask = m;
      const Plan& pl = plan(km, is_backward);
      if (pl.graph) {
        if (m != layouts.front())
          std::fprintf(stderr, "nlptrain: cuDNN attention %s (%s): %s\n",
                       is_backward ? "backward" : "forward", describe(km).c_str(),
                       cat("the preferred mask layout failed (", why, ")").c_str());
        chosen.emplace(k, m);
        return km;
      }
      why = pl.error;
    }
    throw Error(cat("cuDNN attention ", is_backward ? "backward" : "forward", " (", describe(k),
                    "): no cuDNN engine for a key padding mask: ", why,
                    "; run with model.attention = native"));
  }

  // Packed rows: Ragged (E = examples sequences, B = 0) when the examples are counted, not forced
  // off by NLPTRAIN_CUDNN_PACKED=bias, and its forward and backward graphs build (else one line to
  // stderr, and Full); NLPTRAIN_CUDNN_PACKED=ragged keeps Ragged even when it does not build, so
  // require() names cuDNN's reason.
  Key packed_key(const Key& k, int examples) {
    const std::string force = packed_force();
    Key full = k;
    full.mask = MaskKind::Full;
    if (force == "bias") return full;
    if (examples <= 0) {
      if (force == "ragged")
        throw Error("cuDNN attention: NLPTRAIN_CUDNN_PACKED = ragged, but the caller did not count "
                    "the examples of the packed rows");
      return full;
    }
    Key r = k;
    r.B = 0;
    r.E = examples;
    r.mask = MaskKind::Ragged;
    if (force == "ragged") return r;
    // both directions or neither: the saved state of the two layouts differs (stats [E,NH,T] against
    // [B,NH,T]), so the backward must take the forward's layout
    const Plan& f = plan(r, false);
    const Plan& b = f.graph ? plan(r, true) : f;
    if (f.graph && b.graph) return r;
    Key reported = r;  // one line per variant, whichever I/O type asked first
    reported.bf16_io = false;
    if (ragged_refused.insert(reported).second)
      std::fprintf(stderr,
                   "nlptrain: cuDNN attention (%s): the ragged layout does not build (%s: %s); "
                   "packed rows take a block-diagonal bias instead\n",
                   describe(r).c_str(), f.graph ? "backward" : "forward",
                   (f.graph ? b.error : f.error).c_str());
    return full;
  }

  // NLPTRAIN_CUDNN_PACKED ("", ragged or bias), read and checked at every packed call: a process
  // may change it between calls (the tests force each layout in turn on one backend)
  static std::string packed_force() {
    const char* env = std::getenv("NLPTRAIN_CUDNN_PACKED");
    std::string v = env ? env : "";
    if (!v.empty() && v != "ragged" && v != "bias")
      throw Error(cat("NLPTRAIN_CUDNN_PACKED = '", v, "': expected ragged or bias"));
    return v;
  }

  // Bias layouts to try, in order. The forward broadcasts one row per sequence ([B,1,1,T]). The
  // backward gets the query dimension spelled out: a cuDNN 9 backward took a [B,1,1,T] bias without
  // complaint and computed wrong gradients (H100, checked by CudaOpsCudnn.PaddingMaskMatchesCpu).
  // NLPTRAIN_CUDNN_MASK_BIAS=<forward>,<backward> (each key, key0 or full) forces a layout, to check
  // another cuDNN version.
  std::vector<MaskKind> mask_layouts(bool is_backward) {
    const char* env = std::getenv("NLPTRAIN_CUDNN_MASK_BIAS");
    if (env && *env) {
      const std::string v(env);
      const size_t comma = v.find(',');
      const std::string want = is_backward ? (comma == std::string::npos ? v : v.substr(comma + 1))
                                           : v.substr(0, comma);
      for (MaskKind m : {MaskKind::Key, MaskKind::KeyRows0, MaskKind::Full})
        if (want == mask_name(m)) return {m};
      throw Error(cat("NLPTRAIN_CUDNN_MASK_BIAS = '", v,
                      "': expected <forward>,<backward>, each key, key0 or full"));
    }
    if (is_backward) return {MaskKind::KeyRows0, MaskKind::Full};
    return {MaskKind::Key, MaskKind::KeyRows0, MaskKind::Full};
  }

  // Device scratch for one call: cuDNN's workspace, then (masked calls) the bias [B,rows,ld] bf16
  // and the first unmasked key of each sequence [B] int32, or (ragged calls) the offsets into q|k|v
  // and o [E+1] int64 and the lengths [E] int32.
  // `extra` bytes (bf16-I/O calls: staging copies, a gradient temporary) follow at cb.extra.
  struct CallBuffers {
    void* workspace = nullptr;
    void* bias = nullptr;
    int32_t* first = nullptr;
    int rows = 0;
    int64_t *off_qkv = nullptr, *off_o = nullptr;
    int32_t* seqlen = nullptr;
    char* extra = nullptr;
  };
  CallBuffers buffers(const Plan& p, const Key& k, size_t extra = 0) {
    CallBuffers cb;
    const size_t wsb = sdpa_align(size_t(p.workspace));
    extra = sdpa_align(extra);
    if (k.mask == MaskKind::Ragged) {
      const size_t off = sdpa_align((size_t(k.E) + 1) * sizeof(int64_t));
      const size_t len = sdpa_align(size_t(k.E) * sizeof(int32_t));
      char* base = static_cast<char*>(grow(wsb + 2 * off + len + extra));
      cb.workspace = p.workspace > 0 ? base : nullptr;
      cb.off_qkv = reinterpret_cast<int64_t*>(base + wsb);
      cb.off_o = reinterpret_cast<int64_t*>(base + wsb + off);
      cb.seqlen = reinterpret_cast<int32_t*>(base + wsb + 2 * off);
      if (extra) cb.extra = base + wsb + 2 * off + len;
      return cb;
    }
    cb.rows = k.mask == MaskKind::Full ? k.T : 1;
    const size_t bias_bytes =
        k.mask == MaskKind::None ? 0 : sdpa_align(size_t(k.B) * cb.rows * bias_ld(k.T) * 2);
    const size_t first_bytes = k.mask == MaskKind::None ? 0 : sdpa_align(size_t(k.B) * 4);
    char* base = static_cast<char*>(grow(wsb + bias_bytes + first_bytes + extra));
    cb.workspace = p.workspace > 0 ? base : nullptr;
    if (k.mask != MaskKind::None) {
      cb.bias = base + wsb;
      cb.first = reinterpret_cast<int32_t*>(base + wsb + bias_bytes);
    }
    if (extra) cb.extra = base + wsb + bias_bytes + first_bytes;
    return cb;
  }

  // dst[room] = src[used] then zeros (bf16-I/O staging of a ragged call's buffer; used <= room)
  void stage(char* dst, const void* src, size_t used, size_t room, const char* what) {
    ck_cuda(cudaMemcpyAsync(dst, src, used, cudaMemcpyDeviceToDevice, stream), what);
    if (room > used) ck_cuda(cudaMemsetAsync(dst + used, 0, room - used, stream), what);
  }

  // One bf16-I/O call (forward_bf16, backward_bf16): its variant and graph (require: throws when
  // cuDNN has none), whether it is ragged and staged (attention_cudnn.h: E x T tokens past the
  // buffers), and the rooms of the staged q|k|v [R,T,3C] and O [R,T,C] (bf16, R = max(B, examples))
  struct Bf16Call {
    Key k;
    const Plan* p = nullptr;
    bool ragged = false, staged = false;
    size_t qkv_room = 0, o_room = 0;
  };
  Bf16Call bf16_call(int B, int T, int NH, int HS, bool causal, bool masked, bool packed,
                     int examples, float dropout_p, bool is_backward) {
    const int C = NH * HS;
    const int R = std::max(B, examples);
    Bf16Call c{key_of(B, T, NH, HS, causal, masked, packed, examples, dropout_p, is_backward,
                      /*bf16_io=*/true)};
    c.p = &require(c.k, is_backward);
    c.ragged = c.k.mask == MaskKind::Ragged;
    c.staged = c.ragged && examples > B;
    c.qkv_room = sdpa_align(size_t(R) * T * 3 * C * 2);
    c.o_room = sdpa_align(size_t(R) * T * C * 2);
    return c;
  }

  // The grow-only buffer (stream order makes reuse by the next call safe).
  void* grow(size_t bytes) {
    return ws.get(
        bytes, stream,
        [this](size_t held, size_t want) {
          if (capturing())
            throw Error(cat("cuDNN attention: the workspace would grow from ", held, " to ", want,
                            " bytes while recording a CUDA graph; run the op once before recording"));
        },
        ck_cuda);
  }

  // Mask bias and first keys (masked calls), ragged offsets and lengths (ragged calls; the rows are
  // B x T tokens), Philox arguments (dropout)
  void prepare(const Key& k, const CallBuffers& cb, const int32_t* mask, uint64_t seed,
               const uint64_t* seed_slot, int B) {
    if (k.mask == MaskKind::Ragged)
      ck_cuda(kern::sdpa_ragged_offsets(cb.off_qkv, cb.off_o, cb.seqlen, mask, B, k.T, k.E,
                                        k.NH * k.HS, stream),
              "ragged offsets");
    else if (k.mask != MaskKind::None)
      ck_cuda(kern::sdpa_mask_bias(cb.bias, cb.first, mask, k.B, k.T, cb.rows, int(bias_ld(k.T)),
                                   stream),
              "mask bias");
    if (k.p > 0.f)
      ck_cuda(kern::sdpa_philox_args(philox, seed, seed_slot, 0, stream), "dropout seed");
  }

  void execute(const Plan& p, const Key& k, std::unordered_map<int64_t, void*>& pack,
               const CallBuffers& cb, const char* what) {
    if (k.mask == MaskKind::Ragged) {
      for (Uid u : {kRagQ, kRagK, kRagV}) pack[u] = cb.off_qkv;
      pack[kRagO] = cb.off_o;
      pack[kSeqQ] = cb.seqlen;
      pack[kSeqKV] = cb.seqlen;
    } else if (k.mask != MaskKind::None) {
      pack[kBias] = cb.bias;
    }
    if (k.p > 0.f) {
      pack[kSeed] = philox;
      pack[kOffset] = philox + 1;
    }
    fe::error_t st = p.graph->execute(handle, pack, cb.workspace);
    if (st.is_bad())
      throw Error(cat("cuDNN attention ", what, " (", describe(k), "): execute failed: ",
                      st.get_message()));
  }
};

CudnnAttention::CudnnAttention(cudaStream_t stream) : impl_(std::make_unique<Impl>()) {
  impl_->stream = stream;
  ck_cudnn(cudnnCreate(&impl_->handle), "cudnnCreate");
  ck_cudnn(cudnnSetStream(impl_->handle, stream), "cudnnSetStream");
  ck_cuda(cudaMalloc(&impl_->philox, 2 * sizeof(int64_t)), "cudaMalloc(dropout seed)");
}

CudnnAttention::~CudnnAttention() {
  if (!impl_) return;
  // what the graphs cost: host time before the first step of each new shape or variant, inside the
  // step times of a run whose batch length changes (data.padding = longest)
  if (impl_->graphs_built + impl_->graphs_declined > 0)
    std::fprintf(stderr, "nlptrain: cuDNN attention: %d graph(s) built, %d declined, %.2f s of host time\n",
                 impl_->graphs_built, impl_->graphs_declined, impl_->build_seconds);
  cudaStreamSynchronize(impl_->stream);
  impl_->forward.clear();  // the plans hold cuDNN descriptors: released before the handle
  impl_->backward.clear();
  impl_->ws.free_async(impl_->stream);
  cudaStreamSynchronize(impl_->stream);
  if (impl_->philox) cudaFree(impl_->philox);
  if (impl_->handle) cudnnDestroy(impl_->handle);
}

// Decided per (NH, HS) with the first B and T asked about (the model asks at its largest batch and
// length first, when it sizes its buffers): cuDNN's flash attention takes any sequence length and
// batch size for a head size it runs, while a run whose batch length changes (data.padding =
// longest, packed rows) would otherwise build two graphs per new length that its masked calls never
// use. A later variant that does not build fails in require(), naming cuDNN's reason.
bool CudnnAttention::supports(int B, int T, int NH, int HS) {
  Impl& m = *impl_;
  const auto shape = std::pair(NH, HS);
  auto it = m.support.find(shape);
  if (it != m.support.end()) return it->second;
  const Key k{B, T, NH, HS, false, MaskKind::None, 0.f};
  const Plan& f = m.plan(k, false);
  const Plan& b = f.graph ? m.plan(k, true) : f;
  const bool ok = f.graph && b.graph;
  if (!ok)
    std::fprintf(stderr,
                 "nlptrain: cuDNN fused attention does not support B=%d T=%d NH=%d HS=%d (%s %s): "
                 "%d heads of size %d use the native attention kernels\n",
                 B, T, NH, HS, f.graph ? "backward:" : "forward:", (f.graph ? b.error : f.error).c_str(),
                 NH, HS);
  m.support.emplace(shape, ok);
  return ok;
}

long CudnnAttention::grows() const { return long(impl_->ws.grows()); }
long CudnnAttention::builds() const { return impl_->graphs_built + impl_->graphs_declined; }

// out[B,T,C] = attention(q, k, v); saved <- stats, O, q|k|v (bf16)
void CudnnAttention::forward(float* out, float* saved, const float* qkv, const int32_t* attn_mask,
                             bool packed, int examples, bool causal, float dropout_p, uint64_t seed,
                             const uint64_t* seed_slot, int B, int T, int NH, int HS) {
  Impl& m = *impl_;
  const int C = NH * HS;
  const size_t BT = size_t(B) * T;
  const SdpaSavedLayout L = sdpa_saved_layout(std::max(B, examples), T, NH, HS);
  char* base = align_up(saved);
  float* stats = reinterpret_cast<float*>(base + L.stats);  // [B,NH,T,1]
  char* o = base + L.o;                                     // [B,T,C] bf16
  char* qkv16 = base + L.qkv;                               // [B,T,3C] bf16
  NLP_ASSERT(!packed || attn_mask);
  const Key k =
      m.key_of(B, T, NH, HS, causal, attn_mask != nullptr, packed, examples, dropout_p, false);
  const Plan& p = m.require(k, false);
  const Impl::CallBuffers cb = m.buffers(p, k);
  if (packed) count_packed(k.mask == MaskKind::Ragged);

  // Ragged: cuDNN writes the stats of each sequence's own tokens and o at real tokens only; the
  // rest (stats past a sequence's length, o at padding tokens) is zeroed, and so is the q|k|v room
  // past the B x T tokens (the layout holds max(B, examples) rows), so that no stale or NaN bytes of
  // the arena reach the results, whatever cuDNN's tiles read past a sequence's end
  if (k.mask == MaskKind::Ragged) {
    ck_cuda(cudaMemsetAsync(base, 0, L.qkv, m.stream), "ragged stats and o (zero)");
    m.zero_room(qkv16, B, examples, T, 3 * size_t(C), "ragged q|k|v room (zero)");
  }
  ck_cuda(kern::to_bf16(qkv16, qkv, BT * 3 * C, m.stream), "qkv to bf16");
  m.prepare(k, cb, attn_mask, seed, seed_slot, B);
  const size_t part = size_t(C) * 2;  // bytes from q to k to v within a row
  std::unordered_map<int64_t, void*> pack = {
      {kQ, qkv16}, {kK, qkv16 + part}, {kV, qkv16 + 2 * part}, {kO, o}, {kStats, stats}};
  m.execute(p, k, pack, cb, "forward");
  if (k.mask == MaskKind::Ragged)  // padding tokens are in no sequence: cuDNN left their rows of o
    ck_cuda(kern::sdpa_out_from_bf16_tokens(out, o, attn_mask, BT, C, m.stream), "output to fp32");
  else
    ck_cuda(kern::sdpa_out_from_bf16(out, o, attn_mask ? cb.first : nullptr, causal, B, T, C,
                                     m.stream),
            "output to fp32");
}

// dqkv[B,T,3C] += d attention / d qkv, from the saved stats, O and q|k|v
void CudnnAttention::backward(float* dqkv, float* scratch, const float* dout, const float* saved,
                              const int32_t* attn_mask, bool packed, int examples, bool causal,
                              float dropout_p, uint64_t seed, const uint64_t* seed_slot, int B,
                              int T, int NH, int HS) {
  Impl& m = *impl_;
  const int C = NH * HS;
  const size_t BT = size_t(B) * T;
  const SdpaSavedLayout L = sdpa_saved_layout(std::max(B, examples), T, NH, HS);
  char* base = align_up(saved);
  const SdpaScratchLayout S = sdpa_scratch_layout(std::max(B, examples), T, NH, HS);
  char* sbase = align_up(scratch);
  char* dout16 = sbase + S.dout;  // [B,T,C] bf16
  char* dqkv16 = sbase + S.dqkv;  // [B,T,3C] bf16
  char* qkv16 = base + L.qkv;
  NLP_ASSERT(!packed || attn_mask);
  const Key k =
      m.key_of(B, T, NH, HS, causal, attn_mask != nullptr, packed, examples, dropout_p, true);
  const Plan& p = m.require(k, true);
  const Impl::CallBuffers cb = m.buffers(p, k);
  const bool ragged = k.mask == MaskKind::Ragged;
  if (packed) count_packed(ragged);
  if (ragged)  // dO's room past the B x T tokens, as q|k|v's in the forward
    m.zero_room(dout16, B, examples, T, size_t(C), "ragged dO room (zero)");

  m.prepare(k, cb, attn_mask, seed, seed_slot, B);
  ck_cuda(kern::sdpa_dout_to_bf16(dout16, dout, attn_mask && !ragged ? cb.first : nullptr, causal,
                                  B, T, C, m.stream),
          "dout to bf16");
  const size_t part = size_t(C) * 2;
  std::unordered_map<int64_t, void*> pack = {
      {kQ, qkv16},          {kK, qkv16 + part},           {kV, qkv16 + 2 * part},
      {kO, base + L.o},     {kStats, base + L.stats},     {kDO, dout16},
      {kDQ, dqkv16},        {kDK, dqkv16 + part},         {kDV, dqkv16 + 2 * part}};
  m.execute(p, k, pack, cb, "backward");
  if (ragged)  // cuDNN wrote no gradient for the padding tokens (in no sequence)
    ck_cuda(kern::sdpa_accumulate_bf16_tokens(dqkv, dqkv16, attn_mask, BT, 3 * C, m.stream),
            "dqkv accumulate");
  else
    ck_cuda(kern::accumulate_bf16(dqkv, dqkv16, BT * 3 * C, m.stream), "dqkv accumulate");
}

// ---- bf16 I/O -----------------------------------------------------------------------------------------

namespace {

// cuDNN's operand alignment for buffers bound in place: 16-byte pointers, and k and v at 2C and 4C
// bytes from q (dk, dv likewise) within the fused rows
void check_bf16_io(const char* what, int C,
                   std::initializer_list<std::pair<const char*, const void*>> buffers) {
  if (C % 8 != 0)
    throw Error(cat("cuDNN attention ", what, " with bf16 I/O: C = ", C,
                    " is not a multiple of 8 (cuDNN needs k and v 16-byte aligned in the fused rows)"));
  for (const auto& [name, ptr] : buffers)
    if (reinterpret_cast<uintptr_t>(ptr) % 16 != 0)
      throw Error(cat("cuDNN attention ", what, " with bf16 I/O: ", name, " (", ptr,
                      ") is not 16-byte aligned"));
}

}  // namespace

// out[B,T,C] (bf16) = attention(q, k, v) read from qkv (bf16) in place; saved <- stats
void CudnnAttention::forward_bf16(void* out, float* saved, const void* qkv,
                                  const int32_t* attn_mask, bool packed, int examples, bool causal,
                                  float dropout_p, uint64_t seed, const uint64_t* seed_slot, int B,
                                  int T, int NH, int HS) {
  Impl& m = *impl_;
  const int C = NH * HS;
  const size_t BT = size_t(B) * T;
  const int R = std::max(B, examples);
  float* stats = reinterpret_cast<float*>(align_up(saved));  // [R,NH,T,1]
  NLP_ASSERT(!packed || attn_mask);
  check_bf16_io("forward", C, {{"qkv", qkv}, {"out", out}});
  const auto [k, plan, ragged, staged, qkv_room, o_room] =
      m.bf16_call(B, T, NH, HS, causal, attn_mask != nullptr, packed, examples, dropout_p, false);
  const Plan& p = *plan;
  const Impl::CallBuffers cb = m.buffers(p, k, staged ? qkv_room + o_room : 0);
  if (packed) count_packed(ragged);

  const char* q = static_cast<const char*>(qkv);
  char* o = static_cast<char*>(out);
  if (ragged)  // cuDNN writes the stats of each sequence's own tokens only
    ck_cuda(cudaMemsetAsync(stats, 0, size_t(R) * NH * T * sizeof(float), m.stream),
            "ragged stats (zero)");
  if (staged) {
    char* q16 = cb.extra;
    char* o16 = cb.extra + qkv_room;
    m.stage(q16, qkv, BT * 3 * C * 2, qkv_room, "ragged q|k|v (staged)");
    ck_cuda(cudaMemsetAsync(o16, 0, o_room, m.stream), "ragged o (zero)");
    q = q16;
    o = o16;
  }
  m.prepare(k, cb, attn_mask, seed, seed_slot, B);
  const size_t part = size_t(C) * 2;  // bytes from q to k to v within a row
  char* qm = const_cast<char*>(q);    // the variant pack takes void*; cuDNN only reads Q, K, V
  std::unordered_map<int64_t, void*> pack = {
      {kQ, qm}, {kK, qm + part}, {kV, qm + 2 * part}, {kO, o}, {kStats, stats}};
  m.execute(p, k, pack, cb, "forward");
  if (ragged)  // padding tokens are in no sequence: 0 (in place, or copied from the staging)
    ck_cuda(kern::sdpa_tokens_bf16(out, o, attn_mask, BT, C, false, m.stream),
            "output padding tokens (zero)");
  else if (attn_mask)  // rows with no visible key: 0, in place
    ck_cuda(kern::sdpa_rows_bf16(out, out, cb.first, causal, B, T, C, m.stream),
            "output dead rows (zero)");
}

// dqkv[B,T,3C] (bf16) = (accumulate: +=) d attention / d qkv, from the stats in saved and the
// forward's qkv and out (bf16, unchanged since)
void CudnnAttention::backward_bf16(void* dqkv, bool accumulate, float* scratch, const void* dout,
                                   const void* qkv, const void* out, const float* saved,
                                   const int32_t* attn_mask, bool packed, int examples, bool causal,
                                   float dropout_p, uint64_t seed, const uint64_t* seed_slot, int B,
                                   int T, int NH, int HS) {
  Impl& m = *impl_;
  const int C = NH * HS;
  const size_t BT = size_t(B) * T;
  float* stats = reinterpret_cast<float*>(align_up(saved));
  char* dout16 = align_up(scratch);  // [R,T,C] bf16: dO with dead rows zeroed, or staged
  NLP_ASSERT(!packed || attn_mask);
  check_bf16_io("backward", C, {{"dqkv", dqkv}, {"dout", dout}, {"qkv", qkv}, {"out", out}});
  const auto [k, plan, ragged, staged, qkv_room, o_room] =
      m.bf16_call(B, T, NH, HS, causal, attn_mask != nullptr, packed, examples, dropout_p, true);
  const Plan& p = *plan;
  // workspace past cuDNN's: staged q|k|v, O and dq|dk|dv, or the dq|dk|dv temporary of an accumulate
  const size_t extra = staged ? 2 * qkv_room + o_room : accumulate ? sdpa_align(BT * 3 * C * 2) : 0;
  const Impl::CallBuffers cb = m.buffers(p, k, extra);
  if (packed) count_packed(ragged);

  const char* q = static_cast<const char*>(qkv);
  const char* o = static_cast<const char*>(out);
  const char* dO = static_cast<const char*>(dout);
  char* dq = static_cast<char*>(dqkv);
  if (staged) {
    char* q16 = cb.extra;
    char* o16 = q16 + qkv_room;
    m.stage(q16, qkv, BT * 3 * C * 2, qkv_room, "ragged q|k|v (staged)");
    m.stage(o16, out, BT * C * 2, o_room, "ragged o (staged)");
    m.stage(dout16, dout, BT * C * 2, o_room, "ragged dO (staged)");
    q = q16;
    o = o16;
    dO = dout16;
    dq = o16 + o_room;
  } else if (accumulate) {
    dq = cb.extra;
  }
  m.prepare(k, cb, attn_mask, seed, seed_slot, B);
  if (!ragged && attn_mask) {  // rows with no visible key: dO = 0, so they pass no gradient
    ck_cuda(kern::sdpa_rows_bf16(dout16, dout, cb.first, causal, B, T, C, m.stream),
            "dout dead rows (zero)");
    dO = dout16;
  }
  const size_t part = size_t(C) * 2;
  char* qm = const_cast<char*>(q);  // the variant pack takes void*; cuDNN only reads these
  std::unordered_map<int64_t, void*> pack = {
      {kQ, qm},          {kK, qm + part},    {kV, qm + 2 * part},
      {kO, const_cast<char*>(o)},            {kStats, stats},
      {kDO, const_cast<char*>(dO)},          {kDQ, dq},
      {kDK, dq + part},  {kDV, dq + 2 * part}};
  m.execute(p, k, pack, cb, "backward");
  if (staged || accumulate)  // from the staging or the temporary: padding tokens 0 or untouched
    ck_cuda(kern::sdpa_tokens_bf16(dqkv, dq, ragged ? attn_mask : nullptr, BT, 3 * C, accumulate,
                                   m.stream),
            "dqkv");
  else if (ragged)  // cuDNN wrote no gradient for the padding tokens (in no sequence): 0
    ck_cuda(kern::sdpa_tokens_bf16(dqkv, dqkv, attn_mask, BT, 3 * C, false, m.stream),
            "dqkv padding tokens (zero)");
}

}  // namespace nlp::cuda
