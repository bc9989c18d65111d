/*
 * softmax.cu -- softmax over the last dimension on CUDA, forward and backward,
 * bf16 / fp16 / fp32 storage, float32 arithmetic, rows of any length and stride.
 *
 * One row per group of blockDim.x threads: for rows of up to 32 x 4 16-byte vectors a
 * group of 1..32 lanes (the power of two >= the row's vectors, at most a warp; blocks of
 * 256 threads hold 256 / blockDim.x rows: a 128-column bf16 row takes 16 lanes, two rows
 * per warp), then a block of 64..512 threads per row up to 512 x 4 vectors (16K bf16 /
 * 8K fp32 elements). In those two the row stays in registers as packed 16-byte vectors
 * (NV per thread), so it is read once and written once. Longer rows use a block of 512 threads that streams the row twice (NV = 0):
 *   forward  pass 1: each thread keeps an online (max m, sum exp(x - m)) pair over its
 *            16-byte vectors (rescaled when m grows: one pass, no separate max pass);
 *            the group takes the max of the m (shuffles, then shared memory), each
 *            thread rescales its sum once, and the sums are added;
 *            pass 2: re-read, write exp(x - m) / sum.
 *   backward pass 1: dot = sum(dy * y); pass 2: dx = y (dy - dot).
 * Each element is written by the thread that read it, after the group's reduction, so
 * out == x and dx == dy (in place) are safe. Rows whose base or stride is not 16-byte
 * aligned, or whose length is not a multiple of the vector, use element-wise loads in
 * the same structure (ALIGNED = false). exp is exp2f of x log2(e) - m log2(e).
 */
#include <math.h>

#include "../core/softmax.h"
#include "common.cuh"

namespace ot {

constexpr float kSmLog2e = 1.4426950408889634f;
constexpr int kSmGroupThreads = 256; /* threads per block in the sub-warp layout */
constexpr int kSmMaxNV = 4;         /* cached vectors per thread */
constexpr int kSmMaxThreads = 512;  /* per row */

struct sm_params {
  int64_t rows, cols;
  const void *a; /* x (forward) or dy (backward) */
  int64_t as;
  const void *b; /* y (backward) */
  int64_t bs;
  void *out; /* out or dx */
  int64_t os;
};

/* Sum of v over the blockDim.x threads of a row (every thread gets it). The groups of
 * blockDim.x < 32 lanes are aligned inside their warp, so xor offsets below blockDim.x
 * stay in the group; blockDim.x > 32 only with blockDim.y == 1. Every thread of the
 * block calls it (full-mask shuffles, barriers). */
__device__ __forceinline__ float sm_group_sum(float v) {
  for (int o = blockDim.x < 32 ? blockDim.x >> 1 : 16; o > 0; o >>= 1)
    v += __shfl_xor_sync(0xffffffffu, v, o);
  if (blockDim.x <= 32) return v;
  __shared__ float red[32];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
  if (lane == 0) red[warp] = v;
  __syncthreads();
  v = lane < nw ? red[lane] : 0.0f;
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

/* Merge the (m, s) pairs of a row's threads: the group max M first (shuffles of fmaxf),
 * then each thread rescales its sum once, s exp(m - M), and the sums are added -- one
 * exponential per thread instead of one per merge step. */
__device__ __forceinline__ void sm_group_merge(float &m, float &s) {
  float M = m;
  for (int o = blockDim.x < 32 ? blockDim.x >> 1 : 16; o > 0; o >>= 1)
    M = fmaxf(M, __shfl_xor_sync(0xffffffffu, M, o));
  if (blockDim.x > 32) {
    __shared__ float red_m[32];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    if (lane == 0) red_m[warp] = M;
    __syncthreads();
    M = lane < nw ? red_m[lane] : -INFINITY;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) M = fmaxf(M, __shfl_xor_sync(0xffffffffu, M, o));
  }
  /* m = -inf (nothing seen): s is 0 and exp2f(-inf) is 0 */
  s = M == -INFINITY ? 0.0f : s * exp2f((m - M) * kSmLog2e);
  m = M;
  s = sm_group_sum(s);
}

/* Absorb VEC values (the ones at index >= n masked out) into (m, s). */
template <int VEC>
__device__ __forceinline__ void sm_absorb(float &m, float &s, const float *x, int64_t base,
                                          int64_t n) {
  float cm = -INFINITY;
#pragma unroll
  for (int i = 0; i < VEC; i++)
    if (base + i < n) cm = fmaxf(cm, x[i]);
  if (cm > m) {
    s *= exp2f((m - cm) * kSmLog2e);
    m = cm;
  }
  if (m == -INFINITY) return;
  const float mm = m * kSmLog2e;
#pragma unroll
  for (int i = 0; i < VEC; i++)
    if (base + i < n) s += exp2f(fmaf(x[i], kSmLog2e, -mm));
}

template <typename T, bool AL, int NV>
__global__ void __launch_bounds__(512) softmax_fwd_kernel(sm_params p) {
  constexpr int VEC = vec_width<T>::value;
  const int64_t row = (int64_t)blockIdx.x * blockDim.y + threadIdx.y;
  /* no early return: every lane takes part in the group's shuffles */
  const bool valid = row < p.rows;
  const T *x = static_cast<const T *>(p.a) + (valid ? row : 0) * p.as;
  T *out = static_cast<T *>(p.out) + (valid ? row : 0) * p.os;
  const int64_t n = p.cols, step = (int64_t)blockDim.x * VEC;
  float m = -INFINITY, s = 0.0f;
  raw16 cache[NV > 0 ? NV : 1];
  if (NV > 0) {
#pragma unroll
    for (int i = 0; i < NV; i++) {
      const int64_t base = (int64_t)threadIdx.x * VEC + i * step;
      load_raw<T, AL, true>(cache[i], x, base, n, valid && base < n);
      float f[VEC];
      unpack<T>(f, cache[i]);
      sm_absorb<VEC>(m, s, f, base, valid ? n : 0);
    }
  } else if (valid) {
    for (int64_t base = (int64_t)threadIdx.x * VEC; base < n; base += step) {
      raw16 r;
      load_raw<T, AL, false>(r, x, base, n, true);
      float f[VEC];
      unpack<T>(f, r);
      sm_absorb<VEC>(m, s, f, base, n);
    }
  }
  sm_group_merge(m, s);
  const float inv = 1.0f / s, mm = m * kSmLog2e;
  auto emit = [&](const raw16 &r, int64_t base) {
    float f[VEC];
    unpack<T>(f, r);
#pragma unroll
    for (int k = 0; k < VEC; k++) f[k] = exp2f(fmaf(f[k], kSmLog2e, -mm)) * inv;
    store_row_vec<T, AL>(out, base, n, f);
  };
  if (NV > 0) {
#pragma unroll
    for (int i = 0; i < NV; i++) {
      const int64_t base = (int64_t)threadIdx.x * VEC + i * step;
      if (valid && base < n) emit(cache[i], base);
    }
  } else if (valid) {
    for (int64_t base = (int64_t)threadIdx.x * VEC; base < n; base += step) {
      raw16 r;
      load_raw<T, AL, true>(r, x, base, n, true);
      emit(r, base);
    }
  }
}

template <typename T, bool AL, int NV>
__global__ void __launch_bounds__(512) softmax_bwd_kernel(sm_params p) {
  constexpr int VEC = vec_width<T>::value;
  const int64_t row = (int64_t)blockIdx.x * blockDim.y + threadIdx.y;
  const bool valid = row < p.rows; /* as in the forward: no early return */
  const int64_t r = valid ? row : 0;
  const T *dy = static_cast<const T *>(p.a) + r * p.as;
  const T *y = static_cast<const T *>(p.b) + r * p.bs;
  T *dx = static_cast<T *>(p.out) + r * p.os;
  const int64_t n = p.cols, step = (int64_t)blockDim.x * VEC;
  raw16 cdy[NV > 0 ? NV : 1], cy[NV > 0 ? NV : 1];
  float dot = 0.0f;
  auto absorb = [&](const raw16 &a, const raw16 &b) {
    float f[VEC], g[VEC];
    unpack<T>(f, a);
    unpack<T>(g, b);
#pragma unroll
    for (int k = 0; k < VEC; k++) dot = fmaf(f[k], g[k], dot); /* zeros past n */
  };
  if (NV > 0) {
#pragma unroll
    for (int i = 0; i < NV; i++) {
      const int64_t base = (int64_t)threadIdx.x * VEC + i * step;
      load_raw<T, AL, true>(cdy[i], dy, base, n, valid && base < n);
      load_raw<T, AL, true>(cy[i], y, base, n, valid && base < n);
      absorb(cdy[i], cy[i]);
    }
  } else if (valid) {
    for (int64_t base = (int64_t)threadIdx.x * VEC; base < n; base += step) {
      raw16 a, b;
      load_raw<T, AL, false>(a, dy, base, n, true);
      load_raw<T, AL, false>(b, y, base, n, true);
      absorb(a, b);
    }
  }
  dot = sm_group_sum(dot);
  auto emit = [&](const raw16 &a, const raw16 &b, int64_t base) {
    float f[VEC], g[VEC];
    unpack<T>(f, a);
    unpack<T>(g, b);
#pragma unroll
    for (int k = 0; k < VEC; k++) f[k] = g[k] * (f[k] - dot);
    store_row_vec<T, AL>(dx, base, n, f);
  };
  if (NV > 0) {
#pragma unroll
    for (int i = 0; i < NV; i++) {
      const int64_t base = (int64_t)threadIdx.x * VEC + i * step;
      if (valid && base < n) emit(cdy[i], cy[i], base);
    }
  } else if (valid) {
    for (int64_t base = (int64_t)threadIdx.x * VEC; base < n; base += step) {
      raw16 a, b;
      load_raw<T, AL, true>(a, dy, base, n, true);
      load_raw<T, AL, true>(b, y, base, n, true);
      emit(a, b, base);
    }
  }
}

static int pow2_at_least(int64_t v) {
  int p = 1;
  while (p < v) p <<= 1;
  return p;
}

/* Launch shape for a row of nvec vectors: (threads per row, rows per block, NV). */
struct sm_shape {
  int bx, by, nv;
};

static sm_shape sm_shape_for(int64_t nvec) {
  if (nvec <= 32 * kSmMaxNV) {
    const int bx = nvec < 32 ? pow2_at_least(nvec) : 32;
    return {bx, kSmGroupThreads / bx, pow2_at_least((nvec + bx - 1) / bx)};
  }
  if (nvec <= (int64_t)kSmMaxThreads * kSmMaxNV) {
    int bx = pow2_at_least((nvec + kSmMaxNV - 1) / kSmMaxNV);
    if (bx < 64) bx = 64;
    return {bx, 1, pow2_at_least((nvec + bx - 1) / bx)};
  }
  return {kSmMaxThreads, 1, 0};
}

template <typename T, bool AL, bool FWD>
static cudaError_t sm_launch_al(const sm_params &p, cudaStream_t st) {
  constexpr int VEC = vec_width<T>::value;
  const sm_shape s = sm_shape_for((p.cols + VEC - 1) / VEC);
  const dim3 block(s.bx, s.by);
  const unsigned grid = (unsigned)((p.rows + s.by - 1) / s.by);
#define OT_SM_CASE(NV_)                                                  \
  case NV_:                                                              \
    if (FWD) softmax_fwd_kernel<T, AL, NV_><<<grid, block, 0, st>>>(p);  \
    else softmax_bwd_kernel<T, AL, NV_><<<grid, block, 0, st>>>(p);      \
    break;
  switch (s.nv) {
    OT_SM_CASE(0)
    OT_SM_CASE(1)
    OT_SM_CASE(2)
    OT_SM_CASE(4)
    default: return cudaErrorInvalidConfiguration;
  }
#undef OT_SM_CASE
  return cudaGetLastError();
}

template <typename T, bool FWD>
static cudaError_t sm_launch(const sm_params &p, cudaStream_t st) {
  constexpr int VEC = vec_width<T>::value;
  const bool al = p.cols % VEC == 0 && ot_rows_aligned16(p.a, p.as, sizeof(T), p.rows) &&
                  ot_rows_aligned16(p.b, p.bs, sizeof(T), p.rows) &&
                  ot_rows_aligned16(p.out, p.os, sizeof(T), p.rows);
  return al ? sm_launch_al<T, true, FWD>(p, st) : sm_launch_al<T, false, FWD>(p, st);
}

template <bool FWD>
static ot_status sm_run(const char *op, ot_dtype d, const sm_params &p, cudaStream_t st) {
  if (p.rows == 0 || p.cols == 0) return OT_OK;
  cudaError_t e;
  switch (d) {
    case OT_F32: e = sm_launch<float, FWD>(p, st); break;
    case OT_F16: e = sm_launch<__half, FWD>(p, st); break;
    case OT_BF16: e = sm_launch<__nv_bfloat16, FWD>(p, st); break;
    default: return ot_error(OT_ERR_INTERNAL, op, "unexpected storage dtype %d", (int)d);
  }
  if (e != cudaSuccess) {
    (void)cudaGetLastError();
    return ot_error(OT_ERR_BACKEND, op, "CUDA: %s", cudaGetErrorString(e));
  }
  return OT_OK;
}

} /* namespace ot */

extern "C" ot_status ot_cuda_softmax_forward(ot_context *ctx, const ot_softmax_forward_args *a) {
  ot::sm_params p = {a->rows, a->cols, a->x, a->x_stride, nullptr, 0, a->out, a->out_stride};
  return ot::sm_run<true>("ot_softmax_forward", a->dtype, p, (cudaStream_t)ctx->stream);
}

extern "C" ot_status ot_cuda_softmax_backward(ot_context *ctx, const ot_softmax_backward_args *a) {
  ot::sm_params p = {a->rows, a->cols, a->dy, a->dy_stride, a->y, a->y_stride, a->dx, a->dx_stride};
  return ot::sm_run<false>("ot_softmax_backward", a->dtype, p, (cudaStream_t)ctx->stream);
}
