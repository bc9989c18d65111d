/*
 * glu.c -- CPU kernels of SwiGLU / GeGLU (forward and backward).
 *
 * Elementwise over [rows, F]: the work is cut into (row, chunk of OT_GLU_CHUNK
 * features) tasks so one long row still spreads over threads. Each task loads its
 * chunk of every input into float32 scratch before it stores anything, which is what
 * makes the exact in-place aliasing (dgate == gate, dup == up) safe.
 */
#include <math.h>

#include "core/glu.h"
#include "cpu/threads.h"
#include "vec_math.h"

#define OT_GLU_CHUNK 512

/* sqrt(2/pi) and the cubic coefficient of the tanh GELU; 1/sqrt(2); 1/sqrt(2 pi). */
#define GELU_K0 0.7978845608028654f
#define GELU_K1 0.044715f
#define INV_SQRT2 0.7071067811865476f
#define INV_SQRT_2PI 0.3989422804014327f

/* Phi(x), the standard normal CDF, branch-free so GeGLU's loops vectorize (libm's
 * erfcf is a call). With t = |x| / sqrt2 and u = 1 / (1 + t/2):
 *   erfc(t) = u exp(-t^2 + P(s)),  s = (2u - 7/6) / (5/6) in [-1, 1] for t in [0, 10],
 * P a degree-10 polynomial (Chebyshev interpolant of log(erfc(t) / u) + t^2, fitted
 * for this file; max error 1e-8 in the exponent, 1.5e-7 evaluated in float32). Both
 * tails are accurate in relative terms; the rounding of x^2 / 2 sets the error, which
 * grows with x^2: measured 7e-7 for |x| < 3, 2e-6 for |x| < 6; absolute error 1.5e-7.
 * (libm's erfcf is ~1 ulp but made GeGLU about 7x slower.) Beyond t = 10, exp
 * underflows to 0. */
static inline float normal_cdf(float x) {
  float t = fabsf(x) * INV_SQRT2;
  float u = 1.0f / (1.0f + 0.5f * t);
  float s = (2.0f * u - 7.0f / 6.0f) * (6.0f / 5.0f);
  float p = -2.413217420e-05f;
  p = p * s + 5.488488707e-05f;
  p = p * s + 1.330719282e-04f;
  p = p * s + -5.343771746e-04f;
  p = p * s + -2.787787610e-04f;
  p = p * s + 3.707520304e-03f;
  p = p * s + -1.044538672e-03f;
  p = p * s + -2.947034941e-02f;
  p = p * s + 1.574494621e-02f;
  p = p * s + 5.703071040e-01f;
  p = p * s + -5.585953511e-01f;
  /* t^2 = x^2 / 2 with a single rounding */
  float half_erfc = 0.5f * u * ot_exp_f32(p - 0.5f * (x * x));
  return x < 0.0f ? half_erfc : 1.0f - half_erfc;
}

/* gelu_tanh(g) = 0.5 g (1 + tanh(u)) = g * sigmoid(2u): the sigmoid form has no
 * cancellation for negative g, unlike 1 + tanh(u). */
OT_CLONES static void glu_forward_chunk(ot_glu_kind kind, const float *restrict g,
                                        const float *restrict u, float *restrict out, int n) {
  switch (kind) {
    case OT_GLU_SWIGLU:
      for (int i = 0; i < n; i++) out[i] = g[i] / (1.0f + ot_exp_f32(-g[i])) * u[i];
      break;
    case OT_GLU_GEGLU:
      for (int i = 0; i < n; i++) out[i] = g[i] * normal_cdf(g[i]) * u[i];
      break;
    case OT_GLU_GEGLU_TANH:
      for (int i = 0; i < n; i++) {
        float x = g[i], two_u = 2.0f * GELU_K0 * (x + GELU_K1 * x * x * x);
        out[i] = x / (1.0f + ot_exp_f32(-two_u)) * u[i];
      }
      break;
  }
}

/* dg = dout * up * act'(g), du = dout * act(g). */
OT_CLONES static void glu_backward_chunk(ot_glu_kind kind, const float *restrict dout,
                                         const float *restrict g, const float *restrict u,
                                         float *restrict dg, float *restrict du, int n) {
  switch (kind) {
    case OT_GLU_SWIGLU:
      for (int i = 0; i < n; i++) {
        float x = g[i], s = 1.0f / (1.0f + ot_exp_f32(-x));
        float act = x * s, dact = s * (1.0f + x * (1.0f - s));
        dg[i] = dout[i] * u[i] * dact;
        du[i] = dout[i] * act;
      }
      break;
    case OT_GLU_GEGLU:
      for (int i = 0; i < n; i++) {
        float x = g[i], cdf = normal_cdf(x);
        float pdf = INV_SQRT_2PI * ot_exp_f32(-0.5f * x * x);
        dg[i] = dout[i] * u[i] * (cdf + x * pdf);
        du[i] = dout[i] * x * cdf;
      }
      break;
    case OT_GLU_GEGLU_TANH:
      for (int i = 0; i < n; i++) {
        float x = g[i], x2 = x * x;
        float two_u = 2.0f * GELU_K0 * (x + GELU_K1 * x2 * x);
        float s = 1.0f / (1.0f + ot_exp_f32(-two_u));
        float dtwo_u = 2.0f * GELU_K0 * (1.0f + 3.0f * GELU_K1 * x2);
        dg[i] = dout[i] * u[i] * (s + x * s * (1.0f - s) * dtwo_u);
        du[i] = dout[i] * x * s;
      }
      break;
  }
}

static const char *row_ptr(const void *base, ot_dtype d, int64_t row, int64_t stride,
                           int64_t col) {
  return (const char *)base + (row * stride + col) * (int64_t)ot_dtype_size(d);
}

ot_status ot_cpu_glu_forward(ot_context *ctx, const ot_glu_forward_args *a) {
  const int64_t nch = (a->F + OT_GLU_CHUNK - 1) / OT_GLU_CHUNK, tasks = a->rows * nch;
  const ot_dtype dt = a->dtype;
  const int nt = ot_cpu_threads_cap(ctx, a->rows * a->F, tasks);
#pragma omp parallel for num_threads(nt) schedule(static) if (nt > 1)
  for (int64_t t = 0; t < tasks; t++) {
    float g[OT_GLU_CHUNK], u[OT_GLU_CHUNK], o[OT_GLU_CHUNK];
    int64_t r = t / nch, c = (t % nch) * OT_GLU_CHUNK;
    int n = (int)(a->F - c < OT_GLU_CHUNK ? a->F - c : OT_GLU_CHUNK);
    ot_load_f32(g, row_ptr(a->gate, dt, r, a->gate_stride, c), dt, n);
    ot_load_f32(u, row_ptr(a->up, dt, r, a->up_stride, c), dt, n);
    glu_forward_chunk(a->kind, g, u, o, n);
    ot_store_f32((void *)row_ptr(a->out, dt, r, a->out_stride, c), o, dt, n);
  }
  return OT_OK;
}

ot_status ot_cpu_glu_backward(ot_context *ctx, const ot_glu_backward_args *a) {
  const int64_t nch = (a->F + OT_GLU_CHUNK - 1) / OT_GLU_CHUNK, tasks = a->rows * nch;
  const ot_dtype dt = a->dtype;
  const int nt = ot_cpu_threads_cap(ctx, a->rows * a->F, tasks);
#pragma omp parallel for num_threads(nt) schedule(static) if (nt > 1)
  for (int64_t t = 0; t < tasks; t++) {
    float d[OT_GLU_CHUNK], g[OT_GLU_CHUNK], u[OT_GLU_CHUNK], dg[OT_GLU_CHUNK], du[OT_GLU_CHUNK],
        o[OT_GLU_CHUNK];
    int64_t r = t / nch, c = (t % nch) * OT_GLU_CHUNK;
    int n = (int)(a->F - c < OT_GLU_CHUNK ? a->F - c : OT_GLU_CHUNK);
    ot_load_f32(d, row_ptr(a->dout, dt, r, a->dout_stride, c), dt, n);
    ot_load_f32(g, row_ptr(a->gate, dt, r, a->gate_stride, c), dt, n);
    ot_load_f32(u, row_ptr(a->up, dt, r, a->up_stride, c), dt, n);
    glu_backward_chunk(a->kind, d, g, u, dg, du, n);
    if (a->out) glu_forward_chunk(a->kind, g, u, o, n); /* the forward's values */
    /* Every input of this chunk is in scratch: in-place stores are safe now. */
    ot_store_f32((void *)row_ptr(a->dgate, dt, r, a->dgate_stride, c), dg, dt, n);
    ot_store_f32((void *)row_ptr(a->dup, dt, r, a->dup_stride, c), du, dt, n);
    if (a->out) ot_store_f32((void *)row_ptr(a->out, dt, r, a->out_stride, c), o, dt, n);
  }
  return OT_OK;
}
