"""Wall time per call of small real models compiled by inductor: eager,
upstream and torch_aot_rt, in one process (the real-model harness).

Three models small enough for a 2-core CPU, written here with torch.nn alone
(no model zoo to install): a transformer encoder (``nn.TransformerEncoder``, 2
layers of width 64), a GPT-style decoder (token embedding, 2 pre-norm blocks of
causal ``scaled_dot_product_attention`` and an MLP, a tied head), and a small
ResNet-style CNN (3x32x32 images, BatchNorm, two residual blocks). Each runs
as inference (``eval()``, ``torch.no_grad()``) and as a training step
(forward, ``sum().backward()``, grads set to None). Per model and mode, three
variants on the same input: eager; ``torch.compile(backend="inductor")`` with
torch_aot_rt's switch off at compile and call (upstream's Python throughout);
the same with it on. Each compiled variant gets a model of a class of its own
(Dynamo guards a module on its type: two variants of one class would share a
compiled entry), with the same weights.

Timing as benchmarks/report.py's (benchmarks/_timing.py): interleaved rounds,
each round times every variant once in a rotated order; the table gives the
median per call of each variant, C's time minus upstream's (the median of the
per-round differences, with their quartiles) and C's time over upstream's. On a
CPU, inductor's kernels for these models can cost more or less than eager's, so
the overhead over eager says little here; the difference C makes is C minus
upstream.

    .venv-2.13/bin/python benchmarks/models.py               # all, 15 rounds
    .venv-2.13/bin/python benchmarks/models.py --models cnn --modes inference
"""

from __future__ import annotations

import argparse
import copy
import os
import statistics
import sys

os.environ.setdefault("TORCH_AOT_RT", "0")  # installed below, switched per variant

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

import torch  # noqa: E402
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import torch_aot_rt  # noqa: E402
from benchmarks import _timing  # noqa: E402


class Encoder(nn.Module):
    def __init__(self):
        super().__init__()
        layer = nn.TransformerEncoderLayer(64, 4, 128, dropout=0.0, batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)

    def forward(self, x):
        return self.encoder(x)


class Block(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.fc1, self.fc2 = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(b, t, 3, 4, d // 4).unbind(2)
        a = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2),
                                           v.transpose(1, 2), is_causal=True)
        x = x + self.proj(a.transpose(1, 2).reshape(b, t, d))
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x))))


class GPT(nn.Module):
    def __init__(self, vocab=256, d=64):
        super().__init__()
        self.embed, self.pos = nn.Embedding(vocab, d), nn.Parameter(torch.zeros(32, d))
        self.blocks = nn.ModuleList([Block(d), Block(d)])
        self.ln = nn.LayerNorm(d)

    def forward(self, idx):
        x = self.embed(idx) + self.pos[: idx.shape[1]]
        for block in self.blocks:
            x = block(x)
        return self.ln(x) @ self.embed.weight.t()


class Residual(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.c1, self.b1 = nn.Conv2d(c, c, 3, padding=1, bias=False), nn.BatchNorm2d(c)
        self.c2, self.b2 = nn.Conv2d(c, c, 3, padding=1, bias=False), nn.BatchNorm2d(c)

    def forward(self, x):
        return F.relu(x + self.b2(self.c2(F.relu(self.b1(self.c1(x))))))


class CNN(nn.Module):
    def __init__(self):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1, bias=False),
                                  nn.BatchNorm2d(16), nn.ReLU())
        self.blocks = nn.Sequential(Residual(16), Residual(16))
        self.head = nn.Linear(16, 10)

    def forward(self, x):
        return self.head(self.blocks(self.stem(x)).mean((2, 3)))


# name: (model class, input maker)
MODELS = {
    "encoder": (Encoder, lambda: torch.randn(4, 16, 64)),
    "gpt": (GPT, lambda: torch.randint(0, 256, (4, 32))),
    "cnn": (CNN, lambda: torch.randn(8, 3, 32, 32)),
}
MODES = ("inference", "training")
VARIANTS = ("eager", "upstream", "c")


def _own_class(model: nn.Module, tag: str) -> nn.Module:
    """A copy of ``model`` whose class is a subclass of its own."""
    other = copy.deepcopy(model)
    other.__class__ = type(f"{type(model).__name__}_{tag}", (type(model),), {})
    return other


def _step(model, x, mode):
    if mode == "inference":
        def run():
            with torch.no_grad():
                return model(x)
        return run
    params = list(model.parameters())

    def run():
        for p in params:
            p.grad = None
        model(x).sum().backward()
    return run


def build(name: str, mode: str, warmup: int = 3) -> dict:
    """{variant: zero-argument call}; each compiled variant warmed up (compiled)."""
    cls, make_input = MODELS[name]
    torch.manual_seed(0)
    base = cls()
    base.train(mode == "training")
    x = make_input()
    runs = {"eager": _step(base, x, mode)}
    for variant in ("upstream", "c"):
        before = torch_aot_rt.stats()
        with torch_aot_rt.enabled(variant == "c"):
            model = torch.compile(_own_class(base, variant), backend="inductor")
            runs[variant] = _step(model, x, mode)
            for _ in range(warmup):
                runs[variant]()
        after = torch_aot_rt.stats()
        built = after["runtime_wrappers"] - before["runtime_wrappers"]
        # the C variant really runs the C runtime; upstream's builds none
        if (built > 0) != (variant == "c") or after["fallbacks"] != before["fallbacks"]:
            raise RuntimeError(f"{name} {mode} {variant}: {built} C runtime wrappers built, "
                               f"fallbacks {after['fallback_reasons']}")
    return runs


def measure(names, modes, rounds: int, target_s: float) -> list[tuple]:
    rows = []
    for name in names:
        for mode in modes:
            runs = build(name, mode)
            number = _timing.calibrate(runs, target_s)
            samples = _timing.interleaved(
                runs, rounds=rounds, number=number,
                switched=lambda v: torch_aot_rt.enabled(v == "c"),
            )
            s = _timing.summarize(samples, "eager")
            # what C saves per call: the median over rounds of C - upstream
            # (same round, same noise), and its quartiles
            diffs = sorted(c - u for c, u in zip(samples["c"], samples["upstream"]))
            q = statistics.quantiles(diffs, n=4, method="inclusive") if len(diffs) > 1 else None
            s["c_minus_upstream"] = (statistics.median(diffs), q)
            rows.append((name, mode, s))
            _print_row(name, mode, s)
    return rows


def _print_row(name, mode, s):
    med = s["median"]
    diff, q = s["c_minus_upstream"]
    spread = f"{q[0] / 1000:>8.1f} ..{q[2] / 1000:>6.1f}" if q else ""
    print(f"{name:<8}{mode:<10}{med['eager'] / 1000:>10.1f}{med['upstream'] / 1000:>10.1f}"
          f"{med['c'] / 1000:>10.1f}{diff / 1000:>10.1f}{med['c'] / med['upstream']:>8.3f}"
          f"  {spread}", flush=True)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--models", nargs="*", default=list(MODELS), choices=list(MODELS))
    p.add_argument("--modes", nargs="*", default=list(MODES), choices=list(MODES))
    p.add_argument("--rounds", type=int, default=15)
    p.add_argument("--target-ms", type=float, default=20.0,
                   help="one measurement of the slowest variant (ms)")
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    torch_aot_rt.enable()  # installed; each variant's switch decides
    print(f"torch {torch.__version__}, torch_aot_rt {torch_aot_rt.stats()['torch']['release']}, "
          f"1 thread, {args.rounds} rounds; us per call (median over rounds); C - up: "
          "the median of the per-round differences (what C saves is its negative)")
    print(f"{'model':<8}{'mode':<10}{'eager':>10}{'upstream':>10}{'C':>10}"
          f"{'C - up':>10}{'C/up':>8}  {'C - up, p25..p75':>16}")
    measure(args.models, args.modes, args.rounds, args.target_ms / 1000)
    return 0


if __name__ == "__main__":
    sys.exit(main())
