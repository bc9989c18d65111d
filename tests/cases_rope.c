/*
 * cases_rope.c -- ot_rope_forward / ot_rope_backward against a float64 reference.
 *
 * Every q / k / output tensor of a case is a slice of heads [h0, h0 + nh) of a
 * contiguous buffer [lead..., htot, D] (lead = [T] or [B, S]): its own buffer
 * (htot = nh) or, for the packed cases, one qkv buffer [lead..., Hq + 2Hk, D] whose
 * q and k slices have strided token dimensions and interleaved byte ranges.
 *
 * Tolerance: tol_for(dtype, 1) everywhere. Each output element is one rotation
 * x1 c - x2 s (two products and a sum in float32) rounded once to the storage dtype,
 * so the error is the storage rounding (half an ulp) plus a few float32 ulps; k = 1
 * leaves a margin of about 10x for float32 and 4x for float16 / bfloat16.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"

/* ---- float64 reference ----------------------------------------------------------- */

/* inv_freq[i] = 1 / theta^(2i/rd), with Meta's Llama 3.1 scaling when enabled. */
static void ref_inv_freq(const ot_rope_params *p, int64_t rd, double *f) {
  for (int64_t i = 0; i < rd / 2; i++) {
    double freq = 1.0 / pow((double)p->theta, (double)(2 * i) / (double)rd);
    if (p->llama3_factor > 0) {
      double factor = p->llama3_factor, low = p->llama3_low_freq_factor;
      double high = p->llama3_high_freq_factor, orig = p->llama3_original_max_position;
      double wavelen = 2 * 3.14159265358979323846 / freq;
      if (wavelen < orig / high) {
        /* high frequency: kept */
      } else if (wavelen > orig / low) {
        freq /= factor;
      } else {
        double smooth = (orig / wavelen - low) / (high - low);
        freq = (1 - smooth) * freq / factor + smooth * freq;
      }
    }
    f[i] = freq;
  }
}

/* cs: [tokens, rd] per token, rd/2 cosines then rd/2 sines (the layout of the cache).
 * sign -1 rotates by the opposite angle (the backward). x, y: [tokens, nh, D]. */
static void ref_rope(ot_rope_mode mode, int64_t tokens, int64_t nh, int64_t D, int64_t rd,
                     const double *cs, double sign, const double *x, double *y) {
  int64_t half = rd / 2;
  for (int64_t t = 0; t < tokens; t++)
    for (int64_t h = 0; h < nh; h++) {
      const double *xr = x + (t * nh + h) * D;
      double *yr = y + (t * nh + h) * D;
      for (int64_t d = 0; d < D; d++) yr[d] = xr[d];
      for (int64_t i = 0; i < half; i++) {
        int64_t a = mode == OT_ROPE_NEOX ? i : 2 * i;
        int64_t b = mode == OT_ROPE_NEOX ? i + half : 2 * i + 1;
        double c = cs[t * rd + i], s = sign * cs[t * rd + half + i];
        yr[a] = xr[a] * c - xr[b] * s;
        yr[b] = xr[b] * c + xr[a] * s;
      }
    }
}

/* ---- slices of head buffers ------------------------------------------------------- */

typedef struct slice {
  tbuf *buf; /* [lead..., htot, D], contiguous */
  int nlead;
  int64_t h0, nh;
  DLTensor t;
  int64_t shape[4];
} slice;

static void slice_init(slice *s, tbuf *buf, int nlead, int64_t h0, int64_t nh) {
  memset(s, 0, sizeof *s);
  s->buf = buf;
  s->nlead = nlead;
  s->h0 = h0;
  s->nh = nh;
  s->t = buf->t;
  for (int i = 0; i < buf->t.ndim; i++) s->shape[i] = buf->shape[i];
  s->shape[nlead] = nh;
  s->t.shape = s->shape;
  s->t.byte_offset = (uint64_t)(h0 * buf->strides[nlead]) * dt_size(buf->t.dtype);
}

static const DLTensor *slice_dl(slice *s) {
  tb_dl(s->buf);
  s->t.data = s->buf->t.data;
  return &s->t;
}

/* Logical element index in the buffer of (token t, head h, feature d) of the slice. */
static int64_t slice_index(const slice *s, int64_t t, int64_t h, int64_t d) {
  int64_t htot = s->buf->shape[s->nlead], D = s->buf->shape[s->nlead + 1];
  return (t * htot + s->h0 + h) * D + d;
}

/* malloc'd [tokens, nh, D] float64 copy. */
static double *slice_get(const slice *s, int64_t tokens) {
  int64_t D = s->buf->shape[s->nlead + 1];
  int64_t n = tokens * s->nh * D;
  double *o = (double *)malloc((size_t)(n ? n : 1) * sizeof *o);
  for (int64_t t = 0; t < tokens; t++)
    for (int64_t h = 0; h < s->nh; h++)
      for (int64_t d = 0; d < D; d++) o[(t * s->nh + h) * D + d] = tb_get(s->buf, slice_index(s, t, h, d));
  return o;
}

/* ---- cases ------------------------------------------------------------------------- */

typedef struct rope_case {
  const char *name;
  ot_rope_mode mode;
  int batch;      /* 0: q is [T, H, D]; else [batch, seq, H, D] */
  int seq;        /* T, or seq */
  int hq, hk;     /* hk 0: k is NULL */
  int d, rd;      /* rd 0: the whole head */
  int pos_i32;    /* positions int32 (else int64) */
  int64_t max_pos;/* positions drawn from [0, max_pos); the cache has max_pos rows */
  int cache;      /* pass a cos_sin_cache (then theta / scaling are set invalid: ignored) */
  int llama3;     /* theta 500000 with Llama-3 scaling 8 / 1 / 4 / 8192 */
  int inplace;
  int packed;     /* q, k, v sliced from one [lead, hq + 2 hk, D] buffer */
  int pos_strided;/* positions with element stride 3 */
} rope_case;

static const rope_case cases[] = {
    /* name                                      mode         B  S/T hq hk  D    rd i32 max    ca l3 ip pk ps */
    {"neox full gqa 8/2 T=37 D=128",             OT_ROPE_NEOX, 0, 37, 8, 2, 128, 0, 0, 65536, 0, 0, 0, 0, 0},
    {"gptj full gqa 8/2 T=37 D=128",             OT_ROPE_GPTJ, 0, 37, 8, 2, 128, 0, 0, 65536, 0, 0, 0, 0, 0},
    {"neox partial D=128 rd=64 in place i32",    OT_ROPE_NEOX, 0, 37, 8, 2, 128, 64, 1, 65536, 0, 0, 1, 0, 0},
    {"gptj partial D=80 rd=32",                  OT_ROPE_GPTJ, 0, 37, 4, 4, 80, 32, 0, 65536, 0, 0, 0, 0, 0},
    {"neox D=80 rd=32 in place",                 OT_ROPE_NEOX, 0, 23, 3, 1, 80, 32, 0, 65536, 0, 0, 1, 0, 0},
    {"neox D=2 rd=2 T=1 1/1",                    OT_ROPE_NEOX, 0, 1, 1, 1, 2, 2, 1, 65536, 0, 0, 0, 0, 0},
    {"gptj D=2 T=37 1/1 in place",               OT_ROPE_GPTJ, 0, 37, 1, 1, 2, 0, 0, 65536, 0, 0, 1, 0, 0},
    {"neox q only bshd 2x19 D=64",               OT_ROPE_NEOX, 2, 19, 3, 0, 64, 0, 0, 65536, 0, 0, 0, 0, 0},
    {"gptj q only D=6 rd=4 in place",            OT_ROPE_GPTJ, 0, 5, 2, 0, 6, 4, 1, 100, 0, 0, 1, 0, 0},
    {"neox cache D=96 rd=64 in place",           OT_ROPE_NEOX, 0, 37, 4, 2, 96, 64, 1, 4096, 1, 0, 1, 0, 0},
    {"gptj cache bshd 3x7",                      OT_ROPE_GPTJ, 3, 7, 2, 1, 64, 0, 0, 300, 1, 0, 0, 0, 0},
    {"neox cache T=1 max_pos 1",                 OT_ROPE_NEOX, 0, 1, 2, 2, 16, 0, 0, 1, 1, 0, 0, 0, 0},
    {"neox llama3 D=128",                        OT_ROPE_NEOX, 0, 37, 8, 2, 128, 0, 0, 65536, 0, 1, 0, 0, 0},
    {"gptj llama3 D=128 rd=96 in place i32",     OT_ROPE_GPTJ, 0, 19, 2, 1, 128, 96, 1, 131072, 0, 1, 1, 0, 0},
    {"neox packed qkv in place T=37 8/2 D=64",   OT_ROPE_NEOX, 0, 37, 8, 2, 64, 0, 0, 65536, 0, 0, 1, 1, 0},
    {"gptj packed qkv in place bshd 2x9 D=40 rd=24", OT_ROPE_GPTJ, 2, 9, 4, 2, 40, 24, 1, 65536, 0, 0, 1, 1, 0},
    {"neox packed qkv out of place T=13 D=72 rd=40", OT_ROPE_NEOX, 0, 13, 3, 1, 72, 40, 0, 65536, 0, 0, 0, 1, 0},
    {"neox packed qkv cache in place T=11",      OT_ROPE_NEOX, 0, 11, 4, 1, 32, 0, 0, 512, 1, 0, 1, 1, 0},
    {"neox T=257 5/3 D=72 rd=40 strided positions", OT_ROPE_NEOX, 0, 257, 5, 3, 72, 40, 0, 65536, 0, 0, 0, 0, 1},
    {"gptj T=100 D=34 strided positions i32",    OT_ROPE_GPTJ, 0, 100, 3, 1, 34, 0, 1, 65536, 0, 0, 1, 0, 1},
    {"neox positions up to 2^21",                OT_ROPE_NEOX, 0, 37, 2, 1, 128, 0, 0, 2097152, 0, 0, 0, 0, 0},
    /* 48 heads of D=128 (12 passes of 4 heads): two batches of the warp kernel's passes */
    {"neox gqa 40/8 T=9 D=128 cache",            OT_ROPE_NEOX, 0, 9, 40, 8, 128, 0, 0, 4096, 1, 0, 0, 0, 0},
    {"gptj gqa 40/8 T=9 D=128 in place",         OT_ROPE_GPTJ, 0, 9, 40, 8, 128, 0, 0, 65536, 0, 0, 1, 0, 0},
    /* the warp kernel's other widths: 96 heads at 8 a pass in 16-bit types (12 passes, two
     * batches; float32: 24, three) with strided positions; GPT-J at 4 items a head (rd 32,
     * 16-bit types) from a cache; D=256 NeoX from a cache (16 items a head in 16-bit types:
     * 4 cos / sin a lane loaded ahead) */
    {"neox gqa 88/8 T=5 D=64 strided positions i32", OT_ROPE_NEOX, 0, 5, 88, 8, 64, 0, 1, 65536, 0, 0, 0, 0, 1},
    {"gptj 6/2 T=33 D=32 cache",                 OT_ROPE_GPTJ, 0, 33, 6, 2, 32, 0, 0, 4096, 1, 0, 0, 0, 0},
    {"neox gqa 12/4 bshd 2x5 D=256 cache",       OT_ROPE_NEOX, 2, 5, 12, 4, 256, 0, 0, 4096, 1, 0, 0, 0, 0},
    {"neox empty T=0",                           OT_ROPE_NEOX, 0, 0, 2, 1, 8, 0, 0, 10, 0, 0, 0, 0, 0},
    {"gptj empty heads",                         OT_ROPE_GPTJ, 0, 4, 0, 0, 8, 0, 0, 10, 0, 0, 0, 0, 0},
};

/* Small shapes for the finite-difference checks of the backward (float32). */
static const rope_case grad_cases[] = {
    {"neox gqa 2/1 D=8",                         OT_ROPE_NEOX, 0, 3, 2, 1, 8, 0, 0, 65536, 0, 0, 0, 0, 0},
    {"gptj gqa 2/1 D=8",                         OT_ROPE_GPTJ, 0, 3, 2, 1, 8, 0, 1, 65536, 0, 0, 0, 0, 0},
    {"neox partial D=10 rd=4 in place",          OT_ROPE_NEOX, 0, 2, 1, 2, 10, 4, 0, 1000, 0, 0, 1, 0, 0},
    {"gptj partial D=6 rd=2 bshd 2x2",           OT_ROPE_GPTJ, 2, 2, 2, 1, 6, 2, 0, 1000, 0, 0, 0, 0, 0},
    {"neox cache D=8",                           OT_ROPE_NEOX, 0, 3, 1, 1, 8, 0, 1, 50, 1, 0, 0, 0, 0},
    {"gptj llama3 D=16",                         OT_ROPE_GPTJ, 0, 2, 1, 1, 16, 0, 0, 65536, 0, 1, 0, 0, 0},
    {"neox packed in place D=8",                 OT_ROPE_NEOX, 0, 3, 2, 1, 8, 0, 0, 65536, 0, 0, 1, 1, 0},
    {"neox q only D=4",                          OT_ROPE_NEOX, 0, 4, 2, 0, 4, 0, 0, 65536, 0, 0, 0, 0, 0},
};

static ot_rope_params case_params(const rope_case *c) {
  ot_rope_params p = ot_rope_default_params();
  p.mode = c->mode;
  p.rotary_dim = c->rd;
  if (c->llama3) {
    p.theta = 500000.0f;
    p.llama3_factor = 8.0f;
    p.llama3_low_freq_factor = 1.0f;
    p.llama3_high_freq_factor = 4.0f;
    p.llama3_original_max_position = 8192;
  }
  return p;
}

/* The float64 forward of q and k, for the finite differences: in = [q | k]. */
typedef struct fd_state {
  const rope_case *c;
  int64_t tokens, rd;
  const double *cs;
} fd_state;

static void fd_forward(void *state, const double *in, double *out) {
  const fd_state *st = (const fd_state *)state;
  const rope_case *c = st->c;
  int64_t nq = st->tokens * c->hq * c->d;
  ref_rope(c->mode, st->tokens, c->hq, c->d, st->rd, st->cs, 1.0, in, out);
  if (c->hk) ref_rope(c->mode, st->tokens, c->hk, c->d, st->rd, st->cs, 1.0, in + nq, out + nq);
}

static void run_case(test_run *tr, const rope_case *c, DLDataType dt, bool backward) {
  if (!tr_begin(tr, "%s %s %s", backward ? "backward" : "forward", c->name, dt_name(dt))) return;
  rng r = tr_rng(tr);
  const int nlead = c->batch ? 2 : 1;
  const int64_t lead[2] = {c->batch ? c->batch : c->seq, c->seq};
  const int64_t tokens = (c->batch ? c->batch : 1) * (int64_t)c->seq;
  const int64_t D = c->d, rd = c->rd ? c->rd : c->d, half = rd / 2;
  const DLDataType pos_dt = c->pos_i32 ? DT_I32 : DT_I64;

  /* buffers: in (q or qkv), kin, out (q_out or packed outputs), kout */
  tbuf *bufs[4] = {NULL, NULL, NULL, NULL};
  slice q, k, q_out, k_out;
  int64_t shape[4];
  for (int i = 0; i < nlead; i++) shape[i] = lead[i];
  shape[nlead + 1] = D;
  if (c->packed) {
    shape[nlead] = c->hq + 2 * c->hk;
    bufs[0] = tb_new(tr->be, dt, nlead + 2, shape);
    tb_fill_uniform(bufs[0], &r, -2, 2);
    slice_init(&q, bufs[0], nlead, 0, c->hq);
    slice_init(&k, bufs[0], nlead, c->hq, c->hk);
    if (c->inplace) {
      q_out = q;
      k_out = k;
    } else {
      /* outputs packed too, with one head of gap between q_out and k_out */
      shape[nlead] = c->hq + c->hk + 1;
      bufs[2] = tb_new(tr->be, dt, nlead + 2, shape);
      slice_init(&q_out, bufs[2], nlead, 0, c->hq);
      slice_init(&k_out, bufs[2], nlead, c->hq + 1, c->hk);
    }
  } else {
    shape[nlead] = c->hq;
    bufs[0] = tb_new(tr->be, dt, nlead + 2, shape);
    tb_fill_uniform(bufs[0], &r, -2, 2);
    slice_init(&q, bufs[0], nlead, 0, c->hq);
    if (c->inplace) {
      q_out = q;
    } else {
      bufs[2] = tb_new(tr->be, dt, nlead + 2, shape);
      slice_init(&q_out, bufs[2], nlead, 0, c->hq);
    }
    if (c->hk) {
      shape[nlead] = c->hk;
      bufs[1] = tb_new(tr->be, dt, nlead + 2, shape);
      tb_fill_uniform(bufs[1], &r, -2, 2);
      slice_init(&k, bufs[1], nlead, 0, c->hk);
      if (c->inplace) {
        k_out = k;
      } else {
        bufs[3] = tb_new(tr->be, dt, nlead + 2, shape);
        slice_init(&k_out, bufs[3], nlead, 0, c->hk);
      }
    }
  }

  int64_t pos_strides[2] = {3, 1};
  tbuf *pos = tb_new_strided(tr->be, pos_dt, nlead, lead, c->pos_strided ? pos_strides : NULL);
  for (int64_t t = 0; t < tokens; t++) tb_set(pos, t, (double)rng_int(&r, 0, c->max_pos - 1));

  ot_rope_params p = case_params(c);
  double *freq = (double *)malloc((size_t)(half ? half : 1) * sizeof *freq);
  ref_inv_freq(&p, rd, freq);
  tbuf *cache = NULL;
  if (c->cache) {
    int64_t cshape[2] = {c->max_pos, rd};
    cache = tb_new(tr->be, DT_F32, 2, cshape);
    for (int64_t row = 0; row < c->max_pos; row++)
      for (int64_t i = 0; i < half; i++) {
        tb_set(cache, row * rd + i, cos((double)row * freq[i]));
        tb_set(cache, row * rd + half + i, sin((double)row * freq[i]));
      }
    /* With a cache theta and the scaling are documented as ignored. */
    p.theta = -1.0f;
    p.llama3_factor = NAN;
  }

  /* cos / sin per token from the exact stored cache values, or in float64 */
  double *cs = (double *)malloc((size_t)(tokens ? tokens * rd : 1) * sizeof *cs);
  for (int64_t t = 0; t < tokens; t++) {
    int64_t ps = (int64_t)tb_get(pos, t);
    for (int64_t i = 0; i < half; i++) {
      cs[t * rd + i] = cache ? tb_get(cache, ps * rd + i) : cos((double)ps * freq[i]);
      cs[t * rd + half + i] = cache ? tb_get(cache, ps * rd + half + i) : sin((double)ps * freq[i]);
    }
  }

  const int64_t nq = tokens * c->hq * D, nk = tokens * c->hk * D;
  double *xq = slice_get(&q, tokens);
  double *xk = c->hk ? slice_get(&k, tokens) : NULL;
  double *refq = (double *)malloc((size_t)(nq + nk + 1) * sizeof *refq);
  double *refk = refq + nq;
  if (backward && tr->grad) {
    /* d(forward)^T dout by central differences of the float64 forward */
    double *in = (double *)malloc((size_t)(nq + nk + 1) * sizeof *in);
    double *dout = (double *)malloc((size_t)(nq + nk + 1) * sizeof *dout);
    for (int64_t i = 0; i < nq + nk; i++) in[i] = rng_uniform(&r, -2, 2);
    memcpy(dout, xq, (size_t)nq * sizeof *dout);
    if (nk) memcpy(dout + nq, xk, (size_t)nk * sizeof *dout);
    fd_state st = {c, tokens, rd, cs};
    fd_vjp(fd_forward, &st, in, nq + nk, nq + nk, dout, refq, 1e-3);
    free(in);
    free(dout);
  } else {
    ref_rope(c->mode, tokens, c->hq, D, rd, cs, backward ? -1.0 : 1.0, xq, refq);
    if (c->hk) ref_rope(c->mode, tokens, c->hk, D, rd, cs, backward ? -1.0 : 1.0, xk, refk);
  }
  /* v of a packed buffer must stay as it was */
  slice v;
  double *xv = NULL;
  if (c->packed) {
    slice_init(&v, bufs[0], nlead, c->hq + c->hk, c->hk);
    xv = slice_get(&v, tokens);
  }

  const DLTensor *tq = slice_dl(&q), *tk = c->hk ? slice_dl(&k) : NULL;
  const DLTensor *tqo = slice_dl(&q_out), *tko = c->hk ? slice_dl(&k_out) : NULL;
  const DLTensor *tcache = cache ? tb_dl(cache) : NULL;
  ot_status st = backward ? ot_rope_backward(tr->be->ctx, &p, tq, tk, tb_dl(pos), tcache, tqo, tko)
                          : ot_rope_forward(tr->be->ctx, &p, tq, tk, tb_dl(pos), tcache, tqo, tko);
  if (tr_ok(tr, st, backward ? "ot_rope_backward" : "ot_rope_forward")) {
    for (int i = 0; i < 4; i++)
      if (bufs[i]) tb_sync(bufs[i]);
    tol tl = tol_for(dt, 1);
    double *gq = slice_get(&q_out, tokens);
    check_close_f64(tr, backward ? "dq" : "q_out", gq, refq, nq, tl);
    free(gq);
    if (c->hk) {
      double *gk = slice_get(&k_out, tokens);
      check_close_f64(tr, backward ? "dk" : "k_out", gk, refk, nk, tl);
      free(gk);
    }
    if (c->packed) {
      double *gv = slice_get(&v, tokens);
      tol exact = {0, 0};
      check_close_f64(tr, "v (untouched)", gv, xv, nk, exact);
      free(gv);
    }
    if (!c->inplace) {
      tol exact = {0, 0};
      double *gq2 = slice_get(&q, tokens);
      check_close_f64(tr, "q (input, untouched)", gq2, xq, nq, exact);
      free(gq2);
      if (c->hk) {
        double *gk2 = slice_get(&k, tokens);
        check_close_f64(tr, "k (input, untouched)", gk2, xk, nk, exact);
        free(gk2);
      }
      if (c->packed) { /* the gap head between q_out and k_out keeps its poison */
        slice gap;
        slice_init(&gap, bufs[2], nlead, c->hq, 1);
        double *gg = slice_get(&gap, tokens);
        for (int64_t i = 0; i < tokens * D; i++)
          if (!isnan(gg[i])) {
            tr_fail(tr, "the gap head between q_out and k_out was written (element %lld)", (long long)i);
            break;
          }
        free(gg);
      }
    }
  }

  free(xq);
  free(xk);
  free(xv);
  free(refq);
  free(cs);
  free(freq);
  for (int i = 0; i < 4; i++) tb_free(bufs[i]);
  tb_free(pos);
  tb_free(cache);
  tr_end(tr);
}

/* The cache path and the computed path agree (cache rows = float32 cos / sin). */
static void run_cache_vs_computed(test_run *tr, DLDataType dt, ot_rope_mode mode) {
  if (!tr_begin(tr, "forward cache vs computed %s %s", mode == OT_ROPE_NEOX ? "neox" : "gptj",
                dt_name(dt)))
    return;
  rng r = tr_rng(tr);
  const int64_t T = 29, H = 3, D = 64, rd = 48, half = rd / 2, max_pos = 2048;
  int64_t shape[3] = {T, H, D}, cshape[2] = {max_pos, rd};
  tbuf *q = tb_new(tr->be, dt, 3, shape);
  tb_fill_uniform(q, &r, -2, 2);
  tbuf *o1 = tb_new(tr->be, dt, 3, shape), *o2 = tb_new(tr->be, dt, 3, shape);
  tbuf *pos = tb_new(tr->be, DT_I64, 1, shape);
  for (int64_t t = 0; t < T; t++) tb_set(pos, t, (double)rng_int(&r, 0, max_pos - 1));
  ot_rope_params p = ot_rope_default_params();
  p.mode = mode;
  p.rotary_dim = (int)rd;
  double freq[32];
  ref_inv_freq(&p, rd, freq);
  tbuf *cache = tb_new(tr->be, DT_F32, 2, cshape);
  for (int64_t row = 0; row < max_pos; row++)
    for (int64_t i = 0; i < half; i++) {
      tb_set(cache, row * rd + i, cos((double)row * freq[i]));
      tb_set(cache, row * rd + half + i, sin((double)row * freq[i]));
    }
  if (tr_ok(tr, ot_rope_forward(tr->be->ctx, &p, tb_dl(q), NULL, tb_dl(pos), NULL, tb_dl(o1), NULL),
            "ot_rope_forward (computed)") &&
      tr_ok(tr, ot_rope_forward(tr->be->ctx, &p, tb_dl(q), NULL, tb_dl(pos), tb_dl(cache), tb_dl(o2), NULL),
            "ot_rope_forward (cache)")) {
    tb_sync(o1);
    tb_sync(o2);
    double *a = tb_to_f64(o1), *b = tb_to_f64(o2);
    check_close_f64(tr, "computed vs cache", a, b, T * H * D, tol_for(dt, 1));
    free(a);
    free(b);
  }
  tb_free(q);
  tb_free(o1);
  tb_free(o2);
  tb_free(pos);
  tb_free(cache);
  tr_end(tr);
}

/* ---- the opt-in warp kernel (OT_ROPE_IMPL=w4 | w4o, rope.cu rope_warp4_kernel) ---------
 * CUDA only. Every case of the table in the 16-bit types under each value (the calls the
 * warp kernel takes run rope_warp4_kernel, the others their default kernel), then the new
 * kernel's outputs against the default's bit for bit: both modes, a cache and computed cos /
 * sin, forward and backward, in place, no k, 4 / 8 / 16 items a head, one and two batches of
 * passes, and a position outside the cache (NaN rows in both). */
typedef struct rope_bits_case {
  const char *name;
  ot_rope_mode mode;
  int T, hq, hk, D, cache, inplace;
  int bad_pos; /* token 3's position = the cache's rows (outside it) */
} rope_bits_case;

static const rope_bits_case bits_cases[] = {
    /* name                                mode          T  hq  hk  D   ca ip bp */
    {"neox 32/8 D=128 cache (one batch)",  OT_ROPE_NEOX, 37, 32, 8, 128, 1, 0, 0},
    {"neox 64/8 D=128 computed (2 x 9)",   OT_ROPE_NEOX, 19, 64, 8, 128, 0, 0, 0},
    {"gptj 12/4 D=64 cache in place",      OT_ROPE_GPTJ, 21, 12, 4, 64, 1, 1, 0},
    {"gptj 5/3 D=32 computed",             OT_ROPE_GPTJ, 23, 5, 3, 32, 0, 0, 0},
    {"neox 6/0 D=256 computed in place",   OT_ROPE_NEOX, 9, 6, 0, 256, 0, 1, 0},
    {"neox 8/2 D=64 cache, pos outside",   OT_ROPE_NEOX, 11, 8, 2, 64, 1, 0, 1},
};

static void run_impl_bits(test_run *tr, const rope_bits_case *c, DLDataType dt, bool backward,
                          const char *impl) {
  if (!tr_begin(tr, "%s %s %s OT_ROPE_IMPL=%s: the same bits as the default",
                backward ? "backward" : "forward", c->name, dt_name(dt), impl))
    return;
  const backend *be = tr->be;
  rng r = tr_rng(tr);
  const int64_t max_pos = 512, sq[3] = {c->T, c->hq, c->D}, sk[3] = {c->T, c->hk, c->D};
  const int64_t sp[1] = {c->T}, sc[2] = {max_pos, c->D};
  tbuf *pos = tb_new(be, DT_I64, 1, sp);
  for (int64_t t = 0; t < c->T; t++) tb_set(pos, t, (double)rng_int(&r, 0, max_pos - 1));
  if (c->bad_pos) tb_set(pos, 3, (double)max_pos);
  tbuf *cache = NULL;
  if (c->cache) {
    cache = tb_new(be, DT_F32, 2, sc);
    tb_fill_uniform(cache, &r, -1, 1);
  }
  ot_rope_params p = ot_rope_default_params();
  p.mode = c->mode;
  p.rotary_dim = c->D;
  tbuf *q[2], *k[2] = {NULL, NULL}, *qo[2], *ko[2] = {NULL, NULL};
  const rng r0 = r;
  bool ok = true;
  for (int v = 0; v < 2; v++) {
    rng rv = r0; /* the same inputs for both runs */
    q[v] = tb_new(be, dt, 3, sq);
    tb_fill_uniform(q[v], &rv, -2, 2);
    if (c->hk) {
      k[v] = tb_new(be, dt, 3, sk);
      tb_fill_uniform(k[v], &rv, -2, 2);
    }
    qo[v] = c->inplace ? q[v] : tb_new(be, dt, 3, sq);
    if (c->hk) ko[v] = c->inplace ? k[v] : tb_new(be, dt, 3, sk);
    if (!ok) continue;
    env_saved e = env_set("OT_ROPE_IMPL", v ? impl : NULL);
    const DLTensor *tk = c->hk ? tb_dl(k[v]) : NULL, *tko = c->hk ? tb_dl(ko[v]) : NULL;
    const DLTensor *tc = cache ? tb_dl(cache) : NULL;
    ot_status st = backward ? ot_rope_backward(be->ctx, &p, tb_dl(q[v]), tk, tb_dl(pos), tc, tb_dl(qo[v]), tko)
                            : ot_rope_forward(be->ctx, &p, tb_dl(q[v]), tk, tb_dl(pos), tc, tb_dl(qo[v]), tko);
    env_restore(&e);
    ok = tr_ok(tr, st, backward ? "ot_rope_backward" : "ot_rope_forward");
  }
  if (ok) {
    tb_sync(qo[0]), tb_sync(qo[1]);
    if (memcmp(qo[0]->host, qo[1]->host, qo[0]->bytes)) tr_fail(tr, "q_out differs from the default kernel's");
    if (c->hk) {
      tb_sync(ko[0]), tb_sync(ko[1]);
      if (memcmp(ko[0]->host, ko[1]->host, ko[0]->bytes)) tr_fail(tr, "k_out differs from the default kernel's");
    }
  }
  tr_end(tr);
  for (int v = 0; v < 2; v++) {
    if (qo[v] != q[v]) tb_free(qo[v]);
    if (ko[v] != k[v]) tb_free(ko[v]);
    tb_free(q[v]), tb_free(k[v]);
  }
  tb_free(pos);
  tb_free(cache);
}

static void impl_cases(test_run *tr) {
  if (!tr->be->is_cuda) return;
  static const char *const IMPLS[2] = {"w4", "w4o"};
  const DLDataType dts[2] = {DT_F16, DT_BF16};
  for (int m = 0; m < 2; m++) {
    env_saved e = env_set("OT_ROPE_IMPL", IMPLS[m]);
    for (int bwd = 0; bwd < 2; bwd++)
      for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        for (int d = 0; d < 2; d++) {
          rope_case c = cases[i];
          char name[128];
          snprintf(name, sizeof name, "%s [%s]", c.name, IMPLS[m]);
          c.name = name;
          run_case(tr, &c, dts[d], bwd != 0);
        }
    env_restore(&e);
  }
  for (int m = 0; m < 2; m++)
    for (size_t i = 0; i < sizeof bits_cases / sizeof bits_cases[0]; i++)
      for (int d = 0; d < 2; d++)
        for (int bwd = 0; bwd < 2; bwd++) run_impl_bits(tr, &bits_cases[i], dts[d], bwd != 0, IMPLS[m]);
}

/* ---- bad inputs ----------------------------------------------------------------------- */

/* A valid call (f32, q [5, 2, 8], k [5, 1, 8], positions int64 [5] < 16, optional
 * cache [16, 8]) whose DLTensors the mutators below break one at a time. */
typedef struct bad_env {
  ot_context *ctx;
  ot_rope_params params;
  const ot_rope_params *pparams;
  tbuf *bq, *bk, *bpos, *bcache, *bqo, *bko;
  DLTensor q, k, pos, cache, q_out, k_out;
  int64_t shapes[6][8], strides[6][8];
  const DLTensor *pq, *pk, *ppos, *pcache, *pq_out, *pk_out;
} bad_env;

static void own(DLTensor *dst, tbuf *src, int64_t *shape, int64_t *strides) {
  *dst = *tb_dl(src);
  for (int i = 0; i < 8; i++) {
    shape[i] = i < dst->ndim ? dst->shape[i] : 1;
    strides[i] = i < dst->ndim ? dst->strides[i] : 1;
  }
  dst->shape = shape;
  dst->strides = strides;
}

typedef struct bad_case {
  const char *name;
  const char *arg; /* the argument the message must name, as ": <arg>" */
  const char *also; /* a further piece of the message, or NULL */
  int backward;
  void (*mutate)(bad_env *e);
} bad_case;

static void m_ctx_null(bad_env *e) { e->ctx = NULL; }
static void m_params_null(bad_env *e) { e->pparams = NULL; }
static void m_mode(bad_env *e) { e->params.mode = (ot_rope_mode)7; }
static void m_q_null(bad_env *e) { e->pq = NULL; }
static void m_q_data_null(bad_env *e) { e->q.data = NULL; }
static void m_q_misaligned(bad_env *e) { e->q.byte_offset = 2; }
static void m_q_int(bad_env *e) { e->q.dtype = DT_I32; }
static void m_q_rank2(bad_env *e) { e->q.ndim = 2; }
static void m_q_rank5(bad_env *e) { e->q.ndim = 5; }
static void m_q_last_strided(bad_env *e) {
  e->q.shape[2] = 4;
  e->q.strides[2] = 2;
}
static void m_q_device(bad_env *e) {
  e->q.device.device_type = e->q.device.device_type == kDLCPU ? kDLCUDA : kDLCPU;
}
static void m_rd_odd(bad_env *e) { e->params.rotary_dim = 5; }
static void m_rd_big(bad_env *e) { e->params.rotary_dim = 10; }
static void m_rd_neg(bad_env *e) { e->params.rotary_dim = -2; }
static void m_k_dtype(bad_env *e) { e->k.dtype = DT_F16; }
static void m_k_tokens(bad_env *e) { e->k.shape[0] = 4; }
static void m_k_head_dim(bad_env *e) { e->k.shape[2] = 6; }
static void m_k_rank(bad_env *e) {
  e->k.ndim = 4;
  e->k.shape[0] = 1;
  e->k.shape[1] = 5;
  e->k.shape[2] = 1;
  e->k.shape[3] = 8;
  e->k.strides[0] = 40;
  e->k.strides[1] = 8;
  e->k.strides[2] = 8;
  e->k.strides[3] = 1;
}
static void m_k_out_without_k(bad_env *e) { e->pk = NULL; }
static void m_k_without_k_out(bad_env *e) { e->pk_out = NULL; }
static void m_pos_f32(bad_env *e) { e->pos.dtype = DT_F32; }
static void m_pos_len(bad_env *e) { e->pos.shape[0] = 4; }
static void m_pos_rank(bad_env *e) {
  e->pos.ndim = 2;
  e->pos.shape[1] = 1;
}
static void m_pos_negative(bad_env *e) { tb_set(e->bpos, 3, -1); }
static void m_pos_beyond_cache(bad_env *e) {
  e->pcache = &e->cache;
  tb_set(e->bpos, 2, 16);
}
static void m_cache_f16(bad_env *e) {
  e->pcache = &e->cache;
  e->cache.dtype = DT_F16;
}
static void m_cache_cols(bad_env *e) {
  e->pcache = &e->cache;
  e->params.rotary_dim = 6;
}
static void m_cache_strided(bad_env *e) {
  e->pcache = &e->cache;
  e->cache.shape[0] = 8;
  e->cache.strides[0] = 16;
}
static void m_theta(bad_env *e) { e->params.theta = 0.0f; }
static void m_l3_factor(bad_env *e) { e->params.llama3_factor = 0.5f; }
static void m_l3_nan(bad_env *e) { e->params.llama3_factor = NAN; }
static void m_l3_high_low(bad_env *e) {
  e->params.llama3_factor = 8.0f;
  e->params.llama3_low_freq_factor = 4.0f;
  e->params.llama3_high_freq_factor = 1.0f;
}
static void m_l3_low_zero(bad_env *e) {
  e->params.llama3_factor = 8.0f;
  e->params.llama3_low_freq_factor = 0.0f;
}
static void m_l3_orig(bad_env *e) {
  e->params.llama3_factor = 8.0f;
  e->params.llama3_original_max_position = 0;
}
static void m_q_out_shape(bad_env *e) { e->q_out.shape[1] = 1; }
static void m_q_out_dtype(bad_env *e) { e->q_out.dtype = DT_BF16; }
static void m_q_out_null(bad_env *e) { e->pq_out = NULL; }
static void m_q_out_overlaps_q(bad_env *e) {
  /* q_out: q's elements in another order ([5, 2, 8] with strides [8, 40, 1]): a valid
   * output layout that overlaps q without being the same view */
  e->q_out = e->q;
  e->q_out.shape = e->shapes[4];
  e->q_out.strides = e->strides[4];
  e->q_out.strides[0] = 8;
  e->q_out.strides[1] = 40;
}
static void m_k_out_is_q_out(bad_env *e) {
  /* k_out = head 0 of q_out */
  e->k_out = e->q_out;
  e->k_out.shape = e->shapes[5];
  e->k_out.strides = e->strides[5];
  e->k_out.strides[0] = 16;
}
static void m_q_out_is_k(bad_env *e) {
  /* k = head 1 of q_out */
  e->k = e->q_out;
  e->k.shape = e->shapes[1];
  e->k.strides = e->strides[1];
  e->k.strides[0] = 16;
  e->k.byte_offset = 8 * sizeof(float);
}
static void m_q_out_head_stride0(bad_env *e) { e->q_out.strides[1] = 0; }
static void m_q_out_is_pos(bad_env *e) {
  /* q_out's storage shares bytes with positions */
  e->pos = e->q_out;
  e->pos.dtype = DT_I64;
  e->pos.ndim = 1;
  e->pos.shape = e->shapes[2];
  e->pos.strides = e->strides[2];
  e->pos.shape[0] = 5;
  e->pos.strides[0] = 1;
}
static void m_b_dq_out_int(bad_env *e) { e->q.dtype = DT_I32; }
static void m_b_dk_without_dk_out(bad_env *e) { e->pk_out = NULL; }
static void m_b_dq_shape(bad_env *e) { e->q_out.shape[2] = 6; }

static const bad_case bad_cases[] = {
    {"ctx NULL", "ctx", NULL, 0, m_ctx_null},
    {"params NULL", "params", NULL, 0, m_params_null},
    {"mode 7", "params.mode", NULL, 0, m_mode},
    {"q NULL", "q", "NULL", 0, m_q_null},
    {"q data NULL", "q", "data", 0, m_q_data_null},
    {"q misaligned (byte_offset 2)", "q", "aligned", 0, m_q_misaligned},
    {"q int32", "q", "int32", 0, m_q_int},
    {"q rank 2", "q", "dimensions", 0, m_q_rank2},
    {"q rank 5", "q", "dimensions", 0, m_q_rank5},
    {"q last dim strided", "q", "contiguous", 0, m_q_last_strided},
    {"q on another device", "q", "device", 0, m_q_device},
    {"rotary_dim odd", "params.rotary_dim", "odd", 0, m_rd_odd},
    {"rotary_dim > head_dim", "params.rotary_dim", "exceeds", 0, m_rd_big},
    {"rotary_dim negative", "params.rotary_dim", "negative", 0, m_rd_neg},
    {"k dtype differs from q", "k", "float16", 0, m_k_dtype},
    {"k tokens differ from q", "k", NULL, 0, m_k_tokens},
    {"k head_dim differs from q", "k", "head_dim", 0, m_k_head_dim},
    {"k rank differs from q", "k", "dimensions", 0, m_k_rank},
    {"k_out without k", "k_out", "k is NULL", 0, m_k_out_without_k},
    {"k without k_out", "k_out", "NULL", 0, m_k_without_k_out},
    {"positions float32", "positions", "int32 or int64", 0, m_pos_f32},
    {"positions length differs", "positions", NULL, 0, m_pos_len},
    {"positions rank 2 for [T, H, D]", "positions", "dimensions", 0, m_pos_rank},
    {"negative position", "positions", "[3] is -1", 0, m_pos_negative},
    {"position >= cache rows", "positions", "[2] is 16", 0, m_pos_beyond_cache},
    {"cache float16", "cos_sin_cache", "float32", 0, m_cache_f16},
    {"cache columns != rotary_dim", "cos_sin_cache", "rotary_dim", 0, m_cache_cols},
    {"cache not contiguous", "cos_sin_cache", "contiguous", 0, m_cache_strided},
    {"theta 0", "params.theta", NULL, 0, m_theta},
    {"llama3 factor 0.5", "params.llama3_factor", NULL, 0, m_l3_factor},
    {"llama3 factor NaN", "params.llama3_factor", NULL, 0, m_l3_nan},
    {"llama3 high <= low", "params.llama3_high_freq_factor", NULL, 0, m_l3_high_low},
    {"llama3 low 0", "params.llama3_low_freq_factor", NULL, 0, m_l3_low_zero},
    {"llama3 original max 0", "params.llama3_original_max_position", NULL, 0, m_l3_orig},
    {"q_out shape", "q_out", "shape", 0, m_q_out_shape},
    {"q_out dtype", "q_out", "bfloat16", 0, m_q_out_dtype},
    {"q_out NULL", "q_out", "NULL", 0, m_q_out_null},
    {"q_out partially overlaps q", "q_out", "overlaps q", 0, m_q_out_overlaps_q},
    {"k_out overlaps q_out", "q_out", "k_out", 0, m_k_out_is_q_out},
    {"q_out overlaps k", "q_out", "k", 0, m_q_out_is_k},
    {"q_out head stride 0", "q_out", "overlap", 0, m_q_out_head_stride0},
    {"q_out overlaps positions", "q_out", "positions", 0, m_q_out_is_pos},
    {"backward dq_out int32", "dq_out", "int32", 1, m_b_dq_out_int},
    {"backward dk_out without dk", "dk", "NULL", 1, m_b_dk_without_dk_out},
    {"backward dq shape", "dq", "shape", 1, m_b_dq_shape},
    {"backward rotary_dim odd", "params.rotary_dim", "odd", 1, m_rd_odd},
    {"backward negative position", "positions", "[3] is -1", 1, m_pos_negative},
    {"backward k_out without k", "dk", "dk_out is NULL", 1, m_k_out_without_k},
};

static void run_bad(test_run *tr, const bad_case *bc) {
  if (!tr_begin(tr, "bad input: %s", bc->name)) return;
  /* Position values are read on the host only: on CUDA they live on the device and
   * checking them would synchronize the stream (the header states the contract). */
  if (tr->be->is_cuda && (bc->mutate == m_pos_negative || bc->mutate == m_pos_beyond_cache)) {
    tr->case_skipped = true;
    tr_end(tr);
    return;
  }
  rng r = tr_rng(tr);
  bad_env e;
  memset(&e, 0, sizeof e);
  e.ctx = tr->be->ctx;
  e.params = ot_rope_default_params();
  e.pparams = &e.params;
  int64_t sq[3] = {5, 2, 8}, sk[3] = {5, 1, 8}, sp[1] = {5}, sc[2] = {16, 8};
  e.bq = tb_new(tr->be, DT_F32, 3, sq);
  e.bk = tb_new(tr->be, DT_F32, 3, sk);
  e.bqo = tb_new(tr->be, DT_F32, 3, sq);
  e.bko = tb_new(tr->be, DT_F32, 3, sk);
  e.bpos = tb_new(tr->be, DT_I64, 1, sp);
  e.bcache = tb_new(tr->be, DT_F32, 2, sc);
  tb_fill_uniform(e.bq, &r, -1, 1);
  tb_fill_uniform(e.bk, &r, -1, 1);
  tb_fill_uniform(e.bcache, &r, -1, 1);
  for (int i = 0; i < 5; i++) tb_set(e.bpos, i, (double)rng_int(&r, 0, 15));
  tbuf *all[6] = {e.bq, e.bk, e.bpos, e.bcache, e.bqo, e.bko};
  DLTensor *views[6] = {&e.q, &e.k, &e.pos, &e.cache, &e.q_out, &e.k_out};
  for (int i = 0; i < 6; i++) own(views[i], all[i], e.shapes[i], e.strides[i]);
  e.pq = &e.q;
  e.pk = &e.k;
  e.ppos = &e.pos;
  e.pcache = NULL;
  e.pq_out = &e.q_out;
  e.pk_out = &e.k_out;
  bc->mutate(&e);
  tb_dl(e.bpos);
  void *snaps[6];
  for (int i = 0; i < 6; i++) snaps[i] = tb_snapshot(all[i]);
  ot_status st = bc->backward
                     ? ot_rope_backward(e.ctx, e.pparams, e.pq, e.pk, e.ppos, e.pcache, e.pq_out, e.pk_out)
                     : ot_rope_forward(e.ctx, e.pparams, e.pq, e.pk, e.ppos, e.pcache, e.pq_out, e.pk_out);
  char arg[80];
  snprintf(arg, sizeof arg, ": %s: ", bc->arg);
  const char *opname = bc->backward ? "ot_rope_backward" : "ot_rope_forward";
  if (tr_expect_error(tr, st, OT_ERR_INVALID_ARGUMENT, opname, arg) && bc->also)
    tr_expect_error(tr, st, OT_ERR_INVALID_ARGUMENT, bc->also, NULL);
  for (int i = 0; i < 6; i++) {
    if (!tb_unchanged(all[i], snaps[i])) tr_fail(tr, "tensor %d written by a failing call", i);
    free(snaps[i]);
    tb_free(all[i]);
  }
  tr_end(tr);
}

/* ---- suite ------------------------------------------------------------------------------ */

static void run(test_run *tr) {
  if (tr->grad) {
    for (size_t i = 0; i < sizeof grad_cases / sizeof grad_cases[0]; i++)
      run_case(tr, &grad_cases[i], DT_F32, true);
    return;
  }
  const DLDataType dts[3] = {DT_F32, DT_F16, DT_BF16};
  for (int bwd = 0; bwd < 2; bwd++)
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
      for (int d = 0; d < 3; d++) run_case(tr, &cases[i], dts[d], bwd != 0);
  for (int d = 0; d < 3; d++) {
    run_cache_vs_computed(tr, dts[d], OT_ROPE_NEOX);
    run_cache_vs_computed(tr, dts[d], OT_ROPE_GPTJ);
  }
  impl_cases(tr);
  for (size_t i = 0; i < sizeof bad_cases / sizeof bad_cases[0]; i++) run_bad(tr, &bad_cases[i]);
}

const test_suite suite_rope = {"rope", run};
