/*
 * cross_entropy.cu -- cross-entropy of [N, V] logits against integer labels on CUDA,
 * forward and backward, bf16 / fp16 / fp32 storage, float32 arithmetic.
 *
 * One block per row (grid-stride over rows), 32..512 threads by V. A row is read in
 * 16-byte vectors (kCeUnroll of them in flight per thread) from the first 16-byte
 * boundary of that row, with the few elements before it and after the last whole
 * vector done one by one: any row stride and any V work, never an fp32 copy of the
 * logits. Each thread keeps an online (max m, sum_j exp(z_j - m)) pair, rescaled when
 * m grows (exp in base 2: ex2.approx of fma(z, log2 e, -m log2 e)), and sum_j z_j when
 * label smoothing needs it; the block merges the pairs (warp shuffles, then shared
 * memory). Then, like the CPU (src/cpu/cross_entropy.c), in float64:
 *   lse = m + log(sum),  loss = (1-s) (lse - z_y) + s (lse - sum_j z_j / V).
 *
 * Reductions: NONE writes each row's loss. MEAN and SUM write the float32 row losses
 * into a [N] scratch (cudaMallocAsync on the context's stream) and one block of
 * kCeReduceThreads reduces them in float64: thread t sums a contiguous run of rows in
 * order, then a fixed tree, so the result is deterministic; the same kernel counts the
 * rows whose label is not ignore_index (labels are device memory: the host never reads
 * them), and MEAN divides by that count (NaN when it is 0, as torch).
 *
 * Backward, per row: lse (saved, or one more online pass), then one pass writing
 *   dz_j = g exp(z_j - lse) - g s / V - g (1-s) [j == y]
 * with g = dloss (NONE: per row; SUM: dloss[0]; MEAN: dloss[0] / count, the count from
 * the reduction kernel into a one-float scratch). Ignored rows get zeros. Each element
 * is loaded and stored by the same thread, after the block's lse barrier, so
 * dlogits == logits works. Rows of logits and dlogits with a different 16-byte phase
 * take the scalar loop.
 *
 * Labels are not validated on CUDA (that would need a synchronization): a label
 * outside [0, V) that is not ignore_index gives a NaN loss row (and a NaN lse-based
 * gradient row in the backward), which makes MEAN / SUM NaN.
 */
#include <math.h>
#include <string.h>

#include "../core/softmax.h"
#include "common.cuh"
#include "cuda_state.h"

namespace ot {

constexpr int kCeMaxThreads = 512;
constexpr int kCeUnroll = 4;
constexpr int kCeReduceThreads = 1024;
constexpr float kLog2e = 1.4426950408889634f;

struct ce_params {
  int64_t N, V;
  const void *logits;
  int64_t ls;
  const void *labels;
  int64_t ys;
  bool labels64;
  int64_t ignore;
  float smoothing;
  int reduction;
  float *lse; /* or NULL */
  int64_t lses;
  float *loss; /* NONE: the op's [N]; MEAN / SUM: the [N] scratch (stride 1) */
  int64_t losss;
  const float *dloss;
  int64_t dls;
  const float *gmean; /* backward MEAN: dloss[0] / count on the device */
  void *dlogits;
  int64_t ds;
};

__device__ __forceinline__ float ex2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

__device__ __forceinline__ int64_t ce_label(const void *labels, bool l64, int64_t stride,
                                            int64_t r) {
  return l64 ? static_cast<const int64_t *>(labels)[r * stride]
             : (int64_t) static_cast<const int32_t *>(labels)[r * stride];
}

/* Absorb n values into the online state (m, s) and, when SZ, the running sum z. */
template <int n, bool SZ>
__device__ __forceinline__ void ce_absorb(float &m, float &s, float &z, const float *x) {
  float cm = x[0];
#pragma unroll
  for (int i = 1; i < n; i++) cm = fmaxf(cm, x[i]);
  if (cm > m) {
    s *= ex2((m - cm) * kLog2e); /* m = -inf: s is 0 and stays 0 */
    m = cm;
  }
  if (SZ) {
#pragma unroll
    for (int i = 0; i < n; i++) z += x[i];
  }
  if (m == -INFINITY) return; /* all -inf so far: nothing to add (avoids -inf + inf) */
  const float mm = m * kLog2e;
#pragma unroll
  for (int i = 0; i < n; i++) s += ex2(fmaf(x[i], kLog2e, -mm));
}

__device__ __forceinline__ void ce_merge(float &m, float &s, float om, float os) {
  const float M = fmaxf(m, om);
  if (M == -INFINITY) return;
  s = s * ex2((m - M) * kLog2e) + os * ex2((om - M) * kLog2e);
  m = M;
}

/* First element of `row` on a 16-byte boundary (capped at V). */
template <typename T> __device__ __forceinline__ int64_t ce_head(const T *row, int64_t V) {
  const int64_t h = (int64_t)(((16u - ((uintptr_t)row & 15u)) & 15u) / sizeof(T));
  return h < V ? h : V;
}

/* This thread's part of the online statistics of one row. */
template <typename T, bool SZ, bool STREAM>
__device__ __forceinline__ void ce_row_stats(const T *row, int64_t V, float &m, float &s,
                                             float &z) {
  constexpr int VEC = vec_width<T>::value;
  m = -INFINITY;
  s = 0.0f;
  z = 0.0f;
  const int64_t head = ce_head(row, V);
  const int64_t nv = (V - head) / VEC, tail0 = head + nv * VEC;
  const int64_t B = blockDim.x;
  for (int64_t j = threadIdx.x; j < head; j += B) {
    float x = to_f32(row[j]);
    ce_absorb<1, SZ>(m, s, z, &x);
  }
  for (int64_t j = tail0 + threadIdx.x; j < V; j += B) {
    float x = to_f32(row[j]);
    ce_absorb<1, SZ>(m, s, z, &x);
  }
  const uint4 *vp = reinterpret_cast<const uint4 *>(row + head);
  for (int64_t i = threadIdx.x; i < nv; i += B * kCeUnroll) {
    raw16 r[kCeUnroll];
#pragma unroll
    for (int u = 0; u < kCeUnroll; u++) {
      const int64_t k = i + u * B;
      if (k < nv) r[u].u = STREAM ? __ldcs(vp + k) : vp[k];
    }
#pragma unroll
    for (int u = 0; u < kCeUnroll; u++) {
      if (i + u * B < nv) {
        float f[VEC];
        unpack<T>(f, r[u]);
        ce_absorb<VEC, SZ>(m, s, z, f);
      }
    }
  }
}

/* Merge (m, s, z) over the block; every thread gets the result. Contains barriers:
 * every thread of the block must call it. */
__device__ __forceinline__ void ce_block_stats(float &m, float &s, float &z) {
  __shared__ float sh_m[32], sh_s[32], sh_z[32];
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    const float om = __shfl_xor_sync(0xffffffffu, m, o);
    const float os = __shfl_xor_sync(0xffffffffu, s, o);
    z += __shfl_xor_sync(0xffffffffu, z, o);
    ce_merge(m, s, om, os);
  }
  const int nw = blockDim.x >> 5;
  if (nw == 1) return;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  __syncthreads(); /* the previous row's readers are done */
  if (lane == 0) {
    sh_m[warp] = m;
    sh_s[warp] = s;
    sh_z[warp] = z;
  }
  __syncthreads();
  m = lane < nw ? sh_m[lane] : -INFINITY;
  s = lane < nw ? sh_s[lane] : 0.0f;
  z = lane < nw ? sh_z[lane] : 0.0f;
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    const float om = __shfl_xor_sync(0xffffffffu, m, o);
    const float os = __shfl_xor_sync(0xffffffffu, s, o);
    z += __shfl_xor_sync(0xffffffffu, z, o);
    ce_merge(m, s, om, os);
  }
}

template <typename T>
__global__ void __launch_bounds__(kCeMaxThreads) ce_fwd_kernel(const ce_params p) {
  const bool smooth = p.smoothing > 0.0f;
  for (int64_t r = blockIdx.x; r < p.N; r += gridDim.x) {
    const T *row = static_cast<const T *>(p.logits) + r * p.ls;
    const int64_t y = ce_label(p.labels, p.labels64, p.ys, r);
    const bool ignored = y == p.ignore;
    float m = -INFINITY, s = 0.0f, z = 0.0f;
    if (!ignored || p.lse) { /* uniform over the block */
      if (smooth) ce_row_stats<T, true, true>(row, p.V, m, s, z);
      else ce_row_stats<T, false, true>(row, p.V, m, s, z);
      ce_block_stats(m, s, z);
    }
    if (threadIdx.x == 0) {
      double li = 0.0;
      if (!ignored || p.lse) {
        const double lse = (double)m + log((double)s);
        if (p.lse) p.lse[r * p.lses] = (float)lse;
        if (!ignored) {
          if (y < 0 || y >= p.V) {
            li = NAN;
          } else {
            const double sm = p.smoothing;
            li = (1.0 - sm) * (lse - (double)to_f32(row[y]));
            if (smooth) li += sm * (lse - (double)z / (double)p.V);
          }
        }
      }
      p.loss[p.reduction == OT_REDUCTION_NONE ? r * p.losss : r] = (float)li;
    }
  }
}

/* One block. FORWARD: out[0] = sum of the row losses rl[0..N) (MEAN: / count, NaN when
 * 0). Backward (MEAN only): out[0] = dloss[0] / count. count = rows whose label is not
 * ignore. Deterministic: contiguous runs per thread in row order, then a fixed tree. */
template <bool FORWARD>
__global__ void __launch_bounds__(kCeReduceThreads)
    ce_reduce_kernel(const float *rl, int64_t N, const void *labels, bool l64, int64_t ys,
                     int64_t ignore, int reduction, const float *dloss, float *out) {
  __shared__ double sh_t[kCeReduceThreads];
  __shared__ long long sh_c[kCeReduceThreads];
  const int t = threadIdx.x;
  const int64_t per = (N + kCeReduceThreads - 1) / kCeReduceThreads;
  const int64_t b = t * per, e = b + per < N ? b + per : N;
  double acc = 0.0;
  long long cnt = 0;
  for (int64_t r = b; r < e; r++) {
    if (FORWARD) acc += (double)rl[r];
    cnt += ce_label(labels, l64, ys, r) != ignore;
  }
  sh_t[t] = acc;
  sh_c[t] = cnt;
  __syncthreads();
  for (int w = kCeReduceThreads / 2; w > 0; w >>= 1) {
    if (t < w) {
      sh_t[t] += sh_t[t + w];
      sh_c[t] += sh_c[t + w];
    }
    __syncthreads();
  }
  if (t == 0) {
    const double total = sh_t[0];
    const long long c = sh_c[0];
    if (FORWARD)
      out[0] = (float)(reduction == OT_REDUCTION_MEAN ? (c > 0 ? total / (double)c : NAN)
                                                       : total);
    else out[0] = c > 0 ? (float)((double)dloss[0] / (double)c) : 0.0f;
  }
}

template <typename T>
__global__ void __launch_bounds__(kCeMaxThreads) ce_bwd_kernel(const ce_params p) {
  constexpr int VEC = vec_width<T>::value;
  const int64_t V = p.V, B = blockDim.x;
  for (int64_t r = blockIdx.x; r < p.N; r += gridDim.x) {
    const T *row = static_cast<const T *>(p.logits) + r * p.ls;
    T *out = static_cast<T *>(p.dlogits) + r * p.ds;
    const int64_t y = ce_label(p.labels, p.labels64, p.ys, r);
    const int64_t head = ce_head(out, V);
    const int64_t nv = (V - head) / VEC, tail0 = head + nv * VEC;
    uint4 *ovp = reinterpret_cast<uint4 *>(out + head);
    if (y == p.ignore) { /* uniform over the block */
      for (int64_t j = threadIdx.x; j < head; j += B) out[j] = from_f32<T>(0.0f);
      for (int64_t j = tail0 + threadIdx.x; j < V; j += B) out[j] = from_f32<T>(0.0f);
      for (int64_t i = threadIdx.x; i < nv; i += B) __stcs(ovp + i, make_uint4(0u, 0u, 0u, 0u));
      continue;
    }
    const float g = p.reduction == OT_REDUCTION_NONE  ? p.dloss[r * p.dls]
                    : p.reduction == OT_REDUCTION_SUM ? p.dloss[0]
                                                      : *p.gmean;
    float lse;
    if (p.lse) {
      lse = p.lse[r * p.lses];
    } else {
      float m, s, z;
      ce_row_stats<T, false, false>(row, V, m, s, z);
      ce_block_stats(m, s, z);
      lse = (float)((double)m + log((double)s));
    }
    if (y < 0 || y >= V) lse = NAN; /* not validated on CUDA: a NaN row */
    const double sm = p.smoothing;
    const float c0 = (float)(-(double)g * sm / (double)V), cy = (float)((double)g * (1.0 - sm));
    const float l2 = lse * kLog2e;
    if ((((uintptr_t)row ^ (uintptr_t)out) & 15u) != 0) { /* different phases: scalar */
      for (int64_t j = threadIdx.x; j < V; j += B) {
        float v = g * ex2(fmaf(to_f32(row[j]), kLog2e, -l2)) + c0;
        if (j == y) v -= cy;
        out[j] = from_f32<T>(v);
      }
      continue;
    }
    for (int64_t j = threadIdx.x; j < head; j += B) {
      float v = g * ex2(fmaf(to_f32(row[j]), kLog2e, -l2)) + c0;
      if (j == y) v -= cy;
      out[j] = from_f32<T>(v);
    }
    for (int64_t j = tail0 + threadIdx.x; j < V; j += B) {
      float v = g * ex2(fmaf(to_f32(row[j]), kLog2e, -l2)) + c0;
      if (j == y) v -= cy;
      out[j] = from_f32<T>(v);
    }
    const uint4 *ivp = reinterpret_cast<const uint4 *>(row + head);
    for (int64_t i = threadIdx.x; i < nv; i += B * kCeUnroll) {
      raw16 rr[kCeUnroll];
#pragma unroll
      for (int u = 0; u < kCeUnroll; u++) {
        const int64_t k = i + u * B;
        if (k < nv) rr[u].u = __ldcs(ivp + k);
      }
#pragma unroll
      for (int u = 0; u < kCeUnroll; u++) {
        const int64_t k = i + u * B;
        if (k < nv) {
          float f[VEC];
          unpack<T>(f, rr[u]);
          const int64_t j0 = head + k * VEC;
          const int64_t ey = y - j0; /* in [0, VEC) when this vector holds the label */
#pragma unroll
          for (int e = 0; e < VEC; e++) {
            f[e] = g * ex2(fmaf(f[e], kLog2e, -l2)) + c0;
            if (e == ey) f[e] -= cy;
          }
          raw16 o;
          pack<T>(o, f);
          __stcs(ovp + k, o.u);
        }
      }
    }
  }
}

/* Threads per row: enough for kCeUnroll vectors each, 32..512. */
static int ce_threads(int64_t V, size_t es) {
  const int64_t nv = (V * (int64_t)es + 15) / 16;
  int b = 32;
  while (b < kCeMaxThreads && (int64_t)b * kCeUnroll * 2 <= nv) b *= 2;
  return b;
}

static unsigned ce_grid(int64_t N) { return (unsigned)(N < (1 << 30) ? N : (1 << 30)); }

template <typename T>
static cudaError_t ce_forward_launch(const ce_params &p, cudaStream_t st) {
  ce_fwd_kernel<T><<<ce_grid(p.N), ce_threads(p.V, sizeof(T)), 0, st>>>(p);
  return cudaGetLastError();
}

template <typename T>
static cudaError_t ce_backward_launch(const ce_params &p, cudaStream_t st) {
  ce_bwd_kernel<T><<<ce_grid(p.N), ce_threads(p.V, sizeof(T)), 0, st>>>(p);
  return cudaGetLastError();
}

static ce_params ce_params_of(const ot_cross_entropy_args *a) {
  ce_params p;
  memset(&p, 0, sizeof p);
  p.N = a->N;
  p.V = a->V;
  p.logits = a->logits;
  p.ls = a->logits_stride;
  p.labels = a->labels;
  p.ys = a->labels_stride;
  p.labels64 = a->labels_dtype == OT_I64;
  p.ignore = a->ignore_index;
  p.smoothing = a->label_smoothing;
  p.reduction = (int)a->reduction;
  p.lse = a->lse;
  p.lses = a->lse_stride;
  return p;
}

static ot_status ce_fail(const char *op, cudaError_t e) {
  (void)cudaGetLastError();
  return ot_error(OT_ERR_BACKEND, op, "CUDA: %s", cudaGetErrorString(e));
}

} /* namespace ot */

extern "C" ot_status ot_cuda_cross_entropy_forward(ot_context *ctx,
                                                   const ot_cross_entropy_args *a) {
  static const char op[] = "ot_cross_entropy_forward";
  using namespace ot;
  cudaStream_t st = static_cast<cudaStream_t>(ctx->stream);
  ce_params p = ce_params_of(a);
  const bool none = a->reduction == OT_REDUCTION_NONE;
  float *scratch = nullptr;
  if (none) {
    if (a->N == 0) return OT_OK;
    p.loss = a->loss;
    p.losss = a->loss_stride;
  } else if (a->N > 0) {
    OT_TRY(ot_cuda_temp_alloc(ctx, (size_t)a->N * sizeof(float), op, "the row losses",
                              reinterpret_cast<void **>(&scratch)));
    p.loss = scratch;
    p.losss = 1;
  }
  cudaError_t e = cudaSuccess;
  if (a->N > 0) {
    switch (a->dtype) {
      case OT_F32: e = ce_forward_launch<float>(p, st); break;
      case OT_F16: e = ce_forward_launch<__half>(p, st); break;
      case OT_BF16: e = ce_forward_launch<__nv_bfloat16>(p, st); break;
      default:
        (void)ot_cuda_temp_free(ctx, scratch, op);
        return ot_error(OT_ERR_INTERNAL, op, "unexpected storage dtype %d", (int)a->dtype);
    }
  }
  if (e == cudaSuccess && !none) {
    ce_reduce_kernel<true><<<1, kCeReduceThreads, 0, st>>>(
        scratch, a->N, a->labels, p.labels64, a->labels_stride, a->ignore_index,
        (int)a->reduction, nullptr, a->loss);
    e = cudaGetLastError();
  }
  if (scratch) {
    ot_status f = ot_cuda_temp_free(ctx, scratch, op);
    if (e == cudaSuccess && f != OT_OK) return f;
  }
  return e == cudaSuccess ? OT_OK : ce_fail(op, e);
}

extern "C" ot_status ot_cuda_cross_entropy_backward(ot_context *ctx,
                                                    const ot_cross_entropy_args *a) {
  static const char op[] = "ot_cross_entropy_backward";
  using namespace ot;
  if (a->N == 0) return OT_OK;
  cudaStream_t st = static_cast<cudaStream_t>(ctx->stream);
  ce_params p = ce_params_of(a);
  p.dloss = a->dloss;
  p.dls = a->dloss_stride;
  p.dlogits = a->dlogits;
  p.ds = a->dlogits_stride;
  float *scratch = nullptr;
  cudaError_t e = cudaSuccess;
  if (a->reduction == OT_REDUCTION_MEAN) {
    OT_TRY(ot_cuda_temp_alloc(ctx, sizeof(float), op, "the mean's scale",
                              reinterpret_cast<void **>(&scratch)));
    ce_reduce_kernel<false><<<1, kCeReduceThreads, 0, st>>>(
        nullptr, a->N, a->labels, p.labels64, a->labels_stride, a->ignore_index,
        (int)a->reduction, a->dloss, scratch);
    e = cudaGetLastError();
    p.gmean = scratch;
  }
  if (e == cudaSuccess) {
    switch (a->dtype) {
      case OT_F32: e = ce_backward_launch<float>(p, st); break;
      case OT_F16: e = ce_backward_launch<__half>(p, st); break;
      case OT_BF16: e = ce_backward_launch<__nv_bfloat16>(p, st); break;
      default:
        (void)ot_cuda_temp_free(ctx, scratch, op);
        return ot_error(OT_ERR_INTERNAL, op, "unexpected storage dtype %d", (int)a->dtype);
    }
  }
  if (scratch) {
    ot_status f = ot_cuda_temp_free(ctx, scratch, op);
    if (e == cudaSuccess && f != OT_OK) return f;
  }
  return e == cudaSuccess ? OT_OK : ce_fail(op, e);
}
