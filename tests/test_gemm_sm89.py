"""The SM89 W8A8 block-FP8 GEMM (csrc/gemm/sm89/: mma.sync m16n8k32 e4m3) and the first-use self-check.

CPU tests (need only the compiled extension): the SM89 table and planner as host logic
(``gemm_table_rows`` / ``gemm_table_plan``), and the shapes it rejects.

GPU tests run every SM89 row as a forced row (``ops.gemm_table("sm89")``): on an Ada GPU that is its own table, on
the H200 the rows run from their sm_90a code. Numerics as tests/test_gemm.py (same FP8 tensor-core accumulation:
each 128-deep K block is accumulated by mma.sync, promoted once into fp32 with SFA * SFB, rounded once to the
output dtype), so the same derived tolerances apply: ``reference.assert_close_to_ref`` with the FP8-MMA floors
2^-11 (random signs) and 2^-10 (all-positive long K, where a lost per-block promotion would grow linearly).
Outputs are poisoned (the allocator's free blocks filled with NaN before each call), so an unwritten element fails.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch
from conftest import needs_kernels, poison_cuda_cache

from test_gemm import _operands  # the same operands as the SM90 tests: every scale differs

from vllm_blockfp8 import ops, reference

_BUILT = ops.HAS_CUDA_KERNELS and "sm89" in ops.build_info().get("families", {}).get("gemm", [])
needs_sm89_table = pytest.mark.skipif(not _BUILT, reason="needs the extension built with the SM89 GEMM (8.9)")


def _gpu_runs_sm89():
    if ops.kernels_unavailable_reason(None, True) is not None:
        return False
    cap = torch.cuda.get_device_capability()
    return _BUILT and cap in ((8, 9), (9, 0))


needs_sm89_gpu = pytest.mark.skipif(not _gpu_runs_sm89(),
                                    reason="needs a GPU run: an SM89 or SM90 GPU and the SM89 rows in the build")

ROWS = ["sm89_32x128x128_w1x4_s4", "sm89_64x128x128_w2x4_s4", "sm89_128x128x128_w2x4_s3"]
FP8_MMA_FLOOR = 2.0**-11
FP8_MMA_FLOOR_LONG_K = 2.0**-10


# ------------------------------------------------------------------------------------------------------------------
# CPU: the table and the planner
# ------------------------------------------------------------------------------------------------------------------

@needs_sm89_table
def test_table_rows():
    """Three rows in M order (32, 64, then unbounded), each with a reason."""
    rows = ops.gemm_table_rows("sm89")
    assert [r["name"] for r in rows] == ROWS
    assert [r["max_m"] for r in rows] == [32, 64, None]
    assert all(r["reason"] for r in rows)


@needs_sm89_table
@pytest.mark.parametrize("m,row", [(1, ROWS[0]), (32, ROWS[0]), (33, ROWS[1]), (64, ROWS[1]), (65, ROWS[2]),
                                   (4096, ROWS[2])])
def test_first_row_by_m(m, row):
    assert ops.gemm_table_plan("sm89", m, 4096, 4096, 58)["row"] == row


@needs_sm89_table
def test_k_slices_when_tiles_leave_sms_idle():
    """M = 1 on 58 SMs (an L4): N = 4096 gives 32 tiles of 32x128, so no slices (58 // 32 = 1); N = 1024 gives 8
    tiles: min(58 // 8, 32 K blocks // 4 per slice, 8) = 7 slices of ceil(32 / 7) = 5 K blocks (the last one 2).
    The workspace holds the fp32 partials, slices x m x n."""
    assert ops.gemm_table_plan("sm89", 1, 4096, 4096, 58)["plan"] == "data-parallel"
    p = ops.gemm_table_plan("sm89", 1, 1024, 4096, 58)
    assert p["plan"] == "K slices x7"
    assert p["workspace_bytes"] == 7 * 1 * 1024 * 4
    # Short K: each slice keeps >= 4 K blocks, so K = 512 never splits.
    assert ops.gemm_table_plan("sm89", 1, 1024, 512, 58)["plan"] == "data-parallel"
    # Enough tiles: no split.
    assert ops.gemm_table_plan("sm89", 4096, 4096, 4096, 58)["plan"] == "data-parallel"


@needs_sm89_table
def test_tile_order():
    """Several token tiles: groups of 8 along M (L2 reuse of the weight tile); one token tile: along N."""
    assert ops.gemm_table_plan("sm89", 4096, 4096, 4096, 58)["order"] == "along_m:8"
    assert ops.gemm_table_plan("sm89", 16, 4096, 4096, 58)["order"] == "along_n:1"


@needs_sm89_table
def test_any_n_and_forced_rows():
    """Any N >= 1 (ragged tails are predicated), every row forceable at any M."""
    for n in (1, 7, 129, 2112, 576):
        assert ops.gemm_table_plan("sm89", 83, n, 1024, 58)["row"] == ROWS[2]
    for i, name in enumerate(ROWS):
        assert ops.gemm_table_plan("sm89", 1000, 256, 512, 58, row=i)["row"] == name


@needs_sm89_table
@pytest.mark.parametrize("k", [100, 3884])
def test_rejects_k_not_multiple_of_128(k):
    with pytest.raises(ValueError):
        ops.gemm_table_plan("sm89", 16, 256, k, 58)


@needs_sm89_table
def test_self_check_state_starts_unchecked():
    states = ops.gemm_self_check("sm89")
    assert [s["name"] for s in states] == ROWS
    assert all(s["state"] == "unchecked" for s in states)


# ------------------------------------------------------------------------------------------------------------------
# GPU: every row forced
# ------------------------------------------------------------------------------------------------------------------

def _check(m, n, k, out_dtype, row, *, seed=0, positive=False):
    a, a_scale, b, b_scale = _operands(m, n, k, seed=seed, positive=positive)
    poison_cuda_cache(m * n * 2)
    with ops.gemm_table("sm89"):
        out = ops.blockfp8_gemm(a, a_scale, b, b_scale, out_dtype, row=row)
    assert out.dtype == out_dtype and out.shape == (m, n)
    ref = reference.gemm_ref(a, a_scale, b, b_scale)
    floor = FP8_MMA_FLOOR_LONG_K if positive else FP8_MMA_FLOOR
    reference.assert_close_to_ref(out, ref, f"row={row} M={m} N={n} K={k} {out_dtype}", abs_floor=floor)


@needs_sm89_gpu
@pytest.mark.parametrize("out_dtype", (torch.bfloat16, torch.float16), ids=str)
@pytest.mark.parametrize("m,n,k", [(1, 256, 512), (7, 576, 1024), (31, 264, 512), (83, 2112, 1024),
                                   (129, 250, 256), (1000, 7, 384), (4096, 1024, 1024)])
@pytest.mark.parametrize("row", ROWS)
def test_every_row_ragged(row, m, n, k, out_dtype):
    """Ragged M and N (odd N takes the element-wise stores), K slices where the tiles are few."""
    _check(m, n, k, out_dtype, row)


@needs_sm89_gpu
@pytest.mark.parametrize("row", ROWS)
def test_long_k_all_positive(row):
    """K = 16384, all-positive operands: a lost or repeated per-block promotion grows linearly."""
    _check(64, 512, 16384, torch.bfloat16, row, positive=True)


@needs_sm89_gpu
@pytest.mark.parametrize("m", [1, 16, 32, 64, 65, 256, 4096])
def test_selected_row(m):
    """The planner's own row at M from 1 to 4096 on a real layer shape."""
    _check(m, 4096, 4096, torch.bfloat16, None, seed=m)


@needs_sm89_gpu
@pytest.mark.parametrize("row", ROWS)
def test_cuda_graph_capture(row):
    """A forced row captured in a CUDA graph (K slices included at M = 1) replays to the eager result."""
    m, n, k = (1, 1024, 4096) if row == ROWS[0] else (100, 1024, 4096)
    a, a_scale, b, b_scale = _operands(m, n, k, seed=3)
    with ops.gemm_table("sm89"):
        eager = ops.blockfp8_gemm(a, a_scale, b, b_scale, torch.bfloat16, row=row)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = ops.blockfp8_gemm(a, a_scale, b, b_scale, torch.bfloat16, row=row)
    out.fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(out, eager), "graph replay differs from the eager call (deterministic kernels)"


_FALLBACK_SCRIPT = r"""
import json, sys, torch
from vllm_blockfp8 import ops, reference
row = sys.argv[1]
g = torch.Generator(device="cuda").manual_seed(0)
x = torch.randn(40, 1024, device="cuda", generator=g).to(torch.bfloat16)
w = torch.randn(300, 1024, device="cuda", generator=g) * 0.05
b, b_scale = reference.quantize_block_fp8(w)
a, a_scale = ops.per_token_group_quant(x)
with ops.gemm_table("sm89"):
    outs = [ops.blockfp8_gemm(a, a_scale, b, b_scale, torch.bfloat16, row=row) for _ in range(2)]
    lin = ops.blockfp8_linear(x, b, b_scale, row=1)
ref = reference.gemm_ref(a, a_scale, b, b_scale)
for o in outs:
    reference.assert_close_to_ref(o, ref, "fallback gemm", abs_floor=2.0**-11)
ref_lin = x.double() @ reference.dequantize_block_fp8(b, b_scale).double().t()
err = ((lin.double() - ref_lin).norm() / ref_lin.norm()).item()
print(json.dumps({"states": ops.gemm_self_check("sm89"), "linear_rel_err": err}))
"""


@needs_sm89_gpu
def test_self_check_fallback_on_forced_mismatch():
    """BLOCKFP8_SELF_CHECK=always checks the forced SM89 rows on this GPU too; the corrupt switch makes the
    64-token row's check fail: exactly one warning naming it, the row marked failed, and the results still right
    (the GEMM op runs the reference kernel, the linear op dequantizes + cuBLAS)."""
    row = ROWS[1]
    env = dict(os.environ, BLOCKFP8_SELF_CHECK="always", BLOCKFP8_SELF_CHECK_CORRUPT=row)
    proc = subprocess.run([sys.executable, "-c", _FALLBACK_SCRIPT, row], capture_output=True, text=True, env=env,
                          timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    warnings = [line for line in proc.stderr.splitlines() if "failed its first-use self-check" in line]
    assert len(warnings) == 1 and row in warnings[0], proc.stderr[-4000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    states = {s["name"]: s["state"] for s in out["states"]}
    assert states[row] == "failed"
    assert out["linear_rel_err"] < 2.0**-6


@needs_sm89_gpu
def test_self_check_passes_every_row():
    """BLOCKFP8_SELF_CHECK=always, no corruption: every row that runs passes its check."""
    script = r"""
import json, torch
from vllm_blockfp8 import ops, reference
a, a_scale = ops.per_token_group_quant(torch.randn(8, 512, device="cuda").to(torch.bfloat16))
b, b_scale = reference.quantize_block_fp8(torch.randn(256, 512, device="cuda") * 0.05)
with ops.gemm_table("sm89"):
    for r in range(3):
        ops.blockfp8_gemm(a, a_scale, b, b_scale, torch.bfloat16, row=r)
print(json.dumps(ops.gemm_self_check("sm89")))
"""
    env = dict(os.environ, BLOCKFP8_SELF_CHECK="always")
    env.pop("BLOCKFP8_SELF_CHECK_CORRUPT", None)
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    states = json.loads(proc.stdout.strip().splitlines()[-1])
    assert [s["state"] for s in states] == ["passed"] * 3, states
    assert "self-check" not in proc.stderr
