"""Functions and input factories shared by the differential tests.

Each ``f_*`` is a small program that reaches one behaviour of AOTAutograd's
runtime wrapper; the test modules say which.
"""

from __future__ import annotations

import math

import torch

import _differential as D

MODES = ["plain", "no_grad", "inference_mode", "train"]


def ctx_for(mode):
    return {
        "plain": None,
        "no_grad": torch.no_grad,
        "inference_mode": torch.inference_mode,
        "train": None,
    }[mode]


def inputs_for(shapes, mode, mutated=(), dtypes=None, nan=False):
    """A factory of fresh inputs. ``mode`` 'no_grad' and 'train' make inputs
    that require grad; in training, the inputs the function mutates in place
    are non-leaf clones of a leaf (whose grad is compared)."""

    def factory(device):
        args, leaves = [], []
        for i, shape in enumerate(shapes):
            dtype = (dtypes or {}).get(i, torch.float32)
            if dtype.is_floating_point:
                t = torch.randn(shape, device=device, dtype=dtype)
                if nan and i == 0:
                    t.view(-1)[0] = math.nan
            else:
                t = torch.randint(0, 10, shape, device=device, dtype=dtype)
            if mode in ("no_grad", "train") and dtype.is_floating_point:
                t.requires_grad_()
                if mode == "train" and i in mutated:
                    leaves.append(t)
                    t = t.clone()
            args.append(t)
        return D.Inputs(tuple(args), tuple(leaves))

    return factory


def f_plain(a, b):
    return a * b + 1


def f_data(a):
    a.add_(1)
    return a * 2


def f_data_returned(a):
    return a.mul_(2)


def f_meta_t(a):
    a.t_()
    return a * 2


def f_meta_unsqueeze(a):
    a.unsqueeze_(0)
    return a + 1


def f_meta_transpose(a):
    a.transpose_(0, 1)
    return a * 2


def f_meta_then_alias(a):
    a.transpose_(0, 1)
    return a[0], a * 2


def f_data_and_meta(a):
    a.unsqueeze_(0)
    a.mul_(2)
    return a + 1


def f_two_mutations(a, b):
    a.add_(b)
    b.t_()
    return a - 1, b.sum()


def f_leaf_detach_mut(a):
    a.detach().mul_(2)
    return a + 1


def f_leaf_no_grad_mut(a):
    with torch.no_grad():
        a.mul_(2)
    return a * a


def f_view(a):
    return a.view(-1)


def f_select(a):
    return a[0]


def f_t(a):
    return a.t()


def f_identity(a):
    return a


def f_unsqueeze(a):
    return a.unsqueeze(0)


def f_identity_and_compute(a):
    return a, a * 2


def f_many_views(a, b):
    return a * b, b[0], b.t(), b.unsqueeze(0), b, a.view(2, 6), a.view(-1)[1:5]


def f_detached_view_of_input(a, b):
    return a * 2, b.detach().view(-1)


def f_interm_view(a):
    y = a * 2
    return y.view(-1)


def f_interm_base_is_output(a):
    y = a * 2
    return y, y.view(-1)


def f_interm_many(a):
    y = a * 2
    return y.view(-1), y.t(), y[0]


def f_interm_chain(a):
    y = a * 2
    z = y.view(-1)
    return z, z.view(3, 4)


def f_interm_detached(a):
    y = a * 2
    return y, y.detach()


def f_interm_two_bases(a, b):
    y = a * 2
    z = b + 1
    return y[0], z.t(), y[1], z


def f_nontensor(a, b):
    return a * b, 3, None, a.sum()


def f_everything(a, b, c, n):
    a.add_(1)  # data mutation
    b.t_()  # metadata mutation
    n.add_(1)  # integer tensor, data mutation
    y = c * 2
    return a.view(-1), y, y[0], c, 5, None, c.unsqueeze(0), b * 1, n


def f_detach_input(a, b):
    return a * 2 + b.detach()


def f_sets_grad_off(a):
    torch._C._set_grad_enabled(False)
    return a * 2


def f_no_grad_view(a, b):
    with torch.no_grad():
        v = a.view(-1)
    return a * b, v
