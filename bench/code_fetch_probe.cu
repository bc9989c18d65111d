/*
 * bench/code_fetch_probe.cu -- what a kernel's first pass through code the L2 no longer
 * holds costs: straight-line kernels of ~8 to ~240 KB of SASS (FFMA chains with
 * immediates, 8 independent chains, one warp a CTA, one CTA an SM), each timed (a) right
 * after a launch of itself (its code warm everywhere), (b) after another kernel's 242 KB of
 * code (the SMs' instruction caches cold, the L2 warm), (c) after a kernel that streams 256
 * MB through the L2 at its default policy (the decode step's weight streams do this every
 * layer) and that other kernel, and (d) the same with the stream read evict-first
 * (ld.global.cs: do the code's lines then survive in the L2?). The 2026-12-07 stamps of the engine's attention + o_proj kernel
 * (docs/PERFORMANCE.md, forty-seventh session) read as code fetched at DRAM latency:
 * this measures it without the engine.
 *
 *   nvcc -O3 -std=c++17 -arch=sm_90a bench/code_fetch_probe.cu -o /tmp/code_fetch_probe
 *   /tmp/code_fetch_probe [--json FILE [--commit SHA] [--command TEXT]]
 *
 * Prints, per code size, the median of 21 launches (CUDA events around the probe alone)
 * in each mode, and L2-cold - warm and evict-first - warm: the cost of the fetches. The
 * SASS sizes of the instances (readelf -S of `nvcc -cubin -arch=sm_90a`, nvcc 13.0): 4
 * blocks 8.4 KB, 16 blocks 31.0 KB, 32 blocks 61.2 KB, 64 blocks 121.3 KB, 128 blocks
 * 241.9 KB (~1.9 KB a block of 64 FFMA: the second immediate of each takes a move); the
 * table prints that estimate.
 */
#include <algorithm>
#include <vector>

#include "probe_common.cuh"

/* 64 FFMA a block (8 chains x 8), each with its own immediates: ~1.9 KB of SASS a block
 * (SALT: another kernel's code of the same shape) */
template <int B, int SALT> struct Blocks {
  static __device__ __forceinline__ void run(float (&x)[8]) {
    Blocks<B - 1, SALT>::run(x);
#pragma unroll
    for (int j = 0; j < 8; j++)
#pragma unroll
      for (int c = 0; c < 8; c++)
        x[c] = fmaf(x[c], 1.0f + 1e-7f * (float)(B * 64 + j * 8 + c + SALT),
                    1e-9f * (float)(B + c + SALT));
  }
};
template <int SALT> struct Blocks<0, SALT> {
  static __device__ __forceinline__ void run(float (&)[8]) {}
};

template <int B, int SALT = 0>
__global__ void __launch_bounds__(32, 1) probe(float *out, float seed) {
  float x[8];
#pragma unroll
  for (int c = 0; c < 8; c++) x[c] = seed + (float)(threadIdx.x + c);
  Blocks<B, SALT>::run(x);
  float s = 0.0f;
#pragma unroll
  for (int c = 0; c < 8; c++) s += x[c];
  if (s == 12345.678f) out[blockIdx.x] = s; /* (never: keeps the chains live) */
}

template <int B>
static int measure(int sms, float *out, const float4 *buf, size_t n4, float *sink, FILE *json,
                   bool *first) {
  cudaEvent_t e0, e1;
  CK(cudaEventCreate(&e0));
  CK(cudaEventCreate(&e1));
  double med[4];
  /* modes: 0 warm (right after itself); 1 after another kernel's 242 KB of code (the SMs'
   * instruction caches cold, the L2 warm); 2 after a 256 MB default-policy stream and that
   * kernel (the L2 cold too); 3 the same with an evict-first stream */
  for (int mode = 0; mode < 4; mode++) {
    std::vector<float> t;
    for (int r = 0; r < 21; r++) {
      if (mode == 0) probe<B><<<sms, 32>>>(out, 1.0f); /* the code into the L2 */
      if (mode >= 2) stream_read<<<sms * 4, 512>>>(buf, n4, sink, mode == 3);
      if (mode >= 1) probe<128, 7919><<<sms, 32>>>(out, 1.0f);
      CK(cudaEventRecord(e0));
      probe<B><<<sms, 32>>>(out, 1.0f);
      CK(cudaEventRecord(e1));
      CK(cudaEventSynchronize(e1));
      float ms = 0.0f;
      CK(cudaEventElapsedTime(&ms, e0, e1));
      t.push_back(ms * 1000.0f);
    }
    std::sort(t.begin(), t.end());
    med[mode] = t[t.size() / 2];
  }
  printf("%4d (~%5.1f KB) | %8.2f | %8.2f | %8.2f | %8.2f | %8.2f | %8.2f\n", B, 1.89 * B,
         med[0], med[1], med[2], med[3], med[2] - med[0], med[3] - med[0]);
  if (json) {
    fprintf(json, "%s  {\"blocks\": %d, \"code_kb_approx\": %.1f, \"warm_us\": %.3f, "
            "\"sm_caches_cold_us\": %.3f, \"l2_cold_us\": %.3f, \"after_evict_first_us\": %.3f}",
            *first ? "" : ",\n", B, 1.89 * B, med[0], med[1], med[2], med[3]);
    *first = false;
  }
  CK(cudaEventDestroy(e0));
  CK(cudaEventDestroy(e1));
  return 0;
}

int main(int argc, char **argv) {
  probe_args pa;
  probe_args_parse(argc, argv, &pa);
  int dev = 0, sms = 0;
  CK(cudaGetDevice(&dev));
  CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
  cudaDeviceProp prop;
  CK(cudaGetDeviceProperties(&prop, dev));
  const size_t bytes = (size_t)256 << 20;
  float4 *buf = nullptr;
  float *out = nullptr, *sink = nullptr;
  CK(cudaMalloc(&buf, bytes));
  CK(cudaMemset(buf, 0, bytes));
  CK(cudaMalloc(&out, sizeof(float) * 4096));
  CK(cudaMalloc(&sink, sizeof(float)));
  FILE *json = pa.json ? fopen(pa.json, "w") : nullptr;
  if (json) probe_json_head(json, "code_fetch_probe", prop.name, pa, nullptr);
  printf("%s, %d SMs, one 32-thread CTA an SM; us, median of 21\n", prop.name, sms);
  printf("blocks (code)   |   warm   | SM cold  | L2 cold  | after EF | L2c-warm | EF-warm\n");
  bool first = true;
  const size_t n4 = bytes / sizeof(float4);
  int rc = 0;
  rc |= measure<4>(sms, out, buf, n4, sink, json, &first);
  rc |= measure<16>(sms, out, buf, n4, sink, json, &first);
  rc |= measure<32>(sms, out, buf, n4, sink, json, &first);
  rc |= measure<64>(sms, out, buf, n4, sink, json, &first);
  rc |= measure<128>(sms, out, buf, n4, sink, json, &first);
  if (json) {
    fprintf(json, "\n]}\n");
    fclose(json);
  }
  CK(cudaFree(buf));
  CK(cudaFree(out));
  CK(cudaFree(sink));
  return rc;
}
