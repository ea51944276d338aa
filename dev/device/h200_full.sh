#!/usr/bin/env bash
# The whole GPU test suite on the H200: what a session that changed C++ or CUDA runs before it stops. Run from the
# repository root with $OUT set, carrying [".whl", ".vk"] (fetch_device_wheels.sh; the offline vLLM bundle).
#
#   OUT=... dev/device/h200_full.sh [PART ...]   PART: all (default: kernels vllm sanitize), kernels, vllm, sanitize,
#                                                  switches (not in all; SWITCHES=case,... picks dev/device/switches.py's
#                                                  cases, SWITCH_JOBS (2) runs that many at once)
#
#   vllm       source /tmp/vk_tools/env.sh, unpacking .vk/kit.part-* first where it is missing (the vLLM tests, peers)
#   build      TORCH_CUDA_ARCH_LIST="8.9;9.0a" (the SM89 table runs on sm_90a too), all cores; skipped when the
#              sources hash to the last build's stamp (a warm machine keeps it between calls)
#   kernels    every test file but the vLLM ones, through dev/device/suite.py in SUITE_JOBS (4) pytest processes at
#              once: a test that kills the interpreter is recorded CRASHED by name and pytest starts again on the rest
#   vllm       the vLLM test files (engine start-ups, one at a time: each asks vLLM for 30% of the GPU's memory)
#   sanitize   compute-sanitizer memcheck over every row of every family (sanitize_rows.py), then the SM89 table
#   switches   every documented BLOCKFP8_* switch under vllm.LLM / vllm serve (switches.py); its engines size their KV
#              cache explicitly, so they start beside the other parts (vLLM's memory profiling would not)
#
# The three parts run at the same time after the build: measured together on the H200 (build 111 s, kernels 168 s
# with 4 jobs, vllm 270 s for 3 engine start-ups, memcheck ~200 s; 474 s with switches beside them). The vLLM tests
# start 5 engines, each format's reference engine beside its own (an H100, build 151 s: the two logprob tests took
# under 309 s together), so `all` fits one 10-minute call on a cold machine (the start is not counted in the call's
# 600 s) given BUDGET_S >= 420; run `switches` in a call of its own. Each part prints its test count, failures,
# crashes and skip reasons last; a skip a GPU run must not have (no extension, no vLLM, a kernel missing) fails it
# (suite.py).
# Logs land in $OUT/full/ and are packed into $OUT/full.tgz.
set -uo pipefail
cd "$(dirname "$0")/../.."
RUN_NAME=full
. dev/device/lib.sh  # LOGS, PY, BUDGET_S, FAILED, SUMMARY; note, step, pack, install_wheels, build_extension

PARTS=("$@")
[ ${#PARTS[@]} -eq 0 ] && PARTS=(all)
has() {
  local p
  for p in "${PARTS[@]}"; do [ "$p" = "$1" ] || { [ "$p" = all ] && [ "$1" != switches ]; } && return 0; done
  return 1
}
VLLM_TESTS="tests/test_vllm_gpu.py"

nvidia-smi --query-gpu=name,driver_version,clocks.sm,power.limit --format=csv,noheader | tee "$LOGS/gpu.txt"
use_vllm_bundle "MISSING: no vLLM bundle (.vk): the vLLM tests skip, which fails them"
install_wheels
if ! build_extension "${ARCHS:-8.9;9.0a}" 400 || ! "$PY" -c "import vllm_blockfp8.ops as o; assert o.HAS_CUDA_KERNELS"; then
  note build "FAILED: no extension; nothing else can run (build.log)"
  pack; printf '%s\n' "${SUMMARY[@]}"; exit 1
fi
grep -hE "vllm_blockfp8: ptxas" "$LOGS/build.log" 2>/dev/null | grep -vE "spill stores 0 bytes, most spill loads 0" \
  | sed 's/^/SPILL: /'

# The parts run at the same time (the GPU tests are small kernels, the vLLM tests mostly engine start-up on the
# CPU, memcheck one slow process): the call then takes about its longest part, not their sum.
if has kernels; then
  # KERNEL_TESTS: these files in this order instead (the rest of the suite then waits for another call).
  # shellcheck disable=SC2046
  step_start kernels 560 "$PY" dev/device/suite.py --jobs "${SUITE_JOBS:-4}" --json "$LOGS/kernels.json" \
    ${KERNEL_TESTS:-$(ls tests/test_*.py | grep -vxF -f <(tr ' ' '\n' <<< "$VLLM_TESTS"))}
fi
if has vllm; then
  # shellcheck disable=SC2086
  step_start vllm_tests 480 "$PY" dev/device/suite.py --json "$LOGS/vllm.json" $VLLM_TESTS
fi
if has sanitize; then
  # Every row of every family, then the SM89 table's GEMM rows (forced on this GPU); both run even if one fails.
  step_start memcheck 480 bash -c 'compute-sanitizer --tool memcheck --error-exitcode 9 "$0" dev/device/sanitize_rows.py
    a=$?; compute-sanitizer --tool memcheck --error-exitcode 9 "$0" dev/device/sanitize_rows.py gemm --table sm89
    b=$?; exit $(( a | b ))' "$PY"
fi
if has switches; then
  step_start switches 540 "$PY" dev/device/switches.py --jobs "${SWITCH_JOBS:-2}" --json "$LOGS/switches.json" \
    ${SWITCHES:+--cases "$SWITCHES"}
fi
for part in kernels vllm_tests memcheck switches; do
  [ -f "$LOGS/$part.t0" ] && step_wait "$part"
done

echo
echo "== full suite ($(cat "$LOGS/gpu.txt"), parts: ${PARTS[*]}, $(( $(date +%s) - T_START )) s)"
for f in kernels vllm_tests; do
  [ -f "$LOGS/$f.log" ] && grep -E "^(CRASHED|FAILED) |UNEXPECTED|^suite: [0-9]" "$LOGS/$f.log" | head -n 40
done
grep -hE ": (FAILED|NOT RUN)|ERROR SUMMARY" "$LOGS"/memcheck.log 2>/dev/null
[ -f "$LOGS/switches.log" ] && sed -n '/^case /,$p' "$LOGS/switches.log"
printf '%s\n' "${SUMMARY[@]}"
pack
[ "$FAILED" = 0 ] || { echo "full suite: FAILED or incomplete (see above)"; exit 1; }
echo "full suite: every part passed"
