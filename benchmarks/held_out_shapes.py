"""Held-out shape sets: layers of other models, never used to fit a rule or a tile row, for
checking the SM90 selection rules fitted on the benchmark set (vllm_blockfp8.shapes.BENCHMARK_SET).

Each set was chosen for one rule (the comment above it) and measured once; a new rule gets a fresh
set, so that no layer both fits a rule and checks it. The benchmarks take these by name
(`--shapes held_out_7`, or a layer's name); the rows table of vllm_blockfp8/csrc/gemm/NOTES.md gives
each rule's held-out result.
"""

from __future__ import annotations

from vllm_blockfp8.shapes import WeightShape

# The first check of rules fitted on the benchmark set (the 64x32 ping-pong row, K slices and
# split-K on the swap-AB rows).
HELD_OUT = (
    WeightShape("dsv3.q_a.1536x7168", 1536, 7168),
    WeightShape("qwen3-30b-a3b.o.2048x4096", 2048, 4096),
    WeightShape("qwen3-30b-a3b.qkv.5120x2048", 5120, 2048),
    WeightShape("qwen3-14b.o.5120x5120", 5120, 5120),
    WeightShape("qwen3-32b.o.5120x8192", 5120, 8192),
    WeightShape("qwen3-32b.qkv.10240x5120", 10240, 5120),
    WeightShape("llama3-70b.o.8192x8192", 8192, 8192),
    WeightShape("llama3-8b.down.4096x14336", 4096, 14336),
)

# For the 64x32 ping-pong row's narrowed rule (fitted on HELD_OUT with the benchmark set).
HELD_OUT_2 = (
    WeightShape("qwen3-4b.qkv.6144x2560", 6144, 2560),
    WeightShape("qwen3-4b.o.2560x4096", 2560, 4096),
    WeightShape("qwen3-4b.down.2560x9728", 2560, 9728),
    WeightShape("mistral-small.o.5120x4096", 5120, 4096),
    WeightShape("gemma3-12b.qkv.8192x3840", 8192, 3840),
    WeightShape("gemma3-12b.o.3840x4096", 3840, 4096),
    WeightShape("llama3.2-3b.qkv.5120x3072", 5120, 3072),
    WeightShape("llama3.2-3b.down.3072x8192", 3072, 8192),
    WeightShape("llama3-8b.gate_up.28672x4096", 28672, 4096),
)

# For the 64x64 ping-pong row's narrowed rule: small models' layers with 2048 < N <= 4224 and K
# below 7168, where that rule applies at M = 96 and 128, and two outside it.
HELD_OUT_3 = (
    WeightShape("llama3.2-1b.qkv.3072x2048", 3072, 2048),
    WeightShape("qwen3-1.7b.qkv.4096x2048", 4096, 2048),
    WeightShape("qwen2.5-3b.qkv.2560x2048", 2560, 2048),
    WeightShape("qwen3-1.7b.o.2048x2048", 2048, 2048),
    WeightShape("phi3-mini.o.3072x3072", 3072, 3072),
    WeightShape("gemma2-2b.o.2304x2048", 2304, 2048),
    WeightShape("gemma2-2b.qkv.4096x2304", 4096, 2304),
    WeightShape("qwen2.5-7b.o.3584x3584", 3584, 3584),
    WeightShape("phi3-mini.down.3072x8192", 3072, 8192),
    WeightShape("qwen2.5-3b.down.2048x11008", 2048, 11008),
)

# For "swap-AB waves <= 128x128 waves": layers whose 128x64 swap tiles at M = 129..192 need two
# waves, as the 128x128 row's do (67..88 weight tiles), with tensor-parallel shards named by their
# degree; the last two need three swap waves against two (controls).
HELD_OUT_4 = (
    WeightShape("phi3-mini.qkv.9216x3072", 9216, 3072),
    WeightShape("yi-34b.qkv.9216x7168", 9216, 7168),
    WeightShape("llama3-70b.qkv.10240x8192", 10240, 8192),
    WeightShape("qwen2.5-0.5b.gate_up.9728x896", 9728, 896),
    WeightShape("qwen3-4b.gate_up.tp2.9728x2560", 9728, 2560),
    WeightShape("qwen3-14b.gate_up.tp4.8704x5120", 8704, 5120),
    WeightShape("qwen2.5-3b.gate_up.tp2.11008x2048", 11008, 2048),
    WeightShape("gemma-7b.qkv.12288x3072", 12288, 3072),
    WeightShape("qwen3-32b.gate_up.tp4.12800x5120", 12800, 5120),
)

# For the 64x32 ping-pong row at M <= 32 past two waves: gate_up layers with more than 264 64-row
# weight tiles (N > 16896), and one with 256.
HELD_OUT_5 = (
    WeightShape("qwen3-4b.gate_up.19456x2560", 19456, 2560),
    WeightShape("qwen3-14b.gate_up.34816x5120", 34816, 5120),
    WeightShape("qwen2.5-7b.gate_up.37888x3584", 37888, 3584),
    WeightShape("gemma2-2b.gate_up.18432x2304", 18432, 2304),
    WeightShape("qwen3-32b.gate_up.tp2.25600x5120", 25600, 5120),
    WeightShape("llama3.2-3b.gate_up.16384x3072", 16384, 3072),
)

# For dropping the "128x64 row unsplit" clause of the 64x64 ping-pong row at M = 65..128: down
# projections whose 64-row tiles fill one wave at two token tiles (64..120 of them) and whose K
# (>= 64 blocks) makes the 128x64 row split.
HELD_OUT_6 = (
    WeightShape("qwen2.5-7b.down.3584x18944", 3584, 18944),
    WeightShape("gemma2-2b.down.2304x9216", 2304, 9216),
    WeightShape("gemma3-4b.down.2560x10240", 2560, 10240),
    WeightShape("llama3.2-1b.down.2048x8192", 2048, 8192),
    WeightShape("gemma-7b.down.3072x24576", 3072, 24576),
    WeightShape("gemma3-12b.down.3840x15360", 3840, 15360),
)

# For the 64x32 row where its tiles need 3 waves and the 128x32 row's 2: gate_up layers with
# 265..396 tiles of 64 rows at one token tile (M <= 32: N = 16960..25344) or at two (M = 33..64:
# N = 8480..12672), and one control of each kind outside the rule (4 waves against 2; 2 against 1).
HELD_OUT_7 = (
    WeightShape("qwen2.5-3b.gate_up.22016x2048", 22016, 2048),
    WeightShape("llama2-7b.gate_up.22016x4096", 22016, 4096),
    WeightShape("qwen2-1.5b.gate_up.17920x1536", 17920, 1536),
    WeightShape("dsv2-lite.gate_up.21888x2048", 21888, 2048),
    WeightShape("qwen2.5-14b.gate_up.27648x5120", 27648, 5120),
    WeightShape("qwen2-7b.gate_up.tp2.9472x3584", 9472, 3584),
    WeightShape("dsv2-lite.gate_up.tp2.10944x2048", 10944, 2048),
    WeightShape("phi3-medium.gate_up.tp4.8960x5120", 8960, 5120),
    WeightShape("qwen2.5-14b.qkv.7168x5120", 7168, 5120),
)

# For the 128x128 row with three 128x64 epilogue buffers at K <= 1536: short-K layers of small
# models and DeepSeek-V3's MLA up-projections under tensor parallelism (kv_b 32768x512 and q_b
# 24576x1536 split by the degree named).
HELD_OUT_8 = (
    WeightShape("dsv3.kv_b.tp8.4096x512", 4096, 512),
    WeightShape("dsv3.kv_b.tp2.16384x512", 16384, 512),
    WeightShape("dsv3.q_b.tp8.3072x1536", 3072, 1536),
    WeightShape("dsv3.q_b.tp4.6144x1536", 6144, 1536),
    WeightShape("qwen2.5-0.5b.gate_up.9728x896", 9728, 896),
    WeightShape("qwen2.5-0.5b.qkv.1152x896", 1152, 896),
    WeightShape("qwen2-1.5b.gate_up.17920x1536", 17920, 1536),
    WeightShape("qwen2-1.5b.qkv.2048x1536", 2048, 1536),
    WeightShape("qwen3-0.6b.qkv.4096x1024", 4096, 1024),
    WeightShape("qwen3-0.6b.gate_up.6144x1024", 6144, 1024),
)

# For the same row at K <= 1024 only: layers with 4-8 K blocks (MoE experts' down projections,
# small encoders, DeepSeek-V3's kv_b at tensor parallel 4).
HELD_OUT_9 = (
    WeightShape("dsv3.kv_b.tp4.8192x512", 8192, 512),
    WeightShape("qwen2.5-0.5b.o.896x896", 896, 896),
    WeightShape("gpt2.qkv.2304x768", 2304, 768),
    WeightShape("gpt2.up.3072x768", 3072, 768),
    WeightShape("bert-large.up.4096x1024", 4096, 1024),
    WeightShape("qwen3-30b-a3b.expert.down.2048x768", 2048, 768),
    WeightShape("olmoe.expert.down.2048x1024", 2048, 1024),
)

# For the issue-ahead 128x128 row below M = 1024 where its tiles exceed one wave: K <= 4096 layers,
# most of them wide enough for 2-12 tiles a CTA at M = 256..896, a few narrow ones as controls (at
# most one tile a CTA there).
HELD_OUT_10 = (
    WeightShape("gemma2-9b.qkv.8192x3584", 8192, 3584),
    WeightShape("gemma2-9b.o.3584x4096", 3584, 4096),
    WeightShape("gemma2-9b.gate_up.28672x3584", 28672, 3584),
    WeightShape("glm4-9b.qkv.4608x4096", 4608, 4096),
    WeightShape("glm4-9b.gate_up.27392x4096", 27392, 4096),
    WeightShape("qwen2.5-7b.qkv.4608x3584", 4608, 3584),
    WeightShape("qwen3-1.7b.gate_up.12288x2048", 12288, 2048),
    WeightShape("llama3.2-1b.gate_up.16384x2048", 16384, 2048),
    WeightShape("gemma3-4b.qkv.4096x2560", 4096, 2560),
    WeightShape("gemma3-4b.gate_up.20480x2560", 20480, 2560),
    WeightShape("olmo2-7b.qkv.12288x4096", 12288, 4096),
    WeightShape("dsv3.q_b.tp2.12288x1536", 12288, 1536),
)

# For the same row from M = 512 (the rule refitted on HELD_OUT_10's run): more K <= 4096 layers,
# with 1.5-23 tiles a CTA at M = 384..832.
HELD_OUT_11 = (
    WeightShape("gemma-2b.gate_up.32768x2048", 32768, 2048),
    WeightShape("gemma-7b.gate_up.49152x3072", 49152, 3072),
    WeightShape("phi2.qkv.7680x2560", 7680, 2560),
    WeightShape("phi2.fc1.10240x2560", 10240, 2560),
    WeightShape("qwen1.5-4b.gate_up.13824x2560", 13824, 2560),
    WeightShape("stablelm2-1.6b.qkv.6144x2048", 6144, 2048),
    WeightShape("stablelm2-1.6b.gate_up.11264x2048", 11264, 2048),
    WeightShape("minicpm-2b.qkv.6912x2304", 6912, 2304),
    WeightShape("minicpm-2b.gate_up.11520x2304", 11520, 2304),
    WeightShape("granite3-8b.gate_up.25600x4096", 25600, 4096),
    WeightShape("falcon3-7b.gate_up.46080x3072", 46080, 3072),
    WeightShape("starcoder2-3b.qkv.3584x3072", 3584, 3072),
)

# For the same row's bound lowered to M = 384: tensor-parallel shards of K <= 4096 layers with
# 1.2-5.8 tiles a CTA at M = 384..511.
HELD_OUT_12 = (
    WeightShape("gemma-7b.gate_up.tp2.24576x3072", 24576, 3072),
    WeightShape("falcon3-7b.gate_up.tp2.23040x3072", 23040, 3072),
    WeightShape("granite3-8b.gate_up.tp2.12800x4096", 12800, 4096),
    WeightShape("gemma2-9b.gate_up.tp2.14336x3584", 14336, 3584),
    WeightShape("glm4-9b.gate_up.tp2.13696x4096", 13696, 4096),
    WeightShape("gemma3-12b.gate_up.tp2.15360x3840", 15360, 3840),
    WeightShape("llama3-8b.gate_up.tp2.14336x4096", 14336, 4096),
    WeightShape("phi2.fc1.tp2.5120x2560", 5120, 2560),
    WeightShape("minicpm-2b.gate_up.tp2.5760x2304", 5760, 2304),
    WeightShape("qwen1.5-4b.gate_up.tp2.6912x2560", 6912, 2560),
    WeightShape("stablelm2-1.6b.gate_up.tp2.5632x2048", 5632, 2048),
)

# For the 128x128 row without a cluster where the 2x1 rows' padding tiles cost a round: K =
# 1024-8960, tensor-parallel shards of 24B-70B models and two small models; at odd token-tile
# counts (M = 384..1408) most of them save a round, two do not.
HELD_OUT_13 = (
    WeightShape("qwen2.5-32b.gate_up.tp4.13824x5120", 13824, 5120),
    WeightShape("qwen2.5-32b.down.tp4.5120x6912", 5120, 6912),
    WeightShape("mistral-small-24b.gate_up.tp4.16384x5120", 16384, 5120),
    WeightShape("yi-34b.gate_up.tp4.10240x7168", 10240, 7168),
    WeightShape("phi3-medium.qkv.7680x5120", 7680, 5120),
    WeightShape("phi3-medium.gate_up.tp2.17920x5120", 17920, 5120),
    WeightShape("phi3-medium.down.tp2.5120x8960", 5120, 8960),
    WeightShape("command-r-35b.gate_up.tp4.11264x8192", 11264, 8192),
    WeightShape("command-r-35b.down.tp4.8192x5632", 8192, 5632),
    WeightShape("llama3.1-70b.gate_up.tp8.7168x8192", 7168, 8192),
    WeightShape("llama3.1-70b.o.tp8.8192x1024", 8192, 1024),
    WeightShape("gemma3-1b.gate_up.13824x1152", 13824, 1152),
    WeightShape("minicpm3-4b.gate_up.12800x2560", 12800, 2560),
)

# For the stream-K row without a cluster at odd token-tile counts (not kept): long-K down
# projections (K = 7168-21504, 56-168 K blocks).
HELD_OUT_14 = (
    WeightShape("gemma2-9b.down.3584x14336", 3584, 14336),
    WeightShape("qwen2.5-14b.down.5120x13824", 5120, 13824),
    WeightShape("yi-34b.down.tp2.7168x10240", 7168, 10240),
    WeightShape("llama3.1-70b.down.tp4.8192x7168", 8192, 7168),
    WeightShape("command-r-35b.down.tp2.8192x11264", 8192, 11264),
    WeightShape("glm4-9b.down.4096x13696", 4096, 13696),
    WeightShape("qwen3-14b.down.tp2.5120x8704", 5120, 8704),
    WeightShape("gemma3-27b.down.5376x21504", 5376, 21504),
    WeightShape("deepseek-v2-lite.down.2048x10944", 2048, 10944),
)

# For the stream-K row without a cluster where only the real tiles' last round is thin: long-K down
# projections (K = 7168-27648, 56-216 K blocks).
HELD_OUT_15 = (
    WeightShape("llama2-7b.down.4096x11008", 4096, 11008),
    WeightShape("gemma2-27b.down.tp2.4608x18432", 4608, 18432),
    WeightShape("qwen3-32b.down.tp2.5120x12800", 5120, 12800),
    WeightShape("phi3-medium.down.5120x17920", 5120, 17920),
    WeightShape("qwen2.5-32b.down.5120x27648", 5120, 27648),
    WeightShape("internlm2-20b.down.tp2.6144x8192", 6144, 8192),
    WeightShape("starcoder2-15b.down.6144x24576", 6144, 24576),
    WeightShape("llama3-70b.down.tp2.8192x14336", 8192, 14336),
    WeightShape("mistral-large2.down.tp4.12288x7168", 12288, 7168),
    WeightShape("command-r-plus.down.tp4.12288x8448", 12288, 8448),
)

# For the 64-token-tile kernel above M = 256 on narrow layers: layers 288-2560 wide (several
# repeat HELD_OUT_3's).
HELD_OUT_16 = (
    WeightShape("qwen2.5-1.5b.o.1536x1536", 1536, 1536),
    WeightShape("qwen2.5-1.5b.down.1536x8960", 1536, 8960),
    WeightShape("qwen3-0.6b.o.1024x2048", 1024, 2048),
    WeightShape("qwen3-0.6b.down.1024x3072", 1024, 3072),
    WeightShape("deepseek-v2-lite.kv_a.576x2048", 576, 2048),
    WeightShape("minicpm3-4b.q_a.768x2560", 768, 2560),
    WeightShape("minicpm3-4b.kv_a.288x2560", 288, 2560),
    WeightShape("qwen3-1.7b.down.2048x6144", 2048, 6144),
    WeightShape("gemma3-1b.down.1152x6912", 1152, 6912),
    WeightShape("smollm2-360m.down.960x2560", 960, 2560),
    WeightShape("qwen2.5-0.5b.down.896x4864", 896, 4864),
    WeightShape("stablelm-3b.down.2560x6912", 2560, 6912),
)


# For the NVFP4 table (csrc/fp4/sm80.cu): the M = 9..16 rule that sends wide (N >= 8192), long-K and short-K layers
# from the GEMV to the wgmma 128x32 row, and that row's M <= 32 bound. Layers on both sides of N = 8192 and K = 12288.
HELD_OUT_17 = (
    WeightShape("mistral-nemo.gate_up.28672x5120", 28672, 5120),
    WeightShape("yi-34b.gate_up.40960x7168", 40960, 7168),
    WeightShape("internlm2-20b.qkv.8192x6144", 8192, 6144),
    WeightShape("gemma2-27b.down.4608x36864", 4608, 36864),
    WeightShape("falcon-7b.qkv.4672x4544", 4672, 4544),
    WeightShape("llama-30b.o.6656x6656", 6656, 6656),
    WeightShape("open-llama-3b.down.3200x8640", 3200, 8640),
)

# For the NVFP4 M = 9..16 rule (the GEMV rows yield to wgmma 128x32 on >= 2^25 weights or K <= 512), fitted on the
# benchmark set and HELD_OUT_17: layers on both sides of 2^25 (33.5M) weights, K > 512.
HELD_OUT_18 = (
    WeightShape("stablelm-zephyr-3b.gate_up.13824x2560", 13824, 2560),
    WeightShape("olmo-1b.gate_up.16384x2048", 16384, 2048),
    WeightShape("falcon-40b.qkv.9216x8192", 9216, 8192),
    WeightShape("baichuan2-13b.qkv.15360x5120", 15360, 5120),
    WeightShape("pythia-2.8b.fc_in.10240x2560", 10240, 2560),
    WeightShape("nemotron-mini-4b.down.3072x9216", 3072, 9216),
    WeightShape("qwen1.5-1.8b.gate_up.11008x2048", 11008, 2048),
    WeightShape("phi-1.5.fc1.8192x2048", 8192, 2048),
)

# For the NVFP4 128x256 wgmma row's K-split rule (partials or a thread-block cluster by modelled time), fitted on the
# benchmark set at M = 256: tensor-parallel shards of large models, N = 1984..8192 (fewer 128-row tiles than SMs, so
# the rule splits K), K = 3584..16384.
HELD_OUT_19 = (
    WeightShape("llama3.1-405b.qkv.tp8.2304x16384", 2304, 16384),
    WeightShape("falcon-180b.qkv.tp8.1984x14848", 1984, 14848),
    WeightShape("qwen2.5-72b.gate_up.tp8.7392x8192", 7392, 8192),
    WeightShape("qwen2.5-72b.qkv.tp4.2560x8192", 2560, 8192),
    WeightShape("llama3.1-70b.qkv.tp2.5120x8192", 5120, 8192),
    WeightShape("mixtral-8x22b.w13.tp4.8192x6144", 8192, 6144),
    WeightShape("dbrx.w13.tp4.5376x6144", 5376, 6144),
    WeightShape("gemma2-27b.qkv.tp2.4096x4608", 4096, 4608),
    WeightShape("yi-34b.o.tp2.7168x3584", 7168, 3584),
)

# For the NVFP4 tile choice at M = 129..511 (the 128x128 row where its cost model beats the 128x256 row's), fitted on
# the benchmark set at M = 192, 256, 384: layers of 24-224 128-row tiles and K = 3072..14336, timed at other M.
HELD_OUT_20 = (
    WeightShape("qwen2.5-14b.gate_up.27648x5120", 27648, 5120),
    WeightShape("qwen2.5-14b.down.5120x13824", 5120, 13824),
    WeightShape("qwen2.5-14b.qkv.7168x5120", 7168, 5120),
    WeightShape("llama3.2-3b.gate_up.16384x3072", 16384, 3072),
    WeightShape("llama3.2-3b.down.3072x8192", 3072, 8192),
    WeightShape("phi3-mini.qkv.9216x3072", 9216, 3072),
    WeightShape("gemma2-9b.gate_up.28672x3584", 28672, 3584),
    WeightShape("mistral-nemo.down.5120x14336", 5120, 14336),
)

# For the NVFP4 128x128 row's cluster-or-partials choice and the tile choice it moves at M = 129..511 (kTok128Costs
# refitted with a cluster term on the 128x128 row forced on the benchmark set at M = 192, 256, 384): 32-192 128-row
# tiles, K = 3072..12800, timed at other M (160, 224, 320, 448).
HELD_OUT_21 = (
    WeightShape("granite3-8b.down.4096x12800", 4096, 12800),
    WeightShape("starcoder2-15b.qkv.7168x6144", 7168, 6144),
    WeightShape("starcoder2-15b.fc.24576x6144", 24576, 6144),
    WeightShape("starcoder2-15b.o.6144x6144", 6144, 6144),
    WeightShape("llama3.1-70b.gate_up.tp4.14336x8192", 14336, 8192),
    WeightShape("gemma2-27b.gate_up.tp4.18432x4608", 18432, 4608),
    WeightShape("gemma2-27b.down.tp4.4608x9216", 4608, 9216),
    WeightShape("mixtral-8x22b.o.tp2.6144x3072", 6144, 3072),
)

# Every held-out set, by the name the benchmarks' --shapes option takes (benchmarks/harness.py).
SETS = {
    "held_out": HELD_OUT,
    "held_out_2": HELD_OUT_2,
    "held_out_3": HELD_OUT_3,
    "held_out_4": HELD_OUT_4,
    "held_out_5": HELD_OUT_5,
    "held_out_6": HELD_OUT_6,
    "held_out_7": HELD_OUT_7,
    "held_out_8": HELD_OUT_8,
    "held_out_9": HELD_OUT_9,
    "held_out_10": HELD_OUT_10,
    "held_out_11": HELD_OUT_11,
    "held_out_12": HELD_OUT_12,
    "held_out_13": HELD_OUT_13,
    "held_out_14": HELD_OUT_14,
    "held_out_15": HELD_OUT_15,
    "held_out_16": HELD_OUT_16,
    "held_out_17": HELD_OUT_17,
    "held_out_18": HELD_OUT_18,
    "held_out_19": HELD_OUT_19,
    "held_out_20": HELD_OUT_20,
    "held_out_21": HELD_OUT_21,
}
