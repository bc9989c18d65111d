/*
 * cases_attention.c -- ot_attention_forward / ot_attention_backward against a plain
 * float64 reference (full score row per query), dense BSHD and varlen THD layouts,
 * GQA / MQA, causal and sliding-window masks, softcap, packed-qkv strided views, and
 * bad inputs. --grad: backward against finite differences of the float64 forward.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"

/* ---- the problem and its float64 reference ---------------------------------------- */

#define MAX_SEQ 16

/* Token rows of q are [qs[b], qs[b] + ql[b]) in logical order [Tq, Hq, D] (dense:
 * qs[b] = b * Sq), likewise k / v. */
typedef struct ref_prob {
  int nseq;
  int64_t qs[MAX_SEQ], ql[MAX_SEQ], ks[MAX_SEQ], kl[MAX_SEQ];
  int64_t tq, tk;
  int hq, hkv, d;
  double scale, cap;
  int causal, wl, wr;
  bool varlen;
} ref_prob;

static bool visible(const ref_prob *p, int64_t i, int64_t j, int64_t sq, int64_t sk) {
  int64_t off = sk - sq;
  if (p->causal && j > i + off) return false;
  if (p->wl >= 0 && j < i + off - p->wl) return false;
  if (p->wr >= 0 && j > i + off + p->wr) return false;
  return true;
}

static int64_t lse_index(const ref_prob *p, int b, int h, int64_t i) {
  return p->varlen ? (int64_t)h * p->tq + p->qs[b] + i : ((int64_t)b * p->hq + h) * p->ql[b] + i;
}

/* Scores of row (b, h, i) over all keys: s[j] (after softcap), raw tanh in t[j],
 * vis[j]; returns the number of visible keys. */
static int64_t ref_scores(const ref_prob *p, const double *q, const double *k, int b, int h,
                          int64_t i, double *s, double *t, bool *vis) {
  int g = h / (p->hq / p->hkv), d = p->d;
  const double *qr = q + ((p->qs[b] + i) * p->hq + h) * d;
  int64_t n = 0;
  for (int64_t j = 0; j < p->kl[b]; j++) {
    vis[j] = visible(p, i, j, p->ql[b], p->kl[b]);
    if (!vis[j]) continue;
    n++;
    const double *kr = k + ((p->ks[b] + j) * p->hkv + g) * d;
    double dot = 0;
    for (int x = 0; x < d; x++) dot += qr[x] * kr[x];
    double v = p->scale * dot;
    if (p->cap > 0) {
      t[j] = tanh(v / p->cap);
      v = p->cap * t[j];
    } else {
      t[j] = 0;
    }
    s[j] = v;
  }
  return n;
}

/* Softmax of the visible scores into pr; returns lse. */
static double ref_softmax(const double *s, const bool *vis, int64_t n, double *pr) {
  double m = -INFINITY, sum = 0;
  for (int64_t j = 0; j < n; j++)
    if (vis[j] && s[j] > m) m = s[j];
  for (int64_t j = 0; j < n; j++) {
    pr[j] = vis[j] ? exp(s[j] - m) : 0;
    sum += pr[j];
  }
  for (int64_t j = 0; j < n; j++) pr[j] /= sum;
  return m + log(sum);
}

static int64_t max_kl(const ref_prob *p) {
  int64_t m = 1;
  for (int b = 0; b < p->nseq; b++)
    if (p->kl[b] > m) m = p->kl[b];
  return m;
}

static void ref_forward(const ref_prob *p, const double *q, const double *k, const double *v,
                        double *out, double *lse) {
  int64_t mk = max_kl(p);
  double *s = malloc(mk * sizeof *s), *t = malloc(mk * sizeof *t), *pr = malloc(mk * sizeof *pr);
  bool *vis = malloc(mk * sizeof *vis);
  int d = p->d;
  for (int b = 0; b < p->nseq; b++)
    for (int h = 0; h < p->hq; h++) {
      int g = h / (p->hq / p->hkv);
      for (int64_t i = 0; i < p->ql[b]; i++) {
        double *o = out + ((p->qs[b] + i) * p->hq + h) * d;
        int64_t n = ref_scores(p, q, k, b, h, i, s, t, vis);
        for (int x = 0; x < d; x++) o[x] = 0;
        if (n == 0) {
          if (lse) lse[lse_index(p, b, h, i)] = -INFINITY;
          continue;
        }
        double l = ref_softmax(s, vis, p->kl[b], pr);
        if (lse) lse[lse_index(p, b, h, i)] = l;
        for (int64_t j = 0; j < p->kl[b]; j++) {
          if (!vis[j]) continue;
          const double *vr = v + ((p->ks[b] + j) * p->hkv + g) * d;
          for (int x = 0; x < d; x++) o[x] += pr[j] * vr[x];
        }
      }
    }
  free(s);
  free(t);
  free(pr);
  free(vis);
}

/* Analytic float64 backward: dq, dk, dv (zeroed here). */
static void ref_backward(const ref_prob *p, const double *q, const double *k, const double *v,
                         const double *dout, double *dq, double *dk, double *dv) {
  int64_t mk = max_kl(p);
  double *s = malloc(mk * sizeof *s), *t = malloc(mk * sizeof *t), *pr = malloc(mk * sizeof *pr);
  double *dp = malloc(mk * sizeof *dp);
  bool *vis = malloc(mk * sizeof *vis);
  int d = p->d;
  memset(dq, 0, (size_t)(p->tq * p->hq * d) * sizeof *dq);
  memset(dk, 0, (size_t)(p->tk * p->hkv * d) * sizeof *dk);
  memset(dv, 0, (size_t)(p->tk * p->hkv * d) * sizeof *dv);
  for (int b = 0; b < p->nseq; b++)
    for (int h = 0; h < p->hq; h++) {
      int g = h / (p->hq / p->hkv);
      for (int64_t i = 0; i < p->ql[b]; i++) {
        int64_t n = ref_scores(p, q, k, b, h, i, s, t, vis);
        if (n == 0) continue;
        ref_softmax(s, vis, p->kl[b], pr);
        const double *qr = q + ((p->qs[b] + i) * p->hq + h) * d;
        const double *dor = dout + ((p->qs[b] + i) * p->hq + h) * d;
        double *dqr = dq + ((p->qs[b] + i) * p->hq + h) * d;
        double delta = 0;
        for (int64_t j = 0; j < p->kl[b]; j++) {
          dp[j] = 0;
          if (!vis[j]) continue;
          const double *vr = v + ((p->ks[b] + j) * p->hkv + g) * d;
          for (int x = 0; x < d; x++) dp[j] += dor[x] * vr[x];
          delta += pr[j] * dp[j];
        }
        for (int64_t j = 0; j < p->kl[b]; j++) {
          if (!vis[j]) continue;
          double ds = pr[j] * (dp[j] - delta);
          if (p->cap > 0) ds *= 1 - t[j] * t[j];
          int64_t kr = ((p->ks[b] + j) * p->hkv + g) * d;
          for (int x = 0; x < d; x++) {
            dqr[x] += p->scale * ds * k[kr + x];
            dk[kr + x] += p->scale * ds * qr[x];
            dv[kr + x] += pr[j] * dor[x];
          }
        }
      }
    }
  free(s);
  free(t);
  free(pr);
  free(dp);
  free(vis);
}

/* ---- cases --------------------------------------------------------------------------- */

typedef struct acase {
  const char *name;
  int b, sq, sk, hq, hkv, d;
  int causal, wl, wr;
  float cap, scale;      /* scale 0: default 1/sqrt(D) */
  int nseq;              /* > 0: varlen with these lengths */
  int lq[MAX_SEQ], lk[MAX_SEQ];
  bool packed;           /* q, k, v (and dq, dk, dv) as slices of one packed buffer */
  int strided_out;       /* out / dout with padded token and head strides: 1 odd (head stride
                          * D + 3), 2 even but not 16-byte multiples (D + 2); 3: dq / dk / dv
                          * instead (D + 2; out / dout dense: the Hopper backward reads dO by
                          * TMA, which needs 16-byte strides) */
  bool bwd;              /* also check the backward */
} acase;

/* Forward cases (wl / wr: -1 unbounded). Sizes keep the float64 reference cheap. */
static const acase fwd_cases[] = {
    {"basic B2 S128 H4 D64", 2, 128, 128, 4, 4, 64, 0, -1, -1, 0, 0, 0, {0}, {0}, false, false, true},
    {"length 1", 1, 1, 1, 2, 2, 8, 0, -1, -1, 0, 0, 0, {0}, {0}, false, false, true},
    {"D1", 1, 9, 9, 2, 1, 1, 1, -1, -1, 0, 0, 0, {0}, {0}, false, false, true},
    {"S17 D72 GQA4", 2, 17, 17, 8, 2, 72, 0, -1, -1, 0, 0, 0, {0}, {0}, false, false, true},
    {"S1000 D32 MQA4 causal", 1, 1000, 1000, 4, 1, 32, 1, -1, -1, 0, 0, 0, {0}, {0}, false, false, false},
    {"S4097 D8 H2/1", 1, 4097, 4097, 2, 1, 8, 0, -1, -1, 0, 0, 0, {0}, {0}, false, false, false},
    {"S300 D128 GQA8 causal window 31", 1, 300, 300, 8, 1, 128, 1, 31, -1, 0, 0, 0, {0}, {0}, false, false, false},
    {"causal Sq<Sk 37x100", 2, 37, 100, 4, 2, 64, 1, -1, -1, 0, 0, 0, {0}, {0}, false, false, true},
    {"causal Sq>Sk 100x37 (empty rows)", 1, 100, 37, 4, 2, 64, 1, -1, -1, 0, 0, 0, {0}, {0}, false, false, true},
    {"noncausal Sq!=Sk 50x129 D80", 2, 50, 129, 2, 2, 80, 0, -1, -1, 0, 0, 0, {0}, {0}, false, false, false},
    {"window left 16", 1, 200, 200, 2, 1, 64, 0, 16, -1, 0, 0, 0, {0}, {0}, false, false, true},
    {"window right 5", 1, 150, 150, 2, 2, 64, 0, -1, 5, 0, 0, 0, {0}, {0}, false, false, false},
    {"window 7/3 Sq<Sk", 1, 90, 120, 4, 2, 40, 0, 7, 3, 0, 0, 0, {0}, {0}, false, false, true},
    {"window 0/0 diagonal", 1, 70, 70, 2, 1, 16, 0, 0, 0, 0, 0, 0, {0}, {0}, false, false, false},
    {"causal + window right 5", 1, 80, 96, 2, 1, 24, 1, 9, 5, 0, 0, 0, {0}, {0}, false, false, false},
    {"window Sq>Sk 130x20 3/2", 1, 130, 20, 2, 1, 16, 0, 3, 2, 0, 0, 0, {0}, {0}, false, false, true},
    {"softcap 5 scale 0.3 D256", 1, 70, 70, 2, 1, 256, 0, -1, -1, 5.0f, 0.3f, 0, {0}, {0}, false, false, true},
    {"custom scale 0.05 D256 causal", 2, 33, 33, 2, 2, 256, 1, -1, -1, 0, 0.05f, 0, {0}, {0}, false, false, false},
    {"negative scale -0.08 D128 causal", 1, 70, 70, 2, 1, 128, 1, -1, -1, 0, -0.08f, 0, {0}, {0}, false, false, true},
    {"MQA H16 D8 S65", 1, 65, 65, 16, 1, 8, 0, -1, -1, 0, 0, 0, {0}, {0}, false, false, false},
    {"varlen causal", 0, 0, 0, 4, 2, 64, 1, -1, -1, 0, 0, 5, {5, 0, 1, 37, 130}, {7, 0, 1, 37, 100}, false, false, true},
    {"varlen noncausal q/k lengths differ", 0, 0, 0, 4, 1, 72, 0, -1, -1, 0, 0, 4, {3, 64, 1, 65}, {70, 1, 9, 65}, false, false, true},
    {"varlen empty k or q", 0, 0, 0, 2, 2, 16, 0, -1, -1, 0, 0, 4, {6, 0, 3, 2}, {0, 5, 4, 2}, false, false, true},
    {"varlen window softcap", 0, 0, 0, 4, 2, 32, 1, 12, -1, 8.0f, 0, 3, {40, 1, 77}, {50, 1, 77}, false, false, true},
    {"packed qkv B2 S100 GQA2 causal", 2, 100, 100, 4, 2, 64, 1, -1, -1, 0, 0, 0, {0}, {0}, true, true, true},
    {"packed qkv varlen", 0, 0, 0, 4, 1, 48, 0, 20, 4, 0, 0, 3, {17, 1, 80}, {17, 1, 80}, true, true, true},
    {"strided out B3 S33 D128", 3, 33, 45, 2, 1, 128, 0, -1, -1, 0, 0, 0, {0}, {0}, false, true, false},
};

/* CUDA-only cases: the issue's grid for the flash kernels (sequence lengths 1, 17, 128,
 * 1000, 4097; GQA ratios 1, 4, 8; head dims 64 / 96 / 128 / 256; causal with Sq < Sk and
 * Sq > Sk; windows; varlen batches with length-1 and empty sequences; softcap; the
 * split-KV path (few blocks, long keys) and the unsplit one). The float64 reference is
 * single-threaded, so the large shapes keep few heads, use windows, or skip the
 * backward; each case runs in one 16-bit dtype (alternating bf16 / fp16). */
static const acase cuda_cases[] = {
    {"cuda S1 D128 GQA8 B3", 3, 1, 1, 8, 1, 128, 0, -1, -1, 0, 0, 0, {0}, {0}, false, false, true},
    {"cuda S17 D96 GQA4 causal", 2, 17, 17, 8, 2, 96, 1, -1, -1, 0, 0, 0, {0}, {0}, false, false, true},
    {"cuda S128 D128 GQA1", 2, 128, 128, 4, 4, 128, 0, -1, -1, 0, 0, 0, {0}, {0}, false, false, true},
    {"cuda S128 D64 GQA1 causal", 2, 128, 128, 4, 4, 64, 1, -1, -1, 0, 0, 0, {0}, {0}, false, false, true},
    {"cuda S1000 D64 GQA8 causal", 1, 1000, 1000, 8, 1, 64, 1, -1, -1, 0, 0, 0, {0}, {0}, false, false, true},
    {"cuda S1000 D128 GQA4 B3 window 128/0 (unsplit)", 3, 1000, 1000, 8, 2, 128, 0, 128, 0, 0, 0, 0, {0}, {0}, false, false, true},
    {"cuda S4097 D64 GQA2 causal fwd", 1, 4097, 4097, 2, 1, 64, 1, -1, -1, 0, 0, 0, {0}, {0}, false, false, false},
    {"cuda S4097 D128 GQA4 window 100/0", 1, 4097, 4097, 4, 1, 128, 0, 100, 0, 0, 0, 0, {0}, {0}, false, false, true},
    {"cuda S4097 D96 window 33/17 noncausal", 1, 4097, 4097, 2, 2, 96, 0, 33, 17, 0, 0, 0, {0}, {0}, false, false, true},
    {"cuda S1000 D256 GQA2 fwd", 1, 1000, 1000, 2, 1, 256, 0, -1, -1, 0, 0, 0, {0}, {0}, false, false, false},
    {"cuda S300 D256 GQA4 causal", 1, 300, 300, 4, 1, 256, 1, -1, -1, 0, 0, 0, {0}, {0}, false, false, true},
    {"cuda causal Sq<Sk 100x1000 D128 GQA8", 1, 100, 1000, 8, 1, 128, 1, -1, -1, 0, 0, 0, {0}, {0}, false, false, true},
    {"cuda causal Sq>Sk 1000x100 D96 GQA4", 1, 1000, 100, 4, 1, 96, 1, -1, -1, 0, 0, 0, {0}, {0}, false, false, true},
    {"cuda causal Sq>Sk 300x17 D256", 2, 300, 17, 2, 1, 256, 1, -1, -1, 0, 0, 0, {0}, {0}, false, false, true},
    {"cuda decode Sq1 Sk4097 D128 GQA8 (split-KV)", 2, 1, 4097, 8, 1, 128, 1, -1, -1, 0, 0, 0, {0}, {0}, false, false, true},
    {"cuda Sq17 Sk3000 D64 GQA4 noncausal", 1, 17, 3000, 4, 1, 64, 0, -1, -1, 0, 0, 0, {0}, {0}, false, false, true},
    {"cuda softcap 30 D128 causal S257", 1, 257, 257, 4, 2, 128, 1, -1, -1, 30.0f, 0, 0, {0}, {0}, false, false, true},
    {"cuda varlen causal D128 GQA4 (1, empty)", 0, 0, 0, 8, 2, 128, 1, -1, -1, 0, 0, 6, {1, 0, 300, 17, 0, 129}, {1, 0, 300, 40, 5, 128}, false, false, true},
    {"cuda varlen D64 GQA8 window 64/0 (1, empty)", 0, 0, 0, 8, 1, 64, 0, 64, 0, 0, 0, 4, {1000, 1, 0, 200}, {1000, 1, 0, 200}, false, false, true},
    {"cuda varlen D256 noncausal", 0, 0, 0, 2, 1, 256, 0, -1, -1, 0, 0, 3, {70, 1, 130}, {65, 3, 200}, false, false, true},
    {"cuda varlen decode D96 (split-KV)", 0, 0, 0, 4, 1, 96, 1, -1, -1, 0, 0, 3, {1, 1, 1}, {1500, 1, 700}, false, false, true},
    {"cuda packed qkv D128 GQA2 causal", 2, 300, 300, 4, 2, 128, 1, -1, -1, 0, 0, 0, {0}, {0}, true, true, true},
    /* The Hopper backward's shapes (D64 / D128, causal or not, GQA 1 / 4 / 8, tails of the
     * 128-key and 64-query tiles, Sq != Sk). */
    {"cuda S4097 D64 H2/1 causal", 1, 4097, 4097, 2, 1, 64, 1, -1, -1, 0, 0, 0, {0}, {0}, false, false, true},
    {"cuda S1000 D128 GQA1 B2 noncausal", 2, 1000, 1000, 2, 2, 128, 0, -1, -1, 0, 0, 0, {0}, {0}, false, false, true},
    {"cuda Sq17 Sk1000 D128 GQA4 noncausal", 1, 17, 1000, 4, 1, 128, 0, -1, -1, 0, 0, 0, {0}, {0}, false, false, true},
    {"cuda causal Sq>Sk 1000x100 D64 GQA8", 1, 1000, 100, 8, 1, 64, 1, -1, -1, 0, 0, 0, {0}, {0}, false, false, true},
    {"cuda S129 D64 MQA8 B2 causal", 2, 129, 129, 8, 1, 64, 1, -1, -1, 0, 0, 0, {0}, {0}, false, false, true},
    /* A negative scale: the Hopper forward (row max over unscaled scores) declines it (e27a111). */
    {"cuda negative scale -0.05 S300 D256 causal fwd", 1, 300, 300, 4, 1, 256, 1, -1, -1, 0, -0.05f, 0, {0}, {0}, false, false, false},
    {"cuda negative scale -0.07 S1000 D128 GQA4 causal", 1, 1000, 1000, 4, 1, 128, 1, -1, -1, 0, -0.07f, 0, {0}, {0}, false, false, true},
};

/* CUDA cases run with params.deterministic = 1 (the portable backward, no atomics). */
static const acase cuda_det_cases[] = {
    {"cuda S300 D128 GQA4 causal deterministic", 1, 300, 300, 8, 2, 128, 1, -1, -1, 0, 0, 0, {0}, {0}, false, false, true},
    {"cuda S200 D64 noncausal deterministic", 2, 200, 200, 2, 2, 64, 0, -1, -1, 0, 0, 0, {0}, {0}, false, false, true},
};

/* Backward shapes run under OT_ATTN_BWD_SM90_DQ=red (kXDqRed: the Hopper backward's dQ
 * partials added by red.global.add.v4.f32 from the consumers, no staging tile or dQ writer),
 * with OT_ATTN_IMPL=sm90. kXDqRed is the D 128 default in every build (run 16); the switch
 * is read only in experiment builds (-DOT_ATTN_SM90_EXPERIMENTS, never CI), which compile it
 * at D 64 too: elsewhere the D 64 cases run the default (staged) kernel. What the variant
 * computes anew is the accumulator tile of (batch, query head, query tile, consumer): GQA /
 * MQA groups (the query head from the walk index), D 128 (a consumer's 64 columns) and D 64
 * (both consumers into one tile), causal with refilled Q / dO stages, whole keyless query
 * tiles (Sq > Sk), the split units of a non-causal last wave, B 2, bf16 and fp16. */
static const acase cuda_sm90_dqred_cases[] = {
    {"cuda hopper-only dqred causal Sq<Sk 100x1000 D128 GQA4", 1, 100, 1000, 8, 2, 128, 1, -1, -1, 0, 0, 0, {0}, {0}, false, false, true},
    {"cuda hopper-only dqred S129 D64 MQA8 B2", 2, 129, 129, 8, 1, 64, 0, -1, -1, 0, 0, 0, {0}, {0}, false, false, true},
    {"cuda hopper-only dqred causal Sq>Sk 700x130 D128 GQA2 B2", 2, 700, 130, 4, 2, 128, 1, -1, -1, 0, 0, 0, {0}, {0}, false, false, true},
    {"cuda hopper-only dqred S1000 D128 GQA1 B2", 2, 1000, 1000, 2, 2, 128, 0, -1, -1, 0, 0, 0, {0}, {0}, false, false, true},
    {"cuda hopper-only dqred causal S1000 D64 GQA4", 1, 1000, 1000, 8, 2, 64, 1, -1, -1, 0, 0, 0, {0}, {0}, false, false, true},
};

/* kXKvRs (head dim 64: K and V as register A operands of S^T / dP^T, loaded by ldmatrix
 * from the swizzled tiles), with kXDqRed and kXDqHalf the D 64 default since 2026-12-03: run
 * as they are (OT_ATTN_BWD_SM90_KVRS unset), and tagged "red" under =red (kXDqRed without
 * kXDqHalf, the default before), "stage" under =1 (kXKvRs with the staged dQ) and "ss" under
 * =0 (the SS kernel with the staged dQ): both consumers' key rows (S 1000: 8 key blocks),
 * split units (B 2 S 1000 non-causal, S 129 MQA 8), key tails (Sk 130, 17), causal Sq > Sk
 * (keyless query tiles) and Sq < Sk, the head-then-tail order, GQA 1 / 4 / 8 / MQA; bf16
 * and fp16. */
static const acase cuda_sm90_kvrs_cases[] = {
    {"cuda hopper-only kvrs S1000 D64 GQA1 B2 (split units)", 2, 1000, 1000, 2, 2, 64, 0, -1, -1, 0, 0, 0, {0}, {0}, false, false, true},
    {"cuda hopper-only kvrs S129 D64 MQA8 B2", 2, 129, 129, 8, 1, 64, 0, -1, -1, 0, 0, 0, {0}, {0}, false, false, true},
    {"cuda hopper-only kvrs causal S1000 D64 GQA4", 1, 1000, 1000, 8, 2, 64, 1, -1, -1, 0, 0, 0, {0}, {0}, false, false, true},
    {"cuda hopper-only kvrs causal Sq>Sk 700x130 D64 GQA2 B2", 2, 700, 130, 4, 2, 64, 1, -1, -1, 0, 0, 0, {0}, {0}, false, false, true},
    {"cuda hopper-only kvrs causal Sq<Sk 100x1000 D64 GQA8", 1, 100, 1000, 8, 1, 64, 1, -1, -1, 0, 0, 0, {0}, {0}, false, false, true},
    {"cuda hopper-only kvrs causal Sq64 Sk2048 D64 B2 H9 (head order, then tail)", 2, 64, 2048, 9, 9, 64, 1, -1, -1, 0, 0, 0, {0}, {0}, false, false, true},
    {"cuda hopper-only kvrs S17 D64 GQA4 B3", 3, 17, 17, 8, 2, 64, 0, -1, -1, 0, 0, 0, {0}, {0}, false, false, true},
};

/* The D 128 ones again under OT_ATTN_BWD_SM90_DQ=stage: the staged dQ (shared staging tile,
 * the dQ writer's bulk reduce-add; the D 128 default until run 16) in experiment builds;
 * elsewhere the switch is not read and kXDqRed runs them. */
static const acase cuda_sm90_dqstage_cases[] = {
    {"cuda hopper-only dqstage causal Sq<Sk 100x1000 D128 GQA4", 1, 100, 1000, 8, 2, 128, 1, -1, -1, 0, 0, 0, {0}, {0}, false, false, true},
    {"cuda hopper-only dqstage causal Sq>Sk 700x130 D128 GQA2 B2", 2, 700, 130, 4, 2, 128, 1, -1, -1, 0, 0, 0, {0}, {0}, false, false, true},
    {"cuda hopper-only dqstage S1000 D128 GQA1 B2", 2, 1000, 1000, 2, 2, 128, 0, -1, -1, 0, 0, 0, {0}, {0}, false, false, true},
};

/* The Hopper backward's kXSt16 (dK / dV stored 16 bytes a lane after a transpose within each
 * row quad; the default where dK's and dV's pointers and strides are 16-byte multiples, so
 * cuda_sm90_cases' backward cases run it): run_sm90_required runs those backward cases again
 * under OT_ATTN_BWD_SM90_ST16=0 (the 4-byte stores; "bwdst4" in their names), then these
 * under the default: the split units of a non-causal last wave at D 128 (their dK / dV read
 * back from the fp32 sums, then stored 16 bytes a lane), and dq / dk / dv with even strides
 * that are not 16-byte multiples (the dispatch keeps the 4-byte stores; dq the unaligned
 * conversion). */
static const acase cuda_sm90_bwd_st16_cases[] = {
    {"cuda hopper-only bwdst16 S1000 D128 GQA1 B2 (split units)", 2, 1000, 1000, 2, 2, 128, 0, -1, -1, 0, 0, 0, {0}, {0}, false, false, true},
    {"cuda hopper-only bwdst16 causal Sq300 Sk1000 D128 GQA2 B2 dq/dk/dv strides 4-byte (4-byte stores)", 2, 300, 1000, 4, 2, 128, 1, -1, -1, 0, 0, 0, {0}, {0}, false, 3, true},
};

/* The Hopper backward at D 256 (HALF: 64-key CTAs whose two consumers share the keys and
 * split dK's / dV's columns, 128 each; both compute the whole S^T and dP^T, and each writes
 * all of dS^T to buffers of its own; dQ in two 64-column chunks a consumer, added by
 * red.global): run in bf16 and fp16, the first three also with the 4-byte dK / dV stores
 * (OT_ATTN_BWD_SM90_ST16=0).
 * The split units of a non-causal last wave (B2 S1000: 64 units, 2 parts each; S129 MQA8:
 * 6 units of a 24-tile GQA walk, 6 parts each), a key tail of 1 (129) and of 40 (1000),
 * causal Sq < Sk and Sq > Sk (8 whole keyless query tiles), the causal head-then-tail work
 * order (S1000 GQA4: 16 key blocks x 2 heads), and dq / dk / dv with strides that are not
 * 16-byte multiples (4-byte stores, dq's unaligned conversion). */
static const acase cuda_sm90_bwd256_cases[] = {
    {"cuda hopper-only bwd256 S1000 D256 GQA1 B2 (split units)", 2, 1000, 1000, 2, 2, 256, 0, -1, -1, 0, 0, 0, {0}, {0}, false, false, true},
    {"cuda hopper-only bwd256 causal Sq<Sk 100x1000 D256 GQA4", 1, 100, 1000, 8, 2, 256, 1, -1, -1, 0, 0, 0, {0}, {0}, false, false, true},
    {"cuda hopper-only bwd256 S129 D256 MQA8 B2 (split units)", 2, 129, 129, 8, 1, 256, 0, -1, -1, 0, 0, 0, {0}, {0}, false, false, true},
    {"cuda hopper-only bwd256 causal Sq>Sk 700x130 D256 GQA2 B2", 2, 700, 130, 4, 2, 256, 1, -1, -1, 0, 0, 0, {0}, {0}, false, false, true},
    {"cuda hopper-only bwd256 causal S1000 D256 GQA4", 1, 1000, 1000, 8, 2, 256, 1, -1, -1, 0, 0, 0, {0}, {0}, false, false, true},
    {"cuda hopper-only bwd256 causal Sq300 Sk1000 D256 GQA2 B2 dq/dk/dv strides 4-byte (4-byte stores)", 2, 300, 1000, 4, 2, 256, 1, -1, -1, 0, 0, 0, {0}, {0}, false, 3, true},
};

/* The Hopper backward at D 96 (kXPad: the D 128 tile on Q, K, V, dO loaded by a 4-D map
 * twice per operand, columns 96..127 zero-filled by TMA; dK / dV / dQ stored below column
 * 96): the forward runs the portable kernel (OT_ATTN_SM90_PAD96=0 and fwd_any_impl: the
 * backward after a portable forward's lse), the backward under OT_ATTN_IMPL=sm90, bf16 and
 * fp16, the first two also with the 4-byte dK / dV stores. Split units (B2 S1000), a key
 * tail of 1 with an MQA walk in parts (S129), causal Sq < Sk and Sq > Sk (keyless query
 * tiles), dq / dk / dv strides that are not 16-byte multiples, packed qkv (a token stride of
 * 3 x 4 x 96). */
static const acase cuda_sm90_bwd96_cases[] = {
    {"cuda hopper-only bwd96 S1000 D96 GQA1 B2 (split units)", 2, 1000, 1000, 2, 2, 96, 0, -1, -1, 0, 0, 0, {0}, {0}, false, false, true},
    {"cuda hopper-only bwd96 S129 D96 MQA8 B2 (split units)", 2, 129, 129, 8, 1, 96, 0, -1, -1, 0, 0, 0, {0}, {0}, false, false, true},
    {"cuda hopper-only bwd96 causal Sq<Sk 100x1000 D96 GQA4", 1, 100, 1000, 8, 2, 96, 1, -1, -1, 0, 0, 0, {0}, {0}, false, false, true},
    {"cuda hopper-only bwd96 causal Sq>Sk 700x130 D96 GQA2 B2", 2, 700, 130, 4, 2, 96, 1, -1, -1, 0, 0, 0, {0}, {0}, false, false, true},
    {"cuda hopper-only bwd96 causal Sq300 Sk1000 D96 GQA2 B2 dq/dk/dv strides 4-byte (4-byte stores)", 2, 300, 1000, 4, 2, 96, 1, -1, -1, 0, 0, 0, {0}, {0}, false, 3, true},
    {"cuda hopper-only bwd96 packed qkv causal S300 D96 GQA1 B2", 2, 300, 300, 4, 4, 96, 1, -1, -1, 0, 0, 0, {0}, {0}, true, false, true},
};

/* The Hopper forward at D 96 (kFlPad, the default since 2026-12-03: the D 128 kernel on
 * Q, K, V loaded twice per tile by a 4-D map, columns 96..127 zero-filled by TMA, O stored
 * below column 96) runs cuda_sm90_bwd96_cases again ("pad96" named) with
 * OT_ATTN_SM90_PAD96 unset and the forward also under OT_ATTN_IMPL=sm90 (a decline fails), and
 * this one: O with 4-byte strides (the 4-byte stores). bf16 and fp16. */
static const acase cuda_sm90_pad96_st4_case =
    {"cuda hopper-only pad96 causal S1000 D96 GQA2 O strides 8-byte (4-byte stores) fwd", 1, 1000, 1000, 4, 2, 96, 1, -1, -1, 0, 0, 0, {0}, {0}, false, 2, false};

/* CUDA cases run with OT_ATTN_IMPL=sm90: shapes the Hopper kernels take (forward: bf16 /
 * fp16, D 64 / 128 / 256, no varlen or softcap; backward: D 64 / 128, causal or none). */
/* The Hopper forward's 16-byte O stores (kFlSt16: the default for bf16 D128 on the 128-key
 * tile, D256 masked calls and D64's kFlDiag tile), run in bf16: where O's strides are even but
 * not 16-byte multiples the dispatch keeps the 4-byte stores (the first three); the last, an
 * aligned D64 causal call of 8 query tiles (kFlDiag), takes them. */
static const acase cuda_sm90_st16_cases[] = {
    {"cuda hopper-only causal S1000 D128 GQA2 O strides 8-byte (4-byte stores) fwd", 1, 1000, 1000, 4, 2, 128, 1, -1, -1, 0, 0, 0, {0}, {0}, false, 2, false},
    {"cuda hopper-only causal Sq300 Sk400 D256 GQA4 O strides 8-byte (4-byte stores) fwd", 1, 300, 400, 4, 1, 256, 1, -1, -1, 0, 0, 0, {0}, {0}, false, 2, false},
    {"cuda hopper-only causal S1000 D64 GQA4 B2 O strides 8-byte (4-byte stores) fwd", 2, 1000, 1000, 8, 2, 64, 1, -1, -1, 0, 0, 0, {0}, {0}, false, 2, false},
    {"cuda hopper-only causal S1000 D64 GQA4 B2 (kFlDiag, 16-byte stores) fwd", 2, 1000, 1000, 8, 2, 64, 1, -1, -1, 0, 0, 0, {0}, {0}, false, false, false},
};

static const acase cuda_sm90_cases[] = {
    {"cuda hopper-only S128 D128 GQA1", 2, 128, 128, 4, 4, 128, 0, -1, -1, 0, 0, 0, {0}, {0}, false, false, true},
    {"cuda hopper-only S1000 D64 GQA8 causal", 1, 1000, 1000, 8, 1, 64, 1, -1, -1, 0, 0, 0, {0}, {0}, false, false, true},
    {"cuda hopper-only causal Sq<Sk 100x1000 D128 GQA4", 1, 100, 1000, 8, 2, 128, 1, -1, -1, 0, 0, 0, {0}, {0}, false, false, true},
    {"cuda hopper-only S129 D64 MQA8 B2", 2, 129, 129, 8, 1, 64, 0, -1, -1, 0, 0, 0, {0}, {0}, false, false, true},
    {"cuda hopper-only S300 D256 GQA4 causal fwd", 1, 300, 300, 4, 1, 256, 1, -1, -1, 0, 0, 0, {0}, {0}, false, false, false},
    {"cuda hopper-only S1000 D128 window 128/0 fwd", 1, 1000, 1000, 4, 2, 128, 0, 128, 0, 0, 0, 0, {0}, {0}, false, false, false},
    /* A partial last key tile of every kind (Sk > 2048 at D128: the 176-key tile; D256: 80):
     * Sk mod tile = 1, 8, 47, 48, 175 (D128), 1, 64 (D256), causal and not, Sq != Sk; bf16 at
     * the even places (the Hopper forward's kFlNarrow step takes the bf16 non-causal D128
     * ones with remainder 1 and 47 by default; the D256 ones under OT_ATTN_SM90_NARROW=1 in
     * experiment builds). */
    {"cuda hopper-only Sq200 Sk2113 D128 GQA2 (rem 1) fwd", 1, 200, 2113, 4, 2, 128, 0, -1, -1, 0, 0, 0, {0}, {0}, false, false, false},
    {"cuda hopper-only causal Sq200 Sk2120 D128 (rem 8) fwd", 1, 200, 2120, 4, 2, 128, 1, -1, -1, 0, 0, 0, {0}, {0}, false, false, false},
    {"cuda hopper-only Sq300 Sk2159 D128 B2 (rem 47) fwd", 2, 300, 2159, 2, 1, 128, 0, -1, -1, 0, 0, 0, {0}, {0}, false, false, false},
    {"cuda hopper-only causal S2160 D128 (rem 48) fwd", 1, 2160, 2160, 2, 1, 128, 1, -1, -1, 0, 0, 0, {0}, {0}, false, false, false},
    {"cuda hopper-only Sq100 Sk2287 D128 GQA4 (rem 175) fwd", 1, 100, 2287, 4, 1, 128, 0, -1, -1, 0, 0, 0, {0}, {0}, false, false, false},
    {"cuda hopper-only causal S1041 D256 (rem 1) fwd", 1, 1041, 1041, 2, 1, 256, 1, -1, -1, 0, 0, 0, {0}, {0}, false, false, false},
    {"cuda hopper-only Sq150 Sk1041 D256 GQA2 (rem 1) fwd", 1, 150, 1041, 4, 2, 256, 0, -1, -1, 0, 0, 0, {0}, {0}, false, false, false},
    {"cuda hopper-only S2113 D128 (rem 1) fwd", 1, 2113, 2113, 2, 1, 128, 0, -1, -1, 0, 0, 0, {0}, {0}, false, false, false},
    {"cuda hopper-only Sq300 Sk1024 D256 GQA2 (rem 64) fwd", 1, 300, 1024, 4, 2, 256, 0, -1, -1, 0, 0, 0, {0}, {0}, false, false, false},
    /* The Hopper backward's causal work order with heads both before and in the tail
     * (1297a76): 16 key blocks x 18 (batch, head) pairs -- one head runs head by head, the
     * other 17 key block by key block, heaviest first. Last, so that the dtype parity of the
     * cases above stays as their comment says. */
    {"cuda hopper-only causal Sq64 Sk2048 D64 B2 H9 (head order, then tail)", 2, 64, 2048, 9, 9, 64, 1, -1, -1, 0, 0, 0, {0}, {0}, false, false, true},
    /* Keyless query tiles in the Hopper backward: Sq > Sk by 570 rows, so 8 whole 64-query
     * tiles no key block sees (their dQ is the zeroed accumulator's, written by the dq pass),
     * then a tile of 58 keyless rows and 6 with keys (one contributing key block), 2 key
     * blocks (the second partial). Written for the dQ conversion by a tile's last
     * contribution (f676cc1, measured slower and reverted: there the prep kernel zeroed the
     * keyless tiles' dQ). */
    {"cuda hopper-only causal Sq>Sk 700x130 D128 GQA2 B2", 2, 700, 130, 4, 2, 128, 1, -1, -1, 0, 0, 0, {0}, {0}, false, false, true},
    /* The forward's rescale threshold (kFlResc: the row max moves only when it grows by more
     * than 2^8) where it moves after the first-visited key tile: at scale 2 a row's unscaled
     * scores q.k (q in +-2, k in +-1, D128: sd 7.5) grow past that tile's max by more than
     * 8 / (2 log2 e) = 2.8 in ~70% (Sk 1000) / ~96% (Sk 777: a first tile of 9 keys) of
     * rows (numpy, 2000 rows). Unmasked D128 with Sk <= 2048 (the 128-key tile, the
     * threshold's default since a60aa63), fp16 then bf16, GQA. At 1 / sqrt(D), the other
     * cases' scale, the growth needed is 8.3 sd: never. */
    {"cuda hopper-only Sq300 Sk1000 D128 GQA4 scale 2 (row max past 2^8) fwd", 1, 300, 1000, 4, 1, 128, 0, -1, -1, 0, 2.0f, 0, {0}, {0}, false, false, false},
    {"cuda hopper-only Sq200 Sk777 D128 GQA2 B2 scale 2 (row max past 2^8) fwd", 2, 200, 777, 4, 2, 128, 0, -1, -1, 0, 2.0f, 0, {0}, {0}, false, false, false},
};

/* The Hopper forward's narrow last-key-tile step (kFlNarrow, bf16 D128 non-causal, the
 * 176-key tile) where only OT_ATTN_SM90_TILE=wide reaches it (Sk <= 2048 takes the 128-key
 * tile): a call of one key tile of 40 keys (the narrow step alone), a last tile of exactly
 * 48 keys before one whole tile (no pipelined loop), and a last tile of 1 key before three,
 * the last also under OT_ATTN_SM90_GRID=3 (persistent CTAs of several tiles: ring phases
 * and pingpong turns running on after narrow steps). The first has all of its attention
 * mass in the narrow step, the second a fifth (48 of 224 keys), so an error of the step's
 * P V or of the O, m, l it hands to the pipelined steps is large against out's bf16
 * tolerance (a key lost or counted twice also moves lse). bf16 only: fp16 has no narrow
 * instance. */
static const acase cuda_sm90_wide_cases[] = {
    {"cuda hopper-only wide Sq130 Sk40 D128 GQA2 B2 (one tile of 40) fwd", 2, 130, 40, 4, 2, 128, 0, -1, -1, 0, 0, 0, {0}, {0}, false, false, false},
    {"cuda hopper-only wide Sq300 Sk224 D128 (rem 48) fwd", 1, 300, 224, 2, 1, 128, 0, -1, -1, 0, 0, 0, {0}, {0}, false, false, false},
    {"cuda hopper-only wide Sq200 Sk529 D128 GQA2 B2 (rem 1) fwd", 2, 200, 529, 4, 2, 128, 0, -1, -1, 0, 0, 0, {0}, {0}, false, false, false},
    {"cuda hopper-only wide Sq100 Sk2287 D128 GQA4 (rem 175: no narrow step) fwd", 1, 100, 2287, 4, 1, 128, 0, -1, -1, 0, 0, 0, {0}, {0}, false, false, false},
};

/* The Hopper forward's persistent schedule (132 CTAs on an H200) at tile counts just
 * above and below multiples of the grid: 262 tiles (a partial second round of 130), 266
 * (a full second round, then a third of 2), 134 (a second round of 2, D64's 192-row
 * tiles), 130 (below one round: one CTA per tile); causal (sectioned order, tiles of
 * falling length) and not. bf16. */
static const acase cuda_sm90_round_cases[] = {
    {"cuda hopper-only rounds causal S256 D128 MQA131 (262 tiles) fwd", 1, 256, 256, 131, 1, 128, 1, -1, -1, 0, 0, 0, {0}, {0}, false, false, false},
    {"cuda hopper-only rounds causal S256 D64 B7 H19 (266 tiles) fwd", 7, 256, 256, 19, 19, 64, 1, -1, -1, 0, 0, 0, {0}, {0}, false, false, false},
    {"cuda hopper-only rounds causal S256 D256 B7 H19 GQA19 (266 tiles) fwd", 7, 256, 256, 19, 1, 256, 1, -1, -1, 0, 0, 0, {0}, {0}, false, false, false},
    {"cuda hopper-only rounds causal S256 D128 B5 H13 (130 tiles) fwd", 5, 256, 256, 13, 13, 128, 1, -1, -1, 0, 0, 0, {0}, {0}, false, false, false},
    {"cuda hopper-only rounds S256 D128 MQA131 (262 tiles) fwd", 1, 256, 256, 131, 1, 128, 0, -1, -1, 0, 0, 0, {0}, {0}, false, false, false},
    {"cuda hopper-only rounds S384 D64 MQA67 (134 tiles of 192 rows) fwd", 1, 384, 384, 67, 1, 64, 0, -1, -1, 0, 0, 0, {0}, {0}, false, false, false},
};

/* Shapes for kFlDiag: a consumer warpgroup whose own rows see at most 64 keys of the
 * first-visited key tile runs it as a narrow step of its own (64 keys), the other takes an
 * empty pingpong turn. Default for bf16 D64 masked calls of <= 8 query tiles (2 consumers,
 * 128-key tile; since 2026-12-02 with kFlStag's softmax turns, OT_ATTN_SM90_STAG=0
 * without): the D64 cases run it in every build, OT_ATTN_SM90_DIAG=0 turns it off; the
 * D128 ones only in experiment builds under OT_ATTN_SM90_DIAG=1 (elsewhere the default
 * kernel). Causal Sq = Sk (the first warpgroup of every 128-row tile narrow, the second
 * not: its empty turn after the first's; S 100: one key tile, no empty turn; S 600: a last
 * tile of 88 rows), Sq 700 / Sk 1000 (both warpgroups narrow, the first seeing no key of
 * the tile; in the last query tile the second, past Sq, narrow alone: the first's empty
 * turn comes first), non-causal Sk 1050 (a last tile of 26 keys: both narrow, D128 only
 * under the switch), GQA, B 2, and the "GRID 3" ones under OT_ATTN_SM90_GRID=3 (persistent
 * CTAs of several tiles: ring phases and turns running on). bf16 (the instances' dtype). */
static const acase cuda_sm90_diag_cases[] = {
    {"cuda hopper-only diag causal S1000 D128 GQA2 B2 fwd", 2, 1000, 1000, 4, 2, 128, 1, -1, -1, 0, 0, 0, {0}, {0}, false, false, false},
    {"cuda hopper-only diag causal S1024 D64 GQA4 fwd", 1, 1024, 1024, 8, 2, 64, 1, -1, -1, 0, 0, 0, {0}, {0}, false, false, false},
    {"cuda hopper-only diag causal S100 D128 B2 fwd", 2, 100, 100, 2, 1, 128, 1, -1, -1, 0, 0, 0, {0}, {0}, false, false, false},
    {"cuda hopper-only diag causal Sq700 Sk1000 D64 GQA2 fwd", 1, 700, 1000, 4, 2, 64, 1, -1, -1, 0, 0, 0, {0}, {0}, false, false, false},
    {"cuda hopper-only diag S1050 D128 GQA2 (rem 26) fwd", 1, 1050, 1050, 4, 2, 128, 0, -1, -1, 0, 0, 0, {0}, {0}, false, false, false},
    {"cuda hopper-only diag GRID 3 causal S600 D128 GQA2 fwd", 1, 600, 600, 4, 2, 128, 1, -1, -1, 0, 0, 0, {0}, {0}, false, false, false},
    {"cuda hopper-only diag GRID 3 causal S600 D64 GQA2 fwd", 1, 600, 600, 4, 2, 64, 1, -1, -1, 0, 0, 0, {0}, {0}, false, false, false},
    {"cuda hopper-only diag GRID 3 causal Sq700 Sk1000 D64 GQA2 B2 fwd", 2, 700, 1000, 4, 2, 64, 1, -1, -1, 0, 0, 0, {0}, {0}, false, false, false},
};

/* The Hopper forward's dynamic schedule (masked calls on persistent CTAs: each CTA claims
 * its next tile from a per-context counter that every launch leaves at zero). Causal
 * shapes with many tiles per CTA: under OT_ATTN_SM90_GRID=3 (the "GRID 3" ones: a few
 * CTAs claim dozens of tiles each), and above the 132-CTA grid of an H200 (144 tiles: the
 * first round static, the rest claimed). Sq 1300 / Sk 1100: the query tile of rows
 * 0..127 of each head sees no key (its id goes to the consumers without a Q load). D64
 * (no kFlDiag past 8 query tiles; 3 consumers from 16, bf16 with kFlSkip), D128 and D256,
 * GQA, B 2; fp16 for
 * the first. Each is
 * checked against the float64 oracle, then (run_dyn_case) bit for bit against
 * OT_ATTN_SM90_DYN=0 (the static order: the same arithmetic per tile, whichever CTA runs
 * it), and twice more in a row with the dynamic schedule (a counter left non-zero would
 * skip or repeat tiles: poisoned rows would show). All under OT_ATTN_SM90_DYN=1 (the
 * schedule at any tile count per CTA: by default only up to 16). */
static const acase cuda_sm90_dyn_cases[] = {
    {"cuda hopper-only dyn GRID 3 causal S600 D128 GQA2 B2 fwd", 2, 600, 600, 4, 2, 128, 1, -1, -1, 0, 0, 0, {0}, {0}, false, false, false},
    {"cuda hopper-only dyn GRID 3 causal Sq1300 Sk1100 D64 GQA2 fwd", 1, 1300, 1100, 4, 2, 64, 1, -1, -1, 0, 0, 0, {0}, {0}, false, false, false},
    {"cuda hopper-only dyn GRID 3 causal S600 D256 MQA4 fwd", 1, 600, 600, 4, 1, 256, 1, -1, -1, 0, 0, 0, {0}, {0}, false, false, false},
    {"cuda hopper-only dyn causal S1100 D128 GQA4 B2 H8 (144 tiles) fwd", 2, 1100, 1100, 8, 2, 128, 1, -1, -1, 0, 0, 0, {0}, {0}, false, false, false},
    {"cuda hopper-only dyn causal S1100 D64 GQA4 H16 (144 tiles) fwd", 1, 1100, 1100, 16, 4, 64, 1, -1, -1, 0, 0, 0, {0}, {0}, false, false, false},
    /* 3 consumers (D64 causal from 16 query tiles of 128): 192-row tiles, a last one of 84
     * rows; Sq > Sk: the first 7 query tiles of each head see no key */
    {"cuda hopper-only dyn GRID 3 causal S4500 D64 GQA2 (3 consumers) fwd", 1, 4500, 4500, 2, 1, 64, 1, -1, -1, 0, 0, 0, {0}, {0}, false, false, false},
    {"cuda hopper-only dyn causal Sq4500 Sk3000 D64 MQA8 (3 consumers, 192 tiles) fwd", 1, 4500, 3000, 8, 1, 64, 1, -1, -1, 0, 0, 0, {0}, {0}, false, false, false},
};

/* D64 causal calls of 16 query tiles of 128 rows or more (Sq > 1920) on 3 consumers (192-row
 * tiles; since 2026-12-02, before only past 64; bf16 with kFlSkip): persistent under OT_ATTN_SM90_GRID=3 (each
 * CTA runs many tiles of falling length, a last 192-row tile of 84 rows), and Sq > Sk (the
 * first query tiles see no key), MQA. */
static const acase cuda_sm90_wg3_cases[] = {
    {"cuda hopper-only wg3 GRID 3 causal S4500 D64 GQA2 fwd", 1, 4500, 4500, 2, 1, 64, 1, -1, -1, 0, 0, 0, {0}, {0}, false, false, false},
    {"cuda hopper-only wg3 causal Sq4500 Sk3000 D64 MQA4 fwd", 1, 4500, 3000, 4, 1, 64, 1, -1, -1, 0, 0, 0, {0}, {0}, false, false, false},
    /* bf16: kFlSkip (the default there since 2026-12-02) with Sq < Sk and a partial last
     * query tile (3001 rows: its last 2 warpgroups past Sq), under GRID 3 */
    {"cuda hopper-only wg3 skip GRID 3 causal Sq3001 Sk4500 D64 GQA2 B2 fwd", 2, 3001, 4500, 4, 2, 64, 1, -1, -1, 0, 0, 0, {0}, {0}, false, false, false},
};

/* Persistent CTAs that run many tiles each (all under OT_ATTN_SM90_GRID=3; written for
 * kFlLate, a tile's epilogue under the next tile's first Q K^T, which was measured slower and
 * removed on 2026-12-02 -- the shapes stay for the default kernels): causal Sq 1300 / Sk 1100
 * (the query tile of rows 0..127 of each head sees no key, between tiles that do), D64 (2
 * consumers, kFlPin, 11 query tiles: no kFlDiag) and D128 (the threshold); non-causal D64 S
 * 1000 (3 consumers: 192-row tiles, the last one's rows past Sq). bf16. */
static const acase cuda_sm90_persist_cases[] = {
    {"cuda hopper-only persist GRID 3 causal Sq1300 Sk1100 D64 GQA2 B2 fwd", 2, 1300, 1100, 4, 2, 64, 1, -1, -1, 0, 0, 0, {0}, {0}, false, false, false},
    {"cuda hopper-only persist GRID 3 causal Sq1300 Sk1100 D128 GQA2 fwd", 1, 1300, 1100, 4, 2, 128, 1, -1, -1, 0, 0, 0, {0}, {0}, false, false, false},
    {"cuda hopper-only persist GRID 3 S1000 D64 GQA2 fwd", 1, 1000, 1000, 4, 2, 64, 0, -1, -1, 0, 0, 0, {0}, {0}, false, false, false},
};

/* Shapes for kFlPin (OT_ATTN_SM90_PIN=1, set by the run: the pipelined step's softmax before
 * its P V's wait; the default of the unmasked ones' tiles, D128 176-key and D64 3 consumers;
 * at the causal one's D128 128-key tile compiled only in experiment builds, elsewhere the
 * default kernel runs), then the unmasked ones under OT_ATTN_SM90_PIN=0 (the plain order,
 * which no default call takes on those tiles since kFlPin became their default, 2148cdb).
 * Sk 4096 unmasked (the 48-key narrow step, then 23 steps of 176 keys), Sk 6528 (no narrow
 * step, 37 steps) under OT_ATTN_SM90_GRID=3, causal D128 with the scale 2 (row maxima past
 * 2^8: the threshold's rescale), unmasked D64 Sk 2000 (3 consumers, rows past Sq in the last
 * 192-row tile); since 2026-12-02 also D64's masked default on 2 consumers (past 8 query
 * tiles): causal S 1500 (12 query tiles) and a window (256, 64) over S 2000. bf16 (the
 * instances' dtype). */
static const acase cuda_sm90_pin_cases[] = {
    {"cuda hopper-only pin Sq256 Sk4096 D128 GQA2 (narrow step, 23 steps) fwd", 1, 256, 4096, 4, 2, 128, 0, -1, -1, 0, 0, 0, {0}, {0}, false, false, false},
    {"cuda hopper-only pin GRID 3 Sq300 Sk6528 D128 B2 (37 steps) fwd", 2, 300, 6528, 2, 1, 128, 0, -1, -1, 0, 0, 0, {0}, {0}, false, false, false},
    {"cuda hopper-only pin causal S1500 D128 GQA2 scale 2 (row max past 2^8) fwd", 1, 1500, 1500, 4, 2, 128, 1, -1, -1, 0, 2.0f, 0, {0}, {0}, false, false, false},
    {"cuda hopper-only pin Sq300 Sk2000 D64 MQA4 B2 (3 consumers) fwd", 2, 300, 2000, 4, 1, 64, 0, -1, -1, 0, 0, 0, {0}, {0}, false, false, false},
    {"cuda hopper-only pin causal S1500 D64 GQA2 B2 (12 query tiles) fwd", 2, 1500, 1500, 4, 2, 64, 1, -1, -1, 0, 0, 0, {0}, {0}, false, false, false},
    {"cuda hopper-only pin window 256,64 S2000 D64 GQA4 fwd", 1, 2000, 2000, 8, 2, 64, 0, 256, 64, 0, 0, 0, {0}, {0}, false, false, false},
};

/* Shapes where some consumer warpgroup of the Hopper forward has first-visited key tiles in
 * which all of its rows are masked, or all of its rows past Sq: what kFlSkip
 * (OT_ATTN_SM90_SKIP=1) skips. The skip is compiled only in experiment builds
 * (-DOT_ATTN_SM90_EXPERIMENTS, never CI) and the default build does not read the switch, so
 * there (CI, the usual GPU runs) these cases run the default kernel only: more shapes for
 * it, nothing of kFlSkip. They run the skip path only in an experiment build with the switch
 * set (scripts/device_fwd_variants.sh AB=skip: VENVS, SAN_ENV). Causal Sq 1000 / Sk 1024
 * (128-key tiles: the first warpgroup of 7 of 8 query tiles sees none of the diagonal tile),
 * D256's 80-key tiles, Sq > Sk (rows and whole warpgroups with no key), S 17 (D256: the
 * second warpgroup past Sq), non-causal D64 with 3 consumers (1000 rows in 6 tiles of 192:
 * the last tile's 2nd and 3rd warpgroups are padding); the D64 causal ones again with 3
 * consumers (OT_ATTN_SM90_WG=3). The window 200/0 case (D128, Sq = Sk: 128-row and 128-key
 * tiles align) skips nothing even under the switch, it runs the skip instance with no tile
 * skipped. bf16 (the skip instances' dtype). */
static const acase cuda_sm90_skip_cases[] = {
    {"cuda hopper-only skip causal Sq1000 Sk1024 D64 GQA4 fwd", 1, 1000, 1024, 8, 2, 64, 1, -1, -1, 0, 0, 0, {0}, {0}, false, false, false},
    {"cuda hopper-only skip causal Sq>Sk 1300x1100 D64 GQA2 fwd", 1, 1300, 1100, 4, 2, 64, 1, -1, -1, 0, 0, 0, {0}, {0}, false, false, false},
    {"cuda hopper-only skip causal Sq1000 Sk1024 D128 B2 fwd", 2, 1000, 1024, 4, 4, 128, 1, -1, -1, 0, 0, 0, {0}, {0}, false, false, false},
    {"cuda hopper-only skip window 200/0 S1000 D128 GQA4 fwd", 1, 1000, 1000, 4, 1, 128, 0, 200, 0, 0, 0, 0, {0}, {0}, false, false, false},
    {"cuda hopper-only skip causal S1000 D256 GQA2 fwd", 1, 1000, 1000, 4, 2, 256, 1, -1, -1, 0, 0, 0, {0}, {0}, false, false, false},
    {"cuda hopper-only skip causal S17 D256 B2 fwd", 2, 17, 17, 2, 1, 256, 1, -1, -1, 0, 0, 0, {0}, {0}, false, false, false},
    {"cuda hopper-only skip S1000 D64 GQA2 B2 (padding warpgroups) fwd", 2, 1000, 1000, 4, 2, 64, 0, -1, -1, 0, 0, 0, {0}, {0}, false, false, false},
};

/* Gradient-mode cases: tiny shapes, float32 storage. */
static const acase grad_cases[] = {
    {"grad plain", 1, 5, 5, 4, 2, 4, 0, -1, -1, 0, 0, 0, {0}, {0}, false, false, true},
    {"grad causal", 1, 5, 5, 4, 2, 4, 1, -1, -1, 0, 0, 0, {0}, {0}, false, false, true},
    {"grad window 1/1", 1, 5, 5, 4, 2, 4, 0, 1, 1, 0, 0, 0, {0}, {0}, false, false, true},
    {"grad softcap", 1, 5, 5, 4, 2, 4, 0, -1, -1, 2.0f, 0.9f, 0, {0}, {0}, false, false, true},
    {"grad causal window softcap", 1, 5, 5, 4, 2, 4, 1, 2, -1, 1.5f, 0.7f, 0, {0}, {0}, false, false, true},
    {"grad causal Sq<Sk", 1, 3, 5, 4, 1, 4, 1, -1, -1, 0, 0, 0, {0}, {0}, false, false, true},
    {"grad causal Sq>Sk", 1, 5, 3, 2, 2, 4, 1, -1, -1, 0, 0, 0, {0}, {0}, false, false, true},
    {"grad varlen", 0, 0, 0, 2, 1, 4, 1, -1, -1, 0, 0, 3, {3, 1, 2}, {4, 0, 2}, false, false, true},
    {"grad packed qkv", 2, 4, 4, 2, 1, 3, 0, 1, -1, 0, 0, 0, {0}, {0}, true, false, true},
};

/* ---- test tensors for one case ----------------------------------------------------- */

/* A view into a parent tbuf: shares host / device memory (bytes = 0 so it never
 * uploads or downloads by itself: do that through the parent). Free with free(). */
static tbuf *tb_view(tbuf *parent, int ndim, const int64_t *shape, const int64_t *strides,
                     int64_t elem_offset) {
  tbuf *b = calloc(1, sizeof *b);
  *b = *parent;
  size_t off = (size_t)elem_offset * dt_size(parent->t.dtype);
  b->host = (char *)parent->host + off;
  b->dev = (char *)parent->dev + off;
  b->bytes = 0;
  b->numel = 1;
  for (int i = 0; i < ndim; i++) {
    b->shape[i] = shape[i];
    b->strides[i] = strides[i];
    b->numel *= shape[i];
  }
  b->t.data = b->dev;
  b->t.ndim = ndim;
  b->t.shape = b->shape;
  b->t.strides = b->strides;
  b->t.byte_offset = 0;
  return b;
}

typedef struct prob {
  ref_prob rp;
  DLDataType dt;
  tbuf *q, *k, *v, *out, *lse, *cu_q, *cu_k;
  tbuf *dout, *dq, *dk, *dv;
  tbuf *qkv, *dqkv; /* parents of packed views */
  bool views;       /* q, k, v, dq, dk, dv are views */
  ot_attention_params params;
} prob;

static void prob_free(prob *P) {
  if (P->views) {
    free(P->q), free(P->k), free(P->v);
    free(P->dq), free(P->dk), free(P->dv);
  } else {
    tb_free(P->q), tb_free(P->k), tb_free(P->v);
    tb_free(P->dq), tb_free(P->dk), tb_free(P->dv);
  }
  tb_free(P->qkv), tb_free(P->dqkv);
  tb_free(P->out), tb_free(P->lse), tb_free(P->cu_q), tb_free(P->cu_k), tb_free(P->dout);
}

/* Shape [.., S, H, D] of a token-major operand: dense {B, S, H, D}, varlen {T, H, D}. */
static int op_shape(const prob *P, bool is_q, int64_t *sh) {
  const ref_prob *p = &P->rp;
  int h = is_q ? p->hq : p->hkv;
  if (p->varlen) {
    sh[0] = is_q ? p->tq : p->tk, sh[1] = h, sh[2] = p->d;
    return 3;
  }
  sh[0] = p->nseq, sh[1] = is_q ? p->ql[0] : p->kl[0], sh[2] = h, sh[3] = p->d;
  return 4;
}

/* A padded strided tensor of that shape: token stride H * D + 8, head stride D + 3. */
static tbuf *new_padded(const backend *be, DLDataType dt, int nd, const int64_t *sh, int kind) {
  int64_t st[4];
  st[nd - 1] = 1;
  st[nd - 2] = sh[nd - 1] + (kind == 2 ? 2 : 3);
  st[nd - 3] = sh[nd - 2] * st[nd - 2] + 8;
  if (nd == 4) st[0] = sh[1] * st[1];
  return tb_new_strided(be, dt, nd, sh, st);
}

static void prob_make(test_run *tr, const acase *c, DLDataType dt, bool with_bwd, prob *P,
                      rng *r) {
  memset(P, 0, sizeof *P);
  ref_prob *p = &P->rp;
  P->dt = dt;
  p->varlen = c->nseq > 0;
  p->nseq = p->varlen ? c->nseq : c->b;
  p->tq = p->tk = 0;
  for (int b = 0; b < p->nseq; b++) {
    p->ql[b] = p->varlen ? c->lq[b] : c->sq;
    p->kl[b] = p->varlen ? c->lk[b] : c->sk;
    p->qs[b] = p->tq;
    p->ks[b] = p->tk;
    p->tq += p->ql[b];
    p->tk += p->kl[b];
  }
  p->hq = c->hq, p->hkv = c->hkv, p->d = c->d;
  p->scale = c->scale != 0 ? (double)c->scale : 1.0 / sqrt((double)c->d);
  p->cap = c->cap;
  p->causal = c->causal, p->wl = c->wl, p->wr = c->wr;
  P->params = ot_attention_default_params();
  P->params.softmax_scale = c->scale;
  P->params.softcap = c->cap;
  P->params.causal = c->causal;
  P->params.window_left = c->wl;
  P->params.window_right = c->wr;

  const backend *be = tr->be;
  int64_t qsh[4], ksh[4];
  int nd = op_shape(P, true, qsh);
  op_shape(P, false, ksh);
  if (c->packed) {
    /* qkv [.., S, Hq + 2 Hkv, D]: q heads, then k heads, then v heads (needs Sq == Sk). */
    int64_t psh[4];
    memcpy(psh, qsh, sizeof psh);
    psh[nd - 2] = p->hq + 2 * p->hkv;
    P->qkv = tb_new(be, dt, nd, psh);
    tb_fill_uniform(P->qkv, r, -1, 1);
    int64_t pst[4];
    pst[nd - 1] = 1, pst[nd - 2] = p->d, pst[nd - 3] = psh[nd - 2] * p->d;
    if (nd == 4) pst[0] = psh[1] * pst[1];
    P->views = true;
    P->q = tb_view(P->qkv, nd, qsh, pst, 0);
    P->k = tb_view(P->qkv, nd, ksh, pst, (int64_t)p->hq * p->d);
    P->v = tb_view(P->qkv, nd, ksh, pst, (int64_t)(p->hq + p->hkv) * p->d);
    if (with_bwd) {
      P->dqkv = tb_new(be, dt, nd, psh);
      P->dq = tb_view(P->dqkv, nd, qsh, pst, 0);
      P->dk = tb_view(P->dqkv, nd, ksh, pst, (int64_t)p->hq * p->d);
      P->dv = tb_view(P->dqkv, nd, ksh, pst, (int64_t)(p->hq + p->hkv) * p->d);
    }
  } else {
    P->q = tb_new(be, dt, nd, qsh);
    P->k = tb_new(be, dt, nd, ksh);
    P->v = tb_new(be, dt, nd, ksh);
    tb_fill_uniform(P->q, r, -2, 2);
    tb_fill_uniform(P->k, r, -1, 1);
    tb_fill_uniform(P->v, r, -1, 1);
    if (with_bwd && c->strided_out == 3) {
      P->dq = new_padded(be, dt, nd, qsh, 2);
      P->dk = new_padded(be, dt, nd, ksh, 2);
      P->dv = new_padded(be, dt, nd, ksh, 2);
    } else if (with_bwd) {
      P->dq = tb_new(be, dt, nd, qsh);
      P->dk = tb_new(be, dt, nd, ksh);
      P->dv = tb_new(be, dt, nd, ksh);
    }
  }
  /* strided_out 3: dq / dk / dv padded (D + 2), out / dout dense */
  const int pad_out = c->strided_out == 3 ? 0 : c->strided_out;
  P->out = pad_out ? new_padded(be, dt, nd, qsh, pad_out) : tb_new(be, dt, nd, qsh);
  if (with_bwd) {
    P->dout = pad_out ? new_padded(be, dt, nd, qsh, pad_out) : tb_new(be, dt, nd, qsh);
    tb_fill_uniform(P->dout, r, -1, 1);
  }
  if (p->varlen) {
    int64_t lsh[2] = {p->hq, p->tq};
    P->lse = tb_new(be, DT_F32, 2, lsh);
    int64_t csh[1] = {p->nseq + 1};
    P->cu_q = tb_new(be, DT_I32, 1, csh);
    P->cu_k = tb_new(be, DT_I32, 1, csh);
    for (int b = 0; b <= p->nseq; b++) {
      tb_set(P->cu_q, b, b < p->nseq ? (double)p->qs[b] : (double)p->tq);
      tb_set(P->cu_k, b, b < p->nseq ? (double)p->ks[b] : (double)p->tk);
    }
  } else {
    int64_t lsh[3] = {p->nseq, p->hq, p->ql[0]};
    P->lse = tb_new(be, DT_F32, 3, lsh);
  }
}

static void prob_upload_inputs(prob *P) {
  if (P->qkv) tb_dl(P->qkv);
}

static ot_status run_forward(test_run *tr, prob *P) {
  prob_upload_inputs(P);
  return ot_attention_forward(tr->be->ctx, &P->params, tb_dl(P->q), tb_dl(P->k), tb_dl(P->v),
                              P->cu_q ? tb_dl(P->cu_q) : NULL, P->cu_k ? tb_dl(P->cu_k) : NULL,
                              tb_dl(P->out), tb_dl(P->lse));
}

static ot_status run_backward(test_run *tr, prob *P) {
  prob_upload_inputs(P);
  if (P->dqkv) tb_dl(P->dqkv);
  return ot_attention_backward(tr->be->ctx, &P->params, tb_dl(P->q), tb_dl(P->k), tb_dl(P->v),
                               tb_dl(P->out), tb_dl(P->dout), tb_dl(P->lse),
                               P->cu_q ? tb_dl(P->cu_q) : NULL, P->cu_k ? tb_dl(P->cu_k) : NULL,
                               tb_dl(P->dq), tb_dl(P->dk), tb_dl(P->dv));
}

static void sync_outputs(prob *P) {
  tb_sync(P->out);
  tb_sync(P->lse);
  if (P->dqkv) tb_sync(P->dqkv);
  else if (P->dq) tb_sync(P->dq), tb_sync(P->dk), tb_sync(P->dv);
}

/* Tolerances (see the report in the suite's commit): forward out is a convex
 * combination of v (|v| < 1) computed in float32 from the exact stored inputs, so its
 * error is the storage rounding of out plus a few float32 ulps of the online softmax:
 * k = 1 for bf16 / f16, k = 4 for float32 (long rows, polynomial exp). lse is float32
 * for every dtype: tol_for(f32, 4). Gradients sum up to Sq (or Sk) products and use
 * the stored (rounded) out for delta: k = 2 for bf16 / f16 and k = 8 for float32. */
static tol out_tol(DLDataType dt) { return tol_for(dt, dt.bits == 32 ? 4 : 1); }
static tol grad_tol(DLDataType dt) { return tol_for(dt, dt.bits == 32 ? 8 : 2); }

static const DLDataType *all_dtypes[] = {&DT_F32, &DT_F16, &DT_BF16};

/* While true (the OT_ATTN_IMPL=sm90 pass), a CUDA OT_ERR_UNSUPPORTED is a failure unless
 * no Hopper kernel can run here at all (then the case is skipped): with the variable set,
 * a call the Hopper kernels decline fails instead of silently running the portable kernel,
 * whose results would pass the same checks. */
static bool require_sm90;

/* While set (with require_sm90), the forward of run_case_det runs with OT_ATTN_IMPL unset
 * (the portable forward where the Hopper one declines: D 96 under OT_ATTN_SM90_PAD96=0),
 * the backward under the caller's OT_ATTN_IMPL=sm90. */
static bool fwd_any_impl;

/* While nonzero, the backward of run_case_det runs with an arena attached to the context
 * whose room beyond the cuBLASLt workspace is this many bytes. */
static size_t bwd_arena_room;

/* run_backward with an arena attached to the context whose room beyond the cuBLASLt
 * workspace is `room` bytes (0: without an arena). */
static ot_status run_backward_room(test_run *tr, prob *P, size_t room) {
  if (!room) return run_backward(tr, P);
  ot_arena *arena = NULL;
  ot_status st = ot_arena_create(tr->be->ctx, ((size_t)32 << 20) + room, &arena);
  if (!tr_ok(tr, st, "arena")) return st;
  st = ot_context_set_arena(tr->be->ctx, arena);
  if (tr_ok(tr, st, "attach the arena")) {
    /* A successful call leaves ot_last_error() alone, a kernel's fallback inside it (its
     * scratch did not fit) included: a known message first, the same one after. */
    (void)ot_context_set_stream(NULL, NULL);
    char before[256];
    snprintf(before, sizeof before, "%s", ot_last_error());
    st = run_backward(tr, P);
    if (st == OT_OK && strcmp(before, ot_last_error()) != 0)
      tr_fail(tr, "a successful backward changed ot_last_error() to '%s'", ot_last_error());
    ot_context_set_arena(tr->be->ctx, NULL);
  }
  ot_arena_destroy(arena);
  return st;
}

static bool attn_ok(test_run *tr, ot_status st, const char *what) {
  if (require_sm90 && st == OT_ERR_UNSUPPORTED) {
    if (strstr(ot_last_error(), "no Hopper attention kernel here")) {
      tr->case_skipped = true;
      return false;
    }
    tr_fail(tr, "%s: the Hopper kernel did not take the call: %s", what, ot_last_error());
    return false;
  }
  return tr_ok(tr, st, what);
}

static void run_case_det(test_run *tr, const acase *c, DLDataType dt, bool det) {
  bool bwd = c->bwd;
  if (!tr_begin(tr, "attention %s %s%s", c->name, dt_name(dt), bwd ? " +bwd" : "")) return;
  rng r = tr_rng(tr);
  prob P;
  prob_make(tr, c, dt, bwd, &P, &r);
  P.params.deterministic = det;
  const ref_prob *p = &P.rp;
  int64_t nq = p->tq * p->hq * p->d, nk = p->tk * p->hkv * p->d;
  double *q = tb_to_f64(P.q), *k = tb_to_f64(P.k), *v = tb_to_f64(P.v);
  double *out = malloc((nq + 1) * sizeof *out), *lse = malloc((p->tq * p->hq + 1) * sizeof *lse);
  ot_status fst;
  if (fwd_any_impl) {
    env_saved im = env_set("OT_ATTN_IMPL", NULL);
    fst = run_forward(tr, &P);
    env_restore(&im);
  } else {
    fst = run_forward(tr, &P);
  }
  if (attn_ok(tr, fst, "ot_attention_forward")) {
    sync_outputs(&P);
    ref_forward(p, q, k, v, out, lse); /* after the call: no reference for skipped cases */
    check_close(tr, "out", P.out, out, out_tol(dt));
    check_close(tr, "lse", P.lse, lse, tol_for(DT_F32, 4));
    if (bwd) {
      double *dout = tb_to_f64(P.dout);
      double *dq = malloc((nq + 1) * sizeof *dq), *dk = malloc((nk + 1) * sizeof *dk),
             *dv = malloc((nk + 1) * sizeof *dv);
      ref_backward(p, q, k, v, dout, dq, dk, dv);
      if (attn_ok(tr, run_backward_room(tr, &P, bwd_arena_room), "ot_attention_backward")) {
        sync_outputs(&P);
        check_close(tr, "dq", P.dq, dq, grad_tol(dt));
        check_close(tr, "dk", P.dk, dk, grad_tol(dt));
        check_close(tr, "dv", P.dv, dv, grad_tol(dt));
        if (P.dqkv) {
          /* The packed dqkv buffer is exactly covered by dq, dk, dv: nothing poisoned left. */
          for (int64_t i = 0; i < P.dqkv->numel; i++)
            if (isnan(tb_get(P.dqkv, i))) {
              tr_fail(tr, "dqkv element %lld not written", (long long)i);
              break;
            }
        }
      }
      free(dout), free(dq), free(dk), free(dv);
    }
  }
  free(q), free(k), free(v), free(out), free(lse);
  prob_free(&P);
  tr_end(tr);
}

static void run_case(test_run *tr, const acase *c, DLDataType dt) { run_case_det(tr, c, dt, false); }

/* cuda_sm90_dyn_cases: the dynamic schedule's outputs bit for bit against the static
 * order's (OT_ATTN_SM90_DYN=0), then twice more in a row, outputs poisoned before each
 * call (the oracle comparison is run_case's, before this). */
static void run_dyn_case(test_run *tr, const acase *c, DLDataType dt) {
  if (!tr_begin(tr, "attention %s %s dynamic = static, 3 calls", c->name, dt_name(dt))) return;
  rng r = tr_rng(tr);
  prob P;
  prob_make(tr, c, dt, false, &P, &r);
  void *so = NULL, *sl = NULL;
  for (int call = 0; call < 4 && !tr->case_failed; call++) {
    /* call 1: the static order; 0, 2, 3: dynamic */
    env_saved dy = env_set("OT_ATTN_SM90_DYN", call == 1 ? "0" : "1");
    tb_poison(P.out);
    tb_poison(P.lse);
    const ot_status st = run_forward(tr, &P);
    env_restore(&dy);
    if (!attn_ok(tr, st, "ot_attention_forward")) break;
    sync_outputs(&P);
    if (call == 0) {
      so = tb_snapshot(P.out);
      sl = tb_snapshot(P.lse);
    } else if (!tb_unchanged(P.out, so) || !tb_unchanged(P.lse, sl)) {
      tr_fail(tr, "call %d (%s) differs from the first (dynamic) call", call,
              call == 1 ? "static order" : "dynamic again");
    }
  }
  free(so), free(sl);
  prob_free(&P);
  tr_end(tr);
}

/* Determinism and the stability of repeated calls: forward and backward twice give
 * bitwise identical results. */
static void run_repeat_case(test_run *tr) {
  if (!tr_begin(tr, "attention repeat is bitwise identical")) return;
  acase c = {"rep", 2, 150, 170, 8, 2, 64, 1, 40, -1, 0, 0, 0, {0}, {0}, false, false, true};
  rng r = tr_rng(tr);
  prob P;
  prob_make(tr, &c, DT_F32, true, &P, &r);
  void *s[4] = {0};
  for (int rep = 0; rep < 2 && !tr->case_failed; rep++) {
    if (!tr_ok(tr, run_forward(tr, &P), "forward") || !tr_ok(tr, run_backward(tr, &P), "backward"))
      break;
    sync_outputs(&P);
    tbuf *o[4] = {P.out, P.dq, P.dk, P.dv};
    for (int i = 0; i < 4; i++) {
      if (rep == 0) s[i] = tb_snapshot(o[i]);
      else if (!tb_unchanged(o[i], s[i])) tr_fail(tr, "output %d differs between two runs", i);
    }
  }
  for (int i = 0; i < 4; i++) free(s[i]);
  prob_free(&P);
  tr_end(tr);
}

/* ---- gradient mode ------------------------------------------------------------------- */

typedef struct fd_state {
  const ref_prob *p;
  int64_t nq, nk;
} fd_state;

static void fd_forward(void *state, const double *in, double *out) {
  fd_state *s = state;
  ref_forward(s->p, in, in + s->nq, in + s->nq + s->nk, out, NULL);
}

static void run_grad_case(test_run *tr, const acase *c) {
  if (!tr_begin(tr, "attention %s f32", c->name)) return;
  rng r = tr_rng(tr);
  prob P;
  prob_make(tr, c, DT_F32, true, &P, &r);
  const ref_prob *p = &P.rp;
  int64_t nq = p->tq * p->hq * p->d, nk = p->tk * p->hkv * p->d;
  double *in = malloc((nq + 2 * nk) * sizeof *in);
  double *q = tb_to_f64(P.q), *k = tb_to_f64(P.k), *v = tb_to_f64(P.v), *dout = tb_to_f64(P.dout);
  memcpy(in, q, nq * sizeof *in);
  memcpy(in + nq, k, nk * sizeof *in);
  memcpy(in + nq + nk, v, nk * sizeof *in);
  double *grad = malloc((nq + 2 * nk) * sizeof *grad);
  fd_state st = {p, nq, nk};
  fd_vjp(fd_forward, &st, in, nq + 2 * nk, nq, dout, grad, 1e-5);
  tol t = tol_for(DT_F32, 4);
  if (tr_ok(tr, run_forward(tr, &P), "ot_attention_forward") &&
      tr_ok(tr, run_backward(tr, &P), "ot_attention_backward")) {
    sync_outputs(&P);
    check_close(tr, "dq vs finite differences", P.dq, grad, t);
    check_close(tr, "dk vs finite differences", P.dk, grad + nq, t);
    check_close(tr, "dv vs finite differences", P.dv, grad + nq + nk, t);
  }
  free(in), free(q), free(k), free(v), free(dout), free(grad);
  prob_free(&P);
  tr_end(tr);
}

/* ---- bad inputs ------------------------------------------------------------------------ */

typedef enum bad_kind {
  BAD_HQ_NOT_MULTIPLE,
  BAD_D_MISMATCH,
  BAD_V_SHAPE,
  BAD_ONLY_CU_Q,
  BAD_CU_DECREASING,
  BAD_CU_END,
  BAD_CU_START,
  BAD_CU_DTYPE,
  BAD_LSE_SHAPE,
  BAD_LSE_DTYPE,
  BAD_OUT_OVERLAPS_Q,
  BAD_K_DTYPE,
  BAD_Q_INT,
  BAD_Q_MISALIGNED,
  BAD_OUT_MISALIGNED,
  BAD_K_LAST_STRIDE,
  BAD_V_NULL,
  BAD_Q_DATA_NULL,
  BAD_Q_RANK,
  BAD_SOFTCAP,
  BAD_PARAMS_NULL,
  BAD_OUT_SELF_OVERLAP,
  BAD_COUNT
} bad_kind;

static const char *bad_names[] = {
    "Hq not a multiple of Hkv", "D mismatch", "v shape", "only cu_seqlens_q",
    "cu_seqlens decreasing", "cu_seqlens end != T", "cu_seqlens start != 0",
    "cu_seqlens int64", "lse shape", "lse dtype", "out overlaps q", "k dtype", "q int32",
    "q misaligned", "out misaligned", "k last dim strided", "v NULL", "q data NULL",
    "q rank", "negative softcap", "params NULL", "out stride 0"};

/* One bad argument per case, for forward (which_op 0) or backward (1); `arg` is the
 * name the message must contain. */
static void run_bad_case(test_run *tr, bad_kind kind, int which_op) {
  const char *opname = which_op ? "ot_attention_backward" : "ot_attention_forward";
  if (!tr_begin(tr, "%s bad input: %s", opname, bad_names[kind])) return;
  bool varlen = kind >= BAD_ONLY_CU_Q && kind <= BAD_CU_DTYPE;
  acase c = {"bad", 2, 12, 12, 4, 2, 16, 1, -1, -1, 0, 0, 0, {0}, {0}, false, false, true};
  if (varlen) {
    c.nseq = 3;
    int l[3] = {4, 0, 7};
    memcpy(c.lq, l, sizeof l);
    memcpy(c.lk, l, sizeof l);
  }
  /* bf16 for the varlen kinds on CUDA, whose kernels take 16-bit storage only. */
  DLDataType dt = kind == BAD_OUT_MISALIGNED || (varlen && tr->be->is_cuda) ? DT_BF16 : DT_F32;
  rng r = tr_rng(tr);
  prob P;
  prob_make(tr, &c, dt, true, &P, &r);
  /* A valid out / lse for the backward's inputs. */
  tb_fill_uniform(P.out, &r, -1, 1);
  tb_fill_uniform(P.lse, &r, 1, 2);
  const ot_attention_params *params = &P.params;
  DLTensor q = *tb_dl(P.q), k = *tb_dl(P.k), v = *tb_dl(P.v), out = *tb_dl(P.out),
           lse = *tb_dl(P.lse), dout = *tb_dl(P.dout), dq = *tb_dl(P.dq);
  DLTensor cuq, cuk;
  const DLTensor *pv = &v, *pcuq = NULL, *pcuk = NULL;
  if (varlen) cuq = *tb_dl(P.cu_q), cuk = *tb_dl(P.cu_k), pcuq = &cuq, pcuk = &cuk;
  int64_t shape_a[4], strides_a[4];
  tbuf *extra = NULL;
  const char *arg = NULL;
  switch (kind) {
    case BAD_HQ_NOT_MULTIPLE:
      /* k / v with 3 heads for 4 query heads. */
      memcpy(shape_a, P.k->shape, sizeof shape_a);
      shape_a[2] = 3;
      extra = tb_new(tr->be, dt, 4, shape_a);
      tb_fill_uniform(extra, &r, -1, 1);
      k = *tb_dl(extra), v = *tb_dl(extra);
      arg = "k";
      break;
    case BAD_D_MISMATCH:
      memcpy(shape_a, P.k->shape, sizeof shape_a);
      shape_a[3] = 8;
      extra = tb_new(tr->be, dt, 4, shape_a);
      tb_fill_uniform(extra, &r, -1, 1);
      k = *tb_dl(extra);
      arg = "k";
      break;
    case BAD_V_SHAPE:
      memcpy(shape_a, P.k->shape, sizeof shape_a);
      shape_a[1] = 11;
      extra = tb_new(tr->be, dt, 4, shape_a);
      tb_fill_uniform(extra, &r, -1, 1);
      v = *tb_dl(extra);
      arg = "v";
      break;
    case BAD_ONLY_CU_Q: pcuk = NULL, arg = "cu_seqlens_k"; break;
    case BAD_CU_DECREASING:
      tb_set(P.cu_q, 2, 2); /* {0, 4, 2, 11} */
      cuq = *tb_dl(P.cu_q);
      arg = "cu_seqlens_q[2]";
      break;
    case BAD_CU_END:
      tb_set(P.cu_k, 3, 10);
      cuk = *tb_dl(P.cu_k);
      arg = "cu_seqlens_k[3]";
      break;
    case BAD_CU_START:
      tb_set(P.cu_q, 0, 1);
      cuq = *tb_dl(P.cu_q);
      arg = "cu_seqlens_q[0]";
      break;
    case BAD_CU_DTYPE: {
      int64_t sh[1] = {4};
      extra = tb_new(tr->be, DT_I64, 1, sh);
      for (int i = 0; i < 4; i++) tb_set(extra, i, tb_get(P.cu_q, i));
      cuq = *tb_dl(extra);
      arg = "cu_seqlens_q";
      break;
    }
    case BAD_LSE_SHAPE: {
      int64_t sh[3] = {2, 4, 11};
      extra = tb_new(tr->be, DT_F32, 3, sh);
      lse = *tb_dl(extra);
      arg = "lse";
      break;
    }
    case BAD_LSE_DTYPE:
      extra = tb_new(tr->be, DT_F16, 3, P.lse->shape);
      lse = *tb_dl(extra);
      arg = "lse";
      break;
    case BAD_OUT_OVERLAPS_Q:
      /* out starts 16 elements into q: partial overlap. */
      if (which_op) dq.byte_offset = 16 * 4, dq.data = q.data, arg = "dq";
      else out.byte_offset = 16 * 4, out.data = q.data, arg = "out";
      break;
    case BAD_K_DTYPE:
      extra = tb_new(tr->be, DT_F16, 4, P.k->shape);
      tb_fill_uniform(extra, &r, -1, 1);
      k = *tb_dl(extra);
      arg = "k";
      break;
    case BAD_Q_INT:
      extra = tb_new(tr->be, DT_I32, 4, P.q->shape);
      q = *tb_dl(extra);
      arg = "q";
      break;
    case BAD_Q_MISALIGNED: q.byte_offset = 2, arg = "q"; break;
    case BAD_OUT_MISALIGNED:
      if (which_op) dq.byte_offset = 1, arg = "dq";
      else out.byte_offset = 1, arg = "out";
      break;
    case BAD_K_LAST_STRIDE:
      memcpy(shape_a, P.k->shape, sizeof shape_a);
      strides_a[3] = 2, strides_a[2] = 2 * shape_a[3], strides_a[1] = strides_a[2] * shape_a[2],
      strides_a[0] = strides_a[1] * shape_a[1];
      extra = tb_new_strided(tr->be, dt, 4, shape_a, strides_a);
      tb_fill_uniform(extra, &r, -1, 1);
      k = *tb_dl(extra);
      arg = "k";
      break;
    case BAD_V_NULL: pv = NULL, arg = "v"; break;
    case BAD_Q_DATA_NULL: q.data = NULL, arg = "q"; break;
    case BAD_Q_RANK: q.ndim = 3, arg = "q"; break;
    case BAD_SOFTCAP: P.params.softcap = -1.0f, arg = "softcap"; break;
    case BAD_PARAMS_NULL: params = NULL, arg = "params"; break;
    case BAD_OUT_SELF_OVERLAP:
      /* token stride 0: every token writes the same row. */
      memcpy(strides_a, P.out->strides, sizeof strides_a);
      strides_a[1] = 0;
      if (which_op) dq.strides = strides_a, arg = "dq";
      else out.strides = strides_a, arg = "out";
      break;
    default: break;
  }
  void *snaps[5];
  tbuf *outs[5] = {P.out, P.lse, P.dq, P.dk, P.dv};
  for (int i = 0; i < 5; i++) snaps[i] = tb_snapshot(outs[i]);
  ot_status st;
  if (which_op)
    st = ot_attention_backward(tr->be->ctx, params, &q, &k, pv, &out, &dout, &lse, pcuq, pcuk,
                               &dq, tb_dl(P.dk), tb_dl(P.dv));
  else
    st = ot_attention_forward(tr->be->ctx, params, &q, &k, pv, pcuq, pcuk, &out, &lse);
  /* On CUDA, cu_seqlens live on the device and are not read by the host: the kernels
   * skip sequences whose bounds leave the tensors (never an out-of-bounds access, see
   * docs/ATTENTION.md) and the call succeeds; what they write is unspecified. */
  bool device_values = tr->be->is_cuda && (kind == BAD_CU_DECREASING || kind == BAD_CU_END ||
                                           kind == BAD_CU_START);
  if (device_values) {
    if (tr_ok(tr, st, opname)) tb_sync(P.out); /* and the launch completed */
  } else {
    tr_expect_error(tr, st, OT_ERR_INVALID_ARGUMENT, opname, arg);
    /* The forward's out / lse are the backward's inputs: only the op's outputs count. */
    int first = which_op ? 2 : 0, last = which_op ? 5 : 2;
    for (int i = first; i < last; i++)
      if (!tb_unchanged(outs[i], snaps[i])) tr_fail(tr, "output %d written on failure", i);
  }
  for (int i = 0; i < 5; i++) free(snaps[i]);
  tb_free(extra);
  prob_free(&P);
  tr_end(tr);
}

/* Backward-only argument checks. */
static void run_bad_bwd_extra(test_run *tr) {
  static const char *names[] = {"lse NULL", "dq overlaps dout", "dk shape", "dout dtype",
                                "dv overlaps dk"};
  for (int which = 0; which < 5; which++) {
    if (!tr_begin(tr, "ot_attention_backward bad input: %s", names[which])) continue;
    acase c = {"bad", 1, 9, 9, 4, 2, 16, 0, -1, -1, 0, 0, 0, {0}, {0}, false, false, true};
    rng r = tr_rng(tr);
    prob P;
    prob_make(tr, &c, DT_F32, true, &P, &r);
    tb_fill_uniform(P.out, &r, -1, 1);
    tb_fill_uniform(P.lse, &r, 1, 2);
    DLTensor dout = *tb_dl(P.dout), dq = *tb_dl(P.dq), dk = *tb_dl(P.dk), dv = *tb_dl(P.dv);
    const DLTensor *lse = tb_dl(P.lse);
    tbuf *extra = NULL;
    const char *arg = names[which];
    switch (which) {
      case 0: lse = NULL, arg = "lse"; break;
      case 1: dq.data = dout.data, dq.byte_offset = 4, arg = "dq"; break;
      case 2: {
        int64_t sh[4] = {1, 9, 4, 16};
        extra = tb_new(tr->be, DT_F32, 4, sh);
        dk = *tb_dl(extra);
        arg = "dk";
        break;
      }
      case 3:
        extra = tb_new(tr->be, DT_BF16, 4, P.dout->shape);
        tb_fill_uniform(extra, &r, -1, 1);
        dout = *tb_dl(extra);
        arg = "dout";
        break;
      case 4: dv = dk, arg = "dv"; break;
    }
    void *snaps[3];
    tbuf *outs[3] = {P.dq, P.dk, P.dv};
    for (int i = 0; i < 3; i++) snaps[i] = tb_snapshot(outs[i]);
    ot_status st = ot_attention_backward(tr->be->ctx, &P.params, tb_dl(P.q), tb_dl(P.k),
                                         tb_dl(P.v), tb_dl(P.out), &dout, lse, NULL, NULL, &dq,
                                         &dk, &dv);
    tr_expect_error(tr, st, OT_ERR_INVALID_ARGUMENT, "ot_attention_backward", arg);
    for (int i = 0; i < 3; i++) {
      if (!tb_unchanged(outs[i], snaps[i])) tr_fail(tr, "output %d written on failure", i);
      free(snaps[i]);
    }
    tb_free(extra);
    prob_free(&P);
    tr_end(tr);
  }
}

/* CUDA: the forward (split-KV and unsplit) and the backward with params.deterministic
 * (no atomics) are bitwise repeatable in bf16. */
static void run_repeat_case_cuda(test_run *tr, const acase *c) {
  if (!tr_begin(tr, "attention repeat is bitwise identical (%s bf16)", c->name)) return;
  rng r = tr_rng(tr);
  prob P;
  prob_make(tr, c, DT_BF16, true, &P, &r);
  P.params.deterministic = 1;
  void *s[5] = {0};
  for (int rep = 0; rep < 2 && !tr->case_failed; rep++) {
    if (!tr_ok(tr, run_forward(tr, &P), "forward") || !tr_ok(tr, run_backward(tr, &P), "backward"))
      break;
    sync_outputs(&P);
    tbuf *o[5] = {P.out, P.lse, P.dq, P.dk, P.dv};
    for (int i = 0; i < 5; i++) {
      if (rep == 0) s[i] = tb_snapshot(o[i]);
      else if (!tb_unchanged(o[i], s[i])) tr_fail(tr, "output %d differs between two runs", i);
    }
  }
  for (int i = 0; i < 5; i++) free(s[i]);
  prob_free(&P);
  tr_end(tr);
}

/* The Hopper backward's scratch (dQ accumulator, 4 (D + 2) bytes a query row and head:
 * 1 MiB here) does not fit in the arena, the portable backward's (4 bytes: 8 KB) does: the
 * call falls back to the portable kernel instead of failing with OT_ERR_OOM. Under
 * OT_ATTN_IMPL=sm90 the same backward is the Hopper kernel's OT_ERR_OOM (so the first case
 * did decline it on a Hopper device); skipped where no Hopper kernel can run. */
static void run_scratch_fallback_case(test_run *tr) {
  static const acase c = {"bwd scratch fallback (arena of 64 KB) S1000 D128 causal", 1, 1000,
                          1000, 2, 2, 128, 1, -1, -1, 0, 0, 0, {0}, {0}, false, false, true};
  bwd_arena_room = 64 << 10;
  run_case(tr, &c, DT_BF16);
  bwd_arena_room = 0;
  if (!tr_begin(tr, "attention bwd scratch (arena of 64 KB): OT_ATTN_IMPL=sm90 keeps the OOM"))
    return;
  env_saved impl = env_set("OT_ATTN_IMPL", "sm90");
  rng r = tr_rng(tr);
  prob P;
  prob_make(tr, &c, DT_BF16, true, &P, &r);
  ot_status st = run_forward(tr, &P);
  if (st == OT_ERR_UNSUPPORTED && strstr(ot_last_error(), "no Hopper attention kernel here"))
    tr->case_skipped = true;
  else if (tr_ok(tr, st, "ot_attention_forward"))
    tr_expect_error(tr, run_backward_room(tr, &P, 64 << 10), OT_ERR_OOM, "ot_attention_backward",
                    "scratch from the context's arena");
  env_restore(&impl);
  prob_free(&P);
  tr_end(tr);
}

/* OT_ATTN_IMPL=sm90 and a call the Hopper forward does not take (softcap): a clear
 * OT_ERR_UNSUPPORTED, not the portable kernel; skipped where no Hopper kernel can run. */
static void run_sm90_refusal_case(test_run *tr) {
  static const acase c = {"softcap", 1, 65, 65, 2, 1, 128, 0, -1, -1, 30.0f, 0, 0, {0}, {0}, false, false, false};
  if (!tr_begin(tr, "attention OT_ATTN_IMPL=sm90 refuses a call the Hopper forward does not take (softcap)"))
    return;
  rng r = tr_rng(tr);
  prob P;
  prob_make(tr, &c, DT_BF16, false, &P, &r);
  ot_status st = run_forward(tr, &P);
  if (st == OT_ERR_UNSUPPORTED && strstr(ot_last_error(), "no Hopper attention kernel here"))
    tr->case_skipped = true;
  else
    tr_expect_error(tr, st, OT_ERR_UNSUPPORTED, "OT_ATTN_IMPL=sm90", "does not cover");
  prob_free(&P);
  tr_end(tr);
}

/* run_case under OT_ATTN_SM90_GRID=3 where the case's name says "GRID 3" (few persistent
 * CTAs, many tiles each) */
/* run_case under OT_ATTN_SM90_GRID=n where the case's name says "GRID n" (else unset) */
static void run_case_grid(test_run *tr, const acase *c, DLDataType dt) {
  const char *g = strstr(c->name, "GRID ");
  char n[12] = {0};
  if (g) sscanf(g + 5, "%11[0-9]", n);
  env_saved gr = env_set("OT_ATTN_SM90_GRID", n[0] ? n : NULL);
  run_case(tr, c, dt);
  env_restore(&gr);
}

#ifdef OT_TEST_CUDA
/* src/cuda/sm90/attention_fwd_sm90.cu (internal, for tests) */
void ot_cuda_attn_sm90_last_plan(int out[6]);
double ot_cuda_attn_sm90_static_balance(int num_m, int nhb, int sect, int sq, int sk, int br,
                                        int bc, int wl, int wr, int grid);

static int fdiv_floor(int a, int b) { return a / b - (a % b != 0 && a < 0); }

/* The static round-robin's balance tile by tile (tile t on CTA t % grid, decode_tile's
 * sectioned order), against which the library's O(sections x query tiles) model is checked */
static double brute_balance(int num_m, int nhb, int sect, int sq, int sk, int br, int bc,
                            int wl, int wr, int grid) {
  double *sums = calloc((size_t)grid, sizeof *sums), total = 0, mx = 0;
  const int per = sect * num_m, n = num_m * nhb, off = sk - sq;
  for (int t = 0; t < n; t++) {
    const int sec = t / per, hb0 = sec * sect, cnt = nhb - hb0 < sect ? nhb - hb0 : sect;
    const int mi = (t - sec * per) / cnt, mb = wr >= 0 ? num_m - 1 - mi : mi;
    const int row_last = mb * br + br - 1 < sq - 1 ? mb * br + br - 1 : sq - 1;
    int n_max = (sk + bc - 1) / bc, n_min = 0;
    if (wr >= 0 && fdiv_floor(row_last + off + wr, bc) + 1 < n_max)
      n_max = fdiv_floor(row_last + off + wr, bc) + 1;
    if (wl >= 0 && fdiv_floor(mb * br + off - wl, bc) > 0) n_min = fdiv_floor(mb * br + off - wl, bc);
    const double cost = n_max > n_min ? n_max - n_min + 0.5 : 0.0;
    sums[t % grid] += cost;
    total += cost;
  }
  for (int i = 0; i < grid; i++) mx = sums[i] > mx ? sums[i] : mx;
  free(sums);
  return mx > 0 ? total / grid / mx : 1.0;
}

/* The forward's static-order balance model (the OT_ATTN_SM90_DYN=auto gate): equal to the
 * tile-by-tile sums on causal, windowed, Sq != Sk (query tiles without keys) and unmasked
 * orders, sections that do not divide the heads, grids of 1 to more than the tiles; and the
 * resonance it exists for -- D64 causal S 4k B 8 H 32 on 3 consumers, sections of 24 heads x
 * 22 query tiles = 4 x 132 tiles, every CTA the same positions of each section -- well below
 * 0.97, S 8k B 4 above it. Host only: runs in CPU-only CUDA builds too. */
static void run_sm90_balance_model(test_run *tr) {
  if (!tr_begin(tr, "attention sm90 static-order balance model")) return;
  static const int cs[][10] = {
      /* num_m, nhb, sect, sq, sk, br, bc, wl, wr, grid */
      {22, 256, 24, 4096, 4096, 192, 128, -1, 0, 132}, {43, 128, 12, 8192, 8192, 192, 128, -1, 0, 132},
      {32, 256, 24, 4096, 4096, 128, 128, -1, 0, 132}, {27, 192, 19, 5120, 5120, 192, 128, -1, 0, 132},
      {16, 8, 3, 2000, 2000, 128, 128, 256, 64, 5},     {36, 4, 4, 4500, 3000, 128, 128, -1, 0, 7},
      {24, 4, 3, 4500, 3000, 192, 128, -1, 0, 3},       {10, 10, 3, 1200, 1200, 128, 80, -1, 0, 1},
      {10, 10, 3, 1200, 1200, 128, 80, -1, 0, 200},     {8, 6, 4, 1000, 1000, 128, 176, -1, -1, 13},
      {12, 7, 7, 700, 1500, 64, 128, 100, 0, 9},        {64, 32, 5, 8192, 8192, 128, 128, -1, 0, 132},
      {10, 40, 7, 1200, 1200, 128, 80, -1, 0, 1500},    /* past the model's 1024 CTAs on the stack */
  };
  for (size_t i = 0; i < sizeof cs / sizeof cs[0] && !tr->case_failed; i++) {
    const int *c = cs[i];
    const double m = ot_cuda_attn_sm90_static_balance(c[0], c[1], c[2], c[3], c[4], c[5], c[6],
                                                      c[7], c[8], c[9]);
    const double b = brute_balance(c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7], c[8], c[9]);
    if (!(fabs(m - b) < 1e-9) || !(m > 0 && m <= 1))
      tr_fail(tr, "row %zu: model %.12f, tile by tile %.12f", i, m, b);
  }
  const double res = ot_cuda_attn_sm90_static_balance(22, 256, 24, 4096, 4096, 192, 128, -1, 0, 132);
  const double ok = ot_cuda_attn_sm90_static_balance(43, 128, 12, 8192, 8192, 192, 128, -1, 0, 132);
  if (!(res > 0.80 && res < 0.86) || !(ok > 0.99))
    tr_fail(tr, "resonance %.4f (expected 0.80-0.86), S 8k %.4f (expected > 0.99)", res, ok);
  tr_end(tr);
}

/* kFlSplit's shares, host only (the functions the kernel and launch() use): every key tile of
 * every tail tile in exactly one piece, at most two pieces and len key tiles a CTA, the last
 * round's longest share at most max(ceil(units / grid), ceil(sqrt(n_it / 2))) key tiles, and
 * the CTAs split_ctas names for a tile exactly those holding a piece of it, within pmax slots */
void ot_cuda_attn_sm90_split_shares(int n_tiles, int grid, int n_it, int *out);

static void run_sm90_split_shares(test_run *tr) {
  if (!tr_begin(tr, "attention sm90 tail split shares")) return;
  static const int cs[][3] = {
      /* n_tiles, grid, n_it: D256 S 1k / 4k, D128 S 1k / 4k / 16k on 132 CTAs, the C cases'
       * GRID 10 / 7 / 5 / 20 / 43, one tile left, rem = grid - 1, one key tile, long keys */
      {2048, 132, 13}, {2048, 132, 52}, {4096, 132, 8}, {4096, 132, 32}, {4096, 132, 128},
      {64, 10, 13},    {48, 7, 8},      {12, 5, 14},    {48, 20, 1},     {44, 43, 32},
      {133, 132, 7},   {263, 132, 9},   {300, 100, 1},  {40, 3, 1000},   {1000, 999, 3},
  };
  for (size_t i = 0; i < sizeof cs / sizeof cs[0] && !tr->case_failed; i++) {
    const int nt = cs[i][0], g = cs[i][1], n_it = cs[i][2], rem = nt % g;
    int *o = malloc(sizeof(int) * (size_t)(6 + 8 * g));
    int *cover = calloc((size_t)(rem * n_it + 1), sizeof(int));
    int *lo_b = malloc(sizeof(int) * (size_t)(rem + 1)), *hi_b = malloc(sizeof(int) * (size_t)(rem + 1));
    if (!o || !cover || !lo_b || !hi_b) {
      tr_fail(tr, "out of memory");
    } else {
      ot_cuda_attn_sm90_split_shares(nt, g, n_it, o);
      const int len = o[3], pmax = o[5];
      int want_len = (rem * n_it + g - 1) / g, s = 1;
      while (s * s * 2 < n_it) s++;   /* ceil(sqrt(n_it / 2)) */
      if (s > want_len) want_len = s;
      if (o[0] != nt - rem || o[1] != nt - rem + 2 * g || o[2] != n_it || o[4] != rem * n_it ||
          len != want_len)
        tr_fail(tr, "row %zu: plan %d %d %d %d %d %d", i, o[0], o[1], o[2], o[3], o[4], o[5]);
      for (int r = 0; r < rem; r++) lo_b[r] = g, hi_b[r] = -1;
      for (int b = 0; b < g && !tr->case_failed; b++) {
        int mine = 0;
        for (int sl = 0; sl < 2; sl++) {
          const int *p = o + 6 + 3 * (sl * g + b);
          if (p[2] <= p[1]) continue;
          if (p[0] < 0 || p[0] >= rem || p[1] < 0 || p[2] > n_it) {
            tr_fail(tr, "row %zu: CTA %d slot %d: tile %d keys %d..%d", i, b, sl, p[0], p[1], p[2]);
            break;
          }
          mine += p[2] - p[1];
          for (int k = p[1]; k < p[2]; k++) cover[p[0] * n_it + k]++;
          if (b < lo_b[p[0]]) lo_b[p[0]] = b;
          if (b > hi_b[p[0]]) hi_b[p[0]] = b;
        }
        if (mine > len) tr_fail(tr, "row %zu: CTA %d holds %d key tiles (len %d)", i, b, mine, len);
      }
      for (int u = 0; u < rem * n_it && !tr->case_failed; u++)
        if (cover[u] != 1) tr_fail(tr, "row %zu: key tile %d of tile %d in %d pieces", i, u % n_it, u / n_it, cover[u]);
      for (int r = 0; r < rem && !tr->case_failed; r++) {
        const int *c = o + 6 + 6 * g + 2 * r;
        if (c[0] != lo_b[r] || c[1] != hi_b[r] || c[1] - c[0] + 1 > pmax)
          tr_fail(tr, "row %zu: tile %d on CTAs %d..%d (holders %d..%d, pmax %d)", i, r, c[0], c[1], lo_b[r], hi_b[r], pmax);
      }
    }
    free(o);
    free(cover);
    free(lo_b);
    free(hi_b);
  }
  tr_end(tr);
}

/* After run_case: the last Hopper forward launched nc consumers on bc-key tiles (0: any), with
 * the variant bits fl_set and none of fl_clear, and the plan flags (1 persistent, 2 dynamic,
 * 4 masked) flags_set and none of flags_clear */
static void check_sm90_plan(test_run *tr, const char *name, int nc, int bc, int fl_set,
                            int fl_clear, int flags_set, int flags_clear) {
  if (!tr_begin(tr, "attention sm90 plan: %s", name)) return;
  int pl[6] = {0, 0, 0, 0, 0, 0};
  ot_cuda_attn_sm90_last_plan(pl);
  if ((nc && pl[0] != nc) || (bc && pl[1] != bc) || (pl[3] & fl_set) != fl_set ||
      (pl[3] & fl_clear) || (pl[4] & flags_set) != flags_set || (pl[4] & flags_clear))
    tr_fail(tr, "ran %d consumers, %d-key tile, %d CTAs, bits 0x%x, flags %d (expected %d, %d, "
            "bits 0x%x set / 0x%x clear, flags %d set / %d clear)", pl[0], pl[1], pl[2], pl[3],
            pl[4], nc, bc, fl_set, fl_clear, flags_set, flags_clear);
  tr_end(tr);
}


/* OT_ATTN_SM90_DYN=auto: where the tiles per CTA exceed the count gate (16), the modeled
 * balance decides (dynamic below 0.970); plan[5] holds it */
static void check_sm90_auto_plan(test_run *tr, const char *name) {
  if (!tr_begin(tr, "attention sm90 plan (DYN=auto): %s", name)) return;
  int pl[6] = {0, 0, 0, 0, 0, 0};
  ot_cuda_attn_sm90_last_plan(pl);
  if (pl[5] <= 0 || pl[5] > 1000 || ((pl[4] & 2) != 0) != (pl[5] < 970))
    tr_fail(tr, "balance %d / 1000 with flags %d (dynamic iff below 970)", pl[5], pl[4]);
  tr_end(tr);
}
#endif

/* run_case_grid, then (CUDA builds) check_sm90_plan of the launch it made, with the masks
 * given: nc / bc (0: any), variant bits set / clear, plan flags set / clear */
static void run_case_plan(test_run *tr, const acase *c, DLDataType dt, int nc, int bc,
                          int fl_set, int fl_clear, int flags_set, int flags_clear) {
  run_case_grid(tr, c, dt);
#ifdef OT_TEST_CUDA
  check_sm90_plan(tr, c->name, nc, bc, fl_set, fl_clear, flags_set, flags_clear);
#else
  (void)nc, (void)bc, (void)fl_set, (void)fl_clear, (void)flags_set, (void)flags_clear;
#endif
}

/* run_case on a copy of *c named "cuda hopper-only TAG REST", REST being c's name after
 * that prefix (all of it where it has none): the same case again under another switch. */
static void run_tagged(test_run *tr, const acase *c, const char *tag, DLDataType dt) {
  static const char pre[] = "cuda hopper-only ";
  acase t = *c;
  char name[200];
  const bool has_pre = strncmp(c->name, pre, sizeof pre - 1) == 0;
  snprintf(name, sizeof name, "%s%s %s", pre, tag, c->name + (has_pre ? sizeof pre - 1 : 0));
  t.name = name;
  run_case(tr, &t, dt);
}

/* cuda_sm90_kvrs_cases under OT_ATTN_BWD_SM90_KVRS=value (NULL: unset), named with tag
 * ("": as they are); dtypes 2: bf16 and fp16 each; 0 / 1: one a case, alternating, the
 * first case bf16 (0) or fp16 (1). */
static void run_kvrs_cases(test_run *tr, const char *value, const char *tag, int dtypes) {
  env_saved kv = env_set("OT_ATTN_BWD_SM90_KVRS", value);
  const size_t n = sizeof cuda_sm90_kvrs_cases / sizeof cuda_sm90_kvrs_cases[0];
  for (size_t i = 0; i < n; i++) {
    const acase *c = &cuda_sm90_kvrs_cases[i];
    for (int k = 0; k < (dtypes == 2 ? 2 : 1); k++) {
      const bool f16 = dtypes == 2 ? k == 1 : ((i + (size_t)dtypes) % 2) == 1;
      const DLDataType dt = f16 ? DT_F16 : DT_BF16;
      if (tag[0]) run_tagged(tr, c, tag, dt);
      else run_case(tr, c, dt);
    }
  }
  env_restore(&kv);
}

static void run_sm90_required(test_run *tr) {
  env_saved impl = env_set("OT_ATTN_IMPL", "sm90");
  require_sm90 = true;
  for (size_t i = 0; i < sizeof cuda_sm90_cases / sizeof cuda_sm90_cases[0]; i++)
    run_case(tr, &cuda_sm90_cases[i], i % 2 ? DT_F16 : DT_BF16);
  for (size_t i = 0; i < sizeof cuda_sm90_st16_cases / sizeof cuda_sm90_st16_cases[0]; i++)
    run_case(tr, &cuda_sm90_st16_cases[i], DT_BF16);
  {
    env_saved xdq = env_set("OT_ATTN_BWD_SM90_DQ", "red");
    for (size_t i = 0; i < sizeof cuda_sm90_dqred_cases / sizeof cuda_sm90_dqred_cases[0]; i++)
      run_case(tr, &cuda_sm90_dqred_cases[i], i % 2 ? DT_F16 : DT_BF16);
    env_restore(&xdq);
  }
  {
    env_saved xdq = env_set("OT_ATTN_BWD_SM90_DQ", "stage");
    for (size_t i = 0; i < sizeof cuda_sm90_dqstage_cases / sizeof cuda_sm90_dqstage_cases[0]; i++)
      run_case(tr, &cuda_sm90_dqstage_cases[i], i % 2 ? DT_F16 : DT_BF16);
    env_restore(&xdq);
  }
  /* the default (kXKvRs | kXDqRed | kXDqHalf: dQ split by columns between the consumers,
   * consumer 1's B operand starting mid-atom; both dtypes); =red (dQ over each consumer's own
   * keys, the default before; both dtypes); =1; =0 */
  run_kvrs_cases(tr, NULL, "", 2);
  run_kvrs_cases(tr, "red", "red", 2);
  run_kvrs_cases(tr, "1", "stage", 0);
  run_kvrs_cases(tr, "0", "ss", 1);
  {
    /* kXPers (OT_ATTN_BWD_SM90_PERS; the persistent walk, K / V double-buffered; the D 64
     * default, the static walk on non-causal calls and the atomic one on causal calls, so
     * the kvrs cases above run both): the kvrs shapes (D 64) and the dqred ones (D 128 and
     * 64) on a grid of 3 CTAs with the atomic walk (=3: ~10 units a CTA, so both K / V
     * buffers many times, the ring's and the dS^T buffers' phases across units, split
     * units inside a walk), the same with the static walk (=s3: kXPersSt, CTA i taking
     * units i, i + 3, ...), the atomic walk on one CTA an SM (=1: non-causal D 64 too, and
     * D 128's instance), and one CTA a unit (=0: D 64's default kernel before kXPers); the
     * D 256 shapes under the first two (its single-buffer walk) */
    const size_t nkv = sizeof cuda_sm90_kvrs_cases / sizeof cuda_sm90_kvrs_cases[0];
    const size_t ndq = sizeof cuda_sm90_dqred_cases / sizeof cuda_sm90_dqred_cases[0];
    const size_t nb256 = sizeof cuda_sm90_bwd256_cases / sizeof cuda_sm90_bwd256_cases[0];
    static const char *const grids[4] = {"3", "s3", "1", "0"};
    static const char *const tags[4] = {"pers3", "pers3s", "pers", "nopers"};
    for (int gi = 0; gi < 4; gi++) {
      env_saved ps = env_set("OT_ATTN_BWD_SM90_PERS", grids[gi]);
      for (size_t i = 0; i < nkv; i++)
        for (int k = 0; k < (gi < 2 ? 2 : 1); k++)
          run_tagged(tr, &cuda_sm90_kvrs_cases[i], tags[gi],
                     (gi < 2 ? k == 1 : i % 2 == 1) ? DT_F16 : DT_BF16);
      for (size_t i = 0; i < ndq; i++)
        run_tagged(tr, &cuda_sm90_dqred_cases[i], tags[gi], i % 2 ? DT_F16 : DT_BF16);
      /* D 256 (experiment: one K / V buffer, reloaded once the unit before is done; the
       * 4-byte-store case runs one CTA a unit whatever the switch) */
      if (gi < 2)
        for (size_t i = 0; i < nb256; i++)
          run_tagged(tr, &cuda_sm90_bwd256_cases[i], tags[gi], i % 2 ? DT_F16 : DT_BF16);
      env_restore(&ps);
    }
  }
  {
    /* kXSt16 off: the backward cases of cuda_sm90_cases again (their dtypes) with the
     * 4-byte dK / dV stores; then kXSt16's own cases under the default */
    env_saved st = env_set("OT_ATTN_BWD_SM90_ST16", "0");
    for (size_t i = 0; i < sizeof cuda_sm90_cases / sizeof cuda_sm90_cases[0]; i++)
      if (cuda_sm90_cases[i].bwd)
        run_tagged(tr, &cuda_sm90_cases[i], "bwdst4", i % 2 ? DT_F16 : DT_BF16);
    for (size_t i = 0; i < 3; i++)
      run_tagged(tr, &cuda_sm90_bwd256_cases[i], "bwdst4", i % 2 ? DT_F16 : DT_BF16);
    env_restore(&st);
    for (size_t i = 0; i < sizeof cuda_sm90_bwd_st16_cases / sizeof cuda_sm90_bwd_st16_cases[0]; i++)
      run_case(tr, &cuda_sm90_bwd_st16_cases[i], i % 2 ? DT_F16 : DT_BF16);
  }
  fwd_any_impl = true;
  env_saved p96off = env_set("OT_ATTN_SM90_PAD96", "0");
  for (size_t i = 0; i < sizeof cuda_sm90_bwd96_cases / sizeof cuda_sm90_bwd96_cases[0]; i++) {
    run_case(tr, &cuda_sm90_bwd96_cases[i], DT_BF16);
    run_case(tr, &cuda_sm90_bwd96_cases[i], DT_F16);
  }
  {
    env_saved st = env_set("OT_ATTN_BWD_SM90_ST16", "0");
    for (size_t i = 0; i < 2; i++) run_tagged(tr, &cuda_sm90_bwd96_cases[i], "bwdst4", DT_BF16);
    env_restore(&st);
  }
  env_restore(&p96off);
  fwd_any_impl = false;
  {
    env_saved pd = env_set("OT_ATTN_SM90_PAD96", NULL); /* the default: on */
    env_saved n128 = env_set("OT_ATTN_SM90_N96", "0");   /* P V at N = 128 (kFlN96 below) */
    for (size_t i = 0; i < sizeof cuda_sm90_bwd96_cases / sizeof cuda_sm90_bwd96_cases[0]; i++) {
      run_tagged(tr, &cuda_sm90_bwd96_cases[i], "pad96", DT_BF16);
      run_tagged(tr, &cuda_sm90_bwd96_cases[i], "pad96", DT_F16);
    }
    run_case(tr, &cuda_sm90_pad96_st4_case, DT_BF16);
    run_case(tr, &cuda_sm90_pad96_st4_case, DT_F16);
    /* kFlN96 (the default since 2026-12-03: P V with N = 96 and the 16-byte O stores; in
     * fp16 since the twenty-fifth session), the same cases ("pad96 n96" named) with
     * OT_ATTN_SM90_N96 unset, in both dtypes; the block above (N96=0) keeps the 4-byte
     * R | PD kernel in fp16 (launch_sel drops the stores: no R | ST | PD instance there) */
    env_restore(&n128);
    env_saved n96 = env_set("OT_ATTN_SM90_N96", NULL);
    for (size_t i = 0; i < sizeof cuda_sm90_bwd96_cases / sizeof cuda_sm90_bwd96_cases[0]; i++) {
      run_tagged(tr, &cuda_sm90_bwd96_cases[i], "pad96 n96", DT_BF16);
      run_tagged(tr, &cuda_sm90_bwd96_cases[i], "pad96 n96", DT_F16);
    }
    /* The backward's dK / dV at wgmma N = 96 with consumer 1's dQ at N = 32 (kXN96 |
     * kXDq32) is the D 96 default since 2026-12-03: the bwd96 and pad96 cases above run it
     * (the 4-byte-strides case runs N = 128). Here the other two forms, bf16 and fp16:
     * kXN96 alone ("bwdn96" named, OT_ATTN_BWD_SM90_DQ32=0) and the N = 128 kernel
     * ("bwdn128", OT_ATTN_BWD_SM90_N96=0). */
    env_saved d32 = env_set("OT_ATTN_BWD_SM90_DQ32", "0");
    for (size_t i = 0; i < sizeof cuda_sm90_bwd96_cases / sizeof cuda_sm90_bwd96_cases[0]; i++) {
      run_tagged(tr, &cuda_sm90_bwd96_cases[i], "bwdn96", DT_BF16);
      run_tagged(tr, &cuda_sm90_bwd96_cases[i], "bwdn96", DT_F16);
    }
    env_restore(&d32);
    env_saved bn = env_set("OT_ATTN_BWD_SM90_N96", "0");
    for (size_t i = 0; i < sizeof cuda_sm90_bwd96_cases / sizeof cuda_sm90_bwd96_cases[0]; i++) {
      run_tagged(tr, &cuda_sm90_bwd96_cases[i], "bwdn128", DT_BF16);
      run_tagged(tr, &cuda_sm90_bwd96_cases[i], "bwdn128", DT_F16);
    }
    env_restore(&bn);
    env_restore(&n96);
    env_restore(&pd);
  }
  for (size_t i = 0; i < sizeof cuda_sm90_bwd256_cases / sizeof cuda_sm90_bwd256_cases[0]; i++) {
    run_case(tr, &cuda_sm90_bwd256_cases[i], DT_BF16);
    run_case(tr, &cuda_sm90_bwd256_cases[i], DT_F16);
  }
  for (size_t i = 0; i < sizeof cuda_sm90_round_cases / sizeof cuda_sm90_round_cases[0]; i++)
    run_case(tr, &cuda_sm90_round_cases[i], DT_BF16);
  for (size_t i = 0; i < sizeof cuda_sm90_skip_cases / sizeof cuda_sm90_skip_cases[0]; i++)
    run_case(tr, &cuda_sm90_skip_cases[i], DT_BF16);
  {
    /* OT_ATTN_SM90_ALIGN=end forced on 3 consumers (kFlShift: bf16 D64 with kFlSkip in
     * every build, without it in experiment builds; the start-aligned tiles elsewhere): causal
     * S 1000 (8 query tiles: 2 consumers by default; a first tile of 40 rows, 2 warpgroups
     * before row 0), Sq < Sk and Sq > Sk (rows without keys) under GRID 3, a causal window
     * (no skip by default: the plain kernel in default builds), fp16 (no instance) */
    static const acase sh[] = {
        {"cuda hopper-only shift WG 3 causal S1000 D64 GQA2 B2 fwd", 2, 1000, 1000, 4, 2, 64, 1, -1, -1, 0, 0, 0, {0}, {0}, false, false, false},
        {"cuda hopper-only shift WG 3 GRID 3 causal Sq1000 Sk1500 D64 MQA4 fwd", 1, 1000, 1500, 4, 1, 64, 1, -1, -1, 0, 0, 0, {0}, {0}, false, false, false},
        {"cuda hopper-only shift WG 3 GRID 3 causal Sq1300 Sk1100 D64 GQA2 fwd", 1, 1300, 1100, 4, 2, 64, 1, -1, -1, 0, 0, 0, {0}, {0}, false, false, false},
        {"cuda hopper-only shift WG 3 window 200/0 S1100 D64 GQA2 fwd", 1, 1100, 1100, 4, 2, 64, 0, 200, 0, 0, 0, 0, {0}, {0}, false, false, false},
        {"cuda hopper-only shift WG 3 causal S1000 D64 fp16 fwd", 1, 1000, 1000, 2, 1, 64, 1, -1, -1, 0, 0, 0, {0}, {0}, false, false, false},
    };
    env_saved al = env_set("OT_ATTN_SM90_ALIGN", "end");
    env_saved wg = env_set("OT_ATTN_SM90_WG", "3");
    for (size_t i = 0; i < sizeof sh / sizeof sh[0]; i++)
      run_case_grid(tr, &sh[i], strstr(sh[i].name, "fp16") ? DT_F16 : DT_BF16);
    env_restore(&wg);
    env_restore(&al);
  }
  {
    env_saved wg = env_set("OT_ATTN_SM90_WG", "3");
    acase g3[2] = {cuda_sm90_skip_cases[0], cuda_sm90_skip_cases[1]};
    g3[0].name = "cuda hopper-only skip WG 3 causal Sq1000 Sk1024 D64 GQA4 fwd";
    g3[1].name = "cuda hopper-only skip WG 3 causal Sq>Sk 1300x1100 D64 GQA2 fwd";
    for (int i = 0; i < 2; i++) run_case(tr, &g3[i], DT_BF16);
    env_restore(&wg);
  }
  for (size_t i = 0; i < sizeof cuda_sm90_diag_cases / sizeof cuda_sm90_diag_cases[0]; i++)
    run_case_grid(tr, &cuda_sm90_diag_cases[i], DT_BF16);
  for (size_t i = 0; i < sizeof cuda_sm90_dyn_cases / sizeof cuda_sm90_dyn_cases[0]; i++) {
    const acase *c = &cuda_sm90_dyn_cases[i];
    env_saved gr = env_set("OT_ATTN_SM90_GRID", strstr(c->name, "GRID 3") ? "3" : NULL);
    for (int k = 0; k < (i == 0 ? 2 : 1); k++) {
      env_saved dy = env_set("OT_ATTN_SM90_DYN", "1");   /* at any tile count per CTA */
      run_case(tr, c, k ? DT_F16 : DT_BF16);
      env_restore(&dy);
#ifdef OT_TEST_CUDA
      /* a persistent launch under DYN=1 took the dynamic schedule */
      int pl[6];
      ot_cuda_attn_sm90_last_plan(pl);
      check_sm90_plan(tr, c->name, 0, 0, 0, 0, (pl[4] & 1) ? 2 | 4 : 4, 0);
#endif
      run_dyn_case(tr, c, k ? DT_F16 : DT_BF16);
    }
    env_restore(&gr);
  }
  for (size_t i = 0; i < sizeof cuda_sm90_wg3_cases / sizeof cuda_sm90_wg3_cases[0]; i++) {
    const acase *c = &cuda_sm90_wg3_cases[i];
    run_case_grid(tr, c, i % 2 ? DT_F16 : DT_BF16);
#ifdef OT_TEST_CUDA
    /* 3 consumers from 16 query tiles on; bf16 with kFlSkip (64), fp16 without */
    check_sm90_plan(tr, c->name, 3, 128, i % 2 ? 0 : 64, i % 2 ? 64 : 0, 4, 0);
#endif
  }
#ifdef OT_TEST_CUDA
  {
    /* the consumer rule of D64 causal calls: bf16 on 3 from 9 query tiles with kFlSkip (64)
     * and, where 192 does not divide Sq, kFlShift (0x4000); 8 tiles on 2 (kFlDiag, 128);
     * fp16 on 2 up to 15 tiles, on 3 from 16 without either; a left window on 2 with kFlPin
     * (0x8000); OT_ATTN_SM90_ALIGN=start and OT_ATTN_SM90_SKIP=0 drop the shift. Then the
     * balance gate (the default, and =auto) under GRID 2 (54 tiles of 3 consumers: past the
     * count gate's 32), and =count, which leaves it off */
    static const struct {
      acase c;
      bool f16;
      int nc, fl_set, fl_clear;
      const char *env, *val;
    } pc[] = {
        {{"cuda hopper-only plan causal S1024 D64 MQA2 (8 query tiles) fwd", 1, 1024, 1024, 2, 1, 64, 1, -1, -1, 0, 0, 0, {0}, {0}, false, false, false}, false, 2, 128, 0x4000 | 64, NULL, NULL},
        {{"cuda hopper-only plan causal S1100 D64 GQA2 (9 query tiles) fwd", 1, 1100, 1100, 4, 2, 64, 1, -1, -1, 0, 0, 0, {0}, {0}, false, false, false}, false, 3, 64 | 0x4000, 0, NULL, NULL},
        {{"cuda hopper-only plan causal S1100 D64 GQA2 (9 query tiles) fp16 fwd", 1, 1100, 1100, 4, 2, 64, 1, -1, -1, 0, 0, 0, {0}, {0}, false, false, false}, true, 2, 0, 0x4000 | 64, NULL, NULL},
        {{"cuda hopper-only plan causal S1920 D64 MQA2 (15 query tiles, 10 x 192) fwd", 1, 1920, 1920, 2, 1, 64, 1, -1, -1, 0, 0, 0, {0}, {0}, false, false, false}, false, 3, 64, 0x4000, NULL, NULL},
        {{"cuda hopper-only plan causal Sq1300 Sk1500 D64 GQA2 (11 query tiles) fwd", 2, 1300, 1500, 4, 2, 64, 1, -1, -1, 0, 0, 0, {0}, {0}, false, false, false}, false, 3, 64 | 0x4000, 0, NULL, NULL},
        {{"cuda hopper-only plan window 200/0 S1500 D64 GQA2 (12 query tiles) fwd", 1, 1500, 1500, 4, 2, 64, 0, 200, 0, 0, 0, 0, {0}, {0}, false, false, false}, false, 2, 0x8000, 0x4000 | 64, NULL, NULL},
        {{"cuda hopper-only plan align=start causal S1100 D64 GQA2 fwd", 1, 1100, 1100, 4, 2, 64, 1, -1, -1, 0, 0, 0, {0}, {0}, false, false, false}, false, 3, 64, 0x4000, "OT_ATTN_SM90_ALIGN", "start"},
        {{"cuda hopper-only plan causal S2048 D64 MQA2 (16 query tiles) fwd", 1, 2048, 2048, 2, 1, 64, 1, -1, -1, 0, 0, 0, {0}, {0}, false, false, false}, false, 3, 64 | 0x4000, 0, NULL, NULL},
        {{"cuda hopper-only plan causal S1930 D64 GQA2 (16 query tiles) fp16 fwd", 1, 1930, 1930, 4, 2, 64, 1, -1, -1, 0, 0, 0, {0}, {0}, false, false, false}, true, 3, 0, 64 | 0x4000, NULL, NULL},
        {{"cuda hopper-only plan skip=0 causal S2048 D64 MQA2 fwd", 1, 2048, 2048, 2, 1, 64, 1, -1, -1, 0, 0, 0, {0}, {0}, false, false, false}, false, 3, 0, 64 | 0x4000, "OT_ATTN_SM90_SKIP", "0"},
    };
    for (size_t i = 0; i < sizeof pc / sizeof pc[0]; i++) {
      env_saved e = env_set(pc[i].env ? pc[i].env : "OT_ATTN_SM90_ALIGN", pc[i].env ? pc[i].val : NULL);
      run_case(tr, &pc[i].c, pc[i].f16 ? DT_F16 : DT_BF16);
      check_sm90_plan(tr, pc[i].c.name, pc[i].nc, 128, pc[i].fl_set, pc[i].fl_clear, 4, 0);
      env_restore(&e);
    }
    static const acase ca = {"cuda hopper-only dynauto GRID 2 causal S5120 D64 GQA2 fwd", 1, 5120, 5120, 2, 1, 64, 1, -1, -1, 0, 0, 0, {0}, {0}, false, false, false};
    env_saved gr = env_set("OT_ATTN_SM90_GRID", "2");
    run_case(tr, &ca, DT_BF16);
    check_sm90_plan(tr, ca.name, 3, 128, 0, 0, 1 | 4, 0);
    check_sm90_auto_plan(tr, ca.name);
    {
      env_saved dy = env_set("OT_ATTN_SM90_DYN", "auto");
      static const acase cb = {"cuda hopper-only dynauto=auto GRID 2 causal S5120 D64 GQA2 fwd", 1, 5120, 5120, 2, 1, 64, 1, -1, -1, 0, 0, 0, {0}, {0}, false, false, false};
      run_case(tr, &cb, DT_F16);
      check_sm90_auto_plan(tr, cb.name);
      env_restore(&dy);
    }
    {
      env_saved dy = env_set("OT_ATTN_SM90_DYN", "count");
      static const acase cc = {"cuda hopper-only dynauto=count GRID 2 causal S5120 D64 GQA2 fwd", 1, 5120, 5120, 2, 1, 64, 1, -1, -1, 0, 0, 0, {0}, {0}, false, false, false};
      run_case(tr, &cc, DT_BF16);
      check_sm90_plan(tr, cc.name, 3, 128, 0, 0, 1 | 4, 2);   /* static: past the count gate */
      int pl[6];
      ot_cuda_attn_sm90_last_plan(pl);
      if (tr_begin(tr, "attention sm90 plan (DYN=count): no balance computed")) {
        if (pl[5] != 0) tr_fail(tr, "balance %d / 1000 (expected 0: the gate is off)", pl[5]);
        tr_end(tr);
      }
      env_restore(&dy);
    }
    env_restore(&gr);
  }
#endif
  {
    env_saved gr = env_set("OT_ATTN_SM90_GRID", "3");
    for (size_t i = 0; i < sizeof cuda_sm90_persist_cases / sizeof cuda_sm90_persist_cases[0]; i++)
      run_case(tr, &cuda_sm90_persist_cases[i], DT_BF16);
    env_restore(&gr);
  }
  {
    /* the pin shapes under OT_ATTN_SM90_PIN=1, then the unmasked ones under =0 (see there) */
    static const char *const PLAIN[] = {
        "cuda hopper-only pin=0 Sq256 Sk4096 D128 GQA2 (narrow step, 23 steps) fwd",
        "cuda hopper-only pin=0 GRID 3 Sq300 Sk6528 D128 B2 (37 steps) fwd", NULL,
        "cuda hopper-only pin=0 Sq300 Sk2000 D64 MQA4 B2 (3 consumers) fwd",
        "cuda hopper-only pin=0 causal S1500 D64 GQA2 B2 (12 query tiles) fwd",
        "cuda hopper-only pin=0 window 256,64 S2000 D64 GQA4 fwd"};
    for (int k = 0; k < 2; k++) {
      env_saved pin = env_set("OT_ATTN_SM90_PIN", k ? "0" : "1");
      for (size_t i = 0; i < sizeof cuda_sm90_pin_cases / sizeof cuda_sm90_pin_cases[0]; i++) {
        acase c = cuda_sm90_pin_cases[i];
        if (k && !(c.name = PLAIN[i])) continue;
        /* the two unmasked D128 shapes on the 176-key tile (kFlPin's and kFlNarrow's), which
         * only OT_ATTN_SM90_TILE=wide reaches since the twenty-seventh session */
        env_saved tw = env_set("OT_ATTN_SM90_TILE", i < 2 ? "wide" : NULL);
        run_case_grid(tr, &c, DT_BF16);
        env_restore(&tw);
      }
      env_restore(&pin);
    }
  }
  {
    /* kFlKsplit (0x200000, with kFlPin 0x8000; bf16 D64 unmasked calls on 3 consumers whose
     * last query tile of a head holds at most 64 rows; the default, OT_ATTN_SM90_KSPLIT unset): that tile on all three
     * consumers, each over every third key tile of the same 64 rows, merged in shared memory
     * by consumer 0, the heads' tiles rotated by round. S 1k (6 tiles, the last of 64 rows),
     * Sq < Sk with 40 rows left, Sq 17 over 33 key tiles (the last of one key: the mask),
     * consumers 1 and 2 without a key tile (Sk 1) or consumer 2 alone without (Sk 256: two),
     * and persistent CTAs that take several such tiles (the merge buffer's reuse, GRID 3)
     * and tiles rotated across rounds (GRID 5, 8 heads of 6 tiles); then the switch off
     * (the plain kernel) and fp16 (no instance) on the first shape */
    static const acase ks[] = {
        {"cuda hopper-only ksplit S1024 D64 B2 (6 query tiles, the last of 64 rows) fwd", 2, 1024, 1024, 4, 4, 64, 0, -1, -1, 0, 0, 0, {0}, {0}, false, false, false},
        {"cuda hopper-only ksplit Sq1000 Sk1024 D64 GQA4 (40 rows left) fwd", 1, 1000, 1024, 8, 2, 64, 0, -1, -1, 0, 0, 0, {0}, {0}, false, false, false},
        {"cuda hopper-only ksplit Sq17 Sk4097 D64 MQA2 (33 key tiles) fwd", 1, 17, 4097, 2, 1, 64, 0, -1, -1, 0, 0, 0, {0}, {0}, false, false, false},
        {"cuda hopper-only ksplit Sq64 Sk1 D64 B3 (consumers 1, 2 without keys) fwd", 3, 64, 1, 2, 2, 64, 0, -1, -1, 0, 0, 0, {0}, {0}, false, false, false},
        {"cuda hopper-only ksplit Sq1 Sk256 D64 (consumer 2 without keys) scale 2 fwd", 1, 1, 256, 4, 4, 64, 0, -1, -1, 0, 2.0f, 0, {0}, {0}, false, false, false},
        {"cuda hopper-only ksplit GRID 3 Sq200 Sk700 D64 GQA2 B2 (merge buffer reused) fwd", 2, 200, 700, 4, 2, 64, 0, -1, -1, 0, 0, 0, {0}, {0}, false, false, false},
        {"cuda hopper-only ksplit GRID 5 S1024 D64 H8 (tiles rotated by round) fwd", 1, 1024, 1024, 8, 8, 64, 0, -1, -1, 0, 0, 0, {0}, {0}, false, false, false},
    };
    env_saved on = env_set("OT_ATTN_SM90_KSPLIT", NULL);   /* the default: on for bf16 D64 */
    for (size_t i = 0; i < sizeof ks / sizeof ks[0]; i++)
      run_case_plan(tr, &ks[i], DT_BF16, 3, 128, 0x200000 | 0x8000, 0, 0, 0);
    env_saved off = env_set("OT_ATTN_SM90_KSPLIT", "0");
    acase k0 = ks[0];
    k0.name = "cuda hopper-only ksplit=0 S1024 D64 B2 (the plain kernel) fwd";
    run_case_plan(tr, &k0, DT_BF16, 3, 128, 0x8000, 0x200000, 0, 0);
    env_restore(&off);
    acase kh = ks[0];
    kh.name = "cuda hopper-only ksplit S1024 D64 B2 fp16 (no instance) fwd";
    run_case_plan(tr, &kh, DT_F16, 3, 128, 0, 0x200000, 0, 0);
    env_restore(&on);
  }
  {
    /* kFlSplit (0x8; OT_ATTN_SM90_SPLIT=1, bf16 D256 and D128's 128-key tile, unmasked
     * persistent calls whose tiles leave a partial last round): the last round's tiles cut
     * into equal shares of every CTA's key tiles, the pieces of a tile merged in the kernel
     * by the one that finishes it last, through counters that each launch leaves at zero (so
     * every case after the first also checks the previous one's reset). Shares that cross a
     * tile boundary (GRID 10: 64 tiles, 4 left, 13 key tiles each over 10 CTAs, 6 a CTA;
     * GRID 7 at D128: 6 left of 8 key tiles, 7 a CTA), Sq < Sk with a partial key tile and
     * MQA (GRID 5), one key tile a tile (GRID 20: whole tiles as pieces, 12 CTAs without
     * one), the whole chip at D256 (192 tiles), shares of sqrt(n_it / 2) key tiles (GRID 43:
     * one tile left of 32 key tiles, 8 pieces of 4 merged by the last), then the switch off
     * (no bit) and fp16 (no instance: the plain kernel) */
    static const acase sp[] = {
        {"cuda hopper-only split GRID 10 S1000 D256 GQA2 B2 (shares across tiles) fwd", 2, 1000, 1000, 4, 2, 256, 0, -1, -1, 0, 0, 0, {0}, {0}, false, false, false},
        {"cuda hopper-only split GRID 7 S1000 D128 H3 B2 (128-key tile) fwd", 2, 1000, 1000, 3, 3, 128, 0, -1, -1, 0, 0, 0, {0}, {0}, false, false, false},
        {"cuda hopper-only split GRID 5 Sq300 Sk1111 D256 MQA4 (partial key tile) scale 0.5 fwd", 1, 300, 1111, 4, 1, 256, 0, -1, -1, 0, 0.5f, 0, {0}, {0}, false, false, false},
        {"cuda hopper-only split GRID 20 Sq200 Sk100 D128 GQA4 B3 (one key tile a tile) fwd", 3, 200, 100, 8, 2, 128, 0, -1, -1, 0, 0, 0, {0}, {0}, false, false, false},
        {"cuda hopper-only split S1024 D256 H8 B3 (192 tiles on every SM) fwd", 3, 1024, 1024, 8, 8, 256, 0, -1, -1, 0, 0, 0, {0}, {0}, false, false, false},
        {"cuda hopper-only split GRID 43 Sq129 Sk4096 D128 H2 B11 (8 pieces a tile) fwd", 11, 129, 4096, 2, 2, 128, 0, -1, -1, 0, 0, 0, {0}, {0}, false, false, false},
    };
    env_saved on = env_set("OT_ATTN_SM90_SPLIT", "1");
    for (size_t i = 0; i < sizeof sp / sizeof sp[0]; i++)
      run_case_plan(tr, &sp[i], DT_BF16, 2, 0, 0x8, 0, 1 | 8, 0);
    env_saved off = env_set("OT_ATTN_SM90_SPLIT", "0");
    acase s0 = sp[0];
    s0.name = "cuda hopper-only split=0 GRID 10 S1000 D256 GQA2 B2 (the plain kernel) fwd";
    run_case_plan(tr, &s0, DT_BF16, 2, 0, 0, 0x8, 1, 8);
    env_restore(&off);
    acase sh = sp[0];
    sh.name = "cuda hopper-only split GRID 10 S1000 D256 GQA2 B2 fp16 (no instance) fwd";
    run_case_plan(tr, &sh, DT_F16, 2, 0, 0, 0x8, 1, 8);
    env_restore(&on);
  }
  {
    /* kFlQpf (0x400000; OT_ATTN_SM90_QPF=1, bf16 D256 unmasked persistent calls): the
     * producer prefetches the CTA's next tile's Q to L2 during the current one (a hint: the
     * output is the plain kernel's). Several tiles a CTA with the last one's "next" past the
     * tiles (GRID 5: 64 tiles), Sq < Sk with a partial key tile, the whole chip; then a
     * causal call (masked: no bit) and fp16 (no instance) */
    static const acase qp[] = {
        {"cuda hopper-only qpf GRID 5 S1000 D256 GQA2 B2 (next tile's Q prefetched) fwd", 2, 1000, 1000, 4, 2, 256, 0, -1, -1, 0, 0, 0, {0}, {0}, false, false, false},
        {"cuda hopper-only qpf GRID 3 Sq300 Sk1111 D256 MQA4 (partial key tile) fwd", 1, 300, 1111, 4, 1, 256, 0, -1, -1, 0, 0, 0, {0}, {0}, false, false, false},
        {"cuda hopper-only qpf S1024 D256 H8 B3 (192 tiles on every SM) fwd", 3, 1024, 1024, 8, 8, 256, 0, -1, -1, 0, 0, 0, {0}, {0}, false, false, false},
    };
    env_saved on = env_set("OT_ATTN_SM90_QPF", "1");
    for (size_t i = 0; i < sizeof qp / sizeof qp[0]; i++)
      run_case_plan(tr, &qp[i], DT_BF16, 2, 0, 0x400000, 0, 1, 0);
    acase qc = qp[0];
    qc.name = "cuda hopper-only qpf GRID 5 S1000 D256 GQA2 B2 causal (masked: no bit) fwd";
    qc.causal = true;
    run_case_plan(tr, &qc, DT_BF16, 2, 0, 0, 0x400000, 1, 0);
    acase qh = qp[0];
    qh.name = "cuda hopper-only qpf GRID 5 S1000 D256 GQA2 B2 fp16 (no instance) fwd";
    run_case_plan(tr, &qh, DT_F16, 2, 0, 0, 0x400000, 1, 0);
    env_restore(&on);
  }
#ifdef OT_TEST_CUDA
  {
    /* unmasked D128 past Sk 2048: the 128-key tile by default since the twenty-seventh
     * session (steady-state A/B: 1.039x / 1.055x / 1.013x the 176-key tile at Sk 4k / 8k /
     * 16k, bench/results/attention_fwd_tile128.json); the 176-key tile under =wide */
    static const acase c = {"cuda hopper-only plan Sq200 Sk4100 D128 GQA2 (128-key tile) fwd", 1, 200, 4100, 4, 2, 128, 0, -1, -1, 0, 0, 0, {0}, {0}, false, false, false};
    run_case(tr, &c, DT_BF16);
    check_sm90_plan(tr, c.name, 2, 128, 0, 0, 0, 4);
    env_saved tw = env_set("OT_ATTN_SM90_TILE", "wide");
    acase w = c;
    w.name = "cuda hopper-only plan wide Sq200 Sk4100 D128 GQA2 (176-key tile) fwd";
    run_case(tr, &w, DT_BF16);
    check_sm90_plan(tr, w.name, 2, 176, 0, 0, 0, 4);
    env_restore(&tw);
  }
#endif
  env_saved tile = env_set("OT_ATTN_SM90_TILE", "wide");
  for (size_t i = 0; i < sizeof cuda_sm90_wide_cases / sizeof cuda_sm90_wide_cases[0]; i++)
    run_case(tr, &cuda_sm90_wide_cases[i], DT_BF16);
  env_saved grid = env_set("OT_ATTN_SM90_GRID", "3");
  acase g = cuda_sm90_wide_cases[2];
  g.name = "cuda hopper-only wide GRID 3 Sq200 Sk529 D128 GQA2 B2 (rem 1) fwd";
  run_case(tr, &g, DT_BF16);
  env_restore(&grid);
  env_restore(&tile);
  require_sm90 = false;
  run_sm90_refusal_case(tr);
  env_restore(&impl);
}

static void run(test_run *tr) {
  if (tr->grad) {
    for (size_t i = 0; i < sizeof grad_cases / sizeof grad_cases[0]; i++)
      run_grad_case(tr, &grad_cases[i]);
    return;
  }
  for (size_t i = 0; i < sizeof fwd_cases / sizeof fwd_cases[0]; i++)
    for (int d = 0; d < 3; d++) run_case(tr, &fwd_cases[i], *all_dtypes[d]);
  run_repeat_case(tr);
#ifdef OT_TEST_CUDA
  if (!tr->be->is_cuda) run_sm90_balance_model(tr);   /* host only */
  if (!tr->be->is_cuda) run_sm90_split_shares(tr);    /* host only */
#endif
  if (tr->be->is_cuda) {
    for (size_t i = 0; i < sizeof cuda_cases / sizeof cuda_cases[0]; i++)
      run_case(tr, &cuda_cases[i], i % 2 ? DT_F16 : DT_BF16);
    for (size_t i = 0; i < sizeof cuda_det_cases / sizeof cuda_det_cases[0]; i++)
      run_case_det(tr, &cuda_det_cases[i], i % 2 ? DT_F16 : DT_BF16, true);
    static const acase rep[] = {
        {"split-KV", 1, 3, 2000, 8, 2, 128, 1, -1, -1, 0, 0, 0, {0}, {0}, false, false, true},
        {"unsplit", 4, 300, 300, 16, 4, 64, 1, -1, -1, 0, 0, 0, {0}, {0}, false, false, true},
    };
    for (int i = 0; i < 2; i++) run_repeat_case_cuda(tr, &rep[i]);
    run_scratch_fallback_case(tr);
    run_sm90_required(tr);
  }
  for (int k = 0; k < BAD_COUNT; k++)
    for (int which = 0; which < 2; which++) run_bad_case(tr, (bad_kind)k, which);
  run_bad_bwd_extra(tr);
}

const test_suite suite_attention = {"attention", run};
