# scripts/device_verify_env.sh -- sourced by the device scripts that run on the packed build
# (scripts/device_verify.sh --pack: .devcarry-verify/verify.tar.xz, with the attention shim in
# .devcarry-shim): `ot_verify_env NAME COMMIT` sets C, OUT (default /tmp/ot_NAME_out), stamp
# (seconds since the start), M (the unpacked build in /tmp/ot_NAME), LD_LIBRARY_PATH, SHIM and
# T (the CUDA attention suite of test_ops), and prints which library runs under which tree.
# `ot_sanitize LIMIT "case;case"` then runs compute-sanitizer memcheck, racecheck and synccheck
# on each case (a --filter of $T), all at once, and prints one verdict line each (logs
# $OUT/san_K.log).
ot_verify_env() {
  C=${2:-?}
  OUT=${OUT:-/tmp/ot_$1_out}
  mkdir -p "$OUT"
  T0=$(date +%s)
  stamp() { echo "[$(( $(date +%s) - T0 ))s] $*"; }
  M=/tmp/ot_$1
  rm -rf "$M" && mkdir -p "$M" && tar xf .devcarry-verify/verify.tar.xz -C "$M" ||
    { echo "no .devcarry-verify/verify.tar.xz"; exit 1; }
  export LD_LIBRARY_PATH="$M/lib:${LD_LIBRARY_PATH:-}"
  SHIM=${SHIM:-.devcarry-shim/libattention_shim.so}
  echo "library $(cat "$M/commit.txt"), tree $C"
  T="$M/test_ops --backend cuda --suite attention"
}

ot_sanitize() {  # LIMIT "case;case..." -- after ot_verify_env
  local lim=$1 i=0 c t k cases
  IFS=';' read -ra cases <<<"$2"
  for c in "${cases[@]}"; do
    for t in memcheck racecheck synccheck; do
      i=$((i + 1))
      (timeout "$lim" compute-sanitizer --tool $t --error-exitcode 9 $T --filter "$c" \
         >"$OUT/san_$i.log" 2>&1; echo "rc $? ($t | $c)" >>"$OUT/san_$i.log") &
    done
  done
  wait
  for k in $(seq 1 $i); do
    grep -E "ERROR SUMMARY|RACECHECK SUMMARY|^rc" "$OUT/san_$k.log" | tail -2 | tr '\n' ' '; echo
  done
}
