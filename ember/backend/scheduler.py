"""The scheduler: dependencies between buffers, fusion into kernels, and buffer lifetimes.

Each ComputedBuffer becomes a :class:`SchedulerNode`; its reads (buffer name, index) come from
running its body under a recording ops handler. Nodes are then packed, in graph order, into
:class:`FusionGroup` s, each of which a target generates as one kernel. A group has outer loops
and one inner loop extent; a node joins it as

- ``outer``: a pointwise node over the outer loops (e.g. ``mean = sum / n``),
- ``inner``: a pointwise node over outer + inner loops,
- ``reduction``: a reduction over the inner loops, one result per outer iteration,
- ``across``: the first half of a split column sum over the outer loop, one partial sum per
  chunk of rows and inner index, accumulated as the rows go by (a target that keeps such
  partials, ``Target.sums_across_rows``: layer norm's weight gradients in the row kernel
  of its input gradient, which reads the same elements),

provided every value it reads from a node already in the kernel is available at that point of
the loop nest: a value made per outer iteration may be read anywhere after it at the same outer
index; a value made inside the inner loop only at the very same (outer, inner) index. That
gives vertical fusion (pointwise chains, pointwise prologues and epilogues of reductions,
softmax's max, sum and normalisation in one kernel) and horizontal fusion of independent
nodes with the same loops, without ever recomputing a node. A node joins the latest kernel
it fits, looking back past steps it does not depend on. A buffer read only inside its own
kernel, at the point where it is made, is never written to memory.
"""
from __future__ import annotations

import dataclasses
import itertools
from typing import Callable, Sequence

import sympy
import torch

from ember.backend.ir import (Buffer, ComputedBuffer, ExternBuffer, FloorDiv, ModIndex,
                              Reduction, ReinterpretView, Scatter, flat_index, index_vars,
                              product, split_index)
from ember.backend.loops import store_order
from ember.backend.ops import use_handler


class _ReadRecorder:
    """An ops handler that records every load."""

    def __init__(self):
        self.reads: list[tuple[str, sympy.Expr]] = []
        self._n = 0

    def load(self, name, index):
        self.reads.append((name, sympy.expand(index)))
        return 0

    def indirect_indexing(self, value, size, wrap_negative=False, check=None):
        self._n += 1
        return sympy.Symbol(f"indirect{self._n}", integer=True)

    def masked(self, mask, body, other):
        return body()

    def reduction(self, *args):
        return 0

    def __getattr__(self, name):
        return lambda *args, **kwargs: 0


def is_gathered(index: sympy.Expr) -> bool:
    """An index from ``extract_reads`` that holds a loaded value (``indirect_indexing``'s
    symbol: a gathered row)."""
    return any(s.name.startswith("indirect") for s in index.free_symbols)


def extract_reads(loader: Callable, *index_lists) -> list[tuple[str, sympy.Expr]]:
    recorder = _ReadRecorder()
    with use_handler(recorder):
        loader(*index_lists)
    return recorder.reads


@dataclasses.dataclass(eq=False)
class SchedulerNode:
    """A realized buffer's loop nest with its size-1 dims removed (so ``[n, 1]`` pointwise
    nodes line up with ``[n]`` reductions). ``body(vars)`` / ``body(x, r)`` evaluates the value,
    ``store_index(vars)`` gives where it is written."""
    buf: ComputedBuffer
    is_reduction: bool
    ranges: list
    rranges: list
    body: Callable
    store_index: Callable
    reads: list = dataclasses.field(default_factory=list)
    role: str = ""         # outer / inner / reduction, once placed in a kernel
    # inner node iterated in another dim order, or a Regroup of the kernel's dims (Reordered
    # after a code generator reordered the kernel's loops): loop_vars
    perm: tuple | Regroup | Reordered | None = None
    # node_reads by (x, r, role, perm): fusion decisions ask again and again, and running
    # the body (through every view inlined into it) is the scheduler's main cost
    read_cache: dict = dataclasses.field(default_factory=dict)

    @property
    def name(self):
        return self.buf.name

    def loop_vars(self, x: list, r: list, role: str | None = None,
                  perm: tuple | None = None) -> list:
        """The node's index in a kernel whose loop variables are ``x`` (outer) and ``r``
        (inner): dim ``i`` of an ``inner`` node is kernel variable ``perm[i]`` (identity by
        default), so ``exp(x - max)`` over ``[n, c]`` can run inside a reduction over dim 0,
        whose kernel loops over ``c`` outside ``n``."""
        if role is None:         # where the node was placed
            role, perm = self.role, self.perm
        kernel_vars = list(x) if role in ("outer", "scatter") else list(x) + list(r)
        if isinstance(perm, (Regroup, Reordered)):
            return perm.node_vars(kernel_vars)
        return [kernel_vars[p] for p in perm] if perm else kernel_vars

    def value(self, x: list, r: list):
        """The node's body at the kernel's loop variables."""
        if isinstance(self.perm, Across):
            return self.body(*self.perm.node_vars(x, r))
        if self.is_reduction:
            return self.body(x, r)
        return self.body(self.loop_vars(x, r))

    def where(self, x: list, r: list):
        """The index the node's value is stored at."""
        if isinstance(self.perm, Across):
            return self.store_index(self.perm.node_vars(x, r)[0])
        if self.is_reduction:
            return self.store_index(x)
        return self.store_index(self.loop_vars(x, r))

    @property
    def writes(self) -> str:
        return self.buf.storage_name()


def _squeezer(ranges):
    keep = [i for i, s in enumerate(ranges) if s != 1]
    n = len(ranges)

    def expand(vars_):
        full = [sympy.Integer(0)] * n
        for v, i in zip(vars_, keep):
            full[i] = v
        return full
    return [ranges[i] for i in keep], expand


def make_node(buf: ComputedBuffer) -> SchedulerNode:
    data = buf.data
    if isinstance(data, Scatter):
        x = index_vars("x", len(data.ranges))
        node = SchedulerNode(buf, False, list(data.ranges), [], data.inner_fn,
                             data.store_index, role="scatter")
        node.reads = extract_reads(lambda i: (data.inner_fn(i), data.store_index(i)), x)
        return node
    ranges, expand = _squeezer(list(data.ranges))
    store_index = lambda x: buf.layout.index(expand(x))   # noqa: E731
    if isinstance(data, Reduction):
        rranges, rexpand = _squeezer(list(data.reduction_ranges))
        body = lambda x, r: data.inner_fn(expand(x), rexpand(r))   # noqa: E731
        node = SchedulerNode(buf, True, ranges, rranges, body, store_index)
        node.reads = extract_reads(body, index_vars("x", len(ranges)),
                                   index_vars("r", len(rranges)))
    else:
        body = lambda x: data.inner_fn(expand(x))   # noqa: E731
        node = SchedulerNode(buf, False, ranges, [], body, store_index)
        node.reads = extract_reads(body, index_vars("x", len(ranges)))
    return node


@dataclasses.dataclass(eq=False)
class FusionGroup:
    """The nodes the scheduler fused to be computed by one kernel, and their loops.

    Named for what it is to the scheduler, a group of nodes, not "kernel": a kernel is what a
    target generates from a group (``CppKernel``, ``TritonKernel``; ``codegen.common.Kernel``).
    """
    outer: list
    inner: list
    nodes: list = dataclasses.field(default_factory=list)
    local: set = dataclasses.field(default_factory=set)   # buffers never written to memory
    # buffers read only inside this kernel, before loop segments are split (a target that
    # keeps whole rows in registers can keep all of these local)
    kernel_local: set = dataclasses.field(default_factory=set)
    segments: list = dataclasses.field(default_factory=list)   # (kind, nodes), see below


@dataclasses.dataclass(frozen=True)
class Regroup:
    """A pointwise node's dims as other groupings of a kernel's loops with the same sizes: a
    [2, 16, 256] node (a view's body) in a [32] x [256] kernel is (x // 16, x % 16, r). Each
    group is (kernel dims, node sizes), one side a single dim; a node dim is a quotient and
    remainder of its group's flat index, by whole-number sizes only, so the loads of a
    contiguous buffer fold back to the kernel's index (``ir.fold_div_mod``); a placement
    that leaves a division in any index is refused (``_read_ok``)."""
    groups: tuple            # ((kernel dim positions), (kernel sizes), (node sizes)), ...

    def node_vars(self, kernel_vars: list) -> list:
        out = []
        for dims, sizes, node_sizes in self.groups:
            flat = flat_index([kernel_vars[d] for d in dims], sizes)
            out += split_index(flat, list(node_sizes))
        return out

    @staticmethod
    def of(kernel_sizes: list, node_sizes: list) -> Regroup | None:
        """The grouping that lines ``node_sizes`` up with ``kernel_sizes``, or None."""
        groups, i, j = [], 0, 0
        kernel_sizes = [sympy.sympify(k) for k in kernel_sizes]
        node_sizes = [sympy.sympify(n) for n in node_sizes]
        while i < len(kernel_sizes) and j < len(node_sizes):
            dims, ks, ns = [i], [kernel_sizes[i]], [node_sizes[j]]
            i, j = i + 1, j + 1
            while product(ks) != product(ns):
                ratio = sympy.simplify(product(ns) / product(ks))
                if ratio.is_Integer and ratio > 1 and i < len(kernel_sizes) and len(ns) == 1:
                    dims.append(i)
                    ks.append(kernel_sizes[i])
                    i += 1
                elif (1 / ratio).is_Integer and j < len(node_sizes) and len(ks) == 1 \
                        and node_sizes[j].is_Integer:
                    ns.append(node_sizes[j])
                    j += 1
                else:
                    return None
            groups.append((tuple(dims), tuple(ks), tuple(ns)))
        if i < len(kernel_sizes) or j < len(node_sizes) or \
                all(len(d) == 1 and len(n) == 1 for d, _, n in groups):
            return None
        return Regroup(tuple(groups))


@dataclasses.dataclass(frozen=True)
class Reordered:
    """A Regroup of a kernel whose loops a code generator then reordered (a C++ kernel in
    its store's memory order): the kernel's original dim ``i`` is now dim ``perm[i]``."""
    perm: tuple
    regroup: Regroup

    def node_vars(self, kernel_vars: list) -> list:
        return self.regroup.node_vars([kernel_vars[p] for p in self.perm])


# the chunk of rows an ``across`` node's partial sums cover: a loop variable of its kernel
CHUNK = sympy.Symbol("x_chunk", integer=True, nonnegative=True)
ACROSS_MIN_CHUNKS = 8     # the kernel's threads take whole chunks: at least this many
ACROSS_MAX_COLUMNS = 4096  # partial sums kept per chunk (on the stack, with their totals)
ACROSS_MAX_SUMS = 4        # ... of at most this many column sums a kernel: 192 KB at most


@dataclasses.dataclass(frozen=True)
class Across:
    """How a column sum's first, split half runs inside a row kernel whose outer loops
    cover its chunks of rows: partial sums over ``[*grid, columns]`` (or ``[columns,
    *grid]``), each over ``rows`` consecutive rows of the kernel's flattened outer loops
    (``outer``), the kernel's inner index the column. The kernel's row ``x`` (flat) is row
    ``x - rows * chunk`` of chunk :data:`CHUNK`; the kernel loops over chunks, each chunk's
    rows in order, and keeps the chunk's partial sums until its last row. Batch norm's
    backward over channels-last [16, 28, 28] x [32] has [16, 2, 32] partials of 392 rows."""
    rows: int
    grid: tuple               # the node's chunk dims
    outer: tuple              # the kernel's outer sizes
    chunk_first: bool         # the node's dims are [*grid, columns], else [columns, *grid]

    @property
    def chunks(self) -> int:
        return int(product(self.grid))

    def node_vars(self, x: list, r: list) -> tuple[list, list]:
        """The node's (index, reduction index) at the kernel's loop variables."""
        chunk = split_index(CHUNK, list(self.grid)) if len(self.grid) > 1 else [CHUNK]
        index = [*chunk, r[0]] if self.chunk_first else [r[0], *chunk]
        return index, [flat_index(x, self.outer) - self.rows * CHUNK]

    @staticmethod
    def of(node: SchedulerNode, kernel: FusionGroup) -> list[Across]:
        """The ways ``node``, a reduction, is such a column sum of ``kernel``'s elements."""
        outer, inner = kernel.outer, kernel.inner
        data = node.buf.data
        sizes = [*outer, *inner, *node.ranges, *node.rranges]
        if (not outer or len(inner) != 1 or len(node.ranges) < 2
                or len(node.rranges) != 1 or not all(isinstance(v, (int, sympy.Integer))
                                                     for v in sizes)
                or data.reduction_type != "sum" or data.src_dtype != torch.float32
                or node.buf.get_dtype() != torch.float32 or node.writes != node.name
                or inner[0] > ACROSS_MAX_COLUMNS
                or not any(n.role in ("inner", "reduction") for n in kernel.nodes)
                or any(n.role == "scatter" for n in kernel.nodes)
                or any(isinstance(n.perm, Across) and n.perm.rows != node.rranges[0]
                       for n in kernel.nodes)
                or sum(n.role == "across" for n in kernel.nodes) >= ACROSS_MAX_SUMS):
            return []
        rows = int(node.rranges[0])
        found = []
        for chunk_first in (True, False):
            columns = node.ranges[-1] if chunk_first else node.ranges[0]
            grid = tuple(int(v) for v in (node.ranges[:-1] if chunk_first else node.ranges[1:]))
            across = Across(rows, grid, tuple(int(v) for v in outer), chunk_first)
            if columns == inner[0] and across.chunks * rows == product(outer) and \
                    across.chunks >= ACROSS_MIN_CHUNKS:
                found.append(across)
        return found


def _placements(node: SchedulerNode, kernel: FusionGroup, across: bool = False
                ) -> list[tuple[str, object]]:
    """The ways ``node`` could join ``kernel``: (role, dim permutation or Regroup of an inner
    or outer node, or an ``Across`` of a column sum where ``across`` allows)."""
    outer, inner = kernel.outer, kernel.inner
    if node.is_reduction:
        same = [("reduction", None)] if node.ranges == outer and node.rranges == inner else []
        return same + ([("across", a) for a in Across.of(node, kernel)] if across else [])
    if node.ranges == outer + inner:
        return [("inner", None)]
    if node.ranges == outer:
        return [("outer", None)]
    sizes = outer + inner
    regrouped = [(role, Regroup.of(dims, node.ranges))
                 for role, dims in (("inner", sizes), ("outer", outer)) if dims]
    regrouped = [(role, g) for role, g in regrouped if g is not None]
    if (not inner or len(node.ranges) != len(sizes) or len(sizes) > MAX_PERMUTED_DIMS
            or not any(n.is_reduction for n in kernel.nodes)):
        return regrouped
    # a pointwise node around a reduction over a non-last dim: same loops, other order
    return [("inner", p) for p in itertools.permutations(range(len(sizes)))
            if [sizes[i] for i in p] == node.ranges] + regrouped


def node_reads(node: SchedulerNode, x: list, r: list, role: str | None = None,
               perm: tuple | None = None):
    """The node's reads with its loop variables named as the kernel's (x outer, r inner)."""
    if role is None:         # where the node is placed now
        role, perm = node.role, node.perm
    key = (tuple(x), tuple(r), None if node.is_reduction else role,
           perm if isinstance(perm, Across) or not node.is_reduction else None)
    reads = node.read_cache.get(key)
    if reads is None:
        if isinstance(perm, Across):
            reads = extract_reads(node.body, *perm.node_vars(x, r))
        elif node.is_reduction:
            reads = extract_reads(node.body, x, r)
        else:
            reads = extract_reads(node.body, node.loop_vars(x, r, role, perm))
        node.read_cache[key] = reads
    return reads


def _read_ok(kernel: FusionGroup, node: SchedulerNode, role: str, perm=None) -> bool:
    """Every value ``node`` reads from ``kernel`` is available where ``node`` runs, and an
    in-place write never races with a read of the same memory at another index."""
    x, r = index_vars("x", len(kernel.outer)), index_vars("r", len(kernel.inner))
    reads = node_reads(node, x, r, role, perm)
    if isinstance(perm, Across):
        # each element where the kernel's loops are (no chunk left in an index once the
        # row in the chunk is ``x - rows * chunk``); a value of the kernel consumed, or a
        # load shared; the values read from the kernel checked below
        writes = {n.writes for n in kernel.nodes}
        if any(sympy.expand(index).has(CHUNK) for _, index in reads) or not (
                any(name in writes for name, _ in reads)
                or _shares_a_read(kernel, node, role, perm)):
            return False
    if isinstance(perm, Regroup) and any(
            sympy.expand(index).has(FloorDiv, ModIndex) for index in
            [index for _, index in reads] + [node.store_index(node.loop_vars(x, r, role, perm))]):
        return False     # a division per element: the node keeps loops of its own
    by_storage = {n.writes: n for n in kernel.nodes}
    for name, index in reads:
        producer = by_storage.get(name)
        if producer is None:
            continue
        if producer.role == "across":       # complete only after the kernel's last row
            return False
        if producer.role == "inner" and role == "outer":
            return False
        if sympy.simplify(index - producer.where(x, r)) != 0:
            return False
    if node.writes != node.name:
        mine = node.store_index(node.loop_vars(x, r, role, perm))
        everything = reads + [rd for other in kernel.nodes for rd in node_reads(other, x, r)]
        if any(name == node.writes and sympy.simplify(index - mine) != 0
               for name, index in everything):
            return False
    return True


def in_store_order(group: FusionGroup, x: list, r: list) -> FusionGroup:
    """A pointwise group whose first store walks memory in another order than its loops (a
    channels-last value over logical ``[n, c, h, w]``) iterates in that store's order: its
    inner loop runs along stride 1 (contiguous SIMD loads and stores), not along ``w`` with
    a stride of ``c``. The store is the first one to memory: a group norm's input gradient,
    regrouped onto the [N, G, C/G, H*W] loops of a local value, stores channels-last.
    Returns a copy whose nodes take their dims through ``perm``, or the group itself."""
    # (symbolic sizes too: a pointwise loop nest may run in any order; the order comes
    # from the store's coefficients, which must be numbers)
    if (len(group.inner) != 1 or not group.outer
            or any(n.role != "inner" or isinstance(n.perm, Reordered) for n in group.nodes)):
        return group
    sizes, kernel_vars = list(group.outer) + list(group.inner), list(x) + list(r)
    order = [kernel_vars.index(v)
             for v in store_order(group, x, r, sizes, kernel_vars, stored=True)[1]]
    if order == sorted(order):
        return group
    at = {dim: i for i, dim in enumerate(order)}
    perm = tuple(at[dim] for dim in range(len(sizes)))

    def moved(n):       # the node's dims through the reordered loops
        if isinstance(n.perm, Regroup):
            return Reordered(perm, n.perm)
        return tuple(perm[p] for p in n.perm) if n.perm else perm
    copies = {id(n): dataclasses.replace(n, perm=moved(n), read_cache={})
              for n in group.nodes}
    sizes = [sizes[dim] for dim in order]
    return dataclasses.replace(
        group, outer=sizes[:-1], inner=sizes[-1:],
        nodes=[copies[id(n)] for n in group.nodes],
        segments=[(kind, [copies[id(n)] for n in nodes]) for kind, nodes in group.segments])


def schedule(buffers: Sequence[Buffer], output_names: set[str], share_only: bool = True,
             across: bool = False) -> list:
    """Kernels and extern calls in execution order. ``share_only``: a node regrouped onto a
    kernel's loops joins it only to consume its values or share a load
    (``Target.regroups_only_to_share_loads``); ``across``: a split column sum's first half
    may join a row kernel that reads its elements (``Target.sums_across_rows``)."""
    steps: list = []
    for buf in buffers:
        if isinstance(buf, ExternBuffer):
            steps.append(buf)
            continue
        node = make_node(buf)
        if node.role == "scatter":       # a kernel of its own, run sequentially
            steps.append(FusionGroup(list(node.ranges), [], [node]))
            continue
        if _fusable_kernel(steps, node, share_only, across) is not None:
            continue
        if node.is_reduction:
            kernel = FusionGroup(list(node.ranges), list(node.rranges))
            node.role = "reduction"
        elif node.ranges:
            kernel = FusionGroup(list(node.ranges[:-1]), list(node.ranges[-1:]))
            node.role = "inner"
        else:
            kernel = FusionGroup([], [])
            node.role = "outer"
        kernel.nodes.append(node)
        steps.append(kernel)
    _mark_local_buffers(steps, output_names)
    for step in steps:
        if isinstance(step, FusionGroup):
            step.kernel_local = set(step.local)
            _segment(step)
    _reuse_dead_buffers(steps, output_names)
    return steps


def _uses(node: SchedulerNode) -> list[str]:
    """The buffers a node reads, and the one it writes into when that is not its own (a
    scatter's target, or memory it took over): both need the memory."""
    names = [name for name, _ in node.reads]
    if node.writes != node.name:
        names.append(node.writes)
    return names


def _last_readers(steps: list) -> dict[str, object]:
    """Buffer name -> the scheduler node or extern call that uses it last (``_uses``)."""
    last: dict[str, object] = {}
    for step in steps:
        if isinstance(step, FusionGroup):
            for node in step.nodes:
                for name in _uses(node):
                    last[name] = node
        else:
            for name in _extern_reads(step):
                last[name] = step
    return last


def reuse_dying_inputs(steps: list, output_names: set[str]) -> int:
    """Write a kernel's result over a buffer an earlier step made that dies in this kernel.

    A batch norm + ReLU after a convolution reads the convolution's output once, at the
    index it writes, and nothing reads it after: the result can overwrite it in place (no
    new buffer, no page faults on fresh memory, half the cache footprint), as eager's
    in-place ``relu_`` would. The donor is a generated kernel's buffer or a library call's
    fresh result (never a graph input, an output, or anything a fallback ATen call read:
    its result may alias it); it has the node's exact layout, and every read of it in the
    kernel is at the index the node writes. Runs after matmul epilogues are fused (their
    template computes the matmul in place of its buffer). Returns how many were reused.
    """
    last_reader = _last_readers(steps)
    read_by_fallback: set[str] = set()
    donors: dict[str, object] = {}            # name -> layout of buffers memory may come from
    for step in steps:
        if isinstance(step, FusionGroup):
            donors.update((node.name, node.buf.layout) for node in step.nodes
                          if node.name not in step.local and node.writes == node.name)
        elif not step.is_library:
            read_by_fallback.update(_extern_reads(step))
        elif step.parent is None and step.layout is not None:
            donors[step.name] = step.layout
    taken = {node.buf.reuses for step in steps if isinstance(step, FusionGroup)
             for node in step.nodes if node.buf.reuses}
    count = 0
    for step in steps:
        if not isinstance(step, FusionGroup) or getattr(step, "matmul", None) is not None:
            continue
        made = {n.name for n in step.nodes}
        x, r = index_vars("x", len(step.outer)), index_vars("r", len(step.inner))
        for i, node in enumerate(step.nodes):
            # (a value some target keeps in registers, ``kernel_local``, needs no memory)
            if node.role != "inner" or node.writes != node.name or node.name in output_names \
                    or node.name in step.local or node.name in step.kernel_local:
                continue
            here = node.where(x, r)
            # the donor may be read by nodes computed before this one in the kernel (batch
            # norm's value, kept local, then SiLU of it stored), never after it
            so_far = step.nodes[:i + 1]
            names = dict.fromkeys(nm for other in so_far for nm, _ in node_reads(other, x, r))
            for name in names:
                if (donors.get(name) != node.buf.layout or name in made
                        or name in output_names or name in taken or name in read_by_fallback
                        or not any(last_reader.get(name) is n for n in so_far)):
                    continue
                if any(nm == name and sympy.simplify(ix - here) != 0
                       for other in step.nodes for nm, ix in node_reads(other, x, r)):
                    continue
                node.buf.reuses = name
                taken.add(name)
                count += 1
                break
    return count


LOOKBACK = 8   # kernels back the scheduler searches for one a node can join
MAX_PERMUTED_DIMS = 4   # loop orders tried for a pointwise node are at most 4! = 24


def _step_names(step) -> tuple[set, set]:
    """(storage names a step writes, names it reads)."""
    if isinstance(step, FusionGroup):
        return ({n.writes for n in step.nodes},
                {name for n in step.nodes for name, _ in n.reads})
    return {step.name}, set(_extern_reads(step))


def _fusable_kernel(steps: list, node: SchedulerNode, share_only: bool = True,
                    across: bool = False) -> FusionGroup | None:
    """Add ``node`` to the latest kernel it fits, searching back past steps it does not
    depend on (so ``var``'s epilogue joins its reduction even when another reduction was
    scheduled in between). A step that writes what the node reads, or reads or writes what
    it writes, is as far up as the node can move; a kernel before it that shares values
    with the node may still move down to meet it, past steps that neither read what it
    writes nor write what it reads or writes (GPT-2's GELU, recomputed in the backward for
    its weight's gradient, meets its derivative after the matmul that the derivative reads).
    Returns the kernel, or None."""
    mine = {name for name, _ in node.reads}
    seen, barrier = 0, None     # barrier: index of the last step the node must follow
    for i in range(len(steps) - 1, -1, -1):
        step = steps[i]
        writes, reads = _step_names(step)
        if isinstance(step, FusionGroup) and not any(n.role == "scatter" for n in step.nodes):
            if barrier is None or (mine & (writes | reads) and _sinks(steps, i, barrier)):
                for role, perm in _placements(node, step, across):
                    if perm is not None and not isinstance(perm, Across) and \
                            not mine & writes and not (
                            isinstance(perm, Regroup) and mine & reads and (
                                not share_only or _shares_a_read(step, node, role, perm))):
                        continue   # another loop order only to consume or share its reads
                    if role in ("inner", "reduction") and perm is None and share_only and \
                            _reads_transposed(step, node, role):
                        continue
                    if _read_ok(step, node, role, perm):
                        if barrier is not None:
                            steps.insert(barrier, steps.pop(i))
                        node.role, node.perm = role, perm
                        step.nodes.append(node)
                        return step
                if across and node.is_reduction and _joins_in_store_order(step, node):
                    if barrier is not None:
                        steps.insert(barrier, steps.pop(i))
                    return step
            seen += 1
            if seen >= LOOKBACK:
                return None
        if barrier is None and (writes & mine or node.writes in writes or node.writes in reads):
            barrier = i
    return None


def _shares_a_read(kernel: FusionGroup, node: SchedulerNode, role: str, perm) -> bool:
    """``node``, placed so, reads some buffer at the same index as a node of ``kernel``
    does, an index that moves with every loop (a load per element, not a broadcast
    scalar or row statistic): one load serves both. (A layer norm's input gradient
    regrouped into the split column sums of its weight's gradient read the same buffers
    transposed: no load shared, and every one of the sums' loads strided; 1.8 ms against
    eager's 0.8 for the whole backward.)"""
    mine, theirs = _element_reads(kernel, node, role, perm)
    return any(index in theirs.get(name, ()) for name, index in mine)


def _element_reads(kernel: FusionGroup, node: SchedulerNode, role: str, perm=None
                   ) -> tuple[list, dict]:
    """(``node``'s reads placed so whose index moves with every loop of ``kernel``, the
    indices at which ``kernel``'s nodes read each buffer), expanded."""
    x, r = index_vars("x", len(kernel.outer)), index_vars("r", len(kernel.inner))
    loops = [set(v) for v in (x, r) if v]
    theirs: dict[str, set] = {}
    for other in kernel.nodes:
        for name, index in node_reads(other, x, r):
            theirs.setdefault(name, set()).add(sympy.expand(index))
    mine = [(name, index) for name, index in
            ((name, sympy.expand(index)) for name, index in node_reads(node, x, r, role, perm))
            if all(index.free_symbols & v for v in loops)]
    return mine, theirs


def _joins_in_store_order(kernel: FusionGroup, node: SchedulerNode) -> bool:
    """Add ``node``, a column sum, to ``kernel``, a pointwise kernel whose loops run in
    another order than its store (channels-last values over logical [N, C, H, W] loops), as
    an ``across`` sum over the kernel's loops in store order ([N, H, W] x [C]): the kernel
    then loops so (``in_store_order``, which the code generator would do anyway). Batch
    norm's backward over channels-last data sums ReLU's masked gradient where it is made."""
    if product(node.ranges) * product(node.rranges) != product(kernel.outer + kernel.inner):
        return False        # (cheap first: the store order takes derivatives of its index)
    x, r = index_vars("x", len(kernel.outer)), index_vars("r", len(kernel.inner))
    moved = in_store_order(kernel, x, r)
    if moved is kernel:
        return False
    for role, perm in _placements(node, moved, across=True):
        if role == "across" and _read_ok(moved, node, role, perm):
            kernel.outer, kernel.inner, kernel.nodes = moved.outer, moved.inner, moved.nodes
            node.role, node.perm = role, perm
            kernel.nodes.append(node)
            return True
    return False


def _reads_transposed(kernel: FusionGroup, node: SchedulerNode, role: str) -> bool:
    """``node``, on ``kernel``'s loops as they are, reads a buffer the kernel reads, per
    element, along other loops (not at one of the kernel's indices of it, nor a constant
    offset from one). A split column sum whose [chunks, columns] x [rows] happen to be a
    row kernel's [B, T] x [C] (layer norm of [8, 256, 256]) read every element of its rows
    strided, recomputing their row statistics per element; or the row kernel's pointwise
    input gradient joined the column sum's loops. Either way the training step took 2.44
    ms against eager's 0.56."""
    mine, theirs = _element_reads(kernel, node, role)
    return any(name in theirs and all((index - other).free_symbols for other in theirs[name])
               for name, index in mine)


def _sinks(steps: list, i: int, last: int) -> bool:
    """Kernel ``steps[i]`` can run after ``steps[i + 1 : last + 1]``: none of them reads what
    it writes or writes what it reads or writes."""
    writes, reads = _step_names(steps[i])
    for step in steps[i + 1:last + 1]:
        w, r = _step_names(step)
        if w & (writes | reads) or r & writes:
            return False
    return True


def _segment(kernel: FusionGroup) -> None:
    """Split the kernel's nodes into code segments, in order: ``("outer", nodes)`` run once
    per outer iteration, ``("loop", nodes)`` share one inner loop. A node that reads a
    reduction finished in the current loop starts a new loop. A value made inside an inner
    loop stays local (never stored) only if every reader is in that same loop. A column sum
    accumulated across rows that reads no such value joins the last loop (a row kernel's
    pointwise pass, not its reductions' lane blocks: layer norm's backward, 2048 x 256, 1
    thread, 269 -> 221 us)."""
    segs: list = []
    x = index_vars("x", len(kernel.outer))
    r = index_vars("r", len(kernel.inner))
    made_inside = {n.writes for n in kernel.nodes if n.role == "inner"}
    late = [n for n in kernel.nodes if n.role == "across" and
            not any(name in made_inside for name, _ in node_reads(n, x, r))]
    for node in kernel.nodes:
        if node in late:
            continue
        if node.role in ("outer", "scatter"):
            if segs and segs[-1][0] == "outer":
                segs[-1][1].append(node)
            else:
                segs.append(("outer", [node]))
            continue
        if segs and segs[-1][0] == "loop":
            reductions = {n.writes for n in segs[-1][1] if n.role == "reduction"}
            reads = {name for name, _ in node_reads(node, x, r)}
            if not (reads & reductions):
                segs[-1][1].append(node)
                continue
        segs.append(("loop", [node]))
    for node in late:
        # the last loop, unless the node reads a value made there or after it
        at = max((i for i, (kind, _) in enumerate(segs) if kind == "loop"), default=None)
        later = {n.writes for _, nodes in segs[at or 0:] for n in nodes}
        if at is None or any(name in later for name, _ in node_reads(node, x, r)):
            segs.append(("loop", [node]))
        else:
            segs[at][1].append(node)
    for kind, nodes in segs:
        if kind != "loop":
            continue
        mine = {n.name for n in nodes if n.role == "inner"}
        for _, others in segs:
            if others is nodes:
                continue
            for other in others:
                for name, _ in node_reads(other, x, r):
                    if name in mine:
                        kernel.local.discard(name)
    kernel.segments = segs


def _mark_local_buffers(steps: list, output_names: set[str]) -> None:
    readers: dict[str, list] = {}
    for step in steps:
        if isinstance(step, FusionGroup):
            for node in step.nodes:
                for name in _uses(node):
                    readers.setdefault(name, []).append(step)
        else:
            for name in _extern_reads(step):
                readers.setdefault(name, []).append(step)
    for step in steps:
        if not isinstance(step, FusionGroup):
            continue
        for node in step.nodes:
            if node.writes != node.name or node.name in output_names:
                continue
            # inner-loop values are confirmed local per loop segment by the code generator
            if all(u is step for u in readers.get(node.name, [])):
                step.local.add(node.name)


def _extern_reads(buf: ExternBuffer) -> list[str]:
    names = []

    def visit(a):
        if isinstance(a, (Buffer, ReinterpretView)):
            names.append(a.name)
        elif isinstance(a, (list, tuple)):
            for x in a:
                visit(x)
    visit(buf.args)
    visit(list(buf.kwargs.values()))
    if buf.parent is not None:
        names.append(buf.parent.name)
    return names


def _reuse_dead_buffers(steps: list, output_names: set[str]) -> None:
    """Write a node's result over a buffer of the same kernel that dies at that node.

    Softmax is the example: ``e = exp(x - max)`` is stored while its row is summed, then
    ``out = e / sum`` reads each element once, at the index it writes; ``out`` can overwrite
    ``e`` in place, saving a buffer and a pass over memory (what eager's kernel does).
    """
    last_reader = _last_readers(steps)
    for step in steps:
        if not isinstance(step, FusionGroup):
            continue
        made = {n.name: n for n in step.nodes}
        x = index_vars("x", len(step.outer))
        r = index_vars("r", len(step.inner))
        taken: set[str] = set()
        for node in step.nodes:
            # a value kept local needs no memory (and is read by its own name)
            if node.role != "inner" or node.writes != node.name or node.name in step.local:
                continue
            for name, index in node_reads(node, x, r):
                donor = made.get(name)
                if (donor is None or donor is node or donor.role != "inner"
                        or name in step.local or name in output_names or name in taken
                        or last_reader.get(name) is not node
                        or donor.writes != donor.name
                        or donor.buf.layout.dtype != node.buf.layout.dtype
                        or donor.buf.layout.size != node.buf.layout.size
                        or donor.buf.layout.stride != node.buf.layout.stride):
                    continue
                if any(nm == name and sympy.simplify(ix - node.where(x, r)) != 0
                       for nm, ix in node_reads(node, x, r)):
                    continue
                node.buf.reuses = name
                taken.add(name)
                break
