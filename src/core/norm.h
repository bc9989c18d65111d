/*
 * norm.h -- private: the validated arguments of RMSNorm and LayerNorm (forward and
 * backward, with the optional fused residual add) and their backend entry points.
 *
 * Every tensor is read as rows x cols (cols = H, the hidden size); row strides are in
 * elements, the last dimension is contiguous. All [..., H] tensors share one storage
 * dtype; rstd / mean are float32 with one value per row, contiguous.
 */
#ifndef OT_CORE_NORM_H
#define OT_CORE_NORM_H

#include "internal.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct ot_norm_forward_args {
  ot_dtype dtype;           /* storage of x, residual, weight, bias, out, residual_out */
  int64_t rows, cols;       /* cols >= 1 */
  const void *x;            /* [rows, cols], row stride x_stride */
  int64_t x_stride;
  const void *residual;     /* NULL: unfused, h = x */
  int64_t residual_stride;
  const void *weight;       /* [cols] or NULL (= 1) */
  const void *bias;         /* [cols] or NULL (= 0); LayerNorm only */
  float eps;                /* finite, >= 0 */
  void *out;                /* [rows, cols]; may be x (same view) */
  int64_t out_stride;
  void *residual_out;       /* [rows, cols] when residual != NULL; may be x or residual */
  int64_t residual_out_stride;
  float *mean;              /* [rows] or NULL (not saved); LayerNorm only */
  float *rstd;              /* [rows] or NULL (not saved) */
} ot_norm_forward_args;

typedef struct ot_norm_backward_args {
  ot_dtype dtype;
  int64_t rows, cols;
  const void *dy;           /* [rows, cols] gradient of out */
  int64_t dy_stride;
  const void *dresidual_out; /* [rows, cols] or NULL: added to dx */
  int64_t dresidual_out_stride;
  const void *h;            /* [rows, cols] the normalized input */
  int64_t h_stride;
  const void *weight;       /* [cols] or NULL (= 1) */
  const float *mean;        /* [rows] or NULL (recomputed from h); LayerNorm only */
  const float *rstd;        /* [rows] or NULL (recomputed from h) */
  float eps;
  void *dx;                 /* [rows, cols]; may be dy or dresidual_out (same view) */
  int64_t dx_stride;
  void *dweight;            /* [cols] or NULL; overwritten */
  void *dbias;              /* [cols] or NULL; overwritten; LayerNorm only */
} ot_norm_backward_args;

ot_status ot_cpu_rmsnorm_forward(ot_context *ctx, const ot_norm_forward_args *a);
ot_status ot_cpu_rmsnorm_backward(ot_context *ctx, const ot_norm_backward_args *a);

/* The CPU backward's row function: rows [r0, r1) with the thread's scratch s (2 padded
 * rows), the float32 weight (or NULL) and the thread's dweight / dbias partials (NULL
 * when not wanted) to accumulate into. */
typedef void (*ot_norm_backward_rows_fn)(const ot_norm_backward_args *a, int64_t r0, int64_t r1,
                                         float *s, const float *w, float *dw, float *db);
/* Splits rows over threads, runs rows_fn, adds the partials in thread order and rounds
 * them into a->dweight / a->dbias (src/cpu/norm_backward.c). */
ot_status ot_cpu_norm_backward_driver(ot_context *ctx, const ot_norm_backward_args *a,
                                      const char *op, ot_norm_backward_rows_fn rows_fn);
ot_status ot_cpu_layernorm_forward(ot_context *ctx, const ot_norm_forward_args *a);
ot_status ot_cpu_layernorm_backward(ot_context *ctx, const ot_norm_backward_args *a);

/* Defined in src/cuda/ (a later issue); the core does not call them yet. */
ot_status ot_cuda_rmsnorm_forward(ot_context *ctx, const ot_norm_forward_args *a);
ot_status ot_cuda_rmsnorm_backward(ot_context *ctx, const ot_norm_backward_args *a);
ot_status ot_cuda_layernorm_forward(ot_context *ctx, const ot_norm_forward_args *a);
ot_status ot_cuda_layernorm_backward(ot_context *ctx, const ot_norm_backward_args *a);


/* ------------------------------------------------------------------------------ */
/* Row helpers shared by the CPU kernels of this family (src/cpu/rmsnorm.c,        */
/* src/cpu/layernorm.c). Inline so that they are compiled inside each kernel's     */
/* target clones (AVX-512 / AVX2+F16C / baseline).                                 */
#if !defined(__CUDACC__)

#if defined(__GNUC__) && defined(__x86_64__) && !defined(__clang__) && defined(__linux__)
#define OT_NORM_CLONES \
  __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else
#define OT_NORM_CLONES
#endif

/* Sums are taken in 16 float32 lanes (lane j holds elements i with i % 16 == j) and
 * folded pairwise, so that the compiler can keep them in vector registers and the
 * result does not depend on which clone runs: the forward and a backward that
 * recomputes rstd / mean from h get the same bits. */
#define OT_NORM_LANES 16

static inline float ot_norm_fold(float *acc, float tail) {
  for (int w = OT_NORM_LANES / 2; w >= 1; w /= 2)
    for (int j = 0; j < w; j++) acc[j] += acc[j + w];
  return acc[0] + tail;
}

/* sum(v) */
static inline float ot_norm_sum(const float *v, int64_t n) {
  float acc[OT_NORM_LANES] = {0}, tail = 0.0f;
  int64_t i = 0;
  for (; i + OT_NORM_LANES <= n; i += OT_NORM_LANES)
    for (int j = 0; j < OT_NORM_LANES; j++) acc[j] += v[i + j];
  for (; i < n; i++) tail += v[i];
  return ot_norm_fold(acc, tail);
}

/* sum((v - c)^2) */
static inline float ot_norm_sum_sq(const float *v, float c, int64_t n) {
  float acc[OT_NORM_LANES] = {0}, tail = 0.0f;
  int64_t i = 0;
  for (; i + OT_NORM_LANES <= n; i += OT_NORM_LANES)
    for (int j = 0; j < OT_NORM_LANES; j++) {
      float d = v[i + j] - c;
      acc[j] += d * d;
    }
  for (; i < n; i++) tail += (v[i] - c) * (v[i] - c);
  return ot_norm_fold(acc, tail);
}

/* sum(a * b) */
static inline float ot_norm_dot(const float *a, const float *b, int64_t n) {
  float acc[OT_NORM_LANES] = {0}, tail = 0.0f;
  int64_t i = 0;
  for (; i + OT_NORM_LANES <= n; i += OT_NORM_LANES)
    for (int j = 0; j < OT_NORM_LANES; j++) acc[j] += a[i + j] * b[i + j];
  for (; i < n; i++) tail += a[i] * b[i];
  return ot_norm_fold(acc, tail);
}

/* Storage row -> float32 scratch. */
static inline void ot_norm_load_row(float *restrict dst, const void *restrict src, ot_dtype d,
                                    int64_t n) {
  if (d == OT_F32) {
    const float *s = (const float *)src;
    for (int64_t i = 0; i < n; i++) dst[i] = s[i];
  } else if (d == OT_BF16) {
    const uint16_t *s = (const uint16_t *)src;
    for (int64_t i = 0; i < n; i++) dst[i] = ot_bf16_to_f32(s[i]);
  } else {
    /* GCC does not vectorize _Float16 conversions; the shared row conversion has the
     * F16C path. */
    ot_load_f32(dst, src, d, n);
  }
}

/* float32 scratch -> storage row, rounding to nearest even. */
static inline void ot_norm_store_row(void *restrict dst, const float *restrict src, ot_dtype d,
                                     int64_t n) {
  if (d == OT_F32) {
    float *o = (float *)dst;
    for (int64_t i = 0; i < n; i++) o[i] = src[i];
  } else if (d == OT_BF16) {
    uint16_t *o = (uint16_t *)dst;
    for (int64_t i = 0; i < n; i++) o[i] = ot_f32_to_bf16(src[i]);
  } else {
    ot_store_f32(dst, src, d, n);
  }
}

/* h = x (+ residual, rounded to storage and written to residual_out) as float32. */
static inline void ot_norm_load_h(float *restrict h, float *restrict tmp,
                                  const ot_norm_forward_args *a, int64_t row) {
  int64_t n = a->cols;
  size_t es = ot_dtype_size(a->dtype);
  ot_norm_load_row(h, (const char *)a->x + row * a->x_stride * (int64_t)es, a->dtype, n);
  if (!a->residual) return;
  ot_norm_load_row(tmp, (const char *)a->residual + row * a->residual_stride * (int64_t)es,
                   a->dtype, n);
  for (int64_t i = 0; i < n; i++) h[i] += tmp[i];
  void *ro = (char *)a->residual_out + row * a->residual_out_stride * (int64_t)es;
  ot_norm_store_row(ro, h, a->dtype, n);
  /* The norm is of the stored (rounded) h; the row is still in L1. */
  if (a->dtype != OT_F32) ot_norm_load_row(h, ro, a->dtype, n);
}

/* Rows [r0, r1) of thread t of nt: contiguous static blocks, so that per-thread
 * partial sums (dweight, dbias) are deterministic for a given thread count. */
static inline void ot_norm_block(int64_t rows, int t, int nt, int64_t *r0, int64_t *r1) {
  *r0 = rows * t / nt;
  *r1 = rows * (t + 1) / nt;
}

/* Floats of scratch rounded up to a 64-byte multiple, so that threads' blocks do not
 * share cache lines. */
static inline int64_t ot_norm_pad(int64_t n) { return (n + 15) / 16 * 16; }

#endif /* !__CUDACC__ */

#ifdef __cplusplus
}
#endif

#endif /* OT_CORE_NORM_H */
