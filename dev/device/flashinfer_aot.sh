#!/usr/bin/env bash
# Build FlashInfer's SM90 block-scale FP8 GEMM host module ahead of time, on a CPU machine (no GPU,
# no driver), so the H200 spends no device time on it. Output: .fi/aot/fp8_blockscale_gemm_90.so
# (git-ignored; carry [".fi"] with the wheels of dev/device/fetch_device_wheels.sh --flashinfer).
#
#   dev/device/flashinfer_aot.sh [PYTHON]     # PYTHON: torch 2.11 + flashinfer-python 0.6.14
#                                             # + apache-tvm-ffi 0.1.10 (default: python3)
#
# This is the module vLLM 0.26 reaches for block-FP8 linears with M < 32 on SM90
# (flashinfer.gemm.fp8_blockscale_gemm_sm90 -> gen_fp8_blockscale_gemm_sm90_module, the TRT-LLM
# swap-AB kernels). Steps (shared/offline-vllm/README.md): FlashInfer's JIT writes build.ninja and
# compiles every object with nvcc for sm_90a; the link wants -lcudart -lcuda -lnvrtc, which a
# machine without a driver lacks, so a folder with libcudart.so and libnvrtc.so links and a stub
# libcuda.so (soname libcuda.so.1) goes first on LIBRARY_PATH. The stub must define the driver
# functions the objects call: an empty one links too, but the .so then names no libcuda.so.1 and its
# cu* calls stay unresolved (so the script relinks against a stub made from the .so's undefined cu*
# symbols, and checks NEEDED libcuda.so.1, which the H200's driver provides).
# The .so is built against the tvm-ffi headers of the PYTHON given: keep apache-tvm-ffi at the
# version carried to the H200 (0.1.10, vLLM 0.26's pin).
#
# On the H200, after installing .fi/*.whl into a site directory SITE (see fetch_device_wheels.sh):
#   mkdir -p SITE/flashinfer/data/aot/fp8_blockscale_gemm_90 \
#     && cp .fi/aot/fp8_blockscale_gemm_90.so SITE/flashinfer/data/aot/fp8_blockscale_gemm_90/
# FlashInfer then loads it instead of building (JitSpec.is_aot). Its GEMM kernels are still
# compiled per shape at first use, with nvcc run as a subprocess (TRT-LLM's deep_gemm runtime hardwires
# kJitUseNvcc; the .so holds no NVRTC call), cached in $TRTLLM_DG_CACHE_DIR (default ~/.tensorrt_llm):
# warm up before timing or capturing a graph.
# Environment: MAX_JOBS (nvcc jobs, default nproc), FI_AOT_WORK (build folder, default a temp dir).
set -euo pipefail
cd "$(dirname "$0")/../.."
PY=${1:-${PYTHON:-python3}}
EXCLUDE=$(git rev-parse --git-path info/exclude)  # .git is a file in a worktree
grep -qx /.fi/ "$EXCLUDE" 2>/dev/null || echo /.fi/ >> "$EXCLUDE"
WORK=${FI_AOT_WORK:-$(mktemp -d /tmp/fiaot.XXXXXX)}
STUB=$WORK/stub
mkdir -p "$STUB" .fi/aot

# The CUDA 13 wheel tree (nvidia/cu13: include/nvrtc.h, lib/libnvrtc.so.13, lib/libcudart.so.13).
CU13=$("$PY" - <<'EOF'
import os, nvidia
print(next((os.path.join(p, "cu13") for p in nvidia.__path__ if os.path.isdir(os.path.join(p, "cu13"))), ""))
EOF
)
"$PY" -c 'import flashinfer, tvm_ffi, torch; print("flashinfer", flashinfer.__version__, "tvm_ffi",
tvm_ffi.__version__, "torch", torch.__version__)'
CUDA_HOME=${CUDA_HOME:-$(dirname "$(dirname "$(readlink -f "$(command -v nvcc)")")")}
find_lib() {  # first match of $1 (a glob) in the CUDA wheel tree or the toolkit
  ls -1 "$CU13"/lib/$1 "$CUDA_HOME"/lib64/$1 "$CUDA_HOME"/targets/x86_64-linux/lib/$1 2>/dev/null | head -1
}
ln -sf "$(find_lib 'libcudart.so*')" "$STUB/libcudart.so"
ln -sf "$(find_lib 'libnvrtc.so*')" "$STUB/libnvrtc.so"
echo | gcc -x c -shared -fPIC -Wl,-soname,libcuda.so.1 -o "$STUB/libcuda.so" -
for l in libcudart.so libnvrtc.so; do [ -e "$STUB/$l" ] || { echo "no $l found (CU13=$CU13)" >&2; exit 1; }; done

export LIBRARY_PATH=$STUB${LIBRARY_PATH:+:$LIBRARY_PATH}
[ -n "$CU13" ] && export CPATH=$CU13/include${CPATH:+:$CPATH}
export CUDA_HOME FLASHINFER_WORKSPACE_BASE=$WORK FLASHINFER_CUDA_ARCH_LIST=9.0a MAX_JOBS=${MAX_JOBS:-$(nproc)}
build() {  # FlashInfer's own JIT build (ninja: only what is missing); the .so's path into $WORK/so_path
  "$PY" - "$WORK/so_path" <<'EOF'
import sys
from flashinfer.jit.gemm import gen_fp8_blockscale_gemm_sm90_module
spec = gen_fp8_blockscale_gemm_sm90_module()
spec.build(verbose=True)
open(sys.argv[1], "w").write(str(spec.jit_library_path))
EOF
}
start=$(date +%s)
build
SO=$(cat "$WORK/so_path")
echo "built $SO in $(( $(date +%s) - start )) s"
# An empty stub leaves the driver calls (cuLibraryLoadData, ...) undefined with no NEEDED libcuda.so.1
# (the linker drops a library that resolves nothing): relink against a stub that defines them.
syms=$(nm -D --undefined-only "$SO" | awk '$2 ~ /^cu[A-Z]/ && $2 !~ /@/ {print $2}')
if [ -n "$syms" ]; then
  echo "driver symbols: $(echo $syms)"
  for s in $syms; do echo "void $s(void) {}"; done \
    | gcc -x c -shared -fPIC -Wl,-soname,libcuda.so.1 -o "$STUB/libcuda.so" -
  rm -f "$SO" && build
fi
cp "$SO" .fi/aot/fp8_blockscale_gemm_90.so
readelf -d .fi/aot/fp8_blockscale_gemm_90.so | grep NEEDED
readelf -d .fi/aot/fp8_blockscale_gemm_90.so | grep -q 'NEEDED.*\[libcuda\.so\.1\]' \
  || { echo "FAILED: the .so does not name libcuda.so.1" >&2; exit 1; }
ls -la .fi/aot/fp8_blockscale_gemm_90.so
