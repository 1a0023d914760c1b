"""Random ops in training graphs: the forward saves its generator's state, the backward draws
the same numbers again from it (``ember.aot.rng``). Gradients match eager's bit pattern of
kept and dropped elements, and the generator ends where eager's does."""
import copy
import os

import pytest
import torch
import torch.fx
import torch.nn as nn
import torch.nn.functional as F

import ember
from ember.aot import training
from ember.aot.joint import trace_joint
from ember.aot.partition import partition
from ember.aot.rng import RecordRandom, ReplayRandom
from ember.decomp import core_decompositions

DEVICES = [
    pytest.param("cpu", id="cpu"),
    pytest.param("cuda", id="cuda", marks=[pytest.mark.gpu, pytest.mark.skipif(
        not torch.cuda.is_available() or os.environ.get("TRITON_INTERPRET") == "1",
        reason="needs a CUDA GPU")]),
]


def close(a, b, msg=None):
    """float32 tolerance, scaled by the magnitude of sums over a batch."""
    scale = max(1.0, b.abs().max().item())
    torch.testing.assert_close(a, b, atol=1e-5 * scale, rtol=1e-4, msg=msg)


def dropout_mlp(x, w1, b1, w2):
    h = F.dropout(F.linear(x, w1, b1), 0.25).relu()
    return F.dropout(F.linear(h, w2), 0.5)


def noisy(x, w):
    # rand_like's values reach the gradient of x; bernoulli's probabilities depend on w
    return x * torch.rand_like(x) + torch.bernoulli(torch.sigmoid(w)) * w


def _inputs(device, *shapes, grad=(True,)):
    torch.manual_seed(0)
    return [torch.randn(*s, device=device, requires_grad=g)
            for s, g in zip(shapes, list(grad) + [True] * len(shapes))]


def _run(fn, inputs, seed):
    """Outputs, input gradients and the next draw of the generator after the backward."""
    torch.manual_seed(seed)
    out = fn(*inputs)
    out = out if isinstance(out, tuple) else (out,)
    grads = torch.autograd.grad([o.sum() * 1.5 for o in out], inputs)
    after = torch.rand(4, device=inputs[0].device)
    return out, grads, after


def _check(fn, inputs, device, options=None):
    compiled_before = training.stats["compiled"]
    compiled = ember.compile(fn, backend="ember", options=options or {})
    for seed in (3, 4):
        out, grads, after = _run(compiled, inputs, seed)
        want_out, want_grads, want_after = _run(fn, inputs, seed)
        for a, b in zip(out, want_out):
            torch.testing.assert_close(a, b)
        for a, b in zip(grads, want_grads):
            assert torch.equal(a == 0, b == 0), "dropped elements differ from eager's"
            close(a, b)
        assert torch.equal(after, want_after), "the generator did not end where eager's did"
    assert training.stats["compiled"] > compiled_before


@pytest.mark.parametrize("device", DEVICES)
def test_dropout_gradients_replay_eagers_masks(device):
    _check(dropout_mlp, _inputs(device, (64, 96), (128, 96), (128,), (128, 128)), device)


@pytest.mark.parametrize("device", DEVICES)
def test_rand_like_and_bernoulli_of_a_tensor_replay(device):
    _check(noisy, _inputs(device, (64, 96), (64, 96)), device)


def test_replayed_draws_run_eagers_kernels_under_fused_random():
    """fallback_random=False fuses Philox draws, which eager's kernel could not replay: the
    draws the backward needs again stay eager's (here every draw is one of them)."""
    _check(dropout_mlp, _inputs("cpu", (64, 96), (128, 96), (128,), (128, 128)), "cpu",
           {"fallback_random": False})


@pytest.mark.parametrize("cpu_backend", ["cpp", pytest.param("triton", id="triton-interp")])
def test_dropout_module_trains_like_eager(cpu_backend):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(32, 64), nn.Dropout(0.3), nn.GELU(), nn.Linear(64, 32),
                          nn.Dropout(0.1))
    ref = copy.deepcopy(model)
    compiled = ember.compile(model, backend="ember", options={"cpu_backend": cpu_backend})
    x = torch.randn(96, 32)
    for seed in (5, 6):
        for m in (compiled, ref):
            torch.manual_seed(seed)
            m(x).pow(2).mean().backward()
        for (name, p), q in zip(model.named_parameters(), ref.parameters()):
            close(p.grad, q.grad, msg=name)


def _partition(fn, inputs):
    gm = torch.fx.symbolic_trace(fn)
    return partition(trace_joint(gm, inputs, decompositions=core_decompositions()))


def _saved_vals(parts):
    placeholders = [n for n in parts.backward.graph.nodes if n.op == "placeholder"]
    return [n.meta["val"] for n in placeholders[:len(parts.saved)]]


def test_partition_saves_generator_states_not_masks():
    parts = _partition(dropout_mlp, _inputs("cpu", (64, 96), (128, 96), (128,), (128, 128)))
    vals = _saved_vals(parts)
    assert not any(v.dtype == torch.bool for v in vals), "a mask was saved"
    states = [v for v in vals if v.dtype == torch.uint8]
    assert len(states) == 2 and all(v.numel() == torch.get_rng_state().numel() for v in states)
    replays = [n for n in parts.backward.graph.nodes if isinstance(n.target, ReplayRandom)]
    records = [n for n in parts.forward.graph.nodes if isinstance(n.target, RecordRandom)]
    assert len(replays) == 2 and len(records) == 2 and parts.replayed == 2
    # the replays need no forward activations: only their states
    assert all({a.name.startswith("saved_") for a in r.all_input_nodes} == {True}
               for r in replays)
    assert not any(isinstance(n.target, ReplayRandom) for n in parts.forward.graph.nodes)


def test_a_small_mask_is_saved_rather_than_a_larger_state():
    """A CPU generator's state is 5 KiB: a 24-element mask is cheaper to keep, and the
    forward hands over its own draw (it never draws twice)."""
    inputs = _inputs("cpu", (4, 6), (6, 6), (6,), (4, 6))
    parts = _partition(dropout_mlp, inputs)
    assert not any(v.dtype == torch.uint8 for v in _saved_vals(parts))
    forward_calls = [n.target for n in parts.forward.graph.nodes if n.op == "call_function"]
    assert not any(isinstance(t, ReplayRandom) for t in forward_calls)
    _check(dropout_mlp, inputs, "cpu")


def test_random_op_unused_by_the_backward_stays_as_it_was():
    def f(x, w):
        return x * w + torch.rand_like(x)        # the draw is added, not differentiated
    parts = _partition(f, _inputs("cpu", (64, 96), (64, 96), grad=(False,)))
    targets = [n.target for n in parts.forward.graph.nodes]
    assert torch.ops.aten.rand_like.default in targets
    assert not any(isinstance(t, (RecordRandom, ReplayRandom)) for t in targets)


def test_a_draw_nothing_reads_still_advances_the_generator():
    def f(x, w):
        torch.rand_like(x)                      # eager draws it; so must the forward
        return F.dropout(x * w, 0.5)
    _check(f, _inputs("cpu", (64, 96), (64, 96)), "cpu")


def attention(q, k, v, w):
    """A causal self-attention step as GPT-2 and ViT train it (dropout off)."""
    return F.scaled_dot_product_attention(q @ w, k, v, dropout_p=0.0, is_causal=True)


def test_attention_without_dropout_is_saved_not_replayed():
    """Attention ops take ``dropout_p`` and carry the seeded tag, but with no dropout they
    draw nothing: the backward reads the forward's outputs (as eager's does) instead of
    running the whole forward attention again from a generator state."""
    inputs = _inputs("cpu", (2, 4, 32, 16), (2, 4, 32, 16), (2, 4, 32, 16), (16, 16))
    parts = _partition(attention, inputs)
    assert parts.replayed == 0
    for gm in (parts.forward, parts.backward):
        assert not any(isinstance(n.target, (RecordRandom, ReplayRandom))
                       for n in gm.graph.nodes)
    backward_ops = {str(n.target) for n in parts.backward.graph.nodes}
    assert not any("attention" in t and "backward" not in t for t in backward_ops), \
        backward_ops
    _check(attention, inputs, "cpu")


@pytest.mark.parametrize("device", DEVICES)
def test_attention_with_dropout_trains_like_eager(device):
    """With dropout, the attention backward's own kernel regenerates the mask from what the
    forward returns (on the CPU, eager's attention is decomposed: its dropout is replayed):
    the attention is not replayed, and the generator ends where eager's does."""
    def dropped(q, k, v, w):
        return F.scaled_dot_product_attention(q @ w, k, v, dropout_p=0.3)
    inputs = _inputs(device, (2, 4, 32, 16), (2, 4, 32, 16), (2, 4, 32, 16), (16, 16))
    parts = _partition(dropped, inputs)
    assert not any(isinstance(n.target, ReplayRandom) and "attention" in str(n.target.op)
                   for n in parts.backward.graph.nodes)
    _check(dropped, inputs, device)
