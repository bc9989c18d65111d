/* cases_norm.c -- cases of the norm op family (to be filled in). */
#include "harness.h"

static void run(test_run *tr) { (void)tr; }

const test_suite suite_norm = {"norm", run};
