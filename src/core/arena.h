/*
 * arena.h -- private side of the arena allocator (ot_arena) and the backend hooks that
 * obtain and release its one reservation.
 *
 * The arena's bookkeeping always lives on the host, whatever memory it manages: blocks
 * are host records (offset, size) in an address-ordered doubly linked list (the
 * boundary tags), free blocks are also in one of OT_ARENA_CLASSES segregated free lists
 * (class c holds sizes in [2^c, 2^(c+1)) units of OT_ARENA_ALIGN bytes), and live blocks
 * are found from their pointer through a hash table keyed by offset.
 */
#ifndef OT_CORE_ARENA_H
#define OT_CORE_ARENA_H

#include "internal.h"

#ifdef __cplusplus
extern "C" {
#endif

#define OT_ARENA_ALIGN 256
#define OT_ARENA_CLASSES 48
/* The tag of blocks freed on the legacy default stream (NULL): cudaStreamLegacy's value.
 * One stream, shared by every host thread, so the handle is its tag. */
#define OT_ARENA_LEGACY_STREAM ((void *)(uintptr_t)1)
/* cudaStreamPerThread's value: the same handle names a different stream on every host
 * thread, so blocks freed on it are tagged with the freeing thread (see arena.c). */
#define OT_ARENA_PER_THREAD_STREAM ((void *)(uintptr_t)2)

/* Make stream `waiter` wait for the work enqueued so far on stream `producer` (both of
 * `device`, handles as the calling thread names them), without blocking the host. A
 * stream-ordered arena calls it, once per producer, when a request on `waiter` fits only
 * in a run that holds blocks freed on other streams (see ot_arena_free in the public
 * header); non-OK (nothing changed) makes that request fail with OT_ERR_OOM. */
typedef ot_status (*ot_arena_wait_fn)(const char *op, DLDevice device, void *waiter,
                                      void *producer);
/* CUDA arenas' wait: an event recorded on `producer`, waited on by `waiter`; refused while
 * either stream captures a graph. */
ot_status ot_arena_cuda_wait(const char *op, DLDevice device, void *waiter, void *producer);

/* ot_arena_alloc_tagged for the library's own temporaries: the block is recorded under
 * `tag` and op name `op`, and an OOM message reads "<op>: <what>: cannot allocate ...". */
ot_status ot_arena_alloc_for(const char *op, const char *what, ot_arena *arena, size_t bytes,
                             void *stream, ot_memory_tag tag, void **ptr);
/* The same for a caller with a fallback: a request that does not fit returns OT_ERR_OOM
 * and records no message (ot_last_error() is left alone). */
ot_status ot_arena_try_alloc_for(const char *op, const char *what, ot_arena *arena,
                                 size_t bytes, void *stream, ot_memory_tag tag, void **ptr);

/* The reservation of `bytes` on `device`: host memory (aligned_alloc, 256-byte aligned)
 * or device memory (cudaMalloc). `op` names the caller for messages. */
ot_status ot_reserve_memory(const char *op, DLDevice device, size_t bytes, void **ptr);
void ot_release_memory(DLDevice device, void *ptr);
/* Copy bytes between two buffers of `ctx`'s device, ordered on its stream. */
ot_status ot_device_copy(const char *op, ot_context *ctx, void *dst, const void *src,
                         size_t bytes);

/* CUDA backend (src/cuda/arena.cu). */
ot_status ot_cuda_reserve(const char *op, int device_id, size_t bytes, void **ptr);
void ot_cuda_release(int device_id, void *ptr);
ot_status ot_cuda_copy(const char *op, ot_context *ctx, void *dst, const void *src, size_t bytes);
ot_status ot_cuda_synchronize(const char *op, int device_id);
ot_status ot_cuda_stream_wait(const char *op, int device_id, void *waiter, void *producer);
/* ot_context_set_arena on a CUDA context (src/cuda/context.cu). */
ot_status ot_cuda_context_set_arena(ot_context *ctx, ot_arena *arena);

/* The device of the arena's reservation. */
DLDevice ot_arena_device(const ot_arena *arena);

/* Tests: make a host arena honour streams as a CUDA arena does (see ot_arena_free in
 * ops_transformer.h), so the stream-ordering rules run under the CPU tests. */
void ot_arena_set_stream_ordered(ot_arena *arena, bool on);
/* Tests: replace the cross-stream wait (NULL: other streams' blocks only after
 * ot_arena_synchronize, the host arenas' default), and count the waits made. */
void ot_arena_set_wait(ot_arena *arena, ot_arena_wait_fn wait);
uint64_t ot_arena_num_waits(ot_arena *arena);
/* Walk every structure and check its invariants (the blocks tile the reservation,
 * no two free neighbours that may merge, free lists and hash table agree with the
 * blocks, counters add up). Returns true when consistent; else writes why into msg. */
bool ot_arena_check(ot_arena *arena, char *msg, size_t msg_size);

#ifdef __cplusplus
}
#endif

#endif /* OT_CORE_ARENA_H */
