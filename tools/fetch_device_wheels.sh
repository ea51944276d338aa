#!/usr/bin/env bash
# Download, on a machine with PyPI, the wheels the H200 machine lacks into .whl/ (git-ignored;
# carry it with `carry: [".whl"]`; tools/h200_check.sh installs .whl/*.whl into /tmp/site).
#   nvidia-cutlass, setuptools: building the extension there (CUTLASS headers; PEP 639 license).
#   compressed-tensors, loguru, frozendict: vLLM 0.26 imports compressed_tensors as soon as any
#   --quantization is given, and the offline vLLM bundle does not carry it (seen 2026-11-29: the
#   demo failed with "No module named 'compressed_tensors'").
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p .whl
grep -qx "/.whl/" .git/info/exclude 2>/dev/null || echo "/.whl/" >> .git/info/exclude
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d .whl \
  "nvidia-cutlass==4.2.0.0" "setuptools==80.9.0" "compressed-tensors==0.17.0" "loguru==0.7.3" "frozendict==2.5.1"
ls -la .whl
