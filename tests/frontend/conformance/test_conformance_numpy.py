"""NumPy inside compiled code: ndarrays made from tensors are traced as tensor ops, and
results come back as ndarrays (or NumPy scalars) with NumPy's dtypes, equal to eager's."""
import numpy as np
import pytest
import torch

import ember
from conformance_util import _seed_rng, check  # noqa: F401


def np_program(x):
    """The issue's program: tensors to ndarrays, math, reductions, reshapes, an ndarray out."""
    a = x.numpy()
    b = np.exp(a) * 2 + np.sin(a) - a ** 2 / 3
    c = np.sum(b, axis=0) + b.mean() + np.max(np.abs(b), axis=1, keepdims=True).T[0, :1]
    d = np.reshape(c, (-1, 1)) @ np.ones((1, 2), dtype=np.float32)
    return np.concatenate([d, np.transpose(d)[:, :2].T[:4]], axis=0).ravel()


def np_methods(x):
    a = x.numpy()
    return (a.sum(axis=1), a.max(), a.argmax(axis=0), a.std(), a.var(axis=0, ddof=1),
            a.reshape(2, -1), a.transpose(1, 0).copy(), a.astype(np.float64).cumsum(),
            a.clip(-0.5, 0.5), a.squeeze(), a.flatten(), a.min(axis=0), a.prod(axis=1))


def np_scalars_and_attributes(x):
    a = x.numpy()
    total = a.sum()
    return total * 2, a.shape, a.ndim, a.size, a.dtype, len(a), a.dtype == np.float32


def np_integer_arrays(x):
    a = x.numpy()
    return a / 2, a // 2, a * 1.5, np.exp(a), a.mean(), a.sum(), a + 1, np.sqrt(a)


def np_creation(x):
    a = x.numpy()
    return (a + np.zeros(a.shape), np.ones((2, 3)), np.full((2,), 7), np.arange(5),
            np.arange(0.0, 1.0, 0.25), np.linspace(0, 1, 5), np.eye(3) * a[0, 0],
            np.zeros_like(a), np.ones_like(a, dtype=np.int64), np.asarray([1.5, 2.0]) * 2,
            np.array(a) + 1)


def np_dtypes(x):
    a = x.numpy().astype(np.float32)
    eps = np.finfo(np.float32).eps
    z = np.zeros((3, 4), dtype=np.dtype("float32"))
    return a * eps + z, np.iinfo(np.int32).max, np.dtype(np.float32).itemsize


def np_shape_functions(x):
    a = x.numpy()
    return (np.expand_dims(a, 0), np.stack([a, a], axis=2), np.swapaxes(a, 0, 1),
            np.flip(a, axis=0), np.broadcast_to(a[:1], (3, 4)), np.squeeze(a[None]),
            np.where(a > 0, a, 0.0), np.maximum(a, 0), np.dot(a, a.T))


def np_zero_d_results(x):
    v = x.numpy()[0]
    return np.dot(v, v), v @ v, np.exp(np.sum(v)), v.dot(v) * 2


def np_from_numpy(x):
    a = x.numpy() * 2
    t = torch.from_numpy(a)
    return t + 1, torch.relu(torch.from_numpy(np.sin(a)))


def np_indexing_and_loops(x):
    a = x.numpy()
    rows = [row.sum() for row in a]
    return a[1:, ::2], a[0, 1], a[a[:, 0] > 0.0] if False else a[[0, 2]], rows


ALL = [np_program, np_methods, np_scalars_and_attributes, np_creation, np_dtypes,
       np_shape_functions, np_zero_d_results, np_from_numpy, np_indexing_and_loops]


@pytest.mark.parametrize("fn", ALL, ids=lambda f: f.__name__)
def test_numpy_programs_in_one_graph(fn):
    check(fn, (torch.randn(3, 4),))


def test_integer_arrays_follow_numpy_dtypes():
    check(np_integer_arrays, (torch.randint(0, 9, (3, 4)),))


def test_numpy_program_is_one_graph_of_tensor_ops():
    ember.reset()
    explained = ember.explain(np_program)(torch.randn(3, 4))
    assert explained.graph_count == 1 and not explained.break_reasons
    out = ember.compile(np_program, backend="eager")(torch.ones(3, 4))
    assert isinstance(out, np.ndarray) and out.dtype == np.float32


def np_in_place(x):
    a = x.numpy()
    a += 1
    return x * 2


def np_random(x):
    a = x.numpy()
    return a + np.random.rand(*a.shape)


def test_in_place_and_random_break_the_graph():
    """``a += 1`` writes through to ``x``; np.random draws from NumPy's generator."""
    check(np_in_place, (torch.randn(3),), graphs=1)
    for fn in (np_in_place, np_random):
        ember.reset()
        explained = ember.explain(fn)(torch.randn(3))
        assert explained.break_reasons and not any(r.frame_ran_eagerly
                                                   for r in explained.break_reasons)


def test_numpy_random_matches_eager_with_the_same_seed():
    np.random.seed(0)
    want = np_random(torch.ones(3))
    np.random.seed(0)
    got = ember.compile(np_random, backend="eager")(torch.ones(3))
    assert np.array_equal(want, got) and got.dtype == want.dtype
