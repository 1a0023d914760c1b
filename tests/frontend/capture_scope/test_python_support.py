"""On a Python the frontend does not support, ``ember.compile`` warns once and runs eagerly;
``fullgraph=True`` and ``ember.explain`` raise (ember/frontend/support.py). The unsupported
Python is faked by replacing the version the support check reads."""
import pathlib
import tomllib
import warnings

import pytest
import torch

import ember
from ember import metrics
from ember.frontend import bytecode, convert, support
from ember.testing import CompileCounter, same


@pytest.fixture
def unsupported(monkeypatch):
    monkeypatch.setattr(support, "RUNNING_PYTHON", (3, 99))
    monkeypatch.setattr(support, "_warned", False)

    def no_capture(*args, **kwargs):
        raise AssertionError("the frontend captured a frame on an unsupported Python")
    monkeypatch.setattr(convert, "convert_frame", no_capture)
    ember.reset()
    yield
    ember.reset()


def breaks_graph(x, n):
    y = x.sin() * 2
    print("", end="")           # a graph break on a supported Python
    if y.sum() > 0:             # data-dependent branch: another one
        y = y + n
    return [y.cos(), n + 1]


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(4, 3)

    def forward(self, x):
        h = torch.relu(self.lin(x))
        if h.sum() > 0:
            h = h * 2
        return h.softmax(-1)


def _ember_warnings(record):
    return [w for w in record if issubclass(w.category, RuntimeWarning)
            and "Ember's frontend" in str(w.message)]


def test_unsupported_python_warns_once_and_runs_eagerly(unsupported):
    torch.manual_seed(0)
    net = Net()
    x = torch.randn(2, 4)
    counter = CompileCounter()
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        fn = ember.compile(breaks_graph, backend=counter)
        mod = ember.compile(net, backend=counter)
        decorated = ember.compile(backend="ember", dynamic=False)(breaks_graph)
        for _ in range(2):
            assert same(fn(x, 3), breaks_graph(x, 3))
            assert same(decorated(-x, 2), breaks_graph(-x, 2))
            assert same(mod(x), net(x))
        ember.reset()                       # does not turn capture on again
        assert same(fn(x, 4), breaks_graph(x, 4))
    found = _ember_warnings(record)
    assert len(found) == 1, [str(w.message) for w in record]
    text = str(found[0].message)
    assert "Python 3.99" in text and "3.11, 3.12" in text and "eagerly" in text
    assert found[0].filename == __file__    # points at the user's ember.compile call
    # the usual wrappers, delegating as always; nothing was captured or compiled
    assert isinstance(fn, ember.OptimizedFunction) and isinstance(mod, ember.OptimizedModule)
    assert mod.state_dict().keys() == net.state_dict().keys()
    assert counter.frame_count == 0
    assert not metrics.counters["frontend"]


def test_unsupported_python_backward_matches_eager(unsupported):
    torch.manual_seed(0)
    net = Net()
    x = torch.randn(2, 4)
    with pytest.warns(RuntimeWarning, match="eagerly"):
        mod = ember.compile(net)
    mod(x).sum().backward()
    compiled_grads = [p.grad.clone() for p in net.parameters()]
    net.zero_grad()
    net(x).sum().backward()
    assert same(compiled_grads, [p.grad for p in net.parameters()])


def test_unsupported_python_fullgraph_and_explain_raise(unsupported):
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        with pytest.raises(ember.UnsupportedPythonError,
                           match=r"Python 3\.99 .*fullgraph=True\) cannot capture a graph"):
            ember.compile(breaks_graph, fullgraph=True)
        with pytest.raises(ember.UnsupportedPythonError, match="fullgraph=True"):
            ember.compile(fullgraph=True)(Net())
        with pytest.raises(ember.UnsupportedPythonError, match="ember.explain"):
            ember.explain(breaks_graph)(torch.ones(2), 1)
    assert not _ember_warnings(record)     # an error instead of the warning, not both


def test_supported_set_matches_bytecode_tables_and_requires_python():
    assert support.frontend_supported()    # the Python running the tests is a supported one
    assert set(bytecode._SPECS) == set(support.SUPPORTED_PYTHONS)
    pyproject = pathlib.Path(__file__).resolve().parents[3] / "pyproject.toml"
    requires = tomllib.loads(pyproject.read_text())["project"]["requires-python"]
    lowest, highest = min(support.SUPPORTED_PYTHONS), max(support.SUPPORTED_PYTHONS)
    assert requires == f">={lowest[0]}.{lowest[1]},<{highest[0]}.{highest[1] + 1}"
