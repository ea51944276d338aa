"""The SM120 W8A8 block-scaled FP8 GEMM (csrc/gemm/sm120/: CUTLASS 4.2's SM120 blockwise collective).

Two parts:

* Host logic (the table, its M buckets, what it rejects): runs wherever the extension was built with the
  SM120 table (CI builds it without a GPU), through ``ops.gemm_table_rows("sm120")`` and
  ``ops.gemm_table_plan("sm120", ...)``.
* Every row against the float64 reference (``reference.gemm_ref``) on an SM120 GPU: small and ragged M
  and N, model shapes, long K with all-positive operands, CUDA-graph capture. These skip with the reason
  unless an SM120 GPU and the extension are present. The rows have never run on SM120 hardware
  (gemm/sm120/NOTES.md): these tests are the first check when one is available.

Numerics: as tests/test_gemm.py (whose operand builder and tolerance this file reuses). Each 128-deep K block
is accumulated by mma.sync into a fresh fp32 fragment and promoted with the two fp32 scales, then rounded
once: bf16 with random signs meets ``reference.assert_close_to_ref`` as it is (elementwise u |ref| +
u/16 max|ref|, norm-wise u, u = 2^-8); fp16, and all-positive K = 16384, get the absolute floor of FP8
tensor-core accumulation inside a block (2^-11 / 2^-10 of max|ref|). Those floors were measured on the H200's
wgmma; SM120's mma.sync FP8 accumulation has not been measured here, so a first SM120 run that lands between
the floor and a clear failure means the floor is to be re-derived there, not widened blindly.
"""

from __future__ import annotations

import pytest
import torch
from conftest import needs_kernels, poison_cuda_cache

from vllm_blockfp8 import ops, reference, shapes

NAMES = ["sm120_swapab_128x32x128", "sm120_swapab_128x64x128", "sm120_coop_128x128x128"]
SMS = 170  # RTX 5090 (the plan does not depend on it yet; pinned so the expectations never move with a GPU)


def _sm120_rows():
    if not ops.HAS_CUDA_KERNELS:
        return None
    return ops.gemm_table_rows("sm120")


_ROWS = _sm120_rows()
host = pytest.mark.skipif(not _ROWS, reason="needs the extension built with the SM120 table "
                          "(TORCH_CUDA_ARCH_LIST with 12.0a)" if ops.HAS_CUDA_KERNELS else
                          "needs the compiled extension vllm_blockfp8._C (installed without nvcc)")


def _plan(m, n=2112, k=7168, row=-1):
    return ops.gemm_table_plan("sm120", m, n, k, SMS, row=row)


# ---------------------------------------------------------------------------------------------------------------
# Host logic (no GPU)
# ---------------------------------------------------------------------------------------------------------------

@host
def test_table_rows_buckets_and_reasons():
    """Three rows in M order, the last unbounded; each reason names the SM120 constraint it follows."""
    assert [r["name"] for r in _ROWS] == NAMES, _ROWS
    assert [r["max_m"] for r in _ROWS] == [32, 64, None], _ROWS
    for r in _ROWS:
        assert len(r["reason"]) > 40, r
    assert "whole 128-row weight scale blocks" in _ROWS[0]["reason"], _ROWS[0]
    assert "99 KiB" in _ROWS[2]["reason"], _ROWS[2]


@host
@pytest.mark.parametrize("m, want", [(1, 0), (7, 0), (32, 0), (33, 1), (64, 1), (65, 2), (83, 2), (128, 2),
                                     (4096, 2), (1 << 20, 2)])
def test_selection_by_m_bucket(m, want):
    plan = _plan(m)
    assert plan["row"] == NAMES[want], (m, plan)
    # K whole, CUTLASS's persistent tile order, no dependent launch, no scratch (persistent scheduler).
    assert plan["plan"] == "data-parallel" and plan["order"] == "heuristic:1", plan
    assert plan["workspace_bytes"] == 0 and plan["pdl"] is False and plan["tile_n"] == 0, plan


@host
@pytest.mark.parametrize("n, k", [(8, 128), (576, 7168), (2112, 7168), (4104, 384), (24576, 1536)])
def test_ragged_n_and_short_k_are_taken(n, k):
    """Ragged N (weight scale rows predicated at ceil(n / 128), TMA zero-fill), ragged M, k = 128."""
    for m in (1, 7, 83, 300):
        assert _plan(m, n, k)["row"] in NAMES, (m, n, k)


@host
@pytest.mark.parametrize("row", range(3))
def test_every_row_can_be_forced(row):
    assert _plan(1, row=row)["row"] == NAMES[row]
    assert _plan(5000, row=row)["row"] == NAMES[row]


@host
@pytest.mark.parametrize("n", (4, 100, 2110))
def test_rejects_output_rows_that_tma_cannot_store(n):
    with pytest.raises(ValueError, match="multiple of 8"):
        _plan(16, n, 512)


@host
def test_rejects_scale_layouts_past_int32():
    """The CUTLASS scale layouts carry int32 strides: ceil(n / 128) * k / 128 and a_scale_ld * k / 128."""
    with pytest.raises(ValueError, match="fit in int32"):
        _plan(1, 1 << 30, 1 << 20)
    with pytest.raises(ValueError, match="fit in int32"):
        _plan(1 << 26, 256, 1 << 12)


@host
def test_rejects_k_not_a_multiple_of_128_and_bad_rows():
    with pytest.raises(ValueError, match="multiple of 128"):
        _plan(16, 256, 3884)
    with pytest.raises(ValueError, match="out of range"):
        _plan(16, 256, 512, row=3)


# ---------------------------------------------------------------------------------------------------------------
# Every row on an SM120 GPU against the reference
# ---------------------------------------------------------------------------------------------------------------

_RUNNABLE = ops.kernels_unavailable_reason(capability=(12, 0)) is None
gpu = needs_kernels(capability=(12, 0))
GPU_ROWS = NAMES if _RUNNABLE else []
OUT_DTYPES = (torch.bfloat16, torch.float16)
SMALL = tuple(s for s in shapes.SMALL if s.n % 8 == 0)
MODEL = (shapes.by_name("qwen3-8b.qkv"), shapes.by_name("dsv3.2112x7168"))


def _gemm_helpers():
    from test_gemm import _assert_close, _operands  # the SM90 tests' operand builder and derived tolerance

    return _operands, _assert_close


def _check(m, n, k, out_dtype, row, *, seed=0, positive=False):
    operands, assert_close = _gemm_helpers()
    a, a_scale, b, b_scale = operands(m, n, k, seed=seed, positive=positive)
    poison_cuda_cache(m * n * 2)
    out = ops.blockfp8_gemm(a, a_scale, b, b_scale, out_dtype, row=row)
    assert out.dtype == out_dtype and out.shape == (m, n)
    ref = reference.gemm_ref(a, a_scale, b, b_scale)
    assert_close(out, ref, f"sm120 row={row} M={m} N={n} K={k} {out_dtype}", long_k=positive)
    _assert_row_answered(row if row is not None else ops.selected_row("gemm", m, n, k))


def _assert_row_answered(row):
    """The row itself answered: a row that failed its first-use check yields to the reference kernel, which meets
    the same bound, so the output alone cannot tell."""
    states = {r["name"]: r for r in ops.gemm_self_check("sm120")}
    assert states[row]["state"] == "passed", f"{row} did not serve the call: {states[row]}"


@gpu
def test_device_table_is_the_sm120_table():
    assert [r["name"] for r in ops.tile_table("gemm")] == NAMES


@gpu
@pytest.mark.parametrize("out_dtype", OUT_DTYPES)
@pytest.mark.parametrize("shape", SMALL, ids=lambda s: s.name)
@pytest.mark.parametrize("m", (1, 3, 7, 32, 33, 64, 83, 128, 300))
@pytest.mark.parametrize("row", GPU_ROWS)
def test_every_row_small_and_ragged(row, m, shape, out_dtype):
    _check(m, shape.n, shape.k, out_dtype, row)


@gpu
@pytest.mark.parametrize("out_dtype", OUT_DTYPES)
@pytest.mark.parametrize("shape", MODEL, ids=lambda s: s.name)
@pytest.mark.parametrize("m", (1, 64, 1000))
@pytest.mark.parametrize("row", GPU_ROWS)
def test_every_row_model_shapes(row, m, shape, out_dtype):
    _check(m, shape.n, shape.k, out_dtype, row)


@gpu
@pytest.mark.parametrize("m", (1, 7, 40, 83, 129, 4096))
def test_selected_row(m):
    _check(m, 2112, 1024, torch.bfloat16, None)


@gpu
@pytest.mark.parametrize("m", (5, 83))
@pytest.mark.parametrize("row", GPU_ROWS)
def test_long_k_all_positive(row, m):
    """K = 16384, all-positive: a lost per-block fp32 promotion grows linearly instead of averaging out."""
    _check(m, 576, 16384, torch.bfloat16, row, positive=True)


@gpu
@pytest.mark.parametrize("m", (5, 300))
@pytest.mark.parametrize("row", GPU_ROWS)
def test_cuda_graph_replay(row, m):
    """Captured once, replayed on new inputs written in place."""
    from test_gemm import check_graph_replay

    check_graph_replay(row, m, "sm120 graph replay")
