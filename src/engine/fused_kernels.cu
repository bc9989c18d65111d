/* fused_kernels.cu -- the engine's one-row (batch-1 decode) linears with their input
 * computed in the kernel, so that the latency-bound kernels between the weight streams go:
 *
 *   NORM:   y = rmsnorm(delta + res) W^T (+ b): the residual add and the RMSNorm of the
 *           one row fused into the GEMV that consumes it (qkv, gate_up, lm_head); the sum
 *           h = delta + res (rounded to T, what the unfused norm stores as the residual)
 *           is written to res_out by one warp.
 *   SWIGLU: y = (silu(gate) * up) W^T: the SwiGLU of the row fused into down_proj.
 *   ARGMAX: with NORM at lm_head: the row's argmax (ties to the lowest index, NaN never
 *           chosen) written to argmax_out by the grid's last block.
 *   STAGED: y = x W^T (+ b) for a given row x (o_proj): another kernel, staged_gemv_kernel
 *           (below), which holds all of W on chip, loaded before its PDL wait.
 *   ROWBLOCK: y = x W^T (+ b) + res for a given row x of a long K (down_proj, opt-in):
 *           rowblock_gemv_kernel (below), which splits K over a whole CTA and adds the
 *           residual; rowblock_norm_kernel: the NORM projections with row pairs (qkv with
 *           RoPE and the KV append, gate_up with the SwiGLU; opt-in) on the same scheme.
 *
 * The kernel is the library's small-M GEMV shape (linear.cu): a warp per output row n (or
 * row pair: fused_gemv_kernel's tasks), each lane streaming 16-byte vectors of W's row (8
 * in flight, ld.global.cs) over the whole of K, the warp's dot product by shuffles. Each
 * block forms the input row once into shared memory (NORM: x = h * g in float32 with the
 * block's sum of squares of h; SWIGLU: the rounded T values) behind one barrier, after its
 * first weight loads; the scale is applied to the dot products:
 * y_n = rsqrt(mean(h^2) + eps) * sum_k W[n, k] h_k g_k.
 *
 * Programmatic dependent launch (sm_90 code on a 9.0+ GPU): each warp issues its first
 * weight vectors, then griddepcontrol.wait before it reads any activation; nothing is
 * written before the wait. The weights are never written by the kernels of the step.
 *
 * Numerics: the normalized input is not rounded to T before the product (the unfused path
 * rounds it once, the GEMV then reads it): the product is taken in float32 from h and g,
 * which is closer to the float64 value. The SwiGLU input is rounded to T, as glu.cu's
 * output is (same silu: __expf and __fdividef). */
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>

#include <atomic>
#include <mutex>

#include "../cuda/bulk_copy.cuh"
#include "../cuda/common.cuh"
#include "../cuda/pdl.cuh"
#include "../cuda/rope.cuh"
#include "fused_kernels.h"

namespace {

using ot::from_f32;
using ot::raw16;
using ot::to_f32;
using ot::unpack;
using ot::vec_width;
using ot::warp_sum;

constexpr int kWarps = 4;  /* warps per block: 4 rows of W at a time, as linear.cu */
constexpr int kUnroll = 8; /* W vectors in flight per lane */

enum { kNorm = 0, kSwiglu = 1 }; /* the input row (fused_kernels.h modes) */
/* what a warp task's rows are (below) */
enum { kRows = 0, kRope = 1, kGlu = 2 };

__device__ __forceinline__ float silu_fast(float g) { return __fdividef(g, 1.0f + __expf(-g)); }

/* A 64-bit key whose unsigned order is (value, then lower index): the float's bits made
 * monotone (negative: all bits flipped, else the sign bit set), -0 counted as +0, and the
 * index complemented in the low half. 0 is below every key: "none". */
__device__ __forceinline__ unsigned long long argmax_key(float v, int64_t idx) {
  if (v == 0.0f) v = 0.0f;
  unsigned int u = __float_as_uint(v);
  u = (u & 0x80000000u) ? ~u : (u | 0x80000000u);
  return ((unsigned long long)u << 32) | (unsigned long long)(0xffffffffu - (unsigned int)idx);
}

/* The input elements x[k .. k + V) of the product (MODE above), formed from global
 * memory; NORM: ss += h^2, and h stored to res_out when store_h. */
template <typename T, int MODE>
__device__ __forceinline__ void form_input(const ote_fused_gemv_args &a, int64_t k, bool store_h,
                                           float *ss, float *xf) {
  constexpr int V = vec_width<T>::value;
  if (MODE == kNorm) {
    raw16 hv, gv;
    hv.u = *reinterpret_cast<const uint4 *>(static_cast<const T *>(a.res) + k);
    gv.u = *reinterpret_cast<const uint4 *>(static_cast<const T *>(a.gamma) + k);
    float hf[V], gf[V];
    unpack<T>(hf, hv);
    if (a.delta) {
      raw16 dv;
      dv.u = *reinterpret_cast<const uint4 *>(static_cast<const T *>(a.delta) + k);
      float df[V];
      unpack<T>(df, dv);
#pragma unroll
      for (int i = 0; i < V; i++) hf[i] += df[i];
      ot::pack<T>(hv, hf); /* h rounded to T: the residual stream's value */
      unpack<T>(hf, hv);
    }
    if (store_h) *reinterpret_cast<uint4 *>(static_cast<T *>(a.res_out) + k) = hv.u;
    unpack<T>(gf, gv);
#pragma unroll
    for (int i = 0; i < V; i++) {
      *ss = fmaf(hf[i], hf[i], *ss);
      xf[i] = hf[i] * gf[i];
    }
  } else {
    const T *gu = static_cast<const T *>(a.gate_up); /* [gate | up], K each */
    raw16 av, bv;
    av.u = *reinterpret_cast<const uint4 *>(gu + k);
    bv.u = *reinterpret_cast<const uint4 *>(gu + a.K + k);
    float af[V], bf[V];
    unpack<T>(af, av);
    unpack<T>(bf, bv);
#pragma unroll
    for (int i = 0; i < V; i++) xf[i] = to_f32(from_f32<T>(silu_fast(af[i]) * bf[i]));
  }
}

/* The input row in shared memory: NORM float32 x = h * gamma (the scale applied to the dot
 * products), SWIGLU the rounded T values (exact). */
template <typename T, int MODE>
struct xs_elem {
  typedef float type;
};
template <typename T>
struct xs_elem<T, kSwiglu> {
  typedef T type;
};

/* RoPE parameters in the form rope.cuh's functions read (half above kRopeMaxHalfByValue:
 * the frequency computed by rope_inv_freq_dev, the rule of ot_rope_inv_freq) */
struct rope_p {
  double theta, l3_factor, l3_low, l3_high, l3_orig;
  int64_t rotary_dim, half;
  const double *inv_freq; /* not read (half is above the by-value limit) */
};

/* A warp task is R rows of W (1 or 2): PAIRS kRows: rows R task .. R task + R - 1;
 * kRope (R = 2, NORM, a.rope: the qkv projection with RoPE and the KV append fused): the
 * pair of rows (head * D + j, head * D + D/2 + j), whose two outputs are rotated together
 * (NeoX pair j) -- q in place in y, k into its page slot -- or, for the v heads, copied
 * into the page slot; kGlu (R = 2, a.glu_out: the gate_up projection with the SwiGLU
 * fused): the rows (j, N/2 + j), gate and up of feature j: glu_out[j] = silu(gate) * up
 * from their values rounded to T (what ot_glu_forward reads), rounded to T, and y not
 * written. n[q]: the rows, nv[q]: row n[q] exists (the last task of an odd N has one). */
template <int R, int PAIRS>
__device__ __forceinline__ void task_rows(int64_t t, int64_t tasks, int64_t N, int64_t half,
                                          int64_t (&n)[R], bool (&nv)[R]) {
  if (PAIRS == kRows) {
#pragma unroll
    for (int q = 0; q < R; q++) n[q] = t * R + q, nv[q] = t < tasks && n[q] < N;
  } else if (PAIRS == kGlu) {
    n[0] = t;
    n[R - 1] = t + half;
    nv[0] = nv[R - 1] = t < tasks;
  } else {
    const int64_t head = t / half, j = t - head * half;
    n[0] = head * 2 * half + j;
    n[R - 1] = n[0] + half;
    nv[0] = nv[R - 1] = t < tasks;
  }
}

/* kRope: the step's one token's position (position length - 1 of sequence 0 of the page
 * table) and the cos / sin of task t's pair at it (q and k heads; v heads: not rotated) */
__device__ __forceinline__ int64_t token_pos(const ote_fused_gemv_args &a) {
  const int32_t lo = a.indptr[0], hi = a.indptr[1];
  return (int64_t)(hi - lo - 1) * a.block_size + a.last_page_len[0] - 1;
}
__device__ __forceinline__ void task_angle(const ote_fused_gemv_args &a, int64_t t, int64_t half,
                                           float *c, float *sn) {
  const int64_t head = t / half, j = t - head * half;
  *c = 1.0f, *sn = 0.0f;
  if (head < a.hq + a.hkv) {
    rope_p rp = {a.theta, a.l3_factor, a.l3_low, a.l3_high, a.l3_orig, 2 * half,
                 (int64_t)ot::kRopeMaxHalfByValue + 1, nullptr};
    ot::rope_cos_sin(rp, token_pos(a), j, c, sn);
  }
}

/* The input row of the product formed once per block into shared memory (K elements: 128
 * threads, V at a time; block 0 also stores the NORM residual sum), one barrier (with the
 * NORM sum of squares' partials); returns the NORM scale rsqrt(mean(h^2) + eps), else 1. */
template <typename T, int MODE>
__device__ __forceinline__ float form_row(const ote_fused_gemv_args &a,
                                          typename xs_elem<T, MODE>::type *xs, float *ss_part,
                                          int lane, int warp) {
  constexpr int V = vec_width<T>::value;
  const int64_t K = a.K;
  float ss = 0.0f;
  for (int64_t k = (int64_t)threadIdx.x * V; k < K; k += kWarps * 32 * V) {
    float xf[V];
    form_input<T, MODE>(a, k, MODE == kNorm && a.res_out && blockIdx.x == 0, &ss, xf);
    if (MODE == kNorm) {
      reinterpret_cast<float4 *>(xs + k)[0] = make_float4(xf[0], xf[1], xf[2], xf[3]);
      reinterpret_cast<float4 *>(xs + k)[1] = make_float4(xf[4], xf[5], xf[6], xf[7]);
    } else {
      raw16 r;
      ot::pack<T>(r, xf);
      *reinterpret_cast<uint4 *>(xs + k) = r.u;
    }
  }
  if (MODE == kNorm) {
    ss = warp_sum(ss);
    if (lane == 0) ss_part[warp] = ss;
  }
  __syncthreads();
  float scale = 1.0f;
  if (MODE == kNorm) {
    float t = 0.0f;
#pragma unroll
    for (int i = 0; i < kWarps; i++) t += ss_part[i];
    scale = rsqrtf(t / (float)K + a.eps);
  }
  return scale;
}

/* acc[q] += W vectors w[q][0 .. U) . x at k0 + u * 32 V (x from shared memory) */
template <typename T, int MODE, int R, int U>
__device__ __forceinline__ void dot_vectors(const typename xs_elem<T, MODE>::type *xs,
                                            const raw16 (&w)[R][U], int64_t k0, int64_t K,
                                            float (&acc)[R]) {
  constexpr int V = vec_width<T>::value;
  constexpr int64_t step = 32 * V;
#pragma unroll
  for (int u = 0; u < U; u++) {
    const int64_t k = k0 + u * step;
    if (k >= K) continue;
    float xf[V];
    if (MODE == kNorm) {
      const float4 x0 = reinterpret_cast<const float4 *>(xs + k)[0];
      const float4 x1 = reinterpret_cast<const float4 *>(xs + k)[1];
      xf[0] = x0.x, xf[1] = x0.y, xf[2] = x0.z, xf[3] = x0.w;
      xf[4] = x1.x, xf[5] = x1.y, xf[6] = x1.z, xf[7] = x1.w;
    } else {
      raw16 r;
      r.u = *reinterpret_cast<const uint4 *>(xs + k);
      unpack<T>(xf, r);
    }
#pragma unroll
    for (int q = 0; q < R; q++) {
      float wf[V];
      unpack<T>(wf, w[q][u]);
#pragma unroll
      for (int i = 0; i < V; i++) acc[q] = fmaf(wf[i], xf[i], acc[q]);
    }
  }
}

/* A task's outputs from its warp's partial dot products acc (PAIRS above): the warp sum
 * times scale, the bias, rounded to T, then written (y / glu_out / the page slots) by lane
 * 0; kRows with argmax: the lane's running best. kRope: the pair rotated by lane 0 (its
 * angles from task_angle). */
template <typename T, int R, int PAIRS>
__device__ __forceinline__ void task_out(const ote_fused_gemv_args &a, int64_t task,
                                         int64_t half, const int64_t (&n)[R], const bool (&nv)[R],
                                         const float (&acc)[R], float scale, int lane,
                                         float *best, int64_t *best_n) {
  const T *__restrict__ bias = static_cast<const T *>(a.bias);
  T *__restrict__ y = static_cast<T *>(a.y);
  float v[R];
#pragma unroll
  for (int q = 0; q < R; q++) {
    v[q] = warp_sum(acc[q]) * scale;
    if (bias && nv[q]) v[q] += to_f32(bias[n[q]]); /* nv: an odd N's last pair */
    v[q] = to_f32(from_f32<T>(v[q])); /* the projection's output, as stored */
  }
  if (PAIRS == kGlu) {
    if (lane == 0) static_cast<T *>(a.glu_out)[task] = from_f32<T>(silu_fast(v[0]) * v[R - 1]);
  } else if (PAIRS == kRows) {
#pragma unroll
    for (int q = 0; q < R; q++) {
      if (!nv[q]) continue;
      if (lane == 0) y[n[q]] = from_f32<T>(v[q]);
      if (a.argmax_out && !isnan(v[q]) && (*best_n < 0 || v[q] > *best))
        *best = v[q], *best_n = n[q];
    }
  } else if (lane == 0) {
    const int64_t t = token_pos(a);
    const int64_t head = task / half, j = task - head * half;
    float o0 = v[0], o1 = v[R - 1];
    if (head < a.hq + a.hkv) {
      float c, sn;
      task_angle(a, task, half, &c, &sn);
      ot::rope_rotate(v[0], v[R - 1], c, sn, &o0, &o1);
    }
    if (head < a.hq) { /* q, in place */
      y[n[0]] = from_f32<T>(o0);
      y[n[R - 1]] = from_f32<T>(o1);
    } else {
      const bool is_k = head < a.hq + a.hkv;
      const int64_t h = is_k ? head - a.hq : head - a.hq - a.hkv;
      const int64_t page = a.indices[a.indptr[0] + t / a.block_size];
      T *dst = static_cast<T *>(is_k ? a.k_pages : a.v_pages) +
               ((page * a.hkv + h) * a.block_size + t % a.block_size) * 2 * half;
      dst[j] = from_f32<T>(o0);
      dst[j + half] = from_f32<T>(o1);
    }
  }
}

/* With argmax_out: the block's best (lanes of a warp agree), then the grid's through one
 * 64-bit atomicMax (skipped when the global key is already higher: few blocks ever raise
 * it); the last block to finish writes the index and clears the key and the counter for
 * the next step. */
__device__ __forceinline__ void grid_argmax(const ote_fused_gemv_args &a, float best,
                                            int64_t best_n, int lane, int warp) {
  __shared__ unsigned long long bk[kWarps];
  __shared__ bool last;
  if (lane == 0) bk[warp] = best_n >= 0 ? argmax_key(best, best_n) : 0ull;
  __syncthreads();
  if (threadIdx.x == 0) {
    unsigned long long k = bk[0];
    for (int i = 1; i < kWarps; i++) k = bk[i] > k ? bk[i] : k;
    unsigned long long *gk = a.argmax_key;
    if (k > *reinterpret_cast<volatile unsigned long long *>(gk)) atomicMax(gk, k);
    __threadfence();
    last = atomicAdd(a.argmax_count, 1u) == gridDim.x - 1;
  }
  __syncthreads();
  if (last && threadIdx.x == 0) {
    __threadfence();
    const unsigned long long k = atomicExch(a.argmax_key, 0ull);
    *a.argmax_count = 0u;
    const unsigned int lo = 0xffffffffu - (unsigned int)(k & 0xffffffffull);
    *a.argmax_out = k == 0 || lo >= (unsigned int)a.N ? 0 : (int32_t)lo;
  }
}

template <int R, int PAIRS>
__device__ __forceinline__ int64_t task_half(const ote_fused_gemv_args &a) {
  return PAIRS == kRope ? a.head_dim / 2 : PAIRS == kGlu ? a.N / 2 : 1;
}
template <int R, int PAIRS>
__device__ __forceinline__ int64_t task_count(const ote_fused_gemv_args &a) {
  return PAIRS != kRows ? a.N / 2 : (a.N + R - 1) / R;
}

/* The CTA's share of a.l2_pf's ranges (fused_kernels.h) prefetched to L2 by bulk
 * prefetches (cp.async.bulk.prefetch.L2: the TMA unit fetches the lines, no register or
 * shared memory holds them), CTA b taking 16-byte units [b U / G, (b + 1) U / G) of each
 * range, in chunks of at most kL2PfChunk bytes. Called by one thread. */
constexpr uint32_t kL2PfChunk = 1u << 20;

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
/* one bulk prefetch of n bytes at p (16-byte aligned, n a multiple of 16); last: with the
 * policy pol (createpolicy's evict-last), else the default's */
__device__ __forceinline__ void l2_pf_bulk(const char *p, uint32_t n, bool last,
                                           unsigned long long pol) {
  if (last)
    asm volatile("cp.async.bulk.prefetch.L2.global.L2::cache_hint [%0], %1, %2;\n" ::"l"(p), "r"(n),
                 "l"(pol)
                 : "memory");
  else
    asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;\n" ::"l"(p), "r"(n) : "memory");
}
#endif

__device__ __forceinline__ void l2_prefetch_share(const ote_fused_gemv_args &a) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  unsigned long long pol = 0;
  if (a.l2_pf_last) asm volatile("createpolicy.fractional.L2::evict_last.b64 %0, 1.0;\n" : "=l"(pol));
  const int64_t G = gridDim.x, b = blockIdx.x;
#pragma unroll 1
  for (int i = 0; i < OTE_L2_PF_RANGES; i++) {
    const int64_t units = a.l2_pf_bytes[i] >> 4;
    if (!a.l2_pf[i] || units <= 0) continue;
    const char *p = static_cast<const char *>(a.l2_pf[i]);
    int64_t off = b * units / G * 16;
    const int64_t end = (b + 1) * units / G * 16;
    while (off < end) {
      const int64_t left = end - off;
      const uint32_t n = left < (int64_t)kL2PfChunk ? (uint32_t)left : kL2PfChunk;
      l2_pf_bulk(p + off, n, a.l2_pf_last, pol);
      off += n;
    }
  }
#else
  (void)a;
#endif
}

/* The fused kernel's: range 0 only, 32-bit unit counts (ranges under 64 GB; the whole
 * share a bulk prefetch or two) -- the fewest registers (the general form above spilled in
 * its RoPE instance); l2_pf_last: evict-last. */
__device__ __forceinline__ void l2_prefetch_first(const ote_fused_gemv_args &a) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  unsigned long long pol = 0;
  if (a.l2_pf_last) asm volatile("createpolicy.fractional.L2::evict_last.b64 %0, 1.0;\n" : "=l"(pol));
  const uint32_t units = (uint32_t)(a.l2_pf_bytes[0] >> 4), G = gridDim.x, b = blockIdx.x;
  const char *p = static_cast<const char *>(a.l2_pf[0]);
  uint64_t off = (uint64_t)((uint64_t)b * units / G) * 16;
  const uint64_t end = (uint64_t)((uint64_t)(b + 1) * units / G) * 16;
  for (; off < end; off += kL2PfChunk) {
    const uint64_t left = end - off;
    const uint32_t n = left < kL2PfChunk ? (uint32_t)left : kL2PfChunk;
    l2_pf_bulk(p + off, n, a.l2_pf_last, pol);
  }
#else
  (void)a;
#endif
}

/* The kernel. Each block forms the input row once, into shared memory, after its warps
 * have issued their first weight vectors and passed the PDL wait; then its warps take
 * tasks (grid-stride), each task's K in rounds of kUnroll / R vectors a row: the round's
 * loads, then its products. */
template <typename T, int MODE, int R, int PAIRS>
__global__ void __launch_bounds__(kWarps * 32, 6) fused_gemv_kernel(ote_fused_gemv_args a) {
  typedef typename xs_elem<T, MODE>::type X;
  extern __shared__ __align__(16) unsigned char fg_smem[];
  X *xs = reinterpret_cast<X *>(fg_smem);
  __shared__ float ss_part[kWarps];
  constexpr int V = vec_width<T>::value;
  constexpr int UR = kUnroll / R; /* vectors in flight per row */
  constexpr int64_t step = 32 * V;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int64_t K = a.K, N = a.N;
  const int64_t half = task_half<R, PAIRS>(a), tasks = task_count<R, PAIRS>(a);
  const int64_t warps = (int64_t)gridDim.x * kWarps;
  const T *__restrict__ W = static_cast<const T *>(a.w);

  int64_t task = (int64_t)blockIdx.x * kWarps + warp;
  int64_t n[R];
  bool nv[R];
  raw16 wv[R][UR];
  auto load_w = [&](int64_t k0) {
#pragma unroll
    for (int u = 0; u < UR; u++)
#pragma unroll
      for (int q = 0; q < R; q++)
        ot::load_raw<T, true, true>(wv[q][u], W + n[q] * K, k0 + u * step, K,
                                    nv[q] && k0 + u * step < K);
  };
  task_rows<R, PAIRS>(task, tasks, N, half, n, nv);
  load_w((int64_t)lane * V); /* the first weight vectors: before the wait */
  if (a.l2_pf_early && threadIdx.x == 0 && a.l2_pf[0]) l2_prefetch_first(a);
  ot_pdl_wait(); /* the previous kernel's outputs (delta, res, gate_up) are ours now */
  const float scale = form_row<T, MODE>(a, xs, ss_part, lane, warp);

  float best = 0.0f;
  int64_t best_n = -1;
  bool first = true;
  for (; task < tasks; task += warps) {
    if (!first) task_rows<R, PAIRS>(task, tasks, N, half, n, nv);
    float acc[R];
#pragma unroll
    for (int q = 0; q < R; q++) acc[q] = 0.0f;
    for (int64_t k0 = (int64_t)lane * V; k0 < K; k0 += step * UR) {
      if (!first) load_w(k0);
      first = false;
      dot_vectors<T, MODE, R, UR>(xs, wv, k0, K, acc);
    }
    first = false;
    if (task + warps >= tasks) ot_pdl_launch_dependents(); /* this warp's last loads are issued */
    task_out<T, R, PAIRS>(a, task, half, n, nv, acc, scale, lane, &best, &best_n);
  }
  /* a later kernel's weights (OTE_L2_PF_OPROJ: the o_proj's, from qkv) once warp 0's
   * loads are done: the DRAM's tail of this kernel and the decode attention */
  if (!a.l2_pf_early && threadIdx.x == 0 && a.l2_pf[0]) l2_prefetch_first(a);
  if (a.argmax_out) grid_argmax(a, best, best_n, lane, warp);
}

/* ---- STAGED: y = x W^T (+ b) for one given row x (o_proj of the batch-1 decode) ---------- *
 * The weight is held on chip before the input exists: CTA b takes rows [b N / G, (b + 1) N
 * / G) of W (at most kStageRows), and thread t the 16-byte column vector k = 8 t of each
 * of them (K / 8 threads, rounded up to whole warps): the first kStageRegRows rows into
 * registers, the rest into dynamic shared memory by cp.async (the thread's own vectors, so
 * no barrier), all issued BEFORE the PDL wait -- while the kernels before it (the decode
 * attention and its merge, during which the DRAM is mostly idle) finish. After the wait a
 * thread reads its 8 values of x, takes its kStageRows dot products of 8, and the warp
 * reduce-scatters them (31 shuffles: lane r ends with row r's warp sum); the warps' sums
 * add through shared memory in warp order, so each row's value is the same whatever G. */
constexpr int kStageRows = 32;    /* rows of W a CTA at most (the lanes of a warp) */
constexpr int kStageRegRows = 8;  /* of them in registers, the rest in shared memory */
constexpr int kStageThreads = 512; /* at most: K <= 4096 */

__device__ __forceinline__ void stage_cp16(void *dst, const void *src) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(
                   (unsigned)__cvta_generic_to_shared(dst)),
               "l"(src)
               : "memory");
#endif
}
__device__ __forceinline__ void stage_cp_commit_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.commit_group;\ncp.async.wait_group 0;\n" ::: "memory");
#endif
}

template <typename T>
__device__ __forceinline__ float dot8(const raw16 &w, const float (&x)[8]) {
  float wf[8];
  unpack<T>(wf, w);
  float s = 0.0f;
#pragma unroll
  for (int i = 0; i < 8; i++) s = fmaf(wf[i], x[i], s);
  return s;
}

/* One step of the warp's reduce-scatter of 2 O rows' partials p[0, 2 O): a lane keeps the O
 * rows of its half (bit O of the lane set: the upper one) at p[0, O), their sums with the
 * lane O apart's. */
template <int O>
__device__ __forceinline__ void stage_scatter(float (&p)[kStageRows], int lane) {
  const bool up = (lane & O) != 0;
#pragma unroll
  for (int i = 0; i < O; i++) {
    const float send = up ? p[i] : p[i + O], keep = up ? p[i + O] : p[i];
    p[i] = keep + __shfl_xor_sync(0xffffffffu, send, O);
  }
}

/* The whole reduce-scatter of 32 rows' partials over a warp: lane r ends with row r's warp
 * sum at p[0]. */
__device__ __forceinline__ void stage_scatter32(float (&p)[kStageRows], int lane) {
  stage_scatter<16>(p, lane);
  stage_scatter<8>(p, lane);
  stage_scatter<4>(p, lane);
  stage_scatter<2>(p, lane);
  stage_scatter<1>(p, lane);
}

/* The warp's sums of 8 rows' partials p[0, 8): lane i ends with row (i & 7)'s at p[0]
 * (stage_scatter's halving over 8 rows, then the lanes 8 and 16 apart added). The
 * products' loops take rows 8 at a time through it: the kernels that use it run once a
 * layer, and their unrolled straight-line code cost more in instruction fetches than its
 * arithmetic (2026-12-07, H100 stamps of attn_oproj_kernel). */
__device__ __forceinline__ void stage_scatter8(float (&p)[8], int lane) {
#pragma unroll
  for (int o = 4; o > 0; o >>= 1) {
    const bool up = (lane & o) != 0;
#pragma unroll
    for (int i = 0; i < o; i++) {
      const float send = up ? p[i] : p[i + o], keep = up ? p[i + o] : p[i];
      p[i] = keep + __shfl_xor_sync(0xffffffffu, send, o);
    }
  }
  p[0] += __shfl_xor_sync(0xffffffffu, p[0], 8);
  p[0] += __shfl_xor_sync(0xffffffffu, p[0], 16);
}

template <typename T>
__global__ void __launch_bounds__(kStageThreads, 1) staged_gemv_kernel(ote_fused_gemv_args a) {
  static_assert(vec_width<T>::value == 8, "16-bit types");
  extern __shared__ __align__(16) unsigned char fg_smem[];
  uint4 *ws = reinterpret_cast<uint4 *>(fg_smem);
  __shared__ float red[kStageThreads / 32][kStageRows];
  const int t = threadIdx.x, lane = t & 31, warp = t >> 5;
  const int64_t K = a.K, N = a.N, G = gridDim.x;
  const int64_t r0 = (int64_t)blockIdx.x * N / G, r1 = ((int64_t)blockIdx.x + 1) * N / G;
  const int nr = (int)(r1 - r0);
  const bool kin = (int64_t)t * 8 < K;
  const int64_t kv = K / 8; /* vectors a row */
  const T *__restrict__ W = static_cast<const T *>(a.w) + r0 * K + (int64_t)t * 8;
  raw16 wr[kStageRegRows];
#pragma unroll
  for (int r = 0; r < kStageRegRows; r++)
    ot::load_raw<T, true, true>(wr[r], W + r * K, 0, 8, kin && r < nr);
  /* the shared-memory rows */
  if (kin)
    for (int r = kStageRegRows; r < nr; r++) stage_cp16(ws + (r - kStageRegRows) * kv + t, W + r * K);
  if (t == 0) l2_prefetch_share(a); /* a later kernel's weights (OTE_L2_PF_*), after ours */
  ot_pdl_wait(); /* x (the attention's output) is ours now */
  float xf[8];
  {
    raw16 xv;
    ot::load_raw<T, true, false>(xv, static_cast<const T *>(a.x) + (int64_t)t * 8, 0, 8, kin);
    unpack<T>(xf, xv);
  }
  float p[kStageRows];
#pragma unroll
  for (int r = 0; r < kStageRegRows; r++) p[r] = dot8<T>(wr[r], xf);
  stage_cp_commit_wait();
#pragma unroll
  for (int r = kStageRegRows; r < kStageRows; r++) {
    p[r] = 0.0f;
    if (kin && r < nr) {
      raw16 w;
      w.u = ws[(r - kStageRegRows) * kv + t];
      p[r] = dot8<T>(w, xf);
    }
  }
  stage_scatter32(p, lane); /* 32 rows over the lanes: lane r ends with row r's sum */
  red[warp][lane] = p[0];
  __syncthreads();
  ot_pdl_launch_dependents(); /* every load of the CTA is done */
  if (warp == 0 && lane < nr) {
    const int nw = (int)(blockDim.x >> 5);
    float v = 0.0f;
    for (int w = 0; w < nw; w++) v += red[w][lane];
    if (a.bias) v += to_f32(static_cast<const T *>(a.bias)[r0 + lane]);
    static_cast<T *>(a.y)[r0 + lane] = from_f32<T>(v);
  }
}

/* ---- ROWBLOCK: y = x W^T (+ b) (+ res) for one given row x of a long K (down_proj) ------- *
 * The batch-1 decode's down projection (K = ffn 14336, N = hidden 4096 at the 8B shape) in
 * one kernel, in place of cuBLASLt's split-K GEMV + its reduce kernel, with the residual add
 * of the next norm folded in. CTA b takes rows [b N / G, (b + 1) N / G) of W; G is the
 * fewest CTAs that keep the most rows a CTA of one CTA per SM (ceil(N / SMs): 32 rows for
 * every one of 128 CTAs at N 4096 on 132 SMs -- no CTA with a row more than the others,
 * each streaming 32 contiguous rows, 896 KB). Thread t holds the 16-byte column vectors t +
 * j T (j < kRbVecs, T = the CTA's threads, K / 32 rounded up to warps: 448 at K 14336) of
 * each row, so K is split over the whole CTA and a row is one round of loads, not 56 as
 * for a warp; the rows stream through a register ring of D rows (D x kRbVecs vectors in
 * flight a thread: 114 KB a CTA at D 4), the first D issued BEFORE the PDL wait (the
 * weight is never written by the step). After the wait a thread reads its kRbVecs vectors
 * of x once; row i's dot product takes ring slot i % D, which is then refilled with row i
 * + D. At the end of a pass of 32 rows the warp reduce-scatters its partials (stage_scatter:
 * lane r ends with row r's warp sum), the warps' sums add through shared memory in warp
 * order, and lane r of warp 0 writes y[n] = round(round(v + b) + res[n]) -- the unfused
 * step's delta rounded, then the residual sum rounded, as the next norm would form it --
 * where res may alias y (each element read and written by one thread). A row's value
 * depends only on K (the threads and their vectors), never on G or D: bit-stable across
 * grids. No second kernel: the on-chip reduce replaces split-K's. */
constexpr int kRbVecs = 4;      /* 16-byte vectors a thread a row: K <= 8 * 4 * 512 = 16384 */
constexpr int kRbThreads = 512; /* at most */

template <typename T>
__device__ __forceinline__ float dot8_raw(const raw16 &w, const raw16 &x) {
  float xf[8];
  unpack<T>(xf, x);
  return dot8<T>(w, xf);
}

template <typename T, int D>
__global__ void __launch_bounds__(kRbThreads, 1) rowblock_gemv_kernel(ote_fused_gemv_args a) {
  static_assert(vec_width<T>::value == 8, "16-bit types");
  __shared__ float red[kRbThreads / 32][kStageRows];
  const int t = threadIdx.x, lane = t & 31, warp = t >> 5, nt = (int)blockDim.x;
  const int64_t K = a.K, N = a.N, G = gridDim.x, kv = K / 8;
  const int64_t r0 = (int64_t)blockIdx.x * N / G, r1 = ((int64_t)blockIdx.x + 1) * N / G;
  bool kin[kRbVecs];
#pragma unroll
  for (int j = 0; j < kRbVecs; j++) kin[j] = t + (int64_t)j * nt < kv;
  const T *__restrict__ W = static_cast<const T *>(a.w) + r0 * K + (int64_t)t * 8;
  const T *res = static_cast<const T *>(a.res); /* (may be y) */
  const T *__restrict__ bias = static_cast<const T *>(a.bias);
  raw16 xr[kRbVecs];
  for (int64_t p0 = r0; p0 < r1; p0 += kStageRows) { /* passes of up to 32 rows */
    const int nr = (int)(r1 - p0 < kStageRows ? r1 - p0 : kStageRows);
    const bool last = p0 + kStageRows >= r1;
    const T *Wp = W + (p0 - r0) * K;
    raw16 w[D][kRbVecs];
#pragma unroll
    for (int d = 0; d < D; d++)
#pragma unroll
      for (int j = 0; j < kRbVecs; j++)
        ot::load_raw<T, true, true>(w[d][j], Wp + d * K, (int64_t)j * nt * 8, K,
                                    kin[j] && d < nr);
    if (p0 == r0) {
      ot_pdl_wait(); /* x (the SwiGLU row) and res are the previous kernels' */
#pragma unroll
      for (int j = 0; j < kRbVecs; j++)
        ot::load_raw<T, true, false>(xr[j], static_cast<const T *>(a.x) + (int64_t)t * 8,
                                     (int64_t)j * nt * 8, K, kin[j]);
    }
    float rv = 0.0f; /* warp 0, lane r: row p0 + r's residual and bias, loaded early */
    if (warp == 0 && lane < nr) {
      if (res) rv = to_f32(res[p0 + lane]);
    }
    float p[kStageRows];
#pragma unroll
    for (int i = 0; i < kStageRows; i++) {
      /* the last pass's last loads were issued at row nr - D - 1 */
      if (last && i == (nr > D ? nr - D : 0)) ot_pdl_launch_dependents();
      p[i] = 0.0f;
      if (i < nr) {
#pragma unroll
        for (int j = 0; j < kRbVecs; j++) p[i] += dot8_raw<T>(w[i % D][j], xr[j]);
      }
      if (i + D < kStageRows)
#pragma unroll
        for (int j = 0; j < kRbVecs; j++)
          ot::load_raw<T, true, true>(w[i % D][j], Wp + (i + D) * K, (int64_t)j * nt * 8, K,
                                      kin[j] && i + D < nr);
    }
    stage_scatter32(p, lane); /* lane r ends with row r's warp sum */
    red[warp][lane] = p[0];
    __syncthreads();
    if (warp == 0 && lane < nr) {
      float v = 0.0f;
      for (int q = 0; q < (nt >> 5); q++) v += red[q][lane];
      if (bias) v += to_f32(bias[p0 + lane]);
      T out = from_f32<T>(v); /* the projection's output, as stored */
      if (res) out = from_f32<T>(to_f32(out) + rv);
      static_cast<T *>(a.y)[p0 + lane] = out;
    }
    if (!last) __syncthreads(); /* red is the next pass's */
  }
}

/* ---- ROWBLOCK NORM: the norm-fed projections of fused_gemv_kernel with row pairs --
 * qkv (kRope: rmsnorm(delta + res) Wqkv^T (+ b), q and k rotated, k and v to the token's
 * page slot) and gate_up (kGlu: silu(gate) * up of rmsnorm(delta + res) Wgu^T to glu_out)
 * -- on the rowblock scheme (opt-in: OTE_FUSED_QKV / OTE_FUSED_GATEUP = 1, 2 must run). K
 * (hidden) is split over the whole CTA: thread t of T (K / 16 rounded up to warps: 256 at
 * K 4096) holds the 16-byte column vectors t and t + T of every row. CTA b takes the
 * pairs [b P / G, (b + 1) P / G) of the P = N / 2 (kRope: pair (head, j), rows head D + j
 * and head D + D / 2 + j; kGlu: rows j and P + j), G the fewest CTAs that keep ceil(P /
 * SMs) pairs a CTA (qkv: 128 of 24 at the 8B's 3072 on 132 SMs), in passes of 16 pairs:
 * slot i < 16 the first row of pair i, slot 16 + i its second. The rows stream through a
 * register ring of D rows that runs on across passes (the next pass's first rows are in
 * flight during a pass's reduce), the first D issued BEFORE the PDL wait. After the wait a
 * thread forms x = h * gamma at its own 2 vectors only (h = res + delta rounded, CTA 0
 * storing it to res_out; its sum of squares one more partial): no shared row, no barrier
 * before the products. At a pass's end the warp reduce-scatters its partials (lane r:
 * slot r), the warps' sums add through shared memory in warp order (two buffers by pass
 * parity: one barrier a pass), and warp 0 scales (rsqrt of the CTA's sum of squares, which
 * is the whole row's), adds the bias, rounds, brings each pair's second row 16 lanes down
 * (one shuffle) and writes as fused_gemv_kernel's task_out does (kRope: rotated by the
 * cos / sin of the CTA's pairs, computed once right after the wait -- float64 pow and
 * sincos -- spread over the warps, a few lanes each, into dynamic shared memory: the run of
 * 79383d9 had warp 0 compute each pass's 16 at the pass's start while the other warps
 * waited at the pass's barrier). A row's value depends only on K, never on G or D. */
constexpr int kRqVecs = 2;     /* 16-byte vectors a thread a row: K <= 8 * 2 * 256 = 4096 */
constexpr int kRqThreads = 256; /* at most */

/* (ring of 4: at most 128 registers a thread, two CTAs an SM -- a CTA then fits beside the
 * previous kernel's last blocks; ring of 8: 125-152 registers, one) */
template <typename T, int D, int PAIRS>
__global__ void __launch_bounds__(kRqThreads, D == 4 ? 2 : 1)
    rowblock_norm_kernel(ote_fused_gemv_args a) {
  static_assert(vec_width<T>::value == 8, "16-bit types");
  static_assert(8 % D == 0, "the ring runs on across groups of 8 slots and passes");
  static_assert(PAIRS == kRope || PAIRS == kGlu, "row pairs");
  __shared__ float red[2][kRqThreads / 32][kStageRows];
  __shared__ float ssr[kRqThreads / 32];
  extern __shared__ __align__(16) unsigned char fg_smem[];
  float2 *cs = reinterpret_cast<float2 *>(fg_smem); /* kRope: the CTA's pairs' cos / sin */
  const int t = threadIdx.x, lane = t & 31, warp = t >> 5, nt = (int)blockDim.x;
  const int64_t K = a.K, kv = K / 8, G = gridDim.x, P = a.N / 2;
  const int64_t half = PAIRS == kRope ? a.head_dim / 2 : P;
  const int64_t q0 = (int64_t)blockIdx.x * P / G, q1 = ((int64_t)blockIdx.x + 1) * P / G;
  const int passes = (int)((q1 - q0 + 15) / 16);
  bool kin[kRqVecs];
#pragma unroll
  for (int j = 0; j < kRqVecs; j++) kin[j] = t + (int64_t)j * nt < kv;
  const T *__restrict__ W = static_cast<const T *>(a.w) + (int64_t)t * 8;
  /* a pass's first pair's first row, and (kRope) its j: slot i's row is base + (i & 15),
   * plus half when (kRope) its pair is past the head's end -- half >= 16, so at most once
   * --, plus half for the pair's second row */
  auto pass_base = [&](int pass, int64_t *row, int64_t *j0) {
    const int64_t p = q0 + (int64_t)pass * 16;
    if (PAIRS == kRope) {
      const int64_t head = p / half;
      *j0 = p - head * half;
      *row = head * 2 * half + *j0;
    } else {
      *j0 = 0;
      *row = p;
    }
  };
  auto slot_row = [&](int64_t row, int64_t j0, int i) {
    const int r = i & 15;
    return row + r + (PAIRS == kRope && j0 + r >= half ? half : 0) + (i >= 16 ? half : 0);
  };
  auto slot_ok = [&](int pass, int i) {
    return pass < passes && q0 + (int64_t)pass * 16 + (i & 15) < q1;
  };
  auto load_row = [&](raw16(&w)[kRqVecs], int64_t n, bool ok) {
#pragma unroll
    for (int j = 0; j < kRqVecs; j++)
      ot::load_raw<T, true, true>(w[j], W + n * K, (int64_t)j * nt * 8, K, kin[j] && ok);
  };
  int64_t row = 0, j0 = 0, nrow = 0, nj0 = 0; /* this pass's base, and the next one's */
  pass_base(0, &row, &j0);
  raw16 w[D][kRqVecs];
#pragma unroll
  for (int d = 0; d < D; d++) load_row(w[d], slot_row(row, j0, d), slot_ok(0, d));
  ot_pdl_wait(); /* delta, res (the previous kernels') are ours now */
  float xf[kRqVecs][8];
  float ss = 0.0f;
#pragma unroll
  for (int j = 0; j < kRqVecs; j++) {
#pragma unroll
    for (int i = 0; i < 8; i++) xf[j][i] = 0.0f;
    if (kin[j])
      form_input<T, kNorm>(a, (t + (int64_t)j * nt) * 8, a.res_out && blockIdx.x == 0, &ss, xf[j]);
  }
  /* kRope: the token's position and page slot (warp 0 writes), and the cos / sin of the
   * CTA's pairs (pair i by lane i / warps of warp i % warps: every warp a few lanes, one
   * angle's latency while the ring's first rows are in flight; read after a barrier) */
  int64_t pos = 0, page = 0;
  if (PAIRS == kRope) {
    if (warp == 0) {
      pos = token_pos(a);
      page = a.indices[a.indptr[0] + pos / a.block_size];
    }
    const int nw = nt >> 5;
    for (int64_t i = warp + (int64_t)nw * lane; i < q1 - q0; i += (int64_t)nw * 32) {
      float c, sn;
      task_angle(a, q0 + i, half, &c, &sn);
      cs[i] = make_float2(c, sn);
    }
  }
  float scale = 0.0f;
  for (int pass = 0; pass < passes; pass++) {
    pass_base(pass + 1, &nrow, &nj0);
    const bool last = pass == passes - 1;
    float(*rd)[kStageRows] = red[pass & 1];
    /* the pass's 32 slots in 4 groups of 8 (a runtime loop: the registers hold 8 partials
     * and the ring, not 32 slots' addresses); a group's partials reduce-scattered over the
     * warp (lane r: slot r % 8's warp sum, 9 shuffles), lanes 0-7 store them */
    for (int g = 0; g < kStageRows / 8; g++) {
      float p[8];
#pragma unroll
      for (int d = 0; d < 8; d++) {
        const int i = g * 8 + d; /* (ring slot i % D = d % D: D divides 8) */
        p[d] = 0.0f;
#pragma unroll
        for (int j = 0; j < kRqVecs; j++) p[d] += dot8<T>(w[d % D][j], xf[j]);
        if (i + D < kStageRows)
          load_row(w[d % D], slot_row(row, j0, i + D), slot_ok(pass, i + D));
        else
          load_row(w[d % D], slot_row(nrow, nj0, i + D - kStageRows),
                   slot_ok(pass + 1, i + D - kStageRows));
        /* the last slot's loads went out at slot 31 - D of the last pass */
        if (last && i == kStageRows - 1 - D) ot_pdl_launch_dependents();
      }
      float q[kStageRows];
#pragma unroll
      for (int d = 0; d < 8; d++) q[d] = p[d];
      stage_scatter<4>(q, lane); /* lane r: slot r % 8 over the lanes of equal r / 8 */
      stage_scatter<2>(q, lane);
      stage_scatter<1>(q, lane);
      q[0] += __shfl_xor_sync(0xffffffffu, q[0], 8);
      q[0] += __shfl_xor_sync(0xffffffffu, q[0], 16);
      if (lane < 8) rd[warp][g * 8 + lane] = q[0];
    }
    if (pass == 0) {
      const float s = warp_sum(ss);
      if (lane == 0) ssr[warp] = s;
    }
    __syncthreads();
    if (warp == 0) {
      if (pass == 0) {
        float s = 0.0f;
        for (int q = 0; q < (nt >> 5); q++) s += ssr[q];
        scale = rsqrtf(s / (float)K + a.eps);
      }
      float v = 0.0f;
      for (int q = 0; q < (nt >> 5); q++) v += rd[q][lane];
      v *= scale;
      const bool ok = slot_ok(pass, lane);
      const int64_t n = slot_row(row, j0, lane);
      if (a.bias && ok) v += to_f32(static_cast<const T *>(a.bias)[n]);
      v = to_f32(from_f32<T>(v)); /* the projection's output, as stored */
      const float v2 = __shfl_xor_sync(0xffffffffu, v, 16); /* the pair's second row */
      const int64_t pair = q0 + (int64_t)pass * 16 + lane;
      if (lane < 16 && ok) {
        if (PAIRS == kGlu) {
          static_cast<T *>(a.glu_out)[pair] = from_f32<T>(silu_fast(v) * v2);
        } else {
          const int64_t head = pair / half, jj = pair - head * half;
          float o0 = v, o1 = v2;
          if (head < a.hq + a.hkv) {
            const float2 r = cs[pass * 16 + lane];
            ot::rope_rotate(v, v2, r.x, r.y, &o0, &o1);
          }
          if (head < a.hq) { /* q, in place */
            static_cast<T *>(a.y)[n] = from_f32<T>(o0);
            static_cast<T *>(a.y)[n + half] = from_f32<T>(o1);
          } else {
            const bool is_k = head < a.hq + a.hkv;
            const int64_t h = is_k ? head - a.hq : head - a.hq - a.hkv;
            T *dst = static_cast<T *>(is_k ? a.k_pages : a.v_pages) +
                     ((page * a.hkv + h) * a.block_size + pos % a.block_size) * 2 * half;
            dst[jj] = from_f32<T>(o0);
            dst[jj + half] = from_f32<T>(o1);
          }
        }
      }
    }
    /* (red[pass & 1] is next written two passes on, after a barrier that warp 0 passes
     * only once done reading it) */
    row = nrow, j0 = nj0;
  }
}

/* A device attribute (the SM count, the compute capability major, the shared memory a block
 * may opt in to), once per device (ot_per_device_id, pdl.cuh): `fail` when the query fails,
 * -1 for a value below 1 */
int dev_attr(int dev, cudaDeviceAttr attr, std::atomic<int> *cache, int fail) {
  return ot_per_device_id(dev, cache, [dev, attr, fail]() {
    int v = 0;
    if (cudaDeviceGetAttribute(&v, attr, dev) != cudaSuccess) {
      (void)cudaGetLastError();
      v = fail;
    }
    return v < 1 ? -1 : v; /* (never 0: the cache's "not asked") */
  });
}
int sm_count(int dev) {
  static std::atomic<int> cache[16] = {};
  const int v = dev_attr(dev, cudaDevAttrMultiProcessorCount, cache, 1);
  return v < 1 ? 1 : v;
}

/* Whether f may be launched as a programmatic dependent on device dev (ot_pdl_ok_id,
 * pdl.cuh: a 9.0+ GPU running f's sm_90+ code; once per kernel and device: cache is f's) */
template <typename F>
bool pdl_ok(F *f, int dev, std::atomic<int> *cache) {
  static std::atomic<int> major[16] = {};
  return ot_pdl_ok_id(dev, dev_attr(dev, cudaDevAttrComputeCapabilityMajor, major, 0), f, cache);
}

/* Blocks of f per SM with smem bytes of dynamic shared memory, per device and size: the
 * cache holds (smem << 8 | blocks) for the last size asked (one engine's shapes ask one
 * size per kernel; another size is asked again) */
template <typename F>
int resident_blocks(F *f, size_t smem, int dev, std::atomic<long long> *cache) {
  if (dev >= 0 && dev < 16) {
    const long long c = cache[dev].load(std::memory_order_relaxed);
    if (c != 0 && (size_t)(c >> 8) == smem) return (int)(c & 255);
  }
  int b = 0;
  if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&b, f, kWarps * 32, smem) != cudaSuccess) {
    (void)cudaGetLastError();
    b = 1;
  }
  b = b < 1 ? 1 : b > 255 ? 255 : b;
  if (dev >= 0 && dev < 16) cache[dev].store((long long)smem << 8 | b, std::memory_order_relaxed);
  return b;
}

/* f's dynamic shared memory limit raised to smem on device dev (once per device and size
 * reached: the attribute is the device's; also below 48 KB, where the static arrays can
 * take the block past the default limit). The attribute only
 * rises: the check, the set and the cache's store are one step under a lock, so a thread
 * asking less cannot lower it between another's set and its store (the cache would then
 * claim a limit the function does not have); the lock-free read skips the lock once set. */
template <typename F>
cudaError_t smem_opt_in(F *f, size_t smem, int dev, std::atomic<long long> *cache) {
  static std::mutex mu;
  if (smem == 0) return cudaSuccess;
  const bool ok = dev >= 0 && dev < 16;
  if (ok && (size_t)cache[dev].load(std::memory_order_acquire) >= smem) return cudaSuccess;
  std::lock_guard<std::mutex> lock(mu);
  if (ok && (size_t)cache[dev].load(std::memory_order_relaxed) >= smem) return cudaSuccess;
  cudaError_t e = cudaFuncSetAttribute(f, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
  if (e != cudaSuccess) return e;
  if (ok) cache[dev].store((long long)smem, std::memory_order_release);
  return cudaSuccess;
}

/* The current device, or -1 when it cannot be asked (nothing is then cached per device) */
int current_device() {
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess) {
    (void)cudaGetLastError();
    dev = -1;
  }
  return dev;
}

template <typename T, int MODE, int R, int PAIRS>
cudaError_t launch(const ote_fused_gemv_args &a, cudaStream_t st, bool pdl) {
  static std::atomic<long long> occ[16] = {}, smem_set[16] = {};
  static std::atomic<int> pdl_cache[16] = {};
  auto f = fused_gemv_kernel<T, MODE, R, PAIRS>;
  const int dev = current_device();
  const size_t smem = (size_t)a.K * sizeof(typename xs_elem<T, MODE>::type);
  cudaError_t e = smem_opt_in(f, smem, dev, smem_set);
  if (e != cudaSuccess) return e;
  /* blocks: one task per warp, except (linear.cu's gemv_balance) two when that makes one
   * wave of two, and at most max_waves waves of the blocks the GPU holds at once (each
   * block forms the input row once: fewer blocks form it fewer times), the warps then
   * taking tasks grid-stride */
  const int64_t wave = (int64_t)resident_blocks(f, smem, dev, occ) * sm_count(dev < 0 ? 0 : dev);
  const int64_t tasks = PAIRS != kRows ? a.N / 2 : (a.N + R - 1) / R;
  int64_t blocks = (tasks + kWarps - 1) / kWarps;
  if (blocks > wave && blocks <= 2 * wave) blocks = (tasks + 2 * kWarps - 1) / (2 * kWarps);
  if (a.max_waves > 0 && blocks > a.max_waves * wave) blocks = a.max_waves * wave;
  if (a.max_blocks > 0 && blocks > a.max_blocks) blocks = a.max_blocks;
  if (blocks > 0x7fffffffll) return cudaErrorInvalidValue;
  return ot_launch_pdl_smem(pdl && pdl_ok(f, dev, pdl_cache), f, dim3((unsigned)blocks),
                            dim3(kWarps * 32), smem, st, a);
}

/* The staged kernel's grid for a: G CTAs (the SMs, or a.max_blocks when that keeps a CTA's
 * rows within kStageRows) and the dynamic shared memory; false when a does not fit (K / 8
 * threads over kStageThreads, more than kStageRows rows a CTA, the rows past the registers'
 * beyond the device's shared memory a block, W or x not 16-byte aligned). */
bool staged_grid(const ote_fused_gemv_args &a, int dev, int64_t *G, size_t *smem) {
  static std::atomic<int> optin[16] = {};
  if (a.K <= 0 || a.K % 8 || a.K > 8 * kStageThreads || a.N <= 0 || a.bias == a.y ||
      (((uintptr_t)a.w | (uintptr_t)a.x) & 15)) /* (16-byte loads of W's rows and of x) */
    return false;
  int64_t g = sm_count(dev < 0 ? 0 : dev);
  if (g > a.N) g = a.N;
  if (a.max_blocks > 0 && a.max_blocks < g && (a.N + a.max_blocks - 1) / a.max_blocks <= kStageRows)
    g = a.max_blocks;
  const int64_t rows = (a.N + g - 1) / g;
  if (rows > kStageRows) return false;
  const long long limit = dev_attr(dev, cudaDevAttrMaxSharedMemoryPerBlockOptin, optin, 48 << 10);
  const size_t need = (size_t)(rows > kStageRegRows ? rows - kStageRegRows : 0) * a.K * 2;
  /* (+ the kernel's static array red) */
  if ((long long)(need + sizeof(float) * kStageRows * (kStageThreads / 32) + 64) > limit)
    return false;
  *G = g;
  *smem = need;
  return true;
}

template <typename T>
cudaError_t launch_staged(const ote_fused_gemv_args &a, cudaStream_t st, bool pdl, int *done) {
  static std::atomic<long long> smem_set[16] = {};
  static std::atomic<int> pdl_cache[16] = {};
  auto f = staged_gemv_kernel<T>;
  const int dev = current_device();
  int64_t G = 0;
  size_t smem = 0;
  *done = 0;
  if (!staged_grid(a, dev, &G, &smem)) return cudaSuccess;
  cudaError_t e = smem_opt_in(f, smem, dev, smem_set);
  if (e != cudaSuccess) return e;
  const int threads = (int)((a.K / 8 + 31) / 32 * 32);
  e = ot_launch_pdl_smem(pdl && pdl_ok(f, dev, pdl_cache), f, dim3((unsigned)G), dim3(threads),
                         smem, st, a);
  *done = e == cudaSuccess;
  return e;
}

/* The rowblock kernel's grid for a (rowblock_gemv_kernel): G CTAs -- the fewest that keep
 * ceil(N / SMs) rows a CTA, or a.max_blocks below that (more passes of 32 rows) -- of
 * threads T (K / 32 rounded up to warps); false when a does not fit (K not a multiple of 8
 * or over 8 kRbVecs kRbThreads, W or x not 16-byte aligned). */
bool rowblock_grid(const ote_fused_gemv_args &a, int dev, int64_t *G, int *T) {
  if (a.K <= 0 || a.K % 8 || a.K > 8 * kRbVecs * kRbThreads || a.N <= 0 || a.bias == a.y ||
      (((uintptr_t)a.w | (uintptr_t)a.x) & 15))
    return false;
  const int64_t sms = sm_count(dev < 0 ? 0 : dev), rows = (a.N + sms - 1) / sms;
  int64_t g = (a.N + rows - 1) / rows;
  if (a.max_blocks > 0 && a.max_blocks < g) g = a.max_blocks;
  *G = g;
  *T = (int)((a.K / 8 + kRbVecs * 32 - 1) / (kRbVecs * 32) * 32);
  return true;
}

/* A rowblock kernel f on G CTAs of threads with smem bytes of dynamic shared memory (under
 * the 48 KB default), a programmatic dependent where it may be (pdl_cache: f's); nothing
 * when !fits; *done 1 when launched */
template <typename F>
cudaError_t launch_rows(F *f, bool fits, int64_t G, int threads, size_t smem,
                        const ote_fused_gemv_args &a, cudaStream_t st, bool pdl, int dev,
                        std::atomic<int> *pdl_cache, int *done) {
  *done = 0;
  if (!fits) return cudaSuccess;
  const cudaError_t e = ot_launch_pdl_smem(pdl && pdl_ok(f, dev, pdl_cache), f, dim3((unsigned)G),
                                           dim3(threads), smem, st, a);
  *done = e == cudaSuccess;
  return e;
}

template <typename T, int D>
cudaError_t launch_rowblock(const ote_fused_gemv_args &a, cudaStream_t st, bool pdl, int *done) {
  static std::atomic<int> pdl_cache[16] = {};
  const int dev = current_device();
  int64_t G = 0;
  int threads = 0;
  const bool fits = rowblock_grid(a, dev, &G, &threads);
  return launch_rows(rowblock_gemv_kernel<T, D>, fits, G, threads, 0, a, st, pdl, dev, pdl_cache,
                     done);
}

/* The rowblock norm kernel's grid for a (rowblock_norm_kernel): G CTAs -- the fewest that
 * keep ceil(P / SMs) of the P = N / 2 pairs a CTA, or a.max_blocks below that (more passes)
 * -- of threads T (K / 16 rounded up to warps); false when a does not fit (K not a multiple
 * of 8 or over 8 kRqVecs kRqThreads = 4096, N odd, with rope a head_dim under 32 -- a
 * pass's pairs would cross more than one head's end -- or the CTA's pairs' cos / sin over
 * 32 KB, W, res, gamma, delta or res_out not 16-byte aligned); *smem: that cos / sin */
bool rowblock_norm_grid(const ote_fused_gemv_args &a, int dev, int64_t *G, int *T, size_t *smem) {
  if (a.K <= 0 || a.K % 8 || a.K > 8 * kRqVecs * kRqThreads || a.N <= 0 || a.N % 2 ||
      (a.rope && (a.head_dim < 32 || a.head_dim % 2)) ||
      (((uintptr_t)a.w | (uintptr_t)a.res | (uintptr_t)a.gamma | (uintptr_t)a.delta |
        (uintptr_t)a.res_out) & 15))
    return false;
  const int64_t P = a.N / 2, sms = sm_count(dev < 0 ? 0 : dev), per = (P + sms - 1) / sms;
  int64_t g = (P + per - 1) / per;
  if (a.max_blocks > 0 && a.max_blocks < g) g = a.max_blocks;
  *smem = a.rope ? (size_t)((P + g - 1) / g) * sizeof(float2) : 0;
  if (*smem > (32u << 10)) return false;
  *G = g;
  *T = (int)((a.K / 8 + kRqVecs * 32 - 1) / (kRqVecs * 32) * 32);
  return true;
}

template <typename T, int D, int PAIRS>
cudaError_t launch_rowblock_norm(const ote_fused_gemv_args &a, cudaStream_t st, bool pdl,
                                 int *done) {
  static std::atomic<int> pdl_cache[16] = {};
  const int dev = current_device();
  int64_t G = 0;
  int threads = 0;
  size_t smem = 0;
  const bool fits = rowblock_norm_grid(a, dev, &G, &threads, &smem);
  return launch_rows(rowblock_norm_kernel<T, D, PAIRS>, fits, G, threads, smem, a, st, pdl, dev,
                     pdl_cache, done);
}

template <typename T, int PAIRS>
cudaError_t launch_rowblock_norm_d(const ote_fused_gemv_args &a, cudaStream_t st, bool pdl,
                                   int *done) {
  return a.depth == 4 ? launch_rowblock_norm<T, 4, PAIRS>(a, st, pdl, done)
                      : launch_rowblock_norm<T, 8, PAIRS>(a, st, pdl, done);
}

template <typename T>
cudaError_t launch_any(const ote_fused_gemv_args &a, int mode, cudaStream_t st, bool pdl) {
  if (a.rope) return launch<T, kNorm, 2, kRope>(a, st, pdl);
  if (a.glu_out) return launch<T, kNorm, 2, kGlu>(a, st, pdl);
  if (mode == kSwiglu)
    return a.pair_rows ? launch<T, kSwiglu, 2, kRows>(a, st, pdl)
                       : launch<T, kSwiglu, 1, kRows>(a, st, pdl);
  return a.pair_rows ? launch<T, kNorm, 2, kRows>(a, st, pdl)
                     : launch<T, kNorm, 1, kRows>(a, st, pdl);
}

/* ---- ATTN_OPROJ: the batch-1 decode's attention, its merge and o_proj in one kernel ------ *
 * Between the fused qkv kernel and gate_up, the decode step otherwise runs three latency-
 * bound kernels back to back: the paged attention's split kernel, its merge, and the staged
 * o_proj, whose 33.5 MB of weight (the 8B shape) cannot start streaming before the split
 * kernel's CTAs leave the SMs (it needs an SM's shared memory), while the DRAM reads only
 * the 8.4 MB of K / V (docs/PERFORMANCE.md, 2026-12-05: the window takes ~25-29 us for
 * ~42 MB). Here one CTA per SM (G CTAs, all resident) does all of it:
 *   1. before the PDL wait: with kv_ready the CTA reads the page table and issues its first
 *      step of K / V loads (every cached row but the new token's, which the qkv kernel is
 *      writing); after a CTA barrier (every warp's loads issued: an L2 miss issued after
 *      the weight's queues behind it), thread 0 issues bulk copies (the TMA unit: no
 *      registers) of the CTA's rows of W past its first `late` ones into shared memory;
 *   2. CTA c < hkv * nsplit takes kv head c / nsplit and the c % nsplit-th of nsplit equal
 *      ranges of the keys (multiples of 16 keys): each warp runs steps of 16 keys -- a lane
 *      holds 8 elements of a row of K and of V, D / 8 lanes one row (head_dim 32, 64 or
 *      128) -- with the GQ query heads of the group in registers, an online softmax in
 *      base 2 over the step's row loads one at a time (a rolled loop), then the warps'
 *      partials combine in shared memory (fixed order) into the range's (m, l, o) in
 *      float32, stored to scratch;
 *   3. the CTA's first `late` rows of W (what shared memory cannot hold) are loaded into
 *      registers;
 *   4. the ranges of a kv head meet at its counter; the last to arrive merges the head's
 *      query heads (attn = sum_s 2^(m_s - M) o_s / sum_s 2^(m_s - M) l_s over the ranges in
 *      order, rounded to T) and arrives at the top counter with the CTAs that have no
 *      range; the last of those opens the barrier (a generation word) for all;
 *   5. the CTA's rows of y = attn W^T (+ b): thread t the 16-byte vectors t and t + 256 of
 *      each row, 8 rows at a time by a rolled loop, the warp's sums by stage_scatter8, the
 *      warps' through shared memory in order (a row's value depends on K alone, not on G).
 * The code is kept compact (rolled loops where the work allows): the kernel runs once a
 * layer, and its first form's straight-line code (135 KB of SASS at head_dim 128, group 4)
 * cost ~25 us a call in instruction fetches (2026-12-07, H100 stamps; OTE_AO_TRACE below).
 * Even so the first pass through each phase is slow -- the key loop's first iteration ~8
 * us after thread 0's K / V rows landed (the stamps see its lane only; the pass needs every
 * lane's), the other seven ~0.5 us each. Not instruction fetch: with every weight stream
 * of the step evict-first (the code then stays in the L2, bench/code_fetch_probe.cu) the
 * stamps did not move, and under ncu (isolated, caches flushed) 1.7% of its warp samples
 * wait for an instruction, 22% on loads (the first pass's K / V) and 34% at barriers
 * (docs/PERFORMANCE.md, forty-eighth session). Hence still opt-in: 40 us a layer where
 * the three kernels take 29 (H100).
 * The barrier needs every CTA resident at once: G <= the SMs, one CTA per SM by its shared
 * memory, and no dependent launched before it opens (the dependents are released after
 * it). Its counters (OTE_AO_STATE_BYTES at the scratch's start) are back at 0 after each
 * call. sm_90 code only (the bulk copies): the body is empty in the sm_80 pass and the host
 * launches it only where ot_bulk_kernel_ok says so.
 * Opt-in (OTE_FUSED_ATTN_OPROJ). */
constexpr int kAoThreads = 256;
constexpr int kAoWarps = kAoThreads / 32;
constexpr int kAoVJ = 2;     /* 16-byte vectors of a row of W a thread: K <= 8 * 256 * 2 */
constexpr int kAoLate = 8;   /* rows of W a CTA in registers at most */
constexpr int kAoKeys = 16;  /* keys a warp step */
/* the barrier's counters at the scratch's start: generation, top, one a kv head */
constexpr size_t kAoBarBytes = OTE_AO_STATE_BYTES;

/* OTE_AO_TRACE (a diagnostic build: cmake -DOT_ENGINE_AO_TRACE=ON builds it beside the
 * normal engine as libot_engine_ao_trace.so): per CTA %globaltimer stamps of the kernel's
 * phases, thread 0, CTAs < kAoTrCtas: 0 entry, 1 after the PDL wait, 2 the range's partial
 * stored, 3 arrived at its kv head's counter, 4 its head merged (the last range's CTA),
 * 5 the barrier open, 6 the weight rows landed in shared memory, 7 end; attention CTAs: 8 q
 * landed, 9 the key loop done, 10 the first row of K landed, 12 the key loop's first row
 * load done, 13 the step's last V row landed; 11 (a CTA with no range) its weight rows
 * landed. Overwritten by each launch (a decode
 * step leaves its last layer's). Read back with ote_ao_trace (bench/engine_pa_trace.py
 * --kernel attn_oproj). Other builds: no code. */
#ifdef OTE_AO_TRACE
constexpr int kAoTrCtas = 1024;
constexpr int kAoTrSlots = 16;
__device__ unsigned long long ao_tr_buf[kAoTrCtas][kAoTrSlots];
#define AO_TR(i)                                                                        \
  do {                                                                                  \
    if (threadIdx.x == 0 && blockIdx.x < kAoTrCtas) {                                   \
      unsigned long long t_;                                                            \
      asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t_));                            \
      ao_tr_buf[blockIdx.x][i] = t_;                                                    \
    }                                                                                   \
  } while (0)
/* a stamp after the value v exists (its load landed, its arithmetic done) */
#define AO_TR_AFTER(i, v)                  \
  do {                                     \
    asm volatile("" ::"f"(v) : "memory"); \
    AO_TR(i);                              \
  } while (0)
#else
#define AO_TR(i) ((void)0)
#define AO_TR_AFTER(i, v) ((void)0)
#endif

template <int D> struct ao_shape {
  static constexpr int LPR = D / 8;         /* lanes a row */
  static constexpr int RPL = 32 / LPR;      /* rows a warp load */
  static constexpr int NL = kAoKeys / RPL;  /* loads of K (and of V) a lane a step */
};

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
__device__ __forceinline__ unsigned ao_ld_acquire(const unsigned *p) {
  unsigned v;
  asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}
#endif

/* The page-table facts of sequence 0 a CTA needs: its length L and its range of keys. */
struct ao_range {
  const int32_t *pages;
  int L, kb, ke, lo; /* keys [kb, ke) of the CTA's range, and the window's first key lo */
};

__device__ __forceinline__ ao_range ao_table(const ote_attn_oproj_args &a, int s, int nsplit) {
  ao_range r;
  const int i0 = a.indptr[0], np = a.indptr[1] - i0;
  r.pages = a.indices + i0;
  r.L = np > 0 ? (np - 1) * a.block_size + a.last_page_len[0] : 0;
  const int per = ((r.L + nsplit - 1) / nsplit + kAoKeys - 1) / kAoKeys * kAoKeys;
  r.kb = s * per;
  r.ke = min(r.L, r.kb + per);
  r.lo = a.window_left >= 0 ? max(0, r.L - 1 - a.window_left) : 0;
  return r;
}

/* The element offset of key `key`'s row of kv head h in the pages, at element d0. */
template <int D>
__device__ __forceinline__ int64_t ao_row(const ote_attn_oproj_args &a, const ao_range &r, int h,
                                          int key, int d0) {
  const int bs = a.block_size, page = __ldg(r.pages + key / bs);
  return (((int64_t)page * a.hkv + h) * bs + key % bs) * D + d0;
}

/* Lane's loads of one warp step (keys base + p RPL + row): K and V rows of kv head h,
 * elements d0 .. d0 + 8; keys at or past `upto` (or before lo) are not loaded (zeros). */
template <typename T, int D>
__device__ __forceinline__ void ao_load_step(const ote_attn_oproj_args &a, const ao_range &r,
                                             int h, int base, int row, int d0, int upto,
                                             raw16 (&kr)[ao_shape<D>::NL],
                                             raw16 (&vr)[ao_shape<D>::NL]) {
  using S = ao_shape<D>;
#pragma unroll
  for (int p = 0; p < S::NL; p++) {
    const int key = base + p * S::RPL + row;
    const bool in = key < upto && key >= r.lo;
    const int64_t off = in ? ao_row<D>(a, r, h, key, d0) : 0;
    ot::load_raw<T, true, false>(kr[p], static_cast<const T *>(a.k_pages) + off, 0, 8, in);
    ot::load_raw<T, true, false>(vr[p], static_cast<const T *>(a.v_pages) + off, 0, 8, in);
  }
}

template <typename T, int D, int GQ>
__global__ void __launch_bounds__(kAoThreads, 1) attn_oproj_kernel(const __grid_constant__ ote_attn_oproj_args a,
                                                                   int nsplit, int late_max) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  using S = ao_shape<D>;
  static_assert(vec_width<T>::value == 8, "16-bit types");
  extern __shared__ __align__(128) unsigned char ao_smem[]; /* rows of W, then s_o */
  __shared__ __align__(8) uint64_t wbar;
  __shared__ float red[kAoWarps][kStageRows];
  __shared__ float s_ml[kAoWarps][GQ][2];
  const int t = threadIdx.x, lane = t & 31, warp = t >> 5;
  const int G = (int)gridDim.x;
  const int64_t K = (int64_t)a.hq * D, N = a.N, kv = K / 8;
  const int64_t r0 = (int64_t)blockIdx.x * N / G, r1 = ((int64_t)blockIdx.x + 1) * N / G;
  const int nr = (int)(r1 - r0);
  const int late = nr < late_max ? nr : late_max; /* rows r0 .. r0 + late in registers */
  const T *__restrict__ W = static_cast<const T *>(a.w) + r0 * K;
  const int64_t max_rows = (N + G - 1) / G;
  float *s_o = reinterpret_cast<float *>(ao_smem + (size_t)(max_rows - late_max) * K * 2);
  unsigned *gbar = static_cast<unsigned *>(a.scratch);
  float *part = reinterpret_cast<float *>(static_cast<char *>(a.scratch) + kAoBarBytes);

  AO_TR(0);
  const uint32_t bar = ot::smem_u32(&wbar);
  if (t == 0) {
    ot::mbar_init(bar, 1);
    ot::mbar_init_fence();
  }
  __syncthreads();
  const int srows = nr - late;
  const int item = blockIdx.x, h = item / nsplit, s = item % nsplit;
  const bool att = item < a.hkv * nsplit;
  const int row = lane / S::LPR, d0 = (lane % S::LPR) * 8;
  raw16 kr[S::NL], vr[S::NL];
  ao_range rg{};
  /* 1. the first step's K / V loads (kv_ready: the cached rows, all but the new token's),
   * then the weight rows past the late ones by bulk copies into shared memory: the few
   * attention loads ahead of the CTA's ~200 KB of weight in the memory system's queues */
  if (att && a.kv_ready) {
    rg = ao_table(a, s, nsplit);
    ao_load_step<T, D>(a, rg, h, rg.kb + warp * kAoKeys, row, d0, min(rg.ke, rg.L - 1), kr, vr);
  }
  /* every warp's K / V loads issued before the first bulk copy (meant to keep the attention's
   * misses ahead of the weight's; measured no different on the H100, 8c6534b: the key loop's
   * time was its code's first pass, not its loads) */
  if (a.kv_ready) __syncthreads();
  /* (the rows are contiguous: 8 a copy, few instructions for thread 0 -- its warp's
   * attention waits on their issue; issued after the key loop or after the barrier
   * instead, the kernel was no faster: H100, 2026-12-07, docs/PERFORMANCE.md) */
  if (t == 0 && srows > 0) {
    /* evict-first in the L2, as the other weight streams of the step that this library
     * writes (ld.global.cs): the weights read once should not push out the lines read
     * again (measured no different on the H100: docs/PERFORMANCE.md, 48th session) */
    uint64_t pol;
    asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(pol));
    ot::mbar_expect_tx(bar, (uint32_t)(srows * K * 2));
    for (int r = 0; r < srows; r += 8)
      ot::bulk_load_sh_policy(ot::smem_u32(ao_smem) + (uint32_t)(r * K * 2), W + (late + r) * K,
                              (uint32_t)(min(8, srows - r) * K * 2), bar, pol);
  }
  ot_pdl_wait(); /* q, and the new token's K / V in its page */

  AO_TR(1);
#ifdef OTE_AO_TRACE
  if (!att && srows > 0 && t == 0) { /* (a CTA with no range: its rows' landing) */
    ot::mbar_wait(bar, 0);
    AO_TR(11);
  }
#endif
  /* 2. the attention of the CTA's key range */
  if (att) {
    int base = rg.kb + warp * kAoKeys;
    bool have = a.kv_ready; /* the first step's rows in kr / vr (but the new token's) */
    if (!a.kv_ready) {
      rg = ao_table(a, s, nsplit);
      base = rg.kb + warp * kAoKeys;
    } else if (rg.L - 1 >= base && rg.L - 1 < base + kAoKeys && rg.L - 1 < rg.ke) {
      /* the new token's row, in this warp's first step */
      const int p = (rg.L - 1 - base) / S::RPL;
      if ((rg.L - 1 - base) % S::RPL == row) {
        const int64_t off = ao_row<D>(a, rg, h, rg.L - 1, d0);
#pragma unroll
        for (int i = 0; i < S::NL; i++)
          if (i == p) {
            ot::load_raw<T, true, false>(kr[i], static_cast<const T *>(a.k_pages) + off, 0, 8, true);
            ot::load_raw<T, true, false>(vr[i], static_cast<const T *>(a.v_pages) + off, 0, 8, true);
          }
      }
    }
    const float qs = a.scale * 1.4426950408889634f; /* scores in base 2 */
    float qf[GQ][8];
#pragma unroll
    for (int g = 0; g < GQ; g++) {
      raw16 qv;
      ot::load_raw<T, true, false>(qv, static_cast<const T *>(a.q) + (int64_t)(h * GQ + g) * D + d0,
                                   0, 8, true);
      unpack<T>(qf[g], qv);
#pragma unroll
      for (int i = 0; i < 8; i++) qf[g][i] *= qs;
    }
    AO_TR_AFTER(8, qf[0][0]);
    AO_TR_AFTER(10, __uint_as_float(kr[0].u.x));
    AO_TR_AFTER(13, __uint_as_float(vr[S::NL - 1].u.x));
    float m[GQ], l[GQ], o[GQ][8];
#pragma unroll
    for (int g = 0; g < GQ; g++) {
      m[g] = -INFINITY;
      l[g] = 0.0f;
#pragma unroll
      for (int i = 0; i < 8; i++) o[g][i] = 0.0f;
    }
    /* a rolled loop over the step's NL row loads (each the warp's RPL keys), with the
     * registers shifted down after each: the kernel runs once a layer, and its unrolled
     * first form (~135 KB of SASS) spent its time fetching code (2026-12-07 H100 stamps) */
    for (; base < rg.ke; base += kAoWarps * kAoKeys) {
      if (!have) ao_load_step<T, D>(a, rg, h, base, row, d0, rg.ke, kr, vr); /* (one call site) */
      have = false;
#pragma unroll 1
      for (int p = 0; p < S::NL; p++) {
        const int key = base + p * S::RPL + row;
        const bool kin = key < rg.ke && key >= rg.lo;
        float kf[8], vf[8];
        unpack<T>(kf, kr[0]);
        unpack<T>(vf, vr[0]);
#pragma unroll
        for (int g = 0; g < GQ; g++) {
          float d = 0.0f;
#pragma unroll
          for (int i = 0; i < 8; i++) d = fmaf(qf[g][i], kf[i], d);
#pragma unroll
          for (int off = S::LPR / 2; off > 0; off >>= 1) d += __shfl_xor_sync(0xffffffffu, d, off);
          const float sc = kin ? d : -INFINITY;
          float mx = sc;
#pragma unroll
          for (int off = S::LPR; off < 32; off <<= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, off));
          const float mn = fmaxf(m[g], mx);
          if (mn == -INFINITY) continue; /* no key of the load in the window (warp-uniform) */
          const float al = exp2f(m[g] - mn), pr = exp2f(sc - mn);
          m[g] = mn;
          l[g] = fmaf(l[g], al, pr);
#pragma unroll
          for (int i = 0; i < 8; i++) o[g][i] = fmaf(pr, vf[i], o[g][i] * al);
        }
#pragma unroll
        for (int i = 0; i + 1 < S::NL; i++) {
          kr[i] = kr[i + 1];
          vr[i] = vr[i + 1];
        }
        if (p == 0) AO_TR_AFTER(12, o[0][0]);
      }
    }
    AO_TR_AFTER(9, o[0][0]);
    /* the warp's rows groups summed (each has the warp's m) */
#pragma unroll
    for (int g = 0; g < GQ; g++)
#pragma unroll
      for (int off = S::LPR; off < 32; off <<= 1) {
        l[g] += __shfl_xor_sync(0xffffffffu, l[g], off);
#pragma unroll
        for (int i = 0; i < 8; i++) o[g][i] += __shfl_xor_sync(0xffffffffu, o[g][i], off);
      }
    if (lane < S::LPR)
#pragma unroll
      for (int g = 0; g < GQ; g++)
#pragma unroll
        for (int i = 0; i < 8; i++) s_o[(warp * GQ + g) * D + d0 + i] = o[g][i];
    if (lane == 0)
#pragma unroll
      for (int g = 0; g < GQ; g++) s_ml[warp][g][0] = m[g], s_ml[warp][g][1] = l[g];
  }
  __syncthreads();
  if (att) { /* the warps' partials in order: the range's (o, m, l) */
    float *pp = part + (int64_t)item * GQ * (D + 2);
    for (int idx = t; idx < GQ * D; idx += kAoThreads) {
      const int g = idx / D, d = idx % D;
      float M = -INFINITY;
#pragma unroll
      for (int w = 0; w < kAoWarps; w++) M = fmaxf(M, s_ml[w][g][0]);
      float acc = 0.0f, ls = 0.0f;
      if (M != -INFINITY)
#pragma unroll
        for (int w = 0; w < kAoWarps; w++) {
          const float e = exp2f(s_ml[w][g][0] - M);
          acc = fmaf(e, s_o[(w * GQ + g) * D + d], acc);
          ls = fmaf(e, s_ml[w][g][1], ls);
        }
      pp[g * (D + 2) + d] = acc;
      if (d == 0) pp[g * (D + 2) + D] = M, pp[g * (D + 2) + D + 1] = ls;
    }
  }
  AO_TR(2);

  /* 3. the late rows of W into registers (used in step 5) */
  raw16 wl[kAoLate][kAoVJ];
#pragma unroll
  for (int r = 0; r < kAoLate; r++)
#pragma unroll
    for (int j = 0; j < kAoVJ; j++)
      ot::load_raw<T, true, true>(wl[r][j], W + r * K + (int64_t)(t + j * kAoThreads) * 8, 0, 8,
                                  r < late && t + j * kAoThreads < kv);
  /* 4. the ranges meet: a CTA's thread 0 arrives at its kv head's counter (16-way at the
   * 8B shape, not 132-way as one grid counter: each of the first form's two grid barriers
   * took ~2-3 us, 2026-12-07 H100 stamps); the last of a head's ranges merges the head's GQ
   * query heads and then arrives at the top counter with the CTAs that have no range; the
   * last of those opens the barrier by its generation. Every counter is back at 0 after
   * the call. (Measured no faster as a whole: the 8 merging CTAs then took ~4.6 us, their
   * code's first pass -- see the kernel's comment.) */
  __shared__ unsigned s_gen0, s_last;
  unsigned *gen = gbar, *top = gbar + 1, *grp = gbar + 2;
  __syncthreads(); /* the CTA's partial stored */
  if (t == 0) {
    s_gen0 = ao_ld_acquire(gen); /* (it cannot move before this CTA's arrival) */
    unsigned last = 0;
    if (att) {
      __threadfence();
      if (atomicAdd(grp + h, 1u) == (unsigned)nsplit - 1) {
        atomicExch(grp + h, 0u);
        __threadfence();
        last = 1;
      }
    }
    s_last = last;
  }
  __syncthreads();
  AO_TR(3);
  if (s_last) {
    /* the merge of kv head h's query heads: their ranges' m and l through shared memory (one
     * L2 round trip), then each element's o in batches of 8 independent loads (a dependent
     * round trip a range cost ~1 us under the weight stream: H100, 2026-12-07) */
    const float *pb0 = part + (int64_t)h * nsplit * GQ * (D + 2);
    const int64_t ss = (int64_t)GQ * (D + 2); /* between ranges */
    float *s_m = s_o, *s_w = s_o + GQ * nsplit; /* (s_o's warps' partials are consumed) */
    for (int i = t; i < GQ * nsplit; i += kAoThreads) {
      const int g = i / nsplit, sp = i % nsplit;
      s_m[i] = __ldcg(pb0 + sp * ss + g * (D + 2) + D);
      s_w[i] = __ldcg(pb0 + sp * ss + g * (D + 2) + D + 1);
    }
    __syncthreads();
    for (int idx = t; idx < GQ * D; idx += kAoThreads) {
      const int g = idx / D, d = idx % D;
      const float *pb = pb0 + g * (D + 2) + d, *sm = s_m + g * nsplit, *sw = s_w + g * nsplit;
      float M = -INFINITY;
      for (int i = 0; i < nsplit; i++) M = fmaxf(M, sm[i]);
      float acc = 0.0f, ls = 0.0f;
      for (int i0 = 0; i0 < nsplit; i0 += 8) {
        float ov[8];
#pragma unroll
        for (int i = 0; i < 8; i++) ov[i] = i0 + i < nsplit ? __ldcg(pb + (i0 + i) * ss) : 0.0f;
#pragma unroll
        for (int i = 0; i < 8; i++) {
          if (i0 + i >= nsplit) break;
          const float mi = sm[i0 + i];
          if (mi == -INFINITY) continue;
          const float e = exp2f(mi - M);
          acc = fmaf(e, ov[i], acc);
          ls = fmaf(e, sw[i0 + i], ls);
        }
      }
      static_cast<T *>(a.attn)[(int64_t)(h * GQ + g) * D + d] = from_f32<T>(acc / ls);
    }
    __syncthreads(); /* the head's attn stored */
  }
  AO_TR(4);
  if (t == 0) {
    if (s_last || !att) {
      const unsigned top_n = (unsigned)(a.hkv + (G - a.hkv * nsplit)); /* mergers + idle */
      __threadfence();
      if (atomicAdd(top, 1u) == top_n - 1) {
        atomicExch(top, 0u);
        __threadfence();
        atomicAdd(gen, 1u);
      }
    }
    while (ao_ld_acquire(gen) == s_gen0) __nanosleep(32);
    __threadfence();
  }
  __syncthreads();
  AO_TR(5);
  ot_pdl_launch_dependents(); /* every CTA is resident: gate_up may take the free SMs */

  /* 5. y = attn W^T (+ b) for the CTA's rows */
  float xf[kAoVJ][8];
#pragma unroll
  for (int j = 0; j < kAoVJ; j++) {
    const int64_t v = t + (int64_t)j * kAoThreads;
    raw16 xv;
    xv.u = make_uint4(0u, 0u, 0u, 0u);
    if (v < kv) xv.u = __ldcg(reinterpret_cast<const uint4 *>(static_cast<const T *>(a.attn) + v * 8));
    unpack<T>(xf[j], xv);
  }
  if (srows > 0) ot::mbar_wait(bar, 0);
  AO_TR(6);
  /* rows in chunks of 8 by a rolled loop (compact code, see step 2): a thread's partials
   * of the chunk's rows, reduce-scattered over the warp (lane i & 7 ends with row c + i's
   * warp sum), into red[warp][row]; a row's value depends on K alone (not on G or late) */
#pragma unroll 1
  for (int c = 0; c < nr; c += 8) {
    float p[8];
#pragma unroll
    for (int i = 0; i < 8; i++) {
      const int r = c + i;
      p[i] = 0.0f;
      if (r >= nr) continue;
#pragma unroll
      for (int j = 0; j < kAoVJ; j++) {
        const int64_t v = t + (int64_t)j * kAoThreads;
        if (v >= kv) continue;
        raw16 w;
        if (r < late) w = wl[i][j]; /* (c is 0 then: late <= kAoLate = 8) */
        else w.u = reinterpret_cast<const uint4 *>(ao_smem + (size_t)(r - late) * K * 2)[v];
        p[i] += dot8<T>(w, xf[j]);
      }
    }
    stage_scatter8(p, lane);
    if (lane < 8 && c + lane < nr) red[warp][c + lane] = p[0];
  }
  __syncthreads();
  if (warp == 0 && lane < nr) {
    float v = 0.0f;
    for (int w = 0; w < kAoWarps; w++) v += red[w][lane];
    if (a.bias) v += to_f32(static_cast<const T *>(a.bias)[r0 + lane]);
    static_cast<T *>(a.y)[r0 + lane] = from_f32<T>(v);
  }
  AO_TR(7);
#endif
}

/* The plan of the kernel for a: grid G, ranges a kv head nsplit, late rows, dynamic shared
 * memory; false when a does not fit it. */
struct ao_plan {
  int G, nsplit, late;
  size_t smem;
};

bool ao_plan_for(const ote_attn_oproj_args &a, int dev, ao_plan *pl) {
  static std::atomic<int> optin[16] = {};
  const int D = a.head_dim;
  if ((D != 32 && D != 64 && D != 128) || a.hkv <= 0 || a.hq % a.hkv || a.N <= 0 || a.block_size <= 0 ||
      (size_t)(2 + a.hkv) * sizeof(unsigned) > kAoBarBytes)
    return false;
  const int GQ = a.hq / a.hkv;
  if (!(GQ == 1 || GQ == 2 || GQ == 4 || (GQ == 8 && D <= 64))) return false;
  const int64_t K = (int64_t)a.hq * D;
  if (K > 8 * kAoThreads * kAoVJ) return false;
  if (((uintptr_t)a.w | (uintptr_t)a.q | (uintptr_t)a.attn | (uintptr_t)a.k_pages |
       (uintptr_t)a.v_pages) & 15)
    return false;
  int64_t G = sm_count(dev < 0 ? 0 : dev);
  if (a.max_blocks > 0 && a.max_blocks < G) G = a.max_blocks;
  if (G > a.N) G = a.N;
  if (G < a.hkv) return false;
  const int64_t rows = (a.N + G - 1) / G;
  if (rows > kStageRows) return false;
  const long long limit = dev_attr(dev, cudaDevAttrMaxSharedMemoryPerBlockOptin, optin, 48 << 10);
  int nsplit = (int)(G / a.hkv);
  if (a.max_splits > 0 && nsplit > a.max_splits) nsplit = a.max_splits;
  /* the warps' partials, then the merge's m and l of a kv head's ranges */
  size_t so = (size_t)kAoWarps * GQ * D;
  if (so < 2 * (size_t)GQ * nsplit) so = 2 * (size_t)GQ * nsplit;
  so *= sizeof(float);
  const size_t stat = sizeof(float) * kAoWarps * (kStageRows + 2 * GQ) + 64;
  const long long room = limit - (long long)(so + stat);
  int64_t fit = room > 0 ? room / (K * 2) : 0;
  if (a.smem_rows_cap > 0 && fit > a.smem_rows_cap) fit = a.smem_rows_cap;
  if (fit > rows) fit = rows;
  const int64_t late = rows - fit;
  if (late > kAoLate) return false;
  if (a.scratch_bytes < kAoBarBytes + (size_t)a.hq * nsplit * (D + 2) * sizeof(float)) return false;
  pl->G = (int)G;
  pl->nsplit = nsplit;
  pl->late = (int)late;
  pl->smem = (size_t)fit * K * 2 + so;
  return true;
}

template <typename T, int D, int GQ>
cudaError_t launch_ao_t(const ote_attn_oproj_args &a, const ao_plan &pl, int dev, cudaStream_t st,
                        int *done) {
  static std::atomic<long long> smem_set[16] = {};
  static std::atomic<int> pdl_cache[16] = {};
  static std::atomic<int> bulk_ok{0}; /* 1 yes, -1 no */
  auto f = attn_oproj_kernel<T, D, GQ>;
  int ok = bulk_ok.load(std::memory_order_relaxed);
  if (ok == 0) {
    ok = ot_bulk_kernel_ok((const void *)f) ? 1 : -1;
    bulk_ok.store(ok, std::memory_order_relaxed);
  }
  if (ok < 0) return cudaSuccess; /* no sm_90 code: declined */
  cudaError_t e = smem_opt_in(f, pl.smem, dev, smem_set);
  if (e != cudaSuccess) return e;
  int per_sm = 0;
  if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, f, kAoThreads, pl.smem) != cudaSuccess) {
    (void)cudaGetLastError();
    return cudaSuccess;
  }
  /* the grid barriers: every CTA resident at once */
  if (per_sm < 1 || (int64_t)per_sm * sm_count(dev < 0 ? 0 : dev) < pl.G) return cudaSuccess;
  e = ot_launch_pdl_smem(pdl_ok(f, dev, pdl_cache), f, dim3((unsigned)pl.G), dim3(kAoThreads),
                         pl.smem, st, a, pl.nsplit, pl.late);
  *done = e == cudaSuccess;
  return e;
}

template <typename T>
cudaError_t launch_ao(const ote_attn_oproj_args &a, cudaStream_t st, int *done) {
  const int dev = current_device();
  ao_plan pl;
  *done = 0;
  if (!ao_plan_for(a, dev, &pl)) return cudaSuccess;
  const int GQ = a.hq / a.hkv;
  if (a.head_dim == 32) {
    if (GQ == 1) return launch_ao_t<T, 32, 1>(a, pl, dev, st, done);
    if (GQ == 2) return launch_ao_t<T, 32, 2>(a, pl, dev, st, done);
    if (GQ == 4) return launch_ao_t<T, 32, 4>(a, pl, dev, st, done);
    return launch_ao_t<T, 32, 8>(a, pl, dev, st, done);
  }
  if (a.head_dim == 64) {
    if (GQ == 1) return launch_ao_t<T, 64, 1>(a, pl, dev, st, done);
    if (GQ == 2) return launch_ao_t<T, 64, 2>(a, pl, dev, st, done);
    if (GQ == 4) return launch_ao_t<T, 64, 4>(a, pl, dev, st, done);
    return launch_ao_t<T, 64, 8>(a, pl, dev, st, done);
  }
  if (GQ == 1) return launch_ao_t<T, 128, 1>(a, pl, dev, st, done);
  if (GQ == 2) return launch_ao_t<T, 128, 2>(a, pl, dev, st, done);
  return launch_ao_t<T, 128, 4>(a, pl, dev, st, done);
}

} /* namespace */

extern "C" int ote_cuda_fused_gemv(const ote_fused_gemv_args *a, int dtype_code, int mode,
                                   int pdl, void *stream) {
  cudaStream_t st = (cudaStream_t)stream;
  if (a->N <= 0) return 0;
  if (mode != kNorm && mode != kSwiglu) return (int)cudaErrorInvalidValue;
  if (a->rope && (mode != kNorm || a->argmax_out || a->glu_out || a->head_dim % 2 ||
                  a->N != (int64_t)(a->hq + 2 * a->hkv) * a->head_dim))
    return (int)cudaErrorInvalidValue;
  if (a->glu_out && (mode != kNorm || a->argmax_out || a->N % 2)) return (int)cudaErrorInvalidValue;
  if (a->argmax_out && mode != kNorm) return (int)cudaErrorInvalidValue;
  if (dtype_code == 4 /* kDLBfloat */) return (int)launch_any<__nv_bfloat16>(*a, mode, st, pdl);
  return (int)launch_any<__half>(*a, mode, st, pdl);
}

/* y = x W^T (+ bias) for one row x by the staged kernel (a.w, a.N, a.K, a.bias, a.x, a.y,
 * a.max_blocks; every pointer 16-byte aligned): *done 0 when a's shape does not fit it
 * (nothing launched; the caller takes another linear) */
extern "C" int ote_cuda_staged_gemv(const ote_fused_gemv_args *a, int dtype_code, int pdl,
                                    void *stream, int *done) {
  cudaStream_t st = (cudaStream_t)stream;
  if (dtype_code == 4 /* kDLBfloat */) return (int)launch_staged<__nv_bfloat16>(*a, st, pdl, done);
  return (int)launch_staged<__half>(*a, st, pdl, done);
}

/* y = x W^T (+ bias) (+ res) for one row x by the rowblock kernel (a.w, a.N, a.K, a.bias,
 * a.x, a.y, a.res -- may be a.y --, a.max_blocks; a.depth: rows in flight a thread, 2 or
 * else 4; W and x 16-byte aligned), or with a.rope / a.glu_out the norm-fed qkv / gate_up
 * projection of ote_cuda_fused_gemv's mode 0 by rowblock_norm_kernel (a.depth 4, else 8;
 * a.argmax_out not set): *done 0 when a's shape does not fit it (nothing
 * launched; the caller takes another linear) */
extern "C" int ote_cuda_rowblock_gemv(const ote_fused_gemv_args *a, int dtype_code, int pdl,
                                      void *stream, int *done) {
  cudaStream_t st = (cudaStream_t)stream;
  *done = 0;
  if (a->rope || a->glu_out) { /* rmsnorm(delta + res) W^T: qkv (rope) or gate_up (glu_out) */
    if (a->argmax_out || (a->rope && a->glu_out) || !a->res || !a->gamma ||
        (a->rope && (a->head_dim % 2 || a->N != (int64_t)(a->hq + 2 * a->hkv) * a->head_dim)))
      return (int)cudaErrorInvalidValue;
    if (dtype_code == 4 /* kDLBfloat */)
      return (int)(a->rope ? launch_rowblock_norm_d<__nv_bfloat16, kRope>(*a, st, pdl, done)
                           : launch_rowblock_norm_d<__nv_bfloat16, kGlu>(*a, st, pdl, done));
    return (int)(a->rope ? launch_rowblock_norm_d<__half, kRope>(*a, st, pdl, done)
                         : launch_rowblock_norm_d<__half, kGlu>(*a, st, pdl, done));
  }
  if (dtype_code == 4 /* kDLBfloat */)
    return (int)(a->depth == 2 ? launch_rowblock<__nv_bfloat16, 2>(*a, st, pdl, done)
                               : launch_rowblock<__nv_bfloat16, 4>(*a, st, pdl, done));
  return (int)(a->depth == 2 ? launch_rowblock<__half, 2>(*a, st, pdl, done)
                             : launch_rowblock<__half, 4>(*a, st, pdl, done));
}

/* The scratch bytes ote_cuda_attn_oproj needs for hq query heads on hkv kv heads of
 * head_dim on the current device (its grid barrier and its ranges' partials) */
extern "C" size_t ote_cuda_attn_oproj_scratch(int hq, int hkv, int head_dim) {
  if (hq <= 0 || hkv <= 0 || head_dim <= 0) return 0;
  const int dev = current_device();
  int64_t ns = sm_count(dev < 0 ? 0 : dev) / hkv;
  if (ns < 1) ns = 1;
  return kAoBarBytes + (size_t)hq * (size_t)ns * (size_t)(head_dim + 2) * sizeof(float);
}

/* The batch-1 decode's attention + o_proj by attn_oproj_kernel (fused_kernels.h): *done 0
 * when a does not fit it (nothing launched; the caller runs the paged attention and
 * o_proj apart) */
extern "C" int ote_cuda_attn_oproj(const ote_attn_oproj_args *a, int dtype_code, void *stream,
                                   int *done) {
  cudaStream_t st = (cudaStream_t)stream;
  *done = 0;
  if (dtype_code == 4 /* kDLBfloat */) return (int)launch_ao<__nv_bfloat16>(*a, st, done);
  return (int)launch_ao<__half>(*a, st, done);
}

#ifdef OTE_AO_TRACE
/* OTE_AO_TRACE builds (libot_engine_ao_trace.so): clear (clear != 0) the attention +
 * o_proj kernel's stamps, or copy its [1024][16] stamps to dst (bench/engine_pa_trace.py
 * --kernel attn_oproj). 0 on success. */
extern "C" int ote_ao_trace(unsigned long long *dst, int clear) {
  void *p = nullptr;
  if (cudaGetSymbolAddress(&p, ao_tr_buf) != cudaSuccess) return -1;
  if (clear) return cudaMemset(p, 0, sizeof(ao_tr_buf)) == cudaSuccess ? 0 : -1;
  return cudaMemcpy(dst, p, sizeof(ao_tr_buf), cudaMemcpyDeviceToHost) == cudaSuccess ? 0 : -1;
}
#endif
