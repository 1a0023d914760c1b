"""Real models through the whole pipeline on CPU (frontend, aot, IR, fused kernels):
outputs match eager within float tolerance, on both CPU targets (the ``cpu_backend``
fixture: C++ kernels, and Triton kernels under Triton's interpreter)."""
import pytest
import torch

import ember
from ember import config
from ember.backend import compile_stats
from ember.bench import zoo
from ember.testing import same


@pytest.mark.parametrize("name", ["mlp", "convnet", "transformer_block", "resnet18", "bert"])
def test_model_matches_eager_with_generated_kernels(name, cpu_backend):
    if not zoo.is_available(name):
        pytest.skip(f"{name} needs a package that is not installed")
    model, inputs = zoo.build_model(name, "cpu")
    ember.reset()
    with torch.no_grad(), config.patch(suppress_errors=False):
        actual = ember.compile(model, backend="ember")(*inputs)
        expected = model(*inputs)
    if hasattr(expected, "last_hidden_state"):
        expected, actual = expected.last_hidden_state, actual.last_hidden_state
    assert same(expected, actual, rtol=1e-4, atol=1e-5)
    assert compile_stats.generated_kernel_count >= 1
