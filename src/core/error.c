/* error.c -- status strings and the thread-local last error. */
#include <stdio.h>

#include "internal.h"

#define OT_ERROR_CAP 1024 /* bytes of the last-error message, NUL included */

static _Thread_local char ot_last_error_buf[OT_ERROR_CAP];

const char *ot_status_string(ot_status status) {
  switch (status) {
    case OT_OK: return "ok";
    case OT_ERR_INVALID_ARGUMENT: return "invalid argument";
    case OT_ERR_UNSUPPORTED: return "unsupported";
    case OT_ERR_OOM: return "out of memory";
    case OT_ERR_NO_DEVICE: return "no device";
    case OT_ERR_BACKEND: return "backend error";
    case OT_ERR_INTERNAL: return "internal error";
  }
  return "unknown status";
}

const char *ot_last_error(void) { return ot_last_error_buf; }

/* Formatted into a local buffer first: an argument may be ot_last_error() itself (a
 * message that quotes the failure it wraps), which writing in place would overwrite. */
ot_status ot_error(ot_status status, const char *op, const char *fmt, ...) {
  char buf[OT_ERROR_CAP];
  int n = snprintf(buf, OT_ERROR_CAP, "%s: ", op ? op : "ops_transformer");
  if (n < 0) n = 0;
  if (n < OT_ERROR_CAP) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf + n, (size_t)(OT_ERROR_CAP - n), fmt, ap);
    va_end(ap);
  }
  buf[OT_ERROR_CAP - 1] = '\0';
  memcpy(ot_last_error_buf, buf, OT_ERROR_CAP);
  return status;
}

int ot_version(void) { return OT_VERSION_NUMBER; }

#define OT_STR2(x) #x
#define OT_STR(x) OT_STR2(x)
const char *ot_version_string(void) {
  return OT_STR(OT_VERSION_MAJOR) "." OT_STR(OT_VERSION_MINOR) "." OT_STR(OT_VERSION_PATCH);
}
