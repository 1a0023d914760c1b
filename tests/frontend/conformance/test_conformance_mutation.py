"""Conformance: in-place mutation of inputs and autograd through the compiled output."""
import pytest
import torch
import torch.nn.functional as F

from conformance_util import _seed_rng, check  # noqa: F401  (autouse fixture)


def mu_add_(x):
    x.add_(1)
    return x * 2


def mu_setitem(x):
    x[0] = 5
    x[:, -1] = x[:, 0]
    return x.sum()


def mu_copy_(x, y):
    x.copy_(y * 2)
    return x + y


def mu_inplace_methods(x, y):
    x.mul_(2).sub_(y)
    y.clamp_(min=0)
    x.relu_()
    return x + y


def mu_returns_mutated_input_itself(x):
    x.sin_()
    return x


def mu_mutation_through_view(x):
    v = x[1]
    v.fill_(3.0)
    x.t()[0].zero_()
    return x.sum()


def mu_mutate_in_list(lst):
    lst[0].add_(1)
    lst[1].mul_(0.5)
    return lst[0] + lst[1]


def mu_out_kwarg(x, out):
    torch.add(x, 1, out=out)
    return out * 2


def mu_inplace_then_read_alias(x):
    y = x
    y += 1
    return x * y


def mu_index_put(x, idx, vals):
    x.index_put_((idx,), vals)
    return x


def mu_scatter_(x, idx):
    x.scatter_(1, idx, 0.0)
    return x.sum(1)


MUTATION = [
    (mu_add_, lambda: (torch.randn(3, 2),)),
    (mu_setitem, lambda: (torch.randn(3, 4),)),
    (mu_copy_, lambda: (torch.randn(3), torch.randn(3))),
    (mu_inplace_methods, lambda: (torch.randn(3), torch.randn(3))),
    (mu_returns_mutated_input_itself, lambda: (torch.randn(3),)),
    (mu_mutation_through_view, lambda: (torch.randn(3, 3),)),
    (mu_mutate_in_list, lambda: ([torch.randn(3), torch.randn(3)],)),
    (mu_out_kwarg, lambda: (torch.randn(3), torch.empty(3))),
    (mu_inplace_then_read_alias, lambda: (torch.randn(3),)),
    (mu_index_put, lambda: (torch.randn(5), torch.tensor([0, 3]), torch.randn(2))),
    (mu_scatter_, lambda: (torch.randn(3, 4), torch.tensor([[0], [2], [3]]))),
]


@pytest.mark.parametrize("fn,make", MUTATION, ids=[f.__name__ for f, _ in MUTATION])
def test_input_mutation(fn, make):
    check(fn, make())


def test_aliased_inputs_mutation():
    x = torch.randn(4)
    # The same tensor passed twice: the mutation through one name is seen through the other.
    check(lambda a, b: (a.add_(1), b * 2)[1], (x, x))


# ----------------------------------------------------------------------------- autograd

def g_simple(x, w):
    return (x @ w).tanh().sum(-1)


def g_mixed_requires_grad(x, w, b):
    return F.linear(x, w, b).relu(), x.detach() * 2


def g_multiple_outputs(x):
    a = x.sin()
    b = x.cos() * a
    return a, {"b": b, "n": 3}


def g_no_grad_block(x):
    with torch.no_grad():
        y = x * 2
    return x * y, y.requires_grad


def g_enable_grad_requires_grad_flag(x):
    y = x * 3
    return y, y.requires_grad


def g_softmax_ce(logits, target):
    return F.cross_entropy(logits.log_softmax(-1), target)


AUTOGRAD = [
    (g_simple, lambda: (torch.randn(2, 3, requires_grad=True), torch.randn(3, 4,
                                                                           requires_grad=True))),
    (g_mixed_requires_grad, lambda: (torch.randn(2, 3), torch.randn(4, 3, requires_grad=True),
                                     torch.randn(4, requires_grad=True))),
    (g_multiple_outputs, lambda: (torch.randn(3, requires_grad=True),)),
    (g_no_grad_block, lambda: (torch.randn(3, requires_grad=True),)),
    (g_enable_grad_requires_grad_flag, lambda: (torch.randn(3, requires_grad=True),)),
    (g_softmax_ce, lambda: (torch.randn(4, 5, requires_grad=True), torch.tensor([1, 0, 4, 2]))),
]


@pytest.mark.parametrize("fn,make", AUTOGRAD, ids=[f.__name__ for f, _ in AUTOGRAD])
def test_autograd(fn, make):
    check(fn, make(), backward=True)


def test_no_grad_inputs_outputs_do_not_require_grad():
    check(g_simple, (torch.randn(2, 3), torch.randn(3, 4)))


def test_compiled_under_no_grad_context():
    def fn(x):
        with torch.no_grad():
            return x * 2, torch.is_grad_enabled()
    check(fn, (torch.randn(3, requires_grad=True),))
