"""Weight loading through vLLM's real linear layers with simulated tensor-parallel ranks.

Each checkpoint tensor is quantized once (full size); every rank of tp 1, 2, 4 and 8 loads it
through the parameter's own weight_loader into ColumnParallelLinear, MergedColumnParallelLinear
(gate_up), QKVParallelLinear (K/V heads replicated from tp 4 on) and RowParallelLinear, and must
hold exactly the slice of every tensor that we cut ourselves (bit for bit). The loaded layer then
runs on CPU against the float64 product of the full dequantized checkpoint restricted to the rank's
rows (column-parallel) or to its K columns (row-parallel: the rank's partial sum).

The checks are written once for any format (``Format``); this file runs them for block FP8 and
test_loading_nvfp4.py for ModelOpt NVFP4.
"""

from __future__ import annotations

import re

import pytest
import torch
from conftest import cpu_layers, simulate_tp

from vllm_blockfp8 import reference, shapes
from vllm_blockfp8.config import BlockFp8Config

pytestmark = pytest.mark.usefixtures("vllm_dist")

B = 128
HIDDEN = 320  # K of the column layers: not a multiple of 128, so FP8's last scale column is ragged
Q_HEADS, KV_HEADS = 8, 2  # K/V heads are replicated from tp 4 on
TPS = tuple((tp, rank) for tp in (1, 2, 4, 8) for rank in range(tp))
KINDS = ("column", "merged", "qkv", "row")
PREFIX = {"column": "model.layers.0.mlp.proj", "merged": "model.layers.0.mlp.gate_up_proj",
          "qkv": "model.layers.0.self_attn.qkv_proj", "row": "model.layers.0.mlp.down_proj"}


def _layers():
    from vllm.model_executor.layers.linear import (ColumnParallelLinear, MergedColumnParallelLinear,
                                                   QKVParallelLinear, RowParallelLinear)
    return ColumnParallelLinear, MergedColumnParallelLinear, QKVParallelLinear, RowParallelLinear


def assert_bits_equal(got: torch.Tensor, want: torch.Tensor, what: str) -> None:
    assert got.dtype == want.dtype and got.shape == want.shape, \
        f"{what}: {got.dtype} {tuple(got.shape)} != expected {want.dtype} {tuple(want.shape)}"
    bad = reference.first_mismatch(got, want)
    assert bad is None, f"{what}: first mismatching element at {bad}"


class Format:
    """One checkpoint format as the checks see it: a checkpoint is a dict of the tensors vLLM loads
    into the layer's parameters of the same names. ``per_shard`` names the per-tensor (0-dim)
    scales, one per fused shard; every other tensor has one row per output row or block row."""

    per_shard: tuple = ()
    # Layer sizes (N of the column layers, head size, the row layer's K and N); every per-rank size
    # up to tp 8 must be loadable.
    column_n = gate_up = head = row_in = row_out = 0

    def config(self) -> BlockFp8Config:
        raise NotImplementedError

    def quantize(self, w: torch.Tensor, gen: torch.Generator) -> dict:
        raise NotImplementedError

    def dequantize(self, ckpt: dict) -> torch.Tensor:
        """The full weight [N, K] in float64."""
        raise NotImplementedError

    def rows(self, ckpt: dict, start: int, size: int) -> dict:
        """What a rank holding output rows start .. start + size holds of the checkpoint."""
        raise NotImplementedError

    def cols(self, ckpt: dict, start: int, size: int) -> dict:
        """What a rank holding input columns start .. start + size holds of the checkpoint."""
        raise NotImplementedError

    def processed(self, loaded: dict, widths: list) -> dict:
        """The layer's tensors after process_weights_after_loading, from the loaded ones."""
        raise NotImplementedError

    def stored(self, layer, name: str) -> torch.Tensor:
        """The processed layer's tensor ``name`` in the form ``processed`` states it (a format that repacks a
        tensor at load undoes that here)."""
        return getattr(layer, name).data


class Fp8Format(Format):
    column_n = gate_up = row_in = 8 * B  # 128 rows / K columns per rank at tp 8
    head, row_out = B, 192  # the row layer's N is ragged: 2 scale rows

    def config(self):
        return BlockFp8Config()

    def quantize(self, w, gen):
        q, s = reference.quantize_block_fp8(w)
        return {"weight": q, "weight_scale_inv": s}

    def dequantize(self, ckpt):
        return reference.dequantize_block_fp8(ckpt["weight"], ckpt["weight_scale_inv"]).double()

    def rows(self, ckpt, start, size):
        return {"weight": ckpt["weight"][start:start + size],
                "weight_scale_inv": ckpt["weight_scale_inv"][start // B:-(-(start + size) // B)]}

    def cols(self, ckpt, start, size):
        return {"weight": ckpt["weight"][:, start:start + size],
                "weight_scale_inv": ckpt["weight_scale_inv"][:, start // B:-(-(start + size) // B)]}

    def processed(self, loaded, widths):
        return loaded


FP8 = Fp8Format()


def checkpoint(fmt: Format, n: int, k: int, gen: torch.Generator, mag: float = 1.0) -> dict:
    """A full-size checkpoint tensor set: columns of different magnitudes, overall scale ``mag``."""
    w = torch.randn(n, k, generator=gen) * torch.exp(torch.randn(1, k, generator=gen)) * mag
    return fmt.quantize(w.to(torch.bfloat16), gen)


def fuse(parts: list) -> dict:
    """The fused layer's tensors from its shards': rows concatenated, per-shard scales stacked."""
    return {name: torch.stack([p[name] for p in parts]) if parts[0][name].dim() == 0
            else torch.cat([p[name] for p in parts]) for name in parts[0]}


def load(layer, ckpt: dict, shard_id=None) -> None:
    for name, tensor in ckpt.items():
        param = getattr(layer, name)
        param.weight_loader(param, tensor, *(() if shard_id is None else (shard_id,)))


def _build(cls, rank, tp, quant_config, prefix, *args, **kwargs):
    with simulate_tp(rank, tp), cpu_layers():
        layer = cls(*args, quant_config=quant_config, prefix=prefix, params_dtype=torch.bfloat16, **kwargs)
    assert layer.tp_rank == rank and layer.tp_size == tp
    assert all(getattr(p, "tp_rank", rank) == rank for p in layer.parameters())
    return layer


def check_layer(fmt: Format, layer, want: dict, dense: torch.Tensor, x: torch.Tensor, bias=None) -> None:
    """The loaded layer holds ``want`` bit for bit, before and after processing, and apply() on CPU
    matches x @ dense^T (+ bias) in float64: ``dense`` is the rank's part of the full dequantized
    weight, and x the rank's activations."""
    for name, tensor in want.items():
        assert_bits_equal(getattr(layer, name).data, tensor, f"{layer.prefix} {name}")
    layer.quant_method.process_weights_after_loading(layer)
    for name, tensor in fmt.processed(want, layer.logical_widths).items():
        assert_bits_equal(fmt.stored(layer, name), tensor, f"{layer.prefix} processed {name}")
    out = layer.quant_method.apply(layer, x, bias)
    assert out.dtype == torch.bfloat16
    ref = x.double() @ dense.t() + (0 if bias is None else bias.double())
    reference.assert_close_to_ref(out, ref, f"{layer.prefix} apply")


def check_column_shards(fmt: Format, layer, shards: list, gen, bias=None) -> None:
    """``shards``: (shard id or None, full checkpoint, the rank's first row of it, rows) in the
    layer's order. They load out of order: each must land at its own offset."""
    for shard_id, ckpt, _, _ in reversed(shards):
        load(layer, ckpt, shard_id)
    want = fuse([fmt.rows(ckpt, start, size) for _, ckpt, start, size in shards])
    for name in fmt.per_shard:  # each shard keeps its own scale: the test would miss a mix-up
        assert want[name].unique().numel() == len(shards), f"{name}: shards share a value"
    dense = torch.cat([fmt.dequantize(ckpt)[start:start + size] for _, ckpt, start, size in shards])
    x = torch.randn(5, layer.input_size_per_partition, generator=gen).to(torch.bfloat16)
    check_layer(fmt, layer, want, dense, x, bias)


def check_tensor_parallel(fmt: Format, kind: str, tp: int, rank: int, gen) -> None:
    column, merged, qkv, row = _layers()
    config, prefix = fmt.config(), PREFIX[kind]
    if kind == "column":
        n = fmt.column_n
        ckpt, bias = checkpoint(fmt, n, HIDDEN, gen), torch.randn(n, generator=gen).to(torch.bfloat16)
        layer = _build(column, rank, tp, config, prefix, HIDDEN, n, bias=True)
        layer.bias.weight_loader(layer.bias, bias)
        size = n // tp
        assert torch.equal(layer.bias.data, bias[rank * size:(rank + 1) * size])
        check_column_shards(fmt, layer, [(None, ckpt, rank * size, size)], gen, layer.bias)
    elif kind == "merged":  # gate and up: magnitudes 8x apart
        n = fmt.gate_up
        layer = _build(merged, rank, tp, config, prefix, HIDDEN, [n, n], bias=False)
        check_column_shards(fmt, layer, [(i, checkpoint(fmt, n, HIDDEN, gen, mag), rank * n // tp, n // tp)
                                         for i, mag in enumerate((1.0, 8.0))], gen)
    elif kind == "qkv":  # rank r holds q heads r * q_per_rank.. and K/V head r // replicas
        layer = _build(qkv, rank, tp, config, prefix, HIDDEN, fmt.head, Q_HEADS, KV_HEADS, bias=False)
        q_rows, kv_rows = Q_HEADS // tp * fmt.head, max(KV_HEADS // tp, 1) * fmt.head
        kv_rank = rank // max(tp // KV_HEADS, 1)
        check_column_shards(fmt, layer, [
            ("q", checkpoint(fmt, Q_HEADS * fmt.head, HIDDEN, gen, 1.0), rank * q_rows, q_rows),
            ("k", checkpoint(fmt, KV_HEADS * fmt.head, HIDDEN, gen, 4.0), kv_rank * kv_rows, kv_rows),
            ("v", checkpoint(fmt, KV_HEADS * fmt.head, HIDDEN, gen, 0.25), kv_rank * kv_rows, kv_rows)], gen)
    else:  # row-parallel: rank r holds K columns r * K/tp.. and computes their partial sum
        k, n = fmt.row_in, fmt.row_out
        ckpt = checkpoint(fmt, n, k, gen)
        layer = _build(row, rank, tp, config, prefix, k, n, bias=False)
        load(layer, ckpt)
        size = k // tp
        cols = slice(rank * size, (rank + 1) * size)
        x = torch.randn(5, k, generator=gen).to(torch.bfloat16)
        check_layer(fmt, layer, fuse([fmt.cols(ckpt, cols.start, size)]), fmt.dequantize(ckpt)[:, cols],
                    x[:, cols])


@pytest.mark.parametrize("tp,rank", TPS)
@pytest.mark.parametrize("kind", KINDS)
def test_fp8_tensor_parallel(kind, tp, rank, seeded):
    check_tensor_parallel(FP8, kind, tp, rank, seeded)


FP8_FIX = ("use a tensor-parallel size that keeps every shard a multiple of 128, or requantize the checkpoint "
           "with `blockfp8 quantize` so each projection's size is a multiple of 128")

# Splits that would cut a 128x128 scale block between ranks: (layer kind, tp, the layer's arguments,
# the per-rank size the message names).
REFUSED_FP8_SPLITS = {
    "column-tp2": ("column", 2, (256, 192), "N = 96"),  # half a scale block a rank
    "column-tp8": ("column", 8, (256, 512), "N = 64"),
    "merged-tp2": ("merged", 2, (256, [384, 384]), "N = 192"),  # rank 1's slice would start mid-block
    "qkv-tp2": ("qkv", 2, (256, 64, 4, 2), "N = 64"),  # heads of 64: one K/V head a rank
    "ragged-qkv-tp3": ("qkv", 3, (576, 64, 9, 3), "N = 192"),  # SmolLM2-135M's attention (tp 1 loads it)
    "row-tp2": ("row", 2, (384, 256), "K = 192"),
    "row-tp4": ("row", 4, (320, 256), "K = 80"),
    "row-tp8": ("row", 8, (512, 256), "K = 64"),
}


def build_refused(fmt: Format, kind: str, tp: int, args: tuple, prefix: str):
    """Build rank tp - 1 of the layer, which must refuse; returns the message as the user reads it."""
    cls = dict(zip(KINDS, _layers()))[kind]
    with pytest.raises(ValueError) as err:
        _build(cls, tp - 1, tp, fmt.config(), prefix, *args, bias=False)
    return str(err.value)


@pytest.mark.parametrize("case", REFUSED_FP8_SPLITS)
def test_fp8_splits_that_cut_a_block_are_refused(case):
    kind, tp, args, size = REFUSED_FP8_SPLITS[case]
    prefix = f"model.layers.7.{case}"
    msg = build_refused(FP8, kind, tp, args, prefix)
    pattern = (re.escape(f"blockfp8: layer {prefix}: ") + r".*\b" + re.escape(size) + r"\b.* is not a multiple of "
               r"128, so its block scales cannot be split\b.*; " + re.escape(FP8_FIX))
    assert re.fullmatch(pattern, msg), msg


def test_unloaded_scales_are_refused():
    column, _, _, _ = _layers()
    layer = _build(column, 0, 1, BlockFp8Config(), "model.layers.3.mlp.proj", 256, 256, bias=False)
    with pytest.raises(ValueError, match=r"model\.layers\.3\.mlp\.proj.*weight_scale_inv"):
        layer.quant_method.process_weights_after_loading(layer)


def _checkpoint(n: int, k: int, gen: torch.Generator):
    ckpt = checkpoint(FP8, n, k, gen)
    return ckpt["weight"], ckpt["weight_scale_inv"]


def test_ragged_unsplit_output_is_accepted(seeded):
    column, _, _, _ = _layers()
    ckpt = checkpoint(FP8, 192, 256, seeded)
    layer = _build(column, 0, 1, BlockFp8Config(), "model.layers.0.mlp.ragged", 256, 192, bias=False)
    check_column_shards(FP8, layer, [(None, ckpt, 0, 192)], seeded)


def _deq(q, s):
    return reference.dequantize_block_fp8(q, s).double()


def test_ragged_fused_shards_are_fused_at_load(seeded):
    """SmolLM2-like QKV at tp 1: q = 9 heads x 64 = 576 rows ends mid-block, so fused block 4
    (rows 512..639) mixes q and k, and block 5 (640..767) mixes k's two blocks; v starts on a block
    again (768). Each shard's scales load into their own rows; processing gives
    the kernels' one-scale-per-128-rows layout. Rows of blocks inside one shard stay bit-exact;
    the straddling block's rows from the shard with the smaller scale are requantized to the larger
    one: error <= half an e4m3 step at the new scale, i.e. 2^-4 |w| (3 mantissa bits) plus 2^-10 s
    (half the subnormal spacing 2^-9 s)."""
    _, _, qkv, _ = _layers()
    hidden, head, q_heads, kv_heads = 576, 64, 9, 3
    layer = _build(qkv, 0, 1, BlockFp8Config(), "model.layers.0.self_attn.qkv_proj", hidden, head, q_heads,
                   kv_heads, bias=False)
    assert layer.blockfp8_ragged_shards
    shards = {sid: _checkpoint(rows, hidden, seeded) for sid, rows in (("q", 576), ("k", 192), ("v", 192))}
    # Make k's scales 4x q's, so the straddling block must requantize q's rows.
    shards["k"] = (shards["k"][0], shards["k"][1] * 4)
    for sid, (q, s) in shards.items():
        layer.weight.weight_loader(layer.weight, q, sid)
        layer.weight_scale_inv.weight_loader(layer.weight_scale_inv, s, sid)
    exact = torch.cat([_deq(q, s) for q, s in shards.values()])
    layer.quant_method.process_weights_after_loading(layer)
    q, s = layer.weight.data, layer.weight_scale_inv.data
    assert tuple(s.shape) == (8, 5), tuple(s.shape)
    got = _deq(q, s)
    changed = (got != exact).any(dim=1).nonzero().flatten()
    assert changed.numel() > 0 and changed.min() >= 512 and changed.max() < 768, changed
    bound = 2.0**-4 * exact.abs() + 2.0**-10 * s.double().repeat_interleave(B, 0)[:960].repeat_interleave(B, 1)[:, :hidden]
    assert ((got - exact).abs() <= bound).all()
    x = torch.randn(7, hidden, generator=seeded).to(torch.bfloat16)
    out = layer.quant_method.apply(layer, x)
    reference.assert_close_to_ref(out, reference.linear_ref(x, q, s, quantize_activations=False), "ragged qkv")
    rel = ((out.double() - x.double() @ exact.t()).norm() / (x.double() @ exact.t()).norm()).item()
    assert rel < 2.0**-5, rel


def test_ragged_merged_shards_are_fused_at_load(seeded):
    """gate_up of [192, 192] at tp 1 through load_merged_column_weight: block 0 is gate only (kept
    bit-exact), blocks 1 and 2 straddle; same bound as the QKV case above."""
    _, merged, _, _ = _layers()
    layer = _build(merged, 0, 1, BlockFp8Config(), "model.layers.0.mlp.gate_up_proj", 256, [192, 192], bias=False)
    shards = [_checkpoint(192, 256, seeded) for _ in range(2)]
    for i, (q, s) in enumerate(shards):
        layer.weight.weight_loader(layer.weight, q, i)
        layer.weight_scale_inv.weight_loader(layer.weight_scale_inv, s, i)
    exact = torch.cat([_deq(q, s) for q, s in shards])
    layer.quant_method.process_weights_after_loading(layer)
    q, s = layer.weight.data, layer.weight_scale_inv.data
    assert tuple(s.shape) == (3, 2)
    got = _deq(q, s)
    assert torch.equal(got[:128], exact[:128])
    bound = 2.0**-4 * exact.abs() + 2.0**-10 * s.double().repeat_interleave(B, 0)[:384].repeat_interleave(B, 1)
    assert ((got - exact).abs() <= bound).all()
    x = torch.randn(3, 256, generator=seeded).to(torch.bfloat16)
    reference.assert_close_to_ref(layer.quant_method.apply(layer, x),
                                  reference.linear_ref(x, q, s, quantize_activations=False), "ragged gate_up")


# The split layers of shapes.TP_RANKS as vLLM builds them: (kind, arguments) by the full layer's name.
TP_LAYERS = {
    "qwen3-8b.qkv": ("qkv", (4096, 128, 32, 8)),
    "qwen3-8b.o": ("row", (4096, 4096)),
    "qwen3-8b.gate_up": ("merged", (4096, [12288, 12288])),
    "qwen3-8b.down": ("row", (12288, 4096)),
    "dsv3.24576x1536": ("column", (1536, 128 * (128 + 64))),  # q_b_proj: 128 heads, nope + rope dims
    "dsv3.32768x512": ("column", (512, 128 * (128 + 128))),  # kv_b_proj: k_nope + v per head
    "dsv3.7168x16384": ("row", (128 * 128, 7168)),  # o_proj
    "dsv3.4096x7168": ("merged", (7168, [2048, 2048])),  # the shared expert's gate_up
    "dsv3.7168x2048": ("row", (2048, 7168)),  # the shared expert's down
}


def test_tp_ranks_shape_set_is_what_each_rank_builds():
    """`--shapes tp_ranks` picks, for each layer and tp 2, 4, 8, the weight shape vLLM's layer has
    on a rank (weights are torch.empty: nothing is allocated for real)."""
    from benchmarks import harness

    def weight_shape(name, tp):
        kind, args = TP_LAYERS[name]
        layer = _build(dict(zip(KINDS, _layers()))[kind], tp - 1, tp, FP8.config(), name, *args, bias=False)
        return tuple(layer.weight.shape)

    for name in TP_LAYERS:
        assert weight_shape(name, 1) == shapes.by_name(name)[1:], name
    built = [(f"{name}.tp{tp}", *weight_shape(name, tp)) for tp in (2, 4, 8) for name in TP_LAYERS]
    assert sorted(shapes.SETS["tp_ranks"]) == sorted(built)
    assert harness.resolve_shapes("tp_ranks") == list(shapes.TP_RANKS)
    assert shapes.by_name("qwen3-8b.down.tp8") == ("qwen3-8b.down.tp8", 4096, 1536)
