/* offload.c -- weight streaming (--offload, CUDA): the decoder layers' weights live in
 * pinned host memory, one contiguous block per layer, and are copied on a second stream
 * into a ring of R device slots, each the size of one layer. Embeddings, the final norm
 * and lm_head stay resident.
 *
 * Order of work (slot s = l % R holds layer l):
 *   copy stream:    wait free[s]; copy layer l -> slot s; record ready[s]
 *   compute stream: wait ready[s]; layer l's ops; record free[s]; then the copy of layer
 *                   (l + R) mod L is enqueued into the same slot (the ring always holds the
 *                   next R layers, across steps, so the next step's first layers are
 *                   already on their way while lm_head and sampling run)
 * The prefetch distance is R - 1 layers. Copies are serial on their stream, so a step
 * costs about L * max(t_copy, t_layer): streaming hides the copies only where a layer's
 * compute takes longer than its copy (prefill of long prompts); decode at batch 1 is
 * copy-bound. The rule: R - 1 = ceil(t_copy / t_layer) layers ahead hide every copy, with
 * t_copy = layer bytes / measured H2D bandwidth (timed at load) and t_layer measured on the
 * compute stream (events around every layer of the last forward); R is capped by the ring
 * budget (OTE_OFFLOAD_RING slots, default 2: double buffering) and by L. ote_offload_report
 * prints the measured numbers and the distance the rule asks for.
 * With a budget (options.offload_budget: device bytes for every weight), the first layers
 * that fit beside the embeddings, lm_head and the ring stay resident and only the last
 * S = L - first layers stream, through a ring over those S (slot (l - first) % R); a step
 * then copies S layers, and the copy bound is S * layer bytes / H2D bandwidth.
 * With R == S every layer stays resident after the first step (no copies).
 * Decode graphs are off while streaming (the graph would have to contain both streams). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"

#ifdef OT_HAVE_CUDA
#include <cuda_runtime_api.h>

static ot_status ck(cudaError_t err, const char *what) {
  if (err == cudaSuccess) return OT_OK;
  (void)cudaGetLastError();
  return ote_error(err == cudaErrorMemoryAllocation ? OT_ERR_OOM : OT_ERR_BACKEND,
                   "engine: offload: %s: %s", what, cudaGetErrorString(err));
}
#define CS(e) ((cudaStream_t)(e)->dev.stream)
#endif

static size_t r256(size_t b) { return (b + 255) / 256 * 256; }

/* Bytes of one layer's block, in the order weights.c allocates its tensors. */
size_t ote_offload_layer_bytes(const ote_config *c, size_t es) {
  size_t H = (size_t)c->hidden, D = (size_t)c->head_dim, F = (size_t)c->ffn;
  size_t qkv = (size_t)(c->heads + 2 * c->kv_heads) * D, q = (size_t)c->heads * D;
  size_t b = 2 * r256(H * es) + r256(qkv * H * es) + r256(H * q * es) + r256(2 * F * H * es) +
             r256(H * F * es);
  if (c->qkv_bias) b += r256(qkv * es);
  if (c->o_bias) b += r256(H * es);
  return b;
}

ot_status ote_offload_init(ote_engine *e) {
  ote_offload *o = &e->off;
#ifdef OT_HAVE_CUDA
  const ote_config *c = &e->cfg;
  o->layer_bytes = ote_offload_layer_bytes(c, ote_dtype_size(e->opt.dtype));
  const char *env = getenv("OTE_OFFLOAD_RING");
  o->ring = env && atoi(env) > 0 ? atoi(env) : 2;
  o->first = 0;
  if (e->opt.offload_budget > 0) {
    size_t es = ote_dtype_size(e->opt.dtype), H = (size_t)c->hidden, V = (size_t)c->vocab;
    size_t fixed = r256(V * H * es) * (c->tie_word_embeddings ? 1 : 2) + r256(H * es);
    size_t ring_b = o->layer_bytes * (size_t)o->ring, b = e->opt.offload_budget;
    size_t fit = b > fixed + ring_b ? (b - fixed - ring_b) / o->layer_bytes : 0;
    o->first = fit < (size_t)c->layers ? (int)fit : c->layers;
  }
  int S = c->layers - o->first;
  if (S == 0) { /* everything fits: nothing to stream */
    o->ring = 0;
    return OT_OK;
  }
  if (o->ring > S) o->ring = S;
  o->host = calloc((size_t)c->layers, sizeof *o->host);
  o->slot_layer = malloc(sizeof *o->slot_layer * (size_t)o->ring);
  o->ready = calloc((size_t)o->ring, sizeof *o->ready);
  o->free_ev = calloc((size_t)o->ring, sizeof *o->free_ev);
  o->t_ev = calloc((size_t)c->layers + 1, sizeof *o->t_ev);
  if (!o->host || !o->slot_layer || !o->ready || !o->free_ev || !o->t_ev)
    return ote_error(OT_ERR_OOM, "engine: out of memory");
  for (int s = 0; s < o->ring; s++) o->slot_layer[s] = -1;
  for (int l = o->first; l < c->layers; l++)
    OTE_TRY(ck(cudaHostAlloc(&o->host[l], o->layer_bytes, cudaHostAllocPortable),
               "pinned host memory for a layer"));
  OTE_TRY(ck(cudaMalloc(&o->ring_dev, o->layer_bytes * (size_t)o->ring), "the ring of layer slots"));
  cudaStream_t s;
  OTE_TRY(ck(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "copy stream"));
  o->copy_stream = s;
  for (int i = 0; i < o->ring; i++) {
    cudaEvent_t a, b;
    OTE_TRY(ck(cudaEventCreateWithFlags(&a, cudaEventDisableTiming), "event"));
    o->ready[i] = a;
    OTE_TRY(ck(cudaEventCreateWithFlags(&b, cudaEventDisableTiming), "event"));
    o->free_ev[i] = b;
  }
  for (int l = 0; l <= c->layers; l++) {
    cudaEvent_t a;
    OTE_TRY(ck(cudaEventCreate(&a), "event"));
    o->t_ev[l] = a;
  }
  o->on = 1;
  e->graphs_off = 1;
  snprintf(e->graph_note, sizeof e->graph_note, "off (weight streaming)");
  return OT_OK;
#else
  (void)o;
  return ote_error(OT_ERR_NO_DEVICE, "engine: --offload needs the CUDA backend");
#endif
}

void ote_offload_free(ote_engine *e) {
  ote_offload *o = &e->off;
#ifdef OT_HAVE_CUDA
  if (o->copy_stream) cudaStreamSynchronize((cudaStream_t)o->copy_stream);
  if (o->host)
    for (int l = 0; l < e->cfg.layers; l++)
      if (o->host[l]) cudaFreeHost(o->host[l]);
  if (o->ring_dev) cudaFree(o->ring_dev);
  for (int i = 0; o->ready && i < o->ring; i++) {
    if (o->ready[i]) cudaEventDestroy((cudaEvent_t)o->ready[i]);
    if (o->free_ev[i]) cudaEventDestroy((cudaEvent_t)o->free_ev[i]);
  }
  for (int l = 0; o->t_ev && l <= e->cfg.layers; l++)
    if (o->t_ev[l]) cudaEventDestroy((cudaEvent_t)o->t_ev[l]);
  if (o->copy_stream) cudaStreamDestroy((cudaStream_t)o->copy_stream);
#endif
  free(o->host);
  free(o->slot_layer);
  free(o->ready);
  free(o->free_ev);
  free(o->t_ev);
  memset(o, 0, sizeof *o);
}

#ifdef OT_HAVE_CUDA
/* Enqueue the copy of layer l into its slot (after the slot's previous layer is done). */
static ot_status issue_copy(ote_engine *e, int l) {
  ote_offload *o = &e->off;
  int s = (l - o->first) % o->ring;
  if (o->slot_layer[s] == l) return OT_OK; /* already there (R == L) */
  cudaStream_t cs = (cudaStream_t)o->copy_stream;
  if (o->slot_layer[s] >= 0) OTE_TRY(ck(cudaStreamWaitEvent(cs, (cudaEvent_t)o->free_ev[s], 0), "wait"));
  OTE_TRY(ck(cudaMemcpyAsync((char *)o->ring_dev + (size_t)s * o->layer_bytes, o->host[l],
                             o->layer_bytes, cudaMemcpyHostToDevice, cs),
             "layer copy"));
  OTE_TRY(ck(cudaEventRecord((cudaEvent_t)o->ready[s], cs), "record"));
  o->slot_layer[s] = l;
  return OT_OK;
}
#endif

/* The first R layers into the ring (once; later steps find them there or on the way). */
ot_status ote_offload_prime(ote_engine *e) {
#ifdef OT_HAVE_CUDA
  ote_offload *o = &e->off;
  if (!o->on || o->primed) return OT_OK;
  for (int l = o->first; l < o->first + o->ring; l++) OTE_TRY(issue_copy(e, l));
  o->primed = 1;
  return OT_OK;
#else
  (void)e;
  return OT_OK;
#endif
}

/* Layer l's weights as device pointers in its slot (waits for its copy on the compute
 * stream); *w = the host layout translated. */
ot_status ote_offload_layer_begin(ote_engine *e, int l, ote_layer_weights *w) {
#ifdef OT_HAVE_CUDA
  ote_offload *o = &e->off;
  const ote_layer_weights *h = &e->w.layer[l];
  if (l < o->first) { /* resident */
    if (l == 0) OTE_TRY(ck(cudaEventRecord((cudaEvent_t)o->t_ev[0], CS(e)), "record"));
    *w = *h;
    return OT_OK;
  }
  int s = (l - o->first) % o->ring;
  if (o->slot_layer[s] != l) OTE_TRY(issue_copy(e, l)); /* not prefetched (first use) */
  OTE_TRY(ck(cudaStreamWaitEvent(CS(e), (cudaEvent_t)o->ready[s], 0), "wait"));
  if (l == 0) OTE_TRY(ck(cudaEventRecord((cudaEvent_t)o->t_ev[0], CS(e)), "record"));
  char *base = (char *)o->ring_dev + (size_t)s * o->layer_bytes, *hb = (char *)o->host[l];
#define TR(p) ((p) ? (void *)(base + ((char *)(p) - hb)) : NULL)
  w->attn_norm = TR(h->attn_norm);
  w->qkv = TR(h->qkv);
  w->qkv_bias = TR(h->qkv_bias);
  w->o = TR(h->o);
  w->o_bias = TR(h->o_bias);
  w->mlp_norm = TR(h->mlp_norm);
  w->gate_up = TR(h->gate_up);
  w->down = TR(h->down);
#undef TR
  return OT_OK;
#else
  (void)e, (void)l, (void)w;
  return ote_error(OT_ERR_NO_DEVICE, "engine: offload without CUDA");
#endif
}

/* After layer l's ops: its slot is free once they finish; the layer R ahead goes in. */
ot_status ote_offload_layer_end(ote_engine *e, int l) {
#ifdef OT_HAVE_CUDA
  ote_offload *o = &e->off;
  int L = e->cfg.layers, S = L - o->first, i = l - o->first;
  OTE_TRY(ck(cudaEventRecord((cudaEvent_t)o->t_ev[l + 1], CS(e)), "record"));
  if (i < 0) return OT_OK; /* resident */
  OTE_TRY(ck(cudaEventRecord((cudaEvent_t)o->free_ev[i % o->ring], CS(e)), "record"));
  if (o->ring < S) OTE_TRY(issue_copy(e, o->first + (i + o->ring) % S));
  return OT_OK;
#else
  (void)e, (void)l;
  return OT_OK;
#endif
}

/* After a synchronized forward: the layers' compute time (events; it includes waiting for
 * copies that were late, so it is measured on the last step whose copies were hidden, or
 * bounds it from above) and, once, the H2D bandwidth. */
void ote_offload_measure(ote_engine *e) {
#ifdef OT_HAVE_CUDA
  ote_offload *o = &e->off;
  if (!o->on) return;
  float ms = 0;
  if (cudaEventElapsedTime(&ms, (cudaEvent_t)o->t_ev[0], (cudaEvent_t)o->t_ev[e->cfg.layers]) ==
      cudaSuccess)
    o->layer_ms = ms / (float)e->cfg.layers;
  (void)cudaGetLastError();
  if (o->h2d_GBps == 0) {
    /* one layer copied on the copy stream, into a slot not in use now (synchronized) */
    cudaStream_t cs = (cudaStream_t)o->copy_stream;
    cudaStreamSynchronize(cs);
    cudaEvent_t a = (cudaEvent_t)o->t_ev[0], b = (cudaEvent_t)o->t_ev[1];
    int s = 0, l = o->slot_layer[0] >= 0 ? o->slot_layer[0] : o->first;
    cudaEventRecord(a, cs);
    cudaMemcpyAsync((char *)o->ring_dev + (size_t)s * o->layer_bytes, o->host[l], o->layer_bytes,
                    cudaMemcpyHostToDevice, cs);
    cudaEventRecord(b, cs);
    if (cudaEventSynchronize(b) == cudaSuccess && cudaEventElapsedTime(&ms, a, b) == cudaSuccess &&
        ms > 0)
      o->h2d_GBps = (double)o->layer_bytes / (ms * 1e-3) / 1e9;
    (void)cudaGetLastError();
  }
#else
  (void)e;
#endif
}

void ote_offload_report(const ote_engine *e, char *buf, size_t len) {
  const ote_offload *o = &e->off;
  if (!o->on) { /* not asked for, or the budget holds every layer */
    snprintf(buf, len, e->opt.offload ? "every layer resident (the budget holds all the weights)"
                                      : "off");
    return;
  }
  double t_copy = o->h2d_GBps > 0 ? (double)o->layer_bytes / (o->h2d_GBps * 1e9) * 1e3 : 0;
  int want = o->layer_ms > 0 ? (int)(t_copy / o->layer_ms + 0.999) : -1;
  int S = e->cfg.layers - o->first;
  snprintf(buf, len,
           "%d layers resident, %d streamed; ring of %d layer slots (%.1f MiB each; prefetch "
           "distance %d layers), H2D %.1f GB/s (%.2f ms per layer; copy bound %.2f ms per "
           "forward), layer compute %.3f ms (last step): the rule wants %d layers ahead%s",
           o->first, S, o->ring, (double)o->layer_bytes / 1048576.0, o->ring - 1, o->h2d_GBps,
           t_copy, t_copy * S, o->layer_ms, want,
           want >= 0 && want > o->ring - 1 ? " (copy-bound: raise OTE_OFFLOAD_RING if memory allows)"
                                          : "");
}
