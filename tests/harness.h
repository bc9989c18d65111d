/*
 * harness.h -- the cross-backend op test harness (in the spirit of ggml's
 * test-backend-ops).
 *
 * One program, one table of cases per op family (tests/cases_<family>.c). Each case
 *   - builds seeded random inputs (never zeros) on the host,
 *   - poisons its outputs (NaN for floats) so that unwritten elements show,
 *   - runs the op on a backend (the CPU always; CUDA when built and a device exists),
 *   - compares with a float64 reference written plainly in the test file, with the
 *     tolerances of docs/NUMERICS.md.
 * In gradient mode (--grad, tr->grad) the suites run only their gradient checks: each
 * backward op against central finite differences of the float64 reference forward,
 * on small shapes. The normal mode checks backward ops against analytic float64
 * references at realistic shapes.
 */
#ifndef OT_TEST_HARNESS_H
#define OT_TEST_HARNESS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "ops_transformer.h"

/* ---- backends ---------------------------------------------------------------- */

typedef struct backend {
  const char *name; /* "cpu", "cuda" */
  ot_context *ctx;
  bool is_cuda;
} backend;

/* ---- random numbers (splitmix64) ---------------------------------------------- */

typedef struct rng {
  uint64_t s;
} rng;
uint64_t rng_u64(rng *r);
double rng_uniform(rng *r, double lo, double hi); /* [lo, hi) */
double rng_normal(rng *r);
int64_t rng_int(rng *r, int64_t lo, int64_t hi); /* [lo, hi] inclusive */

/* ---- dtypes ------------------------------------------------------------------- */

extern const DLDataType DT_F32, DT_F16, DT_BF16, DT_I32, DT_I64;
const char *dt_name(DLDataType t);
bool dt_is_float(DLDataType t);
size_t dt_size(DLDataType t);
/* Round a double to what storage of dtype t holds (identity for ints within range). */
double dt_round(DLDataType t, double v);

/* ---- test tensors --------------------------------------------------------------- */

/* A tensor owned by a test: host storage always; a device mirror on CUDA backends.
 * Element access is by logical row-major index through the strides. */
typedef struct tbuf {
  DLTensor t;
  int64_t shape[8];
  int64_t strides[8];
  int64_t numel;
  size_t bytes;      /* bytes of the allocation (the strided extent) */
  void *host;
  void *dev;         /* == host on the CPU */
  const backend *be;
  bool host_dirty;   /* host written since the last upload */
} tbuf;

tbuf *tb_new(const backend *be, DLDataType dt, int ndim, const int64_t *shape);
/* strides in elements (NULL = contiguous); the allocation covers the extent and the
 * gaps are poisoned too. */
tbuf *tb_new_strided(const backend *be, DLDataType dt, int ndim, const int64_t *shape,
                     const int64_t *strides);
void tb_free(tbuf *b);
/* Logical element i (row-major over the shape), as double, from the host copy. */
double tb_get(const tbuf *b, int64_t i);
/* Store v (rounded to the dtype) at logical element i of the host copy. */
void tb_set(tbuf *b, int64_t i, double v);
/* Uniform random in [lo, hi), rejecting exact zeros. */
void tb_fill_uniform(tbuf *b, rng *r, double lo, double hi);
/* NaN for floats, 0x5a bytes for ints, over the whole allocation. */
void tb_poison(tbuf *b);
/* The DLTensor to pass to the library (uploads the host copy first if it changed). */
const DLTensor *tb_dl(tbuf *b);
/* Download the backend's copy into the host copy (a no-op on the CPU). */
void tb_sync(tbuf *b);
/* malloc'd float64 copy of the logical elements. */
double *tb_to_f64(const tbuf *b);
/* Byte snapshot of the whole allocation (after tb_sync); free() it. */
void *tb_snapshot(tbuf *b);
bool tb_unchanged(tbuf *b, const void *snapshot);

/* ---- a test run ----------------------------------------------------------------- */

typedef struct test_run {
  const backend *be;
  uint64_t seed;
  bool grad;          /* gradient (finite difference) mode */
  bool verbose;
  const char *filter; /* run only cases whose name contains this */
  /* state of the current case */
  char case_name[256];
  bool case_failed;
  bool case_skipped;
  /* totals */
  int passed, failed, skipped;
} test_run;

/* Start a case; returns false when filtered out (then do not run it). The case name
 * is a printf format. */
bool tr_begin(test_run *tr, const char *fmt, ...);
/* Finish the case: prints one line and counts it. */
void tr_end(test_run *tr);
/* Record a failure of the current case with a message. */
void tr_fail(test_run *tr, const char *fmt, ...);
/* A deterministic rng for the current case (derived from the seed and the name). */
rng tr_rng(const test_run *tr);

/* Check an op's status is OT_OK. On the CUDA backend, OT_ERR_UNSUPPORTED marks the
 * case skipped instead. Returns true when the op ran. */
bool tr_ok(test_run *tr, ot_status st, const char *what);
/* Expect status `want` and a last-error message that contains each non-NULL string. */
/* Environment overrides for cases that switch a kernel through its OT_* variable (read per
 * call by the library): env_set sets `name` (value NULL: unsets it) and returns what was
 * there, env_restore puts that back -- so a run under a caller's own setting (a device
 * script's variant pass, say) keeps it for the cases after. */
typedef struct env_saved {
  const char *name;
  char *value; /* NULL: was unset */
} env_saved;
env_saved env_set(const char *name, const char *value);
void env_restore(env_saved *saved);

bool tr_expect_error(test_run *tr, ot_status st, ot_status want, const char *contains1,
                     const char *contains2);

/* Tolerance: |got - ref| <= atol + rtol * |ref|. */
typedef struct tol {
  double atol, rtol;
} tol;
/* The default tolerance of an op's output stored in dtype t (docs/NUMERICS.md),
 * scaled by `k` (k = 1 for elementwise ops, larger for long reductions). */
tol tol_for(DLDataType t, double k);
/* Compare the (synced) output with a float64 reference of numel values. Fails the case
 * on any violation or non-finite value where the reference is finite. Reports the worst
 * element. Returns the max abs error. */
double check_close(test_run *tr, const char *what, const tbuf *got, const double *ref, tol t);
/* Same for plain float64 arrays (e.g. comparing two references). */
double check_close_f64(test_run *tr, const char *what, const double *got, const double *ref,
                       int64_t n, tol t);

/* ---- finite differences ------------------------------------------------------------ */

/* f: float64 forward reference; reads in[0..n_in), writes out[0..n_out). */
typedef void (*ref_fn)(void *state, const double *in, double *out);
/* grad[i] = sum_j dout[j] * d out_j / d in_i, by central differences with step h
 * (h scaled by max(1, |in_i|)). `in` is modified and restored. */
void fd_vjp(ref_fn f, void *state, double *in, int64_t n_in, int64_t n_out, const double *dout,
            double *grad, double h);

/* ---- suites -------------------------------------------------------------------------- */

typedef struct test_suite {
  const char *name;
  void (*run)(test_run *tr);
} test_suite;

/* Each cases_<family>.c defines one suite. */
extern const test_suite suite_core;
extern const test_suite suite_norm;
extern const test_suite suite_rope;
extern const test_suite suite_glu;
extern const test_suite suite_softmax_ce;
extern const test_suite suite_attention;
extern const test_suite suite_linear;
extern const test_suite suite_memory;
extern const test_suite suite_adamw;
extern const test_suite suite_linear_ce;
extern const test_suite suite_arena;

#endif /* OT_TEST_HARNESS_H */
