/*
 * norm_backward.c -- the thread driver shared by the RMSNorm and LayerNorm CPU backward.
 *
 * Rows are split into contiguous blocks, one per thread; each thread owns a float32
 * scratch of 4 padded rows [g | h or xhat | dweight partial | dbias partial] and calls the
 * op's row function on its block. The partials are then added in thread order, so
 * dweight / dbias are deterministic for a given thread count, and rounded once.
 */
#include <stdlib.h>
#ifdef _OPENMP
#include <omp.h>
#endif

#include "core/norm.h"
#include "cpu/threads.h"
#include "cpu/temp.h"

ot_status ot_cpu_norm_backward_driver(ot_context *ctx, const ot_norm_backward_args *a,
                                      const char *op, ot_norm_backward_rows_fn rows_fn) {
  int64_t n = a->cols, pad = ot_norm_pad(n);
  int nt = ot_cpu_threads_cap(ctx, a->rows * n, a->rows);
  int64_t per_thread = 4 * pad;
  /* [weight | thread t: 4 rows] */
  float *buf = (float *)ot_cpu_temp_alloc(ctx, op, "CPU scratch",
                                          (size_t)(pad + per_thread * nt) * sizeof(float));
  if (!buf) return OT_ERR_OOM;
  const float *w = NULL;
  if (a->weight) {
    ot_norm_load_row(buf, a->weight, a->dtype, n);
    w = buf;
  }
#pragma omp parallel num_threads(nt) if (nt > 1)
  {
#ifdef _OPENMP
    int t = omp_get_thread_num();
#else
    int t = 0;
#endif
    int64_t r0, r1;
    ot_norm_block(a->rows, t, nt, &r0, &r1);
    float *s = buf + pad + per_thread * t;
    float *dw = a->dweight ? s + 2 * pad : NULL;
    float *db = a->dbias ? s + 3 * pad : NULL;
    if (dw) memset(dw, 0, (size_t)n * sizeof(float));
    if (db) memset(db, 0, (size_t)n * sizeof(float));
    rows_fn(a, r0, r1, s, w, dw, db);
  }
  for (int k = 0; k < 2; k++) {
    void *dst = k == 0 ? a->dweight : a->dbias;
    if (!dst) continue;
    float *p0 = buf + pad + (2 + k) * pad;
    for (int t = 1; t < nt; t++) {
      const float *pt = buf + pad + per_thread * t + (2 + k) * pad;
      for (int64_t i = 0; i < n; i++) p0[i] += pt[i];
    }
    ot_norm_store_row(dst, p0, a->dtype, n);
  }
  ot_cpu_temp_free(ctx, buf);
  return OT_OK;
}
