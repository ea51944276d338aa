"""Complete one benchmark JSON with the points a second run measured (when a device call's time
budget cut the first run short): records of SECOND at points FIRST lacks are appended, FIRST's
header is kept and SECOND's is appended to header["continued_by"] (a list: merges chain), the
plot is redrawn and the geomean lines printed. Every record keeps the speedups of its own run
(peers at a point are always from the run that timed ours there).

With --replace, SECOND's records also replace FIRST's at the points both measured (a table change
made after FIRST moved those points to another row); header["replaced"] lists those points.

    python benchmarks/analysis/merge_bench.py FIRST.json.gz SECOND.json.gz --json OUT.json.gz --plot OUT.png [--replace]
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from benchmarks.report import Ceilings, Record, Report, dump_json, load_json  # noqa: E402


def point(r: dict) -> tuple:
    return r["op"], r["shape"], r["m"]


def merge(first: dict, second: dict, *, replace: bool = False) -> dict:
    """FIRST completed by SECOND (module docstring)."""
    theirs = {point(r) for r in second["records"]}
    ours = {point(r) for r in first["records"]}
    replaced = ours & theirs if replace else set()
    kept = [r for r in first["records"] if point(r) not in replaced]
    added = [r for r in second["records"] if point(r) not in ours or point(r) in replaced]
    done = {point(r) for r in added}
    prev = first["header"].get("continued_by")
    chain = (prev if isinstance(prev, list) else [prev] if prev else []) + [second["header"]]
    head = dict(first["header"], continued_by=chain)
    if replaced:
        head["replaced"] = head.get("replaced", []) + [list(p) for p in sorted(replaced)]
    return dict(header=head, records=kept + added,
                skipped=[s for s in first["skipped"] if point(s) not in done] + second["skipped"])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("first", type=Path)
    ap.add_argument("second", type=Path)
    ap.add_argument("--json", type=Path, required=True)
    ap.add_argument("--plot", type=Path, required=True)
    ap.add_argument("--replace", action="store_true",
                    help="SECOND's records replace FIRST's at the points both measured")
    args = ap.parse_args(argv)
    out = merge(load_json(args.first), load_json(args.second), replace=args.replace)
    head = out["header"]
    report = Report(head["script"], Ceilings(**head["ceilings"]), head["replays"])
    fields = {f.name for f in dataclasses.fields(Record)}
    for r in out["records"]:
        report.records.append(Record(**{k: v for k, v in r.items() if k in fields}))
    out["geomean"] = report.geomean_lines()  # the merged records' summary, not either run's
    dump_json(out, args.json)
    why = report.plot(args.plot)
    print(f"{len(out['records'])} records ({len(head.get('replaced', []))} points replaced) -> {args.json}"
          + (f"; {why}" if why else f", {args.plot}"))
    print("\n".join(report.geomean_lines()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
