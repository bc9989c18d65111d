/*
 * backend.h -- the entry points of the backends that the core calls.
 *
 * The CUDA backend's functions are defined in src/cuda/ when the library is built
 * with CUDA; otherwise src/core/no_cuda.c defines them to report OT_ERR_NO_DEVICE.
 * Op-specific backend entry points are declared in src/core/<family>.h next to the
 * op's argument struct.
 */
#ifndef OT_CORE_BACKEND_H
#define OT_CORE_BACKEND_H

#include "internal.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Check the device exists, make it current, create per-context state. */
ot_status ot_cuda_context_init(ot_context *ctx);
void ot_cuda_context_release(ot_context *ctx);
/* Make `stream` the context's stream; when the context holds device buffers that its
 * ops share (scratch, cuBLASLt workspace), the new stream first waits for the work
 * already enqueued on the old one. */
ot_status ot_cuda_context_set_stream(ot_context *ctx, void *stream);

/* Before a CUDA op on ctx (NULL: not an op): makes the context's device current. */
void ot_cuda_op_begin(ot_context *ctx);
/* After a CUDA op on ctx (NULL: not an op): returns its arena temporaries and restores the
 * caller's current device; returns `st`. */
ot_status ot_cuda_op_end(ot_context *ctx, ot_status st);

/* The status to return from an op that has no CUDA kernel yet. */
ot_status ot_cuda_not_implemented(const char *op);

/* Call a CUDA entry point: `return OT_CUDA_CALL(op, ot_cuda_rope, ctx, &args);`. In builds
 * without CUDA no CUDA context can exist, and the entry points are not compiled, so the
 * call becomes the "not implemented" status and the symbol is never referenced. */
#ifdef OT_HAVE_CUDA
/* When the first argument is the op's context, ot_cuda_op_begin runs before the entry
 * point (the context's device becomes current: one cudaGetDevice, and a cudaSetDevice only
 * when the caller's current device is another) and ot_cuda_op_end after it returns: it
 * gives the temporaries the op took from the context's arena back (stream-ordered; see
 * ot_context_set_arena), restores the caller's device and returns the status unchanged.
 * C only (_Generic). */
#define OT_CUDA_CALL(op, fn, ...) \
  (ot_cuda_op_begin(OT_CUDA_CTX_OF_(OT_CUDA_FIRST_(__VA_ARGS__, 0))), \
   ot_cuda_op_end(OT_CUDA_CTX_OF_(OT_CUDA_FIRST_(__VA_ARGS__, 0)), fn(__VA_ARGS__)))
#define OT_CUDA_FIRST_(a, ...) a
#define OT_CUDA_CTX_OF_(a) _Generic((a), ot_context *: (a), default: (ot_context *)NULL)
#else
#define OT_CUDA_CALL(op, fn, ...) ot_cuda_not_implemented(op)
#endif

#ifdef __cplusplus
}
#endif

#endif /* OT_CORE_BACKEND_H */
