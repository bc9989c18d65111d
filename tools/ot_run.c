/* ot_run.c -- ot-run: generate token ids with the engine (src/engine), and report time to
 * first token, decode speed and memory.
 *
 *   ot-run --config tiny --random-weights --seed 1 --prompt-ids 1,2,3 --max-new-tokens 32
 *   ot-run --model DIR --prompt-ids 1,2,3 [--prompt-ids 4,5 ...]
 *
 * Each --prompt-ids is one sequence of the batch (--batch N repeats the prompts up to N
 * sequences). All prompts are prefilled together (packed, varlen), then decoded one token
 * per live sequence per step. Exit status: 0, or 1 with the engine's message on stderr. */
#define _POSIX_C_SOURCE 200809L
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "engine.h"

static double now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec * 1e-6;
}

static void usage(FILE *f) {
  fprintf(f,
          "usage: ot-run (--config NAME --random-weights | --model DIR [--random-weights])\n"
          "              [--prompt-ids 1,2,3]... [--batch N] [--max-new-tokens N]\n"
          "              [--temperature T] [--top-k K] [--top-p P] [--seed N]\n"
          "              [--stop-ids a,b] [--ignore-eos] [--dtype f32|bf16|f16] [--threads N]\n"
          "              [--device cpu|cuda] [--kv-block N] [--no-cuda-graph] [--offload]\n"
          "              [--offload-budget GB | FRACTIONx]\n"
          "              [--dump-logits FILE] [--quiet]\n"
          "  --config NAME      a named configuration: %s\n"
          "  --model DIR        a HF directory: config.json + *.safetensors (sharded or not)\n"
          "  --random-weights   random weights from --seed (default 1)\n"
          "  --dump-logits FILE float32 logits of every step, [steps][live sequences][vocab]\n"
          "  --kv-block N       tokens per page of the paged KV cache (default 16)\n"
          "  --offload          CUDA: stream the layers' weights from pinned host memory through\n"
          "                     a ring of device slots (OTE_OFFLOAD_RING slots, default 2)\n"
          "  --offload-budget B with --offload: device memory for all weights, in GB (1e9 bytes)\n"
          "                     or as a fraction of the model's weights (0.67x); the first layers\n"
          "                     that fit stay resident, the others stream (default: all stream)\n",
          ote_config_names());
}

/* "1,2,3" -> ints; returns the count or -1. */
static int parse_ids(const char *s, int32_t **out) {
  int cap = 16, n = 0;
  int32_t *v = malloc(sizeof *v * (size_t)cap);
  const char *p = s;
  while (v && *p) {
    char *end;
    long x = strtol(p, &end, 10);
    if (end == p || x < 0 || x > 0x7fffffff) { free(v); return -1; }
    if (n == cap) {
      int32_t *g = realloc(v, sizeof *v * (size_t)(cap *= 2));
      if (!g) { free(v); return -1; }
      v = g;
    }
    v[n++] = (int32_t)x;
    p = end;
    if (*p == ',') p++;
    else if (*p) { free(v); return -1; }
  }
  *out = v;
  return v ? n : -1;
}

/* --dump-logits: the float32 logits of every step, appended */
static void dump_logits(void *user, int n_live, const float *logits, int vocab) {
  fwrite(logits, sizeof *logits, (size_t)n_live * (size_t)vocab, (FILE *)user);
}

static double mib(size_t b) { return (double)b / (1024.0 * 1024.0); }

int main(int argc, char **argv) {
  const char *config = NULL, *model = NULL, *dump = NULL, *stop_arg = NULL, *device = "cpu";
  int random_weights = 0, max_new = 32, top_k = 0, threads = 0, batch = 0, ignore_eos = 0,
      quiet = 0, kv_block = 16, no_graph = 0,
      offload = 0;
  const char *budget_arg = NULL;
  float temperature = 0, top_p = 1;
  unsigned long long seed = 1;
  DLDataType dtype = {kDLFloat, 32, 1};
  int n_prompts = 0;
  int32_t *prompts[256];
  int prompt_len[256];
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i];
    const char *v = i + 1 < argc ? argv[i + 1] : NULL;
#define NEEDV()                                                   \
  do {                                                            \
    if (!v) { fprintf(stderr, "ot-run: %s needs a value\n", a); return 2; } \
    i++;                                                          \
  } while (0)
    if (!strcmp(a, "--help") || !strcmp(a, "-h")) { usage(stdout); return 0; }
    else if (!strcmp(a, "--config")) { NEEDV(); config = v; }
    else if (!strcmp(a, "--model")) { NEEDV(); model = v; }
    else if (!strcmp(a, "--random-weights")) random_weights = 1;
    else if (!strcmp(a, "--seed")) { NEEDV(); seed = strtoull(v, NULL, 10); }
    else if (!strcmp(a, "--max-new-tokens")) { NEEDV(); max_new = atoi(v); }
    else if (!strcmp(a, "--temperature")) { NEEDV(); temperature = (float)atof(v); }
    else if (!strcmp(a, "--top-k")) { NEEDV(); top_k = atoi(v); }
    else if (!strcmp(a, "--top-p")) { NEEDV(); top_p = (float)atof(v); }
    else if (!strcmp(a, "--threads")) { NEEDV(); threads = atoi(v); }
    else if (!strcmp(a, "--batch")) { NEEDV(); batch = atoi(v); }
    else if (!strcmp(a, "--stop-ids")) { NEEDV(); stop_arg = v; }
    else if (!strcmp(a, "--ignore-eos")) ignore_eos = 1;
    else if (!strcmp(a, "--quiet")) quiet = 1;
    else if (!strcmp(a, "--dump-logits")) { NEEDV(); dump = v; }
    else if (!strcmp(a, "--device")) { NEEDV(); device = v; }
    else if (!strcmp(a, "--kv-block")) { NEEDV(); kv_block = atoi(v); }
    else if (!strcmp(a, "--no-cuda-graph")) no_graph = 1;
    else if (!strcmp(a, "--offload")) offload = 1;
    else if (!strcmp(a, "--offload-budget")) { NEEDV(); budget_arg = v; }
    else if (!strcmp(a, "--dtype")) {
      NEEDV();
      if (!strcmp(v, "f32") || !strcmp(v, "float32")) dtype = (DLDataType){kDLFloat, 32, 1};
      else if (!strcmp(v, "bf16") || !strcmp(v, "bfloat16")) dtype = (DLDataType){kDLBfloat, 16, 1};
      else if (!strcmp(v, "f16") || !strcmp(v, "float16")) dtype = (DLDataType){kDLFloat, 16, 1};
      else { fprintf(stderr, "ot-run: --dtype %s: expected f32, bf16 or f16\n", v); return 2; }
    } else if (!strcmp(a, "--prompt-ids")) {
      NEEDV();
      if (n_prompts == 256) { fprintf(stderr, "ot-run: at most 256 prompts\n"); return 2; }
      int n = parse_ids(v, &prompts[n_prompts]);
      if (n <= 0) { fprintf(stderr, "ot-run: --prompt-ids %s: expected ids like 1,2,3\n", v); return 2; }
      prompt_len[n_prompts++] = n;
    } else {
      fprintf(stderr, "ot-run: unknown argument %s\n", a);
      usage(stderr);
      return 2;
    }
#undef NEEDV
  }
  if (!config == !model) {
    fprintf(stderr, "ot-run: give exactly one of --config NAME and --model DIR\n");
    usage(stderr);
    return 2;
  }
  if (config && !random_weights) {
    fprintf(stderr, "ot-run: --config %s has no weights: add --random-weights\n", config);
    return 2;
  }
  if (max_new < 0 || batch < 0 || batch > 256 || threads < 0) {
    fprintf(stderr, "ot-run: bad --max-new-tokens, --batch or --threads\n");
    return 2;
  }
  if (n_prompts == 0) { /* a default prompt */
    prompts[0] = malloc(8 * sizeof(int32_t));
    if (!prompts[0]) return 1;
    for (int i = 0; i < 8; i++) prompts[0][i] = i + 1;
    prompt_len[0] = 8;
    n_prompts = 1;
  }
  int S = batch > n_prompts ? batch : n_prompts;
  int32_t *stop = NULL;
  int n_stop = 0;
  if (stop_arg && (n_stop = parse_ids(stop_arg, &stop)) < 0) {
    fprintf(stderr, "ot-run: --stop-ids %s: expected ids like 2,3\n", stop_arg);
    return 2;
  }

  ote_config cfg;
  ot_status st;
  if (config) st = ote_config_named(config, &cfg);
  else st = ote_config_load(model, &cfg);
  if (st != OT_OK) { fprintf(stderr, "ot-run: %s\n", ote_last_error()); return 1; }
  if (!ignore_eos && !stop_arg)
    for (int i = 0; i < cfg.n_eos; i++) {
      int32_t *g = realloc(stop, sizeof *stop * (size_t)(n_stop + 1));
      if (!g) return 1;
      stop = g;
      stop[n_stop++] = cfg.eos_token_ids[i];
    }

  int max_prompt = 0, total = 0;
  for (int i = 0; i < S; i++) {
    int l = prompt_len[i % n_prompts];
    if (l > max_prompt) max_prompt = l;
    total += l;
  }
  ote_engine_options opt = ote_engine_default_options();
  opt.dtype = dtype;
  opt.max_seqs = S;
  opt.max_len = max_prompt + (max_new > 0 ? max_new : 1);
  opt.num_threads = threads;
  opt.kv_block_size = kv_block;
  opt.cuda_graphs = !no_graph;
  opt.offload = offload;
  if (budget_arg) {
    char *end = NULL;
    double b = strtod(budget_arg, &end);
    if (!(b > 0) || (*end && strcmp(end, "x"))) {
      fprintf(stderr, "ot-run: --offload-budget %s: expected GB (10.5) or a fraction (0.67x)\n",
              budget_arg);
      return 2;
    }
    size_t es = dtype.bits / 8;
    double bytes = *end == 'x' ? b * (double)ote_config_param_count(&cfg) * (double)es : b * 1e9;
    /* a budget at or above SIZE_MAX (inf, 1e300) means "no limit": the conversion of such a
     * double to size_t would be undefined */
    opt.offload_budget = bytes >= (double)SIZE_MAX ? SIZE_MAX : (size_t)bytes;
  }
  if (!strcmp(device, "cuda")) opt.device_type = kDLCUDA;
  else if (strcmp(device, "cpu")) { fprintf(stderr, "ot-run: --device %s: cpu or cuda\n", device); return 2; }

  double t0 = now_ms();
  ote_engine *e = NULL;
  if (model && !random_weights) st = ote_engine_load(model, &opt, &e);
  else st = ote_engine_random(&cfg, seed, &opt, &e);
  if (st != OT_OK) { fprintf(stderr, "ot-run: %s\n", ote_last_error()); return 1; }
  double t_load = now_ms() - t0;
  const ote_config *c = ote_engine_config(e);
  if (!quiet)
    printf("model: %s (%d layers, hidden %d, heads %d/%d x %d, ffn %d, vocab %d; %.1fM parameters), "
           "%s weights, %s, %s\n",
           config ? config : model, c->layers, c->hidden, c->heads, c->kv_heads, c->head_dim,
           c->ffn, c->vocab, (double)ote_config_param_count(c) / 1e6,
           random_weights ? "random" : "loaded",
           dtype.code == kDLBfloat ? "bfloat16" : dtype.bits == 16 ? "float16" : "float32", device);

  int32_t *tokens = malloc(sizeof *tokens * (size_t)(total > 0 ? total : 1));
  int32_t *cu = malloc(sizeof *cu * (size_t)(S + 1));
  int32_t *gen = malloc(sizeof *gen * (size_t)S * (size_t)(max_new > 0 ? max_new : 1));
  int *n_gen = calloc((size_t)S, sizeof *n_gen);
  FILE *df = dump ? fopen(dump, "wb") : NULL;
  if (!tokens || !cu || !gen || !n_gen || (dump && !df)) {
    fprintf(stderr, "ot-run: out of memory or cannot write %s\n", dump ? dump : "");
    return 1;
  }
  cu[0] = 0;
  for (int i = 0; i < S; i++) {
    int p = i % n_prompts;
    memcpy(tokens + cu[i], prompts[p], sizeof *tokens * (size_t)prompt_len[p]);
    cu[i + 1] = cu[i] + prompt_len[p];
  }
  ote_sampler sampler;
  ote_sampler_init(&sampler, temperature, top_k, top_p, seed);
  ote_gen_stats gs;
  memset(&gs, 0, sizeof gs);
  gs.load_ms = t_load;
  int rc = 0;
  st = ote_generate(e, S, tokens, cu, max_new, &sampler, stop, n_stop, gen, n_gen,
                    df ? dump_logits : NULL, df, &gs);
  if (st != OT_OK) {
    fprintf(stderr, "ot-run: %s\n", ote_last_error());
    rc = 1;
  }
  if (df) fclose(df);

  for (int i = 0; i < S; i++) {
    printf("seq %d generated:", i);
    for (int t = 0; t < n_gen[i]; t++) printf(" %d", gen[(size_t)i * (size_t)max_new + (size_t)t]);
    printf("\n");
  }
  ote_memory mem = ote_engine_memory(e);
  if (!quiet) {
    printf("load: %.1f ms\n", t_load);
    printf("time to first token: %.2f ms (prefill of %d tokens in %d sequences)\n",
           gs.first_token_ms, total, S);
    printf("decode: %ld steps, %ld tokens in %.2f ms: %.1f tokens/s", gs.decode_steps,
           gs.decode_tokens, gs.decode_ms,
           gs.decode_ms > 0 ? (double)gs.decode_tokens * 1e3 / gs.decode_ms : 0.0);
    if (opt.device_type == kDLCUDA)
      printf(" (CUDA graph: %s)", gs.cuda_graph ? "on"
                                  : *ote_decode_graph_note(e) ? ote_decode_graph_note(e) : "off");
    printf("\n");
    printf("memory: weights %.2f MiB, kv cache %.2f MiB, activations %.2f MiB", mib(mem.weights),
           mib(mem.kv_cache), mib(mem.activations));
    ot_memory_counter ws;
    if (ot_memory_tag_counter(OT_MEMORY_WORKSPACE, &ws) == OT_OK && ws.peak)
      printf(", library workspace %.2f MiB (peak)", mib(ws.peak));
    if (mem.weights_host)
      printf(", streamed weights %.2f MiB in pinned host memory, ring %.2f MiB",
             mib(mem.weights_host), mib(mem.offload_ring));
    printf("\n");
    if (offload) {
      char rep[512];
      ote_engine_offload_report(e, rep, sizeof rep);
      printf("offload: %s\n", rep);
    }
  }
  ote_engine_destroy(e);
  for (int i = 0; i < n_prompts; i++) free(prompts[i]);
  free(stop); free(tokens); free(cu); free(gen); free(n_gen);
  return rc;
}
