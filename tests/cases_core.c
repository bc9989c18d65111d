/* cases_core.c -- context, version, status and error reporting. */
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include "harness.h"

static void *other_thread(void *arg) {
  (void)arg;
  /* A failure on this thread must not change the main thread's message. */
  ot_context *c = NULL;
  ot_context_options o = ot_context_default_options();
  o.num_threads = -3;
  ot_context_create(&o, &c);
  return NULL;
}

static void run(test_run *tr) {
  if (tr->grad) return;
  if (tr_begin(tr, "version")) {
    if (ot_version() != OT_VERSION_NUMBER) tr_fail(tr, "ot_version() %d != header %d", ot_version(), OT_VERSION_NUMBER);
    char want[32];
    snprintf(want, sizeof want, "%d.%d.%d", OT_VERSION_MAJOR, OT_VERSION_MINOR, OT_VERSION_PATCH);
    if (strcmp(ot_version_string(), want)) tr_fail(tr, "ot_version_string() %s != %s", ot_version_string(), want);
    tr_end(tr);
  }
  if (tr_begin(tr, "status strings")) {
    ot_status all[] = {OT_OK, OT_ERR_INVALID_ARGUMENT, OT_ERR_UNSUPPORTED, OT_ERR_OOM,
                       OT_ERR_NO_DEVICE, OT_ERR_BACKEND, OT_ERR_INTERNAL};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
      for (size_t j = 0; j < i; j++)
        if (!strcmp(ot_status_string(all[i]), ot_status_string(all[j])))
          tr_fail(tr, "statuses %d and %d share the name %s", (int)all[i], (int)all[j], ot_status_string(all[i]));
    if (!ot_status_string((ot_status)999)) tr_fail(tr, "unknown status gives NULL");
    tr_end(tr);
  }
  if (tr_begin(tr, "context create/destroy")) {
    ot_context_destroy(NULL); /* must be harmless */
    ot_context *c = NULL;
    if (!tr_ok(tr, ot_context_create(NULL, &c), "ot_context_create")) { tr_end(tr); return; }
    DLDevice d = ot_context_device(c);
    if (d.device_type != kDLCPU) tr_fail(tr, "default context is not on the CPU");
    ot_context_destroy(c);
    tr_expect_error(tr, ot_context_create(NULL, NULL), OT_ERR_INVALID_ARGUMENT, "ot_context_create", "out");
    ot_context_options o = ot_context_default_options();
    o.num_threads = -1;
    c = (ot_context *)0x1;
    tr_expect_error(tr, ot_context_create(&o, &c), OT_ERR_INVALID_ARGUMENT, "ot_context_create", "num_threads");
    if (c != NULL) tr_fail(tr, "out not cleared on failure");
    o = ot_context_default_options();
    o.device_type = kDLVulkan;
    tr_expect_error(tr, ot_context_create(&o, &c), OT_ERR_UNSUPPORTED, "device_type", NULL);
    o = ot_context_default_options();
    o.device_id = 3;
    tr_expect_error(tr, ot_context_create(&o, &c), OT_ERR_INVALID_ARGUMENT, "device_id", NULL);
    tr_expect_error(tr, ot_context_set_stream(NULL, NULL), OT_ERR_INVALID_ARGUMENT, "ctx", NULL);
    tr_end(tr);
  }
  if (tr_begin(tr, "cuda context without device or without cuda build")) {
    ot_context_options o = ot_context_default_options();
    o.device_type = kDLCUDA;
    o.device_id = 4096; /* never present */
    ot_context *c = NULL;
    tr_expect_error(tr, ot_context_create(&o, &c), OT_ERR_NO_DEVICE, "ot_context_create", NULL);
    tr_end(tr);
  }
  if (tr_begin(tr, "last error is thread-local")) {
    ot_context *c = NULL;
    ot_context_options o = ot_context_default_options();
    o.device_id = 7;
    ot_context_create(&o, &c);
    char before[512];
    snprintf(before, sizeof before, "%s", ot_last_error());
    pthread_t th;
    pthread_create(&th, NULL, other_thread, NULL);
    pthread_join(th, NULL);
    if (strcmp(before, ot_last_error())) tr_fail(tr, "message changed by another thread: \"%s\" -> \"%s\"", before, ot_last_error());
    tr_end(tr);
  }
}

const test_suite suite_core = {"core", run};
