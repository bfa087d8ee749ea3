"""Per-call overhead of AOTAutograd's runtime: upstream vs torch_aot_rt's C.

    python benchmarks/report.py               # the three tables
    python benchmarks/report.py --callgrind   # + instruction counts (valgrind)

Table 1, runtime wrapper alone (see _cases.py): ns/call of the trivial compiled
function called directly, through upstream's wrapper, through the C wrapper
(fastest of the rounds); overhead = wrapper - direct; ratio = C overhead /
upstream overhead, also from the median of per-round differences; the result of
C and upstream compared once per configuration.

Table 2, CompiledFunction alone (see _function.py): the boxed apply of upstream's
CompiledFunction and of the C one on trivial compiled forward/backward graphs,
forward only (fw) and forward + torch.autograd.backward (fw+bw), against the
trivial compiled forward (and backward) called directly.

Table 3, end to end: torch.compile(backend="aot_eager") of x.sin() on a
4-element tensor, upstream runtime vs C runtime, overhead over eager x.sin()
(and over eager x.sin().backward(g) in the requires_grad_backward row).

All variants of one configuration are measured in the same process, in rounds
that alternate them, so noise hits all alike: compare the ratios, not absolute
times across runs.
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

import torch  # noqa: E402

from benchmarks import _cases, _timing  # noqa: E402


def _fmt(x, width=9, digits=0):
    if x is None:
        return "n/a".rjust(width)
    return f"{x:{width}.{digits}f}"


def _ratio(c, up):
    if c is None or up is None or up <= 0:
        return None
    return c / up


def header():
    rt = _cases.torch_aot_rt
    lines = [
        f"date: {time.strftime('%Y-%m-%d %H:%M:%S %Z')}",
        f"machine: {platform.machine()}, {os.cpu_count()} CPUs "
        f"({_cpu_model()}), {platform.system()} {platform.release()}",
        f"python {platform.python_version()}, torch {torch.__version__}, "
        f"torch_aot_rt {getattr(rt, '__version__', 'not importable')}",
        f"C extension: {_c_build()}",
        f"torch threads: {torch.get_num_threads()}",
    ]
    return "\n".join(lines)


def _c_build():
    """'available (built <mtime of the extension module>)', or why not."""
    if _cases._C is None:
        return _cases.C_UNAVAILABLE
    try:
        built = time.strftime(
            "%Y-%m-%d %H:%M:%S %Z", time.localtime(os.path.getmtime(_cases._C.__file__))
        )
    except (AttributeError, OSError):
        return "available"
    return f"available (built {built}: {os.path.basename(_cases._C.__file__)})"


def _cpu_model():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def run_table(title, cases, variants, base, *, rounds, target_s, check, context_of=None):
    print(f"\n== {title} ==")
    print(
        f"ns/call, fastest of {rounds} interleaved rounds (contention only ever adds "
        f"time); ovh = variant - {base};\n"
        f"ratio = C ovh / upstream ovh; ratio(med): the same from the median over "
        f"rounds of the per-round differences;\n"
        f"p25-p75: quartiles of the per-round ratio (the noise); check: C and "
        f"upstream results compared once"
    )
    width = max([22] + [len(n) + 1 for n in cases])
    cols = (
        f"{'configuration':<{width}}{base:>9}{'upstream':>10}{'C':>9}"
        f"{'ovh up':>9}{'ovh C':>9}{'ratio':>8}{'ratio(med)':>11}{'p25-p75':>13}  check"
    )
    print(cols)
    print("-" * len(cols))
    notes = []
    results = {}
    for name, case in cases.items():
        runs = {v: case.call(v) for v in variants if case.call(v) is not None}
        number = _timing.calibrate(runs, target_s)
        ctx = context_of(case) if context_of else None
        samples = _timing.interleaved(runs, rounds=rounds, number=number, context=ctx,
                                      switched=getattr(case, "switched", None))
        s = _timing.summarize(samples, base)
        ok, msg = check(case)
        results[name] = (s, ok, msg)
        fastest = s["min"]
        ovh = s["overhead_min"]
        ratio = _ratio(ovh.get("c"), ovh.get("upstream"))
        ratio_med = _ratio(s["overhead"].get("c"), s["overhead"].get("upstream"))
        q = _timing.ratio_quartiles(samples, base, "c", "upstream")
        s["ratio_quartiles"] = q
        spread = "n/a" if q is None else f"{q[0]:.2f}-{q[1]:.2f}"
        status = {True: "ok", False: "MISMATCH", None: "-"}[ok]
        print(
            f"{name:<{width}}{_fmt(fastest.get(base))}{_fmt(fastest.get('upstream'), 10)}"
            f"{_fmt(fastest.get('c'))}{_fmt(ovh.get('upstream'))}{_fmt(ovh.get('c'))}"
            f"{_fmt(ratio, 8, 3)}{_fmt(ratio_med, 11, 3)}{spread:>13}  {status}",
            flush=True,
        )
        if case.c_note:
            notes.append((name, case.c_note))
        c_stats = getattr(case, "c_stats", None)
        if c_stats and not case.c_note:
            built = ", ".join(
                f"{k} +{c_stats[k]}"
                for k in ("runtime_wrappers", "autograd_functions", "fallbacks")
            )
            notes.append((name, f"C compile built: {built}"))
        if ok is False:
            notes.append((name, msg))
    print_notes(notes)
    return results


def print_notes(notes):
    """Notes as (configuration, text); one line per distinct text."""
    by_text: dict[str, list[str]] = {}
    for name, text in notes:
        by_text.setdefault(text, []).append(name)
    for text, names in by_text.items():
        print(f"  note ({', '.join(names)}): {text}")


def verdict(results):
    """The project's targets, on the runtime-wrapper table (fastest-round
    overheads; the median-based ratio in parentheses)."""
    lines = []
    inf = results.get("inference")
    if inf is not None:
        r = _ratio(inf[0]["overhead_min"].get("c"), inf[0]["overhead_min"].get("upstream"))
        r_med = _ratio(inf[0]["overhead"].get("c"), inf[0]["overhead"].get("upstream"))
        if r is not None:
            lines.append(
                f"target 1: C overhead <= 1/5 of upstream's, inference without "
                f"mutations: ratio {r:.3f} (median {r_med:.3f}) -> "
                f"{'MET' if r <= 0.2 else 'NOT MET'}"
            )
    worse, worse_med = [], []
    measured = 0
    for name, (s, _ok, _msg) in results.items():
        if s["overhead_min"].get("c") is None:
            continue
        measured += 1
        if not s["overhead_min"]["c"] < s["overhead_min"]["upstream"]:
            worse.append(name)
        if not s["overhead"]["c"] < s["overhead"]["upstream"]:
            worse_med.append(name)
    if measured:
        lines.append(
            "target 2: C overhead < upstream's in every configuration: "
            + ("MET" if not worse else f"NOT MET in {', '.join(worse)}")
            + f" ({measured} measured; by medians: "
            + ("all smaller" if not worse_med else f"not smaller in {', '.join(worse_med)}")
            + ")"
        )
    compared = [ok for _s, ok, _m in results.values() if ok is not None]
    mism = [n for n, (_s, ok, _m) in results.items() if ok is False]
    if not compared:
        lines.append("results c vs upstream: not compared (no C wrapper)")
    elif mism:
        lines.append(f"results c vs upstream: MISMATCH in {', '.join(mism)}")
    else:
        lines.append(f"results c vs upstream: equal in all {len(compared)} configurations")
    return lines


def _results_line(label, results, unit):
    compared = [ok for _s, ok, _m in results.values() if ok is not None]
    mism = [n for n, (_s, ok, _m) in results.items() if ok is False]
    if not compared:
        return f"results c vs upstream{label}: not compared (no C variant)"
    if mism:
        return f"results c vs upstream{label}: MISMATCH in {', '.join(mism)}"
    return f"results c vs upstream{label}: equal in all {len(compared)} {unit}"


FW_BW_TARGET = 0.5


def verdict_part2(fn_results, e2e_results):
    """Part 2's targets (CompiledFunction in C): fw+bw overhead ratio <= 0.5 in
    the CompiledFunction table; end-to-end requires_grad overhead measurably
    below upstream's."""
    lines = []
    fw_bw = {
        n: r for n, r in fn_results.items()
        if n.endswith(" fw+bw") and r[0]["overhead_min"].get("c") is not None
    }
    if fw_bw:
        parts, missed = [], []
        for name, (s, _ok, _msg) in fw_bw.items():
            r = _ratio(s["overhead_min"]["c"], s["overhead_min"]["upstream"])
            r_med = _ratio(s["overhead"]["c"], s["overhead"]["upstream"])
            parts.append(f"{name} {_fmt(r, 0, 3)} (median {_fmt(r_med, 0, 3)})")
            if r is None or r > FW_BW_TARGET:
                missed.append(name)
        lines.append(
            "target 3: CompiledFunction forward+backward, C overhead <= 1/2 of "
            "upstream's: " + "; ".join(parts) + " -> "
            + ("MET" if not missed else
               ("NOT MET" if len(missed) == len(fw_bw) else f"NOT MET in {', '.join(missed)}"))
        )
    for name in ("requires_grad", "requires_grad_backward"):
        if name not in e2e_results or e2e_results[name][0]["overhead_min"].get("c") is None:
            continue
        s = e2e_results[name][0]
        up, c = s["overhead_min"]["upstream"], s["overhead_min"]["c"]
        up_med, c_med = s["overhead"]["upstream"], s["overhead"]["c"]
        q = s.get("ratio_quartiles")
        # measurable: lower by the fastest rounds, by the medians, and in at
        # least 3 rounds out of 4 (upper quartile of the per-round ratio < 1)
        measurable = c < up and c_med < up_med and q is not None and q[1] < 1
        spread = "n/a" if q is None else f"{q[0]:.2f}-{q[1]:.2f}"
        lines.append(
            f"target 4: end to end, {name}: overhead over eager {up:.0f} -> {c:.0f} ns "
            f"({c - up:+.0f} ns, {100 * (c - up) / up:+.0f}%; by medians "
            f"{up_med:.0f} -> {c_med:.0f}, {100 * (c_med - up_med) / up_med:+.0f}%; "
            f"per-round ratio p25-p75 {spread}) -> "
            + ("MET (C below upstream)" if measurable else "NOT MET (not measurably lower)")
        )
    return lines


def verdict_instructions(per_call):
    """Targets 3 and 4 again, on the callgrind counts (the stable measure)."""
    lines = []

    def ovh(group, name, base):
        d = per_call.get((group, name, base))
        u = per_call.get((group, name, "upstream"))
        c = per_call.get((group, name, "c"))
        if None in (d, u, c):
            return None
        return u - d, c - d

    from benchmarks import _function

    parts, missed = [], []
    for name in _function.ROWS:
        if not name.endswith(" fw+bw"):
            continue
        o = ovh("function", name, "direct")
        if o is None or o[0] <= 0:
            continue
        r = o[1] / o[0]
        parts.append(f"{name} {r:.3f}")
        if r > FW_BW_TARGET:
            missed.append(name)
    if parts:
        lines.append(
            "target 3 by instruction counts: " + "; ".join(parts) + " -> "
            + ("MET" if not missed else
               ("NOT MET" if len(missed) == len(parts) else f"NOT MET in {', '.join(missed)}"))
        )
    for name in ("requires_grad", "requires_grad_backward"):
        o = ovh("e2e", name, "eager")
        if o is None or o[0] <= 0:
            continue
        lines.append(
            f"target 4 by instruction counts, {name}: overhead over eager "
            f"{o[0]:.0f} -> {o[1]:.0f} Ir ({o[1] - o[0]:+.0f}, "
            f"{100 * (o[1] - o[0]) / o[0]:+.0f}%) -> "
            + ("MET (C below upstream)" if o[1] < o[0] else "NOT MET")
        )
    return lines


def main(argv=None):
    from benchmarks import _function

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=21, help="interleaved rounds (21)")
    p.add_argument(
        "--target-ms", type=float, default=10.0,
        help="duration of one measurement of the slowest variant, ms (10)",
    )
    p.add_argument("--cases", nargs="*", default=None, choices=list(_cases.CONFIGS))
    p.add_argument(
        "--function-cases", nargs="*", default=None, choices=list(_function.ROWS),
        help="rows of table 2 (default: all)",
    )
    p.add_argument("--no-wrapper", action="store_true", help="skip table 1")
    p.add_argument("--no-function", action="store_true", help="skip table 2")
    p.add_argument("--no-e2e", action="store_true", help="skip table 3")
    p.add_argument(
        "--callgrind", action="store_true",
        help="also count instructions per call under valgrind --tool=callgrind",
    )
    p.add_argument("--callgrind-calls", type=int, default=2000)
    p.add_argument("--callgrind-cases", nargs="*", default=None, choices=list(_cases.CONFIGS))
    p.add_argument("--callgrind-keep", metavar="DIR", default=None,
                   help="keep the callgrind dumps in DIR (for callgrind_annotate)")
    args = p.parse_args(argv)

    print(header())
    target_s = args.target_ms / 1e3
    results, fn_results, e2e_results = {}, {}, {}
    if not args.no_wrapper:
        cases = _cases.build_cases(args.cases)
        results = run_table(
            "runtime wrapper alone (trivial compiled function)",
            cases, _cases.VARIANTS, "direct",
            rounds=args.rounds, target_s=target_s, check=_cases.check_c_matches_upstream,
        )
    if not args.no_function:
        fn_cases = _function.build_function_cases(args.function_cases)
        fn_results = run_table(
            "CompiledFunction alone (trivial compiled forward/backward; fw: boxed apply, "
            "fw+bw: apply + torch.autograd.backward)",
            fn_cases, _function.VARIANTS, "direct",
            rounds=args.rounds, target_s=target_s,
            check=_function.check_c_matches_upstream,
        )
    if not args.no_e2e:
        from benchmarks import _e2e

        e2e = _e2e.build_e2e_cases()
        e2e_results = run_table(
            'end to end: torch.compile(backend="aot_eager") of x.sin(), 4 floats',
            e2e, _e2e.E2E_VARIANTS[:3], "eager",  # the timed rows: no graph floor
            rounds=args.rounds, target_s=target_s, check=_e2e.check_c_matches_upstream,
            context_of=lambda case: case.context,
        )
    lines = []
    if results:
        lines += verdict(results)
    lines += verdict_part2(fn_results, e2e_results)
    if fn_results:
        lines.append(_results_line(" (CompiledFunction, outputs and grads)",
                                   fn_results, "rows"))
    if e2e_results:
        lines.append(_results_line(" (end to end)", e2e_results, "rows"))
    if lines:
        print()
        for line in lines:
            print(line)
    if args.callgrind:
        from benchmarks import callgrind

        print()
        per_call = callgrind.report(
            cases=args.callgrind_cases, calls=args.callgrind_calls, e2e=not args.no_e2e,
            function=not args.no_function, keep=args.callgrind_keep,
        )
        lines = verdict_instructions(per_call)
        if lines:
            print()
            for line in lines:
                print(line)


if __name__ == "__main__":
    main()
