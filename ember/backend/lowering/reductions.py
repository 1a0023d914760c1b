"""Lowerings of reductions (sum, mean, amax, amin, prod, any, all, var, std) and of softmax
and log_softmax, written as reductions plus pointwise bodies the scheduler fuses."""
from __future__ import annotations

import dataclasses
import math

import sympy
import torch

from ember.backend.ir import Layout, Pointwise, Reduction, ReinterpretView, product, sym
from ember.backend.lowering.registry import aten, register_lowering
from ember.backend.ops import ops
from ember.backend.sizevars import is_static
from ember.decomp import variance_dtype


def _dims(x, dim, memory_order: bool = True) -> list[int]:
    """The dims reduced, non-negative, in memory order (``_memory_order``; else sorted: an
    argmax over several dims returns an index into them flattened in logical order). A
    0-d tensor has none: ``dim=0`` or ``-1`` names the tensor itself, whose one element is
    the whole reduction."""
    ndim = len(x.get_size())
    if dim is None or (isinstance(dim, (list, tuple)) and len(dim) == 0):
        return list(range(ndim))
    if ndim == 0:
        return []
    dims = [dim] if isinstance(dim, int) else list(dim)
    dims = sorted({d % ndim for d in dims})
    return _memory_order(x, dims) if memory_order else dims


def _memory_order(x, dims: list[int]) -> list[int]:
    """``dims`` from the one ``x``'s loads step through farthest to the nearest: the
    reduction's innermost loop then moves along memory. A group norm over channels-last
    data reduces [C/G, H*W] whose channels are adjacent; in logical order every load of the
    inner loop strode over all channels (0.33x eager's training step). Only where every
    stride is a known number; the order of a sum's terms is not eager's either way."""
    if len(dims) < 2:
        return dims
    strides = {d: 0 for d in dims}
    for steps in _load_steps(x):
        for d in dims:
            if not steps[d].is_Integer:
                return dims
            strides[d] = max(strides[d], abs(int(steps[d])))
    # a dim no load moves along (a broadcast) outermost; ties keep the logical order
    return sorted(dims, key=lambda d: -strides[d] if strides[d] else -math.inf)


def _load_steps(x) -> list[list[sympy.Expr]]:
    """Per load of ``x``'s body, how far its index moves per step of each dim of ``x``."""
    from ember.backend.scheduler import extract_reads
    index = [sympy.Symbol(f"d{i}", integer=True, nonnegative=True)
             for i in range(len(x.get_size()))]
    return [[sympy.diff(expr, var) for var in index]
            for _, expr in extract_reads(x.make_loader(), index)]


def _reduction_body(x, dims: list[int], compute: torch.dtype, map_fn=None):
    """``inner(index, rindex)`` reading ``x`` (cast to ``compute``, then ``map_fn(value,
    full_index)``), and the kept and reduced ranges."""
    size = x.get_size()
    ndim = len(size)
    kept = [i for i in range(ndim) if i not in dims]
    loader = x.make_loader()
    src_dtype = x.get_dtype()

    def inner(index, rindex):
        full = [None] * ndim
        for pos, i in enumerate(kept):
            full[i] = index[pos]
        for pos, i in enumerate(dims):
            full[i] = rindex[pos]
        value = loader(full)
        if src_dtype != compute:
            value = ops.to_dtype(value, compute)
        return map_fn(value, full) if map_fn else value
    return inner, [size[i] for i in kept], ([size[i] for i in dims] if ndim else [])


def _keepdim_view(buf, size, dims):
    """``buf`` (the reduction result) seen with the reduced dims kept as size 1."""
    out_size = [sympy.Integer(1) if i in dims else size[i] for i in range(len(size))]
    strides, it = [], iter(buf.layout.stride)
    for i in range(len(size)):
        strides.append(sympy.Integer(0) if i in dims else next(it))
    return ReinterpretView(buf, Layout(buf.layout.device, buf.layout.dtype, out_size, strides,
                                       buf.layout.offset))


def reduce(ctx, x, dims: list[int], reduction_type: str, compute: torch.dtype,
           out_dtype: torch.dtype, keepdim: bool, map_fn=None):
    """Realize a Reduction of ``x`` over ``dims``; returns the buffer (viewed with kept
    size-1 dims when ``keepdim``)."""
    # the same reduction of the same value is computed once (layer_norm's decomposition asks
    # for the row sum twice: once for the mean, once inside the variance)
    key = (id(x), tuple(dims), reduction_type, compute, out_dtype) if map_fn is None else None
    memo = ctx.graph.reductions
    buf = memo[key][0] if key in memo else None
    if buf is None:
        inner, ranges, rranges = _reduction_body(x, dims, compute, map_fn)
        red = _split(ctx, x, dims, inner, reduction_type, compute, out_dtype) or \
            Reduction(x.get_device(), out_dtype, inner, ranges, rranges, reduction_type,
                      compute)
        buf = ctx.graph.realize(red)
        if key is not None:
            memo[key] = (buf, x)   # keeps x alive so its id is not reused
    return _keepdim_view(buf, x.get_size(), dims) if keepdim else buf


# Split reductions (targets that ask, ``Target.splits``: Triton, and C++ for column sums): a
# reduction to few results (a column sum, batch norm's per-channel sums, a whole-tensor sum)
# gives a GPU a few programs, each looping over a long range, while most of its SMs idle.
# Such a reduction runs in two: the first reduces contiguous chunks of the reduced range
# into partial results, many in parallel; the second reduces those.
_SPLIT_TYPES = ("sum", "prod", "max", "min", "any", "all")
SPLIT_MAX_OUTPUTS = 4096        # fewer results than this are split...
SPLIT_MIN_LENGTH = 2048         # ...when each reduces at least this many elements
SPLIT_PARTIALS = 32768          # at most this many partial results
SPLIT_MIN_CHUNK = 256           # each reducing at least this many elements


@dataclasses.dataclass
class _SplitPlan:
    """How a reduction of ``x`` over ``dims`` splits: the reduced dims, in order, are one
    range cut into equal chunks at reduced dim ``dims[cut]``: every position of the dims
    before it is a chunk of its own, ``dims[cut]`` is cut into ``parts`` pieces of
    ``chunk`` positions (piece ``s`` covers ``[s * chunk, (s + 1) * chunk)``, so no index
    falls outside and no load needs a mask), and the dims after it stay whole. A chunk is
    then a contiguous run of the reduced range: batch norm's sums over NHWC data of
    64x256x56x56 cut at H into 2 make 128 chunks of 28x56 rows of 256 channels, one image's
    contiguous half each. (Cutting H*W alone and reducing N inside a chunk read a row of
    channels from each of 64 images per tile, 1.6 MB apart: 2.7x torch.compile's time.)

    Where ``x`` is read contiguously along a kept dim (batch norm's sums over channels-last
    data: ``C`` is innermost), the plan takes the cut with the most chunks, and the partial
    results are laid out chunk-major (``column``: ``[*chunks, *kept]``): both kernels then
    reduce columns whose tiles read whole rows of contiguous kept values. Otherwise the
    outermost reduced dim that divides is cut (the innermost stays whole, a contiguous
    row) and the partials are ``[*kept, *chunks]``."""
    dims: list[int]
    cut: int                    # the position in ``dims`` of the dim cut into pieces
    parts: int
    sizes: list[int]            # x's
    column: bool

    @property
    def chunk(self) -> int:
        return self.sizes[self.dims[self.cut]] // self.parts

    @property
    def chunks(self) -> list[int]:
        """The grid of chunks: the sizes of the dims before the cut, then ``parts``."""
        return [self.sizes[e] for e in self.dims[:self.cut]] + [self.parts]

    @property
    def kept_sizes(self) -> list[int]:
        return [v for i, v in enumerate(self.sizes) if i not in self.dims]

    @property
    def reduced_sizes(self) -> list[int]:
        """The first reduction's range: one chunk (the cut piece, the dims after it)."""
        return [self.chunk] + [self.sizes[e] for e in self.dims[self.cut + 1:]]

    def first(self, inner):
        """The first reduction's body: ``inner`` over one chunk."""
        k, chunk = self.cut + 1, self.chunk

        def body(index, rindex):
            grid, kept = (index[:k], index[k:]) if self.column else (index[-k:], index[:-k])
            return inner(kept, [*grid[:-1], grid[-1] * chunk + rindex[0], *rindex[1:]])
        return body

    def partial_size(self) -> list[int]:
        return self.chunks + self.kept_sizes if self.column else \
            self.kept_sizes + self.chunks

    def second(self, partial):
        """The second reduction's body (over ``chunks``): ``partial``'s values of one kept
        position."""
        load = partial.make_loader()
        if self.column:
            return lambda index, rindex: load([*rindex, *index])
        return lambda index, rindex: load([*index, *rindex])


def _split_plan(ctx, x, dims) -> _SplitPlan | None:
    """The split of a reduction of ``x`` over ``dims``, or None when it stays one (the
    target does not split, the reduction has many results or short rows, or no cut gives
    chunks long enough)."""
    if not dims:
        return None
    size = x.get_size()
    if not all(is_static(v) for v in size):
        return None
    size = [int(v) for v in size]
    dims = list(dims)
    kept = [i for i in range(len(size)) if i not in dims]
    outputs = math.prod(size[i] for i in kept)
    length = math.prod(size[d] for d in dims)
    if outputs >= SPLIT_MAX_OUTPUTS or length < SPLIT_MIN_LENGTH:
        return None
    column = _contiguous_dim(x) in kept
    if not ctx.graph.target.splits(column):
        return None
    most = min(SPLIT_PARTIALS // outputs, length // SPLIT_MIN_CHUNK)
    choices, before = [], 1       # (cut, parts, chunks in all); chunks of the dims before
    for cut, d in enumerate(dims):
        top = min(size[d], most // before)
        parts = next((p for p in range(top, 0, -1) if size[d] % p == 0), 1)
        if 2 <= before * parts <= most:
            choices.append((cut, parts, before * parts))
        before *= size[d]
        if before > most:
            break
    if not choices:
        return None
    cut, parts, _ = max(choices, key=lambda c: c[2]) if column else choices[0]
    return _SplitPlan(dims, cut, parts, size, column)


def _split(ctx, x, dims, inner, reduction_type, compute, out_dtype):
    """The second Reduction of a split reduction over the realized partial results of the
    first, or None when the reduction stays one (see ``_split_plan``)."""
    plan = _split_plan(ctx, x, dims) if reduction_type in _SPLIT_TYPES else None
    if plan is None:
        return None
    partial_dtype = torch.float32 if out_dtype in (torch.float16, torch.bfloat16) \
        else out_dtype
    device = x.get_device()
    partial = ctx.graph.realize(Reduction(device, partial_dtype, plan.first(inner),
                                          plan.partial_size(), plan.reduced_sizes,
                                          reduction_type, compute))
    return Reduction(device, out_dtype, plan.second(partial), plan.kept_sizes, plan.chunks,
                     reduction_type, partial_dtype)


def _contiguous_dim(x) -> int | None:
    """The dim of ``x`` along which most of its loads move with unit stride (the innermost
    dim in memory of the buffers it reads), or None."""
    ndim = len(x.get_size())
    counts = [0] * ndim
    for steps in _load_steps(x):
        for i, step in enumerate(steps):
            if step == 1:
                counts[i] += 1
    # on a tie the inner dim: a row's own loads outweigh a broadcast statistic's (layer and
    # group norm's ``x - mean``, whose mean runs along a kept dim)
    best = max(range(ndim), key=lambda i: (counts[i], i), default=None)
    return best if best is not None and counts[best] else None


# Reductions at least this long compute var/std in one pass with Welford's update (mean and
# M2 per lane, lanes and threads merged with Chan's formula). Shorter rows take two passes
# (sum, then squared deviations from the mean): the second pass finds the row in cache, and
# per element it is cheaper. Measured on a 2-core EPYC, 2 threads, var over the last dim:
# 16 x 2**18 floats two-pass 1.25x faster; 1 x 2**22 even; 64 x 2**20 Welford 1.6x faster;
# 1 x 2**26 Welford 1.9x faster. A reduction that splits (batch norm's statistics on a GPU)
# always takes one pass: two kernels that read ``x`` once, where two passes, each split,
# would be four kernels reading it twice.
WELFORD_MIN_NUMEL = 1 << 20


def welford(ctx, x, dims: list[int], compute: torch.dtype, plan: _SplitPlan | None):
    """(mean, M2) of ``x`` over ``dims`` in one pass: two Reductions over the same body,
    which the code generator computes with one Welford state (split in two by ``plan``,
    see ``_split_welford``). A later ``mean`` of the same value reuses the mean."""
    key = (id(x), tuple(dims), "welford", compute)
    memo = ctx.graph.reductions
    if key not in memo:
        inner, ranges, rranges = _reduction_body(x, dims, compute)
        bufs = _split_welford(ctx, x, plan, inner, compute) if plan is not None else \
            _welford_pair(ctx, x.get_device(), inner, ranges, rranges, compute, compute)
        memo[key] = (bufs, x)
    return memo[key][0]


def _welford_pair(ctx, device, inner, ranges, rranges, src, dtype):
    """The realized (mean, M2) Reductions of ``inner`` (values of dtype ``src``); both take
    the same body object, which is how the code generator groups them in one state."""
    return tuple(ctx.graph.realize(Reduction(device, dtype, inner, ranges, rranges, kind, src))
                 for kind in ("welford_mean", "welford_m2"))


def _split_welford(ctx, x, plan: _SplitPlan, inner, compute):
    """(mean, M2) of a split reduction: the first kernel computes each chunk's mean and M2;
    the second combines them. Every chunk holds the same ``n`` values, so the mean is the
    mean of the chunks' means, and (Chan's formula with equal weights)
    ``M2 = sum(M2_chunk) + n * sum((mean_chunk - mean)^2)``, whose last sum is the M2 of the
    chunks' means: a Welford reduction and a sum over the same range, one kernel."""
    device = x.get_device()
    acc = torch.float32 if compute in (torch.float16, torch.bfloat16) else compute
    means, m2s = _welford_pair(ctx, device, plan.first(inner), plan.partial_size(),
                               plan.reduced_sizes, compute, acc)
    mean, spread = _welford_pair(ctx, device, plan.second(means), plan.kept_sizes,
                                 plan.chunks, acc, acc)
    m2_sum = ctx.graph.realize(Reduction(device, acc, plan.second(m2s), plan.kept_sizes,
                                         plan.chunks, "sum", acc))
    n = math.prod(plan.reduced_sizes)     # values per chunk
    load_sum, load_spread = m2_sum.make_loader(), spread.make_loader()

    def m2(index):
        value = ops.add(load_sum(index), ops.mul(load_spread(index),
                                                 ops.constant(n, acc)))
        return value if acc == compute else ops.to_dtype(value, compute)
    total = ctx.graph.realize(Pointwise(device, compute, m2, plan.kept_sizes))
    if acc != compute:
        load_mean = mean.make_loader()
        mean = ctx.graph.realize(Pointwise(device, compute, lambda i: ops.to_dtype(
            load_mean(i), compute), plan.kept_sizes))
    return mean, total


def _keep(x, dims, buf):
    """A loader of a keepdim reduction result ``buf`` broadcast back over ``x``'s index."""
    load = buf.make_loader()
    return lambda full: load([sympy.Integer(0) if i in dims else full[i]
                              for i in range(len(full))])


def _sum_like(reduction_type):
    def lower(ctx, x, dim=None, keepdim=False, *, dtype=None):
        dims = _dims(x, dim)
        return reduce(ctx, x, dims, reduction_type, ctx.dtype, ctx.dtype, keepdim)
    return lower


register_lowering(aten.sum.dim_IntList, aten.sum.default)(_sum_like("sum"))
register_lowering(aten.prod.dim_int, aten.prod.default)(_sum_like("prod"))


@register_lowering(aten.amax.default, aten.amin.default, aten.max.default, aten.min.default)
def _amax(ctx, x, dim=(), keepdim=False):
    name = ctx.node.target.__name__.split(".")[0]
    kind = "max" if name in ("amax", "max") else "min"
    return reduce(ctx, x, _dims(x, dim), kind, ctx.dtype, ctx.dtype, keepdim)


@register_lowering(aten.argmax.default, aten.argmin.default)
def _argmax(ctx, x, dim=None, keepdim=False):
    kind = "argmax" if ctx.node.target is aten.argmax.default else "argmin"
    if len(x.get_size()) == 0:
        return NotImplemented
    return reduce(ctx, x, _dims(x, dim, memory_order=False), kind, x.get_dtype(),
                  torch.int64, keepdim)


@register_lowering(aten.any.dim, aten.any.dims, aten.any.default, aten.all.dim,
                   aten.all.default, aten.all.dims)
def _any_all(ctx, x, dim=None, keepdim=False):
    kind = "any" if ctx.node.target.__name__.startswith("any") else "all"
    # of uint8 values the result is uint8 (0 or 1), as eager's
    return reduce(ctx, x, _dims(x, dim), kind, torch.bool, ctx.dtype, keepdim)


@register_lowering(aten.mean.dim, aten.mean.default)
def _mean(ctx, x, dim=None, keepdim=False, *, dtype=None):
    if ctx.dtype not in (torch.float16, torch.bfloat16):
        return _mean_in(ctx, x, _dims(x, dim), keepdim, ctx.dtype)
    # half precision: summed and divided in float32, rounded once, as eager's
    mean = _mean_in(ctx, x, _dims(x, dim), keepdim, torch.float32)
    load = mean.make_loader()
    return Pointwise(ctx.device, ctx.dtype, lambda i: ops.to_dtype(load(i), ctx.dtype),
                     mean.get_size())


def _mean_in(ctx, x, dims, keepdim, dt):
    """The mean of ``x`` over ``dims``, summed and divided in ``dt``."""
    found = ctx.graph.reductions.get((id(x), tuple(dims), "welford", dt))
    if found is not None:
        mean = found[0][0]
        return _keepdim_view(mean, x.get_size(), dims) if keepdim else mean
    total = reduce(ctx, x, dims, "sum", dt, dt, keepdim)
    n = product([x.get_size()[d] for d in dims])
    load = total.make_loader()
    return Pointwise(ctx.device, dt, lambda index: ops.truediv(load(index), ops.constant(n, dt)),
                     total.get_size())


def _variance(ctx, x, dim, correction, keepdim, one_result_mean=True):
    """The sum of squared deviations of ``x`` over ``dim`` (a buffer in the statistics dtype,
    ``decomp.variance_dtype``: float64 on the CPU, as eager's), its loader, and the
    divisor. Where the result is one value, eager's CPU var and std (``one_result_mean``;
    not var_mean and std_mean) take the mean in the input dtype first, then the squared
    deviations from it in double: a float32 sum that overflows makes the variance inf or
    NaN there, as it does here."""
    dims = _dims(x, dim)
    dt = ctx.dtype
    acc = variance_dtype(ctx.device, dt)
    n = product([x.get_size()[d] for d in dims])
    denom = n - (1 if correction is None else correction)
    outputs = product([s for i, s in enumerate(x.get_size()) if i not in dims])
    float_mean = one_result_mean and acc != dt and outputs == 1
    plan = _split_plan(ctx, x, dims) if n.is_Integer else None
    if n.is_Integer and not float_mean and (int(n) >= max(WELFORD_MIN_NUMEL, 1) or
                                            plan is not None):
        m2 = welford(ctx, x, dims, acc, plan)[1]
        sq = _keepdim_view(m2, x.get_size(), dims) if keepdim else m2
        return sq, sq.make_loader(), denom
    mean_dtype = dt if float_mean else acc
    total = reduce(ctx, x, dims, "sum", mean_dtype, mean_dtype, True)
    load_total = _keep(x, dims, total)

    def squared_deviation(value, full):
        mean = ops.truediv(load_total(full), ops.constant(n, mean_dtype))
        dev = ops.sub(value, mean if mean_dtype == acc else ops.to_dtype(mean, acc))
        return ops.mul(dev, dev)
    sq = reduce(ctx, x, dims, "sum", acc, acc, keepdim, map_fn=squared_deviation)
    return sq, sq.make_loader(), denom


def _from_m2(ctx, x, dim, correction, keepdim, finish=None, one_result_mean=True):
    """var (``finish`` None) or std (``ops.sqrt``) from ``_variance``: divided, finished
    in the statistics dtype, then rounded to the output dtype."""
    sq, load, denom = _variance(ctx, x, dim, correction, keepdim, one_result_mean)
    dt = ctx.dtype
    acc = sq.get_dtype()
    denom = sympy.Max(denom, 0)     # once: sympy.Max costs ~ms, and loaders run often

    def inner(i):
        v = ops.truediv(load(i), ops.constant(denom, acc))
        v = v if finish is None else finish(v)
        return v if acc == dt else ops.to_dtype(v, dt)
    return Pointwise(ctx.device, dt, inner, sq.get_size())


@register_lowering(aten.var.correction)
def _var(ctx, x, dim=None, *, correction=None, keepdim=False):
    return _from_m2(ctx, x, dim, correction, keepdim)


@register_lowering(aten.std.correction)
def _std(ctx, x, dim=None, *, correction=None, keepdim=False):
    return _from_m2(ctx, x, dim, correction, keepdim, ops.sqrt)


def _softmax_parts(ctx, x, dim, compute):
    dims = _dims(x, dim)
    load_x = x.make_loader()
    src = x.get_dtype()

    def xval(full):
        v = load_x(full)
        return v if src == compute else ops.to_dtype(v, compute)
    peak = reduce(ctx, x, dims, "max", compute, compute, True)
    load_peak = _keep(x, dims, peak)
    total = reduce(ctx, x, dims, "sum", compute, compute, True,
                   map_fn=lambda v, full: ops.exp(ops.sub(v, load_peak(full))))
    load_total = _keep(x, dims, total)
    return xval, load_peak, load_total


@register_lowering(aten._softmax.default)
def _softmax(ctx, x, dim, half_to_float):
    # e = exp(x - max) is stored once and normalised in place (the scheduler lets the
    # result reuse e's memory), so exp runs once per element, as in eager's kernel
    compute = torch.float32 if x.get_dtype() in (torch.float16, torch.bfloat16) else ctx.dtype
    dims = _dims(x, dim)
    load_x = x.make_loader()
    src = x.get_dtype()
    peak = reduce(ctx, x, dims, "max", compute, compute, True)
    load_peak = _keep(x, dims, peak)

    def shifted_exp(index):
        v = load_x(index)
        v = v if src == compute else ops.to_dtype(v, compute)
        return ops.exp(ops.sub(v, load_peak(index)))
    e = ctx.graph.realize(Pointwise(ctx.device, compute, shifted_exp, x.get_size()))
    total = reduce(ctx, e, dims, "sum", compute, compute, True)
    load_e, load_total = e.make_loader(), _keep(x, dims, total)

    def inner(index):
        v = ops.mul(load_e(index), ops.reciprocal(load_total(index)))
        return v if compute == ctx.dtype else ops.to_dtype(v, ctx.dtype)
    return Pointwise(ctx.device, ctx.dtype, inner, x.get_size())


@register_lowering(aten._log_softmax.default)
def _log_softmax(ctx, x, dim, half_to_float):
    compute = torch.float32 if x.get_dtype() in (torch.float16, torch.bfloat16) else ctx.dtype
    xval, peak, total = _softmax_parts(ctx, x, dim, compute)

    def inner(index):
        v = ops.sub(ops.sub(xval(index), peak(index)), ops.log(total(index)))
        return v if compute == ctx.dtype else ops.to_dtype(v, ctx.dtype)
    return Pointwise(ctx.device, ctx.dtype, inner, x.get_size())


@register_lowering(aten.linalg_vector_norm.default)
def _vector_norm(ctx, x, ord=2, dim=None, keepdim=False, *, dtype=None):
    """``sum(|x|^p)^(1/p)`` (F.normalize, torch.norm), ``max|x|`` for inf, ``min|x|`` for
    -inf, the count of nonzeros for 0; half precision accumulates in float32."""
    out_dtype = ctx.dtype
    if not out_dtype.is_floating_point or not x.get_dtype().is_floating_point:
        return NotImplemented
    compute = torch.float32 if out_dtype in (torch.float16, torch.bfloat16) else out_dtype
    dims = _dims(x, dim)
    p = float(ord)
    if p != 0 and product([x.get_size()[d] for d in dims]) == 1:
        # eager's norm of one element is its magnitude, never squared (1e20 stays finite)
        kind, element, finish = "sum", ops.abs, None
    elif p == float("inf") or p == float("-inf"):
        kind, element, finish = ("max" if p > 0 else "min"), ops.abs, None
    elif p == 0:
        kind, finish = "sum", None
        element = lambda v: ops.to_dtype(ops.ne(v, ops.constant(0, compute)), compute)  # noqa: E731
    elif p == 1:
        kind, element, finish = "sum", ops.abs, None
    elif p == 2:
        kind, element, finish = "sum", ops.square, ops.sqrt
    else:
        kind = "sum"
        element = lambda v: ops.pow(ops.abs(v), ops.constant(p, compute))  # noqa: E731
        finish = lambda v: ops.pow(v, ops.constant(1.0 / p, compute))  # noqa: E731
    total = reduce(ctx, x, dims, kind, compute, compute, keepdim,
                   map_fn=lambda value, full: element(value))
    load = total.make_loader()

    def inner(index):
        v = load(index)
        v = finish(v) if finish is not None else v
        return v if compute == out_dtype else ops.to_dtype(v, out_dtype)
    return Pointwise(ctx.device, out_dtype, inner, total.get_size())


@register_lowering(aten.std_mean.correction)
def _std_mean(ctx, x, dim=None, *, correction=None, keepdim=False):
    """One Welford pass (or the two passes of short rows) gives both: the mean, in the
    statistics dtype as eager's, reuses the variance's reduction."""
    std = _from_m2(ctx.output(0), x, dim, correction, keepdim, ops.sqrt, one_result_mean=False)
    out = ctx.output(1)
    acc = variance_dtype(out.device, out.dtype)
    mean = _mean_in(out, x, _dims(x, dim), keepdim, acc)
    if acc == out.dtype:
        return std, mean
    load = mean.make_loader()
    return std, Pointwise(out.device, out.dtype, lambda i: ops.to_dtype(load(i), out.dtype),
                          mean.get_size())


@register_lowering(aten.aminmax.default)
def _aminmax(ctx, x, *, dim=None, keepdim=False):
    dims = _dims(x, dim)
    dtype = ctx.output(0).dtype
    return (reduce(ctx, x, dims, "min", dtype, dtype, keepdim),
            reduce(ctx, x, dims, "max", dtype, dtype, keepdim))
