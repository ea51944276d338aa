"""lm-eval on the project's own task (evals/tasks/blockfp8_mc), once per variant, offline.

Each variant is ``lm_eval.simple_evaluate(model="vllm", model_args={pretrained, quantization,
...})`` in its own subprocess (evals.VARIANTS: bf16, blockfp8, vllm-fp8-block, vllm-fp8-dyn).
200 four-way multiple-choice items give accuracy with a ~3.5-point standard error, too coarse to
separate FP8 variants, so the driver also compares per-item log-likelihoods with bf16's:

* ``agree``: share of items whose chosen answer (argmax log-likelihood) equals bf16's choice.
* ``dll``: mean |log-likelihood of the correct choice - bf16's|, in nats.

Writes OUT/lm_eval.json (per variant: lm-eval's results, per-category accuracy, the comparison),
OUT/<variant>.json (every item's choice log-likelihoods), OUT/<variant>.log, OUT/results.md, and
prints the summary table last.

usage (repo root, after ``. /tmp/vk_tools/env.sh``; lm-eval and its wheels importable):
  python -m evals.run_lm_eval --bf16 /tmp/smollm2 --fp8block /tmp/smollm2-fp8 --out $OUT/lm_eval
  python -m evals.run_lm_eval --bf16 X --fp8block X --out /tmp/le --lm-model dummy   # CPU plumbing
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from evals import (OWN_VARIANTS, VARIANTS, collect, finish_worker, llm_kwargs, markdown_table,
                   run_worker)

TASKS_DIR = Path(__file__).resolve().parent / "tasks"
TASK = "blockfp8_mc"


def _first(x):
    while isinstance(x, (list, tuple)):
        x = x[0]
    return x


def worker(a: argparse.Namespace) -> int:
    import lm_eval
    from lm_eval.tasks import TaskManager

    t0 = time.time()
    tm = TaskManager(include_path=str(TASKS_DIR))
    if a.lm_model == "dummy":
        model_args = None
    else:
        kw = llm_kwargs(a.model, a.quantization, gpu_mem=a.gpu_mem, eager=not a.compile,
                        max_model_len=1024, tensor_parallel_size=VARIANTS[a.variant].tensor_parallel)
        model_args = {"pretrained": kw.pop("model"), **kw}
    res = lm_eval.simple_evaluate(model=a.lm_model, model_args=model_args, tasks=[TASK],
                                  task_manager=tm, batch_size="auto", log_samples=True,
                                  limit=a.limit, bootstrap_iters=1000)
    items = []
    for s in sorted(res["samples"][TASK], key=lambda s: s["doc_id"]):
        # One (loglik, is_greedy) per choice; unfiltered resps nest it one level deeper.
        lls = [float(_first(r)) for r in s.get("filtered_resps") or s["resps"]]
        items.append({"doc_id": s["doc_id"], "id": s["doc"]["id"],
                      "category": s["doc"]["category"], "target": int(s["target"]),
                      "logliks": lls})
    metrics = {k: v for k, v in res["results"][TASK].items() if isinstance(v, (int, float))}
    Path(a.worker_out).write_text(json.dumps({
        "variant": a.variant, "model": a.model, "quantization": a.quantization,
        "metrics": metrics, "seconds": time.time() - t0, "items": items}))
    print(f"WORKER OK {a.variant}: {metrics}")
    return 0


def summarize(rec: dict, ref: dict | None) -> dict:
    items = rec["items"]
    pick = [max(range(len(it["logliks"])), key=it["logliks"].__getitem__) for it in items]
    row = {"acc": rec["metrics"].get("acc,none"), "acc_se": rec["metrics"].get("acc_stderr,none"),
           "acc_norm": rec["metrics"].get("acc_norm,none"), "n": len(items)}
    for cat in sorted({it["category"] for it in items}):
        idx = [i for i, it in enumerate(items) if it["category"] == cat]
        row[f"acc_{cat}"] = sum(pick[i] == items[i]["target"] for i in idx) / len(idx)
    if ref is not None:
        by_id = {it["id"]: it for it in ref["items"]}
        pairs = [(it, by_id[it["id"]]) for it in items if it["id"] in by_id]
        agree = [max(range(len(a["logliks"])), key=a["logliks"].__getitem__)
                 == max(range(len(b["logliks"])), key=b["logliks"].__getitem__) for a, b in pairs]
        dll = [abs(a["logliks"][a["target"]] - b["logliks"][b["target"]]) for a, b in pairs]
        row["agree"] = sum(agree) / max(len(agree), 1)
        row["dll"] = sum(dll) / max(len(dll), 1)
    return row


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bf16", type=Path, required=False, help="bf16 HF checkpoint")
    ap.add_argument("--fp8block", type=Path, required=False, help="block-FP8 checkpoint")
    ap.add_argument("--out", type=Path)
    ap.add_argument("--variants", default="bf16,blockfp8,vllm-fp8-block,vllm-fp8-dyn")
    ap.add_argument("--limit", type=int, default=None, help="first N items only")
    ap.add_argument("--gpu-mem", type=float, default=0.3)
    ap.add_argument("--compile", action="store_true", help="torch.compile + CUDA graphs")
    ap.add_argument("--timeout-s", type=float, default=300, help="cap per variant")
    ap.add_argument("--lm-model", default="vllm",
                    help="lm-eval model type; 'dummy' (random answers) checks the plumbing on CPU")
    ap.add_argument("--worker", dest="variant", help=argparse.SUPPRESS)
    ap.add_argument("--model", help=argparse.SUPPRESS)
    ap.add_argument("--quantization", help=argparse.SUPPRESS)
    ap.add_argument("--worker-out", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.variant:
        finish_worker(worker(a))
    if not (a.bf16 and a.fp8block and a.out):
        ap.error("--bf16, --fp8block and --out are required")
    names = [v for v in a.variants.split(",") if v]
    dirs = {"bf16": a.bf16, "fp8block": a.fp8block}
    unknown = [v for v in names if v not in VARIANTS or VARIANTS[v].checkpoint not in dirs]
    if unknown:
        ap.error(f"unknown variants {unknown} (this driver runs the bf16 and block-FP8 checkpoints)")
    a.out.mkdir(parents=True, exist_ok=True)
    recs, status = {}, {}
    for name in names:
        v = VARIANTS[name]
        js, log = a.out / f"{name}.json", a.out / f"{name}.log"
        args = ["evals.run_lm_eval", "--worker", name, "--model", str(dirs[v.checkpoint]),
                "--worker-out", str(js), "--gpu-mem", str(a.gpu_mem), "--lm-model", a.lm_model]
        args += ["--quantization", v.quantization] if v.quantization else []
        args += ["--limit", str(a.limit)] if a.limit else []
        args += ["--compile"] if a.compile else []
        rc, secs = run_worker(args, log, a.timeout_s, v.env)
        rec, status[name] = collect(rc, js, log, secs, name)
        if rec is not None:
            recs[name] = rec
        print(f"[lm_eval] {name}: {status[name]}", flush=True)
    ref = recs.get("bf16")
    rows = []
    for name in names:
        row = {"variant": name, "status": status[name]}
        if name in recs:
            row.update(summarize(recs[name], ref if name != "bf16" else None))
        rows.append(row)
    (a.out / "lm_eval.json").write_text(json.dumps(
        {"task": TASK, "model_type": a.lm_model, "bf16": str(a.bf16),
         "fp8block": str(a.fp8block), "rows": rows,
         "lm_eval": {n: r["metrics"] for n, r in recs.items()}}, indent=2))
    cats = sorted({k for r in rows for k in r if k.startswith("acc_") and k != "acc_se"
                   and k != "acc_norm"})
    cols = ["variant", "acc", "acc_se", "acc_norm", *cats, "agree", "dll", "status"]
    table = markdown_table(rows, cols)
    (a.out / "results.md").write_text(table + "\n")
    print(f"\nLM-EVAL {TASK} ({a.lm_model}; agree/dll vs bf16)")
    print(table)
    return 0 if all(s.startswith("ok") for n, s in status.items() if n in OWN_VARIANTS) else 1


if __name__ == "__main__":
    sys.exit(main())
