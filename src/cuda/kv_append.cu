/*
 * kv_append.cu -- ot_kv_append on CUDA: RoPE on the new tokens' k (and q) and the
 * scatter of k and v into their pages, in one launch.
 *
 * Rows (token, head slot): slot y < heads_q rotates q row (token, y) into q_out; the next
 * heads_kv slots rotate k row (token, h) into its page slot, the last heads_kv copy v.
 * A row finds its sequence by binary search over cu_seqlens_new, its slot from the page
 * table (token t of sequence b is the last n_b of its length_b), and rotates with the
 * device functions of rope.cuh -- the same cos / sin and the same rotation expression
 * as ot_rope_forward, so the cached keys are bit for bit the op's; features [rd, D) are
 * copied bit for bit.
 *
 * Three kernels. kv_append_warp_kernel (RoPE appends of >= 256 tokens, full rotary, 16-bit
 * types, rows as the vector kernel needs them): a warp per token, the token's table lookups
 * and cos / sin made once and reused for all its q, k and v rows -- a prompt's form
 * (ot_rope_kv_append in the engine's prefill); described above the kernel.
 * kv_append_vec_kernel (every row 16-byte aligned, D and the rotary split a
 * whole number of 16-byte vectors): a group of TPR threads (a power of two <= 32 that
 * covers D / VEC vectors) per row, 256 / TPR rows per block; a thread moves whole
 * vectors: a rotated NeoX item is the vectors at x[j..j+VEC) and x[half+j..half+j+VEC),
 * a GPT-J item one vector of VEC / 2 adjacent pairs, a copied item one vector. A prefill
 * append (thousands of tokens, no RoPE) took 47 us per layer for 2048 tokens of 8 x 128
 * kv heads on the H200 with the scalar form alone, about ten times its bandwidth time;
 * the vector form is not measured yet. kv_append_kernel, the scalar form (any D, stride
 * or alignment): one block of 64 threads per row, one pair or element per thread.
 */
#include "../core/paged_attention.h"
#include "common.cuh"
#include "cuda_state.h"
#include "paged_common.cuh"
#include "pdl.cuh"
#include "rope.cuh"

namespace ot {

struct append_params {
  void *k_pages, *v_pages;
  const int32_t *indptr, *indices, *lpl, *cu;
  int64_t num_pages, num_indices, batch, tokens;
  int hkv, bs, d, hq;
  const void *k_new, *v_new;
  int64_t k_ts, k_hs, v_ts, v_hs;
  const void *q;
  void *q_out;
  int64_t q_ts, q_hs, qo_ts, qo_hs;
  const void *positions;
  int pos_i64;
  int64_t pos_stride;
  void *k_out; /* ot_rope_kv_append: rotated k rows also stored here (k_new itself: in place) */
  int64_t ko_ts, ko_hs;
  int *err; /* OT_DEBUG flag or NULL */
  /* RoPE (has_rope == 0: plain copy); field names as rope.cuh expects */
  int has_rope, gptj;
  int64_t rotary_dim, half;
  double theta, l3_factor, l3_low, l3_high, l3_orig;
  double inv_freq[kRopeMaxHalfByValue];
};

/* The source, destination(s) and position of row (tok, y); false: nothing to do for it
 * (a bad table entry, flagged under OT_DEBUG). dst2: k_out's row for a k row of
 * ot_rope_kv_append, else nullptr. */
template <typename T>
__device__ __forceinline__ bool append_row_of(const append_params &p, int64_t tok, int y,
                                              const T **src, T **dst, T **dst2, int64_t *pos,
                                              bool *rotate) {
  *dst2 = nullptr;
  const int64_t b = paged_seq_of(p.cu, p.batch, tok);
  if (!paged_cu_ok(p.cu, b, p.batch, p.tokens, p.err)) return false;
  const int64_t len = paged_seq_len(p.indptr, p.lpl, b, p.bs, p.num_indices, p.err);
  if (len < 0) return false;
  const int64_t n = (int64_t)p.cu[b + 1] - p.cu[b], i = tok - p.cu[b];
  if (n > len) {
    if (p.err) paged_flag(p.err, kPagedTooManyNew, b, b, n);
    return false;
  }
  const int64_t t = len - n + i;
  *pos = t;
  if (p.positions)
    *pos = p.pos_i64 ? static_cast<const int64_t *>(p.positions)[tok * p.pos_stride]
                     : (int64_t) static_cast<const int32_t *>(p.positions)[tok * p.pos_stride];
  if (y < p.hq) {
    *src = static_cast<const T *>(p.q) + tok * p.q_ts + y * p.q_hs;
    *dst = static_cast<T *>(p.q_out) + tok * p.qo_ts + y * p.qo_hs;
    *rotate = true;
    return true;
  }
  const int64_t pidx = (int64_t)p.indptr[b] + t / p.bs;
  const int32_t page = p.indices[pidx];
  if (p.err && (page < 0 || page >= p.num_pages)) {
    paged_flag(p.err, kPagedBadIndex, b, pidx, page);
    return false;
  }
  const bool is_k = y < p.hq + p.hkv;
  const int h = is_k ? y - p.hq : y - p.hq - p.hkv;
  const int64_t off = (((int64_t)page * p.hkv + h) * p.bs + t % p.bs) * p.d;
  if (is_k) {
    *src = static_cast<const T *>(p.k_new) + tok * p.k_ts + h * p.k_hs;
    *dst = static_cast<T *>(p.k_pages) + off;
    if (p.k_out) *dst2 = static_cast<T *>(p.k_out) + tok * p.ko_ts + h * p.ko_hs;
    *rotate = p.has_rope != 0;
  } else {
    *src = static_cast<const T *>(p.v_new) + tok * p.v_ts + h * p.v_hs;
    *dst = static_cast<T *>(p.v_pages) + off;
    *rotate = false;
  }
  return true;
}

/* One row of D features: rotated (rope) or copied from src to dst (and dst2 when given:
 * each thread writes only the elements it has read, so dst2 may be src). */
template <typename T>
__device__ void append_row(const append_params &p, const T *src, T *dst, T *dst2, int64_t pos,
                           bool rotate) {
  const int64_t D = p.d;
  int64_t first_copy = 0;
  if (rotate) {
    const int64_t half = p.half;
    for (int64_t j = threadIdx.x; j < half; j += blockDim.x) {
      float c, sn;
      rope_cos_sin(p, pos, j, &c, &sn);
      const int64_t e1 = p.gptj ? 2 * j : j, e2 = p.gptj ? 2 * j + 1 : half + j;
      float y1, y2;
      rope_rotate(to_f32(src[e1]), to_f32(src[e2]), c, sn, &y1, &y2);
      dst[e1] = from_f32<T>(y1);
      dst[e2] = from_f32<T>(y2);
      if (dst2) dst2[e1] = from_f32<T>(y1), dst2[e2] = from_f32<T>(y2);
    }
    first_copy = p.rotary_dim;
  }
  for (int64_t e = first_copy + threadIdx.x; e < D; e += blockDim.x) {
    const T x = src[e];
    dst[e] = x;
    if (dst2 && dst2 != src) dst2[e] = x;
  }
}

/* The scalar form: grid (token, head slot), 64 threads per row. */
template <typename T>
__global__ void __launch_bounds__(64) kv_append_kernel(const __grid_constant__ append_params p) {
  const int y = blockIdx.y;
  for (int64_t tok = blockIdx.x; tok < p.tokens; tok += gridDim.x) {
    const T *src;
    T *dst, *dst2;
    int64_t pos;
    bool rotate;
    if (!append_row_of<T>(p, tok, y, &src, &dst, &dst2, &pos, &rotate)) return;
    append_row<T>(p, src, dst, dst2, pos, rotate);
  }
}

constexpr int kAppendVecThreads = 256;

/* The vector form: 2^tpr_log2 threads per row, rows r = tok * slots + y (a token's head
 * rows side by side), a grid-stride loop over them. Needs (host, append_vec_ok): D, and
 * with RoPE half (NeoX) or rotary_dim (GPT-J), multiples of VEC; every row of q, q_out,
 * k_new, v_new and the pages starting on 16 bytes. q_out may be q itself: a thread
 * writes only the elements it has read. ROPE = p.has_rope (without it the instance is a
 * plain copy and needs far fewer registers: more rows in flight). */
template <typename T, bool ROPE>
__global__ void __launch_bounds__(kAppendVecThreads)
    kv_append_vec_kernel(const __grid_constant__ append_params p, int tpr_log2) {
  constexpr int V = vec_width<T>::value;
  const int tpr = 1 << tpr_log2, sub = threadIdx.x & (tpr - 1);
  const int64_t rows_per_block = kAppendVecThreads >> tpr_log2;
  const int64_t slots = (int64_t)p.hq + 2 * p.hkv, total = p.tokens * slots;
  const int64_t D = p.d, half = p.half;
  for (int64_t r = (int64_t)blockIdx.x * rows_per_block + (threadIdx.x >> tpr_log2); r < total;
       r += (int64_t)gridDim.x * rows_per_block) {
    const int64_t tok = r / slots;
    const int y = (int)(r - tok * slots);
    const T *src;
    T *dst, *dst2;
    int64_t pos;
    bool rotate;
    if (!append_row_of<T>(p, tok, y, &src, &dst, &dst2, &pos, &rotate)) continue;
    rotate = ROPE && rotate;
    if (!ROPE) dst2 = nullptr;
    /* k_out's copied vectors: not stored in place (they are there already) */
    T *const dst2c = dst2 == src ? nullptr : dst2;
    /* items [0, nrot) rotate, [nrot, items) copy one vector each from feature rd on */
    const int64_t rd = rotate ? p.rotary_dim : 0;
    const int64_t nrot = rotate ? (p.gptj ? rd / V : half / V) : 0;
    const int64_t items = nrot + (D - rd) / V;
    for (int64_t it = sub; it < items; it += tpr) {
      if (!ROPE || it >= nrot) {
        const int64_t e = rd + (it - nrot) * V;
        const uint4 x = *reinterpret_cast<const uint4 *>(src + e);
        *reinterpret_cast<uint4 *>(dst + e) = x;
        if (dst2c) *reinterpret_cast<uint4 *>(dst2c + e) = x;
      } else if (p.gptj) { /* pairs (e + 2u, e + 2u + 1): pair index e / 2 + u */
        const int64_t e = it * V;
        raw16 a;
        a.u = *reinterpret_cast<const uint4 *>(src + e);
        float f[V];
        unpack<T>(f, a);
#pragma unroll
        for (int u = 0; u < V / 2; u++) {
          float c, sn, y1, y2;
          rope_cos_sin(p, pos, e / 2 + u, &c, &sn);
          rope_rotate(f[2 * u], f[2 * u + 1], c, sn, &y1, &y2);
          f[2 * u] = y1;
          f[2 * u + 1] = y2;
        }
        pack<T>(a, f);
        *reinterpret_cast<uint4 *>(dst + e) = a.u;
        if (dst2) *reinterpret_cast<uint4 *>(dst2 + e) = a.u;
      } else { /* NeoX: pairs (e + u, half + e + u): pair index e + u */
        const int64_t e = it * V;
        raw16 a, b;
        a.u = *reinterpret_cast<const uint4 *>(src + e);
        b.u = *reinterpret_cast<const uint4 *>(src + half + e);
        float f1[V], f2[V];
        unpack<T>(f1, a);
        unpack<T>(f2, b);
#pragma unroll
        for (int u = 0; u < V; u++) {
          float c, sn, y1, y2;
          rope_cos_sin(p, pos, e + u, &c, &sn);
          rope_rotate(f1[u], f2[u], c, sn, &y1, &y2);
          f1[u] = y1;
          f2[u] = y2;
        }
        pack<T>(a, f1);
        pack<T>(b, f2);
        *reinterpret_cast<uint4 *>(dst + e) = a.u;
        *reinterpret_cast<uint4 *>(dst + half + e) = b.u;
        if (dst2) {
          *reinterpret_cast<uint4 *>(dst2 + e) = a.u;
          *reinterpret_cast<uint4 *>(dst2 + half + e) = b.u;
        }
      }
    }
  }
}

/* The warp form, for RoPE appends of many tokens (a prompt): a warp per token, as
 * ot_rope_forward's warp kernel (rope.cu). The token's sequence, slot, position and page are
 * found once per warp, its rd / 2 cos / sin made once per warp into the warp's slice of
 * shared memory (the vector kernel makes them again for each of a token's hq + hkv rotated
 * rows: 40 times at 32 + 8 heads, ~50 instructions a pair), then the warp walks the token's
 * rows (q heads, k heads, v heads, one list): lane = hl * IPH + item owns item `item` of
 * every HPW = 32 / IPH-th row. An item is what a rotated row's lane moves: NeoX the
 * vectors at e and half + e, GPT-J the one vector at e of V / 2 pairs; a v row's items
 * are the same vectors, copied. Needs rd == D (no pass-through part), IPH = (NeoX: half,
 * GPT-J: rd) / V a power of two 4..32, and append_vec_ok. A batch of up to U rows' loads
 * is issued before any of their stores (rows of one token never overlap: in place, a lane
 * writes only what it has read). Same cos / sin and rotation as the other kernels: the
 * same bits. Launched as a programmatic dependent (PDL) of the kernel before it, which
 * wrote q, k and v (the prompt's qkv GEMM): its blocks start during that kernel's tail and
 * wait for its writes (ot_pdl_wait); it does not signal its own dependents. */
constexpr int kAppendWarpThreads = 128, kAppendWarpU = 8;

template <typename T, bool GPTJ, int IPH>
__global__ void __launch_bounds__(kAppendWarpThreads)
    kv_append_warp_kernel(const __grid_constant__ append_params p) {
  constexpr int V = vec_width<T>::value, HPW = 32 / IPH, U = kAppendWarpU;
  constexpr int NP = GPTJ ? V / 2 : V; /* pairs per item */
  const int lane = threadIdx.x & 31, item = lane % IPH, hl = lane / IPH;
  const int64_t half = p.half, e0 = (int64_t)item * V;
  const int i0 = item * NP;
  const int wpb = blockDim.x >> 5;
  extern __shared__ float kv_append_cs[]; /* [warps][cos half | sin half] */
  float *cs = kv_append_cs + (threadIdx.x >> 5) * 2 * half;
  const int rows = p.hq + 2 * p.hkv;
  const int passes = (rows + HPW - 1) / HPW;
  const int nb = (passes + U - 1) / U, ub = (passes + nb - 1) / nb;
  const int64_t rstride = (int64_t)p.bs * p.d; /* one kv head of a page */
  ot_pdl_wait(); /* launched as a programmatic dependent: q, k, v are the previous kernel's */
  for (int64_t tok = (int64_t)blockIdx.x * wpb + (threadIdx.x >> 5); tok < p.tokens;
       tok += (int64_t)gridDim.x * wpb) {
    /* the token (warp-uniform: every lane reads the same table entries) */
    const int64_t b = paged_seq_of(p.cu, p.batch, tok);
    if (!paged_cu_ok(p.cu, b, p.batch, p.tokens, p.err)) continue;
    const int64_t len = paged_seq_len(p.indptr, p.lpl, b, p.bs, p.num_indices, p.err);
    if (len < 0) continue;
    const int64_t n = (int64_t)p.cu[b + 1] - p.cu[b];
    if (n > len) {
      if (p.err && lane == 0) paged_flag(p.err, kPagedTooManyNew, b, b, n);
      continue;
    }
    const int64_t t = len - n + (tok - p.cu[b]);
    int64_t pos = t;
    if (p.positions)
      pos = p.pos_i64 ? static_cast<const int64_t *>(p.positions)[tok * p.pos_stride]
                      : (int64_t) static_cast<const int32_t *>(p.positions)[tok * p.pos_stride];
    const int64_t pidx = (int64_t)p.indptr[b] + t / p.bs;
    const int32_t page = p.indices[pidx];
    bool kv_ok = true; /* a bad page id (OT_DEBUG): the q rows only */
    if (p.err && (page < 0 || page >= p.num_pages)) {
      if (lane == 0) paged_flag(p.err, kPagedBadIndex, b, pidx, page);
      kv_ok = false;
    }
    const int64_t slot = ((int64_t)page * p.hkv * p.bs + t % p.bs) * p.d + e0;
    __syncwarp(); /* the previous token's readers of cs are done */
    for (int64_t i = lane; i < half; i += 32) {
      float c, sn;
      rope_cos_sin(p, pos, i, &c, &sn);
      cs[i] = c;
      cs[half + i] = sn;
    }
    __syncwarp();
    float cv[NP], sv[NP];
#pragma unroll
    for (int u = 0; u < NP; u++) cv[u] = cs[i0 + u], sv[u] = cs[half + i0 + u];
    /* row r: its source (+ e0) and destinations; kind 0 q, 1 k, 2 v */
    auto row = [&](int r, const T **src, T **dst, T **dst2) -> int {
      if (r < p.hq) {
        *src = static_cast<const T *>(p.q) + tok * p.q_ts + r * p.q_hs + e0;
        *dst = static_cast<T *>(p.q_out) + tok * p.qo_ts + r * p.qo_hs + e0;
        *dst2 = nullptr;
        return 0;
      }
      if (r < p.hq + p.hkv) {
        const int h = r - p.hq;
        *src = static_cast<const T *>(p.k_new) + tok * p.k_ts + h * p.k_hs + e0;
        *dst = static_cast<T *>(p.k_pages) + slot + h * rstride;
        *dst2 = p.k_out ? static_cast<T *>(p.k_out) + tok * p.ko_ts + h * p.ko_hs + e0 : nullptr;
        return 1;
      }
      const int h = r - p.hq - p.hkv;
      *src = static_cast<const T *>(p.v_new) + tok * p.v_ts + h * p.v_hs + e0;
      *dst = static_cast<T *>(p.v_pages) + slot + h * rstride;
      *dst2 = nullptr;
      return 2;
    };
    for (int bi = 0; bi < nb; bi++) {
      const int rb = hl + bi * ub * HPW; /* this lane's first row of the batch */
      const int cnt = ub < passes - bi * ub ? ub : passes - bi * ub;
      raw16 x1[U], x2[U];
#pragma unroll
      for (int u = 0; u < U; u++) {
        const int r = rb + u * HPW;
        if (u < cnt && r < rows) {
          const T *src;
          T *dst, *dst2;
          const int kind = row(r, &src, &dst, &dst2);
          if (kind == 0 || kv_ok) {
            x1[u].u = *reinterpret_cast<const uint4 *>(src);
            if (!GPTJ) x2[u].u = *reinterpret_cast<const uint4 *>(src + half);
          }
        }
      }
#pragma unroll
      for (int u = 0; u < U; u++) {
        const int r = rb + u * HPW;
        if (u >= cnt || r >= rows) break;
        const T *src;
        T *dst, *dst2;
        const int kind = row(r, &src, &dst, &dst2);
        if (kind != 0 && !kv_ok) continue;
        if (kind != 2) {
          float f1[V], f2[V];
          unpack<T>(f1, x1[u]);
          if (GPTJ) {
#pragma unroll
            for (int j = 0; j < NP; j++)
              rope_rotate(f1[2 * j], f1[2 * j + 1], cv[j], sv[j], &f1[2 * j], &f1[2 * j + 1]);
          } else {
            unpack<T>(f2, x2[u]);
#pragma unroll
            for (int j = 0; j < NP; j++) rope_rotate(f1[j], f2[j], cv[j], sv[j], &f1[j], &f2[j]);
            pack<T>(x2[u], f2);
          }
          pack<T>(x1[u], f1);
        }
        *reinterpret_cast<uint4 *>(dst) = x1[u].u;
        if (!GPTJ) *reinterpret_cast<uint4 *>(dst + half) = x2[u].u;
        if (dst2) {
          *reinterpret_cast<uint4 *>(dst2) = x1[u].u;
          if (!GPTJ) *reinterpret_cast<uint4 *>(dst2 + half) = x2[u].u;
        }
      }
    }
  }
}

static bool vec_ok(const void *ptr, int64_t n1, int64_t s1, int64_t n2, int64_t s2, int64_t V) {
  return ((uintptr_t)ptr & 15u) == 0 && (n1 <= 1 || s1 % V == 0) && (n2 <= 1 || s2 % V == 0);
}

/* Whether kv_append_vec_kernel takes these arguments (its conditions above). */
static bool append_vec_ok(const append_params &p, int64_t V) {
  if (p.d % V != 0 || !vec_ok(p.k_pages, 1, 0, 1, 0, V) || !vec_ok(p.v_pages, 1, 0, 1, 0, V) ||
      !vec_ok(p.k_new, p.tokens, p.k_ts, p.hkv, p.k_hs, V) ||
      !vec_ok(p.v_new, p.tokens, p.v_ts, p.hkv, p.v_hs, V))
    return false;
  if (!p.has_rope) return true;
  if (p.gptj ? p.rotary_dim % V != 0 : p.half % V != 0) return false;
  if (p.k_out && !vec_ok(p.k_out, p.tokens, p.ko_ts, p.hkv, p.ko_hs, V)) return false;
  return p.hq == 0 || (vec_ok(p.q, p.tokens, p.q_ts, p.hq, p.q_hs, V) &&
                       vec_ok(p.q_out, p.tokens, p.qo_ts, p.hq, p.qo_hs, V));
}

/* The warp kernel's items per row (0: it does not take these arguments). Used for RoPE
 * appends of at least kAppendWarpMinTokens tokens (below, the vector kernel's many threads
 * per token start sooner); OT_KV_APPEND_WARP=0 never, 1 whenever it takes the arguments
 * (tests, A/Bs; read at each launch). */
constexpr int64_t kAppendWarpMinTokens = 256;

template <typename T>
static int append_warp_iph(const append_params &p) {
  constexpr int V = vec_width<T>::value;
  if (sizeof(T) != 2 || !p.has_rope || p.rotary_dim != p.d) return 0;
  const int64_t iph = p.gptj ? p.rotary_dim / V : p.half / V;
  if (iph != 4 && iph != 8 && iph != 16 && iph != 32) return 0;
  const char *env = getenv("OT_KV_APPEND_WARP");
  if (env && env[0]) return ot_env_is_zero(env) ? 0 : (int)iph;
  return p.tokens >= kAppendWarpMinTokens ? (int)iph : 0;
}

template <typename T, bool GPTJ, int IPH>
static void append_warp_launch_iph(const ot_cuda_state *cs, const append_params &p,
                                   cudaStream_t s) {
  static std::atomic<int> cached[16] = {}; /* PDL on this device: 1 yes, -1 no */
  const int wpb = kAppendWarpThreads / 32;
  int64_t blocks = (p.tokens + wpb - 1) / wpb;
  if (blocks > 0x7fffffff) blocks = 0x7fffffff;
  const size_t smem = (size_t)wpb * 2 * (size_t)p.half * sizeof(float);
  auto *f = kv_append_warp_kernel<T, GPTJ, IPH>;
  (void)ot_launch_pdl_smem(ot_pdl_ok(cs, f, cached), f, dim3((unsigned)blocks),
                           dim3(kAppendWarpThreads), smem, s, p);
}

template <typename T, bool GPTJ>
static void append_warp_launch(const ot_cuda_state *cs, const append_params &p, int iph,
                               cudaStream_t s) {
  switch (iph) {
    case 4: append_warp_launch_iph<T, GPTJ, 4>(cs, p, s); break;
    case 8: append_warp_launch_iph<T, GPTJ, 8>(cs, p, s); break;
    case 16: append_warp_launch_iph<T, GPTJ, 16>(cs, p, s); break;
    default: append_warp_launch_iph<T, GPTJ, 32>(cs, p, s); break;
  }
}

template <typename T>
static void append_launch(const ot_cuda_state *cs, const append_params &p,
                          const dim3 &scalar_grid, cudaStream_t s) {
  constexpr int V = vec_width<T>::value;
  if (!append_vec_ok(p, V)) {
    kv_append_kernel<T><<<scalar_grid, 64, 0, s>>>(p);
    return;
  }
  if constexpr (sizeof(T) == 2) {
    if (const int iph = append_warp_iph<T>(p)) {
      if (p.gptj) append_warp_launch<T, true>(cs, p, iph, s);
      else append_warp_launch<T, false>(cs, p, iph, s);
      return;
    }
  }
  int tpr_log2 = 0;
  while (tpr_log2 < 5 && ((int64_t)1 << tpr_log2) < p.d / V) tpr_log2++;
  const int64_t rows = p.tokens * ((int64_t)p.hq + 2 * p.hkv);
  const int64_t rows_per_block = kAppendVecThreads >> tpr_log2;
  int64_t blocks = (rows + rows_per_block - 1) / rows_per_block;
  if (blocks > 0x7fffffff) blocks = 0x7fffffff;
  if (p.has_rope)
    kv_append_vec_kernel<T, true><<<(unsigned)blocks, kAppendVecThreads, 0, s>>>(p, tpr_log2);
  else
    kv_append_vec_kernel<T, false><<<(unsigned)blocks, kAppendVecThreads, 0, s>>>(p, tpr_log2);
}

} /* namespace ot */

extern "C" ot_status ot_cuda_kv_append(ot_context *ctx, const ot_kv_append_args *a) {
  static const char *op = "ot_kv_append";
  const ot_paged_table *t = &a->kv;
  if (a->tokens == 0) return OT_OK;
  ot::append_params p;
  memset(&p, 0, sizeof p);
  ot_paged_fill_table(p, t);
  p.cu = a->cu_new;
  p.tokens = a->tokens;
  p.k_new = a->k_new;
  p.v_new = a->v_new;
  p.k_ts = a->k_tok_stride;
  p.k_hs = a->k_head_stride;
  p.v_ts = a->v_tok_stride;
  p.v_hs = a->v_head_stride;
  if (a->rope) {
    const ot_rope_args *r = a->rope;
    p.has_rope = 1;
    p.gptj = r->mode == OT_ROPE_GPTJ;
    p.rotary_dim = r->rotary_dim;
    p.half = r->rotary_dim / 2;
    p.theta = r->theta;
    p.l3_factor = r->llama3_factor;
    p.l3_low = r->llama3_low_freq_factor;
    p.l3_high = r->llama3_high_freq_factor;
    p.l3_orig = r->llama3_original_max_position;
    if (p.half <= ot::kRopeMaxHalfByValue) ot_rope_inv_freq(r, p.inv_freq);
    p.hq = (int)a->hq;
    p.q = a->q;
    p.q_out = a->q_out;
    p.q_ts = a->q_tok_stride;
    p.q_hs = a->q_head_stride;
    p.qo_ts = a->qo_tok_stride;
    p.qo_hs = a->qo_head_stride;
    p.positions = a->positions;
    p.pos_i64 = a->pos_dtype == OT_I64;
    p.pos_stride = a->pos_stride;
    p.k_out = a->k_out;
    p.ko_ts = a->ko_tok_stride;
    p.ko_hs = a->ko_head_stride;
  }
  cudaStream_t s = (cudaStream_t)ctx->stream;
  const ot_cuda_state *cs = ot_cuda_state_of(ctx);
  const bool debug = ot_paged_debug();
  if (debug) {
    p.err = (int *)ot_cuda_scratch(ctx, 256, op);
    if (!p.err) return OT_ERR_OOM;
    OT_CUDA_CHECK(op, cudaMemsetAsync(p.err, 0, 4 * sizeof(int), s));
  }
  const int64_t slots = (int64_t)p.hq + 2 * t->hkv;
  if (slots > 65535)
    return ot_error(OT_ERR_UNSUPPORTED, op, "%lld head rows per token (heads_q + 2 heads_kv), "
                    "the CUDA kernel handles up to 65535", (long long)slots);
  const dim3 grid((unsigned)(a->tokens < 0x7fffffff ? a->tokens : 0x7fffffff), (unsigned)slots);
  switch (a->dtype) {
    case OT_F32: ot::append_launch<float>(cs, p, grid, s); break;
    case OT_F16: ot::append_launch<__half>(cs, p, grid, s); break;
    case OT_BF16: ot::append_launch<__nv_bfloat16>(cs, p, grid, s); break;
    default: return ot_error(OT_ERR_INTERNAL, op, "unexpected dtype %d", (int)a->dtype);
  }
  OT_CUDA_CHECK_LAUNCH(op);
  if (debug) return ot_paged_debug_report(ctx, op, p.err, "cu_seqlens_new");
  return OT_OK;
}
