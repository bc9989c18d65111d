/*
 * decode_shim.c -- ctypes shim for bench/bench_decode.py: ot_paged_attention (the
 * public op: validation + the CUDA kernels) on raw device pointers of torch tensors, on
 * torch's current stream. Benchmark-only: shapes are trusted to be consistent.
 *   cc -O2 -shared -fPIC bench/decode_shim.c -Iinclude -I<dlpack> build/libops_transformer.a \
 *      -lcudart -lcublasLt -lopenblas -fopenmp -lm -lstdc++ -o libdecode_shim.so
 * dtype codes: 1 float32, 2 float16, 3 bfloat16.
 * shim_paged_last_plan: what the last call launched (ot_cuda_paged_last_plan, an internal
 * hook of src/cuda/paged_attention.cu): kernel (1 split, 2 stream, 3 simple), splits, CTAs
 * of the main kernel, flags (1 a programmatic dependent, 4 an early start, 8 TMA ring, 16
 * aligned-page instance, 32 8-warp CTAs; bench_decode.py's Shim.plan).
 * shim_paged_trace: the per-CTA %globaltimer stamps of a -DOT_PA_TRACE build
 * (ot_cuda_paged_trace; -1 in other builds).
 * shim_set_kv_ready: ot_attention_params.paged_kv_ready of the following calls (0 / 1; the
 * benchmark's previous kernel is the previous call's, which writes none of the pages).
 */
#include <string.h>

#include "ops_transformer.h"

#include "shim_common.h"

void ot_cuda_paged_last_plan(int out[4]); /* src/cuda/paged_attention.cu */
/* only in a library built with -DOT_PA_TRACE (the per-CTA stamps of the decode kernels).
 * Weak and hidden: resolved when this shim is linked against the static library (NULL when
 * that build has none), never looked up in other loaded objects at load time. */
int ot_cuda_paged_trace(unsigned long long *dst, int kernel, int clear)
    __attribute__((weak, visibility("hidden")));

SHIM_API void shim_paged_last_plan(int *out) { ot_cuda_paged_last_plan(out); }

static int g_kv_ready;
SHIM_API void shim_set_kv_ready(int on) { g_kv_ready = on; }

/* -1 when the library has no trace (a normal build) */
SHIM_API int shim_paged_trace(void *dst, int kernel, int clear) {
  return ot_cuda_paged_trace ? ot_cuda_paged_trace((unsigned long long *)dst, kernel, clear) : -1;
}

/* q, out [tq, hq, d]; pages [num_pages, hkv, bs, d]; int32 tables; lse float32 [hq, tq]
 * or NULL. */
SHIM_API int shim_paged_attention(void *stream, int dtype, int64_t tq, int64_t hq, int64_t hkv,
                                  int64_t d, int64_t num_pages, int64_t bs, int64_t batch,
                                  int64_t num_indices, void *q, void *cu_q, void *k_pages,
                                  void *v_pages, void *indptr, void *indices, void *lpl,
                                  void *out, void *lse, int causal) {
  DLDevice dev = {kDLCUDA, g_dev};
  DLDataType fdt = shim_dtype(dtype), i32 = {kDLInt, 32, 1}, f32 = {kDLFloat, 32, 1};
  int64_t qsh[3] = {tq, hq, d}, psh[4] = {num_pages, hkv, bs, d}, cush[1] = {batch + 1};
  int64_t ish[1] = {num_indices}, lsh[1] = {batch}, lsesh[2] = {hq, tq};
  DLTensor tq_ = {q, dev, 3, fdt, qsh, NULL, 0}, to = {out, dev, 3, fdt, qsh, NULL, 0};
  DLTensor tk = {k_pages, dev, 4, fdt, psh, NULL, 0}, tv = {v_pages, dev, 4, fdt, psh, NULL, 0};
  DLTensor tcu = {cu_q, dev, 1, i32, cush, NULL, 0}, tip = {indptr, dev, 1, i32, cush, NULL, 0};
  DLTensor tix = {indices, dev, 1, i32, ish, NULL, 0}, tl = {lpl, dev, 1, i32, lsh, NULL, 0};
  DLTensor tlse = {lse, dev, 2, f32, lsesh, NULL, 0};
  ot_paged_kv kv = {&tk, &tv, &tip, &tix, &tl};
  ot_attention_params p = ot_attention_default_params();
  p.causal = causal;
  p.paged_kv_ready = g_kv_ready;
  ot_context_set_stream(g_ctx, stream);
  return (int)ot_paged_attention(g_ctx, &p, &tq_, &tcu, &kv, &to, lse ? &tlse : NULL);
}
