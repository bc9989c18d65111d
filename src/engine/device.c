/* device.c -- the memory operations of the engine that are not ops: allocation, host <->
 * device copies, 2-D copies (K/V append) and row gathers (embedding lookup).
 * The CPU path is plain memory; the CUDA path (cudaMallocAsync / cudaMemcpy2DAsync on the
 * context's stream) slots in here when the engine runs on a CUDA context. */
#include <stdlib.h>
#include <string.h>

#include "internal.h"

static ot_status no_cuda(const char *what) {
  return ote_error(OT_ERR_UNSUPPORTED, "engine: %s: the engine's CUDA memory path is not built yet",
                   what);
}

ot_status ote_dev_alloc(const ote_device *d, size_t bytes, void **out) {
  *out = NULL;
  if (d->dev.device_type != kDLCPU) return no_cuda("alloc");
  size_t sz = (bytes + 63) / 64 * 64;
  if (sz == 0) sz = 64;
  void *p = aligned_alloc(64, sz);
  if (!p) return ote_error(OT_ERR_OOM, "engine: cannot allocate %zu bytes of host memory", bytes);
  *out = p;
  return OT_OK;
}

void ote_dev_free(const ote_device *d, void *p) {
  if (d->dev.device_type == kDLCPU) free(p);
}

ot_status ote_dev_upload(const ote_device *d, void *dst, const void *src, size_t bytes) {
  if (d->dev.device_type != kDLCPU) return no_cuda("upload");
  if (dst != src && bytes) memcpy(dst, src, bytes);
  return OT_OK;
}

ot_status ote_dev_download(const ote_device *d, void *dst, const void *src, size_t bytes) {
  if (d->dev.device_type != kDLCPU) return no_cuda("download");
  if (dst != src && bytes) memcpy(dst, src, bytes);
  return OT_OK;
}

ot_status ote_dev_copy_2d(const ote_device *d, void *dst, size_t dpitch, const void *src,
                          size_t spitch, size_t width, size_t rows) {
  if (d->dev.device_type != kDLCPU) return no_cuda("copy_2d");
  for (size_t r = 0; r < rows; r++)
    memcpy((char *)dst + r * dpitch, (const char *)src + r * spitch, width);
  return OT_OK;
}

ot_status ote_dev_gather_rows(const ote_device *d, void *dst, const void *table,
                              const int32_t *ids, int n, size_t row_bytes) {
  if (d->dev.device_type != kDLCPU) return no_cuda("gather_rows");
  for (int i = 0; i < n; i++)
    memcpy((char *)dst + (size_t)i * row_bytes, (const char *)table + (size_t)ids[i] * row_bytes,
           row_bytes);
  return OT_OK;
}

ot_status ote_dev_sync(const ote_device *d) {
  if (d->dev.device_type != kDLCPU) return no_cuda("sync");
  return OT_OK;
}
