"""Named problem shapes, shared by tests, benchmarks and evals.

A weight shape is (N, K): the linear layer maps K input features to N outputs. M (tokens) is
chosen separately from the M sets below.
"""

from __future__ import annotations

from typing import NamedTuple


class WeightShape(NamedTuple):
    name: str
    n: int
    k: int


# Qwen3-8B (hidden 4096, 32 q heads / 8 kv heads of 128, intermediate 12288), tensor parallel 1.
QWEN3_8B = (
    WeightShape("qwen3-8b.qkv", 6144, 4096),
    WeightShape("qwen3-8b.o", 4096, 4096),
    WeightShape("qwen3-8b.gate_up", 24576, 4096),
    WeightShape("qwen3-8b.down", 4096, 12288),
)

# DeepSeek-V3 dense and attention projections (hidden 7168).
DEEPSEEK_V3 = (
    WeightShape("dsv3.2112x7168", 2112, 7168),
    WeightShape("dsv3.24576x1536", 24576, 1536),
    WeightShape("dsv3.32768x512", 32768, 512),
    WeightShape("dsv3.7168x16384", 7168, 16384),
    WeightShape("dsv3.4096x7168", 4096, 7168),
    WeightShape("dsv3.7168x2048", 7168, 2048),
)

# Shapes measured by the seed experiments (ORT FP8 GEMV on the same H200).
SEEDS = (
    WeightShape("seed.8192x2048", 8192, 2048),
    WeightShape("seed.5120x6144", 5120, 6144),
    WeightShape("seed.6144x5120", 6144, 5120),
    WeightShape("seed.5120x17408", 5120, 17408),
    WeightShape("seed.11008x4096", 11008, 4096),
)

# The set ../shared/BENCHMARKS.md reports peers on.
BENCHMARK_SET = QWEN3_8B + DEEPSEEK_V3 + SEEDS

# Ragged N (not a multiple of 128) and small shapes that exercise edge tiles.
RAGGED = (
    WeightShape("dsv3.kv_a.576x7168", 576, 7168),
    WeightShape("ragged.2112x2048", 2112, 2048),
    WeightShape("ragged.200x384", 200, 384),
)

# K that no kernel supports (not a multiple of 16): must raise a clear error.
UNSUPPORTED_K = WeightShape("bad.1024x3884", 1024, 3884)

# Small shapes for fast correctness tests of every tile row.
SMALL = (
    WeightShape("small.256x512", 256, 512),
    WeightShape("small.384x1024", 384, 1024),
) + RAGGED

# Tensor parallel: one rank's share of the split layers above at tp 2, 4 and 8, named "<layer>.tp<size>".
# Column-parallel layers (QKV, gate_up, DeepSeek-V3's q_b and kv_b, the shared expert's gate_up) keep N / tp
# output rows, row-parallel ones (o, down) K / tp inputs. DeepSeek-V3's fused q_a / kv_a projection
# (dsv3.2112x7168) is replicated, the same on every rank, so it is not here.
TP_SIZES = (2, 4, 8)
_TP_SPLIT = {
    "qwen3-8b.qkv": "column", "qwen3-8b.o": "row", "qwen3-8b.gate_up": "column", "qwen3-8b.down": "row",
    "dsv3.24576x1536": "column", "dsv3.32768x512": "column", "dsv3.7168x16384": "row",
    "dsv3.4096x7168": "column", "dsv3.7168x2048": "row",
}
TP_RANKS = tuple(
    WeightShape(f"{s.name}.tp{tp}", s.n // tp if split == "column" else s.n, s.k // tp if split == "row" else s.k)
    for tp in TP_SIZES for s in QWEN3_8B + DEEPSEEK_V3 if (split := _TP_SPLIT.get(s.name)))

# Narrow layers with long K (N <= ~1.5k, K >= 4k): MLA's kv_a, tensor-parallel shards of QKV and of DeepSeek-V3's
# 4096x7168, Llama-3-70B's QKV shard at tp 8. Few output tiles over a long K leave SMs idle, and the W8A8 GEMM lost
# to cuBLAS bf16 here (gemm/NOTES.md, open leads): the shapes its narrow long-K plan is measured on.
_TP_BY_NAME = {s.name: s for s in TP_RANKS}
NARROW_LONG_K = (RAGGED[0],) + tuple(
    _TP_BY_NAME[name] for name in ("dsv3.4096x7168.tp4", "dsv3.4096x7168.tp8", "qwen3-8b.qkv.tp4", "qwen3-8b.qkv.tp8")
) + (WeightShape("llama3-70b.qkv.tp8", 1280, 8192),)

DECODE_M = (1, 2, 4, 8, 16)
MID_M = (32, 64, 128, 256)
PREFILL_M = (1024, 2048, 4096, 8192)
ADVERSARIAL_M = (1, 7, 83)
QUANT_M = (1, 16, 128, 1024, 2048, 4096, 8192)
# `blockfp8 tune`'s M buckets: decode, speculative decode, mid, prefill. Bucket b serves M above the bucket before
# it up to b (tuning.m_ranges); M past the last keeps the table's choice.
TUNE_M = (1, 4, 8, 16) + (32, 64) + (128, 256, 512) + (1024, 2048, 4096)


# Every named set, by the name the benchmarks' --shapes option takes (benchmarks/harness.py).
SETS = {
    "benchmark_set": BENCHMARK_SET, "qwen3_8b": QWEN3_8B, "deepseek_v3": DEEPSEEK_V3, "seeds": SEEDS,
    "ragged": RAGGED, "small": SMALL, "tp_ranks": TP_RANKS, "narrow_long_k": NARROW_LONG_K,
}


def by_name(name: str) -> WeightShape:
    """Look a shape up by its name across every set in this module."""
    for shape in (UNSUPPORTED_K,) + tuple(s for group in SETS.values() for s in group):
        if shape.name == name:
            return shape
    raise KeyError(f"unknown shape {name!r}")
