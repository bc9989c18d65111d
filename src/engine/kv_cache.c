/* kv_cache.c -- K/V of past tokens: one contiguous [max_len, Hkv, D] block per (layer,
 * sequence slot). Deliberately small: the paged cache (ot_kv_cache, block tables) takes
 * its place behind ote_kv_write / ote_kv_view. */
#include <stdlib.h>
#include <string.h>

#include "internal.h"

static size_t block_elems(const ote_kv_cache *c) {
  return (size_t)c->max_len * (size_t)c->kv_heads * (size_t)c->head_dim;
}

ot_status ote_kv_create(ote_kv_cache *c, const ote_device *d, int layers, int max_seqs, int max_len,
                        int kv_heads, int head_dim, DLDataType dt) {
  memset(c, 0, sizeof *c);
  c->layers = layers;
  c->max_seqs = max_seqs;
  c->max_len = max_len;
  c->kv_heads = kv_heads;
  c->head_dim = head_dim;
  c->dtype = dt;
  size_t bytes = block_elems(c) * (size_t)layers * (size_t)max_seqs * ote_dtype_size(dt);
  ot_status st = ote_dev_alloc(d, bytes, &c->k);
  if (st == OT_OK) st = ote_dev_alloc(d, bytes, &c->v);
  c->len = calloc((size_t)max_seqs, sizeof *c->len);
  if (st == OT_OK && !c->len) st = ote_error(OT_ERR_OOM, "engine: out of memory");
  if (st != OT_OK) {
    ote_kv_destroy(c, d);
    return st;
  }
  c->bytes = 2 * bytes;
  return OT_OK;
}

void ote_kv_destroy(ote_kv_cache *c, const ote_device *d) {
  ote_dev_free(d, c->k);
  ote_dev_free(d, c->v);
  free(c->len);
  memset(c, 0, sizeof *c);
}

static char *block(const ote_kv_cache *c, void *base, int layer, int seq) {
  size_t idx = (size_t)layer * (size_t)c->max_seqs + (size_t)seq;
  return (char *)base + idx * block_elems(c) * ote_dtype_size(c->dtype);
}

ot_status ote_kv_write(ote_kv_cache *c, const ote_device *d, int layer, int seq, int n,
                       const void *k, const void *v, size_t src_pitch) {
  if (c->len[seq] + n > c->max_len)
    return ote_error(OT_ERR_INVALID_ARGUMENT,
                     "engine: sequence slot %d would hold %d tokens, more than max_len %d", seq,
                     c->len[seq] + n, c->max_len);
  size_t es = ote_dtype_size(c->dtype), row = (size_t)c->kv_heads * (size_t)c->head_dim * es;
  size_t off = (size_t)c->len[seq] * row;
  OTE_TRY(ote_dev_copy_2d(d, block(c, c->k, layer, seq) + off, row, k, src_pitch * es, row, (size_t)n));
  return ote_dev_copy_2d(d, block(c, c->v, layer, seq) + off, row, v, src_pitch * es, row, (size_t)n);
}

void ote_kv_view(ote_kv_cache *c, const ote_device *d, int layer, int seq, int n, ote_view *k,
                 ote_view *v) {
  int64_t shape[4] = {1, n, c->kv_heads, c->head_dim};
  ote_view_set(k, d, block(c, c->k, layer, seq), c->dtype, 4, shape, NULL);
  ote_view_set(v, d, block(c, c->v, layer, seq), c->dtype, 4, shape, NULL);
}
