/*
 * bulk_copy.cuh -- 1-D bulk copies global -> shared memory (sm_90's cp.async.bulk, the
 * TMA unit without a tensor map) completing on an mbarrier (mbarrier.cuh), for the
 * row-streaming LayerNorm backward (norm.cuh) and the Hopper attention backward's lse / Dsum
 * rows (sm90/attention_bwd_sm90.cu): one thread issues a whole row (up to the
 * mbarrier's 1 MB transaction count) and the bytes in flight cost no registers and no
 * per-16-byte instructions. Source and destination 16-byte aligned, size a multiple of 16.
 *
 * The device helpers exist in the sm_90 pass only (`OT_BULK_COPY_DEVICE`); kernels that
 * use them compile to an empty body for sm_80, and the host must check with
 * ot_bulk_kernel_ok() that the kernel it launches was built for sm_90+ (a build without
 * sm_90 code, or a newer GPU that JIT-compiles the sm_80 PTX, runs the empty body).
 */
#ifndef OT_CUDA_BULK_COPY_CUH
#define OT_CUDA_BULK_COPY_CUH

#include <stdint.h>

#include "common.cuh"
#include "mbarrier.cuh"

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
#define OT_BULK_COPY_DEVICE 1
#endif

namespace ot {

#ifdef OT_BULK_COPY_DEVICE
/* bytes from global src to shared dst (shared-memory state space addresses), counted on
 * bar, the L2's default policy: for kernels that address their stages as such (the Hopper
 * attention backward's producer, sm90/attention_bwd_sm90.cu: a tile's lse and Dsum rows
 * per stage) and, by generic addresses, bulk_load below. */
__device__ __forceinline__ void bulk_load_sh(uint32_t dst, const void *src, uint32_t bytes,
                                             uint32_t bar) {
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];"
      ::"r"(dst), "l"((uint64_t)src), "r"(bytes), "r"(bar)
      : "memory");
}
/* bulk_load_sh with an L2 cache policy pol (createpolicy's; evict-first for weights read
 * once: the engine's attention + o_proj kernel, src/engine/fused_kernels.cu). */
__device__ __forceinline__ void bulk_load_sh_policy(uint32_t dst, const void *src,
                                                    uint32_t bytes, uint32_t bar, uint64_t pol) {
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes.L2::cache_hint"
      " [%0], [%1], %2, [%3], %4;" ::"r"(dst), "l"((uint64_t)src), "r"(bytes), "r"(bar), "l"(pol)
      : "memory");
}
/* bytes from global src to shared dst, counted on bar; the L2's default (evict-normal)
 * policy. An evict-first policy on these loads (the default until 2026-12-05) made the
 * LayerNorm backward at 16k x 4096 / 8192 bf16 10-12% slower on the H200 (3.38 / 3.60
 * TB/s against 3.79 / 3.94 with evict-normal; build A/B in one process, 4 balanced
 * rounds, docs/PERFORMANCE.md 2026-12-05). */
__device__ __forceinline__ void bulk_load(void *dst, const void *src, uint32_t bytes,
                                          uint64_t *bar) {
  bulk_load_sh(smem_u32(dst), src, bytes, smem_u32(bar));
}
#endif

} /* namespace ot */

/* Whether `kernel` (a function using the bulk copies) runs its sm_90 code on the current
 * device: compiled for sm_90+ (its PTX version) and a device of compute capability 9+.
 * Cached per (device, kernel) by the caller's static. */
static inline bool ot_bulk_kernel_ok(const void *kernel) {
  int dev = 0, major = 0;
  if (cudaGetDevice(&dev) != cudaSuccess ||
      cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) != cudaSuccess) {
    (void)cudaGetLastError();
    return false;
  }
  if (major < 9) return false;
  cudaFuncAttributes fa;
  if (cudaFuncGetAttributes(&fa, kernel) != cudaSuccess) {
    (void)cudaGetLastError();
    return false;
  }
  return fa.ptxVersion >= 90 && fa.binaryVersion >= 90;
}

#endif /* OT_CUDA_BULK_COPY_CUH */
