/*
 * test_ops.c -- runs every op suite on every backend present.
 *
 *   test_ops [--grad] [--filter TEXT] [--backend cpu|cuda] [--seed N] [-v]
 *
 * Inputs are fresh random numbers each run unless --seed (or OT_TEST_SEED) fixes them;
 * the seed is printed first so a failure can be replayed. The last line is the summary
 * CTest reads; the exit status is non-zero on any failure, and when nothing ran: an unknown
 * --suite or --backend, --backend cuda without a usable CUDA device, or a --filter that
 * matches no case (so a sanitizer or CI run over zero cases cannot read as clean).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "harness.h"

static const test_suite *const suites[] = {
    &suite_core, &suite_norm, &suite_rope, &suite_glu, &suite_softmax_ce, &suite_attention,
    &suite_linear, &suite_memory, &suite_adamw, &suite_linear_ce, &suite_arena,
};

int main(int argc, char **argv) {
  /* line-buffered even into a file: a run cut by a time limit (the device scripts' timeout)
   * still shows every FAIL line printed before the cut */
  setvbuf(stdout, NULL, _IOLBF, 0);
  test_run base;
  memset(&base, 0, sizeof base);
  const char *only_backend = NULL;
  const char *only_suite = NULL;
  base.seed = (uint64_t)time(NULL) ^ ((uint64_t)clock() << 32);
  if (getenv("OT_TEST_SEED")) base.seed = strtoull(getenv("OT_TEST_SEED"), NULL, 0);
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--grad")) base.grad = true;
    else if (!strcmp(argv[i], "-v")) base.verbose = true;
    else if (!strcmp(argv[i], "--filter") && i + 1 < argc) base.filter = argv[++i];
    else if (!strcmp(argv[i], "--suite") && i + 1 < argc) only_suite = argv[++i];
    else if (!strcmp(argv[i], "--backend") && i + 1 < argc) only_backend = argv[++i];
    else if (!strcmp(argv[i], "--seed") && i + 1 < argc) base.seed = strtoull(argv[++i], NULL, 0);
    else if (!strcmp(argv[i], "--list")) {   /* the suites' names, one a line (for scripts) */
      for (size_t s = 0; s < sizeof suites / sizeof suites[0]; s++) printf("%s\n", suites[s]->name);
      return 0;
    } else {
      fprintf(stderr,
              "usage: %s [--grad] [--filter TEXT] [--suite NAME] [--backend cpu|cuda] "
              "[--seed N] [-v] | --list\n",
              argv[0]);
      return 2;
    }
  }
  /* A name that selects nothing is an error, not an empty pass: a sanitizer or CI run over
   * zero cases must not read as clean. */
  if (only_backend && strcmp(only_backend, "cpu") && strcmp(only_backend, "cuda")) {
    fprintf(stderr, "test_ops: --backend %s: no such backend (cpu, cuda)\n", only_backend);
    return 2;
  }
  if (only_suite) {
    size_t s = 0;
    while (s < sizeof suites / sizeof suites[0] && strcmp(only_suite, suites[s]->name)) s++;
    if (s == sizeof suites / sizeof suites[0]) {
      fprintf(stderr, "test_ops: --suite %s: no such suite (--list names them)\n", only_suite);
      return 2;
    }
  }
  printf("ops_transformer %s test_ops: seed %llu%s\n", ot_version_string(),
         (unsigned long long)base.seed, base.grad ? " (gradient mode)" : "");

  backend backends[2];
  int nb = 0;
  {
    ot_context *ctx = NULL;
    if (ot_context_create(NULL, &ctx) != OT_OK) {
      fprintf(stderr, "cannot create a CPU context: %s\n", ot_last_error());
      return 1;
    }
    backends[nb++] = (backend){"cpu", ctx, false};
  }
  char cuda_why[512] = "the library was built without -DOT_CUDA=ON";
#ifdef OT_TEST_CUDA
  {
    ot_context_options o = ot_context_default_options();
    o.device_type = kDLCUDA;
    ot_context *ctx = NULL;
    ot_status st = ot_context_create(&o, &ctx);
    if (st == OT_OK) backends[nb++] = (backend){"cuda", ctx, true};
    else {
      snprintf(cuda_why, sizeof cuda_why, "%s", ot_last_error());
      printf("cuda backend not run: %s\n", cuda_why);
    }
  }
#endif
  if (only_backend && !strcmp(only_backend, "cuda") && (nb < 2 || !backends[1].is_cuda)) {
    fprintf(stderr, "test_ops: --backend cuda: the CUDA backend is not available: %s\n", cuda_why);
    for (int b = 0; b < nb; b++) ot_context_destroy(backends[b].ctx);
    return 1;
  }

  int passed = 0, failed = 0, skipped = 0;
  for (int b = 0; b < nb; b++) {
    if (only_backend && strcmp(only_backend, backends[b].name)) continue;
    for (size_t s = 0; s < sizeof suites / sizeof suites[0]; s++) {
      if (only_suite && strcmp(only_suite, suites[s]->name)) continue;
      test_run tr = base;
      tr.be = &backends[b];
      suites[s]->run(&tr);
      printf("%-5s %-12s %4d passed, %3d failed, %3d skipped\n", backends[b].name,
             suites[s]->name, tr.passed, tr.failed, tr.skipped);
      passed += tr.passed;
      failed += tr.failed;
      skipped += tr.skipped;
    }
  }
  for (int b = 0; b < nb; b++) ot_context_destroy(backends[b].ctx);
  printf("test_ops: %d passed, %d failed, %d skipped (seed %llu)\n", passed, failed, skipped,
         (unsigned long long)base.seed);
  if (passed + failed + skipped == 0) {
    fprintf(stderr, "test_ops: no case ran (--filter \"%s\", --suite %s, --backend %s)\n",
            base.filter ? base.filter : "", only_suite ? only_suite : "all",
            only_backend ? only_backend : "all");
    return 1;
  }
  return failed ? 1 : 0;
}
