/* util.c -- the engine's error message, dtype conversions, DLTensor views and clock. */
#define _POSIX_C_SOURCE 200809L
#include <math.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "internal.h"

double ote_now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec * 1e-6;
}

static _Thread_local char ote_err_buf[1024];

const char *ote_last_error(void) { return ote_err_buf; }

ot_status ote_error(ot_status status, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(ote_err_buf, sizeof ote_err_buf, fmt, ap);
  va_end(ap);
  return status;
}

ot_status ote_op_error(ot_status status, const char *what) {
  return ote_error(status, "%s: %s", what, ot_last_error());
}

const DLDataType OTE_F32 = {kDLFloat, 32, 1};
const DLDataType OTE_F16 = {kDLFloat, 16, 1};
const DLDataType OTE_BF16 = {kDLBfloat, 16, 1};
const DLDataType OTE_I32 = {kDLInt, 32, 1};

size_t ote_dtype_size(DLDataType dt) { return (size_t)dt.bits / 8 * dt.lanes; }

bool ote_dtype_eq(DLDataType a, DLDataType b) {
  return a.code == b.code && a.bits == b.bits && a.lanes == b.lanes;
}

const char *ote_dtype_name(DLDataType dt) {
  if (ote_dtype_eq(dt, OTE_F32)) return "float32";
  if (ote_dtype_eq(dt, OTE_F16)) return "float16";
  if (ote_dtype_eq(dt, OTE_BF16)) return "bfloat16";
  if (ote_dtype_eq(dt, OTE_I32)) return "int32";
  return "unknown";
}

static float bf16_to_f32(uint16_t h) {
  uint32_t u = (uint32_t)h << 16;
  float f;
  memcpy(&f, &u, 4);
  return f;
}

static uint16_t f32_to_bf16(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40); /* quiet NaN */
  u += 0x7fffu + ((u >> 16) & 1u); /* round to nearest even */
  return (uint16_t)(u >> 16);
}

static float f16_to_f32(uint16_t h) {
  uint32_t sign = (uint32_t)(h & 0x8000u) << 16, exp = (h >> 10) & 0x1f, man = h & 0x3ffu, u;
  if (exp == 0) {
    if (man == 0) {
      u = sign;
    } else { /* subnormal: renormalize */
      float f = ldexpf((float)man, -24);
      return sign ? -f : f;
    }
  } else if (exp == 31) {
    u = sign | 0x7f800000u | (man << 13);
  } else {
    u = sign | ((exp + 112) << 23) | (man << 13);
  }
  float f;
  memcpy(&f, &u, 4);
  return f;
}

static uint16_t f32_to_f16(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  uint32_t sign = (u >> 16) & 0x8000u;
  uint32_t au = u & 0x7fffffffu;
  if (au > 0x7f800000u) return (uint16_t)(sign | 0x7e00u);
  if (au >= 0x477ff000u) return (uint16_t)(sign | 0x7c00u); /* overflow (rounds to inf) */
  if (au < 0x38800000u) { /* subnormal or zero: round to a multiple of 2^-24 */
    float a;
    memcpy(&a, &au, 4);
    float m = nearbyintf(a * 16777216.0f); /* default rounding: nearest even */
    return (uint16_t)(sign | (uint32_t)m);
  }
  uint32_t r = au + 0xfffu + ((au >> 13) & 1u) - (112u << 23);
  return (uint16_t)(sign | (r >> 13));
}

void ote_convert(void *dst, DLDataType dt, const void *src, DLDataType st, size_t n) {
  if (ote_dtype_eq(dt, st)) {
    memcpy(dst, src, n * ote_dtype_size(dt));
    return;
  }
  for (size_t i = 0; i < n; i++) {
    float f;
    if (ote_dtype_eq(st, OTE_F32)) {
      memcpy(&f, (const char *)src + 4 * i, 4);
    } else {
      uint16_t h;
      memcpy(&h, (const char *)src + 2 * i, 2);
      f = ote_dtype_eq(st, OTE_BF16) ? bf16_to_f32(h) : f16_to_f32(h);
    }
    if (ote_dtype_eq(dt, OTE_F32)) {
      memcpy((char *)dst + 4 * i, &f, 4);
    } else {
      uint16_t h = ote_dtype_eq(dt, OTE_BF16) ? f32_to_bf16(f) : f32_to_f16(f);
      memcpy((char *)dst + 2 * i, &h, 2);
    }
  }
}

void ote_view_set(ote_view *v, const ote_device *d, void *data, DLDataType dt, int ndim,
                  const int64_t *shape, const int64_t *strides) {
  memset(v, 0, sizeof *v);
  for (int i = 0; i < ndim; i++) {
    v->shape[i] = shape[i];
    if (strides) v->strides[i] = strides[i];
  }
  v->t.data = data;
  v->t.device = d->dev;
  v->t.ndim = ndim;
  v->t.dtype = dt;
  v->t.shape = v->shape;
  v->t.strides = strides ? v->strides : NULL;
  v->t.byte_offset = 0;
}
