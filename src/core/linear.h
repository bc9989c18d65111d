/*
 * linear.h -- private declarations of the linear layer family: the validated
 * arguments of ot_linear_forward / ot_linear_backward and their backend entry points.
 *
 * Shapes (M = rows of x flattened over its leading dims, K = in_features,
 * N = out_features):
 *   x [M, K] (rows may be strided), weight [N, K] contiguous, bias [N] contiguous,
 *   y / dy [M, N] (rows may be strided), dx [M, K] (rows may be strided),
 *   dweight [N, K] contiguous, dbias [N] contiguous.
 */
#ifndef OT_CORE_LINEAR_H
#define OT_CORE_LINEAR_H

#include "internal.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct ot_linear_forward_args {
  ot_dtype dtype;          /* storage dtype of every tensor */
  int64_t rows, in_features, out_features; /* M, K, N */
  const void *x;           /* [M, K], row stride x_stride */
  int64_t x_stride;
  const void *weight;      /* [N, K], contiguous */
  const void *bias;        /* [N] or NULL */
  void *y;                 /* [M, N], row stride y_stride */
  int64_t y_stride;
} ot_linear_forward_args;

typedef struct ot_linear_backward_args {
  ot_dtype dtype;
  int64_t rows, in_features, out_features; /* M, K, N */
  const void *dy;          /* [M, N], row stride dy_stride */
  int64_t dy_stride;
  const void *x;           /* [M, K], row stride x_stride */
  int64_t x_stride;
  const void *weight;      /* [N, K], contiguous */
  void *dx;                /* [M, K] row stride dx_stride, or NULL */
  int64_t dx_stride;
  void *dweight;           /* [N, K] contiguous, or NULL */
  void *dbias;             /* [N], or NULL */
} ot_linear_backward_args;

ot_status ot_cpu_linear_forward(ot_context *ctx, const ot_linear_forward_args *a);
ot_status ot_cpu_linear_backward(ot_context *ctx, const ot_linear_backward_args *a);
/* Bytes of the one CPU temporary (cpu/temp.h) each call takes (0: none); the fused
 * linear + cross-entropy checks that its chunks' calls will find them. */
size_t ot_cpu_linear_forward_temp_bytes(const ot_context *ctx, const ot_linear_forward_args *a);
size_t ot_cpu_linear_backward_temp_bytes(const ot_context *ctx,
                                         const ot_linear_backward_args *a);

/* Defined by the CUDA backend (src/cuda/linear.cu). */
ot_status ot_cuda_linear_forward(ot_context *ctx, const ot_linear_forward_args *a);
ot_status ot_cuda_linear_backward(ot_context *ctx, const ot_linear_backward_args *a);

#ifdef __cplusplus
}
#endif

#endif /* OT_CORE_LINEAR_H */
