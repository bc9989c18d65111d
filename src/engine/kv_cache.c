/* kv_cache.c -- the engine's K/V of past tokens in the library's paged pool (ot_kv_cache):
 * slots -> pool sequences, token slots reserved before each forward, and the CSR page table
 * of the batch built in a pinned host block and copied (one copy, ote_kv_push) into a device
 * block of fixed address (on the CPU the host block itself), so that a decode step captured
 * in a CUDA graph -- the copy included -- finds this step's table where the capture saw
 * last step's. */
#include <stdlib.h>
#include <string.h>

#include "internal.h"

ot_status ote_kv_create(ote_kv_cache *c, ot_context *ctx, const ote_device *d, int layers,
                        int max_seqs, int max_len, int kv_heads, int head_dim, DLDataType dt,
                        int block_size) {
  memset(c, 0, sizeof *c);
  if (block_size <= 0) block_size = 16;
  if (block_size > 256)
    return ote_error(OT_ERR_INVALID_ARGUMENT, "engine: kv block size %d (1 .. 256)", block_size);
  c->layers = layers;
  c->max_seqs = max_seqs;
  c->max_len = max_len;
  c->kv_heads = kv_heads;
  c->head_dim = head_dim;
  c->dtype = dt;
  c->block_size = block_size;
  c->pages_per_seq = (max_len + block_size - 1) / block_size;
  c->capacity = (int64_t)max_seqs * c->pages_per_seq;
  ot_kv_cache_params p = {layers, c->capacity, block_size, kv_heads, head_dim, dt};
  ot_status st = ot_kv_cache_create(ctx, &p, NULL, &c->pool);
  if (st != OT_OK) return ote_op_error(st, "engine: kv cache");
  c->handle = malloc(sizeof *c->handle * (size_t)max_seqs);
  c->len = calloc((size_t)max_seqs, sizeof *c->len);
  c->k_pages = calloc((size_t)layers, sizeof *c->k_pages);
  c->v_pages = calloc((size_t)layers, sizeof *c->v_pages);
  c->ids = malloc(sizeof *c->ids * (size_t)max_seqs);
  c->add = malloc(sizeof *c->add * (size_t)max_seqs);
  if (!c->ids || !c->add || !c->handle || !c->len || !c->k_pages || !c->v_pages) {
    ote_kv_destroy(c, d);
    return ote_error(OT_ERR_OOM, "engine: out of memory");
  }
  for (int i = 0; i < max_seqs; i++) c->handle[i] = -1;
  for (int l = 0; l < layers; l++) {
    st = ot_kv_cache_layer(c->pool, l, &c->k_pages[l], &c->v_pages[l]);
    if (st != OT_OK) {
      ote_kv_destroy(c, d);
      return ote_op_error(st, "engine: kv cache layer");
    }
  }
  ot_kv_cache_info info;
  if (ot_kv_cache_get_info(c->pool, &info) == OT_OK) c->bytes = info.bytes;
  /* the table block: tokens | indptr | last_page_len | indices (see internal.h) */
  size_t a = ((size_t)max_seqs * 4 + 255) / 256 * 256;
  size_t b = ((size_t)(max_seqs + 1) * 4 + 255) / 256 * 256;
  c->off_indices = 2 * a + b;
  c->table_bytes = c->off_indices + (size_t)c->capacity * 4;
  st = ote_dev_host_alloc(d, c->table_bytes, &c->table_h);
  if (st == OT_OK && d->dev.device_type == kDLCPU) c->table_d = c->table_h;
  else if (st == OT_OK) st = ote_dev_alloc(d, c->table_bytes, &c->table_d);
  if (st != OT_OK) {
    ote_kv_destroy(c, d);
    return st;
  }
  memset(c->table_h, 0, c->table_bytes);
  c->tok_h = (int32_t *)c->table_h;
  c->indptr_h = (int32_t *)((char *)c->table_h + a);
  c->last_h = (int32_t *)((char *)c->table_h + a + b);
  c->indices_h = (int32_t *)((char *)c->table_h + c->off_indices);
  c->tok_d = (int32_t *)c->table_d;
  c->indptr_d = (int32_t *)((char *)c->table_d + a);
  c->last_d = (int32_t *)((char *)c->table_d + a + b);
  c->indices_d = (int32_t *)((char *)c->table_d + c->off_indices);
  return OT_OK;
}

void ote_kv_destroy(ote_kv_cache *c, const ote_device *d) {
  ot_kv_cache_destroy(c->pool);
  if (c->table_d != c->table_h) ote_dev_free(d, c->table_d);
  ote_dev_host_free(d, c->table_h);
  free(c->handle);
  free(c->len);
  free(c->k_pages);
  free(c->v_pages);
  free(c->ids);
  free(c->add);
  memset(c, 0, sizeof *c);
}

ot_status ote_kv_reset(ote_kv_cache *c, int n, const int *seq) {
  for (int i = 0; i < n; i++) {
    int s = seq[i];
    if (c->handle[s] >= 0) {
      ot_status st = ot_kv_cache_free_sequence(c->pool, c->handle[s]);
      if (st != OT_OK) return ote_op_error(st, "engine: kv cache");
      c->handle[s] = -1;
    }
    c->len[s] = 0;
    ot_status st = ot_kv_cache_add_sequence(c->pool, &c->handle[s]);
    if (st != OT_OK) return ote_op_error(st, "engine: kv cache");
  }
  return OT_OK;
}

void ote_kv_drop(ote_kv_cache *c, int n, const int *seq) {
  for (int i = 0; i < n; i++) {
    int s = seq[i];
    if (c->handle[s] >= 0) (void)ot_kv_cache_free_sequence(c->pool, c->handle[s]);
    c->handle[s] = -1;
    c->len[s] = 0;
  }
}

ot_status ote_kv_reserve(ote_kv_cache *c, int n, const int *seq, const int32_t *n_new) {
  int64_t *ids = c->ids, *add = c->add;
  for (int i = 0; i < n; i++) {
    int s = seq[i];
    if (c->handle[s] < 0)
      return ote_error(OT_ERR_INVALID_ARGUMENT, "engine: sequence slot %d has no prompt", s);
    if (c->len[s] + n_new[i] > c->max_len)
      return ote_error(OT_ERR_INVALID_ARGUMENT,
                       "engine: sequence slot %d would hold %d tokens, more than max_len %d", s,
                       c->len[s] + n_new[i], c->max_len);
    ids[i] = c->handle[s];
    add[i] = n_new[i];
  }
  ot_status st = ot_kv_cache_reserve(c->pool, n, ids, add);
  if (st != OT_OK) return ote_op_error(st, "engine: kv cache reserve");
  for (int i = 0; i < n; i++) c->len[seq[i]] += n_new[i];
  st = ot_kv_cache_page_table(c->pool, n, ids, c->indptr_h, c->indices_h, c->capacity, c->last_h);
  if (st != OT_OK) return ote_op_error(st, "engine: kv cache page table");
  c->n = n;
  return OT_OK;
}

ot_status ote_kv_push(const ote_kv_cache *c, const ote_device *d, int n) {
  if (d->dev.device_type == kDLCPU) return OT_OK;
  /* n sequences use at most n * pages_per_seq entries of indices */
  size_t bytes = c->off_indices + (size_t)n * (size_t)c->pages_per_seq * 4;
  return ote_dev_upload_async(d, c->table_d, c->table_h, bytes);
}

static void vec_i32(DLTensor *t, int64_t *shape, void *data, DLDevice dev, int64_t n) {
  memset(t, 0, sizeof *t);
  shape[0] = n;
  t->data = data;
  t->device = dev;
  t->ndim = 1;
  t->dtype = (DLDataType){kDLInt, 32, 1};
  t->shape = shape;
}

void ote_kv_paged(ote_kv_cache *c, int layer, ot_paged_kv *kv) {
  DLDevice dev = c->k_pages[layer].device;
  vec_i32(&c->t_indptr, c->shape_indptr, c->indptr_d, dev, c->n + 1);
  /* n * pages_per_seq entries: a shape fixed for a batch size (a captured graph's kernels
   * keep the launch plan made from it) that also tells the paged kernel the sequences'
   * largest length (max_len), from which it plans its key splits */
  vec_i32(&c->t_indices, c->shape_indices, c->indices_d, dev, (int64_t)c->n * c->pages_per_seq);
  vec_i32(&c->t_last, c->shape_last, c->last_d, dev, c->n);
  kv->k_pages = &c->k_pages[layer];
  kv->v_pages = &c->v_pages[layer];
  kv->indptr = &c->t_indptr;
  kv->indices = &c->t_indices;
  kv->last_page_len = &c->t_last;
}
