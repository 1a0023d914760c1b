"""Slice assignments into a computed value trace to ``as_strided_scatter(x, src, size,
stride, offset)``, whose sizes, strides and offset address eager's layout of ``x``. Ember
stored a transposed ``x`` contiguous, and the scatter's ATen kernel wrote other elements
than eager's (a silent wrong result); box views now have a lowering, and the others (a
diagonal) get ``x`` in eager's layout. Both CPU targets match eager, values and strides."""
import random

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


def write_diagonals(x):
    """Diagonals are no box: as_strided_scatter runs its ATen kernel, on z in eager's
    (column-major) layout."""
    z = x.t() * 3
    z.diagonal().fill_(9.0)
    z[1:, 2:].diagonal().add_(1.0)
    return z


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
    (write_diagonals, lambda: (torch.randn(6, 8),)),
], ids=["views", "swin_mask", "diagonals"])
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


def _random_assignment(seed):
    """A permuted computed value, one element or a range (steps 1 to 3) picked per dim, and
    the picked view overwritten."""
    rng = random.Random(seed)
    shape = [rng.randint(1, 6) for _ in range(rng.randint(1, 4))]
    perm = list(range(len(shape)))
    rng.shuffle(perm)
    picks = []
    for n in [shape[p] for p in perm]:
        k = rng.random()
        if k < 0.3:
            picks.append(rng.randrange(n))
        elif k < 0.8:
            start = rng.randrange(n)
            picks.append(slice(start, rng.randint(start + 1, n), rng.choice([1, 2, 3])))
        else:
            picks.append(slice(None))

    def fn(x, v):
        y = x.permute(*perm) * 2
        view = y[tuple(picks)]
        view.copy_(v[:view.numel()].view(view.shape))
        return y, y.sum(0)
    return fn, (torch.randn(*shape), torch.randn(2000))


@pytest.mark.parametrize("seed", range(24))
def test_random_assignments_match_eager(seed):
    fn, args = _random_assignment(seed)
    ember.reset()
    with torch.no_grad(), config.patch(suppress_errors=False, fallback_on_lowering_error=False):
        got = ember.compile(fn)(*args)
    want = fn(*args)
    assert torch.equal(got[0], want[0])
    torch.testing.assert_close(got[1], want[1])
    for g, w in zip(got, want):     # (a size-1 dim's stride is never read)
        assert [s for n, s in zip(g.shape, g.stride()) if n > 1] == \
            [s for n, s in zip(w.shape, w.stride()) if n > 1]


@pytest.mark.parametrize("fn,inputs", [
    (assign_into_views, lambda: (torch.randn(6, 8), torch.randn(2, 3))),
    (swin_mask, lambda: (torch.randn(3),)),
], ids=["views", "swin_mask"])
def test_box_views_need_no_fallback(fn, inputs):
    from ember.backend import compile_stats
    compile_stats.reset()
    ember.reset()
    with torch.no_grad(), config.patch(suppress_errors=False, fallback_on_lowering_error=False):
        ember.compile(fn)(*inputs())
    assert dict(compile_stats.fallback_ops) == {}


def reshape_alias_of_transposed(x):
    """``_reshape_alias`` addresses its input's storage too (other frontends' graphs hold it;
    Ember's own trace gives ``view``)."""
    z = x.t() * 3
    return torch.ops.aten._reshape_alias(z, (8, 6), (1, 8)) + 1


def test_reshape_alias_reads_eager_layout():
    x = torch.randn(6, 8)
    ember.reset()
    with torch.no_grad(), config.patch(suppress_errors=False, fallback_on_lowering_error=False):
        got = ember.compile(reshape_alias_of_transposed)(x)
    torch.testing.assert_close(got, reshape_alias_of_transposed(x))
