"""The ``blockfp8`` console script (also ``python -m vllm_blockfp8``).

Subcommands: ``quantize`` (write a block FP8 / NVFP4 checkpoint), ``info`` (versions, GPU, compiled
kernels, tile tables, rows in force), ``bench`` (the repository's benchmark scripts), ``tune`` (measure a model's
layers and write the rows that beat the tables), ``demo`` (end-to-end demo).
Heavy imports (torch, vLLM) happen inside the subcommands so ``--help`` stays instant.
Exit status: 0 success, 2 refused (bad input, nothing written), 130 interrupted.
"""

from __future__ import annotations

import argparse
import importlib
import signal
import sys
import threading
from pathlib import Path

QUANT_FORMATS = ("fp8-block", "nvfp4")
# --op -> (script stem in benchmarks/, its fixed arguments); bench_gemm times the GEMM alone and the
# full linear (activation quantization included).
BENCH_RUNS = {"gemv": ("bench_gemv", ()), "gemm": ("bench_gemm", ("--ops", "gemm")),
              "linear": ("bench_gemm", ("--ops", "linear")), "quant": ("bench_quant", ()),
              "nvfp4": ("bench_nvfp4", ())}
# Without --op: every script once, bench_gemm with its default (GEMM and full linear).
BENCH_ALL = (("gemv", "bench_gemv", ()), ("gemm", "bench_gemm", ()), ("quant", "bench_quant", ()),
             ("nvfp4", "bench_nvfp4", ()))


class CliError(Exception):
    """A refusal the CLI prints as one line and exits 2 on."""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="blockfp8", description="vllm_blockfp8: block-scaled FP8 / NVFP4 "
                                     "checkpoints and kernels for vLLM (vllm serve MODEL --quantization blockfp8)")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    q = sub.add_parser("quantize", help="quantize a BF16/FP16 Hugging Face checkpoint",
                       description="Quantize the decoder-layer linear weights (*_proj, experts) of a BF16/FP16 "
                       "safetensors checkpoint. DST loads in vLLM with --quantization blockfp8, and with vLLM's "
                       "own fp8 (fp8-block) or modelopt_fp4 (nvfp4). Writes DST/quantization_report.json.")
    q.add_argument("src", type=Path, metavar="SRC", help="Hugging Face model directory (safetensors)")
    q.add_argument("dst", type=Path, metavar="DST", help="output directory (created atomically)")
    q.add_argument("--format", dest="fmt", choices=QUANT_FORMATS, default="fp8-block",
                   help="fp8-block: e4m3 weights, one fp32 scale per 128x128 block (default); nvfp4: ModelOpt "
                   "NVFP4, e2m1 weights, e4m3 scale per 16 values, fp32 global scale")
    q.add_argument("--ignore", action="extend", nargs="+", default=[], metavar="PATTERN",
                   help="keep modules matching these fnmatch patterns in 16-bit (e.g. 'model.layers.0.*')")
    q.add_argument("--overwrite", action="store_true", help="replace an existing non-empty DST")
    q.add_argument("--no-progress", dest="progress", action="store_false", help="no progress bar on stderr")
    q.set_defaults(func=_cmd_quantize)

    i = sub.add_parser("info", help="versions, GPU, compiled kernels and tile tables",
                       description="Show package/vLLM/torch versions, the GPU and its compute capability, which "
                       "kernel families were compiled for which archs, and each family's tile table.")
    i.add_argument("--json", action="store_true", help="print JSON instead of text")
    i.set_defaults(func=_cmd_info)

    b = sub.add_parser("bench", help="run the benchmark scripts (source checkout with a GPU)",
                       description="Run the benchmarks/bench_*.py scripts of the source checkout. Arguments "
                       "after '--' go to the script unchanged (e.g. -- --rows --peers none).")
    b.add_argument("--op", choices=tuple(BENCH_RUNS), default=None,
                   help="gemv: decode full linear; gemm: W8A8 GEMM alone; linear: full linear at mid/prefill M; "
                   "quant: activation quantizer; nvfp4: NVFP4 weight-only linear, decode to prefill M, beside vLLM's "
                   "Marlin FP4, cuBLAS bf16 and our FP8 (default: every script, gemm with linear)")
    b.add_argument("--shapes", nargs="+", metavar="SHAPE", help="shape names or sets (vllm_blockfp8.shapes)")
    b.add_argument("--m", nargs="+", type=int, metavar="M", help="token counts")
    b.add_argument("--json", metavar="F", help="write results as JSON (suffixed by op when several run)")
    b.add_argument("--plot", metavar="F", help="write a plot (suffixed by op when several run)")
    b.add_argument("--quick", action="store_true", help="fewer shapes and replays")
    b.add_argument("--dry-run", action="store_true", help="no GPU needed: fake timings through the table, "
                   "JSON and plot code")
    b.set_defaults(func=_cmd_bench)

    t = sub.add_parser("tune", help="time every kernel row on a model's layer shapes; write the winners",
                       description="For each distinct (N, K) of MODEL_DIR's block-FP8 or NVFP4 linear layers and "
                       "each M bucket, time every row of the family that serves that M (CUDA graphs, rotating "
                       "weight copies) and write the rows that beat the table's choice by >= 3% to "
                       "MODEL_DIR/blockfp8_tuned.json, which `vllm serve` then loads (this GPU, driver, CUDA and "
                       "build only). Needs a GPU with the compiled kernels, except --dry-run.")
    t.add_argument("model_dir", type=Path, metavar="MODEL_DIR", help="the quantized checkpoint's directory")
    t.add_argument("--out", type=Path, default=None, help="where to write (default MODEL_DIR/blockfp8_tuned.json)")
    t.add_argument("--m", default=None, metavar="M,M,...", help="M buckets (default: vllm_blockfp8.shapes.TUNE_M)")
    t.add_argument("--dry-run", action="store_true", help="no GPU needed: fake rows and timings through the loop "
                   "and the writer (the file it writes matches no machine, so it is never applied)")
    t.add_argument("--no-progress", dest="progress", action="store_false", help="no progress lines on stderr")
    t.set_defaults(func=_cmd_tune)

    d = sub.add_parser("demo", help="end-to-end demo (vllm_blockfp8.demo)",
                       description="Run the end-to-end demo in vllm_blockfp8.demo.")
    d.add_argument("--model-dir", type=Path, default=None, help="where the demo model lives (default: a temp dir)")
    d.add_argument("--keep", action="store_true", help="keep the files the demo writes")
    d.add_argument("--format", choices=("fp8-block", "nvfp4"), default="fp8-block",
                   help="checkpoint format of the demo model (default fp8-block; nvfp4: ModelOpt NVFP4, W4A16 kernels)")
    d.add_argument("--max-tokens", type=int, default=32, help="tokens to generate (default 32)")
    d.add_argument("--attention-backend", default=None, metavar="NAME",
                   help="vLLM attention backend, e.g. TRITON_ATTN where vLLM's FlashAttention build is missing "
                        "(default: vLLM's choice)")
    d.add_argument("--logprobs", type=int, default=0, metavar="N",
                   help="also print, per prompt, the top-N log-probabilities at every prompt position and "
                        "generated step as one JSON line (default 0: none)")
    d.add_argument("--enforce-eager", action="store_true",
                   help="no torch.compile and CUDA graphs (vLLM's enforce_eager): a faster start")
    d.set_defaults(func=_cmd_demo)
    return parser


def _raise_interrupt(signum, frame):
    raise KeyboardInterrupt(f"signal {signum}")


def _cmd_quantize(args, extra) -> int:
    from vllm_blockfp8.tools.paths import CheckpointError, check_destination, check_source

    try:  # a bad path is refused at once, before torch is imported
        check_source(args.src)
        check_destination(args.src.resolve(), args.dst.resolve(), args.overwrite)
    except CheckpointError as e:
        raise CliError(str(e)) from None
    from vllm_blockfp8.tools.quantize import REPORT_NAME, format_report, quantize_checkpoint

    # SIGTERM (a job scheduler, `kill`) unwinds like Ctrl-C so the temporary directory is removed.
    main_thread = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGTERM, _raise_interrupt) if main_thread else None
    try:
        report = quantize_checkpoint(args.src, args.dst, fmt=args.fmt, ignore=args.ignore,
                                     overwrite=args.overwrite, progress=args.progress)
    except CheckpointError as e:
        raise CliError(str(e)) from None
    except OSError as e:  # disk full, permissions: the temporary directory is already gone
        raise CliError(f"{e} (nothing was written to {args.dst})") from None
    finally:
        if main_thread:
            signal.signal(signal.SIGTERM, previous)
    print(format_report(report))
    print(f"wrote {args.dst} ({REPORT_NAME} has every tensor's error)")
    return 0


def _cmd_info(args, extra) -> int:
    from vllm_blockfp8.tools import info

    return info.main(as_json=args.json)


def benchmarks_dir() -> Path:
    """benchmarks/ of the source checkout this package was imported from (absent in a wheel)."""
    return Path(__file__).resolve().parents[1] / "benchmarks"


def _suffixed(path: str, op: str) -> str:
    p = Path(path)
    return str(p.with_name(f"{p.stem}.{op}{p.suffix}"))


def _bench_argv(args, extra, fixed, op_suffix) -> list:
    """The script's own flags (harness.common_parser: comma-separated --shapes and --m)."""
    argv = list(fixed)
    if args.shapes:
        argv += ["--shapes", ",".join(args.shapes)]
    if args.m:
        argv += ["--m", ",".join(map(str, args.m))]
    for flag, value in (("--json", args.json), ("--plot", args.plot)):
        if value:
            argv += [flag, _suffixed(value, op_suffix) if op_suffix else value]
    argv += [flag for flag, on in (("--quick", args.quick), ("--dry-run", args.dry_run)) if on]
    return argv + list(extra)


def _run_script(root: Path, stem: str, argv: list) -> int:
    # The scripts are modules of the `benchmarks` package (relative imports of harness, peers).
    sys.path.insert(0, str(root.parent))
    try:
        module = importlib.import_module(f"benchmarks.{stem}")
        if Path(module.__file__).resolve().parent != root:
            raise CliError(f"`benchmarks` resolves to {module.__file__}, not {root}")
        return int(module.main(argv) or 0)
    finally:
        sys.path.remove(str(root.parent))


def _cmd_bench(args, extra) -> int:
    root = benchmarks_dir()
    if not root.is_dir():
        raise CliError(f"no benchmarks/ directory at {root}: `blockfp8 bench` runs from a source checkout "
                       "(git clone, then pip install -e .), not from an installed wheel")
    if not args.dry_run:
        import torch

        if not torch.cuda.is_available():
            raise CliError("no CUDA GPU: the benchmarks time GPU kernels (--dry-run fakes the timings; "
                           "blockfp8 info shows what is visible)")
    runs = [(args.op, *BENCH_RUNS[args.op])] if args.op else [
        r for r in BENCH_ALL if (root / f"{r[1]}.py").is_file()]
    if not runs:
        raise CliError(f"no bench_*.py scripts in {root}")
    for op, stem, fixed in runs:
        if not (root / f"{stem}.py").is_file():
            raise CliError(f"{root / stem}.py not found")
        rc = _run_script(root, stem, _bench_argv(args, extra, fixed, op if len(runs) > 1 else None))
        if rc:
            return rc
    return 0


def _cmd_tune(args, extra) -> int:
    from vllm_blockfp8 import shapes
    from vllm_blockfp8.tools import tune
    from vllm_blockfp8.tools.paths import CheckpointError

    try:
        buckets = tune.parse_buckets(args.m) if args.m else shapes.TUNE_M
    except ValueError as e:
        raise CliError(str(e)) from None
    try:
        doc = tune.main(args.model_dir, args.out, args.dry_run, buckets, show_progress=args.progress)
    except CheckpointError as e:
        raise CliError(str(e)) from None
    print(f"wrote {doc['path']}: {len(doc['measurements'])} points measured, {len(doc['overrides'])} override(s) "
          f"with >= {doc['min_gain']:.0%} gain")
    for o in doc["overrides"]:
        print(f"  {o['family']:<6} N={o['n']} K={o['k']} M={o['m_min']}..{o['m_max']}: {o['row']} (+{o['gain']:.1%})")
    return 0


def _cmd_demo(args, extra) -> int:
    if args.logprobs < 0:
        raise CliError(f"--logprobs must be >= 0, got {args.logprobs}")
    from vllm_blockfp8 import demo

    return int(demo.main(args) or 0)


def main(argv=None) -> int:
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    if extra and args.command != "bench":
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    if extra and extra[0] == "--":
        extra = extra[1:]
    try:
        return args.func(args, extra)
    except KeyboardInterrupt:
        print(f"blockfp8 {args.command}: interrupted", file=sys.stderr)
        return 130
    except CliError as e:
        print(f"blockfp8 {args.command}: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
