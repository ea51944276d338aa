"""GPU tests of the weight-only block-FP8 GEMV (csrc/gemv): every tile row, both dtypes.

Numerics: e4m3 -> f16/bf16 is exact and 16-bit products are exact in fp32, so a kernel differs
from the float64 reference (reference.gemv_ref) only by its fp32 accumulation order and the one
rounding of the output to x's dtype; reference.assert_close_to_ref bounds exactly that, element
by element and in norm. The long-K case (K = 16384, all-positive operands, so nothing cancels)
is where a partial sum kept in 16 bits, or a block scale applied to the wrong block, shows.

Poisoning: the op allocates its output, so each call first fills a freed block of the output's
size with NaN bytes (conftest.poison_cuda_cache); the caching allocator hands that block back as
the output, and assert_close_to_ref fails on any element the kernel left unwritten.
"""

from __future__ import annotations

import functools
import re

import pytest
import torch
from conftest import needs_kernels, poison_cuda_cache

from vllm_blockfp8 import ops, reference, shapes

pytestmark = needs_kernels()

DTYPES = (torch.bfloat16, torch.float16)
QWEN3 = shapes.by_name("qwen3-8b.o")
KV_A = shapes.by_name("dsv3.kv_a.576x7168")
# K with a partial last 128-block, K % 64 != 0 (FMA rows only), N ragged against 16 and 128; a
# ragged N with K long enough for the whole-line row (3 chunks per warp).
RAGGED_K = (
    shapes.WeightShape("ragged_k.304x1040", 304, 1040),
    shapes.WeightShape("ragged_k.4100x208", 4100, 208),
    shapes.WeightShape("ragged_kb.136x192", 136, 192),
    shapes.WeightShape("ragged_n.1000x6144", 1000, 6144),
)
SHAPES = shapes.SMALL + (QWEN3,) + RAGGED_K
ALL_M = tuple(range(1, 17)) + (17, 31, 64)
FORCED_M = (1, 2, 3, 5, 8, 9, 13, 16, 17, 31, 64, 83)


@functools.lru_cache(maxsize=None)
def _table():
    return tuple(ops.tile_table("gemv")) if torch.cuda.is_available() and ops.HAS_CUDA_KERNELS else ()


ROW_NAMES = [r["name"] for r in _table()]


def _row_accepts(name: str, m: int, n: int, k: int) -> bool:
    """The rows' preconditions (csrc/gemv/sm80.cu) for 16-byte aligned x.

    Kept here so a forced row is skipped only where it should be: test_rejected_rows_raise checks
    that the op refuses exactly the complement.
    """
    tokens = re.match(r"gemv_mma_t(\d+)", name)  # gemv_mma_t<tokens>[_<variant>]
    if tokens:
        fits = m <= int(tokens.group(1)) and k % 64 == 0
        if name.endswith("_ks32"):  # only grids of <= one 16-column tile per SM
            fits = fits and -(-n // 16) <= torch.cuda.get_device_properties(0).multi_processor_count
        if name.endswith("_lines"):  # whole lines, >= 3 per warp, not on a pinned grid
            ks = 8 if n >= 8192 else 16
            sms = torch.cuda.get_device_properties(0).multi_processor_count
            pinned = ops.gemv_pins_residency(-(-n // 16), sms, ks, 1)  # unit-tested on its own
            fits = fits and k % 128 == 0 and k // 128 >= 3 * ks and not pinned
        return fits
    if name == "gemv_fma_r1_c4_u4":
        return n >= 4096
    return True


@functools.lru_cache(maxsize=None)
def _weight(n: int, k: int, positive: bool = False, seed: int = 0):
    g = torch.Generator(device="cuda").manual_seed(seed * 1000003 + n * 31 + k)
    w = torch.randn(n, k, device="cuda", generator=g)
    return reference.quantize_block_fp8(w.abs() if positive else w)


def _x(m: int, k: int, dtype, positive: bool = False, seed: int = 1) -> torch.Tensor:
    g = torch.Generator(device="cuda").manual_seed(seed * 7919 + m * 131 + k)
    x = torch.randn(m, k, device="cuda", generator=g)
    return (x.abs() if positive else x).to(dtype)


def _gemv_poisoned(x, b, b_scale, row=None) -> torch.Tensor:
    poison_cuda_cache(x.shape[0] * b.shape[0] * x.element_size())
    return ops.blockfp8_gemv(x, b, b_scale, row=row)


def _check(x, b, b_scale, row=None, what="gemv"):
    out = _gemv_poisoned(x, b, b_scale, row)
    assert out.dtype == x.dtype and out.shape == (x.shape[0], b.shape[0])
    reference.assert_close_to_ref(out, reference.gemv_ref(x, b, b_scale), what)
    return out


# --------------------------------------------------------------------------------------------
# The table
# --------------------------------------------------------------------------------------------


def test_table_rows():
    rows = _table()
    assert rows, "the gemv tile table is empty"
    names = [r["name"] for r in rows]
    assert len(set(names)) == len(names), f"duplicate row names {names}"
    for r in rows:
        assert r["name"].startswith("gemv_") and r["reason"].strip(), r
    assert rows[-1]["max_m"] is None, "the last row must be unbounded in M"
    assert all(r["max_m"] is not None for r in rows[:-1])


@pytest.mark.parametrize("m", ALL_M)
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: s.name)
def test_selection_follows_table(shape, m):
    """The op picks the first row with max_m >= M whose precondition holds."""
    want = next(r["name"] for r in _table()
                if (r["max_m"] is None or m <= r["max_m"]) and _row_accepts(r["name"], m, shape.n, shape.k))
    assert ops.selected_row("gemv", m, shape.n, shape.k) == want


# --------------------------------------------------------------------------------------------
# Correctness: selected and forced rows
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("m", ALL_M)
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: s.name)
def test_selected_row(shape, m, dtype):
    b, s = _weight(shape.n, shape.k)
    _check(_x(m, shape.k, dtype), b, s)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("m", FORCED_M)
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: s.name)
@pytest.mark.parametrize("row", ROW_NAMES)
def test_forced_row(row, shape, m, dtype):
    if not _row_accepts(row, m, shape.n, shape.k):
        pytest.skip(f"{row} does not take M={m} N={shape.n} K={shape.k}")
    b, s = _weight(shape.n, shape.k)
    _check(_x(m, shape.k, dtype), b, s, row=row, what=f"{row} M={m} {shape.name}")


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("row", ROW_NAMES)
def test_every_row_runs_on_a_model_shape(row, dtype):
    """Every row runs at M = 1 on a real model shape: qwen3-8b.o, or DeepSeek-V3's kv_a 576x7168
    for rows limited to grids of <= one tile per SM. No row ships unrun."""
    shape = next(s for s in (QWEN3, KV_A) if _row_accepts(row, 1, s.n, s.k))
    b, s = _weight(shape.n, shape.k)
    _check(_x(1, shape.k, dtype), b, s, row=row, what=f"{row} {shape.name}")


@pytest.mark.parametrize("m", (1, 9, 16, 17))
@pytest.mark.parametrize("row", ROW_NAMES)
def test_rejected_rows_raise(row, m):
    """Forcing a row outside its precondition is an error, never a wrong answer."""
    cases = [(QWEN3.n, QWEN3.k), (304, 1040), (2112, 2048)]
    for n, k in cases:
        b, s = _weight(n, k)
        x = _x(m, k, torch.bfloat16)
        if _row_accepts(row, m, n, k):
            _check(x, b, s, row=row, what=f"{row} M={m} N={n} K={k}")
        else:
            with pytest.raises((RuntimeError, ValueError), match="cannot run"):
                ops.blockfp8_gemv(x, b, s, row=row)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("m", (1, 4, 16))
@pytest.mark.parametrize("row", [None] + ROW_NAMES)
def test_long_k_all_positive(row, m, dtype):
    n, k = 4104, 16384  # N >= 4096 so every row takes it; 4104 leaves a ragged 16-column tile
    if row is not None and not _row_accepts(row, m, n, k):
        pytest.skip(f"{row} does not take M={m}")
    b, s = _weight(n, k, positive=True)
    _check(_x(m, k, dtype, positive=True), b, s, row=row, what=f"long K {row} M={m}")


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("m", (1, 5, 8))
@pytest.mark.parametrize("ragged", (0, 5))
def test_residency_pinned_kernel(ragged, m, dtype):
    """N just past 2 blocks of 16 columns per SM runs the residency-pinned entry point."""
    sm = torch.cuda.get_device_properties(0).multi_processor_count
    n = 16 * (2 * sm + 1) + ragged
    if n >= 8192:
        pytest.skip(f"{sm} SMs put the window at N >= 8192, where the 8-warp K split never pins")
    assert ops.gemv_pins_residency(-(-n // 16), sm, 16, 1)
    b, s = _weight(n, 1024)
    _check(_x(m, 1024, dtype), b, s, row="gemv_mma_t8", what=f"pinned N={n} M={m}")


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("m", (1, 8, 16))
def test_ksplit8_wide_n(m, dtype):
    """N >= 8192 takes the 8-warp K split; N = 8200 also leaves a ragged 16-column tile."""
    b, s = _weight(8200, 512)
    _check(_x(m, 512, dtype), b, s, what=f"N=8200 M={m}")


# --------------------------------------------------------------------------------------------
# Layouts, sizes, bad input
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("m", (1, 8, 16, 17))
def test_row_strided_x(m, dtype):
    """x as a view with a padded row stride (rows still 16-byte aligned): every row takes it."""
    n, k = 384, 1024
    b, s = _weight(n, k)
    x = _x(m, k + 64, dtype)[:, :k]
    assert x.stride(0) == k + 64
    for row in [None] + ROW_NAMES:
        if row is None or _row_accepts(row, m, n, k):
            _check(x, b, s, row=row, what=f"strided x {row}")


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("m", (1, 4, 16))
def test_misaligned_x_uses_fallback_row(m, dtype):
    """x rows only 2-byte aligned: the unbounded row takes them, the vector-load rows refuse."""
    n, k = 384, 1024
    b, s = _weight(n, k)
    x = _x(m, k + 8, dtype)[:, 1:1 + k]
    assert x.data_ptr() % 16 != 0
    _check(x, b, s, what="misaligned x")
    _check(x, b, s, row=ROW_NAMES[-1], what="misaligned x, last row")
    with pytest.raises((RuntimeError, ValueError), match="cannot run"):
        ops.blockfp8_gemv(x, b, s, row=ROW_NAMES[0])


@pytest.mark.parametrize("m,n", [(0, 256), (3, 0)])
def test_empty(m, n):
    k = 256
    b, s = reference.quantize_block_fp8(torch.randn(n, k, device="cuda"))
    out = ops.blockfp8_gemv(torch.randn(m, k, device="cuda", dtype=torch.bfloat16), b, s)
    assert out.shape == (m, n)


def test_bad_inputs_raise_value_error():
    n, k = 256, 512
    b, s = _weight(n, k)
    x = _x(2, k, torch.bfloat16)
    with pytest.raises(ValueError, match="b"):
        ops.blockfp8_gemv(x, b.view(torch.uint8), s)
    with pytest.raises(ValueError, match="float16"):
        ops.blockfp8_gemv(x.float(), b, s)
    with pytest.raises(ValueError, match="b_scale"):
        ops.blockfp8_gemv(x, b, s[:, :-1].contiguous())
    with pytest.raises(ValueError, match="contiguous"):
        ops.blockfp8_gemv(x, b.t().contiguous().t(), s)
    bad = shapes.UNSUPPORTED_K
    b_bad, s_bad = reference.quantize_block_fp8(torch.randn(bad.n, bad.k, device="cuda"))
    with pytest.raises(ValueError, match="multiple of 16"):
        ops.blockfp8_gemv(_x(1, bad.k, torch.bfloat16), b_bad, s_bad)


# --------------------------------------------------------------------------------------------
# CUDA graphs
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("row", [None] + ROW_NAMES)
def test_cuda_graph_replay(row, dtype):
    """launch() never syncs or allocates: a captured call replays to the eager result, bit for bit."""
    m, n, k = 4, 6144, 4096
    if row is not None and not _row_accepts(row, m, n, k):
        pytest.skip(f"{row} does not take M={m}")
    b, s = _weight(n, k)
    x = _x(m, k, dtype)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        ops.blockfp8_gemv(x, b, s, row=row)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = ops.blockfp8_gemv(x, b, s, row=row)
    x.copy_(_x(m, k, dtype, seed=2))
    out.fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize()
    eager = ops.blockfp8_gemv(x, b, s, row=row)
    assert torch.equal(out, eager)
    reference.assert_close_to_ref(out, reference.gemv_ref(x, b, s), f"graph {row}")
