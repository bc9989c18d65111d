/* arena.cu -- CUDA side of the arena and the KV pool: the device reservation, its
 * release, device-to-device copies on the context's stream, device synchronization.
 * The bookkeeping is host code in src/core/arena.c and src/core/kv_cache.c. */
#include <cuda_runtime.h>

#include "../core/arena.h"
#include "../core/backend.h"

/* The calling thread's current device is the caller's (torch's, in Python): the
 * functions below that need another device switch to it and back. */
static int switch_device(int device_id) {
  int prev = -1;
  if (cudaGetDevice(&prev) == cudaSuccess && prev != device_id) (void)cudaSetDevice(device_id);
  return prev;
}

static void restore_device(int prev, int device_id) {
  if (prev >= 0 && prev != device_id) (void)cudaSetDevice(prev);
}

extern "C" ot_status ot_cuda_reserve(const char *op, int device_id, size_t bytes, void **ptr) {
  int prev = -1;
  cudaError_t e = cudaGetDevice(&prev);
  if (e == cudaSuccess && prev != device_id) e = cudaSetDevice(device_id);
  if (e != cudaSuccess)
    return ot_error(OT_ERR_BACKEND, op, "cudaSetDevice(%d): %s", device_id, cudaGetErrorString(e));
  void *p = NULL;
  e = cudaMalloc(&p, bytes);
  if (e != cudaSuccess) {
    (void)cudaGetLastError();
    size_t free_b = 0, total_b = 0;
    (void)cudaMemGetInfo(&free_b, &total_b);
    restore_device(prev, device_id);
    return ot_error(e == cudaErrorMemoryAllocation ? OT_ERR_OOM : OT_ERR_BACKEND, op,
                    "cudaMalloc(%zu bytes) on device %d: %s (%zu of %zu bytes free)", bytes,
                    device_id, cudaGetErrorString(e), free_b, total_b);
  }
  restore_device(prev, device_id);
  *ptr = p;
  return OT_OK;
}

extern "C" void ot_cuda_release(int device_id, void *ptr) {
  int prev = switch_device(device_id);
  (void)cudaFree(ptr);
  restore_device(prev, device_id);
}

extern "C" ot_status ot_cuda_copy(const char *op, ot_context *ctx, void *dst, const void *src,
                                  size_t bytes) {
  if (bytes == 0) return OT_OK;
  cudaError_t e = cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice,
                                  (cudaStream_t)ctx->stream);
  if (e != cudaSuccess)
    return ot_error(OT_ERR_BACKEND, op, "cudaMemcpyAsync(%zu bytes): %s", bytes,
                    cudaGetErrorString(e));
  return OT_OK;
}

extern "C" ot_status ot_cuda_synchronize(const char *op, int device_id) {
  int prev = -1;
  cudaError_t e = cudaGetDevice(&prev);
  if (e == cudaSuccess && prev != device_id) e = cudaSetDevice(device_id);
  if (e == cudaSuccess) e = cudaDeviceSynchronize();
  restore_device(prev, device_id);
  if (e != cudaSuccess)
    return ot_error(OT_ERR_BACKEND, op, "cudaDeviceSynchronize on device %d: %s", device_id,
                    cudaGetErrorString(e));
  return OT_OK;
}

/* Cross-stream reuse of arena blocks: `waiter` waits for everything enqueued on `producer`
 * so far (which includes every use of the blocks freed there), host not blocked. An event
 * per wait, destroyed at once (CUDA releases it when the wait no longer needs it).
 * Refused while either stream captures a graph: an event recorded outside the capture
 * cannot order it. */
extern "C" ot_status ot_cuda_stream_wait(const char *op, int device_id, void *waiter,
                                         void *producer) {
  int prev = switch_device(device_id);
  cudaStream_t w = (cudaStream_t)waiter, p = (cudaStream_t)producer;
  cudaError_t e = cudaSuccess;
  for (cudaStream_t s : {w, p}) {
    cudaStreamCaptureStatus cs = cudaStreamCaptureStatusNone;
    if (e == cudaSuccess) e = cudaStreamIsCapturing(s, &cs);
    if (e == cudaSuccess && cs != cudaStreamCaptureStatusNone) e = cudaErrorStreamCaptureUnsupported;
  }
  cudaEvent_t ev = nullptr;
  if (e == cudaSuccess) e = cudaEventCreateWithFlags(&ev, cudaEventDisableTiming);
  if (e == cudaSuccess) e = cudaEventRecord(ev, p);
  if (e == cudaSuccess) e = cudaStreamWaitEvent(w, ev, 0);
  if (ev) (void)cudaEventDestroy(ev);
  restore_device(prev, device_id);
  if (e != cudaSuccess) {
    (void)cudaGetLastError();
    return ot_error(OT_ERR_BACKEND, op, "ordering stream %p after stream %p for arena reuse: %s",
                    waiter, producer, cudaGetErrorString(e));
  }
  return OT_OK;
}
