#!/usr/bin/env bash
# scripts/device_norm_ab.sh -- the norm / RoPE A/B round (the run for 465d8ee): now
# scripts/device_fused_round.sh with that round's defaults -- test_ops --suite norm / rope,
# bench_fused_ops.py --bench --no-compile --only norm,rope at 16k x 4096 and 8192 with the
# other builds' shims (OT_AB, default "parent=libfused_ops_shim_A.so" in build-dev),
# compute-sanitizer memcheck + racecheck over three cases, ncu over the A/B builds' kernels
# and ours. Every variable of device_fused_round.sh may be set; the defaults here:
#   OT_PREBUILT=.devcarry-normab, OT_SUITES="norm rope", OT_ONLY=norm,rope,
#   OT_HIDDEN=4096,8192, OT_NCU_AB=1, OT_NCU_TRAIN=0, OT_SAN (the three cases below).
# (The old script also ran each other build's tests/test_ops_NAME: build one prebuilt
# archive per build for that.)
export OT_PREBUILT=${OT_PREBUILT:-.devcarry-normab} OT_SUITES=${OT_SUITES-norm rope}
export OT_ONLY=${OT_ONLY-norm,rope} OT_HIDDEN=${OT_HIDDEN-4096,8192} OT_NCU_AB=${OT_NCU_AB:-1}
export OT_NCU_TRAIN=${OT_NCU_TRAIN:-0}
export OT_SAN=${OT_SAN-"test_ops:norm:layernorm bf16 plain rows=33 H=4096|test_ops:norm:bf16 dres saved-stats rows=33 H=4096|test_ops:rope:neox gqa 40/8 T=9 D=128 cache"}
exec bash "$(dirname "$0")/device_fused_round.sh" "$@"
