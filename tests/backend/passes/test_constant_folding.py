"""Values computed from no input that need ATen fallbacks are computed once, at compile time
(ember/backend/passes/constant_folding.py); Swin's shifted-window attention mask (slice
assignments into ``new_zeros``), which did, now has lowerings. Results match eager on both
CPU targets."""
import pytest
import torch

import ember
from ember import config, logs
from ember.backend import compile_stats

pytestmark = pytest.mark.usefixtures("cpu_backend")


@pytest.fixture(autouse=True)
def _fresh():
    ember.reset()
    compile_stats.reset()
    with config.patch(suppress_errors=False, fallback_on_lowering_error=False):
        yield


def shifted_window_scores(scores, x):
    """torchvision's ``shifted_window_attention`` mask, on 8x8 windows of 4x4."""
    mask = x.new_zeros((8, 8))
    count = 0
    for h in ((0, -4), (-4, -2), (-2, None)):
        for w in ((0, -4), (-4, -2), (-2, None)):
            mask[h[0]:h[1], w[0]:w[1]] = count
            count += 1
    mask = mask.view(2, 4, 2, 4).permute(0, 2, 1, 3).reshape(4, 16)
    mask = mask.unsqueeze(1) - mask.unsqueeze(2)
    mask = mask.masked_fill(mask != 0, -100.0).masked_fill(mask == 0, 0.0)
    return torch.softmax(scores + mask, -1) * x.sum()


def positions_scores(scores, x):
    """A constant that needs a fallback (``cumsum`` has no lowering) next to the input."""
    positions = x.new_ones((16,)).cumsum(0) / 16
    return torch.softmax(scores + positions, -1) * x.sum()


def test_constant_needing_a_fallback_is_computed_once(ember_log):
    logs.set_logs("perf_hints")
    scores, x = torch.randn(3, 4, 16, 16), torch.randn(5)
    with torch.no_grad():
        compiled = ember.compile(positions_scores)
        for _ in range(2):
            torch.testing.assert_close(compiled(scores, x), positions_scores(scores, x))
    assert "constant folding: 1 value(s)" in ember_log.text
    assert "fallbacks (aten.cumsum.default)" in ember_log.text
    assert dict(compile_stats.fallback_ops) == {}


def test_swin_mask_is_generated_code(ember_log):
    """Its slice assignments (``fill`` and ``as_strided_scatter``) have lowerings: the mask
    is computed in the kernels that read it, nothing is folded or left to ATen."""
    logs.set_logs("perf_hints")
    scores, x = torch.randn(3, 4, 16, 16), torch.randn(5)
    with torch.no_grad():
        torch.testing.assert_close(ember.compile(shifted_window_scores)(scores, x),
                                   shifted_window_scores(scores, x))
    assert "constant folding" not in ember_log.text
    assert dict(compile_stats.fallback_ops) == {}


def test_gradients_through_a_folded_constant_match_eager():
    scores = torch.randn(2, 4, 16, 16, requires_grad=True)
    x = torch.randn(5, requires_grad=True)
    ember.compile(positions_scores)(scores, x).pow(2).sum().backward()
    got = scores.grad, x.grad
    scores.grad = x.grad = None
    positions_scores(scores, x).pow(2).sum().backward()
    torch.testing.assert_close(got, (scores.grad, x.grad))
    assert dict(compile_stats.fallback_ops) == {}


def test_constants_with_lowerings_are_computed_inline(ember_log):
    logs.set_logs("perf_hints")

    def fn(x):
        return x + torch.arange(4.0) * 2 + x.new_ones((4,)).exp()
    x = torch.randn(4, 4)
    with torch.no_grad():
        torch.testing.assert_close(ember.compile(fn)(x), fn(x))
    assert "constant folding" not in ember_log.text


def test_a_constant_output_is_a_fresh_tensor_each_call(ember_log):
    """The mask is an output: only the filled slice inside it is folded; each call returns
    a new mask, as eager does."""
    logs.set_logs("perf_hints")

    def fn(x):
        mask = x.new_zeros((4, 4))
        mask[1:3] = 2.0
        return x * 2, mask
    x = torch.randn(4, 4)
    with torch.no_grad():
        compiled = ember.compile(fn)
        first = compiled(x)
        first[1].fill_(7.0)
        second = compiled(x)
    assert second[1].data_ptr() != first[1].data_ptr()
    for got, want in zip(second, fn(x)):
        torch.testing.assert_close(got, want)


def cpu_scale_scores(scores):
    """DeBERTa's scale: a CPU scalar tensor that CUDA scores are divided by."""
    scale = torch.sqrt(torch.tensor(scores.size(-1), dtype=torch.float) * 2)
    return torch.softmax(scores / scale.to(dtype=scores.dtype), -1) + torch.tensor(0.5)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_cpu_scalar_constants_of_a_cuda_graph_are_folded_onto_the_gpu(ember_log, dtype):
    """Each op on DeBERTa's CPU scale ran in ATen, and so did the division of the CUDA
    scores by it: now the scale is computed once, kept on the GPU, and read by kernels."""
    logs.set_logs("perf_hints")
    scores = torch.randn(4, 64, 64, device="cuda", dtype=dtype)
    with torch.no_grad():
        compiled = ember.compile(cpu_scale_scores)
        for _ in range(2):
            got, want = compiled(scores), cpu_scale_scores(scores)
            assert got.dtype == want.dtype and got.device == want.device
            torch.testing.assert_close(got, want)
    assert "constant folding: 1 value(s) computed from no input with ATen fallbacks " \
        "(aten._to_copy.default, aten.mul.Tensor, aten.sqrt.default)" in ember_log.text
    assert dict(compile_stats.fallback_ops) == {}
