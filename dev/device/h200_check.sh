#!/usr/bin/env bash
# One H200 call: unpack the carried vLLM bundle (.vk; once per machine: dev/device/vllm_bundle.sh), install the
# carried build wheels, build the extension with all cores, then run the selected stages, each under its own time
# cap. Logs and JSON go to $OUT; a summary is printed last, and everything is packed into $OUT/run.tgz (the device
# returns at most 8 files). Run from the repository root with `.whl` carried (nvidia-cutlass, setuptools wheels) and
# `.vk` for the vLLM peers and the demo.
#
#   dev/device/h200_check.sh STAGE [STAGE...]
#   build        build the extension (always first; skipped when _C is newer than every source)
#   tests        GPU tests (quantizer, GEMV, GEMM, harness, CPU suites are CI's)
#   sanitize     compute-sanitizer memcheck + racecheck over every kernel row
#   bench_quant  bench_gemv  bench_gemm  bench_gemv_rows  bench_gemm_rows   benchmark scripts
#   bench_crossover  every linear row forced at M = 8..64: the measured GEMV/GEMM crossover
#   bench_nvfp4  NVFP4 W4A16 linear at M = 1..8192 beside vLLM's Marlin FP4 (the vLLM bundle sourced, as
#                for demo), cuBLAS bf16 and our FP8; CAP_NVFP4 (540 s), NVFP4_ARGS (e.g. --rows, --m 1,16)
#   bench_gemm_only  bench_linear_prefill   bench_gemm split in two (GEMM alone / full linear), own JSON;
#                    GEMM_SHAPES picks the shapes (default benchmark_set; e.g. seeds)
#   racecheck_gemm   racecheck once per GEMM row and case (ties a hazard report to one launch)
#   bench_gemm_order GEMM only at M = 2048..8192 under each BLOCKFP8_SM90_RASTER:SWIZZLE in GEMM_ORDERS
#   tests_gemm_order the GPU GEMM tests under each setting of GEMM_ORDERS at every M (ragged tile grids)
#   gemv_probe   dev/probes/gemv_read_probe.cu: the GEMV's weight-load pattern alone vs a plain stream
#   tma_probe    dev/probes/tma_ingress_probe.cu: TMA ingress per SM by source and active SMs; wgmma against a
#                concurrent TMA writer (does the writer take shared-memory bandwidth from wgmma?)
#   wgmma_probe  dev/probes/wgmma_rate_probe.cu: cycles per FP8 wgmma by N, chains, issue order, warpgroups
#   fp4_frag_gemv_probe  dev/probes/fp4_frag_gemv_probe.cu: the NVFP4 decode GEMV rows on the fragment packing
#                with and without prefetch and x staged per block beside a plain read, M = 1-16 (~20 s + build)
#   fp4_wgmma_phase_probe  dev/probes/fp4_wgmma_phase_probe.cu: where a wave of the NVFP4 wgmma GEMM spends its
#                time (launch gap, CTA starts, first loads, loop, epilogue, tail) against an empty grid (~30 s + nvcc)
#   pdl_probe    dev/probes/pdl_gemv_probe.cu: [norm, NVFP4 decode GEMV] pairs with and without programmatic
#                dependent launch, M = 1, Qwen3-8B's layers: what PDL hides of the GEMV's fixed cost (~10 s + nvcc)
#   narrow_fused_quant_probe  dev/probes/narrow_fused_quant_probe.cu: the activation quantizer fused into the tok64
#                GEMM (register-A wgmma) on narrow long-K layers against quantizer + tok64 and cuBLAS bf16 (nvcc ~1 min;
#                CuTe headers: the nvidia-cutlass wheel in .whl, which .vk and the prebuilt extension leave no room for;
#                FUSED_VARIANTS="0 4 1" builds and runs those PROBE_CONVERT variants)
#   narrow_cluster_quant_probe  dev/probes/narrow_cluster_quant_probe.cu: the same layers with a cluster along N that
#                converts each x value once and shares the e4m3 tile through distributed shared memory (nvcc ~1.5 min)
#   ab_gemm      GEMM only, forced rows A/B: for each "ROW_A,ROW_B[,...]@M_LIST[@SHAPES]" in GEMM_AB
#                (space-separated; SHAPES: shape sets or names, default benchmark_set), two processes,
#                the row order reversed in the second (bench_gemm_ab_<I>_<ROW_A>_{a,b}.json, I = the
#                spec's position); benchmarks/analysis/ab_compare.py BASE|selected reads each pair;
#                CAP_AB (300 s) is split evenly over the processes
#   ab_builds    the tree's build against a base revision's (.prebuilt_base carried: dev/device/prebuilt.sh
#                pack-base REV; the same op schemas), the extension's _C swapped between bench processes in the order
#                tree, base, base, tree; AB_BENCH: the bench module and arguments (default bench_nvfp4, ours only,
#                M = 32..384); benchmarks/analysis/ab_compare.py --settings prints tree / base per M; CAP_AB (300 s)
#   fp4_split_sweep  bench_nvfp4 (ours only) under each NVFP4 wgmma K-split setting in FP4_SWEEP
#                ("REDUCTION:SPLITS@M_LIST[@ROWS]" ..., FP4_SWEEP_SHAPES), one process each, and the cluster slots
#                probe; CAP_SWEEP (300 s); benchmarks/analysis/fp4_split_fit.py fits the split rule's costs to them
#   host_overhead dev/probes/host_overhead.py: host vs GPU time per eager linear call (prefill chunks run
#                outside CUDA graphs in vLLM)
#   ncu          Nsight Compute sections for the launches in NCU_SPECS (dev/ncu/ncu_rows.py specs)
#   demo         python -m vllm_blockfp8 demo
#   quick, memcheck                                                          short variants
# BUDGET_S=N caps the whole call (stage caps shrink so that the logs still get packed).
# The device's copy of the tree has no .git: start the command with
# BLOCKFP8_GIT_STATE=<sha>[+dirty] (filled in here, before the call) so the result JSON names it.
set -uo pipefail
cd "$(dirname "$0")/../.."
: "${OUT:?set OUT}"
LOGS=$OUT/run
mkdir -p "$LOGS"
export PYTHONUNBUFFERED=1
T_START=$(date +%s)
# vLLM for the stages that time its kernels (bench_nvfp4's Marlin FP4, the vLLM peers of bench_gemv / bench_gemm)
# and for demo: unpacked from a carried .vk on the machine's first call, before the wheels go into the same site.
. dev/device/vllm_bundle.sh
if vllm_bundle; then
  VLLM_NOTE="vllm: $(ls -d "$VK_ROOT"/site/vllm-*.dist-info 2> /dev/null \
    | sed -n 's/.*vllm-\(.*\)\.dist-info/\1/p' | head -n 1)"
else
  VLLM_NOTE="vllm: absent (carry .vk): its peers are skipped, demo fails"
fi
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
. dev/device/flashinfer_site.sh  # the flashinfer_blockscale peer where a call on this machine carried .fi
use_flashinfer
SUMMARY=("$VLLM_NOTE" "$FLASHINFER_NOTE")
stage() {  # stage NAME CAP CMD...
  local name=$1 cap=$2; shift 2
  local t0=$(date +%s)
  # BUDGET_S (seconds for the whole call): shorten each cap so the logs are packed in time.
  if [ -n "${BUDGET_S:-}" ]; then
    local left=$(( T_START + BUDGET_S - 20 - t0 ))
    [ "$left" -lt 5 ] && { SUMMARY+=("$(printf '%-16s skipped: call budget spent' "$name")"); return; }
    [ "$left" -lt "$cap" ] && cap=$left
  fi
  # Benchmarks stop starting points 30 s before the cap, so their JSON and table still get written.
  export BENCH_TIME_BUDGET_S=$(( cap > 60 ? cap - 30 : cap ))
  # SM clock and power beside every stage (5 samples/s): the 700 W cap lowers the SM clock under
  # long FP8 kernels; benchmark records carry end_unix to be joined with these timestamps. The
  # query is run_serving.CLOCK_QUERY, so its clock_summary() reads these logs too.
  local smi=""
  if command -v nvidia-smi > /dev/null; then
    nvidia-smi --query-gpu=index,timestamp,clocks.sm,power.draw --format=csv,noheader,nounits -lms 200 \
      ${CUDA_VISIBLE_DEVICES:+-i "$CUDA_VISIBLE_DEVICES"} > "$LOGS/$name.clock.csv" 2>/dev/null &
    smi=$!
  fi
  timeout "$cap" "$@" > "$LOGS/$name.log" 2>&1
  local rc=$?
  [ -n "$smi" ] && kill "$smi" 2>/dev/null
  SUMMARY+=("$(printf '%-16s rc=%-4s %5ss' "$name" "$rc" "$(( $(date +%s) - t0 ))")")
  tail -n 25 "$LOGS/$name.log"
}
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu --format=csv,noheader
# The H200 needs only sm_90a; CI and the default build also compile 8.9 and 12.0a.
ARCHS=${ARCHS:-9.0a}
# A warm machine keeps the build: skip it when the sources hash to the stamp of the last build (or of a carried
# .prebuilt: dev/device/prebuilt.sh).
bash dev/device/prebuilt.sh install "$ARCHS"
STAMP=vllm_blockfp8/.build_stamp
HASH=$(bash dev/device/prebuilt.sh hash "$ARCHS")
if [ -f vllm_blockfp8/_C.abi3.so ] && [ "$(cat $STAMP 2>/dev/null)" = "$HASH" ] && python3 -c "import vllm_blockfp8" 2>/dev/null; then
  echo "build: unchanged sources, keeping the last build"
else
  stage build 420 env TORCH_CUDA_ARCH_LIST="$ARCHS" MAX_JOBS=16 BLOCKFP8_ARCH_JOBS=${BUILD_ARCH_JOBS:-10} \
    python3 -m pip install --no-build-isolation --no-deps -v -e .
  echo "$HASH" > $STAMP
fi
if ! python3 -c "import vllm_blockfp8.ops as o; assert o.HAS_CUDA_KERNELS" 2>/dev/null; then
  grep -E "error" "$LOGS/build.log" | head -n 30
  echo "build failed: retrying without the arch-specific (CUTLASS) units"
  stage build_generic 300 env TORCH_CUDA_ARCH_LIST="${ARCHS%a}" MAX_JOBS=16 \
    python3 -m pip install --no-build-isolation --no-deps -v -e .
fi
python3 -c "import vllm_blockfp8.ops as o; print(o.build_info())"
grep -hE "ptxas info *: Used|spill stores|spill loads" "$LOGS/build.log" | sort | uniq -c | sort -rn | head -n 5
for s in "$@"; do
  case $s in
    tests) stage tests 360 python3 -m pytest -q -p no:cacheprovider --maxfail=20 tests/test_quant.py tests/test_gemv.py \
             tests/test_gemm.py tests/test_harness.py ;;
    sanitize) stage memcheck 240 compute-sanitizer --tool memcheck --error-exitcode 9 python3 dev/device/sanitize_rows.py
              stage racecheck 240 compute-sanitizer --tool racecheck --error-exitcode 9 python3 dev/device/sanitize_rows.py ;;
    build) ;;  # always done above; accepted so `h200_check.sh build` reads naturally
    demo) stage demo 240 python3 -m vllm_blockfp8 demo ;;
    memcheck) stage memcheck 150 compute-sanitizer --tool memcheck --error-exitcode 9 python3 dev/device/sanitize_rows.py ;;
    bench_quant) stage bench_quant 90 python3 -m benchmarks.bench_quant --rows ;;  # peers + every quant row
    quick) stage bench_gemv_quick 150 python3 -m benchmarks.bench_gemv --quick \
             --json "$LOGS/bench_gemv_quick.json" --plot "$LOGS/bench_gemv_quick.png"
           stage bench_gemm_quick 150 python3 -m benchmarks.bench_gemm --quick \
             --json "$LOGS/bench_gemm_quick.json" --plot "$LOGS/bench_gemm_quick.png" ;;
    bench_gemv) stage bench_gemv 120 python3 -m benchmarks.bench_gemv --json benchmarks/results/bench_gemv.json.gz ;;
    bench_gemv_rows) stage bench_gemv_rows 240 python3 -m benchmarks.bench_gemv --rows --peers none \
                       --json benchmarks/results/bench_gemv_rows.json.gz --plot benchmarks/results/bench_gemv_rows.png ;;
    bench_nvfp4) stage bench_nvfp4 ${CAP_NVFP4:-540} python3 -m benchmarks.bench_nvfp4 ${NVFP4_ARGS:-} \
                   --json benchmarks/results/bench_nvfp4.json.gz --plot benchmarks/results/bench_nvfp4.png ;;
    bench_gemm) stage bench_gemm 420 python3 -m benchmarks.bench_gemm ;;  # 15 shapes x 6 peers: 150 s did 5
    bench_gemm_only) stage bench_gemm_only ${CAP_GEMM_ONLY:-420} python3 -m benchmarks.bench_gemm --ops gemm \
                       --shapes "${GEMM_SHAPES:-benchmark_set}" --json benchmarks/results/bench_gemm_only.json.gz --plot benchmarks/results/bench_gemm_only.png ;;
    bench_linear_prefill) stage bench_linear_prefill ${CAP_LINEAR:-420} python3 -m benchmarks.bench_gemm --ops linear \
                       --shapes "${GEMM_SHAPES:-benchmark_set}" --json benchmarks/results/bench_linear_prefill.json.gz --plot benchmarks/results/bench_linear_prefill.png ;;
    bench_gemm_order)  # the SM90 GEMM's persistent tile order at large M (gemm/NOTES.md): one run per setting
      # Each setting gets an equal share of the stage's time; large shapes only (where A and B exceed L2).
      stage bench_gemm_order 300 bash -c 'orders=(${GEMM_ORDERS:-heuristic:1 along_m:1 along_n:1 along_m:8 along_n:8})
        for o in "${orders[@]}"; do
        BENCH_TIME_BUDGET_S=$(( BENCH_TIME_BUDGET_S / ${#orders[@]} )) BLOCKFP8_SM90_RASTER=${o%:*} \
          BLOCKFP8_SM90_SWIZZLE=${o#*:} python3 -m benchmarks.bench_gemm --ops gemm --m 2048,4096,8192 \
          --shapes qwen3_8b,dsv3.7168x16384 --peers none --plot /dev/null \
          --json benchmarks/results/bench_gemm_order_${o%:*}_${o#*:}.json | grep -E "^geomean|^    ours"; done' ;;
    tests_gemm_order)  # the tile order is read once per process: one pytest run per setting
      stage tests_gemm_order 240 bash -c 'set -o pipefail; rc=0; for o in ${GEMM_ORDERS:-heuristic:1 along_m:8 along_n:8}; do
        echo "== BLOCKFP8_SM90_RASTER=${o%:*} BLOCKFP8_SM90_SWIZZLE=${o#*:}"
        BLOCKFP8_SM90_RASTER=${o%:*} BLOCKFP8_SM90_SWIZZLE=${o#*:} python3 -m pytest -q -p no:cacheprovider \
          --maxfail=10 tests/test_gemm.py 2>&1 | tail -n 3 || rc=1; done; exit $rc' ;;
    racecheck_gemm)  # one process per GEMM row and case, so each hazard report names its launch
      stage racecheck_gemm 420 bash -c 'for r in $(python3 -c "from vllm_blockfp8 import ops; print(\" \".join(x[\"name\"] for x in ops.tile_table(\"gemm\")))"); do
        for c in 0 1 2 3; do echo "== racecheck gemm:$r case $c"; compute-sanitizer --tool racecheck --print-limit 2 python3 dev/device/sanitize_rows.py gemm:$r --case $c 2>&1 | grep -E "^gemm|hazard|Race|SUMMARY|==   *and"; done; done' ;;
    ncu) # NCU_SECTIONS adds sections, e.g. "MemoryWorkloadAnalysis_Chart MemoryWorkloadAnalysis_Tables" (DRAM detail)
      stage ncu 200 ncu --kernel-name "regex:mma_kernel|per_token_group|device_kernel|fragment_kernel|wgmma_kernel" --clock-control none \
           --section SpeedOfLight --section MemoryWorkloadAnalysis --section WarpStateStats --section SchedulerStats \
           --section Occupancy --section LaunchStats $(for x in ${NCU_SECTIONS:-}; do printf -- '--section %s ' "$x"; done) \
           python3 dev/ncu/ncu_rows.py ${NCU_SPECS:-gemv:gemv_mma_t8:1x2112x7168} ;;
    gemv_probe) stage gemv_probe 120 bash -c 'nvcc -O3 -std=c++17 -gencode arch=compute_90a,code=sm_90a \
                  dev/probes/gemv_read_probe.cu -o /tmp/gemv_read_probe && /tmp/gemv_read_probe benchmarks/results/gemv_read_probe.json' ;;
    wgmma_probe) stage wgmma_probe 120 bash -c 'nvcc -O3 -std=c++17 -gencode arch=compute_90a,code=sm_90a \
                  --expt-relaxed-constexpr -I /tmp/site/cutlass_library/source/include dev/probes/wgmma_rate_probe.cu \
                  -o /tmp/wgmma_rate_probe && /tmp/wgmma_rate_probe benchmarks/results/wgmma_rate_probe.json' ;;
    fp4_frag_gemv_probe) stage fp4_frag_gemv_probe 150 bash -c 'nvcc -O3 -std=c++17 -gencode arch=compute_90a,code=sm_90a \
                  --expt-relaxed-constexpr dev/probes/fp4_frag_gemv_probe.cu -o /tmp/fp4_frag_gemv_probe \
                  && /tmp/fp4_frag_gemv_probe benchmarks/results/fp4_frag_gemv_probe.json' ;;
    fp4_wgmma_phase_probe) stage fp4_wgmma_phase_probe 150 bash -c 'nvcc -O3 -std=c++17 -gencode arch=compute_90a,code=sm_90a \
                  --expt-relaxed-constexpr dev/probes/fp4_wgmma_phase_probe.cu -o /tmp/fp4_wgmma_phase_probe \
                  && /tmp/fp4_wgmma_phase_probe benchmarks/results/fp4_wgmma_phase_probe.json' ;;
    pdl_probe) stage pdl_probe 120 bash -c 'nvcc -O3 -std=c++17 -gencode arch=compute_90a,code=sm_90a \
                  --expt-relaxed-constexpr dev/probes/pdl_gemv_probe.cu -o /tmp/pdl_gemv_probe \
                  && /tmp/pdl_gemv_probe benchmarks/results/pdl_gemv_probe.json' ;;
    tma_probe) stage tma_probe 120 bash -c 'nvcc -O3 -std=c++17 -gencode arch=compute_90a,code=sm_90a \
                  --expt-relaxed-constexpr -I /tmp/site/cutlass_library/source/include dev/probes/tma_ingress_probe.cu \
                  -o /tmp/tma_ingress_probe && /tmp/tma_ingress_probe benchmarks/results/tma_ingress_probe.json' ;;
    narrow_fused_quant_probe|narrow_cluster_quant_probe)  # cuBLAS headers and library from the CUDA wheels torch
      # brings, whatever the toolkit has; CuTe from nvidia-cutlass (in .whl: a call that carries only the prebuilt
      # extension has no CUTLASS headers). FUSED_VARIANTS: the fused probe's PROBE_CONVERT values to build (in parallel)
      # and run; 0 writes the committed JSON, another v <probe>_v<v>.json. The cluster probe builds once.
      variants=${FUSED_VARIANTS:-0}; [ "$s" = narrow_cluster_quant_probe ] && variants=0
      stage "$s" 300 env PROBE="$s" VARIANTS="$variants" bash -c 'nv=$(python3 -c "import nvidia, os; print(os.path.join(list(nvidia.__path__)[0], \"cu13\"))") \
        && { [ -d /tmp/site/cutlass_library/source/include ] || { echo "no CUTLASS headers: put the nvidia-cutlass wheel in .whl"; exit 1; }; } \
        && mkdir -p /tmp/cublas_inc && ln -sf "$nv"/include/cublas*.h /tmp/cublas_inc/ || exit 1
        for v in $VARIANTS; do nvcc -O3 -std=c++17 -gencode arch=compute_90a,code=sm_90a --expt-relaxed-constexpr \
             -DPROBE_CONVERT=$v -I /tmp/site/cutlass_library/source/include -I /tmp/cublas_inc -I vllm_blockfp8/csrc \
             dev/probes/$PROBE.cu -L "$nv/lib" -l:libcublas.so.13 -Xlinker -rpath="$nv/lib" -o /tmp/${PROBE}_$v & done; wait
        for v in $VARIANTS; do x=_v$v; [ $v = 0 ] && x=; echo "== $PROBE PROBE_CONVERT=$v"
          /tmp/${PROBE}_$v benchmarks/results/$PROBE$x.json || exit 1; done' ;;
    ab_gemm)  # candidate rows against the row they would replace, both run orders (gemm/NOTES.md)
      stage ab_gemm ${CAP_AB:-300} bash -c 'set -- ${GEMM_AB:?set GEMM_AB}; n=$#; i=0; for spec in "$@"; do
        i=$((i + 1)); IFS=@ read -r rows ms shp <<< "$spec"; rev=$(echo "$rows" | tr , "\n" | tac | paste -sd,)
        for o in a b; do r=$rows; [ $o = b ] && r=$rev
          BENCH_TIME_BUDGET_S=$(( BENCH_TIME_BUDGET_S / (2 * n) )) python3 -m benchmarks.bench_gemm --ops gemm \
            --peers none --rows "$r" --m "$ms" --shapes "${shp:-benchmark_set}" --plot /dev/null \
            --json benchmarks/results/bench_gemm_ab_${i}_${rows%%,*}_$o.json | grep -E "^geomean|^    ours"; done; done' ;;
    ab_builds)
      stage ab_builds ${CAP_AB:-300} bash -c 'so=$(python3 -c "import importlib.util as u; print(u.find_spec(\"vllm_blockfp8._C\").origin)") \
        && cp "$so" /tmp/ab_tree_C.so && python3 -c "import lzma, shutil, sys; shutil.copyfileobj(lzma.open(sys.argv[1]),
          open(sys.argv[2], \"wb\"))" .prebuilt_base/_C.abi3.so.xz /tmp/ab_base_C.so || exit 1
        r=benchmarks/results/ab_builds; i=0; for v in tree base base tree; do i=$((i + 1)); cp /tmp/ab_${v}_C.so "$so"
          BENCH_TIME_BUDGET_S=$(( BENCH_TIME_BUDGET_S / 4 )) python3 -m ${AB_BENCH:-benchmarks.bench_nvfp4 --peers none \
            --no-fp8 --m 32,64,128,256,384} --plot /dev/null --json ${r}_${i}_$v.json | grep -E "^geomean"; done
        cp /tmp/ab_tree_C.so "$so"
        python3 benchmarks/analysis/ab_compare.py --settings base ${r}_1_tree.json ${r}_2_base.json ${r}_4_tree.json \
          ${r}_3_base.json' ;;
    fp4_split_sweep)  # the NVFP4 wgmma rows' K split: bench_nvfp4 (ours, no peers) per "REDUCTION:SPLITS@M_LIST[@ROWS]"
      # in FP4_SWEEP (space-separated; SPLITS 0: the rule's count; ROWS: forced rows beside the selected one), one
      # process each (the switches are read once): benchmarks/results/fp4_split_<I>_<REDUCTION><SPLITS>.json, and
      # run/cluster_slots.txt (dev/probes/cluster_slots_probe.cu): benchmarks/analysis/fp4_split_fit.py reads both
      nvcc -O3 -std=c++17 -gencode arch=compute_90a,code=sm_90a dev/probes/cluster_slots_probe.cu -o /tmp/cluster_slots \
        && /tmp/cluster_slots > "$LOGS/cluster_slots.txt"
      stage fp4_split_sweep ${CAP_SWEEP:-300} bash -c 'set -- ${FP4_SWEEP:?set FP4_SWEEP}; n=$#; i=0; for spec in "$@"; do
        i=$((i + 1)); IFS=@ read -r mode ms rows <<< "$spec"; red=${mode%%:*} splits=${mode#*:}
        [ "$splits" = 0 ] && splits=
        BENCH_TIME_BUDGET_S=$(( BENCH_TIME_BUDGET_S / n )) BLOCKFP8_SM90_FP4_REDUCTION=$red \
          BLOCKFP8_SM90_FP4_SPLITS=$splits python3 -m benchmarks.bench_nvfp4 --peers none --no-fp8 --m "$ms" \
          --shapes "${FP4_SWEEP_SHAPES:-benchmark_set}" ${rows:+--rows "$rows"} --plot /dev/null \
          --json benchmarks/results/fp4_split_${i}_${red}${splits:-auto}.json | grep -E "^geomean"; done' ;;
    host_overhead) stage host_overhead 90 python3 dev/probes/host_overhead.py --json benchmarks/results/host_overhead.json ;;
    bench_gemm_rows) stage bench_gemm_rows 240 python3 -m benchmarks.bench_gemm --rows --peers none \
                       --json benchmarks/results/bench_gemm_rows.json.gz --plot benchmarks/results/bench_gemm_rows.png ;;
    bench_crossover) stage bench_crossover 200 python3 -m benchmarks.bench_gemv --m 8,16,24,32,48,64 \
                       --linear-rows --peers none --json benchmarks/results/bench_linear_crossover.json.gz \
                       --plot benchmarks/results/bench_linear_crossover.png ;;
    *) echo "unknown stage $s (skipped)"; SUMMARY+=("$(printf '%-16s unknown stage, skipped' "$s")") ;;
  esac
done
cp -f benchmarks/results/*.json benchmarks/results/*.json.gz benchmarks/results/*.png "$LOGS/" 2>/dev/null
tar czf "$OUT/run.tgz" -C "$OUT" run && rm -rf "$LOGS"
printf '%s\n' "${SUMMARY[@]}"
