"""ModelOpt NVFP4 through vLLM's real linear layers at simulated tensor-parallel ranks: the checks
of test_loading.py (every rank of tp 1, 2, 4, 8 holds exactly its slice, then apply() on CPU
against the full dequantized checkpoint restricted to the rank) for the NVFP4 tensors.

Packed e2m1 weight uint8 [N, K/2] and e4m3 weight_scale [N, K/16] split like any weight; the
global scale weight_scale_2 and input_scale come one per fused shard (q/k/v, gate/up each their
own, magnitudes apart so they differ) and the processed layer keeps the global scale per output row
and its weight in the paired packing (the layer is not native on CPU; compared after unpairing).
NVFP4 has no blocks along N, so shard widths need no alignment (heads of 48 rows here); along K a
rank's slice must keep whole 16-groups and, for the kernels, a multiple of 32.
"""

from __future__ import annotations


import pytest
import torch
from test_loading import HIDDEN, KINDS, TPS, Format, build_refused, check_tensor_parallel

from vllm_blockfp8 import reference
from vllm_blockfp8.config import NVFP4, BlockFp8Config

pytestmark = pytest.mark.usefixtures("vllm_dist")

G = 16  # values per e4m3 scale along K
# A ModelOpt checkpoint's hf_quant_config.json, as vLLM hands it to from_config.
HF_QUANT_CONFIG = {"producer": {"name": "modelopt"},
                   "quantization": {"quant_algo": "NVFP4", "group_size": G, "exclude_modules": ["lm_head"]}}


class Nvfp4Format(Format):
    per_shard = ("weight_scale_2", "input_scale")
    column_n, gate_up, head = 8 * 24, 8 * 40, 48  # 24, 40 and 48 rows a rank at tp 8
    row_in, row_out = 8 * 96, 200  # K = 96 a rank at tp 8 (6 groups); N ragged

    def config(self):
        config = BlockFp8Config.from_config(HF_QUANT_CONFIG)
        assert config.format == NVFP4
        return config

    def quantize(self, w, gen):
        packed, scale, global_scale = reference.quantize_nvfp4(w)
        input_scale = (torch.rand((), generator=gen) + 0.5) / (6 * 448)
        return {"weight": packed, "weight_scale": scale, "weight_scale_2": global_scale, "input_scale": input_scale}

    def dequantize(self, ckpt):
        return reference.dequantize_nvfp4(ckpt["weight"], ckpt["weight_scale"], ckpt["weight_scale_2"]).double()

    def rows(self, ckpt, start, size):
        rows = slice(start, start + size)
        return {**ckpt, "weight": ckpt["weight"][rows], "weight_scale": ckpt["weight_scale"][rows]}

    def cols(self, ckpt, start, size):
        assert start % G == 0 and size % G == 0, "a rank's K slice must keep whole groups"
        return {**ckpt, "weight": ckpt["weight"][:, start // 2:(start + size) // 2],
                "weight_scale": ckpt["weight_scale"][:, start // G:(start + size) // G]}

    def processed(self, loaded, widths):
        per_row = torch.cat([g.expand(w) for g, w in zip(loaded["weight_scale_2"], widths)])
        return {"weight": loaded["weight"], "weight_scale": loaded["weight_scale"], "weight_global_scale": per_row}

    def stored(self, layer, name):
        # A CPU layer is never native, so it holds its weight in the paired packing the weight-only kernels read.
        if name == "weight":
            assert layer.blockfp8_nvfp4_packing == "paired" and not layer.blockfp8_nvfp4_native
            return reference.unpair_nvfp4_weight(layer.weight.data)
        return super().stored(layer, name)


FP4 = Nvfp4Format()


@pytest.mark.parametrize("tp,rank", TPS)
@pytest.mark.parametrize("kind", KINDS)
def test_nvfp4_tensor_parallel(kind, tp, rank, seeded):
    check_tensor_parallel(FP4, kind, tp, rank, seeded)


# Row-parallel splits whose per-rank K is not a multiple of 32 (the first two cut a 16-group).
REFUSED_NVFP4_SPLITS = {"row-tp2-k80": (2, 80), "row-tp8-k320": (8, 320), "row-tp2-k96": (2, 96)}


@pytest.mark.parametrize("case", REFUSED_NVFP4_SPLITS)
def test_nvfp4_row_splits_off_32_are_refused(case):
    tp, k = REFUSED_NVFP4_SPLITS[case]
    prefix = f"model.layers.5.{case}"
    msg = build_refused(FP4, "row", tp, (k, 256), prefix)
    want = (f"blockfp8: layer {prefix}: NVFP4 needs K % 32 == 0 per shard, got K = {k // tp} (K = {k} split "
            f"across {tp} tensor-parallel ranks); use a tensor-parallel size that keeps K / size a multiple of 32")
    assert msg == want


def test_nvfp4_unsplit_k_off_32_is_refused():
    msg = build_refused(FP4, "column", 1, (HIDDEN - G, 64), "model.layers.5.proj")
    assert msg == f"blockfp8: layer model.layers.5.proj: NVFP4 needs K % 32 == 0 per shard, got K = {HIDDEN - G}"
