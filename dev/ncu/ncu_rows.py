"""One forced launch per (family, row, shape) for Nsight Compute on the GPU machine.

    ncu --kernel-name regex:'mma_kernel|per_token_group|device_kernel|fragment_kernel|wgmma_kernel' \
        --clock-control none --section SpeedOfLight --section WarpStateStats ... python dev/ncu/ncu_rows.py \
        gemv:gemv_mma_t8:1x2112x7168 quant:quant_lane16_rcp:4096x0x7168 \
        gemm:sm90_coop_128x128x128_c2x1_ovl:4096x4096x7168 nvfp4:fp4_gemv_mma_t8_ks8:1x24576x4096

Each spec is FAMILY:ROW:MxNxK (bf16 activations); nvfp4 runs the weight as the vLLM layer stores it
(ops.nvfp4_layer_weight: the fragment packing on SM90), one global scale per row. The operands are made
first (their own kernels do not match the filter above), then the op runs once, so each spec is one
profiled launch and the report lists them in argument order. ncu's default cache control flushes L2 before every replay
pass, which is the cold-L2 state the benchmarks time.
"""

from __future__ import annotations

import sys

import torch

from vllm_blockfp8 import ops, reference


def run(spec: str) -> None:
    family, row, dims = spec.split(":")
    m, n, k = (int(v) for v in dims.split("x"))
    g = torch.Generator(device="cuda").manual_seed(m + n + k)
    x = torch.randn(m, k, device="cuda", generator=g).to(torch.bfloat16)
    if family == "quant":
        torch.cuda.synchronize()
        ops.per_token_group_quant(x, 128, row=row)
    elif family == "nvfp4":
        packed, scale, global_scale = reference.quantize_nvfp4(torch.randn(n, k, device="cuda", generator=g))
        b, b_scale, packing = ops.nvfp4_layer_weight(packed, scale)
        global_scale = global_scale.reshape(1).expand(n).contiguous()
        torch.cuda.synchronize()
        ops.nvfp4_linear(x, b, b_scale, global_scale, row=row, packing=packing)
    else:
        b, bs = reference.quantize_block_fp8(torch.randn(n, k, device="cuda", generator=g))
        if family == "gemv":
            torch.cuda.synchronize()
            ops.blockfp8_gemv(x, b, bs, row=row)
        else:
            a, a_scale = ops.per_token_group_quant(x, 128)
            torch.cuda.synchronize()
            ops.blockfp8_gemm(a, a_scale, b, bs, torch.bfloat16, row=row)
    torch.cuda.synchronize()
    print(f"ncu_rows: ran {spec}", flush=True)


def main(argv: list[str]) -> int:
    if not (torch.cuda.is_available() and ops.HAS_CUDA_KERNELS):
        print("ncu_rows: needs a CUDA GPU and the compiled extension", file=sys.stderr)
        return 2
    for spec in argv:
        run(spec)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
