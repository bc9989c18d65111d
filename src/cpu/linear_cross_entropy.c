/*
 * linear_cross_entropy.c -- CPU fused linear + cross-entropy (the oracle of
 * src/cuda/linear_cross_entropy.cu), built from the library's own CPU kernels.
 *
 * Per chunk of C tokens (see the public header for the algorithm):
 *   logits   ot_cpu_linear_forward (BLAS) into the workspace's [C, V] chunk, in the
 *            storage dtype
 *   losses   ot_cpu_cross_entropy_forward, reduction NONE, into the row losses
 *   dlogits  ot_cpu_cross_entropy_backward, reduction NONE with dloss = g for every row
 *            (g = 1 for SUM, 1 / count for MEAN: the gradient of the reduced loss),
 *            written over the logits
 *   dhidden  ot_cpu_linear_backward (dx only)
 *   dweight  accumulate_dweight: D = round(dlogits^T hidden + (first chunk ? 0 : D)),
 *            the float32 product of a panel of vocabulary rows rounded once into
 *            dweight's dtype -- what cuBLASLt does with beta = 1 on the GPU.
 * MEAN / SUM reduce the row losses in token order in float64 at the end.
 */
#include <math.h>
#include <stdlib.h>

#include <cblas.h>

#include "core/linear.h"
#include "core/linear_cross_entropy.h"
#include "core/softmax.h"

/* float32 elements of the dweight panel (and of the converted dlogits panel). */
#define LCE_PANEL ((int64_t)1 << 21)

/* dweight[v0 .. v0 + vb) (+)= dlogits[:, v0 .. v0 + vb)^T hidden_c, for every panel of
 * vocabulary rows. hf: the chunk's hidden rows in float32 [c, H]. */
static ot_status accumulate_dweight(const ot_lce_args *a, const void *dlogits, const float *hf,
                                    int64_t c, bool first) {
  const int64_t H = a->H, V = a->V;
  const size_t es = ot_dtype_size(a->dtype);
  int64_t vb = LCE_PANEL / (c > H ? c : H);
  if (vb < 1) vb = 1;
  if (vb > V) vb = V;
  const bool direct = a->dweight_dtype == OT_F32;
  float *lf = (float *)malloc((size_t)(c * vb) * sizeof(float));
  float *pf = direct ? NULL : (float *)malloc((size_t)(vb * H) * sizeof(float));
  if (!lf || (!direct && !pf)) {
    free(lf);
    free(pf);
    return ot_error(OT_ERR_OOM, "ot_linear_cross_entropy", "cannot allocate the dweight panels");
  }
  for (int64_t v0 = 0; v0 < V; v0 += vb) {
    const int64_t k = V - v0 < vb ? V - v0 : vb;
    for (int64_t r = 0; r < c; r++)
      ot_load_f32(lf + r * k, (const char *)dlogits + (size_t)(r * V + v0) * es, a->dtype, k);
    if (direct) {
      float *dw = (float *)a->dweight + v0 * H;
      cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, (int)k, (int)H, (int)c, 1.0f, lf,
                  (int)k, hf, (int)H, first ? 0.0f : 1.0f, dw, (int)H);
      continue;
    }
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, (int)k, (int)H, (int)c, 1.0f, lf,
                (int)k, hf, (int)H, 0.0f, pf, (int)H);
    void *dw = ot_ptr(a->dweight, a->dweight_dtype, v0 * H);
    if (!first) {
      float row[1024];
      for (int64_t i = 0; i < k * H; i += 1024) {
        int64_t n = k * H - i < 1024 ? k * H - i : 1024;
        ot_load_f32(row, ot_ptr(dw, a->dweight_dtype, i), a->dweight_dtype, n);
        for (int64_t j = 0; j < n; j++) pf[i + j] += row[j];
      }
    }
    ot_store_f32(dw, pf, a->dweight_dtype, k * H);
  }
  free(lf);
  free(pf);
  return OT_OK;
}

ot_status ot_cpu_linear_cross_entropy(ot_context *ctx, const ot_lce_args *a) {
  static const char op[] = "ot_linear_cross_entropy";
  const int64_t T = a->T, H = a->H, V = a->V, C = a->chunk;
  const size_t es = ot_dtype_size(a->dtype);
  const ot_lce_layout lay = ot_lce_layout_of(T, V, C, es);
  const bool none = a->reduction == OT_REDUCTION_NONE;
  const bool grads = a->dhidden || a->dweight;
  char *ws = (char *)a->workspace;
  char *own = NULL;
  if (!ws) {
    own = ws = (char *)malloc(lay.total);
    if (!ws) return ot_error(OT_ERR_OOM, op, "cannot allocate a workspace of %zu bytes", lay.total);
  }
  float *hf = NULL;
  if (a->dweight && T > 0) {
    hf = (float *)malloc((size_t)(C * H > 0 ? C * H : 1) * sizeof(float));
    if (!hf) {
      free(own);
      return ot_error(OT_ERR_OOM, op, "cannot allocate the float32 hidden chunk");
    }
  }
  void *logits = ws + lay.logits;
  float *lse = (float *)(ws + lay.lse);
  float *row_loss = (float *)(ws + lay.row_loss);
  const float g = a->reduction == OT_REDUCTION_SUM ? 1.0f
                  : a->count > 0                   ? (float)(1.0 / (double)a->count)
                                                   : 0.0f;
  ot_status st = OT_OK;
  if (a->dweight && T == 0) {
    memset(a->dweight, 0, (size_t)(V * H) * ot_dtype_size(a->dweight_dtype));
  }
  for (int64_t t0 = 0; t0 < T && st == OT_OK; t0 += C) {
    const int64_t c = T - t0 < C ? T - t0 : C;
    const void *h = (const char *)a->hidden + (size_t)(t0 * a->hidden_stride) * es;

    ot_linear_forward_args lf;
    memset(&lf, 0, sizeof lf);
    lf.dtype = a->dtype;
    lf.rows = c;
    lf.in_features = H;
    lf.out_features = V;
    lf.x = h;
    lf.x_stride = a->hidden_stride;
    lf.weight = a->weight;
    lf.y = logits;
    lf.y_stride = V;
    if ((st = ot_cpu_linear_forward(ctx, &lf)) != OT_OK) break;

    ot_cross_entropy_args ce = ot_lce_chunk_ce_args(a, t0, c, logits, lse, row_loss);
    if ((st = ot_cpu_cross_entropy_forward(ctx, &ce)) != OT_OK) break;
    if (!grads) continue;

    ce.dloss = &g;
    ce.dloss_stride = 0;
    ce.dlogits = logits;
    ce.dlogits_stride = V;
    if ((st = ot_cpu_cross_entropy_backward(ctx, &ce)) != OT_OK) break;

    if (a->dhidden) {
      ot_linear_backward_args lb;
      memset(&lb, 0, sizeof lb);
      lb.dtype = a->dtype;
      lb.rows = c;
      lb.in_features = H;
      lb.out_features = V;
      lb.dy = logits;
      lb.dy_stride = V;
      lb.x = h;
      lb.x_stride = a->hidden_stride;
      lb.weight = a->weight;
      lb.dx = (char *)a->dhidden + (size_t)(t0 * a->dhidden_stride) * es;
      lb.dx_stride = a->dhidden_stride;
      if ((st = ot_cpu_linear_backward(ctx, &lb)) != OT_OK) break;
    }
    if (a->dweight) {
      for (int64_t r = 0; r < c; r++)
        ot_load_f32(hf + r * H, (const char *)h + (size_t)(r * a->hidden_stride) * es, a->dtype,
                    H);
      st = accumulate_dweight(a, logits, hf, c, t0 == 0);
    }
  }
  if (st == OT_OK && !none) {
    double total = 0.0;
    for (int64_t r = 0; r < T; r++) total += row_loss[r];
    if (a->reduction == OT_REDUCTION_MEAN) total = a->count > 0 ? total / (double)a->count : NAN;
    a->loss[0] = (float)total;
  }
  free(hf);
  free(own);
  return st;
}
