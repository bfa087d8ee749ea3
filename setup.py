import os

from setuptools import Extension, setup

# TORCH_AOT_RT_DEBUG=1: -O0 -g with asserts; TORCH_AOT_RT_SANITIZE=1: ASan/UBSan.
debug = os.environ.get("TORCH_AOT_RT_DEBUG") == "1"
sanitize = os.environ.get("TORCH_AOT_RT_SANITIZE") == "1"

cflags = ["-std=c11", "-Wall", "-Wextra"]
ldflags = []
if debug or sanitize:
    cflags += ["-O0", "-g", "-UNDEBUG"]
else:
    cflags += ["-O2"]
if sanitize:
    cflags += ["-fsanitize=address,undefined", "-fno-omit-frame-pointer"]
    ldflags += ["-fsanitize=address,undefined"]

sources = sorted(
    os.path.join("csrc", f) for f in os.listdir("csrc") if f.endswith(".c")
)

setup(
    ext_modules=[
        Extension(
            "torch_aot_rt._C",
            sources=sources,
            depends=[os.path.join("csrc", f) for f in os.listdir("csrc") if f.endswith(".h")],
            extra_compile_args=cflags,
            extra_link_args=ldflags,
        )
    ]
)
