/*
 * cuda_state.h -- the per-context state of the CUDA backend (ctx->cuda).
 *
 * Created by ot_cuda_context_init, freed by ot_cuda_context_release. Kernels read the
 * device facts they dispatch on from here instead of querying the runtime per call
 * (cudaGetDeviceProperties costs tens of microseconds). Handles and workspaces that
 * belong to one context (the cuBLASLt handle and its workspace, scratch for split-K /
 * split-KV partials) hang off this struct and are created lazily by the first op that
 * needs them, under the context's single-thread rule (a context is used by one host
 * thread at a time; see ot_context_create in the public header).
 */
#ifndef OT_CUDA_STATE_H
#define OT_CUDA_STATE_H

#include <stddef.h>

#include "../core/internal.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct ot_cuda_state {
  int device;            /* CUDA ordinal */
  int cc_major, cc_minor;
  int sm_count;
  size_t smem_optin;     /* max dynamic shared memory per block after opt-in, bytes */
  size_t l2_bytes;
  /* cuBLASLt: created on first use (cublasLtHandle_t), with its workspace. */
  void *cublaslt;
  void *cublaslt_workspace;
  size_t cublaslt_workspace_bytes;
  /* Scratch device memory for ops' temporaries (partials, split-KV results): grown on
   * demand by ot_cuda_scratch, freed with the context. Stream-ordered use only. */
  void *scratch;
  size_t scratch_bytes;
  /* cudaEvent_t (timing off), created by the first stream switch that needs it: the
   * scratch and the cuBLASLt workspace are shared by every stream the context is given,
   * so ot_context_set_stream orders the new stream after the old one's enqueued work. */
  void *switch_event;
} ot_cuda_state;

static inline ot_cuda_state *ot_cuda_state_of(const ot_context *ctx) {
  return (ot_cuda_state *)ctx->cuda;
}

/* At least `bytes` of device scratch for this context (256-byte aligned), valid until the
 * next call on the same context; growing synchronizes the context's stream first so that
 * no kernel still reads the old buffer. Returns NULL after recording the error. */
void *ot_cuda_scratch(ot_context *ctx, size_t bytes, const char *op);

#ifdef __cplusplus
}
#endif

#endif /* OT_CUDA_STATE_H */
