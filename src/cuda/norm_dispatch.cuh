/*
 * norm_dispatch.cuh -- the glue between the validated norm arguments (core/norm.h)
 * and the kernels of norm.cuh: dtype dispatch, the call's launch context (the context's
 * device facts and the tuning knobs, norm_cfg_of) and CUDA error reporting. Included by
 * rmsnorm.cu (LAYER = false) and layernorm.cu (LAYER = true).
 */
#ifndef OT_CUDA_NORM_DISPATCH_CUH
#define OT_CUDA_NORM_DISPATCH_CUH

#include "../core/norm.h"
#include "norm.cuh"

namespace ot {

/* temp_st: a temporary's failure (norm_temp_alloc / norm_temp_free: its message is set),
 * returned as it is. */
static inline ot_status norm_cuda_status(const char *op, cudaError_t e, ot_status temp_st) {
  if (e == cudaSuccess) return OT_OK;
  (void)cudaGetLastError(); /* clear a non-sticky error */
  if (temp_st != OT_OK) return temp_st;
  if (e == cudaErrorMemoryAllocation)
    return ot_error(OT_ERR_OOM, op, "CUDA workspace allocation failed: %s", cudaGetErrorString(e));
  return ot_error(OT_ERR_BACKEND, op, "CUDA: %s", cudaGetErrorString(e));
}

template <bool LAYER>
ot_status norm_forward_cuda(const char *op, ot_context *ctx, const ot_norm_forward_args *a) {
  norm_fwd_params p;
  p.rows = a->rows;
  p.cols = a->cols;
  p.x = a->x;
  p.x_stride = a->x_stride;
  p.residual = a->residual;
  p.residual_stride = a->residual_stride;
  p.weight = a->weight;
  p.bias = LAYER ? a->bias : nullptr;
  p.out = a->out;
  p.out_stride = a->out_stride;
  p.residual_out = a->residual_out;
  p.residual_out_stride = a->residual_out_stride;
  p.mean = LAYER ? a->mean : nullptr;
  p.rstd = a->rstd;
  p.eps = a->eps;
  ot_status temp_st = OT_OK;
  const norm_cfg c = norm_cfg_of(ctx, op, &temp_st);
  cudaStream_t s = static_cast<cudaStream_t>(ctx->stream);
  cudaError_t e;
  switch (a->dtype) {
    case OT_F32: e = norm_forward_launch<float, LAYER>(c, p, s); break;
    case OT_F16: e = norm_forward_launch<__half, LAYER>(c, p, s); break;
    case OT_BF16: e = norm_forward_launch<__nv_bfloat16, LAYER>(c, p, s); break;
    default: return ot_error(OT_ERR_INTERNAL, op, "unexpected storage dtype %d", (int)a->dtype);
  }
  return norm_cuda_status(op, e, temp_st);
}

template <bool LAYER>
ot_status norm_backward_cuda(const char *op, ot_context *ctx, const ot_norm_backward_args *a) {
  norm_bwd_params p;
  p.rows = a->rows;
  p.cols = a->cols;
  p.dy = a->dy;
  p.dy_stride = a->dy_stride;
  p.dres = a->dresidual_out;
  p.dres_stride = a->dresidual_out_stride;
  p.h = a->h;
  p.h_stride = a->h_stride;
  p.weight = a->weight;
  p.mean = LAYER ? a->mean : nullptr;
  p.rstd = a->rstd;
  /* LayerNorm needs both saved statistics; with only one, recompute both. */
  if (LAYER && (!p.mean || !p.rstd)) p.mean = nullptr, p.rstd = nullptr;
  p.eps = a->eps;
  p.dx = a->dx;
  p.dx_stride = a->dx_stride;
  p.dw_part = nullptr;
  p.db_part = nullptr;
  void *db = LAYER ? a->dbias : nullptr;
  ot_status temp_st = OT_OK;
  const norm_cfg c = norm_cfg_of(ctx, op, &temp_st);
  cudaStream_t s = static_cast<cudaStream_t>(ctx->stream);
  cudaError_t e;
  switch (a->dtype) {
    case OT_F32:
      e = norm_backward_launch<float, LAYER>(c, p, (float *)a->dweight, (float *)db, s);
      break;
    case OT_F16:
      e = norm_backward_launch<__half, LAYER>(c, p, (__half *)a->dweight, (__half *)db, s);
      break;
    case OT_BF16:
      e = norm_backward_launch<__nv_bfloat16, LAYER>(c, p, (__nv_bfloat16 *)a->dweight,
                                                     (__nv_bfloat16 *)db, s);
      break;
    default: return ot_error(OT_ERR_INTERNAL, op, "unexpected storage dtype %d", (int)a->dtype);
  }
  return norm_cuda_status(op, e, temp_st);
}

} /* namespace ot */

#endif /* OT_CUDA_NORM_DISPATCH_CUH */
