/*
 * pdl.cuh -- programmatic dependent launch (PDL): a kernel launched so that it may start
 * while the previous kernel on its stream finishes; its griddepcontrol.wait holds it
 * until that kernel's writes are visible. Used by the small-M linear kernels (linear.cu),
 * the norms (norm.cuh), the paged decode (paged_attention.cu) and the engine's one-row
 * kernels (src/engine/fused_kernels.cu: the _id forms, without an ot_cuda_state).
 */
#ifndef OT_CUDA_PDL_CUH
#define OT_CUDA_PDL_CUH

#include <cuda_runtime.h>
#include <string.h>

#include <atomic>

#include "cuda_state.h"

/* An answer asked once per device: cached[dev] when set (non-zero), else compute() --
 * never 0 -- stored there (the first 16 devices; beyond them, or dev < 0, asked each
 * time). `cached` is the caller's static array of 16, declared "= {}"
 * (constant-initialized, where GCC otherwise guards an array of atomics'
 * initialization). Host threads may ask at once: each stores the same answer (relaxed
 * atomics, no lock). ot_per_device: for cs's device. */
template <typename F>
static inline int ot_per_device_id(int dev, std::atomic<int> *cached, F compute) {
  const bool slot = dev >= 0 && dev < 16;
  if (slot) {
    const int c = cached[dev].load(std::memory_order_relaxed);
    if (c != 0) return c;
  }
  const int v = compute();
  if (slot) cached[dev].store(v, std::memory_order_relaxed);
  return v;
}
template <typename F>
static inline int ot_per_device(const ot_cuda_state *cs, std::atomic<int> *cached, F compute) {
  return ot_per_device_id(cs->device, cached, compute);
}

/* Whether kernel f may be launched as a programmatic dependent on cs's device: a 9.0+ GPU
 * running f's code compiled for sm_90+. Only that code waits (griddepcontrol.wait is
 * compiled out below sm_90); code JIT-compiled from older PTX (a build without sm_90
 * code, or a newer GPU that cannot run the sm_90a binary) does not, and launched early
 * it could read its inputs before the previous kernel wrote them. Once per kernel and
 * device (ot_per_device): `cached` is the caller's static array of 16 for f (1 yes, -1 no,
 * 0 not asked yet). ot_pdl_ok_id: for device dev of compute capability cc_major.x. */
template <typename K>
static inline bool ot_pdl_ok_id(int dev, int cc_major, K *f, std::atomic<int> *cached) {
  return ot_per_device_id(dev, cached, [cc_major, f]() {
           bool ok = false;
           if (cc_major >= 9) {
             cudaFuncAttributes fa;
             if (cudaFuncGetAttributes(&fa, f) == cudaSuccess) ok = fa.ptxVersion >= 90;
             else (void)cudaGetLastError();
           }
           return ok ? 1 : -1;
         }) > 0;
}
template <typename K>
static inline bool ot_pdl_ok(const ot_cuda_state *cs, K *f, std::atomic<int> *cached) {
  return ot_pdl_ok_id(cs->device, cs->cc_major, f, cached);
}

/* Device side, no-ops below sm_90 and in a kernel not launched as a programmatic
 * dependent. ot_pdl_wait: until the previous grid on the stream has completed and its
 * writes are visible (before the kernel's first global access it depends on);
 * ot_pdl_launch_dependents: let the next grid, when launched as a programmatic dependent,
 * be scheduled (its own wait still holds it until this grid has completed). */
__device__ __forceinline__ void ot_pdl_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
#endif
}
__device__ __forceinline__ void ot_pdl_launch_dependents() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
#endif
}

/* f<<<grid, block, smem, st>>>(args...), as a programmatic dependent of the previous
 * kernel on st when pdl (decided by ot_pdl_ok). */
template <typename... P, typename... A>
static inline cudaError_t ot_launch_pdl_smem(bool pdl, void (*f)(P...), dim3 grid, dim3 block,
                                             size_t smem, cudaStream_t st, A... args) {
  cudaLaunchConfig_t cfg;
  memset(&cfg, 0, sizeof cfg);
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = smem;
  cfg.stream = st;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  cfg.attrs = attr;
  cfg.numAttrs = pdl ? 1 : 0;
  return cudaLaunchKernelEx(&cfg, f, args...);
}

/* The same without dynamic shared memory. */
template <typename... P, typename... A>
static inline cudaError_t ot_launch_pdl(bool pdl, void (*f)(P...), dim3 grid, dim3 block,
                                        cudaStream_t st, A... args) {
  return ot_launch_pdl_smem(pdl, f, grid, block, 0, st, args...);
}

#endif /* OT_CUDA_PDL_CUH */
