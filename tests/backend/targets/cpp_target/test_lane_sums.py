"""Row sums on the C++ target accumulate in lanes of fine accumulators (``strategies/
lanes.py``). A row of at most CASCADE blocks merges its fine accumulators into the total
directly, without the coarse lanes a longer row folds them into: the same values in the same
order, so the same bits, in less time (layer norm's backward over 2048x256, 1 thread: 168 ->
145 us a call)."""
import pytest
import torch
import torch.nn.functional as F

import ember
from ember import config
from ember.backend.targets.cpp.strategies import lanes
from ember.testing import run_and_get_code


@pytest.fixture(autouse=True)
def _fresh(monkeypatch):
    monkeypatch.setenv("EMBER_GRAPH_CACHE", "0")
    ember.reset()
    with config.patch(suppress_errors=False), torch.no_grad():
        yield
    ember.reset()


def _softmax_and_norm(x):
    return torch.softmax(x, -1), F.layer_norm(x, x.shape[-1:]), x.sum(-1)


@pytest.mark.parametrize("length", [256, 1000, 4096, 4097, 8192])
def test_short_rows_merge_fine_sums_directly_with_the_same_bits(length, monkeypatch):
    torch.manual_seed(0)
    x = torch.randn(16, length) * 100 + 3
    got, sources = run_and_get_code(_softmax_and_norm, x)
    kernels = "\n".join(s for s in sources if 'extern "C"' in s)
    short = length <= lanes.CASCADE * lanes.PARTIAL_SUMS
    assert ("_lane[32]" in kernels) is not short, kernels
    for a, b in zip(got, _softmax_and_norm(x)):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-4)
    # the same bits as through the coarse lanes
    ember.reset()
    monkeypatch.setattr(lanes, "_fits_one_fold", lambda start, end, n: False)
    folded = ember.compile(_softmax_and_norm, backend="ember")(x)
    for a, b in zip(got, folded):
        assert torch.equal(a, b)
