"""Split reductions (ember/backend/lowering/reductions.py, Triton target): a reduction to few
results runs as two kernels, partial results then their reduction, and still computes
eager's values; the C++ target keeps one kernel (its threads split rows themselves)."""
import os

import pytest
import torch

import ember
from ember.backend import metrics
from ember.testing import same

INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"
NEEDS_GPU = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available() or INTERPRETED,
                                                 reason="needs a CUDA GPU")]
TRITON = [pytest.param(("cpu", {"cpu_backend": "triton"}), marks=pytest.mark.skipif(
    not INTERPRETED, reason="Triton's interpreter is enabled only in processes started with "
                            "TRITON_INTERPRET=1 (tests/conftest.py, without a GPU)")),
          pytest.param(("cuda", {}), marks=NEEDS_GPU)]

CASES = {   # name: (function, input shape, kernels when split)
    "column-sum": (lambda x: x.sum(0), (4096, 96), 2),
    "whole-sum": (lambda x: x.sum(), (512, 96), 2),
    "column-amax": (lambda x: x.amax(0, keepdim=True), (4096, 24), 2),
    "column-amin": (lambda x: x.amin(0), (2048, 8), 2),
    "batch-norm-mean": (lambda x: x.mean((0, 2, 3)), (16, 8, 14, 14), 2),
    "batch-norm-var": (lambda x: x.var((0, 2, 3)), (16, 8, 14, 14), 4),
    "column-any": (lambda x: (x > 3).any(0), (4096, 4), 2),
    "column-all": (lambda x: (x > -4).all(0), (4096, 4), 2),
    "sum-of-a-product": (lambda x: (x * x.sin()).sum(1), (4, 4096), 2),
}


def _kernels() -> int:
    return metrics.generated_kernel_count


@pytest.mark.parametrize("target", TRITON, ids=["triton-interp", "cuda"])
@pytest.mark.parametrize("name", list(CASES))
def test_split_reduction_matches_eager(target, name):
    device, options = target
    fn, shape, kernels = CASES[name]
    torch.manual_seed(0)
    x = torch.randn(*shape, device=device)
    ember.reset()
    with torch.no_grad():
        out, expected = ember.compile(fn, options=options)(x), fn(x)
    assert same(expected, out, rtol=1e-4, atol=1e-4)
    assert _kernels() == kernels


def test_a_reduction_whose_dims_do_not_divide_stays_one_kernel():
    """8191 rows (a prime) cannot be cut into equal chunks: one kernel, eager's values."""
    if not INTERPRETED:
        pytest.skip("runs the Triton interpreter (TRITON_INTERPRET=1, set without a GPU)")
    x = torch.randn(8191, 3)
    ember.reset()
    with torch.no_grad():
        out = ember.compile(lambda x: x.sum(0), options={"cpu_backend": "triton"})(x)
    assert same(x.sum(0), out, rtol=1e-4, atol=1e-4)
    assert _kernels() == 1


def test_the_cpp_target_does_not_split():
    x = torch.randn(4096, 96)
    ember.reset()
    with torch.no_grad():
        out = ember.compile(lambda x: x.sum(0))(x)
    assert same(x.sum(0), out, rtol=1e-4, atol=1e-4)
    assert _kernels() == 1


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_split_half_sum_keeps_float32_partials(dtype):
    """Partial sums of half values are float32: the result is as close to the float32 sum
    as eager's (which accumulates in float32 and rounds once)."""
    if not torch.cuda.is_available() or INTERPRETED:
        pytest.skip("needs a CUDA GPU (the CPU targets compute no half precision)")
    torch.manual_seed(0)
    x = torch.randn(65536, 64, device="cuda", dtype=dtype)
    ember.reset()
    with torch.no_grad():
        out = ember.compile(lambda x: x.sum(0))(x)
    reference = x.float().sum(0)
    assert _kernels() == 2
    assert (out.float() - reference).abs().max() <= \
        (x.sum(0).float() - reference).abs().max() * 2 + 1e-3
