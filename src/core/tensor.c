/* tensor.c -- validation of DLTensor arguments into ot_view, shared by every op. */
#include <inttypes.h>
#include <stdio.h>

#include "internal.h"

static const char *device_name(DLDeviceType t) {
  switch (t) {
    case kDLCPU: return "cpu";
    case kDLCUDA: return "cuda";
    case kDLCUDAHost: return "cuda_host";
    case kDLCUDAManaged: return "cuda_managed";
    default: return "other";
  }
}

/* Formats a shape as "[2, 3, 4]" into a thread-local buffer (one of two, so two
 * shapes can appear in one message). */
static const char *shape_str(const ot_view *v) {
  static _Thread_local char bufs[2][160];
  static _Thread_local int which;
  char *b = bufs[which ^= 1];
  size_t n = 0;
  n += (size_t)snprintf(b + n, sizeof bufs[0] - n, "[");
  for (int i = 0; i < v->ndim && n < sizeof bufs[0] - 24; i++)
    n += (size_t)snprintf(b + n, sizeof bufs[0] - n, i ? ", %" PRId64 : "%" PRId64, v->shape[i]);
  snprintf(b + n, sizeof bufs[0] - n, "]");
  return b;
}

ot_status ot_view_of(const char *op, const char *name, const ot_context *ctx, const DLTensor *t,
                     ot_view *v) {
  if (!t) return ot_error(OT_ERR_INVALID_ARGUMENT, op, "%s: tensor is NULL", name);
  v->ndim = -1;
  v->dtype = ot_dtype_from_dl(t->dtype);
  if (v->dtype == OT_DTYPE_INVALID)
    return ot_error(OT_ERR_INVALID_ARGUMENT, op,
                    "%s: dtype %s is not supported (expected float32, float16, bfloat16, int32 "
                    "or int64)",
                    name, ot_dl_dtype_name(t->dtype));
  if (t->ndim < 0 || t->ndim > OT_MAX_DIMS)
    return ot_error(OT_ERR_INVALID_ARGUMENT, op, "%s: ndim %d is outside [0, %d]", name, t->ndim,
                    OT_MAX_DIMS);
  if (t->ndim > 0 && !t->shape)
    return ot_error(OT_ERR_INVALID_ARGUMENT, op, "%s: shape is NULL", name);
  DLDeviceType want = ctx->device.device_type;
  bool dev_ok = t->device.device_type == want ||
                (want == kDLCPU && t->device.device_type == kDLCUDAHost);
  if (!dev_ok || (want == kDLCUDA && t->device.device_id != ctx->device.device_id))
    return ot_error(OT_ERR_INVALID_ARGUMENT, op,
                    "%s: tensor is on device %s:%d but the context runs on %s:%d", name,
                    device_name(t->device.device_type), t->device.device_id,
                    device_name(want), ctx->device.device_id);
  /* Element counts and offsets stay below 2^59 (bytes below 2^63 for every dtype), so
   * that no size computed from a view -- here, in the checks or in a kernel -- wraps. The
   * product of the non-zero dimensions is bounded too: the contiguous strides of an empty
   * tensor are products of its other dimensions. */
  const int64_t lim = (int64_t)1 << 59;
  int64_t numel = 1, span = 1;
  for (int i = 0; i < t->ndim; i++) {
    if (t->shape[i] < 0)
      return ot_error(OT_ERR_INVALID_ARGUMENT, op, "%s: shape[%d] = %" PRId64 " is negative",
                      name, i, t->shape[i]);
    v->shape[i] = t->shape[i];
    if (t->shape[i] > 1 && span > lim / t->shape[i])
      return ot_error(OT_ERR_INVALID_ARGUMENT, op,
                      "%s: shape[%d] = %" PRId64 ": the product of the dimensions exceeds 2^59 "
                      "elements",
                      name, i, t->shape[i]);
    if (t->shape[i] > 1) span *= t->shape[i];
    numel *= t->shape[i];
  }
  if (t->strides) {
    int64_t reach = 0; /* the largest element offset: sum of (shape - 1) * stride */
    for (int i = 0; i < t->ndim; i++) {
      if (t->strides[i] < 0 && t->shape[i] > 1)
        return ot_error(OT_ERR_INVALID_ARGUMENT, op,
                        "%s: stride[%d] = %" PRId64 " is negative (not supported)", name, i,
                        t->strides[i]);
      v->stride[i] = t->strides[i];
      if (numel > 0 && t->shape[i] > 1 && t->strides[i] > 0) {
        if (t->strides[i] > (lim - reach) / (t->shape[i] - 1))
          return ot_error(OT_ERR_INVALID_ARGUMENT, op,
                          "%s: stride[%d] = %" PRId64 " with shape[%d] = %" PRId64
                          " reaches past 2^59 elements",
                          name, i, t->strides[i], i, t->shape[i]);
        reach += (t->shape[i] - 1) * t->strides[i];
      }
    }
  } else {
    int64_t s = 1;
    for (int i = t->ndim - 1; i >= 0; i--) {
      v->stride[i] = s;
      s *= t->shape[i];
    }
  }
  v->ndim = t->ndim;
  v->numel = numel;
  v->data = (char *)t->data + t->byte_offset;
  if (numel > 0 && !t->data)
    return ot_error(OT_ERR_INVALID_ARGUMENT, op, "%s: data is NULL", name);
  size_t es = ot_dtype_size(v->dtype);
  if (numel > 0 && ((uintptr_t)v->data % es) != 0)
    return ot_error(OT_ERR_INVALID_ARGUMENT, op,
                    "%s: data pointer %p is not aligned to its element size (%zu bytes)", name,
                    v->data, es);
  return OT_OK;
}

ot_status ot_view_of_optional(const char *op, const char *name, const ot_context *ctx,
                              const DLTensor *t, ot_view *v) {
  if (!t) {
    memset(v, 0, sizeof *v);
    v->ndim = -1;
    return OT_OK;
  }
  return ot_view_of(op, name, ctx, t, v);
}

ot_status ot_check_ndim(const char *op, const char *name, const ot_view *v, int min_ndim,
                        int max_ndim) {
  if (v->ndim < min_ndim || v->ndim > max_ndim) {
    if (min_ndim == max_ndim)
      return ot_error(OT_ERR_INVALID_ARGUMENT, op, "%s: expected %d dimensions, got %d (shape %s)",
                      name, min_ndim, v->ndim, shape_str(v));
    return ot_error(OT_ERR_INVALID_ARGUMENT, op,
                    "%s: expected %d to %d dimensions, got %d (shape %s)", name, min_ndim,
                    max_ndim, v->ndim, shape_str(v));
  }
  return OT_OK;
}

ot_status ot_check_float(const char *op, const char *name, const ot_view *v) {
  if (!ot_dtype_is_float(v->dtype))
    return ot_error(OT_ERR_INVALID_ARGUMENT, op,
                    "%s: dtype %s is not a floating storage type (float32, float16, bfloat16)",
                    name, ot_dtype_name(v->dtype));
  return OT_OK;
}

ot_status ot_check_dtype(const char *op, const char *name, const ot_view *v, ot_dtype dtype,
                         const char *ref_name) {
  if (v->dtype == dtype) return OT_OK;
  if (ref_name)
    return ot_error(OT_ERR_INVALID_ARGUMENT, op, "%s: dtype %s does not match %s dtype %s", name,
                    ot_dtype_name(v->dtype), ref_name, ot_dtype_name(dtype));
  return ot_error(OT_ERR_INVALID_ARGUMENT, op, "%s: dtype %s, expected %s", name,
                  ot_dtype_name(v->dtype), ot_dtype_name(dtype));
}

ot_status ot_check_index_dtype(const char *op, const char *name, const ot_view *v) {
  if (v->dtype != OT_I32 && v->dtype != OT_I64)
    return ot_error(OT_ERR_INVALID_ARGUMENT, op, "%s: dtype %s, expected int32 or int64", name,
                    ot_dtype_name(v->dtype));
  return OT_OK;
}

ot_status ot_check_same_shape(const char *op, const char *name, const ot_view *v,
                              const char *ref_name, const ot_view *ref) {
  bool same = v->ndim == ref->ndim;
  for (int i = 0; same && i < v->ndim; i++) same = v->shape[i] == ref->shape[i];
  if (!same)
    return ot_error(OT_ERR_INVALID_ARGUMENT, op, "%s: shape %s does not match %s shape %s", name,
                    shape_str(v), ref_name, shape_str(ref));
  return OT_OK;
}

ot_status ot_check_dim(const char *op, const char *name, const ot_view *v, int dim, int64_t size,
                       const char *what) {
  if (dim < 0) dim += v->ndim;
  if (dim < 0 || dim >= v->ndim || v->shape[dim] != size)
    return ot_error(OT_ERR_INVALID_ARGUMENT, op,
                    "%s: shape %s: dimension %d must be %" PRId64 " (%s)", name, shape_str(v),
                    dim, size, what ? what : "size mismatch");
  return OT_OK;
}

ot_status ot_check_last_contiguous(const char *op, const char *name, const ot_view *v) {
  if (v->ndim > 0 && v->shape[v->ndim - 1] > 1 && v->stride[v->ndim - 1] != 1)
    return ot_error(OT_ERR_INVALID_ARGUMENT, op,
                    "%s: the last dimension must be contiguous (stride 1), got stride %" PRId64,
                    name, v->stride[v->ndim - 1]);
  return OT_OK;
}

ot_status ot_check_contiguous(const char *op, const char *name, const ot_view *v) {
  int64_t s = 1;
  for (int i = v->ndim - 1; i >= 0; i--) {
    if (v->shape[i] > 1 && v->stride[i] != s)
      return ot_error(OT_ERR_INVALID_ARGUMENT, op,
                      "%s: must be contiguous (row-major); dimension %d has stride %" PRId64
                      ", expected %" PRId64,
                      name, i, v->stride[i], s);
    s *= v->shape[i];
  }
  return OT_OK;
}

ot_status ot_as_rows(const char *op, const char *name, const ot_view *v, ot_rows *r) {
  if (v->ndim < 1)
    return ot_error(OT_ERR_INVALID_ARGUMENT, op, "%s: expected at least 1 dimension, got 0", name);
  OT_TRY(ot_check_last_contiguous(op, name, v));
  r->cols = v->shape[v->ndim - 1];
  r->rows = 1;
  for (int i = 0; i < v->ndim - 1; i++) r->rows *= v->shape[i];
  /* The row stride is the stride of the innermost leading dim of size > 1; every
   * outer leading dim of size > 1 must then step by whole multiples of it. */
  int64_t row_stride = r->cols;
  int64_t expect = -1;
  for (int i = v->ndim - 2; i >= 0; i--) {
    if (v->shape[i] <= 1) continue;
    if (expect < 0) {
      row_stride = v->stride[i];
      expect = v->stride[i] * v->shape[i];
    } else {
      if (v->stride[i] != expect)
        return ot_error(OT_ERR_INVALID_ARGUMENT, op,
                        "%s: leading dimensions must collapse into rows with one stride; "
                        "dimension %d has stride %" PRId64 ", expected %" PRId64,
                        name, i, v->stride[i], expect);
      expect *= v->shape[i];
    }
  }
  if (r->rows > 1 && row_stride < r->cols)
    return ot_error(OT_ERR_INVALID_ARGUMENT, op,
                    "%s: row stride %" PRId64 " is smaller than the row length %" PRId64
                    " (rows overlap)",
                    name, row_stride, r->cols);
  r->row_stride = row_stride;
  return OT_OK;
}

void ot_view_extent(const ot_view *v, uintptr_t *lo, uintptr_t *hi) {
  if (v->ndim < 0 || v->numel == 0 || !v->data) {
    *lo = *hi = 0;
    return;
  }
  int64_t last = 0;
  for (int i = 0; i < v->ndim; i++) last += (v->shape[i] - 1) * v->stride[i];
  size_t es = ot_dtype_size(v->dtype);
  *lo = (uintptr_t)v->data;
  *hi = (uintptr_t)v->data + (uintptr_t)(last + 1) * es;
}

bool ot_view_same(const ot_view *a, const ot_view *b) {
  if (a->data != b->data || a->dtype != b->dtype || a->ndim != b->ndim) return false;
  for (int i = 0; i < a->ndim; i++) {
    if (a->shape[i] != b->shape[i]) return false;
    if (a->shape[i] > 1 && a->stride[i] != b->stride[i]) return false;
  }
  return true;
}

static int64_t gcd64(int64_t a, int64_t b) {
  while (b) {
    int64_t t = a % b;
    a = b;
    b = t;
  }
  return a;
}

/* Whether a and b provably share no element although their byte ranges interleave, as
 * slices of one packed buffer do (q, k, v of a [T, Hq + 2Hk, D] projection; the gate and
 * up halves of a [rows, 2F] one). Split the dims into outer ones and the `inner` last
 * ones: every outer step of either view is a multiple of p, the gcd of their outer
 * strides, so modulo p each view lives in one window [offset, offset + span) with span
 * the reach of its inner dims. Two windows that do not meet modulo p mean no common
 * element. Every split is tried, so [heads, D] blocks and [D] rows are both found. */
static bool ot_views_interleave_disjoint(const ot_view *a, const ot_view *b) {
  if (a->dtype != b->dtype || a->ndim != b->ndim || a->ndim < 2) return false;
  int64_t es = (int64_t)ot_dtype_size(a->dtype);
  int64_t diff = (int64_t)((intptr_t)b->data - (intptr_t)a->data);
  if (diff % es) return false;
  diff /= es;
  for (int inner = 1; inner < a->ndim; inner++) {
    int split = a->ndim - inner;
    int64_t p = 0;
    for (int i = 0; i < split; i++) {
      if (a->shape[i] > 1) p = gcd64(p, a->stride[i]);
      if (b->shape[i] > 1) p = gcd64(p, b->stride[i]);
    }
    if (p <= 0) continue;
    int64_t span_a = 1, span_b = 1;
    for (int i = split; i < a->ndim; i++) {
      span_a += (a->shape[i] - 1) * a->stride[i];
      span_b += (b->shape[i] - 1) * b->stride[i];
    }
    if (span_a + span_b > p) continue;
    int64_t r = ((diff % p) + p) % p;
    if (r >= span_a && r + span_b <= p) return true;
  }
  return false;
}

ot_status ot_check_no_overlap(const char *op, const char *out_name, const ot_view *out,
                              const char *in_name, const ot_view *in, bool allow_exact) {
  if (!ot_view_present(out) || !ot_view_present(in)) return OT_OK;
  uintptr_t a0, a1, b0, b1;
  ot_view_extent(out, &a0, &a1);
  ot_view_extent(in, &b0, &b1);
  if (a0 == a1 || b0 == b1 || a1 <= b0 || b1 <= a0) return OT_OK;
  if (allow_exact && ot_view_same(out, in)) return OT_OK;
  if (ot_views_interleave_disjoint(out, in)) return OT_OK;
  if (allow_exact)
    return ot_error(OT_ERR_INVALID_ARGUMENT, op,
                    "%s: overlaps %s without being the same view (only exact in-place aliasing "
                    "is allowed)",
                    out_name, in_name);
  return ot_error(OT_ERR_INVALID_ARGUMENT, op, "%s: must not overlap %s", out_name, in_name);
}

ot_status ot_check_no_self_overlap(const char *op, const char *name, const ot_view *v) {
  if (!ot_view_present(v) || v->numel == 0) return OT_OK;
  int idx[OT_MAX_DIMS], n = 0;
  for (int i = 0; i < v->ndim; i++)
    if (v->shape[i] > 1) idx[n++] = i;
  for (int i = 1; i < n; i++) /* insertion sort by stride */
    for (int j = i; j > 0 && v->stride[idx[j]] < v->stride[idx[j - 1]]; j--) {
      int t = idx[j];
      idx[j] = idx[j - 1];
      idx[j - 1] = t;
    }
  /* Sufficient: sorted by stride, each dim steps past everything the dims inside it reach. */
  int64_t extent = 0;
  for (int i = 0; i < n; i++) {
    int d = idx[i];
    if (v->stride[d] <= extent)
      return ot_error(OT_ERR_INVALID_ARGUMENT, op,
                      "%s: dimension %d has stride %" PRId64
                      " that makes elements overlap (an output needs distinct elements)",
                      name, d, v->stride[d]);
    extent += (v->shape[d] - 1) * v->stride[d];
  }
  return OT_OK;
}
