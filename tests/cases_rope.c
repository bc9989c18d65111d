/* cases_rope.c -- cases of the rope op family (to be filled in). */
#include "harness.h"

static void run(test_run *tr) { (void)tr; }

const test_suite suite_rope = {"rope", run};
