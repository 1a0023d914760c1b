"""C++ inner loops: values that do not change in an inner loop (a per-channel scale, a mean)
are computed once before it, and a reduction's row split over threads runs along its last
dim without unflattening every element. Results match eager, including where a guarded
(masked) load must stay inside its guard."""
import re

import pytest
import torch
import torch.nn.functional as F

import ember
from ember.testing import check_generated, same


pytestmark = pytest.mark.usefixtures("fresh_no_grad")


check = check_generated     # the result equals eager's; returns the generated code


def simd_loop_bodies(code: str) -> list[str]:
    """The text of each ``#pragma omp simd`` loop (up to its closing brace)."""
    bodies = []
    for m in re.finditer(r"#pragma omp simd[^\n]*\n(\s*)for [^\n]*\{\n", code):
        indent = m.group(1)
        end = code.index("\n" + indent + "}", m.end())
        bodies.append(code[m.end():end])
    return bodies


def test_per_channel_values_move_out_of_the_inner_loop():
    # batch norm backward's shape: a per-channel where() of a per-(n, c) value
    def fn(x, mean, var, w, b, g):
        y = torch.relu((x - mean) * torch.rsqrt(var + 1e-5) * w + b)
        return torch.where(y <= 0, torch.zeros_like(y), g / 256.0)

    c = 16
    x = torch.randn(4, c, 16, 16)
    per_c = [torch.randn(1, c, 1, 1) for _ in range(4)]
    per_c[1] = per_c[1].abs()
    g = torch.randn(4, c, 1, 1)
    code = check(fn, x, *per_c, g)
    bodies = simd_loop_bodies(code)
    assert bodies
    for body in bodies:
        assert "std::sqrt" not in body     # the rsqrt is per channel
        # every load in the loop reads along its variable
        for load in re.findall(r"p_\w+\[([^\]]*)\]", body):
            assert re.search(r"\br\d", load), load


def test_masked_loads_stay_inside_their_guard():
    # pad (of a dim of the outer loops) reads the per-channel value only inside the padded
    # region's guard
    def fn(x, w):
        return F.pad(x * w, (0, 0, 2, 3)) + 1

    x = torch.randn(3, 8, 40)
    w = torch.randn(1, 8, 1)
    code = check(fn, x, w)
    assert "if (" in code


@pytest.mark.parametrize("pad", [(2, 3), (0, 5), (4, 0)])
def test_inner_loop_splits_where_padding_and_data_meet(pad):
    """Padding along the inner loop's dim: one loop per region, the data's with a plain
    load and the padding's with none, and no guard at all."""
    def fn(x, w):
        return F.pad(x * w, pad, value=-1.5) + 1

    x = torch.randn(3, 8, 40)
    w = torch.randn(1, 8, 1)
    code = check(fn, x, w)
    bodies = simd_loop_bodies(code)
    assert "if (" not in code and len(bodies) == 1 + sum(p > 0 for p in pad), code
    assert sum("p_arg0[" in body for body in bodies) == 1, code


def test_channels_last_concatenation_loads_one_part_per_loop():
    def fn(a, b, c):
        return torch.cat([a.relu(), b * 2, torch.sigmoid(c)], 1)

    a, b, c = (torch.randn(2, ch, 5, 5).contiguous(memory_format=torch.channels_last)
               for ch in (16, 24, 8))
    code = check(fn, a, b, c)
    bodies = simd_loop_bodies(code)
    assert "if (" not in code and len(bodies) == 3, code
    for body, arg in zip(bodies, ("p_arg0[", "p_arg1[", "p_arg2[")):
        assert body.count("p_arg") == 1 and arg in body, body


def test_per_channel_costly_values_of_channels_last_data_are_computed_once():
    # inference batch norm + SiLU over channels-last data: the channel is the inner loop, so
    # 1 / sqrt(var + eps) would be computed per element; it is computed per channel before
    # the outer loops, by the same code (the same bits as without the precompute)
    def fn(x, mean, var, w, b):
        return F.silu(F.batch_norm(x, mean, var, w, b, training=False))

    c = 144
    x = torch.randn(2, c, 12, 12).contiguous(memory_format=torch.channels_last)
    mean, w, b = torch.randn(c), torch.rand(c) + 0.5, torch.randn(c)
    var = torch.rand(c) + 0.5
    code = check(fn, x, mean, var, w, b)
    assert re.search(r"float h_tmp\d+\[144\];", code)
    for body in simd_loop_bodies(code):
        if "h_tmp" in body and "x0" in body:        # the per-element loop
            assert "std::sqrt" not in body and " / " not in body.split("ember_sigmoid")[0]


def test_values_under_a_mask_are_not_precomputed():
    # the padded channels' loads are guarded by the mask: computing them for every channel
    # ahead of the loop would read past the end of ``w``
    def fn(x, w):
        return x / torch.sqrt(F.pad(w, (0, 44), value=1.0))

    x, w = torch.randn(300, 144), torch.rand(100) + 0.5
    code = check(fn, x, w)
    assert "h_tmp" not in code
    # the loop splits where w ends: only the first piece reads it, and needs no guard
    first, padded = simd_loop_bodies(code)
    assert "for (int64_t r0 = 0; r0 < 100; r0++)" in code and \
        "for (int64_t r0 = 100; r0 < 144; r0++)" in code, code
    assert "p_arg1[" in first and "p_arg1[" not in padded, code


@pytest.mark.parametrize("shape,dims", [
    ((16, 8, 64, 64), (0, 2, 3)),      # batch norm statistics: chunks inside one row
    ((3, 5, 4999), (0, 2)),            # chunks that cross rows of odd length
    ((7, 3, 37, 41), (0, 2, 3)),       # three inner dims
])
def test_split_reductions_over_several_dims_match_eager(shape, dims):
    x = torch.randn(shape) + 2

    def fn(t):
        mean = t.mean(dims, keepdim=True)
        return ((t - mean) ** 2).sum(dims), t.amax(dims), t.sum(dims)

    code = check(fn, x, rtol=1e-4, atol=1e-3)
    assert "chunk" in code                    # split over threads
    assert "r_seg" in code                    # ... in runs along the last dim
    assert not re.search(r"r_lin %", code)    # no per-element unflattening


def test_training_step_with_batch_norm_matches_eager():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.BatchNorm2d(8),
                                torch.nn.ReLU(), torch.nn.Conv2d(8, 4, 3, stride=2))
    x = torch.randn(6, 3, 20, 20)
    ref = torch.nn.Sequential(*[m for m in __import__("copy").deepcopy(model)])
    with torch.enable_grad():
        compiled = ember.compile(model, backend="ember")
        out = compiled(x)
        out.square().sum().backward()
        expected = ref(x)
        expected.square().sum().backward()
    assert same(expected, out, rtol=1e-4, atol=1e-4)
    for p, q in zip(model.parameters(), ref.parameters()):
        assert same(q.grad, p.grad, rtol=1e-3, atol=1e-3)
    for a, b in zip(model.buffers(), ref.buffers()):
        assert same(b, a, rtol=1e-5, atol=1e-5)
