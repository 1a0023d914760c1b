"""Tangents in the output's layout: a training graph whose output is channels-last traces
its tangent channels-last, and the runtime gives an incoming gradient that layout (a copy
only when it arrives in another). Gradients equal eager's whatever layout they arrive in."""
import pytest
import torch
import torch.nn.functional as F

import ember
from ember.aot.joint import trace_joint


def _bn_relu(x, w, b):
    return F.relu(F.batch_norm(x, None, None, w, b, training=True))


def _inputs(channels_last: bool):
    torch.manual_seed(0)
    x = torch.randn(4, 8, 6, 6)
    if channels_last:
        x = x.to(memory_format=torch.channels_last)
    return [x.requires_grad_(), torch.randn(8, requires_grad=True),
            torch.randn(8, requires_grad=True)]


@pytest.mark.parametrize("channels_last", [False, True], ids=["nchw", "channels-last"])
def test_the_tangent_takes_the_outputs_layout(channels_last):
    joint = trace_joint(torch.fx.symbolic_trace(_bn_relu), _inputs(channels_last))
    (tangent,) = [n.meta["val"] for n in joint.tangent_nodes]
    assert tangent.is_contiguous(memory_format=torch.channels_last) == channels_last
    assert tangent.is_contiguous() != channels_last


def test_a_transposed_output_keeps_a_contiguous_tangent():
    """Only channels-last: a transposed view's gradient usually arrives contiguous."""
    def f(x, w):
        return (x * w).transpose(1, 2)
    inputs = [torch.randn(4, 5, 6, requires_grad=True), torch.randn(6, requires_grad=True)]
    joint = trace_joint(torch.fx.symbolic_trace(f), inputs)
    (tangent,) = [n.meta["val"] for n in joint.tangent_nodes]
    assert tangent.is_contiguous()


GRADS = {   # how the gradient of the (channels-last) output arrives
    "channels-last": lambda y: torch.randn_like(y),
    "contiguous": lambda y: torch.randn(y.shape),
    "expanded": lambda y: torch.full((1, 1, 1, 1), 0.5).expand(y.shape),
    "sliced": lambda y: torch.randn(*y.shape[:-1], 2 * y.shape[-1])[..., ::2],
}


@pytest.mark.parametrize("grad", list(GRADS))
def test_gradients_equal_eagers_whatever_layout_the_gradient_arrives_in(grad):
    inputs = _inputs(channels_last=True)
    ember.reset()
    compiled = ember.compile(_bn_relu)
    y = compiled(*inputs)
    assert y.is_contiguous(memory_format=torch.channels_last)
    torch.manual_seed(1)
    g = GRADS[grad](y)
    got = torch.autograd.grad(y, inputs, g)
    want = torch.autograd.grad(_bn_relu(*inputs), inputs, g)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, atol=1e-4, rtol=1e-4)
    if grad == "channels-last":     # eager's layout for the input's gradient too
        assert got[0].is_contiguous(memory_format=torch.channels_last)
