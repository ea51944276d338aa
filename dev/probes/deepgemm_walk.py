"""DeepGEMM's tile choice and its time per K block at mid M (an H200 diagnostic; needs the offline vLLM
bundle built with KEEP_THIRD_PARTY=1, see ../shared/offline-vllm).

Why (gemm/NOTES.md, "The cost model"): at M = 128 DeepGEMM runs 1.27x faster than our 128x64 swap
row, whose K block costs ~490 cycles in its loop and ~500 in TMA ingress at 96 CTAs. Which tiles,
cluster and CTA count give DeepGEMM its time? With DG_PRINT_CONFIGS=1 it prints the configuration it
picks (block M / N, stages, multicast, SMs) for every problem; each point's time is measured as the
benchmarks measure it (CUDA graph over rotating weight copies), and t(K) = fixed + blocks x per_block
is fitted over K as dev/probes/walk_probe.py does for our rows.

  DG_PRINT_CONFIGS=1 python dev/probes/deepgemm_walk.py --m 32,64,128,256 --json deepgemm_walk.json

--once MxNxK[,MxNxK...] instead runs one DeepGEMM launch per problem (after a first call that compiles
it), for Nsight Compute:  ncu --kernel-name regex:fp8_gemm --launch-skip ... (see gemm/NOTES.md).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from benchmarks import harness, peers  # noqa: E402
from vllm_blockfp8 import reference, shapes  # noqa: E402
from dev.probes.walk_probe import fit  # noqa: E402

BLOCK = 128


def time_deepgemm(v, m: int, n: int, k: int, replays: int) -> float:
    g = torch.Generator(device="cuda").manual_seed(m + n + k)
    x = torch.randn(m, k, device="cuda", generator=g).to(torch.bfloat16)
    a, sa = v.quant(x, BLOCK, column_major_scales=True, tma_aligned_scales=True, use_ue8m0=False)
    b, sb = reference.quantize_block_fp8(torch.randn(n, k, device="cuda", generator=g))
    copies = harness.copies_for(n * k)
    weights = [v.deepgemm_weight(b.clone(), sb.clone(), (BLOCK, BLOCK), use_e8m0=False) for _ in range(copies)]
    out = torch.empty((m, n), device="cuda", dtype=torch.bfloat16)

    def factory(i):
        w = weights[i]
        return lambda: v.fp8_gemm_nt((a, sa), w, out, is_deep_gemm_e8m0_used=False)

    print(f"# point m={m} n={n} k={k}", flush=True)
    return harness.time_graph(factory, copies, replays=replays).us


def run_once(v, m: int, n: int, k: int) -> None:
    """Two launches of one problem: the first compiles (DeepGEMM's JIT), the second is the one to profile."""
    x = torch.randn(m, k, device="cuda").to(torch.bfloat16)
    a, sa = v.quant(x, BLOCK, column_major_scales=True, tma_aligned_scales=True, use_ue8m0=False)
    b, sb = reference.quantize_block_fp8(torch.randn(n, k, device="cuda"))
    w = v.deepgemm_weight(b, sb, (BLOCK, BLOCK), use_e8m0=False)
    out = torch.empty((m, n), device="cuda", dtype=torch.bfloat16)
    for _ in range(2):
        v.fp8_gemm_nt((a, sa), w, out, is_deep_gemm_e8m0_used=False)
        torch.cuda.synchronize()
    print(f"deepgemm_walk: ran {m}x{n}x{k} twice", flush=True)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--m", default="32,64,128,256")
    p.add_argument("--walk-m", type=int, default=128)
    p.add_argument("--walk-n", default="2048,4096,6144")
    p.add_argument("--walk-k", default="2048,4096,6144,8192")
    p.add_argument("--replays", type=int, default=200)
    p.add_argument("--json", default="deepgemm_walk.json")
    p.add_argument("--once", default="", help="MxNxK,...: one launch each (for ncu), nothing timed")
    args = p.parse_args()
    v, why = peers.vllm_api()
    if why or not v.deepgemm_ok():
        print(f"DeepGEMM unavailable: {why or 'is_deep_gemm_supported() is False'}")
        return 2
    if args.once:
        for spec in args.once.split(","):
            m, n, k = (int(x) for x in spec.split("x"))
            run_once(v, m, n, k)
        return 0
    meta = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "cuda": torch.version.cuda,
            "vllm": v.version, "git": os.environ.get("BLOCKFP8_GIT_STATE", "unknown")}
    walks, points = [], []

    def save():  # after every result: a call cut short keeps what it measured
        Path(args.json).write_text(json.dumps({"meta": meta, "walks": walks, "points": points}, indent=1))

    for n in [int(x) for x in args.walk_n.split(",")]:
        ks = [int(x) for x in args.walk_k.split(",")]
        us = [time_deepgemm(v, args.walk_m, n, k, args.replays) for k in ks]
        fixed, per_block = fit([k // BLOCK for k in ks], us)
        walks.append({"m": args.walk_m, "n": n, "k": ks, "us": us, "fixed_us": fixed, "per_block_us": per_block})
        print(f"walk m={args.walk_m} n={n}: fixed {fixed:.2f} us, {per_block:.4f} us / K block", flush=True)
        save()
    for m in harness.parse_m(args.m):
        for s in shapes.BENCHMARK_SET:
            us = time_deepgemm(v, m, s.n, s.k, args.replays)
            points.append({"m": m, "shape": s.name, "n": s.n, "k": s.k, "us": us})
            print(f"{s.name:24s} m={m:4d} {us:8.2f} us", flush=True)
            save()
    return 0


if __name__ == "__main__":
    sys.exit(main())
