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
#include <stdlib.h>
#include <string.h>

#include "../core/attention.h"

#ifdef __cplusplus
extern "C" {
#endif

ot_status ot_cuda_attention_forward_sm90(ot_context *ctx, const ot_attention_args *a,
                                         bool *handled);

/* Whether the Hopper kernels can run on ctx at all: a build with sm_90a, a 9.0 device,
 * OT_ATTN_SM90 unset or not 0. */
bool ot_cuda_attention_sm90_available(ot_context *ctx);

/* OT_ATTN_IMPL, read per call (benchmarks switch it in-process): "portable" skips the
 * Hopper kernels; "sm90" requires them -- a call they do not take fails with
 * OT_ERR_UNSUPPORTED (ot_cuda_attention_sm90_refusal) instead of running the portable
 * kernel, so that tests and benchmarks know which kernel ran; anything else: Hopper
 * first where it applies. */
typedef enum { OT_ATTN_IMPL_AUTO, OT_ATTN_IMPL_PORTABLE, OT_ATTN_IMPL_SM90 } ot_attn_impl;

static inline ot_attn_impl ot_cuda_attention_impl(void) {
  const char *e = getenv("OT_ATTN_IMPL");
  if (e && strcmp(e, "portable") == 0) return OT_ATTN_IMPL_PORTABLE;
  if (e && strcmp(e, "sm90") == 0) return OT_ATTN_IMPL_SM90;
  return OT_ATTN_IMPL_AUTO;
}

/* The error of a call OT_ATTN_IMPL=sm90 cannot serve; `which`: "forward" / "backward". */
ot_status ot_cuda_attention_sm90_refusal(ot_context *ctx, const char *op, const char *which,
                                         const ot_attention_args *a);
/* The Hopper backward (src/cuda/sm90/attention_bwd_sm90.cu; dQ accumulated with fp32
 * atomics, so never taken when a->deterministic is set). Same contract as the forward:
 * *handled = false, nothing written, when it does not cover the call. */
ot_status ot_cuda_attention_backward_sm90(ot_context *ctx, const ot_attention_args *a,
                                          bool *handled);

#ifdef __cplusplus
}
#endif

#endif /* OT_CUDA_ATTENTION_SM90_H */
