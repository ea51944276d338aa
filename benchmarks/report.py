"""Benchmark results: records, the aligned table, geomean lines per band, JSON and the plot.

Nothing here touches a GPU, so tests and ``--dry-run`` exercise all of it on a CPU machine.
A point is (op, shape, M); at each point "ours" (or "ours@<row>" for a forced tile row) is compared
with every peer measured there. Bands follow shared/BENCHMARKS.md's target table.
"""

from __future__ import annotations

import datetime
import gzip
import json
import math
import os
import subprocess
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
OP_KIND = {"linear": "full linear", "gemm": "GEMM only", "quant": "quantizer",
           "nvfp4": "NVFP4 W4A16 linear"}


@dataclass(frozen=True)
class Ceilings:
    copy_bytes_per_s: float
    bf16_flops: float
    fp8_flops: float
    graph_node_us: float
    fp8_flops_precise_accum: float = 0.0
    source: str = "measured"

    def describe(self) -> str:
        return (f"ceilings ({self.source}): copy {self.copy_bytes_per_s / 1e12:.2f} TB/s "
                f"(read+write), bf16 {self.bf16_flops / 1e12:.0f} TFLOP/s, "
                f"fp8 {self.fp8_flops / 1e12:.0f} TFLOP/s (precise accumulation "
                f"{self.fp8_flops_precise_accum / 1e12:.0f}), "
                f"graph node {self.graph_node_us:.2f} us")


PUBLISHED_CEILINGS = Ceilings(4.12e12, 786e12, 1463e12, 1.17, 1463e12, "BENCHMARKS.md, dry run")


def band_of(op: str, m: int) -> str:
    kind = OP_KIND.get(op, op)
    if op == "quant":
        return f"{kind}, M >= 1024" if m >= 1024 else f"{kind}, M < 1024"
    if m == 1:
        return f"{kind}, decode M = 1"
    if m <= 16:
        return f"{kind}, spec decode M = 2..16"
    if m <= 256:
        return f"{kind}, mid M = 32..256"
    if m >= 1024:
        return f"{kind}, prefill M = 1024..8192"
    return f"{kind}, M = 257..1023"


@dataclass
class Record:
    op: str
    impl: str            # "ours", "ours@<row>" (forced row), a peer name, or "yardstick:<name>"
                         # (not the same op: the same bytes, or another format of the same weight;
                         # shown and summarized, never a "best peer")
    shape: str
    m: int
    n: int
    k: int
    us: float
    floor_us: float
    bytes: int           # minimum bytes of the point (the floor's byte count)
    flops: int
    row: str = ""        # tile row ours selected or was forced to
    copies: int = 0
    replays: int = 0
    spread: float = 0.0
    method: str = "graph"
    note: str = ""
    end_unix: float = 0.0  # time.time() when the point's timing ended: joins it to a clock log

    @property
    def is_ours(self) -> bool:
        return self.impl.startswith("ours")

    @property
    def is_yardstick(self) -> bool:
        return self.impl.startswith("yardstick:")

    @property
    def ratio(self) -> float:
        return self.us / self.floor_us

    @property
    def gbps(self) -> float:
        return self.bytes / self.us / 1e3

    @property
    def tflops(self) -> float:
        return self.flops / self.us / 1e6

    @property
    def key(self) -> tuple:
        return (self.op, self.shape, self.m)


def geomean(values) -> float:
    values = list(values)
    return math.exp(sum(math.log(v) for v in values) / len(values)) if values else float("nan")


def environment() -> dict:
    """GPU, library versions, git state and date for the JSON header (CUDA only if present)."""
    env = {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
           "gpu": None}
    try:
        import torch

        env["torch"] = torch.__version__
        env["cuda"] = torch.version.cuda
        if torch.cuda.is_available():
            props = torch.cuda.get_device_properties(0)
            env.update(gpu=props.name, sm_count=props.multi_processor_count,
                       capability=f"{props.major}.{props.minor}",
                       l2_bytes=getattr(props, "L2_cache_size", None))
    except ImportError:
        env["torch"] = None
    for name in ("triton", "vllm"):
        mod = sys.modules.get(name)
        env[name] = getattr(mod, "__version__", None) if mod else None
    if env["triton"] is None:
        try:
            import triton

            env["triton"] = triton.__version__
        except ImportError:
            pass
    env["git"] = _git_state()
    return env


def _git_state() -> str:
    # The device machine gets a copy of the tree without .git: the caller passes the state in.
    if os.environ.get("BLOCKFP8_GIT_STATE"):
        return os.environ["BLOCKFP8_GIT_STATE"]

    def git(*cmd):
        return subprocess.run(("git", "-C", str(REPO_ROOT)) + cmd, capture_output=True,
                              text=True, timeout=10)
    try:
        head = git("rev-parse", "--short=12", "HEAD")
        sha = head.stdout.strip() if head.returncode == 0 else "no-commit"
        dirty = git("status", "--porcelain").stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return sha + ("+dirty" if dirty else "")


def save_png(fig, path: Path, dpi: int) -> None:
    """A matplotlib figure as a 64-colour palette PNG: line plots lose nothing visible and the file is
    about 4x smaller than RGBA (the results are committed and travel to the GPU machine, whose copy of
    the tree is capped at 64 MiB with the vLLM bundle and the build wheels)."""
    import io

    from PIL import Image

    buf = io.BytesIO()
    fig.savefig(buf, dpi=dpi, format="png")
    buf.seek(0)
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.open(buf).convert("RGB").quantize(colors=64, method=Image.Quantize.MEDIANCUT).save(path, format="PNG", optimize=True)


def load_json(path: Path) -> dict:
    """What dump_json wrote (plain or ".json.gz")."""
    raw = path.read_bytes()
    return json.loads(gzip.decompress(raw) if path.name.endswith(".gz") else raw)


def dump_json(obj: dict, path: Path) -> None:
    """Compact JSON, gzip-compressed for a ".json.gz" path (5x smaller): the results are committed
    and every committed byte travels to the GPU machine, whose copy of the tree is capped."""
    path.parent.mkdir(parents=True, exist_ok=True)
    text = json.dumps(obj, separators=(",", ":")) + "\n"
    if path.name.endswith(".gz"):
        with gzip.open(path, "wt") as f:
            f.write(text)
    else:
        path.write_text(text)


@dataclass
class Report:
    script: str
    ceilings: Ceilings
    replays: int
    dry_run: bool = False
    argv: dict = field(default_factory=dict)
    records: list = field(default_factory=list)
    skips: list = field(default_factory=list)
    notes: dict = field(default_factory=dict)   # header notes, e.g. which quantizer peers use

    def add(self, rec: Record) -> None:
        self.records.append(rec)
        flag = f"  [{rec.note}]" if rec.note else ""
        print(f"  {rec.op:6s} {rec.shape:22s} M={rec.m:<5d} {rec.impl:18s} {rec.us:10.2f} us "
              f"{rec.ratio:6.2f}x floor{flag}", flush=True)

    def skip(self, op: str, impl: str, shape: str, m: int, reason: str) -> None:
        self.skips.append(dict(op=op, impl=impl, shape=shape, m=m, reason=reason))
        print(f"  skip {op} {shape} M={m} {impl}: {reason}", flush=True)

    # ---- derived views -------------------------------------------------------------------

    def peer_names(self) -> list[str]:
        return list(dict.fromkeys(r.impl for r in self.records if not r.is_ours))

    def peers_at(self, key: tuple) -> dict[str, Record]:
        """The peers measured at key: what "best peer" and the speedups compare against."""
        return {r.impl: r for r in self.records if r.key == key and not r.is_ours and not r.is_yardstick}

    def ours(self) -> list[Record]:
        return [r for r in self.records if r.is_ours]

    def speedups(self, rec: Record) -> dict[str, float]:
        """Peer time / our time at rec's point (> 1: ours is faster)."""
        return {name: p.us / rec.us for name, p in self.peers_at(rec.key).items()}

    # ---- table and geomean lines ---------------------------------------------------------

    def table(self) -> str:
        peers = self.peer_names()
        # The quantizer does no math worth a rate: its column is the share of copy bandwidth.
        quant = all(r.op == "quant" for r in self.records)
        head = ["op", "shape", "N x K", "M", "row", "floor us", "impl", "us", "/floor", "GB/s",
                "% copy bw" if quant else "TFLOP/s"] + [f"{p} us" for p in peers] + ["best peer", "best/floor", "best/ours"]
        rows = []
        keys = list(dict.fromkeys(r.key for r in self.records))
        for key in keys:
            at = [r for r in self.records if r.key == key]
            peer_at = self.peers_at(key)
            best = min(peer_at.values(), key=lambda r: r.us) if peer_at else None
            for rec in [r for r in at if r.is_ours] or [None]:
                base = rec or at[0]
                cells = [base.op, base.shape, f"{base.n}x{base.k}" if base.n else f"-x{base.k}",
                         str(base.m), rec.row if rec else "", f"{base.floor_us:.2f}"]
                if rec:
                    mark = "!" if "WRONG" in rec.note else ""
                    cells += [rec.impl, f"{rec.us:.2f}{mark}", f"{rec.ratio:.2f}x",
                              f"{rec.gbps:.0f}",
                              f"{100 / rec.ratio:.0f}%" if quant else f"{rec.tflops:.1f}"]
                else:
                    cells += ["-", "-", "-", "-", "-"]
                others = {r.impl: r for r in at if not r.is_ours}  # peers and yardsticks
                cells += [f"{others[p].us:.2f}" if p in others else "-" for p in peers]
                cells += [best.impl, f"{best.ratio:.2f}x",
                          f"{best.us / rec.us:.2f}x" if rec else "-"] if best else ["-"] * 3
                rows.append(cells)
        widths = [max(len(str(c)) for c in col) for col in zip(head, *rows)]
        left = {0, 1, 4, 6}

        def fmt(cells):
            return "  ".join(str(c).ljust(w) if i in left else str(c).rjust(w)
                             for i, (c, w) in enumerate(zip(cells, widths)))
        return "\n".join([fmt(head), fmt(["-" * w for w in widths])] + [fmt(r) for r in rows])

    def geomean_lines(self) -> list[str]:
        """One line per band (ours, best peer, each peer); forced rows follow, indented."""
        lines = []
        for band in dict.fromkeys(band_of(r.op, r.m) for r in self.records):
            recs = [r for r in self.records if band_of(r.op, r.m) == band]
            keys = list(dict.fromkeys(r.key for r in recs))
            ours = {impl: self._ours_summary([r for r in recs if r.impl == impl])
                    for impl in dict.fromkeys(r.impl for r in recs if r.is_ours)}
            parts = [ours.pop("ours")] if "ours" in ours else []
            best = [min(self.peers_at(k).values(), key=lambda r: r.us).ratio
                    for k in keys if self.peers_at(k)]
            if best:
                parts.append(f"best peer {geomean(best):.2f}x (worst {max(best):.2f}x)")
            per_peer = [f"{p} {geomean(r.ratio for r in recs if r.impl == p):.2f}x"
                        for p in dict.fromkeys(r.impl for r in recs if not r.is_ours)]
            if per_peer:
                parts.append("peers " + ", ".join(per_peer))
            lines.append(f"geomean [{band}] " + " | ".join(parts))
            lines.extend(f"    {text}" for text in ours.values())
        return lines

    def _ours_summary(self, mine: list) -> str:
        worst = max(mine, key=lambda r: r.ratio)
        ratio = geomean(r.ratio for r in mine)
        text = (f"{mine[0].impl} {ratio:.2f}x floor (worst {worst.ratio:.2f}x {worst.shape} "
                f"M={worst.m}; {len(mine)} pts)")
        if mine[0].op == "quant":
            text += f" = {100 / ratio:.0f}% of copy bandwidth"
        vs = [s for r in mine for s in [self._best_speedup(r)] if s is not None]
        if vs:
            slower = sum(v < 1 for v in vs)
            text += f", {geomean(vs):.2f}x vs best peer (slower at {slower}/{len(vs)})"
        return text

    def _best_speedup(self, rec: Record):
        s = self.speedups(rec)
        return min(s.values()) if s else None

    # ---- outputs -------------------------------------------------------------------------

    def to_json(self) -> dict:
        records = []
        for r in self.records:
            d = asdict(r)
            d.update(band=band_of(r.op, r.m), ratio=r.ratio, gbps=r.gbps, tflops=r.tflops)
            if r.is_ours:
                d["speedup"] = self.speedups(r)
            records.append(d)
        header = dict(script=self.script, dry_run=self.dry_run, replays=self.replays,
                      ceilings=asdict(self.ceilings),
                      args={k: str(v) for k, v in self.argv.items()},
                      notes=self.notes, **environment())
        # The geomean lines too, so that a committed result carries its summary as printed.
        return dict(header=header, records=records, skipped=self.skips, geomean=self.geomean_lines())

    def write_json(self, path: Path) -> None:
        dump_json(self.to_json(), path)

    def plot(self, path: Path) -> str | None:
        """time/floor vs M, one subplot per (op, shape), ours and each peer as lines."""
        try:
            import matplotlib

            matplotlib.use("Agg")
            import matplotlib.pyplot as plt
        except ImportError as exc:
            return f"no plot: matplotlib unavailable ({exc})"
        panels = list(dict.fromkeys((r.op, r.shape) for r in self.records))
        if not panels:
            return "no plot: no records"
        cols = min(4, len(panels))
        rows = math.ceil(len(panels) / cols)
        fig, axes = plt.subplots(rows, cols, figsize=(4.2 * cols, 3.2 * rows), squeeze=False)
        impls = list(dict.fromkeys(r.impl for r in self.records))
        palette = plt.get_cmap("tab10" if len(impls) <= 10 else "tab20").colors
        color = {impl: palette[i % len(palette)] for i, impl in enumerate(impls)}
        handles = {}
        for ax, (op, shape) in zip(axes.flat, panels):
            recs = [r for r in self.records if (r.op, r.shape) == (op, shape)]
            for impl in dict.fromkeys(r.impl for r in recs):
                pts = sorted((r.m, r.ratio) for r in recs if r.impl == impl)
                ours = impl.startswith("ours")
                handles[impl], = ax.plot(
                    [p[0] for p in pts], [p[1] for p in pts], marker="o", markersize=3,
                    color=color[impl], linewidth=2.2 if ours else 1.0,
                    linestyle="-" if ours else "--", label=impl)
            ax.axhline(1.0, color="black", linewidth=0.8)
            ratios = [r.ratio for r in recs]
            if max(ratios) > 8 * min(ratios):
                ax.set_yscale("log")
            ax.set_xscale("log", base=2)
            ax.set_title(f"{shape} ({OP_KIND.get(op, op)})", fontsize=9)
            ax.set_xlabel("M")
            ax.set_ylabel("time / floor")
            ax.grid(True, which="both", alpha=0.3)
        for ax in list(axes.flat)[len(panels):]:
            ax.set_visible(False)
        fig.suptitle(f"{self.script}: time / floor (lower is better; 1 = floor)", fontsize=11)
        fig.legend(list(handles.values()), list(handles), loc="lower center",
                   ncol=min(8, len(handles)), fontsize=8)
        fig.tight_layout(rect=(0, 0.7 / (3.2 * rows), 1, 1))
        save_png(fig, path, dpi=110)
        plt.close(fig)
        return None

    def finish(self, json_path: Path, plot_path: Path) -> None:
        """Write JSON and PNG, then print the table LAST, followed by the geomean lines."""
        self.write_json(json_path)
        why = self.plot(plot_path)
        print(f"\nwrote {json_path}" + (f"; {why}" if why else f" and {plot_path}"))
        if self.skips:
            reasons = {}
            for s in self.skips:
                reasons.setdefault((s["impl"], s["reason"]), []).append(s)
            print(f"{len(self.skips)} skipped:")
            for (impl, reason), items in reasons.items():
                print(f"  {impl} x{len(items)}: {reason}")
        print()
        print(self.table() if self.records else "(no records)")
        print()
        for line in self.geomean_lines():
            print(line)
