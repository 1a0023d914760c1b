"""Real models compile into one graph and compute what eager computes.

The built-in zoo models plus timm's resnet18 and vit_tiny and a small HF BERT, all with random
weights (nothing is downloaded), in eval mode under no_grad, on their benchmark inputs. Each is
compiled with a counting backend: the outputs must match eager and the whole forward must be
captured as a single graph (no graph breaks). Models whose package is missing are skipped.
"""
import pytest
import torch

import ember
from ember.bench import compat, zoo
from ember.testing import CompileCounter, same

# name -> the optional package's importer (None: only torch is needed)
REQUIRES = {
    "mlp": None,
    "convnet": None,
    "transformer_block": None,
    "resnet18": compat.import_timm,
    "vit_tiny": compat.import_timm,
    "bert": compat.import_transformers,
}


def comparable(output):
    """HF models return a ModelOutput; its last_hidden_state is the tensor to compare."""
    return getattr(output, "last_hidden_state", output)


@pytest.mark.parametrize("name", list(REQUIRES))
def test_model_compiles_to_one_graph_and_matches_eager(name):
    importer = REQUIRES[name]
    if importer is not None and importer() is None:
        pytest.skip(f"{name} needs {zoo.MODELS[name].requires}, which is not installed")
    ember.reset()
    model, inputs = zoo.build_model(name, "cpu")
    counter = CompileCounter()
    compiled = ember.compile(model, backend=counter)
    with torch.no_grad():
        expected = model(*inputs)
        actual = compiled(*inputs)
    assert same(comparable(actual), comparable(expected), rtol=1e-4, atol=1e-5), \
        f"{name}: compiled output differs from eager"
    assert counter.frame_count == 1, \
        f"{name}: expected the forward captured in 1 graph, the backend got {counter.frame_count}"
