"""`blockfp8 quantize` (vllm_blockfp8/tools/quantize.py) on tiny random checkpoints, CPU only.

Every quantized weight is checked twice: bit for bit against the reference quantizer (the tool
streams 128-row chunks, which must not change a byte), and against the format's error bound:

Block FP8. s = amax_block / 448, v = w / s (|v| <= 448, so no saturation beyond fp32 noise). E4M3
has 3 mantissa bits: in the normal range (|v| >= 2^-6) neighbours are 2^(e-3) apart, so
round-to-nearest moves v by at most 2^(e-4) <= 2^-4 |v|; below it the spacing is the subnormal
step 2^-9, so at most 2^-10. Multiplying back by s: |w_deq - w| <= 2^-4 |w| + 2^-10 s, plus fp32
rounding of the divide and the multiply (2^-24 relative each), covered by 2^-20 |w|.

NVFP4. g = A / 2688 (A: amax of the fused group), S = e4m3(a / 6 / g) (a: amax of the 16 values),
v = w / (S g). With S normal (asserted: S >= 2^-6), S is within 2^-4 of a / 6 / g, so |v| <= 6.4.
E2M1 values are 0, .5, 1, 1.5, 2, 3, 4, 6: nearest rounding moves |v| <= 2 by at most 0.25,
2 < |v| <= 4 by 0.5, 4 < |v| <= 6 by 1, and |v| in (6, 6.4] saturates by < 0.4, each <= |v| / 4 above
2. So |w_deq - w| <= S g max(1/4, |v| / 4) = max(S g / 4, |w| / 4), plus 2^-20 |w| for fp32.

Non-quantized tensors must be bit-identical; config.json must parse with vLLM's own config
classes (Fp8Config, ModelOptNvFp4Config) and with ours (BlockFp8Config).
"""

from __future__ import annotations

import json
import sys
from collections import defaultdict
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import save_file

from vllm_blockfp8 import reference as ref
from vllm_blockfp8.tools import checkpoint as ckpt
from vllm_blockfp8.tools import quantize as qt
from vllm_blockfp8.tools.checkpoint import CheckpointError

TINY = dict(vocab_size=512, hidden_size=256, intermediate_size=512, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, head_dim=64)
SIDE_FILES = {"tokenizer.json": '{"model": "tiny"}', "special_tokens_map.json": "{}"}


def _finish(path: Path) -> Path:
    for name, text in SIDE_FILES.items():
        (path / name).write_text(text)
    return path


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """Three bf16 checkpoints: dense untied (one file), dense tied (sharded), Qwen3-MoE (sharded)."""
    transformers = pytest.importorskip("transformers")
    root = tmp_path_factory.mktemp("src")
    torch.manual_seed(0)
    out = {}
    builds = {
        "dense": (transformers.Qwen3ForCausalLM, transformers.Qwen3Config(**TINY, tie_word_embeddings=False), "50MB"),
        "tied_sharded": (transformers.Qwen3ForCausalLM, transformers.Qwen3Config(**TINY, tie_word_embeddings=True),
                         "300KB"),
        "moe": (transformers.Qwen3MoeForCausalLM,
                transformers.Qwen3MoeConfig(**TINY, moe_intermediate_size=128, num_experts=4, num_experts_per_tok=2,
                                            tie_word_embeddings=False), "400KB"),
    }
    for name, (cls, cfg, shard) in builds.items():
        cls(cfg).to(torch.bfloat16).save_pretrained(root / name, max_shard_size=shard)
        out[name] = _finish(root / name)
    return out


def _load(path: Path) -> dict:
    index = json.loads((path / ckpt.INDEX_NAME).read_text())
    tensors = {}
    for fname in sorted(set(index["weight_map"].values())):
        with safe_open(str(path / fname), framework="pt") as f:
            for k in f.keys():
                assert index["weight_map"][k] == fname, f"index puts {k} in the wrong shard"
                tensors[k] = f.get_tensor(k)
    assert set(tensors) == set(index["weight_map"]), "index and shards disagree"
    assert index["metadata"]["total_size"] == sum(t.numel() * t.element_size() for t in tensors.values())
    return tensors


def _load_src(path: Path) -> dict:
    tensors = {}
    for f in sorted(path.glob("*.safetensors")):
        with safe_open(str(f), framework="pt") as h:
            tensors.update({k: h.get_tensor(k) for k in h.keys()})
    return tensors


def _same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and torch.equal(
        a.contiguous().reshape(-1).view(torch.uint8), b.contiguous().reshape(-1).view(torch.uint8))


def _quantized_modules(src: dict, ignored=()) -> set:
    return {k[: -len(".weight")] for k, t in src.items() if qt.is_target(k, tuple(t.shape))} - set(ignored)


def _check_common(src_dir: Path, dst: Path, fmt: str, ignored=()) -> tuple:
    src, out = _load_src(src_dir), _load(dst)
    quantized = _quantized_modules(src, ignored)
    assert quantized, "the tiny model must have weights to quantize"
    suffixes = ("weight_scale_inv",) if fmt == "fp8-block" else ("weight_scale", "weight_scale_2", "input_scale")
    expected = set(src) | {f"{m}.{s}" for m in quantized for s in suffixes}
    assert set(out) == expected
    for k, t in src.items():
        if k[: -len(".weight")] not in quantized:
            assert _same_bits(out[k], t), f"{k} changed although it is not quantized"
    for name, text in SIDE_FILES.items():
        assert (dst / name).read_text() == text
    report = json.loads((dst / qt.REPORT_NAME).read_text())
    assert {r["name"] for r in report["layers"]} == quantized
    cfg = json.loads((dst / "config.json").read_text())
    src_cfg = json.loads((src_dir / "config.json").read_text())
    assert {k: v for k, v in cfg.items() if k != "quantization_config"} == src_cfg
    assert not list(dst.parent.glob(f".{dst.name}.tmp-*")), "temporary directory left behind"
    return src, out, quantized, cfg["quantization_config"], report


@pytest.mark.parametrize("model", ["dense", "tied_sharded", "moe"])
def test_fp8_block_checkpoint(models, tmp_path, model):
    dst = tmp_path / "fp8"
    qt.quantize_checkpoint(models[model], dst, fmt="fp8-block", progress=False)
    src, out, quantized, qcfg, report = _check_common(models[model], dst, "fp8-block")
    for m in quantized:
        w, q, s = src[f"{m}.weight"], out[f"{m}.weight"], out[f"{m}.weight_scale_inv"]
        n, k = w.shape
        assert q.dtype == torch.float8_e4m3fn and q.shape == (n, k)
        assert s.dtype == torch.float32 and s.shape == (-(-n // 128), -(-k // 128))
        q_ref, s_ref = ref.quantize_block_fp8(w)
        assert ref.first_mismatch(q, q_ref) is None and ref.first_mismatch(s, s_ref) is None, m
        wf, deq = w.float(), ref.dequantize_block_fp8(q, s)
        bound = (2**-4 + 2**-20) * wf.abs() + 2**-10 * ref.expand_block_scale(s, n, k)
        assert ((deq - wf).abs() <= bound).all(), m
    assert all(r["rms_rel"] < 2**-4 and r["max_rel"] <= 2**-4 for r in report["layers"])

    assert qcfg == {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
                    "weight_block_size": [128, 128], "modules_to_not_convert": qcfg["modules_to_not_convert"]}
    excluded = set(qcfg["modules_to_not_convert"])
    assert "lm_head" in excluded and not excluded & quantized
    if model == "moe":
        assert {"model.layers.0.mlp.gate", "model.layers.1.mlp.gate"} <= excluded  # routers stay 16-bit
    from vllm.model_executor.layers.quantization.fp8 import Fp8Config

    vcfg = Fp8Config.from_config(qcfg)
    assert vcfg.is_checkpoint_fp8_serialized and vcfg.weight_block_size == [128, 128]
    assert set(vcfg.ignored_layers) == excluded


def _shared_groups(quantized) -> dict:
    groups = defaultdict(list)
    for m in quantized:
        groups[qt.scale_group(m)].append(m)
    return groups


def test_nvfp4_checkpoint(models, tmp_path):
    src_dir, dst = models["moe"], tmp_path / "nvfp4"
    qt.quantize_checkpoint(src_dir, dst, fmt="nvfp4", progress=False)
    src, out, quantized, qcfg, _ = _check_common(src_dir, dst, "nvfp4")
    groups = _shared_groups(quantized)
    assert any(len(g) == 3 for g in groups.values()) and any(len(g) == 2 for g in groups.values())
    for members in groups.values():
        # vLLM loads a fused group with one global scale: every member must carry the same one.
        amax_member = max(members, key=lambda m: float(src[f"{m}.weight"].float().abs().amax()))
        _, _, g_ref = ref.quantize_nvfp4(src[f"{amax_member}.weight"])
        for m in members:
            w, packed = src[f"{m}.weight"], out[f"{m}.weight"]
            scale, g, x_scale = out[f"{m}.weight_scale"], out[f"{m}.weight_scale_2"], out[f"{m}.input_scale"]
            n, k = w.shape
            assert packed.dtype == torch.uint8 and packed.shape == (n, k // 2)
            assert scale.dtype == torch.float8_e4m3fn and scale.shape == (n, k // 16)
            assert g.dtype == torch.float32 and g.shape == () and _same_bits(g, g_ref)
            assert x_scale.dtype == torch.float32 and x_scale.shape == () and float(x_scale) == qt.NVFP4_INPUT_SCALE
            if m == amax_member:
                p_ref, s_ref, _ = ref.quantize_nvfp4(w)
                assert ref.first_mismatch(packed, p_ref) is None and ref.first_mismatch(scale, s_ref) is None, m
            assert (scale.float() >= 2**-6).all(), "bound below assumes normal block scales"
            wf, deq = w.float(), ref.dequantize_nvfp4(packed, scale, g)
            sg = (scale.float() * g).repeat_interleave(16, dim=1)
            bound = torch.maximum(sg / 4, wf.abs() / 4) + 2**-20 * wf.abs()
            assert ((deq - wf).abs() <= bound).all(), m

    assert qcfg["quant_method"] == "modelopt" and qcfg["quant_algo"] == "NVFP4" and qcfg["group_size"] == 16
    excluded = set(qcfg["ignore"])
    assert {"lm_head", "model.layers.0.mlp.gate"} <= excluded and not excluded & quantized
    hf_quant = json.loads((dst / "hf_quant_config.json").read_text())
    assert hf_quant["producer"]["name"] == "modelopt"
    assert hf_quant["quantization"] == {"quant_algo": "NVFP4", "group_size": 16, "exclude_modules": qcfg["ignore"],
                                        "kv_cache_quant_algo": None}
    from vllm.model_executor.layers.quantization.modelopt import ModelOptNvFp4Config

    for cfg in (qcfg, hf_quant):
        vcfg = ModelOptNvFp4Config.from_config(cfg)
        assert vcfg.is_checkpoint_nvfp4_serialized and vcfg.group_size == 16
        assert set(vcfg.exclude_modules) == excluded


def test_blockfp8_config_parses_both_formats(models, tmp_path):
    from vllm_blockfp8.config import BlockFp8Config

    for fmt, expect in (("fp8-block", "fp8_block"), ("nvfp4", "nvfp4")):
        dst = tmp_path / fmt
        qt.quantize_checkpoint(models["dense"], dst, fmt=fmt, progress=False)
        qcfg = json.loads((dst / "config.json").read_text())["quantization_config"]
        cfg = BlockFp8Config.from_config(qcfg)
        assert cfg.format == expect and "lm_head" in cfg.ignored_layers


def test_ignore_keeps_modules_and_refuses_partial_fused_layers(models, tmp_path, capsys):
    dst = tmp_path / "ignored"
    down = "model.layers.1.mlp.down_proj"
    qt.quantize_checkpoint(models["dense"], dst, ignore=[down, "nothing.*"], progress=False)
    _, out, _, qcfg, _ = _check_common(models["dense"], dst, "fp8-block", ignored=[down])
    assert out[f"{down}.weight"].dtype == torch.bfloat16 and down in qcfg["modules_to_not_convert"]
    assert "matched nothing: nothing.*" in capsys.readouterr().err
    with pytest.raises(CheckpointError, match="part of a layer"):
        qt.quantize_checkpoint(models["dense"], tmp_path / "partial", ignore=["*.q_proj"], progress=False)
    with pytest.raises(CheckpointError, match="part of a layer"):
        qt.quantize_checkpoint(models["moe"], tmp_path / "partial", ignore=["*.experts.0.*"], progress=False)
    assert not (tmp_path / "partial").exists()


def test_output_shards_split(models, tmp_path):
    dst = tmp_path / "split"
    qt.quantize_checkpoint(models["dense"], dst, max_shard_bytes=200_000, progress=False)
    index = json.loads((dst / ckpt.INDEX_NAME).read_text())["weight_map"]
    assert len(set(index.values())) > 2
    for name, fname in index.items():
        if name.endswith(".weight_scale_inv"):
            assert index[name.replace("_scale_inv", "")] == fname, "a weight and its scale must share a shard"
    _check_common(models["dense"], dst, "fp8-block")


# ------------------------------------------------------------------------------------------
# Hand-made checkpoints: failure cases and odd shapes
# ------------------------------------------------------------------------------------------


def _handmade(path: Path, shapes: dict, *, index: bool = False) -> Path:
    """A minimal Llama-style directory with the given 2-D weights (bf16, random)."""
    path.mkdir(parents=True)
    (path / "config.json").write_text(json.dumps({"model_type": "llama", "architectures": ["LlamaForCausalLM"]}))
    gen = torch.Generator().manual_seed(1)
    tensors = {k: torch.randn(*s, generator=gen).to(torch.bfloat16) for k, s in shapes.items()}
    tensors["model.norm.weight"] = torch.ones(shapes[next(iter(shapes))][1], dtype=torch.bfloat16)
    if index:
        names = sorted(tensors)
        half = {n: ("a.safetensors" if i % 2 else "b.safetensors") for i, n in enumerate(names)}
        for f in ("a.safetensors", "b.safetensors"):
            save_file({n: tensors[n] for n in names if half[n] == f}, str(path / f))
        (path / ckpt.INDEX_NAME).write_text(json.dumps({"metadata": {}, "weight_map": half}))
    else:
        save_file(tensors, str(path / "model.safetensors"))
    return _finish(path)


GOOD = {"model.layers.0.self_attn.o_proj.weight": (128, 256), "model.layers.0.mlp.down_proj.weight": (256, 128)}


def _break(kind: str, path: Path) -> Path:
    if kind == "missing":
        return path / "nope"
    src = _handmade(path / "src", GOOD, index=kind.startswith("index"))
    if kind == "no_config":
        (src / "config.json").unlink()
    elif kind == "bad_json":
        (src / "config.json").write_text("{not json")
    elif kind == "no_weights":
        (src / "model.safetensors").unlink()
    elif kind == "index_missing_shard":
        (src / "a.safetensors").unlink()
    elif kind == "index_wrong_tensor":
        idx = json.loads((src / ckpt.INDEX_NAME).read_text())
        idx["weight_map"]["model.layers.0.ghost_proj.weight"] = "a.safetensors"
        (src / ckpt.INDEX_NAME).write_text(json.dumps(idx))
    elif kind == "index_garbage":
        (src / ckpt.INDEX_NAME).write_text('{"weight_map": [1, 2]}')
    elif kind == "already_quantized":
        (src / "config.json").write_text(json.dumps({"quantization_config": {"quant_method": "fp8"}}))
    elif kind == "truncated":
        data = (src / "model.safetensors").read_bytes()
        (src / "model.safetensors").write_bytes(data[: len(data) // 2])
    return src


@pytest.mark.parametrize("kind, message", [
    ("missing", "not a directory"), ("no_config", "no config.json"), ("bad_json", "not valid JSON"),
    ("no_weights", "no \\*.safetensors"), ("index_missing_shard", "shard\\(s\\) missing"),
    ("index_wrong_tensor", "not in the shard"), ("index_garbage", "bad index"),
    ("already_quantized", "already quantized"), ("truncated", "cannot read")])
def test_bad_src_is_refused(tmp_path, kind, message):
    src = _break(kind, tmp_path)
    with pytest.raises(CheckpointError, match=message):
        qt.quantize_checkpoint(src, tmp_path / "dst", progress=False)
    assert not (tmp_path / "dst").exists()


def test_sharded_handmade_index_roundtrip(tmp_path):
    src = _handmade(tmp_path / "src", GOOD, index=True)
    qt.quantize_checkpoint(src, tmp_path / "dst", progress=False)
    _check_common(src, tmp_path / "dst", "fp8-block")


def test_existing_dst(tmp_path):
    src = _handmade(tmp_path / "src", GOOD)
    dst = tmp_path / "dst"
    dst.mkdir()
    qt.quantize_checkpoint(src, dst, progress=False)  # an empty DST is fine
    (dst / "marker").write_text("old")
    with pytest.raises(CheckpointError, match="--overwrite"):
        qt.quantize_checkpoint(src, dst, progress=False)
    assert (dst / "marker").read_text() == "old"
    qt.quantize_checkpoint(src, dst, overwrite=True, progress=False)
    assert not (dst / "marker").exists() and (dst / "model.safetensors").is_file()
    with pytest.raises(CheckpointError, match="would replace SRC"):
        qt.quantize_checkpoint(src, src, overwrite=True, progress=False)


@pytest.mark.parametrize("exc", [RuntimeError("disk full"), KeyboardInterrupt()])
def test_interrupted_write_leaves_nothing(tmp_path, monkeypatch, exc):
    src = _handmade(tmp_path / "src", GOOD)
    dst = tmp_path / "dst"
    dst.mkdir()
    (dst / "marker").write_text("old")
    calls = []
    real_write = ckpt.ShardWriter.write

    def failing_write(self, tensor):
        calls.append(1)
        if len(calls) == 3:
            raise exc
        real_write(self, tensor)

    monkeypatch.setattr(ckpt.ShardWriter, "write", failing_write)
    with pytest.raises(type(exc)):
        qt.quantize_checkpoint(src, dst, overwrite=True, progress=False)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["dst", "src"], "temporary directory left behind"
    assert [p.name for p in dst.iterdir()] == ["marker"], "the old DST must survive a failed run"
    calls.clear()
    with pytest.raises(type(exc)):
        qt.quantize_checkpoint(src, tmp_path / "fresh", progress=False)
    assert not (tmp_path / "fresh").exists()


def test_nvfp4_refuses_k_not_multiple_of_32(tmp_path):
    src = _handmade(tmp_path / "src", {"model.layers.0.mlp.down_proj.weight": (64, 48)})
    with pytest.raises(CheckpointError, match="K % 32 == 0.*down_proj"):
        qt.quantize_checkpoint(src, tmp_path / "dst", fmt="nvfp4", progress=False)
    assert not (tmp_path / "dst").exists() and not list(tmp_path.glob(".dst.tmp-*"))


def test_fused_3d_experts_are_refused(tmp_path):
    src = _handmade(tmp_path / "src", GOOD)
    save_file({"model.layers.0.mlp.experts.gate_up_proj": torch.zeros(4, 256, 128, dtype=torch.bfloat16)},
              str(src / "experts.safetensors"))
    with pytest.raises(CheckpointError, match="3-D tensor"):
        qt.quantize_checkpoint(src, tmp_path / "dst", progress=False)


def test_fp8_ragged_shapes_warn_and_stay_exact(tmp_path, capsys, monkeypatch):
    # Small chunks force the row-chunked path through a ragged last block row.
    monkeypatch.setattr(qt, "CHUNK_ELEMENTS", 128 * 200)
    src = _handmade(tmp_path / "src", {"model.layers.0.mlp.down_proj.weight": (300, 200)})
    qt.quantize_checkpoint(src, tmp_path / "dst", progress=False)
    assert "not a multiple of 128" in capsys.readouterr().err
    _, out, _, _, _ = _check_common(src, tmp_path / "dst", "fp8-block")
    w = _load_src(src)["model.layers.0.mlp.down_proj.weight"]
    q_ref, s_ref = ref.quantize_block_fp8(w)
    assert ref.first_mismatch(out["model.layers.0.mlp.down_proj.weight"], q_ref) is None
    assert ref.first_mismatch(out["model.layers.0.mlp.down_proj.weight_scale_inv"], s_ref) is None


def test_progress_without_tqdm(monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "tqdm", None)  # makes `from tqdm import tqdm` fail
    bar = ckpt.Progress(1000, "quantize", enabled=True)
    for _ in range(10):
        bar.update(100)
    bar.close()
    err = capsys.readouterr().err.splitlines()
    assert err[0] == "quantize: 10%" and err[-1] == "quantize: 100%"
