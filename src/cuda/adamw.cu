/*
 * adamw.cu -- AdamW over many tensors in few launches (multi-tensor apply).
 *
 * The host cuts every tensor into chunks of kAdamwChunk elements and packs a launch
 * table (passed by value as the kernel's argument, under the classic 4 KB parameter
 * limit): up to kAdamwTensors tensors (their five pointers, numel, a 16-byte alignment
 * flag) and up to kAdamwBlocks (tensor slot, chunk index) entries, one CUDA block per
 * entry. A table is launched when either list is full; a tensor whose chunks do not fit
 * continues in the next table. 0.5 B parameters in chunks of 64K elements are ~7.6K
 * blocks, ~17 launches; a list of many small tensors (norm weights, biases) takes one
 * launch per kAdamwTensors tensors.
 *
 * Per element the update of src/cpu/adamw.c (adamw_update), in float32, with the
 * hyperparameters the core derived in float64 (decay, step size, sqrt of the second
 * bias correction). adamw_kernel takes W elements a thread at a time with one vector access
 * per tensor when every pointer of the tensor is 16-byte aligned; otherwise, and for the
 * tail of a tensor, one at a time with the same arithmetic (the same bits either way).
 *
 * The default (since 2026-12-01 evening, "fast"): W = 8, eight elements a thread
 * (16-byte loads for 16-bit dtypes, two for float32), each launch a whole number of resident waves (396
 * blocks on the H200), with PTX sqrt.approx / div.approx (one MUFU each, relative error
 * ~2^-22) and the division by the second bias correction's square root as a product by its
 * reciprocal: results within a few float32 ulps of the IEEE update (tests/cases_adamw.c:
 * the float64 reference's tolerances, and bit for bit against "fast" by name) -- 2^16
 * times below a bf16 parameter's own rounding. OT_ADAMW_IMPL (read per call;
 * docs/ENVIRONMENT.md): "exact" (or "v8", the default before) the same W = 8 kernel
 * with IEEE square root and divisions, torch's fused AdamW's operations; "v4" W = 4 with
 * 448 blocks a launch (the bits of "exact"). AdamW alone over the 1.5 B model's 147
 * tensors (bf16 parameters, gradients and moments): "fast" 5.58 ms (3.76 TB/s), "exact"
 * 5.87 (3.58), "v4" 7.45 (2.81), torch's fused 7.77 (2.70); in the compiled training step
 * "fast" over "exact" measured 1.007-1.011x at 1.5 B and 0.998-1.022x at 0.54 B (four
 * interleaved calls, docs/PERFORMANCE.md). sm_90a, bf16 parameters, gradients and
 * moments: v4's aligned loop is 261 instructions for four elements (65 an element: each
 * sqrtf and the two IEEE divisions are a MUFU, a Newton step and a test for the slow
 * path), "exact" 501 for eight (63), "fast" 173 for eight (22); registers 39 (v4), 56
 * ("exact"), 40 ("fast": 3 blocks an SM).
 */
#include <stdlib.h>

#include "../core/adamw.h"
#include "common.cuh"
#include "cuda_state.h"

namespace ot {

constexpr int kAdamwTensors = 32;
constexpr int kAdamwBlocks = 448;
constexpr int64_t kAdamwChunk = (int64_t)1 << 16;
constexpr int kAdamwThreads = 512;

struct adamw_table {
  void *param[kAdamwTensors];
  const void *grad[kAdamwTensors];
  void *m[kAdamwTensors];
  void *v[kAdamwTensors];
  float *master[kAdamwTensors];
  int64_t numel[kAdamwTensors];
  int32_t chunk[kAdamwBlocks];
  uint8_t tensor[kAdamwBlocks];
  uint8_t aligned[kAdamwTensors];
};
static_assert(sizeof(adamw_table) + 64 <= 4096, "kernel parameter limit");

struct adamw_hyper {
  float beta1, beta2, eps, decay, step_size, bc2_sqrt;
};

/* Four elements at p (aligned to 4 elements) as float32, and back. */
template <typename T> struct vec4_of;
template <> struct vec4_of<float> { using type = float4; };
template <> struct vec4_of<__half> { using type = uint2; };
template <> struct vec4_of<__nv_bfloat16> { using type = uint2; };

template <typename T>
__device__ __forceinline__ void load4(float *f, const T *p) {
  typename vec4_of<T>::type r = *reinterpret_cast<const typename vec4_of<T>::type *>(p);
  const T *e = reinterpret_cast<const T *>(&r);
#pragma unroll
  for (int i = 0; i < 4; i++) f[i] = to_f32(e[i]);
}
template <typename T>
__device__ __forceinline__ void store4(T *p, const float *f) {
  typename vec4_of<T>::type r;
  T *e = reinterpret_cast<T *>(&r);
#pragma unroll
  for (int i = 0; i < 4; i++) e[i] = from_f32<T>(f[i]);
  *reinterpret_cast<typename vec4_of<T>::type *>(p) = r;
}

__device__ __forceinline__ void adamw_update(float &w, float &m, float &v, float g,
                                             const adamw_hyper &h) {
  const float ww = w * h.decay;
  /* The moments' fused multiply-adds written out: left to contraction, the compiler chose
   * them differently where this is inlined in the vector body and in adamw_elem, so an
   * element's bits depended on whether it sat in a tensor's ragged tail (found on the GPU:
   * "v8", whose tails are longer, differed from the default in the last bit). These are the
   * vector body's choices, whose SASS stays as it was. */
  const float mm = fmaf(1.0f - h.beta1, g, h.beta1 * m);
  const float vv = fmaf(g, (1.0f - h.beta2) * g, h.beta2 * v);
  const float denom = sqrtf(vv) / h.bc2_sqrt + h.eps;
  w = ww - h.step_size * (mm / denom);
  m = mm;
  v = vv;
}

/* Element j, one at a time (unaligned tensors and the ragged tail of aligned ones). */
template <typename P, typename G, typename S, bool MASTER>
__device__ __forceinline__ void adamw_elem(P *param, const G *grad, S *m, S *v, float *master,
                                           int64_t j, const adamw_hyper &h) {
  float w = MASTER ? master[j] : to_f32(param[j]);
  float mm = to_f32(m[j]), vv = to_f32(v[j]);
  adamw_update(w, mm, vv, to_f32(grad[j]), h);
  m[j] = from_f32<S>(mm);
  v[j] = from_f32<S>(vv);
  if (MASTER) master[j] = w;
  param[j] = from_f32<P>(w);
}

/* adamw_update with approximate square root and division (PTX sqrt.approx / div.approx:
 * one MUFU each, no slow path; relative error ~2^-22) and the division by the second
 * bias correction's square root as a product by its reciprocal (inv_bc2). */
__device__ __forceinline__ void adamw_update_fast(float &w, float &m, float &v, float g,
                                                  const adamw_hyper &h, float inv_bc2) {
  const float ww = w * h.decay;
  const float mm = fmaf(1.0f - h.beta1, g, h.beta1 * m); /* (as adamw_update) */
  const float vv = fmaf(g, (1.0f - h.beta2) * g, h.beta2 * v);
  float root, q;
  asm("sqrt.approx.ftz.f32 %0, %1;" : "=f"(root) : "f"(vv));
  const float denom = fmaf(root, inv_bc2, h.eps);
  asm("div.approx.ftz.f32 %0, %1, %2;" : "=f"(q) : "f"(mm), "f"(denom));
  w = ww - h.step_size * q;
  m = mm;
  v = vv;
}

/* W (4 or 8) elements at p (aligned to W elements) as float32, and back: eight 16-bit
 * elements as one 16-byte vector (common.cuh's load_vec / store_vec), otherwise groups of
 * four (load4 / store4: 16 bytes of float32, 8 of a 16-bit type). */
template <int W, typename T>
__device__ __forceinline__ void load_w(float *f, const T *p) {
  if constexpr (W == 8 && sizeof(T) == 2) {
    load_vec(f, p);
  } else {
#pragma unroll
    for (int k = 0; k < W; k += 4) load4(f + k, p + k);
  }
}
template <int W, typename T>
__device__ __forceinline__ void store_w(T *p, const float *f) {
  if constexpr (W == 8 && sizeof(T) == 2) {
    store_vec(p, f);
  } else {
#pragma unroll
    for (int k = 0; k < W; k += 4) store4(p + k, f + k);
  }
}

/* One chunk of one tensor a block, W elements a thread a pass with one vector access per
 * tensor when every pointer of the tensor is aligned (tab.aligned); unaligned tensors, and
 * the ragged tail (< W elements, only at a tensor's end: the thread whose group straddles
 * it), one element at a time with the IEEE arithmetic (under "fast" too: a handful of
 * elements a tensor). W = 8, FAST true: "fast", the default (OT_ADAMW_IMPL unset); W = 8,
 * FAST false: "exact" / "v8"; W = 4, FAST false: "v4", the same bits as "exact". The W = 8
 * kernels launch a whole number of resident waves at a time (ot_cuda_adamw_step's cap). */
template <typename P, typename G, typename S, bool MASTER, int W, bool FAST>
__global__ void __launch_bounds__(kAdamwThreads) adamw_kernel(adamw_table tab, adamw_hyper h) {
  const int t = tab.tensor[blockIdx.x];
  const int64_t n = tab.numel[t];
  const int64_t start = (int64_t)tab.chunk[blockIdx.x] * kAdamwChunk;
  const int64_t end = start + kAdamwChunk < n ? start + kAdamwChunk : n;
  P *param = static_cast<P *>(tab.param[t]);
  const G *grad = static_cast<const G *>(tab.grad[t]);
  S *m = static_cast<S *>(tab.m[t]);
  S *v = static_cast<S *>(tab.v[t]);
  float *master = tab.master[t];
  const float inv_bc2 = FAST ? 1.0f / h.bc2_sqrt : 0.0f;
  int64_t i = start + (int64_t)threadIdx.x * W;
  if (tab.aligned[t]) {
    for (; i + W <= end; i += (int64_t)blockDim.x * W) {
      float w[W], g[W], mm[W], vv[W];
      if (MASTER) load_w<W>(w, master + i);
      else load_w<W>(w, param + i);
      load_w<W>(g, grad + i);
      load_w<W>(mm, m + i);
      load_w<W>(vv, v + i);
#pragma unroll
      for (int k = 0; k < W; k++) {
        if (FAST) adamw_update_fast(w[k], mm[k], vv[k], g[k], h, inv_bc2);
        else adamw_update(w[k], mm[k], vv[k], g[k], h);
      }
      store_w<W>(m + i, mm);
      store_w<W>(v + i, vv);
      if (MASTER) store_w<W>(master + i, w);
      store_w<W>(param + i, w);
    }
    if (i < end) {
      for (int64_t j = i; j < end; j++)
        adamw_elem<P, G, S, MASTER>(param, grad, m, v, master, j, h);
    }
    return;
  }
  for (int64_t j = start + threadIdx.x; j < end; j += blockDim.x)
    adamw_elem<P, G, S, MASTER>(param, grad, m, v, master, j, h);
}

typedef void (*adamw_fn)(adamw_table, adamw_hyper);

/* OT_ADAMW_IMPL: 2 "fast" (the default: unset, empty or any other value), 1 "exact" / "v8"
 * (W = 8, IEEE arithmetic), 0 "v4" (W = 4, IEEE arithmetic). */
static int adamw_impl(void) {
  const char *e = getenv("OT_ADAMW_IMPL");
  if (!e) return 2;
  return strcmp(e, "v4") == 0                                  ? 0
         : strcmp(e, "exact") == 0 || strcmp(e, "v8") == 0 ? 1
                                                               : 2;
}

template <typename P, typename G, typename S, bool MASTER>
static adamw_fn pick_impl(int impl) {
  return impl == 1   ? adamw_kernel<P, G, S, MASTER, 8, false>
         : impl == 2 ? adamw_kernel<P, G, S, MASTER, 8, true>
                     : adamw_kernel<P, G, S, MASTER, 4, false>;
}

template <typename P, typename G, typename S>
static adamw_fn pick_master(bool master, int impl) {
  return master ? pick_impl<P, G, S, true>(impl) : pick_impl<P, G, S, false>(impl);
}
template <typename P, typename G>
static adamw_fn pick_state(bool s32, bool master, int impl) {
  return s32 ? pick_master<P, G, float>(master, impl) : pick_master<P, G, P>(master, impl);
}
template <typename P>
static adamw_fn pick_grad(bool g32, bool s32, bool master, int impl) {
  return g32 ? pick_state<P, float>(s32, master, impl) : pick_state<P, P>(s32, master, impl);
}

static bool aligned16(const void *p) { return ((uintptr_t)p & 15u) == 0; }

} /* namespace ot */

extern "C" ot_status ot_cuda_adamw_step(ot_context *ctx, const ot_adamw_args *a) {
  static const char op[] = "ot_adamw_step";
  using namespace ot;
  const bool g32 = a->grad_dtype == OT_F32, s32 = a->state_dtype == OT_F32;
  const int impl = adamw_impl();
  adamw_fn fn;
  switch (a->param_dtype) {
    case OT_F32: fn = pick_grad<float>(true, true, a->has_master, impl); break;
    case OT_F16: fn = pick_grad<__half>(g32, s32, a->has_master, impl); break;
    case OT_BF16: fn = pick_grad<__nv_bfloat16>(g32, s32, a->has_master, impl); break;
    default: return ot_error(OT_ERR_INTERNAL, op, "unexpected dtype %d", (int)a->param_dtype);
  }
  adamw_hyper h = {a->beta1, a->beta2, a->eps, a->decay, a->step_size, a->bc2_sqrt};
  cudaStream_t st = (cudaStream_t)ctx->stream;
  /* Blocks a launch: for "v4" kAdamwBlocks (448: on the H200, 3 resident blocks of 512
   * threads per SM -- 39-44 registers -- hold 396, so each launch ends in a second wave of
   * 52 blocks); for the W = 8 kernels a whole number of the resident blocks instead, where
   * that is at most kAdamwBlocks (else kAdamwBlocks, all resident). */
  int cap = kAdamwBlocks;
  if (impl != 0) {
    const ot_cuda_state *cs = ot_cuda_state_of(ctx);
    int per_sm = 0;
    if (cs && cs->sm_count > 0) {
      if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, fn, kAdamwThreads, 0) !=
          cudaSuccess) {
        per_sm = 0;
        (void)cudaGetLastError(); /* (this query's error only: keep the 448 blocks) */
      }
      const int resident = per_sm * cs->sm_count;
      if (per_sm > 0 && resident < kAdamwBlocks) cap = resident * (kAdamwBlocks / resident);
    }
  }
  adamw_table tab;
  memset(&tab, 0, sizeof tab);
  int nt = 0, nb = 0;
  for (int i = 0; i < a->n; i++) {
    const ot_adamw_tensor *t = &a->tensors[i];
    if (t->numel == 0) continue;
    const int64_t chunks = (t->numel + kAdamwChunk - 1) / kAdamwChunk;
    for (int64_t c = 0; c < chunks; c++) {
      if (c == 0 || nt == 0) { /* (re)enter the tensor into the table */
        if (nt == kAdamwTensors) {
          fn<<<nb, kAdamwThreads, 0, st>>>(tab, h);
          OT_CUDA_CHECK_LAUNCH(op);
          nt = nb = 0;
        }
        tab.param[nt] = t->param;
        tab.grad[nt] = t->grad;
        tab.m[nt] = t->exp_avg;
        tab.v[nt] = t->exp_avg_sq;
        tab.master[nt] = t->master;
        tab.numel[nt] = t->numel;
        tab.aligned[nt] = aligned16(t->param) && aligned16(t->grad) && aligned16(t->exp_avg) &&
                          aligned16(t->exp_avg_sq) && (!t->master || aligned16(t->master));
        nt++;
      }
      tab.tensor[nb] = (uint8_t)(nt - 1);
      tab.chunk[nb] = (int32_t)c;
      nb++;
      if (nb == cap) {
        fn<<<nb, kAdamwThreads, 0, st>>>(tab, h);
        OT_CUDA_CHECK_LAUNCH(op);
        nb = 0;
        nt = 0; /* the current tensor re-enters at slot 0 if it has chunks left */
      }
    }
  }
  if (nb > 0) {
    fn<<<nb, kAdamwThreads, 0, st>>>(tab, h);
    OT_CUDA_CHECK_LAUNCH(op);
  }
  return OT_OK;
}
