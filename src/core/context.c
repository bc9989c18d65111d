/* context.c -- context creation and the parameter defaults of the public API. */
#include <stdlib.h>
#ifdef _OPENMP
#include <omp.h>
#endif

#include "backend.h"
#include "internal.h"

ot_context_options ot_context_default_options(void) {
  ot_context_options o;
  memset(&o, 0, sizeof o);
  o.device_type = kDLCPU;
  return o;
}

int ot_has_cuda(void) {
#ifdef OT_HAVE_CUDA
  return 1;
#else
  return 0;
#endif
}

ot_status ot_context_create(const ot_context_options *options, ot_context **out) {
  static const char *op = "ot_context_create";
  if (!out) return ot_error(OT_ERR_INVALID_ARGUMENT, op, "out: pointer is NULL");
  *out = NULL;
  ot_context_options o = options ? *options : ot_context_default_options();
  if (o.num_threads < 0)
    return ot_error(OT_ERR_INVALID_ARGUMENT, op, "options.num_threads: %d is negative",
                    o.num_threads);
  if (o.device_type != kDLCPU && o.device_type != kDLCUDA)
    return ot_error(OT_ERR_UNSUPPORTED, op,
                    "options.device_type: %d is not supported (kDLCPU = 1 or kDLCUDA = 2)",
                    (int)o.device_type);
  if (o.device_type == kDLCPU && o.device_id != 0)
    return ot_error(OT_ERR_INVALID_ARGUMENT, op, "options.device_id: %d, the CPU is device 0",
                    o.device_id);
  ot_context *ctx = (ot_context *)calloc(1, sizeof *ctx);
  if (!ctx) return ot_error(OT_ERR_OOM, op, "cannot allocate the context");
  ctx->device.device_type = o.device_type;
  ctx->device.device_id = o.device_id;
  ctx->stream = o.stream;
#ifdef _OPENMP
  ctx->num_threads = o.num_threads > 0 ? o.num_threads : omp_get_max_threads();
#else
  ctx->num_threads = 1;
#endif
  if (o.device_type == kDLCUDA) {
    ot_status st = ot_cuda_context_init(ctx);
    if (st != OT_OK) {
      free(ctx);
      return st;
    }
  }
  *out = ctx;
  return OT_OK;
}

void ot_context_destroy(ot_context *ctx) {
  if (!ctx) return;
  if (ot_ctx_is_cuda(ctx)) ot_cuda_context_release(ctx);
  free(ctx);
}

ot_status ot_context_set_stream(ot_context *ctx, void *stream) {
  if (!ctx) return ot_error(OT_ERR_INVALID_ARGUMENT, "ot_context_set_stream", "ctx: is NULL");
  if (stream == ctx->stream) return OT_OK;
  if (ot_ctx_is_cuda(ctx)) return ot_cuda_context_set_stream(ctx, stream);
  ctx->stream = stream;
  return OT_OK;
}

DLDevice ot_context_device(const ot_context *ctx) {
  DLDevice d = {kDLCPU, 0};
  return ctx ? ctx->device : d;
}

/* Parameter defaults ----------------------------------------------------------- */

ot_rope_params ot_rope_default_params(void) {
  ot_rope_params p;
  memset(&p, 0, sizeof p);
  p.mode = OT_ROPE_NEOX;
  p.rotary_dim = 0;
  p.theta = 10000.0f;
  p.llama3_factor = 0.0f;
  p.llama3_low_freq_factor = 1.0f;
  p.llama3_high_freq_factor = 4.0f;
  p.llama3_original_max_position = 8192;
  return p;
}

ot_cross_entropy_params ot_cross_entropy_default_params(void) {
  ot_cross_entropy_params p;
  memset(&p, 0, sizeof p);
  p.ignore_index = -100;
  p.label_smoothing = 0.0f;
  p.reduction = OT_REDUCTION_MEAN;
  return p;
}

ot_attention_params ot_attention_default_params(void) {
  ot_attention_params p;
  memset(&p, 0, sizeof p);
  p.softmax_scale = 0.0f;
  p.causal = 0;
  p.window_left = -1;
  p.window_right = -1;
  p.softcap = 0.0f;
  p.deterministic = 0;
  return p;
}
