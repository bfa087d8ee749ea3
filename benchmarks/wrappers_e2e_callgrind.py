"""Instructions per call (callgrind Ir), end to end, of two programs that reach the
compiler wrappers: aliased inputs, one mutated, through
``torch.compile(backend="aot_eager")`` (``AOTSyntheticBaseWrapper``), and the same
tensor passed twice and mutated through ``aot_function(nop)`` (``AOTDedupeWrapper``);
each compiled with torch_aot_rt off (upstream) and on (C), measured in one process
over an empty call, as benchmarks/callgrind.py measures its rows.

    python benchmarks/wrappers_e2e_callgrind.py [--calls 500]
"""
import ctypes
import glob
import itertools
import os
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
from benchmarks import callgrind as cg  # noqa: E402

def inner(helper, calls):
    import gc
    import torch, torch_aot_rt
    from functorch.compile import aot_function, nop
    lib = ctypes.CDLL(helper); lib.cg_dump.argtypes = [ctypes.c_char_p]
    def alias(a, b):
        a.mul_(2)
        return a + 1, b * 3
    def dupe(a, b):
        a.mul_(2)
        return a + b
    base = torch.randn(6); x = torch.randn(4)
    a_, b_ = base[:4], base[2:]
    runs = {}
    for on in (False, True):
        with torch_aot_rt.enabled(on):
            torch._dynamo.reset()
            f = torch.compile(alias, backend="aot_eager", fullgraph=True); f(a_, b_)
            d = aot_function(dupe, nop, keep_inference_input_mutations=True); d(x, x)
        runs[("synthetic_base_aot_eager", on)] = (lambda f=f: f(a_, b_))
        runs[("dedupe_aot_function", on)] = (lambda d=d: d(x, x))
    runs[("empty", False)] = lambda: None
    gc.collect(); gc.disable()
    lib.cg_start()
    for (name, on), run in runs.items():
        for _ in itertools.repeat(None, 50): run()
        for n in (0, calls):
            lib.cg_zero()
            for _ in itertools.repeat(None, n): run()
            lib.cg_dump(f"{name}|{int(on)}|{n}".encode())
    lib.cg_stop()

if len(sys.argv) > 1 and sys.argv[1] == "--inner":
    inner(sys.argv[2], int(sys.argv[3]))
    sys.exit(0)
calls = int(sys.argv[2]) if len(sys.argv) > 2 and sys.argv[1] == "--calls" else 500
with tempfile.TemporaryDirectory() as d:
    helper = cg.build_helper(d)
    out = os.path.join(d, "cg.out")
    r = subprocess.run(["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}", "--instr-atstart=no",
                        sys.executable, __file__, "--inner", helper, str(calls)], capture_output=True, text=True, env=cg._env())
    assert r.returncode == 0, r.stderr[-3000:]
    counts = {}
    for p in glob.glob(out + "*"):
        label, total = cg._read_dump(p)
        if label and label.count("|") == 2:
            name, on, n = label.split("|"); counts[(name, on, int(n))] = total
    per = {(k[0], k[1]): (counts[(k[0], k[1], calls)] - counts[(k[0], k[1], 0)]) / calls for k in counts if k[2] == calls}
    empty = per[("empty", "0")]
    for name in ("dedupe_aot_function", "synthetic_base_aot_eager"):
        up, c = per[(name, "0")] - empty, per[(name, "1")] - empty
        print(f"{name}: upstream {up:,.0f} Ir, C {c:,.0f} Ir, saved {up - c:,.0f} ({c / up:.3f})")
