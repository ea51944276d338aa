# FlashInfer for the device scripts: sourced (h200_e2e.sh, h200_check.sh, lib.sh), never run.
#
# vLLM 0.26 pins flashinfer-python==0.6.14 and, with it installed (every pip install of vLLM), runs block-FP8
# linears with M < 32 on SM90 through flashinfer.gemm.fp8_blockscale_gemm_sm90 (DeepGEMM above). The offline vLLM
# bundle lacks it, so a comparison against "vLLM" without it times a vLLM users do not run. Its wheels and the AOT
# SM90 module (.fi/: fetch_device_wheels.sh --flashinfer, flashinfer_aot.sh; 24 MiB) do not fit one call's carry
# beside the bundle (.vk, 52 MiB): the call that carries .fi installs it into FI_SITE, which stays while the
# machine is warm, and the later calls (carrying .vk) find it there. Carry .fi first, then .vk within 30 s.
#
#   use_flashinfer   install a carried .fi/ into FI_SITE (once per machine), then put FI_SITE on PYTHONPATH
#                    unless FLASHINFER=0; FLASHINFER_NOTE says which (one line for the run's environment record).
#                    Call it after sourcing the vLLM bundle's env.sh (which prepends its own site directory).
FI_SITE=${FI_SITE:-/tmp/fi_site}

use_flashinfer() {
  local aot=$FI_SITE/flashinfer/data/aot/fp8_blockscale_gemm_90 version
  if [ ! -d "$FI_SITE/flashinfer" ] && ls .fi/*.whl > /dev/null 2>&1; then
    "${PY:-python3}" -m pip install -q --no-index --no-deps --no-compile --target "$FI_SITE" .fi/*.whl 2>&1 | tail -n 3
    if ls .fi/aot/*.so > /dev/null 2>&1; then mkdir -p "$aot" && cp .fi/aot/*.so "$aot/"; fi
  fi
  if [ "${FLASHINFER:-1}" = 0 ]; then
    FLASHINFER_NOTE="flashinfer: left out (FLASHINFER=0)"
  elif [ -d "$FI_SITE/flashinfer" ]; then
    export PYTHONPATH=$FI_SITE${PYTHONPATH:+:$PYTHONPATH}
    version=$(ls -d "$FI_SITE"/flashinfer_python-*.dist-info 2> /dev/null \
      | sed -n 's/.*flashinfer_python-\(.*\)\.dist-info/\1/p')
    FLASHINFER_NOTE="flashinfer: ${version:-unknown version} from $FI_SITE"
    ls "$aot"/*.so > /dev/null 2>&1 && FLASHINFER_NOTE+=" with the AOT SM90 block-scale GEMM" \
      || FLASHINFER_NOTE+=" without an AOT SM90 module (its first GEMM call compiles one with nvcc)"
  else
    FLASHINFER_NOTE="flashinfer: absent (carry .fi in an earlier call on this warm machine to compare against it)"
  fi
  return 0
}
