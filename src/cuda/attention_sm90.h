/*
 * attention_sm90.h -- the interface between the CUDA attention dispatcher
 * (src/cuda/attention_fwd.cu, the portable sm_80+ path) and the Hopper forward kernel
 * (src/cuda/sm90/attention_fwd_sm90.cu: TMA + wgmma + warp specialization).
 *
 * The dispatcher calls ot_cuda_attention_forward_sm90 first on sm_90 devices. It sets
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

#ifdef __cplusplus
}
#endif

#endif /* OT_CUDA_ATTENTION_SM90_H */
