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

#include <stdbool.h>
#include <stddef.h>

#include "../core/internal.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Arena temporaries one op may hold at once (ot_cuda_scratch / ot_cuda_temp_alloc calls). */
#define OT_CUDA_MAX_TEMPS 8
/* The cuBLASLt workspace's size: src/cuda/linear.cu passes kLtWorkspaceBytes to cuBLASLt,
 * which must not exceed this (the block an arena gives it; checked there). */
#define OT_CUDA_LT_WORKSPACE_BYTES ((size_t)32 << 20)

typedef struct ot_cuda_state {
  int device;            /* CUDA ordinal */
  int cc_major, cc_minor;
  int sm_count;
  size_t smem_optin;     /* max dynamic shared memory per block after opt-in, bytes */
  size_t smem_per_sm;    /* shared memory per multiprocessor, bytes (all its blocks) */
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
  /* ot_context_set_arena: while set, temporaries come from this arena instead of the
   * buffers above. `temps` are the blocks taken by the op now running (on `temps_stream`),
   * given back by ot_cuda_op_end; `kept` are blocks of ops enqueued while the stream
   * captured a CUDA graph (the graph may replay them), given back at detach / destroy;
   * one that cannot be recorded there (host OOM) stays allocated until the arena is
   * destroyed. The cuBLASLt workspace is one block of the arena held while it is set. */
  ot_arena *arena;
  void *temps[OT_CUDA_MAX_TEMPS];
  int ntemps;
  const char *temps_op; /* the op that took them, for messages */
  void *arena_scratch; /* the op's ot_cuda_scratch block (one of temps) and its size */
  size_t arena_scratch_bytes;
  void *temps_stream;
  void **kept;
  int nkept, kept_cap;
  bool lt_workspace_from_arena;
  /* ot_cuda_op_begin / ot_cuda_op_end: ops run with the context's device current; the
   * caller's (when it was another) is restored when the outermost op returns. */
  int op_depth;
  int caller_device; /* -1: nothing to restore */
  /* ot_cuda_tile_counter's int and ot_cuda_split_counters' (OT_CUDA_COUNTERS ints of
   * cudaMalloc, the context's own: not from its arena, since they must keep their values
   * from one launch to the next): [0] the tile counter, from [32] the split counters. */
  int *tile_ctr;
} ot_cuda_state;

static inline ot_cuda_state *ot_cuda_state_of(const ot_context *ctx) {
  return (ot_cuda_state *)ctx->cuda;
}

/* At least `bytes` of device scratch for this context (256-byte aligned), valid until the
 * next call on the same context; growing synchronizes the context's stream first so that
 * no kernel still reads the old buffer. With an arena (ot_context_set_arena): a block of
 * the arena taken on the context's stream, valid until the op returns (ot_cuda_op_end
 * gives it back, stream-ordered; later calls of the same op get other blocks). Returns
 * NULL after recording the error (OT_ERR_OOM naming op, size and the largest free block). */
void *ot_cuda_scratch(ot_context *ctx, size_t bytes, const char *op);
/* The same for an op that has a fallback when the scratch cannot be had: OT_OK with *ptr
 * NULL and no message recorded (ot_last_error() left alone) when the memory is not there
 * (no device memory, or no arena block that fits); any other failure (a stream that
 * fails to synchronize, ...) is recorded and returned as with ot_cuda_scratch. */
ot_status ot_cuda_scratch_try(ot_context *ctx, size_t bytes, const char *op, void **ptr);

/* A temporary of `bytes` for the running op, used on the context's stream: from the
 * context's arena when it has one (`what` names it in the OOM message), else
 * cudaMallocAsync on the stream. Give it back with ot_cuda_temp_free (stream-ordered;
 * with an arena also done by ot_cuda_op_end if the op returns first). */
ot_status ot_cuda_temp_alloc(ot_context *ctx, size_t bytes, const char *op, const char *what,
                             void **ptr);
ot_status ot_cuda_temp_free(ot_context *ctx, void *ptr, const char *op);

/* A device int that is zero between the kernels of this context's stream that use it (a
 * dynamic tile scheduler's claim counter: each launch leaves it at zero, see
 * src/cuda/sm90/attention_fwd_sm90.cu), allocated and zeroed (stream-ordered) on the first
 * call. NULL, with nothing recorded, where it cannot be had -- no device memory, or not
 * allocated yet while the stream captures a graph: the caller then schedules statically. */
int *ot_cuda_tile_counter(ot_context *ctx);
/* n device ints, zero between the kernels of this context's stream that use them (kernels
 * that leave them at zero: the Hopper forward's tail split), from the same allocation;
 * NULL where it cannot be had (as above) or n > OT_CUDA_COUNTERS - 32. */
int *ot_cuda_split_counters(ot_context *ctx, int n);
#define OT_CUDA_COUNTERS 1024

#ifdef __cplusplus
}
#endif

#endif /* OT_CUDA_STATE_H */
