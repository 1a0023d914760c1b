"""Random numbers in generated kernels (Philox): the statistics of eager's distributions,
reproducible under ``torch.manual_seed``, fresh on every call, fused with their users
(``fallback_random=False``; by default random ops run eager's kernels)."""
import os

import pytest
import torch
import torch.nn.functional as F

import ember
from ember.backend import compile_stats

INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"
TARGETS = [
    pytest.param(("cpu", {}), id="cpp"),
    pytest.param(("cpu", {"cpu_backend": "triton"}), id="triton-interp", marks=pytest.mark.skipif(
        not INTERPRETED, reason="Triton's interpreter is enabled only in processes started "
                                "with TRITON_INTERPRET=1 (tests/conftest.py, without a GPU)")),
    pytest.param(("cuda", {}), id="cuda", marks=[pytest.mark.gpu, pytest.mark.skipif(
        not torch.cuda.is_available() or INTERPRETED, reason="needs a CUDA GPU")]),
]


def draws(x):
    return (F.dropout(x, 0.3, training=True), torch.rand(64, 96, device=x.device),
            torch.randn_like(x) * 2 + 1, torch.bernoulli(x.sigmoid()))


@pytest.mark.parametrize("target", TARGETS)
def test_random_ops_fuse_and_follow_the_seed(target):
    device, options = target
    ember.reset()
    compiled = ember.compile(draws, options={**options, "fallback_random": False})
    x = torch.randn(64, 96, device=device)
    torch.manual_seed(1)
    first = compiled(x)
    torch.manual_seed(1)
    again = compiled(x)
    fresh = compiled(x)
    assert not compile_stats.fallback_ops, dict(compile_stats.fallback_ops)
    assert compile_stats.generated_kernel_count == 1     # all four in one kernel
    assert all(torch.equal(a, b) for a, b in zip(first, again))
    assert not torch.equal(first[1], fresh[1])
    dropped, uniform, normal, coins = first
    kept = dropped != 0
    assert abs(1 - kept.float().mean().item() - 0.3) < 0.03
    torch.testing.assert_close(dropped[kept], (x / 0.7)[kept])
    assert 0 <= uniform.min().item() and uniform.max().item() < 1
    assert abs(uniform.mean().item() - 0.5) < 0.02
    assert abs(normal.mean().item() - 1) < 0.1 and abs(normal.std().item() - 2) < 0.1
    assert set(coins.unique().tolist()) <= {0.0, 1.0}
    assert abs(coins.mean().item() - x.sigmoid().mean().item()) < 0.03
