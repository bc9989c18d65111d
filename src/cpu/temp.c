/* temp.c -- the CPU backend's temporaries (see temp.h). */
#include "cpu/temp.h"

#include <stdlib.h>

#include "core/arena.h"

void *ot_cpu_temp_alloc(const ot_context *ctx, const char *op, const char *what, size_t bytes) {
  if (bytes == 0) bytes = 1;
  if (ctx->host_arena) {
    void *p = NULL;
    if (ot_arena_alloc_for(op, what, ctx->host_arena, bytes, NULL, OT_MEMORY_WORKSPACE, &p) !=
        OT_OK)
      return NULL;
    return p;
  }
  if (bytes > SIZE_MAX - 63) {
    ot_error(OT_ERR_OOM, op, "%s: cannot allocate %zu bytes", what, bytes);
    return NULL;
  }
  void *p = aligned_alloc(64, (bytes + 63) / 64 * 64);
  if (!p) ot_error(OT_ERR_OOM, op, "%s: cannot allocate %zu bytes", what, bytes);
  return p;
}

void ot_cpu_temp_free(const ot_context *ctx, void *ptr) {
  if (!ptr) return;
  if (ctx->host_arena) ot_arena_free(ctx->host_arena, ptr, NULL);
  else free(ptr);
}
