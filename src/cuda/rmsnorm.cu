/*
 * rmsnorm.cu -- RMSNorm forward (optionally with the fused residual add) and backward
 * on CUDA. The kernels are shared with LayerNorm (norm.cuh, LAYER = false here).
 *   out = h * rstd * weight, rstd = 1 / sqrt(mean(h^2) + eps), h = x (+ residual)
 */
#include "norm_dispatch.cuh"

extern "C" ot_status ot_cuda_rmsnorm_forward(ot_context *ctx, const ot_norm_forward_args *a) {
  return ot::norm_forward_cuda<false>("ot_rmsnorm_forward", ctx, a);
}

extern "C" ot_status ot_cuda_rmsnorm_backward(ot_context *ctx, const ot_norm_backward_args *a) {
  return ot::norm_backward_cuda<false>("ot_rmsnorm_backward", ctx, a);
}
