"""Peers timed beside vllm_blockfp8, operand copies, and the first-output check.

A peer declares what it needs, says why it is unavailable here (``unavailable()``) or cannot take a
shape (``rejects(m, n, k)``), and builds one zero-argument callable per operand copy. In "linear"
mode a W8A8 peer gets bf16 activations and pays its activation quantizer inside the timed call; in
"gemm" mode it gets fp8 activations and scales, re-laid out for it outside the timed call.
DECODE_PEERS (FlashInfer's block-scale GEMM, vLLM's M < 32 path on SM90) take bf16 activations only and
are timed by bench_gemv. bench_nvfp4's peers live in peers_fp4.py.

torch._scaled_mm, block-scaled (torch 2.11, aten/src/ATen/native/cuda/ScaledBlas.cpp; the same
checks' messages are in this wheel's libtorch_cuda.so): get_joint_scaling() tries
(128x128, 1x128) first, then (1x128, 128x128), testing ``is_blockwise_1x128_scaling(a, scale_a)``
(scale_a [M, ceil(K/128)], stride (1, M) exactly) and
``is_blockwise_128x128_scaling(b.t(), scale_b.t())`` (scale_b.t() [ceil(N/128), ceil(K/128)],
stride (ceil(K/128), 1), i.e. our contiguous b_scale). So scale_a's column stride must equal the
row count of a: activations are padded to M4 = round_up(M, 4) rows so that the M-major scales of
our quantizer (stride (1, M4)) qualify, and the padding also keeps a 1-row scale_a from matching
the 128x128 pattern first. SM90 only; cuBLASLt >= 12.9.
"""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Callable

import torch

from vllm_blockfp8 import reference

BLOCK = reference.BLOCK
CHECK_ROWS = 32
# A wrong scale layout moves the output by ~10% on random data. Correct kernels fed the reference's
# quantized activations stay near bf16 rounding (~2^-9 in norm). A peer with its own quantizer may
# round an element to the neighbouring e4m3 code (up to 1/14 of its group's amax at the top of the
# range); with one output row (M = 1) a single such element moved the norm by up to 1.06% on the H200
# (cuBLASLt with vLLM's quantizer, 24 seeds and one test run on the H200, 2026-11-30). 3% sits
# between the two.
CHECK_TOL = 3e-2


def round_up(x: int, to: int) -> int:
    return -(-x // to) * to


# --------------------------------------------------------------------------------------------
# Imports that may be missing: our ops (before the lead's build lands) and vLLM (peers only)
# --------------------------------------------------------------------------------------------


@functools.cache
def our_ops():
    """(vllm_blockfp8.ops, None) or (None, why not)."""
    try:
        from vllm_blockfp8 import ops
    except Exception as exc:  # missing module or a failed extension load: ours is skipped
        return None, f"vllm_blockfp8.ops unavailable: {type(exc).__name__}: {exc}"
    if not getattr(ops, "HAS_CUDA_KERNELS", False):
        return None, "vllm_blockfp8.ops.HAS_CUDA_KERNELS is False (extension not built)"
    return ops, None


@functools.cache
def vllm_api():
    """(namespace of the vLLM entry points the peers call, None) or (None, why not)."""
    # fp32 scales for DeepGEMM (no UE8M0 power-of-two rounding); vLLM reads this once.
    os.environ["VLLM_USE_DEEP_GEMM_E8M0"] = "0"
    try:
        import vllm
        from vllm import _custom_ops
        from vllm.model_executor.layers.quantization.utils import fp8_utils
        from vllm.utils import deep_gemm
    except Exception as exc:
        return None, f"vllm not importable: {type(exc).__name__}: {exc}"
    return SimpleNamespace(
        version=vllm.__version__, cutlass_scaled_mm=_custom_ops.cutlass_scaled_mm,
        cutlass_block_ok=_custom_ops.cutlass_scaled_mm_supports_block_fp8,
        quant=fp8_utils.per_token_group_quant_fp8,
        triton_mm=fp8_utils.w8a8_triton_block_scaled_mm,
        deepgemm_weight=fp8_utils.deepgemm_post_process_fp8_weight_block,
        fp8_gemm_nt=deep_gemm.fp8_gemm_nt, deepgemm_ok=deep_gemm.is_deep_gemm_supported,
        deepgemm_e8m0=deep_gemm.is_deep_gemm_e8m0_used,
        deepgemm_module=getattr(deep_gemm, "_import_deep_gemm", lambda: None)), None


def _capability() -> tuple[int, int]:
    return torch.cuda.get_device_capability() if torch.cuda.is_available() else (0, 0)


# --------------------------------------------------------------------------------------------
# Operands
# --------------------------------------------------------------------------------------------


@dataclass
class Operands:
    """One rotating copy of a point's operands (random, never zeros)."""
    x: torch.Tensor                     # bf16 [M, K]
    b: torch.Tensor                     # fp8 [N, K]
    b_scale: torch.Tensor               # fp32 [ceil(N/128), ceil(K/128)]
    a: torch.Tensor | None = None       # fp8 [M, K] (GEMM-only points)
    a_scale: torch.Tensor | None = None  # fp32 [M, K/128], strides (1, round_up(M, 4))


def quantize_activations(x: torch.Tensor):
    """GEMM-only inputs: the reference quantizer (the bit-exact contract), re-laid out M-major
    with stride (1, round_up(M, 4)) as ops.per_token_group_quant returns them. Not ours: a
    quantizer bug must not make every peer's check fail."""
    q, s = reference.quantize_per_token_group(x)
    m = x.shape[0]
    return q, m_major(s, round_up(m, 4))[:m]


def make_operands(m: int, n: int, k: int, *, gemm_inputs: bool, device="cuda") -> Operands:
    x = torch.randn(m, k, device=device, dtype=torch.bfloat16)
    b, b_scale = reference.quantize_block_fp8(torch.randn(n, k, device=device))
    ops = Operands(x, b, b_scale)
    if gemm_inputs:
        ops.a, ops.a_scale = quantize_activations(x)
    return ops


class LazyCopies:
    """Operand copy i, made on first use: --dry-run and skipped points allocate nothing."""

    def __init__(self, make: Callable[[int], Operands]):
        self._make, self._copies = make, {}

    def __getitem__(self, i: int) -> Operands:
        if i not in self._copies:
            self._copies[i] = self._make(i)
        return self._copies[i]


def m_major(s: torch.Tensor, rows: int) -> torch.Tensor:
    """Scales [M, G] as a [rows, G] view with strides (1, rows); rows past M repeat row 0."""
    m, g = s.shape
    buf = torch.empty(g, rows, device=s.device, dtype=torch.float32)
    buf[:, :m] = s.t()
    buf[:, m:] = s.t()[:, :1]
    return buf.t()


def pad_rows(t: torch.Tensor, rows: int) -> torch.Tensor:
    """[M, K] -> [rows, K] contiguous, rows past M repeating row 0 (no zero rows)."""
    raw = t.view(torch.uint8) if t.element_size() == 1 else t
    out = torch.empty((rows, t.shape[1]), device=t.device, dtype=raw.dtype)
    out[: t.shape[0]] = raw
    out[t.shape[0]:] = raw[:1]
    return out.view(t.dtype) if t.element_size() == 1 else out


def peer_quantizer():
    """(name, fn x -> (q, s M-major stride (1, rows of x rounded to 4))) for W8A8 peers."""
    v, _ = vllm_api()
    if v is not None:
        return "vllm per_token_group_fp8_quant (CUDA)", lambda x: v.quant(
            x, BLOCK, column_major_scales=True, tma_aligned_scales=True, use_ue8m0=False)
    ops, _ = our_ops()
    if ops is not None:
        return "ours (vllm_blockfp8.ops.per_token_group_quant)", ops.per_token_group_quant
    return "reference (torch eager)", lambda x: (lambda q, s: (q, m_major(
        s, round_up(x.shape[0], 4))))(*reference.quantize_per_token_group(x))


# --------------------------------------------------------------------------------------------
# The peers
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Peer:
    name: str
    needs: str
    reference: str                                   # "w8a8" or "weight_only"
    unavailable: Callable[[], str | None]
    rejects: Callable[[int, int, int], str | None]
    build: Callable[[Operands, str], Callable[[], torch.Tensor]]


def _needs_cuda() -> str | None:
    return None if torch.cuda.is_available() else "no CUDA device"


def _bf16_build(o: Operands, mode: str):
    w = reference.dequantize_block_fp8(o.b, o.b_scale).to(torch.bfloat16)
    x = o.x
    return lambda: torch.mm(x, w.t())


def _cublaslt_unavailable():
    if _capability() != (9, 0):
        return "block-scaled torch._scaled_mm is SM90-only, this GPU is SM%d%d" % _capability()
    return None


def _cublaslt_build(o: Operands, mode: str):
    m = o.x.shape[0]
    m4 = round_up(m, 4)
    bt, sbt = o.b.t(), o.b_scale.t()       # [K, N] column-major; [K/128, N/128] stride (1, K/128)
    if mode == "gemm":
        a, sa = pad_rows(o.a, m4), m_major(o.a_scale, m4)
        return lambda: torch._scaled_mm(a, bt, scale_a=sa, scale_b=sbt,
                                        out_dtype=torch.bfloat16)[:m]
    _, quant = peer_quantizer()
    x = pad_rows(o.x, m4)

    def run():
        q, s = quant(x)
        return torch._scaled_mm(q, bt, scale_a=s, scale_b=sbt, out_dtype=torch.bfloat16)[:m]
    return run


def _w8a8_build(gemm: Callable, quant_for: Callable[[], Callable] | None = None):
    """gemm(a, a_scale, o) -> out; a_scale arrives M-major with stride (1, round_up(M, 4))."""
    def build(o: Operands, mode: str):
        if mode == "gemm":
            a, sa = o.a, o.a_scale
            return lambda: gemm(a, sa, o)
        quant = quant_for() if quant_for else peer_quantizer()[1]
        x = o.x
        return lambda: gemm(*quant(x), o)
    return build


def _triton_gemm(a, sa, o):
    from . import triton_gemm
    return triton_gemm.block_fp8_gemm(a, sa, o.b, o.b_scale)


def _triton_unavailable():
    if _capability() < (8, 9):
        return "fp8 tl.dot needs SM89+"
    return None


def _vllm_unavailable():
    v, why = vllm_api()
    if why:
        return why
    major, minor = _capability()
    if not v.cutlass_block_ok(major * 10 + minor):
        return f"vLLM's CUTLASS blockwise GEMM not built for SM{major}{minor}"
    return None


def _vllm_build(o: Operands, mode: str):
    v = vllm_api()[0]
    m = o.x.shape[0]
    bt, sbt = o.b.t(), o.b_scale.t()
    if mode == "gemm":
        # vLLM's CUTLASS path gets (1, M) column-major scales from its quantizer.
        a, sa = o.a, m_major(o.a_scale, m)
        return lambda: v.cutlass_scaled_mm(a, bt, scale_a=sa, scale_b=sbt, out_dtype=torch.bfloat16)
    x = o.x

    def run():
        q, s = v.quant(x, BLOCK, column_major_scales=True, use_ue8m0=False)
        return v.cutlass_scaled_mm(q, bt, scale_a=s, scale_b=sbt, out_dtype=torch.bfloat16)
    return run


def _deepgemm_unavailable():
    v, why = vllm_api()
    if why:
        return why
    if not v.deepgemm_ok():
        return "vllm.utils.deep_gemm.is_deep_gemm_supported() is False (no deep_gemm, or arch)"
    if v.deepgemm_e8m0():
        return "DeepGEMM would round scales to UE8M0 (VLLM_USE_DEEP_GEMM_E8M0 was read as 1)"
    return None


def _deepgemm_build(o: Operands, mode: str):
    v = vllm_api()[0]
    m, n = o.x.shape[0], o.b.shape[0]
    b, sb = v.deepgemm_weight(o.b, o.b_scale, (BLOCK, BLOCK), use_e8m0=False)

    def gemm(a, sa, _o):
        out = torch.empty((m, n), device=a.device, dtype=torch.bfloat16)
        v.fp8_gemm_nt((a, sa), (b, sb), out, is_deep_gemm_e8m0_used=False)
        return out
    # TMA-aligned M-major activation scales: what vLLM's DeepGEMM path quantizes to.
    return _w8a8_build(gemm, lambda: lambda x: v.quant(
        x, BLOCK, column_major_scales=True, tma_aligned_scales=True, use_ue8m0=False))(o, mode)


def _deepgemm_nopdl_unavailable():
    why = _deepgemm_unavailable()
    if why:
        return why
    dg = vllm_api()[0].deepgemm_module()
    return None if dg is not None and hasattr(dg, "set_pdl") else "this deep_gemm has no set_pdl"


def _deepgemm_nopdl_build(o: Operands, mode: str):
    """DeepGEMM as vLLM calls it, but launched in plain stream order: vLLM turns its programmatic
    launch on (SM90+), which a graph keeps from capture. Tells how much of DeepGEMM's time in a chain
    of GEMMs is that launch."""
    run, dg = _deepgemm_build(o, mode), vllm_api()[0].deepgemm_module()

    def call():
        was = dg.get_pdl()
        dg.set_pdl(False)
        try:
            return run()
        finally:
            dg.set_pdl(was)
    return call


@functools.cache
def flashinfer_gemm():
    """(flashinfer.gemm.fp8_blockscale_gemm_sm90, None) or (None, why not)."""
    try:
        from flashinfer.gemm import fp8_blockscale_gemm_sm90
    except Exception as exc:  # not installed (the offline vLLM bundle lacks it), or a failed import
        return None, f"flashinfer not importable: {type(exc).__name__}: {exc}"
    return fp8_blockscale_gemm_sm90, None


def _flashinfer_unavailable():
    why = _needs_cuda() or flashinfer_gemm()[1]  # CUDA first: importing flashinfer takes seconds
    if why is None and _capability() != (9, 0):
        return "fp8_blockscale_gemm_sm90 is SM90-only, this GPU is SM%d%d" % _capability()
    return why


def _flashinfer_rejects(m, n, k):
    if m > 32:
        return f"M={m}: timed up to M = 32 (vLLM calls it at M < 32 only, DeepGEMM above)"
    return _deepgemm_rejects(m, n, k)  # FlashInfer checks the same: K % 128, N % 64


def _flashinfer_build(o: Operands, mode: str):
    """vLLM 0.26's block-FP8 linear at M < 32 on SM90 (scaled_mm/flashinfer.py,
    FlashInferFp8DeepGEMMDynamicBlockScaledKernel -> flashinfer_fp8_blockscale_gemm): bf16 x [M, K]
    goes in as is (FlashInfer quantizes it in 1x128 groups inside the call, fp32 scales 448/amax;
    swap-AB kernel below M = 32), with the fp8 weight [N, K] K-major and its fp32 scales
    [N/128, K/128] contiguous. That is the layout vLLM's DeepGEMM weight post-processing hands it on
    SM90: fp32 128x128 scales are only checked, not moved (with VLLM_USE_DEEP_GEMM_E8M0=1 their values
    are rounded to powers of two first; the layout is the same). The output and FlashInfer's
    workspace are allocated inside the call, as in vLLM."""
    if mode != "linear":
        raise ValueError("flashinfer_blockscale takes bf16 activations (linear mode) only")
    gemm = flashinfer_gemm()[0]
    x, b, sb = o.x, o.b.contiguous(), o.b_scale.contiguous()
    return lambda: gemm(input=x, weight=b, weight_scale=sb, out_dtype=torch.bfloat16)


def _vllm_triton_gemm(a, sa, o):
    return vllm_api()[0].triton_mm(a, o.b, sa, o.b_scale, [BLOCK, BLOCK],
                                   output_dtype=torch.bfloat16)


def _k_block(m, n, k):
    return None if k % BLOCK == 0 else f"K={k} is not a multiple of {BLOCK}"


def _k_block_n16(m, n, k):
    return _k_block(m, n, k) or (None if n % 16 == 0 else f"N={n} is not a multiple of 16")


def _deepgemm_rejects(m, n, k):
    return _k_block(m, n, k) or (None if n % 64 == 0 else f"N={n} is not a multiple of 64")


GEMM_PEERS = (
    Peer("bf16", "CUDA (cuBLAS bf16 GEMM on the dequantized weight)", "weight_only",
         _needs_cuda, lambda m, n, k: None, _bf16_build),
    Peer("cublaslt", "SM90, torch._scaled_mm with 1x128/128x128 fp32 scales (cuBLASLt >= 12.9)",
         "w8a8", lambda: _needs_cuda() or _cublaslt_unavailable(), _k_block_n16, _cublaslt_build),
    Peer("triton", "triton, SM89+ (benchmarks/triton_gemm.py)", "w8a8",
         lambda: _needs_cuda() or _triton_unavailable(), _k_block, _w8a8_build(_triton_gemm)),
    Peer("vllm", "vllm (_custom_ops.cutlass_scaled_mm, blockwise)", "w8a8",
         lambda: _needs_cuda() or _vllm_unavailable(), _k_block_n16, _vllm_build),
    Peer("deepgemm", "vllm with DeepGEMM (vllm.utils.deep_gemm.fp8_gemm_nt, fp32 scales)", "w8a8",
         lambda: _needs_cuda() or _deepgemm_unavailable(), _deepgemm_rejects, _deepgemm_build),
    Peer("deepgemm_nopdl", "vllm with DeepGEMM, programmatic launch off (deep_gemm.set_pdl(False))", "w8a8",
         lambda: _needs_cuda() or _deepgemm_nopdl_unavailable(), _deepgemm_rejects, _deepgemm_nopdl_build),
    Peer("vllm_triton", "vllm (w8a8_triton_block_scaled_mm)", "w8a8",
         lambda: _needs_cuda() or vllm_api()[1], _k_block, _w8a8_build(_vllm_triton_gemm)),
)


# Linear mode only (bf16 activations in, the peer's quantizer inside the call): bench_gemv's decode M.
DECODE_PEERS = (
    Peer("flashinfer_blockscale", "flashinfer-python 0.6.14 (flashinfer.gemm.fp8_blockscale_gemm_sm90, "
         "what vLLM 0.26 runs at M < 32 on SM90), SM90", "w8a8",
         _flashinfer_unavailable, _flashinfer_rejects, _flashinfer_build),
)


def _vllm_quant_build(x: torch.Tensor):
    v = vllm_api()[0]
    return lambda: v.quant(x, BLOCK, column_major_scales=True, tma_aligned_scales=True,
                           use_ue8m0=False)


QUANT_PEERS = (
    Peer("vllm_quant", "vllm (per_token_group_fp8_quant CUDA op, M-major TMA-aligned scales)",
         "quant", lambda: _needs_cuda() or vllm_api()[1], lambda m, n, k: _k_block(m, n, k),
         lambda x, mode: _vllm_quant_build(x)),
    Peer("torch_eager", "CUDA (reference.quantize_per_token_group, eager torch)", "quant",
         _needs_cuda, lambda m, n, k: _k_block(m, n, k),
         lambda x, mode: (lambda: reference.quantize_per_token_group(x))),
    # Not a quantizer: the same read and (minus the scales) the same write as one, with no math, as
    # one elementwise launch. Its "% of copy" at each M is what a kernel of this size reaches at
    # all (launch, ramp, one-wave tail), the yardstick the quantizer's small-M misses need.
    Peer("yardstick:cast_fp8", "CUDA (x.to(float8_e4m3fn), torch's elementwise cast: a same-size copy)",
         "yardstick", _needs_cuda, lambda m, n, k: None,
         lambda x, mode: (lambda: x.to(torch.float8_e4m3fn))),
    # A device-to-device copy moving the quantizer's traffic (1.5*M*K bytes read and written = 2*M*K
    # read + M*K written): "copy bandwidth" at this size, launch and ramp included, which the
    # floor's large-copy rate leaves out.
    Peer("yardstick:copy", "CUDA (Tensor.copy_ of 1.5*M*K bytes device to device: the same traffic)",
         "yardstick", _needs_cuda, lambda m, n, k: None, lambda x, mode: _same_traffic_copy(x)),
)


def _same_traffic_copy(x: torch.Tensor):
    src = x.view(torch.uint8).reshape(-1)[: 3 * x.numel() // 2]
    dst = torch.empty_like(src)
    return lambda: dst.copy_(src)


def select(peers: tuple, spec: str) -> list[Peer]:
    if spec == "all":
        return list(peers)
    if spec == "none":
        return []
    names = [s.strip() for s in spec.split(",") if s.strip()]
    known = {p.name: p for p in peers}
    unknown = [n for n in names if n not in known]
    if unknown:
        raise SystemExit(f"unknown peers {unknown}; known: {', '.join(known)}")
    return [known[n] for n in names]


def probe(peer_list, dry_run: bool) -> dict[str, str | None]:
    """Each peer's reason to be skipped everywhere (asked once: importing vLLM is slow)."""
    out = {}
    for p in peer_list:
        why = None if dry_run else p.unavailable()
        out[p.name] = f"{why} [needs {p.needs}]" if why else None
        print(f"peer {p.name}: {out[p.name] or 'available'}", flush=True)
    return out


def variants(peer_list, unavailable: dict, mode: str, copies: LazyCopies, checker, m: int, n: int,
             k: int, dry_run: bool) -> list:
    """One harness.Variant per peer at a linear/GEMM point."""
    from .harness import Variant

    return [Variant(p.name, skip=unavailable.get(p.name) or p.rejects(m, n, k),
                    check=None if dry_run else checker.linear(p.reference),
                    factory=lambda i, p=p: p.build(copies[i], mode))
            for p in peer_list]


# --------------------------------------------------------------------------------------------
# Ours: the row a call selects, and the rows it can be forced to
# --------------------------------------------------------------------------------------------


def selected_row(ops, family: str, m: int, n: int, k: int) -> str:
    try:
        name = ops.selected_row(family, m, n, k)
    except Exception as exc:  # a family the ops do not report: the row column says why
        return f"? ({type(exc).__name__})"
    return "-" if name is None else str(name)


def forced_rows(ops, family: str, dry_run: bool) -> list[dict]:
    if dry_run:
        return [dict(name=f"{family}_row{i}", max_m=8 << i, reason="dry run") for i in range(2)]
    return list(ops.tile_table(family))


# --------------------------------------------------------------------------------------------
# First-output check against the float64 reference (first CHECK_ROWS rows of copy 0)
# --------------------------------------------------------------------------------------------


class Checker:
    def __init__(self, copies: LazyCopies):
        self._copies, self._refs = copies, {}

    def _ref(self, kind: str) -> torch.Tensor:
        if kind not in self._refs:
            o = self._copies[0]
            x = o.x[:CHECK_ROWS]
            self._refs[kind] = reference.linear_ref(x, o.b, o.b_scale,
                                                    quantize_activations=kind == "w8a8")
        return self._refs[kind]

    def linear(self, *kinds: str, tol: float = CHECK_TOL) -> Callable[[torch.Tensor], str | None]:
        """Passes when the output matches any of the references (w8a8, weight_only)."""
        def check(out) -> str | None:
            errs = []
            for kind in kinds:
                ref = self._ref(kind)
                got = out[: ref.shape[0]].double()
                if got.shape != ref.shape:
                    return f"output shape {tuple(out.shape)}, expected [*, {ref.shape[1]}]"
                errs.append((torch.linalg.vector_norm(got - ref) /
                             torch.linalg.vector_norm(ref)).item())
            if min(errs) <= tol:
                return None
            detail = ", ".join(f"{k} {e:.3g}" for k, e in zip(kinds, errs))
            return f"relative error vs reference {detail} > {tol:.3g}"
        return check


def check_quant(x: torch.Tensor) -> Callable[[object], str | None]:
    """Dequantized output within fp8 rounding of x (a 3-bit mantissa: ~2.5% in norm)."""
    def check(out) -> str | None:
        q, s = out
        if tuple(q.shape) != tuple(x.shape) or tuple(s.shape) != (x.shape[0], x.shape[1] // BLOCK):
            return f"shapes q {tuple(q.shape)}, s {tuple(s.shape)} for x {tuple(x.shape)}"
        deq = reference.dequantize_per_token_group(q, s)
        xf = x.float()
        err = (torch.linalg.vector_norm(deq - xf) / torch.linalg.vector_norm(xf)).item()
        return None if err < 0.05 else f"dequantized relative error {err:.3g} >= 0.05"
    return check
