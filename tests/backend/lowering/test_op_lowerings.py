"""Regressions for bugs found by the full OpInfo run (``tests/backend/opinfo/test_opinfo.py``):
each test compiles a small function with the "ember" backend and compares it with eager, on
both CPU targets (the ``cpu_backend`` fixture, ``conftest.py``)."""
from __future__ import annotations

import pytest
import torch

import ember

pytestmark = pytest.mark.usefixtures("cpu_backend")


def _copy(t):
    """A copy with its own storage and the same offset, sizes and strides."""
    if not isinstance(t, torch.Tensor):
        return t
    out = torch.empty(0, dtype=t.dtype)
    out.set_(t.untyped_storage().clone(), t.storage_offset(), t.size(), t.stride())
    return out


def _check(fn, *inputs, **tol):
    """Compiled vs eager on copies of ``inputs``: outputs and inputs after the call."""
    eager_in = [_copy(x) for x in inputs]
    comp_in = [_copy(x) for x in inputs]
    ember.reset()
    want = fn(*eager_in)
    got = ember.compile(fn, backend="ember")(*comp_in)
    torch.testing.assert_close(got, want, equal_nan=True, **tol)
    for a, b in zip(comp_in, eager_in):
        if isinstance(b, torch.Tensor):
            torch.testing.assert_close(a, b, equal_nan=True, **tol)
    return got, comp_in


def test_returned_inplace_result_is_the_input():
    # aot: the output of ``x.acos_()`` was recomputed from x after x was overwritten
    x = torch.rand(20) * 2 - 1
    got, (arg,) = _check(lambda t: t.acos_(), x)
    assert got is arg
    _check(lambda a, b: a.add_(b, alpha=2), torch.randn(4, 5), torch.randn(5))


def test_inplace_op_whose_overload_name_is_another_op():
    # aot: ``ldexp_.default``'s functional twin was taken as ``aten::ldexp(float, int)``
    _check(lambda a, b: a.ldexp_(b), torch.randn(5), torch.randint(-3, 3, (5,)).float())


def test_as_strided_offset_counts_from_the_storage_start():
    # views.py: as_strided's storage_offset was taken relative to the input's own offset
    base = torch.randn(30)
    x = base[5:15]
    _check(lambda t: torch.as_strided(t, (2, 2), (1, 2), 0), x)
    _check(lambda t: torch.as_strided(t, (2, 2), (1, 2), 10), x)
    _check(lambda t: torch.as_strided(t, (2, 2), (1, 2)), x)
    # a view of an intermediate: the storage is the intermediate's, not the view's copy
    _check(lambda t: torch.as_strided((t + 1)[2:], (2, 2), (1, 2), 1), x)
    _check(lambda t: torch.as_strided((t + 1).view(2, 5).t(), (2, 2), (1, 2), 1) * 2, x)


def test_integer_pow():
    # pointwise.py: integer pow went through std::pow (double): 0 ** -1 gave INT64_MIN
    x = torch.tensor([0, 1, -1, 2, -3, 7, 0, 5])
    e = torch.tensor([-1, -3, -5, -2, 3, 30, 0, 40])
    _check(lambda a, b: a ** b, x, e)
    _check(lambda a, b: torch.pow(2, b), x, e)
    _check(lambda a: a ** 3 + a ** 0 + a ** 45, x)


def test_max_unpool_channels_last():
    # decomp: max_unpool2d's CPU kernel returns channels-last for a channels-last input, its
    # meta kernel a contiguous tensor (the fallback's layout check raised)
    x = torch.randn(1, 2, 4, 6)
    out, idx = torch.nn.functional.max_pool2d(x, 2, return_indices=True)
    out = out.contiguous(memory_format=torch.channels_last)
    idx = idx.contiguous(memory_format=torch.channels_last)
    _check(lambda o, i: torch.nn.functional.max_unpool2d(o, i, 2), out, idx)


def test_new_filled():
    _check(lambda a: a.new_zeros((2, 3)) + a.new_ones(3) + a.new_full((3,), 2.5),
           torch.randn(3))


def test_inplace_op_whose_functional_twin_orders_arguments_differently():
    # aot: ``polygamma_(self, n)`` is ``polygamma(n, self)``; ``square_`` is ``pow_.Scalar``,
    # whose same-named overload ``pow.Scalar`` takes (Scalar self, Tensor exponent)
    _check(lambda a: a.polygamma_(2), torch.rand(6) + 0.5, rtol=1e-4, atol=1e-4)
    _check(lambda a: a.square_(), torch.randn(6))


def test_inplace_op_with_a_default_its_functional_twin_lacks():
    # aot: ``bernoulli_.float(self, p=0.5)`` became ``bernoulli.p(self)`` (p is required)
    def f(a):
        return a.bernoulli_()
    x = torch.rand(64)
    torch.manual_seed(0)
    want = f(x.clone())
    ember.reset()
    compiled = ember.compile(f, backend="ember")
    torch.manual_seed(0)
    got = compiled(x.clone())
    assert got.shape == want.shape and got.dtype == want.dtype
    assert set(got.unique().tolist()) <= {0.0, 1.0}


def test_unbind_is_a_view_not_a_fallback():
    from ember.backend import compile_stats
    w = torch.randn(48, 16)

    def attention_inputs(x):
        qkv = (x @ w.t()).reshape(2, 5, 3, 4, 4).permute(2, 0, 3, 1, 4)
        q, k, v = qkv.unbind(0)
        return (q * 2 + k).softmax(-1) * v, (x * 3).unbind(1)[2]
    x = torch.randn(2, 5, 16)
    ember.reset()
    compiled = ember.compile(attention_inputs, backend="ember")
    with torch.no_grad():
        torch.testing.assert_close(compiled(x), attention_inputs(x))
    assert not any("unbind" in op for op in compile_stats.fallback_ops)


def test_functional_copy_broadcasts_and_casts():
    from ember.backend import compile_stats

    def fn(x, y):
        z = x * 2
        z.copy_(y)             # a view-free in-place copy inside the graph: aten.copy
        return z + 1
    x, y = torch.randn(4, 6, dtype=torch.float64), torch.randn(6)
    ember.reset()
    compiled = ember.compile(fn, backend="ember")
    with torch.no_grad():
        torch.testing.assert_close(compiled(x, y), fn(x, y))
    assert not compile_stats.fallback_ops


def test_reduction_of_a_0d_tensor_over_dim_0():
    # reductions: _dims turned dim=0 of a 0-d tensor into a reduced dim 0 the tensor lacks
    # (IndexError in the lowering or its body); the reduction is over the one element
    x = torch.tensor(3.5)
    for op in (torch.sum, torch.mean, torch.amax, torch.amin, torch.any, torch.prod):
        _check(lambda t, op=op: op(t, 0, keepdim=True), x)
        _check(lambda t, op=op: op(t, -1), x)
    _check(lambda t: (torch.var(t, 0), torch.std(t, -1, keepdim=True)), x)


def test_index_select_and_gather_of_a_0d_tensor(cpu_backend):
    # indexing: x.get_size()[dim] of a 0-d x raised IndexError in the lowering
    x = torch.tensor(5.0)
    _check(lambda t, i: torch.index_select(t, 0, i), x, torch.tensor([0]))
    _check(lambda t, i: torch.index_select(t, -1, i), x, torch.tensor(0))
    _check(lambda t, i: torch.gather(t, 0, i), x, torch.tensor(0))
    _check(lambda t, i: torch.gather(t, 0, i), x, torch.tensor([0, 0]))
    _check(lambda t, i: torch.gather(t, 0, i), torch.tensor([5.0, 6.0]), torch.tensor(1))
    ember.reset()
    compiled = ember.compile(lambda t, i: torch.index_select(t, 0, i))
    with pytest.raises(IndexError):   # the index is still checked (both CPU targets)
        compiled(x, torch.tensor([1]))


def test_kernel_reads_a_graph_constant():
    """``x[[1, 2]]``: the index list is a constant tensor of the graph, read by the kernel
    (its dtype was missing from the code generator's table: KeyError)."""
    from ember.backend import compile_stats
    ember.reset()
    x = torch.randn(4, 3)
    out = ember.compile(lambda t: t[[1, 2]] * 2)(x)
    assert torch.equal(out, x[[1, 2]] * 2)
    assert compile_stats.generated_kernel_count == 1


def test_bugs_the_triton_sweep_found():
    """Found by the Triton target's OpInfo run (``test_opinfo_triton.py``); each was a
    Triton-only failure, checked here on both targets."""
    # argmax over a size-1 dim is 0: the kernel without an inner loop stored the value
    _check(lambda t: (t.argmax(2, keepdim=True), t.argmin(1)), torch.randn(3, 2, 1, 2))
    # a part of a cat read at a constant index under the part's mask (column_stack of a
    # 0-d tensor): the mask was a block, the pointer a scalar
    _check(lambda a, b: torch.cat([a.reshape(1), b]) * 2, torch.tensor(0.5), torch.randn(6))
    # bool accumulation (scatter_add, index_put): Triton has no atomic_add on int1
    idx = torch.tensor([[0, 1, 1], [2, 0, 0]])
    _check(lambda t, i, s: t.scatter_add(1, i, s), torch.zeros(2, 3, dtype=torch.bool), idx,
           torch.tensor([[True, False, True], [False, False, True]]))
    # sign of bools, rounding of integers, and an index constant (max_pool1d's indices)
    _check(lambda t: (torch.sign(t > 0), torch.round(t.long()), torch.floor(t.int())),
           torch.randn(8) * 5)
    _check(lambda t: torch.nn.functional.max_pool1d(t, 3, 2, return_indices=True),
           torch.randn(1, 2, 3))
    # a 0-d comparison beside a block in & | ^ and pow (the interpreter broadcast it as
    # numbers)
    _check(lambda a, b: ((a > 0) ^ (b > 0), torch.logical_and(a, b), b ** a),
           torch.tensor(2.0), torch.randn(7))


@pytest.mark.parametrize("fn", [torch.maximum, torch.minimum, torch.atan2, torch.hypot])
def test_default_overload_binary_ops_are_lowered(fn):
    """maximum/minimum/atan2/hypot have only a ``.default`` overload: they were never
    registered (every call ran ATen) and now fuse, NaN rules included."""
    from ember.backend import compile_stats
    ember.reset()
    a, b = torch.randn(6, 5), torch.randn(5)
    a[0, 0] = float("nan")
    out = ember.compile(lambda x, y: fn(x, y) * 2)(a, b)
    torch.testing.assert_close(out, fn(a, b) * 2, equal_nan=True)
    assert compile_stats.generated_kernel_count == 1 and not compile_stats.fallback_ops


def _splits(x, y):
    a, b, c = (x @ y).split(4, dim=1)            # pieces of a library result: views
    d, e = (x * 2).split([3, 5], dim=1)          # of a fused body: index views
    p, q = (x + 1).split(5, dim=-1)              # a shorter last piece
    return a + 1, b * c, d.sum(1), e, p, q


def test_split_is_views_not_a_fallback(cpu_backend):
    from ember.backend import compile_stats
    x, y = torch.randn(6, 8), torch.randn(8, 12)
    ember.reset()
    compile_stats.reset()
    out = ember.compile(_splits, options={"cpu_backend": cpu_backend})(x, y)
    for got, want in zip(out, _splits(x, y)):
        torch.testing.assert_close(got, want)
    assert not compile_stats.fallback_ops, dict(compile_stats.fallback_ops)


def _lowered_families(x, y, m):
    return (torch.fmax(x, y), torch.fmin(x, y), torch.floor_divide(x, y), torch.tril(m, 1),
            torch.triu(m, -1), torch.roll(m, 2, 1), torch.roll(m, (1, -2), (0, 1)),
            m.repeat(2, 1, 3), torch.nn.functional.normalize(m, dim=1),
            torch.linalg.vector_norm(m, float("inf"), dim=0), torch.linalg.vector_norm(m, 0),
            torch.linalg.vector_norm(m, 3, dim=1, keepdim=True), torch.norm(m))


def test_norms_triangles_rolls_repeats_fmax_are_kernels(cpu_backend):
    """Lowered, not ATen fallbacks: fmax/fmin (NaN loses to a number), floor_divide,
    tril/triu, roll, repeat, linalg_vector_norm (F.normalize, torch.norm)."""
    from ember.backend import compile_stats
    x, y = torch.randn(10), torch.randn(10)
    x[2] = float("nan")
    y[3] = float("nan")
    x[5] = y[5] = float("nan")
    m = torch.randn(5, 7)
    m[1, 2] = 0
    ember.reset()
    compile_stats.reset()
    out = ember.compile(_lowered_families, options={"cpu_backend": cpu_backend})(x, y, m)
    for got, want in zip(out, _lowered_families(x, y, m)):
        torch.testing.assert_close(got, want, equal_nan=True)
    assert not compile_stats.fallback_ops, dict(compile_stats.fallback_ops)


def _more_families(x, m, s2):
    return (torch.std_mean(m, dim=1), torch.aminmax(m, dim=1), torch.aminmax(x),
            torch.diagonal(m * 2, 1), torch.diagonal(m, -2, 0, 1),
            torch.slice_scatter(m * 1, s2, 1, 1, 7, 2),
            torch.slice_scatter(m + 0, m[1:3] * 3, 0, 1, 3))


def test_std_mean_aminmax_diagonal_slice_scatter_are_kernels(cpu_backend):
    from ember.backend import compile_stats
    x, m, s2 = torch.randn(11), torch.randn(5, 7), torch.randn(5, 3)
    ember.reset()
    compile_stats.reset()
    out = ember.compile(_more_families, options={"cpu_backend": cpu_backend})(x, m, s2)
    torch.testing.assert_close(out, _more_families(x, m, s2))
    assert not compile_stats.fallback_ops, dict(compile_stats.fallback_ops)


def _index_adds(x, i, s, s1):
    return (x.index_add(0, i, s), x.index_add(1, i[:3], s1, alpha=2.5),
            (x * 2).index_add(-1, i[:3], s1))


def test_index_add_accumulates_repeated_indices(cpu_backend):
    from ember.backend import compile_stats
    x, s, s1 = torch.randn(6, 5), torch.randn(5, 5), torch.randn(6, 3)
    i = torch.tensor([0, 2, 2, 4, 1])
    ember.reset()
    compile_stats.reset()
    out = ember.compile(_index_adds, options={"cpu_backend": cpu_backend})(x, i, s, s1)
    torch.testing.assert_close(out, _index_adds(x, i, s, s1))
    assert not compile_stats.fallback_ops, dict(compile_stats.fallback_ops)


def _used_and_returned(x, w):
    y = x.sin() * 2
    return torch.mm(y, w), y


def test_value_read_by_a_library_call_and_returned_is_one_buffer(cpu_backend):
    """Realized once for the matmul and reused as the output (it was written twice)."""
    from ember.backend import compile as backend_compile
    x, w = torch.randn(4, 6), torch.randn(6, 3)
    ember.reset()
    out = ember.compile(_used_and_returned, options={"cpu_backend": cpu_backend})(x, w)
    torch.testing.assert_close(out, _used_and_returned(x, w))
    wrapper = [s for s in backend_compile.generated_sources if "def call(" in s][-1]
    assert wrapper.count("empty_strided((4, 6)") == 1, wrapper


@pytest.mark.parametrize("power", [2, 3, 3.0, 0.5, -0.5, -1, -2.0])
def test_constant_powers_compute_like_eager_without_pow(power, cpu_backend):
    """x ** 3 (GPT-2's tanh-GELU) and the other powers ATen special-cases are products,
    roots and reciprocals, in ATen's order: no general pow (a log and an exp per element)."""
    from ember.testing import run_and_get_code
    x = torch.rand(300) * 4 + 0.1
    x[:3] = torch.tensor([0.0, -0.0, float("inf")])
    ember.reset()
    got, sources = run_and_get_code(lambda t: (t - 1) ** power, x)
    torch.testing.assert_close(got, (x - 1) ** power, equal_nan=True)
    assert "pow(" not in "\n".join(sources)     # the wrapper and each kernel's source


def test_select_scatter_is_a_generated_kernel():
    """``select``'s backward (a ViT's class token): the row or column is replaced, negative
    indices count from the end, and no ATen call remains."""
    from ember.backend import compile_stats
    x = torch.randn(4, 5, 6)
    for dim, index in [(0, 2), (1, -1), (-1, 0)]:
        src = torch.randn(x.select(dim, index).shape)
        compile_stats.fallback_ops.clear()
        _check(lambda a, b: torch.select_scatter(a, b, dim, index) * 2, x, src)
        assert not compile_stats.fallback_ops, dict(compile_stats.fallback_ops)


def _advanced_indexing(x, rows, cols):
    import torch.nn.functional as F
    return (x[:, :, rows, cols] * 2, x[torch.tensor([1, 0, 1])] + 1,
            x[:, torch.tensor([2, 0], dtype=torch.int32), torch.tensor([1, -3])],
            F.interpolate(x, scale_factor=2, mode="bilinear", align_corners=False),
            F.interpolate(x.contiguous(memory_format=torch.channels_last), size=(13, 17),
                          mode="bilinear", align_corners=True))


def test_index_tensors_on_adjacent_dims_are_one_gather_kernel(cpu_backend):
    """``x[:, :, rows, cols]`` with broadcast index tensors (and negative ones), and the
    ``_unsafe_index`` a bilinear upsample decomposes into, are generated gathers: they
    were ATen calls, 1.7 ms each in deeplabv3's head (four per upsample)."""
    from ember.backend import compile_stats
    x = torch.randn(2, 3, 8, 9)
    rows, cols = torch.tensor([[0], [3], [7], [-1]]), torch.tensor([1, 8, 0, -2, 4])
    ember.reset()
    compile_stats.reset()
    out = ember.compile(_advanced_indexing, options={"cpu_backend": cpu_backend})(x, rows, cols)
    for got, want in zip(out, _advanced_indexing(x, rows, cols)):
        torch.testing.assert_close(got, want)
    assert not compile_stats.fallback_ops, dict(compile_stats.fallback_ops)
    # index tensors apart from each other (NumPy moves their dims to the front): ATen
    _check(lambda t: t[torch.tensor([0, 1]), :, torch.tensor([2, 5])] * 3, x)


def test_weight_norm_is_a_fused_norm_and_product_not_an_aten_call():
    """``weight_norm`` (Wav2Vec2's positional convolution): ``_weight_norm_interface`` is
    decomposed into a norm reduction and a pointwise op (ATen's CPU kernel took 5.6 ms of an
    80 ms call); results match eager."""
    from ember.backend import compile_stats
    torch.manual_seed(0)
    conv = torch.nn.utils.parametrizations.weight_norm(
        torch.nn.Conv1d(8, 8, 5, padding=2, groups=2), name="weight", dim=2)
    x = torch.randn(2, 8, 16)
    ember.reset()
    compile_stats.reset()
    with torch.no_grad():
        torch.testing.assert_close(ember.compile(conv)(x), conv(x), rtol=1e-5, atol=1e-5)
    fallbacks = compile_stats.fallback_ops
    assert not any("weight_norm" in op for op in fallbacks), fallbacks
    assert compile_stats.generated_kernel_count >= 1


@pytest.mark.parametrize("variant", ["fast-path", "masked", "with-weights"])
def test_multi_head_attention_fast_path_runs_as_its_parts(variant):
    """``nn.MultiheadAttention``'s inference fast path (torchvision's ViT) is decomposed into
    its projections and ``scaled_dot_product_attention``; a masked call or one that returns
    the attention weights keeps ATen's kernel (or the module's slow path). All match eager,
    the masked call's undefined weights (None, where the meta kernel gives a tensor)
    included."""
    from ember.backend import compile_stats
    torch.manual_seed(0)
    mha = torch.nn.MultiheadAttention(64, 4, batch_first=True).eval()
    mask = torch.rand(10, 10) > 0.8

    def fn(x):
        if variant == "masked":
            return mha(x, x, x, attn_mask=mask, need_weights=False)
        return mha(x, x, x, need_weights=variant == "with-weights")
    x = torch.randn(2, 10, 64)
    ember.reset()
    compile_stats.reset()
    with torch.no_grad():
        expected, actual = fn(x), ember.compile(fn)(x)
    torch.testing.assert_close(actual, expected, rtol=1e-5, atol=1e-5)
    if variant == "masked":
        assert "aten._native_multi_head_attention.default" in compile_stats.fallback_ops
    if variant == "fast-path":
        fallbacks = compile_stats.fallback_ops
        assert not any("multi_head" in op for op in fallbacks), fallbacks


@pytest.mark.parametrize("fn", [lambda a, b: a // 0.3, lambda a, b: a // b,
                                lambda a, b: torch.div(a, b, rounding_mode="floor")],
                         ids=["scalar", "tensor", "div_floor"])
def test_float_floor_division_is_pythons(fn):
    """Floor division of floats is Python's (from the exact remainder), as eager's:
    ``floor(a / b)`` gave -7 for -2.1000001 // 0.3, where the quotient -7.0000002 rounds to
    -7 (found by a random-program fuzz); also the sign of a zero quotient, and b = 0 or inf."""
    torch.manual_seed(0)
    a = torch.cat([torch.tensor([-2.1000001430511475, 0.1, -0.1, 0.0, -0.0, 1.0, -1.0, 0.0,
                                 -5.0, 5.0, 7.5, float("inf")]), torch.randn(4000) * 10])
    b = torch.cat([torch.tensor([0.3, 3.0, 3.0, -3.0, 3.0, 0.0, 0.0, 0.0, float("inf"),
                                 float("-inf"), -2.5, 2.0]), torch.randn(4000)])
    want = fn(a, b)
    ember.reset()
    got = ember.compile(fn, backend="ember")(a, b)
    torch.testing.assert_close(got, want, equal_nan=True, rtol=0, atol=0)
    assert torch.equal(got.signbit(), want.signbit())


@pytest.mark.parametrize("dtype", [torch.uint8, torch.bool, torch.float32])
def test_any_all_keep_eagers_result_dtype(dtype):
    """``any``/``all`` of uint8 values give uint8 in eager (bool otherwise); Ember gave bool."""
    x = torch.randint(0, 3, (6, 3000)).to(dtype)
    x[2] = 1
    for fn in (lambda t: t.any(1), lambda t: t.all(0), lambda t: t.any(),
               lambda t: t.all(1, keepdim=True)):
        _check(fn, x)
        ember.reset()
        assert ember.compile(fn, backend="ember")(x).dtype == fn(x).dtype


def test_uint8_constants_wrap_and_invert():
    """A constant outside uint8's range wraps as eager's cast does (``clamp(-3, 7)`` clamps
    from 253), and ``~`` of uint8 values is all ones xor them; the Triton target printed
    -3 and -1 as uint8 constants, which the interpreter rejected."""
    x = torch.tensor([0, 5, 200, 253, 255] * 40, dtype=torch.uint8)
    _check(lambda t: t.clamp(-3, 7), x)
    _check(lambda t: ~t, x)
    _check(lambda t: (~t.to(torch.int8)) + 1, x)


def test_scatter_into_memory_no_one_reads_after():
    # fuzz: a scatter whose result only zeros_like "reads" (its shape): the zeros it writes
    # into were kept local to their kernel, so the scatter wrote into an unallocated buffer
    def f(t, idx):
        s = torch.zeros(3, 7).scatter(1, idx, t)
        z = torch.zeros_like(s)
        return torch.zeros(3, 9).scatter(1, idx, z + t) * 2
    gen = torch.Generator().manual_seed(0)
    _check(f, torch.randn(3, 7, generator=gen), torch.randint(0, 7, (3, 7), generator=gen))


def test_round_keeps_the_sign_of_zero():
    # fuzz: the interpreter's round half to even gave +0.0 for -0.2, so 1 / round(-0.2) was
    # +inf where eager gives -inf
    x = torch.tensor([0.0, -0.0, 0.3, -0.2, -0.5, 0.5, 1.5, 2.5, -2.5, -1.5, -0.7, 1e30, -3.49,
                      float("inf"), -float("inf"), float("nan")])
    got, _ = _check(lambda t: (torch.round(t), 1 / torch.round(t)), x)
    assert torch.equal(got[0].signbit(), torch.round(x).signbit())


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_sign_of_nan_is_zero(dtype):
    """Eager's sign is ``(0 < x) - (x < 0)`` on CPU and CUDA alike: 0 for NaN, not NaN."""
    x = torch.tensor([float("nan"), -float("nan"), 2.0, -0.5, 0.0, -0.0, float("inf")] * 5,
                     dtype=dtype)
    _check(lambda t: (t.sign(), torch.sgn(t) * 2), x)
