"""``blockfp8 info``: versions, the GPU, what the extension was compiled for, the tile tables.

Every probe is defensive: a missing vLLM, a missing or broken extension, or no GPU is reported as
such instead of failing, so ``info`` is the first thing to run when something does not work.
"""

from __future__ import annotations

import json
import os
from importlib import metadata

FAMILIES = ("linear", "gemv", "gemm", "quant", "nvfp4")


def _dist_version(name: str):
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def _error(e: BaseException) -> str:
    return f"{type(e).__name__}: {e}"


def collect() -> dict:
    """Everything ``info`` prints, as plain JSON-serializable data."""
    import torch

    from vllm_blockfp8.tools import package_version

    info = {"vllm_blockfp8": package_version(), "vllm": _dist_version("vllm"), "torch": torch.__version__,
            "torch_cuda": torch.version.cuda, "gpu": None}
    try:
        if torch.cuda.is_available():
            major, minor = torch.cuda.get_device_capability(0)
            info["gpu"] = {"name": torch.cuda.get_device_name(0), "capability": f"{major}.{minor}",
                           "sm": f"sm_{major}{minor}", "count": torch.cuda.device_count()}
    except Exception as e:  # a broken driver must not hide the rest of the report
        info["gpu_error"] = _error(e)
    try:
        from vllm_blockfp8 import ops
    except Exception as e:
        info["extension"] = {"compiled": False, "error": f"cannot import vllm_blockfp8.ops: {_error(e)}"}
        info["tile_tables"] = {}
        return info
    try:
        info["kernels_unavailable"] = ops.kernels_unavailable_reason()
    except Exception as e:
        info["kernels_unavailable"] = f"unknown ({_error(e)})"
    try:
        info["extension"] = dict(ops.build_info())
    except Exception as e:
        info["extension"] = {"compiled": False, "error": _error(e)}
    tables = {}
    for family in FAMILIES:
        try:
            tables[family] = [dict(row) for row in ops.tile_table(family)]
        except Exception as e:
            tables[family] = {"error": _error(e)}
    # No GPU: each built arch's GEMM table instead (a pure-Python install has none to list).
    if info["extension"].get("compiled") and isinstance(tables.get("gemm"), list) and not tables["gemm"]:
        for table in ("sm89", "sm90", "sm120"):
            try:
                rows = [dict(row) for row in ops.gemm_table_rows(table)]
            except Exception as e:
                rows = {"error": _error(e)}
            if rows:
                tables[f"gemm ({table})"] = rows
    try:  # the SM120 native NVFP4 rows are listed from the build alone (no GPU needed)
        tables["nvfp4_native"] = [dict(row) for row in ops.nvfp4_native_rows()]
    except Exception as e:
        tables["nvfp4_native"] = {"error": _error(e)}
    info["tile_tables"] = tables
    try:
        info["overrides"] = _overrides(ops)
    except Exception as e:
        info["overrides"] = {"error": _error(e)}
    info["nvfp4_w4a16_forced"] = os.environ.get("BLOCKFP8_NVFP4_W4A16", "0") not in ("", "0")
    return info


def _overrides(ops) -> dict:
    """Rows chosen from outside the tables: BLOCKFP8_FORCE (checked against this GPU's tables) and the tuned file
    BLOCKFP8_TUNED_CONFIG names (checked against this machine; a model's own file is found by `vllm serve`)."""
    import os

    from vllm_blockfp8 import tuning

    checked = ops.kernels_unavailable_reason() is None
    out = {"force": dict(ops.FORCED_ROWS), "force_checked": checked, "force_error": None, "tuned_config": None}
    try:
        ops.check_forced_rows()
    except Exception as e:
        out["force_error"] = str(e)
    path = tuning.find(None)
    if path is not None:
        entry = {"path": str(path)}
        try:
            key = tuning.machine_key()
            entry["overrides"] = tuning.parse(path.read_text(), key)
            if key is None:
                entry["ignored"] = "the kernels cannot run in this process"
        except (OSError, tuning.TunedFileError) as e:
            entry["ignored"] = str(e)
        out["tuned_config"] = entry
    elif os.environ.get(tuning.ENV):
        out["tuned_config"] = {"path": None, "ignored": f"{tuning.ENV}=none"}
    return out


def _why_empty(info: dict, family: str) -> str:
    if not info.get("extension", {}).get("compiled"):
        return "no compiled extension"
    if family == "nvfp4_native":
        return "this build has no sm_120a"
    if not info.get("gpu") and family != "quant":
        return "no CUDA GPU: the table depends on the GPU's arch"
    return "this build has no rows for this GPU"


def render(info: dict) -> str:
    lines = [f"vllm_blockfp8  {info['vllm_blockfp8']}",
             f"vLLM           {info['vllm'] or 'not installed'}",
             f"torch          {info['torch']} (CUDA {info['torch_cuda'] or 'none: CPU build'})"]
    gpu = info.get("gpu")
    if gpu:
        lines.append(f"GPU            {gpu['name']} x{gpu['count']}, compute capability {gpu['capability']} "
                     f"({gpu['sm']})")
    else:
        lines.append(f"GPU            no CUDA GPU{' (' + info['gpu_error'] + ')' if 'gpu_error' in info else ''}"
                     ": the pure-PyTorch reference backend runs, kernels do not")
    ext = info.get("extension", {})
    if ext.get("error"):
        lines.append(f"extension      not available: {ext['error']}")
    else:
        archs = ", ".join(str(a) for a in ext.get("archs", [])) or "none"
        state = "compiled and loaded" if ext.get("compiled") else "not loaded (not built, or failed to load)"
        lines.append(f"extension      {state}; archs: {archs}")
        for family, detail in sorted(ext.get("families", {}).items()):
            shown = ", ".join(detail) or "none" if isinstance(detail, list) else detail
            lines.append(f"  {family:<12} {shown}")
        if ext.get("import_error"):
            lines.append(f"  extension import failed: {ext['import_error']}")
    if "kernels_unavailable" in info:
        lines.append(f"CUDA kernels   {'cannot run: ' + info['kernels_unavailable'] if info['kernels_unavailable'] else 'ready'}")
    over = info.get("overrides", {})
    if over.get("error"):
        lines.append(f"overrides      unknown: {over['error']}")
    if over.get("force"):
        forced = ", ".join(f"{f}:{r}" for f, r in over["force"].items())
        state = (f"refused: {over['force_error']}" if over.get("force_error")
                 else "in force wherever a call requests no row" if over.get("force_checked")
                 else "row names unchecked: the kernels cannot run here")
        lines.append(f"BLOCKFP8_FORCE {forced} ({state})")
    tuned = over.get("tuned_config")
    if tuned:
        state = (f"ignored: {tuned['ignored']}" if "ignored" in tuned
                 else f"{len(tuned['overrides'])} override(s) for this machine")
        lines.append(f"tuned config   {tuned['path']}: {state}")
        for o in tuned.get("overrides", []):
            lines.append(f"  {o['family']:<6} N={o['n']} K={o['k']} M={o['m_min']}..{o['m_max']} -> {o['row']}")
    if info.get("nvfp4_w4a16_forced"):
        lines.append("NVFP4          BLOCKFP8_NVFP4_W4A16 is set: weight-only (W4A16) on every GPU, SM120 included")
    for family, rows in info.get("tile_tables", {}).items():
        if isinstance(rows, dict):
            lines.append(f"tile table {family}: error: {rows['error']}")
        elif not rows:
            lines.append(f"tile table {family}: empty ({_why_empty(info, family)})")
        else:
            lines.append(f"tile table {family} (first row with M <= max_m wins):")
            for i, row in enumerate(rows):
                max_m = row.get("max_m")
                bound = "inf" if max_m is None or max_m < 0 or max_m >= 2**31 else max_m  # last row: unbounded
                lines.append(f"  {i:>2}  max_m {bound!s:>6}  {row.get('name', '?'):<36} {row.get('reason', '')}")
    return "\n".join(lines)


def main(as_json: bool = False) -> int:
    info = collect()
    print(json.dumps(info, indent=2) if as_json else render(info))
    return 0
