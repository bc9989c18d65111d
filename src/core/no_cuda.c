/* no_cuda.c -- stands in for the CUDA backend in builds without CUDA. */
#include "backend.h"

#ifndef OT_HAVE_CUDA
ot_status ot_cuda_context_init(ot_context *ctx) {
  (void)ctx;
  return ot_error(OT_ERR_NO_DEVICE, "ot_context_create",
                  "options.device_type: kDLCUDA requested but this build of ops_transformer has "
                  "no CUDA backend (configure with -DOT_CUDA=ON)");
}
void ot_cuda_context_release(ot_context *ctx) { (void)ctx; }
ot_status ot_cuda_context_set_stream(ot_context *ctx, void *stream) {
  ctx->stream = stream; /* no CUDA context exists in such a build */
  return OT_OK;
}
#endif

ot_status ot_cuda_not_implemented(const char *op) {
  return ot_error(OT_ERR_UNSUPPORTED, op, "the CUDA backend has no kernel for this op yet");
}
