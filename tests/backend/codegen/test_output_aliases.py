"""Outputs that are views of other outputs, or of an input the graph writes, share their
memory, as eager's do: a write through one is seen through the other, and the view has
eager's strides and offset."""
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


def _row_after_add(x):
    x.add_(1)
    return x[1]


def _diagonal_written(x):
    return x.diagonal().mul_(2), x


def _transposed_after_write(x):
    x[:, 1:3].sub_(1)
    return x.t()


def _strided_slice_written(x):
    return x[:, ::2].mul_(3)


@pytest.mark.parametrize("options", CPU_TARGETS, ids=["cpp", "triton-interp"])
@pytest.mark.parametrize("fn", [_row_after_add, _diagonal_written, _transposed_after_write,
                                _strided_slice_written])
def test_output_view_of_a_written_input_is_a_view_of_the_input(fn, options):
    """Ember returned a copy of the view's new values: right values, but a later write
    through the output did not reach the input (and a strided slice came back dense)."""
    x = torch.randn(6, 8)
    y = x.clone()
    ember.reset()
    expected, actual = fn(x), ember.compile(fn, options=options)(y)
    assert same(x, y, rtol=1e-5, atol=1e-6)
    expected = expected if isinstance(expected, tuple) else (expected,)
    actual = actual if isinstance(actual, tuple) else (actual,)
    for e, a in zip(expected, actual):
        assert same(e, a, rtol=1e-5, atol=1e-6)
        assert (a.stride(), a.storage_offset()) == (e.stride(), e.storage_offset())
        assert a.untyped_storage().data_ptr() == y.untyped_storage().data_ptr()
    expected[0].fill_(5.0)
    actual[0].fill_(5.0)
    assert same(x, y)


@pytest.mark.parametrize("options", CPU_TARGETS, ids=["cpp", "triton-interp"])
@pytest.mark.parametrize("fn", [lambda x: (x * 2)[:, 0],
                                lambda x: torch.nn.functional.pad(x, (1, 2)).sigmoid()[:, ::2],
                                lambda x: x.sin()[..., 1:],
                                lambda x: (x + 1)[1:3, ::3, 2:].permute(2, 0, 1)],
                         ids=["select", "padded_step", "sliced", "permuted_slices"])
def test_slice_of_an_intermediate_keeps_eagers_strides(fn, options):
    """A slice of a value computed inside the graph keeps eager's strides (the gaps are
    allocated, never written), as torch.compile's does; it came back contiguous, and
    ``ember bench`` counts other strides as wrong."""
    x = torch.randn(4, 8, 16)
    ember.reset()
    expected, actual = fn(x), ember.compile(fn, options=options)(x)
    assert same(expected, actual, rtol=1e-5, atol=1e-6)
    assert actual.stride() == expected.stride()
    assert actual.untyped_storage().nbytes() <= expected.untyped_storage().nbytes()
