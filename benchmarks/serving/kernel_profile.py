"""Per-layer GPU time of a vLLM engine, from the torch-profiler traces `vllm bench --profile` writes.

The issue's rule for an end-to-end miss is a per-layer time breakdown, not a guess. This reads
every Chrome trace (``*.json`` / ``*.json.gz``) under a profiler directory, keeps the GPU kernel
events (``cat`` "kernel"; memcpy/memset too), and sums their durations by kernel name and by
category (which part of a decoder layer the kernel belongs to). Dividing by the tokens the
profiled window processed and by the number of decoder layers gives us per token per layer, the
unit in which kernel benchmarks (bench_gemm, bench_quant) can be set beside it. NVFP4 linears
have categories of their own, so the two NVFP4 variants compare directly: "nvfp4 gemm: blockfp8"
(our W4A16 GEMMs and their split-K reduce), "nvfp4 gemv: blockfp8" (our NVFP4 GEMVs) and
"nvfp4: marlin" (vLLM's Marlin on an e2m1 weight with e4m3 scales, what vllm-nvfp4 runs on the
H200); Marlin on other weight types is "gemm: Marlin (other weight types)".

Kernel time is summed, not wall time: host stalls (a JIT compile, scheduling) do not count, and
kernels that overlap (two streams) count twice. Both are fine for comparing where two engines
spend their GPU time on the same workload. Wall time is reported beside it, per trace file: the
span from the first GPU event to the last, how much of it the GPU was busy, and every idle gap
longer than --stall-ms with the longest CPU op that ran through it (on the H200 this found two
0.65 s Triton attention JIT compiles inside a cold engine's profiled prefill).

usage:  python benchmarks/serving/kernel_profile.py TRACE_DIR [--tokens N] [--layers L] [--stall-ms MS]
        [--json OUT]
"""

from __future__ import annotations

import argparse
import gzip
import json
import re
import sys
from pathlib import Path

# vLLM's Marlin kernel is one template for every weight type, ``marlin::Marlin<a_type, b_type,
# c_type, s_type, threads, ...>`` (``marlin_moe_wna16::Marlin`` for MoE), its first four arguments
# vllm.scalar_type ScalarType ids, which the demangled name prints as longs (``562949953487106l``).
# NVFP4 is b_type float4_e2m1f with s_type float8_e4m3fn (MXFP4 has the same b_type with e8m0 scales).
# Ids as vLLM 0.26 computes them (tests check them against the installed vllm.scalar_type).
SCALAR_TYPE_ID = {"float4_e2m1f": 562949953487106, "float8_e4m3fn": 2814749767172868}
_MARLIN = r"\bmarlin\w*::Marlin<"
_MARLIN_NVFP4 = (_MARLIN + r"[^,]*,\s*(\(long\))?{b}l?,[^,]*,\s*(\(long\))?{s}l?\b").format(
    b=SCALAR_TYPE_ID["float4_e2m1f"], s=SCALAR_TYPE_ID["float8_e4m3fn"])

# (category, pattern) in order, first match wins. NVFP4 kernels come first (our W4A16 GEMM's
# ``w4a16_wgmma_kernel`` would otherwise match the FP8 GEMV's ``mma_kernel``, and Marlin nothing),
# then fused kernels before their parts, our kernels before generic names. The top-kernel list in
# the summary shows what fell where.
CATEGORIES = (
    ("nvfp4 gemm: blockfp8", r"blockfp8::fp4::.*\bw4a16(_wgmma|_reduce)?_kernel"),
    ("nvfp4 gemv: blockfp8", r"blockfp8::fp4::.*\bgemv_(mma|fma)_kernel"),
    ("nvfp4: marlin", _MARLIN_NVFP4),
    ("gemm: Marlin (other weight types)", _MARLIN),
    # Native W4A4 (SM100/SM120): CUTLASS GEMMs on cutlass::float_e2m1_t operands, ours or vLLM's.
    ("nvfp4 gemm: CUTLASS W4A4 (e2m1)", r"(cutlass|gemm).*e2m1"),
    ("norm+quant (fused)", r"rms_norm.*quant|norm.*per_(block|token|group).*quant"),
    ("act+quant (fused)", r"(silu|act).*quant"),
    ("gemm: DeepGEMM", r"deep_gemm"),  # before CUTLASS: its names carry cute/cutlass types
    ("gemm: CUTLASS (blockfp8 W8A8)", r"cutlass|GemmUniversal|blockfp8::gemm"),
    ("gemv: blockfp8", r"blockfp8::gemv|mma_kernel|fma_kernel|mma_lines_kernel"),
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


GAP_BUCKETS_US = (10.0, 100.0, 1e3, 1e4, 1e5)  # idle gaps binned by length: many short or few long


def timeline(events: list[dict], stall_us: float, top_pairs: int = 12) -> dict:
    """GPU busy and idle wall time of one trace, and its idle gaps longer than stall_us, each with
    the longest CPU op that spans part of it (what the host was doing meanwhile). Every idle gap
    is also counted by length (``gap_buckets``) and by the kernels on either side of it
    (``gap_pairs``, the pairs with the most idle time first), which tells per-launch host cost
    (many short gaps after one op) from step boundaries (few long ones)."""
    gpu = sorted((float(e["ts"]), float(e["ts"]) + float(e.get("dur", 0.0)), e.get("name", "?")) for e in events
                 if e.get("ph") == "X" and e.get("cat") in GPU_EVENT_CATS)
    if not gpu:
        return {"span_us": 0.0, "busy_us": 0.0, "idle_us": 0.0, "stalls": [], "gap_buckets": [], "gap_pairs": []}
    busy, gaps = 0.0, []
    start, end, last = gpu[0]
    for s, e, name in gpu[1:]:
        if s > end:
            busy += end - start
            gaps.append((end, s, last, name))
            start, end = s, e
        elif e < end:
            continue
        else:
            end = e
        last = name
    busy += end - start
    span = max(e for _, e, _ in gpu) - gpu[0][0]
    cpu = [e for e in events if e.get("ph") == "X" and e.get("cat") == "cpu_op"]
    stalls = []
    for a, b, _, _ in gaps:
        if b - a <= stall_us:
            continue
        during = [e for e in cpu if float(e["ts"]) < b and float(e["ts"]) + float(e.get("dur", 0.0)) > a]
        op = max(during, key=lambda e: float(e.get("dur", 0.0)), default=None)
        stalls.append({"us": b - a, "at_us": a - gpu[0][0], "cpu_op": op.get("name") if op else None})
    edges = (0.0, *GAP_BUCKETS_US, float("inf"))
    buckets = [{"from_us": lo, "to_us": hi, "gaps": 0, "idle_us": 0.0} for lo, hi in zip(edges, edges[1:])]
    pairs: dict[tuple[str, str], list[float]] = {}
    for a, b, before, after in gaps:
        d = b - a
        slot = next(x for x in buckets if d < x["to_us"])
        slot["gaps"] += 1
        slot["idle_us"] += d
        pair = pairs.setdefault((category(before), category(after)), [0.0, 0])
        pair[0] += d
        pair[1] += 1
    gap_pairs = [{"before": k[0], "after": k[1], "idle_us": v[0], "gaps": v[1]}
                 for k, v in sorted(pairs.items(), key=lambda t: -t[1][0])[:top_pairs]]
    return {"span_us": span, "busy_us": busy, "idle_us": span - busy, "stalls": stalls,
            "gap_buckets": buckets, "gap_pairs": gap_pairs}


def summarize(trace_dir: Path, tokens: int | None = None, layers: int | None = None,
              top: int = 20, stall_ms: float = 100.0) -> dict:
    """Kernel time by category and by name over every trace under trace_dir (all ranks), and
    each trace's GPU wall-time timeline."""
    by_name: dict[str, list[float]] = {}
    files = trace_files(trace_dir)
    timelines = []
    for path in files:
        events = read_events(path)
        timelines.append({"file": path.name, **timeline(events, 1e3 * stall_ms)})
        for ev in events:
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
            "layers": layers, "unit": unit, "categories": rows, "top_kernels": kernels,
            "timelines": timelines}


def markdown(summary: dict) -> str:
    lines = [f"GPU kernel time {summary['kernel_us']:.0f} us over {len(summary['trace_files'])} "
             f"trace file(s); 'per' column in {summary['unit']}", "",
             "| category | us | share | per |", "|---|---|---|---|"]
    lines += [f"| {r['category']} | {r['us']:.0f} | {100 * r['share']:.1f}% | {r['per']:.4g} |"
              for r in summary["categories"]]
    lines += ["", "| trace | GPU span ms | busy ms | idle ms | stalls (ms: CPU op) |", "|---|---|---|---|---|"]
    lines += [f"| {t['file'][:40]} | {t['span_us'] / 1e3:.1f} | {t['busy_us'] / 1e3:.1f} | "
              f"{t['idle_us'] / 1e3:.1f} | "
              + (", ".join(f"{x['us'] / 1e3:.0f}: {x['cpu_op']}" for x in t["stalls"]) or "none") + " |"
              for t in summary.get("timelines", [])]
    for t in summary.get("timelines", []):
        if not t.get("gap_buckets"):
            continue
        lines += ["", f"Idle gaps of {t['file'][:40]} by length:", "",
                  "| gap length us | gaps | idle ms |", "|---|---|---|"]
        lines += [f"| {b['from_us']:.0f}-{b['to_us']:.0f} | {b['gaps']} | {b['idle_us'] / 1e3:.1f} |"
                  for b in t["gap_buckets"] if b["gaps"]]
        lines += ["", "| idle between (before -> after) | gaps | idle ms |", "|---|---|---|"]
        lines += [f"| {p['before']} -> {p['after']} | {p['gaps']} | {p['idle_us'] / 1e3:.1f} |"
                  for p in t["gap_pairs"]]
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
    ap.add_argument("--stall-ms", type=float, default=100.0, help="report GPU idle gaps longer than this")
    ap.add_argument("--json", type=Path, help="write the summary here too")
    a = ap.parse_args()
    s = summarize(a.trace_dir, a.tokens, a.layers, a.top, a.stall_ms)
    if not s["trace_files"]:
        print(f"no trace files under {a.trace_dir}", file=sys.stderr)
        return 1
    if a.json:
        a.json.write_text(json.dumps(s, indent=2))
    print(markdown(s))
    return 0


if __name__ == "__main__":
    sys.exit(main())
