/* rope.c -- validation and dispatch of ot_rope_forward and ot_rope_backward. */
#include <inttypes.h>
#include <math.h>
#include <stdio.h>

#include "backend.h"
#include "rope.h"

/* The forward and the backward validate the same way; only the names differ. */
typedef struct rope_names {
  const char *op, *q, *k, *q_out, *k_out;
} rope_names;

static const rope_names forward_names = {"ot_rope_forward", "q", "k", "q_out", "k_out"};
static const rope_names backward_names = {"ot_rope_backward", "dq_out", "dk_out", "dq", "dk"};

void ot_rope_inv_freq(const ot_rope_args *a, double *inv_freq) {
  const int64_t half = a->rotary_dim / 2;
  const double two_pi = 6.283185307179586476925;
  for (int64_t i = 0; i < half; i++) {
    double f = pow(a->theta, -(double)(2 * i) / (double)a->rotary_dim);
    if (a->llama3_factor > 0) {
      /* Meta's Llama 3.1 rule: keep the high frequencies, divide the low ones by the
       * factor, and blend linearly (in 1 / wavelength) between the two bands. */
      const double orig = a->llama3_original_max_position;
      const double low = a->llama3_low_freq_factor, high = a->llama3_high_freq_factor;
      const double wavelen = two_pi / f;
      const double low_freq_wavelen = orig / low, high_freq_wavelen = orig / high;
      if (wavelen < high_freq_wavelen) {
        /* unchanged */
      } else if (wavelen > low_freq_wavelen) {
        f = f / a->llama3_factor;
      } else {
        const double smooth = (orig / wavelen - low) / (high - low);
        f = (1.0 - smooth) * f / a->llama3_factor + smooth * f;
      }
    }
    inv_freq[i] = f;
  }
}

/* ------------------------------------------------------------------------------ */
/* Validation                                                                      */

static ot_status check_heads_tensor(const char *op, const char *name, const ot_view *v,
                                    const char *ref_name, const ot_view *ref) {
  OT_TRY(ot_check_dtype(op, name, v, ref->dtype, ref_name));
  OT_TRY(ot_check_ndim(op, name, v, ref->ndim, ref->ndim));
  for (int i = 0; i < ref->ndim - 2; i++)
    OT_TRY(ot_check_dim(op, name, v, i, ref->shape[i], "the leading (token) dimensions of q"));
  OT_TRY(ot_check_dim(op, name, v, -1, ref->shape[ref->ndim - 1], "head_dim of q"));
  return ot_check_last_contiguous(op, name, v);
}

static ot_rope_heads heads_of(const ot_view *v) {
  ot_rope_heads h;
  memset(&h, 0, sizeof h);
  if (!ot_view_present(v)) return h;
  h.data = v->data;
  h.heads = v->shape[v->ndim - 2];
  h.stride_h = v->stride[v->ndim - 2];
  h.stride_s = v->stride[v->ndim - 3];
  h.stride_b = v->ndim == 4 ? v->stride[0] : 0;
  return h;
}

static ot_status rope(const rope_names *nm, bool inverse, ot_context *ctx,
                      const ot_rope_params *params, const DLTensor *q_t, const DLTensor *k_t,
                      const DLTensor *pos_t, const DLTensor *cache_t, const DLTensor *q_out_t,
                      const DLTensor *k_out_t) {
  const char *op = nm->op;
  if (!ctx) return ot_error(OT_ERR_INVALID_ARGUMENT, op, "ctx: is NULL");
  if (!params) return ot_error(OT_ERR_INVALID_ARGUMENT, op, "params: is NULL");
  if (params->mode != OT_ROPE_NEOX && params->mode != OT_ROPE_GPTJ)
    return ot_error(OT_ERR_INVALID_ARGUMENT, op,
                    "params.mode: %d is not OT_ROPE_NEOX (0) or OT_ROPE_GPTJ (1)",
                    (int)params->mode);

  ot_view q, k, pos, cache, q_out, k_out;
  OT_TRY(ot_view_of(op, nm->q, ctx, q_t, &q));
  OT_TRY(ot_check_float(op, nm->q, &q));
  OT_TRY(ot_check_ndim(op, nm->q, &q, 3, 4));
  OT_TRY(ot_check_last_contiguous(op, nm->q, &q));
  const int64_t head_dim = q.shape[q.ndim - 1];

  if (params->rotary_dim < 0)
    return ot_error(OT_ERR_INVALID_ARGUMENT, op, "params.rotary_dim: %d is negative",
                    params->rotary_dim);
  const int64_t rd = params->rotary_dim ? params->rotary_dim : head_dim;
  if (rd > head_dim)
    return ot_error(OT_ERR_INVALID_ARGUMENT, op,
                    "params.rotary_dim: %" PRId64 " exceeds head_dim %" PRId64 " of %s", rd,
                    head_dim, nm->q);
  if (rd == 0)
    return ot_error(OT_ERR_INVALID_ARGUMENT, op,
                    "params.rotary_dim: 0 after defaulting to head_dim (%s has head_dim 0)",
                    nm->q);
  if (rd % 2)
    return ot_error(OT_ERR_INVALID_ARGUMENT, op, "params.rotary_dim: %" PRId64 " is odd",
                    rd);

  OT_TRY(ot_view_of_optional(op, nm->k, ctx, k_t, &k));
  if (ot_view_present(&k)) OT_TRY(check_heads_tensor(op, nm->k, &k, nm->q, &q));

  OT_TRY(ot_view_of(op, "positions", ctx, pos_t, &pos));
  OT_TRY(ot_check_index_dtype(op, "positions", &pos));
  OT_TRY(ot_check_ndim(op, "positions", &pos, q.ndim - 2, q.ndim - 2));
  for (int i = 0; i < q.ndim - 2; i++)
    OT_TRY(ot_check_dim(op, "positions", &pos, i, q.shape[i],
                        "the leading (token) dimensions of q"));

  OT_TRY(ot_view_of_optional(op, "cos_sin_cache", ctx, cache_t, &cache));
  if (ot_view_present(&cache)) {
    OT_TRY(ot_check_dtype(op, "cos_sin_cache", &cache, OT_F32, NULL));
    OT_TRY(ot_check_ndim(op, "cos_sin_cache", &cache, 2, 2));
    OT_TRY(ot_check_dim(op, "cos_sin_cache", &cache, 1, rd, "rotary_dim"));
    OT_TRY(ot_check_contiguous(op, "cos_sin_cache", &cache));
  } else {
    /* theta and the scaling matter only when cos / sin are computed here. */
    if (!(params->theta > 0) || !isfinite(params->theta))
      return ot_error(OT_ERR_INVALID_ARGUMENT, op,
                      "params.theta: %g, expected a finite value > 0", (double)params->theta);
    if (isnan(params->llama3_factor))
      return ot_error(OT_ERR_INVALID_ARGUMENT, op,
                      "params.llama3_factor: NaN (use <= 0 to disable the scaling)");
    if (params->llama3_factor > 0) {
      if (!(params->llama3_factor >= 1) || !isfinite(params->llama3_factor))
        return ot_error(OT_ERR_INVALID_ARGUMENT, op,
                        "params.llama3_factor: %g, expected a finite value >= 1 (or <= 0 to "
                        "disable the scaling)",
                        (double)params->llama3_factor);
      if (!(params->llama3_low_freq_factor > 0) || !isfinite(params->llama3_low_freq_factor))
        return ot_error(OT_ERR_INVALID_ARGUMENT, op,
                        "params.llama3_low_freq_factor: %g, expected a finite value > 0",
                        (double)params->llama3_low_freq_factor);
      if (!(params->llama3_high_freq_factor > params->llama3_low_freq_factor) ||
          !isfinite(params->llama3_high_freq_factor))
        return ot_error(OT_ERR_INVALID_ARGUMENT, op,
                        "params.llama3_high_freq_factor: %g, expected a finite value > "
                        "llama3_low_freq_factor (%g)",
                        (double)params->llama3_high_freq_factor,
                        (double)params->llama3_low_freq_factor);
      if (params->llama3_original_max_position <= 0)
        return ot_error(OT_ERR_INVALID_ARGUMENT, op,
                        "params.llama3_original_max_position: %d, expected > 0",
                        params->llama3_original_max_position);
    }
  }

  OT_TRY(ot_view_of(op, nm->q_out, ctx, q_out_t, &q_out));
  OT_TRY(ot_check_dtype(op, nm->q_out, &q_out, q.dtype, nm->q));
  OT_TRY(ot_check_same_shape(op, nm->q_out, &q_out, nm->q, &q));
  OT_TRY(ot_check_last_contiguous(op, nm->q_out, &q_out));
  OT_TRY(ot_check_no_self_overlap(op, nm->q_out, &q_out));

  OT_TRY(ot_view_of_optional(op, nm->k_out, ctx, k_out_t, &k_out));
  if (ot_view_present(&k) && !ot_view_present(&k_out))
    return ot_error(OT_ERR_INVALID_ARGUMENT, op, "%s: is NULL but %s is given", nm->k_out,
                    nm->k);
  if (!ot_view_present(&k) && ot_view_present(&k_out))
    return ot_error(OT_ERR_INVALID_ARGUMENT, op, "%s: is given but %s is NULL", nm->k_out,
                    nm->k);
  if (ot_view_present(&k_out)) {
    OT_TRY(ot_check_dtype(op, nm->k_out, &k_out, k.dtype, nm->k));
    OT_TRY(ot_check_same_shape(op, nm->k_out, &k_out, nm->k, &k));
    OT_TRY(ot_check_last_contiguous(op, nm->k_out, &k_out));
    OT_TRY(ot_check_no_self_overlap(op, nm->k_out, &k_out));
  }

  /* In place only as exactly the same view; q / k / outputs may interleave in one
   * packed buffer as long as they share no element. */
  OT_TRY(ot_check_no_overlap(op, nm->q_out, &q_out, nm->q, &q, true));
  OT_TRY(ot_check_no_overlap(op, nm->q_out, &q_out, nm->k, &k, false));
  OT_TRY(ot_check_no_overlap(op, nm->q_out, &q_out, nm->k_out, &k_out, false));
  OT_TRY(ot_check_no_overlap(op, nm->k_out, &k_out, nm->k, &k, true));
  OT_TRY(ot_check_no_overlap(op, nm->k_out, &k_out, nm->q, &q, false));
  OT_TRY(ot_check_no_overlap(op, nm->q_out, &q_out, "positions", &pos, false));
  OT_TRY(ot_check_no_overlap(op, nm->q_out, &q_out, "cos_sin_cache", &cache, false));
  OT_TRY(ot_check_no_overlap(op, nm->k_out, &k_out, "positions", &pos, false));
  OT_TRY(ot_check_no_overlap(op, nm->k_out, &k_out, "cos_sin_cache", &cache, false));

  ot_rope_args a;
  memset(&a, 0, sizeof a);
  a.op = op;
  a.dtype = q.dtype;
  a.mode = params->mode;
  a.inverse = inverse;
  a.batch = q.ndim == 4 ? q.shape[0] : 1;
  a.seq = q.shape[q.ndim - 3];
  a.head_dim = head_dim;
  a.rotary_dim = rd;
  a.q = heads_of(&q);
  a.k = heads_of(&k);
  a.q_out = heads_of(&q_out);
  a.k_out = heads_of(&k_out);
  a.positions = pos.data;
  a.pos_dtype = pos.dtype;
  a.pos_stride_s = pos.stride[pos.ndim - 1];
  a.pos_stride_b = pos.ndim == 2 ? pos.stride[0] : 0;
  a.cos_sin_cache = ot_view_present(&cache) ? (const float *)cache.data : NULL;
  a.max_position = ot_view_present(&cache) ? cache.shape[0] : 0;
  a.theta = params->theta;
  a.llama3_factor = params->llama3_factor > 0 ? params->llama3_factor : 0.0;
  a.llama3_low_freq_factor = params->llama3_low_freq_factor;
  a.llama3_high_freq_factor = params->llama3_high_freq_factor;
  a.llama3_original_max_position = params->llama3_original_max_position;

  const int64_t tokens = a.batch * a.seq;
  if (tokens == 0 || (a.q.heads == 0 && a.k.heads == 0)) return OT_OK;

  /* Position values: readable by the host only on CPU contexts. (The CUDA kernels
   * will check their bounds on the device under OT_DEBUG.) */
  if (!ot_ctx_is_cuda(ctx)) {
    for (int64_t b = 0; b < a.batch; b++)
      for (int64_t s = 0; s < a.seq; s++) {
        int64_t p = ot_load_index(a.positions, a.pos_dtype, b * a.pos_stride_b + s * a.pos_stride_s);
        bool bad = p < 0 || (a.cos_sin_cache && p >= a.max_position);
        if (!bad) continue;
        char where[64];
        if (pos.ndim == 2)
          snprintf(where, sizeof where, "[%" PRId64 ", %" PRId64 "]", b, s);
        else
          snprintf(where, sizeof where, "[%" PRId64 "]", s);
        if (p < 0)
          return ot_error(OT_ERR_INVALID_ARGUMENT, op,
                          "positions: element %s is %" PRId64 ", expected >= 0", where, p);
        return ot_error(OT_ERR_INVALID_ARGUMENT, op,
                        "positions: element %s is %" PRId64 ", expected < %" PRId64
                        " (the rows of cos_sin_cache)",
                        where, p, a.max_position);
      }
  }

  if (ot_ctx_is_cuda(ctx)) return OT_CUDA_CALL(op, ot_cuda_rope, ctx, &a);
  return ot_cpu_rope(ctx, &a);
}

ot_status ot_rope_forward(ot_context *ctx, const ot_rope_params *params, const DLTensor *q,
                          const DLTensor *k, const DLTensor *positions,
                          const DLTensor *cos_sin_cache, const DLTensor *q_out,
                          const DLTensor *k_out) {
  return rope(&forward_names, false, ctx, params, q, k, positions, cos_sin_cache, q_out, k_out);
}

ot_status ot_rope_backward(ot_context *ctx, const ot_rope_params *params, const DLTensor *dq_out,
                           const DLTensor *dk_out, const DLTensor *positions,
                           const DLTensor *cos_sin_cache, const DLTensor *dq,
                           const DLTensor *dk) {
  return rope(&backward_names, true, ctx, params, dq_out, dk_out, positions, cos_sin_cache, dq,
              dk);
}
