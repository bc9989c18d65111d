/*
 * linear_cross_entropy.cu -- fused linear + cross-entropy on CUDA: chunks of tokens
 * through cuBLASLt (src/cuda/gemm.h) and the cross-entropy kernels of
 * src/cuda/cross_entropy.cu, never the whole [T, V] logits (public header for the
 * algorithm and the memory bound).
 *
 * Enqueued on the context's stream, no synchronization:
 *   1. lce_count_kernel: the non-ignored labels (device memory) -> count, and the
 *      per-row gradient scale g (1 for SUM, 1 / count for MEAN, 0 when count = 0)
 *      into the workspace's scalars;
 *   2. per chunk of C tokens: logits GEMM into the workspace, CE forward (NONE) into
 *      the row losses (and lse), CE backward (NONE, dloss = g with stride 0) over the
 *      logits, dhidden GEMM, dweight GEMM (beta = 1 after the first chunk; a float32
 *      dweight accumulates in float32);
 *   3. lce_reduce_kernel: MEAN / SUM of the row losses in float64, in a fixed order
 *      (one block: contiguous runs per thread, then a fixed tree): deterministic.
 */
#include <math.h>

#include "../core/linear_cross_entropy.h"
#include "../core/softmax.h"
#include "common.cuh"
#include "cuda_state.h"
#include "gemm.h"

namespace ot {

constexpr int kLceThreads = 1024;

struct lce_scalars {
  float g;       /* gradient scale of each non-ignored row */
  int32_t pad;
  long long count;
};

__device__ __forceinline__ int64_t lce_label(const void *labels, bool l64, int64_t stride,
                                             int64_t r) {
  return l64 ? static_cast<const int64_t *>(labels)[r * stride]
             : (int64_t) static_cast<const int32_t *>(labels)[r * stride];
}

__global__ void __launch_bounds__(kLceThreads)
    lce_count_kernel(const void *labels, bool l64, int64_t stride, int64_t T, int64_t ignore,
                     bool mean, lce_scalars *out) {
  __shared__ long long part[kLceThreads / 32];
  long long c = 0;
  for (int64_t r = threadIdx.x; r < T; r += blockDim.x)
    c += lce_label(labels, l64, stride, r) != ignore;
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) c += __shfl_xor_sync(0xffffffffu, c, o);
  if ((threadIdx.x & 31) == 0) part[threadIdx.x >> 5] = c;
  __syncthreads();
  if (threadIdx.x == 0) {
    long long total = 0;
    for (int w = 0; w < (int)(blockDim.x >> 5); w++) total += part[w];
    out->count = total;
    out->g = !mean ? 1.0f : total > 0 ? (float)(1.0 / (double)total) : 0.0f;
  }
}

__global__ void __launch_bounds__(kLceThreads)
    lce_reduce_kernel(const float *row_loss, int64_t T, bool mean, const lce_scalars *sc,
                      float *loss) {
  __shared__ double part[kLceThreads];
  const int64_t per = (T + blockDim.x - 1) / blockDim.x;
  const int64_t lo = threadIdx.x * per, hi = lo + per < T ? lo + per : T;
  double s = 0.0;
  for (int64_t r = lo; r < hi; r++) s += (double)row_loss[r];
  part[threadIdx.x] = s;
  __syncthreads();
  for (int w = blockDim.x / 2; w > 0; w >>= 1) {
    if ((int)threadIdx.x < w) part[threadIdx.x] += part[threadIdx.x + w];
    __syncthreads();
  }
  if (threadIdx.x == 0) {
    double total = part[0];
    if (mean) total = sc->count > 0 ? total / (double)sc->count : (double)NAN;
    *loss = (float)total;
  }
}

static ot_status lce_fail(const char *op, cudaError_t e) {
  (void)cudaGetLastError();
  return ot_error(OT_ERR_BACKEND, op, "CUDA: %s", cudaGetErrorString(e));
}

} /* namespace ot */

extern "C" ot_status ot_cuda_linear_cross_entropy(ot_context *ctx, const ot_lce_args *a) {
  static const char op[] = "ot_linear_cross_entropy";
  using namespace ot;
  const int64_t T = a->T, H = a->H, V = a->V, C = a->chunk;
  const size_t es = ot_dtype_size(a->dtype);
  const ot_lce_layout lay = ot_lce_layout_of(T, V, C, es);
  const bool none = a->reduction == OT_REDUCTION_NONE;
  const bool grads = a->dhidden || a->dweight;
  const bool l64 = a->labels_dtype == OT_I64;
  cudaStream_t st = (cudaStream_t)ctx->stream;

  char *ws = (char *)a->workspace;
  bool own = false;
  if (!ws) {
    OT_TRY(ot_cuda_temp_alloc(ctx, lay.total, op, "workspace",
                              reinterpret_cast<void **>(&ws)));
    own = true;
  }
  void *logits = ws + lay.logits;
  float *lse = reinterpret_cast<float *>(ws + lay.lse);
  float *row_loss = reinterpret_cast<float *>(ws + lay.row_loss);
  lce_scalars *sc = reinterpret_cast<lce_scalars *>(ws + lay.scalars);

  ot_status s = OT_OK;
  cudaError_t e = cudaSuccess;
  lce_count_kernel<<<1, kLceThreads, 0, st>>>(a->labels, l64, a->labels_stride, T,
                                             a->ignore_index,
                                             a->reduction == OT_REDUCTION_MEAN, sc);
  e = cudaGetLastError();
  if (e == cudaSuccess && a->dweight && (T == 0 || H == 0) && V * H > 0)
    e = cudaMemsetAsync(a->dweight, 0, (size_t)(V * H) * ot_dtype_size(a->dweight_dtype), st);
  for (int64_t t0 = 0; t0 < T && e == cudaSuccess && s == OT_OK; t0 += C) {
    const int64_t c = T - t0 < C ? T - t0 : C;
    const void *h = (const char *)a->hidden + (size_t)(t0 * a->hidden_stride) * es;
    if (H == 0) {
      e = cudaMemsetAsync(logits, 0, (size_t)(c * V) * es, st);
      if (e != cudaSuccess) break;
    } else {
      ot_gemm g;
      memset(&g, 0, sizeof g);
      g.transa = true;
      g.m = V;
      g.n = c;
      g.k = H;
      g.ab = g.d = a->dtype;
      g.A = a->weight;
      g.lda = H;
      g.B = h;
      g.ldb = a->hidden_stride;
      g.D = logits;
      g.ldd = V;
      g.alpha = 1.0f;
      if ((s = ot_cuda_gemm(ctx, op, &g)) != OT_OK) break;
    }

    ot_cross_entropy_args ce = ot_lce_chunk_ce_args(a, t0, c, logits, lse, row_loss);
    if ((s = ot_cuda_cross_entropy_forward(ctx, &ce)) != OT_OK) break;
    if (!grads) continue;
    ce.dloss = &sc->g;
    ce.dloss_stride = 0;
    ce.dlogits = logits;
    ce.dlogits_stride = V;
    if ((s = ot_cuda_cross_entropy_backward(ctx, &ce)) != OT_OK) break;
    if (H == 0) continue;
    if (a->dhidden) {
      ot_gemm g;
      memset(&g, 0, sizeof g);
      g.m = H;
      g.n = c;
      g.k = V;
      g.ab = g.d = a->dtype;
      g.A = a->weight;
      g.lda = H;
      g.B = logits;
      g.ldb = V;
      g.D = (char *)a->dhidden + (size_t)(t0 * a->dhidden_stride) * es;
      g.ldd = a->dhidden_stride;
      g.alpha = 1.0f;
      if ((s = ot_cuda_gemm(ctx, op, &g)) != OT_OK) break;
    }
    if (a->dweight) {
      ot_gemm g;
      memset(&g, 0, sizeof g);
      g.transb = true;
      g.m = H;
      g.n = V;
      g.k = c;
      g.ab = a->dtype;
      g.d = a->dweight_dtype;
      g.A = h;
      g.lda = a->hidden_stride;
      g.B = logits;
      g.ldb = V;
      g.D = a->dweight;
      g.ldd = H;
      g.alpha = 1.0f;
      g.beta = t0 == 0 ? 0.0f : 1.0f;
      if ((s = ot_cuda_gemm(ctx, op, &g)) != OT_OK) break;
    }
  }
  if (e == cudaSuccess && s == OT_OK && !none) {
    lce_reduce_kernel<<<1, kLceThreads, 0, st>>>(row_loss, T,
                                                 a->reduction == OT_REDUCTION_MEAN, sc, a->loss);
    e = cudaGetLastError();
  }
  if (own) {
    ot_status f = ot_cuda_temp_free(ctx, ws, op);
    if (s == OT_OK && e == cudaSuccess) s = f;
  }
  if (s != OT_OK) return s;
  return e == cudaSuccess ? OT_OK : lce_fail(op, e);
}
