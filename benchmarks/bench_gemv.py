"""Decode: the full linear (bf16 x in, bf16 out) for M = 1..16 over shapes.BENCHMARK_SET.

ours = ops.blockfp8_linear (the row it selects is shown); --rows adds every GEMV row forced through
ops.blockfp8_gemv(x, b, b_scale, row=i). Peers: bf16 (cuBLAS on the dequantized weight) and the
W8A8 peers with their activation quantizer inside the timed call. Floor: 16-bit activations.

  python -m benchmarks.bench_gemv                       # all shapes, M = 1,2,4,8,16
  python -m benchmarks.bench_gemv --quick --rows        # 3 shapes, 5 replays, every GEMV row
  python -m benchmarks.bench_gemv --dry-run             # no GPU: fake timings, table/JSON/plot
  python -m benchmarks.bench_gemv --m 8,16,24,32,48,64 --linear-rows --peers none   # crossover
"""

from __future__ import annotations

import sys

from vllm_blockfp8 import shapes

from . import harness, peers

SCRIPT = "bench_gemv"


def our_variants(args, ops, ops_why, copies, checker, m, n, k) -> list[harness.Variant]:
    if ops is None and not args.dry_run:
        return [harness.Variant("ours", skip=ops_why)]
    dry = args.dry_run
    out = [harness.Variant(
        "ours", row="dry" if dry else peers.selected_row(ops, "linear", m, n, k), strict=False,
        check=None if dry else checker.linear("w8a8", "weight_only"),
        factory=lambda i: (lambda c=copies[i]: ops.blockfp8_linear(c.x, c.b, c.b_scale)))]
    if args.linear_rows:
        for i, r in enumerate(peers.forced_rows(ops, "linear", dry)):
            out.append(harness.Variant(
                f"ours@linear.{r['name']}", row=r["name"], strict=False,
                check=None if dry else checker.linear("w8a8", "weight_only"),
                factory=lambda j, i=i: (lambda c=copies[j]: ops.blockfp8_linear(
                    c.x, c.b, c.b_scale, row=i))))
    if args.rows:
        for i, r in enumerate(peers.forced_rows(ops, "gemv", dry)):
            out.append(harness.Variant(
                f"ours@{r['name']}", row=r["name"], strict=False,
                check=None if dry else checker.linear("weight_only"),
                factory=lambda j, i=i: (lambda c=copies[j]: ops.blockfp8_gemv(
                    c.x, c.b, c.b_scale, row=i))))
    return out


def main(argv=None) -> int:
    parser = harness.common_parser(__doc__, shapes.DECODE_M)
    parser.add_argument("--rows", action="store_true", help="also time every forced GEMV row")
    parser.add_argument("--linear-rows", action="store_true",
                        help="also time every forced linear row (gemv, w8a8_gemm, ...): the "
                             "GEMV/GEMM crossover, e.g. with --m 8,16,24,32,48,64 --peers none")
    args = parser.parse_args(argv)
    runner = harness.start(SCRIPT, args)
    ms = harness.parse_m(args.m)
    ops, ops_why = (None, "dry run") if args.dry_run else peers.our_ops()
    peer_list = peers.select(peers.GEMM_PEERS + peers.DECODE_PEERS, args.peers)  # + FlashInfer, M <= 32
    unavailable = peers.probe(peer_list, args.dry_run)
    if not args.dry_run:
        runner.report.notes["peer_quantizer"] = peers.peer_quantizer()[0]
    for shape in harness.resolve_shapes(args.shapes, args.quick):
        n, k = shape.n, shape.k
        for m in ms:
            copies = peers.LazyCopies(
                lambda i, m=m, n=n, k=k: peers.make_operands(m, n, k, gemm_inputs=False))
            checker = peers.Checker(copies)
            variants = (our_variants(args, ops, ops_why, copies, checker, m, n, k)
                        + peers.variants(peer_list, unavailable, "linear", copies, checker,
                                         m, n, k, args.dry_run))
            runner.point(op="linear", shape=shape.name, m=m, n=n, k=k,
                         floor=harness.linear_floor(runner.report.ceilings, m, n, k),
                         copies=harness.copies_for(n * k), variants=variants)
    harness.finish(runner, args, SCRIPT)
    return 0


if __name__ == "__main__":
    sys.exit(main())
