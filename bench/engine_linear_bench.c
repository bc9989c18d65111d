/* engine_linear_bench.c -- ot_linear_forward at decode sizes (M = 1 .. 16 rows) on the
 * engine's weight shapes (Llama-3-8B and Llama-13B: qkv, o, gate_up, down, lm_head), bf16:
 * the small-M matrix-vector kernel (OT_LINEAR_GEMV=1) as a programmatic dependent launch
 * (the default on sm_90) and without (OT_LINEAR_PDL=0), against cuBLASLt
 * (OT_LINEAR_GEMV=0), all through the public op on one context, timed with CUDA events
 * (median of 5 runs of 10 back-to-back calls, after a warm-up). Successive calls read
 * different copies of the weight (at least 256 MiB apart in all), so that no call finds
 * its weight in the 50 MB L2 the previous one left. Two timings per kernel: the linear
 * alone ("alone": back-to-back linears, where a PDL launch overlaps the previous linear)
 * and the pair "RMSNorm of x, then the linear of its output" (the engine's pattern:
 * the previous kernel is not a linear; the time is the pair's, RMSNorm included); and the
 * small-M kernel alone with one row per warp (OT_LINEAR_GEMV_BALANCE=0) and with one
 * weight copy read by every call (in L2). Prints
 * one line per case:
 * microseconds and the weight-read rate (N * K * 2 bytes per call) of each, and which
 * the automatic dispatch picks. Run by scripts/device_engine.sh (compiled there against
 * the packed library):
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
#include "../src/cuda/linear_rule.h" /* the small-M rule of linear.cu */

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

/* median over 5 runs of the mean time of 10 calls, microseconds; < 0 on error. Call i
 * reads weight copy i % nw (w[]); with a norm, each call is preceded by the RMSNorm of x
 * into x2 and the linear reads x2. gemv / pdl / balance: the values of OT_LINEAR_GEMV /
 * OT_LINEAR_PDL / OT_LINEAR_GEMV_BALANCE for the timing (unset after). */
static double time_us(ot_context *ctx, cudaStream_t st, DLTensor *x, DLTensor *x2, DLTensor *g,
                      DLTensor *w, void *const *wp, int nw, DLTensor *y, int norm,
                      const char *gemv, const char *pdl, const char *balance) {
  setenv("OT_LINEAR_GEMV", gemv, 1);
  setenv("OT_LINEAR_PDL", pdl, 1);
  setenv("OT_LINEAR_GEMV_BALANCE", balance, 1);
  int k = 0;
#define ONE_CALL(chk)                                                                      \
  do {                                                                                     \
    w->data = wp[k++ % nw];                                                                \
    ot_status s1_ = norm ? ot_rmsnorm_forward(ctx, x, NULL, g, 1e-5f, x2, NULL, NULL) : OT_OK; \
    ot_status s2_ = s1_ == OT_OK ? ot_linear_forward(ctx, norm ? x2 : x, w, NULL, y) : s1_;  \
    if ((chk) && s2_ != OT_OK) {                                                           \
      fprintf(stderr, "ot_linear_forward / ot_rmsnorm_forward: %s\n", ot_last_error());   \
      return -1;                                                                           \
    }                                                                                      \
  } while (0)
  for (int i = 0; i < 3; i++) ONE_CALL(1);
  cudaEvent_t a, b;
  cudaEventCreate(&a);
  cudaEventCreate(&b);
  float ms[5];
  for (int r = 0; r < 5; r++) {
    cudaEventRecord(a, st);
    for (int i = 0; i < 10; i++) ONE_CALL(0);
    cudaEventRecord(b, st);
    cudaEventSynchronize(b);
    cudaEventElapsedTime(&ms[r], a, b);
  }
#undef ONE_CALL
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  unsetenv("OT_LINEAR_GEMV");
  unsetenv("OT_LINEAR_PDL");
  unsetenv("OT_LINEAR_GEMV_BALANCE");
  if (cudaStreamSynchronize(st) != cudaSuccess) return -1;
  qsort(ms, 5, sizeof ms[0], cmp_f);
  return ms[2] * 1e3 / 10;
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
  /* one pool of >= 256 MiB (and >= 2 weights) for the weight copies */
  size_t wmax = 0;
  for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++)
    if ((size_t)(shapes[i].N * shapes[i].K) > wmax) wmax = (size_t)(shapes[i].N * shapes[i].K);
  size_t pool = 2 * wmax * 2;
  if (pool < ((size_t)256 << 20)) pool = (size_t)256 << 20;
  void *w = NULL, *x = NULL, *x2 = NULL, *g = NULL, *y = NULL;
  if (cudaMalloc(&w, pool) || cudaMalloc(&x, 16 * 16384 * 2) || cudaMalloc(&x2, 16 * 16384 * 2) ||
      cudaMalloc(&g, 16384 * 2) || cudaMalloc(&y, 16 * 131072 * 2)) {
    fprintf(stderr, "cudaMalloc failed\n");
    return 1;
  }
  cudaMemset(w, 0x3c, pool); /* bf16 0x3c3c ~ 0.0115: finite values */
  cudaMemset(x, 0x3c, 16 * 16384 * 2);
  cudaMemset(g, 0x3c, 16384 * 2);
  FILE *jf = json ? fopen(json, "w") : NULL;
  if (jf) fprintf(jf, "[\n");
  const int Ms[] = {1, 4, 16};
  int first = 1;
  printf("%-10s %-10s %3s | alone us: %7s %7s %7s | after rmsnorm us: %7s %7s %7s | "
         "GB/s alone: %5s %5s | %8s | gemv us: %7s %7s\n",
         "model", "weight", "M", "gemv", "gemv-np", "lt", "gemv", "gemv-np", "lt", "gemv", "lt",
         "auto", "1-row", "in-L2");
  for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++) {
    const shape *s = &shapes[i];
    const size_t wb = (size_t)(s->N * s->K) * 2;
    int nw = (int)(pool / wb);
    if (nw > 64) nw = 64;
    void *wp[64];
    for (int c = 0; c < nw; c++) wp[c] = (char *)w + (size_t)c * wb;
    for (size_t m = 0; m < sizeof Ms / sizeof Ms[0]; m++) {
      int64_t M = Ms[m], xs[2], x2s[2], gs[2], wsh[2], ys[2];
      DLTensor tx, tx2, tg, tw, ty;
      tensor(&tx, xs, x, M, s->K);
      tensor(&tx2, x2s, x2, M, s->K);
      tensor(&tg, gs, g, s->K, 1);
      tg.ndim = 1;
      tensor(&tw, wsh, w, s->N, s->K);
      tensor(&ty, ys, y, M, s->N);
      double t[8];
      for (int norm = 0; norm < 2; norm++) {
        t[3 * norm + 0] = time_us(ctx, st, &tx, &tx2, &tg, &tw, wp, nw, &ty, norm, "1", "1", "1");
        t[3 * norm + 1] = time_us(ctx, st, &tx, &tx2, &tg, &tw, wp, nw, &ty, norm, "1", "0", "1");
        t[3 * norm + 2] = time_us(ctx, st, &tx, &tx2, &tg, &tw, wp, nw, &ty, norm, "0", "1", "1");
      }
      /* the small-M kernel alone with one row per warp (the grid before rows per warp),
       * and with its weight in L2 (one copy, read by every call: what an L2 prefetch of
       * a weight that fits could give) */
      t[6] = time_us(ctx, st, &tx, &tx2, &tg, &tw, wp, nw, &ty, 0, "1", "1", "0");
      t[7] = time_us(ctx, st, &tx, &tx2, &tg, &tw, wp, 1, &ty, 0, "1", "1", "1");
      double bytes = (double)wb;
      /* the library's automatic rule (bf16, aligned: the vector path) */
      const char *pick = ot_linear_small_m_auto(M, s->K, s->N, true, true) ? "gemv" : "cublaslt";
      printf("%-10s %-10s %3lld | %17.1f %7.1f %7.1f | %25.1f %7.1f %7.1f | %17.0f %5.0f | %8s | "
             "%16.1f %7.1f\n",
             s->model, s->name, (long long)M, t[0], t[1], t[2], t[3], t[4], t[5],
             bytes / (t[0] * 1e3), bytes / (t[2] * 1e3), pick, t[6], t[7]);
      if (jf)
        fprintf(jf,
                "%s {\"model\": \"%s\", \"weight\": \"%s\", \"N\": %lld, \"K\": %lld, \"M\": %lld, "
                "\"gemv_us\": %.2f, \"gemv_nopdl_us\": %.2f, \"cublaslt_us\": %.2f, "
                "\"after_rmsnorm_us\": {\"gemv\": %.2f, \"gemv_nopdl\": %.2f, "
                "\"cublaslt\": %.2f}, \"gemv_GBps\": %.0f, \"cublaslt_GBps\": %.0f, "
                "\"auto\": \"%s\", \"gemv_one_row_per_warp_us\": %.2f, "
                "\"gemv_weight_in_l2_us\": %.2f}",
                first ? "" : ",\n", s->model, s->name, (long long)s->N, (long long)s->K,
                (long long)M, t[0], t[1], t[2], t[3], t[4], t[5], bytes / (t[0] * 1e3),
                bytes / (t[2] * 1e3), pick, t[6], t[7]);
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
  cudaFree(x2);
  cudaFree(g);
  cudaFree(y);
  cudaStreamDestroy(st);
  return 0;
}
