"""Outputs that are views of other outputs share their memory, as eager's do: a write
through one is seen through the other, and the view has eager's strides and offset."""
import os

import pytest
import torch

import ember
from ember.testing import same

INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"
CPU_TARGETS = [{}, pytest.param({"cpu_backend": "triton"}, marks=pytest.mark.skipif(
    not INTERPRETED, reason="Triton's interpreter is enabled only in processes started with "
                            "TRITON_INTERPRET=1 (tests/conftest.py, without a GPU)"))]


def _transposed(x):
    y = x + 1
    return y, y.t()


def _strided_slice(x):
    y = x * 2
    return y, y[:, ::2]


def _row_first(x):
    y = torch.sin(x)
    return y[1], y


def _expanded(x):
    y = x.sum(0)
    return y, y.unsqueeze(0).expand(3, 8)


@pytest.mark.parametrize("options", CPU_TARGETS, ids=["cpp", "triton-interp"])
@pytest.mark.parametrize("fn", [_transposed, _strided_slice, _row_first, _expanded])
def test_output_view_of_another_output_shares_its_memory(fn, options):
    x = torch.randn(6, 8)
    ember.reset()
    expected, actual = fn(x), ember.compile(fn, options=options)(x)
    base = 1 if fn is _row_first else 0
    for e, a in zip(expected, actual):
        assert same(e, a, rtol=1e-5, atol=1e-6)
        assert (a.stride(), a.storage_offset()) == (e.stride(), e.storage_offset())
        assert a.untyped_storage().data_ptr() == actual[base].untyped_storage().data_ptr()
    expected[base].add_(1)
    actual[base].add_(1)
    assert same(expected[1 - base], actual[1 - base], rtol=1e-5, atol=1e-6)
