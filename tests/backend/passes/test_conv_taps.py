"""Dilated convolutions whose outer taps read only padding run on their live taps
(ember/backend/passes/conv_taps.py), with eager's results and gradients."""
import itertools

import pytest
import torch

import ember
from ember import config
from ember.backend import compile as backend_compile
from ember.backend.passes.conv_taps import live_taps
from ember.testing import same


def test_live_taps_are_the_taps_that_read_the_input():
    """Against a brute-force walk over every output position."""
    for size, kernel, stride, padding, dilation in itertools.product(
            (1, 5, 14), (1, 3, 5), (1, 2), (0, 2, 12, 24), (1, 6, 24)):
        outputs = (size + 2 * padding - dilation * (kernel - 1) - 1) // stride + 1
        if outputs < 1:
            continue
        live = [k for k in range(kernel) if any(
            0 <= o * stride + k * dilation - padding < size for o in range(outputs))]
        if live and live == list(range(live[0], live[-1] + 1)):
            assert live_taps(size, kernel, stride, padding, dilation) == (live[0], live[-1])


class _Aspp(torch.nn.Module):
    """deeplabv3's ASPP branches on a 14x14 map: at dilation 24 and 36 only the centre tap
    reads the input; at 12 all taps do; a (1, 20) dilation narrows one dim only."""

    def __init__(self):
        super().__init__()
        self.branches = torch.nn.ModuleList(
            torch.nn.Conv2d(32, 8, 3, padding=d, dilation=d) for d in (12, 24, 36))
        self.wide = torch.nn.Conv2d(32, 8, 3, padding=(1, 20), dilation=(1, 20), bias=False)

    def forward(self, x):
        return torch.cat([b(x) for b in self.branches] + [self.wide(x)], 1).relu()


def test_dead_taps_are_dropped_with_eagers_result(ember_log):
    model = _Aspp().eval()
    x = torch.randn(2, 32, 14, 14)
    ember.reset()
    ember.logs.set_logs("perf_hints")
    with torch.no_grad():
        assert same(model(x), ember.compile(model)(x), rtol=1e-4, atol=1e-5)
    assert len({m for m in ember_log.messages if "read only padding" in m}) == 3
    assert "it runs on the live 3x1" in ember_log.text
    wrapper = [s for s in backend_compile.generated_sources if "def call(" in s][-1]
    convs = [line for line in wrapper.splitlines() if "aten.convolution" in line]
    assert sum("[0, 0], [1, 1], False" in line for line in convs) == 2, convs   # 1x1 now
    assert sum("[12, 12], [12, 12], False" in line for line in convs) == 1, convs


@pytest.mark.parametrize("layout", ["off", "channels_last"])
def test_dead_taps_dropped_in_training_keep_eagers_gradients(layout):
    torch.manual_seed(0)
    model = _Aspp().train()
    reference = _Aspp().train()
    reference.load_state_dict(model.state_dict())
    x = torch.randn(2, 32, 14, 14)
    ember.reset()
    with config.patch(layout_optimization=layout):
        ember.compile(model)(x).square().sum().backward()
    reference(x).square().sum().backward()
    for (name, p), q in zip(model.named_parameters(), reference.parameters()):
        assert same(q.grad, p.grad, rtol=1e-4, atol=1e-4), name
        assert p.grad.stride() == q.grad.stride(), name
