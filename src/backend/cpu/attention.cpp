// Multi-head scaled dot-product attention over a packed qkv[B,T,3C] (q | k | v, head h at columns
// h*HS..h*HS+HS of each part), with causal masks and segment-id masks (key padding, or the examples
// of a packed row: backend.h) and dropout on the probabilities, plus single-position decoding with a
// KV cache. Each block of query rows computes only the keys it can see.
//
// Flash-style in what it keeps: no [B,NH,T,T] tensor is stored. The forward keeps two floats per
// query row (the softmax's max and 1 / sum of exp); the backward recomputes the scores and the
// probabilities from q, k and those, bitwise as the forward had them. A block of kRows query rows
// holds its whole row of scores (kRows x T floats: 32 KiB at T = 1024) in a per-thread buffer, so the
// softmax is the exact two-pass one within the block rather than an online rescaling over key tiles;
// the backward's dS and A' of one head are per-thread [T, T] buffers, reused head after head.
//
// One OpenMP task per (b, h), handed out dynamically (packed and trimmed rows differ in work): every
// output element is produced by one task in a fixed order, whichever thread runs it, so results are
// bitwise reproducible and independent of the thread count. Per head the
// products are small (T x T x HS) and would be many tiny GEMM calls from inside a parallel region, so
// they use a register-tiled kRows x 16 kernel on per-thread, zero-padded copies of the head's q, k, v
// (T padded to Tp, a multiple of 16 and of kRows; HS to Hp, a multiple of 16). Causal attention skips
// the tiles above the diagonal.
#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>
#include <vector>

#include "backend/cpu/cpu_backend_impl.h"
#include "backend/cpu/cpu_ops.h"
#include "backend/cpu/staged.h"
#include "backend/cpu/vmath.h"
#include "core/error.h"
#include "core/rng.h"

namespace nlp::cpu {
namespace {

// The products run on register tiles of kRows x 16 floats, in the CPU's native vector width: 8 rows of
// one 512-bit vector each where the compiler targets AVX-512, else 6 rows of two 256-bit vectors (12
// accumulators, the two vectors of B and A's broadcast: 15 of AVX2's 16 registers; 4 rows left the
// loads of A and B, not the FMAs, as the limit: 1.3x slower). (A 64-byte vector type on AVX2, which GCC
// splits into halves, was spilled to the stack on every product: attention then ran at a tenth of
// AVX2's rate.) On AVX-512 a tile is two 16-float groups wide where the buffers allow (8 x 32: 16
// accumulators of the 32 registers), which halves the broadcasts of A per product. Every element sums
// its products in the same order whatever the tile's height, width and vector width, so the results do
// not depend on them.
#if defined(__AVX512F__)
typedef float vec __attribute__((vector_size(64)));
constexpr int kRows = 8;
constexpr bool kWide = true;
#else
typedef float vec __attribute__((vector_size(32)));
constexpr int kRows = 6;
constexpr bool kWide = false;
#endif
constexpr int kLanes = static_cast<int>(sizeof(vec) / sizeof(float));
constexpr int kPer16 = 16 / kLanes;  // vectors per 16 columns

inline vec loadv(const float* p) {
  vec v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}
inline void storev(float* p, vec v) { std::memcpy(p, &v, sizeof(v)); }

// C[kRows,16 NV] = A[kRows,L] @ B[L,16 NV]; B rows ldb apart, C rows ldc apart (overwritten). A(r, l)
// is A[r * lda + l] (rows lda apart), or with kTransposedA A[l * lda + r] (A given as A^T row-major,
// e.g. dS^T @ q from dS). Each element sums its products in order l = 0..L-1 either way, so both forms
// give bitwise the same C from the same A. With kAccumulate, C += the product (C read first).
template <int NV, bool kTransposedA = false, bool kAccumulate = false>
inline void tile(const float* __restrict A, size_t lda, const float* __restrict B, size_t ldb, int L,
                 float* __restrict C, size_t ldc) {
  constexpr int W = NV * kPer16;  // vectors per row of the tile
  vec c[kRows][W] = {};
  if (kAccumulate)
    for (int r = 0; r < kRows; ++r)
      for (int v = 0; v < W; ++v) c[r][v] = loadv(C + (size_t)r * ldc + kLanes * v);
  for (int l = 0; l < L; ++l) {
    vec b[W];
    for (int v = 0; v < W; ++v) b[v] = loadv(B + (size_t)l * ldb + kLanes * v);
#pragma GCC unroll 8
    for (int r = 0; r < kRows; ++r) {
      const float a = kTransposedA ? A[(size_t)l * lda + r] : A[(size_t)r * lda + l];
      for (int v = 0; v < W; ++v) c[r][v] += a * b[v];
    }
  }
#pragma GCC unroll 8
  for (int r = 0; r < kRows; ++r)
    for (int v = 0; v < W; ++v) storev(C + (size_t)r * ldc + kLanes * v, c[r][v]);
}

// C[kRows, c0 <= c < c1] = A @ B[:, c0 <= c < c1] (B and C given at column 0) in register tiles, the
// last one reaching up to 31 columns beyond c1 but never beyond `width` (the padded width of B's and
// C's buffers, a multiple of 16): two vectors wide while more than 16 columns are left and the
// buffers allow (kWide), else one.
template <bool kTransposedA = false, bool kAccumulate = false>
inline void tiles(const float* A, size_t lda, const float* B, size_t ldb, int L, float* C, size_t ldc,
                  int c0, int c1, int width) {
  int c = c0;
  if (kWide)
    for (; c + 16 < c1 && c + 32 <= width; c += 32)
      tile<2, kTransposedA, kAccumulate>(A, lda, B + c, ldb, L, C + c, ldc);
  for (; c < c1; c += 16) tile<1, kTransposedA, kAccumulate>(A, lda, B + c, ldb, L, C + c, ldc);
}

inline int round16(int x) { return (x + 15) / 16 * 16; }
// The padded row count of the per-head buffers: a multiple of 16 (the column tiles) and of kRows (the
// row blocks), so that neither a tile nor a block leaves them
constexpr int kTpMultiple = std::lcm(16, kRows);
inline int round_rows(int x) { return (x + kTpMultiple - 1) / kTpMultiple * kTpMultiple; }

// Row r of head h, part `part` (0 q, 1 k, 2 v) of sequence b.
inline const float* head_row(const float* qkv, int b, int r, int h, int part, int T, int C, int HS) {
  return qkv + ((size_t)b * T + r) * 3 * (size_t)C + (size_t)part * C + (size_t)h * HS;
}

// dst[Tp,Hp] rows t < T (others untouched, i.e. zero) = part of head h, times s
inline void gather_rows(float* dst, int Hp, const float* qkv, int b, int h, int part, int T, int C,
                        int HS, float s) {
  for (int t = 0; t < T; ++t) {
    const float* src = head_row(qkv, b, t, h, part, T, C, HS);
    float* d = dst + (size_t)t * Hp;
    for (int x = 0; x < HS; ++x) d[x] = src[x] * s;
  }
}

// dst[Hp,Tp] = transposed part of head h (rows d < HS, columns t < T), 16 positions at a time: each
// d writes 16 consecutive floats from 16 source rows that stay in L1 (a position at a time wrote one
// float to each of HS cache lines, 12% of the forward's time at T = 256)
inline void gather_transposed(float* dst, int Tp, const float* qkv, int b, int h, int part, int T,
                              int C, int HS) {
  for (int t0 = 0; t0 < T; t0 += 16) {
    const int n = T - t0 < 16 ? T - t0 : 16;
    const float* src[16];
    for (int r = 0; r < n; ++r) src[r] = head_row(qkv, b, t0 + r, h, part, T, C, HS);
    for (int d = 0; d < HS; ++d) {
      float* __restrict col = dst + (size_t)d * Tp + t0;
      for (int r = 0; r < n; ++r) col[r] = src[r][d];
    }
  }
}

// seg[j] = the segment id of position j (attn_mask[j]; 1 everywhere without a mask)
inline void segment_ids(int* seg, const int32_t* mask, int T) {
  for (int j = 0; j < T; ++j) seg[j] = mask ? mask[j] : 1;
}

// Row i attends keys j in [lo[i], hi[i]) at most (the softmax masks within, by backend.h's rule): the
// span of its segment's keys (a padding row's: every real key), causal: up to i; lo = hi = 0 when it
// sees none. Segment ids are in [0, T] (a row holds at most T examples). first/last: T + 1 ints.
inline void key_spans(int* lo, int* hi, const int* seg, int T, bool causal, int* first, int* last) {
  for (int s = 0; s <= T; ++s) first[s] = T, last[s] = -1;
  int nz_lo = T, nz_hi = 0;
  for (int j = 0; j < T; ++j) {
    const int s = seg[j];
    NLP_ASSERT(s >= 0 && s <= T);
    if (s == 0) continue;
    if (first[s] == T) first[s] = j;
    last[s] = j;
    if (nz_lo == T) nz_lo = j;
    nz_hi = j + 1;
  }
  for (int i = 0; i < T; ++i) {
    const int s = seg[i];
    int a = s ? first[s] : nz_lo, b = s ? last[s] + 1 : nz_hi;
    if (causal && b > i + 1) b = i + 1;
    if (a >= b) a = b = 0;
    lo[i] = a;
    hi[i] = b;
  }
}

// Attention dropout keys (backend.h): row i of head h draws key j's mask at base + kpos[j], with base =
// ((b*NH + h)*Tk + i)*Tk and kpos[j] = j; packed rows (token_key = example * Tk + position) use row i's
// example and position for base and key j's position for kpos[j], so that the same (example, head,
// position, position) draws the same mask as in the padded batch (the CUDA kernels compute the same).
inline uint64_t drop_base(const int32_t* token_key, int b, int h, int i, int T, int NH, uint64_t Tk) {
  if (!token_key) return (((uint64_t)b * NH + h) * Tk + (uint64_t)i) * Tk;
  const uint64_t v = (uint64_t)token_key[(size_t)b * T + i], e = v / Tk, pi = v % Tk;
  return ((e * NH + h) * Tk + pi) * Tk;
}

// kpos[j] = the position of key j within its example (token_key) for sequence b; j without token_key
inline void key_positions(int* kpos, const int32_t* token_key, int b, int T, uint64_t Tk) {
  for (int j = 0; j < T; ++j)
    kpos[j] = token_key ? static_cast<int>((uint64_t)token_key[(size_t)b * T + j] % Tk) : j;
}

// One sequence's masks, in per-thread buffers: each position's segment id, each row's key span
// (key_spans) and each key's dropout position (key_positions).
struct SequenceMasks {
  std::vector<int> seg, lo, hi, first, last, kpos;
  explicit SequenceMasks(int T) : seg(T), lo(T), hi(T), first(T + 1), last(T + 1), kpos(T) {}
  // for sequence b of the batch
  void set(const int32_t* attn_mask, const int32_t* token_key, int b, int T, bool causal, uint64_t Tk) {
    segment_ids(seg.data(), attn_mask ? attn_mask + (size_t)b * T : nullptr, T);
    key_spans(lo.data(), hi.data(), seg.data(), T, causal, first.data(), last.data());
    key_positions(kpos.data(), token_key, b, T, Tk);
  }
};

// The keys a block of rows [i0, i0 + n) may see: [*jlo, *jhi), jlo rounded down to a multiple of 16
// (so that 16-wide tiles from there stay inside the Tp-padded buffers); 0, 0 when none.
inline void block_span(const int* lo, const int* hi, int i0, int n, int* jlo, int* jhi) {
  int a = 1 << 30, b = 0;
  for (int i = i0; i < i0 + n; ++i)
    if (hi[i] > lo[i]) a = lo[i] < a ? lo[i] : a, b = hi[i] > b ? hi[i] : b;
  *jlo = b > 0 ? a / 16 * 16 : 0;
  *jhi = b;
}

// Whether query i (segment id si) sees key j: the mask rule of backend.h, branch-free
inline bool sees(const int* sg, int si, int i, int j, bool causal) {
  return (sg[j] != 0) & ((si == 0) | (sg[j] == si)) & (!causal | (j <= i));
}

// A row's unnormalised probability exp(x - mx) of a key it sees, 0 of one it does not. Every operand
// is computed unconditionally (a conditional load keeps GCC from vectorising), and a masked score
// never meets inf - inf. The forward and the backward's recomputation call this same function, so
// they get bitwise the same probabilities.
inline float unnormalised(float x, float mx, bool keep) {
  const float e = exp_nonpositive(keep ? x - mx : -100.0f);
  return keep ? e : 0.0f;
}

// s[kRows, jlo <= j < jhi] (rows Tp apart) = the scores q_i . k_j / sqrt(HS) of rows i0.. from
// qs[Tp,Hp] (q pre-scaled by 1/sqrt(HS)) and kt[Hp,Tp] (k transposed)
inline void scores(float* s, const float* qs, const float* kt, int i0, int jlo, int jhi, int Tp,
                   int Hp, int HS) {
  tiles(qs + (size_t)i0 * Hp, Hp, kt, Tp, HS, s, Tp, jlo, jhi, Tp);
}

// What the forward and the backward derive from a call's shapes: the mask's key length (backend.h),
// C, the padded tile sizes, the heads in the batch, the score scale and dropout's keep factor.
struct Geometry {
  uint64_t Tk;
  int C, Tp, Hp, BH;
  float sc;
  bool drop;
  float dscale;
};
Geometry geometry(int B, int T, int NH, int HS, int T_key, float dropout_p) {
  return {uint64_t(key_length(T, T_key)), NH * HS, round_rows(T), round16(HS), B * NH,
          1.0f / std::sqrt(static_cast<float>(HS)), dropout_p > 0.0f, dropout_scale(dropout_p)};
}

// The softmax backward of the row block [i0, i0 + ni) of head bh (sequence b, head h), row by row over
// the keys each row sees, [lo, hi): the probabilities A (recomputed from the scores s holds on entry,
// rows Tp apart), the row's keep factors kf (dropout's keep/(1-p), 0 where A = 0, i.e. masked; a
// per-thread [Tp] buffer), then A' = A * kf into ap, dA = dA' * kf from the dA' ds holds, the row's
// sum A.dA (lane_sum), dS into ds; each a loop the compiler vectorises, the mask hash included; zeros
// outside [lo, hi). ds and ap rows are i0.., Tp apart.
inline void softmax_backward_block(float* s, float* ds, float* ap, float* __restrict kf,
                                   const SequenceMasks& m, const float* stats,
                                   const int32_t* token_key, uint64_t seed, float dropout_p,
                                   const Geometry& g, int bh, int b, int h, int i0, int ni, int T,
                                   int NH, bool causal) {
  const uint64_t Tk = g.Tk;
  const int Tp = g.Tp;
  const float sc = g.sc, dscale = g.dscale;
  const bool drop = g.drop;
  const int* __restrict sg = m.seg.data();
  for (int r = 0; r < ni; ++r) {
    const int i = i0 + r;
    float* __restrict arow = s + (size_t)r * Tp;
    float* __restrict drow = ds + (size_t)i * Tp;
    float* __restrict aprow = ap + (size_t)i * Tp;
    const int jlo = m.lo[i], jhi = m.hi[i], si = sg[i];
    const float* st = stats + ((size_t)bh * T + i) * 2;
    const float mx = st[0], inv = st[1];
#pragma omp simd
    for (int j = jlo; j < jhi; ++j)
      arow[j] = unnormalised(arow[j], mx, sees(sg, si, i, j, causal)) * inv;
    const uint64_t base = drop_base(token_key, b, h, i, T, NH, Tk);
    if (drop) {
      const int* __restrict kp = m.kpos.data();
#pragma omp simd
      for (int j = jlo; j < jhi; ++j) {
        const float keep = uniform01(seed, base + (uint64_t)kp[j]) >= dropout_p ? dscale : 0.0f;
        kf[j] = arow[j] != 0.0f ? keep : 0.0f;
      }
    } else {
#pragma omp simd
      for (int j = jlo; j < jhi; ++j) kf[j] = arow[j] != 0.0f ? 1.0f : 0.0f;
    }
#pragma omp simd
    for (int j = jlo; j < jhi; ++j) aprow[j] = arow[j] * kf[j];
#pragma omp simd
    for (int j = jlo; j < jhi; ++j) drow[j] *= kf[j];  // dA
    const float dot = lane_sum<float>(jhi - jlo, [arow, drow, jlo](int x) {
      return arow[jlo + x] * drow[jlo + x];
    });
#pragma omp simd
    for (int j = jlo; j < jhi; ++j)
      drow[j] = arow[j] == 0.0f ? 0.0f : arow[j] * (drow[j] - dot) * sc;
    for (int j = 0; j < jlo; ++j) drow[j] = aprow[j] = 0.0f;
    for (int j = jhi; j < Tp; ++j) drow[j] = aprow[j] = 0.0f;
  }
}

}  // namespace

// out[B,T,C] = dropout(softmax(mask(q k^T / sqrt(HS)))) @ v;  stats[B,NH,T,2] = each row's softmax
// max and 1 / sum of exp (pre-dropout), from which the backward recomputes the probabilities
void attention_forward(float* out, float* stats, const float* qkv, const int32_t* attn_mask,
                       bool causal, float dropout_p, uint64_t seed, int B, int T, int NH, int HS,
                       int T_key, const int32_t* token_key) {
  const auto [Tk, C, Tp, Hp, BH, sc, drop, dscale] = geometry(B, T, NH, HS, T_key, dropout_p);

#pragma omp parallel
  {
    // zero padding stays zero: only rows t < T / columns d < HS are ever written
    std::vector<float> qs((size_t)Tp * Hp), kt((size_t)Hp * Tp), vb((size_t)Tp * Hp);
    std::vector<float> s((size_t)kRows * Tp), o((size_t)kRows * Hp);
    SequenceMasks m(T);
#pragma omp for schedule(dynamic, 1)
    for (int bh = 0; bh < BH; ++bh) {
      const int b = bh / NH, h = bh % NH;
      m.set(attn_mask, token_key, b, T, causal, Tk);
      gather_rows(qs.data(), Hp, qkv, b, h, 0, T, C, HS, sc);  // q pre-scaled by 1/sqrt(HS)
      gather_transposed(kt.data(), Tp, qkv, b, h, 1, T, C, HS);
      gather_rows(vb.data(), Hp, qkv, b, h, 2, T, C, HS, 1.0f);
      // row blocks of kRows (T is padded to Tp, a multiple of kRows, so a block never leaves the buffers)
      for (int i0 = 0; i0 < T; i0 += kRows) {
        const int ni = T - i0 < kRows ? T - i0 : kRows;
        int jlo, jhi;  // the keys this row block can see (a packed row's other examples are skipped)
        block_span(m.lo.data(), m.hi.data(), i0, ni, &jlo, &jhi);
        scores(s.data(), qs.data(), kt.data(), i0, jlo, jhi, Tp, Hp, HS);
        for (int r = 0; r < ni; ++r) {
          const int i = i0 + r;
          float* __restrict srow = s.data() + (size_t)r * Tp;
          // masked softmax; a fully masked row gives zeros. Branch-free over j (the segment ids as
          // ints, exp by vmath's exp_nonpositive), so the compiler vectorises the three passes.
          const int* __restrict sg = m.seg.data();
          const int si = sg[i];
          float mx = -std::numeric_limits<float>::infinity();
#pragma omp simd reduction(max : mx)
          for (int j = jlo; j < jhi; ++j) {
            const float v = sees(sg, si, i, j, causal) ? srow[j] : -std::numeric_limits<float>::infinity();
            mx = v > mx ? v : mx;
          }
          float den = 0.0f;
#pragma omp simd reduction(+ : den)
          for (int j = jlo; j < jhi; ++j) {
            srow[j] = unnormalised(srow[j], mx, sees(sg, si, i, j, causal));
            den += srow[j];
          }
          const float inv = den > 0.0f ? 1.0f / den : 0.0f;
          float* st = stats + ((size_t)bh * T + i) * 2;
          st[0] = mx;
          st[1] = inv;
          // the row of dropout(A), A = the probabilities, for the product with v
          if (drop) {  // branch-free, so the mask hash vectorises (A >= 0: A * 0 is the dropped 0)
            const uint64_t base = drop_base(token_key, b, h, i, T, NH, Tk);
            const int* __restrict kp = m.kpos.data();
#pragma omp simd
            for (int j = jlo; j < jhi; ++j)
              srow[j] = srow[j] * inv * (uniform01(seed, base + (uint64_t)kp[j]) >= dropout_p ? dscale : 0.0f);
          } else {
#pragma omp simd
            for (int j = jlo; j < jhi; ++j) srow[j] *= inv;
          }
        }
        for (int r = ni; r < kRows; ++r)
          for (int j = jlo; j < jhi; ++j) s[(size_t)r * Tp + j] = 0.0f;
        // o[kRows, Hp] = dropout(A)[kRows, jlo <= j < jhi] @ v[jlo <= j < jhi, Hp]
        tiles(s.data() + jlo, Tp, vb.data() + (size_t)jlo * Hp, Hp, jhi - jlo, o.data(), Hp, 0, HS, Hp);
        for (int r = 0; r < ni; ++r) {
          float* oi = out + ((size_t)b * T + i0 + r) * C + (size_t)h * HS;
          std::memcpy(oi, o.data() + (size_t)r * Hp, sizeof(float) * HS);
        }
      }
    }
  }
}

// dqkv[B,T,3C] += gradient through the forward above, from dout[B,T,C] and the forward's stats.
// With A the probabilities (recomputed from q, k and stats: bitwise the forward's), A' = dropout(A) =
// A * kf (kf = keep/(1-p)), the scale sc = 1/sqrt(HS):
//   dA'[T,T] = dout @ v^T;  dv += A'^T @ dout;  dA = dA' * kf;
//   dS_ij = A_ij (dA_ij - sum_k A_ik dA_ik) * sc;  dq += dS @ k;  dk += dS^T @ q
// dS and A' of one head live in per-thread [Tp, Tp] buffers, reused head after head; scratch is not
// needed.
void attention_backward(float* dqkv, float* scratch, const float* dout, const float* qkv,
                        const float* stats, const int32_t* attn_mask, bool causal, float dropout_p,
                        uint64_t seed, int B, int T, int NH, int HS, int T_key,
                        const int32_t* token_key) {
  (void)scratch;
  const Geometry g = geometry(B, T, NH, HS, T_key, dropout_p);
  const auto [Tk, C, Tp, Hp, BH, sc, drop, dscale] = g;
  const size_t C3 = 3 * (size_t)C;

#pragma omp parallel
  {
    const size_t th = (size_t)Tp * Hp, tt = (size_t)Tp * Tp;
    // rows t >= T / columns d >= HS of these are never written and stay zero
    std::vector<float> qs(th), kt(th), qb(th), kb(th), dob(th), vt(th);
    std::vector<float> ds(tt), ap(tt);  // ds holds dA' then dS; ap = A' (dropout(A)), row-major
    std::vector<float> s((size_t)kRows * Tp);  // a row block's scores, then its probabilities A
    std::vector<float> dq(th), dk(th), dv(th);
    std::vector<float> kfrow(Tp);
    SequenceMasks m(T);
    const int nblk = (T + kRows - 1) / kRows;
    std::vector<int> blo(nblk), bhi(nblk);  // the keys each row block sees (block_span)
#pragma omp for schedule(dynamic, 1)
    for (int bh = 0; bh < BH; ++bh) {
      const int b = bh / NH, h = bh % NH;
      m.set(attn_mask, token_key, b, T, causal, Tk);
      for (int k = 0; k < nblk; ++k)
        block_span(m.lo.data(), m.hi.data(), k * kRows, T - k * kRows < kRows ? T - k * kRows : kRows,
                   &blo[k], &bhi[k]);
      gather_rows(qs.data(), Hp, qkv, b, h, 0, T, C, HS, sc);  // as the forward: the same scores
      gather_transposed(kt.data(), Tp, qkv, b, h, 1, T, C, HS);
      gather_rows(qb.data(), Hp, qkv, b, h, 0, T, C, HS, 1.0f);
      gather_rows(kb.data(), Hp, qkv, b, h, 1, T, C, HS, 1.0f);
      gather_transposed(vt.data(), Tp, qkv, b, h, 2, T, C, HS);
      for (int t = 0; t < T; ++t)
        std::memcpy(dob.data() + (size_t)t * Hp, dout + ((size_t)b * T + t) * C + (size_t)h * HS,
                    sizeof(float) * HS);
      for (int i0 = 0, k = 0; i0 < T; i0 += kRows, ++k) {
        const int ni = T - i0 < kRows ? T - i0 : kRows;
        // dA'[i, j] = dout_i . v_j  (the tiles of the keys the row block sees)
        tiles(dob.data() + (size_t)i0 * Hp, Hp, vt.data(), Tp, HS, ds.data() + (size_t)i0 * Tp, Tp, blo[k],
              bhi[k], Tp);
        scores(s.data(), qs.data(), kt.data(), i0, blo[k], bhi[k], Tp, Hp, HS);
        softmax_backward_block(s.data(), ds.data(), ap.data(), kfrow.data(), m, stats, token_key, seed,
                               dropout_p, g, bh, b, h, i0, ni, T, NH, causal);
      }
      for (int i0 = 0, k = 0; i0 < T; i0 += kRows, ++k) {
        // dq[i] = sum_{j} dS_ij k_j over the keys the block sees
        const int jlo = blo[k], jhi = bhi[k];
        tiles(ds.data() + (size_t)i0 * Tp + jlo, Tp, kb.data() + (size_t)jlo * Hp, Hp, jhi - jlo,
              dq.data() + (size_t)i0 * Hp, Hp, 0, HS, Hp);
        // dk[j] = sum_i dS_ij q_i, dv[j] = sum_i A'_ij dout_i for keys j0..j0+kRows-1, over each run
        // [l0, l1) of consecutive rows that see one of these keys (the other rows of dS and A' are 0
        // there): one run unpacked (every row; causal: from j0), in a packed row the keys' example
        // and the padding tail (whose rows see every real key) apart
        const int j0 = i0;
        auto sees = [&](int i) { return m.lo[i] < j0 + kRows && m.hi[i] > j0; };
        bool first_run = true;
        for (int l0 = 0; l0 < T;) {
          if (!sees(l0)) {
            ++l0;
            continue;
          }
          int l1 = l0 + 1;
          while (l1 < T && sees(l1)) ++l1;
          const float *a_ds = ds.data() + (size_t)l0 * Tp + j0, *a_ap = ap.data() + (size_t)l0 * Tp + j0;
          const float *b_q = qb.data() + (size_t)l0 * Hp, *b_do = dob.data() + (size_t)l0 * Hp;
          float *c_k = dk.data() + (size_t)j0 * Hp, *c_v = dv.data() + (size_t)j0 * Hp;
          if (first_run) {
            tiles<true>(a_ds, Tp, b_q, Hp, l1 - l0, c_k, Hp, 0, HS, Hp);
            tiles<true>(a_ap, Tp, b_do, Hp, l1 - l0, c_v, Hp, 0, HS, Hp);
          } else {
            tiles<true, true>(a_ds, Tp, b_q, Hp, l1 - l0, c_k, Hp, 0, HS, Hp);
            tiles<true, true>(a_ap, Tp, b_do, Hp, l1 - l0, c_v, Hp, 0, HS, Hp);
          }
          first_run = false;
          l0 = l1;
        }
        if (first_run)  // no row sees these keys (padding): zero gradients
          for (int r = 0; r < kRows; ++r) {
            std::memset(dk.data() + (size_t)(j0 + r) * Hp, 0, sizeof(float) * Hp);
            std::memset(dv.data() + (size_t)(j0 + r) * Hp, 0, sizeof(float) * Hp);
          }
      }
      for (int t = 0; t < T; ++t) {
        float* __restrict row = dqkv + ((size_t)b * T + t) * C3 + (size_t)h * HS;
        const float* sq = dq.data() + (size_t)t * Hp;
        const float* sk = dk.data() + (size_t)t * Hp;
        const float* sv = dv.data() + (size_t)t * Hp;
        // three loops, not one: with three destinations in one loop GCC left it scalar (11% of the
        // backward at T = 256)
        float* __restrict rq = row;
        float* __restrict rk = row + C;
        float* __restrict rv = row + 2 * C;
#pragma omp simd
        for (int d = 0; d < HS; ++d) rq[d] += sq[d];
#pragma omp simd
        for (int d = 0; d < HS; ++d) rk[d] += sk[d];
#pragma omp simd
        for (int d = 0; d < HS; ++d) rv[d] += sv[d];
      }
    }
  }
}

// KV-cache decoding of position pos: kcache/vcache[B,NH,Tmax,HS] receive k, v of qkv_new[B,3C] at pos,
// then out[B,C] = softmax(q k[0..pos]^T / sqrt(HS)) v[0..pos] (no mask beyond causality, no dropout).
void attention_decode(float* out, const float* qkv_new, float* kcache, float* vcache, int B,
                      int pos, int Tmax, int NH, int HS) {
  NLP_ASSERT(pos >= 0 && pos < Tmax);
  const int C = NH * HS;
  const size_t C3 = 3 * (size_t)C;
  const float sc = 1.0f / std::sqrt(static_cast<float>(HS));
  const int BH = B * NH;
  const int L = pos + 1;
#pragma omp parallel
  {
    std::vector<float> s(L);
#pragma omp for schedule(static)
    for (int bh = 0; bh < BH; ++bh) {
      const int b = bh / NH, h = bh % NH;
      const float* q = qkv_new + (size_t)b * C3 + (size_t)h * HS;
      float* kc = kcache + (size_t)bh * Tmax * HS;
      float* vc = vcache + (size_t)bh * Tmax * HS;
      for (int d = 0; d < HS; ++d) {
        kc[(size_t)pos * HS + d] = q[C + d];
        vc[(size_t)pos * HS + d] = q[2 * C + d];
      }
      float mx = -std::numeric_limits<float>::infinity();
      for (int j = 0; j < L; ++j) {
        const float* __restrict kj = kc + (size_t)j * HS;
        float acc = 0.0f;
        for (int d = 0; d < HS; ++d) acc += q[d] * sc * kj[d];
        s[j] = acc;
        mx = acc > mx ? acc : mx;
      }
      float den = 0.0f;
      for (int j = 0; j < L; ++j) {
        s[j] = exp_nonpositive(s[j] - mx);  // as the forward
        den += s[j];
      }
      const float inv = 1.0f / den;
      float* __restrict o = out + (size_t)b * C + (size_t)h * HS;
      for (int d = 0; d < HS; ++d) o[d] = 0.0f;
      for (int j = 0; j < L; ++j) {
        const float a = s[j] * inv;
        const float* __restrict vj = vc + (size_t)j * HS;
        for (int d = 0; d < HS; ++d) o[d] += a * vj[d];
      }
    }
  }
}

// ---- CpuBackend's ops (cpu_backend_impl.h): each view as an fp32 stand-in (cpu/staged.h) ----

// The forward keeps two floats per query row; the backward recomputes the probabilities from them
// and needs no scratch (attention_backward above)
size_t CpuBackend::attention_saved_floats(int B, int T, int NH, int HS, DType) {
  (void)HS;
  return cpu::attention_stats_floats(B, T, NH);
}

size_t CpuBackend::attention_scratch_floats(int B, int T, int NH, int HS, DType) {
  (void)B, (void)T, (void)NH, (void)HS;
  return 0;
}

void CpuBackend::attention_forward(Act out, float* att, CAct qkv, const int32_t* attn_mask,
                                   bool causal, float dropout_p, uint64_t seed, int B, int T,
                                   int NH, int HS, int T_key, const int32_t* token_key,
                                   int /*examples*/) {
  const size_t n = size_t(B) * T * NH * HS;
  cpu::In q(qkv, 3 * n);
  cpu::Out o(out, n);
  cpu::attention_forward(o, att, q, attn_mask, causal, dropout_p, seed, B, T, NH, HS, T_key,
                         token_key);
}

void CpuBackend::attention_backward(Act dqkv, float* scratch, CAct dout, CAct /*out*/, CAct qkv,
                                    const float* att, const int32_t* attn_mask, bool causal,
                                    float dropout_p, uint64_t seed, int B, int T, int NH, int HS,
                                    int T_key, const int32_t* token_key, int /*examples*/) {
  const size_t n = size_t(B) * T * NH * HS;
  cpu::In d(dout, n), q(qkv, 3 * n);
  cpu::Acc g(dqkv, 3 * n);
  cpu::attention_backward(g, scratch, d, q, att, attn_mask, causal, dropout_p, seed, B, T, NH, HS,
                          T_key, token_key);
}

void CpuBackend::attention_decode(float* out, const float* qkv_new, float* kcache, float* vcache,
                                  int B, int pos, int Tmax, int NH, int HS) {
  cpu::attention_decode(out, qkv_new, kcache, vcache, B, pos, Tmax, NH, HS);
}

}  // namespace nlp::cpu
