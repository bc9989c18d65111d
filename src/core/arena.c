/*
 * arena.c -- the arena allocator (ot_arena): one reservation, segregated free lists,
 * boundary-tag coalescing, host-side bookkeeping for host or device memory.
 *
 * Blocks (arena_block) tile the reservation in address order (prev / next). A free block
 * is also in the free list of its size class; a live block is in the hash table keyed
 * by its offset, which is how ot_arena_free finds it from the pointer. Block records are
 * recycled through a spare list so that steady-state alloc / free does not call malloc.
 * All sizes inside are in bytes, multiples of OT_ARENA_ALIGN.
 */
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>

#include "arena.h"
#include "backend.h"
#include "memory_tracker.h"

typedef struct arena_block {
  size_t off, size;
  struct arena_block *prev, *next;   /* address order */
  struct arena_block *fprev, *fnext; /* free list of its class (free blocks) */
  struct arena_block *hnext;         /* hash chain (live blocks) / spare list */
  void *stream;                      /* free blocks: stream of the last free, or NULL */
  bool free;
  int8_t tag;                        /* live blocks: ot_memory_tag and op index (tracker) */
  int16_t op;
} arena_block;

struct ot_arena {
  pthread_mutex_t lock;
  DLDevice device;
  char *base;
  size_t reserved;
  bool stream_ordered; /* CUDA arenas (tests may turn it on for host arenas) */
  arena_block *head;   /* the block at offset 0 */
  arena_block *free_lists[OT_ARENA_CLASSES];
  uint64_t nonempty;   /* bit c set when free_lists[c] is not empty */
  arena_block **buckets;
  size_t nbuckets;     /* power of two */
  arena_block *spare;
  size_t in_use, peak;
  uint64_t live, nfree_blocks, nallocs, nfrees, nfailed;
  /* Cross-stream reuse (see ot_arena_wait_fn in arena.h): NULL = only after
   * ot_arena_synchronize; CUDA arenas order the streams with an event. */
  ot_arena_wait_fn wait;
  uint64_t nwaits;
};

/* ---- size classes and free lists ----------------------------------------------- */

static int size_class(size_t size) {
  size_t units = size / OT_ARENA_ALIGN; /* >= 1 */
  int c = 63 - __builtin_clzll((unsigned long long)units);
  return c < OT_ARENA_CLASSES ? c : OT_ARENA_CLASSES - 1;
}

static void list_push(ot_arena *a, arena_block *b) {
  int c = size_class(b->size);
  b->fprev = NULL;
  b->fnext = a->free_lists[c];
  if (b->fnext) b->fnext->fprev = b;
  a->free_lists[c] = b;
  a->nonempty |= 1ull << c;
  a->nfree_blocks++;
}

static void list_remove(ot_arena *a, arena_block *b) {
  int c = size_class(b->size);
  if (b->fprev) b->fprev->fnext = b->fnext;
  else a->free_lists[c] = b->fnext;
  if (b->fnext) b->fnext->fprev = b->fprev;
  if (!a->free_lists[c]) a->nonempty &= ~(1ull << c);
  b->fprev = b->fnext = NULL;
  a->nfree_blocks--;
}

/* ---- the hash table of live blocks ---------------------------------------------- */

static size_t hash_of(const ot_arena *a, size_t off) {
  uint64_t k = (uint64_t)(off / OT_ARENA_ALIGN) * 0x9E3779B97F4A7C15ull;
  return (size_t)(k >> 20) & (a->nbuckets - 1);
}

/* Doubles the table when it gets full; on failure to grow it simply stays as is. */
static void hash_maybe_grow(ot_arena *a) {
  if (a->live < a->nbuckets) return;
  size_t n = a->nbuckets * 2;
  arena_block **nb = (arena_block **)calloc(n, sizeof *nb);
  if (!nb) return;
  size_t old_n = a->nbuckets;
  arena_block **old = a->buckets;
  a->buckets = nb;
  a->nbuckets = n;
  for (size_t i = 0; i < old_n; i++)
    for (arena_block *b = old[i], *nx; b; b = nx) {
      nx = b->hnext;
      size_t h = hash_of(a, b->off);
      b->hnext = nb[h];
      nb[h] = b;
    }
  free(old);
}

static void hash_insert(ot_arena *a, arena_block *b) {
  size_t h = hash_of(a, b->off);
  b->hnext = a->buckets[h];
  a->buckets[h] = b;
}

/* Removes and returns the live block at `off`, or NULL. */
static arena_block *hash_take(ot_arena *a, size_t off) {
  arena_block **pp = &a->buckets[hash_of(a, off)];
  for (; *pp; pp = &(*pp)->hnext)
    if ((*pp)->off == off) {
      arena_block *b = *pp;
      *pp = b->hnext;
      b->hnext = NULL;
      return b;
    }
  return NULL;
}

/* ---- block records -------------------------------------------------------------- */

static arena_block *block_new(ot_arena *a) {
  arena_block *b = a->spare;
  if (b) a->spare = b->hnext;
  else b = (arena_block *)malloc(sizeof *b);
  if (b) memset(b, 0, sizeof *b);
  return b;
}

static void block_recycle(ot_arena *a, arena_block *b) {
  b->hnext = a->spare;
  a->spare = b;
}

/* Whether free neighbours a (before) and b may merge: only with equal stream tags, so a
 * block freed on a stream does not taint an untagged neighbour (which any stream, also
 * one capturing a CUDA graph, may take without waiting). */
static bool mergeable(const arena_block *a, const arena_block *b) {
  return a && b && a->free && b->free && a->stream == b->stream;
}

/* Append b->next, already out of every list, to b. */
static void absorb_next(ot_arena *a, arena_block *b) {
  arena_block *n = b->next;
  b->size += n->size;
  b->next = n->next;
  if (b->next) b->next->prev = b;
  block_recycle(a, n);
}

/* Merge free block b (not in any list) with its free neighbours; returns the result,
 * still in no list. */
static arena_block *coalesce(ot_arena *a, arena_block *b) {
  if (mergeable(b, b->next)) {
    list_remove(a, b->next);
    absorb_next(a, b);
  }
  if (mergeable(b->prev, b)) {
    b = b->prev;
    list_remove(a, b);
    absorb_next(a, b);
  }
  return b;
}

/* The tag of the calling thread's per-thread default stream (cudaStreamPerThread: one
 * handle, a different stream on every host thread). A value no stream handle has (odd, in
 * the kernel half of the address space) and that no other thread, not even a later one
 * (thread-local addresses and thread ids are reused), ever gets: a block freed on one
 * thread's per-thread stream is not taken at once by another thread's. */
static uint64_t thread_tags_given;
static _Thread_local uintptr_t this_thread_tag_;

static void *this_thread_tag(void) {
  if (!this_thread_tag_)
    this_thread_tag_ =
        UINTPTR_MAX - 2 * (uintptr_t)__atomic_add_fetch(&thread_tags_given, 1, __ATOMIC_RELAXED);
  return (void *)this_thread_tag_;
}

static bool is_thread_tag(const void *t) {
  return ((uintptr_t)t & 1) && (uintptr_t)t > UINTPTR_MAX / 2;
}

/* The tag of a stream in a stream-ordered arena: NULL, the legacy default stream, is a
 * stream like any other (cudaStreamLegacy's handle value), since work on a non-blocking
 * stream is not ordered after it; cudaStreamPerThread is the calling thread's own stream
 * (this_thread_tag); a tag of NULL means "free of any stream". */
static void *stream_tag(const ot_arena *a, void *stream) {
  if (!a->stream_ordered) return NULL;
  if (!stream) return OT_ARENA_LEGACY_STREAM;
  return stream == OT_ARENA_PER_THREAD_STREAM ? this_thread_tag() : stream;
}

/* The handle that names the stream of tag `t` on the calling thread, for a wait; NULL when
 * none does: another thread's per-thread stream (cudaStreamPerThread would name this
 * thread's), which only ot_arena_synchronize orders. */
static void *tag_handle(void *t) {
  if (!is_thread_tag(t)) return t; /* a handle, or cudaStreamLegacy's value */
  return t == this_thread_tag() ? OT_ARENA_PER_THREAD_STREAM : NULL;
}

static bool usable(const ot_arena *a, const arena_block *b, void *tag) {
  return !a->stream_ordered || b->stream == NULL || b->stream == tag;
}

/* The first usable block of >= size: within the request's own class by first fit, then
 * the first usable block of any larger class (every block there fits). */
static arena_block *find_fit(ot_arena *a, size_t size, void *tag) {
  int c0 = size_class(size);
  for (arena_block *b = a->free_lists[c0]; b; b = b->fnext)
    if (b->size >= size && usable(a, b, tag)) return b;
  uint64_t mask = c0 + 1 < 64 ? a->nonempty & ~((2ull << c0) - 1) : 0;
  while (mask) {
    int c = __builtin_ctzll(mask);
    mask &= mask - 1;
    for (arena_block *b = a->free_lists[c]; b; b = b->fnext)
      if (usable(a, b, tag)) return b;
  }
  return NULL;
}

static size_t largest_free_locked(const ot_arena *a) {
  for (int c = OT_ARENA_CLASSES - 1; c >= 0; c--) {
    if (!(a->nonempty >> c & 1)) continue;
    size_t m = 0;
    for (const arena_block *b = a->free_lists[c]; b; b = b->fnext)
      if (b->size > m) m = b->size;
    return m;
  }
  return 0;
}

/* Merge every run of adjacent free blocks whose tags allow it (after tags changed). */
static void merge_free_runs(ot_arena *a) {
  for (arena_block *b = a->head; b; b = b->next)
    while (mergeable(b, b->next)) {
      list_remove(a, b->next);
      list_remove(a, b);
      absorb_next(a, b);
      list_push(a, b);
    }
}

/* The largest run of adjacent free blocks, whatever their tags: what a request could
 * get if every stream's frees were ordered before it. */
static size_t largest_free_run(const ot_arena *a) {
  size_t best = 0, run = 0;
  for (const arena_block *b = a->head; b; b = b->next) {
    run = b->free ? run + b->size : 0;
    if (run > best) best = run;
  }
  return best;
}

/* The first run of adjacent free blocks usable by `tag` (its own, or untagged) that holds
 * `size`, made one free block of `tag`; NULL when there is none. Tags keep such runs
 * apart (a block freed on a stream beside never-used memory), so find_fit misses them.
 * Giving an untagged block a tag needs no wait. */
static arena_block *claim_run(ot_arena *a, size_t size, void *tag) {
  if (!a->stream_ordered) return NULL; /* untagged only: runs are merged already */
  size_t run = 0;
  arena_block *start = NULL;
  for (arena_block *b = a->head; b; b = b->next) {
    if (!b->free || !usable(a, b, tag)) {
      run = 0;
      continue;
    }
    if (run == 0) start = b;
    run += b->size;
    if (run < size) continue;
    const arena_block *end = b->next;
    list_remove(a, start);
    start->stream = tag;
    while (start->next != end) {
      list_remove(a, start->next);
      absorb_next(a, start);
    }
    if (mergeable(start, start->next)) { /* the block after the run was `tag`'s */
      list_remove(a, start->next);
      absorb_next(a, start);
    }
    list_push(a, start);
    return start;
  }
  return NULL;
}

/* Cross-stream reuse for a request of `size` on stream tag `tag` that found no usable
 * run (find_fit, claim_run): the first run of adjacent free blocks that holds `size` once
 * the blocks of other streams in it are `tag`'s. `tag` waits (a->wait: an event recorded
 * on the other stream now, after every use of the blocks freed there) for each stream that
 * freed a block of that run, and only for those; their blocks in the run are retagged to
 * `tag` (not untagged: a third stream must in turn wait for `tag`), and claim_run makes
 * the run one block. Another thread's per-thread stream cannot be waited for (see
 * tag_handle): its blocks end runs, as live blocks do. NULL when no run fits (nothing
 * waited for) or a wait failed / is impossible (graph capture); the blocks of the streams
 * already waited for then stay `tag`'s. */
static arena_block *adopt_run(ot_arena *a, const char *op, size_t size, void *tag) {
  if (!a->stream_ordered || !a->wait) return NULL;
  size_t run = 0;
  arena_block *start = NULL, *b;
  for (b = a->head; b; b = b->next) {
    if (!b->free || (b->stream && b->stream != tag && !tag_handle(b->stream))) {
      run = 0;
      continue;
    }
    if (run == 0) start = b;
    run += b->size;
    if (run >= size) break;
  }
  if (!b) return NULL;
  const arena_block *end = b->next;
  for (arena_block *c = start; c != end; c = c->next) {
    void *other = c->stream;
    if (!other || other == tag) continue;
    if (a->wait(op, a->device, tag_handle(tag), tag_handle(other)) != OT_OK) {
      merge_free_runs(a); /* retagged neighbours may merge now */
      return NULL;
    }
    a->nwaits++;
    for (arena_block *d = c; d != end; d = d->next)
      if (d->stream == other) d->stream = tag;
  }
  /* Every block from start to end is `tag`'s or untagged now, and the block before start
   * is not (live, or another thread's): claim_run finds this run (none before it fit). */
  return claim_run(a, size, tag);
}

/* ---- public API ------------------------------------------------------------------ */

ot_status ot_arena_create(ot_context *ctx, size_t reserve_bytes, ot_arena **out) {
  static const char *op = "ot_arena_create";
  if (!ctx) return ot_error(OT_ERR_INVALID_ARGUMENT, op, "ctx: is NULL");
  if (!out) return ot_error(OT_ERR_INVALID_ARGUMENT, op, "out: is NULL");
  if (reserve_bytes == 0)
    return ot_error(OT_ERR_INVALID_ARGUMENT, op, "reserve_bytes: 0, expected >= 1");
  if (reserve_bytes > SIZE_MAX / 2)
    return ot_error(OT_ERR_INVALID_ARGUMENT, op, "reserve_bytes: %zu is too large",
                    reserve_bytes);
  size_t reserved = (reserve_bytes + OT_ARENA_ALIGN - 1) / OT_ARENA_ALIGN * OT_ARENA_ALIGN;
  ot_arena *a = (ot_arena *)calloc(1, sizeof *a);
  if (!a) return ot_error(OT_ERR_OOM, op, "cannot allocate the arena record");
  a->nbuckets = 64;
  a->buckets = (arena_block **)calloc(a->nbuckets, sizeof *a->buckets);
  a->head = (arena_block *)calloc(1, sizeof *a->head);
  if (!a->buckets || !a->head || pthread_mutex_init(&a->lock, NULL) != 0) {
    free(a->buckets), free(a->head), free(a);
    return ot_error(OT_ERR_OOM, op, "cannot allocate the arena's bookkeeping");
  }
  a->device = ctx->device;
  a->stream_ordered = ot_ctx_is_cuda(ctx);
  if (ot_ctx_is_cuda(ctx)) a->wait = ot_arena_cuda_wait;
  void *base = NULL;
  ot_status st = ot_reserve_memory(op, a->device, reserved, &base);
  if (st != OT_OK) {
    pthread_mutex_destroy(&a->lock);
    free(a->buckets), free(a->head), free(a);
    return st;
  }
  a->base = (char *)base;
  a->reserved = reserved;
  a->head->off = 0;
  a->head->size = reserved;
  a->head->free = true;
  list_push(a, a->head);
  *out = a;
  return OT_OK;
}

void ot_arena_destroy(ot_arena *a) {
  if (!a) return;
  for (arena_block *b = a->head, *n; b; b = n) {
    n = b->next;
    if (!b->free) ot_memory_record((ot_memory_tag)b->tag, b->op, b->size, -1);
    free(b);
  }
  for (arena_block *b = a->spare, *n; b; b = n) {
    n = b->hnext;
    free(b);
  }
  ot_release_memory(a->device, a->base);
  free(a->buckets);
  pthread_mutex_destroy(&a->lock);
  free(a);
}

/* quiet: a request that does not fit returns OT_ERR_OOM without recording the message
 * and without counting in num_failed (ot_arena_try_alloc_for: its caller falls back, or
 * makes the reporting request that counts); bad arguments are recorded either way. */
static ot_status arena_alloc(const char *op, const char *what, ot_arena *a, size_t bytes,
                             void *stream, ot_memory_tag tag, const char *op_name, bool quiet,
                             void **ptr) {
  if (!a) return ot_error(OT_ERR_INVALID_ARGUMENT, op, "arena: is NULL");
  if (!ptr) return ot_error(OT_ERR_INVALID_ARGUMENT, op, "ptr: is NULL");
  if (bytes == 0) return ot_error(OT_ERR_INVALID_ARGUMENT, op, "bytes: 0, expected >= 1");
  if ((int)tag < 0 || (int)tag >= OT_MEMORY_NUM_TAGS)
    return ot_error(OT_ERR_INVALID_ARGUMENT, op, "tag: %d, expected 0 .. %d", (int)tag,
                    OT_MEMORY_NUM_TAGS - 1);
  const int op_index = ot_memory_op_index(op_name);
  pthread_mutex_lock(&a->lock);
  void *stag = stream_tag(a, stream);
  size_t size = bytes > a->reserved ? a->reserved + OT_ARENA_ALIGN
                                    : (bytes + OT_ARENA_ALIGN - 1) / OT_ARENA_ALIGN * OT_ARENA_ALIGN;
  arena_block *b = NULL;
  if (size <= a->reserved) {
    b = find_fit(a, size, stag);
    if (!b) b = claim_run(a, size, stag);
    if (!b) b = adopt_run(a, op, size, stag);
  }
  arena_block *rest = NULL;
  if (b && b->size > size && !(rest = block_new(a))) b = NULL; /* no record for the split */
  if (!b) {
    size_t largest = largest_free_locked(a), free_total = a->reserved - a->in_use;
    size_t reserved = a->reserved, in_use = a->in_use;
    bool tagged = a->stream_ordered && largest_free_run(a) >= size;
    if (!quiet) a->nfailed++;
    pthread_mutex_unlock(&a->lock);
    if (quiet) return OT_ERR_OOM;
    return ot_error(OT_ERR_OOM, op,
                    "%s: cannot allocate %zu bytes (%zu rounded): the largest free block is "
                    "%zu bytes (%zu free of %zu reserved, %zu in use)%s",
                    what, bytes, size > reserved ? bytes : size, largest, free_total, reserved,
                    in_use,
                    tagged ? "; blocks freed on other streams wait for ot_arena_synchronize"
                           : "");
  }
  list_remove(a, b);
  if (rest) {
    /* The tail stays free (with b's tag); b keeps the head. */
    rest->off = b->off + size;
    rest->size = b->size - size;
    rest->free = true;
    rest->stream = b->stream;
    rest->prev = b;
    rest->next = b->next;
    if (rest->next) rest->next->prev = rest;
    b->next = rest;
    b->size = size;
    list_push(a, rest);
  }
  b->free = false;
  b->stream = NULL;
  b->tag = (int8_t)tag;
  b->op = (int16_t)op_index;
  ot_memory_record(tag, op_index, size, +1);
  hash_maybe_grow(a);
  hash_insert(a, b);
  a->live++;
  a->nallocs++;
  a->in_use += size;
  if (a->in_use > a->peak) a->peak = a->in_use;
  *ptr = a->base + b->off;
  pthread_mutex_unlock(&a->lock);
  return OT_OK;
}

ot_status ot_arena_alloc(ot_arena *a, size_t bytes, void *stream, void **ptr) {
  return arena_alloc("ot_arena_alloc", "bytes", a, bytes, stream, OT_MEMORY_OTHER, NULL, false,
                     ptr);
}

ot_status ot_arena_alloc_tagged(ot_arena *a, size_t bytes, void *stream, ot_memory_tag tag,
                                const char *op, void **ptr) {
  return arena_alloc("ot_arena_alloc_tagged", "bytes", a, bytes, stream, tag, op, false, ptr);
}

ot_status ot_arena_alloc_for(const char *op, const char *what, ot_arena *a, size_t bytes,
                             void *stream, ot_memory_tag tag, void **ptr) {
  return arena_alloc(op, what, a, bytes, stream, tag, op, false, ptr);
}

ot_status ot_arena_try_alloc_for(const char *op, const char *what, ot_arena *a, size_t bytes,
                                 void *stream, ot_memory_tag tag, void **ptr) {
  return arena_alloc(op, what, a, bytes, stream, tag, op, true, ptr);
}

ot_status ot_arena_free(ot_arena *a, void *ptr, void *stream) {
  static const char *op = "ot_arena_free";
  if (!a) return ot_error(OT_ERR_INVALID_ARGUMENT, op, "arena: is NULL");
  if (!ptr) return ot_error(OT_ERR_INVALID_ARGUMENT, op, "ptr: is NULL");
  uintptr_t p = (uintptr_t)ptr, lo = (uintptr_t)a->base;
  if (p < lo || p >= lo + a->reserved)
    return ot_error(OT_ERR_INVALID_ARGUMENT, op, "ptr: %p is not inside this arena", ptr);
  pthread_mutex_lock(&a->lock);
  arena_block *b = hash_take(a, (size_t)(p - lo));
  if (!b) {
    pthread_mutex_unlock(&a->lock);
    return ot_error(OT_ERR_INVALID_ARGUMENT, op,
                    "ptr: %p (offset %zu) is not a live block of this arena (freed twice, or "
                    "not the start of a block)",
                    ptr, (size_t)(p - lo));
  }
  a->live--;
  a->nfrees++;
  a->in_use -= b->size;
  ot_memory_record((ot_memory_tag)b->tag, b->op, b->size, -1);
  b->free = true;
  b->stream = stream_tag(a, stream);
  b = coalesce(a, b);
  list_push(a, b);
  pthread_mutex_unlock(&a->lock);
  return OT_OK;
}

ot_status ot_arena_synchronize(ot_arena *a) {
  static const char *op = "ot_arena_synchronize";
  if (!a) return ot_error(OT_ERR_INVALID_ARGUMENT, op, "arena: is NULL");
  /* Locked across the device synchronization: a block another thread frees after it
   * began may still be used by work it did not wait for, and must keep its tag. */
  pthread_mutex_lock(&a->lock);
  ot_status st = OT_OK;
  if (a->device.device_type == kDLCUDA)
    st = OT_CUDA_CALL(op, ot_cuda_synchronize, op, a->device.device_id);
  if (st == OT_OK) {
    /* Clear every tag, then merge the runs of free blocks that tags kept apart. */
    for (arena_block *b = a->head; b; b = b->next)
      if (b->free) b->stream = NULL;
    merge_free_runs(a);
  }
  pthread_mutex_unlock(&a->lock);
  return st;
}

ot_status ot_arena_get_stats(ot_arena *a, ot_arena_stats *s) {
  static const char *op = "ot_arena_get_stats";
  if (!a) return ot_error(OT_ERR_INVALID_ARGUMENT, op, "arena: is NULL");
  if (!s) return ot_error(OT_ERR_INVALID_ARGUMENT, op, "stats: is NULL");
  pthread_mutex_lock(&a->lock);
  memset(s, 0, sizeof *s);
  s->reserved = a->reserved;
  s->in_use = a->in_use;
  s->peak = a->peak;
  s->free_total = a->reserved - a->in_use;
  s->largest_free = largest_free_locked(a);
  s->fragmentation = s->free_total ? 1.0 - (double)s->largest_free / (double)s->free_total : 0.0;
  s->live_blocks = a->live;
  s->free_blocks = a->nfree_blocks;
  s->num_allocs = a->nallocs;
  s->num_frees = a->nfrees;
  s->num_failed = a->nfailed;
  pthread_mutex_unlock(&a->lock);
  return OT_OK;
}

DLDevice ot_arena_device(const ot_arena *a) { return a->device; }

ot_status ot_context_set_arena(ot_context *ctx, ot_arena *arena) {
  static const char *op = "ot_context_set_arena";
  if (!ctx) return ot_error(OT_ERR_INVALID_ARGUMENT, op, "ctx: is NULL");
  if (!ot_ctx_is_cuda(ctx)) {
    /* CPU: ops take their temporaries from the arena (src/cpu/temp.h) and give each
     * back before they return, so attach and detach hold nothing. */
    if (arena && arena->device.device_type != kDLCPU)
      return ot_error(OT_ERR_INVALID_ARGUMENT, op,
                      "arena: reserved on CUDA device %d, the context runs on the CPU (a CPU "
                      "context takes a host arena: ot_arena_create on a CPU context)",
                      arena->device.device_id);
    ctx->host_arena = arena;
    return OT_OK;
  }
  if (arena && (arena->device.device_type != kDLCUDA ||
                arena->device.device_id != ctx->device.device_id))
    return ot_error(OT_ERR_INVALID_ARGUMENT, op,
                    "arena: reserved on %s device %d, the context runs on CUDA device %d",
                    arena->device.device_type == kDLCUDA ? "CUDA" : "host",
                    arena->device.device_id, ctx->device.device_id);
  return OT_CUDA_CALL(op, ot_cuda_context_set_arena, ctx, arena);
}

void ot_arena_set_stream_ordered(ot_arena *a, bool on) { a->stream_ordered = on; }

void ot_arena_set_wait(ot_arena *a, ot_arena_wait_fn wait) { a->wait = wait; }

uint64_t ot_arena_num_waits(ot_arena *a) {
  pthread_mutex_lock(&a->lock);
  uint64_t n = a->nwaits;
  pthread_mutex_unlock(&a->lock);
  return n;
}

#define CHECK(cond, ...)                     \
  do {                                       \
    if (!(cond)) {                           \
      snprintf(msg, msg_size, __VA_ARGS__);  \
      ok = false;                            \
      goto done;                             \
    }                                        \
  } while (0)

bool ot_arena_check(ot_arena *a, char *msg, size_t msg_size) {
  bool ok = true;
  pthread_mutex_lock(&a->lock);
  size_t off = 0, used = 0;
  uint64_t nfree = 0, nlive = 0;
  const arena_block *prev = NULL;
  for (const arena_block *b = a->head; b; prev = b, b = b->next) {
    CHECK(b->prev == prev, "block at %zu: prev link broken", b->off);
    CHECK(b->off == off, "block at %zu: expected offset %zu (gap or overlap)", b->off, off);
    CHECK(b->size > 0 && b->size % OT_ARENA_ALIGN == 0, "block at %zu: size %zu", b->off,
          b->size);
    if (b->free) {
      nfree++;
      CHECK(!mergeable(prev, b), "free blocks at %zu and %zu were not coalesced",
            prev ? prev->off : 0, b->off);
      const arena_block *f = a->free_lists[size_class(b->size)];
      while (f && f != b) f = f->fnext;
      CHECK(f == b, "free block at %zu is not in the list of its class", b->off);
    } else {
      nlive++;
      used += b->size;
      const arena_block *h = a->buckets[hash_of(a, b->off)];
      while (h && h != b) h = h->hnext;
      CHECK(h == b, "live block at %zu is not in the hash table", b->off);
    }
    off += b->size;
  }
  CHECK(off == a->reserved, "blocks cover %zu bytes, reserved %zu", off, a->reserved);
  CHECK(used == a->in_use, "live blocks hold %zu bytes, in_use says %zu", used, a->in_use);
  CHECK(nlive == a->live, "%" PRIu64 " live blocks, counter says %" PRIu64, nlive, a->live);
  CHECK(nfree == a->nfree_blocks, "%" PRIu64 " free blocks, counter says %" PRIu64, nfree,
        a->nfree_blocks);
  uint64_t listed = 0;
  for (int c = 0; c < OT_ARENA_CLASSES; c++) {
    CHECK(((a->nonempty >> c) & 1) == (a->free_lists[c] != NULL), "class %d: mask bit wrong", c);
    for (const arena_block *f = a->free_lists[c]; f; f = f->fnext) {
      CHECK(f->free && size_class(f->size) == c, "class %d lists a wrong block", c);
      listed++;
    }
  }
  CHECK(listed == nfree, "free lists hold %" PRIu64 " blocks, %" PRIu64 " are free", listed,
        nfree);
done:
  pthread_mutex_unlock(&a->lock);
  return ok;
}

/* ---- reservations and copies: host here, CUDA in src/cuda/arena.cu -------------------- */

ot_status ot_reserve_memory(const char *op, DLDevice device, size_t bytes, void **ptr) {
  if (device.device_type == kDLCUDA)
    return OT_CUDA_CALL(op, ot_cuda_reserve, op, device.device_id, bytes, ptr);
  size_t rounded = (bytes + OT_ARENA_ALIGN - 1) / OT_ARENA_ALIGN * OT_ARENA_ALIGN;
  void *p = aligned_alloc(OT_ARENA_ALIGN, rounded);
  if (!p) return ot_error(OT_ERR_OOM, op, "cannot reserve %zu bytes of host memory", bytes);
  *ptr = p;
  return OT_OK;
}

void ot_release_memory(DLDevice device, void *ptr) {
  if (!ptr) return;
  if (device.device_type == kDLCUDA) {
#ifdef OT_HAVE_CUDA
    ot_cuda_release(device.device_id, ptr);
#endif
    return;
  }
  free(ptr);
}

ot_status ot_arena_cuda_wait(const char *op, DLDevice device, void *waiter, void *producer) {
  return OT_CUDA_CALL(op, ot_cuda_stream_wait, op, device.device_id, waiter, producer);
}

ot_status ot_device_copy(const char *op, ot_context *ctx, void *dst, const void *src,
                         size_t bytes) {
  if (ot_ctx_is_cuda(ctx)) return OT_CUDA_CALL(op, ot_cuda_copy, op, ctx, dst, src, bytes);
  if (bytes) memcpy(dst, src, bytes);
  return OT_OK;
}
