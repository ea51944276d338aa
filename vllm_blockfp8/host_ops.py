"""Host-only ops of the blockfp8 library: tile tables and what a family selects, the GEMM's plans and tables, the
process switches (SM90 launch mode, GEMM table, forced and tuned rows), build facts and the first-use self-check
states. No tensors; nothing here touches a device at import. ``ops`` re-exports every public name."""

from __future__ import annotations

import contextlib
import json
from typing import Optional

import torch

from .library import (ARCH_TABLES, FAMILIES, FORCE_ENV, FORCED_ROWS, GEMM_TABLES, ROW_NAME, SM90_ENV_SWITCHES,
                      _IMPORT_ERROR, HAS_CUDA_KERNELS, _lib, _need, kernels_unavailable_reason)

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
    _lib.impl("nvfp4_wgmma_plan", lambda tok, m, n, k: "", "CompositeExplicitAutograd")
    _lib.impl("set_sm90_pdl", lambda mode: "0", "CompositeExplicitAutograd")
    _lib.impl("set_tuned_rows", lambda entries: "", "CompositeExplicitAutograd")
    _lib.impl("tuned_rows", lambda: "", "CompositeExplicitAutograd")
    _lib.impl("nvfp4_native_rows", lambda: "[]", "CompositeExplicitAutograd")
    _lib.impl("nvfp4_native_path", lambda cc, m, n, k: json.dumps({"native": False, "why": "no extension"}),
              "CompositeExplicitAutograd")
    _lib.impl("nvfp4_self_check", lambda: "[]", "CompositeExplicitAutograd")
    _lib.impl("first_use_pending", lambda cc: "[]", "CompositeExplicitAutograd")


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
        _need(e["family"] in FAMILIES and ROW_NAME.fullmatch(str(e["row"])) is not None,
              f"tuned entry {e!r}: family must be one of {FAMILIES} and row a name (1-64 letters, digits, '_')")
        lines.append(" ".join(str(e[f]) for f in TUNED_FIELDS))
    # The text travels as bytes in a CPU tensor (host_queries.cpp says why it is not a str argument).
    text = "\n".join(lines).encode()
    why = torch.ops.blockfp8.set_tuned_rows(torch.tensor(list(text), dtype=torch.uint8))
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


def nvfp4_wgmma_plan(tok: int, m: int, n: int, k: int) -> Optional[dict]:
    """How the SM90 NVFP4 wgmma tile of ``tok`` tokens (32, 64, 128, 256) splits K for an (M, N, K) problem on this
    GPU, as its launcher decides (the BLOCKFP8_SM90_FP4_* switches applied): {"splits": s, "cluster": whether the
    splits sum in a thread-block cluster (else through fp32 partials), "at_once": CTAs that run at once in that launch
    shape, "modelled_us": the cost model's time (the 256-token tile, and the 128-token tile past M = 128; else 0)}.
    The 128x128 row takes M = 129..511 where its modelled_us is below the 256-token tile's. None without a GPU or
    where the build has no SM90 wgmma rows."""
    if not HAS_CUDA_KERNELS or not torch.cuda.is_available():
        return None
    out = torch.ops.blockfp8.nvfp4_wgmma_plan(tok, m, n, k)
    plan = json.loads(out) if out else None
    _need(plan is None or "error" not in plan, f"nvfp4_wgmma_plan(tok={tok}, m={m}, n={n}, k={k}): "
          f"{plan and plan.get('error')}")
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
    previous = torch.ops.blockfp8.set_sm90_pdl(mode)
    _need(previous != "", f"set_sm90_pdl: the extension refused mode {mode!r}")
    return previous


@contextlib.contextmanager
def _switched(setter, value: str):
    """``setter(value)`` for the calls (or the graph capture) inside the block, then the setting before it."""
    was = setter(value)
    try:
        yield
    finally:
        setter(was)


def sm90_pdl(mode: str):
    """``set_sm90_pdl(mode)`` for the calls (or the graph capture) inside the block, then the mode before it."""
    return _switched(set_sm90_pdl, mode)


def build_info() -> dict:
    """Which archs and kernel families the extension was compiled with."""
    info = json.loads(torch.ops.blockfp8.build_info())
    if _IMPORT_ERROR is not None:
        info["import_error"] = str(_IMPORT_ERROR)
    return info


def set_gemm_table(table: str) -> str:
    """Force the W8A8 GEMM's row table for this process (``BLOCKFP8_GEMM_TABLE``'s values: ``auto``,
    ``sm89``, ``sm90``, ``sm120``, ``none``) and return the previous setting. A forced table serves only GPUs
    its kernels run on (the SM89 rows run on SM90 as well, which is how an H200 tests them); elsewhere the
    GPU's own table serves. ``none`` turns the W8A8 GEMM off: the linear op takes the GEMV or dequantize +
    cuBLAS. The linear op's path table follows the GEMM table. Needs the extension."""
    _need(table in GEMM_TABLES, f"set_gemm_table: table must be one of {', '.join(GEMM_TABLES)}, got {table!r}")
    _need(HAS_CUDA_KERNELS, f"set_gemm_table needs the compiled extension ({_IMPORT_ERROR})")
    previous = torch.ops.blockfp8.set_gemm_table(table)
    _need(previous != "", f"set_gemm_table: the extension refused table {table!r}")
    return previous


def gemm_table(table: str):
    """``set_gemm_table(table)`` for the calls (or the graph capture) inside the block, then the table before it."""
    return _switched(set_gemm_table, table)


def gemm_table_rows(table: str) -> list:
    """The rows of the W8A8 GEMM table ``table`` (``sm89``, ``sm90``, ``sm120``) as this build compiled them,
    without a GPU: [] for a table the build lacks."""
    _need(table in ARCH_TABLES, f"gemm_table_rows: table must be one of {', '.join(ARCH_TABLES)}")
    _need(HAS_CUDA_KERNELS, f"gemm_table_rows needs the compiled extension ({_IMPORT_ERROR})")
    return json.loads(torch.ops.blockfp8.gemm_table_rows(table))


def gemm_self_check(table: str) -> list:
    """Each row of the W8A8 GEMM table ``table`` with its first-use self-check state in this process
    (``unchecked``, ``passed`` or ``failed``, and the failure's detail). A table checks itself on the GPU it has
    never run on here (SM89, SM120), or everywhere with ``BLOCKFP8_SELF_CHECK=always``; a failed row yields to the
    reference kernel (``blockfp8_gemm``) or to dequantize + cuBLAS (``blockfp8_linear``)."""
    _need(table in ARCH_TABLES, f"gemm_self_check: table must be one of {', '.join(ARCH_TABLES)}")
    _need(HAS_CUDA_KERNELS, f"gemm_self_check needs the compiled extension ({_IMPORT_ERROR})")
    return json.loads(torch.ops.blockfp8.gemm_self_check(table))


def gemm_table_plan(table: str, m: int, n: int, k: int, sm_count: int, row: int = -1) -> Optional[dict]:
    """The plan of ``table``'s row ``row`` (-1: the row its planner chooses) for an (m, n, k) problem at
    ``sm_count`` SMs, as ``gemm_k_plan`` answers for SM90: host logic, no GPU needed. None when the build
    lacks the table; ValueError for a problem the table cannot run."""
    _need(table in ARCH_TABLES, f"gemm_table_plan: table must be one of {', '.join(ARCH_TABLES)}")
    _need(HAS_CUDA_KERNELS, f"gemm_table_plan needs the compiled extension ({_IMPORT_ERROR})")
    out = torch.ops.blockfp8.gemm_table_plan(table, row, m, n, k, sm_count)
    plan = json.loads(out) if out else None
    _need(plan is None or "error" not in plan, f"gemm_table_plan({table}, m={m}, n={n}, k={k}, "
          f"sm_count={sm_count}, row={row}): {plan and plan.get('error')}")
    return plan


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
    rows = len(nvfp4_native_rows())
    _need(-1 <= row < rows, f"nvfp4_self_check_run: row {row} out of range (-1 for the reference, else < {rows})")
    _need(torch.cuda.is_available(), "nvfp4_self_check_run needs a CUDA GPU")
    return torch.ops.blockfp8.nvfp4_self_check_run(int(row), bool(corrupt))


def first_use_pending(capability: tuple) -> list:
    """The rows a GPU of ``capability`` (major, minor) checks before their first run and this process has not
    checked yet: [{"family", "table", "row", "name"}] (the GEMM rows of a table new to its hardware, SM89 / SM120,
    and SM120's native NVFP4 rows; every row of the GPU's tables with ``BLOCKFP8_SELF_CHECK=always``). Host logic."""
    return json.loads(torch.ops.blockfp8.first_use_pending(capability[0] * 10 + capability[1]))


def first_use_run(family: str, table: int, row: int) -> str:
    """Runs that row's first-use check now on the current GPU, outside this process's states: "" on a match, else
    what went wrong (the isolated check's child process calls it)."""
    _need(HAS_CUDA_KERNELS and torch.cuda.is_available(), "first_use_run needs a CUDA GPU and the extension")
    return torch.ops.blockfp8.first_use_run(family, int(table), int(row))


def first_use_record(family: str, table: int, row: int, why: str) -> bool:
    """Records a check's outcome decided outside this process ("" passed; else failed, with one warning); False for
    a row no family owns. Host only."""
    _need(HAS_CUDA_KERNELS, f"first_use_record needs the compiled extension ({_IMPORT_ERROR})")
    return torch.ops.blockfp8.first_use_record(family, int(table), int(row), why)
