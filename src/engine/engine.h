/*
 * engine.h -- a Llama-family decoder (Llama 2/3, Mistral, Qwen2) built only from the
 * public ops of ops_transformer.h, for ot-run and the tests. Not part of the library's
 * ABI: it is the static library ot_engine, linked by the tools.
 *
 * Layers of the engine (each knows only the one below):
 *   config.c       model configuration: config.json (cJSON) or a named configuration
 *   safetensors.c  the safetensors reader (mmap'ed files, sharded directories)
 *   weights.c      HF tensor names -> fused engine weights, dtype conversion, random init
 *   kv_cache.c     K/V of past tokens (contiguous per sequence; a paged cache replaces it)
 *   forward.c      prefill (packed varlen) and decode over a batch of sequences
 *   sampling.c     greedy / temperature / top-k / top-p with a seeded RNG
 *   device.c       the few memory operations that differ between the CPU and a GPU
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
} ote_engine_options;

ote_engine_options ote_engine_default_options(void);

/* Load a HF directory (config.json + *.safetensors) / build random weights from a seed.
 * cfg is copied. */
ot_status ote_engine_load(const char *model_dir, const ote_engine_options *opt, ote_engine **out);
ot_status ote_engine_random(const ote_config *cfg, uint64_t seed, const ote_engine_options *opt,
                            ote_engine **out);
void ote_engine_destroy(ote_engine *e);
const ote_config *ote_engine_config(const ote_engine *e);

/* Bytes held, by tag. */
typedef struct ote_memory {
  size_t weights, kv_cache, activations;
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

#ifdef __cplusplus
}
#endif

#endif /* OT_ENGINE_H */
