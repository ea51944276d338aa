#!/usr/bin/env bash
# `blockfp8 tune` on a Qwen3-8B-shaped checkpoint and its same-run A/B against the planner, in ONE device call
# (< 10 min; issue #43 item 5). Run from the repository root with $OUT set, carrying [".whl"] (nvidia-cutlass for the
# build: fetch_device_wheels.sh); no vLLM needed.
#
#   OUT=... BLOCKFP8_GIT_STATE=<sha>[+dirty] dev/device/h200_tune.sh [STAGE ...]     (default: ckpt tune ab)
#
# Steps (caps in seconds; the call's BUDGET_S, default 575, shrinks the later ones):
#   build  (330) TORCH_CUDA_ARCH_LIST=$TUNE_ARCHS (default "9.0a": the H200's kernels only), dev/device/lib.sh's
#                build_extension; skipped when the sources and arch list hash to the last build's stamp
#   ckpt   (120) benchmarks/serving/make_qwen3_8b.py --layers 1 --shape '{"vocab": 8192}' into $TUNE_WORK: tune works
#                per distinct (N, K) of the fused layers, and every decoder layer has the same four (checked here
#                against vllm_blockfp8.shapes.QWEN3_8B); the small vocabulary only shrinks the bf16 embeddings.
#                Kept when it is already there (a warm machine)
#   wheel  (150) a wheel of that build (BLOCKFP8_PREBUILT_EXT, nothing recompiled) installed into its own folder
#                ($TUNE_WORK/wheel_site); TUNE_FROM_WHEEL=0 skips it
#   tune   (400) python -m vllm_blockfp8 tune on it, from /tmp with only the wheel's folder on PYTHONPATH -> $TUNE_WORK/blockfp8_tuned.json; its wall time is printed
#                against the 300 s target
#   ab     (rest) benchmarks/bench_tune_ab.py on that file (or $TUNED_FILE, e.g. one carried from an earlier call):
#                the file's points first, then the benchmark set and the first held-out set at the tuned buckets,
#                until AB_MARGIN_S (45) before the call's end (skipped with under 90 s left); TUNE_AB_ARGS adds
#                arguments. Its exit status is the A/B verdict
# $TUNE_WORK (default /tmp/blockfp8_tune) outlives the call on a warm machine, so `h200_tune.sh ab` can follow at once.
# Everything lands in $OUT/tune/ and is packed into $OUT/tune.tgz (also on TERM); the tuned file, the A/B JSON and
# its PNGs included; a short table is printed last. Exit status 1 when any step failed or was skipped, the tune
# missed its target, or the A/B failed.
set -uo pipefail
cd "$(dirname "$0")/../.."
STAGES=("$@")
[ ${#STAGES[@]} -eq 0 ] && STAGES=(ckpt tune ab)
for s in "${STAGES[@]}"; do
  case "$s" in ckpt|tune|ab) ;; *) echo "h200_tune.sh: unknown stage '$s' (ckpt, tune, ab)"; exit 2 ;; esac
done
RUN_NAME=tune
. dev/device/lib.sh  # LOGS, PY, BUDGET_S, FAILED, SUMMARY; note, step, pack, install_wheels, build_extension

wants() { [[ " ${STAGES[*]} " == *" $1 "* ]]; }
WORK=${TUNE_WORK:-/tmp/blockfp8_tune}
MODEL=$WORK/qwen3_8b_1layer/fp8block
TUNED=${TUNED_FILE:-$WORK/blockfp8_tuned.json}
TUNE_TARGET_S=${TUNE_TARGET_S:-300}  # issue #43 item 5: tuning the Qwen3-8B shape takes <= 5 minutes
mkdir -p "$WORK"

finish() {
  echo
  echo "== tune run: $(cat "$LOGS/gpu.txt" 2>/dev/null), $(( $(date +%s) - T_START )) s"
  grep -hE "^wrote .*points measured" "$LOGS/tune.log" 2>/dev/null
  [ -n "${TUNE_WALL:-}" ] && echo "tune wall time: ${TUNE_WALL} s (target <= ${TUNE_TARGET_S} s)"
  grep -h "^tune_ab:" "$LOGS/ab.log" 2>/dev/null | cut -c1-400
  printf '%s\n' "${SUMMARY[@]}"
  pack
  [ "$FAILED" = 0 ] || { echo "tune run: FAILED or incomplete (see the rows above)"; exit 1; }
  echo "tune run: every step passed"
  exit 0
}

nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,power.limit --format=csv,noheader | tee "$LOGS/gpu.txt"

# ---- build ---------------------------------------------------------------------------------------------------------
install_wheels
export PYTHONPATH=$PWD:$PYTHONPATH  # the scripts run by path (benchmarks/serving/...) import the package from here too
build_extension "${TUNE_ARCHS:-9.0a}" 330
if ! "$PY" -c "
import sys
from vllm_blockfp8 import ops
print(ops.build_info())
sys.exit(0 if ops.HAS_CUDA_KERNELS and ops.kernels_unavailable_reason() is None else 1)" > "$LOGS/build_info.txt" 2>&1; then
  cat "$LOGS/build_info.txt"
  note build "FAILED: the extension's kernels cannot run here; nothing else can (build_info.txt, build.log)"
  FAILED=1; finish
fi

# ---- the checkpoint: one Qwen3-8B layer ------------------------------------------------------------------------------
if wants ckpt; then
  if [ -f "$MODEL/model.safetensors.index.json" ]; then
    note ckpt "kept $MODEL"
  else
    step ckpt 120 "$PY" benchmarks/serving/make_qwen3_8b.py "$WORK/qwen3_8b_1layer" --layers 1 --shape '{"vocab": 8192}'
  fi
  # The tool must see Qwen3-8B's four fused shapes, no more, no fewer.
  if ! "$PY" -c "
import sys
from pathlib import Path
from vllm_blockfp8 import shapes
from vllm_blockfp8.tools.tune import model_shapes
fmt, found = model_shapes(Path(sys.argv[1]))
want = sorted((s.n, s.k) for s in shapes.QWEN3_8B)
print(fmt, found)
sys.exit(0 if (fmt, found) == ('fp8-block', want) else 1)" "$MODEL" > "$LOGS/ckpt_shapes.txt" 2>&1; then
    cat "$LOGS/ckpt_shapes.txt"
    note ckpt "FAILED: the checkpoint's fused shapes are not Qwen3-8B's (ckpt_shapes.txt)"; FAILED=1
  fi
fi

# ---- the wheel: tune runs as a user runs it, from the installed wheel, outside this tree -------------------------
# The wheel packs the extension just built (BLOCKFP8_PREBUILT_EXT: nothing is compiled again) and is installed into its
# own folder; tune then runs from /tmp with only that folder on PYTHONPATH (the image's torch comes from its
# interpreter: a virtualenv made from it would not see its torch), and the import check proves the package is the
# wheel's, not this tree's editable install.
TUNE_SITE=""
if wants tune && [ "${TUNE_FROM_WHEEL:-1}" = 1 ]; then
  SITE=$WORK/wheel_site
  if step wheel 150 bash -c 'set -e; rm -rf "$1" "$3"; so=$(ls "$PWD"/vllm_blockfp8/_C*.so)
      BLOCKFP8_PREBUILT_EXT=$so "$2" -m pip wheel -q --no-build-isolation --no-deps -w "$3" .
      "$2" -m pip install -q --no-index --no-deps --target "$1" "$3"/vllm_blockfp8-*.whl
      cd /tmp && PYTHONPATH=$1 "$2" -c "import sys, vllm_blockfp8 as p; print(p.__file__)
sys.exit(0 if p.__file__.startswith(sys.argv[1]) else 1)" "$1"' _ "$SITE" "$PY" "$WORK/dist"; then
    TUNE_SITE=$SITE
  else
    note wheel "FAILED: no wheel install to tune from (wheel.log); tuning from the source tree instead"
  fi
fi

# ---- blockfp8 tune, timed ------------------------------------------------------------------------------------------
if wants tune; then
  rm -f "$TUNED"
  T0=$(date +%s.%N)
  if [ -z "$TUNE_SITE" ]; then
    step tune 400 "$PY" -m vllm_blockfp8 tune "$MODEL" --out "$TUNED"
  else  # from /tmp with only the wheel's folder on PYTHONPATH
    step tune 400 bash -c 'cd /tmp && PYTHONPATH=$0 exec "$@"' "$TUNE_SITE" "$PY" -m vllm_blockfp8 tune "$MODEL" --out "$TUNED"
  fi
  TUNE_RC=$?
  TUNE_WALL=$(awk -v a="$T0" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }')
  if [ "$TUNE_RC" = 0 ] && awk -v w="$TUNE_WALL" -v t="$TUNE_TARGET_S" 'BEGIN { exit !(w > t) }'; then
    note tune "TARGET MISSED: ${TUNE_WALL} s > ${TUNE_TARGET_S} s"; FAILED=1
  fi
fi
[ -f "$TUNED" ] && cp "$TUNED" "$LOGS/blockfp8_tuned.json"

# ---- the A/B -------------------------------------------------------------------------------------------------------
if wants ab; then
  if [ ! -f "$TUNED" ]; then
    note ab "FAILED: no tuned file at $TUNED (run the tune stage, or set TUNED_FILE)"; FAILED=1
  else
    # The points stop AB_MARGIN_S before the step's end: the tables, the JSON and both plots still get written.
    AB_LEFT=$(( T_START + BUDGET_S - 20 - $(date +%s) ))
    AB_MARGIN_S=${AB_MARGIN_S:-45}
    if [ "$AB_LEFT" -lt $(( AB_MARGIN_S + 45 )) ]; then
      note ab "SKIPPED: ${AB_LEFT} s left in the call; run \`dev/device/h200_tune.sh ab\` next (warm machine)"; FAILED=1
    else
      # shellcheck disable=SC2086
      step ab 600 "$PY" -m benchmarks.bench_tune_ab "$TUNED" --json "$LOGS/tune_ab.json" --plot "$LOGS/tune_ab.png" \
        --time-budget-s $(( AB_LEFT - AB_MARGIN_S )) ${TUNE_AB_ARGS:-}
    fi
  fi
fi

finish
