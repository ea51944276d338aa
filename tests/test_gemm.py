"""The SM90 W8A8 block-scaled FP8 GEMM (csrc/gemm/sm90/) against the float64 reference.

Numerics. The kernel accumulates each 128-deep K block on the FP8 tensor cores, promotes it into
an fp32 accumulator with the two fp32 scales, and rounds once to the output dtype. The reference
is the exact product of the dequantized operands in float64 (``reference.gemm_ref``).

* bf16 out, random signs: ``reference.assert_close_to_ref`` as it is: elementwise error
  <= u |ref| + u/16 max|ref| (u = 2^-8) and norm-wise relative error <= u.
* otherwise the same check with the absolute term raised to a floor for FP8 tensor-core
  accumulation: inside a 128-deep block the tensor cores keep fewer mantissa bits than fp32. On the
  H200 that cost up to ~2^-12.1 max|ref| with random signs (on 0.03-0.2% of the elements) and
  ~2^-10.8 with all-positive K = 16384 (the truncation is biased), identically for cuBLASLt's
  block-scaled ``torch._scaled_mm`` (bitwise the same fp16 output on >= 99.9% of elements).
  fp16's own u/16 = 2^-15 max|ref| is below what any FP8-MMA kernel reaches. Floors: 2^-11 with
  random signs, 2^-10 for the all-positive long-K test (about 2x the worst seen).

A wrong scale index (a ragged N tile, a token past a 4-row boundary) or a lost K block is far
outside either band; the long-K test with all-positive operands makes a lost per-block promotion
grow linearly instead of averaging out.

Outputs are poisoned: before every kernel call the CUDA caching allocator is filled with NaN
(0xFF bytes) and released, so the op's freshly allocated output starts as NaN and any element the
kernel does not write fails the check.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import needs_kernels, poison_cuda_cache

from vllm_blockfp8 import ops, reference, shapes

_RUNNABLE = ops.kernels_unavailable_reason(capability=(9, 0)) is None
pytestmark = needs_kernels(capability=(9, 0))

ROWS = [r["name"] for r in ops.tile_table("gemm")] if _RUNNABLE else []
M_SET = (1, 3, 4, 7, 64, 83, 128, 1000, 4096)
OUT_DTYPES = (torch.bfloat16, torch.float16)
# Every small/ragged shape with N % 8 == 0 (the GEMM's TMA store needs 16-byte output rows).
SMALL = tuple(s for s in shapes.SMALL if s.n % 8 == 0)
MODEL = (shapes.by_name("qwen3-8b.qkv"), shapes.by_name("dsv3.2112x7168"))


def _operands(m: int, n: int, k: int, *, seed: int, positive: bool = False):
    """Quantized activations (CUDA quantizer, M-major scales) and a block-quantized weight.

    Magnitudes vary per token, per 128-wide K group and per 128x128 weight block, so that every
    scale differs and a mis-indexed scale changes the result.
    """
    g = torch.Generator(device="cuda").manual_seed(seed)
    x = torch.randn(m, k, device="cuda", generator=g)
    x = x * torch.exp(torch.randn(m, k // 128, device="cuda", generator=g)).repeat_interleave(128, 1)
    w = torch.randn(n, k, device="cuda", generator=g) * 0.05
    nb = -(-n // 128)
    w = w * torch.exp(torch.randn(nb, k // 128, device="cuda", generator=g)).repeat_interleave(
        128, 0)[:n].repeat_interleave(128, 1)
    if positive:
        x, w = x.abs(), w.abs()
    a, a_scale = ops.per_token_group_quant(x.to(torch.bfloat16))
    b, b_scale = reference.quantize_block_fp8(w)
    return a, a_scale, b, b_scale


# Absolute error floors of FP8 tensor-core accumulation, relative to max|ref| (see the docstring):
# random-sign operands (worst seen 2^-12.1) and all-positive long K (biased, worst seen 2^-10.8).
FP8_MMA_FLOOR = 2.0**-11
FP8_MMA_FLOOR_LONG_K = 2.0**-10


def _assert_close(out: torch.Tensor, ref: torch.Tensor, what: str, *, long_k: bool = False) -> None:
    """bf16 with random signs: ``reference.assert_close_to_ref`` as it is. fp16, or all-positive
    long K: the same check with its absolute term raised to the FP8 accumulation floor."""
    if out.dtype == torch.bfloat16 and not long_k:
        reference.assert_close_to_ref(out, ref, what)
    else:
        reference.assert_close_to_ref(out, ref, what, abs_floor=FP8_MMA_FLOOR_LONG_K if long_k else FP8_MMA_FLOOR)


def _check(m, n, k, out_dtype, row, *, seed=0, positive=False):
    a, a_scale, b, b_scale = _operands(m, n, k, seed=seed, positive=positive)
    poison_cuda_cache(m * n * 2)
    out = ops.blockfp8_gemm(a, a_scale, b, b_scale, out_dtype, row=row)
    assert out.dtype == out_dtype and out.shape == (m, n)
    ref = reference.gemm_ref(a, a_scale, b, b_scale)
    _assert_close(out, ref, f"row={row} M={m} N={n} K={k} {out_dtype}", long_k=positive)


def test_table_shape():
    """Names unique, every row has a reason; the selectable rows come first with non-decreasing
    bounds (a row that shares its bound with the next one carries a selection precondition) and
    end with an unbounded row; forced-only candidates follow them and say so."""
    rows = ops.tile_table("gemm")
    assert rows, "the SM90 GEMM tile table is empty"
    names = [r["name"] for r in rows]
    assert len(set(names)) == len(names)
    assert all(n.startswith("sm90_") and r["reason"] for n, r in zip(names, rows))
    candidate = [r["reason"].startswith("candidate (forced only") for r in rows]
    selectable = rows[:candidate.index(True)] if True in candidate else rows
    assert selectable and all(candidate[len(selectable):]), "candidates come after every selectable row"
    bounds = [float("inf") if r["max_m"] is None else r["max_m"] for r in selectable]
    assert bounds == sorted(bounds) and bounds[-1] == float("inf"), "the last selectable row takes every M"


# The row the table picks for 4096x4096 on 132 SMs (test_host_logic.py pins more at that SM count).
SELECTED_4096_AT_132_SMS = {1: "sm90_swapab_64x32x128_pp_ovl", 64: "sm90_swapab_64x32x128_pp_ovl",
                            65: "sm90_tok64_fitn", 128: "sm90_tok64_fitn",
                            129: "sm90_swapab_128x64x128_ovl_persistent", 256: "sm90_swapab_128x64x128_ovl_persistent",
                            257: "sm90_coop_128x128x128_c2x1_ovl", 4096: "sm90_coop_128x128x128_c2x1_ovl_epi64x3",
                            8192: "sm90_coop_128x128x128_c2x1_ovl_epi64x3"}


@pytest.mark.parametrize("m", sorted(SELECTED_4096_AT_132_SMS))
def test_selection_follows_table(m):
    """With no row forced, the op picks the row the host selection names (the first row whose
    max_m covers M and whose selection precondition holds), always one that covers M; on 132 SMs
    the rows of SELECTED_4096_AT_132_SMS."""
    rows = {r["name"]: r for r in ops.tile_table("gemm")}
    got = ops.selected_row("gemm", m, 4096, 4096)
    assert got == ops.gemm_k_plan(-1, m, 4096, 4096)["row"]
    assert rows[got]["max_m"] is None or rows[got]["max_m"] >= m
    if torch.cuda.get_device_properties(0).multi_processor_count == 132:
        assert got == SELECTED_4096_AT_132_SMS[m]


@pytest.mark.parametrize("out_dtype", OUT_DTYPES, ids=str)
@pytest.mark.parametrize("shape", SMALL, ids=lambda s: s.name)
@pytest.mark.parametrize("m", M_SET)
@pytest.mark.parametrize("row", ROWS)
def test_every_row_small_and_ragged(row, m, shape, out_dtype):
    _check(m, shape.n, shape.k, out_dtype, row)


@pytest.mark.parametrize("out_dtype", OUT_DTYPES, ids=str)
@pytest.mark.parametrize("shape", MODEL, ids=lambda s: s.name)
@pytest.mark.parametrize("m", (1, 83, 1000, 4096))
@pytest.mark.parametrize("row", ROWS)
def test_every_row_model_shapes(row, m, shape, out_dtype):
    _check(m, shape.n, shape.k, out_dtype, row, seed=1)


@pytest.mark.parametrize("out_dtype", OUT_DTYPES, ids=str)
@pytest.mark.parametrize("m", M_SET)
def test_selected_row(m, out_dtype):
    """row=None: whatever the table picks is correct across the M buckets."""
    _check(m, 2112, 2048, out_dtype, None, seed=2)


@pytest.mark.parametrize("out_dtype", OUT_DTYPES, ids=str)
@pytest.mark.parametrize("m", (7, 128))
@pytest.mark.parametrize("row", ROWS)
def test_long_k_all_positive(row, m, out_dtype):
    """K = 16384 with all-positive operands: 128 promotions must all land. A lost block costs
    2^-7 of the result, a lost promotion (FP8 accumulation over all of K) far more; the tensor
    cores' biased in-block truncation costs up to ~2^-10.8, hence the wider floor here."""
    _check(m, 256, 16384, out_dtype, row, seed=3, positive=True)


TOK64_ROW = "sm90_tok64_fitn"
TOK64_WIDTHS = (16, 32, 48, 64, 80, 96, 112, 128, 144, 160, 192)  # csrc/gemm/sm90/kernels/tok64.h, kTileWidths


def _tok64_problem(width: int) -> tuple[int, int]:
    """An (m, n) whose width rule (gemm/sm90/plan.cpp, tok64_width) picks `width` on this GPU, with a
    ragged last weight tile and, where the width is not a divisor of 128, tiles straddling 128-row
    scale blocks; host logic only."""
    row = ROWS.index(TOK64_ROW)
    for m in (83, 1, 64, 200):
        for n in range(8 * width + 8, 64 * width, 8):
            if n % width and ops.gemm_k_plan(row, m, n, 1024)["tile_n"] == width:
                return m, n
    raise AssertionError(f"no (m, n) found for which {TOK64_ROW} picks width {width}")


@pytest.mark.parametrize("out_dtype", OUT_DTYPES, ids=str)
@pytest.mark.parametrize("width", TOK64_WIDTHS)
def test_tok64_every_width(width, out_dtype):
    """Each weight-tile width of the 64-token-tile row (one kernel per width and output dtype)
    against the reference, at a problem its rule picks the width for (ragged N and M). N spans at
    least 9 tiles, so every tile start modulo 128 occurs: each straddle boundary's promotion (a
    K-loop copy per boundary at 192 wide, a select per 8-column group at the other straddling
    widths) runs."""
    if TOK64_ROW not in ROWS:
        pytest.skip(f"{TOK64_ROW} is not in this build's table")
    m, n = _tok64_problem(width)
    _check(m, n, 1024, out_dtype, TOK64_ROW, seed=width)


@pytest.mark.parametrize("width", (64, 96, 192))
def test_tok64_weight_scales_from_global(width):
    """K = 33024 (258 K blocks) is past the 256 blocks of weight scales the 64-token-tile row keeps in
    shared memory (gemm/sm90/kernels/tok64.cu, kMaxResidentKBlocks), so it reads them from global memory each
    block: one width with one scale block per tile, one straddling two."""
    if TOK64_ROW not in ROWS:
        pytest.skip(f"{TOK64_ROW} is not in this build's table")
    m, n = _tok64_problem(width)
    _check(m, n, 33024, torch.bfloat16, TOK64_ROW, seed=width + 1)


# K-block counts and grids for the consumer loops (m, n, k, all-positive operands).
K_BLOCK_CASES = [
    (1, 256, 128, False),       # one K block: the overlapped loop never overlaps, only drains
    (83, 576, 256, False),      # two blocks: the last one drains from the second fragment
    (4096, 2112, 384, False),   # three blocks, several tiles per CTA: the stage ring wraps mid-tile
    (1000, 4096, 1152, False),  # nine blocks
    (4096, 4096, 7168, False),  # 56 blocks, ~8 tiles per CTA, the swizzled tile order
    (128, 256, 16384, True),    # long K, all positive (swap rows: stream-K, 2-8 tiles split over many CTAs)
    (48, 2112, 12288, False),   # 96 blocks, ragged N and M, 17-34 swap tiles: the swap rows' stream-K
                                # decomposition (k / 128 >= 96 and 2 * tiles < SMs) with partial tiles
                                # reduced through the workspace
    (64, 2112, 7168, False),    # 56 blocks on 17-34 swap tiles: the swap rows' 3-way split-K (19 + 19 +
                                # 18 blocks, uneven), partials reduced through the workspace
    (40, 4096, 7168, False),    # 56 blocks on 32-64 swap tiles: a 2-way (128x32) or 3-way (128x64) split
    (40, 4096, 2048, False),    # 16 blocks on 32 swap tiles: too short to split, data-parallel
    # Ragged last M tiles at 1, 2 and 3 blocks (written for 256-row tiles, which were measured and
    # dropped; at 128 rows they still leave a warpgroup's rows partly or wholly zero-filled):
    (4000, 4224, 128, False),   # one block per tile, many tiles per CTA (the stage ring wraps across
                                # tiles), last 128-row M tile 32 rows
    (1500, 2112, 256, False),   # two blocks, last M tile 92 rows, ragged N (16.5 weight tiles)
    (300, 2112, 384, False),    # three blocks, last M tile 44 rows (only warpgroup 0's rows hold data)
]


@pytest.mark.parametrize("out_dtype", OUT_DTYPES, ids=str)
@pytest.mark.parametrize("m,n,k,positive", K_BLOCK_CASES)
@pytest.mark.parametrize("row", ROWS)
def test_k_block_counts(row, m, n, k, positive, out_dtype):
    """1, 2, 3, 9, 16, 56, 96 and 128 K blocks on every row: the overlapped consumer loop
    (gemm/sm90/kernels/overlap_mainloop.cuh) has separate paths for an odd and an even block count and for a
    single block, the pipeline's stage ring wraps at different points (K = 128 is only here), the
    swap rows' stream-K units and their even and uneven K splits hand it partial tiles;
    ragged last M tiles at 1, 2 and 3 blocks.
    Before the CUTLASS-loop rows were deleted, this case list showed each overlapped row bitwise
    equal to its CUTLASS-loop row on the H200 (gemm/NOTES.md)."""
    _check(m, n, k, out_dtype, row, seed=7, positive=positive)


# Rows that split K at these shapes: the 128x32 swap row and the 128x64 `_slicek` row (K slices, or
# CUTLASS split-K where no slice count divides the K blocks) and the plain 128x64 swap row (CUTLASS
# split-K).
SPLIT_K_ROWS = ["sm90_swapab_128x32x128", "sm90_swapab_128x64x128_ovl_slicek", "sm90_swapab_128x64x128_ovl"]
SPLIT_K_PLANS = {  # (row, m, n, k): the plan gemm/sm90/plan.cpp gives at 132 SMs
    ("sm90_swapab_128x32x128", 64, 2112, 7168): "K slices x2",
    ("sm90_swapab_128x32x128", 40, 4096, 7168): "K slices x2",
    ("sm90_swapab_128x32x128", 32, 2112, 7552): "split-K x3",
    ("sm90_swapab_128x64x128_ovl_slicek", 64, 2112, 7168): "K slices x4",
    ("sm90_swapab_128x64x128_ovl_slicek", 40, 4096, 7168): "K slices x4",
    ("sm90_swapab_128x64x128_ovl_slicek", 32, 2112, 7552): "split-K x3",
    ("sm90_swapab_128x64x128_ovl", 64, 2112, 7168): "split-K x3",
    ("sm90_swapab_128x64x128_ovl", 40, 4096, 7168): "split-K x3",
    ("sm90_swapab_128x64x128_ovl", 32, 2112, 7552): "split-K x3",
}


def _assert_same_bits_twice(row, m, n, k, plan, seed):
    """The K plan first (on a 132-SM GPU, so that the test cannot pass without splitting), then two
    runs with the caches poisoned between them: the same bits, and both correct."""
    index = [r["name"] for r in ops.tile_table("gemm")].index(row)
    if torch.cuda.get_device_properties(0).multi_processor_count == 132:
        assert ops.gemm_k_plan(index, m, n, k)["plan"] == plan
    a, a_scale, b, b_scale = _operands(m, n, k, seed=seed)
    first = ops.blockfp8_gemm(a, a_scale, b, b_scale, torch.bfloat16, row=row)
    poison_cuda_cache(m * n * 2)
    again = ops.blockfp8_gemm(a, a_scale, b, b_scale, torch.bfloat16, row=row)
    assert torch.equal(first.view(torch.int16), again.view(torch.int16)), f"{row} M={m} N={n} K={k}"
    _check(m, n, k, torch.bfloat16, row, seed=seed)


@pytest.mark.parametrize("m,n,k", [(64, 2112, 7168), (40, 4096, 7168), (32, 2112, 7552)])
@pytest.mark.parametrize("row", SPLIT_K_ROWS)
def test_split_k_is_reproducible(row, m, n, k):
    """The swap rows sum each tile's K parts in a fixed order (CUTLASS's deterministic split-K
    reduction; the slice-sum kernel in slice order), so two runs give the same bits."""
    _assert_same_bits_twice(row, m, n, k, SPLIT_K_PLANS[(row, m, n, k)], seed=11)


@pytest.mark.parametrize("row,m,n,k", [
    ("sm90_coop_128x128x128_c2x1_ovl_sk", 1000, 2112, 7168), ("sm90_coop_128x128x128_c2x1_ovl_sk", 64, 2112, 7168),
    ("sm90_coop_128x128x128_c2x1_ovl_sk", 300, 256, 12288), ("sm90_coop_128x128x128_c1x1_ovl_sk", 1000, 2112, 7168),
    ("sm90_coop_128x128x128_c1x1_ovl_sk", 300, 256, 12288),
    ("sm90_coop_128x128x128_c1x1_ovl_sk", 640, 4096, 7168),  # where only this row streams (E32b)
])
def test_stream_k_tail_is_reproducible(row, m, n, k):
    """The 128x128 stream-K rows' units reduce shared tiles in a fixed order (CUTLASS's
    deterministic reduction), so two runs give the same bits."""
    _assert_same_bits_twice(row, m, n, k, "stream-K", seed=13)


# The row on the issue-ahead kernel (gemm/sm90/kernels/issue_ahead_kernel.cuh) and a row on CUTLASS's kernel with the same
# arithmetic: the `_sk` row runs CUTLASS's kernel with the same consumer loop and, where its stream-K rule does not
# fire (K < 48 blocks), data-parallel: per tile the same wgmma, scale products and FFMAs, one rounding to the output.
ISSUE_AHEAD_ROW = "sm90_coop_128x128x128_c2x1_ovl_epi64x3"
CUTLASS_KERNEL_ROW = "sm90_coop_128x128x128_c2x1_ovl_sk"


@pytest.mark.parametrize("out_dtype", OUT_DTYPES, ids=str)
@pytest.mark.parametrize("m,n,k", [(4096, 6144, 512), (1000, 2112, 128), (3000, 576, 1024), (8192, 4096, 4096),
                                   (777, 9728, 256), (2053, 7168, 2048)])
def test_issue_ahead_row_gives_the_cutlass_kernels_bits(m, n, k, out_dtype):
    """Issuing the next tile's first K block before the epilogue changes the order of work, not the
    arithmetic: the same bits as CUTLASS's kernel on the same loop, on grids of 1-12 tiles per CTA, one
    K block per tile included (the block issued ahead is then the whole tile), ragged M and N."""
    if torch.cuda.get_device_properties(0).multi_processor_count == 132:
        assert ops.gemm_k_plan(ROWS.index(CUTLASS_KERNEL_ROW), m, n, k)["plan"] == "data-parallel"
    _assert_rows_give_the_same_bits(ISSUE_AHEAD_ROW, CUTLASS_KERNEL_ROW, m, n, k, out_dtype, seed=17)


def _assert_rows_give_the_same_bits(row, other_row, m, n, k, out_dtype, *, seed):
    """`row` and `other_row` give the same bits on the same operands (the second output poisoned first), and `row`
    passes the reference check."""
    a, a_scale, b, b_scale = _operands(m, n, k, seed=seed)
    got = ops.blockfp8_gemm(a, a_scale, b, b_scale, out_dtype, row=row)
    poison_cuda_cache(m * n * 2)
    want = ops.blockfp8_gemm(a, a_scale, b, b_scale, out_dtype, row=other_row)
    assert torch.equal(got.view(torch.int16), want.view(torch.int16)), f"{row} vs {other_row}: M={m} N={n} K={k}"
    _check(m, n, k, out_dtype, row, seed=seed)


NO_CLUSTER_ROW = "sm90_coop_128x128x128_c1x1_ovl_epi64x3"
CLUSTER_ROW = "sm90_coop_128x128x128_c2x1_ovl_epi64x3"


@pytest.mark.parametrize("out_dtype", OUT_DTYPES, ids=str)
@pytest.mark.parametrize("m,n,k", [(300, 4096, 1024), (383, 2112, 7168), (640, 6144, 512), (1, 520, 384),
                                   (1000, 576, 2048), (2176, 1160, 256)])
def test_cluster_and_its_padding_tile_change_no_bits(m, n, k, out_dtype):
    """A tile runs the same kernel and loop with and without the 2x1 cluster, so the two rows give the same bits.
    Where the token tiles are odd in number (all but M = 1000 here), the 2x1 row's padding tile, which loads its
    partner's rows (E29), changes no bit of the real rows either: the 1x1 row has no padding tile."""
    _assert_rows_give_the_same_bits(NO_CLUSTER_ROW, CLUSTER_ROW, m, n, k, out_dtype, seed=23)


def check_graph_replay(row, m, label):
    """Row `row` (of the GEMM table in force) captured once, replayed on new inputs written in place, against the
    reference each time (the SM120 tests call it too)."""
    n, k = 576, 1024
    a, a_scale, b, b_scale = _operands(m, n, k, seed=4)
    a2, a_scale2, _, _ = _operands(m, n, k, seed=5)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        ops.blockfp8_gemm(a, a_scale, b, b_scale, torch.bfloat16, row=row)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = ops.blockfp8_gemm(a, a_scale, b, b_scale, torch.bfloat16, row=row)
    a0, a_scale0 = a.clone(), a_scale.clone()
    for src_a, src_s in ((a2, a_scale2), (a0, a_scale0)):
        ref = reference.gemm_ref(src_a, src_s, b, b_scale)
        a.copy_(src_a)
        a_scale.copy_(src_s)
        out.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        _assert_close(out, ref, f"{label} row={row} M={m}")


@pytest.mark.parametrize("m", (5, 300))
@pytest.mark.parametrize("row", ROWS)
def test_cuda_graph_replay(row, m):
    """Captured once, replayed on new inputs written in place (stream-K workspace included)."""
    check_graph_replay(row, m, "graph replay")


def _reads_what_was_just_written(row):
    """The GEMM must read the output of the kernel just ahead of it on the stream, also where it is
    launched programmatically (BLOCKFP8_SM90_PDL=1, the default, at this K: it may start before that
    kernel ends). Eagerly, a
    copy kernel overwrites the activations right before each call (alternating two inputs); in a
    captured graph the quantizer writes them right before the GEMM, its outputs NaN-poisoned before
    every replay. A read ahead of the writer gives the other input's product or NaN."""
    m, n, k = 300, 576, 1024
    inputs = [_operands(m, n, k, seed=s)[:2] for s in (21, 22)]
    _, _, b, b_scale = _operands(m, n, k, seed=23)
    refs = [reference.gemm_ref(a, s, b, b_scale) for a, s in inputs]
    a, a_scale = inputs[0][0].clone(), inputs[0][1].clone()
    for i in (1, 0, 1, 0):
        a.copy_(inputs[i][0])
        a_scale.copy_(inputs[i][1])
        out = ops.blockfp8_gemm(a, a_scale, b, b_scale, torch.bfloat16, row=row)
        _assert_close(out, refs[i], f"eager, input {i}, row={row}")

    g = torch.Generator(device="cuda").manual_seed(24)
    xs = [torch.randn(m, k, device="cuda", generator=g).to(torch.bfloat16) for _ in range(2)]
    x = xs[0].clone()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        ops.blockfp8_gemm(*ops.per_token_group_quant(x), b, b_scale, torch.bfloat16, row=row)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        q, q_scale = ops.per_token_group_quant(x)
        out = ops.blockfp8_gemm(q, q_scale, b, b_scale, torch.bfloat16, row=row)
    for i in (1, 0):
        x.copy_(xs[i])
        q.view(torch.uint8).fill_(0xFF)
        q_scale.fill_(float("nan"))
        out.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        want_q, want_s = ops.per_token_group_quant(xs[i])
        # These activations have no per-group magnitude spread (unlike _operands'), so max|ref| is small
        # and a bf16 rounding-boundary element can exceed u/16 max|ref|: the FP8 accumulation floor.
        reference.assert_close_to_ref(out, reference.gemm_ref(want_q, want_s, b, b_scale),
                                      f"graph, input {i}, row={row}", abs_floor=FP8_MMA_FLOOR)


@pytest.mark.parametrize("row", ROWS)
def test_reads_what_the_kernel_before_it_just_wrote(row):
    """In this process's launch mode (mode 1, programmatic with the quantizer's early trigger, unless
    BLOCKFP8_SM90_PDL says otherwise)."""
    _reads_what_was_just_written(row)


def _child(code: str, env: dict, *args: str) -> None:
    """Runs `code` in a fresh Python (the SM90 switches are read once per process) with `env` added, in
    this directory (so `import test_gemm` works), the repository root first on its path (so an in-place
    build imports as it does here)."""
    here = Path(__file__).resolve().parent
    path = os.pathsep.join(p for p in (str(here.parent), os.environ.get("PYTHONPATH", "")) if p)
    subprocess.run([sys.executable, "-c", code, *args], env=dict(os.environ, PYTHONPATH=path, **env), check=True,
                   timeout=600, cwd=str(here))


@pytest.mark.parametrize("mode", ("1", "gemm"))
def test_programmatic_launch_reads_what_the_kernel_before_it_just_wrote(mode):
    """The same with the mode given by BLOCKFP8_SM90_PDL in a child process (the variable's path):
    1 (the default, set explicitly) and gemm (every row launched programmatically, no early trigger)."""
    _child("import test_gemm\nfor row in test_gemm.ROWS:\n    test_gemm._reads_what_was_just_written(row)\n",
           {"BLOCKFP8_SM90_PDL": mode})


@pytest.mark.parametrize("mode", ("1", "gemm"))
def test_launch_mode_switched_in_process_changes_no_bits(mode):
    """ops.set_sm90_pdl switches the launch mode between calls (benchmarks capture both modes in one
    process): every row, and the full linear (whose quantizer triggers the GEMM in mode 1), give the
    same bits as plain stream order, eagerly and replayed from a graph captured in that mode."""
    m, n, k = 83, 576, 2048
    a, a_scale, b, b_scale = _operands(m, n, k, seed=26)
    x = torch.randn(m, k, device="cuda", generator=torch.Generator(device="cuda").manual_seed(27)).to(torch.bfloat16)

    def run_all():
        outs = {row: ops.blockfp8_gemm(a, a_scale, b, b_scale, torch.bfloat16, row=row) for row in ROWS}
        outs["linear"] = ops.blockfp8_linear(x, b, b_scale)
        return outs

    with ops.sm90_pdl("0"):
        plain = run_all()
    with ops.sm90_pdl(mode):
        eager = run_all()
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            run_all()
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            captured = run_all()
    for out in captured.values():
        out.fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize()
    # Plain randn activations: small max|ref|, so the FP8 accumulation floor (as in the graph test above).
    reference.assert_close_to_ref(plain["linear"], reference.linear_ref(x, b, b_scale, quantize_activations=True),
                                  "linear, plain stream order", abs_floor=FP8_MMA_FLOOR)
    for name, want in plain.items():
        assert torch.equal(eager[name].view(torch.int16), want.view(torch.int16)), f"eager {name} mode {mode}"
        assert torch.equal(captured[name].view(torch.int16), want.view(torch.int16)), f"graph {name} mode {mode}"


def test_programmatic_launch_changes_no_bits(tmp_path):
    """BLOCKFP8_SM90_PDL=0 (plain stream order, in a child process) gives the same bits as mode 1 (the
    default: programmatic launch at this K), for every row."""
    m, n, k = 83, 576, 2048
    a, a_scale, b, b_scale = _operands(m, n, k, seed=25)
    torch.save({"a": a.view(torch.uint8).cpu(), "a_scale": a_scale.cpu(), "b": b.view(torch.uint8).cpu(),
                "b_scale": b_scale.cpu()}, tmp_path / "in.pt")
    with ops.sm90_pdl("1"):
        mine = {row: ops.blockfp8_gemm(a, a_scale, b, b_scale, torch.bfloat16, row=row).cpu() for row in ROWS}
    child = (
        "import sys, torch\n"
        "from vllm_blockfp8 import ops, reference\n"
        "d = torch.load(sys.argv[1])\n"
        "a = d['a'].cuda().view(reference.FP8_DTYPE)\n"
        "b = d['b'].cuda().view(reference.FP8_DTYPE)\n"
        "s = d['a_scale'].cuda().t().contiguous().t()\n"
        "out = {r['name']: ops.blockfp8_gemm(a, s, b, d['b_scale'].cuda(), torch.bfloat16, row=r['name']).cpu()\n"
        "       for r in ops.tile_table('gemm')}\n"
        "torch.save(out, sys.argv[2])\n")
    _child(child, {"BLOCKFP8_SM90_PDL": "0"}, str(tmp_path / "in.pt"), str(tmp_path / "out.pt"))
    theirs = torch.load(tmp_path / "out.pt")
    assert sorted(theirs) == sorted(mine)
    for row in ROWS:
        assert torch.equal(mine[row].view(torch.int16), theirs[row].view(torch.int16)), row


def _valid(m=16, n=256, k=512):
    return _operands(m, n, k, seed=6)


@pytest.mark.parametrize("case", [
    "a_dtype", "a_rank", "out_dtype", "k_not_128", "b_dtype", "b_shape", "b_noncontig",
    "b_scale_shape", "a_scale_shape", "a_scale_dtype", "device", "n_not_8",
])
def test_bad_inputs_raise_value_error(case):
    a, a_scale, b, b_scale = _valid()
    out_dtype = torch.bfloat16
    if case == "a_dtype":
        a = a.to(torch.bfloat16)
    elif case == "a_rank":
        a = a.unsqueeze(0)
    elif case == "out_dtype":
        out_dtype = torch.float32
    elif case == "k_not_128":
        bad = shapes.UNSUPPORTED_K
        x = torch.randn(16, bad.k, device="cuda", dtype=torch.bfloat16)
        a = x.to(reference.FP8_DTYPE)
        a_scale = torch.ones(16, -(-bad.k // 128), device="cuda")
        b, b_scale = reference.quantize_block_fp8(torch.randn(bad.n, bad.k, device="cuda"))
    elif case == "b_dtype":
        b = b.to(torch.bfloat16)
    elif case == "b_shape":
        b = b[:, :256].contiguous()
    elif case == "b_noncontig":
        b = b.t().contiguous().t()
    elif case == "b_scale_shape":
        b_scale = b_scale[:, :-1].contiguous()
    elif case == "a_scale_shape":
        a_scale = a_scale[:-1]
    elif case == "a_scale_dtype":
        a_scale = a_scale.double()
    elif case == "device":
        b, b_scale = b.cpu(), b_scale.cpu()
    elif case == "n_not_8":
        b, b_scale = reference.quantize_block_fp8(torch.randn(252, 512, device="cuda"))
    with pytest.raises(ValueError):
        ops.blockfp8_gemm(a, a_scale, b, b_scale, out_dtype)
