/*
 * adamw.c -- CPU AdamW step over a list of tensors (the oracle of src/cuda/adamw.cu).
 *
 * The tensors are cut into chunks of OT_ADAMW_CHUNK elements and the chunks of all
 * tensors form one parallel loop, so many small tensors (norm weights, biases) and a
 * few large ones share the team evenly. Each chunk is converted to float32 in blocks
 * of OT_ADAMW_BLOCK elements, updated, and rounded back; the arithmetic is the same
 * expression, in the same order, as the CUDA kernel's (adamw_update in
 * src/cuda/adamw.cu), so the two backends agree to the last bit up to FMA contraction.
 */
#include <math.h>
#include <stdlib.h>

#include "core/adamw.h"
#include "cpu/threads.h"
#include "cpu/temp.h"

#define OT_ADAMW_CHUNK ((int64_t)1 << 16)
#define OT_ADAMW_BLOCK 512

/* One element's update; w is the float32 weight (master or param). */
static inline void adamw_update(float *w, float *m, float *v, float g, const ot_adamw_args *a) {
  float ww = *w * a->decay;
  float mm = a->beta1 * *m + (1.0f - a->beta1) * g;
  float vv = a->beta2 * *v + (1.0f - a->beta2) * g * g;
  float denom = sqrtf(vv) / a->bc2_sqrt + a->eps;
  *w = ww - a->step_size * (mm / denom);
  *m = mm;
  *v = vv;
}

static void update_block(const ot_adamw_args *a, const ot_adamw_tensor *t, int64_t off,
                         int64_t k) {
  float w[OT_ADAMW_BLOCK], g[OT_ADAMW_BLOCK], m[OT_ADAMW_BLOCK], v[OT_ADAMW_BLOCK];
  const ot_dtype pd = a->param_dtype, gd = a->grad_dtype, sd = a->state_dtype;
  if (a->has_master) ot_load_f32(w, t->master + off, OT_F32, k);
  else ot_load_f32(w, ot_ptr(t->param, pd, off), pd, k);
  ot_load_f32(g, ot_ptr((void *)t->grad, gd, off), gd, k);
  ot_load_f32(m, ot_ptr(t->exp_avg, sd, off), sd, k);
  ot_load_f32(v, ot_ptr(t->exp_avg_sq, sd, off), sd, k);
  for (int64_t i = 0; i < k; i++) adamw_update(&w[i], &m[i], &v[i], g[i], a);
  ot_store_f32(ot_ptr(t->exp_avg, sd, off), m, sd, k);
  ot_store_f32(ot_ptr(t->exp_avg_sq, sd, off), v, sd, k);
  if (a->has_master) ot_store_f32(t->master + off, w, OT_F32, k);
  ot_store_f32(ot_ptr(t->param, pd, off), w, pd, k);
}

ot_status ot_cpu_adamw_step(ot_context *ctx, const ot_adamw_args *a) {
  /* chunk table: first chunk index of each tensor */
  int64_t *first = (int64_t *)ot_cpu_temp_alloc(ctx, "ot_adamw_step", "the chunk table",
                                                 (size_t)(a->n + 1) * sizeof *first);
  if (!first) return OT_ERR_OOM;
  first[0] = 0;
  for (int i = 0; i < a->n; i++)
    first[i + 1] = first[i] + (a->tensors[i].numel + OT_ADAMW_CHUNK - 1) / OT_ADAMW_CHUNK;
  const int64_t nchunks = first[a->n];
  const int nt = ot_cpu_threads_cap(ctx, a->total, nchunks);
#pragma omp parallel for num_threads(nt) schedule(dynamic, 1) if (nt > 1)
  for (int64_t c = 0; c < nchunks; c++) {
    /* the tensor of chunk c: binary search in first[] */
    int lo = 0, hi = a->n - 1;
    while (lo < hi) {
      int mid = (lo + hi + 1) / 2;
      if (first[mid] <= c) lo = mid;
      else hi = mid - 1;
    }
    const ot_adamw_tensor *t = &a->tensors[lo];
    const int64_t start = (c - first[lo]) * OT_ADAMW_CHUNK;
    const int64_t end = start + OT_ADAMW_CHUNK < t->numel ? start + OT_ADAMW_CHUNK : t->numel;
    for (int64_t off = start; off < end; off += OT_ADAMW_BLOCK)
      update_block(a, t, off, end - off < OT_ADAMW_BLOCK ? end - off : OT_ADAMW_BLOCK);
  }
  ot_cpu_temp_free(ctx, first);
  return OT_OK;
}
