/* cases_glu.c -- cases of the glu op family (to be filled in). */
#include "harness.h"

static void run(test_run *tr) { (void)tr; }

const test_suite suite_glu = {"glu", run};
