"""Outputs of a training graph that get no gradient must not change the others' gradients.

Eager's autograd never runs the backward of an output the loss does not reach. Feeding that
output's backward zeros instead is not the same: a backward formula can make NaN of a zero
(``a / b``'s backward divides by ``b``; where ``b`` is 0, ``0 / 0``), and the NaN is added
into the gradients that matter. Ember runs a backward graph without those outputs' part.
"""
from __future__ import annotations

import pytest
import torch

import ember
from ember.aot import training

TARGETS = ["cpp", pytest.param("triton", id="triton-interp")]


def _grads(fn, inputs, pick):
    """Gradients of the inputs for ``sum(outputs[i] * weight)`` over the outputs ``pick``."""
    leaves = [t.detach().clone().requires_grad_() for t in inputs]
    outs = fn(*leaves)
    loss = sum((outs[i] * torch.linspace(-1, 1, outs[i].numel()).view(outs[i].shape)).sum()
               for i in pick)
    return torch.autograd.grad(loss, leaves)


def _division_by_zero(y):
    a = y * 1.25
    b = torch.nan_to_num(a / (a - 0.5).round())      # divides by 0 where a is in [0, 1)
    return a, b


def _log_of_zero(x, w):
    logits = x @ w
    probs = logits.masked_fill(logits < 0, float("-inf")).softmax(-1)
    return (probs * logits).sum(), probs.log()      # (loss, log-probabilities: -inf at 0)


@pytest.mark.parametrize("cpu_backend", TARGETS)
@pytest.mark.parametrize("fn, shapes", [(_division_by_zero, [(6, 8)]),
                                        (_log_of_zero, [(4, 5), (5, 6)])],
                         ids=["division_by_zero", "log_of_zero"])
def test_gradients_of_some_outputs_match_eager(cpu_backend, fn, shapes):
    gen = torch.Generator().manual_seed(0)
    inputs = [torch.randn(*s, generator=gen) for s in shapes]
    compiled = ember.compile(fn, backend="ember", options={"cpu_backend": cpu_backend})
    for pick in ([0], [0, 1], [0]):        # the variant, the full backward, the variant again
        expected = _grads(fn, inputs, pick)
        actual = _grads(compiled, inputs, pick)
        for e, a in zip(expected, actual):
            assert not a.isnan().any() or e.isnan().any()
            torch.testing.assert_close(a, e, equal_nan=True)


def test_each_set_of_outputs_without_gradient_compiles_one_backward(monkeypatch):
    variants = []
    original = training.backward_without

    def counting(*args):
        variants.append(args[2])
        return original(*args)
    monkeypatch.setattr(training, "backward_without", counting)
    compiled = ember.compile(_division_by_zero, backend="ember")
    y = torch.randn(6, 8)
    for _ in range(3):
        _grads(compiled, [y], [0])
    _grads(compiled, [y], [0, 1])
    _grads(compiled, [y], [1])
    assert variants == [frozenset({1}), frozenset({0})]


def test_backward_without_drops_the_nodes_only_absent_tangents_reach(monkeypatch):
    pruned = []
    original = training.backward_without

    def keep(*args):
        pruned.append(original(*args))
        return pruned[-1]
    monkeypatch.setattr(training, "backward_without", keep)

    def f(x):
        return x.sin(), (x / (x - 1)).exp()
    x = torch.randn(5, requires_grad=True)
    ember.compile(f, backend="aot_eager")(x)[0].sum().backward()
    torch.testing.assert_close(x.grad, x.detach().cos())
    targets = [str(n.target) for n in pruned[0].graph.nodes if n.op == "call_function"]
    assert targets and not any("exp" in t or "div" in t for t in targets), targets


def test_a_backward_variant_that_fails_to_compile_runs_uncompiled(monkeypatch, ember_log):
    from ember import config
    compiled = ember.compile(_division_by_zero, backend="ember")
    y = torch.randn(6, 8)
    _grads(compiled, [y], [0, 1])          # compiled, with the full backward

    def broken(*args, **kwargs):
        raise RuntimeError("code generation bug")
    from ember.backend import compile as backend
    monkeypatch.setattr(backend, "compile_aten", broken)   # what the variant compiles with
    with config.patch(suppress_errors=False), pytest.raises(RuntimeError, match="code gen"):
        _grads(compiled, [y], [0])
    with config.patch(suppress_errors=True):
        actual = _grads(compiled, [y], [0])
    torch.testing.assert_close(actual, _grads(_division_by_zero, [y], [0]))
    assert "runs uncompiled" in ember_log.text
