"""Run on a Python Ember's frontend does not support (CPython 3.13 today): ember.compile must
warn once, match eager and never crash the interpreter (issue 32). Exits non-zero otherwise."""
import sys
import warnings

import torch

import ember
from ember.frontend import support
from ember.testing import CompileCounter, same

assert not support.frontend_supported(), f"Python {sys.version_info[:2]} is supported"


def breaks_graph(x, n):
    y = x.sin() * 2
    print("", end="")
    if y.sum() > 0:
        y = y + n
    return [y.cos(), {"n": n + 1}]


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 4, 3)
        self.lin = torch.nn.Linear(4, 2)

    def forward(self, x):
        h = torch.relu(self.conv(x)).mean((2, 3))
        if h.sum() > 0:
            h = h * 2
        return self.lin(h).softmax(-1)


torch.manual_seed(0)
net, x, img = Net(), torch.randn(3, 5), torch.randn(2, 3, 8, 8)
counter = CompileCounter()
with warnings.catch_warnings(record=True) as record:
    warnings.simplefilter("always")
    fn = ember.compile(breaks_graph, backend=counter)
    mod = ember.compile(net)
    for _ in range(3):
        assert same(fn(x, 2), breaks_graph(x, 2))
        assert same(fn(-x, 1.5), breaks_graph(-x, 1.5))
        assert same(mod(img), net(img))
    try:
        ember.compile(breaks_graph, fullgraph=True)
        raise AssertionError("fullgraph=True did not raise")
    except support.UnsupportedPythonError:
        pass
found = [str(w.message) for w in record if "Ember's frontend" in str(w.message)]
assert len(found) == 1, found
assert counter.frame_count == 0
print(f"ok: Python {sys.version.split()[0]}, torch {torch.__version__}: warned once "
      f"({found[0]!r}), results equal eager")
