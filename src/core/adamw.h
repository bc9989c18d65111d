/*
 * adamw.h -- private side of ot_adamw_step: the validated tensor table and the
 * backend entry points (src/cpu/adamw.c, src/cuda/adamw.cu).
 */
#ifndef OT_CORE_ADAMW_H
#define OT_CORE_ADAMW_H

#include "internal.h"

#ifdef __cplusplus
extern "C" {
#endif

/* One tensor of the step: every pointer addresses `numel` contiguous elements. */
typedef struct ot_adamw_tensor {
  void *param;        /* param_dtype */
  const void *grad;   /* grad_dtype */
  void *exp_avg;      /* state_dtype */
  void *exp_avg_sq;   /* state_dtype */
  float *master;      /* float32, or NULL when the call has no master weights */
  int64_t numel;
} ot_adamw_tensor;

typedef struct ot_adamw_args {
  ot_dtype param_dtype, grad_dtype, state_dtype;
  bool has_master;
  int n;                          /* tensors (numel may be 0 for some) */
  const ot_adamw_tensor *tensors; /* [n], host memory */
  int64_t total;                  /* sum of numel */
  float lr, beta1, beta2, eps, weight_decay;
  /* Derived on the host in float64 (the same numbers on every backend): */
  float decay;     /* 1 - lr * weight_decay */
  float step_size; /* lr / (1 - beta1^step) */
  float bc2_sqrt;  /* sqrt(1 - beta2^step) */
} ot_adamw_args;

ot_status ot_cpu_adamw_step(ot_context *ctx, const ot_adamw_args *a);
ot_status ot_cuda_adamw_step(ot_context *ctx, const ot_adamw_args *a);

#ifdef __cplusplus
}
#endif

#endif /* OT_CORE_ADAMW_H */
