"""Instructions per call (callgrind Ir) of direct / upstream / C, per configuration.

    python benchmarks/callgrind.py [--calls 2000] [--cases inference ...]
    python benchmarks/callgrind.py --keep DIR   # keep the dumps, for callgrind_annotate

runs itself under ``valgrind --tool=callgrind --instr-atstart=no`` (so importing
torch is not simulated), and inside:

* builds the cases and warms every variant up;
* switches instrumentation on through callgrind client requests (a ten-line C
  helper compiled on the fly with the system compiler and loaded with ctypes);
* per configuration and variant, for n in (0, calls): zero the counters, run n
  calls, dump the counters; Ir per call = (Ir(calls) - Ir(0)) / calls. The n=0
  dump holds the constant cost of the measurement itself (ctypes calls, loop
  setup); subtracting it leaves the calls alone.

Groups: the runtime wrapper alone (``_cases.py``), CompiledFunction alone
(``_function.py``) and the other per-call layers alone (``_layers.py``;
``--no-function`` skips both) and end to end (``_e2e.py``;
``--no-e2e``). With ``--keep DIR`` the dump files stay in DIR (one per
configuration, variant and n; the label is in each file's ``desc: Trigger``
line), so that ``callgrind_annotate --inclusive=yes FILE`` shows where a
variant's instructions go.

Without a compiler or <valgrind/callgrind.h> it falls back to whole-process
counts: one run with 0 calls and one with ``calls`` calls per variant, same
setup, and the difference divided by ``calls`` (slow: torch's import runs
under the simulator every time; PYTHONHASHSEED is fixed to keep the runs alike).

The counts are stable from run to run where timings on a shared machine are not.
"""

from __future__ import annotations

import argparse
import ctypes
import glob
import itertools
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)

_HELPER_C = r"""
#include <valgrind/valgrind.h>
#include <valgrind/callgrind.h>
int cg_running(void) { return RUNNING_ON_VALGRIND; }
void cg_start(void) { CALLGRIND_START_INSTRUMENTATION; }
void cg_stop(void) { CALLGRIND_STOP_INSTRUMENTATION; }
void cg_zero(void) { CALLGRIND_ZERO_STATS; }
void cg_dump(const char *label) { CALLGRIND_DUMP_STATS_AT(label); }
"""


def build_helper(tmpdir: str) -> str | None:
    cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if cc is None or not os.path.exists("/usr/include/valgrind/callgrind.h"):
        return None
    src = os.path.join(tmpdir, "cg_helper.c")
    lib = os.path.join(tmpdir, "cg_helper.so")
    with open(src, "w") as f:
        f.write(_HELPER_C)
    r = subprocess.run(
        [cc, "-O1", "-shared", "-fPIC", "-o", lib, src], capture_output=True, text=True
    )
    return lib if r.returncode == 0 else None


_INDUCTOR_CACHE = tempfile.mkdtemp(prefix="torch_aot_rt_callgrind_inductor_")


def _env():
    env = dict(os.environ)
    env.setdefault("PYTHONHASHSEED", "0")
    env.setdefault("OMP_NUM_THREADS", "1")
    # inductor's kernels built here, for valgrind's CPU (AVX2: _e2e.py), not
    # found in a cache a -march=native build of the same source filled
    env.setdefault("TORCHINDUCTOR_CACHE_DIR", _INDUCTOR_CACHE)
    return env


def _loop(run, n):
    for _ in itertools.repeat(None, n):
        run()


# ---------------------------------------------------------------------------
# inside valgrind


def inner_toggle(helper: str, case_names, calls: int, e2e: bool, function: bool,
                 layers_only: bool = False) -> None:
    import contextlib
    import gc

    from benchmarks import _cases

    lib = ctypes.CDLL(helper)
    lib.cg_dump.argtypes = [ctypes.c_char_p]
    groups = [("wrapper", _cases.build_cases(case_names), contextlib.nullcontext)]
    if layers_only:
        groups = []
    if function and not layers_only:
        from benchmarks import _function

        groups.append(
            ("function", _function.build_function_cases(), contextlib.nullcontext)
        )
    if function:
        from benchmarks import _layers

        groups.append(("layers", _layers.build_layer_cases(), contextlib.nullcontext))
    if e2e:
        from benchmarks import _e2e

        groups.append(("e2e", _e2e.build_e2e_cases(), None))
    gc.collect()
    gc.disable()
    lib.cg_start()
    notes = {}
    for group, cases, context in groups:
        for name, case in cases.items():
            if case.c_note:
                notes[f"{group}:{name}"] = case.c_note
            ctx = context or case.context
            variants = list(case.available())
            # the C core alone, in the same process: the "c" callable with the
            # C core's C++ routes switched off (where the C++ part is loaded)
            if "c" in variants and _cases._C is not None and _cases._C._set_cpp_routes(True):
                variants.append("c_core")
            for variant in variants:
                run = case.call("c" if variant == "c_core" else variant)
                _cases._C is not None and _cases._C._set_cpp_routes(variant != "c_core")
                switched = getattr(case, "switched", None)
                with ctx(), (switched("c" if variant == "c_core" else variant)
                             if switched else contextlib.nullcontext()):
                    _loop(run, 50)  # warm, now with instrumentation on
                    for n in (0, calls):
                        lib.cg_zero()
                        _loop(run, n)
                        lib.cg_dump(f"{group}|{name}|{variant}|{n}".encode())
                _cases._C is not None and _cases._C._set_cpp_routes(True)
    lib.cg_stop()
    gc.enable()
    print("CG_NOTES " + json.dumps(notes), flush=True)


def inner_whole(case_name: str, variant: str, calls: int) -> None:
    import gc

    from benchmarks import _cases

    case = _cases.build_case(case_name)
    gc.collect()
    gc.disable()
    run = case.call(variant) if variant != "none" else None
    if run is not None:
        _loop(run, calls)
    gc.enable()
    print("CG_NOTES " + json.dumps({case_name: case.c_note} if case.c_note else {}))


# ---------------------------------------------------------------------------
# outside: drive valgrind, parse its output


def _is_wrapper(executable: str) -> bool:
    """Whether the interpreter is a script that execs the real one (the
    wrappers scripts/provision_python.sh makes for CPython 3.14 and 3.15,
    which enter a Debian root): valgrind must then follow the exec."""
    try:
        with open(executable, "rb") as f:
            return f.read(2) == b"#!"
    except OSError:
        return False


def _valgrind(out_file: str, inner_args: list[str], instr_atstart: bool, script=__file__):
    follow = []
    env = _env()
    if _is_wrapper(sys.executable):
        # one dump file per process (the labelled ones are the interpreter's);
        # valgrind runs the wrapper by its own path, so the interpreter it
        # execs does not find the venv: its packages go on the path
        import site

        follow = ["--trace-children=yes"]
        out_file += ".%p"
        env["PYTHONPATH"] = os.pathsep.join(
            [p for p in (env.get("PYTHONPATH"), *site.getsitepackages()) if p])
    cmd = [
        "valgrind", "--tool=callgrind", f"--callgrind-out-file={out_file}", *follow,
        f"--instr-atstart={'yes' if instr_atstart else 'no'}",
        sys.executable, os.path.abspath(script), *inner_args,
    ]
    r = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if r.returncode != 0:
        raise RuntimeError(
            f"valgrind failed ({r.returncode}): {' '.join(cmd)}\n{r.stderr[-4000:]}"
        )
    notes = {}
    for line in r.stdout.splitlines():
        if line.startswith("CG_NOTES "):
            notes.update(json.loads(line[len("CG_NOTES "):]))
    return notes


def _read_dump(path: str) -> tuple[str | None, int]:
    label, total = None, None
    with open(path) as f:
        for line in f:
            if line.startswith("desc: Trigger:"):
                m = re.search(r"Client Request: (.*)$", line.strip())
                label = m.group(1) if m else None
            elif line.startswith("totals:") or (line.startswith("summary:") and total is None):
                total = int(line.split()[1])
    return label, total or 0


def measure_toggle(helper, case_names, calls, e2e, function=True, keep=None,
                   layers_only=False):
    """{(group, name, variant): Ir per call}, notes. ``keep``: a directory
    to copy the dump files to."""
    with tempfile.TemporaryDirectory() as d:
        out = os.path.join(d, "cg.out")
        inner = ["--inner-toggle", helper, "--calls", str(calls), "--cases", *case_names]
        if e2e:
            inner.append("--e2e")
        if function:
            inner.append("--function")
        if layers_only:
            inner.append("--layers-only")
        notes = _valgrind(out, inner, instr_atstart=False)
        if keep:
            os.makedirs(keep, exist_ok=True)
            for path in glob.glob(out + "*"):
                shutil.copy(path, keep)
        counts = {}
        for path in glob.glob(out + "*"):
            label, total = _read_dump(path)
            if label and label.count("|") == 3:
                group, name, variant, n = label.split("|")
                counts[(group, name, variant, int(n))] = total
    per_call = {}
    for (group, name, variant, n), total in counts.items():
        if n == calls and (group, name, variant, 0) in counts:
            base = counts[(group, name, variant, 0)]
            per_call[(group, name, variant)] = (total - base) / calls
    return per_call, notes


def measure_whole(case_names, calls):
    """Fallback without client requests: runtime wrapper cases only."""
    from benchmarks import _cases

    per_call, notes = {}, {}
    with tempfile.TemporaryDirectory() as d:
        for name in case_names:
            base_file = os.path.join(d, f"{name}-base.out")
            notes.update(_valgrind(base_file, ["--inner-whole", name, "none", "0"], True))
            _, base = _read_dump(base_file)
            for variant in _cases.VARIANTS:
                f = os.path.join(d, f"{name}-{variant}.out")
                try:
                    _valgrind(f, ["--inner-whole", name, variant, str(calls)], True)
                except RuntimeError:
                    continue
                _, total = _read_dump(f)
                per_call[("wrapper", name, variant)] = (total - base) / calls
    return per_call, notes


def _table(title, per_call, group, names, variants, base):
    """One row per configuration: base, upstream, C; their overheads and
    ratio; and where measured (the C++ part loaded), the C core alone
    ("C core": the C++ routes switched off in the same process); where a
    row has a "graph" variant (its graph called alone: the eager backend's
    GraphModule, inductor's generated code),
    its count and C's share of upstream's overhead over it ("C/up>graph")."""
    def f(x, w=9, p=0):
        return "n/a".rjust(w) if x is None else f"{x:{w}.{p}f}"

    print(title)
    width = max([22] + [len(n) + 1 for n in names])
    core = any((group, n, "c_core") in per_call for n in names)
    graph = any((group, n, "graph") in per_call for n in names)
    cols = (
        f"{'configuration':<{width}}{base:>9}{'upstream':>10}{'C':>9}"
        f"{'ovh up':>9}{'ovh C':>9}{'ratio':>8}"
    )
    if core:
        cols += f"{'C core':>9}{'ovh core':>9}{'ratio':>8}"
    if graph:
        cols += f"{'graph':>9}{'C/up>graph':>11}"
    print(cols)
    print("-" * len(cols))
    for name in names:
        d, u, c = (per_call.get((group, name, v)) for v in variants[:3])
        ou = None if u is None or d is None else u - d
        oc = None if c is None or d is None else c - d
        ratio = None if oc is None or not ou else oc / ou
        line = f"{name:<{width}}{f(d)}{f(u, 10)}{f(c)}{f(ou)}{f(oc)}{f(ratio, 8, 3)}"
        if core:
            k = per_call.get((group, name, "c_core"))
            ok = None if k is None or d is None else k - d
            line += f"{f(k)}{f(ok)}{f(None if ok is None or not ou else ok / ou, 8, 3)}"
        if graph:
            gr = per_call.get((group, name, "graph"))
            share = None if gr is None or u is None or c is None or u == gr else (c - gr) / (u - gr)
            line += f"{f(gr)}{f(share, 11, 3)}"
        print(line)


def write_json(path: str, per_call: dict, calls: int) -> None:
    """The counts of this run, for benchmarks/chart.py: Ir per call by
    "group|row|variant", and the torch and CPython they were measured on."""
    from importlib.metadata import version

    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w") as f:
        json.dump({"torch": version("torch"), "python": "%d.%d.%d" % sys.version_info[:3],
                   "calls": calls,
                   "per_call": {"|".join(k): round(v, 1) for k, v in sorted(per_call.items())}},
                  f, indent=1)
        f.write("\n")


def report(cases=None, calls: int = 2000, e2e: bool = True, function: bool = True,
           keep: str | None = None, layers_only: bool = False) -> dict:
    from benchmarks import _cases

    case_names = list(cases or _cases.CONFIGS)
    if shutil.which("valgrind") is None:
        print("callgrind: valgrind not found")
        return {}
    with tempfile.TemporaryDirectory() as d:
        helper = build_helper(d)
        if helper is not None:
            method = "instrumentation on only around the calls (client requests)"
            per_call, notes = measure_toggle(helper, case_names, calls, e2e, function, keep,
                                             layers_only)
        else:
            method = "whole-process counts minus a 0-call run (runtime wrapper rows only)"
            per_call, notes = measure_whole(case_names, calls)
            e2e = function = False
    print("== instructions per call (callgrind Ir) ==")
    print(
        f"{calls} calls per variant, minus a 0-call dump; {method}; "
        "overhead = variant - baseline; ratio = C overhead / upstream overhead"
    )
    if not layers_only:
        _table("-- runtime wrapper alone --", per_call, "wrapper", case_names,
               _cases.VARIANTS, "direct")
    if function and not layers_only:
        from benchmarks import _function

        _table("-- CompiledFunction alone (fw: boxed apply; fw+bw: + torch.autograd.backward) --",
               per_call, "function", list(_function.ROWS), _function.VARIANTS, "direct")
    if function:
        from benchmarks import _layers

        _table("-- AOTAutograd's other per-call layers, called alone --",
               per_call, "layers", list(_layers.ROWS), _layers.VARIANTS, "direct")
    if e2e:
        from benchmarks import _e2e

        _table("-- end to end: torch.compile(backend=\"aot_eager\") of x.sin() and of an MLP's loss --",
               per_call, "e2e", list(_e2e.ROWS), _e2e.E2E_VARIANTS, "eager")
    by_text: dict[str, list[str]] = {}
    for name, text in notes.items():
        by_text.setdefault(text, []).append(name)
    for text, names in by_text.items():
        print(f"  note ({', '.join(names)}): {text}")
    return per_call


def main(argv=None):
    if ROOT not in sys.path:
        sys.path.insert(0, ROOT)
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--calls", type=int, default=2000)
    p.add_argument("--cases", nargs="*", default=None)
    p.add_argument("--no-e2e", action="store_true", help="skip the end-to-end rows")
    p.add_argument("--no-function", action="store_true",
                   help="skip the CompiledFunction rows")
    p.add_argument("--keep", metavar="DIR", help="keep the callgrind dumps in DIR")
    p.add_argument("--json", metavar="FILE",
                   help="also write the counts to FILE (for benchmarks/chart.py)")
    p.add_argument("--layers-only", action="store_true",
                   help="only the other per-call layers (no wrapper, CompiledFunction or "
                        "end-to-end rows)")
    p.add_argument("--inner-toggle", metavar="HELPER", help=argparse.SUPPRESS)
    p.add_argument("--e2e", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--function", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--inner-whole", nargs=3, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.inner_toggle:
        inner_toggle(args.inner_toggle, args.cases, args.calls, args.e2e, args.function,
                     args.layers_only)
    elif args.inner_whole:
        name, variant, calls = args.inner_whole
        inner_whole(name, variant, int(calls))
    else:
        per_call = report(args.cases, args.calls, e2e=not args.no_e2e and not args.layers_only,
                          function=not args.no_function or args.layers_only, keep=args.keep,
                          layers_only=args.layers_only)
        if args.json:
            write_json(args.json, per_call, args.calls)


if __name__ == "__main__":
    main()
