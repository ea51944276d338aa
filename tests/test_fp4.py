"""GPU tests of the weight-only NVFP4 linear (csrc/fp4): every tile row, both dtypes, CUDA graphs.

Numerics: each kernel multiplies x by e2m1 * e4m3 * 2^-7, which is exact in x's 16-bit type
(<= 7 significant bits, >= 2^-17), so its products are exact in fp32; it differs from the float64
reference (reference.nvfp4_linear_ref) only by fp32 accumulation order and the one rounding of the
output (the global scale and the bias are applied in fp32 before it). reference.assert_close_to_ref
bounds exactly that. The long-K case (K = 16384, all-positive operands) is where a partial sum kept
in 16 bits or a scale applied to the wrong group of 16 shows. Outputs are poisoned with NaN bytes
before each call (conftest.poison_cuda_cache), so an element left unwritten fails.

Packings: the layer passes its weight in the packing ops.nvfp4_layer_packing names for the GPU and shape (fragment on
SM90 where N % 16 == 0 and K % 64 == 0, else paired), so the selected-row tests use that; every forced row runs in
each of the three packings it reads and must refuse the others (the SM90 wgmma rows read only the fragment one, the
mma.sync W4A16 rows only the other two). The reference always reads the ModelOpt packing.
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
# N ragged against 16, 32 and 128 (the layer keeps it paired); K % 64 != 0 (paired too; only the FMA row takes it);
# a small layer and a narrow one in the fragment packing on SM90.
SHAPES = (
    shapes.WeightShape("ragged_n.1000x1024", 1000, 1024),
    shapes.WeightShape("ragged_k.304x1056", 304, 1056),
    shapes.WeightShape("small.136x256", 136, 256),
    KV_A,
    QWEN3,
)
ALL_M = (1, 2, 5, 8, 9, 16, 17, 31, 64, 83, 128, 129, 300)
DEQUANT_ROW = reference.NVFP4_WEIGHT_ROUNDING_ROWS[0]  # dequantize, then cuBLAS: large M on the fragment packing
FORCED_M = (1, 3, 8, 13, 16, 40, 130)


@functools.lru_cache(maxsize=None)
def _table():
    return tuple(ops.tile_table("nvfp4")) if torch.cuda.is_available() and ops.HAS_CUDA_KERNELS else ()


ROW_NAMES = [r["name"] for r in _table()]


def _dequant_min_m() -> int:
    """The M from which the SM90 table dequantizes: one past the last wgmma row's bound (1024 where none is built)."""
    bounds = [r["max_m"] for r in _table() if r["name"].startswith("fp4_wgmma_")]
    return max(bounds) + 1 if bounds and None not in bounds else 1024


DEQUANT_MIN_M = _dequant_min_m()
LARGE_M = (DEQUANT_MIN_M - 1, DEQUANT_MIN_M, 2 * DEQUANT_MIN_M)  # each side of the switch to the dequantize row


def _row_accepts(name: str, m: int, n: int, k: int, packing: str) -> bool:
    """The rows' preconditions (csrc/fp4/sm80.cu) for 16-byte aligned x and a weight in ``packing``, so a forced row
    is skipped only where it should be: test_rejected_rows_raise checks the op refuses exactly the complement."""
    fragment = packing == "fragment"
    if fragment and (n % 16 or k % 64):  # the packing itself does not exist there
        return False
    if name == "fp4_gemv_fma_anym":
        return True
    if name == DEQUANT_ROW:
        return fragment
    if name.startswith("fp4_wgmma_"):  # SM90 only (the sm_90a unit); smem fits the H100/H200; fragment only
        return fragment and torch.cuda.get_device_capability() == (9, 0)
    if k % 128 and not fragment:
        return False
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    tiles = -(-n // 16)
    tokens = re.match(r"fp4_gemv_mma_t(\d+)", name)
    if tokens:
        fits = m <= int(tokens.group(1))
        if name == "fp4_gemv_mma_t8_ks8":
            fits = fits and tiles > 2 * sms
        if name == "fp4_gemv_mma_t16_ks8":
            fits = fits and 2 * tiles >= 3 * sms
        return fits
    if fragment:  # the mma.sync W4A16 rows read the row-contiguous packings only
        return False
    if name == "fp4_w4a16_64x64":
        return -(-n // 128) < 24
    if name == "fp4_w4a16_128x128":
        return torch.cuda.get_device_capability() == (9, 0)  # 155 KB of shared memory per block: SM90 only
    return name.startswith("fp4_w4a16_")


def _layer(n: int, k: int) -> str:
    return ops.nvfp4_layer_packing(n, k)


WGMMA_FIRST = "fp4_wgmma_128x32"  # where the M = 9..16 GEMV rows yield
T16_ROWS = ("fp4_gemv_mma_t16_ks8", "fp4_gemv_mma_t16")
TOK128_ROW = "fp4_wgmma_128x128"  # past M = 128 only where its cost model beats the 128x256 row's


def _tok128_modelled_faster(m: int, n: int, k: int) -> bool:
    """sm80.cu's wgmma_tok128_defers: the two tiles' modelled times, as their launchers report them (their arithmetic
    is checked against this file's own in test_wgmma_plan_follows_cost_model)."""
    t128, t256 = (ops.nvfp4_wgmma_plan(tok, m, n, k)["modelled_us"] for tok in (128, 256))
    return 0 < t128 < t256


def _defers(name: str, m: int, n: int, k: int, packing: str) -> bool:
    """Selection only (sm80.cu; a forced row still runs). gemv_t16_defers: at M = 9..16 the two-token-tile GEMV rows
    yield to the wgmma 128x32 row, where it takes the problem, on layers of >= 2^25 weights and on K <= 512 (both
    rows ask the same question). wgmma_tok128_defers: past M = 128 the 128x128 row yields to the 128x256 row unless
    the cost models rate it faster."""
    if name == TOK128_ROW:
        return m > 128 and not _tok128_modelled_faster(m, n, k)
    if name not in T16_ROWS or m <= 8 or (n * k < 1 << 25 and k > 512):
        return False
    return WGMMA_FIRST in ROW_NAMES and _row_accepts(WGMMA_FIRST, m, n, k, packing)


def _pick(m: int, n: int, k: int, packing: str) -> str:
    """The row the op picks for a weight in ``packing``: the first row with max_m >= M that takes the problem and
    does not defer it."""
    return next(r["name"] for r in _table()
                if (r["max_m"] is None or m <= r["max_m"]) and _row_accepts(r["name"], m, n, k, packing)
                and not _defers(r["name"], m, n, k, packing))


@functools.lru_cache(maxsize=None)
def _weight(n: int, k: int, positive: bool = False, seed: int = 0):
    g = torch.Generator(device="cuda").manual_seed(seed * 1000003 + n * 31 + k)
    w = torch.randn(n, k, device="cuda", generator=g)
    packed, scale, gs = reference.quantize_nvfp4(w.abs() if positive else w)
    return packed, scale, gs.reshape(1)


_PACKED: dict = {}


def _packed(packed: torch.Tensor, scale: torch.Tensor, packing: str) -> tuple:
    """(b, b_scale) of one of _weight's ModelOpt packings in ``packing``, made once (keyed by the tensor, which
    _weight's cache keeps alive, so its id is never reused)."""
    if packing == "modelopt":
        return packed, scale
    hit = _PACKED.get((id(packed), packing))
    if hit is None or hit[0] is not packed:
        made = (reference.pair_nvfp4_weight(packed), scale) if packing == "paired" else \
            reference.fragment_nvfp4_weight(packed, scale)
        hit = _PACKED[(id(packed), packing)] = (packed, made)
    return hit[1]


def _x(m: int, k: int, dtype, positive: bool = False, seed: int = 1) -> torch.Tensor:
    g = torch.Generator(device="cuda").manual_seed(seed * 7919 + m * 131 + k)
    x = torch.randn(m, k, device="cuda", generator=g)
    return (x.abs() if positive else x).to(dtype)


def _run(x, packed, scale, gs, bias=None, row=None, packing=None) -> torch.Tensor:
    """The op on ``packed`` (ModelOpt packing) repacked into ``packing`` (default: the layer's for the shape)."""
    poison_cuda_cache(x.shape[0] * packed.shape[0] * x.element_size())
    packing = packing or _layer(packed.shape[0], x.shape[1])
    b, b_scale = _packed(packed, scale, packing)
    return ops.nvfp4_linear(x, b, b_scale, gs, bias, row=row, packing=packing)


def _check(x, packed, scale, gs, bias=None, row=None, what="nvfp4", packing=None):
    out = _run(x, packed, scale, gs, bias, row, packing)
    m, n, k = x.shape[0], packed.shape[0], x.shape[1]
    assert out.dtype == x.dtype and out.shape == (m, n)
    ran = row or _pick(m, n, k, packing or _layer(n, k))  # the row's own bound (the dequantize row rounds weights)
    reference.assert_nvfp4_row_close(out, x, packed, scale, gs, bias, ran, what)
    return out


# --------------------------------------------------------------------------------------------
# The table
# --------------------------------------------------------------------------------------------


def test_table_rows():
    rows = _table()
    assert rows, "the nvfp4 tile table is empty"
    names = [r["name"] for r in rows]
    assert len(set(names)) == len(names), f"duplicate row names {names}"
    for r in rows:
        assert r["name"].startswith("fp4_") and r["reason"].strip(), r
    assert rows[-1]["max_m"] is None, "the last row must be unbounded in M"
    assert ops.build_info()["families"]["nvfp4"] == "all"


@pytest.mark.parametrize("m", ALL_M + LARGE_M + (8192,))
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: s.name)
def test_selection_follows_table(shape, m):
    """The op picks the first row with max_m >= M whose precondition holds (for the packing the layer passes)."""
    want = _pick(m, shape.n, shape.k, _layer(shape.n, shape.k))
    assert ops.selected_row("nvfp4", m, shape.n, shape.k) == want
    if torch.cuda.get_device_capability() == (9, 0) and _layer(shape.n, shape.k) == "fragment":
        assert (want == DEQUANT_ROW) == (m >= DEQUANT_MIN_M), f"M={m}: {want}"  # wgmma below, dequantize above


@pytest.mark.parametrize("m", (8, 9, 12, 16, 17))
@pytest.mark.parametrize("n,k,to_wgmma", ((256, 512, True), (4352, 512, True), (8192, 4096, True), (8176, 4096, False),
                                          (2048, 16384, True), (256, 12288, False), (256, 4096, False)))
def test_m9_16_large_or_short_k_selection(n, k, to_wgmma, m):
    """At M = 9..16 on SM90 (the fragment packing) layers of >= 2^25 weights and K <= 512 go to the wgmma 128x32 row;
    the GEMV rows still run there when forced, and the selected row is checked against the reference."""
    packing = _layer(n, k)
    want = _pick(m, n, k, packing)
    assert ops.selected_row("nvfp4", m, n, k) == want
    if WGMMA_FIRST in ROW_NAMES and packing == "fragment" and 9 <= m <= 16:
        assert (want == WGMMA_FIRST) == to_wgmma, want
    x, w = _x(m, k, torch.bfloat16), _weight(n, k)
    _check(x, *w, what=f"selected {want} M={m} N={n} K={k}")
    if want == WGMMA_FIRST:
        for row in T16_ROWS:
            if _row_accepts(row, m, n, k, packing):
                _check(x, *w, row=row, what=f"forced {row} M={m} N={n} K={k}")


# --------------------------------------------------------------------------------------------
# Correctness: selected and forced rows
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("m", ALL_M)
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: s.name)
def test_selected_row(shape, m, dtype):
    _check(_x(m, shape.k, dtype), *_weight(shape.n, shape.k), what=f"{shape.name} M={m}")


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("m", LARGE_M)
@pytest.mark.parametrize("shape", (KV_A, QWEN3), ids=lambda s: s.name)
def test_selected_row_at_large_m(shape, m, dtype):
    """Prefill M on each side of the switch to the dequantize row, with a bias (added after cuBLAS's rounding there)."""
    bias = _x(1, shape.n, dtype, seed=5)[0]
    _check(_x(m, shape.k, dtype), *_weight(shape.n, shape.k), bias, what=f"{shape.name} M={m}")


@pytest.mark.parametrize("m", (1, 16, 17, 129, 300, DEQUANT_MIN_M))
@pytest.mark.parametrize("shape", (SHAPES[0], QWEN3), ids=lambda s: s.name)
@pytest.mark.parametrize("packing", ("modelopt", "paired"))
def test_selected_row_on_row_contiguous_packings(shape, m, packing):
    """A caller that passes ModelOpt's or the paired packing still runs on the row the op picks for it; on SM90,
    M > 16 goes to the mma.sync rows since the wgmma rows read only the fragment packing."""
    _check(_x(m, shape.k, torch.bfloat16), *_weight(shape.n, shape.k), what=f"{packing} {shape.name} M={m}",
           packing=packing)


PACKINGS = pytest.mark.parametrize("packing", ops.NVFP4_PACKINGS)


@PACKINGS
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("m", FORCED_M)
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: s.name)
@pytest.mark.parametrize("row", ROW_NAMES)
def test_forced_row(row, shape, m, dtype, packing):
    if not _row_accepts(row, m, shape.n, shape.k, packing):
        pytest.skip(f"{row} does not take M={m} N={shape.n} K={shape.k} {packing}")
    _check(_x(m, shape.k, dtype), *_weight(shape.n, shape.k), row=row, what=f"{row} M={m} {shape.name}",
           packing=packing)


@PACKINGS
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("row", ROW_NAMES)
def test_every_row_runs_on_a_model_shape(row, dtype, packing):
    """Every row runs on a real layer it takes (Qwen3-8B's gate_up 24576 x 4096, else DeepSeek-V3's
    2112 x 7168 for the narrow-layer row) at an M it takes, in each packing it reads: no row ships unrun. A row
    that does not read the packing is refused before the op, with the reason."""
    models = (shapes.by_name("qwen3-8b.gate_up"), shapes.by_name("dsv3.2112x7168"))
    fragment_only = row.startswith("fp4_wgmma_") or row == DEQUANT_ROW
    refused = (fragment_only and packing != "fragment" or row.startswith("fp4_w4a16_") and packing == "fragment")
    if refused:
        reads = "fragment packing only" if fragment_only else "not the fragment packing"
        with pytest.raises(ValueError, match=f"cannot run .*{reads}"):
            _run(_x(256, models[0].k, dtype), *_weight(models[0].n, models[0].k), row=row, packing=packing)
        return
    found = next(((m, s) for s in models for m in (1, 16, 256) if _row_accepts(row, m, s.n, s.k, packing)), None)
    assert found is not None, f"{row} takes neither model shape in the {packing} packing"
    m, shape = found
    _check(_x(m, shape.k, dtype), *_weight(shape.n, shape.k), row=row, what=f"{row} {shape.name} M={m}",
           packing=packing)


@PACKINGS
@pytest.mark.parametrize("m", (1, 9, 17))
@pytest.mark.parametrize("row", ROW_NAMES)
def test_rejected_rows_raise(row, m, packing):
    """Forcing a row outside its precondition (a packing it does not read included) is an error, never a wrong
    answer."""
    for n, k in ((QWEN3.n, QWEN3.k), (304, 1088), (2112, 2048)):
        if packing == "fragment" and k % 64:
            continue  # no fragment packing to pass (ops.fragment_nvfp4_weight refuses it)
        x = _x(m, k, torch.bfloat16)
        if _row_accepts(row, m, n, k, packing):
            _check(x, *_weight(n, k), row=row, what=f"{row} M={m} N={n} K={k}", packing=packing)
        else:
            with pytest.raises((RuntimeError, ValueError), match="cannot run"):
                _run(x, *_weight(n, k), row=row, packing=packing)


@PACKINGS
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("m", (1, 16, 200))
@pytest.mark.parametrize("row", [None] + ROW_NAMES)
def test_long_k_all_positive(row, m, dtype, packing):
    n = 4112 if packing == "fragment" else 4104  # ragged 128-row tiles; 4104 also ragged 16- and 32-row ones
    k = 16384
    if row is not None and not _row_accepts(row, m, n, k, packing):
        pytest.skip(f"{row} does not take M={m} {packing}")
    _check(_x(m, k, dtype, positive=True), *_weight(n, k, positive=True), row=row, what=f"long K {row} M={m}",
           packing=packing)


WGMMA_ROWS = [r for r in ROW_NAMES if r.startswith("fp4_wgmma_")]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("row", WGMMA_ROWS)
def test_wgmma_rows_ragged_and_long_k(row, dtype):
    """The SM90 wgmma rows forced at M ragged against their 32/64/128/256-token tiles, N ragged against the
    128-row tile (1008, 144: the 16-row tiles past N re-read the last one and are never stored), K = 1088 (17
    64-wide stages: not a multiple of 128) and K = 16384 all-positive (a scale on the wrong group or a lost stage
    shows). N = 144 at small M leaves 2 output tiles, so those calls split K (fp32 partials and the reduce kernel, or a
    thread-block cluster where the 128x256 row's model picks one; test_wgmma_reductions_agree forces both): an
    output element left unwritten is NaN-poisoned by _run and fails."""
    if not _row_accepts(row, 1, 144, 1088, "fragment"):
        pytest.skip(f"{row} runs on SM90 only")
    for n, k, positive in ((1008, 1088, False), (144, 1088, False), (144, 16384, True), (1008, 16384, True)):
        w = _weight(n, k, positive)
        for m in (1, 31, 33, 63, 65, 200, 257, 513):
            x = _x(m, k, dtype, positive=positive)
            _check(x, *w, row=row, what=f"{row} M={m} N={n} K={k}", packing="fragment")
    # K = 512 (8 stages) never splits: the unsplit epilogue (the tile staged in shared memory, 16-byte row pieces) at
    # ragged M and N, with per-row global scales and a bias.
    packed, scale, gs = _weight(1008, 512)
    per_row = gs * (torch.arange(1008, device="cuda") % 7 + 1) / 4
    bias = _x(1, 1008, dtype, seed=5)[0]
    for m in (1, 31, 33, 65, 129, 200, 257):
        assert ops.nvfp4_wgmma_plan(int(row.split("x")[-1]), m, 1008, 512)["splits"] == 1
        _check(_x(m, 512, dtype), packed, scale, per_row, bias, row=row, what=f"{row} M={m} N=1008 K=512 unsplit",
               packing="fragment")


# The cost models of w4a16_wgmma.cu (kTok256Costs, kTok128Costs): stage, wave, MB of partials, cluster sum per wave.
TOK256_COSTS, TOK128_COSTS = (0.75, 6.3, 0.18, 1.9), (0.633, 0.35, 0.38, 6.3)


def _modelled(costs, m, n, k, splits, cluster, at_once, tok):
    stage, wave, partial_mb, cluster_wave = costs
    waves = -(-(-(-m // tok) * -(-n // 128) * splits) // at_once)
    reduce = 0.0 if splits == 1 else cluster_wave * waves if cluster else partial_mb * 8e-6 * splits * m * n
    return stage * waves * -(-(k // 64) // splits) + wave * waves + reduce


@pytest.mark.parametrize("m", (129, 160, 192, 256, 320, 384, 448, 511))
def test_wgmma_plan_follows_cost_model(m):
    """M = 129..511: each of the 128x256 and 128x128 launchers' splits is the least modelled time over its options
    under its own costs (checked here against every option this file can cost without the GPU's cluster slots: no
    split and fp32 partials), and both report the time of what they launch; the selection
    (test_selection_follows_table) compares those times."""
    if TOK128_ROW not in WGMMA_ROWS or not _row_accepts(TOK128_ROW, m, 1024, 1024, "fragment"):
        pytest.skip("the wgmma rows run on SM90 only")
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    chose = set()
    for shape in shapes.BENCHMARK_SET:
        n, k = shape.n, shape.k
        most = max(1, min(k // 64 // 8, 16))
        for tok, costs, per_sm in ((256, TOK256_COSTS, 1), (128, TOK128_COSTS, 2)):
            plan = ops.nvfp4_wgmma_plan(tok, m, n, k)
            s, cluster = plan["splits"], plan["cluster"]
            assert plan["at_once"] == per_sm * sms or (cluster and 0 < plan["at_once"] <= per_sm * sms), plan
            cost = _modelled(costs, m, n, k, s, cluster, plan["at_once"], tok)
            assert plan["modelled_us"] == pytest.approx(cost, rel=1e-5), (shape.name, tok, plan)
            for q in range(1, most + 1):
                assert cost <= _modelled(costs, m, n, k, q, False, per_sm * sms, tok) * (1 + 1e-9), (shape.name, q)
        chose.add(_pick(m, n, k, "fragment"))
    assert chose <= {TOK128_ROW, "fp4_wgmma_128x256"}, chose


# Run in a child process per mode (the extension reads the split switches once): every wgmma row forced, at ragged
# M and N, K = 1088 (17 stages: with 8 splits of 3 stages the last ones are empty) and 4096, bf16 and fp16, per-row
# global scales and a bias; each output checked against the reference there, then saved for the parent to compare.
_SPLIT_CHILD = r"""
import sys, torch
sys.path.insert(0, sys.argv[1])
import test_fp4 as t
outs = {}
for n, k in ((144, 1088), (1008, 4096)):
    packed, scale, gs = t._weight(n, k)
    per_row = gs * (torch.arange(n, device="cuda") % 7 + 1) / 4
    for dtype in t.DTYPES:
        bias = t._x(1, n, dtype, seed=5)[0]
        for m in (31, 65, 257):
            x = t._x(m, k, dtype)
            for row in t.WGMMA_ROWS:
                what = f"{row} M={m} N={n} K={k} {dtype}"
                outs[what] = t._check(x, packed, scale, per_row, bias, row=row, what=what, packing="fragment").cpu()
torch.save(outs, sys.argv[2])
"""


@pytest.mark.parametrize("splits", ("3", "8"))
def test_wgmma_reductions_agree(splits, tmp_path):
    """A K split of the wgmma rows sums its splits in a thread-block cluster through distributed shared memory by
    default, and through fp32 partials and the reduce kernel under BLOCKFP8_SM90_FP4_REDUCTION=partials. Both add the
    splits in order from zero and share the epilogue's arithmetic, so with the count forced (BLOCKFP8_SM90_FP4_SPLITS)
    they must give the same bits. Each also matches the reference (in the child)."""
    if not WGMMA_ROWS or not _row_accepts(WGMMA_ROWS[0], 1, 144, 1088, "fragment"):
        pytest.skip("the wgmma rows run on SM90 only")
    import os
    import subprocess
    import sys
    from pathlib import Path

    outs = {}
    modes = ("cluster", "partials")
    for mode in modes:
        env = {**os.environ, "BLOCKFP8_SM90_FP4_SPLITS": splits, "BLOCKFP8_SM90_FP4_REDUCTION": mode}
        dst = tmp_path / f"{mode}.pt"
        proc = subprocess.run([sys.executable, "-c", _SPLIT_CHILD, str(Path(__file__).parent), str(dst)], env=env,
                              capture_output=True, text=True, timeout=600)
        assert proc.returncode == 0, f"{mode}: {proc.stderr[-3000:]}"
        outs[mode] = torch.load(dst)
    first, second = (outs[mode] for mode in modes)
    assert first.keys() == second.keys() and first
    for what, out in first.items():
        assert torch.equal(out.view(torch.int16), second[what].view(torch.int16)), what


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_fragment_gemv_x_direct_and_staged(dtype):
    """The fragment GEMV takes x in 4-byte pieces up to M = 3 (at M = 1, 16-byte aligned: copied once per block into
    shared memory) and through shared memory (cp.async + ldmatrix) above, where x rows are 16-byte aligned; with
    4-byte aligned rows it keeps the pieces. Every M of both GEMV token tiles, both x alignments, 16-warp and 8-warp
    blocks (a wide layer)."""
    for n, k in ((384, 1024), (4352, 2048)):
        w = _weight(n, k)
        for m in range(1, 17):
            aligned = _x(m, k + 64, dtype)[:, :k]
            four = _x(m, k + 8, dtype)[:, 2:2 + k]
            for x in (aligned, four):
                for row in ROW_NAMES:
                    if row.startswith("fp4_gemv_mma_") and _row_accepts(row, m, n, k, "fragment"):
                        _check(x, *w, row=row, what=f"{row} M={m} N={n} x % 16 = {x.data_ptr() % 16}",
                               packing="fragment")


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_fragment_gemv_block_x_bound(dtype):
    """At M = 1 the block-staged x takes up to 40 KB of shared memory (K <= 20480); one stage past it the GEMV rows
    take x from L1. Both sides, 8- and 16-warp blocks, all-positive operands (a misplaced pair of x adds up)."""
    for n in (384, 4352):
        for k in (20480, 20544):
            w = _weight(n, k, positive=True)
            x = _x(1, k, dtype, positive=True)
            for row in ("fp4_gemv_mma_t8_ks8", "fp4_gemv_mma_t8"):
                if _row_accepts(row, 1, n, k, "fragment"):
                    _check(x, *w, row=row, what=f"{row} N={n} K={k}", packing="fragment")


def test_fragment_packing_zero_scale_groups():
    """A zero-scale group (exp8 has no zero: its codes are zeroed at packing) contributes nothing on every row that
    reads the fragment packing, whatever its codes were."""
    n, k = 256, 1024
    packed, scale, gs = (t.clone() for t in _weight(n, k))
    scale.view(torch.uint8)[::3, ::5] = 0
    for m in (1, 16, 100):
        x = _x(m, k, torch.bfloat16)
        for row in [None] + ROW_NAMES:
            if row is None or _row_accepts(row, m, n, k, "fragment"):
                _check(x, packed, scale, gs, row=row, what=f"zero scales {row} M={m}", packing="fragment")


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("m", (1, 12, 96))
def test_bias_and_per_row_global_scale(m, dtype):
    """Fused shards keep their own global scale (one per output row); the bias is added in fp32
    before the one rounding."""
    n, k = 768, 2048
    packed, scale, gs = _weight(n, k)
    per_row = torch.cat([gs.expand(256), (gs * 3).expand(256), (gs / 5).expand(256)]).contiguous()
    x = _x(m, k, dtype)
    bias = _x(1, n, dtype, seed=5)[0] * 4
    for packing in ops.NVFP4_PACKINGS:
        for row in [None] + ROW_NAMES:
            if row is None or _row_accepts(row, m, n, k, packing):
                _check(x, packed, scale, per_row, bias, row=row, what=f"per-row scale + bias {row} {packing}",
                       packing=packing)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("m", (1, 16, 64))
def test_row_strided_and_misaligned_x(m, dtype):
    """x with a padded row stride (rows 16-byte aligned): every row takes it. x only 4-byte aligned: the fragment
    GEMV rows and the FMA row take it. x only 2-byte aligned: the FMA row takes it and the vector-load rows refuse."""
    n, k = 384, 1024
    w = _weight(n, k)
    x = _x(m, k + 64, dtype)[:, :k]
    for packing in ops.NVFP4_PACKINGS:
        for row in [None] + ROW_NAMES:
            if row is None or _row_accepts(row, m, n, k, packing):
                _check(x, *w, row=row, what=f"strided x {row} {packing}", packing=packing)
    x4 = _x(m, k + 8, dtype)[:, 2:2 + k]
    assert x4.data_ptr() % 16 != 0 and x4.data_ptr() % 4 == 0
    for packing in ops.NVFP4_PACKINGS:
        _check(x4, *w, what=f"4-byte aligned x {packing}", packing=packing)
    if m <= 8:
        _check(x4, *w, row="fp4_gemv_mma_t8", what="4-byte aligned x, fragment GEMV", packing="fragment")
    x = _x(m, k + 8, dtype)[:, 1:1 + k]
    assert x.data_ptr() % 4 != 0
    for packing in ops.NVFP4_PACKINGS:
        _check(x, *w, what=f"misaligned x {packing}", packing=packing)
        with pytest.raises((RuntimeError, ValueError), match="cannot run"):
            _run(x, *w, row=ROW_NAMES[0], packing=packing)
    # cuBLAS on an x that is not 16-byte aligned answered 5% off (H200): the dequantize row refuses it.
    for unaligned in (x4, x):
        with pytest.raises((RuntimeError, ValueError), match="cannot run .*16-byte aligned"):
            _run(unaligned, *w, row=DEQUANT_ROW, packing="fragment")


@pytest.mark.parametrize("m,n", [(0, 256), (3, 0)])
def test_empty(m, n):
    k = 256
    packed, scale, gs = reference.quantize_nvfp4(torch.randn(max(n, 1), k, device="cuda"))
    b, b_scale, packing = ops.nvfp4_layer_weight(packed[:n].contiguous(), scale[:n].contiguous())
    out = ops.nvfp4_linear(torch.randn(m, k, device="cuda", dtype=torch.bfloat16), b, b_scale, gs.reshape(1),
                           packing=packing)
    assert out.shape == (m, n)


def test_bad_inputs_raise_value_error():
    n, k = 256, 512
    packed, scale, gs = _weight(n, k)
    x = _x(2, k, torch.bfloat16)
    cases = {
        "x dtype": (lambda: ops.nvfp4_linear(x.float(), packed, scale, gs), "float16"),
        "b dtype": (lambda: ops.nvfp4_linear(x, packed.view(torch.int8), scale, gs), "^b must be uint8"),
        "b columns (odd packing)": (lambda: ops.nvfp4_linear(x, packed[:, 1:], scale, gs), "^b must"),
        "K % 32": (lambda: ops.nvfp4_linear(_x(2, 48, torch.bfloat16), packed[:, :24].contiguous(),
                                            scale[:, :3].contiguous(), gs), "multiple of 32"),
        "b_scale dtype": (lambda: ops.nvfp4_linear(x, packed, scale.view(torch.uint8), gs), "^b_scale must"),
        "b_scale shape": (lambda: ops.nvfp4_linear(x, packed, scale[:, :8].contiguous(), gs), "^b_scale must"),
        "global_scale size": (lambda: ops.nvfp4_linear(x, packed, scale, torch.ones(3, device="cuda")),
                              "^global_scale must"),
        "global_scale dtype": (lambda: ops.nvfp4_linear(x, packed, scale, gs.double()), "^global_scale must"),
        "bias shape": (lambda: ops.nvfp4_linear(x, packed, scale, gs, torch.zeros(7, device="cuda",
                                                                             dtype=torch.bfloat16)), "^bias must"),
        "device": (lambda: ops.nvfp4_linear(x, packed.cpu(), scale, gs), "^b is on cpu"),
        "row name": (lambda: ops.nvfp4_linear(x, packed, scale, gs, row="no_such_row"), "not in the nvfp4"),
    }
    for what, (call, pattern) in cases.items():
        with pytest.raises(ValueError, match=pattern):
            call()
            pytest.fail(what)


# --------------------------------------------------------------------------------------------
# CUDA graphs
# --------------------------------------------------------------------------------------------


@PACKINGS
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("m", (1, 8, 128, 1024))
@pytest.mark.parametrize("row", [None] + ROW_NAMES)
def test_cuda_graph_replay(row, m, dtype, packing):
    """The op builds no host tensor and never syncs: a captured call (with bias and a per-row global
    scale) replays to the eager result bit for bit, which matches the reference."""
    n, k = 6144, 4096
    if row is not None and not _row_accepts(row, m, n, k, packing):
        pytest.skip(f"{row} does not take M={m} {packing}")
    modelopt, plain_scale, gs = _weight(n, k)
    packed, scale = _packed(modelopt, plain_scale, packing)
    per_row = (gs * torch.linspace(0.5, 2.0, n, device="cuda")).contiguous()
    bias = _x(1, n, dtype, seed=3)[0]
    x = _x(m, k, dtype)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        ops.nvfp4_linear(x, packed, scale, per_row, bias, row=row, packing=packing)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = ops.nvfp4_linear(x, packed, scale, per_row, bias, row=row, packing=packing)
    x.copy_(_x(m, k, dtype, seed=2))
    out.fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize()
    eager = ops.nvfp4_linear(x, packed, scale, per_row, bias, row=row, packing=packing)
    assert torch.equal(out, eager)
    reference.assert_nvfp4_row_close(out, x, modelopt, plain_scale, per_row, bias, row or _pick(m, n, k, packing),
                                     f"graph {row}")


@PACKINGS
def test_reference_backend_is_graph_safe(packing):
    """The reference path (CPU, or CUDA without the extension) also builds no host tensor: its
    dequantize (and its unpacking of the paired or fragment packing) captures in a CUDA graph."""
    packed, plain_scale, gs = _weight(256, 512)
    b, scale = _packed(packed, plain_scale, packing)
    code = ops.NVFP4_PACKINGS.index(packing)
    x = _x(4, 512, torch.bfloat16)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        ops._nvfp4_linear_ref(x, b, scale, gs, packing=code)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = ops._nvfp4_linear_ref(x, b, scale, gs, packing=code)
    graph.replay()
    torch.cuda.synchronize()
    reference.assert_close_to_ref(out, reference.nvfp4_linear_ref(x, packed, plain_scale, gs), "reference in a graph")
