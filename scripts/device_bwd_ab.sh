#!/usr/bin/env bash
# scripts/device_bwd_ab.sh [COMMIT] -- on the device (`run`, carry [".devcarry-ab"]): one
# backward kernel change checked and timed against the build before it, in one call.
#   .devcarry-ab/verify.tar.xz   the new build's pack (scripts/device_verify.sh --pack; with
#                                OT_PACK_COMMIT=SHA when the build dir is another worktree's)
#   .devcarry-ab/base.so.xz      the attention shim (bench/attention_shim.c) of the build before
#   .devcarry-ab/new.so.xz       the attention shim of the new build (xz: two 19 MB shims and the
#                                31 MB pack would not fit one call's 64 MiB carry)
# Steps: a 30 s smoke of one backward case; bench/ab_attention_bwd.py --check (float64 checks
# of both shims first) in the steady state (balanced order, 100 ms of warm-up a block): base
# against new at CASES, then both under OT_ATTN_BWD_SM90_PERS=s (the persistent walk, D128 /
# D256's non-default) with the new default beside them at WALK_CASES; then the whole CUDA attention suite (-v, SUITE_LIMIT s)
# beside compute-sanitizer memcheck / racecheck / synccheck on SAN_CASES ("": none). Every log goes into one
# logs.tar.gz (a call returns at most 8 files); the summary is printed last.
# Environment: CASES, WALK_CASES (empty: skip), ROUNDS (the balanced count), SAN_CASES ("a;b"), SUITE_LIMIT
# (300), TEST=0 (no suite, no sanitizers). The suite runs line-buffered (stdbuf): a run cut by
# its limit still shows every case it finished.
set -uo pipefail
cd "$(dirname "$0")/.."
mkdir -p .devcarry-verify && cp .devcarry-ab/verify.tar.xz .devcarry-verify/verify.tar.xz || exit 1
source scripts/device_verify_env.sh
ot_verify_env bwd_ab "${1:-}"
for s in base new; do xz -dc ".devcarry-ab/$s.so.xz" >"/tmp/shim_$s.so" || exit 1; done
SUM=$OUT/summary.txt
: >"$SUM"
say() { echo "$*" | tee -a "$SUM"; }
stamp smoke
timeout 30 $T --filter "${SMOKE:-pers3 bwd256 S129}" -v >"$OUT/smoke.log" 2>&1
rc=$?; tail -1 "$OUT/smoke.log"
grep -qE "test_ops: [1-9][0-9]* passed, 0 failed" "$OUT/smoke.log" || { [ $rc -eq 0 ] && rc=1; }
[ $rc -eq 0 ] || { say "smoke rc $rc: stopping"; (cd "$OUT" && tar czf logs.tar.gz *.log); exit 1; }
ab() {  # name cases shim-spec... (ROUNDS: default the balanced count, 2 x shims + 2)
  [ -n "$2" ] || return
  local name=$1 cases=$2 sh=()
  shift 2
  for x in "$@"; do sh+=(--shim "$x"); done
  stamp "bench $name"
  timeout 240 python3 bench/ab_attention_bwd.py --check "${sh[@]}" --cases "$cases" \
    --rounds "${ROUNDS:-0}" --commit "$C" --json "$OUT/$name.json" >"$OUT/$name.log" 2>&1
  say "bench $name rc $?"
  grep -E "^check|^D[0-9]+ S|FAIL|rror" "$OUT/$name.log" | cut -c1-180 | tee -a "$SUM"
}
ab ab_default "${CASES-D64S1024,D64S4096,D128S4096,D128S16384,D256S1024,D256S4096}" base=/tmp/shim_base.so new=/tmp/shim_new.so
ab ab_walk "${WALK_CASES-D128S4096,D256S1024,D256S4096}" \
  base_s=/tmp/shim_base.so@OT_ATTN_BWD_SM90_PERS=s new_s=/tmp/shim_new.so@OT_ATTN_BWD_SM90_PERS=s \
  new=/tmp/shim_new.so
if [ "${TEST:-1}" != 0 ]; then
  stamp "attention suite + sanitizers"
  (timeout "${SUITE_LIMIT:-300}" stdbuf -oL $T -v >"$OUT/suite.log" 2>&1; echo "rc $?" >>"$OUT/suite.log") &
  [ -n "${SAN_CASES-x}" ] && ot_sanitize 240 "${SAN_CASES-pers3 bwd256 S129;pers3s bwd256 causal Sq>Sk}" | tee -a "$SUM"
  wait
  say "suite: $(grep -E 'passed,' "$OUT/suite.log" | tail -1) $(tail -1 "$OUT/suite.log"), $(grep -c '^ok' "$OUT/suite.log") cases ok"
  grep -E "^FAIL" "$OUT/suite.log" | head -5 | tee -a "$SUM"
fi
(cd "$OUT" && tar czf logs.tar.gz *.log && rm -f *.log)
stamp done
echo "==== summary"; cat "$SUM"
