/*
 * attn_portable_timing.c -- quick timing of the CUDA attention (public API; run with
 * OT_ATTN_IMPL=portable for the sm_80+ kernels on a Hopper device) for
 * scripts/device_attention.sh. Dense BSHD bf16, random inputs in [-1, 1].
 *
 *   attn_portable_timing B H S D causal(0|1) [iters [VAR=VALUE ...]]
 *
 * Each VAR=VALUE (e.g. OT_ATTN_FWD_CFG=2, tile-shape sweeps of a -DOT_ATTN_TUNING build)
 * is set in turn and both passes are timed again under it; deterministic=0|1 sets
 * params.deterministic instead (the Hopper backward or the portable one).
 * Prints one line per pass: milliseconds (median of iters) and TFLOP/s counted as
 * FlashAttention does (forward 4 B H S^2 D, halved when causal; forward + backward
 * 3.5x that: the backward is 2.5 forwards' worth of products).
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime.h>

#include "ops_transformer.h"

static uint16_t f2bf(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

static void *dev_rand(size_t n, uint64_t *seed) {
  uint16_t *h = malloc(n * 2);
  for (size_t i = 0; i < n; i++) {
    *seed = *seed * 6364136223846793005ull + 1442695040888963407ull;
    h[i] = f2bf((float)((*seed >> 40) & 0xffffff) / 8388608.0f - 1.0f);
  }
  void *d = NULL;
  if (cudaMalloc(&d, n * 2) != cudaSuccess) exit(2);
  cudaMemcpy(d, h, n * 2, cudaMemcpyHostToDevice);
  free(h);
  return d;
}

static DLTensor tens(void *data, int ndim, int64_t *shape, DLDataType dt) {
  DLTensor t;
  memset(&t, 0, sizeof t);
  t.data = data;
  t.device.device_type = kDLCUDA;
  t.device.device_id = 0;
  t.ndim = ndim;
  t.dtype = dt;
  t.shape = shape;
  t.strides = NULL;
  return t;
}

static int cmp(const void *a, const void *b) {
  float x = *(const float *)a, y = *(const float *)b;
  return x < y ? -1 : x > y;
}

int main(int argc, char **argv) {
  if (argc < 6) {
    fprintf(stderr, "usage: %s B H S D causal [iters]\n", argv[0]);
    return 1;
  }
  int64_t B = atoll(argv[1]), H = atoll(argv[2]), S = atoll(argv[3]), D = atoll(argv[4]);
  int causal = atoi(argv[5]), iters = argc > 6 ? atoi(argv[6]) : 20;
  ot_context_options o = ot_context_default_options();
  o.device_type = kDLCUDA;
  ot_context *ctx = NULL;
  if (ot_context_create(&o, &ctx) != OT_OK) {
    fprintf(stderr, "context: %s\n", ot_last_error());
    return 1;
  }
  uint64_t seed = 42;
  size_t n = (size_t)(B * S * H * D);
  void *q = dev_rand(n, &seed), *k = dev_rand(n, &seed), *v = dev_rand(n, &seed);
  void *dout = dev_rand(n, &seed), *out, *dq, *dk, *dv, *lse;
  cudaMalloc(&out, n * 2), cudaMalloc(&dq, n * 2), cudaMalloc(&dk, n * 2), cudaMalloc(&dv, n * 2);
  cudaMalloc(&lse, (size_t)(B * H * S) * 4);
  DLDataType bf = {kDLBfloat, 16, 1}, f32 = {kDLFloat, 32, 1};
  int64_t sh[4] = {B, S, H, D}, lsh[3] = {B, H, S};
  DLTensor tq = tens(q, 4, sh, bf), tk = tens(k, 4, sh, bf), tv = tens(v, 4, sh, bf);
  DLTensor to = tens(out, 4, sh, bf), tdo = tens(dout, 4, sh, bf), tl = tens(lse, 3, lsh, f32);
  DLTensor tdq = tens(dq, 4, sh, bf), tdk = tens(dk, 4, sh, bf), tdv = tens(dv, 4, sh, bf);
  ot_attention_params p = ot_attention_default_params();
  p.causal = causal;
  double flops = 4.0 * B * H * (double)S * S * D * (causal ? 0.5 : 1.0);
  cudaEvent_t e0, e1;
  cudaEventCreate(&e0), cudaEventCreate(&e1);
  float *ms = malloc(sizeof(float) * (iters > 0 ? iters : 1));
  int nset = argc > 7 ? argc - 7 : 1;
  for (int set = 0; set < nset; set++) {
  const char *label = argc > 7 ? argv[7 + set] : "default";
  if (argc > 7) {
    char name[64];
    const char *eq = strchr(label, '=');
    if (!eq || eq - label >= (int)sizeof name) continue;
    memcpy(name, label, (size_t)(eq - label));
    name[eq - label] = 0;
    if (strcmp(name, "deterministic") == 0)  /* params.deterministic, not a variable */
      p.deterministic = atoi(eq + 1);
    else
      setenv(name, eq + 1, 1);
  }
  for (int pass = 0; pass < 2; pass++) {
    for (int it = -3; it < iters; it++) {
      cudaEventRecord(e0, NULL);
      ot_status st = ot_attention_forward(ctx, &p, &tq, &tk, &tv, NULL, NULL, &to, &tl);
      if (st == OT_OK && pass == 1)
        st = ot_attention_backward(ctx, &p, &tq, &tk, &tv, &to, &tdo, &tl, NULL, NULL, &tdq, &tdk, &tdv);
      cudaEventRecord(e1, NULL);
      if (st != OT_OK) {
        fprintf(stderr, "attention: %s\n", ot_last_error());
        return 1;
      }
      cudaEventSynchronize(e1);
      if (it >= 0) cudaEventElapsedTime(&ms[it], e0, e1);
    }
    cudaError_t ce = cudaGetLastError();
    if (ce != cudaSuccess) {
      fprintf(stderr, "cuda: %s\n", cudaGetErrorString(ce));
      return 1;
    }
    qsort(ms, iters, sizeof *ms, cmp);
    double t = ms[iters / 2], f = pass ? 3.5 * flops : flops;
    printf("ours %s B=%lld H=%lld S=%lld D=%lld causal=%d [%s]: %.3f ms, %.1f TFLOP/s\n",
           pass ? "fwd+bwd" : "fwd", (long long)B, (long long)H, (long long)S, (long long)D, causal,
           label, t, f / (t * 1e-3) / 1e12);
  }
  }
  free(ms);
  ot_context_destroy(ctx);
  return 0;
}
