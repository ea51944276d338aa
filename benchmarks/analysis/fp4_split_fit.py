"""Fit the NVFP4 wgmma rows' K-split cost model to `h200_check.sh fp4_split_sweep` runs (the constants of
`kTok256Costs` in vllm_blockfp8/csrc/fp4/sm90/w4a16_wgmma.cu; fp4/NOTES.md has the measured story).

    python benchmarks/analysis/fp4_split_fit.py RUN_DIR [RUN_DIR ...] --slots RUN_DIR/cluster_slots.txt [--m 256]
        [--row fp4_wgmma_128x128]

Reads every fp4_split_<I>_<REDUCTION><SPLITS>.json under the run folders (only forced counts: a file named ...auto
holds the rule's own count, which its name does not say) and the cluster_slots_probe table (CTAs that run at once in
clusters of s = 1..16, per CTAs per SM). Per token tile (the wgmma row that M selects; records of another row the
table chose are left out), or for the row forced beside it (--row), least squares weighted by 1 / time over the
records of the M values asked for:

    time ~ a + stage x waves x ceil(stages / s) + wave x waves + partial_mb x 2 s M N 4 / 1e6 (partials)
             + cluster_wave x waves (a cluster)

waves = ceil(tiles s / slots): slots = CTAs per SM x SMs for partials and s = 1, the probe's count for a cluster.
Prints the coefficients, the rms relative error, and per M the model's choice (among the counts sampled) against the
best sampled time and against the partials rule's choice (w4a16_wgmma.cu's rule for the 32..128-token tiles).
--coef STAGE,WAVE,PARTIAL_MB,CLUSTER_WAVE judges those constants (e.g. the C++ ones) instead of the fit's.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import sys
from collections import defaultdict
from pathlib import Path

import numpy as np

TILES = ((32, 3), (64, 2), (128, 2), (256, 1))  # (token tile, CTAs per SM): w4a16_wgmma.cuh's WgmmaTile
STAGE_K, FILL, MAX_SPLITS, MIN_STAGES = 64, 4, 16, 8
FEATURES = ("a", "stage", "wave", "partial_mb", "cluster_wave")
FILE = re.compile(r"fp4_split_\d+_(cluster|partials|auto)(\d+|auto)\.json$")


def tile_of(m: int, tok: int | None = None) -> tuple[int, int]:
    """(token tile, CTAs per SM) of the wgmma row the table runs at M (M <= 511), or of the `tok` tile (a forced row)."""
    return next(t for t in TILES if t[0] == tok) if tok else next(t for t in TILES if m <= t[0] or t[0] == 256)


def parse_slots(text: str) -> dict[int, list[int]]:
    """{CTAs per SM: [CTAs at once for clusters of 1..16]} from cluster_slots_probe's printed table."""
    out = {}
    for line in text.splitlines():
        nums = line.split()
        if len(nums) == 2 + MAX_SPLITS and all(x.isdigit() for x in nums):
            out[int(nums[0])] = [int(x) for x in nums[2:]]
    if not out:
        raise ValueError("no cluster_slots_probe table found")
    return out


def waves(m: int, n: int, s: int, cluster: bool, slots: dict, sms: int, tok: int | None = None) -> int:
    tok, per_sm = tile_of(m, tok)
    tiles = math.ceil(m / tok) * math.ceil(n / 128)
    at_once = slots[per_sm][s - 1] if cluster and s > 1 else per_sm * sms
    return math.ceil(tiles * s / at_once) if at_once else 0


def features(m: int, n: int, k: int, s: int, cluster: bool, slots: dict, sms: int, tok: int | None = None) -> list[float]:
    w = waves(m, n, s, cluster, slots, sms, tok)
    partial = 2 * s * m * n * 4 / 1e6 if s > 1 and not cluster else 0.0
    return [1.0, w * math.ceil(k // STAGE_K / s), w, partial, w if cluster and s > 1 else 0]


def row_tile(row: str) -> int | None:
    hit = re.fullmatch(r"fp4_wgmma_128x(\d+)", row or "")
    return int(hit.group(1)) if hit else None


def read_runs(dirs: list[Path], row: str | None = None) -> list[tuple]:
    """(shape, m, n, k, splits, cluster, us) of every forced-count record of "ours" (the row the table selects), or
    of the forced `row` (bench_nvfp4 --rows: impl "ours@ROW")."""
    impl = f"ours@{row}" if row else "ours"
    out = []
    for d in dirs:
        for f in sorted(Path(d).rglob("*fp4_split_*.json")):
            hit = FILE.search(f.name)
            if hit is None or hit.group(2) == "auto":
                continue
            s, cluster = int(hit.group(2)), hit.group(1) == "cluster"
            for r in json.loads(f.read_text())["records"]:
                if r.get("impl") != impl or not r.get("us"):
                    continue
                # The table may run another token tile at this M (the 128x128 row at M = 129..511 where its model
                # rates it faster): such records are not the M's tile's.
                if row is None and row_tile(r.get("row")) not in (None, tile_of(r["m"])[0]):
                    continue
                out.append((r["shape"], r["m"], r["n"], r["k"], s, cluster and s > 1, r["us"]))
    return out


def fit(records: list[tuple], slots: dict, sms: int, tok: int | None = None) -> tuple[np.ndarray, float]:
    """Coefficients (FEATURES order) and rms relative error."""
    x = np.array([features(m, n, k, s, c, slots, sms, tok) for _, m, n, k, s, c, _ in records], float)
    y = np.array([r[-1] for r in records], float)
    coef, *_ = np.linalg.lstsq(x / y[:, None], np.ones_like(y), rcond=None)
    return coef, float(np.sqrt(np.mean((x @ coef / y - 1) ** 2)))


def modelled(coef, m, n, k, s, cluster, slots, sms, tok=None) -> float:
    return float(np.dot(coef[1:], features(m, n, k, s, cluster, slots, sms, tok)[1:]))


def choose(coef, m, n, k, counts, slots, sms, tok=None) -> tuple[int, bool]:
    """The (count, cluster) of least modelled time among `counts` (and 1), a cluster first on a tie."""
    most = max(1, min(k // STAGE_K // MIN_STAGES, MAX_SPLITS))
    best, best_cost = (1, False), modelled(coef, m, n, k, 1, False, slots, sms, tok)
    for s in sorted(c for c in counts if 1 < c <= most):
        for cluster in (True, False):
            if waves(m, n, s, cluster, slots, sms, tok) and (
                    cost := modelled(coef, m, n, k, s, cluster, slots, sms, tok)) < best_cost:
                best, best_cost = (s, cluster), cost
    return best


def partials_rule(m: int, n: int, k: int, sms: int, tok: int | None = None) -> int:
    """w4a16_wgmma.cu's count for the 32..128-token tiles: waves x (stages / s + ring fill) on partial slots."""
    tok, per_sm = tile_of(m, tok)
    tiles, slots, stages = math.ceil(m / tok) * math.ceil(n / 128), per_sm * sms, k // STAGE_K
    if tiles >= slots:
        return 1
    best, best_cost = 1, stages + FILL
    for s in range(2, max(1, min(stages // MIN_STAGES, MAX_SPLITS)) + 1):
        cost = math.ceil(tiles * s / slots) * (math.ceil(stages / s) + FILL)
        if cost < best_cost:
            best, best_cost = s, cost
    return best


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("runs", nargs="+", type=Path)
    p.add_argument("--slots", type=Path, required=True, help="cluster_slots_probe output")
    p.add_argument("--m", default="256", help="comma-separated M values to fit (each token tile separately)")
    p.add_argument("--sms", type=int, default=132)
    p.add_argument("--coef", help="STAGE,WAVE,PARTIAL_MB,CLUSTER_WAVE: choose with these instead of the fit")
    p.add_argument("--row", help="fit the forced row's records (e.g. fp4_wgmma_128x128; a sweep run with its ROWS)")
    args = p.parse_args(argv)
    slots = parse_slots(args.slots.read_text())
    records = read_runs(args.runs, args.row)
    forced_tok = row_tile(args.row) if args.row else None
    if args.row and forced_tok is None:
        print(f"--row {args.row}: not a wgmma row (fp4_wgmma_128xT)", file=sys.stderr)
        return 2
    ms = {int(x) for x in args.m.split(",")}
    by_tile = defaultdict(list)
    for r in records:
        if r[1] in ms:
            by_tile[forced_tok or tile_of(r[1])[0]].append(r)
    if not by_tile:
        print("no forced-count records at those M", file=sys.stderr)
        return 1
    for tok, recs in sorted(by_tile.items()):
        coef, rms = fit(recs, slots, args.sms, tok)
        print(f"tile {tok}: {len(recs)} records, rms {rms:.3f}, " +
              ", ".join(f"{name} {c:.3f}" for name, c in zip(FEATURES, coef)))
        if args.coef:
            coef = np.array([0.0, *map(float, args.coef.split(","))])
            print(f"  choosing with --coef {args.coef}")
        times = defaultdict(dict)
        for shape, m, n, k, s, c, us in recs:
            times[(shape, m, n, k)][(s, c)] = us
        counts = {s for _, _, _, _, s, _, _ in recs}
        for m in sorted({key[1] for key in times}):
            ratios_best, ratios_rule = [], []
            for (shape, mm, n, k), t in times.items():
                if mm != m:
                    continue
                pick = choose(coef, m, n, k, counts, slots, args.sms, tok)
                if pick in t:
                    ratios_best.append(t[pick] / min(t.values()))
                    if (rule := (partials_rule(m, n, k, args.sms, tok), False)) in t:
                        ratios_rule.append(t[pick] / t[rule])
            geo = lambda xs: math.exp(sum(map(math.log, xs)) / len(xs)) if xs else float("nan")  # noqa: E731
            print(f"  M = {m}: model's choice / best sampled {geo(ratios_best):.3f} (worst "
                  f"{max(ratios_best, default=float('nan')):.2f}), / the partials rule's {geo(ratios_rule):.3f} "
                  f"({min(ratios_rule, default=float('nan')):.2f}-{max(ratios_rule, default=float('nan')):.2f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
