#!/usr/bin/env python3
"""What changed, between two torch releases, in the upstream code we mirror.

The first step of adding a torch release: compare the newest verified one with
the new one, piece by piece over torch_aot_rt/_mirrored.py's MIRRORED list, and
read every change (then decide: a new field of the release entry, a C change,
or nothing). Each side is a torch: a wheel file (.whl), a virtual environment,
a python executable, or a torch package directory. Nothing is imported from
either torch.

  python scripts/release_diff.py .venv-2.14 .venv-2.15          # what changed, with diffs
  python scripts/release_diff.py --summary OLD NEW               # one line per piece
  python scripts/release_diff.py --update 2.15 .venv-2.15        # record 2.15's fingerprints

``--update SERIES TORCH`` writes TORCH's fingerprints as SERIES's entry in
torch_aot_rt/_fingerprints.py (the gate opens only on a torch that matches
them): do it once the release's differences are ported and tested.
Exit status: 0 when nothing differs, 1 when something does, 2 on bad input.
"""

from __future__ import annotations

import argparse
import difflib
import glob
import importlib.util
import os
import subprocess
import sys
import tempfile
import zipfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FINGERPRINTS = os.path.join(ROOT, "torch_aot_rt", "_fingerprints.py")


def _load(name: str):
    """A stdlib-only module of the package, by path (importing the package
    would install it into a torch)."""
    spec = importlib.util.spec_from_file_location(
        f"_release_diff_{name}", os.path.join(ROOT, "torch_aot_rt", f"{name}.py")
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


mirrored = _load("_mirrored")


def torch_dir(where: str, scratch: str) -> str:
    """The torch package directory that ``where`` names."""
    if where.endswith(".whl"):
        wanted = {f"torch/{path}" for path, _ in mirrored.MIRRORED}
        out = os.path.join(scratch, os.path.basename(where))
        with zipfile.ZipFile(where) as wheel:
            for member in wheel.namelist():
                if member in wanted:
                    wheel.extract(member, out)
        return os.path.join(out, "torch")
    if os.path.isfile(where) and os.access(where, os.X_OK):  # a python executable
        origin = subprocess.run(
            [where, "-c", "import importlib.util as u; print(u.find_spec('torch').origin)"],
            check=True, capture_output=True, text=True,
        ).stdout.strip()
        return os.path.dirname(origin)
    if os.path.isfile(os.path.join(where, "_functorch", "__init__.py")):
        return where
    found = glob.glob(os.path.join(where, "lib", "python*", "site-packages", "torch"))
    if len(found) == 1:
        return found[0]
    raise SystemExit(f"release_diff: no torch at {where!r} (a .whl, a venv, a python, or torch/)")


def torch_version(tdir: str) -> str:
    try:
        with open(os.path.join(tdir, "version.py")) as f:
            for line in f:
                if line.startswith("__version__"):
                    return line.split("=", 1)[1].strip().strip("'\"")
    except OSError:
        pass
    return "unknown"


def compare(old: dict, new: dict, *, summary: bool, out) -> int:
    changed = 0
    for key in mirrored.names():
        a, b = old[key], new[key]
        if a == b:
            state = "unchanged" if a is not None else "absent in both"
        elif a is None:
            state = "added"
        elif b is None:
            state = "removed"
        else:
            state = "changed"
        if state not in ("unchanged", "absent in both"):
            changed += 1
        if summary or state in ("unchanged", "absent in both"):
            print(f"{state:>14}  {key}", file=out)
            continue
        print(f"{state:>14}  {key}", file=out)
        diff = difflib.unified_diff(
            (a or "").splitlines(keepends=True), (b or "").splitlines(keepends=True),
            f"old/{key}", f"new/{key}",
        )
        out.writelines("    " + line if line.endswith("\n") else "    " + line + "\n"
                       for line in diff)
    print(f"{changed} of {len(mirrored.names())} mirrored pieces differ", file=out)
    return 1 if changed else 0


def update(series: str, tdir: str) -> None:
    table = dict(_load("_fingerprints").FINGERPRINTS) if os.path.exists(FINGERPRINTS) else {}
    table[series] = mirrored.fingerprints(tdir)
    table = dict(sorted(table.items(), key=lambda kv: tuple(int(x) for x in kv[0].split("."))))
    with open(FINGERPRINTS, "w") as f:
        f.write(
            '"""Fingerprints of the upstream code the C path mirrors, per verified release\n'
            "(torch_aot_rt/_mirrored.py says what and how). Written by\n"
            "`python scripts/release_diff.py --update SERIES TORCH`; do not edit by hand.\n"
            '"""\n\n'
            "FINGERPRINTS: dict[str, dict[str, str | None]] = "
        )
        f.write("{\n")
        for name, prints in table.items():
            f.write(f"    {name!r}: {{\n")
            for key, value in prints.items():
                f.write(f"        {key!r}: {value!r},\n")
            f.write("    },\n")
        f.write("}\n")
    print(f"release_diff: {series} <- torch {torch_version(tdir)} ({tdir}) in {FINGERPRINTS}")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--summary", action="store_true", help="one line per piece, no diffs")
    parser.add_argument("--update", metavar="SERIES", help="record TORCH's fingerprints as SERIES")
    parser.add_argument("torches", nargs="+", metavar="TORCH")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as scratch:
        dirs = [torch_dir(t, scratch) for t in args.torches]
        if args.update:
            if len(dirs) != 1:
                parser.error("--update takes one TORCH")
            update(args.update, dirs[0])
            return 0
        if len(dirs) != 2:
            parser.error("give two torches, OLD and NEW")
        old, new = (mirrored.sources(d) for d in dirs)
        print(f"old: torch {torch_version(dirs[0])} ({args.torches[0]})")
        print(f"new: torch {torch_version(dirs[1])} ({args.torches[1]})")
        return compare(old, new, summary=args.summary, out=sys.stdout)


if __name__ == "__main__":
    sys.exit(main())
