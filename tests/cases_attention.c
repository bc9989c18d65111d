/* cases_attention.c -- cases of the attention op family (to be filled in). */
#include "harness.h"

static void run(test_run *tr) { (void)tr; }

const test_suite suite_attention = {"attention", run};
