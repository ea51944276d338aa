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
"""

from __future__ import annotations

import pytest
import torch
from conftest import poison_cuda_cache

from vllm_blockfp8 import ops, reference

pytestmark = pytest.mark.skipif(
    not torch.cuda.is_available() or not ops.HAS_CUDA_KERNELS,
    reason="needs a CUDA GPU and the compiled extension vllm_blockfp8._C",
)

G = 128
DTYPES = (torch.bfloat16, torch.float16)
MS = (1, 3, 16, 83, 1024)
KS = (128, 4096, 7168)


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


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("k", KS)
@pytest.mark.parametrize("m", MS)
def test_quant_bit_exact(m, k, dtype):
    x = _input(m, k, dtype, seed=m * 10007 + k).cuda()
    m4 = -(-m // 4) * 4
    poison_cuda_cache(m * k, (k // G) * m4 * 4)
    q, s = ops.per_token_group_quant(x, G)
    torch.cuda.synchronize()
    _check(q, s, x, f"M={m} K={k} {dtype}")


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_quant_cuda_graph(dtype):
    m, k = 83, 4096
    static_x = _input(m, k, dtype, seed=1).cuda()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm up outside the capture (lazy init, allocator)
        ops.per_token_group_quant(static_x, G)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        q, s = ops.per_token_group_quant(static_x, G)
    for seed in (2, 3):  # replay on new data: the graph must not have baked the capture's input in
        x = _input(m, k, dtype, seed=seed).cuda()
        static_x.copy_(x)
        q.view(torch.uint8).fill_(0xFF)
        s.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        _check(q, s, x, f"graph replay {seed} {dtype}")
        eq, es = ops.per_token_group_quant(x, G)
        assert reference.first_mismatch(q, eq) is None and reference.first_mismatch(s, es) is None


def test_quant_rejects_bad_input_on_cuda():
    x = torch.randn(4, 256, device="cuda", dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="^x must be bfloat16 or float16"):
        ops.per_token_group_quant(x.float(), G)
    with pytest.raises(ValueError, match="^x must be contiguous"):
        ops.per_token_group_quant(x[::2], G)
    with pytest.raises(ValueError, match="multiple of group_size"):
        ops.per_token_group_quant(x[:, :200].contiguous(), G)
