"""``blockfp8 tune MODEL_DIR``: time every applicable row per (N, K, M bucket) of a model's linear layers and write
the rows that beat the table's choice by >= 3% (tuning.py holds the file format and the loading).

Shapes come from the checkpoint's safetensors headers (no weights are read): block-FP8 weights (fp8 [N, K] beside
``weight_scale_inv``) and NVFP4 weights (uint8 [N, K/2] beside an e4m3 ``weight_scale``); vLLM's fused layers
(q/k/v -> qkv, gate/up -> gate_up) are timed at their fused N, as served at tensor parallel size 1. MoE experts are
skipped (vLLM's own MoE kernels serve them). Per point the family that serves M is tuned: for block FP8 the linear
table's path at that M (its GEMV rows, or its W8A8 GEMM rows), for NVFP4 the nvfp4 rows; every row is timed inside
the full linear op, as served (``gpu_timer``). The timer is tools/harness.py, the one the benchmarks time with (CUDA
graphs over rotating weight copies, variants interleaved); ``dry_run_timer`` fakes it so the loop runs without a GPU.
"""

from __future__ import annotations

import hashlib
import re
import sys
import time
from pathlib import Path
from typing import Callable, Optional

from .. import shapes, tuning
from . import harness
from .checkpoint import CheckpointError, check_source, scan_sources

# vLLM's fused projections: the shards it stacks along N into one layer.
FUSED = {"qkv_proj": ("q_proj", "k_proj", "v_proj"), "gate_up_proj": ("gate_proj", "up_proj")}
DRY_KEY = {"gpu": "dry run", "capability": "0.0", "driver": "none", "cuda": "none", "build_hash": "dry-run",
           "gemm_table": "auto"}


def model_shapes(model_dir: Path) -> tuple[str, list]:
    """(format "fp8-block" | "nvfp4", sorted distinct (N, K)) of the checkpoint's quantized linear layers."""
    check_source(model_dir)
    tensors = {t.name: t for t in scan_sources(model_dir)}
    found: dict = {}  # layer prefix -> (format, n, k)
    for name, t in tensors.items():
        if not name.endswith(".weight") or ".experts." in name or len(t.shape) != 2:
            continue
        prefix = name[: -len(".weight")]
        if t.dtype == "F8_E4M3" and prefix + ".weight_scale_inv" in tensors:
            found[prefix] = ("fp8-block", t.shape[0], t.shape[1])
        elif t.dtype == "U8" and prefix + ".weight_scale" in tensors:
            found[prefix] = ("nvfp4", t.shape[0], t.shape[1] * 2)
    if not found:
        raise CheckpointError(f"{model_dir}: no block-FP8 (fp8 weight + weight_scale_inv) or NVFP4 (uint8 weight + "
                              "weight_scale) linear weights; quantize it first (blockfp8 quantize)")
    formats = {f for f, _, _ in found.values()}
    if len(formats) > 1:
        raise CheckpointError(f"{model_dir}: mixes formats {sorted(formats)}")
    layers = {}
    for prefix, (_, n, k) in found.items():
        parent, _, proj = prefix.rpartition(".")
        fused = next((f for f, parts in FUSED.items() if proj in parts), None)
        if fused and all(f"{parent}.{p}" in found for p in FUSED[fused]):
            key = f"{parent}.{fused}"
            n_sum = sum(found[f"{parent}.{p}"][1] for p in FUSED[fused])
            layers[key] = (n_sum, k)
        else:
            layers[prefix] = (n, k)
    return formats.pop(), sorted(set(layers.values()))


def _stable_fraction(*parts) -> float:
    digest = hashlib.sha256("/".join(map(str, parts)).encode()).digest()
    return int.from_bytes(digest[:4], "little") / 2**32


class DryRunTables:
    """Rows and choices without a GPU: two fake rows per family, the linear path by the GEMV's usual bound."""

    def rows(self, family: str, m: int, n: int, k: int) -> list:
        return [f"{family}_row{i}" for i in range(2)]

    def default(self, family: str, m: int, n: int, k: int) -> str:
        return f"{family}_row0"

    def family_for(self, fmt: str, m: int, n: int, k: int) -> Optional[str]:
        return "nvfp4" if fmt == "nvfp4" else ("gemv" if m <= 16 else "gemm")


def dry_run_timer(family: str, rows: list, m: int, n: int, k: int) -> dict:
    """Deterministic fake microseconds (one row in three wins by ~5-20%)."""
    base = 5.0 + n * k * 1e-6 + m * 0.01
    return {r: base * (0.8 + 0.4 * _stable_fraction(family, r, m, n, k)) for r in rows}


class GpuTables:
    """This GPU's tables through the ops: the rows that can run a problem, the table's choice, the linear path."""

    def __init__(self):
        from .. import ops

        self.ops = ops

    def rows(self, family: str, m: int, n: int, k: int) -> list:
        out = []
        for r in self.ops.tile_table(family):
            try:
                self.ops._row_arg(family, r["name"], m, n, k)  # the row's precondition, as a forced call checks it
            except ValueError:
                continue
            out.append(r["name"])
        return out

    def default(self, family: str, m: int, n: int, k: int) -> Optional[str]:
        return self.ops.selected_row(family, m, n, k)

    def family_for(self, fmt: str, m: int, n: int, k: int) -> Optional[str]:
        if fmt == "nvfp4":
            return "nvfp4"
        path = self.ops.selected_row("linear", m, n, k)
        return {"gemv": "gemv", "w8a8_gemm": "gemm"}.get(path)  # dequant_matmul: no rows to choose between


def gpu_timer(family: str, rows: list, m: int, n: int, k: int) -> dict:
    """Per-call microseconds of each row, and of the table's own choice ("" key), on the harness: one CUDA graph per
    variant over rotating weight copies, replays interleaved. Each is timed as the layer runs it: block FP8 through
    the full linear op (activation quantization included), the row put in force as a one-entry tuned table while its
    graph is captured, which is how a tuned file changes serving and how benchmarks/bench_tune_ab.py judges one;
    NVFP4 through nvfp4_linear with the row forced. Timed on the GEMM op alone, three GEMM rows that won there by
    6-9% lost 1-11% in the full linear (an H100: gate_up M = 2048 and 4096), so the alone timing was the wrong one."""
    import torch

    from .. import ops, reference

    fp4 = family == "nvfp4"
    copies = harness.copies_for(n * k // (2 if fp4 else 1))
    x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(n, k, device="cuda")
    packed = reference.quantize_nvfp4(w) if fp4 else reference.quantize_block_fp8(w)
    packing = "modelopt"
    if fp4:  # the weight as the vLLM layer stores it (the SM90 wgmma rows read the fragment packing only)
        b, b_scale, packing = ops.nvfp4_layer_weight(packed[0], packed[1])
        packed = (b, b_scale, *packed[2:])
    del w
    weights = [tuple(t.clone() for t in packed) for _ in range(copies)]  # distinct copies: every call reads HBM

    def factory(row):
        if fp4:
            return lambda i: (lambda c=weights[i]: ops.nvfp4_linear(x, c[0], c[1], c[2], row=row, packing=packing))
        table = [dict(family=family, n=n, k=k, m_min=m, m_max=m, row=row)] if row else []
        return harness.under_table(ops.set_tuned_rows, table,
                                   lambda i: (lambda c=weights[i]: ops.blockfp8_linear(x, c[0], c[1])))

    labels = [""] + list(rows)
    try:
        graphs = [harness.prepare_graph(factory(r or None), copies) for r in labels]
    finally:
        if not fp4:
            ops.set_tuned_rows([])
    times = harness.time_prepared(graphs)
    return {label: t.us for label, t in zip(labels, times)}


def tune(fmt: str, shape_list: list, tables, timer: Callable, buckets=shapes.TUNE_M,
         progress: Callable[[str], None] = lambda line: None) -> list:
    """The measurements of every (N, K, M bucket): each the family serving M, its rows' times, the table's row."""
    ranges = tuning.m_ranges(buckets)
    points = [(n, k, lo, hi) for n, k in shape_list for lo, hi in ranges]
    out = []
    for i, (n, k, lo, m) in enumerate(points, 1):
        family = tables.family_for(fmt, m, n, k)
        rows = tables.rows(family, m, n, k) if family else []
        default = tables.default(family, m, n, k) if family else None
        if len(rows) < 2 or default is None:
            progress(f"[{i}/{len(points)}] N={n} K={k} M={m}: {family or 'no row table'} has no choice to make")
            continue
        def timed(candidates: list) -> dict:
            t = timer(family, candidates, m, n, k)
            if "" in t:  # the op's own choice timed as it runs (row=None), standing for its row's time
                t[default] = t.pop("")
            return t

        times = timed(rows)
        entry = {"family": family, "n": n, "k": k, "m": m, "m_min": lo, "m_max": m, "default_row": default,
                 "times_us": {r: round(t, 3) for r, t in times.items()}}
        best = min(times, key=times.get)
        line = f"[{i}/{len(points)}] N={n} K={k} M={m} {family}: {default} {times[default]:.2f} us, best {best} " \
               f"{times[best]:.2f} us"
        if best != default and times[default] / times[best] - 1.0 >= tuning.MIN_GAIN:
            # A win near the threshold can be a noisy replay: the two rows are timed again, on their own, and an
            # override needs its gain in both timings (tuning.select_overrides).
            again = timed([default, best])
            entry["confirm_us"] = {r: round(t, 3) for r, t in again.items()}
            line += f"; again {again[default]:.2f} vs {again[best]:.2f} us"
        out.append(entry)
        progress(line)
    return out


def ready_to_time(error=CheckpointError):
    """The state timing rows needs (tune and its A/B), else `error` saying what is off: kernels that run here, no
    BLOCKFP8_FORCE (its rows would replace the ones timed), and no tuned rows in force (the tables as they are)."""
    from .. import ops

    why = ops.kernels_unavailable_reason()
    if why:
        raise error(f"cannot time kernels here: {why} (--dry-run runs without a GPU, with fake timings)")
    if ops.FORCED_ROWS:
        raise error(f"unset {ops.FORCE_ENV}: its rows would replace the rows being timed")
    ops.set_tuned_rows([])


def main(model_dir: Path, out: Optional[Path], dry_run: bool, buckets=shapes.TUNE_M, show_progress=True) -> dict:
    fmt, shape_list = model_shapes(model_dir)
    if dry_run:
        tables, timer, key = DryRunTables(), dry_run_timer, dict(DRY_KEY)
    else:
        ready_to_time(CheckpointError)
        tables, timer, key = GpuTables(), gpu_timer, tuning.machine_key()
    start = time.monotonic()

    def progress(line):
        if show_progress:
            print(f"tune {time.monotonic() - start:6.0f} s {line}", file=sys.stderr, flush=True)

    measurements = tune(fmt, shape_list, tables, timer, buckets, progress)
    doc = tuning.document(key, measurements, buckets, model=str(model_dir))
    path = out or (model_dir / tuning.FILE_NAME)
    tuning.write(path, doc)
    doc["path"] = str(path)
    return doc


def parse_buckets(spec: str) -> list:
    if not re.fullmatch(r"\d+(,\d+)*", spec or "") or any(int(x) < 1 for x in spec.split(",")):
        raise ValueError(f"--m takes comma-separated positive token counts, got {spec!r}")
    return sorted({int(x) for x in spec.split(",")})
