"""The one benchmark harness: ceilings, floors, the Runner, the CLI, on the package's graph timing.

Method (shared/BENCHMARKS.md): a point captures k calls over k distinct operand copies in one CUDA
graph, k chosen so the copies hold >= 256 MiB of weights (the H200's L2 is 50-60 MB, so each call
reads its weight from HBM, as in a model), replays the graph after a warm-up and reports the median
of >= 20 replays divided by k. That timing (copies_for, prepare_graph, time_prepared, time_graph)
is vllm_blockfp8/tools/harness.py, which `blockfp8 tune` uses too; this module re-exports it. The
variants of a point (ours, forced rows, peers) are all captured first and then replayed in turns
(``--timing interleaved``, the default), so that each sees the same clocks; ``--timing
sequential`` times one after another. Floors come from reference.floor_us with
the ceilings measured in the same run. Records, the table, the geomean lines, JSON and the plot live
in report.py and need no GPU: ``--dry-run`` drives them with fake timings.
"""

from __future__ import annotations

import argparse
import math
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable, Sequence

from vllm_blockfp8 import reference, shapes
# The timing itself ships in the package (blockfp8 tune uses it from a wheel); re-exported here for
# the scripts, tests and probes that reach it as benchmarks.harness.
from vllm_blockfp8.tools.harness import (MAX_COPIES, MIN_REPLAYS,  # noqa: F401 (re-exported)
                                         MIN_ROTATION_BYTES, WARMUP_REPLAYS, PreparedGraph,
                                         Timing, WrongResult, copies_for, first_line,
                                         prepare_graph, time_graph, time_prepared, under_table)

from . import held_out_shapes
from .report import PUBLISHED_CEILINGS, Ceilings, Record, Report  # noqa: F401 (re-exported)

QUICK_REPLAYS = 5
RESULTS_DIR = Path(__file__).resolve().parent / "results"
QUICK_SHAPES = ("qwen3-8b.qkv", "dsv3.2112x7168", "seed.8192x2048")
SHAPE_SETS = {**shapes.SETS, **held_out_shapes.SETS}
TIMINGS = ("interleaved", "sequential")  # the first is the default


def measure_ceilings(replays: int = MIN_REPLAYS) -> Ceilings:
    """Copy bandwidth (bytes read + written), cuBLAS bf16 and FP8 8192^3, graph-node overhead."""
    import torch

    dev = "cuda"
    # Two ways to copy 1 GiB: a memcpy node (the copy engine; measured ~2.8 TB/s on the H200)
    # and an elementwise kernel (~4.2 TB/s, what a kernel can reach). The floor takes the faster:
    # a floor must not be beatable.
    src = torch.randn(1 << 28, device=dev)
    dst = torch.empty_like(src)
    t_memcpy = time_graph(lambda i: (lambda: dst.copy_(src)), 1, replays=replays)
    t_kernel = time_graph(lambda i: (lambda: torch.neg(src, out=dst)), 1, replays=replays)
    copy_bps = 2 * src.numel() * src.element_size() / (min(t_memcpy.us, t_kernel.us) * 1e-6)
    del src, dst

    size = 8192
    flops = 2.0 * size**3
    a = torch.randn(size, size, device=dev, dtype=torch.bfloat16)
    b = torch.randn(size, size, device=dev, dtype=torch.bfloat16)
    t_bf16 = time_graph(lambda i: (lambda: torch.mm(a, b)), 1, replays=replays)
    a8, b8 = a.to(torch.float8_e4m3fn), b.to(torch.float8_e4m3fn)  # b8 [N, K]: b8.t() col-major
    del a, b
    one = torch.ones((), device=dev, dtype=torch.float32)
    fp8 = {}
    for fast in (False, True):
        t = time_graph(lambda i, f=fast: (lambda: torch._scaled_mm(
            a8, b8.t(), scale_a=one, scale_b=one, out_dtype=torch.bfloat16, use_fast_accum=f)),
            1, replays=replays)
        fp8[fast] = flops / (t.us * 1e-6)
    del a8, b8

    tiny = torch.ones(1, device=dev)
    t_node = time_graph(lambda i: (lambda: tiny.add_(1.0)), 1000, replays=replays)
    return Ceilings(copy_bytes_per_s=copy_bps, bf16_flops=flops / (t_bf16.us * 1e-6),
                    # The floor takes the faster accumulation mode: a floor must not be beatable.
                    fp8_flops=max(fp8.values()), graph_node_us=t_node.us,
                    fp8_flops_precise_accum=fp8[False], source="measured")


def nvfp4_weight_bytes(n: int, k: int) -> int:
    """Packed E2M1 codes (N*K/2), E4M3 scales per 16 (N*K/16) and one fp32 global scale: the least
    an NVFP4 weight can be read as (a per-row global scale, as our layer passes, adds 4*(N-1))."""
    return n * k // 2 + n * k // reference.NVFP4_GROUP + 4


def linear_floor(ceil: Ceilings, m: int, n: int, k: int, *, quantized_activations: bool = False,
                 weight: str = "fp8") -> tuple[float, int, int]:
    """(floor_us, minimum bytes, flops) of a linear/GEMM point: reference.floor_us for an FP8 weight.

    weight="nvfp4": W4A16 (bench_nvfp4), the NVFP4 weight's bytes with 16-bit activations and
    output, and the bf16 peak for the math: Hopper and Ada have no FP4 tensor cores, so the weight
    is widened to 16 bits and multiplied there."""
    if weight == "nvfp4":
        if quantized_activations:
            raise ValueError("NVFP4 is weight-only here: its activations stay 16-bit")
        nbytes, flops = nvfp4_weight_bytes(n, k) + 2 * m * k + 2 * m * n, 2 * m * n * k
        return max(nbytes / ceil.copy_bytes_per_s, flops / ceil.bf16_flops) * 1e6, nbytes, flops
    if weight != "fp8":
        raise ValueError(f"weight must be fp8 or nvfp4, got {weight!r}")
    kw = dict(activation_bytes=2, quantized_activations=quantized_activations)
    floor = reference.floor_us(m, n, k, bytes_per_s=ceil.copy_bytes_per_s,
                               flops_per_s=ceil.fp8_flops, **kw)
    # The same function at 1 byte/us with no compute bound returns the byte count itself.
    nbytes = round(reference.floor_us(m, n, k, bytes_per_s=1e6, flops_per_s=math.inf, **kw))
    return floor, nbytes, 2 * m * n * k


def quant_floor(ceil: Ceilings, m: int, k: int) -> tuple[float, int, int]:
    """Quantizer: read 2*M*K (bf16), write M*K fp8 + 4*M*K/128 scales, at copy bandwidth."""
    nbytes = 2 * m * k + m * k + 4 * m * math.ceil(k / reference.BLOCK)
    return nbytes / ceil.copy_bytes_per_s * 1e6, nbytes, 0


@dataclass
class Variant:
    """One implementation at one point: ours (or a forced row) or a peer."""
    impl: str
    factory: Callable[[int], Callable[[], object]] | None = None
    row: str = ""
    skip: str | None = None          # why it cannot run here; printed, not timed
    check: Callable[[object], str | None] | None = None
    strict: bool = True              # peers: a wrong result is skipped; ours: timed and flagged
    note: str = ""


@dataclass
class Runner:
    """Times the variants of each point (or fakes them under --dry-run) into a Report."""
    report: Report
    replays: int
    dry_run: bool
    fake_seed: int = 0
    deadline: float | None = None  # time.monotonic() after which no new point starts
    # "interleaved": every variant of a point captured first, then their replays in turns
    # (time_prepared). "sequential": one variant's replays after another's, the point's first
    # variant timed once more before the timed pass and discarded (without that it ran up to
    # ~15-30% slow at single points, mostly at the first M of a shape; 2026-11-30).
    timing: str = "interleaved"

    def point(self, *, op: str, shape: str, m: int, n: int, k: int, floor: tuple,
              copies: int, variants: Iterable[Variant]) -> None:
        floor_us, nbytes, flops = floor
        if self.deadline is not None and time.monotonic() > self.deadline:
            # Out of time: the table, JSON and plot still get written for the points measured.
            left = self.report.notes.setdefault("not_measured", [])
            if not left:
                print(f"time budget spent: {op} {shape} M={m} and later points not measured", flush=True)
            left.append(f"{op} {shape} M={m}")
            return
        timed: list[tuple[Variant, list[str]]] = []
        for v in variants:
            if v.skip:
                self.report.skip(op, v.impl, shape, m, v.skip)
            elif self.dry_run and fake_skip(v.impl, f"{op}|{shape}", m, self.fake_seed):
                self.report.skip(op, v.impl, shape, m, "dry run: simulated skip")
            else:
                timed.append((v, [v.note] if v.note else []))
        if self.dry_run:
            timings = [Timing(fake_us(v.impl, f"{op}|{shape}", m, floor_us, self.fake_seed), 0.02,
                              copies, self.replays, "dry-run") for v, _ in timed]
        elif self.timing == "interleaved":
            timings = self._time_interleaved(op, shape, m, timed, copies)
        else:
            if timed:
                self._settle(timed[0][0], copies)
            timings = [self._time(op, shape, m, v, copies, notes) for v, notes in timed]
        for (v, notes), t in zip(timed, timings):
            if t is None:
                continue
            self.report.add(Record(op=op, impl=v.impl, row=v.row, shape=shape, m=m, n=n, k=k,
                                   us=t.us, floor_us=floor_us, bytes=nbytes, flops=flops,
                                   copies=t.copies, replays=t.replays, spread=t.spread,
                                   method=t.method, note="; ".join(notes), end_unix=time.time()))

    def _settle(self, first: Variant, copies: int) -> None:
        """One untimed pass of the point's first variant (it also makes the lazy operand copies);
        its errors are left to the timed pass, which records them."""
        import torch

        try:
            time_graph(first.factory, copies, replays=3, warmup=1)
        except Exception:  # the timed pass reports it
            pass
        finally:
            torch.cuda.empty_cache()

    @staticmethod
    def _skip_reason(exc: Exception) -> str:
        import torch

        if isinstance(exc, torch.cuda.OutOfMemoryError):
            return f"out of memory: {first_line(exc)}"
        return f"{type(exc).__name__}: {first_line(exc)}"  # a peer's own error, never a crash

    def _time(self, op, shape, m, v: Variant, copies: int, notes: list) -> Timing | None:
        import torch

        on_wrong = None if v.strict else (lambda why: notes.append(f"WRONG: {why}"))
        try:
            return time_graph(v.factory, copies, replays=self.replays, check=v.check,
                              on_wrong=on_wrong)
        except Exception as exc:
            self.report.skip(op, v.impl, shape, m, self._skip_reason(exc))
            return None
        finally:
            torch.cuda.empty_cache()

    def _time_interleaved(self, op, shape, m, timed: list[tuple[Variant, list[str]]],
                          copies: int) -> list[Timing | None]:
        """Capture every variant (a failure skips that variant only), then time the captured ones
        together (time_prepared); a failure there skips them all."""
        import torch

        prepared: list[PreparedGraph | None] = []
        for v, notes in timed:
            on_wrong = None if v.strict else (lambda why, notes=notes: notes.append(f"WRONG: {why}"))
            try:
                prepared.append(prepare_graph(v.factory, copies, check=v.check, on_wrong=on_wrong))
            except Exception as exc:
                self.report.skip(op, v.impl, shape, m, self._skip_reason(exc))
                prepared.append(None)
                torch.cuda.empty_cache()
        live = [g for g in prepared if g is not None]
        try:
            timings = iter(time_prepared(live, replays=self.replays) if live else [])
            return [next(timings) if g is not None else None for g in prepared]
        except Exception as exc:
            for (v, _), g in zip(timed, prepared):
                if g is not None:
                    self.report.skip(op, v.impl, shape, m, self._skip_reason(exc))
            return [None] * len(timed)
        finally:
            del live, prepared
            torch.cuda.empty_cache()


def fake_skip(impl: str, shape: str, m: int, seed: int = 0) -> bool:
    """--dry-run skips about one peer point in twelve, to exercise the skip and '-' paths."""
    import zlib

    key = f"{seed}|{impl}|{shape}|{m}|skip".encode()
    return not impl.startswith("ours") and zlib.crc32(key) % 12 == 0


def fake_us(impl: str, shape: str, m: int, floor_us: float, seed: int = 0) -> float:
    """Deterministic fake time for --dry-run: ours 1.05-1.5x the floor, peers 1.4-3.8x."""
    import random
    import zlib

    rng = random.Random(zlib.crc32(f"{seed}|{impl}|{shape}|{m}".encode()))
    lo, hi = (1.05, 1.5) if impl.startswith("ours") else (1.4, 3.8)
    return floor_us * rng.uniform(lo, hi) + 0.5


# --------------------------------------------------------------------------------------------
# Command line shared by the bench scripts
# --------------------------------------------------------------------------------------------


def common_parser(description: str, default_m: Sequence[int]) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=description,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shapes", default="benchmark_set",
                   help="comma-separated shape names, sets (%s) or NxK" % ", ".join(SHAPE_SETS))
    p.add_argument("--m", default=",".join(map(str, default_m)), help="comma-separated M values")
    p.add_argument("--json", type=Path, help="JSON path (default benchmarks/results/<script>.json; "
                   "under --dry-run <tmp>/blockfp8_bench/<script>.dryrun.json)")
    p.add_argument("--plot", type=Path, help="PNG output (default benchmarks/results/<script>.png; "
                   "under --dry-run beside the JSON's default)")
    p.add_argument("--quick", action="store_true", help="few shapes, %d replays" % QUICK_REPLAYS)
    p.add_argument("--replays", type=int, help="timed replays (default %d)" % MIN_REPLAYS)
    p.add_argument("--peers", default="all", help="comma-separated peer names, 'all' or 'none'")
    budget = os.environ.get("BENCH_TIME_BUDGET_S")
    p.add_argument("--time-budget-s", type=float, default=float(budget) if budget else None,
                   help="start no new point after this many seconds; the report lists the rest "
                        "(default: $BENCH_TIME_BUDGET_S, which dev/device/h200_check.sh sets per stage)")
    p.add_argument("--timing", choices=TIMINGS, default=os.environ.get("BENCH_TIMING", TIMINGS[0]),
                   help="interleaved (default): a point's variants captured first, then replayed in "
                        "turns, so that all run under the same clocks (a ratio between them repeats "
                        "about twice as well: gemm/NOTES.md, Measuring); sequential: one "
                        "variant's replays after another's (the method before 2026-12-01); default "
                        "$BENCH_TIMING when set")
    p.add_argument("--dry-run", action="store_true",
                   help="no GPU: fake timings through the table, JSON and plot code")
    return p


def parse_m(spec: str) -> list[int]:
    values = [int(tok) for tok in spec.replace(" ", ",").split(",") if tok]
    if not values or min(values) < 1:
        raise SystemExit(f"--m needs positive integers, got {spec!r}")
    return values


def shape_by_name(name: str) -> shapes.WeightShape:
    """A named layer of the package's shape sets or of the held-out sets."""
    for shape in (s for group in held_out_shapes.SETS.values() for s in group):
        if shape.name == name:
            return shape
    return shapes.by_name(name)  # KeyError when no set has it


def resolve_shapes(spec: str, quick: bool = False) -> list[shapes.WeightShape]:
    if quick and spec == "benchmark_set":
        return [shapes.by_name(name) for name in QUICK_SHAPES]
    out: list[shapes.WeightShape] = []
    for tok in (t.strip() for t in spec.split(",")):
        if not tok:
            continue
        found = SHAPE_SETS.get(tok.lower().replace("-", "_"))
        n_k = tok.lower().split("x")
        try:
            if found is not None:
                picked = list(found)
            elif len(n_k) == 2 and all(v.isdigit() and int(v) > 0 for v in n_k):  # a sweep's "NxK"
                picked = [shapes.WeightShape(tok.lower(), int(n_k[0]), int(n_k[1]))]
            else:
                picked = [shape_by_name(tok)]
        except KeyError:
            raise SystemExit(f"unknown shape or set {tok!r}; sets: {', '.join(SHAPE_SETS)}, or NxK")
        out.extend(s for s in picked if s not in out)
    return out


def replays_for(args) -> int:
    if args.replays is not None:
        return args.replays
    return QUICK_REPLAYS if args.quick else MIN_REPLAYS


def dry_run_dir() -> Path:
    """Where --dry-run writes when no --json / --plot is given: outside the source tree, so that a
    check of the reporting code leaves no untracked files beside the committed results."""
    import tempfile

    return Path(tempfile.gettempdir()) / "blockfp8_bench"


def output_paths(args, script: str) -> tuple[Path, Path]:
    folder, stem = (dry_run_dir(), f"{script}.dryrun") if args.dry_run else (RESULTS_DIR, script)
    return (args.json or folder / f"{stem}.json", args.plot or folder / f"{stem}.png")


def start(script: str, args) -> Runner:
    """Measure (or, under --dry-run, take the published) ceilings and open the report."""
    replays = replays_for(args)
    timing = getattr(args, "timing", TIMINGS[0])
    if timing not in TIMINGS:  # a bad $BENCH_TIMING (argparse checks only the flag's value)
        raise SystemExit(f"timing must be one of {', '.join(TIMINGS)}, got {timing!r}")
    if args.dry_run:
        ceil = PUBLISHED_CEILINGS
    else:
        import torch

        if not torch.cuda.is_available():
            raise SystemExit("no CUDA device: run with --dry-run to check the reporting code")
        print("measuring ceilings ...", flush=True)
        ceil = measure_ceilings(max(replays, 10))
    print(ceil.describe(), flush=True)
    report = Report(script=script, ceilings=ceil, replays=replays, dry_run=args.dry_run,
                    argv=vars(args))
    budget = getattr(args, "time_budget_s", None)
    return Runner(report=report, replays=replays, dry_run=args.dry_run,
                  timing=timing,
                  deadline=None if budget is None else time.monotonic() + budget)


def finish(runner: Runner, args, script: str) -> None:
    json_path, plot_path = output_paths(args, script)
    runner.report.finish(json_path, plot_path)
