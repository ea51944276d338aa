"""Whole tiny models through vLLM's real model loader with the plugin (CPU).

A tiny Qwen3 / Qwen3-MoE is built with transformers, quantized with ``blockfp8 quantize``, then
built by ``vllm.model_executor.model_loader.utils.initialize_model`` under a CPU VllmConfig and
loaded with ``model.load_weights`` from the safetensors, as vLLM's default loader does. Checks:
which quant method each layer got, that every parameter was loaded, that the fused weights and
scales equal the checkpoint bit for bit after ``process_weights_after_loading`` (an NVFP4 weight once
the paired packing the layer stores is undone), and that each layer's ``quant_method.apply`` matches
the float64 reference built from the checkpoint tensors.

The distributed world is conftest's ``vllm_dist`` (initialising it twice fails); vLLM's attention
backend selector is pointed at the CPU backend for the module (the model's Attention layers are
built but never run). Each model is built once per module.
"""

from __future__ import annotations

import glob
import os
import types

import pytest
import torch

from vllm_blockfp8 import reference

pytestmark = pytest.mark.usefixtures("vllm_dist", "cpu_attention")

TINY = dict(vocab_size=512, hidden_size=256, intermediate_size=512, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, head_dim=64)
MOE = dict(moe_intermediate_size=128, num_experts=4, num_experts_per_tok=2)
LAYERS = TINY["num_hidden_layers"]
# Checkpoint modules each fused vLLM layer loads, in vLLM's shard order.
FUSED = {"self_attn.qkv_proj": ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"),
         "self_attn.o_proj": ("self_attn.o_proj",),
         "mlp.gate_up_proj": ("mlp.gate_proj", "mlp.up_proj"),
         "mlp.down_proj": ("mlp.down_proj",)}
KV_CACHE_SCALES = ("attn.k_scale", "attn.v_scale", "attn.q_scale", "attn.prob_scale")
# NVFP4: the quantizer gives fused siblings one shared weight_scale_2; these factors make every
# shard's global scale different (a rescaled shard is still an exact checkpoint of some weight), so
# a layer that kept one scale per fused layer, or the shards in the wrong order, is caught.
NVFP4_SHARD_FACTORS = {"self_attn.k_proj": 2.0, "self_attn.v_proj": 0.25, "mlp.up_proj": 8.0}


# --------------------------------------------------------------------------------------------
# Fixtures
# --------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def cpu_attention():
    """vLLM's Attention asks get_attn_backend for a GPU backend; hand it the CPU one."""
    import vllm.model_executor.layers.attention.attention as vllm_attention
    from vllm.v1.attention.backends.cpu_attn import CPUAttentionBackend

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(vllm_attention, "get_attn_backend", lambda *a, **k: CPUAttentionBackend)
        yield


def _read(directory: str) -> dict:
    from safetensors.torch import load_file

    tensors = {}
    for f in sorted(glob.glob(os.path.join(directory, "*.safetensors"))):
        tensors.update(load_file(f))
    assert tensors, f"no safetensors in {directory}"
    return tensors


def _checkpoint(root, arch: str, fmt: str) -> str:
    import transformers

    from vllm_blockfp8.tools.quantize import quantize_checkpoint

    torch.manual_seed(0)
    if arch == "moe":
        hf = transformers.Qwen3MoeForCausalLM(transformers.Qwen3MoeConfig(**TINY, **MOE))
    else:
        hf = transformers.Qwen3ForCausalLM(transformers.Qwen3Config(**TINY))
    hf.to(torch.bfloat16).save_pretrained(str(root / "src"))
    quantize_checkpoint(str(root / "src"), str(root / "q"), fmt=fmt, progress=False)
    return str(root / "q")


def _spread_nvfp4_global_scales(qdir: str) -> None:
    from safetensors.torch import load_file, save_file

    files = sorted(glob.glob(os.path.join(qdir, "*.safetensors")))
    for f in files:
        tensors = load_file(f)
        for name in list(tensors):
            for module, factor in NVFP4_SHARD_FACTORS.items():
                if name.endswith(f".{module}.weight_scale_2"):
                    tensors[name] = tensors[name] * factor
        save_file(tensors, f, metadata={"format": "pt"})


def _build(qdir: str, quantization, *, skip_if_unbuildable: str = ""):
    """initialize_model + load_weights as vLLM 0.26's BaseModelLoader.load_model does them (under
    the model dtype as torch's default, on the target device); post-processing is _process.
    With ``skip_if_unbuildable``, a failure to construct the model (not to load it) skips."""
    from vllm.config import DeviceConfig, LoadConfig, ModelConfig, VllmConfig, set_current_vllm_config
    from vllm.model_executor.model_loader.utils import initialize_model
    from vllm.model_executor.model_loader.weight_utils import safetensors_weights_iterator
    from vllm.utils.torch_utils import set_default_torch_dtype

    mc = ModelConfig(model=qdir, dtype="bfloat16", enforce_eager=True, quantization=quantization)
    vc = VllmConfig(model_config=mc, load_config=LoadConfig(), device_config=DeviceConfig("cpu"))
    try:
        with set_current_vllm_config(vc), set_default_torch_dtype(mc.dtype), torch.device("cpu"):
            model = initialize_model(vllm_config=vc, model_config=mc)
    except Exception as e:  # noqa: BLE001 - only construction, and only where asked
        if not skip_if_unbuildable:
            raise
        pytest.skip(f"{skip_if_unbuildable} ({type(e).__name__}: {e})")
    files = sorted(glob.glob(os.path.join(qdir, "*.safetensors")))
    with set_current_vllm_config(vc), set_default_torch_dtype(mc.dtype):
        loaded = set(model.load_weights(safetensors_weights_iterator(files, False)))
    return types.SimpleNamespace(model=model, mc=mc, vc=vc, loaded=loaded,
                                 param_names=set(dict(model.named_parameters())), ckpt=_read(qdir))


def _process(m) -> None:
    from vllm.config import set_current_vllm_config
    from vllm.model_executor.model_loader.utils import process_weights_after_loading
    from vllm.utils.torch_utils import set_default_torch_dtype

    with set_current_vllm_config(m.vc), set_default_torch_dtype(m.mc.dtype):
        process_weights_after_loading(m.model, m.mc, torch.device("cpu"))


@pytest.fixture(scope="module")
def fp8_dir(tmp_path_factory):
    return _checkpoint(tmp_path_factory.mktemp("qwen3_fp8"), "dense", "fp8-block")


@pytest.fixture(scope="module")
def fp8_model(fp8_dir):
    m = _build(fp8_dir, "blockfp8")
    _process(m)
    return m


@pytest.fixture(scope="module")
def nvfp4_dir(tmp_path_factory):
    qdir = _checkpoint(tmp_path_factory.mktemp("qwen3_nvfp4"), "dense", "nvfp4")
    _spread_nvfp4_global_scales(qdir)
    return qdir


@pytest.fixture(scope="module")
def nvfp4_model(nvfp4_dir):
    m = _build(nvfp4_dir, "blockfp8")
    _process(m)
    return m


@pytest.fixture(scope="module")
def moe_model(tmp_path_factory):
    qdir = _checkpoint(tmp_path_factory.mktemp("qwen3_moe_fp8"), "moe", "fp8-block")
    return _build(qdir, "blockfp8", skip_if_unbuildable="vLLM 0.26 could not construct Qwen3-MoE on CPU "
                  "(its fused-MoE layer picks a GPU kernel backend at construction)")


# --------------------------------------------------------------------------------------------
# Helpers
# --------------------------------------------------------------------------------------------


def _bytes(t: torch.Tensor) -> torch.Tensor:
    t = t.detach().contiguous()
    return t.view(torch.uint8) if t.element_size() == 1 else t.view(torch.int32)


def assert_bits_equal(got: torch.Tensor, want: torch.Tensor, what: str) -> None:
    assert got.dtype == want.dtype and tuple(got.shape) == tuple(want.shape), \
        f"{what}: {got.dtype} {tuple(got.shape)} != checkpoint {want.dtype} {tuple(want.shape)}"
    bad = reference.first_mismatch(_bytes(got), _bytes(want))
    assert bad is None, f"{what}: first element differing from the checkpoint at {bad}"


def _cat(ckpt: dict, layer: int, fused: str, tensor: str) -> torch.Tensor:
    return torch.cat([ckpt[f"model.layers.{layer}.{m}.{tensor}"] for m in FUSED[fused]])


def _decoder_linears(model) -> dict:
    from vllm.model_executor.layers.linear import LinearBase

    return {n: mod for n, mod in model.named_modules() if isinstance(mod, LinearBase) and ".layers." in n}


def _expected_linear_names() -> set:
    return {f"model.layers.{i}.{f}" for i in range(LAYERS) for f in FUSED}


def _assert_all_loaded(m) -> None:
    missing = m.param_names - m.loaded
    # Checkpoints from `blockfp8 quantize` carry no KV-cache scales; vLLM keeps its defaults.
    assert all(n.endswith(KV_CACHE_SCALES) for n in missing), \
        f"parameters never loaded: {sorted(n for n in missing if not n.endswith(KV_CACHE_SCALES))}"
    unknown = m.loaded - m.param_names
    assert not unknown, f"load_weights reported names that are not parameters: {sorted(unknown)}"


def _x(k: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(5, k, generator=g).to(torch.bfloat16)


def _assert_unquantized_embeddings(m) -> None:
    from vllm.model_executor.layers.vocab_parallel_embedding import UnquantizedEmbeddingMethod

    mods = dict(m.model.named_modules())
    for name in ("model.embed_tokens", "lm_head"):
        mod = mods[name]
        assert isinstance(mod.quant_method, UnquantizedEmbeddingMethod), \
            f"{name}: {type(mod.quant_method).__name__}, expected unquantized"
        want = m.ckpt.get(f"{name}.weight", m.ckpt["model.embed_tokens.weight"])
        assert_bits_equal(mod.weight.data, want, f"{name}.weight")


# --------------------------------------------------------------------------------------------
# 1. Block FP8 Qwen3 with --quantization blockfp8
# --------------------------------------------------------------------------------------------


def test_fp8_block_resolves_to_blockfp8(fp8_model):
    from vllm_blockfp8.config import BlockFp8Config

    assert fp8_model.mc.quantization == "blockfp8"
    assert isinstance(fp8_model.vc.quant_config, BlockFp8Config)
    assert fp8_model.vc.quant_config.format == "fp8_block"


def test_fp8_block_quant_methods(fp8_model):
    from vllm_blockfp8.layers.linear import BlockFp8LinearMethod

    linears = _decoder_linears(fp8_model.model)
    assert set(linears) == _expected_linear_names()
    for name, mod in linears.items():
        assert type(mod.quant_method) is BlockFp8LinearMethod, f"{name}: {type(mod.quant_method).__name__}"
    _assert_unquantized_embeddings(fp8_model)


def test_fp8_block_every_parameter_loaded(fp8_model):
    _assert_all_loaded(fp8_model)


@pytest.mark.parametrize("layer", range(LAYERS))
@pytest.mark.parametrize("fused", list(FUSED))
def test_fp8_block_weights_bit_exact_and_apply(fp8_model, layer, fused):
    mod = dict(fp8_model.model.named_modules())[f"model.layers.{layer}.{fused}"]
    w = _cat(fp8_model.ckpt, layer, fused, "weight")
    s = _cat(fp8_model.ckpt, layer, fused, "weight_scale_inv")
    assert w.dtype == torch.float8_e4m3fn and s.dtype == torch.float32
    assert_bits_equal(mod.weight.data, w, f"layer {layer} {fused}.weight")
    assert_bits_equal(mod.weight_scale_inv.data, s, f"layer {layer} {fused}.weight_scale_inv")
    x = _x(w.shape[1], seed=layer * 10 + list(FUSED).index(fused))
    out = mod.quant_method.apply(mod, x)
    assert out.dtype == torch.bfloat16
    reference.assert_close_to_ref(out, reference.linear_ref(x, w, s, quantize_activations=False),
                                  f"layer {layer} {fused} apply")


# --------------------------------------------------------------------------------------------
# 2. Without --quantization blockfp8, vLLM's own methods keep the checkpoint
# --------------------------------------------------------------------------------------------


def test_without_flag_fp8_block_stays_vllm_fp8(fp8_dir):
    from vllm.config import ModelConfig

    assert ModelConfig(model=fp8_dir, dtype="bfloat16", enforce_eager=True).quantization == "fp8"


def test_without_flag_nvfp4_stays_vllm_modelopt(nvfp4_dir):
    from vllm.config import ModelConfig

    assert ModelConfig(model=nvfp4_dir, dtype="bfloat16", enforce_eager=True).quantization == "modelopt_fp4"


# --------------------------------------------------------------------------------------------
# 3. NVFP4 Qwen3 with --quantization blockfp8
# --------------------------------------------------------------------------------------------


def test_nvfp4_quant_methods_and_loading(nvfp4_model):
    from vllm_blockfp8.config import BlockFp8Config
    from vllm_blockfp8.layers.linear import Nvfp4LinearMethod

    assert nvfp4_model.mc.quantization == "blockfp8"
    assert isinstance(nvfp4_model.vc.quant_config, BlockFp8Config)
    assert nvfp4_model.vc.quant_config.format == "nvfp4"
    linears = _decoder_linears(nvfp4_model.model)
    assert set(linears) == _expected_linear_names()
    for name, mod in linears.items():
        assert type(mod.quant_method) is Nvfp4LinearMethod, f"{name}: {type(mod.quant_method).__name__}"
    _assert_unquantized_embeddings(nvfp4_model)
    _assert_all_loaded(nvfp4_model)


@pytest.mark.parametrize("layer", range(LAYERS))
@pytest.mark.parametrize("fused", list(FUSED))
def test_nvfp4_weights_global_scales_and_apply(nvfp4_model, layer, fused):
    mod = dict(nvfp4_model.model.named_modules())[f"model.layers.{layer}.{fused}"]
    ckpt = nvfp4_model.ckpt
    w = _cat(ckpt, layer, fused, "weight")
    s = _cat(ckpt, layer, fused, "weight_scale")
    # Not native on CPU: the layer holds the paired packing the weight-only kernels read.
    assert mod.blockfp8_nvfp4_packing == "paired" and not mod.blockfp8_nvfp4_native
    assert_bits_equal(reference.unpair_nvfp4_weight(mod.weight.data), w, f"layer {layer} {fused}.weight")
    assert_bits_equal(mod.weight_scale.data, s, f"layer {layer} {fused}.weight_scale")
    shard_scales = [ckpt[f"model.layers.{layer}.{m}.weight_scale_2"].reshape(()) for m in FUSED[fused]]
    rows = [ckpt[f"model.layers.{layer}.{m}.weight"].shape[0] for m in FUSED[fused]]
    if len(FUSED[fused]) > 1:  # the fixture made the shards' global scales differ
        assert len({float(v) for v in shard_scales}) == len(shard_scales)
    want_gs = torch.repeat_interleave(torch.stack(shard_scales).float(), torch.tensor(rows))
    assert_bits_equal(mod.weight_global_scale.data, want_gs, f"layer {layer} {fused}.weight_global_scale")
    x = _x(2 * w.shape[1], seed=100 + layer * 10 + list(FUSED).index(fused))
    out = mod.quant_method.apply(mod, x)
    assert out.dtype == torch.bfloat16
    reference.assert_close_to_ref(out, reference.nvfp4_linear_ref(x, w, s, want_gs.unsqueeze(-1).unsqueeze(-1)),
                                  f"layer {layer} {fused} apply")


# --------------------------------------------------------------------------------------------
# 4. Qwen3-MoE block FP8: experts delegated to vLLM's Fp8MoEMethod
# --------------------------------------------------------------------------------------------


def test_moe_quant_methods(moe_model):
    from vllm.model_executor.layers.fused_moe import RoutedExperts
    from vllm.model_executor.layers.linear import UnquantizedLinearMethod
    from vllm.model_executor.layers.quantization.fp8 import Fp8MoEMethod

    from vllm_blockfp8.layers.linear import BlockFp8LinearMethod

    mods = dict(moe_model.model.named_modules())
    experts = {n: m for n, m in mods.items() if isinstance(m, RoutedExperts)}
    assert len(experts) == LAYERS, sorted(experts)
    for name, mod in experts.items():
        assert type(mod.quant_method) is Fp8MoEMethod, f"{name}: {type(mod.quant_method).__name__}"
    for i in range(LAYERS):
        for f in ("self_attn.qkv_proj", "self_attn.o_proj"):
            qm = mods[f"model.layers.{i}.{f}"].quant_method
            assert type(qm) is BlockFp8LinearMethod, f"layer {i} {f}: {type(qm).__name__}"
        # The router is left unquantized by the quantizer and listed as not converted.
        assert isinstance(mods[f"model.layers.{i}.mlp.gate"].quant_method, UnquantizedLinearMethod)


def test_moe_every_parameter_loaded(moe_model):
    # vLLM 0.26 reports the experts' loaded names without the ".routed_experts" module level.
    missing = {n for n in moe_model.param_names - moe_model.loaded
               if n.replace(".routed_experts.", ".") not in moe_model.loaded}
    assert all(n.endswith(KV_CACHE_SCALES) for n in missing), \
        f"parameters never loaded: {sorted(n for n in missing if not n.endswith(KV_CACHE_SCALES))}"


@pytest.mark.parametrize("layer", range(LAYERS))
def test_moe_expert_weights_bit_exact(moe_model, layer):
    # Checked as loaded: vLLM's Fp8MoEMethod.process_weights_after_loading needs a GPU MoE backend.
    params = dict(moe_model.model.named_parameters())
    ckpt = moe_model.ckpt
    pre = f"model.layers.{layer}.mlp.experts.routed_experts."
    for e in range(MOE["num_experts"]):
        src = f"model.layers.{layer}.mlp.experts.{e}."
        for t in ("weight", "weight_scale_inv"):
            w13 = torch.cat([ckpt[f"{src}gate_proj.{t}"], ckpt[f"{src}up_proj.{t}"]])
            assert_bits_equal(params[pre + f"w13_{t}"].data[e], w13, f"layer {layer} expert {e} w13_{t}")
            assert_bits_equal(params[pre + f"w2_{t}"].data[e], ckpt[f"{src}down_proj.{t}"],
                              f"layer {layer} expert {e} w2_{t}")


# --------------------------------------------------------------------------------------------
# SmolLM2-shaped Llama: fused shards that are not multiples of 128 rows
# --------------------------------------------------------------------------------------------

SMOL = dict(vocab_size=512, hidden_size=576, intermediate_size=1536, num_hidden_layers=1,
            num_attention_heads=9, num_key_value_heads=3, head_dim=64)


@pytest.fixture(scope="module")
def smol_model(tmp_path_factory):
    import transformers

    from vllm_blockfp8.tools.quantize import quantize_checkpoint

    root = tmp_path_factory.mktemp("smol_fp8")
    torch.manual_seed(0)
    transformers.LlamaForCausalLM(transformers.LlamaConfig(**SMOL)).to(torch.bfloat16).save_pretrained(
        str(root / "src"))
    quantize_checkpoint(str(root / "src"), str(root / "q"), fmt="fp8-block", progress=False)
    m = _build(str(root / "q"), "blockfp8")
    _process(m)
    return m


def test_smollm2_shaped_qkv_loads_and_matches_the_checkpoint(smol_model):
    """q (576 rows) ends mid-block: vLLM's own block-FP8 path refuses this model; ours fuses the
    scales at load (tests/test_loading.py derives the bound) and the layer computes the
    checkpoint's weights to within the requantization of the two straddling blocks."""
    from vllm_blockfp8.layers.linear import BlockFp8LinearMethod

    layer = dict(smol_model.model.named_modules())["model.layers.0.self_attn.qkv_proj"]
    assert type(layer.quant_method) is BlockFp8LinearMethod and layer.blockfp8_ragged_shards
    ckpt = smol_model.ckpt
    exact = torch.cat([reference.dequantize_block_fp8(ckpt[f"model.layers.0.self_attn.{p}_proj.weight"],
                                                      ckpt[f"model.layers.0.self_attn.{p}_proj.weight_scale_inv"])
                       for p in "qkv"]).double()
    q, s = layer.weight.data, layer.weight_scale_inv.data
    assert tuple(s.shape) == (-(-960 // 128), -(-576 // 128))
    x = torch.randn(4, 576).to(torch.bfloat16)
    out = layer.quant_method.apply(layer, x)
    reference.assert_close_to_ref(out, reference.linear_ref(x, q, s, quantize_activations=False), "smol qkv")
    want = x.double() @ exact.t()
    assert ((out.double() - want).norm() / want.norm()).item() < 2.0**-5
