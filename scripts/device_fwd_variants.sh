#!/usr/bin/env bash
# scripts/device_fwd_variants.sh [COMMIT] -- on the lent H200 (`run` executes it in the
# repository root), from binaries prebuilt on the build machine (no compiling here):
#   0. PROFILE=1: ncu on our kernel and on cuDNN's (torch SDPA) in one process
#      (bench/profile_attention_fwd.py; PROF_ARGS, default "--d 128 --s 4096"): launch
#      config, SpeedOfLight, WarpStateStats, SchedulerStats, ComputeWorkloadAnalysis, the
#      tensor-pipe / XU metrics and every stall reason (-> $OUT/ncu.txt, ncu_raw.csv);
#   1. bench/attn_fwd_variants.py: float64 checks of the Hopper forward's variants, host cost
#      per call, then every variant against the default and torch SDPA cuDNN / flash in
#      interleaved rounds (-> $OUT/variants.json, variants.log);
#   2. the C attention suite (cuda cases) with the defaults, then its "hopper" cases under
#      each variant's switches;
#   3. compute-sanitizer racecheck and synccheck on one Hopper forward case with the rescale
#      threshold and the wide tile forced.
# CARRY (default .devcarry-fwd90, git-ignored) holds libattention_shim.so (bench/attention_shim.c
# linked against an sm_90a libops_transformer.a built with -DOT_ATTN_SM90_EXPERIMENTS for
# src/cuda/sm90/attention_fwd_sm90.cu), test_ops.xz and deps.tar.gz (OpenBLAS runtime): made by
# `bash scripts/prebuild_fwd_sm90_exp.sh B` (since 2026-12-02; by hand before, as follows). Made
# on the build machine: build B (-DOT_CUDA_ARCHS=90a) up to date, compile that file with B's
# nvcc command (`ninja -C B -t commands ops_transformer_static`) plus -DOT_ATTN_SM90_EXPERIMENTS,
# `ar r B/libops_transformer.a <that .o>` (same member name attention_fwd_sm90.cu.o), relink
# B/tests/test_ops with its ninja command, then `cc -O2 -shared -fPIC bench/attention_shim.c
# -Iinclude -Isrc -I<dlpack> -I$CUDA/include B/libops_transformer.a -L$CUDA/lib64 -lcudart
# -lcublasLt -lopenblas -fopenmp -lm -lstdc++` and `xz` of test_ops.
# DEADLINE (seconds from the start, default 125): each step's limit is cut to what is left;
# VLIM / SLIM: the variants' and the C suite's own limits (default 70 / 35); SUITE_FILTER: the
# C suite's filter (default cuda; set and empty: the whole suite).
# VSEQS / VDIMS / VROUNDS: the benchmark grid (default 4096,16384 / 128,64,256 / 3); VARGS: more
# arguments of attn_fwd_variants.py (e.g. "--only narrow --no-host --causal full"). Since c463491
# the experiment build carries narrow (D128 48 keys, D256 16 / 64), split and resc, no poly. SUITE=0: no full C suite;
# SUITE_ENV: switches for it (e.g. "OT_ATTN_SM90_SPLIT=1").
# VENVS: ';'-separated switch sets for the suite's "hopper" cases (none: skip; HLIM: each set's
# limit, default 40 s -- until 2026-11-30 evening 15 s, which the 44 hopper cases outgrew); SAN_ENV,
# SAN_FILTERS (';'-separated): the sanitizers' switches and C-suite filters; SAN_TOOLS (default
# "racecheck synccheck"; empty: none). NCU_QUICK: see below. HOST_OLD: another build's shim (e.g. the previous
# commit's): the host cost per call measured with it and with CARRY's, in two processes.
# AB=skip (prepared 2026-11-30; run within AB=skipdiag below: slower, not kept): the A/B of
# kFlSkip (OT_ATTN_SM90_SKIP=1, a consumer warpgroup skips key tiles in which all of its rows
# are masked or past Sq) --
# unless set otherwise: S 1k, D 64 / 128 / 256, causal and full, 8 balanced rounds of
# default / skip (/ wg3 / wg3skip at D64 causal) / cuDNN / flash, the skip's float64 and
# bit-equality checks first (--checks skip); the C suite's "hopper" cases under the switch
# (2 and 3 consumers at D64); racecheck / synccheck on the shapes where whole warpgroups skip.
# AB=skipdiag (2026-11-30 evening): that A/B and kFlDiag's (OT_ATTN_SM90_DIAG=1: the narrow
# step per consumer warpgroup, 64 keys, D64 / D128 on the 2-consumer 128-key tile) in one
# call: S 1k and 4k, causal and full, 10 balanced rounds, both variants' checks first; the
# "hopper" cases under each switch; memcheck, racecheck and synccheck on one case of each.
# SAN_FILTERS entries may carry their own switches as "ENV@FILTER" (ENV space-separated).
# (AB=late, kFlLate's A/B, ran on 2026-12-02: slower everywhere, the variant removed;
# bench/results/attention_fwd_late.json has its command and figures.)
# AB=pin (prepared 2026-11-30 night, not measured): kFlPin (OT_ATTN_SM90_PIN=1: the pipelined
# step's softmax before its P V's wait) on the issue's open target -- unless set otherwise:
# D128, S 4k and 16k, causal (128-key tile, rescale threshold) and full (176-key tile, 48-key
# narrow step), 10 balanced rounds of default / pin / cuDNN / flash, pin's float64 and
# bit-equality checks first (--checks pin: D64 2 / 3 consumers, D128 both tiles, D256); the C
# suite's "hopper" cases under the switch; memcheck and racecheck under it of "GRID 3 causal
# S600 D128" (128-key tile) and "Sq300 Sk2159 D128 B2" (176-key tile, its narrow step).
if [ "${AB:-}" = pin ]; then
  : "${VSEQS:=4096,16384}" "${VDIMS:=128}" "${VROUNDS:=10}" "${SUITE:=0}" "${VLIM:=170}"
  : "${DEADLINE:=300}" "${SAN_TOOLS=memcheck racecheck}"
  : "${VARGS:=--only pin --checks pin --causal both --no-host}"
  : "${VENVS:=OT_ATTN_SM90_PIN=1}"
  : "${SAN_FILTERS:=OT_ATTN_SM90_PIN=1@GRID 3 causal S600 D128;OT_ATTN_SM90_PIN=1@Sq300 Sk2159 D128 B2}"
fi
# AB=st16 (kFlSt16, OT_ATTN_SM90_ST16: O stored 16 bytes a lane after a transpose within each
# row quad; measured 2026-12-01 at S 1k / 4k and made the default for bf16 D128 128-key, D256
# masked and D64 kFlDiag tiles; experiment builds since also compile it on D64's other tiles and
# D128's 176-key tile without the narrow step) -- unless set otherwise: D64 / D128 / D256, S 1k
# and 4k, causal and full, 8 balanced rounds of default / st16 / nost16 (=0, where it is the
# default) / cuDNN / flash, the float64 and bit-equality checks first (--checks st16: =0 against
# =1); the C suite's "hopper" cases under ST16=1 (60 s: they took 42 s on 2026-12-01); memcheck
# and racecheck under it of "Sq300 Sk2159 D128 B2" (the 176-key tile) and "hopper-only S129 D64
# MQA8 B2". For S 16k: VSEQS=4096,16384.
if [ "${AB:-}" = st16 ]; then
  : "${VSEQS:=1024,4096}" "${VDIMS:=64,128,256}" "${VROUNDS:=8}" "${SUITE:=0}" "${VLIM:=200}"
  : "${DEADLINE:=330}" "${SAN_TOOLS=memcheck racecheck}" "${HLIM:=60}"
  : "${VARGS:=--only st16,nost16 --checks st16 --causal both --no-host}"
  : "${VENVS:=OT_ATTN_SM90_ST16=1}"
  : "${SAN_FILTERS:=OT_ATTN_SM90_ST16=1@Sq300 Sk2159 D128 B2;OT_ATTN_SM90_ST16=1@hopper-only S129 D64 MQA8 B2}"
fi
# (AB=wg1, the A/B of NC = 1 -- OT_ATTN_SM90_WG=1, 64-row CTAs two per SM -- ran on 2026-12-01:
# not kept, the variant removed; bench/results/attention_fwd_wg1.json has its command and figures.)
if [ "${AB:-}" = skipdiag ]; then
  : "${VSEQS:=1024,4096}" "${VDIMS:=64,128,256}" "${VROUNDS:=10}" "${SUITE:=0}" "${VLIM:=95}"
  : "${DEADLINE:=170}" "${SAN_TOOLS=memcheck racecheck synccheck}"
  : "${VARGS:=--only skip,wg3,wg3skip,diag --checks skip,diag --causal both --no-host}"
  : "${VENVS:=OT_ATTN_SM90_SKIP=1;OT_ATTN_SM90_DIAG=1}"
  : "${SAN_FILTERS:=OT_ATTN_SM90_SKIP=1@skip causal Sq>Sk 1300x1100 D64;OT_ATTN_SM90_DIAG=1@diag GRID 3 causal S600 D128}"
fi
if [ "${AB:-}" = skip ]; then
  : "${VSEQS:=1024}" "${VDIMS:=64,128,256}" "${VROUNDS:=8}" "${SUITE:=0}" "${VLIM:=150}"
  : "${DEADLINE:=240}"
  : "${VARGS:=--only skip,wg3,wg3skip --checks skip --causal both --no-host}"
  : "${VENVS:=OT_ATTN_SM90_SKIP=1;OT_ATTN_SM90_SKIP=1 OT_ATTN_SM90_WG=3}"
  : "${SAN_ENV:=OT_ATTN_SM90_SKIP=1 OT_ATTN_SM90_WG=3}"
  : "${SAN_FILTERS:=skip causal Sq>Sk 1300x1100 D64;skip S1000 D64 GQA2 B2}"
fi
# AB=shift (prepared 2026-12-02, eighteenth session; run twice on 2026-12-02, nineteenth, and
# made the default: attention_fwd_shift.json, attention_fwd_shift2.json): kFlShift
# (OT_ATTN_SM90_ALIGN=end: D64 causal 192-row tiles aligned to the rows' end, the partial tile
# first) -- unless set otherwise (as since the default changed): D64 S 1k / 1280 / 2k / 4k,
# causal (S 1k: wg3shift, 3 consumers where 2 are the default; from 1280: noshift, the
# start-aligned tiles, and shiftnoskip against noskip), 8 balanced rounds (no flash), the
# shift's checks first; the "hopper" C cases with the shift off (ALIGN=start) and forced on 3
# consumers (150 s each: 143 cases took over 40 s); memcheck / racecheck / synccheck on the
# shift cases. (The runs of 2026-12-02 had shift / wg3shift before the default changed, and
# the full direction.)
# kFlWgSplit (OT_ATTN_SM90_WSPLIT=1, an unmasked D64 call's partial last tile split along its
# keys over the 3 consumers) ran in this A/B on 2026-12-02 and lost (D64 full S 1k 0.982x, 4k
# 0.991x: bench/results/attention_fwd_shift.json): variant, switch, checks and cases removed.
# (AB=tree, kFlTree's A/B, ran on 2026-12-02: 1.000x at D64 S1k causal, within +-3% elsewhere;
# the variant removed; bench/results/attention_fwd_tree.json has its command and figures.)
# AB=stag (prepared 2026-12-02, twentieth session; run 2026-12-02, twenty-first session:
# attention_fwd_stag.json, kept on D64's kFlDiag tile only): kFlStag (OT_ATTN_SM90_STAG=1:
# the consumers' exponentials in a turn of their own) on each default's bits -- D64 S 1k
# causal (2 consumers, kFlDiag), 1280 / 2k / 4k causal on 3 consumers without the skip
# ("stagnoskip" against "noskip"), full on 3; D128 both tiles -- 8 balanced rounds, its float64
# and bit-equality checks first; the C suite's "hopper" cases under it; racecheck and
# synccheck under it on the diagonal-step case and a D64 unmasked one (3 consumers). The protocol model
# (scripts/model_fwd_sm90_skip.py) covers its turns, with kFlDiag's narrow step since the
# twenty-first session.
if [ "${AB:-}" = stag ]; then
  : "${VSEQS:=1024,1280,2048,4096}" "${VDIMS:=64,128}" "${VROUNDS:=8}" "${SUITE:=0}" "${VLIM:=260}"
  : "${DEADLINE:=450}" "${SAN_TOOLS=racecheck synccheck}" "${HLIM:=120}"
  : "${VARGS:=--only stag,stagnoskip,noskip --checks stag --no-host --no-flash}"
  : "${VENVS:=OT_ATTN_SM90_STAG=1}"
  : "${SAN_ENV:=OT_ATTN_SM90_STAG=1}"
  : "${SAN_FILTERS:=causal S1000 D64 GQA4 B2 (kFlDiag;hopper-only S129 D64 MQA8 B2}"
fi
# AB=stagskip (prepared 2026-12-02, twenty-first session): kFlStag with kFlSkip (and kFlShift)
# on D64 causal's 3 consumers (S > 1024; each skipped tile takes an empty turn) against that
# default, 8 balanced rounds; its checks (stag and nostag: without and with the skip); the "hopper" C
# cases under it; racecheck and synccheck on two 3-consumer skip cases. (Since it became the
# default with kFlShift, `--only nostag --checks nostag` is the A/B of that default.)
if [ "${AB:-}" = stagskip ]; then
  : "${VSEQS:=1280,1536,2048,4096}" "${VDIMS:=64}" "${VROUNDS:=8}" "${SUITE:=0}" "${VLIM:=220}"
  : "${DEADLINE:=420}" "${SAN_TOOLS=racecheck synccheck}" "${HLIM:=120}"
  : "${VARGS:=--only stag --checks stag,nostag --causal causal --no-host --no-flash}"
  : "${VENVS:=OT_ATTN_SM90_STAG=1}"
  : "${SAN_ENV:=OT_ATTN_SM90_STAG=1}"
  : "${SAN_FILTERS:=causal Sq1300 Sk1100 D64 GQA2;dyn GRID 3 causal S4500 D64 GQA2 (3 consumers)}"
fi
if [ "${AB:-}" = shift ]; then
  : "${VSEQS:=1024,1280,2048,4096}" "${VDIMS:=64}" "${VROUNDS:=8}" "${SUITE:=0}" "${VLIM:=200}"
  : "${DEADLINE:=400}" "${SAN_TOOLS=memcheck racecheck synccheck}" "${HLIM:=150}"
  : "${VARGS:=--only wg3shift,wg3skip,noshift,shiftnoskip,noskip --checks shift --causal causal --no-host --no-flash}"
  : "${VENVS:=OT_ATTN_SM90_ALIGN=start;OT_ATTN_SM90_ALIGN=end OT_ATTN_SM90_WG=3}"
  : "${SAN_ENV:=OT_ATTN_SM90_ALIGN=end}"
  : "${SAN_FILTERS:=shift WG 3 GRID 3 causal Sq1300;shift WG 3 causal S1000 D64 GQA2 B2}"
fi
set -uo pipefail
COMMIT=${1:-unknown}
OUT=${OUT:-/tmp/ot_device_out}
mkdir -p "$OUT"
cd "$(dirname "$0")/.."
CARRY=${CARRY:-.devcarry-fwd90}
DEADLINE=${DEADLINE:-125}
T0=$(date +%s)
stamp() { echo "[$(( $(date +%s) - T0 ))s] $*"; }
lim() {   # lim N: N cut to what DEADLINE leaves (0: skip the step -- `timeout 0` is no limit)
  local left=$(( DEADLINE - ($(date +%s) - T0) ))
  if [ "$left" -lt 5 ]; then echo 0; elif [ "$left" -lt "$1" ]; then echo "$left"; else echo "$1"; fi
}
export PYTHONUNBUFFERED=1
mkdir -p /tmp/ot_deps && tar xzf "$CARRY/deps.tar.gz" -C /tmp/ot_deps
export LD_LIBRARY_PATH="/tmp/ot_deps:${LD_LIBRARY_PATH:-}"
xz -dc "$CARRY/test_ops.xz" >/tmp/test_ops && chmod +x /tmp/test_ops
nvidia-smi --query-gpu=name,clocks.sm,temperature.gpu,power.draw --format=csv,noheader

t=$(lim "${PLIM:-60}")   # PLIM: the ncu step's limit (more --env sets take longer)
if [ "${PROFILE:-0}" != 0 ] && [ "$t" = 0 ]; then
  echo "skipped: ncu (PROFILE)"
elif [ "${PROFILE:-0}" = src ]; then
  # PROFILE=src (2026-12-02): the warp-state samples of every SASS instruction of our kernel
  # and cuDNN's (SourceCounters; ncu's source page as CSV -> $OUT/sass_ours.csv, sass_cudnn.csv)
  # and the stall reasons summed per instruction class (bench/sass_stalls.py -> the table)
  stamp "ncu source counters (limit $t s)"
  rm -f /tmp/prof_src.ncu-rep
  timeout "$t" ncu --profile-from-start off --clock-control none --section SourceCounters \
    --section WarpStateStats -f -o /tmp/prof_src python3 bench/profile_attention_fwd.py \
    "$CARRY/libattention_shim.so" ${PROF_ARGS:---d 128 --s 4096} >"$OUT/ncu_src.txt" 2>&1
  echo "ncu rc=$?"
  ncu --import /tmp/prof_src.ncu-rep -k regex:attn_fwd_sm90 --page source --csv \
    --print-source sass >"$OUT/sass_ours.csv" 2>&1
  ncu --import /tmp/prof_src.ncu-rep -k regex:cudnn --page source --csv \
    --print-source sass >"$OUT/sass_cudnn.csv" 2>&1
  python3 bench/sass_stalls.py "$OUT/sass_ours.csv" "$OUT/sass_cudnn.csv" | tee "$OUT/sass_stalls.txt"
elif [ "${PROFILE:-0}" != 0 ]; then
  stamp "ncu (limit $t s)"
  mets=sm__pipe_tensor_op_gmma_cycles_active.avg.pct_of_peak_sustained_active,sm__inst_executed_pipe_xu.avg.pct_of_peak_sustained_active,smsp__inst_executed.sum,smsp__issue_active.avg.pct_of_peak_sustained_active,sm__cycles_elapsed.avg,gpu__time_duration.sum,launch__grid_size,launch__block_size,launch__registers_per_thread,launch__shared_mem_per_block_dynamic,launch__occupancy_limit_registers
  rm -f /tmp/prof.ncu-rep   # a warm machine keeps /tmp: never import an earlier call's report
  timeout "$t" ncu --profile-from-start off --clock-control none --section LaunchStats \
    --section Occupancy --section SpeedOfLight --section WarpStateStats --section SchedulerStats \
    --section ComputeWorkloadAnalysis \
    --metrics "$mets,regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio" \
    -f -o /tmp/prof python3 bench/profile_attention_fwd.py "$CARRY/libattention_shim.so" \
    ${PROF_ARGS:---d 128 --s 4096} >"$OUT/ncu.txt" 2>&1
  echo "ncu rc=$?"
  ncu --import /tmp/prof.ncu-rep --page details --print-units base >>"$OUT/ncu.txt" 2>&1
  ncu --import /tmp/prof.ncu-rep --page raw --csv >"$OUT/ncu_raw.csv" 2>&1
  grep -E '^  [a-zA-Z_].*\(|Duration|Registers Per|Grid Size|Block Size|Dynamic Shared|Compute \(SM\) Thr|Issue Slots Busy|Warp Cycles Per Issued|gmma|pipe_xu' "$OUT/ncu.txt" | cut -c1-150 | head -60
fi

t=$(lim "${VLIM:-70}")
if [ "$t" = 0 ]; then
  echo "skipped: variants"; : >"$OUT/variants.log"
else
  stamp "variants (limit $t s)"
  timeout "$t" python3 bench/attn_fwd_variants.py "$CARRY/libattention_shim.so" --json "$OUT/variants.json" \
    --commit "$COMMIT" --seqs "${VSEQS:-4096,16384}" --dims "${VDIMS:-128,64,256}" \
    --rounds "${VROUNDS:-3}" ${VARGS:-} >"$OUT/variants.log" 2>&1
  echo "variants rc=$?"
  grep -E '^FAIL|^check:|^host|^HUNG|Error' "$OUT/variants.log" | head -20
fi

t=$(lim 20)
if [ -n "${HOST_OLD:-}" ] && [ "$t" != 0 ]; then
  # (CARRY's shim: variants.log's "host cost" line, unless --no-host)
  echo "host cost, $HOST_OLD: $(timeout "$t" python3 bench/attn_fwd_variants.py "$HOST_OLD" \
    --host-only 2>&1 | tail -1)" | tee "$OUT/host_cost.log"
fi

t=$(lim "${SLIM:-35}")
if [ "$t" != 0 ] && [ "${SUITE:-1}" != 0 ]; then
  sf=${SUITE_FILTER-cuda}   # SUITE_FILTER= (set, empty): the whole suite
  stamp "C suite (${SUITE_ENV:-defaults}, filter ${sf:-none})"
  env ${SUITE_ENV:-} timeout "$t" /tmp/test_ops --backend cuda --suite attention \
    ${sf:+--filter "$sf"} >"$OUT/tests.log" 2>&1
  echo "tests rc=$? $(tail -1 "$OUT/tests.log")"; grep -A3 '^FAIL' "$OUT/tests.log" | head -12
fi
IFS=';' read -r -a venvs <<<"${VENVS:-OT_ATTN_SM90_TILE=wide OT_ATTN_SM90_RESC=1;OT_ATTN_SM90_NARROW=1}"
[ "${VENVS:-}" = none ] && venvs=()
for envs in "${venvs[@]}"; do
  t=$(lim "${HLIM:-40}"); [ "$t" = 0 ] && { echo "skipped: hopper cases [$envs]"; continue; }
  env $envs timeout "$t" stdbuf -oL /tmp/test_ops --backend cuda --suite attention --filter hopper \
    >>"$OUT/tests_variants.log" 2>&1
  echo "hopper cases [$envs]: rc=$? $(tail -1 "$OUT/tests_variants.log")"
done
IFS=';' read -r -a sfilters <<<"${SAN_FILTERS:-hopper-only S1000 D128 window}"
for tool in ${SAN_TOOLS-racecheck synccheck}; do
  for filt in "${sfilters[@]}"; do
    t=$(lim 25); [ "$t" = 0 ] && { echo "skipped: $tool $filt"; continue; }
    stamp "$tool [$filt]"
    senv=${SAN_ENV:-OT_ATTN_SM90_TILE=wide OT_ATTN_SM90_RESC=1}
    case "$filt" in *@*) senv=${filt%%@*}; filt=${filt#*@} ;; esac
    env $senv timeout "$t" \
      compute-sanitizer --tool $tool --print-limit 10 /tmp/test_ops --backend cuda --suite attention \
      --filter "$filt" >>"$OUT/$tool.log" 2>&1
    echo "$tool rc=$? $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$OUT/$tool.log" | tail -1)"
    grep -E 'test_ops:|FAIL' "$OUT/$tool.log" | tail -1
  done
done
# NCU_QUICK: '|'-separated argument lists of bench/profile_attention_fwd.py (e.g. "--d 256
# --s 4096 --causal --env OT_ATTN_SM90_RESC=0"): elapsed / SM-active cycles and duration
# of each launch (ours, cuDNN, ours under each --env set), no sections (a few passes each);
# since 2026-11-30 night also the tensor pipe's busy share and the warp instructions
# (NCU_QUICK_METRICS replaces those two).
if [ -n "${NCU_QUICK:-}" ]; then
  IFS='|' read -r -a nqs <<<"$NCU_QUICK"
  for nq in "${nqs[@]}"; do
    t=$(lim 25); [ "$t" = 0 ] && { echo "skipped: ncu $nq"; continue; }
    stamp "ncu quick [$nq]"
    echo "== $nq" >>"$OUT/ncu_quick.txt"
    timeout "$t" ncu --profile-from-start off --clock-control none --metrics \
      sm__cycles_elapsed.avg,sm__cycles_active.avg,gpu__time_duration.sum,${NCU_QUICK_METRICS:-sm__pipe_tensor_op_gmma_cycles_active.avg.pct_of_peak_sustained_active,smsp__inst_executed.sum} python3 \
      bench/profile_attention_fwd.py "$CARRY/libattention_shim.so" $nq >>"$OUT/ncu_quick.txt" 2>&1
    echo "ncu rc=$?"
  done
  grep -E '^==|^  [a-zA-Z_].*\(|sm__cycles|gpu__time|gmma|inst_executed' "$OUT/ncu_quick.txt" 2>/dev/null | cut -c1-120
fi
stamp "summary"
grep -E '^D[0-9]' "$OUT/variants.log" | cut -c1-250
