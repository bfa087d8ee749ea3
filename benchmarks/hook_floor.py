"""What Dynamo's C++ eval-frame hook costs per call, from ``callgrind.py --keep`` dumps.

    python benchmarks/hook_floor.py DIR [--rows rto_inductor_no_grad ...]

For each end-to-end row and variant kept in DIR, the hook's own instructions per
call around the user's frame: ``dynamo__custom_eval_frame`` (torch's
``eval_frame_cpp.cpp``: the callback's ``get_backend`` walk, the cache look-up
and guards, the frame-locals mapping, the profiler range) minus what it runs
inside, the cached transformed code (``dynamo_eval_custom_code``). Both are
counted where the hook is entered from the user's call, not its recursive
entries (``'2`` in callgrind's names), which run inside the transformed code.

That cost is upstream's C++ in every variant: a floor that no change to the
Python layers lowers. Printed beside the row's overhead over eager, upstream
and C (from the same dumps), and as a share of upstream's overhead: the lowest
ratio C could reach with every Python layer free.
"""

from __future__ import annotations

import argparse
import glob
import re
import subprocess
import sys

HOOK, INNER = "dynamo__custom_eval_frame", "dynamo_eval_custom_code"


def _trigger(path: str) -> str | None:
    prefix = "desc: Trigger: Client Request: "
    with open(path, errors="replace") as f:
        for line in f:
            if line.startswith(prefix):
                return line[len(prefix):].strip()
    return None


def _totals(path: str) -> tuple[int, dict[str, int]]:
    """(program total, inclusive Ir of the hook and its inner eval)"""
    out = subprocess.run(
        ["callgrind_annotate", "--inclusive=yes", "--threshold=100", path],
        capture_output=True, text=True, check=True).stdout
    total = 0
    found: dict[str, int] = {}
    for line in out.splitlines():
        m = re.match(r"\s*([\d,]+)\s+(?:\([^)]*\))?\s+(.*)$", line)
        if not m:
            continue
        ir, rest = int(m.group(1).replace(",", "")), m.group(2)
        if rest.startswith("PROGRAM TOTALS"):
            total = ir
            continue
        for name in (HOOK, INNER):
            # the function itself, not its recursive entry ('2) or a lambda
            if re.search(rf":{name} \[", rest) and name not in found:
                found[name] = ir
    return total, found


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("dir")
    p.add_argument("--rows", nargs="*")
    a = p.parse_args(argv)
    dumps: dict[tuple[str, str, int], str] = {}
    for path in glob.glob(f"{a.dir}/*.out*"):
        t = _trigger(path)
        if t and t.startswith("e2e|"):
            _, row, variant, n = t.split("|")
            dumps[(row, variant, int(n))] = path
    rows = a.rows or sorted({r for r, _, _ in dumps})
    print(f"{'row':28} {'variant':9} {'Ir/call':>9} {'hook':>7}  ovh/eager  hook/ovh(upstream)")
    for row in rows:
        per: dict[str, tuple[float, float]] = {}
        for variant in ("eager", "upstream", "c"):
            n = max((k[2] for k in dumps if k[:2] == (row, variant)), default=0)
            if n == 0:
                continue
            t0, _ = _totals(dumps[(row, variant, 0)])
            t1, f1 = _totals(dumps[(row, variant, n)])
            hook = (f1.get(HOOK, 0) - f1.get(INNER, 0)) / n
            per[variant] = ((t1 - t0) / n, hook)
        if "eager" not in per or "upstream" not in per:
            continue
        eager = per["eager"][0]
        up_ovh = per["upstream"][0] - eager
        for variant, (ir, hook) in per.items():
            share = f"{hook / up_ovh:.3f}" if variant != "eager" and up_ovh > 0 else ""
            print(f"{row:28} {variant:9} {ir:9,.0f} {hook:7,.0f}  {ir - eager:9,.0f}  {share}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
