"""Ember's backend behind torch.compile's own frontend (the torch_dynamo_backends entry
point): graphs TorchDynamo captures compile to Ember kernels with eager's results."""
import importlib.metadata

import pytest
import torch

from ember.backend import metrics
from ember.backends import ember_backend


def _entry_point_registered() -> bool:
    eps = importlib.metadata.entry_points(group="torch_dynamo_backends")
    return any(ep.name == "ember" for ep in eps)


@pytest.mark.slow
def test_torch_compile_with_ember_backend_matches_eager():
    torch._dynamo.reset()
    metrics.reset()

    def f(x, y):
        return torch.softmax(x * y + 1, -1).sum(0)

    x, y = torch.randn(8, 32), torch.randn(8, 32)
    with torch.no_grad():
        out = torch.compile(f, backend=ember_backend, dynamic=False)(x, y)
    torch.testing.assert_close(out, f(x, y))
    assert metrics.generated_kernel_count >= 1


@pytest.mark.slow
@pytest.mark.skipif(not _entry_point_registered(), reason="package not installed (pip -e .)")
def test_backend_is_found_by_name_through_the_entry_point():
    torch._dynamo.reset()
    with torch.no_grad():
        out = torch.compile(lambda t: (t + 1).relu(), backend="ember", dynamic=False)(
            torch.randn(5))
    assert out.shape == (5,)


def test_symbolic_inputs_are_refused_with_a_clear_error():
    gm = torch.fx.symbolic_trace(lambda x, n: x * n)
    with pytest.raises(NotImplementedError, match="symbolic"):
        ember_backend(gm, [torch.randn(3), _FakeSymInt()])


class _FakeSymInt:
    """Stands for a torch.SymInt graph input (only its type is checked)."""
