#!/usr/bin/env bash
# Host-only equivalence check of the SM90 GEMM planner: every (M, N, K, sm_count, switches) on a large grid (and
# every forced row) must get the same row, K plan, tile order, width and launch mode from the worktree as from REV.
#   dev/plan_equivalence/run.sh [REV=main] [quick]
# Needs g++, the CUDA headers and nvidia-cutlass's headers (CUTLASS's swizzle rule is compiled from them); no GPU.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
rev=${1:-main}
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
py=${PYTHON:-python3}
cutlass=$("$py" -c "import cutlass_library, os; print(os.path.dirname(cutlass_library.__file__))")/source/include
cuda=${CUDA_HOME:-/usr/local/cuda}/include
"$py" "$here/make_ref.py" "$rev" "$repo" "$out"
flags=(-std=c++17 -O2 -w -I "$cuda" -I "$cuda/cccl" -I "$here")
g++ "${flags[@]}" -I "$cutlass" -I "$out" -c "$out/ref.cpp" -o "$out/ref.o"
g++ "${flags[@]}" -DBLOCKFP8_HAS_SM90_GEMM -I "$repo/vllm_blockfp8/csrc" -c "$here/new.cpp" -o "$out/new.o"
g++ "${flags[@]}" -c "$here/main.cpp" -o "$out/main.o"
g++ "$out/main.o" "$out/ref.o" "$out/new.o" -o "$out/check"
"$out/check" ${2:-}
