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
#include "cpu/temp.h"

/* float32 elements of the dweight panel (and of the converted dlogits panel). */
#define LCE_PANEL ((int64_t)1 << 21)

/* Vocabulary rows of a dweight panel for a chunk of c tokens. */
static int64_t panel_rows(const ot_lce_args *a, int64_t c) {
  int64_t vb = LCE_PANEL / (c > a->H ? c : a->H);
  if (vb < 1) vb = 1;
  if (vb > a->V) vb = a->V;
  return vb;
}

/* dweight[v0 .. v0 + vb) (+)= dlogits[:, v0 .. v0 + vb)^T hidden_c, for every panel of
 * vocabulary rows. hf: the chunk's hidden rows in float32 [c, H]; lf [c, vb], pf [vb, H]
 * (NULL for a float32 dweight): the panels, taken by the caller before any output. */
static void accumulate_dweight(const ot_lce_args *a, const void *dlogits, const float *hf,
                               int64_t c, bool first, float *lf, float *pf) {
  const int64_t H = a->H, V = a->V;
  const size_t es = ot_dtype_size(a->dtype);
  const int64_t vb = panel_rows(a, c);
  const bool direct = a->dweight_dtype == OT_F32;
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
}

/* The linear forward (logits of chunk t0 .. t0 + c) and backward (its dhidden) calls. */
static ot_linear_forward_args chunk_forward(const ot_lce_args *a, int64_t t0, int64_t c,
                                            void *logits) {
  ot_linear_forward_args lf;
  memset(&lf, 0, sizeof lf);
  lf.dtype = a->dtype;
  lf.rows = c;
  lf.in_features = a->H;
  lf.out_features = a->V;
  lf.x = (const char *)a->hidden + (size_t)(t0 * a->hidden_stride) * ot_dtype_size(a->dtype);
  lf.x_stride = a->hidden_stride;
  lf.weight = a->weight;
  lf.y = logits;
  lf.y_stride = a->V;
  return lf;
}

static ot_linear_backward_args chunk_backward(const ot_lce_args *a, int64_t t0, int64_t c,
                                              const void *dlogits) {
  const size_t es = ot_dtype_size(a->dtype);
  ot_linear_backward_args lb;
  memset(&lb, 0, sizeof lb);
  lb.dtype = a->dtype;
  lb.rows = c;
  lb.in_features = a->H;
  lb.out_features = a->V;
  lb.dy = dlogits;
  lb.dy_stride = a->V;
  lb.x = (const char *)a->hidden + (size_t)(t0 * a->hidden_stride) * es;
  lb.x_stride = a->hidden_stride;
  lb.weight = a->weight;
  lb.dx = a->dhidden ? (char *)a->dhidden + (size_t)(t0 * a->dhidden_stride) * es : NULL;
  lb.dx_stride = a->dhidden_stride;
  return lb;
}

/* With an arena, the chunks' linear calls take their scratch from it while outputs are
 * being written: check first, before any output, that the largest of them fits (one
 * block taken and given back; the calls take one block at a time, each no larger). */
static ot_status check_chunk_scratch(ot_context *ctx, const ot_lce_args *a, int64_t c0,
                                     int64_t c1, void *logits) {
  if (!ctx->host_arena) return OT_OK;
  size_t need = 0;
  const int64_t cs[2] = {c0, c1};
  for (int i = 0; i < 2; i++) {
    ot_linear_forward_args lf = chunk_forward(a, 0, cs[i], logits);
    size_t f = ot_cpu_linear_forward_temp_bytes(ctx, &lf);
    if (f > need) need = f;
    if (!a->dhidden) continue;
    ot_linear_backward_args lb = chunk_backward(a, 0, cs[i], logits);
    size_t b = ot_cpu_linear_backward_temp_bytes(ctx, &lb);
    if (b > need) need = b;
  }
  if (need == 0) return OT_OK;
  void *p = ot_cpu_temp_alloc(ctx, "ot_linear_cross_entropy", "the chunks' linear scratch", need);
  if (!p) return OT_ERR_OOM;
  ot_cpu_temp_free(ctx, p);
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
    own = ws = (char *)ot_cpu_temp_alloc(ctx, op, "the workspace", lay.total);
    if (!ws) return OT_ERR_OOM;
  }
  /* The two chunk lengths there are: C (or T), and the last chunk's. */
  const int64_t c0 = T < C ? T : C, c1 = T > 0 && T % C ? T % C : c0;
  /* dweight: [float32 hidden chunk [C, H] | dlogits panel | dweight panel], one block taken
   * before any output is written, the panels sized for both chunk lengths. */
  float *hf = NULL, *lpanel = NULL, *ppanel = NULL;
  if (a->dweight && T > 0) {
    const int64_t n_l0 = c0 * panel_rows(a, c0), n_l1 = c1 * panel_rows(a, c1);
    const int64_t nh = (c0 * H + 15) / 16 * 16, nl = ((n_l0 > n_l1 ? n_l0 : n_l1) + 15) / 16 * 16;
    const int64_t np = a->dweight_dtype == OT_F32 ? 0 : panel_rows(a, c1 < c0 ? c1 : c0) * H;
    hf = (float *)ot_cpu_temp_alloc(ctx, op, "the dweight panels",
                                    (size_t)(nh + nl + np) * sizeof(float));
    if (!hf) {
      ot_cpu_temp_free(ctx, own);
      return OT_ERR_OOM;
    }
    lpanel = hf + nh;
    ppanel = np ? lpanel + nl : NULL;
  }
  void *logits = ws + lay.logits;
  if (T > 0 && check_chunk_scratch(ctx, a, c0, c1, logits) != OT_OK) {
    ot_cpu_temp_free(ctx, hf);
    ot_cpu_temp_free(ctx, own);
    return OT_ERR_OOM;
  }
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

    ot_linear_forward_args lf = chunk_forward(a, t0, c, logits);
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
      ot_linear_backward_args lb = chunk_backward(a, t0, c, logits);
      if ((st = ot_cpu_linear_backward(ctx, &lb)) != OT_OK) break;
    }
    if (a->dweight) {
      for (int64_t r = 0; r < c; r++)
        ot_load_f32(hf + r * H, (const char *)h + (size_t)(r * a->hidden_stride) * es, a->dtype,
                    H);
      accumulate_dweight(a, logits, hf, c, t0 == 0, lpanel, ppanel);
    }
  }
  if (st == OT_OK && !none) {
    double total = 0.0;
    for (int64_t r = 0; r < T; r++) total += row_loss[r];
    if (a->reduction == OT_REDUCTION_MEAN) total = a->count > 0 ? total / (double)a->count : NAN;
    a->loss[0] = (float)total;
  }
  ot_cpu_temp_free(ctx, hf);
  ot_cpu_temp_free(ctx, own);
  return st;
}
