"""The on-disk cache of compiled graphs (ember/backend/runtime/graph_cache.py): a second
compile of the same graph for the same inputs loads the wrapper and kernels instead of tracing and
generating them, and computes what eager computes."""
import pytest
import torch

import ember
from ember import logs
from ember.backend.runtime import graph_cache
from ember.backend import compile_stats
from ember.backend.targets import target_for

CPU = target_for(torch.device("cpu"))


@pytest.fixture
def cache_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("EMBER_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv("EMBER_GRAPH_CACHE", raising=False)
    return tmp_path


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(8, 8)

    def forward(self, x):
        return torch.softmax(torch.relu(self.fc(x)) * 2 + 1, dim=-1) + torch.tensor([0.5])


def _compile_and_run(model, x, cpu_backend):
    ember.reset()
    with torch.no_grad():
        return ember.compile(model, options={"cpu_backend": cpu_backend})(x)


def test_second_compile_loads_the_cached_graph(cache_dir, ember_log, cpu_backend):
    logs.set_logs("output_code")
    model, x = Net().eval(), torch.randn(4, 8)
    first = _compile_and_run(model, x, cpu_backend)
    kernels = compile_stats.generated_kernel_count
    assert list((cache_dir / "graphs").rglob("*.graph"))
    assert "graph cache hit" not in ember_log.text
    second = _compile_and_run(model, x, cpu_backend)
    assert "graph cache hit" in ember_log.text
    assert compile_stats.generated_kernel_count == kernels      # the same kernels, loaded
    with torch.no_grad():
        want = model(x)
    torch.testing.assert_close(first, want)
    torch.testing.assert_close(second, want)


def test_other_shapes_and_options_miss(cache_dir, ember_log):
    logs.set_logs("output_code")
    model = Net().eval()
    _compile_and_run(model, torch.randn(4, 8), "cpp")
    x = torch.randn(6, 8)
    out = _compile_and_run(model, x, "cpp")                           # another shape
    assert "graph cache hit" not in ember_log.text
    with torch.no_grad():
        torch.testing.assert_close(out, model(x))
    ember.reset()
    with torch.no_grad():                                             # another option
        ember.compile(model, options={"fallback_random": False})(x)
    assert "graph cache hit" not in ember_log.text
    assert len(list((cache_dir / "graphs").rglob("*.graph"))) == 3


def test_a_damaged_entry_is_compiled_again(cache_dir, ember_log):
    model, x = Net().eval(), torch.randn(4, 8)
    _compile_and_run(model, x, "cpp")
    for entry in (cache_dir / "graphs").rglob("*.graph"):
        entry.write_bytes(b"not a cache entry")
    out = _compile_and_run(model, x, "cpp")
    assert "damaged cache entry" in ember_log.text
    with torch.no_grad():
        torch.testing.assert_close(out, model(x))


def test_switched_off_by_the_environment(cache_dir, monkeypatch):
    monkeypatch.setenv("EMBER_GRAPH_CACHE", "0")
    model, x = Net().eval(), torch.randn(4, 8)
    _compile_and_run(model, x, "cpp")
    assert not list(cache_dir.rglob("graphs/*/*.graph"))


def _scaled(t):
    return t * 3


def test_graphs_calling_user_functions_are_not_cached():
    """The graph's code names the function, not what it computes."""
    allowed = ember.allow_in_graph(_scaled)
    gms = []

    def backend(gm, example_inputs):
        gms.append(gm)
        return gm.forward
    ember.reset()
    ember.compile(lambda t: allowed(t) + 1, backend=backend)(torch.randn(3))
    assert graph_cache.key(gms[0], [torch.randn(3)], {}, CPU) is None
    ember.reset()
    ember.compile(lambda t: torch.sin(t) + 1, backend=backend)(torch.randn(3))
    assert graph_cache.key(gms[1], [torch.randn(3)], {}, CPU) is not None


def test_autocast_state_is_part_of_the_key():
    """A graph traced inside an autocast region bakes its casts in: compiled outside one,
    the same graph must not load that entry."""
    gm = torch.fx.symbolic_trace(lambda x: torch.mm(x, x))
    x = torch.randn(4, 4)
    plain = graph_cache.key(gm, [x], {}, CPU)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        autocast = graph_cache.key(gm, [x], {}, CPU)
    assert plain is not None and autocast is not None and plain != autocast


class ConvNet(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = torch.nn.Conv2d(16, 32, 3, padding=1)
        self.conv2 = torch.nn.Conv2d(32, 32, 3, padding=1)

    def forward(self, x):
        return self.conv2(torch.relu(self.conv1(x))).mean((2, 3))


def test_a_channels_last_graph_is_cached(cache_dir, ember_log):
    """A graph whose inputs are converted to channels-last by ATen calls (bfloat16, which the
    C++ target leaves to ATen) names a memory format in its wrapper, which torch.save
    refused: such graphs (resnet50 in bfloat16 on the CPU) were never cached."""
    logs.set_logs("output_code,perf_hints")
    model = ConvNet().eval().to(torch.bfloat16)
    x = torch.randn(2, 16, 24, 24, dtype=torch.bfloat16)
    first = _compile_and_run(model, x, "cpp")
    assert "run channels-last" in ember_log.text and "not stored" not in ember_log.text
    second = _compile_and_run(model, x, "cpp")
    assert "graph cache hit" in ember_log.text
    with torch.no_grad():
        want = model(x)
    torch.testing.assert_close(first, want)
    torch.testing.assert_close(second, want)
