/*
 * linear_cross_entropy.h -- private side of ot_linear_cross_entropy: validated
 * arguments, the workspace layout (the same on every backend) and the backend entry
 * points (src/cpu/linear_cross_entropy.c, src/cuda/linear_cross_entropy.cu).
 */
#ifndef OT_CORE_LINEAR_CROSS_ENTROPY_H
#define OT_CORE_LINEAR_CROSS_ENTROPY_H

#include "internal.h"
#include "softmax.h"

#ifdef __cplusplus
extern "C" {
#endif

/* 256 MiB of logits per chunk by default. */
#define OT_LCE_DEFAULT_CHUNK_BYTES ((int64_t)1 << 28)

typedef struct ot_lce_args {
  ot_dtype dtype;             /* hidden, weight, dhidden, the logits chunk */
  int64_t T, H, V, chunk;     /* tokens, hidden size, vocabulary, tokens per chunk (>= 1) */
  const void *hidden;         /* [T, H] at hidden_stride */
  int64_t hidden_stride;
  const void *weight;         /* [V, H] contiguous */
  const void *labels;         /* [T] at labels_stride */
  ot_dtype labels_dtype;
  int64_t labels_stride;
  int64_t ignore_index;
  float label_smoothing;
  ot_reduction reduction;
  int64_t count;              /* non-ignored tokens (CPU), -1 on CUDA (counted there) */
  float *loss;                /* [T] at loss_stride (NONE) or one value */
  int64_t loss_stride;
  void *dhidden;              /* [T, H] at dhidden_stride, or NULL */
  int64_t dhidden_stride;
  void *dweight;              /* [V, H] contiguous, or NULL */
  ot_dtype dweight_dtype;     /* dtype or float32 */
  void *workspace;            /* layout.total bytes, 16-byte aligned; NULL: allocate */
} ot_lce_args;

/* Workspace layout: byte offsets of the logits chunk [chunk, V], lse [chunk] float32,
 * the row losses [T] float32 and 256 bytes of scalars; total bytes. */
typedef struct ot_lce_layout {
  size_t logits, lse, row_loss, scalars, total;
} ot_lce_layout;

static inline size_t ot_lce_round256(size_t b) { return (b + 255) & ~(size_t)255; }

static inline ot_lce_layout ot_lce_layout_of(int64_t T, int64_t V, int64_t chunk,
                                             size_t elem) {
  ot_lce_layout l;
  l.logits = 0;
  l.lse = ot_lce_round256((size_t)chunk * (size_t)V * elem);
  l.row_loss = l.lse + ot_lce_round256((size_t)chunk * 4);
  l.scalars = l.row_loss + ot_lce_round256((size_t)(T > 0 ? T : 1) * 4);
  l.total = l.scalars + 256;
  return l;
}

/* The chunk size: requested (clamped to [1, T]) or the default budget. */
static inline int64_t ot_lce_chunk(int64_t requested, int64_t T, int64_t V, size_t elem) {
  int64_t c = requested;
  if (c <= 0) {
    int64_t row = V * (int64_t)elem;
    c = row > 0 ? OT_LCE_DEFAULT_CHUNK_BYTES / row : T;
  }
  if (c > T) c = T;
  if (c < 1) c = 1;
  return c;
}

/* The cross-entropy arguments of chunk [t0, t0 + c):
 * reduction NONE over the workspace's logits, row losses
 * into the op's loss (NONE) or the workspace's row_loss, lse saved when gradients
 * follow. The backward fills dloss / dlogits. */
static inline ot_cross_entropy_args ot_lce_chunk_ce_args(const ot_lce_args *a, int64_t t0,
                                                         int64_t c, void *logits, float *lse,
                                                         float *row_loss) {
  ot_cross_entropy_args ce;
  memset(&ce, 0, sizeof ce);
  ce.dtype = a->dtype;
  ce.N = c;
  ce.V = a->V;
  ce.logits = logits;
  ce.logits_stride = a->V;
  ce.labels = (const char *)a->labels +
              (size_t)(t0 * a->labels_stride) * ot_dtype_size(a->labels_dtype);
  ce.labels_dtype = a->labels_dtype;
  ce.labels_stride = a->labels_stride;
  ce.ignore_index = a->ignore_index;
  ce.label_smoothing = a->label_smoothing;
  ce.reduction = OT_REDUCTION_NONE;
  ce.count = -1;
  ce.lse = (a->dhidden || a->dweight) ? lse : NULL;
  ce.lse_stride = 1;
  const bool none = a->reduction == OT_REDUCTION_NONE;
  ce.loss = none ? a->loss + t0 * a->loss_stride : row_loss + t0;
  ce.loss_stride = none ? a->loss_stride : 1;
  return ce;
}

ot_status ot_cpu_linear_cross_entropy(ot_context *ctx, const ot_lce_args *a);
ot_status ot_cuda_linear_cross_entropy(ot_context *ctx, const ot_lce_args *a);

#ifdef __cplusplus
}
#endif

#endif /* OT_CORE_LINEAR_CROSS_ENTROPY_H */
