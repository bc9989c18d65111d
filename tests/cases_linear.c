/* cases_linear.c -- cases of the linear op family (to be filled in). */
#include "harness.h"

static void run(test_run *tr) { (void)tr; }

const test_suite suite_linear = {"linear", run};
