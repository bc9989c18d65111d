/* arena.cu -- CUDA side of the arena and the KV pool: the device reservation, its
 * release, device-to-device copies on the context's stream, device synchronization.
 * The bookkeeping is host code in src/core/arena.c and src/core/kv_cache.c. */
#include <cuda_runtime.h>

#include "../core/arena.h"
#include "../core/backend.h"

extern "C" ot_status ot_cuda_reserve(const char *op, int device_id, size_t bytes, void **ptr) {
  cudaError_t e = cudaSetDevice(device_id);
  if (e != cudaSuccess)
    return ot_error(OT_ERR_BACKEND, op, "cudaSetDevice(%d): %s", device_id, cudaGetErrorString(e));
  void *p = NULL;
  e = cudaMalloc(&p, bytes);
  if (e != cudaSuccess) {
    (void)cudaGetLastError();
    size_t free_b = 0, total_b = 0;
    (void)cudaMemGetInfo(&free_b, &total_b);
    return ot_error(e == cudaErrorMemoryAllocation ? OT_ERR_OOM : OT_ERR_BACKEND, op,
                    "cudaMalloc(%zu bytes) on device %d: %s (%zu of %zu bytes free)", bytes,
                    device_id, cudaGetErrorString(e), free_b, total_b);
  }
  *ptr = p;
  return OT_OK;
}

extern "C" void ot_cuda_release(int device_id, void *ptr) {
  int prev = 0;
  if (cudaGetDevice(&prev) == cudaSuccess && prev != device_id) (void)cudaSetDevice(device_id);
  (void)cudaFree(ptr);
  if (prev != device_id) (void)cudaSetDevice(prev);
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
  cudaError_t e = cudaSetDevice(device_id);
  if (e == cudaSuccess) e = cudaDeviceSynchronize();
  if (e != cudaSuccess)
    return ot_error(OT_ERR_BACKEND, op, "cudaDeviceSynchronize on device %d: %s", device_id,
                    cudaGetErrorString(e));
  return OT_OK;
}
