/* engine.c -- the Llama-family forward: prefill over packed prompts and decode steps,
 * built only from the public ops on the engine's context.
 *
 * One layer, T tokens (residual stream x_res [T, H]; delta [T, H] is the last
 * sub-block's output, added to x_res by the next norm's fused residual path):
 *   normed, x_res = rmsnorm(delta + x_res)            (layer 0: rmsnorm(x_res))
 *   qkv    = normed Wqkv^T (+ b)                     [T, (Hq + 2 Hkv) D], one GEMM
 *   prefill: q, k = rope(q, k) in place on strided views of qkv and K/V -> the paged cache,
 *            one kernel (ot_rope_kv_append; OTE_PREFILL_ROPE_KV=0: the two ops,
 *            ot_rope_forward then ot_kv_append); attn = ot_attention_forward(q, k, v)
 *            causal, packed varlen
 *   decode:  ot_kv_append rotates k into its page and q in place (RoPE fused, positions
 *            from the page table); attn = ot_paged_attention(q, pages) for the batch
 *   delta  = attn Wo^T
 *   normed, x_res = rmsnorm(delta + x_res)
 *   gate_up = normed Wgu^T                           [T, 2F], one GEMM
 *   delta  = swiglu(gate_up) Wdown^T
 * then the final norm and lm_head on each sequence's last token only.
 *
 * CUDA: everything is enqueued on the engine's own stream; weights, the KV pool and one
 * activation block are allocated at load / first use, never per step. A decode step of a
 * batch size that already ran once eagerly is captured into a CUDA graph (embedding lookup
 * through lm_head, and the argmax when greedy); later steps of that size write the
 * graph's inputs -- token ids and the page table -- into a pinned host block and replay it:
 * the graph begins with the one copy of that block into device memory of fixed address and
 * ends with the copy of the argmax ids into pinned memory, so a step is one graph launch
 * and one stream synchronization. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fused_kernels.h"
#include "internal.h"

static long long env_ll(const char *name, long long def);

ote_engine_options ote_engine_default_options(void) {
  ote_engine_options o;
  memset(&o, 0, sizeof o);
  o.dtype = OTE_F32;
  o.max_seqs = 1;
  o.max_len = 0;
  o.device_type = kDLCPU;
  o.kv_block_size = 16;
  o.cuda_graphs = 1;
  o.offload = 0;
  return o;
}

const ote_config *ote_engine_config(const ote_engine *e) { return &e->cfg; }

ote_memory ote_engine_memory(const ote_engine *e) {
  ote_memory m = {e->weight_bytes, e->kv.bytes, e->act_bytes, e->weight_host_bytes,
                  e->off.on ? e->off.layer_bytes * (size_t)e->off.ring : 0};
  return m;
}

int ote_seq_len(const ote_engine *e, int seq_id) {
  if (!e || seq_id < 0 || seq_id >= e->kv.max_seqs) return 0;
  return e->kv.len[seq_id];
}

void ote_seq_free(ote_engine *e, int seq_id) {
  if (!e || seq_id < 0 || seq_id >= e->kv.max_seqs) return;
  ote_kv_drop(&e->kv, 1, &seq_id);
}

void ote_engine_offload_report(const ote_engine *e, char *buf, size_t len) {
  if (!e || !buf || !len) return;
  ote_offload_report(e, buf, len);
}

int ote_decode_graph_active(const ote_engine *e) { return e && e->graph_active; }
const char *ote_decode_graph_note(const ote_engine *e) { return e ? e->graph_note : ""; }

void ote_engine_last_timing(const ote_engine *e, double out[6]) {
  if (!out) return;
  for (int i = 0; i < 6; i++) out[i] = e ? e->tm[i] : 0.0;
}

/* The split of a call (ote_engine_last_timing) from its host clock readings: t0 entry,
 * t1 before the forward was enqueued, t2 after, t3 after the results were fetched. */
static void timing_done(ote_engine *e, int phase, double t0, double t1, double t2, double t3) {
  e->tm[0] = t1 - t0;
  e->tm[1] = t2 - t1;
  e->tm[2] = t3 - t2;
  e->tm[3] = e->tm_ev[0] && !e->prof_on ? ote_dev_event_ms(e->tm_ev[0], e->tm_ev[1]) : -1.0;
  e->tm[4] = t3 - t0;
  e->tm[5] = phase;
}

static void drop_graphs(ote_engine *e) {
  if (!e->graph) return;
  for (int n = 0; n <= e->opt.max_seqs; n++) {
    ote_graph_destroy(e->graph[n]);
    e->graph[n] = NULL;
    e->warm[n] = 0;
  }
  e->graph_active = 0;
}

static void prof_free(ote_engine *e) {
  for (int i = 0; i < e->prof_cap; i++) ote_dev_event_destroy(e->prof_ev[i]);
  free(e->prof_ev);
  free(e->prof_kind);
  e->prof_ev = NULL;
  e->prof_kind = NULL;
  e->prof_cap = 0;
}

static void free_activations(ote_engine *e) {
  drop_graphs(e);
  ote_dev_free(&e->dev, e->act_block);
  free(e->positions_host);
  free(e->cu_host);
  free(e->logits_stage);
  free(e->logits_host);
  e->act_block = NULL;
  e->positions_host = e->cu_host = NULL;
  e->logits_stage = NULL;
  e->logits_host = NULL;
  e->act_tokens = 0;
  e->act_bytes = 0;
}

void ote_engine_destroy(ote_engine *e) {
  if (!e) return;
  if (e->dev.stream) (void)ote_dev_sync(&e->dev);
  free_activations(e);
  free(e->graph);
  free(e->warm);
  prof_free(e);
  ote_dev_event_destroy(e->tm_ev[0]);
  ote_dev_event_destroy(e->tm_ev[1]);
  ote_kv_destroy(&e->kv, &e->dev);
  ote_dev_free(&e->dev, e->cu_dec_dev);
  ote_dev_host_free(&e->dev, e->next_h);
  ote_dev_free(&e->dev, e->argmax_state);
  ote_dev_free(&e->dev, e->ao_scratch);
  ote_weights_free(e);
  ote_offload_free(e);
  ot_context_destroy(e->ctx);
  ote_dev_stream_destroy(&e->dev);
  free(e);
}

/* Activations for T tokens, one device block carved into the buffers. */
static ot_status ensure_activations(ote_engine *e, int T) {
  if (T <= e->act_tokens) return OT_OK;
  if (e->dev.stream) OTE_TRY(ote_dev_sync(&e->dev)); /* the old block may still be read */
  free_activations(e);
  const ote_config *c = &e->cfg;
  size_t es = ote_dtype_size(e->opt.dtype), t = (size_t)T, S = (size_t)e->opt.max_seqs;
  size_t H = (size_t)c->hidden, D = (size_t)c->head_dim;
  size_t qkv = (size_t)(c->heads + 2 * c->kv_heads) * D, F = (size_t)c->ffn, V = (size_t)c->vocab;
  struct { void **p; size_t bytes; } parts[] = {
      {&e->x_res, t * H * es},       {&e->delta, t * H * es},     {&e->normed, t * H * es},
      {&e->qkv, t * qkv * es},       {&e->attn, t * (size_t)c->heads * D * es},
      {&e->gate_up, t * 2 * F * es}, {&e->mlp, t * F * es},       {&e->last_res, S * H * es},
      {&e->last_delta, S * H * es},  {&e->last_norm, S * H * es}, {&e->logits, S * V * es},
      {(void **)&e->positions_dev, t * 4}, {(void **)&e->cu_dev, (S + 1) * 4},
      {(void **)&e->tokens_dev, t * 4},    {(void **)&e->argmax_dev, S * 4},
  };
  size_t n = sizeof parts / sizeof parts[0], total = 0;
  for (size_t i = 0; i < n; i++) total += (parts[i].bytes + 255) / 256 * 256;
  OTE_TRY(ote_dev_alloc(&e->dev, total, &e->act_block));
  size_t off = 0;
  for (size_t i = 0; i < n; i++) {
    *parts[i].p = (char *)e->act_block + off;
    off += (parts[i].bytes + 255) / 256 * 256;
  }
  e->positions_host = malloc(t * 4);
  e->cu_host = malloc((S + 1) * 4);
  e->logits_stage = malloc(S * V * es);
  e->logits_host = malloc(S * V * sizeof(float));
  e->act_tokens = T;
  e->act_bytes = total;
  if (!e->positions_host || !e->cu_host || !e->logits_stage || !e->logits_host) {
    free_activations(e);
    return ote_error(OT_ERR_OOM, "engine: out of host memory");
  }
  return OT_OK;
}

static ot_status engine_create(const ote_config *cfg, const ote_engine_options *opt,
                               ote_engine **out) {
  *out = NULL;
  ote_engine_options o = opt ? *opt : ote_engine_default_options();
  if (!ote_dtype_eq(o.dtype, OTE_F32) && !ote_dtype_eq(o.dtype, OTE_BF16) &&
      !ote_dtype_eq(o.dtype, OTE_F16))
    return ote_error(OT_ERR_INVALID_ARGUMENT, "engine: dtype must be float32, float16 or bfloat16");
  if (o.device_type != kDLCPU && o.device_type != kDLCUDA)
    return ote_error(OT_ERR_INVALID_ARGUMENT, "engine: device must be the CPU or CUDA");
  if (o.offload && o.device_type != kDLCUDA)
    return ote_error(OT_ERR_INVALID_ARGUMENT,
                     "engine: weight streaming (offload) is for CUDA devices: on the CPU the "
                     "weights are in host memory already");
  if (o.offload_budget && !o.offload)
    return ote_error(OT_ERR_INVALID_ARGUMENT,
                     "engine: offload_budget is for weight streaming: set offload as well");
  if (o.max_seqs <= 0) o.max_seqs = 1;
  if (o.max_len <= 0) o.max_len = cfg->max_position < 4096 ? cfg->max_position : 4096;
  if (o.kv_block_size <= 0) o.kv_block_size = 16;
  if (o.max_len > cfg->max_position)
    return ote_error(OT_ERR_INVALID_ARGUMENT,
                     "engine: max_len %d exceeds the model's max_position_embeddings %d", o.max_len,
                     cfg->max_position);
  ote_engine *e = calloc(1, sizeof *e);
  if (!e) return ote_error(OT_ERR_OOM, "engine: out of memory");
  e->cfg = *cfg;
  e->opt = o;
  e->dev.dev.device_type = o.device_type;
  e->dev.dev.device_id = o.device_id;
  e->graph = calloc((size_t)o.max_seqs + 1, sizeof *e->graph);
  e->warm = calloc((size_t)o.max_seqs + 1, 1);
  e->graphs_off = o.device_type != kDLCUDA || !o.cuda_graphs;
  if (o.device_type == kDLCUDA && !o.cuda_graphs)
    snprintf(e->graph_note, sizeof e->graph_note, "off (option)");
  if (!e->graph || !e->warm) {
    free(e->graph), free(e->warm), free(e);
    return ote_error(OT_ERR_OOM, "engine: out of memory");
  }
  ot_status st = OT_OK;
  if (o.device_type == kDLCUDA) {
    if (!ot_has_cuda()) st = ote_error(OT_ERR_NO_DEVICE, "engine: the library was built without CUDA");
    if (st == OT_OK) st = ote_dev_stream_create(&e->dev);
  }
  if (st == OT_OK) {
    ot_context_options co = ot_context_default_options();
    co.device_type = o.device_type;
    co.device_id = o.device_id;
    co.num_threads = o.num_threads;
    co.stream = e->dev.stream;
    st = ot_context_create(&co, &e->ctx);
    if (st != OT_OK) st = ote_op_error(st, "engine");
  }
  if (st != OT_OK) {
    ote_dev_stream_destroy(&e->dev);
    free(e->graph), free(e->warm), free(e);
    return st;
  }
  if (o.offload && o.device_type == kDLCUDA) {
    st = ote_offload_init(e); /* before the weights: their pinned layer blocks */
    if (st != OT_OK) {
      ote_engine_destroy(e);
      return st;
    }
  }
  *out = e;
  return OT_OK;
}

static ot_status engine_finish(ote_engine *e) {
  const ote_config *c = &e->cfg;
  OTE_TRY(ote_kv_create(&e->kv, e->ctx, &e->dev, c->layers, e->opt.max_seqs, e->opt.max_len,
                        c->kv_heads, c->head_dim, e->opt.dtype, e->opt.kv_block_size));
  int S = e->opt.max_seqs;
  int32_t *cu = malloc(sizeof *cu * (size_t)(S + 1));
  if (!cu) return ote_error(OT_ERR_OOM, "engine: out of memory");
  for (int i = 0; i <= S; i++) cu[i] = i;
  ot_status st = ote_dev_alloc(&e->dev, sizeof *cu * (size_t)(S + 1), (void **)&e->cu_dec_dev);
  if (st == OT_OK) st = ote_dev_event_create(&e->dev, &e->tm_ev[0]);
  if (st == OT_OK) st = ote_dev_event_create(&e->dev, &e->tm_ev[1]);
  if (st == OT_OK) st = ote_dev_host_alloc(&e->dev, sizeof(int32_t) * (size_t)S, (void **)&e->next_h);
  if (st == OT_OK) st = ote_dev_upload(&e->dev, e->cu_dec_dev, cu, sizeof *cu * (size_t)(S + 1));
  free(cu);
  if (st == OT_OK && e->dev.dev.device_type != kDLCPU) { /* zero, as the fused argmax wants */
    static const uint64_t zero[2] = {0, 0};
    st = ote_dev_alloc(&e->dev, sizeof zero, &e->argmax_state);
    if (st == OT_OK) st = ote_dev_upload(&e->dev, e->argmax_state, zero, sizeof zero);
  }
  if (st == OT_OK && e->dev.dev.device_type != kDLCPU) {
    /* the attention + o_proj kernel's scratch: its grid barrier's counters (the first
     * OTE_AO_STATE_BYTES) zero */
    size_t n = ote_dev_attn_oproj_scratch(&e->dev, c->heads, c->kv_heads, c->head_dim);
    if (n) {
      static const unsigned char zero[OTE_AO_STATE_BYTES] = {0};
      st = ote_dev_alloc(&e->dev, n, &e->ao_scratch);
      if (st == OT_OK) st = ote_dev_upload(&e->dev, e->ao_scratch, zero, sizeof zero);
      if (st == OT_OK) e->ao_scratch_bytes = n;
    }
  }
  return st;
}

ot_status ote_engine_load(const char *dir, const ote_engine_options *opt, ote_engine **out) {
  *out = NULL;
  ote_config cfg;
  OTE_TRY(ote_config_load(dir, &cfg));
  ote_st_set set;
  OTE_TRY(ote_st_open_dir(&set, dir));
  ote_engine *e = NULL;
  ot_status st = engine_create(&cfg, opt, &e);
  if (st == OT_OK) st = ote_weights_load(e, &set, dir);
  ote_st_close(&set); /* the weights are copies: the mappings can go */
  if (st == OT_OK) st = engine_finish(e);
  if (st != OT_OK) {
    ote_engine_destroy(e);
    return st;
  }
  *out = e;
  return OT_OK;
}

ot_status ote_engine_random(const ote_config *cfg, uint64_t seed, const ote_engine_options *opt,
                            ote_engine **out) {
  *out = NULL;
  ote_engine *e = NULL;
  OTE_TRY(engine_create(cfg, opt, &e));
  ot_status st = ote_weights_random(e, seed);
  if (st == OT_OK) st = engine_finish(e);
  if (st != OT_OK) {
    ote_engine_destroy(e);
    return st;
  }
  *out = e;
  return OT_OK;
}

/* ---- the forward ---------------------------------------------------------------- */

#define OP(call, what, layer)                                                     \
  do {                                                                           \
    ot_status op_st_ = (call);                                                   \
    if (op_st_ != OT_OK) {                                                       \
      char op_what_[96];                                                         \
      snprintf(op_what_, sizeof op_what_, "engine: layer %d: %s", (layer), what); \
      return ote_op_error(op_st_, op_what_);                                     \
    }                                                                            \
  } while (0)

/* A failed engine call (not a public op: its message is the engine's, ote_error's -- a CUDA
 * error's text -- which OP's ote_op_error would replace with the library's stale
 * ot_last_error): the layer and what put before it. */
static ot_status eng_error(ot_status st, int layer, const char *what) {
  char msg[512];
  const char *m = ote_last_error();
  snprintf(msg, sizeof msg, "%s", strncmp(m, "engine: ", 8) == 0 ? m + 8 : m);
  return ote_error(st, "engine: layer %d: %s: %s", layer, what, msg);
}
#define ENG(call, what, layer)                                         \
  do {                                                                 \
    ot_status eng_st_ = (call);                                        \
    if (eng_st_ != OT_OK) return eng_error(eng_st_, (layer), (what)); \
  } while (0)

static ot_status rmsnorm(ote_engine *e, void *x, void *residual, void *weight, void *out,
                         int64_t rows, int layer, const char *what) {
  const ote_config *c = &e->cfg;
  int64_t xs[2] = {rows, c->hidden}, ws[1] = {c->hidden};
  ote_view vx, vr, vw, vo;
  ote_view_set(&vx, &e->dev, x, e->opt.dtype, 2, xs, NULL);
  ote_view_set(&vw, &e->dev, weight, e->opt.dtype, 1, ws, NULL);
  ote_view_set(&vo, &e->dev, out, e->opt.dtype, 2, xs, NULL);
  if (residual) ote_view_set(&vr, &e->dev, residual, e->opt.dtype, 2, xs, NULL);
  OP(ot_rmsnorm_forward(e->ctx, &vx.t, residual ? &vr.t : NULL, &vw.t, c->rms_eps, &vo.t,
                        residual ? &vr.t : NULL, NULL),
     what, layer);
  return OT_OK;
}

/* y [rows, n] = x [rows, k] W^T (+ b) */
static ot_status linear(ote_engine *e, void *x, int64_t rows, int64_t k, void *w, void *b, int64_t n,
                        void *y, int layer, const char *what) {
  int64_t xs[2] = {rows, k}, wsh[2] = {n, k}, bs[1] = {n}, ys[2] = {rows, n};
  ote_view vx, vw, vb, vy;
  ote_view_set(&vx, &e->dev, x, e->opt.dtype, 2, xs, NULL);
  ote_view_set(&vw, &e->dev, w, e->opt.dtype, 2, wsh, NULL);
  ote_view_set(&vy, &e->dev, y, e->opt.dtype, 2, ys, NULL);
  if (b) ote_view_set(&vb, &e->dev, b, e->opt.dtype, 1, bs, NULL);
  OP(ot_linear_forward(e->ctx, &vx.t, &vw.t, b ? &vb.t : NULL, &vy.t), what, layer);
  return OT_OK;
}

static ot_rope_params rope_params(const ote_config *c) {
  ot_rope_params p = ot_rope_default_params();
  p.mode = OT_ROPE_NEOX;
  p.theta = c->rope_theta;
  if (c->rope_llama3_factor > 0) {
    p.llama3_factor = c->rope_llama3_factor;
    p.llama3_low_freq_factor = c->rope_low_freq_factor;
    p.llama3_high_freq_factor = c->rope_high_freq_factor;
    p.llama3_original_max_position = c->rope_original_max_position;
  }
  return p;
}

/* The batch of one forward: n sequences, T tokens, rows cu[i] .. cu[i+1] of sequence i
 * (host); prefill: fresh sequences (cu_dev holds cu); decode: one token each, and
 * kv_ready: the decode attention's paged_kv_ready (attention_block; OTE_PAGED_KV_READY,
 * read once a step, not per layer). */
typedef struct batch {
  int n, T;
  const int *seq;
  const int32_t *cu;
  int prefill;
  int kv_ready;
} batch;

/* The fused decode's settings (fused_body), read once a forward, not a call: a decode graph
 * keeps what its capture read. 0 / 1 / 2: off / where the shape fits / must run (a shape
 * that does not fit is an error, the tests' proof that the kernel ran). */
typedef struct fused_opts {
  int waves;      /* OTE_FUSED_WAVES: the fused kernel's blocks, at most that many waves */
  int blocks;     /* OTE_FUSED_BLOCKS: at most that many blocks (CTAs) of each kernel, 0 no cap */
  int oproj_must; /* OTE_FUSED_OPROJ=2: the staged o_proj (attention_block) */
  int qkv;        /* OTE_FUSED_QKV: qkv on the rowblock kernel (fused_norm_linear) */
  int gateup;     /* OTE_FUSED_GATEUP: gate_up on the rowblock kernel (fused_norm_linear) */
  int rb_depth;   /* OTE_FUSED_RB_DEPTH: their rows in flight a thread, 4 (else 8) */
  int down_depth; /* OTE_FUSED_DOWN_DEPTH: the rowblock down_proj's, 2 (else 4) */
  int down_must;  /* OTE_FUSED_DOWN=2 (FUSE_DOWN: on with 1 or 2) */
  /* the staged o_proj's L2 prefetch (attention_block; fused_kernels.h l2_pf), in MB:
   * OTE_L2_PF_GATEUP the first features' gate and up rows of the same layer's gate_up
   * (the rows its fused kernel reads first), OTE_L2_PF_QKV the first rows of the next
   * layer's qkv; OTE_L2_PF_LAST=1: kept with the evict-last policy. OTE_L2_PF_OPROJ=1 / 2:
   * the fused qkv kernel prefetches the same layer's whole o_proj weight at its end / at
   * its start (the staged kernel's CTAs all load at once: a part would speed none of them
   * up) */
  int pf_gateup, pf_qkv, pf_last, pf_oproj;
  /* the attention + o_proj kernel (attention_block, FUSE_AO): OTE_FUSED_ATTN_OPROJ=2 it
   * must run; OTE_ATTN_OPROJ_BLOCKS at most that many CTAs, OTE_ATTN_OPROJ_SMEM_ROWS at
   * most that many rows of o_proj's weight a CTA in shared memory (tests),
   * OTE_ATTN_OPROJ_SPLITS at most that many key ranges a kv head */
  int ao_must, ao_blocks, ao_smem_rows, ao_splits;
} fused_opts;

/* A non-negative integer from the environment, or def when unset / not a number. */
static long long env_ll(const char *name, long long def) {
  const char *v = getenv(name);
  if (!v || !*v) return def;
  char *end = NULL;
  long long x = strtoll(v, &end, 10);
  return end && !*end && x >= 0 ? x : def;
}

/* ---- per-op profile ---------------------------------------------------------------- */

/* An event after the op of `kind` (profile on, CUDA); errors only cost the sample. */
static void prof_mark(ote_engine *e, int kind) {
  if (!e->prof_on || e->prof_n >= e->prof_cap) return;
  if (ote_dev_event_record(&e->dev, e->prof_ev[e->prof_n]) != OT_OK) return;
  e->prof_kind[e->prof_n++] = (unsigned char)kind;
}

/* The forward's op times into the sums (after the stream synchronized). */
static void prof_collect(ote_engine *e) {
  if (!e->prof_on || e->prof_n < 2) return;
  for (int i = 1; i < e->prof_n; i++)
    e->prof_ms[e->prof_phase][e->prof_kind[i]] += ote_dev_event_ms(e->prof_ev[i - 1], e->prof_ev[i]);
  e->prof_forwards[e->prof_phase]++;
  e->prof_n = 0;
}

ot_status ote_engine_set_profile(ote_engine *e, int on) {
  if (!e) return ote_error(OT_ERR_INVALID_ARGUMENT, "ote_engine_set_profile: NULL engine");
  if (e->dev.dev.device_type == kDLCPU) return OT_OK; /* stays off: nothing to time */
  if (on && !e->prof_ev) {
    /* every event or none: a profile that ran out of events would drop ops silently */
    int cap = 13 * e->cfg.layers + 32;
    e->prof_ev = calloc((size_t)cap, sizeof *e->prof_ev);
    e->prof_kind = calloc((size_t)cap, 1);
    ot_status st = e->prof_ev && e->prof_kind
                       ? OT_OK
                       : ote_error(OT_ERR_OOM, "ote_engine_set_profile: out of host memory");
    for (int i = 0; st == OT_OK && i < cap; i++) {
      st = ote_dev_event_create(&e->dev, &e->prof_ev[i]);
      if (st == OT_OK) e->prof_cap = i + 1;
    }
    if (st != OT_OK) {
      char msg[512];
      snprintf(msg, sizeof msg, "%s", ote_last_error());
      prof_free(e);
      e->prof_on = 0;
      return ote_error(st, "ote_engine_set_profile: the profile stays off: %s", msg);
    }
  }
  const ot_status sync = ote_dev_sync(&e->dev); /* its reason in ote_last_error */
  if (sync != OT_OK) {
    e->prof_on = 0; /* off, as engine.h says: not left on when turning it off failed */
    return sync;
  }
  drop_graphs(e); /* profiled steps run eagerly; graphs are captured again after */
  memset(e->prof_ms, 0, sizeof e->prof_ms);
  memset(e->prof_forwards, 0, sizeof e->prof_forwards);
  e->prof_n = 0;
  e->prof_on = on && e->prof_cap > 0;
  return OT_OK;
}

void ote_engine_profile_report(const ote_engine *e, char *buf, size_t len) {
  static const char *names[OTE_PROF_KINDS] = {"embed+inputs", "rmsnorm", "qkv_proj", "rope+kv_append",
                                              "attention", "o_proj", "gate_up_proj", "swiglu",
                                              "down_proj", "final norm+lm_head", "other",
                                              "kv_append"};
  if (!e || !buf || !len) return;
  size_t o = 0;
  buf[0] = 0;
  for (int p = 0; p < 2; p++) {
    int n = e->prof_forwards[p];
    if (!n) continue;
    double tot = 0;
    for (int k = 0; k < OTE_PROF_KINDS; k++) tot += e->prof_ms[p][k];
    int w = snprintf(buf + o, len - o, "%s%s, ms per forward (mean of %d): total %.3f",
                     o ? "\n" : "", p ? "decode" : "prefill", n, tot / n);
    if (w < 0 || (size_t)w >= len - o) return;
    o += (size_t)w;
    for (int k = 0; k < OTE_PROF_KINDS; k++) {
      w = snprintf(buf + o, len - o, "; %s %.3f", names[k], e->prof_ms[p][k] / n);
      if (w < 0 || (size_t)w >= len - o) return;
      o += (size_t)w;
    }
  }
}

/* appended: the decode step's RoPE and KV append were done by the fused qkv kernel;
 * staged (not NULL: fused_body's FUSE_OPROJ): o_proj on the staged kernel, at most
 * staged->blocks CTAs, where its shape fits (staged->oproj_must: else an error, a test's
 * proof that it ran) */
/* The staged o_proj's L2 prefetch ranges (fused_opts pf_*, fused_kernels.h l2_pf): the
 * first f features' gate rows [0, f) and up rows [F, F + f) of layer l's gate_up (its fused
 * kernel's first tasks), and the first rows of layer l + 1's qkv; each clamped to its
 * weight. */
static void staged_prefetch(const ote_engine *e, int l, const ote_layer_weights *w,
                            const fused_opts *fo, ote_fused_gemv_args *a) {
  const ote_config *c = &e->cfg;
  const int64_t row = (int64_t)c->hidden * (int64_t)ote_dtype_size(e->opt.dtype);
  const int64_t F = c->ffn, cols = (int64_t)(c->heads + 2 * c->kv_heads) * c->head_dim;
  int64_t f = ((int64_t)fo->pf_gateup << 20) / 2 / row;
  if (f > F) f = F;
  if (f > 0) {
    a->l2_pf[0] = w->gate_up;
    a->l2_pf[1] = (const char *)w->gate_up + F * row;
    a->l2_pf_bytes[0] = a->l2_pf_bytes[1] = f * row;
  }
  int64_t q = ((int64_t)fo->pf_qkv << 20) / row;
  if (q > cols) q = cols;
  if (q > 0 && l + 1 < c->layers) {
    a->l2_pf[2] = e->w.layer[l + 1].qkv;
    a->l2_pf_bytes[2] = q * row;
  }
  a->l2_pf_last = fo->pf_last;
}

/* A DLTensor's first element (data + byte_offset), for the kernels' raw pointers */
static void *dl_data(const DLTensor *t) { return (char *)t->data + t->byte_offset; }

/* The batch-1 decode's attention and o_proj by one kernel (ote_dev_attn_oproj): OT_OK with
 * *done 0 where it does not fit (a model or a device it does not take; an error when
 * ao->ao_must) */
static ot_status attn_oproj(ote_engine *e, int l, const ote_layer_weights *w,
                            const ot_paged_kv *kv, const ot_attention_params *ap, int kv_ready,
                            const fused_opts *ao, int *done) {
  const ote_config *c = &e->cfg;
  *done = 0;
  ote_attn_oproj_args a;
  memset(&a, 0, sizeof a);
  a.q = e->qkv;
  a.k_pages = dl_data(kv->k_pages);
  a.v_pages = dl_data(kv->v_pages);
  a.indptr = dl_data(kv->indptr);
  a.indices = dl_data(kv->indices);
  a.last_page_len = dl_data(kv->last_page_len);
  a.hq = c->heads;
  a.hkv = c->kv_heads;
  a.head_dim = c->head_dim;
  a.block_size = (int)kv->k_pages->shape[2];
  a.scale = ap->softmax_scale > 0 ? ap->softmax_scale : 1.0f / sqrtf((float)c->head_dim);
  a.window_left = ap->window_left;
  a.kv_ready = kv_ready;
  a.attn = e->attn;
  a.w = w->o;
  a.bias = w->o_bias;
  a.y = e->delta;
  a.N = c->hidden;
  a.scratch = e->ao_scratch;
  a.scratch_bytes = e->ao_scratch_bytes;
  a.max_blocks = ao->ao_blocks;
  a.smem_rows_cap = ao->ao_smem_rows;
  a.max_splits = ao->ao_splits;
  if (e->ao_scratch && ap->softcap == 0.0f)
    ENG(ote_dev_attn_oproj(&e->dev, &a, e->opt.dtype, done), "attention + o_proj", l);
  if (!*done && ao->ao_must)
    return ote_error(OT_ERR_UNSUPPORTED, "engine: layer %d: OTE_FUSED_ATTN_OPROJ=2 and the "
                     "attention + o_proj kernel does not take this model or device", l);
  return OT_OK;
}

static ot_status attention_block(ote_engine *e, const batch *b, int l,
                                 const ote_layer_weights *w, int appended,
                                 const fused_opts *staged, const fused_opts *ao) {
  const ote_config *c = &e->cfg;
  size_t es = ote_dtype_size(e->opt.dtype);
  int64_t D = c->head_dim, Hq = c->heads, Hkv = c->kv_heads, cols = (Hq + 2 * Hkv) * D;
  char *qkv = e->qkv;
  /* q / k / v: strided views of the fused projection's output */
  int64_t qs[3] = {b->T, Hq, D}, ks[3] = {b->T, Hkv, D}, st3[3] = {cols, D, 1}, ps[1] = {b->T};
  int64_t cs[1] = {b->n + 1};
  ote_view vq, vk, vv, vpos, vcu, vo;
  ote_view_set(&vq, &e->dev, qkv, e->opt.dtype, 3, qs, st3);
  ote_view_set(&vk, &e->dev, qkv + (size_t)(Hq * D) * es, e->opt.dtype, 3, ks, st3);
  ote_view_set(&vv, &e->dev, qkv + (size_t)((Hq + Hkv) * D) * es, e->opt.dtype, 3, ks, st3);
  ote_view_set(&vcu, &e->dev, b->prefill ? e->cu_dev : e->cu_dec_dev, OTE_I32, 1, cs, NULL);
  ote_view_set(&vo, &e->dev, e->attn, e->opt.dtype, 3, qs, NULL);
  ot_rope_params rp = rope_params(c);
  ot_paged_kv kv;
  ote_kv_paged(&e->kv, l, &kv);
  ot_attention_params ap = ot_attention_default_params();
  ap.causal = 1;
  if (c->sliding_window > 0) ap.window_left = c->sliding_window - 1;

  if (b->prefill) {
    /* fresh sequences: rotate q and k in place, store k and v in their pages, and attend
     * over each prompt's own tokens, packed */
    ote_view_set(&vpos, &e->dev, e->positions_dev, OTE_I32, 1, ps, NULL);
    if (e->rope_kv_split) { /* OTE_PREFILL_ROPE_KV=0: the two ops */
      OP(ot_rope_forward(e->ctx, &rp, &vq.t, &vk.t, &vpos.t, NULL, &vq.t, &vk.t), "rope", l);
      prof_mark(e, OTE_PROF_ROPE_KV); /* here the profile's "rope+kv_append" is RoPE alone */
      OP(ot_kv_append(e->ctx, &kv, &vcu.t, &vk.t, &vv.t, NULL, NULL, NULL, NULL), "kv append", l);
      prof_mark(e, OTE_PROF_KV_PREFILL);
    } else {
      /* the default: q and k rotated in place (the attention below reads them there) and
       * k, v stored in their pages, one kernel: q, k and v read once (H100, 2026-12-07: TTFT
       * -0.44 ms paired against the two ops, docs/PERFORMANCE.md) */
      OP(ot_rope_kv_append(e->ctx, &rp, &kv, &vcu.t, &vk.t, &vv.t, &vpos.t, &vq.t, &vq.t, &vk.t),
         "rope + kv append", l);
      prof_mark(e, OTE_PROF_ROPE_KV);
    }
    if (b->n == 1) {
      /* one prompt: the dense [1, T, H, D] layout over the same strided memory, which the
       * library's Hopper kernel takes (varlen runs the portable one) */
      int64_t q4[4] = {1, b->T, Hq, D}, k4[4] = {1, b->T, Hkv, D};
      int64_t s4[4] = {b->T * cols, cols, D, 1};
      ote_view dq, dk, dv, dout;
      ote_view_set(&dq, &e->dev, qkv, e->opt.dtype, 4, q4, s4);
      ote_view_set(&dk, &e->dev, qkv + (size_t)(Hq * D) * es, e->opt.dtype, 4, k4, s4);
      ote_view_set(&dv, &e->dev, qkv + (size_t)((Hq + Hkv) * D) * es, e->opt.dtype, 4, k4, s4);
      ote_view_set(&dout, &e->dev, e->attn, e->opt.dtype, 4, q4, NULL);
      OP(ot_attention_forward(e->ctx, &ap, &dq.t, &dk.t, &dv.t, NULL, NULL, &dout.t, NULL),
         "attention (prefill)", l);
    } else {
      OP(ot_attention_forward(e->ctx, &ap, &vq.t, &vk.t, &vv.t, &vcu.t, &vcu.t, &vo.t, NULL),
         "attention (prefill)", l);
    }
    prof_mark(e, OTE_PROF_ATTN);
  } else {
    /* one token per sequence: RoPE fused into the append (positions from the page
     * table), then the batch's queries against its pages in one call */
    if (!appended) {
      OP(ot_kv_append(e->ctx, &kv, &vcu.t, &vk.t, &vv.t, &rp, NULL, &vq.t, &vq.t), "kv append",
         l);
      prof_mark(e, OTE_PROF_ROPE_KV);
    }
    /* the early start (ot_attention_params.paged_kv_ready): the page table is copied at
     * the step's start, before layer 0, and no kernel of the step rewrites it; the cached
     * rows but the new token's were written by earlier steps; and the kernel just before
     * (the fused qkv, or ot_kv_append, which never signals) starts its dependents only
     * after its own griddepcontrol.wait. OTE_PAGED_KV_READY=0: off (b->kv_ready). */
    ap.paged_kv_ready = b->kv_ready;
    if (ao && b->n == 1) { /* FUSE_AO: the attention, its merge and o_proj in one kernel */
      int done = 0;
      OTE_TRY(attn_oproj(e, l, w, &kv, &ap, b->kv_ready, ao, &done));
      if (done) {
        prof_mark(e, OTE_PROF_ATTN);
        prof_mark(e, OTE_PROF_O);
        return OT_OK;
      }
    }
    OP(ot_paged_attention(e->ctx, &ap, &vq.t, &vcu.t, &kv, &vo.t, NULL), "paged attention", l);
    prof_mark(e, OTE_PROF_ATTN);
  }
  if (staged) { /* one row: W loaded on chip before the attention's end (fused_kernels.cu) */
    ote_fused_gemv_args a;
    memset(&a, 0, sizeof a);
    a.w = w->o;
    a.N = c->hidden;
    a.K = Hq * D;
    a.bias = w->o_bias;
    a.x = e->attn;
    a.y = e->delta;
    a.max_blocks = staged->blocks;
    staged_prefetch(e, l, w, staged, &a);
    int done = 0;
    ENG(ote_dev_staged_gemv(&e->dev, &a, e->opt.dtype, &done), "o_proj", l);
    if (done) {
      prof_mark(e, OTE_PROF_O);
      return OT_OK;
    }
    if (staged->oproj_must)
      return ote_error(OT_ERR_UNSUPPORTED, "engine: layer %d: o_proj: OTE_FUSED_OPROJ=2 and its "
                       "shape does not fit the staged kernel", l);
  }
  OTE_TRY(linear(e, e->attn, b->T, Hq * D, w->o, w->o_bias, c->hidden, e->delta, l, "o_proj"));
  prof_mark(e, OTE_PROF_O);
  return OT_OK;
}

/* mlp = swiglu(gate_up); delta = mlp Wdown^T */
static ot_status swiglu_down(ote_engine *e, const batch *b, int l, const ote_layer_weights *w) {
  const ote_config *c = &e->cfg;
  int64_t F = c->ffn, gs[2] = {b->T, 2 * F}, ms[2] = {b->T, F};
  ote_view vg, vm;
  ote_view_set(&vg, &e->dev, e->gate_up, e->opt.dtype, 2, gs, NULL);
  ote_view_set(&vm, &e->dev, e->mlp, e->opt.dtype, 2, ms, NULL);
  OP(ot_glu_forward(e->ctx, OT_GLU_SWIGLU, &vg.t, NULL, &vm.t), "swiglu", l);
  prof_mark(e, OTE_PROF_SWIGLU);
  OTE_TRY(linear(e, e->mlp, b->T, F, w->down, NULL, c->hidden, e->delta, l, "down_proj"));
  return OT_OK;
}

/* ---- fused one-row linears (batch-1 decode, CUDA; fused_kernels.cu) ------------------- */

enum {
  FUSE_NORM = 1, FUSE_SWIGLU = 2, FUSE_ROPE = 4, FUSE_PAIR = 8, FUSE_GLU = 16, FUSE_OPROJ = 32,
  FUSE_DOWN = 64, FUSE_AO = 128
};

static int aligned16(const void *p) { return ((uintptr_t)p & 15u) == 0; }

/* Which fusions this forward takes: a decode step of one sequence on CUDA in bf16 / fp16
 * with resident weights, 16-byte aligned rows; OTE_FUSED_NORM=0 / OTE_FUSED_ROPE=0 /
 * OTE_FUSED_GLU=0 turn one off, OTE_FUSED_SWIGLU=1 one on (read per forward: a decode
 * graph keeps what its capture took). FUSE_NORM: the residual add + RMSNorm into qkv,
 * gate_up and lm_head (and the greedy argmax into lm_head); FUSE_ROPE (with FUSE_NORM):
 * RoPE of q and k and the KV append into qkv (whole-head RoPE, even head_dim); FUSE_GLU
 * (with FUSE_NORM): the SwiGLU into gate_up's epilogue (down_proj then the library's
 * linear); FUSE_SWIGLU (opt-in, instead of FUSE_GLU): the SwiGLU into down_proj;
 * FUSE_PAIR (OTE_FUSED_PAIR=0: off): each warp of the fused kernels takes two adjacent
 * rows of W at a time instead of one. FUSE_OPROJ (OTE_FUSED_OPROJ=0: off): o_proj on the
 * staged kernel (its weight loaded into registers and shared memory before its PDL wait,
 * during the attention), where its shape fits. FUSE_DOWN (opt-in, OTE_FUSED_DOWN=1; only
 * with the SwiGLU in gate_up's epilogue: FUSE_NORM and FUSE_GLU, not FUSE_SWIGLU, else
 * ignored; =2 then an error, fused_settings_check): down_proj on the rowblock kernel (K
 * split over a CTA, no split-K reduce kernel) with the residual add folded in, where its
 * shape fits. The kernels hold their input row in shared memory, up to 96 KB of it: hidden
 * float32 values for the norm's (every fusion needs those), ffn 16-bit values for
 * down_proj's (FUSE_SWIGLU, dropped when the ffn is too wide). */
static int swiglu_taken(const ote_config *c) { /* OTE_FUSED_SWIGLU=1, not too wide an ffn */
  return env_ll("OTE_FUSED_SWIGLU", 0) && (size_t)c->ffn * 2 <= (96u << 10);
}

static int fuse_mode(const ote_engine *e, const batch *b) {
  const ote_config *c = &e->cfg;
  if (e->dev.dev.device_type == kDLCPU || b->prefill || b->T != 1 || e->off.on ||
      ote_dtype_size(e->opt.dtype) != 2 || c->hidden % 8 || c->ffn % 8 || !e->argmax_state ||
      (size_t)c->hidden * 4 > (96u << 10))
    return 0;
  int m = (env_ll("OTE_FUSED_NORM", 1) ? FUSE_NORM : 0) |
          (swiglu_taken(c) ? FUSE_SWIGLU : 0) |
          (env_ll("OTE_FUSED_GLU", 1) ? FUSE_GLU : 0) |
          (env_ll("OTE_FUSED_ROPE", 1) && c->head_dim % 2 == 0 ? FUSE_ROPE : 0) |
          (env_ll("OTE_FUSED_PAIR", 1) ? FUSE_PAIR : 0) |
          (env_ll("OTE_FUSED_OPROJ", 1) ? FUSE_OPROJ : 0) |
          (env_ll("OTE_FUSED_DOWN", 0) ? FUSE_DOWN : 0) |
          (env_ll("OTE_FUSED_ATTN_OPROJ", 0) ? FUSE_AO : 0);
  int ok = aligned16(e->w.final_norm) && aligned16(e->w.lm_head);
  for (int l = 0; ok && l < c->layers; l++) {
    const ote_layer_weights *w = &e->w.layer[l];
    ok = aligned16(w->attn_norm) && aligned16(w->qkv) && aligned16(w->mlp_norm) &&
         aligned16(w->gate_up) && aligned16(w->down);
  }
  ok = ok && aligned16(e->x_res) && aligned16(e->last_res) && aligned16(e->delta) &&
       aligned16(e->gate_up);
  /* (FUSE_OPROJ: the staged kernel declines an unaligned Wo or attn itself, fused_kernels.cu
   * staged_grid: the library's linear then, an error with OTE_FUSED_OPROJ=2) */
  return ok ? m : 0;
}

/* A rowblock kernel that must run (OTE_FUSED_QKV / _GATEUP / _DOWN = 2) while another
 * switch turns off the fused form it is part of -- the rowblock qkv is the fused norm + qkv
 * + RoPE + KV append's (OTE_FUSED_NORM, OTE_FUSED_ROPE), the rowblock gate_up and down_proj
 * go with gate_up's SwiGLU epilogue (OTE_FUSED_NORM, OTE_FUSED_GLU, and OTE_FUSED_SWIGLU=1
 * where fuse_mode takes it): an error naming both, on every device (the settings contradict
 * each other whatever runs), before a decode call changes anything. Read every call (a
 * graph replay reads no other setting); none at 2, the common case, is three getenv calls. */
static ot_status fused_settings_check(const ote_engine *e, const char *what) {
  static const char *const var[3] = {"OTE_FUSED_QKV", "OTE_FUSED_GATEUP", "OTE_FUSED_DOWN"};
  static const char *const kernel[3] = {"qkv", "gate_up", "down_proj"};
  for (int i = 0; i < 3; i++) {
    if (env_ll(var[i], 0) != 2) continue;
    const char *off = NULL, *form = NULL;
    if (!env_ll("OTE_FUSED_NORM", 1)) {
      off = "OTE_FUSED_NORM=0", form = "the fused norm-fed projections";
    } else if (i == 0 && !env_ll("OTE_FUSED_ROPE", 1)) {
      off = "OTE_FUSED_ROPE=0", form = "the fused qkv + RoPE + KV append";
    } else if (i > 0 && !env_ll("OTE_FUSED_GLU", 1)) {
      off = "OTE_FUSED_GLU=0", form = "gate_up's SwiGLU epilogue";
    } else if (i > 0 && swiglu_taken(&e->cfg)) {
      off = "OTE_FUSED_SWIGLU=1", form = "gate_up's SwiGLU epilogue";
    }
    if (off)
      return ote_error(OT_ERR_INVALID_ARGUMENT,
                       "%s: %s=2 says the rowblock %s must run, but %s turns off %s, which it "
                       "is part of: unset one of them", what, var[i], kernel[i], off, form);
  }
  return OT_OK;
}

/* y [1, N] = rmsnorm(delta + res) W^T (+ b) in one kernel (delta NULL: rmsnorm(res)); h =
 * delta + res to res_out when not NULL; argmax_out: y's argmax too; rope_layer >= 0: y is
 * that layer's qkv, with RoPE and the KV append done in the kernel; glu_out: y is gate_up,
 * and glu_out receives its SwiGLU instead (fused_kernels.h). */
static ot_status fused_norm_linear(ote_engine *e, const void *delta, const void *res,
                                   void *res_out, const void *gamma, const void *w,
                                   const void *bias, int64_t N, void *y, int32_t *argmax_out,
                                   void *glu_out, int rope_layer, int pair,
                                   const fused_opts *fo, int layer, const char *what) {
  ote_fused_gemv_args a;
  memset(&a, 0, sizeof a);
  a.w = w;
  a.N = N;
  a.K = e->cfg.hidden;
  a.bias = bias;
  a.y = y;
  a.delta = delta;
  a.res = res;
  a.gamma = gamma;
  a.res_out = res_out;
  a.eps = e->cfg.rms_eps;
  a.pair_rows = pair;
  a.max_waves = fo->waves;
  a.max_blocks = fo->blocks;
  a.glu_out = glu_out;
  if (argmax_out) {
    a.argmax_out = argmax_out;
    a.argmax_key = (unsigned long long *)e->argmax_state;
    a.argmax_count = (unsigned int *)((char *)e->argmax_state + 8);
  }
  if (rope_layer >= 0) {
    const ote_config *c = &e->cfg;
    const ot_rope_params rp = rope_params(c);
    ot_paged_kv kv;
    ote_kv_paged(&e->kv, rope_layer, &kv);
    a.rope = 1;
    a.hq = c->heads;
    a.hkv = c->kv_heads;
    a.head_dim = c->head_dim;
    a.block_size = (int)kv.k_pages->shape[2];
    a.k_pages = dl_data(kv.k_pages);
    a.v_pages = dl_data(kv.v_pages);
    a.indptr = dl_data(kv.indptr);
    a.indices = dl_data(kv.indices);
    a.last_page_len = dl_data(kv.last_page_len);
    a.theta = rp.theta;
    a.l3_factor = rp.llama3_factor > 0 ? rp.llama3_factor : 0;
    a.l3_low = rp.llama3_low_freq_factor;
    a.l3_high = rp.llama3_high_freq_factor;
    a.l3_orig = rp.llama3_original_max_position;
  }
  if (fo->pf_oproj && layer >= 0 && layer < e->cfg.layers && w == e->w.layer[layer].qkv) {
    a.l2_pf[0] = e->w.layer[layer].o; /* OTE_L2_PF_OPROJ: this layer's o_proj, whole */
    a.l2_pf_bytes[0] = (int64_t)e->cfg.hidden * e->cfg.heads * e->cfg.head_dim *
                       (int64_t)ote_dtype_size(e->opt.dtype);
    a.l2_pf_last = fo->pf_last;
    a.l2_pf_early = fo->pf_oproj == 2;
  }
  /* qkv (rope) or gate_up (glu_out) on the rowblock kernel (fused_kernels.cu) where asked
   * (OTE_FUSED_QKV / OTE_FUSED_GATEUP: 1 where it fits, 2 must run) */
  const int rb = rope_layer >= 0 ? fo->qkv : glu_out ? fo->gateup : 0;
  if (rb) {
    int done = 0;
    a.depth = fo->rb_depth;
    ENG(ote_dev_rowblock_gemv(&e->dev, &a, e->opt.dtype, &done), what, layer);
    if (done) return OT_OK;
    if (rb == 2)
      return ote_error(OT_ERR_UNSUPPORTED, "engine: layer %d: %s: OTE_FUSED_%s=2 and its shape "
                       "does not fit the rowblock kernel", layer, what,
                       rope_layer >= 0 ? "QKV" : "GATEUP");
  }
  ENG(ote_dev_fused_gemv(&e->dev, &a, e->opt.dtype, 0), what, layer);
  return OT_OK;
}

/* down_proj on the rowblock kernel (FUSE_DOWN): res = round(mlp Wd^T) + res rounded, in
 * place (fused_kernels.h); *done 0 when the shape does not fit it (an error when must) */
static ot_status rowblock_down(ote_engine *e, const ote_layer_weights *w, void *res, int depth,
                               int max_blocks, int must, int l, int *done) {
  ote_fused_gemv_args a;
  memset(&a, 0, sizeof a);
  a.w = w->down;
  a.N = e->cfg.hidden;
  a.K = e->cfg.ffn;
  a.x = e->mlp;
  a.y = res;
  a.res = res;
  a.max_blocks = max_blocks;
  a.depth = depth;
  ENG(ote_dev_rowblock_gemv(&e->dev, &a, e->opt.dtype, done), "down_proj + residual", l);
  if (!*done && must)
    return ote_error(OT_ERR_UNSUPPORTED, "engine: layer %d: down_proj: OTE_FUSED_DOWN=2 and its "
                     "shape does not fit the rowblock kernel", l);
  return OT_OK;
}

/* The fused forms of one decode step's sublayers (fuse_mode), with the residual stream
 * ping-ponging between x_res and last_res (the fused kernel reads it in every block and
 * writes the sum in one: not in place); pending: e->delta holds a sublayer's output not
 * yet added to res (not after the rowblock down_proj, which adds it in place) */
static ot_status fused_body(ote_engine *e, const batch *b, int fuse, int argmax) {
  const ote_config *c = &e->cfg;
  int64_t F = c->ffn, cols = (int64_t)(c->heads + 2 * c->kv_heads) * c->head_dim;
  void *res = e->x_res, *res2 = e->last_res;
  const int pair = (fuse & FUSE_PAIR) != 0;
  const fused_opts fo = {(int)env_ll("OTE_FUSED_WAVES", 2),
                         (int)env_ll("OTE_FUSED_BLOCKS", 0),
                         env_ll("OTE_FUSED_OPROJ", 1) == 2,
                         (int)env_ll("OTE_FUSED_QKV", 0),
                         (int)env_ll("OTE_FUSED_GATEUP", 0),
                         (int)env_ll("OTE_FUSED_RB_DEPTH", 8),
                         (int)env_ll("OTE_FUSED_DOWN_DEPTH", 4),
                         env_ll("OTE_FUSED_DOWN", 0) == 2,
                         (int)env_ll("OTE_L2_PF_GATEUP", 0),
                         (int)env_ll("OTE_L2_PF_QKV", 0),
                         env_ll("OTE_L2_PF_LAST", 0) == 1,
                         (int)env_ll("OTE_L2_PF_OPROJ", 0),
                         env_ll("OTE_FUSED_ATTN_OPROJ", 0) == 2,
                         (int)env_ll("OTE_ATTN_OPROJ_BLOCKS", 0),
                         (int)env_ll("OTE_ATTN_OPROJ_SMEM_ROWS", 0),
                         (int)env_ll("OTE_ATTN_OPROJ_SPLITS", 0)};
  /* the SwiGLU in gate_up's epilogue (not with the fused down_proj, which takes gate_up) */
  const int glu = (fuse & FUSE_NORM) && (fuse & FUSE_GLU) && !(fuse & FUSE_SWIGLU);
  /* the rowblock down_proj (reads the SwiGLU row of gate_up's epilogue) */
  const int down = glu && (fuse & FUSE_DOWN);
  int pending = 0;
  for (int l = 0; l < c->layers; l++) {
    const ote_layer_weights *w = &e->w.layer[l];
    if (fuse & FUSE_NORM) {
      OTE_TRY(fused_norm_linear(e, pending ? e->delta : NULL, res, pending ? res2 : NULL,
                                w->attn_norm, w->qkv, w->qkv_bias, cols, e->qkv, NULL, NULL,
                                (fuse & FUSE_ROPE) ? l : -1, pair, &fo, l,
                                "input_layernorm + qkv_proj"));
      if (pending) {
        void *t = res;
        res = res2, res2 = t;
      }
    } else {
      OTE_TRY(rmsnorm(e, l ? e->delta : res, l ? res : NULL, w->attn_norm, e->normed, b->T, l,
                      "input_layernorm"));
      prof_mark(e, OTE_PROF_NORM);
      OTE_TRY(linear(e, e->normed, b->T, c->hidden, w->qkv, w->qkv_bias, cols, e->qkv, l,
                     "qkv_proj"));
    }
    prof_mark(e, OTE_PROF_QKV);
    OTE_TRY(attention_block(e, b, l, w, (fuse & FUSE_NORM) && (fuse & FUSE_ROPE),
                            (fuse & FUSE_OPROJ) ? &fo : NULL, (fuse & FUSE_AO) ? &fo : NULL));
    if (fuse & FUSE_NORM) {
      OTE_TRY(fused_norm_linear(e, e->delta, res, res2, w->mlp_norm, w->gate_up, NULL, 2 * F,
                                e->gate_up, NULL, glu ? e->mlp : NULL, -1, pair, &fo, l,
                                glu ? "post_attention_layernorm + gate_up_proj + swiglu"
                                    : "post_attention_layernorm + gate_up_proj"));
      void *t = res;
      res = res2, res2 = t;
    } else {
      OTE_TRY(rmsnorm(e, e->delta, res, w->mlp_norm, e->normed, b->T, l,
                      "post_attention_layernorm"));
      prof_mark(e, OTE_PROF_NORM);
      OTE_TRY(linear(e, e->normed, b->T, c->hidden, w->gate_up, NULL, 2 * F, e->gate_up, l,
                     "gate_up_proj"));
    }
    prof_mark(e, OTE_PROF_GATE_UP);
    pending = 1; /* down_proj's output in e->delta, unless the rowblock kernel added it */
    if (fuse & FUSE_SWIGLU) {
      ote_fused_gemv_args a;
      memset(&a, 0, sizeof a);
      a.w = w->down;
      a.N = c->hidden;
      a.K = F;
      a.y = e->delta;
      a.gate_up = e->gate_up;
      a.pair_rows = pair;
      a.max_waves = fo.waves;
      a.max_blocks = fo.blocks;
      ENG(ote_dev_fused_gemv(&e->dev, &a, e->opt.dtype, 1), "swiglu + down_proj", l);
    } else if (glu) {
      int done = 0;
      if (down)
        OTE_TRY(rowblock_down(e, w, res, fo.down_depth, fo.blocks, fo.down_must, l, &done));
      if (!done)
        OTE_TRY(linear(e, e->mlp, b->T, F, w->down, NULL, c->hidden, e->delta, l, "down_proj"));
      pending = !done;
    } else {
      OTE_TRY(swiglu_down(e, b, l, w));
    }
    prof_mark(e, OTE_PROF_DOWN);
  }
  if (fuse & FUSE_NORM) {
    OTE_TRY(fused_norm_linear(e, pending ? e->delta : NULL, res, NULL, e->w.final_norm,
                              e->w.lm_head, NULL, c->vocab, e->logits,
                              argmax ? e->argmax_dev : NULL, NULL, -1, pair, &fo, c->layers,
                              "final norm + lm_head"));
    prof_mark(e, OTE_PROF_HEAD);
  } else {
    OTE_TRY(rmsnorm(e, e->delta, res, e->w.final_norm, e->last_norm, b->n, c->layers,
                    "final norm"));
    OTE_TRY(linear(e, e->last_norm, b->n, c->hidden, e->w.lm_head, NULL, c->vocab, e->logits,
                   c->layers, "lm_head"));
    prof_mark(e, OTE_PROF_HEAD);
    if (argmax)
      OTE_TRY(ote_dev_argmax(&e->dev, e->argmax_dev, e->logits, e->opt.dtype, b->n, c->vocab));
  }
  if (argmax) {
    OTE_TRY(ote_dev_download_async(&e->dev, e->next_h, e->argmax_dev, (size_t)b->n * 4));
    prof_mark(e, OTE_PROF_OTHER);
  }
  return OT_OK;
}

/* OTE_PREFILL_FUSED_HEAD=1 (opt-in, CUDA): a one-prompt prefill's final norm + lm_head (and
 * greedy argmax) on the decode's fused kernel (fused_norm_linear), where it fits: 16-bit,
 * resident weights, the shapes fuse_mode takes, 16-byte aligned rows. Its numerics are the
 * fused decode's (the normalized row not rounded to the dtype before the product). */
static int prefill_fused_head(const ote_engine *e, const void *delta, const void *res) {
  const ote_config *c = &e->cfg;
  return env_ll("OTE_PREFILL_FUSED_HEAD", 0) == 1 && e->dev.dev.device_type != kDLCPU &&
         !e->off.on && ote_dtype_size(e->opt.dtype) == 2 && c->hidden % 8 == 0 &&
         (size_t)c->hidden * 4 <= (96u << 10) && e->argmax_state && aligned16(delta) &&
         aligned16(res) && aligned16(e->w.final_norm) && aligned16(e->w.lm_head);
}

/* Embedding lookup (ids already in tokens_dev) through the logits [n, V] in e->logits
 * (and, when argmax, the ids in argmax_dev): every op on the engine's stream, no host
 * synchronization -- the body of a decode graph. */
static ot_status forward_body(ote_engine *e, const batch *b, int argmax) {
  const ote_config *c = &e->cfg;
  size_t es = ote_dtype_size(e->opt.dtype), H = (size_t)c->hidden;
  int64_t F = c->ffn, cols = (int64_t)(c->heads + 2 * c->kv_heads) * c->head_dim;
  e->prof_phase = b->prefill ? 0 : 1;
  if (e->prof_on) { /* the host enqueues the forward while the GPU waits */
    e->prof_n = 0;
    /* OTE_PROFILE_SPIN_NS=0: no spin -- the ops timed as the host enqueues them, launch
     * gaps included (a diagnostic: what a TTFT call sees) */
    long long spin = env_ll("OTE_PROFILE_SPIN_NS", 8000000);
    if (spin > 0) OTE_TRY(ote_dev_spin(&e->dev, spin));
    prof_mark(e, OTE_PROF_OTHER);
  }
  if (!b->prefill) /* the step's token ids and page table: one copy from the pinned block */
    OTE_TRY(ote_kv_push(&e->kv, &e->dev, b->n));
  OTE_TRY(ote_dev_embed(&e->dev, e->x_res, e->w.embed, b->prefill ? e->tokens_dev : e->kv.tok_d,
                        b->T, H * es));
  prof_mark(e, OTE_PROF_EMBED);
  const int fuse = fuse_mode(e, b);
  if (fuse) return fused_body(e, b, fuse, argmax);
  if (e->off.on) OTE_TRY(ote_offload_prime(e));
  for (int l = 0; l < c->layers; l++) {
    const ote_layer_weights *w = &e->w.layer[l];
    ote_layer_weights streamed;
    if (e->off.on) { /* this layer's slot of the ring, once its copy has landed */
      OTE_TRY(ote_offload_layer_begin(e, l, &streamed));
      w = &streamed;
    }
    OTE_TRY(rmsnorm(e, l ? e->delta : e->x_res, l ? e->x_res : NULL, w->attn_norm, e->normed, b->T,
                    l, "input_layernorm"));
    prof_mark(e, OTE_PROF_NORM);
    OTE_TRY(linear(e, e->normed, b->T, (int64_t)H, w->qkv, w->qkv_bias, cols, e->qkv, l, "qkv_proj"));
    prof_mark(e, OTE_PROF_QKV);
    OTE_TRY(attention_block(e, b, l, w, 0, NULL, NULL));
    OTE_TRY(rmsnorm(e, e->delta, e->x_res, w->mlp_norm, e->normed, b->T, l,
                    "post_attention_layernorm"));
    prof_mark(e, OTE_PROF_NORM);
    OTE_TRY(linear(e, e->normed, b->T, (int64_t)H, w->gate_up, NULL, 2 * F, e->gate_up, l,
                   "gate_up_proj"));
    prof_mark(e, OTE_PROF_GATE_UP);
    OTE_TRY(swiglu_down(e, b, l, w));
    prof_mark(e, OTE_PROF_DOWN);
    if (e->off.on) OTE_TRY(ote_offload_layer_end(e, l));
  }
  /* the last token of each sequence: final norm and lm_head (decode: every row is one) */
  void *last_delta = e->delta, *last_res = e->x_res;
  if (b->prefill && b->n == 1) {
    /* one prompt: its last row where it is, no copies (the final norm's residual sum goes
     * to that row of x_res, which nothing reads again: a decode step starts from the
     * embedding); OTE_PREFILL_FUSED_HEAD=1: the decode's fused final norm + lm_head (+
     * argmax) kernel on it instead of the norm, the linear and the argmax */
    const size_t r = (size_t)(b->T - 1);
    last_delta = (char *)e->delta + r * H * es;
    last_res = (char *)e->x_res + r * H * es;
    if (prefill_fused_head(e, last_delta, last_res)) {
      const fused_opts fo = {(int)env_ll("OTE_FUSED_WAVES", 2), (int)env_ll("OTE_FUSED_BLOCKS", 0),
                             0, 0, 0, 8, 4, 0, 0, 0, 0, 0, 0, 0, 0, 0};
      OTE_TRY(fused_norm_linear(e, last_delta, last_res, NULL, e->w.final_norm, e->w.lm_head,
                                NULL, c->vocab, e->logits, argmax ? e->argmax_dev : NULL, NULL,
                                -1, env_ll("OTE_FUSED_PAIR", 1) != 0, &fo, c->layers,
                                "final norm + lm_head (prefill)"));
      prof_mark(e, OTE_PROF_HEAD);
      if (argmax) {
        OTE_TRY(ote_dev_download_async(&e->dev, e->next_h, e->argmax_dev, 4));
        prof_mark(e, OTE_PROF_OTHER);
      }
      return OT_OK;
    }
  } else if (b->prefill) {
    for (int i = 0; i < b->n; i++) {
      size_t r = (size_t)(b->cu[i + 1] - 1);
      OTE_TRY(ote_dev_copy_2d(&e->dev, (char *)e->last_delta + i * H * es, H * es,
                              (char *)e->delta + r * H * es, H * es, H * es, 1));
      OTE_TRY(ote_dev_copy_2d(&e->dev, (char *)e->last_res + i * H * es, H * es,
                              (char *)e->x_res + r * H * es, H * es, H * es, 1));
    }
    last_delta = e->last_delta;
    last_res = e->last_res;
  }
  OTE_TRY(rmsnorm(e, last_delta, last_res, e->w.final_norm, e->last_norm, b->n, c->layers,
                  "final norm"));
  OTE_TRY(linear(e, e->last_norm, b->n, (int64_t)H, e->w.lm_head, NULL, c->vocab, e->logits,
                 c->layers, "lm_head"));
  prof_mark(e, OTE_PROF_HEAD);
  if (argmax && e->dev.dev.device_type != kDLCPU) {
    OTE_TRY(ote_dev_argmax(&e->dev, e->argmax_dev, e->logits, e->opt.dtype, b->n, c->vocab));
    OTE_TRY(ote_dev_download_async(&e->dev, e->next_h, e->argmax_dev, (size_t)b->n * 4));
    prof_mark(e, OTE_PROF_OTHER);
  }
  return OT_OK;
}

/* Decode through a CUDA graph where possible: the first step of a batch size runs
 * eagerly (the ops create their lazy workspaces), the second captures and replays, later
 * ones replay. A failed capture turns graphs off for the engine (the note says why) and
 * the step runs eagerly. */
static ot_status decode_body(ote_engine *e, const batch *b, int argmax) {
  int n = b->n;
  e->graph_active = 0;
  if (e->prof_on) return forward_body(e, b, argmax); /* eager, timed op by op */
  if (e->graphs_off || !e->warm[n]) {
    /* This eager step may grow the context's scratch (a new batch size can need more
     * split-KV partials), freeing the buffer that the graphs of other batch sizes were
     * captured with: destroy those graphs (their sizes stay warm, so their next step
     * captures again; scratch only grows, so that capture allocates nothing). */
    if (!e->graphs_off)
      for (int m = 0; m <= e->opt.max_seqs; m++) {
        ote_graph_destroy(e->graph[m]);
        e->graph[m] = NULL;
        e->warm[m] &= 1;
      }
    OTE_TRY(forward_body(e, b, argmax));
    e->warm[n] = 1;
    return OT_OK;
  }
  /* the argmax is part of the graph: bit 1 of warm[n] says whether graph[n] has it */
  if (e->graph[n] && ((e->warm[n] >> 1) & 1) != argmax) {
    ote_graph_destroy(e->graph[n]);
    e->graph[n] = NULL;
  }
  if (!e->graph[n]) {
    OTE_TRY(ote_graph_begin(&e->dev));
    ot_status st = forward_body(e, b, argmax);
    char why[256] = "";
    if (st != OT_OK) snprintf(why, sizeof why, "%s", ote_last_error());
    void *exec = NULL;
    ot_status st2 = ote_graph_end(&e->dev, &exec);
    if (st == OT_OK && st2 != OT_OK) snprintf(why, sizeof why, "%s", ote_last_error());
    if (!exec || st != OT_OK) {
      ote_graph_destroy(exec);
      e->graphs_off = 1;
      snprintf(e->graph_note, sizeof e->graph_note, "off: capture failed: %.200s", why);
      return forward_body(e, b, argmax);
    }
    e->graph[n] = exec;
    e->warm[n] = (unsigned char)(1 | (argmax << 1));
  }
  OTE_TRY(ote_graph_launch(&e->dev, e->graph[n]));
  e->graph_active = 1;
  return OT_OK;
}

/* logits (float32 [n, V]) and / or next (argmax ids [n]) to the host. */
static ot_status fetch(ote_engine *e, int n, float *logits, int32_t *next) {
  const ote_config *c = &e->cfg;
  size_t es = ote_dtype_size(e->opt.dtype), nv = (size_t)n * (size_t)c->vocab;
  int cpu = e->dev.dev.device_type == kDLCPU;
  if (logits) { /* on the CPU the logits are host memory already: no staging copy */
    const void *src = e->logits;
    if (!cpu) {
      OTE_TRY(ote_dev_download(&e->dev, e->logits_stage, e->logits, nv * es));
      src = e->logits_stage;
    }
    ote_convert(logits, OTE_F32, src, e->opt.dtype, nv);
  }
  if (next) {
    if (cpu) {
      const float *lf = logits;
      if (!lf && ote_dtype_eq(e->opt.dtype, OTE_F32)) {
        lf = e->logits;
      } else if (!lf) {
        ote_convert(e->logits_host, OTE_F32, e->logits, e->opt.dtype, nv);
        lf = e->logits_host;
      }
      for (int i = 0; i < n; i++) next[i] = ote_sample(NULL, lf + (size_t)i * c->vocab, c->vocab,
                                                       NULL, NULL);
    }
  }
  OTE_TRY(ote_dev_sync(&e->dev));
  prof_collect(e);
  if (next && !cpu) memcpy(next, e->next_h, (size_t)n * 4); /* landed with the forward */
  ote_offload_measure(e);
  return OT_OK;
}

static ot_status check_batch(const ote_engine *e, int n, const int *seq, const int32_t *tokens,
                             int T, const char *what) {
  if (n <= 0 || n > e->opt.max_seqs)
    return ote_error(OT_ERR_INVALID_ARGUMENT, "%s: %d sequences (1 .. max_seqs %d)", what, n,
                     e->opt.max_seqs);
  for (int i = 0; i < n; i++) {
    if (seq[i] < 0 || seq[i] >= e->opt.max_seqs)
      return ote_error(OT_ERR_INVALID_ARGUMENT, "%s: sequence slot %d out of range (0 .. %d)", what,
                       seq[i], e->opt.max_seqs - 1);
    for (int j = 0; j < i; j++)
      if (seq[j] == seq[i])
        return ote_error(OT_ERR_INVALID_ARGUMENT, "%s: sequence slot %d given twice", what, seq[i]);
  }
  for (int t = 0; t < T; t++)
    if (tokens[t] < 0 || tokens[t] >= e->cfg.vocab)
      return ote_error(OT_ERR_INVALID_ARGUMENT, "%s: token id %d out of range (0 .. %d)", what,
                       tokens[t], e->cfg.vocab - 1);
  return OT_OK;
}

static ot_status prefill(ote_engine *e, int n, const int *seq, const int32_t *tokens,
                         const int32_t *cu, float *logits, int32_t *next) {
  const double t0 = ote_now_ms();
  if (!e || !seq || !tokens || !cu || (!logits && !next))
    return ote_error(OT_ERR_INVALID_ARGUMENT, "ote_prefill: NULL argument");
  /* read at each prefill (one getenv), so that a benchmark can alternate the two forms in
   * one engine (bench_engine.py --prefill-variants rope_kv_split) */
  e->rope_kv_split = env_ll("OTE_PREFILL_ROPE_KV", 1) == 0;
  if (n <= 0 || n > e->opt.max_seqs || cu[0] != 0)
    return ote_error(OT_ERR_INVALID_ARGUMENT, "ote_prefill: bad batch (n %d, cu_seqlens[0] %d)", n,
                     n > 0 ? cu[0] : 0);
  for (int i = 0; i < n; i++) {
    int len = cu[i + 1] - cu[i];
    if (len <= 0 || len > e->opt.max_len)
      return ote_error(OT_ERR_INVALID_ARGUMENT,
                       "ote_prefill: prompt %d has %d tokens (1 .. max_len %d)", i, len,
                       e->opt.max_len);
  }
  OTE_TRY(check_batch(e, n, seq, tokens, cu[n], "ote_prefill"));
  int T = cu[n];
  /* the ops' context scratch may grow in a prefill (freeing the old buffer a decode graph
   * still points to): decode graphs are captured again after every prefill */
  drop_graphs(e);
  OTE_TRY(ensure_activations(e, T));
  int32_t *lens = e->cu_host; /* scratch until the forward */
  for (int i = 0; i < n; i++) lens[i] = cu[i + 1] - cu[i];
  OTE_TRY(ote_kv_reset(&e->kv, n, seq));
  ot_status st = ote_kv_reserve(&e->kv, n, seq, lens);
  if (st == OT_OK) st = ote_kv_push(&e->kv, &e->dev, n);
  if (st == OT_OK) {
    for (int i = 0; i < n; i++)
      for (int t = cu[i]; t < cu[i + 1]; t++) e->positions_host[t] = t - cu[i];
    st = ote_dev_upload_async(&e->dev, e->positions_dev, e->positions_host, (size_t)T * 4);
  }
  if (st == OT_OK) st = ote_dev_upload_async(&e->dev, e->cu_dev, cu, (size_t)(n + 1) * 4);
  if (st == OT_OK) st = ote_dev_upload_async(&e->dev, e->tokens_dev, tokens, (size_t)T * 4);
  batch b = {n, T, seq, cu, 1, 0};
  /* OTE_PREFILL_SPIN_NS (diagnostic): the GPU held that long before the forward's first
   * event, so that its GPU time (last_timing) is the ops back to back, not paced by the
   * host's enqueueing; the call's wall time includes the spin */
  long long spin = env_ll("OTE_PREFILL_SPIN_NS", 0);
  if (st == OT_OK && spin > 0 && e->dev.dev.device_type != kDLCPU) st = ote_dev_spin(&e->dev, spin);
  const double t1 = ote_now_ms();
  if (st == OT_OK) st = ote_dev_event_record(&e->dev, e->tm_ev[0]);
  if (st == OT_OK) st = forward_body(e, &b, next != NULL);
  if (st == OT_OK) st = ote_dev_event_record(&e->dev, e->tm_ev[1]);
  const double t2 = ote_now_ms();
  if (st == OT_OK) st = fetch(e, n, logits, next);
  if (st == OT_OK) timing_done(e, 0, t0, t1, t2, ote_now_ms());
  if (st != OT_OK) {
    char msg[1024];
    snprintf(msg, sizeof msg, "%s", ote_last_error());
    if (e->dev.stream) (void)ote_dev_sync(&e->dev);
    ote_kv_drop(&e->kv, n, seq);
    ote_error(st, "%s", msg);
  }
  return st;
}

static ot_status decode(ote_engine *e, int n, const int *seq, const int32_t *tokens, float *logits,
                        int32_t *next) {
  const double t0 = ote_now_ms();
  if (!e || !seq || !tokens || (!logits && !next))
    return ote_error(OT_ERR_INVALID_ARGUMENT, "ote_decode: NULL argument");
  OTE_TRY(check_batch(e, n, seq, tokens, n, "ote_decode"));
  OTE_TRY(fused_settings_check(e, "ote_decode"));
  for (int i = 0; i < n; i++) {
    int len = e->kv.len[seq[i]];
    if (len == 0)
      return ote_error(OT_ERR_INVALID_ARGUMENT, "ote_decode: sequence slot %d has no prompt", seq[i]);
    if (len >= e->opt.max_len)
      return ote_error(OT_ERR_INVALID_ARGUMENT, "ote_decode: sequence slot %d is full (max_len %d)",
                       seq[i], e->opt.max_len);
  }
  OTE_TRY(ensure_activations(e, n));
  int32_t *ones = e->cu_host;
  for (int i = 0; i < n; i++) ones[i] = 1;
  /* the page table and the token ids go to the host block; the step's forward copies them
   * (inside the decode graph when one replays) */
  ot_status st = ote_kv_reserve(&e->kv, n, seq, ones);
  if (st == OT_OK) memcpy(e->kv.tok_h, tokens, (size_t)n * 4);
  batch b = {n, n, seq, NULL, 0, env_ll("OTE_PAGED_KV_READY", 1) != 0};
  const double t1 = ote_now_ms();
  if (st == OT_OK) st = ote_dev_event_record(&e->dev, e->tm_ev[0]);
  if (st == OT_OK) st = decode_body(e, &b, next != NULL && e->dev.dev.device_type != kDLCPU);
  if (st == OT_OK) st = ote_dev_event_record(&e->dev, e->tm_ev[1]);
  const double t2 = ote_now_ms();
  if (st == OT_OK) st = fetch(e, n, logits, next);
  if (st == OT_OK) timing_done(e, 1, t0, t1, t2, ote_now_ms());
  if (st != OT_OK) {
    char msg[1024];
    snprintf(msg, sizeof msg, "%s", ote_last_error());
    if (e->dev.stream) (void)ote_dev_sync(&e->dev);
    ote_kv_drop(&e->kv, n, seq); /* their caches are no longer consistent */
    ote_error(st, "%s (the batch's sequences were emptied)", msg);
  }
  return st;
}

ot_status ote_prefill(ote_engine *e, int n, const int *seq, const int32_t *tokens,
                      const int32_t *cu, float *logits) {
  if (!logits) return ote_error(OT_ERR_INVALID_ARGUMENT, "ote_prefill: NULL argument");
  return prefill(e, n, seq, tokens, cu, logits, NULL);
}

ot_status ote_prefill_greedy(ote_engine *e, int n, const int *seq, const int32_t *tokens,
                             const int32_t *cu, int32_t *next) {
  if (!next) return ote_error(OT_ERR_INVALID_ARGUMENT, "ote_prefill_greedy: NULL argument");
  return prefill(e, n, seq, tokens, cu, NULL, next);
}

ot_status ote_decode(ote_engine *e, int n, const int *seq, const int32_t *tokens, float *logits) {
  if (!logits) return ote_error(OT_ERR_INVALID_ARGUMENT, "ote_decode: NULL argument");
  return decode(e, n, seq, tokens, logits, NULL);
}

ot_status ote_decode_greedy(ote_engine *e, int n, const int *seq, const int32_t *tokens,
                            int32_t *next) {
  if (!next) return ote_error(OT_ERR_INVALID_ARGUMENT, "ote_decode_greedy: NULL argument");
  return decode(e, n, seq, tokens, NULL, next);
}
