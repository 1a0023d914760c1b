"""CPU graphs keep their intermediate buffers between calls (``config.kept_buffers_mb``):
no allocation or page faults per call, and never memory a result or another thread sees."""
import threading

import pytest
import torch

import ember
from ember import config
from ember.backend import compile as backend_compile
from ember.testing import same


def _last_wrapper() -> str:
    return [s for s in backend_compile.generated_sources if "def call(" in s][-1]


def _mlp(x, w1, w2):
    h = torch.relu(x @ w1 + 1.0)           # a kernel's buffer between two library calls
    return torch.tanh(h @ w2).sum(0), (h * 2).t()


def _inputs(seed, rows=32):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(rows, 64, generator=g), torch.randn(64, 64, generator=g),
            torch.randn(64, 16, generator=g)]


def test_intermediates_are_kept_and_results_are_fresh():
    ember.reset()
    compiled = ember.compile(_mlp)
    first = compiled(*_inputs(0))
    wrapper = _last_wrapper()
    assert "# kept" in wrapper and "def _new_slots():" in wrapper
    kept_before = [t.clone() for t in first]
    second = compiled(*_inputs(1))
    for a, b in zip(first, kept_before):     # a later call does not write an earlier result
        assert torch.equal(a, b)
    for got, seed in ((first, 0), (second, 1)):
        assert same(_mlp(*_inputs(seed)), got, rtol=1e-4, atol=1e-4)
    ptrs = {t.untyped_storage().data_ptr() for t in (*first, *second)}
    assert len(ptrs) == 4


def test_concurrent_calls_each_get_their_own_buffers():
    ember.reset()
    compiled = ember.compile(_mlp)
    compiled(*_inputs(0, rows=4096))
    errors = []

    def worker(seed):
        inputs = _inputs(seed, rows=4096)   # 1 MB buffers: the kernels overlap in time
        expected = _mlp(*inputs)
        for _ in range(30):
            if not same(expected, compiled(*inputs), rtol=1e-4, atol=1e-4):
                errors.append(seed)

    threads = [threading.Thread(target=worker, args=(s,)) for s in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []


def test_a_call_that_raises_frees_the_kept_buffers_for_the_next():
    table = torch.randn(10, 8)

    def f(idx, x):
        y = torch.sigmoid(x) * 3
        return (y @ table.t())[:, :4] + table[idx].sum()

    ember.reset()
    compiled = ember.compile(f)
    x = torch.randn(16, 8)
    good = torch.tensor([1, 2])
    assert same(f(good, x), compiled(good, x), rtol=1e-5, atol=1e-5)
    assert "# kept" in _last_wrapper()
    with pytest.raises(IndexError):
        compiled(torch.tensor([1, 12]), x)
    assert same(f(good, x), compiled(good, x), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("budget, kept", [(0, False), (1, True)])
def test_the_budget_bounds_what_is_kept(budget, kept):
    def f(x):
        small = torch.relu(x[:64, :64] + 1)       # 16 KB
        big = torch.relu(x + 1)                   # 4 MB: over a 1 MB budget
        return (small @ small).sum() + (big @ big).sum()

    ember.reset()
    with config.patch(kept_buffers_mb=budget):
        x = torch.randn(1024, 1024)
        assert same(f(x), ember.compile(f)(x), rtol=1e-4, atol=1e-2)
    wrapper = _last_wrapper()
    assert ("# kept" in wrapper) == kept
    assert "empty_strided((1024, 1024)" in wrapper.split("def call(")[-1]


def test_kept_buffers_made_in_inference_mode_serve_later_calls():
    """The first call runs under ``torch.inference_mode()``; the kept buffers it makes are
    normal tensors, which a matmul may write (``out=``) outside inference mode too."""
    ember.reset()
    compiled = ember.compile(_mlp)
    inputs = _inputs(0)
    with torch.inference_mode():
        assert same(_mlp(*inputs), compiled(*inputs), rtol=1e-4, atol=1e-4)
    assert "out=_slots[" in _last_wrapper()
    with torch.no_grad():
        assert same(_mlp(*inputs), compiled(*inputs), rtol=1e-4, atol=1e-4)
    assert same(_mlp(*inputs), compiled(*inputs), rtol=1e-4, atol=1e-4)


def test_a_negative_budget_is_an_error_that_names_it():
    ember.reset()
    with config.patch(kept_buffers_mb=-1), pytest.raises(ValueError, match="kept_buffers_mb=-1"):
        ember.compile(_mlp)(*_inputs(0))
