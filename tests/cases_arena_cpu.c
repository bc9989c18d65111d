/*
 * cases_arena_cpu.c -- ot_context_set_arena on a CPU context: the CPU ops' temporaries
 * (src/cpu/temp.h) come from the context's host arena.
 *
 * For each op: run it without an arena (the reference), then with arenas of growing
 * size S (0, 256, 512, ... bytes free beside a pattern-filled 256-byte user block) until
 * it succeeds. Every run that does not fit must be OT_ERR_OOM naming the op and the
 * largest free block, with every buffer of the call (inputs, outputs, in-place state)
 * byte-identical to before; the run that fits must give results byte-identical to the
 * reference and must have taken its temporaries from the arena. After every run the
 * arena holds the user block only (all temporaries back), the user block is intact and
 * the tracker's workspace counter is back where it was. Called by suite "arena" (CPU).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"

enum { CA_MAX = 16 };

typedef struct ca_case {
  tbuf *b[CA_MAX];
  int nb;
  DLTensor dl[CA_MAX]; /* tensors built by hand (paged attention's kv) */
} ca_case;

typedef struct ca_def {
  const char *name;
  const char *op; /* the op name the OOM message starts with */
  void (*setup)(ca_case *c, const backend *be, rng *r);
  ot_status (*run)(ot_context *ctx, ca_case *c);
} ca_def;

/* Buffers: inputs random in [-1, 1), outputs (out = true) poisoned. */
static tbuf *ca_add(ca_case *c, const backend *be, rng *r, DLDataType dt, int ndim,
                    const int64_t *shape, bool out) {
  tbuf *t = tb_new(be, dt, ndim, shape);
  if (out) tb_poison(t);
  else tb_fill_uniform(t, r, -1, 1);
  c->b[c->nb++] = t;
  return t;
}
#define IN(dt, ...) ca_add(c, be, r, dt, sizeof((int64_t[]){__VA_ARGS__}) / 8, (int64_t[]){__VA_ARGS__}, false)
#define OUT(dt, ...) ca_add(c, be, r, dt, sizeof((int64_t[]){__VA_ARGS__}) / 8, (int64_t[]){__VA_ARGS__}, true)
#define D(i) tb_dl(c->b[i])

/* ---- the ops --------------------------------------------------------------------------- */

enum { NR = 37, NH = 200 };
static void setup_rms_fwd(ca_case *c, const backend *be, rng *r) {
  IN(DT_BF16, NR, NH), IN(DT_BF16, NH), OUT(DT_BF16, NR, NH), OUT(DT_F32, NR);
}
static ot_status run_rms_fwd(ot_context *ctx, ca_case *c) {
  return ot_rmsnorm_forward(ctx, D(0), NULL, D(1), 1e-5f, D(2), NULL, D(3));
}
static void setup_rms_bwd(ca_case *c, const backend *be, rng *r) {
  IN(DT_BF16, NR, NH), IN(DT_BF16, NR, NH), IN(DT_BF16, NH), OUT(DT_BF16, NR, NH),
      OUT(DT_BF16, NH);
}
static ot_status run_rms_bwd(ot_context *ctx, ca_case *c) {
  return ot_rmsnorm_backward(ctx, D(0), NULL, D(1), D(2), NULL, 1e-5f, D(3), D(4));
}
static void setup_ln_fwd(ca_case *c, const backend *be, rng *r) {
  IN(DT_F32, NR, NH), IN(DT_F32, NH), IN(DT_F32, NH), OUT(DT_F32, NR, NH), OUT(DT_F32, NR),
      OUT(DT_F32, NR);
}
static ot_status run_ln_fwd(ot_context *ctx, ca_case *c) {
  return ot_layernorm_forward(ctx, D(0), NULL, D(1), D(2), 1e-5f, D(3), NULL, D(4), D(5));
}
static void setup_ln_bwd(ca_case *c, const backend *be, rng *r) {
  IN(DT_F16, NR, NH), IN(DT_F16, NR, NH), IN(DT_F16, NH), OUT(DT_F16, NR, NH), OUT(DT_F16, NH),
      OUT(DT_F16, NH);
}
static ot_status run_ln_bwd(ot_context *ctx, ca_case *c) {
  return ot_layernorm_backward(ctx, D(0), NULL, D(1), D(2), NULL, NULL, 1e-5f, D(3), D(4), D(5));
}
static void setup_softmax(ca_case *c, const backend *be, rng *r) {
  IN(DT_F32, 33, 300), OUT(DT_F32, 33, 300);
}
static ot_status run_softmax(ot_context *ctx, ca_case *c) {
  return ot_softmax_forward(ctx, D(0), D(1));
}
static void setup_rope(ca_case *c, const backend *be, rng *r) {
  IN(DT_BF16, 2, 9, 4, 64), IN(DT_BF16, 2, 9, 2, 64), OUT(DT_BF16, 2, 9, 4, 64),
      OUT(DT_BF16, 2, 9, 2, 64);
  tbuf *pos = IN(DT_I64, 2, 9);
  for (int64_t i = 0; i < 18; i++) tb_set(pos, i, (double)(i * 7 % 50));
}
static ot_status run_rope(ot_context *ctx, ca_case *c) {
  ot_rope_params p = ot_rope_default_params();
  return ot_rope_forward(ctx, &p, D(0), D(1), D(4), NULL, D(2), D(3));
}
/* attention: 2 sequences of 70, 4 query heads over 2 kv heads, D 64, causal */
enum { AB = 2, AS = 70, AHQ = 4, AHK = 2, AD = 64 };
static void setup_attn_fwd(ca_case *c, const backend *be, rng *r) {
  IN(DT_BF16, AB, AS, AHQ, AD), IN(DT_BF16, AB, AS, AHK, AD), IN(DT_BF16, AB, AS, AHK, AD),
      OUT(DT_BF16, AB, AS, AHQ, AD), OUT(DT_F32, AB, AHQ, AS);
}
static ot_status run_attn_fwd(ot_context *ctx, ca_case *c) {
  ot_attention_params p = ot_attention_default_params();
  p.causal = 1;
  return ot_attention_forward(ctx, &p, D(0), D(1), D(2), NULL, NULL, D(3), D(4));
}
static void setup_attn_bwd(ca_case *c, const backend *be, rng *r) {
  setup_attn_fwd(c, be, r);
  /* the forward's out / lse (computed here, outside any arena), then dout, dq, dk, dv */
  ot_context *cpu = NULL;
  if (ot_context_create(NULL, &cpu) == OT_OK) {
    run_attn_fwd(cpu, c);
    ot_context_destroy(cpu);
  }
  IN(DT_BF16, AB, AS, AHQ, AD), OUT(DT_BF16, AB, AS, AHQ, AD), OUT(DT_BF16, AB, AS, AHK, AD),
      OUT(DT_BF16, AB, AS, AHK, AD);
}
static ot_status run_attn_bwd(ot_context *ctx, ca_case *c) {
  ot_attention_params p = ot_attention_default_params();
  p.causal = 1;
  return ot_attention_backward(ctx, &p, D(0), D(1), D(2), D(3), D(5), D(4), NULL, NULL, D(6),
                               D(7), D(8));
}
enum { CN = 300, CV = 77 };
static void setup_ce(ca_case *c, const backend *be, rng *r) {
  IN(DT_BF16, CN, CV), OUT(DT_F32, 1), OUT(DT_F32, CN);
  tbuf *lab = IN(DT_I64, CN);
  for (int64_t i = 0; i < CN; i++) tb_set(lab, i, (double)(i % 9 == 0 ? -100 : rng_int(r, 0, CV - 1)));
}
static ot_status run_ce(ot_context *ctx, ca_case *c) {
  ot_cross_entropy_params p = ot_cross_entropy_default_params();
  return ot_cross_entropy_forward(ctx, &p, D(0), D(3), D(1), D(2));
}
static void setup_linear(ca_case *c, const backend *be, rng *r, int64_t M) {
  IN(DT_BF16, M, 96), IN(DT_BF16, 130, 96), IN(DT_BF16, 130), OUT(DT_BF16, M, 130);
}
static void setup_linear_small(ca_case *c, const backend *be, rng *r) { setup_linear(c, be, r, 5); }
static void setup_linear_big(ca_case *c, const backend *be, rng *r) { setup_linear(c, be, r, 45); }
static ot_status run_linear(ot_context *ctx, ca_case *c) {
  return ot_linear_forward(ctx, D(0), D(1), D(2), D(3));
}
static void setup_linear_bwd(ca_case *c, const backend *be, rng *r) {
  IN(DT_BF16, 70, 130), IN(DT_BF16, 70, 96), IN(DT_BF16, 130, 96), OUT(DT_BF16, 70, 96),
      OUT(DT_BF16, 130, 96), OUT(DT_BF16, 130);
}
static ot_status run_linear_bwd(ot_context *ctx, ca_case *c) {
  return ot_linear_backward(ctx, D(0), D(1), D(2), D(3), D(4), D(5));
}
/* linear + CE: 45 tokens in chunks of 16 (the last one of 13), H 48, V 150 */
enum { LT = 45, LH = 48, LV = 150 };
static void setup_lce(ca_case *c, const backend *be, rng *r) {
  IN(DT_BF16, LT, LH), IN(DT_BF16, LV, LH), OUT(DT_F32, 1), OUT(DT_BF16, LT, LH),
      OUT(DT_BF16, LV, LH);
  tbuf *lab = IN(DT_I64, LT);
  for (int64_t i = 0; i < LT; i++) tb_set(lab, i, (double)rng_int(r, 0, LV - 1));
}
static ot_status run_lce(ot_context *ctx, ca_case *c) {
  ot_linear_cross_entropy_params p = ot_linear_cross_entropy_default_params();
  p.chunk_tokens = 16;
  return ot_linear_cross_entropy(ctx, &p, D(0), D(1), D(5), D(2), D(3), D(4), NULL);
}
static void setup_lce_f32dw(ca_case *c, const backend *be, rng *r) {
  IN(DT_BF16, LT, LH), IN(DT_BF16, LV, LH), OUT(DT_F32, 1), OUT(DT_BF16, LT, LH),
      OUT(DT_F32, LV, LH);
  tbuf *lab = IN(DT_I64, LT);
  for (int64_t i = 0; i < LT; i++) tb_set(lab, i, (double)rng_int(r, 0, LV - 1));
}
/* AdamW: params, grads, m, v of two tensors, all updated in place but the grads */
static void setup_adamw(ca_case *c, const backend *be, rng *r) {
  IN(DT_F32, 1000), IN(DT_F32, 7), IN(DT_F32, 1000), IN(DT_F32, 7);
  tbuf *m0 = IN(DT_F32, 1000), *m1 = IN(DT_F32, 7), *v0 = IN(DT_F32, 1000), *v1 = IN(DT_F32, 7);
  for (int64_t i = 0; i < 1000; i++) tb_set(v0, i, fabs(tb_get(v0, i)));
  for (int64_t i = 0; i < 7; i++) tb_set(v1, i, fabs(tb_get(v1, i)));
  (void)m0, (void)m1;
}
static ot_status run_adamw(ot_context *ctx, ca_case *c) {
  ot_adamw_params p = ot_adamw_default_params();
  p.step = 3;
  const DLTensor *w[2] = {D(0), D(1)}, *g[2] = {D(2), D(3)}, *m[2] = {D(4), D(5)},
                 *v[2] = {D(6), D(7)};
  return ot_adamw_step(ctx, &p, 2, w, g, m, v, NULL);
}
/* paged attention: 2 sequences of 40 and 23 keys in pages of 16 (3 + 2 pages, shuffled),
 * 1 and 3 new queries, 4 query heads over 2 kv heads, D 64, causal */
static void setup_paged(ca_case *c, const backend *be, rng *r) {
  IN(DT_BF16, 5, AHK, 16, AD), IN(DT_BF16, 5, AHK, 16, AD), IN(DT_BF16, 4, AHQ, AD),
      OUT(DT_BF16, 4, AHQ, AD), OUT(DT_F32, AHQ, 4);
  tbuf *indptr = IN(DT_I32, 3), *indices = IN(DT_I32, 5), *lpl = IN(DT_I32, 2), *cu = IN(DT_I32, 3);
  const int ip[3] = {0, 3, 5}, ix[5] = {4, 0, 2, 1, 3}, lp[2] = {8, 7}, cq[3] = {0, 1, 4};
  for (int i = 0; i < 3; i++) tb_set(indptr, i, ip[i]), tb_set(cu, i, cq[i]);
  for (int i = 0; i < 5; i++) tb_set(indices, i, ix[i]);
  for (int i = 0; i < 2; i++) tb_set(lpl, i, lp[i]);
}
static ot_status run_paged(ot_context *ctx, ca_case *c) {
  ot_attention_params p = ot_attention_default_params();
  p.causal = 1;
  ot_paged_kv kv = {D(0), D(1), D(5), D(6), D(7)};
  return ot_paged_attention(ctx, &p, D(2), D(8), &kv, D(3), D(4));
}

static const ca_def ca_defs[] = {
    {"rmsnorm forward", "ot_rmsnorm_forward", setup_rms_fwd, run_rms_fwd},
    {"rmsnorm backward", "ot_rmsnorm_backward", setup_rms_bwd, run_rms_bwd},
    {"layernorm forward", "ot_layernorm_forward", setup_ln_fwd, run_ln_fwd},
    {"layernorm backward", "ot_layernorm_backward", setup_ln_bwd, run_ln_bwd},
    {"softmax forward", "ot_softmax_forward", setup_softmax, run_softmax},
    {"rope forward", "ot_rope_forward", setup_rope, run_rope},
    {"attention forward", "ot_attention_forward", setup_attn_fwd, run_attn_fwd},
    {"attention backward", "ot_attention_backward", setup_attn_bwd, run_attn_bwd},
    {"cross-entropy forward", "ot_cross_entropy_forward", setup_ce, run_ce},
    {"linear forward (small M)", "ot_linear_forward", setup_linear_small, run_linear},
    {"linear forward", "ot_linear_forward", setup_linear_big, run_linear},
    {"linear backward", "ot_linear_backward", setup_linear_bwd, run_linear_bwd},
    {"linear + cross-entropy", "ot_linear_cross_entropy", setup_lce, run_lce},
    {"linear + cross-entropy (f32 dweight)", "ot_linear_cross_entropy", setup_lce_f32dw, run_lce},
    {"adamw step", "ot_adamw_step", setup_adamw, run_adamw},
    {"paged attention", "ot_paged_attention", setup_paged, run_paged},
};

/* ---- the driver ------------------------------------------------------------------------- */

static void ca_free(ca_case *c) {
  for (int i = 0; i < c->nb; i++) tb_free(c->b[i]);
  memset(c, 0, sizeof *c);
}

static void ca_run_one(test_run *tr, const ca_def *d) {
  if (!tr_begin(tr, "context arena (CPU): %s", d->name)) return;
  ot_context *ctx = tr->be->ctx;
  const rng r0 = tr_rng(tr);
  ca_case ref = {0}, got = {0};
  void *pre[CA_MAX] = {0};
  ot_arena *a = NULL;
  rng r = r0;
  d->setup(&ref, tr->be, &r);
  for (int i = 0; i < ref.nb; i++) pre[i] = tb_snapshot(ref.b[i]);
  if (!tr_ok(tr, d->run(ctx, &ref), "without an arena")) goto out;
  bool wrote = false;
  for (int i = 0; i < ref.nb; i++) wrote |= !tb_unchanged(ref.b[i], pre[i]);
  if (!wrote) tr_fail(tr, "the op wrote nothing (the comparison would be vacuous)");
  for (int i = 0; i < ref.nb; i++) free(pre[i]), pre[i] = NULL;
  int ooms = 0;
  unsigned char pattern[256];
  for (int i = 0; i < 256; i++) pattern[i] = (unsigned char)(i * 29 + 3);
  for (size_t S = 0;; S = S ? 2 * S : 256) {
    if (S > ((size_t)64 << 20)) {
      tr_fail(tr, "did not fit in an arena of 64 MiB");
      break;
    }
    if (!tr_ok(tr, ot_arena_create(ctx, 256 + S, &a), "arena")) break;
    void *user = NULL;
    if (!tr_ok(tr, ot_arena_alloc(a, 256, NULL, &user), "user block")) break;
    memcpy(user, pattern, 256);
    r = r0;
    d->setup(&got, tr->be, &r);
    for (int i = 0; i < got.nb; i++) pre[i] = tb_snapshot(got.b[i]);
    ot_arena_stats s0, s1;
    ot_memory_counter w0, w1;
    ot_arena_get_stats(a, &s0);
    ot_memory_tag_counter(OT_MEMORY_WORKSPACE, &w0);
    if (!tr_ok(tr, ot_context_set_arena(ctx, a), "attach")) break;
    ot_status st = d->run(ctx, &got);
    char msg[512];
    snprintf(msg, sizeof msg, "%s", ot_last_error());
    tr_ok(tr, ot_context_set_arena(ctx, NULL), "detach");
    ot_arena_get_stats(a, &s1);
    ot_memory_tag_counter(OT_MEMORY_WORKSPACE, &w1);
    if (s1.in_use != 256 || s1.live_blocks != 1)
      tr_fail(tr, "S %zu: temporaries not given back: in_use %zu, %llu live blocks", S,
              s1.in_use, (unsigned long long)s1.live_blocks);
    if (w1.current != w0.current)
      tr_fail(tr, "S %zu: tracker workspace %zu -> %zu", S, w0.current, w1.current);
    if (memcmp(user, pattern, 256)) tr_fail(tr, "S %zu: the user block was disturbed", S);
    if (st == OT_OK) {
      if (s1.num_allocs <= s0.num_allocs)
        tr_fail(tr, "the op took no temporary from the arena");
      for (int i = 0; i < got.nb; i++)
        if (memcmp(got.b[i]->host, ref.b[i]->host, got.b[i]->bytes))
          tr_fail(tr, "buffer %d: results with the arena differ from those without", i);
      break;
    }
    ooms++;
    char head[128];
    snprintf(head, sizeof head, "%s: ", d->op);
    if (st != OT_ERR_OOM || strncmp(msg, head, strlen(head)) ||
        !strstr(msg, "cannot allocate") || !strstr(msg, "the largest free block is"))
      tr_fail(tr, "S %zu: status %d, message '%s'", S, (int)st, msg);
    for (int i = 0; i < got.nb; i++)
      if (!tb_unchanged(got.b[i], pre[i])) tr_fail(tr, "S %zu: buffer %d written by a failing op", S, i);
    for (int i = 0; i < got.nb; i++) free(pre[i]), pre[i] = NULL;
    ca_free(&got);
    ot_arena_destroy(a);
    a = NULL;
    if (tr->case_failed) break;
  }
  if (ooms == 0) tr_fail(tr, "no arena size gave OT_ERR_OOM");
  if (tr->verbose) printf("    %s: %d arena sizes too small\n", d->name, ooms);
out:
  ot_context_set_arena(ctx, NULL);
  for (int i = 0; i < CA_MAX; i++) free(pre[i]);
  ca_free(&ref);
  ca_free(&got);
  ot_arena_destroy(a);
  tr_end(tr);
}

void arena_cpu_ops(test_run *tr);
void arena_cpu_ops(test_run *tr) {
  for (size_t i = 0; i < sizeof ca_defs / sizeof ca_defs[0]; i++) ca_run_one(tr, &ca_defs[i]);
}
