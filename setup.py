import importlib.util
import json
import os

from setuptools import Extension, setup

# TORCH_AOT_RT_DEBUG=1: -O0 -g with asserts; TORCH_AOT_RT_SANITIZE=1: ASan/UBSan.
# TORCH_AOT_RT_CPP=0: do not build the C++ part (the C core needs no torch to build).
debug = os.environ.get("TORCH_AOT_RT_DEBUG") == "1"
sanitize = os.environ.get("TORCH_AOT_RT_SANITIZE") == "1"
build_cpp = os.environ.get("TORCH_AOT_RT_CPP", "1") != "0"

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


c_core = Extension(
    "torch_aot_rt._C",
    sources=listdir("csrc", ".c"),
    depends=listdir("csrc", ".h"),
    extra_compile_args=["-std=c11", "-Wall", "-Wextra"] + common,
    extra_link_args=ldflags,
)


def _load_cpp_loader():
    """torch_aot_rt/_cpp.py, by path: importing the package would install it."""
    spec = importlib.util.spec_from_file_location(
        "_torch_aot_rt_cpp_loader", os.path.join("torch_aot_rt", "_cpp.py")
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def cpp_part():
    """The C++ part, built against the torch importable now, or None.

    Its module name carries the torch version (torch_aot_rt._torch_cpp_2_14_1_cu130),
    so builds for several releases sit side by side in a checkout, and a JSON
    record next to it says which torch it was built against: the shim reads the
    record and loads the module only into that torch (torch_aot_rt/_cpp.py).
    """
    if not build_cpp:
        return None
    try:
        import torch
    except ImportError:
        return None
    cpp_loader = _load_cpp_loader()
    root = os.path.dirname(torch.__file__)
    version = str(torch.__version__)
    ident = cpp_loader.module_name(version)
    record = {"module": ident, **cpp_loader.torch_identity(torch)}
    with open(os.path.join("torch_aot_rt", ident + ".json"), "w") as f:
        json.dump(record, f, indent=1, sort_keys=True)
        f.write("\n")
    lib = os.path.join(root, "lib")
    return Extension(
        "torch_aot_rt." + ident,
        sources=listdir(os.path.join("csrc", "cpp"), ".cpp"),
        depends=listdir(os.path.join("csrc", "cpp"), ".h") + ["csrc/torch_cpp_api.h"],
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
        + common,
        library_dirs=[lib],
        libraries=["c10", "torch_cpu", "torch_python"],
        runtime_library_dirs=[lib],
        extra_link_args=ldflags,
    )


cpp = cpp_part()
setup(
    ext_modules=[c_core] + ([cpp] if cpp is not None else []),
    # the build record travels with the module into a wheel
    package_data={"torch_aot_rt": ["_torch_cpp_*.json"]},
)
