/* cases_softmax_ce.c -- cases of the softmax_ce op family (to be filled in). */
#include "harness.h"

static void run(test_run *tr) { (void)tr; }

const test_suite suite_softmax_ce = {"softmax_ce", run};
