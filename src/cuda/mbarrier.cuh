/*
 * mbarrier.cuh -- sm_90's shared-memory transaction barriers (mbarrier), on which the TMA
 * unit's copies complete: the row-streaming LayerNorm backward's 1-D bulk copies
 * (bulk_copy.cuh) and the Hopper attention kernels' tensor copies (sm90/sm90_common.cuh).
 * A barrier is named by its shared-memory address (smem_u32 of a __shared__ uint64_t).
 *
 * Device code of the sm_90+ passes only: code that uses them is compiled out below sm_90.
 */
#ifndef OT_CUDA_MBARRIER_CUH
#define OT_CUDA_MBARRIER_CUH

#include <stdint.h>

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900

namespace ot {

/* The shared-memory (state space) address of generic pointer p into shared memory. */
__device__ __forceinline__ uint32_t smem_u32(const void *p) {
  return (uint32_t)__cvta_generic_to_shared(p);
}
/* One thread initializes the barrier for `count` arrivals per phase. */
__device__ __forceinline__ void mbar_init(uint32_t bar, uint32_t count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(bar), "r"(count) : "memory");
}
/* After the initializing thread's mbarrier.init calls, before the block barrier that
 * publishes them: visible to the other threads and to the async (TMA) proxy. */
__device__ __forceinline__ void mbar_init_fence() {
  asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
}
/* Arrive on bar (one of its expected arrivals) and expect `bytes` of transactions. */
__device__ __forceinline__ void mbar_expect_tx(uint32_t bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(bar), "r"(bytes)
               : "memory");
}
__device__ __forceinline__ void mbar_arrive(uint32_t bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(bar) : "memory");
}
/* Until bar's phase `parity` completes (try_wait: the hardware's bounded suspend between
 * tests). */
__device__ __forceinline__ void mbar_wait(uint32_t bar, uint32_t parity) {
  uint32_t done;
  do {
    asm volatile(
        "{\n.reg .pred p;\n"
        "mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
        "selp.u32 %0, 1, 0, p;\n}\n"
        : "=r"(done)
        : "r"(bar), "r"(parity)
        : "memory");
  } while (!done);
}

} /* namespace ot */

#endif

#endif /* OT_CUDA_MBARRIER_CUH */
