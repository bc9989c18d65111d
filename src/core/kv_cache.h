/*
 * kv_cache.h -- private side of the paged KV block pool (ot_kv_cache).
 *
 * Storage: 2 * num_layers tensors [num_pages, heads_kv, block_size, head_dim], K of layer
 * l at slab 2l and V at slab 2l + 1, each slab starting on a 256-byte boundary. Page ids
 * are int32 (the kernels' page tables are int32). Host-side state: a reference count per
 * page, a stack of free pages, and per sequence its length and block table.
 */
#ifndef OT_CORE_KV_CACHE_H
#define OT_CORE_KV_CACHE_H

#include "internal.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Check every invariant: each page's reference count equals the number of block tables
 * that hold it, the free stack holds exactly the pages with count 0 (once each),
 * free + used = total, every sequence has ceil(length / block_size) pages. Returns true
 * when consistent; else writes why into msg. */
bool ot_kv_cache_check(const ot_kv_cache *cache, char *msg, size_t msg_size);

#ifdef __cplusplus
}
#endif

#endif /* OT_CORE_KV_CACHE_H */
