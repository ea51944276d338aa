"""The blockfp8 operator library: every schema (defined once, here), the compiled extension's loading, and the
environment switches the extension reads (checked here at import, so a typo fails with its name). ``ops`` holds the
tensor ops, ``host_ops`` the host-only queries and switches; both build on this module."""

from __future__ import annotations

import os
import re
from typing import Optional

import torch

FAMILIES = ("linear", "gemv", "gemm", "quant", "nvfp4")

_SCHEMAS = {
    "per_token_group_quant": "per_token_group_quant(Tensor x, int group_size, int row=-1) -> (Tensor, Tensor)",
    "gemv": "gemv(Tensor x, Tensor b, Tensor b_scale, int row=-1) -> Tensor",
    "gemm": "gemm(Tensor a, Tensor a_scale, Tensor b, Tensor b_scale, ScalarType out_dtype, int row=-1) -> Tensor",
    "linear": "linear(Tensor x, Tensor b, Tensor b_scale, Tensor? bias=None, int row=-1) -> Tensor",
    "nvfp4_linear": ("nvfp4_linear(Tensor x, Tensor b, Tensor b_scale, Tensor global_scale, Tensor? bias=None, "
                     "int row=-1, Tensor? b_scale_swizzled=None, Tensor? input_scale=None, Tensor? alpha=None, "
                     "int packing=0) -> Tensor"),
    "nvfp4_quant": "nvfp4_quant(Tensor x, Tensor input_scale) -> (Tensor, Tensor)",
    "nvfp4_swizzle_scale": "nvfp4_swizzle_scale(Tensor scale) -> Tensor",
    "nvfp4_gemm": ("nvfp4_gemm(Tensor a, Tensor a_scale, Tensor b, Tensor b_scale, Tensor alpha, ScalarType out_dtype, "
                   "int row=-1) -> Tensor"),
    "nvfp4_native_rows": "nvfp4_native_rows() -> str",
    "nvfp4_native_path": "nvfp4_native_path(int cc, int m, int n, int k) -> str",
    "nvfp4_layer_packing": "nvfp4_layer_packing(int cc, int n, int k) -> int",
    "nvfp4_gemm_reference": ("nvfp4_gemm_reference(Tensor a, Tensor a_scale, Tensor b, Tensor b_scale, Tensor alpha) "
                             "-> (Tensor, Tensor)"),
    "nvfp4_self_check": "nvfp4_self_check() -> str",
    "nvfp4_self_check_run": "nvfp4_self_check_run(int row, bool corrupt) -> str",
    "first_use_pending": "first_use_pending(int cc) -> str",
    "first_use_run": "first_use_run(str family, int table, int row) -> str",
    "first_use_record": "first_use_record(str family, int table, int row, str why) -> bool",
    "tile_table": "tile_table(str family) -> str",
    "select_row": "select_row(str family, int m, int n, int k) -> int",
    "row_rejects": "row_rejects(str family, int row, int m, int n, int k, int x_address, int x_stride) -> str",
    "gemv_pins_residency": "gemv_pins_residency(int column_blocks, int sm_count, int ksplit, int m_tiles) -> bool",
    "gemm_k_plan": "gemm_k_plan(int row, int m, int n, int k, int sm_count) -> str",
    "nvfp4_wgmma_plan": "nvfp4_wgmma_plan(int tok, int m, int n, int k) -> str",
    "gemm_table_plan": "gemm_table_plan(str table, int row, int m, int n, int k, int sm_count) -> str",
    "gemm_table_rows": "gemm_table_rows(str table) -> str",
    "gemm_self_check": "gemm_self_check(str table) -> str",
    "build_info": "build_info() -> str",
    "set_sm90_pdl": "set_sm90_pdl(str mode) -> str",
    "set_gemm_table": "set_gemm_table(str table) -> str",
    "set_tuned_rows": "set_tuned_rows(Tensor entries) -> str",
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
                  "BLOCKFP8_SM90_NARROW_SPLIT": ("0", "1"),
                  # The NVFP4 wgmma rows' K split (csrc/fp4/sm90/w4a16_wgmma.cu): its reduction and a forced count.
                  "BLOCKFP8_SM90_FP4_REDUCTION": ("auto", "cluster", "partials"),
                  "BLOCKFP8_SM90_FP4_SPLITS": tuple(str(s) for s in range(1, 17))}


# The user switches the extension and the package read, with their allowed values (README): a typo fails at import
# with its name instead of being silently ignored. BLOCKFP8_SELF_CHECK: "always" checks every row, "inprocess" skips
# the isolated child (first_use.py). BLOCKFP8_NVFP4_W4A16 and BLOCKFP8_LOG_ROWS are on/off.
USER_ENV_SWITCHES = {"BLOCKFP8_SELF_CHECK": ("always", "inprocess"),
                     "BLOCKFP8_NVFP4_W4A16": ("0", "1"),
                     "BLOCKFP8_LOG_ROWS": ("0", "1")}


# BLOCKFP8_GEMM_TABLE forces the W8A8 GEMM's row table for the process where its kernels run on the GPU (the SM89
# rows run on SM90 too, so the H200 tests and times them); "none" turns the W8A8 GEMM off (the linear op takes the
# GEMV or dequantize + cuBLAS); "auto" (or unset) is the GPU's own table.
ARCH_TABLES = ("sm89", "sm90", "sm120")
GEMM_TABLES = ("auto", *ARCH_TABLES, "none")


def check_env(environ=None) -> None:
    environ = os.environ if environ is None else environ
    table = environ.get("BLOCKFP8_GEMM_TABLE", "")
    if table and table not in GEMM_TABLES:
        raise ValueError(f"BLOCKFP8_GEMM_TABLE={table!r}: expected one of {', '.join(GEMM_TABLES)} (or unset)")
    for name, allowed in {**SM90_ENV_SWITCHES, **USER_ENV_SWITCHES}.items():
        value = environ.get(name, "")
        if value and value not in allowed:
            raise ValueError(f"{name}={value!r}: expected one of {', '.join(allowed)} (or unset)")


check_env()

# BLOCKFP8_FORCE=family:ROW[,family:ROW...] makes each named family run ROW wherever a call requests no row (under
# `vllm serve`, every call). The op reads the variable itself (ops.cpp pick_row), so the traced graph stays one node;
# a row that refuses a problem falls back to the table's choice with one line on stderr. Syntax and family are
# checked here, at import; row names need the GPU's tables (check_forced_rows).
FORCE_ENV = "BLOCKFP8_FORCE"
# What a row name is wherever one comes from outside (BLOCKFP8_FORCE, a tuned file): the C++ side checks the same
# (common/overrides.cpp).
ROW_NAME = re.compile(r"[A-Za-z0-9_]{1,64}")


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
        if ROW_NAME.fullmatch(row) is None:
            raise ValueError(f"{FORCE_ENV}={value!r}: row {row!r} is not a row name (1-64 letters, digits, '_')")
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


def _need(cond: bool, msg: str) -> None:
    if not cond:
        raise ValueError(msg)
