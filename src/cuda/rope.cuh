/*
 * rope.cuh -- the RoPE math shared by the rope kernel (rope.cu) and the fused
 * RoPE + paged-KV append (kv_append.cu), so that a key rotated on its way into the
 * cache is bit for bit what ot_rope_forward gives:
 *   - rope_inv_freq_dev: the frequency of pair i recomputed in float64 on the device
 *     (the rule of ot_rope_inv_freq, for rotary dims beyond the by-value table);
 *   - rope_cos_sin: cos / sin of pos * inv_freq[i], reduced modulo 2*pi in float64,
 *     then float32 sincosf of the reduced angle (what the CPU backend does);
 *   - rope_rotate_neox / rope_rotate_gptj: the rotation of one pair, one expression
 *     each, so both kernels round (and contract to FMA) identically.
 * P is any parameter struct with the fields theta, l3_factor, l3_low, l3_high,
 * l3_orig, rotary_dim, half and inv_freq[kRopeMaxHalfByValue].
 */
#ifndef OT_CUDA_ROPE_CUH
#define OT_CUDA_ROPE_CUH

#include <stdint.h>

namespace ot {

/* Frequencies passed by value: up to 256 (rd <= 512); larger rd recompute them on the
 * device with the same float64 formula. */
constexpr int kRopeMaxHalfByValue = 256;

template <typename P>
__device__ __forceinline__ double rope_inv_freq_dev(const P &p, int64_t i) {
  /* The same rule as ot_rope_inv_freq (src/core/rope.c). */
  double f = pow(p.theta, -(double)(2 * i) / (double)p.rotary_dim);
  if (p.l3_factor > 0) {
    const double two_pi = 6.283185307179586476925;
    const double wavelen = two_pi / f;
    const double low_wl = p.l3_orig / p.l3_low, high_wl = p.l3_orig / p.l3_high;
    if (wavelen < high_wl) {
    } else if (wavelen > low_wl) {
      f = f / p.l3_factor;
    } else {
      const double smooth = (p.l3_orig / wavelen - p.l3_low) / (p.l3_high - p.l3_low);
      f = (1.0 - smooth) * f / p.l3_factor + smooth * f;
    }
  }
  return f;
}

/* cos and sin of the angle of pair i at position pos (computed, no table). */
template <typename P>
__device__ __forceinline__ void rope_cos_sin(const P &p, int64_t pos, int64_t i, float *c,
                                             float *sn) {
  const double f = p.half <= kRopeMaxHalfByValue ? p.inv_freq[i] : rope_inv_freq_dev(p, i);
  const double two_pi = 6.283185307179586476925, inv_two_pi = 0.15915494309189533577;
  double ang = (double)pos * f;
  ang -= two_pi * rint(ang * inv_two_pi);
  sincosf((float)ang, sn, c);
}

/* NeoX: (x1, x2) = (x[i], x[half + i]); GPT-J: (x[2i], x[2i + 1]). Same formula. The
 * rounding steps are spelled out (a product, then one FMA) so that no kernel's
 * contraction choice can make the two callers differ in the last bit. */
__device__ __forceinline__ void rope_rotate(float x1, float x2, float c, float sn, float *y1,
                                            float *y2) {
  *y1 = __fmaf_rn(x1, c, -__fmul_rn(x2, sn));
  *y2 = __fmaf_rn(x2, c, __fmul_rn(x1, sn));
}

} /* namespace ot */

#endif /* OT_CUDA_ROPE_CUH */
