#!/usr/bin/env bash
# The pending H200 work in ONE call (< 10 min on the 16-core machine): what has been written since the last GPU
# session and never run. Run from the repository root with $OUT set, carrying [".whl", ".vk"] (the build wheels
# and the vLLM bundle, ~65 MB of the 64 MiB carry: fetch_device_wheels.sh; if the carry refuses them together,
# unpack the bundle in a first call as .vk/calls.txt says, then call this on the warm machine with [".whl"]).
#
#   OUT=... dev/device/h200_pending.sh
#
# Steps, in order, each under its own cap (seconds; the call's BUDGET_S, default 575, shrinks the later ones):
#   vllm       source /tmp/vk_tools/env.sh, unpacking .vk/kit.part-* first where it is missing (peers need vLLM)
#   build      TORCH_CUDA_ARCH_LIST="8.9;9.0a" (8.9: the SM89 table, whose units setup.py also compiles for
#              sm_90a; the generic kernels are built for both), MAX_JOBS=16, BLOCKFP8_ARCH_JOBS=12; skipped when
#              the sources and arch list hash to the last build's stamp. A build without the SM89 table stops the call.
#   tests      (330 build, then 150) the GPU tests never run on hardware: tests/test_gemm_sm89.py,
#              test_fp4_native.py, test_tune.py, test_bench_sm89.py, test_host_logic.py, test_fp4.py (the every-row test), and
#              test_gemm.py -k self_check where present.
#              A GPU test skipped for want of a GPU or kernels fails the step.
#   memcheck   (100) compute-sanitizer memcheck, every SM89 row at its ragged cases (sanitize_rows.py --table sm89)
#   racecheck  (100) compute-sanitizer racecheck, every SM89 row at its first ragged case
#   mma_probe  (60)  dev/probes/mma_fp8_rate.py: the mma.sync e4m3 / bf16 peak -> mma_peak.json
#   bench      (rest) benchmarks/bench_sm89.py --quick (3 shapes) at M = 1,16,64,256,1024,4096 with the peak as the
#              floor's compute ceiling; BENCH_SM89_ARGS replaces those arguments
# Everything lands in $OUT/pending/ and is packed into $OUT/pending.tgz (also on TERM); a short table is printed
# last. Exit status 1 when any step failed, was skipped or ran degraded (no vLLM: no peers). The device's copy of
# the tree has no .git: start the command with BLOCKFP8_GIT_STATE=<sha>[+dirty] so the JSON names the tree.
set -uo pipefail
cd "$(dirname "$0")/../.."
RUN_NAME=pending
. dev/device/lib.sh  # LOGS, PY, BUDGET_S, FAILED, SUMMARY; note, step, pack, install_wheels, build_extension

nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,power.limit --format=csv,noheader | tee "$LOGS/gpu.txt"

# ---- vLLM (the peers) ----------------------------------------------------------------------------------------------
use_vllm_bundle "DEGRADED: no vLLM bundle (/tmp/vk_tools, .vk/kit.part-*): vllm_triton and marlin_fp8 are skipped"

# ---- build ---------------------------------------------------------------------------------------------------------
install_wheels
ARCHS="8.9;9.0a"
if build_extension "$ARCHS" 330 && [ -f "$LOGS/build.log" ]; then
  # ptxas: any SM89 spill is a regression (sm89/NOTES.md: 0 bytes in every row, sm_89 and sm_90a). setup.py prints
  # "ptxas <unit>.sm89: K kernel(s), most spill stores S bytes, most spill loads L bytes" per unit.
  grep -hE "ptxas [^ ]*\.sm89:" "$LOGS/build.log" | tee "$LOGS/sm89_ptxas.txt"
  if grep -vE "most spill stores 0 bytes, most spill loads 0 bytes" "$LOGS/sm89_ptxas.txt" | grep -q .; then
    note ptxas "SM89 SPILLS (sm89_ptxas.txt)"; FAILED=1
  fi
fi
if ! "$PY" -c "
import sys
from vllm_blockfp8 import ops
info = ops.build_info()
print(info)
sys.exit(0 if ops.HAS_CUDA_KERNELS and 'sm89' in info.get('families', {}).get('gemm', []) else 1)" > "$LOGS/build_info.txt" 2>&1; then
  cat "$LOGS/build_info.txt"
  note build "FAILED: no extension with the SM89 GEMM table; nothing else can run (build.log)"
  pack; printf '%s\n' "${SUMMARY[@]}"; exit 1
fi

# ---- tests never run on hardware -----------------------------------------------------------------------------------
TESTS="tests/test_gemm_sm89.py tests/test_fp4_native.py tests/test_tune.py tests/test_bench_sm89.py tests/test_host_logic.py tests/test_fp4.py::test_every_row_runs_on_a_model_shape"
step tests 150 bash -c "set -o pipefail; rc=0
  $PY -m pytest -q -rs -p no:cacheprovider --maxfail=30 $TESTS || rc=1
  if grep -q self_check tests/test_gemm.py; then $PY -m pytest -q -rs -p no:cacheprovider tests/test_gemm.py -k self_check || rc=1; fi
  exit \$rc"
if grep -E "^SKIPPED.*needs a GPU run" "$LOGS/tests.log" > /dev/null 2>&1; then
  note tests "GPU TESTS SKIPPED on the GPU machine (tests.log: SKIPPED lines)"; FAILED=1
fi

# ---- compute-sanitizer on every SM89 row ---------------------------------------------------------------------------
step memcheck 100 compute-sanitizer --tool memcheck --error-exitcode 9 "$PY" dev/device/sanitize_rows.py gemm --table sm89
step racecheck 100 compute-sanitizer --tool racecheck --error-exitcode 9 "$PY" dev/device/sanitize_rows.py gemm \
  --table sm89 --case 0

# ---- mma.sync peak, then the benchmark -----------------------------------------------------------------------------
step mma_probe 60 "$PY" dev/probes/mma_fp8_rate.py --arch 90a --json "$LOGS/mma_fp8_rate_probe.json" \
  --out "$LOGS/mma_peak.json"
PEAK=()
[ -s "$LOGS/mma_peak.json" ] && PEAK=(--mma-peak "$LOGS/mma_peak.json")
# shellcheck disable=SC2086
step bench 600 "$PY" -m benchmarks.bench_sm89 ${BENCH_SM89_ARGS:---quick --m 1,16,64,256,1024,4096} "${PEAK[@]}" \
  --json "$LOGS/bench_sm89.json" --plot "$LOGS/bench_sm89.png"

# ---- the short table -----------------------------------------------------------------------------------------------
echo
echo "== pending run: $(cat "$LOGS/gpu.txt" 2>/dev/null), $(( $(date +%s) - T_START )) s"
grep -hE "^[0-9]+ (passed|failed)|passed|failed" "$LOGS/tests.log" 2>/dev/null | tail -n 2
grep -hE "^gemm " "$LOGS/memcheck.log" "$LOGS/racecheck.log" 2>/dev/null
grep -hE "ERROR SUMMARY|RACECHECK SUMMARY" "$LOGS/memcheck.log" "$LOGS/racecheck.log" 2>/dev/null
tail -n 1 "$LOGS/mma_probe.log" 2>/dev/null
"$PY" -c "import json, sys; [print(line) for line in json.load(open(sys.argv[1]))['header']['notes'].get('sm89_summary', [])]" \
  "$LOGS/bench_sm89.json" 2>/dev/null
printf '%s\n' "${SUMMARY[@]}"
pack
[ "$FAILED" = 0 ] || { echo "pending run: FAILED or incomplete (see the rows above)"; exit 1; }
echo "pending run: every step passed"
