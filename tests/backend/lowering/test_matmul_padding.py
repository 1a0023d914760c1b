"""``mm``/``addmm`` whose result rows are not 16-byte aligned run on a weight padded with
zero columns and read back through the first N columns (ember/backend/lowering/matmul.py):
cuBLAS is ~6x slower on unaligned rows. ``config.matmul_padding="always"`` makes the CPU
targets take that path too; results and strides match eager's."""
import pytest
import torch
import torch.nn.functional as F

import ember
from ember import config
from ember.testing import run_and_get_code

pytestmark = pytest.mark.usefixtures("cpu_backend")


class LMHead(torch.nn.Module):
    """A linear layer with a bias, one without (tied to an embedding, as LM heads are), a
    softmax that reads the product, and the product returned transposed."""

    def __init__(self, vocab=50, dim=32):
        super().__init__()
        self.embed = torch.nn.Embedding(vocab, dim)
        self.proj = torch.nn.Linear(dim, vocab)

    def forward(self, x):
        logits = F.linear(x, self.embed.weight)
        return self.proj(x), torch.softmax(logits, -1), logits.t()


@pytest.fixture(autouse=True)
def _fresh():
    ember.reset()
    with config.patch(suppress_errors=False, fallback_on_lowering_error=False):
        yield


def _check(model, x, mode, ember_log):
    ember.logs.set_logs("perf_hints")
    with torch.no_grad(), config.patch(matmul_padding=mode):
        got, sources = run_and_get_code(model, x)
        want = model(x)
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w)
        assert g.stride() == w.stride()
    return ember_log.text


def test_unaligned_columns_are_padded_when_asked(ember_log):
    from ember.backend import compile_stats
    compile_stats.reset()
    text = _check(LMHead().eval(), torch.randn(7, 32), "always", ember_log)
    assert "[7, 32] x [32, 50] computed as [7, 32] x [32, 52]" in text
    assert dict(compile_stats.extern_calls) == {"aten.mm.default": 2}     # addmm's bias in a kernel


def test_aligned_columns_and_off_are_left_alone(ember_log):
    text = _check(LMHead(vocab=48).eval(), torch.randn(7, 32), "always", ember_log)
    text += _check(LMHead().eval(), torch.randn(7, 32), "off", ember_log)
    # auto pads CUDA half-precision results only
    text += _check(LMHead().eval(), torch.randn(7, 32), "auto", ember_log)
    assert "computed as" not in text


def test_padded_product_gradients_match_eager(cpu_backend):
    model = LMHead()
    x = torch.randn(5, 32, requires_grad=True)
    with config.patch(matmul_padding="always"):
        compiled = ember.compile(model)
        outs = compiled(x)
        sum(o.float().pow(2).sum() for o in outs).backward()
    got = [x.grad] + [p.grad for p in model.parameters()]
    x.grad = None
    model.zero_grad()
    sum(o.float().pow(2).sum() for o in model(x)).backward()
    want = [x.grad] + [p.grad for p in model.parameters()]
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w)


def test_unaligned_inner_and_first_dims_are_padded_once(ember_log):
    """A head's backward: ``g @ w`` (K = 50 unaligned) and ``g.t() @ h`` (M = 50, the first
    operand column-major) run on one zero-padded copy of ``g``; the second result drops the
    padded rows by a view."""
    from ember.backend import compile_stats

    def head_backward(g, w, h):
        return g @ w, g.t() @ h
    g, w, h = torch.randn(8, 50), torch.randn(50, 32), torch.randn(8, 32)
    compile_stats.reset()
    ember.logs.set_logs("perf_hints")
    with config.patch(matmul_padding="always"):
        got = ember.compile(head_backward)(g, w, h)
    for out, want in zip(got, head_backward(g, w, h)):
        torch.testing.assert_close(out, want)
        assert out.stride() == want.stride()
    assert "[8, 50] x [50, 32] computed as [8, 52] x [52, 32]" in ember_log.text
    assert "[50, 8] x [8, 32] computed as [52, 8] x [8, 32]" in ember_log.text
    # the padded g and the padded w, nothing else (no copy of either result)
    assert compile_stats.generated_kernel_count == 2
    assert dict(compile_stats.extern_calls) == {"aten.mm.default": 2}


def test_unknown_padding_choice_raises():
    with pytest.raises(ValueError, match="matmul_padding.*'sometimes'"):
        config.patch(matmul_padding="sometimes")


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_gpt2_sized_head_is_padded_on_cuda(dtype, ember_log):
    """auto: a half-precision product of 1M elements or more with 50257 columns."""
    model = LMHead(vocab=50257, dim=64).to("cuda", dtype).eval()
    x = torch.randn(64, 64, device="cuda", dtype=dtype)
    ember.logs.set_logs("perf_hints")
    with torch.no_grad():
        got = ember.compile(model)(x)
        want = model(x)
    assert "[64, 64] x [64, 50257] computed as [64, 64] x [64, 50264]" in ember_log.text
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, rtol=2e-2, atol=2e-2)
        assert g.stride() == w.stride()
