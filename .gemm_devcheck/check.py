"""Temporary device check of the sm90 GEMM through a ctypes shim (not part of the package)."""
import ctypes, sys, time, itertools
import torch
sys.path.insert(0, "..")
from vllm_blockfp8 import reference

lib = ctypes.CDLL("/tmp/gobj/libgemm.so")
lib.bf8_row_name.restype = ctypes.c_char_p
lib.bf8_rejects.restype = ctypes.c_char_p
lib.bf8_ws.restype = ctypes.c_size_t
lib.bf8_row_max_m.restype = ctypes.c_longlong
I64, P = ctypes.c_int64, ctypes.c_void_p
lib.bf8_ws.argtypes = [ctypes.c_int, I64, I64, I64, ctypes.c_int, ctypes.c_int]
lib.bf8_select.argtypes = [I64, I64, I64, ctypes.c_int]
lib.bf8_launch.argtypes = [ctypes.c_int, P, P, I64, P, P, P, I64, I64, I64, ctypes.c_int, ctypes.c_int, P, ctypes.c_size_t, P]
SM = torch.cuda.get_device_properties(0).multi_processor_count
ROWS = [lib.bf8_row_name(i).decode() for i in range(lib.bf8_num_rows())]
print("rows", ROWS, [lib.bf8_row_max_m(i) for i in range(len(ROWS))], "sm", SM)

def operands(m, n, k, seed, positive=False):
    g = torch.Generator(device="cuda").manual_seed(seed)
    x = torch.randn(m, k, device="cuda", generator=g)
    x = x * torch.exp(torch.randn(m, k // 128, device="cuda", generator=g)).repeat_interleave(128, 1)
    w = torch.randn(n, k, device="cuda", generator=g) * 0.05
    nb = -(-n // 128)
    w = w * torch.exp(torch.randn(nb, k // 128, device="cuda", generator=g)).repeat_interleave(128, 0)[:n].repeat_interleave(128, 1)
    if positive:
        x, w = x.abs(), w.abs()
    a, s = reference.quantize_per_token_group(x.to(torch.bfloat16))
    m4 = -(-m // 4) * 4
    buf = torch.full((k // 128, m4), float("nan"), device="cuda")  # padding rows poisoned
    buf[:, :m] = s.t()
    b, bs = reference.quantize_block_fp8(w)
    return a, buf[:, :m].t(), b, bs

def call(i, a, s, b, bs, d, ws=None, stream=None):
    m, k = a.shape; n = b.shape[0]
    need = lib.bf8_ws(i, m, n, k, int(d.dtype == torch.bfloat16), SM)
    if ws is None:
        ws = torch.full((max(need, 1),), 0xAB, dtype=torch.uint8, device="cuda")
    st = stream if stream is not None else torch.cuda.current_stream().cuda_stream
    return lib.bf8_launch(i, a.data_ptr(), s.data_ptr(), s.stride(1), b.data_ptr(), bs.data_ptr(), d.data_ptr(),
                          m, n, k, int(d.dtype == torch.bfloat16), SM, ws.data_ptr(), need, st), need

fails = []
def check(i, m, n, k, dt, seed=0, positive=False):
    a, s, b, bs = operands(m, n, k, seed, positive)
    d = torch.full((m, n), float("nan"), dtype=dt, device="cuda")
    rc, need = call(i, a, s, b, bs, d)
    torch.cuda.synchronize()
    tag = f"{ROWS[i]} M={m} N={n} K={k} {dt} ws={need}"
    if rc != 0:
        fails.append(f"{tag}: rc={rc}"); return
    ref = reference.gemm_ref(a, s, b, bs)
    try:
        reference.assert_close_to_ref(d, ref, tag)
    except AssertionError as e:
        o = d.double(); r = ref
        rel = ((o - r).norm() / r.norm()).item()
        fails.append(f"{tag}: {e} | relnorm={rel:.3g}")

t0 = time.time()
SMALL = [(256, 512), (384, 1024), (576, 7168), (2112, 2048), (200, 384)]
for i in range(len(ROWS)):
    for m in (1, 3, 4, 7, 64, 83, 128, 1000, 4096):
        for (n, k) in SMALL:
            for dt in (torch.bfloat16, torch.float16):
                check(i, m, n, k, dt)
    for m in (1, 83, 1000, 4096):
        for (n, k) in ((6144, 4096), (2112, 7168)):
            for dt in (torch.bfloat16, torch.float16):
                check(i, m, n, k, dt, seed=1)
    for m in (7, 128):
        check(i, m, 256, 16384, torch.bfloat16, seed=3, positive=True)
        check(i, m, 256, 16384, torch.float16, seed=3, positive=True)
print(f"correctness: {len(fails)} failures in {time.time()-t0:.0f}s")
for f in fails[:40]:
    print("FAIL", f)

# CUDA graph capture and replay with new inputs in place
gfails = 0
for i in range(len(ROWS)):
    for m in (5, 300):
        n, k = 576, 1024
        a, s, b, bs = operands(m, n, k, 4)
        a2, s2, _, _ = operands(m, n, k, 5)
        d = torch.empty((m, n), dtype=torch.bfloat16, device="cuda")
        need = lib.bf8_ws(i, m, n, k, 1, SM)
        ws = torch.full((max(need, 1),), 0xCD, dtype=torch.uint8, device="cuda")
        g = torch.cuda.CUDAGraph()
        call(i, a, s, b, bs, d, ws); torch.cuda.synchronize()
        with torch.cuda.graph(g):
            rc, _ = call(i, a, s, b, bs, d, ws)
        assert rc == 0, rc
        for src_a, src_s in ((a2, s2), (a.clone(), s.clone())):
            ref = reference.gemm_ref(src_a, src_s, b, bs)
            a.copy_(src_a); s.copy_(src_s); d.fill_(float("nan"))
            for _ in range(3):
                g.replay()
            torch.cuda.synchronize()
            try:
                reference.assert_close_to_ref(d, ref, f"graph {ROWS[i]} M={m}")
            except AssertionError as e:
                gfails += 1; print("GRAPH FAIL", e)
print("graph failures", gfails)

# Timing: rotating weight copies (>= 256 MB per graph), median of replays, us per call.
def bench(i, m, n, k, dt=torch.bfloat16):
    copies = max(2, -(-(256 << 20) // (n * k)))
    a, s, b, bs = operands(m, n, k, 7)
    bsets = [(b.clone(), bs.clone()) for _ in range(copies)]
    d = torch.empty((m, n), dtype=dt, device="cuda")
    need = lib.bf8_ws(i, m, n, k, 1, SM)
    ws = torch.empty((max(need, 1),), dtype=torch.uint8, device="cuda")
    call(i, a, s, b, bs, d, ws)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for bb, bbs in bsets:
            call(i, a, s, bb, bbs, d, ws)
    g.replay(); torch.cuda.synchronize()
    ts = []
    for _ in range(10):
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        e0.record(); g.replay(); e1.record(); torch.cuda.synchronize()
        ts.append(e0.elapsed_time(e1) * 1000 / copies)
    ts.sort()
    return ts[len(ts) // 2]

shapes = [(6144, 4096), (4096, 4096), (24576, 4096), (4096, 12288), (2112, 7168), (24576, 1536), (7168, 16384), (7168, 2048)]
print("shape M " + " ".join(ROWS) + " selected")
for (n, k) in shapes:
    for m in (1, 16, 64, 128, 256, 1024, 2048, 4096, 8192):
        ts = [bench(i, m, n, k) for i in range(len(ROWS))]
        sel = lib.bf8_select(m, n, k, SM)
        print(f"{n}x{k} M={m} " + " ".join(f"{t:.1f}" for t in ts) + f" sel={ROWS[sel]}", flush=True)
