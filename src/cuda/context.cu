/* context.cu -- CUDA backend: device checks and per-context state. */
#include <cuda_runtime.h>

#include "../core/backend.h"

extern "C" ot_status ot_cuda_context_init(ot_context *ctx) {
  static const char *op = "ot_context_create";
  int count = 0;
  cudaError_t e = cudaGetDeviceCount(&count);
  if (e != cudaSuccess || count == 0) {
    (void)cudaGetLastError();
    return ot_error(OT_ERR_NO_DEVICE, op, "options.device_type: kDLCUDA requested but no CUDA "
                    "device is available (%s)", e != cudaSuccess ? cudaGetErrorString(e) : "0 devices");
  }
  if (ctx->device.device_id < 0 || ctx->device.device_id >= count)
    return ot_error(OT_ERR_NO_DEVICE, op, "options.device_id: %d, but only %d CUDA device(s) exist",
                    ctx->device.device_id, count);
  e = cudaSetDevice(ctx->device.device_id);
  if (e != cudaSuccess)
    return ot_error(OT_ERR_BACKEND, op, "cudaSetDevice(%d): %s", ctx->device.device_id,
                    cudaGetErrorString(e));
  ctx->cuda = NULL;
  return OT_OK;
}

extern "C" void ot_cuda_context_release(ot_context *ctx) { (void)ctx; }
