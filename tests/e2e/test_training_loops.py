"""Training loops, C runtime off vs on: the same model (deep-copied from one
seeded original) trained for a few SGD steps through ``torch.compile``; the
parameters, buffers, losses, outputs and gradients must be identical after
every step (``torch.equal``: the same kernels run in both).

Each "on" run checks that C CompiledFunction classes were built (and used: the
class behind the model's output has the C forward/backward) and that nothing
fell back to upstream.
"""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import _training as T

# On a torch where the import is inactive these run too (upstream vs upstream
# with the package imported): the canary's end-to-end proof that nothing changes.
pytestmark = pytest.mark.canary

STEPS = 4


class MLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(6, 16)
        self.fc2 = nn.Linear(16, 16)
        self.fc3 = nn.Linear(16, 3)

    def forward(self, x):
        return self.fc3(F.gelu(self.fc2(torch.tanh(self.fc1(x)))))


class ConvBN(nn.Module):
    """BatchNorm in training mode: running_mean/var/num_batches_tracked are
    buffers the compiled graph mutates."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, padding=1)
        self.bn = nn.BatchNorm2d(4)
        self.conv2 = nn.Conv2d(4, 4, 3, stride=2)
        self.bn2 = nn.BatchNorm2d(4)
        self.fc = nn.Linear(4, 2)

    def forward(self, x):
        h = F.relu(self.bn(self.conv(x)))
        h = F.relu(self.bn2(self.conv2(h)))
        return self.fc(h.mean((2, 3)))


class Aliasing(nn.Module):
    """Outputs that alias an intermediate (``h.view(-1)``, ``h.t()``) and the
    input (``x[0]``, ``x``)."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(5, 5)

    def forward(self, x):
        h = torch.sigmoid(self.lin(x))
        return h.view(-1), x[0], h.t(), h, x


def aliasing_loss(outs):
    flat, row, ht, h, x = outs
    return flat.sum() + (row * 2).sum() + (ht * ht).sum() + h.mean() + x.sum()


class InPlace(nn.Module):
    """In-place on the (non-leaf) input and on a buffer."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)
        self.register_buffer("steps", torch.zeros(4))

    def forward(self, x):
        x.mul_(2)
        self.steps.add_(1)
        y = self.lin(x) * self.steps
        return y, x


def inplace_loss(outs):
    y, x = outs
    return y.pow(2).sum() + x.sum()


def plain_loss(out):
    return out.pow(2).mean()


def mlp_inputs(step):
    return (torch.randn(8, 6),)


def conv_inputs(step):
    return (torch.randn(4, 3, 8, 8),)


def alias_inputs(step):
    return (torch.randn(5, 5, requires_grad=True),)


def inplace_inputs(step):
    base = torch.randn(3, 4, requires_grad=True)
    return (base.clone(),)


MODELS = {
    "mlp": (MLP, mlp_inputs, plain_loss),
    "conv_batchnorm": (ConvBN, conv_inputs, plain_loss),
    "aliasing_outputs": (Aliasing, alias_inputs, aliasing_loss),
    "inplace_input_and_buffer": (InPlace, inplace_inputs, inplace_loss),
}


def snapshot(model, outs, loss, inputs) -> dict:
    flat = [o for o in T.D._flat_tensors(outs)]
    return {
        "params": {k: p.detach().clone() for k, p in model.named_parameters()},
        "grads": {
            k: (None if p.grad is None else p.grad.clone())
            for k, p in model.named_parameters()
        },
        "buffers": {k: b.clone() for k, b in model.named_buffers()},
        "loss": loss.detach().clone(),
        "outs": [o.detach().clone() for o in flat],
        "outs_meta": [
            (tuple(o.shape), o.stride(), o.requires_grad, type(o.grad_fn).__name__,
             o._is_view(), o._base is not None)
            for o in flat
        ],
        "input_grads": [
            None if getattr(a, "grad", None) is None else a.grad.clone()
            for a in inputs if isinstance(a, torch.Tensor) and a.is_leaf
        ],
        "inputs": [a.detach().clone() for a in inputs if isinstance(a, torch.Tensor)],
    }


def train(model0, make_inputs, loss_fn, *, use_c, backend, steps=STEPS, min_functions=1,
          train_mode=True):
    torch._dynamo.reset()
    model = copy.deepcopy(model0)
    model.train(train_mode)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    history = []
    with T.c_runtime(use_c, min_functions=min_functions):
        cmodel = torch.compile(model, backend=backend)
        for step in range(steps):
            torch.manual_seed(1000 + step)
            inputs = make_inputs(step)
            opt.zero_grad(set_to_none=True)
            outs = cmodel(*inputs)
            T.check_classes(outs, use_c)
            loss = loss_fn(outs)
            loss.backward()
            snap = snapshot(model, outs, loss, inputs)
            opt.step()
            history.append(snap)
    history.append({"final_params": {k: p.detach().clone() for k, p in model.named_parameters()},
                    "final_buffers": {k: b.clone() for k, b in model.named_buffers()}})
    return history


def assert_equal_history(off, on):
    assert len(off) == len(on)
    for step, (a, b) in enumerate(zip(off, on)):
        _equal(a, b, f"step[{step}]")


def _equal(a, b, path):
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor), path
        assert a.dtype == b.dtype and a.shape == b.shape, path
        assert torch.equal(a, b), f"{path}: values differ, max |diff| {(a - b).abs().max()}"
    elif isinstance(a, dict):
        assert a.keys() == b.keys(), path
        for k in a:
            _equal(a[k], b[k], f"{path}.{k}")
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), path
        for i, (x, y) in enumerate(zip(a, b)):
            _equal(x, y, f"{path}[{i}]")
    else:
        assert a == b, f"{path}: {a!r} != {b!r}"


@pytest.mark.parametrize("name", sorted(MODELS))
def test_training_loop_aot_eager(name):
    cls, make_inputs, loss_fn = MODELS[name]
    torch.manual_seed(0)
    model0 = cls()
    off = train(model0, make_inputs, loss_fn, use_c=False, backend="aot_eager")
    on = train(model0, make_inputs, loss_fn, use_c=True, backend="aot_eager")
    assert_equal_history(off, on)
    # the loop did train: parameters moved
    first = off[0]["params"]
    last = off[-1]["final_params"]
    assert any(not torch.equal(first[k], last[k]) for k in first)
    if name == "conv_batchnorm":
        assert off[-1]["final_buffers"]["bn.num_batches_tracked"].item() == STEPS
        assert not torch.equal(off[-1]["final_buffers"]["bn.running_mean"], torch.zeros(4))
    if name == "inplace_input_and_buffer":
        assert torch.equal(off[-1]["final_buffers"]["steps"], torch.full((4,), float(STEPS)))


def test_training_loop_eval_then_train():
    """The same module compiled in train mode, then eval (a second graph with
    no buffer mutation; inference without grad) and back."""
    torch.manual_seed(0)
    model0 = ConvBN()

    def run(use_c):
        torch._dynamo.reset()
        model = copy.deepcopy(model0)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        res = []
        with T.c_runtime(use_c):
            cm = torch.compile(model, backend="aot_eager")
            for step, mode in enumerate(["train", "eval", "train", "eval"]):
                torch.manual_seed(step)
                x = torch.randn(2, 3, 6, 6)
                model.train(mode == "train")
                if mode == "train":
                    opt.zero_grad()
                    loss = cm(x).sum()
                    loss.backward()
                    opt.step()
                    res.append((loss.detach(), [p.detach().clone() for p in model.parameters()]))
                else:
                    with torch.no_grad():
                        res.append((cm(x), [b.clone() for b in model.buffers()]))
        return res

    _equal(run(False), run(True), "eval_then_train")


def test_training_loop_dynamic_shapes():
    """Batch size changes every step (dynamic=True): saved symints, symint
    inputs."""
    torch.manual_seed(0)
    model0 = MLP()

    def make_inputs(step):
        return (torch.randn(3 + step, 6),)

    def run(use_c):
        torch._dynamo.reset()
        model = copy.deepcopy(model0)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        hist = []
        with T.c_runtime(use_c):
            cm = torch.compile(model, backend="aot_eager", dynamic=True)
            for step in range(STEPS):
                torch.manual_seed(step)
                (x,) = make_inputs(step)
                opt.zero_grad()
                out = cm(x)
                T.check_classes(out, use_c)
                loss = out.pow(2).sum() / x.shape[0]
                loss.backward()
                hist.append(snapshot(model, out, loss, (x,)))
                opt.step()
        return hist

    _equal(run(False), run(True), "dynamic")


@pytest.mark.inductor
def test_training_loop_inductor():
    torch.manual_seed(0)
    model0 = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
    off = train(model0, lambda s: (torch.randn(5, 4),), plain_loss, use_c=False,
                backend="inductor", steps=3)
    on = train(model0, lambda s: (torch.randn(5, 4),), plain_loss, use_c=True,
               backend="inductor", steps=3)
    assert_equal_history(off, on)
