"""GPU timing: CUDA graphs over rotating operand copies, variants replayed in turns.

``blockfp8 tune`` (tools/tune.py) times kernel rows with it, and the repository's benchmarks
(benchmarks/harness.py: ceilings, floors, the Runner and the scripts' command line) are built on it,
so a row is timed the same way wherever it is timed. It ships in the package: tune runs from an
installed wheel, without the repository.

Method: a point captures k calls over k distinct operand copies in one CUDA graph, k chosen so the
copies hold >= 256 MiB (the H200's L2 is 50-60 MB, so each call reads its weight from HBM, as in a
model), replays the graph after a warm-up and reports the median of >= 20 replays divided by k.
Several graphs (the variants of a point) are replayed in turns so that each sees the same clocks
(time_prepared). torch is imported inside the functions: importing this module needs no GPU.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from typing import Callable, Sequence

MIN_ROTATION_BYTES = 256 << 20
MIN_REPLAYS = 20
WARMUP_REPLAYS = 3
# A graph of a few hundred nodes captures in well under a second; past that only tiny operands
# (decode quantizer) need more copies, and those are launch-bound, not L2-bound.
MAX_COPIES = 256


class WrongResult(RuntimeError):
    """A callable's first output disagrees with the reference."""


@dataclass(frozen=True)
class Timing:
    us: float        # median replay time / copies
    spread: float    # (p90 - p10) / median over the replays: repeat a point whose spread is large
    copies: int
    replays: int
    method: str      # "graph", or "eager" when capture failed (launch gaps included)


def first_line(exc: BaseException, limit: int = 200) -> str:
    """An exception's first line, cut at ``limit`` characters (for one-line skip reasons)."""
    text = (str(exc).strip().splitlines() or [""])[0]
    return text[:limit] + ("..." if len(text) > limit else "")


def copies_for(bytes_per_copy: int, min_bytes: int = MIN_ROTATION_BYTES,
               max_copies: int = MAX_COPIES) -> int:
    """Copies so that k * bytes_per_copy >= min_bytes (at least 2, so no call follows itself)."""
    return max(2, min(max_copies, math.ceil(min_bytes / max(1, bytes_per_copy))))


@dataclass
class PreparedGraph:
    """One callable's k calls captured as a graph (or eager launches where capture failed)."""
    run: Callable[[], None]
    copies: int
    method: str
    keep: tuple  # the graph and the callables: alive until timed


def prepare_graph(fn_factory: Callable[[int], Callable[[], object]], copies: int, *,
                  check: Callable[[object], str | None] | None = None,
                  on_wrong: Callable[[str], None] | None = None) -> PreparedGraph:
    """Capture ``fn_factory(i)()`` for i in range(copies) as one CUDA graph.

    Every callable runs once eagerly first (JIT compilation, cuBLAS workspaces and DeepGEMM's
    compilation stay out of the numbers); ``check`` sees the first output and returns a reason
    when it is wrong: ``on_wrong`` gets it when given, otherwise WrongResult is raised.
    """
    import torch

    fns = [fn_factory(i) for i in range(copies)]
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        first = fns[0]()
        why = check(first) if check is not None else None
        del first
        if why and on_wrong is None:
            raise WrongResult(why)
        if why:
            on_wrong(why)
        for fn in fns[1:]:
            fn()
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()

    graph = torch.cuda.CUDAGraph()
    try:
        with torch.cuda.graph(graph):
            for fn in fns:
                fn()
        return PreparedGraph(graph.replay, copies, "graph", (graph, fns))
    except RuntimeError as exc:
        torch.cuda.synchronize()
        print(f"    graph capture failed ({first_line(exc)}); timing eager launches", flush=True)

        def run():
            for fn in fns:
                fn()
        return PreparedGraph(run, copies, "eager", (fns,))


def under_table(apply: Callable[[list], None], table: list,
                make: Callable[[int], Callable[[], object]]) -> Callable[[int], Callable[[], object]]:
    """A prepare_graph factory whose variant runs under a tuned table: ``apply(table)`` (ops.set_tuned_rows) when
    prepare_graph asks for callable 0, which is before any of the variant's eager calls and its capture; the op
    picks its row at capture, and prepare_graph captures one variant whole before the next one's factory runs."""
    def factory(i: int) -> Callable[[], object]:
        if i == 0:
            apply(table)
        return make(i)
    return factory


def time_prepared(graphs: Sequence[PreparedGraph], *, replays: int = MIN_REPLAYS,
                  warmup: int = WARMUP_REPLAYS) -> list[Timing]:
    """Per-call microseconds of each prepared graph, their replays interleaved round by round
    (replay r of every graph, in the order given, before replay r + 1 of any).

    Interleaving puts every graph under the same clocks: the H200's SM clock follows its power draw
    over milliseconds to seconds, so graphs timed one after another were each timed in a different
    state (the one after a heavy point, or after a peer's seconds-long JIT compile, differed by up to
    ~10%; gemm/NOTES.md, "Measuring")."""
    import torch

    for _ in range(warmup):
        for g in graphs:
            g.run()
    torch.cuda.synchronize()
    events = [[(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
               for _ in range(replays)] for _ in graphs]
    # No synchronisation inside the loop: the CPU runs ahead, so each replay is queued before the
    # one ahead of it ends and launch gaps stay out of every replay but the first.
    for r in range(replays):
        for g, ev in zip(graphs, events):
            ev[r][0].record()
            g.run()
            ev[r][1].record()
    torch.cuda.synchronize()
    out = []
    for g, ev in zip(graphs, events):
        ms = sorted(start.elapsed_time(end) for start, end in ev)
        median = statistics.median(ms)
        spread = (ms[int(0.9 * (len(ms) - 1))] - ms[int(0.1 * (len(ms) - 1))]) / median
        out.append(Timing(median * 1e3 / g.copies, spread, g.copies, replays, g.method))
    return out


def time_graph(fn_factory: Callable[[int], Callable[[], object]], copies: int, *,
               replays: int = MIN_REPLAYS, warmup: int = WARMUP_REPLAYS,
               check: Callable[[object], str | None] | None = None,
               on_wrong: Callable[[str], None] | None = None) -> Timing:
    """Time ``fn_factory(i)()`` for i in range(copies) as one CUDA graph; per-call microseconds
    (prepare_graph, then time_prepared alone)."""
    graph = prepare_graph(fn_factory, copies, check=check, on_wrong=on_wrong)
    try:
        return time_prepared([graph], replays=replays, warmup=warmup)[0]
    finally:
        del graph
