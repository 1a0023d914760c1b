"""Constant attention masks: dropped when they mask nothing, ``is_causal`` when causal."""
import pytest
import torch
import torch.nn.functional as F

import ember
from ember.backend.passes.attention_masks import simplify_constant_masks

B, H, L, D = 2, 3, 8, 16


def _qkv(seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(B, H, L, D, generator=g) for _ in range(3)]


def _capture(fn, *args):
    """fn's graph, after the mask pass; returns (rewrites, graph module, compiled result)."""
    seen = {}

    def backend(gm, inputs):
        seen["count"] = simplify_constant_masks(gm, inputs)
        seen["gm"] = gm
        return gm.forward
    out = ember.compile(fn, backend=backend)(*args)
    return seen["count"], seen["gm"], out


def _sdpa_kwargs(gm):
    [node] = [n for n in gm.graph.nodes if n.target is F.scaled_dot_product_attention]
    return dict(node.kwargs)


def all_true_like(q, k, v):
    mask = torch.ones_like(q[:, :1, :, :1], dtype=torch.bool).expand(B, 1, L, L)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)


def causal_arange(q, k, v):
    i = torch.arange(L)
    mask = (i[None, :] <= i[:, None])[None, None].expand(B, 1, L, L)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)


def causal_float(q, k, v):
    mask = torch.full((L, L), float("-inf")).triu(1)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)


def causal_finfo_min(q, k, v):
    i = torch.arange(L)
    mask = torch.zeros(L, L).masked_fill(i[None, :] > i[:, None], torch.finfo(torch.float32).min)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)


@pytest.mark.parametrize("fn,kind", [(all_true_like, "none"), (causal_arange, "causal"),
                                     (causal_float, "causal"), (causal_finfo_min, "causal")])
def test_constant_mask_rewritten(fn, kind):
    q, k, v = _qkv()
    count, gm, out = _capture(fn, q, k, v)
    assert count == 1
    kwargs = _sdpa_kwargs(gm)
    assert kwargs["attn_mask"] is None and kwargs["is_causal"] == (kind == "causal")
    torch.testing.assert_close(out, fn(q, k, v), rtol=1e-5, atol=1e-5)
    assert not [n for n in gm.graph.nodes if n.target in (torch.arange, torch.ones_like,
                                                           torch.full)], "mask left behind"


def banded(q, k, v):
    i = torch.arange(L)
    mask = (i[None, :] - i[:, None]).abs() <= 2
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)


def from_values(q, k, v):
    return F.scaled_dot_product_attention(q, k, v, attn_mask=q[:, :, :, :1] > 0)


def bias(q, k, v):
    return F.scaled_dot_product_attention(q, k, v, attn_mask=torch.ones(L, L) * 0.5)


def written_after(q, k, v):
    i = torch.arange(L)
    mask = i[None, :] <= i[:, None]
    mask[0, 0] = False     # one more masked place: no longer the causal mask
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)


def written_through_a_view(q, k, v):
    i = torch.arange(L)
    mask = i[None, :] <= i[:, None]
    view = mask.view(L, L)
    view[1, 0] = False     # the mask itself changes: no longer causal
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)


@pytest.mark.parametrize("fn", [banded, from_values, bias, written_after,
                                written_through_a_view])
def test_other_masks_kept(fn):
    q, k, v = _qkv(1)
    count, gm, out = _capture(fn, q, k, v)
    assert count == 0
    assert _sdpa_kwargs(gm).get("attn_mask") is not None
    torch.testing.assert_close(out, fn(q, k, v), rtol=1e-5, atol=1e-5, equal_nan=True)


def test_padding_mask_input_kept():
    q, k, v = _qkv(2)
    keep = torch.ones(B, 1, 1, L, dtype=torch.bool)
    fn = lambda q, k, v, m: F.scaled_dot_product_attention(q, k, v, attn_mask=m)  # noqa: E731
    count, gm, out = _capture(fn, q, k, v, keep)
    assert count == 0      # all True today, but an input: it may not be next call
    torch.testing.assert_close(out, fn(q, k, v, keep))


class CausalBlock(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.qkv = torch.nn.Linear(D, 3 * D)

    def forward(self, x):
        q, k, v = self.qkv(x).chunk(3, dim=-1)
        n = x.shape[1]
        i = torch.arange(n, device=x.device)
        mask = torch.ones_like(x[:, None, :, :1], dtype=torch.bool).expand(-1, 1, n, n) & \
            (i[None, :] <= i[:, None])
        return F.scaled_dot_product_attention(q[:, None], k[:, None], v[:, None],
                                              attn_mask=mask)


def test_ember_backend_end_to_end(cpu_backend, ember_log):
    torch.manual_seed(0)
    model = CausalBlock().eval()
    x = torch.randn(B, L, D)
    ember.logs.set_logs("perf_hints")
    with torch.no_grad():
        out = ember.compile(model)(x)
        expected = model(x)
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-5)
    assert "its constant mask is causal" in ember_log.text


def hf_bert_padding_mask(q, k, v):
    # HuggingFace BERT's mask while traced, for inputs without an attention mask: ones,
    # expanded to [b, 1, s, s], inverted, and filled with the dtype's min where true
    b, _, s, _ = q.shape
    mask = torch.ones((b, s), device=q.device)
    expanded = mask[:, None, None, :].expand(b, 1, s, s).to(q.dtype)
    inverted = 1.0 - expanded
    bias = inverted.masked_fill(inverted.to(torch.bool), torch.finfo(q.dtype).min)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=bias)


def ones_bool_mask(q, k, v):
    return F.scaled_dot_product_attention(
        q, k, v, attn_mask=q.new_ones(q.shape[-2], k.shape[-2], dtype=torch.bool))


def half_ones_mask(q, k, v):
    # uniform but not neutral: an additive 0.5 everywhere is a bias SDPA must still add
    return F.scaled_dot_product_attention(
        q, k, v, attn_mask=torch.full((q.shape[-2], k.shape[-2]), 0.5))


def length_dependent_mask(q, k, v):
    # True at every size below 6 and not beyond: a mask that is not uniform by construction
    s = q.shape[-2]
    return F.scaled_dot_product_attention(q, k, v, attn_mask=(torch.arange(s) < 6).expand(s, s))


def hf_arange_mask(q, k, v):
    # transformers 5's bidirectional mask while traced: every query index compared >= 0
    b, _, s, _ = q.shape
    mask = ((torch.arange(s) + 0)[None, None, :, None] >= 0).expand(b, -1, s, s)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)


def arange_from_one_mask(q, k, v):
    # False in the first key column at every size: a real mask
    s = q.shape[-2]
    return F.scaled_dot_product_attention(
        q, k, v, attn_mask=(torch.arange(s)[None, :] >= 1).expand(s, s) | (
            torch.arange(s)[:, None] == torch.arange(s)[None, :]))


def causal_by_index(q, k, v):
    s = q.shape[-2]
    kv, qi = torch.arange(s)[None, None, None, :], torch.arange(s)[None, None, :, None]
    return F.scaled_dot_product_attention(q, k, v, attn_mask=kv <= qi)


def hf_gpt2_packed_causal(q, k, v):
    # transformers 5's causal mask while traced: kv <= q, and-ed with a packed-sequence
    # check (positions restarting mark a new sequence) through diff and cumsum
    b, _, s, _ = q.shape
    pos = (torch.arange(s) + 0).unsqueeze(0).expand(b, -1)
    first = pos[:, :1] - 1
    seq = (torch.diff(pos, prepend=first, dim=-1) != 1).cumsum(-1)
    bi = torch.arange(b)[:, None, None, None]
    qi = (torch.arange(s) + 0)[None, None, :, None]
    ki = (torch.arange(s) + 0)[None, None, None, :]
    mask = qi.new_ones((), dtype=torch.bool) & (ki <= qi)
    mask = mask & (seq[bi, qi] == seq[bi, ki])
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask.expand(b, -1, s, s))


def causal_shifted_by_one(q, k, v):
    # each query sees one key ahead: not SDPA's causal mask
    s = q.shape[-2]
    kv, qi = torch.arange(s)[None, :], torch.arange(s)[:, None]
    return F.scaled_dot_product_attention(q, k, v, attn_mask=kv <= qi + 1)


def _symbolic_rewrites(fn, sizes):
    """Compile ``fn`` once with symbolic sizes; return the rewrites of its one symbolic
    compile and check the results at each length against eager."""
    from ember.backend import compile_stats
    ember.reset()
    compile_stats.reset()
    seen = []
    import ember.backend.passes.symbolic_graph as symbolic_graph
    original = symbolic_graph.simplify_constant_masks

    def spy(gm, inputs, symbolic=False):
        count = original(gm, inputs, symbolic)
        seen.append((symbolic, count))
        return count
    compiled = ember.compile(fn, dynamic=True)
    symbolic_graph.simplify_constant_masks = spy
    try:
        for s in sizes:
            q, k, v = (torch.randn(2, 3, s, D, generator=torch.Generator().manual_seed(i))
                       for i in range(3))
            torch.testing.assert_close(compiled(q, k, v), fn(q, k, v), rtol=1e-5, atol=1e-5)
    finally:
        symbolic_graph.simplify_constant_masks = original
    assert compile_stats.symbolic_compiles == 1 and compile_stats.size_specializations == 0
    return [count for symbolic, count in seen if symbolic]


@pytest.mark.parametrize("fn,rewrites", [(hf_bert_padding_mask, 1), (ones_bool_mask, 1),
                                         (hf_arange_mask, 1), (half_ones_mask, 0),
                                         (length_dependent_mask, 0),
                                         (arange_from_one_mask, 0), (causal_by_index, 1),
                                         (hf_gpt2_packed_causal, 1),
                                         (causal_shifted_by_one, 0)])
def test_symbolic_sizes_rewrite_only_masks_proven_at_every_size(fn, rewrites):
    with torch.no_grad():
        assert _symbolic_rewrites(fn, (4, 9, 7)) == [rewrites]
