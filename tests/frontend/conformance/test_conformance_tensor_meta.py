"""Conformance: tensor metadata queries returned as Python values (next to a tensor op)."""
import pytest
import torch

from conformance_util import _seed_rng, check  # noqa: F401  (autouse fixture)


def t_shape_size(x):
    return x + 1, x.shape, x.size(), x.size(1), x.shape[-1], tuple(x.shape), list(x.size())


def t_dtype_device(x):
    return x * 2, x.dtype, x.device, x.device.type, str(x.dtype)


def t_ndim_numel_dim(x):
    return x - 1, x.ndim, x.dim(), x.numel(), len(x)


def t_stride_contiguity(x):
    return x.abs(), x.stride(), x.stride(0), x.stride(-1), x.is_contiguous()


def t_flags(x):
    return x.neg(), x.is_floating_point(), x.is_complex(), x.requires_grad, \
        x.layout == torch.strided


def t_shape_arithmetic(x):
    b, c, h, w = x.shape
    flat = x.reshape(b, c * h * w)
    return flat, b * c, h + w, x.shape[1:], x.shape[:-1] + (1,), x.shape == (2, 3, 4, 5)


def t_dtype_queries(x):
    y = x.to(torch.float16)
    return y, y.dtype == torch.half, torch.finfo(x.dtype).eps, torch.iinfo(torch.int8).max


def t_shape_of_result(x, y):
    z = x @ y
    return z, z.shape, z.stride()


META = [
    (t_shape_size, lambda: (torch.randn(2, 3),)),
    (t_dtype_device, lambda: (torch.randn(2, 3),)),
    (t_ndim_numel_dim, lambda: (torch.randn(2, 3, 4),)),
    (t_stride_contiguity, lambda: (torch.randn(4, 3).t(),)),
    (t_flags, lambda: (torch.randn(3),)),
    (t_shape_arithmetic, lambda: (torch.randn(2, 3, 4, 5),)),
    (t_dtype_queries, lambda: (torch.randn(3),)),
    (t_shape_of_result, lambda: (torch.randn(2, 3), torch.randn(3, 4))),
]


@pytest.mark.parametrize("fn,make", META, ids=[f.__name__ for f, _ in META])
def test_tensor_metadata(fn, make):
    check(fn, make())


@pytest.mark.parametrize("dtype", [torch.float64, torch.int32, torch.bool])
def test_metadata_other_dtypes(dtype):
    x = (torch.randn(2, 3) * 4).to(dtype)
    check(t_dtype_device, (x,))


def test_metadata_of_sliced_view_input():
    base = torch.randn(4, 6)
    check(t_stride_contiguity, (base[1:, ::2],))
