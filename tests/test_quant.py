"""GPU tests of the per-token-group FP8 quantizer (csrc/quant): bit-exact against the reference.

The contract (reference.quantize_per_token_group): scale = max(amax, 1e-10) / 448 in fp32 and
q = sat_e4m3(rne(x_fp32 / scale)) with the IEEE fp32 division, so the kernel must produce the same
bytes for q and the same bits for s (no tolerance). The reference runs on CPU, where fp32 division
is IEEE by construction. Inputs hold a huge group (amax near the dtype's max), a tiny one (fp16
subnormals: a flush-to-zero build shows here), one below the amax floor (bf16), an all-zero group
and one outlier element, scattered over rows and groups.

Poisoning: before each call the caching allocator is filled with 0xFF (NaN in fp32 and in e4m3)
through blocks of the outputs' sizes and one large block, which are freed and handed back as the
outputs; an element the kernel left unwritten then differs from the reference.

Rows: every row of the quant tile table is forced through every GPU test (each row must produce
the reference's bits on its own, including rows that selection by M never picks yet), plus the
default path. K = 640 is an odd number of groups (5) and M = 1500 is not a multiple of the 16-token
block tile, so partial tiles run. The CPU tests run wherever the package imports: row validation,
the reference path and opcheck with a forced row.
"""

from __future__ import annotations

import pytest
import torch
from conftest import needs_kernels, poison_cuda_cache

from vllm_blockfp8 import ops, reference

GPU = needs_kernels()
EXT = pytest.mark.skipif(not ops.HAS_CUDA_KERNELS,
                         reason="needs the compiled extension vllm_blockfp8._C (the quant table lives in it)")

G = 128
DTYPES = (torch.bfloat16, torch.float16)
MS = (1, 3, 16, 83, 1024, 1500)
KS = (128, 640, 4096, 7168)
# The quant table is the same on every arch, so it is listed without a GPU (empty without _C).
ROWS = [r["name"] for r in ops.tile_table("quant")]
ROW_CHOICES = [None] + ROWS  # None: the op selects by M


def _input(m: int, k: int, dtype: torch.dtype, seed: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(m, k // G, G, generator=gen)
    big, tiny = (6.0e4, 1.0e-4) if dtype == torch.float16 else (1.0e30, 1.0e-8)
    specials = [("zero", 0.0), ("huge", big), ("tiny", tiny), ("outlier", None)]
    if dtype == torch.bfloat16:
        specials.append(("below floor", 1.0e-13))
    slots = torch.randperm(m * (k // G), generator=gen)[: len(specials)].tolist()
    for (_, factor), slot in zip(specials, slots):
        r, g = divmod(slot, k // G)
        if factor is None:
            x[r, g, int(torch.randint(0, G, (1,), generator=gen))] = 200.0
        else:
            x[r, g] *= factor / x[r, g].abs().max()
    x = x.reshape(m, k).to(dtype)
    assert torch.isfinite(x).all()
    return x


def _check(q: torch.Tensor, s: torch.Tensor, x: torch.Tensor, what: str) -> None:
    m, k = x.shape
    rq, rs = reference.quantize_per_token_group(x.cpu(), G)
    assert q.dtype == torch.float8_e4m3fn and q.shape == (m, k), f"{what}: q {q.dtype} {tuple(q.shape)}"
    assert s.dtype == torch.float32 and s.shape == (m, k // G), f"{what}: s {s.dtype} {tuple(s.shape)}"
    assert s.stride() == (1, -(-m // 4) * 4), f"{what}: s strides {s.stride()} are not M-major"
    bad = reference.first_mismatch(q, rq)
    if bad is not None:
        got, want = (t[tuple(bad)].view(torch.uint8).item() for t in (q, rq))
        raise AssertionError(f"{what}: q differs first at {bad}: kernel byte {got:#04x}, reference {want:#04x}, "
                             f"x = {x[tuple(bad)].item()!r}")
    bad = reference.first_mismatch(s.cpu().contiguous(), rs)
    if bad is not None:
        raise AssertionError(f"{what}: s differs first at {bad}: kernel {s[tuple(bad)].item()!r}, "
                             f"reference {rs[tuple(bad)].item()!r}")


def _row_id(row) -> str:
    return "default" if row is None else row


def _run(x: torch.Tensor, row) -> tuple[torch.Tensor, torch.Tensor]:
    m, k = x.shape
    poison_cuda_cache(m * k, (k // G) * (-(-m // 4) * 4) * 4)
    q, s = ops.per_token_group_quant(x, G, row=row)
    torch.cuda.synchronize()
    return q, s


@GPU
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("k", KS)
@pytest.mark.parametrize("m", MS)
@pytest.mark.parametrize("row", ROW_CHOICES, ids=_row_id)
def test_quant_bit_exact(row, m, k, dtype):
    x = _input(m, k, dtype, seed=m * 10007 + k).cuda()
    q, s = _run(x, row)
    _check(q, s, x, f"{_row_id(row)} M={m} K={k} {dtype}")


LAYOUTS = ("row stride K + 256", "misaligned contiguous", "row stride K + 4", "broadcast rows")


def _layouts(m: int, k: int, dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """x views with a contiguous K that are not plain contiguous tensors."""
    x = _input(m, k, dtype, seed=7).cuda()
    wide = torch.empty(m, k + 2 * G, dtype=dtype, device="cuda")
    wide[:, G:G + k] = x
    shifted = torch.empty(m * k + 4, dtype=dtype, device="cuda")
    shifted[4:] = x.reshape(-1)
    odd = torch.empty(m, k + 4, dtype=dtype, device="cuda")
    odd[:, 4:] = x
    return {
        "row stride K + 256": wide[:, G:G + k],  # rows 16-byte aligned: read in place
        "misaligned contiguous": shifted[4:].view(m, k),  # 8-byte offset: the op copies
        "row stride K + 4": odd[:, 4:],  # x_stride % 8 != 0: the op copies
        "broadcast rows": x[:1].expand(m, k),  # x_stride 0: rows alias, read in place
    }


@GPU
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("row", ROW_CHOICES, ids=_row_id)
def test_quant_strided_x(row, layout, dtype):
    m, k = 83, 640
    x = _layouts(m, k, dtype)[layout]
    q, s = _run(x, row)
    _check(q, s, x, f"{_row_id(row)} {layout} {dtype}")


@GPU
@pytest.mark.parametrize("row", ROW_CHOICES, ids=_row_id)
def test_quant_empty(row):
    for m, k in ((0, 4096), (5, 0)):
        x = torch.empty(m, k, dtype=torch.bfloat16, device="cuda")
        q, s = ops.per_token_group_quant(x, G, row=row)
        torch.cuda.synchronize()
        assert q.shape == (m, k) and s.shape == (m, k // G)


@GPU
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("row", ROW_CHOICES, ids=_row_id)
def test_quant_cuda_graph(row, dtype):
    m, k = 83, 4096
    static_x = _input(m, k, dtype, seed=1).cuda()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm up outside the capture (lazy init, allocator, occupancy query)
        ops.per_token_group_quant(static_x, G, row=row)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        q, s = ops.per_token_group_quant(static_x, G, row=row)
    for seed in (2, 3):  # replay on new data: the graph must not have baked the capture's input in
        x = _input(m, k, dtype, seed=seed).cuda()
        static_x.copy_(x)
        q.view(torch.uint8).fill_(0xFF)
        s.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        _check(q, s, x, f"graph replay {seed} {_row_id(row)} {dtype}")
        eq, es = ops.per_token_group_quant(x, G, row=row)
        assert reference.first_mismatch(q, eq) is None and reference.first_mismatch(s, es) is None


@GPU
def test_quant_rejects_bad_input_on_cuda():
    x = torch.randn(4, 256, device="cuda", dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="^x must be bfloat16 or float16"):
        ops.per_token_group_quant(x.float(), G)
    with pytest.raises(ValueError, match="^x must have a contiguous last dimension"):
        ops.per_token_group_quant(x.t(), G)
    with pytest.raises(ValueError, match="multiple of group_size"):
        ops.per_token_group_quant(x[:, :200].contiguous(), G)
    with pytest.raises(ValueError, match=rf"^row {len(ROWS)} is out of range for the quant table"):
        ops.per_token_group_quant(x, G, row=len(ROWS))


# ---------------------------------------------------------------------------------------------
# CPU: row validation, the reference path, opcheck with a forced row
# ---------------------------------------------------------------------------------------------


@EXT
def test_bad_row_raises_value_error_naming_row():
    x = _input(4, 256, torch.bfloat16, seed=0)
    for bad in (len(ROWS), -2):
        with pytest.raises(ValueError, match=rf"^row {bad} is out of range for the quant table"):
            ops.per_token_group_quant(x, G, row=bad)
    with pytest.raises(ValueError, match=r"^row 'quant_nope' is not in the quant tile table"):
        ops.per_token_group_quant(x, G, row="quant_nope")
    with pytest.raises(ValueError, match=rf"^row {len(ROWS)} is out of range for the quant table"):
        torch.ops.blockfp8.per_token_group_quant(x, G, len(ROWS))  # the op itself, past the wrapper
    with pytest.raises(ValueError, match=r"^row -2 is out of range"):
        torch.ops.blockfp8.per_token_group_quant(x, G, -2)


@pytest.mark.parametrize("row", ROW_CHOICES + [0, -1], ids=str)
def test_reference_path_accepts_every_row(row):
    """On CPU the reference serves every row (every row must produce its bits)."""
    x = _input(5, 640, torch.float16, seed=3)
    q, s = (torch.ops.blockfp8.per_token_group_quant(x, G, row) if isinstance(row, int)
            else ops.per_token_group_quant(x, G, row=row))
    rq, rs = reference.quantize_per_token_group(x, G)
    assert reference.first_mismatch(q, rq) is None and reference.first_mismatch(s.contiguous(), rs) is None
    assert s.stride() == (1, 8)


@pytest.mark.parametrize("row", [-1] + list(range(len(ROWS))))
def test_quant_opcheck_forced_row(row):
    x = _input(5, 640, torch.bfloat16, seed=4)
    torch.library.opcheck(torch.ops.blockfp8.per_token_group_quant.default, (x, G, row))


@needs_kernels(extension=False)  # the reference on CUDA tensors
def test_reference_gives_the_same_bits_on_cuda_and_cpu():
    """The reference is the contract on any device: on CUDA torch divides by a Python number through
    its rounded reciprocal, which moved about half the scales by one ulp and some values by one FP8
    step (a GEMM test saw a 4.6% error at one element), so the reference divides by a tensor (the NVFP4
    quantizer as well: its / 2688 and / 6 had the same rounding)."""
    x = _input(256, 4096, torch.bfloat16, seed=31)
    q, s = reference.quantize_per_token_group(x.cuda(), G)
    rq, rs = reference.quantize_per_token_group(x, G)
    assert reference.first_mismatch(q.cpu(), rq) is None and reference.first_mismatch(s.cpu(), rs) is None
    w = torch.randn(576, 1024, generator=torch.Generator().manual_seed(32))
    wq, ws = reference.quantize_block_fp8(w.cuda())
    rwq, rws = reference.quantize_block_fp8(w)
    assert reference.first_mismatch(wq.cpu(), rwq) is None and reference.first_mismatch(ws.cpu(), rws) is None
    packed, nv_scale, global_scale = reference.quantize_nvfp4(w.cuda())
    rpacked, rnv_scale, rglobal_scale = reference.quantize_nvfp4(w)
    assert reference.first_mismatch(global_scale.cpu(), rglobal_scale) is None
    assert reference.first_mismatch(nv_scale.cpu(), rnv_scale) is None and reference.first_mismatch(packed.cpu(), rpacked) is None
