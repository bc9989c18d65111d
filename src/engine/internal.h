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
/* dst[i] = table[ids[i]] (rows of row_bytes); ids on the host. */
ot_status ote_dev_gather_rows(const ote_device *d, void *dst, const void *table,
                              const int32_t *ids, int n, size_t row_bytes);
ot_status ote_dev_sync(const ote_device *d);

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

/* ---- KV cache: contiguous [max_len, Hkv, D] per (layer, sequence) for now; a paged
 * cache (ot_kv_cache) replaces it behind the same calls. ------------------------------ */
typedef struct ote_kv_cache {
  int layers, max_seqs, max_len, kv_heads, head_dim;
  DLDataType dtype;
  void *k, *v;   /* [layers, max_seqs, max_len, Hkv, D] */
  int *len;      /* [max_seqs] tokens held              */
  size_t bytes;
} ote_kv_cache;
ot_status ote_kv_create(ote_kv_cache *c, const ote_device *d, int layers, int max_seqs, int max_len,
                        int kv_heads, int head_dim, DLDataType dt);
void ote_kv_destroy(ote_kv_cache *c, const ote_device *d);
/* Writes n tokens of layer at positions len(seq) .. len(seq)+n-1; k, v are rows of
 * Hkv*D elements with row pitch src_pitch elements. len is not advanced. */
ot_status ote_kv_write(ote_kv_cache *c, const ote_device *d, int layer, int seq, int n,
                       const void *k, const void *v, size_t src_pitch);
/* Views [1, n, Hkv, D] of the first n tokens of (layer, seq). */
void ote_kv_view(ote_kv_cache *c, const ote_device *d, int layer, int seq, int n, ote_view *k,
                 ote_view *v);

/* ---- the engine ----------------------------------------------------------------- */
struct ote_engine {
  ote_config cfg;
  ote_engine_options opt;
  ote_device dev;
  ot_context *ctx;
  ote_weights w;
  void **weight_blocks; /* every weight allocation, for freeing */
  int n_weight_blocks, cap_weight_blocks;
  size_t weight_bytes;
  ote_kv_cache kv;
  /* activations, sized for act_tokens rows */
  int act_tokens;
  size_t act_bytes;
  void *x_res, *delta, *normed, *qkv, *attn, *gate_up, *mlp, *last_res, *last_delta, *last_norm,
      *logits;
  float *logits_host; /* [max_seqs, V] float32 */
  void *logits_stage; /* host copy of logits in the storage dtype */
  int32_t *positions_dev, *cu_dev;
  int32_t *positions_host, *cu_host;
};

ot_status ote_weights_load(ote_engine *e, const ote_st_set *set, const char *dir);
ot_status ote_weights_random(ote_engine *e, uint64_t seed);
void ote_weights_free(ote_engine *e);

#endif /* OT_ENGINE_INTERNAL_H */
