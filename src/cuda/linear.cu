/*
 * linear.cu -- the linear layer on CUDA: y = x W^T + b and its backward through
 * cuBLASLt (src/cuda/gemm.h), with the bias fused into the GEMM's epilogue
 * (CUBLASLT_EPILOGUE_BIAS) and dbias fused into the dweight GEMM
 * (CUBLASLT_EPILOGUE_BGRADB) where cuBLASLt offers them.
 *
 * Row-major [M, K] x [N, K]^T is, in cuBLASLt's column-major terms:
 *   forward  y'[N, M]  = W'^T[N, K] x'[K, M]      (A = W, transa; B = x)
 *   dx       dx'[K, M] = W'[K, N] dy'[N, M]       (A = W; B = dy)
 *   dweight  dW'[K, N] = x'[K, M] dy'^T[M, N]     (A = x; B = dy, transb; BGRADB sums
 *                                                  dy over M into dbias)
 * where X' is the row-major X read column-major (leading dimension = its row stride).
 *
 * What cuBLASLt does not cover, small kernels do: K = 0 (y = bias or 0), dbias alone or
 * when no BGRADB algorithm exists (column sums, float32, fixed order: deterministic),
 * zero-row inputs (zero gradients).
 *
 * The cuBLASLt handle and its 32 MiB workspace belong to the context (created on the
 * first GEMM, released in context.cu). Heuristic results are cached per process by the
 * GEMM's full description (device, shapes, leading dimensions, dtypes, transposes,
 * epilogue, pointer alignments, TF32 flag): a repeated shape costs no heuristic query.
 */
#include <cublasLt.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../core/linear.h"
#include "common.cuh"
#include "cuda_state.h"
#include "gemm.h"
#include "linear_rule.h"
#include "pdl.cuh"

namespace ot {

constexpr size_t kLtWorkspaceBytes = (size_t)32 << 20;
/* An arena gives the workspace a block of OT_CUDA_LT_WORKSPACE_BYTES (ot_context_set_arena). */
static_assert(kLtWorkspaceBytes <= OT_CUDA_LT_WORKSPACE_BYTES, "the arena's cuBLASLt block is too small");

/* ---- heuristic cache -------------------------------------------------------------- */

struct gemm_key {
  int64_t m, n, k, lda, ldb, ldd;
  int32_t device, flags, align; /* flags: transa, transb, epilogue, tf32, beta != 0; align:
                                   four log2 alignments of A, B, D, bias */
  int32_t ab, d;
};

struct gemm_entry {
  gemm_key key;
  cublasLtMatmulAlgo_t algo = {};
  bool used;
  bool supported; /* false: cuBLASLt returned no algorithm */
};

constexpr int kCacheSize = 1024; /* entries, direct-mapped after a short probe */
constexpr int kCacheProbe = 4;
static gemm_entry g_cache[kCacheSize];
static pthread_mutex_t g_cache_mu = PTHREAD_MUTEX_INITIALIZER;

static bool key_eq(const gemm_key &a, const gemm_key &b) { return !memcmp(&a, &b, sizeof a); }

static uint64_t key_hash(const gemm_key &k) {
  const unsigned char *p = reinterpret_cast<const unsigned char *>(&k);
  uint64_t h = 1469598103934665603ull;
  for (size_t i = 0; i < sizeof k; i++) h = (h ^ p[i]) * 1099511628211ull;
  return h;
}

/* Whether key is cached (then *found: cuBLASLt had an algorithm, *algo: it). */
static bool cache_find(const gemm_key &key, cublasLtMatmulAlgo_t *algo, bool *found) {
  const uint64_t h = key_hash(key);
  bool known = false;
  pthread_mutex_lock(&g_cache_mu);
  for (int p = 0; p < kCacheProbe; p++) {
    gemm_entry &e = g_cache[(h + p) % kCacheSize];
    if (e.used && key_eq(e.key, key)) {
      known = true;
      *found = e.supported;
      *algo = e.algo;
      break;
    }
  }
  pthread_mutex_unlock(&g_cache_mu);
  return known;
}

/* Largest power of two <= 256 dividing the address and (for more than one column) the
 * leading dimension in bytes, as log2. */
static int align_log2(const void *p, int64_t ld, size_t elem, int64_t cols) {
  uint64_t v = (uint64_t)(uintptr_t)p | 256u;
  if (cols > 1) v |= (uint64_t)ld * elem;
  int l = 0;
  while (!(v & 1u) && l < 8) {
    v >>= 1;
    l++;
  }
  return l;
}

static cudaDataType_t cuda_type(ot_dtype d) {
  switch (d) {
    case OT_F16: return CUDA_R_16F;
    case OT_BF16: return CUDA_R_16BF;
    default: return CUDA_R_32F;
  }
}

static bool allow_tf32(void) {
  const char *e = getenv("OT_MATMUL_ALLOW_TF32");
  return e && e[0] == '1';
}

static ot_status lt_fail(const char *op, const char *what, cublasStatus_t s) {
  return ot_error(OT_ERR_BACKEND, op, "cuBLASLt %s: status %d", what, (int)s);
}

/* The context's handle and workspace, created on first use. */
static ot_status lt_state(ot_context *ctx, const char *op, cublasLtHandle_t *h, void **ws) {
  ot_cuda_state *st = ot_cuda_state_of(ctx);
  if (!st->cublaslt) {
    cublasLtHandle_t handle;
    cublasStatus_t s = cublasLtCreate(&handle);
    if (s != CUBLAS_STATUS_SUCCESS) return lt_fail(op, "cublasLtCreate", s);
    st->cublaslt = handle;
  }
  if (!st->cublaslt_workspace) {
    void *p = nullptr;
    cudaError_t e = cudaMalloc(&p, kLtWorkspaceBytes);
    if (e != cudaSuccess) {
      (void)cudaGetLastError();
      return ot_error(OT_ERR_OOM, op, "cuBLASLt workspace of %zu bytes: %s", kLtWorkspaceBytes,
                      cudaGetErrorString(e));
    }
    st->cublaslt_workspace = p;
    st->cublaslt_workspace_bytes = kLtWorkspaceBytes;
  }
  *h = (cublasLtHandle_t)st->cublaslt;
  *ws = st->cublaslt_workspace;
  return OT_OK;
}

/* RAII of the descriptors of one call. */
struct lt_descs {
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, d = nullptr;
  cublasLtMatmulPreference_t pref = nullptr;
  ~lt_descs() {
    if (pref) cublasLtMatmulPreferenceDestroy(pref);
    if (d) cublasLtMatrixLayoutDestroy(d);
    if (b) cublasLtMatrixLayoutDestroy(b);
    if (a) cublasLtMatrixLayoutDestroy(a);
    if (op) cublasLtMatmulDescDestroy(op);
  }
};

/* ---- autotuning (OT_GEMM_AUTOTUNE) ------------------------------------------------
 * OT_GEMM_AUTOTUNE=N (2 .. 16): the first GEMM of a description asks cuBLASLt's heuristic
 * for its N best algorithms, runs each on the call's own operands (once to warm up, then
 * kTuneReps times between two events on the call's stream, which the host waits for) and
 * keeps the fastest in the cache (under a key of its own: the heuristic's entries stay).
 * Only where a rerun is harmless and the host may wait: beta == 0 (D is overwritten, not
 * accumulated; D never overlaps A, B or the bias -- cuBLASLt reads them while it writes D,
 * and ot_linear_* / ot_linear_cross_entropy reject such views) and the stream not
 * capturing a graph (a capture finds the entry tuned by an earlier call outside it, e.g.
 * the engine's eager first decode step; a GEMM first seen during a capture takes the
 * heuristic's pick). Only the call's own stream is asked: a capture running elsewhere on
 * the device (another thread's, another stream's) may be invalidated by the host wait
 * (a synchronization during a capture): tune the GEMMs before such a capture begins, or
 * leave this off while it runs.
 * A "v" in the value (e.g. "8v") prints each tuned GEMM's times to stderr. The algorithm
 * chosen can differ between processes (and so can the last bits of D, e.g. a split-K
 * algorithm's sum order); within a process it is fixed while its entry stays in the
 * cache (kCacheSize entries, shared with the heuristic's). Unset / 0 / 1: off. */
constexpr int kTuneMax = 16;
constexpr int kTuneReps = 3;

struct tune_opt {
  int n;        /* candidates to time, 0: off */
  bool verbose; /* "v" in the value */
};

static tune_opt tune_read_env(void) {
  tune_opt t = {0, false};
  const char *e = getenv("OT_GEMM_AUTOTUNE");
  if (!e || !*e) return t;
  const int n = atoi(e);
  t.n = n < 2 ? 0 : n > kTuneMax ? kTuneMax : n;
  t.verbose = strchr(e, 'v') != nullptr;
  return t;
}

static bool stream_capturing(cudaStream_t st) {
  cudaStreamCaptureStatus cap = cudaStreamCaptureStatusNone;
  if (cudaStreamIsCapturing(st, &cap) != cudaSuccess) {
    (void)cudaGetLastError();
    return true; /* unknown: no host wait */
  }
  return cap != cudaStreamCaptureStatusNone;
}

/* The index of the fastest of res[0 .. count) on g's operands, -1 when none ran. */
static int tune_pick(cublasLtHandle_t h, const lt_descs &ds, const ot_gemm *g,
                     const cublasLtMatmulHeuristicResult_t *res, int count, void *ws,
                     cudaStream_t st, bool verbose) {
  cudaEvent_t e0 = nullptr, e1 = nullptr;
  if (cudaEventCreate(&e0) != cudaSuccess || cudaEventCreate(&e1) != cudaSuccess) {
    (void)cudaGetLastError();
    if (e0) cudaEventDestroy(e0);
    return -1;
  }
  int best = -1;
  float best_ms = 0.0f, first_ms = -1.0f;
  for (int i = 0; i < count; i++) {
    if (res[i].state != CUBLAS_STATUS_SUCCESS) continue;
    const cublasLtMatmulAlgo_t *algo = &res[i].algo;
    bool ok = true;
    for (int r = 0; r <= kTuneReps && ok; r++) {
      if (r == 1) ok = cudaEventRecord(e0, st) == cudaSuccess;
      ok = ok && cublasLtMatmul(h, ds.op, &g->alpha, g->A, ds.a, g->B, ds.b, &g->beta, g->D,
                                ds.d, g->D, ds.d, algo, ws, kLtWorkspaceBytes,
                                st) == CUBLAS_STATUS_SUCCESS;
    }
    float ms = 0.0f;
    ok = ok && cudaEventRecord(e1, st) == cudaSuccess && cudaEventSynchronize(e1) == cudaSuccess &&
         cudaEventElapsedTime(&ms, e0, e1) == cudaSuccess;
    if (!ok) {
      (void)cudaGetLastError();
      continue;
    }
    if (i == 0) first_ms = ms;
    if (best < 0 || ms < best_ms) best = i, best_ms = ms;
  }
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
  if (verbose && best >= 0) {
    char first[32] = "not run"; /* #0 failed or was not a valid candidate */
    if (first_ms >= 0.0f) snprintf(first, sizeof first, "%.2f us", 1e3f * first_ms / kTuneReps);
    fprintf(stderr, "ot gemm autotune: m %lld n %lld k %lld: heuristic #0 %s, picked #%d of %d %.2f us\n",
            (long long)g->m, (long long)g->n, (long long)g->k, first, best, count,
            1e3f * best_ms / kTuneReps);
  }
  return best;
}

#define LT_TRY(what, expr)                                       \
  do {                                                           \
    cublasStatus_t lt_s_ = (expr);                               \
    if (lt_s_ != CUBLAS_STATUS_SUCCESS) return lt_fail(op, what, lt_s_); \
  } while (0)

} /* namespace ot */

extern "C" ot_status ot_cuda_gemm(ot_context *ctx, const char *op, const ot_gemm *g) {
  using namespace ot;
  cublasLtHandle_t handle = nullptr;
  void *ws = nullptr;
  OT_TRY(lt_state(ctx, op, &handle, &ws));
  const ot_cuda_state *cs = ot_cuda_state_of(ctx);
  const bool tf32 = g->ab == OT_F32 && allow_tf32();
  const size_t eab = ot_dtype_size(g->ab), ed = ot_dtype_size(g->d);

  gemm_key key;
  memset(&key, 0, sizeof key);
  key.m = g->m;
  key.n = g->n;
  key.k = g->k;
  key.lda = g->lda;
  key.ldb = g->ldb;
  key.ldd = g->ldd;
  key.device = cs->device;
  cudaStream_t st = (cudaStream_t)ctx->stream;
  const tune_opt tune = tune_read_env();
  int tune_n = g->beta == 0.0f ? tune.n : 0; /* reruns only where they overwrite D */
  const int flags = (g->transa ? 1 : 0) | (g->transb ? 2 : 0) | ((int)g->epilogue << 2) |
                    (tf32 ? 16 : 0) | (g->beta != 0.0f ? 32 : 0);
  key.flags = flags | (tune_n << 6);
  const int al_a = align_log2(g->A, g->lda, eab, g->transa ? g->m : g->k);
  const int al_b = align_log2(g->B, g->ldb, eab, g->transb ? g->k : g->n);
  const int al_d = align_log2(g->D, g->ldd, ed, g->n);
  const int al_bias = g->epilogue != OT_GEMM_PLAIN ? align_log2(g->bias, 0, ed, 1) : 8;
  key.align = al_a | (al_b << 4) | (al_d << 8) | (al_bias << 12);
  key.ab = (int32_t)g->ab;
  key.d = (int32_t)g->d;

  lt_descs ds;
  const cublasComputeType_t compute = tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
  LT_TRY("MatmulDescCreate", cublasLtMatmulDescCreate(&ds.op, compute, CUDA_R_32F));
  const cublasOperation_t ta = g->transa ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cublasOperation_t tb = g->transb ? CUBLAS_OP_T : CUBLAS_OP_N;
  LT_TRY("set TRANSA", cublasLtMatmulDescSetAttribute(ds.op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta));
  LT_TRY("set TRANSB", cublasLtMatmulDescSetAttribute(ds.op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb));
  if (g->epilogue != OT_GEMM_PLAIN) {
    const cublasLtEpilogue_t ep =
        g->epilogue == OT_GEMM_BIAS ? CUBLASLT_EPILOGUE_BIAS : CUBLASLT_EPILOGUE_BGRADB;
    LT_TRY("set EPILOGUE", cublasLtMatmulDescSetAttribute(ds.op, CUBLASLT_MATMUL_DESC_EPILOGUE, &ep, sizeof ep));
    LT_TRY("set BIAS_POINTER", cublasLtMatmulDescSetAttribute(ds.op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &g->bias, sizeof g->bias));
    const int32_t bt = (int32_t)cuda_type(g->d);
    LT_TRY("set BIAS_DATA_TYPE", cublasLtMatmulDescSetAttribute(ds.op, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bt, sizeof bt));
  }
  const cudaDataType_t tab = cuda_type(g->ab), td = cuda_type(g->d);
  LT_TRY("layout A", cublasLtMatrixLayoutCreate(&ds.a, tab, g->transa ? g->k : g->m,
                                                g->transa ? g->m : g->k, g->lda));
  LT_TRY("layout B", cublasLtMatrixLayoutCreate(&ds.b, tab, g->transb ? g->n : g->k,
                                                g->transb ? g->k : g->n, g->ldb));
  LT_TRY("layout D", cublasLtMatrixLayoutCreate(&ds.d, td, g->m, g->n, g->ldd));

  cublasLtMatmulAlgo_t algo = {};
  bool found = false;
  bool known = cache_find(key, &algo, &found);
  if (!known && tune_n && stream_capturing(st)) {
    /* tuned GEMMs are timed outside a capture (the tuned entry, when there is one, serves
     * a capture too); one first seen inside takes the heuristic's pick */
    tune_n = 0;
    key.flags = flags;
    known = cache_find(key, &algo, &found);
  }
  const uint64_t h = key_hash(key);
  if (!known) {
    LT_TRY("PreferenceCreate", cublasLtMatmulPreferenceCreate(&ds.pref));
    const uint64_t wsb = kLtWorkspaceBytes;
    LT_TRY("set MAX_WORKSPACE", cublasLtMatmulPreferenceSetAttribute(ds.pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &wsb, sizeof wsb));
    const uint32_t aa = 1u << al_a, ab = 1u << al_b, ad = 1u << al_d;
    LT_TRY("set ALIGN_A", cublasLtMatmulPreferenceSetAttribute(ds.pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &aa, sizeof aa));
    LT_TRY("set ALIGN_B", cublasLtMatmulPreferenceSetAttribute(ds.pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &ab, sizeof ab));
    LT_TRY("set ALIGN_C", cublasLtMatmulPreferenceSetAttribute(ds.pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &ad, sizeof ad));
    LT_TRY("set ALIGN_D", cublasLtMatmulPreferenceSetAttribute(ds.pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &ad, sizeof ad));
    cublasLtMatmulHeuristicResult_t res[kTuneMax];
    int count = 0;
    cublasStatus_t s = cublasLtMatmulAlgoGetHeuristic(handle, ds.op, ds.a, ds.b, ds.d, ds.d,
                                                      ds.pref, tune_n ? tune_n : 1, res, &count);
    /* an epilogue cuBLASLt cannot do here (any status) means: fall back */
    if (s != CUBLAS_STATUS_SUCCESS && s != CUBLAS_STATUS_NOT_SUPPORTED &&
        g->epilogue == OT_GEMM_PLAIN)
      return lt_fail(op, "AlgoGetHeuristic", s);
    found = s == CUBLAS_STATUS_SUCCESS && count > 0;
    if (found) {
      const int pick = count > 1 ? tune_pick(handle, ds, g, res, count, ws, st, tune.verbose) : 0;
      algo = res[pick > 0 ? pick : 0].algo;
    }
    pthread_mutex_lock(&g_cache_mu);
    gemm_entry *slot = &g_cache[h % kCacheSize];
    for (int p = 0; p < kCacheProbe; p++) {
      gemm_entry &e = g_cache[(h + p) % kCacheSize];
      if (!e.used) {
        slot = &e;
        break;
      }
    }
    slot->key = key;
    slot->used = true;
    slot->supported = found;
    if (found) slot->algo = algo;
    pthread_mutex_unlock(&g_cache_mu);
  }
  if (!found) {
    if (g->epilogue != OT_GEMM_PLAIN) return OT_ERR_UNSUPPORTED;
    return ot_error(OT_ERR_BACKEND, op,
                    "cuBLASLt has no algorithm for m=%lld n=%lld k=%lld (%s x %s -> %s)",
                    (long long)g->m, (long long)g->n, (long long)g->k, ot_dtype_name(g->ab),
                    ot_dtype_name(g->ab), ot_dtype_name(g->d));
  }
  LT_TRY("Matmul", cublasLtMatmul(handle, ds.op, &g->alpha, g->A, ds.a, g->B, ds.b, &g->beta,
                                  g->D, ds.d, g->D, ds.d, &algo, ws, kLtWorkspaceBytes, st));
  return OT_OK;
}

namespace ot {

/* y[r, c] = bias ? bias[c] : 0 for r < rows, c < cols (row stride ys). */
template <typename T>
__global__ void fill_rows_kernel(T *y, int64_t ys, const T *bias, int64_t rows, int64_t cols) {
  const int64_t total = rows * cols;
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < total;
       i += (int64_t)gridDim.x * blockDim.x) {
    const int64_t r = i / cols, c = i - r * cols;
    y[r * ys + c] = bias ? bias[c] : from_f32<T>(0.0f);
  }
}

/* out[c] = sum_r dy[r, c] in float32, rows in a fixed order per (column, thread row)
 * and a fixed tree: deterministic. Block (32, 16), one column per x thread. */
template <typename T>
__global__ void column_sum_kernel(const T *dy, int64_t ds, int64_t rows, int64_t cols, T *out) {
  __shared__ float part[16][33];
  const int64_t c = blockIdx.x * 32 + threadIdx.x;
  float s = 0.0f;
  if (c < cols)
    for (int64_t r = threadIdx.y; r < rows; r += 16) s += to_f32(dy[r * ds + c]);
  part[threadIdx.y][threadIdx.x] = s;
  __syncthreads();
  if (threadIdx.y == 0 && c < cols) {
    float t = 0.0f;
#pragma unroll
    for (int i = 0; i < 16; i++) t += part[i][threadIdx.x];
    out[c] = from_f32<T>(t);
  }
}

template <typename T>
static cudaError_t fill_rows(T *y, int64_t ys, const T *bias, int64_t rows, int64_t cols,
                             cudaStream_t st) {
  if (rows * cols == 0) return cudaSuccess;
  int64_t blocks = (rows * cols + 255) / 256;
  if (blocks > 4096) blocks = 4096;
  fill_rows_kernel<T><<<(unsigned)blocks, 256, 0, st>>>(y, ys, bias, rows, cols);
  return cudaGetLastError();
}

static cudaError_t fill_rows_any(ot_dtype d, void *y, int64_t ys, const void *bias,
                                 int64_t rows, int64_t cols, cudaStream_t st) {
  switch (d) {
    case OT_F16: return fill_rows((__half *)y, ys, (const __half *)bias, rows, cols, st);
    case OT_BF16:
      return fill_rows((__nv_bfloat16 *)y, ys, (const __nv_bfloat16 *)bias, rows, cols, st);
    default: return fill_rows((float *)y, ys, (const float *)bias, rows, cols, st);
  }
}

template <typename T>
static cudaError_t column_sum(const T *dy, int64_t ds, int64_t rows, int64_t cols, T *out,
                              cudaStream_t st) {
  dim3 block(32, 16);
  column_sum_kernel<T><<<(unsigned)((cols + 31) / 32), block, 0, st>>>(dy, ds, rows, cols, out);
  return cudaGetLastError();
}

static cudaError_t column_sum_any(ot_dtype d, const void *dy, int64_t ds, int64_t rows,
                                  int64_t cols, void *out, cudaStream_t st) {
  if (cols == 0) return cudaSuccess;
  switch (d) {
    case OT_F16: return column_sum((const __half *)dy, ds, rows, cols, (__half *)out, st);
    case OT_BF16:
      return column_sum((const __nv_bfloat16 *)dy, ds, rows, cols, (__nv_bfloat16 *)out, st);
    default: return column_sum((const float *)dy, ds, rows, cols, (float *)out, st);
  }
}

/* ---- small-M linear (decode): y [M, N] = x [M, K] W [N, K]^T (+ b), M <= 16 ----------
 * At a few rows the layer is a matrix-vector product bound by reading W once; cuBLASLt's
 * tensor-core tiles waste most of their width there. One warp per output column n (a row
 * of W): each lane streams 16-byte vectors of W's row (ld.global.cs, U of them in flight:
 * 8 at one row, 4 at more, where the MT accumulators take the registers; 8 or 4 at one row
 * measured the same engine decode step, run of 9349f37), multiplies them
 * with the same K positions of the MT rows of x (plain loads: x is small and every warp
 * of the block reads it, so it stays in L1 / L2) in float32, then a warp-shuffle sum; the
 * bias is added in float32 before the one rounding to T.
 * When N needs one to two waves of the blocks the GPU holds at once (M <= 4), each warp
 * takes two rows (gemv_balance: the grid is one wave). When N gives too few warps to keep every SM
 * streaming, K is split over grid.y: float32
 * partials [splits, M, N] in the context's scratch and a second kernel that sums them in
 * split order (deterministic) and applies the bias. VEC: K a multiple of the vector width
 * and x / W rows 16-byte aligned; otherwise a scalar path (one element per lane).
 *
 * Programmatic dependent launch (sm_90 code on a 9.0+ GPU; OT_LINEAR_PDL=0 turns it off):
 * the kernel is launched as a programmatic dependent of whatever precedes it on the
 * stream, so its CTAs can be resident before that kernel has completed. Each warp issues
 * its first U vectors of W, and only then waits (griddepcontrol.wait) for the previous
 * grid's memory before it reads x or the bias; nothing is written before the wait. So W
 * must not be written by the kernel just before on the stream: only the wait makes that
 * kernel's writes visible (the engine's weights are never written so; a caller whose
 * weight update directly precedes a one-row forward on the same stream should set
 * OT_LINEAR_PDL=0). The weight stream thus starts during the previous kernel's tail and
 * launch latency instead of after it. The kernel allows its own dependents to
 * launch (griddepcontrol.launch_dependents) once its loads are done: the split-K sum,
 * launched the same way, waits for the partials before it reads them. Measured (H200,
 * run of 9349f37, bench/engine_linear_bench.c, weights not in L2): 0.4-1.5 us less per
 * call at every engine shape, alone and behind an RMSNorm (e.g. 4096 x 4096 at M = 1:
 * 12.5 against 14.0 us); the engine's decode step is the same within run-to-run spread
 * (5.398 / 5.408 against 5.413 / 5.396 ms in two runs). */
constexpr int kGemvWarps = 4;   /* warps per block: small blocks, so N = 4096 spreads evenly */
constexpr int kGemvUnroll = 4;  /* W vectors in flight per lane at M > 1; a split's K granule */
constexpr int kGemvMaxM = 16;

template <typename T, int MT, bool VEC, int U>
__global__ void __launch_bounds__(kGemvWarps * 32)
    gemv_kernel(const T *__restrict__ x, int64_t xs, const T *__restrict__ w,
                const T *__restrict__ bias, T *__restrict__ y, int64_t ys, float *__restrict__ part,
                int M, int64_t K, int64_t N, int64_t klen, int rpw) {
  const int lane = threadIdx.x & 31;
  const int64_t n0 = (int64_t)blockIdx.x * kGemvWarps + (threadIdx.x >> 5);
  if (n0 >= N) return; /* reads and writes nothing */
  const int64_t warps = (int64_t)gridDim.x * kGemvWarps; /* rows n0, n0 + warps, ... */
  const int64_t kb = (int64_t)blockIdx.y * klen;
  const int64_t ke = kb + klen < K ? kb + klen : K;
  bool waited = false; /* x (the previous kernel's output) only after griddepcontrol.wait */
  /* the host passes rpw 1 above four rows (gemv_launch_mt): a constant there, so that those
   * kernels do not hold the loop's registers (sm_90a, bf16 MT 16 vector / scalar: 80 / 118
   * registers with the loop, 56 / 64 without) */
  const int rows = MT <= 4 ? rpw : 1;
  for (int r = 0; r < rows; r++) {
    const int64_t n = n0 + r * warps;
    if (n >= N) break;
    const bool last = r + 1 == rows || n + warps >= N;
    const T *wr = w + n * K;
    float acc[MT];
#pragma unroll
    for (int m = 0; m < MT; m++) acc[m] = 0.0f;
    if (VEC) {
      constexpr int V = vec_width<T>::value;
      constexpr int64_t step = 32 * V;
      for (int64_t k0 = kb + (int64_t)lane * V; k0 < ke; k0 += step * U) {
        raw16 wv[U];
#pragma unroll
        for (int u = 0; u < U; u++)
          load_raw<T, true, true>(wv[u], wr, k0 + u * step, ke, k0 + u * step < ke);
        if (!waited) {
          ot_pdl_wait();
          waited = true;
        }
#pragma unroll
        for (int u = 0; u < U; u++) {
          const int64_t k = k0 + u * step;
          if (k < ke) {
            float wf[V];
            unpack<T>(wf, wv[u]);
#pragma unroll
            for (int m = 0; m < MT; m++)
              if (m < M) {
                raw16 xv;
                load_raw<T, true, false>(xv, x + (int64_t)m * xs, k, ke, true);
                float xf[V];
                unpack<T>(xf, xv);
#pragma unroll
                for (int i = 0; i < V; i++) acc[m] = fmaf(wf[i], xf[i], acc[m]);
              }
          }
        }
      }
    } else {
      for (int64_t k0 = kb + lane; k0 < ke; k0 += 32 * U) {
        float wf[U];
#pragma unroll
        for (int u = 0; u < U; u++) {
          const int64_t k = k0 + u * 32;
          wf[u] = k < ke ? to_f32(wr[k]) : 0.0f;
        }
        if (!waited) {
          ot_pdl_wait();
          waited = true;
        }
#pragma unroll
        for (int u = 0; u < U; u++) {
          const int64_t k = k0 + u * 32;
          if (k < ke)
#pragma unroll
            for (int m = 0; m < MT; m++)
              if (m < M) acc[m] = fmaf(wf[u], to_f32(x[(int64_t)m * xs + k]), acc[m]);
        }
      }
    }
    if (!waited) { /* a lane with no K range still writes (row m = lane) */
      ot_pdl_wait();
      waited = true;
    }
    if (last) ot_pdl_launch_dependents(); /* this warp's loads are issued */
#pragma unroll
    for (int m = 0; m < MT; m++) acc[m] = warp_sum(acc[m]);
#pragma unroll
    for (int m = 0; m < MT; m++)
      if (lane == m && m < M) { /* lane m writes row m */
        if (part) {
          part[((int64_t)blockIdx.y * M + m) * N + n] = acc[m];
        } else {
          const float b = bias ? to_f32(bias[n]) : 0.0f;
          y[(int64_t)m * ys + n] = from_f32<T>(acc[m] + b);
        }
      }
  }
}

/* y[m, n] = sum over splits of part[s, m, n] (in order) + bias[n], rounded to T. */
template <typename T>
__global__ void gemv_reduce_kernel(const float *__restrict__ part, int splits, int M, int64_t N,
                                   const T *__restrict__ bias, T *__restrict__ y, int64_t ys) {
  ot_pdl_wait(); /* the partials of gemv_kernel (a programmatic dependent of it) */
  const int64_t total = (int64_t)M * N;
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < total;
       i += (int64_t)gridDim.x * blockDim.x) {
    const int64_t m = i / N, n = i - m * N;
    float s = 0.0f;
    for (int p = 0; p < splits; p++) s += part[(int64_t)p * total + i];
    if (bias) s += to_f32(bias[n]);
    y[m * ys + n] = from_f32<T>(s);
  }
}

/* The OT_LINEAR_* switches of one small-M call, read once per call in one pass over the
 * environment (tests and benches set them at run time, so they are not cached): in normal
 * use none is set and no getenv runs, where the call read up to four before. */
struct gemv_env {
  int gemv;     /* OT_LINEAR_GEMV: 0 never the small-M kernel, 1 always (M <= 16), -1 auto */
  bool balance; /* OT_LINEAR_GEMV_BALANCE not "0" (gemv_balance) */
  bool pdl;     /* OT_LINEAR_PDL not "0" (launch_pdl) */
};

static gemv_env gemv_read_env() {
  gemv_env v = {-1, true, true};
  if (!ot_env_any("OT_LINEAR_")) return v;
  const char *g = getenv("OT_LINEAR_GEMV");
  if (g && g[0] == '0') v.gemv = 0;
  if (g && g[0] == '1') v.gemv = 1;
  const char *b = getenv("OT_LINEAR_GEMV_BALANCE");
  v.balance = !(b && b[0] == '0');
  const char *p = getenv("OT_LINEAR_PDL");
  v.pdl = !(p && p[0] == '0');
  return v;
}

/* <<<grid, block, 0, st>>>(args...), as a programmatic dependent where the GPU and f's code
 * allow it (ot_pdl_ok, pdl.cuh: once per kernel and device, `cached` its static array);
 * OT_LINEAR_PDL=0 (env.pdl false): never. */
template <typename... P, typename... A>
static cudaError_t launch_pdl(const gemv_env &env, const ot_cuda_state *cs,
                              std::atomic<int> *cached, void (*f)(P...), dim3 grid, dim3 block,
                              cudaStream_t st, A... args) {
  const bool pdl = env.pdl && ot_pdl_ok(cs, f, cached);
  return ot_launch_pdl(pdl, f, grid, block, st, args...);
}

/* Blocks of f that one SM holds at once (cudaOccupancyMaxActiveBlocksPerMultiprocessor,
 * once per kernel and device: ot_per_device, pdl.cuh; 1 when the query fails). */
template <typename K>
static int gemv_resident(const ot_cuda_state *cs, K *f, std::atomic<int> *cached) {
  return ot_per_device(cs, cached, [f]() {
    int b = 0;
    if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&b, f, kGemvWarps * 32, 0) != cudaSuccess) {
      (void)cudaGetLastError();
      b = 0;
    }
    return b < 1 ? 1 : b;
  });
}

/* Rows per warp (M <= 4: the kernels of MT 1, 2, 4): when the N rows (grid.x blocks of
 * kGemvWarps warps, one row each) take more than one and at most two waves of the blocks
 * the SMs hold at once, each warp takes two rows (n, n + warps) and grid.x halves, so the
 * grid is one wave: one row per warp would end with a partial wave that streams W from a
 * fraction of the SMs. Measured (H200, run of 1a5683a, bench/engine_linear_bench.c, weights
 * not in L2, us, two rows / one; bf16 MT = 1 holds 9 blocks per SM at 56 registers, MT = 4
 * 8 at 64): 8B qkv 6144 x 4096 at M = 1 17.8 / 18.8, M = 4 27.8 / 30.8; 13B o_proj 5120 x
 * 5120 18.2 / 21.2 and 31.7 / 34.7; 13B down 5120 x 13824 44.7 / 51.6 and 79.4 / 92.1.
 * Over more waves the hardware's block scheduling wins: rows per warp for the whole grid in
 * one wave was slower there (8B lm_head 128256 x 4096 at M = 1 260.7 / 239.2, gate_up
 * 28672 x 4096 65.6 / 59.0, 13B qkv 15360 x 5120 45.8 / 42.7), and at M = 16 (6 blocks
 * per SM in that run; 9 since the loop is compiled out above four rows) two rows were not
 * better either (13B down 386.7 / 366.1, 8B qkv 91.2 / 89.5, 8B o_proj 81.6 / 87.6): those
 * keep one row per warp. OT_LINEAR_GEMV_BALANCE=0: always one row per warp. */
template <typename K>
static int gemv_balance(const gemv_env &env, const ot_cuda_state *cs, K *f,
                        std::atomic<int> *cached, dim3 *grid, int64_t N) {
  if (!env.balance || cs->sm_count <= 0) return 1;
  const int64_t wave = (int64_t)gemv_resident(cs, f, cached) * cs->sm_count / grid->y;
  if (wave < 1 || (int64_t)grid->x <= wave || (int64_t)grid->x > 2 * wave) return 1;
  grid->x = (unsigned)((N + 2 * kGemvWarps - 1) / (2 * kGemvWarps));
  return 2;
}

template <typename T, int MT, int U>
static cudaError_t gemv_launch_mt(const gemv_env &env, const ot_cuda_state *cs, bool vec,
                                  dim3 grid, cudaStream_t st, const ot_linear_forward_args *a,
                                  float *part, int64_t klen) {
  static std::atomic<int> pdl_vec[16] = {}, pdl_scalar[16] = {};
  static std::atomic<int> occ_vec[16] = {}, occ_scalar[16] = {};
  const T *x = (const T *)a->x, *w = (const T *)a->weight, *b = (const T *)a->bias;
  T *y = (T *)a->y;
  const int M = (int)a->rows;
  if (vec) {
    const int rpw = MT <= 4 ? gemv_balance(env, cs, gemv_kernel<T, MT, true, U>, occ_vec, &grid,
                                           a->out_features)
                            : 1;
    return launch_pdl(env, cs, pdl_vec, gemv_kernel<T, MT, true, U>, grid, dim3(kGemvWarps * 32),
                      st, x, a->x_stride, w, b, y, a->y_stride, part, M, a->in_features,
                      a->out_features, klen, rpw);
  }
  const int rpw = MT <= 4 ? gemv_balance(env, cs, gemv_kernel<T, MT, false, U>, occ_scalar,
                                         &grid, a->out_features)
                          : 1;
  return launch_pdl(env, cs, pdl_scalar, gemv_kernel<T, MT, false, U>, grid,
                    dim3(kGemvWarps * 32), st, x, a->x_stride, w, b, y, a->y_stride, part, M,
                    a->in_features, a->out_features, klen, rpw);
}

template <typename T>
static cudaError_t gemv_launch(const gemv_env &env, const ot_cuda_state *cs, bool vec, dim3 grid,
                               cudaStream_t st, const ot_linear_forward_args *a, float *part,
                               int64_t klen) {
  static std::atomic<int> pdl_reduce[16] = {};
  const int64_t M = a->rows;
  cudaError_t e;
  constexpr int U = kGemvUnroll;
  if (M <= 1) e = gemv_launch_mt<T, 1, 2 * U>(env, cs, vec, grid, st, a, part, klen);
  else if (M <= 2) e = gemv_launch_mt<T, 2, U>(env, cs, vec, grid, st, a, part, klen);
  else if (M <= 4) e = gemv_launch_mt<T, 4, U>(env, cs, vec, grid, st, a, part, klen);
  else if (M <= 8) e = gemv_launch_mt<T, 8, U>(env, cs, vec, grid, st, a, part, klen);
  else e = gemv_launch_mt<T, 16, U>(env, cs, vec, grid, st, a, part, klen);
  if (e != cudaSuccess || !part) return e;
  const int64_t total = M * a->out_features;
  int64_t blocks = (total + 255) / 256;
  if (blocks > 4096) blocks = 4096;
  return launch_pdl(env, cs, pdl_reduce, gemv_reduce_kernel<T>, dim3((unsigned)blocks),
                    dim3(256), st, (const float *)part, (int)grid.y, (int)M, a->out_features,
                    (const T *)a->bias, (T *)a->y, a->y_stride);
}

static bool aligned16(const void *p) { return ((uintptr_t)p & 15u) == 0; }

/* Whether the small-M kernel runs this forward. OT_LINEAR_GEMV: "0" never, "1" for every
 * M <= 16 (any K, alignment, dtype: the tests use it), unset / other: auto -- where it beat
 * cuBLASLt on the H200 (bench/engine_linear_bench.c, bf16, run of 51babbf; docs/ENGINE.md):
 * bfloat16 / float16, one row, 16-byte vectors, and a weight either small (N K < 1.5 2^24:
 * 4096 x 4096 in 11.7 us against cuBLASLt's 16.6) or of lm_head size (N K >= 2^28: 128256
 * x 4096 in 242 us against 249). Between those both read W at 3.2-4.0 TB/s and cuBLASLt
 * was 1-4% ahead; at M >= 2 cuBLASLt's tensor-core kernels read W once for all rows and
 * this kernel's per-row x loads and float32 FMAs made it 10-75% slower (M = 2 .. 16).
 * Measured again with every call reading a weight not in L2 (run of 9349f37; M = 1, us,
 * small-M / cuBLASLt): 8B qkv 18.8 / 17.4, o_proj 12.5 / 25.3, gate_up 60.3 / 60.6, down
 * 35.7 / 33.1, lm_head 241.6 / 254.9; 13B o_proj 20.3 / 17.3: the same rule. A tensor-core
 * small-M kernel (mma.sync m16n8k16, W as A, x^T as B, no shared memory) was slower than
 * cuBLASLt at M = 4 / 16 for every weight but 4096 x 4096, and brought the batch-16
 * decode nothing (6.70 against 6.67 ms); it was removed. */
static bool gemv_wanted(const ot_linear_forward_args *a, gemv_env *env, bool *vec) {
  const size_t es = ot_dtype_size(a->dtype);
  const int64_t V = 16 / (int64_t)es;
  *vec = a->in_features % V == 0 && aligned16(a->x) && aligned16(a->weight) &&
         (a->rows == 1 || ((size_t)a->x_stride * es) % 16 == 0);
  if (a->rows > kGemvMaxM) return false;
  *env = gemv_read_env();
  if (env->gemv >= 0) return env->gemv == 1;
  return ot_linear_small_m_auto(a->rows, a->in_features, a->out_features, a->dtype != OT_F32,
                                *vec);
}

static ot_status gemv_forward(ot_context *ctx, const char *op, const ot_linear_forward_args *a,
                              const gemv_env &env, bool vec) {
  const ot_cuda_state *cs = ot_cuda_state_of(ctx);
  cudaStream_t st = (cudaStream_t)ctx->stream;
  const int64_t M = a->rows, K = a->in_features, N = a->out_features;
  const int64_t chunk = (vec ? 32 * (16 / (int64_t)ot_dtype_size(a->dtype)) : 32) * kGemvUnroll;
  /* split K when the columns give fewer than ~16 warps per SM, each split >= 2 chunks */
  const int64_t want = (int64_t)(cs->sm_count > 0 ? cs->sm_count : 100) * 16;
  int64_t splits = 1;
  if (N < want) {
    splits = (want + N - 1) / N;
    int64_t most = K / (2 * chunk);
    if (splits > most) splits = most;
    if (splits > 64) splits = 64;
    if (splits < 1) splits = 1;
  }
  float *part = nullptr;
  if (splits > 1) {
    const size_t need = (size_t)(splits * M * N) * sizeof(float);
    cudaStreamCaptureStatus cap = cudaStreamCaptureStatusNone;
    (void)cudaStreamIsCapturing(st, &cap);
    if (cap != cudaStreamCaptureStatusNone && need > cs->scratch_bytes) {
      splits = 1; /* growing the scratch synchronizes the stream: not inside a capture */
    } else {
      part = (float *)ot_cuda_scratch(ctx, need, op);
      if (!part) return OT_ERR_OOM; /* recorded by ot_cuda_scratch */
    }
  }
  int64_t klen = K;
  if (splits > 1) {
    klen = ((K + splits - 1) / splits + chunk - 1) / chunk * chunk;
    splits = (K + klen - 1) / klen;
    if (splits <= 1) {
      part = nullptr;
      klen = K;
      splits = 1;
    }
  }
  dim3 grid((unsigned)((N + kGemvWarps - 1) / kGemvWarps), (unsigned)splits, 1);
  cudaError_t e;
  switch (a->dtype) {
    case OT_F16: e = gemv_launch<__half>(env, cs, vec, grid, st, a, part, klen); break;
    case OT_BF16: e = gemv_launch<__nv_bfloat16>(env, cs, vec, grid, st, a, part, klen); break;
    default: e = gemv_launch<float>(env, cs, vec, grid, st, a, part, klen); break;
  }
  OT_CUDA_CHECK(op, e);
  return OT_OK;
}

} /* namespace ot */

extern "C" ot_status ot_cuda_linear_forward(ot_context *ctx, const ot_linear_forward_args *a) {
  static const char op[] = "ot_linear_forward";
  using namespace ot;
  const int64_t M = a->rows, K = a->in_features, N = a->out_features;
  cudaStream_t st = (cudaStream_t)ctx->stream;
  if (M == 0 || N == 0) return OT_OK;
  if (K == 0) {
    OT_CUDA_CHECK(op, fill_rows_any(a->dtype, a->y, a->y_stride, a->bias, M, N, st));
    return OT_OK;
  }
  bool vec = false;
  gemv_env env;
  if (gemv_wanted(a, &env, &vec)) return gemv_forward(ctx, op, a, env, vec);
  ot_gemm g;
  memset(&g, 0, sizeof g);
  g.transa = true;
  g.m = N;
  g.n = M;
  g.k = K;
  g.ab = g.d = a->dtype;
  g.A = a->weight;
  g.lda = K;
  g.B = a->x;
  g.ldb = a->x_stride;
  g.D = a->y;
  g.ldd = a->y_stride;
  g.alpha = 1.0f;
  g.beta = 0.0f;
  if (a->bias) {
    g.epilogue = OT_GEMM_BIAS;
    g.bias = (void *)a->bias;
    ot_status s = ot_cuda_gemm(ctx, op, &g);
    if (s != OT_ERR_UNSUPPORTED) return s;
    /* no fused-bias algorithm: y = bias, then y += x W^T */
    OT_CUDA_CHECK(op, fill_rows_any(a->dtype, a->y, a->y_stride, a->bias, M, N, st));
    g.epilogue = OT_GEMM_PLAIN;
    g.bias = nullptr;
    g.beta = 1.0f;
  }
  return ot_cuda_gemm(ctx, op, &g);
}

extern "C" ot_status ot_cuda_linear_backward(ot_context *ctx, const ot_linear_backward_args *a) {
  static const char op[] = "ot_linear_backward";
  using namespace ot;
  const int64_t M = a->rows, K = a->in_features, N = a->out_features;
  const size_t es = ot_dtype_size(a->dtype);
  cudaStream_t st = (cudaStream_t)ctx->stream;
  if (a->dx && M > 0 && K > 0) {
    if (N == 0) {
      OT_CUDA_CHECK(op, cudaMemset2DAsync(a->dx, (size_t)a->dx_stride * es, 0, (size_t)K * es,
                                          (size_t)M, st));
    } else {
      ot_gemm g;
      memset(&g, 0, sizeof g);
      g.m = K;
      g.n = M;
      g.k = N;
      g.ab = g.d = a->dtype;
      g.A = a->weight;
      g.lda = K;
      g.B = a->dy;
      g.ldb = a->dy_stride;
      g.D = a->dx;
      g.ldd = a->dx_stride;
      g.alpha = 1.0f;
      OT_TRY(ot_cuda_gemm(ctx, op, &g));
    }
  }
  bool dbias_done = false;
  if (M == 0) {
    if (a->dweight && N * K > 0)
      OT_CUDA_CHECK(op, cudaMemsetAsync(a->dweight, 0, (size_t)(N * K) * es, st));
    if (a->dbias && N > 0) OT_CUDA_CHECK(op, cudaMemsetAsync(a->dbias, 0, (size_t)N * es, st));
    return OT_OK;
  }
  if (a->dweight && N > 0 && K > 0) {
    ot_gemm g;
    memset(&g, 0, sizeof g);
    g.transb = true;
    g.m = K;
    g.n = N;
    g.k = M;
    g.ab = g.d = a->dtype;
    g.A = a->x;
    g.lda = a->x_stride;
    g.B = a->dy;
    g.ldb = a->dy_stride;
    g.D = a->dweight;
    g.ldd = K;
    g.alpha = 1.0f;
    ot_status s = OT_ERR_UNSUPPORTED;
    if (a->dbias) {
      g.epilogue = OT_GEMM_BGRADB;
      g.bias = a->dbias;
      s = ot_cuda_gemm(ctx, op, &g);
      dbias_done = s == OT_OK;
      g.epilogue = OT_GEMM_PLAIN;
      g.bias = nullptr;
    }
    if (s == OT_ERR_UNSUPPORTED) s = ot_cuda_gemm(ctx, op, &g);
    OT_TRY(s);
  }
  if (a->dbias && !dbias_done)
    OT_CUDA_CHECK(op, column_sum_any(a->dtype, a->dy, a->dy_stride, M, N, a->dbias, st));
  return OT_OK;
}
