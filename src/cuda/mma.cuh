/*
 * mma.cuh -- the warp-level tensor-core product mma.sync.m16n8k16 (fp32 accumulate) for
 * bf16 and fp16, and the packing of two floats into the 16-bit pair of an A / B
 * fragment (lo = the lower k index). sm_80 and later.
 *   A (16 x 16, row): a[0] = (row g, k 2t..2t+1), a[1] = (g + 8, 2t..), a[2] = (g, 2t+8..),
 *                     a[3] = (g + 8, 2t+8..);  B (16 x 8, col): b0 = (k 2t..2t+1, n g),
 *                     b1 = (k 2t+8.., n g);  C: c[0..1] = (g, 2t..2t+1), c[2..3] = (g + 8, ..)
 * with g = lane / 4, t = lane % 4. quad_max / quad_sum reduce one C row over its quad.
 */
#ifndef OT_CUDA_MMA_CUH
#define OT_CUDA_MMA_CUH

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <stdint.h>

namespace ot {

template <typename T> struct mma_m16n8k16;
template <> struct mma_m16n8k16<__nv_bfloat16> {
  static __device__ __forceinline__ void run(float *c, const uint32_t *a, uint32_t b0,
                                             uint32_t b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
        "{%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
  static __device__ __forceinline__ uint32_t pack(float lo, float hi) {
    __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<uint32_t *>(&v);
  }
};
template <> struct mma_m16n8k16<__half> {
  static __device__ __forceinline__ void run(float *c, const uint32_t *a, uint32_t b0,
                                             uint32_t b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
        "{%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
  static __device__ __forceinline__ uint32_t pack(float lo, float hi) {
    __half2 v = __floats2half2_rn(lo, hi);
    return *reinterpret_cast<uint32_t *>(&v);
  }
};

/* Max / sum over the 4 threads of a quad (one row of a C fragment). */
__device__ __forceinline__ float quad_max(float v) {
  v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 1));
  return fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 2));
}
__device__ __forceinline__ float quad_sum(float v) {
  v += __shfl_xor_sync(0xffffffffu, v, 1);
  return v + __shfl_xor_sync(0xffffffffu, v, 2);
}

} /* namespace ot */

#endif /* OT_CUDA_MMA_CUH */
