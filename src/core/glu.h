/*
 * glu.h -- gated activations (SwiGLU, GeGLU): argument structs and backend entry
 * points. The public functions are in src/core/glu.c.
 *
 * Both layouts reduce to the same rows: in the fused layout (up == NULL) `up` points
 * F elements into each gate row and `dup` F elements into each dgate row, with the
 * row stride of gate / dgate. Strides are in elements of `dtype`.
 */
#ifndef OT_CORE_GLU_H
#define OT_CORE_GLU_H

#include "internal.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct ot_glu_forward_args {
  ot_glu_kind kind;
  ot_dtype dtype;
  int64_t rows, F;
  const void *gate; /* [rows, F] at gate_stride */
  const void *up;   /* [rows, F] at up_stride */
  void *out;        /* [rows, F] at out_stride; overlaps neither input */
  int64_t gate_stride, up_stride, out_stride;
} ot_glu_forward_args;

typedef struct ot_glu_backward_args {
  ot_glu_kind kind;
  ot_dtype dtype;
  int64_t rows, F;
  const void *dout; /* [rows, F] */
  const void *gate; /* [rows, F] */
  const void *up;   /* [rows, F] */
  void *dgate;      /* [rows, F]; may be exactly gate */
  void *dup;        /* [rows, F]; may be exactly up */
  void *out;        /* [rows, F] or NULL: the forward's act(gate) * up, recomputed */
  int64_t dout_stride, gate_stride, up_stride, dgate_stride, dup_stride, out_stride;
} ot_glu_backward_args;

ot_status ot_cpu_glu_forward(ot_context *ctx, const ot_glu_forward_args *a);
ot_status ot_cpu_glu_backward(ot_context *ctx, const ot_glu_backward_args *a);
ot_status ot_cuda_glu_forward(ot_context *ctx, const ot_glu_forward_args *a);
ot_status ot_cuda_glu_backward(ot_context *ctx, const ot_glu_backward_args *a);

#ifdef __cplusplus
}
#endif

#endif /* OT_CORE_GLU_H */
