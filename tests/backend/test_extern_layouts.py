"""Library (ATen) results whose layout differs from the traced one are given the layout the
generated kernels index them with, instead of failing the call (ember/backend/runtime.py)."""
import torch
import torch.nn.functional as F

import ember
from ember.backend.runtime import with_layout
from ember.testing import same


def test_attention_result_in_another_layout_is_relaid(cpu_backend, ember_log):
    """The CPU flash kernel lays its output out like the query it is given. Ember stores
    the query (a pointwise result) contiguous where eager keeps the transposed strides, so
    the output's layout differs from the traced one (LlamaForCausalLM failed on this)."""
    seq, dim = 16, 8

    def attend(x, k, v):
        q = x.view(1, seq, 9, dim).transpose(1, 2) * 2
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        return out.transpose(1, 2).reshape(1, seq, -1) + 1

    g = torch.Generator().manual_seed(0)
    x = torch.randn(1, seq, 9 * dim, generator=g)
    k, v = [torch.randn(1, seq, 3, dim, generator=g).transpose(1, 2) for _ in range(2)]
    ember.logs.set_logs("perf_hints")
    with torch.no_grad():
        compiled = ember.compile(attend)
        for _ in range(2):
            assert same(attend(x, k, v), compiled(x, k, v), rtol=1e-5, atol=1e-5)
    if cpu_backend == "cpp":     # (the Triton target happens to store the query as eager does)
        assert "copied on every call" in ember_log.text     # the mismatch did happen


def test_with_layout_copies_only_on_a_mismatch():
    t = torch.randn(2, 3, 4)
    assert with_layout(t, (2, 3, 4), (12, 4, 1)) is t
    narrow = t[:, :1]
    assert with_layout(narrow, (2, 1, 4), (12, 99, 1)) is narrow    # size-1 dims: any stride
    other = with_layout(t, (2, 3, 4), (1, 2, 6))
    assert other.stride() == (1, 2, 6) and torch.equal(other, t)
