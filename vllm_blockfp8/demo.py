"""The built-in demo: a tiny random-weight Qwen3 checkpoint (block FP8, or ModelOpt NVFP4 with
``--format nvfp4``) served by vLLM.

On a supported GPU (SM89+, with vLLM installed) it runs ``vllm.LLM(..., quantization="blockfp8")``
with CUDA graphs and torch.compile, prints the generated token ids and which kernel row served
each layer shape. Elsewhere it says why and runs every layer shape through the same op entry
points on the CPU reference backend, checking each against the reference.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path

import torch

from . import ops, reference

# A Qwen3-style model small enough to write in a second, with every projection a multiple of 128.
TINY_QWEN3 = {
    "architectures": ["Qwen3ForCausalLM"],
    "model_type": "qwen3",
    "hidden_size": 1024,
    "intermediate_size": 3072,
    "num_attention_heads": 8,
    "num_key_value_heads": 4,
    "head_dim": 128,
    "num_hidden_layers": 2,
    "vocab_size": 4096,
    "max_position_embeddings": 2048,
    "rms_norm_eps": 1e-6,
    "rope_theta": 1000000.0,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
    "bos_token_id": 1,
    "eos_token_id": 2,
    "quantization_config": {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
                            "weight_block_size": [128, 128]},
}

FORMATS = ("fp8-block", "nvfp4")
NVFP4_CONFIG = {"quant_method": "modelopt", "quant_algo": "NVFP4", "group_size": reference.NVFP4_GROUP,
                "kv_cache_quant_algo": None, "ignore": ["lm_head"]}

PROMPTS = ([11, 42, 7, 99, 1000, 5, 17, 256], [3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5, 8, 9, 7, 9])


def linear_shapes(cfg: dict) -> dict[str, tuple[int, int]]:
    """(N, K) of each projection as vLLM fuses them (qkv, gate_up)."""
    h, i, d = cfg["hidden_size"], cfg["intermediate_size"], cfg["head_dim"]
    q, kv = cfg["num_attention_heads"] * d, cfg["num_key_value_heads"] * d
    return {"qkv_proj": (q + 2 * kv, h), "o_proj": (h, q), "gate_up_proj": (2 * i, h), "down_proj": (h, i)}


def write_checkpoint(path: Path, cfg: dict = TINY_QWEN3, seed: int = 0, fmt: str = "fp8-block") -> Path:
    """Write random bf16 weights quantized with the reference quantizer: block FP8, or ModelOpt NVFP4
    (each projection its own global scale; the plugin keeps one per fused shard)."""
    from safetensors.torch import save_file

    if fmt not in FORMATS:
        raise ValueError(f"fmt must be one of {FORMATS}, got {fmt!r}")
    if fmt == "nvfp4":
        cfg = {**cfg, "quantization_config": NVFP4_CONFIG}

    gen = torch.Generator().manual_seed(seed)
    h, i, d, v = cfg["hidden_size"], cfg["intermediate_size"], cfg["head_dim"], cfg["vocab_size"]
    q, kv = cfg["num_attention_heads"] * d, cfg["num_key_value_heads"] * d

    def randn(*shape, std=0.02):
        return torch.randn(*shape, generator=gen) * std

    tensors = {"model.embed_tokens.weight": randn(v, h).bfloat16(), "lm_head.weight": randn(v, h).bfloat16(),
               "model.norm.weight": torch.ones(h, dtype=torch.bfloat16)}
    projections = {"self_attn.q_proj": (q, h), "self_attn.k_proj": (kv, h), "self_attn.v_proj": (kv, h),
                   "self_attn.o_proj": (h, q), "mlp.gate_proj": (i, h), "mlp.up_proj": (i, h),
                   "mlp.down_proj": (h, i)}
    for layer in range(cfg["num_hidden_layers"]):
        pre = f"model.layers.{layer}."
        for name, (n, k) in projections.items():
            if fmt == "nvfp4":
                packed, scale, global_scale = reference.quantize_nvfp4(randn(n, k))
                tensors[pre + name + ".weight"] = packed
                tensors[pre + name + ".weight_scale"] = scale
                tensors[pre + name + ".weight_scale_2"] = global_scale.reshape(())
                tensors[pre + name + ".input_scale"] = torch.ones((), dtype=torch.float32)
            else:
                w, s = reference.quantize_block_fp8(randn(n, k))
                tensors[pre + name + ".weight"] = w
                tensors[pre + name + ".weight_scale_inv"] = s
        for norm in ("input_layernorm", "post_attention_layernorm"):
            tensors[pre + norm + ".weight"] = torch.ones(h, dtype=torch.bfloat16)
        for norm in ("self_attn.q_norm", "self_attn.k_norm"):
            tensors[pre + norm + ".weight"] = torch.ones(d, dtype=torch.bfloat16)
    path.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(path / "model.safetensors"), metadata={"format": "pt"})
    (path / "config.json").write_text(json.dumps(cfg, indent=2))
    (path / "generation_config.json").write_text(json.dumps({"bos_token_id": 1, "eos_token_id": 2}))
    return path


def gpu_unsupported_reason() -> str | None:
    """Why this machine cannot run the vLLM demo, or None: what ops.kernels_unavailable_reason()
    names (no GPU, no compiled extension), an arch below SM89, or no vLLM."""
    why = ops.kernels_unavailable_reason()
    if why is not None:
        return why
    major, minor = torch.cuda.get_device_capability()
    if major * 10 + minor < 89:
        return f"the GPU is SM{major}{minor}; blockfp8 needs SM89 or newer"
    try:
        import vllm  # noqa: F401
    except ImportError:
        return "vLLM is not installed (pip install 'vllm>=0.26')"
    return None


# The tiny model needs a few MiB of KV cache. A fixed size skips vLLM's memory profiling, which assumes no other
# process on the GPU allocates or frees memory meanwhile (it fails its start-up otherwise), so the demo can start
# beside other work on the same GPU.
DEMO_KV_CACHE_BYTES = 256 << 20


def kv_cache_args() -> dict:
    """``kv_cache_memory_bytes`` where this vLLM has it (0.11 and newer), else nothing (profiling decides)."""
    from vllm.engine.arg_utils import EngineArgs

    fields = getattr(EngineArgs, "__dataclass_fields__", {})
    return {"kv_cache_memory_bytes": DEMO_KV_CACHE_BYTES} if "kv_cache_memory_bytes" in fields else {}


LOGPROBS_PREFIX = "logprobs "


def _logprob_dict(entry) -> dict[str, float]:
    """{token id as text: logprob} of one position's vLLM logprobs (token id -> Logprob)."""
    return {str(int(tok)): float(lp.logprob) for tok, lp in (entry or {}).items()}


def logprobs_line(prompt: list, output) -> str:
    """One JSON line: the prompt, the generated ids, each prompt position's logprobs from the second on (the prompt's
    own token among them: vLLM adds it to the top N) and each generated step's (the sampled token among them)."""
    record = {"prompt": list(prompt), "generated": [int(t) for t in output.outputs[0].token_ids],
              "prompt_logprobs": [_logprob_dict(e) for e in (output.prompt_logprobs or [])[1:]],
              "step_logprobs": [_logprob_dict(e) for e in (output.outputs[0].logprobs or [])]}
    return LOGPROBS_PREFIX + json.dumps(record, sort_keys=True)


def parse_logprobs(text: str) -> list[dict]:
    """The records ``logprobs_line`` printed, in prompt order."""
    return [json.loads(line[len(LOGPROBS_PREFIX):]) for line in text.splitlines() if line.startswith(LOGPROBS_PREFIX)]


def logprob_gaps(ours: list[dict], ref: list[dict], min_shared: int = 3) -> tuple[float, list[str]]:
    """The largest |logprob difference| between two runs of the demo on the same prompts, and what makes them
    incomparable. Compared: every prompt position's logprob of the prompt's own token and of every token both runs
    report there; each generated step while the generated ids so far agree (greedy ties may flip a token, after
    which the contexts differ), again over the tokens both report. A position where the runs share fewer than
    ``min_shared`` reported tokens is a problem: a wrong kernel reorders the top N, a right one moves it by noise."""
    problems: list[str] = []
    if [r["prompt"] for r in ours] != [r["prompt"] for r in ref]:
        return float("inf"), ["the runs did not score the same prompts"]
    worst = 0.0
    for i, (a, b) in enumerate(zip(ours, ref)):
        positions = list(zip(a["prompt_logprobs"], b["prompt_logprobs"]))
        if len(positions) != len(a["prompt"]) - 1 or len(b["prompt_logprobs"]) != len(a["prompt"]) - 1:
            problems.append(f"prompt {i}: {len(a['prompt_logprobs'])} and {len(b['prompt_logprobs'])} prompt "
                            f"positions scored, {len(a['prompt']) - 1} expected")
        steps = 0
        while (steps < min(len(a["step_logprobs"]), len(b["step_logprobs"]))
               and a["generated"][:steps] == b["generated"][:steps]):
            steps += 1
        if steps == 0:
            problems.append(f"prompt {i}: no generated step to compare")
        for where, (x, y) in [(f"position {p + 1}", pair) for p, pair in enumerate(positions)] + \
                [(f"step {s}", (a["step_logprobs"][s], b["step_logprobs"][s])) for s in range(steps)]:
            shared = x.keys() & y.keys()
            if len(shared) < min_shared:
                problems.append(f"prompt {i} {where}: {len(shared)} tokens in both runs' reports")
            worst = max([worst] + [abs(x[t] - y[t]) for t in shared])
    return worst, problems


def run_vllm(model_dir: Path, max_tokens: int, attention_backend: str | None = None, fmt: str = "fp8-block",
             logprobs: int = 0, enforce_eager: bool = False) -> None:
    os.environ.setdefault("BLOCKFP8_LOG_ROWS", "1")
    from vllm import LLM, SamplingParams

    # The backend only where asked: vLLM's own choice otherwise (its argument name is vLLM's).
    backend = {"attention_backend": attention_backend} if attention_backend else {}
    llm = LLM(model=str(model_dir), quantization="blockfp8", skip_tokenizer_init=True, max_model_len=512,
              gpu_memory_utilization=0.3, seed=0, enforce_eager=enforce_eager, **backend, **kv_cache_args(),
              **({"max_logprobs": logprobs} if logprobs > 20 else {}))
    scored = {"logprobs": logprobs, "prompt_logprobs": logprobs} if logprobs > 0 else {}
    params = SamplingParams(max_tokens=max_tokens, temperature=0.0, detokenize=False, **scored)
    outputs = llm.generate([{"prompt_token_ids": list(p)} for p in PROMPTS], params)
    for prompt, out in zip(PROMPTS, outputs):
        print(f"prompt {list(prompt)} -> generated {list(out.outputs[0].token_ids)}")
        if logprobs > 0:
            print(logprobs_line(prompt, out))
    family = "nvfp4" if fmt == "nvfp4" else "linear"
    print(f"\nkernel rows per layer shape ({family} table of this GPU):")
    for name, (n, k) in linear_shapes(TINY_QWEN3).items():
        picks = {m: ops.selected_row(family, m, n, k) for m in (1, 8, len(PROMPTS[1]) + len(PROMPTS[0]), 512)}
        extra = "" if fmt == "nvfp4" else f" (gemv row at M=1: {ops.selected_row('gemv', 1, n, k)})"
        print(f"  {name:13s} N={n:5d} K={k:5d}: " + ", ".join(f"M={m}: {r}" for m, r in picks.items()) + extra)


def run_reference(max_tokens: int, fmt: str = "fp8-block") -> None:
    """Each layer shape through the format's op on the CPU, checked against the reference."""
    del max_tokens
    gen = torch.Generator().manual_seed(0)
    for name, (n, k) in linear_shapes(TINY_QWEN3).items():
        w = torch.randn(n, k, generator=gen) * 0.02
        for m in (1, 8):
            x = torch.randn(m, k, generator=gen).bfloat16()
            if fmt == "nvfp4":
                packed, scale, gs = reference.quantize_nvfp4(w)
                # The weight as the vLLM layer stores it; the reference reads ModelOpt's packing.
                b, b_scale, packing = ops.nvfp4_layer_weight(packed, scale)
                out = ops.nvfp4_linear(x, b, b_scale, gs.reshape(1), packing=packing)
                ref = reference.nvfp4_linear_ref(x, packed, scale, gs)
            else:
                q, s = reference.quantize_block_fp8(w)
                out = ops.blockfp8_linear(x, q, s)
                ref = reference.linear_ref(x, q, s, quantize_activations=False)
            reference.assert_close_to_ref(out, ref, name)
        print(f"  {name:13s} N={n:5d} K={k:5d}: reference backend, M=1 and M=8 match the reference")


def main(args=None) -> int:
    model_dir = getattr(args, "model_dir", None)
    keep = bool(getattr(args, "keep", False))
    max_tokens = int(getattr(args, "max_tokens", None) or 16)
    attention_backend = getattr(args, "attention_backend", None)
    fmt = getattr(args, "format", None) or "fp8-block"
    logprobs = int(getattr(args, "logprobs", None) or 0)
    enforce_eager = bool(getattr(args, "enforce_eager", False))
    reason = gpu_unsupported_reason()
    if reason is not None:
        print(f"blockfp8 demo: {reason}, so vLLM is not started; running every layer shape of the demo "
              "model through the reference backend instead.")
        run_reference(max_tokens, fmt)
        return 0
    workdir = Path(model_dir) if model_dir else Path(tempfile.mkdtemp(prefix="blockfp8-demo-"))
    try:
        write_checkpoint(workdir, fmt=fmt)
        print(f"blockfp8 demo: wrote a random-weight {fmt} Qwen3 checkpoint to {workdir}")
        run_vllm(workdir, max_tokens, attention_backend, fmt, logprobs, enforce_eager)
    finally:
        if not keep and not model_dir:
            shutil.rmtree(workdir, ignore_errors=True)
    return 0
