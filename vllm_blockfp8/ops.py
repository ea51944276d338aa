"""Public ops: typed wrappers with input validation, their reference paths and fakes (schemas: library.py).

Every op is a ``torch.ops.blockfp8.*`` operator so torch.compile and CUDA graphs see one opaque
node. The CUDA implementations live in the compiled extension ``vllm_blockfp8._C`` (stable ABI,
``csrc/ops.cpp``). CPU tensors, and CUDA tensors when the extension was not built, run the
reference in ``reference.py`` through the same entry points, so CPU tests exercise the wrappers,
the validation and the fakes that the GPU path uses.

Row selection by M happens inside the op (C++), never in traced Python: ``row=None`` lets the op
pick from its tile table, an int or a row name forces a row (tests, benchmarks).
"""

from __future__ import annotations

import functools
import logging
import math
from typing import Optional

import torch

from . import reference
# The library (schemas, the extension, the switches) and the host-only ops are part of this module's public API.
from .host_ops import (TUNED_FIELDS, build_info, check_forced_rows, first_use_pending, first_use_record,  # noqa: F401
                       first_use_run, gemm_k_plan, gemm_self_check, gemm_table, gemm_table_plan, gemm_table_rows,
                       gemv_pins_residency, nvfp4_native_path, nvfp4_native_rows, nvfp4_self_check,
                       nvfp4_self_check_run, nvfp4_wgmma_plan, selected_row, set_gemm_table, set_sm90_pdl, set_tuned_rows, sm90_pdl,
                       tile_table, tuned_rows)
from .library import (FAMILIES, FORCE_ENV, FORCED_ROWS, GEMM_TABLES, SM90_ENV_SWITCHES, _IMPORT_ERROR,  # noqa: F401
                      HAS_CUDA_KERNELS, _lib, _need, check_env, kernels_unavailable_reason, parse_force)

logger = logging.getLogger("vllm_blockfp8")

# --------------------------------------------------------------------------------------------
# Validation (ValueError naming the argument and the expectation)
# --------------------------------------------------------------------------------------------

_ACT_DTYPES = (torch.bfloat16, torch.float16)


def _check_activation(name: str, x: torch.Tensor, rank: Optional[int] = 2) -> None:
    _need(isinstance(x, torch.Tensor), f"{name} must be a tensor, got {type(x).__name__}")
    _need(x.dtype in _ACT_DTYPES, f"{name} must be bfloat16 or float16, got {x.dtype}")
    if rank is not None:
        _need(x.dim() == rank, f"{name} must be {rank}-D [M, K], got shape {tuple(x.shape)}")
    _need(x.stride(-1) == 1, f"{name} must have a contiguous last dimension (K), got strides {x.stride()}")


def _check_weight(b: torch.Tensor, b_scale: torch.Tensor, k: int, device: torch.device,
                  k_multiple: int) -> int:
    _need(b.dtype == reference.FP8_DTYPE, f"b must be float8_e4m3fn [N, K], got {b.dtype}")
    _need(b.dim() == 2, f"b must be 2-D [N, K], got shape {tuple(b.shape)}")
    _need(b.is_contiguous(), "b must be contiguous (row-major [N, K])")
    n = b.shape[0]
    _need(b.shape[1] == k, f"b must have K = {k} columns to match the activations, got {b.shape[1]}")
    _need(k % k_multiple == 0, f"K = {k} is not supported: it must be a multiple of {k_multiple}")
    _need(b_scale.dtype == torch.float32, f"b_scale must be float32, got {b_scale.dtype}")
    want = (-(-n // reference.BLOCK), -(-k // reference.BLOCK))
    _need(tuple(b_scale.shape) == want,
          f"b_scale must have shape [ceil(N/128), ceil(K/128)] = {list(want)}, got {list(b_scale.shape)}")
    _need(b_scale.is_contiguous(), "b_scale must be contiguous")
    for name, t in (("b", b), ("b_scale", b_scale)):
        _need(t.device == device, f"{name} is on {t.device} but the activations are on {device}")
    return n


def _row_arg(family: str, row, m: int, n: int, k: int, x: Optional[torch.Tensor] = None, query: str = "") -> int:
    """The row index for the op: -1 (select by M) or a forced row that can run this problem.

    A forced row's precondition is checked here, before the op: an error raised inside a
    stable-ABI kernel after it took its tensor arguments would not unwind safely. ``query``: the
    family name the check asks about where it differs (an NVFP4 packing: ``nvfp4:<packing>``).
    """
    if row is None:
        return -1
    rows = tile_table(family)
    names = [r["name"] for r in rows]
    if isinstance(row, str):
        _need(row in names, f"row {row!r} is not in the {family} tile table {names}")
        index = names.index(row)
    else:
        index = int(row)
    if not rows:  # reference backend: rows do not exist, the reference serves every call
        return index
    _need(0 <= index < len(rows), f"row {index} is out of range for the {family} table ({len(rows)} rows)")
    address, stride = (x.data_ptr(), x.stride(0)) if x is not None and x.dim() == 2 else (0, k)
    why = torch.ops.blockfp8.row_rejects(query or family, index, m, n, k, address, stride)
    _need(not why, f"row {names[index]} cannot run M={m} N={n} K={k}: {why}")
    return index


# --------------------------------------------------------------------------------------------
# per_token_group_quant
# --------------------------------------------------------------------------------------------


def per_token_group_quant(x: torch.Tensor, group_size: int = 128, row=None):
    """Quantize activations x [M, K] to FP8 with one fp32 scale per token per ``group_size``.

    Returns (q float8_e4m3fn [M, K], s fp32 [M, K/group_size]); ``s`` is M-major (stride
    (1, round_up(M, 4))), the layout the W8A8 GEMM reads. Bit-exact with
    ``reference.quantize_per_token_group``. x needs a contiguous K only (any row stride; the op
    copies rows that are not 16-byte aligned). ``row`` forces a row of the ``quant`` tile table
    (index or name); None lets the op pick by M.
    """
    _check_activation("x", x)
    _need(group_size == 128, f"group_size must be 128, got {group_size}")
    _need(x.shape[1] % group_size == 0, f"K = {x.shape[1]} must be a multiple of group_size = {group_size}")
    # x's address is left out: alignment is the op's to fix, not a reason to refuse a forced row.
    return torch.ops.blockfp8.per_token_group_quant(x, group_size, _row_arg("quant", row, x.shape[0], 0, x.shape[1]))


def _m_major_scales(s: torch.Tensor) -> torch.Tensor:
    m, groups = s.shape
    m4 = -(-m // 4) * 4
    buf = torch.empty(groups, m4, dtype=torch.float32, device=s.device)
    buf[:, :m] = s.t()
    return buf[:, :m].t()


@functools.lru_cache(maxsize=None)
def _quant_row_count() -> int:
    """Rows of the quant table (the same on every arch), 0 without the compiled extension."""
    return len(tile_table("quant"))


def _quant_ref(x, group_size, row=-1):
    # Every row computes the reference's bits, so the reference serves any row that exists.
    count = _quant_row_count()
    _need(row >= -1 and (count == 0 or row < count),
          f"row {row} is out of range for the quant table ({count} rows; -1 selects by M)")
    q, s = reference.quantize_per_token_group(x, group_size)
    return q, _m_major_scales(s)


@torch.library.register_fake("blockfp8::per_token_group_quant")
def _quant_fake(x, group_size, row=-1):
    m, k = x.shape
    m4 = (m + 3) // 4 * 4
    q = x.new_empty((m, k), dtype=reference.FP8_DTYPE)
    s = x.new_empty((k // group_size, m4), dtype=torch.float32)[:, :m].t()
    return q, s


# --------------------------------------------------------------------------------------------
# gemv (weight-only), gemm (W8A8), linear (the full path)
# --------------------------------------------------------------------------------------------


def blockfp8_gemv(x: torch.Tensor, b: torch.Tensor, b_scale: torch.Tensor, row=None) -> torch.Tensor:
    """Weight-only out[M, N] = x @ (b * b_scale)^T in x's dtype (small M, no activation quant)."""
    _check_activation("x", x)
    _check_weight(b, b_scale, x.shape[1], x.device, 16)
    return torch.ops.blockfp8.gemv(x, b, b_scale, _row_arg("gemv", row, x.shape[0], b.shape[0], x.shape[1], x))


def _gemv_ref(x, b, b_scale, row=-1):
    return reference.gemv_ref(x, b, b_scale).to(x.dtype)


@torch.library.register_fake("blockfp8::gemv")
def _gemv_fake(x, b, b_scale, row=-1):
    return x.new_empty((x.shape[0], b.shape[0]))


def blockfp8_gemm(a: torch.Tensor, a_scale: torch.Tensor, b: torch.Tensor, b_scale: torch.Tensor,
                  out_dtype: torch.dtype = torch.bfloat16, row=None) -> torch.Tensor:
    """W8A8 block-scaled GEMM: a fp8 [M, K] with 1x128 scales, b fp8 [N, K] with 128x128 scales."""
    _need(a.dtype == reference.FP8_DTYPE and a.dim() == 2, f"a must be float8_e4m3fn [M, K], got {a.dtype} {tuple(a.shape)}")
    _need(a.stride(1) == 1, "a must have a contiguous K dimension")
    _need(out_dtype in _ACT_DTYPES, f"out_dtype must be bfloat16 or float16, got {out_dtype}")
    m, k = a.shape
    _check_weight(b, b_scale, k, a.device, 128)
    _need(a_scale.dtype == torch.float32 and tuple(a_scale.shape) == (m, k // 128),
          f"a_scale must be float32 [M, K/128] = {[m, k // 128]}, got {a_scale.dtype} {list(a_scale.shape)}")
    _need(a_scale.device == a.device, f"a_scale is on {a_scale.device} but a is on {a.device}")
    if a.is_cuda and HAS_CUDA_KERNELS:
        _need(bool(tile_table("gemm")), "blockfp8_gemm: this GPU has no W8A8 GEMM kernel (tables exist for SM90 and SM120, where built); "
              "use blockfp8_linear, which falls back to dequantize + cuBLAS")
        if row is None:
            _need(torch.ops.blockfp8.select_row("gemm", m, b.shape[0], k) >= 0,
                  f"blockfp8_gemm: no GEMM row takes M={m} N={b.shape[0]} K={k} (N must be a multiple of 8)")
        if a_scale.stride(0) != 1 or (m > 1 and a_scale.stride(1) < m) or a_scale.stride(1) % 4:
            a_scale = _m_major_scales(a_scale)  # the kernel's TMA reads M-major, 16-byte columns
    return torch.ops.blockfp8.gemm(a, a_scale, b, b_scale, out_dtype, _row_arg("gemm", row, m, b.shape[0], k))


def _gemm_ref(a, a_scale, b, b_scale, out_dtype, row=-1):
    return reference.gemm_ref(a, a_scale, b, b_scale).to(out_dtype)


@torch.library.register_fake("blockfp8::gemm")
def _gemm_fake(a, a_scale, b, b_scale, out_dtype, row=-1):
    return a.new_empty((a.shape[0], b.shape[0]), dtype=out_dtype)


def blockfp8_linear(x: torch.Tensor, b: torch.Tensor, b_scale: torch.Tensor,
                    bias: Optional[torch.Tensor] = None, row=None) -> torch.Tensor:
    """The full linear: x [..., K] bf16/fp16 -> [..., N] in x's dtype.

    The op picks GEMV (weight-only) or activation quant + W8A8 GEMM by M from this GPU's
    ``linear`` tile table; ``row`` forces a row.
    """
    _check_activation("x", x, rank=None)
    _need(x.dim() >= 1, "x must have at least one dimension (K)")
    n = _check_weight(b, b_scale, x.shape[-1], x.device, 16)
    if bias is not None:
        _need(bias.dim() == 1 and bias.shape[0] == n, f"bias must be 1-D [N] = [{n}], got {tuple(bias.shape)}")
        _need(bias.dtype == x.dtype, f"bias must have the activations' dtype {x.dtype}, got {bias.dtype}")
    x2 = x.reshape(-1, x.shape[-1])
    out = torch.ops.blockfp8.linear(x2, b, b_scale, bias, _row_arg("linear", row, x2.shape[0], n, x2.shape[1], x2))
    return out.reshape(*x.shape[:-1], n)


def _linear_ref(x, b, b_scale, bias=None, row=-1):
    # The reference backend is weight-only: the exact dequantized product, rounded once.
    return reference.linear_ref(x, b, b_scale, bias, quantize_activations=False).to(x.dtype)


@torch.library.register_fake("blockfp8::linear")
def _linear_fake(x, b, b_scale, bias=None, row=-1):
    return x.new_empty((x.shape[0], b.shape[0]))


# The packings of an NVFP4 weight nvfp4_linear reads (its ``packing`` argument; the op's int is the index).
NVFP4_PACKINGS = ("modelopt", "paired", "fragment")


def nvfp4_linear(x: torch.Tensor, b: torch.Tensor, b_scale: torch.Tensor, global_scale: torch.Tensor,
                 bias: Optional[torch.Tensor] = None, row=None, *, native: Optional[dict] = None,
                 packing: str = "modelopt") -> torch.Tensor:
    """NVFP4 linear: x [..., K] bf16/fp16 -> [..., N] in x's dtype.

    b uint8 [N, K/2] (two E2M1 codes per byte, low nibble first), b_scale float8_e4m3fn [N, K/16],
    global_scale fp32 with N elements (one per output row, so fused shards keep their own) or 1.
    Weight-only by default: the op picks its kernel row by M from the ``nvfp4`` tile table (decode
    GEMV, W4A16 tensor-core GEMM, FMA fallback); ``row`` forces one (index or name).

    ``packing``: how b and b_scale are laid out: ``"modelopt"`` (the checkpoint's, above), ``"paired"``
    (:func:`pair_nvfp4_weight`: the same bytes per row, each word's bits permuted) or ``"fragment"``
    (:func:`fragment_nvfp4_weight`: b in the tensor cores' fragment order and b_scale uint8 exp8 bytes,
    N % 16 == 0, K % 64 == 0). The vLLM layer stores what :func:`nvfp4_layer_packing` says for the GPU.
    Not every row reads every packing (the SM90 wgmma rows read the fragment one only, the mma.sync W4A16
    rows the other two): the op picks among those that do, and a forced row that does not is refused.

    ``native`` ({"b_scale_swizzled", "input_scale", "alpha"}: :func:`nvfp4_native_operands`) lets the
    op run W4A4 where ``nvfp4_native_path`` says so (SM120, M > 16): x quantized to NVFP4 with
    ``input_scale``, then the native block-scaled GEMM, which reads the ModelOpt packing (so ``native``
    with another packing is a ValueError). A forced ``row`` always runs weight-only.
    """
    _check_activation("x", x, rank=None)
    _need(x.dim() >= 1, "x must have at least one dimension (K)")
    k = x.shape[-1]
    _need(isinstance(b, torch.Tensor) and b.dtype == torch.uint8 and b.dim() == 2,
          f"b must be uint8 [N, K/2], got {getattr(b, 'dtype', type(b).__name__)} {tuple(getattr(b, 'shape', ()))}")
    _need(b.is_contiguous(), "b must be contiguous (row-major [N, K/2])")
    n = b.shape[0]
    _need(b.shape[1] * 2 == k, f"b must have K/2 = {k // 2} columns to match the activations' K = {k}, got {b.shape[1]}")
    _need(k % 32 == 0, f"K = {k} is not supported: NVFP4 needs a multiple of 32")
    _need(packing in NVFP4_PACKINGS, f"packing must be one of {NVFP4_PACKINGS}, got {packing!r}")
    scale_dtype = torch.uint8 if packing == "fragment" else reference.FP8_DTYPE
    _need(b_scale.dtype == scale_dtype and tuple(b_scale.shape) == (n, k // 16),
          f"b_scale must be {str(scale_dtype).removeprefix('torch.')} [N, K/16] = {[n, k // 16]} for the {packing} packing, got {b_scale.dtype} "
          f"{list(b_scale.shape)}")
    if packing == "fragment":
        why = reference.fragment_packing_rejects(n, k)
        _need(why is None, f"the fragment packing does not apply: {why}")
    _need(b_scale.is_contiguous(), "b_scale must be contiguous")
    _need(global_scale.dtype == torch.float32 and global_scale.numel() in (1, n),
          f"global_scale must be float32 with 1 or N = {n} elements, got {global_scale.dtype} {tuple(global_scale.shape)}")
    _need(global_scale.is_contiguous(), "global_scale must be contiguous")
    if bias is not None:
        _need(tuple(bias.shape) == (n,) and bias.dtype == x.dtype, f"bias must be [N] = [{n}] in {x.dtype}, got "
              f"{bias.dtype} {tuple(bias.shape)}")
        _need(bias.is_contiguous(), "bias must be contiguous")
    for name, t in (("b", b), ("b_scale", b_scale), ("global_scale", global_scale), ("bias", bias)):
        _need(t is None or t.device == x.device, f"{name} is on {t.device if t is not None else None} but x is on {x.device}")
    _need(native is None or packing == "modelopt",
          f"native needs packing='modelopt', got {packing!r}: the native GEMM reads the ModelOpt packing of b")
    extra = (None, None, None)
    if native is not None:
        sw, isc, alpha = native["b_scale_swizzled"], native["input_scale"], native["alpha"]
        _need(sw.dtype == reference.FP8_DTYPE and sw.numel() == math.prod(reference.nvfp4_sf_shape(n, k)),
              f"native b_scale_swizzled must be float8_e4m3fn with {math.prod(reference.nvfp4_sf_shape(n, k))} "
              f"elements (nvfp4_swizzle_scale of b_scale), got {sw.dtype} {tuple(sw.shape)}")
        for name, t in (("input_scale", isc), ("alpha", alpha)):
            _need(t.dtype == torch.float32 and t.numel() == 1, f"native {name} must be one float32 value")
        for name, t in (("b_scale_swizzled", sw), ("input_scale", isc), ("alpha", alpha)):
            _need(t.device == x.device and t.is_contiguous(), f"native {name} must be contiguous on {x.device}")
        extra = (sw, isc.reshape(1), alpha.reshape(1))
    x2 = x.reshape(-1, k)
    row_index = _row_arg("nvfp4", row, x2.shape[0], n, k, x2, query=f"nvfp4:{packing}")
    out = torch.ops.blockfp8.nvfp4_linear(x2, b, b_scale, global_scale.reshape(-1), bias, row_index, *extra,
                                          NVFP4_PACKINGS.index(packing))
    return out.reshape(*x.shape[:-1], n)


def pair_nvfp4_weight(b: torch.Tensor) -> torch.Tensor:
    """ModelOpt-packed NVFP4 weight uint8 [N, K/2] -> the paired packing that ``nvfp4_linear(...,
    packing="paired")`` reads (once, at load; same shape, K % 32 == 0). Each aligned 32-bit word's bits are
    permuted so the decode kernels turn each pair of values into 16-bit operands with one shift and one
    mask (``reference.NVFP4_PAIRED_BITS``); ``reference.unpair_nvfp4_weight`` inverts it."""
    _need(isinstance(b, torch.Tensor) and b.dtype == torch.uint8 and b.dim() == 2,
          f"b must be uint8 [N, K/2], got {getattr(b, 'dtype', type(b).__name__)} {tuple(getattr(b, 'shape', ()))}")
    _need(b.is_contiguous(), "b must be contiguous (row-major [N, K/2])")
    _need(b.shape[1] % 16 == 0, f"b must have K/2 columns with K % 32 == 0, got {b.shape[1]} columns")
    return reference.pair_nvfp4_weight(b)


def fragment_nvfp4_weight(b: torch.Tensor, b_scale: torch.Tensor) -> tuple:
    """ModelOpt-packed NVFP4 weight uint8 [N, K/2] and its e4m3 scales [N, K/16] -> (b, b_scale) in the fragment
    packing that ``nvfp4_linear(..., packing="fragment")`` reads (once, at load; N % 16 == 0, K % 64 == 0, scales
    non-negative): each lane of the tensor-core kernels loads exactly its mma fragment's codes, and the scales
    become exp8 bytes (exact for every positive e4m3 value; a zero scale's codes are zeroed instead).
    ``reference.unfragment_nvfp4_weight`` inverts it."""
    _need(isinstance(b, torch.Tensor) and b.dtype == torch.uint8 and b.dim() == 2,
          f"b must be uint8 [N, K/2], got {getattr(b, 'dtype', type(b).__name__)} {tuple(getattr(b, 'shape', ()))}")
    n, k = b.shape[0], 2 * b.shape[1]
    _need(b_scale.dtype == reference.FP8_DTYPE and tuple(b_scale.shape) == (n, k // 16),
          f"b_scale must be float8_e4m3fn [N, K/16] = {[n, k // 16]}, got {b_scale.dtype} {list(b_scale.shape)}")
    why = reference.fragment_packing_rejects(n, k)
    _need(why is None, f"the fragment packing does not apply: {why}")
    codes, exp8 = reference.fragment_nvfp4_weight(b.contiguous(), b_scale.contiguous())
    return codes.contiguous(), exp8.contiguous()


def nvfp4_layer_packing(n: int, k: int, device=None) -> str:
    """The packing the vLLM layer stores for an [N, K] NVFP4 weight on ``device`` (default: the current CUDA device):
    ``"fragment"`` where this build has the SM90 wgmma rows and the GPU is SM90 (N % 16, K % 64), else
    ``"paired"``. Without a GPU or the extension: ``"paired"`` (the reference backend reads any packing)."""
    device = torch.device(device) if device is not None else None
    if not HAS_CUDA_KERNELS or not torch.cuda.is_available() or (device is not None and device.type != "cuda"):
        return "paired"
    major, minor = torch.cuda.get_device_capability(device)
    return NVFP4_PACKINGS[int(torch.ops.blockfp8.nvfp4_layer_packing(10 * major + minor, n, k))]


def nvfp4_layer_weight(b: torch.Tensor, b_scale: torch.Tensor) -> tuple:
    """(b, b_scale, packing): a ModelOpt-packed weight and its e4m3 scales repacked as the vLLM layer stores them on
    b's device (:func:`nvfp4_layer_packing`; a weight with a negative scale, which exp8 cannot hold, stays paired),
    ready for ``nvfp4_linear(x, b, b_scale, ..., packing=packing)``."""
    packing = nvfp4_layer_packing(b.shape[0], 2 * b.shape[1], b.device)
    if packing == "fragment" and bool((b_scale.float() < 0).any()):  # one sync, at load
        packing = "paired"
    if packing == "fragment":
        return (*fragment_nvfp4_weight(b, b_scale), packing)
    return pair_nvfp4_weight(b.contiguous()), b_scale, packing


def _nvfp4_linear_ref(x, b, b_scale, global_scale, bias=None, row=-1, b_scale_swizzled=None, input_scale=None,
                      alpha=None, packing=0):
    # The reference backend is weight-only on every device (the native path needs the SM120 kernels).
    # Dequantize in the op and run one fp32 GEMM (CPU, or CUDA without the extension). Only device
    # ops on the given tensors: no host tensor is built, so CUDA graphs can capture it. e2m1 * e4m3
    # * an fp32 global scale is not representable in x's dtype: the output rounds once.
    if NVFP4_PACKINGS[packing] == "fragment":
        b, b_scale = reference.unfragment_nvfp4_weight(b, b_scale)
    elif NVFP4_PACKINGS[packing] == "paired":
        b = reference.unpair_nvfp4_weight(b)
    w = reference.dequantize_nvfp4(b, b_scale, global_scale.reshape(-1, 1))
    out = x.float() @ w.t()
    if bias is not None:
        out = out + bias.float()
    return out.to(x.dtype)


@torch.library.register_fake("blockfp8::nvfp4_linear")
def _nvfp4_fake(x, b, b_scale, global_scale, bias=None, row=-1, b_scale_swizzled=None, input_scale=None,
                alpha=None, packing=0):
    return x.new_empty((x.shape[0], b.shape[0]))


# --------------------------------------------------------------------------------------------
# Native NVFP4 (W4A4, SM120): activation quant, scale swizzle, the block-scaled GEMM
# --------------------------------------------------------------------------------------------


def _check_nvfp4_weight(name: str, b: torch.Tensor, k: int) -> int:
    _need(isinstance(b, torch.Tensor) and b.dtype == torch.uint8 and b.dim() == 2 and b.is_contiguous(),
          f"{name} must be contiguous uint8 [rows, K/2], got {getattr(b, 'dtype', type(b).__name__)}")
    _need(b.shape[1] * 2 == k, f"{name} must have K/2 = {k // 2} columns, got {b.shape[1]}")
    return b.shape[0]


def _one_fp32(name: str, t: torch.Tensor, device: torch.device) -> None:
    _need(isinstance(t, torch.Tensor) and t.dtype == torch.float32 and t.numel() == 1,
          f"{name} must be a float32 tensor with one value, got {getattr(t, 'dtype', type(t).__name__)} "
          f"{tuple(getattr(t, 'shape', ()))}")
    _need(t.device == device, f"{name} is on {t.device}, expected {device} (a device value: no host sync)")


def nvfp4_quant(x: torch.Tensor, input_scale: torch.Tensor):
    """Quantize activations x [M, K] (K % 32 == 0) to NVFP4 for the native GEMM.

    ``input_scale`` (one fp32 on x's device) is the checkpoint's activation scale amax / (6 * 448): it
    multiplies to dequantize. Returns (packed uint8 [M, K/2], scales float8_e4m3fn swizzled into the
    GEMM's layout, shape ``reference.nvfp4_sf_shape(M, K)``, padding 0). Bit-exact with
    ``reference.quantize_nvfp4_activations`` followed by ``reference.swizzle_nvfp4_scale``.
    """
    _check_activation("x", x)
    _need(x.shape[1] % 32 == 0, f"K = {x.shape[1]} must be a multiple of 32")
    _one_fp32("input_scale", input_scale, x.device)
    return torch.ops.blockfp8.nvfp4_quant(x, input_scale.reshape(1))


def _nvfp4_quant_ref(x, input_scale):
    q, s = reference.quantize_nvfp4_activations(x, input_scale)
    return q, reference.swizzle_nvfp4_scale(s)


@torch.library.register_fake("blockfp8::nvfp4_quant")
def _nvfp4_quant_fake(x, input_scale):
    m, k = x.shape
    return (x.new_empty((m, k // 2), dtype=torch.uint8),
            x.new_empty(reference.nvfp4_sf_shape(m, k), dtype=reference.FP8_DTYPE))


def nvfp4_swizzle_scale(scale: torch.Tensor) -> torch.Tensor:
    """A weight's plain float8_e4m3fn scales [N, K/16] -> the native GEMM's layout (once, at load):
    shape ``reference.nvfp4_sf_shape(N, K)``, padding 0. Bit-exact with ``reference.swizzle_nvfp4_scale``."""
    _need(isinstance(scale, torch.Tensor) and scale.dtype == reference.FP8_DTYPE and scale.dim() == 2,
          f"scale must be float8_e4m3fn [N, K/16], got {getattr(scale, 'dtype', type(scale).__name__)}")
    _need(scale.is_contiguous(), "scale must be contiguous")
    return torch.ops.blockfp8.nvfp4_swizzle_scale(scale)


@torch.library.register_fake("blockfp8::nvfp4_swizzle_scale")
def _nvfp4_swizzle_fake(scale):
    return scale.new_empty(reference.nvfp4_sf_shape(scale.shape[0], scale.shape[1] * 16))


def _check_native_operands(a, a_scale, b, b_scale, alpha) -> tuple:
    """(m, n, k) of native NVFP4 operands: packed a [M, K/2] and b [N, K/2], their swizzled e4m3 scales, alpha one
    fp32, all on a's device; ValueError naming the first one that is off."""
    _need(isinstance(a, torch.Tensor) and a.dim() == 2, "a must be uint8 [M, K/2]")
    k = a.shape[1] * 2
    m = _check_nvfp4_weight("a", a, k)
    n = _check_nvfp4_weight("b", b, k)
    for name, t, rows in (("a_scale", a_scale, m), ("b_scale", b_scale, n)):
        want = reference.nvfp4_sf_shape(rows, k)
        _need(t.dtype == reference.FP8_DTYPE and tuple(t.shape) == want and t.is_contiguous(),
              f"{name} must be swizzled contiguous float8_e4m3fn {list(want)}, got {t.dtype} {list(t.shape)}")
        _need(t.device == a.device, f"{name} is on {t.device} but a is on {a.device}")
    _need(b.device == a.device, f"b is on {b.device} but a is on {a.device}")
    _one_fp32("alpha", alpha, a.device)
    return m, n, k


def nvfp4_gemm(a: torch.Tensor, a_scale: torch.Tensor, b: torch.Tensor, b_scale: torch.Tensor,
               alpha: torch.Tensor, out_dtype: torch.dtype = torch.bfloat16, row=None) -> torch.Tensor:
    """Native W4A4: out[M, N] = alpha * dequant(a) @ dequant(b)^T, both scales swizzled
    (:func:`nvfp4_quant`, :func:`nvfp4_swizzle_scale`), alpha one fp32 on the device (input_scale *
    weight_scale_2). CUDA: SM120 only (sm_120a kernels). ``row``: index into ``nvfp4_native_rows()``."""
    _need(out_dtype in _ACT_DTYPES, f"out_dtype must be bfloat16 or float16, got {out_dtype}")
    m, n, k = _check_native_operands(a, a_scale, b, b_scale, alpha)
    if a.is_cuda and HAS_CUDA_KERNELS:
        _need(tuple(torch.cuda.get_device_capability(a.device)) == (12, 0) and nvfp4_native_rows(),
              "nvfp4_gemm runs on SM120 (compute capability 12.0) with a build that has sm_120a")
        rows = nvfp4_native_rows()
        _need(n % 32 == 0 and k % 128 == 0, f"no native NVFP4 row takes N={n} K={k}: N % 32 == 0 and K % 128 == 0")
        if row is not None:
            _need(0 <= int(row) < len(rows), f"row {row} is out of range for the native NVFP4 rows {rows}")
            tile_k = int(rows[int(row)]["name"].rsplit("x", 1)[1])
            _need(k % tile_k == 0, f"row {rows[int(row)]['name']} needs K % {tile_k} == 0, got K = {k}")
    return torch.ops.blockfp8.nvfp4_gemm(a, a_scale, b, b_scale, alpha.reshape(1), out_dtype,
                                         -1 if row is None else int(row))


def _nvfp4_gemm_ref(a, a_scale, b, b_scale, alpha, out_dtype, row=-1):
    k = a.shape[1] * 2
    sa = reference.unswizzle_nvfp4_scale(a_scale, a.shape[0], k)
    sb = reference.unswizzle_nvfp4_scale(b_scale, b.shape[0], k)
    return reference.nvfp4_gemm_ref(a, sa, b, sb, alpha).to(out_dtype)


@torch.library.register_fake("blockfp8::nvfp4_gemm")
def _nvfp4_gemm_fake(a, a_scale, b, b_scale, alpha, out_dtype, row=-1):
    return a.new_empty((a.shape[0], b.shape[0]), dtype=out_dtype)


def nvfp4_native_operands(b_scale: torch.Tensor, input_scale: torch.Tensor, weight_global_scale: torch.Tensor) -> dict:
    """What ``nvfp4_linear(..., native=)`` needs, built once at load: the swizzled copy of b_scale (the plain
    one stays for the decode GEMV: +1/16 byte per weight parameter), the activation scale, and alpha =
    input_scale * weight_scale_2 (one value: the native epilogue has one alpha, so fused shards must share
    weight_scale_2; callers check)."""
    gs = weight_global_scale.reshape(-1)[:1].float()
    isc = input_scale.reshape(-1)[:1].float().contiguous()
    return {"b_scale_swizzled": nvfp4_swizzle_scale(b_scale), "input_scale": isc, "alpha": (isc * gs).contiguous()}


def nvfp4_gemm_reference(a: torch.Tensor, a_scale: torch.Tensor, b: torch.Tensor, b_scale: torch.Tensor,
                         alpha: torch.Tensor):
    """The native NVFP4 GEMM's arch-neutral reference kernel (any CUDA GPU), the yardstick of the native rows'
    first-use self-check: operands as :func:`nvfp4_gemm` (swizzled scales), K % 16 == 0. Returns (fp32 [M, N]
    alpha * dequant(a) @ dequant(b)^T, fp32 [M, N] |alpha| * sum_k |a| |b| sa sb: the check's tolerance scale)."""
    _need(isinstance(a, torch.Tensor) and a.dim() == 2, "a must be uint8 [M, K/2]")
    _need(a.shape[1] > 0 and a.shape[1] * 2 % 16 == 0, f"K = {a.shape[1] * 2} must be a positive multiple of 16")
    _check_native_operands(a, a_scale, b, b_scale, alpha)
    return torch.ops.blockfp8.nvfp4_gemm_reference(a, a_scale, b, b_scale, alpha.reshape(1))


def _nvfp4_gemm_reference_ref(a, a_scale, b, b_scale, alpha):
    k = a.shape[1] * 2
    sa = reference.unswizzle_nvfp4_scale(a_scale, a.shape[0], k)
    sb = reference.unswizzle_nvfp4_scale(b_scale, b.shape[0], k)
    ref = reference.nvfp4_gemm_ref(a, sa, b, sb, alpha)

    def mags(t):  # sign bits cleared: 0x77 on packed codes, 0x7f on e4m3
        return t.view(torch.uint8) & (0x77 if t.dtype == torch.uint8 else 0x7F)

    mag = reference.nvfp4_gemm_ref(mags(a), mags(sa).view(reference.FP8_DTYPE), mags(b),
                                   mags(sb).view(reference.FP8_DTYPE), alpha.abs())
    return ref.float(), mag.float()


@torch.library.register_fake("blockfp8::nvfp4_gemm_reference")
def _nvfp4_gemm_reference_fake(a, a_scale, b, b_scale, alpha):
    shape = (a.shape[0], b.shape[0])
    return a.new_empty(shape, dtype=torch.float32), a.new_empty(shape, dtype=torch.float32)


for _name, _fn in (("per_token_group_quant", _quant_ref), ("gemv", _gemv_ref), ("gemm", _gemm_ref),
                   ("linear", _linear_ref), ("nvfp4_linear", _nvfp4_linear_ref), ("nvfp4_quant", _nvfp4_quant_ref),
                   ("nvfp4_swizzle_scale", reference.swizzle_nvfp4_scale), ("nvfp4_gemm", _nvfp4_gemm_ref),
                   ("nvfp4_gemm_reference", _nvfp4_gemm_reference_ref)):
    _lib.impl(_name, _fn, "CPU")
    if not HAS_CUDA_KERNELS:
        _lib.impl(_name, _fn, "CUDA")

