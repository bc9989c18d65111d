/* context.cu -- CUDA backend: device checks and per-context state. */
#include <cublasLt.h>
#include <cuda_runtime.h>

#include <stdlib.h>

#include "../core/arena.h"
#include "../core/backend.h"
#include "cuda_state.h"

static ot_status context_init_on_device(ot_context *ctx);

/* The calling thread's current device is the caller's (torch's, in Python): it is made
 * ctx's device for the initialization (cudaSetDevice creates the device's primary context)
 * and restored after, as src/cuda/arena.cu does. Ops enqueue on the current device, which
 * the caller makes ctx's (see ot_context_create in the public header). */
extern "C" ot_status ot_cuda_context_init(ot_context *ctx) {
  int prev = -1;
  if (cudaGetDevice(&prev) != cudaSuccess) {
    (void)cudaGetLastError();
    prev = -1;
  }
  const ot_status st = context_init_on_device(ctx);
  if (prev >= 0 && prev != ctx->device.device_id) (void)cudaSetDevice(prev);
  return st;
}

static ot_status context_init_on_device(ot_context *ctx) {
  static const char *op = "ot_context_create";
  int count = 0;
  cudaError_t e = cudaGetDeviceCount(&count);
  if (e != cudaSuccess || count == 0) {
    (void)cudaGetLastError();
    return ot_error(OT_ERR_NO_DEVICE, op, "options.device_type: kDLCUDA requested but no CUDA "
                    "device is available (%s)", e != cudaSuccess ? cudaGetErrorString(e) : "0 devices");
  }
  if (ctx->device.device_id < 0 || ctx->device.device_id >= count)
    return ot_error(OT_ERR_NO_DEVICE, op, "options.device_id: %d, but only %d CUDA device(s) exist",
                    ctx->device.device_id, count);
  e = cudaSetDevice(ctx->device.device_id);
  if (e != cudaSuccess)
    return ot_error(OT_ERR_BACKEND, op, "cudaSetDevice(%d): %s", ctx->device.device_id,
                    cudaGetErrorString(e));
  ot_cuda_state *st = (ot_cuda_state *)calloc(1, sizeof *st);
  if (!st) return ot_error(OT_ERR_OOM, op, "allocating the CUDA context state (%zu bytes)", sizeof *st);
  st->device = ctx->device.device_id;
  int v = 0;
  if ((e = cudaDeviceGetAttribute(&st->cc_major, cudaDevAttrComputeCapabilityMajor, st->device)) != cudaSuccess ||
      (e = cudaDeviceGetAttribute(&st->cc_minor, cudaDevAttrComputeCapabilityMinor, st->device)) != cudaSuccess ||
      (e = cudaDeviceGetAttribute(&st->sm_count, cudaDevAttrMultiProcessorCount, st->device)) != cudaSuccess ||
      (e = cudaDeviceGetAttribute(&v, cudaDevAttrMaxSharedMemoryPerBlockOptin, st->device)) != cudaSuccess) {
    free(st);
    return ot_error(OT_ERR_BACKEND, op, "cudaDeviceGetAttribute: %s", cudaGetErrorString(e));
  }
  st->smem_optin = (size_t)v;
  /* what the norms' ring kernels size their rings by (100 KB when not reported) */
  st->smem_per_sm = 100 * 1024;
  if (cudaDeviceGetAttribute(&v, cudaDevAttrMaxSharedMemoryPerMultiprocessor, st->device) == cudaSuccess &&
      v > 0)
    st->smem_per_sm = (size_t)v;
  if (cudaDeviceGetAttribute(&v, cudaDevAttrL2CacheSize, st->device) == cudaSuccess)
    st->l2_bytes = (size_t)v;
  ctx->cuda = st;
  return OT_OK;
}

/* ---- temporaries from the context's arena ------------------------------------------ */

/* A block for the running op on the context's stream, remembered for ot_cuda_op_end.
 * quiet: a block that does not fit is OT_ERR_OOM with no message recorded. */
static ot_status arena_take(ot_context *ctx, size_t bytes, const char *op, const char *what,
                            bool quiet, void **ptr) {
  ot_cuda_state *st = ot_cuda_state_of(ctx);
  if (st->ntemps == OT_CUDA_MAX_TEMPS)
    return ot_error(OT_ERR_INTERNAL, op, "%s: more than %d arena temporaries in one op", what,
                    OT_CUDA_MAX_TEMPS);
  if (st->ntemps > 0 && st->temps_stream != ctx->stream)
    return ot_error(OT_ERR_INTERNAL, op, "%s: the context's stream changed inside an op", what);
  void *p = NULL;
  OT_TRY(quiet ? ot_arena_try_alloc_for(op, what, st->arena, bytes, ctx->stream,
                                        OT_MEMORY_WORKSPACE, &p)
               : ot_arena_alloc_for(op, what, st->arena, bytes, ctx->stream,
                                    OT_MEMORY_WORKSPACE, &p));
  st->temps[st->ntemps++] = p;
  st->temps_stream = ctx->stream;
  st->temps_op = op;
  *ptr = p;
  return OT_OK;
}

/* Keep a block past its op (graph capture) until detach / destroy. */
static bool keep_block(ot_cuda_state *st, void *p) {
  if (st->nkept == st->kept_cap) {
    int cap = st->kept_cap ? 2 * st->kept_cap : 16;
    void **k = (void **)realloc(st->kept, (size_t)cap * sizeof *k);
    if (!k) return false;
    st->kept = k;
    st->kept_cap = cap;
  }
  st->kept[st->nkept++] = p;
  return true;
}

static bool stream_capturing(void *stream) {
  cudaStreamCaptureStatus cs = cudaStreamCaptureStatusNone;
  if (cudaStreamIsCapturing((cudaStream_t)stream, &cs) != cudaSuccess) {
    (void)cudaGetLastError();
    return true; /* unknown: keep the blocks (safe) */
  }
  return cs != cudaStreamCaptureStatusNone;
}

/* The error for a block a captured graph uses that keep_block could not record: it stays
 * live in the arena (leaked until the arena is destroyed), never free while the graph may
 * still write it at a replay. */
static ot_status kept_block_lost(const char *op, int nblocks) {
  return ot_error(OT_ERR_OOM, op, "out of host memory to record %d arena block(s) of a "
                  "captured CUDA graph: they stay allocated until the arena is destroyed",
                  nblocks);
}

/* The op's temporaries go back to the arena, ordered after the work the op enqueued on its
 * stream (a later request on the same stream reuses them at once; another stream first
 * waits for this one, see the arena's stream rules). While the stream captures a graph the
 * blocks stay with the context: the graph's kernels will write them again at each replay.
 * A block the context cannot record then is leaked (kept_block_lost), and the op's status,
 * if it was OK, becomes that OT_ERR_OOM. */
extern "C" void ot_cuda_op_begin(ot_context *ctx) {
  if (!ctx || !ctx->cuda) return;
  ot_cuda_state *st = ot_cuda_state_of(ctx);
  if (st->op_depth++ > 0) return; /* an op inside an op: the outer one set the device */
  st->caller_device = -1;
  int cur = -1;
  if (cudaGetDevice(&cur) != cudaSuccess) {
    (void)cudaGetLastError();
    cur = -1;
  }
  if (cur == st->device) return;
  if (cudaSetDevice(st->device) == cudaSuccess)
    st->caller_device = cur; /* -1 when unknown: nothing to restore */
  else
    (void)cudaGetLastError(); /* the op's own launch reports the failure */
}

static ot_status temps_end(ot_cuda_state *st, ot_status status);

extern "C" ot_status ot_cuda_op_end(ot_context *ctx, ot_status status) {
  if (!ctx || !ctx->cuda) return status;
  ot_cuda_state *st = ot_cuda_state_of(ctx);
  status = temps_end(st, status);
  if (st->op_depth > 0 && --st->op_depth == 0 && st->caller_device >= 0) {
    (void)cudaSetDevice(st->caller_device);
    st->caller_device = -1;
  }
  return status;
}

static ot_status temps_end(ot_cuda_state *st, ot_status status) {
  if (st->ntemps == 0) return status;
  const bool capturing = stream_capturing(st->temps_stream);
  int lost = 0;
  for (int i = 0; i < st->ntemps; i++) {
    if (!capturing) (void)ot_arena_free(st->arena, st->temps[i], st->temps_stream);
    else if (!keep_block(st, st->temps[i])) lost++;
  }
  st->ntemps = 0;
  st->arena_scratch = NULL;
  st->arena_scratch_bytes = 0;
  if (lost && status == OT_OK) return kept_block_lost(st->temps_op, lost);
  return status;
}

extern "C" ot_status ot_cuda_temp_alloc(ot_context *ctx, size_t bytes, const char *op,
                                        const char *what, void **ptr) {
  ot_cuda_state *st = ot_cuda_state_of(ctx);
  if (st->arena) return arena_take(ctx, bytes, op, what, false, ptr);
  void *p = NULL;
  cudaError_t e = cudaMallocAsync(&p, bytes, (cudaStream_t)ctx->stream);
  if (e != cudaSuccess) {
    (void)cudaGetLastError();
    return ot_error(OT_ERR_OOM, op, "%s: cudaMallocAsync of %zu bytes: %s", what, bytes,
                    cudaGetErrorString(e));
  }
  *ptr = p;
  return OT_OK;
}

extern "C" ot_status ot_cuda_temp_free(ot_context *ctx, void *ptr, const char *op) {
  ot_cuda_state *st = ot_cuda_state_of(ctx);
  if (!ptr) return OT_OK;
  if (st->arena) {
    for (int i = 0; i < st->ntemps; i++)
      if (st->temps[i] == ptr) {
        st->temps[i] = st->temps[--st->ntemps];
        if (!stream_capturing(ctx->stream)) return ot_arena_free(st->arena, ptr, ctx->stream);
        return keep_block(st, ptr) ? OT_OK : kept_block_lost(op, 1);
      }
    return ot_error(OT_ERR_INTERNAL, op, "ot_cuda_temp_free: %p is not a temporary of this op",
                    ptr);
  }
  cudaError_t e = cudaFreeAsync(ptr, (cudaStream_t)ctx->stream);
  if (e != cudaSuccess) {
    (void)cudaGetLastError();
    return ot_error(OT_ERR_BACKEND, op, "cudaFreeAsync: %s", cudaGetErrorString(e));
  }
  return OT_OK;
}

/* Gives every block the context holds of its arena back (kept graph blocks, the cuBLASLt
 * workspace), on the context's stream. */
static void arena_detach(ot_context *ctx) {
  ot_cuda_state *st = ot_cuda_state_of(ctx);
  if (!st->arena) return;
  for (int i = 0; i < st->nkept; i++) (void)ot_arena_free(st->arena, st->kept[i], ctx->stream);
  st->nkept = 0;
  if (st->lt_workspace_from_arena) {
    (void)ot_arena_free(st->arena, st->cublaslt_workspace, ctx->stream);
    st->cublaslt_workspace = NULL;
    st->cublaslt_workspace_bytes = 0;
    st->lt_workspace_from_arena = false;
  }
  st->arena = NULL;
}

/* Attach: the cuBLASLt workspace becomes a block of the new arena at once (so that a
 * too-small arena fails here, not in the middle of a model), taken before anything is
 * changed; the growable scratch and a cudaMalloc'd workspace are freed. Detach (NULL):
 * the blocks go back and the context's own buffers are created again when needed. */
extern "C" ot_status ot_cuda_context_set_arena(ot_context *ctx, ot_arena *arena) {
  static const char *op = "ot_context_set_arena";
  ot_cuda_state *st = ot_cuda_state_of(ctx);
  if (arena == st->arena) return OT_OK;
  void *ws = NULL;
  if (arena)
    OT_TRY(ot_arena_alloc_for(op, "arena: the cuBLASLt workspace", arena,
                              OT_CUDA_LT_WORKSPACE_BYTES, ctx->stream, OT_MEMORY_WORKSPACE, &ws));
  arena_detach(ctx);
  if (arena) {
    if (st->scratch || st->cublaslt_workspace) {
      /* cudaFree waits for the device anyway; be explicit about this stream's work. */
      (void)cudaStreamSynchronize((cudaStream_t)ctx->stream);
      if (st->scratch) cudaFree(st->scratch);
      if (st->cublaslt_workspace) cudaFree(st->cublaslt_workspace);
      st->scratch = NULL;
      st->scratch_bytes = 0;
    }
    st->cublaslt_workspace = ws;
    st->cublaslt_workspace_bytes = OT_CUDA_LT_WORKSPACE_BYTES;
    st->lt_workspace_from_arena = true;
    st->arena = arena;
  }
  return OT_OK;
}

/* ---- the context's own growable scratch --------------------------------------------- */

/* quiet: memory that cannot be had is OT_ERR_OOM with no message recorded (*ptr NULL);
 * any other failure is recorded. */
static ot_status scratch_get(ot_context *ctx, size_t bytes, const char *op, bool quiet,
                             void **ptr) {
  ot_cuda_state *st = ot_cuda_state_of(ctx);
  *ptr = NULL;
  if (st->arena) {
    /* One scratch block per op, as without an arena: reused while it is large enough,
     * else given back (ordered after the work already enqueued with it) for a larger one. */
    if (st->arena_scratch && bytes <= st->arena_scratch_bytes) {
      *ptr = st->arena_scratch;
      return OT_OK;
    }
    if (st->arena_scratch) {
      void *old = st->arena_scratch;
      st->arena_scratch = NULL;
      st->arena_scratch_bytes = 0;
      OT_TRY(ot_cuda_temp_free(ctx, old, op));
    }
    void *p = NULL;
    OT_TRY(arena_take(ctx, bytes ? bytes : 1, op, "scratch from the context's arena", quiet, &p));
    st->arena_scratch = p;
    st->arena_scratch_bytes = bytes;
    *ptr = p;
    return OT_OK;
  }
  if (bytes <= st->scratch_bytes) {
    *ptr = st->scratch;
    return OT_OK;
  }
  size_t want = st->scratch_bytes * 2 > bytes ? st->scratch_bytes * 2 : bytes;
  want = (want + 255) & ~(size_t)255;
  if (st->scratch) {
    cudaError_t e = cudaStreamSynchronize((cudaStream_t)ctx->stream);
    if (e != cudaSuccess) {
      (void)cudaGetLastError(); /* reported here, not again by a later op's launch check */
      return ot_error(OT_ERR_BACKEND, op, "cudaStreamSynchronize before growing scratch: %s",
                      cudaGetErrorString(e));
    }
    cudaFree(st->scratch);
    st->scratch = NULL;
    st->scratch_bytes = 0;
  }
  cudaError_t e = cudaMalloc(&st->scratch, want);
  if (e != cudaSuccess && want > bytes) {
    /* The doubled size does not fit: the size asked for may (a caller that falls back to
     * a kernel with less scratch on failure would otherwise take the slower path). */
    (void)cudaGetLastError();
    st->scratch = NULL;
    want = (bytes + 255) & ~(size_t)255;
    e = cudaMalloc(&st->scratch, want);
  }
  if (e != cudaSuccess) {
    (void)cudaGetLastError();
    st->scratch = NULL;
    if (quiet) return OT_ERR_OOM;
    return ot_error(OT_ERR_OOM, op, "device scratch of %zu bytes: %s", want,
                    cudaGetErrorString(e));
  }
  st->scratch_bytes = want;
  *ptr = st->scratch;
  return OT_OK;
}

extern "C" void *ot_cuda_scratch(ot_context *ctx, size_t bytes, const char *op) {
  void *p = NULL;
  return scratch_get(ctx, bytes, op, false, &p) == OT_OK ? p : NULL;
}

extern "C" ot_status ot_cuda_scratch_try(ot_context *ctx, size_t bytes, const char *op,
                                         void **ptr) {
  const ot_status s = scratch_get(ctx, bytes, op, true, ptr);
  return s == OT_ERR_OOM && !*ptr ? OT_OK : s;
}

/* The scratch and the cuBLASLt workspace belong to the context, not to a stream: an op
 * enqueued on the new stream must not reuse them while a kernel of the old stream still
 * does (the Python binding gives one context per device the caller's current stream at
 * every call). An event recorded on the old stream, waited on by the new one, orders
 * them; nothing is needed (and nothing costs) before the context has such buffers. */
extern "C" ot_status ot_cuda_context_set_stream(ot_context *ctx, void *stream) {
  static const char *op = "ot_context_set_stream";
  /* The same stream again (the Python binding sets the caller's current stream before
   * every op): its own order already covers the buffers, nothing to record or query. */
  if (stream == ctx->stream) return OT_OK;
  ot_cuda_state *st = ot_cuda_state_of(ctx);
  if (st && (st->scratch || st->cublaslt_workspace || st->tile_ctr)) {
    int prev = -1;
    if (cudaGetDevice(&prev) == cudaSuccess && prev != st->device) (void)cudaSetDevice(st->device);
    /* Not while either stream captures a graph (torch's CUDA graphs): an event recorded
     * outside the capture, or on the legacy stream during a global-mode capture, would
     * invalidate it. An unknown status counts as capturing (switch as before). */
    bool capturing = false;
    void *const ss[2] = {ctx->stream, stream};
    for (int i = 0; i < 2; i++) {
      cudaStreamCaptureStatus cs = cudaStreamCaptureStatusNone;
      if (cudaStreamIsCapturing((cudaStream_t)ss[i], &cs) != cudaSuccess) {
        (void)cudaGetLastError();
        capturing = true;
      } else if (cs != cudaStreamCaptureStatusNone) {
        capturing = true;
      }
    }
    cudaError_t e = cudaSuccess;
    if (!capturing && !st->switch_event) {
      cudaEvent_t ev;
      e = cudaEventCreateWithFlags(&ev, cudaEventDisableTiming);
      if (e == cudaSuccess) st->switch_event = ev;
    }
    if (!capturing && e == cudaSuccess)
      e = cudaEventRecord((cudaEvent_t)st->switch_event, (cudaStream_t)ctx->stream);
    if (!capturing && e == cudaSuccess)
      e = cudaStreamWaitEvent((cudaStream_t)stream, (cudaEvent_t)st->switch_event, 0);
    if (prev >= 0 && prev != st->device) (void)cudaSetDevice(prev);
    if (e != cudaSuccess) {
      (void)cudaGetLastError();
      return ot_error(OT_ERR_BACKEND, op, "ordering stream %p after the previous stream %p: %s "
                      "(the context keeps the previous stream)", stream, ctx->stream,
                      cudaGetErrorString(e));
    }
  }
  ctx->stream = stream;
  return OT_OK;
}

extern "C" int *ot_cuda_tile_counter(ot_context *ctx) {
  ot_cuda_state *st = ot_cuda_state_of(ctx);
  if (st->tile_ctr) return st->tile_ctr;
  cudaStreamCaptureStatus cs = cudaStreamCaptureStatusNone;
  if (cudaStreamIsCapturing((cudaStream_t)ctx->stream, &cs) != cudaSuccess ||
      cs != cudaStreamCaptureStatusNone) {
    (void)cudaGetLastError();
    return NULL;
  }
  void *p = NULL;
  if (cudaMalloc(&p, OT_CUDA_COUNTERS * sizeof(int)) != cudaSuccess) {
    (void)cudaGetLastError();
    return NULL;
  }
  if (cudaMemsetAsync(p, 0, OT_CUDA_COUNTERS * sizeof(int), (cudaStream_t)ctx->stream) !=
      cudaSuccess) {
    (void)cudaGetLastError();
    cudaFree(p);
    return NULL;
  }
  st->tile_ctr = (int *)p;
  return st->tile_ctr;
}

extern "C" int *ot_cuda_split_counters(ot_context *ctx, int n) {
  if (n <= 0 || n > OT_CUDA_COUNTERS - 32) return NULL;
  int *c = ot_cuda_tile_counter(ctx);
  return c ? c + 32 : NULL;
}

extern "C" void ot_cuda_context_release(ot_context *ctx) {
  ot_cuda_state *st = ot_cuda_state_of(ctx);
  if (!st) return;
  arena_detach(ctx); /* before the arena is gone: the caller destroys it after the context */
  free(st->kept);
  if (st->scratch || st->cublaslt_workspace || st->tile_ctr)
    cudaStreamSynchronize((cudaStream_t)ctx->stream);
  if (st->scratch) cudaFree(st->scratch);
  if (st->tile_ctr) cudaFree(st->tile_ctr);
  if (st->cublaslt_workspace) cudaFree(st->cublaslt_workspace);
  if (st->cublaslt) cublasLtDestroy((cublasLtHandle_t)st->cublaslt);
  if (st->switch_event) cudaEventDestroy((cudaEvent_t)st->switch_event);
  free(st);
  ctx->cuda = NULL;
}
