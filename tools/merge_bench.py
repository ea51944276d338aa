"""Complete one benchmark JSON with the points a second run measured (when a device call's time
budget cut the first run short): records of SECOND at points FIRST lacks are appended, FIRST's
header is kept and SECOND's goes under header["continued_by"], the plot is redrawn and the
geomean lines printed. Every record keeps the speedups of its own run (peers at a point are
always from the run that timed ours there).

    python tools/merge_bench.py FIRST.json.gz SECOND.json.gz --json OUT.json.gz --plot OUT.png
"""

from __future__ import annotations

import argparse
import dataclasses
import gzip
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.report import Ceilings, Record, Report, dump_json  # noqa: E402


def load(path: Path) -> dict:
    raw = path.read_bytes()
    return json.loads(gzip.decompress(raw) if path.name.endswith(".gz") else raw)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("first", type=Path)
    ap.add_argument("second", type=Path)
    ap.add_argument("--json", type=Path, required=True)
    ap.add_argument("--plot", type=Path, required=True)
    args = ap.parse_args(argv)
    first, second = load(args.first), load(args.second)
    have = {(r["op"], r["shape"], r["m"]) for r in first["records"]}
    added = [r for r in second["records"] if (r["op"], r["shape"], r["m"]) not in have]
    fields = {f.name for f in dataclasses.fields(Record)}
    head = first["header"]
    report = Report(head["script"], Ceilings(**head["ceilings"]), head["replays"])
    for r in first["records"] + added:
        report.records.append(Record(**{k: v for k, v in r.items() if k in fields}))
    out = dict(header=dict(head, continued_by=second["header"]), records=first["records"] + added,
               skipped=[s for s in first["skipped"] if (s["op"], s["shape"], s["m"]) not in
                        {(r["op"], r["shape"], r["m"]) for r in added}] + second["skipped"])
    dump_json(out, args.json)
    why = report.plot(args.plot)
    print(f"{len(first['records'])} + {len(added)} records -> {args.json}" + (f"; {why}" if why else f", {args.plot}"))
    print("\n".join(report.geomean_lines()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
