/* generate.c -- the generation loop shared by ot-run and the Python binding (ctypes), and
 * the scalar-argument constructor the binding calls. */
#define _POSIX_C_SOURCE 200809L
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "internal.h"

static int is_stop(int tok, const int32_t *stop, int n_stop) {
  for (int s = 0; s < n_stop; s++)
    if (tok == stop[s]) return 1;
  return 0;
}

ot_status ote_generate(ote_engine *e, int n, const int32_t *tokens, const int32_t *cu, int max_new,
                       const ote_sampler *sampler_in, const int32_t *stop, int n_stop,
                       int32_t *out, int *n_out, ote_logits_fn on_logits, void *user,
                       ote_gen_stats *stats) {
  if (!e || !tokens || !cu || !out || !n_out || max_new < 0 || (n_stop > 0 && !stop))
    return ote_error(OT_ERR_INVALID_ARGUMENT, "ote_generate: bad argument");
  if (n <= 0 || n > e->opt.max_seqs)
    return ote_error(OT_ERR_INVALID_ARGUMENT, "ote_generate: %d prompts (1 .. max_seqs %d)", n,
                     e->opt.max_seqs);
  ote_gen_stats st0;
  memset(&st0, 0, sizeof st0);
  if (!stats) stats = &st0;
  double load = stats->load_ms;
  memset(stats, 0, sizeof *stats);
  stats->load_ms = load;
  memset(n_out, 0, sizeof *n_out * (size_t)n);
  if (max_new == 0) return OT_OK;
  ote_sampler smp;
  ote_sampler_init(&smp, 0, 0, 1, 0);
  if (sampler_in) smp = *sampler_in;
  int greedy = smp.temperature <= 0 || smp.top_k == 1;
  int device_argmax = greedy && !on_logits;
  int V = e->cfg.vocab;
  int *seq = malloc(sizeof *seq * (size_t)n), *live = malloc(sizeof *live * (size_t)n);
  int32_t *step_tok = malloc(sizeof *step_tok * (size_t)n), *next = malloc(sizeof *next * (size_t)n);
  float *logits = device_argmax ? NULL : malloc(sizeof *logits * (size_t)n * (size_t)V);
  float *sp = device_argmax ? NULL : malloc(sizeof *sp * (size_t)V);
  int *si = device_argmax ? NULL : malloc(sizeof *si * (size_t)V);
  ot_status st = OT_OK;
  if (!seq || !live || !step_tok || !next || (!device_argmax && (!logits || !sp || !si))) {
    st = ote_error(OT_ERR_OOM, "ote_generate: out of memory");
    goto done;
  }
  for (int i = 0; i < n; i++) seq[i] = i;
  double t0 = ote_now_ms();
  st = device_argmax ? ote_prefill_greedy(e, n, seq, tokens, cu, next)
                     : ote_prefill(e, n, seq, tokens, cu, logits);
  if (st != OT_OK) goto done;
  if (on_logits) on_logits(user, n, logits, V);
  int n_live = 0;
  for (int i = 0; i < n; i++) {
    int tok = device_argmax ? next[i] : ote_sample(&smp, logits + (size_t)i * V, V, sp, si);
    out[(size_t)i * (size_t)max_new + (size_t)n_out[i]++] = tok;
    if (n_out[i] < max_new && !is_stop(tok, stop, n_stop)) live[n_live++] = i;
  }
  stats->first_token_ms = ote_now_ms() - t0;

  t0 = ote_now_ms();
  while (n_live > 0) {
    for (int j = 0; j < n_live; j++) {
      int i = live[j];
      step_tok[j] = out[(size_t)i * (size_t)max_new + (size_t)n_out[i] - 1];
    }
    st = device_argmax ? ote_decode_greedy(e, n_live, live, step_tok, next)
                       : ote_decode(e, n_live, live, step_tok, logits);
    if (st != OT_OK) break;
    if (on_logits) on_logits(user, n_live, logits, V);
    stats->decode_steps++;
    stats->decode_tokens += n_live;
    stats->cuda_graph |= ote_decode_graph_active(e);
    int m = 0;
    for (int j = 0; j < n_live; j++) {
      int i = live[j];
      int tok = device_argmax ? next[j] : ote_sample(&smp, logits + (size_t)j * V, V, sp, si);
      out[(size_t)i * (size_t)max_new + (size_t)n_out[i]++] = tok;
      if (n_out[i] < max_new && !is_stop(tok, stop, n_stop)) live[m++] = i;
    }
    n_live = m;
  }
  stats->decode_ms = ote_now_ms() - t0;
done:
  free(seq), free(live), free(step_tok), free(next), free(logits), free(sp), free(si);
  return st;
}

ot_status ote_engine_open(const char *model_dir, const char *config_name, uint64_t seed,
                          const char *dtype, const char *device, int max_seqs, int max_len,
                          int num_threads, int offload, size_t offload_budget, ote_engine **out) {
  if (!out) return ote_error(OT_ERR_INVALID_ARGUMENT, "ote_engine_open: out is NULL");
  *out = NULL;
  if (!model_dir == !config_name)
    return ote_error(OT_ERR_INVALID_ARGUMENT, "ote_engine_open: give a model directory or a config name");
  ote_engine_options o = ote_engine_default_options();
  if (!dtype || !strcmp(dtype, "f32") || !strcmp(dtype, "float32")) o.dtype = OTE_F32;
  else if (!strcmp(dtype, "bf16") || !strcmp(dtype, "bfloat16")) o.dtype = OTE_BF16;
  else if (!strcmp(dtype, "f16") || !strcmp(dtype, "float16")) o.dtype = OTE_F16;
  else return ote_error(OT_ERR_INVALID_ARGUMENT, "ote_engine_open: dtype %s (f32, bf16, f16)", dtype);
  if (!device || !strcmp(device, "cpu")) o.device_type = kDLCPU;
  else if (!strncmp(device, "cuda", 4)) {
    o.device_type = kDLCUDA;
    if (device[4] == ':') o.device_id = atoi(device + 5);
  } else return ote_error(OT_ERR_INVALID_ARGUMENT, "ote_engine_open: device %s (cpu, cuda)", device);
  o.max_seqs = max_seqs;
  o.max_len = max_len;
  o.num_threads = num_threads;
  o.offload = offload;
  o.offload_budget = offload_budget;
  const char *g = getenv("OTE_CUDA_GRAPHS");
  if (g && !strcmp(g, "0")) o.cuda_graphs = 0;
  if (model_dir && !config_name && seed == 0) return ote_engine_load(model_dir, &o, out);
  ote_config cfg;
  OTE_TRY(config_name ? ote_config_named(config_name, &cfg) : ote_config_load(model_dir, &cfg));
  return ote_engine_random(&cfg, seed, &o, out);
}

void ote_engine_shape(const ote_engine *e, int64_t v[9]) {
  const ote_config *c = &e->cfg;
  v[0] = c->layers, v[1] = c->hidden, v[2] = c->heads, v[3] = c->kv_heads, v[4] = c->head_dim;
  v[5] = c->ffn, v[6] = c->vocab, v[7] = c->max_position;
  v[8] = c->n_eos > 0 ? c->eos_token_ids[0] : -1;
}
