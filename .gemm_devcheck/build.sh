#!/bin/bash
# Builds libgemm.so from the gemm sources (device machine, 16 cores).
set -e
cd "$(dirname "$0")"
if [ ! -d /tmp/cutlass_whl ]; then python3 -c "import zipfile,glob; zipfile.ZipFile(glob.glob('../.whl/nvidia_cutlass-*.whl')[0]).extractall('/tmp/cutlass_whl')"; fi
CI=/tmp/cutlass_whl/cutlass_library/source/include
G=../vllm_blockfp8/csrc/gemm
mkdir -p /tmp/gobj
F="-DBLOCKFP8_EXPERIMENT -std=c++17 -O3 -gencode=arch=compute_90a,code=sm_90a --expt-relaxed-constexpr -DNDEBUG -Xcompiler -fPIC -I$CI"
one() { local s=$1 b; b=$(basename $s .cu); local t0=$(date +%s.%N)
  nvcc $F -Xptxas -v -c $s -o /tmp/gobj/$b.o > /tmp/gobj/$b.log 2>&1 || { tail -40 /tmp/gobj/$b.log; return 1; }
  echo "$b $(python3 -c "print(round($(date +%s.%N)-$t0,1))") s"; }
pids=()
for s in $G/sm90*.cu shim.cu; do one $s & pids+=($!); done
rc=0; for p in "${pids[@]}"; do wait $p || rc=1; done
[ $rc = 0 ] || exit 1
nvcc -shared -o /tmp/gobj/libgemm.so /tmp/gobj/*.o
echo built
