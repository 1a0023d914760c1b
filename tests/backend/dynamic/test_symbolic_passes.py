"""The static pipeline's torch-level passes on graphs with symbolic sizes
(ember/backend/passes/symbolic_graph.py): a conv net with a dynamic batch gets its static
compile's layout, dead convolution taps are dropped, constant attention masks over a
dynamic sequence length become ``is_causal``; results equal eager's at every size, one
symbolic compile."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import ember
from ember import logs
from ember.backend import compile_stats, pipeline

pytestmark = pytest.mark.usefixtures("fresh_no_grad", "cpu_backend")
BATCHES = (4, 7, 2)


def _conv_net():
    return torch.nn.Sequential(
        torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.ReLU(),
        torch.nn.Conv2d(8, 8, 3, padding=1), torch.nn.AdaptiveAvgPool2d(1),
        torch.nn.Flatten(), torch.nn.Linear(8, 4)).eval()


def _wrapper() -> str:
    return next(s for s in reversed(pipeline.generated_sources) if "def call(" in s)


def _check_with_a_dynamic_batch(module, shape):
    """``module`` compiled once with its input's batch marked dynamic: eager's results at
    each of ``BATCHES``, one symbolic compile."""
    compiled = ember.compile(module, dynamic=False)
    for n in BATCHES:
        x = torch.randn(n, *shape)
        ember.mark_dynamic(x, 0)
        torch.testing.assert_close(compiled(x), module(x), rtol=1e-4, atol=1e-4)
    assert (compile_stats.symbolic_compiles, compile_stats.size_specializations) == (1, 0)


# the network's input in channels-last, allocated by the wrapper: (N, 3, 16, 16) strides
CHANNELS_LAST_INPUT = "(768, 1, 48, 3)"


def test_conv_net_with_a_dynamic_batch_keeps_the_static_layout(cpu_backend):
    net = _conv_net()
    x = torch.randn(BATCHES[0], 3, 16, 16)
    ember.compile(net, dynamic=False)(x)
    static = _wrapper()
    ember.reset()
    compile_stats.reset()
    _check_with_a_dynamic_batch(net, (3, 16, 16))
    symbolic = _wrapper()
    assert "s0" in symbolic
    assert (CHANNELS_LAST_INPUT in symbolic) == (CHANNELS_LAST_INPUT in static)
    if cpu_backend == "cpp":      # (oneDNN's convolutions: CpuPolicy converts this net)
        assert CHANNELS_LAST_INPUT in symbolic


def test_dead_convolution_taps_are_dropped_with_a_dynamic_batch(ember_log):
    conv = torch.nn.Conv2d(4, 4, 3, padding=24, dilation=24).eval()
    logs.set_logs("perf_hints")
    _check_with_a_dynamic_batch(conv, (4, 10, 10))
    assert "read only padding" in ember_log.text


def _causal(q, k, v):
    s = q.size(-2)
    mask = torch.ones(s, s, dtype=torch.bool).tril()
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)


def _causal_from_positions(q, k, v):
    i = torch.arange(q.size(-2))
    mask = (i[None, :] <= i[:, None])[None, None].expand(q.size(0), 1, -1, -1)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)


def _first_ten_keys(q, k, v):
    # masks nothing up to 10 keys, something past them: not dropped
    mask = torch.arange(k.size(-2))[None, :] < 10
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)


@pytest.mark.parametrize("frontend", ["ember", "torch"])
@pytest.mark.parametrize("fn, rewritten", [(_causal, True), (_causal_from_positions, True),
                                           (_first_ten_keys, False)],
                         ids=lambda v: getattr(v, "__name__", str(v)))
def test_constant_masks_over_a_dynamic_sequence_length(fn, rewritten, frontend, ember_log):
    logs.set_logs("perf_hints")
    torch._dynamo.reset()
    compiled = ember.compile(fn, dynamic=True) if frontend == "ember" else \
        torch.compile(fn, backend="ember", dynamic=True)
    for n in (6, 13, 9):
        q, k, v = (torch.randn(2, 2, n, 4) for _ in range(3))
        torch.testing.assert_close(compiled(q, k, v), fn(q, k, v), rtol=1e-4, atol=1e-4)
    torch._dynamo.reset()
    assert (compile_stats.symbolic_compiles, compile_stats.size_specializations) == (1, 0)
    assert ("its constant mask is causal" in ember_log.text) == rewritten
