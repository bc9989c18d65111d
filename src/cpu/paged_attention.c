/*
 * paged_attention.c -- CPU kernels of the paged KV ops: the append scatter and the
 * paged (flash-decoding) attention.
 *
 * Attention: one task per (sequence b, kv head g, key split s). A task owns the rows of
 * all the query heads of group g and all the queries of b (decode: 1..few rows per head;
 * chunked prefill: the chunk), walks its key range [k0, k1) in chunks of PA_KC keys that
 * it gathers through the page table into float32 (K and V, once per chunk for every row
 * of the group: the GQA sharing), and keeps an online softmax (m, l, acc[D]) per row.
 * Rows are processed PA_RB at a time so the state stays in L1/L2 for prefill chunks.
 * With one split the task normalizes straight into out / lse; with several it writes its
 * partial (O_s normalized, lse_s) into a float32 workspace and a second pass merges:
 *     M = max_s lse_s,  lse = M + log sum_s exp(lse_s - M),  O = sum_s exp(lse_s - lse) O_s
 * with empty splits (lse_s = -inf) weighing 0 and all-empty rows giving O = 0, -inf.
 */
#include <inttypes.h>
#include <math.h>
#include <stdlib.h>
#ifdef _OPENMP
#include <omp.h>
#endif

#include "core/paged_attention.h"
#include "cpu/threads.h"
#include "cpu/temp.h"

#define PA_KC 64 /* keys gathered per chunk */
#define PA_RB 32 /* query rows (token, head) per row block */

/* ---- append ------------------------------------------------------------------------- */

ot_status ot_cpu_kv_append(ot_context *ctx, const ot_kv_append_args *a) {
  const ot_paged_table *t = &a->kv;
  const int64_t tokens = a->cu_new[t->batch];
  const size_t row_bytes = (size_t)t->d * ot_dtype_size(a->dtype);
  /* work: elements copied (K and V) */
  const int nt = ot_cpu_threads_cap(ctx, 2 * tokens * t->hkv * t->d, t->batch);
#pragma omp parallel for num_threads(nt) schedule(static) if (nt > 1)
  for (int64_t b = 0; b < t->batch; b++) {
    const int64_t n = (int64_t)a->cu_new[b + 1] - a->cu_new[b], len = ot_paged_len(t, b);
    for (int64_t i = 0; i < n; i++) {
      const int64_t row = a->cu_new[b] + i, tok = len - n + i;
      for (int64_t h = 0; h < t->hkv; h++) {
        int64_t off = ot_paged_offset(t, b, tok, h);
        memcpy(ot_ptr(t->k_pages, a->dtype, off),
               ot_ptr((void *)a->k_new, a->dtype, row * a->k_tok_stride + h * a->k_head_stride),
               row_bytes);
        memcpy(ot_ptr(t->v_pages, a->dtype, off),
               ot_ptr((void *)a->v_new, a->dtype, row * a->v_tok_stride + h * a->v_head_stride),
               row_bytes);
      }
    }
  }
  return OT_OK;
}

/* ---- split choice ------------------------------------------------------------------- */

int64_t ot_paged_num_splits(int64_t batch, int64_t hkv, int64_t len, int threads) {
  int64_t base = batch * hkv, target = 2 * (int64_t)(threads > 1 ? threads : 1);
  if (base >= target || len <= OT_PAGED_MIN_CHUNK) return 1;
  int64_t want = (target + base - 1) / base;
  int64_t most = (len + OT_PAGED_MIN_CHUNK - 1) / OT_PAGED_MIN_CHUNK;
  return want < most ? want : most;
}

/* ---- attention ---------------------------------------------------------------------- */

typedef struct pa_task {
  int64_t b, g, s;   /* sequence, kv head, split */
  int64_t k0, k1;    /* key range */
} pa_task;

typedef struct pa_seq {
  int64_t sq, len, splits, chunk;
  int64_t ws;        /* first workspace entry (split seqs only) */
} pa_seq;

/* Visible keys [lo, hi] of query i of a sequence with sq queries and len keys. */
static inline void pa_key_range(const ot_paged_attention_args *a, int64_t i, int64_t sq,
                                int64_t len, int64_t *lo, int64_t *hi) {
  int64_t diag = i + (len - sq);
  int64_t l = a->window_left < 0 ? 0 : diag - a->window_left;
  int64_t h = a->window_right < 0 ? len - 1 : diag + a->window_right;
  *lo = l < 0 ? 0 : l;
  *hi = h > len - 1 ? len - 1 : h;
}

/* Gather keys [j0, j0 + n) of (b, g) into float32 rows of d. */
static void pa_gather(const ot_paged_attention_args *a, const void *pages, int64_t b, int64_t g,
                      int64_t j0, int64_t n, float *dst) {
  const ot_paged_table *t = &a->kv;
  int64_t j = 0;
  while (j < n) {
    int64_t tok = j0 + j;
    /* a run within one page is contiguous in the HND layout */
    int64_t run = t->bs - tok % t->bs;
    if (run > n - j) run = n - j;
    ot_load_f32(dst + j * t->d, ot_ptr((void *)pages, a->dtype, ot_paged_offset(t, b, tok, g)),
                a->dtype, run * t->d);
    j += run;
  }
}

static void pa_task_run(const ot_paged_attention_args *a, const pa_task *tk, const pa_seq *sq_info,
                        float *ws_o, float *ws_lse, float *scratch) {
  const ot_paged_table *t = &a->kv;
  const int64_t d = t->d, group = a->hq / t->hkv;
  const pa_seq *S = &sq_info[tk->b];
  const int64_t rows = S->sq * group, q0 = a->cu_q[tk->b];
  float *kbuf = scratch, *vbuf = kbuf + PA_KC * d, *qf = vbuf + PA_KC * d;
  float *acc = qf + PA_RB * d, *sc = acc + PA_RB * d;
  float m[PA_RB], l[PA_RB];
  int64_t lo[PA_RB], hi[PA_RB];
  for (int64_t r0 = 0; r0 < rows; r0 += PA_RB) {
    const int64_t nr = rows - r0 < PA_RB ? rows - r0 : PA_RB;
    int64_t klo = tk->k1, khi = tk->k0 - 1; /* union of the rows' ranges within the split */
    for (int64_t r = 0; r < nr; r++) {
      /* row r0 + r: query i, head h = g * group + hh (heads of a group adjacent) */
      int64_t i = (r0 + r) / group, h = tk->g * group + (r0 + r) % group;
      ot_load_f32(qf + r * d,
                  ot_ptr((void *)a->q, a->dtype, (q0 + i) * a->q_tok_stride + h * a->q_head_stride),
                  a->dtype, d);
      pa_key_range(a, i, S->sq, S->len, &lo[r], &hi[r]);
      if (lo[r] < tk->k0) lo[r] = tk->k0;
      if (hi[r] > tk->k1 - 1) hi[r] = tk->k1 - 1;
      if (lo[r] <= hi[r]) {
        if (lo[r] < klo) klo = lo[r];
        if (hi[r] > khi) khi = hi[r];
      }
      m[r] = -INFINITY;
      l[r] = 0.0f;
      for (int64_t x = 0; x < d; x++) acc[r * d + x] = 0.0f;
    }
    for (int64_t j0 = klo; j0 <= khi; j0 += PA_KC) {
      const int64_t n = khi + 1 - j0 < PA_KC ? khi + 1 - j0 : PA_KC;
      pa_gather(a, t->k_pages, tk->b, tk->g, j0, n, kbuf);
      pa_gather(a, t->v_pages, tk->b, tk->g, j0, n, vbuf);
      for (int64_t r = 0; r < nr; r++) {
        int64_t jl = lo[r] > j0 ? lo[r] - j0 : 0, jh = hi[r] < j0 + n - 1 ? hi[r] - j0 : n - 1;
        if (jl > jh) continue;
        const float *qr = qf + r * d;
        float mx = m[r];
        for (int64_t j = jl; j <= jh; j++) {
          const float *kr = kbuf + j * d;
          float dot = 0.0f;
#pragma omp simd reduction(+ : dot)
          for (int64_t x = 0; x < d; x++) dot += qr[x] * kr[x];
          float s = a->scale * dot;
          if (a->softcap > 0) s = a->softcap * tanhf(s / a->softcap);
          sc[j] = s;
          if (s > mx) mx = s;
        }
        float alpha = expf(m[r] - mx); /* exp(-inf) = 0 on the first chunk */
        float sum = 0.0f;
        for (int64_t j = jl; j <= jh; j++) {
          sc[j] = expf(sc[j] - mx);
          sum += sc[j];
        }
        float *ar = acc + r * d;
#pragma omp simd
        for (int64_t x = 0; x < d; x++) ar[x] *= alpha;
        for (int64_t j = jl; j <= jh; j++) {
          const float pj = sc[j], *vr = vbuf + j * d;
#pragma omp simd
          for (int64_t x = 0; x < d; x++) ar[x] += pj * vr[x];
        }
        l[r] = l[r] * alpha + sum;
        m[r] = mx;
      }
    }
    /* finish the rows of the block */
    for (int64_t r = 0; r < nr; r++) {
      int64_t i = (r0 + r) / group, h = tk->g * group + (r0 + r) % group;
      float inv = l[r] > 0 ? 1.0f / l[r] : 0.0f;
      float lse = l[r] > 0 ? m[r] + logf(l[r]) : -INFINITY;
      float *ar = acc + r * d;
      for (int64_t x = 0; x < d; x++) ar[x] *= inv;
      if (S->splits == 1) {
        ot_store_f32(ot_ptr(a->out, a->dtype, (q0 + i) * a->out_tok_stride + h * a->out_head_stride),
                     ar, a->dtype, d);
        if (a->lse) a->lse[h * a->lse_head_stride + (q0 + i) * a->lse_tok_stride] = lse;
      } else {
        int64_t e = S->ws + (tk->s * S->sq + i) * a->hq + h;
        memcpy(ws_o + e * d, ar, (size_t)d * sizeof *ar);
        ws_lse[e] = lse;
      }
    }
  }
}

ot_status ot_cpu_paged_attention(ot_context *ctx, const ot_paged_attention_args *a) {
  static const char *op = "ot_paged_attention";
  const ot_paged_table *t = &a->kv;
  const int64_t B = t->batch, d = t->d;
  const int threads = ctx->num_threads > 0 ? ctx->num_threads : 1;
  pa_seq *S = (pa_seq *)ot_cpu_temp_alloc(ctx, op, "the plan", (size_t)B * sizeof *S);
  if (!S) return OT_ERR_OOM;
  int64_t ntasks = 0, ws_entries = 0, pairs = 0;
  for (int64_t b = 0; b < B; b++) {
    S[b].sq = (int64_t)a->cu_q[b + 1] - a->cu_q[b];
    S[b].len = ot_paged_len(t, b);
    pairs += S[b].sq * S[b].len;
    S[b].splits = S[b].sq > 0 ? ot_paged_num_splits(B, t->hkv, S[b].len, threads) : 0;
    S[b].chunk = S[b].splits ? (S[b].len + S[b].splits - 1) / S[b].splits : 0;
    S[b].ws = ws_entries;
    if (S[b].splits > 1) ws_entries += S[b].splits * S[b].sq * a->hq;
    ntasks += S[b].splits * t->hkv;
  }
  /* One block: [tasks | split partials: out [ws_entries, d], lse [ws_entries] | per thread
   * scratch], each part 64-byte aligned. */
  const int64_t per_thread = 2 * PA_KC * d + 2 * PA_RB * d + PA_KC;
  const size_t tasks_bytes = ((size_t)ntasks * sizeof(pa_task) + 63) / 64 * 64,
               o_bytes = ((size_t)(ws_entries * d) * sizeof(float) + 63) / 64 * 64,
               lse_bytes = ((size_t)ws_entries * sizeof(float) + 63) / 64 * 64;
  char *block = (char *)ot_cpu_temp_alloc(
      ctx, op, "the workspace",
      tasks_bytes + o_bytes + lse_bytes + (size_t)(threads * per_thread) * sizeof(float));
  if (!block) {
    ot_cpu_temp_free(ctx, S);
    return OT_ERR_OOM;
  }
  pa_task *tasks = (pa_task *)block;
  float *ws_o = ws_entries ? (float *)(block + tasks_bytes) : NULL;
  float *ws_lse = ws_entries ? (float *)(block + tasks_bytes + o_bytes) : NULL;
  float *scratch = (float *)(block + tasks_bytes + o_bytes + lse_bytes);
  /* Tasks by sequence, kv head, split; dynamic scheduling balances unequal lengths. */
  int64_t k = 0;
  for (int64_t b = 0; b < B; b++)
    for (int64_t g = 0; g < t->hkv; g++)
      for (int64_t s = 0; s < S[b].splits; s++) {
        int64_t k0 = s * S[b].chunk, k1 = k0 + S[b].chunk;
        tasks[k++] = (pa_task){b, g, s, k0, k1 < S[b].len ? k1 : S[b].len};
      }
  /* The splits follow the context's thread count (as they did: results unchanged); the
   * team follows the work, FLOPs / 8 (4 D per (query, key) pair and query head; see
   * cpu/threads.h). */
  const int nt = ot_cpu_threads_cap(ctx, 4 * d * a->hq * pairs / 8, ntasks);
#pragma omp parallel num_threads(nt) if (nt > 1)
  {
#ifdef _OPENMP
    float *mine = scratch + (int64_t)omp_get_thread_num() * per_thread;
#else
    float *mine = scratch;
#endif
#pragma omp for schedule(dynamic, 1)
    for (int64_t i = 0; i < ntasks; i++) pa_task_run(a, &tasks[i], S, ws_o, ws_lse, mine);
  }
  /* Merge the splits: one (query, head) row at a time, in split order (deterministic). */
  if (ws_entries) {
    const int mt = ot_cpu_threads_cap(ctx, ws_entries * d, B);
#pragma omp parallel for num_threads(mt) schedule(static) if (mt > 1)
    for (int64_t b = 0; b < B; b++) {
      if (S[b].splits < 2) continue;
#ifdef _OPENMP
      float *o = scratch + (int64_t)omp_get_thread_num() * per_thread;
#else
      float *o = scratch;
#endif
      const int64_t q0 = a->cu_q[b];
      for (int64_t i = 0; i < S[b].sq; i++)
        for (int64_t h = 0; h < a->hq; h++) {
          const int64_t e0 = S[b].ws + i * a->hq + h, es = S[b].sq * a->hq; /* split stride */
          float M = -INFINITY, wsum = 0.0f, lse = -INFINITY;
          for (int64_t s = 0; s < S[b].splits; s++)
            if (ws_lse[e0 + s * es] > M) M = ws_lse[e0 + s * es];
          for (int64_t x = 0; x < d; x++) o[x] = 0.0f;
          if (M > -INFINITY) { /* else every split was empty: out 0, lse -inf */
            for (int64_t s = 0; s < S[b].splits; s++) wsum += expf(ws_lse[e0 + s * es] - M);
            for (int64_t s = 0; s < S[b].splits; s++) {
              const float w = expf(ws_lse[e0 + s * es] - M) / wsum;
              const float *po = ws_o + (e0 + s * es) * d;
              if (w == 0.0f) continue;
              for (int64_t x = 0; x < d; x++) o[x] += w * po[x];
            }
            lse = M + logf(wsum);
          }
          ot_store_f32(ot_ptr(a->out, a->dtype, (q0 + i) * a->out_tok_stride + h * a->out_head_stride),
                       o, a->dtype, d);
          if (a->lse) a->lse[h * a->lse_head_stride + (q0 + i) * a->lse_tok_stride] = lse;
        }
    }
  }
  ot_cpu_temp_free(ctx, block);
  ot_cpu_temp_free(ctx, S);
  return OT_OK;
}
