/*
 * rope.h -- private declarations of the rotary position embedding (RoPE) family:
 * the validated arguments and the backend entry points.
 *
 * One argument struct serves the forward and the backward: the backward is the same
 * rotation by the opposite angle (inverse = true), with dq_out / dk_out read in place
 * of q / k and dq / dk written in place of q_out / k_out.
 */
#ifndef OT_CORE_ROPE_H
#define OT_CORE_ROPE_H

#include "internal.h"

#ifdef __cplusplus
extern "C" {
#endif

/* One of q, k, q_out, k_out as [batch, seq, heads, head_dim] with element strides;
 * [tokens, heads, head_dim] tensors have batch = 1 (stride_b unused). The feature
 * dimension is contiguous. data == NULL when the tensor is absent (no k). */
typedef struct ot_rope_heads {
  void *data;
  int64_t heads;
  int64_t stride_b, stride_s, stride_h;
} ot_rope_heads;

typedef struct ot_rope_args {
  const char *op;      /* "ot_rope_forward" / "ot_rope_backward", for messages */
  ot_dtype dtype;      /* storage of q, k, q_out, k_out */
  ot_rope_mode mode;
  bool inverse;        /* rotate by -angle (the backward) */
  int64_t batch, seq;  /* tokens = batch * seq */
  int64_t head_dim;    /* D */
  int64_t rotary_dim;  /* rd: even, 0 < rd <= D; features [rd, D) pass through */
  ot_rope_heads q, k, q_out, k_out;
  /* positions: int32 / int64 [batch, seq] with element strides, all validated
   * >= 0 (and < max_position with a cache). */
  const void *positions;
  ot_dtype pos_dtype;
  int64_t pos_stride_b, pos_stride_s;
  /* float32 [max_position, rd] contiguous, or NULL: compute from inv_freq below. */
  const float *cos_sin_cache;
  int64_t max_position;
  /* Frequency parameters (used only without a cache), validated. */
  double theta;
  double llama3_factor; /* <= 0: no scaling */
  double llama3_low_freq_factor, llama3_high_freq_factor;
  double llama3_original_max_position;
} ot_rope_args;

/* inv_freq[i] for i < rd / 2, in float64: theta^(-2i/rd), then the Llama-3 scaling
 * when enabled. Shared by the backends so they rotate by the same frequencies. */
void ot_rope_inv_freq(const ot_rope_args *a, double *inv_freq);

ot_status ot_cpu_rope(ot_context *ctx, const ot_rope_args *a);
ot_status ot_cuda_rope(ot_context *ctx, const ot_rope_args *a);

#ifdef __cplusplus
}
#endif

#endif /* OT_CORE_ROPE_H */
