"""Triton code generation for fused kernels (CUDA GPUs; CPUs through Triton's interpreter).

One ``@triton.jit`` function per :class:`FusionGroup`, all of a graph's kernels in one
Python module. Tiling:

- **pointwise kernels** (every node over the full loop nest) are one flat range of
  ``xnumel`` elements in blocks of XBLOCK;
- **kernels with reductions**, or with values made once per outer index, are 2-D tiles:
  XBLOCK rows of the outer loops (axis 0) by RBLOCK elements of the inner loops (axis 1).
  A row that fits in one block is *persistent*: the whole row lives in registers, every
  segment of the kernel (softmax's max, sum and division) works on the same tile, and values
  read by later segments are never written to memory. Longer rows *loop* over RBLOCK
  chunks once per segment, with one accumulator per lane, reduced across lanes at the end.

Loop dims that every access runs through contiguously are merged first
(``loops.merge_dims``), so a contiguous tensor is indexed by ``xindex`` itself and Triton
sees unit-stride accesses it can vectorise. Every load and store is masked by the axes its
index varies over; reductions ignore masked lanes. Indices are int32 unless a buffer or the
iteration space reaches 2^31 elements.

Symbolic sizes (graphs compiled once for every size, ``backend/symbolic.py``): sizes in
indices, masks and loop bounds are printed over the size symbols, which the kernel takes
as scalar int parameters after its buffers (``size_args``; never ``tl.constexpr``, and
``do_not_specialize``: one compiled kernel serves every value). Block sizes come from the
hints and are right at any size, as every access is masked; a reduction keeps its rows in
registers (persistent) only where the ranges bound its length by one block, else it loops
(a persistent block sized by the hint would drop the rest of a longer row). The launch
grid is computed per call from the numels the wrapper passes (``grid_numels``). Where a
choice holds only for some sizes (int32 indices, CUDA's limit on the second grid axis), it
is a guard of the shape environment: sizes that break it are compiled per size.
"""
from __future__ import annotations

import re

import sympy
import torch

from ember.backend.codegen.common import Kernel, group_kind, loop_steps, reduction_groups
from ember.backend.codegen.kernel_names import loop_kind
from ember.backend.targets.triton.ops import (HALF, TL_TYPES, TritonOpsHandler, TritonValue,
                                             compute_type, triton_constant, triton_index)
from ember.backend.ir import index_vars, product
from ember.backend.loops import access_indices, merge_dims, store_order
from ember.backend.ops import use_handler
from ember.backend.scheduler import FusionGroup, SchedulerNode
from ember.backend import sizevars
from ember.backend.sizevars import is_static, size_hint

POINTWISE_BLOCK = 1024        # elements per program of a flat pointwise kernel
PERSISTENT_MAX = 4096         # longest row reduced in one block
TILE = 4096                   # elements per program of a 2-D tile (XBLOCK * RBLOCK)
LOOP_RBLOCK = 1024            # chunk of a looped reduction (rows of contiguous elements)
COLUMN_XBLOCK = 64            # rows per program when accesses run along the outer dim
COLUMN_TILE = 4096            # elements per step of such a kernel's loop (XBLOCK * RBLOCK)
# ... where it updates a Welford state (mean, M2 and count per element of the tile: three
# accumulators' registers). H100, batch norm statistics of 64x256x56x56 bf16 channels-last:
# 75 us a call with 4096, 53 with 2048 (torch.compile's: 43), 74 with 1024; the column sums
# of its backward are fastest at 4096 (96 us against 101 at 2048)
COLUMN_WELFORD_TILE = 2048
# fewest programs a column kernel's XBLOCK is halved toward (0: COLUMN_XBLOCK always): a
# split reduction's second kernel over 256 channels runs 4 programs of 64
COLUMN_MIN_PROGRAMS = 0
TRANSPOSE_TILE = 64           # each side of a transposing pointwise kernel's tiles
INTERPRETER_TILE = 1 << 14    # the interpreter pays per program: fewer, larger ones
INT32_MAX = 2**31 - 1
GRID_AXIS1_MAX = 65535        # CUDA's limit on the second grid axis
SYMBOLIC_MIN_RBLOCK = 16      # chunk of a looped reduction over a symbolic length
SYMBOLIC_MIN_PROGRAMS = 128   # programs (at the hint) of such a reduction, where rows allow


def next_power_of_2(n: int) -> int:
    return 1 << max(int(n) - 1, 0).bit_length()


def _reduction_init(kind: str, dtype: torch.dtype) -> str:
    if kind in ("sum", "welford"):
        return "0"
    if kind == "prod":
        return "1"
    if kind in ("any",):
        return "0"
    if kind == "all":
        return "1"
    if dtype.is_floating_point:
        low = kind in ("max", "argmax")
        return 'float("-inf")' if low else 'float("inf")'
    if dtype is torch.bool:
        return "0" if kind in ("max", "argmax") else "1"
    info = torch.iinfo(dtype)
    return str(info.min if kind in ("max", "argmax") else info.max)


class TritonKernel(Kernel):
    """Generates one fused kernel's ``@triton.jit`` function and its launch line."""

    indent_unit = 4
    value_class = TritonValue

    def __init__(self, kernel: FusionGroup, name: str, dtypes: dict[str, torch.dtype],
                 interpret: bool = False, debug: bool = False):
        super().__init__(name, dtypes)
        self.kernel = kernel
        self.interpret = interpret
        self.debug = debug
        self.load_masks: list = []        # masks of enclosing ops.masked
        self.index_dims: dict[str, frozenset] = {}   # loop / indirect symbol -> tile axes
        self.config: dict[str, int] = {}
        self.candidates: list[dict] = []     # other configs max_autotune may time
        self.numel_x = 1                     # rows (flat: elements) the grid covers
        self.grid = 1
        # symbolic sizes: the numels (x, and r for a 2-D grid) the call passes, whose grid the
        # launcher computes per call (``grid`` is None then)
        self.grid_numels: list | None = None
        self.size_args: list[str] = []       # size symbols it takes (after the buffers)
        self.local: set[str] = set(kernel.local)
        self.numels: dict[str, int] = {}    # storage name -> elements (set by the target)
        self.int_constants: dict[str, int] = {}    # value name -> its integer constant
        self.checks_errors = False     # stores to the error flags (interpreter, see FLAGS)
        # node name -> the storage it is computed in place of (``reuses``; the wrapper
        # binds the name to that memory)
        self.in_place = {n.name: n.writes for n in kernel.nodes if n.buf.reuses}

    @property
    def kind(self) -> str:
        kind = loop_kind(self.kernel)    # (``persistent`` is known once generated)
        return "per" if kind == "red" and getattr(self, "persistent", False) else kind

    def declare(self, var: str, text: str) -> str:
        return f"{var} = {text}"

    def cse(self, text: str, dtype: torch.dtype, dims: frozenset = frozenset()) -> TritonValue:
        value = super().cse(text, dtype)
        value.dims = value.dims | dims
        return value

    # -- indices and memory ----------------------------------------------------------------------
    def index(self, expr) -> tuple[str, frozenset]:
        expr = sympy.expand(expr)
        dims = frozenset().union(*[self.index_dims.get(s.name, frozenset())
                                   for s in expr.free_symbols])
        return triton_index(expr), dims

    def mask(self, dims: frozenset) -> str | None:
        parts = [m for d, m in (("x", "xmask"), ("r", "rmask")) if d in dims]
        parts += [str(m) for m in self.load_masks]
        return " & ".join(parts) if parts else None

    def load(self, name: str, index) -> TritonValue:
        known = self.known_value(name, index)
        if known is not None:
            return known
        if name in self.local:
            raise AssertionError(f"{name} is kept local but read where it is not available")
        if self.in_place.get(name, name) in self.stored:
            # Triton orders no load after a store to the same memory (no alias analysis;
            # the thread that loads an element need not be the one that stored it): on an
            # H100 a LayerNorm read back a residual sum stored in place of the residual and
            # got the old values. A barrier orders them within the program, the only one
            # that wrote these elements.
            self.line("tl.debug_barrier()")
        self.loaded.add(name)
        text, index_dims = self.index(index)
        dims = index_dims | frozenset().union(*[getattr(m, "dims", frozenset())
                                                for m in self.load_masks])
        # a mask over more axes than the index (a constant index under ops.masked): the
        # pointer is spread over them, as tl.load wants the mask no wider than the pointer
        spread = self._zeros(dims - index_dims)
        mask = self.mask(dims)
        dtype = self.dtypes[name]
        load = f"tl.load(p_{name} + ({text}{spread})" + (f", {mask}, other=0)" if mask else ")")
        if dtype in HALF:
            load += ".to(tl.float32)"
        return self.cse(load, dtype, dims)

    def store(self, node: SchedulerNode, index, value: TritonValue) -> None:
        dtype = node.buf.get_dtype()
        if value.dtype != dtype:
            value = TritonOpsHandler(self).to_dtype(value, dtype)
        self.set_value(node.writes, index, value)
        if node.name in self.local:
            return
        self.stored.add(node.writes)
        self.line(self._store_text(node.writes, index, value, "tl.store"))

    def _store_text(self, name: str, index, value: TritonValue, fn: str,
                    only_where: str | None = None) -> str:
        text, dims = self.index(index)
        dims = dims | value.dims
        spread = self._zeros(dims - self.index(index)[1])
        mask = " & ".join(m for m in (self.mask(dims), only_where) if m)
        cast = f"{value}.to({TL_TYPES[self.dtypes[name]]})"
        return f"{fn}(p_{name} + ({text}{spread}), {cast}" + (f", {mask})" if mask else ")")

    def _zeros(self, dims: frozenset) -> str:
        """Text that broadcasts an index over the tile axes ``dims`` (a store of a row's
        value at an index that does not vary along them)."""
        if not dims:
            return ""
        if self.mode == "flat":
            return " + tl.zeros([XBLOCK], tl.int32)"
        shape = "[XBLOCK, RBLOCK]" if "r" in dims else "[XBLOCK, 1]"
        return f" + tl.zeros({shape}, tl.int32)"

    # set by generate(): under the interpreter (CPU tensors, where eager raises), a kernel
    # flags a zero integer divisor (FLAGS[0]) and an index out of range (FLAGS[1 + slot],
    # one per op kind: Kernel.index_check_slot) of the elements it computes; the wrapper
    # raises eager's exception after the launch. (A
    # kernel whose parameters another generate() writes, a matmul's, flags nothing.)
    flags_errors = False
    is_epilogue = False       # set by triton_matmul for a matmul's epilogue kernel
    FLAGS = "p_ember_flags"

    def flag_error(self, slot: int, condition: str, dims: frozenset) -> None:
        """Store 1 to flag ``slot`` where ``condition`` (text of a bool value over the
        axes ``dims``) holds in an element the kernel computes."""
        mask = self.mask(dims)
        var = self.new_var("flag")
        self.line(f"{var} = tl.where({mask}, {condition}, False)" if mask else
                  f"{var} = {condition}")
        self.line(f"tl.store({self.FLAGS} + {slot} + {var}.to(tl.int32) * 0, 1, {var})")
        self.checks_errors = True

    def flag_zero_division(self, divisor: TritonValue, dims: frozenset) -> None:
        self.flag_error(0, f"{divisor} == 0", dims)

    def indirect_indexing(self, value: TritonValue, size, wrap_negative=False,
                          check=None) -> sympy.Symbol:
        """An index read from memory. Out-of-range values are clamped so memory stays safe;
        under the interpreter they set the flag of ``check`` (FLAGS[1 + its slot]: the
        wrapper raises its exception, eager's); with ``debug`` a device-side assertion
        reports them. One index per value in a scope, as ``cse`` keeps one load: a gather
        that a softmax's two passes inline (DeBERTa's relative positions) loads once."""
        n = triton_index(size)
        key = f"indirect {value} {n} {wrap_negative} {check}"
        for scope in reversed(self.scopes):
            if key in scope:
                return sympy.Symbol(scope[key].name, integer=True)
        var = self.new_var("ix")
        self.scopes[-1][key] = self.value_class(var, torch.int64)
        text = f"{value}.to({self.index_type})"
        if wrap_negative:
            text = f"tl.where({value} < 0, {value} + {n}, {value}).to({self.index_type})"
        self.line(f"{var} = {text}")
        if self.interpret and self.flags_errors:
            self.flag_error(1 + self.index_check_slot(check), f"({var} < 0) | ({var} >= {n})",
                            value.dims)
        if self.debug:
            mask = self.mask(value.dims)
            bad = f"(({var} >= 0) & ({var} < {n}))"
            if mask:
                bad = f"{bad} | ~({mask})"
            self.line(f'tl.device_assert({bad}, "index out of range in {self.name}")')
        self.line(f"{var} = tl.minimum(tl.maximum({var}, 0), {n} - 1)")
        self.index_dims[var] = value.dims
        return sympy.Symbol(var, integer=True)

    # -- structure ---------------------------------------------------------------------------------
    def generate(self) -> str:
        k = self.kernel
        x = index_vars("x", len(k.outer))
        r = index_vars("r", len(k.inner))
        reductions = any(n.role == "reduction" for n in k.nodes)
        scatter = any(n.role == "scatter" for n in k.nodes)
        flat = not reductions and not scatter and all(n.role == "inner" for n in k.nodes)
        self.index_type = "tl.int64" if self._needs_int64() else "tl.int32"
        # a matmul's epilogue is launched with the template's arguments: no flags there
        self.flags_errors = self.interpret and not self.is_epilogue
        split = self._transposed_split(x, r) if flat else None
        with use_handler(TritonOpsHandler(self)):
            # a reduction over size-1 dims (no inner loop) still reduces: a flat kernel would
            # store its body's value (argmax's value, not index 0)
            if (scatter or flat or (not k.inner and not reductions)) and split is None:
                self.mode = "flat"
                self._generate_flat(x, r)
            else:
                self.mode = "tiled"
                self._generate_tiled(x, r, split)
        buffers = self._arg_names()
        self._guard_sizes()
        params = [f"p_{n}" for n in buffers] + self.size_args + \
            ([self.FLAGS] if self.checks_errors else []) + \
            [f"{c}: tl.constexpr" for c in self.config if c != "num_warps"]
        # tl.device_assert (debug's index checks) runs only in kernels compiled for debug;
        # size parameters are not specialised (on 1 or multiples of 16): one compile serves
        # every value
        options = (["debug=True"] if self.debug else []) + \
            ([f"do_not_specialize={self.size_args!r}"] if self.size_args else [])
        jit = f"@triton.jit({', '.join(options)})" if options else "@triton.jit"
        head = f"{jit}\ndef {self.name}({', '.join(params)}):\n"
        return head + "\n".join(self.lines) + "\n"

    def _arg_names(self) -> list[str]:
        self.args = self.buffer_args()
        names = sizevars.symbol_names()
        if names:     # the size symbols the body reads
            body = "\n".join(self.lines)
            self.size_args = sorted({w for w in _WORD.findall(body) if w in names},
                                    key=lambda n: (len(n), n))
        return self.args

    def _needs_int64(self) -> bool:
        """Whether an index may reach 2^31: the iteration space or a buffer it touches.
        With symbolic sizes, int32 indices are guarded: each such size stays below 2^31."""
        k = self.kernel
        exprs = [product(k.outer + k.inner)] + list(self.numels.values()) + \
            [n.buf.layout.storage_numel() for n in k.nodes]
        wide = max(size_hint(e) for e in exprs) >= INT32_MAX
        if not wide:
            for e in exprs:
                _guard_at_most(sizevars.simplify(e), INT32_MAX - 1)
        return wide

    def _guard_sizes(self) -> None:
        """Size arguments are passed as int32 (Triton types an int by its value; the
        compiled kernel keeps the type): each stays below 2^31."""
        env = sizevars.shape_env()
        for sym in env.symbols if env is not None else ():
            if sym.name in self.size_args:
                _guard_at_most(sym, INT32_MAX)

    def _set_grid(self, numels: list, blocks: list[int]) -> None:
        """The launch grid over ``numels`` (sizes) in ``blocks``: programs per axis, or, where
        a numel is symbolic, None with the numels the call passes."""
        if all(is_static(n) for n in numels):
            grid = tuple(-(-int(n) // b) for n, b in zip(numels, blocks))
            self.grid = grid if len(grid) > 1 else grid[0]
        else:
            self.grid = None
            self.grid_numels = list(numels)

    def _decompose(self, linear: str, vars_: list, sizes: list, axis: str) -> None:
        """Define each loop variable from the linear tile index ``linear`` (row-major)."""
        for i, (var, size) in enumerate(zip(vars_, sizes)):
            self.index_dims[var.name] = frozenset({axis})
            stride = product(sizes[i + 1:])
            text = linear if stride == 1 else f"{linear} // {triton_index(stride)}"
            if i > 0:
                text = f"({text}) % {triton_index(size)}"
            self.line(f"{var} = {text}")

    def _program_offset(self, block: str) -> str:
        pid = "tl.program_id(0)"
        if self.index_type == "tl.int64":
            pid += ".to(tl.int64)"
        return f"{pid} * {block}"

    def _generate_flat(self, x, r) -> None:
        """One flat range over every loop dim (pointwise kernels, scatters, scalars)."""
        k = self.kernel
        scatter = any(n.role == "scatter" for n in k.nodes)
        sizes = list(k.outer) + ([] if scatter else list(k.inner))
        loop_vars = list(x) + ([] if scatter else list(r))
        if not scatter:
            sizes, loop_vars = store_order(k, x, r, sizes, loop_vars)
        sizes, new_vars, subst = merge_dims(k, x, r, sizes, loop_vars)
        numel_expr = product(sizes)
        numel = size_hint(numel_expr)
        cap = INTERPRETER_TILE if self.interpret else POINTWISE_BLOCK
        block = min(next_power_of_2(numel), cap)
        self.config = {"XBLOCK": block, "num_warps": 4 if block >= 512 else
                       max(1, block // 128)}
        self._set_grid([numel_expr], [block])
        # max_autotune's candidates: other block sizes and warps over the same range
        self.candidates = [self.config] + [
            {"XBLOCK": b, "num_warps": w} for b in (256, 512, 1024, 2048, 4096)
            for w in (4, 8) if b <= next_power_of_2(numel) and b // w >= 32]
        self.numel_x = numel
        self.line(f"xindex = {self._program_offset('XBLOCK')} + tl.arange(0, XBLOCK)")
        self.line(f"xmask = xindex < {triton_index(numel_expr)}")
        self._decompose("xindex", new_vars, sizes, "x")
        cx = [subst.get(v, v) for v in x]
        cr = [] if scatter else [subst.get(v, v) for v in r]
        for kind, nodes in k.segments:
            for node in nodes:
                if node.role == "scatter":
                    self._scatter(node, cx)
                elif node.role == "outer":
                    self.store(node, node.where(cx, []), node.value(cx, []))
                else:
                    self.store(node, node.where(cx, cr), node.value(cx, cr))

    def _scatter(self, node, x) -> None:
        data = node.buf.data
        value = node.body(x)
        dtype = node.buf.get_dtype()
        if value.dtype != dtype:
            value = TritonOpsHandler(self).to_dtype(value, dtype)
        self.stored.add(node.writes)
        if data.accumulate and dtype is torch.bool:
            # bool += v sets True where v holds: a store masked by v (duplicates all write
            # True), as Triton has no atomics on int1
            only_where = TritonOpsHandler(self).truth(value, frozenset({"x"}))
            self.line(self._store_text(node.writes, node.store_index(x), value, "tl.store",
                                       only_where))
            return
        fn = "tl.atomic_add" if data.accumulate else "tl.store"
        self.line(self._store_text(node.writes, node.store_index(x), value, fn))

    def _transposed_split(self, x, r):
        """A pointwise kernel some of whose accesses run along another dim than the last
        (a transpose, NCHW -> NHWC) is tiled 2-D: rows over the other dims, columns over
        the last, so each access is contiguous along one axis of the tile and Triton
        coalesces both. Returns the split of the merged dims, or None (flat is best)."""
        k = self.kernel
        sizes, vars_ = store_order(k, x, r, list(k.outer) + list(k.inner), list(x) + list(r))
        sizes, vars_, sub = merge_dims(k, x, r, sizes, vars_)
        if len(vars_) < 2:
            return None
        cx, cr = [sub.get(v, v) for v in x], [sub.get(v, v) for v in r]
        if not any(sympy.diff(e, vars_[-2]) == 1 for e in access_indices(k, cx, cr)):
            return None
        return sizes[:-1], vars_[:-1], sizes[-1:], vars_[-1:], sub

    def _generate_tiled(self, x, r, split=None) -> None:
        k = self.kernel
        if split is None:
            xsizes, xvars, xsub = merge_dims(k, x, r, list(k.outer), list(x))
            rsizes, rvars, rsub = merge_dims(k, x, r, list(k.inner), list(r))
            sub = {**xsub, **rsub}
        else:
            xsizes, xvars, rsizes, rvars, sub = split
        cx, cr = [sub.get(v, v) for v in x], [sub.get(v, v) for v in r]
        xnumel, rnumel = size_hint(product(xsizes)), size_hint(product(rsizes))
        # the longest row at any size (None: unbounded), which a persistent block must hold
        r_upper = _upper_bound(product(rsizes))
        column = _runs_along_outer(access_indices(k, cx, cr), xvars[-1:], rvars[-1:])
        tile = INTERPRETER_TILE if self.interpret else TILE
        persistent_max = max(PERSISTENT_MAX, tile) if self.interpret else PERSISTENT_MAX
        if split is not None:      # pointwise: a 2-D grid of tiles, no loop
            self._generate_grid2d(xsizes, xvars, rsizes, rvars, cx, cr, column)
            return
        if column:
            xblock = min(next_power_of_2(xnumel), COLUMN_XBLOCK)
            while xblock > 1 and -(-xnumel // xblock) < COLUMN_MIN_PROGRAMS:
                xblock //= 2
            welford = any(n.role == "reduction" and group_kind([n])[0] == "welford"
                          for n in k.nodes)
            column_tile = tile if self.interpret else \
                COLUMN_WELFORD_TILE if welford else COLUMN_TILE
            rblock = min(next_power_of_2(rnumel), max(1, column_tile // xblock))
            persistent = r_upper is not None and rblock >= r_upper
        elif r_upper is not None and r_upper <= persistent_max:
            rblock = next_power_of_2(r_upper)
            xblock = min(next_power_of_2(xnumel), max(1, tile // rblock))
            persistent = True
        elif rnumel <= persistent_max:
            # a symbolic row short at the hint: tiles of a few rows, looping, so longer rows
            # still spread over many programs
            rblock = max(next_power_of_2(rnumel), SYMBOLIC_MIN_RBLOCK)
            xblock = min(next_power_of_2(xnumel), max(1, tile // rblock),
                         max(1, next_power_of_2(xnumel) // SYMBOLIC_MIN_PROGRAMS))
            persistent = False
        else:
            rblock = min(LOOP_RBLOCK if not self.interpret else tile, next_power_of_2(rnumel))
            xblock = 1
            persistent = False
        self.persistent = persistent
        if persistent:      # a row's values stay in registers for every segment
            self._keep_rows_local()
        self.config = {"XBLOCK": xblock, "RBLOCK": rblock,
                       "num_warps": min(8, max(1, (xblock * rblock) // 256))}
        self._set_grid([product(xsizes)], [xblock])
        self.numel_x = xnumel
        # max_autotune's candidates; a persistent row must stay whole (RBLOCK >= rnumel)
        rblocks = [rblock] if persistent else \
            [b for b in (256, 512, 1024, 2048, 4096) if b <= next_power_of_2(rnumel)] or [rblock]
        self.candidates = [self.config] + [
            {"XBLOCK": xb, "RBLOCK": rb, "num_warps": w}
            for rb in rblocks for xb in (1, 2, 4, 8, 16, 32, 64)
            for w in (2, 4, 8)
            if xb <= next_power_of_2(xnumel) and 256 <= xb * rb <= 16384
            and xb * rb // w >= 64 and (xb, rb) != (xblock, rblock)][:15]
        self.line(f"xindex = {self._program_offset('XBLOCK')} + tl.arange(0, XBLOCK)[:, None]")
        self.line(f"xmask = xindex < {triton_index(product(xsizes))}")
        self._decompose("xindex", xvars, xsizes, "x")
        self.rnumel = triton_index(product(rsizes))
        self.rsizes, self.rvars = rsizes, rvars
        if persistent:
            self._open_rows("tl.arange(0, RBLOCK)[None, :]")
        for kind, nodes in k.segments:
            if kind == "outer":
                for node in nodes:
                    self.store(node, node.where(cx, []), node.value(cx, []))
            else:
                self._segment(nodes, cx, cr, persistent)

    def _generate_grid2d(self, xsizes, xvars, rsizes, rvars, cx, cr, column) -> None:
        """A transposing pointwise kernel: tiles of TRANSPOSE_TILE x TRANSPOSE_TILE elements,
        one per program over both axes, so a small dim (3 channels) still gives many
        programs."""
        xnumel, rnumel = size_hint(product(xsizes)), size_hint(product(rsizes))
        xblock = min(next_power_of_2(xnumel), TRANSPOSE_TILE)
        rblock = min(next_power_of_2(rnumel), TRANSPOSE_TILE)
        while -(-rnumel // rblock) > GRID_AXIS1_MAX:    # CUDA's limit on the second grid axis
            rblock *= 2
        self.config = {"XBLOCK": xblock, "RBLOCK": rblock,
                       "num_warps": min(8, max(1, (xblock * rblock) // 512))}
        _guard_at_most(product(rsizes), GRID_AXIS1_MAX * rblock)
        self._set_grid([product(xsizes), product(rsizes)], [xblock, rblock])
        self.numel_x = xnumel
        self.persistent = True
        self.line(f"xindex = {self._program_offset('XBLOCK')} + tl.arange(0, XBLOCK)[:, None]")
        self.line(f"xmask = xindex < {triton_index(product(xsizes))}")
        self._decompose("xindex", xvars, xsizes, "x")
        self.rnumel = triton_index(product(rsizes))
        self.rsizes, self.rvars = rsizes, rvars
        pid = "tl.program_id(1)" + (".to(tl.int64)" if self.index_type == "tl.int64" else "")
        self._open_rows(f"{pid} * RBLOCK + tl.arange(0, RBLOCK)[None, :]")
        for kind, nodes in self.kernel.segments:
            for node in nodes:
                self.store(node, node.where(cx, cr), node.value(cx, cr))

    def _keep_rows_local(self) -> None:
        """Values read only inside this kernel need no memory when rows are persistent."""
        k = self.kernel
        local = set(k.kernel_local)
        for node in k.nodes:
            if node.buf.reuses in local:     # it would have overwritten a dead value
                node.buf.reuses = None
        self.local = local
        k.local = local

    def _open_rows(self, rindex: str) -> None:
        self.line(f"rindex = {rindex}")
        self.line(f"rmask = rindex < {self.rnumel}")
        self._decompose("rindex", self.rvars, self.rsizes, "r")

    def _segment(self, nodes, x, r, persistent: bool) -> None:
        """One inner loop of the kernel: pointwise nodes store per element; reductions
        accumulate and store one value per row."""
        groups = reduction_groups([n for n in nodes if n.role == "reduction"])
        states: dict = {}
        if not persistent:
            for acc, members in groups.items():
                self._declare_lanes(acc, members)
            self.line(f"for roffset in range(0, {self.rnumel}, RBLOCK):")
            self.indent += 1
            self.push()
            self._open_rows("roffset + tl.arange(0, RBLOCK)[None, :]")
        for node, acc in loop_steps(nodes, groups):   # a reduction may read values before it
            if acc is None:
                self.store(node, node.where(x, r), node.value(x, r))
            else:
                states[acc] = self._row_state(acc, groups[acc], x, r) if persistent else \
                    self._accumulate(acc, groups[acc], x, r)
        if not persistent:
            self.pop()
            self.indent -= 1
            states = {acc: self._finish_lanes(acc, members) for acc, members in groups.items()}
        for acc, members in groups.items():
            for node in members:
                self.store(node, node.store_index(x), states[acc][node.name])

    def _reduced_value(self, members, x, r) -> tuple[TritonValue, str, torch.dtype]:
        node = members[0]
        data = node.buf.data
        value = node.value(x, r)
        if value.dtype != data.src_dtype:
            value = TritonOpsHandler(self).to_dtype(value, data.src_dtype)
        kind, dtype = group_kind(members)
        return value, kind, dtype

    def _masked(self, value, kind, dtype, name: str) -> str:
        """``value`` over the whole tile, the reduction's identity where masked."""
        init = _reduction_init(kind, dtype)
        ctype = compute_type(dtype) if dtype is not torch.bool else "tl.int8"
        v = f"{value}.to(tl.int8)" if dtype is torch.bool else str(value)
        self.line(f"{name} = tl.where(xmask & rmask, {v}, tl.full([XBLOCK, RBLOCK], {init}, "
                  f"{ctype}))")
        return name

    def _row_state(self, acc, members, x, r) -> dict[str, TritonValue]:
        """A persistent row's reduction: one ``tl`` reduction over axis 1."""
        value, kind, dtype = self._reduced_value(members, x, r)
        v = self._masked(value, kind, dtype, f"{acc}_in")
        out_dtype = {n.name: n.buf.get_dtype() for n in members}
        if kind == "welford":
            n_name = f"{acc}_n"
            self.line(f"{n_name} = tl.sum((xmask & rmask).to(tl.float32), 1)[:, None]")
            self.line(f"{acc}_mean = tl.sum({v}, 1)[:, None] / tl.maximum({n_name}, 1.0)")
            self.line(f"{acc}_d = tl.where(xmask & rmask, {value} - {acc}_mean, 0.0)")
            self.line(f"{acc}_m2 = tl.sum({acc}_d * {acc}_d, 1)[:, None]")
            return {n.name: TritonValue(f"{acc}_{n.buf.data.reduction_type[8:]}", dtype,
                                        frozenset({"x"})) for n in members}
        if kind in ("argmax", "argmin"):
            self.line(f"{acc}_i = tl.where(xmask & rmask, rindex, 2147483647)"
                      f" + tl.zeros([XBLOCK, RBLOCK], tl.int32)")
            self.line(self._arg_reduce(acc, kind, dtype, v, f"{acc}_i", acc))
            self.line(f"{acc} = {acc}[:, None].to(tl.int64)")
            return {members[0].name: TritonValue(acc, torch.int64, frozenset({"x"}))}
        self.line(f"{acc} = {self._reduce(kind, v, dtype)}[:, None]{_keep_int(dtype)}")
        if dtype is torch.bool:
            self.line(f"{acc} = {acc} != 0")
        return {members[0].name: TritonValue(acc, out_dtype[members[0].name]
                                             if dtype is torch.bool else dtype,
                                             frozenset({"x"}))}

    def _declare_lanes(self, acc, members) -> None:
        kind, dtype = group_kind(members)
        ctype = compute_type(dtype) if dtype is not torch.bool else "tl.int8"
        init = _reduction_init(kind, dtype)
        if kind == "welford":
            for f, t in (("mean", ctype), ("m2", ctype), ("n", "tl.float32")):
                self.line(f"{acc}_{f} = tl.zeros([XBLOCK, RBLOCK], {t})")
            return
        self.line(f"{acc} = tl.full([XBLOCK, RBLOCK], {init}, {ctype})")
        if kind in ("argmax", "argmin"):
            self.line(f"{acc}_i = tl.full([XBLOCK, RBLOCK], 2147483647, tl.int32)")

    def _accumulate(self, acc, members, x, r) -> bool:
        value, kind, dtype = self._reduced_value(members, x, r)
        if kind == "welford":
            self.line(f"{acc}_n = {acc}_n + (xmask & rmask).to(tl.float32)")
            self.line(f"{acc}_d = {value} - {acc}_mean")
            self.line(f"{acc}_mean = tl.where(xmask & rmask, {acc}_mean + {acc}_d / "
                      f"tl.maximum({acc}_n, 1.0), {acc}_mean)")
            self.line(f"{acc}_m2 = tl.where(xmask & rmask, {acc}_m2 + {acc}_d * ({value} - "
                      f"{acc}_mean), {acc}_m2)")
            return True
        v = self._masked(value, kind, dtype, f"{acc}_in")
        if kind in ("argmax", "argmin"):
            self.line(f"{acc}, {acc}_i = ember_{kind}({acc}, {acc}_i, {v}, "
                      f"tl.where(xmask & rmask, rindex, 2147483647))")
            return True
        self.line(f"{acc} = {_tl_combine(kind, acc, v)}")
        return True

    def _finish_lanes(self, acc, members) -> dict[str, TritonValue]:
        kind, dtype = group_kind(members)
        if kind == "welford":
            if self.interpret:   # Chan's merge of all lanes as sums (see _reduce)
                self.line(f"{acc}_nt = tl.sum({acc}_n, 1)")
                self.line(f"{acc}_mt = tl.sum({acc}_mean * {acc}_n, 1) / "
                          f"tl.maximum({acc}_nt, 1.0)")
                self.line(f"{acc}_dt = {acc}_mean - {acc}_mt[:, None]")
                self.line(f"{acc}_m2 = tl.sum({acc}_m2 + {acc}_n * {acc}_dt * {acc}_dt, 1)")
                self.line(f"{acc}_mean = {acc}_mt")
            else:
                self.line(f"{acc}_mean, {acc}_m2, _ = tl.reduce(({acc}_mean, {acc}_m2, "
                          f"{acc}_n), 1, ember_welford)")
            out = {}
            for n in members:
                field = n.buf.data.reduction_type[8:]
                out[n.name] = TritonValue(f"{acc}_{field}_row", dtype, frozenset({"x"}))
                self.line(f"{acc}_{field}_row = {acc}_{field}[:, None]")
            return out
        if kind in ("argmax", "argmin"):
            self.line(self._arg_reduce(acc, kind, dtype, acc, f"{acc}_i", f"{acc}_row"))
            self.line(f"{acc}_row = {acc}_row[:, None].to(tl.int64)")
            return {members[0].name: TritonValue(f"{acc}_row", torch.int64, frozenset({"x"}))}
        self.line(f"{acc}_row = {self._reduce(kind, acc, dtype)}[:, None]{_keep_int(dtype)}")
        if dtype is torch.bool:
            self.line(f"{acc}_row = {acc}_row != 0")
        return {members[0].name: TritonValue(f"{acc}_row", dtype, frozenset({"x"}))}

    def _reduce(self, kind: str, value: str, dtype: torch.dtype) -> str:
        """Text of ``value``'s reduction over axis 1. Triton's interpreter runs a reduction
        with a combine function of ours one element at a time in Python (minutes for one
        softmax): there max and min are tl.max/tl.min, which it runs in numpy, with NaN put
        back in rows that hold one (those skip NaN; eager propagates it)."""
        if not self.interpret or kind not in ("max", "min"):
            return _tl_reduce(kind, value)
        text = f"tl.{kind}({value}, 1)"
        if dtype.is_floating_point:
            text = (f'tl.where(tl.max(({value} != {value}).to(tl.int8), 1) > 0, float("nan"), '
                    f'{text})')
        return text

    def _arg_reduce(self, acc: str, kind: str, dtype, value: str, index: str, out: str) -> str:
        """``out = `` the first ``index`` of a row's extreme of ``value`` (NaN wins). Under
        the interpreter: the extreme (``_reduce``), then the least index holding it."""
        if not self.interpret:
            return f"_, {out} = tl.reduce(({value}, {index}), 1, ember_{kind})"
        best = f"{self._reduce(kind[3:], value, dtype)}[:, None]"
        self.line(f"{acc}_best = {best}")
        hit = (f"({value} == {acc}_best) | (({value} != {value}) & "
               f"({acc}_best != {acc}_best))")
        return f"{out} = tl.min(tl.where({hit}, {index}, 2147483647), 1)"

    # -- the wrapper's side ------------------------------------------------------------------------
    def call_lines(self, refs: dict[str, str]) -> list[str]:
        """``kernel0(buf0, buf1)``: a launch.TritonLauncher with the grid and config; the
        comment keeps them readable in the wrapper."""
        config = ", ".join(f"{k}={v}" for k, v in self.config.items())
        args = ", ".join([refs[a] for a in self.args] + self.size_args)
        if self.grid is None:    # symbolic sizes: the launcher's grid covers these numels
            from ember.backend.codegen.wrapper import size_text
            numels = ", ".join(size_text(n) for n in self.grid_numels)
            args = f"({numels},), {args}"
            grid = f"({numels},) numels"
        else:
            grid = self.grid if isinstance(self.grid, tuple) else (self.grid,)
        if not self.checks_errors:
            return [f"{self.name}({args})  # grid={grid}, {config}"]
        flags = f"{self.name}_flags"
        return [f"{flags} = torch.zeros({1 + len(self.index_checks)}, dtype=torch.int32)",
                f"{self.name}({args}, {flags})  # grid={grid}, {config}",
                f"{flags} = {flags}.tolist()",
                f"if {flags}[0]: raise RuntimeError('ZeroDivisionError')",
                *[f"if {flags}[{1 + slot}]: {check.raise_line()}"
                  for slot, check in enumerate(self.index_checks)]]


_WORD = re.compile(r"\b[A-Za-z_]\w*\b")


def _upper_bound(expr) -> int | None:
    """The largest value the size ``expr`` takes at any size (its own value when static),
    or None where the symbols' ranges do not bound it."""
    if is_static(expr):
        return size_hint(expr)
    env = sizevars.shape_env()
    try:
        upper = env.bound(expr).upper if env is not None else None
    except (TypeError, AttributeError):      # a function the ranges do not bound
        return None
    return int(upper) if upper is not None and upper.is_finite else None


def _guard_at_most(expr, limit: int) -> None:
    """Record that generated code relies on the size ``expr`` being at most ``limit`` (true
    at the hints): sizes that break it are compiled per size. A static size needs nothing."""
    if is_static(expr):
        return
    env = sizevars.shape_env()
    fact = sympy.Le(expr, limit)
    if env is None or not bool(env.evaluate(fact)):
        raise NotImplementedError(f"generated Triton relies on {fact}, false at the hints")


def _keep_int(dtype: torch.dtype) -> str:
    """A cast of an integer reduction's result back to its dtype: the interpreter's tl.max
    of uint8 values is int32, which then divides nothing of uint8 ("different
    signedness")."""
    if dtype.is_floating_point or dtype is torch.bool:
        return ""
    return f".to({TL_TYPES[dtype]})"


def _tl_reduce(kind: str, value: str) -> str:
    return {"sum": f"tl.sum({value}, 1)", "prod": f"tl.reduce({value}, 1, ember_prod)",
            "max": f"tl.reduce({value}, 1, ember_max)",
            "min": f"tl.reduce({value}, 1, ember_min)",
            "any": f"tl.max({value}, 1)", "all": f"tl.min({value}, 1)"}[kind]


def _tl_combine(kind: str, acc: str, value: str) -> str:
    return {"sum": f"{acc} + {value}", "prod": f"{acc} * {value}",
            "max": f"ember_max({acc}, {value})", "min": f"ember_min({acc}, {value})",
            "any": f"tl.maximum({acc}, {value})", "all": f"tl.minimum({acc}, {value})"}[kind]


def _runs_along_outer(indices, x, r) -> bool:
    """Accesses that move with both tile axes run with unit stride along the rows' last
    dim at least as often as along the columns' (a reduction over a non-last dim, a
    transpose): the tile then takes many rows, so those accesses read contiguous runs."""
    if not x or not r:
        return False
    both = [e for e in indices if x[-1] in e.free_symbols and r[-1] in e.free_symbols]
    along_outer = sum(1 for e in both if sympy.diff(e, x[-1]) == 1)
    along_inner = sum(1 for e in both if sympy.diff(e, r[-1]) == 1)
    return along_outer > 0 and along_outer >= along_inner


def module_source(kernels: list[TritonKernel], interpret: bool) -> str:
    from ember.backend.targets.triton.ops import GPU_IMPORTS, HELPERS, INTERPRETER_MATH
    head = "import triton\nimport triton.language as tl\n"
    head += INTERPRETER_MATH if interpret else GPU_IMPORTS
    return head + HELPERS + "\n\n" + "\n\n".join(k.source for k in kernels)


__all__ = ["TritonKernel", "module_source", "triton_constant"]
