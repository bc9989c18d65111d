/*
 * temp.h -- the CPU backend's temporaries: from the context's arena when one is attached
 * (ot_context_set_arena on a CPU context), else from the C heap.
 *
 * Every CPU op takes its temporaries here before it writes any output and gives each
 * back before it returns. With an arena a block is recorded under OT_MEMORY_WORKSPACE
 * and the op's name, and exhaustion is OT_ERR_OOM "<op>: <what>: cannot allocate <n>
 * bytes (<m> rounded): the largest free block is <l> bytes (...)". Call from the
 * thread that runs the op (not inside a parallel region: the error is per thread).
 */
#ifndef OT_CPU_TEMP_H
#define OT_CPU_TEMP_H

#include "core/internal.h"

/* A block of at least `bytes` bytes (0 counts as 1), 64-byte aligned (256 from an
 * arena), or NULL with the error recorded (OT_ERR_OOM naming `op` and `what`). */
void *ot_cpu_temp_alloc(const ot_context *ctx, const char *op, const char *what, size_t bytes);
/* Give back a block of ot_cpu_temp_alloc on the same context; NULL is ignored. */
void ot_cpu_temp_free(const ot_context *ctx, void *ptr);

#endif /* OT_CPU_TEMP_H */
