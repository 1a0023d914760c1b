"""Long float32 sums on the C++ target stay as accurate as eager's cascade sum: a sum split
into parallel chunks keeps and merges the chunks' sums in double (``strategies/chunks.py``),
and a run of a row longer than RUN_MAX is summed in pieces (``strategies/rows.py``).

The sums here cancel to 0 (a linear ramp from -1 to 1, as the fuzzer's loss weights are):
every rounding of a large partial sum shows in the result. Found by the 4-D fuzzer at
large shapes: the gradient of ``x - y.sum()`` was 0.029 off float64 where eager's was 5e-4.
"""
import pytest
import torch

import ember
from ember import config
from ember.backend.targets.cpp.strategies import rows
from ember.testing import run_and_get_code


@pytest.fixture(autouse=True)
def _fresh(monkeypatch):
    monkeypatch.setenv("EMBER_GRAPH_CACHE", "0")
    monkeypatch.setenv("EMBER_EAGER_CHOICE", "off")
    ember.reset()
    with config.patch(suppress_errors=False), torch.no_grad():
        yield
    ember.reset()


def _negated_sum(t):
    return (-t).sum()


# before the fix: 0.0078, 0.029 and 0.016 off float64; eager: 4.9e-4 each
@pytest.mark.parametrize("shape", [(589824,), (64, 8, 12, 96), (3, 196608)])
def test_a_sum_to_one_value_of_a_ramp_stays_near_float64(shape):
    ramp = torch.linspace(-1, 1, 589824).view(shape)
    expected = _negated_sum(ramp.double()).item()
    eager_error = abs(_negated_sum(ramp).item() - expected)
    got, sources = run_and_get_code(_negated_sum, ramp)
    assert "chunk" in "\n".join(sources)       # the parallel chunks' path
    assert abs(got.item() - expected) <= max(2 * eager_error, 1e-3)


def test_long_runs_of_a_multi_dim_sum_are_summed_in_pieces():
    x = torch.linspace(-1, 1, 2 * 3 * 50000).view(2, 3, 50000)
    fn = lambda t: t.sum((1, 2))     # noqa: E731 (2 outputs: each a row sum of two dims)
    got, sources = run_and_get_code(fn, x)
    kernels = "\n".join(s for s in sources if 'extern "C"' in s)
    assert f"+= {rows.RUN_MAX})" in kernels, kernels
    expected = fn(x.double())
    assert (got.double() - expected).abs().max().item() <= 1e-3
    torch.testing.assert_close(got, fn(x), rtol=1e-6, atol=1e-3)
