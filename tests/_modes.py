"""Torch function and dispatch modes that record what they see: what the C path
calls through torch's Python layer must be what upstream calls."""

from __future__ import annotations

from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode


class RecordingFunctionMode(TorchFunctionMode):
    """Records the torch functions and methods it sees (the epilogue's
    included: copy_, as_strided_, size, detach, ...)."""

    def __init__(self, log):
        super().__init__()
        self.log = log

    def __torch_function__(self, func, types, args=(), kwargs=None):
        self.log.append(getattr(func, "__name__", str(func)))
        return func(*args, **(kwargs or {}))


class RecordingDispatchMode(TorchDispatchMode):
    """Records the aten ops it sees."""

    def __init__(self, log):
        super().__init__()
        self.log = log

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.log.append(str(func))
        return func(*args, **(kwargs or {}))
