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

/* The status to return from an op that has no CUDA kernel yet. */
ot_status ot_cuda_not_implemented(const char *op);

#ifdef __cplusplus
}
#endif

#endif /* OT_CORE_BACKEND_H */
