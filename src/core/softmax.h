/*
 * softmax.h -- softmax and cross-entropy: argument structs and backend entry points.
 * The public functions are in src/core/softmax.c and src/core/cross_entropy.c.
 * Row strides are in elements of the storage dtype; 1-D strides in elements.
 */
#ifndef OT_CORE_SOFTMAX_H
#define OT_CORE_SOFTMAX_H

#include "internal.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct ot_softmax_forward_args {
  ot_dtype dtype;
  int64_t rows, cols;
  const void *x; /* [rows, cols] at x_stride */
  void *out;     /* [rows, cols] at out_stride; may be exactly x */
  int64_t x_stride, out_stride;
} ot_softmax_forward_args;

typedef struct ot_softmax_backward_args {
  ot_dtype dtype;
  int64_t rows, cols;
  const void *dy, *y; /* [rows, cols] */
  void *dx;           /* [rows, cols]; may be exactly dy */
  int64_t dy_stride, y_stride, dx_stride;
} ot_softmax_backward_args;

/* One struct for both directions: the forward fills loss, the backward dloss and
 * dlogits. */
typedef struct ot_cross_entropy_args {
  ot_dtype dtype; /* of logits / dlogits */
  int64_t N, V;
  const void *logits; /* [N, V] at logits_stride */
  int64_t logits_stride;
  const void *labels; /* int32 / int64 [N] at labels_stride; validated in range on
                         the CPU backend only (device memory on CUDA) */
  ot_dtype labels_dtype;
  int64_t labels_stride;
  int64_t ignore_index;
  float label_smoothing;
  ot_reduction reduction;
  int64_t count; /* rows whose label is not ignore_index; -1 on CUDA (counted there) */
  float *lse;    /* [N] at lse_stride, or NULL (forward: not saved; backward: recompute) */
  int64_t lse_stride;
  float *loss; /* forward: [N] at loss_stride for NONE, else one value */
  int64_t loss_stride;
  const float *dloss; /* backward: like loss */
  int64_t dloss_stride;
  void *dlogits; /* backward: [N, V] at dlogits_stride; may be exactly logits */
  int64_t dlogits_stride;
} ot_cross_entropy_args;

ot_status ot_cpu_softmax_forward(ot_context *ctx, const ot_softmax_forward_args *a);
ot_status ot_cpu_softmax_backward(ot_context *ctx, const ot_softmax_backward_args *a);
/* reduction is an ot_reduction and label_smoothing in [0, 1]; errors name `name`.field
 * ("params" for ot_cross_entropy_*, "params.ce" for ot_linear_cross_entropy). */
ot_status ot_cross_entropy_check_params(const char *op, const char *name,
                                        const ot_cross_entropy_params *p);

/* Labels (host-readable) in [0, V) or equal to ignore: *count = the labels not ignored.
 * An error names the first bad entry ("labels: <unit> i has label y, outside ..."). */
ot_status ot_cross_entropy_check_labels(const char *op, const ot_view *yv, int64_t V,
                                        int64_t ignore, const char *unit, int64_t *count);

ot_status ot_cpu_cross_entropy_forward(ot_context *ctx, const ot_cross_entropy_args *a);
ot_status ot_cpu_cross_entropy_backward(ot_context *ctx, const ot_cross_entropy_args *a);
ot_status ot_cuda_softmax_forward(ot_context *ctx, const ot_softmax_forward_args *a);
ot_status ot_cuda_softmax_backward(ot_context *ctx, const ot_softmax_backward_args *a);
ot_status ot_cuda_cross_entropy_forward(ot_context *ctx, const ot_cross_entropy_args *a);
ot_status ot_cuda_cross_entropy_backward(ot_context *ctx, const ot_cross_entropy_args *a);

#ifdef __cplusplus
}
#endif

#endif /* OT_CORE_SOFTMAX_H */
