/* weights.c -- the engine's weights: HF tensor names -> fused engine tensors.
 *
 * Per layer, q/k/v_proj are concatenated by rows into one qkv weight [(Hq+2Hkv)*D, H]
 * (one GEMM; the output columns are q heads, k heads, v heads) and gate/up_proj into one
 * gate_up weight [2F, H] (ot_glu_forward's fused layout: gate in the first F features).
 * Every tensor is converted at load to the engine's storage dtype. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"

/* Allocates a weight of n elements on the engine's device, registered for freeing. */
static ot_status weight_new(ote_engine *e, size_t n, void **out) {
  if (e->carve) { /* a streamed layer: its part of the layer's pinned block */
    size_t b = (n * ote_dtype_size(e->opt.dtype) + 255) / 256 * 256;
    if (e->carve_off + b > e->off.layer_bytes)
      return ote_error(OT_ERR_INTERNAL, "engine: offload: layer block overflow");
    *out = e->carve + e->carve_off;
    e->carve_off += b;
    e->weight_host_bytes += b;
    return OT_OK;
  }
  if (e->n_weight_blocks == e->cap_weight_blocks) {
    int cap = e->cap_weight_blocks ? 2 * e->cap_weight_blocks : 64;
    void **g = realloc(e->weight_blocks, sizeof *g * (size_t)cap);
    if (!g) return ote_error(OT_ERR_OOM, "engine: out of memory");
    e->weight_blocks = g;
    e->cap_weight_blocks = cap;
  }
  size_t bytes = n * ote_dtype_size(e->opt.dtype);
  OTE_TRY(ote_dev_alloc(&e->dev, bytes, out));
  e->weight_blocks[e->n_weight_blocks++] = *out;
  e->weight_bytes += bytes;
  return OT_OK;
}

/* With weight streaming, layer l's tensors are carved from its pinned host block. */
static void layer_carve(ote_engine *e, int l) {
  e->carve = e->off.on ? (char *)e->off.host[l] : NULL; /* NULL: a resident layer */
  e->carve_off = 0;
}

void ote_weights_free(ote_engine *e) {
  for (int i = 0; i < e->n_weight_blocks; i++) ote_dev_free(&e->dev, e->weight_blocks[i]);
  free(e->weight_blocks);
  e->weight_blocks = NULL;
  e->n_weight_blocks = e->cap_weight_blocks = 0;
  free(e->w.layer);
  memset(&e->w, 0, sizeof e->w);
  e->weight_bytes = 0;
  e->weight_host_bytes = 0;
}

/* n values of src_dtype -> elements [offset, offset + n) of the device tensor dst. */
static ot_status put_values(ote_engine *e, void *dst, size_t offset, const void *src,
                            DLDataType src_dtype, size_t n) {
  size_t es = ote_dtype_size(e->opt.dtype);
  char *d = (char *)dst + offset * es;
  if (e->dev.dev.device_type == kDLCPU || e->carve) { /* host memory */
    ote_convert(d, e->opt.dtype, src, src_dtype, n);
    return OT_OK;
  }
  void *stage = malloc(n * es);
  if (!stage) return ote_error(OT_ERR_OOM, "engine: out of host memory staging a weight");
  ote_convert(stage, e->opt.dtype, src, src_dtype, n);
  ot_status st = ote_dev_upload(&e->dev, d, stage, n * es);
  free(stage);
  return st;
}

typedef struct loader {
  ote_engine *e;
  const ote_st_set *set;
  const char *dir;
} loader;

static void shape_str(char *buf, size_t len, int ndim, const int64_t *shape) {
  size_t o = 0;
  o += (size_t)snprintf(buf + o, len - o, "[");
  for (int i = 0; i < ndim && o < len; i++)
    o += (size_t)snprintf(buf + o, len - o, "%s%lld", i ? ", " : "", (long long)shape[i]);
  if (o < len) snprintf(buf + o, len - o, "]");
}

/* Loads tensor `name` of shape [rows] or [rows, cols] into dst at element offset. */
static ot_status load_into(loader *L, const char *name, int64_t rows, int64_t cols, void *dst,
                           size_t offset) {
  const ote_st_tensor *t = ote_st_find(L->set, name);
  int ndim = cols ? 2 : 1;
  int64_t want[2] = {rows, cols};
  char ws[64], hs[96];
  shape_str(ws, sizeof ws, ndim, want);
  if (!t)
    return ote_error(OT_ERR_INVALID_ARGUMENT, "%s: missing tensor %s (expected shape %s)", L->dir,
                     name, ws);
  const char *file = L->set->paths[t->file];
  DLDataType dt;
  if (!ote_st_dtype(t->dtype, &dt))
    return ote_error(OT_ERR_UNSUPPORTED, "%s: tensor %s: dtype %s is not supported (F32, F16, BF16)",
                     file, name, t->dtype);
  bool ok = t->ndim == ndim && t->shape[0] == rows && (ndim == 1 || t->shape[1] == cols);
  if (!ok) {
    shape_str(hs, sizeof hs, t->ndim, t->shape);
    return ote_error(OT_ERR_INVALID_ARGUMENT, "%s: tensor %s: shape %s, but the config needs %s",
                     file, name, hs, ws);
  }
  return put_values(L->e, dst, offset, t->data, dt, (size_t)rows * (size_t)(cols ? cols : 1));
}

static ot_status load_new(loader *L, const char *name, int64_t rows, int64_t cols, void **out) {
  OTE_TRY(weight_new(L->e, (size_t)rows * (size_t)(cols ? cols : 1), out));
  return load_into(L, name, rows, cols, *out, 0);
}

ot_status ote_weights_load(ote_engine *e, const ote_st_set *set, const char *dir) {
  const ote_config *c = &e->cfg;
  loader L = {e, set, dir};
  int64_t H = c->hidden, D = c->head_dim, F = c->ffn, V = c->vocab;
  int64_t q_rows = c->heads * D, kv_rows = c->kv_heads * D, qkv_rows = q_rows + 2 * kv_rows;
  e->w.layer = calloc((size_t)c->layers, sizeof *e->w.layer);
  if (!e->w.layer) return ote_error(OT_ERR_OOM, "engine: out of memory");
  OTE_TRY(load_new(&L, "model.embed_tokens.weight", V, H, &e->w.embed));
  OTE_TRY(load_new(&L, "model.norm.weight", H, 0, &e->w.final_norm));
  if (c->tie_word_embeddings)
    e->w.lm_head = e->w.embed;
  else
    OTE_TRY(load_new(&L, "lm_head.weight", V, H, &e->w.lm_head));
  char n[256];
#define NAME(fmt) (snprintf(n, sizeof n, "model.layers.%d." fmt, l), n)
  for (int l = 0; l < c->layers; l++) {
    ote_layer_weights *w = &e->w.layer[l];
    layer_carve(e, l);
    OTE_TRY(load_new(&L, NAME("input_layernorm.weight"), H, 0, &w->attn_norm));
    OTE_TRY(load_new(&L, NAME("post_attention_layernorm.weight"), H, 0, &w->mlp_norm));
    OTE_TRY(weight_new(e, (size_t)(qkv_rows * H), &w->qkv));
    OTE_TRY(load_into(&L, NAME("self_attn.q_proj.weight"), q_rows, H, w->qkv, 0));
    OTE_TRY(load_into(&L, NAME("self_attn.k_proj.weight"), kv_rows, H, w->qkv, (size_t)(q_rows * H)));
    OTE_TRY(load_into(&L, NAME("self_attn.v_proj.weight"), kv_rows, H, w->qkv,
                      (size_t)((q_rows + kv_rows) * H)));
    if (c->qkv_bias) {
      OTE_TRY(weight_new(e, (size_t)qkv_rows, &w->qkv_bias));
      OTE_TRY(load_into(&L, NAME("self_attn.q_proj.bias"), q_rows, 0, w->qkv_bias, 0));
      OTE_TRY(load_into(&L, NAME("self_attn.k_proj.bias"), kv_rows, 0, w->qkv_bias, (size_t)q_rows));
      OTE_TRY(load_into(&L, NAME("self_attn.v_proj.bias"), kv_rows, 0, w->qkv_bias,
                        (size_t)(q_rows + kv_rows)));
    }
    OTE_TRY(load_new(&L, NAME("self_attn.o_proj.weight"), H, q_rows, &w->o));
    if (c->o_bias) OTE_TRY(load_new(&L, NAME("self_attn.o_proj.bias"), H, 0, &w->o_bias));
    OTE_TRY(weight_new(e, (size_t)(2 * F * H), &w->gate_up));
    OTE_TRY(load_into(&L, NAME("mlp.gate_proj.weight"), F, H, w->gate_up, 0));
    OTE_TRY(load_into(&L, NAME("mlp.up_proj.weight"), F, H, w->gate_up, (size_t)(F * H)));
    OTE_TRY(load_new(&L, NAME("mlp.down_proj.weight"), H, F, &w->down));
  }
  e->carve = NULL;
#undef NAME
  return OT_OK;
}

/* ---- random weights: uniform with std 0.02 (norm weights 1), from a seed ---------- */

static uint64_t splitmix64(uint64_t *s) {
  uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

/* Chunks of the tensor have their own streams (parallel and reproducible). */
static ot_status random_new(ote_engine *e, uint64_t seed, uint64_t tensor_id, size_t n, float std,
                            float constant, void **out) {
  OTE_TRY(weight_new(e, n, out));
  enum { CHUNK = 1 << 14 };
  if (e->dev.dev.device_type != kDLCPU && !e->carve) /* the same values, on the device */
    return ote_dev_fill_random(&e->dev, *out, n, e->opt.dtype, seed, tensor_id,
                               std == 0 ? 0.0f : std * sqrtf(3.0f), constant);
  size_t chunks = (n + CHUNK - 1) / CHUNK;
  float a = std * sqrtf(3.0f);
  ot_status st = OT_OK;
#pragma omp parallel for schedule(dynamic, 1)
  for (size_t ci = 0; ci < chunks; ci++) {
    float buf[CHUNK];
    uint64_t s = seed * 0x100000001b3ull ^ (tensor_id << 40) ^ ci;
    splitmix64(&s);
    size_t len = n - ci * CHUNK < CHUNK ? n - ci * CHUNK : CHUNK;
    for (size_t i = 0; i < len; i++) {
      if (std == 0) {
        buf[i] = constant;
      } else {
        double u = (double)(splitmix64(&s) >> 11) * (1.0 / 9007199254740992.0);
        buf[i] = (float)((2.0 * u - 1.0) * a);
      }
    }
    ot_status s2 = put_values(e, *out, ci * CHUNK, buf, OTE_F32, len);
    if (s2 != OT_OK) {
#pragma omp critical
      st = s2;
    }
  }
  return st;
}

ot_status ote_weights_random(ote_engine *e, uint64_t seed) {
  const ote_config *c = &e->cfg;
  size_t H = (size_t)c->hidden, D = (size_t)c->head_dim, F = (size_t)c->ffn, V = (size_t)c->vocab;
  size_t qkv_rows = (size_t)(c->heads + 2 * c->kv_heads) * D;
  const float s = 0.02f;
  uint64_t id = 0;
  e->w.layer = calloc((size_t)c->layers, sizeof *e->w.layer);
  if (!e->w.layer) return ote_error(OT_ERR_OOM, "engine: out of memory");
  /* embeddings larger than the projections, as trained models have */
  OTE_TRY(random_new(e, seed, id++, V * H, 1.0f, 0, &e->w.embed));
  OTE_TRY(random_new(e, seed, id++, H, 0, 1.0f, &e->w.final_norm));
  if (c->tie_word_embeddings)
    e->w.lm_head = e->w.embed;
  else
    OTE_TRY(random_new(e, seed, id++, V * H, s, 0, &e->w.lm_head));
  for (int l = 0; l < c->layers; l++) {
    ote_layer_weights *w = &e->w.layer[l];
    layer_carve(e, l);
    OTE_TRY(random_new(e, seed, id++, H, 0, 1.0f, &w->attn_norm));
    OTE_TRY(random_new(e, seed, id++, H, 0, 1.0f, &w->mlp_norm));
    OTE_TRY(random_new(e, seed, id++, qkv_rows * H, s, 0, &w->qkv));
    if (c->qkv_bias) OTE_TRY(random_new(e, seed, id++, qkv_rows, s, 0, &w->qkv_bias));
    OTE_TRY(random_new(e, seed, id++, H * c->heads * D, s, 0, &w->o));
    if (c->o_bias) OTE_TRY(random_new(e, seed, id++, H, s, 0, &w->o_bias));
    OTE_TRY(random_new(e, seed, id++, 2 * F * H, s, 0, &w->gate_up));
    OTE_TRY(random_new(e, seed, id++, H * F, s, 0, &w->down));
  }
  e->carve = NULL;
  return OT_OK;
}

/* ---- export: a HF-named tensor out of the fused weights (for peers on the same weights) */

ot_status ote_engine_export(ote_engine *e, const char *name, void *dst, size_t dst_bytes) {
  if (!e || !name || !dst) return ote_error(OT_ERR_INVALID_ARGUMENT, "ote_engine_export: NULL argument");
  const ote_config *c = &e->cfg;
  size_t H = (size_t)c->hidden, D = (size_t)c->head_dim, F = (size_t)c->ffn, V = (size_t)c->vocab;
  size_t q_rows = (size_t)c->heads * D, kv_rows = (size_t)c->kv_heads * D;
  const char *src = NULL;
  size_t elems = 0;
  int l = -1, used = 0;
  char suffix[128] = "";
  if (!strcmp(name, "model.embed_tokens.weight")) {
    src = e->w.embed, elems = V * H;
  } else if (!strcmp(name, "model.norm.weight")) {
    src = e->w.final_norm, elems = H;
  } else if (!strcmp(name, "lm_head.weight")) {
    src = e->w.lm_head, elems = V * H;
  } else if (sscanf(name, "model.layers.%d.%n", &l, &used) == 1 && used > 0 && l >= 0 &&
             l < c->layers && strlen(name + used) < sizeof suffix) {
    strcpy(suffix, name + used);
    const ote_layer_weights *w = &e->w.layer[l];
    size_t es = ote_dtype_size(e->opt.dtype);
    struct { const char *n; const void *p; size_t off, elems; } m[] = {
        {"input_layernorm.weight", w->attn_norm, 0, H},
        {"post_attention_layernorm.weight", w->mlp_norm, 0, H},
        {"self_attn.q_proj.weight", w->qkv, 0, q_rows * H},
        {"self_attn.k_proj.weight", w->qkv, q_rows * H, kv_rows * H},
        {"self_attn.v_proj.weight", w->qkv, (q_rows + kv_rows) * H, kv_rows * H},
        {"self_attn.q_proj.bias", w->qkv_bias, 0, q_rows},
        {"self_attn.k_proj.bias", w->qkv_bias, q_rows, kv_rows},
        {"self_attn.v_proj.bias", w->qkv_bias, q_rows + kv_rows, kv_rows},
        {"self_attn.o_proj.weight", w->o, 0, H * q_rows},
        {"self_attn.o_proj.bias", w->o_bias, 0, H},
        {"mlp.gate_proj.weight", w->gate_up, 0, F * H},
        {"mlp.up_proj.weight", w->gate_up, F * H, F * H},
        {"mlp.down_proj.weight", w->down, 0, H * F},
    };
    for (size_t i = 0; i < sizeof m / sizeof m[0]; i++)
      if (!strcmp(suffix, m[i].n) && m[i].p) {
        src = (const char *)m[i].p + m[i].off * es;
        elems = m[i].elems;
      }
  }
  if (!src) return ote_error(OT_ERR_INVALID_ARGUMENT, "ote_engine_export: no tensor %s", name);
  size_t bytes = elems * ote_dtype_size(e->opt.dtype);
  if (dst_bytes != bytes)
    return ote_error(OT_ERR_INVALID_ARGUMENT,
                     "ote_engine_export: %s has %zu bytes (%s), the destination %zu", name, bytes,
                     ote_dtype_name(e->opt.dtype), dst_bytes);
  OTE_TRY(ote_dev_copy_2d(&e->dev, dst, bytes, src, bytes, bytes, 1));
  return ote_dev_sync(&e->dev);
}
