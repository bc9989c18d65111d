/*
 * threads.h -- how many OpenMP threads a CPU kernel call is worth.
 *
 * Opening a parallel region costs a fork/join (a few microseconds with every thread
 * on a core), and on a loaded machine with few cores a thread of the team that lost
 * its core stalls the whole region for a scheduler slice (measured on 2 loaded cores:
 * a [1, 64] op or a one-token decode attention call took 0.4-12 ms instead of
 * 1-30 us in a two-thread region; tiny-model decode 10-40 tokens/s with two threads
 * against ~120 with one). So a call goes parallel only when its work pays for that.
 *
 * The rule, one for every kernel (the grain of torch's at::parallel_for):
 *   work = elements of the op's main operand (memory-bound ops: norms, rope, GLU,
 *          softmax, cross-entropy, conversions, copies), or FLOPs / 8 for the
 *          compute-bound ones (attention, the small-M linear);
 *   threads = 1 when work <= OT_CPU_GRAIN, else min(num_threads, ceil(work / GRAIN)):
 *          every thread gets at least about a grain of work.
 * 32768 units is ~10-30 us of one thread for the memory-bound kernels (float32,
 * measured: softmax 16x2048 33 us, SwiGLU 28 us, RMSNorm 10 us on one thread), where
 * a second thread saved at best 2-15 us on an idle machine and cost milliseconds on a
 * loaded one.
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

#define OT_CPU_GRAIN ((int64_t)32768)

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
