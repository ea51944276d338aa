"""Candidate-vs-base time ratios from `h200_check.sh ab_gemm` runs (the numbers the rules in gemm/NOTES.md read).

    python benchmarks/analysis/ab_compare.py BASE_ROW A.json B.json [A2.json B2.json ...] [--out merged.json] [--plot ratios.png]
    python benchmarks/analysis/ab_compare.py selected A.json B.json ... [--only-selected ROW[,ROW]]
    python benchmarks/analysis/ab_compare.py --settings BASE_SETTING CAND1.json BASE1.json CAND2.json BASE2.json ... [--op gemm|linear]
    python benchmarks/analysis/ab_compare.py --impls NAME A.json::CAND::BASE B.json::CAND2::BASE2 ... [--op gemm|linear]

Each pair of JSON files is one ab_gemm spec: the same forced rows timed in two processes with the
row order reversed. Per point (shape, M) and candidate row, the ratio is the geometric mean over
the two runs of candidate time / BASE_ROW time, so each run's drift and its first-variant effects
cancel between the orders. BASE_ROW `selected` is, per point, the row the table selected in that
run (the `row` of its un-forced "ours" record): that row's forced time where it was forced, else the
"ours" time. --only-selected keeps the points where the table selected one of the rows named (a
rule's "where the base row is selected"). Printed: per candidate, the geomean over all points and per M, the
count of points where it is faster, the range and the worst shape. --out writes one compact JSON (gzip-compressed for a .json.gz name)
(the runs' headers and every forced-row time, enough to recompute everything printed); --plot
draws the per-point ratios by M. --settings compares one setting of the same rows against another
(an environment switch or a build, each in its own process: h200_check.sh ab_builds): pairs (candidate
run, base run), ideally run in the order candidate, base, base, candidate so that drift cancels as well. --impls compares two impls
of the same run (e.g. ``ours@pdl=1`` against ``ours``, both timed interleaved in one process), each run
naming its own pair, so a second run may hold the two in the other position (``ours`` in mode 1 against
``ours@pdl=0``): per point the geomean over the runs of CAND / BASE.
"""

from __future__ import annotations

import argparse
import sys
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from benchmarks.report import dump_json, geomean, load_json, save_png  # noqa: E402


SELECTED = "selected"


def forced_times(path: Path, op: str | None = None) -> tuple[dict, dict]:
    """(header, {(shape, m, row): us}) of the forced rows (impl 'ours@ROW') of one run, plus row
    `selected` (module docstring) at the points where the run's table selection is known; only the
    records of `op` (gemm / linear) when given (a `--ops both` run has both at every point)."""
    data = load_json(path)
    records = [r for r in data["records"] if op is None or r.get("op") == op]
    times = {(r["shape"], r["m"], r["impl"].split("@", 1)[1]): r["us"]
             for r in records if "@" in r["impl"]}
    for r in records:
        if r["impl"] == "ours" and r.get("row"):
            times[(r["shape"], r["m"], SELECTED)] = times.get((r["shape"], r["m"], r["row"]), r["us"])
    return data["header"], times


def selected_rows(path: Path) -> dict:
    """{(shape, m): the row the table selected} of one run."""
    return {(r["shape"], r["m"]): r["row"] for r in load_json(path)["records"] if r["impl"] == "ours" and r.get("row")}


def ratios(base: str, runs: list[dict]) -> dict[str, dict[int, list[tuple[str, float]]]]:
    """{candidate: {m: [(shape, ratio)]}} over the points every run timed for both rows."""
    out: dict[str, dict[int, list[tuple[str, float]]]] = defaultdict(lambda: defaultdict(list))
    rows = {row for t in runs for (_, _, row) in t} - {base, SELECTED}
    points = {(s, m) for t in runs for (s, m, _) in t}
    for row in sorted(rows):
        for s, m in sorted(points):
            r = [t[(s, m, row)] / t[(s, m, base)] for t in runs if (s, m, row) in t and (s, m, base) in t]
            if len(r) == len(runs):
                out[row][m].append((s, geomean(r)))
    return out


def setting_ratios(cand: dict, base: dict, out: dict) -> None:
    """--settings: the same rows timed under two settings (e.g. an environment switch) in two
    processes; adds {row: {m: [(shape, cand / base)]}} for the points both timed."""
    for (s, m, row), us in sorted(cand.items()):
        if (s, m, row) in base:
            out.setdefault(row, {}).setdefault(m, []).append((s, us / base[(s, m, row)]))


def impl_ratios(specs: list[str], op: str | None) -> dict[str, dict[int, list[tuple[str, float]]]]:
    """--impls: {CAND of the first spec: {m: [(shape, geomean over the runs of CAND / BASE)]}} over the points
    every run timed both impls of its spec (PATH::CAND::BASE)."""
    per_run = []
    for spec in specs:
        path, cand, base = spec.split("::")
        records = [r for r in load_json(Path(path))["records"] if op is None or r.get("op") == op]
        us = {(r["shape"], r["m"], r["impl"]): r["us"] for r in records}
        per_run.append({(s, m): us[(s, m, cand)] / us[(s, m, base)]
                        for (s, m, impl) in us if impl == cand and (s, m, base) in us})
    common = set.intersection(*(set(r) for r in per_run))
    name = specs[0].split("::")[1]
    out: dict = {name: defaultdict(list)}
    for s, m in sorted(common):
        out[name][m].append((s, geomean([r[(s, m)] for r in per_run])))
    return out


def report(base: str, table) -> list[str]:
    lines = []
    for row, by_m in table.items():
        every = [x for pts in by_m.values() for _, x in pts]
        lines.append(f"{row} / {base}: {geomean(every):.3f} over {len(every)} points, "
                     f"faster at {sum(x < 1 for x in every)}")
        for m, pts in sorted(by_m.items()):
            v = [x for _, x in pts]
            worst = max(pts, key=lambda p: p[1])[0]
            lines.append(f"  M={m:<6} {geomean(v):.3f}  range {min(v):.2f}-{max(v):.2f}  worst {worst}")
    return lines


def plot(table, base: str, path: Path, title: str = "candidate vs base, geomean of both run orders per point") -> None:
    """Per-point ratios by M, one series per candidate."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(8, 4.5))
    all_ms = sorted({m for by_m in table.values() for m in by_m})
    for j, (row, by_m) in enumerate(table.items()):
        ms = sorted(by_m)
        offset = (j - (len(table) - 1) / 2) * 0.12
        xs = [all_ms.index(m) + offset for m in ms for _ in by_m[m]]
        ys = [x for m in ms for _, x in by_m[m]]
        ax.scatter(xs, ys, s=12, label=f"{row} ({geomean(ys):.3f})")
    ax.set_xticks(range(len(all_ms)), [str(m) for m in all_ms])
    ax.axhline(1.0, color="k", lw=0.8)
    ax.set_xlabel("M")
    ax.set_ylabel(f"time / {base}")
    ax.set_title(title)
    ax.legend(fontsize=7)
    fig.tight_layout()
    save_png(fig, path, dpi=90)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("base", help="the base row; with --settings, a name for the base setting")
    ap.add_argument("runs", nargs="+", type=Path, help="JSON files, in (a, b) pairs")
    ap.add_argument("--settings", action="store_true",
                    help="each pair is (candidate setting, base setting) of the same rows in two processes: "
                         "per row and point the ratio a / b, geomean over the pairs")
    ap.add_argument("--impls", action="store_true",
                    help="each run is PATH::CAND::BASE, two impls of that run (base is then only a label)")
    ap.add_argument("--only-selected", default="",
                    help="comma-separated rows: keep the points where the table selected one of them")
    ap.add_argument("--op", choices=("gemm", "linear"), default=None,
                    help="only the records of this op (runs of bench_gemm --ops both hold both)")
    ap.add_argument("--out", type=Path)
    ap.add_argument("--plot", type=Path)
    a = ap.parse_args(argv)
    if a.impls:
        table = impl_ratios([str(r) for r in a.runs], a.op)
        print("\n".join(report(a.base, table)))
        if a.out:
            dump_json({"base": a.base, "impls": [str(r) for r in a.runs],
                       "ratios": {k: {str(m): v for m, v in by_m.items()} for k, by_m in table.items()}}, a.out)
        if a.plot:
            plot(table, a.base, a.plot, "two impls of one run, geomean over the runs per point")
        return 0
    if len(a.runs) % 2:
        ap.error("give the JSON files in (a, b) pairs, one pair per ab_gemm spec")
    loaded = [forced_times(p, a.op) for p in a.runs]
    if a.only_selected:
        keep = set(a.only_selected.split(","))
        for p, (_, t) in zip(a.runs, loaded):
            chosen = selected_rows(p)
            for key in [key for key in t if chosen.get(key[:2]) not in keep]:
                del t[key]
    table: dict = {}
    if a.settings:
        per_pair: list[dict] = []
        for i in range(0, len(loaded), 2):
            per_pair.append({})
            setting_ratios(loaded[i][1], loaded[i + 1][1], per_pair[-1])
        for row in per_pair[0]:
            for m, pts in per_pair[0][row].items():
                for shape, _ in pts:
                    r = [dict(pp.get(row, {}).get(m, [])).get(shape) for pp in per_pair]
                    if None not in r:
                        table.setdefault(row, {}).setdefault(m, []).append((shape, geomean(r)))
    else:
        for i in range(0, len(loaded), 2):
            for row, by_m in ratios(a.base, [loaded[i][1], loaded[i + 1][1]]).items():
                for m, pts in by_m.items():
                    table.setdefault(row, {}).setdefault(m, []).extend(pts)
    if not table:
        print(f"no point has both {a.base} and a candidate in every run", file=sys.stderr)
        return 1
    print("\n".join(report(a.base, table)))
    if a.out:
        merged = {"base": a.base, "runs": [
            {"file": p.name, "header": h, "us": [[s, m, row, round(us, 3)] for (s, m, row), us in sorted(t.items())]}
            for p, (h, t) in zip(a.runs, loaded)]}
        dump_json(merged, a.out)
    if a.plot:
        plot(table, a.base, a.plot)
    return 0


if __name__ == "__main__":
    sys.exit(main())
