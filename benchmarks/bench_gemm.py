"""Mid and prefill M: the W8A8 GEMM alone (fp8 activations and their scales given) and the full
linear (bf16 in, activation quantization included), over shapes.BENCHMARK_SET.

ours = ops.blockfp8_gemm (GEMM only) and ops.blockfp8_linear (full linear); --rows adds every
ops.tile_table("gemm") row forced through blockfp8_gemm(..., row=i). GEMM-only floors count fp8
activations and their scales; full-linear floors count 16-bit activations.

  python -m benchmarks.bench_gemm                         # M = 32..256 and 1024..8192, both ops
  python -m benchmarks.bench_gemm --ops gemm --rows --m 128,4096
  python -m benchmarks.bench_gemm --ops gemm --rows ROW_A,ROW_B --peers none   # two rows, that order
  python -m benchmarks.bench_gemm --pdl 1 --peers deepgemm,deepgemm_nopdl   # launch modes side by side
  python -m benchmarks.bench_gemm --dry-run               # no GPU: fake timings

--pdl MODES adds ours under each SM90 launch mode named (BLOCKFP8_SM90_PDL's values, set per capture
with ops.sm90_pdl) as impl "ours@pdl=MODE"; "ours" keeps the process's mode.
benchmarks/analysis/ab_compare.py --impls compares them with "ours" (or selected reads them as rows
against it).
"""

from __future__ import annotations

import contextlib
import sys

from vllm_blockfp8 import shapes

from . import harness, peers

SCRIPT = "bench_gemm"


def _in_launch_mode(ops, mode, fn):
    with contextlib.nullcontext() if ops is None else ops.sm90_pdl(mode):  # ops is None in a dry run
        return fn()


def _pdl_modes(spec: str) -> list[str]:
    from vllm_blockfp8.ops import SM90_ENV_SWITCHES  # noqa: PLC0415 (the allowed values' one home)
    modes = [x for x in spec.split(",") if x]
    bad = [x for x in modes if x not in SM90_ENV_SWITCHES["BLOCKFP8_SM90_PDL"]]
    if bad:
        raise SystemExit(f"--pdl: unknown modes {bad}; known: {', '.join(SM90_ENV_SWITCHES['BLOCKFP8_SM90_PDL'])}")
    return modes


def our_variants(args, op, ops, ops_why, copies, checker, m, n, k) -> list[harness.Variant]:
    if ops is None and not args.dry_run:
        return [harness.Variant("ours", skip=ops_why)]
    dry = args.dry_run
    family = "gemm" if op == "gemm" else "linear"
    if op == "gemm":
        def call(c, row=None):
            return ops.blockfp8_gemm(c.a, c.a_scale, c.b, c.b_scale, row=row)
        kinds = ("w8a8",)
    else:
        def call(c, row=None):
            return ops.blockfp8_linear(c.x, c.b, c.b_scale)
        kinds = ("w8a8", "weight_only")
    out = [harness.Variant(
        "ours", row="dry" if dry else peers.selected_row(ops, family, m, n, k), strict=False,
        check=None if dry else checker.linear(*kinds),
        factory=lambda i: (lambda c=copies[i]: call(c)))]
    for mode in args.pdl:
        out.append(harness.Variant(
            f"ours@pdl={mode}", row="dry" if dry else peers.selected_row(ops, family, m, n, k), strict=False,
            check=None if dry else checker.linear(*kinds),
            factory=lambda i, mode=mode: (lambda c=copies[i]: _in_launch_mode(ops, mode, lambda: call(c)))))
    if args.rows and op == "gemm":
        rows = list(enumerate(peers.forced_rows(ops, "gemm", dry)))
        if args.rows != "all":  # the named rows, in the order given (alternate it between runs)
            by_name = {r["name"]: (i, r) for i, r in rows}
            unknown = [x for x in args.rows.split(",") if x not in by_name]
            if unknown:
                raise SystemExit(f"--rows: no GEMM row named {', '.join(unknown)}; rows: {', '.join(by_name)}")
            rows = [by_name[x] for x in args.rows.split(",")]
        for i, r in rows:
            out.append(harness.Variant(
                f"ours@{r['name']}", row=r["name"], strict=False,
                check=None if dry else checker.linear("w8a8"),
                factory=lambda j, i=i: (lambda c=copies[j]: call(c, row=i))))
    return out


def main(argv=None) -> int:
    parser = harness.common_parser(__doc__, shapes.MID_M + shapes.PREFILL_M)
    parser.add_argument("--ops", choices=("gemm", "linear", "both"), default="both",
                        help="GEMM only, full linear, or both (default)")
    parser.add_argument("--rows", nargs="?", const="all", default=None,
                        help="also time forced GEMM rows: every row, or the comma-separated names given")
    parser.add_argument("--pdl", type=_pdl_modes, default=[],
                        help="also time ours under these SM90 launch modes (comma-separated: 0, 1, gemm)")
    args = parser.parse_args(argv)
    runner = harness.start(SCRIPT, args)
    ms = harness.parse_m(args.m)
    op_list = ("gemm", "linear") if args.ops == "both" else (args.ops,)
    ops, ops_why = (None, "dry run") if args.dry_run else peers.our_ops()
    peer_list = peers.select(peers.GEMM_PEERS, args.peers)
    unavailable = peers.probe(peer_list, args.dry_run)
    if not args.dry_run:
        runner.report.notes["peer_quantizer"] = peers.peer_quantizer()[0]
        runner.report.notes["gemm_inputs"] = "reference quantizer, M-major scales (1, M4)"
    for op in op_list:
        gemm_only = op == "gemm"
        for shape in harness.resolve_shapes(args.shapes, args.quick):
            n, k = shape.n, shape.k
            for m in ms:
                copies = peers.LazyCopies(
                    lambda i, m=m, n=n, k=k, g=gemm_only: peers.make_operands(m, n, k,
                                                                             gemm_inputs=g))
                checker = peers.Checker(copies)
                variants = (our_variants(args, op, ops, ops_why, copies, checker, m, n, k)
                            + peers.variants(peer_list, unavailable, op, copies, checker,
                                             m, n, k, args.dry_run))
                floor = harness.linear_floor(runner.report.ceilings, m, n, k,
                                             quantized_activations=gemm_only)
                runner.point(op=op, shape=shape.name, m=m, n=n, k=k, floor=floor,
                             copies=harness.copies_for(n * k), variants=variants)
    harness.finish(runner, args, SCRIPT)
    return 0


if __name__ == "__main__":
    sys.exit(main())
