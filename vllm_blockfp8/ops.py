"""Public ops: schemas (defined once, here), typed wrappers with input validation, fakes.

Every op is a ``torch.ops.blockfp8.*`` operator so torch.compile and CUDA graphs see one opaque
node. The CUDA implementations live in the compiled extension ``vllm_blockfp8._C`` (stable ABI,
``csrc/ops.cpp``). CPU tensors, and CUDA tensors when the extension was not built, run the
reference in ``reference.py`` through the same entry points, so CPU tests exercise the wrappers,
the validation and the fakes that the GPU path uses.

Row selection by M happens inside the op (C++), never in traced Python: ``row=None`` lets the op
pick from its tile table, an int or a row name forces a row (tests, benchmarks).
"""

from __future__ import annotations

import contextlib
import functools
import json
import logging
import math
import os
from typing import Optional

import torch

from . import reference

logger = logging.getLogger("vllm_blockfp8")

FAMILIES = ("linear", "gemv", "gemm", "quant", "nvfp4")

_SCHEMAS = {
    "per_token_group_quant": "per_token_group_quant(Tensor x, int group_size, int row=-1) -> (Tensor, Tensor)",
    "gemv": "gemv(Tensor x, Tensor b, Tensor b_scale, int row=-1) -> Tensor",
    "gemm": "gemm(Tensor a, Tensor a_scale, Tensor b, Tensor b_scale, ScalarType out_dtype, int row=-1) -> Tensor",
    "linear": "linear(Tensor x, Tensor b, Tensor b_scale, Tensor? bias=None, int row=-1) -> Tensor",
    "nvfp4_linear": ("nvfp4_linear(Tensor x, Tensor b, Tensor b_scale, Tensor global_scale, Tensor? bias=None, "
                     "int row=-1, Tensor? b_scale_swizzled=None, Tensor? input_scale=None, Tensor? alpha=None) "
                     "-> Tensor"),
    "nvfp4_quant": "nvfp4_quant(Tensor x, Tensor input_scale) -> (Tensor, Tensor)",
    "nvfp4_swizzle_scale": "nvfp4_swizzle_scale(Tensor scale) -> Tensor",
    "nvfp4_gemm": ("nvfp4_gemm(Tensor a, Tensor a_scale, Tensor b, Tensor b_scale, Tensor alpha, ScalarType out_dtype, "
                   "int row=-1) -> Tensor"),
    "nvfp4_native_rows": "nvfp4_native_rows() -> str",
    "nvfp4_native_path": "nvfp4_native_path(int cc, int m, int n, int k) -> str",
    "nvfp4_gemm_reference": ("nvfp4_gemm_reference(Tensor a, Tensor a_scale, Tensor b, Tensor b_scale, Tensor alpha) "
                             "-> (Tensor, Tensor)"),
    "nvfp4_self_check": "nvfp4_self_check() -> str",
    "nvfp4_self_check_run": "nvfp4_self_check_run(int row, bool corrupt) -> str",
    "tile_table": "tile_table(str family) -> str",
    "select_row": "select_row(str family, int m, int n, int k) -> int",
    "row_rejects": "row_rejects(str family, int row, int m, int n, int k, int x_address, int x_stride) -> str",
    "gemv_pins_residency": "gemv_pins_residency(int column_blocks, int sm_count, int ksplit, int m_tiles) -> bool",
    "gemm_k_plan": "gemm_k_plan(int row, int m, int n, int k, int sm_count) -> str",
    "gemm_table_plan": "gemm_table_plan(str table, int row, int m, int n, int k, int sm_count) -> str",
    "gemm_table_rows": "gemm_table_rows(str table) -> str",
    "gemm_self_check": "gemm_self_check(str table) -> str",
    "build_info": "build_info() -> str",
    "set_sm90_pdl": "set_sm90_pdl(str mode) -> str",
    "set_gemm_table": "set_gemm_table(str table) -> str",
    "set_tuned_rows": "set_tuned_rows(str entries) -> str",
    "tuned_rows": "tuned_rows() -> str",
}

_lib = torch.library.Library("blockfp8", "DEF")  # noqa: TOR901 - the schemas' one home
for _schema in _SCHEMAS.values():
    _lib.define(_schema)


def _load_extension():
    """Load ``_C`` as a plain shared library: it has no Python module init (stable ABI, no
    pybind); loading it runs its STABLE_TORCH_LIBRARY_IMPL registrations."""
    import importlib.util

    spec = importlib.util.find_spec(f"{__package__}._C")
    if spec is None or not spec.origin:
        raise ImportError("vllm_blockfp8._C is not built (installed without nvcc?)")
    torch.ops.load_library(spec.origin)


# Benchmark switches of the SM90 GEMM (docs/DEVELOPING.md, gemm/NOTES.md), read once by the extension: the
# persistent tile order, and the split count / reduction of the split-K capable rows. Checked here so
# a typo fails at import with its name, not silently or mid-op.
SM90_ENV_SWITCHES = {"BLOCKFP8_SM90_RASTER": ("heuristic", "along_m", "along_n"),
                  "BLOCKFP8_SM90_SWIZZLE": ("1", "2", "4", "8"),
                  "BLOCKFP8_SM90_SPLITS": ("1", "2", "3", "4", "6", "8"),
                  "BLOCKFP8_SM90_REDUCTION": ("deterministic", "nondeterministic"),
                  "BLOCKFP8_SM90_PDL": ("0", "1", "gemm"),
                  "BLOCKFP8_SM90_TILE_N": ("16", "32", "48", "64", "80", "96", "112", "128", "144", "160", "192"),
                  "BLOCKFP8_SM90_NARROW_SPLIT": ("0", "1")}


# BLOCKFP8_GEMM_TABLE forces the W8A8 GEMM's row table for the process where its kernels run on the GPU (the SM89
# rows run on SM90 too, so the H200 tests and times them); "auto" (or unset) is the GPU's own table.
GEMM_TABLES = ("auto", "sm89", "sm90", "sm120")


def check_sm90_env(environ=None) -> None:
    environ = os.environ if environ is None else environ
    table = environ.get("BLOCKFP8_GEMM_TABLE", "")
    if table and table not in GEMM_TABLES:
        raise ValueError(f"BLOCKFP8_GEMM_TABLE={table!r}: expected one of {', '.join(GEMM_TABLES)} (or unset)")
    for name, allowed in SM90_ENV_SWITCHES.items():
        value = environ.get(name, "")
        if value and value not in allowed:
            raise ValueError(f"{name}={value!r}: expected one of {', '.join(allowed)} (or unset)")


check_sm90_env()

# BLOCKFP8_FORCE=family:ROW[,family:ROW...] makes each named family run ROW wherever a call requests no row (under
# `vllm serve`, every call). The op reads the variable itself (ops.cpp pick_row), so the traced graph stays one node;
# a row that refuses a problem falls back to the table's choice with one line on stderr. Syntax and family are
# checked here, at import; row names need the GPU's tables (check_forced_rows).
FORCE_ENV = "BLOCKFP8_FORCE"


def parse_force(value: str) -> dict:
    """{family: row name} of a BLOCKFP8_FORCE value; ValueError naming the bad piece."""
    forced = {}
    for piece in (value or "").split(","):
        if not piece.strip():
            continue
        family, sep, row = (part.strip() for part in piece.partition(":"))
        if not sep or not family or not row:
            raise ValueError(f"{FORCE_ENV}={value!r}: {piece.strip()!r} is not family:ROW "
                             f"(families: {', '.join(FAMILIES)})")
        if family not in FAMILIES:
            raise ValueError(f"{FORCE_ENV}={value!r}: unknown family {family!r}; families: {', '.join(FAMILIES)}")
        if family in forced:
            raise ValueError(f"{FORCE_ENV}={value!r}: family {family!r} is named twice")
        forced[family] = row
    return forced


FORCED_ROWS = parse_force(os.environ.get(FORCE_ENV, ""))

try:
    _load_extension()
    HAS_CUDA_KERNELS = True
    _IMPORT_ERROR = None
except (ImportError, OSError) as exc:  # pure-Python install: the reference backend serves every op
    HAS_CUDA_KERNELS = False
    _IMPORT_ERROR = exc


def kernels_unavailable_reason(capability: Optional[tuple] = None, extension: bool = True) -> Optional[str]:
    """Why this process cannot run the CUDA kernels, or None: "no CUDA GPU is visible", the GPU's
    capability where ``capability`` (major, minor) is required, and/or why the compiled extension
    is not loaded (not built, or its load error) where ``extension``. Each missing piece is named,
    so "no GPU" is never reported as "no extension" or the other way round."""
    why = []
    if not torch.cuda.is_available():
        why.append("no CUDA GPU is visible")
    elif capability is not None and tuple(torch.cuda.get_device_capability()) != tuple(capability):
        have = "".join(map(str, torch.cuda.get_device_capability()))
        why.append(f"the GPU is SM{have}, this needs SM{''.join(map(str, capability))}")
    if extension and not HAS_CUDA_KERNELS:
        why.append(f"the compiled extension vllm_blockfp8._C is not loaded ({_IMPORT_ERROR})")
    return "; ".join(why) or None


# --------------------------------------------------------------------------------------------
# Validation (ValueError naming the argument and the expectation)
# --------------------------------------------------------------------------------------------

_ACT_DTYPES = (torch.bfloat16, torch.float16)


def _need(cond: bool, msg: str) -> None:
    if not cond:
        raise ValueError(msg)


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


def _row_arg(family: str, row, m: int, n: int, k: int, x: Optional[torch.Tensor] = None) -> int:
    """The row index for the op: -1 (select by M) or a forced row that can run this problem.

    A forced row's precondition is checked here, before the op: an error raised inside a
    stable-ABI kernel after it took its tensor arguments would not unwind safely.
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
    why = torch.ops.blockfp8.row_rejects(family, index, m, n, k, address, stride)
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


def nvfp4_linear(x: torch.Tensor, b: torch.Tensor, b_scale: torch.Tensor, global_scale: torch.Tensor,
                 bias: Optional[torch.Tensor] = None, row=None, *, native: Optional[dict] = None) -> torch.Tensor:
    """NVFP4 linear: x [..., K] bf16/fp16 -> [..., N] in x's dtype.

    b uint8 [N, K/2] (two E2M1 codes per byte, low nibble first), b_scale float8_e4m3fn [N, K/16],
    global_scale fp32 with N elements (one per output row, so fused shards keep their own) or 1.
    Weight-only by default: the op picks its kernel row by M from the ``nvfp4`` tile table (decode
    GEMV, W4A16 tensor-core GEMM, FMA fallback); ``row`` forces one (index or name).

    ``native`` ({"b_scale_swizzled", "input_scale", "alpha"}: :func:`nvfp4_native_operands`) lets the
    op run W4A4 where ``nvfp4_native_path`` says so (SM120, M > 16): x quantized to NVFP4 with
    ``input_scale``, then the native block-scaled GEMM. A forced ``row`` always runs weight-only.
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
    _need(b_scale.dtype == reference.FP8_DTYPE and tuple(b_scale.shape) == (n, k // 16),
          f"b_scale must be float8_e4m3fn [N, K/16] = {[n, k // 16]}, got {b_scale.dtype} {list(b_scale.shape)}")
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
    out = torch.ops.blockfp8.nvfp4_linear(x2, b, b_scale, global_scale.reshape(-1), bias,
                                          _row_arg("nvfp4", row, x2.shape[0], n, k, x2), *extra)
    return out.reshape(*x.shape[:-1], n)


def _nvfp4_linear_ref(x, b, b_scale, global_scale, bias=None, row=-1, b_scale_swizzled=None, input_scale=None,
                      alpha=None):
    # The reference backend is weight-only on every device (the native path needs the SM120 kernels).
    # Dequantize in the op and run one fp32 GEMM (CPU, or CUDA without the extension). Only device
    # ops on the given tensors: no host tensor is built, so CUDA graphs can capture it. e2m1 * e4m3
    # * an fp32 global scale is not representable in x's dtype: the output rounds once.
    w = reference.dequantize_nvfp4(b, b_scale, global_scale.reshape(-1, 1))
    out = x.float() @ w.t()
    if bias is not None:
        out = out + bias.float()
    return out.to(x.dtype)


@torch.library.register_fake("blockfp8::nvfp4_linear")
def _nvfp4_fake(x, b, b_scale, global_scale, bias=None, row=-1, b_scale_swizzled=None, input_scale=None,
                alpha=None):
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


def nvfp4_gemm(a: torch.Tensor, a_scale: torch.Tensor, b: torch.Tensor, b_scale: torch.Tensor,
               alpha: torch.Tensor, out_dtype: torch.dtype = torch.bfloat16, row=None) -> torch.Tensor:
    """Native W4A4: out[M, N] = alpha * dequant(a) @ dequant(b)^T, both scales swizzled
    (:func:`nvfp4_quant`, :func:`nvfp4_swizzle_scale`), alpha one fp32 on the device (input_scale *
    weight_scale_2). CUDA: SM120 only (sm_120a kernels). ``row``: index into ``nvfp4_native_rows()``."""
    _need(out_dtype in _ACT_DTYPES, f"out_dtype must be bfloat16 or float16, got {out_dtype}")
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


def nvfp4_native_rows() -> list:
    """The SM120 native NVFP4 GEMM rows as this build compiled them ([] without sm_120a or the extension);
    no GPU needed."""
    return json.loads(torch.ops.blockfp8.nvfp4_native_rows()) if HAS_CUDA_KERNELS else []


def nvfp4_native_path(cc: tuple, m: int, n: int, k: int) -> dict:
    """Which path ``nvfp4_linear`` (given native operands) takes for (M, N, K) on a GPU of capability ``cc``
    (major, minor): {"native": True, "row": name} or {"native": False, "why": reason}. Host logic, no GPU;
    BLOCKFP8_NVFP4_W4A16=1 (read once per process) keeps every GPU weight-only."""
    if not HAS_CUDA_KERNELS:
        return {"native": False, "why": f"the compiled extension is not loaded ({_IMPORT_ERROR})"}
    return json.loads(torch.ops.blockfp8.nvfp4_native_path(cc[0] * 10 + cc[1], m, n, k))


for _name, _fn in (("per_token_group_quant", _quant_ref), ("gemv", _gemv_ref), ("gemm", _gemm_ref),
                   ("linear", _linear_ref), ("nvfp4_linear", _nvfp4_linear_ref), ("nvfp4_quant", _nvfp4_quant_ref),
                   ("nvfp4_swizzle_scale", reference.swizzle_nvfp4_scale), ("nvfp4_gemm", _nvfp4_gemm_ref)):
    _lib.impl(_name, _fn, "CPU")
    if not HAS_CUDA_KERNELS:
        _lib.impl(_name, _fn, "CUDA")


# --------------------------------------------------------------------------------------------
# Tile tables and build facts (observable, never device-queried at import)
# --------------------------------------------------------------------------------------------

if not HAS_CUDA_KERNELS:
    _lib.impl("tile_table", lambda family: "[]", "CompositeExplicitAutograd")
    _lib.impl("select_row", lambda family, m, n, k: -1, "CompositeExplicitAutograd")
    _lib.impl("row_rejects", lambda family, row, m, n, k, address, stride: "", "CompositeExplicitAutograd")
    _lib.impl("build_info", lambda: json.dumps({"compiled": False, "archs": [], "families": {}}),
              "CompositeExplicitAutograd")
    _lib.impl("gemv_pins_residency", lambda cb, sm, ks, mt: False, "CompositeExplicitAutograd")
    _lib.impl("gemm_k_plan", lambda row, m, n, k, sm: "", "CompositeExplicitAutograd")
    _lib.impl("set_sm90_pdl", lambda mode: "0", "CompositeExplicitAutograd")
    _lib.impl("set_tuned_rows", lambda entries: "", "CompositeExplicitAutograd")
    _lib.impl("tuned_rows", lambda: "", "CompositeExplicitAutograd")
    _lib.impl("nvfp4_native_rows", lambda: "[]", "CompositeExplicitAutograd")
    _lib.impl("nvfp4_native_path", lambda cc, m, n, k: json.dumps({"native": False, "why": "no extension"}),
              "CompositeExplicitAutograd")


def tile_table(family: str) -> list:
    """The rows of ``family``'s tile table for the current GPU: [{name, max_m, reason}].

    Empty without a CUDA GPU or without the compiled extension; ``quant``, whose table is the
    same on every arch, is listed whenever the extension is built.
    """
    _need(family in FAMILIES, f"family must be one of {FAMILIES}, got {family!r}")
    if not HAS_CUDA_KERNELS or (family != "quant" and not torch.cuda.is_available()):
        return []
    return json.loads(torch.ops.blockfp8.tile_table(family))


def selected_row(family: str, m: int, n: int, k: int) -> Optional[str]:
    """Name of the row the op would pick for an (M, N, K) problem on this GPU, or None."""
    rows = tile_table(family)
    if not rows:
        return None
    i = torch.ops.blockfp8.select_row(family, m, n, k)
    return rows[i]["name"] if i >= 0 else None


def check_forced_rows(forced: Optional[dict] = None) -> None:
    """ValueError where a BLOCKFP8_FORCE row (``forced``: FORCED_ROWS) is not in its family's table on this GPU,
    listing the valid rows. Where the tables cannot be read (no GPU, no extension) there is nothing to check: the
    kernels do not run there either. Called where vLLM builds the linear methods, so `vllm serve` fails at startup."""
    forced = FORCED_ROWS if forced is None else forced
    if not forced or kernels_unavailable_reason() is not None:
        return
    for family, row in forced.items():
        names = [r["name"] for r in tile_table(family)]
        if row not in names:
            where = " (the GEMM's rows follow BLOCKFP8_GEMM_TABLE)" if family in ("gemm", "linear") else ""
            raise ValueError(f"{FORCE_ENV}: no {family} row {row!r} on this GPU{where}; valid {family} rows: "
                             f"{', '.join(names) or 'none (this build has no such kernels for this GPU)'}")


TUNED_FIELDS = ("family", "n", "k", "m_min", "m_max", "row")


def set_tuned_rows(entries) -> None:
    """Replace the op's tuned table: dicts with TUNED_FIELDS (``blockfp8 tune``'s overrides; tuning.py loads them
    from a file). A call that requests no row and matches (family, N, K, m_min <= M <= m_max) runs the entry's row
    where it can run the call (else the table's choice, one line on stderr); BLOCKFP8_FORCE wins over it. An empty
    list clears the table. Without the compiled extension there is no table and this does nothing."""
    lines = []
    for e in entries:
        _need(set(TUNED_FIELDS) <= set(e), f"tuned entry {e!r} lacks {sorted(set(TUNED_FIELDS) - set(e))}")
        _need(e["family"] in FAMILIES and str(e["row"]).isprintable() and " " not in str(e["row"]),
              f"tuned entry {e!r}: family must be one of {FAMILIES} and row a name")
        lines.append(" ".join(str(e[f]) for f in TUNED_FIELDS))
    why = torch.ops.blockfp8.set_tuned_rows("\n".join(lines))
    _need(not why, f"set_tuned_rows: {why}")


def tuned_rows() -> list:
    """The op's tuned table in force (set_tuned_rows' dicts)."""
    out = []
    for line in torch.ops.blockfp8.tuned_rows().splitlines():
        values = line.split()
        out.append({f: (v if f in ("family", "row") else int(v)) for f, v in zip(TUNED_FIELDS, values)})
    return out


def gemv_pins_residency(column_blocks: int, sm_count: int, ksplit: int, m_tiles: int) -> bool:
    """The GEMV residency-pinning predicate (host logic, testable at a fixed SM count)."""
    return bool(torch.ops.blockfp8.gemv_pins_residency(column_blocks, sm_count, ksplit, m_tiles))


def gemm_k_plan(row: int, m: int, n: int, k: int, sm_count: Optional[int] = None) -> Optional[dict]:
    """How SM90 GEMM row number ``row`` (its index in the tile table; -1: the row the table
    selects) runs an (M, N, K) problem: {"row": name, "plan": "data-parallel" | "stream-K" |
    "split-K xS" | "K slices xS", "order": "RASTER:SWIZZLE", "workspace_bytes": B, "tile_n": W} (the persistent
    tile order in the BLOCKFP8_SM90_RASTER / _SWIZZLE vocabulary, with the swizzle CUTLASS ends up using; the
    workspace the launch allocates: 0 for data-parallel plans, else split/stream-K state or K-slice partials;
    the weight-tile width where the row picks one per problem (the `sm90_tok64_fitn*` rows), else 0; "pdl": whether it
    launches programmatically in this process's launch mode, set_sm90_pdl).
    Host logic (sm_count defaults to the current GPU's; give it to ask without a GPU), with the
    BLOCKFP8_SM90_* switches applied. None when the build has no SM90 GEMM."""
    if sm_count is None:
        _need(torch.cuda.is_available(), "gemm_k_plan: give sm_count when no CUDA GPU is present")
        sm_count = torch.cuda.get_device_properties(torch.cuda.current_device()).multi_processor_count
    out = torch.ops.blockfp8.gemm_k_plan(row, m, n, k, sm_count)
    plan = json.loads(out) if out else None
    _need(plan is None or "error" not in plan, f"gemm_k_plan(row={row}, m={m}, n={n}, k={k}, "
          f"sm_count={sm_count}): {plan and plan.get('error')}")
    return plan


def set_sm90_pdl(mode: str) -> str:
    """Set this process's SM90 launch mode (``BLOCKFP8_SM90_PDL``'s values: ``0``, ``1``, ``gemm``) and
    return the previous one; the environment variable only gives the starting mode. Calls launched
    after it use the new mode; a CUDA graph keeps the mode it was captured in, so benchmarks capture
    both modes in one process. The results are the same bits in every mode. Without the compiled
    extension there is nothing to launch and it returns ``0``.
    """
    allowed = SM90_ENV_SWITCHES["BLOCKFP8_SM90_PDL"]
    _need(mode in allowed, f"set_sm90_pdl: mode must be one of {', '.join(allowed)}, got {mode!r}")
    return torch.ops.blockfp8.set_sm90_pdl(mode)


@contextlib.contextmanager
def sm90_pdl(mode: str):
    """``set_sm90_pdl(mode)`` for the calls (or the graph capture) inside the block, then the mode before it."""
    was = set_sm90_pdl(mode)
    try:
        yield
    finally:
        set_sm90_pdl(was)


def build_info() -> dict:
    """Which archs and kernel families the extension was compiled with."""
    info = json.loads(torch.ops.blockfp8.build_info())
    if _IMPORT_ERROR is not None:
        info["import_error"] = str(_IMPORT_ERROR)
    return info


def set_gemm_table(table: str) -> str:
    """Force the W8A8 GEMM's row table for this process (``BLOCKFP8_GEMM_TABLE``'s values: ``auto``,
    ``sm89``, ``sm90``, ``sm120``) and return the previous setting. A forced table serves only GPUs its
    kernels run on (the SM89 rows run on SM90 as well, which is how an H200 tests them); elsewhere the
    GPU's own table serves. The linear op's path table follows the GEMM table. Needs the extension."""
    _need(table in GEMM_TABLES, f"set_gemm_table: table must be one of {', '.join(GEMM_TABLES)}, got {table!r}")
    _need(HAS_CUDA_KERNELS, f"set_gemm_table needs the compiled extension ({_IMPORT_ERROR})")
    return torch.ops.blockfp8.set_gemm_table(table)


@contextlib.contextmanager
def gemm_table(table: str):
    """``set_gemm_table(table)`` for the calls (or the graph capture) inside the block, then the table before it."""
    was = set_gemm_table(table)
    try:
        yield
    finally:
        set_gemm_table(was)


def gemm_table_rows(table: str) -> list:
    """The rows of the W8A8 GEMM table ``table`` (``sm89``, ``sm90``, ``sm120``) as this build compiled them,
    without a GPU: [] for a table the build lacks."""
    _need(table in GEMM_TABLES[1:], f"gemm_table_rows: table must be one of {', '.join(GEMM_TABLES[1:])}")
    _need(HAS_CUDA_KERNELS, f"gemm_table_rows needs the compiled extension ({_IMPORT_ERROR})")
    return json.loads(torch.ops.blockfp8.gemm_table_rows(table))


def gemm_self_check(table: str) -> list:
    """Each row of the W8A8 GEMM table ``table`` with its first-use self-check state in this process
    (``unchecked``, ``passed`` or ``failed``, and the failure's detail). A table checks itself on the GPU it has
    never run on here (SM89, SM120), or everywhere with ``BLOCKFP8_SELF_CHECK=always``; a failed row yields to the
    reference kernel (``blockfp8_gemm``) or to dequantize + cuBLAS (``blockfp8_linear``)."""
    _need(table in GEMM_TABLES[1:], f"gemm_self_check: table must be one of {', '.join(GEMM_TABLES[1:])}")
    _need(HAS_CUDA_KERNELS, f"gemm_self_check needs the compiled extension ({_IMPORT_ERROR})")
    return json.loads(torch.ops.blockfp8.gemm_self_check(table))


def gemm_table_plan(table: str, m: int, n: int, k: int, sm_count: int, row: int = -1) -> Optional[dict]:
    """The plan of ``table``'s row ``row`` (-1: the row its planner chooses) for an (m, n, k) problem at
    ``sm_count`` SMs, as ``gemm_k_plan`` answers for SM90: host logic, no GPU needed. None when the build
    lacks the table; ValueError for a problem the table cannot run."""
    _need(table in GEMM_TABLES[1:], f"gemm_table_plan: table must be one of {', '.join(GEMM_TABLES[1:])}")
    _need(HAS_CUDA_KERNELS, f"gemm_table_plan needs the compiled extension ({_IMPORT_ERROR})")
    out = torch.ops.blockfp8.gemm_table_plan(table, row, m, n, k, sm_count)
    plan = json.loads(out) if out else None
    _need(plan is None or "error" not in plan, f"gemm_table_plan({table}, m={m}, n={n}, k={k}, "
          f"sm_count={sm_count}, row={row}): {plan and plan.get('error')}")
    return plan


# --------------------------------------------------------------------------------------------
# Native NVFP4 rows' first-use self-check (csrc/fp4/first_use.cpp) and its reference kernel
# --------------------------------------------------------------------------------------------


def nvfp4_gemm_reference(a: torch.Tensor, a_scale: torch.Tensor, b: torch.Tensor, b_scale: torch.Tensor,
                         alpha: torch.Tensor):
    """The native NVFP4 GEMM's arch-neutral reference kernel (any CUDA GPU), the yardstick of the native rows'
    first-use self-check: operands as :func:`nvfp4_gemm` (swizzled scales), K % 16 == 0. Returns (fp32 [M, N]
    alpha * dequant(a) @ dequant(b)^T, fp32 [M, N] |alpha| * sum_k |a| |b| sa sb: the check's tolerance scale)."""
    _need(isinstance(a, torch.Tensor) and a.dim() == 2, "a must be uint8 [M, K/2]")
    k = a.shape[1] * 2
    _need(k > 0 and k % 16 == 0, f"K = {k} must be a positive multiple of 16")
    m = _check_nvfp4_weight("a", a, k)
    n = _check_nvfp4_weight("b", b, k)
    for name, t, rows in (("a_scale", a_scale, m), ("b_scale", b_scale, n)):
        want = reference.nvfp4_sf_shape(rows, k)
        _need(t.dtype == reference.FP8_DTYPE and tuple(t.shape) == want and t.is_contiguous(),
              f"{name} must be swizzled contiguous float8_e4m3fn {list(want)}, got {t.dtype} {list(t.shape)}")
        _need(t.device == a.device, f"{name} is on {t.device} but a is on {a.device}")
    _need(b.device == a.device, f"b is on {b.device} but a is on {a.device}")
    _one_fp32("alpha", alpha, a.device)
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


_lib.impl("nvfp4_gemm_reference", _nvfp4_gemm_reference_ref, "CPU")
if not HAS_CUDA_KERNELS:
    _lib.impl("nvfp4_gemm_reference", _nvfp4_gemm_reference_ref, "CUDA")
    _lib.impl("nvfp4_self_check", lambda: "[]", "CompositeExplicitAutograd")


def nvfp4_self_check() -> list:
    """Each native NVFP4 row (``nvfp4_native_rows()``) with its first-use self-check state in this process
    (``unchecked``, ``passed`` or ``failed``, and the failure's detail); no GPU needed. The rows check themselves on
    an SM120 GPU (or wherever they would run with ``BLOCKFP8_SELF_CHECK=always``) against the reference kernel; a
    failed row yields to the W4A16 path (``nvfp4_linear``) or to the reference kernel (``nvfp4_gemm``)."""
    return json.loads(torch.ops.blockfp8.nvfp4_self_check())


def nvfp4_self_check_run(row: int = -1, corrupt: bool = False) -> str:
    """Runs native row ``row``'s self-check now on the current GPU, outside the per-process state (no warning, no
    fallback): "" on a match, else what went wrong. ``row=-1`` checks the reference kernel against itself, which
    any CUDA GPU can run (the deterministic problem, the tolerance and the comparison); ``corrupt`` perturbs one
    output as ``BLOCKFP8_SELF_CHECK_CORRUPT`` does."""
    _need(HAS_CUDA_KERNELS, f"nvfp4_self_check_run needs the compiled extension ({_IMPORT_ERROR})")
    _need(torch.cuda.is_available(), "nvfp4_self_check_run needs a CUDA GPU")
    return torch.ops.blockfp8.nvfp4_self_check_run(int(row), bool(corrupt))
