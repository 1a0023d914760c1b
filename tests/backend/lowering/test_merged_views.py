"""A body read through a view that merges its outer dims ([B, T, C] as [B*T, C]): each load
divides the merged row index back into the body's dims, and an index that multiplies those
parts back by contiguous strides is folded to the row index again (``ir.fold_div_mod``), so
the kernel's loads are plain (and a GPU's contiguity analysis sees them so)."""
import sympy

from ember.backend.ir import FloorDiv, Layout, ModIndex, fold_div_mod

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
