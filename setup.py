import contextlib
import importlib.util
import json
import os
import re
import shutil
import sys
import tempfile
from importlib.machinery import EXTENSION_SUFFIXES

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

# TORCH_AOT_RT_DEBUG=1: -O0 -g with asserts; TORCH_AOT_RT_SANITIZE=1: ASan/UBSan.
#
# The C++ part (csrc/cpp/) is optional: the C core needs no torch to build, and
# nothing about the C++ part ever fails an install. It is compiled against the
# torch importable now when that torch's series is one whose headers it supports
# (torch_aot_rt/_cpp.py: CPP_SERIES); a compile or link failure is printed as a
# warning and skipped. Either way a record, torch_aot_rt/_torch_cpp_<version>.<cache tag>.json
# next to the module, says whether it was built and why not; the loader trusts
# the record, never a module file left in the tree by an earlier build.
#   TORCH_AOT_RT_CPP=0: do not build the C++ part (recorded as such).
# For tests of this file:
#   TORCH_AOT_RT_CPP_FORCE=1: try the C++ part on a series it does not support.
#   TORCH_AOT_RT_CPP_BREAK=1: make its compile fail, on any torch
#     (-include of a header that does not exist).
#   TORCH_AOT_RT_CPP_SERIES_OVERRIDE=X.Y: decide as if the installed torch were
#     of series X.Y (the record's torch identity stays the real one).
debug = os.environ.get("TORCH_AOT_RT_DEBUG") == "1"
sanitize = os.environ.get("TORCH_AOT_RT_SANITIZE") == "1"
force_cpp = os.environ.get("TORCH_AOT_RT_CPP_FORCE") == "1"
break_cpp = os.environ.get("TORCH_AOT_RT_CPP_BREAK") == "1"
series_override = os.environ.get("TORCH_AOT_RT_CPP_SERIES_OVERRIDE", "").strip()
BREAK_HEADER = "/nonexistent/rt_break.h"

common = []
ldflags = []
if debug or sanitize:
    common += ["-O0", "-g", "-UNDEBUG"]
else:
    common += ["-O2"]
if sanitize:
    common += ["-fsanitize=address,undefined", "-fno-omit-frame-pointer"]
    ldflags += ["-fsanitize=address,undefined"]


def listdir(folder, suffix):
    return sorted(os.path.join(folder, f) for f in os.listdir(folder) if f.endswith(suffix))


# The C core's files: csrc/ (the module, the door to torch, what every layer
# shares) and one folder per layer of a compiled call it mirrors (AOTAutograd's
# with its CompiledFunction and its compiler wrappers as folders of their own);
# csrc/cpp/ is the C++ part's. Includes name files from csrc/ ("aot/epilogue.h").
C_CORE_FOLDERS = (
    "csrc",
    os.path.join("csrc", "util"),
    os.path.join("csrc", "config"),
    os.path.join("csrc", "dynamo"),
    os.path.join("csrc", "aot"),
    os.path.join("csrc", "aot", "autograd"),
    os.path.join("csrc", "aot", "wrappers"),
    os.path.join("csrc", "inductor"),
)


def c_core_files(suffix):
    return [f for folder in C_CORE_FOLDERS for f in listdir(folder, suffix)]


def _load_by_path(name):
    """torch_aot_rt/<name>.py, by path: importing the package would install it."""
    spec = importlib.util.spec_from_file_location(
        "_torch_aot_rt_" + name, os.path.join("torch_aot_rt", name + ".py")
    )
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


# The interpreter decides what is built (torch_aot_rt/_versions.py, the gate):
# nothing into a free-threaded (or other non-default) build, where the package
# never loads its extension (loading it would switch the GIL back on), so that
# the install succeeds and changes nothing there; on a CPython minor version
# no release is verified on, the C core is optional (a compile failure is a
# warning, and the gate stays closed), so that installing never fails.
_versions = _load_by_path("_versions")
BUILD_KIND = _versions.build_kind()
PYTHON_VERIFIED = any(sys.version_info[:2] in r.pythons for r in _versions.VERIFIED)

c_core = Extension(
    "torch_aot_rt._C",
    sources=c_core_files(".c"),
    depends=c_core_files(".h"),
    include_dirs=["csrc"],
    extra_compile_args=["-std=c11", "-Wall", "-Wextra"] + common,
    extra_link_args=ldflags,
    optional=not PYTHON_VERIFIED,
)


def _load_cpp_loader():
    return _load_by_path("_cpp")


class CppPlan:
    """What this build does about the C++ part: ``ext`` to compile, or
    ``reason`` why not; ``record`` is what the build record starts from."""

    def __init__(self, ident, record, ext=None, reason=None):
        self.ident = ident
        self.record = record
        self.record_file = _load_cpp_loader().record_name(record["torch_version"])
        self.ext = ext
        self.reason = reason


def cpp_part():
    """The plan for the C++ part with the torch importable now, or None
    without torch (nothing to build against, nothing to record).

    Its module name carries the torch version (torch_aot_rt._torch_cpp_2_14_1_cu130),
    so builds for several releases sit side by side in a checkout, and a JSON
    record next to it says whether it was built and for which torch: the shim
    reads the record and loads the module only into that torch
    (torch_aot_rt/_cpp.py).
    """
    try:
        import torch
    except ImportError:
        return None
    cpp_loader = _load_cpp_loader()
    version = str(torch.__version__)
    ident = cpp_loader.module_name(version)
    record = {"module": ident, **cpp_loader.torch_identity(torch)}
    if cpp_loader._switched_off():
        return CppPlan(ident, record, reason=f"{cpp_loader.CPP_ENV}=0 at build")
    series = cpp_loader.torch_series(version)
    if series_override:
        series = cpp_loader.torch_series(series_override)
    unsupported = cpp_loader.headers_unsupported(series)
    if series_override and unsupported:
        unsupported += f" [TORCH_AOT_RT_CPP_SERIES_OVERRIDE={series_override}]"
    if unsupported and not force_cpp:
        return CppPlan(ident, record, reason=unsupported)
    if unsupported:
        record["forced"] = True  # TORCH_AOT_RT_CPP_FORCE=1 on an unsupported series
    root = os.path.dirname(torch.__file__)
    lib = os.path.join(root, "lib")
    ext = Extension(
        "torch_aot_rt." + ident,
        # one translation unit (csrc/cpp/unity.cpp includes the others):
        # torch's headers parsed once, not once per file
        sources=[os.path.join("csrc", "cpp", "unity.cpp")],
        depends=[f for f in listdir(os.path.join("csrc", "cpp"), (".cpp", ".h"))
                 if not f.endswith("unity.cpp")] + ["csrc/torch_cpp_api.h"],
        language="c++",
        # torch's headers as system headers: -Wall -Wextra applies to ours only
        extra_compile_args=[
            "-std=c++20",  # torch 2.14's c10 headers use <=> (std::strong_ordering)
            "-Wall",
            "-Wextra",
            "-isystem",
            os.path.join(root, "include"),
            "-isystem",
            os.path.join(root, "include", "torch", "csrc", "api", "include"),
            "-D_GLIBCXX_USE_CXX11_ABI=%d" % int(record["cxx11_abi"]),
            '-DRT_CPP_MODULE_NAME="torch_aot_rt.%s"' % ident,
            "-DRT_CPP_MODULE_ID=%s" % ident,
            '-DRT_BUILT_TORCH_VERSION="%s"' % version,
        ]
        + (["-include", BREAK_HEADER] if break_cpp else [])
        + _no_speculative_devirtualization()
        + common,
        library_dirs=[lib],
        libraries=["c10", "torch_cpu", "torch_python"],
        runtime_library_dirs=[lib],
        extra_link_args=ldflags,
        # a failure is also caught in build_ext_cpp_optional.build_extension;
        # optional=True keeps setuptools from copying a module that is not there
        optional=True,
    )
    return CppPlan(ident, record, ext=ext)


def _no_speculative_devirtualization():
    """GCC guesses the dynamic type of a virtual call and compares the object's
    vtable with its guess's (speculative devirtualization): from a header's
    inline code (Node::metadata -> Engine::make_anomaly_metadata) that names
    a vtable torch's libraries do not export (PyAnomalyMetadata's, torch 2.11
    and 2.12), and the module does not load. Off for GCC; clang does not
    guess so."""
    import sysconfig

    cxx = (os.environ.get("CXX") or sysconfig.get_config_var("CXX") or "").split()
    name = os.path.basename(cxx[0]) if cxx else ""
    return [] if "clang" in name else ["-fno-devirtualize-speculatively"]


def module_load_failure(name, path, torch_dir):
    """Why the built C++ part at path does not load into this interpreter with
    its torch (a symbol torch's libraries lack, ...), or None: checked in a
    fresh interpreter, as the loader will import it."""
    import subprocess

    script = (
        "import importlib.util, sys, torch\n"
        "spec = importlib.util.spec_from_file_location(sys.argv[1], sys.argv[2])\n"
        "spec.loader.exec_module(importlib.util.module_from_spec(spec))\n"
    )
    r = subprocess.run([sys.executable, "-c", script, name, path], capture_output=True, text=True,
                       cwd=os.path.dirname(torch_dir))
    if r.returncode == 0:
        return None
    lines = [line for line in r.stderr.strip().splitlines() if line.strip()]
    return lines[-1][:500] if lines else f"exit status {r.returncode}"


def _first_error_line(output):
    """The compiler's or linker's first error ("x.cpp:1:2: error: ...",
    "<command-line>: fatal error: ...", "collect2: error: ..."), at most 500
    characters; else the last line of the output, or None."""
    lines = [line.strip() for line in output.splitlines() if line.strip()]
    errors = [line for line in lines if re.search(r"\berror:", line, re.IGNORECASE)]
    line = errors[0] if errors else (lines[-1] if lines else None)
    return line[:500] if line else None


@contextlib.contextmanager
def _captured_output():
    """What this process and its children (the compiler, the linker) write to
    stdout and stderr inside the block, in ``output[0]`` afterwards; it is
    written to stderr as well, so the build log keeps it."""
    output = [""]
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    saved = [os.dup(1), os.dup(2)]
    with tempfile.TemporaryFile(mode="w+b") as tmp:
        try:
            os.dup2(tmp.fileno(), 1)
            os.dup2(tmp.fileno(), 2)
            yield output
        finally:
            for stream in (sys.stdout, sys.stderr):
                stream.flush()
            os.dup2(saved[0], 1)
            os.dup2(saved[1], 2)
            for fd in saved:
                os.close(fd)
            tmp.seek(0)
            output[0] = tmp.read().decode(errors="replace")
            sys.stderr.write(output[0])
            sys.stderr.flush()


def checkout_commit():
    """{"commit": the checkout's commit, "modified": whether its tracked files
    differ from it}, or None outside a git checkout (an sdist) or where no git
    runs (an interpreter in a root of its own, without git: the build goes on)."""
    import subprocess

    def git(*args):
        try:
            r = subprocess.run(["git", *args], capture_output=True, text=True,
                               cwd=os.path.dirname(os.path.abspath(__file__)))
        except OSError:  # no git on this machine's PATH
            return None
        return r.stdout.strip() if r.returncode == 0 else None

    commit = git("rev-parse", "HEAD")
    if not commit:
        return None
    return {"commit": commit, "modified": bool(git("status", "--porcelain", "--untracked-files=no"))}


class build_ext_cpp_optional(build_ext):
    """build_ext whose C++ part never fails the build, and which writes the
    build record (built or not, and why) next to where the module goes, and
    the commit the build is of (torch_aot_rt/_build.json, where it is one)."""

    def run(self):
        self._cpp_failure = None
        super().run()  # builds into build_lib, then copies to the tree if in place
        build = checkout_commit()
        folders = [os.path.join(self.build_lib, "torch_aot_rt")]
        if self.inplace:
            folders.append("torch_aot_rt")
        for folder in folders:
            record = os.path.join(folder, "_build.json")
            if build is None:  # an earlier build's record would name another commit
                if os.path.exists(record):
                    os.remove(record)
                continue
            os.makedirs(folder, exist_ok=True)
            with open(record, "w") as f:
                json.dump(build, f)
                f.write("\n")
        plan = CPP
        # build_lib is what a wheel holds: only this build's C++ part, not
        # those an earlier build for another torch left there (the source
        # tree keeps them side by side, for in-place builds)
        package_build = os.path.join(self.build_lib, "torch_aot_rt")
        if os.path.isdir(package_build):
            for f in os.listdir(package_build):
                ours = plan is not None and f.split(".")[0] == plan.ident
                if f.startswith("_torch_cpp_") and not ours:
                    os.remove(os.path.join(package_build, f))
        if plan is None:
            return
        fullname = "torch_aot_rt." + plan.ident
        filename = self.get_ext_filename(fullname)
        built_here = os.path.join(self.build_lib, filename)
        reason = plan.reason or self._cpp_failure
        version = plan.record["torch_version"]
        if reason is None and not os.path.exists(built_here):
            reason = f"building the C++ part against torch {version} produced no module"
        if reason is None and not break_cpp:
            import torch

            failure = module_load_failure(fullname, os.path.abspath(built_here),
                                          os.path.dirname(torch.__file__))
            if failure is not None:
                reason = f"the C++ part built against torch {version} does not load: {failure}"
        targets = [os.path.dirname(built_here)]
        if self.inplace:  # in-place and editable builds: the tree is where it loads from
            targets.append(os.path.dirname(filename))
        if reason is not None:
            # no module of an earlier build may sit next to this build's record
            for folder in targets:
                stale = os.path.join(folder, os.path.basename(filename))
                if os.path.exists(stale):
                    os.remove(stale)
            sys.stderr.write(
                f"WARNING: torch_aot_rt: the optional C++ part ({fullname}) is not built: "
                f"{reason}; the C core is built and works without it\n"
            )
        record = {**plan.record, "built": reason is None, "reason": reason}
        for folder in targets:
            os.makedirs(folder, exist_ok=True)
            with open(os.path.join(folder, plan.record_file), "w") as f:
                json.dump(record, f, indent=1, sort_keys=True)
                f.write("\n")

    def copy_file(self, infile, outfile, *args, **kwargs):
        """copy_extensions_to_source's copy into the tree (in-place and
        editable builds), made atomic: distutils unlinks the module and then
        writes the new one, and a process importing it in between (another
        torch's tests, run beside this build by scripts/test.sh) finds no
        module. Written beside it and renamed over it, the module is always
        whole, the old one or the new one; processes that loaded the old one
        keep their mapping of it."""
        if os.path.isdir(outfile) or not outfile.endswith(tuple(EXTENSION_SUFFIXES)):
            return super().copy_file(infile, outfile, *args, **kwargs)
        if self.dry_run:
            return outfile, True
        tmp = f"{outfile}.{os.getpid()}.tmp"
        try:
            shutil.copyfile(infile, tmp)
            shutil.copymode(infile, tmp)
            os.replace(tmp, outfile)
        finally:
            if os.path.exists(tmp):
                os.remove(tmp)
        return outfile, True

    def build_extension(self, ext):
        plan = CPP
        if plan is None or ext is not plan.ext:
            return super().build_extension(ext)
        version = plan.record["torch_version"]
        if break_cpp:  # a module from an earlier build would count as up to date
            stale = self.get_ext_fullpath(ext.name)
            if os.path.exists(stale):
                os.remove(stale)
        with _captured_output() as output:
            try:
                super().build_extension(ext)
                failure = None
            except Exception as e:  # never an install failure
                failure = e
        if failure is not None:
            line = _first_error_line(output[0])
            self._cpp_failure = (
                f"compiling the C++ part against torch {version} failed: "
                + (line or f"{type(failure).__name__}: {failure}")
            )


if BUILD_KIND != _versions.VERIFIED_BUILD_KIND:
    sys.stderr.write(
        f"torch_aot_rt: a {BUILD_KIND} build of Python: no extension is built "
        "(the package is inactive there and changes nothing)\n"
    )
    CPP, EXTENSIONS = None, []
else:
    CPP = cpp_part()
    EXTENSIONS = [c_core] + ([CPP.ext] if CPP is not None and CPP.ext is not None else [])
setup(
    ext_modules=EXTENSIONS,
    # the build record is written by build_ext_cpp_optional next to the module
    # (in the build tree, and in the source tree for in-place/editable builds)
    cmdclass={"build_ext": build_ext_cpp_optional},
)
