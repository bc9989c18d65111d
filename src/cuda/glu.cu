/*
 * glu.cu -- gated activations on CUDA: SwiGLU, GeGLU (erf) and GeGLU (tanh), forward
 * and backward, elementwise over rows of F features.
 *
 *   forward:  out = act(gate) * up
 *   backward: dgate = dout * up * act'(gate),  dup = dout * act(gate)
 *             (+ out = act(gate) * up, bit for bit the forward's: ot_glu_backward_recompute)
 *
 * A block covers one chunk of TPB x UN 16-byte vectors (TPB threads x UN vectors, all
 * loads issued before the math; the forward 128 x 1, the backward 256 x 2) of one row;
 * the grid is rows x chunks, so strided rows and the fused [.., 2F] layout (up = gate +
 * F) cost nothing extra; contiguous rows are taken as one row (no partly empty chunk at
 * each row's end). Rows that are not 16-byte aligned, or F not a multiple of the vector
 * width, take the scalar instantiation. In-place (dgate == gate, dup == up) is safe:
 * every element is read and written by the same thread.
 *
 * SwiGLU uses the approximate exp and division (see silu): with expf and the IEEE
 * division this kernel measured 85% / 88% of copy bandwidth (run of d2db26c), with the
 * approximate ones 94% / 98% (H200, 16k x 4096 / 8192 bf16, run of 0168742: 4.03 /
 * 4.18 TB/s, copy 4.28; torch.compile 4.26 / 4.33). A forward v2 (glu_fwd_v2_kernel:
 * the narrowest block of 64 / 128 / 256 threads covering the row with kGluV2NV = 4
 * vectors of gate and of up per thread, all loaded raw before the math) measured
 * slower in the same run (3.85 / 3.93 TB/s), so it is opt-in (OT_GLU_FWD_IMPL=v2),
 * kept as the benchmark's variant. The backward's sigmoid took expf and the IEEE
 * division until the run of 2026-11-30 15:44 UTC: 3.97 / 3.87 TB/s (16k x 4096 / 8k x 5632)
 * against 4.18 / 4.12 with the approximate ones. The block shapes: kGluFwdThreads.
 */
#include <stdlib.h>

#include "../core/glu.h"
#include "common.cuh"

namespace ot {

/* Block shapes of glu_kernel: threads x 16-byte vectors per thread (all loaded before the
 * math). Measured (H200, bf16, run of 2026-11-30 15:44 UTC, same process; TB/s at 16k x 4096 /
 * the 0.54 B model's 8k x 5632): the forward in blocks of 128 threads x 1 vector 4.23 /
 * 4.15 against 4.07 / 3.98 for 256 x 2 (48 registers, 5 blocks = 40 warps per SM);
 * torch.compile's fused silu(g) * u 4.18 at 8k x 5632. The backward the other way: 256 x
 * 2 4.18 / 4.12 against 3.92 / 3.87 for 128 x 1 (inductor's compiled backward 4.19). */
constexpr int kGluFwdThreads = 128, kGluFwdUnroll = 1;
constexpr int kGluBwdThreads = 256, kGluBwdUnroll = 2;

/* OT_GLU_FWD_IMPL=v2: the forward v2 below (kept for the benchmark's comparison; the
 * default is glu_kernel, measured faster). */
static inline bool glu_env_v2() {
  const char *s = getenv("OT_GLU_FWD_IMPL");
  return s && s[0] == 'v' && s[1] == '2' && !s[2];
}

struct glu_params {
  int64_t rows, F;
  const void *a;    /* forward: gate; backward: dout */
  const void *b;    /* forward: up;   backward: gate */
  const void *c;    /* backward: up */
  void *o1;         /* forward: out;  backward: dgate */
  void *o2;         /* backward: dup */
  int64_t sa, sb, sc, so1, so2;
  int64_t chunks;   /* chunks per row */
  void *o3;         /* backward with the recompute (ot_glu_backward_recompute): out */
  int64_t so3;
};

__device__ __forceinline__ float gelu_erf(float g) {
  return 0.5f * g * (1.0f + erff(g * 0.70710678118654752f));
}
__device__ __forceinline__ float gelu_tanh(float g) {
  const float k = 0.79788456080286536f; /* sqrt(2/pi) */
  return 0.5f * g * (1.0f + tanhf(k * (g + 0.044715f * g * g * g)));
}
/* Forward SwiGLU: ex2.approx-based exp and an approximate division (about 2 ulp each;
 * g < -88 gives exactly -0 where the true value is below 1e-36). The IEEE division and
 * expf cost ~30 instructions per element, which made the forward compute-bound at ~85%
 * of copy bandwidth on the H200 (bf16: 6 bytes per element). */
__device__ __forceinline__ float silu(float g) { return __fdividef(g, 1.0f + __expf(-g)); }

template <ot_glu_kind K> __device__ __forceinline__ float act(float g) {
  if (K == OT_GLU_SWIGLU) return silu(g);
  if (K == OT_GLU_GEGLU) return gelu_erf(g);
  return gelu_tanh(g);
}

/* act(g) and act'(g) together. SwiGLU's sigmoid takes the forward's approximate exp and
 * an approximate reciprocal (g < -88: exp overflows to inf and s is exactly 0); expf and
 * the IEEE division cost ~30 instructions per element here too. */
template <ot_glu_kind K> __device__ __forceinline__ float2 act_and_grad(float g) {
  if (K == OT_GLU_SWIGLU) {
    const float s = __fdividef(1.0f, 1.0f + __expf(-g));
    return make_float2(g * s, s * (1.0f + g * (1.0f - s)));
  }
  if (K == OT_GLU_GEGLU) {
    const float cdf = 0.5f * (1.0f + erff(g * 0.70710678118654752f));
    const float pdf = 0.39894228040143268f * expf(-0.5f * g * g);
    return make_float2(g * cdf, cdf + g * pdf);
  }
  const float k = 0.79788456080286536f, c = 0.044715f;
  const float t = tanhf(k * (g + c * g * g * g));
  return make_float2(0.5f * g * (1.0f + t),
                     0.5f * (1.0f + t) + 0.5f * g * (1.0f - t * t) * k * (1.0f + 3.0f * c * g * g));
}

/* The minimum of blocks per SM: 1 for the forward, none (0) for the backward -- the code
 * the run of 2026-11-30 15:44 UTC timed (ptxas schedules the two differently). OUT (the
 * backward only): also out = act(gate) * up, computed as the forward computes it (act<K>,
 * not act_and_grad's product: the forward's bits). */
template <typename T, ot_glu_kind K, bool VEC, bool BACKWARD, int TPB, int UN, bool OUT = false>
__global__ void __launch_bounds__(TPB, BACKWARD ? 0 : 1) glu_kernel(const glu_params p) {
  constexpr int V = vec_width<T>::value;
  const int64_t row = blockIdx.x / p.chunks;
  const int64_t chunk = blockIdx.x - row * p.chunks;
  const int64_t n = p.F;
  const T *A = static_cast<const T *>(p.a) + row * p.sa;
  const T *B = static_cast<const T *>(p.b) + row * p.sb;
  const T *C = BACKWARD ? static_cast<const T *>(p.c) + row * p.sc : nullptr;
  T *O1 = static_cast<T *>(p.o1) + row * p.so1;
  T *O2 = BACKWARD ? static_cast<T *>(p.o2) + row * p.so2 : nullptr;
  T *O3 = OUT ? static_cast<T *>(p.o3) + row * p.so3 : nullptr;

  float a[UN][V], b[UN][V], c[UN][V];
  int64_t base[UN];
#pragma unroll
  for (int u = 0; u < UN; u++) {
    base[u] = ((chunk * UN + u) * TPB + threadIdx.x) * (int64_t)V;
    if (base[u] < n) {
      load_row_vec<T, VEC>(a[u], A, base[u], n);
      load_row_vec<T, VEC>(b[u], B, base[u], n);
      if (BACKWARD) load_row_vec<T, VEC>(c[u], C, base[u], n);
    }
  }
#pragma unroll
  for (int u = 0; u < UN; u++) {
    if (base[u] >= n) continue;
    if (!BACKWARD) {
      float o[V];
#pragma unroll
      for (int j = 0; j < V; j++) o[j] = act<K>(a[u][j]) * b[u][j];
      store_row_vec<T, VEC>(O1, base[u], n, o);
    } else {
      /* a = dout, b = gate, c = up */
      float dg[V], du[V];
#pragma unroll
      for (int j = 0; j < V; j++) {
        const float2 ag = act_and_grad<K>(b[u][j]);
        dg[j] = a[u][j] * c[u][j] * ag.y;
        du[j] = a[u][j] * ag.x;
      }
      store_row_vec<T, VEC>(O1, base[u], n, dg);
      store_row_vec<T, VEC>(O2, base[u], n, du);
      if (OUT) {
        float o[V];
#pragma unroll
        for (int j = 0; j < V; j++) o[j] = act<K>(b[u][j]) * c[u][j];
        store_row_vec<T, VEC>(O3, base[u], n, o);
      }
    }
  }
}

/* Forward v2, aligned rows (every row 16-byte aligned, F % VEC == 0): a block of TPB
 * threads covers TPB * kGluV2NV vectors of one row; each thread issues its kGluV2NV
 * vectors of gate and of up (2 * kGluV2NV 16-byte loads in flight, evict-first) before
 * any math, with compile-time strides (one address register plus immediates). */
constexpr int kGluV2NV = 4;

__device__ __forceinline__ void glu_opaque(raw16 &r) {
  asm volatile("" : "+r"(r.u.x), "+r"(r.u.y), "+r"(r.u.z), "+r"(r.u.w));
}

template <typename T, ot_glu_kind K, int TPB>
__global__ void __launch_bounds__(TPB, 1024 / TPB) glu_fwd_v2_kernel(const glu_params p) {
  constexpr int V = vec_width<T>::value;
  constexpr int CH = TPB * kGluV2NV; /* vectors per chunk */
  const int64_t row = blockIdx.x / p.chunks;
  const int64_t chunk = blockIdx.x - row * p.chunks;
  const int64_t nvec = p.F / V;
  const int64_t first = chunk * CH + threadIdx.x;
  const T *A = static_cast<const T *>(p.a) + row * p.sa + first * V;
  const T *B = static_cast<const T *>(p.b) + row * p.sb + first * V;
  T *O = static_cast<T *>(p.o1) + row * p.so1 + first * V;
  const int64_t left = nvec - first; /* vectors i * TPB < left are in the row */
  raw16 a[kGluV2NV], b[kGluV2NV];
#pragma unroll
  for (int i = 0; i < kGluV2NV; i++) {
    const bool in = (int64_t)i * TPB < left;
    load_raw<T, true, true>(a[i], A, (int64_t)i * TPB * V, 0, in);
    load_raw<T, true, true>(b[i], B, (int64_t)i * TPB * V, 0, in);
  }
#pragma unroll
  for (int i = 0; i < kGluV2NV; i++) {
    if ((int64_t)i * TPB >= left) continue;
    float av[V], bv[V];
    glu_opaque(a[i]); /* keeps the unpack here: one vector's floats live at a time */
    glu_opaque(b[i]);
    unpack<T>(av, a[i]);
    unpack<T>(bv, b[i]);
#pragma unroll
    for (int j = 0; j < V; j++) av[j] = act<K>(av[j]) * bv[j];
    raw16 o;
    pack<T>(o, av);
    __stcs(reinterpret_cast<uint4 *>(O + (int64_t)i * TPB * V), o.u);
  }
}

template <typename T>
static cudaError_t glu_fwd_v2_launch(glu_params p, ot_glu_kind kind, cudaStream_t stream) {
  constexpr int V = vec_width<T>::value;
  const int64_t nvec = p.F / V;
  /* the narrowest block (64..256 threads) whose kGluV2NV vectors per thread cover the
   * row, else 256 and several chunks per row */
  int tpb = 64;
  while (tpb < 256 && (int64_t)tpb * kGluV2NV < nvec) tpb *= 2;
  const int64_t per_chunk = (int64_t)tpb * kGluV2NV;
  p.chunks = (nvec + per_chunk - 1) / per_chunk;
  const int64_t blocks = p.rows * p.chunks;
  if (blocks > 0x7fffffff) return cudaErrorInvalidConfiguration;
  const dim3 g((unsigned)blocks);
#define OT_GLU_V2(K)                                                                     \
  switch (tpb) {                                                                         \
    case 64: glu_fwd_v2_kernel<T, K, 64><<<g, 64, 0, stream>>>(p); break;                \
    case 128: glu_fwd_v2_kernel<T, K, 128><<<g, 128, 0, stream>>>(p); break;             \
    default: glu_fwd_v2_kernel<T, K, 256><<<g, 256, 0, stream>>>(p); break;              \
  }
  switch (kind) {
    case OT_GLU_SWIGLU: OT_GLU_V2(OT_GLU_SWIGLU) break;
    case OT_GLU_GEGLU: OT_GLU_V2(OT_GLU_GEGLU) break;
    default: OT_GLU_V2(OT_GLU_GEGLU_TANH) break;
  }
#undef OT_GLU_V2
  return cudaGetLastError();
}

template <typename T, bool BACKWARD>
static cudaError_t glu_launch(glu_params p, ot_glu_kind kind, bool vec, cudaStream_t stream) {
  if (p.rows == 0 || p.F == 0) return cudaSuccess;
  if (!BACKWARD && vec && glu_env_v2()) return glu_fwd_v2_launch<T>(p, kind, stream);
  constexpr int V = vec_width<T>::value;
  constexpr int TPB = BACKWARD ? kGluBwdThreads : kGluFwdThreads;
  constexpr int UN = BACKWARD ? kGluBwdUnroll : kGluFwdUnroll;
  /* Contiguous rows (every stride == F, 16-byte vectors): one row of rows x F, so that
   * no block covers a partly empty chunk at a row's end (F = 5632 bf16, the 0.54 B
   * model's MLP: chunks of 4096, the second 37% full, 69% of the grid's thread slots
   * busy). Elementwise: the same values. */
  if (vec && p.rows > 1 && p.sa == p.F && p.sb == p.F && p.so1 == p.F &&
      (!BACKWARD || (p.sc == p.F && p.so2 == p.F && (!p.o3 || p.so3 == p.F)))) {
    p.F *= p.rows;
    p.rows = 1;
  }
  const int64_t per_chunk = (int64_t)TPB * UN * V;
  p.chunks = (p.F + per_chunk - 1) / per_chunk;
  const int64_t blocks = p.rows * p.chunks;
  if (blocks > 0x7fffffff) return cudaErrorInvalidConfiguration;
  const dim3 g((unsigned)blocks), b(TPB);
  /* the recompute's instances (OUT) only in the backward: OUT = BACKWARD there, so the
   * forward instantiates nothing new */
#define OT_GLU_RUN(K)                                                                   \
  if (BACKWARD && p.o3) {                                                               \
    if (vec) glu_kernel<T, K, true, BACKWARD, TPB, UN, BACKWARD><<<g, b, 0, stream>>>(p); \
    else glu_kernel<T, K, false, BACKWARD, TPB, UN, BACKWARD><<<g, b, 0, stream>>>(p);    \
  } else if (vec) glu_kernel<T, K, true, BACKWARD, TPB, UN><<<g, b, 0, stream>>>(p);     \
  else glu_kernel<T, K, false, BACKWARD, TPB, UN><<<g, b, 0, stream>>>(p);
  switch (kind) {
    case OT_GLU_SWIGLU: OT_GLU_RUN(OT_GLU_SWIGLU) break;
    case OT_GLU_GEGLU: OT_GLU_RUN(OT_GLU_GEGLU) break;
    default: OT_GLU_RUN(OT_GLU_GEGLU_TANH) break;
  }
#undef OT_GLU_RUN
  return cudaGetLastError();
}

template <bool BACKWARD>
static ot_status glu_dispatch(const char *op, ot_context *ctx, ot_dtype dtype, ot_glu_kind kind,
                              const glu_params &p) {
  const size_t es = ot_dtype_size(dtype);
  const int64_t V = 16 / (int64_t)es;
  bool vec = p.F % V == 0 && ot_rows_aligned16(p.a, p.sa, es, p.rows) &&
             ot_rows_aligned16(p.b, p.sb, es, p.rows) && ot_rows_aligned16(p.o1, p.so1, es, p.rows);
  if (BACKWARD)
    vec = vec && ot_rows_aligned16(p.c, p.sc, es, p.rows) &&
          ot_rows_aligned16(p.o2, p.so2, es, p.rows) &&
          (!p.o3 || ot_rows_aligned16(p.o3, p.so3, es, p.rows));
  cudaStream_t s = static_cast<cudaStream_t>(ctx->stream);
  cudaError_t e;
  switch (dtype) {
    case OT_F32: e = glu_launch<float, BACKWARD>(p, kind, vec, s); break;
    case OT_F16: e = glu_launch<__half, BACKWARD>(p, kind, vec, s); break;
    case OT_BF16: e = glu_launch<__nv_bfloat16, BACKWARD>(p, kind, vec, s); break;
    default: return ot_error(OT_ERR_INTERNAL, op, "unexpected storage dtype %d", (int)dtype);
  }
  if (e != cudaSuccess) {
    (void)cudaGetLastError();
    return ot_error(OT_ERR_BACKEND, op, "CUDA: %s", cudaGetErrorString(e));
  }
  return OT_OK;
}

} /* namespace ot */

extern "C" ot_status ot_cuda_glu_forward(ot_context *ctx, const ot_glu_forward_args *a) {
  ot::glu_params p;
  memset(&p, 0, sizeof p);
  p.rows = a->rows;
  p.F = a->F;
  p.a = a->gate;
  p.sa = a->gate_stride;
  p.b = a->up;
  p.sb = a->up_stride;
  p.o1 = a->out;
  p.so1 = a->out_stride;
  return ot::glu_dispatch<false>("ot_glu_forward", ctx, a->dtype, a->kind, p);
}

extern "C" ot_status ot_cuda_glu_backward(ot_context *ctx, const ot_glu_backward_args *a) {
  ot::glu_params p;
  memset(&p, 0, sizeof p);
  p.rows = a->rows;
  p.F = a->F;
  p.a = a->dout;
  p.sa = a->dout_stride;
  p.b = a->gate;
  p.sb = a->gate_stride;
  p.c = a->up;
  p.sc = a->up_stride;
  p.o1 = a->dgate;
  p.so1 = a->dgate_stride;
  p.o2 = a->dup;
  p.so2 = a->dup_stride;
  p.o3 = a->out;
  p.so3 = a->out_stride;
  return ot::glu_dispatch<true>(a->out ? "ot_glu_backward_recompute" : "ot_glu_backward", ctx,
                                a->dtype, a->kind, p);
}
