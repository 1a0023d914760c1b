"""Column sums accumulated inside a row kernel on the C++ target (``scheduler.Across``).

A split column sum's first half (partial sums over chunks of rows) joins the row kernel that
reads the same elements: layer norm's backward computes its weight and bias gradients in
the loop that computes the input gradient, reading the input and the output gradient once.
Each chunk's rows run in order and its sums fold as the split column kernel's do, so the
results keep that kernel's bits; these tests compare both ways bit for bit, and with eager.
"""
import re

import pytest
import sympy
import torch
import torch.nn.functional as F

import ember
from ember import config
from ember.backend import scheduler
from ember.backend.targets.cpp.target import CppTarget
from ember.testing import run_and_get_code


@pytest.fixture(autouse=True)
def _fresh(monkeypatch):
    monkeypatch.setenv("EMBER_GRAPH_CACHE", "0")
    monkeypatch.setenv("EMBER_EAGER_CHOICE", "off")
    ember.reset()
    with config.patch(suppress_errors=False):
        yield
    ember.reset()


def _layer_norm_grads(shape, dtype=torch.float32):
    torch.manual_seed(0)
    width = shape[-1]
    x = (torch.randn(*shape) * 3 + 1).to(dtype).requires_grad_()
    w = torch.randn(width, dtype=dtype, requires_grad=True)
    b = torch.randn(width, dtype=dtype, requires_grad=True)
    g = torch.randn(*shape, dtype=dtype)

    def step(x, w, b, g):
        out = F.layer_norm(x, (width,), w, b)
        return torch.autograd.grad(out, (x, w, b), g)
    return step, (x, w, b, g)


def _kernels(sources) -> str:
    return "\n".join(s for s in sources if 'extern "C"' in s)


def _without_across(monkeypatch, fn, args):
    ember.reset()
    monkeypatch.setattr(CppTarget, "sums_across_rows", False)
    try:
        got, sources = run_and_get_code(fn, *args)
    finally:
        monkeypatch.setattr(CppTarget, "sums_across_rows", True)
    return got, _kernels(sources)


def _both_ways(monkeypatch, fn, args, rtol=None, atol=None):
    """``fn(*args)`` compiled with the across sums (asserted present) and without: the same
    bits, and (given ``rtol``) close to eager's. Returns both ways' kernels."""
    got, sources = run_and_get_code(fn, *args)
    fused = _kernels(sources)
    assert "x_chunk" in fused, fused
    split, unfused = _without_across(monkeypatch, fn, args)
    for a, b in zip(got, split):
        assert torch.equal(a, b)
    if rtol is not None:
        for a, b in zip(got, fn(*args)):
            torch.testing.assert_close(a, b, rtol=rtol, atol=atol)
    return got, fused, unfused


def _strided_twice(kernels: str) -> list[str]:
    """The buffers some kernel reads at two indices that differ by more than a constant."""
    found = []
    for kernel in kernels.split('extern "C"')[1:]:
        indices: dict[str, set] = {}
        for name, index in re.findall(r"(p_\w+)\[([^\]]+)\]", kernel):
            indices.setdefault(name, set()).add(sympy.sympify(index.replace("/", "//")))
        found += [name for name, seen in indices.items()
                  if any((a - b).free_symbols for a in seen for b in seen)]
    return found


# (8, 256, 256): the [8 chunks, 256 columns] x [256 rows] sums have the shape of the row
# kernel's [8, 256] x [256] loops, along other dims; a 2-D grid of rows, flattened
@pytest.mark.parametrize("shape", [(2048, 256), (4096, 96), (2048, 1000), (8, 256, 256)],
                         ids=lambda s: "x".join(map(str, s)))
def test_layer_norm_weight_grads_join_the_input_grad_kernel_with_the_same_bits(
        shape, monkeypatch):
    step, args = _layer_norm_grads(shape)
    _, fused, unfused = _both_ways(monkeypatch, step, args, rtol=1e-4, atol=1e-3)
    assert not _strided_twice(fused), fused
    assert "x_chunk" not in unfused
    assert not _strided_twice(unfused), unfused
    assert fused.count('extern "C"') < unfused.count('extern "C"')


def test_bfloat16_layer_norm_grads_keep_their_bits(monkeypatch):
    step, args = _layer_norm_grads((2048, 128), torch.bfloat16)
    got, _, _ = _both_ways(monkeypatch, step, args)
    # eager's CPU kernel sums the bf16 weight gradients far less exactly (8.4 off where
    # these are 0.34): each result is compared with float64's, as close as eager's or closer
    exact = step(*[t.double().detach().requires_grad_(t.requires_grad) for t in args])
    for a, e, ref in zip(got, step(*args), exact):
        assert (a.double() - ref).abs().max() <= (e.double() - ref).abs().max()


def _row_and_column_sums(x, y):
    p = x * y
    return p.sum(1), p.sum(0), (x - y).abs().amax(1)


def test_row_and_column_sums_of_one_product_read_it_once(monkeypatch):
    torch.manual_seed(1)
    x, y = torch.randn(4096, 64), torch.randn(4096, 64)
    with torch.no_grad():
        _, kernels, _ = _both_ways(monkeypatch, _row_and_column_sums, (x, y),
                                   rtol=1e-5, atol=1e-4)
    assert kernels.count('extern "C"') == 2 and "x_chunk" in kernels, kernels


def test_few_chunks_keep_the_row_kernels_threads():
    # 1024 rows split in 4 chunks: fewer than ACROSS_MIN_CHUNKS for the kernel's threads
    assert 4 < scheduler.ACROSS_MIN_CHUNKS
    torch.manual_seed(2)
    x, y = torch.randn(1024, 256), torch.randn(1024, 256)
    with torch.no_grad():
        got, sources = run_and_get_code(_row_and_column_sums, x, y)
    assert "x_chunk" not in _kernels(sources)
    for a, b in zip(got, _row_and_column_sums(x, y)):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-4)


def test_column_sums_of_a_value_the_kernel_makes_take_it_where_it_is_made(monkeypatch):
    # softmax's result is made in the row kernel's last loop, after the row's max and sum:
    # its column sums accumulate there, from registers
    torch.manual_seed(3)
    x = torch.randn(4096, 128)

    def fn(x):
        s = torch.softmax(x, -1)
        return s, s.sum(0)
    with torch.no_grad():
        _both_ways(monkeypatch, fn, (x,), rtol=1e-5, atol=1e-4)


def test_column_sums_of_a_row_statistic_read_it_after_it_is_made(monkeypatch):
    # the column sums read each row's mean, finished by the row kernel's first loop
    torch.manual_seed(4)
    x = torch.randn(4096, 64) + 2

    def fn(x):
        centred = x - x.mean(1, keepdim=True)
        return (centred * x).sum(0), (x * 3).sum(0), centred.amax(1)
    with torch.no_grad():
        _both_ways(monkeypatch, fn, (x,), rtol=1e-5, atol=1e-3)


def test_channels_last_batch_norm_sums_relus_gradient_where_it_is_made(monkeypatch):
    # the pointwise kernel of ReLU's masked gradient runs over logical [N, C, H] x [W];
    # the split sums over channels-last rows take it in store order, [N, H, W] x [C]
    torch.manual_seed(5)
    x = torch.randn(16, 32, 28, 28).to(memory_format=torch.channels_last).requires_grad_()
    w, b = torch.randn(32, requires_grad=True), torch.randn(32, requires_grad=True)
    g = torch.randn(16, 32, 28, 28).to(memory_format=torch.channels_last)

    def step(x, w, b, g):
        out = F.relu(F.batch_norm(x, None, None, w, b, training=True))
        return torch.autograd.grad(out, (x, w, b), g)
    _, fused, _ = _both_ways(monkeypatch, step, (x, w, b, g), rtol=1e-4, atol=1e-3)
    assert "x_chunk" in fused and "x_flat" in fused, fused
