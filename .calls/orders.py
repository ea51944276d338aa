"""Per point: time under each tile order (one process each), which swizzle rule R1 (waves) / R2 (no padding) picks."""
import json, math, sys, glob, os
out = sys.argv[1]
def cdiv(a, b): return -(-a // b)
def rup(a, b): return cdiv(a, b) * b
def used(tm, tn, s):
    d = min(tm, tn)
    for lg, need in ((3, 6), (2, 3), (1, 2)):
        if s >= (1 << lg) and d >= need: return 1 << lg
    return 1
def picks(m, n, sms=132):
    tm, tn = rup(cdiv(m, 128), 2), cdiv(n, 128)
    ctas = sms // 2 * 2
    pad = lambda s: rup(tm, 2 * s) * rup(tn, s)
    waves = lambda s: cdiv(pad(s), ctas)
    r1 = next((s for s in (8, 4, 2) if used(tm, tn, s) == s and waves(s) <= waves(1)), 1)
    r2 = next((s for s in (8, 4, 2) if used(tm, tn, s) == s and pad(s) == pad(1)), 1)
    # CUTLASS's own cap when the default asks for 8 (used(8) may be 4)
    r1 = next((s for s in (used(tm, tn, 8), used(tm, tn, 4), used(tm, tn, 2)) if s > 1 and waves(s) <= waves(1)), 1)
    return r1, r2, {s: waves(s) for s in (1, 2, 4, 8)}
T = {}
for f in glob.glob(os.path.join(out, "order_*.json")):
    base = os.path.basename(f)[6:-5]  # e.g. along_m_8_A
    order = base.rsplit("_", 1)[0]
    for r in json.load(open(f))["records"]:
        if r["impl"] == "ours":
            T.setdefault((r["shape"], r["m"], r["n"], r["k"]), {})[order] = r["us"]
cols = ["along_m_8", "along_m_4", "along_m_2", "along_m_1", "heuristic_1"]
print(f"{'shape':20s} {'M':>5s} " + " ".join(f"{c:>11s}" for c in cols) + "  R1 R2  R1/old R1/R2 best  waves(1,2,4,8)")
g_new, g_r2 = [], []
for (s, m, n, k), t in sorted(T.items()):
    r1, r2, w = picks(m, n)
    get = lambda sw: t.get(f"along_m_{sw}")
    old = t.get("along_m_8")
    new = get(r1); alt = get(r2)
    best = min(t, key=t.get)
    a = new / old if new and old else float("nan"); b = new / alt if new and alt else float("nan")
    g_new.append(a); g_r2.append(b)
    print(f"{s:20s} {m:5d} " + " ".join(f"{t.get(c, float('nan')):11.1f}" for c in cols) +
          f"  {r1:2d} {r2:2d}  {a:6.3f} {b:6.3f} {best}  {w[1]},{w[2]},{w[4]},{w[8]}")
gm = lambda v: math.exp(sum(map(math.log, v)) / len(v))
print(f"R1 / old default geomean {gm(g_new):.3f}; R1 / R2 geomean {gm(g_r2):.3f}, max {max(g_r2):.3f}")
