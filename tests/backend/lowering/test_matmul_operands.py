"""A body that a matmul reads transposed (an AMP weight cast, ``x @ w.to(bf16).t()``) is
computed in its own layout and handed over as a transposed view, as eager hands it: the
library reads either order, and a transposed copy is a slow kernel on a GPU. Results match
eager on both CPU targets."""
import re

import pytest
import torch

from ember.testing import run_and_get_code

pytestmark = pytest.mark.usefixtures("cpu_backend", "fresh_no_grad")


def _library_args(fn, *args):
    """The tensors each library matmul of ``fn``'s wrapper gets, as their text, each buffer
    the wrapper allocates in the shape a matmul reads it (``_allocation_layouts``) written
    as that view of it."""
    out, sources = run_and_get_code(fn, *args)
    torch.testing.assert_close(out, fn(*args))
    wrapper = next(s for s in sources if "def call(" in s)
    slots = re.findall(r"^\s+(empty_strided\(.*\)),$", wrapper, re.M)
    shaped = {}
    for name, alloc in re.findall(r"^\s+(buf\d+) = (empty_strided\(.*\)|_slots\[\d+\])",
                                  wrapper, re.M):
        if alloc.startswith("_slots"):
            alloc = slots[int(alloc[7:-1])]
        size, stride = re.match(r"empty_strided\((\(.*?\)), (\(.*?\))", alloc).groups()
        shaped[name] = f"as_strided({name}, {size}, {stride}"
    calls = re.findall(r"= _c\d+\((.*)\)  # aten\.(?:mm|bmm)", wrapper)
    return [re.sub(r"\b(buf\d+)\b(?!,? ?\()", lambda m: shaped.get(m[1], m[1]), call)
            for call in calls]


def test_transposed_cast_weight_is_computed_in_its_own_layout():
    x, w = torch.randn(8, 16), torch.randn(24, 16)
    (args,) = _library_args(lambda x, w: x @ (w * 2).t(), x, w)
    # the weight's body written [24, 16] row-major, read through strides (1, 16)
    assert re.search(r"as_strided\(buf\d+, \(16, 24\), \(1, 16\)", args), args


def test_twice_transposed_body_is_computed_as_it_is():
    x, w = torch.randn(8, 16), torch.randn(16, 24)
    (args,) = _library_args(lambda x, w: x @ (w * 2).t().t(), x, w)
    assert "(1, 16)" not in args and "(1, 24)" not in args, args


def test_batched_transpose_reaches_bmm_as_a_view():
    q, k = torch.randn(3, 8, 4), torch.randn(3, 8, 4)
    (args,) = _library_args(lambda q, k: q @ (k * 0.5).transpose(1, 2), q, k)
    assert re.search(r"as_strided\(buf\d+, \(3, 4, 8\), \(32, 1, 4\)", args), args
