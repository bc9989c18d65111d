/* device.c -- the memory operations of the engine that are not ops: allocation, host <->
 * device copies, 2-D copies (K/V append) and row gathers (embedding lookup).
 * CPU: plain memory. CUDA (built when the library has the CUDA backend): the runtime API on
 * the engine's stream. Allocation happens at load and when the activations grow, never per
 * step; uploads and downloads synchronize the stream (their host buffers are reused). */
#include <stdlib.h>
#include <string.h>

#include "internal.h"

#ifdef OT_HAVE_CUDA
#include <cuda_runtime_api.h>

static ot_status cuda_check(cudaError_t err, const char *what) {
  if (err == cudaSuccess) return OT_OK;
  return ote_error(err == cudaErrorMemoryAllocation ? OT_ERR_OOM : OT_ERR_BACKEND,
                   "engine: %s: %s", what, cudaGetErrorString(err));
}
#define STREAM(d) ((cudaStream_t)(d)->stream)
#else
static ot_status no_cuda(const char *what) {
  return ote_error(OT_ERR_NO_DEVICE, "engine: %s: built without the CUDA backend", what);
}
#endif

static int on_cpu(const ote_device *d) { return d->dev.device_type == kDLCPU; }

ot_status ote_dev_alloc(const ote_device *d, size_t bytes, void **out) {
  *out = NULL;
  size_t sz = (bytes + 255) / 256 * 256;
  if (sz == 0) sz = 256;
  if (on_cpu(d)) {
    void *p = aligned_alloc(64, sz);
    if (!p) return ote_error(OT_ERR_OOM, "engine: cannot allocate %zu bytes of host memory", bytes);
    *out = p;
    return OT_OK;
  }
#ifdef OT_HAVE_CUDA
  OTE_TRY(cuda_check(cudaSetDevice(d->dev.device_id), "cudaSetDevice"));
  return cuda_check(cudaMalloc(out, sz), "cudaMalloc");
#else
  return no_cuda("alloc");
#endif
}

void ote_dev_free(const ote_device *d, void *p) {
  if (!p) return;
  if (on_cpu(d)) {
    free(p);
    return;
  }
#ifdef OT_HAVE_CUDA
  cudaFree(p);
#endif
}

ot_status ote_dev_upload(const ote_device *d, void *dst, const void *src, size_t bytes) {
  if (!bytes) return OT_OK;
  if (on_cpu(d)) {
    if (dst != src) memcpy(dst, src, bytes);
    return OT_OK;
  }
#ifdef OT_HAVE_CUDA
  OTE_TRY(cuda_check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, STREAM(d)),
                     "upload"));
  return cuda_check(cudaStreamSynchronize(STREAM(d)), "upload");
#else
  return no_cuda("upload");
#endif
}

ot_status ote_dev_download(const ote_device *d, void *dst, const void *src, size_t bytes) {
  if (!bytes) return OT_OK;
  if (on_cpu(d)) {
    if (dst != src) memcpy(dst, src, bytes);
    return OT_OK;
  }
#ifdef OT_HAVE_CUDA
  OTE_TRY(cuda_check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, STREAM(d)),
                     "download"));
  return cuda_check(cudaStreamSynchronize(STREAM(d)), "download");
#else
  return no_cuda("download");
#endif
}

ot_status ote_dev_copy_2d(const ote_device *d, void *dst, size_t dpitch, const void *src,
                          size_t spitch, size_t width, size_t rows) {
  if (!rows || !width) return OT_OK;
  if (on_cpu(d)) {
    for (size_t r = 0; r < rows; r++)
      memcpy((char *)dst + r * dpitch, (const char *)src + r * spitch, width);
    return OT_OK;
  }
#ifdef OT_HAVE_CUDA
  return cuda_check(cudaMemcpy2DAsync(dst, dpitch, src, spitch, width, rows,
                                      cudaMemcpyDeviceToDevice, STREAM(d)),
                    "copy_2d");
#else
  return no_cuda("copy_2d");
#endif
}

ot_status ote_dev_gather_rows(const ote_device *d, void *dst, const void *table,
                              const int32_t *ids, int n, size_t row_bytes) {
  for (int i = 0; i < n; i++) {
    char *to = (char *)dst + (size_t)i * row_bytes;
    const char *from = (const char *)table + (size_t)ids[i] * row_bytes;
    if (on_cpu(d)) {
      memcpy(to, from, row_bytes);
      continue;
    }
#ifdef OT_HAVE_CUDA
    /* one copy per token (an embedding-gather kernel would take the ids on the device) */
    OTE_TRY(cuda_check(cudaMemcpyAsync(to, from, row_bytes, cudaMemcpyDeviceToDevice, STREAM(d)),
                       "gather_rows"));
#else
    return no_cuda("gather_rows");
#endif
  }
  return OT_OK;
}

ot_status ote_dev_sync(const ote_device *d) {
  if (on_cpu(d)) return OT_OK;
#ifdef OT_HAVE_CUDA
  return cuda_check(cudaStreamSynchronize(STREAM(d)), "sync");
#else
  return no_cuda("sync");
#endif
}
