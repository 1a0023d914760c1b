"""``compile_graph(gm, inputs)`` returns what ``gm`` returns, shaped as ``gm`` shapes it: a
single tensor, a list, nested containers, a namedtuple (the frontends hand over flat
tuples; a graph from elsewhere need not be one). Both CPU targets."""
import collections

import pytest
import torch
import torch.fx

from ember import config
from ember.backend.compile import compile_graph

pytestmark = pytest.mark.usefixtures("cpu_backend")

Pair = collections.namedtuple("Pair", "first second")


class Single(torch.nn.Module):
    def forward(self, x):
        return x.sin() * 2


class Nested(torch.nn.Module):
    def forward(self, x):
        return ([x.sin(), x.cos() + 1], {"double": x * 2, "none": None}, x.sum())


def named() -> torch.fx.GraphModule:
    """A graph returning ``Pair(x.exp(), (x.neg(), x.abs()))`` (symbolic_trace would trace
    the namedtuple's construction as a call)."""
    graph = torch.fx.Graph()
    x = graph.placeholder("x")
    exp, neg, abs_ = (graph.call_function(f, (x,)) for f in (torch.exp, torch.neg, torch.abs))
    graph.output(Pair(exp, (neg, abs_)))
    return torch.fx.GraphModule(torch.nn.Module(), graph)


def _same_structure(got, want):
    assert type(got) is type(want), (type(got), type(want))
    if isinstance(want, torch.Tensor):
        torch.testing.assert_close(got, want)
    elif isinstance(want, (list, tuple)):
        assert len(got) == len(want)
        for g, w in zip(got, want):
            _same_structure(g, w)
    elif isinstance(want, dict):
        assert list(got) == list(want)
        for k in want:
            _same_structure(got[k], want[k])
    else:
        assert got == want


@pytest.mark.parametrize("make", [lambda: torch.fx.symbolic_trace(Single()),
                                  lambda: torch.fx.symbolic_trace(Nested()), named],
                         ids=["single", "nested", "namedtuple"])
def test_compiled_graph_returns_what_the_graph_returns(make, cpu_backend):
    gm = make()
    x = torch.randn(6, 5)
    with config.patch(suppress_errors=False, fallback_on_lowering_error=False):
        compiled = compile_graph(gm, [x], cpu_backend=cpu_backend)
        for _ in range(2):
            _same_structure(compiled(x), gm(x))
