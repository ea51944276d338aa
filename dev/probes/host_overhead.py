"""Host time per eager op call against its GPU time, for the linears of one prefill step.

    python dev/probes/host_overhead.py [--m 16384] [--calls 50] [--json PATH]

vLLM runs prefill chunks outside CUDA graphs (its capture sizes stop far below a 16384-token
chunk), so every linear pays its host side (argument checks, row selection, allocations, the
CUTLASS adapter's TMA descriptors) at every call. That is free while the host stays ahead of the
GPU and costs GPU idle time where it does not (e.g. right after each step's synchronization).
This measures, per Qwen3-8B linear shape: the host time to submit one call (back-to-back calls,
no synchronization, perf_counter over the loop) and the GPU time per call (CUDA events over the
same loop after a synchronization), for blockfp8_linear, its layers (the registered linear op
without the Python checks, as vLLM's compiled graph calls it; the quantizer op; the GEMM op) and,
as the yardstick, cuBLAS bf16 (torch.mm on the dequantized weight). Host/GPU near or above 1
means that op alone would starve the GPU. Weights are the same tensor at every call (the host
side, not HBM, is the question).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from vllm_blockfp8 import ops, reference, shapes  # noqa: E402


def measure(fn, calls: int) -> tuple[float, float]:
    """(host us per call, GPU us per call) of `calls` back-to-back eager calls."""
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    t0 = time.perf_counter()
    start.record()
    for _ in range(calls):
        fn()
    end.record()
    host_us = (time.perf_counter() - t0) * 1e6 / calls
    torch.cuda.synchronize()
    return host_us, start.elapsed_time(end) * 1e3 / calls


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--m", default="16384,1024", help="comma-separated token counts")
    ap.add_argument("--calls", type=int, default=50)
    ap.add_argument("--json", type=Path)
    a = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("host_overhead: needs a CUDA GPU", file=sys.stderr)
        return 2
    rows = []
    print(f"{'shape':<18} {'M':>6} {'op':<11} {'host us':>9} {'GPU us':>9} {'host/GPU':>9}")
    for shape in shapes.QWEN3_8B:
        n, k = shape.n, shape.k
        b, b_scale = reference.quantize_block_fp8(torch.randn(n, k, device="cuda"))
        w16 = reference.dequantize_block_fp8(b, b_scale).to(torch.bfloat16).t()
        for m in (int(x) for x in a.m.split(",")):
            x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
            q, s = ops.per_token_group_quant(x)
            # The op's layers, from the Python entry point down: the first includes the Python
            # checks, `linear_op` is what vLLM's compiled graph calls (no Python checks), and the
            # quantizer and GEMM ops are the two launches inside it.
            for op, fn in (("blockfp8", lambda: ops.blockfp8_linear(x, b, b_scale)),
                           ("linear_op", lambda: torch.ops.blockfp8.linear(x, b, b_scale, None, -1)),
                           ("quant_op", lambda: torch.ops.blockfp8.per_token_group_quant(x, 128, -1)),
                           ("gemm_op", lambda: torch.ops.blockfp8.gemm(q, s, b, b_scale, torch.bfloat16, -1)),
                           ("cublas_bf16", lambda: torch.mm(x, w16))):
                host, gpu = measure(fn, a.calls)
                rows.append(dict(shape=shape.name, m=m, n=n, k=k, op=op, host_us=host, gpu_us=gpu))
                print(f"{shape.name:<18} {m:>6} {op:<11} {host:>9.1f} {gpu:>9.1f} {host / gpu:>9.3f}")
    if a.json:
        a.json.write_text(json.dumps(dict(gpu=torch.cuda.get_device_name(), torch=torch.__version__,
                                          rows=rows), indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
