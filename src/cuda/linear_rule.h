/*
 * linear_rule.h -- the CUDA linear's automatic choice of its small-M kernel (linear.cu,
 * gemv_wanted, which says where the rule was measured), written once for the library and
 * for bench/engine_linear_bench.c, whose "auto" column reports this rule rather than a
 * copy of it. C and CUDA.
 */
#ifndef OT_CUDA_LINEAR_RULE_H
#define OT_CUDA_LINEAR_RULE_H

#include <stdbool.h>
#include <stdint.h>

/* Whether ot_linear_forward takes the small-M kernel when OT_LINEAR_GEMV is unset: a 16-bit
 * dtype (half), one row, the 16-byte vector path (vec), and a weight of N x K either small
 * (N K < 1.5 2^24) or of lm_head size (N K >= 2^28). */
static inline bool ot_linear_small_m_auto(int64_t rows, int64_t in_features,
                                          int64_t out_features, bool half, bool vec) {
  const int64_t nk = in_features * out_features;
  return half && rows == 1 && vec && (nk < ((int64_t)3 << 23) || nk >= ((int64_t)1 << 28));
}

#endif /* OT_CUDA_LINEAR_RULE_H */
