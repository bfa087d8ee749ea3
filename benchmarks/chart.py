"""The chart that opens docs/benchmarks.md: per verified release and CPython,
what a call costs above its floor (callgrind instructions per call), upstream
against C, for AOTAutograd's runtime alone and for the whole compiled call.

One callgrind run per (release, CPython) writes its counts (``callgrind.py
--json``, the rows of ``ROWS`` below), then this draws them, stdlib only (an
SVG written by hand: no plotting package is needed):

    TORCH_AOT_RT_BENCH_E2E_ROWS=rto_inductor_no_grad,rto_inductor_backward,rto_mlp_no_grad \\
        .venv-2.15-py3.12/bin/python benchmarks/callgrind.py --calls 300 --cases inference \\
        --json benchmarks/results/callgrind-2.15-py3.12.json
    python3 benchmarks/chart.py benchmarks/results/callgrind-*.json -o docs/overhead.svg
"""

from __future__ import annotations

import argparse
import json
import sys
from xml.sax.saxutils import escape

# (panel, group, row, baseline variant, label): the rows drawn, each as its
# overhead over the baseline (upstream's and C's)
ROWS = (
    ("AOTAutograd's runtime alone", "wrapper", "inference", "direct",
     "runtime wrapper, inference"),
    ("AOTAutograd's runtime alone", "function", "training fw+bw", "direct",
     "CompiledFunction, forward + backward"),
    ("the whole compiled call", "e2e", "rto_inductor_no_grad", "eager",
     "a + 1, inductor, no grad"),
    ("the whole compiled call", "e2e", "rto_inductor_backward", "eager",
     "a + 1, inductor, backward"),
)
# (the MLP module rows are not drawn: on 2.15 inductor's fused kernels make the
# compiled MLP cheaper than eager, so its "overhead over eager" is negative)

UPSTREAM, C = "#9e9e9e", "#1f77b4"


def overheads(result: dict) -> list[tuple[str, str, float, float] | None]:
    """Per ROWS entry: (panel, label, upstream's overhead, C's), or None
    where the run did not measure it."""
    per_call = result["per_call"]
    out = []
    for panel, group, row, base, label in ROWS:
        key = f"{group}|{row}|"
        try:
            b, u, c = (per_call[key + v] for v in (base, "upstream", "c"))
        except KeyError:
            out.append(None)
            continue
        out.append((panel, label, u - b, c - b))
    return out


def _label(result: dict) -> str:
    """torch X on CPython Y (runs before the CPython was recorded: 3.11.7)."""
    return f"torch {result['torch']}, CPython {result.get('python', '3.11.7')}"


def _order(result: dict) -> list:
    torch = [int(x) for x in result["torch"].split("+")[0].split(".")[:2]]
    python = [int(x) for x in result.get("python", "3.11.7").split(".")[:2]]
    return torch + python


def svg(results: list[dict]) -> str:
    """The chart: a block per release, a pair of bars per row (upstream above,
    C below), each bar's length its overhead, labelled with it and C's ratio."""
    bar_h, gap, label_w, plot_w, pad = 11, 9, 270, 420, 12
    rows = [(_label(r), overheads(r)) for r in results]
    scale = max((max(u, c) for _, ovs in rows for o in ovs if o for u, c in [o[2:]]),
                 default=1.0)
    lines, y = [], 44
    for version, ovs in rows:
        lines.append(f'<text x="{pad}" y="{y}" font-weight="bold">{escape(version)}</text>')
        y += 8
        panel_seen = None
        for o in ovs:
            if o is None:
                continue
            panel, label, u, c = o
            if panel != panel_seen:
                y += 14
                lines.append(f'<text x="{pad}" y="{y}" font-style="italic">{escape(panel)}</text>')
                panel_seen = panel
                y += 4
            lines.append(f'<text x="{pad + 10}" y="{y + bar_h + 4}">{escape(label)}</text>')
            for value, colour, dy in ((u, UPSTREAM, 0), (c, C, bar_h + 1)):
                w = max(1.0, plot_w * max(value, 0.0) / scale)
                lines.append(f'<rect x="{label_w}" y="{y + dy}" width="{w:.1f}" height="{bar_h}" '
                             f'fill="{colour}"/>')
                text = f"{value / 1000:,.1f}k"
                if colour == C and u > 0:
                    text += f"  ({value / u:.2f} of upstream's)"
                lines.append(f'<text x="{label_w + w + 4:.1f}" y="{y + dy + bar_h - 2}" '
                             f'font-size="10">{escape(text)}</text>')
            y += 2 * bar_h + gap
        y += 10
    width = label_w + plot_w + 200
    head = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{y + 10}" '
        f'font-family="sans-serif" font-size="12">',
        f'<rect width="{width}" height="{y + 10}" fill="white"/>',
        f'<text x="{pad}" y="18" font-weight="bold">Per-call overhead, callgrind '
        'instructions above the floor (eager, or the call the layer wraps)</text>',
        f'<rect x="{label_w}" y="26" width="10" height="10" fill="{UPSTREAM}"/>',
        f'<text x="{label_w + 14}" y="35">upstream</text>',
        f'<rect x="{label_w + 90}" y="26" width="10" height="10" fill="{C}"/>',
        f'<text x="{label_w + 104}" y="35">torch_aot_rt</text>',
    ]
    return "\n".join(head + lines + ["</svg>"]) + "\n"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("results", nargs="+",
                   help="callgrind.py --json files, one per release and CPython")
    p.add_argument("-o", "--out", required=True, help="the SVG to write")
    args = p.parse_args(argv)
    results = []
    for path in args.results:
        with open(path) as f:
            results.append(json.load(f))
    results.sort(key=_order)
    with open(args.out, "w") as f:
        f.write(svg(results))
    for r in results:
        for o in overheads(r):
            if o is not None:
                print(f"{_label(r):>34}  {o[1]:<40} upstream {o[2]:>9,.0f}  C {o[3]:>9,.0f}"
                      f"  ratio {o[3] / o[2]:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
