/*
 * kv_cache.c -- the paged KV block pool: pages, reference counts, block tables,
 * copy-on-write, the CSR page-table export. Host bookkeeping for host or device pages;
 * the only data movement is the copy-on-write page copy (ot_device_copy: memcpy on the
 * CPU, cudaMemcpyAsync on the context's stream on CUDA).
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>

#include "arena.h"
#include "backend.h"
#include "kv_cache.h"
#include "memory_tracker.h"

typedef struct kv_seq {
  bool live;
  uint32_t gen;     /* the slot's generation: bumped when its sequence is freed */
  int64_t len;      /* tokens */
  int64_t npages;   /* = ceil(len / block_size) */
  int64_t cap;      /* capacity of pages */
  int32_t *pages;
} kv_seq;

struct ot_kv_cache {
  ot_context *ctx;
  ot_arena *arena;       /* the pages' arena, or NULL: own reservation */
  char *base;
  ot_kv_cache_params p;
  ot_dtype dtype;
  size_t page_bytes;     /* heads_kv * block_size * head_dim * elem: one page of one slab */
  size_t slab_bytes;     /* num_pages * page_bytes rounded up to 256 */
  int64_t shape[4];      /* [num_pages, heads_kv, block_size, head_dim] for the views */
  int32_t *refcount;     /* [num_pages] */
  int32_t *free_stack;   /* [num_pages]; the top nfree entries are free */
  int64_t nfree;
  kv_seq *seqs;
  int64_t nseqs;         /* slots in seqs */
  int64_t nlive;
  int64_t *free_ids;     /* dead slots, reusable (a new id: the slot's next generation) */
  int64_t nfree_ids;
  uint32_t *mark;        /* [nseqs] scratch for duplicate detection */
  uint32_t epoch;        /* the mark of the current ot_kv_cache_reserve call */
  size_t bytes;          /* of the page storage (what the tracker counts) */
};

/* A sequence id is its slot in seqs (low 32 bits) and the slot's generation (bits 32-62):
 * a slot is reused after a free, its id is not, so a stale id is refused rather than taken
 * for the slot's next sequence. The first sequence of each slot has generation 0: ids 0, 1,
 * 2, ... while nothing was freed. */
#define KV_GEN_MASK 0x7fffffffu
static inline int64_t seq_slot(int64_t id) { return id & 0xffffffff; }
static inline int64_t seq_id_of(int64_t slot, uint32_t gen) { return slot | ((int64_t)gen << 32); }

static ot_status check_seq(const char *op, const char *name, const ot_kv_cache *c, int64_t id) {
  const int64_t slot = seq_slot(id);
  if (id < 0 || slot >= c->nseqs || !c->seqs[slot].live ||
      c->seqs[slot].gen != (uint32_t)(id >> 32))
    return ot_error(OT_ERR_INVALID_ARGUMENT, op,
                    "%s: %" PRId64 " is not a live sequence (never added, or freed)", name, id);
  return OT_OK;
}

ot_status ot_kv_cache_create(ot_context *ctx, const ot_kv_cache_params *params, ot_arena *arena,
                             ot_kv_cache **out) {
  static const char *op = "ot_kv_cache_create";
  if (!ctx) return ot_error(OT_ERR_INVALID_ARGUMENT, op, "ctx: is NULL");
  if (!params) return ot_error(OT_ERR_INVALID_ARGUMENT, op, "params: is NULL");
  if (!out) return ot_error(OT_ERR_INVALID_ARGUMENT, op, "out: is NULL");
  const ot_kv_cache_params *p = params;
  if (p->num_layers < 1)
    return ot_error(OT_ERR_INVALID_ARGUMENT, op, "params.num_layers: %d, expected >= 1",
                    p->num_layers);
  if (p->num_pages < 1 || p->num_pages > INT32_MAX)
    return ot_error(OT_ERR_INVALID_ARGUMENT, op,
                    "params.num_pages: %" PRId64 ", expected 1 .. 2^31-1 (int32 page ids)",
                    p->num_pages);
  if (p->block_size < 1 || p->block_size > 256)
    return ot_error(OT_ERR_INVALID_ARGUMENT, op, "params.block_size: %d, expected 1 .. 256",
                    p->block_size);
  if (p->heads_kv < 1)
    return ot_error(OT_ERR_INVALID_ARGUMENT, op, "params.heads_kv: %d, expected >= 1",
                    p->heads_kv);
  if (p->head_dim < 1)
    return ot_error(OT_ERR_INVALID_ARGUMENT, op, "params.head_dim: %d, expected >= 1",
                    p->head_dim);
  ot_dtype dt = ot_dtype_from_dl(p->dtype);
  if (!ot_dtype_is_float(dt))
    return ot_error(OT_ERR_INVALID_ARGUMENT, op,
                    "params.dtype: %s, expected float32, float16 or bfloat16",
                    ot_dl_dtype_name(p->dtype));
  size_t page_bytes = (size_t)p->heads_kv * (size_t)p->block_size * (size_t)p->head_dim *
                      ot_dtype_size(dt);
  if ((double)page_bytes * (double)p->num_pages * 2.0 * p->num_layers > (double)(SIZE_MAX / 4))
    return ot_error(OT_ERR_INVALID_ARGUMENT, op, "params: the pool would need more than 2^62 bytes");
  size_t slab = ((size_t)p->num_pages * page_bytes + 255) / 256 * 256;
  size_t total = slab * 2 * (size_t)p->num_layers;
  if (arena) {
    DLDevice ad = ot_arena_device(arena);
    if (ad.device_type != ctx->device.device_type || ad.device_id != ctx->device.device_id)
      return ot_error(OT_ERR_INVALID_ARGUMENT, op,
                      "arena: lives on device (%d, %d), the context on (%d, %d)",
                      (int)ad.device_type, ad.device_id, (int)ctx->device.device_type,
                      ctx->device.device_id);
  }

  ot_kv_cache *c = (ot_kv_cache *)calloc(1, sizeof *c);
  if (!c) return ot_error(OT_ERR_OOM, op, "cannot allocate the cache record");
  c->refcount = (int32_t *)calloc((size_t)p->num_pages, sizeof *c->refcount);
  c->free_stack = (int32_t *)malloc((size_t)p->num_pages * sizeof *c->free_stack);
  if (!c->refcount || !c->free_stack) {
    free(c->refcount), free(c->free_stack), free(c);
    return ot_error(OT_ERR_OOM, op, "cannot allocate the page tables of %" PRId64 " pages",
                    p->num_pages);
  }
  void *base = NULL;
  ot_status st = arena ? ot_arena_alloc_tagged(arena, total, ctx->stream, OT_MEMORY_KV_CACHE,
                                               op, &base)
                       : ot_reserve_memory(op, ctx->device, total, &base);
  if (st != OT_OK) {
    free(c->refcount), free(c->free_stack), free(c);
    if (arena)
      return ot_error(st, op, "arena: cannot hold the pool of %zu bytes (%s)", total,
                      ot_last_error());
    return st;
  }
  c->ctx = ctx;
  c->arena = arena;
  c->base = (char *)base;
  c->p = *p;
  c->dtype = dt;
  c->page_bytes = page_bytes;
  c->slab_bytes = slab;
  c->shape[0] = p->num_pages;
  c->shape[1] = p->heads_kv;
  c->shape[2] = p->block_size;
  c->shape[3] = p->head_dim;
  /* Pop order: page 0 first (the stack's top is the end of the array). */
  for (int64_t i = 0; i < p->num_pages; i++) c->free_stack[i] = (int32_t)(p->num_pages - 1 - i);
  c->nfree = p->num_pages;
  c->bytes = total;
  /* An arena block is recorded by the arena; an own reservation is recorded here. */
  if (!arena) ot_memory_record(OT_MEMORY_KV_CACHE, ot_memory_op_index(op), total, +1);
  *out = c;
  return OT_OK;
}

void ot_kv_cache_destroy(ot_kv_cache *c) {
  if (!c) return;
  for (int64_t i = 0; i < c->nseqs; i++) free(c->seqs[i].pages);
  free(c->seqs);
  free(c->free_ids);
  free(c->mark);
  if (c->arena) {
    (void)ot_arena_free(c->arena, c->base, c->ctx->stream);
  } else {
    ot_release_memory(c->ctx->device, c->base);
    ot_memory_record(OT_MEMORY_KV_CACHE, ot_memory_op_index("ot_kv_cache_create"), c->bytes, -1);
  }
  free(c->refcount);
  free(c->free_stack);
  free(c);
}

ot_status ot_kv_cache_layer(ot_kv_cache *c, int layer, DLTensor *k_pages, DLTensor *v_pages) {
  static const char *op = "ot_kv_cache_layer";
  if (!c) return ot_error(OT_ERR_INVALID_ARGUMENT, op, "cache: is NULL");
  if (layer < 0 || layer >= c->p.num_layers)
    return ot_error(OT_ERR_INVALID_ARGUMENT, op, "layer: %d, expected 0 .. %d", layer,
                    c->p.num_layers - 1);
  if (!k_pages) return ot_error(OT_ERR_INVALID_ARGUMENT, op, "k_pages: is NULL");
  if (!v_pages) return ot_error(OT_ERR_INVALID_ARGUMENT, op, "v_pages: is NULL");
  DLTensor *t[2] = {k_pages, v_pages};
  for (int i = 0; i < 2; i++) {
    memset(t[i], 0, sizeof *t[i]);
    t[i]->data = c->base + (size_t)(2 * layer + i) * c->slab_bytes;
    t[i]->device = c->ctx->device;
    t[i]->ndim = 4;
    t[i]->dtype = c->p.dtype;
    t[i]->shape = c->shape;
    t[i]->strides = NULL;
    t[i]->byte_offset = 0;
  }
  return OT_OK;
}

ot_status ot_kv_cache_add_sequence(ot_kv_cache *c, int64_t *seq_id) {
  static const char *op = "ot_kv_cache_add_sequence";
  if (!c) return ot_error(OT_ERR_INVALID_ARGUMENT, op, "cache: is NULL");
  if (!seq_id) return ot_error(OT_ERR_INVALID_ARGUMENT, op, "seq_id: is NULL");
  int64_t id;
  if (c->nfree_ids > 0) {
    id = c->free_ids[--c->nfree_ids];
  } else {
    int64_t n = c->nseqs ? c->nseqs * 2 : 16;
    kv_seq *s = (kv_seq *)realloc(c->seqs, (size_t)n * sizeof *s);
    if (!s) return ot_error(OT_ERR_OOM, op, "cannot grow the sequence table to %" PRId64, n);
    c->seqs = s;
    int64_t *f = (int64_t *)realloc(c->free_ids, (size_t)n * sizeof *f);
    if (!f) return ot_error(OT_ERR_OOM, op, "cannot grow the sequence table to %" PRId64, n);
    c->free_ids = f;
    uint32_t *m = (uint32_t *)realloc(c->mark, (size_t)n * sizeof *m);
    if (!m) return ot_error(OT_ERR_OOM, op, "cannot grow the sequence table to %" PRId64, n);
    c->mark = m;
    memset(c->seqs + c->nseqs, 0, (size_t)(n - c->nseqs) * sizeof *s);
    memset(c->mark + c->nseqs, 0, (size_t)(n - c->nseqs) * sizeof *m);
    /* New slots are free ids, lowest id on top. */
    for (int64_t i = n - 1; i > c->nseqs; i--) c->free_ids[c->nfree_ids++] = i;
    id = c->nseqs;
    c->nseqs = n;
  }
  kv_seq *s = &c->seqs[id];
  s->live = true;
  s->len = 0;
  s->npages = 0;
  c->nlive++;
  *seq_id = seq_id_of(id, s->gen);
  return OT_OK;
}

static void release_pages(ot_kv_cache *c, kv_seq *s) {
  for (int64_t i = 0; i < s->npages; i++) {
    int32_t pg = s->pages[i];
    if (--c->refcount[pg] == 0) c->free_stack[c->nfree++] = pg;
  }
  s->npages = 0;
  s->len = 0;
}

ot_status ot_kv_cache_free_sequence(ot_kv_cache *c, int64_t seq_id) {
  static const char *op = "ot_kv_cache_free_sequence";
  if (!c) return ot_error(OT_ERR_INVALID_ARGUMENT, op, "cache: is NULL");
  OT_TRY(check_seq(op, "seq_id", c, seq_id));
  kv_seq *s = &c->seqs[seq_slot(seq_id)];
  release_pages(c, s);
  s->live = false;
  s->gen = (s->gen + 1) & KV_GEN_MASK;
  c->nlive--;
  c->free_ids[c->nfree_ids++] = seq_slot(seq_id);
  return OT_OK;
}

static ot_status ensure_cap(const char *op, kv_seq *s, int64_t need) {
  if (s->cap >= need) return OT_OK;
  int64_t n = s->cap ? s->cap : 4;
  while (n < need) n *= 2;
  int32_t *pg = (int32_t *)realloc(s->pages, (size_t)n * sizeof *pg);
  if (!pg) return ot_error(OT_ERR_OOM, op, "cannot grow a block table to %" PRId64 " pages", n);
  s->pages = pg;
  s->cap = n;
  return OT_OK;
}

ot_status ot_kv_cache_fork(ot_kv_cache *c, int64_t src_seq, int64_t *new_seq) {
  static const char *op = "ot_kv_cache_fork";
  if (!c) return ot_error(OT_ERR_INVALID_ARGUMENT, op, "cache: is NULL");
  OT_TRY(check_seq(op, "src_seq", c, src_seq));
  if (!new_seq) return ot_error(OT_ERR_INVALID_ARGUMENT, op, "new_seq: is NULL");
  int64_t id;
  OT_TRY(ot_kv_cache_add_sequence(c, &id));
  kv_seq *src = &c->seqs[seq_slot(src_seq)], *dst = &c->seqs[seq_slot(id)];
  ot_status st = ensure_cap(op, dst, src->npages);
  if (st != OT_OK) {
    (void)ot_kv_cache_free_sequence(c, id);
    return st;
  }
  for (int64_t i = 0; i < src->npages; i++) {
    dst->pages[i] = src->pages[i];
    c->refcount[src->pages[i]]++;
  }
  dst->npages = src->npages;
  dst->len = src->len;
  *new_seq = id;
  return OT_OK;
}

/* Copy page `from` into page `to` in every slab (all layers, K and V). */
static ot_status copy_page(const char *op, ot_kv_cache *c, int32_t from, int32_t to) {
  for (int64_t s = 0; s < 2 * (int64_t)c->p.num_layers; s++) {
    char *slab = c->base + (size_t)s * c->slab_bytes;
    OT_TRY(ot_device_copy(op, c->ctx, slab + (size_t)to * c->page_bytes,
                          slab + (size_t)from * c->page_bytes, c->page_bytes));
  }
  return OT_OK;
}

ot_status ot_kv_cache_reserve(ot_kv_cache *c, int n, const int64_t *seq_ids,
                              const int64_t *num_tokens) {
  static const char *op = "ot_kv_cache_reserve";
  if (!c) return ot_error(OT_ERR_INVALID_ARGUMENT, op, "cache: is NULL");
  if (n < 0) return ot_error(OT_ERR_INVALID_ARGUMENT, op, "n: %d, expected >= 0", n);
  if (n > 0 && !seq_ids) return ot_error(OT_ERR_INVALID_ARGUMENT, op, "seq_ids: is NULL");
  if (n > 0 && !num_tokens) return ot_error(OT_ERR_INVALID_ARGUMENT, op, "num_tokens: is NULL");
  const int64_t bs = c->p.block_size;
  if (++c->epoch == 0) { /* wrapped: forget all old marks */
    if (c->mark) memset(c->mark, 0, (size_t)c->nseqs * sizeof *c->mark);
    c->epoch = 1;
  }
  const uint32_t epoch = c->epoch;
  int64_t need = 0, cow = 0;
  for (int i = 0; i < n; i++) {
    char name[48];
    snprintf(name, sizeof name, "seq_ids[%d]", i);
    OT_TRY(check_seq(op, name, c, seq_ids[i]));
    if (c->mark[seq_slot(seq_ids[i])] == epoch)
      return ot_error(OT_ERR_INVALID_ARGUMENT, op,
                      "seq_ids[%d]: %" PRId64 " appears twice (ids must be distinct)", i,
                      seq_ids[i]);
    c->mark[seq_slot(seq_ids[i])] = epoch;
    const kv_seq *s = &c->seqs[seq_slot(seq_ids[i])];
    if (num_tokens[i] < 0 || num_tokens[i] > ((int64_t)1 << 40))
      return ot_error(OT_ERR_INVALID_ARGUMENT, op,
                      "num_tokens[%d]: %" PRId64 ", expected 0 .. 2^40", i, num_tokens[i]);
    if (num_tokens[i] == 0) continue;
    int64_t pages = (s->len + num_tokens[i] + bs - 1) / bs;
    need += pages - s->npages;
    if (s->len % bs != 0 && c->refcount[s->pages[s->npages - 1]] > 1) cow++;
  }
  if (need + cow > c->nfree)
    return ot_error(OT_ERR_OOM, op,
                    "the batch needs %" PRId64 " pages (%" PRId64 " new, %" PRId64
                    " copy-on-write) but %" PRId64 " of %" PRId64
                    " are free; no sequence was changed",
                    need + cow, need, cow, c->nfree, c->p.num_pages);
  /* Grow the block tables first: the only step that can fail. */
  for (int i = 0; i < n; i++) {
    kv_seq *s = &c->seqs[seq_slot(seq_ids[i])];
    OT_TRY(ensure_cap(op, s, (s->len + num_tokens[i] + bs - 1) / bs));
  }
  for (int i = 0; i < n; i++) {
    kv_seq *s = &c->seqs[seq_slot(seq_ids[i])];
    if (num_tokens[i] == 0) continue;
    if (s->len % bs != 0) {
      int32_t *last = &s->pages[s->npages - 1];
      if (c->refcount[*last] > 1) {
        int32_t fresh = c->free_stack[--c->nfree];
        OT_TRY(copy_page(op, c, *last, fresh));
        c->refcount[*last]--;
        c->refcount[fresh] = 1;
        *last = fresh;
      }
    }
    int64_t pages = (s->len + num_tokens[i] + bs - 1) / bs;
    while (s->npages < pages) {
      int32_t pg = c->free_stack[--c->nfree];
      c->refcount[pg] = 1;
      s->pages[s->npages++] = pg;
    }
    s->len += num_tokens[i];
  }
  return OT_OK;
}

ot_status ot_kv_cache_seq_length(const ot_kv_cache *c, int64_t seq_id, int64_t *num_tokens,
                                 int64_t *num_pages) {
  static const char *op = "ot_kv_cache_seq_length";
  if (!c) return ot_error(OT_ERR_INVALID_ARGUMENT, op, "cache: is NULL");
  OT_TRY(check_seq(op, "seq_id", c, seq_id));
  if (num_tokens) *num_tokens = c->seqs[seq_slot(seq_id)].len;
  if (num_pages) *num_pages = c->seqs[seq_slot(seq_id)].npages;
  return OT_OK;
}

ot_status ot_kv_cache_page_table(const ot_kv_cache *c, int n, const int64_t *seq_ids,
                                 int32_t *indptr, int32_t *indices, int64_t indices_capacity,
                                 int32_t *last_page_len) {
  static const char *op = "ot_kv_cache_page_table";
  if (!c) return ot_error(OT_ERR_INVALID_ARGUMENT, op, "cache: is NULL");
  if (n < 0) return ot_error(OT_ERR_INVALID_ARGUMENT, op, "n: %d, expected >= 0", n);
  if (n > 0 && !seq_ids) return ot_error(OT_ERR_INVALID_ARGUMENT, op, "seq_ids: is NULL");
  if (!indptr) return ot_error(OT_ERR_INVALID_ARGUMENT, op, "indptr: is NULL");
  if (n > 0 && !last_page_len)
    return ot_error(OT_ERR_INVALID_ARGUMENT, op, "last_page_len: is NULL");
  int64_t total = 0;
  for (int i = 0; i < n; i++) {
    char name[48];
    snprintf(name, sizeof name, "seq_ids[%d]", i);
    OT_TRY(check_seq(op, name, c, seq_ids[i]));
    total += c->seqs[seq_slot(seq_ids[i])].npages;
  }
  if (total > INT32_MAX)
    return ot_error(OT_ERR_INVALID_ARGUMENT, op,
                    "seq_ids: the batch holds %" PRId64 " pages, more than int32 indptr can count",
                    total);
  if (total > 0 && !indices) return ot_error(OT_ERR_INVALID_ARGUMENT, op, "indices: is NULL");
  if (indices_capacity < total)
    return ot_error(OT_ERR_INVALID_ARGUMENT, op,
                    "indices_capacity: %" PRId64 ", the batch needs %" PRId64, indices_capacity,
                    total);
  int64_t at = 0;
  indptr[0] = 0;
  for (int i = 0; i < n; i++) {
    const kv_seq *s = &c->seqs[seq_slot(seq_ids[i])];
    if (s->npages) memcpy(indices + at, s->pages, (size_t)s->npages * sizeof *indices);
    at += s->npages;
    indptr[i + 1] = (int32_t)at;
    last_page_len[i] = s->npages ? (int32_t)(s->len - (s->npages - 1) * c->p.block_size) : 0;
  }
  return OT_OK;
}

ot_status ot_kv_cache_get_info(const ot_kv_cache *c, ot_kv_cache_info *info) {
  static const char *op = "ot_kv_cache_get_info";
  if (!c) return ot_error(OT_ERR_INVALID_ARGUMENT, op, "cache: is NULL");
  if (!info) return ot_error(OT_ERR_INVALID_ARGUMENT, op, "info: is NULL");
  memset(info, 0, sizeof *info);
  info->num_layers = c->p.num_layers;
  info->block_size = c->p.block_size;
  info->heads_kv = c->p.heads_kv;
  info->head_dim = c->p.head_dim;
  info->num_pages = c->p.num_pages;
  info->free_pages = c->nfree;
  for (int64_t i = 0; i < c->p.num_pages; i++) info->shared_pages += c->refcount[i] > 1;
  info->num_sequences = c->nlive;
  info->bytes = c->slab_bytes * 2 * (size_t)c->p.num_layers;
  return OT_OK;
}

#define CHECK(cond, ...)                    \
  do {                                      \
    if (!(cond)) {                          \
      snprintf(msg, msg_size, __VA_ARGS__); \
      ok = false;                           \
      goto done;                            \
    }                                       \
  } while (0)

bool ot_kv_cache_check(const ot_kv_cache *c, char *msg, size_t msg_size) {
  bool ok = true;
  int64_t np = c->p.num_pages, bs = c->p.block_size;
  int32_t *refs = (int32_t *)calloc((size_t)np, sizeof *refs);
  char *in_free = (char *)calloc((size_t)np, 1);
  if (!refs || !in_free) {
    snprintf(msg, msg_size, "out of memory in the check");
    ok = false;
    goto done;
  }
  int64_t live = 0;
  for (int64_t i = 0; i < c->nseqs; i++) {
    const kv_seq *s = &c->seqs[i];
    if (!s->live) continue;
    live++;
    CHECK(s->len >= 0 && s->npages == (s->len + bs - 1) / bs,
          "sequence %" PRId64 ": %" PRId64 " tokens in %" PRId64 " pages of %" PRId64, i, s->len,
          s->npages, bs);
    for (int64_t j = 0; j < s->npages; j++) {
      CHECK(s->pages[j] >= 0 && s->pages[j] < np, "sequence %" PRId64 " page %" PRId64
            " = %d out of range", i, j, s->pages[j]);
      refs[s->pages[j]]++;
    }
  }
  CHECK(live == c->nlive, "%" PRId64 " live sequences, counter says %" PRId64, live, c->nlive);
  CHECK(c->nfree >= 0 && c->nfree <= np, "nfree %" PRId64, c->nfree);
  for (int64_t i = 0; i < c->nfree; i++) {
    int32_t pg = c->free_stack[i];
    CHECK(pg >= 0 && pg < np && !in_free[pg], "free stack entry %" PRId64 " = %d bad or twice",
          i, pg);
    in_free[pg] = 1;
  }
  int64_t used = 0;
  for (int64_t pg = 0; pg < np; pg++) {
    CHECK(refs[pg] == c->refcount[pg], "page %" PRId64 ": reference count %d, held by %d tables",
          pg, c->refcount[pg], refs[pg]);
    CHECK((refs[pg] == 0) == (in_free[pg] != 0), "page %" PRId64 ": %d references but %s", pg,
          refs[pg], in_free[pg] ? "on the free stack" : "not on the free stack");
    used += refs[pg] > 0;
  }
  CHECK(used + c->nfree == np, "used %" PRId64 " + free %" PRId64 " != %" PRId64, used, c->nfree,
        np);
done:
  free(refs);
  free(in_free);
  return ok;
}
