/*
 * engine.h -- a Llama-family decoder (Llama 2/3, Mistral, Qwen2) built only from the
 * public ops of ops_transformer.h, for ot-run and the tests. Not part of the library's
 * ABI: it is the static library ot_engine, linked by the tools.
 *
 * Layers of the engine (each knows only the one below):
 *   config.c       model configuration: config.json (cJSON) or a named configuration
 *   safetensors.c  the safetensors reader (mmap'ed files, sharded directories)
 *   weights.c      HF tensor names -> fused engine weights, dtype conversion, random init
 *   kv_cache.c     K/V of past tokens in the library's paged pool (ot_kv_cache)
 *   engine.c       prefill (packed varlen) and decode (paged; a CUDA graph per batch size)
 *   generate.c     the generation loop (ot-run, the Python binding)
 *   sampling.c     greedy / temperature / top-k / top-p with a seeded RNG
 *   device.c       the few memory operations that differ between the CPU and a GPU
 *   device_kernels.cu  CUDA: embedding lookup, argmax, random weights on the device
 *
 * Errors: every function returns an ot_status; ote_last_error() (thread-local) says what
 * failed, naming the file and the tensor for weight problems. Nothing aborts.
 */
#ifndef OT_ENGINE_H
#define OT_ENGINE_H

#include <stddef.h>
#include <stdint.h>

#include <ops_transformer.h>

#ifdef __cplusplus
extern "C" {
#endif

#define OTE_MAX_STOP 8

typedef enum ote_arch { OTE_ARCH_LLAMA = 0, OTE_ARCH_MISTRAL = 1, OTE_ARCH_QWEN2 = 2 } ote_arch;

typedef struct ote_config {
  ote_arch arch;
  char name[64];          /* "tiny", "llama-13b", or the config.json's architecture   */
  int hidden;             /* hidden_size                                               */
  int layers;             /* num_hidden_layers                                         */
  int heads;              /* num_attention_heads (Hq)                                  */
  int kv_heads;           /* num_key_value_heads (Hkv; Hq % Hkv == 0)                  */
  int head_dim;           /* head_dim, default hidden / heads (D)                      */
  int ffn;                /* intermediate_size (F)                                     */
  int vocab;              /* vocab_size (V)                                            */
  int max_position;       /* max_position_embeddings                                   */
  float rope_theta;
  /* Llama-3 rope_scaling; llama3_factor <= 0 when absent. */
  float rope_llama3_factor, rope_low_freq_factor, rope_high_freq_factor;
  int rope_original_max_position;
  float rms_eps;
  int tie_word_embeddings;
  int qkv_bias;           /* q/k/v projections have biases (attention_bias; Qwen2)     */
  int o_bias;             /* o_proj has a bias (attention_bias of Llama)               */
  int sliding_window;     /* Mistral: keys within the last W positions; 0 = none       */
  int bos_token_id;       /* -1 when unknown                                           */
  int n_eos;
  int eos_token_ids[OTE_MAX_STOP];
} ote_config;

/* The message of the last failure on this thread ("" when none). */
const char *ote_last_error(void);

/* config.json of a HF model directory (or a path to a config.json file). */
ot_status ote_config_load(const char *path, ote_config *cfg);
/* "tiny" (CPU demo), "llama-13b", "llama3-8b", "llama2-7b", "mistral-7b", "qwen2-7b" or
 * "test-gqa" / "test-mha" (small shapes for tests). */
ot_status ote_config_named(const char *name, ote_config *cfg);
/* The names ote_config_named knows, comma separated. */
const char *ote_config_names(void);
/* Weights in elements (embeddings, all layers, final norm and lm_head). */
int64_t ote_config_param_count(const ote_config *cfg);

typedef struct ote_engine ote_engine;

typedef struct ote_engine_options {
  DLDataType dtype;     /* storage dtype of weights, activations and the KV cache      */
  int max_seqs;         /* sequences that may be live at once                          */
  int max_len;          /* tokens per sequence (prompt + generated)                    */
  int num_threads;      /* CPU: OpenMP threads per op, 0 = default                    */
  DLDeviceType device_type;
  int device_id;
  int kv_block_size;    /* tokens per page of the paged KV cache, 0 = 16                */
  int cuda_graphs;      /* CUDA: replay the decode step as a graph (default 1)          */
  int offload;          /* CUDA: stream the layers' weights from pinned host memory
                         * (offload.c; ring size OTE_OFFLOAD_RING, default 2)         */
  size_t offload_budget; /* with offload: device bytes for all weights (embeddings,
                         * lm_head, resident layers, the ring); the first layers that fit
                         * stay resident, the rest stream. 0: every layer streams      */
} ote_engine_options;

ote_engine_options ote_engine_default_options(void);

/* Load a HF directory (config.json + *.safetensors) / build random weights from a seed.
 * cfg is copied. */
ot_status ote_engine_load(const char *model_dir, const ote_engine_options *opt, ote_engine **out);
ot_status ote_engine_random(const ote_config *cfg, uint64_t seed, const ote_engine_options *opt,
                            ote_engine **out);
void ote_engine_destroy(ote_engine *e);
const ote_config *ote_engine_config(const ote_engine *e);

/* Bytes held, by tag (workspace: the library's per-context cuBLASLt workspace and
 * scratch are not visible here; ot_memory_tag_counter has what the library tracks). */
typedef struct ote_memory {
  size_t weights, kv_cache, activations;
  size_t weights_host;  /* offload: the streamed layers in pinned host memory */
  size_t offload_ring;  /* offload: the device ring of layer slots               */
} ote_memory;
ote_memory ote_engine_memory(const ote_engine *e);

/*
 * Prefill: n_seqs new sequences with slots seq_ids[i] (each < max_seqs, emptied first),
 * prompts packed in tokens[cu_seqlens[i] .. cu_seqlens[i+1]) (each non-empty).
 * logits: host float32 [n_seqs, vocab]: the logits of each sequence's last token.
 */
ot_status ote_prefill(ote_engine *e, int n_seqs, const int *seq_ids, const int32_t *tokens,
                      const int32_t *cu_seqlens, float *logits);
/* One decode step: token[i] is appended to sequence seq_ids[i]; logits as above. */
ot_status ote_decode(ote_engine *e, int n_seqs, const int *seq_ids, const int32_t *tokens,
                     float *logits);
/* As ote_prefill / ote_decode, but greedy: next[i] = the argmax of sequence i's logits
 * (the lowest index among equal maxima, as ote_sample with temperature 0), computed on
 * the device (CUDA: only the ids are copied to the host). */
ot_status ote_prefill_greedy(ote_engine *e, int n_seqs, const int *seq_ids, const int32_t *tokens,
                             const int32_t *cu_seqlens, int32_t *next);
ot_status ote_decode_greedy(ote_engine *e, int n_seqs, const int *seq_ids, const int32_t *tokens,
                            int32_t *next);
/* Empties a sequence slot (its pages go back to the pool). */
void ote_seq_free(ote_engine *e, int seq_id);
/* Tokens held for a sequence slot. */
int ote_seq_len(const ote_engine *e, int seq_id);

/* Sampling. temperature <= 0 is greedy; top_k <= 0 and top_p >= 1 disable those. */
typedef struct ote_sampler {
  float temperature;
  int top_k;
  float top_p;
  uint64_t rng_state;
} ote_sampler;
void ote_sampler_init(ote_sampler *s, float temperature, int top_k, float top_p, uint64_t seed);
/* Picks a token from logits[0..vocab); scratch: vocab floats + vocab ints (may be NULL
 * for greedy). */
int ote_sample(ote_sampler *s, const float *logits, int vocab, float *scratch_p, int *scratch_i);

/* Generation of a batch of prompts: prefill together, then one decode step per live
 * sequence until each has max_new tokens or produced a stop id. Sequence i uses slot i
 * (n_prompts <= max_seqs). out: [n_prompts, max_new] tokens, n_out[i] the count. With a
 * greedy sampler and no on_logits callback the argmax runs on the device.
 * on_logits (or NULL): called after every step with the float32 logits of the step's
 * live sequences [n_live, vocab]. */
typedef struct ote_gen_stats {
  double load_ms;          /* not set by ote_generate */
  double first_token_ms;   /* prefill + sampling of the first token (time to first token) */
  double decode_ms;        /* every decode step, sampling included */
  long decode_steps, decode_tokens;
  int cuda_graph;          /* whether decode steps replayed a CUDA graph                   */
} ote_gen_stats;
typedef void (*ote_logits_fn)(void *user, int n_live, const float *logits, int vocab);
ot_status ote_generate(ote_engine *e, int n_prompts, const int32_t *tokens,
                       const int32_t *cu_seqlens, int max_new, const ote_sampler *sampler,
                       const int32_t *stop_ids, int n_stop, int32_t *out, int *n_out,
                       ote_logits_fn on_logits, void *user, ote_gen_stats *stats);

/* Weight streaming: the ring, prefetch distance, measured H2D bandwidth and layer
 * compute time, and the distance the rule asks for ("off" without --offload). */
void ote_engine_offload_report(const ote_engine *e, char *buf, size_t len);

/* Whether the last decode step was a graph replay; why graphs are off ("" when they are
 * on or were never tried). */
int ote_decode_graph_active(const ote_engine *e);
/* Per-op profile (CUDA): on, every forward runs eagerly behind a short spin kernel (the
 * host enqueues it whole first; OTE_PROFILE_SPIN_NS sets its length, 0 none) with a timing
 * event after each op; the report gives, per phase (prefill / decode), the mean
 * milliseconds per forward of each kind of op (rmsnorm, qkv_proj, rope + kv append,
 * attention, o_proj, gate_up, swiglu, down, lm_head, ...). Turning it on or off clears the
 * sums and the decode graphs. On the CPU it stays off (OT_OK). An error (the events could
 * not be created; a failed synchronization) leaves it off, with the reason in
 * ote_last_error. */
ot_status ote_engine_set_profile(ote_engine *e, int on);
void ote_engine_profile_report(const ote_engine *e, char *buf, size_t len);
const char *ote_decode_graph_note(const ote_engine *e);
/* Where the last ote_prefill* / ote_decode* call spent its time, milliseconds: out[0] on
 * the host before the forward was enqueued (checks, page reservation, input copies),
 * out[1] enqueueing the forward (the ops' host work; a graph launch for a replayed
 * decode step), out[2] waiting for it and fetching the results, out[3] the GPU's time
 * from the forward's first op to its last (CUDA events; -1 on the CPU and while the
 * profile is on), out[4] the whole call; out[5] 0 after a prefill, 1 after a decode. */
void ote_engine_last_timing(const ote_engine *e, double out[6]);

/* Convenience for bindings (ctypes), the options as scalars: a model directory with its
 * weights (seed 0), or a model directory's / named configuration's shape with random
 * weights from seed. dtype "f32" / "bf16" / "f16", device "cpu" / "cuda" / "cuda:N";
 * offload, offload_budget as in ote_engine_options.
 * OTE_CUDA_GRAPHS=0 in the environment turns the decode graphs off. */
ot_status ote_engine_open(const char *model_dir, const char *config_name, uint64_t seed,
                          const char *dtype, const char *device, int max_seqs, int max_len,
                          int num_threads, int offload, size_t offload_budget, ote_engine **out);
/* Copies the weight HF calls `name` (e.g. "model.layers.3.self_attn.k_proj.weight") in the
 * engine's storage dtype into dst (engine's device memory: a device pointer on CUDA) of
 * exactly its size in bytes: a peer (HF transformers) can run on the same weights. */
ot_status ote_engine_export(ote_engine *e, const char *name, void *dst, size_t dst_bytes);
/* The configuration's main numbers: layers, hidden, heads, kv_heads, head_dim, ffn, vocab,
 * max_position, eos (first id or -1) into v[0..9). */
void ote_engine_shape(const ote_engine *e, int64_t v[9]);

#ifdef __cplusplus
}
#endif

#endif /* OT_ENGINE_H */
