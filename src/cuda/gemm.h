/*
 * gemm.h -- the CUDA backend's one way to run a dense GEMM: cuBLASLt through the
 * context's handle and workspace (created lazily by the first GEMM on a context, freed
 * with it in context.cu), with a per-process cache of heuristic results. Used by the
 * linear layer (src/cuda/linear.cu) and the fused linear + cross-entropy.
 *
 * Column-major, like cuBLAS: D [m, n] = alpha op(A) op(B) + beta D, where op(A) is
 * [m, k] (A stored [k, m] with lda when transa, else [m, k]) and op(B) is [k, n]
 * (B stored [n, k] when transb, else [k, n]). A row-major matrix [r, c] with row stride
 * s is the column-major [c, r] with leading dimension s.
 *
 * Precision: A and B in `ab` (float32 / float16 / bfloat16), D in `d` (ab or float32),
 * float32 accumulation and scale. float32 products run in full float32
 * (CUBLAS_COMPUTE_32F) unless the environment variable OT_MATMUL_ALLOW_TF32=1 is set
 * when the GEMM runs (then CUBLAS_COMPUTE_32F_FAST_TF32: TF32 tensor cores, ~10 bits
 * of mantissa in the products; torch's allow_tf32 / matmul_precision "high").
 */
#ifndef OT_CUDA_GEMM_H
#define OT_CUDA_GEMM_H

#include <stdbool.h>
#include <stdint.h>

#include "../core/internal.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum ot_gemm_epilogue {
  OT_GEMM_PLAIN = 0,
  OT_GEMM_BIAS = 1,   /* D[i, j] += bias[i] (bias [m], dtype d) */
  OT_GEMM_BGRADB = 2  /* also bias[j] = sum_k op(B)[k, j] (bias [n], dtype d) */
} ot_gemm_epilogue;

typedef struct ot_gemm {
  bool transa, transb;
  int64_t m, n, k; /* k >= 1, m, n >= 1 */
  ot_dtype ab, d;
  const void *A;
  int64_t lda;
  const void *B;
  int64_t ldb;
  void *D;
  int64_t ldd;
  float alpha, beta;
  ot_gemm_epilogue epilogue;
  void *bias;
} ot_gemm;

/* Enqueue the GEMM on ctx's stream. OT_ERR_UNSUPPORTED (nothing enqueued, no error
 * recorded) when cuBLASLt has no algorithm for this epilogue: the caller falls back. */
ot_status ot_cuda_gemm(ot_context *ctx, const char *op, const ot_gemm *g);

#ifdef __cplusplus
}
#endif

#endif /* OT_CUDA_GEMM_H */
