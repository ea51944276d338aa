# call 1 (x2): build; GPU0: tile orders (along_m:8 old default, :4, :2) on ragged grids, then ncu of short-K prefill;
# GPU1: test_gemm.py + host logic, orders along_m:1 / heuristic:1, 64x64 row A/B on held-out 3, racecheck/memcheck if time
T0=$(date +%s)
export BLOCKFP8_GIT_STATE=$(cat .calls/sha)
left() { echo $(( T0 + 440 - $(date +%s) )); }
mkdir -p $OUT/k
BUDGET_S=150 OUT=$OUT/k0 bash tools/h200_check.sh build > $OUT/k/k0.out 2>&1; rm -rf $OUT/k0
python3 -c "import vllm_blockfp8.ops as o; assert o.HAS_CUDA_KERNELS" || { tail -30 $OUT/k/k0.out; exit 4; }
echo "built at $(( $(date +%s) - T0 )) s"
export PYTHONPATH=/tmp/site
SA=dsv3.2112x7168,dsv3.kv_a.576x7168; MA=2048,3000,4096,8192
SB=dsv3.7168x16384,qwen3-8b.qkv; MB=2176,4224,6000
order_run() {  # order
  for g in A B; do if [ $g = A ]; then S=$SA; M=$MA; else S=$SB; M=$MB; fi
    BENCH_TIME_BUDGET_S=90 BLOCKFP8_SM90_RASTER=${1%:*} BLOCKFP8_SM90_SWIZZLE=${1#*:} timeout 100 python3 -m benchmarks.bench_gemm \
      --ops gemm --peers none --shapes $S --m $M --plot /dev/null --json $OUT/order_${1%:*}_${1#*:}_$g.json > $OUT/k/order_${1/:/_}_$g.log 2>&1
  done; }
B=sm90_swapab_128x64x128_ovl; C=sm90_swapab_64x64x128_pp
( export CUDA_VISIBLE_DEVICES=1
  timeout 90 python3 -m pytest -q -p no:cacheprovider --maxfail=20 tests/test_gemm.py tests/test_host_logic.py > $OUT/k/test_gemm.log 2>&1
  echo "tests done at $(( $(date +%s) - T0 )) s"
  for o in a b; do r="$B,$C"; [ $o = b ] && r="$C,$B"
    BENCH_TIME_BUDGET_S=60 timeout 70 python3 -m benchmarks.bench_gemm --ops gemm --peers none --rows "$r" \
      --shapes held_out_3 --m 96,128 --plot /dev/null --json $OUT/pp64_$o.json > $OUT/k/pp64_$o.log 2>&1; done
  echo "pp64 done at $(( $(date +%s) - T0 )) s"
  order_run along_m:1; order_run heuristic:1
  echo "gpu1 orders done at $(( $(date +%s) - T0 )) s"
  for c in 0 3; do [ $(left) -lt 40 ] && break; echo "== racecheck gemm:$C case $c"
    timeout 25 compute-sanitizer --tool racecheck --print-limit 2 python3 tools/sanitize_rows.py gemm:$C --case $c 2>&1 | grep -E "^gemm|hazard|Race|SUMMARY|==   *and"; done > $OUT/k/racecheck.log 2>&1
  L=$(left); [ $L -gt 20 ] && timeout $(( L - 10 )) compute-sanitizer --tool memcheck --error-exitcode 9 python3 tools/sanitize_rows.py gemm:$C > $OUT/k/memcheck.log 2>&1; echo "memcheck rc=$?" >> $OUT/k/memcheck.log ) &
G1=$!
export CUDA_VISIBLE_DEVICES=0
order_run along_m:8; order_run along_m:4; order_run along_m:2
echo "gpu0 orders done at $(( $(date +%s) - T0 )) s"
L=$(left); [ $L -gt 30 ] && timeout $(( L - 15 )) ncu --kernel-name "regex:device_kernel" --clock-control none \
  --section SpeedOfLight --section WarpStateStats --section SchedulerStats --section MemoryWorkloadAnalysis --section Occupancy \
  python3 tools/ncu_rows.py gemm:sm90_coop_128x128x128_c2x1_ovl:4096x32768x512 gemm:sm90_coop_128x128x128_c2x1_ovl:4096x8192x2048 \
  gemm:sm90_coop_128x128x128_c2x1_ovl:4096x4096x7168 > $OUT/k/ncu.log 2>&1
echo "ncu done at $(( $(date +%s) - T0 )) s"
wait $G1
tar czf $OUT/k.tgz -C $OUT k && rm -rf $OUT/k
echo "end at $(( $(date +%s) - T0 )) s"
tar xzf $OUT/k.tgz -O k/test_gemm.log | tail -2; tar xzf $OUT/k.tgz -O k/racecheck.log | grep -E "^== |SUMMARY"; tar xzf $OUT/k.tgz -O k/memcheck.log | tail -2
python3 tools/ab_compare.py $B $OUT/pp64_a.json $OUT/pp64_b.json | tail -25
python3 .calls/orders.py $OUT
