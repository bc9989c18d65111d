/* device.c -- the memory operations of the engine that are not ops: allocation, host <->
 * device copies, 2-D copies, the embedding lookup and argmax kernels' launches, and graphs.
 * CPU: plain memory. CUDA (built when the library has the CUDA backend): the runtime API on
 * the engine's stream. Allocation happens at load and when the activations grow, never per
 * step; uploads and downloads synchronize the stream (their host buffers are reused). */
#include <stdlib.h>
#include <string.h>

#include "fused_kernels.h"
#include "internal.h"

#ifdef OT_HAVE_CUDA
#include <cuda_runtime_api.h>

static ot_status cuda_check(cudaError_t err, const char *what) {
  if (err == cudaSuccess) return OT_OK;
  return ote_error(err == cudaErrorMemoryAllocation ? OT_ERR_OOM : OT_ERR_BACKEND,
                   "engine: %s: %s", what, cudaGetErrorString(err));
}
#define STREAM(d) ((cudaStream_t)(d)->stream)
/* device_kernels.cu */
int ote_cuda_embed(void *dst, const void *table, const int32_t *ids, int n, size_t row_bytes,
                   void *stream);
int ote_cuda_argmax(int32_t *out, const void *logits, int dtype_code, int dtype_bits, int n,
                    int vocab, void *stream);
int ote_cuda_fill_random(void *dst, size_t n, int code, int bits, uint64_t seed,
                         uint64_t tensor_id, float a, float constant, void *stream);
int ote_cuda_spin(long long ns, void *stream);
/* fused_kernels.cu */
int ote_cuda_fused_gemv(const ote_fused_gemv_args *a, int dtype_code, int swiglu, int pdl,
                        void *stream);
int ote_cuda_staged_gemv(const ote_fused_gemv_args *a, int dtype_code, int pdl, void *stream,
                         int *done);
int ote_cuda_rowblock_gemv(const ote_fused_gemv_args *a, int dtype_code, int pdl, void *stream,
                           int *done);
int ote_cuda_attn_oproj(const ote_attn_oproj_args *a, int dtype_code, void *stream, int *done);
size_t ote_cuda_attn_oproj_scratch(int hq, int hkv, int head_dim);
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
  /* cudaMemcpyDefault: either side may be pinned host memory (weight streaming) */
  return cuda_check(cudaMemcpy2DAsync(dst, dpitch, src, spitch, width, rows, cudaMemcpyDefault,
                                      STREAM(d)),
                    "copy_2d");
#else
  return no_cuda("copy_2d");
#endif
}

ot_status ote_dev_sync(const ote_device *d) {
  if (on_cpu(d)) return OT_OK;
#ifdef OT_HAVE_CUDA
  return cuda_check(cudaStreamSynchronize(STREAM(d)), "sync");
#else
  return no_cuda("sync");
#endif
}

ot_status ote_dev_upload_async(const ote_device *d, void *dst, const void *src, size_t bytes) {
  if (!bytes) return OT_OK;
  if (on_cpu(d)) {
    if (dst != src) memcpy(dst, src, bytes);
    return OT_OK;
  }
#ifdef OT_HAVE_CUDA
  return cuda_check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, STREAM(d)), "upload");
#else
  return no_cuda("upload");
#endif
}

ot_status ote_dev_download_async(const ote_device *d, void *dst, const void *src, size_t bytes) {
  if (!bytes) return OT_OK;
  if (on_cpu(d)) {
    if (dst != src) memcpy(dst, src, bytes);
    return OT_OK;
  }
#ifdef OT_HAVE_CUDA
  return cuda_check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, STREAM(d)),
                    "download");
#else
  return no_cuda("download");
#endif
}

ot_status ote_dev_host_alloc(const ote_device *d, size_t bytes, void **out) {
  if (on_cpu(d)) return ote_dev_alloc(d, bytes, out); /* the device is the host */
  *out = NULL;
#ifdef OT_HAVE_CUDA
  return cuda_check(cudaHostAlloc(out, bytes ? (bytes + 255) / 256 * 256 : 256,
                                  cudaHostAllocPortable),
                    "cudaHostAlloc");
#else
  return no_cuda("host alloc");
#endif
}

void ote_dev_host_free(const ote_device *d, void *p) {
  if (on_cpu(d)) {
    ote_dev_free(d, p);
    return;
  }
#ifdef OT_HAVE_CUDA
  if (p) cudaFreeHost(p);
#endif
}

ot_status ote_dev_stream_create(ote_device *d) {
  d->stream = NULL;
  if (on_cpu(d)) return OT_OK;
#ifdef OT_HAVE_CUDA
  OTE_TRY(cuda_check(cudaSetDevice(d->dev.device_id), "cudaSetDevice"));
  cudaStream_t s;
  OTE_TRY(cuda_check(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "cudaStreamCreate"));
  d->stream = s;
  return OT_OK;
#else
  return no_cuda("stream");
#endif
}

void ote_dev_stream_destroy(ote_device *d) {
#ifdef OT_HAVE_CUDA
  if (d->stream) {
    cudaStreamSynchronize(STREAM(d));
    cudaStreamDestroy(STREAM(d));
  }
#endif
  d->stream = NULL;
}

ot_status ote_dev_embed(const ote_device *d, void *dst, const void *table, const int32_t *ids,
                        int n, size_t row_bytes) {
  if (n <= 0) return OT_OK;
  if (on_cpu(d)) {
    for (int i = 0; i < n; i++)
      memcpy((char *)dst + (size_t)i * row_bytes, (const char *)table + (size_t)ids[i] * row_bytes,
             row_bytes);
    return OT_OK;
  }
#ifdef OT_HAVE_CUDA
  return cuda_check((cudaError_t)ote_cuda_embed(dst, table, ids, n, row_bytes, d->stream),
                    "embedding gather");
#else
  return no_cuda("embed");
#endif
}

ot_status ote_dev_argmax(const ote_device *d, int32_t *out, const void *logits, DLDataType dt,
                         int n, int vocab) {
  if (on_cpu(d)) return ote_error(OT_ERR_INTERNAL, "engine: device argmax on the CPU");
#ifdef OT_HAVE_CUDA
  return cuda_check(
      (cudaError_t)ote_cuda_argmax(out, logits, dt.code, dt.bits, n, vocab, d->stream), "argmax");
#else
  (void)out, (void)logits, (void)dt, (void)n, (void)vocab;
  return no_cuda("argmax");
#endif
}

ot_status ote_dev_fused_gemv(const ote_device *d, const ote_fused_gemv_args *a, DLDataType dt,
                             int swiglu) {
  if (on_cpu(d) || dt.bits != 16)
    return ote_error(OT_ERR_INTERNAL, "engine: fused linear: CUDA bf16 / fp16 only");
#ifdef OT_HAVE_CUDA
  return cuda_check((cudaError_t)ote_cuda_fused_gemv(a, dt.code, swiglu, 1, d->stream),
                    swiglu ? "fused swiglu + linear" : "fused rmsnorm + linear");
#else
  (void)a, (void)swiglu;
  return no_cuda("fused linear");
#endif
}

#ifdef OT_HAVE_CUDA
typedef int (*ote_gemv_launcher)(const ote_fused_gemv_args *, int, int, void *, int *);
#endif

/* The engine's optional one-row kernels (staged o_proj; rowblock down_proj, qkv, gate_up):
 * 16-bit CUDA only; *done = 0 (and OT_OK) where the kernel declines, so the caller runs the
 * library's linear (or the fused kernel) instead. */
static ot_status optional_gemv(const ote_device *d, const ote_fused_gemv_args *a, DLDataType dt,
                               int *done, int which) {
  *done = 0;
  if (on_cpu(d) || dt.bits != 16) return OT_OK;
#ifdef OT_HAVE_CUDA
  const ote_gemv_launcher fn = which ? ote_cuda_rowblock_gemv : ote_cuda_staged_gemv;
  return cuda_check((cudaError_t)fn(a, dt.code, 1, d->stream, done),
                    which ? "rowblock linear" : "staged linear");
#else
  (void)a, (void)which;
  return OT_OK;
#endif
}

ot_status ote_dev_staged_gemv(const ote_device *d, const ote_fused_gemv_args *a, DLDataType dt,
                              int *done) {
  return optional_gemv(d, a, dt, done, 0);
}

ot_status ote_dev_rowblock_gemv(const ote_device *d, const ote_fused_gemv_args *a, DLDataType dt,
                                int *done) {
  return optional_gemv(d, a, dt, done, 1);
}

ot_status ote_dev_attn_oproj(const ote_device *d, const ote_attn_oproj_args *a, DLDataType dt,
                             int *done) {
  *done = 0;
  if (on_cpu(d) || dt.bits != 16) return OT_OK;
#ifdef OT_HAVE_CUDA
  return cuda_check((cudaError_t)ote_cuda_attn_oproj(a, dt.code, d->stream, done),
                    "attention + o_proj");
#else
  (void)a;
  return OT_OK;
#endif
}

size_t ote_dev_attn_oproj_scratch(const ote_device *d, int hq, int hkv, int head_dim) {
  if (on_cpu(d)) return 0;
#ifdef OT_HAVE_CUDA
  if (cudaSetDevice(d->dev.device_id) != cudaSuccess) {
    (void)cudaGetLastError();
    return 0;
  }
  return ote_cuda_attn_oproj_scratch(hq, hkv, head_dim);
#else
  (void)hq, (void)hkv, (void)head_dim;
  return 0;
#endif
}

ot_status ote_graph_begin(const ote_device *d) {
#ifdef OT_HAVE_CUDA
  return cuda_check(cudaStreamBeginCapture(STREAM(d), cudaStreamCaptureModeThreadLocal),
                    "cudaStreamBeginCapture");
#else
  (void)d;
  return no_cuda("graph");
#endif
}

ot_status ote_graph_end(const ote_device *d, void **exec) {
  *exec = NULL;
#ifdef OT_HAVE_CUDA
  cudaGraph_t g = NULL;
  cudaError_t err = cudaStreamEndCapture(STREAM(d), &g);
  if (err != cudaSuccess || !g) {
    (void)cudaGetLastError();
    if (g) cudaGraphDestroy(g);
    return cuda_check(err != cudaSuccess ? err : cudaErrorUnknown, "cudaStreamEndCapture");
  }
  cudaGraphExec_t x = NULL;
  err = cudaGraphInstantiateWithFlags(&x, g, 0);
  cudaGraphDestroy(g);
  if (err != cudaSuccess) {
    (void)cudaGetLastError();
    return cuda_check(err, "cudaGraphInstantiate");
  }
  *exec = x;
  return OT_OK;
#else
  (void)d;
  return no_cuda("graph");
#endif
}

ot_status ote_graph_launch(const ote_device *d, void *exec) {
#ifdef OT_HAVE_CUDA
  return cuda_check(cudaGraphLaunch((cudaGraphExec_t)exec, STREAM(d)), "cudaGraphLaunch");
#else
  (void)d, (void)exec;
  return no_cuda("graph");
#endif
}

void ote_graph_destroy(void *exec) {
#ifdef OT_HAVE_CUDA
  if (exec) cudaGraphExecDestroy((cudaGraphExec_t)exec);
#else
  (void)exec;
#endif
}

ot_status ote_dev_fill_random(const ote_device *d, void *dst, size_t n, DLDataType dt,
                              uint64_t seed, uint64_t tensor_id, float a, float constant) {
#ifdef OT_HAVE_CUDA
  if (!on_cpu(d))
    return cuda_check((cudaError_t)ote_cuda_fill_random(dst, n, dt.code, dt.bits, seed, tensor_id,
                                                        a, constant, d->stream),
                      "random weights");
#endif
  (void)dst, (void)n, (void)dt, (void)seed, (void)tensor_id, (void)a, (void)constant;
  return ote_error(OT_ERR_INTERNAL, "engine: device random fill on the CPU");
}

/* ---- profiling (engine.c, ote_engine_set_profile) ----------------------------------- */

ot_status ote_dev_event_create(const ote_device *d, void **ev) {
  *ev = NULL;
  if (on_cpu(d)) return OT_OK;
#ifdef OT_HAVE_CUDA
  cudaEvent_t e;
  OTE_TRY(cuda_check(cudaEventCreate(&e), "cudaEventCreate"));
  *ev = e;
  return OT_OK;
#else
  return no_cuda("event");
#endif
}

void ote_dev_event_destroy(void *ev) {
#ifdef OT_HAVE_CUDA
  if (ev) cudaEventDestroy((cudaEvent_t)ev);
#else
  (void)ev;
#endif
}

ot_status ote_dev_event_record(const ote_device *d, void *ev) {
  if (on_cpu(d) || !ev) return OT_OK;
#ifdef OT_HAVE_CUDA
  return cuda_check(cudaEventRecord((cudaEvent_t)ev, STREAM(d)), "cudaEventRecord");
#else
  return no_cuda("event");
#endif
}

float ote_dev_event_ms(void *a, void *b) {
#ifdef OT_HAVE_CUDA
  float ms = 0;
  if (a && b && cudaEventElapsedTime(&ms, (cudaEvent_t)a, (cudaEvent_t)b) == cudaSuccess) return ms;
  (void)cudaGetLastError();
#else
  (void)a, (void)b;
#endif
  return 0;
}

ot_status ote_dev_spin(const ote_device *d, long long ns) {
  if (on_cpu(d)) return OT_OK;
#ifdef OT_HAVE_CUDA
  return cuda_check((cudaError_t)ote_cuda_spin(ns, d->stream), "spin");
#else
  (void)ns;
  return no_cuda("spin");
#endif
}
