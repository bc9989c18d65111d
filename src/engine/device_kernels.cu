/* device_kernels.cu -- the kernels of the engine that are not library ops: the
 * embedding lookup with the token ids in device memory (so that the decode step,
 * embedding included, is one CUDA graph whose only inputs are device buffers refreshed
 * before each replay), a row argmax (greedy decoding downloads one id per sequence
 * instead of the float logits), the random weights, and the fused decode products (norm or
 * SwiGLU inside the matrix-vector product, one sequence). Compiled only with the CUDA
 * backend. */
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* One block per row; 16-byte copies when the row allows (it does for every dtype with
 * hidden % 8 == 0). */
__global__ void ote_embed_kernel(char *dst, const char *table, const int32_t *ids,
                                 size_t row_bytes) {
  const char *src = table + (size_t)ids[blockIdx.x] * row_bytes;
  char *out = dst + (size_t)blockIdx.x * row_bytes;
  if (row_bytes % 16 == 0 && ((uintptr_t)src % 16 == 0) && ((uintptr_t)out % 16 == 0)) {
    for (size_t i = threadIdx.x; i < row_bytes / 16; i += blockDim.x)
      reinterpret_cast<uint4 *>(out)[i] = reinterpret_cast<const uint4 *>(src)[i];
  } else {
    for (size_t i = threadIdx.x; i < row_bytes; i += blockDim.x) out[i] = src[i];
  }
}

template <typename T>
__device__ __forceinline__ float ote_to_f(T x);
template <>
__device__ __forceinline__ float ote_to_f<float>(float x) { return x; }
template <>
__device__ __forceinline__ float ote_to_f<__half>(__half x) { return __half2float(x); }
template <>
__device__ __forceinline__ float ote_to_f<__nv_bfloat16>(__nv_bfloat16 x) {
  return __bfloat162float(x);
}

/* One block of 1024 threads per row: the largest value, ties to the lowest index (the
 * host sampler's rule). NaN compares false and is never chosen over a number. */
template <typename T>
__global__ void ote_argmax_kernel(int32_t *out, const T *logits, int vocab) {
  const T *row = logits + (size_t)blockIdx.x * (size_t)vocab;
  float best = -INFINITY;
  int idx = vocab; /* vocab: none seen yet */
  for (int i = threadIdx.x; i < vocab; i += blockDim.x) {
    float v = ote_to_f<T>(row[i]);
    if (v > best || (idx == vocab && v == best)) best = v, idx = i;
  }
  __shared__ float sv[32];
  __shared__ int si[32];
  for (int off = 16; off > 0; off >>= 1) {
    float ov = __shfl_down_sync(0xffffffffu, best, off);
    int oi = __shfl_down_sync(0xffffffffu, idx, off);
    if (ov > best || (ov == best && oi < idx)) best = ov, idx = oi;
  }
  int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  if (lane == 0) sv[warp] = best, si[warp] = idx;
  __syncthreads();
  if (warp == 0) {
    int nw = blockDim.x / 32;
    best = lane < nw ? sv[lane] : -INFINITY;
    idx = lane < nw ? si[lane] : vocab;
    for (int off = 16; off > 0; off >>= 1) {
      float ov = __shfl_down_sync(0xffffffffu, best, off);
      int oi = __shfl_down_sync(0xffffffffu, idx, off);
      if (ov > best || (ov == best && oi < idx)) best = ov, idx = oi;
    }
    if (lane == 0) out[blockIdx.x] = idx < vocab ? idx : 0;
  }
}

extern "C" int ote_cuda_embed(void *dst, const void *table, const int32_t *ids, int n,
                              size_t row_bytes, void *stream) {
  ote_embed_kernel<<<n, 256, 0, (cudaStream_t)stream>>>((char *)dst, (const char *)table, ids,
                                                        row_bytes);
  return (int)cudaGetLastError();
}

extern "C" int ote_cuda_argmax(int32_t *out, const void *logits, int code, int bits, int n,
                               int vocab, void *stream) {
  cudaStream_t s = (cudaStream_t)stream;
  if (bits == 32)
    ote_argmax_kernel<float><<<n, 1024, 0, s>>>(out, (const float *)logits, vocab);
  else if (code == 4 /* kDLBfloat */)
    ote_argmax_kernel<__nv_bfloat16><<<n, 1024, 0, s>>>(out, (const __nv_bfloat16 *)logits, vocab);
  else
    ote_argmax_kernel<__half><<<n, 1024, 0, s>>>(out, (const __half *)logits, vocab);
  return (int)cudaGetLastError();
}

/* The random weights of weights.c (random_new), computed where they live: element i of
 * chunk ci (chunks of 2^14) is output i + 1 of a splitmix64 stream seeded with
 * seed * 0x100000001b3 ^ (tensor_id << 40) ^ ci; splitmix64's state after k steps is
 * s + k * gamma, so every element is independent and the values equal the host's bit for
 * bit (same double arithmetic, round-to-nearest-even conversions). */
__device__ __forceinline__ uint64_t ote_mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

template <typename T>
__device__ __forceinline__ T ote_from_f(float x);
template <>
__device__ __forceinline__ float ote_from_f<float>(float x) { return x; }
template <>
__device__ __forceinline__ __half ote_from_f<__half>(float x) { return __float2half_rn(x); }
template <>
__device__ __forceinline__ __nv_bfloat16 ote_from_f<__nv_bfloat16>(float x) {
  return __float2bfloat16_rn(x);
}

template <typename T>
__global__ void ote_random_kernel(T *dst, size_t n, uint64_t seed, uint64_t tensor_id, float a,
                                  float constant) {
  const uint64_t gamma = 0x9e3779b97f4a7c15ull;
  for (size_t g = blockIdx.x * (size_t)blockDim.x + threadIdx.x; g < n;
       g += (size_t)gridDim.x * blockDim.x) {
    float v = constant;
    if (a != 0) {
      uint64_t ci = g >> 14, i = g & 16383;
      uint64_t s = seed * 0x100000001b3ull ^ (tensor_id << 40) ^ ci;
      uint64_t r = ote_mix64(s + (i + 2) * gamma);
      double u = (double)(r >> 11) * (1.0 / 9007199254740992.0);
      v = (float)((2.0 * u - 1.0) * (double)a);
    }
    dst[g] = ote_from_f<T>(v);
  }
}

extern "C" int ote_cuda_fill_random(void *dst, size_t n, int code, int bits, uint64_t seed,
                                    uint64_t tensor_id, float a, float constant, void *stream) {
  cudaStream_t s = (cudaStream_t)stream;
  size_t blocks = (n + 255) / 256;
  unsigned grid = (unsigned)(blocks < 65536 * 16 ? blocks : 65536 * 16);
  if (grid == 0) return 0;
  if (bits == 32)
    ote_random_kernel<float><<<grid, 256, 0, s>>>((float *)dst, n, seed, tensor_id, a, constant);
  else if (code == 4 /* kDLBfloat */)
    ote_random_kernel<__nv_bfloat16><<<grid, 256, 0, s>>>((__nv_bfloat16 *)dst, n, seed, tensor_id,
                                                          a, constant);
  else
    ote_random_kernel<__half><<<grid, 256, 0, s>>>((__half *)dst, n, seed, tensor_id, a, constant);
  return (int)cudaGetLastError();
}

/* Profiling (ote_engine_set_profile): hold the stream for `ns` nanoseconds so that the host enqueues
 * a whole forward before the GPU starts it -- the events between the ops then time the
 * kernels back to back, not the host's launch rate. */
__global__ void ote_spin_kernel(long long ns) {
  long long t0 = clock64();
  /* clock64 counts SM cycles: ~2 GHz, so ns * 2 cycles is at least ns nanoseconds */
  while (clock64() - t0 < ns * 2) {
  }
}

extern "C" int ote_cuda_spin(long long ns, void *stream) {
  ote_spin_kernel<<<1, 1, 0, (cudaStream_t)stream>>>(ns);
  return (int)cudaGetLastError();
}

/* ---- decode at one sequence: the norm and SwiGLU fused into the matrix-vector product -----
 * y [N] = W [N, K] x [K] (+ b) for the one token of a batch-1 decode step, with x made
 * inside the kernel from what the previous op left (bf16 / fp16, K a multiple of 8, every
 * pointer 16-byte aligned):
 *   NORM:   h = delta + res (rounded to T; res alone when delta is NULL), x = h * rstd *
 *           gamma rounded to T, rstd = 1 / sqrt(mean(h^2) + eps): ot_rmsnorm_forward with its
 *           fused residual, computed by every block (a row of K elements, from L2); block 0
 *           also stores h into res_out, a buffer no block reads (the engine alternates two
 *           residual buffers), so the qkv / gate_up projection takes the norm's place.
 *   SWIGLU: x = silu(gate) * up rounded to T, from the fused [gate | up] row of 2K elements
 *           (ot_glu_forward's arithmetic): the down projection takes the GLU's place.
 * Block: 8 warps; the prologue writes x into shared memory (K elements), then each warp
 * streams RW rows of W (16-byte ld.global.cs, U = 8 vectors per lane in flight) against it,
 * float32 sums, a warp-shuffle sum, one rounding. Every block recomputes the prologue, so the
 * rows per warp grow with N: about 3 waves of resident blocks (fewer blocks: a smaller
 * re-read of the prologue's input; several waves: the block scheduler evens out the SMs);
 * OTE_DECODE_ROWS=r forces r.
 * At most 64 registers (4 blocks of 8 warps per SM): bytes in flight are what a
 * matrix-vector product needs; the first version (95 registers, 2 blocks per SM, the first
 * W vectors loaded before a PDL wait) read W at about half the bandwidth (run of 9349f37).
 * Launched as an ordinary kernel (PDL measured slower for it in that run). */
namespace {

constexpr int kG1Warps = 8;
constexpr int kG1U = 8;

template <typename T>
__device__ __forceinline__ void g1_unpack(float *f, const uint4 &r) {
  const T *e = reinterpret_cast<const T *>(&r);
#pragma unroll
  for (int i = 0; i < 8; i++) f[i] = ote_to_f<T>(e[i]);
}

template <typename T>
__device__ __forceinline__ uint4 g1_pack(const float *f) {
  uint4 r;
  T *e = reinterpret_cast<T *>(&r);
#pragma unroll
  for (int i = 0; i < 8; i++) e[i] = ote_from_f<T>(f[i]);
  return r;
}

struct g1_args {
  const void *w, *bias; /* [N, K], [N] or NULL */
  void *y;              /* [N] */
  const void *x;        /* SWIGLU: the [2K] gate | up row */
  const void *delta, *res, *gamma; /* NORM: delta may be NULL */
  void *res_out;        /* NORM: h (block 0), or NULL */
  float eps;
  long long N, K;
  int rw; /* rows of W per warp */
};

enum { G1_NORM = 0, G1_SWIGLU = 1 };

template <typename T, int PRO>
__global__ void __launch_bounds__(kG1Warps * 32, 4) ote_gemv1_kernel(const __grid_constant__ g1_args a) {
  extern __shared__ uint4 g1_x[]; /* x as K / 8 vectors of T */
  __shared__ float g1_red[kG1Warps];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, tid = threadIdx.x;
  const long long J = a.K / 8, N = a.N;
  const long long row0 = ((long long)blockIdx.x * kG1Warps + warp) * a.rw;
  const uint4 *w = reinterpret_cast<const uint4 *>(a.w);
  if (PRO == G1_NORM) {
    const uint4 *d = reinterpret_cast<const uint4 *>(a.delta);
    const uint4 *r = reinterpret_cast<const uint4 *>(a.res);
    uint4 *ro = blockIdx.x == 0 ? reinterpret_cast<uint4 *>(a.res_out) : nullptr;
    float ss = 0.0f;
    for (long long j = tid; j < J; j += kG1Warps * 32) {
      float h[8];
      g1_unpack<T>(h, r[j]);
      if (d) {
        float dv[8];
        g1_unpack<T>(dv, d[j]);
#pragma unroll
        for (int i = 0; i < 8; i++) h[i] = h[i] + dv[i];
      }
      const uint4 hv = g1_pack<T>(h); /* the norm is of the stored (rounded) h */
      g1_unpack<T>(h, hv);
#pragma unroll
      for (int i = 0; i < 8; i++) ss += h[i] * h[i];
      g1_x[j] = hv;
      if (ro) ro[j] = hv;
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
    if (lane == 0) g1_red[warp] = ss;
    __syncthreads();
    float tot = 0.0f;
#pragma unroll
    for (int i = 0; i < kG1Warps; i++) tot += g1_red[i];
    const float rstd = 1.0f / sqrtf(tot / (float)a.K + a.eps);
    const uint4 *g = reinterpret_cast<const uint4 *>(a.gamma);
    for (long long j = tid; j < J; j += kG1Warps * 32) { /* the vectors this thread wrote */
      float h[8], gv[8];
      g1_unpack<T>(h, g1_x[j]);
      g1_unpack<T>(gv, g[j]);
#pragma unroll
      for (int i = 0; i < 8; i++) h[i] = h[i] * rstd * gv[i];
      g1_x[j] = g1_pack<T>(h);
    }
  } else {
    const uint4 *gu = reinterpret_cast<const uint4 *>(a.x);
    for (long long j = tid; j < J; j += kG1Warps * 32) {
      float g[8], u[8];
      g1_unpack<T>(g, gu[j]);
      g1_unpack<T>(u, gu[J + j]);
#pragma unroll
      for (int i = 0; i < 8; i++) g[i] = __fdividef(g[i], 1.0f + __expf(-g[i])) * u[i];
      g1_x[j] = g1_pack<T>(g);
    }
  }
  __syncthreads();
  for (int rr = 0; rr < a.rw; rr++) {
    const long long n = row0 + rr;
    if (n >= N) break;
    const uint4 *wr = w + n * J;
    float acc = 0.0f;
    for (long long j0 = 0; j0 < J; j0 += 32LL * kG1U) {
      uint4 wv[kG1U];
#pragma unroll
      for (int u = 0; u < kG1U; u++) {
        const long long j = j0 + lane + 32LL * u;
        wv[u] = j < J ? __ldcs(wr + j) : make_uint4(0u, 0u, 0u, 0u);
      }
#pragma unroll
      for (int u = 0; u < kG1U; u++) {
        const long long j = j0 + lane + 32LL * u;
        if (j < J) {
          float wf[8], xf[8];
          g1_unpack<T>(wf, wv[u]);
          g1_unpack<T>(xf, g1_x[j]);
#pragma unroll
          for (int i = 0; i < 8; i++) acc = fmaf(wf[i], xf[i], acc);
        }
      }
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, o);
    if (lane == 0) {
      if (a.bias) acc += ote_to_f<T>(reinterpret_cast<const T *>(a.bias)[n]);
      reinterpret_cast<T *>(a.y)[n] = ote_from_f<T>(acc);
    }
  }
}

template <typename T, int PRO>
int g1_launch(g1_args a, cudaStream_t s) {
  static int per_sm, sms;
  auto f = ote_gemv1_kernel<T, PRO>;
  const size_t smem = (size_t)a.K * sizeof(T);
  if (!per_sm) { /* resident blocks per SM at the largest K (24576): once */
    int dev = 0;
    if (cudaGetDevice(&dev) != cudaSuccess ||
        cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess ||
        cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, f, kG1Warps * 32,
                                                      24576 * sizeof(T)) != cudaSuccess ||
        per_sm < 1 || sms < 1) {
      (void)cudaGetLastError();
      per_sm = 1, sms = 100;
    }
  }
  const long long warp_rows = (a.N + kG1Warps - 1) / kG1Warps, waves3 = 3LL * per_sm * sms;
  const char *env = getenv("OTE_DECODE_ROWS");
  a.rw = env && atoi(env) > 0 ? atoi(env) : (int)((warp_rows + waves3 - 1) / waves3);
  if (a.rw < 1) a.rw = 1;
  cudaLaunchConfig_t cfg;
  memset(&cfg, 0, sizeof cfg);
  cfg.gridDim = dim3((unsigned)((a.N + (long long)kG1Warps * a.rw - 1) / ((long long)kG1Warps * a.rw)));
  cfg.blockDim = dim3(kG1Warps * 32);
  cfg.dynamicSmemBytes = smem;
  cfg.stream = s;
  return (int)cudaLaunchKernelEx(&cfg, f, a);
}

} /* namespace */

/* The fused decode products above (kind 0 NORM, 1 SWIGLU; bits 16 only; code 4 bfloat16,
 * else float16). Returns a cudaError_t; 1 (cudaErrorInvalidValue) when the shapes or
 * pointers do not fit (the caller checks first). */
extern "C" int ote_cuda_gemv1(int kind, int code, const void *w, const void *bias, void *y,
                              long long N, long long K, const void *x, const void *delta,
                              const void *res, const void *gamma, void *res_out, float eps,
                              void *stream) {
  if (K <= 0 || K % 8 != 0 || N <= 0 || K * 2 > 48 * 1024) return (int)cudaErrorInvalidValue;
  g1_args a;
  a.w = w;
  a.bias = bias;
  a.y = y;
  a.x = x;
  a.delta = delta;
  a.res = res;
  a.gamma = gamma;
  a.res_out = res_out;
  a.eps = eps;
  a.N = N;
  a.K = K;
  a.rw = 1;
  cudaStream_t s = (cudaStream_t)stream;
  if (code == 4) {
    return kind == 0 ? g1_launch<__nv_bfloat16, G1_NORM>(a, s)
                     : g1_launch<__nv_bfloat16, G1_SWIGLU>(a, s);
  }
  return kind == 0 ? g1_launch<__half, G1_NORM>(a, s)
                   : g1_launch<__half, G1_SWIGLU>(a, s);
}
