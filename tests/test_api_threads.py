"""Compiled functions called from several threads: threads that first call a function
together compile it once and share the entry (one per set of guards); a compile in one thread
does not stall calls that hit an entry in another; the compile lock is re-entrant."""
import threading
import time

import pytest
import torch

import ember
from ember import config

N_THREADS = 8


@pytest.fixture(autouse=True)
def _reset():
    ember.reset()
    yield
    ember.reset()


class SlowCountingBackend:
    """Counts the graphs it gets; each compile takes ``seconds``, so threads that call
    together all arrive while the first one compiles."""

    def __init__(self, seconds: float = 0.2):
        self.seconds = seconds
        self.graphs = 0
        self._lock = threading.Lock()

    def __call__(self, gm, example_inputs):
        with self._lock:
            self.graphs += 1
        time.sleep(self.seconds)
        return gm.forward


def _in_threads(fn, inputs):
    """``fn(x)`` for each of ``inputs``, each in its own thread, all released at once."""
    start = threading.Barrier(len(inputs))
    results, errors = [None] * len(inputs), []

    def work(i):
        try:
            start.wait(timeout=30)
            results[i] = fn(inputs[i])
        except BaseException as e:   # noqa: BLE001  reported by the test
            errors.append(e)
    threads = [threading.Thread(target=work, args=(i,)) for i in range(len(inputs))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert not any(t.is_alive() for t in threads), "a thread is stuck"
    assert not errors, errors
    return results


def straight(x):
    return torch.sin(x) * 2 + 1


def with_break(x):
    y = torch.cos(x) + 1
    print("", end="")        # a graph break: the resume function compiles once too
    return y * x


@pytest.mark.parametrize("fn, graphs", [(straight, 1), (with_break, 2)],
                         ids=["one_graph", "graph_break"])
def test_threads_calling_a_function_first_compile_it_once(fn, graphs):
    backend = SlowCountingBackend()
    compiled = ember.compile(fn, backend=backend)
    inputs = [torch.randn(4, 5) for _ in range(N_THREADS)]
    for got, x in zip(_in_threads(compiled, inputs), inputs):
        torch.testing.assert_close(got, fn(x))
    assert backend.graphs == graphs
    assert len(compiled._entries) == 1
    # the cache is not full of copies: a new shape still compiles (8 copies had filled
    # cache_size_limit, and it ran eagerly)
    assert config.cache_size_limit <= N_THREADS
    x = torch.randn(7)
    torch.testing.assert_close(compiled(x), fn(x))
    assert backend.graphs == 2 * graphs and len(compiled._entries) == 2
    assert compiled._eager_reason is None


def test_threads_with_different_shapes_each_get_their_entry():
    backend = SlowCountingBackend(0.05)
    compiled = ember.compile(straight, backend=backend)
    inputs = [torch.randn(2 + i % 2) for i in range(N_THREADS)]   # two shapes
    for got, x in zip(_in_threads(compiled, inputs), inputs):
        torch.testing.assert_close(got, straight(x))
    assert backend.graphs == 2 and len(compiled._entries) == 2


def test_a_compile_in_one_thread_does_not_stall_hits_in_another():
    compiling, release = threading.Event(), threading.Event()

    def backend(gm, example_inputs):
        tensors = [e for e in example_inputs if isinstance(e, torch.Tensor)]
        if tensors[0].shape == (5,):   # the second shape (symbolic then): hold its compile
            compiling.set()
            assert release.wait(timeout=30)
        return gm.forward
    compiled = ember.compile(straight, backend=backend)
    x = torch.randn(3)
    compiled(x)
    other = threading.Thread(target=compiled, args=(torch.randn(5),))
    other.start()
    try:
        assert compiling.wait(timeout=30)
        torch.testing.assert_close(compiled(x), straight(x))   # a hit, while it compiles
        assert other.is_alive()
    finally:
        release.set()
        other.join(timeout=30)
    assert len(compiled._entries) == 2


def test_a_backend_calling_the_function_it_compiles_does_not_deadlock():
    calls = []

    def backend(gm, example_inputs):
        calls.append(1)
        if len(calls) == 1:   # once: the inner call compiles on its own, same thread
            compiled(torch.randn(2))
        return gm.forward
    compiled = ember.compile(straight, backend=backend)
    x = torch.randn(3)
    torch.testing.assert_close(compiled(x), straight(x))
    assert len(calls) == 2
