/* glu.c -- ot_glu_forward / ot_glu_backward: validation and dispatch. */
#include <inttypes.h>

#include "backend.h"
#include "glu.h"

static ot_status check_kind(const char *op, ot_glu_kind kind) {
  if ((int)kind < (int)OT_GLU_SWIGLU || (int)kind > (int)OT_GLU_GEGLU_TANH)
    return ot_error(OT_ERR_INVALID_ARGUMENT, op,
                    "kind: %d is not an ot_glu_kind (0 SWIGLU, 1 GEGLU, 2 GEGLU_TANH)",
                    (int)kind);
  return OT_OK;
}

/* out / dout shape in the fused layout: gate's leading dims and F. */
static ot_status check_half_shape(const char *op, const char *name, const ot_view *v,
                                  const ot_view *gate, int64_t F) {
  OT_TRY(ot_check_ndim(op, name, v, gate->ndim, gate->ndim));
  for (int i = 0; i < gate->ndim - 1; i++)
    OT_TRY(ot_check_dim(op, name, v, i, gate->shape[i], "the leading dimensions of gate"));
  return ot_check_dim(op, name, v, gate->ndim - 1, F,
                      "F, half of gate's last dimension in the fused layout");
}

/* gate (and up when present): float, [..., F] or fused [..., 2F]; returns F. */
static ot_status check_gate_up(const char *op, const ot_context *ctx, const DLTensor *gate,
                               const DLTensor *up, ot_view *g, ot_rows *gr, ot_view *u,
                               ot_rows *ur, int64_t *F) {
  OT_TRY(ot_view_of(op, "gate", ctx, gate, g));
  OT_TRY(ot_check_float(op, "gate", g));
  OT_TRY(ot_as_rows(op, "gate", g, gr));
  OT_TRY(ot_view_of_optional(op, "up", ctx, up, u));
  if (ot_view_present(u)) {
    OT_TRY(ot_check_dtype(op, "up", u, g->dtype, "gate"));
    OT_TRY(ot_check_same_shape(op, "up", u, "gate", g));
    OT_TRY(ot_as_rows(op, "up", u, ur));
    *F = gr->cols;
  } else {
    if (gr->cols % 2)
      return ot_error(OT_ERR_INVALID_ARGUMENT, op,
                      "gate: last dimension %" PRId64
                      " is odd; with up == NULL gate holds the gate and up halves [..., 2F] "
                      "and must be even",
                      gr->cols);
    *F = gr->cols / 2;
    memset(ur, 0, sizeof *ur);
  }
  return OT_OK;
}

ot_status ot_glu_forward(ot_context *ctx, ot_glu_kind kind, const DLTensor *gate,
                         const DLTensor *up, const DLTensor *out) {
  static const char op[] = "ot_glu_forward";
  if (!ctx) return ot_error(OT_ERR_INVALID_ARGUMENT, op, "ctx: is NULL");
  OT_TRY(check_kind(op, kind));
  ot_view g, u, o;
  ot_rows gr, ur, orow;
  int64_t F = 0;
  OT_TRY(check_gate_up(op, ctx, gate, up, &g, &gr, &u, &ur, &F));
  OT_TRY(ot_view_of(op, "out", ctx, out, &o));
  OT_TRY(ot_check_dtype(op, "out", &o, g.dtype, "gate"));
  if (ot_view_present(&u)) OT_TRY(ot_check_same_shape(op, "out", &o, "gate", &g));
  else OT_TRY(check_half_shape(op, "out", &o, &g, F));
  OT_TRY(ot_as_rows(op, "out", &o, &orow));
  OT_TRY(ot_check_no_overlap(op, "out", &o, "gate", &g, false));
  OT_TRY(ot_check_no_overlap(op, "out", &o, "up", &u, false));

  ot_glu_forward_args a;
  a.kind = kind;
  a.dtype = g.dtype;
  a.rows = gr.rows;
  a.F = F;
  a.gate = g.data;
  a.gate_stride = gr.row_stride;
  if (ot_view_present(&u)) {
    a.up = u.data;
    a.up_stride = ur.row_stride;
  } else {
    a.up = ot_ptr(g.data, g.dtype, F);
    a.up_stride = gr.row_stride;
  }
  a.out = o.data;
  a.out_stride = orow.row_stride;
  if (ot_ctx_is_cuda(ctx)) return OT_CUDA_CALL(op, ot_cuda_glu_forward, ctx, &a);
  return ot_cpu_glu_forward(ctx, &a);
}

/* ot_glu_backward and, with out (recompute), ot_glu_backward_recompute. */
static ot_status glu_backward(const char *op, ot_context *ctx, ot_glu_kind kind,
                              const DLTensor *dout, const DLTensor *gate, const DLTensor *up,
                              const DLTensor *dgate, const DLTensor *dup, const DLTensor *out,
                              bool recompute) {
  if (!ctx) return ot_error(OT_ERR_INVALID_ARGUMENT, op, "ctx: is NULL");
  OT_TRY(check_kind(op, kind));
  ot_view d, g, u, dg, du;
  ot_rows dr, gr, ur, dgr, dur;
  int64_t F = 0;
  OT_TRY(ot_view_of(op, "dout", ctx, dout, &d));
  OT_TRY(ot_check_float(op, "dout", &d));
  OT_TRY(ot_as_rows(op, "dout", &d, &dr));
  OT_TRY(check_gate_up(op, ctx, gate, up, &g, &gr, &u, &ur, &F));
  OT_TRY(ot_check_dtype(op, "gate", &g, d.dtype, "dout"));
  bool fused = !ot_view_present(&u);
  if (fused) OT_TRY(check_half_shape(op, "dout", &d, &g, F));
  else OT_TRY(ot_check_same_shape(op, "dout", &d, "gate", &g));

  OT_TRY(ot_view_of(op, "dgate", ctx, dgate, &dg));
  OT_TRY(ot_check_dtype(op, "dgate", &dg, d.dtype, "dout"));
  OT_TRY(ot_check_same_shape(op, "dgate", &dg, "gate", &g));
  OT_TRY(ot_as_rows(op, "dgate", &dg, &dgr));
  if (fused) {
    if (dup)
      return ot_error(OT_ERR_INVALID_ARGUMENT, op,
                      "dup: must be NULL when up is NULL (fused layout: dgate [..., 2F] holds "
                      "both halves)");
    du.ndim = -1;
    memset(&dur, 0, sizeof dur);
  } else {
    if (!dup)
      return ot_error(OT_ERR_INVALID_ARGUMENT, op,
                      "dup: tensor is NULL (required when up is given)");
    OT_TRY(ot_view_of(op, "dup", ctx, dup, &du));
    OT_TRY(ot_check_dtype(op, "dup", &du, d.dtype, "dout"));
    OT_TRY(ot_check_same_shape(op, "dup", &du, "up", &u));
    OT_TRY(ot_as_rows(op, "dup", &du, &dur));
  }
  OT_TRY(ot_check_no_overlap(op, "dgate", &dg, "dout", &d, false));
  OT_TRY(ot_check_no_overlap(op, "dgate", &dg, "gate", &g, true));
  OT_TRY(ot_check_no_overlap(op, "dgate", &dg, "up", &u, false));
  OT_TRY(ot_check_no_overlap(op, "dgate", &dg, "dup", &du, false));
  OT_TRY(ot_check_no_overlap(op, "dup", &du, "dout", &d, false));
  OT_TRY(ot_check_no_overlap(op, "dup", &du, "gate", &g, false));
  OT_TRY(ot_check_no_overlap(op, "dup", &du, "up", &u, true));
  ot_view o;
  ot_rows orow;
  memset(&orow, 0, sizeof orow);
  o.ndim = -1;
  if (recompute) {
    if (!out) return ot_error(OT_ERR_INVALID_ARGUMENT, op, "out: tensor is NULL");
    OT_TRY(ot_view_of(op, "out", ctx, out, &o));
    OT_TRY(ot_check_dtype(op, "out", &o, d.dtype, "dout"));
    OT_TRY(ot_check_same_shape(op, "out", &o, "dout", &d));
    OT_TRY(ot_as_rows(op, "out", &o, &orow));
    OT_TRY(ot_check_no_overlap(op, "out", &o, "dout", &d, false));
    OT_TRY(ot_check_no_overlap(op, "out", &o, "gate", &g, false));
    OT_TRY(ot_check_no_overlap(op, "out", &o, "up", &u, false));
    OT_TRY(ot_check_no_overlap(op, "out", &o, "dgate", &dg, false));
    OT_TRY(ot_check_no_overlap(op, "out", &o, "dup", &du, false));
  }

  ot_glu_backward_args a;
  a.kind = kind;
  a.dtype = d.dtype;
  a.rows = dr.rows;
  a.F = F;
  a.dout = d.data;
  a.dout_stride = dr.row_stride;
  a.gate = g.data;
  a.gate_stride = gr.row_stride;
  a.dgate = dg.data;
  a.dgate_stride = dgr.row_stride;
  if (fused) {
    a.up = ot_ptr(g.data, g.dtype, F);
    a.up_stride = gr.row_stride;
    a.dup = ot_ptr(dg.data, dg.dtype, F);
    a.dup_stride = dgr.row_stride;
  } else {
    a.up = u.data;
    a.up_stride = ur.row_stride;
    a.dup = du.data;
    a.dup_stride = dur.row_stride;
  }
  a.out = recompute ? o.data : NULL;
  a.out_stride = orow.row_stride;
  if (ot_ctx_is_cuda(ctx)) return OT_CUDA_CALL(op, ot_cuda_glu_backward, ctx, &a);
  return ot_cpu_glu_backward(ctx, &a);
}

ot_status ot_glu_backward(ot_context *ctx, ot_glu_kind kind, const DLTensor *dout,
                          const DLTensor *gate, const DLTensor *up, const DLTensor *dgate,
                          const DLTensor *dup) {
  return glu_backward("ot_glu_backward", ctx, kind, dout, gate, up, dgate, dup, NULL, false);
}

ot_status ot_glu_backward_recompute(ot_context *ctx, ot_glu_kind kind, const DLTensor *dout,
                                    const DLTensor *gate, const DLTensor *up,
                                    const DLTensor *dgate, const DLTensor *dup,
                                    const DLTensor *out) {
  return glu_backward("ot_glu_backward_recompute", ctx, kind, dout, gate, up, dgate, dup, out,
                      true);
}
