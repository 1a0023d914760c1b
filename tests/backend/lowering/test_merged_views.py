"""A body read through a view that merges its outer dims ([B, T, C] as [B*T, C]): each load
divides the merged row index back into the body's dims, and an index that multiplies those
parts back by contiguous strides is folded to the row index again (``ir.fold_div_mod``), so
the kernel's loads are plain (and a GPU's contiguity analysis sees them so)."""
import pytest
import sympy
import torch

import ember
from ember import config
from ember.backend import compile as backend_compile
from ember.backend.ir import FloorDiv, Layout, ModIndex, fold_div_mod
from ember.testing import same

o, r = sympy.symbols("o r", integer=True, nonnegative=True)


def test_a_split_row_index_multiplied_back_by_its_strides_is_the_row_index():
    c = 768
    assert fold_div_mod(151296 * FloorDiv(o, 197) + 768 * ModIndex(o, 197) + r) == \
        768 * o + r
    # three merged dims: (o // 12, (o // 4) % 3, o % 4) with strides (12c, 4c, c)
    index = 12 * c * FloorDiv(o, 12) + 4 * c * ModIndex(FloorDiv(o, 4), 3) + \
        c * ModIndex(o, 4) + r + 7
    assert fold_div_mod(index) == c * o + r + 7


def test_the_inner_parts_of_a_split_index_fold_to_a_remainder():
    """``x % a + a * ((x // a) % b)`` is ``x % (a * b)``: the inner dims of a row index that
    a permuted view reads in another order (a window partition's rows) fold without the
    outer ones."""
    assert fold_div_mod(8 * ModIndex(FloorDiv(o, 8), 7) + ModIndex(o, 8) + r) == \
        ModIndex(o, 56) + r
    assert fold_div_mod(56 * ModIndex(FloorDiv(o, 56), 8) + 8 * ModIndex(FloorDiv(o, 8), 7)
                        + ModIndex(o, 8)) == ModIndex(o, 448)
    assert fold_div_mod(3 * ModIndex(FloorDiv(o, 4), 4) + ModIndex(o, 4)) == \
        3 * ModIndex(FloorDiv(o, 4), 4) + ModIndex(o, 4)          # strides not contiguous


def test_parts_with_other_strides_stay_divided():
    index = 100 * FloorDiv(o, 197) + ModIndex(o, 197)       # a transposed read
    assert fold_div_mod(index) == index
    assert FloorDiv(FloorDiv(o, 4), 3) == FloorDiv(o, 12)


def test_a_layout_indexed_through_a_merged_view_reads_plain_rows():
    import torch
    size, stride = [2, 197, 768], [151296, 768, 1]
    layout = Layout(torch.device("cpu"), torch.float32, [sympy.Integer(n) for n in size],
                    [sympy.Integer(n) for n in stride])
    assert layout.index([FloorDiv(o, 197), ModIndex(o, 197), r]) == 768 * o + r


@pytest.mark.parametrize("layout", [torch.contiguous_format, torch.channels_last])
def test_batch_norm_statistics_read_a_bf16_convolution_through_the_merged_view(
        cpu_backend, layout, monkeypatch):
    """A training step's batch norm reduces its float32 cast of a bf16 convolution output
    over ``[N, C, H*W]`` (``aot/reductions.py``): the view is read through, the cast
    folded into the statistics' kernel, so the forward stores no float32 copy of the
    activations (it did: one more kernel and pass per batch norm). Gradients as eager's."""
    if cpu_backend == "triton":
        pytest.skip("Triton's interpreter computes half precision wrongly, so its target "
                    "leaves bf16 graphs to ATen (the C++ target runs this case)")
    from ember.backend.targets import CpuPolicy     # a bf16 convolution, as on AVX-512
    monkeypatch.setattr(CpuPolicy, "upcasts_half_matmuls", lambda self, dtype: False)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Conv2d(8, 8, 3, padding=1, bias=False),
                                torch.nn.BatchNorm2d(8), torch.nn.ReLU()).bfloat16()
    x = torch.randn(2, 8, 12, 12, dtype=torch.bfloat16).contiguous(memory_format=layout)
    # (layout off: the graph keeps the captured layout, whose kernels this test counts;
    # under auto a CPU training graph with small weights goes channels-last, adding its
    # layout copies)
    with config.patch(suppress_errors=False, layout_optimization="off"), torch.enable_grad():
        ember.reset()
        compiled = ember.compile(model, backend="ember")
        backend_compile.generated_sources.clear()
        out = compiled(x)
        out.float().square().mean().backward()
        grads = [p.grad.clone() for p in model.parameters()]
        sources = list(backend_compile.generated_sources)
        model.zero_grad()
        expected = model(x)
        expected.float().square().mean().backward()
    assert same(expected, out, rtol=2e-2, atol=2e-2)
    for g, p in zip(grads, model.parameters()):
        assert same(p.grad, g, rtol=5e-2, atol=5e-2)
    forward = next(s for s in sources if "def call(" in s and "aten.convolution.default" in s
                   and "convolution_backward" not in s)
    launches = [line for line in forward.split("def call(")[-1].splitlines()
                if line.strip().startswith("ember_")]
    # the statistics, the normalize + ReLU, num_batches_tracked += 1 (no layout copies)
    assert len(launches) == 3, launches
