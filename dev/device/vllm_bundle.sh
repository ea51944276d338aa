# The offline vLLM bundle for the device scripts: sourced (lib.sh, h200_check.sh), never run.
#
# The bundle (../shared/offline-vllm, carried as .vk/kit.part-*) is one tar: its packages land in VK_ROOT/site
# (/tmp/site, where the carried wheels go too) and its helpers and environment in VK_ROOT/vk_tools. A machine
# keeps it while warm, so only the first call on a machine unpacks it; every call sources its environment
# (PYTHONPATH, offline switches, the sampler switch vLLM 0.26 needs without FlashInfer). Without it vLLM is not
# importable there: the vLLM tests, the vLLM peers of the benchmarks (bench_nvfp4's Marlin FP4, bench_gemv's
# vLLM kernels) and the demo are skipped.
#
#   vllm_bundle   unpack a carried bundle where VK_ENV is missing, then source VK_ENV; returns 1 when there is
#                 none (nothing carried, nothing unpacked by an earlier call). Unpack before installing the
#                 carried wheels into /tmp/site, so the wheels' versions win.
VK_ROOT=${VK_ROOT:-/tmp}
VK_ENV=${VK_ENV:-$VK_ROOT/vk_tools/env.sh}

vllm_bundle() {
  if [ ! -f "$VK_ENV" ] && ls .vk/kit.part-* > /dev/null 2>&1; then
    echo "== unpacking the vLLM bundle (.vk/kit.part-*)"
    cat .vk/kit.part-* > "$VK_ROOT/kit.bin" \
      && "${PY:-python3}" -c "import sys, tarfile; tarfile.open(sys.argv[1]).extractall(sys.argv[2], filter='tar')" \
        "$VK_ROOT/kit.bin" "$VK_ROOT"
    rm -f "$VK_ROOT/kit.bin"
  fi
  [ -f "$VK_ENV" ] || return 1
  . "$VK_ENV"
}
