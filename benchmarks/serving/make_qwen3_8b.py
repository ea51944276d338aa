"""Write a Qwen3-8B-shaped checkpoint with random weights, directly in block-FP8, on the GPU.

Shapes are Qwen3-8B's (hidden 4096, 36 layers, 32 query / 8 KV heads of 128, intermediate 12288,
vocab 151936, rope theta 1e6, untied embeddings); weights are N(0, std) (0.02 by default; lm_head
0.1, see --lm-head-std), norms 1, drawn on the GPU and quantized with
``vllm_blockfp8.reference.quantize_block_fp8`` (128x128 blocks), so the FP8 bytes and scales look
like a real checkpoint's: no zero weights, which would make FP8 tensor cores draw less power and
time optimistically.

Output (OUT/):
  fp8block/  config.json with quantization_config {quant_method fp8, fmt e4m3, activation_scheme
             dynamic, weight_block_size [128, 128]} (the Qwen3-8B-FP8 format; names
             ``*.weight`` fp8 e4m3 + ``*.weight_scale_inv`` fp32), embeddings, norms and lm_head
             in bf16, a tokenizer, sharded safetensors + index. About 9.5 GB at 36 layers.
  bf16/      the same config without quantization_config and the same tokenizer. With
             --bf16-weights also the weights, dequantized from the FP8 ones (the same effective
             weights, about 16.4 GB); without it, serve it with ``--load-format dummy`` (vLLM
             then fills bf16 weights with uniform(-1e-3, 1e-3): random, fine for bf16 and for
             vLLM's online fp8, but NOT for an FP8 checkpoint, where the same fill rounds 98% of
             the e4m3 weights to zero; that is why the FP8 checkpoint is written for real).
  nvfp4/     with --nvfp4: a ModelOpt NVFP4 checkpoint of the same weights, written in the same pass
             as fp8block/, on the same device: each decoder-layer linear, once drawn and quantized to
             block FP8, is dequantized to bf16 (the exact values bf16/ stores with --bf16-weights)
             and quantized again to NVFP4 with tools/quantize.py's own functions: packed e2m1
             ``weight`` uint8 [N, K/2] + ``weight_scale`` e4m3 [N, K/16] + ``weight_scale_2``
             fp32 (the fused q/k/v and gate/up groups' amax / 2688, one per group, through
             ``quantize._nvfp4_chunk``) + ``input_scale`` 1.0; embeddings, norms and lm_head bf16,
             bit-identical to bf16/'s; the exclusion list from ``quantize.make_plan`` /
             ``_exclusions`` and config.json ``quantization_config`` + hf_quant_config.json from
             ``quantize._quant_config`` (``ignore`` / ``exclude_modules`` [lm_head,
             model.embed_tokens]: vLLM's ModelOpt loader then builds lm_head unquantized), the same
             tokenizer and a quantization_report.json. So nvfp4/ is, tensor for tensor and bit for
             bit, what ``quantize_checkpoint(bf16/, nvfp4/, fmt="nvfp4")`` (``python -m
             vllm_blockfp8 quantize --format nvfp4``) writes from the --bf16-weights checkpoint
             (tests/test_serving.py compares the two on a 2-layer tiny shape on the CPU), without
             bf16 weights on disk: --nvfp4 does not need --bf16-weights. The NVFP4 values are the
             FP8 weights rounded again to NVFP4 (the same model up to NVFP4's rounding, not
             bit-equal effective weights). About 6.4 GB at 36 layers; on the GPU the NVFP4 work
             (quantization, its error statistics, writing the shards) adds well under a minute to
             the FP8 pass (estimated: ~0.2 GB of weights per layer, a few ms of GPU time each, the
             6.4 GB of shards to disk), recorded as ``nvfp4.seconds`` in manifest.json.
  manifest.json  sizes and timings (``bytes``, ``seconds`` of the whole pass, and under ``nvfp4``
             its bytes, seconds, error summary and exclusions, or null without --nvfp4); written
             last, so its presence says every checkpoint is complete.

Disk at 36 layers: fp8block/ ~9.5 GB, bf16/ ~16.4 GB with weights, nvfp4/ ~6.4 GB.

The tokenizer is copied from --tokenizer-from (e.g. /tmp/smollm2, a real 49k BPE), or else a
byte-level BPE of --tokenizer-vocab tokens is trained here on stdlib docstrings (offline, seconds).
The model vocabulary (151936) stays larger than any such tokenizer; ids the tokenizer lacks decode
to nothing, so random-weight generations are still valid requests.

usage: python benchmarks/serving/make_qwen3_8b.py OUT [--layers 36] [--bf16-weights] [--nvfp4]
       [--tokenizer-from DIR]
"""

from __future__ import annotations

import argparse
import importlib
import json
import pydoc
import shutil
import sys
import time
from pathlib import Path

import torch

QWEN3_8B = dict(hidden=4096, intermediate=12288, heads=32, kv_heads=8, head_dim=128,
                vocab=151936, layers=36)
QUANT_CONFIG = {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
                "weight_block_size": [128, 128]}
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
                   "vocab.json", "merges.txt", "chat_template.jinja", "generation_config.json")
CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


def train_tokenizer(out: Path, vocab: int):
    """Byte-level BPE trained on stdlib docstrings; chat special tokens as in Qwen's."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    def corpus():
        for name in ("os", "re", "json", "math", "random", "string", "pathlib", "argparse",
                     "collections", "functools", "itertools", "logging", "textwrap", "typing"):
            yield pydoc.render_doc(importlib.import_module(name), renderer=pydoc.plaintext)

    tk = Tokenizer(models.BPE())
    tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tk.decoder = decoders.ByteLevel()
    tk.train_from_iterator(corpus(), trainers.BpeTrainer(
        vocab_size=vocab, special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    tok = PreTrainedTokenizerFast(tokenizer_object=tk, bos_token="<|endoftext|>",
                                  eos_token="<|im_end|>", pad_token="<|endoftext|>")
    tok.chat_template = CHAT_TEMPLATE
    tok.save_pretrained(out)
    return tok


def write_tokenizer(dst: Path, src: Path | None, vocab: int):
    from transformers import AutoTokenizer

    if src is None:
        return train_tokenizer(dst, vocab)
    for name in TOKENIZER_FILES:
        if (src / name).exists():
            shutil.copy(src / name, dst / name)
    return AutoTokenizer.from_pretrained(dst)


def write_config(dst: Path, shape: dict, tok, quantized: bool) -> None:
    from transformers import Qwen3Config

    cfg = Qwen3Config(
        vocab_size=shape["vocab"], hidden_size=shape["hidden"],
        intermediate_size=shape["intermediate"], num_hidden_layers=shape["layers"],
        num_attention_heads=shape["heads"], num_key_value_heads=shape["kv_heads"],
        head_dim=shape["head_dim"], max_position_embeddings=40960, rope_theta=1e6,
        rms_norm_eps=1e-6, tie_word_embeddings=False, max_window_layers=shape["layers"],
        bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id)
    cfg.architectures = ["Qwen3ForCausalLM"]
    cfg.dtype = "bfloat16"
    cfg.save_pretrained(dst)
    if quantized:
        data = json.loads((dst / "config.json").read_text())
        data["quantization_config"] = QUANT_CONFIG
        (dst / "config.json").write_text(json.dumps(data, indent=2, sort_keys=True))


class ShardWriter:
    """Collects CPU tensors and writes ~shard_bytes safetensors files plus the index."""

    def __init__(self, out: Path, shard_bytes: int):
        self.out, self.shard_bytes = out, shard_bytes
        self.pending, self.pending_bytes, self.files, self.weight_map = {}, 0, [], {}
        self.total = 0

    def add(self, name: str, t: torch.Tensor) -> None:
        t = t.contiguous().cpu()
        self.pending[name] = t
        self.pending_bytes += t.numel() * t.element_size()
        if self.pending_bytes >= self.shard_bytes:
            self.flush()

    def flush(self) -> None:
        from safetensors.torch import save_file

        if not self.pending:
            return
        fname = f"model-{len(self.files) + 1:05d}.safetensors"
        save_file(self.pending, self.out / fname, metadata={"format": "pt"})
        self.files.append(fname)
        self.weight_map.update({n: fname for n in self.pending})
        self.total += self.pending_bytes
        self.pending, self.pending_bytes = {}, 0

    def close(self) -> int:
        self.flush()
        index = {"metadata": {"total_size": self.total}, "weight_map": self.weight_map}
        (self.out / "model.safetensors.index.json").write_text(json.dumps(index, indent=2))
        return self.total


def linear_shapes(s: dict) -> dict[str, tuple[int, int]]:
    """[N, K] of every linear weight of one decoder layer, by its HF name."""
    q, kv = s["heads"] * s["head_dim"], s["kv_heads"] * s["head_dim"]
    h, i = s["hidden"], s["intermediate"]
    return {"self_attn.q_proj": (q, h), "self_attn.k_proj": (kv, h), "self_attn.v_proj": (kv, h),
            "self_attn.o_proj": (h, q), "mlp.gate_proj": (i, h), "mlp.up_proj": (i, h),
            "mlp.down_proj": (h, i)}


def nvfp4_quantize(w: torch.Tensor, group_amax: float):
    """tools/quantize.py's ``_nvfp4_chunk`` (reference.quantize_nvfp4 with the fused group's global
    scale) on w's device: it makes its extra amax row with a plain ``torch.zeros``, on the CPU unless
    a device context says otherwise, so the context puts it beside w and the tool's own function runs
    on the GPU unchanged. Returns (packed uint8 [N, K/2], scale e4m3 [N, K/16], global_scale fp32)."""
    from vllm_blockfp8.tools.quantize import _nvfp4_chunk

    with torch.device(w.device):
        return _nvfp4_chunk(w, group_amax)


class Nvfp4Copy:
    """nvfp4/'s tensors, made from the same weights in the same pass, through tools/quantize.py.

    ``dense`` takes a tensor kept as is (embeddings, norms, lm_head); ``linears`` takes one decoder
    layer's linear weights (bf16, the values bf16/ stores) and quantizes each with the global scale
    of its fused group (``quantize.scale_group``), as ``quantize_checkpoint`` does. Whole tensors
    rather than its row chunks: rows are quantized independently, so the bytes are the same.
    ``finish`` writes config.json, hf_quant_config.json, the side files and the report.
    """

    def __init__(self, out: Path, shard_bytes: int):
        self.out, self.writer = out, ShardWriter(out, shard_bytes)
        self.sources, self.rows, self.quantized, self.seconds = [], [], set(), 0.0

    def _source(self, name: str, t: torch.Tensor) -> None:
        from vllm_blockfp8.tools.checkpoint import TORCH_TO_ST, SourceTensor

        self.sources.append(SourceTensor(name, self.out, tuple(t.shape), TORCH_TO_ST[t.dtype]))

    def dense(self, name: str, t: torch.Tensor) -> None:
        self._source(name, t)
        self.writer.add(name, t)

    def linears(self, weights: dict[str, torch.Tensor]) -> None:
        from vllm_blockfp8 import reference as ref
        from vllm_blockfp8.tools import quantize as qt

        t0 = time.time()
        amax: dict[str, float] = {}
        for name, w in weights.items():  # quantize._group_amax's pass, over whole tensors
            key = qt.scale_group(name[: -len(".weight")])
            amax[key] = max(amax.get(key, 0.0), float(w.float().abs().amax()))
        for name, w in weights.items():
            module = name[: -len(".weight")]
            self._source(name, w)
            q, sc, gs = nvfp4_quantize(w, amax[qt.scale_group(module)])
            stats = qt._ErrorStats()
            stats.add(w, ref.dequantize_nvfp4(q, sc, gs))
            self.writer.add(name, q)
            self.writer.add(f"{module}.weight_scale", sc)
            self.writer.add(f"{module}.weight_scale_2", gs.reshape(()).float())
            self.writer.add(f"{module}.input_scale", torch.tensor(qt.NVFP4_INPUT_SCALE, dtype=torch.float32))
            self.rows.append({"name": module, "shape": list(w.shape), **stats.result()})
            self.quantized.add(name)
        self.seconds += time.time() - t0

    def finish(self, bf16_dir: Path) -> dict:
        """Close the shards; config from bf16_dir's config.json, side files (tokenizer) copied from it."""
        from vllm_blockfp8.tools import quantize as qt
        from vllm_blockfp8.tools.checkpoint import copy_side_files

        t0 = time.time()
        total = self.writer.close()
        decisions, warnings = qt.make_plan(self.sources, "nvfp4", ())
        planned = {t.name for t, _, q in decisions if q}
        if planned != self.quantized:  # the tool would quantize other tensors than we did
            raise SystemExit(f"nvfp4: quantized {sorted(self.quantized ^ planned)[:3]} unlike the quantizer")
        exclude = qt._exclusions(decisions)
        qcfg, hf_quant = qt._quant_config("nvfp4", exclude)
        config = json.loads((bf16_dir / "config.json").read_text())
        copied = copy_side_files(bf16_dir, self.out)
        (self.out / "config.json").write_text(json.dumps({**config, "quantization_config": qcfg}, indent=2) + "\n")
        (self.out / "hf_quant_config.json").write_text(json.dumps(hf_quant, indent=2) + "\n")
        report = {"format": "nvfp4", "src": f"{Path(__file__).name}: the FP8 weights dequantized to bf16, in "
                  "its pass", "shards": len(self.writer.files), "copied_files": copied, "not_quantized": exclude,
                  "warnings": warnings, "nvfp4_input_scale": qt.NVFP4_INPUT_SCALE, "layers": self.rows}
        (self.out / qt.REPORT_NAME).write_text(json.dumps(report, indent=2) + "\n")
        self.seconds += time.time() - t0
        rms = [r["rms_rel"] for r in self.rows]
        return {"bytes": total, "seconds": round(self.seconds, 1), "quantized_weights": len(rms),
                "rms_rel_mean": sum(rms) / max(len(rms), 1), "rms_rel_max": max(rms, default=0.0),
                "not_quantized": exclude}


def write_weights(fp8: ShardWriter, bf16: ShardWriter | None, s: dict, dev: str,
                  std: float, head_std: float, seed: int, nvfp4: Nvfp4Copy | None = None) -> None:
    """Draw every weight once on dev, in a fixed order (same seed, same weights, whatever is written)."""
    from vllm_blockfp8.reference import dequantize_block_fp8, quantize_block_fp8

    gen = torch.Generator(device=dev)
    gen.manual_seed(seed)
    writers = [w for w in (fp8, bf16) if w is not None]

    def dense(name: str, shape: tuple[int, ...], fill: float | None = None,
              scale: float = std) -> None:
        if fill is None:
            t = (torch.randn(shape, generator=gen, device=dev) * scale).to(torch.bfloat16)
        else:
            t = torch.full(shape, fill, dtype=torch.bfloat16, device=dev)
        t = t.cpu()  # once for every writer
        for w in writers:
            w.add(name, t)
        if nvfp4 is not None:
            nvfp4.dense(name, t)

    dense("model.embed_tokens.weight", (s["vocab"], s["hidden"]))
    for layer in range(s["layers"]):
        pre = f"model.layers.{layer}."
        layer_bf16 = {}
        for name, (n, k) in linear_shapes(s).items():
            w = torch.randn((n, k), generator=gen, device=dev) * std
            q, sc = quantize_block_fp8(w, QUANT_CONFIG["weight_block_size"][0])
            fp8.add(pre + name + ".weight", q)
            fp8.add(pre + name + ".weight_scale_inv", sc)
            if bf16 is not None or nvfp4 is not None:
                # bf16/'s weights: the FP8 ones dequantized and rounded to bf16; NVFP4 is made from these.
                layer_bf16[pre + name + ".weight"] = dequantize_block_fp8(q, sc).to(torch.bfloat16)
            if bf16 is not None:
                bf16.add(pre + name + ".weight", layer_bf16[pre + name + ".weight"])
        if nvfp4 is not None:  # after the whole layer: q/k/v and gate/up share one global scale
            nvfp4.linears(layer_bf16)
        del layer_bf16
        dense(pre + "input_layernorm.weight", (s["hidden"],), 1.0)
        dense(pre + "post_attention_layernorm.weight", (s["hidden"],), 1.0)
        dense(pre + "self_attn.q_norm.weight", (s["head_dim"],), 1.0)
        dense(pre + "self_attn.k_norm.weight", (s["head_dim"],), 1.0)
    dense("model.norm.weight", (s["hidden"],), 1.0)
    dense("lm_head.weight", (s["vocab"], s["hidden"]), scale=head_std)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--layers", type=int, default=QWEN3_8B["layers"],
                    help="decoder layers (36 = Qwen3-8B; fewer for quick runs)")
    ap.add_argument("--bf16-weights", action="store_true",
                    help="also write bf16 weights (dequantized FP8) instead of relying on "
                         "--load-format dummy for the bf16 baseline")
    ap.add_argument("--nvfp4", action="store_true",
                    help="also write nvfp4/, a ModelOpt NVFP4 checkpoint of the same weights, quantized in "
                         "the same pass on --device with vllm_blockfp8.tools.quantize's functions (what "
                         "its quantize_checkpoint would write from the --bf16-weights checkpoint; "
                         "~6.4 GB at 36 layers)")
    ap.add_argument("--tokenizer-from", type=Path, help="copy this checkpoint's tokenizer")
    ap.add_argument("--tokenizer-vocab", type=int, default=4096,
                    help="vocabulary of the tokenizer trained here when no --tokenizer-from")
    ap.add_argument("--std", type=float, default=0.02, help="std of every other weight")
    ap.add_argument("--lm-head-std", type=float, default=0.1,
                    help="std of lm_head: 0.1 gives logits of std ~6 over the normalized hidden "
                         "state, so next-token distributions are peaked like a trained model's "
                         "and fidelity metrics mean something (0.02 leaves them near uniform); "
                         "no effect on speed")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--shard-gb", type=float, default=4.0)
    ap.add_argument("--shape", type=json.loads, default={},
                    help='override Qwen3-8B sizes for tests, e.g. \'{"hidden": 256, '
                         '"intermediate": 512, "heads": 2, "kv_heads": 1, "vocab": 8192}\'')
    a = ap.parse_args(argv)
    shard = int(a.shard_gb * 2**30)
    shape = {**QWEN3_8B, **a.shape, "layers": a.layers}
    t0 = time.time()
    manifest_path = a.out / "manifest.json"
    if manifest_path.exists():  # rewritten last: its presence says the checkpoints are complete
        manifest_path.unlink()
    dirs = {"fp8block": a.out / "fp8block", "bf16": a.out / "bf16"}
    # nvfp4/ is stale (other weights) whether remade or not; the others are leftovers of older versions
    for d in [a.out / "nvfp4", *a.out.glob(".nvfp4.tmp-*"), *a.out.glob(".nvfp4.old-*")]:
        shutil.rmtree(d, ignore_errors=True)
    if a.nvfp4:
        dirs["nvfp4"] = a.out / "nvfp4"
    for d in dirs.values():
        if d.exists():
            shutil.rmtree(d)
        d.mkdir(parents=True)
    tok = write_tokenizer(dirs["fp8block"], a.tokenizer_from, a.tokenizer_vocab)
    if len(tok) > shape["vocab"]:
        raise SystemExit(f"tokenizer has {len(tok)} tokens > model vocab {shape['vocab']}")
    for name in TOKENIZER_FILES:
        if (dirs["fp8block"] / name).exists():
            shutil.copy(dirs["fp8block"] / name, dirs["bf16"] / name)
    write_config(dirs["fp8block"], shape, tok, quantized=True)
    write_config(dirs["bf16"], shape, tok, quantized=False)
    fp8 = ShardWriter(dirs["fp8block"], shard)
    bf16 = ShardWriter(dirs["bf16"], shard) if a.bf16_weights else None
    nvfp4 = Nvfp4Copy(dirs["nvfp4"], shard) if a.nvfp4 else None
    with torch.no_grad():
        write_weights(fp8, bf16, shape, a.device, a.std, a.lm_head_std, a.seed, nvfp4)
    sizes = {"fp8block": fp8.close(), "bf16": bf16.close() if bf16 else 0}
    nv = nvfp4.finish(dirs["bf16"]) if nvfp4 else None
    if nv:
        sizes["nvfp4"] = nv["bytes"]
    manifest = {"shape": shape, "quantization_config": QUANT_CONFIG, "std": a.std,
                "lm_head_std": a.lm_head_std,
                "seed": a.seed, "tokenizer_tokens": len(tok),
                "tokenizer_from": str(a.tokenizer_from) if a.tokenizer_from else "trained",
                "bytes": sizes, "bf16_load_format": "safetensors" if bf16 else "dummy",
                "device": str(a.device), "seconds": round(time.time() - t0, 1), "nvfp4": nv}
    manifest_path.write_text(json.dumps(manifest, indent=2))
    print(f"qwen3-8b-shaped, {shape['layers']} layers: fp8block {sizes['fp8block'] / 1e9:.2f} GB, "
          f"bf16 {'%.2f GB' % (sizes['bf16'] / 1e9) if bf16 else 'config only (dummy load)'}"
          + (f", nvfp4 {nv['bytes'] / 1e9:.2f} GB ({nv['quantized_weights']} weights, {nv['seconds']} s of "
             f"the pass, mean rms_rel {nv['rms_rel_mean']:.3e})" if nv else "")
          + f", tokenizer {len(tok)} tokens, {manifest['seconds']} s -> {a.out}", flush=True)
    return 0

if __name__ == "__main__":
    sys.exit(main())
