/* context.cu -- CUDA backend: device checks and per-context state. */
#include <cublasLt.h>
#include <cuda_runtime.h>

#include <stdlib.h>

#include "../core/backend.h"
#include "cuda_state.h"

extern "C" ot_status ot_cuda_context_init(ot_context *ctx) {
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
  if (cudaDeviceGetAttribute(&v, cudaDevAttrL2CacheSize, st->device) == cudaSuccess)
    st->l2_bytes = (size_t)v;
  ctx->cuda = st;
  return OT_OK;
}

extern "C" void *ot_cuda_scratch(ot_context *ctx, size_t bytes, const char *op) {
  ot_cuda_state *st = ot_cuda_state_of(ctx);
  if (bytes <= st->scratch_bytes) return st->scratch;
  size_t want = st->scratch_bytes * 2 > bytes ? st->scratch_bytes * 2 : bytes;
  want = (want + 255) & ~(size_t)255;
  if (st->scratch) {
    cudaError_t e = cudaStreamSynchronize((cudaStream_t)ctx->stream);
    if (e != cudaSuccess) {
      ot_error(OT_ERR_BACKEND, op, "cudaStreamSynchronize before growing scratch: %s", cudaGetErrorString(e));
      return NULL;
    }
    cudaFree(st->scratch);
    st->scratch = NULL;
    st->scratch_bytes = 0;
  }
  cudaError_t e = cudaMalloc(&st->scratch, want);
  if (e != cudaSuccess) {
    (void)cudaGetLastError();
    st->scratch = NULL;
    ot_error(OT_ERR_OOM, op, "device scratch of %zu bytes: %s", want, cudaGetErrorString(e));
    return NULL;
  }
  st->scratch_bytes = want;
  return st->scratch;
}

/* The scratch and the cuBLASLt workspace belong to the context, not to a stream: an op
 * enqueued on the new stream must not reuse them while a kernel of the old stream still
 * does (the Python binding gives one context per device the caller's current stream at
 * every call). An event recorded on the old stream, waited on by the new one, orders
 * them; nothing is needed (and nothing costs) before the context has such buffers. */
extern "C" ot_status ot_cuda_context_set_stream(ot_context *ctx, void *stream) {
  static const char *op = "ot_context_set_stream";
  ot_cuda_state *st = ot_cuda_state_of(ctx);
  if (st && (st->scratch || st->cublaslt_workspace)) {
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

extern "C" void ot_cuda_context_release(ot_context *ctx) {
  ot_cuda_state *st = ot_cuda_state_of(ctx);
  if (!st) return;
  if (st->scratch || st->cublaslt_workspace) cudaStreamSynchronize((cudaStream_t)ctx->stream);
  if (st->scratch) cudaFree(st->scratch);
  if (st->cublaslt_workspace) cudaFree(st->cublaslt_workspace);
  if (st->cublaslt) cublasLtDestroy((cublasLtHandle_t)st->cublaslt);
  if (st->switch_event) cudaEventDestroy((cudaEvent_t)st->switch_event);
  free(st);
  ctx->cuda = NULL;
}
