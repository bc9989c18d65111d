/*
 * layernorm.cu -- LayerNorm forward (optionally with the fused residual add) and
 * backward on CUDA. The kernels are shared with RMSNorm (norm.cuh, LAYER = true here).
 *   out = (h - mean) * rstd * weight + bias, rstd = 1 / sqrt(var(h) + eps)
 */
#include "norm_dispatch.cuh"

extern "C" ot_status ot_cuda_layernorm_forward(ot_context *ctx, const ot_norm_forward_args *a) {
  return ot::norm_forward_cuda<true>("ot_layernorm_forward", ctx, a);
}

extern "C" ot_status ot_cuda_layernorm_backward(ot_context *ctx,
                                                const ot_norm_backward_args *a) {
  return ot::norm_backward_cuda<true>("ot_layernorm_backward", ctx, a);
}
