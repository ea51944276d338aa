"""Stall samples per SASS instruction from an Nsight Compute source-page export (an H200 diagnostic).

    ncu --section SourceCounters ... -o rep python3 dev/ncu/ncu_rows.py ...      # on the GPU machine
    ncu --import rep.ncu-rep --page source --csv --print-source sass > rep_sass.csv
    python3 dev/ncu/ncu_sass_stalls.py rep_sass.csv[.gz] [--top 25] [--kernel INDEX]

For each kernel in the export (ncu repeats a kernel's table once per profiled launch; the first copy of each
launch is read): instructions executed, the share of all warp samples by stall reason, the instructions with
the most samples (address, SASS, executions, their largest reasons), and the K loop's body: the SASS between
two consecutive zeroing wgmma (`QGMMA ... RZ, !UPT`, the first of each K block's batch), its length and
opcode mix. Compares two kernels of one tile by what they execute and where their warps wait (how the
tok64 kernel's straddle bookkeeping was found: gemm/NOTES.md).
"""

from __future__ import annotations

import argparse
import csv
import gzip
import io
import sys
from collections import Counter


def kernels(path: str) -> list[tuple[str, list[dict]]]:
    """[(kernel name, rows)] in file order; each table starts with a "Kernel Name" line and its header."""
    out: list[tuple[str, list[dict]]] = []
    raw = gzip.open(path, "rb").read() if path.endswith(".gz") else open(path, "rb").read()
    lines = list(csv.reader(io.StringIO(raw.decode(), newline="")))
    i = 0
    while i < len(lines):
        if lines[i] and lines[i][0] == "Kernel Name":
            name, header, rows = lines[i][1], lines[i + 1], []
            i += 2
            while i < len(lines) and lines[i] and lines[i][0] != "Kernel Name":
                if len(lines[i]) == len(header):
                    rows.append(dict(zip(header, lines[i])))
                i += 1
            out.append((name, rows))
        else:
            i += 1
    return out


def number(v: str) -> float:
    try:
        return float(v.replace(",", ""))
    except ValueError:
        return 0.0


def summarize(name: str, rows: list[dict], top: int) -> None:
    reasons = [c for c in rows[0] if c.startswith("stall_") and "Not Issued" not in c]
    executed = sum(number(r["Instructions Executed"]) for r in rows)
    samples = sum(number(r["Warp Stall Sampling (All Samples)"]) for r in rows)
    by_reason = Counter({c[len("stall_"):]: sum(number(r[c]) for r in rows) for c in reasons})
    print(f"{name[:110]}")
    print(f"  SASS instructions {len(rows)}, warp instructions executed {executed:,.0f}, samples {samples:,.0f}")
    total = sum(by_reason.values()) or 1
    print("  by reason: " + ", ".join(f"{k} {100 * v / total:.1f}%" for k, v in by_reason.most_common(10) if v))
    ranked = sorted(rows, key=lambda r: -number(r["Warp Stall Sampling (All Samples)"]))
    for r in ranked[:top]:
        s = number(r["Warp Stall Sampling (All Samples)"])
        if not s:
            break
        parts = Counter({c[len("stall_"):]: number(r[c]) for c in reasons})
        why = " ".join(f"{k}:{v:.0f}" for k, v in parts.most_common(3) if v)
        print(f"  {100 * s / (samples or 1):5.1f}% {r['Address'][-5:]:>5} {r['Source'][:58]:58} "
              f"exec={number(r['Instructions Executed']):>9,.0f} {why}")
    starts = [i for i, r in enumerate(rows) if "QGMMA" in r["Source"] and "RZ, !UPT" in r["Source"]]
    if len(starts) >= 2:
        mid = len(starts) // 2
        body = rows[starts[mid - 1]:starts[mid]]
        ops = Counter((r["Source"].split()[1] if r["Source"].startswith("@") else r["Source"].split()[0]) for r in body)
        print(f"  K loop: {len(starts)} zeroing wgmma, gaps {[b - a for a, b in zip(starts, starts[1:])]}; "
              f"one block: {len(body)} instructions: " + ", ".join(f"{k} {v}" for k, v in ops.most_common(12)))


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("csv")
    p.add_argument("--top", type=int, default=25)
    p.add_argument("--kernel", type=int, default=None, help="only the INDEX-th distinct table (0-based)")
    args = p.parse_args()
    found = kernels(args.csv)
    # ncu prints each launch's table twice in a row (two source views of one result): keep the first of a pair.
    distinct = [k for i, k in enumerate(found) if i == 0 or k[0] != found[i - 1][0] or k[1] != found[i - 1][1]]
    if not distinct:
        print(f"no kernel table in {args.csv}", file=sys.stderr)
        return 1
    for i, (name, rows) in enumerate(distinct):
        if args.kernel is None or args.kernel == i:
            summarize(name, rows, args.top)
    return 0


if __name__ == "__main__":
    sys.exit(main())
