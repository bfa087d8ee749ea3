"""The C compile_wrapper against upstream's with the config patchers and
hooks Dynamo calls around a compiled frame: how each is installed, replaced
methods, attributes from __getattr__, hooks changed by an enter, C runtime
off vs on (see test_compile_wrapper.py for what is compared).
"""

from __future__ import annotations

import inspect

import pytest
import torch
from torch._dynamo.utils import counters

from _compile_wrapper_runs import _attempt, _v, differential, f

pytestmark = pytest.mark.needs_c


@pytest.mark.parametrize("how", ["dynamic=True", "dynamic=False", "dynamic_shapes"])
def test_config_patcher_hooks(how):
    """dynamic= (and dynamic_shapes=) add a config patcher to the context's
    enter hooks, entered before the call and reverted after it, also when the
    call raises: calls in C call it as upstream does, and the settings it
    patches read the same inside the compiled function (a graph break) and
    after the call."""
    cfg = torch._dynamo.config
    watched = ("assume_static_by_default", "automatic_dynamic_shapes")
    seen = []

    @torch.compiler.disable
    def peek(x):
        seen.append(tuple(getattr(cfg, k) for k in watched))
        return x

    def h(x, fail):
        y = peek(x.sin())
        if fail:
            raise ValueError("inside")
        return y * 2

    if how == "dynamic_shapes":
        if "dynamic_shapes" not in inspect.signature(torch.compile).parameters:
            pytest.skip("no dynamic_shapes= on this release")
        kwargs = {"dynamic_shapes": {}}
    else:
        kwargs = {"dynamic": how == "dynamic=True"}

    def dirty_state():
        # what the patcher's change/revert mark (2.13 on): the hash and
        # get-dict dirty flags
        hash_var = getattr(cfg, "_hash_dirty_var", None)
        keys_var = getattr(cfg, "_get_dict_dirty_keys_var", None)
        keys = keys_var.get() if keys_var is not None else None
        return (hash_var.get() if hash_var is not None else None,
                sorted(keys) if keys is not None else None)

    def program():
        seen.clear()
        g = torch.compile(h, backend="aot_eager", **kwargs)
        rows = []
        for n, fail in ((3, False), (4, False), (5, True), (6, False)):
            if hasattr(cfg, "_get_dict_dirty_keys_var"):
                # tracking, as after a get_config_copy; the last call starts
                # at the cap, so the patcher's key overflows it
                full = n == 6
                cfg._get_dict_dirty_keys_var.set({f"k{i}" for i in range(16)} if full else set())
                cfg._hash_dirty_var.set(False)
            rows.append(_attempt(lambda: _v(g(torch.randn(n), fail))))
            rows.append((tuple(getattr(cfg, k) for k in watched), dirty_state()))
        return rows, list(seen), dict(counters["stats"])

    (rows, seen_off, _), counts = differential(program, min_c=2)
    assert [r[0] for r in rows[1::2]] == [tuple(getattr(cfg, k) for k in watched)] * 4, rows


def test_config_patcher_with_a_replaced_method(monkeypatch):
    """The config module's own _mark_get_dict_dirty shadowed in its
    __dict__: the patcher's change and revert call that one, C or not."""
    cfg = torch._dynamo.config
    if not hasattr(type(cfg), "_mark_get_dict_dirty"):
        pytest.skip("no _mark_get_dict_dirty on this release")
    calls = []
    original = cfg._mark_get_dict_dirty

    def spy(name):
        calls.append(name)
        return original(name)

    monkeypatch.setitem(cfg.__dict__, "_mark_get_dict_dirty", spy)

    def program():
        calls.clear()
        g = torch.compile(f, backend="aot_eager", dynamic=False)
        x, w = torch.randn(3, 4), torch.randn(3, 4)
        outs = [_v(g(x, w)) for _ in range(3)]
        return outs, list(calls)

    (outs, seen), _ = differential(program, min_c=2)
    assert len(seen) >= 8, seen  # two keys, entered and reverted, per call


def test_config_patcher_attribute_from_getattr(monkeypatch):
    """An attribute the patcher reads missing from the config module's
    __dict__ (its hash-dirty variable, 2.13 on): the module's look-up fails
    and the class's __getattr__ runs (it raises, naming the setting), in C
    as in Python; the call raises the same error, and put back, calls work."""
    cfg = torch._dynamo.config
    if "_hash_dirty_var" not in cfg.__dict__:
        pytest.skip("no _hash_dirty_var on this release")

    def program():
        g = torch.compile(f, backend="aot_eager", dynamic=False)
        x, w = torch.randn(3, 4), torch.randn(3, 4)
        rows = [_attempt(lambda: _v(g(x, w)))]
        var = cfg.__dict__.pop("_hash_dirty_var")
        try:
            rows.append(_attempt(lambda: _v(g(x, w))))
        finally:
            cfg.__dict__["_hash_dirty_var"] = var
        rows.append(_attempt(lambda: _v(g(x, w))))
        return rows

    r, _ = differential(program, min_c=2)
    assert "value" not in r[1] and "value" in r[2], r


def test_hooks_changed_by_an_enter(monkeypatch):
    """An enter hook's Python (here the user override of a setting the
    dynamic=False patcher sets, a spy: its variable, or on 2.11 its entry's
    attribute assignment) replaces torch.compile's own hook
    and grows the list past what C keeps: the rest of the list is entered as
    upstream's comprehension iterates it, each hook as it is then, and each
    cleanup run in order after the call."""
    cfg = torch._dynamo.config
    from torch._dynamo import eval_frame
    from torch._dynamo.mutation_guard import GenerationTracker

    events, ctxs, armed = [], [], []
    make = eval_frame.make_set_enable_dynamic

    def capture(dynamic):
        ctxs.append(inspect.currentframe().f_back.f_locals["self"])
        return make(dynamic)

    class Hook:  # a callable that is not a function
        def __init__(self, i):
            self.i = i

        def __call__(self):
            events.append(f"enter {self.i}")
            return lambda: events.append(f"exit {self.i}")

    def fire():
        if armed:
            hooks = ctxs[-1].enter_exit_hooks
            armed.clear()
            hooks[1:] = [Hook(i) for i in range(5)]

    class SpyVar:  # the patcher's change calls its set (2.12 on)
        def __init__(self, var):
            self.var = var

        def get(self):
            return self.var.get()

        def set(self, value):
            fire()
            return self.var.set(value)

    entry = cfg._config["assume_static_by_default"]
    monkeypatch.setattr(eval_frame, "make_set_enable_dynamic", capture)
    if hasattr(entry.user_override, "set"):
        monkeypatch.setattr(entry, "user_override", SpyVar(entry.user_override))
    else:
        class SpyEntry(type(entry)):  # 2.11: the change assigns the attribute
            def __setattr__(self, name, value):
                if name == "user_override":
                    fire()
                object.__setattr__(self, name, value)

        monkeypatch.setattr(entry, "__class__", SpyEntry)

    def program():
        ctxs.clear()
        g = torch.compile(f, backend="aot_eager", dynamic=False)
        x, w = torch.randn(3, 4), torch.randn(3, 4)
        rows = [_v(g(x, w)), _v(g(x, w))]
        hooks = list(ctxs[-1].enter_exit_hooks)
        events.clear()
        generation = GenerationTracker.generation
        armed.append(True)
        rows.append(_attempt(lambda: _v(g(x, w))))
        rows.append((list(events), GenerationTracker.generation - generation))
        ctxs[-1].enter_exit_hooks[:] = hooks
        rows.append(_v(g(x, w)))
        return rows

    rows, _ = differential(program, min_c=2)
    assert rows[3][0] == [f"enter {i}" for i in range(5)] + [f"exit {i}" for i in range(5)], rows
