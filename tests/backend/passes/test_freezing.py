"""``options={"freezing": True}`` (ember/backend/passes/freezing.py): batch norm folded into the
convolution before it, constant subgraphs computed once, and the guard that re-freezes when
a frozen parameter or buffer changes, so results always match eager."""
from __future__ import annotations

import logging

import pytest
import torch
import torch.nn as nn

import ember
from ember import config, logs
from ember.aot import trace_to_aten
from ember.backend import compile as backend_compile
from ember.backend.compile import compile_aten
from ember.backend.passes.freezing import FrozenCallable, freeze
from ember.bench import zoo
from ember.decomp import core_decompositions
from ember.testing import same

aten = torch.ops.aten
FREEZE = {"freezing": True}


@pytest.fixture(autouse=True)
def _reset():
    ember.reset()
    yield
    ember.reset()


def _randomize_bn(model: nn.Module) -> nn.Module:
    """Batch norms whose eval-mode transform is far from the identity."""
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, nn.BatchNorm2d):
                m.running_mean.uniform_(-1, 1)
                m.running_var.uniform_(0.5, 2)
                m.weight.uniform_(0.5, 2)
                m.bias.uniform_(-1, 1)
    return model


class ConvBnRelu(nn.Module):
    def __init__(self, bias: bool = True):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 8, 3, padding=1, bias=bias)
        self.bn1 = nn.BatchNorm2d(8)
        self.conv2 = nn.Conv2d(8, 4, 1, bias=bias)
        self.bn2 = nn.BatchNorm2d(4)

    def forward(self, x):
        return torch.relu(self.bn2(self.conv2(torch.relu(self.bn1(self.conv1(x))))))


def _compile(model, *inputs, options=FREEZE):
    """(compiled model, its first result, the generated sources of that compile)."""
    backend_compile.generated_sources.clear()
    compiled = ember.compile(model, options=options)
    with torch.no_grad():
        out = compiled(*inputs)
    return compiled, out, list(backend_compile.generated_sources)


def _kernels(sources: list[str]) -> str:
    return "\n".join(s for s in sources if "def call(" not in s)


# -- results and batch-norm folding ---------------------------------------------------------------

@pytest.mark.parametrize("bias", [True, False])
def test_conv_bn_relu_matches_eager_and_batch_norm_is_folded(bias):
    torch.manual_seed(0)
    model = _randomize_bn(ConvBnRelu(bias)).eval()
    x = torch.randn(2, 3, 10, 10)
    with torch.no_grad():
        expected = model(x)
    _, plain, plain_sources = _compile(model, x, options={})
    ember.reset()
    _, frozen, frozen_sources = _compile(model, x)
    assert same(expected, plain, rtol=1e-4, atol=1e-5)
    assert same(expected, frozen, rtol=1e-4, atol=1e-5)
    # unfrozen, the batch norm's arithmetic (sqrt of the running variance) runs in a kernel
    # on every call; frozen, it is folded into the convolutions' weights and bias, and the
    # only kernels left apply the relus
    assert "sqrt" in _kernels(plain_sources)
    frozen_kernels = _kernels(frozen_sources)
    assert "sqrt" not in frozen_kernels and frozen_kernels.count("ember_relu(tmp") == 2
    wrapper = next(s for s in frozen_sources if "def call(" in s)
    assert wrapper.count("aten.convolution.default") == 2


@pytest.mark.parametrize("name", ["convnet", "resnet18"])
def test_builtin_models_match_eager_with_batch_norms_folded(name):
    if not zoo.is_available(name):
        pytest.skip(f"{name} needs a package that is not installed")
    model, inputs = zoo.build_model(name, "cpu")
    with torch.no_grad():
        expected = model(*inputs)
    _, actual, sources = _compile(model, *inputs)
    assert same(expected, actual, rtol=1e-4, atol=1e-5)
    assert "sqrt" not in _kernels(sources)


def test_per_channel_arithmetic_after_a_convolution_is_folded():
    """Not only batch norm: ``conv(x) * c + d`` with per-channel constants (one made by
    ``arange``, which has no parameter behind it) folds into the convolution too."""
    class ScaleShift(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = nn.Conv2d(3, 5, 3, bias=False)
            self.shift = nn.Parameter(torch.randn(5, 1, 1))

        def forward(self, x):
            c = torch.arange(1, 6, dtype=x.dtype).view(1, 5, 1, 1)
            return torch.sigmoid((self.conv(x) * c - self.shift) / 3.0)

    model = ScaleShift()
    x = torch.randn(2, 3, 7, 7)
    with torch.no_grad():
        expected = model(x)
    with config.patch(layout_optimization="off"):    # no input conversion kernel to count
        _, actual, sources = _compile(model, x)
    torch.testing.assert_close(actual, expected)
    wrapper = next(s for s in sources if "def call(" in s)
    assert wrapper.count("aten.convolution.default") == 1
    # the one kernel after the convolution is the sigmoid alone: it reads one buffer (the
    # convolution's output), no shift or scale
    kernels = _kernels(sources)
    assert kernels.count("extern \"C\" void ") == 1 and kernels.count("const float*") == 1
    assert "ember_sigmoid" in kernels


def test_undecomposed_batch_norm_op_is_rewritten_and_folded():
    """With the batch-norm ops left out of the decompositions, the op itself reaches the
    pass: it becomes per-channel arithmetic that the convolution absorbs."""
    torch.manual_seed(0)
    model = _randomize_bn(nn.Sequential(nn.Conv2d(3, 8, 3), nn.BatchNorm2d(8))).eval()
    gm = torch.fx.symbolic_trace(model)
    x = torch.randn(2, 3, 8, 8)
    decomps = {op: fn for op, fn in core_decompositions().items()
               if "batch_norm" not in str(op)}
    with torch.no_grad():
        traced = trace_to_aten(gm, [x], decompositions=decomps).gm
        targets = {n.target for n in traced.graph.nodes}
        assert aten._native_batch_norm_legit_no_training.default in targets
        frozen = freeze(gm, traced, [x])
        ops = [n.target for n in frozen.gm.graph.nodes if n.op == "call_function"]
        assert ops == [aten.convolution.default]
        assert frozen.stats["batch_norms_rewritten"] == 1
        torch.testing.assert_close(compile_aten(frozen.gm, [x])(x)[0], model(x))


# -- constant subgraphs ---------------------------------------------------------------------------

_probe_calls = {"n": 0}
_probe_lib = torch.library.Library("ember_freezing_test", "DEF")
_probe_lib.define("doubled(Tensor x) -> Tensor")


def _doubled(x):
    _probe_calls["n"] += 1
    return x * 2


_probe_lib.impl("doubled", _doubled, "CPU")
_probe_lib.impl("doubled", lambda x: torch.empty_like(x), "Meta")


class UsesProbe(nn.Module):
    """``x @ f(W).t()`` with an op (without a lowering) that counts its calls."""

    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.randn(6, 5))

    def forward(self, x):
        return x @ torch.ops.ember_freezing_test.doubled(self.w).t()


@pytest.mark.parametrize("options, calls", [({}, 3), (FREEZE, 1)])
def test_constant_subgraph_is_computed_once_not_per_call(options, calls):
    model = UsesProbe()
    x = torch.randn(3, 5)
    compiled = ember.compile(model, options=options)
    _probe_calls["n"] = 0
    with torch.no_grad():
        results = [compiled(x) for _ in range(3)]
        n = _probe_calls["n"]
        expected = model(x)
    assert n == calls
    for r in results:
        torch.testing.assert_close(r, expected)


def test_outputs_of_constants_are_fresh_tensors_each_call():
    class Scaled(nn.Module):
        def __init__(self):
            super().__init__()
            self.w = nn.Parameter(torch.randn(4, 3))

        def forward(self, x):
            return (self.w * 2).t(), x + self.w.sum()

    model = Scaled()
    compiled = ember.compile(model, options=FREEZE)
    x = torch.randn(3)
    with torch.no_grad():
        a, _ = compiled(x)
        a.zero_()                      # the caller owns its result, as in eager
        b, y = compiled(x)
        expected_b, expected_y = model(x)
    assert b.data_ptr() != a.data_ptr()
    torch.testing.assert_close(b, expected_b)
    torch.testing.assert_close(y, expected_y)


# -- the guard ------------------------------------------------------------------------------------

def _check(compiled, model, x):
    with torch.no_grad():
        torch.testing.assert_close(compiled(x), model(x), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("change", [
    "inplace_weight", "replace_parameter", "assign_data", "buffer_inplace",
    "load_state_dict", "optimizer_step",
])
def test_changed_parameters_and_buffers_are_seen_on_the_next_call(change, ember_log):
    logs.set_logs("recompiles")
    torch.manual_seed(0)
    model = _randomize_bn(ConvBnRelu()).eval()
    x = torch.randn(2, 3, 6, 6)
    compiled = ember.compile(model, options=FREEZE)
    _check(compiled, model, x)
    if change == "inplace_weight":
        with torch.no_grad():
            model.conv1.weight.mul_(2)
        name = "conv1.weight"
    elif change == "replace_parameter":
        model.conv1.weight = nn.Parameter(torch.randn_like(model.conv1.weight))
        name = "conv1.weight"
    elif change == "assign_data":
        model.conv2.weight.data = torch.randn_like(model.conv2.weight)
        name = "conv2.weight"
    elif change == "buffer_inplace":
        model.bn2.running_var.fill_(3.0)
        name = "bn2.running_var"
    elif change == "load_state_dict":
        other = _randomize_bn(ConvBnRelu()).eval()
        model.load_state_dict(other.state_dict())
        name = "conv1.weight"
    else:
        opt = torch.optim.SGD(model.parameters(), lr=0.5)
        with torch.enable_grad():
            model(x).sum().backward()
        opt.step()
        name = "conv1.weight"
    before = ember_log.text
    _check(compiled, model, x)
    assert "freezing: L['self']." + name in ember_log.text[len(before):]
    _check(compiled, model, x)                    # and it stays right


class _AsTuple(nn.Module):
    """Returns its module's output in a tuple, as the frontends' graphs do (compile_graph
    then returns the frozen program itself, not a wrapper restoring a bare output)."""

    def __init__(self, module):
        super().__init__()
        self.module = module

    def forward(self, x):
        return (self.module(x),)


def test_guard_refreezes_without_recompiling_the_code():
    torch.manual_seed(0)
    model = _randomize_bn(ConvBnRelu()).eval()
    gm = torch.fx.symbolic_trace(_AsTuple(model))
    x = torch.randn(1, 3, 5, 5)
    with torch.no_grad():
        compiled = backend_compile.compile_graph(gm, [x], freezing=True)
        assert isinstance(compiled, FrozenCallable)
        inner = compiled.compiled
        constants = list(compiled.frozen.constants)
        model.bn1.weight.mul_(-1)            # read through get_attr: a frozen constant too
        torch.testing.assert_close(compiled(x)[0], model(x), rtol=1e-4, atol=1e-5)
    assert compiled.refreezes == 1 and compiled.compiled is inner
    assert all(a is b for a, b in zip(compiled.frozen.constants, constants))


def test_frozen_weights_read_directly_are_not_guarded():
    """A weight the graph only reads (``t(W)`` of a linear) is read on every call: nothing to
    guard, and a change is seen without re-freezing."""
    model = nn.Linear(4, 3).eval()
    x = torch.randn(2, 4)
    gm = torch.fx.symbolic_trace(model)
    with torch.no_grad():
        compiled = backend_compile.compile_graph(gm, [x], freezing=True)
        assert not isinstance(compiled, FrozenCallable)
        model.weight.mul_(3)
        torch.testing.assert_close(compiled(x), model(x))


def test_inference_mode_compile_then_changed_weights_under_no_grad():
    torch.manual_seed(0)
    model = _randomize_bn(ConvBnRelu()).eval()
    x = torch.randn(2, 3, 6, 6)
    compiled = ember.compile(model, options=FREEZE)
    with torch.inference_mode():
        torch.testing.assert_close(compiled(x), model(x), rtol=1e-4, atol=1e-5)
    with torch.no_grad():
        model.conv2.weight.add_(1)
    with torch.inference_mode():
        torch.testing.assert_close(compiled(x), model(x), rtol=1e-4, atol=1e-5)


# -- what is not frozen ---------------------------------------------------------------------------

def test_training_graph_is_not_frozen_and_warns(caplog):
    torch.manual_seed(0)
    model = _randomize_bn(ConvBnRelu()).eval()
    x = torch.randn(2, 3, 6, 6)
    compiled = ember.compile(model, options=FREEZE)
    with caplog.at_level(logging.WARNING, logger="ember"):
        out = compiled(x)                    # grad mode on, parameters require grad
    assert "freezing=True is for inference" in caplog.text
    out.sum().backward()
    grad = model.conv1.weight.grad.clone()
    model.zero_grad()
    model(x).sum().backward()
    torch.testing.assert_close(grad, model.conv1.weight.grad)


def test_mutated_buffers_are_not_frozen():
    """Training-mode batch norm under no_grad updates its running statistics: they are
    graph inputs written back, as without freezing."""
    torch.manual_seed(0)
    model = _randomize_bn(ConvBnRelu()).train()
    twin = _randomize_bn(ConvBnRelu()).train()
    twin.load_state_dict(model.state_dict())
    x = torch.randn(2, 3, 6, 6)
    compiled = ember.compile(model, options=FREEZE)
    with torch.no_grad():
        for _ in range(2):
            torch.testing.assert_close(compiled(x), twin(x), rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(model.bn1.running_mean, twin.bn1.running_mean)
    torch.testing.assert_close(model.bn2.running_var, twin.bn2.running_var)


def test_function_without_parameters_compiles_as_usual():
    def f(x, y):
        return torch.relu(x * 2 + y)

    x, y = torch.randn(8), torch.randn(8)
    with torch.no_grad():
        torch.testing.assert_close(ember.compile(f, options=FREEZE)(x, y),
                                   torch.relu(x * 2 + y))
