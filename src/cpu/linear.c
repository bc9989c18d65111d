/*
 * linear.c -- CPU kernels of the linear layer through BLAS (cblas_sgemm).
 *
 * float32 storage: sgemm runs directly on the caller's buffers (row strides become
 * the leading dimensions). float16 / bfloat16 storage: blocks of the operands are
 * converted to float32 panels (bounded scratch, about 32 MB at most for realistic
 * K), multiplied by sgemm into a float32 block, and rounded once to the output dtype.
 *
 * float16 / bfloat16 forward with at most SMALL_M rows (decoding) skips BLAS: it reads
 * the weight once in its storage dtype (see forward_small_m).
 *
 * sgemm is always called from the calling thread, never inside an OpenMP region:
 * OpenBLAS threads it itself (with ctx->num_threads threads while the op runs). The
 * OpenMP team converts panels (not with the pthread OpenBLAS, see convert_threads),
 * runs the small-M forward and reduces dbias.
 */
#include <limits.h>
#include <stdlib.h>

#include <cblas.h>
#ifdef _OPENMP
#include <omp.h>
#endif

#include "core/linear.h"
#include "cpu/threads.h"
#include "cpu/temp.h"

/* Scratch budget per panel, in float32 elements: the weight-side panel may take
 * PANEL_BIG (16 MB), the activation-side panel and the float32 output block
 * PANEL_SMALL (8 MB) each. Panels never go below MIN_PANEL rows, so that sgemm keeps
 * a useful shape even for very large K. */
#define PANEL_BIG ((int64_t)1 << 22)
#define PANEL_SMALL ((int64_t)1 << 21)
#define MIN_PANEL 16

static int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }
static int64_t max64(int64_t a, int64_t b) { return a > b ? a : b; }

/* Rows of a panel so that rows * row_len <= budget, clamped to [MIN_PANEL, total]. */
static int64_t panel_rows(int64_t budget, int64_t row_len, int64_t total) {
  return min64(total, max64(MIN_PANEL, budget / max64(row_len, 1)));
}

/* Threads for the panel conversions between sgemm calls. With the pthread build of
 * OpenBLAS (Debian's default) an OpenMP team left spinning after a conversion competes
 * with OpenBLAS's own threads for the cores during the next sgemm (measured on 2
 * pinned cores: bf16 [64, 1024] x [1024, 1024]^T 24 ms instead of 1.5 ms, [512, 4096]
 * x [4096, 4096]^T 180 ms instead of 103 ms), so the
 * conversions stay on the calling thread there; they are O(size of the operands)
 * against the O(M N K) product. With OpenBLAS built on OpenMP, or another BLAS, the
 * context's team converts. */
static int convert_threads(const ot_context *ctx, int64_t rows, int64_t cols) {
#ifdef OPENBLAS_VERSION
  if (openblas_get_parallel() == OPENBLAS_THREAD) return 1;
#endif
  return ot_cpu_threads_cap(ctx, rows * cols, rows);
}

/* dst[r, 0:cols] (float32, leading dim ld_dst) = src[r * src_stride + 0:cols]. */
static void load_block(const ot_context *ctx, float *dst, int64_t ld_dst, const void *src,
                       int64_t src_stride, ot_dtype d, int64_t rows, int64_t cols) {
  const int nt = convert_threads(ctx, rows, cols);
#pragma omp parallel for num_threads(nt) if (nt > 1) schedule(static)
  for (int64_t r = 0; r < rows; r++)
    ot_load_f32(dst + r * ld_dst, ot_ptr((void *)src, d, r * src_stride), d, cols);
}

/* dst[r * dst_stride + 0:cols] = round(src[r, 0:cols]) (float32, leading dim ld_src). */
static void store_block(const ot_context *ctx, void *dst, int64_t dst_stride, const float *src,
                        int64_t ld_src, ot_dtype d, int64_t rows, int64_t cols) {
  const int nt = convert_threads(ctx, rows, cols);
#pragma omp parallel for num_threads(nt) if (nt > 1) schedule(static)
  for (int64_t r = 0; r < rows; r++)
    ot_store_f32(ot_ptr(dst, d, r * dst_stride), src + r * ld_src, d, cols);
}

/* Every row of dst [rows, cols] (row stride dst_stride) becomes a copy of `row` (cols
 * elements of the same dtype), or zero when row is NULL (all-zero bits are 0.0 in
 * every storage dtype). */
static void fill_rows(void *dst, int64_t dst_stride, const void *row, ot_dtype d, int64_t rows,
                      int64_t cols) {
  size_t es = ot_dtype_size(d);
  for (int64_t r = 0; r < rows; r++) {
    void *p = ot_ptr(dst, d, r * dst_stride);
    if (row) memcpy(p, row, (size_t)cols * es);
    else memset(p, 0, (size_t)cols * es);
  }
}

static bool fits_int(int64_t v) { return v <= INT_MAX; }

/* OpenBLAS keeps one global thread count; use the context's for the call and put the
 * caller's back afterwards. Other BLAS builds keep their own threading. */
typedef struct blas_threads {
  int prev;
} blas_threads;

static blas_threads blas_threads_enter(const ot_context *ctx) {
  blas_threads t = {0};
#ifdef OPENBLAS_VERSION
  t.prev = openblas_get_num_threads();
  if (t.prev != ctx->num_threads) openblas_set_num_threads(ctx->num_threads);
#else
  (void)ctx;
#endif
  return t;
}

static void blas_threads_leave(const ot_context *ctx, blas_threads t) {
#ifdef OPENBLAS_VERSION
  if (t.prev != ctx->num_threads) openblas_set_num_threads(t.prev);
#else
  (void)ctx;
  (void)t;
#endif
}

/* ---------------------------------------------------------------------------------- */
/* Forward: y [M, N] = x [M, K] W[N, K]^T + b                                         */

static void forward_f32(const ot_linear_forward_args *a) {
  const int64_t M = a->rows, K = a->in_features, N = a->out_features;
  float beta = 0.0f;
  if (a->bias) {
    fill_rows(a->y, a->y_stride, a->bias, OT_F32, M, N);
    beta = 1.0f;
  }
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)M, (int)N, (int)K, 1.0f,
              (const float *)a->x, (int)a->x_stride, (const float *)a->weight, (int)K, beta,
              (float *)a->y, (int)a->y_stride);
}

/* Few rows (decoding): the product is bound by reading W, so W is read once in its
 * storage dtype, one row at a time converted to float32 in a per-thread [K] buffer,
 * and dotted with the M float32 rows of x; no BLAS, no float32 copy of W. */
#define SMALL_M 8

/* out[m * out_stride] = dot(x[m, 0:K], w[0:K]) for m < M; 16 partial sums so that the
 * loop vectorizes without reassociation flags. */
__attribute__((target_clones("avx512f", "avx2", "default")))
static void dot_rows(const float *x, int64_t M, int64_t K, const float *w, float *out,
                     int64_t out_stride) {
  for (int64_t m = 0; m < M; m++) {
    const float *xm = x + m * K;
    float acc[16] = {0};
    int64_t k = 0;
    for (; k + 16 <= K; k += 16)
      for (int j = 0; j < 16; j++) acc[j] += xm[k + j] * w[k + j];
    float s = 0.0f;
    for (; k < K; k++) s += xm[k] * w[k];
    for (int j = 0; j < 16; j++) s += acc[j];
    out[m * out_stride] = s;
  }
}

/* forward_small_m: columns of y per block; its team (work: FLOPs / 8, see
 * cpu/threads.h). */
enum { NBLK = 64 };
static int small_m_threads(const ot_context *ctx, const ot_linear_forward_args *a) {
  const int64_t M = a->rows, K = a->in_features, N = a->out_features;
  return ot_cpu_threads_cap(ctx, 2 * M * N * K / 8, (N + 63) / 64);
}

/* forward_lowp's panels: rows of the weight (NB) and x (MB) panels, and the float32
 * elements of each part of its one block [weight panel | x panel | y panel | bias], each
 * part 64-byte aligned. */
typedef struct lowp_plan {
  int64_t NB, MB, nw, nx, ny, nbias;
} lowp_plan;
static lowp_plan lowp_plan_of(const ot_linear_forward_args *a) {
  const int64_t M = a->rows, K = a->in_features, N = a->out_features;
  lowp_plan p;
  p.NB = panel_rows(PANEL_BIG, K, N);
  p.MB = min64(panel_rows(PANEL_SMALL, K, M), panel_rows(PANEL_SMALL, p.NB, M));
  p.nw = (p.NB * K + 15) / 16 * 16;
  p.nx = (p.MB * K + 15) / 16 * 16;
  p.ny = (p.MB * p.NB + 15) / 16 * 16;
  p.nbias = a->bias ? N : 0;
  return p;
}

size_t ot_cpu_linear_forward_temp_bytes(const ot_context *ctx, const ot_linear_forward_args *a) {
  const int64_t M = a->rows, K = a->in_features, N = a->out_features;
  if (M == 0 || N == 0 || K == 0 || a->dtype == OT_F32) return 0;
  if (M <= SMALL_M) return (size_t)(M * K + small_m_threads(ctx, a) * (K + M * NBLK)) * 4;
  const lowp_plan p = lowp_plan_of(a);
  return (size_t)(p.nw + p.nx + p.ny + p.nbias) * sizeof(float);
}

static ot_status forward_small_m(const ot_context *ctx, const ot_linear_forward_args *a) {
  const int64_t M = a->rows, K = a->in_features, N = a->out_features;
  const ot_dtype d = a->dtype;
  const int T = small_m_threads(ctx, a);
  /* x [M, K], then per thread: one weight row [K] and the outputs of a column block
   * [M, NBLK] (columns of y are written a block at a time, rows contiguous). */
  const int64_t per_thread = K + M * NBLK;
  float *buf = (float *)ot_cpu_temp_alloc(ctx, "ot_linear_forward", "CPU scratch",
                                          (size_t)(M * K + T * per_thread) * sizeof(float));
  if (!buf) return OT_ERR_OOM;
  float *xf = buf;
  for (int64_t m = 0; m < M; m++)
    ot_load_f32(xf + m * K, ot_ptr((void *)a->x, d, m * a->x_stride), d, K);
  const int64_t nblocks = (N + NBLK - 1) / NBLK;
  /* dynamic: a thread that loses its core (to OpenBLAS's or another team's spinning
   * threads on a small machine) does not hold back the others. */
#pragma omp parallel num_threads(T) if (T > 1)
  {
#ifdef _OPENMP
    const int t = omp_get_thread_num();
#else
    const int t = 0;
#endif
    float *wrow = buf + M * K + t * per_thread, *yblk = wrow + K;
    float bias[NBLK];
#pragma omp for schedule(dynamic, 1)
    for (int64_t blk = 0; blk < nblocks; blk++) {
      const int64_t n0 = blk * NBLK, nb = min64(NBLK, N - n0);
      if (a->bias) ot_load_f32(bias, ot_ptr((void *)a->bias, d, n0), d, nb);
      for (int64_t j = 0; j < nb; j++) {
        ot_load_f32(wrow, ot_ptr((void *)a->weight, d, (n0 + j) * K), d, K);
        dot_rows(xf, M, K, wrow, yblk + j, NBLK);
      }
      for (int64_t m = 0; m < M; m++) {
        float *ym = yblk + m * NBLK;
        if (a->bias)
          for (int64_t j = 0; j < nb; j++) ym[j] += bias[j];
        ot_store_f32(ot_ptr(a->y, d, m * a->y_stride + n0), ym, d, nb);
      }
    }
  }
  ot_cpu_temp_free(ctx, buf);
  return OT_OK;
}

/* Weight panels [nb, K] outside, x panels [mb, K] inside; the x panel is converted
 * again for every weight panel unless all of x fits in one panel. */
static ot_status forward_lowp(const ot_context *ctx, const ot_linear_forward_args *a) {
  const int64_t M = a->rows, K = a->in_features, N = a->out_features;
  const ot_dtype d = a->dtype;
  const lowp_plan p = lowp_plan_of(a);
  const int64_t NB = p.NB, MB = p.MB;
  float *wp = (float *)ot_cpu_temp_alloc(ctx, "ot_linear_forward", "CPU scratch",
                                         (size_t)(p.nw + p.nx + p.ny + p.nbias) * sizeof(float));
  if (!wp) return OT_ERR_OOM;
  float *xp = wp + p.nw, *yb = xp + p.nx, *bias = a->bias ? yb + p.ny : NULL;
  if (bias) ot_load_f32(bias, a->bias, d, N);
  int64_t x_loaded = -1; /* m0 of the x panel held in xp */
  for (int64_t n0 = 0; n0 < N; n0 += NB) {
    const int64_t nb = min64(NB, N - n0);
    load_block(ctx, wp, K, ot_ptr((void *)a->weight, d, n0 * K), K, d, nb, K);
    for (int64_t m0 = 0; m0 < M; m0 += MB) {
      const int64_t mb = min64(MB, M - m0);
      if (x_loaded != m0) {
        load_block(ctx, xp, K, ot_ptr((void *)a->x, d, m0 * a->x_stride), a->x_stride, d, mb,
                   K);
        x_loaded = m0;
      }
      float beta = 0.0f;
      if (bias) {
        for (int64_t r = 0; r < mb; r++) memcpy(yb + r * nb, bias + n0, (size_t)nb * sizeof(float));
        beta = 1.0f;
      }
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)mb, (int)nb, (int)K, 1.0f, xp,
                  (int)K, wp, (int)K, beta, yb, (int)nb);
      store_block(ctx, ot_ptr(a->y, d, m0 * a->y_stride + n0), a->y_stride, yb, nb, d, mb, nb);
    }
  }
  ot_cpu_temp_free(ctx, wp);
  return OT_OK;
}

ot_status ot_cpu_linear_forward(ot_context *ctx, const ot_linear_forward_args *a) {
  const int64_t M = a->rows, K = a->in_features, N = a->out_features;
  if (M == 0 || N == 0) return OT_OK;
  if (K == 0) { /* the empty sum: y = bias, or 0 */
    fill_rows(a->y, a->y_stride, a->bias, a->dtype, M, N);
    return OT_OK;
  }
  if (!fits_int(M) || !fits_int(N) || !fits_int(K) || !fits_int(a->x_stride) ||
      !fits_int(a->y_stride))
    return ot_error(OT_ERR_UNSUPPORTED, "ot_linear_forward",
                    "x, y: sizes and row strides above 2^31 - 1 are not supported by BLAS");
  blas_threads bt = blas_threads_enter(ctx);
  ot_status st = OT_OK;
  if (a->dtype == OT_F32) forward_f32(a);
  else if (M <= SMALL_M) st = forward_small_m(ctx, a);
  else st = forward_lowp(ctx, a);
  blas_threads_leave(ctx, bt);
  return st;
}

/* ---------------------------------------------------------------------------------- */
/* Backward                                                                          */

/* The scratch of one backward call, allocated in one piece before any output is
 * written (an allocation failure then leaves every output untouched). */
typedef struct bwd_scratch {
  int64_t dx_nb, dx_mb;  /* dx: weight panel rows, row panel rows */
  int64_t dw_mb;         /* dweight: row panel rows */
  int db_threads;        /* dbias: partial sums */
  float *dx_w, *dx_dy, *dx_acc;   /* [dx_nb, K], [dx_mb, dx_nb], [dx_mb, K] */
  float *dw_dy, *dw_x, *dw_acc;   /* [dw_mb, N], [dw_mb, K], [N, K] */
  float *db_part;                 /* [db_threads, 2, N] */
  void *block;
} bwd_scratch;

/* Which backward outputs need a product (BLAS) or a sum; the others are empty or empty
 * sums. */
static void bwd_needs(const ot_linear_backward_args *a, bool *gemm_dx, bool *gemm_dw,
                      bool *sum_db) {
  const int64_t M = a->rows, K = a->in_features, N = a->out_features;
  *gemm_dx = a->dx && M > 0 && K > 0 && N > 0;
  *gemm_dw = a->dweight && N > 0 && K > 0 && M > 0;
  *sum_db = a->dbias && N > 0 && M > 0;
}

/* Fills s's panel sizes, and its pointers into `block` unless NULL; returns the float32
 * elements of the block. */
static int64_t bwd_scratch_layout(const ot_context *ctx, const ot_linear_backward_args *a,
                                  bwd_scratch *s, float *block) {
  const int64_t M = a->rows, K = a->in_features, N = a->out_features;
  bool need_dx, need_dw, need_db;
  bwd_needs(a, &need_dx, &need_dw, &need_db);
  const bool lowp = a->dtype != OT_F32;
  int64_t n_dx_w = 0, n_dx_dy = 0, n_dx_acc = 0, n_dw_dy = 0, n_dw_x = 0, n_dw_acc = 0, n_db = 0;
  memset(s, 0, sizeof *s);
  if (need_dx && lowp) {
    s->dx_nb = panel_rows(PANEL_BIG, K, N);
    s->dx_mb = min64(panel_rows(PANEL_SMALL, K, M), panel_rows(PANEL_SMALL, s->dx_nb, M));
    n_dx_w = s->dx_nb * K;
    n_dx_dy = s->dx_mb * s->dx_nb;
    n_dx_acc = s->dx_mb * K;
  }
  if (need_dw && lowp) {
    s->dw_mb = panel_rows(PANEL_BIG, N + K, M);
    n_dw_dy = s->dw_mb * N;
    n_dw_x = s->dw_mb * K;
    n_dw_acc = N * K;
  }
  if (need_db) {
    /* at least 64 rows per thread: fewer do not pay for the team */
    s->db_threads = (int)max64(1, min64(ctx->num_threads, M / 64));
    n_db = 2 * (int64_t)s->db_threads * N;
  }
  const int64_t total = n_dx_w + n_dx_dy + n_dx_acc + n_dw_dy + n_dw_x + n_dw_acc + n_db;
  float *p = block;
  if (!p) return total;
  s->block = p;
  s->dx_w = p; p += n_dx_w;
  s->dx_dy = p; p += n_dx_dy;
  s->dx_acc = p; p += n_dx_acc;
  s->dw_dy = p; p += n_dw_dy;
  s->dw_x = p; p += n_dw_x;
  s->dw_acc = p; p += n_dw_acc;
  s->db_part = p;
  return total;
}

size_t ot_cpu_linear_backward_temp_bytes(const ot_context *ctx,
                                         const ot_linear_backward_args *a) {
  bwd_scratch s;
  return (size_t)bwd_scratch_layout(ctx, a, &s, NULL) * sizeof(float);
}

/* The scratch of one backward call in one block (none when it needs none). */
static ot_status bwd_scratch_alloc(const ot_context *ctx, const ot_linear_backward_args *a,
                                   bwd_scratch *s) {
  const int64_t total = bwd_scratch_layout(ctx, a, s, NULL);
  if (total == 0) return OT_OK;
  float *p = (float *)ot_cpu_temp_alloc(ctx, "ot_linear_backward", "CPU scratch",
                                        (size_t)total * sizeof(float));
  if (!p) return OT_ERR_OOM;
  bwd_scratch_layout(ctx, a, s, p);
  return OT_OK;
}

/* dbias [N] = sum over the M rows of dy, float32 accumulation: task t sums a
 * contiguous range of rows into its own [N] partial, then the partials are added in
 * task order (the result does not depend on the team size). */
static void dbias_rows(const ot_context *ctx, const ot_linear_backward_args *a,
                       const bwd_scratch *s) {
  const int64_t M = a->rows, N = a->out_features;
  const ot_dtype d = a->dtype;
  const int T = s->db_threads;
  float *part = s->db_part;
  /* T tasks (the partition, as before); the team only as large as the work pays for */
  const int nt = ot_cpu_threads_cap(ctx, M * N, T);
#pragma omp parallel for num_threads(nt) if (nt > 1) schedule(static, 1)
  for (int t = 0; t < T; t++) {
    float *acc = part + 2 * (int64_t)t * N, *row = acc + N;
    const int64_t r0 = M * t / T, r1 = M * (t + 1) / T;
    for (int64_t j = 0; j < N; j++) acc[j] = 0.0f;
    for (int64_t r = r0; r < r1; r++) {
      ot_load_f32(row, ot_ptr((void *)a->dy, d, r * a->dy_stride), d, N);
      for (int64_t j = 0; j < N; j++) acc[j] += row[j];
    }
  }
  for (int t = 1; t < T; t++)
    for (int64_t j = 0; j < N; j++) part[j] += part[2 * (int64_t)t * N + j];
  ot_store_f32(a->dbias, part, d, N);
}

static void dx_f32(const ot_linear_backward_args *a) {
  const int64_t M = a->rows, K = a->in_features, N = a->out_features;
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)M, (int)K, (int)N, 1.0f,
              (const float *)a->dy, (int)a->dy_stride, (const float *)a->weight, (int)K, 0.0f,
              (float *)a->dx, (int)a->dx_stride);
}

static void dweight_f32(const ot_linear_backward_args *a) {
  const int64_t M = a->rows, K = a->in_features, N = a->out_features;
  cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, (int)N, (int)K, (int)M, 1.0f,
              (const float *)a->dy, (int)a->dy_stride, (const float *)a->x, (int)a->x_stride,
              0.0f, (float *)a->dweight, (int)K);
}

/* dx [M, K] = dy [M, N] W [N, K]: row panels of float32 accumulators [mb, K] outside,
 * the reduction over N in weight panels [nb, K] inside (beta = 1 after the first). The
 * weight panel is converted again for every row panel unless W fits in one panel. */
static void dx_lowp(const ot_context *ctx, const ot_linear_backward_args *a,
                    const bwd_scratch *s) {
  const int64_t M = a->rows, K = a->in_features, N = a->out_features;
  const ot_dtype d = a->dtype;
  const int64_t NB = s->dx_nb, MB = s->dx_mb;
  int64_t w_loaded = -1; /* n0 of the weight panel held in dx_w */
  for (int64_t m0 = 0; m0 < M; m0 += MB) {
    const int64_t mb = min64(MB, M - m0);
    for (int64_t n0 = 0; n0 < N; n0 += NB) {
      const int64_t nb = min64(NB, N - n0);
      if (w_loaded != n0) {
        load_block(ctx, s->dx_w, K, ot_ptr((void *)a->weight, d, n0 * K), K, d, nb, K);
        w_loaded = n0;
      }
      load_block(ctx, s->dx_dy, nb, ot_ptr((void *)a->dy, d, m0 * a->dy_stride + n0),
                 a->dy_stride, d, mb, nb);
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)mb, (int)K, (int)nb, 1.0f,
                  s->dx_dy, (int)nb, s->dx_w, (int)K, n0 ? 1.0f : 0.0f, s->dx_acc, (int)K);
    }
    store_block(ctx, ot_ptr(a->dx, d, m0 * a->dx_stride), a->dx_stride, s->dx_acc, K, d, mb, K);
  }
}

/* dweight [N, K] = dy^T x, summed over row panels of dy [mb, N] and x [mb, K] into one
 * float32 [N, K] accumulator (the size of the output), rounded once at the end. */
static void dweight_lowp(const ot_context *ctx, const ot_linear_backward_args *a,
                         const bwd_scratch *s) {
  const int64_t M = a->rows, K = a->in_features, N = a->out_features;
  const ot_dtype d = a->dtype;
  const int64_t MB = s->dw_mb;
  for (int64_t m0 = 0; m0 < M; m0 += MB) {
    const int64_t mb = min64(MB, M - m0);
    load_block(ctx, s->dw_dy, N, ot_ptr((void *)a->dy, d, m0 * a->dy_stride), a->dy_stride, d,
               mb, N);
    load_block(ctx, s->dw_x, K, ot_ptr((void *)a->x, d, m0 * a->x_stride), a->x_stride, d, mb,
               K);
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, (int)N, (int)K, (int)mb, 1.0f,
                s->dw_dy, (int)N, s->dw_x, (int)K, m0 ? 1.0f : 0.0f, s->dw_acc, (int)K);
  }
  store_block(ctx, a->dweight, K, s->dw_acc, K, d, N, K);
}

ot_status ot_cpu_linear_backward(ot_context *ctx, const ot_linear_backward_args *a) {
  const int64_t M = a->rows, K = a->in_features, N = a->out_features;
  const ot_dtype d = a->dtype;
  bool gemm_dx, gemm_dw, sum_db;
  bwd_needs(a, &gemm_dx, &gemm_dw, &sum_db);
  if ((gemm_dx || gemm_dw) &&
      (!fits_int(M) || !fits_int(N) || !fits_int(K) || !fits_int(a->x_stride) ||
       !fits_int(a->dy_stride) || !fits_int(a->dx_stride)))
    return ot_error(OT_ERR_UNSUPPORTED, "ot_linear_backward",
                    "dy, x, dx: sizes and row strides above 2^31 - 1 are not supported by BLAS");
  bwd_scratch s;
  OT_TRY(bwd_scratch_alloc(ctx, a, &s));

  /* The empty sums: dx = 0 when N = 0; dweight, dbias = 0 when M = 0. */
  if (a->dx && M > 0 && K > 0 && N == 0) fill_rows(a->dx, a->dx_stride, NULL, d, M, K);
  if (a->dweight && N > 0 && K > 0 && M == 0) fill_rows(a->dweight, K, NULL, d, N, K);
  if (a->dbias && N > 0 && M == 0) fill_rows(a->dbias, N, NULL, d, 1, N);

  if (gemm_dx || gemm_dw) {
    blas_threads bt = blas_threads_enter(ctx);
    if (d == OT_F32) {
      if (gemm_dx) dx_f32(a);
      if (gemm_dw) dweight_f32(a);
    } else {
      if (gemm_dx) dx_lowp(ctx, a, &s);
      if (gemm_dw) dweight_lowp(ctx, a, &s);
    }
    blas_threads_leave(ctx, bt);
  }
  if (sum_db) dbias_rows(ctx, a, &s);
  ot_cpu_temp_free(ctx, s.block);
  return OT_OK;
}
