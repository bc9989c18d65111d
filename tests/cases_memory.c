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

/* ---- the suite -------------------------------------------------------------------- */

static void run_memory(test_run *tr) {
  if (tr->be->is_cuda || tr->grad) return; /* host-written blocks; no gradients here */
  arena_bad_args(tr);
  arena_exhaustion(tr);
  arena_stress(tr, 4 << 20, 40000, 64 << 10, false);
  arena_stress(tr, 64 << 10, 20000, 3000, false);
  arena_stress(tr, 1 << 20, 20000, 20000, true);
  arena_streams(tr);
  arena_threads(tr);
}

const test_suite suite_memory = {"memory", run_memory};
