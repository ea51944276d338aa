"""The activation quantizer: ops.per_token_group_quant (1x128 groups, M-major scales) for M in
shapes.QUANT_M and K in {4096, 7168, 12288}.

Bytes per call: read 2*M*K (bf16), write M*K (fp8) + 4*M*K/128 (scales); the floor is those bytes
at the measured copy bandwidth, so "/floor" inverts to the % of copy bandwidth in the geomean line.
Peers: vllm_quant (vLLM's CUDA per_token_group_fp8_quant, same layout) and torch_eager (the
reference quantizer as eager torch ops); beside them yardstick:cast_fp8, not a quantizer and never
the "best peer": torch's bf16 -> fp8 cast, the same bytes without the scales or the math, i.e.
what one launch of this size reaches at all; and yardstick:copy, a device-to-device copy of the same
traffic, whose time over ours is the % of copy bandwidth at this size (the floor's rate is a
large copy's). Rotation: copies of x until 256 MiB (at most 256
copies: below M ~ 128 the inputs stay L2-resident, where the quantizer is launch-bound anyway).
ours = the row the op selects by M (shown); --rows adds every row of the quant tile table forced
through ops.per_token_group_quant(x, row=i), timed by the same harness on the same copies.

  python -m benchmarks.bench_quant                     # K = 4096,7168,12288
  python -m benchmarks.bench_quant --shapes 7168 --m 1024,8192
  python -m benchmarks.bench_quant --rows              # every quant row side by side, forced
  python -m benchmarks.bench_quant --dry-run
"""

from __future__ import annotations

import sys

from vllm_blockfp8 import shapes

from . import harness, peers

SCRIPT = "bench_quant"
DEFAULT_K = (4096, 7168, 12288)
QUICK_K = (4096, 7168)


def k_values(spec: str, quick: bool) -> list[int]:
    """--shapes for the quantizer: K values ("4096,7168", "K=4096") or weight shapes (their K)."""
    if spec == "benchmark_set":
        return list(QUICK_K if quick else DEFAULT_K)
    ks: list[int] = []
    for tok in (t.strip() for t in spec.split(",") if t.strip()):
        digits = tok[2:] if tok.lower().startswith("k=") else tok
        found = [int(digits)] if digits.isdigit() else [s.k for s in harness.resolve_shapes(tok)]
        ks.extend(k for k in found if k not in ks)
    return ks


def main(argv=None) -> int:
    parser = harness.common_parser(__doc__, shapes.QUANT_M)
    parser.add_argument("--rows", action="store_true", help="also time every forced quant row")
    args = parser.parse_args(argv)
    runner = harness.start(SCRIPT, args)
    ms = harness.parse_m(args.m)
    dry = args.dry_run
    ops, ops_why = (None, "dry run") if dry else peers.our_ops()
    peer_list = peers.select(peers.QUANT_PEERS, args.peers)
    unavailable = peers.probe(peer_list, dry)
    for k in k_values(args.shapes, args.quick):
        for m in ms:
            xs = peers.LazyCopies(lambda i, m=m, k=k: _randn(m, k))
            variants = []
            if ops is None and not dry:
                variants.append(harness.Variant("ours", skip=ops_why))
            else:
                variants.append(harness.Variant(
                    "ours", row="dry" if dry else peers.selected_row(ops, "quant", m, 0, k), strict=False,
                    check=None if dry else _check(xs),
                    factory=lambda i: (lambda x=xs[i]: ops.per_token_group_quant(x))))
                if args.rows:
                    for r, row in enumerate(peers.forced_rows(ops, "quant", dry)):
                        variants.append(harness.Variant(
                            f"ours@{row['name']}", row=row["name"], strict=False,
                            check=None if dry else _check(xs),
                            factory=lambda i, r=r: (lambda x=xs[i]: ops.per_token_group_quant(x, row=r))))
            for p in peer_list:
                variants.append(harness.Variant(
                    p.name, skip=unavailable.get(p.name) or p.rejects(m, 0, k),
                    check=None if dry or p.reference != "quant" else _check(xs),
                    factory=lambda i, p=p: p.build(xs[i], "quant")))
            runner.point(op="quant", shape=f"K={k}", m=m, n=0, k=k,
                         floor=harness.quant_floor(runner.report.ceilings, m, k),
                         copies=harness.copies_for(2 * m * k), variants=variants)
    harness.finish(runner, args, SCRIPT)
    return 0


def _randn(m: int, k: int):
    import torch

    return torch.randn(m, k, device="cuda", dtype=torch.bfloat16)


def _check(xs):
    """Check the first output against copy 0's input (made lazily, inside the timed variant)."""
    return lambda out: peers.check_quant(xs[0])(out)


if __name__ == "__main__":
    sys.exit(main())
