"""Loading the optional C++ part (``torch_aot_rt._torch_cpp_<version>``).

setup.py builds it against the torch installed at build time (loading this
file by path, so the two sides cannot drift: keep it stdlib-only) when that
torch's series is in :data:`CPP_SERIES`, and writes a record
(``_torch_cpp_<version>.<python cache tag>.json``, one per torch and
Python, as the modules are: whether it was built and, if not, why; torch
version, git version, C++11 ABI) next to where the module goes. The module
links that torch's libraries, so it is imported only after the record says it
was built and matches the running torch: a libtorch with another ABI is never
loaded, nor a module left over from an earlier build that the record does not
vouch for. Otherwise, or with ``TORCH_AOT_RT_CPP=0``, the C core runs alone
(its Python-callable route to torch) and ``stats()["cpp"]`` says why.
"""

from __future__ import annotations

import importlib
import json
import os
import re
import sys

CPP_ENV = "TORCH_AOT_RT_CPP"

# The torch series whose headers the C++ part (csrc/cpp/) compiles against.
# From 2.13 on, torch::autograd::Node is owned by c10::intrusive_ptr; before,
# by std::shared_ptr (2.10's function.h: `struct Node :
# std::enable_shared_from_this<Node>`). 2.12's are compiled against as well
# (csrc/cpp/node_ptr.h): there the node owns its grad_fn, which has
# THPFunction's ownership (csrc/cpp/compiled_node_face_owned.cpp), and calls
# the backward unboxed, as 2.12's PyNode; 2.11's headers, PyNode and
# BackwardCFunction are 2.12's, and so is the node there (tested since 2.11's
# CompiledFunction runs in C). 2.15's headers were checked to build.
# setup.py compiles the part only for these series.
CPP_SERIES = ((2, 11), (2, 12), (2, 13), (2, 14), (2, 15))

# Where the records and modules are; a name of its own so tests can point it
# at records of their own.
_DIR = os.path.dirname(os.path.abspath(__file__))


def _switched_off() -> bool:
    return os.environ.get(CPP_ENV, "").strip().lower() in ("0", "false", "off", "no")


def module_name(torch_version: str) -> str:
    return "_torch_cpp_" + re.sub(r"[^0-9A-Za-z]", "_", torch_version)


def torch_series(torch_version: str) -> tuple[int, int] | None:
    """``(major, minor)`` of a torch version string ("2.14.1+cu130" -> (2, 14))."""
    m = re.match(r"\s*(\d+)\.(\d+)", torch_version)
    return (int(m.group(1)), int(m.group(2))) if m else None


# Series whose headers the C++ part compiles against, and whose upstream node
# its autograd node reproduces as far as can be read, but where it is not
# tested, so not built (TORCH_AOT_RT_CPP_FORCE=1 builds it): a series whose
# CompiledFunction does not run through the C path yet (only that path makes
# the node). 2.11 was one until its CompiledFunction ran in C.
NODE_UNTESTED: tuple[tuple[int, int], ...] = ()


def headers_unsupported(series: tuple[int, int] | None) -> str | None:
    """Why setup.py does not compile the C++ part against a series' headers,
    or None when it does."""
    if series in CPP_SERIES:
        return None
    which = "torch %d.%d's headers are" % series if series else "a torch of unknown series is"
    supported = ", ".join("%d.%d" % s for s in CPP_SERIES)
    if series in NODE_UNTESTED:
        return (
            f"{which} not supported by the C++ part yet (it compiles against them, as "
            "against 2.12's, but its autograd node is untested there: no CompiledFunction "
            f"of that release runs in C yet; it builds against torch {supported})"
        )
    return (
        f"{which} not supported by the C++ part (it builds against torch {supported})"
    )


def torch_identity(torch) -> dict:
    """What a build record holds and a running torch must match (setup.py
    writes it, :func:`load` compares it)."""
    return {
        "torch_version": str(torch.__version__),
        "git_version": getattr(torch.version, "git_version", None),
        "cxx11_abi": bool(torch._C._GLIBCXX_USE_CXX11_ABI),
    }


def record_name(torch_version: str) -> str:
    """The build record's file name: the module's, for this Python (modules
    for several Pythons sit side by side in a checkout, each with its ABI
    tag; so do their records, each with the interpreter's cache tag)."""
    return f"{module_name(torch_version)}.{sys.implementation.cache_tag}.json"


def record_path(torch_version: str) -> str:
    return os.path.join(_DIR, record_name(torch_version))


def _verdict(torch) -> tuple[str | None, str]:
    """``(why the C++ part is absent or None, its module name)``, from the
    switch and the build record alone: nothing is imported."""
    version = str(torch.__version__)
    name = module_name(version)
    file = record_name(version)
    if _switched_off():
        return f"switched off ({CPP_ENV}=0)", name
    try:
        with open(record_path(version)) as f:
            record = json.load(f)
    except FileNotFoundError:
        return f"not built for torch {version} (no {file})", name
    except (OSError, ValueError) as e:
        return f"unreadable build record {file}: {e}", name
    if not isinstance(record, dict):
        return f"unreadable build record {file}: not a JSON object", name
    built = record.get("built")
    if built is False:
        return f"not built: {record.get('reason') or 'no reason recorded'}", name
    if built is not True:
        # setup.py before the field wrote the record ahead of the compile, so
        # such a record does not say the module in the tree came from it
        return (
            f"build record {file} does not say whether it was built "
            "(written by an older setup.py: rebuild)"
        ), name
    for key, value in torch_identity(torch).items():
        if record.get(key) != value:
            return (
                f"built against another torch ({key} {record.get(key)!r}, running {value!r})"
            ), name
    return None, name


def absence_reason(torch) -> str | None:
    """Why the C++ part is not there for this torch (the same reasons as
    :func:`load`), or None when its record says it is built for this torch and
    it is not switched off. Reads the record only: for ``stats()`` where the C
    path is off and the module is not loaded at all (e.g. an unverified torch)."""
    return _verdict(torch)[0]


def load(torch):
    """``(capsule, module name, None)`` or ``(None, None, reason)``."""
    reason, name = _verdict(torch)
    if reason is not None:
        return None, None, reason
    try:
        module = importlib.import_module(f"{__package__}.{name}")
    except ImportError as e:
        return None, None, f"{name} does not load: {e}"
    return module.api, name, None


def node_backward_boxed() -> bool | None:
    """How the loaded C++ part's autograd node calls CompiledFunction.backward:
    True for ``backward(ctx, grads_list)`` (2.13 on: apply_boxed), False for
    ``backward(ctx, *grads)`` (2.11/2.12: ctx.apply); None when the C path
    runs without it."""
    import sys

    from . import _state

    name = _state.cpp()[0]
    module = sys.modules.get(f"{__package__}.{name}") if name else None
    return None if module is None else bool(module.node_backward_boxed)
