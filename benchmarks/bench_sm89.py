"""The SM89 (Ada) W8A8 GEMM table forced on this GPU: the full linear (bf16 in, activation quantizer included) over
shapes.BENCHMARK_SET at M = 1..8192, beside what vLLM runs for block FP8 on Ada (issue 42, item 5).

Variants at every point (each call captured inside its own ``ops.gemm_table(...)``, so one process times them all):
  ours                  ops.blockfp8_linear with the SM89 tables in force: its linear row (GEMV at M <= 16, else
                        quantizer + the SM89 GEMM row its planner picks; the row column names both)
  ours@<sm89 row>       every SM89 GEMM row forced: ops.per_token_group_quant + ops.blockfp8_gemm(row=<row>)
  ours@dequant_matmul   the linear op's dequantize + cuBLAS row, forced by name (the path before the SM89 rows)
  yardstick:ours_sm90   ops.blockfp8_linear with the SM90 tables (wgmma): the ceiling on this GPU, never a peer
  vllm_triton           vLLM's w8a8_triton_block_scaled_mm after its CUDA quantizer: what vLLM 0.26 runs on Ada
  marlin_fp8            vLLM's apply_fp8_marlin_linear on prepare_fp8_layer_for_marlin's repack (W8A16, the
                        128x128 block scales widened to group-128 channel scales): what newer vLLM runs on Ada
"vs best peer" is against the better of vllm_triton and marlin_fp8 at each point.

Floor: max(minimum bytes / measured copy bandwidth, FLOPs / the mma.sync e4m3 peak of
dev/probes/mma_fp8_rate.py, --mma-peak). So at small M the ratio is to the memory floor and at M >= 1024 to the
measured mma.sync peak; the printed lines after the table give both directly. Without --mma-peak the floor takes
the measured wgmma/cuBLASLt FP8 peak, and the header and summary say so. On the H200 the SM89 rows run their sm_90a
code, where the e4m3 mma.sync is an f16 emulation (the probe's header): timings here rank the rows and test the
plumbing; they do not predict an Ada GPU.

  python -m benchmarks.bench_sm89 --mma-peak /tmp/mma_peak.json             # 15 shapes x 13 M, every variant
  python -m benchmarks.bench_sm89 --quick --m 1,16,64,256,1024,4096 --rows none
  python -m benchmarks.bench_sm89 --dry-run                                  # no GPU: fake timings
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import json
import sys
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace

import torch

from vllm_blockfp8 import reference, shapes

from . import harness, peers
from .report import band_of, geomean

SCRIPT = "bench_sm89"
TABLE = "sm89"
CEILING = "yardstick:ours_sm90"
DEQUANT_ROW = "dequant_matmul"
DEFAULT_M = shapes.DECODE_M + shapes.MID_M + shapes.PREFILL_M


# --------------------------------------------------------------------------------------------
# Operands: one block-FP8 weight per copy, shared by every M of a shape (and its Marlin repack)
# --------------------------------------------------------------------------------------------


class Fp8Weight:
    """One rotating copy of a block-FP8 weight (reference.quantize_block_fp8 of randn [N, K]) and vLLM's Marlin
    repack of the same numbers, made on first use (outside the timed call, only where marlin_fp8 runs)."""

    def __init__(self, n: int, k: int, *, device="cuda"):
        self.n, self.k = n, k
        self.b, self.b_scale = reference.quantize_block_fp8(torch.randn(n, k, device=device))

    @functools.cached_property
    def marlin(self) -> SimpleNamespace:
        """As vLLM's MarlinFP8ScaledMMLinearKernel.process_weights_after_loading builds it for a block-quantized
        layer (size_k_first=False): weight fp8 [N, K] packed to int32 and gptq_marlin_repack'ed (num_bits=8);
        weight_scale_inv [N/128, K/128] transposed, repeated 128x along N (group-128 channel scales), cast to the
        layer's bf16, permuted, the e4m3 -> bf16 exponent bias fused in; a workspace of one int per SM."""
        layer = SimpleNamespace(weight=self.b, weight_scale_inv=self.b_scale, weight_block_size=[128, 128],
                                output_size_per_partition=self.n, input_size_per_partition=self.k,
                                orig_dtype=torch.bfloat16)
        marlin_fp8_api()[0].prepare(layer, size_k_first=False)  # replaces weight and weight_scale_inv
        return layer


@dataclass
class Sm89Operands(peers.Operands):
    """peers.Operands (x, b, b_scale: what the Triton peer and the checker read) plus the weight they came from."""
    w: Fp8Weight | None = None


@functools.cache
def marlin_fp8_api():
    """(vLLM's Marlin FP8 entry points, None) or (None, why not); imported apart from peers.vllm_api()."""
    try:
        import vllm
        from vllm.model_executor.layers.quantization.utils import marlin_utils_fp8 as fp8
    except Exception as exc:
        return None, f"vllm not importable: {type(exc).__name__}: {exc}"
    return SimpleNamespace(version=vllm.__version__, prepare=fp8.prepare_fp8_layer_for_marlin,
                           apply=fp8.apply_fp8_marlin_linear, supported=fp8.is_fp8_marlin_supported), None


def _marlin_fp8_unavailable():
    api, why = marlin_fp8_api()
    if why:
        return why
    if not api.supported():
        return "vLLM's is_fp8_marlin_supported() is False (Marlin FP8 needs SM75+)"
    return None


def _marlin_fp8_build(o: Sm89Operands, mode: str):
    api, layer, x = marlin_fp8_api()[0], o.w.marlin, o.x
    # MarlinFP8ScaledMMLinearKernel.apply_weights for a block-quantized layer, argument for argument.
    return lambda: api.apply(input=x, weight=layer.weight, weight_scale=layer.weight_scale_inv,
                             workspace=layer.workspace, size_n=o.w.n, size_k=o.w.k, input_dtype=None, bias=None)


MARLIN_FP8 = peers.Peer(
    "marlin_fp8", "vllm (apply_fp8_marlin_linear on prepare_fp8_layer_for_marlin's repack: "
    "MarlinFP8ScaledMMLinearKernel, W8A16, group 128), SM75+", "weight_only",
    lambda: peers._needs_cuda() or _marlin_fp8_unavailable(), peers._k_block, _marlin_fp8_build)
SM89_PEERS = tuple(p for p in peers.GEMM_PEERS if p.name == "vllm_triton") + (MARLIN_FP8,)


# --------------------------------------------------------------------------------------------
# Ours
# --------------------------------------------------------------------------------------------


def _in_table(ops, table: str, fn):
    with contextlib.nullcontext() if ops is None else ops.gemm_table(table):
        return fn()


def linear_row(ops, table: str, m: int, n: int, k: int) -> str:
    """The linear row the op picks under ``table`` and, for the W8A8 path, the GEMM row: "w8a8_gemm:<row>"."""
    def ask():
        path = peers.selected_row(ops, "linear", m, n, k)
        return f"{path}:{peers.selected_row(ops, 'gemm', m, n, k)}" if path == "w8a8_gemm" else path
    return _in_table(ops, table, ask)


def sm89_rows(ops, dry: bool) -> list[dict]:
    if dry:
        return peers.forced_rows(ops, "gemm", True)
    return _in_table(ops, TABLE, lambda: list(ops.tile_table("gemm")))


def our_variants(args, ops, ops_why, copies, checker, m, n, k) -> list[harness.Variant]:
    if ops is None and not args.dry_run:
        return [harness.Variant("ours", skip=ops_why)]
    dry = args.dry_run

    def check(*kinds):
        return None if dry else checker.linear(*kinds)

    def linear(table, row=None):
        return lambda i: (lambda c=copies[i]: _in_table(ops, table, lambda: ops.blockfp8_linear(
            c.x, c.b, c.b_scale, row=row)))

    out = [harness.Variant("ours", row="dry" if dry else linear_row(ops, TABLE, m, n, k), strict=False,
                           check=check("w8a8", "weight_only"), factory=linear(TABLE))]
    rows = sm89_rows(ops, dry)
    if args.rows != "all":
        by_name = {r["name"]: r for r in rows}
        wanted = [x for x in (args.rows or "").split(",") if x and x != "none"]
        unknown = [x for x in wanted if x not in by_name]
        if unknown:
            raise SystemExit(f"--rows: no SM89 row named {', '.join(unknown)}; rows: {', '.join(by_name)}")
        rows = [by_name[x] for x in wanted]
    for r in rows:
        def factory(i, name=r["name"]):
            def run(c=copies[i]):
                def call():
                    q, s = ops.per_token_group_quant(c.x)
                    return ops.blockfp8_gemm(q, s, c.b, c.b_scale, torch.bfloat16, row=name)
                return _in_table(ops, TABLE, call)
            return run
        out.append(harness.Variant(f"ours@{r['name']}", row=r["name"], strict=False, check=check("w8a8"),
                                   factory=factory))
    if args.dequant:
        out.append(harness.Variant(f"ours@{DEQUANT_ROW}", row=DEQUANT_ROW, strict=False,
                                   check=check("weight_only"), factory=linear(TABLE, DEQUANT_ROW)))
    if args.ceiling:
        out.append(harness.Variant(CEILING, row="dry" if dry else linear_row(ops, "sm90", m, n, k), strict=False,
                                   check=check("w8a8", "weight_only"), factory=linear("sm90")))
    return out


# --------------------------------------------------------------------------------------------
# The mma.sync peak, the floor and the summary lines
# --------------------------------------------------------------------------------------------


def read_mma_peak(spec: str | None) -> tuple[float | None, str]:
    """(e4m3 mma.sync FLOP/s, where it came from): a number of TFLOP/s, or dev/probes/mma_fp8_rate.py's JSON line
    (its file). None where nothing was given; a malformed value fails here, before any timing."""
    if not spec:
        return None, "none given"
    try:
        return float(spec) * 1e12, f"--mma-peak {spec} TFLOP/s"
    except ValueError:
        pass
    path = Path(spec)
    try:
        lines = [line for line in path.read_text().splitlines() if line.strip().startswith("{")]
        data = json.loads(lines[-1])
        tflops = float(data["e4m3_tflops"])
    except (OSError, IndexError, KeyError, ValueError) as exc:
        raise SystemExit(f"--mma-peak: {spec} is neither TFLOP/s nor mma_fp8_rate.py's JSON line ({exc!r})")
    if not tflops > 0:
        raise SystemExit(f"--mma-peak: {spec} gives e4m3_tflops={tflops}")
    return tflops * 1e12, f"{path} ({data.get('gpu')}, {data.get('arch')}, {data.get('e4m3_config')}, git {data.get('git')})"


def summary_lines(report, peak_flops: float, peak_src: str) -> list[str]:
    """Per band and variant of ours: the share of copy bandwidth (M <= 256) or of the mma.sync peak (M >= 1024),
    geomean over the points; and each variant of ours against the better of vllm_triton and marlin_fp8."""
    lines = [f"compute ceiling of the floor: {peak_flops / 1e12:.0f} TFLOP/s ({peak_src})"]
    copy = report.ceilings.copy_bytes_per_s
    impls = list(dict.fromkeys(r.impl for r in report.records if r.is_ours or r.impl == CEILING))
    for band in dict.fromkeys(band_of(r.op, r.m) for r in report.records):
        recs = [r for r in report.records if band_of(r.op, r.m) == band]
        prefill = all(r.m >= 1024 for r in recs)
        parts = []
        for impl in impls:
            mine = [r for r in recs if r.impl == impl]
            if not mine:
                continue
            share = (geomean(r.flops / (r.us * 1e-6) / peak_flops for r in mine) if prefill
                     else geomean(r.bytes / (r.us * 1e-6) / copy for r in mine))
            vs = [min(p.us for p in report.peers_at(r.key).values()) / r.us for r in mine if report.peers_at(r.key)]
            text = f"{impl} {100 * share:.0f}%"
            if vs:
                text += f" ({geomean(vs):.2f}x vs best of triton/marlin, slower at {sum(v < 1 for v in vs)}/{len(vs)})"
            parts.append(text)
        what = "of the mma.sync peak" if prefill else "of copy bandwidth"
        lines.append(f"[{band}] {what}: " + "; ".join(parts))
    return lines


def main(argv=None) -> int:
    parser = harness.common_parser(__doc__, DEFAULT_M)
    parser.add_argument("--rows", default="all", help="SM89 GEMM rows to force: all (default), none, or names")
    parser.add_argument("--no-dequant", dest="dequant", action="store_false",
                        help="leave out the forced dequantize + cuBLAS row")
    parser.add_argument("--no-ceiling", dest="ceiling", action="store_false",
                        help=f"leave out {CEILING} (our SM90 rows)")
    parser.add_argument("--mma-peak", help="TFLOP/s, or the file of dev/probes/mma_fp8_rate.py --out: the floor's "
                        "compute ceiling (default: the measured wgmma/cuBLASLt FP8 peak, said in the header)")
    args = parser.parse_args(argv)
    peak, peak_src = read_mma_peak(args.mma_peak)
    runner = harness.start(SCRIPT, args)
    ceil = runner.report.ceilings
    if peak is None:
        peak, peak_src = ceil.fp8_flops, "NOT the mma.sync peak: no --mma-peak, the floor uses the wgmma FP8 peak"
        print(f"bench_sm89: {peak_src}", flush=True)
    floor_ceil = dataclasses.replace(ceil, fp8_flops=peak)
    ms = harness.parse_m(args.m)
    ops, ops_why = (None, "dry run") if args.dry_run else peers.our_ops()
    peer_list = peers.select(SM89_PEERS, args.peers)
    unavailable = peers.probe(peer_list, args.dry_run)
    notes = runner.report.notes
    notes.update(
        table=f"ours and ours@<row>: ops.gemm_table('{TABLE}') forced; {CEILING}: ops.gemm_table('sm90')",
        floor=f"max(bytes / copy bandwidth, flops / {peak / 1e12:.0f} TFLOP/s: {peak_src})",
        weights="reference.quantize_block_fp8(randn [N, K]); the same copies for every M of a shape",
        marlin_fp8=(f"vllm {marlin_fp8_api()[0].version}" if not args.dry_run and "marlin_fp8" in unavailable
                    and unavailable["marlin_fp8"] is None else "not run"))
    if not args.dry_run:
        notes["peer_quantizer"] = peers.peer_quantizer()[0]
    for shape in harness.resolve_shapes(args.shapes, args.quick):
        n, k = shape.n, shape.k
        weights = peers.LazyCopies(lambda i, n=n, k=k: Fp8Weight(n, k))
        for m in ms:
            copies = peers.LazyCopies(lambda i, m=m, k=k, w=weights: Sm89Operands(
                torch.randn(m, k, device="cuda", dtype=torch.bfloat16), w[i].b, w[i].b_scale, w=w[i]))
            checker = peers.Checker(copies)
            variants = (our_variants(args, ops, ops_why, copies, checker, m, n, k)
                        + peers.variants(peer_list, unavailable, "linear", copies, checker, m, n, k, args.dry_run))
            runner.point(op="linear", shape=shape.name, m=m, n=n, k=k,
                         floor=harness.linear_floor(floor_ceil, m, n, k),
                         copies=harness.copies_for(n * k), variants=variants)
    if ops is not None:
        notes["self_check"] = ops.gemm_self_check(TABLE)  # a failed row would have run the safe path
    lines = summary_lines(runner.report, peak, peak_src) if runner.report.records else []
    notes["sm89_summary"] = lines
    harness.finish(runner, args, SCRIPT)
    print()
    for line in lines:
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
