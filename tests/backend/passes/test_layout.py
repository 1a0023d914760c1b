"""Channels-last convolutions (ember/backend/passes/layout.py): the graph converts conv inputs and
weights, the pointwise work between convolutions stays channels-last, results match eager."""
import os

import pytest
import torch

import ember
from ember import config
from ember.backend import compile as backend_compile
from ember.backend import compile_stats
from ember.bench import zoo
from ember.testing import same

INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"


CPU_TARGETS = [{}, pytest.param({"cpu_backend": "triton"}, marks=pytest.mark.skipif(
    not INTERPRETED, reason="Triton's interpreter is enabled only in processes started with "
                            "TRITON_INTERPRET=1 (tests/conftest.py, without a GPU)"))]


def _last_wrapper() -> str:
    return [s for s in backend_compile.generated_sources if "def call(" in s][-1]


def _channels_last_run(fn, *inputs, options=None):
    """Eager's and Ember's results of ``fn`` with every graph's convolutions channels-last,
    Ember's perf hints logged."""
    ember.reset()
    ember.logs.set_logs("perf_hints")
    with torch.no_grad(), config.patch(layout_optimization="channels_last"):
        return fn(*inputs), ember.compile(fn, options=options or {})(*inputs)


@pytest.mark.parametrize("options", CPU_TARGETS, ids=["cpp", "triton-interp"])
def test_channels_last_convnet_matches_eager(options):
    model, inputs = zoo.build_model("convnet", batch_size=2)[:2]
    model.eval()
    ember.reset()
    with torch.no_grad(), config.patch(layout_optimization="channels_last"):
        out = ember.compile(model, options=options)(*inputs)
        assert same(model(*inputs), out, rtol=1e-4, atol=1e-4)
    wrapper = _last_wrapper()
    # conv results are channels-last (C has stride 1) and so are the BN+ReLU buffers after them
    assert "with_layout(buf" in wrapper and ", 1, 1024, 16))" in wrapper
    assert not compile_stats.fallback_ops


def test_auto_on_cpu_converts_graphs_whose_weights_are_small():
    """CPU ``auto``: the convnet's weights are small next to its activations, so its
    inference graph runs channels-last (and matches eager); a layer whose 3x3 weights
    dwarf its input stays NCHW. Training graphs count the weights twice (their gradients
    convert back): a layer whose weights are 1.2x its input converts for inference only."""
    from ember.backend.passes.layout import wants_channels_last
    model, inputs = zoo.build_model("convnet", batch_size=2)[:2]
    model.eval()
    ember.reset()
    with torch.no_grad():
        assert same(model(*inputs), ember.compile(model)(*inputs), rtol=1e-4, atol=1e-4)
    assert ", 1, 1024, 16))" in _last_wrapper()
    cpu = _target("cpu")
    small = _conv_graph((2, 16, 32, 32), (16, 16, 3, 3))
    assert wants_channels_last(small, cpu) is True
    assert wants_channels_last(small, cpu, training=True) is True
    assert wants_channels_last(_conv_graph((1, 64, 8, 8), (64, 64, 3, 3)), cpu) is False
    middle = _conv_graph((1, 16, 11, 11), (16, 16, 3, 3))     # weights 2304, input 1936
    assert wants_channels_last(middle, cpu) is True
    assert wants_channels_last(middle, cpu, training=True) is False



@pytest.mark.parametrize("upcasts", [True, False])
def test_cpu_training_of_half_convolutions_on_float_copies_stays_nchw(monkeypatch, upcasts):
    """Where the CPU computes half convolutions on float32 copies (no oneDNN half kernels:
    AVX2), a bf16 training graph stays NCHW under ``auto`` (channels-last made the
    builtin convnet's step 1.6x slower there); inference, and training where oneDNN has
    the kernels, follow the weights rule."""
    from ember.backend.passes.layout import wants_channels_last
    from ember.backend.targets import CpuPolicy
    monkeypatch.setattr(CpuPolicy, "upcasts_half_matmuls", lambda self, dtype: upcasts)
    cpu = _target("cpu")
    gm = _conv_graph((2, 16, 32, 32), (16, 16, 3, 3), torch.bfloat16)
    assert wants_channels_last(gm, cpu) is True
    assert wants_channels_last(gm, cpu, training=True) is (not upcasts)
    # float32 operands under CPU autocast compute in bf16 too
    f32 = _conv_graph((2, 16, 32, 32), (16, 16, 3, 3))
    assert wants_channels_last(f32, cpu, training=True) is True
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert wants_channels_last(f32, cpu, training=True) is (not upcasts)

def _target(device: str):
    """The target whose layout policy applies to a graph on ``device`` (a CUDA one is made
    without starting anything: its policy needs no GPU)."""
    from ember.backend.targets import target_for
    from ember.backend.targets.triton.target import TritonTarget
    if device == "cuda":
        return TritonTarget(interpret=False, device=torch.device("cuda"))
    return target_for(torch.device(device))


def _conv_graph(x_shape, w_shape, dtype=torch.float32, groups=1):
    """A captured ``relu(conv2d(x, w))`` with the metadata capture records (meta tensors)."""
    gm = torch.fx.symbolic_trace(lambda x, w: torch.relu(torch.conv2d(x, w, groups=groups)))
    values = (torch.randn(x_shape, dtype=dtype, device="meta"),
              torch.randn(w_shape, dtype=dtype, device="meta"))
    for node, value in zip(gm.graph.find_nodes(op="placeholder"), values):
        node.meta["val"] = value
    return gm


def test_auto_converts_half_cuda_graphs_only():
    """``auto`` on a graph of bfloat16 convolutions: channels-last on CUDA; on the CPU its
    weights outweigh its input, so NCHW unless asked. Decided from the captured graph's
    metadata: no GPU needed."""
    from ember.backend.passes.layout import wants_channels_last
    gm = _conv_graph((2, 3, 8, 8), (64, 3, 3, 3), torch.bfloat16)
    cuda, cpu = _target("cuda"), _target("cpu")
    assert wants_channels_last(gm, cuda) is True
    assert wants_channels_last(gm, cpu) is False
    with config.patch(layout_optimization="channels_last"):
        assert wants_channels_last(gm, cpu) is True
    with config.patch(layout_optimization="off"):
        assert wants_channels_last(gm, cuda) is False


class _Separable(torch.nn.Module):
    """MobileNet's block: a convolution, a depthwise one, a pointwise (1x1) one."""

    def __init__(self):
        super().__init__()
        self.stem = torch.nn.Conv2d(3, 8, 3, padding=1)
        self.depthwise = torch.nn.Conv2d(8, 8, 3, padding=1, groups=8)
        self.pointwise = torch.nn.Conv2d(8, 4, 1)

    def forward(self, x):
        return self.pointwise(torch.relu(self.depthwise(torch.relu(self.stem(x)))))


def test_depthwise_convolutions_stay_nchw_on_cuda_only(ember_log, monkeypatch):
    """CUDA channels-last graphs run depthwise convolutions NCHW (cuDNN's channels-last ones
    are slow to start) unless the target generates them as stencils, which read their input
    in its own layout (inference graphs, filters of at most
    ``max_generated_depthwise_taps`` taps: made 25 here, CUDA's is off until measured); on
    the CPU they go channels-last with the rest. Results match."""
    from ember.backend.passes.layout import convert_convolutions
    from ember.backend.targets.triton.target import TritonTarget
    monkeypatch.setattr(TritonTarget, "max_generated_depthwise_taps", 25)
    assert same(*_channels_last_run(_Separable().eval(), torch.randn(2, 3, 10, 10)),
                rtol=1e-4, atol=1e-4)
    assert "3 convolutions run channels-last, 0 depthwise ones NCHW" in ember_log.text
    nchw, last = torch.contiguous_format, torch.channels_last
    for filter_size, device, training, layout in (
            (3, "cuda", False, None), (3, "cuda", True, nchw), (7, "cuda", False, nchw),
            (3, "cpu", False, last), (7, "cpu", False, last)):
        depthwise = _conv_graph((2, 8, 10, 10), (8, 1, filter_size, filter_size), groups=8)
        converted = convert_convolutions(depthwise, _target(device), training=training)
        formats = [n.kwargs["memory_format"] for n in converted.graph.nodes
                   if n.op == "call_method"]
        assert formats == ([layout, layout] if layout else []), (filter_size, device, training)


def test_depthwise_convolutions_eager_runs_channels_last_stay_so_on_cuda():
    """ConvNeXt's depthwise convolutions read a value permuted back from NHWC: eager runs
    cuDNN's channels-last kernel on it (3x faster than ATen's NCHW one on 7x7 filters), and
    so does Ember."""
    from ember.backend.passes.layout import convert_convolutions
    gm = _conv_graph((2, 8, 10, 10), (8, 1, 7, 7), groups=8)
    x = gm.graph.find_nodes(op="placeholder")[0]
    x.meta["val"] = x.meta["val"].contiguous(memory_format=torch.channels_last)
    converted = convert_convolutions(gm, _target("cuda"))
    formats = [n.kwargs["memory_format"] for n in converted.graph.nodes if n.op == "call_method"]
    assert formats == [torch.channels_last, torch.channels_last]


@pytest.mark.parametrize("choice,layout", [("auto", torch.contiguous_format),
                                           ("channels_last", torch.channels_last)])
def test_channels_last_by_name_converts_depthwise_convolutions_on_cuda(choice, layout):
    """The layout decision for a bfloat16 CUDA graph (the graph it would build, inspected:
    no GPU needed)."""
    from ember.backend.passes.layout import in_best_layout
    # (7x7: more taps than Ember generates as a stencil)
    gm = _conv_graph((2, 8, 10, 10), (8, 1, 7, 7), torch.bfloat16, groups=8)
    with config.patch(layout_optimization=choice):
        converted = in_best_layout(gm, _target("cuda"), False, lambda g: g)
    formats = [n.kwargs["memory_format"] for n in converted.graph.nodes
               if n.op == "call_method" and "memory_format" in n.kwargs]
    assert formats == [layout, layout]


def test_unknown_layout_choice_raises():
    with pytest.raises(ValueError, match="layout_optimization.*'nhwc'.*'channels_last'"):
        config.patch(layout_optimization="nhwc")
    with pytest.raises(ValueError, match="layout_optimization"):
        config.layout_optimization = "nhwc"
    assert config.layout_optimization == "auto"


class _ConvPoolConv(torch.nn.Module):
    """resnet's stem: conv, BN, ReLU, max-pool, then two convolutions of the pooled value."""
    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 16, 3, padding=1)
        self.bn = torch.nn.BatchNorm2d(16)
        self.pool = torch.nn.MaxPool2d(3, 2, 1)
        self.a = torch.nn.Conv2d(16, 8, 1)
        self.b = torch.nn.Conv2d(16, 8, 1)

    def forward(self, x):
        y = self.pool(torch.relu(self.bn(self.conv(x))))
        return self.a(y) + self.b(y)


@pytest.mark.parametrize("options", CPU_TARGETS, ids=["cpp", "triton-interp"])
def test_pooled_value_is_written_once_channels_last(options):
    """The max-pool result keeps eager's channels-last strides, and the convolutions read
    it as it is: no second, converted copy is written (one store per kernel)."""
    model = _ConvPoolConv().eval()
    x = torch.randn(2, 3, 16, 16)
    ember.reset()
    with torch.no_grad(), config.patch(layout_optimization="channels_last"):
        out = ember.compile(model, options=options)(x)
        assert same(model(x), out, rtol=1e-4, atol=1e-4)
    wrapper = _last_wrapper()
    pooled = [line for line in wrapper.splitlines() if "(2, 16, 8, 8)" in line
              and "empty_strided" in line]
    assert len(pooled) == 1 and "(1024, 1, 128, 16)" in pooled[0], pooled


@pytest.mark.parametrize("choice", ["channels_last", "auto"])
def test_channels_last_training_matches_eager_gradients(ember_log, choice):
    """Training graphs convert their convolutions too (on the CPU under ``auto`` where the
    weights are small, as the convnet's): the loss, every parameter's gradient (values and
    strides: the conversion's backward returns the parameter's own layout) and batch
    norm's running statistics match eager's over two steps."""
    import copy
    model, inputs = zoo.build_model("convnet", batch_size=2)[:2]
    model.train()
    reference = copy.deepcopy(model)
    ember.reset()
    ember.logs.set_logs("perf_hints")
    with config.patch(layout_optimization=choice):
        compiled = ember.compile(model)
        for _ in range(2):
            expected, actual = reference(*inputs).sum(), compiled(*inputs).sum()
            expected.backward()
            actual.backward()
            assert same(expected, actual, rtol=1e-4, atol=1e-4)
    assert "convolutions run channels-last" in ember_log.text
    for (name, p), q in zip(model.named_parameters(), reference.parameters()):
        assert same(q.grad, p.grad, rtol=1e-4, atol=1e-4), name
        assert p.grad.stride() == q.grad.stride(), name
    for b, c in zip(model.buffers(), reference.buffers()):
        assert same(c, b, rtol=1e-4, atol=1e-4)


class _ConvHeads(torch.nn.Module):
    """Outputs whose eager strides a channels-last graph would change: a convolution's
    result, an upsampling of it, and a permuted view (NHWC in eager, over NCHW memory)."""

    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(8, 8, 3, padding=1)

    def forward(self, x):
        y = torch.relu(self.conv(x))
        up = torch.nn.functional.interpolate(y, scale_factor=2, mode="bilinear")
        return y.sum(1), up, torch.sigmoid(y).permute(0, 2, 3, 1)


@pytest.mark.parametrize("options", CPU_TARGETS, ids=["cpp", "triton-interp"])
def test_channels_last_graph_returns_eager_strides(options, ember_log):
    expected, actual = _channels_last_run(_ConvHeads().eval(), torch.randn(2, 8, 12, 12),
                                          options=options)
    assert "convolutions run channels-last" in ember_log.text
    assert "stays NCHW" not in ember_log.text
    for e, a in zip(expected, actual):
        assert same(e, a, rtol=1e-4, atol=1e-4)
        assert a.stride() == e.stride()


class _LeNet(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1, self.conv2 = torch.nn.Conv2d(1, 6, 5), torch.nn.Conv2d(6, 16, 5)
        self.fc = torch.nn.Linear(16 * 5 * 5, 10)

    def forward(self, x):
        x = torch.max_pool2d(torch.relu(self.conv1(x)), 2)
        x = torch.max_pool2d(torch.relu(self.conv2(x)), 2)
        return self.fc(x.view(-1, 16 * 5 * 5))


def test_view_that_channels_last_cannot_take_keeps_the_graph_nchw(ember_log):
    """``x.view(n, -1)`` after a convolution is legal in eager (NCHW) and not on
    channels-last data: the graph compiles in its captured layout, says so, and matches."""
    assert same(*_channels_last_run(_LeNet().eval(), torch.randn(4, 1, 32, 32)),
                rtol=1e-4, atol=1e-4)
    assert "stays NCHW: its channels-last copy fails to trace (ValueError: Cannot view" \
        in ember_log.text
    assert "(4, 16, 5, 5), (400, 1, 80, 16)" not in _last_wrapper()


def test_outputs_aliasing_each_other_keep_the_graph_nchw(ember_log):
    conv = torch.nn.Conv2d(4, 4, 3, padding=1)

    def f(x):
        y = conv(x)
        return y, y[:, :, ::2]

    expected, actual = _channels_last_run(f, torch.randn(2, 4, 8, 8))
    assert "stays NCHW: two of its outputs alias each other" in ember_log.text
    for e, a in zip(expected, actual):
        assert same(e, a, rtol=1e-4, atol=1e-4) and a.stride() == e.stride()
    assert actual[1].untyped_storage().data_ptr() == actual[0].untyped_storage().data_ptr()


def test_outputs_aliasing_as_dense_views_keep_the_graph_nchw(ember_log):
    """A transposed output is dense: copying it back to eager's strides would work, but
    would part it from the output it is a view of."""
    conv = torch.nn.Conv2d(4, 4, 3, padding=1)

    def f(x):
        y = conv(x)
        return y, y.transpose(2, 3)

    actual = _channels_last_run(f, torch.randn(2, 4, 8, 8))[1]
    assert "stays NCHW: two of its outputs alias each other" in ember_log.text
    assert actual[1].untyped_storage().data_ptr() == actual[0].untyped_storage().data_ptr()
