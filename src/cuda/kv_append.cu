/*
 * kv_append.cu -- ot_kv_append on CUDA: RoPE on the new tokens' k (and q) and the
 * scatter of k and v into their pages, in one launch.
 *
 * Grid (token, head slot): slot y < heads_q rotates q row (token, y) into q_out; the next
 * heads_kv slots rotate k row (token, h) into its page slot, the last heads_kv copy v.
 * A block finds its sequence by binary search over cu_seqlens_new, its slot from the
 * page table (token t of sequence b is the last n_b of its length_b), and rotates with
 * the device functions of rope.cuh -- the same cos / sin and the same rotation
 * expression as ot_rope_forward, so the cached keys are bit for bit the op's. One pair
 * (NeoX: x[i], x[half + i]; GPT-J: x[2i], x[2i + 1]) per thread; features [rd, D) are
 * copied. Appends are a few KB per token: the simple scalar form is far from mattering
 * next to the attention that reads the whole cache.
 */
#include "../core/paged_attention.h"
#include "common.cuh"
#include "cuda_state.h"
#include "paged_common.cuh"
#include "rope.cuh"

namespace ot {

struct append_params {
  void *k_pages, *v_pages;
  const int32_t *indptr, *indices, *lpl, *cu;
  int64_t num_pages, num_indices, batch, tokens;
  int hkv, bs, d, hq;
  const void *k_new, *v_new;
  int64_t k_ts, k_hs, v_ts, v_hs;
  const void *q;
  void *q_out;
  int64_t q_ts, q_hs, qo_ts, qo_hs;
  const void *positions;
  int pos_i64;
  int64_t pos_stride;
  int *err; /* OT_DEBUG flag or NULL */
  /* RoPE (has_rope == 0: plain copy); field names as rope.cuh expects */
  int has_rope, gptj;
  int64_t rotary_dim, half;
  double theta, l3_factor, l3_low, l3_high, l3_orig;
  double inv_freq[kRopeMaxHalfByValue];
};

/* One row of D features: rotated (rope) or copied from src to dst. */
template <typename T>
__device__ void append_row(const append_params &p, const T *src, T *dst, int64_t pos,
                           bool rotate) {
  const int64_t D = p.d;
  int64_t first_copy = 0;
  if (rotate) {
    const int64_t half = p.half;
    for (int64_t j = threadIdx.x; j < half; j += blockDim.x) {
      float c, sn;
      rope_cos_sin(p, pos, j, &c, &sn);
      const int64_t e1 = p.gptj ? 2 * j : j, e2 = p.gptj ? 2 * j + 1 : half + j;
      float y1, y2;
      rope_rotate(to_f32(src[e1]), to_f32(src[e2]), c, sn, &y1, &y2);
      dst[e1] = from_f32<T>(y1);
      dst[e2] = from_f32<T>(y2);
    }
    first_copy = p.rotary_dim;
  }
  for (int64_t e = first_copy + threadIdx.x; e < D; e += blockDim.x) dst[e] = src[e];
}

template <typename T>
__global__ void __launch_bounds__(64) kv_append_kernel(const __grid_constant__ append_params p) {
  const int y = blockIdx.y;
  for (int64_t tok = blockIdx.x; tok < p.tokens; tok += gridDim.x) {
    const int64_t b = paged_seq_of(p.cu, p.batch, tok);
    if (!paged_cu_ok(p.cu, b, p.batch, p.tokens, p.err)) return;
    const int64_t len = paged_seq_len(p.indptr, p.lpl, b, p.bs, p.num_indices, p.err);
    if (len < 0) return;
    const int64_t n = (int64_t)p.cu[b + 1] - p.cu[b], i = tok - p.cu[b];
    if (n > len) {
      if (p.err) paged_flag(p.err, kPagedTooManyNew, b, b, n);
      return;
    }
    const int64_t t = len - n + i;
    int64_t pos = t;
    if (p.positions)
      pos = p.pos_i64 ? static_cast<const int64_t *>(p.positions)[tok * p.pos_stride]
                      : (int64_t) static_cast<const int32_t *>(p.positions)[tok * p.pos_stride];
    if (y < p.hq) {
      const T *src = static_cast<const T *>(p.q) + tok * p.q_ts + y * p.q_hs;
      T *dst = static_cast<T *>(p.q_out) + tok * p.qo_ts + y * p.qo_hs;
      append_row<T>(p, src, dst, pos, true);
      continue;
    }
    const int64_t pidx = (int64_t)p.indptr[b] + t / p.bs;
    const int32_t page = p.indices[pidx];
    if (p.err && (page < 0 || page >= p.num_pages)) {
      paged_flag(p.err, kPagedBadIndex, b, pidx, page);
      return;
    }
    const bool is_k = y < p.hq + p.hkv;
    const int h = is_k ? y - p.hq : y - p.hq - p.hkv;
    const int64_t off = (((int64_t)page * p.hkv + h) * p.bs + t % p.bs) * p.d;
    if (is_k) {
      const T *src = static_cast<const T *>(p.k_new) + tok * p.k_ts + h * p.k_hs;
      append_row<T>(p, src, static_cast<T *>(p.k_pages) + off, pos, p.has_rope != 0);
    } else {
      const T *src = static_cast<const T *>(p.v_new) + tok * p.v_ts + h * p.v_hs;
      append_row<T>(p, src, static_cast<T *>(p.v_pages) + off, pos, false);
    }
  }
}

} /* namespace ot */

extern "C" ot_status ot_cuda_kv_append(ot_context *ctx, const ot_kv_append_args *a) {
  static const char *op = "ot_kv_append";
  const ot_paged_table *t = &a->kv;
  if (a->tokens == 0) return OT_OK;
  ot::append_params p;
  memset(&p, 0, sizeof p);
  ot_paged_fill_table(p, t);
  p.cu = a->cu_new;
  p.tokens = a->tokens;
  p.k_new = a->k_new;
  p.v_new = a->v_new;
  p.k_ts = a->k_tok_stride;
  p.k_hs = a->k_head_stride;
  p.v_ts = a->v_tok_stride;
  p.v_hs = a->v_head_stride;
  if (a->rope) {
    const ot_rope_args *r = a->rope;
    p.has_rope = 1;
    p.gptj = r->mode == OT_ROPE_GPTJ;
    p.rotary_dim = r->rotary_dim;
    p.half = r->rotary_dim / 2;
    p.theta = r->theta;
    p.l3_factor = r->llama3_factor;
    p.l3_low = r->llama3_low_freq_factor;
    p.l3_high = r->llama3_high_freq_factor;
    p.l3_orig = r->llama3_original_max_position;
    if (p.half <= ot::kRopeMaxHalfByValue) ot_rope_inv_freq(r, p.inv_freq);
    p.hq = (int)a->hq;
    p.q = a->q;
    p.q_out = a->q_out;
    p.q_ts = a->q_tok_stride;
    p.q_hs = a->q_head_stride;
    p.qo_ts = a->qo_tok_stride;
    p.qo_hs = a->qo_head_stride;
    p.positions = a->positions;
    p.pos_i64 = a->pos_dtype == OT_I64;
    p.pos_stride = a->pos_stride;
  }
  cudaStream_t s = (cudaStream_t)ctx->stream;
  const bool debug = ot_paged_debug();
  if (debug) {
    p.err = (int *)ot_cuda_scratch(ctx, 256, op);
    if (!p.err) return OT_ERR_OOM;
    OT_CUDA_CHECK(op, cudaMemsetAsync(p.err, 0, 4 * sizeof(int), s));
  }
  const int64_t slots = (int64_t)p.hq + 2 * t->hkv;
  if (slots > 65535)
    return ot_error(OT_ERR_UNSUPPORTED, op, "%lld head rows per token (heads_q + 2 heads_kv), "
                    "the CUDA kernel handles up to 65535", (long long)slots);
  const dim3 grid((unsigned)(a->tokens < 0x7fffffff ? a->tokens : 0x7fffffff), (unsigned)slots);
  switch (a->dtype) {
    case OT_F32: ot::kv_append_kernel<float><<<grid, 64, 0, s>>>(p); break;
    case OT_F16: ot::kv_append_kernel<__half><<<grid, 64, 0, s>>>(p); break;
    case OT_BF16: ot::kv_append_kernel<__nv_bfloat16><<<grid, 64, 0, s>>>(p); break;
    default: return ot_error(OT_ERR_INTERNAL, op, "unexpected dtype %d", (int)a->dtype);
  }
  OT_CUDA_CHECK_LAUNCH(op);
  if (debug) return ot_paged_debug_report(ctx, op, p.err, "cu_seqlens_new");
  return OT_OK;
}
