"""The ember backend on CPU: generated kernels match eager, and fusion gives the kernel
counts it should (a pointwise chain is one kernel, softmax and layer_norm one each).

Every test runs on both CPU targets (the ``cpu_backend`` fixture, ``conftest.py``): C++
kernels, and Triton kernels under Triton's interpreter; the counts are the same on both."""
import re

import pytest
import torch
import torch.nn.functional as F

import ember
from ember import config
from ember.backend import compile_stats
from ember.testing import run_and_get_code, same


pytestmark = pytest.mark.usefixtures("cpu_backend")


@pytest.fixture(autouse=True)
def _fresh():
    ember.reset()
    with config.patch(suppress_errors=False), torch.no_grad():
        yield


def run(fn, *inputs, rtol=1e-5, atol=1e-5):
    """Compile with the ember backend, compare with eager, return the kernels generated."""
    ember.reset()
    compiled = ember.compile(fn, backend="ember")
    expected = fn(*[t.clone() for t in inputs])
    actual = compiled(*[t.clone() for t in inputs])
    assert same(expected, actual, rtol=rtol, atol=atol), (expected, actual)
    # a second call takes the cached entry and still matches
    assert same(fn(*inputs), compiled(*inputs), rtol=rtol, atol=atol)
    return compile_stats.generated_kernel_count


def test_pointwise_chain_of_ten_ops_is_one_kernel():
    def chain(x, y, z):
        return ((((x * 2 + 1).sin() * y).relu() / (1 + z.exp())).tanh() - 0.5).abs()
    xs = [torch.randn(64, 33) for _ in range(3)]
    assert run(chain, *xs) == 1
    assert not compile_stats.fallback_ops


def test_softmax_and_log_softmax_are_one_kernel_each():
    x = torch.randn(16, 100)
    assert run(lambda t: torch.softmax(t, -1), x) == 1
    assert run(lambda t: torch.log_softmax(t, 1), x) == 1
    # over a non-last dim the pointwise parts join the reductions' loops in another order
    assert run(lambda t: torch.softmax(t, 0), x) == 1


def test_layer_norm_residual_gelu_fuse():
    w, b = torch.randn(64), torch.randn(64)

    def block(x, r):
        return F.gelu(F.layer_norm(x + r, (64,), w, b))
    assert run(block, torch.randn(32, 64), torch.randn(32, 64), atol=1e-5) == 1
    assert not compile_stats.fallback_ops


@pytest.mark.parametrize("reduce", [
    lambda x: x.sum(), lambda x: x.sum(0), lambda x: x.mean(-1, keepdim=True),
    lambda x: x.amax(1), lambda x: x.amin(0), lambda x: x.var(1), lambda x: x.std(0),
    lambda x: (x > 0).any(1), lambda x: (x > -3).all(), lambda x: x.prod(1),
], ids=["sum", "sum0", "mean_keepdim", "amax", "amin", "var", "std", "any", "all", "prod"])
def test_reductions_match_eager(reduce):
    assert run(reduce, torch.randn(24, 40), atol=1e-4) >= 1


def test_full_reduction_of_a_large_tensor_is_parallel_and_accurate():
    x = torch.randn(300_000)
    run(lambda t: (t * t).sum(), x, rtol=1e-4, atol=1e-2)


@pytest.mark.parametrize("dtype", [torch.float64, torch.int64, torch.int32, torch.bool])
def test_other_dtypes(dtype):
    x = (torch.randn(10, 12) * 10).to(dtype)
    y = (torch.randn(10, 12) * 10).to(dtype)
    if dtype is torch.bool:
        run(lambda a, b: (a & b) | ~a, x, y)
    else:
        run(lambda a, b: torch.maximum(a * 2, b) - b // 3 + a % 4, x, y)


def test_views_and_broadcasting():
    def f(x, y):
        a = x.t() + y.unsqueeze(0)[0].t()
        b = a.permute(1, 0).reshape(-1)[:50].view(5, 10)
        return b.expand(3, 5, 10) * 2 + x[1:6, :10]
    run(f, torch.randn(12, 10), torch.randn(12, 10))


def test_cat_and_pad():
    def f(x, y):
        c = torch.cat([x, y * 2, x + 1], dim=1)
        return F.pad(c, (1, 2, 3, 0), value=0.5).relu()
    run(f, torch.randn(4, 5), torch.randn(4, 3))


@pytest.mark.parametrize("dim", [0, 1, 2, -1])
def test_stack_is_a_kernel(dim):
    """stack fuses with the work on its inputs and after it: one kernel, no fallback (ViT's
    backward stacks the q, k and v gradients)."""
    def f(x, y):
        return (torch.stack([x * 2, y.relu(), x - y], dim=dim) + 1).exp()
    assert run(f, torch.randn(4, 6), torch.randn(4, 6)) == 1
    assert not compile_stats.fallback_ops


def test_stack_of_mixed_dtypes_promotes_as_eager():
    def f(x, y):
        return torch.stack([x, y], dim=1)
    run(f, torch.randn(3, 5), torch.randint(0, 9, (3, 5)))
    assert not compile_stats.fallback_ops


def test_input_mutation_is_applied():
    def f(x, y):
        x.add_(y)
        x.mul_(2)
        return x.sum()
    x, y = torch.randn(6, 7), torch.randn(6, 7)
    x_eager, x_comp = x.clone(), x.clone()
    f(x_eager, y)
    ember.compile(f, backend="ember")(x_comp, y)
    assert torch.allclose(x_eager, x_comp)


def test_fallback_ops_still_correct():
    def f(x):
        s, idx = torch.sort(x, dim=1)
        return s * 2 + idx.float(), torch.cumsum(x, 0)
    run(f, torch.randn(5, 6))
    assert compile_stats.fallback_ops


def test_mlp_uses_library_matmul_and_fuses_the_rest():
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.GELU(),
                                torch.nn.Linear(64, 8)).eval()
    kernels = run(model, torch.randn(16, 32), atol=1e-5)
    assert kernels >= 1
    assert compile_stats.extern_calls


def test_generated_code_is_readable(cpu_backend):
    from ember.testing import run_and_get_code
    def f(x):
        return (x + 1).relu().sum(1)
    x = torch.randn(4, 8)
    result, sources = run_and_get_code(f, x)
    assert same(result, f(x))
    text = "\n".join(sources)
    kernel = {"cpp": 'extern "C"', "triton": "@triton.jit"}[cpu_backend]
    assert "def call(args)" in text and kernel in text


def test_indirect_indexing_kernels():
    table = torch.randn(50, 16)
    ids = torch.randint(0, 50, (4, 7))
    assert run(lambda w, i: torch.nn.functional.embedding(i, w) * 2, table, ids) == 1
    x = torch.randn(10, 12)
    idx = torch.tensor([3, 1, 0, 9])
    run(lambda t, i: t.index_select(0, i) + 1, x, idx)
    run(lambda t, i: t[:, i].relu(), x, torch.tensor([0, -1, 5]))
    g = torch.randint(0, 12, (10, 5))
    run(lambda t, i: torch.gather(t, 1, i) * 3, x, g)
    assert not compile_stats.fallback_ops


def test_index_out_of_range_raises_like_eager(cpu_backend):
    table = torch.randn(5, 3)
    compiled = ember.compile(lambda w, i: torch.nn.functional.embedding(i, w) + 1,
                             backend="ember")
    compiled(table, torch.tensor([0, 4]))
    # Triton kernels clamp an index read from memory into range (memory stays safe); under
    # the interpreter they also flag it, and the wrapper raises (clamped silently before)
    with pytest.raises(IndexError):
        compiled(table, torch.tensor([0, 5]))


def test_argmax_argmin_keep_the_first_extreme_and_nan():
    x = torch.randint(0, 3, (6, 9)).float()          # many ties
    x[2, 4] = float("nan")
    run(lambda t: (t.argmax(1), t.argmin(0), t.argmax(), t.argmin(1, keepdim=True)), x)
    assert not compile_stats.fallback_ops


def test_scatter_and_index_put_run_sequentially_like_eager():
    x = torch.randn(6, 5)
    idx = torch.tensor([[0, 1, 2, 0, 0], [5, 5, 5, 1, 2]])      # duplicates
    src = torch.randn(2, 5)
    run(lambda t, i, s: t.scatter(0, i, s) * 2, x, idx, src)
    run(lambda t, i, s: t.scatter_add(0, i, s) + 1, x, idx, src)
    rows = torch.tensor([4, 0, 4, -1])
    vals = torch.randn(4, 5)

    def put(t, r, v):
        t = t.clone()
        t[r] = v
        return t.relu()
    run(put, x, rows, vals)
    run(lambda t, r, v: t.index_put((r,), v, accumulate=True), x, rows, vals)
    assert not compile_stats.fallback_ops


def test_max_min_reductions_propagate_nan():
    x = torch.randn(5, 40)
    x[1, 7] = float("nan")
    x[3, :] = float("nan")
    x[4, :] = float("-inf")
    run(lambda t: (t.amax(1), t.amin(1), t.amax(0)), x)
    run(lambda t: t.amax(), x)


def test_dead_buffers_give_their_memory_to_later_ones():
    def fn(x, y):
        a = x - (x * 2).sum(1, keepdim=True)
        c = torch.softmax(a @ y, -1)
        return ((c - (c * 3).amax(1, keepdim=True)) @ y).relu()
    x, y = torch.randn(64, 64), torch.randn(64, 64)
    compiled = ember.compile(fn, backend="ember")
    result, sources = run_and_get_code(compiled, x, y)
    assert same(fn(x, y), result, rtol=1e-4, atol=1e-4)
    # four values, two matmul results and the output in three blocks of memory: memory taken
    # over from a dead buffer ("# reuse", a matmul's out=) or written in place over one that
    # dies in the kernel (an alias); two blocks are kept between calls, the output is new
    assert sources[0].count("empty_strided((") == 3, sources[0]
    assert sources[0].split("def call(")[-1].count("empty_strided((") == 1, sources[0]
    assert "# reuse" in sources[0] or re.search(r"^\s*buf\d+ = buf\d+$", sources[0], re.M)
    assert same(fn(x * 2, y), compiled(x * 2, y), rtol=1e-4, atol=1e-4)


def test_eval_batch_norm_writes_nothing_back_to_its_running_stats():
    bn = torch.nn.BatchNorm2d(4).eval()
    bn.running_mean.uniform_()
    bn.running_var.uniform_(0.5, 1.0)
    x = torch.randn(2, 4, 5, 5)
    compiled = ember.compile(bn, backend="ember")
    result, sources = run_and_get_code(compiled, x)
    assert same(bn(x), result)
    # no kernel copying the stats onto themselves
    assert compile_stats.generated_kernel_count == 1


def test_short_contiguous_planes_run_as_one_inner_loop(cpu_backend):
    # h and w merged: one loop (Triton: one tile axis) of 16, not 4 x 4
    merged, apart = {"cpp": ("r0 < 16;", "r0 < 4;"),
                     "triton": ("rmask = rindex < 16", "r0 = (xindex) % 4")}[cpu_backend]
    bn = torch.nn.BatchNorm2d(8).eval()
    bn.running_var.uniform_(0.5, 2.0)
    x = torch.randn(2, 8, 4, 4)
    compiled = ember.compile(lambda t: torch.relu(bn(t)), backend="ember")
    result, sources = run_and_get_code(compiled, x)
    assert same(torch.relu(bn(x)), result)
    assert merged in sources[1]
    # a value broadcast along w alone breaks the contiguity: loops stay apart, still right
    y = torch.randn(4)
    ember.reset()
    compiled = ember.compile(lambda t, u: torch.relu(bn(t)) + u, backend="ember")
    result, sources = run_and_get_code(compiled, x, y)
    assert same(torch.relu(bn(x)) + y, result)
    assert apart in sources[1]


@pytest.mark.parametrize("shape,kernels", [
    ((2, 3, 4), 1), ((1, 6, 1, 4), 1), ((3, 2, 2, 2), 1),   # dims split: one kernel
    ((24,), 1),                # dims merged: the body's kernel reads it at its own index
    ((4, 6), 2)])              # dims regrouped otherwise: the body is stored
def test_view_that_splits_dims_of_a_body_keeps_it_fused(shape, kernels):
    """A view that splits dims (a linear's [B*T, C] result viewed as [B, T, C]) indexes the
    body with sums of products. One that merges all its dims is computed first but read in
    the body's own kernel, at a linear index of its loops (``scheduler.Regroup``); [4, 6]
    from [6, 4] would need div/mod per load, so the body is computed into memory first."""
    x = torch.randn(6, 4)
    assert run(lambda x: (x * 2 + 1).view(shape).cos(), x) == kernels


def test_node_over_regrouped_dims_joins_a_kernel_across_a_library_call():
    """GPT-2's GELU in the backward: its output (recomputed for the weight's gradient, a
    matmul) runs over the matmul's [B*T, H]; its derivative over the view [B, T, H]. Both
    read the same input: one kernel, the derivative moved before the matmul it does not
    need, the input loaded once."""
    def gelu_backward(h, dy, w):
        dg = torch.mm(dy, w.t())
        g = torch.tanh(h)
        dw = torch.mm(g.t(), dy)
        t = torch.tanh(h.view(2, 16, 24))
        return dw, dg.view(2, 16, 24) * (1 - t * t)
    args = torch.randn(32, 24), torch.randn(32, 8), torch.randn(24, 8)
    assert run(gelu_backward, *args) == 1
    _, sources = run_and_get_code(ember.compile(gelu_backward, backend="ember"), *args)
    assert len(re.findall(r"tanh\(tmp", sources[1])) == 1, sources[1]


def test_kernel_moves_down_past_a_library_call_to_meet_a_node_that_shares_its_input():
    """ViT's GELU in the backward: recomputed first (its output feeds the weight's gradient,
    a matmul), its derivative after the matmul it reads. The first kernel moves down past
    that matmul, before the one that reads its output: one kernel."""
    def gelu_backward(h, dy, w):
        g = torch.tanh(h)
        dg = torch.mm(dy, w.t())
        dw = torch.mm(g.t(), dy)
        t = torch.tanh(h)
        return dw, dg * (1 - t * t)
    assert run(gelu_backward, torch.randn(32, 24), torch.randn(32, 8), torch.randn(24, 8)) == 1


def test_kernel_does_not_move_past_a_reader_of_its_output():
    """A node that reads a matmul of the first kernel's output (through a sum) cannot meet
    that kernel: tanh, then the matmul, then the sum with its epilogue (moving the first
    kernel past the matmul would hand it memory not yet written)."""
    def fn(h, dy, w):
        g = torch.tanh(h)
        dw = torch.mm(g, w)
        return dw, torch.tanh(h) * dw.sum()
    assert run(fn, torch.randn(32, 24), torch.randn(32, 8), torch.randn(24, 24)) == 2


def test_regrouped_outer_node_joins_its_reduction():
    """Row sums over [32] x [64] read back as [2, 16] (a [B*T, C] layer's statistic viewed
    per batch) join the reduction's kernel as its epilogue."""
    x = torch.randn(32, 64)
    assert run(lambda x: torch.exp(x.sum(-1).view(2, 16) * 0.1).relu() + 1, x) == 1


def test_regrouped_dims_with_a_symbolic_size():
    """[s, 16, 8] nodes in a [16 s] x [8] kernel: the divisions are by whole numbers, so the
    same one kernel serves every batch size."""
    def fn(h, dy):
        g = torch.tanh(h)
        dw = torch.mm(g.t(), dy)
        t = torch.tanh(h.view(-1, 16, 8))
        return dw, t * 2
    compiled = ember.compile(fn, backend="ember", dynamic=True)
    for batch in (2, 3, 5):
        args = torch.randn(16 * batch, 8), torch.randn(16 * batch, 4)
        assert same(fn(*args), compiled(*args))


def _gelu_tanh_and_its_derivative(x, w):
    """GPT-2's GELU in a training step: ``tanh`` is read by the output (before a matmul)
    and by the derivative (after the matmul's backward), two kernels apart."""
    t = torch.tanh(0.79788456 * (x + 0.044715 * x * x * x))
    y = 0.5 * x * (1 + t)
    h = torch.mm(y, w)
    g = torch.mm(h, w.t())
    return h, g * (0.5 * (1 + t) + 0.5 * x * (1 - t * t) * 0.79788456 * (1 + 0.134145 * x * x))


def _with_policies(monkeypatch, **policies):
    """Compile with the target's policy attributes set as given (a GPU's, on the CPU
    targets); no graph cache: they are not part of its key."""
    from ember.backend.graph import GraphLowering
    monkeypatch.setenv("EMBER_GRAPH_CACHE", "0")
    lower = GraphLowering.__init__

    def patched(self, *args, **kwargs):
        lower(self, *args, **kwargs)
        for name, value in policies.items():
            monkeypatch.setattr(self.target, name, value)
    monkeypatch.setattr(GraphLowering, "__init__", patched)


@pytest.mark.parametrize("limit", [12, 64])
def test_body_read_by_kernels_apart_is_recomputed_within_the_targets_limit(limit, monkeypatch):
    """``Target.recompute_limit`` (ops x extra reads): GELU's tanh (~15 ops, three reads)
    is stored once under the CPU targets' 12 and recomputed by each kernel under a GPU's
    64. ``x * x * x`` counts as one load (a body loading several values is always stored)."""
    _with_policies(monkeypatch, recompute_limit=limit)
    x, w = torch.randn(64, 32), torch.randn(32, 8)
    out, sources = run_and_get_code(_gelu_tanh_and_its_derivative, x, w)
    assert same(_gelu_tanh_and_its_derivative(x, w), out, rtol=1e-5, atol=1e-5)
    text = "\n".join(sources)
    calls = text.count("ember_tanh(") - text.count("def ember_tanh(")
    assert calls == (1 if limit == 12 else 2), text


def _norm_step_sources(norm, x, params, g, atol=1e-3):
    """Compile ``(norm(x, *params) * g).sum().backward()``; assert the gradients equal
    eager's and return the generated sources."""
    def step(x, *rest):
        (norm(x, *rest[:-1]) * rest[-1]).sum().backward()
    leaves = (x, *params)
    with torch.enable_grad():
        step(x, *params, g)
        expected = [t.grad for t in leaves]
        for t in leaves:
            t.grad = None
        _, sources = run_and_get_code(step, x, *params, g)
    for t, e in zip(leaves, expected):     # sums over thousands of rows: values up to ~100
        assert same(e, t.grad, rtol=1e-4, atol=atol)
    return sources


@pytest.mark.parametrize("limit", [12, 64])
def test_layer_norm_backward_recomputes_the_normalised_input_in_its_column_sums(limit,
                                                                               monkeypatch):
    """Layer norm's backward reads ``(x - mean) * rstd`` in its row kernel (the input's
    gradient) and in its column sums (the weight's). The mean and rstd loads are broadcast
    along the row, so the value loads one value per element, as a stored copy would: under
    a GPU's limit and the CPU targets' (its five ops, constants free, for two extra reads) no
    kernel stores it (only the input's gradient and the partial sums are)."""
    _with_policies(monkeypatch, recompute_limit=limit)
    torch.manual_seed(0)
    x = torch.randn(4096, 256, requires_grad=True)
    params = [torch.randn(256, requires_grad=True) for _ in range(2)]
    sources = _norm_step_sources(lambda x, w, b: F.layer_norm(x, (256,), w, b), x, params,
                                 torch.randn(4096, 256))
    backward = next(s for s in sources if "def call(" in s and "layer_norm_bwd" in s)
    assert len(re.findall(r"\(4096, 256\), \(256, 1\)", backward)) == 1, backward


def test_a_regrouped_node_joins_a_kernel_only_to_share_a_load(cpu_backend):
    """On the CPU layer norm's weight's gradient is a split column sum over [8 chunks, 256
    columns] x [256 rows], and the input's gradient, [2048, 256], regroups onto those loops
    as [8 * 256 rows] x [256 columns]: the same buffers, read transposed, no load shared. It
    stays in the row kernel, and no kernel reads a buffer at two indices (fused, every load
    of the sums strided: 1.8 ms against eager's 0.8 for the whole backward). The sums join
    the row kernel the other way, accumulated across its rows (scheduler.Across): two
    kernels, the row kernel's and the one adding the chunks' sums."""
    if cpu_backend != "cpp":
        pytest.skip("the C++ target's policy (Target.regroups_only_to_share_loads); "
                    "Triton's keeps regrouped nodes fused")
    torch.manual_seed(0)
    x = torch.randn(2048, 256, requires_grad=True)
    params = [torch.randn(256, requires_grad=True) for _ in range(2)]
    sources = _norm_step_sources(lambda x, w, b: F.layer_norm(x, (256,), w, b), x, params,
                                 torch.randn(2048, 256))
    first = next(i for i, s in enumerate(sources) if "def call(" in s and "layer_norm_bwd" in s)
    kernels = [s for s in sources[first + 1:] if s.startswith('extern "C"')]
    assert len(kernels) == 2 and "x_chunk" in kernels[0], sources
    for kernel in kernels:
        indices: dict[str, set] = {}
        for name, index in re.findall(r"(p_\w+)\[([^\]]+)\]", kernel):
            indices.setdefault(name, set()).add(index)
        assert all(len(v) == 1 for v in indices.values()), kernel


def test_a_regrouped_store_sets_the_loop_order(cpu_backend):
    """Group norm's input gradient over channels-last data is regrouped onto the
    [N, G, C/G, H*W] loops of a local value; the C++ kernel loops in that store's memory
    order (channels innermost), so every store and load of its inner loop is contiguous
    (in logical order they strode over all 64 channels)."""
    if cpu_backend != "cpp":
        pytest.skip("the C++ target's loop order (cpp/kernel.py _in_store_order)")
    torch.manual_seed(0)
    x = torch.randn(4, 64, 8, 8).to(memory_format=torch.channels_last).requires_grad_()
    params = [torch.randn(64, requires_grad=True) for _ in range(2)]
    sources = _norm_step_sources(lambda x, w, b: F.group_norm(x, 8, w, b), x, params,
                                 torch.randn(4, 64, 8, 8).to(memory_format=torch.channels_last),
                                 atol=1e-4)
    first = next(i for i, s in enumerate(sources) if "def call(" in s and "group_norm_bwd" in s)
    stores = 0
    for kernel in (s for s in sources[first + 1:] if s.startswith('extern "C" void ember_poi')):
        for store in re.finditer(r"p_\w+\[\(([^\]]+)\)\] = ", kernel):
            if "16384" in store.group(1) or "4096" in store.group(1):   # a [4, 64, 8, 8] one
                innermost = re.findall(r"for \(int64_t (\w+) = 0", kernel[:store.start()])[-1]
                assert re.search(rf"(^|\+ ){innermost}( \+|$)", store.group(1)), kernel
                stores += 1
    assert stores >= 1


@pytest.mark.parametrize("inline", [False, True])
@pytest.mark.parametrize("shape,merged,divides", [((4, 197, 96), (788, 96), True),
                                                  ((2, 3, 1, 5, 16), (30, 16), True),
                                                  ((2, 3, 5, 16), (6, 5, 16), False)])
@pytest.mark.parametrize("transposed", [False, True])
def test_merged_view_of_a_body_is_read_through_where_the_target_inlines_it(
        inline, shape, merged, divides, transposed, monkeypatch):
    """ViT's layer-norm backward views ``(x - mean) * rstd`` [B, T, C] as [B*T, C] for the
    weight's column sum. Where every load folds back to the merged row index (``x``
    contiguous: ``ir.fold_div_mod``), the body is read through the view on every target
    (one kernel). Where ``x``'s last two dims are transposed in memory, loads divide the row
    index: read through where the target inlines merged views (Triton on a GPU: one
    kernel), stored first elsewhere (two), unless the merged dims stay contiguous with
    each other (``divides`` False)."""
    _with_policies(monkeypatch, inlines_merged_views=inline)
    x, g = torch.randn(shape), torch.randn(merged)
    if transposed:
        x = x.transpose(-1, -2).contiguous().transpose(-1, -2)
    mean, rstd = x.mean(-1, keepdim=True), torch.rand(*shape[:-1], 1) + 0.5

    def weight_grad(x, mean, rstd, g):
        xhat = (x - mean) * rstd
        return (g * xhat.reshape(merged)).sum(0)
    kernels = run(weight_grad, x, mean, rstd, g, rtol=1e-4, atol=1e-4)
    assert kernels == (2 if transposed and divides and not inline else 1)


@pytest.mark.parametrize("reduce", [lambda t: t.sum([0, 2]), lambda t: t.mean([0, 2]),
                                    lambda t: t.amax([0, 2])], ids=["sum", "mean", "amax"])
@pytest.mark.parametrize("layout", [torch.contiguous_format, torch.channels_last])
def test_costly_body_reduced_through_a_merged_view_is_computed_in_the_reduction(reduce,
                                                                               layout):
    """Batch norm's backward sums ReLU's masked gradient, recomputed from the saved input,
    over ``[N, C, H*W]``: a body of more ops than a view reads through unless each of its
    elements is read once, as a one-pass reduction reads them. It is computed in the
    reduction's kernel (stored first, it took a float32 pass of its own per batch norm in
    resnet50's AMP step)."""
    x, g = (torch.randn(4, 8, 6, 6).contiguous(memory_format=layout) for _ in range(2))
    a, b = torch.randn(1, 8, 1, 1), torch.randn(1, 8, 1, 1)

    def masked_grad_reduced(x, g, a, b):
        y = torch.where(((x - a) * b * 3 + 1).relu() <= 0, 0.0, g)
        return reduce(y.view(4, 8, 36))
    assert run(masked_grad_reduced, x, g, a, b) == 1


def test_pre_norm_block_trains_like_eager_under_a_gpus_policies(monkeypatch):
    """A ViT block's training step with the Triton target's policies (recompute limit 64,
    merged views read through): every gradient matches eager's."""
    _with_policies(monkeypatch, recompute_limit=64, inlines_merged_views=True)
    torch.manual_seed(0)
    d = 32
    block = torch.nn.Sequential(torch.nn.LayerNorm(d), torch.nn.Linear(d, 4 * d),
                                torch.nn.GELU(approximate="tanh"), torch.nn.Linear(4 * d, d))
    x = torch.randn(3, 17, d, requires_grad=True)

    def step(x):
        h = x + block(x)
        return (F.layer_norm(h, (d,)) * torch.arange(d)).sum()
    with torch.enable_grad():
        step(x).backward()
        expected = [t.grad.clone() for t in (x, *block.parameters())]
        for t in (x, *block.parameters()):
            t.grad = None
        ember.reset()
        ember.compile(step, backend="ember")(x).backward()
    for e, t in zip(expected, (x, *block.parameters())):
        assert same(e, t.grad, rtol=1e-4, atol=1e-4)


def test_a_body_of_two_loads_is_stored_only_where_that_moves_fewer_bytes():
    """A value of two inputs read before and after a matmul: recomputed by its second
    reader when reloading both inputs costs no more than storing it and loading it back
    (float64 from two float32s: GPT-2's float32 GELU backward of two bf16 values under
    autocast); stored when it does (float32 from two float32s: a residual sum)."""
    a, b, w = torch.randn(64, 32), torch.randn(64, 32), torch.randn(32, 32)

    def widened(a, b, w):
        v = a.double() * b.double()
        h = torch.mm(torch.tanh(v).float(), w)
        return torch.mm(h, w.t()).double() * v

    def same_width(a, b, w):
        v = a * b + a
        h = torch.mm(torch.tanh(v), w)
        return torch.mm(h, w.t()) * v
    for fn, recomputed in ((widened, True), (same_width, False)):
        ember.reset()
        out, sources = run_and_get_code(fn, a, b, w)
        assert same(fn(a, b, w), out, rtol=1e-5, atol=1e-5)
        last = [line for line in sources[0].splitlines()
                if re.match(r"\s+ember_\w+\(", line) and "_flags" not in line][-1]
        assert ("arg0" in last and "arg1" in last) == recomputed, (fn.__name__, last)


def test_view_of_a_gather_is_stored_before_a_broadcasting_reader():
    """Swin's relative-position bias: a gather viewed [7, 7, heads], permuted and added to
    every window's scores. Kept unstored behind the view, the gather would rerun for each
    window; it is computed once into memory (2 kernels, not 1)."""
    table, idx = torch.randn(169, 3), torch.randint(0, 169, (49,))
    scores = torch.randn(16, 3, 7, 7)
    assert run(lambda t, i, s: s + t[i].view(7, 7, 3).permute(2, 0, 1), table, idx,
               scores) == 2


def test_view_of_a_gather_read_once_is_computed_in_its_softmax():
    """DeBERTa's scores: a product plus a relative-position gather, viewed [batch, heads,
    S, S] and read once by a softmax (the mask broadcasts, the scores do not). The gather
    stays inline in the softmax's kernel (1 kernel, not 2)."""
    heads, s = 3, 16
    scores, c2p = torch.randn(2 * heads, s, s), torch.randn(2 * heads, s, 2 * s)
    pos = (torch.arange(s)[:, None] - torch.arange(s)[None, :] + s).clamp(0, 2 * s - 1)
    mask = torch.rand(2, 1, s, s) > 0.2

    def attention(scores, c2p, pos, mask):
        rel = torch.gather(c2p, -1, pos.expand(2 * heads, s, s))
        full = (scores + rel / 2).view(2, heads, s, s)
        return torch.softmax(full.masked_fill(~mask, -1e4), -1)
    assert run(attention, scores, c2p, pos, mask) == 1


def test_transcendental_body_read_by_kernels_apart_is_computed_once():
    """Llama's rotary cos and sin are read by every layer: each read would recompute the
    call (libm, a polynomial) in its kernel; the value is stored once instead. A body of a
    few plain ops read twice stays inline."""
    x, w = torch.randn(8, 8), torch.randn(8, 8)

    def fn(x, w):
        c = x.cos()
        h = torch.mm(c * 2, w)
        return torch.mm(h * c, w) * c

    ember.reset()
    out, sources = run_and_get_code(fn, x, w)
    assert same(fn(x, w), out, rtol=1e-5, atol=1e-5)
    kernels = "\n".join(s for s in sources if "def call(" not in s or "@triton" in s)
    assert kernels.count("cos(") == 1, kernels

    def cheap(x, w):
        c = x * 2 + 1
        return torch.mm(c, w) * c

    ember.reset()
    out, sources = run_and_get_code(cheap, x, w)
    assert same(cheap(x, w), out, rtol=1e-5, atol=1e-5)
    assert compile_stats.generated_kernel_count == 2
