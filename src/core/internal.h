/*
 * internal.h -- private declarations shared by the core, the CPU and the CUDA
 * backends: the context, errors, dtypes and validated tensor views.
 *
 * Flow of every public op (one file per op family in src/core/):
 *   1. validate every argument with the ot_check_* helpers below (they record the
 *      error message and return non-OK) -- nothing is written before this is done;
 *   2. fill the op's argument struct (declared in src/core/<family>.h) from the
 *      validated views;
 *   3. call ot_cpu_<op>() or ot_cuda_<op>() by the context's device.
 */
#ifndef OT_CORE_INTERNAL_H
#define OT_CORE_INTERNAL_H

#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "ops_transformer.h"

#ifdef __cplusplus
extern "C" {
#endif

#define OT_MAX_DIMS 8

/* ------------------------------------------------------------------------------ */
/* Context                                                                         */

struct ot_context {
  DLDevice device;
  void *stream;       /* cudaStream_t on CUDA contexts */
  int num_threads;    /* CPU: OpenMP threads, >= 1 */
  void *cuda;         /* backend-private state (cuBLASLt handle, workspace, ...) */
  ot_arena *host_arena; /* CPU: ot_context_set_arena, the ops' temporaries (cpu/temp.h) */
};

static inline bool ot_ctx_is_cuda(const ot_context *ctx) {
  return ctx->device.device_type == kDLCUDA;
}

/* ------------------------------------------------------------------------------ */
/* Errors                                                                          */

/* Record "op: message" as this thread's last error and return `status`. */
ot_status ot_error(ot_status status, const char *op, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 3, 4)))
#endif
    ;

/* Propagate a non-OK status. */
#define OT_TRY(expr)                      \
  do {                                    \
    ot_status ot_try_status_ = (expr);    \
    if (ot_try_status_ != OT_OK) return ot_try_status_; \
  } while (0)

/* ------------------------------------------------------------------------------ */
/* Dtypes                                                                          */

typedef enum ot_dtype {
  OT_DTYPE_INVALID = 0,
  OT_F32,
  OT_F16,
  OT_BF16,
  OT_I32,
  OT_I64
} ot_dtype;

/* The internal dtype of a DLDataType (lanes must be 1), or OT_DTYPE_INVALID. */
ot_dtype ot_dtype_from_dl(DLDataType t);
/* "float32", "float16", "bfloat16", "int32", "int64". */
const char *ot_dtype_name(ot_dtype d);
/* Names any DLDataType, e.g. "uint8", "float64", "float32x4"; uses a thread-local buffer. */
const char *ot_dl_dtype_name(DLDataType t);
size_t ot_dtype_size(ot_dtype d);
static inline bool ot_dtype_is_float(ot_dtype d) {
  return d == OT_F32 || d == OT_F16 || d == OT_BF16;
}

/* ------------------------------------------------------------------------------ */
/* Validated tensor views                                                          */

/* A DLTensor after validation: base pointer with byte_offset applied, strides in
 * elements always filled in. */
typedef struct ot_view {
  void *data;
  ot_dtype dtype;
  int ndim;
  int64_t shape[OT_MAX_DIMS];
  int64_t stride[OT_MAX_DIMS];
  int64_t numel;
} ot_view;

/* Checks that t is non-NULL, has a supported dtype, at most OT_MAX_DIMS dims,
 * non-negative shapes, on ctx's device, non-NULL data when numel > 0, element-aligned,
 * and fills `v`. `name` is the argument's name used in messages. */
ot_status ot_view_of(const char *op, const char *name, const ot_context *ctx, const DLTensor *t,
                     ot_view *v);

/* Like ot_view_of, but t == NULL is allowed: then v->data = NULL, v->ndim = -1 and
 * OT_OK is returned. */
ot_status ot_view_of_optional(const char *op, const char *name, const ot_context *ctx,
                              const DLTensor *t, ot_view *v);

static inline bool ot_view_present(const ot_view *v) { return v->ndim >= 0; }

/* Require ndim in [min_ndim, max_ndim]. */
ot_status ot_check_ndim(const char *op, const char *name, const ot_view *v, int min_ndim,
                        int max_ndim);
/* Require a floating storage dtype (f32 / f16 / bf16). */
ot_status ot_check_float(const char *op, const char *name, const ot_view *v);
/* Require dtype == `dtype`; the message names `ref_name` as the source of the expectation
 * (e.g. "x"), or states the dtype when ref_name is NULL. */
ot_status ot_check_dtype(const char *op, const char *name, const ot_view *v, ot_dtype dtype,
                         const char *ref_name);
/* Require int32 or int64. */
ot_status ot_check_index_dtype(const char *op, const char *name, const ot_view *v);
/* Require the same shape as `ref`. */
ot_status ot_check_same_shape(const char *op, const char *name, const ot_view *v,
                              const char *ref_name, const ot_view *ref);
/* Require shape[dim] == size. */
ot_status ot_check_dim(const char *op, const char *name, const ot_view *v, int dim, int64_t size,
                       const char *what);
/* Require the last dimension to have stride 1 (or size <= 1). */
ot_status ot_check_last_contiguous(const char *op, const char *name, const ot_view *v);
/* Require full row-major contiguity. */
ot_status ot_check_contiguous(const char *op, const char *name, const ot_view *v);

/* A 2-D "rows x cols" reading of [..., cols]: the leading dims must collapse into one
 * row stride (true for contiguous tensors and for row-strided 2-D views) and the last
 * dim must be contiguous. */
typedef struct ot_rows {
  int64_t rows, cols, row_stride;
} ot_rows;
ot_status ot_as_rows(const char *op, const char *name, const ot_view *v, ot_rows *r);

/* Byte range [lo, hi) that the view can touch (empty when numel == 0). */
void ot_view_extent(const ot_view *v, uintptr_t *lo, uintptr_t *hi);
/* True when a and b describe exactly the same elements (same data, dtype, shape,
 * strides). */
bool ot_view_same(const ot_view *a, const ot_view *b);
/* Reject an output `out` that shares elements with `in`. When allow_exact is true, an
 * exactly identical view is accepted (in-place). Views whose byte ranges interleave but
 * provably share no element (slices of one packed buffer) pass. Absent views pass. */
ot_status ot_check_no_overlap(const char *op, const char *out_name, const ot_view *out,
                              const char *in_name, const ot_view *in, bool allow_exact);
/* Reject an output whose own elements coincide (a zero or too small stride). */
ot_status ot_check_no_self_overlap(const char *op, const char *name, const ot_view *v);

/* ------------------------------------------------------------------------------ */
/* Scalar conversions (float32 is the compute type)                                */

static inline float ot_bf16_to_f32(uint16_t h) {
  uint32_t u = (uint32_t)h << 16;
  float f;
  memcpy(&f, &u, sizeof f);
  return f;
}

/* Round to nearest even; NaN stays NaN (quiet). */
static inline uint16_t ot_f32_to_bf16(float f) {
  uint32_t u;
  memcpy(&u, &f, sizeof u);
  if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x0040u);
  u += 0x7fffu + ((u >> 16) & 1u);
  return (uint16_t)(u >> 16);
}

float ot_f16_to_f32_slow(uint16_t h);
uint16_t ot_f32_to_f16_slow(float f);

#if defined(__FLT16_MAX__) && !defined(__CUDACC__)
static inline float ot_f16_to_f32(uint16_t h) {
  _Float16 x;
  memcpy(&x, &h, sizeof x);
  return (float)x;
}
static inline uint16_t ot_f32_to_f16(float f) {
  _Float16 x = (_Float16)f;
  uint16_t h;
  memcpy(&h, &x, sizeof h);
  return h;
}
#else
static inline float ot_f16_to_f32(uint16_t h) { return ot_f16_to_f32_slow(h); }
static inline uint16_t ot_f32_to_f16(float f) { return ot_f32_to_f16_slow(f); }
#endif

/* Load n elements of storage dtype `d` from src into float32 dst; store the reverse
 * with rounding. Contiguous, vectorizable loops; used by the CPU kernels to work on
 * rows in float32. */
void ot_load_f32(float *dst, const void *src, ot_dtype d, int64_t n);
void ot_store_f32(void *dst, const float *src, ot_dtype d, int64_t n);

/* Read one integer index (int32 / int64) as int64. */
static inline int64_t ot_load_index(const void *base, ot_dtype d, int64_t i) {
  return d == OT_I32 ? (int64_t)((const int32_t *)base)[i] : ((const int64_t *)base)[i];
}

/* Element pointer arithmetic. */
static inline void *ot_ptr(void *base, ot_dtype d, int64_t elem_offset) {
  return (char *)base + elem_offset * (int64_t)ot_dtype_size(d);
}

#ifdef __cplusplus
}
#endif

#endif /* OT_CORE_INTERNAL_H */
