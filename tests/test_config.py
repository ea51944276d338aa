"""The ``blockfp8`` config: vLLM's own resolution of checkpoint configs, from_config for every
form we claim, clear errors for the ones we do not, layer ignoring and method dispatch."""

from __future__ import annotations

import json

import pytest
import torch
from conftest import cpu_layers, simulate_tp

from vllm_blockfp8.config import FP8_BLOCK, NVFP4, BlockFp8Config

pytestmark = pytest.mark.usefixtures("vllm_dist")

FP8_BLOCK_CFG = {"quant_method": "fp8", "activation_scheme": "dynamic", "weight_block_size": [128, 128],
                 "ignored_layers": ["lm_head"]}
MODELOPT_CFG = {"quant_method": "modelopt", "quant_algo": "NVFP4", "group_size": 16, "ignore": ["lm_head"]}
HF_QUANT_CFG = {"producer": {"name": "modelopt", "version": "0.27.1"},
                "quantization": {"quant_algo": "NVFP4", "group_size": 16,
                                 "exclude_modules": ["lm_head", "model.layers.0.*"], "kv_cache_quant_algo": None}}
QWEN3 = {"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "hidden_size": 256,
         "intermediate_size": 512, "num_hidden_layers": 1, "num_attention_heads": 2, "num_key_value_heads": 1,
         "head_dim": 128, "vocab_size": 1024, "max_position_embeddings": 2048, "rms_norm_eps": 1e-6,
         "rope_theta": 10000.0, "torch_dtype": "bfloat16", "tie_word_embeddings": False}


def _model_dir(tmp_path, quantization_config=None, hf_quant_config=None):
    cfg = dict(QWEN3)
    if quantization_config is not None:
        cfg["quantization_config"] = quantization_config
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    if hf_quant_config is not None:
        (tmp_path / "hf_quant_config.json").write_text(json.dumps(hf_quant_config))
    return str(tmp_path)


def _resolve(model_dir, quantization):
    from vllm.config import LoadConfig, ModelConfig
    from vllm.model_executor.model_loader.weight_utils import get_quant_config

    model_config = ModelConfig(model=model_dir, quantization=quantization, skip_tokenizer_init=True,
                               dtype="bfloat16")
    return model_config.quantization, get_quant_config(model_config, LoadConfig())


# ---------------------------------------------------------------------------------------------
# vLLM's config resolution (ModelConfig -> _verify_quantization -> override_quantization_method)
# ---------------------------------------------------------------------------------------------


def test_block_fp8_checkpoint_claimed_only_on_request(tmp_path):
    model_dir = _model_dir(tmp_path, FP8_BLOCK_CFG)
    method, qc = _resolve(model_dir, "blockfp8")
    assert method == "blockfp8"
    assert isinstance(qc, BlockFp8Config) and qc.format == FP8_BLOCK and qc.ignored_layers == ["lm_head"]
    method, qc = _resolve(model_dir, None)
    assert method == "fp8" and not isinstance(qc, BlockFp8Config)


def test_modelopt_nvfp4_config_json_claimed_only_on_request(tmp_path):
    model_dir = _model_dir(tmp_path, MODELOPT_CFG)
    method, qc = _resolve(model_dir, "blockfp8")
    assert method == "blockfp8"
    assert isinstance(qc, BlockFp8Config) and qc.format == NVFP4 and qc.ignored_layers == ["lm_head"]
    assert _resolve(model_dir, None)[0] == "modelopt_fp4"


def test_modelopt_nvfp4_hf_quant_config_json(tmp_path):
    model_dir = _model_dir(tmp_path, hf_quant_config=HF_QUANT_CFG)
    method, qc = _resolve(model_dir, "blockfp8")
    assert method == "blockfp8"
    assert qc.format == NVFP4 and qc.ignored_layers == ["lm_head", "model.layers.0.*"]
    assert _resolve(model_dir, None)[0] == "modelopt_fp4"


def test_per_tensor_fp8_is_not_claimed(tmp_path):
    model_dir = _model_dir(tmp_path, {"quant_method": "fp8", "activation_scheme": "dynamic"})
    with pytest.raises(ValueError, match="does not match"):
        _resolve(model_dir, "blockfp8")


# ---------------------------------------------------------------------------------------------
# from_config
# ---------------------------------------------------------------------------------------------


def test_from_config_own_form():
    qc = BlockFp8Config.from_config({"quant_method": "blockfp8", "ignored_layers": ["lm_head"]})
    assert (qc.format, qc.weight_block_size, qc.ignored_layers) == (FP8_BLOCK, [128, 128], ["lm_head"])
    qc = BlockFp8Config.from_config({"quant_method": "blockfp8", "format": "nvfp4", "ignore": ["lm_head"]})
    assert (qc.format, qc.group_size, qc.weight_block_size, qc.ignored_layers) == (NVFP4, 16, None, ["lm_head"])


@pytest.mark.parametrize("key", ["ignored_layers", "modules_to_not_convert"])
def test_from_config_fp8(key):
    cfg = {"quant_method": "fp8", "activation_scheme": "dynamic", "weight_block_size": [128, 128],
           key: ["lm_head", "model.layers.1.mlp.down_proj"]}
    qc = BlockFp8Config.from_config(cfg)
    assert qc.format == FP8_BLOCK and qc.weight_block_size == [128, 128]
    assert qc.ignored_layers == ["lm_head", "model.layers.1.mlp.down_proj"]


def test_from_config_modelopt_forms():
    qc = BlockFp8Config.from_config(MODELOPT_CFG)
    assert (qc.format, qc.group_size, qc.ignored_layers, qc.kv_cache_quant_algo) == (NVFP4, 16, ["lm_head"], None)
    qc = BlockFp8Config.from_config(HF_QUANT_CFG)
    assert (qc.format, qc.group_size) == (NVFP4, 16)
    assert qc.ignored_layers == ["lm_head", "model.layers.0.*"]
    fp8_kv = {**HF_QUANT_CFG, "quantization": {**HF_QUANT_CFG["quantization"], "kv_cache_quant_algo": "FP8"}}
    assert BlockFp8Config.from_config(fp8_kv).kv_cache_quant_algo == "FP8"


@pytest.mark.parametrize("cfg,match", [
    ({"quant_method": "fp8", "activation_scheme": "dynamic", "weight_block_size": [64, 64]},
     r"weight_block_size must be \[128, 128\].*\[64, 64\]"),
    ({"quant_method": "fp8", "activation_scheme": "static", "weight_block_size": [128, 128]},
     "activation_scheme 'dynamic'.*'static'"),
    ({"quant_method": "gptq", "bits": 4}, "unsupported quantization_config.*gptq"),
    ({"quant_method": "fp8", "activation_scheme": "dynamic"}, "unsupported quantization_config"),
    ({"quant_method": "modelopt", "quant_algo": "FP8"}, "unsupported quantization_config"),
    ({"quant_method": "modelopt", "quant_algo": "NVFP4", "group_size": 32}, "group_size must be 16, got 32"),
])
def test_from_config_errors(cfg, match):
    with pytest.raises(ValueError, match=match):
        BlockFp8Config.from_config(cfg)


# ---------------------------------------------------------------------------------------------
# Ignored layers and method dispatch
# ---------------------------------------------------------------------------------------------

QKV_MAPPING = {"qkv_proj": ["q_proj", "k_proj", "v_proj"], "gate_up_proj": ["gate_proj", "up_proj"]}


def _config(ignored, fmt=FP8_BLOCK):
    qc = BlockFp8Config(fmt, ignored_layers=ignored)
    qc.packed_modules_mapping = dict(QKV_MAPPING)
    return qc


def test_ignored_exact_names():
    qc = _config(["lm_head", "model.layers.1.mlp.down_proj"])
    assert qc.is_layer_ignored("lm_head")
    assert qc.is_layer_ignored("model.layers.1.mlp.down_proj")
    assert not qc.is_layer_ignored("model.layers.11.mlp.down_proj")
    assert not qc.is_layer_ignored("model.layers.1.mlp.gate_up_proj")


def test_ignored_fused_through_shards():
    qc = _config(["model.layers.2.self_attn.q_proj", "model.layers.2.self_attn.k_proj",
                  "model.layers.2.self_attn.v_proj"])
    assert qc.is_layer_ignored("model.layers.2.self_attn.qkv_proj")
    assert not qc.is_layer_ignored("model.layers.3.self_attn.qkv_proj")
    assert _config(["model.layers.2.self_attn.qkv_proj"]).is_layer_ignored("model.layers.2.self_attn.qkv_proj")
    # Half a fused layer cannot be unquantized: vLLM's rule is a clear error, not a silent choice.
    with pytest.raises(ValueError):
        _config(["model.layers.2.self_attn.q_proj"]).is_layer_ignored("model.layers.2.self_attn.qkv_proj")


def test_ignored_wildcards():
    qc = _config(["model.layers.0.*", "*.mlp.*"])
    assert qc.is_layer_ignored("model.layers.0.self_attn.qkv_proj")
    assert qc.is_layer_ignored("model.layers.0.self_attn.o_proj")
    assert not qc.is_layer_ignored("model.layers.10.self_attn.o_proj")
    assert qc.is_layer_ignored("model.layers.5.mlp.gate_up_proj")
    assert qc.is_layer_ignored("model.layers.5.mlp.down_proj")
    assert not qc.is_layer_ignored("model.layers.5.self_attn.qkv_proj")
    assert not _config([]).is_layer_ignored("model.layers.0.self_attn.qkv_proj")


def test_wildcard_matching_part_of_a_fused_layer_is_an_error():
    qc = _config(["*.q_proj", "*.gate_proj", "*.up_proj"])
    qc.packed_modules_mapping = {"qkv_proj": ["q_proj", "k_proj", "v_proj"], "gate_up_proj": ["gate_proj", "up_proj"]}
    with pytest.raises(ValueError, match="only some shards of model.layers.1.self_attn.qkv_proj"):
        qc.is_layer_ignored("model.layers.1.self_attn.qkv_proj")
    assert qc.is_layer_ignored("model.layers.1.mlp.gate_up_proj")
    assert not qc.is_layer_ignored("model.layers.1.mlp.down_proj")


@pytest.mark.parametrize("fmt", [FP8_BLOCK, NVFP4])
def test_get_quant_method_on_real_layers(fmt):
    from vllm.model_executor.layers.linear import (MergedColumnParallelLinear, QKVParallelLinear,
                                                   ReplicatedLinear, RowParallelLinear, UnquantizedLinearMethod)

    from vllm_blockfp8.layers.linear import BlockFp8LinearMethod, Nvfp4LinearMethod

    ours = BlockFp8LinearMethod if fmt == FP8_BLOCK else Nvfp4LinearMethod
    qc = _config(["lm_head", "model.layers.0.*"], fmt)
    with simulate_tp(0, 1), cpu_layers():
        kw = dict(quant_config=qc, params_dtype=torch.bfloat16)
        layers = {
            "model.layers.0.self_attn.qkv_proj": QKVParallelLinear(256, 128, 2, 1, bias=False,
                                                                   prefix="model.layers.0.self_attn.qkv_proj", **kw),
            "model.layers.1.self_attn.qkv_proj": QKVParallelLinear(256, 128, 2, 1, bias=False,
                                                                   prefix="model.layers.1.self_attn.qkv_proj", **kw),
            "model.layers.1.mlp.gate_up_proj": MergedColumnParallelLinear(
                256, [256, 256], bias=False, prefix="model.layers.1.mlp.gate_up_proj", **kw),
            "model.layers.1.mlp.down_proj": RowParallelLinear(256, 256, bias=False,
                                                              prefix="model.layers.1.mlp.down_proj", **kw),
            "lm_head": ReplicatedLinear(256, 1024, bias=False, prefix="lm_head", **kw),
        }
    for prefix, layer in layers.items():
        ignored = prefix == "lm_head" or prefix.startswith("model.layers.0.")
        want = UnquantizedLinearMethod if ignored else ours
        assert type(layer.quant_method) is want, f"{prefix}: {type(layer.quant_method).__name__}"
        assert layer.weight.dtype == (torch.bfloat16 if ignored else
                                      torch.float8_e4m3fn if fmt == FP8_BLOCK else torch.uint8), prefix
