"""Loading the optional C++ part (``torch_aot_rt._torch_cpp_<version>``).

setup.py builds it against the torch installed at build time (loading this
file by path for :func:`module_name` and :func:`torch_identity`, so the two
sides cannot drift) and writes a record (``_torch_cpp_<version>.json``: torch version, git version, C++11 ABI)
next to it. The module links that torch's libraries, so it is imported only
after the record matches the running torch: a libtorch with another ABI is
never loaded. Otherwise, or with ``TORCH_AOT_RT_CPP=0``, the C core runs alone
(its Python-callable route to torch) and ``stats()["cpp"]`` says why.
"""

from __future__ import annotations

import importlib
import json
import os
import re

CPP_ENV = "TORCH_AOT_RT_CPP"


def _switched_off() -> bool:
    return os.environ.get(CPP_ENV, "").strip().lower() in ("0", "false", "off", "no")


def module_name(torch_version: str) -> str:
    return "_torch_cpp_" + re.sub(r"[^0-9A-Za-z]", "_", torch_version)


def torch_identity(torch) -> dict:
    """What a build record holds and a running torch must match (setup.py
    writes it, :func:`load` compares it)."""
    return {
        "torch_version": str(torch.__version__),
        "git_version": getattr(torch.version, "git_version", None),
        "cxx11_abi": bool(torch._C._GLIBCXX_USE_CXX11_ABI),
    }


def load(torch):
    """``(capsule, module name, None)`` or ``(None, None, reason)``."""
    if _switched_off():
        return None, None, f"switched off ({CPP_ENV}=0)"
    version = str(torch.__version__)
    name = module_name(version)
    path = os.path.join(os.path.dirname(__file__), name + ".json")
    try:
        with open(path) as f:
            record = json.load(f)
    except FileNotFoundError:
        return None, None, f"not built for torch {version} (no {name}.json)"
    except (OSError, ValueError) as e:
        return None, None, f"unreadable build record {name}.json: {e}"
    for key, value in torch_identity(torch).items():
        if record.get(key) != value:
            return None, None, (
                f"built against another torch ({key} {record.get(key)!r}, running {value!r})"
            )
    try:
        module = importlib.import_module(f"{__package__}.{name}")
    except ImportError as e:
        return None, None, f"{name} does not load: {e}"
    return module.api, name, None
