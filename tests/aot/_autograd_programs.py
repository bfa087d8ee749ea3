"""The programs the CompiledFunction tests run: each reaches one part of
CompiledFunction.forward / backward (CASES: name -> (fn, make_inputs,
backward, check)), and what the tests read off the compiled metadata.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

import _differential as D
import _training as T
from _training import leaf, nonleaf


def meta_of(on) -> object:
    assert on.classes, "no CompiledFunction class seen"
    return on.classes[0].metadata


def randn_grads(outs):
    return [torch.randn_like(o) for o in outs]


# ---------------------------------------------------------------------------
# programs: each reaches one part of CompiledFunction.forward / backward


def f_plain(a, b):
    return a * b + 1, (a @ b.t()).sin()


def f_non_diff(a, b, c):
    # c does not require grad; outputs 1, 2, 3 do not require grad
    return a * 2, c * 3, a.detach() + 1, (a * b).argmax(), b * a


def f_alias_input(a):
    return a.view(-1), a * 2, a[0], a, a.t()


def f_alias_intermediate(a):
    y = a * 2
    return y.view(-1), y.t(), y


def f_intermediate_bases(a, b):
    y = a * 2
    z = b + 1
    return y[0], z.t(), y[1], z.view(-1)


def f_unsafe_view(a, b):
    return (a @ b).view(-1), (a * 2).split(2)


def f_metadata_mutation(a):
    a.t_()
    return a * 2


def f_metadata_mutation_alias(a):
    a.unsqueeze_(0)
    return a[0], a * 2


def f_metadata_mutation_return_input(a):
    a.unsqueeze_(0)
    return a, a * 2


def f_metadata_mutation_transpose_alias(a):
    # upstream's alias replay cannot regenerate a[0] here: an error
    a.transpose_(0, 1)
    return a[0], a * 2


def f_data_mutation(a):
    a.mul_(2)
    return a + 1


def f_buffer_mutation(w, b):
    b.add_(1)
    return w * b, (w * 2).sum()


def f_batch_norm(x, w, b, rm, rv):
    return F.batch_norm(x, rm, rv, w, b, training=True, momentum=0.1)


def f_conv(x, w):
    return F.conv2d(x, w, padding=1).relu()


def f_matmul(a, b):
    return a @ b


def f_two(a, b):
    return a * 2, b * 3


def f_one_of_two(a, b):
    return a.sin() * 2


def f_mutation_and_alias(a):
    a.mul_(2)
    return a.view(-1), a * 3


def f_many_saved(a, b):
    y = a.sin() * b.cos()
    z = (y @ b.t()).tanh()
    return z.exp(), y


def f_many_inputs(*args):
    # more arguments than FunctionApply keeps on its stack
    acc = args[0] * 1
    for i, a in enumerate(args[1:]):
        acc = acc + a * (i + 2) if i % 2 else acc * a.sigmoid()
    return acc, args[3].view(-1), args[5] * 0


CASES = {
    # name: (fn, inputs factory, backward, check on the metadata)
    "plain": (
        f_plain,
        lambda: (leaf(3, 4), leaf(3, 4)),
        T.backward_with(randn_grads),
        lambda m: output_types_are(m, ["non_alias", "non_alias"]),
    ),
    "non_differentiable_outputs": (
        f_non_diff,
        lambda: (leaf(3, 4), leaf(3, 4), leaf(3, 4, requires_grad=False)),
        T.backward_with(randn_grads, only=[0]),
        lambda m: [o.requires_grad for o in m.output_info] == [True, False, False, False, True],
    ),
    "non_differentiable_outputs_all_used": (
        f_non_diff,
        lambda: (leaf(3, 4), leaf(3, 4), leaf(3, 4, requires_grad=False)),
        T.default_backward,
        lambda m: [o.requires_grad for o in m.output_info] == [True, False, False, False, True],
    ),
    "alias_of_input": (
        f_alias_input,
        lambda: (leaf(3, 4),),
        T.default_backward,
        lambda m: {"alias_of_input", "is_input"} <= set(types(m)),
    ),
    "alias_of_intermediate": (
        f_alias_intermediate,
        lambda: (leaf(3, 4),),
        T.backward_with(randn_grads),
        lambda m: any(t.startswith("alias_of_intermediate") for t in types(m)),
    ),
    "intermediate_bases": (
        f_intermediate_bases,
        lambda: (leaf(3, 4), leaf(3, 4)),
        T.backward_with(randn_grads),
        lambda m: m.num_intermediate_bases > 0,
    ),
    "unsafe_view": (
        f_unsafe_view,
        lambda: (leaf(4, 4), leaf(4, 5)),
        T.backward_with(randn_grads),
        lambda m: types(m).count("unsafe_view_alias") == 3 and m.num_unsafe_view_outputs == 3,
    ),
    "metadata_mutation_requires_grad": (
        f_metadata_mutation,
        lambda: D.Inputs(*((lambda p: ((p[0],), (p[1],)))(nonleaf(3, 4)))),
        T.backward_with(randn_grads),
        lambda m: mutations(m) == [(False, True, True)],
    ),
    "metadata_mutation_then_alias": (
        f_metadata_mutation_alias,
        lambda: D.Inputs(*((lambda p: ((p[0],), (p[1],)))(nonleaf(3, 4)))),
        T.backward_with(randn_grads),
        lambda m: mutations(m) == [(False, True, True)],
    ),
    "metadata_mutation_return_input": (
        f_metadata_mutation_return_input,
        lambda: D.Inputs(*((lambda p: ((p[0],), (p[1],)))(nonleaf(3, 4)))),
        T.backward_with(randn_grads),
        lambda m: mutations(m) == [(False, True, True)] and "is_input" in types(m),
    ),
    "data_mutation_requires_grad": (
        f_data_mutation,
        lambda: D.Inputs(*((lambda p: ((p[0],), (p[1],)))(nonleaf(3, 4)))),
        T.backward_with(randn_grads),
        lambda m: mutations(m) == [(True, False, True)],
    ),
    "buffer_mutation_no_grad": (
        f_buffer_mutation,
        lambda: (leaf(3), torch.zeros(3)),
        T.default_backward,
        lambda m: mutations(m) == [(True, False, False)],
    ),
    "batch_norm_running_stats": (
        f_batch_norm,
        lambda: (leaf(4, 3, 2, 2), leaf(3), leaf(3), torch.zeros(3), torch.ones(3)),
        T.backward_with(randn_grads),
        lambda m: len(m.mutated_inp_runtime_indices) == 2,
    ),
    "duplicate_inputs": (
        f_plain,
        lambda: (lambda x: (x, x))(leaf(3, 4)),
        T.backward_with(randn_grads),
        # the same tensor twice (aot_function passes both through)
        lambda m: len(m.input_info) == 2,
    ),
    "data_mutation_and_alias": (
        f_mutation_and_alias,
        lambda: D.Inputs(*((lambda p: ((p[0],), (p[1],)))(nonleaf(3, 4)))),
        T.backward_with(randn_grads),
        lambda m: mutations(m) == [(True, False, True)] and "alias_of_input" in types(m),
    ),
    "unused_input_requires_grad": (
        f_one_of_two,
        lambda: (leaf(3, 4), leaf(3, 4)),
        T.backward_with(randn_grads),
        lambda m: len(m.input_info) == 2,
    ),
    "many_inputs": (
        f_many_inputs,
        lambda: tuple(leaf(2, 3, requires_grad=i % 3 != 1) for i in range(20)),
        T.backward_with(randn_grads),
        lambda m: len(m.input_info) == 20,
    ),
    "many_saved": (
        f_many_saved,
        lambda: (leaf(3, 4), leaf(3, 4)),
        T.backward_with(randn_grads),
        lambda m: m.num_outputs == 2,
    ),
}


def types(m):
    return [o.output_type.name for o in m.output_info]


def output_types_are(m, expected):
    return types(m) == expected



def mutations(m):
    return [
        (m.input_info[i].mutates_data, m.input_info[i].mutates_metadata,
         m.input_info[i].requires_grad)
        for i in m.mutated_inp_runtime_indices
    ]


def f_dynamic(x, w):
    n = x.shape[0]
    y = (x * w).sum(1) * n
    return y, n, x.view(n, -1)[:, :1] * 2
