/*
 * sm90_common.cuh -- building blocks shared by the Hopper (sm_90a) attention kernels
 * (attention_fwd_sm90.cu, attention_bwd_sm90.cu): the TMA tensor load (its mbarriers are
 * ../mbarrier.cuh's), wgmma fences / commit / wait, named barriers, the 128B-swizzle
 * shared-memory descriptor, 16-bit packing, the row-quad transpose of packed pairs (16-byte
 * stores of accumulator rows), and on the host the TMA tensor-map encoding of
 * a BSHD operand.
 * Device helpers exist only in the sm_90a pass (include inside code guarded the same way).
 */
#ifndef OT_CUDA_SM90_COMMON_CUH
#define OT_CUDA_SM90_COMMON_CUH

#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stdint.h>
#include <stdlib.h>

#include <atomic>

#include "../../core/attention.h"
#include "../cuda_state.h"
#include "../mbarrier.cuh"

namespace ot {
namespace sm90 {

template <typename T> struct is_half { static constexpr bool value = false; };
template <> struct is_half<__half> { static constexpr bool value = true; };

/* Dynamic shared memory one block may opt in to on cc 9.0 (sharedMemPerBlockOptin, set by
 * cudaFuncAttributeMaxDynamicSharedMemorySize): the kernels' layouts are checked against it. */
constexpr int kSmemOptin = 227 * 1024;

#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)

__device__ __forceinline__ void tma_load_5d(uint32_t dst, const CUtensorMap *map, uint32_t bar,
                                            int c0, int c1, int c2, int c3, int c4) {
  asm volatile(
      "cp.async.bulk.tensor.5d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
      " [%0], [%1, {%2, %3, %4, %5, %6}], [%7];" ::"r"(dst),
      "l"((uint64_t)map), "r"(c0), "r"(c1), "r"(c2), "r"(c3), "r"(c4), "r"(bar)
      : "memory");
}
__device__ __forceinline__ void tma_load_4d(uint32_t dst, const CUtensorMap *map, uint32_t bar,
                                            int c0, int c1, int c2, int c3) {
  asm volatile(
      "cp.async.bulk.tensor.4d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
      " [%0], [%1, {%2, %3, %4, %5}], [%6];" ::"r"(dst),
      "l"((uint64_t)map), "r"(c0), "r"(c1), "r"(c2), "r"(c3), "r"(bar)
      : "memory");
}
/* A tile [rows] of a Q / K / V / dO operand into the [D / 64][rows][64] layout: one box of
 * the 5-D map (encode_map), or (PAD: head dim 96 on the 128-column layout) two 64-column
 * boxes of the 4-D map (encode_map_pad), the columns past 96 zero-filled by TMA. */
template <bool PAD>
__device__ __forceinline__ void tma_load_tile(uint32_t dst, const CUtensorMap *map, uint32_t bar,
                                              int row, int rows, int h, int b) {
  if constexpr (PAD) {
    tma_load_4d(dst, map, bar, 0, row, h, b);
    tma_load_4d(dst + (uint32_t)rows * 128, map, bar, 64, row, h, b);
  } else {
    tma_load_5d(dst, map, bar, 0, row, 0, h, b);
  }
}
/* An L2 prefetch of the tile tma_load_tile(.., row, rows, h, b) would load (no shared
 * memory, no barrier: cp.async.bulk.prefetch.tensor, a hint the TMA unit carries out) */
__device__ __forceinline__ void tma_prefetch_5d(const CUtensorMap *map, int c0, int c1, int c2,
                                                int c3, int c4) {
  asm volatile("cp.async.bulk.prefetch.tensor.5d.L2.global.tile [%0, {%1, %2, %3, %4, %5}];" ::"l"(
                   (uint64_t)map),
               "r"(c0), "r"(c1), "r"(c2), "r"(c3), "r"(c4)
               : "memory");
}
__device__ __forceinline__ void tma_prefetch_4d(const CUtensorMap *map, int c0, int c1, int c2,
                                                int c3) {
  asm volatile("cp.async.bulk.prefetch.tensor.4d.L2.global.tile [%0, {%1, %2, %3, %4}];" ::"l"(
                   (uint64_t)map),
               "r"(c0), "r"(c1), "r"(c2), "r"(c3)
               : "memory");
}
template <bool PAD>
__device__ __forceinline__ void tma_prefetch_tile(const CUtensorMap *map, int row, int h, int b) {
  if constexpr (PAD) {
    tma_prefetch_4d(map, 0, row, h, b);
    tma_prefetch_4d(map, 64, row, h, b);
  } else {
    tma_prefetch_5d(map, 0, row, 0, h, b);
  }
}
__device__ __forceinline__ void wgmma_fence() {
  asm volatile("wgmma.fence.sync.aligned;" ::: "memory");
}
__device__ __forceinline__ void wgmma_commit() {
  asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory");
}
template <int N> __device__ __forceinline__ void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;" ::"n"(N) : "memory");
}
/* Tie registers to this point of the instruction stream: the compiler may neither read
 * them before nor keep them past it (used after wgmma.wait_group, whose operands the
 * compiler does not know about). */
template <int N> __device__ __forceinline__ void reg_fence(float *r) {
#pragma unroll
  for (int i = 0; i < N; i++) asm volatile("" : "+f"(r[i])::"memory");
}
template <int N> __device__ __forceinline__ void reg_fence(uint32_t *r) {
#pragma unroll
  for (int i = 0; i < N; i++) asm volatile("" : "+r"(r[i])::"memory");
}
__device__ __forceinline__ void named_sync(int id, int n) {
  asm volatile("bar.sync %0, %1;" ::"r"(id), "r"(n) : "memory");
}
/* barrier.sync without .aligned: the same barrier for threads that may reach it with their
 * warp diverged (after a branch on the lane, whose reconvergence ptxas may place past the
 * barrier). bar.sync is barrier.sync.aligned, which requires every thread of the warp at
 * the same instruction: compute-sanitizer synccheck reports "Divergent thread(s) in block"
 * where a warp reaches it split (kFlKsplit's merge, 2026-12-06). */
__device__ __forceinline__ void named_sync_div(int id, int n) {
  asm volatile("barrier.sync %0, %1;" ::"r"(id), "r"(n) : "memory");
}
__device__ __forceinline__ void named_arrive(int id, int n) {
  asm volatile("bar.arrive %0, %1;" ::"r"(id), "r"(n) : "memory");
}
/* bar.red.or over the n threads of named barrier id: syncs them and returns whether any
 * passed pred true */
__device__ __forceinline__ bool named_sync_or(int id, int n, bool pred) {
  uint32_t r;
  asm volatile(
      "{\n .reg .pred p, q;\n setp.ne.u32 p, %1, 0;\n barrier.red.or.pred q, %2, %3, p;\n"
      " selp.u32 %0, 1, 0, q;\n}"
      : "=r"(r)
      : "r"((uint32_t)pred), "r"(id), "r"(n)
      : "memory");
  return r != 0;
}
/* a GPU-scope acquire load (a counter another CTA releases) */
__device__ __forceinline__ int ld_acquire_gpu(const int *p) {
  int v;
  asm volatile("ld.acquire.gpu.global.b32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}
/* ldmatrix.x4 (four 8 x 8 b16 matrices) from a 32-bit shared-memory address, as the rest of
 * the sm_90 code addresses shared memory (attention.cuh's ldsm_x4 is the portable kernels'
 * form, from a generic pointer): r[j] holds matrix j, the address of lane l is row l % 8 of
 * matrix l / 8. */
__device__ __forceinline__ void ldsm_x4(uint32_t *r, uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}
__device__ __forceinline__ float ex2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}
/* 128B-swizzle shared-memory matrix descriptor (LBO / SBO in bytes). */
__device__ __forceinline__ uint64_t make_desc(uint32_t addr, uint32_t lbo, uint32_t sbo) {
  return (uint64_t)((addr & 0x3FFFF) >> 4) | ((uint64_t)((lbo & 0x3FFFF) >> 4) << 16) |
         ((uint64_t)((sbo & 0x3FFFF) >> 4) << 32) | (1ull << 62);
}
template <bool F16> __device__ __forceinline__ uint32_t pack2(float lo, float hi) {
  uint32_t r;
  if (F16)
    asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
  else
    asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
  return r;
}
/* The 4 x 4 transpose of packed pairs within a row quad (lanes 4 g .. 4 g + 3), for 16-byte
 * stores of a wgmma accumulator's rows (the forward's kFlSt16, the backward's kXSt16): lane q
 * holds a_k = its pair of block column k (k = 0..3) and ends with a_m = lane m's pair of
 * block column q -- the xor-1 step transposes the 2 x 2 sub-blocks, the xor-2 step swaps the
 * off-diagonal ones. Every lane of the warp must call it (full-mask shuffles). */
__device__ __forceinline__ void quad_transpose(uint32_t &a0, uint32_t &a1, uint32_t &a2,
                                               uint32_t &a3, int q) {
  const bool odd = q & 1, hi = q & 2;
  uint32_t r0 = __shfl_xor_sync(0xffffffffu, odd ? a0 : a1, 1);
  uint32_t r1 = __shfl_xor_sync(0xffffffffu, odd ? a2 : a3, 1);
  if (odd) {
    a0 = r0;
    a2 = r1;
  } else {
    a1 = r0;
    a3 = r1;
  }
  r0 = __shfl_xor_sync(0xffffffffu, hi ? a0 : a2, 2);
  r1 = __shfl_xor_sync(0xffffffffu, hi ? a1 : a3, 2);
  if (hi) {
    a0 = r0;
    a1 = r1;
  } else {
    a2 = r0;
    a3 = r1;
  }
}
/* A row of N packed pairs (lane q of the row's quad holds columns 8 j + 2 q, + 1 in w[j])
 * transposed block by block, so that lane q holds columns 8 (j0 + q) .. + 7 of each block of
 * four column groups j0 .. j0 + 3 in w[j0 .. j0 + 3]; then written by store_row16: one
 * 16-byte store a block to the row of 16-bit elements at `row` (16-byte aligned). */
template <int N>
__device__ __forceinline__ void quad_transpose_row(uint32_t (&w)[N], int q) {
  static_assert(N % 4 == 0, "whole 4 x 4 blocks of 8-column groups");
#pragma unroll
  for (int j0 = 0; j0 < N; j0 += 4) quad_transpose(w[j0], w[j0 + 1], w[j0 + 2], w[j0 + 3], q);
}
/* COLS: the columns stored (the first COLS / 8 groups; a multiple of 32, default all: the
 * head dim 96 kernels run 128-column rows and store 96) */
template <int COLS = 0, typename T, int N>
__device__ __forceinline__ void store_row16(T *row, const uint32_t (&w)[N], int q) {
  static_assert(sizeof(T) == 2, "16-bit elements: 8 a 16-byte store");
  constexpr int NG = COLS > 0 ? COLS / 8 : N;
  static_assert(NG % 4 == 0 && NG <= N, "whole blocks of four 8-column groups");
#pragma unroll
  for (int j0 = 0; j0 < NG; j0 += 4)
    *reinterpret_cast<uint4 *>(row + 8 * (j0 + q)) =
        make_uint4(w[j0], w[j0 + 1], w[j0 + 2], w[j0 + 3]);
}

#endif

/* ---------------- host ---------------- */

/* OT_ATTN_SM90=0 (the Hopper kernels off), read once, at the first Hopper attention
 * call of the process (a function-local static: initialized exactly once even when
 * threads race here), not per call. */
static inline bool sm90_attention_env_off(void) {
  static const bool off = [] {
    const char *env = getenv("OT_ATTN_SM90");
    return env && env[0] == '0';
  }();
  return off;
}

/* Whether a Hopper attention kernel may run for ctx: built with sm_90a (otherwise the
 * kernels are the empty stubs, which a 9.0 device would run from the sm_80 PTX, writing
 * nothing; OT_HAVE_SM90A comes from CMakeLists.txt), not turned off by OT_ATTN_SM90=0,
 * and a compute capability 9.0 device. */
static inline bool sm90_attention_enabled(ot_context *ctx) {
#ifdef OT_HAVE_SM90A
  if (sm90_attention_env_off()) return false;
  ot_cuda_state *st = ot_cuda_state_of(ctx);
  return st && st->cc_major == 9 && st->cc_minor == 0;
#else
  (void)ctx;
  return false;
#endif
}

/* cudaFuncSetAttribute(kern, max dynamic shared memory, bytes) once per device and kernel
 * instance instead of on every call: `done` is a static of the instance holding a bit per
 * device ordinal < 64 (other ordinals: the call every time), set only once the call
 * succeeded (threads racing here may both make it: harmless). Ops run with ctx's device
 * current (cuda_state.h), which is the one the attribute is set on. It lives in the
 * device's primary context, as the context's stream, scratch and cuBLASLt handle do: a
 * cudaDeviceReset under a live ot_context breaks those as well. A failure is recorded for
 * op, and the runtime's last error cleared so that a later launch check does not report it
 * again. */
template <typename K>
static ot_status smem_attr_once(K kern, int bytes, const ot_context *ctx,
                                std::atomic<uint64_t> &done, const char *op) {
  const int dev = ot_cuda_state_of(ctx)->device;
  const uint64_t bit = dev >= 0 && dev < 64 ? (uint64_t)1 << dev : 0;
  if (bit && (done.load(std::memory_order_acquire) & bit)) return OT_OK;
  const cudaError_t e =
      cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes);
  if (e != cudaSuccess) {
    (void)cudaGetLastError();
    return ot_error(OT_ERR_BACKEND, op,
                    "cudaFuncSetAttribute(max dynamic shared memory, %d bytes): %s", bytes,
                    cudaGetErrorString(e));
  }
  if (bit) done.fetch_or(bit, std::memory_order_release);
  return OT_OK;
}

static inline PFN_cuTensorMapEncodeTiled_v12000 query_encode_fn(void) {
  void *f = NULL;
  cudaDriverEntryPointQueryResult q;
  if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &f, 12000, cudaEnableDefault,
                                       &q) == cudaSuccess &&
      q == cudaDriverEntryPointSuccess)
    return (PFN_cuTensorMapEncodeTiled_v12000)f;
  (void)cudaGetLastError();
  return NULL;
}

/* The driver's encoder, looked up once: a function-local static is initialized exactly
 * once even when threads race here (C++11), unlike a "tried" flag set before the
 * pointer, which let a second thread see tried && fn == NULL and skip this kernel. */
static inline PFN_cuTensorMapEncodeTiled_v12000 encode_fn(void) {
  static const PFN_cuTensorMapEncodeTiled_v12000 fn = query_encode_fn();
  return fn;
}

/* The 5-D view {64, S, D/64, H, B} of a BSHD operand, box {64, rows, D/64, 1, 1}. */
/* The tiled, 128B-swizzled map of a bf16 / fp16 BSHD operand with the given view: rank 4 or
 * 5, dims / box innermost first, strides (bytes) of dims 1.. */
static inline bool encode_view(CUtensorMap *map, const ot_attn_operand *x, ot_dtype dt, int rank,
                               const cuuint64_t *dims, const cuuint64_t *strides,
                               const cuuint32_t *box) {
  PFN_cuTensorMapEncodeTiled_v12000 fn = encode_fn();
  if (!fn) return false;
  const cuuint32_t estr[5] = {1, 1, 1, 1, 1};
  CUresult r = fn(map, dt == OT_BF16 ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16
                                     : CU_TENSOR_MAP_DATA_TYPE_FLOAT16,
                  (cuuint32_t)rank, x->data, dims, strides, box, estr,
                  CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                  CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  return r == CUDA_SUCCESS;
}

/* The 5-D view {64, S, D/64, H, B} of a BSHD operand, box {64, rows, D/64, 1, 1}. */
static inline bool encode_map(CUtensorMap *map, const ot_attn_operand *x, ot_dtype dt, int64_t batch,
                       int64_t s, int64_t h, int64_t d, int rows) {
  const int64_t es = 2;
  const cuuint64_t dims[5] = {64, (cuuint64_t)s, (cuuint64_t)(d / 64), (cuuint64_t)h,
                              (cuuint64_t)batch};
  /* A size-1 dimension's stride is never used; give it a legal value. */
  const int64_t hs = h > 1 ? x->head_stride * es : 16;
  const int64_t bs = batch > 1 ? x->batch_stride * es : 16;
  const cuuint64_t strides[4] = {(cuuint64_t)(x->tok_stride * es), 128, (cuuint64_t)hs,
                                 (cuuint64_t)bs};
  const cuuint32_t box[5] = {64, (cuuint32_t)rows, (cuuint32_t)(d / 64), 1, 1};
  return encode_view(map, x, dt, 5, dims, strides, box);
}

/* The 4-D view {D, S, H, B} of a BSHD operand whose D is not a multiple of 64 (D = 96),
 * box {64, rows, 1, 1}: loaded at columns 0 and 64 into the two 64-column blocks of the
 * D = 128 layout, the columns past D out of bounds, which TMA fills with zeros (and counts
 * in the transaction bytes, as in bounds). */
static inline bool encode_map_pad(CUtensorMap *map, const ot_attn_operand *x, ot_dtype dt,
                                  int64_t batch, int64_t s, int64_t h, int64_t d, int rows) {
  const int64_t es = 2;
  const cuuint64_t dims[4] = {(cuuint64_t)d, (cuuint64_t)s, (cuuint64_t)h, (cuuint64_t)batch};
  const int64_t hs = h > 1 ? x->head_stride * es : 16;
  const int64_t bs = batch > 1 ? x->batch_stride * es : 16;
  const cuuint64_t strides[3] = {(cuuint64_t)(x->tok_stride * es), (cuuint64_t)hs,
                                 (cuuint64_t)bs};
  const cuuint32_t box[4] = {64, (cuuint32_t)rows, 1, 1};
  return encode_view(map, x, dt, 4, dims, strides, box);
}

static inline bool tma_ok(const ot_attn_operand *x, int64_t batch, int64_t h) {
  const int64_t es = 2;
  if (((uintptr_t)x->data & 15) != 0) return false;
  if ((x->tok_stride * es) % 16 != 0 || x->tok_stride <= 0) return false;
  if (h > 1 && ((x->head_stride * es) % 16 != 0 || x->head_stride <= 0)) return false;
  if (batch > 1 && ((x->batch_stride * es) % 16 != 0 || x->batch_stride <= 0)) return false;
  const int64_t lim = (int64_t)1 << 40;
  return x->tok_stride * es < lim && x->head_stride * es < lim && x->batch_stride * es < lim;
}

}  // namespace sm90
}  // namespace ot

#endif /* OT_CUDA_SM90_COMMON_CUH */
