"""Values computed from no input that need ATen fallbacks are computed once, at compile time
(ember/backend/passes/constant_folding.py); Swin's shifted-window attention mask (slice
assignments into ``new_zeros``), which did, now has lowerings. Results match eager on both
CPU targets."""
import pytest
import torch

import ember
from ember import config, logs
from ember.backend import compile_stats

pytestmark = pytest.mark.usefixtures("cpu_backend")


@pytest.fixture(autouse=True)
def _fresh():
    ember.reset()
    compile_stats.reset()
    with config.patch(suppress_errors=False, fallback_on_lowering_error=False):
        yield


def shifted_window_scores(scores, x):
    """torchvision's ``shifted_window_attention`` mask, on 8x8 windows of 4x4."""
    mask = x.new_zeros((8, 8))
    count = 0
    for h in ((0, -4), (-4, -2), (-2, None)):
        for w in ((0, -4), (-4, -2), (-2, None)):
            mask[h[0]:h[1], w[0]:w[1]] = count
            count += 1
    mask = mask.view(2, 4, 2, 4).permute(0, 2, 1, 3).reshape(4, 16)
    mask = mask.unsqueeze(1) - mask.unsqueeze(2)
    mask = mask.masked_fill(mask != 0, -100.0).masked_fill(mask == 0, 0.0)
    return torch.softmax(scores + mask, -1) * x.sum()


def positions_scores(scores, x):
    """A constant that needs a fallback (``cumsum`` has no lowering) next to the input."""
    positions = x.new_ones((16,)).cumsum(0) / 16
    return torch.softmax(scores + positions, -1) * x.sum()


def test_constant_needing_a_fallback_is_computed_once(ember_log):
    logs.set_logs("perf_hints")
    scores, x = torch.randn(3, 4, 16, 16), torch.randn(5)
    with torch.no_grad():
        compiled = ember.compile(positions_scores)
        for _ in range(2):
            torch.testing.assert_close(compiled(scores, x), positions_scores(scores, x))
    assert "constant folding: 1 value(s)" in ember_log.text
    assert "fallbacks (aten.cumsum.default)" in ember_log.text
    assert dict(compile_stats.fallback_ops) == {}


def test_swin_mask_is_generated_code(ember_log):
    """Its slice assignments (``fill`` and ``as_strided_scatter``) have lowerings: the mask
    is computed in the kernels that read it, nothing is folded or left to ATen."""
    logs.set_logs("perf_hints")
    scores, x = torch.randn(3, 4, 16, 16), torch.randn(5)
    with torch.no_grad():
        torch.testing.assert_close(ember.compile(shifted_window_scores)(scores, x),
                                   shifted_window_scores(scores, x))
    assert "constant folding" not in ember_log.text
    assert dict(compile_stats.fallback_ops) == {}


def test_gradients_through_a_folded_constant_match_eager():
    scores = torch.randn(2, 4, 16, 16, requires_grad=True)
    x = torch.randn(5, requires_grad=True)
    ember.compile(positions_scores)(scores, x).pow(2).sum().backward()
    got = scores.grad, x.grad
    scores.grad = x.grad = None
    positions_scores(scores, x).pow(2).sum().backward()
    torch.testing.assert_close(got, (scores.grad, x.grad))
    assert dict(compile_stats.fallback_ops) == {}


def test_constants_with_lowerings_are_computed_inline(ember_log):
    logs.set_logs("perf_hints")

    def fn(x):
        return x + torch.arange(4.0) * 2 + x.new_ones((4,)).exp()
    x = torch.randn(4, 4)
    with torch.no_grad():
        torch.testing.assert_close(ember.compile(fn)(x), fn(x))
    assert "constant folding" not in ember_log.text


def test_a_constant_output_is_a_fresh_tensor_each_call(ember_log):
    """The mask is an output: only the filled slice inside it is folded; each call returns
    a new mask, as eager does."""
    logs.set_logs("perf_hints")

    def fn(x):
        mask = x.new_zeros((4, 4))
        mask[1:3] = 2.0
        return x * 2, mask
    x = torch.randn(4, 4)
    with torch.no_grad():
        compiled = ember.compile(fn)
        first = compiled(x)
        first[1].fill_(7.0)
        second = compiled(x)
    assert second[1].data_ptr() != first[1].data_ptr()
    for got, want in zip(second, fn(x)):
        torch.testing.assert_close(got, want)


def cpu_scale_scores(scores):
    """DeBERTa's scale: a CPU scalar tensor that CUDA scores are divided by."""
    scale = torch.sqrt(torch.tensor(scores.size(-1), dtype=torch.float) * 2)
    return torch.softmax(scores / scale.to(dtype=scores.dtype), -1) + torch.tensor(0.5)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_cpu_scalar_constants_of_a_cuda_graph_are_folded_onto_the_gpu(ember_log, dtype):
    """Each op on DeBERTa's CPU scale ran in ATen, and so did the division of the CUDA
    scores by it: now the scale is computed once, kept on the GPU, and read by kernels."""
    logs.set_logs("perf_hints")
    scores = torch.randn(4, 64, 64, device="cuda", dtype=dtype)
    with torch.no_grad():
        compiled = ember.compile(cpu_scale_scores)
        for _ in range(2):
            got, want = compiled(scores), cpu_scale_scores(scores)
            assert got.dtype == want.dtype and got.device == want.device
            torch.testing.assert_close(got, want)
    assert "constant folding: " in ember_log.text
    assert dict(compile_stats.fallback_ops) == {}


def _scalar_graph():
    """``x / sqrt(tensor(64.) * 2).to(x.dtype) + tensor(.5)`` as ATen ops, the tensors
    constants on the CPU and ``x`` on the meta device (standing in for a GPU)."""
    from ember.fake import FakeTensorMode
    aten = torch.ops.aten
    gm = torch.nn.Module()
    gm.c64 = torch.tensor(64.0)
    gm.point5 = torch.tensor(0.5)
    graph = torch.fx.Graph()
    x = graph.placeholder("x")
    c64, point5 = graph.get_attr("c64"), graph.get_attr("point5")
    lifted = graph.call_function(aten.lift_fresh_copy.default, (c64,))
    scale = graph.call_function(aten.sqrt.default, (
        graph.call_function(aten.mul.Tensor, (lifted, 2)),))
    scale = graph.call_function(aten._to_copy.default, (scale,), {"dtype": torch.bfloat16})
    out = graph.call_function(aten.add.Tensor, (
        graph.call_function(aten.div.Tensor, (x, scale)), point5))
    graph.output((out,))
    gm = torch.fx.GraphModule(gm, graph)
    fake = FakeTensorMode()
    vals = {"x": torch.empty(4, 4, dtype=torch.bfloat16, device="meta")}
    for node in graph.nodes:            # each node's fake value, as tracing leaves them
        if node.op == "output":
            continue
        if node.op == "placeholder":
            real = vals[node.name]
        elif node.op == "get_attr":
            real = getattr(gm, node.target)
        else:
            args, kwargs = torch.fx.node.map_arg((node.args, node.kwargs),
                                                 lambda a: vals[a.name])
            real = node.target(*args, **kwargs)
        vals[node.name] = real
        node.meta["val"] = fake.from_real(real)
    return gm


def test_scalar_constants_move_to_the_graphs_device(ember_log):
    """The folded scale and the bare ``tensor(.5)`` are read by ops on the graph's device:
    both become 0-dim constants there, so those ops lower to kernels (on a GPU; checked
    here with the meta device in its place). On the CPU's own graphs nothing moves."""
    from ember.backend.passes.constant_folding import fold_constant_fallbacks
    logs.set_logs("perf_hints")
    on_cpu = _scalar_graph()
    fold_constant_fallbacks(on_cpu, torch.device("cpu"))
    assert all(getattr(on_cpu, n.target).device.type == "cpu"
               for n in on_cpu.graph.nodes if n.op == "get_attr")
    gm = _scalar_graph()
    assert fold_constant_fallbacks(gm, torch.device("meta")) == 2
    div = next(n for n in gm.graph.nodes if n.target is torch.ops.aten.div.Tensor)
    add = next(n for n in gm.graph.nodes if n.target is torch.ops.aten.add.Tensor)
    for node in (div.args[1], add.args[1]):
        assert node.op == "get_attr"
        value = getattr(gm, node.target)
        assert value.device.type == "meta" and value.dim() == 0
        assert node.meta["val"].device.type == "meta"
    assert getattr(gm, div.args[1].target).dtype == torch.bfloat16
    assert "2 value(s) computed from no input with ATen fallbacks (aten._to_copy.default, " \
        "aten.lift_fresh_copy.default, aten.mul.Tensor, aten.sqrt.default) and 1 scalar(s) " \
        "on another device moved to meta" in ember_log.text
