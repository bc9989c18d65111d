/* engine_linear_bench.c -- ot_linear_forward at decode sizes (M = 1 .. 16 rows) on the
 * engine's weight shapes (Llama-3-8B and Llama-13B: qkv, o, gate_up, down, lm_head), bf16:
 * the small-M matrix-vector kernel (OT_LINEAR_GEMV=1) against cuBLASLt (OT_LINEAR_GEMV=0),
 * both through the public op on one context, timed with CUDA events (median of 7 runs of
 * 20 back-to-back calls, after a warm-up). Prints one line per case: microseconds and the
 * weight-read rate (N * K * 2 bytes per call) of each, and which the automatic dispatch
 * picks. Run by scripts/device_engine.sh (compiled there against the packed library):
 *
 *   cc -O2 -std=c11 bench/engine_linear_bench.c -Iinclude -I$CUDA/include -Llib \
 *      -lops_transformer -L$CUDA/lib64 -lcudart -o engine_linear_bench
 *   ./engine_linear_bench [--json FILE]
 */
#define _GNU_SOURCE
#include <cuda_runtime_api.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ops_transformer.h"

typedef struct shape {
  const char *model, *name;
  int64_t N, K;
} shape;

static const shape shapes[] = {
    {"llama3-8b", "qkv_proj", 6144, 4096},   {"llama3-8b", "o_proj", 4096, 4096},
    {"llama3-8b", "gate_up", 28672, 4096},   {"llama3-8b", "down_proj", 4096, 14336},
    {"llama3-8b", "lm_head", 128256, 4096},  {"llama-13b", "qkv_proj", 15360, 5120},
    {"llama-13b", "o_proj", 5120, 5120},     {"llama-13b", "gate_up", 27648, 5120},
    {"llama-13b", "down_proj", 5120, 13824}, {"llama-13b", "lm_head", 32000, 5120},
};

static void tensor(DLTensor *t, int64_t *shp, void *data, int64_t r, int64_t c) {
  memset(t, 0, sizeof *t);
  shp[0] = r;
  shp[1] = c;
  t->data = data;
  t->device = (DLDevice){kDLCUDA, 0};
  t->ndim = 2;
  t->dtype = (DLDataType){kDLBfloat, 16, 1};
  t->shape = shp;
}

static int cmp_f(const void *a, const void *b) {
  float x = *(const float *)a, y = *(const float *)b;
  return x < y ? -1 : x > y;
}

/* median over 7 runs of the mean time of 20 calls, microseconds; < 0 on error */
static double time_us(ot_context *ctx, cudaStream_t st, DLTensor *x, DLTensor *w, DLTensor *y,
                      const char *impl) {
  setenv("OT_LINEAR_GEMV", impl, 1);
  for (int i = 0; i < 3; i++)
    if (ot_linear_forward(ctx, x, w, NULL, y) != OT_OK) {
      fprintf(stderr, "ot_linear_forward: %s\n", ot_last_error());
      return -1;
    }
  cudaEvent_t a, b;
  cudaEventCreate(&a);
  cudaEventCreate(&b);
  float ms[7];
  for (int r = 0; r < 7; r++) {
    cudaEventRecord(a, st);
    for (int i = 0; i < 20; i++) (void)ot_linear_forward(ctx, x, w, NULL, y);
    cudaEventRecord(b, st);
    cudaEventSynchronize(b);
    cudaEventElapsedTime(&ms[r], a, b);
  }
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  unsetenv("OT_LINEAR_GEMV");
  qsort(ms, 7, sizeof ms[0], cmp_f);
  return ms[3] * 1e3 / 20;
}

int main(int argc, char **argv) {
  const char *json = argc > 2 && !strcmp(argv[1], "--json") ? argv[2] : NULL;
  cudaStream_t st;
  if (cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking) != cudaSuccess) {
    fprintf(stderr, "no CUDA device\n");
    return 1;
  }
  ot_context_options o = ot_context_default_options();
  o.device_type = kDLCUDA;
  o.stream = st;
  ot_context *ctx = NULL;
  if (ot_context_create(&o, &ctx) != OT_OK) {
    fprintf(stderr, "ot_context_create: %s\n", ot_last_error());
    return 1;
  }
  size_t wmax = 0;
  for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++)
    if ((size_t)(shapes[i].N * shapes[i].K) > wmax) wmax = (size_t)(shapes[i].N * shapes[i].K);
  void *w = NULL, *x = NULL, *y = NULL;
  if (cudaMalloc(&w, wmax * 2) || cudaMalloc(&x, 16 * 16384 * 2) || cudaMalloc(&y, 16 * 131072 * 2)) {
    fprintf(stderr, "cudaMalloc failed\n");
    return 1;
  }
  cudaMemset(w, 0x3c, wmax * 2); /* bf16 0x3c3c ~ 0.0115: finite values */
  cudaMemset(x, 0x3c, 16 * 16384 * 2);
  FILE *jf = json ? fopen(json, "w") : NULL;
  if (jf) fprintf(jf, "[\n");
  const int Ms[] = {1, 2, 4, 8, 16};
  int first = 1;
  printf("%-10s %-10s %3s %10s %10s %9s %9s %8s\n", "model", "weight", "M", "gemv us", "lt us",
         "gemv GB/s", "lt GB/s", "auto");
  for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++) {
    const shape *s = &shapes[i];
    for (size_t m = 0; m < sizeof Ms / sizeof Ms[0]; m++) {
      int64_t M = Ms[m], xs[2], wsh[2], ys[2];
      DLTensor tx, tw, ty;
      tensor(&tx, xs, x, M, s->K);
      tensor(&tw, wsh, w, s->N, s->K);
      tensor(&ty, ys, y, M, s->N);
      double g = time_us(ctx, st, &tx, &tw, &ty, "1");
      double l = time_us(ctx, st, &tx, &tw, &ty, "0");
      double bytes = (double)s->N * (double)s->K * 2;
      /* linear.cu's automatic rule (bf16: M == 1 and a small or lm_head-sized weight) */
      const double nk = (double)s->N * (double)s->K;
      const char *pick = M == 1 && (nk < 3.0 * (1 << 23) || nk >= (double)(1 << 28)) ? "gemv"
                                                                                   : "cublaslt";
      printf("%-10s %-10s %3lld %10.1f %10.1f %9.0f %9.0f %8s\n", s->model, s->name, (long long)M, g,
             l, bytes / (g * 1e3), bytes / (l * 1e3), pick);
      if (jf)
        fprintf(jf,
                "%s {\"model\": \"%s\", \"weight\": \"%s\", \"N\": %lld, \"K\": %lld, \"M\": %lld, "
                "\"gemv_us\": %.2f, \"cublaslt_us\": %.2f, \"gemv_GBps\": %.0f, "
                "\"cublaslt_GBps\": %.0f, \"auto\": \"%s\"}",
                first ? "" : ",\n", s->model, s->name, (long long)s->N, (long long)s->K,
                (long long)M, g, l, bytes / (g * 1e3), bytes / (l * 1e3), pick);
      first = 0;
    }
  }
  if (jf) {
    fprintf(jf, "\n]\n");
    fclose(jf);
  }
  ot_context_destroy(ctx);
  cudaFree(w);
  cudaFree(x);
  cudaFree(y);
  cudaStreamDestroy(st);
  return 0;
}
