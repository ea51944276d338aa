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
    prof = [dict(r) for r in runs if r["stage"] == "profile"]
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
    if prof:
        # One row per variant, one column per kernel category (GPU time per token per layer).
        per = [r.get("categories") or {} for r in prof]  # failed runs have none
        cats = sorted({c for p in per for c in p}, key=lambda c: -max(p.get(c, 0.0) for p in per))
        for r, p in zip(prof, per):
            r.update({f"cat:{c}": p.get(c) for c in cats}, sum=sum(p.values()) if p else None)
        unit = next((r["unit"] for r in prof if r.get("unit")), "")
        out[f"GPU kernel time by category ({unit}; vllm bench --profile)"] = _table(
            prof, [("case", "case"), ("variant", "variant"), ("sum", "sum")]
            + [(c, f"cat:{c}") for c in cats] + [("status", "status")])
    return out


def plot(runs: list[dict], path: Path) -> bool:
    """One panel per stage that has at least one measured run; False without matplotlib or data."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    variants = list(dict.fromkeys(r["variant"] for r in runs))
    measured = lambda stage, key: [r for r in runs if r["stage"] == stage and r.get(key)]  # noqa: E731
    panels = []
    if measured("latency", "decode_tok_s"):
        panels.append("latency")
    if measured("throughput", "tok_s"):
        panels.append("throughput")
    if measured("serve", "output_throughput"):
        panels += ["serve_tok_s", "serve_tpot"]
    if not panels:
        return False
    fig, axes = plt.subplots(1, len(panels), figsize=(5.5 * len(panels), 4.5), squeeze=False)
    for ax, panel in zip(axes[0], panels):
        if panel == "latency":
            lat = {r["variant"]: r["decode_tok_s"] for r in measured("latency", "decode_tok_s")}
            bars = ax.bar(list(lat), list(lat.values()), color="tab:blue")
            ax.bar_label(bars, fmt="%.0f")
            missing = [v for v in variants if v not in lat]
            ax.set_title("batch-1 decode tok/s (higher is better)"
                         + (f"\nnot measured: {', '.join(missing)}" if missing else ""))
        elif panel == "throughput":
            cases = [c for c in ("prefill", "mixed") if any(r.get("case") == c for r in measured("throughput", "tok_s"))]
            width = 0.8 / max(len(variants), 1)
            for i, v in enumerate(variants):
                vals = [next((r["tok_s"] for r in measured("throughput", "tok_s")
                              if r["variant"] == v and r.get("case") == c), 0) for c in cases]
                ax.bar([j + i * width for j in range(len(cases))], vals, width, label=v)
            ax.set_xticks([j + 0.4 - width / 2 for j in range(len(cases))], cases)
            ax.set_title("offline throughput (total tok/s)")
            ax.legend(fontsize=8)
        else:
            key, title = (("output_throughput", "serving output tok/s vs concurrency")
                          if panel == "serve_tok_s" else
                          ("median_tpot_ms", "serving median TPOT ms vs concurrency (lower is better)"))
            for v in variants:
                pts = sorted((r["concurrency"], r[key]) for r in measured("serve", "output_throughput")
                             if r["variant"] == v and r.get(key) is not None)
                if pts:
                    ax.plot([c for c, _ in pts], [y for _, y in pts], "o-", label=v)
            ax.set_xscale("log", base=2)
            ax.set_title(title)
            ax.legend(fontsize=8)
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
