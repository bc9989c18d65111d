/* device_kernels.cu -- the small kernels of the engine that are not library ops:
 * the embedding lookup with the token ids in device memory (so that the decode step,
 * embedding included, is one CUDA graph whose only inputs are device buffers refreshed
 * before each replay), a row argmax (greedy decoding downloads one id per sequence
 * instead of the float logits), the random weights and the profile's spin. Compiled only
 * with the CUDA backend. */
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stdint.h>

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
