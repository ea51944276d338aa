"""Per-layer GPU time of a vLLM engine, from the torch-profiler traces `vllm bench --profile` writes.

The issue's rule for an end-to-end miss is a per-layer time breakdown, not a guess. This reads
every Chrome trace (``*.json`` / ``*.json.gz``) under a profiler directory, keeps the GPU kernel
events (``cat`` "kernel"; memcpy/memset too), and sums their durations by kernel name and by
category (which part of a decoder layer the kernel belongs to). Dividing by the tokens the
profiled window processed and by the number of decoder layers gives us per token per layer, the
unit in which kernel benchmarks (bench_gemm, bench_quant) can be set beside it.

Kernel time is summed, not wall time: host stalls (a JIT compile, scheduling) do not count, and
kernels that overlap (two streams) count twice. Both are fine for comparing where two engines
spend their GPU time on the same workload.

usage:  python benchmarks/serving/kernel_profile.py TRACE_DIR [--tokens N] [--layers L] [--json OUT]
"""

from __future__ import annotations

import argparse
import gzip
import json
import re
import sys
from pathlib import Path

# (category, pattern) in order, first match wins. Fused kernels come before their parts, our
# kernels before generic names. The top-kernel list in the summary shows what fell where.
CATEGORIES = (
    ("norm+quant (fused)", r"rms_norm.*quant|norm.*per_(block|token|group).*quant"),
    ("act+quant (fused)", r"(silu|act).*quant"),
    ("gemm: CUTLASS (blockfp8 W8A8)", r"cutlass|GemmUniversal|blockfp8::gemm"),
    ("gemv: blockfp8", r"blockfp8::gemv|mma_kernel|fma_kernel"),
    ("gemm: DeepGEMM", r"deep_gemm|fp8_gemm|sm90_fp8"),
    ("quant: activation", r"per_token_group|quant"),
    ("gemm: cuBLAS", r"nvjet|xmma|cublas|gemm|gemv"),
    ("attention", r"attn|attention|flash|paged"),
    ("norm", r"norm"),
    ("act", r"silu|gelu|act_and_mul"),
    ("rope / kv-cache", r"rotary|rope|reshape_and_cache|cache"),
    ("memcpy / memset", r"^Memcpy|^Memset|memcpy|memset"),
)
_COMPILED = tuple((name, re.compile(p, re.IGNORECASE)) for name, p in CATEGORIES)
GPU_EVENT_CATS = {"kernel", "gpu_memcpy", "gpu_memset"}


def category(kernel: str) -> str:
    for name, pattern in _COMPILED:
        if pattern.search(kernel):
            return name
    return "other"


def read_events(path: Path) -> list[dict]:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt") as f:
        data = json.load(f)
    return data.get("traceEvents", []) if isinstance(data, dict) else data


def trace_files(trace_dir: Path) -> list[Path]:
    return sorted(p for p in trace_dir.rglob("*") if p.is_file() and p.name.endswith((".json", ".json.gz")))


def summarize(trace_dir: Path, tokens: int | None = None, layers: int | None = None,
              top: int = 20) -> dict:
    """Kernel time by category and by name over every trace under trace_dir (all ranks)."""
    by_name: dict[str, list[float]] = {}
    files = trace_files(trace_dir)
    for path in files:
        for ev in read_events(path):
            if ev.get("ph") != "X" or ev.get("cat") not in GPU_EVENT_CATS:
                continue
            slot = by_name.setdefault(ev.get("name", "?"), [0.0, 0])
            slot[0] += float(ev.get("dur", 0.0))  # microseconds in Chrome traces
            slot[1] += 1
    total = sum(us for us, _ in by_name.values())
    cats: dict[str, float] = {}
    for name, (us, _) in by_name.items():
        c = category(name)
        cats[c] = cats.get(c, 0.0) + us
    per = 1.0
    unit = "us"
    if tokens:
        per *= tokens
        unit = "us per token"
        if layers:
            per *= layers
            unit = "us per token per layer"
    rows = [{"category": c, "us": us, "share": us / total if total else 0.0, "per": us / per}
            for c, us in sorted(cats.items(), key=lambda t: -t[1])]
    kernels = [{"name": n[:160], "category": category(n), "us": us, "calls": calls,
                "share": us / total if total else 0.0}
               for n, (us, calls) in sorted(by_name.items(), key=lambda t: -t[1][0])[:top]]
    return {"trace_files": [str(p) for p in files], "kernel_us": total, "tokens": tokens,
            "layers": layers, "unit": unit, "categories": rows, "top_kernels": kernels}


def markdown(summary: dict) -> str:
    lines = [f"GPU kernel time {summary['kernel_us']:.0f} us over {len(summary['trace_files'])} "
             f"trace file(s); 'per' column in {summary['unit']}", "",
             "| category | us | share | per |", "|---|---|---|---|"]
    lines += [f"| {r['category']} | {r['us']:.0f} | {100 * r['share']:.1f}% | {r['per']:.4g} |"
              for r in summary["categories"]]
    lines += ["", "| kernel | category | us | calls | share |", "|---|---|---|---|---|"]
    lines += [f"| `{k['name'][:90]}` | {k['category']} | {k['us']:.0f} | {k['calls']} | "
              f"{100 * k['share']:.1f}% |" for k in summary["top_kernels"]]
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("trace_dir", type=Path)
    ap.add_argument("--tokens", type=int, help="tokens the profiled window processed")
    ap.add_argument("--layers", type=int, help="decoder layers (with --tokens: per token per layer)")
    ap.add_argument("--top", type=int, default=20)
    ap.add_argument("--json", type=Path, help="write the summary here too")
    a = ap.parse_args()
    s = summarize(a.trace_dir, a.tokens, a.layers, a.top)
    if not s["trace_files"]:
        print(f"no trace files under {a.trace_dir}", file=sys.stderr)
        return 1
    if a.json:
        a.json.write_text(json.dumps(s, indent=2))
    print(markdown(s))
    return 0


if __name__ == "__main__":
    sys.exit(main())
