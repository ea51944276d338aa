"""Time per K block of forced GEMM rows, against the number of CTAs that walk K at once.

For each row and each N, times the row at several K (CUDA graphs over rotating copies, as the
benchmarks) and fits t(K) = fixed + blocks * per_block by least squares. If per_block stays flat
as N (the CTA count) grows, each CTA's walk is limited by something of its own (latency, its
consumer loop); if it grows with the CTAs, by something they share (DRAM, L2).

  BLOCKFP8_SM90_SPLITS=1 python dev/probes/walk_probe.py --rows sm90_swapab_128x64x128_ovl@128 \
      --n 512,1024,2048,4096,5120,8192 --k 2048,4096,6144,8192 --json walk.json

BLOCKFP8_SM90_SPLITS=1 keeps every row unsplit (no split-K, no K slices), so each CTA walks all of K;
keep K below 96 blocks where the tiles are few, or the stream-K rule of the swap rows fires (the plan
column says what ran). Each spec is ROW@M. --plot draws per-block time against N (with the JSON of this
run, or, with --replot, of earlier runs; no GPU needed then):

  python dev/probes/walk_probe.py --replot walk_cold.json walk_hot.json --plot walk.png
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from benchmarks import harness, report  # noqa: E402
from vllm_blockfp8 import ops, reference  # noqa: E402


def fit(blocks: list[int], us: list[float]) -> tuple[float, float]:
    """Least-squares (fixed, per_block) of us = fixed + per_block * blocks."""
    n = len(blocks)
    mx, my = sum(blocks) / n, sum(us) / n
    sxx = sum((x - mx) ** 2 for x in blocks)
    per_block = sum((x - mx) * (y - my) for x, y in zip(blocks, us)) / sxx if sxx else float("nan")
    return my - per_block * mx, per_block


def time_point(row_index: int, m: int, n: int, k: int, replays: int, copies: int = 0) -> float:
    g = torch.Generator(device="cuda").manual_seed(m + n + k)
    x = torch.randn(m, k, device="cuda", generator=g).to(torch.bfloat16)
    a, a_scale = ops.per_token_group_quant(x, 128)
    b, b_scale = reference.quantize_block_fp8(torch.randn(n, k, device="cuda", generator=g))
    copies = copies or harness.copies_for(n * k)
    bs = [(b.clone(), b_scale.clone()) for _ in range(copies)]

    def factory(i):
        w, s = bs[i]
        return lambda: ops.blockfp8_gemm(a, a_scale, w, s, torch.bfloat16, row=row_index)

    t = harness.time_graph(factory, copies, replays=replays)
    del bs
    return t.us


def plot(runs: list[tuple[str, list[dict]]], path: str) -> None:
    """Per-block time against N, one line per (run, row, M)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4.5))
    for label, points in runs:
        for key in sorted({(p["row"], p["m"], str(p.get("copies", "rotating"))) for p in points}):
            pts = sorted((p["n"], p["per_block_us"]) for p in points if (p["row"], p["m"], str(p.get("copies", "rotating"))) == key)
            hot = "" if key[2] == "rotating" else f", {key[2]} copies (L2-hot)"
            ax.plot([n for n, _ in pts], [us for _, us in pts], marker="o", label=f"{key[0]} M={key[1]}{hot} [{label}]")
    ax.set_xlabel("N (CTAs grow with N)")
    ax.set_ylabel("us per 128-deep K block")
    ax.set_ylim(bottom=0)
    ax.set_title("time per K block (fit over K) against the number of CTAs")
    ax.legend(fontsize=6)
    fig.tight_layout()
    report.save_png(fig, Path(path), dpi=90)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--replot", nargs="+", default=None, help="JSON files of earlier runs: only draw --plot")
    ap.add_argument("--plot", default=None, help="PNG of per-block time against N")
    ap.add_argument("--rows", help="ROW@M[,ROW@M...]")
    ap.add_argument("--n", help="comma-separated N")
    ap.add_argument("--k", help="comma-separated K (multiples of 128, at least two)")
    ap.add_argument("--replays", type=int, default=harness.MIN_REPLAYS)
    ap.add_argument("--copies", type=int, default=0,
                    help="weight copies per graph (default: enough to exceed L2; 2 keeps small weights L2-hot)")
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    if args.replot:
        if not args.plot:
            ap.error("--replot needs --plot")
        plot([(Path(f).stem, json.load(open(f))["points"]) for f in args.replot], args.plot)
        return 0
    if not (args.rows and args.n and args.k):
        ap.error("--rows, --n and --k are needed (or --replot)")
    if not (torch.cuda.is_available() and ops.HAS_CUDA_KERNELS):
        print("walk_probe: needs a CUDA GPU and the compiled extension", file=sys.stderr)
        return 2
    names = [r["name"] for r in ops.tile_table("gemm")]
    ns = [int(v) for v in args.n.split(",")]
    ks = [int(v) for v in args.k.split(",")]
    out = []
    for spec in args.rows.split(","):
        row, m = spec.split("@")
        m = int(m)
        if row not in names:
            raise SystemExit(f"walk_probe: no GEMM row {row}; rows: {', '.join(names)}")
        ri = names.index(row)
        for n in ns:
            us = [time_point(ri, m, n, k, args.replays, args.copies) for k in ks]
            blocks = [k // 128 for k in ks]
            fixed, per_block = fit(blocks, us)
            plans = sorted({(ops.gemm_k_plan(ri, m, n, k) or {}).get("plan", "?") for k in ks})
            rec = {"row": row, "m": m, "n": n, "k": ks, "us": us, "copies": args.copies or "rotating", "fixed_us": fixed, "per_block_us": per_block,
                   "plans": plans}
            out.append(rec)
            print(f"{row:34s} M={m:4d} N={n:6d} per_block {per_block:6.3f} us  fixed {fixed:6.2f} us  "
                  f"{'/'.join(plans):14s} " + " ".join(f"{u:7.2f}" for u in us), flush=True)
    meta = report.environment()
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"meta": meta, "points": out}, f, indent=1)
    if args.plot:
        plot([("this run", out)], args.plot)
    return 0 if all(math.isfinite(r["per_block_us"]) for r in out) else 1


if __name__ == "__main__":
    sys.exit(main())
