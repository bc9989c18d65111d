/*
 * shim_common.h -- what the ctypes bench shims (attention_shim.c, fused_ops_shim.c,
 * decode_shim.c) share: the exported-symbol macro, the one context of the shim
 * (created by shim_init on the given CUDA device), shim_last_error and the DLPack dtype
 * of a shim dtype code (1 float32, 2 float16, 3 bfloat16). Included by exactly one
 * translation unit per shim library, after the library header it needs.
 */
#ifndef OT_BENCH_SHIM_COMMON_H
#define OT_BENCH_SHIM_COMMON_H

#include "ops_transformer.h"

#define SHIM_API __attribute__((visibility("default")))

static ot_context *g_ctx;
static int g_dev;

SHIM_API int shim_init(int device) {
  if (g_ctx) return 0;
  ot_context_options o = ot_context_default_options();
  o.device_type = kDLCUDA;
  o.device_id = device;
  g_dev = device;
  return (int)ot_context_create(&o, &g_ctx);
}

SHIM_API const char *shim_last_error(void) { return ot_last_error(); }

static inline DLDataType shim_dtype(int code) {
  DLDataType t = {kDLFloat, 32, 1};
  if (code == 2) t.bits = 16;
  if (code == 3) t.code = kDLBfloat, t.bits = 16;
  return t;
}

#endif /* OT_BENCH_SHIM_COMMON_H */
