"""A CPU ``addmm`` whose result only generated code reads runs as ``mm``, its bias added in
the kernel after it (ATen's addmm copies the bias into its result first: one more pass over
it); an addmm read by a library call, read twice, or returned runs as it is. Results match
eager on both CPU targets."""
import pytest
import torch
import torch.nn.functional as F

import ember
from ember import config
from ember.backend import compile_stats
from ember.testing import run_and_get_code

pytestmark = pytest.mark.usefixtures("cpu_backend")


@pytest.fixture(autouse=True)
def _fresh():
    ember.reset()
    compile_stats.reset()
    with config.patch(suppress_errors=False), torch.no_grad():
        yield


def _run(fn, *args, dtype=torch.float32):
    args = [a.to(dtype) for a in args]
    out, sources = run_and_get_code(fn, *args)
    torch.testing.assert_close(out, fn(*args))
    return dict(compile_stats.extern_calls)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_linear_then_gelu_runs_mm_and_adds_the_bias_in_the_gelu_kernel(dtype):
    x, w, b = torch.randn(2, 5, 16), torch.randn(24, 16), torch.randn(24)
    calls = _run(lambda x, w, b: F.gelu(F.linear(x, w, b)), x, w, b, dtype=dtype)
    assert calls == {"aten.mm.default": 1}
    assert compile_stats.generated_kernel_count == 1


def test_bias_joins_a_residual_add_through_a_permute():
    """ConvNeXt's block: linear, view, permute, a per-channel scale, a residual add."""
    x, w, b = torch.randn(1, 4, 4, 16), torch.randn(16, 16), torch.randn(16)
    gamma, res = torch.randn(16, 1, 1), torch.randn(1, 16, 4, 4)
    calls = _run(lambda x, w, b, g, r: g * F.linear(x, w, b).permute(0, 3, 1, 2) + r,
                 x, w, b, gamma, res)
    assert calls == {"aten.mm.default": 1}


@pytest.mark.parametrize("case", ["returned", "read twice", "library reader", "row bias"])
def test_addmm_stays_when_its_bias_would_cost_a_pass(case):
    x, w, b = torch.randn(6, 16), torch.randn(16, 16), torch.randn(16)
    if case == "returned":
        def fn(x, w, b):
            return F.linear(x.relu(), w, b)
    elif case == "read twice":
        def fn(x, w, b):
            y = F.linear(x, w, b)
            return y.relu(), y.sigmoid()
    elif case == "library reader":
        def fn(x, w, b):
            return F.linear(F.linear(x, w, b), w)
    else:
        b = torch.randn(6, 1)          # broadcast down the columns: not a per-column bias
        def fn(x, w, b):
            return torch.addmm(b, x, w.t()).relu()
    calls = _run(fn, x, w, b)
    assert calls.get("aten.addmm.default", 0) == 1, calls
