"""GPU tests of the weight-only NVFP4 linear (csrc/fp4): every tile row, both dtypes, CUDA graphs.

Numerics: each kernel multiplies x by e2m1 * e4m3 * 2^-7, which is exact in x's 16-bit type
(<= 7 significant bits, >= 2^-17), so its products are exact in fp32; it differs from the float64
reference (reference.nvfp4_linear_ref) only by fp32 accumulation order and the one rounding of the
output (the global scale and the bias are applied in fp32 before it). reference.assert_close_to_ref
bounds exactly that. The long-K case (K = 16384, all-positive operands) is where a partial sum kept
in 16 bits or a scale applied to the wrong group of 16 shows. Outputs are poisoned with NaN bytes
before each call (conftest.poison_cuda_cache), so an element left unwritten fails.

Packings: the layer passes its weight paired (ops.pair_nvfp4_weight, b_paired=True), so the selected-row tests use
that; every forced row runs in both packings where it reads both (the SM90 wgmma rows read only the paired one and
must refuse the ModelOpt one). The reference always reads the ModelOpt packing.
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
# N ragged against 16, 32 and 128; K % 128 != 0 (only the FMA row takes it); a narrow layer.
SHAPES = (
    shapes.WeightShape("ragged_n.1000x1024", 1000, 1024),
    shapes.WeightShape("ragged_k.304x1056", 304, 1056),
    shapes.WeightShape("small.136x256", 136, 256),
    KV_A,
    QWEN3,
)
ALL_M = (1, 2, 5, 8, 9, 16, 17, 31, 64, 83, 128, 129, 300)
FORCED_M = (1, 3, 8, 13, 16, 40, 130)


@functools.lru_cache(maxsize=None)
def _table():
    return tuple(ops.tile_table("nvfp4")) if torch.cuda.is_available() and ops.HAS_CUDA_KERNELS else ()


ROW_NAMES = [r["name"] for r in _table()]


def _row_accepts(name: str, m: int, n: int, k: int, paired: bool) -> bool:
    """The rows' preconditions (csrc/fp4/sm80.cu) for 16-byte aligned x and a weight in the paired packing or
    ModelOpt's, so a forced row is skipped only where it should be: test_rejected_rows_raise checks the op refuses
    exactly the complement."""
    if name == "fp4_gemv_fma_anym":
        return True
    if name.startswith("fp4_wgmma_"):  # SM90 only (the sm_90a unit), 64-wide K stages; smem fits the H100/H200;
        # its decode reads only the paired packing
        return paired and torch.cuda.get_device_capability() == (9, 0) and k % 64 == 0
    if k % 128:
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
    if name == "fp4_w4a16_64x64":
        return -(-n // 128) < 24
    if name == "fp4_w4a16_128x128":
        return torch.cuda.get_device_capability() == (9, 0)  # 155 KB of shared memory per block: SM90 only
    return name.startswith("fp4_w4a16_")


@functools.lru_cache(maxsize=None)
def _weight(n: int, k: int, positive: bool = False, seed: int = 0):
    g = torch.Generator(device="cuda").manual_seed(seed * 1000003 + n * 31 + k)
    w = torch.randn(n, k, device="cuda", generator=g)
    packed, scale, gs = reference.quantize_nvfp4(w.abs() if positive else w)
    return packed, scale, gs.reshape(1)


_PAIRED: dict = {}


def _paired(packed: torch.Tensor) -> torch.Tensor:
    """The paired copy of one of _weight's ModelOpt packings, made once (keyed by the tensor, which _weight's cache
    keeps alive, so its id is never reused)."""
    hit = _PAIRED.get(id(packed))
    if hit is None or hit[0] is not packed:
        hit = _PAIRED[id(packed)] = (packed, reference.pair_nvfp4_weight(packed))
    return hit[1]


def _x(m: int, k: int, dtype, positive: bool = False, seed: int = 1) -> torch.Tensor:
    g = torch.Generator(device="cuda").manual_seed(seed * 7919 + m * 131 + k)
    x = torch.randn(m, k, device="cuda", generator=g)
    return (x.abs() if positive else x).to(dtype)


def _run(x, packed, scale, gs, bias=None, row=None, paired=True) -> torch.Tensor:
    """The op on ``packed`` (ModelOpt packing) or, where ``paired``, on its paired copy with b_paired=True."""
    poison_cuda_cache(x.shape[0] * packed.shape[0] * x.element_size())
    b = _paired(packed) if paired else packed
    return ops.nvfp4_linear(x, b, scale, gs, bias, row=row, b_paired=paired)


def _check(x, packed, scale, gs, bias=None, row=None, what="nvfp4", paired=True):
    out = _run(x, packed, scale, gs, bias, row, paired)
    assert out.dtype == x.dtype and out.shape == (x.shape[0], packed.shape[0])
    reference.assert_close_to_ref(out, reference.nvfp4_linear_ref(x, packed, scale, gs, bias), what)
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


@pytest.mark.parametrize("m", ALL_M)
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: s.name)
def test_selection_follows_table(shape, m):
    """The op picks the first row with max_m >= M whose precondition holds (for the paired packing the layer
    passes)."""
    want = next(r["name"] for r in _table()
                if (r["max_m"] is None or m <= r["max_m"]) and _row_accepts(r["name"], m, shape.n, shape.k, True))
    assert ops.selected_row("nvfp4", m, shape.n, shape.k) == want


# --------------------------------------------------------------------------------------------
# Correctness: selected and forced rows
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("m", ALL_M)
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: s.name)
def test_selected_row(shape, m, dtype):
    _check(_x(m, shape.k, dtype), *_weight(shape.n, shape.k), what=f"{shape.name} M={m}")


@pytest.mark.parametrize("m", (1, 16, 17, 129, 300))
@pytest.mark.parametrize("shape", (SHAPES[0], QWEN3), ids=lambda s: s.name)
def test_selected_row_on_modelopt_packing(shape, m):
    """The ModelOpt packing (b_paired=False: a caller that does not pair) still runs on the row the op picks for
    it; on SM90, M > 16 goes to the mma.sync rows since the wgmma rows read only the paired packing."""
    _check(_x(m, shape.k, torch.bfloat16), *_weight(shape.n, shape.k), what=f"ModelOpt {shape.name} M={m}",
           paired=False)


PACKINGS = pytest.mark.parametrize("paired", (False, True), ids=("modelopt", "paired"))


@PACKINGS
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("m", FORCED_M)
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: s.name)
@pytest.mark.parametrize("row", ROW_NAMES)
def test_forced_row(row, shape, m, dtype, paired):
    if not _row_accepts(row, m, shape.n, shape.k, paired):
        pytest.skip(f"{row} does not take M={m} N={shape.n} K={shape.k} paired={paired}")
    _check(_x(m, shape.k, dtype), *_weight(shape.n, shape.k), row=row, what=f"{row} M={m} {shape.name}",
           paired=paired)


@PACKINGS
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("row", ROW_NAMES)
def test_every_row_runs_on_a_model_shape(row, dtype, paired):
    """Every row runs on a real layer it takes (Qwen3-8B's gate_up 24576 x 4096, else DeepSeek-V3's
    2112 x 7168 for the narrow-layer row) at an M it takes, in each packing it reads: no row ships unrun."""
    if row.startswith("fp4_wgmma_") and not paired:  # refused before the op, with the reason
        shape = shapes.by_name("qwen3-8b.gate_up")
        with pytest.raises(ValueError, match="cannot run .*paired packing only"):
            _run(_x(256, shape.k, dtype), *_weight(shape.n, shape.k), row=row, paired=False)
        return
    m, shape = next((m, s) for s in (shapes.by_name("qwen3-8b.gate_up"), shapes.by_name("dsv3.2112x7168"))
                    for m in (1, 16, 256) if _row_accepts(row, m, s.n, s.k, paired))
    _check(_x(m, shape.k, dtype), *_weight(shape.n, shape.k), row=row, what=f"{row} {shape.name} M={m}",
           paired=paired)


@PACKINGS
@pytest.mark.parametrize("m", (1, 9, 17))
@pytest.mark.parametrize("row", ROW_NAMES)
def test_rejected_rows_raise(row, m, paired):
    """Forcing a row outside its precondition (the wgmma rows on the ModelOpt packing included) is an error,
    never a wrong answer."""
    for n, k in ((QWEN3.n, QWEN3.k), (304, 1056), (2112, 2048)):
        x = _x(m, k, torch.bfloat16)
        if _row_accepts(row, m, n, k, paired):
            _check(x, *_weight(n, k), row=row, what=f"{row} M={m} N={n} K={k}", paired=paired)
        else:
            with pytest.raises((RuntimeError, ValueError), match="cannot run"):
                _run(x, *_weight(n, k), row=row, paired=paired)


@PACKINGS
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("m", (1, 16, 200))
@pytest.mark.parametrize("row", [None] + ROW_NAMES)
def test_long_k_all_positive(row, m, dtype, paired):
    n, k = 4104, 16384  # 4104 leaves ragged 16-, 32- and 128-row tiles
    if row is not None and not _row_accepts(row, m, n, k, paired):
        pytest.skip(f"{row} does not take M={m} paired={paired}")
    _check(_x(m, k, dtype, positive=True), *_weight(n, k, positive=True), row=row, what=f"long K {row} M={m}",
           paired=paired)


WGMMA_ROWS = [r for r in ROW_NAMES if r.startswith("fp4_wgmma_")]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("row", WGMMA_ROWS)
def test_wgmma_rows_ragged_and_long_k(row, dtype):
    """The SM90 wgmma rows forced at M ragged against their 64/128/256-token tiles, N ragged against the
    128-row tile (1000, 136: rows past N are zero-filled, never stored), K = 1088 (17 64-wide stages: not a
    multiple of 128) and K = 16384 all-positive (a scale on the wrong group or a lost stage shows). N = 136 at
    small M leaves 2 output tiles, so those calls split K (fp32 partials, then the reduce): an unwritten partial
    or output element is NaN-poisoned by _run and fails."""
    if not _row_accepts(row, 1, 136, 1088, True):
        pytest.skip(f"{row} runs on SM90 only")
    for n, k, positive in ((1000, 1088, False), (136, 1088, False), (136, 16384, True), (1000, 16384, True)):
        w = _weight(n, k, positive)
        for m in (1, 63, 65, 200, 257, 513):
            x = _x(m, k, dtype, positive=positive)
            _check(x, *w, row=row, what=f"{row} M={m} N={n} K={k}", paired=True)


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
    for row in [None] + ROW_NAMES:
        if row is None or _row_accepts(row, m, n, k, True):
            _check(x, packed, scale, per_row, bias, row=row, what=f"per-row scale + bias {row}")


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("m", (1, 16, 64))
def test_row_strided_and_misaligned_x(m, dtype):
    """x with a padded row stride (rows 16-byte aligned): every row takes it. x only 2-byte aligned:
    the FMA row takes it and the vector-load rows refuse."""
    n, k = 384, 1024
    w = _weight(n, k)
    x = _x(m, k + 64, dtype)[:, :k]
    for row in [None] + ROW_NAMES:
        if row is None or _row_accepts(row, m, n, k, True):
            _check(x, *w, row=row, what=f"strided x {row}")
    x = _x(m, k + 8, dtype)[:, 1:1 + k]
    assert x.data_ptr() % 16 != 0
    _check(x, *w, what="misaligned x")
    with pytest.raises((RuntimeError, ValueError), match="cannot run"):
        _run(x, *w, row=ROW_NAMES[0])


@pytest.mark.parametrize("m,n", [(0, 256), (3, 0)])
def test_empty(m, n):
    k = 256
    packed, scale, gs = reference.quantize_nvfp4(torch.randn(max(n, 1), k, device="cuda"))
    out = ops.nvfp4_linear(torch.randn(m, k, device="cuda", dtype=torch.bfloat16),
                           ops.pair_nvfp4_weight(packed[:n]), scale[:n], gs.reshape(1), b_paired=True)
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
def test_cuda_graph_replay(row, m, dtype, paired):
    """The op builds no host tensor and never syncs: a captured call (with bias and a per-row global
    scale) replays to the eager result bit for bit, which matches the reference."""
    n, k = 6144, 4096
    if row is not None and not _row_accepts(row, m, n, k, paired):
        pytest.skip(f"{row} does not take M={m} paired={paired}")
    modelopt, scale, gs = _weight(n, k)
    packed = _paired(modelopt) if paired else modelopt
    per_row = (gs * torch.linspace(0.5, 2.0, n, device="cuda")).contiguous()
    bias = _x(1, n, dtype, seed=3)[0]
    x = _x(m, k, dtype)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        ops.nvfp4_linear(x, packed, scale, per_row, bias, row=row, b_paired=paired)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = ops.nvfp4_linear(x, packed, scale, per_row, bias, row=row, b_paired=paired)
    x.copy_(_x(m, k, dtype, seed=2))
    out.fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize()
    eager = ops.nvfp4_linear(x, packed, scale, per_row, bias, row=row, b_paired=paired)
    assert torch.equal(out, eager)
    reference.assert_close_to_ref(out, reference.nvfp4_linear_ref(x, modelopt, scale, per_row, bias), f"graph {row}")


@PACKINGS
def test_reference_backend_is_graph_safe(paired):
    """The reference path (CPU, or CUDA without the extension) also builds no host tensor: its
    dequantize (and, for the paired packing, its unpairing) captures in a CUDA graph."""
    packed, scale, gs = _weight(256, 512)
    b = _paired(packed) if paired else packed
    x = _x(4, 512, torch.bfloat16)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        ops._nvfp4_linear_ref(x, b, scale, gs, b_paired=paired)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = ops._nvfp4_linear_ref(x, b, scale, gs, b_paired=paired)
    graph.replay()
    torch.cuda.synchronize()
    reference.assert_close_to_ref(out, reference.nvfp4_linear_ref(x, packed, scale, gs), "reference in a graph")
