/*
 * memory_tracker.h -- private side of the process-wide memory tracker: the arena and the
 * KV pool report every allocation and release here, with a tag and the name of the op
 * that asked for it.
 */
#ifndef OT_CORE_MEMORY_TRACKER_H
#define OT_CORE_MEMORY_TRACKER_H

#include "internal.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The index of `op` in the op table (registering it on first use; NULL is "(none)",
 * names beyond the table's capacity share the entry "(other)"). */
int ot_memory_op_index(const char *op);
/* Record `bytes` allocated (sign +1) or released (-1) under tag and op index. */
void ot_memory_record(ot_memory_tag tag, int op_index, size_t bytes, int sign);

#ifdef __cplusplus
}
#endif

#endif /* OT_CORE_MEMORY_TRACKER_H */
