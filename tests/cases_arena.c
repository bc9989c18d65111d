/*
 * cases_arena.c -- the arena as the library's source of temporaries: cross-stream reuse
 * of freed blocks (the wait that orders the streams), the OOM message of the library's
 * own requests, and ot_context_set_arena (CUDA: ops' scratch / workspace from the arena,
 * given back when the op returns, exhaustion that disturbs nothing).
 *
 * The stream rules run on the CPU backend with stream ordering turned on and a recording
 * wait hook: a random stress checks, with vector clocks, that every byte a stream receives
 * was last freed on a stream it is ordered after. The context cases need CUDA.
 */
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifdef OT_TEST_CUDA
#include <cuda_runtime.h>
#endif

#include "harness.h"

/* Private helpers of the library (src/core/arena.h), reachable through the static library. */
typedef ot_status (*ot_arena_wait_fn)(const char *op, DLDevice device, void *waiter,
                                      void *producer);
void ot_arena_set_stream_ordered(ot_arena *arena, bool on);
void ot_arena_set_wait(ot_arena *arena, ot_arena_wait_fn wait);
uint64_t ot_arena_num_waits(ot_arena *arena);
bool ot_arena_check(ot_arena *arena, char *msg, size_t msg_size);
ot_status ot_error(ot_status status, const char *op, const char *fmt, ...);
ot_status ot_arena_alloc_for(const char *op, const char *what, ot_arena *arena, size_t bytes,
                             void *stream, ot_memory_tag tag, void **ptr);
ot_status ot_arena_try_alloc_for(const char *op, const char *what, ot_arena *arena,
                                 size_t bytes, void *stream, ot_memory_tag tag, void **ptr);

static bool consistent(test_run *tr, ot_arena *a, const char *when) {
  char msg[256];
  if (ot_arena_check(a, msg, sizeof msg)) return true;
  tr_fail(tr, "%s: arena structure: %s", when, msg);
  return false;
}

/* ---- the recording wait: streams are small integers 1..NS, vector clocks ------------- */

enum { NS = 4 };
static uint64_t vclock[NS + 1][NS + 1]; /* vclock[t][s]: how far t is ordered after s */
static int nwait_calls;
static void *last_waiter, *last_producer; /* the handles of the last wait call */
static bool wait_fails;
static int wait_refused_from; /* refuse the n-th wait call and later ones (0: none) */

static int stream_no(void *s) { return s ? (int)(uintptr_t)s : 1; } /* NULL: legacy = 1 */

static ot_status recording_wait(const char *op, DLDevice device, void *waiter, void *producer) {
  (void)device;
  nwait_calls++;
  last_waiter = waiter, last_producer = producer;
  if (wait_fails || (wait_refused_from && nwait_calls >= wait_refused_from))
    return ot_error(OT_ERR_BACKEND, op, "test: wait refused");
  int t = stream_no(waiter), s = stream_no(producer);
  if (t < 1 || t > NS || s < 1 || s > NS) return ot_error(OT_ERR_INTERNAL, op, "test: stream");
  for (int i = 1; i <= NS; i++)
    if (vclock[s][i] > vclock[t][i]) vclock[t][i] = vclock[s][i];
  return OT_OK;
}

static void clocks_reset(void) {
  memset(vclock, 0, sizeof vclock);
  nwait_calls = 0;
  last_waiter = last_producer = NULL;
  wait_fails = false;
  wait_refused_from = 0;
}

#define S(n) ((void *)(uintptr_t)(n))

/* A 4096-byte stream-ordered arena, the fake clocks reset: false (the failure recorded) when
 * it cannot be created. */
static bool ordered_arena(test_run *tr, ot_arena **a) {
  clocks_reset();
  if (!tr_ok(tr, ot_arena_create(tr->be->ctx, 4096, a), "create")) return false;
  ot_arena_set_stream_ordered(*a, true);
  return true;
}

/* The rules one by one: same stream reuses at once without a wait; another stream takes
 * the blocks of one or several streams only when nothing else fits, after one wait per
 * stream; a request that would not fit even then fails without any wait and disturbs
 * nothing; a refused wait (graph capture) is an OOM that changes nothing; NULL is the
 * legacy stream, not "any stream". */
static void arena_cross_stream_rules(test_run *tr) {
  if (!tr_begin(tr, "arena cross-stream reuse: waits, retagging, refusals")) return;
  ot_arena *a = NULL;
  if (!ordered_arena(tr, &a)) goto out;
  ot_arena_set_wait(a, recording_wait);
  void *p = NULL, *q = NULL, *h1 = NULL, *h2 = NULL;
  tr_ok(tr, ot_arena_alloc(a, 4096, S(2), &p), "all on s2");
  tr_ok(tr, ot_arena_free(a, p, S(2)), "free on s2");
  if (tr_ok(tr, ot_arena_alloc(a, 1024, S(2), &q), "same stream") && nwait_calls != 0)
    tr_fail(tr, "same-stream reuse waited (%d waits)", nwait_calls);
  tr_ok(tr, ot_arena_free(a, q, S(2)), "free");
  /* s3 takes s2's block after one wait s3 <- s2 */
  if (tr_ok(tr, ot_arena_alloc(a, 1024, S(3), &q), "s3 takes s2's block")) {
    if (nwait_calls != 1 || ot_arena_num_waits(a) != 1)
      tr_fail(tr, "%d wait calls (counter %llu), expected 1", nwait_calls,
              (unsigned long long)ot_arena_num_waits(a));
    tr_ok(tr, ot_arena_free(a, q, S(3)), "free on s3");
  }
  /* the whole arena is s3's now: s3 reuses it without another wait */
  if (tr_ok(tr, ot_arena_alloc(a, 4096, S(3), &q), "s3 again") && nwait_calls != 1)
    tr_fail(tr, "the retagged blocks were not s3's (%d waits)", nwait_calls);
  tr_ok(tr, ot_arena_free(a, q, S(3)), "free");
  /* halves freed on s2 and s3 (kept apart), a whole-arena request on s4: two waits */
  tr_ok(tr, ot_arena_alloc(a, 2048, S(3), &h1), "h1");
  tr_ok(tr, ot_arena_alloc(a, 2048, S(3), &h2), "h2");
  tr_ok(tr, ot_arena_free(a, h1, S(2)), "h1 on s2");
  tr_ok(tr, ot_arena_free(a, h2, S(3)), "h2 on s3");
  nwait_calls = 0;
  if (tr_ok(tr, ot_arena_alloc(a, 4096, S(4), &q), "s4 takes both halves")) {
    if (nwait_calls != 2) tr_fail(tr, "%d waits, expected 2 (s2 and s3)", nwait_calls);
    tr_ok(tr, ot_arena_free(a, q, S(4)), "free");
  }
  consistent(tr, a, "after adoption");
  /* a live block stays intact through requests that cannot fit */
  unsigned char *live = NULL;
  tr_ok(tr, ot_arena_alloc(a, 1024, S(4), (void **)&live), "live block");
  for (int i = 0; i < 1024; i++) live[i] = (unsigned char)(i * 7 + 3);
  nwait_calls = 0;
  ot_arena_stats before, after;
  ot_arena_get_stats(a, &before);
  tr_expect_error(tr, ot_arena_alloc(a, 4000, S(2), &q), OT_ERR_OOM, "4000 bytes (4096 rounded)",
                  "largest free block is 3072 bytes");
  if (nwait_calls != 0) tr_fail(tr, "a request that cannot fit waited (%d)", nwait_calls);
  /* a refused wait: OOM, the blocks stay s4's (s4 still reuses them without waiting) */
  wait_fails = true;
  tr_expect_error(tr, ot_arena_alloc(a, 2048, S(1), &q), OT_ERR_OOM, "cannot allocate 2048",
                  "ot_arena_synchronize");
  wait_fails = false;
  nwait_calls = 0;
  if (tr_ok(tr, ot_arena_alloc(a, 3072, S(4), &q), "s4 after the refusal")) {
    if (nwait_calls) tr_fail(tr, "a refused wait retagged blocks");
    tr_ok(tr, ot_arena_free(a, q, S(4)), "free");
  }
  ot_arena_get_stats(a, &after);
  if (after.live_blocks != before.live_blocks) tr_fail(tr, "live blocks changed by failures");
  for (int i = 0; i < 1024; i++)
    if (live[i] != (unsigned char)(i * 7 + 3)) {
      tr_fail(tr, "the live block was disturbed at byte %d", i);
      break;
    }
  tr_ok(tr, ot_arena_free(a, live, S(4)), "free live");
  /* a block freed on a stream does not taint its never-used neighbour: another stream
   * takes the untagged rest without waiting */
  tr_ok(tr, ot_arena_synchronize(a), "synchronize");
  tr_ok(tr, ot_arena_alloc(a, 1024, S(2), &p), "1024 on s2");
  tr_ok(tr, ot_arena_free(a, p, S(2)), "free on s2");
  nwait_calls = 0;
  if (tr_ok(tr, ot_arena_alloc(a, 3072, S(3), &q), "s3 takes the untagged rest")) {
    if (nwait_calls != 0) tr_fail(tr, "s3 waited for s2 to take never-used memory");
    if ((char *)q != (char *)p + 1024) tr_fail(tr, "s3 did not get the untagged rest");
    tr_ok(tr, ot_arena_free(a, q, S(3)), "free");
  }
  /* NULL is the legacy stream: freed there, another stream must wait for it */
  tr_ok(tr, ot_arena_synchronize(a), "synchronize");
  tr_ok(tr, ot_arena_alloc(a, 4096, NULL, &p), "on NULL");
  tr_ok(tr, ot_arena_free(a, p, NULL), "free on NULL");
  nwait_calls = 0;
  if (tr_ok(tr, ot_arena_alloc(a, 4096, S(3), &q), "s3 after NULL")) {
    if (nwait_calls != 1) tr_fail(tr, "block freed on the legacy stream reused without a wait");
    tr_ok(tr, ot_arena_free(a, q, S(3)), "free");
  }
  consistent(tr, a, "end");
out:
  ot_arena_destroy(a);
  tr_end(tr);
}

/* Random allocations / frees on 4 streams with the recording wait. Every 256-byte unit
 * remembers the stream and clock of its last free; a block handed to stream t must only
 * contain units whose last free t is ordered after (vclock[t][s] >= that clock). Patterns
 * in the live blocks catch overlaps. */
static void arena_cross_stream_stress(test_run *tr, int ops) {
  if (!tr_begin(tr, "arena cross-stream stress, %d ops on %d streams", ops, NS)) return;
  enum { RESERVE = 256 << 10, UNITS = RESERVE / 256, MAXLIVE = 512 };
  rng r = tr_rng(tr);
  ot_arena *a = NULL;
  clocks_reset();
  for (int s = 1; s <= NS; s++) vclock[s][s] = 1;
  int *free_stream = calloc(UNITS, sizeof *free_stream);
  uint64_t *free_clock = calloc(UNITS, sizeof *free_clock);
  struct {
    unsigned char *p;
    size_t n;
    int stream;
    uint64_t tag;
  } live[MAXLIVE];
  int nlive = 0, nooms = 0, reuses = 0;
  if (!tr_ok(tr, ot_arena_create(tr->be->ctx, RESERVE, &a), "create")) goto out;
  ot_arena_set_stream_ordered(a, true);
  ot_arena_set_wait(a, recording_wait);
  unsigned char *base = NULL;
  for (int op = 0; op < ops && !tr->case_failed; op++) {
    int s = (int)rng_int(&r, 1, NS);
    vclock[s][s]++; /* work enqueued on s */
    if (nlive < MAXLIVE && (nlive == 0 || rng_uniform(&r, 0, 1) < 0.55)) {
      size_t n = (size_t)exp(rng_uniform(&r, 0, log(24000.0)));
      void *p = NULL;
      ot_status st = ot_arena_alloc(a, n, S(s), &p);
      if (st == OT_ERR_OOM) {
        nooms++;
        continue;
      }
      if (!tr_ok(tr, st, "alloc")) break;
      if (!base) base = (unsigned char *)p; /* the first block starts at offset 0 */
      size_t u0 = (size_t)((unsigned char *)p - base) / 256, nu = (n + 255) / 256;
      for (size_t u = u0; u < u0 + nu && u < UNITS; u++) {
        int fs = free_stream[u];
        if (!fs) continue;
        if (fs != s) reuses++;
        if (vclock[s][fs] < free_clock[u]) {
          tr_fail(tr, "unit %zu freed on stream %d at %llu, handed to stream %d ordered only "
                  "up to %llu", u, fs, (unsigned long long)free_clock[u], s,
                  (unsigned long long)vclock[s][fs]);
          break;
        }
      }
      live[nlive].p = p, live[nlive].n = n, live[nlive].stream = s, live[nlive].tag = (uint64_t)op;
      for (size_t i = 0; i < n; i++) live[nlive].p[i] = (unsigned char)(op * 31 + i);
      nlive++;
    } else {
      int i = (int)rng_int(&r, 0, nlive - 1);
      for (size_t j = 0; j < live[i].n; j++)
        if (live[i].p[j] != (unsigned char)(live[i].tag * 31 + j)) {
          tr_fail(tr, "live block overwritten (two live blocks overlap)");
          break;
        }
      /* freed on the stream of its last use: s, after the block's stream handed it over */
      if (live[i].stream != s) recording_wait("test", (DLDevice){kDLCPU, 0}, S(s), S(live[i].stream));
      if (!tr_ok(tr, ot_arena_free(a, live[i].p, S(s)), "free")) break;
      size_t u0 = (size_t)(live[i].p - base) / 256, nu = (live[i].n + 255) / 256;
      for (size_t u = u0; u < u0 + nu && u < UNITS; u++) free_stream[u] = s, free_clock[u] = vclock[s][s];
      live[i] = live[--nlive];
    }
    if (op % 1000 == 999 && !consistent(tr, a, "stress")) break;
  }
  if (reuses == 0) tr_fail(tr, "no cross-stream reuse happened: the test exercised nothing");
  if (tr->verbose)
    printf("     %d OOMs, %d units reused across streams, %llu waits\n", nooms, reuses,
           (unsigned long long)ot_arena_num_waits(a));
  for (int i = 0; i < nlive; i++) ot_arena_free(a, live[i].p, S(live[i].stream));
  tr_ok(tr, ot_arena_synchronize(a), "synchronize");
  ot_arena_stats st;
  ot_arena_get_stats(a, &st);
  if (st.free_blocks != 1 || st.in_use != 0) tr_fail(tr, "not one free block at the end");
out:
  free(free_stream), free(free_clock);
  ot_arena_destroy(a);
  tr_end(tr);
}

/* A stream's freed block and its never-used (untagged) neighbour stay apart (tags differ),
 * yet together they serve a request of that stream, or of another one after its wait: a
 * request that fits the free run is no OOM. Without a wait hook (host arenas) the same
 * stream still may, another stream may not. */
static void arena_tagged_and_untagged_run(test_run *tr) {
  if (!tr_begin(tr, "arena: a request over a stream's block and the untagged rest")) return;
  ot_arena *a = NULL;
  void *p = NULL, *q = NULL;
  if (!ordered_arena(tr, &a)) goto out;
  tr_ok(tr, ot_arena_alloc(a, 1024, S(2), &p), "1024 on s2");
  tr_ok(tr, ot_arena_free(a, p, S(2)), "free on s2");
  if (tr_ok(tr, ot_arena_alloc(a, 4096, S(2), &q), "s2 takes all, no wait hook")) {
    if (q != p) tr_fail(tr, "the run does not start at the freed block");
    tr_ok(tr, ot_arena_free(a, q, S(2)), "free");
  }
  consistent(tr, a, "same stream");
  /* the never-used rest, made apart again; s3 cannot wait without a hook */
  tr_ok(tr, ot_arena_synchronize(a), "synchronize");
  tr_ok(tr, ot_arena_alloc(a, 1024, S(2), &p), "1024 on s2");
  tr_ok(tr, ot_arena_free(a, p, S(2)), "free on s2");
  tr_expect_error(tr, ot_arena_alloc(a, 4096, S(3), &q), OT_ERR_OOM, "cannot allocate 4096",
                  "ot_arena_synchronize");
  ot_arena_set_wait(a, recording_wait);
  if (tr_ok(tr, ot_arena_alloc(a, 4096, S(3), &q), "s3 takes all after one wait")) {
    if (nwait_calls != 1) tr_fail(tr, "%d waits, expected 1", nwait_calls);
    tr_ok(tr, ot_arena_free(a, q, S(3)), "free");
  }
  consistent(tr, a, "other stream");
  /* [s4][s2][s3][live]: s4 asks for 3072, the wait for s2 succeeds, the one for s3 is
   * refused: OOM, and s2's block, now s4's, is merged with s4's own */
  tr_ok(tr, ot_arena_synchronize(a), "synchronize");
  void *b4[4] = {NULL, NULL, NULL, NULL};
  for (int i = 0; i < 4; i++) tr_ok(tr, ot_arena_alloc(a, 1024, S(4), &b4[i]), "quarter");
  tr_ok(tr, ot_arena_free(a, b4[0], S(4)), "free on s4");
  tr_ok(tr, ot_arena_free(a, b4[1], S(2)), "free on s2");
  tr_ok(tr, ot_arena_free(a, b4[2], S(3)), "free on s3");
  nwait_calls = 0;
  wait_refused_from = 2;
  tr_expect_error(tr, ot_arena_alloc(a, 3072, S(4), &q), OT_ERR_OOM, "cannot allocate 3072", NULL);
  wait_refused_from = 0;
  consistent(tr, a, "a refused second wait");
  if (tr_ok(tr, ot_arena_alloc(a, 2048, S(4), &q), "s4 reuses the adopted block")) {
    if (nwait_calls != 2) tr_fail(tr, "%d wait calls, expected 2", nwait_calls);
    if (q != b4[0]) tr_fail(tr, "s4 did not get its own and the adopted block");
    tr_ok(tr, ot_arena_free(a, q, S(4)), "free");
  }
  tr_ok(tr, ot_arena_free(a, b4[3], S(4)), "free");
out:
  ot_arena_destroy(a);
  tr_end(tr);
}

/* Adoption waits only for the streams whose blocks the chosen run holds: [s2 free][live]
 * [s3 free] and a request on s4 that fits s3's block waits for s3 alone, and s2's block
 * stays s2's (s2 reuses it without a wait). */
static void arena_adoption_waits_for_the_run(test_run *tr) {
  if (!tr_begin(tr, "arena cross-stream reuse: waits only for the chosen run's streams")) return;
  ot_arena *a = NULL;
  void *b[3] = {NULL, NULL, NULL}, *q = NULL;
  if (!ordered_arena(tr, &a)) goto out;
  ot_arena_set_wait(a, recording_wait);
  tr_ok(tr, ot_arena_alloc(a, 1024, S(2), &b[0]), "1024");
  tr_ok(tr, ot_arena_alloc(a, 1024, S(2), &b[1]), "1024 live");
  tr_ok(tr, ot_arena_alloc(a, 2048, S(3), &b[2]), "2048");
  tr_ok(tr, ot_arena_free(a, b[0], S(2)), "free on s2");
  tr_ok(tr, ot_arena_free(a, b[2], S(3)), "free on s3");
  if (tr_ok(tr, ot_arena_alloc(a, 2048, S(4), &q), "s4 takes s3's block")) {
    if (nwait_calls != 1 || last_producer != S(3) || last_waiter != S(4))
      tr_fail(tr, "%d waits (the last: %p after %p), expected one: s4 after s3", nwait_calls,
              last_waiter, last_producer);
    if (q != b[2]) tr_fail(tr, "s4 did not get s3's block");
    tr_ok(tr, ot_arena_free(a, q, S(4)), "free on s4");
  }
  nwait_calls = 0;
  if (tr_ok(tr, ot_arena_alloc(a, 1024, S(2), &q), "s2 reuses its block")) {
    if (nwait_calls != 0) tr_fail(tr, "s2's block was retagged: s2 waited (%d)", nwait_calls);
    if (q != b[0]) tr_fail(tr, "s2 did not get its own block back");
    tr_ok(tr, ot_arena_free(a, q, S(2)), "free");
  }
  tr_ok(tr, ot_arena_free(a, b[1], S(2)), "free live");
  consistent(tr, a, "end");
out:
  ot_arena_destroy(a);
  tr_end(tr);
}

/* cudaStreamPerThread's handle (2) is a different stream on every host thread. */
#define PER_THREAD S(2)

typedef struct per_thread_job {
  ot_arena *a;
  size_t bytes;
  void *stream;
  bool free_after; /* free the block on the same stream before the thread ends */
  ot_status st;
  void *p;
  int waits;
} per_thread_job;

static void *per_thread_run(void *arg) {
  per_thread_job *j = (per_thread_job *)arg;
  int w0 = nwait_calls;
  j->p = NULL;
  j->st = ot_arena_alloc(j->a, j->bytes, j->stream, &j->p);
  if (j->st == OT_OK && j->free_after) j->st = ot_arena_free(j->a, j->p, j->stream);
  j->waits = nwait_calls - w0;
  return NULL;
}

static bool run_on_thread(test_run *tr, per_thread_job *j) {
  pthread_t th;
  if (pthread_create(&th, NULL, per_thread_run, j) != 0) {
    tr_fail(tr, "pthread_create");
    return false;
  }
  pthread_join(th, NULL);
  return true;
}

/* A block freed on the per-thread stream of one host thread: that thread reuses it at
 * once, and from that thread another stream takes it after a wait for handle 2 (its
 * stream there); another thread -- also one started after the first ended -- neither
 * reuses it at once on its own per-thread stream nor can wait for the first thread's
 * (handle 2 names its own), on any stream: OOM until ot_arena_synchronize. */
static void arena_per_thread_stream(test_run *tr) {
  if (!tr_begin(tr, "arena: cudaStreamPerThread is one stream per host thread")) return;
  ot_arena *a = NULL;
  void *p = NULL, *q = NULL;
  if (!ordered_arena(tr, &a)) goto out;
  ot_arena_set_wait(a, recording_wait);
  tr_ok(tr, ot_arena_alloc(a, 4096, PER_THREAD, &p), "all on this thread's stream");
  tr_ok(tr, ot_arena_free(a, p, PER_THREAD), "free there");
  per_thread_job j = {a, 1024, PER_THREAD, false, OT_OK, NULL, 0};
  if (run_on_thread(tr, &j) && (j.st != OT_ERR_OOM || j.waits != 0))
    tr_fail(tr, "another thread's per-thread stream: %s with %d waits, expected an OOM "
            "without waiting", ot_status_string(j.st), j.waits);
  j = (per_thread_job){a, 1024, S(3), false, OT_OK, NULL, 0};
  if (run_on_thread(tr, &j) && (j.st != OT_ERR_OOM || j.waits != 0))
    tr_fail(tr, "stream 3 on another thread: %s with %d waits, expected an OOM (it cannot "
            "wait for this thread's per-thread stream)", ot_status_string(j.st), j.waits);
  nwait_calls = 0;
  if (tr_ok(tr, ot_arena_alloc(a, 1024, PER_THREAD, &q), "this thread reuses it")) {
    if (nwait_calls != 0) tr_fail(tr, "same thread, same stream: %d waits", nwait_calls);
    tr_ok(tr, ot_arena_free(a, q, PER_THREAD), "free");
  }
  if (tr_ok(tr, ot_arena_alloc(a, 4096, S(3), &q), "stream 3 on this thread")) {
    if (nwait_calls != 1 || last_waiter != S(3) || last_producer != PER_THREAD)
      tr_fail(tr, "%d waits (the last: %p after %p), expected one: 3 after 2", nwait_calls,
              last_waiter, last_producer);
    tr_ok(tr, ot_arena_free(a, q, S(3)), "free");
  }
  /* a thread frees on its per-thread stream and ends; the next thread's is another stream */
  tr_ok(tr, ot_arena_synchronize(a), "synchronize");
  j = (per_thread_job){a, 4096, PER_THREAD, true, OT_OK, NULL, 0};
  if (run_on_thread(tr, &j)) tr_ok(tr, j.st, "a thread takes all and frees it on its stream");
  for (int i = 0; i < 3; i++) {
    j = (per_thread_job){a, 1024, PER_THREAD, false, OT_OK, NULL, 0};
    if (run_on_thread(tr, &j) && j.st != OT_ERR_OOM) {
      tr_fail(tr, "thread %d after it: %s, expected an OOM (a new thread's stream)", i,
              ot_status_string(j.st));
      if (j.st == OT_OK) ot_arena_free(a, j.p, S(3));
      break;
    }
  }
  tr_ok(tr, ot_arena_synchronize(a), "synchronize");
  j = (per_thread_job){a, 4096, PER_THREAD, true, OT_OK, NULL, 0};
  if (run_on_thread(tr, &j)) tr_ok(tr, j.st, "after ot_arena_synchronize");
  consistent(tr, a, "end");
out:
  ot_arena_destroy(a);
  tr_end(tr);
}

/* The library's own requests (ot_arena_alloc_for): the message names the op and what it
 * wanted, with the request and the largest free block; the tracker counts the block under
 * the op's name and the workspace tag. */
static void arena_library_request(test_run *tr) {
  if (!tr_begin(tr, "arena: library temporaries (message, tracker)")) return;
  ot_arena *a = NULL;
  const char *op = "arena test: an op";
  if (!tr_ok(tr, ot_arena_create(tr->be->ctx, 8192, &a), "create")) goto out;
  ot_memory_counter ws0, o0;
  ot_memory_tag_counter(OT_MEMORY_WORKSPACE, &ws0);
  ot_memory_op_counter(op, &o0);
  void *p = NULL, *q = (void *)(uintptr_t)0x77;
  tr_ok(tr, ot_arena_alloc_for(op, "scratch", a, 5000, NULL, OT_MEMORY_WORKSPACE, &p), "alloc");
  ot_memory_counter ws1, o1;
  ot_memory_tag_counter(OT_MEMORY_WORKSPACE, &ws1);
  ot_memory_op_counter(op, &o1);
  if (ws1.current - ws0.current != 5120 || o1.current - o0.current != 5120 ||
      o1.allocs != o0.allocs + 1)
    tr_fail(tr, "tracker: workspace +%zu, op +%zu (expected 5120)", ws1.current - ws0.current,
            o1.current - o0.current);
  tr_expect_error(tr, ot_arena_alloc_for(op, "scratch", a, 4000, NULL, OT_MEMORY_WORKSPACE, &q),
                  OT_ERR_OOM, "arena test: an op: scratch: cannot allocate 4000 bytes (4096 rounded)",
                  "the largest free block is 3072 bytes");
  if (q != (void *)(uintptr_t)0x77) tr_fail(tr, "ptr written by a failing request");
  tr_ok(tr, ot_arena_free(a, p, NULL), "free");
  ot_memory_op_counter(op, &o1);
  if (o1.current != o0.current || o1.frees != o0.frees + 1) tr_fail(tr, "op counter not back");
out:
  ot_arena_destroy(a);
  tr_end(tr);
}

/* The quiet request (ot_arena_try_alloc_for, for callers with a fallback): a block that
 * fits is a usable live block, counted like any other; one that does not fit returns
 * OT_ERR_OOM with *ptr and ot_last_error() untouched (a known message set before it must
 * survive); bad arguments are still recorded. */
static void arena_library_try(test_run *tr) {
  if (!tr_begin(tr, "arena: library temporaries, quiet request (ot_arena_try_alloc_for)")) return;
  ot_arena *a = NULL;
  const char *op = "arena test: a try";
  static const char known[] = "arena test: sentinel: a known earlier error";
  if (!tr_ok(tr, ot_arena_create(tr->be->ctx, 8192, &a), "create")) goto out;
  ot_memory_counter ws0, ws1;
  ot_memory_tag_counter(OT_MEMORY_WORKSPACE, &ws0);
  ot_error(OT_ERR_INVALID_ARGUMENT, "arena test", "sentinel: a known earlier error");
  void *p = NULL, *q = (void *)(uintptr_t)0x77;
  if (!tr_ok(tr, ot_arena_try_alloc_for(op, "scratch", a, 5000, NULL, OT_MEMORY_WORKSPACE, &p),
             "try that fits"))
    goto out;
  if (!p) {
    tr_fail(tr, "try that fits: OT_OK with a NULL block");
    goto out;
  }
  unsigned char *u = (unsigned char *)p;
  for (int i = 0; i < 5000; i++) u[i] = (unsigned char)(i * 7 + 3);
  for (int i = 0; i < 5000; i++)
    if (u[i] != (unsigned char)(i * 7 + 3)) {
      tr_fail(tr, "try that fits: byte %d of the block did not hold its value", i);
      break;
    }
  ot_memory_tag_counter(OT_MEMORY_WORKSPACE, &ws1);
  if (ws1.current - ws0.current != 5120)
    tr_fail(tr, "try that fits: tracker workspace +%zu (expected 5120)", ws1.current - ws0.current);
  ot_arena_stats s0, s1;
  tr_ok(tr, ot_arena_get_stats(a, &s0), "stats");
  if (s0.in_use != 5120 || s0.live_blocks != 1 || s0.num_allocs != 1)
    tr_fail(tr, "try that fits: in_use %zu, live %llu, allocs %llu (expected 5120, 1, 1)",
            s0.in_use, (unsigned long long)s0.live_blocks, (unsigned long long)s0.num_allocs);
  const ot_status st = ot_arena_try_alloc_for(op, "scratch", a, 4000, NULL, OT_MEMORY_WORKSPACE, &q);
  if (st != OT_ERR_OOM) tr_fail(tr, "try that does not fit: status %d, expected OT_ERR_OOM", (int)st);
  if (q != (void *)(uintptr_t)0x77) tr_fail(tr, "try that does not fit: ptr written");
  if (strcmp(ot_last_error(), known))
    tr_fail(tr, "try that does not fit: ot_last_error() changed to '%s'", ot_last_error());
  tr_ok(tr, ot_arena_get_stats(a, &s1), "stats");
  if (s1.in_use != s0.in_use || s1.live_blocks != s0.live_blocks || s1.num_allocs != s0.num_allocs)
    tr_fail(tr, "try that does not fit: the arena changed");
  /* num_failed counts the failures a caller sees, not a try its caller falls back from
   * (the Hopper backward's scratch under OT_ATTN_IMPL=sm90 tries, then asks again). */
  if (s1.num_failed != s0.num_failed)
    tr_fail(tr, "try that does not fit: num_failed %llu -> %llu (a quiet try must not count)",
            (unsigned long long)s0.num_failed, (unsigned long long)s1.num_failed);
  tr_expect_error(tr, ot_arena_alloc_for(op, "scratch", a, 4000, NULL, OT_MEMORY_WORKSPACE, &q),
                  OT_ERR_OOM, "arena test: a try: scratch: cannot allocate 4000 bytes", NULL);
  tr_ok(tr, ot_arena_get_stats(a, &s1), "stats");
  if (s1.num_failed != s0.num_failed + 1)
    tr_fail(tr, "reporting request that does not fit: num_failed %llu -> %llu (expected +1)",
            (unsigned long long)s0.num_failed, (unsigned long long)s1.num_failed);
  tr_expect_error(tr, ot_arena_try_alloc_for(op, "scratch", a, 0, NULL, OT_MEMORY_WORKSPACE, &q),
                  OT_ERR_INVALID_ARGUMENT, "arena test: a try: bytes: 0", NULL);
  tr_ok(tr, ot_arena_free(a, p, NULL), "free the tried block");
  consistent(tr, a, "after the tries");
out:
  ot_arena_destroy(a);
  tr_end(tr);
}

static void context_arena_bad_args(test_run *tr) {
  if (!tr_begin(tr, "ot_context_set_arena bad arguments")) return;
  ot_arena *a = NULL;
  tr_expect_error(tr, ot_context_set_arena(NULL, NULL), OT_ERR_INVALID_ARGUMENT,
                  "ot_context_set_arena: ctx", NULL);
  if (!tr->be->is_cuda) {
    /* a host arena attaches and detaches (the CPU cases below use it) */
    if (tr_ok(tr, ot_arena_create(tr->be->ctx, 4096, &a), "arena")) {
      tr_ok(tr, ot_context_set_arena(tr->be->ctx, a), "attach a host arena");
      tr_ok(tr, ot_context_set_arena(tr->be->ctx, NULL), "detach");
    }
  } else {
    ot_context *cpu = NULL;
    if (tr_ok(tr, ot_context_create(NULL, &cpu), "cpu context") &&
        tr_ok(tr, ot_arena_create(cpu, 4096, &a), "host arena"))
      tr_expect_error(tr, ot_context_set_arena(tr->be->ctx, a), OT_ERR_INVALID_ARGUMENT,
                      "ot_context_set_arena: arena: reserved on host device 0",
                      "CUDA device 0");
    /* and a device arena on a CPU context */
    ot_arena *dev = NULL;
    if (cpu && tr_ok(tr, ot_arena_create(tr->be->ctx, 4096, &dev), "device arena"))
      tr_expect_error(tr, ot_context_set_arena(cpu, dev), OT_ERR_INVALID_ARGUMENT,
                      "ot_context_set_arena: arena: reserved on CUDA device 0",
                      "the context runs on the CPU");
    ot_arena_destroy(dev);
    ot_context_destroy(cpu);
  }
  ot_arena_destroy(a);
  tr_end(tr);
}

#ifdef OT_TEST_CUDA
/* CUDA: scratch and workspace through an arena. Attach (the cuBLASLt workspace is taken
 * at once), run ops that need temporaries -- cross-entropy (row losses), attention forward
 * that splits the keys (partials), a linear (cuBLASLt) -- and check: results equal those
 * of the same call without the arena, every temporary is given back when the op returns
 * (arena in_use = the workspace only, op counters back to 0), the tracker saw them under
 * the op's name; an arena too small for the workspace refuses to attach (nothing changes);
 * exhaustion in an op: OT_ERR_OOM naming op / size / largest block, output unwritten, a
 * live block of the arena intact; detach gives everything back. */
static void context_arena_cuda(test_run *tr) {
  if (!tr_begin(tr, "context arena: ops' scratch from the arena (CUDA)")) return;
  ot_context *ctx = tr->be->ctx;
  rng r = tr_rng(tr);
  ot_arena *a = NULL, *tiny = NULL, *small = NULL;
  tbuf *lg = NULL, *lb = NULL, *loss = NULL, *loss2 = NULL, *q = NULL, *k = NULL, *v = NULL,
       *o1 = NULL, *o2 = NULL, *x = NULL, *w = NULL, *y1 = NULL, *y2 = NULL;
  unsigned char *host = NULL;
  const size_t lt = (size_t)32 << 20;
  /* cross-entropy, mean: a temporary of N floats */
  const int64_t N = 4096, V = 64;
  lg = tb_new(tr->be, DT_F32, 2, (int64_t[]){N, V});
  lb = tb_new(tr->be, DT_I64, 1, (int64_t[]){N});
  loss = tb_new(tr->be, DT_F32, 1, (int64_t[]){1});
  loss2 = tb_new(tr->be, DT_F32, 1, (int64_t[]){1});
  tb_fill_uniform(lg, &r, -3, 3);
  for (int64_t i = 0; i < N; i++) tb_set(lb, i, (double)rng_int(&r, 0, V - 1));
  /* attention: 1 sequence, 2 heads, 16 queries, 4096 keys: too few blocks, so split-KV */
  /* D 80: the portable kernel (the Hopper one takes 64 / 96 / 128 / 256 and does not split) */
  const int64_t Sq = 16, Sk = 4096, H = 2, D = 80;
  q = tb_new(tr->be, DT_BF16, 4, (int64_t[]){1, Sq, H, D});
  k = tb_new(tr->be, DT_BF16, 4, (int64_t[]){1, Sk, H, D});
  v = tb_new(tr->be, DT_BF16, 4, (int64_t[]){1, Sk, H, D});
  o1 = tb_new(tr->be, DT_BF16, 4, (int64_t[]){1, Sq, H, D});
  o2 = tb_new(tr->be, DT_BF16, 4, (int64_t[]){1, Sq, H, D});
  tb_fill_uniform(q, &r, -1, 1), tb_fill_uniform(k, &r, -1, 1), tb_fill_uniform(v, &r, -1, 1);
  /* linear 64 x 256 -> 128 (cuBLASLt) */
  x = tb_new(tr->be, DT_BF16, 2, (int64_t[]){64, 256});
  w = tb_new(tr->be, DT_BF16, 2, (int64_t[]){128, 256});
  y1 = tb_new(tr->be, DT_BF16, 2, (int64_t[]){64, 128});
  y2 = tb_new(tr->be, DT_BF16, 2, (int64_t[]){64, 128});
  tb_fill_uniform(x, &r, -1, 1), tb_fill_uniform(w, &r, -1, 1);
  ot_cross_entropy_params cp = ot_cross_entropy_default_params();
  ot_attention_params ap = ot_attention_default_params();
  tb_poison(loss), tb_poison(loss2), tb_poison(o1), tb_poison(o2), tb_poison(y1), tb_poison(y2);
  /* without an arena */
  if (!tr_ok(tr, ot_cross_entropy_forward(ctx, &cp, tb_dl(lg), tb_dl(lb), tb_dl(loss), NULL), "ce") ||
      !tr_ok(tr, ot_attention_forward(ctx, &ap, tb_dl(q), tb_dl(k), tb_dl(v), NULL, NULL,
                                      tb_dl(o1), NULL), "attention") ||
      !tr_ok(tr, ot_linear_forward(ctx, tb_dl(x), tb_dl(w), NULL, tb_dl(y1)), "linear"))
    goto out;
  /* too small for the workspace: refused, nothing attached */
  if (!tr_ok(tr, ot_arena_create(ctx, 1 << 20, &tiny), "tiny arena")) goto out;
  tr_expect_error(tr, ot_context_set_arena(ctx, tiny), OT_ERR_OOM,
                  "ot_context_set_arena: arena: the cuBLASLt workspace: cannot allocate 33554432",
                  "largest free block is 1048576 bytes");
  /* attached */
  if (!tr_ok(tr, ot_arena_create(ctx, lt + (64 << 20), &a), "arena")) goto out;
  if (!tr_ok(tr, ot_context_set_arena(ctx, a), "attach")) goto out;
  ot_arena_stats s0, s1;
  ot_arena_get_stats(a, &s0);
  if (s0.in_use != lt || s0.live_blocks != 1) tr_fail(tr, "after attach: in_use %zu", s0.in_use);
  ot_memory_counter ce0, at0;
  ot_memory_op_counter("ot_cross_entropy_forward", &ce0);
  ot_memory_op_counter("ot_attention_forward", &at0);
  bool ran = tr_ok(tr, ot_cross_entropy_forward(ctx, &cp, tb_dl(lg), tb_dl(lb), tb_dl(loss2), NULL), "ce (arena)") &&
             tr_ok(tr, ot_attention_forward(ctx, &ap, tb_dl(q), tb_dl(k), tb_dl(v), NULL, NULL,
                                            tb_dl(o2), NULL), "attention (arena)") &&
             tr_ok(tr, ot_linear_forward(ctx, tb_dl(x), tb_dl(w), NULL, tb_dl(y2)), "linear (arena)");
  if (!ran) goto detach;
  ot_arena_get_stats(a, &s1);
  ot_memory_counter ce1, at1;
  ot_memory_op_counter("ot_cross_entropy_forward", &ce1);
  ot_memory_op_counter("ot_attention_forward", &at1);
  if (s1.in_use != lt || s1.live_blocks != 1)
    tr_fail(tr, "temporaries not given back: in_use %zu, %llu live blocks", s1.in_use,
            (unsigned long long)s1.live_blocks);
  if (s1.num_allocs < s0.num_allocs + 2)
    tr_fail(tr, "ops took %llu blocks from the arena, expected >= 2 (ce, attention)",
            (unsigned long long)(s1.num_allocs - s0.num_allocs));
  if (ce1.allocs != ce0.allocs + 1 || ce1.current != ce0.current || ce1.peak < (size_t)N * 4)
    tr_fail(tr, "tracker, ot_cross_entropy_forward: %llu allocs, current %zu, peak %zu",
            (unsigned long long)(ce1.allocs - ce0.allocs), ce1.current, ce1.peak);
  if (at1.allocs < at0.allocs + 1 || at1.current != at0.current)
    tr_fail(tr, "tracker, ot_attention_forward: %llu allocs (split-KV partials expected)",
            (unsigned long long)(at1.allocs - at0.allocs));
  tb_sync(loss), tb_sync(loss2), tb_sync(o1), tb_sync(o2), tb_sync(y1), tb_sync(y2);
  if (memcmp(loss->host, loss2->host, 4) || memcmp(o1->host, o2->host, o1->bytes) ||
      memcmp(y1->host, y2->host, y1->bytes))
    tr_fail(tr, "results with the arena differ from those without");
  /* exhaustion: a user block pattern-filled, then an arena with no room for the row losses */
  if (!tr_ok(tr, ot_arena_create(ctx, lt + 8192, &small), "small arena")) goto detach;
  if (!tr_ok(tr, ot_context_set_arena(ctx, small), "attach small")) goto detach;
  void *user = NULL;
  host = malloc(4096);
  for (int i = 0; i < 4096; i++) host[i] = (unsigned char)(i * 13 + 5);
  if (tr_ok(tr, ot_arena_alloc(small, 4096, NULL, &user), "user block")) {
    cudaMemcpy(user, host, 4096, cudaMemcpyHostToDevice);
    tb_poison(loss2);
    const DLTensor *l2 = tb_dl(loss2);
    tr_expect_error(tr, ot_cross_entropy_forward(ctx, &cp, tb_dl(lg), tb_dl(lb), l2, NULL),
                    OT_ERR_OOM,
                    "ot_cross_entropy_forward: the row losses: cannot allocate 16384 bytes",
                    "the largest free block is 4096 bytes");
    tb_sync(loss2);
    if (!isnan(((float *)loss2->host)[0])) tr_fail(tr, "loss written by a failing op");
    unsigned char back[4096];
    cudaDeviceSynchronize();
    cudaMemcpy(back, user, 4096, cudaMemcpyDeviceToHost);
    if (memcmp(back, host, 4096)) tr_fail(tr, "a live block was disturbed by the OOM");
    ot_arena_stats ss;
    ot_arena_get_stats(small, &ss);
    if (ss.live_blocks != 2) tr_fail(tr, "%llu live blocks after the OOM, expected 2",
                                     (unsigned long long)ss.live_blocks);
    ot_arena_free(small, user, NULL);
  }
detach:
  tr_ok(tr, ot_context_set_arena(ctx, NULL), "detach");
  if (a) {
    ot_arena_get_stats(a, &s1);
    if (s1.in_use != 0) tr_fail(tr, "after detach the arena still has %zu bytes in use", s1.in_use);
  }
  /* the context works again with its own buffers */
  tr_ok(tr, ot_linear_forward(ctx, tb_dl(x), tb_dl(w), NULL, tb_dl(y1)), "linear after detach");
out:
  cudaDeviceSynchronize();
  ot_arena_destroy(a), ot_arena_destroy(tiny), ot_arena_destroy(small);
  free(host);
  tbuf *all[] = {lg, lb, loss, loss2, q, k, v, o1, o2, x, w, y1, y2};
  for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) tb_free(all[i]);
  tr_end(tr);
}

/* CUDA graphs: an op captured (global mode, as torch captures) takes its temporary from
 * never-used memory of the arena (the warm-up's block is tagged with another stream, and
 * no wait is possible inside a capture), keeps it after the op (the graph writes it at
 * every launch), and the launched graph computes what the op computes; detach gives the
 * kept block back. */
static void context_arena_graph(test_run *tr) {
  if (!tr_begin(tr, "context arena: an op captured in a CUDA graph (CUDA)")) return;
  ot_context *ctx = tr->be->ctx;
  rng r = tr_rng(tr);
  ot_arena *a = NULL;
  cudaStream_t cs = NULL;
  cudaGraph_t graph = NULL;
  cudaGraphExec_t exec = NULL;
  const int64_t N = 4096, V = 64;
  const size_t lt = (size_t)32 << 20;
  tbuf *lg = tb_new(tr->be, DT_F32, 2, (int64_t[]){N, V});
  tbuf *lb = tb_new(tr->be, DT_I64, 1, (int64_t[]){N});
  tbuf *ref = tb_new(tr->be, DT_F32, 1, (int64_t[]){1});
  tbuf *loss = tb_new(tr->be, DT_F32, 1, (int64_t[]){1});
  tb_fill_uniform(lg, &r, -3, 3);
  for (int64_t i = 0; i < N; i++) tb_set(lb, i, (double)rng_int(&r, 0, V - 1));
  tb_poison(ref), tb_poison(loss);
  ot_cross_entropy_params cp = ot_cross_entropy_default_params();
  const DLTensor *dlg = tb_dl(lg), *dlb = tb_dl(lb), *dref = tb_dl(ref), *dloss = tb_dl(loss);
  if (!tr_ok(tr, ot_cross_entropy_forward(ctx, &cp, dlg, dlb, dref, NULL), "reference")) goto out;
  if (!tr_ok(tr, ot_arena_create(ctx, lt + (1 << 20), &a), "arena") ||
      !tr_ok(tr, ot_context_set_arena(ctx, a), "attach"))
    goto out;
  /* warm-up on the legacy stream: its block goes back tagged with that stream */
  if (!tr_ok(tr, ot_cross_entropy_forward(ctx, &cp, dlg, dlb, dloss, NULL), "warm-up")) goto detach;
  cudaDeviceSynchronize();
  if (cudaStreamCreateWithFlags(&cs, cudaStreamNonBlocking) != cudaSuccess ||
      !tr_ok(tr, ot_context_set_stream(ctx, cs), "set stream"))
    goto detach;
  if (cudaStreamBeginCapture(cs, cudaStreamCaptureModeGlobal) != cudaSuccess) {
    tr_fail(tr, "cudaStreamBeginCapture");
    goto detach;
  }
  ot_status st = ot_cross_entropy_forward(ctx, &cp, dlg, dlb, dloss, NULL);
  cudaError_t e = cudaStreamEndCapture(cs, &graph);
  if (!tr_ok(tr, st, "captured op") || e != cudaSuccess) {
    if (e != cudaSuccess) tr_fail(tr, "cudaStreamEndCapture: %s", cudaGetErrorString(e));
    goto detach;
  }
  ot_arena_stats s;
  ot_arena_get_stats(a, &s);
  if (s.in_use != lt + 16384 || s.live_blocks != 2)
    tr_fail(tr, "after the capture: in_use %zu, %llu live blocks (expected the workspace and "
            "the graph's 16384-byte block)", s.in_use, (unsigned long long)s.live_blocks);
  if (cudaGraphInstantiate(&exec, graph, 0) != cudaSuccess) {
    tr_fail(tr, "cudaGraphInstantiate");
    goto detach;
  }
  tb_poison(loss);
  dloss = tb_dl(loss);
  for (int i = 0; i < 3; i++) cudaGraphLaunch(exec, cs);
  cudaStreamSynchronize(cs);
  tb_sync(ref), tb_sync(loss);
  if (memcmp(ref->host, loss->host, 4))
    tr_fail(tr, "graph launch: loss %.9g, the op gives %.9g", ((float *)loss->host)[0],
            ((float *)ref->host)[0]);
detach:
  ot_context_set_stream(ctx, NULL);
  tr_ok(tr, ot_context_set_arena(ctx, NULL), "detach");
  if (a) {
    ot_arena_get_stats(a, &s);
    if (s.in_use != 0) tr_fail(tr, "after detach %zu bytes still in use", s.in_use);
  }
out:
  cudaDeviceSynchronize();
  if (exec) cudaGraphExecDestroy(exec);
  if (graph) cudaGraphDestroy(graph);
  if (cs) cudaStreamDestroy(cs);
  ot_arena_destroy(a);
  tb_free(lg), tb_free(lb), tb_free(ref), tb_free(loss);
  tr_end(tr);
}

/* Writes 0x22 over q's n bytes on `sb`, then checks (sampled) that this write landed last:
 * an earlier write to the block on another stream that was not ordered before it could
 * still land after it. */
static void last_write_lands(test_run *tr, void *q, size_t n, cudaStream_t sb) {
  cudaMemsetAsync(q, 0x22, n, sb);
  cudaDeviceSynchronize();
  unsigned char *back = (unsigned char *)malloc(n);
  if (!back) {
    tr_fail(tr, "malloc of %zu bytes", n);
    return;
  }
  cudaMemcpy(back, q, n, cudaMemcpyDeviceToHost);
  for (size_t i = 0; i < n; i += 4099)
    if (back[i] != 0x22) {
      tr_fail(tr, "byte %zu is 0x%02x: B's write was overtaken (no ordering)", i, back[i]);
      break;
    }
  free(back);
}

/* CUDA: the real cross-stream wait. Stream A fills the arena with a block, writes it
 * (a long memset), frees it on A; stream B then allocates: it must get the block only
 * after waiting for A -- its own write, enqueued after the wait, must land last. */
static void arena_cuda_streams(test_run *tr) {
  if (!tr_begin(tr, "arena cross-stream reuse with events (CUDA)")) return;
  ot_arena *a = NULL;
  cudaStream_t sa = NULL, sb = NULL;
  const size_t n = 64 << 20;
  if (cudaStreamCreateWithFlags(&sa, cudaStreamNonBlocking) != cudaSuccess ||
      cudaStreamCreateWithFlags(&sb, cudaStreamNonBlocking) != cudaSuccess) {
    tr_fail(tr, "cudaStreamCreate");
    goto out;
  }
  if (!tr_ok(tr, ot_arena_create(tr->be->ctx, n, &a), "create")) goto out;
  void *p = NULL, *q = NULL;
  if (!tr_ok(tr, ot_arena_alloc(a, n, sa, &p), "alloc on A")) goto out;
  for (int i = 0; i < 20; i++) cudaMemsetAsync(p, 0x11, n, sa); /* keep A busy */
  tr_ok(tr, ot_arena_free(a, p, sa), "free on A");
  if (!tr_ok(tr, ot_arena_alloc(a, n, sb, &q), "alloc on B")) goto out;
  if (q != p) tr_fail(tr, "B did not get A's block");
  last_write_lands(tr, q, n, sb);
  tr_ok(tr, ot_arena_free(a, q, sb), "free on B");
out:
  ot_arena_destroy(a);
  if (sa) cudaStreamDestroy(sa);
  if (sb) cudaStreamDestroy(sb);
  tr_end(tr);
}

/* CUDA: cudaStreamPerThread. This thread fills the arena with a block, writes it with a
 * long queue on its per-thread stream and frees it there. Another host thread's request
 * on its own per-thread stream is an OOM (it may neither reuse the block at once nor wait
 * for this thread's stream); stream B, asked from this thread, gets it after the wait for
 * handle 2 -- B's write, enqueued after the wait, must land last. */
static void arena_cuda_per_thread(test_run *tr) {
  if (!tr_begin(tr, "arena: cudaStreamPerThread across host threads (CUDA)")) return;
  ot_arena *a = NULL;
  cudaStream_t sb = NULL;
  const size_t n = 64 << 20;
  if (cudaStreamCreateWithFlags(&sb, cudaStreamNonBlocking) != cudaSuccess) {
    tr_fail(tr, "cudaStreamCreate");
    goto out;
  }
  if (!tr_ok(tr, ot_arena_create(tr->be->ctx, n, &a), "create")) goto out;
  void *p = NULL, *q = NULL;
  if (!tr_ok(tr, ot_arena_alloc(a, n, cudaStreamPerThread, &p), "alloc on this thread")) goto out;
  for (int i = 0; i < 20; i++) cudaMemsetAsync(p, 0x11, n, cudaStreamPerThread);
  tr_ok(tr, ot_arena_free(a, p, cudaStreamPerThread), "free on this thread's stream");
  per_thread_job j = {a, 4096, (void *)cudaStreamPerThread, false, OT_OK, NULL, 0};
  if (run_on_thread(tr, &j) && j.st != OT_ERR_OOM) {
    tr_fail(tr, "another thread's per-thread stream: %s, expected an OOM",
            ot_status_string(j.st));
    goto out;
  }
  if (!tr_ok(tr, ot_arena_alloc(a, n, sb, &q), "alloc on B")) goto out;
  if (q != p) tr_fail(tr, "B did not get the block");
  last_write_lands(tr, q, n, sb);
  tr_ok(tr, ot_arena_free(a, q, sb), "free on B");
out:
  ot_arena_destroy(a);
  if (sb) cudaStreamDestroy(sb);
  tr_end(tr);
}

/* CUDA, 2+ devices: creating a context and an arena on device 1 leaves the calling
 * thread's current device as it was (each op makes its context's device current while it
 * runs and restores the caller's). */
static void context_keeps_current_device(test_run *tr) {
  if (!tr_begin(tr, "context / arena create on device 1 keep the current device (CUDA)")) return;
  int count = 0, prev = -1, dev = -1;
  if (cudaGetDeviceCount(&count) != cudaSuccess || count < 2 ||
      cudaGetDevice(&prev) != cudaSuccess) {
    (void)cudaGetLastError();
    tr->case_skipped = true; /* one device: nothing to switch */
    tr_end(tr);
    return;
  }
  ot_context *c = NULL;
  ot_arena *a = NULL;
  ot_context_options o = ot_context_default_options();
  o.device_type = kDLCUDA;
  o.device_id = 1;
  cudaSetDevice(0);
  if (tr_ok(tr, ot_context_create(&o, &c), "context on device 1")) {
    if (cudaGetDevice(&dev) != cudaSuccess || dev != 0)
      tr_fail(tr, "ot_context_create left device %d current, expected 0", dev);
    if (tr_ok(tr, ot_arena_create(c, 1 << 20, &a), "arena on device 1") &&
        (cudaGetDevice(&dev) != cudaSuccess || dev != 0))
      tr_fail(tr, "ot_arena_create left device %d current, expected 0", dev);
  }
  ot_arena_destroy(a);
  ot_context_destroy(c);
  cudaSetDevice(prev);
  tr_end(tr);
}
#endif

void arena_cpu_ops(test_run *tr);

static void run_arena(test_run *tr) {
  if (tr->grad) return;
  context_arena_bad_args(tr);
  if (tr->be->is_cuda) {
#ifdef OT_TEST_CUDA
    context_arena_cuda(tr);
    context_arena_graph(tr);
    arena_cuda_streams(tr);
    arena_cuda_per_thread(tr);
    context_keeps_current_device(tr);
#endif
    return;
  }
  arena_cross_stream_rules(tr);
  arena_cross_stream_stress(tr, 30000);
  arena_tagged_and_untagged_run(tr);
  arena_adoption_waits_for_the_run(tr);
  arena_per_thread_stream(tr);
  arena_library_request(tr);
  arena_library_try(tr);
  arena_cpu_ops(tr); /* cases_arena_cpu.c: CPU ops' temporaries from a host arena */
}

const test_suite suite_arena = {"arena", run_arena};
