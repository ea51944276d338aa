# Shared plumbing of the one-call device scripts (h200_pending.sh, h200_tune.sh); sourced, never run.
#
# Before sourcing: cd to the repository root and set OUT (the device call's $OUT) and RUN_NAME (the folder under $OUT
# that collects the logs and is packed into $OUT/$RUN_NAME.tgz). Sets LOGS, PY ($PYTHON or python3), BUDGET_S (the
# call's budget in seconds, default 575), T_START, FAILED (0; 1 once anything failed) and SUMMARY (the rows of the
# short table), and traps TERM/INT to pack what finished. Functions:
#   note NAME TEXT          a summary row for something that is not a timed step
#   step NAME CAP CMD...    CMD under min(CAP, what the call has left), log in $LOGS/NAME.log; BENCH_TIME_BUDGET_S
#                           is set 30 s inside the cap (the benchmarks start no new point past it)
#   step_start NAME CAP CMD..., step_wait NAME   the same in two halves, so steps can run at the same time
#   pack                    summary.txt, then $OUT/$RUN_NAME.tgz (the logs folder removed)
#   install_wheels          the carried .whl/*.whl into /tmp/site, put on PYTHONPATH; FlashInfer likewise where
#                           a call on this machine carried .fi (flashinfer_site.sh)
#   use_vllm_bundle WHY     the offline vLLM bundle (vllm_bundle.sh: unpacked once per machine, its environment
#                           sourced) and a summary row with vLLM's version; else a summary row WHY and FAILED=1
#   build_extension ARCHS CAP   `pip install -e .` for TORCH_CUDA_ARCH_LIST=ARCHS under `step build`, skipped when the
#                           sources and the arch list hash to the last build's stamp; returns non-zero on a failure
: "${OUT:?set OUT}"
: "${RUN_NAME:?set RUN_NAME before sourcing dev/device/lib.sh}"
LOGS=$OUT/$RUN_NAME
mkdir -p "$LOGS"
export PYTHONUNBUFFERED=1
PY=${PYTHON:-python3}
BUDGET_S=${BUDGET_S:-575}
T_START=$(date +%s)
FAILED=0
SUMMARY=()
. dev/device/vllm_bundle.sh  # vllm_bundle, used by use_vllm_bundle

pack() {
  printf '%s\n' "${SUMMARY[@]}" > "$LOGS/summary.txt"
  tar czf "$OUT/$RUN_NAME.tgz" -C "$OUT" "$RUN_NAME" && rm -rf "$LOGS"
}
BG_PIDS=()  # step_start's subshells, killed (with their timeouts) on TERM
trap 'SUMMARY+=("interrupted (TERM/INT)"); [ ${#BG_PIDS[@]} -gt 0 ] && pkill -TERM -P "$(IFS=,; echo "${BG_PIDS[*]}")"
      pack; printf "%s\n" "${SUMMARY[@]}"; exit 143' TERM INT

note() {  # note NAME TEXT
  SUMMARY+=("$(printf '%-10s %s' "$1" "$2")")
}

step_start() {  # step_start NAME CAP CMD...: step's CMD in the background; step_wait NAME collects it
  local name=$1 cap=$2; shift 2
  local left
  left=$(( T_START + BUDGET_S - 20 - $(date +%s) ))
  if [ "$left" -lt 15 ]; then
    note "$name" "SKIPPED: the call's budget is spent"; FAILED=1; echo skipped > "$LOGS/$name.rc"; return 1
  fi
  [ "$left" -lt "$cap" ] && cap=$left
  echo "== $name (cap ${cap}s): $*"
  date +%s > "$LOGS/$name.t0"
  # The rc file is written when CMD ends; a TERM of the script kills the subshell's timeout with it (trap above).
  ( BENCH_TIME_BUDGET_S=$(( cap > 60 ? cap - 30 : cap )) timeout -k 10 "$cap" "$@" > "$LOGS/$name.log" 2>&1
    echo $? > "$LOGS/$name.rc" ) &
  BG_PIDS+=("$!")
}

step_wait() {  # step_wait NAME: wait for step_start NAME's command, then its summary row and log tail
  local name=$1 rc
  while [ ! -f "$LOGS/$name.rc" ]; do sleep 1; done
  rc=$(cat "$LOGS/$name.rc")
  [ "$rc" = skipped ] && return 1
  [ "$rc" -ne 0 ] && FAILED=1
  note "$name" "$(printf 'rc=%-4s %4ss%s' "$rc" "$(( $(date +%s) - $(cat "$LOGS/$name.t0") ))" \
    "$([ "$rc" = 124 ] && echo ' TIMED OUT')")"
  rm -f "$LOGS/$name.rc" "$LOGS/$name.t0"
  tail -n 12 "$LOGS/$name.log"
  return "$rc"
}

step() {  # step NAME CAP CMD...: step_start + step_wait
  step_start "$@" || return 1
  step_wait "$1"
}

use_vllm_bundle() {  # use_vllm_bundle WHY_IF_MISSING
  if vllm_bundle; then
    note vllm "$("$PY" -c 'import vllm; print("vllm", vllm.__version__)' 2>&1 | tail -n 1)"
  else
    note vllm "$1"
    FAILED=1
  fi
}

install_wheels() {
  if ls .whl/*.whl > /dev/null 2>&1; then
    "$PY" -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>&1 | grep -v "already exists" | tail -n 3
  fi
  export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
  . dev/device/flashinfer_site.sh  # FlashInfer's tests and peer where a call on this machine carried .fi
  use_flashinfer
  note flashinfer "${FLASHINFER_NOTE#flashinfer: }"
}

build_extension() {  # build_extension ARCHS CAP
  local archs=$1 cap=$2 stamp=vllm_blockfp8/.build_stamp hash
  # A carried .prebuilt of exactly these sources installs without compiling (prebuilt.sh).
  [ -f dev/device/prebuilt.sh ] && PYTHON=$PY bash dev/device/prebuilt.sh install "$archs"
  hash=$(bash dev/device/prebuilt.sh hash "$archs")
  if [ -f vllm_blockfp8/_C.abi3.so ] && [ "$(cat $stamp 2>/dev/null)" = "$hash" ] && "$PY" -c "import vllm_blockfp8" 2>/dev/null; then
    note build "unchanged sources: kept the last build ($archs)"
  elif ! "$PY" -c "import cutlass_library" 2> /dev/null; then
    note build "FAILED: nvidia-cutlass is not importable (carry .whl: dev/device/fetch_device_wheels.sh)"; FAILED=1
    return 1
  else
    step build "$cap" env TORCH_CUDA_ARCH_LIST="$archs" MAX_JOBS=16 BLOCKFP8_ARCH_JOBS=12 \
      "$PY" -m pip install --no-build-isolation --no-deps -v -e . || return 1
    echo "$hash" > $stamp || echo "could not write $stamp: the next call rebuilds"
  fi
}
