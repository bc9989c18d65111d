/*
 * fused_ops_shim.c -- a tiny C shim that lets bench/bench_fused_ops.py (ctypes) call
 * the CUDA kernels of the fused ops on raw device pointers (torch tensors), without
 * the Python frontend and independently of the core's dispatch.
 *
 * It fills the validated argument structs of src/core/{norm,rope,glu,softmax}.h and calls the
 * backend entry points ot_cuda_* directly (the public API validates first and then
 * calls the same functions once the dispatch is wired). Benchmark-only: the caller is
 * trusted to pass consistent shapes. Linked against the static library:
 *   cc -O2 -shared -fPIC bench/fused_ops_shim.c -Iinclude -Isrc -I<dlpack> \
 *      build/libops_transformer.a -lcudart -lcublasLt -lopenblas -lgomp -lm -o libfused_ops_shim.so
 * dtype codes are the core's ot_dtype: 1 float32, 2 float16, 3 bfloat16.
 */
#include <stdbool.h>
#include <string.h>

#include "core/glu.h"
#include "core/norm.h"
#include "core/rope.h"
#include "core/softmax.h"

#include "shim_common.h"

SHIM_API int shim_norm_forward(int layer, void *stream, int dtype, int64_t rows, int64_t cols,
                               const void *x, int64_t xs, const void *res, int64_t rs,
                               const void *w, const void *b, float eps, void *out, int64_t os,
                               void *rout, int64_t ros, float *mean, float *rstd) {
  ot_norm_forward_args a;
  memset(&a, 0, sizeof a);
  a.dtype = (ot_dtype)dtype;
  a.rows = rows;
  a.cols = cols;
  a.x = x;
  a.x_stride = xs;
  a.residual = res;
  a.residual_stride = rs;
  a.weight = w;
  a.bias = b;
  a.eps = eps;
  a.out = out;
  a.out_stride = os;
  a.residual_out = rout;
  a.residual_out_stride = ros;
  a.mean = mean;
  a.rstd = rstd;
  g_ctx->stream = stream;
  return (int)(layer ? ot_cuda_layernorm_forward(g_ctx, &a) : ot_cuda_rmsnorm_forward(g_ctx, &a));
}

SHIM_API int shim_norm_backward(int layer, void *stream, int dtype, int64_t rows, int64_t cols,
                                const void *dy, int64_t dys, const void *dres, int64_t drs,
                                const void *h, int64_t hs, const void *w, const float *mean,
                                const float *rstd, float eps, void *dx, int64_t dxs, void *dw,
                                void *db) {
  ot_norm_backward_args a;
  memset(&a, 0, sizeof a);
  a.dtype = (ot_dtype)dtype;
  a.rows = rows;
  a.cols = cols;
  a.dy = dy;
  a.dy_stride = dys;
  a.dresidual_out = dres;
  a.dresidual_out_stride = drs;
  a.h = h;
  a.h_stride = hs;
  a.weight = w;
  a.mean = mean;
  a.rstd = rstd;
  a.eps = eps;
  a.dx = dx;
  a.dx_stride = dxs;
  a.dweight = dw;
  a.dbias = db;
  g_ctx->stream = stream;
  return (int)(layer ? ot_cuda_layernorm_backward(g_ctx, &a) : ot_cuda_rmsnorm_backward(g_ctx, &a));
}

/* heads[4] = q, k, q_out, k_out head counts (k's 0 when absent); strides[4][3] =
 * (stride_b, stride_s, stride_h) of each; ptrs[4]. */
SHIM_API int shim_rope(void *stream, int dtype, int mode, int inverse, int64_t batch, int64_t seq,
                       int64_t head_dim, int64_t rotary_dim, void **ptrs, const int64_t *heads,
                       const int64_t *strides, const void *positions, int pos_i64, int64_t pos_sb,
                       int64_t pos_ss, const float *cache, int64_t max_position, double theta,
                       double l3_factor, double l3_low, double l3_high, double l3_orig) {
  ot_rope_args a;
  memset(&a, 0, sizeof a);
  a.dtype = (ot_dtype)dtype;
  a.mode = (ot_rope_mode)mode;
  a.inverse = inverse != 0;
  a.batch = batch;
  a.seq = seq;
  a.head_dim = head_dim;
  a.rotary_dim = rotary_dim;
  ot_rope_heads *hs[4] = {&a.q, &a.k, &a.q_out, &a.k_out};
  for (int i = 0; i < 4; i++) {
    hs[i]->data = ptrs[i];
    hs[i]->heads = heads[i];
    hs[i]->stride_b = strides[3 * i];
    hs[i]->stride_s = strides[3 * i + 1];
    hs[i]->stride_h = strides[3 * i + 2];
  }
  a.positions = positions;
  a.pos_dtype = pos_i64 ? OT_I64 : OT_I32;
  a.pos_stride_b = pos_sb;
  a.pos_stride_s = pos_ss;
  a.cos_sin_cache = cache;
  a.max_position = max_position;
  a.theta = theta;
  a.llama3_factor = l3_factor;
  a.llama3_low_freq_factor = l3_low;
  a.llama3_high_freq_factor = l3_high;
  a.llama3_original_max_position = l3_orig;
  g_ctx->stream = stream;
  return (int)ot_cuda_rope(g_ctx, &a);
}

SHIM_API int shim_glu_forward(void *stream, int kind, int dtype, int64_t rows, int64_t F,
                              const void *gate, int64_t gs, const void *up, int64_t us, void *out,
                              int64_t os) {
  ot_glu_forward_args a;
  memset(&a, 0, sizeof a);
  a.kind = (ot_glu_kind)kind;
  a.dtype = (ot_dtype)dtype;
  a.rows = rows;
  a.F = F;
  a.gate = gate;
  a.gate_stride = gs;
  a.up = up;
  a.up_stride = us;
  a.out = out;
  a.out_stride = os;
  g_ctx->stream = stream;
  return (int)ot_cuda_glu_forward(g_ctx, &a);
}

/* ot_glu_backward's kernel and, with out (ot_glu_backward_recompute's), the forward's product
 * [rows, F] at stride os besides dgate / dup. */
static int glu_backward_call(void *stream, int kind, int dtype, int64_t rows, int64_t F,
                             const void *dout, int64_t dos, const void *gate, int64_t gs,
                             const void *up, int64_t us, void *dgate, int64_t dgs, void *dup,
                             int64_t dus, void *out, int64_t os) {
  ot_glu_backward_args a;
  memset(&a, 0, sizeof a);
  a.kind = (ot_glu_kind)kind;
  a.dtype = (ot_dtype)dtype;
  a.rows = rows;
  a.F = F;
  a.dout = dout;
  a.dout_stride = dos;
  a.gate = gate;
  a.gate_stride = gs;
  a.up = up;
  a.up_stride = us;
  a.dgate = dgate;
  a.dgate_stride = dgs;
  a.dup = dup;
  a.dup_stride = dus;
  a.out = out;
  a.out_stride = os;
  g_ctx->stream = stream;
  return (int)ot_cuda_glu_backward(g_ctx, &a);
}

SHIM_API int shim_glu_backward(void *stream, int kind, int dtype, int64_t rows, int64_t F,
                               const void *dout, int64_t dos, const void *gate, int64_t gs,
                               const void *up, int64_t us, void *dgate, int64_t dgs, void *dup,
                               int64_t dus) {
  return glu_backward_call(stream, kind, dtype, rows, F, dout, dos, gate, gs, up, us, dgate, dgs,
                           dup, dus, NULL, 0);
}

SHIM_API int shim_glu_backward_recompute(void *stream, int kind, int dtype, int64_t rows,
                                         int64_t F, const void *dout, int64_t dos,
                                         const void *gate, int64_t gs, const void *up, int64_t us,
                                         void *dgate, int64_t dgs, void *dup, int64_t dus,
                                         void *out, int64_t os) {
  return glu_backward_call(stream, kind, dtype, rows, F, dout, dos, gate, gs, up, us, dgate, dgs,
                           dup, dus, out, os);
}

/* Cross-entropy: reduction 0 MEAN, 1 SUM, 2 NONE; loss / dloss stride 0 for MEAN / SUM;
 * lse NULL or [N] at lse_stride. */
static void ce_fill(ot_cross_entropy_args *a, int dtype, int64_t N, int64_t V, const void *z,
                    int64_t zs, const void *labels, int64_t ys, int labels_i64, int64_t ignore,
                    float smoothing, int reduction, float *lse, int64_t lses) {
  memset(a, 0, sizeof *a);
  a->dtype = (ot_dtype)dtype;
  a->N = N;
  a->V = V;
  a->logits = z;
  a->logits_stride = zs;
  a->labels = labels;
  a->labels_dtype = labels_i64 ? OT_I64 : OT_I32;
  a->labels_stride = ys;
  a->ignore_index = ignore;
  a->label_smoothing = smoothing;
  a->reduction = (ot_reduction)reduction;
  a->count = -1;
  a->lse = lse;
  a->lse_stride = lses;
}

SHIM_API int shim_ce_forward(void *stream, int dtype, int64_t N, int64_t V, const void *z,
                             int64_t zs, const void *labels, int64_t ys, int labels_i64,
                             int64_t ignore, float smoothing, int reduction, float *loss,
                             int64_t loss_stride, float *lse, int64_t lses) {
  ot_cross_entropy_args a;
  ce_fill(&a, dtype, N, V, z, zs, labels, ys, labels_i64, ignore, smoothing, reduction, lse, lses);
  a.loss = loss;
  a.loss_stride = loss_stride;
  g_ctx->stream = stream;
  return (int)ot_cuda_cross_entropy_forward(g_ctx, &a);
}

SHIM_API int shim_ce_backward(void *stream, int dtype, int64_t N, int64_t V, const float *dloss,
                              int64_t dloss_stride, const void *z, int64_t zs, const void *labels,
                              int64_t ys, int labels_i64, int64_t ignore, float smoothing,
                              int reduction, float *lse, int64_t lses, void *dz, int64_t dzs) {
  ot_cross_entropy_args a;
  ce_fill(&a, dtype, N, V, z, zs, labels, ys, labels_i64, ignore, smoothing, reduction, lse, lses);
  a.dloss = dloss;
  a.dloss_stride = dloss_stride;
  a.dlogits = dz;
  a.dlogits_stride = dzs;
  g_ctx->stream = stream;
  return (int)ot_cuda_cross_entropy_backward(g_ctx, &a);
}
