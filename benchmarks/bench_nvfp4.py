"""NVFP4 weight-only linear (W4A16: bf16 x, NVFP4 weight, bf16 out) over shapes.BENCHMARK_SET, from
decode to prefill M (issue 40).

ours = ops.nvfp4_linear on the weight as our layer holds it (ops.nvfp4_layer_weight: the fragment packing on
SM90, the paired one elsewhere; one global scale per row; the row it selects is shown); --rows adds every row of the nvfp4 tile table (or the named ones) forced
through nvfp4_linear(..., row=i).
Peers, all on the same packed E2M1 codes, E4M3 scales and global scale, every repack and
dequantization outside the timed call: marlin_fp4, vLLM's apply_fp4_marlin_linear on
prepare_fp4_layer_for_marlin's repack (what MarlinNvFp4LinearKernel runs for Hopper and Ada NVFP4
users), and bf16, cuBLAS on the weight dequantized once. Beside them yardstick:ours_fp8, our FP8
linear (ops.blockfp8_linear) on a block-FP8 copy of the same weight: another format, shown but never
the best peer (--no-fp8 leaves it out). Floor: packed weight + scales + global scale + bf16 activations and output
at the measured copy bandwidth, or 2*M*N*K at the measured bf16 peak (harness.linear_floor with
weight="nvfp4"). First outputs are checked against reference.nvfp4_linear_ref (peers_fp4.FP4_*_TOL).

  python -m benchmarks.bench_nvfp4                       # 15 shapes, M = 1..256 and 1024..8192
  python -m benchmarks.bench_nvfp4 --quick --rows --m 1,16,4096
  python -m benchmarks.bench_nvfp4 --rows fp4_wgmma_128x256,fp4_dequant_cublas --m 512,1024
  python -m benchmarks.bench_nvfp4 --m 1,2,4,8,16 --peers marlin_fp4 --no-fp8
  python -m benchmarks.bench_nvfp4 --dry-run             # no GPU: fake timings
  blockfp8 bench --op nvfp4                              # the same through the CLI
"""

from __future__ import annotations

import sys

import torch

from vllm_blockfp8 import reference, shapes
from vllm_blockfp8.tools.harness import first_line

from . import harness, peers, peers_fp4

SCRIPT = "bench_nvfp4"
FAMILY = "nvfp4"                       # the op's tile table, and the records' op
FP8 = "yardstick:ours_fp8"
DEFAULT_M = shapes.DECODE_M + shapes.MID_M + shapes.PREFILL_M


def forced_rows(ops, dry: bool) -> tuple[list[dict], str | None]:
    """The nvfp4 table's rows, or why there are none to force: an ops build from before the family
    existed refuses its name (ValueError)."""
    try:
        return peers.forced_rows(ops, FAMILY, dry), None
    except ValueError as exc:
        return [], f"no {FAMILY} rows to force: {first_line(exc)}"


def our_variants(args, ops, ops_why, copies, checker, m, n, k) -> list[harness.Variant]:
    if ops is None and not args.dry_run:
        return [harness.Variant("ours", skip=ops_why)]
    dry = args.dry_run
    check = None if dry else checker.linear("w4a16", tol=peers_fp4.FP4_OURS_TOL)
    # The dequantize row rounds each weight to bf16 (global scale folded in) before cuBLAS, as the bf16 peer's
    # weight is: held to the peers' tolerance, whether the op picks it or it is forced.
    dequant = None if dry else checker.linear("w4a16", tol=peers_fp4.FP4_PEER_TOL)
    selected = "dry" if dry else peers.selected_row(ops, FAMILY, m, n, k)

    def call(o, row=None):
        if row is None:  # the call a model makes (and one that needs no row= in the signature)
            return ops.nvfp4_linear(o.x, o.w.layer[0], o.w.layer[1], o.w.row_scale, packing=o.w.layer[2])
        return ops.nvfp4_linear(o.x, o.w.layer[0], o.w.layer[1], o.w.row_scale, row=row, packing=o.w.layer[2])

    out = [harness.Variant(
        "ours", row=selected, strict=False, check=dequant if selected in reference.NVFP4_WEIGHT_ROUNDING_ROWS else check,
        factory=lambda i: (lambda o=copies[i]: call(o)))]
    if args.rows:
        rows, why = forced_rows(ops, dry)
        if why:
            out.append(harness.Variant("ours@rows", skip=why))
        wanted = None if args.rows == "all" else set(args.rows.split(","))
        unknown = sorted(wanted - {r["name"] for r in rows}) if wanted and rows and not dry else []
        if unknown:
            raise SystemExit(f"--rows: no row {', '.join(unknown)} in the nvfp4 table: {[r['name'] for r in rows]}")
        for i, r in enumerate(rows):
            if wanted and not dry and r["name"] not in wanted:
                continue
            out.append(harness.Variant(
                f"ours@{r['name']}", row=r["name"], strict=False,
                check=dequant if r["name"] in reference.NVFP4_WEIGHT_ROUNDING_ROWS else check,
                factory=lambda j, i=i: (lambda o=copies[j]: call(o, i))))
    return out


def fp8_variants(args, ops, ops_why, copies, m, n, k) -> list[harness.Variant]:
    """Our FP8 linear on the block-FP8 copy of each weight, checked against its own reference
    (weight-only or W8A8: the row it selects decides, as in bench_gemv)."""
    if not args.fp8:
        return []
    if ops is None and not args.dry_run:
        return [harness.Variant(FP8, skip=ops_why)]
    dry = args.dry_run
    fp8 = peers.LazyCopies(lambda i: peers.Operands(copies[i].x, *copies[i].w.fp8))
    return [harness.Variant(
        FP8, row="dry" if dry else peers.selected_row(ops, "linear", m, n, k),
        check=None if dry else peers.Checker(fp8).linear("w8a8", "weight_only"),
        factory=lambda i: (lambda o=fp8[i]: ops.blockfp8_linear(o.x, o.b, o.b_scale)))]


def main(argv=None) -> int:
    parser = harness.common_parser(__doc__, DEFAULT_M)
    parser.add_argument("--rows", nargs="?", const="all", default=None, metavar="ROW,...",
                        help="also time every forced nvfp4 row, or the named ones")
    parser.add_argument("--no-fp8", dest="fp8", action="store_false",
                        help="leave out our FP8 linear on the same weight (yardstick:ours_fp8)")
    args = parser.parse_args(argv)
    runner = harness.start(SCRIPT, args)
    ms = harness.parse_m(args.m)
    ops, ops_why = (None, "dry run") if args.dry_run else peers.our_ops()
    peer_list = peers.select(peers_fp4.FP4_PEERS, args.peers)
    unavailable = peers.probe(peer_list, args.dry_run)
    marlin = not args.dry_run and "marlin_fp4" in unavailable  # vLLM imported only when asked for
    api = peers_fp4.marlin_fp4_api()[0] if marlin else None
    runner.report.notes.update(
        weights="reference.quantize_nvfp4(randn [N, K]); the same copies for every M of a shape; ours reads "
                "them as the layer stores them (ops.nvfp4_layer_weight: fragment packing on SM90, else paired), "
                "the peers as packed",
        global_scale="ours: fp32 [N], one per output row (our layer's form); marlin_fp4: 0-dim "
                     "(vLLM's); bf16: folded into the weight; the floor counts one (4 bytes)",
        marlin_fp4=f"vllm {api.version}" if api else "not run")
    for shape in harness.resolve_shapes(args.shapes, args.quick):
        n, k = shape.n, shape.k
        # A weight does not depend on M: one set of copies (and their repacks) serves every M.
        weights = peers.LazyCopies(lambda i, n=n, k=k: peers_fp4.Fp4Weight(n, k))
        copies_n = harness.copies_for(harness.nvfp4_weight_bytes(n, k))
        for m in ms:
            copies = peers.LazyCopies(lambda i, m=m, k=k, w=weights: peers_fp4.Fp4Operands(
                torch.randn(m, k, device="cuda", dtype=torch.bfloat16), w[i]))
            checker = peers_fp4.Fp4Checker(copies)
            variants = (our_variants(args, ops, ops_why, copies, checker, m, n, k)
                        + peers.variants(peer_list, unavailable, FAMILY, copies, checker,
                                         m, n, k, args.dry_run)
                        + fp8_variants(args, ops, ops_why, copies, m, n, k))
            runner.point(op=FAMILY, shape=shape.name, m=m, n=n, k=k,
                         floor=harness.linear_floor(runner.report.ceilings, m, n, k, weight="nvfp4"),
                         copies=copies_n, variants=variants)
    harness.finish(runner, args, SCRIPT)
    return 0


if __name__ == "__main__":
    sys.exit(main())
