/*
 * arena_bench.c -- allocation + free time of the library's arena (ot_arena on a CUDA
 * context) against cudaMalloc / cudaFree and stream-ordered cudaMallocAsync /
 * cudaFreeAsync (default pool, release threshold raised so it keeps its memory: its
 * best case), over the same random trace.
 *
 * Trace ("a realistic mix"): up to 48 live blocks; each step allocates (when fewer than
 * 48 are live and a coin says so, or none is) or frees a random live block. Sizes: 60%
 * small workspaces (256 B .. 64 KiB), 30% activations (64 KiB .. 16 MiB), 10% large
 * buffers (16 .. 256 MiB), log-uniform inside each class. Every allocator replays the
 * identical sequence once to warm up, then timed (host wall clock; cudaMalloc / cudaFree
 * replay the first 4000 steps only: they take tens of microseconds each).
 *
 *   arena_bench [steps]  -> one JSON object on stdout: ns per alloc+free pair of each
 * Built against the static library (see scripts/device_decode.sh).
 */
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "ops_transformer.h"

#define MAXLIVE 48

typedef struct step {
  int alloc; /* 1 alloc into slot, 0 free slot */
  int slot;
  size_t bytes;
} step;

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;
static uint64_t rnd(void) {
  rng_state ^= rng_state << 13, rng_state ^= rng_state >> 7, rng_state ^= rng_state << 17;
  return rng_state;
}
static double urand(void) { return (double)(rnd() >> 11) / 9007199254740992.0; }

static size_t log_uniform(double lo, double hi) {
  double l = log2(lo), h = log2(hi);
  return (size_t)exp2(l + (h - l) * urand());
}

static step *make_trace(int n) {
  step *t = malloc((size_t)n * sizeof *t);
  int live[MAXLIVE], nlive = 0, free_slots[MAXLIVE], nfree = MAXLIVE;
  for (int i = 0; i < MAXLIVE; i++) free_slots[i] = MAXLIVE - 1 - i;
  for (int i = 0; i < n; i++) {
    int do_alloc = nlive == 0 || (nlive < MAXLIVE && (rnd() & 1));
    if (do_alloc) {
      double c = urand();
      size_t b = c < 0.6 ? log_uniform(256, 65536)
                 : c < 0.9 ? log_uniform(65536, 16 << 20) : log_uniform(16 << 20, 256 << 20);
      int s = free_slots[--nfree];
      live[nlive++] = s;
      t[i] = (step){1, s, b};
    } else {
      int k = (int)(rnd() % (uint64_t)nlive);
      int s = live[k];
      live[k] = live[--nlive];
      free_slots[nfree++] = s;
      t[i] = (step){0, s, 0};
    }
  }
  return t;
}

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* Free whatever the trace left live, so every replay starts empty. */
typedef int (*alloc_fn)(void *state, size_t bytes, void **p);
typedef int (*free_fn)(void *state, void *p);

static double replay(const step *t, int n, alloc_fn af, free_fn ff, void *st, int *pairs) {
  void *ptr[MAXLIVE] = {0};
  int np = 0;
  double t0 = now_s();
  for (int i = 0; i < n; i++) {
    if (t[i].alloc) {
      if (af(st, t[i].bytes, &ptr[t[i].slot])) {
        fprintf(stderr, "alloc of %zu failed at step %d\n", t[i].bytes, i);
        exit(1);
      }
      np++;
    } else {
      ff(st, ptr[t[i].slot]);
      ptr[t[i].slot] = NULL;
    }
  }
  double el = now_s() - t0;
  for (int s = 0; s < MAXLIVE; s++)
    if (ptr[s]) ff(st, ptr[s]);
  *pairs = np;
  return el;
}

static int a_arena(void *st, size_t b, void **p) { return ot_arena_alloc((ot_arena *)st, b, NULL, p) != OT_OK; }
static int f_arena(void *st, void *p) { return ot_arena_free((ot_arena *)st, p, NULL) != OT_OK; }
static int a_cuda(void *st, size_t b, void **p) { (void)st; return cudaMalloc(p, b) != cudaSuccess; }
static int f_cuda(void *st, void *p) { (void)st; return cudaFree(p) != cudaSuccess; }
static int a_async(void *st, size_t b, void **p) {
  return cudaMallocAsync(p, b, (cudaStream_t)st) != cudaSuccess;
}
static int f_async(void *st, void *p) { return cudaFreeAsync(p, (cudaStream_t)st) != cudaSuccess; }

int main(int argc, char **argv) {
  int n = argc > 1 ? atoi(argv[1]) : 40000;
  int n_malloc = n < 4000 ? n : 4000;
  step *t = make_trace(n);
  ot_context *ctx = NULL;
  ot_context_options o = ot_context_default_options();
  o.device_type = kDLCUDA;
  if (ot_context_create(&o, &ctx) != OT_OK) {
    fprintf(stderr, "context: %s\n", ot_last_error());
    return 1;
  }
  ot_arena *arena = NULL;
  if (ot_arena_create(ctx, (size_t)8 << 30, &arena) != OT_OK) {
    fprintf(stderr, "arena: %s\n", ot_last_error());
    return 1;
  }
  cudaStream_t s;
  cudaStreamCreate(&s);
  cudaMemPool_t pool;
  cudaDeviceGetDefaultMemPool(&pool, 0);
  uint64_t thr = UINT64_MAX;
  cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &thr);
  int pa, pc, ps;
  replay(t, n, a_arena, f_arena, arena, &pa);
  double ta = replay(t, n, a_arena, f_arena, arena, &pa);
  replay(t, n_malloc, a_cuda, f_cuda, NULL, &pc);
  double tc = replay(t, n_malloc, a_cuda, f_cuda, NULL, &pc);
  replay(t, n, a_async, f_async, s, &ps);
  cudaStreamSynchronize(s);
  double ts = replay(t, n, a_async, f_async, s, &ps);
  cudaStreamSynchronize(s);
  ot_arena_stats st;
  ot_arena_get_stats(arena, &st);
  printf("{\"steps\": %d, \"arena_pairs\": %d, \"arena_ns_per_pair\": %.1f, "
         "\"cudamalloc_pairs\": %d, \"cudamalloc_ns_per_pair\": %.1f, "
         "\"mallocasync_pairs\": %d, \"mallocasync_ns_per_pair\": %.1f, "
         "\"arena_peak_bytes\": %zu, \"arena_fragmentation_end\": %.3f}\n",
         n, pa, ta / pa * 1e9, pc, tc / pc * 1e9, ps, ts / ps * 1e9, st.peak, st.fragmentation);
  ot_arena_destroy(arena);
  ot_context_destroy(ctx);
  free(t);
  return 0;
}
