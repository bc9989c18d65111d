#!/usr/bin/env bash
# Compiler launcher (CMAKE_CUDA_COMPILER_LAUNCHER) that records how long each CUDA
# compilation takes: appends "<seconds> <source>" to $OT_COMPILE_TIMES.
start=$(date +%s.%N)
"$@"
rc=$?
end=$(date +%s.%N)
src=""
for a in "$@"; do case "$a" in *.cu) src="$a" ;; esac; done
if [ -n "${OT_COMPILE_TIMES:-}" ]; then
  printf '%.2f %s\n' "$(awk -v a="$start" -v b="$end" 'BEGIN{print b-a}')" "${src:-?}" >>"$OT_COMPILE_TIMES"
fi
exit $rc
