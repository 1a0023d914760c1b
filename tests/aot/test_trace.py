"""ATen-level tracing (ember.aot.trace_to_aten) and the aot_eager backend, compared with eager."""
import operator

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils import _pytree as pytree

import ember
from ember.aot import aot_eager, trace_to_aten
from ember.bench.zoo import build_model

aten = torch.ops.aten


def _check_targets(gm, aten_only=True):
    for n in gm.graph.nodes:
        if n.op == "call_function":
            assert n.target is operator.getitem or isinstance(n.target, torch._ops.OpOverload), n
            if aten_only and n.target is not operator.getitem:
                assert n.target.namespace == "aten", n.target
        if n.op not in ("output",):
            assert "val" in n.meta, n


def _targets(gm):
    return {n.target for n in gm.graph.nodes if n.op == "call_function"}


def _assert_same(got, want, atol=1e-5, rtol=1e-5):
    g, gs = pytree.tree_flatten(got)
    w, ws = pytree.tree_flatten(want)
    assert gs == ws, (gs, ws)
    for a, b in zip(g, w):
        if isinstance(b, torch.Tensor):
            assert isinstance(a, torch.Tensor)
            assert a.shape == b.shape and a.dtype == b.dtype, (a.shape, b.shape, a.dtype, b.dtype)
            torch.testing.assert_close(a, b, atol=atol, rtol=rtol)
        else:
            assert a == b


def _clone(xs):
    return [x.clone() if isinstance(x, torch.Tensor) else x for x in xs]


def check(fn, *inputs, atol=1e-5, fresh=None):
    """symbolic_trace fn, trace to ATen on `inputs`, compare on fresh inputs with eager."""
    gm = torch.fx.symbolic_trace(fn)
    ag = trace_to_aten(gm, list(inputs))
    _check_targets(ag.gm)
    new = fresh() if fresh else [torch.randn_like(x) if x.is_floating_point() else x.clone()
                                 for x in inputs]
    eager_in, aten_in = _clone(new), _clone(new)
    want = fn(*eager_in)
    got = ag.gm(*aten_in)
    _assert_same(got, want, atol=atol)
    for a, b in zip(aten_in, eager_in):   # input mutations replayed (decomposed math may
        torch.testing.assert_close(a, b)  # round the last bit differently, e.g. batch norm)
    return ag


# ------------------------------------------------------------------------------- programs

def test_pointwise_chain():
    ag = check(lambda x, y: torch.relu(x * y + 1).sigmoid() - torch.tanh(y) / 2,
               torch.randn(4, 5), torch.randn(5))
    assert ag.input_mutations == []


def test_matmul_linear():
    w, b = torch.randn(6, 5), torch.randn(6)
    check(lambda x, y: (F.linear(x, w, b), x @ y, torch.bmm(x[None], y[None])),
          torch.randn(4, 5), torch.randn(5, 3))


def test_softmax():
    ag = check(lambda x: (torch.softmax(x, -1), F.log_softmax(x, 0)), torch.randn(4, 7))
    assert aten._softmax.default in _targets(ag.gm)


def test_layer_norm_decomposed():
    w, b = torch.randn(8), torch.randn(8)
    ag = check(lambda x: F.layer_norm(x, (8,), w, b), torch.randn(2, 3, 8))
    assert aten.native_layer_norm.default not in _targets(ag.gm)


def test_batch_norm_eval():
    mean, var = torch.randn(3), torch.rand(3) + 0.5
    w, b = torch.randn(3), torch.randn(3)
    ag = check(lambda x: F.batch_norm(x, mean, var, w, b, training=False),
               torch.randn(2, 3, 4, 4))
    names = {t.__name__ for t in _targets(ag.gm) if hasattr(t, "__name__")}
    assert not any("batch_norm" in n for n in names), names


def test_conv2d():
    w, b = torch.randn(4, 3, 3, 3), torch.randn(4)
    check(lambda x: F.relu(F.conv2d(x, w, b, padding=1, stride=2)), torch.randn(2, 3, 8, 8),
          atol=1e-4)


def test_view_chains():
    def f(x):
        a = x.view(2, 12).t().contiguous()
        b = x.permute(2, 0, 1).reshape(4, 6)
        c = x[:, 1:, ::2].expand(3, 2, 2, 2)
        return a, b, c, x.transpose(0, 1).flatten(), x.unsqueeze(0).squeeze(0)[1]
    check(f, torch.randn(2, 3, 4))


def test_cat_stack():
    check(lambda x, y: (torch.cat([x, y, x], 1), torch.stack([x, y]), torch.cat((x,), 0)),
          torch.randn(3, 4), torch.randn(3, 4))


def test_indexing_gather_embedding():
    idx = torch.tensor([2, 0, 1, 2])
    table = torch.randn(10, 4)

    def f(x, i):
        return (x[idx], x[:, 1], torch.gather(x, 1, i), F.embedding(i, table),
                x[idx, 1:3], torch.index_select(x, 0, idx))
    check(f, torch.randn(3, 4), torch.randint(0, 4, (3, 2)))


def test_inplace_on_intermediate():
    def f(x):
        y = x.clone().add_(1)
        y.mul_(y)
        z = torch.zeros(3, 4)
        z.copy_(y).relu_()
        return y, z
    ag = check(f, torch.randn(3, 4))
    assert ag.input_mutations == []
    assert not any(t._schema.is_mutable for t in _targets(ag.gm) if t is not operator.getitem)


def test_inplace_mutation_of_input():
    def f(x, y):
        x.add_(1)
        y.mul_(2).sub_(x)
        return x * 3
    ag = check(f, torch.randn(3, 4), torch.randn(3, 4))
    assert ag.input_mutations == [0, 1]
    copies = [n for n in ag.gm.graph.nodes if n.target is aten.copy_.default]
    assert len(copies) == 2


def test_inplace_index_put_on_input():
    def f(x, i):
        x.index_put_((i,), x.new_full((), 0.5))    # x[i] = 0.5 (fx proxies lack setitem)
        return x.sum()
    ag = check(f, torch.randn(5, 3), torch.tensor([0, 3]))
    assert ag.input_mutations == [0]


def test_returned_mutated_input():
    ag = check(lambda x: x.add_(2), torch.randn(3))
    assert ag.input_mutations == [0]


def test_inplace_dtype_promotion_kept():
    def f(x, y):          # float16 += float32: result cast back to float16
        return x.add_(y)
    check(f, torch.randn(4).half(), torch.randn(4), atol=1e-3)


def test_inplace_on_view_of_input_writes_the_input():
    def f(x):
        x[0].add_(1)
        return x
    ag = check(f, torch.randn(3, 4))
    assert ag.input_mutations == [0]


def test_inplace_through_views_of_an_intermediate():
    def f(x, y):
        z = torch.cat([x, y], dim=1)          # ghostnet: a slice of a cat, added in place
        s = z[:, :4]
        t = z.t()                             # a view taken before the write sees it
        s.add_(y[:, :4])
        s.mul_(2)
        return s, z.sum(0), t + 1, z.relu()
    check(f, torch.randn(3, 5), torch.randn(3, 5))


def test_inplace_on_a_view_then_base_written():
    def f(x):
        z = x * 2
        v = z[1:]
        v.relu_()
        z.add_(1)                             # the owner written after its view
        return v + 0, z
    check(f, torch.randn(4, 3))


def test_inplace_into_aliased_inputs_not_supported():
    gm = torch.fx.symbolic_trace(lambda x, y: y.add_(1))
    base = torch.randn(4)
    with pytest.raises(NotImplementedError):
        trace_to_aten(gm, [base, base[:2]])


def test_batch_norm_training_updates_running_stats():
    def f(x, rm, rv):
        return F.batch_norm(x, rm, rv, training=True, momentum=0.1)
    ag = check(f, torch.randn(4, 3, 2, 2), torch.zeros(3), torch.ones(3),
               fresh=lambda: [torch.randn(4, 3, 2, 2), torch.randn(3), torch.rand(3) + 0.5])
    assert ag.input_mutations == [1, 2]


def test_inplace_relu_module():
    model = nn.Sequential(nn.Linear(4, 4), nn.ReLU(inplace=True), nn.Linear(4, 2)).eval()
    with torch.no_grad():
        ag = trace_to_aten(torch.fx.symbolic_trace(model), [torch.randn(3, 4)])
        _check_targets(ag.gm)
        x = torch.randn(3, 4)
        _assert_same(ag.gm(x), model(x))


def test_tuple_outputs():
    def f(x):
        m, i = x.max(dim=1)
        a, b = torch.split(x, [1, 3], dim=1)
        c = torch.chunk(x, 2, 0)
        return m, i, a + 1, b, c, torch.sort(x, 1).values
    check(f, torch.randn(4, 4))


def test_factories_and_constants():
    def f(x):
        return x + torch.ones(4) + torch.arange(4) + torch.tensor([1.0, 2.0, 3.0, 4.0])
    check(f, torch.randn(3, 4))


def test_training_graph_rejected():
    gm = torch.fx.symbolic_trace(lambda x: x * 2)
    with pytest.raises(NotImplementedError, match="training graphs"):
        trace_to_aten(gm, [torch.randn(3, requires_grad=True)])
    with torch.no_grad():                       # grad off: an inference graph
        trace_to_aten(gm, [torch.randn(3, requires_grad=True)])


def test_small_mlp_module():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 16), nn.SiLU(),
                          nn.LayerNorm(16), nn.Linear(16, 2)).eval()
    x = torch.randn(5, 8)
    with torch.no_grad():
        gm = torch.fx.symbolic_trace(model)
        ag = trace_to_aten(gm, [x])
        _check_targets(ag.gm)
        x2 = torch.randn(5, 8)
        _assert_same(ag.gm(x2), model(x2))
        # parameters are read at call time, not baked in
        model[0].weight.add_(1.0)
        _assert_same(ag.gm(x2), model(x2))


@pytest.mark.parametrize("name", ["transformer_block", "convnet"])
def test_bench_models(name):
    model, inputs = build_model(name)
    with torch.no_grad():
        gm = torch.fx.symbolic_trace(model)
        ag = trace_to_aten(gm, list(inputs))
        _check_targets(ag.gm)
        assert aten.native_layer_norm.default not in _targets(ag.gm)
        fresh = [torch.randn_like(x) for x in inputs]
        _assert_same(ag.gm(*fresh), model(*fresh), atol=1e-4, rtol=1e-4)


# ------------------------------------------------------------- through ember's frontend

def test_frontend_graph_capture():
    captured = []

    def capture(gm, example_inputs):
        captured.append((gm, list(example_inputs)))
        return gm.forward

    model, (x,) = build_model("mlp")
    with torch.no_grad():
        ember.compile(model, backend=capture)(x)
        assert captured
        gm, ex = captured[0]
        ag = trace_to_aten(gm, ex)
        _check_targets(ag.gm)
        fresh = [torch.randn_like(t) if t is ex[0] else t for t in ex]
        _assert_same(ag.gm(*fresh), gm(*fresh), atol=1e-4, rtol=1e-4)


def _recording_aot_eager(made):
    def backend(gm, example_inputs):
        fn = aot_eager(gm, example_inputs)
        made.append(fn)
        return fn
    return backend


@pytest.mark.parametrize("name", ["mlp", "convnet", "transformer_block"])
def test_aot_eager_end_to_end(name):
    model, (x,) = build_model(name)
    made = []
    compiled = ember.compile(model, backend=_recording_aot_eager(made))
    with torch.no_grad():
        want = model(x)
        got = compiled(x)
        x2 = torch.randn_like(x)
        _assert_same(compiled(x2), model(x2), atol=1e-4, rtol=1e-4)
    _assert_same(got, want, atol=1e-4, rtol=1e-4)
    assert made and all(hasattr(fn, "aten_graph") for fn in made)   # no fallback


def test_aot_eager_input_mutation_through_frontend():
    def f(x, y):
        x.mul_(2)
        return x + y

    made = []
    compiled = ember.compile(f, backend=_recording_aot_eager(made))
    a, b = torch.randn(4), torch.randn(4)
    a2 = a.clone()
    with torch.no_grad():
        out = compiled(a, b)
        want = f(a2, b)
    _assert_same(out, want)
    assert torch.equal(a, a2)
    assert made and made[0].aten_graph.input_mutations == [0]


def test_aot_eager_setitem_through_frontend():
    def f(x, i):
        x[i] = 0.5
        return x * 2

    made = []
    compiled = ember.compile(f, backend=_recording_aot_eager(made))
    a, i = torch.randn(5, 3), torch.tensor([0, 3])
    a2 = a.clone()
    with torch.no_grad():
        _assert_same(compiled(a, i), f(a2, i))
    assert torch.equal(a, a2)
    assert made and all(hasattr(fn, "aten_graph") for fn in made)


def test_aot_eager_view_mutation_falls_back_correctly():
    def f(x):
        x[0].add_(1)          # in-place on a view of an input: not supported yet -> fallback
        return x * 2

    compiled = ember.compile(f, backend=aot_eager)
    a = torch.randn(3, 4)
    a2 = a.clone()
    with torch.no_grad():
        _assert_same(compiled(a), f(a2))
    assert torch.equal(a, a2)


def test_aot_eager_training_graph_gets_joint_graph():
    gm = torch.fx.symbolic_trace(lambda x: x * 2)
    x = torch.randn(3, requires_grad=True)
    fn = aot_eager(gm, [x])
    assert fn is not gm.forward and fn.partition is not None
    out = fn(x)
    out.sum().backward()
    assert torch.equal(x.grad, torch.full((3,), 2.0))


def test_aot_eager_falls_back_with_reason(caplog):
    gm = torch.fx.symbolic_trace(lambda x, n: x * n)
    x = torch.randn(3, requires_grad=True)
    with caplog.at_level("WARNING"):
        fn = aot_eager(gm, [x, 3])          # a non-tensor input: no ATen tracing yet
    assert fn == gm.forward
    assert "non-tensor graph input" in caplog.text
    fn(x, 3).sum().backward()
    assert torch.equal(x.grad, torch.full((3,), 3.0))


def test_aot_eager_uses_aten_graph():
    gm = torch.fx.symbolic_trace(lambda x: torch.softmax(x, 0))
    fn = aot_eager(gm, [torch.randn(3)])
    assert hasattr(fn, "aten_graph")
    x = torch.randn(3)
    _assert_same(fn(x), torch.softmax(x, 0))


def test_aot_eager_backend_is_registered_by_name():
    import ember
    def f(x):
        return (x * 2).softmax(-1)
    x = torch.randn(4, 8)
    with torch.no_grad():
        assert torch.allclose(ember.compile(f, backend="aot_eager")(x), f(x))


class _EvalBatchNorm(nn.Module):
    """The CUDA path of eval-mode batch norm (cuDNN): its decomposition writes the running
    statistics back as a float32 round trip of themselves."""
    def forward(self, x, w, b, mean, var):
        return torch.ops.aten.cudnn_batch_norm(x, w, b, mean, var, False, 0.1, 1e-5)[0]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_write_back_of_an_unchanged_input_is_not_a_mutation(dtype):
    """Else the graph counts as mutating its inputs, and CUDA graphs are declined."""
    from ember.decomp import core_decompositions
    args = [t.to(dtype) for t in (torch.randn(2, 4, 3, 3), torch.randn(4), torch.randn(4),
                                  torch.randn(4), torch.rand(4) + 0.5)]
    traced = trace_to_aten(torch.fx.symbolic_trace(_EvalBatchNorm()), args,
                           decompositions=core_decompositions())
    assert traced.input_mutations == []
    assert aten_copy_count(traced.gm) == 0
    out = traced.gm(*args)
    x, w, b, mean, var = args
    torch.testing.assert_close(out[0] if isinstance(out, (tuple, list)) else out,
                               F.batch_norm(x, mean, var, w, b, False, 0.1, 1e-5))


class _LossyWriteBack(nn.Module):
    def forward(self, x):
        x.copy_(x.to(torch.float16).to(torch.float32))    # rounds: a real change
        return x + 1


def test_write_back_through_a_lossy_round_trip_stays_a_mutation():
    x = torch.randn(8) * 1e-3 + 1
    traced = trace_to_aten(torch.fx.symbolic_trace(_LossyWriteBack()), [x.clone()])
    assert traced.input_mutations == [0]
    got = x.clone()
    traced.gm(got)
    want = x.clone()
    _LossyWriteBack()(want)
    assert torch.equal(got, want) and not torch.equal(got, x)


def aten_copy_count(gm) -> int:
    return sum(n.target is torch.ops.aten.copy_.default for n in gm.graph.nodes)


class _BatchNormEval(nn.Module):
    def forward(self, x, mean, var, w=None, b=None):
        return F.batch_norm(x, mean, var, w, b, False, 0.1, 1e-5)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("affine", [True, False])
def test_eval_batch_norm_decomposes_to_a_few_ops_like_eager(dtype, affine):
    """Ember's own eval batch norm: float32 math for half inputs, eager's values."""
    from ember.decomp import core_decompositions
    x = torch.randn(2, 4, 5, 5).to(dtype)
    mean, var = torch.randn(4).to(dtype), (torch.rand(4) + 0.5).to(dtype)
    args = [x, mean, var] + ([torch.randn(4).to(dtype), torch.randn(4).to(dtype)]
                             if affine else [])
    traced = trace_to_aten(torch.fx.symbolic_trace(_BatchNormEval()), args,
                           decompositions=core_decompositions())
    targets = {n.target for n in traced.gm.graph.nodes if n.op == "call_function"}
    assert not any("batch_norm" in str(t) for t in targets), targets
    out = traced.gm(*args)
    out = out[0] if isinstance(out, (tuple, list)) else out
    assert out.dtype == dtype
    torch.testing.assert_close(out, _BatchNormEval()(*args))


def _attention_with_expanded_mask(q, k, v):
    length = q.shape[-2]
    mask = (torch.arange(length)[None, None, :, None] >= 1).expand(q.shape[0], 1, length,
                                                                   length)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)


@pytest.mark.parametrize("backend", ["aot_eager", "ember"])
def test_attention_with_a_stride_zero_boolean_mask_matches_eager(backend):
    """The kernel choice is asked with the mask made dense (as the fused kernels receive
    it); the traced graph still computes eager's values, masked rows included."""
    q, k, v = (torch.randn(2, 3, 16, 8) for _ in range(3))
    ember.reset()
    out = ember.compile(_attention_with_expanded_mask, backend=backend)(q, k, v)
    torch.testing.assert_close(out, _attention_with_expanded_mask(q, k, v), equal_nan=True)


def _resumes_inside_no_grad(x):
    with torch.no_grad():
        y = x * 2
        print("a graph break inside the block")
        y = y + 1
    return y * x


def _enable_grad_inside(x):
    with torch.enable_grad():
        return x * 3


@pytest.mark.parametrize("backend", ["aot_eager", "ember"])
def test_graph_that_turns_grad_on_records_gradients(backend, capsys):
    """A graph entered with grad off that turns it on (it resumes inside no_grad and leaves
    the block; or an enable_grad block under an outer no_grad) is not an inference graph."""
    x = torch.randn(4, requires_grad=True)
    ember.reset()
    out = ember.compile(_resumes_inside_no_grad, backend=backend)(x)
    assert out.requires_grad
    out.sum().backward()
    torch.testing.assert_close(x.grad, (x.detach() * 2 + 1))
    with torch.no_grad():
        want = _enable_grad_inside(x)
        got = ember.compile(_enable_grad_inside, backend=backend)(x)
    assert want.requires_grad and got.requires_grad
    torch.testing.assert_close(got, want)


class _PoolChannelsLast(nn.Module):
    def forward(self, x):
        return F.adaptive_avg_pool2d(x, 1) * 2 + 1


@pytest.mark.parametrize("backend", ["aot_eager", "ember"])
def test_channels_last_global_pool_restride_is_traced(backend):
    """ATen's channels-last adaptive_avg_pool2d restrides its result in place
    (``as_strided_``): traced as a view, so the graph compiles (convnext, ghostnet)."""
    x = torch.randn(2, 8, 4, 4).to(memory_format=torch.channels_last)
    ember.reset()
    out = ember.compile(_PoolChannelsLast(), backend=backend)(x)
    want = _PoolChannelsLast()(x)
    torch.testing.assert_close(out, want)
    assert out.stride() == want.stride()
    traced = trace_to_aten(torch.fx.symbolic_trace(_PoolChannelsLast()), [x])
    assert torch.ops.aten.as_strided.default in _targets(traced.gm)
