/*
 * memory_tracker.c -- process-wide counters of the memory handed out by arenas and KV
 * pools: per tag (weights, kv_cache, activations, workspace, other) and per op name.
 * One mutex guards everything; the arena calls in while holding its own lock (order:
 * arena, then tracker, never the reverse).
 */
#include <pthread.h>
#include <stdio.h>

#include "memory_tracker.h"

#define OT_MEMORY_MAX_OPS 128
#define OT_MEMORY_OP_NAME 64

static pthread_mutex_t tracker_lock = PTHREAD_MUTEX_INITIALIZER;
static ot_memory_counter tag_counters[OT_MEMORY_NUM_TAGS];
static ot_memory_counter total_counter; /* every tag together (its peak is the true peak) */
static ot_memory_counter op_counters[OT_MEMORY_MAX_OPS];
static char op_names[OT_MEMORY_MAX_OPS][OT_MEMORY_OP_NAME];
static int op_count;

/* Index of `name`, registering it; called with the lock held. */
static int op_index_locked(const char *name) {
  for (int i = 0; i < op_count; i++)
    if (!strncmp(op_names[i], name, OT_MEMORY_OP_NAME - 1)) return i;
  if (op_count == OT_MEMORY_MAX_OPS - 1) {
    /* the last entry collects every further name */
    snprintf(op_names[op_count], OT_MEMORY_OP_NAME, "%s", "(other)");
    return op_count++;
  }
  if (op_count == OT_MEMORY_MAX_OPS) return OT_MEMORY_MAX_OPS - 1;
  snprintf(op_names[op_count], OT_MEMORY_OP_NAME, "%s", name);
  return op_count++;
}

int ot_memory_op_index(const char *op) {
  pthread_mutex_lock(&tracker_lock);
  int i = op_index_locked(op ? op : "(none)");
  pthread_mutex_unlock(&tracker_lock);
  return i;
}

static void bump(ot_memory_counter *c, size_t bytes, int sign) {
  if (sign > 0) {
    c->current += bytes;
    c->allocs++;
    if (c->current > c->peak) c->peak = c->current;
  } else {
    c->current -= bytes;
    c->frees++;
  }
}

void ot_memory_record(ot_memory_tag tag, int op_index, size_t bytes, int sign) {
  pthread_mutex_lock(&tracker_lock);
  bump(&tag_counters[tag], bytes, sign);
  bump(&total_counter, bytes, sign);
  if (op_index >= 0 && op_index < OT_MEMORY_MAX_OPS) bump(&op_counters[op_index], bytes, sign);
  pthread_mutex_unlock(&tracker_lock);
}

ot_status ot_memory_tag_counter(ot_memory_tag tag, ot_memory_counter *out) {
  static const char *op = "ot_memory_tag_counter";
  if ((int)tag < 0 || (int)tag >= OT_MEMORY_NUM_TAGS)
    return ot_error(OT_ERR_INVALID_ARGUMENT, op, "tag: %d, expected 0 .. %d", (int)tag,
                    OT_MEMORY_NUM_TAGS - 1);
  if (!out) return ot_error(OT_ERR_INVALID_ARGUMENT, op, "out: is NULL");
  pthread_mutex_lock(&tracker_lock);
  *out = tag_counters[tag];
  pthread_mutex_unlock(&tracker_lock);
  return OT_OK;
}

ot_status ot_memory_total_counter(ot_memory_counter *out) {
  if (!out) return ot_error(OT_ERR_INVALID_ARGUMENT, "ot_memory_total_counter", "out: is NULL");
  pthread_mutex_lock(&tracker_lock);
  *out = total_counter;
  pthread_mutex_unlock(&tracker_lock);
  return OT_OK;
}

ot_status ot_memory_op_counter(const char *op_name, ot_memory_counter *out) {
  static const char *op = "ot_memory_op_counter";
  if (!op_name) return ot_error(OT_ERR_INVALID_ARGUMENT, op, "op: is NULL");
  if (!out) return ot_error(OT_ERR_INVALID_ARGUMENT, op, "out: is NULL");
  pthread_mutex_lock(&tracker_lock);
  memset(out, 0, sizeof *out);
  for (int i = 0; i < op_count; i++)
    if (!strncmp(op_names[i], op_name, OT_MEMORY_OP_NAME - 1)) *out = op_counters[i];
  pthread_mutex_unlock(&tracker_lock);
  return OT_OK;
}

int ot_memory_op_count(void) {
  pthread_mutex_lock(&tracker_lock);
  int n = op_count;
  pthread_mutex_unlock(&tracker_lock);
  return n;
}

const char *ot_memory_op_name(int i) {
  pthread_mutex_lock(&tracker_lock);
  const char *s = i >= 0 && i < op_count ? op_names[i] : NULL;
  pthread_mutex_unlock(&tracker_lock);
  return s;
}

void ot_memory_reset_peaks(void) {
  pthread_mutex_lock(&tracker_lock);
  for (int t = 0; t < OT_MEMORY_NUM_TAGS; t++) tag_counters[t].peak = tag_counters[t].current;
  total_counter.peak = total_counter.current;
  for (int i = 0; i < op_count; i++) op_counters[i].peak = op_counters[i].current;
  pthread_mutex_unlock(&tracker_lock);
}
