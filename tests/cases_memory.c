/*
 * cases_memory.c -- the memory suite: the arena allocator (ot_arena), the paged KV
 * block pool (ot_kv_cache), ot_kv_append and ot_paged_attention.
 *
 * Arena: bad arguments, alignment, a random stress with byte patterns in every live
 * block (checked on free: no two live blocks overlap), stats invariants and the
 * allocator's own structure check after every batch of operations, exhaustion, full
 * coalescing, the stream-ordering rules, and two threads sharing one arena.
 * The CPU backend only: these tests write into the blocks with the host.
 */
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"

/* Private helpers of the library (src/core/arena.h, src/core/kv_cache.h), reachable
 * because the tests link the static library. */
void ot_arena_set_stream_ordered(ot_arena *arena, bool on);
bool ot_arena_check(ot_arena *arena, char *msg, size_t msg_size);

/* ---- arena ----------------------------------------------------------------------- */

static bool arena_consistent(test_run *tr, ot_arena *a, const char *when) {
  char msg[256];
  if (!ot_arena_check(a, msg, sizeof msg)) {
    tr_fail(tr, "%s: arena structure: %s", when, msg);
    return false;
  }
  ot_arena_stats s;
  if (ot_arena_get_stats(a, &s) != OT_OK) {
    tr_fail(tr, "%s: ot_arena_get_stats: %s", when, ot_last_error());
    return false;
  }
  if (s.in_use + s.free_total != s.reserved || s.peak < s.in_use || s.largest_free > s.free_total ||
      s.fragmentation < 0 || s.fragmentation > 1 || s.num_allocs - s.num_frees != s.live_blocks ||
      (s.free_total > 0 && s.free_blocks == 0) || (s.free_total == 0 && s.largest_free != 0)) {
    tr_fail(tr,
            "%s: stats inconsistent: reserved %zu in_use %zu free %zu largest %zu peak %zu "
            "frag %g live %llu allocs %llu frees %llu",
            when, s.reserved, s.in_use, s.free_total, s.largest_free, s.peak, s.fragmentation,
            (unsigned long long)s.live_blocks, (unsigned long long)s.num_allocs,
            (unsigned long long)s.num_frees);
    return false;
  }
  return true;
}

static void arena_bad_args(test_run *tr) {
  if (!tr_begin(tr, "arena bad arguments")) return;
  ot_context *ctx = tr->be->ctx;
  ot_arena *a = (ot_arena *)(uintptr_t)0x1234;
  tr_expect_error(tr, ot_arena_create(NULL, 1024, &a), OT_ERR_INVALID_ARGUMENT,
                  "ot_arena_create: ctx", NULL);
  tr_expect_error(tr, ot_arena_create(ctx, 0, &a), OT_ERR_INVALID_ARGUMENT,
                  "ot_arena_create: reserve_bytes", ">= 1");
  tr_expect_error(tr, ot_arena_create(ctx, 1024, NULL), OT_ERR_INVALID_ARGUMENT,
                  "ot_arena_create: out", NULL);
  if (a != (ot_arena *)(uintptr_t)0x1234) tr_fail(tr, "out written by a failing create");
  ot_arena_destroy(NULL);
  a = NULL;
  if (!tr_ok(tr, ot_arena_create(ctx, 1000, &a), "create")) goto done;
  void *p = (void *)(uintptr_t)0x77, *q = NULL;
  tr_expect_error(tr, ot_arena_alloc(NULL, 8, NULL, &p), OT_ERR_INVALID_ARGUMENT,
                  "ot_arena_alloc: arena", NULL);
  tr_expect_error(tr, ot_arena_alloc(a, 0, NULL, &p), OT_ERR_INVALID_ARGUMENT,
                  "ot_arena_alloc: bytes", ">= 1");
  tr_expect_error(tr, ot_arena_alloc(a, 8, NULL, NULL), OT_ERR_INVALID_ARGUMENT,
                  "ot_arena_alloc: ptr", NULL);
  tr_expect_error(tr, ot_arena_alloc(a, (size_t)1 << 40, NULL, &p), OT_ERR_OOM,
                  "1099511627776 bytes", "largest free block is 1024 bytes");
  if (p != (void *)(uintptr_t)0x77) tr_fail(tr, "ptr written by a failing alloc");
  if (!tr_ok(tr, ot_arena_alloc(a, 1, NULL, &q), "alloc 1")) goto done;
  int x;
  tr_expect_error(tr, ot_arena_free(a, &x, NULL), OT_ERR_INVALID_ARGUMENT,
                  "ot_arena_free: ptr", "not inside this arena");
  tr_expect_error(tr, ot_arena_free(a, (char *)q + 256, NULL), OT_ERR_INVALID_ARGUMENT,
                  "ot_arena_free: ptr", "not a live block");
  tr_expect_error(tr, ot_arena_free(a, NULL, NULL), OT_ERR_INVALID_ARGUMENT,
                  "ot_arena_free: ptr", "NULL");
  tr_ok(tr, ot_arena_free(a, q, NULL), "free");
  tr_expect_error(tr, ot_arena_free(a, q, NULL), OT_ERR_INVALID_ARGUMENT, "ot_arena_free: ptr",
                  "freed twice");
  tr_expect_error(tr, ot_arena_get_stats(a, NULL), OT_ERR_INVALID_ARGUMENT,
                  "ot_arena_get_stats: stats", NULL);
  ot_arena_stats s;
  if (tr_ok(tr, ot_arena_get_stats(a, &s), "stats") &&
      (s.reserved != 1024 || s.in_use != 0 || s.peak != 256 || s.num_allocs != 1 ||
       s.num_frees != 1 || s.num_failed != 1 || s.free_blocks != 1))
    tr_fail(tr, "stats after the bad calls: reserved %zu in_use %zu peak %zu allocs %llu "
            "frees %llu failed %llu", s.reserved, s.in_use, s.peak,
            (unsigned long long)s.num_allocs, (unsigned long long)s.num_frees,
            (unsigned long long)s.num_failed);
  arena_consistent(tr, a, "end");
done:
  ot_arena_destroy(a);
  tr_end(tr);
}

typedef struct live_block {
  unsigned char *p;
  size_t n;
  uint64_t tag;
} live_block;

static void fill_pattern(unsigned char *p, size_t n, uint64_t tag) {
  for (size_t i = 0; i < n; i++) p[i] = (unsigned char)((tag * 131 + i * 7 + (i >> 8)) & 0xff);
}

static bool check_pattern(const unsigned char *p, size_t n, uint64_t tag) {
  for (size_t i = 0; i < n; i++)
    if (p[i] != (unsigned char)((tag * 131 + i * 7 + (i >> 8)) & 0xff)) return false;
  return true;
}

/* Random allocations and frees until `ops` are done: patterns in every live block,
 * alignment, stats and structure checks every 500 operations, then everything freed
 * must coalesce into one block again. */
static void arena_stress(test_run *tr, size_t reserve, int ops, size_t max_size,
                         bool stream_ordered) {
  if (!tr_begin(tr, "arena stress %zu KiB, %d ops, sizes 1..%zu%s", reserve >> 10, ops,
                max_size, stream_ordered ? ", 3 streams" : ""))
    return;
  rng r = tr_rng(tr);
  ot_arena *a = NULL;
  if (!tr_ok(tr, ot_arena_create(tr->be->ctx, reserve, &a), "create")) goto out;
  if (stream_ordered) ot_arena_set_stream_ordered(a, true);
  live_block *live = calloc((size_t)ops, sizeof *live);
  int nlive = 0, nooms = 0;
  size_t used = 0, peak = 0;
  for (int op = 0; op < ops && !tr->case_failed; op++) {
    void *stream = stream_ordered ? (void *)(uintptr_t)(1 + rng_int(&r, 0, 2)) : NULL;
    bool do_alloc = nlive == 0 || rng_uniform(&r, 0, 1) < 0.55;
    if (do_alloc) {
      /* log-uniform sizes, a few exact multiples of 256 */
      size_t n = (size_t)exp(rng_uniform(&r, 0, log((double)max_size)));
      if (rng_int(&r, 0, 7) == 0) n = (n / 256 + 1) * 256;
      if (n < 1) n = 1;
      void *p = NULL;
      ot_status st = ot_arena_alloc(a, n, stream, &p);
      if (st == OT_ERR_OOM) {
        nooms++;
        ot_arena_stats s;
        ot_arena_get_stats(a, &s);
        size_t rounded = (n + 255) / 256 * 256;
        if (!stream_ordered && s.largest_free >= rounded)
          tr_fail(tr, "OOM for %zu bytes while the largest free block is %zu", n, s.largest_free);
        if (!strstr(ot_last_error(), "largest free block"))
          tr_fail(tr, "OOM message lacks the largest free block: %s", ot_last_error());
        continue;
      }
      if (!tr_ok(tr, st, "alloc")) break;
      if ((uintptr_t)p % 256) tr_fail(tr, "block %p not 256-byte aligned", p);
      live[nlive] = (live_block){(unsigned char *)p, n, (uint64_t)op};
      fill_pattern(live[nlive].p, n, (uint64_t)op);
      nlive++;
      used += (n + 255) / 256 * 256;
      if (used > peak) peak = used;
    } else {
      int i = (int)rng_int(&r, 0, nlive - 1);
      if (!check_pattern(live[i].p, live[i].n, live[i].tag))
        tr_fail(tr, "block of %zu bytes (op %llu) was overwritten: two live blocks overlap",
                live[i].n, (unsigned long long)live[i].tag);
      if (!tr_ok(tr, ot_arena_free(a, live[i].p, stream), "free")) break;
      used -= (live[i].n + 255) / 256 * 256;
      live[i] = live[--nlive];
    }
    if (op % 500 == 499) {
      if (!arena_consistent(tr, a, "stress")) break;
      ot_arena_stats s;
      ot_arena_get_stats(a, &s);
      if (s.in_use != used || s.peak != peak || s.live_blocks != (uint64_t)nlive)
        tr_fail(tr, "stats: in_use %zu (expected %zu), peak %zu (%zu), live %llu (%d)", s.in_use,
                used, s.peak, peak, (unsigned long long)s.live_blocks, nlive);
      if (stream_ordered && rng_int(&r, 0, 3) == 0) ot_arena_synchronize(a);
    }
  }
  for (int i = 0; i < nlive && !tr->case_failed; i++) {
    if (!check_pattern(live[i].p, live[i].n, live[i].tag))
      tr_fail(tr, "block of %zu bytes overwritten (final check)", live[i].n);
    tr_ok(tr, ot_arena_free(a, live[i].p, NULL), "final free");
  }
  if (stream_ordered) ot_arena_synchronize(a);
  if (!tr->case_failed && arena_consistent(tr, a, "all freed")) {
    ot_arena_stats s;
    ot_arena_get_stats(a, &s);
    if (s.free_blocks != 1 || s.largest_free != s.reserved || s.fragmentation != 0 ||
        s.in_use != 0)
      tr_fail(tr, "all freed: %llu free blocks, largest %zu of %zu, fragmentation %g",
              (unsigned long long)s.free_blocks, s.largest_free, s.reserved, s.fragmentation);
    if (tr->verbose)
      printf("     %d ops, %d OOMs, peak %zu of %zu, %llu allocs\n", ops, nooms, s.peak,
             s.reserved, (unsigned long long)s.num_allocs);
  }
  free(live);
out:
  ot_arena_destroy(a);
  tr_end(tr);
}

/* Fill with 256-byte blocks until OOM, then check the count, the message, fragmentation
 * after freeing every other block, and coalescing back to one block. */
static void arena_exhaustion(test_run *tr) {
  if (!tr_begin(tr, "arena exhaustion and coalescing")) return;
  ot_arena *a = NULL;
  enum { N = 64 };
  void *blocks[N + 1];
  if (!tr_ok(tr, ot_arena_create(tr->be->ctx, N * 256, &a), "create")) goto out;
  int n = 0;
  for (; n <= N; n++) {
    ot_status st = ot_arena_alloc(a, 200, NULL, &blocks[n]);
    if (st == OT_ERR_OOM) break;
    if (!tr_ok(tr, st, "alloc")) goto out;
    memset(blocks[n], n, 200);
  }
  if (n != N) tr_fail(tr, "%d blocks of 256 fit in %d x 256 bytes", n, N);
  tr_expect_error(tr, ot_arena_alloc(a, 200, NULL, &blocks[N]), OT_ERR_OOM, "200 bytes (256 rounded)",
                  "largest free block is 0 bytes");
  for (int i = 0; i < N; i += 2) tr_ok(tr, ot_arena_free(a, blocks[i], NULL), "free even");
  ot_arena_stats s;
  ot_arena_get_stats(a, &s);
  if (s.largest_free != 256 || s.free_blocks != N / 2 ||
      fabs(s.fragmentation - (1.0 - 2.0 / N)) > 1e-12)
    tr_fail(tr, "checkerboard: largest %zu, %llu free blocks, fragmentation %g", s.largest_free,
            (unsigned long long)s.free_blocks, s.fragmentation);
  void *p = NULL;
  tr_expect_error(tr, ot_arena_alloc(a, 300, NULL, &p), OT_ERR_OOM, "300 bytes (512 rounded)",
                  "largest free block is 256 bytes");
  for (int i = 1; i < N; i += 2) {
    unsigned char *b = blocks[i];
    for (int j = 0; j < 200; j++)
      if (b[j] != (unsigned char)i) {
        tr_fail(tr, "block %d disturbed by the failed allocations", i);
        break;
      }
  }
  for (int i = 1; i < N; i += 2) tr_ok(tr, ot_arena_free(a, blocks[i], NULL), "free odd");
  ot_arena_get_stats(a, &s);
  if (s.free_blocks != 1 || s.largest_free != N * 256)
    tr_fail(tr, "not coalesced: %llu free blocks, largest %zu", (unsigned long long)s.free_blocks,
            s.largest_free);
  if (tr_ok(tr, ot_arena_alloc(a, N * 256, NULL, &p), "whole arena")) ot_arena_free(a, p, NULL);
  arena_consistent(tr, a, "end");
out:
  ot_arena_destroy(a);
  tr_end(tr);
}

/* The stream rules (as on CUDA): same-stream reuse at once, other streams after
 * ot_arena_synchronize; blocks with different tags do not merge until then. */
static void arena_streams(test_run *tr) {
  if (!tr_begin(tr, "arena stream ordering")) return;
  ot_arena *a = NULL;
  void *s1 = (void *)(uintptr_t)0x1000, *s2 = (void *)(uintptr_t)0x2000;
  if (!tr_ok(tr, ot_arena_create(tr->be->ctx, 4096, &a), "create")) goto out;
  ot_arena_set_stream_ordered(a, true);
  void *p = NULL, *q = NULL;
  if (!tr_ok(tr, ot_arena_alloc(a, 4096, s1, &p), "alloc all on s1")) goto out;
  tr_ok(tr, ot_arena_free(a, p, s1), "free on s1");
  tr_expect_error(tr, ot_arena_alloc(a, 1024, s2, &q), OT_ERR_OOM, "other streams",
                  "ot_arena_synchronize");
  if (tr_ok(tr, ot_arena_alloc(a, 1024, s1, &q), "same stream reuses")) {
    if (q != p) tr_fail(tr, "same-stream reuse did not take the freed block");
    tr_ok(tr, ot_arena_free(a, q, s1), "free");
  }
  /* Two halves freed on different streams stay apart until synchronize. */
  void *h1 = NULL, *h2 = NULL;
  tr_ok(tr, ot_arena_alloc(a, 2048, s1, &h1), "h1");
  tr_ok(tr, ot_arena_alloc(a, 2048, s1, &h2), "h2");
  tr_ok(tr, ot_arena_free(a, h1, s1), "free h1");
  tr_ok(tr, ot_arena_free(a, h2, s2), "free h2");
  ot_arena_stats st;
  ot_arena_get_stats(a, &st);
  if (st.free_blocks != 2) tr_fail(tr, "%llu free blocks, expected 2 (tags differ)",
                                   (unsigned long long)st.free_blocks);
  arena_consistent(tr, a, "tagged");
  tr_ok(tr, ot_arena_synchronize(a), "synchronize");
  ot_arena_get_stats(a, &st);
  if (st.free_blocks != 1) tr_fail(tr, "%llu free blocks after synchronize, expected 1",
                                   (unsigned long long)st.free_blocks);
  if (tr_ok(tr, ot_arena_alloc(a, 4096, s2, &q), "s2 after synchronize")) ot_arena_free(a, q, s2);
  tr_expect_error(tr, ot_arena_synchronize(NULL), OT_ERR_INVALID_ARGUMENT,
                  "ot_arena_synchronize: arena", NULL);
  arena_consistent(tr, a, "end");
out:
  ot_arena_destroy(a);
  tr_end(tr);
}

typedef struct thread_job {
  ot_arena *a;
  uint64_t seed;
  int ops;
  int errors;
} thread_job;

static void *arena_thread(void *arg) {
  thread_job *j = arg;
  rng r = {j->seed};
  live_block live[64];
  int n = 0;
  for (int op = 0; op < j->ops; op++) {
    if (n < 64 && (n == 0 || rng_int(&r, 0, 1))) {
      size_t sz = (size_t)rng_int(&r, 1, 3000);
      void *p;
      if (ot_arena_alloc(j->a, sz, NULL, &p) != OT_OK) continue;
      live[n] = (live_block){p, sz, j->seed + (uint64_t)op};
      fill_pattern(live[n].p, sz, live[n].tag);
      n++;
    } else {
      int i = (int)rng_int(&r, 0, n - 1);
      if (!check_pattern(live[i].p, live[i].n, live[i].tag)) j->errors++;
      if (ot_arena_free(j->a, live[i].p, NULL) != OT_OK) j->errors++;
      live[i] = live[--n];
    }
  }
  for (int i = 0; i < n; i++) {
    if (!check_pattern(live[i].p, live[i].n, live[i].tag)) j->errors++;
    if (ot_arena_free(j->a, live[i].p, NULL) != OT_OK) j->errors++;
  }
  return NULL;
}

static void arena_threads(test_run *tr) {
  if (!tr_begin(tr, "arena shared by 4 threads")) return;
  ot_arena *a = NULL;
  if (!tr_ok(tr, ot_arena_create(tr->be->ctx, 1 << 20, &a), "create")) goto out;
  pthread_t th[4];
  thread_job jobs[4];
  rng r = tr_rng(tr);
  for (int i = 0; i < 4; i++) {
    jobs[i] = (thread_job){a, rng_u64(&r), 20000, 0};
    pthread_create(&th[i], NULL, arena_thread, &jobs[i]);
  }
  for (int i = 0; i < 4; i++) {
    pthread_join(th[i], NULL);
    if (jobs[i].errors) tr_fail(tr, "thread %d: %d overwritten blocks or failed frees", i,
                                jobs[i].errors);
  }
  ot_arena_stats s;
  ot_arena_get_stats(a, &s);
  if (s.in_use != 0 || s.free_blocks != 1) tr_fail(tr, "after the threads: in_use %zu, %llu free blocks",
                                                    s.in_use, (unsigned long long)s.free_blocks);
  arena_consistent(tr, a, "end");
out:
  ot_arena_destroy(a);
  tr_end(tr);
}

/* ---- KV block pool ------------------------------------------------------------------- */

bool ot_kv_cache_check(const ot_kv_cache *cache, char *msg, size_t msg_size);

static ot_kv_cache_params kv_params(int layers, int64_t pages, int bs, int hkv, int d,
                                    DLDataType dt) {
  ot_kv_cache_params p;
  memset(&p, 0, sizeof p);
  p.num_layers = layers, p.num_pages = pages, p.block_size = bs, p.heads_kv = hkv;
  p.head_dim = d, p.dtype = dt;
  return p;
}

static void kv_bad_args(test_run *tr) {
  if (!tr_begin(tr, "kv cache bad arguments")) return;
  ot_context *ctx = tr->be->ctx;
  ot_kv_cache *c = (ot_kv_cache *)(uintptr_t)0x99;
  ot_kv_cache_params p = kv_params(2, 8, 16, 2, 8, DT_F32);
  struct {
    const char *field, *want;
    ot_kv_cache_params p;
  } bad[] = {
      {"params.num_layers", ">= 1", kv_params(0, 8, 16, 2, 8, DT_F32)},
      {"params.num_pages", "1 .. 2^31-1", kv_params(2, 0, 16, 2, 8, DT_F32)},
      {"params.block_size", "1 .. 256", kv_params(2, 8, 257, 2, 8, DT_F32)},
      {"params.block_size", "1 .. 256", kv_params(2, 8, 0, 2, 8, DT_F32)},
      {"params.heads_kv", ">= 1", kv_params(2, 8, 16, 0, 8, DT_F32)},
      {"params.head_dim", ">= 1", kv_params(2, 8, 16, 2, 0, DT_F32)},
      {"params.dtype", "float32, float16 or bfloat16", kv_params(2, 8, 16, 2, 8, DT_I32)},
  };
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
    tr_expect_error(tr, ot_kv_cache_create(ctx, &bad[i].p, NULL, &c), OT_ERR_INVALID_ARGUMENT,
                    bad[i].field, bad[i].want);
  tr_expect_error(tr, ot_kv_cache_create(NULL, &p, NULL, &c), OT_ERR_INVALID_ARGUMENT,
                  "ot_kv_cache_create: ctx", NULL);
  tr_expect_error(tr, ot_kv_cache_create(ctx, NULL, NULL, &c), OT_ERR_INVALID_ARGUMENT,
                  "ot_kv_cache_create: params", NULL);
  /* A pool that does not fit its arena. */
  ot_arena *a = NULL;
  if (tr_ok(tr, ot_arena_create(ctx, 4096, &a), "arena"))
    tr_expect_error(tr, ot_kv_cache_create(ctx, &p, a, &c), OT_ERR_OOM, "ot_kv_cache_create: arena",
                    "largest free block");
  if (c != (ot_kv_cache *)(uintptr_t)0x99) tr_fail(tr, "out written by a failing create");
  c = NULL;
  ot_kv_cache_destroy(NULL);
  if (!tr_ok(tr, ot_kv_cache_create(ctx, &p, NULL, &c), "create")) goto out;
  int64_t s0 = -1, s1 = -1, junk = 77;
  tr_ok(tr, ot_kv_cache_add_sequence(c, &s0), "add");
  tr_ok(tr, ot_kv_cache_add_sequence(c, &s1), "add");
  int64_t ids[2] = {s0, s0}, toks[2] = {3, 4}, bad_tok[1] = {-1}, missing[1] = {12345};
  tr_expect_error(tr, ot_kv_cache_reserve(c, 2, ids, toks), OT_ERR_INVALID_ARGUMENT,
                  "ot_kv_cache_reserve: seq_ids[1]", "appears twice");
  tr_expect_error(tr, ot_kv_cache_reserve(c, 1, ids, bad_tok), OT_ERR_INVALID_ARGUMENT,
                  "ot_kv_cache_reserve: num_tokens[0]", "expected 0");
  tr_expect_error(tr, ot_kv_cache_reserve(c, 1, missing, toks), OT_ERR_INVALID_ARGUMENT,
                  "ot_kv_cache_reserve: seq_ids[0]", "not a live sequence");
  int64_t big[2] = {8 * 16 - 10, 11}, both[2] = {s0, s1};
  tr_expect_error(tr, ot_kv_cache_reserve(c, 2, both, big), OT_ERR_OOM,
                  "needs 9 pages", "8 of 8 are free; no sequence was changed");
  int64_t len = -1;
  ot_kv_cache_seq_length(c, s0, &len, NULL);
  if (len != 0) tr_fail(tr, "a failed reserve changed the length to %lld", (long long)len);
  tr_expect_error(tr, ot_kv_cache_fork(c, 999, &junk), OT_ERR_INVALID_ARGUMENT,
                  "ot_kv_cache_fork: src_seq", "not a live sequence");
  tr_expect_error(tr, ot_kv_cache_free_sequence(c, -1), OT_ERR_INVALID_ARGUMENT,
                  "ot_kv_cache_free_sequence: seq_id", NULL);
  if (junk != 77) tr_fail(tr, "new_seq written by a failing fork");
  DLTensor kt, vt;
  tr_expect_error(tr, ot_kv_cache_layer(c, 2, &kt, &vt), OT_ERR_INVALID_ARGUMENT,
                  "ot_kv_cache_layer: layer", "0 .. 1");
  int64_t one[1] = {20};
  tr_ok(tr, ot_kv_cache_reserve(c, 1, &s0, one), "reserve 20");
  int32_t indptr[3] = {-5, -5, -5}, indices[1] = {-5}, lpl[2] = {-5, -5};
  tr_expect_error(tr, ot_kv_cache_page_table(c, 2, both, indptr, indices, 1, lpl),
                  OT_ERR_INVALID_ARGUMENT, "ot_kv_cache_page_table: indices_capacity",
                  "needs 2");
  if (indptr[0] != -5 || indices[0] != -5 || lpl[0] != -5)
    tr_fail(tr, "a failing page_table wrote its outputs");
  tr_ok(tr, ot_kv_cache_free_sequence(c, s1), "free");
  tr_expect_error(tr, ot_kv_cache_free_sequence(c, s1), OT_ERR_INVALID_ARGUMENT,
                  "ot_kv_cache_free_sequence: seq_id", "not a live sequence");
  /* s1's slot is reused under a new id: the stale id is refused everywhere */
  int64_t s2 = -1, n2 = -1;
  tr_ok(tr, ot_kv_cache_add_sequence(c, &s2), "add after free");
  if (s2 == s1 || s2 < 0) tr_fail(tr, "a freed id came back: %lld", (long long)s2);
  int64_t stale[1] = {s1}, five[1] = {5};
  tr_expect_error(tr, ot_kv_cache_reserve(c, 1, stale, five), OT_ERR_INVALID_ARGUMENT,
                  "ot_kv_cache_reserve: seq_ids[0]", "not a live sequence");
  tr_expect_error(tr, ot_kv_cache_seq_length(c, s1, &n2, NULL), OT_ERR_INVALID_ARGUMENT,
                  "ot_kv_cache_seq_length: seq_id", "not a live sequence");
  tr_expect_error(tr, ot_kv_cache_fork(c, s1, &junk), OT_ERR_INVALID_ARGUMENT,
                  "ot_kv_cache_fork: src_seq", "not a live sequence");
  tr_expect_error(tr, ot_kv_cache_page_table(c, 1, stale, indptr, indices, 1, lpl),
                  OT_ERR_INVALID_ARGUMENT, "ot_kv_cache_page_table: seq_ids[0]", "not a live");
  tr_ok(tr, ot_kv_cache_reserve(c, 1, &s2, five), "reserve the new id");
  if (!tr_ok(tr, ot_kv_cache_seq_length(c, s2, &n2, NULL), "length") || n2 != 5 || junk != 77)
    tr_fail(tr, "the new sequence: length %lld (5 expected), new_seq %lld", (long long)n2,
            (long long)junk);
  tr_ok(tr, ot_kv_cache_free_sequence(c, s2), "free the new id");
out:
  ot_kv_cache_destroy(c);
  ot_arena_destroy(a);
  tr_end(tr);
}

/* The value stored in element (layer, k/v, head, dim) of a token with tag t: unique and
 * exact in float32 for t < 2^17. */
static float kv_value(int64_t t, int l, int kv, int h, int x) {
  return (float)(t * 128 + (((l * 2 + kv) * 4 + h) * 4 + x));
}

typedef struct shadow_seq {
  bool live;
  bool used;    /* the slot has held a sequence */
  int64_t id;   /* the cache's id of the (last) sequence in this slot: its low 32 bits */
  int64_t len;
  int64_t *tags; /* the tag of each token */
  int64_t cap;
} shadow_seq;

/* The slot of a sequence id (the cache's ids: the slot in the low 32 bits, a generation
 * above, so that a freed id never comes back). */
static int64_t kv_slot(int64_t id) { return id & 0xffffffff; }

/* A new id from add / fork: in the shadow's range of slots, the slot not live, and not the
 * id of the slot's previous (freed) sequence. Records it. */
static bool kv_new_id_ok(test_run *tr, shadow_seq *sh, int nsh, int64_t id, const char *what) {
  const int64_t slot = kv_slot(id);
  if (id < 0 || slot >= nsh || sh[slot].live || (sh[slot].used && id == sh[slot].id)) {
    tr_fail(tr, "%s returned id %lld (live, reused or out of the expected range)", what,
            (long long)id);
    return false;
  }
  sh[slot].id = id;
  sh[slot].used = true;
  return true;
}

/* Every token of every live sequence, read through the exported page table, holds the
 * values written for it; the cache's own invariants hold; info agrees. */
static bool kv_verify(test_run *tr, ot_kv_cache *c, const ot_kv_cache_params *p,
                      shadow_seq *sh, int nsh, const char *when) {
  char msg[256];
  if (!ot_kv_cache_check(c, msg, sizeof msg)) {
    tr_fail(tr, "%s: %s", when, msg);
    return false;
  }
  int64_t ids[64];
  int n = 0;
  for (int i = 0; i < nsh; i++)
    if (sh[i].live) ids[n++] = sh[i].id;
  int32_t indptr[65], lpl[64];
  int32_t *indices = malloc((size_t)p->num_pages * 64 * sizeof *indices);
  bool ok = tr_ok(tr, ot_kv_cache_page_table(c, n, ids, indptr, indices, p->num_pages * 64, lpl),
                  "page_table");
  ot_kv_cache_info info;
  ot_kv_cache_get_info(c, &info);
  char *seen = calloc((size_t)p->num_pages, 1);
  int64_t distinct = 0;
  for (int b = 0; ok && b < n; b++) {
    const shadow_seq *s = &sh[kv_slot(ids[b])];
    int64_t np = indptr[b + 1] - indptr[b];
    int64_t len = np ? (np - 1) * p->block_size + lpl[b] : 0;
    if (len != s->len || (np && (lpl[b] < 1 || lpl[b] > p->block_size)) || (!np && lpl[b])) {
      tr_fail(tr, "%s: sequence %lld: length %lld from the table, expected %lld", when,
              (long long)ids[b], (long long)len, (long long)s->len);
      ok = false;
      break;
    }
    for (int64_t j = 0; j < np; j++)
      if (!seen[indices[indptr[b] + j]]++) distinct++;
    for (int l = 0; ok && l < p->num_layers; l++) {
      DLTensor kt, vt;
      ot_kv_cache_layer(c, l, &kt, &vt);
      for (int kv = 0; ok && kv < 2; kv++) {
        const float *base = (const float *)(kv ? vt.data : kt.data);
        for (int64_t t = 0; ok && t < s->len; t++) {
          int32_t pg = indices[indptr[b] + t / p->block_size];
          int64_t slot = t % p->block_size;
          for (int h = 0; h < p->heads_kv && ok; h++)
            for (int x = 0; x < p->head_dim; x++) {
              float got = base[((pg * (int64_t)p->heads_kv + h) * p->block_size + slot) *
                                   p->head_dim + x];
              if (got != kv_value(s->tags[t], l, kv, h, x)) {
                tr_fail(tr, "%s: sequence %lld token %lld layer %d %s head %d dim %d: %g, "
                        "expected %g", when, (long long)ids[b], (long long)t, l, kv ? "v" : "k",
                        h, x, got, kv_value(s->tags[t], l, kv, h, x));
                ok = false;
                break;
              }
            }
        }
      }
    }
  }
  if (ok && (info.free_pages != p->num_pages - distinct || info.num_sequences != n)) {
    tr_fail(tr, "%s: info says %lld free pages and %lld sequences; tables use %lld pages of "
            "%lld, %d sequences", when, (long long)info.free_pages, (long long)info.num_sequences,
            (long long)distinct, (long long)p->num_pages, n);
    ok = false;
  }
  free(indices);
  free(seen);
  return ok;
}

/* Random add / reserve (1-3 sequences at once, sometimes too many tokens) / fork / free,
 * writing each new token's values into its pages (host float32) as ot_kv_append would,
 * and checking everything after every operation. */
static void kv_property(test_run *tr, int bs, int64_t pages, int ops) {
  if (!tr_begin(tr, "kv cache random operations: block_size %d, %lld pages, %d ops", bs,
                (long long)pages, ops))
    return;
  rng r = tr_rng(tr);
  ot_kv_cache_params p = kv_params(2, pages, bs, 2, 4, DT_F32);
  ot_kv_cache *c = NULL;
  ot_arena *a = NULL;
  /* Half the runs take the pages from an arena. */
  if (bs % 2 == 0 && !tr_ok(tr, ot_arena_create(tr->be->ctx, 1 << 20, &a), "arena")) goto out;
  if (!tr_ok(tr, ot_kv_cache_create(tr->be->ctx, &p, a, &c), "create")) goto out;
  enum { MAXS = 64 };
  shadow_seq sh[MAXS];
  memset(sh, 0, sizeof sh);
  int64_t next_tag = 1;
  int counts[5] = {0};
  for (int op = 0; op < ops && !tr->case_failed; op++) {
    int nlive = 0;
    int64_t live_ids[MAXS];
    for (int i = 0; i < MAXS; i++)
      if (sh[i].live) live_ids[nlive++] = sh[i].id;
    int kind = (int)rng_int(&r, 0, 9);
    char when[96];
    if (nlive == 0 || (kind == 0 && nlive < MAXS - 1)) {
      int64_t id;
      if (!tr_ok(tr, ot_kv_cache_add_sequence(c, &id), "add")) break;
      if (!kv_new_id_ok(tr, sh, MAXS, id, "add")) break;
      id = kv_slot(id);
      sh[id].live = true;
      sh[id].len = 0;
      counts[0]++;
      snprintf(when, sizeof when, "op %d add %lld", op, (long long)id);
    } else if (kind <= 5) {
      int n = (int)rng_int(&r, 1, nlive < 3 ? nlive : 3);
      int64_t ids[3], toks[3];
      for (int i = 0; i < n; i++) {
        int j = (int)rng_int(&r, i, nlive - 1);
        int64_t t = live_ids[i];
        live_ids[i] = live_ids[j], live_ids[j] = t;
        ids[i] = live_ids[i];
        toks[i] = rng_int(&r, 0, 3) == 0 ? rng_int(&r, 0, 3 * bs) : rng_int(&r, 0, 3);
        if (rng_int(&r, 0, 29) == 0) toks[i] = pages * bs; /* certainly too many */
      }
      ot_kv_cache_info before;
      ot_kv_cache_get_info(c, &before);
      ot_status st = ot_kv_cache_reserve(c, n, ids, toks);
      if (st == OT_ERR_OOM) {
        counts[4]++;
        ot_kv_cache_info after;
        ot_kv_cache_get_info(c, &after);
        if (after.free_pages != before.free_pages || after.shared_pages != before.shared_pages)
          tr_fail(tr, "a failed reserve changed the pool");
        snprintf(when, sizeof when, "op %d failed reserve", op);
      } else {
        if (!tr_ok(tr, st, "reserve")) break;
        counts[1]++;
        for (int i = 0; i < n; i++) {
          shadow_seq *s = &sh[kv_slot(ids[i])];
          if (s->len + toks[i] > s->cap) {
            s->cap = (s->len + toks[i]) * 2 + 8;
            s->tags = realloc(s->tags, (size_t)s->cap * sizeof *s->tags);
          }
          /* write the new tokens through the table, as an append kernel would */
          int32_t indptr[2], lpl[1];
          int64_t npg = (s->len + toks[i] + bs - 1) / bs;
          int32_t *ind = malloc((size_t)(npg + 1) * sizeof *ind);
          ot_kv_cache_page_table(c, 1, &ids[i], indptr, ind, npg, lpl);
          for (int l = 0; l < 2; l++) {
            DLTensor kt, vt;
            ot_kv_cache_layer(c, l, &kt, &vt);
            for (int64_t t = s->len; t < s->len + toks[i]; t++) {
              int32_t pg = ind[t / bs];
              for (int kv = 0; kv < 2; kv++)
                for (int h = 0; h < 2; h++)
                  for (int x = 0; x < 4; x++)
                    ((float *)(kv ? vt.data : kt.data))[((pg * 2 + h) * (int64_t)bs + t % bs) * 4 + x] =
                        kv_value(next_tag + t, l, kv, h, x);
            }
          }
          for (int64_t t = s->len; t < s->len + toks[i]; t++) s->tags[t] = next_tag + t;
          next_tag += s->len + toks[i];
          s->len += toks[i];
          free(ind);
        }
        snprintf(when, sizeof when, "op %d reserve %d sequences", op, n);
      }
    } else if (kind <= 7 && nlive < MAXS - 1) {
      int64_t src = live_ids[rng_int(&r, 0, nlive - 1)], id;
      if (!tr_ok(tr, ot_kv_cache_fork(c, src, &id), "fork")) break;
      if (!kv_new_id_ok(tr, sh, MAXS, id, "fork")) break;
      snprintf(when, sizeof when, "op %d fork %lld -> %lld", op, (long long)src, (long long)id);
      src = kv_slot(src), id = kv_slot(id);
      sh[id].live = true;
      sh[id].len = sh[src].len;
      if (sh[id].cap < sh[src].len + 1) {
        sh[id].cap = sh[src].len + 8;
        sh[id].tags = realloc(sh[id].tags, (size_t)sh[id].cap * sizeof *sh[id].tags);
      }
      if (sh[src].len) memcpy(sh[id].tags, sh[src].tags, (size_t)sh[src].len * sizeof *sh[id].tags);
      counts[2]++;
    } else {
      int64_t id = live_ids[rng_int(&r, 0, nlive - 1)];
      if (!tr_ok(tr, ot_kv_cache_free_sequence(c, id), "free")) break;
      sh[kv_slot(id)].live = false;
      counts[3]++;
      snprintf(when, sizeof when, "op %d free %lld", op, (long long)id);
      /* the freed id is dead for good, also once its slot holds another sequence */
      if (ot_kv_cache_seq_length(c, id, NULL, NULL) == OT_OK) {
        tr_fail(tr, "%s: the freed id still answers", when);
        break;
      }
    }
    if (next_tag > (1 << 16)) next_tag = 1; /* keep values exact; old tags may repeat, harmless */
    if (!kv_verify(tr, c, &p, sh, MAXS, when)) break;
  }
  if (tr->verbose)
    printf("     %d adds, %d reserves, %d forks, %d frees, %d pool-exhausted reserves\n",
           counts[0], counts[1], counts[2], counts[3], counts[4]);
  if (counts[4] == 0 && ops >= 500) tr_fail(tr, "no reserve ever exhausted the pool");
  for (int i = 0; i < MAXS; i++) {
    if (sh[i].live) tr_ok(tr, ot_kv_cache_free_sequence(c, sh[i].id), "final free");
    free(sh[i].tags);
  }
  ot_kv_cache_info info;
  ot_kv_cache_get_info(c, &info);
  if (!tr->case_failed && (info.free_pages != pages || info.num_sequences != 0))
    tr_fail(tr, "after freeing all: %lld free pages of %lld", (long long)info.free_pages,
            (long long)pages);
out:
  ot_kv_cache_destroy(c);
  if (a) {
    ot_arena_stats s;
    ot_arena_get_stats(a, &s);
    if (s.in_use != 0) tr_fail(tr, "the cache did not return its arena block");
  }
  ot_arena_destroy(a);
  tr_end(tr);
}

/* Fork, then append to both sides: the shared partial page is copied once, full pages
 * stay shared, and neither side sees the other's new tokens (checked by kv_verify in
 * the property test; here the page accounting is exact). */
static void kv_cow(test_run *tr) {
  if (!tr_begin(tr, "kv cache fork copy-on-write accounting")) return;
  ot_kv_cache_params p = kv_params(1, 10, 4, 1, 2, DT_BF16);
  ot_kv_cache *c = NULL;
  if (!tr_ok(tr, ot_kv_cache_create(tr->be->ctx, &p, NULL, &c), "create")) goto out;
  int64_t a, b, n10 = 10, n1 = 1;
  ot_kv_cache_add_sequence(c, &a);
  ot_kv_cache_reserve(c, 1, &a, &n10); /* 3 pages, last holds 2 */
  tr_ok(tr, ot_kv_cache_fork(c, a, &b), "fork");
  ot_kv_cache_info info;
  ot_kv_cache_get_info(c, &info);
  if (info.free_pages != 7 || info.shared_pages != 3)
    tr_fail(tr, "after fork: %lld free, %lld shared", (long long)info.free_pages,
            (long long)info.shared_pages);
  int32_t ip[3], ind[8], lpl[2], ip2[3], ind2[8], lpl2[2];
  int64_t both[2] = {a, b};
  ot_kv_cache_page_table(c, 2, both, ip, ind, 8, lpl);
  tr_ok(tr, ot_kv_cache_reserve(c, 1, &b, &n1), "append to the fork");
  ot_kv_cache_get_info(c, &info);
  if (info.free_pages != 6 || info.shared_pages != 2)
    tr_fail(tr, "after the first append: %lld free, %lld shared (expected 6, 2)",
            (long long)info.free_pages, (long long)info.shared_pages);
  ot_kv_cache_page_table(c, 2, both, ip2, ind2, 8, lpl2);
  if (ind2[0] != ind[0] || ind2[1] != ind[1] || ind2[2] != ind[2] || ind2[3] != ind[3] ||
      ind2[4] != ind[4] || ind2[5] == ind[5] || lpl2[0] != 2 || lpl2[1] != 3)
    tr_fail(tr, "tables after copy-on-write: a {%d %d %d} b {%d %d %d}", ind2[0], ind2[1],
            ind2[2], ind2[3], ind2[4], ind2[5]);
  /* The source now owns its last page alone: appending to it copies nothing. */
  tr_ok(tr, ot_kv_cache_reserve(c, 1, &a, &n1), "append to the source");
  ot_kv_cache_get_info(c, &info);
  if (info.free_pages != 6) tr_fail(tr, "append to the sole owner took a page");
  /* Forking at a page boundary shares only full pages: no copy on append. */
  int64_t d, n2 = 1;
  ot_kv_cache_reserve(c, 1, &a, &n2); /* a: 12 tokens, 3 full pages */
  ot_kv_cache_fork(c, a, &d);
  ot_kv_cache_get_info(c, &info);
  int64_t before = info.free_pages;
  ot_kv_cache_reserve(c, 1, &d, &n1);
  ot_kv_cache_get_info(c, &info);
  if (info.free_pages != before - 1) tr_fail(tr, "append after a boundary fork took %lld pages",
                                             (long long)(before - info.free_pages));
  char msg[200];
  if (!ot_kv_cache_check(c, msg, sizeof msg)) tr_fail(tr, "%s", msg);
out:
  ot_kv_cache_destroy(c);
  tr_end(tr);
}

/* ---- paged attention and append ---------------------------------------------------- */

int64_t ot_paged_num_splits(int64_t batch, int64_t hkv, int64_t len, int threads);

#define PMAX 160

typedef struct pcase {
  const char *name;
  int b;
  int len[PMAX]; /* keys of each sequence (context including the new tokens) */
  int sq[PMAX];  /* queries of each sequence */
  int hq, hkv, d, bs;
  int causal, wl, wr;
  float cap, scale;
} pcase;

/* A batch's pages: a random layout (a permutation of the pool, spare pages), unused
 * slots and spare pages NaN so that a read past a sequence's end shows. */
typedef struct paged {
  int b, hkv, d, bs;
  int64_t len[PMAX], npages;
  tbuf *kp, *vp, *indptr, *indices, *lpl;
  double *k, *v; /* gathered float64 [b][len][hkv][d] at koff[b] */
  int64_t koff[PMAX + 1];
  ot_paged_kv kv;
} paged;

static int64_t page_elem(const paged *P, int32_t page, int64_t h, int64_t slot) {
  return ((page * (int64_t)P->hkv + h) * P->bs + slot) * P->d;
}

static void paged_make(test_run *tr, paged *P, DLDataType dt, int b, const int *len, int hkv,
                       int d, int bs, rng *r) {
  memset(P, 0, sizeof *P);
  P->b = b, P->hkv = hkv, P->d = d, P->bs = bs;
  int64_t need = 0;
  P->koff[0] = 0;
  for (int i = 0; i < b; i++) {
    P->len[i] = len[i];
    need += (len[i] + bs - 1) / bs;
    P->koff[i + 1] = P->koff[i] + len[i];
  }
  P->npages = need + rng_int(r, 0, 5) + 1;
  int64_t psh[4] = {P->npages, hkv, bs, d};
  P->kp = tb_new(tr->be, dt, 4, psh);
  P->vp = tb_new(tr->be, dt, 4, psh);
  tb_poison(P->kp);
  tb_poison(P->vp);
  int64_t ish[1] = {b + 1}, xsh[1] = {need > 0 ? need : 1}, lsh[1] = {b};
  P->indptr = tb_new(tr->be, DT_I32, 1, ish);
  P->indices = tb_new(tr->be, DT_I32, 1, xsh);
  P->lpl = tb_new(tr->be, DT_I32, 1, lsh);
  int32_t *perm = malloc((size_t)P->npages * sizeof *perm);
  for (int64_t i = 0; i < P->npages; i++) perm[i] = (int32_t)i;
  for (int64_t i = P->npages - 1; i > 0; i--) {
    int64_t j = rng_int(r, 0, i);
    int32_t t = perm[i];
    perm[i] = perm[j], perm[j] = t;
  }
  int64_t at = 0, total = P->koff[b];
  P->k = malloc((size_t)(total * hkv * d + 1) * sizeof *P->k);
  P->v = malloc((size_t)(total * hkv * d + 1) * sizeof *P->v);
  tb_set(P->indptr, 0, 0);
  for (int i = 0; i < b; i++) {
    int64_t np = (len[i] + bs - 1) / bs;
    for (int64_t j = 0; j < np; j++) tb_set(P->indices, at + j, perm[at + j]);
    for (int64_t t = 0; t < len[i]; t++) {
      int32_t page = perm[at + t / bs];
      for (int h = 0; h < hkv; h++)
        for (int x = 0; x < d; x++) {
          int64_t e = page_elem(P, page, h, t % bs) + x, g = ((P->koff[i] + t) * hkv + h) * d + x;
          tb_set(P->kp, e, rng_uniform(r, -1, 1));
          tb_set(P->vp, e, rng_uniform(r, -1, 1));
          P->k[g] = tb_get(P->kp, e);
          P->v[g] = tb_get(P->vp, e);
        }
    }
    at += np;
    tb_set(P->indptr, i + 1, (double)at);
    tb_set(P->lpl, i, np ? (double)(len[i] - (np - 1) * bs) : 0);
  }
  free(perm);
  P->kv.k_pages = tb_dl(P->kp);
  P->kv.v_pages = tb_dl(P->vp);
  P->kv.indptr = tb_dl(P->indptr);
  P->kv.indices = tb_dl(P->indices);
  P->kv.last_page_len = tb_dl(P->lpl);
}

static void paged_free(paged *P) {
  tb_free(P->kp), tb_free(P->vp), tb_free(P->indptr), tb_free(P->indices), tb_free(P->lpl);
  free(P->k), free(P->v);
}

/* kv.indices with `extra` entries past the last sequence's, ids of the pool's spare (NaN)
 * pages: the CUDA kernel plans its splits (and at batch 1 guesses its first page ids)
 * from the table's size, so a sequence shorter than the table takes other chunks than the
 * guess assumed, and the entries past it may be read but must not be used. */
static void paged_spare_entries(test_run *tr, paged *P, int64_t extra) {
  const int64_t used = (int64_t)tb_get(P->indptr, P->b);
  char *taken = calloc((size_t)P->npages, 1);
  for (int64_t j = 0; j < used; j++) taken[(int64_t)tb_get(P->indices, j)] = 1;
  int64_t xsh[1] = {used + extra};
  tbuf *ix = tb_new(tr->be, DT_I32, 1, xsh);
  for (int64_t j = 0; j < used; j++) tb_set(ix, j, tb_get(P->indices, j));
  int64_t sp = 0; /* paged_make leaves at least one page spare */
  for (int64_t j = used; j < used + extra; j++) {
    while (taken[sp]) sp = (sp + 1) % P->npages;
    tb_set(ix, j, (double)sp);
    sp = (sp + 1) % P->npages;
  }
  free(taken);
  tb_free(P->indices);
  P->indices = ix;
  P->kv.indices = tb_dl(ix);
}

/* float64 attention of the queries of each sequence over its gathered keys, with the
 * bottom-right masks of ot_attention_forward (Sq = sq_b, Sk = len_b). */
static void paged_ref(const pcase *c, const paged *P, const double *q, const int64_t *qoff,
                      double *out, double *lse, int64_t tq) {
  int d = c->d, group = c->hq / c->hkv;
  double scale = c->scale != 0 ? (double)c->scale : 1.0 / sqrt((double)d);
  int64_t maxl = 1;
  for (int b = 0; b < c->b; b++)
    if (c->len[b] > maxl) maxl = c->len[b];
  double *s = malloc((size_t)maxl * sizeof *s);
  for (int b = 0; b < c->b; b++)
    for (int64_t i = 0; i < c->sq[b]; i++)
      for (int h = 0; h < c->hq; h++) {
        int g = h / group;
        const double *qr = q + ((qoff[b] + i) * c->hq + h) * d;
        double *o = out + ((qoff[b] + i) * c->hq + h) * d;
        int64_t diag = i + c->len[b] - c->sq[b];
        double m = -INFINITY;
        for (int64_t j = 0; j < c->len[b]; j++) {
          bool vis = !(c->causal && j > diag) && !(c->wl >= 0 && j < diag - c->wl) &&
                     !(c->wr >= 0 && j > diag + c->wr);
          if (!vis) {
            s[j] = -INFINITY;
            continue;
          }
          const double *kr = P->k + ((P->koff[b] + j) * c->hkv + g) * d;
          double dot = 0;
          for (int x = 0; x < d; x++) dot += qr[x] * kr[x];
          s[j] = scale * dot;
          if (c->cap > 0) s[j] = c->cap * tanh(s[j] / c->cap);
          if (s[j] > m) m = s[j];
        }
        for (int x = 0; x < d; x++) o[x] = 0;
        if (m == -INFINITY) {
          lse[(int64_t)h * tq + qoff[b] + i] = -INFINITY;
          continue;
        }
        double sum = 0;
        for (int64_t j = 0; j < c->len[b]; j++) {
          if (s[j] == -INFINITY) continue;
          double p = exp(s[j] - m);
          sum += p;
          const double *vr = P->v + ((P->koff[b] + j) * c->hkv + g) * d;
          for (int x = 0; x < d; x++) o[x] += p * vr[x];
        }
        for (int x = 0; x < d; x++) o[x] /= sum;
        lse[(int64_t)h * tq + qoff[b] + i] = m + log(sum);
      }
  free(s);
}

/* The case's query offsets (qoff[0..b], from its sq) and their total. */
static int64_t pcase_qoff(const pcase *c, int64_t *qoff) {
  qoff[0] = 0;
  for (int b = 0; b < c->b; b++) qoff[b + 1] = qoff[b] + c->sq[b];
  return qoff[c->b];
}

/* The case's mask, softcap and scale as attention parameters. */
static ot_attention_params pcase_params(const pcase *c) {
  ot_attention_params prm = ot_attention_default_params();
  prm.causal = c->causal, prm.window_left = c->wl, prm.window_right = c->wr;
  prm.softcap = c->cap, prm.softmax_scale = c->scale;
  return prm;
}

/* The CUDA split-kernel instance blocks (paged_mode_cases): a prefix of the case names,
 * and the plan flag (ot_cuda_paged_last_plan's out[3]) each call of a case the instance
 * can take must have set (g_pflag_set) or cleared (g_pflag_clear): 16 the aligned-page
 * instance (16-bit, head_dim 128, pages of 16 x m keys), 32 its 8-warp CTAs (and no early
 * start); the kv-ready calls of those cases must also have set 4 (the early start). */
static const char *g_pmode = "";
static int g_pflag_set = 0, g_pflag_clear = 0;
/* the kernel each call must have run (1 split, 2 stream: paged_auto_plan_case); 0: the
 * instance blocks' split kernel, checked only where they set flags */
static int g_pkernel = 0;
/* paged_case_spare runs each case again with both split merges (paged_merge_bits) */
static bool g_pmerge_bits = false;
#ifdef OT_TEST_CUDA
void ot_cuda_paged_last_plan(int out[4]); /* src/cuda/paged_attention.cu */
#endif
/* Whether the split kernel's call of case c with `spare` extra entries in kv.indices gets
 * the page-id guess (plan flag 2048, pa_params.chunk1): pages of 2^k keys, the entries and
 * the queries divided evenly among the sequences, no OT_DEBUG (its checks read every id). */
static bool paged_guess_expected(const pcase *c, int64_t spare) {
  int64_t entries = spare, tq = 0;
  for (int b = 0; b < c->b; b++) entries += (c->len[b] + c->bs - 1) / c->bs, tq += c->sq[b];
  const char *dbg = getenv("OT_DEBUG"), *gs = getenv("OT_PAGED_GUESS");
  const bool debug = dbg && dbg[0] && strcmp(dbg, "0") != 0;
  if (gs && (strcmp(gs, "0") == 0 || (strcmp(gs, "b1") == 0 && c->b != 1))) return false;
  /* at batch > 1 each sequence's tiles (of 16 query rows) a power of two */
  const int64_t tps = c->b > 0 ? (tq / c->b * (c->hq / c->hkv) + 15) / 16 : 0;
  return c->b > 0 && (c->bs & (c->bs - 1)) == 0 && entries > 0 && entries % c->b == 0 &&
         tq % c->b == 0 && (c->b == 1 || (tps > 0 && (tps & (tps - 1)) == 0)) && !debug;
}

static void paged_check_plan(test_run *tr, const pcase *c, DLDataType dt, bool ready,
                             const char *call, int64_t spare) {
#ifdef OT_TEST_CUDA
  if (!g_pflag_set && !g_pflag_clear && !g_pkernel) return;
  const bool al = dt.bits == 16 && c->d == 128 && c->bs % 16 == 0;
  /* with the early start (ready): no 8-warp CTAs, and its flag 4 (the XT instances; every
   * aligned case is head_dim 128, where the split kernel takes paged_kv_ready unless
   * OT_DEBUG is on) */
  const char *dbg = getenv("OT_DEBUG");
  const bool early = ready && !(dbg && dbg[0] && strcmp(dbg, "0") != 0);
  const int want = (g_pflag_set & ~(ready ? 32 : 0)) | (early ? 4 : 0);
  /* the split kernel (paged_mode_cases force it), or the default's (g_pkernel) */
  const int kernel = g_pkernel ? g_pkernel : 1;
  int pl[4] = {0, 0, 0, 0};
  ot_cuda_paged_last_plan(pl);
  if (pl[0] != kernel || (al && (pl[3] & want) != want) || (pl[3] & g_pflag_clear))
    tr_fail(tr, "%s: ran kernel %d with plan flags %d (expected kernel %d, flags %d set%s, "
            "%d clear)", call, pl[0], pl[3], kernel, al ? want : 0,
            al ? "" : " (not an aligned case)", g_pflag_clear);
  /* the tensor-core split kernel (16-bit types): the guess exactly where the tables allow */
  if (pl[0] == 1 && dt.bits == 16 && (c->d == 64 || c->d == 128) &&
      ((pl[3] & 2048) != 0) != paged_guess_expected(c, spare))
    tr_fail(tr, "%s: plan flags %d: the page-id guess (2048) %s", call, pl[3],
            paged_guess_expected(c, spare) ? "expected, not taken" : "taken, not expected");
#else
  (void)tr, (void)c, (void)dt, (void)ready, (void)call, (void)spare;
#endif
}

/* g_pmerge_bits (CUDA): the call again with each split merge, OT_PAGED_MERGE=0
 * (pa_merge_kernel), then 1 and 2 (pa_merge1_kernel, one round trip, 8 / 16 O rows ahead):
 * they keep the first's summation order, so out and lse must be the same bits (outputs
 * poisoned before each). */
static void paged_merge_bits(test_run *tr, const ot_attention_params *prm, tbuf *q, tbuf *cu,
                             const ot_paged_kv *kv, tbuf *out, tbuf *lse) {
  static const char *const modes[] = {"0", "1", "2"};
  void *so = NULL, *sl = NULL;
  env_saved m = env_set("OT_PAGED_MERGE", "0");
  for (int i = 0; i < 3; i++) {
    setenv("OT_PAGED_MERGE", modes[i], 1);
    tb_poison(out);
    tb_poison(lse);
    if (!tr_ok(tr, ot_paged_attention(tr->be->ctx, prm, tb_dl(q), tb_dl(cu), kv, tb_dl(out),
                                      tb_dl(lse)),
               i == 0 ? "OT_PAGED_MERGE=0" : i == 1 ? "OT_PAGED_MERGE=1" : "OT_PAGED_MERGE=2"))
      break;
    if (i == 0) {
      so = tb_snapshot(out), sl = tb_snapshot(lse);
    } else {
      if (!tb_unchanged(out, so))
        tr_fail(tr, "out differs between OT_PAGED_MERGE=0 and %s", modes[i]);
      if (!tb_unchanged(lse, sl))
        tr_fail(tr, "lse differs between OT_PAGED_MERGE=0 and %s", modes[i]);
    }
  }
  env_restore(&m);
  free(so), free(sl);
}

/* Case c against the reference, kv.indices with `spare` entries past the last sequence's
 * (paged_spare_entries; 0: none). */
static void paged_case_spare(test_run *tr, const pcase *c, DLDataType dt, int64_t spare) {
  if (!tr_begin(tr, "paged attention %s%s %s", g_pmode, c->name, dt_name(dt))) return;
  rng r = tr_rng(tr);
  paged P;
  paged_make(tr, &P, dt, c->b, c->len, c->hkv, c->d, c->bs, &r);
  if (spare > 0) paged_spare_entries(tr, &P, spare);
  int64_t qoff[PMAX + 1] = {0};
  int64_t tq = pcase_qoff(c, qoff);
  int64_t qsh[3] = {tq, c->hq, c->d}, lsh[2] = {c->hq, tq}, csh[1] = {c->b + 1};
  tbuf *q = tb_new(tr->be, dt, 3, qsh), *out = tb_new(tr->be, dt, 3, qsh);
  tbuf *lse = tb_new(tr->be, DT_F32, 2, lsh), *cu = tb_new(tr->be, DT_I32, 1, csh);
  tb_fill_uniform(q, &r, -2, 2);
  tb_poison(out);
  tb_poison(lse);
  for (int b = 0; b <= c->b; b++) tb_set(cu, b, (double)qoff[b]);
  double *qd = tb_to_f64(q);
  double *ro = malloc((size_t)(tq * c->hq * c->d + 1) * sizeof *ro);
  double *rl = malloc((size_t)(tq * c->hq + 1) * sizeof *rl);
  paged_ref(c, &P, qd, qoff, ro, rl, tq);
  const ot_attention_params prm = pcase_params(c);
  if (tr_ok(tr, ot_paged_attention(tr->be->ctx, &prm, tb_dl(q), tb_dl(cu), &P.kv, tb_dl(out),
                                   tb_dl(lse)),
            "ot_paged_attention")) {
    paged_check_plan(tr, c, dt, false, "the call", spare);
    tb_sync(out);
    tb_sync(lse);
    check_close(tr, "out", out, ro, tol_for(dt, dt.bits == 32 ? 4 : 1));
    check_close(tr, "lse", lse, rl, tol_for(DT_F32, 4));
    /* lse == NULL gives the same out, bit for bit */
    void *snap = tb_snapshot(out);
    tb_poison(out);
    if (tr_ok(tr, ot_paged_attention(tr->be->ctx, &prm, tb_dl(q), tb_dl(cu), &P.kv, tb_dl(out),
                                     NULL),
              "without lse")) {
      tb_sync(out);
      if (!tb_unchanged(out, snap)) tr_fail(tr, "out differs when lse is NULL");
    }
    free(snap);
    if (g_pmerge_bits) paged_merge_bits(tr, &prm, q, cu, &P.kv, out, lse);
  }
  free(qd), free(ro), free(rl);
  tb_free(q), tb_free(out), tb_free(lse), tb_free(cu);
  paged_free(&P);
  tr_end(tr);
}

static void paged_case(test_run *tr, const pcase *c, DLDataType dt) {
  paged_case_spare(tr, c, dt, 0);
}

/* Two query sets of case c for back-to-back calls: q[i] random, out[i] and lse[i] poisoned,
 * ro[i] / rl[i] their float64 references over P. */
static void paged_two_queries(test_run *tr, const pcase *c, DLDataType dt, paged *P,
                              const int64_t *qoff, int64_t tq, rng *r, tbuf **q, tbuf **out,
                              tbuf **lse, double **ro, double **rl) {
  int64_t qsh[3] = {tq, c->hq, c->d}, lsh[2] = {c->hq, tq};
  for (int i = 0; i < 2; i++) {
    q[i] = tb_new(tr->be, dt, 3, qsh), out[i] = tb_new(tr->be, dt, 3, qsh);
    lse[i] = tb_new(tr->be, DT_F32, 2, lsh);
    tb_fill_uniform(q[i], r, -2, 2);
    tb_poison(out[i]);
    tb_poison(lse[i]);
    double *qd = tb_to_f64(q[i]);
    ro[i] = malloc((size_t)(tq * c->hq * c->d + 1) * sizeof *ro[i]);
    rl[i] = malloc((size_t)(tq * c->hq + 1) * sizeof *rl[i]);
    paged_ref(c, P, qd, qoff, ro[i], rl[i], tq);
    free(qd);
  }
}

/* Both calls' out and lse against their references. */
static void paged_two_check(test_run *tr, DLDataType dt, tbuf **out, tbuf **lse, double **ro,
                            double **rl) {
  for (int i = 0; i < 2; i++) {
    tb_sync(out[i]);
    tb_sync(lse[i]);
    check_close(tr, i ? "out (second call)" : "out (first call)", out[i], ro[i],
                tol_for(dt, dt.bits == 32 ? 4 : 1));
    check_close(tr, i ? "lse (second call)" : "lse (first call)", lse[i], rl[i],
                tol_for(DT_F32, 4));
  }
}

static void paged_two_free(tbuf **q, tbuf **out, tbuf **lse, double **ro, double **rl) {
  for (int i = 0; i < 2; i++) {
    free(ro[i]), free(rl[i]);
    tb_free(q[i]), tb_free(out[i]), tb_free(lse[i]);
  }
}

/* Two calls back to back on the stream, no synchronization or host work between them, with
 * different q and out: on sm_90 the second call's main kernel is a programmatic dependent of
 * the first call's merge and writes the same scratch (partials, pieces) that merge reads,
 * so it must wait (griddepcontrol.wait) before any global access; both outputs are checked
 * against the reference.
 * ready: with ot_attention_params.paged_kv_ready = 1 (CUDA: the kernel reads the tables and
 * the older keys / values before its griddepcontrol.wait) and the query tokens' own keys /
 * values written by the kernel just before the first call: the pages hold stale values
 * (4.0) in the last sq_b slots of each sequence until ot_kv_append writes the real ones
 * (no host work or synchronization between the three launches either). ot_kv_append's
 * kernel never signals launch_dependents, so the first call's kernel starts only once it
 * has exited: these cases check the early path's results (tables and page ids read
 * early, which stages go before the wait), but a newest key copied before the wait would
 * most likely read the real values too. Catching that takes a previous kernel that signals
 * its dependents before it writes those rows (as the engine's fused qkv kernel does). */
static void paged_pair_run(test_run *tr, const pcase *c, DLDataType dt, bool ready) {
  if (!tr_begin(tr, "paged attention %s%s %s %s", g_pmode, ready ? "kv ready" : "back to back",
                c->name, dt_name(dt)))
    return;
  rng r = tr_rng(tr);
  paged P;
  paged_make(tr, &P, dt, c->b, c->len, c->hkv, c->d, c->bs, &r);
  int64_t qoff[PMAX + 1] = {0};
  const int64_t tq = pcase_qoff(c, qoff);
  int64_t csh[1] = {c->b + 1}, nsh[3] = {ready ? tq : 0, c->hkv, c->d};
  tbuf *cu = tb_new(tr->be, DT_I32, 1, csh);
  tbuf *kn = tb_new(tr->be, dt, 3, nsh), *vn = tb_new(tr->be, dt, 3, nsh);
  for (int b = 0; b <= c->b; b++) tb_set(cu, b, (double)qoff[b]);
  for (int b = 0; ready && b < c->b; b++)
    for (int64_t i = 0; i < c->sq[b]; i++) {
      const int64_t t = c->len[b] - c->sq[b] + i;
      const int32_t page = (int32_t)tb_get(P.indices, (int64_t)tb_get(P.indptr, b) + t / c->bs);
      for (int h = 0; h < c->hkv; h++)
        for (int x = 0; x < c->d; x++) {
          const int64_t e = page_elem(&P, page, h, t % c->bs) + x;
          const int64_t g = ((P.koff[b] + t) * c->hkv + h) * c->d + x;
          const int64_t n = ((qoff[b] + i) * c->hkv + h) * c->d + x;
          tb_set(kn, n, P.k[g]);
          tb_set(vn, n, P.v[g]);
          tb_set(P.kp, e, 4.0);
          tb_set(P.vp, e, 4.0);
        }
    }
  tbuf *q[2], *out[2], *lse[2];
  double *ro[2], *rl[2];
  paged_two_queries(tr, c, dt, &P, qoff, tq, &r, q, out, lse, ro, rl);
  /* every upload before the first launch (tb_dl copies a changed host buffer) */
  const DLTensor *dcu = tb_dl(cu), *dkn = tb_dl(kn), *dvn = tb_dl(vn);
  (void)tb_dl(P.kp), (void)tb_dl(P.vp);
  const DLTensor *dq[2], *dout[2], *dlse[2];
  for (int i = 0; i < 2; i++) dq[i] = tb_dl(q[i]), dout[i] = tb_dl(out[i]), dlse[i] = tb_dl(lse[i]);
  ot_attention_params prm = pcase_params(c);
  prm.paged_kv_ready = ready;
  if ((!ready ||
       tr_ok(tr, ot_kv_append(tr->be->ctx, &P.kv, dcu, dkn, dvn, NULL, NULL, NULL, NULL),
             "append")) &&
      tr_ok(tr, ot_paged_attention(tr->be->ctx, &prm, dq[0], dcu, &P.kv, dout[0], dlse[0]),
            "first call") &&
      tr_ok(tr, ot_paged_attention(tr->be->ctx, &prm, dq[1], dcu, &P.kv, dout[1], dlse[1]),
            "second call")) {
    paged_check_plan(tr, c, dt, ready, "the second call", 0);
    paged_two_check(tr, dt, out, lse, ro, rl);
  }
  paged_two_free(q, out, lse, ro, rl);
  tb_free(cu), tb_free(kn), tb_free(vn);
  paged_free(&P);
  tr_end(tr);
}

static void paged_pair_case(test_run *tr, const pcase *c, DLDataType dt) {
  paged_pair_run(tr, c, dt, false);
}
static void paged_ready_case(test_run *tr, const pcase *c, DLDataType dt) {
  paged_pair_run(tr, c, dt, true);
}

#define NOW -1
static const pcase paged_cases[] = {
    /* name, b, len, sq, hq, hkv, d, bs, causal, wl, wr, cap, scale */
    {"decode B4 bs16 MHA", 4, {1, 17, 300, 1000}, {1, 1, 1, 1}, 4, 4, 64, 16, 1, -1, -1, 0, 0},
    {"decode B4 bs1 GQA4", 4, {1, 2, 33, 129}, {1, 1, 1, 1}, 8, 2, 32, 1, 1, -1, -1, 0, 0},
    {"decode B3 bs64 GQA8 D128", 3, {500, 64, 65}, {1, 1, 1}, 8, 1, 128, 64, 1, -1, -1, 0, 0},
    {"decode B1 bs256 GQA4 ctx 3000 (splits)", 1, {3000}, {1}, 8, 2, 64, 256, 1, -1, -1, 0, 0},
    {"decode B2 bs16 GQA2 D80 ctx 2049", 2, {2049, 700}, {1, 1}, 4, 2, 80, 16, 1, -1, -1, 0, 0},
    {"speculative 4 queries bs16 GQA2", 3, {100, 4, 257}, {4, 4, 4}, 4, 2, 64, 16, 1, -1, -1, 0, 0},
    {"speculative 3 queries bs256 GQA3", 2, {600, 3}, {3, 3}, 6, 2, 16, 256, 1, -1, -1, 0, 0},
    {"chunked prefill 100 of 612 bs16 GQA2", 1, {612}, {100}, 4, 2, 64, 16, 1, -1, -1, 0, 0},
    {"prefill from empty 130 bs64", 2, {130, 77}, {130, 77}, 2, 1, 32, 64, 1, -1, -1, 0, 0},
    {"chunked prefill batch bs1 GQA8", 3, {40, 90, 7}, {9, 90, 2}, 8, 1, 16, 1, 1, -1, -1, 0, 0},
    {"non-causal decode bs16", 2, {50, 333}, {2, 1}, 2, 2, 24, 16, 0, -1, -1, 0, 0},
    {"window 50 + softcap 10 bs16", 2, {400, 30}, {3, 30}, 4, 1, 32, 16, 1, 50, -1, 10.0f, 0},
    {"window 7/2 non-causal scale 0.2", 1, {300}, {5}, 2, 1, 40, 16, 0, 7, 2, 0, 0.2f},
    {"causal sq > len (empty rows)", 2, {3, 10}, {5, 4}, 2, 1, 16, 16, 1, -1, -1, 0, 0},
    {"empty sequences", 4, {0, 5, 0, 9}, {0, 1, 1, 0}, 2, 2, 8, 4, 1, -1, -1, 0, 0},
    {"D1 bs3", 2, {10, 4}, {1, 2}, 3, 1, 1, 3, 1, -1, -1, 0, 0},
};
static const pcase paged_long[] = {
    {"decode B1 ctx 4096 Hq32 Hkv8 D128 bs16", 1, {4096}, {1}, 32, 8, 128, 16, 1, -1, -1, 0, 0},
    {"decode B1 ctx 65536 Hq8 Hkv1 D64 bs256", 1, {65536}, {1}, 8, 1, 64, 256, 1, -1, -1, 0, 0},
};

/* CUDA: the tensor-core kernel's shapes (bf16 / fp16, head_dim 64 / 128): page sizes 1,
 * 16, 64, 256, GQA ratios 1 to 16 (tiles of 16 rows: group x queries), contexts 1 .. 64k,
 * speculative and prefill chunks, masks; the f32 runs of the same cases take the
 * fallback kernel. */
static const pcase paged_cuda_cases[] = {
    {"cuda decode B5 bs16 GQA4 Hq32 D128", 5, {1, 15, 16, 17, 1000}, {1, 1, 1, 1, 1}, 32, 8, 128, 16, 1, -1, -1, 0, 0},
    {"cuda decode B3 bs1 MHA D64", 3, {1, 2, 300}, {1, 1, 1}, 4, 4, 64, 1, 1, -1, -1, 0, 0},
    {"cuda decode B3 bs64 GQA8 D128", 3, {64, 65, 4000}, {1, 1, 1}, 16, 2, 128, 64, 1, -1, -1, 0, 0},
    {"cuda decode B3 bs256 GQA2 D128", 3, {1, 257, 3000}, {1, 1, 1}, 4, 2, 128, 256, 1, -1, -1, 0, 0},
    {"cuda decode GQA16 D64 bs16", 2, {33, 700}, {1, 1}, 32, 2, 64, 16, 1, -1, -1, 0, 0},
    {"cuda decode GQA3 D128 bs3 (scalar pages)", 2, {100, 31}, {1, 1}, 6, 2, 128, 3, 1, -1, -1, 0, 0},
    {"cuda speculative 3 queries GQA4 D128", 3, {100, 3, 2000}, {3, 3, 3}, 8, 2, 128, 16, 1, -1, -1, 0, 0},
    {"cuda speculative 5 queries GQA4 D64 (2 tiles)", 2, {517, 5}, {5, 5}, 8, 2, 64, 16, 1, -1, -1, 0, 0},
    {"cuda chunked prefill 100 of 612 GQA4 D128", 1, {612}, {100}, 8, 2, 128, 16, 1, -1, -1, 0, 0},
    {"cuda prefill from empty GQA3 D64 bs64", 2, {130, 77}, {130, 77}, 6, 2, 64, 64, 1, -1, -1, 0, 0},
    {"cuda window 50 softcap 10 D128", 2, {400, 30}, {3, 30}, 8, 2, 128, 16, 1, 50, -1, 10.0f, 0},
    {"cuda non-causal window 7/2 D64 scale 0.2", 1, {300}, {5}, 4, 1, 64, 16, 0, 7, 2, 0, 0.2f},
    {"cuda mixed batch with empty sequences", 6, {0, 5, 0, 9, 1, 260}, {0, 1, 1, 0, 2, 1}, 8, 2, 128, 4, 1, -1, -1, 0, 0},
    {"cuda causal sq > len D64", 2, {3, 10}, {5, 4}, 4, 2, 64, 16, 1, -1, -1, 0, 0},
    /* pages of 16 x m keys, m not a power of 2: the aligned-page instances' division path
     * (slot kb % 48, page key / 48; no page-id speculation), partial last steps, a 2-token
     * tile; then a left window (a split start rounded down to 16 keys inside a 48-key page) */
    {"cuda decode B3 bs48 GQA4 D128 (pages of 3 x 16)", 3, {47, 48, 1500}, {1, 2, 1}, 16, 4, 128, 48, 1, -1, -1, 0, 0},
    {"cuda window 200 bs48 GQA4 D128", 2, {1000, 60}, {1, 3}, 16, 4, 128, 48, 1, 200, -1, 0, 0},
    /* batches whose tables divide evenly (the page-id guess at batch > 1, plan flag 2048):
     * equal lengths (every guess holds); equal page counts with ragged last pages (the
     * guessed split starts miss where forced splits cut the shorter ones: 3 splits of
     * 1024 keys are 384, of 769 320); shares of 10 / 30 / 20 / 20 pages (sequence 1's
     * first entry guessed 20, not 10; 2 and 3 guessed right); 2 / 2 / 2 queries of group 8
     * (a tile each, guessed right) and 3 / 1 / 2 (4 tiles: slots 1-3 guess the wrong
     * sequence) */
    {"cuda guess B4 equal ctx 1000 Hq32 Hkv8 D128 bs16", 4, {1000, 1000, 1000, 1000}, {1, 1, 1, 1}, 32, 8, 128, 16, 1, -1, -1, 0, 0},
    {"cuda guess B3 bs256 equal pages ragged ends", 3, {1024, 769, 900}, {1, 1, 1}, 16, 4, 128, 256, 1, -1, -1, 0, 0},
    {"cuda guess B4 bs16 shares 10/30/20/20 pages", 4, {160, 480, 313, 320}, {1, 1, 1, 1}, 32, 8, 128, 16, 1, -1, -1, 0, 0},
    {"cuda guess B3 GQA8 2/2/2 queries D64", 3, {500, 500, 500}, {2, 2, 2}, 16, 2, 64, 16, 1, -1, -1, 0, 0},
    {"cuda guess B3 GQA8 3/1/2 queries D128", 3, {500, 500, 500}, {3, 1, 2}, 16, 2, 128, 16, 1, -1, -1, 0, 0},
    /* 4 queries of group 8: 2 tiles a sequence (slot >> 1, guessed right); 5 of group 8:
     * 3 tiles, not a power of two (no guess at batch > 1) */
    {"cuda guess B3 GQA8 4/4/4 queries D128 (2 tiles each)", 3, {700, 700, 700}, {4, 4, 4}, 16, 2, 128, 16, 1, -1, -1, 0, 0},
    {"cuda guess B2 GQA8 5/5 queries D128 (3 tiles each)", 2, {600, 600}, {5, 5}, 16, 2, 128, 16, 1, -1, -1, 0, 0},
};
static const pcase paged_cuda_long[] = {
    {"cuda decode B1 ctx 65536 Hq32 Hkv8 D128 bs16", 1, {65536}, {1}, 32, 8, 128, 16, 1, -1, -1, 0, 0},
    {"cuda decode B2 ctx 20000 GQA2 D64 bs1", 2, {20000, 7}, {1, 1}, 4, 2, 64, 1, 1, -1, -1, 0, 0},
    {"cuda decode B1 ctx 33000 GQA8 D128 bs256 spec 2", 1, {33000}, {2}, 8, 1, 128, 256, 1, -1, -1, 0, 0},
    {"cuda decode B3 ctx 5000 GQA4 D128 bs1", 3, {5000, 31, 2500}, {1, 1, 1}, 16, 4, 128, 1, 1, -1, -1, 0, 0},
    {"cuda decode B2 ctx 9000 GQA1 D128 bs7 window 3000", 2, {9000, 4099}, {1, 3}, 4, 4, 128, 7, 1, 3000, -1, 0, 0},
    /* batch 1 at the engine's heads, page ids loaded with the tables (129 pages plan for
     * 2064 keys: 33 splits of 64 on an H200, 132 SMs x 2 CTAs), and with a left window
     * (47 splits of 64 keys; those that start past the guessed key load the ids again) */
    {"cuda decode B1 ctx 2049 Hq32 Hkv8 D128 bs16 (engine)", 1, {2049}, {1}, 32, 8, 128, 16, 1, -1, -1, 0, 0},
    {"cuda decode B1 ctx 3000 GQA4 D128 bs16 window 1000", 1, {3000}, {1}, 16, 4, 128, 16, 1, 1000, -1, 0, 0},
};
/* paged_kv_ready (paged_ready_case, the split kernel): the engine's batch 1 (the newest key
 * alone in the last split's first step), a long one (it in the last split's last step,
 * every split's first stages loaded early), 3 speculative tokens per sequence across step
 * boundaries, a sequence without queries beside others, D 64 (no early start there: the
 * plain kernel); then pages of 256 keys at batch 1 (splits starting inside a page, page
 * ids loaded with the tables), pages of 1 key with a left window, and GQA 1 (a tile's real
 * rows: 2 of 16) */
static const pcase paged_cuda_ready[] = {
    {"cuda decode B1 ctx 2049 Hq32 Hkv8 D128 bs16 (engine)", 1, {2049}, {1}, 32, 8, 128, 16, 1, -1, -1, 0, 0},
    {"cuda decode B1 ctx 40000 Hq32 Hkv8 D128 bs16", 1, {40000}, {1}, 32, 8, 128, 16, 1, -1, -1, 0, 0},
    {"cuda speculative 3 queries GQA4 D128 bs16", 3, {1000, 17, 3}, {3, 3, 3}, 8, 2, 128, 16, 1, -1, -1, 0, 0},
    {"cuda decode B3 GQA4 D128 bs64 one without queries", 3, {700, 130, 64}, {1, 0, 1}, 8, 2, 128, 64, 1, -1, -1, 0, 0},
    {"cuda decode B2 GQA2 D64 bs16", 2, {500, 3}, {1, 1}, 4, 2, 64, 16, 1, -1, -1, 0, 0},
    {"cuda decode B1 ctx 5000 spec 3 GQA4 D128 bs256", 1, {5000}, {3}, 16, 4, 128, 256, 1, -1, -1, 0, 0},
    {"cuda decode B2 GQA8 D128 bs1 window 500", 2, {2500, 40}, {1, 1}, 8, 1, 128, 1, 1, 500, -1, 0, 0},
    {"cuda speculative 2 queries GQA1 D128 bs16", 2, {300, 2}, {2, 2}, 4, 4, 128, 16, 1, -1, -1, 0, 0},
};
/* batch 1 with an over-provisioned table (as the engine's, sized for max_len; run with
 * 1, 100 and 99 spare entries): 2049 keys in a table of 2080 (bench_engine's: 33 splits of
 * 64 on an H200 since the planner rounds len / 64 up, entries past the sequence read for the
 * last split), 1000 keys in one of 2608 (21 splits planned; the kernel's chunks are 64, so
 * only split 0's guess holds), and pages of 1 key at D 64 (49 splits of 64 since d5a8f15, 25
 * of 128 before; at 3001 keys the last two splits are empty) */
static const pcase paged_cuda_overprov[] = {
    {"cuda decode B1 ctx 2049 of 2080 Hq32 Hkv8 D128 bs16", 1, {2049}, {1}, 32, 8, 128, 16, 1, -1, -1, 0, 0},
    {"cuda decode B1 ctx 1000 of 2608 Hq32 Hkv8 D128 bs16", 1, {1000}, {1}, 32, 8, 128, 16, 1, -1, -1, 0, 0},
    {"cuda decode B1 ctx 3001 of 3100 GQA4 D64 bs1", 1, {3001}, {1}, 16, 4, 64, 1, 1, -1, -1, 0, 0},
};

/* CUDA stream kernel (OT_PAGED_KERNEL=stream, head_dim 128): a ragged batch of b
 * sequences (lengths 0 .. maxlen, 0 .. maxq queries, generated from `seed`), GQA hq / hkv,
 * pages of bs. ctas > 0 forces the grid (OT_PAGED_STREAM_CTAS): few warps then span many
 * sequences, so the 32-sequence windows slide and units are cut into pieces. */
static void paged_stream_case(test_run *tr, const char *name, int b, int maxlen, int maxq,
                              int hq, int hkv, int bs, int ctas, DLDataType dt, uint64_t seed) {
  pcase c;
  memset(&c, 0, sizeof c);
  c.name = name, c.b = b, c.hq = hq, c.hkv = hkv, c.d = 128, c.bs = bs;
  c.causal = 1, c.wl = -1, c.wr = -1;
  rng r = {seed};
  for (int i = 0; i < b; i++) {
    c.len[i] = (int)rng_int(&r, 0, maxlen);
    c.sq[i] = (int)rng_int(&r, 0, maxq);
    if (c.sq[i] > c.len[i] && rng_int(&r, 0, 1)) c.sq[i] = c.len[i]; /* mostly sq <= len */
  }
  char cs[16];
  snprintf(cs, sizeof cs, "%d", ctas);
  env_saved kern = env_set("OT_PAGED_KERNEL", "stream");
  env_saved grid = env_set("OT_PAGED_STREAM_CTAS", ctas > 0 ? cs : NULL);
  paged_case(tr, &c, dt);
  env_restore(&grid);
  env_restore(&kern);
}

/* CUDA: the kernel that the default (no OT_PAGED_KERNEL) picks for a decode of b
 * sequences of len keys (Hq 32 / Hkv 8, D 128, pages of 16, bf16): the stream kernel only
 * past two waves of the split kernel's 4-warp CTAs (ps_auto; 132 SMs x 2 CTAs: 528 units);
 * want 1 split, 2 stream; the split kernel's plan flags set / clear (32: 8-warp CTAs, taken
 * only where they leave one split). The result is checked against float64 too. */
static void paged_auto_plan_case(test_run *tr, const char *name, int b, int len, int want,
                                 int flags_set, int flags_clear) {
  pcase c;
  memset(&c, 0, sizeof c);
  c.name = name, c.b = b, c.hq = 32, c.hkv = 8, c.d = 128, c.bs = 16;
  c.causal = 1, c.wl = -1, c.wr = -1;
  for (int i = 0; i < b; i++) c.len[i] = len, c.sq[i] = 1;
  env_saved kern = env_set("OT_PAGED_KERNEL", NULL);
  env_saved splits = env_set("OT_PAGED_SPLITS", NULL);
  g_pkernel = want;
  g_pflag_set = flags_set, g_pflag_clear = flags_clear;
  paged_case(tr, &c, DT_BF16);
  g_pkernel = 0;
  g_pflag_set = g_pflag_clear = 0;
  env_restore(&splits);
  env_restore(&kern);
}

/* CUDA stream kernel, masks the head_dim-128 cases above leave out (they are all causal,
 * and the softcap one has a left window, which keeps the split kernel): non-causal,
 * softcap, a right window, an empty sequence with a query; run on 1 CTA so that units are
 * cut into pieces. */
static const pcase paged_stream_masks[] = {
    {"cuda stream non-causal softcap 10 D128, 1 CTA", 2, {400, 30}, {3, 30}, 8, 2, 128, 16, 0, -1, -1, 10.0f, 0},
    {"cuda stream non-causal window right 2 scale 0.2 D128, 1 CTA", 3, {300, 5, 0}, {5, 2, 1}, 8, 2, 128, 16, 0, -1, 2, 0, 0.2f},
};

/* CUDA OT_DEBUG: a page id out of range is reported (not read) by both kernels and by
 * the append. */
static void paged_debug_case(test_run *tr, DLDataType dt, int d) {
  if (!tr_begin(tr, "paged OT_DEBUG page-id check %s D%d", dt_name(dt), d)) return;
  rng r = tr_rng(tr);
  int len[2] = {40, 9}, sq[2] = {1, 1};
  paged P;
  paged_make(tr, &P, dt, 2, len, 2, d, 16, &r);
  tb_set(P.indices, 1, (double)(P.npages + 3));
  tb_dl(P.indices); /* P.kv holds the DLTensors: upload the edited tables */
  int64_t qsh[3] = {2, 4, d}, csh[1] = {3}, ksh[3] = {2, 2, d};
  tbuf *q = tb_new(tr->be, dt, 3, qsh), *out = tb_new(tr->be, dt, 3, qsh);
  tbuf *cu = tb_new(tr->be, DT_I32, 1, csh), *kn = tb_new(tr->be, dt, 3, ksh);
  tbuf *vn = tb_new(tr->be, dt, 3, ksh);
  tb_fill_uniform(q, &r, -1, 1), tb_fill_uniform(kn, &r, -1, 1), tb_fill_uniform(vn, &r, -1, 1);
  tb_set(cu, 0, 0), tb_set(cu, 1, sq[0]), tb_set(cu, 2, sq[0] + sq[1]);
  env_saved debug = env_set("OT_DEBUG", "1");
  ot_attention_params prm = ot_attention_default_params();
  prm.causal = 1;
  tr_expect_error(tr, ot_paged_attention(tr->be->ctx, &prm, tb_dl(q), tb_dl(cu), &P.kv, tb_dl(out), NULL),
                  OT_ERR_INVALID_ARGUMENT, "ot_paged_attention: kv.indices", "indices[1]");
  /* the append writes the last token of sequence 0: slot 39 in page entry 2 (fine), so
   * make entry 2 bad as well */
  tb_set(P.indices, 2, -7.0);
  tb_dl(P.indices);
  tb_set(cu, 1, 1), tb_set(cu, 2, 2);
  tr_expect_error(tr, ot_kv_append(tr->be->ctx, &P.kv, tb_dl(cu), tb_dl(kn), tb_dl(vn), NULL, NULL, NULL, NULL),
                  OT_ERR_INVALID_ARGUMENT, "ot_kv_append: kv.indices", "= -7");
  tb_set(P.indices, 1, 0), tb_set(P.indices, 2, 1);
  tb_set(P.lpl, 1, 17.0); /* last_page_len > block_size */
  tb_dl(P.indices), tb_dl(P.lpl);
  tr_expect_error(tr, ot_paged_attention(tr->be->ctx, &prm, tb_dl(q), tb_dl(cu), &P.kv, tb_dl(out), NULL),
                  OT_ERR_INVALID_ARGUMENT, "ot_paged_attention: kv.last_page_len", "= 17");
  env_restore(&debug);
  tb_free(q), tb_free(out), tb_free(cu), tb_free(kn), tb_free(vn);
  paged_free(&P);
  tr_end(tr);
}

/* The split choice: at batch 1 (and few kv heads) work is split so that >= 2 x threads
 * tasks exist; large batches are not split; short contexts are never cut below 128. */
static void paged_splits(test_run *tr) {
  if (!tr_begin(tr, "paged attention split choice")) return;
  struct {
    int64_t b, hkv, len;
    int threads;
    int64_t want;
  } cs[] = {{1, 1, 3000, 2, 4}, {1, 8, 65536, 2, 1}, {1, 1, 65536, 16, 32}, {1, 2, 200, 8, 2},
            {64, 8, 4096, 16, 1}, {1, 1, 100, 8, 1}, {2, 1, 1000, 2, 2}};
  for (size_t i = 0; i < sizeof cs / sizeof cs[0]; i++) {
    int64_t s = ot_paged_num_splits(cs[i].b, cs[i].hkv, cs[i].len, cs[i].threads);
    if (s != cs[i].want)
      tr_fail(tr, "batch %lld hkv %lld len %lld threads %d: %lld splits, expected %lld",
              (long long)cs[i].b, (long long)cs[i].hkv, (long long)cs[i].len, cs[i].threads,
              (long long)s, (long long)cs[i].want);
  }
  tr_end(tr);
}

/* got (an output of the append) equal to exp (ot_rope_forward's) element for element. */
static void append_same_as_rope(test_run *tr, const char *name, const tbuf *got, const tbuf *exp) {
  for (int64_t i = 0; i < got->numel && !tr->case_failed; i++)
    if (tb_get(got, i) != tb_get(exp, i))
      tr_fail(tr, "%s[%lld] = %g, rope gives %g", name, (long long)i, tb_get(got, i), tb_get(exp, i));
}

/* ot_kv_append: the new tokens' slots hold k (rotated when asked, bit for bit what
 * ot_rope_forward gives) and v; every other element of the pages is unchanged. Head dim
 * d, rotary dim rd; with_q 1: q rotated into q_out, 2: in place; strided 1: k / v rows
 * of d + 5 (off 16 bytes: CUDA's scalar kernel), 2: of d + 8 (aligned, not contiguous).
 * kout (with rope): ot_rope_kv_append, the rotated k also into 1: a contiguous k_out
 * (poisoned first), 2: k_new itself, in place (the pages must hold k rotated once). */
static const char *g_append_tag = ""; /* appended to the case names (append_warp_cases) */
static int g_append_n1 = 37;          /* new tokens of sequence 1 (of 4) */

static void append_case_k(test_run *tr, DLDataType dt, int bs, int rope_mode, int with_q,
                          bool explicit_pos, int strided, int d, int rd, int kout) {
  char dims[32] = "";
  if (d != 16 || rd != 12) snprintf(dims, sizeof dims, " D%d rd%d", d, rd);
  if (!tr_begin(tr, "kv append %s bs%d rope %s%s%s%s%s%s%s", dt_name(dt), bs,
                rope_mode < 0 ? "off" : rope_mode == 0 ? "neox" : "gptj",
                with_q == 2 ? " +q in place" : with_q ? " +q" : "",
                explicit_pos ? " positions" : "",
                strided == 2 ? " padded k/v" : strided ? " strided k/v" : "", dims,
                kout == 2 ? " k_out in place" : kout ? " k_out" : "", g_append_tag))
    return;
  rng r = tr_rng(tr);
  enum { B = 4 };
  int len[B] = {1, g_append_n1, 5 * bs + 1, 2 * bs}, nnew[B] = {1, g_append_n1, 3, 0};
  const int hkv = 2, hq = 4;
  paged P;
  paged_make(tr, &P, dt, B, len, hkv, d, bs, &r);
  /* the old content of every slot is random (not NaN) so that "unchanged" means bits */
  for (int64_t i = 0; i < P.kp->numel; i++) {
    tb_set(P.kp, i, rng_uniform(&r, -1, 1));
    tb_set(P.vp, i, rng_uniform(&r, -1, 1));
  }
  int64_t cu_v[B + 1] = {0};
  for (int b = 0; b < B; b++) cu_v[b + 1] = cu_v[b] + nnew[b];
  int64_t T = cu_v[B];
  const int pad = strided == 2 ? 8 : 5, tpad = strided == 2 ? 8 : 3;
  int64_t ksh[3] = {T, hkv, d}, kst[3] = {hkv * (d + pad) + tpad, d + pad, 1};
  int64_t qsh[3] = {T, hq, d};
  int64_t csh[1] = {B + 1}, psh[1] = {T};
  tbuf *kn = strided ? tb_new_strided(tr->be, dt, 3, ksh, kst) : tb_new(tr->be, dt, 3, ksh);
  tbuf *vn = strided ? tb_new_strided(tr->be, dt, 3, ksh, kst) : tb_new(tr->be, dt, 3, ksh);
  tbuf *cu = tb_new(tr->be, DT_I32, 1, csh), *pos = tb_new(tr->be, DT_I32, 1, psh);
  tbuf *q = tb_new(tr->be, dt, 3, qsh), *qo = tb_new(tr->be, dt, 3, qsh);
  tbuf *kexp = tb_new(tr->be, dt, 3, ksh), *qexp = tb_new(tr->be, dt, 3, qsh);
  tbuf *ko = kout == 1 ? tb_new(tr->be, dt, 3, ksh) : NULL;
  if (ko) tb_poison(ko);
  tb_fill_uniform(kn, &r, -1, 1);
  tb_fill_uniform(vn, &r, -1, 1);
  tb_fill_uniform(q, &r, -1, 1);
  tb_poison(qo);
  for (int b = 0; b <= B; b++) tb_set(cu, b, (double)cu_v[b]);
  for (int b = 0; b < B; b++)
    for (int i = 0; i < nnew[b]; i++)
      tb_set(pos, cu_v[b] + i, explicit_pos ? (double)rng_int(&r, 0, 100000)
                                            : (double)(len[b] - nnew[b] + i));
  ot_rope_params rp = ot_rope_default_params();
  rp.mode = rope_mode == 1 ? OT_ROPE_GPTJ : OT_ROPE_NEOX;
  rp.rotary_dim = rd;
  /* expected rotated k and q from the public rope op */
  if (rope_mode >= 0) {
    if (!tr_ok(tr, ot_rope_forward(tr->be->ctx, &rp, tb_dl(q), tb_dl(kn), tb_dl(pos), NULL,
                                   tb_dl(qexp), tb_dl(kexp)),
               "reference rope"))
      goto out;
    tb_sync(qexp), tb_sync(kexp);
  } else {
    for (int64_t i = 0; i < kn->numel; i++) tb_set(kexp, i, tb_get(kn, i));
  }
  void *ks = tb_snapshot(P.kp), *vs = tb_snapshot(P.vp);
  const DLTensor *qa = with_q ? tb_dl(q) : NULL;
  const DLTensor *qoa = with_q == 2 ? tb_dl(q) : with_q ? tb_dl(qo) : NULL;
  const DLTensor *pa = explicit_pos ? tb_dl(pos) : NULL;
  ot_status st = kout ? ot_rope_kv_append(tr->be->ctx, &rp, &P.kv, tb_dl(cu), tb_dl(kn),
                                          tb_dl(vn), pa, qa, qoa, tb_dl(kout == 2 ? kn : ko))
                      : ot_kv_append(tr->be->ctx, &P.kv, tb_dl(cu), tb_dl(kn), tb_dl(vn),
                                     rope_mode >= 0 ? &rp : NULL, pa, qa, qoa);
  tbuf *qres = with_q == 2 ? q : qo; /* where the rotated q is */
  tbuf *kres = kout == 2 ? kn : ko;  /* where the rotated k rows are (kout) */
  if (tr_ok(tr, st, kout ? "ot_rope_kv_append" : "ot_kv_append")) {
    tb_sync(P.kp), tb_sync(P.vp), tb_sync(qres);
    if (kres) tb_sync(kres);
    char *is_new = calloc((size_t)P.kp->numel, 1);
    for (int b = 0; b < B; b++) {
      int64_t base = (int64_t)tb_get(P.indptr, b);
      for (int i = 0; i < nnew[b]; i++) {
        int64_t t = len[b] - nnew[b] + i, row = cu_v[b] + i;
        int32_t page = (int32_t)tb_get(P.indices, base + t / bs);
        for (int h = 0; h < hkv; h++)
          for (int x = 0; x < d; x++) {
            int64_t e = page_elem(&P, page, h, t % bs) + x, src = (row * hkv + h) * d + x;
            is_new[e] = 1;
            double gk = tb_get(P.kp, e), gv = tb_get(P.vp, e);
            if (gk != tb_get(kexp, src) || gv != tb_get(vn, src)) {
              tr_fail(tr, "seq %d token %lld head %d dim %d: k %g v %g, expected %g %g", b,
                      (long long)t, h, x, gk, gv, tb_get(kexp, src), tb_get(vn, src));
              goto checked_new; /* the first mismatch is enough */
            }
          }
      }
    }
  checked_new:;
    size_t es = dt_size(dt);
    for (int64_t e = 0; e < P.kp->numel && !tr->case_failed; e++)
      if (!is_new[e] && (memcmp((char *)P.kp->host + e * es, (char *)ks + e * es, es) ||
                         memcmp((char *)P.vp->host + e * es, (char *)vs + e * es, es)))
        tr_fail(tr, "page element %lld that is no new token's slot changed", (long long)e);
    if (with_q) append_same_as_rope(tr, "q_out", qres, qexp);
    if (kres) append_same_as_rope(tr, "k_out", kres, kexp);
    free(is_new);
  }
  free(ks), free(vs);
out:
  tb_free(kn), tb_free(vn), tb_free(cu), tb_free(pos), tb_free(q), tb_free(qo);
  tb_free(kexp), tb_free(qexp);
  if (ko) tb_free(ko);
  paged_free(&P);
  tr_end(tr);
}

static void append_case_d(test_run *tr, DLDataType dt, int bs, int rope_mode, int with_q,
                          bool explicit_pos, int strided, int d, int rd) {
  append_case_k(tr, dt, bs, rope_mode, with_q, explicit_pos, strided, d, rd, 0);
}

static void append_case(test_run *tr, DLDataType dt, int bs, int rope_mode, bool with_q,
                        bool explicit_pos, bool strided) {
  append_case_d(tr, dt, bs, rope_mode, with_q, explicit_pos, strided, 16, 12);
}

/* Bad arguments of ot_kv_append and ot_paged_attention: the expected message, and the
 * pages / outputs untouched. */
static void paged_bad_args(test_run *tr) {
  if (!tr_begin(tr, "paged ops bad arguments")) return;
  rng r = tr_rng(tr);
  ot_context *ctx = tr->be->ctx;
  int len[2] = {10, 1};
  paged P;
  paged_make(tr, &P, DT_F32, 2, len, 2, 8, 4, &r);
  for (int64_t i = 0; i < P.kp->numel; i++) tb_set(P.kp, i, 1.5), tb_set(P.vp, i, 2.5);
  int64_t ksh[3] = {3, 2, 8}, qsh[3] = {3, 4, 8}, q5[3] = {3, 5, 8}, csh[1] = {3}, c2[1] = {2};
  int64_t lsh[2] = {4, 3}, lbad[2] = {3, 4}, psh[1] = {3}, p4[1] = {4};
  tbuf *kn = tb_new(tr->be, DT_F32, 3, ksh), *vn = tb_new(tr->be, DT_F32, 3, ksh);
  tbuf *vh = tb_new(tr->be, DT_F16, 3, ksh), *k3 = tb_new(tr->be, DT_F32, 3, qsh);
  tbuf *cu = tb_new(tr->be, DT_I32, 1, csh), *cu_short = tb_new(tr->be, DT_I32, 1, c2);
  tbuf *cu_big = tb_new(tr->be, DT_I32, 1, csh), *pos4 = tb_new(tr->be, DT_I32, 1, p4);
  tbuf *q = tb_new(tr->be, DT_F32, 3, qsh), *qq5 = tb_new(tr->be, DT_F32, 3, q5);
  tbuf *out = tb_new(tr->be, DT_F32, 3, qsh), *lse = tb_new(tr->be, DT_F32, 2, lsh);
  tbuf *lse_bad = tb_new(tr->be, DT_F32, 2, lbad), *pos = tb_new(tr->be, DT_I32, 1, psh);
  tb_fill_uniform(kn, &r, -1, 1), tb_fill_uniform(vn, &r, -1, 1), tb_fill_uniform(vh, &r, -1, 1);
  tb_fill_uniform(k3, &r, -1, 1), tb_fill_uniform(q, &r, -1, 1), tb_fill_uniform(qq5, &r, -1, 1);
  tb_poison(out), tb_poison(lse), tb_poison(lse_bad);
  int cuv[3] = {0, 2, 3}, cub[3] = {0, 1, 3};
  for (int i = 0; i < 3; i++) tb_set(cu, i, cuv[i]), tb_set(cu_big, i, cub[i]), tb_set(pos, i, i);
  tb_set(cu_short, 0, 0), tb_set(cu_short, 1, 3);
  void *ks = tb_snapshot(P.kp), *vs = tb_snapshot(P.vp), *os = tb_snapshot(out),
       *ls = tb_snapshot(lse);
  ot_rope_params rp = ot_rope_default_params(), bad_rp = rp;
  bad_rp.theta = 0;
  ot_attention_params ap = ot_attention_default_params(), bad_ap = ap;
  bad_ap.softcap = -1;
  /* append */
  tr_expect_error(tr, ot_kv_append(ctx, NULL, tb_dl(cu), tb_dl(kn), tb_dl(vn), NULL, NULL, NULL, NULL),
                  OT_ERR_INVALID_ARGUMENT, "ot_kv_append: kv: is NULL", NULL);
  tr_expect_error(tr, ot_kv_append(ctx, &P.kv, tb_dl(cu_big), tb_dl(kn), tb_dl(vn), NULL, NULL, NULL, NULL),
                  OT_ERR_INVALID_ARGUMENT, "ot_kv_append: cu_seqlens_new: sequence 1 appends 2",
                  "holds only 1");
  tb_set(cu_big, 1, 2), tb_set(cu_big, 2, 6);
  tr_expect_error(tr, ot_kv_append(ctx, &P.kv, tb_dl(cu_big), tb_dl(kn), tb_dl(vn), NULL, NULL, NULL, NULL),
                  OT_ERR_INVALID_ARGUMENT, "ot_kv_append: cu_seqlens_new: cu_seqlens_new[2] = 6",
                  "expected 3");
  tr_expect_error(tr, ot_kv_append(ctx, &P.kv, tb_dl(cu_short), tb_dl(kn), tb_dl(vn), NULL, NULL, NULL, NULL),
                  OT_ERR_INVALID_ARGUMENT, "ot_kv_append: cu_seqlens_new: shape", NULL);
  tr_expect_error(tr, ot_kv_append(ctx, &P.kv, tb_dl(cu), tb_dl(k3), tb_dl(vn), NULL, NULL, NULL, NULL),
                  OT_ERR_INVALID_ARGUMENT, "ot_kv_append: k_new", "heads_kv of kv.k_pages");
  tr_expect_error(tr, ot_kv_append(ctx, &P.kv, tb_dl(cu), tb_dl(kn), tb_dl(vh), NULL, NULL, NULL, NULL),
                  OT_ERR_INVALID_ARGUMENT, "ot_kv_append: v_new", "float16");
  tr_expect_error(tr, ot_kv_append(ctx, &P.kv, tb_dl(cu), tb_dl(kn), tb_dl(vn), NULL, tb_dl(pos), NULL, NULL),
                  OT_ERR_INVALID_ARGUMENT, "ot_kv_append: positions: is given but rope is NULL", NULL);
  tr_expect_error(tr, ot_kv_append(ctx, &P.kv, tb_dl(cu), tb_dl(kn), tb_dl(vn), &rp, NULL, tb_dl(q), NULL),
                  OT_ERR_INVALID_ARGUMENT, "ot_kv_append: q_out: is NULL but q is given", NULL);
  /* q_out is written through its own strides: a wrong shape or a partial overlap with q
   * is refused before anything is written (on CUDA too, where the kernel writes it). */
  tr_expect_error(tr, ot_kv_append(ctx, &P.kv, tb_dl(cu), tb_dl(kn), tb_dl(vn), &rp, NULL, tb_dl(q), tb_dl(qq5)),
                  OT_ERR_INVALID_ARGUMENT, "ot_kv_append: q_out: shape [3, 5, 8] does not match q", NULL);
  {
    DLTensor shifted = *tb_dl(q);
    shifted.byte_offset += 8 * sizeof(float); /* q's rows moved by one head: overlaps q */
    tr_expect_error(tr, ot_kv_append(ctx, &P.kv, tb_dl(cu), tb_dl(kn), tb_dl(vn), &rp, NULL, tb_dl(q), &shifted),
                    OT_ERR_INVALID_ARGUMENT, "ot_kv_append: q_out: overlaps q", NULL);
  }
  tr_expect_error(tr, ot_kv_append(ctx, &P.kv, tb_dl(cu), tb_dl(kn), tb_dl(vn), &rp, tb_dl(pos4), NULL, NULL),
                  OT_ERR_INVALID_ARGUMENT, "ot_kv_append: positions", "T_new");
  tr_expect_error(tr, ot_kv_append(ctx, &P.kv, tb_dl(cu), tb_dl(kn), tb_dl(vn), &bad_rp, NULL, NULL, NULL),
                  OT_ERR_INVALID_ARGUMENT, "ot_kv_append: rope: ot_rope_forward: params.theta", NULL);
  /* ot_rope_kv_append: rope required; k_out k_new itself or apart, of k_new's shape */
  tr_expect_error(tr, ot_rope_kv_append(ctx, NULL, &P.kv, tb_dl(cu), tb_dl(kn), tb_dl(vn), NULL, NULL, NULL, tb_dl(kn)),
                  OT_ERR_INVALID_ARGUMENT, "ot_rope_kv_append: rope: is NULL", NULL);
  tr_expect_error(tr, ot_rope_kv_append(ctx, &rp, &P.kv, tb_dl(cu), tb_dl(kn), tb_dl(vn), NULL, NULL, NULL, tb_dl(k3)),
                  OT_ERR_INVALID_ARGUMENT, "ot_rope_kv_append: k_out: shape [3, 4, 8] does not match k_new", NULL);
  tr_expect_error(tr, ot_rope_kv_append(ctx, &rp, &P.kv, tb_dl(cu), tb_dl(kn), tb_dl(vn), NULL, NULL, NULL, tb_dl(vn)),
                  OT_ERR_INVALID_ARGUMENT, "ot_rope_kv_append: k_out: must not overlap v_new", NULL);
  tr_expect_error(tr, ot_rope_kv_append(ctx, &rp, &P.kv, tb_dl(cu), tb_dl(kn), tb_dl(vn), NULL, NULL, NULL, tb_dl(vh)),
                  OT_ERR_INVALID_ARGUMENT, "ot_rope_kv_append: k_out", "float16");
  tr_expect_error(tr, ot_rope_kv_append(ctx, &bad_rp, &P.kv, tb_dl(cu), tb_dl(kn), tb_dl(vn), NULL, NULL, NULL, tb_dl(kn)),
                  OT_ERR_INVALID_ARGUMENT, "ot_rope_kv_append: rope: ot_rope_forward: params.theta", NULL);
  {
    DLTensor shifted = *tb_dl(kn);
    shifted.byte_offset += 8 * sizeof(float); /* k_new's rows moved by one head */
    tr_expect_error(tr, ot_rope_kv_append(ctx, &rp, &P.kv, tb_dl(cu), tb_dl(kn), tb_dl(vn), NULL, NULL, NULL, &shifted),
                    OT_ERR_INVALID_ARGUMENT, "ot_rope_kv_append: k_out: overlaps k_new", NULL);
    DLTensor in_pages = *tb_dl(kn);
    in_pages.data = P.vp->dev;
    tr_expect_error(tr, ot_rope_kv_append(ctx, &rp, &P.kv, tb_dl(cu), tb_dl(kn), tb_dl(vn), NULL, NULL, NULL, &in_pages),
                    OT_ERR_INVALID_ARGUMENT, "ot_rope_kv_append: kv.v_pages", "k_out");
  }
  {
    /* k_new that lives inside the pages */
    DLTensor inside = *tb_dl(kn);
    inside.data = P.kp->dev;
    tr_expect_error(tr, ot_kv_append(ctx, &P.kv, tb_dl(cu), &inside, tb_dl(vn), NULL, NULL, NULL, NULL),
                    OT_ERR_INVALID_ARGUMENT, "ot_kv_append: kv.k_pages", "k_new");
  }
  /* page table */
  tb_set(P.indices, 1, 999);
  P.kv.indices = tb_dl(P.indices);
  tr_expect_error(tr, ot_kv_append(ctx, &P.kv, tb_dl(cu), tb_dl(kn), tb_dl(vn), NULL, NULL, NULL, NULL),
                  OT_ERR_INVALID_ARGUMENT, "ot_kv_append: kv.indices: indices[1] = 999", "num_pages");
  tr_expect_error(tr, ot_paged_attention(ctx, &ap, tb_dl(q), tb_dl(cu), &P.kv, tb_dl(out), NULL),
                  OT_ERR_INVALID_ARGUMENT, "ot_paged_attention: kv.indices: indices[1] = 999", NULL);
  tb_set(P.indices, 1, 0);
  int32_t lpl0 = (int32_t)tb_get(P.lpl, 0);
  tb_set(P.lpl, 0, 0);
  P.kv.indices = tb_dl(P.indices);
  P.kv.last_page_len = tb_dl(P.lpl);
  tr_expect_error(tr, ot_paged_attention(ctx, &ap, tb_dl(q), tb_dl(cu), &P.kv, tb_dl(out), NULL),
                  OT_ERR_INVALID_ARGUMENT, "ot_paged_attention: kv.last_page_len: last_page_len[0] = 0",
                  "1 .. block_size");
  tb_set(P.lpl, 0, lpl0);
  P.kv.last_page_len = tb_dl(P.lpl);
  int32_t ip1 = (int32_t)tb_get(P.indptr, 1);
  tb_set(P.indptr, 1, 100);
  P.kv.indptr = tb_dl(P.indptr);
  tr_expect_error(tr, ot_paged_attention(ctx, &ap, tb_dl(q), tb_dl(cu), &P.kv, tb_dl(out), NULL),
                  OT_ERR_INVALID_ARGUMENT, "ot_paged_attention: kv.indptr: indptr[1] = 100",
                  "entries of kv.indices");
  tb_set(P.indptr, 1, ip1);
  P.kv.indptr = tb_dl(P.indptr);
  /* attention */
  tr_expect_error(tr, ot_paged_attention(ctx, &bad_ap, tb_dl(q), tb_dl(cu), &P.kv, tb_dl(out), NULL),
                  OT_ERR_INVALID_ARGUMENT, "ot_paged_attention: params.softcap", NULL);
  tr_expect_error(tr, ot_paged_attention(ctx, &ap, tb_dl(qq5), tb_dl(cu), &P.kv, tb_dl(out), NULL),
                  OT_ERR_INVALID_ARGUMENT, "ot_paged_attention: q: 5 query heads", "multiple");
  tr_expect_error(tr, ot_paged_attention(ctx, &ap, tb_dl(q), tb_dl(cu), &P.kv, tb_dl(q), NULL),
                  OT_ERR_INVALID_ARGUMENT, "ot_paged_attention: out", "q");
  tr_expect_error(tr, ot_paged_attention(ctx, &ap, tb_dl(q), tb_dl(cu), &P.kv, tb_dl(out), tb_dl(lse_bad)),
                  OT_ERR_INVALID_ARGUMENT, "ot_paged_attention: lse", "heads_q");
  tr_expect_error(tr, ot_paged_attention(ctx, &ap, tb_dl(q), tb_dl(cu_short), &P.kv, tb_dl(out), tb_dl(lse)),
                  OT_ERR_INVALID_ARGUMENT, "ot_paged_attention: cu_seqlens_q: shape", NULL);
  tr_expect_error(tr, ot_paged_attention(ctx, &ap, tb_dl(q), tb_dl(cu), &P.kv, tb_dl(vh), NULL),
                  OT_ERR_INVALID_ARGUMENT, "ot_paged_attention: out", "float16");
  tb_sync(P.kp), tb_sync(P.vp), tb_sync(out), tb_sync(lse);
  if (!tb_unchanged(P.kp, ks) || !tb_unchanged(P.vp, vs)) tr_fail(tr, "a failing call wrote pages");
  if (!tb_unchanged(out, os) || !tb_unchanged(lse, ls)) tr_fail(tr, "a failing call wrote out / lse");
  /* and the valid call works */
  if (tr_ok(tr, ot_paged_attention(ctx, &ap, tb_dl(q), tb_dl(cu), &P.kv, tb_dl(out), tb_dl(lse)),
            "valid call")) {
    tb_sync(out);
    for (int64_t i = 0; i < out->numel; i++)
      if (!isfinite(tb_get(out, i))) {
        tr_fail(tr, "valid call left out[%lld] = %g", (long long)i, tb_get(out, i));
        break;
      }
  }
  free(ks), free(vs), free(os), free(ls);
  tb_free(kn), tb_free(vn), tb_free(vh), tb_free(k3), tb_free(cu), tb_free(cu_short);
  tb_free(cu_big), tb_free(pos4), tb_free(q), tb_free(qq5), tb_free(out), tb_free(lse);
  tb_free(lse_bad), tb_free(pos);
  paged_free(&P);
  tr_end(tr);
}

/* End to end, as an engine drives it: a pool in an arena, two layers; sequence A is
 * prefilled in chunks, forked into B, and both decode a few steps as one batch. Each
 * step reserves slots, exports the page table, appends k / v with RoPE (q too) for both
 * layers, and runs ot_paged_attention; the oracle is ot_attention_forward (varlen,
 * causal) on dense copies of the same rotated keys, so the two CPU paths must agree. */
typedef struct dense_seq {
  int64_t len;
  float *k[2], *v[2]; /* per layer [len, hkv, d], the stored (rounded) values */
} dense_seq;

static void e2e_case(test_run *tr, DLDataType dt, int bs) {
  if (!tr_begin(tr, "kv cache + append + paged attention end to end %s bs%d", dt_name(dt), bs))
    return;
  rng r = tr_rng(tr);
  enum { HQ = 4, HKV = 2, D = 32, L = 2, MAXLEN = 128 };
  ot_context *ctx = tr->be->ctx;
  ot_arena *arena = NULL;
  ot_kv_cache *cache = NULL;
  dense_seq ds[2];
  memset(ds, 0, sizeof ds);
  for (int i = 0; i < 2; i++)
    for (int l = 0; l < L; l++) {
      ds[i].k[l] = malloc(MAXLEN * HKV * D * sizeof(float));
      ds[i].v[l] = malloc(MAXLEN * HKV * D * sizeof(float));
    }
  if (!tr_ok(tr, ot_arena_create(ctx, 8 << 20, &arena), "arena")) goto out;
  ot_kv_cache_params kp = kv_params(L, 2 * MAXLEN / bs + 4, bs, HKV, D, dt);
  if (!tr_ok(tr, ot_kv_cache_create(ctx, &kp, arena, &cache), "cache")) goto out;
  int64_t seq[2];
  ot_kv_cache_add_sequence(cache, &seq[0]);
  ot_rope_params rp = ot_rope_default_params();
  /* steps: chunks of A's prefill, then decode of A and B together */
  const int chunks[] = {20, 21, 9};
  const int nsteps = 3 + 5;
  for (int step = 0; step < nsteps && !tr->case_failed; step++) {
    int nb = step < 3 ? 1 : 2;
    if (step == 3) {
      if (!tr_ok(tr, ot_kv_cache_fork(cache, seq[0], &seq[1]), "fork")) break;
      ds[1].len = ds[0].len;
      for (int l = 0; l < L; l++) {
        memcpy(ds[1].k[l], ds[0].k[l], (size_t)ds[0].len * HKV * D * sizeof(float));
        memcpy(ds[1].v[l], ds[0].v[l], (size_t)ds[0].len * HKV * D * sizeof(float));
      }
    }
    int64_t ntok[2] = {step < 3 ? chunks[step] : 1, 1};
    if (step >= 3 && step % 2 == 0) ntok[1] = 2; /* B takes 2 tokens (speculative) */
    if (!tr_ok(tr, ot_kv_cache_reserve(cache, nb, seq, ntok), "reserve")) break;
    int32_t indptr[3], indices[2 * MAXLEN], lpl[2];
    if (!tr_ok(tr, ot_kv_cache_page_table(cache, nb, seq, indptr, indices, 2 * MAXLEN, lpl), "table")) break;
    int64_t T = ntok[0] + (nb > 1 ? ntok[1] : 0);
    int64_t ksh[3] = {T, HKV, D}, qsh[3] = {T, HQ, D}, csh[1] = {nb + 1}, ish[1] = {nb + 1};
    int64_t xsh[1] = {indptr[nb]}, lsh[1] = {nb}, lse_sh[2] = {HQ, T};
    tbuf *tip = tb_new(tr->be, DT_I32, 1, ish), *tix = tb_new(tr->be, DT_I32, 1, xsh);
    tbuf *tlp = tb_new(tr->be, DT_I32, 1, lsh), *cu = tb_new(tr->be, DT_I32, 1, csh);
    for (int i = 0; i <= nb; i++) tb_set(tip, i, indptr[i]);
    for (int i = 0; i < indptr[nb]; i++) tb_set(tix, i, indices[i]);
    for (int i = 0; i < nb; i++) tb_set(tlp, i, lpl[i]);
    tb_set(cu, 0, 0), tb_set(cu, 1, (double)ntok[0]);
    if (nb > 1) tb_set(cu, 2, (double)T);
    for (int l = 0; l < L && !tr->case_failed; l++) {
      DLTensor kpages, vpages;
      ot_kv_cache_layer(cache, l, &kpages, &vpages);
      ot_paged_kv kv = {&kpages, &vpages, tb_dl(tip), tb_dl(tix), tb_dl(tlp)};
      tbuf *kn = tb_new(tr->be, dt, 3, ksh), *vn = tb_new(tr->be, dt, 3, ksh);
      tbuf *q = tb_new(tr->be, dt, 3, qsh), *out = tb_new(tr->be, dt, 3, qsh);
      tbuf *out2 = tb_new(tr->be, dt, 3, qsh), *lse = tb_new(tr->be, DT_F32, 2, lse_sh);
      tbuf *lse2 = tb_new(tr->be, DT_F32, 2, lse_sh), *krot = tb_new(tr->be, dt, 3, ksh);
      tbuf *pos = tb_new(tr->be, DT_I64, 1, ksh);
      tb_fill_uniform(kn, &r, -1, 1), tb_fill_uniform(vn, &r, -1, 1), tb_fill_uniform(q, &r, -2, 2);
      tb_poison(out), tb_poison(out2), tb_poison(lse), tb_poison(lse2);
      /* the dense oracle's keys: rope of k_new at the sequence positions */
      for (int b = 0, row = 0; b < nb; b++)
        for (int i = 0; i < ntok[b]; i++) tb_set(pos, row++, (double)(ds[b].len + i));
      tr_ok(tr, ot_rope_forward(ctx, &rp, tb_dl(kn), NULL, tb_dl(pos), NULL, tb_dl(krot), NULL),
            "oracle rope");
      tb_sync(krot);
      if (!tr_ok(tr, ot_kv_append(ctx, &kv, tb_dl(cu), tb_dl(kn), tb_dl(vn), &rp, NULL, tb_dl(q),
                                  tb_dl(q)),
                 "ot_kv_append"))
        goto step_done;
      tb_sync(q);
      for (int b = 0, row = 0; b < nb; b++)
        for (int i = 0; i < ntok[b]; i++, row++)
          for (int e = 0; e < HKV * D; e++) {
            ds[b].k[l][(ds[b].len + i) * HKV * D + e] = (float)tb_get(krot, row * HKV * D + e);
            ds[b].v[l][(ds[b].len + i) * HKV * D + e] = (float)tb_get(vn, row * HKV * D + e);
          }
      ot_attention_params ap = ot_attention_default_params();
      ap.causal = 1;
      if (!tr_ok(tr, ot_paged_attention(ctx, &ap, tb_dl(q), tb_dl(cu), &kv, tb_dl(out), tb_dl(lse)),
                 "ot_paged_attention"))
        goto step_done;
      {
        /* dense varlen oracle */
        int64_t tk = ds[0].len + ntok[0] + (nb > 1 ? ds[1].len + ntok[1] : 0);
        int64_t dsh[3] = {tk, HKV, D};
        tbuf *dk = tb_new(tr->be, dt, 3, dsh), *dv = tb_new(tr->be, dt, 3, dsh);
        tbuf *cuk = tb_new(tr->be, DT_I32, 1, csh);
        int64_t at = 0;
        tb_set(cuk, 0, 0);
        for (int b = 0; b < nb; b++) {
          int64_t n = (ds[b].len + ntok[b]) * HKV * D;
          for (int64_t e = 0; e < n; e++) {
            tb_set(dk, at + e, ds[b].k[l][e]);
            tb_set(dv, at + e, ds[b].v[l][e]);
          }
          at += n;
          tb_set(cuk, b + 1, (double)(at / (HKV * D)));
        }
        if (tr_ok(tr, ot_attention_forward(ctx, &ap, tb_dl(q), tb_dl(dk), tb_dl(dv), tb_dl(cu),
                                           tb_dl(cuk), tb_dl(out2), tb_dl(lse2)),
                  "oracle attention")) {
          tb_sync(out), tb_sync(out2), tb_sync(lse), tb_sync(lse2);
          double *ref = tb_to_f64(out2), *lref = tb_to_f64(lse2);
          check_close(tr, "out vs ot_attention_forward", out, ref, tol_for(dt, dt.bits == 32 ? 4 : 1));
          check_close(tr, "lse vs ot_attention_forward", lse, lref, tol_for(DT_F32, 4));
          free(ref), free(lref);
        }
        tb_free(dk), tb_free(dv), tb_free(cuk);
      }
    step_done:
      tb_free(kn), tb_free(vn), tb_free(q), tb_free(out), tb_free(out2), tb_free(lse);
      tb_free(lse2), tb_free(krot), tb_free(pos);
    }
    for (int b = 0; b < nb; b++) ds[b].len += ntok[b];
    tb_free(tip), tb_free(tix), tb_free(tlp), tb_free(cu);
    char msg[200];
    if (!ot_kv_cache_check(cache, msg, sizeof msg)) tr_fail(tr, "cache: %s", msg);
  }
out:
  ot_kv_cache_destroy(cache);
  ot_arena_destroy(arena);
  for (int i = 0; i < 2; i++)
    for (int l = 0; l < L; l++) free(ds[i].k[l]), free(ds[i].v[l]);
  tr_end(tr);
}

/* ---- memory tracker -------------------------------------------------------------------- */

static ot_memory_counter tag_now(ot_memory_tag t) {
  ot_memory_counter c;
  ot_memory_tag_counter(t, &c);
  return c;
}

static ot_memory_counter op_now(const char *op) {
  ot_memory_counter c;
  ot_memory_op_counter(op, &c);
  return c;
}

/* The tracker is process-wide: the checks compare deltas, under op names of their own. */
static void tracker_case(test_run *tr) {
  if (!tr_begin(tr, "memory tracker: tags, ops, peaks, arena and pool")) return;
  ot_context *ctx = tr->be->ctx;
  ot_arena *a = NULL, *a2 = NULL;
  ot_kv_cache *c1 = NULL, *c2 = NULL;
  if (!tr_ok(tr, ot_arena_create(ctx, 1 << 20, &a), "arena")) goto out;
  ot_memory_counter w0 = tag_now(OT_MEMORY_WEIGHTS), act0 = tag_now(OT_MEMORY_ACTIVATIONS);
  ot_memory_counter o0 = tag_now(OT_MEMORY_OTHER), kv0 = tag_now(OT_MEMORY_KV_CACHE);
  ot_memory_counter ws0 = tag_now(OT_MEMORY_WORKSPACE);
  void *pw = NULL, *pa = NULL, *po = NULL, *px = (void *)(uintptr_t)0x42;
  tr_ok(tr, ot_arena_alloc_tagged(a, 1000, NULL, OT_MEMORY_WEIGHTS, "tracker test: embed", &pw), "w");
  tr_ok(tr, ot_arena_alloc_tagged(a, 300, NULL, OT_MEMORY_ACTIVATIONS, "tracker test: mlp", &pa), "a");
  tr_ok(tr, ot_arena_alloc(a, 10, NULL, &po), "plain");
  if (tag_now(OT_MEMORY_WEIGHTS).current - w0.current != 1024 ||
      tag_now(OT_MEMORY_ACTIVATIONS).current - act0.current != 512 ||
      tag_now(OT_MEMORY_OTHER).current - o0.current != 256)
    tr_fail(tr, "tag deltas: weights %zu, activations %zu, other %zu (expected 1024, 512, 256)",
            tag_now(OT_MEMORY_WEIGHTS).current - w0.current,
            tag_now(OT_MEMORY_ACTIVATIONS).current - act0.current,
            tag_now(OT_MEMORY_OTHER).current - o0.current);
  ot_memory_counter e = op_now("tracker test: embed");
  if (e.current != 1024 || e.allocs != 1 || e.frees != 0 || e.peak != 1024)
    tr_fail(tr, "op counter: current %zu allocs %llu", e.current, (unsigned long long)e.allocs);
  bool listed = false;
  for (int i = 0; i < ot_memory_op_count(); i++)
    if (ot_memory_op_name(i) && !strcmp(ot_memory_op_name(i), "tracker test: mlp")) listed = true;
  if (!listed) tr_fail(tr, "op name not listed by ot_memory_op_name");
  if (ot_memory_op_name(-1) || ot_memory_op_name(ot_memory_op_count())) tr_fail(tr, "op name out of range not NULL");
  /* peaks: a transient workspace block */
  ot_memory_reset_peaks();
  ot_memory_counter tot0;
  tr_ok(tr, ot_memory_total_counter(&tot0), "total");
  void *tmp = NULL;
  tr_ok(tr, ot_arena_alloc_tagged(a, 4096, NULL, OT_MEMORY_WORKSPACE, "tracker test: ws", &tmp), "ws");
  tr_ok(tr, ot_arena_free(a, tmp, NULL), "ws free");
  ot_memory_counter tot1;
  tr_ok(tr, ot_memory_total_counter(&tot1), "total");
  if (tot1.current != tot0.current || tot1.peak != tot0.current + 4096 ||
      tot1.allocs != tot0.allocs + 1 || tot1.frees != tot0.frees + 1)
    tr_fail(tr, "total after a transient block: current %zu (was %zu), peak %zu", tot1.current,
            tot0.current, tot1.peak);
  ot_memory_counter ws = tag_now(OT_MEMORY_WORKSPACE), wso = op_now("tracker test: ws");
  if (ws.current != ws0.current || ws.peak != ws0.current + 4096 || wso.peak != 4096 ||
      wso.current != 0 || wso.frees != 1)
    tr_fail(tr, "workspace after a transient block: current %zu (was %zu), peak %zu", ws.current,
            ws0.current, ws.peak);
  /* bad arguments */
  tr_expect_error(tr, ot_memory_total_counter(NULL), OT_ERR_INVALID_ARGUMENT,
                  "ot_memory_total_counter: out", NULL);
  tr_expect_error(tr, ot_arena_alloc_tagged(a, 8, NULL, (ot_memory_tag)7, "x", &px),
                  OT_ERR_INVALID_ARGUMENT, "ot_arena_alloc_tagged: tag: 7", "0 .. 4");
  if (px != (void *)(uintptr_t)0x42) tr_fail(tr, "ptr written by a failing tagged alloc");
  ot_memory_counter dummy;
  tr_expect_error(tr, ot_memory_tag_counter((ot_memory_tag)-1, &dummy), OT_ERR_INVALID_ARGUMENT,
                  "ot_memory_tag_counter: tag", NULL);
  tr_expect_error(tr, ot_memory_op_counter(NULL, &dummy), OT_ERR_INVALID_ARGUMENT,
                  "ot_memory_op_counter: op", NULL);
  ot_memory_counter never = op_now("tracker test: never used");
  if (never.current || never.allocs) tr_fail(tr, "an unknown op has counts");
  /* frees return the counters */
  ot_arena_free(a, pw, NULL), ot_arena_free(a, pa, NULL), ot_arena_free(a, po, NULL);
  if (tag_now(OT_MEMORY_WEIGHTS).current != w0.current ||
      tag_now(OT_MEMORY_ACTIVATIONS).current != act0.current ||
      tag_now(OT_MEMORY_OTHER).current != o0.current)
    tr_fail(tr, "counters not back after the frees");
  /* KV pools: own reservation and arena block, both under kv_cache */
  ot_kv_cache_params kp = kv_params(3, 10, 16, 2, 64, DT_BF16);
  ot_memory_counter kop0 = op_now("ot_kv_cache_create");
  if (!tr_ok(tr, ot_kv_cache_create(ctx, &kp, NULL, &c1), "pool")) goto out;
  if (!tr_ok(tr, ot_kv_cache_create(ctx, &kp, a, &c2), "pool in arena")) goto out;
  ot_kv_cache_info info;
  ot_kv_cache_get_info(c1, &info);
  if (tag_now(OT_MEMORY_KV_CACHE).current - kv0.current != 2 * info.bytes ||
      op_now("ot_kv_cache_create").current - kop0.current != 2 * info.bytes)
    tr_fail(tr, "kv_cache delta %zu, expected 2 x %zu",
            tag_now(OT_MEMORY_KV_CACHE).current - kv0.current, info.bytes);
  ot_kv_cache_destroy(c1), ot_kv_cache_destroy(c2);
  c1 = c2 = NULL;
  if (tag_now(OT_MEMORY_KV_CACHE).current != kv0.current) tr_fail(tr, "kv_cache not back to 0");
  /* an arena destroyed with live tagged blocks releases their counts */
  if (tr_ok(tr, ot_arena_create(ctx, 8192, &a2), "arena 2")) {
    void *p1;
    ot_arena_alloc_tagged(a2, 5000, NULL, OT_MEMORY_WEIGHTS, "tracker test: embed", &p1);
    ot_arena_destroy(a2);
    a2 = NULL;
    if (tag_now(OT_MEMORY_WEIGHTS).current != w0.current || op_now("tracker test: embed").current)
      tr_fail(tr, "arena destroy did not release its live blocks' counts");
  }
out:
  ot_kv_cache_destroy(c1), ot_kv_cache_destroy(c2);
  ot_arena_destroy(a), ot_arena_destroy(a2);
  tr_end(tr);
}

/* ---- the suite -------------------------------------------------------------------- */

/* The append cases of both backends: page sizes 1 .. 256, rope off / NeoX / GPT-J, with
 * and without q, explicit positions, strided k / v. Then head dims whose rows are whole
 * 16-byte vectors (CUDA's vector kernel: full and partial rotary, q in place, padded
 * k / v rows) and some that are not (D 20 in bf16, a NeoX half of 20, a GPT-J rd of 12
 * in f16: the scalar kernel). */
static void append_cases(test_run *tr) {
  append_case(tr, DT_F32, 16, -1, false, false, false);
  append_case(tr, DT_BF16, 1, -1, false, false, true);
  append_case(tr, DT_F16, 4, 0, true, false, false);
  append_case(tr, DT_BF16, 16, 1, true, true, true);
  append_case(tr, DT_F32, 64, 0, false, false, false);
  append_case(tr, DT_F32, 256, 0, true, true, false);
  append_case_d(tr, DT_BF16, 16, -1, 0, false, 2, 128, 128);
  append_case_d(tr, DT_BF16, 16, 0, 1, false, 0, 128, 128);
  append_case_d(tr, DT_BF16, 7, 0, 2, true, 2, 96, 32);
  append_case_d(tr, DT_F16, 4, 1, 1, true, 0, 64, 32);
  append_case_d(tr, DT_F16, 1, 1, 2, false, 2, 256, 256);
  append_case_d(tr, DT_F32, 3, 0, 1, true, 0, 36, 8);
  append_case_d(tr, DT_F32, 16, 1, 2, false, 2, 20, 12);
  append_case_d(tr, DT_BF16, 256, 0, 1, false, 0, 128, 40);
  append_case_d(tr, DT_BF16, 5, 0, 1, true, 0, 20, 20);
  append_case_d(tr, DT_F16, 16, 1, 2, false, 0, 32, 12);
  /* ot_rope_kv_append: k_out apart and in place, both kernels (strided 1: scalar) */
  append_case_k(tr, DT_BF16, 16, 0, 2, false, 2, 128, 128, 2);
  append_case_k(tr, DT_BF16, 16, 0, 1, true, 0, 128, 64, 1);
  append_case_k(tr, DT_F16, 7, 1, 2, false, 1, 64, 32, 2);
  append_case_k(tr, DT_F32, 4, 0, 0, true, 1, 20, 12, 1);
  append_case_k(tr, DT_BF16, 1, 1, 1, false, 2, 96, 96, 1);
  append_case_k(tr, DT_F32, 3, 0, 2, false, 0, 36, 8, 2);
}

/* CUDA's warp kernel (a warp per token, for RoPE appends of many tokens) forced with
 * OT_KV_APPEND_WARP=1 on the shapes it takes -- 16-bit types, rotary_dim == head_dim,
 * (NeoX: D / 2, GPT-J: D) / 8 items a row of 4 .. 32 -- and one it must leave to the
 * vector kernel (partial rotary); names end in "(warp kernel)". Then two cases of 304
 * tokens with the variable unset (the default choice takes the warp kernel from 256). */
static void append_warp_cases(test_run *tr) {
  env_saved w = env_set("OT_KV_APPEND_WARP", "1");
  g_append_tag = " (warp kernel)";
  append_case_k(tr, DT_BF16, 16, 0, 2, false, 2, 128, 128, 2); /* the engine's prefill */
  append_case_k(tr, DT_BF16, 1, 0, 1, true, 0, 64, 64, 1);     /* IPH 4 */
  append_case_k(tr, DT_F16, 16, 1, 1, true, 2, 128, 128, 1);   /* GPT-J IPH 16 */
  append_case_k(tr, DT_BF16, 7, 0, 0, false, 0, 256, 256, 2);  /* IPH 16, no q */
  append_case_d(tr, DT_F16, 1, 1, 2, false, 2, 256, 256);      /* GPT-J IPH 32 */
  append_case_d(tr, DT_BF16, 64, 0, 0, false, 0, 128, 128);    /* ot_kv_append, no q */
  append_case_d(tr, DT_BF16, 16, 0, 1, true, 0, 128, 64);      /* partial: vector kernel */
  /* the default choice (the variable unset) with 304 tokens: the warp kernel */
  env_restore(&w);
  w = env_set("OT_KV_APPEND_WARP", NULL);
  g_append_tag = " (304 tokens)";
  g_append_n1 = 300;
  append_case_k(tr, DT_BF16, 16, 0, 2, true, 2, 128, 128, 2);
  append_case_k(tr, DT_F16, 64, 1, 1, false, 0, 64, 64, 1);
  g_append_n1 = 37;
  g_append_tag = "";
  env_restore(&w);
}

/* CUDA: one instance of the split kernel forced (OT_PAGED_KERNEL=split and `name`=`value`;
 * case names prefixed by `prefix`), each call checked against the plan flags (set / clear,
 * paged_check_plan): the head_dim-128 cases (ragged lengths: partial last steps over
 * NaN-poisoned slots), windows (a left window's split start rounded down to 16 keys),
 * speculative / prefill tiles, forced splits and one split, batch 1 with the page ids loaded
 * with the tables, over-provisioned tables, back to back and kv ready (the early start). */
static void paged_mode_cases(test_run *tr, const char *prefix, const char *name,
                             const char *value, int flag_set, int flag_clear) {
  env_saved mode = env_set(name, value);
  env_saved split = env_set("OT_PAGED_KERNEL", "split");
  g_pmode = prefix;
  g_pflag_set = flag_set, g_pflag_clear = flag_clear;
  for (size_t i = 0; i < sizeof paged_cuda_cases / sizeof paged_cuda_cases[0]; i++)
    if (paged_cuda_cases[i].d == 128)
      paged_case(tr, &paged_cuda_cases[i], i % 2 ? DT_F16 : DT_BF16);
  static const size_t longs[] = {0, 2, 5, 6};
  for (size_t i = 0; i < sizeof longs / sizeof longs[0]; i++)
    paged_case(tr, &paged_cuda_long[longs[i]], DT_BF16);
  paged_case(tr, &paged_long[0], DT_F16);
  paged_case_spare(tr, &paged_cuda_overprov[0], DT_BF16, 1);
  paged_case_spare(tr, &paged_cuda_overprov[1], DT_F16, 100);
  paged_pair_case(tr, &paged_cuda_long[5], DT_BF16);
  paged_pair_case(tr, &paged_cuda_cases[0], DT_F16);
  static const size_t ready[] = {0, 1, 2, 3, 5, 7};
  for (size_t i = 0; i < sizeof ready / sizeof ready[0]; i++)
    paged_ready_case(tr, &paged_cuda_ready[ready[i]], i % 2 ? DT_F16 : DT_BF16);
  paged_ready_case(tr, &paged_cuda_cases[16], DT_F16); /* guess B4 equal */
  /* the switch: no guess, batch 1 only (named apart: "<prefix>guess=0 ...") */
  char gmode[64];
  env_saved guess = env_set("OT_PAGED_GUESS", "0");
  snprintf(gmode, sizeof gmode, "%sguess=0 ", prefix);
  g_pmode = gmode;
  paged_case(tr, &paged_cuda_cases[16], DT_BF16);
  setenv("OT_PAGED_GUESS", "b1", 1);
  snprintf(gmode, sizeof gmode, "%sguess=b1 ", prefix);
  paged_case(tr, &paged_cuda_cases[16], DT_BF16);
  paged_case(tr, &paged_cuda_long[5], DT_F16); /* batch 1: guessed */
  env_restore(&guess);
  g_pmode = prefix;
  env_saved splits = env_set("OT_PAGED_SPLITS", "7");
  paged_case(tr, &paged_cuda_cases[6], DT_BF16);  /* speculative 3 queries */
  for (size_t i = 16; i < 23; i++) paged_case(tr, &paged_cuda_cases[i], DT_BF16); /* guesses */
  paged_case(tr, &paged_cuda_cases[8], DT_F16);   /* chunked prefill 100 of 612 */
  paged_case(tr, &paged_cuda_cases[10], DT_BF16); /* window 50, softcap */
  setenv("OT_PAGED_SPLITS", "1", 1);
  paged_case(tr, &paged_cuda_cases[0], DT_BF16);
  paged_case(tr, &paged_cuda_long[6], DT_F16);
  env_restore(&splits);
  g_pmode = "";
  g_pflag_set = g_pflag_clear = 0;
  env_restore(&split);
  env_restore(&mode);
}

/* The aligned-page instance is the default where it can run (4 or 8 warps by the plan), so
 * the suite's other cases take it; these blocks add the general instance on the same pages
 * (OT_PAGED_ALIGNED=0) and the 8-warp CTAs forced (OT_PAGED_WARPS=8). */
static void paged_instance_cases(test_run *tr) {
  paged_mode_cases(tr, "general ", "OT_PAGED_ALIGNED", "0", 0, 16 | 32);
  paged_mode_cases(tr, "w8 ", "OT_PAGED_WARPS", "8", 16 | 32, 0);
}

/* The split kernel's one-round merge (OT_PAGED_MERGE=1, pa_merge1_kernel) on the instance
 * blocks' cases (paged_mode_cases: forced splits, batch 1 at the engine's heads, back to
 * back, kv ready) and on more splits than one round of 128 (D 128 pages of 16, D 64 pages
 * of 1), page sizes 1 and 256 at D 64, empty rows; each paged_case also run with both merges and
 * compared bit for bit (paged_merge_bits). */
static void paged_merge_cases(test_run *tr) {
  g_pmerge_bits = true;
  paged_mode_cases(tr, "merge1 ", "OT_PAGED_MERGE", "1", 0, 0);
  env_saved m = env_set("OT_PAGED_MERGE", "1");
  env_saved split = env_set("OT_PAGED_KERNEL", "split");
  g_pmode = "merge1 ";
  env_saved splits = env_set("OT_PAGED_SPLITS", "300");
  paged_case(tr, &paged_cuda_long[0], DT_BF16);
  setenv("OT_PAGED_SPLITS", "150", 1);
  paged_case(tr, &paged_cuda_long[1], DT_F16);
  setenv("OT_PAGED_SPLITS", "7", 1);
  paged_case(tr, &paged_cuda_cases[1], DT_BF16); /* page size 1 */
  paged_case(tr, &paged_cases[3], DT_F16);       /* D 64 pages of 256 */
  paged_case(tr, &paged_cuda_cases[12], DT_BF16); /* empty sequences: rows of lse -inf */
  paged_case(tr, &paged_cuda_cases[13], DT_F16);  /* causal sq > len: empty rows */
  env_restore(&splits);
  g_pmode = "";
  env_restore(&split);
  env_restore(&m);
  g_pmerge_bits = false;
}

/* CUDA: the kernels (attention both paths, forced splits, append, OT_DEBUG); the arena,
 * pool and tracker tests write blocks with the host and run on the CPU backend. */
static void run_memory_cuda(test_run *tr) {
  const DLDataType dts[3] = {DT_F32, DT_F16, DT_BF16};
  for (size_t i = 0; i < sizeof paged_cases / sizeof paged_cases[0]; i++)
    for (int t = 0; t < 3; t++)
      if (t == 0 || i % 3 == 0) paged_case(tr, &paged_cases[i], dts[t]);
  for (size_t i = 0; i < sizeof paged_cuda_cases / sizeof paged_cuda_cases[0]; i++) {
    paged_case(tr, &paged_cuda_cases[i], i % 2 ? DT_F16 : DT_BF16);
    if (i % 4 == 0) paged_case(tr, &paged_cuda_cases[i], DT_F32);
  }
  /* the split-KV merge with a forced count on multi-token tiles and windows */
  env_saved splits = env_set("OT_PAGED_SPLITS", "7");
  for (size_t i = 6; i < 12; i++) paged_case(tr, &paged_cuda_cases[i], DT_BF16);
  paged_case(tr, &paged_cuda_cases[1], DT_BF16); /* page size 1 */
  paged_case(tr, &paged_cuda_cases[5], DT_F16);  /* page size 3 */
  paged_case(tr, &paged_cuda_long[4], DT_F16);   /* page size 7, window, 2 tokens */
  /* more splits than the merge kernel's 4 warps x 32 take in one round (empty splits at
   * the end: chunks are >= 64 keys, multiples of 64), D 128 pages of 16 and D 64 pages of 1 */
  setenv("OT_PAGED_SPLITS", "300", 1);
  paged_case(tr, &paged_cuda_long[0], DT_BF16);
  setenv("OT_PAGED_SPLITS", "150", 1);
  paged_case(tr, &paged_cuda_long[1], DT_F16);
  env_restore(&splits);
  /* the main kernels launched without programmatic dependence (OT_PAGED_PDL=0) */
  env_saved nopdl = env_set("OT_PAGED_PDL", "0");
  paged_case(tr, &paged_cuda_cases[0], DT_BF16);
  paged_case(tr, &paged_cuda_cases[6], DT_F16);
  paged_case(tr, &paged_cuda_long[4], DT_BF16);
  env_restore(&nopdl);
  /* back to back: the split kernel's 32-split merge (64k), its 17-split one (1 x 2049 at
   * the engine's heads), then the stream kernel's cut units */
  paged_pair_case(tr, &paged_cuda_long[0], DT_BF16);
  paged_pair_case(tr, &paged_cuda_long[5], DT_BF16);
  env_saved kern4 = env_set("OT_PAGED_KERNEL", "stream");
  env_saved grid4 = env_set("OT_PAGED_STREAM_CTAS", "2");
  paged_pair_case(tr, &paged_cuda_cases[0], DT_BF16);
  env_restore(&grid4);
  env_restore(&kern4);
  for (size_t i = 0; i < sizeof paged_cuda_long / sizeof paged_cuda_long[0]; i++)
    paged_case(tr, &paged_cuda_long[i], i == 1 ? DT_F16 : DT_BF16);
  /* paged_kv_ready: the early start (the previous kernel appends the query tokens' rows)
   * of the split kernel (the stream kernel, which the short batches would get, ignores it) */
  env_saved splitk = env_set("OT_PAGED_KERNEL", "split");
  for (size_t i = 0; i < sizeof paged_cuda_ready / sizeof paged_cuda_ready[0]; i++)
    paged_ready_case(tr, &paged_cuda_ready[i], i % 2 ? DT_F16 : DT_BF16);
  env_restore(&splitk);
  /* ... with one split per sequence (the merge-free path), and without PDL */
  env_saved one = env_set("OT_PAGED_SPLITS", "1");
  paged_ready_case(tr, &paged_cuda_ready[2], DT_BF16);
  env_restore(&one);
  env_saved nopdl2 = env_set("OT_PAGED_PDL", "0");
  paged_ready_case(tr, &paged_cuda_ready[0], DT_F16);
  env_restore(&nopdl2);
  paged_case_spare(tr, &paged_cuda_overprov[0], DT_BF16, 1);
  paged_case_spare(tr, &paged_cuda_overprov[1], DT_F16, 100);
  paged_case_spare(tr, &paged_cuda_overprov[2], DT_BF16, 99);
  paged_case(tr, &paged_long[1], DT_BF16);
  /* the stream kernel on every head_dim-128 case (the others keep the split kernel), then
   * ragged batches past one 32-sequence window, forced small grids */
  env_saved kern = env_set("OT_PAGED_KERNEL", "stream");
  for (size_t i = 0; i < sizeof paged_cuda_cases / sizeof paged_cuda_cases[0]; i++)
    if (paged_cuda_cases[i].d == 128) paged_case(tr, &paged_cuda_cases[i], i % 2 ? DT_F16 : DT_BF16);
  paged_case(tr, &paged_cuda_long[0], DT_BF16);
  paged_case(tr, &paged_cuda_long[2], DT_F16);
  paged_case(tr, &paged_cuda_long[3], DT_BF16);
  paged_case(tr, &paged_long[0], DT_BF16);
  /* and the split kernel on the head_dim-128 cases that the default gives the stream one */
  setenv("OT_PAGED_KERNEL", "split", 1);
  for (size_t i = 0; i < sizeof paged_cuda_cases / sizeof paged_cuda_cases[0]; i++)
    if (paged_cuda_cases[i].d == 128) paged_case(tr, &paged_cuda_cases[i], i % 2 ? DT_BF16 : DT_F16);
  env_restore(&kern);
  paged_stream_case(tr, "stream B70 ragged GQA4 bs16", 70, 300, 3, 8, 2, 16, 0, DT_BF16, 11);
  paged_stream_case(tr, "stream B150 short GQA8 bs1, 1 CTA", 150, 20, 2, 8, 1, 1, 1, DT_F16, 12);
  paged_stream_case(tr, "stream B100 GQA4 bs64, 3 CTAs", 100, 700, 1, 16, 4, 64, 3, DT_BF16, 13);
  paged_stream_case(tr, "stream B33 spec 5 GQA2 bs7, 2 CTAs", 33, 90, 5, 4, 2, 7, 2, DT_BF16, 14);
  /* batch 33..64 (two sequences a lane in ps_kernel's prefix sums) */
  paged_stream_case(tr, "stream B64 spec 2 GQA4 bs16", 64, 400, 2, 8, 2, 16, 0, DT_BF16, 15);
  paged_stream_case(tr, "stream B48 GQA8 bs32, 5 CTAs", 48, 300, 1, 8, 1, 32, 5, DT_F16, 16);
  paged_stream_case(tr, "stream B63 GQA4 bs16, 40 CTAs", 63, 200, 1, 8, 2, 16, 40, DT_BF16, 17);
  env_saved kern3 = env_set("OT_PAGED_KERNEL", "stream");
  env_saved grid3 = env_set("OT_PAGED_STREAM_CTAS", "1");
  for (size_t i = 0; i < sizeof paged_stream_masks / sizeof paged_stream_masks[0]; i++)
    paged_case(tr, &paged_stream_masks[i], i % 2 ? DT_F16 : DT_BF16);
  env_restore(&grid3);
  env_restore(&kern3);
  /* the default's choice: 16 x 512 (128 units: one 8-warp split each) and 64 x 64 (512,
   * under two waves of 264 CTAs) the split kernel, 160 x 64 (1280 units) the stream kernel;
   * 1 x 2k and 4 x 2k (both plans merge splits) 4-warp CTAs */
  paged_auto_plan_case(tr, "cuda plan B16 x 512 Hq32 Hkv8 D128 bs16: split kernel, 8 warps", 16,
                       512, 1, 32, 0);
  paged_auto_plan_case(tr, "cuda plan B64 x 64 Hq32 Hkv8 D128 bs16: split kernel", 64, 64, 1, 0, 0);
  paged_auto_plan_case(tr, "cuda plan B160 x 64 Hq32 Hkv8 D128 bs16: stream kernel", 160, 64, 2,
                       0, 0);
  paged_auto_plan_case(tr, "cuda plan B1 x 2048 Hq32 Hkv8 D128 bs16: split kernel, 4 warps", 1,
                       2048, 1, 0, 32);
  paged_auto_plan_case(tr, "cuda plan B4 x 2048 Hq32 Hkv8 D128 bs16: split kernel, 4 warps", 4,
                       2048, 1, 0, 32);
  append_cases(tr);
  append_warp_cases(tr);
  append_case(tr, DT_BF16, 16, 0, true, false, false);
  paged_instance_cases(tr);
  paged_merge_cases(tr);
  paged_debug_case(tr, DT_BF16, 128);
  paged_debug_case(tr, DT_F32, 16);
  env_saved kern2 = env_set("OT_PAGED_KERNEL", "stream");
  paged_debug_case(tr, DT_F16, 128);
  env_restore(&kern2);
}

static void run_memory(test_run *tr) {
  if (tr->grad) return; /* no gradients here */
  if (tr->be->is_cuda) {
    run_memory_cuda(tr);
    return;
  }
  arena_bad_args(tr);
  arena_exhaustion(tr);
  arena_stress(tr, 4 << 20, 40000, 64 << 10, false);
  arena_stress(tr, 64 << 10, 20000, 3000, false);
  arena_stress(tr, 1 << 20, 20000, 20000, true);
  arena_streams(tr);
  arena_threads(tr);
  kv_bad_args(tr);
  kv_cow(tr);
  kv_property(tr, 1, 160, 1500);
  kv_property(tr, 4, 60, 1500);
  kv_property(tr, 16, 64, 1500);
  kv_property(tr, 3, 300, 800);
  paged_splits(tr);
  for (size_t i = 0; i < sizeof paged_cases / sizeof paged_cases[0]; i++)
    for (int t = 0; t < 3; t++) {
      const DLDataType dts[3] = {DT_F32, DT_F16, DT_BF16};
      if (t > 0 && i % 3 != 0) continue; /* every case in f32, every third in all dtypes */
      paged_case(tr, &paged_cases[i], dts[t]);
    }
  paged_case(tr, &paged_long[0], DT_BF16);
  paged_case(tr, &paged_long[1], DT_BF16);
  /* paged_kv_ready set: the CPU ignores it (the same setup as on CUDA: the query tokens'
   * rows stale until the ot_kv_append just before the first call) */
  paged_ready_case(tr, &paged_cuda_ready[2], DT_BF16);
  paged_ready_case(tr, &paged_cuda_ready[3], DT_F16);
  paged_bad_args(tr);
  append_cases(tr);
  append_warp_cases(tr); /* the CPU ignores the variable: the same checks of its op */
  e2e_case(tr, DT_F32, 16);
  e2e_case(tr, DT_BF16, 1);
  e2e_case(tr, DT_F16, 4);
  tracker_case(tr);
}

const test_suite suite_memory = {"memory", run_memory};
