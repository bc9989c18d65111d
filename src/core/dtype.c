/* dtype.c -- dtype names and the float32 <-> storage row conversions. */
#include <math.h>
#include <stdio.h>

#include "internal.h"

ot_dtype ot_dtype_from_dl(DLDataType t) {
  if (t.lanes != 1) return OT_DTYPE_INVALID;
  switch (t.code) {
    case kDLFloat:
      if (t.bits == 32) return OT_F32;
      if (t.bits == 16) return OT_F16;
      break;
    case kDLBfloat:
      if (t.bits == 16) return OT_BF16;
      break;
    case kDLInt:
      if (t.bits == 32) return OT_I32;
      if (t.bits == 64) return OT_I64;
      break;
    default: break;
  }
  return OT_DTYPE_INVALID;
}

const char *ot_dtype_name(ot_dtype d) {
  switch (d) {
    case OT_F32: return "float32";
    case OT_F16: return "float16";
    case OT_BF16: return "bfloat16";
    case OT_I32: return "int32";
    case OT_I64: return "int64";
    default: return "invalid";
  }
}

const char *ot_dl_dtype_name(DLDataType t) {
  static _Thread_local char buf[48];
  const char *base = "unknown";
  switch (t.code) {
    case kDLInt: base = "int"; break;
    case kDLUInt: base = "uint"; break;
    case kDLFloat: base = "float"; break;
    case kDLBfloat: base = "bfloat"; break;
    case kDLOpaqueHandle: base = "opaque"; break;
    case kDLComplex: base = "complex"; break;
    default: break;
  }
  if (t.lanes == 1)
    snprintf(buf, sizeof buf, "%s%u", base, (unsigned)t.bits);
  else
    snprintf(buf, sizeof buf, "%s%ux%u", base, (unsigned)t.bits, (unsigned)t.lanes);
  return buf;
}

size_t ot_dtype_size(ot_dtype d) {
  switch (d) {
    case OT_F32: case OT_I32: return 4;
    case OT_F16: case OT_BF16: return 2;
    case OT_I64: return 8;
    default: return 0;
  }
}

/* IEEE half <-> float by bit manipulation, for compilers without _Float16. */
float ot_f16_to_f32_slow(uint16_t h) {
  uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1fu;
  uint32_t man = h & 0x3ffu;
  uint32_t u;
  if (exp == 0) {
    if (man == 0) {
      u = sign;
    } else { /* subnormal: normalize */
      int e = -1;
      do { e++; man <<= 1; } while ((man & 0x400u) == 0);
      u = sign | ((uint32_t)(127 - 15 - e) << 23) | ((man & 0x3ffu) << 13);
    }
  } else if (exp == 31) {
    u = sign | 0x7f800000u | (man << 13) | (man ? 0x400000u : 0u);
  } else {
    u = sign | ((exp + 127 - 15) << 23) | (man << 13);
  }
  float f;
  memcpy(&f, &u, sizeof f);
  return f;
}

uint16_t ot_f32_to_f16_slow(float f) {
  uint32_t u;
  memcpy(&u, &f, sizeof u);
  uint16_t sign = (uint16_t)((u >> 16) & 0x8000u);
  uint32_t a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return (uint16_t)(sign | 0x7e00u);           /* NaN */
  if (a >= 0x477ff000u) return (uint16_t)(sign | 0x7c00u);          /* overflow -> inf */
  if (a < 0x33000001u) return sign;                                 /* underflow -> 0 */
  int32_t e = (int32_t)(a >> 23) - 127 + 15;
  uint32_t man = (a & 0x7fffffu) | 0x800000u;
  uint32_t shift = e >= 1 ? 13u : (uint32_t)(14 - e);
  uint32_t half_man = man >> shift;
  uint32_t rem = man & ((1u << shift) - 1u);
  uint32_t halfway = 1u << (shift - 1);
  if (rem > halfway || (rem == halfway && (half_man & 1u))) half_man++;
  if (e >= 1) return (uint16_t)(sign | (((uint32_t)e << 10) + (half_man - 0x400u)));
  return (uint16_t)(sign | half_man);
}

/* Row conversions. They sit on every CPU kernel's hot path, and the library is built
 * for baseline x86-64, so the loops are compiled several times and picked at run time:
 * bf16 is integer shifts that vectorize under any ISA level; fp16 uses the F16C
 * conversion instructions where the CPU has them (GCC does not vectorize _Float16
 * conversions by itself). */
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#include <immintrin.h>
#define OT_ROW_CLONES __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#define OT_HAVE_F16C_PATH 1
#else
#define OT_ROW_CLONES
#define OT_HAVE_F16C_PATH 0
#endif

OT_ROW_CLONES static void load_bf16(float *restrict dst, const uint16_t *restrict s, int64_t n) {
  for (int64_t i = 0; i < n; i++) {
    uint32_t u = (uint32_t)s[i] << 16;
    memcpy(&dst[i], &u, sizeof u);
  }
}

OT_ROW_CLONES static void store_bf16(uint16_t *restrict o, const float *restrict src, int64_t n) {
  for (int64_t i = 0; i < n; i++) {
    uint32_t u;
    memcpy(&u, &src[i], sizeof u);
    /* NaN keeps its sign and becomes quiet; others round to nearest even. */
    uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
    uint32_t nan = (u >> 16) | 0x0040u;
    o[i] = (uint16_t)((u & 0x7fffffffu) > 0x7f800000u ? nan : rounded);
  }
}

#if OT_HAVE_F16C_PATH
__attribute__((target("avx2,f16c"))) static void load_f16_f16c(float *restrict dst,
                                                                const uint16_t *restrict s,
                                                                int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(s + i))));
  for (; i < n; i++) dst[i] = ot_f16_to_f32(s[i]);
}

__attribute__((target("avx2,f16c"))) static void store_f16_f16c(uint16_t *restrict o,
                                                                 const float *restrict src,
                                                                 int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    _mm_storeu_si128((__m128i *)(o + i),
                     _mm256_cvtps_ph(_mm256_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT));
  for (; i < n; i++) o[i] = ot_f32_to_f16(src[i]);
}

static int have_f16c(void) {
  static int cached = -1;
  if (cached < 0) {
    __builtin_cpu_init();
    cached = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("f16c");
  }
  return cached;
}
#endif

void ot_load_f32(float *restrict dst, const void *restrict src, ot_dtype d, int64_t n) {
  switch (d) {
    case OT_F32: memcpy(dst, src, (size_t)n * sizeof(float)); break;
    case OT_BF16: load_bf16(dst, (const uint16_t *)src, n); break;
    case OT_F16: {
#if OT_HAVE_F16C_PATH
      if (have_f16c()) {
        load_f16_f16c(dst, (const uint16_t *)src, n);
        break;
      }
#endif
      const uint16_t *s = (const uint16_t *)src;
      for (int64_t i = 0; i < n; i++) dst[i] = ot_f16_to_f32(s[i]);
      break;
    }
    default: break;
  }
}

void ot_store_f32(void *restrict dst, const float *restrict src, ot_dtype d, int64_t n) {
  switch (d) {
    case OT_F32: memcpy(dst, src, (size_t)n * sizeof(float)); break;
    case OT_BF16: store_bf16((uint16_t *)dst, src, n); break;
    case OT_F16: {
#if OT_HAVE_F16C_PATH
      if (have_f16c()) {
        store_f16_f16c((uint16_t *)dst, src, n);
        break;
      }
#endif
      uint16_t *o = (uint16_t *)dst;
      for (int64_t i = 0; i < n; i++) o[i] = ot_f32_to_f16(src[i]);
      break;
    }
    default: break;
  }
}
