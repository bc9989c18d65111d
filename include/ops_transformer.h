/*
 * ops_transformer.h -- the one public header of the ops-transformer library.
 *
 * A hardware-affine operator library for transformer models: fused norms, RoPE,
 * gated activations, softmax / cross-entropy, flash attention and linear layers on
 * DLPack tensors, with a CPU backend (C11 + OpenMP) and a CUDA backend.
 *
 * Conventions (they hold for every op below unless the op says otherwise):
 *  - Every call returns an ot_status. On failure ot_last_error() names the op, the
 *    argument and what was expected, and no output has been written.
 *  - Tensors are borrowed `const DLTensor *` views for the duration of the call.
 *    Strides are in elements; NULL strides mean contiguous row-major. The last
 *    dimension of every floating-point tensor must be contiguous (stride 1); the
 *    leading dimensions may be strided where an op says "rows may be strided".
 *  - Storage dtypes: float32, float16, bfloat16. All inputs and outputs of one op
 *    share one storage dtype unless the op says otherwise (statistics such as rstd,
 *    mean and lse are always float32). Accumulation is float32.
 *  - Every tensor must live on the context's device, and its data pointer (data +
 *    byte_offset) must be aligned to its element size. A tensor has at most 8
 *    dimensions; its element count and its largest element offset (the sum of
 *    (shape - 1) * stride) must stay below 2^59, so that no size computed from it wraps.
 *  - Outputs are allocated by the caller. An output may alias an input only where
 *    the op says so (exactly the same view); partial overlap is rejected.
 *  - Work is enqueued on the context's stream and never synchronized inside an op
 *    (the CPU backend runs synchronously on the calling thread and its OpenMP team).
 *    Exceptions on CUDA: the first use of a context's cuBLASLt workspace and each growth
 *    of its scratch (split-KV partials, attention backward's delta) allocate device
 *    memory (cudaMalloc, after synchronizing the stream when the old scratch is freed),
 *    and the OT_DEBUG table checks read a flag back (docs/ENVIRONMENT.md). A warm-up call
 *    at the largest shape avoids the first two in a timed or captured region.
 *  - "[..., H]" means any number of leading dimensions that are flattened into rows.
 */
#ifndef OPS_TRANSFORMER_H
#define OPS_TRANSFORMER_H

#include <stddef.h>
#include <stdint.h>

#include <dlpack/dlpack.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ------------------------------------------------------------------------------ */
/* Export macro and version                                                        */
/* ------------------------------------------------------------------------------ */

#if defined(OT_STATIC_DEFINE)
#define OT_API
#elif defined(_WIN32)
#ifdef OT_BUILDING_LIBRARY
#define OT_API __declspec(dllexport)
#else
#define OT_API __declspec(dllimport)
#endif
#else
#define OT_API __attribute__((visibility("default")))
#endif

#define OT_VERSION_MAJOR 0
#define OT_VERSION_MINOR 1
#define OT_VERSION_PATCH 0
/* OT_VERSION_NUMBER is MAJOR * 10000 + MINOR * 100 + PATCH, as ot_version() returns. */
#define OT_VERSION_NUMBER (OT_VERSION_MAJOR * 10000 + OT_VERSION_MINOR * 100 + OT_VERSION_PATCH)

/* The version of the library actually linked (compare with OT_VERSION_NUMBER). */
OT_API int ot_version(void);
/* "MAJOR.MINOR.PATCH", static storage. */
OT_API const char *ot_version_string(void);

/* ------------------------------------------------------------------------------ */
/* Status and errors                                                               */
/* ------------------------------------------------------------------------------ */

typedef enum ot_status {
  OT_OK = 0,
  OT_ERR_INVALID_ARGUMENT = 1, /* a tensor or parameter broke the op's contract     */
  OT_ERR_UNSUPPORTED = 2,      /* valid, but this backend / build cannot do it      */
  OT_ERR_OOM = 3,              /* host or device memory could not be obtained       */
  OT_ERR_NO_DEVICE = 4,        /* the requested device does not exist / not built   */
  OT_ERR_BACKEND = 5,          /* the CUDA runtime, cuBLASLt or BLAS reported error */
  OT_ERR_INTERNAL = 6          /* a bug in this library: please report it           */
} ot_status;

/* A static English name for a status, e.g. "invalid argument". Never NULL. */
OT_API const char *ot_status_string(ot_status status);

/* The message of the last failed call on this thread, e.g.
 * "ot_rmsnorm_forward: x: dtype float16 does not match weight dtype bfloat16".
 * Empty string when no call on this thread has failed. Valid until the next failing
 * call on the same thread. Successful calls do not clear it. */
OT_API const char *ot_last_error(void);

/* ------------------------------------------------------------------------------ */
/* Context                                                                         */
/* ------------------------------------------------------------------------------ */

typedef struct ot_context ot_context;

typedef struct ot_context_options {
  /* kDLCPU or kDLCUDA. */
  DLDeviceType device_type;
  /* CUDA device ordinal; 0 for the CPU. */
  int device_id;
  /* CUDA: the cudaStream_t on which work is enqueued (NULL = the legacy default
   * stream). Ignored on the CPU. May be changed later with ot_context_set_stream. */
  void *stream;
  /* CPU: OpenMP threads per op; 0 = the OpenMP default (OMP_NUM_THREADS). */
  int num_threads;
} ot_context_options;

/* Default options: the CPU, all threads. */
OT_API ot_context_options ot_context_default_options(void);

/* Create a context. `options` NULL means ot_context_default_options().
 * OT_ERR_NO_DEVICE when the device type was not built in or the device is absent.
 * CUDA: the calling thread's current device is left as it was. Each op makes the
 * context's device current while it runs (its kernels and scratch go there) and restores
 * the caller's before it returns, so contexts of several devices can be used from one
 * thread without cudaSetDevice between calls. */
OT_API ot_status ot_context_create(const ot_context_options *options, ot_context **out);

/* Destroy a context; NULL is accepted and does nothing. */
OT_API void ot_context_destroy(ot_context *ctx);

/* Change the stream used by later calls (CUDA contexts; a no-op on the CPU). A CUDA
 * context's device scratch and cuBLASLt workspace serve all of its streams: once an op
 * has created them, switching to another stream makes that stream wait (an event, no host
 * synchronization) for the work already enqueued on the previous one -- except while
 * either stream captures a CUDA graph, where the caller orders them. For independent
 * concurrent streams use one context per stream. OT_ERR_BACKEND (stream unchanged) when
 * CUDA refuses the event. cudaStreamPerThread names the calling thread's own stream: a
 * context given it and then called from another host thread changes stream unseen (no
 * wait), so keep such a context on one thread, or order the threads' streams yourself. */
OT_API ot_status ot_context_set_stream(ot_context *ctx, void *stream);

/* The device a context runs on. */
OT_API DLDevice ot_context_device(const ot_context *ctx);

/* Whether this build has the CUDA backend compiled in (1) or not (0). */
OT_API int ot_has_cuda(void);

/* ------------------------------------------------------------------------------ */
/* RMSNorm and LayerNorm, with an optional fused residual add                      */
/* ------------------------------------------------------------------------------ */
/*
 * Shapes: x, residual, out, residual_out: [..., H]; weight, bias: [H];
 * rstd, mean: float32 with x's leading shape (one value per row), contiguous.
 * Rows may be strided (last dimension contiguous).
 *
 * Without residual (residual == NULL): h = x.
 * With residual: h = x + residual (rounded to the storage dtype), written to
 * residual_out (required), and the norm is taken of that rounded h.
 *   RMSNorm:   out = h * rstd * weight,            rstd = 1 / sqrt(mean(h^2) + eps)
 *   LayerNorm: out = (h - mean) * rstd * weight + bias, rstd = 1 / sqrt(var(h) + eps)
 * weight NULL means 1, bias NULL means 0. rstd / mean NULL means "do not save".
 * out may alias x; residual_out may alias x or residual.
 */
OT_API ot_status ot_rmsnorm_forward(ot_context *ctx, const DLTensor *x, const DLTensor *residual,
                                    const DLTensor *weight, float eps, const DLTensor *out,
                                    const DLTensor *residual_out, const DLTensor *rstd);

/*
 * Backward of ot_rmsnorm_forward.
 *  dy:           [..., H] gradient of out.
 *  dresidual_out:[..., H] or NULL: gradient reaching residual_out from elsewhere (the
 *                residual stream); it is added to dx.
 *  h:            [..., H] the normalized input (x, or residual_out when fused).
 *  rstd:         float32 [rows] as saved by the forward, or NULL to recompute it.
 *  dx:           [..., H] gradient of h; with the fused residual it is also the
 *                gradient of x and of residual (they are equal). dx may alias dy.
 *  dweight:      [H] or NULL (must be NULL when weight is NULL); overwritten.
 */
OT_API ot_status ot_rmsnorm_backward(ot_context *ctx, const DLTensor *dy,
                                     const DLTensor *dresidual_out, const DLTensor *h,
                                     const DLTensor *weight, const DLTensor *rstd, float eps,
                                     const DLTensor *dx, const DLTensor *dweight);

OT_API ot_status ot_layernorm_forward(ot_context *ctx, const DLTensor *x, const DLTensor *residual,
                                      const DLTensor *weight, const DLTensor *bias, float eps,
                                      const DLTensor *out, const DLTensor *residual_out,
                                      const DLTensor *mean, const DLTensor *rstd);

/* As ot_rmsnorm_backward; mean and rstd are both given or both NULL (recomputed).
 * dweight: [H] or NULL (must be NULL when weight is NULL); dbias: [H] or NULL
 * (the sum over rows of dy). Both overwritten. */
OT_API ot_status ot_layernorm_backward(ot_context *ctx, const DLTensor *dy,
                                       const DLTensor *dresidual_out, const DLTensor *h,
                                       const DLTensor *weight, const DLTensor *mean,
                                       const DLTensor *rstd, float eps, const DLTensor *dx,
                                       const DLTensor *dweight, const DLTensor *dbias);

/* ------------------------------------------------------------------------------ */
/* Rotary position embedding (RoPE)                                                */
/* ------------------------------------------------------------------------------ */

typedef enum ot_rope_mode {
  /* GPT-NeoX / Llama: pairs (i, i + rotary_dim/2), "rotate half". */
  OT_ROPE_NEOX = 0,
  /* GPT-J: pairs (2i, 2i + 1), interleaved. */
  OT_ROPE_GPTJ = 1
} ot_rope_mode;

typedef struct ot_rope_params {
  ot_rope_mode mode;
  /* Number of leading features of each head that are rotated (even, <= head_dim);
   * 0 means head_dim. The rest of the head is copied unchanged. */
  int rotary_dim;
  /* Base of the frequencies: inv_freq[i] = theta^(-2i / rotary_dim). E.g. 10000. */
  float theta;
  /* Llama-3 frequency scaling; disabled when llama3_factor <= 0. Typical values:
   * factor 8, low_freq_factor 1, high_freq_factor 4, original_max_position 8192. */
  float llama3_factor;
  float llama3_low_freq_factor;
  float llama3_high_freq_factor;
  int llama3_original_max_position;
} ot_rope_params;

/* Defaults: NEOX, full head, theta 10000, no scaling. */
OT_API ot_rope_params ot_rope_default_params(void);

/*
 * Rotate q and k by the angles of their tokens' positions, in one call.
 *  q:         [tokens, heads_q, head_dim] or [batch, seq, heads_q, head_dim]
 *  k:         same leading shape as q with heads_k heads, or NULL (q only)
 *  positions: int32 or int64, [tokens] (or [batch, seq]), values >= 0 (checked on the
 *             CPU backend; on CUDA they stay on the device and are not checked, which
 *             would need a synchronization: a position beyond the cache gives NaN rows)
 *  cos_sin_cache: NULL to compute cos/sin from params (theta, scaling) in float32;
 *             or float32 [max_position, rotary_dim]: row p holds cos(p * f_i) for
 *             i < rotary_dim/2 followed by sin(p * f_i); then positions must be
 *             < max_position and theta / scaling are ignored.
 *  q_out, k_out: same shapes as q, k. In place when q_out is q (same view), likewise k.
 *  Token and head dimensions may be strided (last dimension contiguous).
 * The backward (gradient) is the rotation by the opposite angle: ot_rope_backward
 * takes dq_out / dk_out in place of q / k and writes dq / dk.
 */
OT_API ot_status ot_rope_forward(ot_context *ctx, const ot_rope_params *params, const DLTensor *q,
                                 const DLTensor *k, const DLTensor *positions,
                                 const DLTensor *cos_sin_cache, const DLTensor *q_out,
                                 const DLTensor *k_out);

OT_API ot_status ot_rope_backward(ot_context *ctx, const ot_rope_params *params,
                                  const DLTensor *dq_out, const DLTensor *dk_out,
                                  const DLTensor *positions, const DLTensor *cos_sin_cache,
                                  const DLTensor *dq, const DLTensor *dk);

/* ------------------------------------------------------------------------------ */
/* Gated activations: SwiGLU and GeGLU                                             */
/* ------------------------------------------------------------------------------ */

typedef enum ot_glu_kind {
  OT_GLU_SWIGLU = 0,    /* out = silu(gate) * up                                 */
  OT_GLU_GEGLU = 1,     /* out = gelu(gate) * up, exact (erf) GELU               */
  OT_GLU_GEGLU_TANH = 2 /* out = gelu_tanh(gate) * up, the tanh approximation     */
} ot_glu_kind;

/*
 * Two layouts:
 *  - up != NULL: gate and up are [..., F]; out is [..., F].
 *  - up == NULL: gate is [..., 2F] holding gate in its first F features and up in
 *    its last F features (the output of a fused gate+up projection); out [..., F].
 * Rows may be strided.
 */
OT_API ot_status ot_glu_forward(ot_context *ctx, ot_glu_kind kind, const DLTensor *gate,
                                const DLTensor *up, const DLTensor *out);

/* Backward: dgate / dup with the shapes of gate / up (with up == NULL, dup must be
 * NULL and dgate is [..., 2F] holding both halves). dgate may alias gate and dup may
 * alias up (recompute in place, as activation checkpointing wants). */
OT_API ot_status ot_glu_backward(ot_context *ctx, ot_glu_kind kind, const DLTensor *dout,
                                 const DLTensor *gate, const DLTensor *up, const DLTensor *dgate,
                                 const DLTensor *dup);

/* ot_glu_backward that also writes the forward's output act(gate) * up to `out` (the
 * values ot_glu_forward writes, bit for bit), from the same reads: for a caller that keeps
 * gate and up rather than the product and needs the product again in the backward (the
 * weight gradient of the projection that consumed it), one pass instead of a forward
 * recompute plus the backward. out has dout's shape and dtype and overlaps no other
 * argument; the rest as ot_glu_backward (dgate may alias gate, dup may alias up). */
OT_API ot_status ot_glu_backward_recompute(ot_context *ctx, ot_glu_kind kind,
                                           const DLTensor *dout, const DLTensor *gate,
                                           const DLTensor *up, const DLTensor *dgate,
                                           const DLTensor *dup, const DLTensor *out);

/* ------------------------------------------------------------------------------ */
/* Softmax and cross-entropy                                                        */
/* ------------------------------------------------------------------------------ */

/* Softmax over the last dimension. x, out: [..., N]; out may alias x. Rows may be
 * strided. */
OT_API ot_status ot_softmax_forward(ot_context *ctx, const DLTensor *x, const DLTensor *out);

/* dx = y * (dy - sum(dy * y)), with y the forward's output. dx may alias dy. */
OT_API ot_status ot_softmax_backward(ot_context *ctx, const DLTensor *dy, const DLTensor *y,
                                     const DLTensor *dx);

typedef enum ot_reduction {
  OT_REDUCTION_MEAN = 0, /* sum over non-ignored rows / number of non-ignored rows */
  OT_REDUCTION_SUM = 1,
  OT_REDUCTION_NONE = 2 /* one loss per row; ignored rows get 0 */
} ot_reduction;

typedef struct ot_cross_entropy_params {
  int64_t ignore_index;   /* rows whose label equals this contribute nothing (-100) */
  float label_smoothing;  /* in [0, 1]: loss = (1-s) * nll + s * mean_j(-log p_j)   */
  ot_reduction reduction;
} ot_cross_entropy_params;

/* Defaults: ignore_index -100, no smoothing, mean. */
OT_API ot_cross_entropy_params ot_cross_entropy_default_params(void);

/*
 * Cross-entropy of logits against integer labels (the semantics of
 * torch.nn.functional.cross_entropy, including label smoothing).
 *  logits: [N, V] (rows may be strided) float32 / float16 / bfloat16
 *  labels: int32 or int64 [N], each in [0, V) or equal to ignore_index (checked on
 *          the CPU backend; on CUDA they stay on the device and are not checked, which
 *          would need a synchronization: a label out of range gives a NaN loss row, so
 *          a NaN MEAN / SUM, and a NaN gradient row)
 *  loss:   float32; [] or [1] for MEAN / SUM, [N] for NONE. With MEAN and no
 *          non-ignored row the loss is NaN (as torch).
 *  lse:    float32 [N] or NULL: log-sum-exp of each row, for the backward.
 */
OT_API ot_status ot_cross_entropy_forward(ot_context *ctx, const ot_cross_entropy_params *params,
                                          const DLTensor *logits, const DLTensor *labels,
                                          const DLTensor *loss, const DLTensor *lse);

/*
 * dlogits = dloss * d(loss)/d(logits). dloss is float32 with loss's shape.
 * lse is as saved by the forward, or NULL to recompute. dlogits: [N, V] in logits'
 * dtype; it may alias logits (the gradient overwrites the logits, saving memory).
 */
OT_API ot_status ot_cross_entropy_backward(ot_context *ctx, const ot_cross_entropy_params *params,
                                           const DLTensor *dloss, const DLTensor *logits,
                                           const DLTensor *labels, const DLTensor *lse,
                                           const DLTensor *dlogits);

/* ------------------------------------------------------------------------------ */
/* Attention                                                                       */
/* ------------------------------------------------------------------------------ */

typedef struct ot_attention_params {
  /* Multiplies q.k before the softmax; 0 means 1 / sqrt(head_dim). */
  float softmax_scale;
  /* Causal mask, aligned to the bottom-right corner: query i of a sequence with
   * Sq queries and Sk keys sees key j iff j <= i + (Sk - Sq). When Sq > Sk the first
   * Sq - Sk queries see no key: their output is 0 and their lse is -inf. */
  int causal;
  /* Sliding window, in the same bottom-right frame: query i sees key j iff
   * i + (Sk - Sq) - window_left <= j <= i + (Sk - Sq) + window_right.
   * A negative value means unbounded on that side. causal is window_right = 0. */
  int window_left;
  int window_right;
  /* Tanh soft-capping of the scores: s = softcap * tanh(s / softcap) applied after
   * the scale; 0 disables. */
  float softcap;
  /* Backward: make dq (and dk/dv with GQA) accumulation bitwise deterministic. The
   * CPU backend and the portable CUDA backward always are; the Hopper CUDA backward
   * accumulates dq with atomics, and the dk / dv of a non-causal call's last partial wave
   * of key blocks in parts, unless this is set (docs/ATTENTION.md gives the cost). */
  int deterministic;
  /* ot_paged_attention's early start. 1 promises that cu_seqlens_q, the page table and
   * every cached key / value except the last n_b tokens of each sequence b (n_b = its
   * query tokens: the rows the kernel just before this op may append) are complete once
   * that kernel may start its dependents: none written by that kernel itself (its writes
   * are visible to a dependent only after the dependent's wait), and each written by work
   * that completed before it started (it was launched without programmatic dependence) or
   * that it waited for (it signals launch_dependents only after its own
   * griddepcontrol.wait). (A copy or an event wait just before the op is no kernel: the
   * op starts after it completes.) The op may then read them while that kernel is still
   * running (H200: batch 1 x 2k keys 10.5 instead of 12.4 us a call); q and the newest
   * rows are read after it. Taken by the CUDA split kernel at head_dim 128; the CPU
   * backend, other head dims, the stream and fallback kernels and OT_DEBUG ignore it.
   * 0 (default): nothing is read before the previous kernel completes. */
  int paged_kv_ready;
} ot_attention_params;

/* Defaults: scale 1/sqrt(D), not causal, no window, no softcap. */
OT_API ot_attention_params ot_attention_default_params(void);

/*
 * Flash attention: out = softmax(scale * q k^T + mask) v, computed in tiles with an
 * online softmax; the Sq x Sk score matrix is never materialized.
 *
 * Dense (BSHD) layout, cu_seqlens_q == cu_seqlens_k == NULL:
 *   q, out: [B, Sq, Hq, D]; k, v: [B, Sk, Hkv, D]; lse: float32 [B, Hq, Sq]
 * Packed variable-length (THD) layout, cu_seqlens_q and cu_seqlens_k int32 [B+1]:
 *   q, out: [Tq, Hq, D]; k, v: [Tk, Hkv, D]; lse: float32 [Hq, Tq]
 *   sequence b holds query rows cu_seqlens_q[b] .. cu_seqlens_q[b+1]-1 (likewise k);
 *   cu_seqlens start at 0, never decrease, and end at Tq (Tk). A sequence may be
 *   empty or of length 1; the cu_seqlens tensors must be readable by the host on
 *   the CPU backend (on the CUDA backend they live on the device).
 * Hq must be a multiple of Hkv (GQA; Hkv = 1 is MQA): query head h reads kv head
 * h / (Hq / Hkv). Sequence and head dimensions may be strided; D contiguous.
 * lse (natural log of the softmax denominator, including the scale) may be NULL
 * when no backward follows. out must not overlap q, k or v.
 *
 * CUDA backend (docs/ATTENTION.md): float16 / bfloat16 only (float32 returns
 * OT_ERR_UNSUPPORTED: convert, or use a CPU context), head_dim <= 256, compute
 * capability 8.0 or newer, heads and batch <= 65535, fewer than 2^30 tokens per
 * sequence (dense) or in total (varlen); beyond these OT_ERR_UNSUPPORTED and nothing is
 * written. Tensor-core kernels (mma.sync on sm_80+, and on a 9.0 device a TMA / wgmma
 * forward for head_dim 64 / 96 / 128 / 256 without softcap or varlen, when the build includes
 * sm_90a). Varlen cu_seqlens stay on the device and are not read by the host: a
 * sequence whose offsets are out of range (negative, decreasing, past Tq / Tk) is
 * skipped -- nothing is read or written for it -- instead of raising an error. Scratch
 * for split-KV partials comes from the context (ot_context's device scratch, grown on
 * demand). CUDA backward: on a 9.0 device (build with sm_90a) a TMA / wgmma kernel for
 * head_dim 64 / 96 / 128 / 256, dense, causal or no window, no softcap, which adds dq up with fp32
 * atomics (not bitwise repeatable; nor are dk / dv of the key blocks that a non-causal
 * call's last partial wave splits into parts); params.deterministic = 1 runs the
 * portable backward instead (fixed summation order for dq and for the GQA sums of
 * dk / dv), as every other call does.
 */
OT_API ot_status ot_attention_forward(ot_context *ctx, const ot_attention_params *params,
                                      const DLTensor *q, const DLTensor *k, const DLTensor *v,
                                      const DLTensor *cu_seqlens_q, const DLTensor *cu_seqlens_k,
                                      const DLTensor *out, const DLTensor *lse);

/*
 * Backward from the saved lse: writes dq, dk, dv (shapes of q, k, v; overwritten).
 * out and dout: the forward's output and its gradient. params must equal the
 * forward's. With GQA dk / dv sum the gradients of the query heads sharing a kv head.
 */
OT_API ot_status ot_attention_backward(ot_context *ctx, const ot_attention_params *params,
                                       const DLTensor *q, const DLTensor *k, const DLTensor *v,
                                       const DLTensor *out, const DLTensor *dout,
                                       const DLTensor *lse, const DLTensor *cu_seqlens_q,
                                       const DLTensor *cu_seqlens_k, const DLTensor *dq,
                                       const DLTensor *dk, const DLTensor *dv);

/* ------------------------------------------------------------------------------ */
/* Linear layer                                                                    */
/* ------------------------------------------------------------------------------ */

/*
 * y = x W^T + b.  x: [..., K]; weight: [N, K]; bias: [N] or NULL; y: [..., N].
 * x and y rows may be strided; weight must be contiguous. All one dtype; accumulation
 * in float32 (the CPU backend converts bf16 / fp16 blocks to float32 and calls BLAS; the
 * CUDA backend calls cuBLASLt with the bias fused into the GEMM's epilogue).
 * float32 on CUDA: full float32 products unless the environment variable
 * OT_MATMUL_ALLOW_TF32=1 is set when the op runs (then TF32 tensor cores, as torch's
 * allow_tf32; read at every call, it also applies to ot_linear_cross_entropy).
 * On a 9.0+ GPU a forward of few rows may run as a programmatic dependent launch that reads
 * `weight` (never x or bias) before the previous kernel on the stream has completed: the
 * kernel immediately before it on the stream must not write `weight` (an in-place weight
 * update directly followed by a one-row forward: put an ordinary kernel between them,
 * synchronize, or set OT_LINEAR_PDL=0).
 */
OT_API ot_status ot_linear_forward(ot_context *ctx, const DLTensor *x, const DLTensor *weight,
                                   const DLTensor *bias, const DLTensor *y);

/* dx = dy W (or NULL), dweight = dy^T x (or NULL), dbias = sum over rows of dy (or
 * NULL). Outputs are overwritten, not accumulated. On CUDA dbias comes from the dweight
 * GEMM's epilogue (cuBLASLt BGRADB) when both are asked and cuBLASLt offers it, else
 * from a column-sum kernel (float32, fixed order). */
OT_API ot_status ot_linear_backward(ot_context *ctx, const DLTensor *dy, const DLTensor *x,
                                    const DLTensor *weight, const DLTensor *dx,
                                    const DLTensor *dweight, const DLTensor *dbias);

/* ------------------------------------------------------------------------------ */
/* Fused linear + cross-entropy (the LM head's loss without the logits)            */
/* ------------------------------------------------------------------------------ */

typedef struct ot_linear_cross_entropy_params {
  ot_cross_entropy_params ce; /* ignore_index, label_smoothing, reduction (as there) */
  /* Tokens per chunk; 0 = the default: as many tokens as fit 256 MiB of logits in the
   * storage dtype (e.g. 1024 tokens for a 128k vocabulary in bfloat16), at least 1. */
  int64_t chunk_tokens;
} ot_linear_cross_entropy_params;

/* Defaults: ot_cross_entropy_default_params(), chunk_tokens 0. */
OT_API ot_linear_cross_entropy_params ot_linear_cross_entropy_default_params(void);

/*
 * loss = cross_entropy(hidden W^T, labels) and, in the same call when dhidden and / or
 * dweight are given, the gradients of that loss (d loss / d loss = 1: scale them by the
 * upstream gradient yourself), without ever holding the [T, V] logits: the tokens are
 * processed in chunks of C = chunk_tokens rows; per chunk
 *     logits_c = hidden_c W^T          [C, V] in the storage dtype (GEMM: cuBLASLt on
 *                                      CUDA, BLAS on the CPU, as ot_linear_forward)
 *     row losses (and lse) of logits_c (the ot_cross_entropy kernels, reduction NONE)
 *     dlogits_c = d loss / d logits_c  written over logits_c (ot_cross_entropy_backward)
 *     dhidden_c = dlogits_c W          (GEMM)
 *     dweight  += dlogits_c^T hidden_c (GEMM with beta = 1 after the first chunk)
 * The numbers are those of torch.nn.functional.linear followed by F.cross_entropy in
 * the same dtype: the logits are rounded to the storage dtype before the softmax, and
 * the gradient of the logits is rounded before the two backward GEMMs.
 *  hidden:  [T, H] (rows may be strided) float32 / float16 / bfloat16
 *  weight:  [V, H] contiguous, hidden's dtype
 *  labels:  int32 / int64 [T], each in [0, V) or ignore_index (checked on the CPU; on
 *           CUDA an out-of-range label gives NaN, as ot_cross_entropy_forward)
 *  loss:    float32, [] or [1] for MEAN / SUM, [T] for NONE (gradients are not
 *           available with NONE: dhidden and dweight must then be NULL)
 *  dhidden: [T, H] in hidden's dtype, or NULL (rows may be strided)
 *  dweight: [V, H] contiguous, in hidden's dtype or float32, or NULL. Accumulated over
 *           the chunks by the GEMM: in a 16-bit dtype each chunk's sum is rounded into
 *           it (error grows with the number of chunks); float32 accumulates exactly
 *           as one GEMM would.
 *  workspace: a contiguous tensor (any dtype the library accepts, e.g. int32) of at
 *           least ot_linear_cross_entropy_workspace_size() bytes, 16-byte aligned, or
 *           NULL: then the op allocates it itself (malloc on the CPU, cudaMallocAsync
 *           on the context's stream on CUDA) and frees it before returning.
 * Extra memory (peak, beyond the arguments): the workspace, which is
 *     C * V * sizeof(storage)   the logits of one chunk (reused by the next)
 *   + C * 4 + T * 4 + 256       lse of a chunk, row losses, scalars (+ alignment)
 * plus the cuBLASLt workspace of the context (32 MiB, once per context) on CUDA. The CPU
 * backend also converts operand panels to float32 inside its GEMMs (bounded, about
 * 32 MB) and, when dweight is requested, a float32 panel of at most 2^21 floats.
 * Outputs must not overlap inputs or each other. MEAN divides by the number of
 * non-ignored tokens (NaN loss and zero gradients when there is none, as torch).
 */
OT_API ot_status ot_linear_cross_entropy(ot_context *ctx,
                                         const ot_linear_cross_entropy_params *params,
                                         const DLTensor *hidden, const DLTensor *weight,
                                         const DLTensor *labels, const DLTensor *loss,
                                         const DLTensor *dhidden, const DLTensor *dweight,
                                         const DLTensor *workspace);

/* Bytes of workspace for T tokens, hidden size H, vocabulary V and storage `dtype`
 * (the chunk size resolved as above); the same on every backend. */
OT_API ot_status ot_linear_cross_entropy_workspace_size(
    const ot_linear_cross_entropy_params *params, int64_t tokens, int64_t hidden_size,
    int64_t vocab_size, DLDataType dtype, size_t *bytes);

/* ------------------------------------------------------------------------------ */
/* Optimizer: AdamW over many tensors                                              */
/* ------------------------------------------------------------------------------ */

typedef struct ot_adamw_params {
  float lr;           /* learning rate, >= 0 */
  float beta1, beta2; /* in [0, 1) */
  float eps;          /* >= 0 */
  float weight_decay; /* >= 0, decoupled: p *= 1 - lr * weight_decay */
  int64_t step;       /* the step this update makes, >= 1 (1 for the first): bias
                         corrections 1 - beta^step */
} ot_adamw_params;

/* Defaults: lr 1e-3, betas (0.9, 0.999), eps 1e-8, weight_decay 1e-2, step 1 (those
 * of torch.optim.AdamW). */
OT_API ot_adamw_params ot_adamw_default_params(void);

/*
 * One AdamW step (torch.optim.AdamW's update, amsgrad and maximize off) over n >= 0
 * tensors, each of any shape and size (contiguous, numel may differ, 1 element is
 * fine), in a few kernel launches on CUDA (a table of chunks of every tensor):
 *     w    = master[i] if given, else params[i] (computed in float32)
 *     w   *= 1 - lr * weight_decay
 *     m    = beta1 m + (1 - beta1) g          (exp_avg[i])
 *     v    = beta2 v + (1 - beta2) g^2        (exp_avg_sq[i])
 *     w   -= (lr / (1 - beta1^step)) m / (sqrt(v) / sqrt(1 - beta2^step) + eps)
 *     master[i] = w (float32); params[i] = w rounded to its dtype
 *  params[i]:      float32 / float16 / bfloat16, one dtype for all i
 *  grads[i]:       params[i]'s shape, params' dtype or float32 (one dtype for all i)
 *  exp_avg[i], exp_avg_sq[i]: params[i]'s shape, float32 or params' dtype (one dtype
 *                  for all of them)
 *  master_params:  NULL, or an array whose entries are all NULL or all float32 tensors
 *                  of params[i]'s shape (fp32 master weights of low-precision params)
 * Everything is updated in place; grads are only read. No tensor may overlap another
 * one of the call (the same tensor passed twice included).
 * Backends: CPU (OpenMP over chunks of all the tensors; IEEE float32 arithmetic) and CUDA
 * (tables of up to 32 tensors / 448 chunks of 64k elements passed as kernel parameters: no
 * device memory). On CUDA the square root and the divisions are the hardware's
 * approximations by default (relative error ~2^-22: results within a few float32 ulps of
 * the IEEE update); OT_ADAMW_IMPL=exact selects IEEE arithmetic (docs/ENVIRONMENT.md).
 * Errors: OT_ERR_INVALID_ARGUMENT naming the list and position (e.g. "grads[3]") for a
 * NULL list or entry, a shape, dtype or contiguity mismatch, an overlap, or a params
 * field out of range (lr, eps, weight_decay finite and >= 0, betas in [0, 1),
 * step >= 1); nothing is updated then. Host memory: a table of about 100 bytes per
 * tensor for the duration of the call (OT_ERR_OOM when it cannot be allocated).
 */
OT_API ot_status ot_adamw_step(ot_context *ctx, const ot_adamw_params *params, int n,
                               const DLTensor *const *param_tensors,
                               const DLTensor *const *grads, const DLTensor *const *exp_avg,
                               const DLTensor *const *exp_avg_sq,
                               const DLTensor *const *master_params);

/* ============================================================================== */
/* Memory: arena                                                                   */
/* ============================================================================== */
/*
 * One reservation of device (or host) memory, made once at create, carved into
 * allocations on demand without calling the system allocator again: the library's
 * answer to cudaMalloc on the hot path.
 *  - Every block starts on a 256-byte boundary and its size is rounded up to a
 *    multiple of 256 (stats count the rounded sizes).
 *  - Free blocks sit in segregated free lists by size class (powers of two of 256
 *    bytes); an allocation takes the first fitting block of the smallest class that
 *    has one and splits off the rest. A freed block merges with its free neighbours
 *    at once (boundary tags), so freeing everything leaves one block again.
 *  - Exhaustion returns OT_ERR_OOM with the request size and the largest free block in
 *    the message; no live allocation is moved or disturbed, and the arena stays usable.
 *  - The bookkeeping always lives on the host, also for device memory.
 *  - Thread safety: every call takes the arena's mutex, so any threads may share one
 *    arena. (The data of the blocks is of course not protected.)
 * Stream ordering (CUDA arenas; the CPU backend ignores streams, its work is
 * synchronous): a block freed with ot_arena_free(a, p, s) is tagged with s (the special
 * handles: see below). An allocation on the same stream s may reuse it immediately (work
 * on s is ordered, so later kernels on s run after the last use). An allocation on
 * another stream t takes such blocks only when nothing else fits: it picks the first run
 * of adjacent free blocks that would hold it, t waits for each stream s that freed a
 * block of that run, and for no other (an event recorded on s at that moment, after
 * every use of what was freed there; no host synchronization), and those blocks become
 * t's. While t or s captures a CUDA graph that wait is impossible and the request fails
 * with OT_ERR_OOM instead.
 * ot_arena_synchronize(a) synchronizes the device and clears every tag. Free neighbours
 * merge when their tags are equal (so never-used memory stays free of any stream). The
 * stream given to ot_arena_alloc is recorded nowhere else; a block may be used on any
 * stream as long as the caller orders it.
 *  - NULL (or cudaStreamLegacy) is the legacy default stream, one stream that every host
 *    thread shares: a stream like the others. Its implicit synchronization with blocking
 *    streams is not relied on (non-blocking streams have none), so another stream still
 *    waits for it with an event. The library is built with the legacy default stream: a
 *    caller compiled with --default-stream per-thread passes cudaStreamPerThread, not 0.
 *  - cudaStreamPerThread names a different stream on each host thread: a block freed on
 *    it is the freeing thread's. That thread's cudaStreamPerThread reuses it at once, and
 *    another stream takes it (after the wait) only in a request made on that thread;
 *    other threads get it after ot_arena_synchronize. So free such a block on the thread
 *    whose per-thread stream last used it.
 */

typedef struct ot_arena ot_arena;

typedef struct ot_arena_stats {
  size_t reserved;        /* bytes of the reservation (a multiple of 256) */
  size_t in_use;          /* bytes in live blocks */
  size_t peak;            /* the largest in_use since create */
  size_t free_total;      /* reserved - in_use */
  size_t largest_free;    /* the largest block free now (ignoring stream tags) */
  double fragmentation;   /* 1 - largest_free / free_total; 0 when nothing is free */
  uint64_t live_blocks;   /* allocations not yet freed */
  uint64_t free_blocks;   /* free blocks (1 when everything is free and coalesced) */
  uint64_t num_allocs;    /* successful ot_arena_alloc calls since create */
  uint64_t num_frees;     /* successful ot_arena_free calls since create */
  uint64_t num_failed;    /* ot_arena_alloc calls that returned OT_ERR_OOM */
} ot_arena_stats;

/* Reserve `reserve_bytes` (rounded up to 256, >= 1) on ctx's device: host memory on a
 * CPU context, cudaMalloc'd device memory on a CUDA context. The arena remembers the
 * device, not the context (the context may be destroyed first). */
OT_API ot_status ot_arena_create(ot_context *ctx, size_t reserve_bytes, ot_arena **out);

/* Release the reservation; NULL is accepted and does nothing. Live blocks die with it. */
OT_API void ot_arena_destroy(ot_arena *arena);

/* A block of `bytes` (>= 1) for use on `stream` (a cudaStream_t; NULL on the CPU or
 * for the legacy default stream). *ptr is written only on success. */
OT_API ot_status ot_arena_alloc(ot_arena *arena, size_t bytes, void *stream, void **ptr);

/* Return a block obtained from ot_arena_alloc of this arena; `stream` is the stream of
 * its last use (cudaStreamPerThread: call it on the thread of that use). A pointer that
 * is not a live block is an error (nothing changes). */
OT_API ot_status ot_arena_free(ot_arena *arena, void *ptr, void *stream);

/* CUDA: cudaDeviceSynchronize, then make every free block available to every stream.
 * CPU: clears the tags (a no-op unless tests turned stream ordering on). */
OT_API ot_status ot_arena_synchronize(ot_arena *arena);

OT_API ot_status ot_arena_get_stats(ot_arena *arena, ot_arena_stats *stats);

/* Serve a context's temporaries from `arena` (NULL: back to the context's own
 * buffers / malloc). CUDA contexts: while set, every op's device temporaries --
 * split-KV / split-K partials and other scratch, cross-entropy row losses, the fused loss's workspace -- are blocks taken
 * from the arena on the context's stream when the op needs them and given back,
 * stream-ordered, when the op returns (tracker: OT_MEMORY_WORKSPACE under the op's name);
 * the cuBLASLt workspace (32 MiB) is one block taken here, at once, and held until
 * detach. An op whose temporaries do not fit fails with OT_ERR_OOM, "<op>: scratch from
 * the context's arena: cannot allocate <n> bytes ...: the largest free block is <m>
 * bytes ...", before writing any output; no block of the arena is disturbed.
 *  - The arena must be on the context's device (else OT_ERR_INVALID_ARGUMENT) and stay
 *    alive while attached: detach or destroy the context before destroying the arena.
 *    A host arena on a CUDA context, or a device arena on a CPU context, is
 *    OT_ERR_INVALID_ARGUMENT naming `arena`.
 *    Several contexts (streams) may share one arena: a request that fits only in blocks
 *    another stream freed makes its stream wait for that stream (an event) and takes them.
 *  - Ops enqueued while the stream captures a CUDA graph keep their blocks (the graph
 *    reuses them at each replay) until detach or destroy: do not replay such a graph after.
 *    If the context cannot record such a block (host OOM), the op returns OT_ERR_OOM and
 *    the block stays allocated in the arena until the arena is destroyed.
 *  - OT_ERR_OOM (nothing changed) when the arena has no room for the cuBLASLt workspace.
 *  - CPU contexts (a host arena: ot_arena_create on a CPU context): every op takes its
 *    temporaries (scratch, task lists, partials, the fused loss's workspace and panels)
 *    as blocks of the arena before it writes any output and gives them back before it
 *    returns, so attaching holds nothing; too small: OT_ERR_OOM "<op>: <what>: cannot
 *    allocate <n> bytes ...: the largest free block is <m> bytes ...", nothing written.
 *    Results are bit-identical with and without. Without an arena: malloc per call. */
OT_API ot_status ot_context_set_arena(ot_context *ctx, ot_arena *arena);

/* ============================================================================== */
/* Memory: paged KV cache                                                          */
/* ============================================================================== */
/*
 * A pool of pages, allocated once at create, each holding `block_size` tokens of every
 * layer's keys and values. Page p of layer l is, for K and for V separately,
 *     [heads_kv, block_size, head_dim]      ("HND": head-major inside the page)
 * so a layer's K is one tensor [num_pages, heads_kv, block_size, head_dim] (likewise V;
 * ot_kv_cache_layer returns both as DLTensors). Head-major pages make the keys of one kv
 * head in one page a single contiguous run of block_size * head_dim elements, which is
 * what a decode kernel that owns a kv head reads (one 16-byte-vector burst or one TMA
 * box per page, also for small head_dim); appending one token writes heads_kv runs of
 * head_dim elements, which is cheap.
 *
 * Sequences are handles (int64 ids) with a block table: the pages holding their tokens
 * in order; token t of a sequence lives in page table[t / block_size], slot
 * t % block_size. Pages are reference counted: ot_kv_cache_fork shares every page of
 * the source with the new sequence (prefix sharing, beam search, parallel sampling).
 * Copy-on-write: a shared page is never written. Full pages are never written again
 * anyway; the partially filled last page stays shared after a fork and is copied (its
 * filled slots, all layers, K and V) by the first ot_kv_cache_reserve that extends a
 * sequence whose last page is shared -- so a fork costs no copy until one side grows.
 *
 * Token slots are allocated by ot_kv_cache_reserve (the sequence's length grows at
 * once) and written afterwards by ot_kv_append for each layer. The kernels never see
 * the cache object, only a CSR page table (ot_kv_cache_page_table) of the batch:
 *     indptr         int32 [batch + 1]    pages of sequence b: indices[indptr[b] .. indptr[b+1])
 *     indices        int32 [indptr[batch]]
 *     last_page_len  int32 [batch]        tokens in the last page: 1..block_size (0 only
 *                                         for a sequence with no page)
 * so length_b = (pages_b - 1) * block_size + last_page_len[b].
 *
 * The cache's bookkeeping is host-side and not thread-safe: one thread (the scheduler)
 * manages sequences. On CUDA contexts the pages are device memory and the copies of
 * copy-on-write are enqueued on the context's stream (the context must outlive the
 * cache).
 */

typedef struct ot_kv_cache ot_kv_cache;

typedef struct ot_kv_cache_params {
  int num_layers;    /* >= 1 */
  int64_t num_pages; /* pages in the pool (each page serves every layer), >= 1 */
  int block_size;    /* tokens per page, 1..256 */
  int heads_kv;      /* >= 1 */
  int head_dim;      /* >= 1 */
  DLDataType dtype;  /* float32, float16 or bfloat16 */
} ot_kv_cache_params;

typedef struct ot_kv_cache_info {
  int num_layers, block_size, heads_kv, head_dim;
  int64_t num_pages;     /* total */
  int64_t free_pages;    /* not referenced by any sequence */
  int64_t shared_pages;  /* referenced by 2 or more sequences */
  int64_t num_sequences; /* live sequences */
  size_t bytes;          /* bytes of page storage, all layers, K and V */
} ot_kv_cache_info;

/* Create a pool for `params` on ctx's device. The pages come from `arena` when it is
 * not NULL (it must be on ctx's device and is not released before the cache), else from
 * the cache's own reservation. Page contents start undefined. */
OT_API ot_status ot_kv_cache_create(ot_context *ctx, const ot_kv_cache_params *params,
                                    ot_arena *arena, ot_kv_cache **out);
/* NULL is accepted. */
OT_API void ot_kv_cache_destroy(ot_kv_cache *cache);

/* The pages of one layer: k_pages and v_pages are filled as views
 * [num_pages, heads_kv, block_size, head_dim] (contiguous; shape storage belongs to the
 * cache and lives as long as it). */
OT_API ot_status ot_kv_cache_layer(ot_kv_cache *cache, int layer, DLTensor *k_pages,
                                   DLTensor *v_pages);

/* A new empty sequence (no page yet). Its id is never given to a later sequence (a freed
 * sequence's slot is reused under a new id), so a stale id is refused with "not a live
 * sequence" rather than taken for another sequence. Ids are >= 0; 0, 1, 2, ... while no
 * sequence has been freed. */
OT_API ot_status ot_kv_cache_add_sequence(ot_kv_cache *cache, int64_t *seq_id);

/* Grow sequence seq_ids[i] by num_tokens[i] >= 0 token slots, for i < n, allocating
 * pages (and copying a shared partial last page, see above). All or nothing: when the
 * pool lacks pages, OT_ERR_OOM says how many were needed and free, and no sequence
 * changes. The ids must be distinct. */
OT_API ot_status ot_kv_cache_reserve(ot_kv_cache *cache, int n, const int64_t *seq_ids,
                                     const int64_t *num_tokens);

/* Drop a sequence: its pages lose one reference (and return to the pool at zero). */
OT_API ot_status ot_kv_cache_free_sequence(ot_kv_cache *cache, int64_t seq_id);

/* A new sequence sharing every page (and the length) of src_seq. */
OT_API ot_status ot_kv_cache_fork(ot_kv_cache *cache, int64_t src_seq, int64_t *new_seq);

/* Length in tokens and number of pages of a sequence (either pointer may be NULL). */
OT_API ot_status ot_kv_cache_seq_length(const ot_kv_cache *cache, int64_t seq_id,
                                        int64_t *num_tokens, int64_t *num_pages);

/* The CSR page table of the batch seq_ids[0 .. n) into host arrays: indptr [n + 1],
 * indices [indices_capacity >= total pages of the batch], last_page_len [n]. Copy them
 * to the device for CUDA kernels. Valid until the next reserve / free / fork. */
OT_API ot_status ot_kv_cache_page_table(const ot_kv_cache *cache, int n,
                                        const int64_t *seq_ids, int32_t *indptr,
                                        int32_t *indices, int64_t indices_capacity,
                                        int32_t *last_page_len);

OT_API ot_status ot_kv_cache_get_info(const ot_kv_cache *cache, ot_kv_cache_info *info);

/* ============================================================================== */
/* Memory: append and attention through the page table                             */
/* ============================================================================== */

/* One layer's pages and a batch's page table (see ot_kv_cache above). On the CPU the
 * three int32 tables must be host-readable; they are bounds-checked on every call. */
typedef struct ot_paged_kv {
  const DLTensor *k_pages;       /* [num_pages, heads_kv, block_size, head_dim], contiguous */
  const DLTensor *v_pages;       /* same shape and dtype */
  const DLTensor *indptr;        /* int32 [batch + 1], indptr[0] = 0, non-decreasing */
  const DLTensor *indices;       /* int32 [>= indptr[batch]], each in [0, num_pages) */
  const DLTensor *last_page_len; /* int32 [batch] */
} ot_paged_kv;

/*
 * Write the new tokens' keys and values into their pages, optionally rotating k (and
 * q) by RoPE first, in one call. The new tokens of sequence b are the LAST n_b tokens
 * of its page table (the slots ot_kv_cache_reserve just added), n_b from cu_seqlens_new:
 *   cu_seqlens_new int32 [batch + 1] (host-readable on the CPU), n_b <= length_b
 *   k_new, v_new   [T_new, heads_kv, head_dim] in the pages' dtype; rows may be strided
 *   rope           NULL: k is written as given; else the RoPE of ot_rope_forward
 *                  (computed cos / sin, no table) is applied to k before it is stored
 *   positions      int32 / int64 [T_new] or NULL: the RoPE position of each new token;
 *                  NULL means its index in its sequence (length_b - n_b + i)
 *   q, q_out       [T_new, heads_q, head_dim] or both NULL: q rotated into q_out (which
 *                  may be q itself, in place); only with rope
 * k_new and v_new are not modified. Only the slots of the new tokens are written.
 */
OT_API ot_status ot_kv_append(ot_context *ctx, const ot_paged_kv *kv,
                              const DLTensor *cu_seqlens_new, const DLTensor *k_new,
                              const DLTensor *v_new, const ot_rope_params *rope,
                              const DLTensor *positions, const DLTensor *q,
                              const DLTensor *q_out);

/*
 * The prefill form of ot_kv_append: RoPE on q and k and the scatter of k and v into
 * their pages in one call, with the rotated k ALSO written to k_out (which may be k_new
 * itself, in place), for an attention that reads the prompt's keys from the dense
 * buffer rather than from the pages. rope is required; every other argument is
 * ot_kv_append's. k_out: [T_new, heads_kv, head_dim] in the pages' dtype, rows may be
 * strided; k_new itself (the same view) or sharing no memory with any other argument;
 * NULL: exactly ot_kv_append. Bit for bit: the pages' k and k_out hold what
 * ot_rope_forward gives, q_out likewise. On CUDA one kernel reads q, k and v once.
 */
OT_API ot_status ot_rope_kv_append(ot_context *ctx, const ot_rope_params *rope,
                                   const ot_paged_kv *kv, const DLTensor *cu_seqlens_new,
                                   const DLTensor *k_new, const DLTensor *v_new,
                                   const DLTensor *positions, const DLTensor *q,
                                   const DLTensor *q_out, const DLTensor *k_out);

/*
 * Attention of new query tokens over the keys and values in the page table: decode
 * (1 or a few query tokens per sequence, e.g. speculative decoding) and chunked prefill
 * (a chunk of new tokens, already appended, attending to the cached context and to
 * themselves) in one op.
 *   q, out   [T_q, heads_q, head_dim]; sequence b's queries are rows
 *            cu_seqlens_q[b] .. cu_seqlens_q[b+1]-1 (int32 [batch + 1], host-readable
 *            on the CPU); heads_q a multiple of heads_kv (GQA)
 *   lse      float32 [heads_q, T_q] or NULL (natural log, scale included, as
 *            ot_attention_forward's varlen lse)
 * The masks are exactly those of ot_attention_forward for a sequence with Sq = n_b
 * queries and Sk = length_b keys (bottom-right aligned): with causal, query i sees key
 * j iff j <= i + length_b - n_b, i.e. the queries are the last n_b tokens of the
 * sequence. Windows and softcap as there; rows that see no key give out = 0, lse = -inf.
 * The CPU backend splits each sequence's keys (flash-decoding) so that at least
 * 2 x threads tasks of (sequence, kv head, key split) exist, computes the query heads of
 * a GQA group together, and merges the splits by their lse. out must not overlap q or
 * the pages.
 */
OT_API ot_status ot_paged_attention(ot_context *ctx, const ot_attention_params *params,
                                    const DLTensor *q, const DLTensor *cu_seqlens_q,
                                    const ot_paged_kv *kv, const DLTensor *out,
                                    const DLTensor *lse);

/* ============================================================================== */
/* Memory: tracker                                                                 */
/* ============================================================================== */
/*
 * Process-wide counters of the memory the library hands out, by tag and by op name:
 * every arena block (ot_arena_alloc counts as OT_MEMORY_OTHER under op "(none)";
 * ot_arena_alloc_tagged says what and for whom) and every KV pool (OT_MEMORY_KV_CACHE,
 * op "ot_kv_cache_create": the pool's bytes, from its own reservation or from an arena
 * block). Arena reservations themselves are not counted (ot_arena_get_stats has them),
 * so nothing is counted twice. Sizes are the allocator's (rounded to 256 bytes). Any
 * thread may read the counters at any time (one mutex). The names of the first 127
 * distinct ops get their own counters; later names share "(other)". Op names are
 * compared on their first 63 characters.
 */

typedef enum ot_memory_tag {
  OT_MEMORY_WEIGHTS = 0,
  OT_MEMORY_KV_CACHE = 1,
  OT_MEMORY_ACTIVATIONS = 2,
  OT_MEMORY_WORKSPACE = 3,
  OT_MEMORY_OTHER = 4
} ot_memory_tag;
#define OT_MEMORY_NUM_TAGS 5

typedef struct ot_memory_counter {
  size_t current;  /* bytes held now */
  size_t peak;     /* the largest current since start or ot_memory_reset_peaks */
  uint64_t allocs; /* allocations recorded */
  uint64_t frees;  /* releases recorded */
} ot_memory_counter;

/* ot_arena_alloc that records the block under `tag` and `op` (any name, e.g. the op or
 * the model part that asked; NULL = "(none)"). ot_arena_free releases it under the same. */
OT_API ot_status ot_arena_alloc_tagged(ot_arena *arena, size_t bytes, void *stream,
                                       ot_memory_tag tag, const char *op, void **ptr);

OT_API ot_status ot_memory_tag_counter(ot_memory_tag tag, ot_memory_counter *out);
/* All tags together: its peak is the peak of the sum (not the sum of the tags' peaks). */
OT_API ot_status ot_memory_total_counter(ot_memory_counter *out);
/* The counter of an op name (all zeros for a name never recorded). */
OT_API ot_status ot_memory_op_counter(const char *op, ot_memory_counter *out);
/* The op names recorded so far: ot_memory_op_name(i) for i < ot_memory_op_count()
 * (static storage; NULL out of range). */
OT_API int ot_memory_op_count(void);
OT_API const char *ot_memory_op_name(int i);
/* Set every peak to its current value (start of a traced window). */
OT_API void ot_memory_reset_peaks(void);

#ifdef __cplusplus
}
#endif

#endif /* OPS_TRANSFORMER_H */
