"""Slice assignments into a computed value trace to ``as_strided_scatter(x, src, size,
stride, offset)``, whose sizes, strides and offset address eager's layout of ``x``. Ember
stored a transposed ``x`` contiguous, and the scatter wrote other elements than eager's
(a silent wrong result); both CPU targets now match eager, values and strides."""
import pytest
import torch

import ember
from ember import config

pytestmark = pytest.mark.usefixtures("cpu_backend")


def assign_into_views(x, v):
    y = x * 2
    y[1:3, 2:5] = v
    y[:, 0] = 7.0
    z = x.t() * 3                 # eager: column-major, as x.t() is
    z[::2, 1:] = 1.0
    w = x.t()[1:, ::2] * 1.5      # eager: strided like its input
    w[2:4, 1] = v[0, 0]
    return y, z, w


def swin_mask(x):
    mask = x.new_zeros((8, 8)) + x.sum()     # reads an input: not a constant
    count = 0
    for h in ((0, -4), (-4, -2), (-2, None)):
        for w in ((0, -4), (-4, -2), (-2, None)):
            mask[h[0]:h[1], w[0]:w[1]] = count
            count += 1
    return mask


@pytest.mark.parametrize("fn,inputs", [
    (assign_into_views, lambda: (torch.randn(6, 8), torch.randn(2, 3))),
    (swin_mask, lambda: (torch.randn(3),)),
], ids=["views", "swin_mask"])
def test_assignments_into_views_match_eager(fn, inputs):
    args = inputs()
    ember.reset()
    with torch.no_grad(), config.patch(suppress_errors=False, fallback_on_lowering_error=False):
        got = ember.compile(fn)(*args)
    want = fn(*args)
    for g, w in zip(got if isinstance(got, tuple) else (got,),
                    want if isinstance(want, tuple) else (want,)):
        torch.testing.assert_close(g, w)
        assert g.stride() == w.stride()
