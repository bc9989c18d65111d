/* internal.h -- private declarations shared by the engine's files. */
#ifndef OT_ENGINE_INTERNAL_H
#define OT_ENGINE_INTERNAL_H

#include <stdarg.h>
#include <stdbool.h>

#include "engine.h"

/* ---- errors ---------------------------------------------------------------------- */
#if defined(__GNUC__)
#define OTE_PRINTF(a, b) __attribute__((format(printf, a, b)))
#else
#define OTE_PRINTF(a, b)
#endif
/* Sets the thread's message and returns status. */
ot_status ote_error(ot_status status, const char *fmt, ...) OTE_PRINTF(2, 3);
/* Wraps a failed public op: "<what>: <ot_last_error()>". */
ot_status ote_op_error(ot_status status, const char *what);
#define OTE_TRY(expr)                 \
  do {                                \
    ot_status ote_try_st_ = (expr);   \
    if (ote_try_st_ != OT_OK) return ote_try_st_; \
  } while (0)

/* ---- dtypes ---------------------------------------------------------------------- */
size_t ote_dtype_size(DLDataType dt);
const char *ote_dtype_name(DLDataType dt);
bool ote_dtype_eq(DLDataType a, DLDataType b);
extern const DLDataType OTE_F32, OTE_F16, OTE_BF16, OTE_I32;
/* n values of src_dtype at src -> dst_dtype at dst (float32 / float16 / bfloat16). */
void ote_convert(void *dst, DLDataType dst_dtype, const void *src, DLDataType src_dtype, size_t n);
double ote_now_ms(void); /* CLOCK_MONOTONIC, milliseconds */

/* ---- device memory: the operations that differ between the CPU and a GPU ---------- */
/* Everything else the engine does to device memory goes through the public ops. */
typedef struct ote_device {
  DLDevice dev;
  void *stream; /* cudaStream_t for CUDA */
} ote_device;
ot_status ote_dev_alloc(const ote_device *d, size_t bytes, void **out);
void ote_dev_free(const ote_device *d, void *p);
ot_status ote_dev_upload(const ote_device *d, void *dst, const void *src_host, size_t bytes);
ot_status ote_dev_download(const ote_device *d, void *dst_host, const void *src, size_t bytes);
/* rows x width bytes, with pitches in bytes (device to device). */
ot_status ote_dev_copy_2d(const ote_device *d, void *dst, size_t dpitch, const void *src,
                          size_t spitch, size_t width, size_t rows);
ot_status ote_dev_sync(const ote_device *d);
/* Enqueued copy host -> device (no synchronization). Pageable memory may be reused at once
 * (the runtime stages it before the call returns); pinned memory (ote_dev_host_alloc) is
 * read when the copy runs: keep it unchanged until the stream is synchronized. */
ot_status ote_dev_upload_async(const ote_device *d, void *dst, const void *src_host, size_t bytes);
/* Enqueued copy device -> host (pinned host memory: may be captured into a graph). */
ot_status ote_dev_download_async(const ote_device *d, void *dst_host, const void *src, size_t bytes);
/* Host memory the device copies from / to inside a graph: pinned on CUDA, plain on the CPU. */
ot_status ote_dev_host_alloc(const ote_device *d, size_t bytes, void **out);
void ote_dev_host_free(const ote_device *d, void *p);
/* CUDA: the engine's own stream (non-blocking; graphs are captured on it). */
ot_status ote_dev_stream_create(ote_device *d);
void ote_dev_stream_destroy(ote_device *d);
/* dst[i] = table[ids[i]] for i < n with the ids in device memory (CUDA: a kernel, so that
 * the decode graph contains the embedding lookup; CPU: the host loop). */
ot_status ote_dev_embed(const ote_device *d, void *dst, const void *table, const int32_t *ids_dev,
                        int n, size_t row_bytes);
/* out[i] = argmax of row i of logits [n, vocab] (storage dtype; first index of the maximum),
 * on the device (int32 out in device memory). */
ot_status ote_dev_argmax(const ote_device *d, int32_t *out_dev, const void *logits, DLDataType dt,
                         int n, int vocab);
/* CUDA, bf16 / fp16: one-row linears with their input formed in the kernel (RMSNorm of a
 * residual sum, or SwiGLU; fused_kernels.h says what each argument is), launched as a
 * programmatic dependent where the GPU allows. */
struct ote_fused_gemv_args;
ot_status ote_dev_fused_gemv(const ote_device *d, const struct ote_fused_gemv_args *a,
                             DLDataType dt, int swiglu);
/* CUDA, bf16 / fp16: y = x W^T (+ b) for one row x by the kernel that loads W on chip
 * before its PDL wait (fused_kernels.cu's staged kernel: o_proj); *done 0 when the shape
 * does not fit it (nothing launched: the caller takes another linear). */
ot_status ote_dev_staged_gemv(const ote_device *d, const struct ote_fused_gemv_args *a,
                              DLDataType dt, int *done);
/* CUDA, bf16 / fp16: y = x W^T (+ b) + res for one row x of a long K by the kernel that
 * splits K over a whole CTA (fused_kernels.cu's rowblock kernel: down_proj with the residual
 * add), or with a->rope / a->glu_out the norm-fed qkv / gate_up on the same scheme
 * (rowblock_norm_kernel); *done 0 when the shape does not fit it (nothing launched). */
ot_status ote_dev_rowblock_gemv(const ote_device *d, const struct ote_fused_gemv_args *a,
                                DLDataType dt, int *done);
/* CUDA, bf16 / fp16: the batch-1 decode's attention + o_proj in one kernel
 * (fused_kernels.cu attn_oproj_kernel); *done 0 when it does not fit (nothing launched).
 * ote_dev_attn_oproj_scratch: the scratch bytes it needs (0 on the CPU / without CUDA). */
struct ote_attn_oproj_args;
ot_status ote_dev_attn_oproj(const ote_device *d, const struct ote_attn_oproj_args *a,
                             DLDataType dt, int *done);
size_t ote_dev_attn_oproj_scratch(const ote_device *d, int hq, int hkv, int head_dim);
/* CUDA: weights.c's random values computed on the device (a = std * sqrt(3); a == 0 fills
 * `constant`), equal to the host's. */
ot_status ote_dev_fill_random(const ote_device *d, void *dst, size_t n, DLDataType dt,
                              uint64_t seed, uint64_t tensor_id, float a, float constant);
/* CUDA graphs of the decode step: capture on the device's stream (thread-local mode),
 * instantiate, replay. */
ot_status ote_graph_begin(const ote_device *d);
/* Ends the capture; *exec is NULL when the capture failed (why: ote_last_error). */
ot_status ote_graph_end(const ote_device *d, void **exec);
ot_status ote_graph_launch(const ote_device *d, void *exec);
void ote_graph_destroy(void *exec);
/* Profiling: timing events on the device's stream (NULL on the CPU), and a kernel that
 * holds the stream for ns nanoseconds. */
ot_status ote_dev_event_create(const ote_device *d, void **ev);
void ote_dev_event_destroy(void *ev);
ot_status ote_dev_event_record(const ote_device *d, void *ev);
float ote_dev_event_ms(void *a, void *b);
ot_status ote_dev_spin(const ote_device *d, long long ns);

/* ---- DLTensor views with their own shape / stride storage ----------------------- */
typedef struct ote_view {
  DLTensor t;
  int64_t shape[4];
  int64_t strides[4];
} ote_view;
/* strides NULL: contiguous. The view must not be copied (t points into it). */
void ote_view_set(ote_view *v, const ote_device *d, void *data, DLDataType dt, int ndim,
                  const int64_t *shape, const int64_t *strides);

/* ---- safetensors ---------------------------------------------------------------- */
typedef struct ote_st_tensor {
  char *name;
  char dtype[8];     /* "F32", "BF16", ... as in the header */
  int ndim;
  int64_t shape[8];
  const uint8_t *data; /* into the mapping */
  size_t nbytes;
  int file;          /* index into files */
} ote_st_tensor;

typedef struct ote_st_set {
  int n_files;
  char **paths;
  void **maps;
  size_t *sizes;
  int n_tensors;
  ote_st_tensor *tensors; /* sorted by name */
} ote_st_set;

/* One .safetensors file, a directory (index json or all *.safetensors). */
ot_status ote_st_open_file(ote_st_set *set, const char *path);
ot_status ote_st_open_dir(ote_st_set *set, const char *dir);
const ote_st_tensor *ote_st_find(const ote_st_set *set, const char *name);
void ote_st_close(ote_st_set *set);
/* DLDataType of a safetensors dtype string; false when not F32/F16/BF16. */
bool ote_st_dtype(const char *s, DLDataType *out);

/* ---- weights -------------------------------------------------------------------- */
typedef struct ote_layer_weights {
  void *attn_norm;  /* [H]                                    */
  void *qkv;        /* [(Hq + 2 Hkv) * D, H]  q, k, v rows     */
  void *qkv_bias;   /* [(Hq + 2 Hkv) * D] or NULL              */
  void *o;          /* [H, Hq * D]                             */
  void *o_bias;     /* [H] or NULL                             */
  void *mlp_norm;   /* [H]                                    */
  void *gate_up;    /* [2F, H]  gate rows then up rows         */
  void *down;       /* [H, F]                                  */
} ote_layer_weights;

typedef struct ote_weights {
  void *embed;      /* [V, H]                                  */
  void *final_norm; /* [H]                                     */
  void *lm_head;    /* [V, H]; == embed when tied              */
  ote_layer_weights *layer; /* [layers]                       */
} ote_weights;

/* ---- KV cache: the library's paged pool (ot_kv_cache) ------------------------------
 * Engine sequence slots 0 .. max_seqs-1 map to pool sequences; the pool holds
 * max_seqs * ceil(max_len / block_size) pages, so every slot can reach max_len. Each
 * forward builds the CSR page table of its batch on the host and ote_kv_push copies it to
 * a device block of fixed address (a captured decode graph reads it there). The block,
 * mirrored by a pinned host block of the same layout, holds
 *   tokens [max_seqs] | indptr [max_seqs + 1] | last_page_len [max_seqs] | indices [capacity]
 * (segments 256-byte aligned), so that the inputs of a decode step of n sequences -- its
 * token ids and its page table -- are one prefix of the block (ote_kv_push): one copy, which
 * the decode graph contains (a copy from pinned memory reads it at replay time). On the
 * CPU the "device" block is the host block. */
typedef struct ote_kv_cache {
  ot_kv_cache *pool;
  int layers, max_seqs, max_len, kv_heads, head_dim, block_size, pages_per_seq;
  DLDataType dtype;
  int64_t *handle;  /* [max_seqs] pool sequence of a slot, -1 when empty */
  int *len;         /* [max_seqs] tokens held */
  size_t bytes;     /* of the pages */
  DLTensor *k_pages, *v_pages; /* [layers] views from ot_kv_cache_layer */
  /* the batch's page table (and, for a decode step, its token ids) */
  int n;            /* sequences in it */
  void *table_h, *table_d; /* the block: pinned host / device (the same on the CPU) */
  size_t off_indices, table_bytes;
  int32_t *tok_h, *indptr_h, *indices_h, *last_h;
  int32_t *tok_d, *indptr_d, *indices_d, *last_d;
  int64_t capacity; /* max_seqs * pages_per_seq */
  int64_t *ids, *add; /* [max_seqs] scratch of ote_kv_reserve */
  int64_t shape_indptr[1], shape_indices[1], shape_last[1];
  DLTensor t_indptr, t_indices, t_last;
} ote_kv_cache;
ot_status ote_kv_create(ote_kv_cache *c, ot_context *ctx, const ote_device *d, int layers,
                        int max_seqs, int max_len, int kv_heads, int head_dim, DLDataType dt,
                        int block_size);
void ote_kv_destroy(ote_kv_cache *c, const ote_device *d);
/* Empties the slots (prefill: fresh sequences). */
ot_status ote_kv_reset(ote_kv_cache *c, int n, const int *seq);
/* Reserves n_new[i] token slots for seq[i] (len grows at once) and builds the batch's
 * page table in the host block (ote_kv_push copies it). */
ot_status ote_kv_reserve(ote_kv_cache *c, int n, const int *seq, const int32_t *n_new);
/* Enqueues the one copy of the host block's first off_indices + n * pages_per_seq * 4
 * bytes (token ids of a decode step and the page table of n sequences) to the device block
 * (CUDA; nothing on the CPU). The size depends on n only: a decode graph of n sequences
 * contains it. The copy (or the graph's) reads the pinned block when it runs: one block
 * suffices because every prefill / decode step synchronizes the stream (fetch) before it
 * returns, so the next step's ote_kv_reserve writes it only after the last read. */
ot_status ote_kv_push(const ote_kv_cache *c, const ote_device *d, int n);
/* Undoes a reserve whose forward failed: drops the slots (their contents are gone). */
void ote_kv_drop(ote_kv_cache *c, int n, const int *seq);
/* The pages of layer and the staged table, for ot_kv_append / ot_paged_attention. */
void ote_kv_paged(ote_kv_cache *c, int layer, ot_paged_kv *kv);

/* ---- weight streaming (offload.c) ---------------------------------------------------- */
typedef struct ote_offload {
  int on, ring, primed;
  int first;         /* layers 0 .. first-1 resident (budget), first .. L-1 streamed */
  size_t layer_bytes;
  void **host;       /* [layers] pinned blocks of the streamed layers (NULL: resident) */
  void *ring_dev;    /* ring * layer_bytes */
  int *slot_layer;   /* [ring] layer held (or on its way), -1 */
  void *copy_stream;
  void **ready, **free_ev; /* [ring] cudaEvent_t */
  void **t_ev;       /* [layers + 1] timing events of the compute stream */
  double h2d_GBps;
  float layer_ms;
} ote_offload;
size_t ote_offload_layer_bytes(const ote_config *c, size_t es);
ot_status ote_offload_init(ote_engine *e);
void ote_offload_free(ote_engine *e);
ot_status ote_offload_prime(ote_engine *e);
ot_status ote_offload_layer_begin(ote_engine *e, int l, ote_layer_weights *w);
ot_status ote_offload_layer_end(ote_engine *e, int l);
void ote_offload_measure(ote_engine *e);
void ote_offload_report(const ote_engine *e, char *buf, size_t len);

/* ---- the engine ----------------------------------------------------------------- */
enum { OTE_PROF_EMBED, OTE_PROF_NORM, OTE_PROF_QKV, OTE_PROF_ROPE_KV, OTE_PROF_ATTN,
       OTE_PROF_O, OTE_PROF_GATE_UP, OTE_PROF_SWIGLU, OTE_PROF_DOWN, OTE_PROF_HEAD,
       OTE_PROF_OTHER, OTE_PROF_KV_PREFILL, OTE_PROF_KINDS };
struct ote_engine {
  ote_config cfg;
  ote_engine_options opt;
  ote_device dev;
  ot_context *ctx;
  ote_weights w;
  void **weight_blocks; /* every weight allocation, for freeing */
  int n_weight_blocks, cap_weight_blocks;
  size_t weight_bytes;     /* on the device */
  size_t weight_host_bytes; /* streamed layers in pinned host memory (offload) */
  char *carve;              /* offload, while loading layer l: its host block ... */
  size_t carve_off;         /* ... and the bytes used of it */
  ote_offload off;
  ote_kv_cache kv;
  /* activations, one device block sized for act_tokens rows (grown by a longer prefill,
   * which drops the decode graphs: they hold its addresses) */
  int act_tokens;
  size_t act_bytes;
  void *act_block;
  void *x_res, *delta, *normed, *qkv, *attn, *gate_up, *mlp, *last_res, *last_delta, *last_norm,
      *logits;
  int32_t *positions_dev, *cu_dev, *tokens_dev, *argmax_dev;
  int32_t *next_h;      /* [max_seqs] pinned: the argmax ids, copied by the forward */
  /* CUDA: the fused lm_head argmax's state (a 64-bit key, a 32-bit block counter: zero
   * between steps; fused_kernels.h) */
  void *argmax_state;
  /* CUDA: the fused attention + o_proj's scratch (its grid barrier, zero at creation, and
   * its key ranges' partials; fused_kernels.h ote_attn_oproj_args), 0 bytes when none */
  void *ao_scratch;
  size_t ao_scratch_bytes;
  float *logits_host;   /* [max_seqs, V] float32 */
  void *logits_stage;   /* host copy of logits in the storage dtype */
  int32_t *positions_host, *cu_host;
  /* decode: cu_seqlens 0, 1, .., max_seqs (any prefix is a batch's), in device memory */
  int32_t *cu_dec_dev;
  /* CUDA graphs of the decode step, by batch size: graph[n] (NULL until captured);
   * warm[n]: a step of n ran eagerly (lazy workspaces of the ops exist); graphs_off:
   * disabled (option, or a capture failed: note says why) */
  void **graph;
  unsigned char *warm;
  int graphs_off, graph_active;
  char graph_note[256];
  /* per-op profile (ote_engine_set_profile, CUDA): every forward runs
   * eagerly behind a spin kernel, with an event after each op; prof_kind[i] is the op
   * that ended at event i. Sums per phase (0 prefill, 1 decode) and op kind. */
  int prof_on, prof_phase, prof_n, prof_cap;
  void **prof_ev;
  unsigned char *prof_kind;
  double prof_ms[2][OTE_PROF_KINDS];
  int prof_forwards[2];
  /* the last prefill / decode call (ote_engine_last_timing): tm[0..5) host ms before the
   * forward is enqueued, enqueueing it, waiting for it (and fetching), the GPU's ms
   * between tm_ev[0] and tm_ev[1] (recorded around the forward; -1 on the CPU or with
   * the profile on), the whole call; tm[5] 0 prefill, 1 decode */
  double tm[6];
  void *tm_ev[2];
  /* OTE_PREFILL_ROPE_KV=0 (read at each prefill): the prefill rotates q, k by
   * ot_rope_forward and appends k, v by ot_kv_append, two kernels; else (the default)
   * ot_rope_kv_append's one */
  int rope_kv_split;
};

ot_status ote_weights_load(ote_engine *e, const ote_st_set *set, const char *dir);
ot_status ote_weights_random(ote_engine *e, uint64_t seed);
void ote_weights_free(ote_engine *e);

#endif /* OT_ENGINE_INTERNAL_H */
