"""Generated kernels are named for what they compute (codegen/kernel_names.py): a profile
reads ``ember_red_layer_norm_0``, not ``kernel0``; repeated layers still share one kernel."""
import re

import pytest
import torch
import torch.nn.functional as F

import ember
from ember.backend import compile as backend_compile, pipeline
from ember.backend.codegen.kernel_names import kernel_name

pytestmark = pytest.mark.usefixtures("fresh_no_grad")


def _block(x, ln_w, ln_b, w1, w2, w3):
    # matmuls (library calls) between the ops: a kernel each for the norm, softmax, GELU
    h = F.layer_norm(x, (x.shape[-1],), ln_w, ln_b) @ w1
    return (F.gelu(torch.softmax(h, dim=-1) @ w2) * 0.5) @ w3


def _model(x, w0, *weights):
    # (both norms read an intermediate, so their kernels take the same kinds of argument)
    return _block(_block(x @ w0, *weights[:5]), *weights[5:])


@pytest.fixture
def artifacts(monkeypatch):
    """Each compiled graph's wrapper and kernels, as ``instantiate`` builds them."""
    seen = []
    instantiate = pipeline.instantiate

    def spy(artifact, target):
        seen.append(artifact)
        return instantiate(artifact, target)
    monkeypatch.setattr(pipeline, "instantiate", spy)
    monkeypatch.setattr(backend_compile, "instantiate", spy)    # (training graphs')
    return seen


def _launches(wrapper: str, name: str) -> int:
    return len(re.findall(rf"^\s*{name}\(", wrapper, re.M))


def test_kernels_are_named_for_their_ops_and_repeated_layers_share_one(cpu_backend,
                                                                        artifacts):
    d = 16
    weights = [torch.randn(d, d)] + [w for _ in range(2) for w in (
        torch.randn(d), torch.randn(d), *torch.randn(3, d, d))]
    x = torch.randn(4, 8, d)
    torch.testing.assert_close(ember.compile(_model)(x, *weights), _model(x, *weights),
                               rtol=1e-4, atol=1e-5)
    (artifact,) = artifacts
    names = [k.name for k in artifact.kernels]
    assert len(set(names)) == len(names)
    assert all(n.isidentifier() and n.startswith("ember_") for n in names), names
    for op in ("layer_norm", "softmax", "gelu"):
        assert any(op in n for n in names), (op, names)
    # the second block computes what the first does on other buffers: its launches are of
    # the first block's kernels, each launched twice
    launches = [_launches(artifact.wrapper, n) for n in names]
    assert launches == [2] * len(names), (names, artifact.wrapper)


def test_a_first_layer_reading_a_graph_input_shares_the_next_layers_kernels(cpu_backend,
                                                                           artifacts):
    """A kernel's buffer parameters come in order of first use, not by name: the first
    block's norm reads ``arg0`` beside its weights (``arg1``, ``arg2``), the second's reads
    ``buf..`` beside ``arg6``, ``arg7``; sorted by name the two orders differed and the
    layers got a kernel each."""
    d = 16
    weights = [w for _ in range(2) for w in (torch.randn(d), torch.randn(d),
                                             *torch.randn(3, d, d))]
    x = torch.randn(4, 8, d)

    def model(x, *weights):
        return _block(_block(x, *weights[:5]), *weights[5:])
    torch.testing.assert_close(ember.compile(model)(x, *weights), model(x, *weights),
                               rtol=1e-4, atol=1e-5)
    (artifact,) = artifacts
    names = [k.name for k in artifact.kernels]
    launches = [_launches(artifact.wrapper, n) for n in names]
    assert launches == [2] * len(names), (names, artifact.wrapper)


def test_training_graphs_name_their_kernels_too(cpu_backend, artifacts):
    def fn(x, w, b):
        return F.gelu(F.layer_norm(x, (16,), w, b))
    x, w, b = (torch.randn(8, 16, requires_grad=True), torch.randn(16, requires_grad=True),
               torch.randn(16, requires_grad=True))
    with torch.enable_grad():
        ember.compile(fn)(x, w, b).sum().backward()
        grads = [t.grad for t in (x, w, b)]
        expected = torch.autograd.grad(fn(x, w, b).sum(), (x, w, b))
    torch.testing.assert_close(grads, list(expected), rtol=1e-4, atol=1e-5)
    forward, backward = ([k.name for k in a.kernels] for a in artifacts)
    assert any("layer_norm" in n for n in forward), forward
    assert any("layer_norm_bwd" in n for n in backward), backward
    assert all(n.isidentifier() for n in forward + backward)


def test_names_leave_views_out_and_stay_short():
    aten = torch.ops.aten
    ops = [aten.view.default, aten.native_layer_norm.default, aten.add.Tensor,
           aten.native_layer_norm.default, aten._softmax.default, aten.t.default,
           aten.gelu.default, aten.mul.Tensor, aten.sub.Tensor]
    assert kernel_name("red", ops, 7) == "ember_red_layer_norm_add_softmax_gelu_7"
    assert kernel_name("poi", [aten.view.default, aten.clone.default], 3) == \
        "ember_poi_view_clone_3"             # all it does: copies
    assert kernel_name("poi", [], 0) == "ember_poi_copy_0"
    long = kernel_name("per", [aten.native_layer_norm_backward.default,
                               aten._native_batch_norm_legit_no_training.default,
                               aten.native_group_norm_backward.default], 12)
    assert long == "ember_per_layer_norm_bwd_batch_norm_group_norm_bwd_12"


def test_profile_kernels_names_each_kernel_in_torch_profiler(cpu_backend):
    """``config.profile_kernels``: each generated kernel's call is a profiler range named
    after it (a C++ kernel is otherwise invisible inside the compiled call); off, none is.
    Changing the option recompiles: the next call runs code generated under it."""
    from torch.profiler import ProfilerActivity, profile

    from ember import config

    def fn(x, w):
        return torch.softmax(x * w, -1).sum(0)

    x, w = torch.randn(6, 40), torch.randn(40)
    compiled = ember.compile(fn)
    for enabled in (True, False):
        with config.patch(profile_kernels=enabled):
            torch.testing.assert_close(compiled(x, w), fn(x, w))
            with profile(activities=[ProfilerActivity.CPU]) as prof:
                torch.testing.assert_close(compiled(x, w), fn(x, w))
        ranges = {e.key for e in prof.key_averages() if e.key.startswith("ember_")}
        assert bool(ranges) == enabled, ranges
        assert not enabled or any("_mul_softmax" in k for k in ranges)
