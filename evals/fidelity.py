"""Model-free fidelity: how far each quantized variant's next-token distributions move from bf16.

Same weights, several ways to run them (evals.VARIANTS): bf16 (reference), this plugin's blockfp8,
vLLM's own block-FP8 path on the same checkpoint, vLLM's online per-tensor fp8 on the bf16
checkpoint, and the block-FP8 weights dequantized to bf16 (weight rounding alone, no activation
quantization, no FP8 kernel: the floor the W8A8 variants can approach).

For every built-in prompt each variant records, in its own subprocess, the top-k log-probabilities
at every prompt position (``prompt_logprobs``) and at the next position, and a greedy 32-token
continuation. Metrics against bf16, over all positions:

* ``kl``: KL(p_bf16 || q_variant) over the partition {each of p's top-k tokens, everything else}.
  By the data-processing inequality this is a lower bound of the full-vocabulary KL, and it is the
  full KL restricted to where p has its mass. A token of p's top-k missing from q's top-k gets q's
  k-th largest probability (an upper bound of its true q); ``miss`` says how often.
* ``top1``: argmax agreement; ``next_top1``: the same at the next-token position only.
* ``greedy_same``: share of prompts whose 32 greedy tokens are identical; ``greedy_prefix``: mean
  share of tokens before the first divergence; ``greedy_tok``: position-wise agreement.
* ``kl_se``, ``top1_se``: standard errors of the means, prompts as clusters (positions of one prompt are not
  independent). ``--paired A:B`` compares two variants on the same positions: the mean of KL(ref||A) - KL(ref||B)
  and its standard error, "equal" when within 2 of them.

usage (repo root, after ``. /tmp/vk_tools/env.sh``):
  python -m evals.fidelity --bf16 /tmp/smollm2 --fp8block /tmp/smollm2-fp8 --out $OUT/fidelity
  python -m evals.fidelity --bf16 B --fp8block F --out O --variants blockfp8,blockfp8-tp2 \
      --reference blockfp8                      # tensor parallel 2 against 1 (two GPUs)
  python -m evals.fidelity ... --variants bf16,blockfp8,blockfp8-sm89 --paired blockfp8-sm89:blockfp8
                                                # the SM89 GEMM table against the SM90 one, paired
  python -m evals.fidelity ... --variants bf16,blockfp8-nvfp4,vllm-nvfp4 --paired blockfp8-nvfp4:vllm-nvfp4
                                                # NVFP4: ours against vLLM's Marlin on one checkpoint
  python -m evals.fidelity --self-test          # the KL math on synthetic distributions, CPU only
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
import subprocess
import sys
import time
from pathlib import Path

from evals import (OWN_VARIANTS, VARIANTS, collect, finish_worker, llm_kwargs, markdown_table,
                   run_worker, tail)

PROMPTS = [
    "The capital of France is",
    "The largest planet in the solar system is",
    "Water boils at a temperature of",
    "def fibonacci(n):\n    if n < 2:\n        return n\n    return",
    "import numpy as np\nx = np.arange(10)\nprint(x.",
    "for i in range(10):\n    print(",
    "SELECT name, age FROM users WHERE",
    "Once upon a time, in a small village by the sea, there lived",
    "The quick brown fox jumps over the",
    "1, 2, 3, 4, 5, 6, 7,",
    "Monday, Tuesday, Wednesday,",
    "January, February, March, April,",
    "Question: What is 12 + 7?\nAnswer:",
    "Question: What is 9 times 8?\nAnswer:",
    "The chemical symbol for gold is",
    "Shakespeare wrote the play Romeo and",
    "To make a cup of tea, first boil the water, then",
    "The opposite of hot is",
    "A recipe for pancakes needs flour, eggs, milk and",
    "In machine learning, a neural network is",
    "The theory of relativity was developed by",
    "Photosynthesis is the process by which plants",
    "The mitochondria is the powerhouse of the",
    "Paris is to France as Berlin is to",
    "Translate to French: Good morning! ->",
    "La capitale de l'Italie est",
    "My favourite colour is blue because",
    "The stock market fell sharply today after",
    "<html>\n<head>\n<title>",
    '{"name": "Alice", "age": 30, "city": "',
    "Dear Sir or Madam,\nI am writing to",
    "The square root of 144 is",
    "Roses are red, violets are",
    "The first president of the United States was",
    "int main(void) {\n    printf(",
    "Summary: The meeting covered three topics. First,",
    "Step 1: Preheat the oven to 180 degrees. Step 2:",
    "The Great Wall of China is located in",
    "She opened the door and saw",
    "An apple a day keeps the",
]
GREEDY_TOKENS = 32


# ------------------------------------------------------------------------------------------------
# Metrics (pure Python, CPU)
# ------------------------------------------------------------------------------------------------


def partition_kl(p: dict[int, float], q: dict[int, float], k: int) -> tuple[float, int]:
    """KL(p || q) over {p's top-k tokens, the rest}; p, q map token -> log-prob. (kl, missing)."""
    top = sorted(p.items(), key=lambda t: -t[1])[:k]
    # q's k-th largest reported value bounds any token outside its top-k (prompt_logprobs also
    # lists the actual prompt token, which can rank far lower, so min(q) is not that bound).
    floor = sorted(q.values(), reverse=True)[: k][-1]
    kl = p_sum = q_sum = 0.0
    missing = 0
    for tok, lp in top:
        lq = q.get(tok)
        if lq is None:
            lq, missing = floor, missing + 1
        pp = math.exp(lp)
        kl += pp * (lp - lq)
        p_sum += pp
        q_sum += math.exp(lq)
    p_rest = max(1.0 - p_sum, 0.0)
    q_rest = max(1.0 - q_sum, 1e-12)
    if p_rest > 0.0:
        kl += p_rest * math.log(p_rest / q_rest)
    return kl, missing


def argmax(d: dict[int, float]) -> int:
    return max(d.items(), key=lambda t: t[1])[0]


def clustered_mean(groups: list[list[float]]) -> tuple[float, float]:
    """(mean over every value, its standard error) where values come in correlated groups (the positions of one
    prompt): the cluster-robust estimate sqrt(sum_g (sum_{i in g} (x_i - mean))^2) / N, which needs no independence
    inside a group. NaN without values; 0 error with a single group is not claimed (NaN)."""
    n = sum(len(g) for g in groups)
    if n == 0:
        return float("nan"), float("nan")
    mean = sum(sum(g) for g in groups) / n
    if len([g for g in groups if g]) < 2:
        return mean, float("nan")
    return mean, math.sqrt(sum(sum(x - mean for x in g) ** 2 for g in groups)) / n


def position_kls(ref: dict, var: dict, k: int) -> list[list[float] | None]:
    """KL(ref || var) at every position, one entry per prompt in the reference's order: None where the variant's
    prompt tokens differ, so two variants' lists stay aligned prompt by prompt."""
    return [None if r["prompt_ids"] != v["prompt_ids"] else
            [partition_kl({int(t): lp for t, lp in pr}, {int(t): lp for t, lp in pv}, k)[0]
             for pr, pv in zip(r["positions"], v["positions"])]
            for r, v in zip(ref["prompts"], var["prompts"])]


def paired(ref: dict, a: dict, b: dict, k: int) -> dict:
    """Variant a against variant b, both against the reference on the same positions: the mean per-position
    difference KL(ref || a) - KL(ref || b) and its cluster-robust standard error; ``equal`` when |difference| <= 2
    standard errors (#48's test for the SM89 table against the SM90 one)."""
    ka, kb = position_kls(ref, a, k), position_kls(ref, b, k)
    diff, se = clustered_mean([[x - y for x, y in zip(ga, gb)] for ga, gb in zip(ka, kb)
                               if ga is not None and gb is not None])  # prompts both variants tokenized as ref
    return {"kl_diff": diff, "kl_diff_se": se, "equal": bool(abs(diff) <= 2 * se)}


def compare(ref: dict, var: dict, k: int) -> dict:
    """Metrics of one variant's recorded outputs against the reference's."""
    kls, top1, next_top1, missing, n_top = [], [], [], 0, 0
    same, prefix, tok_agree, token_mismatch = [], [], [], 0
    kl_groups, top1_groups = [], []
    for r, v in zip(ref["prompts"], var["prompts"]):
        if r["prompt_ids"] != v["prompt_ids"]:
            token_mismatch += 1
            continue
        kl_groups.append([])
        top1_groups.append([])
        for i, (pr, pv) in enumerate(zip(r["positions"], v["positions"])):
            p = {int(t): lp for t, lp in pr}
            q = {int(t): lp for t, lp in pv}
            kl, miss = partition_kl(p, q, k)
            kls.append(kl)
            kl_groups[-1].append(kl)
            missing += miss
            n_top += min(k, len(p))
            agree = argmax(p) == argmax(q)
            top1.append(agree)
            top1_groups[-1].append(float(agree))
            if i == len(r["positions"]) - 1:
                next_top1.append(agree)
        a, b = r["greedy"], v["greedy"]
        first = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
        same.append(a == b)
        prefix.append(first / max(len(a), 1))
        tok_agree.append(sum(x == y for x, y in zip(a, b)) / max(len(a), 1))
    kls.sort()

    def mean(xs):
        return sum(xs) / len(xs) if xs else float("nan")

    return {
        "positions": len(kls),
        "kl_mean": mean(kls),
        "kl_se": clustered_mean(kl_groups)[1],  # standard error of kl_mean, prompts as clusters
        "top1_se": clustered_mean(top1_groups)[1],
        "kl_p50": kls[len(kls) // 2] if kls else float("nan"),
        "kl_p99": kls[min(len(kls) - 1, int(0.99 * len(kls)))] if kls else float("nan"),
        "kl_max": kls[-1] if kls else float("nan"),
        "top1": mean(top1),
        "next_top1": mean(next_top1),
        "miss": missing / max(n_top, 1),
        "greedy_same": mean(same),
        "greedy_prefix": mean(prefix),
        "greedy_tok": mean(tok_agree),
        "prompt_token_mismatch": token_mismatch,
    }


def self_test() -> int:
    """The KL math on synthetic distributions: exact cases, the lower bound, the missing fill."""
    import random

    rng = random.Random(0)
    vocab, k = 2000, 20

    def log_softmax(xs):
        m = max(xs)
        z = m + math.log(sum(math.exp(x - m) for x in xs))
        return [x - z for x in xs]

    def topk(lp, kk):
        return dict(sorted(enumerate(lp), key=lambda t: -t[1])[:kk])

    logits = [rng.gauss(0, 3) for _ in range(vocab)]
    p = log_softmax(logits)
    assert abs(partition_kl(topk(p, k), topk(p, k), k)[0]) < 1e-12, "KL(p||p) must be 0"
    for noise in (0.01, 0.1, 0.5):
        q = log_softmax([x + rng.gauss(0, noise) for x in logits])
        full = sum(math.exp(a) * (a - b) for a, b in zip(p, q))
        # q reported with all of p's top-k present: partition KL is a lower bound of the full KL.
        q_rep = {t: q[t] for t in topk(p, k)} | topk(q, k)
        part, miss = partition_kl(topk(p, k), q_rep, k)
        assert miss == 0 and -1e-12 <= part <= full + 1e-12, (noise, part, full)
        print(f"noise {noise}: full KL {full:.3e}, partition KL {part:.3e} (lower bound holds)")
    q = log_softmax([x + rng.gauss(0, 2.0) for x in logits])
    part, miss = partition_kl(topk(p, k), topk(q, k), k)
    assert miss > 0 and part > 0
    print(f"heavy noise: partition KL {part:.3f} with {miss}/{k} of p's top-k missing in q")
    ref = {"prompts": [{"prompt_ids": [1, 2], "positions": [list(topk(p, k).items())],
                        "greedy": [5, 6, 7, 8]}]}
    var = {"prompts": [{"prompt_ids": [1, 2], "positions": [list(topk(p, k).items())],
                        "greedy": [5, 6, 9, 8]}]}
    m = compare(ref, var, k)
    assert m["kl_mean"] == 0 and m["top1"] == 1 and m["greedy_same"] == 0
    assert m["greedy_prefix"] == 0.5 and m["greedy_tok"] == 0.75, m
    print("SELF-TEST OK")
    return 0


# ------------------------------------------------------------------------------------------------
# Checkpoints
# ------------------------------------------------------------------------------------------------


def make_dequant(fp8_dir: Path, out: Path) -> None:
    """bf16 copy of a block-FP8 checkpoint: every (weight, weight_scale_inv) pair -> q * s."""
    import torch
    from safetensors.torch import load_file, save_file

    from vllm_blockfp8.reference import dequantize_block_fp8

    cfg = json.loads((fp8_dir / "config.json").read_text())
    block = (cfg.get("quantization_config") or {}).get("weight_block_size", [128, 128])
    if block[0] != block[1]:
        raise ValueError(f"square blocks only, got weight_block_size {block}")
    out.mkdir(parents=True, exist_ok=True)
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    # A weight and its scale may sit in different shards: load all, keep each weight's shard.
    files = sorted(fp8_dir.glob("*.safetensors"))
    shards = {f.name: load_file(f) for f in files}
    where = {n: fname for fname, ts in shards.items() for n in ts}
    for name in [n for n in where if n.endswith(".weight_scale_inv")]:
        w = name[: -len("_scale_inv")]
        q = shards[where[w]][w].to(dev)
        s = shards[where.pop(name)].pop(name).to(dev)
        shards[where[w]][w] = dequantize_block_fp8(q, s, block[0]).to(torch.bfloat16).cpu()
    for fname, tensors in shards.items():
        if tensors:
            save_file(tensors, out / fname, metadata={"format": "pt"})
    index = {"metadata": {}, "weight_map": dict(sorted(where.items()))}
    (out / "model.safetensors.index.json").write_text(json.dumps(index, indent=2))
    skip = {"config.json", "model.safetensors.index.json"}
    for f in fp8_dir.iterdir():
        if f.is_file() and f.suffix != ".safetensors" and f.name not in skip:
            shutil.copy(f, out / f.name)
    cfg.pop("quantization_config", None)
    (out / "config.json").write_text(json.dumps(cfg, indent=2))


def ensure_quantized(bf16: Path, out: Path, log: Path, fmt: str = "fp8-block") -> None:
    """Quantize with the project's own tool (``fmt``: fp8-block or nvfp4) when the checkpoint is not there yet."""
    if (out / "config.json").exists():
        return
    cmd = [sys.executable, "-m", "vllm_blockfp8", "quantize", str(bf16), str(out), "--format", fmt]
    with open(log, "w") as f:
        subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT, check=True, timeout=600)


# ------------------------------------------------------------------------------------------------
# Worker: one variant, one process
# ------------------------------------------------------------------------------------------------


def worker(a: argparse.Namespace) -> int:
    from vllm import LLM, SamplingParams

    t0 = time.time()
    tp = VARIANTS[a.variant].tensor_parallel
    llm = LLM(**llm_kwargs(a.model, a.quantization, gpu_mem=a.gpu_mem, eager=not a.compile,
                           max_model_len=1024, max_logprobs=a.topk, tensor_parallel_size=tp))
    t_load = time.time() - t0
    score = SamplingParams(max_tokens=1, temperature=0.0, logprobs=a.topk, prompt_logprobs=a.topk)
    greedy = SamplingParams(max_tokens=GREEDY_TOKENS, temperature=0.0, ignore_eos=True)
    scored = llm.generate(PROMPTS, score, use_tqdm=False)
    gen = llm.generate(PROMPTS, greedy, use_tqdm=False)
    records = []
    for s, g in zip(scored, gen):
        steps = [d for d in (s.prompt_logprobs or [])[1:]] + [s.outputs[0].logprobs[0]]
        records.append({
            "prompt_ids": list(s.prompt_token_ids),
            "positions": [[[t, lp.logprob] for t, lp in d.items()] for d in steps],
            "greedy": list(g.outputs[0].token_ids),
        })
    Path(a.worker_out).write_text(json.dumps({
        "variant": a.variant, "model": a.model, "quantization": a.quantization,
        "load_s": t_load, "run_s": time.time() - t0 - t_load, "prompts": records}))
    print(f"WORKER OK {a.variant}: load {t_load:.0f}s")
    return 0


# ------------------------------------------------------------------------------------------------
# Driver
# ------------------------------------------------------------------------------------------------


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bf16", type=Path, help="bf16 HF checkpoint (the reference)")
    ap.add_argument("--fp8block", type=Path,
                    help="block-FP8 checkpoint; made with `python -m vllm_blockfp8 quantize` "
                         "from --bf16 when it does not exist")
    ap.add_argument("--nvfp4", type=Path,
                    help="ModelOpt NVFP4 checkpoint for the *-nvfp4 variants, made from --bf16 when missing "
                         "(default: the --fp8block path + '-nvfp4')")
    ap.add_argument("--out", type=Path, help="output directory (JSON, logs, results.md)")
    ap.add_argument("--variants", default="bf16,blockfp8,vllm-fp8-block,vllm-fp8-dyn,bf16-dequant")
    ap.add_argument("--reference", default="bf16",
                    help="variant the others are compared with (blockfp8 for the tensor-parallel "
                         "check: --variants blockfp8,blockfp8-tp2 --reference blockfp8)")
    ap.add_argument("--topk", type=int, default=20, help="log-probs kept per position")
    ap.add_argument("--gpu-mem", type=float, default=0.3)
    ap.add_argument("--compile", action="store_true",
                    help="torch.compile + CUDA graphs (default: eager, for start-up time)")
    ap.add_argument("--timeout-s", type=float, default=300, help="cap per variant")
    ap.add_argument("--paired", action="append", default=[], type=lambda v: tuple(v.split(":", 1)),
                    metavar="A:B", help="also compare variant A with variant B position by position (their KL to the "
                                        "reference; equal within 2 standard errors?); repeatable")
    ap.add_argument("--self-test", action="store_true")
    ap.add_argument("--worker", dest="variant", help=argparse.SUPPRESS)
    ap.add_argument("--model", help=argparse.SUPPRESS)
    ap.add_argument("--quantization", help=argparse.SUPPRESS)
    ap.add_argument("--worker-out", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.self_test:
        return self_test()
    if a.variant:
        finish_worker(worker(a))
    if not (a.bf16 and a.fp8block and a.out):
        ap.error("--bf16, --fp8block and --out are required")
    names = [v for v in a.variants.split(",") if v]
    unknown = [v for v in names if v not in VARIANTS]
    if unknown or a.reference not in names:
        ap.error(f"unknown variants {unknown} (known {list(VARIANTS)}); the reference "
                 f"{a.reference!r} must be one of them")
    bad_pairs = [":".join(p) for p in a.paired if len(p) != 2 or not set(p) <= set(names) - {a.reference}]
    if bad_pairs:
        ap.error(f"--paired {bad_pairs}: name two of --variants other than the reference, as A:B")
    a.out.mkdir(parents=True, exist_ok=True)
    status = {}
    needs_fp8 = any(VARIANTS[n].checkpoint in ("fp8block", "dequant") for n in names)
    if needs_fp8:
        try:
            ensure_quantized(a.bf16, a.fp8block, a.out / "quantize.log")
        except (subprocess.SubprocessError, OSError) as e:
            status["quantize"] = f"failed: {e}; {tail(a.out / 'quantize.log')}"
    nvfp4 = a.nvfp4 or a.fp8block.with_name(a.fp8block.name + "-nvfp4")
    if any(VARIANTS[n].checkpoint == "nvfp4" for n in names):
        try:
            ensure_quantized(a.bf16, nvfp4, a.out / "quantize-nvfp4.log", "nvfp4")
        except (subprocess.SubprocessError, OSError) as e:
            status["quantize-nvfp4"] = f"failed: {e}; {tail(a.out / 'quantize-nvfp4.log')}"
    dirs = {"bf16": a.bf16, "fp8block": a.fp8block, "nvfp4": nvfp4, "dequant": a.out / "dequant-ckpt"}
    if "bf16-dequant" in names and "quantize" not in status:
        try:
            make_dequant(a.fp8block, dirs["dequant"])
        except Exception as e:  # any failure here only loses this one variant
            status["bf16-dequant"] = f"dequant failed: {type(e).__name__}: {e}"
    recorded = {}
    for name in names:
        v = VARIANTS[name]
        if name in status or (v.checkpoint in ("fp8block", "dequant") and "quantize" in status) or \
                (v.checkpoint == "nvfp4" and "quantize-nvfp4" in status):
            continue
        js, log = a.out / f"{name}.json", a.out / f"{name}.log"
        args = ["evals.fidelity", "--worker", name, "--model", str(dirs[v.checkpoint]),
                "--worker-out", str(js), "--topk", str(a.topk), "--gpu-mem", str(a.gpu_mem)]
        args += ["--quantization", v.quantization] if v.quantization else []
        args += ["--compile"] if a.compile else []
        rc, secs = run_worker(args, log, a.timeout_s, v.env)
        rec, status[name] = collect(rc, js, log, secs, name)
        if rec is not None:
            recorded[name] = rec
        print(f"[fidelity] {name}: {status[name]}", flush=True)
    rows = []
    for name in names:
        row = {"variant": name, "status": status.get(name, "skipped")}
        if name in recorded and a.reference in recorded and name != a.reference:
            row.update(compare(recorded[a.reference], recorded[name], a.topk))
        rows.append(row)
    pairs = []
    for spec in a.paired:
        x, y = spec
        if a.reference in recorded and x in recorded and y in recorded:
            pairs.append({"a": x, "b": y, **paired(recorded[a.reference], recorded[x], recorded[y], a.topk)})
        else:
            pairs.append({"a": x, "b": y, "status": "not recorded"})
    summary = {"bf16": str(a.bf16), "fp8block": str(a.fp8block), "reference": a.reference, "topk": a.topk,
               "compile": a.compile, "prompts": len(PROMPTS), "status": status, "rows": rows, "paired": pairs}
    (a.out / "fidelity.json").write_text(json.dumps(summary, indent=2))
    cols = ["variant", "kl_mean", "kl_se", "kl_p99", "kl_max", "top1", "top1_se", "next_top1", "miss",
            "greedy_same", "greedy_prefix", "greedy_tok", "status"]
    table = markdown_table(rows, cols)
    for pr in pairs:
        table += (f"\n\n{pr['a']} vs {pr['b']}: " + (pr["status"] if "status" in pr else
                  f"KL difference {pr['kl_diff']:.3g} +- {pr['kl_diff_se']:.2g} (standard error, prompts as "
                  f"clusters): {'equal within 2 standard errors' if pr['equal'] else 'DIFFERENT'}"))
    (a.out / "results.md").write_text(table + "\n")
    print(f"\nFIDELITY vs {a.reference} ({a.bf16.name}, {len(PROMPTS)} prompts, top-{a.topk})")
    print(table)
    ok = all(s.startswith("ok") for n, s in status.items() if n in OWN_VARIANTS)
    return 0 if ok and "quantize" not in status and "quantize-nvfp4" not in status else 1


if __name__ == "__main__":
    sys.exit(main())
