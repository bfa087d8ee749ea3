"""A config setting read per call in C (csrc/config_read.c), against Python's
attribute read (``ConfigModule.__getattr__``): every setting of Dynamo's,
functorch's and inductor's config, and a config module of our own with each
kind of setting (plain, a user override, a mutable default, deprecated,
aliased, hidden, forced and defaulted by the environment, a justknob, a
missing name), one shadowed in the module's ``__dict__``, a subclass with
its own ``__getattr__`` and a patched ``ConfigModule``: the same value (the
same object where Python returns a stored one), the same warnings, the same
exception; and which reads C took (stats()["config_reads"]).
"""

from __future__ import annotations

import copy
import importlib
import inspect
import sys
from contextvars import ContextVar
import warnings

import pytest
import torch
import torch._dynamo.config
import torch._functorch.config
import torch._inductor.config
import torch.utils._config_module as config_module

import _differential as D
import torch_aot_rt
from torch_aot_rt import _C

pytestmark = pytest.mark.needs_c

# the C read is bound where the C path runs (every verified release)
BOUND = D.RELEASE is not None


def _counts():
    return torch_aot_rt.stats()["config_reads"]


CONFIGS = (torch._dynamo.config, torch._functorch.config, torch._inductor.config)


def _snapshot(config):
    """Every entry's fields and user override (a ContextVar, 2.12 on; 2.11's
    is among its fields): a read of an aliased or deprecated setting changes
    another entry's state."""
    return [(entry, dict(vars(entry)),
             entry.user_override.get() if isinstance(entry.user_override, ContextVar) else None)
            for c in {*CONFIGS, config} for entry in c._config.values()]


def _restore(snap):
    for entry, attrs, override in snap:
        vars(entry).clear()
        vars(entry).update(attrs)
        if isinstance(entry.user_override, ContextVar):
            entry.user_override.set(override)


def _read(how, config, name):
    """(value or exception, warnings) of one read."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            value = _C._config_read(config, name) if how == "c" else getattr(config, name)
        except Exception as e:  # compared as type and message
            value = (type(e), str(e))
    return value, [(w.category, str(w.message)) for w in caught]


def _same_read(config, name):
    """The C read and Python's, each from the same entry state; which path
    the C read took."""
    snap = _snapshot(config)
    before = _counts()
    got = _read("c", config, name)
    after = _counts()
    _restore(snap)
    want = _read("python", config, name)
    _restore(snap)
    assert type(got[0]) is type(want[0]) and got[0] == want[0], (name, got, want)
    assert got[1] == want[1], (name, got, want)
    in_c = after["in C"] - before["in C"]
    upstream = after["upstream's"] - before["upstream's"]
    assert in_c + upstream == (1 if BOUND else 0), (name, before, after)
    return got[0], want[0], bool(in_c)


@pytest.mark.parametrize("config", CONFIGS, ids=["dynamo", "functorch", "inductor"])
def test_every_setting_as_python_reads_it(config):
    took_c = 0
    for name in sorted(config._config):
        got, want, in_c = _same_read(config, name)
        if isinstance(want, (int, float, bool, type(None), str, tuple)):
            # a stored value: the same object
            assert got is want, name
        took_c += in_c
    # most settings are plain: read in C where it is bound and Python's lookup
    # reaches ConfigModule.__getattr__ (2.15's inductor config has a class
    # with its own, for the settings other settings imply: Python's read)
    direct = type(config).__getattr__ is config_module.ConfigModule.__getattr__
    assert (took_c > len(config._config) // 2) if BOUND and direct else took_c == 0, took_c


# 2.12 on: a setting can be deprecated (warned on its first read)
DEPRECATION = "deprecated" in inspect.signature(config_module.Config).parameters
OWN_CONFIG = """
import sys
from torch.utils._config_module import Config, install_config_module

flag = True
number = 3
text = "a"
pair = (1, 2)
items = [1, 2]
mapping = {"a": 1}
old = Config(default=1, **({"deprecated": True, "deprecation_message": "use number"}
                           if DEPRECATION_FLAG else {}))
aliased = Config(alias=__name__ + ".alias_target")
alias_target = 7
forced = Config(default=False, env_name_force="TORCH_AOT_RT_TEST_FORCED")
env_default = Config(default=True, env_name_default="TORCH_AOT_RT_TEST_ENV_DEFAULT")
knob = Config(default=True, justknob="torch_aot_rt_test_knob")
hidden = False

install_config_module(sys.modules[__name__])
"""


@pytest.fixture
def own_config(monkeypatch, tmp_path):
    """A config module with each kind of setting, installed as torch's are
    (from a file: the installer reads its source)."""
    monkeypatch.setenv("TORCH_AOT_RT_TEST_FORCED", "1")
    monkeypatch.setenv("TORCH_AOT_RT_TEST_ENV_DEFAULT", "0")
    name = "torch_aot_rt_test_config"
    (tmp_path / f"{name}.py").write_text(OWN_CONFIG.replace("DEPRECATION_FLAG", str(DEPRECATION)))
    monkeypatch.syspath_prepend(str(tmp_path))
    sys.modules.pop(name, None)
    mod = importlib.import_module(name)
    yield mod
    sys.modules.pop(name, None)


# "old" is deprecated where a setting can be (2.12 on): Python warns on its
# first read; on 2.11 it is a plain setting
PLAIN = ["flag", "number", "text", "pair", "forced", "env_default"] + (
    [] if DEPRECATION else ["old"])
UPSTREAMS = ["items", "mapping", "aliased", "knob"] + (["old"] if DEPRECATION else [])


def test_each_kind_of_setting(own_config):
    for name in PLAIN:
        got, want, in_c = _same_read(own_config, name)
        assert got is want and in_c == BOUND, name
    assert own_config.forced is True and own_config.env_default is False
    for name in UPSTREAMS:
        got, want, in_c = _same_read(own_config, name)
        assert not in_c, name
    # a missing name and a hidden setting: the same AttributeError
    for name in ("missing", "hidden"):
        if name == "hidden":
            delattr(own_config, "hidden")
        got, want, in_c = _same_read(own_config, name)
        assert got[0] is AttributeError and not in_c, got
    # deprecated (2.12 on): warned on the first read only; then a plain read
    if DEPRECATION:
        first = _read("c", own_config, "old")
        assert [c for c, _ in first[1]] == [FutureWarning], first
        assert _read("c", own_config, "old") == (1, [])
        got, want, in_c = _same_read(own_config, "old")
        assert in_c == BOUND


def test_user_overrides(own_config):
    mutable = ["x"]
    with config_module.ConfigModule.patch(own_config, flag=False, items=mutable):
        for name in ("flag", "items"):
            got, want, in_c = _same_read(own_config, name)
            assert got is want and in_c == BOUND, name
        assert _C._config_read(own_config, "items") is mutable
    # restored: the default again
    assert _C._config_read(own_config, "flag") is True
    with torch._dynamo.config.patch(verbose=True):
        assert _C._config_read(torch._dynamo.config, "verbose") is True
    assert _C._config_read(torch._dynamo.config, "verbose") is torch._dynamo.config.verbose


def test_what_python_finds_first(own_config, monkeypatch):
    # the module's own __dict__ (written past __setattr__)
    own_config.__dict__["number"] = 11
    got, want, in_c = _same_read(own_config, "number")
    assert got == want == 11 and not in_c
    del own_config.__dict__["number"]
    # a class of its own with its own __getattr__
    base = type(own_config)

    class Own(base):
        def __getattr__(self, name):
            return ("own", name)

    object.__setattr__(own_config, "__class__", Own)  # past ConfigModule.__setattr__
    got, want, in_c = _same_read(own_config, "number")
    assert got == want == ("own", "number") and not in_c
    object.__setattr__(own_config, "__class__", base)
    assert _same_read(own_config, "number")[2] == BOUND
    # ConfigModule's __getattr__ patched (a mock.patch of it, a profiler)
    seen = []
    upstream = config_module.ConfigModule.__getattr__

    def spy(self, name):
        seen.append(name)
        return upstream(self, name)

    monkeypatch.setattr(config_module.ConfigModule, "__getattr__", spy)
    got, want, in_c = _same_read(own_config, "number")
    assert got == want == 3 and not in_c and seen == ["number", "number"]
    monkeypatch.undo()
    assert _same_read(own_config, "number")[2] == BOUND


def test_changes_after_a_read_in_c(own_config):
    """A read resolved in C and remembered, then what Python's lookup finds
    changes: a shadow in the module's __dict__, the setting's entry replaced
    in _config, an attribute of that name on the module's class. Each next
    read is Python's where Python's lookup would not reach the entry read
    before, the same value either way."""

    def settle():
        # twice: Python's own look-ups give the class its type version, so
        # the second C read is the one remembered
        for _ in range(2):
            got, want, in_c = _same_read(own_config, "number")
            assert got == want == 3 and in_c == BOUND

    settle()
    own_config.__dict__["number"] = 11
    got, want, in_c = _same_read(own_config, "number")
    assert got == want == 11 and not in_c
    del own_config.__dict__["number"]
    settle()
    old = own_config._config["number"]
    replaced = copy.copy(old)
    replaced.default = 5
    own_config._config["number"] = replaced
    got, want, in_c = _same_read(own_config, "number")
    assert got == want == 5 and in_c == BOUND
    own_config._config["number"] = old
    settle()
    cls = type(own_config)
    setattr(cls, "number", "on the class")
    try:
        got, want, in_c = _same_read(own_config, "number")
        assert got == want == "on the class" and not in_c
    finally:
        delattr(cls, "number")
    settle()


def test_errors_reading_a_field(own_config):
    # a field whose truth raises: the same error from C as from Python
    entry = own_config._config["flag"]

    class Bad:
        def __bool__(self):
            raise RuntimeError("no truth")

    snap = _snapshot(own_config)
    entry.hide = Bad()
    got = _read("c", own_config, "flag")
    want = _read("python", own_config, "flag")
    _restore(snap)
    assert got == want == ((RuntimeError, "no truth"), []), (got, want)
    with pytest.raises(TypeError):
        _C._config_read(own_config, 1)


def test_fullgraph_call_reads_in_c():
    """compile_wrapper's per-call read under fullgraph (the nested-compile
    error setting) is a C read, and follows a patch of it."""
    f = torch.compile(lambda a: a + 1, backend="eager", fullgraph=True)
    x = torch.ones(2)
    f(x)
    before = _counts()
    for _ in range(3):
        f(x)
    after = _counts()
    assert after["in C"] - before["in C"] == (3 if BOUND else 0), (before, after)
    assert after["upstream's"] == before["upstream's"]
    with torch._dynamo.config.patch(error_on_dynamo_callback_in_fullgraph_compiled_code=False):
        assert torch.equal(f(x), x + 1)


def test_release_field_pins_upstream():
    """config_read says how the release's entries keep the user override:
    a ContextVar ("var", 2.12 on) or a plain attribute ("attribute", 2.11);
    the reads are C on both."""
    import contextvars

    entry = torch._dynamo.config._config["verbose"]
    assert isinstance(entry.user_override, contextvars.ContextVar) == \
        (D.RELEASE.config_read == "var")
    before = _counts()
    _C._config_read(torch._dynamo.config, "verbose")
    after = _counts()
    assert after["in C"] - before["in C"] == (1 if BOUND else 0)


def test_reference_counts_flat_over_many_reads(own_config):
    """Neither path keeps or drops a reference per read: the stored values'
    counts are the same after many reads as after the first of each (a read
    resolved in C remembers its entry: one reference, taken once)."""
    marker = object()
    names = ("flag", "items", "old", "missing", "aliased")

    def read_all():
        for name in names:
            try:
                _C._config_read(own_config, name)
            except AttributeError:
                pass

    with config_module.ConfigModule.patch(own_config, items=[marker]):
        stored = _C._config_read(own_config, "items")
        objects = [stored, own_config._config["flag"], own_config._config["items"],
                   own_config._config["old"]]
        read_all()
        before = [sys.getrefcount(o) for o in objects]
        for _ in range(1000):
            read_all()
        after = [sys.getrefcount(o) for o in objects]
    assert after == before, (before, after)
