/* config.c -- model configuration: a HF config.json (parsed with cJSON) or a named
 * configuration (the shapes the benchmarks and the CPU demo use). */
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <cjson/cJSON.h>

#include "internal.h"

static void config_defaults(ote_config *c) {
  memset(c, 0, sizeof *c);
  c->arch = OTE_ARCH_LLAMA;
  c->max_position = 4096;
  c->rope_theta = 10000.0f;
  c->rms_eps = 1e-5f;
  c->bos_token_id = -1;
}

typedef struct named_config {
  const char *name;
  ote_arch arch;
  int hidden, layers, heads, kv_heads, head_dim, ffn, vocab, max_position;
  float theta, eps;
  float llama3_factor;
  int tie, qkv_bias;
} named_config;

/* The shapes of the public models (random weights: for benchmarks), and small ones. */
static const named_config NAMED[] = {
    /* the CPU demo: ~19M parameters, a few seconds on 2 cores */
    {"tiny", OTE_ARCH_LLAMA, 256, 4, 8, 4, 32, 704, 32000, 2048, 10000.0f, 1e-5f, 0, 0, 0},
    {"test-gqa", OTE_ARCH_LLAMA, 64, 2, 4, 2, 16, 128, 256, 2048, 10000.0f, 1e-6f, 0, 0, 0},
    {"test-mha", OTE_ARCH_LLAMA, 64, 2, 4, 4, 16, 128, 256, 2048, 10000.0f, 1e-6f, 0, 0, 0},
    {"llama2-7b", OTE_ARCH_LLAMA, 4096, 32, 32, 32, 128, 11008, 32000, 4096, 10000.0f, 1e-5f, 0, 0, 0},
    {"llama-13b", OTE_ARCH_LLAMA, 5120, 40, 40, 40, 128, 13824, 32000, 4096, 10000.0f, 1e-5f, 0, 0, 0},
    {"llama3-8b", OTE_ARCH_LLAMA, 4096, 32, 32, 8, 128, 14336, 128256, 8192, 500000.0f, 1e-5f, 0, 0, 0},
    {"llama3.1-8b", OTE_ARCH_LLAMA, 4096, 32, 32, 8, 128, 14336, 128256, 131072, 500000.0f, 1e-5f, 8.0f, 0, 0},
    {"mistral-7b", OTE_ARCH_MISTRAL, 4096, 32, 32, 8, 128, 14336, 32000, 32768, 1000000.0f, 1e-5f, 0, 0, 0},
    {"qwen2-7b", OTE_ARCH_QWEN2, 3584, 28, 28, 4, 128, 18944, 152064, 32768, 1000000.0f, 1e-6f, 0, 0, 1},
};

const char *ote_config_names(void) {
  return "tiny, test-gqa, test-mha, llama2-7b, llama-13b, llama3-8b, llama3.1-8b, mistral-7b, "
         "qwen2-7b";
}

static ot_status config_validate(const ote_config *c, const char *where) {
  struct { const char *name; int v; int max; } f[] = {
      {"hidden_size", c->hidden, 1 << 17},        {"num_hidden_layers", c->layers, 1 << 12},
      {"num_attention_heads", c->heads, 1 << 12}, {"num_key_value_heads", c->kv_heads, 1 << 12},
      {"head_dim", c->head_dim, 1 << 12},         {"intermediate_size", c->ffn, 1 << 20},
      {"vocab_size", c->vocab, 1 << 24},          {"max_position_embeddings", c->max_position, 1 << 30},
  };
  for (size_t i = 0; i < sizeof f / sizeof f[0]; i++)
    if (f[i].v <= 0 || f[i].v > f[i].max)
      return ote_error(OT_ERR_INVALID_ARGUMENT, "%s: %s = %d is out of range (1 .. %d)", where,
                       f[i].name, f[i].v, f[i].max);
  if (c->heads % c->kv_heads)
    return ote_error(OT_ERR_INVALID_ARGUMENT,
                     "%s: num_attention_heads %d is not a multiple of num_key_value_heads %d", where,
                     c->heads, c->kv_heads);
  if (c->head_dim % 2)
    return ote_error(OT_ERR_INVALID_ARGUMENT, "%s: head_dim %d is odd (RoPE needs pairs)", where,
                     c->head_dim);
  if (!(c->rope_theta > 0) || !(c->rms_eps >= 0))
    return ote_error(OT_ERR_INVALID_ARGUMENT, "%s: rope_theta must be > 0 and rms_norm_eps >= 0",
                     where);
  return OT_OK;
}

ot_status ote_config_named(const char *name, ote_config *c) {
  for (size_t i = 0; i < sizeof NAMED / sizeof NAMED[0]; i++) {
    const named_config *n = &NAMED[i];
    if (strcmp(n->name, name)) continue;
    config_defaults(c);
    snprintf(c->name, sizeof c->name, "%s", n->name);
    c->arch = n->arch;
    c->hidden = n->hidden;
    c->layers = n->layers;
    c->heads = n->heads;
    c->kv_heads = n->kv_heads;
    c->head_dim = n->head_dim;
    c->ffn = n->ffn;
    c->vocab = n->vocab;
    c->max_position = n->max_position;
    c->rope_theta = n->theta;
    c->rms_eps = n->eps;
    c->tie_word_embeddings = n->tie;
    c->qkv_bias = n->qkv_bias;
    if (n->llama3_factor > 0) {
      c->rope_llama3_factor = n->llama3_factor;
      c->rope_low_freq_factor = 1.0f;
      c->rope_high_freq_factor = 4.0f;
      c->rope_original_max_position = 8192;
    }
    c->bos_token_id = 1;
    c->n_eos = 0; /* random weights: no stop token unless asked */
    return config_validate(c, name);
  }
  return ote_error(OT_ERR_INVALID_ARGUMENT, "unknown configuration '%s' (known: %s)", name,
                   ote_config_names());
}

int64_t ote_config_param_count(const ote_config *c) {
  int64_t H = c->hidden, D = c->head_dim, F = c->ffn, V = c->vocab;
  int64_t qkv = (int64_t)(c->heads + 2 * c->kv_heads) * D;
  int64_t layer = qkv * H + (c->qkv_bias ? qkv : 0) + H * c->heads * D + (c->o_bias ? H : 0) +
                  3 * F * H + 2 * H;
  return V * H * (c->tie_word_embeddings ? 1 : 2) + H + layer * c->layers;
}

/* ---- config.json ---------------------------------------------------------------- */

static char *read_file(const char *path, size_t *len) {
  FILE *f = fopen(path, "rb");
  if (!f) return NULL;
  if (fseek(f, 0, SEEK_END) != 0) { fclose(f); return NULL; }
  long n = ftell(f);
  if (n < 0 || n > (64L << 20)) { fclose(f); return NULL; }
  rewind(f);
  char *buf = malloc((size_t)n + 1);
  if (buf && fread(buf, 1, (size_t)n, f) != (size_t)n) { free(buf); buf = NULL; }
  fclose(f);
  if (buf) { buf[n] = 0; if (len) *len = (size_t)n; }
  return buf;
}

/* An integer field: absent -> def (or an error when required). */
static ot_status get_int(const cJSON *root, const char *key, int required, int def, int *out,
                         const char *path) {
  const cJSON *it = cJSON_GetObjectItemCaseSensitive(root, key);
  if (!it || cJSON_IsNull(it)) {
    if (required)
      return ote_error(OT_ERR_INVALID_ARGUMENT, "%s: missing required field \"%s\"", path, key);
    *out = def;
    return OT_OK;
  }
  if (!cJSON_IsNumber(it) || it->valuedouble != (double)(int64_t)it->valuedouble ||
      it->valuedouble < -2147483648.0 || it->valuedouble > 2147483647.0)
    return ote_error(OT_ERR_INVALID_ARGUMENT, "%s: field \"%s\" is not an integer", path, key);
  *out = (int)it->valuedouble;
  return OT_OK;
}

static ot_status get_float(const cJSON *root, const char *key, float def, float *out,
                           const char *path) {
  const cJSON *it = cJSON_GetObjectItemCaseSensitive(root, key);
  if (!it || cJSON_IsNull(it)) { *out = def; return OT_OK; }
  if (!cJSON_IsNumber(it))
    return ote_error(OT_ERR_INVALID_ARGUMENT, "%s: field \"%s\" is not a number", path, key);
  *out = (float)it->valuedouble;
  return OT_OK;
}

static ot_status get_bool(const cJSON *root, const char *key, int def, int *out, const char *path) {
  const cJSON *it = cJSON_GetObjectItemCaseSensitive(root, key);
  if (!it || cJSON_IsNull(it)) { *out = def; return OT_OK; }
  if (!cJSON_IsBool(it))
    return ote_error(OT_ERR_INVALID_ARGUMENT, "%s: field \"%s\" is not true/false", path, key);
  *out = cJSON_IsTrue(it);
  return OT_OK;
}

/* rope_scaling (transformers 4) or rope_parameters (transformers 5): default or llama3. */
static ot_status parse_rope(const cJSON *root, ote_config *c, const char *path) {
  const cJSON *rp = cJSON_GetObjectItemCaseSensitive(root, "rope_parameters");
  const cJSON *rs = cJSON_GetObjectItemCaseSensitive(root, "rope_scaling");
  OTE_TRY(get_float(root, "rope_theta", 10000.0f, &c->rope_theta, path));
  if (cJSON_IsObject(rp)) OTE_TRY(get_float(rp, "rope_theta", c->rope_theta, &c->rope_theta, path));
  const cJSON *sc = cJSON_IsObject(rs) ? rs : cJSON_IsObject(rp) ? rp : NULL;
  if (!sc) return OT_OK;
  const cJSON *type = cJSON_GetObjectItemCaseSensitive(sc, "rope_type");
  if (!cJSON_IsString(type)) type = cJSON_GetObjectItemCaseSensitive(sc, "type");
  const char *t = cJSON_IsString(type) ? type->valuestring : "default";
  if (!strcmp(t, "default")) return OT_OK;
  if (strcmp(t, "llama3"))
    return ote_error(OT_ERR_UNSUPPORTED,
                     "%s: rope scaling type \"%s\" is not supported (default and llama3 are)", path, t);
  OTE_TRY(get_float(sc, "factor", 8.0f, &c->rope_llama3_factor, path));
  OTE_TRY(get_float(sc, "low_freq_factor", 1.0f, &c->rope_low_freq_factor, path));
  OTE_TRY(get_float(sc, "high_freq_factor", 4.0f, &c->rope_high_freq_factor, path));
  OTE_TRY(get_int(sc, "original_max_position_embeddings", 0, 8192, &c->rope_original_max_position,
                  path));
  if (!(c->rope_llama3_factor > 0) || !(c->rope_high_freq_factor > c->rope_low_freq_factor) ||
      c->rope_original_max_position <= 0)
    return ote_error(OT_ERR_INVALID_ARGUMENT, "%s: llama3 rope scaling parameters are invalid", path);
  return OT_OK;
}

static ot_status parse_config(const cJSON *root, ote_config *c, const char *path) {
  if (!cJSON_IsObject(root))
    return ote_error(OT_ERR_INVALID_ARGUMENT, "%s: not a JSON object", path);
  const cJSON *archs = cJSON_GetObjectItemCaseSensitive(root, "architectures");
  const cJSON *mt = cJSON_GetObjectItemCaseSensitive(root, "model_type");
  const char *arch = NULL, *model_type = cJSON_IsString(mt) ? mt->valuestring : NULL;
  if (cJSON_IsArray(archs) && cJSON_IsString(cJSON_GetArrayItem(archs, 0)))
    arch = cJSON_GetArrayItem(archs, 0)->valuestring;
  static const struct { const char *arch, *type; ote_arch id; } KNOWN[] = {
      {"LlamaForCausalLM", "llama", OTE_ARCH_LLAMA},
      {"MistralForCausalLM", "mistral", OTE_ARCH_MISTRAL},
      {"Qwen2ForCausalLM", "qwen2", OTE_ARCH_QWEN2},
  };
  int found = -1;
  for (int i = 0; i < 3; i++) {
    if (arch && !strcmp(arch, KNOWN[i].arch)) found = i;
    if (!arch && model_type && !strcmp(model_type, KNOWN[i].type)) found = i;
  }
  if (found < 0)
    return ote_error(OT_ERR_UNSUPPORTED,
                     "%s: unknown architecture \"%s\" (model_type \"%s\"); supported: "
                     "LlamaForCausalLM (llama), MistralForCausalLM (mistral), Qwen2ForCausalLM (qwen2)",
                     path, arch ? arch : "(none)", model_type ? model_type : "(none)");
  c->arch = KNOWN[found].id;
  snprintf(c->name, sizeof c->name, "%s", KNOWN[found].arch);

  OTE_TRY(get_int(root, "hidden_size", 1, 0, &c->hidden, path));
  OTE_TRY(get_int(root, "num_hidden_layers", 1, 0, &c->layers, path));
  OTE_TRY(get_int(root, "num_attention_heads", 1, 0, &c->heads, path));
  OTE_TRY(get_int(root, "num_key_value_heads", 0, c->heads, &c->kv_heads, path));
  OTE_TRY(get_int(root, "intermediate_size", 1, 0, &c->ffn, path));
  OTE_TRY(get_int(root, "vocab_size", 1, 0, &c->vocab, path));
  OTE_TRY(get_int(root, "max_position_embeddings", 0, 4096, &c->max_position, path));
  if (c->heads <= 0)
    return ote_error(OT_ERR_INVALID_ARGUMENT, "%s: num_attention_heads must be > 0", path);
  OTE_TRY(get_int(root, "head_dim", 0, c->hidden / c->heads, &c->head_dim, path));
  OTE_TRY(get_float(root, "rms_norm_eps", 1e-6f, &c->rms_eps, path));
  OTE_TRY(parse_rope(root, c, path));
  OTE_TRY(get_bool(root, "tie_word_embeddings", 0, &c->tie_word_embeddings, path));
  int attention_bias = 0, mlp_bias = 0;
  OTE_TRY(get_bool(root, "attention_bias", 0, &attention_bias, path));
  OTE_TRY(get_bool(root, "mlp_bias", 0, &mlp_bias, path));
  if (mlp_bias)
    return ote_error(OT_ERR_UNSUPPORTED, "%s: mlp_bias = true is not supported", path);
  if (c->arch == OTE_ARCH_QWEN2) {
    c->qkv_bias = 1; /* Qwen2: q/k/v biases, none on o_proj */
    int use_sw = 0;
    OTE_TRY(get_bool(root, "use_sliding_window", 0, &use_sw, path));
    if (use_sw)
      return ote_error(OT_ERR_UNSUPPORTED, "%s: Qwen2 use_sliding_window = true is not supported",
                       path);
  } else {
    c->qkv_bias = c->o_bias = attention_bias;
  }
  if (c->arch == OTE_ARCH_MISTRAL)
    OTE_TRY(get_int(root, "sliding_window", 0, 0, &c->sliding_window, path));
  if (c->sliding_window < 0)
    return ote_error(OT_ERR_INVALID_ARGUMENT, "%s: sliding_window must be >= 0", path);
  const cJSON *act = cJSON_GetObjectItemCaseSensitive(root, "hidden_act");
  if (cJSON_IsString(act) && strcmp(act->valuestring, "silu"))
    return ote_error(OT_ERR_UNSUPPORTED, "%s: hidden_act \"%s\" is not supported (silu is)", path,
                     act->valuestring);
  OTE_TRY(get_int(root, "bos_token_id", 0, -1, &c->bos_token_id, path));
  const cJSON *eos = cJSON_GetObjectItemCaseSensitive(root, "eos_token_id");
  c->n_eos = 0;
  if (cJSON_IsNumber(eos)) {
    c->eos_token_ids[c->n_eos++] = eos->valueint;
  } else if (cJSON_IsArray(eos)) {
    const cJSON *e;
    cJSON_ArrayForEach(e, eos) {
      if (cJSON_IsNumber(e) && c->n_eos < OTE_MAX_STOP) c->eos_token_ids[c->n_eos++] = e->valueint;
    }
  }
  return config_validate(c, path);
}

ot_status ote_config_load(const char *path, ote_config *c) {
  char file[4096];
  struct stat st;
  if (stat(path, &st) != 0)
    return ote_error(OT_ERR_INVALID_ARGUMENT, "%s: no such file or directory", path);
  if (S_ISDIR(st.st_mode))
    snprintf(file, sizeof file, "%s/config.json", path);
  else
    snprintf(file, sizeof file, "%s", path);
  config_defaults(c);
  size_t len = 0;
  char *text = read_file(file, &len);
  if (!text) return ote_error(OT_ERR_INVALID_ARGUMENT, "%s: cannot read the file", file);
  cJSON *root = cJSON_ParseWithLength(text, len);
  free(text);
  if (!root) return ote_error(OT_ERR_INVALID_ARGUMENT, "%s: not valid JSON", file);
  ot_status s = parse_config(root, c, file);
  cJSON_Delete(root);
  return s;
}
