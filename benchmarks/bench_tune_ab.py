"""Same-run A/B of a `blockfp8 tune` file (issue #43 item 5): the ops' own row choice (the planner: no tuned
table) against the choice with the tuned file loaded, on the full linear op, in one process and one harness run.

Per point (N, K, M) three variants are captured and then replayed in turns (benchmarks/harness.py: CUDA graphs over
rotating weight copies): ours@planner, ours@tuned, ours@planner_again. The row is chosen inside the op when its
graph is captured, so each variant's table is put in force (ops.set_tuned_rows) just before its graph is built and
stays so through its capture: [] for the planner, the file's overrides (as tuning.load reads and checks them: a file
the loader would ignore stops the run) for tuned. Block-FP8 files time ops.blockfp8_linear (activation quantization
included), NVFP4 files ops.nvfp4_linear (on the paired packing the layer stores). Points, in this order: (a) every
measured point of the file (N, K, M bucket), the shapes with overrides first; (b) the --shapes sets (default the
benchmark set and the first held-out set) at the file's M buckets (shapes.TUNE_M where the file has none). A time
budget cuts (b) first.

Per point, ratio = tuned / planner, planner = the geomean of the two planner timings (the tuned graph replays
between them, so linear drift cancels), and the noise sample planner_again / planner - 1. Noise = the 95th
percentile (nearest rank; the maximum below 20 points) of |noise sample| over every point of the run; bound =
max(noise, --min-bound, default 1%, the issue's noise). Judged: the tuned points whose override changes the row
(elsewhere the tuned config runs the planner's own row: the same kernel, and its ratio is shown as more noise).
Exit 1 (FAIL) when one of them is slower than 1 + bound, gives a wrong first output, or was not measured; a win is
one faster than 1 - bound. The max slowdown is also held against the issue's target (<= 1.01).

Output: the harness JSON (the summary under header.notes.tune_ab) and PNG, a PNG of the per-point ratios by M
(<plot stem>_ratio.png), and "tune_ab:" summary lines last.

  python -m benchmarks.bench_tune_ab MODEL_DIR/blockfp8_tuned.json     # or MODEL_DIR
  python -m benchmarks.bench_tune_ab FILE --shapes none                # the file's points only
  python -m benchmarks.bench_tune_ab FILE --dry-run                    # no GPU: fake timings
"""

from __future__ import annotations

import json
import math
import os
import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Optional

from vllm_blockfp8 import shapes, tuning
from vllm_blockfp8.tools import tune

from . import harness
from .report import Record, geomean

SCRIPT = "bench_tune_ab"
PLANNER, TUNED, AGAIN = "ours@planner", "ours@tuned", "ours@planner_again"
ORDER = (PLANNER, TUNED, AGAIN)  # the tuned graph between the two planner ones
TARGET = 1.01                    # issue #43 item 5: never slower than the planner by more than noise (1%)
MIN_BOUND = 0.01
NOISE_QUANTILE = 0.95
DEFAULT_SETS = "benchmark_set,held_out"
LIST_MAX = 12  # points listed per summary line


@dataclass
class Point:
    shape: str
    n: int
    k: int
    m: int
    tuned_point: bool                # a measured (N, K, M bucket) of the file
    family: Optional[str] = None     # the row family serving M (gemv, gemm, nvfp4); None: no rows to choose
    planner_row: str = ""            # the family's own choice
    override: Optional[str] = None   # the file's row for (family, N, K, M), None where it names none
    gain: Optional[float] = None     # the gain tune measured for it

    @property
    def judged(self) -> bool:
        return bool(self.tuned_point and self.override and self.override != self.planner_row)

    def row(self, impl: str) -> str:
        if self.family is None:
            return "no row table"
        return f"{self.family}:{self.override if impl == TUNED and self.override else self.planner_row}"


# --------------------------------------------------------------------------------------------
# The file and the points
# --------------------------------------------------------------------------------------------


def load_tuned(path: Path, dry_run: bool) -> tuple[dict, list]:
    """(document, overrides as tuning.load hands them to the ops). Dry run: checked against the file's own key (a
    dry-run file matches no machine); on a GPU against this process's. SystemExit naming why the loader would ignore
    the file: the A/B would then compare the planner with itself."""
    if path.is_dir():
        path = path / tuning.FILE_NAME
    try:
        doc = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise SystemExit(f"{path}: cannot read a tuned file ({e})") from None
    if not isinstance(doc, dict):
        raise SystemExit(f"{path}: not a tuned file (not a JSON object)")
    key = (doc.get("key") or {}) if dry_run else None
    saved = os.environ.get(tuning.ENV)
    os.environ[tuning.ENV] = str(path)
    try:
        entries = tuning.load(None, key, apply=lambda e: None)
    finally:
        if saved is None:
            os.environ.pop(tuning.ENV, None)
        else:
            os.environ[tuning.ENV] = saved
    if "ignored" in tuning.STATE:
        raise SystemExit(f"{path}: the loader ignores this tuned file here: {tuning.STATE['ignored']}")
    return doc, entries


def file_format(doc: dict, choice: str) -> str:
    families = {p.get("family") for p in doc.get("measurements") or []}
    found = "nvfp4" if families == {"nvfp4"} else "fp8-block" if families and families <= {"gemv", "gemm"} else None
    if choice != "auto":
        if found and found != choice:
            raise SystemExit(f"--format {choice}, but the file's measurements are {sorted(families)} ({found})")
        return choice
    if found is None:
        raise SystemExit(f"cannot tell the format from the file's measurement families {sorted(families)}: "
                         "pass --format fp8-block or nvfp4")
    return found


def override_for(entries: list, family: Optional[str], n: int, k: int, m: int) -> Optional[dict]:
    """The first entry covering (family, N, K, M), as the op's lookup (overrides.cpp tuned_row) takes it."""
    for e in entries:
        if e["family"] == family and e["n"] == n and e["k"] == k and e["m_min"] <= m <= e["m_max"]:
            return e
    return None


def plan_points(doc: dict, entries: list, fmt: str, set_shapes: list, ms: list, tables) -> list:
    """Points grouped by shape (one set of weight copies serves every M of a shape): the file's shapes with an
    override first, then its other shapes, then the sets' other shapes; M ascending within a shape."""
    names: dict = {}
    for s in list(set_shapes) + [s for group in harness.SHAPE_SETS.values() for s in group]:
        names.setdefault((s.n, s.k), s.name)
    measured = {(p["n"], p["k"], p["m"]) for p in doc.get("measurements") or []}
    in_sets = {(s.n, s.k) for s in set_shapes}
    file_shapes = sorted({(n, k) for n, k, _ in measured},
                         key=lambda nk: (not any((e["n"], e["k"]) == nk for e in entries), nk))
    order = file_shapes + [nk for nk in dict.fromkeys((s.n, s.k) for s in set_shapes) if nk not in file_shapes]
    gains = doc.get("overrides") or []
    out = []
    for n, k in order:
        m_list = {m for a, b, m in measured if (a, b) == (n, k)} | (set(ms) if (n, k) in in_sets else set())
        for m in sorted(m_list):
            family = tables.family_for(fmt, m, n, k)
            entry = override_for(entries, family, n, k, m) if family else None
            gain = override_for(gains, family, n, k, m) if entry else None
            out.append(Point(shape=names.get((n, k), f"{n}x{k}"), n=n, k=k, m=m, tuned_point=(n, k, m) in measured,
                             family=family, planner_row=(tables.default(family, m, n, k) or "-") if family else "",
                             override=entry["row"] if entry else None, gain=gain.get("gain") if gain else None))
    return out


# --------------------------------------------------------------------------------------------
# Timing
# --------------------------------------------------------------------------------------------


def run_points(runner: harness.Runner, points: list, fmt: str, entries: list, ops, *, device: str = "cuda",
               max_copies: int = harness.MAX_COPIES) -> None:
    """Time every point's three variants on the harness (runner.point: capture all, replay in turns)."""
    import torch

    from vllm_blockfp8 import reference

    from . import peers, peers_fp4

    fp4 = fmt == "nvfp4"
    op = "nvfp4" if fp4 else "linear"
    tables = {PLANNER: [], TUNED: entries, AGAIN: []}
    if fp4:
        def call(o):
            return ops.nvfp4_linear(o.x, o.w.layer[0], o.w.layer[1], o.w.row_scale, packing=o.w.layer[2])
    else:
        def call(o):
            return ops.blockfp8_linear(o.x, o.b, o.b_scale)
    try:
        shape_keys = list(dict.fromkeys((p.n, p.k) for p in points))
        for n, k in shape_keys:
            if fp4:
                weights = peers.LazyCopies(lambda i, n=n, k=k: peers_fp4.Fp4Weight(n, k, device=device))
                copies = harness.copies_for(harness.nvfp4_weight_bytes(n, k), max_copies=max_copies)
            else:
                weights = peers.LazyCopies(lambda i, n=n, k=k: reference.quantize_block_fp8(
                    torch.randn(n, k, device=device)))
                copies = harness.copies_for(n * k, max_copies=max_copies)
            for p in (p for p in points if (p.n, p.k) == (n, k)):
                x = peers.LazyCopies(lambda _, m=p.m, k=k: torch.randn(m, k, device=device, dtype=torch.bfloat16))
                if fp4:
                    operands = peers.LazyCopies(lambda i, x=x: peers_fp4.Fp4Operands(x[0], weights[i]))
                    check = peers_fp4.Fp4Checker(operands).linear("w4a16", tol=peers_fp4.FP4_OURS_TOL)
                else:
                    operands = peers.LazyCopies(lambda i, x=x: peers.Operands(x[0], *weights[i]))
                    check = peers.Checker(operands).linear("w8a8", "weight_only")
                def make(i, operands=operands):
                    return lambda o=operands[i]: call(o)

                variants = [harness.Variant(impl, row=p.row(impl), strict=False, check=check,
                                            factory=harness.under_table(ops.set_tuned_rows, tables[impl], make))
                            for impl in ORDER]
                floor = harness.linear_floor(runner.report.ceilings, p.m, n, k, weight="nvfp4" if fp4 else "fp8")
                runner.point(op=op, shape=p.shape, m=p.m, n=n, k=k, floor=floor, copies=copies, variants=variants)
            del weights
            if torch.cuda.is_available():
                torch.cuda.empty_cache()
    finally:
        ops.set_tuned_rows([])


def fake_points(runner: harness.Runner, points: list, fmt: str) -> None:
    """--dry-run: deterministic fake timings through the records, the summary, the JSON and the plots. The planner
    jitters by +-0.6%; an overridden point's tuned time is the planner's over 1 + 0.8 x the file's gain."""
    op, weight = ("nvfp4", "nvfp4") if fmt == "nvfp4" else ("linear", "fp8")
    for p in points:
        floor_us, nbytes, flops = harness.linear_floor(runner.report.ceilings, p.m, p.n, p.k, weight=weight)
        base = harness.fake_us("ours", f"{op}|{p.shape}", p.m, floor_us, runner.fake_seed)
        for impl in ORDER:
            us = base / (1 + 0.8 * (p.gain or 0.0)) if impl == TUNED and p.judged else base
            us *= 1 + 0.006 * (2 * tune._stable_fraction(impl, p.shape, p.m) - 1)
            runner.report.add(Record(op=op, impl=impl, row=p.row(impl), shape=p.shape, m=p.m, n=p.n, k=p.k, us=us,
                                     floor_us=floor_us, bytes=nbytes, flops=flops, copies=2, replays=runner.replays,
                                     spread=0.0, method="dry-run"))


# --------------------------------------------------------------------------------------------
# The verdict (no GPU: tested with synthetic timings)
# --------------------------------------------------------------------------------------------


def nearest_rank(values: list, q: float) -> Optional[float]:
    """The q-quantile by nearest rank (the maximum when there are fewer than 1 / (1 - q) values); None if empty."""
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q * len(ordered)) - 1)] if ordered else None


def summarize(points: list, records: list, min_bound: float = MIN_BOUND, quantile: float = NOISE_QUANTILE,
              target: float = TARGET) -> dict:
    """Per point tuned / planner and the planner-vs-planner noise; the verdict (module docstring)."""
    by_key = {(r.shape, r.m, r.impl): r for r in records}
    rows, missing = [], []
    for p in points:
        got = [by_key.get((p.shape, p.m, impl)) for impl in ORDER]
        if None in got:
            missing.append(p)
            continue
        a, t, b = (r.us for r in got)
        planner = math.sqrt(a * b)
        rows.append({**asdict(p), "judged": p.judged, "planner_us": round(planner, 3), "tuned_us": round(t, 3),
                     "ratio": t / planner, "noise": b / a - 1,
                     "wrong": "; ".join(f"{r.impl}: {r.note}" for r in got if "WRONG" in r.note)})
    samples = [abs(r["noise"]) for r in rows]
    noise = nearest_rank(samples, quantile)
    bound = max(noise, min_bound) if samples else None
    judged = [r for r in rows if r["judged"]]
    same = [r for r in rows if not r["judged"]]
    slower = [r for r in judged if r["ratio"] > 1 + bound]  # judged is empty where bound is None
    wins = [r for r in judged if r["ratio"] < 1 - bound]
    flat = [r for r in judged if r not in slower and r not in wins]
    wrong = [r for r in rows if r["wrong"]]
    unmeasured = [asdict(p) for p in missing if p.judged]
    worst = max((r["ratio"] for r in judged), default=None)
    why = ([f"{len(slower)} overridden point(s) slower than 1 + bound"] if slower else []) + \
          ([f"{len(wrong)} point(s) with a wrong first output"] if wrong else []) + \
          ([f"{len(unmeasured)} overridden tuned point(s) not measured"] if unmeasured else []) + \
          (["no point measured"] if not rows else [])
    return {
        "points": len(rows), "not_measured": len(missing), "tuned_points": sum(r["tuned_point"] for r in rows),
        "overridden": len(judged), "noise": noise, "noise_max": max(samples, default=None),
        "noise_quantile": quantile, "min_bound": min_bound, "bound": bound, "target": target,
        "max_slowdown": worst, "target_met": None if worst is None else worst <= target,
        "geomean_overridden": geomean(r["ratio"] for r in judged) if judged else None,
        "geomean_all": geomean(r["ratio"] for r in rows) if rows else None,
        "same_row_max_dev": max((abs(r["ratio"] - 1) for r in same), default=None),
        "wins": wins, "no_measurable_win": flat, "slower": slower, "wrong": wrong,
        "unmeasured_overridden": unmeasured, "passed": not why, "why": why, "rows": rows,
    }


def _point_text(r: dict) -> str:
    gain = f", tune's gain +{r['gain']:.1%}" if r.get("gain") is not None else ""
    return f"{r['shape']} M={r['m']} {r['family']}:{r['override']} {r['ratio']:.3f}{gain}"


def summary_lines(s: dict) -> list:
    def pct(v):
        return "-" if v is None else f"{v:.2%}"

    lines = [f"tune_ab: {s['points']} points ({s['tuned_points']} tuned, {s['overridden']} with a row override), "
             f"{s['not_measured']} not measured; noise p{s['noise_quantile'] * 100:.0f} |planner_again/planner - 1| "
             f"{pct(s['noise'])} (max {pct(s['noise_max'])}), bound max(noise, {pct(s['min_bound'])}) = "
             f"{pct(s['bound'])}"]
    if s["overridden"]:
        met = "met" if s["target_met"] else "MISSED"
        lines.append(f"tune_ab: tuned/planner at the overridden points: geomean {s['geomean_overridden']:.3f}, "
                     f"max {s['max_slowdown']:.3f} (target <= {s['target']:.2f}: {met}); "
                     f"all points geomean {s['geomean_all']:.3f}")
    else:
        lines.append("tune_ab: the file overrides no measured point: tuned runs the planner's rows everywhere"
                     + (f"; all points geomean {s['geomean_all']:.3f}" if s["geomean_all"] else ""))
    for label, key in (("wins where the planner misses", "wins"), ("no measurable win", "no_measurable_win"),
                       ("SLOWER than 1 + bound", "slower"), ("WRONG output", "wrong")):
        if s[key]:
            more = f"; and {len(s[key]) - LIST_MAX} more (JSON: header.notes.tune_ab)" if len(s[key]) > LIST_MAX else ""
            lines.append(f"tune_ab: {label} ({len(s[key])}): "
                         + "; ".join(_point_text(r) for r in s[key][:LIST_MAX]) + more)
    if s["same_row_max_dev"] is not None:
        lines.append(f"tune_ab: planner's own row under the tuned table ({s['points'] - s['overridden']} points): "
                     f"max |tuned/planner - 1| {pct(s['same_row_max_dev'])}")
    lines.append("tune_ab: PASS" if s["passed"] else "tune_ab: FAIL: " + "; ".join(s["why"]))
    return lines


def plot_ratios(s: dict, path: Path) -> None:
    """Per-point ratios by M: tuned where it overrides, tuned elsewhere, and the planner against itself."""
    from .analysis import ab_compare

    series: dict = {}
    for r in s["rows"]:
        label = "tuned, overridden row" if r["judged"] else "tuned, planner's row"
        series.setdefault(label, {}).setdefault(r["m"], []).append((r["shape"], r["ratio"]))
        series.setdefault("planner again", {}).setdefault(r["m"], []).append((r["shape"], 1 + r["noise"]))
    if series:
        ab_compare.plot(series, "planner", path, f"tuned vs planner, one run (bound {s['bound']:.2%})")
    else:
        print(f"no ratio plot ({path}): no point measured")


# --------------------------------------------------------------------------------------------
# Command line
# --------------------------------------------------------------------------------------------


def main(argv=None) -> int:
    parser = harness.common_parser(__doc__, ())
    parser.add_argument("tuned", type=Path, help="a blockfp8_tuned.json, or the model directory holding one")
    parser.add_argument("--format", choices=("auto", "fp8-block", "nvfp4"), default="auto",
                        help="the checkpoint format the file was tuned on (default: from its measurement families)")
    parser.add_argument("--min-bound", type=float, default=MIN_BOUND,
                        help="the least slowdown bound, whatever the measured noise (default %(default)s)")
    parser.set_defaults(shapes=DEFAULT_SETS)
    args = parser.parse_args(argv)
    doc, entries = load_tuned(args.tuned, args.dry_run)
    fmt = file_format(doc, args.format)
    ms = harness.parse_m(args.m) if args.m else sorted(set(doc.get("buckets") or shapes.TUNE_M))
    set_shapes = [] if args.shapes == "none" else harness.resolve_shapes(args.shapes, args.quick)
    ops = None
    if args.dry_run:
        tables = tune.DryRunTables()
    else:
        from vllm_blockfp8 import ops

        tune.ready_to_time(SystemExit)
        tables = tune.GpuTables()
    points = plan_points(doc, entries, fmt, set_shapes, ms, tables)
    runner = harness.start(SCRIPT, args)
    runner.report.notes.update(
        tuned_file=str(args.tuned), tuned_key=doc.get("key"), tuned_model=doc.get("model"), overrides=entries,
        variants=f"{', '.join(ORDER)}: one graph each per point, captured with its table in force "
                 "(planner: ops.set_tuned_rows([]); tuned: the file's overrides), replayed in turns",
        weights="the same copies for every M of a shape; one x [M, K] per point")
    if args.dry_run:
        fake_points(runner, points, fmt)
    else:
        run_points(runner, points, fmt, entries, ops)
    summary = summarize(points, runner.report.records, args.min_bound)
    runner.report.notes["tune_ab"] = summary
    harness.finish(runner, args, SCRIPT)
    json_path, plot_path = harness.output_paths(args, SCRIPT)
    ratio_path = plot_path.with_name(plot_path.stem + "_ratio.png")
    plot_ratios(summary, ratio_path)
    print(f"\nratio plot: {ratio_path}")
    for line in summary_lines(summary):
        print(line)
    return 0 if summary["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
