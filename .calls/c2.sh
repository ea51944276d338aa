# call 2 (x2): build (7 CUTLASS units); A/B of sm90_pp_64x128x128_c2x1_ovl vs sm90_coop_128x128x128_c2x1_ovl:
# GPU0 run a (base first), GPU1 run b (candidate first, after its GPU tests and sanitizers), benchmark set at M = 1024, 4096
# then held-out (HELD_OUT + HELD_OUT_3) at M = 2048.
T0=$(date +%s)
export BLOCKFP8_GIT_STATE=$(cat .calls/sha)
left() { echo $(( T0 + 500 - $(date +%s) )); }
mkdir -p $OUT/k
BUDGET_S=160 OUT=$OUT/k0 bash tools/h200_check.sh build > $OUT/k/k0.out 2>&1; rm -rf $OUT/k0
python3 -c "import vllm_blockfp8.ops as o; assert o.HAS_CUDA_KERNELS" || { tail -30 $OUT/k/k0.out; exit 4; }
echo "built at $(( $(date +%s) - T0 )) s"
export PYTHONPATH=/tmp/site
B=sm90_coop_128x128x128_c2x1_ovl; C=sm90_pp_64x128x128_c2x1_ovl
ab() {  # run-name rows
  BENCH_TIME_BUDGET_S=150 timeout 170 python3 -m benchmarks.bench_gemm --ops gemm --peers none --rows "$2" \
    --shapes benchmark_set --m 1024,4096 --plot /dev/null --json $OUT/k/pp128_$1.json > $OUT/k/pp128_$1.log 2>&1
  echo "bench set $1 done at $(( $(date +%s) - T0 )) s"
  BENCH_TIME_BUDGET_S=100 timeout 120 python3 -m benchmarks.bench_gemm --ops gemm --peers none --rows "$2" \
    --shapes held_out,held_out_3 --m 2048 --plot /dev/null --json $OUT/k/pp128_ho_$1.json > $OUT/k/pp128_ho_$1.log 2>&1
  echo "held-out $1 done at $(( $(date +%s) - T0 )) s"; }
( export CUDA_VISIBLE_DEVICES=1
  timeout 100 python3 -m pytest -q -p no:cacheprovider --maxfail=20 tests/test_gemm.py tests/test_host_logic.py > $OUT/k/test_gemm.log 2>&1
  echo "tests done at $(( $(date +%s) - T0 )) s"
  for c in 0 3; do echo "== racecheck gemm:$C case $c"
    timeout 30 compute-sanitizer --tool racecheck --print-limit 2 python3 tools/sanitize_rows.py gemm:$C --case $c 2>&1 | grep -E "^gemm|hazard|Race|SUMMARY|==   *and"; done > $OUT/k/racecheck.log 2>&1
  timeout 40 compute-sanitizer --tool memcheck --error-exitcode 9 python3 tools/sanitize_rows.py gemm:$C > $OUT/k/memcheck.log 2>&1; echo "memcheck rc=$?" >> $OUT/k/memcheck.log
  echo "sanitizers done at $(( $(date +%s) - T0 )) s"
  ab b "$C,$B" ) &
G1=$!
export CUDA_VISIBLE_DEVICES=0
ab a "$B,$C"
wait $G1
tar czf $OUT/k.tgz -C $OUT k && rm -rf $OUT/k
echo "end at $(( $(date +%s) - T0 )) s"
tar xzf $OUT/k.tgz -O k/test_gemm.log | tail -2; tar xzf $OUT/k.tgz -O k/racecheck.log | grep -E "^== |SUMMARY"; tar xzf $OUT/k.tgz -O k/memcheck.log | tail -2
mkdir -p /tmp/kk && tar xzf $OUT/k.tgz -C /tmp/kk
python3 .calls/ppk.py /tmp/kk/k/pp128_a.json /tmp/kk/k/pp128_b.json /tmp/kk/k/pp128_ho_a.json /tmp/kk/k/pp128_ho_b.json
