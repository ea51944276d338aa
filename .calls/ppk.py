"""pp64x128 / coop128x128 per point (geomean of both orders), grouped by K; the K* rule of gemm/NOTES.md."""
import json, math, sys
B = "sm90_coop_128x128x128_c2x1_ovl"; C = "sm90_pp_64x128x128_c2x1_ovl"
def load(f):
    try:
        d = json.load(open(f))
    except Exception as e:
        print("missing", f, e); return {}
    return {(r["shape"], r["m"], r["n"], r["k"], r["impl"].split("@")[1]): r["us"] for r in d["records"] if "@" in r["impl"]}
def ratios(fa, fb):
    a, b = load(fa), load(fb); out = []
    for (s, m, n, k, row), us in sorted(a.items()):
        if row != B or (s, m, n, k, C) not in a or (s, m, n, k, B) not in b or (s, m, n, k, C) not in b: continue
        ra = a[(s, m, n, k, C)] / us; rb = b[(s, m, n, k, C)] / b[(s, m, n, k, B)]
        out.append((k, s, m, math.sqrt(ra * rb), us, a[(s, m, n, k, C)]))
    return sorted(out)
gm = lambda v: math.exp(sum(map(math.log, v)) / len(v)) if v else float("nan")
fit = ratios(sys.argv[1], sys.argv[2]); ho = ratios(sys.argv[3], sys.argv[4])
for name, pts in (("benchmark set, M = 1024 / 4096", fit), ("held-out, M = 2048", ho)):
    print("==", name)
    for k, s, m, r, ub, uc in pts: print(f"  K={k:6d} {s:32s} M={m:5d} base {ub:8.1f} cand {uc:8.1f} ratio {r:.3f}")
ks = sorted({p[0] for p in fit}); kstar = None
for kk in ks:
    v = [p[3] for p in fit if p[0] <= kk]
    if max(v) <= 1.00 and gm(v) <= 0.92: kstar = kk
print("K* =", kstar)
if kstar:
    v = [p[3] for p in fit if p[0] <= kstar]; print(f"fitted K <= K*: {len(v)} points geomean {gm(v):.3f} max {max(v):.3f}")
    h = [p[3] for p in ho if p[0] <= kstar]; print(f"held-out K <= K*: {len(h)} points geomean {gm(h):.3f} max {max(h) if h else float('nan'):.3f}  (rule: <= 0.95, none > 1.03)")
for lo, hi in ((0, 1024), (1025, 2048), (2049, 4096), (4097, 8192), (8193, 99999)):
    v = [p[3] for p in fit + ho if lo <= p[0] <= hi]
    if v: print(f"  all points K in [{lo}, {hi}]: {len(v)} geomean {gm(v):.3f} range {min(v):.3f}-{max(v):.3f}")
