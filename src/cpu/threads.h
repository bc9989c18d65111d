/*
 * threads.h -- how many OpenMP threads a CPU kernel call is worth.
 *
 * Opening a parallel region costs a fork/join (about 1 us with every thread on a
 * core), and on a loaded machine with few cores a thread of the team that lost its
 * core stalls the whole region until it is scheduled again. Measured on 2 cores,
 * float32, the mean of 400 calls of a small C loop over the public API, two threads
 * against the team chosen here (one thread for all of these):
 *                                                 one busy process   idle
 *   attention decode, 1 query, 8 heads of 32, 40 keys:   84 -> 32 us   24 -> 39 us
 *   the same with 256 keys:                             441 -> 183 us 112 -> 179 us
 *   softmax 16x2048 (32K elements):                     107 -> 44 us   24 -> 38 us
 *   SwiGLU 16x2048:                                      85 -> 43 us   23 -> 34 us
 * So a call goes parallel only when its work pays for a possible stall, at the price
 * of some microseconds per call near the grain on an idle machine.
 *
 * The rule, one for every kernel (the grain of torch's at::parallel_for):
 *   work = elements of the op's main operand (memory-bound ops: norms, rope, GLU,
 *          softmax, cross-entropy, conversions, copies), or FLOPs / 8 for the
 *          compute-bound ones (attention, paged attention, the small-M linear;
 *          attention counts every (query, key) pair, the mask ignored);
 *   threads = 1 when work <= OT_CPU_GRAIN, else min(num_threads, ceil(work / GRAIN)):
 *          every thread gets about a grain of work or more.
 * 32768 units is ~10-30 us of one thread (float32, one thread: softmax 16x2048 32 us,
 * SwiGLU 28 us, RMSNorm 10 us; a decode attention call of 8 x 40 x 32 is 5K units and
 * 28 us: decode attention is slower per FLOP than prefill, its query tiles being 64
 * rows whatever the query count; it stays on one thread up to 256 keys at that head
 * count, 16 keys with 32 heads of 128).
 *
 * What the grain does not fix: a tiny model's decode step (ot-run --config tiny, bf16,
 * 2 threads) still has its GEMVs above the grain (gate/up 90K units, down 45K, the LM
 * head 2M), and with one busy process on a 2-core machine each of those regions still
 * waits for a descheduled thread: ~180-220 tokens/s before and after this rule, even
 * with a grain of 256K, against ~340 with one thread or ~310 with
 * OMP_WAIT_POLICY=passive (idle: ~510 before, ~490 after).
 *
 * Results do not change: the kernels whose results were independent of the thread
 * count stay so, and where a split is visible in the rounding (the linear dbias tasks,
 * paged attention's key splits) only the team size follows the work, the split is
 * decided as before. The exception is the norms, whose dweight/dbias partials are one
 * per thread: their count now follows this rule (deterministic for a given context and
 * shape, as before).
 */
#ifndef OT_CPU_THREADS_H
#define OT_CPU_THREADS_H

#include <stdint.h>

#include "core/internal.h"

/* Overridable at build time (-DOT_CPU_GRAIN=N) for experiments. */
#ifndef OT_CPU_GRAIN
#define OT_CPU_GRAIN ((int64_t)32768)
#endif

static inline int ot_cpu_threads(const ot_context *ctx, int64_t work) {
  const int64_t nt = ctx->num_threads;
  if (nt <= 1 || work <= OT_CPU_GRAIN) return 1;
  const int64_t by_work = (work + OT_CPU_GRAIN - 1) / OT_CPU_GRAIN;
  return (int)(by_work < nt ? by_work : nt);
}

/* The same, at most `cap` threads (the number of independent tasks), at least 1. */
static inline int ot_cpu_threads_cap(const ot_context *ctx, int64_t work, int64_t cap) {
  int nt = ot_cpu_threads(ctx, work);
  if (cap < nt) nt = cap < 1 ? 1 : (int)cap;
  return nt;
}

#endif /* OT_CPU_THREADS_H */
