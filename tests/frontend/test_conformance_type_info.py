"""Conformance: type information evaluated at capture.

``np.finfo``/``np.iinfo``/``torch.finfo``/``torch.iinfo`` attributes are constants (NumPy's
are NumPy scalars, which the graph must make as eager has them).
"""
import numpy as np
import pytest
import torch

from conformance_util import _seed_rng, check  # noqa: F401  (autouse fixture)


def t_numpy_finfo(x):
    lo = np.finfo(np.float32).min
    return (x.clamp(min=lo) + np.finfo(np.float32).eps, x * np.finfo(np.float16).max,
            x + np.finfo(np.float64).tiny, lo, np.finfo(np.float32).eps)


def t_numpy_iinfo(x, i):
    return (i + np.iinfo(np.int8).max, x * np.iinfo(np.int16).min, i.clamp(max=np.iinfo(
        np.int32).max), int(np.iinfo(np.int64).max))


def t_torch_finfo(x):
    return (x.clamp(torch.finfo(torch.float16).min, torch.finfo(torch.float16).max),
            x + torch.finfo(x.dtype).eps, x * torch.finfo(torch.bfloat16).tiny,
            torch.iinfo(torch.int32).max - x)


def t_numpy_scalar_kinds(x, i):
    # a NumPy scalar is not the Python number: torch.tensor keeps float64, np.bool_ promotes
    return (torch.tensor(np.float64(1.5)) + x, i + np.bool_(True), x * np.float32(0.25),
            torch.full((2,), np.int64(3)), x + np.float16(2.0), i * np.uint8(3))


def t_numpy_scalar_in_containers(x):
    return torch.cat([x, x]) * np.float32(2.0), x.new_full((2,), np.float64(0.5)), \
        x.reshape(np.int64(3), 1)


TYPE_INFO = [
    (t_numpy_finfo, lambda: (torch.randn(3),)),
    (t_numpy_iinfo, lambda: (torch.randn(3), torch.randint(-5, 5, (3,), dtype=torch.int32))),
    (t_torch_finfo, lambda: (torch.randn(3),)),
    (t_numpy_scalar_kinds, lambda: (torch.randn(3),
                                    torch.randint(-5, 5, (3,), dtype=torch.int32))),
    (t_numpy_scalar_in_containers, lambda: (torch.randn(3),)),
]


@pytest.mark.parametrize("fn,make", TYPE_INFO, ids=[f.__name__ for f, _ in TYPE_INFO])
def test_type_info(fn, make):
    check(fn, make())
