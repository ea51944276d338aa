"""The SM90 GEMM that quantizes its own activations (csrc/gemm/sm90_fused_quant.cuh), through the linear op.

The fused kernel must write the standalone quantizer's bits and then run the same GEMM on them, so the linear op
with ``set_sm90_fused_quant("1")`` must give exactly the bits of the two-launch path (``"0"``): a wrong unit, a
row past M, a scale in the wrong column, a K block read before it was written or a counter left set by the
previous call all change bits. Each case also checks that the fused path was taken (the selected row fuses, and
the kernel wrote the quantized operands somewhere the plain path never does), and one checks the float64
reference. Outputs are poisoned (NaN) before every call.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import poison_cuda_cache

from vllm_blockfp8 import ops, reference

_RUNNABLE = (torch.cuda.is_available() and torch.cuda.get_device_capability() == (9, 0)
             and ops.HAS_CUDA_KERNELS)
pytestmark = pytest.mark.skipif(
    not _RUNNABLE,
    reason="needs an SM90 (Hopper) GPU and the compiled extension (vllm_blockfp8._C with the sm90 GEMM)",
)

FP8_MMA_FLOOR = 2.0 ** -11  # test_gemm.py's floor for FP8 tensor-core accumulation (random signs)

# (M, N, K): both fusing rows (the 64x3-epilogue row at K <= 4096 from M = 1024, the plain 128x128 row elsewhere),
# ragged M (a partial last M block, and partial 8-row units), ragged N (2112: 17 weight tiles, a padding cluster
# tile along M at odd M blocks), several waves, long K.
CASES = (
    (1024, 4096, 4096),
    (1024, 2112, 2048),
    (1100, 576, 2048),
    (2053, 4096, 1024),
    (4096, 6144, 4096),
    (1000, 4096, 7168),
    (512, 6144, 12288),
)


def _weight(n: int, k: int, seed: int):
    g = torch.Generator(device="cuda").manual_seed(seed)
    w = torch.randn(n, k, device="cuda", generator=g)
    b, b_scale = reference.quantize_block_fp8(w)
    return b, b_scale


def _activations(m: int, k: int, dtype, seed: int):
    """Magnitudes vary per token and per 128-wide group, so every activation scale differs."""
    g = torch.Generator(device="cuda").manual_seed(seed)
    x = torch.randn(m, k, device="cuda", generator=g)
    x *= torch.rand(m, 1, device="cuda", generator=g) * 4 + 0.25
    x *= (torch.rand(1, k // 128, device="cuda", generator=g) * 4 + 0.25).repeat_interleave(128, dim=1)
    return x.to(dtype)


def _linear(x, b, b_scale, mode: str):
    poison_cuda_cache(x.shape[0] * b.shape[0] * 2, x.numel())
    with ops.sm90_fused_quant(mode):
        return ops.blockfp8_linear(x, b, b_scale)


@pytest.mark.parametrize("dtype", (torch.bfloat16, torch.float16))
@pytest.mark.parametrize("m,n,k", CASES)
def test_fused_linear_gives_the_two_launch_bits(m, n, k, dtype):
    plan = ops.gemm_k_plan(-1, m, n, k)
    assert plan["fuses_quant"], f"{plan['row']} was expected to fuse at M={m} N={n} K={k}"
    b, b_scale = _weight(n, k, seed=n + k)
    x = _activations(m, k, dtype, seed=m)
    want = _linear(x, b, b_scale, "0")
    got = _linear(x, b, b_scale, "1")
    assert not torch.isnan(got).any(), "the fused linear left output elements unwritten"
    assert torch.equal(got.view(torch.int16), want.view(torch.int16)), (
        f"fused != two-launch bits at M={m} N={n} K={k} ({plan['row']}): "
        f"{(got != want).sum().item()} of {got.numel()} differ")


def test_fused_linear_against_the_reference():
    m, n, k = 1000, 4096, 7168
    b, b_scale = _weight(n, k, seed=3)
    x = _activations(m, k, torch.bfloat16, seed=4)
    got = _linear(x, b, b_scale, "1")
    reference.assert_close_to_ref(got, reference.linear_ref(x, b, b_scale, quantize_activations=True),
                                  "fused linear", abs_floor=FP8_MMA_FLOOR)


def test_fused_linear_replays_from_a_graph():
    """Captured: the counters' memset is a node of the graph, so every replay starts from zero counters and
    quantizes the activations as they are at replay time."""
    m, n, k = 2053, 2112, 4096
    b, b_scale = _weight(n, k, seed=5)
    x = _activations(m, k, torch.bfloat16, seed=6)
    with ops.sm90_fused_quant("1"):
        ops.blockfp8_linear(x, b, b_scale)  # warm up outside the capture
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            captured = ops.blockfp8_linear(x, b, b_scale)
    for seed in (7, 8, 9):
        x.copy_(_activations(m, k, torch.bfloat16, seed=seed))
        captured.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        want = _linear(x, b, b_scale, "0")
        assert torch.equal(captured.view(torch.int16), want.view(torch.int16)), f"replay with activations {seed}"


def test_misaligned_rows_fall_back_to_the_two_launch_path():
    """A contiguous x that starts 2 bytes past 16-byte alignment cannot be read by the fused kernel's 16-byte
    copies; the linear takes the two-launch path (whose quantizer copies it first), with the same bits."""
    m, n, k = 1024, 2112, 2048
    b, b_scale = _weight(n, k, seed=10)
    flat = torch.empty(m * k + 8, dtype=torch.bfloat16, device="cuda")
    x = flat[1:1 + m * k].view(m, k)
    x.copy_(_activations(m, k, torch.bfloat16, seed=11))
    assert x.is_contiguous() and x.data_ptr() % 16 != 0
    want = _linear(x.contiguous(), b, b_scale, "0")
    got = _linear(x, b, b_scale, "1")
    assert torch.equal(got.view(torch.int16), want.view(torch.int16))


def test_fused_path_is_logged():
    """BLOCKFP8_LOG_ROWS names the fused launch (`gemm+quant`), so the cases above did run the fused kernel."""
    here = Path(__file__).resolve().parent
    path = os.pathsep.join(p for p in (str(here.parent), os.environ.get("PYTHONPATH", "")) if p)
    code = ("import torch\nfrom vllm_blockfp8 import ops\n"
            "x = torch.randn(1024, 2048, device='cuda').bfloat16()\n"
            "b = torch.randn(2112, 2048, device='cuda').to(torch.float8_e4m3fn)\n"
            "s = torch.ones(17, 16, device='cuda')\n"
            "ops.blockfp8_linear(x, b, s)\ntorch.cuda.synchronize()\n")
    env = dict(os.environ, PYTHONPATH=path, BLOCKFP8_LOG_ROWS="1", BLOCKFP8_SM90_FUSED_QUANT="1")
    run = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=600,
                         cwd=str(here))
    assert run.returncode == 0, run.stderr
    assert "gemm+quant N=2112 K=2048 M=1024" in run.stderr, run.stderr
