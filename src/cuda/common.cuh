/*
 * common.cuh -- device helpers shared by the CUDA kernels of the fused ops
 * (norms, RoPE, gated activations): storage <-> float32 conversion, 16-byte vector
 * loads and stores of a storage dtype, warp and block reductions, the error
 * check that turns a CUDA runtime error into OT_ERR_BACKEND with ot_error(), and the
 * one-pass scan of the environment for the OT_* knobs (ot_env_scan).
 *
 * Storage types are the raw CUDA types: float, __half, __nv_bfloat16. Arithmetic is
 * always float32 (the API's rule: storage bf16 / fp16 / fp32, accumulation fp32).
 */
#ifndef OT_CUDA_COMMON_CUH
#define OT_CUDA_COMMON_CUH

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stdint.h>
#include <string.h>

#include "../core/internal.h"

extern "C" char **environ; /* POSIX (unistd.h declares it only under _GNU_SOURCE) */

/* Evaluate a CUDA runtime call; on failure record "op: what: <cuda message>" and
 * return OT_ERR_BACKEND from the enclosing function. */
#define OT_CUDA_CHECK(op, expr)                                                      \
  do {                                                                               \
    cudaError_t ot_cuda_e_ = (expr);                                                 \
    if (ot_cuda_e_ != cudaSuccess)                                                   \
      return ot_error(OT_ERR_BACKEND, (op), "%s: %s", #expr,                         \
                      cudaGetErrorString(ot_cuda_e_));                               \
  } while (0)

/* After a launch: report a launch-configuration error (a sticky fault of an earlier
 * kernel shows up at the next synchronizing call, as usual with CUDA). */
#define OT_CUDA_CHECK_LAUNCH(op) OT_CUDA_CHECK((op), cudaGetLastError())

namespace ot {

/* ---- storage <-> float ----------------------------------------------------------- */

__device__ __forceinline__ float to_f32(float v) { return v; }
__device__ __forceinline__ float to_f32(__half v) { return __half2float(v); }
__device__ __forceinline__ float to_f32(__nv_bfloat16 v) { return __bfloat162float(v); }

template <typename T> __device__ __forceinline__ T from_f32(float v);
template <> __device__ __forceinline__ float from_f32<float>(float v) { return v; }
template <> __device__ __forceinline__ __half from_f32<__half>(float v) {
  return __float2half_rn(v);
}
template <> __device__ __forceinline__ __nv_bfloat16 from_f32<__nv_bfloat16>(float v) {
  return __float2bfloat16_rn(v);
}

/* Round a float32 to storage T and back (what a value stored in T reads as). */
template <typename T> __device__ __forceinline__ float round_to(float v) {
  return to_f32(from_f32<T>(v));
}

/* ---- 16-byte vectors --------------------------------------------------------------- */

/* Elements of T per 16-byte vector: 8 for bf16 / fp16, 4 for fp32. */
template <typename T> struct vec_width {
  static constexpr int value = 16 / (int)sizeof(T);
};

/* Load VEC = 16/sizeof(T) elements starting at p into f[0..VEC). p must be 16-byte
 * aligned. One 128-bit load (ld.global.v4). */
template <typename T>
__device__ __forceinline__ void load_vec(float *f, const T *p) {
  constexpr int V = vec_width<T>::value;
  uint4 raw = *reinterpret_cast<const uint4 *>(p);
  const T *e = reinterpret_cast<const T *>(&raw);
#pragma unroll
  for (int i = 0; i < V; i++) f[i] = to_f32(e[i]);
}

/* Same, read-only streaming hint: data read once (ld.global.nc.L1::no_allocate). */
template <typename T>
__device__ __forceinline__ void load_vec_stream(float *f, const T *p) {
  constexpr int V = vec_width<T>::value;
  uint4 raw = __ldcs(reinterpret_cast<const uint4 *>(p));
  const T *e = reinterpret_cast<const T *>(&raw);
#pragma unroll
  for (int i = 0; i < V; i++) f[i] = to_f32(e[i]);
}

/* Store f[0..VEC) rounded to T at p (16-byte aligned). One 128-bit store. */
template <typename T>
__device__ __forceinline__ void store_vec(T *p, const float *f) {
  constexpr int V = vec_width<T>::value;
  uint4 raw;
  T *e = reinterpret_cast<T *>(&raw);
#pragma unroll
  for (int i = 0; i < V; i++) e[i] = from_f32<T>(f[i]);
  *reinterpret_cast<uint4 *>(p) = raw;
}

/* Load / store of the elements [base, base + VEC) of a row of length n, for rows that
 * are not 16-byte aligned or for the ragged tail: scalar accesses, missing elements
 * read as 0 and are not written. */
template <typename T>
__device__ __forceinline__ void load_vec_tail(float *f, const T *row, int64_t base, int64_t n) {
  constexpr int V = vec_width<T>::value;
#pragma unroll
  for (int i = 0; i < V; i++) f[i] = base + i < n ? to_f32(row[base + i]) : 0.0f;
}
template <typename T>
__device__ __forceinline__ void store_vec_tail(T *row, int64_t base, int64_t n, const float *f) {
  constexpr int V = vec_width<T>::value;
#pragma unroll
  for (int i = 0; i < V; i++)
    if (base + i < n) row[base + i] = from_f32<T>(f[i]);
}

/* Generic row access: the vector path when ALIGNED (every row of every tensor starts
 * on 16 bytes and n % VEC == 0), else the scalar path. Whole vectors past n are
 * skipped by the caller. */
template <typename T, bool ALIGNED>
__device__ __forceinline__ void load_row_vec(float *f, const T *row, int64_t base, int64_t n) {
  if (ALIGNED) load_vec(f, row + base);
  else load_vec_tail(f, row, base, n);
}
template <typename T, bool ALIGNED>
__device__ __forceinline__ void store_row_vec(T *row, int64_t base, int64_t n, const float *f) {
  if (ALIGNED) store_vec(row + base, f);
  else store_vec_tail(row, base, n, f);
}

/* A 16-byte register holding VEC storage elements, loaded now and unpacked later
 * (half the registers of the float32 form for 16-bit types). */
struct alignas(16) raw16 {
  uint4 u;
};

/* Load the VEC elements [base, base + VEC) of `row` into r when `in`, else zeros.
 * STREAM: data read once (ld.global.cs, evict-first); otherwise a plain load (weights
 * that every row re-reads stay in L2). Unaligned rows load element by element. */
template <typename T, bool ALIGNED, bool STREAM>
__device__ __forceinline__ void load_raw(raw16 &r, const T *row, int64_t base, int64_t n,
                                         bool in) {
  constexpr int V = vec_width<T>::value;
  r.u = make_uint4(0u, 0u, 0u, 0u);
  if (!in) return;
  if (ALIGNED) {
    const uint4 *q = reinterpret_cast<const uint4 *>(row + base);
    r.u = STREAM ? __ldcs(q) : *q;
  } else {
    T *e = reinterpret_cast<T *>(&r.u);
#pragma unroll
    for (int i = 0; i < V; i++)
      if (base + i < n) e[i] = row[base + i];
  }
}

template <typename T>
__device__ __forceinline__ void unpack(float *f, const raw16 &r) {
  constexpr int V = vec_width<T>::value;
  const T *e = reinterpret_cast<const T *>(&r.u);
#pragma unroll
  for (int i = 0; i < V; i++) f[i] = to_f32(e[i]);
}

template <typename T>
__device__ __forceinline__ void pack(raw16 &r, const float *f) {
  constexpr int V = vec_width<T>::value;
  T *e = reinterpret_cast<T *>(&r.u);
#pragma unroll
  for (int i = 0; i < V; i++) e[i] = from_f32<T>(f[i]);
}

/* ---- reductions ---------------------------------------------------------------------- */

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

/* Sum of v over the threads of one row group: the blockDim.x threads that share
 * threadIdx.y (blockDim.x a multiple of 32, at most 1024). `scratch` is shared memory
 * of at least 32 * blockDim.y floats. Every thread of the group gets the sum. Contains
 * __syncthreads(), so every thread of the block must call it. */
__device__ __forceinline__ float row_group_sum(float v, float *scratch) {
  v = warp_sum(v);
  const int nwarps = blockDim.x >> 5;
  if (nwarps == 1) return v; /* uniform over the block: no barrier needed */
  float *s = scratch + 32 * threadIdx.y;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  __syncthreads(); /* scratch may still be read by a previous call */
  if (lane == 0) s[warp] = v;
  __syncthreads();
  float r = lane < nwarps ? s[lane] : 0.0f;
  return warp_sum(r);
}

/* Two sums at once (one pair of barriers instead of two). */
__device__ __forceinline__ float2 row_group_sum2(float a, float b, float *scratch) {
  a = warp_sum(a);
  b = warp_sum(b);
  const int nwarps = blockDim.x >> 5;
  if (nwarps == 1) return make_float2(a, b);
  float2 *s = reinterpret_cast<float2 *>(scratch) + 32 * threadIdx.y;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  __syncthreads();
  if (lane == 0) s[warp] = make_float2(a, b);
  __syncthreads();
  float2 r = lane < nwarps ? s[lane] : make_float2(0.0f, 0.0f);
  return make_float2(warp_sum(r.x), warp_sum(r.y));
}

} /* namespace ot */

/* ---- host helpers --------------------------------------------------------------------- */

static inline bool ot_is_aligned16(const void *p) { return ((uintptr_t)p & 15u) == 0; }

/* True when a row-strided tensor can use 16-byte vectors: base aligned and the row
 * stride a multiple of 16 bytes (rows <= 1 ignore the stride). NULL passes. */
static inline bool ot_rows_aligned16(const void *p, int64_t row_stride_elems, size_t elem,
                                     int64_t rows) {
  if (!p) return true;
  if (!ot_is_aligned16(p)) return false;
  return rows <= 1 || ((row_stride_elems * (int64_t)elem) & 15) == 0;
}

/* ---- OT_* knobs from the environment ------------------------------------------------ */

/* One pass over the environment: for each entry `NAME=value` whose NAME starts with
 * `prefix` (not empty), f(name, n, value), where name points at NAME (prefix included, not
 * NUL-terminated: n is its length) and value at what follows the '='. Returns whether any
 * entry matched. The knobs are read at every call (tests and benches switch them at run
 * time with setenv), and one pass replaces a getenv per knob; the scan only reads
 * environ, like getenv, so it is as thread-safe as getenv is. Compare names whole with
 * ot_env_name_is (a bare prefix test would take OT_PAGED_SPLITS_X for OT_PAGED_SPLITS).
 * A prefix literal ends in '_' ("OT_NORM_"), which scripts/check_env_docs.sh reads as a
 * prefix, not as a variable that needs a docs/ENVIRONMENT.md row. */
template <class F> static inline bool ot_env_scan(const char *prefix, F &&f) {
  const size_t pn = strlen(prefix);
  bool any = false;
  for (char **e = environ; e && *e; e++) {
    const char *s = *e;
    if (s[0] != prefix[0] || strncmp(s, prefix, pn) != 0) continue; /* most: one byte */
    const char *eq = strchr(s + pn, '=');
    if (!eq) continue;
    any = true;
    f(s, (size_t)(eq - s), eq + 1);
  }
  return any;
}

/* Whether some variable whose name starts with prefix is set (the fast path of a call in
 * normal use, where none is). */
static inline bool ot_env_any(const char *prefix) {
  return ot_env_scan(prefix, [](const char *, size_t, const char *) {});
}

/* Whether the n-byte name of an ot_env_scan entry is exactly `full` ("OT_PAGED_SPLITS"). */
static inline bool ot_env_name_is(const char *name, size_t n, const char *full) {
  return strlen(full) == n && memcmp(name, full, n) == 0;
}

/* Whether a value is exactly "0" (the "off" of the paged-attention switches). */
static inline bool ot_env_is_zero(const char *v) { return v[0] == '0' && v[1] == 0; }

#endif /* OT_CUDA_COMMON_CUH */
