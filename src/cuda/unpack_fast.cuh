/*
 * unpack_fast.cuh -- unpack<T> (common.cuh) with bfloat16 pairs taken as (word << 16,
 * word & 0xffff0000): one integer op per element, where to_f32 of the extracted high element
 * takes a PRMT and a shift; the same float values. Shared by the norm forward's row work
 * (norm.cuh norm_unpack: LayerNorm, RMSNorm's opt-in kNormFwdCut) and RoPE's opt-in warp
 * kernel (rope.cu rope_warp4_kernel). Other types: unpack<T>.
 */
#ifndef OT_CUDA_UNPACK_FAST_CUH
#define OT_CUDA_UNPACK_FAST_CUH

#include <type_traits>

#include "common.cuh"

namespace ot {

template <typename T>
__device__ __forceinline__ void unpack_fast(float *f, const raw16 &r) {
  if (!std::is_same<T, __nv_bfloat16>::value) {
    unpack<T>(f, r);
    return;
  }
  const uint32_t w[4] = {r.u.x, r.u.y, r.u.z, r.u.w};
#pragma unroll
  for (int k = 0; k < 4; k++) {
    f[2 * k] = __uint_as_float(w[k] << 16);
    f[2 * k + 1] = __uint_as_float(w[k] & 0xffff0000u);
  }
}

} /* namespace ot */

#endif /* OT_CUDA_UNPACK_FAST_CUH */
