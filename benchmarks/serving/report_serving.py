"""Tables and plot for run_serving.py: OUT/results.md, OUT/serving.png, and a summary on stdout.

Ratios are against ``vllm-fp8-block`` (vLLM's own block-FP8 path, the peer the project's end-to-end
targets name: batch-1 decode >= 1.3x, prefill >= 1.0x) and against ``bf16``.
"""

from __future__ import annotations

from pathlib import Path

PEER, BASE = "vllm-fp8-block", "bf16"


def _fmt(v, digits: int = 4) -> str:
    if v is None:
        return ""
    if isinstance(v, float):
        return f"{v:.{digits}g}"
    return str(v).replace("|", "\\|")


def _table(rows: list[dict], cols: list[tuple[str, str]]) -> str:
    out = ["| " + " | ".join(h for h, _ in cols) + " |", "|" + "---|" * len(cols)]
    out += ["| " + " | ".join(_fmt(r.get(k)) for _, k in cols) + " |" for r in rows]
    return "\n".join(out)


def _ratios(rows: list[dict], key: str, group: str = "case") -> None:
    """Add key/peer and key/bf16 ratios to each row, matching rows of the same case."""
    ref = {(r["variant"], r.get(group)): r.get(key) for r in rows if r.get(key)}
    for r in rows:
        for name, tag in ((PEER, "vs_peer"), (BASE, "vs_bf16")):
            other = ref.get((name, r.get(group)))
            if r.get(key) and other:
                r[tag] = r[key] / other


def tables(runs: list[dict]) -> dict[str, str]:
    lat = [dict(r) for r in runs if r["stage"] == "latency"]
    thr = [dict(r) for r in runs if r["stage"] == "throughput"]
    srv = [dict(r) for r in runs if r["stage"] == "serve"]
    lt = [dict(r) for r in runs if r["stage"].startswith("loadtest")]
    _ratios(lat, "decode_tok_s")
    _ratios(thr, "tok_s")
    _ratios(srv, "output_throughput")
    out = {}
    if lat:
        out["Latency: batch 1, input 128, output 128 (vllm bench latency)"] = _table(lat, [
            ("variant", "variant"), ("avg s", "avg_latency_s"), ("p50 s", "p50_latency_s"),
            ("tok/s", "decode_tok_s"), (f"x {PEER}", "vs_peer"), ("x bf16", "vs_bf16"),
            ("status", "status")])
    if thr:
        out["Throughput (vllm bench throughput, random data)"] = _table(thr, [
            ("case", "case"), ("variant", "variant"), ("total tok/s", "tok_s"),
            ("input tok/s", "input_tok_s"), ("output tok/s", "output_tok_s"), ("req/s", "req_s"),
            (f"x {PEER}", "vs_peer"), ("x bf16", "vs_bf16"), ("status", "status")])
    if srv:
        out["Serving sweep (vllm serve + vllm bench serve, random data)"] = _table(srv, [
            ("conc", "concurrency"), ("variant", "variant"), ("out tok/s", "output_throughput"),
            ("req/s", "request_throughput"), ("TTFT p50 ms", "median_ttft_ms"),
            ("TPOT p50 ms", "median_tpot_ms"), ("TPOT p99 ms", "p99_tpot_ms"),
            ("failed", "failed"), (f"x {PEER}", "vs_peer"), ("status", "status")])
    if lt:
        out["Load test"] = _table(lt, [
            ("round", "case"), ("variant", "variant"), ("completed", "completed"),
            ("failed", "failed"), ("out tok/s", "output_throughput"),
            ("TPOT p99 ms", "p99_tpot_ms"), ("alive", "server_alive"), ("status", "status")])
    return out


def plot(runs: list[dict], path: Path) -> bool:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    variants = list(dict.fromkeys(r["variant"] for r in runs))
    fig, ax = plt.subplots(2, 2, figsize=(12, 8))
    lat = {r["variant"]: r.get("decode_tok_s") or 0 for r in runs if r["stage"] == "latency"}
    ax[0, 0].bar(list(lat), list(lat.values()))
    ax[0, 0].set_title("batch-1 decode (tok/s, higher is better)")
    cases = [c for c in ("prefill", "mixed")
             if any(r["stage"] == "throughput" and r.get("case") == c for r in runs)]
    width = 0.8 / max(len(variants), 1)
    for i, v in enumerate(variants):
        vals = [next((r.get("tok_s") or 0 for r in runs if r["stage"] == "throughput"
                      and r["variant"] == v and r.get("case") == c), 0) for c in cases]
        ax[0, 1].bar([j + i * width for j in range(len(cases))], vals, width, label=v)
    ax[0, 1].set_xticks([j + 0.4 - width / 2 for j in range(len(cases))], cases)
    ax[0, 1].set_title("offline throughput (total tok/s)")
    ax[0, 1].legend(fontsize=8)
    for v in variants:
        pts = sorted((r["concurrency"], r) for r in runs
                     if r["stage"] == "serve" and r["variant"] == v and r.get("output_throughput"))
        if pts:
            ax[1, 0].plot([c for c, _ in pts], [r["output_throughput"] for _, r in pts], "o-",
                          label=v)
            ax[1, 1].plot([c for c, _ in pts], [r["median_tpot_ms"] for _, r in pts], "o-",
                          label=v)
    for a, title in ((ax[1, 0], "serving output tok/s vs concurrency"),
                     (ax[1, 1], "serving median TPOT ms vs concurrency (lower is better)")):
        a.set_xscale("log", base=2)
        a.set_title(title)
        a.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def write_report(out: Path, runs: list[dict]) -> None:
    ts = tables(runs)
    md = "\n\n".join(f"## {title}\n\n{t}" for title, t in ts.items())
    (out / "results.md").write_text(md + "\n")
    has_plot = plot(runs, out / "serving.png") if runs else False
    ok = sum(r["status"] == "ok" for r in runs)
    print(f"\nSERVING SUMMARY ({ok}/{len(runs)} runs ok; results.md, serving.json"
          f"{', serving.png' if has_plot else ''} in {out})")
    for title, t in ts.items():
        print(f"\n{title}\n{t}")
    for r in runs:
        if r.get("verdict"):
            print(r["verdict"])
