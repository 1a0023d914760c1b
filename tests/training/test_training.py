"""Training through ember.compile: compiled forward and backward graphs against eager.

Each test trains a module and a deep copy of it side by side, one compiled with the "ember"
backend, one eager, and compares the outputs, the .grad of every parameter and the buffers
(batch norm's running statistics) after each step; ``ember.aot.training.stats`` shows the
training graph was compiled rather than run as captured.
"""
import copy

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import ember
from ember.aot import training
from ember.backend import compile_stats
from ember.bench.zoo import build_model

ATOL, RTOL = 1e-5, 1e-4


def _first(out):
    out = getattr(out, "last_hidden_state", out)
    return out[0] if isinstance(out, (tuple, list)) else out


def _loss(out):
    out = _first(out)
    return (out.float() * torch.linspace(-1, 1, out.shape[-1])).mean()   # not a plain mean


def close(a, b, atol=ATOL, rtol=RTOL, msg=""):
    """Within tolerance, the absolute one scaled by the tensor's magnitude (gradients summed
    over a batch reach the thousands; their float32 rounding grows with them)."""
    scale = max(1.0, b.detach().abs().max().item()) if b.numel() else 1.0
    torch.testing.assert_close(a, b, atol=atol * scale, rtol=rtol, msg=msg or None)


def assert_grads_match(model, ref, atol=ATOL, rtol=RTOL):
    for (name, p), q in zip(model.named_parameters(), ref.parameters()):
        assert (p.grad is None) == (q.grad is None), name
        if q.grad is not None:
            close(p.grad, q.grad, atol, rtol, msg=name)
    for (name, b), c in zip(model.named_buffers(), ref.buffers()):
        if b.is_floating_point():
            close(b, c, atol, rtol, msg=name)
        else:
            assert torch.equal(b, c), name


def train_side_by_side(model, make_inputs, steps=1, options=None, lr=None, atol=ATOL,
                       rtol=RTOL, seed=None):
    """Steps of forward + backward (+ SGD when ``lr``) on ``model`` compiled and a copy of it
    eager; compared after each step."""
    ref = copy.deepcopy(model)
    compiled_before = training.stats["compiled"]
    compiled = ember.compile(model, backend="ember", options=options or {})
    opts = [torch.optim.SGD(m.parameters(), lr=lr, momentum=0.9) for m in (model, ref)] \
        if lr else []
    for step in range(steps):
        inputs = make_inputs()
        if seed is not None:
            torch.manual_seed(seed + step)
        out = compiled(*inputs)
        _loss(out).backward()
        if seed is not None:
            torch.manual_seed(seed + step)
        want = ref(*inputs)
        _loss(want).backward()
        close(_first(out), _first(want), atol, rtol)
        assert_grads_match(model, ref, atol, rtol)
        for opt in opts:
            opt.step()
            opt.zero_grad()
        for p, q in zip(model.parameters(), ref.parameters()):
            close(p, q, atol, rtol)
    assert training.stats["compiled"] > compiled_before, "the training graph was not compiled"
    return compiled


@pytest.mark.parametrize("cpu_backend", ["cpp", pytest.param("triton", id="triton-interp")])
def test_mlp(cpu_backend):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 16), nn.GELU(),
                          nn.LayerNorm(16), nn.Linear(16, 4))
    train_side_by_side(model, lambda: (torch.randn(4, 8),), steps=2,
                       options={"cpu_backend": cpu_backend})


def test_convnet_with_batch_norm_updates_running_stats():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(inplace=True),
                          nn.MaxPool2d(2), nn.Conv2d(8, 8, 3), nn.BatchNorm2d(8), nn.SiLU(),
                          nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8, 5))
    train_side_by_side(model, lambda: (torch.randn(4, 3, 10, 10),), steps=2)


@pytest.mark.parametrize("mode", ["eval", "dropout_seeded"])
def test_transformer_block(mode):
    torch.manual_seed(0)
    layer = nn.TransformerEncoderLayer(32, 4, 64, dropout=0.1, batch_first=True)
    if mode == "eval":
        layer.eval()                  # dropout off, the fast path off under grad
    train_side_by_side(layer, lambda: (torch.randn(2, 6, 32),), steps=2,
                       seed=123 if mode == "dropout_seeded" else None)


def test_builtin_transformer_block_training_loop():
    model, (x,) = build_model("transformer_block", mode="train")
    train_side_by_side(model, lambda: (torch.randn_like(x),), steps=3, lr=0.05)


def test_training_loop_sees_optimizer_steps():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 12), nn.Tanh(), nn.Linear(12, 3))
    train_side_by_side(model, lambda: (torch.randn(5, 6),), steps=4, lr=0.1)


def test_gradients_accumulate_like_eager():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 4), nn.Sigmoid())
    ref = copy.deepcopy(model)
    compiled = ember.compile(model, backend="ember")
    x = torch.randn(3, 4)
    for _ in range(2):                        # no zero_grad: .grad sums both backwards
        _loss(compiled(x)).backward()
        _loss(ref(x)).backward()
    assert_grads_match(model, ref)


def test_retained_graph_backs_up_twice_like_eager():
    """The backward frees its saved tensors as it goes (``call_boxed``) unless the graph is
    retained: a second backward of a retained graph sums the same gradients again."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 4), nn.Sigmoid())
    ref = copy.deepcopy(model)
    compiled = ember.compile(model, backend="ember")
    x = torch.randn(3, 4)
    mine, theirs = _loss(compiled(x)), _loss(ref(x))
    for retain in (True, False):
        mine.backward(retain_graph=retain)
        theirs.backward(retain_graph=retain)
        assert_grads_match(model, ref)
    with pytest.raises(RuntimeError, match="backward through the graph a second time"):
        mine.backward()


def test_no_grad_inference_of_a_train_mode_module():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.BatchNorm1d(8), nn.ReLU(), nn.Linear(8, 2))
    ref = copy.deepcopy(model)
    compiled = ember.compile(model, backend="ember")
    x = torch.randn(6, 4)
    _loss(compiled(x)).backward()
    _loss(ref(x)).backward()
    with torch.no_grad():
        out, want = compiled(x), ref(x)
    assert not out.requires_grad
    torch.testing.assert_close(out, want)
    assert_grads_match(model, ref)            # running stats updated by both calls


def test_double_backward_raises_a_clear_error():
    model = nn.Sequential(nn.Linear(3, 3), nn.Tanh())
    compiled = ember.compile(model, backend="ember")
    x = torch.randn(2, 3, requires_grad=True)
    out = compiled(x).sum()
    (g,) = torch.autograd.grad(out, x, create_graph=False)
    torch.testing.assert_close(g, torch.autograd.grad(model(x).sum(), x)[0])
    with pytest.raises(RuntimeError, match="double backward"):
        torch.autograd.grad(compiled(x).sum(), x, create_graph=True)


def test_mixed_requires_grad_and_input_grads():
    def f(x, y, w):
        return torch.tanh(x @ w) * y, (y * 2).sum()
    x = torch.randn(3, 4, requires_grad=True)
    y = torch.randn(3, 5)                     # no grad
    w = torch.randn(4, 5, requires_grad=True)
    compiled = ember.compile(f, backend="ember")
    a, b = compiled(x, y, w)
    assert not b.requires_grad
    a.sum().backward()
    gx, gw = x.grad.clone(), w.grad.clone()
    x.grad = w.grad = None
    f(x, y, w)[0].sum().backward()
    torch.testing.assert_close(gx, x.grad)
    torch.testing.assert_close(gw, w.grad)


def test_output_aliasing_an_input_and_unused_outputs():
    def f(x, w):
        h = x * w
        return x, h.view(-1), h.relu()        # an input back, a view, an output left unused
    x = torch.randn(2, 3, requires_grad=True)
    w = torch.randn(3, requires_grad=True)
    compiled = ember.compile(f, backend="ember")
    xo, hv, _ = compiled(x, w)
    assert xo is not None and torch.equal(xo, x)
    (xo.sum() * 3 + (hv * hv).sum()).backward()
    gx, gw = x.grad.clone(), w.grad.clone()
    x.grad = w.grad = None
    xo, hv, _ = f(x, w)
    (xo.sum() * 3 + (hv * hv).sum()).backward()
    torch.testing.assert_close(gx, x.grad)
    torch.testing.assert_close(gw, w.grad)


def test_inplace_through_a_view_in_a_training_graph():
    class Ghost(nn.Module):           # ghostnet's pattern: a slice of a cat, added in place
        def __init__(self):
            super().__init__()
            self.a, self.b = nn.Conv2d(4, 3, 1), nn.Conv2d(3, 3, 1)

        def forward(self, x):
            y = self.a(x)
            out = torch.cat([y, self.b(y)], dim=1)[:, :4]
            out += x
            return out
    torch.manual_seed(0)
    train_side_by_side(Ghost(), lambda: (torch.randn(2, 4, 5, 5),), steps=2)


def test_partition_saves_less_than_eager_on_pointwise_chains(caplog):
    """Recomputing cheap pointwise chains: the forward saves the matmul outputs only."""
    from ember.aot.joint import trace_joint
    from ember.aot.partition import partition
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 64), nn.GELU(), nn.Linear(64, 64), nn.SiLU(),
                          nn.Linear(64, 16))

    def f(x, w1, b1, w2, b2, w3, b3):
        return F.linear(F.silu(F.linear(F.gelu(F.linear(x, w1, b1)), w2, b2)), w3, b3)
    gm = torch.fx.symbolic_trace(f)
    inputs = [torch.randn(32, 16), *model.parameters()]
    joint = trace_joint(gm, inputs)
    parts = partition(joint)
    saved_ops = {n.target for n in parts.forward.graph.nodes if n.op == "call_function"
                 and n.name in {s.split("_", 2)[2] for s in parts.saved}}
    assert saved_ops <= {torch.ops.aten.addmm.default, torch.ops.aten.mm.default}, saved_ops
    assert parts.saved_bytes < joint.saved_bytes_eager
    # the joint graph computes what eager computes
    tangent = torch.randn(32, 16)
    with torch.no_grad():
        outs = joint.gm(*inputs, tangent)
        fw = parts.forward(*inputs)
        grads = parts.backward(*fw[joint.num_fw_outputs:], tangent)
    for a, b in zip(grads, outs[joint.num_fw_outputs:]):
        torch.testing.assert_close(a, b)
    want = torch.autograd.grad((model(inputs[0]) * tangent).sum(), list(model.parameters()))
    for a, b in zip(grads, want):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("saves", [False, True], ids=["recomputes", "saves"])
def test_library_inputs_are_saved_where_the_policy_says(saves, monkeypatch):
    """``SAVES_LIBRARY_INPUTS``: a ReLU's output, read by the next convolution and by that
    convolution's backward, is saved rather than recomputed; without it the forward saves
    only the convolutions' outputs (the ReLU is recomputed). Gradients equal either way."""
    from ember.aot import partition as part
    from ember.aot.joint import trace_joint
    monkeypatch.setattr(part, "SAVES_LIBRARY_INPUTS", saves)
    torch.manual_seed(0)

    def f(x, w1, w2, w3):
        y = F.conv2d(x, w1, padding=1).relu()
        return F.linear(F.conv2d(y, w2, padding=1).relu().flatten(1), w3)
    inputs = [torch.randn(2, 3, 6, 6), torch.randn(4, 3, 3, 3, requires_grad=True),
              torch.randn(5, 4, 3, 3, requires_grad=True),
              torch.randn(7, 180, requires_grad=True)]
    joint = trace_joint(torch.fx.symbolic_trace(f), inputs)
    parts = part.partition(joint)
    saved_ops = {n.target for n in parts.forward.graph.nodes if n.op == "call_function"
                 and n.name in {s.split("_", 2)[2] for s in parts.saved}}
    assert (torch.ops.aten.relu.default in saved_ops) == saves, saved_ops
    tangent = torch.randn(2, 7)
    with torch.no_grad():
        outs = joint.gm(*inputs, tangent)
        grads = parts.backward(*parts.forward(*inputs)[joint.num_fw_outputs:], tangent)
    want = torch.autograd.grad((f(*inputs) * tangent).sum(), inputs[1:])
    for a, b, c in zip(grads, outs[joint.num_fw_outputs:], want):
        torch.testing.assert_close(a, b)
        torch.testing.assert_close(a, c, atol=1e-5, rtol=1e-4)


def _residual_stack(layers):
    """A transformer's residual stream without the attention: ``h = h + linear(norm(h))``
    per layer, the joint graph and its partition."""
    from ember.aot.joint import trace_joint
    from ember.aot.partition import partition
    torch.manual_seed(0)

    def f(x, w):
        h = x * 2
        for k in range(layers):
            h = h + torch.mm(F.layer_norm(h, (32,)), w[k])
        return h
    inputs = [torch.randn(64, 32), torch.randn(layers, 32, 32, requires_grad=True)]
    joint = trace_joint(torch.fx.symbolic_trace(f), inputs)
    return f, inputs, joint, partition(joint)


def test_a_residual_stream_is_saved_not_rebuilt_from_every_layers_delta():
    """``h[k+1] = h[k] + delta[k]``: recomputing ``h[k]`` from the input and every delta
    would read k + 1 tensors (and rebuild the whole stream when the backward starts); the
    forward keeps every other ``h`` instead, and no recomputation reads more than two of
    them."""
    from ember.aot.partition import MAX_RECOMPUTE_READS
    f, inputs, joint, parts = _residual_stack(6)
    saved_adds = [n for n in parts.forward.graph.nodes if n.op == "call_function"
                  and n.target is torch.ops.aten.add.Tensor
                  and n.name in {s.split("_", 2)[2] for s in parts.saved}]
    assert len(saved_adds) >= 2, parts.saved
    # the longest chain of additions the backward recomputes from saved values (the
    # gradients' own additions, which depend on the tangent, are not recomputations)
    depth, graded = {}, set()
    for n in parts.backward.graph.nodes:
        if n.name.startswith("tangents") or any(a in graded for a in n.all_input_nodes):
            graded.add(n)
            continue
        ins = [depth.get(a, 0) for a in n.all_input_nodes]
        depth[n] = max(ins, default=0) + (n.target is torch.ops.aten.add.Tensor
                                         and n.meta.get("val") is not None
                                         and n.meta["val"].shape == (64, 32))
    assert max(depth.values()) <= MAX_RECOMPUTE_READS + 1
    tangent = torch.randn(64, 32)
    with torch.no_grad():
        outs = joint.gm(*inputs, tangent)
        grads = parts.backward(*parts.forward(*inputs)[joint.num_fw_outputs:], tangent)
    for a, b in zip(grads, outs[joint.num_fw_outputs:]):
        torch.testing.assert_close(a, b)


def test_the_backward_recomputes_each_value_just_before_its_first_use():
    """The last layer's gradient needs no value of the first layer: its recomputations
    (the first layer norm's output, for its weight's gradient) come after the last layer's
    gradient matmuls, not all at the start of the backward."""
    f, inputs, joint, parts = _residual_stack(4)
    nodes = list(parts.backward.graph.nodes)
    forward_names = {n.name for n in parts.forward.graph.nodes}
    mms = [i for i, n in enumerate(nodes) if n.target is torch.ops.aten.mm.default]
    recomputed = [i for i, n in enumerate(nodes) if n.name in forward_names
                  and n.target is torch.ops.aten.sub.Tensor]     # each layer's x - mean
    assert len(recomputed) == 4 and mms, [n.name for n in nodes]
    assert sorted(recomputed)[1] > min(mms), [n.name for n in nodes]


def test_aot_logs_the_partition(ember_log, tmp_path, monkeypatch):
    from ember import config, logs
    monkeypatch.setattr(config, "debug_dir", str(tmp_path))
    model = nn.Sequential(nn.Linear(4, 4), nn.ReLU())
    logs.set_logs("aot")
    ember.compile(model, backend="ember")(torch.randn(2, 4)).sum().backward()
    assert "partition:" in ember_log.text and "eager's autograd saves" in ember_log.text
    assert "backward graph:" in ember_log.text
    (folder,) = [p for p in tmp_path.iterdir() if "aot" in p.name]
    assert {"forward.py", "backward.py", "saved.txt"} <= {p.name for p in folder.iterdir()}


def test_autocast_bfloat16_inside_the_compiled_frame():
    """AMP on the CPU: autocast's casts are traced into the forward; the backward runs
    outside autocast, as eager's does; parameters' grads stay float32."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.LayerNorm(32), nn.Linear(32, 8))
    ref = copy.deepcopy(model)

    def step(mod, x):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            return mod(x)
    before = training.stats["compiled"]
    compiled_step = ember.compile(step, backend="ember")
    x = torch.randn(4, 16)
    out, want = compiled_step(model, x), step(ref, x)
    assert out.dtype == want.dtype == torch.bfloat16
    close(out.float(), want.float(), atol=1e-2, rtol=1e-2)
    _loss(out).backward()
    _loss(want).backward()
    assert training.stats["compiled"] > before
    for p in model.parameters():
        assert p.grad.dtype == torch.float32
    assert_grads_match(model, ref, atol=1e-2, rtol=1e-2)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_norms_without_running_statistics_are_generated(dtype):
    """instance_norm and batch norm without running statistics
    (``_native_batch_norm_legit.no_stats``) decompose into reductions and pointwise ops:
    generated kernels forward and backward, no ATen batch norm (2.4-4.4x slower on a CPU)."""
    torch.manual_seed(0)
    x = (torch.randn(4, 6, 9, 11) * 3 + 1).to(dtype)
    w, b = torch.randn(6, dtype=dtype), torch.randn(6, dtype=dtype)

    def fn(t, w, b):
        return (F.instance_norm(t, weight=w, bias=b).sin()
                + F.batch_norm(t, None, None, w, b, training=True).relu())
    ember.reset()
    args = [t.clone().requires_grad_() for t in (x, w, b)]
    ref = [t.clone().requires_grad_() for t in (x, w, b)]
    out, expected = ember.compile(fn)(*args), fn(*ref)
    grad = torch.randn_like(out)
    out.backward(grad)
    expected.backward(grad)
    tol = dict(rtol=1e-4, atol=1e-4) if dtype == torch.float32 else dict(rtol=2e-2, atol=5e-2)
    torch.testing.assert_close(out, expected, **tol)
    for a, r in zip(args, ref):
        scale = r.grad.float().abs().max().item()
        torch.testing.assert_close(a.grad.float(), r.grad.float(), rtol=tol["rtol"],
                                   atol=tol["atol"] * max(1.0, scale))
    assert not [op for op in compile_stats.fallback_ops if "batch_norm" in op]
    assert compile_stats.generated_kernel_count >= 2


def test_outputs_rebuilt_as_the_graph_returns_them():
    """The runtime rebuilds a training graph's outputs from the flat list: a flat tuple or
    list directly (the graphs the frontend captures), any other structure (nested, a
    namedtuple, a dict) through pytree, each as ``tree_unflatten`` would."""
    from collections import namedtuple
    from torch.utils import _pytree as pytree
    pair = namedtuple("pair", "a b")
    for value in [(1, 2, 3), [1, 2], (1,), [], (1, (2, 3)), pair(1, 2), {"a": 1, "b": [2]},
                  [(1, 2)]]:
        flat, spec = pytree.tree_flatten(value)
        rebuilt = training._rebuilder(spec)(tuple(flat))
        assert type(rebuilt) is type(value) and rebuilt == value


def test_outputs_rebuilt_through_a_class_that_rejects_other_leaves():
    """A registered pytree class whose unflatten checks its leaves (as a library's output
    class may) is rebuilt through pytree, with the real values."""
    from torch.utils import _pytree as pytree

    class Checked:
        def __init__(self, a, b):
            if not isinstance(a, torch.Tensor):
                raise TypeError("tensors only")
            self.a, self.b = a, b
    pytree.register_pytree_node(Checked, lambda c: ([c.a, c.b], None),
                                lambda leaves, _: Checked(*leaves))
    try:
        value = (Checked(torch.ones(2), torch.zeros(2)), torch.ones(1))
        flat, spec = pytree.tree_flatten(value)
        rebuilt = training._rebuilder(spec)(tuple(flat))
        assert isinstance(rebuilt, tuple) and isinstance(rebuilt[0], Checked)
        assert rebuilt[0].a is flat[0] and rebuilt[1] is flat[2]
    finally:
        pytree._deregister_pytree_node(Checked)
