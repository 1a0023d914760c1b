"""merge_reduced_dims: reductions over adjacent contiguous dims become one merged dim."""
import copy

import pytest
import torch
import torch.fx
import torch.nn as nn

import ember
from ember.aot import training
from ember.aot.reductions import merge_reduced_dims, merged_shape

aten = torch.ops.aten


def test_merged_shape():
    shape, strides = [16, 8, 4, 5], [160, 20, 5, 1]
    assert merged_shape(shape, strides, [0, 2, 3]) == ([16, 8, 20], [0, 2])
    assert merged_shape(shape, strides, [1, 2, 3]) == ([16, 160], [1])
    assert merged_shape(shape, strides, [-1, -2]) == ([16, 8, 20], [2])
    assert merged_shape(shape, strides, [0, 2]) is None            # not adjacent
    # channels-last strides: H and W are still contiguous with each other, C is not
    assert merged_shape(shape, [160, 1, 40, 8], [2, 3]) == ([16, 8, 20], [2])
    assert merged_shape(shape, [160, 1, 40, 8], [1, 2, 3]) == ([16, 8, 20], [1, 2])
    # H and W transposed: no view merges them
    assert merged_shape(shape, [160, 20, 1, 4], [2, 3]) is None


def _graph(build):
    """A graph ``x -> build(graph, x)`` with fake-free meta values from real tensors."""
    graph = torch.fx.Graph()
    x = graph.placeholder("x")
    graph.output(build(graph, x))
    return torch.fx.GraphModule(torch.nn.Module(), graph)


def _annotate(gm, *args):
    """meta["val"] of each node: the value it computes on ``args`` (eagerly)."""
    env = {}
    it = iter(args)
    for node in gm.graph.nodes:
        if node.op == "placeholder":
            env[node] = next(it)
        elif node.op == "call_function":
            a = torch.fx.node.map_arg(node.args, lambda n: env[n])
            k = torch.fx.node.map_arg(node.kwargs, lambda n: env[n])
            env[node] = node.target(*a, **k)
        if node.op != "output":
            node.meta["val"] = env[node]


@pytest.mark.parametrize("op,args,kwargs", [
    (aten.sum.dim_IntList, ([0, 2, 3], True), {}),
    (aten.sum.dim_IntList, ([0, 2, 3],), {"keepdim": True}),
    (aten.sum.dim_IntList, ([0, 2, 3], False), {}),
    (aten.sum.dim_IntList, ([1, 2, 3], False), {"dtype": torch.float64}),
    (aten.mean.dim, ([0, 2, 3], True), {}),
    (aten.amax.default, ([2, 3], True), {}),
    (aten.amin.default, ([-1, -2],), {}),
    (aten.var.correction, ([0, 2, 3],), {"correction": 0, "keepdim": True}),
    (aten.var.correction, ([0, 2, 3],), {"correction": 1}),
])
def test_rewrite_computes_the_same_values(op, args, kwargs):
    x = torch.randn(4, 3, 5, 6)
    gm = _graph(lambda g, x: g.call_function(op, (x, *args), kwargs))
    _annotate(gm, x)
    expected = gm(x)
    assert merge_reduced_dims(gm) == 1
    reductions = [n for n in gm.graph.nodes if n.target is op]
    assert len(reductions) == 1
    src = reductions[0].args[0]
    assert src.target is aten.view.default and len(src.meta["val"].shape) < 4
    got = gm(x)
    assert got.shape == expected.shape and got.dtype == expected.dtype
    torch.testing.assert_close(got, expected)
    out = next(n for n in gm.graph.nodes if n.op == "output").args[0]
    assert out.meta["val"].shape == expected.shape


def test_reductions_of_one_value_share_its_view():
    """Batch norm's variance and mean of the same input reduce one view node, so the mean
    is read from the variance's Welford state rather than summed beside it."""
    x = torch.randn(4, 3, 5, 6)

    def build(g, x):
        var = g.call_function(aten.var.correction, (x, [0, 2, 3]),
                              {"correction": 0, "keepdim": True})
        mean = g.call_function(aten.mean.dim, (x, [0, 2, 3], True))
        return (var, mean)
    gm = _graph(build)
    _annotate(gm, x)
    expected = gm(x)
    assert merge_reduced_dims(gm) == 2
    views = [n for n in gm.graph.nodes if n.target is aten.view.default and n.args[0].op ==
             "placeholder"]
    assert len(views) == 1 and len(views[0].users) == 2
    for got, want in zip(gm(x), expected):
        torch.testing.assert_close(got, want)


def test_non_contiguous_input_is_left_alone():
    x = torch.randn(4, 3, 6, 5).transpose(2, 3)             # H and W transposed
    gm = _graph(lambda g, x: g.call_function(aten.sum.dim_IntList, (x, [2, 3], True)))
    _annotate(gm, x)
    assert merge_reduced_dims(gm) == 0


def test_batch_norm_training_graphs_reduce_merged_dims(monkeypatch):
    """A conv + batch norm training graph: the statistics and the backward's sums reduce a
    merged H*W dim, and gradients and running statistics still match eager's."""
    seen = []
    real = training.merge_reduced_dims
    monkeypatch.setattr(training, "merge_reduced_dims",
                        lambda gm: seen.append(real(gm)) or seen[-1])
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU())
    ref = copy.deepcopy(model)
    x = torch.randn(4, 3, 10, 12)
    compiled = ember.compile(model, backend="ember")
    out, expected = compiled(x), ref(x)
    weight = torch.linspace(-1, 1, 12)
    (out * weight).mean().backward()
    (expected * weight).mean().backward()
    assert len(seen) == 2 and seen[0] > 0 and seen[1] > 0      # forward and backward
    torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-4)
    for p, q in zip(model.parameters(), ref.parameters()):
        torch.testing.assert_close(p.grad, q.grad, atol=1e-5, rtol=1e-4)
    for b, c in zip(model.buffers(), ref.buffers()):
        torch.testing.assert_close(b, c, atol=1e-5, rtol=1e-4)


def test_single_user_pointwise_producers_are_rebuilt_in_the_merged_shape():
    """``sum(masked_fill(g, x <= 0, 0) * (x - mean), [0, 2, 3])``: the product and the subtraction
    are computed over views of their inputs (``mean``, of shape 1xCx1x1, too), so the
    backend does not write the full-size product to memory before the merged view; the
    ``masked_fill``, which has another user, is viewed as it is."""
    graph = torch.fx.Graph()
    x, g, mean = (graph.placeholder(n) for n in ("x", "g", "mean"))
    le = graph.call_function(aten.le.Scalar, (x, 0))
    where = graph.call_function(aten.masked_fill.Scalar, (g, le, 0.0))
    sub = graph.call_function(aten.sub.Tensor, (x, mean))
    mul = graph.call_function(aten.mul.Tensor, (where, sub))
    total = graph.call_function(aten.sum.dim_IntList, (mul, [0, 2, 3]))
    graph.output((total, where))
    gm = torch.fx.GraphModule(torch.nn.Module(), graph)
    args = (torch.randn(4, 3, 5, 6), torch.randn(4, 3, 5, 6), torch.randn(1, 3, 1, 1))
    _annotate(gm, *args)
    expected = gm(*args)
    assert merge_reduced_dims(gm) == 1
    shapes = {n.target: list(n.meta["val"].shape) for n in gm.graph.nodes
              if n.op == "call_function"}
    assert shapes[aten.mul.Tensor] == shapes[aten.sub.Tensor] == [4, 3, 30]
    assert shapes[aten.masked_fill.Scalar] == [4, 3, 5, 6]   # its other user sees it whole
    assert sum(n.target is aten.mul.Tensor for n in gm.graph.nodes) == 1   # old one erased
    got = gm(*args)
    for a, b in zip(got, expected):
        torch.testing.assert_close(a, b)


def test_a_producer_whose_input_cannot_be_viewed_is_left_whole():
    """An input of the producer with H and W transposed cannot be viewed with them merged:
    the producer keeps its shape and is viewed after it."""
    graph = torch.fx.Graph()
    x, y = graph.placeholder("x"), graph.placeholder("y")
    mul = graph.call_function(aten.mul.Tensor, (x, y))
    graph.output(graph.call_function(aten.sum.dim_IntList, (mul, [2, 3], True)))
    gm = torch.fx.GraphModule(torch.nn.Module(), graph)
    args = (torch.randn(2, 3, 4, 5), torch.randn(2, 3, 5, 4).transpose(2, 3))
    _annotate(gm, *args)
    expected = gm(*args)
    assert merge_reduced_dims(gm) == 1
    muls = [n for n in gm.graph.nodes if n.target is aten.mul.Tensor]
    assert len(muls) == 1 and list(muls[0].meta["val"].shape) == [2, 3, 4, 5]
    views = [n for n in gm.graph.nodes if n.target is aten.view.default]
    assert views[0].args[0] is muls[0]
    torch.testing.assert_close(gm(*args), expected)
