"""Weight loading through vLLM's real linear layers with simulated tensor-parallel ranks.

Each checkpoint tensor is quantized once (full size); every rank of tp 1, 2, 4 loads it through the
parameter's own weight_loader, and must hold exactly the slice of the weight and of the block
scales that we cut ourselves (bit for bit). The loaded layer then runs on CPU against the reference.
"""

from __future__ import annotations

import pytest
import torch
from conftest import cpu_layers, simulate_tp

from vllm_blockfp8 import reference
from vllm_blockfp8.config import BlockFp8Config

pytestmark = pytest.mark.usefixtures("vllm_dist")

B = 128
HIDDEN = 320  # K of the column layers: not a multiple of 128, so the last scale column is ragged
HEAD = 128
Q_HEADS, KV_HEADS = 4, 2
GATE_UP = 512
ROW_IN, ROW_OUT = 512, 192  # row layer: K splits into 128s up to tp 4, N is ragged (2 scale rows)
TPS = ((1, 0), (2, 0), (2, 1), (4, 0), (4, 1), (4, 2), (4, 3))


def _layers():
    from vllm.model_executor.layers.linear import (ColumnParallelLinear, MergedColumnParallelLinear,
                                                   QKVParallelLinear, RowParallelLinear)
    return ColumnParallelLinear, MergedColumnParallelLinear, QKVParallelLinear, RowParallelLinear


def _bytes(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().view(torch.uint8) if t.element_size() == 1 else t.contiguous().view(torch.int32)


def assert_bits_equal(got: torch.Tensor, want: torch.Tensor, what: str) -> None:
    assert got.dtype == want.dtype and got.shape == want.shape, \
        f"{what}: {got.dtype} {tuple(got.shape)} != expected {want.dtype} {tuple(want.shape)}"
    bad = reference.first_mismatch(_bytes(got), _bytes(want))
    assert bad is None, f"{what}: first mismatching element at {bad}"


def _checkpoint(n: int, k: int, gen: torch.Generator):
    w = torch.randn(n, k, generator=gen) * torch.exp(torch.randn(1, k, generator=gen))
    return reference.quantize_block_fp8(w.to(torch.bfloat16))


def _rows(t: torch.Tensor, start: int, size: int) -> torch.Tensor:
    return t[start:start + size]


def _column_slice(q, s, rank, tp):
    n = q.shape[0] // tp
    return _rows(q, rank * n, n), _rows(s, rank * n // B, n // B)


def _build(cls, rank, tp, quant_config, prefix, *args, **kwargs):
    with simulate_tp(rank, tp), cpu_layers():
        layer = cls(*args, quant_config=quant_config, prefix=prefix, params_dtype=torch.bfloat16, **kwargs)
    assert layer.tp_rank == rank and layer.tp_size == tp
    assert all(getattr(p, "tp_rank", rank) == rank for p in layer.parameters())
    return layer


def _apply_matches(layer, w, s, gen, bias=None):
    layer.quant_method.process_weights_after_loading(layer)
    x = torch.randn(5, w.shape[1], generator=gen).to(torch.bfloat16)
    out = layer.quant_method.apply(layer, x, bias)
    assert out.dtype == torch.bfloat16
    reference.assert_close_to_ref(out, reference.linear_ref(x, w, s, bias, quantize_activations=False),
                                  f"{layer.prefix} apply")


@pytest.mark.parametrize("tp,rank", TPS)
def test_column_parallel(tp, rank, seeded):
    column, _, _, _ = _layers()
    q, s = _checkpoint(512, HIDDEN, seeded)
    bias = torch.randn(512, generator=seeded).to(torch.bfloat16)
    layer = _build(column, rank, tp, BlockFp8Config(), "model.layers.0.mlp.proj", HIDDEN, 512, bias=True)
    layer.weight.weight_loader(layer.weight, q)
    layer.weight_scale_inv.weight_loader(layer.weight_scale_inv, s)
    layer.bias.weight_loader(layer.bias, bias)
    wq, ws = _column_slice(q, s, rank, tp)
    assert_bits_equal(layer.weight.data, wq, "weight")
    assert_bits_equal(layer.weight_scale_inv.data, ws, "weight_scale_inv")
    wb = _rows(bias, rank * 512 // tp, 512 // tp)
    _apply_matches(layer, wq, ws, seeded, layer.bias)
    assert torch.equal(layer.bias.data, wb)


@pytest.mark.parametrize("tp,rank", TPS)
def test_merged_column_parallel(tp, rank, seeded):
    _, merged, _, _ = _layers()
    shards = [_checkpoint(GATE_UP, HIDDEN, seeded) for _ in range(2)]
    layer = _build(merged, rank, tp, BlockFp8Config(), "model.layers.0.mlp.gate_up_proj", HIDDEN,
                   [GATE_UP, GATE_UP], bias=False)
    for i in (1, 0):  # out of order: each shard must land at its own offset
        layer.weight.weight_loader(layer.weight, shards[i][0], i)
        layer.weight_scale_inv.weight_loader(layer.weight_scale_inv, shards[i][1], i)
    parts = [_column_slice(q, s, rank, tp) for q, s in shards]
    wq = torch.cat([p[0].view(torch.uint8) for p in parts]).view(torch.float8_e4m3fn)
    ws = torch.cat([p[1] for p in parts])
    assert_bits_equal(layer.weight.data, wq, "gate_up weight")
    assert_bits_equal(layer.weight_scale_inv.data, ws, "gate_up weight_scale_inv")
    _apply_matches(layer, wq, ws, seeded)


@pytest.mark.parametrize("tp,rank", TPS)
def test_qkv_parallel(tp, rank, seeded):
    _, _, qkv, _ = _layers()
    ckpt = {"q": _checkpoint(Q_HEADS * HEAD, HIDDEN, seeded),
            "k": _checkpoint(KV_HEADS * HEAD, HIDDEN, seeded),
            "v": _checkpoint(KV_HEADS * HEAD, HIDDEN, seeded)}
    layer = _build(qkv, rank, tp, BlockFp8Config(), "model.layers.0.self_attn.qkv_proj", HIDDEN, HEAD, Q_HEADS,
                   KV_HEADS, bias=False)
    for shard in ("v", "q", "k"):
        layer.weight.weight_loader(layer.weight, ckpt[shard][0], shard)
        layer.weight_scale_inv.weight_loader(layer.weight_scale_inv, ckpt[shard][1], shard)
    # K/V heads are replicated once tp exceeds their count: rank r holds kv head r // replicas.
    kv_per_rank = max(KV_HEADS // tp, 1) * HEAD
    kv_rank = rank // max(tp // KV_HEADS, 1)
    q_per_rank = Q_HEADS // tp * HEAD
    parts = []
    for shard, start, size in (("q", rank * q_per_rank, q_per_rank), ("k", kv_rank * kv_per_rank, kv_per_rank),
                               ("v", kv_rank * kv_per_rank, kv_per_rank)):
        q, s = ckpt[shard]
        parts.append((_rows(q, start, size), _rows(s, start // B, size // B)))
    wq = torch.cat([p[0].view(torch.uint8) for p in parts]).view(torch.float8_e4m3fn)
    ws = torch.cat([p[1] for p in parts])
    assert_bits_equal(layer.weight.data, wq, "qkv weight")
    assert_bits_equal(layer.weight_scale_inv.data, ws, "qkv weight_scale_inv")
    _apply_matches(layer, wq, ws, seeded)


@pytest.mark.parametrize("tp,rank", TPS)
def test_row_parallel(tp, rank, seeded):
    _, _, _, row = _layers()
    q, s = _checkpoint(ROW_OUT, ROW_IN, seeded)
    layer = _build(row, rank, tp, BlockFp8Config(), "model.layers.0.mlp.down_proj", ROW_IN, ROW_OUT, bias=False)
    layer.weight.weight_loader(layer.weight, q)
    layer.weight_scale_inv.weight_loader(layer.weight_scale_inv, s)
    k = ROW_IN // tp
    wq = q[:, rank * k:(rank + 1) * k]
    ws = s[:, rank * k // B:(rank + 1) * k // B]
    assert_bits_equal(layer.weight.data, wq, "down weight")
    assert_bits_equal(layer.weight_scale_inv.data, ws, "down weight_scale_inv")
    _apply_matches(layer, wq, ws, seeded)


def test_unloaded_scales_are_refused():
    column, _, _, _ = _layers()
    layer = _build(column, 0, 1, BlockFp8Config(), "model.layers.3.mlp.proj", 256, 256, bias=False)
    with pytest.raises(ValueError, match=r"model\.layers\.3\.mlp\.proj.*weight_scale_inv"):
        layer.quant_method.process_weights_after_loading(layer)


@pytest.mark.parametrize("case", ["column-tp2", "merged-tp2", "row-tp2"])
def test_straddling_blocks_are_refused(case):
    column, merged, _, row = _layers()
    prefix = f"model.layers.7.{case}"
    if case == "column-tp2":  # N = 192 at tp 2: 96 per rank, half a scale block each
        build, size = (lambda: _build(column, 1, 2, BlockFp8Config(), prefix, 256, 192, bias=False)), "96"
    elif case == "merged-tp2":  # 384 per shard at tp 2: 192 per rank, the rank's slice starts mid-block
        build, size = (lambda: _build(merged, 1, 2, BlockFp8Config(), prefix, 256, [384, 384], bias=False)), "192"
    else:  # K = 384 at tp 2: 192 per rank
        build, size = (lambda: _build(row, 0, 2, BlockFp8Config(), prefix, 384, 256, bias=False)), "192"
    with pytest.raises(ValueError) as err:
        build()
    msg = str(err.value)
    assert prefix in msg and size in msg and "multiple of 128" in msg, msg
    assert "tensor-parallel size" in msg and "blockfp8 quantize" in msg, f"no fix named: {msg}"


def test_ragged_unsplit_output_is_accepted(seeded):
    column, _, _, _ = _layers()
    q, s = _checkpoint(192, 256, seeded)
    layer = _build(column, 0, 1, BlockFp8Config(), "model.layers.0.mlp.ragged", 256, 192, bias=False)
    layer.weight.weight_loader(layer.weight, q)
    layer.weight_scale_inv.weight_loader(layer.weight_scale_inv, s)
    assert_bits_equal(layer.weight_scale_inv.data, s, "ragged weight_scale_inv")
    _apply_matches(layer, q, s, seeded)


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


# ---------------------------------------------------------------------------------------------
# NVFP4
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("tp,rank", ((1, 0), (2, 0), (2, 1)))
def test_nvfp4_merged_column(tp, rank, seeded):
    _, merged, _, _ = _layers()
    n, k = 256, 256
    # Two shards with different global scales (their amax differ by 8x): each must keep its own.
    shards = [reference.quantize_nvfp4((torch.randn(n, k, generator=seeded) * mag).to(torch.bfloat16))
              for mag in (1.0, 8.0)]
    assert shards[0][2].item() != shards[1][2].item()
    layer = _build(merged, rank, tp, BlockFp8Config("nvfp4"), "model.layers.0.mlp.gate_up_proj", k, [n, n],
                   bias=False)
    for i, (packed, scale, gs) in enumerate(shards):
        layer.weight.weight_loader(layer.weight, packed, i)
        layer.weight_scale.weight_loader(layer.weight_scale, scale, i)
        layer.weight_scale_2.weight_loader(layer.weight_scale_2, gs, i)
        layer.input_scale.weight_loader(layer.input_scale, torch.tensor(0.5 + i), i)
    rows = n // tp
    want = [(_rows(p, rank * rows, rows), _rows(sc, rank * rows, rows), gs) for p, sc, gs in shards]
    assert_bits_equal(layer.weight.data, torch.cat([w[0] for w in want]), "nvfp4 weight")
    assert_bits_equal(layer.weight_scale.data, torch.cat([w[1].view(torch.uint8) for w in want]).view(
        torch.float8_e4m3fn), "nvfp4 weight_scale")
    assert_bits_equal(layer.weight_scale_2.data, torch.stack([w[2] for w in want]), "nvfp4 weight_scale_2")
    assert torch.equal(layer.input_scale.data, torch.tensor([0.5, 1.5]))

    layer.quant_method.process_weights_after_loading(layer)
    x = torch.randn(3, k, generator=seeded).to(torch.bfloat16)
    out = layer.quant_method.apply(layer, x)
    for i, (packed, scale, gs) in enumerate(want):
        reference.assert_close_to_ref(out[:, i * rows:(i + 1) * rows],
                                      reference.nvfp4_linear_ref(x, packed, scale, gs), f"nvfp4 shard {i}")
