/*
 * attention_sm90.h -- the interface between the CUDA attention dispatcher
 * (src/cuda/attention_fwd.cu / attention_bwd.cu, the portable sm_80+ path) and the Hopper
 * kernels (src/cuda/sm90/attention_{fwd,bwd}_sm90.cu: TMA + wgmma + warp specialization).
 *
 * The dispatchers call ot_cuda_attention_{forward,backward}_sm90 first on sm_90 devices. It sets
 * *handled = false, writing nothing, when the Hopper kernel does not cover the call
 * (head dim, dtype, strides or options it has no variant for); the dispatcher then runs
 * the portable kernel. Errors from a launch it did attempt are returned as usual.
 */
#ifndef OT_CUDA_ATTENTION_SM90_H
#define OT_CUDA_ATTENTION_SM90_H

#include <stdbool.h>

#include "../core/attention.h"

#ifdef __cplusplus
extern "C" {
#endif

ot_status ot_cuda_attention_forward_sm90(ot_context *ctx, const ot_attention_args *a,
                                         bool *handled);
/* The Hopper backward (src/cuda/sm90/attention_bwd_sm90.cu; dQ accumulated with fp32
 * atomics, so never taken when a->deterministic is set). Same contract as the forward:
 * *handled = false, nothing written, when it does not cover the call. */
ot_status ot_cuda_attention_backward_sm90(ot_context *ctx, const ot_attention_args *a,
                                          bool *handled);

#ifdef __cplusplus
}
#endif

#endif /* OT_CUDA_ATTENTION_SM90_H */
